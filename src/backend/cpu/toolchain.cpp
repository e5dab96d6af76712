#include "backend/cpu/toolchain.h"
#include "cache/kernel_toolchain.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>
#include <thread>

#include "cache/isa.h"
#include "core/files.h"
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
  // -fno-tree-loop-if-convert: GCC 12 turned `omp simd` loops whose selects load memory in their arms
  // (`c ? b20[i] : b13[i] * ...`, the gradients of minimum, amax and where) into masked loads at the
  // wrong address, one row further on (codegen.cpp's kTailNote; GradDifferentialScalarLoops). Our own
  // vector forms load both arms and select; the loops left to GCC stay scalar where they branch.
  constexpr const char* common =
      "-fopenmp -shared -fPIC -fno-math-errno -fno-trapping-math -fwrapv -ffp-contract=off -fno-tree-loop-if-convert "
      "-std=c++20";
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
      try {
        core::write_file_atomic(memo, tag + v + "\n", "compiler identity memo");
      } catch (const Error&) {  // a memo: without it the next process runs `--version` again
      }
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

size_t compile_jobs() {
  if (const char* e = std::getenv("PROTEAN_CPU_COMPILE_JOBS"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (end == e || *end != '\0' || v < 1 || v > 64)
      throw ValueError(fmt::format("PROTEAN_CPU_COMPILE_JOBS='{}': expected a number of compiler processes in 1..64", e));
    return static_cast<size_t>(v);
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return std::clamp<size_t>(hw == 0 ? 1 : hw, 1, 8);
}

std::vector<std::string> split_translation_unit(const std::string& source, size_t parts) {
  // Items: each top-level `extern "C"` definition up to the next one; the text before the first is the
  // header every part repeats (the runtime header, nothing with external linkage).
  std::vector<size_t> starts;
  for (size_t pos = 0; (pos = source.find("extern \"C\" ", pos)) != std::string::npos; pos += 11)
    if (pos == 0 || source[pos - 1] == '\n') starts.push_back(pos);
  if (parts <= 1 || starts.size() < 2) return {source};
  const std::string_view header(source.data(), starts[0]);
  struct Item {
    std::string_view text, name, alias_of;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t end = i + 1 < starts.size() ? starts[i + 1] : source.size();
    Item it{std::string_view(source).substr(starts[i], end - starts[i]), {}, {}};
    // The name: the identifier just before the first '('.
    if (const size_t paren = it.text.find('('); paren != std::string_view::npos) {
      size_t b = paren;
      auto ident = [](char c) { return c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
      while (b > 0 && ident(it.text[b - 1])) --b;
      it.name = it.text.substr(b, paren - b);
    }
    if (size_t a = it.text.find("__attribute__((alias(\""); a != std::string_view::npos) {
      const size_t b = a + 22, e = it.text.find('"', b);
      if (e == std::string_view::npos) return {source};
      it.alias_of = it.text.substr(b, e - b);
    }
    items.push_back(it);
  }
  // Definitions: largest first into the part with the fewest bytes (balanced compile times); an alias
  // goes where its target is defined (GCC requires that).
  std::vector<size_t> order;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].alias_of.empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].text.size() > items[b].text.size(); });
  parts = std::min(parts, order.size());
  std::vector<size_t> part_of(items.size(), 0), bytes(parts, 0);
  for (size_t i : order) {
    const size_t p = static_cast<size_t>(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    part_of[i] = p;
    bytes[p] += items[i].text.size();
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].alias_of.empty()) continue;
    bool found = false;
    for (size_t j = 0; j < items.size() && !found; ++j)
      if (items[j].alias_of.empty() && items[j].name == items[i].alias_of) part_of[i] = part_of[j], found = true;
    if (!found) return {source};  // an alias of something this split cannot see: compile as one unit
  }
  std::vector<std::string> out(parts, std::string(header));
  for (size_t i = 0; i < items.size(); ++i) out[part_of[i]] += items[i].text;  // items keep their order per part
  return out;
}

namespace {
/// Bytes of generated kernel code per compiler process: below this a second process (and the link
/// step) costs more than it saves.
constexpr size_t kBytesPerCompileJob = 16 * 1024;

/// Runs `cmd` in a shell; on failure throws the CompileError naming the kept source and log.
void run_compiler(const std::string& cmd, const std::string& cpp, const std::string& log) {
  int rc = std::system(cmd.c_str());
  if (rc == 0) return;
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
}  // namespace

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
    const size_t jobs = std::min(compile_jobs(), std::max<size_t>(1, src.size() / kBytesPerCompileJob));
    const std::vector<std::string> parts = split_translation_unit(src, jobs);
    if (parts.size() <= 1) {
      run_compiler(fmt::format("cd {} && {} {} kernel.cpp -o {} > compile.log 2>&1", shell_quote(dir),
                               shell_quote(compiler_path()), flags, shell_quote(so)),
                   cpp, dir + "/compile.log");
      return;
    }
    // Parts compiled to objects by concurrent compiler processes, then linked (kernel.cpp stays the
    // whole unit: the cache keeps it as the artifact's source).
    std::vector<std::string> objects;
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string name = fmt::format("{}/kernel.part{}.cpp", dir, i);
      std::ofstream f(name, std::ios::binary);
      f << parts[i];
      if (!f) throw CompileError(fmt::format("cpu: cannot write {}", name));
      objects.push_back(fmt::format("kernel.part{}.o", i));
    }
    std::vector<std::exception_ptr> errors(parts.size());
    std::vector<std::thread> workers;
    for (size_t i = 0; i < parts.size(); ++i)
      workers.emplace_back([&, i] {
        try {
          run_compiler(fmt::format("cd {} && {} {} -c kernel.part{}.cpp -o {} > compile.part{}.log 2>&1", shell_quote(dir),
                                   shell_quote(compiler_path()), flags, i, objects[i], i),
                       fmt::format("{}/kernel.part{}.cpp", dir, i), fmt::format("{}/compile.part{}.log", dir, i));
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    for (std::thread& t : workers) t.join();
    for (const std::exception_ptr& e : errors)
      if (e) std::rethrow_exception(e);
    std::string objs;
    for (const std::string& o : objects) objs += " " + o;
    run_compiler(fmt::format("cd {} && {} {}{} -o {} > compile.log 2>&1", shell_quote(dir), shell_quote(compiler_path()),
                             flags, objs, shell_quote(so)),
                 cpp, dir + "/compile.log");
    std::error_code ec;
    for (size_t i = 0; i < parts.size(); ++i) {
      fs::remove(fmt::format("{}/kernel.part{}.cpp", dir, i), ec);
      fs::remove(fmt::format("{}/{}", dir, objects[i]), ec);
      fs::remove(fmt::format("{}/compile.part{}.log", dir, i), ec);
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
