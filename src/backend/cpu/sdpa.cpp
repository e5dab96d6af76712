#include "backend/cpu/sdpa.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "ops/gemm_team.h"
#include "ops/registry.h"
#include "ops/vec16.h"
#include "protean/ops.h"

namespace protean::backend::cpu {

namespace {

using namespace vec16;
constexpr int64_t kTile = 64;  // keys per tile: four vectors of scores per query row

/// The problem of one call: B independent (batch × head) slices. q and v are read in place: slice b's
/// rows start at qb[b] / vb[b], q_rs / v_rs floats apart, each row unit-stride (a head of a fused QKV
/// projection is such a view).
struct Problem {
  const float* const* qb;  // B slices of L rows of E
  const float* kt;         // [B, E, Sp]: k transposed, keys padded with zeros to Sp (a multiple of kTile)
  const float* const* vb;  // B slices of S rows of Evs: Evs = Ev, or Ev padded with zeros to a multiple of 16 (below 64)
  float* out;              // [B, L, Ev]
  int64_t B, L, S, Sp, E, Ev, Evs;
  int64_t q_rs, v_rs;
  float scale;
  bool causal;
};

/// The unscaled scores q·k of R query rows against the first G 16-key groups of the tile at key j0
/// (the groups past G stay 0: every key in them is masked).
template <int R, int G>
PT_SDPA_INLINE void tile_scores(const Problem& P, const float* kt, const float* const* q, int64_t j0, vf (*s)[4]) {
  for (int64_t e = 0; e < P.E; ++e) {
    const float* kr = kt + e * P.Sp + j0;
    vf k[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) k[g] = vload(kr + 16 * g);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vf qe = splat(q[r][e]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) s[r][g] += qe * k[g];
    }
  }
}

/// P·V of R query rows over the tile's first `vmax` keys at key j0, value rows of V whole vectors
/// (Evs = 16·V): the rows' accumulators (`acc`, R rows of Evv floats) held in registers across the keys.
template <int R, int V>
PT_SDPA_INLINE void tile_pv(const Problem& P, const float* vb, int64_t j0, int64_t vmax, const float* pbuf, float* acc,
                            int64_t Evv) {
  vf a[R][V];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) a[r][c] = vload(acc + r * Evv + 16 * c);
  for (int64_t j = 0; j < vmax; ++j) {
    const float* vr = vb + (j0 + j) * P.v_rs;
    vf vv[V];
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) vv[c] = vload(vr + 16 * c);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vf pj = splat(pbuf[r * kTile + j]);  // 0 past the row's own keys
#pragma GCC unroll 4
      for (int c = 0; c < V; ++c) a[r][c] += pj * vv[c];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < V; ++c) vstore(acc + r * Evv + 16 * c, a[r][c]);
}

/// R consecutive query rows i0..i0+R-1 of slice b at once (R = 1, 2 or 4: each key and value vector
/// loaded is used R times; the scores and, for value rows of 16 to 64 floats, the output accumulators
/// stay in registers). `acc` holds R rows of Evv floats, `pbuf` R × kTile floats.
template <int R>
PT_SDPA_INLINE void attention_block(const Problem& P, int64_t b, int64_t i0, float* acc, float* pbuf) {
  const int64_t Evv = (P.Evs + kLanes - 1) / kLanes * kLanes;
  const vf iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const float* kt = P.kt + b * P.E * P.Sp;
  const float* vb = P.vb[b];
  const float* q[R];
  int64_t keys[R];  // row r's keys [0, keys[r]) are not masked
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    q[r] = P.qb[b] + (i0 + r) * P.q_rs;
    keys[r] = P.causal ? std::min(P.S, i0 + r + 1) : P.S;
    m[r] = kNegInf;
    l[r] = 0;
  }
  std::fill(acc, acc + R * Evv, 0.0f);
  const int64_t all_keys = keys[R - 1];  // the last row sees the most keys
  for (int64_t j0 = 0; j0 < all_keys; j0 += kTile) {
    vf s[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) s[r][0] = s[r][1] = s[r][2] = s[r][3] = vf{};
    // only the 16-key groups holding an unmasked key of some row: on the causal diagonal a block of
    // rows near the tile's start needs one or two of the four
    switch (std::min<int64_t>(4, (all_keys - j0 + kLanes - 1) / kLanes)) {
      case 1: tile_scores<R, 1>(P, kt, q, j0, s); break;
      case 2: tile_scores<R, 2>(P, kt, q, j0, s); break;
      case 3: tile_scores<R, 3>(P, kt, q, j0, s); break;
      default: tile_scores<R, 4>(P, kt, q, j0, s); break;
    }
    int64_t valid[R];
    const vf scale = splat(P.scale);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) s[r][g] *= scale;  // (q·k)·scale: the eager kernel also scales the scores
      valid[r] = std::max<int64_t>(0, std::min(kTile, keys[r] - j0));
      if (valid[r] < kTile) {
        const vf ninf = splat(kNegInf);
        const float lim = static_cast<float>(valid[r]);  // <= 64: exact
        s[r][0] = iota < lim ? s[r][0] : ninf;
        s[r][1] = iota + 16.0f < lim ? s[r][1] : ninf;
        s[r][2] = iota + 32.0f < lim ? s[r][2] : ninf;
        s[r][3] = iota + 48.0f < lim ? s[r][3] : ninf;
      }
      const vf mx = max4(s[r][0], s[r][1], s[r][2], s[r][3]);
      const float m_new = std::max(m[r], hmax(mx));
      float* pr = pbuf + r * kTile;
      if (m_new == kNegInf) {  // every key so far masked (or NaN: the maximum skips it)
        std::fill(pr, pr + kTile, 0.0f);
        const vi nan = (s[r][0] != s[r][0]) | (s[r][1] != s[r][1]) | (s[r][2] != s[r][2]) | (s[r][3] != s[r][3]);
        for (int t = 0; t < kLanes; ++t)
          if (nan[t]) l[r] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const vf mv = splat(m_new);
      // the 16-key groups past the row's last unmasked key give 0 without an exp (on the causal
      // diagonal most of a short sequence's tile)
      const int64_t groups = (valid[r] + kLanes - 1) / kLanes;
      vf p[4];
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) p[g] = g < groups ? vexp_nonpos(s[r][g] - mv) : vf{};
      const vf p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
      if (m_new != m[r]) {
        // the maximum grew: rescale what was accumulated (m = -inf: nothing accumulated yet)
        const float corr = m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
        l[r] *= corr;
        const vf cv = splat(corr);
        float* ar = acc + r * Evv;
        for (int64_t c = 0; c < Evv; c += kLanes) vstore(ar + c, vload(ar + c) * cv);
        m[r] = m_new;
      }
      l[r] += hsum((p0 + p1) + (p2 + p3));
      vstore(pr, p0);
      vstore(pr + 16, p1);
      vstore(pr + 32, p2);
      vstore(pr + 48, p3);
    }
    const int64_t vmax = valid[R - 1];
    if (P.Evs > 0 && P.Evs % kLanes == 0 && P.Evs <= 4 * kLanes) {
      // value rows of 16 to 64 floats (GPT-like heads of 64; a d = 128 model with 4 heads; PP-OCRv4
      // rec's 15-wide heads padded to 16): the output accumulators stay in registers
      switch (P.Evs / kLanes) {
        case 1: tile_pv<R, 1>(P, vb, j0, vmax, pbuf, acc, Evv); break;
        case 2: tile_pv<R, 2>(P, vb, j0, vmax, pbuf, acc, Evv); break;
        case 3: tile_pv<R, 3>(P, vb, j0, vmax, pbuf, acc, Evv); break;
        default: tile_pv<R, 4>(P, vb, j0, vmax, pbuf, acc, Evv); break;
      }
    } else {
      for (int r = 0; r < R; ++r)
        for (int64_t j = 0; j < valid[r]; ++j) {
          const float pj = pbuf[r * kTile + j];
          const float* vr = vb + (j0 + j) * P.v_rs;
          float* ar = acc + r * Evv;
          for (int64_t c = 0; c < P.Ev; ++c) ar[c] += pj * vr[c];
        }
    }
  }
  for (int r = 0; r < R; ++r) {
    // no unmasked key (S = 0): zeros, as eager; a NaN score makes the row NaN, as eager
    const float inv = l[r] > 0 ? 1.0f / l[r] : (l[r] != l[r] ? l[r] : 0.0f);
    float* oi = P.out + (b * P.L + i0 + r) * P.Ev;
    const float* ar = acc + r * Evv;
    if (l[r] > 0 || l[r] != l[r]) {
      const vf iv = splat(inv);
      int64_t c = 0;
      for (; c + kLanes <= P.Ev; c += kLanes) vstore(oi + c, vload(ar + c) * iv);
      for (; c < P.Ev; ++c) oi[c] = ar[c] * inv;
    } else {
      std::fill(oi, oi + P.Ev, 0.0f);
    }
  }
}

/// Output rows [row_begin, row_end) of the flattened B·L rows, four at a time within a slice.
PT_SDPA_INLINE void attention_rows(const Problem& P, int64_t row_begin, int64_t row_end, float* acc, float* pbuf) {
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t b = row / P.L, i = row % P.L;
    if (row + 3 < row_end && i + 3 < P.L) {
      attention_block<4>(P, b, i, acc, pbuf);
      row += 4;
    } else if (row + 1 < row_end && i + 1 < P.L) {
      attention_block<2>(P, b, i, acc, pbuf);
      row += 2;
    } else {
      attention_block<1>(P, b, i, acc, pbuf);
      row += 1;
    }
  }
}

// The row loop compiled twice, for AVX-512 and for the baseline x86-64, picked once at load time
// (the library itself is built for the baseline; the parallel region stays outside the clones,
// since OpenMP outlines a region's body into a function of its own).
__attribute__((target_clones("avx512f", "default"))) void rows_chunk(const Problem& P, int64_t r0, int64_t r1,
                                                                    float* acc, float* pbuf) {
  attention_rows(P, r0, r1, acc, pbuf);
}

/// kt[b][e][j] = k_b[j][e] for j < S and 0 for S <= j < Sp (slice b's S rows of E at kb[b], `rs` floats
/// apart; kt: [B, E, Sp]): 16×16 blocks through registers, the ragged edges and the padding by scalars.
__attribute__((target_clones("avx512f", "default"))) void transpose_keys(const float* const* kbs, int64_t rs, float* kt,
                                                                         int64_t B, int64_t S, int64_t E, int64_t Sp) {
  const int64_t S16 = S / kLanes * kLanes, E16 = E / kLanes * kLanes;
  for (int64_t b = 0; b < B; ++b) {
    const float* kb = kbs[b];
    float* tb = kt + b * E * Sp;
    for (int64_t j = 0; j < S16; j += kLanes)
      for (int64_t e = 0; e < E16; e += kLanes) transpose16(kb + j * rs + e, rs, tb + e * Sp + j, Sp);
    for (int64_t e = 0; e < E; ++e) {
      float* row = tb + e * Sp;
      for (int64_t j = e < E16 ? S16 : 0; j < S; ++j) row[j] = kb[j * rs + e];
      std::fill(row + S, row + Sp, 0.0f);
    }
  }
}

/// Where each of the B slices of `t` ([..., rows, cols], batch dims flattened) starts, when its rows
/// are unit-stride (any strides otherwise: a permute or a slice of a larger buffer); false when not.
bool slice_starts(const Tensor& t, int64_t B, std::vector<const float*>& starts, int64_t& row_stride) {
  const IntVec sizes = t.int_sizes(), strides = t.int_strides();
  const size_t r = sizes.size();
  if (sizes[r - 1] > 1 && strides[r - 1] != 1) return false;
  row_stride = sizes[r - 2] > 1 ? strides[r - 2] : sizes[r - 1];
  if (row_stride < sizes[r - 1] && sizes[r - 2] > 1) return false;  // overlapping rows: not a plain view
  starts.resize(static_cast<size_t>(B));
  const float* base = t.data_ptr<float>();
  IntVec idx(r - 2, 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t off = 0;
    for (size_t d = 0; d + 2 < r; ++d) off += idx[d] * strides[d];
    starts[static_cast<size_t>(b)] = base + off;
    for (size_t d = r - 2; d-- > 0;) {  // the next multi-index, last batch dim fastest
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return true;
}

void run_problem(const Problem& P) {
  const int64_t rows = P.B * P.L;
  const int threads = protean::num_threads();
  // below about 2^18 multiply-adds a parallel region costs more than it saves; a causal row reads
  // about half of the keys
  const double work = static_cast<double>(rows) * static_cast<double>(P.S) * static_cast<double>(P.E + P.Ev) *
                      (P.causal ? 0.5 : 1.0);
  const int64_t Evv = (P.Evs + kLanes - 1) / kLanes * kLanes;
  const bool parallel = threads > 1 && work > 262144.0;
  // causal rows differ in cost: chunks of 8 rows handed out dynamically balance them
  const int64_t chunks = (rows + 7) / 8;
  if (parallel && chunks > 1 && ops::gemm_team_enabled()) {
    // OpenMP's workers sleep between regions (ops/gemm_team.h): waking one costs 10-20 us on the
    // 2-vCPU VMs, more than this kernel takes at short lengths, and it then shares its CPU with the
    // GEMM team's worker, which is still spinning after the projection before this kernel. That
    // worker takes the chunks instead. (cpu2_bench's attention block on 2 threads, L = 16..200,
    // was 0.76-0.96x of its 1-thread time through the OpenMP region.)
    std::atomic<int64_t> next{0};
    auto slice = [&](int) {
      std::vector<float> acc(static_cast<size_t>(4 * Evv)), pbuf(4 * kTile);
      for (int64_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < chunks;)
        rows_chunk(P, c * 8, std::min(rows, c * 8 + 8), acc.data(), pbuf.data());
    };
    // bound only inside a run whose larger kernels bound the team
    if (ops::run_on_bound_gemm_team(threads, slice, false)) return;
  }
#pragma omp parallel num_threads(threads) if (parallel)
  {
    std::vector<float> acc(static_cast<size_t>(4 * Evv)), pbuf(4 * kTile);
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
  const IntVec qs = q.int_sizes(), ks = k.int_sizes(), vs = v.int_sizes();
  const size_t r = qs.size();
  int64_t B = 1;
  for (size_t d = 0; d + 2 < r; ++d) {
    if (ks[d] != qs[d] || vs[d] != qs[d]) return std::nullopt;  // broadcast batch dims: eager
    B *= qs[d];
  }
  const int64_t L = qs[r - 2], E = qs[r - 1], S = ks[r - 2], Ev = vs[r - 1];
  if (ks[r - 1] != E || vs[r - 2] != S) return std::nullopt;
  // empty heads: the default scale 1/sqrt(0) is infinite, and the eager kernel's answer is the one to give
  if (E == 0) return std::nullopt;
  // q, k and v read in place where their rows are unit-stride (heads of a fused projection, permuted)
  std::vector<const float*> q_starts, k_starts, v_starts;
  int64_t q_rs = E, k_rs = E, v_rs = Ev;
  if (B * L * Ev > 0) {
    // rows that are not unit-stride: the eager kernel
    if (!slice_starts(q, B, q_starts, q_rs)) return std::nullopt;
    if (S > 0) {
      if (!slice_starts(k, B, k_starts, k_rs) || !slice_starts(v, B, v_starts, v_rs)) return std::nullopt;
    } else {  // no keys: nothing of k or v is read
      k_starts.assign(static_cast<size_t>(B), nullptr);
      v_starts.assign(static_cast<size_t>(B), nullptr);
    }
  }
  const bool causal = attrs.has("is_causal") && attrs.b("is_causal");
  const double scale = attrs.has("scale") ? attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(E));
  IntVec os = qs;
  os[r - 1] = Ev;
  // empty_like_meta: the result goes into the memory slot the runner offers (ops::OutputPlace), if any
  Tensor out = ops::empty_like_meta(TensorMeta::contiguous(to_symint_vec(os), DType::F32));
  if (B * L * Ev == 0) return out;
  // k transposed per slice, keys padded to whole tiles with zeros (their scores are masked)
  const int64_t Sp = std::max<int64_t>(kTile, (S + kTile - 1) / kTile * kTile);
  // in a buffer kept by the thread between calls (a call at short lengths is a few tens of µs, of which
  // a fresh zeroed allocation was several); one past 4 MiB is given back after the call
  thread_local std::vector<float> kt_buffer;
  const size_t kt_size = static_cast<size_t>(B * E * Sp);
  if (kt_buffer.size() < kt_size) kt_buffer.resize(kt_size);
  struct Trim {
    ~Trim() {
      if (kt_buffer.capacity() > (size_t{1} << 20)) std::vector<float>().swap(kt_buffer);
    }
  } trim;
  float* kt = kt_buffer.data();
  transpose_keys(k_starts.data(), k_rs, kt, B, S, E, Sp);
  // value rows narrower than 64 floats and not whole vectors (PP-OCRv4 rec: 8 heads of 15) are
  // copied into rows padded with zeros to whole vectors, so P·V takes the register form
  const int64_t Evs = Ev % kLanes != 0 && Ev < 4 * kLanes ? (Ev + kLanes - 1) / kLanes * kLanes : Ev;
  std::vector<float> vpad;
  if (Evs != Ev) {
    vpad.assign(static_cast<size_t>(B * S * Evs), 0.0f);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < S; ++j) {
        const float* src = v_starts[static_cast<size_t>(b)] + j * v_rs;
        std::copy(src, src + Ev, vpad.data() + (b * S + j) * Evs);
      }
      v_starts[static_cast<size_t>(b)] = vpad.data() + b * S * Evs;
    }
    v_rs = Evs;
  }
  Problem P{q_starts.data(), kt, v_starts.data(), out.data_ptr<float>(), B, L, S, Sp, E, Ev, Evs, q_rs, v_rs,
            static_cast<float>(scale), causal};
  run_problem(P);
  return out;
}

}  // namespace protean::backend::cpu
