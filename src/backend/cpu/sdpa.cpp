#include "backend/cpu/sdpa.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "protean/ops.h"

namespace protean::backend::cpu {

namespace {

// The 64-byte vector helpers are internal and always inlined: the ABI note about passing them
// without AVX-512 does not concern any call that crosses this file.
#pragma GCC diagnostic ignored "-Wpsabi"

// 16-float vectors (GCC vector extensions: one AVX-512 register in the avx512f clone, two AVX2 or
// four SSE registers in the default one).
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
constexpr int64_t kTile = 64;  // keys per tile: four vectors of scores per query row

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
PT_SDPA_INLINE float hsum(vf v) {
  float s = 0;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

/// The problem of one call: B independent (batch × head) slices.
struct Problem {
  const float* q;   // [B, L, E]
  const float* kt;  // [B, E, Sp]: k transposed, keys padded with zeros to Sp (a multiple of kTile)
  const float* v;   // [B, S, Ev]
  float* out;       // [B, L, Ev]
  int64_t B, L, S, Sp, E, Ev;
  float scale;
  bool causal;
};

/// Output rows [row_begin, row_end) of the flattened B·L rows. `acc` holds Ev floats (rounded up to
/// whole vectors), `pbuf` kTile floats.
PT_SDPA_INLINE void attention_rows(const Problem& P, int64_t row_begin, int64_t row_end, float* acc, float* pbuf) {
  const int64_t Evv = (P.Ev + kLanes - 1) / kLanes * kLanes;
  const vf iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t b = row / P.L, i = row % P.L;
    const float* qi = P.q + row * P.E;
    const float* kt = P.kt + b * P.E * P.Sp;
    const float* vb = P.v + b * P.S * P.Ev;
    float* oi = P.out + row * P.Ev;
    const int64_t keys = P.causal ? std::min(P.S, i + 1) : P.S;  // keys [0, keys) are not masked
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    std::fill(acc, acc + Evv, 0.0f);
    for (int64_t j0 = 0; j0 < keys; j0 += kTile) {
      vf s0{}, s1{}, s2{}, s3{};
      for (int64_t e = 0; e < P.E; ++e) {
        const vf qe = splat(qi[e] * P.scale);
        const float* kr = kt + e * P.Sp + j0;
        s0 += qe * vload(kr);
        s1 += qe * vload(kr + 16);
        s2 += qe * vload(kr + 32);
        s3 += qe * vload(kr + 48);
      }
      const int64_t valid = std::min(kTile, keys - j0);
      if (valid < kTile) {
        const vf ninf = splat(-std::numeric_limits<float>::infinity());
        const float lim = static_cast<float>(valid);  // <= 64: exact
        s0 = iota < lim ? s0 : ninf;
        s1 = iota + 16.0f < lim ? s1 : ninf;
        s2 = iota + 32.0f < lim ? s2 : ninf;
        s3 = iota + 48.0f < lim ? s3 : ninf;
      }
      const float tm = std::max(std::max(hmax(s0), hmax(s1)), std::max(hmax(s2), hmax(s3)));
      const float m_new = std::max(m, tm);
      const vf mv = splat(m_new);
      const vf p0 = vexp_nonpos(s0 - mv), p1 = vexp_nonpos(s1 - mv), p2 = vexp_nonpos(s2 - mv), p3 = vexp_nonpos(s3 - mv);
      if (m_new != m) {
        // the maximum grew: rescale what was accumulated (m = -inf: nothing accumulated yet)
        const float corr = m == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m - m_new);
        l *= corr;
        const vf cv = splat(corr);
        for (int64_t c = 0; c < Evv; c += kLanes) vstore(acc + c, vload(acc + c) * cv);
        m = m_new;
      }
      l += hsum((p0 + p1) + (p2 + p3));
      vstore(pbuf, p0);
      vstore(pbuf + 16, p1);
      vstore(pbuf + 32, p2);
      vstore(pbuf + 48, p3);
      if (P.Ev == 64) {
        vf a0 = vload(acc), a1 = vload(acc + 16), a2 = vload(acc + 32), a3 = vload(acc + 48);
        for (int64_t j = 0; j < valid; ++j) {
          const vf pj = splat(pbuf[j]);
          const float* vr = vb + (j0 + j) * 64;
          a0 += pj * vload(vr);
          a1 += pj * vload(vr + 16);
          a2 += pj * vload(vr + 32);
          a3 += pj * vload(vr + 48);
        }
        vstore(acc, a0);
        vstore(acc + 16, a1);
        vstore(acc + 32, a2);
        vstore(acc + 48, a3);
      } else {
        for (int64_t j = 0; j < valid; ++j) {
          const float pj = pbuf[j];
          const float* vr = vb + (j0 + j) * P.Ev;
          for (int64_t c = 0; c < P.Ev; ++c) acc[c] += pj * vr[c];
        }
      }
    }
    // no unmasked key (S = 0): zeros, as eager; a NaN score makes the row NaN, as eager
    const float inv = l > 0 ? 1.0f / l : (l != l ? l : 0.0f);
    for (int64_t c = 0; c < P.Ev; ++c) oi[c] = l > 0 || l != l ? acc[c] * inv : 0.0f;
  }
}

// The row loop compiled twice, for AVX-512 and for the baseline x86-64, picked once at load time
// (the library itself is built for the baseline; the parallel region stays outside the clones,
// since OpenMP outlines a region's body into a function of its own).
__attribute__((target_clones("avx512f", "default"))) void rows_chunk(const Problem& P, int64_t r0, int64_t r1,
                                                                    float* acc, float* pbuf) {
  attention_rows(P, r0, r1, acc, pbuf);
}

void run_problem(const Problem& P) {
  const int64_t rows = P.B * P.L;
  const int threads = protean::num_threads();
  // below about 2^18 multiply-adds a parallel region costs more than it saves
  const double work = static_cast<double>(rows) * static_cast<double>(P.S) * static_cast<double>(P.E + P.Ev);
  const int64_t Evv = (P.Ev + kLanes - 1) / kLanes * kLanes;
#pragma omp parallel num_threads(threads) if (threads > 1 && work > 262144.0)
  {
    std::vector<float> acc(static_cast<size_t>(Evv)), pbuf(kTile);
    // causal rows differ in cost: chunks of 8 rows handed out dynamically balance them
#pragma omp for schedule(dynamic, 1)
    for (int64_t r0 = 0; r0 < rows; r0 += 8) rows_chunk(P, r0, std::min(rows, r0 + 8), acc.data(), pbuf.data());
  }
}

}  // namespace

std::optional<Tensor> sdpa_fused(std::span<const Tensor> in, const ops::Attrs& attrs) {
  if (in.size() < 3 || (in.size() > 3 && in[3].defined())) return std::nullopt;
  const Tensor &q = in[0], &k = in[1], &v = in[2];
  if (!q.defined() || !k.defined() || !v.defined()) return std::nullopt;
  if (q.dtype() != DType::F32 || k.dtype() != DType::F32 || v.dtype() != DType::F32) return std::nullopt;
  if (q.device().type != DeviceType::CPU || q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim()) return std::nullopt;
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous()) return std::nullopt;
  const IntVec qs = q.int_sizes(), ks = k.int_sizes(), vs = v.int_sizes();
  const size_t r = qs.size();
  int64_t B = 1;
  for (size_t d = 0; d + 2 < r; ++d) {
    if (ks[d] != qs[d] || vs[d] != qs[d]) return std::nullopt;  // broadcast batch dims: eager
    B *= qs[d];
  }
  const int64_t L = qs[r - 2], E = qs[r - 1], S = ks[r - 2], Ev = vs[r - 1];
  if (ks[r - 1] != E || vs[r - 2] != S) return std::nullopt;
  const bool causal = attrs.has("is_causal") && attrs.b("is_causal");
  const double scale = attrs.has("scale") ? attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(E));
  IntVec os = qs;
  os[r - 1] = Ev;
  Tensor out = empty(os, DType::F32);
  if (B * L * Ev == 0) return out;
  // k transposed per slice, keys padded to whole tiles with zeros (their scores are masked)
  const int64_t Sp = std::max<int64_t>(kTile, (S + kTile - 1) / kTile * kTile);
  std::vector<float> kt(static_cast<size_t>(B * E * Sp), 0.0f);
  const float* kp = k.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < S; ++j)
      for (int64_t e = 0; e < E; ++e) kt[static_cast<size_t>((b * E + e) * Sp + j)] = kp[(b * S + j) * E + e];
  Problem P{q.data_ptr<float>(), kt.data(), v.data_ptr<float>(), out.data_ptr<float>(), B, L, S, Sp, E, Ev,
            static_cast<float>(scale), causal};
  run_problem(P);
  return out;
}

}  // namespace protean::backend::cpu
