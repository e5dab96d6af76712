// The CUDA schedule policy: how each kernel of a scheduled loop Program (schedule.h: fusion and
// buffer planning done) maps onto a GPU. Data only: the cuda renderer (backend/cuda/codegen.h)
// prints what it says and decides nothing of its own about the mapping.
//
// Decisions, per kernel:
//  * fused pointwise kernels (every stage pointwise without an inner domain) → a grid-stride loop
//    over the flattened outer domain, 256 threads per block; in the aligned variant each thread
//    handles `vector_width` consecutive elements of the innermost axis with 16-byte accesses
//    (vector_width = 16 bytes / the smallest element size among the buffers the kernel touches,
//    at most 8; 1 when every buffer is 1 byte);
//  * row kernels (an outer domain and stages over an inner domain: reductions, softmax, layer_norm,
//    fused row stages) → one outer point (a row) per warp when the row's length is known to be at
//    most 256 elements (from a constant extent or the symbols' upper bounds), 4 rows per 128-thread
//    block; otherwise one row per block of 128..1024 threads (a power of two near length / 8; 256
//    when the length has no upper bound);
//  * `rows_persist`: when the row's upper bound fits ≤ 8 chunks per thread (`persist_chunks`), every
//    load that stages of the row share, and every stashed reduction value, stays in registers
//    between stages (the row is read from memory once); a stashed value then is not written to
//    memory;
//  * reductions: each thread folds its elements (sum/prod/max/min with NaN propagation, welford per
//    thread), then the row's threads combine by warp shuffles (__shfl_xor_sync) and, for a block per
//    row, through shared memory (one value per warp). Welford partial results (count, mean, M2) are
//    merged with Chan et al.'s pairwise formulas;
//  * kernels without an outer domain (full reductions) → one block of 1024 threads;
//  * index math in 32-bit integers (`index32`) only when an upper bound of every symbol the kernel
//    uses is known and every extent and buffer index the kernel touches then fits below 2^31;
//    otherwise in int64.
// The bounds come from CudaScheduleOptions::upper_bounds (mark range, PGO range); without them
// every symbolic length is unbounded (a block per row, no persistence, int64 index math).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loop/loop_ir.h"

namespace protean::loop {

struct CudaScheduleOptions {
  /// Inclusive upper bound of each symbol (by name) where one is known.
  std::map<std::string, int64_t> upper_bounds;
  /// Grid-stride kernels launch at most this many blocks (about 16 per multiprocessor of an H200).
  int64_t max_grid_blocks = 132 * 16;
};

enum class CudaKernelForm : uint8_t {
  GridStride,   ///< fused pointwise kernel over the flattened outer domain
  WarpPerRow,   ///< one warp per outer point, rows_per_block rows per block
  BlockPerRow,  ///< one block per outer point
  SingleBlock,  ///< no outer domain: one block runs the whole kernel
};

/// How one reduction stage combines the partial results of a row's threads.
enum class CudaReduction : uint8_t {
  None,   ///< a pointwise stage
  Warp,   ///< per-thread fold, then warp shuffles
  Block,  ///< per-thread fold, warp shuffles, then one value per warp through shared memory
};

struct CudaStageSchedule {
  CudaReduction reduction = CudaReduction::None;
  bool welford = false;  ///< the fold is Welford's update, merges are Chan et al.'s formulas
};

struct CudaSchedule {
  CudaKernelForm form = CudaKernelForm::GridStride;
  int block_threads = 256;   ///< threads per block (the kernel's __launch_bounds__)
  int threads_per_row = 1;   ///< threads sharing one outer point (32 for a warp, block_threads for a block)
  int rows_per_block = 1;    ///< WarpPerRow: block_threads / 32
  int vector_width = 1;      ///< elements per access in the aligned variant (1: no aligned variant)
  bool rows_persist = false; ///< row kernels: shared loads and stashes stay in registers across stages
  int persist_chunks = 0;    ///< rows_persist: chunks of threads_per_row * vector_width elements per row
  bool index32 = false;      ///< index math in int (bounds prove it fits), else long long
  sym::Expr work;            ///< GridStride: elements; row forms: rows; SingleBlock: 1
  std::vector<CudaStageSchedule> stages;
};

/// The schedule of every kernel of `p`, in order.
std::vector<CudaSchedule> cuda_schedule(const Program& p, const CudaScheduleOptions& o = {});

/// An upper bound of `e` when every symbol in it has one in `bounds` and `e` is monotone in its
/// symbols (sums, products, floor/ceil divisions by positive constants, max, min of such); else nullopt.
std::optional<int64_t> upper_bound(const sym::Expr& e, const std::map<std::string, int64_t>& bounds);

/// Text of a schedule, one line: `cuda: block_per_row threads=256 vector=4 persist=4 index32`.
std::string cuda_schedule_text(const CudaSchedule& s);

}  // namespace protean::loop
