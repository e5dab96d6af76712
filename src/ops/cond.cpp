// cond(pred, true_fn, false_fn, operands): data-dependent control flow without a graph break.
//
// Eager: the predicate is read on the host and only the chosen branch runs. Under a trace hook
// (capture or segmented execution) both branches are recorded and joined per output by
// where(pred, t, f), so the compiled graph holds both branches and reads the predicate when it runs.
// See docs/breaks.md for the rewrite of `if (x.sum().item<float>() > 0)` into where/cond.
#include <fmt/format.h>

#include "ops/dispatch.h"
#include "protean/ops.h"

namespace protean {

TensorList cond(const Tensor& pred, const CondFn& true_fn, const CondFn& false_fn, const TensorList& operands) {
  if (!pred.defined()) throw ValueError("cond: pred is an undefined tensor");
  if (pred.dtype() != DType::Bool)
    throw TypeError(fmt::format("cond: pred must be a bool tensor with one element, got {}{} (compare it first, "
                                "e.g. x.sum() > 0)",
                                short_name(pred.dtype()), to_string(pred.sizes())));
  for (const SymInt& s : pred.sizes())
    if (s.is_symbolic() || s.hint() != 1)
      throw ValueError(fmt::format("cond: pred must have exactly one element, got sizes {}", to_string(pred.sizes())));
  if (!true_fn || !false_fn) throw ValueError("cond: true_fn and false_fn must be callable");
  if (!ops::current_trace_hook()) return pred.item<bool>() ? true_fn(operands) : false_fn(operands);

  TensorList a = true_fn(operands);
  TensorList b = false_fn(operands);
  if (a.size() != b.size())
    throw ValueError(fmt::format("cond: true_fn returned {} outputs, false_fn {}; both branches must return the same "
                                 "number of tensors",
                                 a.size(), b.size()));
  Tensor p = pred.dim() == 0 ? pred : pred.reshape({});
  TensorList out;
  out.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (!a[i].defined() || !b[i].defined())
      throw ValueError(fmt::format("cond: output {} of {} is an undefined tensor", i, a[i].defined() ? "false_fn" : "true_fn"));
    if (a[i].dtype() != b[i].dtype())
      throw TypeError(fmt::format("cond: output {} is {} in true_fn and {} in false_fn; both branches must agree", i,
                                  short_name(a[i].dtype()), short_name(b[i].dtype())));
    bool same = a[i].dim() == b[i].dim();
    for (int64_t d = 0; same && d < a[i].dim(); ++d) same = static_cast<bool>(a[i].sizes()[d] == b[i].sizes()[d]);
    if (!same)
      throw ShapeError(fmt::format("cond: output {} has sizes {} in true_fn and {} in false_fn; both branches must agree",
                                   i, to_string(a[i].sizes()), to_string(b[i].sizes())));
    out.push_back(where(p, a[i], b[i]));
  }
  return out;
}

Tensor cond(const Tensor& pred, const std::function<Tensor(const TensorList&)>& true_fn,
            const std::function<Tensor(const TensorList&)>& false_fn, const TensorList& operands) {
  if (!true_fn || !false_fn) throw ValueError("cond: true_fn and false_fn must be callable");
  CondFn t = [&](const TensorList& ops) { return TensorList{true_fn(ops)}; };
  CondFn f = [&](const TensorList& ops) { return TensorList{false_fn(ops)}; };
  return cond(pred, t, f, operands).at(0);
}

}  // namespace protean
