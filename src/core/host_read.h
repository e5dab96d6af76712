// Host reads of tensor data under capture, seen from core: Tensor::data_ptr(), item(), item_symint(),
// to_vector() and str() tell the hook installed on this thread before they read, so a capture can
// turn the read into a graph break or a symbol. The hook is the capture layer's ops::TraceHook
// (ops/dispatch.h), installed with ops::TraceHookScope; core only knows this interface, so it
// includes nothing above itself (the layering check in CMakeLists.txt enforces that).
#pragma once

#include <optional>

#include "protean/symint.h"
#include "protean/tensor.h"

namespace protean::core {

/// What a host read calls while a hook is installed on the thread.
class HostReadHook {
 public:
  virtual ~HostReadHook() = default;
  /// A host read of `t`'s data (`what`: "item()", "data_ptr()", ...). Returns to allow the read (the
  /// tensor is real), or throws to signal a graph break.
  virtual void on_host_read(const Tensor& t, const char* what) = 0;
  /// Tensor::item_symint() on `t`: the symbol standing for its value when the hook captures it, or
  /// std::nullopt to make it a host read. Default: std::nullopt.
  virtual std::optional<SymInt> on_item_symint(const Tensor& t) { return std::nullopt; }
};

/// The hook installed on this thread, or nullptr.
HostReadHook* current_host_read_hook();

/// RAII: installs `hook` (nullptr: none) on this thread for the scope, restoring the previous one.
/// ops::TraceHookScope installs trace hooks through it; core itself only suspends the hook
/// (`HostReadHookScope none(nullptr)`) while a read the hook has already seen runs, so every hook
/// installed is an ops::TraceHook.
class HostReadHookScope {
 public:
  explicit HostReadHookScope(HostReadHook* hook);
  ~HostReadHookScope();
  HostReadHookScope(const HostReadHookScope&) = delete;
  HostReadHookScope& operator=(const HostReadHookScope&) = delete;

 private:
  HostReadHook* prev_;
};

}  // namespace protean::core
