// Scheduling: fusion of loop-IR kernels and buffer planning.
//
// Needs: a Program from lower_graph (one kernel per realized value or reduction, in program order).
// Guarantees (the program computes the same values):
//  * Row fusion: a kernel B directly after kernel A whose outer domain starts with A's outer domain is
//    merged into A as extra stages, when every load B makes of a buffer A writes reads A's reduction
//    result for the current outer point. Those loads become reads of the reduction's local scalar,
//    and a reduction buffer nobody else reads is no longer stored. softmax becomes one kernel per row:
//    max, sum of exp, normalize; layer_norm + gelu: sum, sum of squares, normalize·gelu.
//    (Vertical fusion of pointwise chains already happened in lowering: producers are inlined.)
//  * Reduction-value reuse: when a reduction's body holds a transcendental call (exp, erf, ...) and
//    appears unchanged inside a later pointwise stage of the same kernel over the same inner domain,
//    the reduction stashes each body value into that stage's output element and the stage reads it
//    back instead of recomputing it (softmax: one exp per element instead of two). Only when nothing
//    else in the kernel reads or writes that buffer and its dtype is the body's.
//  * Buffer planning: every Temp buffer a kernel writes gets a memory slot; buffers whose lifetimes
//    (first write .. last read, in steps) do not overlap share a slot, sized at run time by the largest
//    member. Each step lists the buffers whose last use it is (the runner drops them).
#pragma once

#include "backend/cpu/loop_ir.h"

namespace protean::backend::cpu {

struct ScheduleStats {
  int kernels_before = 0;
  int kernels_after = 0;
  int reductions_to_locals = 0;
  int stashed_reductions = 0;
  int slots = 0;
  int temp_buffers = 0;
};

/// Fuses kernels and plans buffers in place.
ScheduleStats schedule_program(Program& p);

}  // namespace protean::backend::cpu
