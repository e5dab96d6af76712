#include "capture/compile.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/async_compile.h"
#include "backend/registry.h"
#include "capture/tracer.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
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
  if (observe::log_enabled(LogCat::Guards)) observe::log_line(LogCat::Guards, compile_id, entry->guards_text);

  // ---- graph passes ----
  ir::PassOptions popts;
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
