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
//  * Pointwise producers into row kernels: a kernel A of one pointwise stage over [outer..., t...]
//    writing P, directly followed by a row kernel B over [outer...] whose stages read P only at the
//    element of their own inner point (over [t...]), becomes one kernel: A's stage is B's first
//    stage, over inner [t...], and B's stages read back what it wrote (the renderers keep a row's
//    stages in order; a GPU row waits for its threads after such a stage). A later kernel fused into
//    it by row fusion may read P the same way. Lowering realizes the values this is for (lower.h): a
//    transformer's residual stream, which every LayerNorm would otherwise recompute from all the
//    layers' outputs, is stored by the LayerNorm kernel that first reads it.
//  * Horizontal fusion: a kernel B with the same outer domain as an earlier kernel A, where neither
//    reads or writes what the other writes, is merged into A as extra stages, when no step between
//    them writes what B reads or reads/writes what B writes (B moves up to A). One parallel loop,
//    one pass over shared inputs: `exp(x)` and `sin(x)` become one loop nest with two stores; a
//    reduction of x after an unrelated extern joins the earlier reduction of x. Kernels without
//    an outer domain (full reductions, whose stages parallelize their own loops) are left alone.
//  * Reduction-value reuse: when a reduction's body holds a transcendental call (exp, erf, ...) and
//    appears unchanged inside a later pointwise stage of the same kernel over the same inner domain,
//    the reduction stashes each body value into that stage's output element and the stage reads it
//    back instead of recomputing it (softmax: one exp per element instead of two). Only when nothing
//    else in the kernel reads or writes that buffer and its dtype is the body's.
//  * Reciprocal division: a float division whose divisor is invariant in the stage's vector loop
//    (the innermost loop: no load or index there depends on it) becomes a multiplication by the
//    divisor's reciprocal, which the target's compiler computes once outside that loop (softmax's
//    normalization: one division per row instead of one per element). x * (1/d) can differ from
//    x / d by one unit in the last place; and where |d| is below the smallest normal number its
//    reciprocal overflows, so a finite quotient becomes +-inf (0, inf and NaN divisors give the
//    same results as the division). Constant divisors are folded to their reciprocal constant.
//    Divisions below floor, ceil, round, sign, a comparison or a cast to an integer or bool type
//    stay divisions (one unit in the last place moves floor(x / d) by one: remainder, floor
//    division and quantization must match eager exactly), except by a power-of-two constant.
//  * Extern results in place of their copies (ScheduleOptions::extern_results_into_copies): a stage
//    `load(bE, r0) -> bC[r0 + c]` over [n] (constants c, n; a kernel without outer loops) that copies
//    the whole result bE of a one-result extern, read by nothing else, into a Temp bC with static sizes is dropped, and
//    the extern writes bE at bC's element c instead (Buffer::alias), when every write of bC is such a
//    copy in that one kernel, over disjoint ranges, and the kernel does not read bC. A kernel left
//    without stages is dropped. The flat gradient of a training step's parameter arena is a cat of
//    the weight gradients, which GEMMs compute: the MLP of train_bench kept its two largest weight
//    gradients (4 and 3.1 MiB) in slots of their own next to the 7.1 MiB flat gradient; now the GEMMs
//    write into it. bC is live from the first extern that writes into it.
//  * Buffer planning: every Temp buffer a kernel writes gets a memory slot; buffers whose lifetimes
//    (first write .. last read, in steps) do not overlap share a slot, sized at run time by the largest
//    member. Each step lists the buffers whose last use it is (the runner drops them). With
//    ScheduleOptions::extern_output_slot, Temp buffers an extern writes are planned the same way
//    (the runner then offers the slot to the extern's kernel as its output memory).
#pragma once

#include <functional>

#include "loop/loop_ir.h"

namespace protean::loop {

/// What schedule_program did (counts for tests and logs).
struct ScheduleStats {
  int kernels_before = 0;
  int kernels_after = 0;
  int reductions_to_locals = 0;
  int stashed_reductions = 0;
  int horizontal_fusions = 0;    ///< kernels merged into an earlier independent kernel
  int reciprocal_divisions = 0;  ///< divisions rewritten to reciprocal multiplications
  int slots = 0;
  int temp_buffers = 0;
  int extern_slot_buffers = 0;  ///< of temp_buffers, those written by an extern step
  int extern_results_into_copies = 0;  ///< extern results written in place of their copies (Buffer::alias)
};

/// What a backend asks of schedule_program.
struct ScheduleOptions {
  /// When set, a Temp buffer written by an extern step gets a memory slot like a kernel's temporary
  /// if this returns true for the extern that writes it and for every extern that reads it: the
  /// backend promises that such an extern's results never alias its inputs, so the buffer's memory is
  /// free again after its last read. Unset: extern results keep their own storage (the cuda backend).
  std::function<bool(const Extern&)> extern_output_slot;
  /// With extern_output_slot: an extern result whose only read is a whole copy into a region of a
  /// temporary is written there by the extern itself (Buffer::alias), and the copy is dropped.
  bool extern_results_into_copies = false;
};

/// Fuses kernels and plans buffers in place.
ScheduleStats schedule_program(Program& p, const ScheduleOptions& options = {});

/// Merges adjacent loop dimensions that every access walks contiguously: outer dims d, d + 1 of a
/// kernel (and inner dims k, k + 1 of one stage) become one dim of size n_d * n_{d+1} when, in every
/// load index, store index and stash index of the kernel (of the stage), both variables enter
/// affinely with coef(d) == n_{d+1} * coef(d + 1), and neither appears in an `index(...)` value.
/// So a per-channel reduction over [N, H, W] of an NCHW tensor loops over [N, H*W] and a pointwise
/// kernel over [N, C, H, W] over one dim of N*C*H*W: with W = 28 the innermost vector loop was one
/// 16-lane vector and a 12-lane tail per row; merged it runs 784 (or all) values. Inductor's
/// simplify_loops merges dims the same way. Run after schedule_program (fusion compares kernels'
/// outer domains as lowered) and before apply_schedule. Returns the number of merges.
int merge_contiguous_dims(Program& p);

/// Splits the innermost outer dim x (constant extent N) of a pointwise kernel into (hi, lo), x = c·hi + lo
/// with lo in [0, c), when its accesses read x only through x / c and x % c for one constant c that
/// divides N (c ≥ `min_inner`): after the split they read hi and lo affinely, so the innermost loop
/// (lo) is unit-stride and takes the vector form. The gradient of a fused qkv projection gathers the
/// heads of [3, B, H, T, E] into [B, T, 3·H·E]: each element's address had a division and a modulo by
/// E, a scalar loop with one gather per element. Applied only when every stage then has the vector
/// form along lo and did not along x. Run after merge_contiguous_dims. Returns the number of splits.
int split_divided_dims(Program& p, int64_t min_inner = 16);

}  // namespace protean::loop
