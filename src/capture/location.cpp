#include "capture/location.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <link.h>
#include <unistd.h>

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cache/kernel_cache.h"

namespace protean::capture {

std::string basename_of(const std::string& path) {
  size_t p = path.find_last_of('/');
  return p == std::string::npos ? path : path.substr(p + 1);
}

namespace {

struct LibRange {
  uintptr_t base = 0;
  std::string path;
};

// libprotean's load address identifies frames inside the library (dladdr of a function in it).
const LibRange& library() {
  static LibRange r = [] {
    LibRange l;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&current_user_location), &info) && info.dli_fname) {
      l.base = reinterpret_cast<uintptr_t>(info.dli_fbase);
      l.path = info.dli_fname;
    }
    return l;
  }();
  return r;
}

bool skipped_file(const char* f) {
  if (!f) return true;
  return std::strstr(f, "include/protean/") != nullptr || std::strncmp(f, "/usr/include", 12) == 0 ||
         std::strstr(f, "/c++/") != nullptr || std::strstr(f, "/src/capture/") != nullptr;
}

// A system library (libc, libstdc++, libgomp, the dynamic loader): never the user's code, even when its
// debug info is installed (glibc's would name libc_start_call_main.h for a user binary without -g).
bool system_module(const char* path) {
  if (!path) return false;
  return std::strncmp(path, "/lib/", 5) == 0 || std::strncmp(path, "/lib64/", 7) == 0 ||
         std::strncmp(path, "/usr/lib/", 9) == 0 || std::strncmp(path, "/usr/lib64/", 11) == 0;
}

thread_local const std::string* t_context = nullptr;

struct Cached {
  bool user = false;  // a location in user code
  core::SourceLocation loc;
};

class Symbolizer {
 public:
  Symbolizer() {
    callbacks_.find_elf = dwfl_linux_proc_find_elf;
    callbacks_.find_debuginfo = dwfl_standard_find_debuginfo;
    callbacks_.debuginfo_path = nullptr;
    dwfl_ = dwfl_begin(&callbacks_);
    if (dwfl_) {
      dwfl_linux_proc_report(dwfl_, getpid());
      dwfl_report_end(dwfl_, nullptr, nullptr);
    }
  }
  ~Symbolizer() {
    if (dwfl_) dwfl_end(dwfl_);
  }

  // Resolves a PC (return address - 1) to the innermost non-skipped location (walking inlined
  // call sites outwards). `user` is false when every level is in a skipped file or unknown.
  Cached resolve(uintptr_t pc) {
    Cached c;
    if (!dwfl_) return c;
    Dwfl_Module* mod = dwfl_addrmodule(dwfl_, pc);
    if (!mod) return c;
    const char* fn = dwfl_module_addrname(mod, pc);
    Dwfl_Line* line = dwfl_module_getsrc(mod, pc);
    const char* file = nullptr;
    int lineno = 0;
    if (line) file = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr);
    if (file && !skipped_file(file)) {
      c.user = true;
      c.loc = {basename_of(file), lineno, fn ? short_function_name(demangle(fn)) : ""};
      return c;
    }
    // Inlined scopes: innermost first; the call site of an inlined subroutine is in its caller.
    Dwarf_Addr bias = 0;
    Dwarf_Die* cudie = dwfl_module_addrdie(mod, pc, &bias);
    if (!cudie) return c;
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes(cudie, pc - bias, &scopes);
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    dwarf_getsrcfiles(cudie, &files, &nfiles);
    for (int i = 0; i < n && files; ++i) {
      if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine) continue;
      Dwarf_Attribute a;
      Dwarf_Word cf = 0, cl = 0;
      if (!dwarf_attr(&scopes[i], DW_AT_call_file, &a) || dwarf_formudata(&a, &cf) != 0) continue;
      if (!dwarf_attr(&scopes[i], DW_AT_call_line, &a) || dwarf_formudata(&a, &cl) != 0) continue;
      const char* f = dwarf_filesrc(files, cf, nullptr, nullptr);
      if (f && !skipped_file(f)) {
        c.user = true;
        c.loc = {basename_of(f), static_cast<int>(cl), fn ? short_function_name(demangle(fn)) : ""};
        break;
      }
    }
    free(scopes);
    return c;
  }

  // Names of the formal parameters of the function whose code starts at `pc` (artificial ones such as
  // `this` left out); empty without debug info for it.
  std::vector<std::string> parameter_names(uintptr_t pc) {
    std::vector<std::string> names;
    if (!dwfl_) return names;
    Dwfl_Module* mod = dwfl_addrmodule(dwfl_, pc);
    if (!mod) return names;
    Dwarf_Addr bias = 0;
    Dwarf_Die* cudie = dwfl_module_addrdie(mod, pc, &bias);
    if (!cudie) return names;
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes(cudie, pc - bias, &scopes);
    for (int i = 0; i < n; ++i) {
      if (dwarf_tag(&scopes[i]) != DW_TAG_subprogram) continue;
      Dwarf_Die child;
      if (dwarf_child(&scopes[i], &child) == 0) {
        do {
          if (dwarf_tag(&child) != DW_TAG_formal_parameter) continue;
          Dwarf_Attribute a;
          bool artificial = false;
          if (dwarf_attr_integrate(&child, DW_AT_artificial, &a)) dwarf_formflag(&a, &artificial);
          if (artificial) continue;
          const char* name = dwarf_attr_integrate(&child, DW_AT_name, &a) ? dwarf_formstring(&a) : nullptr;
          names.push_back(name ? name : "");
        } while (dwarf_siblingof(&child, &child) == 0);
      }
      break;
    }
    free(scopes);
    return names;
  }

 private:
  static std::string demangle(const char* mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string r = (status == 0 && d) ? d : mangled;
    std::free(d);
    return r;
  }
  Dwfl_Callbacks callbacks_{};
  Dwfl* dwfl_ = nullptr;
};

// The end of the qualified name that ends just before `end` in `s` (skipping a parameter list and
// template arguments written before it): "ns::f(int)" with end after ')' → start of "ns::f".
size_t name_start(const std::string& s, size_t end) {
  size_t i = end;
  int depth = 0;
  while (i > 0) {
    char ch = s[i - 1];
    if (ch == ')' || ch == '>') ++depth;
    else if (ch == '(' || ch == '<') {
      if (depth == 0) break;
      --depth;
    } else if (depth == 0 && (ch == ' ' || ch == ',')) break;
    --i;
  }
  return i;
}

// "ns::f(int)" → "ns::f"; drops a parameter list at angle-bracket depth 0 only.
std::string strip_params(const std::string& s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (s[i] == '(' && depth == 0 && !(i >= 8 && s.compare(i - 8, 8, "operator") == 0))
      return s.substr(0, i);
  }
  return s;
}

std::mutex g_mu;
int64_t g_sessions = 0;  // libdw sessions opened since the process started
std::unordered_map<uintptr_t, Cached>& cache() {
  static std::unordered_map<uintptr_t, Cached> c;
  return c;
}
// The libdw session: opened by the first symbolization, closed when the last trace running in the
// process ends (its decoded line tables and the mapped debug info are megabytes a training process
// would otherwise keep for its lifetime; the answers stay in cache() and on disk).
std::unique_ptr<Symbolizer>& symbolizer_slot() {
  static std::unique_ptr<Symbolizer> s;
  return s;
}
Symbolizer& symbolizer() {
  std::unique_ptr<Symbolizer>& s = symbolizer_slot();
  if (!s) {
    s = std::make_unique<Symbolizer>();
    ++g_sessions;
  }
  return *s;
}
int g_traces = 0;  // SymbolizerSessionScope's alive in the process (under g_mu)
LocationCacheStats g_stats;

// ---- disk tier ------------------------------------------------------------------------------------
// The first symbolization of a frame in a module decodes the whole line table of its compile unit
// (libdw's dwarf_getsrclines: ~90k rows and ~2000 fresh pages for tools/protean/run_cmd.cpp, 25-50 ms
// of CPU), once per process. Its answer depends only on the module's bytes, so it is kept on disk per
// GNU build ID: $PROTEAN_CACHE_DIR/locations/<build-id>.tsv, one line per resolved return address,
// "<offset from the load bias>\t<user 0/1>\t<line>\t<file>\t<function>". A later process with the
// same module reads the answer instead of symbolizing. Modules without a build ID are not cached;
// unreadable lines are ignored (and symbolized again); writes are single O_APPEND lines.

struct Module {
  std::string build_id;  // hex; empty: no disk tier
  uintptr_t bias = 0;    // dlpi_addr
  bool loaded = false;   // the file was read into `entries`
  std::unordered_map<uintptr_t, Cached> entries;  // offset -> answer
};

// The module's build ID and load bias, by the PT_LOAD segment holding `pc`.
struct FindModule {
  uintptr_t pc = 0;
  bool found = false;
  uintptr_t bias = 0;
  std::string build_id;
};

int find_module_cb(dl_phdr_info* info, size_t, void* data) {
  auto* f = static_cast<FindModule*>(data);
  bool inside = false;
  for (int i = 0; i < info->dlpi_phnum && !inside; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    inside = ph.p_type == PT_LOAD && f->pc >= lo && f->pc < lo + ph.p_memsz;
  }
  if (!inside) return 0;
  f->found = true;
  f->bias = info->dlpi_addr;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
    const char* end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
      const char* name = p + sizeof(ElfW(Nhdr));
      const char* desc = name + ((nh->n_namesz + 3) & ~3u);
      if (desc + nh->n_descsz > end) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        for (uint32_t k = 0; k < nh->n_descsz; ++k)
          f->build_id += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
        return 1;
      }
      p = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return 1;
}

std::string modules_dir() { return cache::cache_dir() + "/locations"; }

std::unordered_map<std::string, Module>& modules() {
  static std::unordered_map<std::string, Module> m;
  return m;
}

bool parse_entry(const std::string& line, uintptr_t& off, Cached& c) {
  size_t t1 = line.find('\t'), t2 = line.find('\t', t1 + 1), t3 = line.find('\t', t2 + 1),
         t4 = line.find('\t', t3 + 1);
  if (t4 == std::string::npos || line.find('\t', t4 + 1) != std::string::npos) return false;
  try {
    size_t used = 0;
    unsigned long long o = std::stoull(line.substr(0, t1), &used, 16);
    if (used != t1) return false;
    std::string user = line.substr(t1 + 1, t2 - t1 - 1);
    if (user != "0" && user != "1") return false;
    int ln = std::stoi(line.substr(t2 + 1, t3 - t2 - 1), &used);
    if (used != t3 - t2 - 1) return false;
    off = static_cast<uintptr_t>(o);
    c.user = user == "1";
    c.loc = {line.substr(t3 + 1, t4 - t3 - 1), ln, line.substr(t4 + 1)};
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The disk answer for `pc`, or symbolizes it (and appends the answer to the module's file).
Cached lookup_or_resolve(uintptr_t pc) {
  FindModule f;
  f.pc = pc;
  dl_iterate_phdr(find_module_cb, &f);
  if (!f.found || f.build_id.empty()) {
    ++g_stats.symbolized;
    return symbolizer().resolve(pc);
  }
  const std::string path = modules_dir() + "/" + f.build_id + ".tsv";
  Module& m = modules()[path];
  if (!m.loaded) {
    m.loaded = true;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      uintptr_t off = 0;
      Cached c;
      if (parse_entry(line, off, c)) m.entries[off] = std::move(c);
    }
  }
  const uintptr_t off = pc - f.bias;
  if (auto it = m.entries.find(off); it != m.entries.end()) {
    ++g_stats.disk_hits;
    return it->second;
  }
  Cached c = symbolizer().resolve(pc);
  ++g_stats.symbolized;
  m.entries[off] = c;
  auto clean = [](const std::string& x) { return x.find_first_of("\t\n\r") == std::string::npos; };
  if (!clean(c.loc.file) || !clean(c.loc.function)) return c;
  std::error_code ec;
  std::filesystem::create_directories(modules_dir(), ec);
  std::string rec = fmt::format("{:x}\t{}\t{}\t{}\t{}\n", off, c.user ? 1 : 0, c.loc.line, c.loc.file, c.loc.function);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd >= 0) {
    (void)!::write(fd, rec.data(), rec.size());  // a cache: a failed write only costs a later symbolization
    ::close(fd);
  }
  return c;
}

}  // namespace

}  // namespace protean::capture

namespace protean::detail {
std::vector<std::string> function_parameter_names(const void* code) {
  if (!code) return {};
  std::lock_guard<std::mutex> lock(capture::g_mu);
  // The session stays open for the trace that follows (a compiled module's first call), whose end
  // closes it: the module's compile unit is then decoded once.
  std::vector<std::string> names = capture::symbolizer().parameter_names(reinterpret_cast<uintptr_t>(code));
  for (const auto& n : names)
    if (n.empty()) return {};  // an unnamed parameter: keep the positional names for all
  return names;
}
}  // namespace protean::detail

namespace protean::capture {

LocationCacheStats location_cache_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  LocationCacheStats s = g_stats;
  s.sessions = g_sessions;
  s.session_open = symbolizer_slot() != nullptr;
  return s;
}

SymbolizerSessionScope::SymbolizerSessionScope() {
  std::lock_guard<std::mutex> lock(g_mu);
  ++g_traces;
}
SymbolizerSessionScope::~SymbolizerSessionScope() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_traces == 0) symbolizer_slot().reset();
}

void forget_locations_in_memory() {
  std::lock_guard<std::mutex> lock(g_mu);
  cache().clear();
  modules().clear();
}

std::string short_function_name(const std::string& demangled) {
  // A lambda, also one invoked through std::function (`std::_Function_handler<R (A), f()::{lambda(...)#1}>`):
  // "lambda in f", naming the function that wrote it.
  const size_t lam = demangled.find("::{lambda(");
  if (lam != std::string::npos) {
    const size_t start = name_start(demangled, lam);
    std::string enclosing = strip_params(demangled.substr(start, lam - start));
    return "lambda in " + (enclosing.empty() ? std::string("?") : enclosing);
  }
  if (demangled.rfind("{lambda(", 0) == 0) return "lambda";
  return strip_params(demangled);
}

LocationContextScope::LocationContextScope(const std::string& function) : previous_(t_context) { t_context = &function; }
LocationContextScope::~LocationContextScope() { t_context = previous_; }

core::SourceLocation unresolved_location(std::string_view op) {
  std::string what;
  if (t_context) what = fmt::format("function '{}'", *t_context);
  if (!op.empty()) what += fmt::format("{}op {}", what.empty() ? "" : ", ", op);
  core::SourceLocation l;
  l.function = fmt::format("{}{}(no debug info: build with -g or RelWithDebInfo to see your line)", what,
                           what.empty() ? "" : " ");
  return l;
}

core::SourceLocation user_location_or_unresolved(std::string_view op) {
  core::SourceLocation l = current_user_location();
  return l.line > 0 ? l : unresolved_location(op);
}

core::SourceLocation current_user_location() {
  void* frames[64];
  int n = backtrace(frames, 64);
  const LibRange& lib = library();
  std::lock_guard<std::mutex> lock(g_mu);
  auto innermost_user_frame = [&]() -> core::SourceLocation {
    for (int i = 1; i < n; ++i) {
      uintptr_t pc = reinterpret_cast<uintptr_t>(frames[i]) - 1;
      auto it = cache().find(pc);
      if (it == cache().end()) {
        Cached c;
        Dl_info info{};
        const bool found = dladdr(frames[i], &info) != 0;
        bool in_lib = found && reinterpret_cast<uintptr_t>(info.dli_fbase) == lib.base;
        if (!in_lib && !(found && system_module(info.dli_fname))) c = lookup_or_resolve(pc);
        it = cache().emplace(pc, std::move(c)).first;
      }
      if (it->second.user) return it->second.loc;
    }
    return {};
  };
  core::SourceLocation loc = innermost_user_frame();
  if (g_traces == 0) symbolizer_slot().reset();  // a lookup outside any trace keeps no session
  return loc;
}

}  // namespace protean::capture
