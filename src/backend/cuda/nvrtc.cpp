#include "backend/cuda/nvrtc.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <chrono>
#include <exception>
#include <cctype>
#include <cstring>
#include <algorithm>
#include <thread>
#include <tuple>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "device/dynamic_library.h"
#include "observe/env.h"
#include "observe/phase_timer.h"
#include "protean/version.h"

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

const Nvrtc& nvrtc() {
  static const Nvrtc table = [] {
    Nvrtc t;
    std::vector<std::string> names;
    if (const char* p = std::getenv("PROTEAN_NVRTC"); p && *p) names.emplace_back(p);
    for (const char* n : {"libnvrtc.so.13", "libnvrtc.so", "/usr/local/cuda/lib64/libnvrtc.so.13", "/usr/local/cuda/lib64/libnvrtc.so"})
      names.emplace_back(n);
    std::string tried, last_error;
    for (const std::string& n : names) tried += (tried.empty() ? "" : ", ") + n;
    void* lib = ::protean::cuda::open_first_library(names, last_error);
    if (!lib) {
      t.why = fmt::format("tried {} (last error: {}); install the CUDA toolkit's NVRTC or set PROTEAN_NVRTC to libnvrtc.so's path",
                          tried, last_error.empty() ? "none" : last_error);
      return t;
    }
    std::string missing;
    ::protean::cuda::resolve_symbol(lib, t.GetErrorString, {"nvrtcGetErrorString"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.Version, {"nvrtcVersion"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.CreateProgram, {"nvrtcCreateProgram"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.DestroyProgram, {"nvrtcDestroyProgram"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.CompileProgram, {"nvrtcCompileProgram"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.GetProgramLogSize, {"nvrtcGetProgramLogSize"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.GetProgramLog, {"nvrtcGetProgramLog"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.GetCUBINSize, {"nvrtcGetCUBINSize"}, missing);
    ::protean::cuda::resolve_symbol(lib, t.GetCUBIN, {"nvrtcGetCUBIN"}, missing);
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
  static const std::regex def(R"(__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(?:PT_CLUSTER_DIMS\([^)]*\)\s+)?(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\()");
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

CubinKey cubin_key(const std::string& source, const NvrtcOptions& o) {
  CubinKey key;
  key.source_hash = XXH64(source.data(), source.size(), 0);
  key.nvrtc_version = nvrtc_version();
  key.arch = o.arch;
  for (const std::string& f : nvrtc_flags(o)) key.flags += (key.flags.empty() ? "" : " ") + f;
  key.protean_version = version();
  return key;
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

std::string entry_name_at(const std::string& source, size_t at) {
  size_t from = source.find(" void ", at);
  if (from == std::string::npos) return {};
  from += 6;
  // attributes written as calls (`__launch_bounds__(...) `, `PT_CLUSTER_DIMS(n) `) come before the name:
  // an identifier followed by '(' whose closing ')' is followed by a space and another identifier
  for (;;) {
    while (from < source.size() && source[from] == ' ') ++from;
    const size_t open = source.find('(', from);
    if (open == std::string::npos) return {};
    const size_t close = source.find(')', open);
    if (close == std::string::npos) return {};
    size_t next = close + 1;
    while (next < source.size() && source[next] == ' ') ++next;
    const bool more = next > close + 1 && next < source.size() &&
                      (std::isalpha(static_cast<unsigned char>(source[next])) || source[next] == '_');
    if (!more) return source.substr(from, open - from);
    from = next;
  }
}

int nvrtc_default_jobs() {
  // the hardware threads up to 8, unless the variable names a count (bad text: a warning naming this default)
  const int hw = static_cast<int>(std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 8));
  return static_cast<int>(observe::env_int("PROTEAN_CUDA_NVRTC_JOBS", hw, 1, 64));
}

NvrtcResult nvrtc_compile_parts(const std::string& source, const std::string& name, const NvrtcOptions& o, int jobs) {
  const std::string marker = "extern \"C\" __global__";
  const size_t first = source.find(marker);
  auto single = [&] {
    NvrtcResult r = nvrtc_compile(source, name, o);
    if (!r.cubin.empty()) r.cubin = pack_cubins({std::move(r.cubin)});
    return r;
  };
  if (jobs <= 1 || first == std::string::npos) return single();
  // entry chunks: from one `extern "C" __global__` at a line start to the next
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t at = first; at != std::string::npos;) {
    const size_t next = source.find("\n" + marker, at + 1);
    const size_t end = next == std::string::npos ? source.size() : next + 1;
    chunks.push_back({at, end});
    at = next == std::string::npos ? next : next + 1;
  }
  const size_t parts = std::min<size_t>(static_cast<size_t>(jobs), chunks.size());
  if (parts <= 1) return single();
  // the header every part gets: the text before the first entry and every guarded definition block
  std::string header = source.substr(0, first);
  for (size_t at = source.find("#ifndef PT_", first); at != std::string::npos; at = source.find("#ifndef PT_", at + 1)) {
    const size_t end = source.find("#endif\n", at);
    if (end == std::string::npos) break;
    header += source.substr(at, end + 7 - at);
  }
  // deal the chunks, largest first, to the part with the least text; each part keeps source order
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return chunks[a].second - chunks[a].first > chunks[b].second - chunks[b].first;
  });
  std::vector<std::vector<size_t>> members(parts);
  std::vector<size_t> load(parts, 0);
  for (size_t c : order) {
    const size_t p = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    members[p].push_back(c);
    load[p] += chunks[c].second - chunks[c].first;
  }
  std::vector<std::string> texts(parts);
  for (size_t p = 0; p < parts; ++p) {
    std::sort(members[p].begin(), members[p].end());
    texts[p] = header;
    for (size_t c : members[p]) texts[p] += source.substr(chunks[c].first, chunks[c].second - chunks[c].first);
  }
  std::vector<NvrtcResult> results(parts);
  std::vector<double> cpu(parts, 0.0);
  std::vector<std::exception_ptr> errors(parts);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::vector<std::thread> threads;
    for (size_t p = 0; p < parts; ++p)
      threads.emplace_back([&, p] {
        try {
          const double c0 = observe::thread_cpu_seconds();
          results[p] = nvrtc_compile(texts[p], fmt::format("{} (part {} of {})", name, p + 1, parts), o);
          cpu[p] = observe::thread_cpu_seconds() - c0;
        } catch (...) {
          errors[p] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
  }
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  NvrtcResult r;
  std::vector<std::vector<uint8_t>> cubins;
  for (NvrtcResult& part : results) {
    cubins.push_back(std::move(part.cubin));
    r.log += part.log;
    if (!r.log.empty() && r.log.back() != '\n') r.log += '\n';
    r.resources.insert(part.resources.begin(), part.resources.end());
  }
  // each part's entry points, as written in its text
  std::vector<std::vector<std::string>> entries(parts);
  for (size_t p = 0; p < parts; ++p)
    for (size_t c : members[p]) {
      entries[p].push_back(entry_name_at(source, chunks[c].first));
    }
  for (size_t p = 0; p < parts; ++p)
    r.parts.push_back(NvrtcResult::Part{entries[p], texts[p].size(), results[p].seconds, cpu[p]});
  r.cubin = pack_cubins(cubins, entries);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

namespace {
constexpr char kCubinsMagic[8] = {'P', 'T', 'C', 'U', 'B', 'I', 'N', 'S'};
size_t align16(size_t n) { return (n + 15) / 16 * 16; }
}  // namespace

std::vector<uint8_t> pack_cubins(const std::vector<std::vector<uint8_t>>& cubins,
                                 const std::vector<std::vector<std::string>>& entries) {
  if (cubins.size() == 1) return cubins[0];
  std::vector<uint8_t> out(16, 0);
  std::memcpy(out.data(), kCubinsMagic, 8);
  const uint32_t n = static_cast<uint32_t>(cubins.size());
  std::memcpy(out.data() + 8, &n, 4);
  auto field = [&](const uint8_t* data, size_t size) {
    const uint64_t len = size;
    const size_t at = out.size();
    out.resize(align16(at + 8));
    std::memcpy(out.data() + at, &len, 8);
    const size_t data_at = out.size();
    out.resize(align16(data_at + size));
    if (size) std::memcpy(out.data() + data_at, data, size);
  };
  for (size_t i = 0; i < cubins.size(); ++i) {
    field(cubins[i].data(), cubins[i].size());
    std::string names;
    if (i < entries.size())
      for (const std::string& e : entries[i]) names += (names.empty() ? "" : "\n") + e;
    field(reinterpret_cast<const uint8_t*>(names.data()), names.size());
  }
  return out;
}

std::vector<CubinPart> unpack_cubins(const std::vector<uint8_t>& blob) {
  std::vector<CubinPart> r;
  if (blob.size() < 16 || std::memcmp(blob.data(), kCubinsMagic, 8) != 0) {
    if (!blob.empty()) r.push_back({blob.data(), blob.size(), {}});
    return r;
  }
  uint32_t n = 0;
  std::memcpy(&n, blob.data() + 8, 4);
  size_t at = 16;
  auto field = [&](uint32_t i) -> std::pair<const uint8_t*, size_t> {
    uint64_t size = 0;
    if (align16(at + 8) > blob.size() || (std::memcpy(&size, blob.data() + at, 8), size > blob.size() - align16(at + 8)))
      throw CompileError(fmt::format("cuda: a cubin container of {} bytes is truncated at part {} of {}", blob.size(), i + 1, n));
    at = align16(at + 8);
    const uint8_t* data = blob.data() + at;
    at = align16(at + static_cast<size_t>(size));
    return {data, static_cast<size_t>(size)};
  };
  for (uint32_t i = 0; i < n; ++i) {
    CubinPart part;
    std::tie(part.data, part.size) = field(i);
    const auto [names, len] = field(i);
    std::string text(reinterpret_cast<const char*>(names), len);
    for (size_t from = 0; from < text.size();) {
      const size_t end = std::min(text.find('\n', from), text.size());
      part.entries.push_back(text.substr(from, end - from));
      from = end + 1;
    }
    r.push_back(std::move(part));
  }
  return r;
}

void CubinModules::load(const ::protean::cuda::DriverApi& api, const std::vector<uint8_t>& blob, const std::string& name) {
  what = name;
  for (const CubinPart& part : unpack_cubins(blob)) {
    ::protean::cuda::CUmodule m = nullptr;
    ::protean::cuda::check(api.cuModuleLoadData(&m, part.data), fmt::format("cuModuleLoadData({}, {} bytes)", what, part.size));
    modules.push_back(m);
    for (const std::string& e : part.entries) module_of[e] = m;
  }
}

::protean::cuda::CUfunction CubinModules::function(const ::protean::cuda::DriverApi& api, const std::string& entry) const {
  auto it = module_of.find(entry);
  const ::protean::cuda::CUmodule m = it != module_of.end() ? it->second : modules.size() == 1 ? modules[0] : nullptr;
  if (!m) throw CompileError(fmt::format("{}: no module of its {} holds entry point {}", what, modules.size(), entry));
  ::protean::cuda::CUfunction fn = nullptr;
  ::protean::cuda::check(api.cuModuleGetFunction(&fn, m, entry.c_str()), fmt::format("cuModuleGetFunction({})", entry));
  return fn;
}

}  // namespace protean::backend::cuda
