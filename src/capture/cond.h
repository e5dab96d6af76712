// cond(pred, true_fn, false_fn, operands) under capture: each branch traced into a subgraph of its own.
//
// A branch is traced by a BranchTracer: a TraceHook installed while the branch function runs on fake
// operands. It records the branch's ops into a fresh ir::Graph whose placeholders are the operands
// (`%arg0`, `%arg1`, ...). The ShapeEnv is the thread's current one, shared with the enclosing
// capture, so a guard a branch adds is a guard of the frame and symbolic sizes flow through. A tensor
// of the caller's world that a branch reads without receiving it as an operand (a closure over an
// outer tensor, a Module parameter, a wrapped C++ scalar) is lifted: it becomes an extra placeholder
// of the branch and an extra operand of the cond, and both branches take the same operand list.
// A host read (item, data_ptr, to_vector, printing), graph_break() or a data-dependent op inside a
// branch throws GraphBreakError: a branch is one subgraph and cannot be split.
//
// The caller (Tracer, LazyRunner, an enclosing BranchTracer for a nested cond) then records one node
// `cond(pred, operands..., lifted...)` owning both graphs (ir/graph.h).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "ir/graph.h"
#include "ops/dispatch.h"

namespace protean::capture {

/// One cond call with both branches traced.
struct TracedCond {
  /// {true branch, false branch}; placeholders: the operands, then the lifted tensors.
  std::vector<std::shared_ptr<const ir::Graph>> branches;
  /// The cond node's inputs, tensors of the caller's world: the predicate (0-dim bool), the operands,
  /// then the lifted tensors.
  std::vector<Tensor> inputs;
  /// The cond's output types (contiguous; sizes checked equal in both branches).
  std::vector<TensorMeta> outputs;
};

/// Traces both branches on `operands`. `parent` is the hook of the caller's world (it records the
/// wrapped scalars a branch creates, so they become operands); nullptr outside any capture. `pred`
/// must be a 0-dim bool tensor. Throws GraphBreakError for a host read inside a branch, TypeError /
/// ValueError / ShapeError (naming the output index) when the branches' outputs disagree in count,
/// dtype or sizes (sizes compared through the current ShapeEnv: an undecided comparison is guarded).
TracedCond trace_cond(ops::TraceHook* parent, const Tensor& pred, const ops::BranchFn& true_fn,
                      const ops::BranchFn& false_fn, std::span<const Tensor> operands);

/// Runs graph `g` through the dispatcher on `inputs` (one per placeholder): every Call is an
/// ops::call, a cond node a protean::cond over its subgraphs, so the current trace hook records the
/// graph again (re-traced with fresh symbolic sizes) or, without a hook, it runs eagerly. Segmented
/// execution uses it to replay a recorded cond. Constants must have data.
std::vector<Tensor> call_graph(const ir::Graph& g, std::span<const Tensor> inputs);

/// Replays one recorded call (of a graph, or of a segment's recording) through the dispatcher on
/// `inputs`: a cond node (`subgraphs` = {true branch, false branch}, inputs = pred, operands...)
/// becomes a protean::cond whose branches run call_graph over the subgraphs, so the current trace
/// hook re-traces it with fresh symbolic sizes or, without a hook, it runs eagerly; any other op is
/// ops::call(op, inputs, attrs). Returns the call's outputs.
std::vector<Tensor> call_node(ops::OpKind op, const ops::Attrs& attrs,
                              const std::vector<std::shared_ptr<const ir::Graph>>& subgraphs,
                              std::span<const Tensor> inputs);

}  // namespace protean::capture
