#include "ops/pool2x2.h"

#include <immintrin.h>

#include <algorithm>

namespace protean::ops {

bool max_pool_2x2_supported() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

namespace {

// Lanes of two 16-float vectors (32 consecutive row elements = 16 windows' column pairs): the left and
// the right element of each window, and back.
__attribute__((target("avx512f"))) inline __m512i even_index() {
  return _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
}
__attribute__((target("avx512f"))) inline __m512i odd_index() {
  return _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
}
__attribute__((target("avx512f"))) inline __m512i interleave_lo() {
  return _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
}
__attribute__((target("avx512f"))) inline __m512i interleave_hi() {
  return _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
}

// max(a, b) per lane, NaN when either is NaN (max_ps alone returns its second operand for a NaN pair).
__attribute__((target("avx512f"))) inline __m512 max_nan(__m512 a, __m512 b) {
  const __mmask16 unordered = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  // (the all-lanes masked form: GCC 12 flags the unmasked intrinsic's undefined source)
  return _mm512_mask_add_ps(_mm512_mask_max_ps(a, __mmask16(0xffff), a, b), unordered, a, b);
}

// Masks of the first `n` lanes of 32 (lo: lanes 0..15, hi: 16..31).
inline __mmask16 lanes_lo(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline __mmask16 lanes_hi(int64_t n) { return n <= 16 ? __mmask16(0) : lanes_lo(n - 16); }

}  // namespace

__attribute__((target("avx512f"))) void max_pool_2x2_forward(const float* x, int64_t ld, int64_t OH, int64_t OW, float* y) {
  const __m512i ev = even_index(), od = odd_index();
  for (int64_t oh = 0; oh < OH; ++oh) {
    const float* r0 = x + 2 * oh * ld;
    const float* r1 = r0 + ld;
    for (int64_t ow = 0; ow < OW; ow += 16) {
      const int64_t n = std::min<int64_t>(16, OW - ow);
      const __mmask16 lo = lanes_lo(2 * n), hi = lanes_hi(2 * n);
      const __m512 v0 = max_nan(_mm512_maskz_loadu_ps(lo, r0 + 2 * ow), _mm512_maskz_loadu_ps(lo, r1 + 2 * ow));
      const __m512 v1 = max_nan(_mm512_maskz_loadu_ps(hi, r0 + 2 * ow + 16), _mm512_maskz_loadu_ps(hi, r1 + 2 * ow + 16));
      const __m512 m = max_nan(_mm512_permutex2var_ps(v0, ev, v1), _mm512_permutex2var_ps(v0, od, v1));
      _mm512_mask_storeu_ps(y + oh * OW + ow, lanes_lo(n), m);
    }
  }
}

__attribute__((target("avx512f"))) void max_pool_2x2_backward(const float* x, int64_t ld, const float* g, int64_t gld,
                                                               int64_t OH, int64_t OW, float* gx, int64_t H, int64_t W) {
  if (2 * OH != H || 2 * OW != W) std::fill(gx, gx + H * W, 0.0f);  // rows / columns no window covers
  const __m512i ev = even_index(), od = odd_index(), il = interleave_lo(), ih = interleave_hi();
  for (int64_t oh = 0; oh < OH; ++oh) {
    const float* r0 = x + 2 * oh * ld;
    const float* r1 = r0 + ld;
    float* o0 = gx + 2 * oh * W;
    float* o1 = o0 + W;
    for (int64_t ow = 0; ow < OW; ow += 16) {
      const int64_t n = std::min<int64_t>(16, OW - ow);
      const __mmask16 lo = lanes_lo(2 * n), hi = lanes_hi(2 * n), out = lanes_lo(n);
      const __m512 a0 = _mm512_maskz_loadu_ps(lo, r0 + 2 * ow), a1 = _mm512_maskz_loadu_ps(hi, r0 + 2 * ow + 16);
      const __m512 b0 = _mm512_maskz_loadu_ps(lo, r1 + 2 * ow), b1 = _mm512_maskz_loadu_ps(hi, r1 + 2 * ow + 16);
      // the window's four elements in row-major order, one window per lane
      const __m512 e00 = _mm512_permutex2var_ps(a0, ev, a1), e01 = _mm512_permutex2var_ps(a0, od, a1);
      const __m512 e10 = _mm512_permutex2var_ps(b0, ev, b1), e11 = _mm512_permutex2var_ps(b0, od, b1);
      // the first maximum: a later element wins only when strictly greater
      __m512 best = e00;
      const __mmask16 k01 = _mm512_cmp_ps_mask(e01, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, k01, e01);
      const __mmask16 k10 = _mm512_cmp_ps_mask(e10, best, _CMP_GT_OQ);
      best = _mm512_mask_mov_ps(best, k10, e10);
      const __mmask16 k11 = _mm512_cmp_ps_mask(e11, best, _CMP_GT_OQ);
      __mmask16 s11 = k11, s10 = k10 & ~k11, s01 = k01 & ~k10 & ~k11;
      // a window holding a NaN: its first NaN
      const __mmask16 n00 = _mm512_cmp_ps_mask(e00, e00, _CMP_UNORD_Q), n01 = _mm512_cmp_ps_mask(e01, e01, _CMP_UNORD_Q);
      const __mmask16 n10 = _mm512_cmp_ps_mask(e10, e10, _CMP_UNORD_Q), n11 = _mm512_cmp_ps_mask(e11, e11, _CMP_UNORD_Q);
      const __mmask16 nan = n00 | n01 | n10 | n11;
      s01 = (s01 & ~nan) | (n01 & ~n00);
      s10 = (s10 & ~nan) | (n10 & ~n00 & ~n01);
      s11 = (s11 & ~nan) | (n11 & ~n00 & ~n01 & ~n10);
      const __mmask16 s00 = ~(s01 | s10 | s11);
      const __m512 gv = _mm512_maskz_loadu_ps(out, g + oh * gld + ow);
      const __m512 g00 = _mm512_maskz_mov_ps(s00, gv), g01 = _mm512_maskz_mov_ps(s01, gv);
      const __m512 g10 = _mm512_maskz_mov_ps(s10, gv), g11 = _mm512_maskz_mov_ps(s11, gv);
      _mm512_mask_storeu_ps(o0 + 2 * ow, lo, _mm512_permutex2var_ps(g00, il, g01));
      _mm512_mask_storeu_ps(o0 + 2 * ow + 16, hi, _mm512_permutex2var_ps(g00, ih, g01));
      _mm512_mask_storeu_ps(o1 + 2 * ow, lo, _mm512_permutex2var_ps(g10, il, g11));
      _mm512_mask_storeu_ps(o1 + 2 * ow + 16, hi, _mm512_permutex2var_ps(g10, ih, g11));
    }
  }
}

}  // namespace protean::ops
