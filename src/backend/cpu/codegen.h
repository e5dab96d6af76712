// Codegen: loop-level IR → one C++ translation unit.
//
// Needs: a scheduled Program (schedule.h) whose kernels carry a cpu Schedule (loop::apply_schedule
// with loop::CpuSchedulePolicy, loop/schedule_cpu.h); throws CompileError for a kernel without one.
// Codegen takes no scheduling decision: it renders what each Schedule says.
// Guarantees: the source defines, for every kernel,
//   extern "C" void kernelN(char* const* B, const int64_t* S);
// where B[i] points to buffer i's first element (contiguous, row-major) and S[j] is the value of
// Program::symbols[j]. Size symbols become `const int64_t s0 = S[0];`, so one compiled artifact serves
// every size. The schedule's parallel axes run under OpenMP (`parallel for collapse(n) if (work >=
// threshold)`); stages whose schedule says `vector` are written in an explicit vector form (16 floats
// per step through GCC vector extensions, AVX-512 exp with vscalefps, then a scalar tail); other
// innermost loops are `omp simd` over a unit-stride index on `__restrict` pointers so the compiler
// vectorizes them. Reductions take their schedule's strategy: Serial is `omp simd reduction(...)`
// (max/min with a NaN flag so NaN propagates like the eager kernels), VectorMinMax keeps vector
// accumulators and a NaN mask, Lanes folds accumulator lanes pairwise, Welford runs per lane and
// merges lanes with Chan et al.'s formulas. A stage with a prefetch plan issues one hint per cache line
// per block. Float exp/erf/tanh/sigmoid/normal_cdf use branch-free polynomial forms (prelude) that
// vectorize; f64 uses <cmath>.
// The output is deterministic (golden tests compare it; equal programs give equal cache keys).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "loop/loop_ir.h"
#include "loop/schedule_cpu.h"

namespace protean::backend::cpu {

/// The full translation unit (prelude + kernels).
std::string generate_cpp(const loop::Program& p);
/// Only the kernels (no prelude): what golden tests compare.
std::string generate_kernels(const loop::Program& p);
/// Programs above loop::kLargeProgramNodes scalar nodes are scheduled without the explicit vector
/// form and compiled at -O2 (loop/schedule_cpu.h).
using loop::kLargeProgramNodes;
using loop::large_program;
/// The prelude every translation unit starts with (helpers and vector forms the kernels call).
std::string_view prelude();

/// False when environment variable `name` is "0", true otherwise: the cpu backend's off switches
/// (PROTEAN_CPU_VECTORIZE, PROTEAN_CPU_POST_OPS, PROTEAN_CPU_CONV_LAYOUT), each read once by its user.
bool env_switch_on(const char* name);

}  // namespace protean::backend::cpu
