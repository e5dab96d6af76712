// The CUDA C renderer: a scheduled loop Program (loop/schedule.h) whose kernels carry cuda
// schedules (loop::Schedule set by loop/schedule_cuda.h's policy) → ONE translation unit holding two
// entry points per kernel, plus the launch data of program.h (parameter layout, launch rules,
// variant rule). Scalar expressions go through the shared C-style renderer (loop/c_expr.h) in the
// CUDA dialect: its scalar-op table, with the prelude's pt:: functions spelled as in the cpu
// runtime (pt::exp, pt::powf_<T>, pt::maxn<T>), f16/bf16 computed in f32, f32 division pt::fdiv.
//
// The translation unit includes no header: the prelude (cuda_prelude()) defines what kernels need —
// bf16 and f16 load/store conversions (bit operations and cvt instructions; storage in 16 bits,
// compute in f32, stores rounded to nearest even), NaN-propagating max/min, the scalar functions of
// loop/scalar_ops.def for float and double (CUDA's libdevice functions: expf, erff, ...), warp
// shuffles, and pt::Vec, an aligned array of V elements for 16-byte loads and stores.
//
// Each kernel is rendered as
//   extern "C" __global__ void __launch_bounds__(T) kernelN_general(<buffers>, <sizes>)
//   extern "C" __global__ void __launch_bounds__(T) kernelN_aligned(<same parameters>)
// with buffer parameters in buffer-id order (`const float* __restrict__ b0`: storage types, bf16 and
// f16 as unsigned short), then one `long long` per size symbol the kernel uses (symbols order).
// Sizes are always arguments: one cubin serves every size. Index math is `long long`, or `int` when
// the schedule's `index32` says bounds prove it fits.
//  * GridStride: `for (g = blockIdx.x * T + threadIdx.x; g < n / V; g += gridDim.x * T)` over the
//    flattened outer domain; the aligned variant handles V consecutive innermost elements per step;
//  * row forms: the row (outer point) from blockIdx.x (and the warp index for WarpPerRow); each stage
//    loops over its inner domain from the thread's lane with the row's threads as stride;
//    reductions fold per thread, then combine by __shfl_xor_sync and (block per row) through shared
//    memory; welford merges (count, mean, M2) triples with Chan et al.'s formulas; with rows_persist
//    the loads the stages share and the stashed values live in register arrays indexed by unrolled
//    constants.
// Aligned variant: in every loop whose innermost extent may be a multiple of V, each access that is
// unit-stride in the innermost variable and whose start is a multiple of V (given the variant rule) is
// one V-element access (16 bytes for f32 with V = 4, bf16 with V = 8); other accesses stay scalar. The
// variant rule (program.h: VariantRule) collects the sizes that must be multiples of V and the buffers
// that must be 16-byte aligned. A kernel with nothing to vectorize has one entry `kernelN` for both.
// Loads under a select's branch are never hoisted (cat and pad guard them with the select).
// Output is deterministic (golden tests compare it; equal programs give equal cache keys).
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/program.h"
#include "loop/loop_ir.h"
#include "loop/schedule_cuda.h"

namespace protean::backend::cuda {

/// The first statement of every kernel entry Protean generates (loop kernels and the externs'
/// kernels of pipeline.h alike): pt::wait_prior_grids() of the prelude, which on sm_90+ executes
/// `griddepcontrol.wait` (the kernel's memory accesses wait until the grids ahead of it in the stream
/// have completed and their writes are visible) and then `griddepcontrol.launch_dependents` (the
/// kernel after it may be scheduled). That makes a programmatic dependent launch of the kernel safe
/// (CudaKernel::waits_for_prior_grids); launched plainly, both instructions do nothing.
inline constexpr const char* kWaitPriorGrids = "  pt::wait_prior_grids();\n";

/// The CUDA C type of a buffer element of dtype `t` in memory ("float", "long long", "pt::u16" for the
/// bit patterns of f16 and bf16, ...): kernel parameters and loads of generated and extern kernels.
const char* storage_type(DType t);

/// The entries of `source` (each `extern "C" __global__` function at a line start) whose body starts
/// with kWaitPriorGrids (after the size loads of SizeArgs::FromMemory, if any). The compile sets CudaKernel::waits_for_prior_grids from it, so a kernel is
/// launched programmatically only when its text was seen to wait.
std::set<std::string> entries_waiting_for_prior_grids(std::string_view source);

/// How a kernel receives its size symbols.
///  * ByValue: one `long long` parameter per symbol it uses (ParamKind::Symbol), so a launch at other
///    sizes passes other arguments.
///  * FromMemory: one parameter `const long long* pt_sizes` (ParamKind::Sizes: the call's symbol
///    values in device memory, indexed like CudaProgram::symbols, written by the runtime before the
///    call's first launch), read before the kernel waits for its prior grids; and every block past the
///    kernel's work returns at once, so the kernel computes the same at any grid at least as large as
///    its launch rule gives. A graph node can then keep one argument block and one grid (its size
///    bucket's upper bounds) for every size of the bucket (graphs.h), where by-value sizes patch the
///    node at each new size. Kernels without size symbols are the same in both.
enum class SizeArgs : uint8_t { ByValue, FromMemory };
/// The FromMemory parameter as every renderer declares it.
inline constexpr const char* kSizesParam = "const long long* __restrict__ pt_sizes";
/// The FromMemory load of symbol `index` (of CudaProgram::symbols) named `name`, as C type `type`: one
/// line, before kWaitPriorGrids (entries_waiting_for_prior_grids skips such lines).
std::string size_load(const std::string& type, const std::string& name, size_t index);

struct RenderedProgram {
  std::string source;               ///< prelude + kernels
  std::vector<CudaKernel> kernels;  ///< one per loop kernel, in order (resources not filled yet)
};

/// Renders every kernel of `p` with its schedule (Kernel::schedule, set by loop::CudaSchedulePolicy
/// through loop::apply_schedule). With `approx_math`, kernels whose every output is bf16 or f16 call
/// the prelude's approximate f32 forms (pt::lp::exp, pt::lp::normal_cdf: relative error at most
/// about 2e-5, far below 16-bit rounding); otherwise, and for f32/f64 outputs, CUDA's accurate
/// functions. Throws CompileError for a kernel without a cuda schedule.
/// `sizes`: SizeArgs (by value unless the caller asks otherwise).
RenderedProgram render_cuda(const loop::Program& p, bool approx_math = true, SizeArgs sizes = SizeArgs::ByValue);
/// mode "max-autotune": one candidate's compiled-in parameters (program.h: TuneVariant).
struct TuneChoice {
  int rows_per_block = 1;
  int vector_width = 1;
  int split = 1;  ///< blocks of a thread-block cluster sharing one row (a block per row; TuneVariant::split)
  bool operator==(const TuneChoice&) const = default;
};

/// The cluster sizes a block-per-row kernel's row may be split over (TuneVariant::split): each block of
/// the cluster reduces 1/split of the row, the partial statistics go through distributed shared memory,
/// then each block finishes its slice. For few long rows (fewer rows than multiprocessors).
inline constexpr int kRowSplits[] = {2, 4};

/// The candidates of a row kernel's schedule, candidate 0 its own choice: a warp-per-row kernel gets
/// rows per block 1, 2 and 4, every row kernel vector widths 2, 4 and 8 up to the schedule's (16 bytes
/// of the narrowest element), all combinations; a block-per-row kernel (64 threads or more) also its
/// own choice split over clusters of kRowSplits blocks (a row kept in registers only where its
/// elements per thread divide by the split). Empty for other kernels and where only candidate 0
/// would remain. Rows per block only regroup whole rows (each row keeps its warp and lanes), so their
/// results equal candidate 0's bit for bit; another vector width or a split deals the row's elements
/// to the threads differently, so a reduction adds in another order (results within f32 rounding of
/// the accumulation, usually equal after a 16-bit store).
std::vector<TuneChoice> tune_candidates(const loop::Schedule& s);

/// Most row kernels (distinct entries) given candidates per program: bounds the variants' NVRTC time.
inline constexpr size_t kMaxTunedRowKernels = 16;

/// Renders the candidate variants (tune_candidates, candidate 0 left out) of every tunable kernel of
/// `p` (at most `max_kernels` distinct entries) into `kernels[i].tune` (`kernels`: render_cuda's, after
/// kernel dedup, one per loop kernel in order) and returns their translation unit (the prelude, then
/// one entry per candidate, named "<aligned entry>_r<rows>v<width>", a split one
/// "<aligned entry>_r1v<width>s<split>" declared `__cluster_dims__(split, 1, 1)` for sm_90 and newer
/// (on older targets it traps and the runtime never loads it)), or "" when no kernel has one. A
/// candidate whose text equals candidate 0's or an earlier one's (up to its name), or whose parameters
/// differ from the kernel's, is left out. Kernels that kernel dedup merged into an earlier one share
/// that kernel's entries (their own rules and launch rules).
/// `sizes` must be the kernels' own (render_cuda's): a candidate takes the kernel's parameters.
std::string render_tune_variants(const loop::Program& p, std::vector<CudaKernel>& kernels, bool approx_math = true,
                                 size_t max_kernels = kMaxTunedRowKernels, SizeArgs sizes = SizeArgs::ByValue);

/// Only the kernels' text (no prelude): what golden tests compare.
std::string render_cuda_kernels(const loop::Program& p, bool approx_math = true, SizeArgs sizes = SizeArgs::ByValue);
/// The prelude every translation unit starts with.
std::string_view cuda_prelude();

}  // namespace protean::backend::cuda
