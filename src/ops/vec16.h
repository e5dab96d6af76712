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
// A broadcast of lane 0: the avx512f clone loads the scalar with one `vbroadcastss` from memory (or
// folds it into the multiply-add as an embedded broadcast). `vf{} + x` cost a scalar add and a
// register broadcast, two ALU instructions beside the multiply-adds; a 16-element initializer list
// is built lane by lane.
PT_SDPA_INLINE vf splat(float x) { return __builtin_shuffle(vf{x}, vi{}); }

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

/// One stage of a 16×16 transpose: rows r and r | h (bit b of r clear, h = 1 << b) swap bit b of
/// their row index with bit b of the lane index. Four stages (h = 1, 2, 4, 8) transpose the block.
template <int H>
PT_SDPA_INLINE void transpose_stage(vf* rows) {
  constexpr vi lo = {(0 & H) ? 16 + (0 ^ H) : 0,    (1 & H) ? 16 + (1 ^ H) : 1,    (2 & H) ? 16 + (2 ^ H) : 2,
                     (3 & H) ? 16 + (3 ^ H) : 3,    (4 & H) ? 16 + (4 ^ H) : 4,    (5 & H) ? 16 + (5 ^ H) : 5,
                     (6 & H) ? 16 + (6 ^ H) : 6,    (7 & H) ? 16 + (7 ^ H) : 7,    (8 & H) ? 16 + (8 ^ H) : 8,
                     (9 & H) ? 16 + (9 ^ H) : 9,    (10 & H) ? 16 + (10 ^ H) : 10, (11 & H) ? 16 + (11 ^ H) : 11,
                     (12 & H) ? 16 + (12 ^ H) : 12, (13 & H) ? 16 + (13 ^ H) : 13, (14 & H) ? 16 + (14 ^ H) : 14,
                     (15 & H) ? 16 + (15 ^ H) : 15};
  constexpr vi hi = {(0 & H) ? 16 : 0 ^ H,       (1 & H) ? 17 : 1 ^ H,   (2 & H) ? 18 : 2 ^ H,   (3 & H) ? 19 : 3 ^ H,
                     (4 & H) ? 20 : 4 ^ H,       (5 & H) ? 21 : 5 ^ H,   (6 & H) ? 22 : 6 ^ H,   (7 & H) ? 23 : 7 ^ H,
                     (8 & H) ? 24 : 8 ^ H,       (9 & H) ? 25 : 9 ^ H,   (10 & H) ? 26 : 10 ^ H, (11 & H) ? 27 : 11 ^ H,
                     (12 & H) ? 28 : 12 ^ H,     (13 & H) ? 29 : 13 ^ H, (14 & H) ? 30 : 14 ^ H, (15 & H) ? 31 : 15 ^ H};
#pragma GCC unroll 16
  for (int r = 0; r < kLanes; ++r) {
    if (r & H) continue;
    const vf a = rows[r], b = rows[r | H];
    rows[r] = __builtin_shuffle(a, b, lo);
    rows[r | H] = __builtin_shuffle(a, b, hi);
  }
}

/// dst[c·ld_dst + r] = src[r·ld_src + c] for r, c in [0, 16): a 16×16 block transposed through registers
/// (64 two-source shuffles instead of 256 scalar loads and stores).
PT_SDPA_INLINE void transpose16(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  vf rows[kLanes];
#pragma GCC unroll 16
  for (int r = 0; r < kLanes; ++r) rows[r] = vload(src + r * ld_src);
  transpose_stage<1>(rows);
  transpose_stage<2>(rows);
  transpose_stage<4>(rows);
  transpose_stage<8>(rows);
#pragma GCC unroll 16
  for (int c = 0; c < kLanes; ++c) vstore(dst + c * ld_dst, rows[c]);
}

}  // namespace protean::vec16
