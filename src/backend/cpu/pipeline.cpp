#include "backend/cpu/pipeline.h"

#include <fmt/format.h>

#include <xxhash.h>

#include <cstdlib>
#include <future>
#include <string_view>
#include <unordered_set>

#include "backend/async_compile.h"
#include "backend/cpu/codegen.h"
#include "backend/attention_pattern.h"
#include "backend/cpu/conv_layout.h"
#include "backend/cpu/fuse_post_ops.h"
#include "backend/cpu/gemm_weights.h"
#include "backend/cpu/kernel_dump.h"
#include "backend/cpu/program_plan.h"
#include "backend/cpu/runner.h"
#include "backend/cpu/toolchain.h"
#include "backend/kernel_symbols.h"
#include "cache/program_cache.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "loop/lower.h"
#include "loop/schedule.h"
#include "loop/verify.h"
#include "observe/log.h"
#include "observe/phase_timer.h"
#include "observe/trace.h"
#include "protean/error.h"
#include "sym/printer.h"

namespace protean::backend::cpu {

using namespace loop;  // the IR this file compiles

namespace {

/// PROTEAN_CPU_POST_OPS=0 turns post-op fusion off (read once; for comparisons and debugging).
bool post_op_fusion_enabled() {
  static const bool on = env_switch_on("PROTEAN_CPU_POST_OPS");
  return on;
}

/// PROTEAN_CPU_CONV_LAYOUT=0 keeps every convolution on NCHW (read once; for comparisons and debugging).
bool conv_layout_enabled() {
  static const bool on = env_switch_on("PROTEAN_CPU_CONV_LAYOUT");
  return on;
}

/// PROTEAN_CPU_PACKED_WEIGHTS=0 keeps every matmul weight in its plain layout (gemm_weights.h); read
/// at each compile (comparisons, tests).
bool packed_weights_enabled() { return env_switch_on("PROTEAN_CPU_PACKED_WEIGHTS"); }

/// PROTEAN_CPU_FUSED_ATTENTION=0 decomposes scaled_dot_product_attention (matmul, masked softmax,
/// matmul) instead of running the fused kernel (sdpa.h); read at each compile (for comparisons, tests).
bool fused_attention_enabled() { return env_switch_on("PROTEAN_CPU_FUSED_ATTENTION"); }

/// Logs a step's result under PROTEAN_LOGS=output_code; `text` is built only when that log is on.
template <class Text>
void log_step(const std::string& id, const std::string& what, Text&& text) {
  if (observe::log_enabled(observe::LogCat::OutputCode)) observe::log_line(observe::LogCat::OutputCode, id, what + ":\n" + text());
}

}  // namespace

namespace {
/// Step build, for each cond extern: every branch graph compiled through this same pipeline, with this
/// program's symbols (the runner passes their values on), so a branch is a program of its own.
/// A call_region's body is compiled once per distinct graph and shared by every use (the lowering
/// keeps the node's shared subgraph pointer; equal bodies under different pointers compare by value).
void compile_branches(Program& p, const BackendInput& in) {
  std::vector<std::pair<std::shared_ptr<const ir::Graph>, std::shared_ptr<const backend::Artifact>>> regions;
  for (Extern& e : p.externs)
    for (size_t k = e.branches.size(); k < e.subgraphs.size(); ++k) {
      if (e.op == ops::OpKind::call_region) {
        const auto& body = e.subgraphs[k];
        std::shared_ptr<const backend::Artifact> found;
        for (const auto& [g, a] : regions)
          if (g == body || ir::equal_graphs(*g, *body)) found = a;
        if (!found) {
          const ops::AttrValue* name = e.attrs.find("region");
          BackendInput sub{body, p.symbols,
                           fmt::format("{} (region {})", in.compile_id,
                                       name && std::holds_alternative<std::string>(*name) ? std::get<std::string>(*name) : body->name),
                           in.mode};
          found = compile_cpu(sub);
          regions.emplace_back(body, found);
        }
        e.branches.push_back(std::move(found));
        continue;
      }
      BackendInput sub{e.subgraphs[k], p.symbols, fmt::format("{} ({} branch)", in.compile_id, k == 0 ? "true" : "false"),
                       in.mode};
      e.branches.push_back(compile_cpu(sub));
    }
}

/// Whether compile_branches has anything to compile for `p`.
bool has_pending_branches(const Program& p) {
  for (const Extern& e : p.externs)
    if (e.branches.size() < e.subgraphs.size()) return true;
  return false;
}

/// Step post-op fusion (and conv layouts) on the backend's copy of the graph.
void graph_rewrites(ir::Graph& g, const BackendInput& in, CpuCompileInfo& ci) {
  // before post-op fusion, which would take the scores' scale into the first matmul
  if (fused_attention_enabled()) {
    ci.fused_attention = fuse_attention_patterns(g);
    if (ci.fused_attention)
      log_step(in.compile_id,
               fmt::format("cpu graph after attention fusion ({} matmul-softmax-matmul patterns became "
                           "scaled_dot_product_attention)", ci.fused_attention),
               [&] { return ir::print(g); });
  }
  if (post_op_fusion_enabled()) {
    FusePostOpsStats fs = fuse_post_ops(g);
    ci.fused_externs = fs.fused_calls;
    ci.fused_post_ops = fs.post_ops;
    ci.folded_links = fs.folded_links;
    if (fs.fused_calls || fs.folded_links)
      log_step(in.compile_id,
               fmt::format("cpu graph after post-op fusion ({} extern calls took {} post-ops, {} links folded into "
                           "constant weights, {} nodes replaced)",
                           fs.fused_calls, fs.post_ops, fs.folded_links, fs.nodes_removed),
               [&] { return ir::print(g); });
  }
  if (conv_layout_enabled()) {
    ConvLayoutStats ls = propagate_conv_layouts(g);
    ci.nhwc_values = ls.nhwc_values;
    if (ls.nhwc_values || ls.constant_weights)
      log_step(in.compile_id,
               fmt::format("cpu graph after conv layouts ({} values channels-last, {} of them in {} SE blocks, "
                           "{} in channels-last regions, {} convs with constant weights)",
                           ls.nhwc_values, 3 * ls.se_blocks, ls.se_blocks, ls.region_values, ls.constant_weights),
               [&] { return ir::print(g); });
  }
  if (packed_weights_enabled()) {
    GemmWeightStats ws = mark_gemm_weights(g);
    ci.packed_constant_weights = ws.constant_weights;
    ci.packed_reused_weights = ws.reused_weights;
    if (ws.constant_weights || ws.reused_weights)
      log_step(in.compile_id,
               fmt::format("cpu graph after packed matmul weights ({} constant, {} reused across calls)",
                           ws.constant_weights, ws.reused_weights),
               [&] { return ir::print(g); });
  }
}

/// Steps lower → schedule → codegen (the library is not built yet). The loop IR text
/// (CpuCompileInfo::loop_ir) is built only when `keep_text` asks for it or a log or the trace shows it.
/// `g`: the backend's own copy of the graph after graph_rewrites (the frame's graph, for reports and
/// the interpreter fallback, stays as captured).
Program generate(const BackendInput& in, const ir::Graph& g, CpuCompileInfo& ci, bool keep_text) {
  observe::TraceCompileScope trace_scope(in.compile_id);  // tags the artifact cache's events
  for (size_t i = 0; i < in.symbols.size(); ++i) {  // every entry becomes one runtime size argument
    const std::string graph = in.graph ? in.graph->name : "?";
    if (!in.symbols[i] || !in.symbols[i]->is_symbol())
      throw CompileError(fmt::format("cpu backend: size argument {} of graph '{}' is {}, not a size symbol", i, graph,
                                     in.symbols[i] ? "'" + sym::print(in.symbols[i]) + "'" : "missing"));
    for (size_t j = 0; j < i; ++j)
      if (in.symbols[j] == in.symbols[i])
        throw CompileError(fmt::format("cpu backend: size arguments {} and {} of graph '{}' are the same symbol {}", j, i,
                                       graph, sym::print(in.symbols[i])));
  }

  loop::LowerOptions lo;
  lo.fused_attention = fused_attention_enabled();  // scaled_dot_product_attention as the kernel of sdpa.h
  lo.cat_stages = true;  // a cat of many parts: a stage per part, not a select chain per element
  lo.split_views = true;  // split's parts read in place, not copied out of an extern's strided results
  lo.extern_views = true;  // GEMM operands that are permutes or slices of a buffer: strided views
  Program p = ci.phases.time("cpu lowering", [&] { return loop::lower_graph(g, kernel_symbols(in), lo); });
  if (observe::log_enabled(observe::LogCat::OutputCode, true))
    log_step(in.compile_id, "cpu loop IR after lowering", [&] { return to_text(p); });
  const bool verify = loop::verify_enabled();  // debug builds and tests (PROTEAN_LOOP_VERIFY=1)
  if (verify) loop::verify(p, "after lowering");

  ci.schedule = ci.phases.time("cpu scheduling", [&] {
    loop::ScheduleOptions so;
    so.extern_output_slot = extern_result_is_fresh;  // runner.h: the runner places their results in slots
    so.extern_results_into_copies = true;  // and writes a result copied whole into a temporary there
    loop::ScheduleStats st = loop::schedule_program(p, so);
    if (verify) loop::verify(p, "after fusion and buffer planning");
    // PROTEAN_CPU_MERGE_DIMS=0 (read per compile): loops keep the lowered dims.
    const char* merge_env = std::getenv("PROTEAN_CPU_MERGE_DIMS");
    if (!(merge_env && std::string_view(merge_env) == "0")) {
      loop::merge_contiguous_dims(p);
      if (verify) loop::verify(p, "after merging contiguous dims");
      loop::split_divided_dims(p);
      if (verify) loop::verify(p, "after splitting divided dims");
    }
    loop::apply_schedule(p, loop::CpuSchedulePolicy());
    if (verify) loop::verify(p, "after the cpu schedule policy, before rendering");
    return st;
  });
  if (keep_text || observe::trace_enabled() || observe::log_enabled(observe::LogCat::OutputCode)) ci.loop_ir = to_text(p);
  log_step(in.compile_id, "cpu loop IR after scheduling", [&] { return ci.loop_ir; });

  // PROTEAN_CPU_KERNEL_DEDUP=0 (read per compile): every kernel emitted with global buffer numbers.
  const char* dedup_env = std::getenv("PROTEAN_CPU_KERNEL_DEDUP");
  const bool dedup = !(dedup_env && std::string_view(dedup_env) == "0");
  DedupSource src = ci.phases.time("cpu codegen", [&] {
    return dedup ? generate_cpp_dedup(p) : DedupSource{generate_cpp(p), {}, p.kernels.size()};
  });
  ci.source = std::move(src.text);
  ci.kernel_buffers = std::move(src.kernel_buffers);
  ci.unique_kernels = static_cast<int>(src.unique_kernels);
  if (ci.unique_kernels < static_cast<int>(p.kernels.size()) && observe::log_enabled(observe::LogCat::OutputCode))
    observe::log_line(observe::LogCat::OutputCode, in.compile_id,
                      fmt::format("cpu kernel dedup: {} kernels, {} distinct bodies built", p.kernels.size(), ci.unique_kernels));
  if (kernel_dump_enabled()) dump_kernels(*in.graph, in.symbols, std::string(prelude()), generate_kernels(p));
  return p;
}

/// The names the library of `p` must export (a cached library without one is rebuilt).
std::vector<std::string> kernel_names(const Program& p) {
  std::vector<std::string> names;
  for (const Kernel& k : p.kernels) names.push_back(k.name);
  return names;
}

/// Step build (`lib`: an already cached library, else the artifact cache builds it) → CpuArtifact.
std::unique_ptr<CpuArtifact> finish(Program p, const BackendInput& in, CpuCompileInfo& ci,
                                    std::shared_ptr<const cache::Library> lib) {
  const bool tracing = observe::trace_enabled();
  // Tags the artifact cache's events; set again here because async_compile runs this on a worker thread.
  observe::TraceCompileScope trace_scope(in.compile_id);
  const observe::PhaseTimer::Mark build_start = observe::PhaseTimer::mark();
  // Region bodies and cond branches are programs with translation units of their own: they compile on
  // a second thread while this one builds the caller's library (the artifact cache builds different
  // keys concurrently, one build per hardware thread at most), so a regional compile costs
  // about the longer of the two compiler runs, not their sum. Only p.externs changes over there; what
  // the build reads of p is taken before.
  const std::vector<std::string> names = kernel_names(p);
  const bool large = large_program(p);
  std::future<void> branches;
  if (has_pending_branches(p))
    branches = std::async(std::launch::async, [&p, &in] {
      observe::TraceCompileScope branch_scope(in.compile_id);
      compile_branches(p, in);
    });
  if (lib) {
    ci.library_from_cache = true;
    ci.library_path = lib->path;
  } else if (!p.kernels.empty()) {
    const uint64_t before = cache::thread_kernel_misses();
    lib = build_library(ci.source, names, large);
    ci.library_from_cache = cache::thread_kernel_misses() == before;
    ci.library_path = lib->path;
  } else {
    ci.library_from_cache = true;
  }
  if (branches.valid()) branches.get();  // rethrows a body's CompileError here
  ci.phases.record("cpu cxx_compile", build_start);
  ci.fuse_ms = ci.phases.wall("cpu post-op fusion") * 1e3;
  ci.lower_ms = ci.phases.wall("cpu lowering") * 1e3;
  ci.schedule_ms = ci.phases.wall("cpu scheduling") * 1e3;
  ci.codegen_ms = ci.phases.wall("cpu codegen") * 1e3;
  ci.build_ms = ci.phases.wall("cpu cxx_compile") * 1e3;
  ci.kernels = static_cast<int>(p.kernels.size());
  ci.externs = static_cast<int>(p.externs.size());
  if (tracing) {
    ci.phases.trace_spans(in.compile_id);
    observe::trace_artifact(in.compile_id, "loop_ir", "loop IR after scheduling", "", ci.loop_ir);
    std::string cpp_path;
    if (!ci.library_path.empty() && ci.library_path.size() > 3) cpp_path = ci.library_path.substr(0, ci.library_path.size() - 3) + ".cpp";
    observe::trace_artifact(in.compile_id, "cpp_source", p.kernels.empty() ? "no kernels (extern calls only)" : "kernel translation unit",
                   cpp_path, ci.source);
  }
  log_step(in.compile_id, "cpu output code", [&] {
    return fmt::format("// library: {} ({})\n{}", ci.library_path.empty() ? "none" : ci.library_path,
                       ci.library_from_cache ? "cached" : "compiled", generate_kernels(p));
  });
  if (observe::log_enabled(observe::LogCat::Cache))
    observe::log_line(observe::LogCat::Cache, in.compile_id,
                      fmt::format("cpu artifact {} ({} kernels, {} externs): {}", ci.library_path, ci.kernels, ci.externs,
                                  ci.library_from_cache ? "hit" : "miss, compiled"));
  return std::make_unique<CpuArtifact>(std::move(p), in.symbols.size(), std::move(lib), in.runtime_asserts,
                                       ci.kernel_buffers);
}
}  // namespace

namespace {
/// Steps lower → schedule → codegen, or their result from the program cache (cache/program_cache.h):
/// a valid plan for this post-pass graph replaces all three; otherwise they run and their plan is
/// stored. A plan that does not decode or fit is reported corrupt and replaced.
Program generate_or_load(const BackendInput& in, CpuCompileInfo& ci, bool keep_text) {
  PlanKey key;
  // Off under PROTEAN_KERNEL_DUMP_DIR: a dump needs the kernels generated (scripts/kernel_replay.sh).
  if (cache::program_cache_enabled() && !kernel_dump_enabled())
    key = ci.phases.time("cpu program cache", [&] { return plan_key(in); });
  ir::Graph g = *in.graph;
  ci.phases.time("cpu post-op fusion", [&] { graph_rewrites(g, in, ci); });
  if (key.cacheable) {
    std::optional<Program> loaded = ci.phases.time("cpu program cache", [&]() -> std::optional<Program> {
      std::optional<std::string> bytes = cache::find_program(key.key, key.text);
      if (!bytes) return std::nullopt;
      try {
        Plan plan = decode_plan(*bytes, in, g);
        ci.source = std::move(plan.source);
        ci.kernel_buffers = std::move(plan.kernel_buffers);
        ci.unique_kernels = plan.unique_kernels;
        ci.schedule = plan.schedule;
        cache::note_program_hit();
        return std::move(plan.program);
      } catch (const std::exception& e) {
        cache::report_corrupt_program(key.key, e.what());
        return std::nullopt;
      }
    });
    if (loaded) {
      ci.program_from_cache = true;
      if (keep_text || observe::trace_enabled() || observe::log_enabled(observe::LogCat::OutputCode))
        ci.loop_ir = to_text(*loaded);
      log_step(in.compile_id, "cpu program from the program cache (lowering and codegen skipped)",
               [&] { return ci.loop_ir; });
      if (ci.unique_kernels < static_cast<int>(loaded->kernels.size()) && observe::log_enabled(observe::LogCat::OutputCode))
        observe::log_line(observe::LogCat::OutputCode, in.compile_id,
                          fmt::format("cpu kernel dedup: {} kernels, {} distinct bodies built", loaded->kernels.size(),
                                      ci.unique_kernels));
      return std::move(*loaded);
    }
  }
  Program p = generate(in, g, ci, keep_text);
  if (key.cacheable)
    ci.phases.time("cpu program cache", [&] {
      cache::store_program(key.key, key.text, encode_plan(p, g, ci.source, ci.kernel_buffers, ci.unique_kernels, ci.schedule),
                           fmt::format("graph {}: {} kernels, {} externs", in.graph->name, p.kernels.size(), p.externs.size()));
    });
  return p;
}
}  // namespace

std::unique_ptr<CpuArtifact> compile_cpu(const BackendInput& in, CpuCompileInfo* info) {
  CpuCompileInfo local;
  CpuCompileInfo& ci = info ? *info : local;
  Program p = generate_or_load(in, ci, info != nullptr);
  return finish(std::move(p), in, ci, nullptr);
}

std::unique_ptr<Artifact> compile_cpu_async(const BackendInput& in) {
  CpuCompileInfo ci;
  Program p = generate_or_load(in, ci, false);
  std::shared_ptr<const cache::Library> lib;
  if (!p.kernels.empty()) {
    lib = cache::find_cached(artifact_key(ci.source, large_program(p)), ci.source, kernel_names(p));
    if (!lib) {
      auto job = [p = std::move(p), in, ci]() mutable -> std::unique_ptr<Artifact> {
        return finish(std::move(p), in, ci, nullptr);
      };
      return make_deferred_artifact(make_artifact("interp", in), std::move(job),
                                    fmt::format("compile {} (backend cpu)", in.compile_id), in.compile_id);
    }
  }
  return finish(std::move(p), in, ci, std::move(lib));
}

namespace {
const bool registered = [] {
  register_backend("cpu", [](const BackendInput& in) -> std::unique_ptr<Artifact> { return compile_cpu(in); });
  register_async_backend("cpu", compile_cpu_async);
  return true;
}();
}  // namespace

}  // namespace protean::backend::cpu
