// The user's source location during capture: the first stack frame outside libprotean (and outside
// Protean's / the standard library's headers), symbolized with libdw (DWARF line tables, including
// inlined call sites). Used for node provenance (`# mlp.cpp:4`) and as the ShapeEnv's location
// provider (`eval Eq(s0, 33) [guard added] at f.cpp:12`).
// Cost: one backtrace() (~1 µs) plus a cached PC → location lookup; called only while tracing.
// A binary without debug info yields an unknown location, printed `?`.
#pragma once

#include "sym/shape_env.h"

namespace protean::capture {

/// The innermost user frame of the calling thread ({} when none can be found).
sym::UserLocation current_user_location();
/// Basename of a path ("/a/b/f.cpp" → "f.cpp").
std::string basename_of(const std::string& path);

}  // namespace protean::capture
