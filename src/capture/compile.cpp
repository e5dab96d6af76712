#include "capture/compile.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/async_compile.h"
#include "backend/registry.h"
#include "capture/tracer.h"
#include "dynamic/buckets.h"
#include "dynamic/policy.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
#include "sym/printer.h"
#include "observe/compile_trace.h"
#include "observe/log.h"
#include "observe/trace.h"

namespace protean::capture {

using observe::LogCat;

namespace {

/// The `graph` and `guards` events of a finished compile, and its compilation_metrics.
void trace_success(const detail::CompiledFunctionImpl& f, const std::string& compile_id, const CacheEntry& entry,
                   const observe::PhaseTimer& phases, const ir::PassTimings& timings) {
  const ir::Graph& g = *entry.graph;
  nlohmann::json inputs = nlohmann::json::array();
  for (ir::ValueId v : g.inputs()) {
    const ir::Value& val = g.value(v);
    nlohmann::json sizes = nlohmann::json::array();
    for (const auto& sz : val.sizes) sizes.push_back(sz.str());
    inputs.push_back({{"source", g.producer(v).source}, {"dtype", std::string(short_name(val.dtype))}, {"sizes", sizes}});
  }
  std::string ops;
  auto add_ops = [&ops](const ir::Graph& x) {
    for (const auto& n : x.nodes())
      if (n.kind == ir::NodeKind::Call) ops += std::string(ops::op_name(n.op)) + ";";
  };
  add_ops(g);
  ir::for_each_subgraph(g, [&](const ir::Graph& sub) {  // cond branches
    ops += "{";
    add_ops(sub);
    ops += "}";
  });
  observe::trace_compiled_graph(compile_id, ir::print(g), static_cast<int64_t>(g.num_calls()),
                                fmt::format("{:016x}", std::hash<std::string>{}(ops)), inputs);
  const int64_t guard_count = observe::trace_guards(compile_id, entry.guards_text);
  nlohmann::json m = {{"capture", phases.wall("capture")}, {"backend", phases.wall("backend")}};
  for (const auto& [step, secs] : timings) m["pass:" + std::string(step)] = secs;
  phases.trace_spans(compile_id);
  observe::trace_compile_end(compile_id, f.frame_id, f.opts.name, "success", "", m, guard_count,
                             static_cast<int64_t>(g.num_calls()));
}

/// Each symbol's known range (mark_dynamic min/max first, then the PGO profile's range of its source)
/// and the bucket policy in force, for the backend (BackendInput::buckets). Logged under
/// PROTEAN_LOGS=graphs, one line per symbol.
backend::BackendInput::Buckets symbol_buckets(const detail::CompiledFunctionImpl& f, const CacheEntry& e,
                                              std::span<const detail::ArgValue> args, const std::string& compile_id) {
  backend::BackendInput::Buckets b;
  const dynamic::BucketPolicy& policy = f.bucket_policy;
  b.policy = policy.str();
  const bool log = observe::log_enabled(LogCat::Graphs);
  std::string lines;  // computed only when logged
  for (size_t i = 0; i < e.symbols.size() && i < e.symbol_slots.size(); ++i) {
    backend::BackendInput::SymbolRange r;
    const int32_t slot = e.symbol_slots[i];
    for (const TensorGuard& g : e.tensors) {
      size_t d = 0;
      while (d < g.slots.size() && g.slots[d] != slot) ++d;
      if (d == g.slots.size()) continue;
      if (const Tensor* t = resolve_input(g.ref, args, f.module_tensors); t && t->defined()) {
        const auto marks = dynamic::marks_of(t->impl());
        if (d < marks.size() && (marks[d].min || marks[d].max)) {
          r.min = marks[d].min.value_or(0);
          r.max = marks[d].max.value_or(INT64_MAX);
          r.why = "mark";
        }
      }
      if (r.why == "unknown" && f.seeds.pgo) {
        auto it = f.seeds.pgo->sources.find(g.source);
        if (it != f.seeds.pgo->sources.end() && d < it->second.size_range.size() &&
            it->second.size_range[d].first <= it->second.size_range[d].second) {
          r.min = it->second.size_range[d].first;
          r.max = it->second.size_range[d].second;
          r.why = "pgo";
        }
      }
      break;
    }
    if (log)
      lines += "\n    " + dynamic::describe_buckets(sym::print(e.symbols[i]), policy, {r.min, r.max, r.why});
    b.ranges.push_back(std::move(r));
  }
  if (log && !lines.empty()) observe::log_line(LogCat::Graphs, compile_id, "size buckets of " + f.opts.name + ":" + lines);
  if (f.opts.mode == "reduce-overhead" && observe::trace_enabled()) {  // the report shows them under the compile
    std::string text;
    for (size_t i = 0; i < b.ranges.size(); ++i)
      text += dynamic::describe_buckets(sym::print(e.symbols[i]), policy, {b.ranges[i].min, b.ranges[i].max, b.ranges[i].why}) +
              "\n";
    observe::trace_artifact(compile_id, "size_buckets", "buckets", "", text);
  }
  return b;
}

}  // namespace

CompileOutcome compile_entry(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                             const std::string& compile_id, int compile_index) {
  CompileOutcome out;
  const bool tracing = observe::trace_enabled();

  // ---- capture ----
  const observe::PhaseTimer::Mark capture_start = observe::PhaseTimer::mark();
  auto capture_s = [&] { return observe::PhaseTimer::mark().wall0 - capture_start.wall0; };
  std::unique_ptr<CacheEntry> entry;
  try {
    entry = out.phases.time("capture", [&] { return trace_frame(f, args, compile_id); });
  } catch (const GraphBreakError& e) {
    if (tracing) observe::trace_compile_end(compile_id, f.frame_id, f.opts.name, "graph_break", "", {{"capture", capture_s()}}, 0, 0);
    // A rejection found by this trace is asked again with the actual sizes by segmented execution,
    // so the frame does not learn it (a segment frame's parent does: take_break).
    out.graph_break = e.info;
    if (!f.is_segment) out.graph_break->learn.reset();
    return out;
  } catch (const CompileError& e) {
    if (tracing) observe::trace_compile_end(compile_id, f.frame_id, f.opts.name, "error", e.what(), {{"capture", capture_s()}}, 0, 0);
    throw;
  }
  entry->compile_index = compile_index;
  entry->init_ranges();
  if (observe::log_enabled(LogCat::Guards)) observe::log_line(LogCat::Guards, compile_id, entry->guards_text);

  // Each symbol's known range (a mark's bounds, else the PGO profile's observed ones): the backend's
  // buckets, and the sizes the partitioner weighs saved values at (its largest known value).
  backend::BackendInput::Buckets buckets;
  if (!entry->symbols.empty()) buckets = symbol_buckets(f, *entry, args, compile_id);

  // ---- graph passes ----
  ir::PassOptions popts;
  popts.partition_options.memory_budget = f.opts.memory_budget;
  popts.runtime_asserts = &entry->runtime_asserts;  // a rewrite that holds under a bound checks it per call
  for (size_t i = 0; i < buckets.ranges.size() && i < entry->symbols.size(); ++i)
    if (buckets.ranges[i].why != "unknown" && buckets.ranges[i].max < INT64_MAX && entry->symbols[i]->is_symbol())
      popts.partition_options.size_at[entry->symbols[i]->name] = buckets.ranges[i].max;
#ifndef NDEBUG
  popts.verify = true;
#endif
  if (observe::log_enabled(LogCat::OutputCode))
    popts.on_step = [&](std::string_view step, const ir::Graph& g) {
      observe::log_line(LogCat::OutputCode, compile_id, fmt::format("TRACED GRAPH after {}\n{}", step, ir::print(g)));
    };
  const ir::PassTimings timings = out.phases.time("passes", [&] { return ir::run_passes(*entry->graph, popts); });

  // ---- backend ----
  const observe::PhaseTimer::Mark backend_start = observe::PhaseTimer::mark();
  backend::BackendInput bin{entry->graph, entry->symbols, compile_id, f.opts.mode, entry->runtime_asserts, entry->upper_bounds};
  bin.buckets = std::move(buckets);
  for (const TensorGuard& g : entry->tensors)
    if (!g.undefined && g.device.type != DeviceType::CPU) {
      bin.device = g.device;
      break;
    }
  try {
    entry->artifact = out.phases.time("backend", [&] {
      return f.opts.async_compile ? backend::make_artifact_async(f.opts.backend, bin) : backend::make_artifact(f.opts.backend, bin);
    });
  } catch (const backend::UnsupportedOpError& e) {
    // A lowering that rejects an op late: the same graph break as a rejection by the backend's
    // predicate, at the node's user line; the frame learns the op (kind and input dtypes).
    if (tracing)
      observe::trace_compile_end(compile_id, f.frame_id, f.opts.name, "graph_break", "",
                                 {{"backend", observe::PhaseTimer::mark().wall0 - backend_start.wall0}}, 0, 0);
    BreakInfo b = rejected_op_break(f.opts.backend, e.call, e.why, {e.loc.file, e.loc.line, e.loc.function});
    b.learn = RejectedOp{e.op, e.dtypes, e.why};
    out.graph_break = std::move(b);
    return out;
  }
  entry->runs_user_function = entry->artifact->runs_user_function();
  if (tracing) trace_success(f, compile_id, *entry, out.phases, timings);
  out.entry = std::move(entry);
  return out;
}

}  // namespace protean::capture
