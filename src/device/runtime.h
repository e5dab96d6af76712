// CUDA device runtime: per-device primary context and stream, the stream-ordered caching allocator,
// and host <-> device copies. Everything Protean runs on a device is ordered on that device's one
// stream (created non-blocking on first use), so a freed block can be handed to the next allocation
// at once: later work on the same stream runs after every earlier use of it (the rule PyTorch's
// CUDA caching allocator relies on for single-stream use).
//
// Allocator (mirrors c10::cuda::CUDACachingAllocator's steady state): sizes are rounded up to a size
// class (multiples of 512 B below 1 MiB; above, four classes per power of two, at most 25% slack);
// freed blocks go to a per-class free list and serve the next request of that class without a driver
// call. Misses allocate with cuMemAllocAsync from the device's default memory pool, whose release
// threshold is raised to "keep everything", so even the driver pool does not return memory to the OS
// between calls. On CUDA_ERROR_OUT_OF_MEMORY the cache is emptied (cuMemFreeAsync of every cached
// block, stream synchronised) and the allocation retried once before the error is thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "device/driver.h"

namespace protean::cuda {

/// Properties read once per device.
struct DeviceInfo {
  int index = 0;
  std::string name;       ///< "NVIDIA H200"
  int cc_major = 0;       ///< compute capability (9.0 for Hopper)
  int cc_minor = 0;
  int sm_count = 0;
  int l2_bytes = 0;       ///< L2 cache size in bytes (60 MiB on the H200; 0 when the driver does not say)
  int driver_version = 0; ///< cuDriverGetVersion: 13000 = CUDA 13.0
};

/// Number of devices the driver sees (0 without a driver; never throws).
int device_count();
/// Makes `device`'s primary context current on this thread and returns its stream. Throws
/// RuntimeError without a driver or for an index out of range.
CUstream stream(int device);
const DeviceInfo& device_info(int device);
/// Blocks until all work queued on `device`'s stream has finished (cuStreamSynchronize).
void synchronize(int device);
/// Registers `f` to run once for each device this process starts using, right after its context and
/// stream are made, on the thread that first used it (outside the runtime's lock). Layers above the
/// driver use it to start one-time work early (the cuda backend's cuBLASLt warm-up). `f` must not
/// throw; hooks added after a device started do not run for it.
void add_device_ready_hook(std::function<void(int device)> f);

struct AllocatorStats {
  int64_t driver_allocs = 0;  ///< cuMemAllocAsync calls
  int64_t driver_frees = 0;   ///< cuMemFreeAsync calls
  int64_t cache_hits = 0;     ///< allocations served from the free lists
  int64_t requests = 0;       ///< allocate() calls
  int64_t bytes_in_use = 0;   ///< rounded bytes handed out and not yet freed
  int64_t bytes_cached = 0;   ///< rounded bytes on the free lists
  int64_t oom_retries = 0;    ///< allocations retried after emptying the cache
};

/// The size class `bytes` is rounded up to (>= 512; 0 bytes take one 512-byte block).
size_t allocation_size_class(size_t bytes);
/// A device block of at least `bytes`, 256-byte aligned, ordered on `device`'s stream. Throws
/// RuntimeError naming the size and the allocator's state when the device is out of memory.
CUdeviceptr device_allocate(int device, size_t bytes);
/// Returns a block from device_allocate (same `bytes`) to its free list.
void device_free(int device, CUdeviceptr ptr, size_t bytes);
/// Frees every cached block back to the driver pool (torch.cuda.empty_cache()).
void empty_cache(int device);
AllocatorStats allocator_stats(int device);
void reset_allocator_stats(int device);

/// Copies (queued on the device's stream). host_to_device returns once `src` may be reused (the
/// driver stages pageable memory); device_to_host returns when the bytes are in `dst`.
void copy_host_to_device(int device, CUdeviceptr dst, const void* src, size_t bytes);
void copy_device_to_host(int device, void* dst, CUdeviceptr src, size_t bytes);
void copy_device_to_device(int device, CUdeviceptr dst, CUdeviceptr src, size_t bytes);
void memset_device(int device, CUdeviceptr dst, unsigned char value, size_t bytes);

}  // namespace protean::cuda
