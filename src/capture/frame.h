// Frame: the per-compiled-function state (PyTorch's per-code-object cache): cache entries (newest
// first), FrameState for automatic dynamic, compile counters and the compile mutex.
//
// Concurrency: the entry list is an immutable array published through an atomic pointer (readers do
// one acquire load, no lock); a miss takes `compile_mu`, re-checks the entries (another thread may
// have compiled meanwhile), compiles once and publishes a new array. Old arrays are retired, not
// freed, until reset() (which must not race with calls).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capture/cache_entry.h"
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

  void clear();  // reset(): drops entries and FrameState
};

/// Every live frame (for reset()).
void register_frame(CompiledFunctionImpl* f);
void unregister_frame(CompiledFunctionImpl* f);

}  // namespace protean::detail

namespace protean::capture {
/// Compile phases (capture, passes, backend) as CPU time of the compiling thread, in seconds, summed
/// since start or reset() — the CPU-time twin of Stats::phase_seconds (wall time). It excludes time
/// spent waiting for a core on a loaded machine and work done by child processes (the cpu backend's
/// C++ compiler), so it shows what a warm compile costs in itself.
std::map<std::string, double> phase_cpu_seconds();
}  // namespace protean::capture
