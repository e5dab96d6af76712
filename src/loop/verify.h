// Loop-IR verifier: checks the invariants written in loop_ir.h on a Program, so that a pass that
// breaks one fails where it ran instead of as wrong numbers or a C++ compile error later. The cpu
// pipeline runs it after lowering, after scheduling and before rendering when verification is on
// (debug builds, or PROTEAN_LOOP_VERIFY=1: the unit and scenario test binaries set it); the loop text
// parser (loop/parse.h) runs it on every program it reads.
//
// Checked:
//  * buffers: ids are their positions, sizes present; inputs name a graph input; program outputs exist;
//  * steps: each kernel run by exactly one step, in kernel order; each extern by at most one; buffer
//    ids of externs in range;
//  * scalar expressions: operand counts per SOp, Unary/Binary functions of the right arity, Fma in
//    f32/f64, loads of existing buffers with the buffer's dtype, every Local defined by an earlier
//    reduction stage of the same kernel;
//  * index expressions: only the kernel's outer variables x0..x(K-1), the stage's inner variables
//    r0..r(R-1) and the program's size symbols;
//  * stages: pointwise stages store (out >= 0) and have no reduce_op; reductions name sum, prod, max,
//    min or welford and a local; only welford has a second result;
//  * no in-place update: a kernel writes no Input or Constant buffer, and reads no buffer it writes,
//    except the scheduler's stash (a reduction stashes into the buffer a later stage writes, which
//    that stage reads back at the index it stores) and a read-back (a pointwise stage over an inner
//    domain writes a buffer once, and later stages over the same inner domain read it at the element
//    it stores: a producer fused into a row kernel);
//  * order: a loaded buffer is an input, a constant, or written by an earlier step (or stashed by an
//    earlier stage of the same kernel);
//  * buffer planning (when num_slots > 0): slots in range;
//  * schedule (when set): one StageSchedule per stage; parallel axes within the outer domain, collapse
//    within them; the strategy fits the stage (None for pointwise, Welford for welford, Lanes for
//    sum/prod, VectorMinMax for max/min); vector forms with a vector width; lanes a positive multiple
//    of the width in a vector form; blocks only on pointwise stages with an inner domain; a fused
//    pointwise schedule only on kernels whose stages are all pointwise without an inner domain.
#pragma once

#include <string_view>

#include "loop/loop_ir.h"

namespace protean::loop {

/// Throws CompileError naming the program, the kernel and stage (or step, or buffer), the invariant
/// and `where` (the pipeline point: "after lowering", ...) on the first violation.
void verify(const Program& p, std::string_view where);

/// True when the pipeline verifies loop IR between its steps: debug builds, or PROTEAN_LOOP_VERIFY=1
/// (read once).
bool verify_enabled();

}  // namespace protean::loop
