// An in-process stand-in for the CUDA driver, for tests on machines without a GPU. It implements
// DriverApi with host memory: allocations are aligned host blocks (so "device" pointers can be read
// back by the test), copies are memcpy, streams and events are counters, and cuLaunchKernel records
// every launch (function, grid, block, dynamic shared memory, the bytes of each parameter) and runs
// the host function a test defined for that kernel name, if any. It lets the caching allocator, the
// launch plan (argument blocks, grid rules) and copy logic be tested without a device.
//
// Usage:
//   FakeDriver fake;                    // installs itself (set_driver_for_testing); uninstalls on exit
//   fake.define_kernel("k0", {8, 8, 4}, [](const FakeLaunch& l) { ... });
//   ... run code that allocates, copies and launches ...
//   EXPECT_EQ(fake.stats().mem_alloc_async, 2);
// One FakeDriver at a time per process. Not thread-safe against concurrent launches.
#pragma once

#include <atomic>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "device/driver.h"

namespace protean::cuda {

struct FakeLaunch {
  std::string kernel;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  std::vector<std::vector<uint8_t>> params;  ///< bytes of each parameter (sizes from define_kernel)
  bool from_graph = false;                   ///< run by cuGraphLaunch (a node of an instantiated graph)
  /// launched with programmatic stream serialization (cuLaunchKernelEx), or a graph node on a
  /// programmatic edge (cuGraphAddDependencies)
  bool programmatic = false;
  unsigned cluster = 1;  ///< blocks per thread-block cluster (the kernel's set_cluster_width, else 1)
  /// Parameter `i` read as T (its size must be sizeof(T)).
  template <typename T> T param(size_t i) const;
};

struct FakeDriverStats {
  int64_t mem_alloc_async = 0;
  int64_t mem_free_async = 0;
  int64_t htod = 0, dtoh = 0, dtod = 0, memset = 0;
  int64_t module_loads = 0;
  int64_t launches = 0;
  int64_t stream_syncs = 0;
  int64_t live_blocks = 0;
  int64_t graphs_created = 0;     ///< cuGraphCreate and stream captures ended
  int64_t graph_nodes_added = 0;  ///< kernel nodes added (explicitly or by capture)
  int64_t instantiations = 0;
  int64_t graph_launches = 0;
  int64_t graph_uploads = 0;      ///< cuGraphUpload calls
  CUstream last_upload_stream = nullptr;  ///< the stream of the latest cuGraphUpload
  int64_t node_updates = 0;       ///< cuGraphExecKernelNodeSetParams
  int64_t child_nodes_added = 0;  ///< cuGraphAddChildGraphNode
  int64_t child_updates = 0;      ///< cuGraphExecChildGraphNodeSetParams
  int64_t live_graphs = 0, live_execs = 0;
  int64_t programmatic_launches = 0;  ///< cuLaunchKernelEx with programmatic stream serialization
  int64_t programmatic_edges = 0;     ///< programmatic edges added (cuGraphAddDependencies)
};

/// A kernel node of a fake graph: the launch parameters with the argument values copied at the time
/// the node was added or updated (as the driver does). A child-graph node has no kernel and holds a
/// copy of the child's nodes (`child`), run in order when the node runs.
struct FakeNode {
  std::string kernel;
  bool is_child = false;
  std::vector<FakeNode> child;
  unsigned grid[3] = {1, 1, 1};
  unsigned block[3] = {1, 1, 1};
  unsigned shared_bytes = 0;
  std::vector<std::vector<uint8_t>> params;
  bool programmatic = false;  ///< see FakeLaunch::programmatic
  unsigned cluster = 1;       ///< see FakeLaunch::cluster
};

class FakeDriver {
 public:
  FakeDriver();
  ~FakeDriver();
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;

  /// Declares a kernel every loaded module exports: its parameters' byte sizes and what a launch does.
  void define_kernel(const std::string& name, std::vector<size_t> param_sizes,
                     std::function<void(const FakeLaunch&)> body = {});
  /// Lets cuModuleGetFunction find any name (for real cubins from NVRTC): launches of kernels not
  /// declared with define_kernel are recorded with no parameter bytes and run nothing.
  void accept_any_kernel(bool on) { accept_any_ = on; }
  /// Kernel `name` declares a thread-block cluster of `width` blocks (__cluster_dims__(width, 1, 1)), as
  /// cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH) reports it: its launches and nodes
  /// record the width and a grid that is not a multiple of it fails (CUDA_ERROR_INVALID_CLUSTER_SIZE).
  void set_cluster_width(const std::string& name, unsigned width) { kernels_[name].cluster = width; }
  /// The compute capability the device reports (9.0 unless set; set it before the first device use).
  void set_compute_capability(int major, int minor) { cc_major_ = major, cc_minor_ = minor; }
  /// The number of devices the driver reports (1 unless set; set it before the first device use). With
  /// more than one, each device has its own primary context and its streams belong to the context
  /// that was current when they were made; cuMemcpyHtoDAsync on a stream whose context is not the
  /// calling thread's current one fails with CUDA_ERROR_INVALID_VALUE, as the real driver does.
  void set_device_count(int n) { device_count_ = n; }
  /// With `on`, cuEventQuery reports every event not ready (work that never finishes: a collective a
  /// peer never joins); otherwise every event is done.
  void stall_events(bool on) { events_stall_ = on; }
  /// Makes the next `n` cuMemAllocAsync calls fail with CUDA_ERROR_OUT_OF_MEMORY.
  void fail_next_allocs(int n) { fail_allocs_ = n; }
  /// Bytes of the images loaded with cuModuleLoadData, in order.
  const std::vector<std::string>& loaded_images() const { return images_; }
  const std::vector<FakeLaunch>& launches() const { return launches_; }
  void clear_launches() { launches_.clear(); }
  const FakeDriverStats& stats() const { return stats_; }
  const DriverApi& api() const { return api_; }

  // Internal state the C entry points use.
  struct Kernel {
    std::vector<size_t> param_sizes;
    std::function<void(const FakeLaunch&)> body;
    unsigned cluster = 0;  ///< set_cluster_width (0: none)
  };
  std::map<std::string, Kernel> kernels_;
  struct Graph {
    std::vector<FakeNode> nodes;
  };
  CUstream capturing_ = nullptr;     // the stream being captured, if any
  Graph* capture_graph_ = nullptr;
  std::map<uintptr_t, size_t> blocks_;
  std::vector<std::string> images_;
  std::vector<FakeLaunch> launches_;
  FakeDriverStats stats_;
  int fail_allocs_ = 0;
  int cc_major_ = 9, cc_minor_ = 0;
  int device_count_ = 1;
  std::atomic<bool> events_stall_{false};
  bool accept_any_ = false;

 private:
  DriverApi api_;
};

template <typename T>
T FakeLaunch::param(size_t i) const {
  T v{};
  const auto& b = params.at(i);
  if (b.size() != sizeof(T)) throw std::out_of_range("FakeLaunch::param: size mismatch");
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

}  // namespace protean::cuda
