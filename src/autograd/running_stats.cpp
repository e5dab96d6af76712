// Training-mode batch norm (include/protean/optim.h: batch_norm_train) and the running-statistics
// writes it makes (src/autograd/running_stats.h).
#include "autograd/running_stats.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "ops/dispatch.h"
#include "protean/autograd.h"
#include "protean/ops.h"
#include "protean/optim.h"
#include "protean/tensor_version.h"

namespace protean {
namespace autograd::detail {

namespace {
std::multiset<const TensorImpl*>& traced_buffers() {
  thread_local std::multiset<const TensorImpl*> s;
  return s;
}
std::set<const TensorImpl*>& rewritten_buffers() {
  thread_local std::set<const TensorImpl*> s;
  return s;
}
}  // namespace

void mark_traced_buffer(const TensorImpl* impl) { traced_buffers().insert(impl); }
bool unmark_traced_buffer(const TensorImpl* impl) {
  auto it = traced_buffers().find(impl);
  if (it != traced_buffers().end()) traced_buffers().erase(it);
  if (traced_buffers().count(impl)) return rewritten_buffers().count(impl) != 0;
  return rewritten_buffers().erase(impl) != 0;
}

void write_running_stat(const Tensor& dst, const Tensor& value, const char* who, const char* what) {
  bool same = dst.dim() == value.dim();
  for (int64_t d = 0; same && d < dst.dim(); ++d) same = static_cast<bool>(dst.size(d) == value.size(d));
  if (!same)
    throw ShapeError(fmt::format("{}: the new {} has sizes {}, the buffer {}", who, what, to_string(value.sizes()),
                                 to_string(dst.sizes())));
  Tensor v = value.dtype() == dst.dtype() ? value : cast(value, dst.dtype());
  if (dst.is_fake()) {
    if (!traced_buffers().count(dst.impl()))
      throw NotImplementedError(fmt::format(
          "{}: {} is an input of a compiled function, which cannot update it in place; a compiled "
          "training step (compile_train_step) updates running statistics that are buffers of its module, "
          "else update them eagerly or use the inference form (batch_norm)",
          who, what));
    TensorImpl* impl = dst.impl();
    *impl = *v.impl();  // later reads in this trace see the new value; the step returns it
    rewritten_buffers().insert(impl);
    return;
  }
  if (v.is_fake())
    throw NotImplementedError(fmt::format(
        "{}: {} is not a graph input of the function being compiled (a tensor captured by value is a "
        "constant of the graph, so its update would be lost); register it as a buffer of the module "
        "given to compile_train_step",
        who, what));
  if (!dst.is_contiguous())
    throw ValueError(fmt::format("{}: {} must be contiguous to be updated in place", who, what));
  increment_version(dst);
  Tensor c = v.cpu().contiguous();  // a device backend's result is copied to the host
  std::memcpy(dst.data_ptr(), c.data_ptr(), static_cast<size_t>(dst.int_numel()) * dst.itemsize());
}

}  // namespace autograd::detail

Tensor batch_norm_train(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, double momentum, double eps) {
  constexpr const char* who = "batch_norm_train";
  if (!x.defined()) throw ValueError(fmt::format("{}: the input is undefined", who));
  if (x.dim() < 2)
    throw ShapeError(fmt::format("{}: the input must be [N, C, *] (at least 2-D), got {}-D", who, x.dim()));
  if (!is_floating(x.dtype()))
    throw TypeError(fmt::format("{}: the input must be floating, got {}", who, short_name(x.dtype())));
  if (!(momentum >= 0 && momentum <= 1))
    throw ValueError(fmt::format("{}: momentum must be in [0, 1], got {}", who, momentum));
  if (!(eps >= 0)) throw ValueError(fmt::format("{}: eps must be >= 0, got {}", who, eps));
  const SymInt C = x.size(1);
  auto check_channels = [&](const Tensor& t, const char* what) {
    if (!t.defined()) return;
    if (t.dim() != 1 || static_cast<bool>(t.size(0) != C))
      throw ShapeError(fmt::format("{}: {} must be 1-D of the {} channels (input dim 1), got {}", who, what,
                                   C.str(), to_string(t.sizes())));
    if (!is_floating(t.dtype()))
      throw TypeError(fmt::format("{}: {} must be floating, got {}", who, what, short_name(t.dtype())));
  };
  check_channels(weight, "weight");
  check_channels(bias, "bias");
  check_channels(running_mean, "running_mean");
  check_channels(running_var, "running_var");
  if (running_mean.defined() != running_var.defined())
    throw ValueError(fmt::format("{}: give both running_mean and running_var, or neither", who));

  IntVec dims{0};
  SymInt n = x.size(0);
  SymIntVec bshape{SymInt(1), C};  // [1, C, 1, ...]: per-channel values broadcast over x
  for (int64_t d = 2; d < x.dim(); ++d) {
    dims.push_back(d);
    n = n * x.size(d);
    bshape.push_back(SymInt(1));
  }
  if (n <= 1)  // torch: "Expected more than 1 value per channel when training"
    throw ValueError(fmt::format("{}: expected more than 1 value per channel when training, got input sizes {}", who,
                                 to_string(x.sizes())));

  // y = (x − mean) · rsqrt(var_biased + eps) · w + b. The batch statistics accumulate in f64 (as
  // ATen's CPU kernel does for float inputs), then are rounded once to x's dtype.
  // On CPU tensors with weight and bias of x's dtype: the statistics op and the normalization op,
  // whose rule is the whole batch-norm backward (src/ops/batch_norm_train.cpp: two passes over g and
  // x). Otherwise it is written with ops, and the derivative table's rules (mean, var, sub, rsqrt,
  // mul, add) give the gradients.
  const bool fused = x.device().type == DeviceType::CPU && (!weight.defined() || weight.dtype() == x.dtype()) &&
                     (!bias.defined() || bias.dtype() == x.dtype()) && x.dtype() != DType::F16 &&
                     x.dtype() != DType::BF16;
  Tensor y, mean64, var64;
  if (fused) {
    Tensor stats = ops::call1(ops::OpKind::batch_norm_stats, {x}, {});
    ops::Attrs attrs;
    attrs.set("eps", eps);
    y = ops::call1(ops::OpKind::batch_norm_train_apply, {x, stats, weight, bias}, attrs);
    mean64 = select(stats, 0, 0);
    var64 = select(stats, 0, 1);
  } else {
    Tensor xs = x.dtype() == DType::F64 ? x : cast(x, DType::F64);
    mean64 = mean(xs, dims, true);
    Tensor mean_b = x.dtype() == DType::F64 ? mean64 : cast(mean64, x.dtype());
    var64 = var(xs, dims, true, 0);
    Tensor rstd64 = rsqrt(var64 + eps);
    Tensor rstd = x.dtype() == DType::F64 ? rstd64 : cast(rstd64, x.dtype());
    y = (x - mean_b) * rstd;
    if (weight.defined()) y = y * reshape(weight, bshape);
    if (bias.defined()) y = y + reshape(bias, bshape);
  }

  if (running_mean.defined()) {
    // torch.nn.BatchNorm2d's update, in f64 as ATen's CPU kernel accumulates, rounded once to the
    // buffer's dtype: r ← (1 − momentum)·r + momentum·stat, with the unbiased variance n/(n − 1).
    // The unbiased variance rescales the biased one of the forward: a [C] product instead of two
    // more passes over x.
    NoGradGuard no_grad;
    Tensor m = reshape(mean64.detach(), {C});
    Tensor v = reshape(var64.detach(), {C}) * (SymFloat(n) / SymFloat(n - 1));
    Tensor new_mean = cast(running_mean.detach(), DType::F64) * (1 - momentum) + m * momentum;
    Tensor new_var = cast(running_var.detach(), DType::F64) * (1 - momentum) + v * momentum;
    autograd::detail::write_running_stat(running_mean, new_mean, who, "running_mean");
    autograd::detail::write_running_stat(running_var, new_var, who, "running_var");
  }
  return y;
}

}  // namespace protean
