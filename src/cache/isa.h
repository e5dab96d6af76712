// Portable artifact keys: which instruction set the generated kernels are built for and keyed on.
//
//   PROTEAN_CACHE_PORTABLE=1   build kernels for a named x86-64 micro-architecture level
//                              (`-march=<level> -mtune=generic`) and key them on that level, instead of
//                              `-march=native` keyed on the CPU's whole /proc/cpuinfo flags line; a
//                              cache (or bundle) made on one machine then hits on every machine of
//                              that level or above (docs/cache.md).
//   PROTEAN_CACHE_ISA=<level>  the level to use in portable mode: x86-64-v2, x86-64-v3 or x86-64-v4
//                              (the psABI names GCC's -march takes); default: the highest level of
//                              x86-64-v3 / x86-64-v4 this CPU supports (x86-64-v2 on an older CPU).
//
// Both are read on every call (tests switch them).
#pragma once

#include <string>

namespace protean::cache {

/// PROTEAN_CACHE_PORTABLE is set to something other than "" or "0".
bool portable();
/// True when this CPU runs code built for `level` ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"):
/// __builtin_cpu_supports, i.e. CPUID and the OS's XSAVE state. False for an unknown name.
bool cpu_supports_isa(const std::string& level);
/// The highest of x86-64-v4, -v3, -v2, x86-64 this CPU supports.
std::string cpu_isa_level();
/// The portable level in use: PROTEAN_CACHE_ISA when set, else cpu_isa_level() (capped at v4,
/// raised to nothing: a CPU below v2 gets "x86-64"). Throws ValueError when PROTEAN_CACHE_ISA is not one
/// of the four names, or names a level this CPU cannot run (its kernels would die of SIGILL here).
std::string isa_level();
/// What the kernels are built for: isa_level() in portable mode, else "native".
std::string build_target();

}  // namespace protean::cache
