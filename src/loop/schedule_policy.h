// Schedule policies: how each target decides the Schedule of every kernel (loop_ir.h: Schedule).
//
// Pipeline position: lower_graph → schedule_program (fusion, buffer planning: target-neutral) →
// apply_schedule(p, policy) → a renderer. After apply_schedule every Kernel::schedule is set
// (`target` names the policy) and a renderer only prints what it says: it takes no decision of its
// own about parallel axes, vector width, reduction form, prefetches or work threshold.
//
// The cpu policy (loop/schedule_cpu.h) decides:
//  * parallel axes: the leading outer axes under `omp parallel for` (all of them for row kernels,
//    collapse(K); all but the innermost for a fused pointwise nest, whose innermost axis is the vector
//    axis); a kernel without outer domain parallelizes each stage's first inner loop;
//  * work threshold: 32768 (outer points x largest inner domain), below which the kernel runs on the
//    calling thread;
//  * vector width 16 f32 lanes (64 bytes: one AVX-512 register, two AVX2 registers) where the body is
//    vectorizable (loop/vectorize.h) and the program is not large (kLargeProgramNodes);
//  * reduction strategy: sum/prod over 64 accumulator lanes (32 for 8-byte types), f32 max/min in
//    four vector accumulators with a NaN mask, welford in 8 mean and 8 M2 vectors, else one
//    accumulator under `omp simd reduction`;
//  * prefetch plan: in a row kernel, the largest later stage over the first stage's inner domain
//    prefetches the next row of the first stage's streaming loads (at most two), in blocks of 64.
//
// A second target adds its own policy without touching the cpu one:
//  * subclass SchedulePolicy in loop/schedule_<target>.cpp (e.g. CudaSchedulePolicy), return the
//    target's name from target() and fill every kernel's Schedule in schedule();
//  * a GPU maps `parallel_axes` to grid axes (collapse stays 0), sets `threads_per_row` (threads that
//    cooperate on one outer point: a warp, or a block of 128..1024), `rows_per_block` (outer points a
//    block handles when rows are short), `vector_bytes` (16: float4 loads) and `vector_width`
//    (vector_bytes / itemsize), picks ReductionStrategy::Warp or ::Block for reductions (Lanes and
//    Welford keep their meaning per thread), `rows_persist` when a block keeps its row on chip
//    across the stages of a row kernel, and `work_threshold` 0 (or the size below which the host
//    runs it);
//  * its renderer reads only the Schedule and the shared C-style expression renderer
//    (loop/c_expr.h), and throws CompileError for a strategy it does not implement.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "loop/loop_ir.h"

namespace protean::loop {

/// A target's scheduling decisions. Implementations are stateless after construction and may be
/// shared between threads.
class SchedulePolicy {
 public:
  virtual ~SchedulePolicy() = default;
  /// The target's name, stored in Schedule::target ("cpu").
  virtual std::string_view target() const = 0;
  /// The schedule of every kernel of `p`, in order (p is scheduled: fusion and buffer planning done).
  /// Each must hold one StageSchedule per stage of its kernel.
  virtual std::vector<Schedule> schedule(const Program& p) const = 0;
};

/// Sets every kernel's schedule from `policy`. Throws CompileError when the policy returns the wrong
/// number of stage schedules.
void apply_schedule(Program& p, const SchedulePolicy& policy);

/// Work estimate of a kernel: outer points x the largest inner domain of its stages (simplified).
sym::Expr kernel_work(const Kernel& k);

/// The kernel's schedule as one line of the loop text form, e.g.
/// `schedule cpu: parallel x0 x1 collapse(2), work 64*s0, threshold 32768, vector_width 16 (64 B), rows persist`
/// ("schedule none" before apply_schedule).
std::string schedule_text(const Kernel& k);
/// Stage `stage`'s schedule in the loop text form (`lanes 64, vector, prefetch b3[x0*64 + r0 + 64]`;
/// empty for a plain pointwise stage).
std::string stage_schedule_text(const Kernel& k, size_t stage);

}  // namespace protean::loop
