#include "device/driver.h"

#include <fmt/format.h>

#include <cstdlib>
#include <mutex>

#include "device/dynamic_library.h"
#include "protean/error.h"

namespace protean::cuda {

static_assert(sizeof(KernelNodeParams) == 72, "KernelNodeParams must match cuda.h's CUDA_KERNEL_NODE_PARAMS_v2");


void reset_runtime_for_driver_change();  // runtime.cpp

namespace {

struct Loaded {
  DriverApi api;
  bool ok = false;
  std::string reason;
};

Loaded load_real() {
  Loaded l;
  const char* env = std::getenv("PROTEAN_CUDA_DRIVER");
  std::string path = env && *env ? env : "libcuda.so.1";
  std::string error;
  void* lib = open_first_library({path}, error);
  if (!lib) {
    l.reason = fmt::format("no CUDA driver found (dlopen {}: {})", path, error);
    return l;
  }
  DriverApi& a = l.api;
  a.name = "libcuda.so.1";
  std::string missing;
  bool ok = resolve_symbol(lib, a.cuInit, {"cuInit"}, missing) &&
            resolve_symbol(lib, a.cuDriverGetVersion, {"cuDriverGetVersion"}, missing) &&
            resolve_symbol(lib, a.cuDeviceGetCount, {"cuDeviceGetCount"}, missing) &&
            resolve_symbol(lib, a.cuDeviceGet, {"cuDeviceGet"}, missing) &&
            resolve_symbol(lib, a.cuDeviceGetName, {"cuDeviceGetName"}, missing) &&
            resolve_symbol(lib, a.cuDeviceGetAttribute, {"cuDeviceGetAttribute"}, missing) &&
            resolve_symbol(lib, a.cuDevicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, missing) &&
            resolve_symbol(lib, a.cuCtxSetCurrent, {"cuCtxSetCurrent"}, missing) &&
            resolve_symbol(lib, a.cuStreamCreate, {"cuStreamCreate"}, missing) &&
            resolve_symbol(lib, a.cuStreamSynchronize, {"cuStreamSynchronize"}, missing) &&
            resolve_symbol(lib, a.cuStreamDestroy, {"cuStreamDestroy_v2", "cuStreamDestroy"}, missing) &&
            resolve_symbol(lib, a.cuEventCreate, {"cuEventCreate"}, missing) &&
            resolve_symbol(lib, a.cuEventRecord, {"cuEventRecord"}, missing) &&
            resolve_symbol(lib, a.cuEventSynchronize, {"cuEventSynchronize"}, missing) &&
            resolve_symbol(lib, a.cuEventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}, missing) &&
            resolve_symbol(lib, a.cuEventDestroy, {"cuEventDestroy_v2", "cuEventDestroy"}, missing) &&
            resolve_symbol(lib, a.cuEventQuery, {"cuEventQuery"}, missing) &&
            resolve_symbol(lib, a.cuDeviceGetDefaultMemPool, {"cuDeviceGetDefaultMemPool"}, missing) &&
            resolve_symbol(lib, a.cuMemPoolSetAttribute, {"cuMemPoolSetAttribute"}, missing) &&
            resolve_symbol(lib, a.cuMemAllocAsync, {"cuMemAllocAsync"}, missing) &&
            resolve_symbol(lib, a.cuMemFreeAsync, {"cuMemFreeAsync"}, missing) &&
            resolve_symbol(lib, a.cuMemcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, missing) &&
            resolve_symbol(lib, a.cuMemcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, missing) &&
            resolve_symbol(lib, a.cuMemcpyDtoDAsync, {"cuMemcpyDtoDAsync_v2"}, missing) &&
            resolve_symbol(lib, a.cuMemsetD8Async, {"cuMemsetD8Async"}, missing) &&
            resolve_symbol(lib, a.cuModuleLoadData, {"cuModuleLoadData"}, missing) &&
            resolve_symbol(lib, a.cuModuleUnload, {"cuModuleUnload"}, missing) &&
            resolve_symbol(lib, a.cuModuleGetFunction, {"cuModuleGetFunction"}, missing) &&
            resolve_symbol(lib, a.cuFuncSetAttribute, {"cuFuncSetAttribute"}, missing) &&
            resolve_symbol(lib, a.cuFuncGetAttribute, {"cuFuncGetAttribute"}, missing) &&
            resolve_symbol(lib, a.cuLaunchKernel, {"cuLaunchKernel"}, missing) &&
            resolve_symbol(lib, a.cuStreamBeginCapture, {"cuStreamBeginCapture_v2"}, missing) &&
            resolve_symbol(lib, a.cuStreamEndCapture, {"cuStreamEndCapture"}, missing) &&
            resolve_symbol(lib, a.cuGraphInstantiateWithFlags, {"cuGraphInstantiateWithFlags"}, missing) &&
            resolve_symbol(lib, a.cuGraphLaunch, {"cuGraphLaunch"}, missing) &&
            resolve_symbol(lib, a.cuGraphExecDestroy, {"cuGraphExecDestroy"}, missing) &&
            resolve_symbol(lib, a.cuGraphDestroy, {"cuGraphDestroy"}, missing) &&
            resolve_symbol(lib, a.cuGraphCreate, {"cuGraphCreate"}, missing) &&
            resolve_symbol(lib, a.cuGraphAddKernelNode, {"cuGraphAddKernelNode_v2"}, missing) &&
            resolve_symbol(lib, a.cuGraphExecKernelNodeSetParams, {"cuGraphExecKernelNodeSetParams_v2"}, missing) &&
            resolve_symbol(lib, a.cuGraphAddChildGraphNode, {"cuGraphAddChildGraphNode"}, missing) &&
            resolve_symbol(lib, a.cuGraphExecChildGraphNodeSetParams, {"cuGraphExecChildGraphNodeSetParams"}, missing) &&
            resolve_symbol(lib, a.cuGetErrorName, {"cuGetErrorName"}, missing) &&
            resolve_symbol(lib, a.cuGetErrorString, {"cuGetErrorString"}, missing);
  if (ok) {  // optional: programmatic dependent launch (CUDA 12.3+); launches fall back without them
    std::string unused;
    if (!resolve_symbol(lib, a.cuLaunchKernelEx, {"cuLaunchKernelEx"}, unused) ||
        !resolve_symbol(lib, a.cuGraphAddDependencies, {"cuGraphAddDependencies_v2"}, unused)) {
      a.cuLaunchKernelEx = nullptr;
      a.cuGraphAddDependencies = nullptr;
    }
    // optional: a graph's upload ahead of its first launch (CUDA 11.1+ drivers have it)
    if (!resolve_symbol(lib, a.cuGraphUpload, {"cuGraphUpload"}, unused)) a.cuGraphUpload = nullptr;
    // optional: TMA descriptors (the generated products; CUDA 12+ drivers have it)
    if (!resolve_symbol(lib, a.cuTensorMapEncodeTiled, {"cuTensorMapEncodeTiled"}, unused)) a.cuTensorMapEncodeTiled = nullptr;
    // optional: library calls as kernel nodes (all four, or none)
    if (!resolve_symbol(lib, a.cuGraphGetNodes, {"cuGraphGetNodes"}, unused) ||
        !resolve_symbol(lib, a.cuGraphNodeGetType, {"cuGraphNodeGetType"}, unused) ||
        !resolve_symbol(lib, a.cuGraphKernelNodeGetParams, {"cuGraphKernelNodeGetParams_v2"}, unused) ||
        !resolve_symbol(lib, a.cuGraphKernelNodeCopyAttributes, {"cuGraphKernelNodeCopyAttributes"}, unused)) {
      a.cuGraphGetNodes = nullptr;
      a.cuGraphNodeGetType = nullptr;
      a.cuGraphKernelNodeGetParams = nullptr;
      a.cuGraphKernelNodeCopyAttributes = nullptr;
    }
  }
  if (!ok) {
    l.reason = fmt::format("the CUDA driver {} lacks {} (driver too old; Protean needs CUDA 12 or newer)", path, missing);
    return l;
  }
  CUresult r = a.cuInit(0);
  if (r != kCudaSuccess) {
    const char* name = nullptr;
    a.cuGetErrorName(r, &name);
    l.reason = fmt::format("no CUDA device usable: cuInit failed with {}", name ? name : std::to_string(r));
    return l;
  }
  int n = 0;
  r = a.cuDeviceGetCount(&n);
  if (r != kCudaSuccess || n <= 0) {
    l.reason = "no CUDA device found (cuDeviceGetCount reports none)";
    return l;
  }
  l.ok = true;
  return l;  // the library stays loaded for the process
}

std::mutex g_mu;
const DriverApi* g_test = nullptr;
bool g_test_set = false;

const Loaded& real() {
  static const Loaded l = load_real();
  return l;
}

}  // namespace

const DriverApi* driver() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_test_set) return g_test;
  }
  const Loaded& l = real();
  return l.ok ? &l.api : nullptr;
}

std::string driver_unavailable_reason() {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_test_set) return g_test ? "" : "no CUDA driver found (a test removed it)";
  }
  return real().ok ? "" : real().reason;
}

const DriverApi& require_driver(std::string_view what) {
  if (const DriverApi* d = driver()) return *d;
  throw RuntimeError(fmt::format("{} needs a CUDA device: {}", what, driver_unavailable_reason()));
}

void set_driver_for_testing(const DriverApi* api) {
  reset_runtime_for_driver_change();
  std::lock_guard<std::mutex> lock(g_mu);
  g_test = api;
  g_test_set = api != nullptr;
}

std::string error_text(CUresult r) {
  const DriverApi* d = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    d = g_test_set ? g_test : (real().api.cuGetErrorName ? &real().api : nullptr);
  }
  const char* name = nullptr;
  const char* text = nullptr;
  if (d && d->cuGetErrorName) d->cuGetErrorName(r, &name);
  if (d && d->cuGetErrorString) d->cuGetErrorString(r, &text);
  if (!name) return fmt::format("CUresult {}", r);
  return text ? fmt::format("{} ({})", name, text) : std::string(name);
}

void check(CUresult r, std::string_view call) {
  if (r == kCudaSuccess) return;
  throw RuntimeError(fmt::format("{} failed: {}", call, error_text(r)));
}

}  // namespace protean::cuda
