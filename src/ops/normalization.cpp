// Normalization ops: softmax, log_softmax, layer_norm, rms_norm, batch_norm (inference), group_norm.
//
// All need a floating input and return its dtype; weight/bias/running stats convert to it. f16/bf16
// compute in float.
//
// softmax / log_softmax: the dim is viewed as (O, R, I). For the last dim (I == 1) each row takes
// three passes over L1-resident data: max (vectorized), exp(x - max) stored and summed, then a scale
// (softmax) or (x - max) - log(sum) (log_softmax). f32 uses exp_f32 below, a vectorizable exp
// (Cody-Waite range reduction + degree-6 polynomial; max error about 2 ulp; exp(-inf) = 0, NaN stays
// NaN); f64 and other dims use std::exp.
// layer_norm / rms_norm / group_norm: statistics in ONE pass over the row as sum and sum of squares
// accumulated in double (vectorized), var = E[x²] - E[x]² clamped at 0. With double accumulators the
// cancellation error is ~1e-16·mean²/var relative, far below f32 resolution unless |mean|/std > 1e4,
// and the pass count stays one (the alternative, Welford, is a serial dependence that does not
// vectorize). A second pass writes (x - mean)·rstd·w + b in OpMath.
// rms_norm: eps defaults to the dtype's machine epsilon (torch's default), y = x·rsqrt(mean(x²)+eps)·w.
// batch_norm: per-channel scale = w / sqrt(var + eps), shift = b - mean·scale (double), y = x·scale + shift.
// Float comparisons may raise FP exceptions under the default -ftrapping-math, which stops GCC from
// if-converting the selects in exp_f32 and the max lanes, so those loops would not vectorize. Protean
// never inspects FP exception flags; results are unchanged (no reassociation is enabled).
#pragma GCC optimize("no-trapping-math")

#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <limits>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {
namespace {
using namespace kernel;
using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

/// exp for f32 that GCC vectorizes in `omp simd` loops: exp(x) = 2^n · e^r with n = rint(x·log2 e),
/// r = x - n·ln 2 (two-constant Cody-Waite), e^r from a degree-6 minimax polynomial (Cephes' expf
/// coefficients). Results underflow to 0 below -87.3 and overflow to inf above 88.7.
inline float exp_f32(float x) {
  const float hi = 88.7228f, lo = -87.3365f;
  float xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  // round to nearest by adding and subtracting 1.5·2^23 (std::floor/nearbyint are library calls
  // without SSE4.1, which would stop the loop from vectorizing)
  const float shifter = 12582912.0f;
  float n = (xc * 1.44269504088896341f + shifter) - shifter;
  float r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float s = std::bit_cast<float>(e);
  float res = y * s;
  res = x > hi ? std::numeric_limits<float>::infinity() : res;
  res = x < lo ? 0.0f : res;
  return x != x ? x : res;
}

void need_float(OpKind op, Ins in) {
  if (!in[0].defined()) throw ValueError(fmt::format("{}: input 0 is undefined; a tensor is required", describe_call(op, in)));
  if (!is_floating(in[0].dtype()))
    throw TypeError(fmt::format("{}: dtype {} is not supported (expected a floating dtype: f16, bf16, f32, f64)",
                                describe_call(op, in), short_name(in[0].dtype())));
}

/// Optional per-feature tensor (weight, bias, running stats): contiguous, converted to `t`, or undefined.
Tensor param(const Tensor& p, DType t) {
  if (!p.defined()) return p;
  return kernel::contiguous(to_dtype(p, t));
}

// ---- softmax / log_softmax -------------------------------------------------------------------------
template <OpKind K>
std::vector<TensorMeta> meta_softmax(Ins in, const Attrs& a) {
  need_float(K, in);
  wrap_dim(a.i("dim"), in[0].dim(), op_name(K));
  return one(in[0].sizes(), in[0].dtype());
}

// The row loops keep 16 explicit accumulator lanes: GCC 12 does not vectorize these `omp simd
// reduction` loops at -O2, but it does vectorize a fixed-width inner loop over a lane array.
constexpr int kLanes = 16;

template <bool Log>
void softmax_row_f32(const float* __restrict x, float* __restrict y, int64_t n) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      float v = x[i + j];
      lane[j] = (v > lane[j] || v != v) ? v : lane[j];  // NaN sticks
    }
  }
  float mx = kNegInf;
  for (; i < n; ++i) mx = (x[i] > mx || x[i] != x[i]) ? x[i] : mx;
  for (int j = 0; j < kLanes; ++j) mx = (lane[j] > mx || lane[j] != lane[j]) ? lane[j] : mx;
  if (mx == kNegInf) mx = 0;  // an all -inf row: exp(-inf - 0) = 0, and 0/0 gives NaN like torch
  for (int j = 0; j < kLanes; ++j) lane[j] = 0;
  i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      float e = exp_f32(x[i + j] - mx);
      if constexpr (!Log) y[i + j] = e;
      lane[j] += e;
    }
  }
  float sum = 0;
  for (; i < n; ++i) {
    float e = exp_f32(x[i] - mx);
    if constexpr (!Log) y[i] = e;
    sum += e;
  }
  for (int j = 0; j < kLanes; ++j) sum += lane[j];
  if constexpr (Log) {
    // (x - max) - log(sum), not x - (max + log(sum)): for large |max| the sum max + log(sum) rounds
    // away log(sum)'s low bits, while x - max is exact near the max.
    const float ls = std::log(sum);
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] = (x[k] - mx) - ls;
  } else {
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t k = 0; k < n; ++k) y[k] *= inv;
  }
}

template <bool Log, typename T>
void softmax_generic(const T* x, T* y, int64_t O, int64_t R, int64_t I) {
  using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
  parallel_for(O * I, 3 * R, [&](int64_t b, int64_t e) {
    std::vector<C> buf(static_cast<size_t>(R));
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / I, i = t % I;
      const T* p = x + o * R * I + i;
      T* q = y + o * R * I + i;
      C mx = -std::numeric_limits<C>::infinity();
      bool nan = false;
      for (int64_t r = 0; r < R; ++r) {
        C v = static_cast<C>(p[r * I]);
        buf[static_cast<size_t>(r)] = v;
        if (v != v) nan = true;
        mx = v > mx ? v : mx;
      }
      if (nan) mx = std::numeric_limits<C>::quiet_NaN();
      if (mx == -std::numeric_limits<C>::infinity()) mx = 0;
      double sum = 0;
      for (int64_t r = 0; r < R; ++r) sum += std::exp(static_cast<double>(buf[static_cast<size_t>(r)] - mx));
      if constexpr (Log) {
        C ls = static_cast<C>(std::log(sum));
        for (int64_t r = 0; r < R; ++r) q[r * I] = static_cast<T>((buf[static_cast<size_t>(r)] - mx) - ls);
      } else {
        C inv = static_cast<C>(1.0 / sum);
        for (int64_t r = 0; r < R; ++r) q[r * I] = static_cast<T>(std::exp(buf[static_cast<size_t>(r)] - mx) * inv);
      }
    }
  });
}

template <OpKind K>
Result k_softmax(Ins in, const Attrs& a, Outs m) {
  constexpr bool Log = K == OpKind::log_softmax;
  Tensor out = empty_like_meta(m[0]);
  Tensor x = kernel::contiguous(in[0]);
  IntVec sz = x.int_sizes();
  int64_t d = x.dim() == 0 ? 0 : wrap_dim(a.i("dim"), x.dim(), op_name(K));
  int64_t O = 1, R = 1, I = 1;
  for (int64_t k = 0; k < x.dim(); ++k) (k < d ? O : k == d ? R : I) *= sz[static_cast<size_t>(k)];
  if (O * R * I == 0) return {out};
  dispatch_float(x.dtype(), op_name(K), [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* py = out.data_ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (I == 1) {
        parallel_for(O, 3 * R, [&](int64_t b, int64_t e) {
          for (int64_t o = b; o < e; ++o) softmax_row_f32<Log>(px + o * R, py + o * R, R);
        });
        return;
      }
    }
    softmax_generic<Log>(px, py, O, R, I);
  });
  return {out};
}

// ---- row statistics ------------------------------------------------------------------------------------
struct Moments {
  double sum = 0, sumsq = 0;
};
template <typename T>
Moments moments(const T* __restrict x, int64_t n) {
  double ls[kLanes] = {}, lq[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      double v = static_cast<double>(static_cast<OpMath<T>>(x[i + j]));
      ls[j] += v;
      lq[j] += v * v;
    }
  }
  Moments m;
  for (; i < n; ++i) {
    double v = static_cast<double>(static_cast<OpMath<T>>(x[i]));
    m.sum += v;
    m.sumsq += v * v;
  }
  for (int j = 0; j < kLanes; ++j) {
    m.sum += ls[j];
    m.sumsq += lq[j];
  }
  return m;
}

/// y[i] = fma((x[i] - mean) * rstd, w[i], b[i]) for f32 / f64: the affine step rounded once, as the
/// cpu backend's generated code computes it (decompose.cpp norm_affine), so both give the same value
/// also where (x - mean) * rstd * w alone would overflow. The "fma" clone (chosen once at load by the
/// dynamic linker) uses the instruction; the default one calls libm's exact fma.
template <typename C>
[[gnu::target_clones("fma", "default")]] void affine_fma(const C* __restrict x, C* __restrict y, int64_t n, C mean,
                                                        C rstd, const C* __restrict w, const C* __restrict b) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma((x[i] - mean) * rstd, w[i], b[i]);
}

/// y[i] = (x[i] - mean) * rstd * w[i] + b[i] (w/b may be null; with both, one rounding for · w + b).
template <typename T>
void normalize_row(const T* __restrict x, T* __restrict y, int64_t n, OpMath<T> mean, OpMath<T> rstd,
                   const T* __restrict w, const T* __restrict b) {
  using C = OpMath<T>;
  if (w && b) {
    if constexpr (std::is_same_v<T, C>) {
      affine_fma<C>(x, y, n, mean, rstd, w, b);
    } else {
      for (int64_t i = 0; i < n; ++i)
        y[i] = static_cast<T>(std::fma((static_cast<C>(x[i]) - mean) * rstd, static_cast<C>(w[i]), static_cast<C>(b[i])));
    }
  } else if (w) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<C>(x[i]) - mean) * rstd * static_cast<C>(w[i]));
  } else if (b) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<C>(x[i]) - mean) * rstd + static_cast<C>(b[i]));
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>((static_cast<C>(x[i]) - mean) * rstd);
  }
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// ---- layer_norm / rms_norm ------------------------------------------------------------------------------
/// Checks x's trailing dims equal normalized_shape and weight/bias (if given) have that shape.
void check_normalized(OpKind op, Ins in, const SymIntVec& ns, size_t nparams) {
  const SymIntVec& xs = in[0].sizes();
  auto fail = [&](const std::string& why) {
    throw ShapeError(fmt::format("{} with normalized_shape={}: {}", describe_call(op, in), to_string(ns), why));
  };
  if (ns.empty()) fail("normalized_shape must not be empty");
  if (ns.size() > xs.size()) fail("the input has fewer dims than normalized_shape");
  for (size_t i = 0; i < ns.size(); ++i)
    if (!static_cast<bool>(xs[xs.size() - ns.size() + i] == ns[i]))
      fail("the input's trailing dims must equal normalized_shape");
  for (size_t p = 1; p <= nparams; ++p) {
    if (!in[p].defined()) continue;
    const SymIntVec& ps = in[p].sizes();
    bool ok = ps.size() == ns.size();
    for (size_t i = 0; ok && i < ns.size(); ++i) ok = static_cast<bool>(ps[i] == ns[i]);
    if (!ok) fail(fmt::format("{} must have shape normalized_shape", p == 1 ? "weight" : "bias"));
    if (!is_floating(in[p].dtype())) fail(fmt::format("input {} must be floating", p));
  }
}

std::vector<TensorMeta> meta_layer_norm(Ins in, const Attrs& a) {
  need_float(OpKind::layer_norm, in);
  check_normalized(OpKind::layer_norm, in, a.sym_ints("normalized_shape"), 2);
  return one(in[0].sizes(), in[0].dtype());
}
std::vector<TensorMeta> meta_rms_norm(Ins in, const Attrs& a) {
  need_float(OpKind::rms_norm, in);
  check_normalized(OpKind::rms_norm, in, a.sym_ints("normalized_shape"), 1);
  return one(in[0].sizes(), in[0].dtype());
}

template <bool Rms>
Result k_row_norm(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = kernel::contiguous(in[0]);
  int64_t N = 1;
  for (int64_t s : a.ints("normalized_shape")) N *= s;
  const int64_t rows = N == 0 ? 0 : x.int_numel() / N;
  Tensor w = param(in[1], x.dtype());
  Tensor b = Rms ? Tensor() : param(in[2], x.dtype());
  dispatch_float(x.dtype(), Rms ? "rms_norm" : "layer_norm", [&]<typename T>() {
    using C = OpMath<T>;
    double eps;
    if constexpr (Rms) eps = a.has("eps") ? a.f("eps") : static_cast<double>(std::numeric_limits<C>::epsilon());
    else eps = a.f("eps");
    if constexpr (Rms) {
      if constexpr (std::is_same_v<T, Half>) { if (!a.has("eps")) eps = 0.0009765625; }
      if constexpr (std::is_same_v<T, BFloat16>) { if (!a.has("eps")) eps = 0.0078125; }
    }
    const T* px = x.data_ptr<T>();
    T* py = out.data_ptr<T>();
    const T* pw = ptr_or_null<T>(w);
    const T* pb = ptr_or_null<T>(b);
    parallel_for(rows, 2 * N, [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        Moments mo = moments(px + r * N, N);
        double mean = Rms ? 0.0 : mo.sum / static_cast<double>(N);
        double var = mo.sumsq / static_cast<double>(N) - mean * mean;
        if (var < 0) var = 0;
        double rstd = 1.0 / std::sqrt(var + eps);
        normalize_row<T>(px + r * N, py + r * N, N, static_cast<C>(mean), static_cast<C>(rstd), pw, pb);
      }
    });
  });
  return {out};
}

// ---- batch_norm / group_norm ----------------------------------------------------------------------------
/// Checks x is [N, C, *] and each defined per-channel input is [C].
void check_channels(OpKind op, Ins in, const SymInt& C, size_t first, size_t last, const char* what) {
  for (size_t p = first; p <= last && p < in.size(); ++p) {
    if (!in[p].defined()) continue;
    if (in[p].dim() != 1 || !static_cast<bool>(in[p].size(0) == C))
      throw ShapeError(fmt::format("{}: input {} must be 1-D of size C = {} ({}), got {}", describe_call(op, in), p,
                                   C.str(), what, to_string(in[p].sizes())));
    if (!is_floating(in[p].dtype()))
      throw TypeError(fmt::format("{}: input {} must be floating", describe_call(op, in), p));
  }
}

std::vector<TensorMeta> meta_batch_norm(Ins in, const Attrs& a) {
  need_float(OpKind::batch_norm, in);
  if (in[0].dim() < 2)
    throw ShapeError(fmt::format("{}: input must be [N, C, *] (at least 2-D)", describe_call(OpKind::batch_norm, in)));
  if (!in[3].defined() || !in[4].defined())
    throw ValueError(fmt::format("{}: running_mean and running_var are required (inference batch norm)",
                                 describe_call(OpKind::batch_norm, in)));
  check_channels(OpKind::batch_norm, in, in[0].size(1), 1, 4, "weight, bias, running_mean, running_var");
  return one(in[0].sizes(), in[0].dtype());
}

Result k_batch_norm(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = kernel::contiguous(in[0]);
  IntVec sz = x.int_sizes();
  const int64_t N = sz[0], C = sz[1];
  int64_t S = 1;
  for (size_t k = 2; k < sz.size(); ++k) S *= sz[k];
  const double eps = a.f("eps");
  Tensor w = param(in[1], DType::F64), b = param(in[2], DType::F64);
  Tensor rm = param(in[3], DType::F64), rv = param(in[4], DType::F64);
  std::vector<double> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    double sc = 1.0 / std::sqrt(rv.data_ptr<double>()[c] + eps);
    if (w.defined()) sc *= w.data_ptr<double>()[c];
    double sh = -rm.data_ptr<double>()[c] * sc;
    if (b.defined()) sh += b.data_ptr<double>()[c];
    scale[static_cast<size_t>(c)] = sc;
    shift[static_cast<size_t>(c)] = sh;
  }
  dispatch_float(x.dtype(), "batch_norm", [&]<typename T>() {
    using Cm = OpMath<T>;
    const T* px = x.data_ptr<T>();
    T* py = out.data_ptr<T>();
    parallel_for(N * C, S, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const Cm sc = static_cast<Cm>(scale[static_cast<size_t>(t % C)]);
        const Cm sh = static_cast<Cm>(shift[static_cast<size_t>(t % C)]);
        const T* __restrict src = px + t * S;
        T* __restrict dst = py + t * S;
#pragma omp simd
        for (int64_t i = 0; i < S; ++i) dst[i] = static_cast<T>(static_cast<Cm>(src[i]) * sc + sh);
      }
    });
  });
  return {out};
}

std::vector<TensorMeta> meta_group_norm(Ins in, const Attrs& a) {
  need_float(OpKind::group_norm, in);
  if (in[0].dim() < 2)
    throw ShapeError(fmt::format("{}: input must be [N, C, *] (at least 2-D)", describe_call(OpKind::group_norm, in)));
  int64_t g = a.i("groups");
  SymInt C = in[0].size(1);
  if (g <= 0 || !static_cast<bool>(C % g == 0))
    throw ValueError(fmt::format("{}: groups={} must be positive and divide the channel count {}",
                                 describe_call(OpKind::group_norm, in), g, C.str()));
  check_channels(OpKind::group_norm, in, C, 1, 2, "weight, bias");
  return one(in[0].sizes(), in[0].dtype());
}

Result k_group_norm(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = kernel::contiguous(in[0]);
  IntVec sz = x.int_sizes();
  const int64_t N = sz[0], C = sz[1], G = a.i("groups");
  int64_t S = 1;
  for (size_t k = 2; k < sz.size(); ++k) S *= sz[k];
  const int64_t Cg = C / G, len = Cg * S;
  const double eps = a.f("eps");
  Tensor w = param(in[1], x.dtype()), b = param(in[2], x.dtype());
  dispatch_float(x.dtype(), "group_norm", [&]<typename T>() {
    using Cm = OpMath<T>;
    const T* px = x.data_ptr<T>();
    T* py = out.data_ptr<T>();
    const T* pw = ptr_or_null<T>(w);
    const T* pb = ptr_or_null<T>(b);
    parallel_for(N * G, 2 * len, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        Moments mo = moments(px + t * len, len);
        double mean = len ? mo.sum / static_cast<double>(len) : 0.0;
        double var = len ? mo.sumsq / static_cast<double>(len) - mean * mean : 0.0;
        if (var < 0) var = 0;
        const Cm mu = static_cast<Cm>(mean), rstd = static_cast<Cm>(1.0 / std::sqrt(var + eps));
        const int64_t g = t % G;
        for (int64_t c = 0; c < Cg; ++c) {
          const int64_t ch = g * Cg + c;
          // (x - mean)·scale + b, not x·scale + shift: the latter cancels badly when var << mean²
          const Cm sc = rstd * (pw ? static_cast<Cm>(pw[ch]) : Cm(1));
          const Cm sh = pb ? static_cast<Cm>(pb[ch]) : Cm(0);
          const T* __restrict src = px + t * len + c * S;
          T* __restrict dst = py + t * len + c * S;
#pragma omp simd
          for (int64_t i = 0; i < S; ++i) dst[i] = static_cast<T>((static_cast<Cm>(src[i]) - mu) * sc + sh);
        }
      }
    });
  });
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(softmax, meta_softmax<OpKind::softmax>, k_softmax<OpKind::softmax>);
PROTEAN_REGISTER_OP(log_softmax, meta_softmax<OpKind::log_softmax>, k_softmax<OpKind::log_softmax>);
PROTEAN_REGISTER_OP(layer_norm, meta_layer_norm, k_row_norm<false>);
PROTEAN_REGISTER_OP(rms_norm, meta_rms_norm, k_row_norm<true>);
PROTEAN_REGISTER_OP(batch_norm, meta_batch_norm, k_batch_norm);
PROTEAN_REGISTER_OP(group_norm, meta_group_norm, k_group_norm);

}  // namespace protean::ops
