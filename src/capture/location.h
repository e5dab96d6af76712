// The user's source location during capture: the first stack frame outside libprotean (and outside
// Protean's / the standard library's headers), symbolized with libdw (DWARF line tables, including
// inlined call sites). Used for node provenance (`# mlp.cpp:4`) and as the ShapeEnv's location
// provider (`eval Eq(s0, 33) [guard added] at f.cpp:12`).
// Cost: one backtrace() (~1 µs) plus a cached PC → location lookup; called only while tracing.
// Symbolizing a frame decodes its compile unit's whole line table (25-50 ms for a large one), so the
// answers are also kept on disk per module build ID ($PROTEAN_CACHE_DIR/locations/<build-id>.tsv): a
// later process running the same binary reads them instead (same answer: it depends only on the
// module's bytes). Frames of system libraries (/lib, /usr/lib: libc, libstdc++, libgomp) are never
// the user's, even when their debug info is installed. A binary without debug info yields no user
// location: messages then say so (unresolved_location) and name the compiled function and the op.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sym/shape_env.h"

namespace protean::capture {

/// The innermost user frame of the calling thread ({} when none can be found).
core::SourceLocation current_user_location();
/// Frames outside libprotean looked up since the process started: symbolized with libdw, or answered
/// by the disk tier.
struct LocationCacheStats {
  int64_t symbolized = 0;
  int64_t disk_hits = 0;
  int64_t sessions = 0;       // libdw sessions opened (one per stretch of traces that symbolized)
  bool session_open = false;  // a libdw session is open now
};
LocationCacheStats location_cache_stats();
/// While any is alive in the process, the libdw session a symbolization opened stays open; when the
/// last one ends, it is closed (the decoded line tables and mapped debug info, several MiB for a
/// large binary, are released; the answers stay memoized and on disk, so a later trace reopens it
/// only for a PC it has not seen). Tracer::run and segmented runs hold one; a location lookup made
/// outside any trace closes the session it opened, a lookup of a function's parameter names (compile
/// of a module) leaves it to the trace that follows.
class SymbolizerSessionScope {
 public:
  SymbolizerSessionScope();
  ~SymbolizerSessionScope();
  SymbolizerSessionScope(const SymbolizerSessionScope&) = delete;
  SymbolizerSessionScope& operator=(const SymbolizerSessionScope&) = delete;
};
/// Drops the in-process PC → location memo (tests: the next lookups read the disk tier again).
void forget_locations_in_memory();
/// A demangled function name as locations print it: the parameter list dropped ("ns::f(int)" →
/// "ns::f"), and a lambda — also one called through std::function — as "lambda in <enclosing
/// function>" ("main::{lambda(int)#1}::operator()(int) const" → "lambda in main").
std::string short_function_name(const std::string& demangled);

/// While alive, messages about an unresolved location name compiled function `function`
/// (CompileOptions::name). Nests; the string must outlive the scope.
class LocationContextScope {
 public:
  explicit LocationContextScope(const std::string& function);
  ~LocationContextScope();
  LocationContextScope(const LocationContextScope&) = delete;
  LocationContextScope& operator=(const LocationContextScope&) = delete;

 private:
  const std::string* previous_;
};

/// The location messages use when no user frame has a line: no file, line 0, and as `function` the
/// text "function 'NAME', op OP (no debug info: build with -g or RelWithDebInfo to see your line)".
core::SourceLocation unresolved_location(std::string_view op = {});
/// current_user_location() when it has a line, else unresolved_location(op).
core::SourceLocation user_location_or_unresolved(std::string_view op = {});

/// Basename of a path ("/a/b/f.cpp" → "f.cpp").
std::string basename_of(const std::string& path);

}  // namespace protean::capture
