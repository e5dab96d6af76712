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
// Descriptors and the heuristic's algorithms are cached per call signature (BlasAlgoKey: dtypes,
// transposition, epilogue kind, batch, m, n, k and the batch strides), not per step, so the layers of
// a model that make the same call share one heuristic query; the 32 MiB workspace is allocated once
// per device. The heuristic's answers are also kept on disk (the cuBLASLt algorithm table, below), so
// a warm process asks cuBLASLt nothing: cuBLAS documents cublasLtMatmulAlgo_t as an opaque value that
// may be stored and reused with the same library version, and the table is keyed by that version and
// the device. Errors name the cuBLASLt call and its cublasStatus_t.
// CUDA graphs (graphs.h) capture a call on a capture stream at a shape of their choosing (the
// bucket's padded row count): the algorithm is then the one cached for that shape, and the workspace
// the device's one, so both are fixed for the bucket's lifetime.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/program.h"
#include "device/driver.h"

namespace protean::cuda {
class FakeDriver;
}

namespace protean::backend::cuda {

/// The sizes of one call of a BlasStep (elements; strides per batch entry, 0 = broadcast).
struct BlasShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t stride_a = 0, stride_b = 0;
  bool operator==(const BlasShape&) const = default;
  bool empty() const { return batch == 0 || m == 0 || n == 0; }
};
/// The step's sizes at `symbol_values`.
BlasShape blas_shape(const BlasStep& step, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values);

/// True when libcublasLt could be loaded; else `why` says what failed.
bool cublaslt_available(std::string* why = nullptr);
/// Queues `step` on `device`'s stream. `address(id)` gives each buffer's device address. Throws
/// RuntimeError (library missing, a cuBLASLt call failing, no algorithm for the shape) or
/// NotImplementedError (an epilogue cuBLASLt cannot apply exactly).
/// A product that generated_product_eligible (hopper_gemm.h) accepts runs as the generated product
/// instead (run_blas_at).
void run_blas(const BlasStep& step, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values,
              const std::function<uint64_t(int)>& address, int device);
/// Queues `step` at `shape` on `stream` (a stream of `device`; a capturing stream records the call).
/// The buffers behind `address` must hold the operands at `shape`. Throws as run_blas.
/// `algorithm` >= 0 picks that entry of the heuristic's list at `shape` (blas_tune_algorithms; max-
/// autotune's choice), -1 the heuristic's first.
/// `workspace`, when not 0, is a device buffer of kBlasWorkspaceBytes used instead of the device's
/// shared one (max-autotune times candidates on its own stream while calls may run on the device's).
inline constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;
/// A product that generated_product_eligible accepts (`algorithm` < 0) is queued as the generated
/// product, in stream order (a capture's graph gets its programmatic edges from the recorder).
void run_blas_at(const BlasStep& step, const BlasShape& shape, const std::function<uint64_t(int)>& address, int device,
                 ::protean::cuda::CUstream stream, int algorithm = -1, uint64_t workspace = 0);
/// requestedAlgoCount of the heuristic's query for a call signature (the algorithm table keeps them).
inline constexpr int kBlasHeuristicAlgorithms = 16;
/// requestedAlgoCount of the second query, for algorithms that need no kernel of their own to reduce
/// split-K partials (CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = in place: none, or reduced in the
/// output by the product's own blocks). On an H100 the heuristic's first choice for GPT-2's FC2 at up
/// to 128 rows is a split-K kernel followed by cuBLASLt's splitKreduce_kernel, about 2 us of a graph's
/// time per layer (docs/graphs.md).
inline constexpr int kBlasOneKernelAlgorithms = 8;
/// max-autotune's cuBLASLt candidates for `step` at `shape`, as values of run_blas_at's `algorithm`:
/// the heuristic's first `top` algorithms (0 is its own choice), then up to `one_kernel` of those it
/// answers when asked for no separate reduction kernel that are not among those `top` (asked once per
/// signature, when first wanted, and kept in the algorithm table). With the test hook: 0 .. the count
/// given to set_blas_hook_for_testing (at most `top`). Throws as run_blas.
std::vector<int> blas_tune_algorithms(const BlasStep& step, const BlasShape& shape, int device, int top, int one_kernel);
/// Creates `device`'s cuBLASLt handle and workspace now (before a stream capture, which must not
/// allocate). Throws as run_blas.
void prepare_blas_device(int device);
/// Runs one call signature per distinct algorithm of the cuBLASLt algorithm table (below) once, on
/// scratch memory and the device's stream, so that cuBLASLt's one-time start-up and the loading of each
/// chosen algorithm's kernels (about 175 ms on an H200, otherwise in the first compiled call of a warm
/// process) happen here. Returns how many ran: 0 without cuBLASLt, on the fake driver, with the test
/// hook, or with no table for this device. Stops at the first failure (a `cache` log line says why).
/// The cuda backend runs it on a background thread when a process first uses a device (while the
/// model's weights upload); PROTEAN_CUDA_BLAS_PREWARM=0 turns that off, =own_stream runs the products
/// on a stream of their own (docs/graphs.md: that costs every later graph replay 4-9 %, cause not
/// known), =plan only makes the plans (a diagnostic).
int prewarm_blas(int device);
/// Waits until the background warm-up (if any) has finished: before a stream capture and before
/// max-autotune times algorithms, which must see none of its work on the stream.
void wait_for_blas_prewarm();

// ---- the cuBLASLt algorithm table ------------------------------------------------------------------
//
// File: blob_dir("cublaslt")/<identity, 16 hex digits>.bin, one per (cuBLASLt version, device name,
// compute capability, workspace limit). Bytes (encode_blas_algorithms): magic "PTLTALG2", the
// identity, the entry count, per entry the key's fields, the first one's workspace size, the
// heuristic's algorithms (64 bytes each, the first the heuristic's choice), how many of them answer the
// plain query and whether the one-kernel query was asked (BlasAlgoChoice), then the xxhash64 of
// everything before it. Read once per process on the first heuristic query (a file that does not
// decode is one warning and is ignored: every query then goes to cuBLASLt, never a crash); written
// back (temp file + rename) when the process exits, or by save_blas_algorithms, if queries added
// entries. A process keeps the table of the first device that queries; a device of another identity
// in the same process asks the heuristic every time. PROTEAN_PROGRAM_CACHE=0 turns it off with the
// program cache.

/// What one cuBLASLt call is, for the heuristic: everything its descriptors depend on.
struct BlasAlgoKey {
  int32_t dtype = 0;        ///< DType of a, b and out
  int32_t transpose_b = 0;  ///< Linear: b is [n, k]
  uint32_t epilogue = 0;    ///< cublasLtEpilogue_t value (bias, GELU)
  int64_t batch = 1, m = 0, n = 0, k = 0, stride_a = 0, stride_b = 0;
  auto operator<=>(const BlasAlgoKey&) const = default;
};
/// The heuristic's answer for one key: its algorithms (cublasLtMatmulAlgo_t, 8 words each; the first
/// is its choice, the rest max-autotune's candidates) and the first one's workspace bytes. The first
/// `first_count` algorithms are the answer to the plain query (at most kBlasHeuristicAlgorithms); where
/// `one_kernel_asked`, the rest are the one-kernel query's answer (at most kBlasOneKernelAlgorithms).
struct BlasAlgoChoice {
  std::vector<std::array<uint64_t, 8>> algos;
  uint64_t workspace = 0;
  uint32_t first_count = 0;
  bool one_kernel_asked = false;
  bool operator==(const BlasAlgoChoice&) const = default;
};
using BlasAlgoTable = std::map<BlasAlgoKey, BlasAlgoChoice>;
/// The table's file bytes for `identity` (see above).
std::string encode_blas_algorithms(const BlasAlgoTable& table, uint64_t identity);
/// Reads encode_blas_algorithms' bytes. Throws FormatError naming what is wrong (magic, another
/// identity, truncation, a count or size out of range, the checksum) for anything else; never reads
/// out of bounds.
BlasAlgoTable decode_blas_algorithms(const std::string& bytes, uint64_t identity);
/// Writes the process's table now when queries added entries since it was read (else nothing).
/// Never throws: an unwritable cache is one warning.
void save_blas_algorithms();
/// Forgets the process's table (tests: the next query reads the file again).
void reset_blas_algorithms_for_testing();

/// Where the cuBLASLt side of a process's time went (the first call's breakdown, docs/cuda.md).
struct BlasStats {
  int64_t heuristic_queries = 0;   ///< cublasLtMatmulAlgoGetHeuristic calls
  double heuristic_seconds = 0;    ///< wall time in them (descriptors included)
  int64_t table_hits = 0;          ///< call signatures answered by the algorithm table from disk
  int64_t plans = 0;               ///< distinct call signatures planned (descriptors made)
  int64_t table_entries_read = 0;  ///< entries of the table file read at start
  double setup_seconds = 0;        ///< cublasLtCreate and the workspace allocation
  double table_read_seconds = 0;   ///< reading and checking the table file
  /// PROTEAN_CUDA_BLAS_TABLE_CHECK=1: table entries whose first algorithm differed from the heuristic's.
  int64_t table_mismatches = 0;
};
BlasStats blas_stats();
void reset_blas_stats();

/// Tests on the fake driver: `hook` runs instead of cuBLASLt for every call (it may launch fake
/// kernels on the given stream, which a capture records); an empty hook restores cuBLASLt.
using BlasHook = std::function<void(const BlasStep&, const BlasShape&, const std::function<uint64_t(int)>&,
                                    ::protean::cuda::CUstream)>;
/// `algorithms`: what blas_algorithm_count answers while the hook is set.
void set_blas_hook_for_testing(BlasHook hook, int algorithms = 1);
/// Tests and benchmarks on the fake driver: defines a kernel "gemm" of two 8-byte parameters in
/// `fake` and sets a hook (with `algorithms`) that launches it once per product, with the product's m
/// and n, on the call's stream: each product becomes one kernel node of a captured graph. The hook
/// refers to `fake`, so it must be removed (set_blas_hook_for_testing({})) before `fake` goes.
void set_fake_blas_hook_for_testing(::protean::cuda::FakeDriver& fake, int algorithms = 1);
/// Whether a test hook is installed (set_blas_hook_for_testing).
bool blas_hook_installed();
/// Inside the hook: the `algorithm` argument of the run_blas_at call it stands in for.
int blas_hook_algorithm();

}  // namespace protean::backend::cuda
