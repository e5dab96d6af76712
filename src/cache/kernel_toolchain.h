// The host compiler as the artifact cache's bundles see it: its identity (a bundle built by another
// compiler is refused), the CPU's feature line, and a rebuild of an imported kernel's source for this
// machine. The cpu backend (src/backend/cpu/toolchain.cpp, above this layer) installs it when the
// library loads; before that, or in a build without the cpu backend, bundle operations that need it
// throw RuntimeError.
#pragma once

#include <cstdint>
#include <string>

namespace protean::cache {

struct KernelToolchain {
  /// First line of `<cxx> --version`.
  const std::string& (*compiler_identity)() = nullptr;
  /// The "flags" line of /proc/cpuinfo.
  const std::string& (*cpu_features)() = nullptr;
  /// Builds `source` with this machine's settings (`opt`: "O2" or "O3") into the cache; the local
  /// key. Throws CompileError when the compiler fails.
  uint64_t (*rebuild_kernel)(const std::string& source, const std::string& opt) = nullptr;
};

/// Installs the toolchain (the cpu backend, at load).
void set_kernel_toolchain(const KernelToolchain& toolchain);
/// The installed toolchain; RuntimeError naming `what` when none is.
const KernelToolchain& kernel_toolchain(const char* what);

}  // namespace protean::cache
