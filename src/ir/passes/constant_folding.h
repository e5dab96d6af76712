// Constant folding: evaluates Calls whose result is known at compile time.
// Needs: a structurally valid graph; eager kernels for the folded ops (ops without one are left).
// Guarantees: a Call whose tensor inputs are all Constants with data (absent optional inputs are
// fine) and whose attributes are concrete, or a factory (no inputs: `full`, `arange`) with
// concrete attributes, is executed with ops::run_eager and replaced by one Constant per result
// (named c<k>, keeping the node's source location). Not folded: kRandom ops, data-dependent-shape
// ops, Calls whose largest result has more than `max_elements` elements unless an input is at least
// as large (folding then does not grow the graph), and Calls that throw (the error then happens at
// run time, as in eager). Results never alias a Placeholder (all inputs are Constants). Inputs that
// become unused are left for dead_code_elimination.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::ir {

struct ConstantFoldingOptions {
  int64_t max_elements = int64_t{1} << 20;
};

/// Returns the number of Calls folded.
size_t constant_folding(Graph& g, const ConstantFoldingOptions& options = {});

}  // namespace protean::ir
