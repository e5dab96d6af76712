// scaled_dot_product_attention_backward(g, q, k, v) is_causal scale → [3, ...q]: (dq, dk, dv), the
// gradients of out = softmax(q·kᵀ·scale, causal) · v for self-attention shapes (q, k, v and g all
// [..., L, E]; no mask). The autograd rule of scaled_dot_product_attention uses it on CPU tensors in
// that case (src/autograd/rules_nn.cpp); elsewhere the rule is the composition of matmuls and the
// softmax rule.
//
// One slice (a batch × head) at a time, four query rows i at a time (then two, one), never storing the [L, L]
// probabilities: a row's scores s_j = q_i·k_j·scale (j <= i when causal), p = softmax(s),
// dp_j = g_i·v_j, D = Σ_j p_j dp_j, ds_j = p_j (dp_j − D) · scale; then dq_i = Σ_j ds_j k_j,
// dk_j += ds_j q_i and dv_j += p_j g_i (each dk_j, dv_j read and written once for the four rows). k and v
// are transposed once per slice so that the scores and dp are multiply-adds along the keys. f32 runs
// on 16-float vectors (the polynomial exp of ops/vec16.h: relative error about 1e-6 per term); f64
// is the plain form, one row at a time (what the gradient tests check against central differences).
// Parallel over the slices.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "core/strided_copy.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "ops/vec16.h"

namespace protean::ops {
namespace {
using namespace kernel;

constexpr OpKind kOp = OpKind::scaled_dot_product_attention_backward;

std::vector<TensorMeta> meta_sdpa_backward(std::span<const Tensor> in, const Attrs&) {
  static const char* const names[] = {"the gradient", "q", "k", "v"};
  if (in.size() != 4) throw ValueError(fmt::format("{}: takes (g, q, k, v)", describe_call(kOp, in)));
  for (size_t i = 0; i < 4; ++i) {
    if (!in[i].defined()) throw ValueError(fmt::format("{}: {} is undefined", describe_call(kOp, in), names[i]));
    if (in[i].dtype() != DType::F32 && in[i].dtype() != DType::F64)
      throw TypeError(fmt::format("{}: {} must be f32 or f64, got {}", describe_call(kOp, in), names[i],
                                  short_name(in[i].dtype())));
    bool same = in[i].dim() == in[1].dim() && in[i].dtype() == in[1].dtype();
    for (int64_t d = 0; same && d < in[1].dim(); ++d) same = static_cast<bool>(in[i].size(d) == in[1].size(d));
    if (!same)
      throw ShapeError(fmt::format("{}: g, q, k and v must have one dtype and one shape [..., L, E]",
                                   describe_call(kOp, in)));
  }
  if (in[1].dim() < 2) throw ShapeError(fmt::format("{}: q needs at least 2 dims ([..., L, E])", describe_call(kOp, in)));
  SymIntVec sizes{SymInt(3)};
  for (const SymInt& s : in[1].sizes()) sizes.push_back(s);
  return one(std::move(sizes), in[1].dtype());
}

/// The slices' sizes and pointers; out is [3, BH, L, E], contiguous and zeroed. g, q, k, v: contiguous
/// [BH, L, E] (f64), or (f32) any layout whose rows are contiguous: slice b of q starts at q + qo[b] and
/// its row i at + i·qs (likewise g, k, v), so the permuted views of a fused QKV projection are read in
/// place instead of copied.
template <typename T>
struct Slices {
  const T *g, *q, *k, *v;
  T* out;
  int64_t BH, L, E;
  double scale;
  bool causal;
  const int64_t *go = nullptr, *qo = nullptr, *ko = nullptr, *vo = nullptr;  // element offsets per slice
  int64_t gs = 0, qs = 0, ks = 0, vs = 0;                                    // row strides (elements)
};

/// f64 (and the reference form): plain loops, the row's probabilities in `p`, their gradient in `ds`.
void slice_plain(const Slices<double>& P, int64_t b, std::vector<double>& p, std::vector<double>& ds) {
  const int64_t L = P.L, E = P.E, n = L * E;
  const double *q = P.q + b * n, *k = P.k + b * n, *v = P.v + b * n, *g = P.g + b * n;
  double *dq = P.out + b * n, *dk = P.out + (P.BH + b) * n, *dv = P.out + (2 * P.BH + b) * n;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t keys = P.causal ? i + 1 : L;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < keys; ++j) {
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += q[i * E + e] * k[j * E + e];
      p[static_cast<size_t>(j)] = s * P.scale;
      m = std::max(m, p[static_cast<size_t>(j)]);
    }
    double l = 0;
    for (int64_t j = 0; j < keys; ++j) l += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m));
    double D = 0;
    for (int64_t j = 0; j < keys; ++j) {
      p[static_cast<size_t>(j)] /= l;
      double dp = 0;
      for (int64_t e = 0; e < E; ++e) dp += g[i * E + e] * v[j * E + e];
      ds[static_cast<size_t>(j)] = dp;
      D += p[static_cast<size_t>(j)] * dp;
    }
    for (int64_t j = 0; j < keys; ++j) {
      const double pj = p[static_cast<size_t>(j)], dsj = pj * (ds[static_cast<size_t>(j)] - D) * P.scale;
      for (int64_t e = 0; e < E; ++e) {
        dq[i * E + e] += dsj * k[j * E + e];
        dk[j * E + e] += dsj * q[i * E + e];
        dv[j * E + e] += pj * g[i * E + e];
      }
    }
  }
}

using namespace vec16;

#define PT_SDPA_BWD_INLINE inline __attribute__((always_inline))

/// R consecutive rows' scores (q_i·k_j, unscaled) and dp (g_i·v_j) for G 16-key groups from key j:
/// 2·R·G accumulators (the multiply-adds of consecutive e do not wait on each other; each key and
/// value vector loaded serves R rows). Row r's values go to s + r·Lp and dp + r·Lp.
template <int R, int G>
PT_SDPA_BWD_INLINE void row_dots(const float* qi, const float* gi, int64_t qs, int64_t gs, const float* kt,
                                 const float* vt, int64_t E, int64_t Lp, int64_t j, float* s, float* dp) {
  vf a[R][G], b[R][G];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < G; ++t) a[r][t] = b[r][t] = vf{};
  for (int64_t e = 0; e < E; ++e) {
    const float* kr = kt + e * Lp + j;
    const float* vr = vt + e * Lp + j;
    vf kv[G], vv[G];
#pragma GCC unroll 4
    for (int t = 0; t < G; ++t) {
      kv[t] = vload(kr + kLanes * t);
      vv[t] = vload(vr + kLanes * t);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const vf qe = splat(qi[r * qs + e]), ge = splat(gi[r * gs + e]);
#pragma GCC unroll 4
      for (int t = 0; t < G; ++t) {
        a[r][t] += qe * kv[t];
        b[r][t] += ge * vv[t];
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < G; ++t) {
      vstore(s + r * Lp + j + kLanes * t, a[r][t]);
      vstore(dp + r * Lp + j + kLanes * t, b[r][t]);
    }
}

/// For R consecutive rows and E = 16·C: dq_i = Σ_j ds_ij k_j (held in registers), dk_j += Σ_i ds_ij q_i,
/// dv_j += Σ_i p_ij g_i over keys [0, keys) (a row's probabilities and ds are 0 past its own keys).
template <int R, int C>
PT_SDPA_BWD_INLINE void row_updates(const float* qi, const float* gi, const float* k, int64_t qs, int64_t gs,
                                    int64_t ks, float* dqi, float* dk, float* dv, const float* p, const float* ds,
                                    int64_t Lp, int64_t keys) {
  constexpr int64_t E = C * kLanes;
  vf acc[R][C], qv[R][C], gv[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      acc[r][c] = vf{};
      qv[r][c] = vload(qi + r * qs + kLanes * c);
      gv[r][c] = vload(gi + r * gs + kLanes * c);
    }
  for (int64_t j = 0; j < keys; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const int64_t x = j * E + kLanes * c;
      const vf kx = vload(k + j * ks + kLanes * c);
      vf dkx = vload(dk + x), dvx = vload(dv + x);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {  // the scalars broadcast from memory inside each multiply-add
        const vf dsj = splat(ds[r * Lp + j]), pj = splat(p[r * Lp + j]);
        acc[r][c] += dsj * kx;
        dkx += dsj * qv[r][c];
        dvx += pj * gv[r][c];
      }
      vstore(dk + x, dkx);
      vstore(dv + x, dvx);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) vstore(dqi + r * E + kLanes * c, acc[r][c]);
}

/// Rows i0..i0+R-1 of a slice (f32): kt and vt are the slice's k and v transposed ([E, Lp], keys
/// padded with zeros to Lp, a multiple of 16); s and dp hold R rows of Lp scores / probabilities and
/// dp / ds.
template <int R>
PT_SDPA_BWD_INLINE void rows_f32(const Slices<float>& P, const float* q, const float* k, const float* g, float* dq,
                                 float* dk, float* dv, const float* kt, const float* vt, float* s, float* dp,
                                 int64_t Lp, int64_t i0) {
  const int64_t L = P.L, E = P.E;
  const vf scale = splat(static_cast<float>(P.scale));
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const vf iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const int64_t keys = P.causal ? i0 + R : L;                 // the last row's keys: the most
  const int64_t kv = (keys + kLanes - 1) / kLanes * kLanes;  // whole vectors covering them
  const int64_t qs = P.qs, gs = P.gs, ks = P.ks;
  const float* qi = q + i0 * qs;
  const float* gi = g + i0 * gs;
  constexpr int64_t kMaxGroups = R >= 4 ? 2 : 4;  // 2·R·G accumulators within the 32 vector registers
  for (int64_t j = 0; j < kv;) {
    switch (std::min<int64_t>(kMaxGroups, (kv - j) / kLanes)) {
      case 1: row_dots<R, 1>(qi, gi, qs, gs, kt, vt, E, Lp, j, s, dp); j += kLanes; break;
      case 2: row_dots<R, 2>(qi, gi, qs, gs, kt, vt, E, Lp, j, s, dp); j += 2 * kLanes; break;
      case 3: row_dots<R, 3>(qi, gi, qs, gs, kt, vt, E, Lp, j, s, dp); j += 3 * kLanes; break;
      default: row_dots<R, 4>(qi, gi, qs, gs, kt, vt, E, Lp, j, s, dp); j += 4 * kLanes; break;
    }
  }
  for (int r = 0; r < R; ++r) {
    float* sr = s + r * Lp;
    float* dr = dp + r * Lp;
    const float lim = static_cast<float>(P.causal ? i0 + r + 1 : L);  // this row's keys
    vf mv = splat(kNegInf);
    for (int64_t j = 0; j < kv; j += kLanes) {
      vf x = vload(sr + j) * scale;
      x = iota + static_cast<float>(j) < lim ? x : splat(kNegInf);
      vstore(sr + j, x);
      mv = x > mv ? x : mv;
    }
    const vf m = splat(hmax(mv));
    vf lv{};
    for (int64_t j = 0; j < kv; j += kLanes) {
      const vf pj = vexp_nonpos(vload(sr + j) - m);  // masked keys: exp(-inf) = 0
      vstore(sr + j, pj);
      lv += pj;
    }
    const vf rl = splat(1.0f / hsum(lv));
    vf Dv{};
    for (int64_t j = 0; j < kv; j += kLanes) {
      const vf pj = vload(sr + j) * rl;
      vstore(sr + j, pj);
      Dv += pj * vload(dr + j);
    }
    const vf D = splat(hsum(Dv));
    for (int64_t j = 0; j < kv; j += kLanes) vstore(dr + j, vload(sr + j) * (vload(dr + j) - D) * scale);
  }
  float* dqi = dq + i0 * E;
  switch (E) {
    case 16: row_updates<R, 1>(qi, gi, k, qs, gs, ks, dqi, dk, dv, s, dp, Lp, keys); break;
    case 32: row_updates<R, 2>(qi, gi, k, qs, gs, ks, dqi, dk, dv, s, dp, Lp, keys); break;
    case 48: row_updates<R, 3>(qi, gi, k, qs, gs, ks, dqi, dk, dv, s, dp, Lp, keys); break;
    case 64: row_updates<R, 4>(qi, gi, k, qs, gs, ks, dqi, dk, dv, s, dp, Lp, keys); break;
    default:
      for (int r = 0; r < R; ++r) {
        const float* qr = qi + r * qs;
        const float* gr = gi + r * gs;
        float* dqr = dqi + r * E;
        for (int64_t j = 0; j < keys; ++j) {
          const float dsj = dp[r * Lp + j], pj = s[r * Lp + j];
          const float* kj = k + j * ks;
          float* dkj = dk + j * E;
          float* dvj = dv + j * E;
#pragma omp simd
          for (int64_t e = 0; e < E; ++e) {
            dqr[e] += dsj * kj[e];
            dkj[e] += dsj * qr[e];
            dvj[e] += pj * gr[e];
          }
        }
      }
  }
}

/// Slice b in f32, four query rows at a time. kt and vt: [E, Lp] scratch; s and dp: 4·Lp each.
__attribute__((target_clones("avx512f", "default"))) void slice_f32(const Slices<float>& P, int64_t b, float* kt,
                                                                     float* vt, float* s, float* dp) {
  const int64_t L = P.L, E = P.E, n = L * E, Lp = (L + kLanes - 1) / kLanes * kLanes;
  const float *q = P.q + P.qo[b], *k = P.k + P.ko[b], *v = P.v + P.vo[b], *g = P.g + P.go[b];
  float *dq = P.out + b * n, *dk = P.out + (P.BH + b) * n, *dv = P.out + (2 * P.BH + b) * n;
  // kt and vt: 16×16 blocks through registers, the ragged edges (and the zero padding past L) by scalars
  const int64_t L16 = L / kLanes * kLanes, E16 = E / kLanes * kLanes;
  for (int64_t j = 0; j < L16; j += kLanes)
    for (int64_t e = 0; e < E16; e += kLanes) {
      transpose16(k + j * P.ks + e, P.ks, kt + e * Lp + j, Lp);
      transpose16(v + j * P.vs + e, P.vs, vt + e * Lp + j, Lp);
    }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = e < E16 ? L16 : 0; j < Lp; ++j) {
      kt[e * Lp + j] = j < L ? k[j * P.ks + e] : 0.0f;
      vt[e * Lp + j] = j < L ? v[j * P.vs + e] : 0.0f;
    }
  int64_t i = 0;
  for (; i + 4 <= L; i += 4) rows_f32<4>(P, q, k, g, dq, dk, dv, kt, vt, s, dp, Lp, i);
  if (i + 2 <= L) rows_f32<2>(P, q, k, g, dq, dk, dv, kt, vt, s, dp, Lp, i), i += 2;
  if (i < L) rows_f32<1>(P, q, k, g, dq, dk, dv, kt, vt, s, dp, Lp, i);
}

std::vector<Tensor> kernel_sdpa_backward(std::span<const Tensor> in, const Attrs& a,
                                         std::span<const TensorMeta> m) {
  Tensor out = empty_like_meta(m[0]);
  const Tensor& q0 = in[1];
  const int64_t L = q0.size(-2).guard_int(), E = q0.size(-1).guard_int();
  const int64_t BH = L * E == 0 ? 0 : q0.int_numel() / (L * E);
  const double scale = a.has("scale") ? a.f("scale") : 1.0 / std::sqrt(static_cast<double>(E));
  const bool causal = a.has("is_causal") && a.b("is_causal");
  if (q0.dtype() == DType::F64) {
    Tensor g = core::contiguous_copy(in[0]), q = core::contiguous_copy(in[1]), k = core::contiguous_copy(in[2]),
           v = core::contiguous_copy(in[3]);
    double* po = out.data_ptr<double>();
    std::fill(po, po + out.int_numel(), 0.0);
    const Slices<double> P{g.data_ptr<double>(), q.data_ptr<double>(), k.data_ptr<double>(), v.data_ptr<double>(),
                           po, BH, L, E, scale, causal};
    parallel_for(BH, 3 * L * L * E, [&](int64_t lo, int64_t hi) {
      std::vector<double> p(static_cast<size_t>(L)), ds(static_cast<size_t>(L));
      for (int64_t b = lo; b < hi; ++b) slice_plain(P, b, p, ds);
    });
  } else {
    // Rows read in place where the last dim is contiguous (the heads of a fused QKV projection are
    // permuted views); otherwise a contiguous copy first.
    std::array<Tensor, 4> t;
    std::array<std::vector<int64_t>, 4> offsets;
    std::array<int64_t, 4> row_stride{};
    const IntVec qsizes = q0.int_sizes();
    const IntVec lead(qsizes.begin(), qsizes.end() - 2);
    for (size_t a = 0; a < 4; ++a) {
      t[a] = in[a].int_strides().back() == 1 || E <= 1 ? in[a] : core::contiguous_copy(in[a]);
      const IntVec st = t[a].int_strides();
      row_stride[a] = L <= 1 ? E : st[st.size() - 2];
      offsets[a].assign(static_cast<size_t>(BH), 0);
      for (int64_t b = 0; b < BH; ++b) {  // slice b's offset: b unravelled over the leading dims
        int64_t rest = b, off = 0;
        for (size_t d = lead.size(); d-- > 0;) {
          off += (rest % lead[d]) * st[d];
          rest /= lead[d];
        }
        offsets[a][static_cast<size_t>(b)] = off;
      }
    }
    float* po = out.data_ptr<float>();
    // dk and dv accumulate over query rows; dq rows are stored whole by row_updates when E is 16, 32,
    // 48 or 64 (the other widths accumulate them too)
    const bool dq_stored = E == 16 || E == 32 || E == 48 || E == 64;
    std::fill(po + (dq_stored ? BH * L * E : 0), po + out.int_numel(), 0.0f);
    Slices<float> P{t[0].data_ptr<float>(), t[1].data_ptr<float>(), t[2].data_ptr<float>(), t[3].data_ptr<float>(),
                    po, BH, L, E, scale, causal};
    P.go = offsets[0].data(), P.qo = offsets[1].data(), P.ko = offsets[2].data(), P.vo = offsets[3].data();
    P.gs = row_stride[0], P.qs = row_stride[1], P.ks = row_stride[2], P.vs = row_stride[3];
    const int64_t Lp = (L + kLanes - 1) / kLanes * kLanes;
    parallel_for(BH, 3 * L * L * E, [&](int64_t lo, int64_t hi) {
      std::vector<float> kt(static_cast<size_t>(E * Lp)), vt(kt.size()), s(static_cast<size_t>(4 * Lp)), dp(s.size());
      for (int64_t b = lo; b < hi; ++b) slice_f32(P, b, kt.data(), vt.data(), s.data(), dp.data());
    });
  }
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(scaled_dot_product_attention_backward, meta_sdpa_backward, kernel_sdpa_backward);

}  // namespace protean::ops
