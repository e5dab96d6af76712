// Text logs by category, selected with PROTEAN_LOGS (PyTorch's TORCH_LOGS):
//   PROTEAN_LOGS="+dynamic,recompiles,guards"   → stderr lines such as
//   [0/1] create_symbol s0 = 16 for x.size()[0] [2, int_oo] at mlp.cpp:12
// A leading `+` selects debug level for that category (more lines); `all` enables every category.
// The spec is parsed once from the environment on first use; tests override it (set_log_spec) and
// capture lines into a string (LogCapture). Checking whether a category is on is one relaxed atomic
// load, so call sites may test it on hot paths.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace protean::observe {

enum class LogCat : uint32_t {
  Dynamic = 1u << 0,
  Recompiles = 1u << 1,
  RecompilesVerbose = 1u << 2,
  Guards = 1u << 3,
  GraphBreaks = 1u << 4,
  OutputCode = 1u << 5,
  PerfHints = 1u << 6,
  Pgo = 1u << 7,
  Cache = 1u << 8,
  Partition = 1u << 9,  // the joint graph's save-vs-recompute decisions (ir/passes/partition.h)
  Regions = 1u << 10,  ///< region keys, compiles, hits and what split two variants (docs/regions.md)
  Graphs = 1u << 11,   ///< size buckets per dynamic symbol and CUDA graph recordings/replays (docs/graphs.md)
};

/// True when `cat` is enabled (at debug level when `debug`).
bool log_enabled(LogCat cat, bool debug = false);
/// Emits one line (or several, when `msg` has newlines) prefixed with `[compile_id] ` when
/// compile_id is non-empty. Goes to stderr, or to the active LogCapture.
void log_line(LogCat cat, std::string_view compile_id, std::string_view msg);
/// A warning: always emitted (stderr, or the active LogCapture), whatever the spec.
void warn(std::string_view msg);
/// Replaces the spec (same syntax as PROTEAN_LOGS). An empty spec disables everything.
void set_log_spec(std::string_view spec);
/// Category name as written in PROTEAN_LOGS ("recompiles_verbose").
std::string_view log_cat_name(LogCat cat);

/// RAII for tests: sets a spec and collects every emitted line (instead of printing) until destroyed,
/// then restores the previous spec.
class LogCapture {
 public:
  explicit LogCapture(std::string_view spec);
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  /// Everything captured so far, one line per entry, each ending in '\n'.
  std::string str() const;

 private:
  uint64_t prev_mask_;
};

}  // namespace protean::observe
