// The graph-level pass pipeline: what runs between capture and a backend. pipeline.cpp is the whole
// list of steps, in order; read it to know what a graph goes through.
//
// Needs: a graph from capture (or the parser). Guarantees: the result computes the same outputs
// for the same inputs and symbol values; placeholders are unchanged; when `verify` is set the
// verifier runs on the input and after every step, and a violation throws CompileError naming the
// step that broke the graph. A graph with subgraphs (cond) gets a last step `subgraphs` that runs the
// same steps on every branch (recursively); to the steps over the parent, a cond is one node.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/passes/constant_folding.h"
#include "ir/passes/partition.h"
#include "sym/shape_env.h"

namespace protean::ir {

struct PassOptions {
  /// Run the verifier on the input and after each step (tests and debug builds).
  bool verify = false;
  /// Called after each step with its name and the graph (e.g. to log the IR: PROTEAN_LOGS per-pass
  /// dumps). Step "input" is the graph as received.
  std::function<void(std::string_view step, const Graph&)> on_step;
  bool dead_code_elimination = true;
  bool constant_folding = true;
  bool common_subexpression_elimination = true;
  /// index_select of arange(0, n) as a slice (ir/passes/range_gather.h). A symbolic n needs a runtime
  /// assertion n <= rows: the step appends it to `runtime_asserts` (the compile's
  /// BackendInput::runtime_asserts) and is skipped for such gathers when that is null.
  bool range_gather_as_slice = true;
  std::vector<sym::RuntimeAssert>* runtime_asserts = nullptr;
  /// Save vs recompute in a graph with backward nodes (ir/passes/partition.h), with these options.
  bool partition = true;
  PartitionOptions partition_options;
  ConstantFoldingOptions folding;
};

/// (step name, wall seconds) for each step that ran, in order.
using PassTimings = std::vector<std::pair<std::string, double>>;

PassTimings run_passes(Graph& g, const PassOptions& options = {});

}  // namespace protean::ir
