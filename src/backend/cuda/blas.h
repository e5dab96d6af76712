// Matrix products through cuBLASLt, loaded at run time (dlopen libcublasLt.so.13, then .so.12).
//
// A BlasStep (program.h) is row-major: out[batch, m, n] = a[batch, m, k] · b[batch, k, n] (b is [n, k]
// and used transposed for Linear). cuBLASLt is column-major, so the call computes outᵀ = bᵀ · aᵀ: a
// row-major [m, n] matrix is a column-major [n, m] one with the same bytes. Operands are bf16, f16 or
// f32 with f32 accumulation (CUBLAS_COMPUTE_32F) and f32 alpha/beta, as torch.matmul on CUDA does by
// default. Epilogues: bias (a vector of n values, CUBLASLT_EPILOGUE_BIAS), GELU in cuBLASLt's tanh
// form (CUBLASLT_EPILOGUE_GELU[_BIAS]: PyTorch's gelu(approximate="tanh"), transformers' gelu_new; an
// erf-form GELU cannot be fused and is refused), and a
// residual C added with beta (out = act(alpha·a·b + bias) + beta·C requires act = none; cuBLASLt
// adds beta·C before the epilogue, so GELU and a residual are never fused together).
// Descriptors and the heuristic's first algorithm are cached per (step, batch, m, n, k); the 32 MiB
// workspace is allocated once per device. Errors name the cuBLASLt call and its cublasStatus_t.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/program.h"

namespace protean::backend::cuda {

/// True when libcublasLt could be loaded; else `why` says what failed.
bool cublaslt_available(std::string* why = nullptr);
/// Queues `step` on `device`'s stream. `address(id)` gives each buffer's device address. Throws
/// RuntimeError (library missing, a cuBLASLt call failing, no algorithm for the shape) or
/// NotImplementedError (an epilogue cuBLASLt cannot apply exactly).
void run_blas(const BlasStep& step, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values,
              const std::function<uint64_t(int)>& address, int device);

}  // namespace protean::backend::cuda
