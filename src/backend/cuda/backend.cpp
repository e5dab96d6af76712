// Backend `cuda`: installs the compile step the runner's factory (runner.h, compile_cuda) calls.
// compile_cuda_program renders the graph's CUDA C (no NVRTC); the cubin comes from the artifact
// cache (cache/blob_cache.h, kind "cubins", key = CubinKey::combined: source hash, NVRTC version,
// arch, flags, Protean version) or from NVRTC, then stored, so a second process compiles nothing.
// NVRTC compiles the unit as several parts on as many threads (nvrtc_compile_parts: entry points dealt
// by size, PROTEAN_CUDA_NVRTC_JOBS parts, default the hardware threads up to 8); the blob holds the
// parts' cubins (pack_cubins) and the runner loads one module per part. The architecture is the device's (sm_<major><minor>, sm_90 on an H100/H200).
// With CompileOptions::async_compile the NVRTC call runs on the compile worker (compile_cuda_async).
#include <fmt/format.h>

#include "backend/async_compile.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/nvrtc.h"
#include "backend/cuda/pipeline.h"
#include "backend/cuda/plan_cache.h"
#include "backend/cuda/runner.h"
#include "device/runtime.h"
#include "cache/blob_cache.h"
#include "cache/program_cache.h"
#include "observe/log.h"
#include "observe/phase_timer.h"

namespace protean::backend::cuda {

namespace {

/// NVRTC's target: the compute capability of the device the graph runs on (cuda:1 for a rank whose
/// model is there; a compile for it never touches cuda:0, whose primary context it would otherwise
/// create on that rank and make current on the compiling thread).
CudaCompileOptions options_for_device(const BackendInput& in) {
  CudaCompileOptions o;
  const ::protean::cuda::DeviceInfo& dev = ::protean::cuda::device_info(device_index(in));
  // sm_90a (the arch-specific target, cubins for 9.0 only) where the attention kernel's Hopper form is on
  o.nvrtc.arch = fmt::format("sm_{}{}{}", dev.cc_major, dev.cc_minor, attention_wants_sm90a(dev.cc_major, dev.cc_minor) ? "a" : "");
  o.compile = false;
  return o;
}

// The plan from the program cache (plan_cache.h) when a valid one is stored for this graph, else
// nullptr (a plan that does not decode is reported corrupt, then rendered again and replaced).
std::shared_ptr<CudaProgram> cached_plan(const BackendInput& in, const CudaPlanKey& key) {
  if (!key.cacheable) return nullptr;
  std::optional<std::string> bytes = cache::find_program(key.key, key.text);
  if (!bytes) return nullptr;
  try {
    auto p = std::make_shared<CudaProgram>(decode_cuda_plan(*bytes, in));
    cache::note_program_hit();
    return p;
  } catch (const std::exception& e) {
    cache::report_corrupt_program(key.key, e.what());
    return nullptr;
  }
}

// Renders the graph (no NVRTC), or takes its plan from the program cache, and fills the cubin's key
// parts. The pipeline's phases go to the trace as "cuda ..." spans of the compile (a warm start's
// backend phase, broken down; "cuda program cache" for the plan's lookup, decoding and storing).
std::shared_ptr<CudaProgram> render(const BackendInput& in, const CudaCompileOptions& o) {
  observe::PhaseTimer cache_phases;
  CudaPlanKey key;
  if (cache::program_cache_enabled()) key = cache_phases.time("cuda program cache", [&] { return cuda_plan_key(in, o.nvrtc.arch); });
  std::shared_ptr<CudaProgram> p = cache_phases.time("cuda program cache", [&] { return cached_plan(in, key); });
  const bool from_cache = p != nullptr;
  if (!p) {
    CudaCompileInfo ci;
    p = std::make_shared<CudaProgram>(compile_cuda_program(in, o, &ci));
    ci.phases.trace_spans(in.compile_id);
    if (key.cacheable)
      cache_phases.time("cuda program cache", [&] {
        if (std::optional<std::string> plan = encode_cuda_plan(*p, *in.graph))
          cache::store_program(key.key, key.text, *plan,
                               fmt::format("cuda graph {}: {} kernels, {} BLAS steps", p->name, p->kernels.size(), p->blas.size()));
        else if (observe::log_enabled(observe::LogCat::Cache))
          observe::log_line(observe::LogCat::Cache, in.compile_id,
                            "cuda plan not stored: the program has host steps or a constant lowering made that is larger "
                            "than the plan holds");
      });
  }
  cache_phases.trace_spans(in.compile_id);
  if (observe::log_enabled(observe::LogCat::Cache))
    observe::log_line(observe::LogCat::Cache, in.compile_id,
                      fmt::format("cuda plan {:016x}: {} ({:.2f} ms in the program cache)", key.key,
                                  !key.cacheable   ? "not cacheable (subgraphs, or the program cache is off)"
                                  : from_cache ? "from the program cache (lowering and rendering skipped)"
                                               : "rendered",
                                  1e3 * cache_phases.wall("cuda program cache")));
  if (p->kernels.empty()) return p;
  p->key = cubin_key(p->source, o.nvrtc);  // this process's NVRTC and flags, also for a plan another process stored
  return p;
}

std::string describe(const CudaProgram& p) {
  return fmt::format("nvrtc {} {} {}", p.key.nvrtc_version, p.key.arch, p.key.flags);
}

// The cubin's line (PROTEAN_LOGS=cache) and its span ("cuda nvrtc" when built, "cuda cubin cache
// read" when read: the program-cache read of a warm start).
void log_cubin(const BackendInput& in, const CudaProgram& p, bool built, const observe::PhaseTimer::Mark& m) {
  observe::PhaseTimer t;
  t.record(built ? "cuda nvrtc" : "cuda cubin cache read", m);
  t.trace_spans(in.compile_id);
  if (observe::log_enabled(observe::LogCat::Cache))
    observe::log_line(observe::LogCat::Cache, in.compile_id,
                      fmt::format("cuda cubin {:016x} ({} bytes, {}): {} in {:.1f} ms", p.key.combined(), p.cubin.size(),
                                  describe(p), built ? "compiled with NVRTC and stored" : "from the artifact cache",
                                  1e3 * t.phases().back().wall_s));
}

std::shared_ptr<const CudaProgram> compile_with_cache(const BackendInput& in) {
  const CudaCompileOptions o = options_for_device(in);
  std::shared_ptr<CudaProgram> p = render(in, o);
  if (p->kernels.empty()) return p;
  bool built = false;
  const observe::PhaseTimer::Mark m = observe::PhaseTimer::mark();
  auto blob = cache::get_or_build_blob("cubins", p->key.combined(), p->source, describe(*p), [&] {
    built = true;
    NvrtcResult r = nvrtc_compile_parts(p->source, fmt::format("{}.cu", p->name.empty() ? "graph" : p->name), o.nvrtc,
                                        nvrtc_default_jobs());
    p->compile_log = r.log;
    if (observe::log_enabled(observe::LogCat::Cache) && !r.parts.empty()) {
      // Where a cold start's NVRTC time goes: the parts run on threads, so the slowest bounds the whole.
      std::string parts;
      for (size_t i = 0; i < r.parts.size(); ++i) {
        const NvrtcResult::Part& part = r.parts[i];
        std::string names;
        for (const std::string& e : part.entries) names += (names.empty() ? "" : " ") + e;
        parts += fmt::format("\n  part {}: {:.0f} ms ({:.0f} ms of CPU), {} bytes, {} entries: {}", i + 1,
                             1e3 * part.seconds, 1e3 * part.cpu_seconds, part.source_bytes, part.entries.size(), names);
      }
      observe::log_line(observe::LogCat::Cache, in.compile_id,
                        fmt::format("cuda nvrtc of '{}': {} parts on as many threads, {:.0f} ms wall{}", p->name,
                                    r.parts.size(), 1e3 * r.seconds, parts));
    }
    for (CudaKernel& k : p->kernels) {
      if (auto it = r.resources.find(k.general.entry); it != r.resources.end()) k.general.resources = it->second;
      if (auto it = r.resources.find(k.aligned.entry); it != r.resources.end()) k.aligned.resources = it->second;
    }
    return std::move(r.cubin);
  });
  p->cubin = *blob;
  log_cubin(in, *p, built, m);
  return p;
}

// CompileOptions::async_compile: a graph whose cubin is already cached (or that has no kernels) gets
// its artifact at once; otherwise the interpreter runs the calls (each op's eager path: views on the
// device, other ops on host copies) while the compile worker runs NVRTC, then the cuda artifact
// takes over (async_compile.h).
std::unique_ptr<Artifact> compile_cuda_async(const BackendInput& in) {
  if (!::protean::cuda::driver()) return compile_cuda(in);  // the CompileError naming the missing driver
  std::shared_ptr<CudaProgram> p = render(in, options_for_device(in));
  if (p->kernels.empty()) return make_cuda_artifact(p, in, device_index(in));
  const observe::PhaseTimer::Mark m = observe::PhaseTimer::mark();
  if (auto blob = cache::find_blob("cubins", p->key.combined(), p->source)) {
    p->cubin = *blob;
    log_cubin(in, *p, false, m);
    return make_cuda_artifact(p, in, device_index(in));
  }
  auto job = [in]() -> std::unique_ptr<Artifact> { return make_cuda_artifact(compile_with_cache(in), in, device_index(in)); };
  return make_deferred_artifact(make_artifact("interp", in), std::move(job),
                                fmt::format("compile {} (backend cuda)", in.compile_id), in.compile_id);
}

const bool installed = [] {
  set_cuda_compiler(compile_with_cache);
  register_async_backend("cuda", compile_cuda_async);
  return true;
}();

}  // namespace

}  // namespace protean::backend::cuda
