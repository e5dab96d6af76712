// The cpu backend pipeline, one straight line (pipeline.cpp):
//   fuse_post_ops (on a copy of the graph) → lower_graph → schedule_program → generate_cpp →
//   build_library (artifact cache) → CpuArtifact
// The first four steps are skipped when the program cache holds a plan for the post-pass graph
// (program_plan.h, cache/program_cache.h; PROTEAN_PROGRAM_CACHE=0 turns it off); a new plan is stored
// after codegen.
// (a cond's branches are compiled through the same pipeline at the build step, recursively, each into
// a CpuArtifact of its own that the cond's extern step runs).
// Each step is a phase of one observe::PhaseTimer (CpuCompileInfo::phases) and, under PROTEAN_LOGS=output_code, logs its result: the graph
// after post-op fusion (when it changed anything), the loop IR after lowering and after scheduling,
// then the generated C++ and the cached library path. PROTEAN_CPU_POST_OPS=0 skips post-op fusion.
// Registered as backend "cpu" in the backend registry (backend/registry.h).
#pragma once

#include <memory>
#include <string>

#include "backend/cpu/runner.h"
#include "backend/registry.h"
#include "loop/schedule.h"
#include "observe/phase_timer.h"

namespace protean::backend::cpu {

struct CpuCompileInfo {
  /// The steps as phases of the compile's timer (names "cpu post-op fusion", "cpu lowering",
  /// "cpu scheduling", "cpu codegen", "cpu cxx_compile"); the *_ms fields are their wall times.
  observe::PhaseTimer phases;
  double fuse_ms = 0, lower_ms = 0, schedule_ms = 0, codegen_ms = 0, build_ms = 0;
  int kernels = 0, externs = 0;
  /// Post-op fusion (fuse_post_ops.h): extern calls that took a post-op list, the post-ops in them,
  /// and links folded into constant weights.
  int64_t fused_externs = 0, fused_post_ops = 0, folded_links = 0;
  /// Conv → conv values kept channels-last by the conv_layout pass (conv_layout.h).
  int64_t nhwc_values = 0;
  /// Packed matmul weights (gemm_weights.h): linear / matmul nodes marked weights="constant" / "reuse".
  int64_t packed_constant_weights = 0, packed_reused_weights = 0;
  /// matmul-softmax-matmul patterns run as the fused attention kernel (attention_pattern.h).
  int64_t fused_attention = 0;
  bool library_from_cache = false;  ///< no C++ compilation happened (memory or disk hit)
  /// The program came from the program cache (cache/program_cache.h): lowering, scheduling and
  /// codegen did not run (their phases stay empty, the schedule counters are the stored ones; phase
  /// "cpu program cache" holds the key, the read and the decode).
  bool program_from_cache = false;
  std::string library_path;
  std::string source;               ///< the generated translation unit (kernel bodies deduplicated)
  std::vector<std::vector<int>> kernel_buffers;  ///< per kernel: buffer ids behind its local B[j] (codegen.h)
  int unique_kernels = 0;           ///< distinct kernel bodies in `source` (kernel dedup)
  std::string loop_ir;              ///< loop IR text after scheduling (when asked for: compile_cpu with
                                    ///< `info`, PROTEAN_LOGS=output_code or tracing; else empty)
  loop::ScheduleStats schedule;     ///< what scheduling did (fusions, stashes, slots)
};

/// Compiles a graph for the cpu backend. Throws CompileError when C++ compilation fails.
std::unique_ptr<CpuArtifact> compile_cpu(const BackendInput& in, CpuCompileInfo* info = nullptr);

/// The asynchronous form (registered as the "cpu" async backend): lowers, schedules and generates
/// code at once (milliseconds); when the artifact cache already holds the library (memory or disk)
/// the CpuArtifact is returned ready, otherwise a deferred artifact runs the graph interpreter until
/// the C++ compiler has finished on the background worker (backend/async_compile.h).
std::unique_ptr<Artifact> compile_cpu_async(const BackendInput& in);

}  // namespace protean::backend::cpu
