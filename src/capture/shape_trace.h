// Forwards ShapeEnv decisions to the structured trace (docs/trace-format.md): `create_symbol`,
// `guard_added` and `specialization` events, tagged with the frame and compile id of the capture.
// The capture layer calls it from its ShapeEnv listener only when tracing is on.
#pragma once

#include <string>

#include "sym/shape_env.h"

namespace protean::capture {

/// Writes the trace event for `ev` (just emitted by `env`); events with no trace counterpart
/// (statically known results, duck sizing, replacements, range updates) are skipped.
void trace_shape_event(const sym::ShapeEnv& env, const sym::ShapeEvent& ev, int frame_id, const std::string& compile_id);

}  // namespace protean::capture
