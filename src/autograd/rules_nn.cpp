// Reverse rules: normalization, softmax, linear algebra, convolution, pooling, indexing, attention
// (src/ops/derivatives.def).
#include <fmt/format.h>

#include <limits>

#include "autograd/rules.h"
#include "ops/dispatch.h"

namespace protean::autograd {

namespace {
IntVec last_dims(int64_t r, int64_t k) {
  IntVec d;
  for (int64_t i = r - k; i < r; ++i) d.push_back(i);
  return d;
}
/// The normalization backward over `dims`: gx = rstd (gy - mean(gy) - xhat mean(gy xhat)), where gy is
/// the gradient of xhat (centered = false for rms_norm: no mean term).
Tensor norm_backward(const Tensor& gy, const Tensor& xhat, const Tensor& rstd, const IntVec& dims, bool centered) {
  Tensor t = gy - xhat * mean(gy * xhat, dims, true);
  if (centered) t = t - mean(gy, dims, true);
  return rstd * t;
}
SymIntVec ones_but(int64_t r, int64_t d, const SymInt& n) {
  SymIntVec s(static_cast<size_t>(r), SymInt(1));
  s[static_cast<size_t>(d)] = n;
  return s;
}

/// t summed over its leading dims to the shape of p (p's sizes are t's trailing ones). On CPU tensors
/// (f32, f64) a row of ones times t as [N, P] (a GEMV through matmul): the generated reduction over
/// the rows reads one strided element per load. Otherwise t itself: the engine's sum_to_size sums it.
Tensor sum_rows_to(const Tensor& t, const Tensor& p) {
  if (!p.defined() || p.dim() < 1 || t.dim() <= p.dim() || t.device().type != DeviceType::CPU ||
      (t.dtype() != DType::F32 && t.dtype() != DType::F64))
    return t;
  SymInt P(1);
  for (int64_t d = 1; d <= p.dim(); ++d) {
    if (!static_cast<bool>(t.size(t.dim() - d) == p.size(p.dim() - d))) return t;
    P = P * p.size(p.dim() - d);
  }
  Tensor t2 = reshape(t, {SymInt(-1), P});
  return reshape(matmul(full(SymIntVec{SymInt(1), t2.size(0)}, 1.0, t.dtype()), t2), p.sizes());
}
}  // namespace

Grads rule_layer_norm(const GradCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const int64_t k = static_cast<int64_t>(c.attrs().sym_ints("normalized_shape").size());
  IntVec dims = last_dims(x.dim(), k);
  Tensor mu = mean(x, dims, true);
  Tensor rstd = rsqrt(var(x, dims, true, 0) + c.attrs().f("eps"));
  Tensor xhat = (x - mu) * rstd;
  const Tensor& g = c.g[0];
  Tensor gy = w.defined() ? g * w : g;
  return {c.needs(0) ? norm_backward(gy, xhat, rstd, dims, true) : Tensor(),
          c.needs(1) ? sum_rows_to(g * xhat, w) : Tensor(), c.needs(2) ? sum_rows_to(g, c.in(2)) : Tensor()};
}
Grads rule_rms_norm(const GradCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const int64_t k = static_cast<int64_t>(c.attrs().sym_ints("normalized_shape").size());
  IntVec dims = last_dims(x.dim(), k);
  double eps = 0;
  if (auto e = c.attrs().opt_f("eps")) eps = *e;
  else eps = x.dtype() == DType::F64 ? std::numeric_limits<double>::epsilon()
             : x.dtype() == DType::F32 ? static_cast<double>(std::numeric_limits<float>::epsilon())
             : x.dtype() == DType::F16 ? 0.0009765625 : 0.0078125;
  Tensor rstd = rsqrt(mean(x * x, dims, true) + eps);
  Tensor xhat = x * rstd;
  const Tensor& g = c.g[0];
  Tensor gy = w.defined() ? g * w : g;
  return {c.needs(0) ? norm_backward(gy, xhat, rstd, dims, false) : Tensor(), c.needs(1) ? g * xhat : Tensor()};
}
Grads rule_group_norm(const GradCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1);
  const int64_t G = c.attrs().i("groups"), r = x.dim();
  const SymInt N = x.size(0), C = x.size(1);
  Tensor xg = reshape(x, {N, SymInt(G), SymInt(-1)});
  Tensor mu = mean(xg, {2}, true);
  Tensor rstd = rsqrt(var(xg, {2}, true, 0) + c.attrs().f("eps"));
  Tensor xhat_g = (xg - mu) * rstd;
  Tensor xhat = reshape(xhat_g, x.sizes());
  const Tensor& g = c.g[0];
  Tensor gy = w.defined() ? g * reshape(w, ones_but(r, 1, C)) : g;
  Tensor gx = reshape(norm_backward(reshape(gy, {N, SymInt(G), SymInt(-1)}), xhat_g, rstd, {2}, true), x.sizes());
  IntVec red{0};
  for (int64_t i = 2; i < r; ++i) red.push_back(i);
  return {c.needs(0) ? gx : Tensor(), c.needs(1) ? sum(g * xhat, red) : Tensor(), c.needs(2) ? sum(g, red) : Tensor()};
}
Grads rule_batch_norm_train_apply(const GradCtx& c) {
  // stats are x's own batch statistics (batch_norm_train makes them with batch_norm_stats), so x's
  // gradient includes the paths through the mean and the variance: the normalization backward, as two
  // passes over g and x (the per-channel sums, then dx).
  const Tensor &x = c.in(0), &stats = c.in(1), &w = c.in(2);
  const Tensor& g = c.g[0];
  const ops::Attrs& eps = c.attrs();  // eps
  Tensor sums = ops::call1(ops::OpKind::batch_norm_train_grad_sums, {g, x, stats}, eps);
  Tensor gx = c.needs(0) ? ops::call1(ops::OpKind::batch_norm_train_backward, {g, x, stats, sums, w}, eps) : Tensor();
  Tensor gw = c.needs(2) ? cast(select(sums, 0, 1), c.in_dtype(2)) : Tensor();
  Tensor gb = c.needs(3) ? cast(select(sums, 0, 0), c.in_dtype(3)) : Tensor();
  return {gx, Tensor(), gw, gb};
}
Grads rule_batch_norm(const GradCtx& c) {
  // The op is the inference form: y = (x - running_mean) rsqrt(running_var + eps) w + b.
  const Tensor &x = c.in(0), &w = c.in(1), &rm = c.in(3), &rv = c.in(4);
  const int64_t r = x.dim();
  const SymInt C = x.size(1);
  Tensor rstd = reshape(rsqrt(rv + c.attrs().f("eps")), ones_but(r, 1, C));
  Tensor xhat = (x - reshape(rm, ones_but(r, 1, C))) * rstd;
  const Tensor& g = c.g[0];
  IntVec red{0};
  for (int64_t i = 2; i < r; ++i) red.push_back(i);
  Tensor gx = w.defined() ? g * reshape(w, ones_but(r, 1, C)) * rstd : g * rstd;
  return {c.needs(0) ? gx : Tensor(), c.needs(1) ? sum(g * xhat, red) : Tensor(), c.needs(2) ? sum(g, red) : Tensor(),
          Tensor(), Tensor()};
}
Grads rule_softmax(const GradCtx& c) {
  const Tensor& y = c.out(0);
  int64_t d = c.attrs().i("dim");
  return {y * (c.g[0] - sum(c.g[0] * y, {d}, true))};
}
Grads rule_log_softmax(const GradCtx& c) {
  const Tensor& y = c.out(0);
  int64_t d = c.attrs().i("dim");
  return {c.g[0] - exp(y) * sum(c.g[0], {d}, true)};
}

// ---- linear algebra --------------------------------------------------------------------------------------
Grads rule_bmm(const GradCtx& c) {
  const Tensor &a = c.in(0), &b = c.in(1), &g = c.g[0];
  return {c.needs(0) ? bmm(g, mT(b)) : Tensor(), c.needs(1) ? bmm(mT(a), g) : Tensor()};
}
Grads rule_matmul(const GradCtx& c) {
  Tensor a = c.in(0), b = c.in(1), g = c.g[0];
  const bool a1 = a.dim() == 1, b1 = b.dim() == 1;
  if (a1) {
    a = unsqueeze(a, 0);
    g = unsqueeze(g, g.dim() - (b1 ? 0 : 1));  // the removed row dim
  }
  if (b1) {
    b = unsqueeze(b, 1);
    g = unsqueeze(g, g.dim());
  }
  Tensor ga, gb;
  if (c.needs(0)) {
    ga = matmul(g, mT(b));
    if (ga.dim() > a.dim()) ga = autograd::sum_to_size(ga, a.sizes());
    if (a1) ga = reshape(ga, c.in_sizes(0));
  }
  if (c.needs(1)) {
    gb = matmul(mT(a), g);
    if (gb.dim() > b.dim()) gb = autograd::sum_to_size(gb, b.sizes());
    if (b1) gb = reshape(gb, c.in_sizes(1));
  }
  return {ga, gb};
}
Grads rule_linear(const GradCtx& c) {
  const Tensor &x = c.in(0), &w = c.in(1), &g = c.g[0];
  Tensor gx, gw;
  if (c.needs(0)) gx = matmul(g, w);
  if (c.needs(1)) {
    if (x.dim() == 1) {
      gw = matmul(unsqueeze(g, 1), unsqueeze(x, 0));
    } else {
      Tensor g2 = reshape(g, {SymInt(-1), w.size(0)});
      Tensor x2 = reshape(x, {SymInt(-1), w.size(1)});
      gw = matmul(mT(g2), x2);
    }
  }
  // the bias: a GEMV on CPU tensors (sum_rows_to)
  Tensor gb = c.needs(2) ? sum_rows_to(g, c.in(2)) : Tensor();
  return {gx, gw, gb};
}

// ---- convolution ---------------------------------------------------------------------------------------------
namespace {
struct Conv2dArgs {
  IntVec stride, padding, dilation;
  int64_t groups = 1;
};
IntVec two(IntVec v) {
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}
/// The weight gradient of y = conv2d(x, w) given gy, without an op of its own: a conv2d of x (channels
/// as batch) with gy (channels as batch) as the kernel, stride and dilation swapped, per group.
/// x [N, Cin, H, W], gy [N, Cout, OH, OW] → [Cout, Cin/groups, kh, kw].
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, int64_t kh, int64_t kw, const Conv2dArgs& a) {
  const int64_t cin = x.size(1).guard_int(), cout = gy.size(1).guard_int(), G = a.groups;
  const int64_t cg = cin / G, og = cout / G;
  TensorList parts;
  for (int64_t gi = 0; gi < G; ++gi) {
    Tensor xg = G == 1 ? x : slice(x, 1, gi * cg, (gi + 1) * cg, 1);
    Tensor gg = G == 1 ? gy : slice(gy, 1, gi * og, (gi + 1) * og, 1);
    Tensor r = conv2d(transpose(xg, 0, 1), transpose(gg, 0, 1), Tensor(), a.dilation, a.padding, a.stride, 1);
    r = slice(slice(r, 2, 0, kh, 1), 3, 0, kw, 1);  // [cg, og, kh, kw]
    parts.push_back(transpose(r, 0, 1));
  }
  return G == 1 ? parts[0] : cat(parts, 0);
}
/// The input gradient of conv2d: conv_transpose2d of gy with the same weight, output_padding chosen so
/// that the result has the input's size.
Tensor conv2d_input_grad(const Tensor& gy, const Tensor& w, const SymIntVec& x_sizes, const Conv2dArgs& a) {
  const int64_t r = static_cast<int64_t>(x_sizes.size());
  IntVec out_pad;
  for (int64_t i = 0; i < 2; ++i) {
    const size_t ui = static_cast<size_t>(i);
    int64_t L = x_sizes[static_cast<size_t>(r - 2 + i)].guard_int();
    int64_t O = gy.size(gy.dim() - 2 + i).guard_int();
    int64_t k = w.size(2 + i).guard_int();
    out_pad.push_back(L - ((O - 1) * a.stride[ui] - 2 * a.padding[ui] + a.dilation[ui] * (k - 1) + 1));
  }
  return conv_transpose2d(gy, w, Tensor(), a.stride, a.padding, out_pad, a.groups, a.dilation);
}
Conv2dArgs conv_args(const ops::Attrs& at) {
  return {two(at.ints("stride")), two(at.ints("padding")), two(at.ints("dilation")), at.i("groups")};
}
ops::Attrs backward_attrs(const Conv2dArgs& a, const char* size_name, const IntVec& size) {
  return {{size_name, to_symint_vec(size)},
          {"stride", to_symint_vec(a.stride)},
          {"padding", to_symint_vec(a.padding)},
          {"dilation", to_symint_vec(a.dilation)},
          {"groups", SymInt(a.groups)}};
}
/// CPU tensors take the gradients through conv2d_backward_input / conv2d_backward_weight (oneDNN's
/// backward primitives, src/ops/conv_backward.cpp); other devices keep the forms above, which their
/// backends lower to their own convolutions.
bool on_cpu(const Tensor& t) { return t.device().type == DeviceType::CPU; }
/// The weight gradient [Cout, Cin/groups, kh, kw] of conv2d(x, w) for batched x [N, Cin, H, W] and
/// gy [N, Cout, OH, OW].
Tensor weight_grad(const Tensor& x, const Tensor& gy, int64_t kh, int64_t kw, const Conv2dArgs& a) {
  if (on_cpu(x))
    return ops::call1(ops::OpKind::conv2d_backward_weight, {gy, x}, backward_attrs(a, "kernel_size", {kh, kw}));
  return conv2d_weight_grad(x, gy, kh, kw, a);
}
/// The input gradient of conv2d(x, w) for batched x of sizes `x_sizes` and gy [N, Cout, OH, OW].
Tensor input_grad(const Tensor& gy, const Tensor& w, const SymIntVec& x_sizes, const Conv2dArgs& a) {
  if (on_cpu(gy)) {
    const size_t r = x_sizes.size();
    return ops::call1(ops::OpKind::conv2d_backward_input, {gy, w},
                      backward_attrs(a, "input_size", {x_sizes[r - 2].guard_int(), x_sizes[r - 1].guard_int()}));
  }
  return conv2d_input_grad(gy, w, x_sizes, a);
}
}  // namespace

Grads rule_conv2d(const GradCtx& c) {
  Tensor x = c.in(0), w = c.in(1), g = c.g[0];
  const bool unbatched = x.dim() == 3;
  if (unbatched) x = unsqueeze(x, 0), g = unsqueeze(g, 0);
  Conv2dArgs a = conv_args(c.attrs());
  SymIntVec xs = x.sizes();
  Tensor gx, gw;
  if (c.needs(0)) {
    gx = input_grad(g, w, xs, a);
    if (unbatched) gx = squeeze(gx, {0});
  }
  if (c.needs(1)) gw = weight_grad(x, g, w.size(2).guard_int(), w.size(3).guard_int(), a);
  Tensor gb;
  if (c.needs(2)) gb = sum(g, {0, 2, 3});
  return {gx, gw, gb};
}
Grads rule_conv1d(const GradCtx& c) {
  Tensor x = c.in(0), w = c.in(1), g = c.g[0];
  const bool unbatched = x.dim() == 2;
  if (unbatched) x = unsqueeze(x, 0), g = unsqueeze(g, 0);
  Tensor x2 = unsqueeze(x, 2), w2 = unsqueeze(w, 2), g2 = unsqueeze(g, 2);
  Conv2dArgs a{{1, c.attrs().ints("stride").at(0)},
               {0, c.attrs().ints("padding").at(0)},
               {1, c.attrs().ints("dilation").at(0)},
               c.attrs().i("groups")};
  Tensor gx, gw;
  if (c.needs(0)) {
    gx = squeeze(input_grad(g2, w2, x2.sizes(), a), {2});
    if (unbatched) gx = squeeze(gx, {0});
  }
  if (c.needs(1)) gw = squeeze(weight_grad(x2, g2, 1, w.size(2).guard_int(), a), {2});
  return {gx, gw, c.needs(2) ? sum(g, {0, 2}) : Tensor()};
}
Grads rule_conv_transpose2d(const GradCtx& c) {
  Tensor x = c.in(0), w = c.in(1), g = c.g[0];
  const bool unbatched = x.dim() == 3;
  if (unbatched) x = unsqueeze(x, 0), g = unsqueeze(g, 0);
  Conv2dArgs a = conv_args(c.attrs());
  Tensor gx, gw;
  // y = conv_transpose2d(x, w) is the input gradient of conv2d(·, w): its adjoint is conv2d.
  if (c.needs(0)) {
    gx = conv2d(g, w, Tensor(), a.stride, a.padding, a.dilation, a.groups);
    // an output_padding ≥ stride (allowed when < dilation) adds windows past x's last row or column
    for (int64_t d = 2; d < 4; ++d)
      if (!static_cast<bool>(gx.size(d) == x.size(d))) gx = slice(gx, d, 0, x.size(d).guard_int(), 1);
    if (unbatched) gx = squeeze(gx, {0});
  }
  if (c.needs(1)) {
    // conv2d(g) has x's sizes unless output_padding reaches past the last window (it may be ≥ stride
    // when < dilation): then the conv over g's views, whose extra rows it slices off.
    const IntVec op = c.attrs().has("output_padding") ? two(c.attrs().ints("output_padding")) : IntVec{0, 0};
    const int64_t kh = w.size(2).guard_int(), kw = w.size(3).guard_int();
    gw = op[0] < a.stride[0] && op[1] < a.stride[1] ? weight_grad(g, x, kh, kw, a) : conv2d_weight_grad(g, x, kh, kw, a);
  }
  return {gx, gw, c.needs(2) ? sum(g, {0, 2, 3}) : Tensor()};
}

// ---- pooling -----------------------------------------------------------------------------------------------
namespace {
Grads pool_rule(const GradCtx& c, ops::OpKind backward_op) {
  return {ops::call1(backward_op, {c.g[0], c.in(0)}, c.attrs())};
}
}  // namespace
Grads rule_max_pool2d(const GradCtx& c) { return pool_rule(c, ops::OpKind::max_pool2d_backward); }
Grads rule_avg_pool2d(const GradCtx& c) { return pool_rule(c, ops::OpKind::avg_pool2d_backward); }
Grads rule_adaptive_avg_pool2d(const GradCtx& c) { return pool_rule(c, ops::OpKind::adaptive_avg_pool2d_backward); }

// ---- indexing -----------------------------------------------------------------------------------------------
Grads rule_embedding(const GradCtx& c) {
  const Tensor &w = c.in(0), &idx = c.in(1);
  const SymInt D = w.size(1);
  Tensor zeros = full(w.sizes(), 0.0, c.g[0].dtype());
  return {index_add(zeros, 0, reshape(idx, {SymInt(-1)}), reshape(c.g[0], {SymInt(-1), D})), Tensor()};
}
Grads rule_gather(const GradCtx& c) {
  const Tensor &x = c.in(0), &idx = c.in(1);
  Tensor zeros = full(x.sizes(), 0.0, c.g[0].dtype());
  return {scatter_add(zeros, c.attrs().i("dim"), idx, c.g[0]), Tensor()};
}
Grads rule_index_select(const GradCtx& c) {
  const Tensor &x = c.in(0), &idx = c.in(1);
  const int64_t d = wrap(c.attrs().i("dim"), x.dim());
  Tensor zeros = full(x.sizes(), 0.0, c.g[0].dtype());
  Tensor g = c.g[0];
  if (g.dim() < x.dim()) g = unsqueeze(g, d);  // a 0-D index removed the dim
  Tensor at = reshape(idx, {SymInt(-1)});
  // ONNX Gather (wrap_negative): an index < 0 counts from the end; the gathered dim's size is read as
  // a constant (a guard where it is symbolic), as the importer's normalization did before.
  if (c.attrs().has("wrap_negative") && c.attrs().b("wrap_negative")) {
    const double size = static_cast<double>(x.size(d).guard_int());
    at = where(lt(at, scalar_tensor(0, at.dtype())), add(at, scalar_tensor(size, at.dtype())), at);
  }
  return {index_add(zeros, d, at, g), Tensor()};
}

// ---- attention --------------------------------------------------------------------------------------------------
Grads rule_scaled_dot_product_attention(const GradCtx& c) {
  const Tensor &q = c.in(0), &k = c.in(1), &v = c.in(2), &mask = c.in(3), &g = c.g[0];
  // Self-attention shapes on CPU without a mask: one op, the probabilities recomputed a query row at a
  // time and never stored (src/ops/attention_backward.cpp).
  auto same = [](const Tensor& a, const Tensor& b) {
    bool r = a.dim() == b.dim() && a.dtype() == b.dtype();
    for (int64_t d = 0; r && d < a.dim(); ++d) r = static_cast<bool>(a.size(d) == b.size(d));
    return r;
  };
  if (!mask.defined() && q.device().type == DeviceType::CPU && (q.dtype() == DType::F32 || q.dtype() == DType::F64) &&
      q.dim() >= 2 && same(q, k) && same(q, v) && same(q, g)) {
    Tensor d = ops::call1(ops::OpKind::scaled_dot_product_attention_backward, {g, q, k, v}, c.attrs());
    return {c.needs(0) ? select(d, 0, 0) : Tensor(), c.needs(1) ? select(d, 0, 1) : Tensor(),
            c.needs(2) ? select(d, 0, 2) : Tensor(), Tensor()};
  }
  const int64_t E = q.size(-1).guard_int();
  const double scale = c.attrs().opt_f("scale").value_or(1.0 / std::sqrt(static_cast<double>(E)));
  Tensor s = matmul(q, mT(k)) * scale;
  if (mask.defined()) {
    if (mask.dtype() == DType::Bool) s = where(mask, s, scalar(-std::numeric_limits<double>::infinity(), s.dtype()));
    else s = s + mask;
  }
  if (c.attrs().has("is_causal") && c.attrs().b("is_causal")) {
    const SymInt L = q.size(-2), S = k.size(-2);
    Tensor keep = le(unsqueeze(arange(S), 0), unsqueeze(arange(L), 1));  // j <= i
    s = where(keep, s, scalar(-std::numeric_limits<double>::infinity(), s.dtype()));
  }
  Tensor p = softmax(s, -1);
  Tensor gv = c.needs(2) ? matmul(mT(p), g) : Tensor();
  Tensor gp = matmul(g, mT(v));
  Tensor gs = p * (gp - sum(gp * p, {-1}, true));
  Tensor gq = c.needs(0) ? matmul(gs, k) * scale : Tensor();
  Tensor gk = c.needs(1) ? matmul(mT(gs), q) * scale : Tensor();
  Tensor gmask = c.needs(3) && mask.defined() && mask.dtype() != DType::Bool ? gs : Tensor();
  return {gq, gk, gv, gmask};
}

}  // namespace protean::autograd
