// Probe for a Hopper product that can hang on a programmatic edge: TMA loads into 128-byte-swizzled
// shared memory, warp-group MMA (wgmma) with f32 accumulators, the weights' first stages requested
// before griddepcontrol.wait (they do not depend on the kernel ahead) and the activations after it.
// Is it as fast as cuBLASLt on GPT-2 small's products, and what does a programmatic edge into it buy
// in a chain of producer -> product pairs?
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/gpu/wgmma_probe.cu -lcublasLt -lcuda -o wgmma_probe && ./wgmma_probe [M...]
//   (or bench/gpu/wgmma_probe.sh OUTDIR M...; plain -arch=sm_90a emits compute_90 PTX, which lacks wgmma)
//
// Shapes (bf16, f32 accumulation, bf16 out): C[M, N] = A[M, K] · W[K, N] + bias (+ GELU tanh form)
// (+ residual), GPT-2 small's four Linear calls: QKV 768->2304, out 768->768 (+ residual), FC1
// 768->3072 (+ GELU), FC2 3072->768 (+ residual). The kernel reads the weights as Wᵀ [N, K] (both
// operands K-major: a one-time repack of a constant weight, as the cpu backend packs its weights);
// cuBLASLt reads W [K, N] as the model stores it. The weights cycle through 12 copies (one per layer)
// so they come from device memory as in the model. Times are CUDA events around 60 launches, median
// of 9 batches. The chain: 12 x (a row kernel that writes A, then the product) in one CUDA graph,
// cuBLASLt against this kernel on plain and on programmatic edges. Prints one JSON object per M.
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cublaslt_probe.h"
#include "cuda_check.h"

using bf16 = __nv_bfloat16;

// ---- warp-group MMA m64nNk16, bf16 x bf16 -> f32, both operands K-major in shared memory ----
// (operand lists written out per N: inline PTX needs each accumulator register named)
__device__ __forceinline__ void wgmma_m64n32(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n64(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n96(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n128(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n192(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, %96, %97, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n256(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(scale_d));
}
// B N-major (imm-trans-b 1): W [K, N] as the model stores it, 64 columns of N a 128-byte swizzled row
__device__ __forceinline__ void wgmma_m64n64_nmajor(float* d, unsigned long long da, unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

template <int BN>
__device__ __forceinline__ void wgmma_tile(float* d, unsigned long long da, unsigned long long db) {
  if constexpr (BN == 32) wgmma_m64n32(d, da, db, 1);
  else if constexpr (BN == 64) wgmma_m64n64(d, da, db, 1);
  else if constexpr (BN == 96) wgmma_m64n96(d, da, db, 1);
  else if constexpr (BN == 128) wgmma_m64n128(d, da, db, 1);
  else if constexpr (BN == 192) wgmma_m64n192(d, da, db, 1);
  else wgmma_m64n256(d, da, db, 1);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// Shared-memory matrix descriptor: a K-major tile of rows x 64 bf16 (128 bytes a row) written by TMA
// with the 128-byte swizzle; 8-row groups 1024 bytes apart. Bits 0-13 address >> 4, 16-29 leading
// byte offset >> 4 (unused for swizzled K-major, 1), 32-45 stride byte offset >> 4, 62-63 swizzle (1 = 128 B).
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// TMA: box {64 elements of K, rows} at (k0, row0) of the 2-D map into shared memory, completing on bar.
__device__ __forceinline__ void tma_load(unsigned dst, const CUtensorMap* map, int k0, int row0, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(map), "r"(k0), "r"(row0), "r"(bar)
      : "memory");
}
// An empty-slot wait in the producer: peers' consumers arrive with release at cluster scope.
__device__ __forceinline__ void mbar_wait_cluster(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Arrival on the barrier at the same offset in the shared memory of the cluster's block `rank`
// (with RELEASE_CLUSTER: release at cluster scope, and the producer's wait acquires at cluster scope).
#ifndef RELEASE_CLUSTER
#define RELEASE_CLUSTER 0
#endif
__device__ __forceinline__ void mbar_arrive_remote(unsigned bar, unsigned rank) {
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
  if (RELEASE_CLUSTER) asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
  else asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
// TMA multicast: the box lands at the same offset in every block of `mask` and completes on each one's bar.
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const CUtensorMap* map, int k0, int row0, unsigned bar,
                                                   unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3}], "
      "[%4], %5;" ::"r"(dst),
      "l"(map), "r"(k0), "r"(row0), "r"(bar), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
}

// One block: WG consumer warp groups x 64 rows of A, BN columns of W, its part of K (blockIdx.z of
// SPLIT) in steps of 64 through ST stages; one producer warp group whose first thread issues the TMA
// loads. Clusters of CN x CM x SPLIT blocks: the CN blocks along x (same rows) share each A tile, each
// loading BM / CN of its rows multicast to all CN; the CM blocks along y (same columns) share each W
// tile the same way. full[s]: the stage's tiles have landed in this block (one arrival + bytes);
// empty[s]: the consumers of every block this block's loads write into have finished with the stage
// (each consumer warp arrives on the barriers of its A group and its W group: a warp's
// wgmma.wait_group covers its own part of the group only).
// SPLIT > 1: the SPLIT blocks along z each sum a part of K; the z = 0 block adds the others'
// accumulators from their shared memory (distributed shared memory) and writes the tile.
// EPI bit 1: GELU, bit 2: residual R [M, N].
template <int WG, int BN, int ST, int SPLIT, int CN, int CM, bool NMAJ, int EPI>
__global__ void __launch_bounds__((WG + 1) * 128)
    gemm_tma(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
             const bf16* __restrict__ bias, const bf16* R, bf16* C, int M, int N, int K) {
  constexpr int BM = 64 * WG, A_BYTES = BM * 128, W_BYTES = BN * 128, CONSUMERS = WG * 128;
  constexpr int A_PIECE = BM / CN, W_PIECE = BN / CM, CLUSTER = CN * CM * SPLIT;
  static_assert(A_PIECE % 8 == 0 && W_PIECE % 8 == 0, "pieces of whole 8-row swizzle groups");
  static_assert(!NMAJ || (BN % 64 == 0 && CM == 1), "N-major W: whole 64-column chunks, not multicast");
  extern __shared__ __align__(1024) unsigned char dyn_raw[];
  // 1024-byte alignment for the 128-byte swizzle
  unsigned char* dyn = reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(dyn_raw) + 1023) & ~size_t(1023));
  unsigned char* sa = dyn;
  unsigned char* sw = dyn + ST * A_BYTES;
  unsigned long long* bars = reinterpret_cast<unsigned long long*>(sw + ST * W_BYTES);
  const unsigned full0 = smem_addr(bars), empty0 = smem_addr(bars + ST);
  const int tid = threadIdx.x, wg = tid / 128;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int KT = K / 64 / SPLIT, k_first = blockIdx.z * KT;
  const unsigned cx = blockIdx.x % CN, cy = blockIdx.y % CM, cz = blockIdx.z;
  auto rank_of = [&](unsigned x, unsigned y) { return x + CN * (y + CM * cz); };
  unsigned short mask_a = 0, mask_w = 0;
  for (unsigned j = 0; j < CN; ++j) mask_a |= (unsigned short)(1u << rank_of(j, cy));
  for (unsigned j = 0; j < CM; ++j) mask_w |= (unsigned short)(1u << rank_of(cx, j));
  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full0 + 8 * s, 1);
      mbar_init(empty0 + 8 * s, 4 * WG * (CN + CM - 1));  // every consumer warp of every reader
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if constexpr (CN * CM > 1) cluster_sync();  // every block's barriers exist before any multicast signals them
  const int pre = KT < ST ? KT : ST;
  auto load_w = [&](int s, int kt) {
    if constexpr (NMAJ) {  // W [K, N]: BN / 64 boxes of 64 columns x 64 rows of K, 8 KB each
#pragma unroll
      for (int j = 0; j < BN / 64; ++j)
        tma_load(smem_addr(sw + s * W_BYTES + j * 8192), &map_w, n0 + 64 * j, (k_first + kt) * 64, full0 + 8 * s);
      return;
    }
    const unsigned dst = smem_addr(sw + s * W_BYTES + cy * W_PIECE * 128);
    if constexpr (CM > 1) tma_load_multicast(dst, &map_w, (k_first + kt) * 64, n0 + cy * W_PIECE, full0 + 8 * s, mask_w);
    else tma_load(dst, &map_w, (k_first + kt) * 64, n0, full0 + 8 * s);
  };
  auto load_a = [&](int s, int kt) {
    const unsigned dst = smem_addr(sa + s * A_BYTES + cx * A_PIECE * 128);
    if constexpr (CN > 1) tma_load_multicast(dst, &map_a, (k_first + kt) * 64, m0 + cx * A_PIECE, full0 + 8 * s, mask_a);
    else tma_load(dst, &map_a, (k_first + kt) * 64, m0, full0 + 8 * s);
  };
  if (tid == CONSUMERS) {  // the weights do not depend on the grids ahead: request them before waiting
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_a) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(&map_w) : "memory");
    for (int s = 0; s < pre; ++s) {
      mbar_expect_tx(full0 + 8 * s, A_BYTES + W_BYTES);
      load_w(s, s);
    }
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (tid == CONSUMERS) {
    for (int s = 0; s < pre; ++s) load_a(s, s);
    for (int kt = ST; kt < KT; ++kt) {
      const int s = kt % ST;
      if constexpr (CN * CM > 1 && RELEASE_CLUSTER) mbar_wait_cluster(empty0 + 8 * s, ((kt / ST) - 1) & 1);
      else mbar_wait(empty0 + 8 * s, ((kt / ST) - 1) & 1);
      mbar_expect_tx(full0 + 8 * s, A_BYTES + W_BYTES);
      load_w(s, kt);
      load_a(s, kt);
    }
  }
  __syncwarp();
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;
  if (wg < WG) {
    for (int kt = 0; kt < KT; ++kt) {
      const int s = kt % ST;
      mbar_wait(full0 + 8 * s, (kt / ST) & 1);
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
      const unsigned a_base = smem_addr(sa + s * A_BYTES + wg * 64 * 128), w_base = smem_addr(sw + s * W_BYTES);
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        if constexpr (NMAJ) {
          // N-major W: 16 rows of K are 2048 bytes on; 8-row groups of K 1024 bytes apart (the stride
          // byte offset); one m64n64 per 64-column chunk, so the leading byte offset is never used
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            wgmma_m64n64_nmajor(d + 32 * j, smem_desc(a_base + 32 * kk), smem_desc(w_base + j * 8192 + 2048 * kk), 1);
        } else {
          wgmma_tile<BN>(d, smem_desc(a_base + 32 * kk), smem_desc(w_base + 32 * kk));
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");  // step kt - 1's MMAs are done
      // each warp's wait covers its own part of the group: every consumer warp releases the stage
      if (kt > 0 && tid % 32 == 0) {
        const unsigned bar = empty0 + 8 * ((kt - 1) % ST);
        if constexpr (CN * CM == 1) {
          mbar_arrive(bar);
        } else {
          for (unsigned j = 0; j < CN; ++j) mbar_arrive_remote(bar, rank_of(j, cy));
          for (unsigned j = 0; j < CM; ++j)
            if (j != cy) mbar_arrive_remote(bar, rank_of(cx, j));
        }
      }
      __syncwarp();
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  asm volatile("griddepcontrol.launch_dependents;");
  if constexpr (SPLIT > 1) {
    // every stage has been consumed and no load targets this block any more: the stage buffers hold
    // the accumulators now
    float* red = reinterpret_cast<float*>(dyn);
    if constexpr (WG > 1) {  // every consumer group's MMAs have finished reading the stages
      if (wg < WG) asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");
    }
    if (cz != 0 && wg < WG) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) red[i * CONSUMERS + tid] = d[i];
    }
    cluster_sync();
    if (cz == 0 && wg < WG) {
      for (unsigned p = 1; p < SPLIT; ++p) {
        unsigned remote;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(red)), "r"(cx + CN * (cy + CM * p)));
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) {
          float v;
          asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote + 4u * (i * CONSUMERS + tid)));
          d[i] += v;
        }
      }
    }
    cluster_sync();  // the others' shared memory stays until the z = 0 block has read it
    if (cz != 0) return;
  } else if constexpr (CLUSTER > 1) {
    cluster_sync();  // no block leaves while a peer may still arrive on its barriers
  }
  if (wg >= WG) return;
  // The tile goes through shared memory (the stage buffers: every consumer group has finished its
  // MMAs) so the stores to C, and the residual's loads, are whole 16-byte pieces of a row.
  // Accumulator layout of m64nN: warp w of the group holds rows 16w + lane/4 and +8; register 4i+j
  // holds column 8i + 2 (lane % 4) + (j & 1), row + 8 for j >= 2.
  constexpr int PITCH = BN * 2 + 16;  // bytes a staged row; 16 more against bank conflicts
  static_assert(BM * PITCH <= ST * (A_BYTES + W_BYTES), "the staged tile fits the stage buffers");
  asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");
  const int warp = (tid % 128) / 32, lane = tid % 32;
  const int r_local = wg * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int i = 0; i < BN / 8; ++i) {
    const int col = 8 * i + 2 * (lane % 4);
    const __nv_bfloat162 bb = *reinterpret_cast<const __nv_bfloat162*>(bias + n0 + col);
    const float b0 = __bfloat162float(bb.x), b1 = __bfloat162float(bb.y);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v0 = d[4 * i + 2 * h] + b0, v1 = d[4 * i + 2 * h + 1] + b1;
      if (EPI & 1) v0 = gelu_tanh(v0), v1 = gelu_tanh(v1);
      *reinterpret_cast<__nv_bfloat162*>(dyn + (r_local + 8 * h) * PITCH + col * 2) = __floats2bfloat162_rn(v0, v1);
    }
  }
  asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory");
  constexpr int PIECES = BN / 8;  // 16-byte pieces a row
  for (int c = tid; c < BM * PIECES; c += CONSUMERS) {
    const int r = c / PIECES, p = c % PIECES, row = m0 + r;
    if (row >= M) continue;
    uint4 v = *reinterpret_cast<const uint4*>(dyn + r * PITCH + p * 16);
    const size_t off = (size_t)row * N + n0 + p * 8;
    if (EPI & 2) {
      const uint4 rv = *reinterpret_cast<const uint4*>(R + off);
      __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(&v);
      const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&rv);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = __bfloat1622float2(x[j]), b = __bfloat1622float2(y[j]);
        x[j] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
      }
    }
    *reinterpret_cast<uint4*>(C + off) = v;
  }
}

// The producer of the chain: one block per row, writes A[r, c] = C[r, c % N] * 1.0001 (a stand-in for a
// LayerNorm's traffic that reads the last product: a true chain), lets its dependents launch early.
__global__ void __launch_bounds__(256) producer(const bf16* __restrict__ c_in, bf16* __restrict__ a_out, int N, int K) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const size_t r = blockIdx.x;
  for (int c = threadIdx.x; c < K; c += blockDim.x)
    a_out[r * K + c] = __float2bfloat16(__bfloat162float(c_in[r * N + c % N]) * 1.0001f);
}

struct Shape {
  const char* name;
  int N, K, epi;
};

using GemmFn = void (*)(CUtensorMap, CUtensorMap, const bf16*, const bf16*, bf16*, int, int, int);
struct Config {
  std::string name;
  GemmFn fn[4];  // by epi
  int BM, BN, threads, smem, split, cn, cm;
  bool nmajor;
};
template <int WG, int BN, int ST, int SPLIT, int CN, int CM, bool NMAJ = false>
Config make() {
  Config c;
  c.name = std::to_string(64 * WG) + "x" + std::to_string(BN) + " " + std::to_string(ST) + "st" +
           (SPLIT > 1 ? " k/" + std::to_string(SPLIT) : "") +
           (CN * CM > 1 ? " c" + std::to_string(CN) + "x" + std::to_string(CM) : "") + (NMAJ ? " Wkn" : "");
  c.fn[0] = gemm_tma<WG, BN, ST, SPLIT, CN, CM, NMAJ, 0>;
  c.fn[1] = gemm_tma<WG, BN, ST, SPLIT, CN, CM, NMAJ, 1>;
  c.fn[2] = gemm_tma<WG, BN, ST, SPLIT, CN, CM, NMAJ, 2>;
  c.fn[3] = gemm_tma<WG, BN, ST, SPLIT, CN, CM, NMAJ, 3>;
  c.BM = 64 * WG, c.BN = BN, c.threads = (WG + 1) * 128, c.split = SPLIT, c.cn = CN, c.cm = CM, c.nmajor = NMAJ;
  c.smem = ST * (c.BM + BN) * 128 + 2 * ST * 8 + 1024;
  for (auto f : c.fn) CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem));
  return c;
}
bool fits(const Config& c, int N, int K) { return N % (c.BN * c.cn) == 0 && (K / 64) % c.split == 0; }

// 2-D map of a row-major [rows, K] bf16 matrix, boxes of 64 x box_rows, 128-byte swizzle, rows past
// the end read as zeros. (N-major W [K, N]: make_map(W, K, N, 64), boxes of 64 columns x 64 rows.)
CUtensorMap make_map(const bf16* base, int rows, int K, int box_rows) {
  CUtensorMap m;
  const cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
  const cuuint64_t strides[1] = {(cuuint64_t)K * 2};
  const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  const cuuint32_t estr[2] = {1, 1};
  CU(cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box, estr,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return m;
}

void launch(const Config& c, int epi, const CUtensorMap& ma, const CUtensorMap& mw, const bf16* bias, const bf16* R, bf16* C,
            int M, int N, int K, cudaStream_t s, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  const int tiles_m = (M + c.BM - 1) / c.BM;
  cfg.gridDim = dim3(N / c.BN, (tiles_m + c.cm - 1) / c.cm * c.cm, c.split);
  cfg.blockDim = dim3(c.threads);
  cfg.dynamicSmemBytes = c.smem;
  cfg.stream = s;
  cudaLaunchAttribute at[2];
  int n = 0;
  if (c.split * c.cn * c.cm > 1) {
    at[n].id = cudaLaunchAttributeClusterDimension;
    at[n].val.clusterDim.x = c.cn, at[n].val.clusterDim.y = c.cm, at[n].val.clusterDim.z = c.split;
    ++n;
  }
  if (pdl) {
    at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = at;
  cfg.numAttrs = n;
  CK(cudaLaunchKernelEx(&cfg, c.fn[epi], ma, mw, bias, R, C, M, N, K));
}



void run_m(int M, const std::vector<Config>& configs, Lt& lt, cudaStream_t s, bool first_m) {
  const int layers = 12;
  const Shape shapes[] = {{"qkv", 2304, 768, 0}, {"out", 768, 768, 2}, {"fc1", 3072, 768, 1}, {"fc2", 768, 3072, 2}};
  std::printf("%s{\"M\": %d, \"shapes\": [\n", first_m ? "" : ",\n", M);
  bool first = true;
  for (const Shape& sh : shapes) {
    const int N = sh.N, K = sh.K;
    std::vector<bf16> ha((size_t)M * K), hw((size_t)K * N), hwt((size_t)N * K), hb(N), hr((size_t)M * N);
    srand(1);
    auto rnd = [] { return (rand() % 2001 - 1000) / 1000.f; };
    for (auto& x : ha) x = __float2bfloat16(rnd());
    for (auto& x : hw) x = __float2bfloat16(rnd() * 0.05f);
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < N; ++n) hwt[(size_t)n * K + k] = hw[(size_t)k * N + n];
    for (auto& x : hb) x = __float2bfloat16(rnd());
    for (auto& x : hr) x = __float2bfloat16(rnd());
    bf16 *A, *W, *Wt, *B, *R, *C0, *C1;
    CK(cudaMalloc(&A, ha.size() * 2));
    CK(cudaMalloc(&W, hw.size() * 2 * layers));
    CK(cudaMalloc(&Wt, hw.size() * 2 * layers));
    CK(cudaMalloc(&B, hb.size() * 2));
    CK(cudaMalloc(&R, hr.size() * 2));
    CK(cudaMalloc(&C0, hr.size() * 2));
    CK(cudaMalloc(&C1, hr.size() * 2));
    CK(cudaMemcpy(A, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    for (int l = 0; l < layers; ++l) {
      CK(cudaMemcpy(W + (size_t)l * K * N, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(Wt + (size_t)l * K * N, hwt.data(), hwt.size() * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(B, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(R, hr.data(), hr.size() * 2, cudaMemcpyHostToDevice));
    Lt::Plan p = lt.plan(M, N, K, sh.epi, B);
    int li = 0;
    const double t_lt = time_us(s, 60, [&] { lt.run(p, A, W + (size_t)(li++ % layers) * K * N, R, C0, s); });
    lt.run(p, A, W, R, C0, s);
    std::vector<bf16> ref(hr.size()), got(hr.size());
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(ref.data(), C0, ref.size() * 2, cudaMemcpyDeviceToHost));
    std::printf("%s {\"name\": \"%s\", \"N\": %d, \"K\": %d, \"cublaslt_us\": %.2f, \"ours\": [", first ? "" : ",", sh.name, N,
                K, t_lt);
    first = false;
    bool cfirst = true;
    for (const Config& c : configs) {
      if (!fits(c, N, K)) continue;
      const CUtensorMap ma = make_map(A, M, K, c.BM / c.cn);
      std::vector<CUtensorMap> mw(layers);
      for (int l = 0; l < layers; ++l)
        mw[l] = c.nmajor ? make_map(W + (size_t)l * K * N, K, N, 64) : make_map(Wt + (size_t)l * K * N, N, K, c.BN / c.cm);
      CK(cudaMemset(C1, 0, hr.size() * 2));
      launch(c, sh.epi, ma, mw[0], B, R, C1, M, N, K, s, false);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), C1, got.size() * 2, cudaMemcpyDeviceToHost));
      double err = 0, ref_max = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double e = std::fabs(__bfloat162float(got[i]) - __bfloat162float(ref[i]));
        err = std::isnan(e) ? 1e30 : std::max(err, e);
        ref_max = std::max(ref_max, (double)std::fabs(__bfloat162float(ref[i])));
      }
      li = 0;
      const double t = time_us(s, 60, [&] { launch(c, sh.epi, ma, mw[li++ % layers], B, R, C1, M, N, K, s, false); });
      std::printf("%s{\"config\": \"%s\", \"us\": %.2f, \"max_abs_diff_vs_cublaslt\": %.4g, \"ref_max\": %.3g}", cfirst ? "" : ", ",
                  c.name.c_str(), t, err, ref_max);
      cfirst = false;
    }
    std::printf("]}\n");
    for (auto* x : {A, W, Wt, B, R, C0, C1}) CK(cudaFree(x));
  }
  std::printf("],\n");

  // The chain: per layer, producer (writes the product's A from the last product's C) then the
  // product. One CUDA graph from stream capture; programmatic edges when pdl. Each shape with the
  // configuration named by its index (the probe's fastest alone on an H100 at 512 rows).
  std::printf("\"chains_x12\": {");
  bool sfirst = true;
  for (const Shape& sh : shapes) {
    const int N = sh.N, K = sh.K;
    bf16 *X, *A, *W, *B, *C;
    CK(cudaMalloc(&X, (size_t)M * N * 2));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&W, (size_t)K * N * 2 * layers));
    CK(cudaMalloc(&B, N * 2));
    CK(cudaMalloc(&C, (size_t)M * N * 2));
    CK(cudaMemset(X, 0, (size_t)M * N * 2));
    CK(cudaMemset(W, 0, (size_t)K * N * 2 * layers));
    CK(cudaMemset(B, 0, N * 2));
    CK(cudaMemset(C, 0, (size_t)M * N * 2));
    Lt::Plan p = lt.plan(M, N, K, sh.epi, B);
    std::printf("%s\"%s\": {", sfirst ? "" : ", ", sh.name);
    sfirst = false;
    const char* names[] = {"cublaslt", "ours_plain", "ours_pdl"};
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      const Config& c = configs[ci];
      if (!fits(c, N, K)) continue;
      const CUtensorMap ma = make_map(A, M, K, c.BM / c.cn);
      std::vector<CUtensorMap> mw(layers);
      for (int l = 0; l < layers; ++l)
        mw[l] = c.nmajor ? make_map(W + (size_t)l * K * N, K, N, 64) : make_map(W + (size_t)l * K * N, N, K, c.BN / c.cm);
      for (int mode = ci == 0 ? 0 : 1; mode < 3; ++mode) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < layers; ++l) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(M);
          cfg.blockDim = dim3(256);
          cfg.stream = s;
          cudaLaunchAttribute at[1];
          at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          at[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = at;
          cfg.numAttrs = 1;  // the producer waits for the product ahead of it in every mode
          CK(cudaLaunchKernelEx(&cfg, producer, (const bf16*)C, A, N, K));
          if (mode == 0) lt.run(p, A, W + (size_t)l * K * N, X, C, s);
          else launch(c, sh.epi, ma, mw[l], B, X, C, M, N, K, s, mode == 2);
        }
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        const double t = time_us(s, 20, [&] { CK(cudaGraphLaunch(ge, s)); });
        if (mode == 0) std::printf("\"cublaslt_us\": %.2f", t);
        else std::printf(", \"%s %s_us\": %.2f", c.name.c_str(), names[mode], t);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
    }
    std::printf("}");
    for (auto* x : {X, A, W, B, C}) CK(cudaFree(x));
  }
  std::printf("}}");
}

int main(int argc, char** argv) {
  std::vector<int> Ms;
  for (int i = 1; i < argc; ++i) Ms.push_back(std::atoi(argv[i]));
  if (Ms.empty()) Ms = {512};
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaFree(nullptr));
  // <warp groups, BN, stages, K split, cluster along N (A shared), cluster along M (W shared)>
  // <warp groups, BN, stages, K split, cluster along N (A shared), cluster along M (W shared), W read as
  // stored ([K, N], N-major) instead of repacked to [N, K]>
  std::vector<Config> configs = {
      make<1, 32, 8, 1, 1, 1>(),        make<1, 64, 4, 1, 1, 1>(),        make<2, 96, 4, 1, 1, 1>(),
      make<1, 32, 8, 2, 1, 1>(),        make<2, 64, 6, 2, 1, 1>(),        make<1, 64, 4, 1, 1, 1, true>(),
      make<1, 64, 6, 2, 1, 1, true>(),  make<1, 64, 8, 1, 1, 1, true>(),  make<2, 64, 6, 2, 1, 1, true>(),
      make<2, 128, 4, 1, 1, 1, true>(), make<1, 128, 4, 1, 1, 1, true>(), make<1, 64, 6, 4, 1, 1, true>()};
  Lt lt;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"device\": \"%s\", \"runs\": [\n", prop.name);
  for (size_t i = 0; i < Ms.size(); ++i) run_m(Ms[i], configs, lt, s, i == 0);
  std::printf("]}\n");
  return 0;
}
