// Reductions: sum, prod, mean, amax, amin, var over a dim list (empty = all dims), and argmax.
//
// Dtypes (torch's): sum/prod of bool or integer inputs give i64 (sum takes an optional `dtype`, to
// which the input converts first); mean and var need a floating input; amax/amin keep the dtype;
// argmax gives i64.
// Accumulation: floating sums/products/variances accumulate in double (then round once to the output
// dtype); integer sums/products accumulate in 64 bits with two's complement wrap-around. var is two
// passes (mean, then the sum of squared deviations) divided by max(0, N - correction).
// NaN: amax/amin propagate NaN; argmax returns the index of the first NaN when there is one (NaN is
// the maximum, as in torch). Reducing a size-0 dim: sum 0, prod 1, mean/var NaN, amax/amin/argmax
// are ValueErrors (no identity).
//
// Kernel layout: the input is viewed as (O, R, I) — outer kept dims, the reduced block, inner kept
// dims. When the reduced dims are one contiguous block of a contiguous input this is free; otherwise
// the input is permuted (kept dims first) into a contiguous copy, giving (O, R, 1). I == 1 reduces
// contiguous rows with 16 independent lanes (vectorized); I > 1 accumulates whole rows of I elements
// into an accumulator row (vectorized across I). Large outputs split O across threads; a full
// reduction (O == 1, I == 1) splits R across threads and combines the partial results.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <memory>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {
namespace {
using namespace kernel;
using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

// ---- metadata --------------------------------------------------------------------------------------
IntVec reduce_dims(OpKind op, Ins in, const Attrs& a) {
  if (!in[0].defined()) throw ValueError(fmt::format("{}(None): input 0 is undefined", op_name(op)));
  return wrap_dims(a.ints("dims"), in[0].dim(), op_name(op));
}
void check_nonempty(OpKind op, Ins in, const IntVec& dims) {
  const SymIntVec& s = in[0].sizes();
  if (in[0].dim() == 0) return;
  for (int64_t d : dims)
    if (static_cast<bool>(s[static_cast<size_t>(d)] == 0))
      throw ValueError(fmt::format("{}: cannot reduce over dim {} of size 0 (the op has no identity); "
                                   "reduce over non-empty dims",
                                   describe_call(op, in), d));
}

template <OpKind K>
std::vector<TensorMeta> meta_reduce(Ins in, const Attrs& a) {
  IntVec dims = reduce_dims(K, in, a);
  DType t = in[0].dtype();
  DType out = t;
  if constexpr (K == OpKind::sum || K == OpKind::prod) {
    if (is_integral(t, true)) out = DType::I64;
    if constexpr (K == OpKind::sum)
      if (auto d = a.opt_dtype("dtype")) out = *d;
  } else if constexpr (K == OpKind::mean || K == OpKind::var) {
    if (!is_floating(t))
      throw TypeError(fmt::format("{}: dtype {} is not supported (expected a floating dtype: f16, bf16, f32, f64; "
                                  "cast the input first)",
                                  describe_call(K, in), short_name(t)));
  } else {
    check_nonempty(K, in, dims);
  }
  return one(reduced_shape(in[0].sizes(), dims, a.b("keepdim")), out);
}

std::vector<TensorMeta> meta_argmax(Ins in, const Attrs& a) {
  if (!in[0].defined()) throw ValueError("argmax(None): input 0 is undefined");
  bool keepdim = a.b("keepdim");
  if (in[0].dtype() == DType::Bool)
    throw TypeError(fmt::format("{}: dtype b8 is not supported (expected a numeric dtype)", describe_call(OpKind::argmax, in)));
  if (auto d = a.opt_i("dim")) {
    int64_t w = wrap_dim(*d, in[0].dim(), "argmax");
    IntVec dims = in[0].dim() == 0 ? IntVec{} : IntVec{w};
    check_nonempty(OpKind::argmax, in, dims);
    return one(reduced_shape(in[0].sizes(), dims, keepdim), DType::I64);
  }
  if (static_cast<bool>(in[0].numel() == 0))
    throw ValueError(fmt::format("{}: cannot take argmax of an empty tensor", describe_call(OpKind::argmax, in)));
  SymIntVec shape;
  if (keepdim) shape.assign(in[0].sizes().size(), SymInt(1));
  return one(std::move(shape), DType::I64);
}

// ---- (O, R, I) layout ------------------------------------------------------------------------------
struct ORI {
  Tensor x;  // contiguous
  int64_t O = 1, R = 1, I = 1;
};

ORI to_ori(const Tensor& x, const IntVec& dims) {
  IntVec sz = x.int_sizes(), st = x.int_strides();
  const size_t r = sz.size();
  std::vector<bool> red(r, false);
  for (int64_t d : dims) red[static_cast<size_t>(d)] = true;
  // is the (non-size-1) reduced set one block?
  int first = -1, last = -1;
  bool block = true;
  for (size_t d = 0; d < r; ++d) {
    if (sz[d] == 1 || !red[d]) continue;
    if (first < 0) first = static_cast<int>(d);
    else
      for (size_t k = static_cast<size_t>(last) + 1; k < d; ++k)
        if (sz[k] != 1) block = false;
    last = static_cast<int>(d);
  }
  ORI o;
  if (block && x.is_contiguous()) {
    o.x = x;
    for (size_t d = 0; d < r; ++d) {
      if (first >= 0 && static_cast<int>(d) >= first && static_cast<int>(d) <= last) o.R *= sz[d];
      else if (first >= 0 && static_cast<int>(d) > last) o.I *= sz[d];
      else o.O *= sz[d];
    }
    if (first < 0) {  // nothing (non-trivial) reduced
      o.O = x.int_numel();
      o.I = 1;
    }
    return o;
  }
  // permute kept dims first, reduced dims last, and copy to a contiguous buffer
  TensorMeta m = x.meta();
  m.sizes.clear();
  m.strides.clear();
  for (int pass = 0; pass < 2; ++pass)
    for (size_t d = 0; d < r; ++d)
      if (red[d] == (pass == 1)) {
        m.sizes.push_back(sz[d]);
        m.strides.push_back(st[d]);
        (pass == 1 ? o.R : o.O) *= sz[d];
      }
  o.x = kernel::contiguous(make_view(x, m));
  return o;
}

// ---- reduction functors: Acc init(); Acc step(Acc, T); Acc combine(Acc, Acc) ---------------------------
template <typename T>
using SumAcc = std::conditional_t<is_float_v<T>, double, uint64_t>;

template <typename T>
struct SumOp {
  using Acc = SumAcc<T>;
  Acc init() const { return 0; }
  Acc step(Acc a, T x) const {
    if constexpr (is_float_v<T>) return a + static_cast<double>(static_cast<OpMath<T>>(x));
    else return a + static_cast<uint64_t>(static_cast<int64_t>(x));
  }
  Acc combine(Acc a, Acc b) const { return a + b; }
};
template <typename T>
struct ProdOp {
  using Acc = SumAcc<T>;
  Acc init() const { return 1; }
  Acc step(Acc a, T x) const {
    if constexpr (is_float_v<T>) return a * static_cast<double>(static_cast<OpMath<T>>(x));
    else return a * static_cast<uint64_t>(static_cast<int64_t>(x));
  }
  Acc combine(Acc a, Acc b) const { return a * b; }
};
template <typename T, bool Max>
struct ExtremumOp {
  using Acc = OpMath<T>;
  Acc init() const {
    if constexpr (std::is_same_v<T, bool>) return !Max;
    else if constexpr (std::is_floating_point_v<Acc>) return Max ? -std::numeric_limits<Acc>::infinity()
                                                                 : std::numeric_limits<Acc>::infinity();
    else return Max ? std::numeric_limits<Acc>::lowest() : std::numeric_limits<Acc>::max();
  }
  Acc step(Acc a, T xv) const {
    Acc x = static_cast<Acc>(xv);
    if constexpr (std::is_floating_point_v<Acc>) {
      if constexpr (Max) return (x > a || x != x) ? x : a;  // NaN sticks
      else return (x < a || x != x) ? x : a;
    } else {
      if constexpr (Max) return x > a ? x : a;
      else return x < a ? x : a;
    }
  }
  Acc combine(Acc a, Acc b) const { return step(a, static_cast<T>(b)); }
};

constexpr int kLanes = 16;

template <typename T, typename Op>
typename Op::Acc reduce_row(const T* __restrict x, int64_t n, const Op& op) {
  using Acc = typename Op::Acc;
  Acc lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = op.init();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) lanes[j] = op.step(lanes[j], x[i + j]);
  }
  Acc acc = op.init();
  for (; i < n; ++i) acc = op.step(acc, x[i]);
  for (int j = 0; j < kLanes; ++j) acc = op.combine(acc, lanes[j]);
  return acc;
}

/// Reduces the contiguous (O, R, I) buffer `x` into acc[O * I].
template <typename T, typename Op>
void reduce_ori(const T* x, int64_t O, int64_t R, int64_t I, typename Op::Acc* acc, const Op& op) {
  using Acc = typename Op::Acc;
  if (O * I == 0) return;
  if (I == 1) {
    int nt = threads_for(O * R);
    if (O >= nt || nt == 1) {
      parallel_for(O, R, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) acc[o] = reduce_row(x + o * R, R, op);
      });
      return;
    }
    // few long rows: split each row across threads
    for (int64_t o = 0; o < O; ++o) {
      std::vector<Acc> part(static_cast<size_t>(nt), op.init());
      const T* row = x + o * R;
      int64_t chunk = (R + nt - 1) / nt;
      parallel_for(nt, chunk, [&](int64_t b, int64_t e) {
        for (int64_t t = b; t < e; ++t) {
          int64_t lo = std::min(R, t * chunk), hi = std::min(R, lo + chunk);
          part[static_cast<size_t>(t)] = reduce_row(row + lo, hi - lo, op);
        }
      });
      Acc a = op.init();
      for (const Acc& p : part) a = op.combine(a, p);
      acc[o] = a;
    }
    return;
  }
  // accumulate rows: out row (I) op= x[o, r, :] for every r
  constexpr int64_t kBlock = 1024;
  const int64_t nb = (I + kBlock - 1) / kBlock;
  parallel_for(O * nb, R * std::min(I, kBlock), [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      int64_t o = task / nb, i0 = (task % nb) * kBlock, n = std::min(kBlock, I - i0);
      Acc* __restrict a = acc + o * I + i0;
      for (int64_t i = 0; i < n; ++i) a[i] = op.init();
      for (int64_t r = 0; r < R; ++r) {
        const T* __restrict src = x + (o * R + r) * I + i0;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) a[i] = op.step(a[i], src[i]);
      }
    }
  });
}

/// Writes finalize(acc[i]) into out (contiguous) as the output dtype.
template <typename Acc, typename Fin>
void store(const Tensor& out, const Acc* acc, size_t n, Fin fin) {
  dispatch_dtype(out.dtype(), [&]<typename O>() {
    O* p = out.data_ptr<O>();
    for (size_t i = 0; i < n; ++i) {
      auto v = fin(acc[i]);
      if constexpr (std::is_same_v<O, bool>) p[i] = v != 0;
      else if constexpr (is_float_v<O>) p[i] = static_cast<O>(static_cast<OpMath<O>>(v));
      else p[i] = static_cast<O>(static_cast<int64_t>(v));
    }
  });
}

template <OpKind K>
Result k_reduce(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  IntVec dims = wrap_dims(a.ints("dims"), in[0].dim(), op_name(K));
  Tensor x = in[0];
  if constexpr (K == OpKind::sum || K == OpKind::prod) x = to_dtype(x, out.dtype());
  ORI l = to_ori(x, dims);
  const size_t nout = static_cast<size_t>(l.O * l.I);
  dispatch_dtype(l.x.dtype(), [&]<typename T>() {
    const T* px = l.x.data_ptr<T>();
    if constexpr (K == OpKind::sum || K == OpKind::mean) {
      std::vector<SumAcc<T>> acc(nout);
      reduce_ori(px, l.O, l.R, l.I, acc.data(), SumOp<T>{});
      if constexpr (K == OpKind::mean) {
        double n = static_cast<double>(l.R);
        store(out, acc.data(), nout, [n](SumAcc<T> s) { return static_cast<double>(s) / n; });
      } else {
        store(out, acc.data(), nout, [](SumAcc<T> s) { return s; });
      }
    } else if constexpr (K == OpKind::prod) {
      std::vector<SumAcc<T>> acc(nout);
      reduce_ori(px, l.O, l.R, l.I, acc.data(), ProdOp<T>{});
      store(out, acc.data(), nout, [](SumAcc<T> s) { return s; });
    } else if constexpr (K == OpKind::amax || K == OpKind::amin) {
      using Op = ExtremumOp<T, K == OpKind::amax>;
      // (not std::vector: bool accumulators need addressable elements)
      std::unique_ptr<typename Op::Acc[]> acc(new typename Op::Acc[nout]);
      reduce_ori(px, l.O, l.R, l.I, acc.get(), Op{});
      store(out, acc.get(), nout, [](typename Op::Acc s) { return s; });
    }
  });
  return {out};
}

// ---- var: two passes in double -----------------------------------------------------------------------
Result k_var(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  IntVec dims = wrap_dims(a.ints("dims"), in[0].dim(), "var");
  int64_t correction = a.i("correction");
  ORI l = to_ori(in[0], dims);
  const int64_t O = l.O, R = l.R, I = l.I;
  std::vector<double> res(static_cast<size_t>(O * I));
  const double denom = static_cast<double>(std::max<int64_t>(0, R - correction));
  dispatch_float(l.x.dtype(), "var", [&]<typename T>() {
    const T* x = l.x.data_ptr<T>();
    if (O * I == 0) return;
    if (I == 1) {
      parallel_for(O, 2 * R, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const T* __restrict row = x + o * R;
          double mean = reduce_row(row, R, SumOp<T>{}) / static_cast<double>(R);
          double ss = 0;
#pragma omp simd reduction(+ : ss)
          for (int64_t r = 0; r < R; ++r) {
            double d = static_cast<double>(static_cast<OpMath<T>>(row[r])) - mean;
            ss += d * d;
          }
          res[static_cast<size_t>(o)] = ss / denom;
        }
      });
    } else {
      parallel_for(O, 2 * R * I, [&](int64_t b, int64_t e) {
        std::vector<double> mean(static_cast<size_t>(I)), ss(static_cast<size_t>(I));
        for (int64_t o = b; o < e; ++o) {
          std::fill(mean.begin(), mean.end(), 0.0);
          std::fill(ss.begin(), ss.end(), 0.0);
          double* __restrict mp = mean.data();
          double* __restrict sp = ss.data();
          for (int64_t r = 0; r < R; ++r) {
            const T* __restrict src = x + (o * R + r) * I;
#pragma omp simd
            for (int64_t i = 0; i < I; ++i) mp[i] += static_cast<double>(static_cast<OpMath<T>>(src[i]));
          }
          for (int64_t i = 0; i < I; ++i) mp[i] /= static_cast<double>(R);
          for (int64_t r = 0; r < R; ++r) {
            const T* __restrict src = x + (o * R + r) * I;
#pragma omp simd
            for (int64_t i = 0; i < I; ++i) {
              double d = static_cast<double>(static_cast<OpMath<T>>(src[i])) - mp[i];
              sp[i] += d * d;
            }
          }
          for (int64_t i = 0; i < I; ++i) res[static_cast<size_t>(o * I + i)] = sp[i] / denom;
        }
      });
    }
  });
  if (R == 0) std::fill(res.begin(), res.end(), std::numeric_limits<double>::quiet_NaN());
  store(out, res.data(), res.size(), [](double v) { return v; });
  return {out};
}

// ---- argmax ------------------------------------------------------------------------------------------
Result k_argmax(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  ORI l;
  if (auto d = a.opt_i("dim"); d && in[0].dim() > 0) {
    l = to_ori(in[0], {wrap_dim(*d, in[0].dim(), "argmax")});
  } else {
    l.x = kernel::contiguous(in[0]);
    l.R = in[0].int_numel();
  }
  int64_t* po = out.data_ptr<int64_t>();
  const int64_t O = l.O, R = l.R, I = l.I;
  dispatch_dtype(l.x.dtype(), [&]<typename T>() {
    using C = OpMath<T>;
    const T* x = l.x.data_ptr<T>();
    parallel_for(O * I, R, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / I, i = t % I;
        const T* p = x + o * R * I + i;
        C best = static_cast<C>(p[0]);
        int64_t bi = 0;
        if constexpr (std::is_floating_point_v<C>) {
          if (best != best) {
            po[t] = 0;
            continue;
          }
        }
        for (int64_t r = 1; r < R; ++r) {
          C v = static_cast<C>(p[r * I]);
          if constexpr (std::is_floating_point_v<C>) {
            if (v != v) {
              bi = r;
              break;
            }
          }
          if (v > best) {
            best = v;
            bi = r;
          }
        }
        po[t] = bi;
      }
    });
  });
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(sum, meta_reduce<OpKind::sum>, k_reduce<OpKind::sum>);
PROTEAN_REGISTER_OP(prod, meta_reduce<OpKind::prod>, k_reduce<OpKind::prod>);
PROTEAN_REGISTER_OP(mean, meta_reduce<OpKind::mean>, k_reduce<OpKind::mean>);
PROTEAN_REGISTER_OP(amax, meta_reduce<OpKind::amax>, k_reduce<OpKind::amax>);
PROTEAN_REGISTER_OP(amin, meta_reduce<OpKind::amin>, k_reduce<OpKind::amin>);
PROTEAN_REGISTER_OP(var, meta_reduce<OpKind::var>, k_var);
PROTEAN_REGISTER_OP(argmax, meta_argmax, k_argmax);

}  // namespace protean::ops
