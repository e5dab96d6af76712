#include "backend/cuda/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "backend/cuda/codegen.h"
#include "backend/cuda/pipeline.h"
#include "ir/sym_util.h"
#include "loop/c_expr.h"
#include "observe/env.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

using namespace loop;

namespace {

sym::Expr product(const std::vector<sym::Expr>& d, size_t from, size_t to) {
  sym::Expr n = sym::integer(1);
  for (size_t i = from; i < d.size() && i < to; ++i) n = sym::mul(n, d[i]);
  return simplify_index(n);
}

// Query rows per block: one warp per 16 rows. 32 (two warps) gives GPT-2 small 96 blocks at length
// 256 (12 heads) where 64 gave 48 on 132 multiprocessors; the key and value tiles are staged once per
// block, so smaller tiles read them more often (from L2).
constexpr int kQueryTile = 32;
// Key split: KSPLIT warps per 16 query rows, each taking one part of every key tile; the parts'
// online softmax states merge at the end. 2 (the default): tiles of 64 keys, 32 per warp; 1: one warp
// per 16 rows; 4: tiles of 128 keys in dynamic shared memory, 32 per warp, half as many tiles along a
// long causal row. PROTEAN_CUDA_ATTENTION_KEY_SPLIT=1|2|4. On the H200, GPT-2 small's attention at
// length 512 took the same time with 4 as with 2 (ncu: 158.8 against 160.9 us for the 12 layers;
// reduce-overhead latency 0.578-0.588 against 0.579-0.586 ms), and 4 was 1-3 % slower at lengths 37-64.
int key_split() { return observe::env_choice("PROTEAN_CUDA_ATTENTION_KEY_SPLIT", {1, 2, 4}, 2); }

// The kernel body. QT: query rows per block; NT: its threads; HD: head dim; MMA: the operand type of
// mma.sync; CVT2: the f32 pair -> 16-bit pair conversion; MASK_*: how the mask is read (absent, or its
// batch stride and its row / column strides).
// The tile loads. Aligned: 16 bytes per load (every offset and row stride of q, k and v a multiple of 8
// elements, the buffers 16-byte aligned: VariantRule); general: 4 bytes per load.
constexpr const char* kTileLoadAligned = R"CUDA(#pragma unroll LOAD_UNROLL
    for (int it = 0; it < KTILE * (HD / 8) / NT; ++it) {
      const int i = threadIdx.x + it * NT;
      const int row = i / (HD / 8), c8 = (i % (HD / 8)) * 8;
      const long long kr = k0 + row;
      pt_attn_v16 kv = {0u, 0u, 0u, 0u}, vv = {0u, 0u, 0u, 0u};
      if (kr < S) {
        kv = *reinterpret_cast<const pt_attn_v16*>(kb + kr * k_rs + c8);
        vv = *reinterpret_cast<const pt_attn_v16*>(vb + kr * v_rs + c8);
      }
      *reinterpret_cast<pt_attn_v16*>(&ks[row][c8]) = kv;
      *reinterpret_cast<pt_attn_v16*>(&vs[row][c8]) = vv;
    }
)CUDA";
constexpr const char* kTileLoadGeneral = R"CUDA(#pragma unroll 4
    for (int it = 0; it < KTILE * (HD / 2) / NT; ++it) {
      const int i = threadIdx.x + it * NT;
      const int row = i / (HD / 2), c2 = (i % (HD / 2)) * 2;
      const long long kr = k0 + row;
      unsigned kv = 0u, vv = 0u;
      if (kr < S) {
        kv = *reinterpret_cast<const unsigned*>(kb + kr * k_rs + c2);
        vv = *reinterpret_cast<const unsigned*>(vb + kr * v_rs + c2);
      }
      *reinterpret_cast<unsigned*>(&ks[row][c2]) = kv;
      *reinterpret_cast<unsigned*>(&vs[row][c2]) = vv;
    }
)CUDA";

// Pipelined (aligned variant, head dims up to 64): the tiles are copied by cp.async straight into
// shared memory (16 bytes per copy, zero-filled past S), two buffers: the first tile's copies are
// issued before the loop, and each step issues the next tile's into the other buffer before it waits
// for its own, so the global loads of tile j+1 overlap the products of tile j. The barrier at the top
// of a step keeps the other buffer's last readers ahead of its overwrite.
constexpr const char* kTileIssueAsync = R"CUDA(    if ((KT0) < kend) {
      const long long kt = (KT0);
      const unsigned short* ksrc = k_thr + kt * k_rs;
      const unsigned short* vsrc = v_thr + kt * v_rs;
      const long long rem = S - kt - ld_row;  // this thread's rows it * LD_RSTEP below rem hold keys
      const unsigned kd = kdst0 + (DST) * (KTILE * (HD + 8) * 2), vd = vdst0 + (DST) * (KTILE * (HD + 8) * 2);
#pragma unroll
      for (int it = 0; it < KTILE * (HD / 8) / NT; ++it) {
        const bool in = it * LD_RSTEP < rem;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(kd + it * LD_RSTEP * (HD + 8) * 2), "l"(in ? ksrc + it * k_step : kb), "r"(in ? 16 : 0) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(vd + it * LD_RSTEP * (HD + 8) * 2), "l"(in ? vsrc + it * v_step : vb), "r"(in ? 16 : 0) : "memory");
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
)CUDA";
// What every tile's copies share, computed once: this thread's row (then every LD_RSTEP rows) and
// 16-byte column of a tile, its source pointers at key 0 and its shared addresses in buffer 0.
constexpr const char* kTileIssueSetup = R"CUDA(  const int ld_row = threadIdx.x / (HD / 8), ld_c8 = (threadIdx.x % (HD / 8)) * 8;
  const unsigned short* k_thr = kb + ld_row * k_rs + ld_c8;
  const unsigned short* v_thr = vb + ld_row * v_rs + ld_c8;
  const long long k_step = (long long)LD_RSTEP * k_rs, v_step = (long long)LD_RSTEP * v_rs;
  const unsigned kdst0 = pt_attn_smem(&ksb[0][ld_row][ld_c8]), vdst0 = pt_attn_smem(&vsb[0][ld_row][ld_c8]);
)CUDA";

// Each step issues the tile NBUF - 1 ahead into the buffer the previous step used (every warp is
// past it: the barrier above), then waits until at most NBUF - 1 copy groups are pending, which is
// this step's tile (one group per tile, empty past the last, so the count is the same on every step).
constexpr const char* kTileLoadPipelined = R"CUDA(ISSUE_NEXT
    asm volatile("cp.async.wait_group WAIT_PENDING;" ::: "memory");
)CUDA";

constexpr const char* kBody = R"CUDA(
  const long long nqt = (L + QT - 1) / QT;
  // the longest query tiles (causal: the last ones) start first
  const long long q0 = (nqt - 1 - (long long)blockIdx.x % nqt) * QT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // warp (qw, kh): query rows qw * 16 .. + 15 of the tile against key part kh (of KSPLIT) of every tile
  const int qw = warp % (QT / 16), kh = warp / (QT / 16);
  // NBUF tiles of keys and values: 2 when the next tile's copies run while this one is used
  // NBUF tiles of KTILE keys and of their values in dynamic shared memory (the launch's shared bytes:
  // over 48 KiB with four warps per 16 rows)
  extern __shared__ __align__(16) unsigned char pt_attn_dyn[];
  unsigned short (*ksb)[KTILE][HD + 8] = reinterpret_cast<unsigned short (*)[KTILE][HD + 8]>(pt_attn_dyn);
  unsigned short (*vsb)[KTILE][HD + 8] = reinterpret_cast<unsigned short (*)[KTILE][HD + 8]>(pt_attn_dyn + NBUF * KTILE * (HD + 8) * 2);
  const unsigned short* qb = q + q_off;
  const unsigned short* kb = k + k_off;
  const unsigned short* vb = v + v_off;
  const long long r0 = q0 + qw * 16 + g, r1 = r0 + 8;
  // this warp's 16 query rows as mma A fragments (rows r0 and r1, columns 2t, 2t + 1, + 8)
  unsigned qa[HD / 16][4];
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    qa[kk][0] = r0 < L ? *reinterpret_cast<const unsigned*>(qb + r0 * q_rs + kk * 16 + 2 * t) : 0u;
    qa[kk][1] = r1 < L ? *reinterpret_cast<const unsigned*>(qb + r1 * q_rs + kk * 16 + 2 * t) : 0u;
    qa[kk][2] = r0 < L ? *reinterpret_cast<const unsigned*>(qb + r0 * q_rs + kk * 16 + 8 + 2 * t) : 0u;
    qa[kk][3] = r1 < L ? *reinterpret_cast<const unsigned*>(qb + r1 * q_rs + kk * 16 + 8 + 2 * t) : 0u;
  }
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  const float ninf = -pt::inf_f();
  float m0 = ninf, m1 = ninf, l0 = 0.f, l1 = 0.f;  // running max and (per-lane partial) sum of rows r0, r1
  const long long kend = CAUSAL ? (S < q0 + QT ? S : q0 + QT) : S;  // causal: key tiles past the last row are skipped
KV_FIRST
  int buf = 0;
  for (long long k0 = 0; k0 < kend; k0 += KTILE, BUF_NEXT) {
    unsigned short (&ks)[KTILE][HD + 8] = ksb[buf];
    unsigned short (&vs)[KTILE][HD + 8] = vsb[buf];
    __syncthreads();
    // the key and value tiles [KTILE][HD], zeros past S (a zero value row: a masked key's weight is 0,
    // and 0 * garbage could be NaN)
TILE_LOAD
    __syncthreads();
    // scores of this warp's rows against its 8 WNB keys of the tile (part kh): s[nb] holds (r0,
    // key nk*8+2t), (r0, +1), (r1, nk*8+2t), (r1, +1) with nk = kh*WNB + nb
    float s[WNB][4];
#pragma unroll
    for (int nb = 0; nb < WNB; ++nb) {
      const int nk = kh * (WNB) + nb;
      s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
      // K's B fragments of two 16-dim steps at once: ldmatrix gives lane (g, t) key nk*8 + g, dims
      // 2t, 2t + 1 of each 8x8 block (lanes 0-7, 8-15, 16-23, 24-31 address the blocks' rows at dims
      // kk*16, + 8, + 16, + 24); an odd last step takes two blocks
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk += 2) {
        unsigned b[4];
        if (kk + 1 < HD / 16) {
          const unsigned addr = pt_attn_smem(&ks[nk * 8 + (lane & 7)][kk * 16 + (lane >> 3) * 8]);
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                       : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3]) : "r"(addr));
        } else {
          const unsigned addr = pt_attn_smem(&ks[nk * 8 + (lane & 7)][kk * 16 + ((lane >> 3) & 1) * 8]);
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(addr));
          b[2] = b[3] = 0u;
        }
#pragma unroll
        for (int h = 0; h < 2 && kk + h < HD / 16; ++h)
          asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA.MMA.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                       : "+f"(s[nb][0]), "+f"(s[nb][1]), "+f"(s[nb][2]), "+f"(s[nb][3])
                       : "r"(qa[kk + h][0]), "r"(qa[kk + h][1]), "r"(qa[kk + h][2]), "r"(qa[kk + h][3]), "r"(b[2 * h]),
                         "r"(b[2 * h + 1]));
      }
    }
    // Scores stay in the units the exponent takes them in: raw dot products (PSCALE = scale·log2 e
    // applied inside the exponent's fma) for an unmasked positive scale, else scaled by SSCALE =
    // scale·log2 e (an additive mask by log2 e) and PSCALE = 1. Only a tile that reaches past S or,
    // causal, past this warp's first row is masked element by element: the others take the scores as
    // they are (on a long causal row, every tile but the last).
    float mx0 = ninf, mx1 = ninf;
    const long long last_key = k0 + (kh + 1) * (WNB * 8) - 1;
    if (HAS_MASK || last_key >= S || (CAUSAL && last_key > q0 + qw * 16)) {
#pragma unroll
      for (int nb = 0; nb < WNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const long long row = e < 2 ? r0 : r1, key = k0 + (kh * (WNB) + nb) * 8 + 2 * t + (e & 1);
          float x = s[nb][e] * SSCALE;
          if (key >= S || (CAUSAL && key > row)) x = ninf;
          else if (HAS_MASK && row < L) x += (MASK_LOAD) * MSCALE;
          s[nb][e] = x;
        }
        mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < WNB; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nb][e] *= SSCALE;
        mx0 = fmaxf(mx0, fmaxf(s[nb][0], s[nb][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nb][2], s[nb][3]));
      }
    }
    mx0 = pt_attn_quad_max(mx0);
    mx1 = pt_attn_quad_max(mx1);
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    // a row with no unmasked key yet keeps base 0 (exp(-inf - 0) = 0, never -inf - -inf)
    const float b0 = n0 == ninf ? 0.f : n0, b1 = n1 == ninf ? 0.f : n1;
    const float nb0 = -b0 * PSCALE, nb1 = -b1 * PSCALE;
    // The sum and the output are rescaled when a row's max grew (LAZY_RESCALE: only then, voted over
    // the warp; on a long row that is mostly its first tiles). Where no max of the warp's rows grew,
    // every factor is exp2(0) = 1 (or 0 times an output and sum that are still 0), so skipping them
    // changes no bit.
    if (LAZY_RESCALE) {
      const float c0 = pt_attn_ex2((m0 - b0) * PSCALE), c1 = pt_attn_ex2((m1 - b1) * PSCALE);
      l0 *= c0;
      l1 *= c1;
#pragma unroll
      for (int i = 0; i < HD / 8; ++i) {
        o[i][0] *= c0;
        o[i][1] *= c0;
        o[i][2] *= c1;
        o[i][3] *= c1;
      }
    }
    m0 = n0;
    m1 = n1;
#pragma unroll
    for (int nb = 0; nb < WNB; ++nb) {
      s[nb][0] = pt_attn_ex2(fmaf(s[nb][0], PSCALE, nb0));
      s[nb][1] = pt_attn_ex2(fmaf(s[nb][1], PSCALE, nb0));
      s[nb][2] = pt_attn_ex2(fmaf(s[nb][2], PSCALE, nb1));
      s[nb][3] = pt_attn_ex2(fmaf(s[nb][3], PSCALE, nb1));
      l0 += s[nb][0] + s[nb][1];
      l1 += s[nb][2] + s[nb][3];
    }
    // o += P·V: P's accumulator layout is the A fragment layout of the next product
#pragma unroll
    for (int kk = 0; kk < WKV; ++kk) {
      const int kv = kh * (WKV) + kk;  // this warp's keys kv*16 .. + 15 of the tile
      const unsigned a0 = CVT2(s[2 * kk][1], s[2 * kk][0]), a1 = CVT2(s[2 * kk][3], s[2 * kk][2]);
      const unsigned a2 = CVT2(s[2 * kk + 1][1], s[2 * kk + 1][0]), a3 = CVT2(s[2 * kk + 1][3], s[2 * kk + 1][2]);
      // V's B fragments of two 8-column blocks at once, transposed by ldmatrix from the row-major
      // tile: lanes 0-7 / 8-15 address keys kk*16 + 0..7 / 8..15 of block nd, lanes 16-31 the same of
      // block nd + 1
#pragma unroll
      for (int nd = 0; nd < HD / 8; nd += 2) {
        unsigned v0, v1, v2, v3;
        const unsigned addr = pt_attn_smem(&vs[kv * 16 + (lane & 15)][(nd + (lane >> 4)) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v0), "=r"(v1), "=r"(v2), "=r"(v3) : "r"(addr));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA.MMA.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(o[nd][0]), "+f"(o[nd][1]), "+f"(o[nd][2]), "+f"(o[nd][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(v0), "r"(v1));
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.MMA.MMA.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(o[nd + 1][0]), "+f"(o[nd + 1][1]), "+f"(o[nd + 1][2]), "+f"(o[nd + 1][3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(v2), "r"(v3));
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // the key parts of each row meet, halving each round: the warps of parts half .. 2 half - 1 hand
  // their running max, sum and output to those of parts 0 .. half - 1 through the first key buffer
  // (KSPLIT slots of 16 HD + 128 floats at most: exactly one buffer's bytes, KTILE = 32 KSPLIT or 64),
  // which rescale both to the larger max
#pragma unroll
  for (int half = KSPLIT / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (kh >= half && kh < 2 * half) {
      float* mrg = reinterpret_cast<float*>(&ksb[0][0][0]) + (qw * half + kh - half) * (HD * 16 + 128);
#pragma unroll
      for (int nd = 0; nd < HD / 8; ++nd)
#pragma unroll
        for (int e = 0; e < 4; ++e) mrg[(nd * 32 + lane) * 4 + e] = o[nd][e];
      mrg[HD * 16 + lane * 4 + 0] = m0;
      mrg[HD * 16 + lane * 4 + 1] = m1;
      mrg[HD * 16 + lane * 4 + 2] = l0;
      mrg[HD * 16 + lane * 4 + 3] = l1;
    }
    __syncthreads();
    if (kh < half) {
      const float* mrg = reinterpret_cast<const float*>(&ksb[0][0][0]) + (qw * half + kh) * (HD * 16 + 128);
      float ca0, cb0, ca1, cb1;
      pt_attn_meet(m0, l0, mrg[HD * 16 + lane * 4 + 0], mrg[HD * 16 + lane * 4 + 2], PSCALE, ca0, cb0);
      pt_attn_meet(m1, l1, mrg[HD * 16 + lane * 4 + 1], mrg[HD * 16 + lane * 4 + 3], PSCALE, ca1, cb1);
#pragma unroll
      for (int nd = 0; nd < HD / 8; ++nd) {
        o[nd][0] = o[nd][0] * ca0 + mrg[(nd * 32 + lane) * 4 + 0] * cb0;
        o[nd][1] = o[nd][1] * ca0 + mrg[(nd * 32 + lane) * 4 + 1] * cb0;
        o[nd][2] = o[nd][2] * ca1 + mrg[(nd * 32 + lane) * 4 + 2] * cb1;
        o[nd][3] = o[nd][3] * ca1 + mrg[(nd * 32 + lane) * 4 + 3] * cb1;
      }
    }
  }
  if (kh != 0) return;
  const float i0 = l0 == 0.f ? 0.f : 1.f / l0, i1 = l1 == 0.f ? 0.f : 1.f / l1;  // a fully masked row: zeros
  unsigned short* ob = out + o_off;
#pragma unroll
  for (int nd = 0; nd < HD / 8; ++nd) {
    if (r0 < L) *reinterpret_cast<unsigned*>(ob + r0 * o_rs + nd * 8 + 2 * t) = CVT2(o[nd][1] * i0, o[nd][0] * i0);
    if (r1 < L) *reinterpret_cast<unsigned*>(ob + r1 * o_rs + nd * 8 + 2 * t) = CVT2(o[nd][3] * i1, o[nd][2] * i1);
  }
}
)CUDA";

// The Hopper form of the aligned variant (head dim 64, no loaded mask; PROTEAN_CUDA_ATTENTION_WGMMA):
// Q·Kᵀ and P·V as warp-group MMAs (wgmma.mma_async m64n64k16, f32 accumulators), 8 a warp group per 64
// keys, where the mma.sync form issues 32 mma.sync and 16 ldmatrix a warp per key tile. A block takes 64 query rows and NWG warp groups; each warp
// group takes its own 64 keys of every tile of 64·NWG keys (its running max, sum and output merged at
// the end, halving each round, as the key split of the mma.sync form does). Q, K and V tiles are copied
// by cp.async into shared memory in the 128-byte swizzled layout the MMA descriptors name (16-byte
// piece c of row r at c ^ (r % 8), 8-row groups 1024 bytes apart: TMA's 128-byte mode), two buffers.
// P goes from the scores' accumulators to the A registers of P·V (the accumulator layout of m64n64 is
// the A fragment layout of m64nNk16), so it never touches shared memory.
constexpr const char* kWgmmaHelpers = R"CUDA(
#ifndef PT_ATTN_WGMMA
#define PT_ATTN_WGMMA
// the descriptor of a tile of 128-byte rows in the 128-byte swizzle, 8-row groups 1024 bytes apart
__device__ __forceinline__ unsigned long long pt_attn_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
#define PT_ATTN_ACC32(X) "+f"(X[0]), "+f"(X[1]), "+f"(X[2]), "+f"(X[3]), "+f"(X[4]), "+f"(X[5]), "+f"(X[6]), \
  "+f"(X[7]), "+f"(X[8]), "+f"(X[9]), "+f"(X[10]), "+f"(X[11]), "+f"(X[12]), "+f"(X[13]), "+f"(X[14]), "+f"(X[15]), \
  "+f"(X[16]), "+f"(X[17]), "+f"(X[18]), "+f"(X[19]), "+f"(X[20]), "+f"(X[21]), "+f"(X[22]), "+f"(X[23]), \
  "+f"(X[24]), "+f"(X[25]), "+f"(X[26]), "+f"(X[27]), "+f"(X[28]), "+f"(X[29]), "+f"(X[30]), "+f"(X[31])
#define PT_ATTN_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
// d[64 x 64] += A[64 x 16] (K-major, shared) . B[16 x 64] (K-major, shared: rows of K)
#define PT_ATTN_QK(T) \
__device__ __forceinline__ void pt_attn_qk_##T(float* d, unsigned long long da, unsigned long long db) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." #T "." #T " " PT_ATTN_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : PT_ATTN_ACC32(d) : "l"(da), "l"(db), "r"(1)); \
}
// d[64 x 64] += A[64 x 16] (registers) . B[16 x 64] (N-major, shared: rows of V)
#define PT_ATTN_PV(T) \
__device__ __forceinline__ void pt_attn_pv_##T(float* d, const unsigned* a, unsigned long long db) { \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." #T "." #T " " PT_ATTN_REGS32 \
               ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n" \
               : PT_ATTN_ACC32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)); \
}
PT_ATTN_QK(bf16)
PT_ATTN_QK(f16)
PT_ATTN_PV(bf16)
PT_ATTN_PV(f16)
#endif
)CUDA";

// The Hopper form's body (after the kernel's prologue: BH, L, S, bh, the operands' offsets and row
// strides). Each thread copies the 16-byte pieces ld_c of rows ld_row, + NT / 8, ... of every tile,
// zero-filled past L or S (src-size 0).
constexpr const char* kWgmmaBody = R"CUDA(
  const long long nqt = (L + 63) / 64;
  // the longest query tiles (causal: the last ones) start first
  const long long q0 = (nqt - 1 - (long long)blockIdx.x % nqt) * 64;
  const int tid = threadIdx.x, wg = tid >> 7, wt = tid & 127, w4 = wt >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  extern __shared__ __align__(16) unsigned char pt_attn_dyn[];
  // 1024-aligned (the swizzle): Q [64][64], then 2 buffers of K [64 NWG][64] and V [64 NWG][64]
  unsigned char* sm = reinterpret_cast<unsigned char*>((reinterpret_cast<unsigned long long>(pt_attn_dyn) + 1023) & ~1023ull);
  const unsigned qs = pt_attn_smem(sm), kv0 = qs + 8192;
  constexpr unsigned KVB = 64 * NWG * 128;  // one tile of K (or V) in bytes
  const unsigned short* qb = q + q_off;
  const unsigned short* kb = k + k_off;
  const unsigned short* vb = v + v_off;
  const int ld_row = tid >> 3, ld_c = tid & 7;
  constexpr int RSTEP = NT / 8;
#pragma unroll
  for (int it = 0; it < 64 / RSTEP; ++it) {
    const int r = ld_row + it * RSTEP;
    const bool in = q0 + r < L;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(qs + r * 128 + ((ld_c ^ (r & 7)) << 4)),
                 "l"(in ? qb + (q0 + r) * q_rs + ld_c * 8 : qb), "r"(in ? 16 : 0) : "memory");
  }
  const long long kend = CAUSAL ? (S < q0 + 64 ? S : q0 + 64) : S;  // causal: key tiles past the last row are skipped
  // the tile of keys kt .. kt + 64 NWG - 1 into buffer b
#define PT_ATTN_ISSUE(kt, b) \
  _Pragma("unroll") for (int it = 0; it < 64 * NWG / RSTEP; ++it) { \
    const int r = ld_row + it * RSTEP; \
    const long long key = (kt) + r; \
    const bool in = key < S; \
    const unsigned dk = kv0 + (b) * 2 * KVB + r * 128 + ((ld_c ^ (r & 7)) << 4); \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dk), "l"(in ? kb + key * k_rs + ld_c * 8 : kb), \
                 "r"(in ? 16 : 0) : "memory"); \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dk + KVB), "l"(in ? vb + key * v_rs + ld_c * 8 : vb), \
                 "r"(in ? 16 : 0) : "memory"); \
  }
  if (kend > 0) { PT_ATTN_ISSUE(0, 0) }
  asm volatile("cp.async.commit_group;" ::: "memory");
  float o[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.f;
  const float ninf = -pt::inf_f();
  float m0 = ninf, m1 = ninf, l0 = 0.f, l1 = 0.f;  // running max and (per-lane partial) sum of rows r0, r1
  const long long r0 = q0 + w4 * 16 + g, r1 = r0 + 8;
  int buf = 0;
  for (long long k0 = 0; k0 < kend; k0 += 64 * NWG, buf ^= 1) {
    __syncthreads();  // every warp group is past the other buffer's last reads
    if (k0 + 64 * NWG < kend) { PT_ATTN_ISSUE(k0 + 64 * NWG, buf ^ 1) }
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    // the copies are generic-proxy writes; the MMAs read shared memory through the async proxy
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const long long kw = k0 + 64 * wg;  // this warp group's 64 keys
    if (kw < kend) {
      const unsigned kt = kv0 + buf * 2 * KVB + wg * 8192, vt = kt + KVB;
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) pt_attn_qk_MMA(s, pt_attn_desc(qs + 32 * kk), pt_attn_desc(kt + 32 * kk));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      // s[4 nb + e]: (r0, key kw + nb*8 + 2t), (r0, +1), (r1, ...), (r1, +1); masked element by element only
      // in a tile reaching past S or, causal, past this warp's first row
      float mx0 = ninf, mx1 = ninf;
      const long long last_key = kw + 63;
      if (last_key >= S || (CAUSAL && last_key > q0 + w4 * 16)) {
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const long long row = e < 2 ? r0 : r1, key = kw + nb * 8 + 2 * t + (e & 1);
            float x = s[4 * nb + e] * SSCALE;
            if (key >= S || (CAUSAL && key > row)) x = ninf;
            s[4 * nb + e] = x;
          }
          mx0 = fmaxf(mx0, fmaxf(s[4 * nb], s[4 * nb + 1]));
          mx1 = fmaxf(mx1, fmaxf(s[4 * nb + 2], s[4 * nb + 3]));
        }
      } else {
#pragma unroll
        for (int nb = 0; nb < 8; ++nb) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[4 * nb + e] *= SSCALE;
          mx0 = fmaxf(mx0, fmaxf(s[4 * nb], s[4 * nb + 1]));
          mx1 = fmaxf(mx1, fmaxf(s[4 * nb + 2], s[4 * nb + 3]));
        }
      }
      mx0 = pt_attn_quad_max(mx0);
      mx1 = pt_attn_quad_max(mx1);
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      // a row with no unmasked key yet keeps base 0 (exp(-inf - 0) = 0, never -inf - -inf)
      const float b0 = n0 == ninf ? 0.f : n0, b1 = n1 == ninf ? 0.f : n1;
      const float nb0 = -b0 * PSCALE, nb1 = -b1 * PSCALE;
      const float c0 = pt_attn_ex2((m0 - b0) * PSCALE), c1 = pt_attn_ex2((m1 - b1) * PSCALE);
      l0 *= c0;
      l1 *= c1;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        o[4 * i] *= c0;
        o[4 * i + 1] *= c0;
        o[4 * i + 2] *= c1;
        o[4 * i + 3] *= c1;
      }
      m0 = n0;
      m1 = n1;
      unsigned a[4][4];
#pragma unroll
      for (int nb = 0; nb < 8; ++nb) {
        s[4 * nb] = pt_attn_ex2(fmaf(s[4 * nb], PSCALE, nb0));
        s[4 * nb + 1] = pt_attn_ex2(fmaf(s[4 * nb + 1], PSCALE, nb0));
        s[4 * nb + 2] = pt_attn_ex2(fmaf(s[4 * nb + 2], PSCALE, nb1));
        s[4 * nb + 3] = pt_attn_ex2(fmaf(s[4 * nb + 3], PSCALE, nb1));
        l0 += s[4 * nb] + s[4 * nb + 1];
        l1 += s[4 * nb + 2] + s[4 * nb + 3];
        // keys 16 kk .. + 15 as the A fragment of P·V: (r0, 2t..), (r1, 2t..), (r0, 2t + 8..), (r1, 2t + 8..)
        a[nb >> 1][(nb & 1) * 2] = CVT2(s[4 * nb + 1], s[4 * nb]);
        a[nb >> 1][(nb & 1) * 2 + 1] = CVT2(s[4 * nb + 3], s[4 * nb + 2]);
      }
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) pt_attn_pv_MMA(o, a[kk], pt_attn_desc(vt + 2048 * kk));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    }
  }
#undef PT_ATTN_ISSUE
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  // the warp groups' parts of each row meet, halving each round, through the key and value buffers
  // (36 floats a thread, stored one array of 128 after another: no bank conflicts)
  float* mrg = reinterpret_cast<float*>(sm + 8192);
#pragma unroll
  for (int half = NWG / 2; half >= 1; half /= 2) {
    __syncthreads();
    if (wg >= half && wg < 2 * half) {
      float* my = mrg + (wg - half) * 36 * 128;
#pragma unroll
      for (int i = 0; i < 32; ++i) my[i * 128 + wt] = o[i];
      my[32 * 128 + wt] = m0;
      my[33 * 128 + wt] = m1;
      my[34 * 128 + wt] = l0;
      my[35 * 128 + wt] = l1;
    }
    __syncthreads();
    if (wg < half) {
      const float* my = mrg + wg * 36 * 128;
      float ca0, cb0, ca1, cb1;
      pt_attn_meet(m0, l0, my[32 * 128 + wt], my[34 * 128 + wt], PSCALE, ca0, cb0);
      pt_attn_meet(m1, l1, my[33 * 128 + wt], my[35 * 128 + wt], PSCALE, ca1, cb1);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        o[4 * i] = o[4 * i] * ca0 + my[(4 * i) * 128 + wt] * cb0;
        o[4 * i + 1] = o[4 * i + 1] * ca0 + my[(4 * i + 1) * 128 + wt] * cb0;
        o[4 * i + 2] = o[4 * i + 2] * ca1 + my[(4 * i + 2) * 128 + wt] * cb1;
        o[4 * i + 3] = o[4 * i + 3] * ca1 + my[(4 * i + 3) * 128 + wt] * cb1;
      }
    }
  }
  if (wg != 0) return;
  const float i0 = l0 == 0.f ? 0.f : 1.f / l0, i1 = l1 == 0.f ? 0.f : 1.f / l1;  // a fully masked row: zeros
  unsigned short* ob = out + o_off;
#pragma unroll
  for (int nd = 0; nd < 8; ++nd) {
    if (r0 < L) *reinterpret_cast<unsigned*>(ob + r0 * o_rs + nd * 8 + 2 * t) = CVT2(o[4 * nd + 1] * i0, o[4 * nd] * i0);
    if (r1 < L) *reinterpret_cast<unsigned*>(ob + r1 * o_rs + nd * 8 + 2 * t) = CVT2(o[4 * nd + 3] * i1, o[4 * nd + 2] * i1);
  }
}
)CUDA";

/// PROTEAN_CUDA_ATTENTION_PIPELINE=0: the aligned variant loads each tile, waits, then computes (no
/// cp.async double buffer). Default on.
/// Pipeline depth: key and value tiles in flight ahead of the one being used, plus that one.
/// PROTEAN_CUDA_ATTENTION_STAGES=2|3|4 (default 2: the next tile's copies overlap this tile's products;
/// 3 and 4 issue two and three tiles ahead, for rows whose steps are shorter than a copy's latency).
int attention_stages() {
  return static_cast<int>(observe::env_int("PROTEAN_CUDA_ATTENTION_STAGES", 2, 2, 4));
}
bool attention_pipeline() { return observe::env_on("PROTEAN_CUDA_ATTENTION_PIPELINE"); }

/// PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1: the running sum and output are rescaled only when one of the
/// warp's rows' max grew in the tile (voted; the same result bit for bit). Opt-in: on an H100 it made
/// neither the kernel nor GPT-2 faster (docs/cuda.md); by default they are rescaled at every key tile
/// (the factor is then 1 where no max grew).
bool attention_lazy_rescale() { return observe::env_opt_in("PROTEAN_CUDA_ATTENTION_LAZY_RESCALE"); }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

}  // namespace

bool attention_supported(const Program& p, const Extern& e, std::string& why) {
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  if (e.inputs.size() < 3 || e.outputs.size() != 1 || e.inputs[0] < 0 || e.inputs[1] < 0 || e.inputs[2] < 0) {
    why = "unexpected operands";
    return false;
  }
  const bool has_mask = e.inputs.size() > 3 && e.inputs[3] >= 0;
  const Buffer &q = buf(e.inputs[0]), &k = buf(e.inputs[1]), &v = buf(e.inputs[2]), &o = buf(e.outputs[0]);
  const DType t = q.dtype;
  if ((t != DType::BF16 && t != DType::F16) || k.dtype != t || v.dtype != t || o.dtype != t ||
      (has_mask && buf(e.inputs[3]).dtype != t)) {
    why = fmt::format("attention in {} (the fused kernel takes bf16 and f16, a mask of the same type)", short_name(t));
    return false;
  }
  const size_t r = q.sizes.size();
  if (r < 3 || k.sizes.size() != r || v.sizes.size() != r || o.sizes.size() != r) {
    why = "attention operands of rank below 3 or of different ranks";
    return false;
  }
  for (size_t d = 0; d + 2 < r; ++d)
    if (k.sizes[d] != q.sizes[d] || v.sizes[d] != q.sizes[d]) {
      why = "attention with broadcast batch dims (grouped heads)";
      return false;
    }
  const sym::Expr hd = q.sizes[r - 1];
  if (!hd->is_integer() || hd->value % 16 != 0 || hd->value > 128 || k.sizes[r - 1] != hd || v.sizes[r - 1] != hd ||
      v.sizes[r - 2] != k.sizes[r - 2]) {
    why = fmt::format("attention with head dims {} / {} / {} (the fused kernel takes equal head dims, a multiple of 16 up "
                      "to 128)", sym::print(hd), sym::print(k.sizes[r - 1]), sym::print(v.sizes[r - 1]));
    return false;
  }
  if (has_mask) {
    const Buffer& m = buf(e.inputs[3]);
    if (m.sizes.size() != r) {
      why = "an attention mask of another rank";
      return false;
    }
    bool ones = true, same = true;
    for (size_t d = 0; d + 2 < r; ++d) {
      ones = ones && m.sizes[d]->is_integer(1);
      same = same && m.sizes[d] == q.sizes[d];
    }
    const bool rows = m.sizes[r - 2] == q.sizes[r - 2], cols = m.sizes[r - 1] == k.sizes[r - 2];
    if ((!ones && !same) || (!rows && !m.sizes[r - 2]->is_integer(1)) || (!cols && !m.sizes[r - 1]->is_integer(1))) {
      why = "an attention mask that broadcasts partly";
      return false;
    }
  }
  return true;
}

int attention_wgmma_groups() { return observe::env_choice("PROTEAN_CUDA_ATTENTION_WGMMA", {0, 2, 4}, 2); }

int64_t attention_wgmma_from() {
  static const int64_t from = observe::env_int("PROTEAN_CUDA_ATTENTION_WGMMA_FROM", 321, 0, int64_t{1} << 40);
  return from;
}

bool attention_wants_sm90a(int major, int minor) { return major == 9 && minor == 0 && attention_wgmma_groups() > 0; }

std::optional<CudaKernel> attention_kernel(const Program& p, const Extern& e, const std::string& name, std::string& source,
                                           std::map<std::string, std::string>& entries, std::string& why,
                                           const std::map<int, AttentionView>* views, SizeArgs sizes, bool wgmma) {
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  if (!attention_supported(p, e, why)) return std::nullopt;
  const bool has_mask = e.inputs.size() > 3 && e.inputs[3] >= 0;
  const Buffer &q = buf(e.inputs[0]), &k = buf(e.inputs[1]);
  const DType t = q.dtype;
  const size_t r = q.sizes.size();
  const sym::Expr hd = q.sizes[r - 1];
  const sym::Expr BH = product(q.sizes, 0, r - 2), L = q.sizes[r - 2], S = k.sizes[r - 2];
  // the mask: batch dims all 1 (stride 0) or equal to q's (stride L*S); its rows L or 1, its columns S or 1
  std::string mask_load = "0.f", mask_form = "none";
  if (has_mask) {
    const Buffer& m = buf(e.inputs[3]);
    bool ones = true;
    for (size_t d = 0; d + 2 < r; ++d) ones = ones && m.sizes[d]->is_integer(1);
    const bool rows = m.sizes[r - 2] == L, cols = m.sizes[r - 1] == S;
    const std::string ms = cols ? "S" : "1";
    const std::string wide = t == DType::BF16 ? "pt::bf16_to_f32" : "pt::f16_to_f32";
    mask_load = fmt::format("{}(mask[{}{}{}])", wide, ones ? "" : "bh * (long long)(" + std::string(rows ? "L" : "1") + ") * " + ms + " + ",
                            rows ? "row * " + ms : std::string("0"), cols ? " + key" : "");
    mask_form = fmt::format("{}{}{}", ones ? "b1" : "bsame", rows ? "_rows" : "_row1", cols ? "_cols" : "_col1");
  }
  const bool causal = e.attrs.has("is_causal") && e.attrs.b("is_causal");
  const double scale = e.attrs.has("scale") ? e.attrs.f("scale") : 1.0 / std::sqrt(static_cast<double>(hd->value));
  const std::string mma = t == DType::BF16 ? "bf16" : "f16";
  // the aligned variant's Hopper form: warp groups per block (0: mma.sync)
  const int nwg = wgmma && hd->value == 64 && !has_mask ? attention_wgmma_groups() : 0;
  const std::string variant = fmt::format("{} hd{} mask {} causal {} scale {:.9g}{}", mma, hd->value, mask_form, causal, scale,
                                          nwg ? fmt::format(" wgmma {}", nwg) : std::string());

  CudaKernel kern;
  kern.name = name;
  std::vector<std::string> sig = {"const unsigned short* __restrict__ q", "const unsigned short* __restrict__ k",
                                  "const unsigned short* __restrict__ v"};
  // q, k, v and the output: their own dense buffers, or the buffers folded copies read or wrote
  // (fold_attention_views)
  std::vector<int> bufs = {e.inputs[0], e.inputs[1], e.inputs[2]};
  if (has_mask) {
    sig.push_back("const unsigned short* __restrict__ mask");
    bufs.push_back(e.inputs[3]);
  }
  sig.push_back("unsigned short* __restrict__ out");
  bufs.push_back(e.outputs[0]);
  std::vector<sym::Expr> size_exprs = {BH, L, S};
  std::string offsets;
  const CDialect dialect;
  const char* names[4] = {"q", "k", "v", "o"};
  std::vector<sym::Expr> align_exprs;  // k's and v's view offsets and strides (the aligned variant's rule)
  for (int j = 0; j < 4; ++j) {
    const AttentionView* vw = nullptr;
    if (views)
      if (auto it = views->find(j); it != views->end()) vw = &it->second;
    if (!vw) {
      offsets += fmt::format("  const long long {0}_off = bh * {1} * {2}, {0}_rs = {2};\n", names[j], j == 1 || j == 2 ? "S" : "L",
                             hd->value);
      continue;
    }
    (j < 3 ? bufs[static_cast<size_t>(j)] : bufs.back()) = vw->buffer;
    size_exprs.push_back(vw->offset);
    size_exprs.push_back(vw->row_stride);
    if (j == 1 || j == 2 || (j == 0 && nwg)) {
      align_exprs.push_back(vw->offset);
      align_exprs.push_back(vw->row_stride);
      for (const sym::Expr& bs : vw->batch_strides) align_exprs.push_back(bs);
    }
    std::string off = "(long long)(" + c_index(vw->offset, dialect) + ")";
    std::string dec = fmt::format("  long long {}_off = {};\n  {{\n    long long rem = bh;\n", names[j], off);
    const Buffer& x = buf(j < 3 ? e.inputs[static_cast<size_t>(j)] : e.outputs[0]);
    for (size_t d = r - 2; d-- > 0;) {
      size_exprs.push_back(vw->batch_strides[d]);
      size_exprs.push_back(x.sizes[d]);
      dec += fmt::format("    {0}_off += (rem % (long long)({1})) * (long long)({2});\n    rem /= (long long)({1});\n", names[j],
                         c_index(x.sizes[d], dialect), c_index(vw->batch_strides[d], dialect));
    }
    dec += fmt::format("  }}\n  const long long {}_rs = {};\n", names[j], c_index(vw->row_stride, dialect));
    offsets += dec;
  }
  for (int b : bufs) kern.params.push_back({ParamKind::Buffer, b, 0, 8});
  // the size symbols in a fixed order (BH's, L's, S's), so equal variants take equal parameter lists
  const bool from_memory = sizes == SizeArgs::FromMemory;
  std::string loads;
  if (!add_symbol_params(p, size_exprs, kern, sig, why, from_memory ? &loads : nullptr)) return std::nullopt;
  // a grid over more query tiles (sizes from memory): blocks past the last (batch, head) return
  const std::string past = from_memory ? "  if (bh >= BH) return;\n" : "";
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  // an equal variant with the same parameter list (buffers, then the same size symbols) is launched
  // through the first one's entry
  const std::string key = variant + " | " + params + " | " + c_index(BH, dialect) + " " + c_index(L, dialect) + " " +
                          c_index(S, dialect) + " | " + offsets;
  const int split = key_split(), threads = kQueryTile * 2 * split;
  // keys per tile: 32 per warp of a 16-row group, at least 64
  const int key_tile = std::max(64, 32 * split);
  // the key and value tiles' bytes: NBUF buffers of [key_tile][HD + 8] 16-bit elements each
  const int stages = attention_stages();
  // cp.async tiles: head dims up to 64 whose 16-byte columns divide the block's threads (each thread
  // then copies the same column of every LD_RSTEP-th row: 48 and 80 take the plain loads)
  const bool pipelined_tiles = hd->value <= 64 && threads % (hd->value / 8) == 0 && attention_pipeline();
  auto tile_bytes = [&](bool pipelined) {
    return static_cast<uint32_t>((pipelined ? stages : 1) * 2 * key_tile * (hd->value + 8) * 2);
  };
  std::string base;
  if (auto it = entries.find(key); it != entries.end()) {
    base = it->second;
  } else {
    base = name;
    std::string body = kBody;
    body = replace_all(body, "LAZY_RESCALE", attention_lazy_rescale() ? "__any_sync(0xffffffffu, n0 != m0 || n1 != m1)" : "true");
    body = replace_all(body, "MMA", mma);
    body = replace_all(body, "CVT2", t == DType::BF16 ? "pt_attn_cvt2_bf16" : "pt_attn_cvt2_f16");
    body = replace_all(body, "CAUSAL", causal ? "true" : "false");
    body = replace_all(body, "HAS_MASK", has_mask ? "true" : "false");
    body = replace_all(body, "MASK_LOAD", mask_load);
    // log2(e): the exponent is ex2; an unmasked positive scale is applied inside it (one fma per score)
    constexpr double kLog2e = 1.4426950408889634;
    const bool fold = !has_mask && scale > 0;
    body = replace_all(body, "SSCALE", fold ? "1.0f" : fmt::format("{:.9g}f", scale * kLog2e));
    body = replace_all(body, "PSCALE", fold ? fmt::format("{:.9g}f", scale * kLog2e) : "1.0f");
    body = replace_all(body, "MSCALE", fmt::format("{:.9g}f", kLog2e));
    source += fmt::format(
        "\n#ifndef PT_ATTN_CVT2\n#define PT_ATTN_CVT2\n"
        "// two f32 values as one pair of 16-bit values (hi in the upper half), rounded to nearest even\n"
        "__device__ __forceinline__ unsigned pt_attn_cvt2_bf16(float hi, float lo) {{ unsigned r; asm(\"cvt.rn.bf16x2.f32 %0, "
        "%1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r; }}\n"
        "__device__ __forceinline__ unsigned pt_attn_cvt2_f16(float hi, float lo) {{ unsigned r; asm(\"cvt.rn.f16x2.f32 %0, "
        "%1, %2;\" : \"=r\"(r) : \"f\"(hi), \"f\"(lo)); return r; }}\n"
        "// the shared-window address of a shared-memory pointer (ldmatrix's operand)\n"
        "__device__ __forceinline__ unsigned pt_attn_smem(const void* p) {{ unsigned a; asm(\"{{ .reg .u64 t; "
        "cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }}\" : \"=r\"(a) : \"l\"(p)); return a; }}\n"
        "struct __align__(16) pt_attn_v16 {{ unsigned x, y, z, w; }};\n"
        "// 2^x (ex2.approx: 2^-inf = 0)\n"
        "__device__ __forceinline__ float pt_attn_ex2(float x) {{ float y; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(y) : "
        "\"f\"(x)); return y; }}\n"
        "// the max over the 4 lanes of a quad (the lanes holding one row of an MMA fragment)\n"
        "__device__ __forceinline__ float pt_attn_quad_max(float x) {{\n"
        "  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));\n  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));\n}}\n"
        "// two online-softmax states of one row meet: (m, l) becomes their union's max and sum; ca and cb\n"
        "// rescale each side's output (a row with no unmasked key on either side keeps base 0)\n"
        "__device__ __forceinline__ void pt_attn_meet(float& m, float& l, float pm, float pl, float pscale, float& ca, float& cb) {{\n"
        "  const float n = fmaxf(m, pm), b = n == -pt::inf_f() ? 0.f : n;\n"
        "  ca = pt_attn_ex2((m - b) * pscale);\n  cb = pt_attn_ex2((pm - b) * pscale);\n  m = n;\n  l = l * ca + pl * cb;\n}}\n"
        "#endif\n");
    if (nwg) source += kWgmmaHelpers;
    // the mma.sync body (kQueryTile rows a block, `split` warps per 16 rows, key tiles of `key_tile`)
    auto mma_sync_body = [&](bool aligned, bool pipelined) {
      std::string b = body;
      if (pipelined) {
        // tiles 0 .. stages - 2 before the loop, one copy group each
        std::string first = kTileIssueSetup;
        for (int st = 0; st + 1 < stages; ++st)
          first += replace_all(replace_all(kTileIssueAsync, "KT0", std::to_string(st) + " * KTILE"), "DST", std::to_string(st));
        std::string next = replace_all(replace_all(kTileIssueAsync, "KT0", "k0 + (NBUF - 1) * KTILE"), "DST",
                                       stages == 2 ? "buf ^ 1" : "(buf + NBUF - 1) % NBUF");
        b = replace_all(b, "KV_FIRST", first);
        b = replace_all(b, "TILE_LOAD", replace_all(replace_all(kTileLoadPipelined, "ISSUE_NEXT", next), "WAIT_PENDING",
                                                    std::to_string(stages - 1)));
        b = replace_all(b, "BUF_NEXT", stages == 2 ? "buf ^= 1" : "buf = buf + 1 == NBUF ? 0 : buf + 1");
        b = replace_all(b, "NBUF", std::to_string(stages));
      } else {
        b = replace_all(b, "BUF_NEXT", "(void)0");
        b = replace_all(b, "KV_FIRST", "");
        b = replace_all(b, "TILE_LOAD", aligned ? kTileLoadAligned : kTileLoadGeneral);
        b = replace_all(b, "NBUF", "1");
      }
      // head dims up to 64: every load of a tile in flight at once (16 registers of 16 bytes); 128: four
      // at a time (all sixteen spill next to its 64 accumulators)
      b = replace_all(b, "LOAD_UNROLL", hd->value <= 64 ? "" : "4");
      b = replace_all(b, "HD", std::to_string(hd->value));
      b = replace_all(b, "QT", std::to_string(kQueryTile));
      b = replace_all(b, "KSPLIT", std::to_string(split));
      b = replace_all(b, "KTILE", std::to_string(key_tile));
      b = replace_all(b, "WNB", std::to_string(key_tile / split / 8));
      b = replace_all(b, "WKV", std::to_string(key_tile / split / 16));
      b = replace_all(b, "LD_RSTEP", std::to_string(threads / (hd->value / 8)));  // NT is a multiple of HD / 8
      b = replace_all(b, "NT", std::to_string(threads));
      return b;
    };
    // a body ends with the kernel's closing brace: the part before it
    auto open_body = [](const std::string& b) { return b.substr(0, b.rfind('}')); };
    for (const bool aligned : {true, false}) {
      const bool pipelined = aligned && pipelined_tiles;
      const int qt = aligned && nwg ? 64 : kQueryTile;
      std::string b;
      if (aligned && nwg) {
        b = kWgmmaBody;
        b = replace_all(b, "MMA", mma);
        b = replace_all(b, "CVT2", t == DType::BF16 ? "pt_attn_cvt2_bf16" : "pt_attn_cvt2_f16");
        b = replace_all(b, "CAUSAL", causal ? "true" : "false");
        b = replace_all(b, "SSCALE", fold ? "1.0f" : fmt::format("{:.9g}f", scale * kLog2e));
        b = replace_all(b, "PSCALE", fold ? fmt::format("{:.9g}f", scale * kLog2e) : "1.0f");
        b = replace_all(b, "NWG", std::to_string(nwg));
        b = replace_all(b, "NT", std::to_string(128 * nwg));
      } else if (nwg) {
        // beside the Hopper form, the general entry serves the shorter lengths too: the 16-byte
        // pipelined body where this block's k and v allow it, else the 4-byte one (one uniform branch)
        b = fmt::format("  if ((((unsigned long long)(k + k_off) | (unsigned long long)(v + v_off)) & 15) == 0 && k_rs % 8 == 0 &&\n"
                        "      v_rs % 8 == 0) {{\n{}  }} else {{\n{}  }}\n}}\n",
                        open_body(mma_sync_body(true, pipelined_tiles)),
                        open_body(mma_sync_body(false, false)));
      } else {
        b = mma_sync_body(aligned, pipelined);
      }
      const std::string how = aligned && nwg ? fmt::format(", warp-group MMAs over {} groups", nwg)
                              : pipelined ? fmt::format(", copied asynchronously into {} buffers", stages)
                                          : std::string();
      source += fmt::format(
          "// {} (extern scaled_dot_product_attention: {}; {} tile loads{})\n"
          "extern \"C\" __global__ void __launch_bounds__({}) {}_{}({}) {{\n{}{}"
          "  const long long BH = {}, L = {}, S = {};\n  (void)BH;\n"
          "  const long long bh = (long long)blockIdx.x / ((L + {} - 1) / {});\n{}{}{}",
          name, variant, aligned ? "16-byte" : "4-byte", how, aligned && nwg ? 128 * nwg : threads, name,
          aligned ? "aligned" : "general", params, loads, kWaitPriorGrids, c_index(BH, dialect), c_index(L, dialect),
          c_index(S, dialect), qt, qt, past, offsets, b);
    }
    entries.emplace(key, name);
  }
  kern.general.entry = base + "_general";
  kern.general.launch.shape = LaunchShape::BlockPerRow;
  kern.general.launch.work = simplify_index(sym::mul(BH, sym::ceildiv(L, sym::integer(kQueryTile))));
  kern.general.launch.block_threads = threads;
  kern.general.launch.shared_bytes = tile_bytes(false);
  kern.aligned = kern.general;
  kern.aligned.entry = base + "_aligned";
  kern.aligned.launch.shared_bytes = tile_bytes(pipelined_tiles);
  if (nwg) {
    // 64 query rows a block; Q, then two buffers of K and V tiles of 64 x groups keys, 1024-aligned
    kern.aligned.launch.work = simplify_index(sym::mul(BH, sym::ceildiv(L, sym::integer(64))));
    kern.aligned.launch.block_threads = 128 * nwg;
    kern.aligned.launch.shared_bytes = static_cast<uint32_t>(1024 + 8192 + 2 * 2 * 64 * nwg * 128);
    // from attention_wgmma_from() query rows on; shorter lengths take the general entry, which holds the
    // pipelined 16-byte body as well
    kern.general.launch.shared_bytes = tile_bytes(pipelined_tiles);
  }
  // 16-byte tile loads: k and v rows start at multiples of 8 elements in 16-byte aligned buffers
  // (q is read 4 bytes at a time, except by the Hopper form, which copies it as k and v)
  kern.rule.multiple = 8;
  kern.rule.divisible = align_exprs;
  kern.rule.aligned_buffers = {bufs[1], bufs[2]};
  if (nwg) {
    kern.rule.aligned_buffers.push_back(bufs[0]);
    kern.rule.size = L;
    kern.rule.at_least = attention_wgmma_from();
  }
  return kern;
}

}  // namespace protean::backend::cuda

namespace protean::backend::cuda {

namespace {

bool reads_buffer(const SExpr& e, int b) {
  if (e->op == SOp::Load && e->buffer == b) return true;
  for (const SExpr& a : e->args)
    if (reads_buffer(a, b)) return true;
  return false;
}

/// f as offset + sum(coef[d] * vars[d]) when it is affine in `vars` (checked by rebuilding it), else
/// false.
bool affine(const sym::Expr& f, const std::vector<sym::Expr>& vars, sym::Expr& offset, std::vector<sym::Expr>& coef) {
  std::unordered_map<sym::Expr, sym::Expr> zero;
  for (const sym::Expr& v : vars) zero[v] = sym::integer(0);
  offset = simplify_index(sym::substitute(f, zero));
  sym::Expr rebuilt = offset;
  coef.clear();
  for (size_t d = 0; d < vars.size(); ++d) {
    std::unordered_map<sym::Expr, sym::Expr> unit = zero;
    unit[vars[d]] = sym::integer(1);
    coef.push_back(simplify_index(sym::sub(sym::substitute(f, unit), offset)));
    rebuilt = sym::add(rebuilt, sym::mul(coef.back(), vars[d]));
  }
  return simplify_index(rebuilt) == simplify_index(f);
}

bool even_integer(const sym::Expr& e) { return e->is_integer() && e->value % 2 == 0; }

/// Where the permuting copy `load(o, g(y)) -> Y[y]` puts element [i_0, ..., i_{r-1}] of o (dense,
/// sizes `os`): Y position = offset + sum(i_d * stride_d), found by evaluating g over every y at two
/// sets of symbol values (3 and 5) and checked at every point; false when it is not such a map with
/// the same constants at both.
bool permutation_strides(const Program& p, const sym::Expr& g, const std::vector<sym::Expr>& os,
                         const std::vector<sym::Expr>& ys, int64_t& offset, std::vector<int64_t>& strides) {
  std::vector<int64_t> first;
  for (int64_t value : {3, 5}) {
    std::unordered_map<sym::Expr, int64_t> vals;
    for (const sym::Expr& s : p.symbols) vals[s] = value;
    std::vector<int64_t> on, yn;
    int64_t numel = 1, ynumel = 1;
    try {
      for (const sym::Expr& e : os) numel *= on.emplace_back(sym::evaluate(e, vals));
      for (const sym::Expr& e : ys) ynumel *= yn.emplace_back(sym::evaluate(e, vals));
    } catch (const std::exception&) {
      return false;
    }
    if (numel != ynumel || numel <= 0 || numel > (1 << 16)) return false;
    // o's flat offset of every Y position, then the Y position of o's unit points
    std::vector<int64_t> at(static_cast<size_t>(numel), -1);
    std::vector<int64_t> y(ys.size(), 0);
    for (int64_t pos = 0; pos < numel; ++pos) {
      int64_t rem = pos;
      for (size_t d = ys.size(); d-- > 0;) {
        y[d] = rem % yn[d];
        rem /= yn[d];
      }
      std::unordered_map<sym::Expr, int64_t> v = vals;
      for (size_t d = 0; d < ys.size(); ++d) v[outer_var(d)] = y[d];
      int64_t o = 0;
      try {
        o = sym::evaluate(g, v);
      } catch (const std::exception&) {
        return false;
      }
      if (o < 0 || o >= numel || at[static_cast<size_t>(o)] >= 0) return false;
      at[static_cast<size_t>(o)] = pos;
    }
    std::vector<int64_t> dense(os.size(), 1), st(os.size(), 0);
    for (size_t d = os.size() - 1; d-- > 0;) dense[d] = dense[d + 1] * on[d + 1];
    const int64_t base = at[0];
    for (size_t d = 0; d < os.size(); ++d) st[d] = on[d] > 1 ? at[static_cast<size_t>(dense[d])] - base : 0;
    for (int64_t o = 0; o < numel; ++o) {  // every point follows the strides
      int64_t rem = o, want = base;
      for (size_t d = 0; d < os.size(); ++d) {
        want += (rem / dense[d]) * st[d];
        rem %= dense[d];
      }
      if (at[static_cast<size_t>(o)] != want) return false;
    }
    std::vector<int64_t> got = st;
    got.push_back(base);
    if (first.empty()) first = got;
    else {
      for (size_t d = 0; d < os.size(); ++d)  // dims of size 1 at one valuation carry no stride
        if (first[d] != got[d] && first[d] != 0 && got[d] != 0) return false;
      for (size_t d = 0; d < os.size(); ++d) first[d] = std::max(first[d], got[d]);
      if (first.back() != got.back()) return false;
    }
  }
  offset = first.back();
  strides.assign(first.begin(), first.end() - 1);
  return true;
}

}  // namespace

AttentionViews fold_attention_views(Program& p) {
  AttentionViews views;
  const char* env = std::getenv("PROTEAN_CUDA_ATTENTION_VIEWS");
  if (env && std::string(env) == "0") return views;
  for (size_t ei = 0; ei < p.externs.size(); ++ei) {
    Extern& e = p.externs[ei];
    std::string why;
    if (e.op != ops::OpKind::scaled_dot_product_attention || !attention_supported(p, e, why)) continue;
    for (int j = 0; j < 3; ++j) {
      const int x = e.inputs[static_cast<size_t>(j)];
      if (std::count(e.inputs.begin(), e.inputs.end(), x) != 1) continue;  // q and k the same buffer: keep it
      const Buffer& xb = p.buffers[static_cast<size_t>(x)];
      if (xb.kind != BufferKind::Temp) continue;
      // the one stage writing x
      int kernel = -1, stage = -1;
      for (size_t ki = 0; ki < p.kernels.size(); ++ki)
        for (size_t si = 0; si < p.kernels[ki].stages.size(); ++si)
          if (p.kernels[ki].stages[si].out == x) {
            kernel = static_cast<int>(ki);
            stage = static_cast<int>(si);
          }
      if (kernel < 0) continue;
      const Kernel& k = p.kernels[static_cast<size_t>(kernel)];
      const Stage& st = k.stages[static_cast<size_t>(stage)];
      if (st.kind != StageKind::Pointwise || !st.inner.empty() || k.outer != xb.sizes || st.body->op != SOp::Load) continue;
      const int src = st.body->buffer;
      const Buffer& sb = p.buffers[static_cast<size_t>(src)];
      if (src == x || sb.dtype != xb.dtype || sb.kind == BufferKind::Output) continue;
      std::vector<sym::Expr> vars;
      for (size_t d = 0; d < k.outer.size(); ++d) vars.push_back(outer_var(d));
      if (st.out_index != linear_index(vars, xb.sizes)) continue;
      // nothing else reads x
      bool other = false;
      for (size_t ki = 0; ki < p.kernels.size() && !other; ++ki)
        for (const Stage& s2 : p.kernels[ki].stages) other = other || reads_buffer(s2.body, x);
      for (size_t e2 = 0; e2 < p.externs.size() && !other; ++e2)
        if (e2 != ei)
          for (int in : p.externs[e2].inputs) other = other || in == x;
      for (int o : p.outputs) other = other || o == x;
      if (other) continue;
      sym::Expr offset;
      std::vector<sym::Expr> coef;
      if (!affine(st.body->index, vars, offset, coef)) continue;
      const size_t r = vars.size();
      bool ok = coef[r - 1]->is_integer(1) && even_integer(offset) && even_integer(coef[r - 2]);
      for (size_t d = 0; d + 2 < r; ++d) ok = ok && (even_integer(coef[d]) || xb.sizes[d]->is_integer(1));
      if (!ok) continue;
      AttentionView v;
      v.buffer = src;
      v.offset = offset;
      v.row_stride = coef[r - 2];
      for (size_t d = 0; d + 2 < r; ++d) v.batch_strides.push_back(xb.sizes[d]->is_integer(1) ? sym::integer(0) : coef[d]);
      views[static_cast<int>(ei)][j] = v;
      // the copy goes; src lives on to the attention outside any shared slot
      p.buffers[static_cast<size_t>(src)].slot = -1;
      remove_stage(p, kernel, stage);
    }
    // the output: its one reader a permuting copy into Y
    const int o = e.outputs[0];
    const Buffer& ob = p.buffers[static_cast<size_t>(o)];
    int kernel = -1, stage = -1, readers = 0;
    for (size_t ki = 0; ki < p.kernels.size(); ++ki)
      for (size_t si = 0; si < p.kernels[ki].stages.size(); ++si)
        if (reads_buffer(p.kernels[ki].stages[si].body, o)) {
          ++readers;
          kernel = static_cast<int>(ki);
          stage = static_cast<int>(si);
        }
    for (const Extern& e2 : p.externs)
      for (int in : e2.inputs) readers += in == o ? 2 : 0;
    for (int out : p.outputs) readers += out == o ? 2 : 0;
    if (readers != 1 || ob.kind != BufferKind::Temp) continue;
    const Kernel& k = p.kernels[static_cast<size_t>(kernel)];
    const Stage& st = k.stages[static_cast<size_t>(stage)];
    if (st.kind != StageKind::Pointwise || !st.inner.empty() || st.body->op != SOp::Load || st.body->buffer != o) continue;
    const int y = st.out;
    const Buffer& yb = p.buffers[static_cast<size_t>(y)];
    if (yb.dtype != ob.dtype || (yb.kind != BufferKind::Temp && yb.kind != BufferKind::Output) || k.outer != yb.sizes) continue;
    std::vector<sym::Expr> vars;
    for (size_t d = 0; d < k.outer.size(); ++d) vars.push_back(outer_var(d));
    if (st.out_index != linear_index(vars, yb.sizes)) continue;
    int64_t offset = 0;
    std::vector<int64_t> strides;
    if (!permutation_strides(p, st.body->index, ob.sizes, yb.sizes, offset, strides)) continue;
    const size_t r = ob.sizes.size();
    bool ok = strides[r - 1] == 1 && offset % 2 == 0 && strides[r - 2] % 2 == 0;
    for (size_t d = 0; d + 2 < r; ++d) ok = ok && strides[d] % 2 == 0;
    if (!ok) continue;
    AttentionView v;
    v.buffer = y;
    v.offset = sym::integer(offset);
    v.row_stride = sym::integer(strides[r - 2]);
    for (size_t d = 0; d + 2 < r; ++d) v.batch_strides.push_back(sym::integer(strides[d]));
    views[static_cast<int>(ei)][3] = v;
    p.buffers[static_cast<size_t>(y)].slot = -1;  // written by the attention now, outside any shared slot
    p.buffers[static_cast<size_t>(y)].from_extern = true;
    remove_stage(p, kernel, stage);
  }
  return views;
}

}  // namespace protean::backend::cuda
