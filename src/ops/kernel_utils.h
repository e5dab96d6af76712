// Strided elementwise iteration for eager CPU kernels.
//
// What it does, for an output tensor `out` and inputs `in...` (any strides, storage offsets, 0-dim):
//  1. Broadcast: every input is viewed at out's shape; a missing leading dim or a size-1 dim that out
//     stretches gets stride 0 (the input element is reused).
//  2. Collapse: size-1 dims are dropped, and neighbouring dims i, i+1 merge when every operand has
//     stride[i] == stride[i+1] * size[i+1]. A contiguous (or identically permuted) set of operands
//     becomes one flat dim, so the common case is a single run.
//  3. Runs: the innermost collapsed dim is processed as runs of `n` elements. A run where every operand
//     has stride 1 takes a `#pragma omp simd` loop over restrict pointers (the compiler vectorizes it
//     at -O2); a run where some inputs have stride 0 (scalar broadcast, e.g. `x * 2`) gets its own
//     vectorizable loop for one and two inputs; anything else is a plain strided loop.
//  4. Threads: above kParallelGrain elements the flat element range is split into one chunk per thread
//     (protean::num_threads(), OpenMP); each chunk starts from its own multi-index.
//
// Usage (typed: C++ element types must match the tensors' dtypes; convert first when they differ):
//   kernel::map<float, float, float>(out, {a, b}, [](float x, float y) { return x + y; });
// The functor must be pure (it runs on several threads).
//
// Other helpers here: OpMath (f16/bf16 compute in float), float dtype dispatch, num_threads-aware
// parallel_for over ranges.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops::kernel {

/// Below this many elements a kernel runs on the calling thread (thread start-up costs more).
inline constexpr int64_t kParallelGrain = 32768;

/// True for the 16-bit storage types whose arithmetic happens in float.
template <typename T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
/// The type arithmetic on T happens in: float for f16/bf16, T otherwise.
template <typename T>
using OpMath = std::conditional_t<is_reduced_float_v<T>, float, T>;
/// True for the floating C++ element types (including Half/BFloat16).
template <typename T>
inline constexpr bool is_float_v = std::is_floating_point_v<T> || is_reduced_float_v<T>;

/// Number of threads for `work` elements: 1 below the grain, else protean::num_threads().
inline int threads_for(int64_t work, int64_t grain = kParallelGrain) {
  if (work < grain) return 1;
  int nt = protean::num_threads();
  int64_t useful = work / (grain / 4 > 0 ? grain / 4 : 1);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(nt, useful)));
}

/// Calls f(begin, end) over [0, n) split into one contiguous chunk per thread. `cost` is the work per
/// index in elements (used against kParallelGrain to decide whether to go parallel).
template <typename F>
void parallel_for(int64_t n, int64_t cost, F&& f) {
  if (n <= 0) return;
  int nt = threads_for(n * std::max<int64_t>(cost, 1));
  if (nt > n) nt = static_cast<int>(n);
  if (nt <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int64_t chunk = (n + T - 1) / T;
    int64_t b = std::min<int64_t>(n, t * chunk), e = std::min<int64_t>(n, b + chunk);
    if (b < e) f(b, e);
  }
}

/// Calls f.template operator()<T>() for the floating dtypes; TypeError (naming `op`) otherwise.
template <typename F>
decltype(auto) dispatch_float(DType t, std::string_view op, F&& f) {
  switch (t) {
    case DType::F16: return f.template operator()<Half>();
    case DType::BF16: return f.template operator()<BFloat16>();
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
    case DType::Bool: case DType::U8: case DType::I8: case DType::I32: case DType::I64: break;
  }
  check_dtype(false, op, t, "a floating dtype: f16, bf16, f32 or f64");
  return f.template operator()<float>();  // not reached: check_dtype throws
}

/// The broadcast, collapsed iteration space of one output and N inputs (element strides).
template <size_t N>
struct StridedPlan {
  static constexpr size_t kOps = N + 1;  // operand 0 is the output
  IntVec sizes;                          // collapsed sizes, innermost last (empty = one element)
  std::array<IntVec, kOps> strides;      // per operand, per collapsed dim, in elements
  std::array<char*, kOps> data{};
  std::array<int64_t, kOps> itemsize{};
  int64_t numel = 1;

  StridedPlan(const Tensor& out, std::span<const Tensor> in) {
    IntVec osz = out.int_sizes();
    const size_t r = osz.size();
    std::array<IntVec, kOps> st;
    st[0] = out.int_strides();
    data[0] = static_cast<char*>(out.data_ptr());
    itemsize[0] = static_cast<int64_t>(out.itemsize());
    for (size_t k = 0; k < N; ++k) {
      const Tensor& t = in[k];
      IntVec tsz = t.int_sizes(), tst = t.int_strides();
      size_t off = r - tsz.size();  // caller guarantees t broadcasts to out
      st[k + 1].assign(r, 0);
      for (size_t d = 0; d < tsz.size(); ++d) st[k + 1][off + d] = tsz[d] == 1 ? 0 : tst[d];
      data[k + 1] = static_cast<char*>(t.data_ptr());
      itemsize[k + 1] = static_cast<int64_t>(t.itemsize());
    }
    for (int64_t s : osz) numel *= s;
    // drop size-1 dims, then merge neighbours (outermost first)
    for (size_t d = 0; d < r; ++d) {
      if (osz[d] == 1) continue;
      if (!sizes.empty()) {
        bool mergeable = true;
        for (size_t k = 0; k < kOps; ++k)
          if (strides[k].back() != st[k][d] * osz[d]) mergeable = false;
        if (mergeable) {
          sizes.back() *= osz[d];
          for (size_t k = 0; k < kOps; ++k) strides[k].back() = st[k][d];
          continue;
        }
      }
      sizes.push_back(osz[d]);
      for (size_t k = 0; k < kOps; ++k) strides[k].push_back(st[k][d]);
    }
  }

  /// Calls run(ptrs, strides_in_elements, n) for every innermost run of the element range [b, e).
  template <typename Run>
  void for_runs(int64_t b, int64_t e, Run&& run) const {
    std::array<char*, kOps> p;
    std::array<int64_t, kOps> inner{};
    const size_t nd = sizes.size();
    if (nd == 0) {
      if (b < e) {
        for (size_t k = 0; k < kOps; ++k) p[k] = data[k];
        run(p, inner, int64_t{1});
      }
      return;
    }
    for (size_t k = 0; k < kOps; ++k) inner[k] = strides[k][nd - 1];
    const int64_t isz = sizes[nd - 1];
    IntVec idx(nd, 0);
    int64_t rem = b;
    for (size_t d = nd; d-- > 0;) {
      idx[d] = rem % sizes[d];
      rem /= sizes[d];
    }
    int64_t pos = b;
    while (pos < e) {
      for (size_t k = 0; k < kOps; ++k) {
        int64_t o = 0;
        for (size_t d = 0; d < nd; ++d) o += idx[d] * strides[k][d];
        p[k] = data[k] + o * itemsize[k];
      }
      int64_t n = std::min<int64_t>(isz - idx[nd - 1], e - pos);
      run(p, inner, n);
      pos += n;
      idx[nd - 1] += n;
      for (size_t d = nd - 1; d > 0 && idx[d] == sizes[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
      }
    }
  }

  /// Runs for_runs over the whole space, split across threads when large.
  template <typename Run>
  void parallel_runs(Run&& run) const {
    if (numel == 0) return;
    parallel_for(numel, 1, [&](int64_t b, int64_t e) { for_runs(b, e, run); });
  }
};

namespace detail {
template <typename Out, typename... In, typename F, size_t... I>
inline void run_contiguous(std::index_sequence<I...>, Out* __restrict o, const std::array<const void*, sizeof...(In)>& ip,
                           int64_t n, F& f) {
  std::tuple<const In* __restrict...> q{static_cast<const In*>(ip[I])...};
  auto* __restrict p0 = o;
  if constexpr (sizeof...(In) == 1) {
    const auto* __restrict a = std::get<0>(q);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) p0[i] = f(a[i]);
  } else if constexpr (sizeof...(In) == 2) {
    const auto* __restrict a = std::get<0>(q);
    const auto* __restrict b = std::get<1>(q);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) p0[i] = f(a[i], b[i]);
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) p0[i] = f(std::get<I>(q)[i]...);
  }
}
}  // namespace detail

/// out[i] = f(in[0][i], in[1][i], ...) with broadcasting; see the file comment. `Out`/`In...` are the
/// C++ element types of out and of each input (they must match the dtypes).
template <typename Out, typename... In, typename F>
void map(const Tensor& out, std::initializer_list<Tensor> in, F f) {
  constexpr size_t N = sizeof...(In);
  StridedPlan<N> plan(out, std::span<const Tensor>(in.begin(), in.size()));
  plan.parallel_runs([&](const std::array<char*, N + 1>& p, const std::array<int64_t, N + 1>& s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    bool contiguous = s[0] == 1 || n == 1;
    bool scalar_in = false;
    for (size_t k = 1; k <= N; ++k) {
      if (s[k] != 1 && n != 1) contiguous = false;
      if (s[k] == 0) scalar_in = true;
    }
    if (contiguous) {
      std::array<const void*, N> ip;
      for (size_t k = 0; k < N; ++k) ip[k] = p[k + 1];
      detail::run_contiguous<Out, In...>(std::index_sequence_for<In...>{}, o, ip, n, f);
      return;
    }
    if constexpr (N == 1) {
      if (s[0] == 1 && s[1] == 0) {
        using A = std::tuple_element_t<0, std::tuple<In...>>;
        const Out r = f(*reinterpret_cast<const A*>(p[1]));
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) o[i] = r;
        return;
      }
    } else if constexpr (N == 2) {
      using A = std::tuple_element_t<0, std::tuple<In...>>;
      using B = std::tuple_element_t<1, std::tuple<In...>>;
      if (s[0] == 1 && scalar_in) {
        const A* __restrict a = reinterpret_cast<const A*>(p[1]);
        const B* __restrict b = reinterpret_cast<const B*>(p[2]);
        Out* __restrict oo = o;
        if (s[1] == 1 && s[2] == 0) {
          const B bv = *b;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) oo[i] = f(a[i], bv);
          return;
        }
        if (s[1] == 0 && s[2] == 1) {
          const A av = *a;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) oo[i] = f(av, b[i]);
          return;
        }
      }
    }
    // generic strided run
    std::array<const char*, N> q;
    for (size_t k = 0; k < N; ++k) q[k] = p[k + 1];
    [&]<size_t... I>(std::index_sequence<I...>) {
      for (int64_t i = 0; i < n; ++i)
        o[i * s[0]] = f(reinterpret_cast<const In*>(q[I])[i * s[I + 1]]...);
    }(std::index_sequence_for<In...>{});
  });
}

/// Like map, with the element computed by `f` through OpMath: f16/bf16 load as float, compute in
/// float and round once on store. `f` is a generic callable taking OpMath<T> values.
template <typename Out, typename... In, typename F>
void map_opmath(const Tensor& out, std::initializer_list<Tensor> in, F f) {
  map<Out, In...>(out, in, [f](In... v) -> Out {
    return static_cast<Out>(f(static_cast<OpMath<In>>(v)...));
  });
}

/// Copies (and converts) `src` into `dst` (same shape, or `src` broadcastable to it), any strides.
void copy_into(const Tensor& dst, const Tensor& src);
/// `t` itself when it already has `dtype`, else a contiguous converted copy (same shape).
Tensor to_dtype(const Tensor& t, DType dtype);
/// `t` itself when contiguous, else a contiguous copy.
Tensor contiguous(const Tensor& t);

}  // namespace protean::ops::kernel
