// Structured compile trace (PROTEAN_TRACE=DIR): one JSON-lines file per process (and MPI rank),
// each event flushed when written so a crash loses at most the event being written. The schema is in
// docs/trace-format.md; `protean report DIR` renders it.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace protean::observe {

inline constexpr int kTraceFormatVersion = 1;

/// True when a trace directory is configured (PROTEAN_TRACE, read once, or set_trace_dir).
bool trace_enabled();
/// Starts tracing into `dir` (created if missing); an empty string stops tracing. Throws
/// RuntimeError when the directory or file cannot be created.
void set_trace_dir(const std::string& dir);
/// Path of the current trace file, or "" when tracing is off.
std::string trace_file();
/// Rank written into the file name and every event (set by the MPI layer; default 0 / PROTEAN_RANK,
/// OMPI_COMM_WORLD_RANK or PMI_RANK from the environment).
void set_trace_rank(int rank);
int trace_rank();

/// Appends one event: {"v":1,"ts_us":...,"pid":...,"rank":...,"event":name, ...fields}. Thread-safe.
/// Does nothing when tracing is off. Never throws (an I/O failure disables tracing with one warning).
void trace_event(std::string_view name, nlohmann::json fields);

/// Microseconds since the process's trace epoch (monotonic); used for chromium events.
int64_t trace_now_us();

/// The compile id ("F/C") the calling thread is compiling, or "" outside a compile. Layers that do
/// not see the compile id (the artifact cache, the toolchain) tag their events with it.
const std::string& trace_compile_id();
/// Sets trace_compile_id() of this thread for the scope's lifetime (nests; restores the previous one).
class TraceCompileScope {
 public:
  explicit TraceCompileScope(std::string compile_id);
  ~TraceCompileScope();
  TraceCompileScope(const TraceCompileScope&) = delete;
  TraceCompileScope& operator=(const TraceCompileScope&) = delete;

 private:
  std::string previous_;
};

/// Emits an `artifact` event for generated text (loop IR, C++ source, compiler output). `bytes` and
/// `hash` (xxhash64, hex) describe the whole text; the inline `text` is cut to
/// PROTEAN_TRACE_ARTIFACT_MAX_BYTES (default 1 MiB, 0 = no limit) and then carries `"truncated": true`
/// (`path` names the file with the whole text when there is one). Does nothing when tracing is off.
void trace_artifact(const std::string& compile_id, std::string_view kind, std::string_view name,
                    const std::string& path, const std::string& text);

/// Records a cache lookup outcome (`tier` "memory"/"disk"/"remote", `result` "hit"/"miss"/"corrupt")
/// of compile `compile_id`; the first outcome per tier is kept. take_compile_cache returns them as
/// {"memory": "miss", "disk": "hit"} (empty object when none) for the compile's compilation_metrics
/// event and forgets them. Only records while tracing is on.
void note_compile_cache(const std::string& compile_id, const std::string& tier, const std::string& result);
nlohmann::json take_compile_cache(const std::string& compile_id);

/// RAII chromium-style phase span: emits {"event":"chromium_event","name":..,"ph":"X","ts":..,"dur":..}
/// on destruction, with `args` (e.g. compile_id).
class TraceSpan {
 public:
  TraceSpan(std::string name, nlohmann::json args = nlohmann::json::object());
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  /// Seconds elapsed so far.
  double seconds() const;

 private:
  std::string name_;
  nlohmann::json args_;
  int64_t start_us_;
};

}  // namespace protean::observe
