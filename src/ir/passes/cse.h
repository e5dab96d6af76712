// Common subexpression elimination. A cond is one node here; its branches are not looked into
// (the pipeline runs the passes on them separately).
// Needs: a structurally valid graph in topological order.
// Guarantees: a Call with the same op, the same inputs (after earlier merges) and equal attributes
// (in any order; values as ops::Attrs::operator==: symbolic integers compare by expression node) as
// an earlier Call (for a cond also equal branches, ir::equal_graphs) is removed and its results
// replaced by the earlier Call's results; Constant nodes holding the same tensor object are merged
// likewise. Ops flagged kRandom are never merged (two draws differ), nor kUnbackedSymbol ones (each
// defines its own symbol).
// Graph outputs are rewritten; values renumbered (Graph::compact). Merging view ops is safe because
// no op mutates.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

/// Returns the number of nodes removed.
size_t common_subexpression_elimination(Graph& g);

}  // namespace protean::ir
