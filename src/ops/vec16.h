// 16-float vectors for the hand-vectorized CPU attention kernels (backend/cpu/sdpa.cpp,
// ops/attention_backward.cpp): GCC vector extensions, one AVX-512 register in an avx512f clone, two
// AVX2 or four SSE registers otherwise. Every helper is always inlined into its caller, so it takes
// the caller's target.
#pragma once

#include <cstdint>
#include <cstring>

namespace protean::vec16 {

// The 64-byte vector helpers are internal and always inlined: the ABI note about passing them
// without AVX-512 does not concern any call that crosses a file.
#pragma GCC diagnostic ignored "-Wpsabi"

// 16-float vectors (GCC vector extensions: one AVX-512 register in the avx512f clone, two AVX2 or
// four SSE registers in the default one).
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

#define PT_SDPA_INLINE inline __attribute__((always_inline))

PT_SDPA_INLINE vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
PT_SDPA_INLINE void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
PT_SDPA_INLINE vf splat(float x) { return vf{} + x; }

/// e^x for the scores minus the running maximum (x <= 0; -inf gives 0, NaN stays NaN): x = n·ln2 + r
/// with n rounded to nearest, a degree-6 polynomial for e^r (|r| <= ln2/2) and 2^n from exponent bits;
/// below -87 (where 2^n would be subnormal) the result is 0.
PT_SDPA_INLINE vf vexp_nonpos(vf x) {
  const vi low = x < -87.0f;
  const vf xc = low ? splat(-87.0f) : x;
  const vf t = xc * 1.44269504088896341f;
  const vf n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  vf r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  vf p = splat(1.38146133e-3f) * r + 8.36870982e-3f;
  p = p * r + 4.16683874e-2f;
  p = p * r + 1.66665207e-1f;
  p = p * r + 4.99999935e-1f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi nn = n == n ? __builtin_convertvector(n, vi) : vi{};  // NaN: p is NaN already
  const vi bits = (nn + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return low ? vf{} : p * two_n;
}

PT_SDPA_INLINE float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < kLanes; ++i) m = v[i] > m ? v[i] : m;
  return m;
}
PT_SDPA_INLINE vf max4(vf a, vf b, vf c, vf d) {
  const vf x = a > b ? a : b, y = c > d ? c : d;
  return x > y ? x : y;
}
PT_SDPA_INLINE float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

}  // namespace protean::vec16
