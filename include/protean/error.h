// Error hierarchy. Every failure a user can cause is reported by throwing one of these; Protean never
// aborts on bad input. Messages name what failed, the inputs involved (shapes, dtypes, sources), where
// (user file:line when known) and what would have been valid.
#pragma once

#include <stdexcept>
#include <string>

namespace protean {

/// Base of every Protean error.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
/// Wrong argument value: bad dim, bad size list, unknown name.  (PyTorch raises IndexError/ValueError.)
class ValueError : public Error { using Error::Error; };
/// Shapes that do not fit the op (broadcast failure, matmul inner dims, reshape numel).
class ShapeError : public Error { using Error::Error; };
/// A dtype the op does not support, or mismatched dtypes where promotion is not allowed.
class TypeError : public Error { using Error::Error; };
/// The feature exists in the contract but not for this input (e.g. CUDA device before the CUDA backend).
class NotImplementedError : public Error { using Error::Error; };
/// Malformed files: .npy, ONNX, caches, profiles, traces. The message names the file.
class FormatError : public Error { using Error::Error; };
/// Compilation problems: graph breaks under fullgraph, recompile limit with fail_on_recompile,
/// a strict mark_dynamic that got specialized, code generation/toolchain failures.
class CompileError : public Error { using Error::Error; };
/// I/O and environment: unreadable files, dead remote stores when they are required, MPI timeouts.
class RuntimeError : public Error { using Error::Error; };

}  // namespace protean
