// The CUDA schedule policy: how each kernel of a scheduled loop Program (schedule.h: fusion and
// buffer planning done) maps onto a GPU, as the kernel's loop::Schedule (loop_ir.h; applied with
// apply_schedule, schedule_policy.h). Data only: the cuda renderer (backend/cuda/codegen.h) prints
// what it says and decides nothing of its own about the mapping.
//
// Decisions, per kernel:
//  * fused pointwise kernels (every stage pointwise without an inner domain) → a grid-stride loop
//    over the flattened outer domain, 256 threads per block; in the aligned variant each thread
//    handles `vector_width` consecutive elements of the innermost axis with 16-byte accesses
//    (vector_width = 16 bytes / the smallest element size among the buffers the kernel touches,
//    at most 8; 1 when every buffer is 1 byte);
//  * row kernels (an outer domain and stages over an inner domain: reductions, softmax, layer_norm,
//    fused row stages) → the fewest threads that hold the row (its length known to be at most some
//    bound, from a constant extent or the symbols' upper bounds) at 32 elements per thread (16 when
//    the kernel also keeps stashed values): one warp per row when that is one warp (rows up to 1024
//    or 512), 4 rows per 128-thread block; otherwise one row per block of 64..1024 threads (a power
//    of two); 256 threads when the length has no upper bound (the row then streams: its first pass
//    reads memory, later passes mostly hit L2). Row kernels declare __launch_bounds__(T, 1024 / T)
//    so that registers leave room for several rows per multiprocessor (bytes in flight);
//  * `rows_persist`: when the row's upper bound fits ≤ 32 (16) elements per thread (`persist_chunks`),
//    every load that stages of the row share, and every stashed reduction value, stays in registers
//    between stages (the row is read from memory once; 16-bit rows as packed 16-byte vectors); a
//    stashed value then is not written to memory; a welford reduction over a row in registers runs
//    as two passes (mean, then the sum of squared deviations) instead of an update per element;
//  * reductions: each thread folds its elements (sum/prod/max/min with NaN propagation, welford per
//    thread), then the row's threads combine by warp shuffles (__shfl_xor_sync) and, for a block per
//    row, through shared memory (one value per warp). Welford partial results (count, mean, M2) are
//    merged with Chan et al.'s pairwise formulas;
//  * kernels without an outer domain (full reductions) → one block of 1024 threads;
//  * index math in 32-bit integers (`index32`) only when an upper bound of every symbol the kernel
//    uses is known and every extent and buffer index the kernel touches then fits below 2^31;
//    otherwise in int64.
// The bounds come from CudaScheduleOptions::upper_bounds, which the cuda pipeline fills from
// backend::BackendInput::upper_bounds (mark_dynamic ranges and guards of the capture's ShapeEnv);
// without them every symbolic length is unbounded (a block of 256 per row streaming the row, no
// persistence, int64 index math).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loop/loop_ir.h"
#include "loop/schedule_policy.h"

namespace protean::loop {

struct CudaScheduleOptions {
  /// Inclusive upper bound of each symbol (by name) where one is known.
  std::map<std::string, int64_t> upper_bounds;
  /// Grid-stride kernels launch at most this many blocks (about 16 per multiprocessor of an H200).
  int64_t max_grid_blocks = 132 * 16;
  /// Row kernels' __launch_bounds__ ask for registers that let this many threads share a
  /// multiprocessor (min blocks = this / block threads; more rows in flight, fewer registers each).
  int min_resident_threads = 1024;
  /// Rows per block of a warp-per-row kernel (a warp per row, 32 x this many threads): 1, 2 or 4
  /// (the cuda backend reads PROTEAN_CUDA_WARP_ROWS_PER_BLOCK). 2 measured level with 4 on GPT-2 small
  /// under reduce-overhead on an H200 (docs/graphs.md); max-autotune's row variants choose per bucket.
  int warp_rows_per_block = 4;
  /// Blocks a warp-per-row launch aims for (the multiprocessors of an H100 or H200): a launch with fewer
  /// rows than warp_rows_per_block x this takes fewer rows per block (cuda program.h:
  /// LaunchRule::fill_blocks); 0 keeps warp_rows_per_block at every size. The cuda backend reads
  /// PROTEAN_CUDA_WARP_FILL_BLOCKS.
  int64_t warp_fill_blocks = 132;
};

/// The CUDA policy: fills every kernel's loop::Schedule (loop_ir.h) with target "cuda": gpu_form,
/// block_threads, threads_per_row, rows_per_block, min_blocks, vector_width / vector_bytes (the
/// aligned variant's 16-byte accesses), rows_persist / persist_chunks, index32, work, and per stage
/// ReductionStrategy::Warp or ::Block (welford stages merge with Chan et al.'s formulas).
class CudaSchedulePolicy : public SchedulePolicy {
 public:
  explicit CudaSchedulePolicy(CudaScheduleOptions o = {}) : o_(std::move(o)) {}
  std::string_view target() const override { return "cuda"; }
  std::vector<Schedule> schedule(const Program& p) const override;

 private:
  CudaScheduleOptions o_;
};

/// An upper bound of `e` when every symbol in it has one in `bounds` and `e` is monotone in its
/// symbols (sums, products, floor/ceil divisions by positive constants, max, min of such); else nullopt.
std::optional<int64_t> upper_bound(const sym::Expr& e, const std::map<std::string, int64_t>& bounds);

}  // namespace protean::loop
