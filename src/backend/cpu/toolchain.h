// Toolchain: turns generated C++ into a loaded library through the artifact cache.
//
// Compiler: $PROTEAN_CXX, else `g++`. Flags (compiler_flags(); -O2 instead of -O3 for a large program,
// codegen.h): -O3 -march=native -fopenmp -shared
// -fPIC -fno-math-errno -fno-trapping-math -fwrapv -ffp-contract=off -std=c++20. fast-math is not used
// and multiply-adds are not contracted: NaN/inf semantics and rounding must match the eager kernels. The compiler runs in a private temp dir on a file named kernel.cpp
// (so equal sources give byte-identical libraries); on failure CompileError names the kept source and
// quotes the compiler's first error lines. A unit of more than 16 KB per job is split at kernel
// boundaries (split_translation_unit) and its parts compiled by compile_jobs() concurrent compiler
// processes, then linked: the cold compile's wall time is the compiler's, and it uses every core.
// `-march=native` becomes `-march=<level> -mtune=generic` under PROTEAN_CACHE_PORTABLE=1 (cache/isa.h).
// Cache key: xxhash64 of (source, compiler name (no directory) and identity = first line of
// `<cxx> --version` (remembered per executable in <cache>/toolchain/), flags, the CPU feature flags from /proc/cpuinfo — or, portable, "isa:<level>" —
// and Protean version()). No absolute path, cache directory or device index enters a key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/kernel_cache.h"

namespace protean::backend::cpu {

std::string compiler_path();
/// The flags above; `large` (a large program, codegen.h) replaces -O3 by -O2. Reads the portable
/// settings on every call (cache/isa.h; ValueError for a bad PROTEAN_CACHE_ISA).
std::string compiler_flags(bool large = false);
/// First line of `<cxx> --version` (computed once).
const std::string& compiler_identity();
/// CPU feature flags (the "flags" line of /proc/cpuinfo, computed once).
const std::string& cpu_features();
uint64_t artifact_key(const std::string& source, bool large = false);
/// Loads (or compiles and caches) the library for `source` (compiled with compiler_flags(large)); a
/// cached library that lacks one of `kernels` (the names it must export) is corrupt and rebuilt
/// (cache/kernel_cache.h).
std::shared_ptr<const cache::Library> build_library(const std::string& source, const std::vector<std::string>& kernels = {},
                                                    bool large = false);
/// Compiler processes one library build may run at once: $PROTEAN_CPU_COMPILE_JOBS (1..64; anything
/// else is a ValueError), else the hardware threads, at most 8.
size_t compile_jobs();
/// Splits a generated translation unit (the runtime header, then `extern "C"` kernel definitions and
/// aliases) into at most `parts` units that compile separately and link into the same library: each
/// repeats the header and takes whole definitions, balanced by bytes (largest first), with every alias
/// beside its target. Returns {source} when there is nothing to split. Cutting the GPT training step's
/// 320 KB unit in two halves its wall-clock compile time on two cores.
std::vector<std::string> split_translation_unit(const std::string& source, size_t parts);
/// Builds an imported kernel's `source` with this machine's settings (`opt`: the entry's recorded
/// "O2" or "O3") into the cache, for a bundle whose binary cannot run here. Returns the local key.
/// Throws CompileError when the compiler fails.
uint64_t rebuild_kernel(const std::string& source, const std::string& opt);

}  // namespace protean::backend::cpu
