// Error checks of the GPU micro-benchmarks (bench/gpu/*.cu, each built on its own with nvcc): CK for a
// CUDA runtime call, CU for a CUDA driver call, CB for a cuBLAS / cuBLASLt call; each prints the call,
// file and line and exits 1.
#pragma once

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)
#define CB(x)                                                                            \
  do {                                                                                   \
    cublasStatus_t s_ = (x);                                                             \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d %s: status %d\n", __FILE__, __LINE__, #x, (int)s_);    \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CU(x)                                                                      \
  do {                                                                             \
    CUresult r_ = (x);                                                             \
    if (r_ != CUDA_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s:%d %s: CUresult %d\n", __FILE__, __LINE__, #x, (int)r_); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)
