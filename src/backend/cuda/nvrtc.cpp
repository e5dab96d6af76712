#include "backend/cuda/nvrtc.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <sstream>

namespace protean::backend::cuda {

namespace {

// The NVRTC C API (nvrtc.h), declared here so that no CUDA header is needed to build.
using nvrtcResult = int;  // NVRTC_SUCCESS = 0
using nvrtcProgram = struct _nvrtcProgram*;

/// The NVRTC functions Protean calls, looked up once.
struct Nvrtc {
  const char* (*GetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*Version)(int*, int*) = nullptr;
  nvrtcResult (*CreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) = nullptr;
  nvrtcResult (*DestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetProgramLog)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*GetCUBIN)(nvrtcProgram, char*) = nullptr;
  int major = 0, minor = 0;
  bool ok = false;
  std::string why;  ///< when !ok
};

template <class F>
bool bind(void* lib, const char* name, F& f, std::string& missing) {
  f = reinterpret_cast<F>(dlsym(lib, name));
  if (!f) missing += std::string(missing.empty() ? "" : ", ") + name;
  return f != nullptr;
}

const Nvrtc& nvrtc() {
  static const Nvrtc table = [] {
    Nvrtc t;
    std::vector<std::string> names;
    if (const char* p = std::getenv("PROTEAN_NVRTC"); p && *p) names.emplace_back(p);
    for (const char* n : {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so"})
      names.emplace_back(n);
    void* lib = nullptr;
    std::string tried, last_error;
    for (const std::string& n : names) {
      tried += (tried.empty() ? "" : ", ") + n;
      lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      if (const char* e = dlerror()) last_error = e;
    }
    if (!lib) {
      t.why = fmt::format("tried {} (last error: {}); install the CUDA toolkit's NVRTC or set PROTEAN_NVRTC to libnvrtc.so's path",
                          tried, last_error.empty() ? "none" : last_error);
      return t;
    }
    std::string missing;
    bind(lib, "nvrtcGetErrorString", t.GetErrorString, missing);
    bind(lib, "nvrtcVersion", t.Version, missing);
    bind(lib, "nvrtcCreateProgram", t.CreateProgram, missing);
    bind(lib, "nvrtcDestroyProgram", t.DestroyProgram, missing);
    bind(lib, "nvrtcCompileProgram", t.CompileProgram, missing);
    bind(lib, "nvrtcGetProgramLogSize", t.GetProgramLogSize, missing);
    bind(lib, "nvrtcGetProgramLog", t.GetProgramLog, missing);
    bind(lib, "nvrtcGetCUBINSize", t.GetCUBINSize, missing);
    bind(lib, "nvrtcGetCUBIN", t.GetCUBIN, missing);
    if (!missing.empty()) {
      t.why = fmt::format("the loaded libnvrtc lacks {} (a CUDA 11.1 or newer NVRTC is needed)", missing);
      return t;
    }
    if (t.Version(&t.major, &t.minor) != 0) {
      t.why = "nvrtcVersion failed";
      return t;
    }
    t.ok = true;
    return t;
  }();
  return table;
}

const Nvrtc& require() {
  const Nvrtc& t = nvrtc();
  if (!t.ok) throw CompileError("cuda backend: NVRTC not found: " + t.why);
  return t;
}

int to_int(const std::string& s) { return std::atoi(s.c_str()); }

/// The kernel whose definition holds 1-based line `line` of `source` ("" when none does).
std::string kernel_at_line(const std::string& source, int line) {
  std::istringstream in(source);
  std::string l, current;
  static const std::regex def(R"(__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\()");
  for (int n = 1; std::getline(in, l) && n <= line; ++n) {
    std::smatch m;
    if (std::regex_search(l, m, def)) current = m[1];
  }
  return current;
}

}  // namespace

bool nvrtc_available() { return nvrtc().ok; }
std::string nvrtc_unavailable_reason() { return nvrtc().ok ? "" : nvrtc().why; }

std::string nvrtc_version() {
  const Nvrtc& t = require();
  return fmt::format("{}.{}", t.major, t.minor);
}

std::vector<std::string> nvrtc_flags(const NvrtcOptions& o) {
  std::vector<std::string> f = {"--gpu-architecture=" + o.arch, "--std=c++17", "--fmad=false", "--ptxas-options=-v",
                                "-default-device"};
  f.insert(f.end(), o.extra.begin(), o.extra.end());
  return f;
}

std::map<std::string, PtxasInfo> parse_ptxas_info(const std::string& log) {
  std::map<std::string, PtxasInfo> r;
  static const std::regex entry(R"(Compiling entry function '([^']+)')");
  static const std::regex props(R"(Function properties for (\S+))");
  static const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex used(R"(Used (\d+) registers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  static const std::regex cmem(R"((\d+) bytes cmem\[0\])");
  std::istringstream in(log);
  std::string line, current;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, entry) || std::regex_search(line, m, props)) {
      current = m[1];
      continue;
    }
    if (current.empty()) continue;
    PtxasInfo& info = r[current];
    if (std::regex_search(line, m, frame)) {
      info.present = true;
      info.stack_bytes = to_int(m[1]);
      info.spill_stores = to_int(m[2]);
      info.spill_loads = to_int(m[3]);
    }
    if (std::regex_search(line, m, used)) {
      info.present = true;
      info.registers = to_int(m[1]);
      if (std::regex_search(line, m, smem)) info.shared_bytes = to_int(m[1]);
      if (std::regex_search(line, m, cmem)) info.constant_bytes = to_int(m[1]);
    }
  }
  for (auto it = r.begin(); it != r.end();) it = it->second.present ? std::next(it) : r.erase(it);
  return r;
}

NvrtcResult nvrtc_compile(const std::string& source, const std::string& name, const NvrtcOptions& o) {
  const Nvrtc& t = require();
  NvrtcResult res;
  nvrtcProgram prog = nullptr;
  if (nvrtcResult e = t.CreateProgram(&prog, source.c_str(), name.c_str(), 0, nullptr, nullptr); e != 0)
    throw CompileError(fmt::format("cuda backend: nvrtcCreateProgram failed for {}: {}", name, t.GetErrorString(e)));
  struct Destroy {
    const Nvrtc& t;
    nvrtcProgram& p;
    ~Destroy() { t.DestroyProgram(&p); }
  } destroy{t, prog};
  const std::vector<std::string> flags = nvrtc_flags(o);
  std::vector<const char*> argv;
  for (const std::string& f : flags) argv.push_back(f.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  const nvrtcResult rc = t.CompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  size_t log_size = 0;
  if (t.GetProgramLogSize(prog, &log_size) == 0 && log_size > 1) {
    res.log.resize(log_size);
    t.GetProgramLog(prog, res.log.data());
    while (!res.log.empty() && res.log.back() == '\0') res.log.pop_back();
  }
  if (rc != 0) {
    // the first error lines, and the kernel whose code holds the first error
    std::istringstream in(res.log);
    std::string line, first, kernel;
    int shown = 0;
    static const std::regex at(R"(\((\d+)\): (error|catastrophic error))");
    while (std::getline(in, line) && shown < 8) {
      std::smatch m;
      if (std::regex_search(line, m, at) || line.find("error") != std::string::npos) {
        if (kernel.empty() && m.size() > 1 && m[1].matched) kernel = kernel_at_line(source, to_int(m[1]));
        first += "\n  " + line;
        ++shown;
      }
    }
    if (first.empty()) first = "\n  " + res.log.substr(0, 2000);
    throw NvrtcCompileError(fmt::format("cuda backend: NVRTC failed to compile {} for {} ({}): {}{}", kernel.empty() ? name : "kernel '" + kernel + "' of " + name,
                                        o.arch, t.GetErrorString(rc), first,
                                        "\n(PROTEAN_LOGS=output_code prints the generated source)"),
                            res.log, kernel);
  }
  size_t size = 0;
  if (nvrtcResult e = t.GetCUBINSize(prog, &size); e != 0 || size == 0)
    throw CompileError(fmt::format("cuda backend: NVRTC produced no cubin for {} ({}): is '{}' a real architecture (sm_XX, "
                                   "not compute_XX)?",
                                   name, e ? t.GetErrorString(e) : "size 0", o.arch));
  res.cubin.resize(size);
  t.GetCUBIN(prog, reinterpret_cast<char*>(res.cubin.data()));
  res.resources = parse_ptxas_info(res.log);
  return res;
}

}  // namespace protean::backend::cuda
