#include "backend/cpu/toolchain.h"
#include "cache/kernel_toolchain.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cache/isa.h"
#include "observe/trace.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::backend::cpu {

namespace fs = std::filesystem;

namespace {
std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[512];
  while (fgets(buf, sizeof buf, f)) out += buf;
  pclose(f);
  return out;
}
std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }
std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}
}  // namespace

std::string compiler_path() {
  if (const char* c = std::getenv("PROTEAN_CXX"); c && *c) return c;
  return "g++";
}

std::string compiler_flags(bool large) {
  static const std::string common =
      "-fopenmp -shared -fPIC -fno-math-errno -fno-trapping-math -fwrapv -ffp-contract=off -std=c++20";
  const std::string target = cache::build_target();
  const std::string arch = target == "native" ? "-march=native" : fmt::format("-march={} -mtune=generic", target);
  return fmt::format("{} {} {}", large ? "-O2" : "-O3", arch, common);
}

namespace {
/// The compiler's executable with symlinks resolved ("" when it cannot be found).
std::string resolve_executable(const std::string& name) {
  std::error_code ec;
  if (name.find('/') != std::string::npos) return fs::canonical(name, ec).string();
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t b = 0; b <= dirs.size();) {
    size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    fs::path cand = fs::path(dirs.substr(b, e - b).empty() ? "." : dirs.substr(b, e - b)) / name;
    if (::access(cand.c_str(), X_OK) == 0) return fs::canonical(cand, ec).string();
    b = e + 1;
  }
  return "";
}
}  // namespace

const std::string& compiler_identity() {
  // Every process needs the identity for its keys, and running `<cxx> --version` costs a process
  // start (tens of ms, and a compiler run a warm process should not make). It is remembered in
  // <cache>/toolchain/<hash>.txt per (resolved executable, size, mtime): an upgraded compiler is
  // a new file and asked again. Best effort: any problem falls back to asking.
  static const std::string id = [] {
    const std::string exe = resolve_executable(compiler_path());
    struct stat st {};
    std::string memo, tag;
    if (!exe.empty() && ::stat(exe.c_str(), &st) == 0) {
      tag = fmt::format("{}\n{}\n{}.{}\n", exe, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
      memo = fmt::format("{}/toolchain/{}.txt", cache::cache_dir(), cache::key_hex(XXH64(tag.data(), tag.size(), 0)));
      std::ifstream in(memo, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (text.size() > tag.size() && text.compare(0, tag.size(), tag) == 0) {
        std::string v = first_line(text.substr(tag.size()));
        if (!v.empty()) return v;
      }
    }
    std::string v = first_line(run_capture(shell_quote(compiler_path()) + " --version 2>/dev/null"));
    if (!memo.empty() && !v.empty()) {
      std::error_code ec;
      fs::create_directories(fs::path(memo).parent_path(), ec);
      const std::string tmp = fmt::format("{}.tmp.{}", memo, ::getpid());
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out << tag << v << "\n";
      }
      fs::rename(tmp, memo, ec);
      if (ec) fs::remove(tmp, ec);
    }
    return v;
  }();
  return id;
}

const std::string& cpu_features() {
  static const std::string f = [] {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("flags", 0) == 0) return line.substr(line.find(':') + 1);
    return std::string("unknown");
  }();
  return f;
}

uint64_t artifact_key(const std::string& source, bool large) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  auto feed = [&](const std::string& s) {
    XXH64_update(st, s.data(), s.size());
    XXH64_update(st, "\0", 1);
  };
  // No absolute path and nothing of this machine beyond what decides the binary: the compiler by
  // name and identity, the flags, and (native builds only) the CPU's feature line.
  feed(source);
  feed(fs::path(compiler_path()).filename().string());
  feed(compiler_identity());
  feed(compiler_flags(large));
  const std::string target = cache::build_target();
  feed(target == "native" ? cpu_features() : "isa:" + target);
  feed(version());
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

cache::EntryAttrs entry_attrs(bool large) {
  const std::string target = cache::build_target();
  cache::EntryAttrs a = {{"target", target}, {"opt", large ? "O2" : "O3"}, {"compiler", compiler_identity()}};
  if (target == "native") a.emplace_back("cpu_flags", cache::key_hex(XXH64(cpu_features().data(), cpu_features().size(), 0)));
  return a;
}

uint64_t rebuild_kernel(const std::string& source, const std::string& opt) {
  const bool large = opt == "O2";
  build_library(source, {}, large);
  return artifact_key(source, large);
}

std::shared_ptr<const cache::Library> build_library(const std::string& source, const std::vector<std::string>& kernels,
                                                    bool large) {
  const std::string flags = compiler_flags(large);
  return cache::get_or_build(artifact_key(source, large), source, [flags](const std::string& src, const std::string& dir, const std::string& so) {
    std::string cpp = dir + "/kernel.cpp";
    {
      std::ofstream f(cpp, std::ios::binary);
      f << src;
      if (!f) throw CompileError(fmt::format("cpu: cannot write {}", cpp));
    }
    std::string log = dir + "/compile.log";
    std::string cmd = fmt::format("cd {} && {} {} kernel.cpp -o {} > compile.log 2>&1", shell_quote(dir),
                                  shell_quote(compiler_path()), flags, shell_quote(so));
    int rc = std::system(cmd.c_str());
    if (rc != 0) {
      std::ifstream lf(log);
      std::string text, line;
      for (int i = 0; i < 12 && std::getline(lf, line); ++i) text += "\n  " + line;
      if (!observe::trace_compile_id().empty() && observe::trace_enabled()) {
        std::ifstream all(log, std::ios::binary);
        std::string full((std::istreambuf_iterator<char>(all)), std::istreambuf_iterator<char>());
        observe::trace_artifact(observe::trace_compile_id(), "compiler_log", "C++ compiler output", log, full);
      }
      throw CompileError(fmt::format("cpu: C++ compilation failed (status {}); generated source kept at {}, compiler "
                                     "output in {}:{}",
                                     rc, cpp, log, text));
    }
  }, kernels, entry_attrs(large));
}

}  // namespace protean::backend::cpu

namespace protean::backend::cpu {
namespace {
// Bundles (cache/bundle.cpp, below this layer) reach the compiler through cache::kernel_toolchain.
const bool g_toolchain_installed = (cache::set_kernel_toolchain({&compiler_identity, &cpu_features, &rebuild_kernel}), true);
}  // namespace
}  // namespace protean::backend::cpu
