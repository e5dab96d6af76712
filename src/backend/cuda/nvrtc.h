// NVRTC toolchain: CUDA C → cubin at run time, with libnvrtc loaded by dlopen so that Protean builds,
// links and runs its CPU paths on machines without CUDA.
//
// Library search (first that loads): $PROTEAN_NVRTC (a path), libnvrtc.so.13, libnvrtc.so,
// /usr/local/cuda/lib64/libnvrtc.so.13, /usr/local/cuda/lib64/libnvrtc.so. Every NVRTC function used
// is looked up once into a small table (Nvrtc); a library lacking one counts as absent.
//
// Compile: one translation unit per call, options
//   --gpu-architecture=<arch> (sm_90 by default) --std=c++17 --fmad=false --ptxas-options=-v
//   -default-device --extra-device-vectorization
// (--fmad=false: multiply-adds are not contracted, as in the cpu backend's -ffp-contract=off; the
// generated code writes the fused multiply-adds it wants as fmaf). The ptxas report of every entry
// point is parsed from the log (parse_ptxas_info).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/cuda/program.h"
#include "device/driver.h"
#include "protean/error.h"

namespace protean::backend::cuda {

/// NVRTC failed to compile a translation unit. what() names the kernel whose code holds the first
/// error (or the translation unit), the architecture and the first error lines of the log; log() is
/// the whole log.
class NvrtcCompileError : public CompileError {
 public:
  NvrtcCompileError(std::string message, std::string log, std::string kernel)
      : CompileError(std::move(message)), log_(std::move(log)), kernel_(std::move(kernel)) {}
  const std::string& log() const { return log_; }
  const std::string& kernel() const { return kernel_; }

 private:
  std::string log_;
  std::string kernel_;
};

/// True when libnvrtc could be loaded (see the search order above). Never throws.
bool nvrtc_available();
/// Why NVRTC is unavailable ("" when it is available): the names tried and dlerror()'s last answer.
std::string nvrtc_unavailable_reason();
/// "major.minor" of the loaded NVRTC. Throws CompileError ("NVRTC not found: ...") when absent.
std::string nvrtc_version();

struct NvrtcOptions {
  std::string arch = "sm_90";      ///< --gpu-architecture (sm_90, sm_90a, sm_100, ...)
  std::vector<std::string> extra;  ///< more options, appended
};

/// The option list a compile with `o` passes to NVRTC (also part of the cubin's cache key).
std::vector<std::string> nvrtc_flags(const NvrtcOptions& o);

/// The artifact cache key of the cubin of `source` compiled with `o` by this process's NVRTC: the
/// source's xxhash64, the NVRTC version, the arch, the flags (nvrtc_flags) and Protean's version.
/// Throws CompileError as nvrtc_version when NVRTC is absent.
CubinKey cubin_key(const std::string& source, const NvrtcOptions& o);

struct NvrtcResult {
  std::vector<uint8_t> cubin;
  std::string log;                            ///< NVRTC's program log (ptxas -v lines included)
  std::map<std::string, PtxasInfo> resources;  ///< per entry point, parsed from the log
  double seconds = 0;                         ///< wall time of nvrtcCompileProgram
  /// nvrtc_compile_parts: per part, its entry points, its text's bytes and its compile's wall seconds
  /// (the cold start's NVRTC time per kernel group; the slowest part bounds the whole).
  struct Part {
    std::vector<std::string> entries;
    size_t source_bytes = 0;
    double seconds = 0;
    double cpu_seconds = 0;  ///< CPU seconds of the thread that compiled it (unaffected by waiting for a core)
  };
  std::vector<Part> parts;
};

/// Compiles `source` (named `name` in messages and the log, e.g. "graph_3.cu") to a cubin.
/// Throws CompileError ("NVRTC not found: ...") when libnvrtc is absent and NvrtcCompileError when
/// compilation fails.
NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, const NvrtcOptions& o = {});

/// Compiles a translation unit as render_cuda writes it (the prelude, then `extern "C"` entry points
/// that call nothing outside the prelude) as up to `jobs` translation units on as many threads: the
/// entry points are dealt to the parts by size, each part gets the text before the first entry and
/// every `#ifndef PT_...` definition block. NVRTC time is then about the largest part's instead of
/// the sum. `cubin` is the parts' cubins in one container (pack_cubins); `resources` and `log` are
/// the parts' together; `seconds` is the wall time. jobs <= 1, or a single entry, compiles once.
/// Throws as nvrtc_compile (the first failing part's error).
NvrtcResult nvrtc_compile_parts(const std::string& source, const std::string& name, const NvrtcOptions& o, int jobs);
/// The name of the entry point whose `extern "C" __global__ void` declaration starts at `at` in
/// `source`: the identifier before the parameter list, past any attribute written as a call between
/// `void` and the name (`__launch_bounds__(128, 4)`, `PT_CLUSTER_DIMS(2)`). Empty when there is none.
std::string entry_name_at(const std::string& source, size_t at);
/// The parallel compile's default part count: PROTEAN_CUDA_NVRTC_JOBS when set (1 turns splitting
/// off), else the hardware threads, at most 8. Measured on a 16-core host (GPT-2 small, two cold
/// compiles, alternating): 16 parts took 374-444 ms of NVRTC wall per compile against 265-285 ms for
/// 8 (each part parses the prelude again); only a process's very first compile after boot was faster
/// with 16 (638 against 976 ms).
int nvrtc_default_jobs();

/// Several cubins as one blob (the artifact cache stores one blob per translation unit): the magic
/// "PTCUBINS", the count (u32), then per cubin its size (u64) and bytes, then its entry points'
/// names (u64 length, names separated by '\n'), each field starting at a multiple of 16 bytes. A
/// single cubin is stored as it is.
std::vector<uint8_t> pack_cubins(const std::vector<std::vector<uint8_t>>& cubins,
                                 const std::vector<std::vector<std::string>>& entries = {});
/// One cubin of a blob: a view into it, and the entry points it holds (empty: a lone cubin, which holds
/// every entry).
struct CubinPart {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::vector<std::string> entries;
};
/// The cubins of a blob from pack_cubins; a blob without the magic is one cubin. Throws CompileError
/// for a truncated container.
std::vector<CubinPart> unpack_cubins(const std::vector<uint8_t>& blob);

/// The modules of a blob from pack_cubins: one per cubin, and the module that holds each entry point
/// its part lists.
struct CubinModules {
  std::vector<::protean::cuda::CUmodule> modules;
  std::map<std::string, ::protean::cuda::CUmodule> module_of;
  std::string what;  ///< the blob, as load() was told

  /// Loads every cubin of `blob` (cuModuleLoadData) and appends its module. `what` names the blob in
  /// the driver error a failed load throws (CudaError) and in function()'s errors.
  void load(const ::protean::cuda::DriverApi& api, const std::vector<uint8_t>& blob, const std::string& what);
  /// The entry point `entry`, from the module whose part lists it (a blob of one cubin holds every
  /// entry). Throws CompileError naming `what` when no module holds it, CudaError when the driver
  /// does not find it there.
  ::protean::cuda::CUfunction function(const ::protean::cuda::DriverApi& api, const std::string& entry) const;
};

/// The ptxas `-v` report in `log`, per entry point: "Compiling entry function 'k' for 'sm_90'",
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads", "Used N registers, ... N bytes
/// smem, N bytes cmem[0]". Entry points without a report are absent from the map.
std::map<std::string, PtxasInfo> parse_ptxas_info(const std::string& log);

}  // namespace protean::backend::cuda
