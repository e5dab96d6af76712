#include "device/runtime.h"

#include <fmt/format.h>

#include <bit>
#include <map>
#include <memory>
#include <atomic>
#include <mutex>
#include <vector>

#include "protean/error.h"

namespace protean::cuda {

namespace {

struct DeviceState {
  const DriverApi* api = nullptr;
  DeviceInfo info;
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  std::mutex mu;  // allocator
  std::map<size_t, std::vector<CUdeviceptr>> free_lists;
  AllocatorStats stats;
};

struct Runtime {
  std::mutex mu;
  const DriverApi* api = nullptr;
  std::vector<std::unique_ptr<DeviceState>> devices;
};

Runtime& rt() {
  static auto* r = new Runtime;  // never destroyed: device storages may die during static destruction
  return *r;
}

/// Bumped whenever device states are destroyed (a driver change, a reset): invalidates every
/// thread's cached current device (ThreadCurrent).
std::atomic<uint64_t> g_generation{1};

std::mutex g_hooks_mu;
std::vector<std::function<void(int)>>& ready_hooks() {
  static auto* h = new std::vector<std::function<void(int)>>;
  return *h;
}

/// The device this thread made current last (its primary context), valid while the generation holds:
/// a call for the same device then takes neither the runtime's lock nor the driver's cuCtxSetCurrent
/// (both per launch, allocation and free otherwise). Protean assumes the thread's current context is
/// not switched to another context between its calls (the CUDA runtime and PyTorch use the same
/// primary context).
struct ThreadCurrent {
  uint64_t generation = 0;
  int device = -1;
  DeviceState* state = nullptr;
};
thread_local ThreadCurrent t_current;

DeviceState& state(int device) {
  const DriverApi& api = require_driver("a CUDA tensor or kernel");
  Runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.mu);
  if (r.api != &api) {
    r.api = &api;
    g_generation.fetch_add(1, std::memory_order_acq_rel);
    r.devices.clear();
  }
  if (r.devices.empty()) {
    int n = 0;
    check(api.cuDeviceGetCount(&n), "cuDeviceGetCount");
    r.devices.resize(static_cast<size_t>(std::max(n, 0)));
  }
  if (device < 0 || static_cast<size_t>(device) >= r.devices.size())
    throw RuntimeError(fmt::format("CUDA device index {} is out of range: the driver sees {} device(s) (cuda:0 .. cuda:{})",
                                   device, r.devices.size(), static_cast<int>(r.devices.size()) - 1));
  auto& slot = r.devices[static_cast<size_t>(device)];
  if (!slot) {
    auto s = std::make_unique<DeviceState>();
    s->api = &api;
    CUdevice dev = 0;
    check(api.cuDeviceGet(&dev, device), fmt::format("cuDeviceGet({})", device));
    check(api.cuDevicePrimaryCtxRetain(&s->ctx, dev), "cuDevicePrimaryCtxRetain");
    check(api.cuCtxSetCurrent(s->ctx), "cuCtxSetCurrent");
    check(api.cuStreamCreate(&s->stream, kStreamNonBlocking), "cuStreamCreate");
    char name[256] = {};
    check(api.cuDeviceGetName(name, sizeof(name) - 1, dev), "cuDeviceGetName");
    s->info.index = device;
    s->info.name = name;
    check(api.cuDeviceGetAttribute(&s->info.cc_major, kAttrComputeCapabilityMajor, dev), "cuDeviceGetAttribute(cc major)");
    check(api.cuDeviceGetAttribute(&s->info.cc_minor, kAttrComputeCapabilityMinor, dev), "cuDeviceGetAttribute(cc minor)");
    check(api.cuDeviceGetAttribute(&s->info.sm_count, kAttrMultiprocessorCount, dev), "cuDeviceGetAttribute(SM count)");
    if (api.cuDeviceGetAttribute(&s->info.l2_bytes, kAttrL2CacheSize, dev) != kCudaSuccess) s->info.l2_bytes = 0;
    check(api.cuDriverGetVersion(&s->info.driver_version), "cuDriverGetVersion");
    CUmemoryPool pool = nullptr;
    check(api.cuDeviceGetDefaultMemPool(&pool, dev), "cuDeviceGetDefaultMemPool");
    uint64_t keep_all = UINT64_MAX;
    check(api.cuMemPoolSetAttribute(pool, kMemPoolAttrReleaseThreshold, &keep_all),
          "cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)");
    slot = std::move(s);
    DeviceState& made = *slot;
    // The new context is now current on this thread: what current() remembers for the thread must say
    // so, or its next call for the device it remembered would skip cuCtxSetCurrent and run in this
    // one (a rank on cuda:1 that touched cuda:0 once had every later copy fail with
    // CUDA_ERROR_INVALID_VALUE).
    t_current = {g_generation.load(std::memory_order_acquire), device, &made};
    lock.unlock();
    std::vector<std::function<void(int)>> hooks;
    {
      std::lock_guard<std::mutex> h(g_hooks_mu);
      hooks = ready_hooks();
    }
    for (const auto& f : hooks) f(device);
    return made;
  }
  return *slot;
}

DeviceState& current(int device) {
  ThreadCurrent& t = t_current;
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (t.generation == gen && t.device == device) return *t.state;
  DeviceState& s = state(device);
  check(s.api->cuCtxSetCurrent(s.ctx), "cuCtxSetCurrent");
  t = {gen, device, &s};
  return s;
}

void free_cached_locked(DeviceState& s) {
  for (auto& [cls, list] : s.free_lists) {
    for (CUdeviceptr p : list) {
      check(s.api->cuMemFreeAsync(p, s.stream), fmt::format("cuMemFreeAsync({} bytes)", cls));
      ++s.stats.driver_frees;
      s.stats.bytes_cached -= static_cast<int64_t>(cls);
    }
  }
  s.free_lists.clear();
}

}  // namespace

void add_device_ready_hook(std::function<void(int device)> f) {
  std::lock_guard<std::mutex> h(g_hooks_mu);
  ready_hooks().push_back(std::move(f));
}

void reset_runtime_for_driver_change() {
  Runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  g_generation.fetch_add(1, std::memory_order_acq_rel);
  for (auto& d : r.devices) {
    if (!d) continue;
    std::lock_guard<std::mutex> dl(d->mu);
    try {
      free_cached_locked(*d);
      d->api->cuStreamSynchronize(d->stream);
      d->api->cuStreamDestroy(d->stream);
    } catch (const Error&) {  // a driver that fails while being replaced: its memory is abandoned
    }
  }
  r.devices.clear();
  r.api = nullptr;
}

int device_count() {
  const DriverApi* api = driver();
  if (!api) return 0;
  int n = 0;
  return api->cuDeviceGetCount(&n) == kCudaSuccess ? n : 0;
}

CUstream stream(int device) { return current(device).stream; }
const DeviceInfo& device_info(int device) { return state(device).info; }
void synchronize(int device) {
  DeviceState& s = current(device);
  check(s.api->cuStreamSynchronize(s.stream), fmt::format("cuStreamSynchronize(cuda:{})", device));
}

size_t allocation_size_class(size_t bytes) {
  constexpr size_t kSmall = 512;
  constexpr size_t kLarge = size_t{1} << 20;
  if (bytes == 0) return kSmall;
  if (bytes < kLarge) return (bytes + kSmall - 1) / kSmall * kSmall;
  // Four classes per power of two: [2^k, 2^k + 2^(k-2), ..., 2^(k+1)].
  size_t p = std::bit_floor(bytes);
  size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

CUdeviceptr device_allocate(int device, size_t bytes) {
  DeviceState& s = current(device);
  const size_t cls = allocation_size_class(bytes);
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stats.requests;
  auto it = s.free_lists.find(cls);
  if (it != s.free_lists.end() && !it->second.empty()) {
    CUdeviceptr p = it->second.back();
    it->second.pop_back();
    ++s.stats.cache_hits;
    s.stats.bytes_cached -= static_cast<int64_t>(cls);
    s.stats.bytes_in_use += static_cast<int64_t>(cls);
    return p;
  }
  CUdeviceptr p = 0;
  CUresult r = s.api->cuMemAllocAsync(&p, cls, s.stream);
  if (r == kCudaErrorOutOfMemory && !s.free_lists.empty()) {
    ++s.stats.oom_retries;
    free_cached_locked(s);
    check(s.api->cuStreamSynchronize(s.stream), "cuStreamSynchronize");
    r = s.api->cuMemAllocAsync(&p, cls, s.stream);
  }
  if (r != kCudaSuccess)
    throw RuntimeError(fmt::format("cuMemAllocAsync({} bytes on cuda:{}) failed: {}; {} bytes are in use by Protean "
                                   "tensors (free some, or lower the batch or sequence size)",
                                   cls, device, error_text(r), s.stats.bytes_in_use));
  ++s.stats.driver_allocs;
  s.stats.bytes_in_use += static_cast<int64_t>(cls);
  return p;
}

void device_free(int device, CUdeviceptr ptr, size_t bytes) {
  Runtime& r = rt();
  DeviceState* s = nullptr;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (device >= 0 && static_cast<size_t>(device) < r.devices.size()) s = r.devices[static_cast<size_t>(device)].get();
  }
  if (!s) return;  // the runtime was reset (driver replaced in a test): the block went with it
  const size_t cls = allocation_size_class(bytes);
  std::lock_guard<std::mutex> lock(s->mu);
  s->free_lists[cls].push_back(ptr);
  s->stats.bytes_in_use -= static_cast<int64_t>(cls);
  s->stats.bytes_cached += static_cast<int64_t>(cls);
}

void empty_cache(int device) {
  DeviceState& s = current(device);
  std::lock_guard<std::mutex> lock(s.mu);
  free_cached_locked(s);
}

AllocatorStats allocator_stats(int device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mu);
  return s.stats;
}

void reset_allocator_stats(int device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mu);
  AllocatorStats kept;
  kept.bytes_in_use = s.stats.bytes_in_use;
  kept.bytes_cached = s.stats.bytes_cached;
  s.stats = kept;
}

void copy_host_to_device(int device, CUdeviceptr dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& s = current(device);
  check(s.api->cuMemcpyHtoDAsync(dst, src, bytes, s.stream), fmt::format("cuMemcpyHtoDAsync({} bytes)", bytes));
}

void copy_device_to_host(int device, void* dst, CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& s = current(device);
  check(s.api->cuMemcpyDtoHAsync(dst, src, bytes, s.stream), fmt::format("cuMemcpyDtoHAsync({} bytes)", bytes));
  check(s.api->cuStreamSynchronize(s.stream), "cuStreamSynchronize (after a device-to-host copy)");
}

void copy_device_to_device(int device, CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& s = current(device);
  check(s.api->cuMemcpyDtoDAsync(dst, src, bytes, s.stream), fmt::format("cuMemcpyDtoDAsync({} bytes)", bytes));
}

void memset_device(int device, CUdeviceptr dst, unsigned char value, size_t bytes) {
  if (bytes == 0) return;
  DeviceState& s = current(device);
  check(s.api->cuMemsetD8Async(dst, value, bytes, s.stream), fmt::format("cuMemsetD8Async({} bytes)", bytes));
}

}  // namespace protean::cuda
