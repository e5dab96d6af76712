// Run-time loading of the optional vendor libraries (the CUDA driver, NVRTC, cuBLASLt, NCCL): the
// build links none of them, so Protean builds and runs its CPU paths on machines without them, and
// each loader turns a missing library or entry point into its own clear error.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace protean::cuda {

/// The handle of the first of `candidates` (names or paths) that dlopen(RTLD_NOW | RTLD_LOCAL) loads,
/// or nullptr; then `error` holds the last dlerror() text ("unknown error" when dlopen gave none). A
/// loaded library stays loaded for the life of the process.
inline void* open_first_library(const std::vector<std::string>& candidates, std::string& error) {
  error.clear();
  for (const std::string& c : candidates) {
    dlerror();
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) return lib;
    const char* e = dlerror();
    error = e ? e : "unknown error";
  }
  return nullptr;
}

/// Stores in `slot` the first of `names` (an entry point and its older spellings, e.g.
/// cuStreamDestroy_v2 then cuStreamDestroy) that `lib` exports and returns true. Otherwise appends
/// the first name to `missing` (", " between names) and returns false.
template <typename Fn>
bool resolve_symbol(void* lib, Fn& slot, std::initializer_list<const char*> names, std::string& missing) {
  for (const char* n : names) {
    if (void* p = dlsym(lib, n)) {
      slot = reinterpret_cast<Fn>(p);
      return true;
    }
  }
  missing += std::string(missing.empty() ? "" : ", ") + *names.begin();
  return false;
}

}  // namespace protean::cuda
