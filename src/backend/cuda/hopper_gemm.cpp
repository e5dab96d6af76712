// Generated products on Hopper (hopper_gemm.h): the kernel's source, its module, eligibility and launch.
#include "backend/cuda/hopper_gemm.h"

#include <fmt/format.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <map>
#include <mutex>
#include <vector>

#include "backend/cuda/nvrtc.h"
#include "cache/blob_cache.h"
#include "device/runtime.h"
#include "observe/env.h"
#include "observe/log.h"
#include "protean/error.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

// The translation unit. One template, two entry points (W read N-major or K-major); the epilogue is
// chosen per launch by flags (bit 0 GELU tanh form, bit 1 residual, bit 2 bias), uniform branches.
// Shared memory (dynamic, 1024-aligned for the 128-byte swizzle): 8 stages of A [64 rows][64 k]
// (8 KB) and W (8 KB: N-major [64 k][64 n], K-major [64 n][64 k]), then 16 mbarriers.
const char* const kSource = R"PT(
struct alignas(64) pt_tensor_map { unsigned long long words[16]; };

#define PT_ST 8
#define PT_TILE_BYTES 8192
// the f32 output tile staged in shared memory for the epilogue: 64 rows of 64 floats, 16 bytes of padding
#define PT_PITCH (64 * 4 + 16)

__device__ __forceinline__ unsigned pt_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ float pt_bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short pt_f2bf(float f) {
  unsigned short r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
  return r;
}
// GELU's tanh form (cuBLASLt's GELU epilogue)
__device__ __forceinline__ float pt_gelu_tanh(float v) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * v * (1.f + tanhf(k0 * (v + k1 * v * v * v)));
}
// 8 columns of a row: the residual R added in f32 (flags bit 1), one rounding to bf16, 16 bytes stored
// at C + off
__device__ __forceinline__ void pt_store8(float* v, const unsigned short* R, unsigned short* C, unsigned long long off,
                                          int flags) {
  if (flags & 2) {
    const uint4 rv = *(const uint4*)(R + off);
    const unsigned w[4] = {rv.x, rv.y, rv.z, rv.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] += pt_bf2f((unsigned short)(w[j] & 0xffff));
      v[2 * j + 1] += pt_bf2f((unsigned short)(w[j] >> 16));
    }
  }
  uint4 o;
  o.x = pt_f2bf(v[0]) | ((unsigned)pt_f2bf(v[1]) << 16);
  o.y = pt_f2bf(v[2]) | ((unsigned)pt_f2bf(v[3]) << 16);
  o.z = pt_f2bf(v[4]) | ((unsigned)pt_f2bf(v[5]) << 16);
  o.w = pt_f2bf(v[6]) | ((unsigned)pt_f2bf(v[7]) << 16);
  *(uint4*)(C + off) = o;
}
// shared memory reads by address (a pointer computed from the aligned dynamic base would compile to
// generic loads)
__device__ __forceinline__ uint4 pt_lds128(unsigned addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ unsigned short pt_lds16(unsigned addr) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
  return v;
}
// a K-major or N-major operand tile written by TMA with the 128-byte swizzle: 8-row groups 1024
// bytes apart (stride byte offset); the leading byte offset is unused for these (one 64-wide chunk)
__device__ __forceinline__ unsigned long long pt_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void pt_mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void pt_mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void pt_mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void pt_mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nPT_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra PT_WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void pt_tma(unsigned dst, const pt_tensor_map* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      ::"r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// every thread of every block of the cluster arrives, then waits (release / acquire at cluster scope)
__device__ __forceinline__ void pt_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#define PT_ACC32(X) "+f"(X[0]), "+f"(X[1]), "+f"(X[2]), "+f"(X[3]), "+f"(X[4]), "+f"(X[5]), "+f"(X[6]), "+f"(X[7]), \
  "+f"(X[8]), "+f"(X[9]), "+f"(X[10]), "+f"(X[11]), "+f"(X[12]), "+f"(X[13]), "+f"(X[14]), "+f"(X[15]), \
  "+f"(X[16]), "+f"(X[17]), "+f"(X[18]), "+f"(X[19]), "+f"(X[20]), "+f"(X[21]), "+f"(X[22]), "+f"(X[23]), \
  "+f"(X[24]), "+f"(X[25]), "+f"(X[26]), "+f"(X[27]), "+f"(X[28]), "+f"(X[29]), "+f"(X[30]), "+f"(X[31])
#define PT_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
// d[64 x 64] += A[64 x 16] (K-major) . B[16 x 64]: N-major B (imm-trans-b 1) or K-major (0)
template <bool NMAJ>
__device__ __forceinline__ void pt_wgmma(float* d, unsigned long long da, unsigned long long db) {
  const int accumulate = 1;  // scale-d: d = a . b + d
  if (NMAJ)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PT_REGS32 ", %32, %33, p, 1, 1, 0, 1;\n}\n"
                 : PT_ACC32(d) : "l"(da), "l"(db), "r"(accumulate));
  else
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " PT_REGS32 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : PT_ACC32(d) : "l"(da), "l"(db), "r"(accumulate));
}

// SPLIT > 1: the blocks of a cluster (1, 1, SPLIT) share one output tile, block z taking the z-th
// SPLIT-th of K; each block leaves its f32 accumulators in its shared memory, and block z adds up
// rows z * 64 / SPLIT .. (z + 1) * 64 / SPLIT - 1 of every block's tile (in the order 0, 1, ...)
// through distributed shared memory and runs the epilogue on them: the blocks' epilogues run side by
// side.
//
// LN (SPLIT 1 only; entries of cluster (4, 1, 1)): A is x, the input of a LayerNorm folded into the
// product (program.h: LayerNormPrologue), and W has gamma folded in. Block rank c of the cluster (4
// column tiles of the same 64 rows) sums rows 16 c .. 16 c + 15 as every A tile passes through shared
// memory, 8 consumer threads a row, 16 bytes each (the swizzle permutes 16-byte pieces within a row's
// 128 bytes, so a row's sum does not care), shifted by the row's first loaded element against
// cancellation; the 8 lanes combine their sums, each block publishes its rows' mean and rstd, and
// consumer warp w reads those of its accumulator rows (16 w .. 16 w + 15) from block w through
// distributed shared memory. The epilogue applies rstd * (acc - mean * lnv[n]) + lnv[N + n] before the
// bias and the activation.
template <bool NMAJ, int SPLIT, bool LN>
__device__ __forceinline__ void pt_gemm(const pt_tensor_map* map_a, const pt_tensor_map* map_w,
                                        const unsigned short* bias, const unsigned short* R, unsigned short* C,
                                        int M, int N, int K, int flags, const float* lnv, float eps) {
  extern __shared__ unsigned char pt_dyn_raw[];
  unsigned char* dyn = (unsigned char*)(((unsigned long long)pt_dyn_raw + 1023) & ~1023ull);
  unsigned char* sa = dyn;
  unsigned char* sw = dyn + PT_ST * PT_TILE_BYTES;
  unsigned long long* bars = (unsigned long long*)(sw + PT_ST * PT_TILE_BYTES);
  const unsigned full0 = pt_smem(bars), empty0 = pt_smem(bars + PT_ST);
  const int tid = threadIdx.x;
  const int m0 = blockIdx.y * 64, n0 = blockIdx.x * 64, KT = K / 64 / SPLIT, k_first = SPLIT > 1 ? (int)blockIdx.z * KT : 0;
  if (tid == 0) {
    for (int s = 0; s < PT_ST; ++s) {
      pt_mbar_init(full0 + 8 * s, 1);
      pt_mbar_init(empty0 + 8 * s, 4);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int pre = KT < PT_ST ? KT : PT_ST;
  auto load_w = [&](int s, int kt) {
    if (NMAJ) pt_tma(pt_smem(sw + s * PT_TILE_BYTES), map_w, n0, (k_first + kt) * 64, full0 + 8 * s);  // W [K, N]
    else pt_tma(pt_smem(sw + s * PT_TILE_BYTES), map_w, (k_first + kt) * 64, n0, full0 + 8 * s);      // W [N, K]
  };
  if (tid == 128) {  // the weights do not depend on the grids ahead: request them before waiting
    asm volatile("prefetch.tensormap [%0];" ::"l"(map_a) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(map_w) : "memory");
    for (int s = 0; s < pre; ++s) {
      pt_mbar_expect(full0 + 8 * s, 2 * PT_TILE_BYTES);
      load_w(s, s);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (tid == 128) {
    for (int s = 0; s < pre; ++s) pt_tma(pt_smem(sa + s * PT_TILE_BYTES), map_a, (k_first + s) * 64, m0, full0 + 8 * s);
    for (int kt = PT_ST; kt < KT; ++kt) {
      const int s = kt % PT_ST;
      pt_mbar_wait(empty0 + 8 * s, ((kt / PT_ST) - 1) & 1);
      pt_mbar_expect(full0 + 8 * s, 2 * PT_TILE_BYTES);
      load_w(s, kt);
      pt_tma(pt_smem(sa + s * PT_TILE_BYTES), map_a, (k_first + kt) * 64, m0, full0 + 8 * s);
    }
  }
  __syncwarp();
  float d[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  // LN: the 4 blocks of a cluster (4 column tiles of the same rows) split the row statistics: block
  // rank c sums rows 16 c .. 16 c + 15, 8 consumer threads a row, 16 bytes of every A tile each
  float ln_shift = 0.f, ln_s1[2] = {0.f, 0.f}, ln_s2[2] = {0.f, 0.f};
  unsigned ln_rank = 0;
  if (LN) asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(ln_rank));
  const unsigned ln_row = (16 * ln_rank + (unsigned)(tid % 128) / 8) * 128, ln_piece = (unsigned)(tid % 8) * 16;
  // LN: the epilogue's vectors (bias, the column sums, beta · W) for the columns this thread stores,
  // requested now: they arrive while the main loop runs instead of in the epilogue's round trips (the
  // plain product keeps its bias loads in the epilogue: requested here they made it slower in GPT-2)
  const int lane4 = tid % 4;
  float ev_b[16] = {}, ev_c[16] = {}, ev_e[16] = {};
  if (LN && tid < 128) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = n0 + 8 * i + 2 * lane4 + j;
        ev_b[2 * i + j] = (flags & 4) ? pt_bf2f(__ldg(bias + col)) : 0.f;
        ev_c[2 * i + j] = __ldg(lnv + col);
        ev_e[2 * i + j] = __ldg(lnv + N + col);
      }
  }
  if (tid < 128) {
    for (int kt = 0; kt < KT; ++kt) {
      const int s = kt % PT_ST;
      pt_mbar_wait(full0 + 8 * s, (kt / PT_ST) & 1);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      const unsigned a_base = pt_smem(sa + s * PT_TILE_BYTES), w_base = pt_smem(sw + s * PT_TILE_BYTES);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)  // K-major: 16 k are 32 bytes on; N-major: 16 rows of k, 2048 bytes
        pt_wgmma<NMAJ>(d, pt_desc(a_base + 32 * kk), pt_desc(w_base + (NMAJ ? 2048 : 32) * kk));
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      if (LN) {  // the row sums, while the MMAs run (both only read the stage)
        if (kt == 0) ln_shift = pt_bf2f(pt_lds16(a_base + ln_row));  // the row's first loaded element
        const uint4 v = pt_lds128(a_base + ln_row + ln_piece);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // two chains: the adds of one stage overlap
          const float a0 = pt_bf2f((unsigned short)(w[e] & 0xffff)) - ln_shift;
          const float a1 = pt_bf2f((unsigned short)(w[e] >> 16)) - ln_shift;
          ln_s1[0] += a0;
          ln_s1[1] += a1;
          ln_s2[0] = fmaf(a0, a0, ln_s2[0]);
          ln_s2[1] = fmaf(a1, a1, ln_s2[1]);
        }
      }
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // step kt - 1's MMAs are done
      // each warp's wait covers its own part of the group: every consumer warp releases the stage
      if (kt > 0 && tid % 32 == 0) pt_mbar_arrive(empty0 + 8 * ((kt - 1) % PT_ST));
      __syncwarp();
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  asm volatile("griddepcontrol.launch_dependents;");
  float ln_mean[2] = {0.f, 0.f}, ln_rstd[2] = {1.f, 1.f};
  if (LN) {
    // each block's rows' mean and rstd into its shared memory; every consumer warp w then reads its 16
    // rows (16 w .. 16 w + 15) from cluster block w, which summed them
    __shared__ float2 pt_ln_stats[64];
    if (tid < 128) {
      float s1 = ln_s1[0] + ln_s1[1], s2 = ln_s2[0] + ln_s2[1];
#pragma unroll
      for (int o = 1; o < 8; o *= 2) {
        s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        s2 += __shfl_xor_sync(0xffffffffu, s2, o);
      }
      if (tid % 8 == 0) {
        const float m = s1 / (float)K;
        pt_ln_stats[ln_row / 128] = make_float2(ln_shift + m, rsqrtf(fmaxf(s2 / (float)K - m * m, 0.f) + eps));
      }
    }
    pt_cluster_sync();
    if (tid < 128) {
      unsigned remote;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(pt_smem(pt_ln_stats)), "r"((unsigned)(tid / 32)));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned r = (unsigned)((tid / 32) * 16 + (tid % 32) / 4 + 8 * h);
        asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(ln_mean[h]), "=f"(ln_rstd[h]) : "r"(remote + 8u * r) : "memory");
      }
    }
    pt_cluster_sync();  // a block's statistics stay until every block of the cluster has read them
  }
  if (SPLIT > 1) {
    // every load has landed and every MMA of this block has completed once all four consumer warps
    // are past their waits: the stage buffers then hold this block's f32 accumulators, as a tile of
    // 64 rows of PT_PITCH bytes. Block z then finishes rows 16 z .. 16 z + 15 of the output: it adds
    // those rows of every block's tile (in the order z = 0, 1, ..., through distributed shared
    // memory), and runs the epilogue on them; the four blocks' epilogues run side by side.
    if (tid < 128) {
      asm volatile("bar.sync 1, 128;" ::: "memory");
      const int warp = tid / 32, lane = tid % 32, r_local = warp * 16 + lane / 4;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *(float2*)(dyn + (r_local + 8 * h) * PT_PITCH + (8 * i + 2 * (lane % 4)) * 4) = make_float2(d[4 * i + 2 * h], d[4 * i + 2 * h + 1]);
    }
    pt_cluster_sync();
    for (int c = tid; c < (64 / SPLIT) * 8; c += 256) {  // 8 pieces of 8 columns a row
      const int r = (64 / SPLIT) * (int)blockIdx.z + c / 8, piece = c % 8, row = m0 + r;
      const unsigned local = pt_smem(dyn + r * PT_PITCH + piece * 32);
      float4 x[SPLIT][2];
#pragma unroll
      for (int p = 0; p < SPLIT; ++p) {  // every load issued before the first add
        unsigned remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"((unsigned)p));
#pragma unroll
        for (int q = 0; q < 2; ++q)
          asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                       : "=f"(x[p][q].x), "=f"(x[p][q].y), "=f"(x[p][q].z), "=f"(x[p][q].w) : "r"(remote + 16u * q));
      }
      float v[8] = {x[0][0].x, x[0][0].y, x[0][0].z, x[0][0].w, x[0][1].x, x[0][1].y, x[0][1].z, x[0][1].w};
#pragma unroll
      for (int p = 1; p < SPLIT; ++p) {
        v[0] += x[p][0].x; v[1] += x[p][0].y; v[2] += x[p][0].z; v[3] += x[p][0].w;
        v[4] += x[p][1].x; v[5] += x[p][1].y; v[6] += x[p][1].z; v[7] += x[p][1].w;
      }
      if (row < M) {
        const int col = n0 + piece * 8;
        const unsigned long long off = (unsigned long long)row * N + col;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (flags & 4) v[j] += pt_bf2f(bias[col + j]);
          if (flags & 1) v[j] = pt_gelu_tanh(v[j]);
        }
        pt_store8(v, R, C, off, flags);
      }
    }
    pt_cluster_sync();  // a block's tile stays until every block of the cluster has read its rows
    return;
  }
  if (tid >= 128) return;
  // the tile in f32 through shared memory (the stages are free: every MMA has completed), then
  // 16-byte pieces of rows; accumulator layout of m64n64: warp w holds rows 16 w + lane / 4 and + 8,
  // register 4 i + j column 8 i + 2 (lane % 4) + (j & 1), the row + 8 for j >= 2
  asm volatile("bar.sync 1, 128;" ::: "memory");
  const int warp = tid / 32, lane = tid % 32, r_local = warp * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int col = 8 * i + 2 * (lane % 4);
    const float b0 = LN ? ev_b[2 * i] : (flags & 4) ? pt_bf2f(bias[n0 + col]) : 0.f;
    const float b1 = LN ? ev_b[2 * i + 1] : (flags & 4) ? pt_bf2f(bias[n0 + col + 1]) : 0.f;
    const float c0 = ev_c[2 * i], c1 = ev_c[2 * i + 1], e0 = ev_e[2 * i], e1 = ev_e[2 * i + 1];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float a0 = d[4 * i + 2 * h], a1 = d[4 * i + 2 * h + 1];
      if (LN) {
        a0 = fmaf(ln_rstd[h], fmaf(-ln_mean[h], c0, a0), e0);
        a1 = fmaf(ln_rstd[h], fmaf(-ln_mean[h], c1, a1), e1);
      }
      float v0 = a0 + b0, v1 = a1 + b1;
      if (flags & 1) {
        v0 = pt_gelu_tanh(v0);
        v1 = pt_gelu_tanh(v1);
      }
      float2* p = (float2*)(dyn + (r_local + 8 * h) * PT_PITCH + col * 4);
      *p = make_float2(v0, v1);
    }
  }
  asm volatile("bar.sync 1, 128;" ::: "memory");
  for (int c = tid; c < 64 * 8; c += 128) {  // 8 pieces of 8 columns a row
    const int r = c / 8, piece = c % 8, row = m0 + r;
    if (row >= M) continue;
    const float4* src = (const float4*)(dyn + r * PT_PITCH + piece * 32);
    const float4 x0 = src[0], x1 = src[1];
    float v[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    const unsigned long long off = (unsigned long long)row * N + n0 + piece * 8;
    pt_store8(v, R, C, off, flags);
  }
}

extern "C" __global__ void __launch_bounds__(256) pt_product_w_kn(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags) {
  pt_gemm<true, 1, false>(&map_a, &map_w, bias, R, C, M, N, K, flags, nullptr, 0.f);
}
extern "C" __global__ void __launch_bounds__(256) pt_product_w_nk(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags) {
  pt_gemm<false, 1, false>(&map_a, &map_w, bias, R, C, M, N, K, flags, nullptr, 0.f);
}
// a LayerNorm folded in: map_a over its input x, map_w over W with gamma folded in, lnv f32 [2, N];
// clusters of 4 column tiles (N a multiple of 256) share the row statistics
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256) pt_product_w_kn_ln(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags, const float* lnv, float eps) {
  pt_gemm<true, 1, true>(&map_a, &map_w, bias, R, C, M, N, K, flags, lnv, eps);
}
extern "C" __global__ void __cluster_dims__(4, 1, 1) __launch_bounds__(256) pt_product_w_nk_ln(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags, const float* lnv, float eps) {
  pt_gemm<false, 1, true>(&map_a, &map_w, bias, R, C, M, N, K, flags, lnv, eps);
}
// K split over a cluster of PT_KSPLIT blocks (grid z = PT_KSPLIT)
#define PT_KSPLIT 4
extern "C" __global__ void __cluster_dims__(1, 1, PT_KSPLIT) __launch_bounds__(256) pt_product_w_kn_ksplit(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags) {
  pt_gemm<true, PT_KSPLIT, false>(&map_a, &map_w, bias, R, C, M, N, K, flags, nullptr, 0.f);
}
extern "C" __global__ void __cluster_dims__(1, 1, PT_KSPLIT) __launch_bounds__(256) pt_product_w_nk_ksplit(
    const __grid_constant__ pt_tensor_map map_a, const __grid_constant__ pt_tensor_map map_w, const unsigned short* bias,
    const unsigned short* R, unsigned short* C, int M, int N, int K, int flags) {
  pt_gemm<false, PT_KSPLIT, false>(&map_a, &map_w, bias, R, C, M, N, K, flags, nullptr, 0.f);
}
)PT";

constexpr uint32_t kSharedBytes = 2 * 8 * 8192 + 16 * 8 + 1024;  // stages, barriers, alignment slack

struct Module {
  bool tried = false;
  std::string error;  ///< why it could not be built or loaded
  CubinModules modules;
  drv::CUfunction w_kn = nullptr, w_nk = nullptr;
  drv::CUfunction w_kn_split = nullptr, w_nk_split = nullptr;  ///< K split over a cluster of kKSplit blocks
  drv::CUfunction w_kn_ln = nullptr, w_nk_ln = nullptr;  ///< a LayerNorm folded in (BlasStep::prologue)
};

std::mutex g_mu;
std::map<int, Module> g_modules;  // per device
std::atomic<int64_t> g_launches{0};

const Module& module_of(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  Module& m = g_modules[device];
  if (m.tried) return m;
  m.tried = true;
  try {
    const drv::DriverApi& api = drv::require_driver("generated products");
    drv::stream(device);  // the device's context is current on this thread
    NvrtcOptions o;
    o.arch = "sm_90a";  // wgmma and setmaxnreg-free TMA code: the arch-specific target
    const std::string& src = generated_product_source();
    const CubinKey key = cubin_key(src, o);
    bool built = false;
    const auto t0 = std::chrono::steady_clock::now();
    auto cubin = cache::get_or_build_blob("cubins", key.combined(), src,
                                          fmt::format("nvrtc {} {} {} (generated products)", key.nvrtc_version, key.arch,
                                                      key.flags),
                                          [&] {
                                            built = true;
                                            return nvrtc_compile(src, "generated_products.cu", o).cubin;
                                          });
    m.modules.load(api, *cubin, "the generated products' cubin");
    m.w_kn = m.modules.function(api, "pt_product_w_kn");
    m.w_nk = m.modules.function(api, "pt_product_w_nk");
    m.w_kn_split = m.modules.function(api, "pt_product_w_kn_ksplit");
    m.w_nk_split = m.modules.function(api, "pt_product_w_nk_ksplit");
    m.w_kn_ln = m.modules.function(api, "pt_product_w_kn_ln");
    m.w_nk_ln = m.modules.function(api, "pt_product_w_nk_ln");
    for (drv::CUfunction f : {m.w_kn, m.w_nk, m.w_kn_split, m.w_nk_split, m.w_kn_ln, m.w_nk_ln})
      drv::check(api.cuFuncSetAttribute(f, drv::kFuncAttrMaxDynamicSharedBytes, static_cast<int>(kSharedBytes)),
                 "cuFuncSetAttribute(generated product, max dynamic shared memory)");
    if (observe::log_enabled(observe::LogCat::Cache))
      observe::log_line(observe::LogCat::Cache, "",
                      fmt::format("generated products for device {}: {} in {:.1f} ms", device,
                                  built ? "compiled by NVRTC" : "from the artifact cache",
                                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count()));
  } catch (const std::exception& e) {
    m.error = e.what();
    observe::warn(fmt::format("generated products are off on device {}: {}", device, m.error));
  }
  return m;
}

bool aligned(uint64_t address, uint64_t to) { return address % to == 0; }

// The deepest K one block takes whole; past it, the K split's cluster size (PT_KSPLIT in the source)
// and the deepest K a split product takes.
constexpr int64_t kMaxWholeK = 1024;
constexpr int64_t kKSplit = 4;
constexpr int64_t kMaxSplitK = 4096;

// PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K: 0 no split, 1 K deeper than kMaxWholeK, 2 (the default) also
// the products of at most 16 column tiles (GPT-2's output projection: 12 tiles for 132 multiprocessors).
// The switch's spellings of its opt-in days keep their meaning: off / false / no are 0, on / true / yes 1.
int split_k_mode() {
  const char* name = "PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K";
  if (const char* e = std::getenv(name)) {
    std::string v(e);
    for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (v == "off" || v == "false" || v == "no") return 0;
    if (v == "on" || v == "true" || v == "yes") return 1;
  }
  return observe::env_choice(name, {0, 1, 2}, 2);
}

// Whether `st` at `shape` runs split over a cluster (a LayerNorm prologue is never split).
bool split_k(const BlasStep& st, const BlasShape& shape) {
  if (shape.k > kMaxWholeK) return true;
  return !st.has_prologue() && split_k_mode() == 2 && shape.n <= 16 * 64 && shape.k % (64 * kKSplit) == 0;
}

// A 2-D TMA map of a row-major bf16 [rows, cols] matrix at `address`, boxes of 64 columns x 64 rows.
void encode_map(const drv::DriverApi& api, void* map, uint64_t address, int64_t rows, int64_t cols) {
  const uint64_t dims[2] = {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)};
  const uint64_t strides[1] = {static_cast<uint64_t>(cols) * 2};
  const uint32_t box[2] = {64, 64};
  const uint32_t element_strides[2] = {1, 1};
  drv::check(api.cuTensorMapEncodeTiled(map, drv::kTensorMapBfloat16, 2, reinterpret_cast<void*>(address), dims, strides,
                                        box, element_strides, 0, drv::kTensorMapSwizzle128B,
                                        drv::kTensorMapL2Promotion256B, 0),
             fmt::format("cuTensorMapEncodeTiled([{}, {}] bf16)", rows, cols));
}

}  // namespace

const std::string& generated_product_source() {
  static const std::string s = kSource;
  return s;
}

int64_t generated_product_max_rows() {
  static const int64_t rows = observe::env_int("PROTEAN_CUDA_GENERATED_PRODUCT_ROWS", 128, 0, 1 << 20);
  return rows;
}

int64_t generated_product_launches() { return g_launches.load(); }

bool generated_product_fits(const BlasStep& st, const BlasShape& shape) {
  const BlasEpilogue& ep = st.epilogue;
  if (st.dtype != DType::BF16 || shape.batch != 1 || ep.alpha != 1.0 || ep.gelu == GeluForm::Erf) return false;
  if (ep.residual >= 0 && (ep.beta != 1.0 || ep.gelu != GeluForm::None)) return false;
  if (shape.m < 1 || shape.m > generated_product_max_rows() || shape.n % 64 != 0 || shape.n < 64) return false;
  if (st.has_prologue() && (split_k(st, shape) || shape.n % 256 != 0 || !observe::env_on("PROTEAN_CUDA_FOLD_LAYER_NORM")))
    return false;
  if (!split_k(st, shape)) return shape.k >= 64 && shape.k % 64 == 0;
  // split over a cluster, each block a whole number (at least one) of 64-deep steps
  return shape.k >= 64 * kKSplit && shape.k <= kMaxSplitK && shape.k % (64 * kKSplit) == 0 && split_k_mode() >= 1;
}

bool generated_product_split(const BlasStep& st, const BlasShape& shape) {
  try {
    return split_k(st, shape);
  } catch (...) {
    return false;
  }
}

bool generated_product_eligible(const BlasStep& st, const BlasShape& shape, const std::function<uint64_t(int)>& address,
                                int device, int algorithm) {
  try {
    if (algorithm >= 0 || !observe::env_on("PROTEAN_CUDA_GENERATED_PRODUCTS") || blas_hook_installed()) return false;
    if (!generated_product_fits(st, shape)) return false;
    const BlasEpilogue& ep = st.epilogue;
    const drv::DriverApi* api = drv::driver();
    if (!api || !api->cuTensorMapEncodeTiled || !api->cuLaunchKernelEx) return false;
    const drv::DeviceInfo& info = drv::device_info(device);
    if (info.cc_major != 9 || info.cc_minor != 0 || !nvrtc_available()) return false;
    for (int id : {st.a, st.b, st.out, ep.residual})
      if (id >= 0 && !aligned(address(id), 16)) return false;
    if (ep.bias >= 0 && !aligned(address(ep.bias), 4)) return false;
    if (st.has_prologue())
      for (int id : {st.prologue.x, st.prologue.weight, st.prologue.vectors})
        if (!aligned(address(id), 16)) return false;
    return module_of(device).error.empty();
  } catch (...) {
    return false;
  }
}

bool layer_norm_folded(const BlasStep& st, const BlasShape& shape, const std::function<uint64_t(int)>& address, int device,
                       int algorithm) {
  return st.has_prologue() && generated_product_eligible(st, shape, address, device, algorithm);
}

void run_generated_product(const BlasStep& st, const BlasShape& shape, const std::function<uint64_t(int)>& address,
                           int device, drv::CUstream stream, bool programmatic) {
  const Module& m = module_of(device);
  if (!m.error.empty()) throw RuntimeError(fmt::format("generated product: {}", m.error));
  const drv::DriverApi& api = drv::require_driver("generated products");
  struct alignas(64) Map {
    uint64_t words[16];
  };
  Map map_a, map_w;
  // a LayerNorm folded in reads its input and the weight with gamma folded in (program.h: LayerNormPrologue)
  const bool ln = st.has_prologue();
  const int a = ln ? st.prologue.x : st.a, w = ln ? st.prologue.weight : st.b;
  encode_map(api, &map_a, address(a), shape.m, shape.k);
  // Linear: W [n, k] (K-major); Matmul / Addmm: W [k, n] (N-major), boxes of 64 columns of n x 64 rows of k
  if (st.transpose_b) encode_map(api, &map_w, address(w), shape.n, shape.k);
  else encode_map(api, &map_w, address(w), shape.k, shape.n);
  const BlasEpilogue& ep = st.epilogue;
  uint64_t bias = ep.bias >= 0 ? address(ep.bias) : 0, residual = ep.residual >= 0 ? address(ep.residual) : 0;
  uint64_t out = address(st.out);
  int M = static_cast<int>(shape.m), N = static_cast<int>(shape.n), K = static_cast<int>(shape.k);
  int flags = (ep.gelu == GeluForm::Tanh ? 1 : 0) | (ep.residual >= 0 ? 2 : 0) | (ep.bias >= 0 ? 4 : 0);
  uint64_t lnv = ln ? address(st.prologue.vectors) : 0;
  float eps = ln ? static_cast<float>(st.prologue.eps) : 0.f;
  void* params[] = {&map_a, &map_w, &bias, &residual, &out, &M, &N, &K, &flags, &lnv, &eps};
  drv::LaunchConfig cfg;
  cfg.grid_x = static_cast<unsigned>(shape.n / 64);
  cfg.grid_y = static_cast<unsigned>((shape.m + 63) / 64);
  const bool split = split_k(st, shape);
  cfg.grid_z = split ? static_cast<unsigned>(kKSplit) : 1;
  cfg.block_x = 256;
  cfg.shared_bytes = kSharedBytes;
  cfg.stream = stream;
  drv::LaunchAttribute attr;
  attr.id = drv::kLaunchAttrProgrammaticStreamSerialization;
  attr.value.programmatic_stream_serialization_allowed = 1;
  cfg.attrs = programmatic ? &attr : nullptr;
  cfg.num_attrs = programmatic ? 1 : 0;
  drv::CUfunction fn = ln ? (st.transpose_b ? m.w_nk_ln : m.w_kn_ln)
                          : st.transpose_b ? (split ? m.w_nk_split : m.w_nk) : (split ? m.w_kn_split : m.w_kn);
  drv::check(api.cuLaunchKernelEx(&cfg, fn, params, nullptr),
             fmt::format("cuLaunchKernelEx(generated product {}x{}x{})", M, N, K));
  g_launches.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace protean::backend::cuda
