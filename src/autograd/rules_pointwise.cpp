// Reverse rules: pointwise ops and reductions (src/ops/derivatives.def). c.g[0] is the gradient of
// the output; the engine reduces each returned gradient to its input's shape and dtype.
#include <numbers>

#include "autograd/rules.h"

namespace protean::autograd {

namespace {
Tensor zero_like_g(const Tensor& g) { return scalar(0.0, g.dtype()); }
}  // namespace

// ---- unary -----------------------------------------------------------------------------------------
Grads rule_abs(const GradCtx& c) { return {c.g[0] * sign(c.in(0))}; }
Grads rule_cast(const GradCtx& c) { return {c.g[0]}; }
Grads rule_clamp(const GradCtx& c) {
  const Tensor& x = c.in(0);
  Tensor keep;
  if (auto lo = c.attrs().opt_f("min")) keep = ge(x, scalar(*lo, x.dtype()));
  if (auto hi = c.attrs().opt_f("max")) {
    Tensor k = le(x, scalar(*hi, x.dtype()));
    keep = keep.defined() ? logical_and(keep, k) : k;
  }
  if (!keep.defined()) return {c.g[0]};
  return {where(keep, c.g[0], zero_like_g(c.g[0]))};
}
Grads rule_cos(const GradCtx& c) { return {-(c.g[0] * sin(c.in(0)))}; }
Grads rule_erf(const GradCtx& c) {
  const Tensor& x = c.in(0);
  return {c.g[0] * (exp(-(x * x)) * (2.0 / std::sqrt(std::numbers::pi)))};
}
Grads rule_exp(const GradCtx& c) { return {c.g[0] * c.out(0)}; }
Grads rule_gelu(const GradCtx& c) {
  const Tensor& x = c.in(0);
  if (c.attrs().s("approximate") == "tanh") {
    const double k = std::sqrt(2.0 / std::numbers::pi), a = 0.044715;
    Tensor x2 = x * x;
    Tensor t = tanh((x + x2 * x * a) * k);
    Tensor dinner = (x2 * (3.0 * a) + 1.0) * k;
    Tensor d = (t + 1.0) * 0.5 + x * (1.0 - t * t) * dinner * 0.5;
    return {c.g[0] * d};
  }
  Tensor cdf = (erf(x * (1.0 / std::numbers::sqrt2)) + 1.0) * 0.5;
  Tensor pdf = exp(x * x * -0.5) * (1.0 / std::sqrt(2.0 * std::numbers::pi));
  return {c.g[0] * (cdf + x * pdf)};
}
Grads rule_hardsigmoid(const GradCtx& c) {
  const Tensor& x = c.in(0);
  Tensor inside = logical_and(gt(x, scalar(-3.0, x.dtype())), lt(x, scalar(3.0, x.dtype())));
  return {where(inside, c.g[0] * (1.0 / 6.0), zero_like_g(c.g[0]))};
}
Grads rule_hardswish(const GradCtx& c) {
  const Tensor& x = c.in(0);
  const Tensor& g = c.g[0];
  Tensor mid = where(le(x, scalar(3.0, x.dtype())), g * (x * (1.0 / 3.0) + 0.5), g);
  return {where(lt(x, scalar(-3.0, x.dtype())), zero_like_g(g), mid)};
}
Grads rule_log(const GradCtx& c) { return {c.g[0] / c.in(0)}; }
Grads rule_neg(const GradCtx& c) { return {-c.g[0]}; }
Grads rule_reciprocal(const GradCtx& c) { return {-(c.g[0] * c.out(0) * c.out(0))}; }
Grads rule_relu(const GradCtx& c) {
  const Tensor& y = c.out(0);
  return {where(gt(y, scalar(0.0, y.dtype())), c.g[0], zero_like_g(c.g[0]))};
}
Grads rule_rsqrt(const GradCtx& c) {
  const Tensor& y = c.out(0);
  return {c.g[0] * (y * y * y) * -0.5};
}
Grads rule_sigmoid(const GradCtx& c) {
  const Tensor& y = c.out(0);
  return {c.g[0] * (y * (1.0 - y))};
}
Grads rule_silu(const GradCtx& c) {
  const Tensor& x = c.in(0);
  Tensor s = sigmoid(x);
  return {c.g[0] * (s * (x * (1.0 - s) + 1.0))};
}
Grads rule_sin(const GradCtx& c) { return {c.g[0] * cos(c.in(0))}; }
Grads rule_sqrt(const GradCtx& c) { return {c.g[0] / (c.out(0) * 2.0)}; }
Grads rule_tanh(const GradCtx& c) {
  const Tensor& y = c.out(0);
  return {c.g[0] * (1.0 - y * y)};
}

// ---- binary ----------------------------------------------------------------------------------------
Grads rule_add(const GradCtx& c) { return {c.g[0], c.g[0]}; }
Grads rule_sub(const GradCtx& c) { return {c.g[0], -c.g[0]}; }
Grads rule_mul(const GradCtx& c) {
  return {c.needs(0) ? c.g[0] * c.in(1) : Tensor(), c.needs(1) ? c.g[0] * c.in(0) : Tensor()};
}
Grads rule_div(const GradCtx& c) {
  const Tensor &a = c.in(0), &b = c.in(1);
  return {c.needs(0) ? c.g[0] / b : Tensor(), c.needs(1) ? -(c.g[0] * a / (b * b)) : Tensor()};
}
namespace {
Grads minmax(const GradCtx& c, bool is_max) {
  const Tensor &a = c.in(0), &b = c.in(1), &g = c.g[0];
  Tensor wins_a = is_max ? gt(a, b) : lt(a, b);
  Tensor tie = eq(a, b);
  Tensor half = g * 0.5, zero = zero_like_g(g);
  Tensor ga = where(wins_a, g, where(tie, half, zero));
  Tensor gb = where(logical_or(wins_a, tie), where(tie, half, zero), g);
  return {ga, gb};
}
}  // namespace
Grads rule_maximum(const GradCtx& c) { return minmax(c, true); }
Grads rule_minimum(const GradCtx& c) { return minmax(c, false); }
Grads rule_pow(const GradCtx& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &y = c.out(0), &g = c.g[0];
  Tensor ga, gb;
  if (c.needs(0)) {
    Tensor d = b * pow(a, b - 1.0);
    ga = where(eq(b, scalar(0.0, b.dtype())), zero_like_g(g), g * d);
  }
  if (c.needs(1)) {
    Tensor a_zero = logical_and(eq(a, scalar(0.0, a.dtype())), ge(b, scalar(0.0, b.dtype())));
    gb = where(a_zero, zero_like_g(g), g * y * log(a));
  }
  return {ga, gb};
}
Grads rule_where(const GradCtx& c) {
  const Tensor &cond = c.in(0), &g = c.g[0];
  Tensor zero = zero_like_g(g);
  return {Tensor(), c.needs(1) ? where(cond, g, zero) : Tensor(), c.needs(2) ? where(cond, zero, g) : Tensor()};
}

// ---- reductions ------------------------------------------------------------------------------------
Grads rule_sum(const GradCtx& c) {
  const SymIntVec& xs = c.in_sizes(0);
  IntVec dims = reduced_dims(c.attrs(), static_cast<int64_t>(xs.size()));
  return {expand_back(c.g[0], dims, c.attrs().b("keepdim"), xs)};
}
Grads rule_mean(const GradCtx& c) {
  const SymIntVec& xs = c.in_sizes(0);
  IntVec dims = reduced_dims(c.attrs(), static_cast<int64_t>(xs.size()));
  Tensor g = expand_back(c.g[0], dims, c.attrs().b("keepdim"), xs);
  return {g / size_scalar(count_of(xs, dims), g.dtype())};
}
Grads rule_var(const GradCtx& c) {
  const Tensor& x = c.in(0);
  IntVec dims = reduced_dims(c.attrs(), x.dim());
  Tensor g = expand_back(c.g[0], dims, c.attrs().b("keepdim"), x.sizes());
  SymInt dof = count_of(x.sizes(), dims) - c.attrs().i("correction");
  Tensor centered = x - mean(x, dims, true);
  return {g * centered * 2.0 / size_scalar(dof, g.dtype())};
}
namespace {
Grads extremum(const GradCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);
  IntVec dims = reduced_dims(c.attrs(), x.dim());
  bool keep = c.attrs().b("keepdim");
  Tensor mask = eq(x, expand_back(y, dims, keep, x.sizes()));
  Tensor count = sum(cast(mask, c.g[0].dtype()), dims, true);
  Tensor g = expand_back(c.g[0], dims, keep, x.sizes());
  return {where(mask, g / count, zero_like_g(g))};
}
}  // namespace
Grads rule_amax(const GradCtx& c) { return extremum(c); }
Grads rule_amin(const GradCtx& c) { return extremum(c); }
Grads rule_prod(const GradCtx& c) {
  const Tensor &x = c.in(0), &y = c.out(0);
  IntVec dims = reduced_dims(c.attrs(), x.dim());
  bool keep = c.attrs().b("keepdim");
  DType dt = c.g[0].dtype();
  Tensor one = scalar(1.0, x.dtype()), zero = scalar(0.0, dt);
  Tensor is_zero = eq(x, scalar(0.0, x.dtype()));
  Tensor x_safe = where(is_zero, one, x);
  Tensor zeros_in_group = sum(cast(is_zero, dt), dims, true);
  Tensor prod_others = prod(x_safe, dims, true);  // product of the non-zero elements
  Tensor at_zero = where(eq(zeros_in_group, scalar(1.0, dt)), cast(prod_others, dt), zero);
  Tensor elsewhere = cast(expand_back(y, dims, keep, x.sizes()), dt) / x_safe;
  Tensor g = expand_back(c.g[0], dims, keep, x.sizes());
  return {g * where(is_zero, at_zero, elsewhere)};
}
Grads rule_cumsum(const GradCtx& c) {
  int64_t d = c.attrs().i("dim");
  const Tensor& g = c.g[0];
  if (g.dim() == 0) return {g};
  return {sum(g, {d}, true) - cumsum(g, d) + g};
}

}  // namespace protean::autograd
