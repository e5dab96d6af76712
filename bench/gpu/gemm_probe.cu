// Probe for generated products on the GPU: is a tensor-core GEMM that waits for its prior grids
// (griddepcontrol.wait, so it may hang on a programmatic edge) as fast as cuBLASLt on GPT-2 small's
// products, and what does the overlap buy in a chain of producer -> product pairs?
//
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/gpu/gemm_probe.cu -lcublasLt -o gemm_probe && ./gemm_probe [M]
//
// Shapes (row-major, bf16, f32 accumulation, bf16 out): C[M, N] = A[M, K] · W[K, N] + bias (+ GELU
// tanh form) (+ residual), GPT-2 small's four Linear calls: QKV 768->2304, out 768->768 (+ residual),
// FC1 768->3072 (+ GELU), FC2 3072->768 (+ residual). The weights cycle through 12 copies (one per
// layer) so they come from device memory as in the model. Times are CUDA events around 60 launches,
// median of 9 batches. The chain: 12 x (a row kernel that writes A, then the product) in one CUDA
// graph, plain edges against programmatic ones.
// Prints one JSON object.
#include <cublasLt.h>
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

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp16(unsigned dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * x * (1.f + tanhf(k0 * (x + k1 * x * x * x)));
}

// EPI bit 1: GELU, bit 2: residual. BM x BN block tile, BK deep, WM x WN warps, STAGES cp.async stages.
template <int BM, int BN, int BK, int WM, int WN, int STAGES, int EPI>
__global__ void __launch_bounds__(WM* WN * 32)
    gemm(const bf16* __restrict__ A, const bf16* __restrict__ W, const bf16* __restrict__ bias,
         const bf16* __restrict__ R, bf16* __restrict__ C, int M, int N, int K) {
  constexpr int NT = WM * WN * 32, TM = BM / WM, TN = BN / WN, MI = TM / 16, NI = TN / 8;
  static_assert(NI % 2 == 0, "two n-tiles per ldmatrix");
  extern __shared__ __align__(16) unsigned char dyn[];
  bf16(*As)[BM][BK + 8] = reinterpret_cast<bf16(*)[BM][BK + 8]>(dyn);
  bf16(*Bs)[BK][BN + 8] = reinterpret_cast<bf16(*)[BK][BN + 8]>(dyn + STAGES * BM * (BK + 8) * 2);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp / WN, wn = warp % WN;
  auto load = [&](int stage, int kt) {
    const int k0 = kt * BK;
#pragma unroll
    for (int i = threadIdx.x; i < BM * BK / 8; i += NT) {
      const int r = i / (BK / 8), c = (i % (BK / 8)) * 8;
      const bool in = m0 + r < M;
      cp16(smem_addr(&As[stage][r][c]), in ? A + (size_t)(m0 + r) * K + k0 + c : A, in);
    }
#pragma unroll
    for (int i = threadIdx.x; i < BK * BN / 8; i += NT) {
      const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
      cp16(smem_addr(&Bs[stage][r][c]), W + (size_t)(k0 + r) * N + n0 + c, true);
    }
  };
  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
  const int KT = K / BK;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int kt = 0; kt < KT; ++kt) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const int st = kt % STAGES;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned a[MI][4], b[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const unsigned ad = smem_addr(&As[st][wm * TM + i * 16 + (lane & 15)][kk * 16 + (lane >> 4) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                     : "r"(ad));
      }
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        const unsigned ad = smem_addr(&Bs[st][kk * 16 + (lane & 15)][wn * TN + (j + (lane >> 4)) * 8]);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1])
                     : "r"(ad));
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
          asm volatile(
              "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
              "{%0,%1,%2,%3};"
              : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
              : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
    }
  }
  asm volatile("griddepcontrol.launch_dependents;");
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j) {
      const int col = n0 + wn * TN + j * 8 + 2 * t;
      const float b0 = __bfloat162float(bias[col]), b1 = __bfloat162float(bias[col + 1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm * TM + i * 16 + g + h * 8;
        if (row >= M) continue;
        float v0 = acc[i][j][2 * h] + b0, v1 = acc[i][j][2 * h + 1] + b1;
        if (EPI & 1) v0 = gelu_tanh(v0), v1 = gelu_tanh(v1);
        if (EPI & 2) {
          const __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162*>(R + (size_t)row * N + col);
          v0 += __bfloat162float(r.x);
          v1 += __bfloat162float(r.y);
        }
        *reinterpret_cast<__nv_bfloat162*>(C + (size_t)row * N + col) = __floats2bfloat162_rn(v0, v1);
      }
    }
}

// The producer of the chain: one block per row of 768, reads x, writes y = x * 1.0001 (a stand-in for
// a LayerNorm's traffic), waits for its prior grids and lets its dependents launch early.
__global__ void __launch_bounds__(256) producer(const bf16* __restrict__ x, bf16* __restrict__ y, int cols) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  const size_t r = blockIdx.x;
  for (int c = threadIdx.x; c < cols; c += blockDim.x)
    y[r * cols + c] = __float2bfloat16(__bfloat162float(x[r * cols + c]) * 1.0001f);
}

struct Shape {
  const char* name;
  int N, K, epi;
};

using GemmFn = void (*)(const bf16*, const bf16*, const bf16*, const bf16*, bf16*, int, int, int);
struct Config {
  std::string name;
  GemmFn fn[4];  // by epi
  int BM, BN, threads, smem;
};
template <int BM, int BN, int BK, int WM, int WN, int ST>
Config make(const char* name) {
  Config c;
  c.name = name;
  c.fn[0] = gemm<BM, BN, BK, WM, WN, ST, 0>;
  c.fn[1] = gemm<BM, BN, BK, WM, WN, ST, 1>;
  c.fn[2] = gemm<BM, BN, BK, WM, WN, ST, 2>;
  c.fn[3] = gemm<BM, BN, BK, WM, WN, ST, 3>;
  c.BM = BM, c.BN = BN, c.threads = WM * WN * 32;
  c.smem = ST * (BM * (BK + 8) + BK * (BN + 8)) * 2;
  for (auto f : c.fn) CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, c.smem));
  return c;
}

void launch(const Config& c, int epi, const bf16* A, const bf16* W, const bf16* bias, const bf16* R, bf16* C, int M,
            int N, int K, cudaStream_t s, bool pdl) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(N / c.BN, (M + c.BM - 1) / c.BM);
  cfg.blockDim = dim3(c.threads);
  cfg.dynamicSmemBytes = c.smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, c.fn[epi], A, W, bias, R, C, M, N, K));
}



int main(int argc, char** argv) {
  const int M = argc > 1 ? std::atoi(argv[1]) : 512;
  const int layers = 12;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Config> configs = {
      make<64, 64, 64, 2, 2, 3>("64x64x64 4w 3st"),   make<64, 128, 64, 2, 2, 3>("64x128x64 4w 3st"),
      make<128, 64, 64, 2, 2, 3>("128x64x64 4w 3st"), make<128, 128, 32, 2, 4, 4>("128x128x32 8w 4st"),
      make<64, 32, 64, 2, 1, 4>("64x32x64 2w 4st"),   make<32, 64, 64, 1, 2, 4>("32x64x64 2w 4st"),
  };
  const Shape shapes[] = {{"qkv", 2304, 768, 0}, {"out", 768, 768, 2}, {"fc1", 3072, 768, 1}, {"fc2", 768, 3072, 2}};
  Lt lt;
  std::printf("{\"M\": %d, \"shapes\": [\n", M);
  bool first = true;
  for (const Shape& sh : shapes) {
    const int N = sh.N, K = sh.K;
    std::vector<bf16> ha((size_t)M * K), hw((size_t)K * N), hb(N), hr((size_t)M * N);
    srand(1);
    auto rnd = [] { return (rand() % 2001 - 1000) / 1000.f; };
    for (auto& x : ha) x = __float2bfloat16(rnd());
    for (auto& x : hw) x = __float2bfloat16(rnd() * 0.05f);
    for (auto& x : hb) x = __float2bfloat16(rnd());
    for (auto& x : hr) x = __float2bfloat16(rnd());
    bf16 *A, *W, *B, *R, *C0, *C1;
    CK(cudaMalloc(&A, ha.size() * 2));
    CK(cudaMalloc(&W, hw.size() * 2 * layers));
    CK(cudaMalloc(&B, hb.size() * 2));
    CK(cudaMalloc(&R, hr.size() * 2));
    CK(cudaMalloc(&C0, hr.size() * 2));
    CK(cudaMalloc(&C1, hr.size() * 2));
    CK(cudaMemcpy(A, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    for (int l = 0; l < layers; ++l) CK(cudaMemcpy(W + (size_t)l * K * N, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(R, hr.data(), hr.size() * 2, cudaMemcpyHostToDevice));
    Lt::Plan p = lt.plan(M, N, K, sh.epi, B);
    int li = 0;
    const double t_lt = time_us(s, 60, [&] { lt.run(p, A, W + (size_t)(li++ % layers) * K * N, R, C0, s); });
    lt.run(p, A, W, R, C0, s);
    std::vector<bf16> ref(hr.size()), got(hr.size());
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(ref.data(), C0, ref.size() * 2, cudaMemcpyDeviceToHost));
    std::printf("%s {\"name\": \"%s\", \"N\": %d, \"K\": %d, \"cublaslt_us\": %.2f, \"ours\": [", first ? "" : ",", sh.name,
                N, K, t_lt);
    first = false;
    bool cfirst = true;
    for (const Config& c : configs) {
      if (N % c.BN) continue;
      li = 0;
      const double t = time_us(s, 60, [&] {
        launch(c, sh.epi, A, W + (size_t)(li++ % layers) * K * N, B, R, C1, M, N, K, s, false);
      });
      launch(c, sh.epi, A, W, B, R, C1, M, N, K, s, false);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), C1, got.size() * 2, cudaMemcpyDeviceToHost));
      double err = 0, ref_max = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, (double)std::fabs(__bfloat162float(got[i]) - __bfloat162float(ref[i])));
        ref_max = std::max(ref_max, (double)std::fabs(__bfloat162float(ref[i])));
      }
      std::printf("%s{\"config\": \"%s\", \"us\": %.2f, \"max_abs_diff_vs_cublaslt\": %.4g, \"ref_max\": %.3g}",
                  cfirst ? "" : ", ", c.name.c_str(), t, err, ref_max);
      cfirst = false;
    }
    std::printf("]}\n");
    for (auto* x : {A, W, B, R, C0, C1}) CK(cudaFree(x));
  }
  std::printf("],\n");

  // The chain: per layer, producer (writes the product's A) then the product (out-projection shape,
  // 768 -> 768 + residual). One CUDA graph from stream capture; programmatic edges when pdl.
  {
    const int N = 768, K = 768;
    bf16 *X, *A, *W, *B, *C;
    CK(cudaMalloc(&X, (size_t)M * K * 2));
    CK(cudaMalloc(&A, (size_t)M * K * 2));
    CK(cudaMalloc(&W, (size_t)K * N * 2 * layers));
    CK(cudaMalloc(&B, N * 2));
    CK(cudaMalloc(&C, (size_t)M * N * 2));
    CK(cudaMemset(X, 0, (size_t)M * K * 2));
    CK(cudaMemset(W, 0, (size_t)K * N * 2 * layers));
    CK(cudaMemset(B, 0, N * 2));
    CK(cudaMemset(C, 0, (size_t)M * N * 2));
    Lt::Plan p = lt.plan(M, N, K, 2, B);
    std::printf("\"chain_out_proj_x12\": {");
    const char* names[] = {"cublaslt", "ours_plain", "ours_pdl"};
    for (int mode = 0; mode < 3; ++mode) {
      const Config& c = configs[0];
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
        cfg.numAttrs = mode == 2 ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, producer, (const bf16*)C, A, K));  // reads the last product: a true chain
        if (mode == 0) lt.run(p, A, W + (size_t)l * K * N, X, C, s);
        else launch(c, 2, A, W + (size_t)l * K * N, B, X, C, M, N, K, s, mode == 2);
      }
      CK(cudaStreamEndCapture(s, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      const double t = time_us(s, 20, [&] { CK(cudaGraphLaunch(ge, s)); });
      std::printf("%s\"%s_us\": %.2f", mode ? ", " : "", names[mode], t);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    std::printf("}}\n");
  }
  return 0;
}
