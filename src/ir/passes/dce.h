// Dead code elimination.
// Needs: a structurally valid graph (verifier.h) with an Output node.
// Guarantees: removes every Call and Constant node none of whose results reaches a graph output
// (ops are pure, so an unused Call has no effect; this includes kRandom ops and a cond, whose
// branches are pure too), except Calls of ops flagged kUnbackedSymbol (they define u0, ... that later
// sizes may use); keeps every Placeholder (the calling convention is fixed by the inputs); values are renumbered densely and
// Call results renamed %0, %1, ... (Graph::compact). Idempotent.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

/// Returns the number of nodes removed.
size_t dead_code_elimination(Graph& g);

}  // namespace protean::ir
