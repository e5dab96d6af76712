#include "capture/location.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <execinfo.h>
#include <unistd.h>

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

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

struct Cached {
  bool user = false;  // a location in user code
  sym::UserLocation loc;
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
      c.loc = {basename_of(file), lineno, fn ? demangle_short(fn) : ""};
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
        c.loc = {basename_of(f), static_cast<int>(cl), fn ? demangle_short(fn) : ""};
        break;
      }
    }
    free(scopes);
    return c;
  }

 private:
  // "ns::fn(int)" → "ns::fn" (template arguments kept).
  static std::string demangle_short(const char* mangled) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string r = (status == 0 && d) ? d : mangled;
    std::free(d);
    size_t paren = r.find('(');
    if (paren != std::string::npos) r.resize(paren);
    return r;
  }
  Dwfl_Callbacks callbacks_{};
  Dwfl* dwfl_ = nullptr;
};

std::mutex g_mu;
std::unordered_map<uintptr_t, Cached>& cache() {
  static std::unordered_map<uintptr_t, Cached> c;
  return c;
}
Symbolizer& symbolizer() {
  static Symbolizer s;
  return s;
}

}  // namespace

sym::UserLocation current_user_location() {
  void* frames[64];
  int n = backtrace(frames, 64);
  const LibRange& lib = library();
  std::lock_guard<std::mutex> lock(g_mu);
  for (int i = 1; i < n; ++i) {
    uintptr_t pc = reinterpret_cast<uintptr_t>(frames[i]) - 1;
    auto it = cache().find(pc);
    if (it == cache().end()) {
      Cached c;
      Dl_info info{};
      bool in_lib = dladdr(frames[i], &info) && reinterpret_cast<uintptr_t>(info.dli_fbase) == lib.base;
      if (!in_lib) c = symbolizer().resolve(pc);
      it = cache().emplace(pc, std::move(c)).first;
    }
    if (it->second.user) return it->second.loc;
  }
  return {};
}

}  // namespace protean::capture
