// The compile driver: one cache entry built from one call's arguments, as a straight line —
//   capture  trace_frame: the function run on FakeTensors → graph, guards, symbols (capture/tracer.h)
//   passes   ir::run_passes: DCE, constant folding, CSE, ... (ir/pipeline.h)
//   backend  make_artifact / make_artifact_async of the frame's backend (backend/registry.h)
// Each step is a phase of one PhaseTimer (observe/phase_timer.h): "capture", "passes", "backend"; the
// guards are logged under PROTEAN_LOGS=guards, the graph after each pass under output_code, and the
// compile's trace events (graph, guards, chromium spans, compilation_metrics) are written when tracing.
//
// The dispatcher (capture/frame.cpp) decides whether to compile at all (recompile limits, stances,
// FrameState, PGO and collectives) and what to do with the outcome (publish the entry, or run in
// segments at a graph break); this file decides nothing, it only builds.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "capture/cache_entry.h"
#include "capture/frame.h"
#include "capture/graph_break.h"
#include "observe/phase_timer.h"

namespace protean::capture {

struct CompileOutcome {
  std::unique_ptr<CacheEntry> entry;      ///< the new entry (artifact built); null at a graph break
  std::optional<BreakInfo> graph_break;   ///< capture broke the graph, or the backend rejected an op
  observe::PhaseTimer phases;             ///< the phases that completed: capture, passes, backend
};

/// Builds compile `compile_id` (index `compile_index` in frame `f`) from `args`. A graph break (in
/// capture, or an op the backend rejects late) is an outcome, not an exception; a rejection found by
/// capture is not learned by a frame that is not a segment (segmented execution asks again with the
/// actual sizes). Any other error propagates (CompileError, ...) after the compile's trace event.
CompileOutcome compile_entry(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                             const std::string& compile_id, int compile_index);

}  // namespace protean::capture
