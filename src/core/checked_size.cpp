#include "core/checked_size.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "protean/error.h"

namespace protean::core {

namespace {

std::string shape_text(std::span<const int64_t> sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

[[noreturn]] void too_large(std::span<const int64_t> sizes, std::string_view what, std::string_view detail) {
  throw ShapeError(fmt::format("{}: shape {} {}; the largest tensor holds 2^63 - 1 bytes", what, shape_text(sizes),
                               detail));
}

void check_sizes(std::span<const int64_t> sizes, std::string_view what) {
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] < 0)
      throw ShapeError(fmt::format("{}: shape {} has a negative size at dim {}", what, shape_text(sizes), d));
}

}  // namespace

int64_t checked_numel(std::span<const int64_t> sizes, std::string_view what) {
  check_sizes(sizes, what);
  // Empty dims count as 1 here: contiguous strides are products of max(size, 1), so an empty
  // [0, 2^40, 2^40] would overflow them (found by the npy fuzz target).
  int64_t n = 1;
  bool zero = false;
  for (int64_t s : sizes) {
    zero |= s == 0;
    if (__builtin_mul_overflow(n, std::max<int64_t>(s, 1), &n))
      too_large(sizes, what, zero ? "has more elements than fit in 64 bits (empty dims counted as 1, as strides count them)"
                                  : "has more elements than fit in 64 bits");
  }
  return zero ? 0 : n;
}

int64_t checked_nbytes(std::span<const int64_t> sizes, size_t itemsize, std::string_view what) {
  int64_t n = checked_numel(sizes, what), bytes = 0;
  if (__builtin_mul_overflow(n, static_cast<int64_t>(itemsize), &bytes))
    too_large(sizes, what, fmt::format("of {}-byte elements needs more bytes than fit in 64 bits ({} elements)", itemsize, n));
  return bytes;
}

int64_t checked_extent(std::span<const int64_t> sizes, std::span<const int64_t> strides, size_t itemsize,
                       std::string_view what) {
  // The element count, in bytes, must fit even where the span is smaller (a stride-0 expand).
  if (checked_nbytes(sizes, itemsize, what) == 0) return 0;
  int64_t extent = 1, term = 0, bytes = 0;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (strides[d] < 0)
      throw ShapeError(fmt::format("{}: shape {} has a negative stride {} at dim {} (not supported)", what,
                                   shape_text(sizes), strides[d], d));
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &term) || __builtin_add_overflow(extent, term, &extent))
      too_large(sizes, what, fmt::format("with strides [{}] spans more elements than fit in 64 bits", fmt::join(strides, ", ")));
  }
  if (__builtin_mul_overflow(extent, static_cast<int64_t>(itemsize), &bytes))
    too_large(sizes, what, fmt::format("of {}-byte elements spans more bytes than fit in 64 bits", itemsize));
  return extent;
}

namespace {
thread_local uint64_t t_limit_bytes = UINT64_MAX;
thread_local const char* t_limit_what = nullptr;
}  // namespace

HostAllocationLimit::HostAllocationLimit(uint64_t max_bytes, const char* what)
    : prev_bytes_(t_limit_bytes), prev_what_(t_limit_what) {
  t_limit_bytes = max_bytes;
  t_limit_what = what;
}
HostAllocationLimit::~HostAllocationLimit() {
  t_limit_bytes = prev_bytes_;
  t_limit_what = prev_what_;
}

void check_host_allocation(size_t nbytes) {
  if (nbytes > t_limit_bytes) [[unlikely]]
    throw RuntimeError(fmt::format("allocating {} bytes is over the limit of {} bytes for {}", nbytes, t_limit_bytes,
                                   t_limit_what ? t_limit_what : "this scope"));
}

}  // namespace protean::core
