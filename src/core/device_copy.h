// Byte copies between storages on any devices (host memcpy, or the CUDA device's stream), for code
// that moves tensors without running an op: Module::to, compile_train_step's arenas.
#pragma once

#include <cstddef>

#include "protean/tensor.h"

namespace protean::core {

/// Copies `bytes` from `src` (at byte `src_offset`) to `dst` (at byte `dst_offset`): memcpy between
/// host storages; host→device, device→host and device→device copies queued on the device's stream
/// (device→host has finished on return); between two CUDA devices through a host copy. The ranges
/// must lie inside the storages (RuntimeError otherwise). Never reads device memory from the host.
void copy_storage_bytes(const Storage& dst, size_t dst_offset, const Storage& src, size_t src_offset, size_t bytes);

/// Copies `src`'s elements in row-major order into `dst`, which must be contiguous with the same
/// dtype and numel (RuntimeError naming `what` otherwise); either may be on any device. A strided
/// device `src` is made contiguous first (an eager copy through the host). Bumps nothing: callers
/// that need the version counter bumped do it.
void copy_into(const Tensor& dst, const Tensor& src, const char* what);

/// A contiguous copy of `t` on its own device (device→device on a CUDA device).
Tensor copy_of(const Tensor& t);

}  // namespace protean::core
