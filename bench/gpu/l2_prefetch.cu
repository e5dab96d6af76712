// GPT-2 small's 48 layer products (bf16, cuBLASLt, TN) in one CUDA graph, with a small row kernel after
// each: how much of a product's time is its weights' trip from device memory. Variants per row count:
//   cold   48 distinct weights (170 MB, past the L2): every product reads its weights from DRAM;
//   warm   the 4 shapes' weights shared by all layers (14 MB): the products read them from L2;
//   pfD    cold, plus a branch that prefetches product j's weights into L2 from just before product j-D
//          (cp.async.bulk.prefetch.L2, one kernel node of 8 blocks), joined at the graph's end.
// Prints one JSON line per (rows, variant): median and worst of 15 timings of 20 replays each, in µs
// per replay. Build and run on a GPU machine:
//   nvcc -arch=sm_90 -O2 bench/gpu/l2_prefetch.cu -lcublasLt -o l2_prefetch && ./l2_prefetch
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

__global__ void prefetch_l2(const char* p, unsigned long long bytes, int bulk) {
  const unsigned long long chunk = bulk ? 32768 : 128;
  for (unsigned long long off = (static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
       off < bytes; off += static_cast<unsigned long long>(gridDim.x) * blockDim.x * chunk) {
    if (bulk) {
      const unsigned n = static_cast<unsigned>(bytes - off < chunk ? bytes - off : chunk);
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
    } else {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
    }
  }
}

// the row work between products (LayerNorm, GELU, residual stand-in): y = x * 0.5, over rows x cols
// (inline variants: first, thread 0 of each block prefetches its slice of the next products' weights)
__global__ void row_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int n, const char* pf0, unsigned long long pf0_bytes,
                           const char* pf1, unsigned long long pf1_bytes) {
  if (threadIdx.x == 0) {
    for (int q = 0; q < 2; ++q) {
      const char* p = q ? pf1 : pf0;
      const unsigned long long bytes = q ? pf1_bytes : pf0_bytes;
      if (!p) continue;
      const unsigned long long per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
      const unsigned long long off = per * blockIdx.x;
      if (off < bytes) {
        const unsigned long long left = bytes - off;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"((unsigned)(left < per ? left : per))
                     : "memory");
      }
    }
  }
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16(__bfloat162float(x[i]) * 0.5f);
}

struct Gemm {
  int n, k;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, c;
  cublasLtMatmulAlgo_t algo;
  size_t ws;
};

int main(int argc, char** argv) {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("{\"device\":\"%s\",\"sms\":%d,\"l2_bytes\":%d}\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize);
  const int shapes[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};  // n, k
  const int layers = 12;
  std::vector<__nv_bfloat16*> w(layers * 4);
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < 4; ++s) {
      size_t bytes = size_t(shapes[s][0]) * shapes[s][1] * 2;
      CK(cudaMalloc(&w[l * 4 + s], bytes));
      CK(cudaMemset(w[l * 4 + s], 0x3c, bytes));  // small finite bf16 values
    }
  const int max_rows = 512;
  __nv_bfloat16 *x, *y;
  CK(cudaMalloc(&x, size_t(max_rows) * 3072 * 2));
  CK(cudaMalloc(&y, size_t(max_rows) * 3072 * 2));
  CK(cudaMemset(x, 0x3c, size_t(max_rows) * 3072 * 2));
  size_t ws_bytes = 32 << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));
  cudaStream_t st, side;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<cudaEvent_t> fork(layers * 4 + 1), join(layers * 4);
  for (auto& e : fork) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  for (auto& e : join) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  float alpha = 1, beta = 0;

  for (int rows : {1, 16, 64, 128, 256, 512}) {
    Gemm g[4];
    for (int s = 0; s < 4; ++s) {
      g[s].n = shapes[s][0];
      g[s].k = shapes[s][1];
      CB(cublasLtMatmulDescCreate(&g[s].desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
      CB(cublasLtMatmulDescSetAttribute(g[s].desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
      CB(cublasLtMatmulDescSetAttribute(g[s].desc, CUBLASLT_MATMUL_DESC_TRANSB, &nn, sizeof nn));
      CB(cublasLtMatrixLayoutCreate(&g[s].a, CUDA_R_16BF, g[s].k, g[s].n, g[s].k));
      CB(cublasLtMatrixLayoutCreate(&g[s].b, CUDA_R_16BF, g[s].k, rows, g[s].k));
      CB(cublasLtMatrixLayoutCreate(&g[s].c, CUDA_R_16BF, g[s].n, rows, g[s].n));
      cublasLtMatmulPreference_t pref;
      CB(cublasLtMatmulPreferenceCreate(&pref));
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
      cublasLtMatmulHeuristicResult_t h;
      int found = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, g[s].desc, g[s].a, g[s].b, g[s].c, g[s].c, pref, 1, &h, &found));
      if (!found) {
        std::fprintf(stderr, "no algorithm for %d x %d x %d\n", rows, g[s].n, g[s].k);
        return 1;
      }
      g[s].algo = h.algo;
      g[s].ws = h.workspaceSize;
      cublasLtMatmulPreferenceDestroy(pref);
    }
    // variants: 0 cold, 1 warm, 2.. prefetch at distance D (bulk), then line prefetch at D = 1
    struct V { const char* name; int warm, dist, bulk, blocks, inline_ahead = 0; };
    const V variants[] = {{"cold", 0, 0, 1, 8},  {"warm", 1, 0, 1, 8},   {"pf1_bulk", 0, 1, 1, 8},
                          {"pf2_bulk", 0, 2, 1, 8}, {"pf1_line", 0, 1, 0, 16}, {"pf2_bulk_b2", 0, 2, 1, 2},
                          {"inline1", 0, 0, 1, 0, 1}, {"inline2", 0, 0, 1, 0, 2}};
    for (const V& v : variants) {
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      int joins = 0;
      for (int j = 0; j < layers * 4; ++j) {
        if (v.dist > 0) {
          // product t's weights are prefetched from just before product t - dist runs
          auto prefetch = [&](int t) {
            CK(cudaEventRecord(fork[t], st));
            CK(cudaStreamWaitEvent(side, fork[t], 0));
            const size_t bytes = size_t(shapes[t % 4][0]) * shapes[t % 4][1] * 2;
            prefetch_l2<<<v.blocks, 32, 0, side>>>(reinterpret_cast<const char*>(w[t]), bytes, v.bulk);
            CK(cudaEventRecord(join[joins++], side));
          };
          if (j == 0)
            for (int t = 1; t <= v.dist && t < layers * 4; ++t) prefetch(t);
          else if (j + v.dist < layers * 4)
            prefetch(j + v.dist);
        }
        const Gemm& gm = g[j % 4];
        const __nv_bfloat16* wj = v.warm ? w[j % 4] : w[j];
        CB(cublasLtMatmul(lt, gm.desc, &alpha, wj, gm.a, x, gm.b, &beta, y, gm.c, y, gm.c, &gm.algo, ws, gm.ws, st));
        const int n = rows * gm.n;
        const char* pf[2] = {nullptr, nullptr};
        unsigned long long pfb[2] = {0, 0};
        for (int q = 0; q < v.inline_ahead; ++q)
          if (j + 1 + q < layers * 4) {
            pf[q] = reinterpret_cast<const char*>(w[j + 1 + q]);
            pfb[q] = size_t(shapes[(j + 1 + q) % 4][0]) * shapes[(j + 1 + q) % 4][1] * 2;
          }
        row_kernel<<<(n + 255) / 256, 256, 0, st>>>(x, y, std::min(n, rows * 3072), pf[0], pfb[0], pf[1], pfb[1]);
      }
      for (int i = 0; i < joins; ++i) CK(cudaStreamWaitEvent(st, join[i], 0));
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, st));
      CK(cudaStreamSynchronize(st));
      std::vector<float> t;
      for (int r = 0; r < 15; ++r) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(exec, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.f / 20);
      }
      std::sort(t.begin(), t.end());
      std::printf("{\"rows\":%d,\"variant\":\"%s\",\"median_us\":%.2f,\"worst_us\":%.2f,\"best_us\":%.2f}\n", rows,
                  v.name, t[t.size() / 2], t.back(), t.front());
      std::fflush(stdout);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
    }
    for (auto& gm : g) {
      cublasLtMatmulDescDestroy(gm.desc);
      cublasLtMatrixLayoutDestroy(gm.a);
      cublasLtMatrixLayoutDestroy(gm.b);
      cublasLtMatrixLayoutDestroy(gm.c);
    }
  }
  return 0;
}
