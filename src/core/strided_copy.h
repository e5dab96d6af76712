// Element copies between strided CPU tensors, used by the data-movement kernels (cat, stack, reshape's
// copy path, attention), .npy loading, printing and the random tensor constructors. In core so that core
// needs nothing from the op layer. Inputs may be any view (offsets, size-0 dims, 0-dim); the
// destination is written in place through its own strides.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "protean/tensor.h"

namespace protean::core {

/// Converts one element between Protean's C++ element types (f16/bf16 through float; integers
/// between themselves without a detour through double; anything → bool is `!= 0`).
template <typename D, typename S>
inline D convert_element(S s) {
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) {
    return convert_element<D, float>(static_cast<float>(s));
  } else if constexpr (std::is_same_v<D, bool>) {
    return s != S(0);
  } else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) {
    return D(static_cast<float>(s));
  } else {
    return static_cast<D>(s);
  }
}

/// Calls f(offset_a, offset_b) for every index of `sizes` in row-major order, where the offsets are
/// element offsets through strides `sa` / `sb` (storage offsets not included).
template <typename F>
inline void for_each_offset2(const IntVec& sizes, const IntVec& sa, const IntVec& sb, F&& f) {
  const size_t r = sizes.size();
  for (int64_t s : sizes)
    if (s == 0) return;
  if (r == 0) {
    f(int64_t{0}, int64_t{0});
    return;
  }
  IntVec idx(r, 0);
  const int64_t inner = sizes[r - 1], ia = sa[r - 1], ib = sb[r - 1];
  int64_t oa = 0, ob = 0;
  while (true) {
    for (int64_t i = 0; i < inner; ++i) f(oa + i * ia, ob + i * ib);
    // advance the outer index (all dims but the last)
    size_t d = r - 1;
    while (true) {
      if (d == 0) return;
      --d;
      if (++idx[d] < sizes[d]) {
        oa += sa[d];
        ob += sb[d];
        break;
      }
      oa -= sa[d] * (sizes[d] - 1);
      ob -= sb[d] * (sizes[d] - 1);
      idx[d] = 0;
    }
  }
}

/// dst[...] = convert(src[...]) elementwise; sizes must be equal (not checked: kernels call this after
/// their meta function validated shapes). Parallel over dim 0 when the copy is large.
inline void copy_into(const Tensor& dst, const Tensor& src) {
  IntVec sizes = dst.int_sizes();
  int64_t n = dst.int_numel();
  if (n == 0) return;
  IntVec sd = dst.int_strides(), ss = src.int_strides();
  char* pd = static_cast<char*>(dst.data_ptr());
  const char* ps = static_cast<const char*>(src.data_ptr());
  dispatch_dtype(dst.dtype(), [&]<typename D>() {
    dispatch_dtype(src.dtype(), [&]<typename S>() {
      D* d = reinterpret_cast<D*>(pd);
      const S* s = reinterpret_cast<const S*>(ps);
      if (sizes.size() >= 2 && n >= (1 << 16) && sizes[0] > 1) {
        IntVec sub(sizes.begin() + 1, sizes.end()), subd(sd.begin() + 1, sd.end()), subs(ss.begin() + 1, ss.end());
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < sizes[0]; ++i) {
          D* di = d + i * sd[0];
          const S* si = s + i * ss[0];
          for_each_offset2(sub, subd, subs, [&](int64_t od, int64_t os) { di[od] = convert_element<D>(si[os]); });
        }
      } else {
        for_each_offset2(sizes, sd, ss, [&](int64_t od, int64_t os) { d[od] = convert_element<D>(s[os]); });
      }
    });
  });
}

/// A new C-contiguous tensor with `src`'s values converted to `dtype`.
inline Tensor contiguous_copy(const Tensor& src, DType dtype) {
  Tensor out = empty(src.int_sizes(), dtype);
  copy_into(out, src);
  return out;
}
inline Tensor contiguous_copy(const Tensor& src) { return contiguous_copy(src, src.dtype()); }

/// A view of `base`'s storage with explicit concrete sizes/strides/offset (for kernels).
inline Tensor strided_view(const Tensor& base, const IntVec& sizes, const IntVec& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->sizes = to_symint_vec(sizes);
  impl->strides = to_symint_vec(strides);
  impl->storage_offset = offset;
  impl->dtype = base.dtype();
  impl->device = base.device();
  return Tensor(std::move(impl));
}

/// Reads an integer index element (i64 / i32 / other integer dtypes) at element offset `off`.
inline int64_t read_index(const void* base, DType t, int64_t off) {
  return dispatch_dtype(t, [&]<typename T>() -> int64_t {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      return static_cast<int64_t>(static_cast<float>(static_cast<const T*>(base)[off]));
    } else {
      return static_cast<int64_t>(static_cast<const T*>(base)[off]);
    }
  });
}

}  // namespace protean::core
