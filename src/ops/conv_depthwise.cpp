#include "ops/conv_depthwise.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>

#include "protean/ops.h"

namespace protean::ops {

namespace {

bool have_avx512f() {
  static const bool ok = __builtin_cpu_supports("avx512f");
  return ok;
}

/// One eltwise post-op as the kernel applies it (alpha, beta of PostOp in f32). A hardswish followed
/// by linear(a, b) is one entry with `then_linear`: x·r·(a/6) + b in one FMA.
struct Elt {
  PostOpKind kind;
  float a, b;
  bool then_linear = false;
};

constexpr int kMaxPost = 8;

bool kernel_handles(PostOpKind k) {
  switch (k) {
    case PostOpKind::relu: case PostOpKind::hardswish: case PostOpKind::hardsigmoid: case PostOpKind::clamp:
    case PostOpKind::linear:
      return true;
    case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish: case PostOpKind::gelu_erf:
    case PostOpKind::gelu_tanh: case PostOpKind::add: case PostOpKind::sub: case PostOpKind::mul: case PostOpKind::div:
    case PostOpKind::batch_norm:
      return false;
  }
  return false;
}

/// Everything one output row needs.
struct Row {
  const float* x;   // x + n·H·W·C
  const float* wp;  // [KH, KW, C]
  const float* b;   // [C] or null
  float* y;         // y + (n·OH + oh)·OW·C
  int64_t C, W, KW, sw, pw;
  int64_t ih0;       // oh·sh − ph: the input row of kernel row 0
  int64_t kh0, kh1;  // kernel rows inside the input
  const Elt* post;
  int npost;
};

#define PT_AVX512 __attribute__((target("avx512f")))

template <bool Masked>
PT_AVX512 inline __m512 load(__mmask16 m, const float* p) {
  if constexpr (Masked) return _mm512_maskz_loadu_ps(m, p);
  else return _mm512_loadu_ps(p);
}

template <bool Masked>
PT_AVX512 inline void store(__mmask16 m, float* p, __m512 v) {
  if constexpr (Masked) _mm512_mask_storeu_ps(p, m, v);
  else _mm512_storeu_ps(p, v);
}

// max(v, lo) and min(v, hi) as std::max / std::min compute them: vmaxps / vminps return their second
// operand when either is NaN, so a NaN v is kept. (The all-lanes masked forms: GCC 12 flags the
// unmasked intrinsics' undefined source.)
PT_AVX512 inline __m512 max_keep(__m512 v, __m512 lo) { return _mm512_mask_max_ps(lo, __mmask16(0xffff), lo, v); }
PT_AVX512 inline __m512 min_keep(__m512 v, __m512 hi) { return _mm512_mask_min_ps(hi, __mmask16(0xffff), hi, v); }

/// The post-ops on T vectors, one op at a time over all of them (one dispatch per op and strip).
template <int T>
PT_AVX512 __attribute__((always_inline)) inline void apply_post(const Elt* ops, int n, __m512* v) {
  const __m512 zero = _mm512_setzero_ps(), three = _mm512_set1_ps(3.0f), six = _mm512_set1_ps(6.0f),
               sixth = _mm512_set1_ps(1.0f / 6.0f);
  for (int i = 0; i < n; ++i) {
    const Elt& e = ops[i];
    const __m512 a = _mm512_set1_ps(e.a), b = _mm512_set1_ps(e.b);
    switch (e.kind) {
      case PostOpKind::relu:
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) v[t] = max_keep(v[t], zero);
        break;
      case PostOpKind::linear:
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) v[t] = _mm512_fmadd_ps(a, v[t], b);
        break;
      case PostOpKind::clamp:
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) v[t] = min_keep(max_keep(v[t], a), b);
        break;
      case PostOpKind::hardswish:
        if (e.then_linear) {
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const __m512 r = min_keep(max_keep(_mm512_add_ps(v[t], three), zero), six);
            v[t] = _mm512_fmadd_ps(_mm512_mul_ps(v[t], r), a, b);  // a = alpha / 6 here
          }
        } else {
#pragma GCC unroll 16
          for (int t = 0; t < T; ++t) {
            const __m512 r = min_keep(max_keep(_mm512_add_ps(v[t], three), zero), six);
            v[t] = _mm512_mul_ps(_mm512_mul_ps(v[t], r), sixth);
          }
        }
        break;
      case PostOpKind::hardsigmoid:
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) v[t] = _mm512_mul_ps(min_keep(max_keep(_mm512_add_ps(v[t], three), zero), six), sixth);
        break;
      case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish: case PostOpKind::gelu_erf:
      case PostOpKind::gelu_tanh: case PostOpKind::add: case PostOpKind::sub: case PostOpKind::mul:
      case PostOpKind::div: case PostOpKind::batch_norm:
        break;  // never here: depthwise_nhwc_fits refuses them
    }
  }
}

/// T outputs ow0 .. ow0+T−1 of the row, channels c0 .. c0+15 (lanes `m` when Masked). The sums stay in
/// registers over the kernel rows; input column j of the strip is loaded once and feeds every output t
/// with kw = j − t·SW inside the kernel. Edge: some columns may lie left or right of the row; they read
/// as zeros (no memory access), as oneDNN pads.
template <int KW, int SW, int T, bool Masked, bool Edge>
PT_AVX512 void strip(const Row& r, int64_t ow0, int64_t c0, __mmask16 m) {
  const int64_t C = r.C;
  constexpr int J = (T - 1) * SW + KW;
  __m512 acc[T];
  const __m512 bias = r.b ? load<Masked>(m, r.b + c0) : _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = bias;
  const int64_t iw0 = ow0 * SW - r.pw;
  // Edge: the lanes each column loads, worked out once for all kernel rows (volatile: held in memory
  // and read with one mask load, not re-derived from the column bounds in every kernel row).
  volatile __mmask16 cols[Edge ? J : 1];
  if constexpr (Edge) {
    for (int j = 0; j < J; ++j) cols[j] = iw0 + j >= 0 && iw0 + j < r.W ? m : __mmask16(0);
  }
  const float* xcol = r.x + iw0 * C + c0;
  for (int64_t kh = r.kh0; kh < r.kh1; ++kh) {
    const float* p = xcol + (r.ih0 + kh) * r.W * C;
    const float* wr = r.wp + kh * KW * C + c0;
    __m512 wv[KW];
#pragma GCC unroll 8
    for (int kw = 0; kw < KW; ++kw) wv[kw] = load<Masked>(m, wr + kw * C);
#pragma GCC unroll 64
    for (int j = 0; j < J; ++j, p += C) {
      __m512 xv;
      if constexpr (Edge) xv = _mm512_maskz_loadu_ps(cols[j], p);
      else xv = load<Masked>(m, p);
      // Kept in a register: folded into each FMA as a memory operand it would be loaded KW times, and
      // this core sustains one 64-byte load per two FMAs.
      asm("" : "+v"(xv));
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        const int kw = j - t * SW;
        if (kw >= 0 && kw < KW) acc[t] = _mm512_fmadd_ps(xv, wv[kw], acc[t]);
      }
    }
  }
  apply_post<T>(r.post, r.npost, acc);
  float* yo = r.y + ow0 * C + c0;
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) store<Masked>(m, yo + t * C, acc[t]);
}

/// Outputs per strip: enough that the loads stay at or below one per two FMAs.
template <int KW, int SW>
constexpr int strip_width() {
  return KW == 5 && SW == 1 ? 12 : 16;
}

/// One strip of T outputs starting at `ow` for every channel: the full 16-channel blocks, then the
/// masked tail. The channel blocks of one pixel are adjacent in memory, so the strip reads (and writes)
/// each pixel's channels as one contiguous run instead of one 64-byte piece per pass over the row.
template <int KW, int SW, int T, bool Edge>
PT_AVX512 inline void strip_all_channels(const Row& r, int64_t ow, int64_t cfull, __mmask16 tail) {
  for (int64_t c0 = 0; c0 < cfull; c0 += 16) strip<KW, SW, T, false, Edge>(r, ow, c0, __mmask16(0xffff));
  if (cfull < r.C) strip<KW, SW, T, true, Edge>(r, ow, cfull, tail);
}

/// Outputs [t0, t1) of one row, all channels, in strips of strip_width(); the strips at the borders
/// skip the taps outside the row, and the last one overlaps its neighbour instead of running short
/// (its outputs are computed twice, the same way).
template <int KW, int SW>
PT_AVX512 void row_block(const Row& r, int64_t t0, int64_t t1, int64_t OW, int64_t ow_lo, int64_t ow_hi,
                         int64_t cfull, __mmask16 tail) {
  constexpr int T = strip_width<KW, SW>();
  if (OW < T) {
    for (int64_t ow = t0; ow < t1; ++ow) strip_all_channels<KW, SW, 1, true>(r, ow, cfull, tail);
    return;
  }
  for (int64_t ow = t0; ow < t1; ow += T) {
    const int64_t s = std::min(ow, OW - T);
    if (s < ow_lo || s + T > ow_hi) strip_all_channels<KW, SW, T, true>(r, s, cfull, tail);
    else strip_all_channels<KW, SW, T, false>(r, s, cfull, tail);
  }
}

/// Output rows [r0, r1) (flattened n·OH + oh), in column tiles whose input rows fit in L2 together:
/// every tile's KH input rows are read from memory once and reused by the KH output rows that need them.
template <int KW, int SW>
PT_AVX512 void rows(const DepthwiseShape& s, const float* x, const float* wp, const float* b, float* y,
                    const Elt* post, int npost, int64_t r0, int64_t r1) {
  const int64_t C = s.C, cfull = C / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (C - cfull)) - 1);
  // Outputs whose taps all lie inside the row: ow·SW − pw ≥ 0 and ow·SW − pw + KW − 1 ≤ W − 1.
  const int64_t ow_lo = std::min(s.OW, (s.pw + SW - 1) / SW);
  int64_t ow_hi = s.W - KW + s.pw >= 0 ? std::min(s.OW, (s.W - KW + s.pw) / SW + 1) : 0;
  ow_hi = std::max(ow_hi, ow_lo);
  constexpr int64_t kTileBytes = 256 * 1024;
  int64_t tile = (kTileBytes / (s.KH * C * static_cast<int64_t>(sizeof(float))) - KW) / SW;
  constexpr int64_t T = strip_width<KW, SW>();
  tile = std::max<int64_t>(T, tile / T * T);
  for (int64_t t0 = 0; t0 < s.OW; t0 += tile) {
    const int64_t t1 = std::min(s.OW, t0 + tile);
    for (int64_t i = r0; i < r1; ++i) {
      const int64_t n = i / s.OH, oh = i % s.OH;
      Row r{x + n * s.H * s.W * C, wp, b, y + i * s.OW * C, C, s.W, KW, SW, s.pw, oh * s.sh - s.ph, 0, 0, post, npost};
      r.kh0 = std::clamp<int64_t>(-r.ih0, 0, s.KH);
      r.kh1 = std::clamp<int64_t>(s.H - r.ih0, r.kh0, s.KH);
      row_block<KW, SW>(r, t0, t1, s.OW, ow_lo, ow_hi, cfull, tail);
    }
  }
}

template <int KW, int SW>
void run_rows(const DepthwiseShape& s, const float* x, const float* wp, const float* b, float* y, const Elt* post,
              int npost) {
  const int64_t n_rows = s.N * s.OH;
  const int threads = protean::num_threads();
  const double work = static_cast<double>(n_rows) * static_cast<double>(s.OW * s.C * s.KH * KW);
#pragma omp parallel num_threads(threads) if (threads > 1 && work > 262144.0)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    rows<KW, SW>(s, x, wp, b, y, post, npost, n_rows * t / nt, n_rows * (t + 1) / nt);
  }
}

}  // namespace

bool depthwise_nhwc_fits(const DepthwiseShape& s, const std::vector<PostOp>* post) {
  if (!have_avx512f()) return false;
  if (s.KH < 1 || s.KH > 7 || (s.KW != 3 && s.KW != 5) || (s.sw != 1 && s.sw != 2) || s.sh < 1) return false;
  if (s.ph < 0 || s.ph >= s.KH || s.pw < 0 || s.pw >= s.KW || s.C < 1) return false;
  if (post) {
    if (post->size() > static_cast<size_t>(kMaxPost)) return false;
    for (const PostOp& p : *post)
      if (!kernel_handles(p.kind)) return false;
  }
  return true;
}

void pack_depthwise_weights(const float* w, int64_t C, int64_t KH, int64_t KW, float* packed) {
  const int64_t K = KH * KW;
  for (int64_t c = 0; c < C; ++c)
    for (int64_t k = 0; k < K; ++k) packed[k * C + c] = w[c * K + k];
}

void depthwise_nhwc(const DepthwiseShape& s, const float* x, const float* wp, const float* b, float* y,
                    const std::vector<PostOp>* post) {
  Elt ops[kMaxPost];
  int n = 0;
  if (post)
    for (size_t i = 0; i < post->size(); ++i) {
      const PostOp& p = (*post)[i];
      if (p.kind == PostOpKind::hardswish && i + 1 < post->size() && (*post)[i + 1].kind == PostOpKind::linear) {
        const PostOp& l = (*post)[++i];
        ops[n++] = {p.kind, static_cast<float>(l.alpha / 6.0), static_cast<float>(l.beta), true};
      } else {
        ops[n++] = {p.kind, static_cast<float>(p.alpha), static_cast<float>(p.beta)};
      }
    }
  if (s.KW == 3 && s.sw == 1) run_rows<3, 1>(s, x, wp, b, y, ops, n);
  else if (s.KW == 3) run_rows<3, 2>(s, x, wp, b, y, ops, n);
  else if (s.sw == 1) run_rows<5, 1>(s, x, wp, b, y, ops, n);
  else run_rows<5, 2>(s, x, wp, b, y, ops, n);
}

}  // namespace protean::ops
