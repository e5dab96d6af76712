// Backend `cuda`: installs the compile step the runner's factory (runner.h, compile_cuda) calls.
// compile_cuda_program renders the graph's CUDA C (no NVRTC); the cubin comes from the artifact
// cache (cache/blob_cache.h, kind "cubins", key = CubinKey::combined: source hash, NVRTC version,
// arch, flags, Protean version) or from one NVRTC call that is then stored, so a second process
// compiles nothing. The architecture is the device's (sm_<major><minor>, sm_90 on an H100/H200).
#include <fmt/format.h>
#include <xxhash.h>

#include "backend/cuda/nvrtc.h"
#include "backend/cuda/pipeline.h"
#include "backend/cuda/runner.h"
#include "device/runtime.h"
#include "cache/blob_cache.h"
#include "observe/log.h"
#include "protean/version.h"

namespace protean::backend::cuda {

namespace {

std::shared_ptr<const CudaProgram> compile_with_cache(const BackendInput& in) {
  CudaCompileOptions o;
  const ::protean::cuda::DeviceInfo& dev = ::protean::cuda::device_info(0);
  o.nvrtc.arch = fmt::format("sm_{}{}", dev.cc_major, dev.cc_minor);
  o.compile = false;
  auto p = std::make_shared<CudaProgram>(compile_cuda_program(in, o));
  if (p->kernels.empty()) return p;
  p->key.source_hash = XXH64(p->source.data(), p->source.size(), 0);
  p->key.nvrtc_version = nvrtc_version();
  p->key.arch = o.nvrtc.arch;
  for (const std::string& f : nvrtc_flags(o.nvrtc)) p->key.flags += (p->key.flags.empty() ? "" : " ") + f;
  p->key.protean_version = version();
  const std::string describe = fmt::format("nvrtc {} {} {}", p->key.nvrtc_version, p->key.arch, p->key.flags);
  bool built = false;
  auto blob = cache::get_or_build_blob("cubins", p->key.combined(), p->source, describe, [&] {
    built = true;
    NvrtcResult r = nvrtc_compile(p->source, fmt::format("{}.cu", p->name.empty() ? "graph" : p->name), o.nvrtc);
    p->compile_log = r.log;
    for (CudaKernel& k : p->kernels) {
      if (auto it = r.resources.find(k.general.entry); it != r.resources.end()) k.general.resources = it->second;
      if (auto it = r.resources.find(k.aligned.entry); it != r.resources.end()) k.aligned.resources = it->second;
    }
    return std::move(r.cubin);
  });
  p->cubin = *blob;
  if (observe::log_enabled(observe::LogCat::Cache))
    observe::log_line(observe::LogCat::Cache, in.compile_id,
                      fmt::format("cuda cubin {:016x} ({} bytes, {}): {}", p->key.combined(), p->cubin.size(), describe,
                                  built ? "compiled with NVRTC and stored" : "from the artifact cache"));
  return p;
}

const bool installed = [] {
  set_cuda_compiler(compile_with_cache);
  return true;
}();

}  // namespace

}  // namespace protean::backend::cuda
