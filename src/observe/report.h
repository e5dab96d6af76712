// `protean report`: reads a directory of structured traces (docs/trace-format.md) into a model of
// processes → frames → compiles, analyses it (compile status, similar graphs, dimensions to make
// dynamic, rank disagreements) and renders it as plain text or as a static HTML site.
//
// Invariants the reader guarantees, whatever the input:
//  * It never throws on trace contents and never aborts: a line that is not a JSON object, lacks an
//    `event`, names an event we do not know, or comes from a newer major version is skipped and
//    counted per file (with the first line number); a known event with a field of the wrong type is
//    used with that field defaulted, and counted.
//  * Every compile that any event mentions exists in the model, even when its compile_start was lost.
//  * Strings are kept exactly as in the trace; renderers escape them (HTML) where needed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/source_location.h"

namespace protean::observe::report {

/// A user source location (line 0 = unknown); str() prints "mlp.cpp:12" / "mlp.cpp" / "?".
using core::SourceLocation;

struct Symbol {
  std::string symbol;  // s0
  std::string hint;    // the size it was created for
  std::string source;  // x.size()[0]
  std::string range;   // [2, int_oo]
  SourceLocation loc;
};

struct GuardAdded {
  std::string expr;  // Eq(s0, 33)
  SourceLocation loc;
};

struct Specialization {
  std::string symbol;
  std::vector<std::string> sources;
  std::string value;
  std::string reason;
  SourceLocation loc;
};

struct DimDecision {
  std::string source;  // x
  int64_t dim = -1;    // -1: a scalar
  std::string decision;  // static / dynamic / unbacked
  std::string why;       // default / automatic / mark_dynamic / ...
  std::string value;     // the size seen
};

struct GraphInput {
  std::string source;
  std::string dtype;
  std::vector<std::string> sizes;  // "s0" or "512"
};

struct Artifact {
  std::string kind;  // ir_after_pass / cpp_source / compiler_log
  std::string name;
  std::string text;
};

struct GraphBreak {
  std::string compile_id;  // may be empty
  std::string reason;
  std::string op;
  SourceLocation loc;
};

struct CacheEvent {
  std::string tier, key, result;
};

struct Phase {
  std::string name;
  double seconds = 0;
};

enum class Status {
  Success,     // compiled; no later compile replaced it
  Recompiled,  // compiled, then a guard failed and a later compile of the frame was made
  GraphBreak,  // the segment ended in a graph break
  Error,       // compilation failed
  Unknown,     // no compilation_metrics (the process may have stopped mid-compile)
};
const char* status_name(Status s);  // "success", "recompiled", ...

struct Compile {
  std::string id;      // "F/C" as written
  int64_t frame = -1;  // F
  int64_t index = -1;  // C (-1 when the id does not parse)
  std::string function;
  SourceLocation loc;
  bool has_start = false;
  std::vector<std::string> reasons;  // why this compile happened (recompile reasons)
  std::string backend, dynamic;
  int64_t start_ts_us = -1;
  // graph
  bool has_graph = false;
  std::string ir, graph_hash;
  int64_t node_count = -1;
  std::vector<GraphInput> inputs;
  std::vector<std::string> ops;  // call op names in order, parsed from the IR text
  // Parts of a training-step graph, by the ops' location comments: `[bwd of f:l]` backward,
  // `[optim at f:l]` optimizer (flat gradients and the update), any other forward; constants are in no
  // part, so the three sum to the graph's call nodes. All 0 without IR.
  int64_t forward_ops = 0, backward_ops = 0, optimizer_ops = 0;
  // guards
  std::string guards_text;
  int64_t guard_count = -1;
  std::vector<GuardAdded> guards_added;
  std::vector<Symbol> symbols;
  std::vector<Specialization> specializations;
  std::vector<DimDecision> decisions;
  std::vector<Artifact> artifacts;
  std::vector<GraphBreak> graph_breaks;
  std::vector<CacheEvent> cache_events;
  // compilation_metrics
  bool has_metrics = false;
  std::string metrics_status, error;
  std::vector<Phase> phases;
  std::vector<std::pair<std::string, std::string>> cache;  // tier → hit/miss
  int64_t metric_guard_count = -1, metric_node_count = -1, graph_count = -1;
  // derived by analyse()
  Status status = Status::Unknown;
  std::vector<std::string> recompiled_as;  // "0/1: <reason>" for each later compile that replaced this one
  double total_seconds() const;
};

/// Compile ids sort numerically by C, then by the id text (ids that do not parse go last).
struct CompileKey {
  int64_t index;
  std::string id;
  auto operator<=>(const CompileKey&) const = default;
};

struct Frame {
  int64_t id = -1;
  std::string function;
  SourceLocation loc;
  std::map<CompileKey, Compile> compiles;
  std::vector<GraphBreak> graph_breaks;  // breaks without a compile id
  std::vector<std::string> eager_fallbacks;
};

struct ChromiumEvent {
  std::string name, ph;
  int64_t ts = 0, dur = 0;
  std::string args_json;  // the args object, re-serialised
};

/// One traced process (one file, or several files of the same rank and pid).
struct Process {
  int64_t rank = 0;
  int64_t pid = 0;
  std::string label;  // "rank 0", or "rank 0 pid 123" when a rank has several processes
  std::vector<std::string> files;
  std::string host, version;
  /// process_start's job (PROTEAN_JOB_ID, or the MPI launcher's or Slurm's job id; "" when none):
  /// ranks are compared within one job.
  std::string job;
  /// process_start's instance: drawn once per process, so processes that got the same pid are told
  /// apart ("" in older traces).
  std::string instance;
  std::vector<std::string> argv;
  std::map<int64_t, Frame> frames;
  std::vector<ChromiumEvent> chromium;
  std::vector<std::string> pgo;     // one line per pgo event
  std::vector<CacheEvent> cache;    // cache events without a compile id
  int64_t events = 0;
};

/// What the reader skipped in one file. Line numbers are 1-based; 0 = none.
struct FileStats {
  std::string path;  // as given (relative to the trace dir when read from a dir)
  int64_t lines = 0, events = 0;
  int64_t malformed = 0, first_malformed = 0;  // not JSON / not an object / no event name
  int64_t unknown = 0, first_unknown = 0;      // an event name we do not know
  std::string first_unknown_name;
  int64_t newer = 0, first_newer = 0;          // a newer major version
  int64_t bad_fields = 0, first_bad_field = 0; // a known event with a wrongly typed field
  std::string first_bad_field_name;
  bool unreadable = false;
  std::string error;  // why the file could not be read
};

struct TraceModel {
  std::vector<Process> processes;  // sorted by rank, then pid
  std::vector<FileStats> files;
  int64_t total_events = 0;
};

/// Reads every *.jsonl file in `dir` (sorted by name). A missing or unreadable directory throws
/// protean::RuntimeError; bad file contents never throw.
TraceModel read_trace_dir(const std::filesystem::path& dir);
/// Reads named files' contents (tests): `files` is {display name, contents}.
TraceModel read_trace_texts(const std::vector<std::pair<std::string, std::string>>& files);

// ---- analysis ------------------------------------------------------------------------------------

/// One input dimension across the members of a similar group.
struct DimRow {
  std::string source;
  int64_t dim = -1;
  std::vector<std::string> values;  // one per member: "160", or "s0 (320)" when symbolic with a hint
  std::vector<std::string> concrete;  // distinct sizes seen, in order ("160", "320", ...)
  bool symbolic_somewhere = false;
};

/// Compiles of one frame whose op sequence and inputs (sources, ranks, dtypes) match.
struct SimilarGroup {
  size_t process = 0;  // index into TraceModel::processes
  int64_t frame = -1;
  std::string function;
  std::vector<std::string> members;  // compile ids
  std::vector<std::string> ops;      // the shared op sequence (empty when matched by graph_hash)
  std::string inputs_desc;           // "x: f32 rank 4, w: f32 rank 2"
  std::vector<DimRow> rows;          // only dims whose sizes differ
  bool size_reasons = false;         // some member's recompile reason is a size mismatch
};

/// A dimension (or scalar, dim -1) the user should declare dynamic, with why.
struct DynamicSuggestion {
  std::string source;
  int64_t dim = -1;
  std::vector<std::string> values;    // distinct sizes seen ("160", "320", ...)
  std::vector<std::string> evidence;  // "similar graphs 0/0, 0/1, 0/2 (rank 0): took 160, 320, 480"
  std::string function;               // the compiled function whose input it is ("" when unknown)
};

/// The suggestions of one compiled function: what to set or paste for it alone.
struct FunctionSuggestion {
  std::string function;
  std::vector<std::string> sources;             // x.size()[3], n
  std::string allowlist_line;                   // PROTEAN_DYNAMIC_SOURCES=x.size()[3],n
  std::vector<std::string> mark_dynamic_calls;  // pt::mark_dynamic(x, 3);  (at the call of `function`)
};

/// A dimension the user already declared dynamic (mark_dynamic, allowlist, dynamic=on, ...).
struct UserDecision {
  std::string source;
  int64_t dim = -1;
  std::string why;
};

struct Analysis {
  std::vector<SimilarGroup> groups;
  std::vector<DynamicSuggestion> suggestions;
  std::vector<UserDecision> already_dynamic;
  /// Every function's sources merged, for one process-wide PROTEAN_DYNAMIC_SOURCES ("" when nothing to
  /// suggest); per_function is the same grouped by compiled function, with the C++ lines to paste.
  std::string allowlist_line;               // PROTEAN_DYNAMIC_SOURCES=x.size()[3],n
  std::vector<std::string> mark_dynamic_calls;  // pt::mark_dynamic(x, 3); (every function's, deduplicated)
  std::vector<FunctionSuggestion> per_function;
  /// Some processes were compared as ranks of one job: same job (or none recorded) and distinct rank
  /// numbers. Processes that repeat a rank number within a job are separate runs (a program traced
  /// twice into one directory): not compared, and `run_notes` says so.
  bool multi_rank = false;
  std::vector<std::string> rank_warnings;
  std::vector<std::string> run_notes;
  std::vector<std::string> file_warnings;  // "3 malformed lines skipped in file X (first at line N)"
  std::map<std::string, int64_t> status_counts;
};

/// Derives every compile's status and builds the analysis. Mutates only Compile::status and
/// Compile::recompiled_as.
Analysis analyse(TraceModel& model);

/// False for static decisions that merely restate a default (`default`, `parameter`, `dynamic_off`,
/// `int_argument`): renderers list only the notable ones (dynamic, unbacked, mark_static, zero_one, ...).
bool notable_decision(const DimDecision& d);
/// "memory hit 3, disk miss 1, disk store 1": the artifact-cache events of a process (its compiles'
/// and its own), counted per tier and result in first-seen order; "" when there are none.
std::string cache_summary(const Process& p);
// ---- rendering -----------------------------------------------------------------------------------

/// The plain-text report (`protean report DIR --plain-text`).
std::string render_plain_text(const TraceModel& model, const Analysis& analysis);

/// Writes the static HTML site into `out` (created): index.html, compile_<F>_<C>[_rank<R>].html,
/// dynamic.html, ranks.html (multi-rank only), chromium_events.json. Throws RuntimeError on I/O errors.
void write_html_site(const TraceModel& model, const Analysis& analysis, const std::filesystem::path& out);

/// The page name of a compile: compile_<F>_<C>.html, with _rank<R> (or _rank<R>_pid<P>) when the
/// trace has several processes.
std::string compile_page_name(const TraceModel& model, const Process& p, const Compile& c);

/// Escapes & < > " ' for HTML text and attributes.
std::string html_escape(std::string_view s);

/// {"traceEvents":[...]} with pid/tid = rank (Trace Event Format; loads in Perfetto).
std::string chromium_events_json(const TraceModel& model);

}  // namespace protean::observe::report
