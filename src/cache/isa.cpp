#include "cache/isa.h"

#include <fmt/format.h>

#include <cstdlib>

#include "protean/error.h"

namespace protean::cache {

bool portable() {
  const char* v = std::getenv("PROTEAN_CACHE_PORTABLE");
  return v && *v && std::string(v) != "0";
}

bool cpu_supports_isa(const std::string& level) {
  __builtin_cpu_init();
  if (level == "x86-64") return __builtin_cpu_supports("x86-64");
  if (level == "x86-64-v2") return __builtin_cpu_supports("x86-64-v2");
  if (level == "x86-64-v3") return __builtin_cpu_supports("x86-64-v3");
  if (level == "x86-64-v4") return __builtin_cpu_supports("x86-64-v4");
  return false;
}

std::string cpu_isa_level() {
  for (const char* l : {"x86-64-v4", "x86-64-v3", "x86-64-v2"})
    if (cpu_supports_isa(l)) return l;
  return "x86-64";
}

std::string isa_level() {
  const char* v = std::getenv("PROTEAN_CACHE_ISA");
  if (!v || !*v) return cpu_isa_level();
  const std::string level = v;
  if (level != "x86-64" && level != "x86-64-v2" && level != "x86-64-v3" && level != "x86-64-v4")
    throw ValueError(fmt::format("PROTEAN_CACHE_ISA='{}': expected x86-64-v3 or x86-64-v4 (or x86-64-v2, x86-64)", level));
  if (!cpu_supports_isa(level))
    throw ValueError(fmt::format("PROTEAN_CACHE_ISA='{}': this CPU supports only {}; kernels built for {} cannot run "
                                 "here (unset PROTEAN_CACHE_ISA to use this CPU's level)",
                                 level, cpu_isa_level(), level));
  return level;
}

std::string build_target() { return portable() ? isa_level() : std::string("native"); }

}  // namespace protean::cache
