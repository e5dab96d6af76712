// Products with few rows on the GPU: C[M, N] = epilogue(A[M, K] · B[K, N]) for bf16 / f16 operands
// with f32 accumulation, the shapes a transformer's projections have at short sequence lengths (M =
// tokens, K and N the model widths). cuBLASLt's kernels for these shapes loop over all of K in one
// block per 64-wide tile, so a 768 x 768 weight streams through a few dozen blocks with few loads in
// flight and a product takes 5-6 µs on an H200 where its bytes need under 1 µs.
//
// The kernel here splits K as well as N (split-K, as flash-decoding splits keys): a grid of N/64
// column tiles x `splits` slices of K x row tiles, each block streaming its [kc, 64] slice of B
// through a 4-stage cp.async ring into ldmatrix + mma.sync m16n8k16 (f32 accumulation). With one
// slice the block applies the epilogue itself; with several, each block writes its f32 partial tile
// to a workspace and the block that finishes its tile last (an atomic counter per tile, reset by that
// block) sums the partials in slice order — a fixed order, so results are deterministic and do not
// depend on M: row r of a product is bit-identical at every M that has it, which a CUDA graph
// captured at a bucket's padded row count relies on. The epilogue is cuBLASLt's: out =
// gelu_tanh(alpha·A·B + bias) or alpha·A·B + bias + beta·C (the BlasEpilogue of program.h).
//
// Taken (else cuBLASLt runs, small_gemm_plan says why): bf16 or f16; B row-major [K, N] (matmul) or
// [N, K] (Linear's weight, read as its transpose); one batch, or a batch whose B is broadcast (stride 0) and whose A is
// dense (the batch folds into M); N and K multiples of 64; at most small_gemm_max_rows() rows; every
// operand 16-byte aligned; an epilogue cuBLASLt could apply. The kernels are NVRTC-compiled once per
// process and architecture (through the artifact cache, kind "cubins") on first use;
// PROTEAN_CUDA_SMALL_GEMM=0 turns the path off.
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
  int64_t rows = 0;       ///< M (batch folded in)
  int row_tiles16 = 1;    ///< 16-row mma tiles per block (1..4): the kernel variant
  int64_t col_tiles = 0;  ///< N / 64 (grid x)
  int64_t splits = 1;     ///< slices of K (grid y)
  int64_t kc = 0;         ///< K rows per slice (a multiple of 64; the last slice may be shorter)
  int64_t row_blocks = 1; ///< ceil(M / (16 * row_tiles16)) (grid z)
  uint32_t shared_bytes = 0;
  int64_t workspace_bytes = 0;  ///< f32 partials: splits * M * N * 4 when splits > 1
};

/// The most rows the small path takes (PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS, default 64; 0 with
/// PROTEAN_CUDA_SMALL_GEMM=0).
int64_t small_gemm_max_rows();
/// Tests and benchmarks: overrides small_gemm_max_rows() (negative: back to the environment's).
void set_small_gemm_max_rows_for_testing(int64_t rows);

/// The plan for `step` at `shape` on a device of `sm_count` multiprocessors, or nullopt with `why`.
/// Pure (no driver calls): unit tests check the split policy. The slices aim at two blocks per
/// multiprocessor, at least one 64-row stage each; the partials stay within kSmallGemmWorkspaceBytes.
inline constexpr int64_t kSmallGemmWorkspaceBytes = int64_t{16} << 20;
inline constexpr int64_t kSmallGemmCounters = 16384;
std::optional<SmallGemmPlan> small_gemm_plan(const BlasStep& step, const BlasShape& shape, int sm_count, std::string& why);

/// The CUDA C of the kernels (entries pt_small_gemm_{bf16,f16}[_t]_r{1,2,3,4}; _t: B is [N, K]).
const std::string& small_gemm_source();

/// Queues the product on `stream` when the small path takes it (the kernels load on first use) and
/// returns true; false leaves it to cuBLASLt (not taken, or the kernels could not be built: one
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
