// Frame: the per-compiled-function state (PyTorch's per-code-object cache): cache entries (newest
// first), FrameState for automatic dynamic, compile counters and the compile mutex.
//
// Concurrency: the entry list is an immutable array published through an atomic pointer (readers do
// one acquire load, no lock); a miss takes `compile_mu`, re-checks the entries (another thread may
// have compiled meanwhile), compiles once and publishes a new array. Old arrays are kept until
// reset(), which unpublishes everything and frees it only after every call that might still read it
// has returned (dispatch runs inside a core::ReadSection; core/reclaim.h).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/registry.h"
#include "capture/cache_entry.h"
#include "capture/graph_break.h"
#include "dynamic/buckets.h"
#include "dynamic/frame_state.h"
#include "dynamic/pgo_hooks.h"
#include "protean/compile.h"
#include "protean/module.h"

namespace protean::detail {

class CompiledFunctionImpl {
 public:
  CompiledFunctionImpl(CompileOptions opts, Body body, std::shared_ptr<Module> module);
  ~CompiledFunctionImpl();

  using EntryList = std::vector<const capture::CacheEntry*>;

  CompileOptions opts;
  /// The bucket policy in force for every compile of this function: PROTEAN_BUCKETS, else
  /// opts.buckets, read once when the function is compiled (a ValueError there on bad text), so
  /// text set later neither changes its buckets nor makes its recompiles fail.
  dynamic::BucketPolicy bucket_policy;
  Body body;
  std::shared_ptr<Module> module;
  Module::Slots module_slots;                 // stable pointers into the module
  std::vector<const Tensor*> module_tensors;  // module_slots.tensors' pointers, in order
  int frame_id = 0;

  std::atomic<const EntryList*> entries{nullptr};
  std::mutex compile_mu;
  // Guarded by compile_mu:
  std::vector<std::unique_ptr<capture::CacheEntry>> owned;
  std::vector<std::unique_ptr<EntryList>> lists;  // current and retired arrays
  dynamic::FrameState frame_state;
  dynamic::FrameSeeds seeds;  // PGO entry + ranks' joined FrameState (docs/pgo.md)
  int next_compile = 0;       // compile index C of the next compile
  bool limit_warned = false;  // the recompile-limit warning was printed
  bool eager_misses = false;  // limit hit: every miss runs eagerly
  std::string last_reason;

  // ---- graph breaks and segmented execution (capture/segments.h, docs/breaks.md) ----
  std::atomic<bool> segmented{false};  // a trace hit a graph break: every call runs segmented
  bool is_segment = false;             // this frame runs one segment of another frame
  std::mutex segments_mu;
  // Guarded by segments_mu:
  std::unordered_map<uint64_t, std::shared_ptr<CompiledFunctionImpl>> segments;  // segment key → frame
  std::vector<int> segment_frame_ids;  // creation order
  std::map<int, int> segment_variants;  // segment index → frames created for it
  bool segment_limit_warned = false;    // a segment's variants reached recompile_limit (warned once)
  std::set<uint64_t> reported_segments;  // keys whose ending break was reported (cleared by reset())
  std::mutex breaks_mu;
  std::set<std::string> break_sites;  // guarded by breaks_mu: breaks already counted and logged

  // ---- ops the backend rejects (docs/breaks.md) ----
  backend::OpSupport op_support;  // the backend's predicate when compiled (empty: takes every op)
  // Ops rejected only when an artifact was built (UnsupportedOpError) or a segment frame traced:
  // segmented execution breaks at every matching call. Immutable lists published like `entries`.
  std::atomic<const std::vector<capture::RejectedOp>*> learned{nullptr};
  std::mutex learned_mu;
  std::vector<std::unique_ptr<std::vector<capture::RejectedOp>>> learned_lists;  // guarded by learned_mu

  // ---- this function's counters (CompiledFunction::stats()); cleared by clear() ----
  struct Counters {
    std::atomic<int64_t> compiles{0}, recompiles{0}, cache_hits{0}, cache_misses{0}, graph_breaks{0},
        guard_evaluations{0}, eager_fallbacks{0}, verify_failures{0};
  };
  Counters counters;
  std::mutex reasons_mu;
  std::map<std::string, int64_t> recompile_reasons;  // guarded by reasons_mu

  // ---- backend "auto" (CompileOptions::backend): resolved by the first compile ----
  bool backend_auto = false;

  // ---- verify mode ----
  int verify_every = 0;  // opts.verify_every, or PROTEAN_VERIFY
  std::atomic<int64_t> verify_calls{0};
  std::set<std::string> verify_reported;  // guarded by compile_mu

  /// reset(): drops entries and FrameState. The entries, lists and artifacts are moved to `retired`
  /// (the caller frees them after the grace period of core/reclaim.h: calls may still run them).
  void clear(std::vector<std::shared_ptr<void>>& retired);
  void clear_counters();  // zeroes `counters` and `recompile_reasons`
};

/// Counts (stats graph_breaks / graph_break_reasons), logs (PROTEAN_LOGS=graph_breaks) and traces
/// (`graph_break` event) a break of frame `f`, once per distinct site. `compile_id` may be empty.
void report_graph_break(CompiledFunctionImpl& f, const capture::BreakInfo& b, const std::string& compile_id);

/// Adds `b.learn` (an op the backend rejected late) to `f`'s learned rejections; no-op when unset or
/// already known. Does not report the break (report_graph_break does).
void learn_rejected(CompiledFunctionImpl& f, const capture::BreakInfo& b);

/// Every live frame (for reset()): make_compiled registers each new frame (weakly), its destructor
/// unregisters it. reset() clears frames without holding the registry's lock, so a compile that
/// holds a frame's compile_mu may create or destroy frames while reset() waits for it.
void register_frame(const std::shared_ptr<CompiledFunctionImpl>& f);
void unregister_frame(CompiledFunctionImpl* f);

}  // namespace protean::detail

namespace protean::capture {
/// Compile phases (capture, passes, backend) as CPU time of the compiling thread, in seconds, summed
/// since start or reset() — the CPU-time twin of Stats::phase_seconds (wall time). It excludes time
/// spent waiting for a core on a loaded machine and work done by child processes (the cpu backend's
/// C++ compiler), so it shows what a warm compile costs in itself.
std::map<std::string, double> phase_cpu_seconds();
}  // namespace protean::capture
