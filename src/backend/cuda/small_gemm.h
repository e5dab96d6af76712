// Products with few rows on the GPU: C[M, N] = epilogue(A[M, K] · B[K, N]) for bf16 / f16 operands
// with f32 accumulation and M <= 128, the shapes a transformer's projections have at short sequence
// lengths (M = tokens, K and N the model widths).
//
// One thread-block cluster (sm_90+) per 64-column tile, its blocks splitting K (split-K, up to 8 blocks,
// enough for about one block per multiprocessor): each block streams its [K/C, 64] slice of B and the
// matching columns of A through an 8-stage cp.async ring into ldmatrix + mma.sync m16n8k16 (f32
// accumulation), writes its f32 partial tile to its own shared memory, and after a cluster barrier each
// block sums a share of the tile's rows over all blocks' tiles through distributed shared memory in
// block-rank order (no workspace, no atomics, no second kernel). The order of that sum and every
// block's K range depend on N, K and the device only, never on M: row r of a product has the same bits
// at every row count, which a CUDA graph captured at a bucket's padded row count relies on. The
// epilogue is cuBLASLt's: out = gelu_tanh(alpha·A·B + bias) or alpha·A·B + bias + beta·C (the
// BlasEpilogue of program.h).
//
// Taken (else cuBLASLt runs; small_gemm_plan says why): bf16 or f16; B row-major [K, N] (matmul) or
// [N, K] (Linear's weight, read as its transpose); one batch, or a batch whose B is broadcast (stride 0)
// and whose A is dense (the batch folds into M); N a multiple of 64 and K of 32; at most
// small_gemm_max_rows() rows; every operand 16-byte aligned; an epilogue cuBLASLt could apply. The
// kernels are NVRTC-compiled once per architecture (through the artifact cache, kind "cubins") when a
// device first becomes ready. PROTEAN_CUDA_SMALL_GEMM=0 turns the path off.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "backend/cuda/blas.h"
#include "backend/cuda/program.h"
#include "device/driver.h"

namespace protean::backend::cuda {

/// The launch of one small product.
struct SmallGemmPlan {
  int64_t rows = 0;       ///< M (batch folded in), 1..128
  int row_tiles16 = 1;    ///< 16-row mma tiles (1..8): the kernel variant
  int64_t col_tiles = 0;  ///< N / 64
  int64_t splits = 1;     ///< blocks per cluster splitting K (1..8); the grid is col_tiles * splits blocks
  int64_t kc = 0;         ///< K rows of the largest block's slice (a multiple of 32)
  uint32_t shared_bytes = 0;  ///< dynamic shared memory per block
};

/// The most rows the small path takes (PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS, at most 128; 0 with
/// PROTEAN_CUDA_SMALL_GEMM=0).
int64_t small_gemm_max_rows();
/// Tests and benchmarks: overrides small_gemm_max_rows() (negative: back to the environment's).
void set_small_gemm_max_rows_for_testing(int64_t rows);

/// The plan for `step` at `shape` on a device of `sm_count` multiprocessors, or nullopt with `why`.
/// Pure (no driver calls): unit tests check the split policy.
std::optional<SmallGemmPlan> small_gemm_plan(const BlasStep& step, const BlasShape& shape, int sm_count, std::string& why);

/// The CUDA C of the kernels (entries pt_small_gemm_{bf16,f16}[_t]_r{1..8}; _t: B is [N, K]).
const std::string& small_gemm_source();

/// Queues the product on `stream` (cuLaunchKernelEx with the cluster dimension; a capture records it)
/// when the small path takes it and returns true; false leaves it to cuBLASLt (not taken, or the kernels could not be built: one
/// `perf_hints` line says why, once). `address(id)` gives each buffer's device address. Throws
/// CudaError when the launch itself fails.
bool run_small_gemm(const BlasStep& step, const BlasShape& shape, const std::function<uint64_t(int)>& address,
                    int device, ::protean::cuda::CUstream stream);
/// Whether run_small_gemm would take `step` at `shape` on `device` (operands assumed 16-byte aligned;
/// loads the kernels). max-autotune leaves such products to it rather than timing cuBLASLt's.
bool small_gemm_applies(const BlasStep& step, const BlasShape& shape, int device);
/// Builds and loads the kernels for `device` now (outside any stream capture; the cuda backend does it
/// when a device first becomes ready). Never throws: a failure is remembered and logged.
void prepare_small_gemm(int device);
/// Products the small path ran in this process (plain launches and captures).
int64_t small_gemm_launches();

}  // namespace protean::backend::cuda
