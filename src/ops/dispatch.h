// The single entry point of every op call: eager execution, or recording into an active capture.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/host_read.h"
#include "ops/registry.h"

namespace protean::ops {

/// A branch of protean::cond (the same type as protean::CondFn): operands in, outputs out.
using BranchFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& operands)>;

/// Implemented by the capture layer (src/capture). While installed on a thread, every op call on that
/// thread is handed to `record` instead of running kernels.
class TraceHook : public core::HostReadHook {
 public:
  ~TraceHook() override = default;
  /// Records `op` applied to `in` (FakeTensors of this trace, or real tensors from outside it, which
  /// the hook turns into graph constants/inputs) and returns FakeTensors for the outputs. `metas` is
  /// the meta function's result. May throw (e.g. to signal a graph break).
  virtual std::vector<Tensor> record(OpKind op, std::span<const Tensor> in, const Attrs& attrs,
                                     std::vector<TensorMeta> metas) = 0;
  // on_host_read(t, what): a host read of tensor data (item, data_ptr, printing); returns to allow
  // the read, or throws to signal a graph break (core::HostReadHook, core/host_read.h).
  /// Called before `op`'s meta function runs under capture (the meta function may add guards or
  /// throw; the hook can attribute those to the op). Default: nothing.
  virtual void before_meta(OpKind op, std::span<const Tensor> in) {}
  /// protean::graph_break(reason) was called. Capture throws; segmented execution ends the segment.
  virtual void on_graph_break(const std::string& reason) = 0;
  /// An op flagged kDataDependentShape (nonzero), called instead of its meta function (which cannot
  /// know the output size without data). Returns the op's outputs (recorded with unbacked sizes, or
  /// computed on real data) or throws to signal a graph break.
  virtual std::vector<Tensor> on_data_dependent(OpKind op, std::span<const Tensor> in, const Attrs& attrs) = 0;
  // on_item_symint(t): Tensor::item_symint() on `t`: the symbol standing for its value when the hook
  // captures it (capture_scalar_outputs: an unbacked symbol), or std::nullopt to make it a host read
  // (on_host_read(t, "item_symint()"), then the value). Default: std::nullopt (core::HostReadHook).
  /// True when a call of another compiled function should run its C++ body inline, recorded into
  /// this hook (segmented execution). Default: false.
  virtual bool inlines_compiled_calls() const { return false; }
  /// protean::cond(pred, true_fn, false_fn, operands) under this hook; `pred` is already a 0-dim bool
  /// tensor of this hook's world. Records the cond with both branches as subgraphs (capture/cond.h)
  /// and returns its outputs. Default: NotImplementedError (the hook cannot hold subgraphs).
  virtual std::vector<Tensor> on_cond(const Tensor& pred, const BranchFn& true_fn, const BranchFn& false_fn,
                                      std::span<const Tensor> operands);
};

/// The hook installed on this thread, or nullptr (every hook installed is a TraceHook: core only
/// suspends it, see core/host_read.h).
inline TraceHook* current_trace_hook() { return static_cast<TraceHook*>(core::current_host_read_hook()); }
/// RAII: installs `hook` on this thread for the scope (nesting restores the previous one).
class TraceHookScope {
 public:
  explicit TraceHookScope(TraceHook* hook);
  ~TraceHookScope();
  TraceHookScope(const TraceHookScope&) = delete;
  TraceHookScope& operator=(const TraceHookScope&) = delete;

 private:
  core::HostReadHookScope scope_;
};

/// Calls `op`: records it when a TraceHook is installed, else runs the eager kernel. Throws
/// ValueError when a FakeTensor reaches eager execution (it escaped its capture).
std::vector<Tensor> call(OpKind op, std::span<const Tensor> in, const Attrs& attrs = {});
/// Single-output convenience.
inline Tensor call1(OpKind op, std::span<const Tensor> in, const Attrs& attrs = {}) {
  return call(op, in, attrs).at(0);
}
inline Tensor call1(OpKind op, std::initializer_list<Tensor> in, const Attrs& attrs = {}) {
  return call(op, std::span<const Tensor>(in.begin(), in.size()), attrs).at(0);
}

}  // namespace protean::ops
