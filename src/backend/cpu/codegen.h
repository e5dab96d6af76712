// Codegen: loop-level IR → one C++ translation unit.
//
// Needs: a scheduled Program (schedule.h). Guarantees: the source defines, for every kernel,
//   extern "C" void kernelN(char* const* B, const int64_t* S);
// where B[i] points to buffer i's first element (contiguous, row-major) and S[j] is the value of
// Program::symbols[j]. Size symbols become `const int64_t s0 = S[0];`, so one compiled artifact serves
// every size. Outer loops run under OpenMP (`parallel for collapse`, only above a work threshold);
// innermost loops whose values are f32 (or masks) and whose loads are unit-stride or invariant are
// written in an explicit vector form (16 floats per step through GCC vector extensions, AVX-512 exp
// with vscalefps, then a scalar tail; PROTEAN_CPU_VECTORIZE=0 turns it off); other innermost loops
// are `omp simd` over a unit-stride index on `__restrict` pointers so the compiler vectorizes them.
// max/min reductions use `omp simd reduction(...)` with a NaN flag so NaN propagates
// like the eager kernels; sum/prod use 64 accumulator lanes folded pairwise; welford runs per lane
// and merges lanes with Chan et al.'s formulas. In a row kernel, a later stage prefetches the next
// row of what the first stage streams from memory. Float exp/erf/tanh/sigmoid/normal_cdf use
// branch-free polynomial forms (prelude) that vectorize; f64 uses <cmath>.
// The output is deterministic (golden tests compare it; equal programs give equal cache keys).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loop/loop_ir.h"

namespace protean::backend::cpu {

/// The full translation unit (prelude + kernels).
std::string generate_cpp(const loop::Program& p);
/// Only the kernels (no prelude): what golden tests compare.
std::string generate_kernels(const loop::Program& p);
/// The translation unit the build uses: as generate_cpp, but each kernel names its buffers by local
/// numbers (B[0], B[1], ... in order of first use in its body), so kernels that compute the same thing
/// on different buffers (the blocks of a deep model) have the same text; each distinct body is emitted
/// once and every repeat is an `__attribute__((alias))` of it, so the C++ compiler builds it once.
/// The runner passes each kernel the pointers of kernel_buffers[k] (global buffer ids, local order).
struct DedupSource {
  std::string text;
  std::vector<std::vector<int>> kernel_buffers;  ///< per kernel: the buffer id behind each local B[j]
  size_t unique_kernels = 0;                     ///< distinct bodies emitted
};
DedupSource generate_cpp_dedup(const loop::Program& p);
/// Scalar nodes (summed over every stage body) above which a program is large: its kernels are
/// rendered without the explicit vector form (each op of it is about 16 inlined lane operations: GCC
/// then spends about 60 ms per op at -O3) and build_library compiles them at -O2, so the compile
/// time of a deep graph stays linear and small (a chain of 10,000 pointwise ops: docs/cpu.md).
inline constexpr size_t kLargeProgramNodes = 1024;
/// True when `p` holds more than kLargeProgramNodes scalar nodes.
bool large_program(const loop::Program& p);
/// The prelude every translation unit starts with (helpers and vector forms the kernels call).
std::string_view prelude();

/// False when environment variable `name` is "0", true otherwise: the cpu backend's off switches
/// (PROTEAN_CPU_VECTORIZE, PROTEAN_CPU_POST_OPS, PROTEAN_CPU_CONV_LAYOUT), each read once by its user.
bool env_switch_on(const char* name);

}  // namespace protean::backend::cpu
