// Dispatch of compiled-function calls: guard checks on the cache entries, compile on a miss,
// recompile limits, stances, stats. The compile itself (trace → passes → backend) is
// capture/compile.cpp.
#include "capture/frame.h"

#include <fmt/format.h>
#include <malloc.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "backend/async_compile.h"
#include "backend/graph_stats.h"
#include "backend/registry.h"
#include "capture/compile.h"
#include "capture/limit_advice.h"
#include "capture/segments.h"
#include "capture/tracer.h"
#include "core/reclaim.h"
#include "dynamic/buckets.h"
#include "dynamic/collectives.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
#include "observe/compile_trace.h"
#include "observe/counter.h"
#include "observe/env.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "ops/dispatch.h"
#include "sym/expr.h"

namespace protean {

using capture::CacheEntry;
using observe::LogCat;

namespace {

/// The counters of Stats, incremented without a lock; reset() assigns {} (every counter to 0).
struct GlobalCounters {
  observe::Counter frames, compiles, recompiles, cache_hits, cache_misses, graph_breaks, guard_evaluations,
      eager_fallbacks, verify_failures, region_compiles, region_hits;
};
/// The maps of Stats (behind GlobalStats::mu); reset() assigns {}.
struct GlobalMaps {
  std::map<std::string, int64_t> recompile_reasons, graph_break_reasons;
  std::map<std::string, double> phase_seconds, phase_cpu_seconds;
};
struct GlobalStats : GlobalCounters, GlobalMaps {
  std::mutex mu;  // guards the maps
};
GlobalStats& gstats() {
  static GlobalStats s;
  return s;
}

std::atomic<int> g_next_frame{0};
std::atomic<Stance> g_stance{Stance::Default};

// Every live frame, by address, weakly: reset() takes owning references under g_frames_mu and clears
// the frames after releasing it (a compile that holds a frame's compile_mu may create or destroy
// frames, which takes g_frames_mu).
std::mutex g_frames_mu;
/// Never destroyed: a compiled function the program keeps in a static or global constructed before
/// Protean's first compile is destroyed after this registry would be, and unregisters from it.
std::map<detail::CompiledFunctionImpl*, std::weak_ptr<detail::CompiledFunctionImpl>>& frames() {
  static auto* f = new std::map<detail::CompiledFunctionImpl*, std::weak_ptr<detail::CompiledFunctionImpl>>();
  return *f;
}

void add_phase(const std::string& phase, double seconds, double cpu_seconds) {
  auto& s = gstats();
  std::lock_guard<std::mutex> lock(s.mu);
  s.phase_seconds[phase] += seconds;
  s.phase_cpu_seconds[phase] += cpu_seconds;
}

std::string frame_desc(const detail::CompiledFunctionImpl& f) {
  return fmt::format("{} in {}:{}", f.opts.name, f.opts.file, f.opts.line);
}

/// True when an argument is a FakeTensor or lazy tensor of an enclosing trace or recording.
bool traced_args(std::span<const detail::ArgValue> args) {
  for (const auto& a : args) {
    if (a.kind == detail::ArgValue::Kind::Tensor && a.tensor.defined() && a.tensor.is_fake()) return true;
    if (a.kind == detail::ArgValue::Kind::TensorList)
      for (const auto& t : a.tensors)
        if (t.defined() && t.is_fake()) return true;
  }
  return false;
}

// Runs a hit entry. `slots` holds the values bound by its guard check.
detail::Action run_entry(const detail::CompiledFunctionImpl& f, const CacheEntry& e,
                         std::span<const detail::ArgValue> args, const int64_t* slots,
                         std::vector<detail::OutValue>& outs) {
  e.observe(slots);  // true ranges for the PGO profile (fold_observed_ranges)
  if (e.runs_user_function) return detail::Action::RunEager;
  std::vector<Tensor> inputs;
  inputs.reserve(e.inputs.size());
  for (const auto& r : e.inputs) {
    if (r.kind == capture::InputRef::Kind::DynFloat) {
      inputs.push_back(scalar_tensor(args[static_cast<size_t>(r.arg)].f, DType::F64));
    } else {
      const Tensor* t = capture::resolve_input(r, args, f.module_tensors);
      inputs.push_back(t ? *t : Tensor());
    }
  }
  int64_t symvals_buf[32];
  std::vector<int64_t> symvals_heap;
  int64_t* symvals = symvals_buf;
  if (e.symbols.size() > 32) {
    symvals_heap.resize(e.symbols.size());
    symvals = symvals_heap.data();
  }
  for (size_t i = 0; i < e.symbols.size(); ++i) symvals[i] = slots[e.symbol_slots[i]];
  std::vector<Tensor> results = e.artifact->run(inputs, std::span<const int64_t>(symvals, e.symbols.size()));
  outs.clear();
  outs.reserve(e.outputs.size());
  for (const auto& spec : e.outputs) {
    detail::OutValue o;
    switch (spec.kind) {
      case capture::OutSpec::Kind::GraphOutput:
        o.kind = detail::OutValue::Kind::Tensor;
        o.tensor = results.at(static_cast<size_t>(spec.index));
        break;
      case capture::OutSpec::Kind::SymExpr: {
        o.kind = detail::OutValue::Kind::SymInt;
        int64_t v = sym::evaluate(spec.expr, [&](sym::Expr s) -> int64_t {
          for (size_t i = 0; i < e.symbols.size(); ++i)
            if (e.symbols[i] == s) return symvals[i];
          throw RuntimeError(fmt::format("{}: output symbol {} is not bound", e.compile_id, s->name));
        });
        o.sym = SymInt(v);
        break;
      }
      case capture::OutSpec::Kind::Int:
        o.kind = detail::OutValue::Kind::Int;
        o.sym = SymInt(spec.i);
        break;
      case capture::OutSpec::Kind::Float:
        o.kind = detail::OutValue::Kind::Float;
        o.f = spec.f;
        break;
      case capture::OutSpec::Kind::Bool:
        o.kind = detail::OutValue::Kind::Bool;
        o.b = spec.b;
        break;
      case capture::OutSpec::Kind::Undefined:
        o.kind = detail::OutValue::Kind::Tensor;  // an undefined Tensor, as the traced function returned
        break;
    }
    outs.push_back(std::move(o));
  }
  return detail::Action::Ran;
}

// Folds the sizes the entries saw on cache hits into the frame's FrameState (its size_bounds), so the
// PGO profile records true ranges. Needs f.compile_mu (or a frame no other thread uses). Returns
// true when a range grew.
bool fold_observed_ranges(detail::CompiledFunctionImpl& f) {
  bool grew = false;
  for (const auto& e : f.owned) {
    if (!e->slot_min) continue;
    for (const capture::TensorGuard& g : e->tensors)
      for (size_t d = 0; d < g.slots.size(); ++d) {
        const int32_t s = g.slots[d];
        if (s < 0 || s >= e->num_slots) continue;
        const int64_t lo = e->slot_min[s].load(std::memory_order_relaxed);
        const int64_t hi = e->slot_max[s].load(std::memory_order_relaxed);
        if (lo <= hi) grew |= f.frame_state.widen_size_bound(g.source, d, lo, hi);
      }
  }
  return grew;
}

// Writes the ranges seen on cache hits since the last compile to the PGO profile (when PGO is on and
// a range grew). Called when a frame is destroyed or reset and, for frames still alive, at exit.
std::atomic<bool> g_exiting{false};
void flush_observed_ranges(detail::CompiledFunctionImpl& f) {
  if (f.next_compile == 0 || f.opts.dynamic == Dynamic::Off) return;
  std::unique_lock<std::mutex> lock(f.compile_mu, std::try_to_lock);
  if (!lock.owns_lock()) return;  // a compile is running: it writes the profile itself
  try {
    if (fold_observed_ranges(f))
      dynamic::after_compile(f.seeds, f.opts.dynamic, f.frame_state, fmt::format("{}/{}", f.frame_id, f.next_compile - 1));
  } catch (const std::exception& e) {
    observe::warn(fmt::format("PGO: could not record the observed size ranges of {}: {}", f.opts.name, e.what()));
  }
}
void flush_all_at_exit() {
  g_exiting.store(true);
  std::vector<std::shared_ptr<detail::CompiledFunctionImpl>> all;  // owning: a frame may be released meanwhile
  {
    std::lock_guard<std::mutex> lock(g_frames_mu);
    for (auto& [ptr, weak] : frames())
      if (auto f = weak.lock()) all.push_back(std::move(f));
  }
  for (auto& f : all) flush_observed_ranges(*f);
}
// Registered after the PGO store exists (after a frame's first compile), so it runs before the
// store's destructor.
void register_exit_flush() {
  static const bool once = [] {
    std::atexit(flush_all_at_exit);
    return true;
  }();
  (void)once;
}

// Merges this call's inputs into the frame's FrameState (automatic dynamic).
void update_frame_state(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args) {
  using K = detail::ArgValue::Kind;
  auto name = [&](size_t i) {
    return i < f.opts.arg_names.size() && !f.opts.arg_names[i].empty() ? f.opts.arg_names[i] : fmt::format("args[{}]", i);
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    switch (a.kind) {
      case K::Tensor:
        if (a.tensor.defined()) f.frame_state.update_tensor(name(i), a.tensor.int_sizes(), a.tensor.int_strides());
        break;
      case K::TensorList:
        for (size_t j = 0; j < a.tensors.size(); ++j)
          if (a.tensors[j].defined())
            f.frame_state.update_tensor(fmt::format("{}[{}]", name(i), j), a.tensors[j].int_sizes(), a.tensors[j].int_strides());
        break;
      case K::SymInt:
      case K::Int:
        f.frame_state.update_scalar(name(i), a.i);
        break;
      case K::Float:
      case K::SymFloat: {
        int64_t bits;
        std::memcpy(&bits, &a.f, sizeof bits);
        f.frame_state.update_scalar(name(i), bits);
        break;
      }
      case K::Bool:
      case K::String:
        break;
    }
  }
  // Registered attributes: a value that changed makes the attribute dynamic (tracer.cpp read_attribute).
  for (const auto& [n, value] : f.module_slots.attributes) f.frame_state.update_scalar("self." + n, *value);
  if (f.opts.dynamic_parameters)
    for (size_t k = 0; k < f.module_tensors.size(); ++k)
      if (f.module_tensors[k]->defined())
        f.frame_state.update_tensor("self." + f.module_slots.tensors[k].first, f.module_tensors[k]->int_sizes(),
                                    f.module_tensors[k]->int_strides());
}

std::string fullgraph_error(const detail::CompiledFunctionImpl& f, const std::string& compile_id, const capture::BreakInfo& b) {
  const char* advice = b.rejected_op
                           ? "Compile for a backend that supports the op, or without fullgraph to run the op eagerly "
                             "between two segments (docs/breaks.md)"
                           : "Rewrite it without the host read (torch-style where/cond, docs/breaks.md) or compile "
                             "without fullgraph to run the function in segments";
  return fmt::format("fullgraph=true: graph break in {} ({}): {} (op {}) at {}. {}", frame_desc(f), compile_id, b.reason,
                     b.op, b.where(), advice);
}

// A graph break found while compiling `f` (by its trace, or by the backend building the artifact).
// `lock` holds f.compile_mu.
detail::Action take_break(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                          std::vector<detail::OutValue>& outs, std::unique_lock<std::mutex>& lock,
                          const capture::BreakInfo& b, const std::string& compile_id) {
  // A segment frame whose op the backend rejects only now (a predicate deciding on symbolic sizes, a
  // late lowering failure): the parent frame learns the op, reports the break and runs this segment
  // eagerly (segments.cpp).
  if (f.is_segment && b.learn) throw capture::GraphBreakError(b);
  detail::report_graph_break(f, b, compile_id);
  if (f.opts.fullgraph) throw CompileError(fullgraph_error(f, compile_id, b));
  if (f.is_segment) throw capture::GraphBreakError(b);  // a segment holds no breaking op; this is a bug
  detail::learn_rejected(f, b);
  // Segmented execution from now on (docs/breaks.md).
  f.segmented.store(true, std::memory_order_release);
  // Called while another function is traced (FakeTensor arguments): the break is a break of the
  // enclosing trace too. From now on this function runs inline inside enclosing traces and
  // recordings, and segmented when called on its own.
  if (traced_args(args)) throw capture::GraphBreakError(b);
  // This call runs the body again, segmented.
  lock.unlock();
  capture::run_segmented(f, args, outs);
  return detail::Action::Ran;
}

// Frames whose body this thread is tracing now, innermost last (each holds its compile_mu).
thread_local std::vector<const detail::CompiledFunctionImpl*> t_tracing;

struct TracingMark {
  explicit TracingMark(const detail::CompiledFunctionImpl& f) { t_tracing.push_back(&f); }
  ~TracingMark() { t_tracing.pop_back(); }
  TracingMark(const TracingMark&) = delete;
  TracingMark& operator=(const TracingMark&) = delete;
};

// A call of `f` from inside its own trace that is not inlined (its arguments are not the trace's
// tensors) would wait forever on the compile mutex this thread holds.
void check_reentry(const detail::CompiledFunctionImpl& f) {
  if (std::find(t_tracing.begin(), t_tracing.end(), &f) == t_tracing.end()) return;
  std::string chain;
  for (const auto* g : t_tracing) chain += (chain.empty() ? "" : " -> ") + g->opts.name;
  throw CompileError(fmt::format(
      "re-entrant compile: {} was called while its own body is being traced (trace stack: {} -> {}), on "
      "arguments that are not tensors of that trace, so the call cannot be inlined and would have to compile "
      "{} inside its own compile. Call the plain (uncompiled) function there, or pass it the traced tensors "
      "(a call on them is inlined into the graph)",
      frame_desc(f), chain, f.opts.name, f.opts.name));
}

// A compile frees most of what it allocated (the traced graph's copies, the passes' scratch, the
// generated source and its logs), in the calling thread's malloc arena and the compile workers'. glibc
// keeps such freed pages mapped, so a training process would carry the compiler's peak through every
// later step: malloc_trim hands the free pages of every arena back once the compile is published
// (about a millisecond for a few hundred MiB of heap, against a compile's tenths of a second).
// PROTEAN_TRIM_AFTER_COMPILE=0 keeps them.
void trim_after_compile() {
#ifdef __GLIBC__
  static const bool on = observe::env_on("PROTEAN_TRIM_AFTER_COMPILE");
  if (on) malloc_trim(0);
#endif
}

// `force`: compile even when an entry matches (compiler collectives: another rank missed).
detail::Action miss(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                    std::vector<detail::OutValue>& outs, bool force = false) {
  auto& st = gstats();
  check_reentry(f);
  std::unique_lock<std::mutex> lock(f.compile_mu);
  int64_t slots_buf[64];
  std::vector<int64_t> slots_heap;
  auto slots_for = [&](const CacheEntry& e) -> int64_t* {
    if (e.num_slots <= 64) return slots_buf;
    slots_heap.assign(static_cast<size_t>(e.num_slots), 0);
    return slots_heap.data();
  };
  // Another thread may have compiled a matching entry while we waited.
  const auto* list = f.entries.load(std::memory_order_acquire);
  if (list && !force)
    for (const CacheEntry* e : *list) {
      int64_t* slots = slots_for(*e);
      if (e->check(args, f.module_tensors, slots)) {
        lock.unlock();
        st.cache_hits.fetch_add(1, std::memory_order_relaxed);
        f.counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
        return run_entry(f, *e, args, slots, outs);
      }
    }
  st.cache_misses.fetch_add(1, std::memory_order_relaxed);
  f.counters.cache_misses.fetch_add(1, std::memory_order_relaxed);
  core::collect();  // entries retired by an earlier reset() whose calls have all returned
  if (f.eager_misses) {
    st.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    f.counters.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return detail::Action::RunEager;
  }
  // Reasons: each failing entry's first failing guard (newest first, like PyTorch).
  std::vector<std::string> reasons, verbose;
  if (list)
    for (const CacheEntry* e : *list) {
      auto all = e->all_failures(args, f.module_tensors);
      if (!all.empty()) reasons.push_back(fmt::format("{}: {}", e->compile_id, all.front()));
      for (const auto& r : all) verbose.push_back(fmt::format("{}: {}", e->compile_id, r));
    }
  const bool recompile = list && !list->empty();
  std::string reason_text;
  for (const auto& r : reasons) reason_text += (reason_text.empty() ? "" : "; ") + r;
  Stance stance = g_stance.load(std::memory_order_relaxed);
  if (recompile && stance == Stance::FailOnRecompile)
    throw CompileError(fmt::format("Detected recompile of {} when the stance is fail_on_recompile: {}", frame_desc(f), reason_text));
  if (recompile && stance == Stance::EagerOnRecompile) {
    st.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    f.counters.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return detail::Action::RunEager;
  }
  // Recompile limits.
  const int entries_now = list ? static_cast<int>(list->size()) : 0;
  const bool per_frame = entries_now >= f.opts.recompile_limit;
  const bool accumulated = f.next_compile >= f.opts.accumulated_recompile_limit;
  if (recompile && (per_frame || accumulated)) {
    const char* which = per_frame ? "recompile_limit" : "accumulated_recompile_limit";
    int limit = per_frame ? f.opts.recompile_limit : f.opts.accumulated_recompile_limit;
    std::string msg = fmt::format("{} hit config.{} ({})\n   function: '{}' ({}:{})\n   last reason: {}", f.opts.name, which, limit,
                                  f.opts.name, f.opts.file, f.opts.line, reasons.empty() ? "?" : reasons.front());
    if (!reasons.empty()) msg += capture::limit_advice(f, args, reasons.front());
    if (f.opts.fail_on_recompile_limit_hit || f.opts.fullgraph) throw CompileError(msg);
    if (!f.limit_warned) {
      f.limit_warned = true;
      observe::warn(msg + "\n   further misses run eagerly. To log all recompilation reasons, use PROTEAN_LOGS=\"recompiles\".");
    }
    observe::trace_eager_fallback(f.frame_id, f.opts.name,
                                  fmt::format("{} ({}) hit; last reason: {}", which, limit, reasons.empty() ? "?" : reasons.front()));
    f.eager_misses = true;
    st.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    f.counters.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return detail::Action::RunEager;
  }

  // ---- compile ----
  if (f.backend_auto && !recompile) {
    // backend "auto": the best compiling backend for the device of the first call's tensors.
    f.opts.backend = backend::auto_backend(capture::input_device(args));
    f.op_support = backend::op_support(f.opts.backend);
    f.backend_auto = false;
  }
  update_frame_state(f, args);
  fold_observed_ranges(f);
  const int cidx = f.next_compile++;
  const std::string compile_id = fmt::format("{}/{}", f.frame_id, cidx);
  dynamic::before_compile(f.seeds, f.opts.dynamic, cidx == 0, f.frame_state, compile_id);  // PGO, collectives
  if (recompile) {
    f.last_reason = reasons.empty() ? "" : reasons.front();
    if (observe::log_enabled(LogCat::Recompiles)) {
      std::string m = fmt::format("Recompiling function {} in {}:{}\n    triggered by the following guard failure(s):", f.opts.name,
                                  f.opts.file, f.opts.line);
      const auto& lines = observe::log_enabled(LogCat::RecompilesVerbose) ? verbose : reasons;
      for (const auto& r : lines) m += "\n    - " + r;
      observe::log_line(LogCat::Recompiles, compile_id, m);
    }
  }
  observe::trace_compile_start(f.frame_id, compile_id, f.opts.name, f.opts.file, f.opts.line, reasons, f.opts.backend,
                               f.opts.dynamic == Dynamic::On ? "on" : f.opts.dynamic == Dynamic::Off ? "off" : "auto", recompile);
  capture::CompileOutcome built = [&] {
    TracingMark mark(f);  // a call of f from its own trace is a CompileError (check_reentry)
    return capture::compile_entry(f, args, compile_id, cidx);  // trace → passes → backend
  }();
  for (const observe::Phase& p : built.phases.phases()) add_phase(p.name, p.wall_s, p.cpu_s);
  if (built.graph_break) return take_break(f, args, outs, lock, *built.graph_break, compile_id);
  std::unique_ptr<CacheEntry> entry = std::move(built.entry);

  // Publish: newest first.
  CacheEntry* raw = entry.get();
  f.owned.push_back(std::move(entry));
  auto next = std::make_unique<detail::CompiledFunctionImpl::EntryList>();
  next->push_back(raw);
  if (list) next->insert(next->end(), list->begin(), list->end());
  f.entries.store(next.get(), std::memory_order_release);
  f.lists.push_back(std::move(next));
  st.compiles.fetch_add(1, std::memory_order_relaxed);
  f.counters.compiles.fetch_add(1, std::memory_order_relaxed);
  dynamic::after_compile(f.seeds, f.opts.dynamic, f.frame_state, compile_id);  // PGO store
  register_exit_flush();
  if (recompile) {
    st.recompiles.fetch_add(1, std::memory_order_relaxed);
    f.counters.recompiles.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> g(st.mu);
      for (const auto& r : reasons) st.recompile_reasons[r]++;
    }
    std::lock_guard<std::mutex> g(f.reasons_mu);
    for (const auto& r : reasons) f.recompile_reasons[r]++;
  }
  lock.unlock();
  trim_after_compile();

  int64_t* slots = slots_for(*raw);
  if (!raw->check(args, f.module_tensors, slots)) {
    // The entry does not accept the inputs it was traced from (a guard the trace could not satisfy).
    observe::warn(fmt::format("{}: the new cache entry of {} rejects the inputs it was traced from ({}); running eagerly",
                              compile_id, f.opts.name, raw->first_failure(args, f.module_tensors)));
    return detail::Action::RunEager;
  }
  return run_entry(f, *raw, args, slots, outs);
}

// Where node `i` of `g` comes from in the user's code, for verify mode's warning: its own line, or
// for a node without one (a constant: a captured tensor or a folded value) the line of the first op
// that reads it.
std::string node_where(const ir::Graph& g, size_t i) {
  const ir::Node& n = g.nodes()[i];
  if (n.loc.known()) return "at " + n.loc.str();
  for (size_t j = i + 1; j < g.nodes().size(); ++j) {
    const ir::Node& m = g.nodes()[j];
    if (m.kind != ir::NodeKind::Call || !m.loc.known()) continue;
    for (ir::ValueId v : m.inputs)
      if (v != ir::kNoValue && std::find(n.outputs.begin(), n.outputs.end(), v) != n.outputs.end())
        return fmt::format("{} first read at {}", n.kind == ir::NodeKind::Constant ? "a constant" : "a value", m.loc.str());
  }
  return "no user location is known for it: the binary has no debug info for that line, or no op reads it";
}

// Verify mode: re-traces this call and compares the fresh graph (after the same passes) with the
// entry's. False (after one warning per distinct difference) when they differ.
bool verify_entry(detail::CompiledFunctionImpl& f, const CacheEntry& e, std::span<const detail::ArgValue> args) {
  std::string diff;
  {
    check_reentry(f);
    std::lock_guard<std::mutex> lock(f.compile_mu);
    std::unique_ptr<CacheEntry> fresh;
    try {
      TracingMark mark(f);
      fresh = capture::trace_frame(f, args, e.compile_id);
    } catch (const capture::GraphBreakError& b) {
      diff = fmt::format("the re-trace hit a graph break the cached graph does not have: {}", b.info.text());
    }
    if (fresh) {
      ir::PassOptions popts;
      std::vector<sym::RuntimeAssert> asserts;  // the same rewrites as the compile (their checks are the entry's)
      popts.runtime_asserts = &asserts;
      ir::run_passes(*fresh->graph, popts);
      const ir::Graph& a = *e.graph;
      const ir::Graph& b = *fresh->graph;
      const size_t n = std::max(a.nodes().size(), b.nodes().size());
      for (size_t i = 0; i < n && diff.empty(); ++i) {
        if (i >= a.nodes().size() || i >= b.nodes().size()) {
          diff = fmt::format("node {}: the {} graph ends earlier", i, i >= a.nodes().size() ? "cached" : "re-traced");
          break;
        }
        const ir::Node& na = a.nodes()[i];
        const ir::Node& nb = b.nodes()[i];
        std::string la = ir::print_node(a, na), lb = ir::print_node(b, nb);
        bool same = la == lb;
        if (same && na.kind == ir::NodeKind::Constant && na.constant.defined() && nb.constant.defined() &&
            na.constant.impl() != nb.constant.impl()) {
          same = na.constant.int_sizes() == nb.constant.int_sizes() &&
                 na.constant.to_vector<double>() == nb.constant.to_vector<double>();
          if (!same && na.constant.int_numel() <= 16 && nb.constant.int_numel() <= 16) {
            la += "  [value " + na.constant.str() + "]";
            lb += "  [value " + nb.constant.str() + "]";
          }
        }
        for (size_t k = 0; same && k < na.subgraphs.size() && k < nb.subgraphs.size(); ++k) {
          if (ir::equal_graphs(*na.subgraphs[k], *nb.subgraphs[k])) continue;
          same = false;
          const char* which = k == 0 ? "true" : "false";
          la += fmt::format("  [{} branch:\n{}]", which, ir::print(*na.subgraphs[k]));
          lb += fmt::format("  [{} branch:\n{}]", which, ir::print(*nb.subgraphs[k]));
        }
        if (!same)
          diff = fmt::format("first differing node {} ({}):\n  cached:    {}\n  re-traced: {}", i, node_where(b, i), la,
                             lb);
      }
    }
    if (diff.empty()) return true;
    gstats().verify_failures.fetch_add(1, std::memory_order_relaxed);
    f.counters.verify_failures.fetch_add(1, std::memory_order_relaxed);
    if (!f.verify_reported.insert(diff).second) return false;
  }
  observe::warn(fmt::format("verify: {} ({}): the cached graph differs from a fresh trace of this call; {}\n"
                            "   the function reads C++ state that is neither an argument nor a registered attribute "
                            "(a captured variable, a member, a global); guards cannot see it. Pass it as an argument "
                            "(SymInt/SymFloat to avoid recompiles) or register it on the Module. This call runs eagerly.",
                            frame_desc(f), e.compile_id, diff));
  return false;
}

// Compiler collectives: every call, the ranks agree whether any of them missed; then all compile.
detail::Action dispatch_collective(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                                   std::vector<detail::OutValue>& outs) {
  const auto* list = f.entries.load(std::memory_order_acquire);
  const CacheEntry* hit = nullptr;
  std::vector<int64_t> slots;
  if (list)
    for (const CacheEntry* e : *list) {
      slots.assign(static_cast<size_t>(e->num_slots), 0);
      if (e->check(args, f.module_tensors, slots.data())) {
        hit = e;
        break;
      }
    }
  if (!dynamic::any_rank_missed(f.seeds.id, hit == nullptr)) {
    gstats().cache_hits.fetch_add(1, std::memory_order_relaxed);
    f.counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
    return run_entry(f, *hit, args, slots.data(), outs);
  }
  return miss(f, args, outs, /*force=*/true);
}

}  // namespace

namespace detail {

void report_graph_break(CompiledFunctionImpl& f, const capture::BreakInfo& b, const std::string& compile_id) {
  std::string text = b.text();
  {
    std::lock_guard<std::mutex> lock(f.breaks_mu);
    if (!f.break_sites.insert(text).second) return;
  }
  auto& st = gstats();
  st.graph_breaks.fetch_add(1, std::memory_order_relaxed);
  f.counters.graph_breaks.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> g(st.mu);
    st.graph_break_reasons[text]++;
  }
  if (observe::log_enabled(LogCat::GraphBreaks))
    observe::log_line(LogCat::GraphBreaks, compile_id.empty() ? std::to_string(f.frame_id) : compile_id,
                      fmt::format("Graph break in {}: {}", frame_desc(f), text));
  observe::trace_graph_break(f.frame_id, compile_id, b.reason, b.op, b.loc.file, b.loc.line, b.loc.function);
}

void learn_rejected(CompiledFunctionImpl& f, const capture::BreakInfo& b) {
  if (!b.learn) return;
  std::lock_guard<std::mutex> lock(f.learned_mu);
  const auto* cur = f.learned.load(std::memory_order_acquire);
  if (cur)
    for (const auto& r : *cur)
      if (r.op == b.learn->op && r.dtypes == b.learn->dtypes) return;
  auto next = std::make_unique<std::vector<capture::RejectedOp>>(cur ? *cur : std::vector<capture::RejectedOp>{});
  next->push_back(*b.learn);
  f.learned.store(next.get(), std::memory_order_release);
  f.learned_lists.push_back(std::move(next));
}

namespace {
/// Argument names are the guards' and the graph's sources, and a source names one input: a name given
/// twice, a name `args[k]` at another position than k (the default name of argument k), or a name
/// starting with `self.` (a module member's source) would make two inputs one and read the second as
/// the first. ValueError naming both positions.
void check_arg_names(const CompileOptions& o) {
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < o.arg_names.size(); ++i) {
    const std::string& n = o.arg_names[i];
    if (n.empty()) continue;
    if (auto [it, fresh] = seen.emplace(n, i); !fresh)
      throw ValueError(fmt::format("CompileOptions::arg_names of '{}': '{}' names arguments {} and {}; every argument "
                                   "needs a name of its own (its guards and graph input are found by it)",
                                   o.name, n, it->second, i));
    size_t k = 0;
    if (n.size() > 6 && n.rfind("args[", 0) == 0 && n.back() == ']' &&
        std::sscanf(n.c_str(), "args[%zu]", &k) == 1 && fmt::format("args[{}]", k) == n && k != i)
      throw ValueError(fmt::format("CompileOptions::arg_names of '{}': '{}' is the default name of argument {}, given to "
                                   "argument {}; choose another name",
                                   o.name, n, k, i));
    if (n.rfind("self.", 0) == 0)
      throw ValueError(fmt::format("CompileOptions::arg_names of '{}': '{}' (argument {}) starts with 'self.', which "
                                   "names the members of a compiled Module; choose another name",
                                   o.name, n, i));
  }
}
}  // namespace

CompiledFunctionImpl::CompiledFunctionImpl(CompileOptions o, Body b, std::shared_ptr<Module> m)
    : opts(std::move(o)), body(std::move(b)), module(std::move(m)) {
  // Checked here, when the function is compiled, rather than by the partitioner at the first
  // compile: a graph without backward nodes never reaches it, and the error should name the option.
  if (opts.memory_budget && !(*opts.memory_budget > 0 && *opts.memory_budget <= 1))
    throw ValueError(fmt::format("CompileOptions::memory_budget of '{}' is {}: it must lie in (0, 1] (the fraction of the "
                                 "bytes the backward reads that may stay saved); leave it unset for the min cut as it is",
                                 opts.name, *opts.memory_budget));
  bucket_policy = dynamic::resolve_bucket_policy(opts.buckets);  // bad text: ValueError now, not at the first dynamic compile
  check_arg_names(opts);
  if (opts.mode != "default" && opts.mode != "reduce-overhead" && opts.mode != "max-autotune")
    throw ValueError(fmt::format("CompileOptions::mode of '{}' is '{}': expected \"default\", \"reduce-overhead\" or "
                                 "\"max-autotune\"",
                                 opts.name, opts.mode));
  if (opts.backend == "auto") {
    // Resolved by the first compile (the inputs' device); until then the cpu backend's predicate.
    backend_auto = true;
    opts.async_compile = true;
    opts.backend = backend::auto_backend(kCPU);
  }
  op_support = backend::op_support(opts.backend);
  if (module) {
    module_slots = module->slots();
    for (const auto& [n, p] : module_slots.tensors) module_tensors.push_back(p);
  }
  frame_id = g_next_frame.fetch_add(1);
  std::vector<std::string> param_names;
  for (const auto& [n, p] : module_slots.tensors) param_names.push_back(n);
  seeds = dynamic::make_seeds(opts, param_names);
  verify_every = opts.verify_every;
  if (const char* v = std::getenv("PROTEAN_VERIFY"); v && *v) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0)
      throw ValueError(fmt::format("PROTEAN_VERIFY='{}': expected a call period (0 = off, 1 = every call, N = every Nth)", v));
    verify_every = static_cast<int>(n);
  }
  if (verify_every < 0) throw ValueError("CompileOptions::verify_every must be >= 0");
  gstats().frames.fetch_add(1, std::memory_order_relaxed);
}
CompiledFunctionImpl::~CompiledFunctionImpl() {
  if (!g_exiting.load()) flush_observed_ranges(*this);
  unregister_frame(this);
}

void CompiledFunctionImpl::clear(std::vector<std::shared_ptr<void>>& retired) {
  std::lock_guard<std::mutex> lock(compile_mu);
  // Calls running on other threads may still hold the entries and lists (dispatch reads them without
  // a lock): unpublish them here, free them after the grace period (core/reclaim.h).
  if (next_compile > 0 && opts.dynamic != Dynamic::Off && fold_observed_ranges(*this)) {
    try {
      dynamic::after_compile(seeds, opts.dynamic, frame_state, fmt::format("{}/{}", frame_id, next_compile - 1));
    } catch (const std::exception& e) {
      observe::warn(fmt::format("PGO: could not record the observed size ranges of {}: {}", opts.name, e.what()));
    }
  }
  entries.store(nullptr, std::memory_order_release);
  for (auto& l : lists) retired.emplace_back(std::move(l));
  for (auto& e : owned) retired.emplace_back(std::move(e));
  lists.clear();
  owned.clear();
  frame_state.clear();
  seeds.clear();
  next_compile = 0;
  clear_counters();
  limit_warned = false;
  eager_misses = false;
  last_reason.clear();
  verify_reported.clear();
  segmented.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> llk(learned_mu);
    learned.store(nullptr, std::memory_order_release);
    for (auto& l : learned_lists) retired.emplace_back(std::move(l));
    learned_lists.clear();
  }
  // Segment frames stay (they are registered frames: reset() clears their entries itself).
  {
    std::lock_guard<std::mutex> slk(segments_mu);
    reported_segments.clear();
  }
  std::lock_guard<std::mutex> blk(breaks_mu);
  break_sites.clear();
}

void CompiledFunctionImpl::clear_counters() {
  for (auto* c : {&counters.compiles, &counters.recompiles, &counters.cache_hits, &counters.cache_misses,
                  &counters.graph_breaks, &counters.guard_evaluations, &counters.eager_fallbacks,
                  &counters.verify_failures})
    c->store(0, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(reasons_mu);
  recompile_reasons.clear();
}

void register_frame(const std::shared_ptr<CompiledFunctionImpl>& f) {
  std::lock_guard<std::mutex> lock(g_frames_mu);
  frames()[f.get()] = f;
}
void unregister_frame(CompiledFunctionImpl* f) {
  std::lock_guard<std::mutex> lock(g_frames_mu);
  frames().erase(f);
}

std::shared_ptr<CompiledFunctionImpl> make_compiled(CompileOptions opts, Body body, std::shared_ptr<Module> module) {
  backend::check_backend(opts.backend);
  if (opts.recompile_limit < 1) throw ValueError("CompileOptions::recompile_limit must be >= 1");
  auto f = std::make_shared<CompiledFunctionImpl>(std::move(opts), std::move(body), std::move(module));
  register_frame(f);
  return f;
}

int compiled_frame_id(const CompiledFunctionImpl& impl) { return impl.frame_id; }

Stats compiled_stats(CompiledFunctionImpl& impl) {
  Stats r;
  auto add = [&r](CompiledFunctionImpl& f) {
    r.frames += 1;
    r.compiles += f.counters.compiles.load(std::memory_order_relaxed);
    r.recompiles += f.counters.recompiles.load(std::memory_order_relaxed);
    r.cache_hits += f.counters.cache_hits.load(std::memory_order_relaxed);
    r.cache_misses += f.counters.cache_misses.load(std::memory_order_relaxed);
    r.graph_breaks += f.counters.graph_breaks.load(std::memory_order_relaxed);
    r.guard_evaluations += f.counters.guard_evaluations.load(std::memory_order_relaxed);
    r.eager_fallbacks += f.counters.eager_fallbacks.load(std::memory_order_relaxed);
    r.verify_failures += f.counters.verify_failures.load(std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(f.reasons_mu);
    for (const auto& [reason, n] : f.recompile_reasons) r.recompile_reasons[reason] += n;
  };
  add(impl);
  std::vector<std::shared_ptr<CompiledFunctionImpl>> segs;
  {
    std::lock_guard<std::mutex> lock(impl.segments_mu);
    for (const auto& [key, seg] : impl.segments) segs.push_back(seg);
  }
  for (const auto& seg : segs) add(*seg);
  return r;
}

void throw_empty_compiled_function(const char* what) {
  throw RuntimeError(fmt::format("CompiledFunction::{}: this CompiledFunction is empty (default-constructed); assign "
                                 "the result of protean::compile(...) to it first",
                                 what));
}
std::vector<int> compiled_segment_frames(CompiledFunctionImpl& impl) {
  std::lock_guard<std::mutex> lock(impl.segments_mu);
  return impl.segment_frame_ids;
}
bool compiled_segmented(const CompiledFunctionImpl& impl) { return impl.segmented.load(std::memory_order_acquire); }
const CompileOptions& compiled_options(const CompiledFunctionImpl& impl) { return impl.opts; }

Action dispatch(CompiledFunctionImpl& f, std::span<const ArgValue> args, std::vector<OutValue>& outs) {
  // Everything this call reads from the frame's published lists (entries, artifacts, learned
  // rejections) stays alive until the call returns, even across a concurrent reset().
  core::ReadSection section;
  auto& st = gstats();
  if (g_stance.load(std::memory_order_relaxed) == Stance::ForceEager) {
    st.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    f.counters.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
    return Action::RunEager;
  }
  const bool segmented = f.segmented.load(std::memory_order_acquire);
  // Called while another function is traced, on that trace's tensors: the body is inlined into the
  // enclosing graph (as torch.compile inlines a compiled function called from a compiled one), on
  // every backend; its guards and breaks become the enclosing trace's. Inside a segmented body every
  // call is recorded inline into the caller's segment.
  if (const ops::TraceHook* h = ops::current_trace_hook(); h && (h->inlines_compiled_calls() || traced_args(args)))
    return Action::RunEager;
  if (segmented) {
    capture::run_segmented(f, args, outs);
    return Action::Ran;
  }
  if (f.seeds.collectives) return dispatch_collective(f, args, outs);
  const auto* list = f.entries.load(std::memory_order_acquire);
  if (list) {
    int64_t slots_buf[64];
    int64_t evaluated = 0;
    for (const CacheEntry* e : *list) {
      if (e->num_slots > 64) break;  // rare: handled on the slow path
      ++evaluated;
      if (e->check(args, f.module_tensors, slots_buf)) {
        st.guard_evaluations.fetch_add(evaluated, std::memory_order_relaxed);
        f.counters.guard_evaluations.fetch_add(evaluated, std::memory_order_relaxed);
        st.cache_hits.fetch_add(1, std::memory_order_relaxed);
        f.counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
        if (f.verify_every > 0 && !e->runs_user_function &&
            (f.verify_calls.fetch_add(1, std::memory_order_relaxed) + 1) % f.verify_every == 0 &&
            !verify_entry(f, *e, args)) {
          st.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
          f.counters.eager_fallbacks.fetch_add(1, std::memory_order_relaxed);
          return Action::RunEager;
        }
        return run_entry(f, *e, args, slots_buf, outs);
      }
    }
    st.guard_evaluations.fetch_add(evaluated, std::memory_order_relaxed);
    f.counters.guard_evaluations.fetch_add(evaluated, std::memory_order_relaxed);
  }
  return miss(f, args, outs);
}

}  // namespace detail

namespace detail {
/// Stats::region_compiles / region_hits (capture/region.cpp).
void count_region(bool compiled) {
  auto& s = gstats();
  (compiled ? s.region_compiles : s.region_hits).fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

// ---- public API -------------------------------------------------------------------------------------
Stats stats() {
  auto& s = gstats();
  Stats r;
  r.frames = s.frames.load();
  r.compiles = s.compiles.load();
  r.recompiles = s.recompiles.load();
  r.cache_hits = s.cache_hits.load();
  r.cache_misses = s.cache_misses.load();
  r.graph_breaks = s.graph_breaks.load();
  r.guard_evaluations = s.guard_evaluations.load();
  r.eager_fallbacks = s.eager_fallbacks.load();
  r.verify_failures = s.verify_failures.load();
  r.region_compiles = s.region_compiles.load();
  r.region_hits = s.region_hits.load();
  const backend::AsyncCompileStats as = backend::async_compile_stats();
  r.async_compiles = as.started;
  r.async_compile_failures = as.failed;
  r.async_fallback_runs = as.fallback_runs;
  const backend::GraphStats gs = backend::graph_stats();
  r.graph_recordings = gs.recordings;
  r.graph_replays = gs.replays;
  r.graph_patches = gs.patches;
  r.graph_buckets = gs.buckets;
  r.graph_plain_runs = gs.plain_runs;
  r.graph_buckets_per_frame = gs.buckets_per_frame;
  std::lock_guard<std::mutex> lock(s.mu);
  r.recompile_reasons = s.recompile_reasons;
  r.graph_break_reasons = s.graph_break_reasons;
  r.phase_seconds = s.phase_seconds;
  return r;
}

Stats& Stats::operator+=(const Stats& o) {
  for (auto [mine, theirs] : {std::pair{&frames, &o.frames}, {&compiles, &o.compiles}, {&recompiles, &o.recompiles},
                              {&cache_hits, &o.cache_hits}, {&cache_misses, &o.cache_misses},
                              {&graph_breaks, &o.graph_breaks}, {&guard_evaluations, &o.guard_evaluations},
                              {&eager_fallbacks, &o.eager_fallbacks}, {&verify_failures, &o.verify_failures},
                              {&async_compiles, &o.async_compiles}, {&async_compile_failures, &o.async_compile_failures},
                              {&async_fallback_runs, &o.async_fallback_runs}, {&region_compiles, &o.region_compiles},
                              {&region_hits, &o.region_hits}, {&graph_recordings, &o.graph_recordings},
                              {&graph_replays, &o.graph_replays}, {&graph_patches, &o.graph_patches},
                              {&graph_buckets, &o.graph_buckets}, {&graph_plain_runs, &o.graph_plain_runs}})
    *mine += *theirs;
  for (const auto& [k, v] : o.graph_buckets_per_frame) graph_buckets_per_frame[k] += v;
  for (const auto& [k, v] : o.recompile_reasons) recompile_reasons[k] += v;
  for (const auto& [k, v] : o.graph_break_reasons) graph_break_reasons[k] += v;
  for (const auto& [k, v] : o.phase_seconds) phase_seconds[k] += v;
  return *this;
}

std::string Stats::to_json() const {
  nlohmann::json j;
  j["frames"] = frames;
  j["compiles"] = compiles;
  j["recompiles"] = recompiles;
  j["cache_hits"] = cache_hits;
  j["cache_misses"] = cache_misses;
  j["graph_breaks"] = graph_breaks;
  j["guard_evaluations"] = guard_evaluations;
  j["eager_fallbacks"] = eager_fallbacks;
  j["verify_failures"] = verify_failures;
  j["async_compiles"] = async_compiles;
  j["async_compile_failures"] = async_compile_failures;
  j["async_fallback_runs"] = async_fallback_runs;
  j["region_compiles"] = region_compiles;
  j["region_hits"] = region_hits;
  j["graph_recordings"] = graph_recordings;
  j["graph_replays"] = graph_replays;
  j["graph_patches"] = graph_patches;
  j["graph_buckets"] = graph_buckets;
  j["graph_plain_runs"] = graph_plain_runs;
  j["graph_buckets_per_frame"] = graph_buckets_per_frame;
  j["recompile_reasons"] = recompile_reasons;
  j["graph_break_reasons"] = graph_break_reasons;
  j["phase_seconds"] = phase_seconds;
  return j.dump();
}

std::map<std::string, double> capture::phase_cpu_seconds() {
  auto& s = gstats();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.phase_cpu_seconds;
}

void reset() {
  if (!t_tracing.empty())
    throw CompileError(fmt::format("protean::reset() was called from the body of {} while it is being traced; "
                                   "reset() drops the cache entries that compile is building. Call it outside "
                                   "compiled functions",
                                   frame_desc(*t_tracing.back())));
  // Owning references first, then each frame cleared with no registry lock held: clear() waits for
  // the frame's compile_mu, and a compile holding it may create or destroy a frame (g_frames_mu).
  std::vector<std::shared_ptr<detail::CompiledFunctionImpl>> live;
  {
    std::lock_guard<std::mutex> lock(g_frames_mu);
    for (auto& [ptr, weak] : frames())
      if (auto f = weak.lock()) live.push_back(std::move(f));
  }
  std::vector<std::shared_ptr<void>> retired;
  for (auto& f : live) f->clear(retired);
  core::retire(std::move(retired));
  live.clear();  // may destroy a frame whose last other owner let go meanwhile (unregister_frame)
  auto& s = gstats();
  static_cast<GlobalCounters&>(s) = {};
  backend::reset_async_compile_stats();
  backend::reset_graph_stats();
  std::lock_guard<std::mutex> lock(s.mu);
  static_cast<GlobalMaps&>(s) = {};
}

void set_stance(Stance s) { g_stance.store(s, std::memory_order_relaxed); }
Stance stance() { return g_stance.load(std::memory_order_relaxed); }

}  // namespace protean
