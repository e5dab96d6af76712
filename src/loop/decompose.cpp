#include "loop/decompose.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ir/sym_util.h"

namespace protean::loop {

using ops::OpKind;

namespace {
int64_t wrap(int64_t d, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= std::max<int64_t>(r, 1)) throw Unsupported{"dim out of range"};
  return d;
}
SExpr c(double v, DType d) { return s_const(v, d); }
SExpr add(SExpr a, SExpr b) { DType d = a->dtype; return s_binary(ScalarOp::add, a, s_cast(b, d), d); }
SExpr sub(SExpr a, SExpr b) { DType d = a->dtype; return s_binary(ScalarOp::sub, a, s_cast(b, d), d); }
SExpr mul(SExpr a, SExpr b) { DType d = a->dtype; return s_binary(ScalarOp::mul, a, s_cast(b, d), d); }
SExpr div(SExpr a, SExpr b) { DType d = a->dtype; return s_binary(ScalarOp::div, a, s_cast(b, d), d); }
SExpr fn(ScalarOp f, SExpr a) { DType d = a->dtype; return s_unary(f, a, d); }

std::vector<int64_t> reduce_dims(const ir::Node& n, size_t rank) {
  IntVec d = n.attrs.has("dims") ? n.attrs.ints("dims") : IntVec{};
  std::vector<int64_t> r;
  if (d.empty())
    for (size_t i = 0; i < rank; ++i) r.push_back(static_cast<int64_t>(i));
  for (int64_t x : d) r.push_back(wrap(x, rank));
  return r;
}
sym::Expr count(const TRef& x, const std::vector<int64_t>& dims) {
  sym::Expr n = sym::integer(1);
  for (int64_t d : dims) n = sym::mul(n, x.sizes[static_cast<size_t>(d)]);
  return simplify_index(n);
}
/// Per-element constant broadcast of a [C] parameter along dim 1 of an x of rank r.
TRef channel_param(const Lowerer& L, const TRef& p, const TRef& x) {
  TRef t = p;
  for (size_t k = 2; k < x.sizes.size(); ++k) t = L.unsqueeze(t, static_cast<int64_t>(t.sizes.size()));
  return L.broadcast_to(t, x.sizes);
}

TRef gelu(const Lowerer& L, const TRef& x, DType d, bool tanh_form) {
  return L.unary(x, d, [d, tanh_form](SExpr a) {
    a = s_cast(a, d);
    if (!tanh_form) return mul(a, fn(ScalarOp::normal_cdf, a));  // x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))
    SExpr inner = fn(ScalarOp::tanh, mul(mul(a, add(c(1, d), mul(mul(a, a), c(0.044715, d)))), c(std::sqrt(2.0 / M_PI), d)));
    return mul(mul(a, c(0.5, d)), add(c(1, d), inner));
  });
}
SExpr hardsigmoid(SExpr a, DType d) {
  return div(s_binary(ScalarOp::min, s_binary(ScalarOp::max, add(a, c(3, d)), c(0, d), d), c(6, d), d), c(6, d));
}

/// softmax / log_softmax over dim d, computed in dtype dt. `zero_masked`: rows whose max is -inf give 0.
TRef softmax(Lowerer& L, const TRef& x0, int64_t d, DType dt, bool log, bool zero_masked) {
  TRef x = L.unary(x0, dt, [dt](SExpr a) { return s_cast(a, dt); });
  TRef m = L.reduce(x, {d}, "max", dt, true);
  TRef e = L.binary(x, m, dt, [](SExpr a, SExpr b) { return fn(ScalarOp::exp, sub(a, b)); });
  if (zero_masked)
    e = L.binary(x, m, dt, [dt](SExpr a, SExpr b) {
      return s_where(s_binary(ScalarOp::eq, b, c(-INFINITY, dt), DType::Bool), c(0, dt), fn(ScalarOp::exp, sub(a, b)));
    });
  TRef s = L.reduce(e, {d}, "sum", dt, true);
  if (log)
    return L.map({x, m, s}, x.sizes, dt, [](const std::vector<SExpr>& v) { return sub(sub(v[0], v[1]), fn(ScalarOp::log, v[2])); });
  // e · (1/sum): one division per row, written here so that every kernel that computes the softmax
  // has the same expression (the scheduler rewrites divisions by constants only: loop/schedule.cpp)
  TRef r = L.binary(e, s, dt, [dt](SExpr a, SExpr b) { return mul(a, fn(ScalarOp::reciprocal, b)); });
  if (zero_masked)
    r = L.map({e, s}, x.sizes, dt, [dt](const std::vector<SExpr>& v) {
      return s_where(s_binary(ScalarOp::eq, v[1], c(0, dt), DType::Bool), c(0, dt), mul(v[0], fn(ScalarOp::reciprocal, v[1])));
    });
  return r;
}

/// The elementwise affine of layer_norm / rms_norm: y * weight + bias. With both parameters present
/// in f32/f64 it is one fused multiply-add, as eager's kernel computes it (ops/normalization.cpp
/// normalize_row: one rounding instead of two, and one vector operation fewer per element in the loop
/// that also evaluates gelu in a layer_norm + gelu block).
TRef norm_affine(const Lowerer& L, TRef y, const ir::Node& n, size_t first_param, size_t nparams, DType dt) {
  auto present = [&](size_t k) { return k < n.inputs.size() && n.inputs[k] != ir::kNoValue; };
  if (nparams == 2 && present(first_param) && present(first_param + 1) && (dt == DType::F32 || dt == DType::F64)) {
    TRef w = L.input(n, first_param), b = L.input(n, first_param + 1);
    return L.map({y, w, b}, y.sizes, dt, [](const std::vector<SExpr>& v) { return s_fma(v[0], v[1], v[2]); });
  }
  for (size_t k = first_param; k < first_param + nparams; ++k) {
    if (!present(k)) continue;
    TRef p = L.input(n, k);
    bool is_bias = k == first_param + 1;
    y = L.binary(y, p, dt, [is_bias](SExpr a, SExpr b) { return is_bias ? add(a, b) : mul(a, b); });
  }
  return y;
}
/// scaled_dot_product_attention_backward(g, q, k, v) is_causal scale → [3, ...q] = (dq, dk, dv), no
/// mask, g, q, k, v of one shape [..., L, E] (LowerOptions::decompose_attention_backward):
///   s = scale·q·kᵀ (extern) (causal: -inf above the diagonal); p = softmax(s)
///   dv = pᵀ·g (extern); dp = g·vᵀ (extern); ds = p·(dp − Σ_j dp·p)·scale
///   dq = ds·k (extern); dk = dsᵀ·q (extern)
/// — the autograd rule's composite form, the probabilities recomputed from q and k.
TRef attention_backward(Lowerer& L, const ir::Node& n, DType od) {
  if (n.inputs.size() != 4) throw Unsupported{"sdpa backward operands"};
  TRef g = L.input(n, 0), q = L.input(n, 1), k = L.input(n, 2), v = L.input(n, 3);
  const size_t r = q.sizes.size();
  if (r < 2 || (od != DType::F32 && od != DType::F64)) throw Unsupported{"sdpa backward rank or dtype"};
  for (const TRef* t : {&g, &k, &v})
    if (t->dtype != od || t->sizes.size() != r) throw Unsupported{"sdpa backward shapes"};
  for (const TRef* t : {&g, &k, &v})
    for (size_t i = 0; i < r; ++i)
      if (simplify_index(t->sizes[i]) != simplify_index(q.sizes[i])) throw Unsupported{"sdpa backward shapes"};
  const sym::Expr E = q.sizes.back(), Lq = q.sizes[r - 2];
  if (!E->is_integer() && !n.attrs.has("scale")) throw Unsupported{"symbolic head dim"};
  const double scale = n.attrs.has("scale") ? n.attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(E->value));
  const bool causal = n.attrs.has("is_causal") && n.attrs.b("is_causal");
  std::vector<int64_t> perm;
  for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(i));
  std::swap(perm[r - 1], perm[r - 2]);
  auto mT = [&](const TRef& t) { return L.permute(t, perm); };
  std::vector<sym::Expr> ssz(q.sizes.begin(), q.sizes.end() - 1);  // [..., L, L]
  ssz.push_back(Lq);
  const std::vector<sym::Expr>& qsz = q.sizes;
  auto mm = [&](const TRef& a, const TRef& b, const std::vector<sym::Expr>& sizes) {
    return L.extern_call(OpKind::matmul, {}, {&a, &b}, {{od, sizes}})[0];
  };
  const TRef kt = mT(k), vt = mT(v);
  TRef s = L.unary(mm(q, kt, ssz), od, [od, scale](SExpr a) { return mul(a, c(scale, od)); });
  if (causal)
    s.fn = [inner = s.fn, od](const std::vector<sym::Expr>& idx) {
      sym::Expr i = idx[idx.size() - 2], j = idx.back();
      return s_where(s_index(sym::gt(j, i), DType::Bool), c(-INFINITY, od), inner(idx));
    };
  const int64_t last = static_cast<int64_t>(r - 1);
  const TRef p = softmax(L, s, last, od, false, true);
  const TRef pt = mT(p);
  const TRef dv = mm(pt, g, qsz);
  const TRef dp = mm(g, vt, ssz);
  const TRef dot = L.reduce(L.binary(dp, p, od, [](SExpr a, SExpr b) { return mul(a, b); }), {last}, "sum", od, true);
  const TRef centered = L.binary(dp, dot, od, [](SExpr a, SExpr b) { return sub(a, b); });
  const TRef ds = L.binary(p, centered, od, [od, scale](SExpr a, SExpr b) { return mul(mul(a, b), c(scale, od)); });
  const TRef dst = mT(ds);
  const TRef dq = mm(ds, k, qsz);
  const TRef dk = mm(dst, q, qsz);
  TRef out;
  out.dtype = od;
  out.sizes = {sym::integer(3)};
  for (const sym::Expr& e : qsz) out.sizes.push_back(e);
  out.fn = [dq, dk, dv](const std::vector<sym::Expr>& idx) {
    const std::vector<sym::Expr> rest(idx.begin() + 1, idx.end());
    return s_where(s_index(sym::eq(idx[0], sym::integer(0)), DType::Bool), dq.fn(rest),
                   s_where(s_index(sym::eq(idx[0], sym::integer(1)), DType::Bool), dk.fn(rest), dv.fn(rest)));
  };
  return out;
}

}  // namespace

TRef lower_composite(Lowerer& L, const ir::Node& n, LowerRule rule) {
  TRef out;
  const ir::Value& ov = L.graph().value(n.outputs[0]);
  const DType od = ov.dtype;
  switch (rule) {
    case LowerRule::gelu: {
      const std::string& a = n.attrs.s("approximate");
      out = gelu(L, L.input(n, 0), od, a == "tanh");
      return out;
    }
    case LowerRule::silu:
      out = L.unary(L.input(n, 0), od, [od](SExpr a) { a = s_cast(a, od); return div(a, add(c(1, od), fn(ScalarOp::exp, fn(ScalarOp::neg, a)))); });
      return out;
    case LowerRule::hardsigmoid:
      out = L.unary(L.input(n, 0), od, [od](SExpr a) { return hardsigmoid(s_cast(a, od), od); });
      return out;
    case LowerRule::hardswish:
      out = L.unary(L.input(n, 0), od, [od](SExpr a) { a = s_cast(a, od); return mul(a, hardsigmoid(a, od)); });
      return out;
    case LowerRule::reduce:
    case LowerRule::mean_var: {
      TRef x = L.input(n, 0);
      if (x.sizes.empty()) throw Unsupported{"0-dim reduction"};
      std::vector<int64_t> dims = reduce_dims(n, x.sizes.size());
      bool keep = n.attrs.has("keepdim") && n.attrs.b("keepdim");
      const char* op = n.op == OpKind::prod ? "prod" : n.op == OpKind::amax ? "max" : n.op == OpKind::amin ? "min" : "sum";
      if (n.op == OpKind::mean || n.op == OpKind::var) {
        if (!is_floating(od)) throw Unsupported{"integer mean"};
        sym::Expr N = count(x, dims);
        TRef xf = L.unary(x, od, [od](SExpr a) { return s_cast(a, od); });
        TRef mean;
        if (n.op == OpKind::var) {
          // one Welford pass: M2 / (N - correction)
          int64_t corr = n.attrs.has("correction") ? n.attrs.i("correction") : 1;
          TRef m2 = L.welford(xf, dims, od).second;
          sym::Expr den = sym::maximum(sym::integer(0), sym::sub(N, sym::integer(corr)));
          mean = L.unary(m2, od, [den, od](SExpr a) { return div(a, s_index(den, od)); });
        } else {
          TRef s = L.reduce(xf, dims, "sum", od, true);
          mean = L.unary(s, od, [N, od](SExpr a) { return div(a, s_index(N, od)); });
        }
        out = mean;
        if (!keep) {
          // drop the kept size-1 dims again (highest first)
          TRef r = out;
          std::vector<int64_t> sorted = dims;
          std::sort(sorted.begin(), sorted.end());
          std::vector<bool> drop(x.sizes.size(), false);
          for (int64_t d : sorted) drop[static_cast<size_t>(d)] = true;
          TRef t;
          t.dtype = od;
          for (size_t i = 0; i < x.sizes.size(); ++i)
            if (!drop[i]) t.sizes.push_back(x.sizes[i]);
          t.fn = [r, drop](const std::vector<sym::Expr>& idx) {
            std::vector<sym::Expr> s;
            size_t j = 0;
            for (bool dr : drop) s.push_back(dr ? sym::integer(0) : idx[j++]);
            return r.fn(s);
          };
          out = t;
        }
        return out;
      }
      TRef xf = L.unary(x, od, [od](SExpr a) { return s_cast(a, od); });
      out = L.reduce(xf, dims, op, od, keep);
      return out;
    }
    case LowerRule::softmax: {
      TRef x = L.input(n, 0);
      if (x.sizes.empty() || !is_floating(od)) throw Unsupported{"0-dim softmax"};
      out = softmax(L, x, wrap(n.attrs.i("dim"), x.sizes.size()), od, n.op == OpKind::log_softmax, false);
      return out;
    }
    case LowerRule::norm: {
      TRef x = L.input(n, 0);
      size_t k = n.attrs.sym_ints("normalized_shape").size();
      if (k == 0 || k > x.sizes.size()) throw Unsupported{"normalized_shape"};
      std::vector<int64_t> dims;
      for (size_t i = x.sizes.size() - k; i < x.sizes.size(); ++i) dims.push_back(static_cast<int64_t>(i));
      sym::Expr N = count(x, dims);
      TRef xf = L.unary(x, od, [od](SExpr a) { return s_cast(a, od); });
      TRef y;
      if (n.op == OpKind::layer_norm) {
        double eps = n.attrs.f("eps");
        // mean and M2 in one Welford pass; y = (x - mean) / sqrt(M2 / N + eps)
        auto [mean, m2] = L.welford(xf, dims, od);
        TRef xc = L.binary(xf, mean, od, [](SExpr a, SExpr b) { return sub(a, b); });
        y = L.binary(xc, m2, od, [N, od, eps](SExpr a, SExpr b) {
          return mul(a, fn(ScalarOp::rsqrt, add(div(b, s_index(N, od)), c(eps, od))));
        });
        out = norm_affine(L, y, n, 1, 2, od);
      } else {
        double eps = n.attrs.has("eps") ? n.attrs.f("eps")
                     : od == DType::F64 ? std::numeric_limits<double>::epsilon()
                                        : static_cast<double>(std::numeric_limits<float>::epsilon());
        TRef ss = L.reduce(L.unary(xf, od, [](SExpr a) { return mul(a, a); }), dims, "sum", od, true);
        y = L.binary(xf, ss, od, [N, od, eps](SExpr a, SExpr b) {
          return mul(a, fn(ScalarOp::rsqrt, add(div(b, s_index(N, od)), c(eps, od))));
        });
        out = norm_affine(L, y, n, 1, 1, od);
      }
      return out;
    }
    case LowerRule::batch_norm: {
      TRef x = L.input(n, 0);
      if (x.sizes.size() < 2 || !is_floating(od)) throw Unsupported{"batch_norm rank"};
      double eps = n.attrs.f("eps");
      TRef rm = channel_param(L, L.input(n, 3), x), rv = channel_param(L, L.input(n, 4), x);
      TRef y = L.map({x, rm, rv}, x.sizes, od, [od, eps](const std::vector<SExpr>& v) {
        return mul(sub(s_cast(v[0], od), v[1]), fn(ScalarOp::rsqrt, add(s_cast(v[2], od), c(eps, od))));
      });
      if (n.inputs[1] != ir::kNoValue)
        y = L.binary(y, channel_param(L, L.input(n, 1), x), od, [](SExpr a, SExpr b) { return mul(a, b); });
      if (n.inputs[2] != ir::kNoValue)
        y = L.binary(y, channel_param(L, L.input(n, 2), x), od, [](SExpr a, SExpr b) { return add(a, b); });
      out = y;
      return out;
    }
    case LowerRule::attention: {
      if (n.op == OpKind::scaled_dot_product_attention_backward) {
        out = attention_backward(L, n, od);
        return out;
      }
      TRef q = L.input(n, 0), k = L.input(n, 1), v = L.input(n, 2);
      if (q.sizes.size() < 2 || k.sizes.size() < 2 || v.sizes.size() < 2) throw Unsupported{"sdpa rank"};
      if (q.dtype != od || k.dtype != od || v.dtype != od) throw Unsupported{"sdpa dtypes"};
      sym::Expr E = q.sizes.back();
      if (!E->is_integer() && !n.attrs.has("scale")) throw Unsupported{"symbolic head dim"};
      double scale = n.attrs.has("scale") ? n.attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(E->value));
      bool causal = n.attrs.has("is_causal") && n.attrs.b("is_causal");
      const bool masked = n.inputs.size() > 3 && n.inputs[3] != ir::kNoValue;
      const bool half_fused = L.options().fused_attention_half && (od == DType::BF16 || od == DType::F16) &&
                              (!masked || L.input(n, 3).dtype == od);
      if ((L.options().fused_attention && !masked && od == DType::F32) || half_fused) {
        // one fused step (the backend's kernel): the [L, S] scores are never stored
        std::vector<sym::Expr> osz = value_sizes(ov);
        ops::Attrs a;
        a.set("is_causal", causal);
        a.set("scale", scale);
        TRef m = masked ? L.input(n, 3) : TRef{};
        out = L.extern_call(OpKind::scaled_dot_product_attention, a, {&q, &k, &v, masked ? &m : nullptr}, {{od, osz}})[0];
        return out;
      }
      std::vector<int64_t> perm;
      for (size_t i = 0; i < k.sizes.size(); ++i) perm.push_back(static_cast<int64_t>(i));
      std::swap(perm[perm.size() - 1], perm[perm.size() - 2]);
      TRef kt = L.permute(k, perm);
      auto batch = [](const std::vector<sym::Expr>& s) { return std::vector<sym::Expr>(s.begin(), s.end() - 2); };
      std::vector<sym::Expr> ssz = Lowerer::broadcast_sizes(batch(q.sizes), batch(k.sizes));
      sym::Expr Lq = q.sizes[q.sizes.size() - 2], S = k.sizes[k.sizes.size() - 2];
      ssz.push_back(Lq);
      ssz.push_back(S);
      TRef scores = L.extern_call(OpKind::matmul, {}, {&q, &kt}, {{od, ssz}})[0];
      TRef s = L.unary(scores, od, [od, scale](SExpr a) { return mul(a, c(scale, od)); });
      if (causal) {
        s.fn = [inner = s.fn, od](const std::vector<sym::Expr>& idx) {
          sym::Expr i = idx[idx.size() - 2], j = idx.back();
          return s_where(s_index(sym::gt(j, i), DType::Bool), c(-INFINITY, od), inner(idx));
        };
      }
      if (n.inputs.size() > 3 && n.inputs[3] != ir::kNoValue) {
        TRef m = L.input(n, 3);
        bool bmask = m.dtype == DType::Bool;
        s = L.binary(s, m, od, [bmask, od](SExpr a, SExpr b) {
          return bmask ? s_where(s_cast(b, DType::Bool), a, c(-INFINITY, od)) : add(a, b);
        });
        s = L.broadcast_to(s, ssz);
      }
      TRef p = softmax(L, s, static_cast<int64_t>(ssz.size() - 1), od, false, true);
      std::vector<sym::Expr> osz = Lowerer::broadcast_sizes(batch(ssz), batch(v.sizes));
      osz.push_back(Lq);
      osz.push_back(v.sizes.back());
      TRef o = L.extern_call(OpKind::matmul, {}, {&p, &v}, {{od, osz}})[0];
      out = L.broadcast_to(o, value_sizes(ov));
      return out;
    }
    case LowerRule::abs: case LowerRule::cast: case LowerRule::rounding: case LowerRule::clamp:
    case LowerRule::unary: case LowerRule::logical_not: case LowerRule::binary: case LowerRule::pow:
    case LowerRule::compare: case LowerRule::logical: case LowerRule::where: case LowerRule::expand:
    case LowerRule::permute: case LowerRule::reshape: case LowerRule::select: case LowerRule::slice:
    case LowerRule::squeeze: case LowerRule::unsqueeze: case LowerRule::cat: case LowerRule::clone:
    case LowerRule::pad: case LowerRule::arange: case LowerRule::full: case LowerRule::extern_call:
    case LowerRule::cond:
      break;
  }
  throw CompileError(fmt::format("lowering: rule {} of op {} is not a decomposition", rule_name(rule), ops::op_name(n.op)));
}

}  // namespace protean::loop
