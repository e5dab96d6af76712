// Training-mode batch norm as four ops (include/protean/optim.h batch_norm_train builds them):
//
//   stats = batch_norm_stats(x)                       f64 [2, C]: mean, biased variance per channel
//   y     = batch_norm_train_apply(x, stats, w?, b?)  (x − mean) · rstd · w + b, rstd = 1/sqrt(var + eps)
//   sums  = batch_norm_train_grad_sums(g, x, stats)   f64 [2, C]: Σ g, Σ g · x̂ per channel
//   dx    = batch_norm_train_backward(g, x, stats, sums, w?)
//         = w · rstd · (g − Σg / n − x̂ · Σ(g x̂) / n),  x̂ = (x − mean) · rstd
//
// x is [N, C, *]; a channel's n = N · prod(trailing dims) values are N runs of S contiguous elements
// (x is made contiguous first). The statistics are accumulated in f64, as ATen's CPU kernel does for
// float inputs: the mean in one pass, then Σ (x − mean)² in a second pass over the same channel,
// which is still in cache (a channel of train_bench's CNN is 200 KB). The gradient sums take one
// pass over g and x (f64 accumulators), the input gradient a second one (two multiply-adds per
// element in x's precision). mean and rstd are rounded to x's dtype once, then the forward computes
// ((x − mean) · rstd) · w + b as the composite form did.
// f16/bf16 compute in float.
#include <fmt/format.h>

#include <cmath>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {
namespace {
using namespace kernel;
using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

void need_nc(OpKind op, Ins in, size_t i, const char* what) {
  const Tensor& t = in[i];
  if (!t.defined()) throw ValueError(fmt::format("{}: {} is undefined", describe_call(op, in), what));
  if (!is_floating(t.dtype()))
    throw TypeError(fmt::format("{}: {} must be floating, got {}", describe_call(op, in), what, short_name(t.dtype())));
  if (t.dim() < 2)
    throw ShapeError(fmt::format("{}: {} must be [N, C, *] (at least 2-D), got {}", describe_call(op, in), what,
                                 to_string(t.sizes())));
}
/// A [2, C] f64 input (stats or sums) of x's channel count.
void need_pair(OpKind op, Ins in, size_t i, const SymInt& C, const char* what) {
  const Tensor& t = in[i];
  if (!t.defined() || t.dtype() != DType::F64 || t.dim() != 2 || !static_cast<bool>(t.size(0) == 2) ||
      !static_cast<bool>(t.size(1) == C))
    throw ShapeError(fmt::format("{}: {} must be f64 [2, {}]", describe_call(op, in), what, C.str()));
}
void need_channel(OpKind op, Ins in, size_t i, const SymInt& C, const char* what) {
  const Tensor& t = in[i];
  if (!t.defined()) return;
  if (t.dim() != 1 || !static_cast<bool>(t.size(0) == C))
    throw ShapeError(fmt::format("{}: {} must be 1-D of the {} channels, got {}", describe_call(op, in), what, C.str(),
                                 to_string(t.sizes())));
  if (t.dtype() != in[0].dtype())
    throw TypeError(fmt::format("{}: {} must have x's dtype {}, got {}", describe_call(op, in), what,
                                short_name(in[0].dtype()), short_name(t.dtype())));
}
void need_same(OpKind op, Ins in) {
  bool same = in[0].dim() == in[1].dim() && in[0].dtype() == in[1].dtype();
  for (int64_t d = 0; same && d < in[0].dim(); ++d) same = static_cast<bool>(in[0].size(d) == in[1].size(d));
  if (!same)
    throw ShapeError(fmt::format("{}: the gradient and x must have one dtype and the same sizes", describe_call(op, in)));
}

SymIntVec pair_sizes(const Tensor& x) { return {SymInt(2), x.size(1)}; }

/// N, C and S (the product of the trailing dims) of a contiguous [N, C, *] tensor.
struct NCS {
  int64_t N, C, S;
};
NCS ncs(const Tensor& x) {
  IntVec sz = x.int_sizes();
  NCS r{sz[0], sz[1], 1};
  for (size_t k = 2; k < sz.size(); ++k) r.S *= sz[k];
  return r;
}
template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;  // x's precision (f16/bf16: float)

// ---- batch_norm_stats --------------------------------------------------------------------------------
std::vector<TensorMeta> meta_stats(Ins in, const Attrs&) {
  need_nc(OpKind::batch_norm_stats, in, 0, "x");
  return one(pair_sizes(in[0]), DType::F64);
}
Result k_stats(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = contiguous(in[0]);
  const NCS d = ncs(x);
  double* po = out.data_ptr<double>();
  const double n = static_cast<double>(d.N * d.S);
  dispatch_float(x.dtype(), "batch_norm_stats", [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    parallel_for(d.C, d.N * d.S, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        double s = 0;
        for (int64_t i = 0; i < d.N; ++i) {
          const T* __restrict p = px + (i * d.C + c) * d.S;
#pragma omp simd reduction(+ : s)
          for (int64_t k = 0; k < d.S; ++k) s += static_cast<double>(static_cast<Acc<T>>(p[k]));
        }
        const double mean = n > 0 ? s / n : std::nan("");
        double q = 0;
        for (int64_t i = 0; i < d.N; ++i) {
          const T* __restrict p = px + (i * d.C + c) * d.S;
#pragma omp simd reduction(+ : q)
          for (int64_t k = 0; k < d.S; ++k) {
            const double v = static_cast<double>(static_cast<Acc<T>>(p[k])) - mean;
            q += v * v;
          }
        }
        po[c] = mean;
        po[d.C + c] = n > 0 ? q / n : std::nan("");
      }
    });
  });
  return {out};
}

/// Per-channel mean and rstd rounded to x's precision.
template <typename A>
void mean_rstd(const Tensor& stats, int64_t C, double eps, std::vector<A>& mean, std::vector<A>& rstd) {
  Tensor s = contiguous(stats);
  const double* ps = s.data_ptr<double>();
  mean.resize(static_cast<size_t>(C));
  rstd.resize(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    mean[static_cast<size_t>(c)] = static_cast<A>(ps[c]);
    rstd[static_cast<size_t>(c)] = static_cast<A>(1.0 / std::sqrt(ps[C + c] + eps));
  }
}
/// A defined per-channel tensor's values in A (1 where undefined for weights, 0 for biases).
template <typename T, typename A>
std::vector<A> channel_values(const Tensor& t, int64_t C, A dflt) {
  std::vector<A> v(static_cast<size_t>(C), dflt);
  if (!t.defined()) return v;
  Tensor c = contiguous(t);
  const T* p = c.data_ptr<T>();
  for (int64_t i = 0; i < C; ++i) v[static_cast<size_t>(i)] = static_cast<A>(p[i]);
  return v;
}

// ---- batch_norm_train_apply ---------------------------------------------------------------------------
std::vector<TensorMeta> meta_apply(Ins in, const Attrs&) {
  constexpr OpKind op = OpKind::batch_norm_train_apply;
  need_nc(op, in, 0, "x");
  need_pair(op, in, 1, in[0].size(1), "stats");
  need_channel(op, in, 2, in[0].size(1), "weight");
  need_channel(op, in, 3, in[0].size(1), "bias");
  return one(in[0].sizes(), in[0].dtype());
}
Result k_apply(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = contiguous(in[0]);
  const NCS d = ncs(x);
  dispatch_float(x.dtype(), "batch_norm_train_apply", [&]<typename T>() {
    using A = Acc<T>;
    std::vector<A> mean, rstd;
    mean_rstd(in[1], d.C, a.f("eps"), mean, rstd);
    const std::vector<A> w = channel_values<T>(in[2], d.C, A(1)), b = channel_values<T>(in[3], d.C, A(0));
    const bool affine_w = in[2].defined(), affine_b = in[3].defined();
    const T* px = x.data_ptr<T>();
    T* py = out.data_ptr<T>();
    parallel_for(d.N * d.C, d.S, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const size_t c = static_cast<size_t>(t % d.C);
        const A mu = mean[c], r = rstd[c], wc = w[c], bc = b[c];
        const T* __restrict src = px + t * d.S;
        T* __restrict dst = py + t * d.S;
        if (affine_w && affine_b) {
#pragma omp simd
          for (int64_t k = 0; k < d.S; ++k) dst[k] = static_cast<T>((static_cast<A>(src[k]) - mu) * r * wc + bc);
        } else {
#pragma omp simd
          for (int64_t k = 0; k < d.S; ++k) {
            A v = (static_cast<A>(src[k]) - mu) * r;
            if (affine_w) v = v * wc;
            if (affine_b) v = v + bc;
            dst[k] = static_cast<T>(v);
          }
        }
      }
    });
  });
  return {out};
}

// ---- batch_norm_train_grad_sums ----------------------------------------------------------------------------
std::vector<TensorMeta> meta_grad_sums(Ins in, const Attrs&) {
  constexpr OpKind op = OpKind::batch_norm_train_grad_sums;
  need_nc(op, in, 0, "the gradient");
  need_nc(op, in, 1, "x");
  need_same(op, in);
  need_pair(op, in, 2, in[1].size(1), "stats");
  return one(pair_sizes(in[1]), DType::F64);
}
Result k_grad_sums(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor g = contiguous(in[0]), x = contiguous(in[1]);
  const NCS d = ncs(x);
  double* po = out.data_ptr<double>();
  dispatch_float(x.dtype(), "batch_norm_train_grad_sums", [&]<typename T>() {
    using A = Acc<T>;
    std::vector<A> mean, rstd;
    mean_rstd(in[2], d.C, a.f("eps"), mean, rstd);
    const T* px = x.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    parallel_for(d.C, 2 * d.N * d.S, [&](int64_t lo, int64_t hi) {
      for (int64_t c = lo; c < hi; ++c) {
        const A mu = mean[static_cast<size_t>(c)];
        double sg = 0, sgx = 0;
        for (int64_t i = 0; i < d.N; ++i) {
          const T* __restrict xp = px + (i * d.C + c) * d.S;
          const T* __restrict gp = pg + (i * d.C + c) * d.S;
#pragma omp simd reduction(+ : sg, sgx)
          for (int64_t k = 0; k < d.S; ++k) {
            const double gv = static_cast<double>(static_cast<A>(gp[k]));
            sg += gv;
            sgx += gv * static_cast<double>(static_cast<A>(xp[k]) - mu);
          }
        }
        po[c] = sg;
        po[d.C + c] = sgx * static_cast<double>(rstd[static_cast<size_t>(c)]);
      }
    });
  });
  return {out};
}

// ---- batch_norm_train_backward ------------------------------------------------------------------------------
std::vector<TensorMeta> meta_backward(Ins in, const Attrs&) {
  constexpr OpKind op = OpKind::batch_norm_train_backward;
  need_nc(op, in, 0, "the gradient");
  need_nc(op, in, 1, "x");
  need_same(op, in);
  need_pair(op, in, 2, in[1].size(1), "stats");
  need_pair(op, in, 3, in[1].size(1), "sums");
  need_channel(op, in, 4, in[1].size(1), "weight");
  return one(in[1].sizes(), in[1].dtype());
}
Result k_backward(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor g = contiguous(in[0]), x = contiguous(in[1]);
  const NCS d = ncs(x);
  Tensor sums = contiguous(in[3]);
  const double* ps = sums.data_ptr<double>();
  const double n = static_cast<double>(d.N * d.S);
  dispatch_float(x.dtype(), "batch_norm_train_backward", [&]<typename T>() {
    using A = Acc<T>;
    std::vector<A> mean, rstd;
    mean_rstd(in[2], d.C, a.f("eps"), mean, rstd);
    const std::vector<A> w = channel_values<T>(in[4], d.C, A(1));
    // dx = k·g + q·(x − mean) + o per channel: k = w·rstd, q = −k·rstd·Σ(g x̂)/n, o = −k·Σg/n
    std::vector<A> kk(static_cast<size_t>(d.C)), qq(kk.size()), oo(kk.size());
    for (int64_t c = 0; c < d.C; ++c) {
      const size_t i = static_cast<size_t>(c);
      const double k = static_cast<double>(w[i]) * static_cast<double>(rstd[i]);
      kk[i] = static_cast<A>(k);
      qq[i] = static_cast<A>(-k * static_cast<double>(rstd[i]) * ps[d.C + c] / n);
      oo[i] = static_cast<A>(-k * ps[c] / n);
    }
    const T* px = x.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    T* py = out.data_ptr<T>();
    parallel_for(d.N * d.C, 2 * d.S, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const size_t c = static_cast<size_t>(t % d.C);
        const A mu = mean[c], k = kk[c], q = qq[c], o = oo[c];
        const T* __restrict xp = px + t * d.S;
        const T* __restrict gp = pg + t * d.S;
        T* __restrict dst = py + t * d.S;
#pragma omp simd
        for (int64_t j = 0; j < d.S; ++j)
          dst[j] = static_cast<T>(k * static_cast<A>(gp[j]) + q * (static_cast<A>(xp[j]) - mu) + o);
      }
    });
  });
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(batch_norm_stats, meta_stats, k_stats);
PROTEAN_REGISTER_OP(batch_norm_train_apply, meta_apply, k_apply);
PROTEAN_REGISTER_OP(batch_norm_train_grad_sums, meta_grad_sums, k_grad_sums);
PROTEAN_REGISTER_OP(batch_norm_train_backward, meta_backward, k_backward);

}  // namespace protean::ops
