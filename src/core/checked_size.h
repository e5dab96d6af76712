// Checked size arithmetic: the one place that turns a shape (and strides, and an element size) into
// an element count, a storage extent or a byte count. Every allocation (empty_strided, hence every
// factory and every kernel output), every view (ops::make_view), the .npy reader and the CLI's
// random inputs go through it, so a shape whose count does not fit is a ShapeError naming the shape
// and the caller, never a wrapped count (a tiny buffer indexed as a huge one).
//
// Limits: sizes and strides are >= 0; the element count and the extent fit in int64; the byte count
// fits in int64 (PTRDIFF_MAX on the supported 64-bit targets), so any byte offset inside the tensor
// is a valid ptrdiff_t. Sizes within these limits may still fail to allocate (an "out of memory"
// RuntimeError from Storage).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace protean::core {

/// The product of `sizes` (1 for rank 0). ShapeError "`what`: shape [..] has a negative size at dim
/// d" or "... has more elements than fit in 64 bits" otherwise; the product with empty dims counted
/// as 1 (what contiguous strides multiply) must fit too, so [0, 2^32, 2^32] is an error.
int64_t checked_numel(std::span<const int64_t> sizes, std::string_view what);

/// checked_numel(sizes) × `itemsize` bytes, with the same errors (the byte count must fit too).
int64_t checked_nbytes(std::span<const int64_t> sizes, size_t itemsize, std::string_view what);

/// Elements a strided layout spans: 1 + Σ (size_d − 1)·stride_d, or 0 when a size is 0; also checks
/// that the element count and its bytes fit, that strides are >= 0 and that extent × `itemsize` bytes fit.
/// `sizes` and `strides` have the same length (the caller checks).
int64_t checked_extent(std::span<const int64_t> sizes, std::span<const int64_t> strides, size_t itemsize,
                       std::string_view what);

/// While alive, every host Storage this thread allocates above `max_bytes` fails with a RuntimeError
/// ("... over the limit of N bytes for <what>") before any memory is taken: for work that must stay
/// small, such as the ONNX importer's load-time constant folding (a folded value above the limit stays
/// in the graph instead). Scopes nest; the innermost limit applies. Not a sandbox: other threads and
/// non-Storage allocations are not limited.
class HostAllocationLimit {
 public:
  HostAllocationLimit(uint64_t max_bytes, const char* what);
  ~HostAllocationLimit();
  HostAllocationLimit(const HostAllocationLimit&) = delete;
  HostAllocationLimit& operator=(const HostAllocationLimit&) = delete;

 private:
  uint64_t prev_bytes_;
  const char* prev_what_;
};
/// Throws the RuntimeError above when a HostAllocationLimit of this thread forbids `nbytes`.
void check_host_allocation(size_t nbytes);

}  // namespace protean::core
