// The user's source location during capture: the first stack frame outside libprotean (and outside
// Protean's / the standard library's headers), symbolized with libdw (DWARF line tables, including
// inlined call sites). Used for node provenance (`# mlp.cpp:4`) and as the ShapeEnv's location
// provider (`eval Eq(s0, 33) [guard added] at f.cpp:12`).
// Cost: one backtrace() (~1 µs) plus a cached PC → location lookup; called only while tracing.
// Symbolizing a frame decodes its compile unit's whole line table (25-50 ms for a large one), so the
// answers are also kept on disk per module build ID ($PROTEAN_CACHE_DIR/locations/<build-id>.tsv): a
// later process running the same binary reads them instead (same answer: it depends only on the
// module's bytes). A binary without debug info yields an unknown location, printed `?`.
#pragma once

#include <cstdint>

#include "sym/shape_env.h"

namespace protean::capture {

/// The innermost user frame of the calling thread ({} when none can be found).
sym::UserLocation current_user_location();
/// Frames outside libprotean looked up since the process started: symbolized with libdw, or answered
/// by the disk tier.
struct LocationCacheStats {
  int64_t symbolized = 0;
  int64_t disk_hits = 0;
};
LocationCacheStats location_cache_stats();
/// Drops the in-process PC → location memo (tests: the next lookups read the disk tier again).
void forget_locations_in_memory();
/// Basename of a path ("/a/b/f.cpp" → "f.cpp").
std::string basename_of(const std::string& path);

}  // namespace protean::capture
