#include "device/fake_driver.h"

#include <cstdlib>
#include <cstring>

#include "protean/error.h"

namespace protean::cuda {

namespace {
FakeDriver* g_fake = nullptr;

struct FakeFunc {
  std::string name;
};

CUresult f_init(unsigned) { return kCudaSuccess; }
CUresult f_version(int* v) { *v = 13000; return kCudaSuccess; }
CUresult f_count(int* n) { *n = 1; return kCudaSuccess; }
CUresult f_get(CUdevice* d, int i) {
  if (i != 0) return kCudaErrorInvalidValue;
  *d = 0;
  return kCudaSuccess;
}
CUresult f_name(char* name, int len, CUdevice) {
  std::strncpy(name, "Fake CUDA device", static_cast<size_t>(len));
  return kCudaSuccess;
}
CUresult f_attr(int* v, int attrib, CUdevice) {
  switch (attrib) {
    case kAttrComputeCapabilityMajor: *v = 9; return kCudaSuccess;
    case kAttrComputeCapabilityMinor: *v = 0; return kCudaSuccess;
    case kAttrMultiprocessorCount: *v = 132; return kCudaSuccess;
    default: *v = 0; return kCudaSuccess;  // int attribute codes: not a project enum
  }
}
CUresult f_ctx_retain(CUcontext* c, CUdevice) {
  *c = reinterpret_cast<CUcontext>(uintptr_t{0x1000});
  return kCudaSuccess;
}
CUresult f_ctx_set(CUcontext) { return kCudaSuccess; }
CUresult f_stream_create(CUstream* s, unsigned) {
  *s = reinterpret_cast<CUstream>(uintptr_t{0x2000});
  return kCudaSuccess;
}
CUresult f_stream_sync(CUstream) {
  ++g_fake->stats_.stream_syncs;
  return kCudaSuccess;
}
CUresult f_stream_destroy(CUstream) { return kCudaSuccess; }
CUresult f_event_create(CUevent* e, unsigned) {
  *e = reinterpret_cast<CUevent>(new int(0));
  return kCudaSuccess;
}
CUresult f_event_record(CUevent, CUstream) { return kCudaSuccess; }
CUresult f_event_sync(CUevent) { return kCudaSuccess; }
CUresult f_event_elapsed(float* ms, CUevent, CUevent) { *ms = 0; return kCudaSuccess; }
CUresult f_event_destroy(CUevent e) {
  delete reinterpret_cast<int*>(e);
  return kCudaSuccess;
}
CUresult f_pool(CUmemoryPool* p, CUdevice) {
  *p = reinterpret_cast<CUmemoryPool>(uintptr_t{0x3000});
  return kCudaSuccess;
}
CUresult f_pool_attr(CUmemoryPool, int, void*) { return kCudaSuccess; }
CUresult f_alloc(CUdeviceptr* p, size_t bytes, CUstream) {
  if (g_fake->fail_allocs_ > 0) {
    --g_fake->fail_allocs_;
    return kCudaErrorOutOfMemory;
  }
  void* h = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!h) return kCudaErrorOutOfMemory;
  *p = reinterpret_cast<CUdeviceptr>(h);
  g_fake->blocks_[reinterpret_cast<uintptr_t>(h)] = bytes;
  ++g_fake->stats_.mem_alloc_async;
  ++g_fake->stats_.live_blocks;
  return kCudaSuccess;
}
CUresult f_free(CUdeviceptr p, CUstream) {
  auto it = g_fake->blocks_.find(static_cast<uintptr_t>(p));
  if (it == g_fake->blocks_.end()) return kCudaErrorInvalidValue;
  g_fake->blocks_.erase(it);
  std::free(reinterpret_cast<void*>(p));
  ++g_fake->stats_.mem_free_async;
  --g_fake->stats_.live_blocks;
  return kCudaSuccess;
}
CUresult f_htod(CUdeviceptr d, const void* s, size_t n, CUstream) {
  std::memcpy(reinterpret_cast<void*>(d), s, n);
  ++g_fake->stats_.htod;
  return kCudaSuccess;
}
CUresult f_dtoh(void* d, CUdeviceptr s, size_t n, CUstream) {
  std::memcpy(d, reinterpret_cast<const void*>(s), n);
  ++g_fake->stats_.dtoh;
  return kCudaSuccess;
}
CUresult f_dtod(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream) {
  std::memmove(reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), n);
  ++g_fake->stats_.dtod;
  return kCudaSuccess;
}
CUresult f_memset(CUdeviceptr d, unsigned char v, size_t n, CUstream) {
  std::memset(reinterpret_cast<void*>(d), v, n);
  ++g_fake->stats_.memset;
  return kCudaSuccess;
}
CUresult f_module_load(CUmodule* m, const void* image) {
  if (!image) return kCudaErrorInvalidValue;
  // A cubin is an ELF file; tests pass text. Keep up to the first NUL (ELF bytes are cut, which is
  // enough to tell images apart).
  g_fake->images_.emplace_back(static_cast<const char*>(image));
  ++g_fake->stats_.module_loads;
  *m = reinterpret_cast<CUmodule>(g_fake->images_.size());
  return kCudaSuccess;
}
CUresult f_module_unload(CUmodule) { return kCudaSuccess; }
CUresult f_get_function(CUfunction* f, CUmodule, const char* name) {
  if (!g_fake->kernels_.count(name)) {
    if (!g_fake->accept_any_) return kCudaErrorNotFound;
    g_fake->kernels_[name] = FakeDriver::Kernel{};
  }
  *f = reinterpret_cast<CUfunction>(new FakeFunc{name});  // leaked: functions live as long as modules
  return kCudaSuccess;
}
CUresult f_func_attr(CUfunction, int, int) { return kCudaSuccess; }
CUresult f_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shmem, CUstream, void** params, void** extra) {
  if (!fn || extra) return kCudaErrorInvalidValue;
  const auto* f = reinterpret_cast<const FakeFunc*>(fn);
  const auto& k = g_fake->kernels_.at(f->name);
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > 1024)
    return kCudaErrorInvalidValue;
  FakeLaunch l;
  l.kernel = f->name;
  l.grid[0] = gx, l.grid[1] = gy, l.grid[2] = gz;
  l.block[0] = bx, l.block[1] = by, l.block[2] = bz;
  l.shared_bytes = shmem;
  for (size_t i = 0; i < k.param_sizes.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(params[i]);
    l.params.emplace_back(p, p + k.param_sizes[i]);
  }
  ++g_fake->stats_.launches;
  if (k.body) k.body(l);
  g_fake->launches_.push_back(std::move(l));
  return kCudaSuccess;
}
CUresult f_begin_capture(CUstream, int) { return kCudaSuccess; }
CUresult f_end_capture(CUstream, CUgraph* g) {
  *g = reinterpret_cast<CUgraph>(uintptr_t{0x4000});
  return kCudaSuccess;
}
CUresult f_instantiate(CUgraphExec* e, CUgraph, unsigned long long) {
  *e = reinterpret_cast<CUgraphExec>(uintptr_t{0x5000});
  return kCudaSuccess;
}
CUresult f_graph_launch(CUgraphExec, CUstream) { return kCudaSuccess; }
CUresult f_graph_exec_destroy(CUgraphExec) { return kCudaSuccess; }
CUresult f_graph_destroy(CUgraph) { return kCudaSuccess; }
CUresult f_error_name(CUresult r, const char** s) {
  switch (r) {
    case kCudaSuccess: *s = "CUDA_SUCCESS"; return kCudaSuccess;
    case kCudaErrorInvalidValue: *s = "CUDA_ERROR_INVALID_VALUE"; return kCudaSuccess;
    case kCudaErrorOutOfMemory: *s = "CUDA_ERROR_OUT_OF_MEMORY"; return kCudaSuccess;
    case kCudaErrorNotFound: *s = "CUDA_ERROR_NOT_FOUND"; return kCudaSuccess;
    default: *s = nullptr; return kCudaErrorInvalidValue;  // CUresult is a plain int here
  }
}
CUresult f_error_string(CUresult r, const char** s) {
  *s = r == kCudaErrorOutOfMemory ? "out of memory" : nullptr;
  return *s ? kCudaSuccess : kCudaErrorInvalidValue;
}
}  // namespace

FakeDriver::FakeDriver() {
  if (g_fake) throw RuntimeError("FakeDriver: another FakeDriver is installed");
  g_fake = this;
  DriverApi& a = api_;
  a.name = "fake";
  a.cuInit = f_init;
  a.cuDriverGetVersion = f_version;
  a.cuDeviceGetCount = f_count;
  a.cuDeviceGet = f_get;
  a.cuDeviceGetName = f_name;
  a.cuDeviceGetAttribute = f_attr;
  a.cuDevicePrimaryCtxRetain = f_ctx_retain;
  a.cuCtxSetCurrent = f_ctx_set;
  a.cuStreamCreate = f_stream_create;
  a.cuStreamSynchronize = f_stream_sync;
  a.cuStreamDestroy = f_stream_destroy;
  a.cuEventCreate = f_event_create;
  a.cuEventRecord = f_event_record;
  a.cuEventSynchronize = f_event_sync;
  a.cuEventElapsedTime = f_event_elapsed;
  a.cuEventDestroy = f_event_destroy;
  a.cuDeviceGetDefaultMemPool = f_pool;
  a.cuMemPoolSetAttribute = f_pool_attr;
  a.cuMemAllocAsync = f_alloc;
  a.cuMemFreeAsync = f_free;
  a.cuMemcpyHtoDAsync = f_htod;
  a.cuMemcpyDtoHAsync = f_dtoh;
  a.cuMemcpyDtoDAsync = f_dtod;
  a.cuMemsetD8Async = f_memset;
  a.cuModuleLoadData = f_module_load;
  a.cuModuleUnload = f_module_unload;
  a.cuModuleGetFunction = f_get_function;
  a.cuFuncSetAttribute = f_func_attr;
  a.cuLaunchKernel = f_launch;
  a.cuStreamBeginCapture = f_begin_capture;
  a.cuStreamEndCapture = f_end_capture;
  a.cuGraphInstantiateWithFlags = f_instantiate;
  a.cuGraphLaunch = f_graph_launch;
  a.cuGraphExecDestroy = f_graph_exec_destroy;
  a.cuGraphDestroy = f_graph_destroy;
  a.cuGetErrorName = f_error_name;
  a.cuGetErrorString = f_error_string;
  set_driver_for_testing(&api_);
}

FakeDriver::~FakeDriver() {
  set_driver_for_testing(nullptr);
  for (auto& [p, n] : blocks_) std::free(reinterpret_cast<void*>(p));
  g_fake = nullptr;
}

void FakeDriver::define_kernel(const std::string& name, std::vector<size_t> param_sizes,
                               std::function<void(const FakeLaunch&)> body) {
  kernels_[name] = Kernel{std::move(param_sizes), std::move(body)};
}

}  // namespace protean::cuda
