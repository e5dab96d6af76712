// The cpu schedule policy (see loop/schedule_policy.h for what it decides and why): OpenMP threads over
// the leading outer axes above a work threshold, a 16-lane f32 explicit vector form, accumulator lanes
// and Welford vectors for reductions, next-row prefetches in row kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "loop/schedule_policy.h"

namespace protean::loop {

/// Scalar nodes (summed over every stage body) above which a program is large: its kernels (but the
/// small ones, below) are scheduled without the explicit vector form (each op of it is about 16 inlined lane operations: GCC
/// then spends about 60 ms per op at -O3) and the cpu backend compiles them at -O2, so the compile
/// time of a deep graph stays linear and small (a chain of 10,000 pointwise ops: docs/cpu.md).
inline constexpr size_t kLargeProgramNodes = 1024;
/// In a large program, a kernel of at most this many scalar nodes still gets the explicit vector form,
/// while the vector-form kernels' nodes stay within kLargeProgramVectorNodes (compiled at -O2 like the
/// rest). The GPT training step of bench/train_bench.cpp (~1,900 nodes in 78 kernels) keeps its short
/// pointwise kernels vectorized; a chain of deep pointwise kernels (up to kMaxExprDepth per value)
/// stays scalar.
inline constexpr size_t kLargeProgramVectorKernelNodes = 96;
inline constexpr size_t kLargeProgramVectorNodes = 4096;
/// True when `p` holds more than kLargeProgramNodes scalar nodes.
bool large_program(const Program& p);

/// The cpu policy's knobs; the defaults are what the cpu backend uses.
struct CpuScheduleOptions {
  /// Explicit vector form allowed (PROTEAN_CPU_VECTORIZE=0 turns it off: loops are then left to the
  /// C++ compiler's auto-vectorizer).
  bool vectorize = true;
  /// Below this work estimate (outer points x largest inner domain) a kernel runs on the calling
  /// thread: OpenMP's fork/join costs more than it saves.
  int64_t work_threshold = 131072;
  /// f32 lanes of the explicit vector form (the prelude's pt::vf: 64 bytes, one AVX-512 register).
  int vector_width = 16;
  /// Accumulator lanes of sum/prod: 256 bytes, four AVX-512 registers, so the loop-carried dependency
  /// spans four independent vector chains (64 f32 lanes, 32 for 8-byte types).
  int accumulator_bytes = 256;
  /// Mean and M2 vectors of the vector form of welford (8: 128 lanes; each lane's update is a dependent
  /// subtract and multiply-add, so more independent lanes keep the pipes busy).
  int welford_vectors = 8;
  /// Values per block of a prefetching pointwise stage.
  int prefetch_block = 64;
  /// Streaming loads of a row kernel's first stage prefetched for the next row (at most).
  int max_prefetch_loads = 2;
  /// The options with PROTEAN_CPU_VECTORIZE applied (read once per process).
  static CpuScheduleOptions from_env();
};

class CpuSchedulePolicy final : public SchedulePolicy {
 public:
  explicit CpuSchedulePolicy(CpuScheduleOptions options = CpuScheduleOptions::from_env()) : o_(options) {}
  std::string_view target() const override { return "cpu"; }
  std::vector<Schedule> schedule(const Program& p) const override;
  const CpuScheduleOptions& options() const { return o_; }

 private:
  Schedule schedule_kernel(const Program& p, const Kernel& k, bool vector_form) const;
  CpuScheduleOptions o_;
};

}  // namespace protean::loop
