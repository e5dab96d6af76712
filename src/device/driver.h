// The CUDA driver API as one table of function pointers, loaded at run time.
//
// Protean never links against libcuda: `driver()` dlopen's libcuda.so.1 on first use and resolves
// the entry points it needs (the versioned names that cuda.h maps its API names to, e.g.
// cuMemcpyHtoDAsync_v2). On a machine without a driver (or without a device) `driver()` returns
// nullptr and `driver_unavailable_reason()` says why, so the library builds, links and runs its CPU
// paths anywhere. Tests install an in-process fake (fake_driver.h) with `set_driver_for_testing`.
//
// Types are declared here (opaque handles with cuda.h's layouts) so no CUDA header is needed to
// build. Every CUresult other than CUDA_SUCCESS is turned into a protean::RuntimeError naming the
// call and the driver's error name ("cuMemAllocAsync(67108864 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY
// (out of memory)") by `check`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace protean::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUstream_st;
struct CUevent_st;
struct CUmod_st;
struct CUfunc_st;
struct CUmemPoolHandle_st;
struct CUgraph_st;
struct CUgraphExec_st;
struct CUgraphNode_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUmemoryPool = CUmemPoolHandle_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;
using CUgraphNode = CUgraphNode_st*;

/// cuda.h's CU_GRAPH_NODE_TYPE_KERNEL (cuGraphNodeGetType).
inline constexpr int kGraphNodeTypeKernel = 0;

/// cuda.h's CUDA_KERNEL_NODE_PARAMS (the _v2 layout that cuGraphAddKernelNode_v2 and
/// cuGraphExecKernelNodeSetParams_v2 take since CUDA 12). `kern` and `ctx` stay null: `func` is set.
struct KernelNodeParams {
  CUfunction func = nullptr;
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned shared_bytes = 0;
  void** kernel_params = nullptr;
  void** extra = nullptr;
  void* kern = nullptr;  // CUkernel
  CUcontext ctx = nullptr;
};

/// cuda.h's CUlaunchAttribute (an id, padding to 8 bytes, a 64-byte value union). Protean sets only
/// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, whose value is an int.
struct LaunchAttribute {
  int id = 0;
  char pad[4] = {};
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value{};
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");

/// cuda.h's CUlaunchConfig: what cuLaunchKernelEx takes instead of cuLaunchKernel's dimensions.
struct LaunchConfig {
  unsigned grid_x = 1, grid_y = 1, grid_z = 1;
  unsigned block_x = 1, block_y = 1, block_z = 1;
  unsigned shared_bytes = 0;
  CUstream stream = nullptr;
  const LaunchAttribute* attrs = nullptr;
  unsigned num_attrs = 0;
};

/// cuda.h's CUgraphEdgeData (CUDA 12.3+): the kind of one graph edge. Zeroes are a plain edge (the
/// downstream node starts after the upstream one completed, its writes visible).
struct GraphEdgeData {
  unsigned char from_port = 0;
  unsigned char to_port = 0;
  unsigned char type = 0;
  unsigned char reserved[5] = {};
};
static_assert(sizeof(GraphEdgeData) == 8, "CUgraphEdgeData is 8 bytes");

// The few enum values Protean passes (values from cuda.h, CUDA 12/13).
inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorNotReady = 600;  ///< cuEventQuery: the event's work is not done yet
inline constexpr CUresult kCudaErrorOutOfMemory = 2;
inline constexpr CUresult kCudaErrorNoDevice = 100;
inline constexpr CUresult kCudaErrorNotFound = 500;
inline constexpr unsigned kStreamNonBlocking = 0x1;
inline constexpr int kAttrMultiprocessorCount = 16;
inline constexpr int kAttrComputeCapabilityMajor = 75;
inline constexpr int kAttrComputeCapabilityMinor = 76;
inline constexpr int kAttrL2CacheSize = 38;
inline constexpr int kFuncAttrMaxDynamicSharedBytes = 8;
inline constexpr int kFuncAttrRequiredClusterWidth = 11;  // CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH
inline constexpr CUresult kCudaErrorInvalidClusterSize = 912;
inline constexpr int kMemPoolAttrReleaseThreshold = 4;
inline constexpr int kStreamCaptureModeThreadLocal = 1;
inline constexpr int kLaunchAttrProgrammaticStreamSerialization = 6;  // CU_LAUNCH_ATTRIBUTE_...
inline constexpr unsigned char kGraphDependencyProgrammatic = 1;     // CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
inline constexpr unsigned char kGraphKernelPortProgrammatic = 1;     // CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
inline constexpr int kTensorMapBfloat16 = 9;                          // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
inline constexpr int kTensorMapSwizzle128B = 3;                       // CU_TENSOR_MAP_SWIZZLE_128B
inline constexpr int kTensorMapL2Promotion256B = 3;                   // CU_TENSOR_MAP_L2_PROMOTION_L2_256B

/// The driver entry points Protean uses. A field is never null in a table `driver()` returns, except
/// the two programmatic-launch entries (cuLaunchKernelEx, cuGraphAddDependencies), which are optional.
struct DriverApi {
  const char* name = "";  ///< "libcuda.so.1" or "fake"
  CUresult (*cuInit)(unsigned flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* dev, int ordinal) = nullptr;
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int* value, int attrib, CUdevice dev) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext ctx) = nullptr;
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream stream) = nullptr;  // cuStreamDestroy_v2
  CUresult (*cuEventCreate)(CUevent* event, unsigned flags) = nullptr;
  CUresult (*cuEventRecord)(CUevent event, CUstream stream) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent event) = nullptr;
  CUresult (*cuEventQuery)(CUevent event) = nullptr;  // kCudaSuccess when done, kCudaErrorNotReady before
  CUresult (*cuEventElapsedTime)(float* ms, CUevent start, CUevent end) = nullptr;  // _v2 where present
  CUresult (*cuEventDestroy)(CUevent event) = nullptr;                                // cuEventDestroy_v2
  CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool* pool, CUdevice dev) = nullptr;
  CUresult (*cuMemPoolSetAttribute)(CUmemoryPool pool, int attr, void* value) = nullptr;
  CUresult (*cuMemAllocAsync)(CUdeviceptr* ptr, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemFreeAsync)(CUdeviceptr ptr, CUstream stream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemsetD8Async)(CUdeviceptr dst, unsigned char value, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuModuleLoadData)(CUmodule* module, const void* image) = nullptr;
  CUresult (*cuModuleUnload)(CUmodule module) = nullptr;
  CUresult (*cuModuleGetFunction)(CUfunction* fn, CUmodule module, const char* name) = nullptr;
  CUresult (*cuFuncSetAttribute)(CUfunction fn, int attrib, int value) = nullptr;
  // A function's attributes; Protean reads kFuncAttrRequiredClusterWidth: the blocks per thread-block
  // cluster an entry declares with __cluster_dims__ (0 for none), which every launch of it then uses
  // (plain, Ex or as a graph node: the grid must be a multiple of it).
  CUresult (*cuFuncGetAttribute)(int* value, int attrib, CUfunction fn) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shared_bytes, CUstream stream, void** params,
                             void** extra) = nullptr;
  // Programmatic dependent launch (sm_90+, CUDA 12.3+ drivers): a kernel launched with
  // kLaunchAttrProgrammaticStreamSerialization, or joined to its graph predecessor by a programmatic
  // edge, may start before the kernel ahead of it has finished; it must execute
  // `griddepcontrol.wait` before it touches memory (every kernel Protean generates does: pt::
  // wait_prior_grids in the cuda prelude). Both fields are null on drivers that lack them: Protean
  // then launches as before.
  CUresult (*cuLaunchKernelEx)(const LaunchConfig* config, CUfunction fn, void** params, void** extra) = nullptr;
  CUresult (*cuGraphAddDependencies)(CUgraph graph, const CUgraphNode* from, const CUgraphNode* to,
                                     const GraphEdgeData* edges, size_t n) = nullptr;  // cuGraphAddDependencies_v2
  CUresult (*cuStreamBeginCapture)(CUstream stream, int mode) = nullptr;  // cuStreamBeginCapture_v2
  CUresult (*cuStreamEndCapture)(CUstream stream, CUgraph* graph) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec* exec, CUgraph graph, unsigned long long flags) = nullptr;
  CUresult (*cuGraphLaunch)(CUgraphExec exec, CUstream stream) = nullptr;
  // Optional (null when the driver lacks it): uploads an instantiated graph to the device without
  // running it, so that its first launch does not (backend/cuda/graphs.cpp, after each instantiation).
  CUresult (*cuGraphUpload)(CUgraphExec exec, CUstream stream) = nullptr;
  CUresult (*cuGraphExecDestroy)(CUgraphExec exec) = nullptr;
  CUresult (*cuGraphDestroy)(CUgraph graph) = nullptr;
  // Explicit graph building and node updates (mode "reduce-overhead", backend/cuda/graphs.h).
  CUresult (*cuGraphCreate)(CUgraph* graph, unsigned flags) = nullptr;
  CUresult (*cuGraphAddKernelNode)(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                                   const KernelNodeParams* params) = nullptr;  // cuGraphAddKernelNode_v2
  CUresult (*cuGraphExecKernelNodeSetParams)(CUgraphExec exec, CUgraphNode node,
                                             const KernelNodeParams* params) = nullptr;  // _v2
  // Library calls (cuBLASLt) captured on a stream become child-graph nodes; a new capture of the
  // same topology replaces one in an instantiated graph.
  CUresult (*cuGraphAddChildGraphNode)(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps, size_t ndeps,
                                       CUgraph child) = nullptr;
  CUresult (*cuGraphExecChildGraphNodeSetParams)(CUgraphExec exec, CUgraphNode node, CUgraph child) = nullptr;
  // Optional (null where the driver lacks one): a captured library call's kernel node copied into
  // another graph as a kernel node of its own (backend/cuda/graphs.h: library calls as kernel nodes).
  CUresult (*cuGraphGetNodes)(CUgraph graph, CUgraphNode* nodes, size_t* count) = nullptr;
  CUresult (*cuGraphNodeGetType)(CUgraphNode node, int* type) = nullptr;  ///< kGraphNodeTypeKernel, ...
  CUresult (*cuGraphKernelNodeGetParams)(CUgraphNode node, KernelNodeParams* params) = nullptr;  // _v2
  CUresult (*cuGraphKernelNodeCopyAttributes)(CUgraphNode dst, CUgraphNode src) = nullptr;
  // Optional (null where the driver lacks it, and on the fake): a TMA descriptor of a tiled tensor
  // (sm_90+), for the generated products (backend/cuda/hopper_gemm.h). `map` is 128 bytes, 64-aligned.
  CUresult (*cuTensorMapEncodeTiled)(void* map, int dtype, unsigned rank, void* global_address,
                                     const uint64_t* global_dim, const uint64_t* global_strides,
                                     const uint32_t* box_dim, const uint32_t* element_strides, int interleave,
                                     int swizzle, int l2_promotion, int oob_fill) = nullptr;
  CUresult (*cuGetErrorName)(CUresult error, const char** name) = nullptr;
  CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;
};

/// The process's driver table: the installed test driver if any, else libcuda.so.1 loaded and
/// initialised (cuInit(0), at least one device) on first call. nullptr when there is none; then
/// driver_unavailable_reason() says why. Thread-safe; the load is attempted once per process
/// (PROTEAN_CUDA_DRIVER names another library path, for tests and unusual installs).
const DriverApi* driver();
/// "" when driver() is usable, else e.g. "no CUDA driver found (dlopen libcuda.so.1: ... cannot open
/// shared object file)" or "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
std::string driver_unavailable_reason();
/// driver(), or throws RuntimeError("<what> needs a CUDA device: no CUDA driver found (...)").
const DriverApi& require_driver(std::string_view what);

/// Installs `api` as the process's driver (nullptr restores the real one). For tests: the fake
/// driver. Resets the device runtime (contexts, streams, allocator caches) of the previous driver,
/// whose memory must no longer be in use.
void set_driver_for_testing(const DriverApi* api);

/// Throws RuntimeError("<call> failed: <CUDA_ERROR_NAME> (<text>)") when `r` is not success.
void check(CUresult r, std::string_view call);
/// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)"; "CUresult 999" when the driver does not know it.
std::string error_text(CUresult r);

}  // namespace protean::cuda
