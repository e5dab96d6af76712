// What the GEMM probes (gemm_probe.cu, wgmma_probe.cu) measure against and how they time: cuBLASLt's
// first heuristic choice for a row-major bf16 product with its bias / GELU / residual epilogue, and
// the median time of a launch from CUDA events around batches of launches. Header only, built into
// each probe with nvcc.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

struct Lt {
  cublasLtHandle_t h;
  void* ws;
  size_t ws_bytes = 32u << 20;
  Lt() {
    CB(cublasLtCreate(&h));
    CK(cudaMalloc(&ws, ws_bytes));
  }
  // C[M,N] row-major = A[M,K] W[K,N] (+bias, gelu) (+R via beta = 1): column-major C^T = W^T A^T.
  struct Plan {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool residual;
  };
  Plan plan(int M, int N, int K, int epi, const __nv_bfloat16* bias) {
    Plan p;
    CB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtEpilogue_t e = (epi & 1) ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    cudaDataType_t bt = CUDA_R_16BF;
    CB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    CB(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, N, K, N));
    CB(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
    CB(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, N, M, N));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t r;
    int n = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(h, p.op, p.a, p.b, p.c, p.c, pref, 1, &r, &n));
    if (n < 1) {
      std::fprintf(stderr, "no cuBLASLt algorithm\n");
      std::exit(1);
    }
    p.algo = r.algo;
    p.residual = epi & 2;
    cublasLtMatmulPreferenceDestroy(pref);
    return p;
  }
  void run(const Plan& p, const __nv_bfloat16* A, const __nv_bfloat16* W, const __nv_bfloat16* R, __nv_bfloat16* C, cudaStream_t s) {
    const float one = 1.f, beta = p.residual ? 1.f : 0.f;
    CB(cublasLtMatmul(h, p.op, &one, W, p.a, A, p.b, &beta, p.residual ? R : C, p.c, C, p.c, &p.algo, ws, ws_bytes, s));
  }
};

// Median microseconds of one f() over 9 batches of `reps` calls on `s`, after 3 calls of warm-up.
template <typename F>
double time_us(cudaStream_t s, int reps, F&& f) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<double> v;
  for (int w = 0; w < 3; ++w) f();
  for (int b = 0; b < 9; ++b) {
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; ++i) f();
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(1000.0 * ms / reps);
  }
  std::sort(v.begin(), v.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return v[v.size() / 2];
}
