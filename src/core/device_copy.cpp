#include "core/device_copy.h"

#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "device/runtime.h"

namespace protean::core {

void copy_storage_bytes(const Storage& dst, size_t dst_offset, const Storage& src, size_t src_offset, size_t bytes) {
  if (bytes == 0) return;
  if (dst_offset + bytes > dst.nbytes() || src_offset + bytes > src.nbytes())
    throw RuntimeError(fmt::format("copy of {} bytes outside a storage ({} bytes at {} into {} bytes at {})", bytes,
                                   src.nbytes(), src_offset, dst.nbytes(), dst_offset));
  const Device d = dst.device(), s = src.device();
  char* dp = static_cast<char*>(dst.data()) + dst_offset;
  const char* sp = static_cast<const char*>(src.data()) + src_offset;
  auto dev = [](const char* p) { return reinterpret_cast<cuda::CUdeviceptr>(p); };
  if (d.type == DeviceType::CPU && s.type == DeviceType::CPU) {
    std::memmove(dp, sp, bytes);
  } else if (d.type == DeviceType::CPU) {
    cuda::copy_device_to_host(s.index, dp, dev(sp), bytes);
  } else if (s.type == DeviceType::CPU) {
    cuda::copy_host_to_device(d.index, dev(dp), sp, bytes);
  } else if (d == s) {
    cuda::copy_device_to_device(d.index, dev(dp), dev(sp), bytes);
  } else {  // two CUDA devices: through the host
    std::vector<char> host(bytes);
    cuda::copy_device_to_host(s.index, host.data(), dev(sp), bytes);
    cuda::copy_host_to_device(d.index, dev(dp), host.data(), bytes);
  }
}

void copy_into(const Tensor& dst, const Tensor& src, const char* what) {
  if (dst.dtype() != src.dtype() || dst.int_numel() != src.int_numel())
    throw RuntimeError(fmt::format("{}: {} values of {} where {} of {} were expected", what, src.int_numel(),
                                   short_name(src.dtype()), dst.int_numel(), short_name(dst.dtype())));
  if (!dst.is_contiguous()) throw RuntimeError(fmt::format("{}: the destination is not contiguous", what));
  const Tensor c = src.is_contiguous() ? src : src.contiguous();
  const size_t item = dst.itemsize();
  const size_t doff = static_cast<size_t>(dst.storage_offset().hint()) * item;
  const size_t soff = static_cast<size_t>(c.storage_offset().hint()) * item;
  if (c.impl()->storage == dst.impl()->storage && doff == soff) return;  // the same bytes
  copy_storage_bytes(*dst.impl()->storage, doff, *c.impl()->storage, soff, static_cast<size_t>(dst.int_numel()) * item);
}

Tensor copy_of(const Tensor& t) {
  Tensor out = empty(t.int_sizes(), t.dtype(), t.device());
  copy_into(out, t, "copy");
  return out;
}

}  // namespace protean::core
