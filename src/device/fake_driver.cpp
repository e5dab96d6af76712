#include "device/fake_driver.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "protean/error.h"

namespace protean::cuda {

namespace {
FakeDriver* g_fake = nullptr;

struct FakeFunc {
  std::string name;
};

// One function handle per kernel name for the process's life: handles outlive the module and the
// FakeDriver that made them (programs cache them), and the same name always gives the same handle.
// Held by a static map, so nothing is leaked (LeakSanitizer sees them reachable).
CUfunction fake_function(const std::string& name) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::unique_ptr<FakeFunc>> functions;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<FakeFunc>& f = functions[name];
  if (!f) f = std::make_unique<FakeFunc>(FakeFunc{name});
  return reinterpret_cast<CUfunction>(f.get());
}

CUresult f_init(unsigned) { return kCudaSuccess; }
CUresult f_version(int* v) { *v = 13000; return kCudaSuccess; }
CUresult f_count(int* n) { *n = g_fake->device_count_; return kCudaSuccess; }
CUresult f_get(CUdevice* d, int i) {
  if (i < 0 || i >= g_fake->device_count_) return kCudaErrorInvalidValue;
  *d = i;
  return kCudaSuccess;
}
CUresult f_name(char* name, int len, CUdevice) {
  std::strncpy(name, "Fake CUDA device", static_cast<size_t>(len));
  return kCudaSuccess;
}
CUresult f_attr(int* v, int attrib, CUdevice) {
  switch (attrib) {
    case kAttrComputeCapabilityMajor: *v = g_fake->cc_major_; return kCudaSuccess;
    case kAttrComputeCapabilityMinor: *v = g_fake->cc_minor_; return kCudaSuccess;
    case kAttrMultiprocessorCount: *v = 132; return kCudaSuccess;
    case kAttrL2CacheSize: *v = 50 << 20; return kCudaSuccess;
    default: *v = 0; return kCudaSuccess;  // int attribute codes: not a project enum
  }
}
// Device d's primary context is 0x1000 + 0x100·d; a stream made while context c is current is
// 0x2000 + (c - 0x1000) + a serial number in the low byte, so that streams are told apart and their
// context can be read back from them.
thread_local uintptr_t t_fake_ctx = 0;  // the calling thread's current context (0: none set yet)
CUresult f_ctx_retain(CUcontext* c, CUdevice d) {
  *c = reinterpret_cast<CUcontext>(uintptr_t{0x1000} + uintptr_t{0x100} * static_cast<uintptr_t>(d));
  return kCudaSuccess;
}
CUresult f_ctx_set(CUcontext c) {
  t_fake_ctx = reinterpret_cast<uintptr_t>(c);
  return kCudaSuccess;
}
CUresult f_stream_create(CUstream* s, unsigned) {
  const uintptr_t ctx = t_fake_ctx ? t_fake_ctx : 0x1000;
  static std::atomic<uintptr_t> serial{0};
  *s = reinterpret_cast<CUstream>(uintptr_t{0x2000} + (ctx - 0x1000) + serial.fetch_add(1) % 0x100);
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
CUresult f_event_query(CUevent) { return g_fake->events_stall_ ? kCudaErrorNotReady : kCudaSuccess; }
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
CUresult f_htod(CUdeviceptr d, const void* s, size_t n, CUstream stream) {
  const uintptr_t st = reinterpret_cast<uintptr_t>(stream);
  if (g_fake->device_count_ > 1 && t_fake_ctx != 0 && st >= 0x2000 && st < 0x3000 && ((st - 0x2000) & ~uintptr_t{0xff}) + 0x1000 != t_fake_ctx)
    return kCudaErrorInvalidValue;  // a stream of another context than the current one
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
  *f = fake_function(name);
  return kCudaSuccess;
}
CUresult f_func_attr(CUfunction, int, int) { return kCudaSuccess; }
CUresult f_func_get_attr(int* v, int attrib, CUfunction fn) {
  if (!v || !fn) return kCudaErrorInvalidValue;
  const auto* f = reinterpret_cast<const FakeFunc*>(fn);
  *v = attrib == kFuncAttrRequiredClusterWidth ? static_cast<int>(g_fake->kernels_.at(f->name).cluster) : 0;
  return kCudaSuccess;
}
// Copies a launch's parameter bytes (sizes from define_kernel) into a node.
CUresult make_node(FakeNode& n, CUfunction fn, const unsigned g[3], const unsigned b[3], unsigned shmem, void** params,
                   void** extra) {
  if (!fn || extra) return kCudaErrorInvalidValue;
  const auto* f = reinterpret_cast<const FakeFunc*>(fn);
  const auto& k = g_fake->kernels_.at(f->name);
  if (g[0] == 0 || g[1] == 0 || g[2] == 0 || b[0] == 0 || b[1] == 0 || b[2] == 0 || b[0] * b[1] * b[2] > 1024)
    return kCudaErrorInvalidValue;
  if (k.cluster > 1 && g[0] % k.cluster != 0) return kCudaErrorInvalidClusterSize;
  n.kernel = f->name;
  n.cluster = k.cluster > 1 ? k.cluster : 1;
  for (int i = 0; i < 3; ++i) n.grid[i] = g[i], n.block[i] = b[i];
  n.shared_bytes = shmem;
  n.params.clear();
  for (size_t i = 0; i < k.param_sizes.size(); ++i) {
    const auto* p = static_cast<const uint8_t*>(params[i]);
    n.params.emplace_back(p, p + k.param_sizes[i]);
  }
  return kCudaSuccess;
}
void run_node(const FakeNode& n, bool from_graph) {
  if (n.is_child) {
    for (const FakeNode& c : n.child) run_node(c, from_graph);
    return;
  }
  FakeLaunch l;
  l.kernel = n.kernel;
  for (int i = 0; i < 3; ++i) l.grid[i] = n.grid[i], l.block[i] = n.block[i];
  l.shared_bytes = n.shared_bytes;
  l.params = n.params;
  l.from_graph = from_graph;
  l.programmatic = n.programmatic;
  l.cluster = n.cluster;
  ++g_fake->stats_.launches;
  const auto& k = g_fake->kernels_.at(n.kernel);
  if (k.body) k.body(l);
  g_fake->launches_.push_back(std::move(l));
}
CUresult f_launch(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                  unsigned shmem, CUstream stream, void** params, void** extra) {
  const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
  FakeNode n;
  if (CUresult r = make_node(n, fn, g, b, shmem, params, extra); r != kCudaSuccess) return r;
  if (g_fake->capturing_ && stream == g_fake->capturing_) {  // stream capture: a node, not a launch
    g_fake->capture_graph_->nodes.push_back(std::move(n));
    ++g_fake->stats_.graph_nodes_added;
    return kCudaSuccess;
  }
  run_node(n, false);
  return kCudaSuccess;
}

// cuLaunchKernelEx: as cuLaunchKernel; the one attribute the fake knows is programmatic stream
// serialization (any other is refused, so a new attribute gets a test).
CUresult f_launch_ex(const LaunchConfig* c, CUfunction fn, void** params, void** extra) {
  if (!c || (c->num_attrs && !c->attrs)) return kCudaErrorInvalidValue;
  bool programmatic = false;
  for (unsigned i = 0; i < c->num_attrs; ++i) {
    if (c->attrs[i].id != kLaunchAttrProgrammaticStreamSerialization) return kCudaErrorInvalidValue;
    programmatic = c->attrs[i].value.programmatic_stream_serialization_allowed != 0;
  }
  const unsigned g[3] = {c->grid_x, c->grid_y, c->grid_z}, b[3] = {c->block_x, c->block_y, c->block_z};
  FakeNode n;
  if (CUresult r = make_node(n, fn, g, b, c->shared_bytes, params, extra); r != kCudaSuccess) return r;
  n.programmatic = programmatic;
  if (programmatic) ++g_fake->stats_.programmatic_launches;
  if (g_fake->capturing_ && c->stream == g_fake->capturing_) {
    g_fake->capture_graph_->nodes.push_back(std::move(n));
    ++g_fake->stats_.graph_nodes_added;
    return kCudaSuccess;
  }
  run_node(n, false);
  return kCudaSuccess;
}

// Graphs: a CUgraph is a FakeDriver::Graph; a CUgraphNode names (graph, index); a CUgraphExec holds a
// copy of the graph's nodes taken at instantiation, updated by cuGraphExecKernelNodeSetParams.
struct FakeNodeHandle {
  FakeDriver::Graph* graph;
  size_t index;
};
struct FakeExec {
  FakeDriver::Graph* from;
  std::vector<FakeNode> nodes;
};
std::vector<std::unique_ptr<FakeNodeHandle>> g_node_handles;  // freed with the driver

CUresult f_begin_capture(CUstream s, int) {
  if (g_fake->capturing_) return kCudaErrorInvalidValue;
  g_fake->capturing_ = s;
  g_fake->capture_graph_ = new FakeDriver::Graph;
  return kCudaSuccess;
}
CUresult f_end_capture(CUstream s, CUgraph* g) {
  if (!g_fake->capturing_ || s != g_fake->capturing_) return kCudaErrorInvalidValue;
  *g = reinterpret_cast<CUgraph>(g_fake->capture_graph_);
  g_fake->capturing_ = nullptr;
  g_fake->capture_graph_ = nullptr;
  ++g_fake->stats_.graphs_created;
  ++g_fake->stats_.live_graphs;
  return kCudaSuccess;
}
CUresult f_graph_create(CUgraph* g, unsigned flags) {
  if (flags != 0) return kCudaErrorInvalidValue;
  *g = reinterpret_cast<CUgraph>(new FakeDriver::Graph);
  ++g_fake->stats_.graphs_created;
  ++g_fake->stats_.live_graphs;
  return kCudaSuccess;
}
CUresult f_add_kernel_node(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t ndeps,
                           const KernelNodeParams* p) {
  if (!g || !p || (ndeps && !deps)) return kCudaErrorInvalidValue;
  auto* graph = reinterpret_cast<FakeDriver::Graph*>(g);
  for (size_t i = 0; i < ndeps; ++i) {  // dependencies must be nodes of this graph
    const auto* h = reinterpret_cast<const FakeNodeHandle*>(deps[i]);
    if (!h || h->graph != graph || h->index >= graph->nodes.size()) return kCudaErrorInvalidValue;
  }
  FakeNode n;
  const unsigned gr[3] = {p->grid_x, p->grid_y, p->grid_z}, b[3] = {p->block_x, p->block_y, p->block_z};
  if (CUresult r = make_node(n, p->func, gr, b, p->shared_bytes, p->kernel_params, p->extra); r != kCudaSuccess) return r;
  graph->nodes.push_back(std::move(n));
  g_node_handles.push_back(std::make_unique<FakeNodeHandle>(FakeNodeHandle{graph, graph->nodes.size() - 1}));
  *node = reinterpret_cast<CUgraphNode>(g_node_handles.back().get());
  ++g_fake->stats_.graph_nodes_added;
  return kCudaSuccess;
}
CUresult f_add_child_node(CUgraphNode* node, CUgraph g, const CUgraphNode* deps, size_t ndeps, CUgraph child) {
  if (!g || !child || (ndeps && !deps)) return kCudaErrorInvalidValue;
  auto* graph = reinterpret_cast<FakeDriver::Graph*>(g);
  for (size_t i = 0; i < ndeps; ++i) {
    const auto* h = reinterpret_cast<const FakeNodeHandle*>(deps[i]);
    if (!h || h->graph != graph || h->index >= graph->nodes.size()) return kCudaErrorInvalidValue;
  }
  FakeNode n;
  n.is_child = true;
  n.child = reinterpret_cast<FakeDriver::Graph*>(child)->nodes;  // the driver clones the child graph
  graph->nodes.push_back(std::move(n));
  g_node_handles.push_back(std::make_unique<FakeNodeHandle>(FakeNodeHandle{graph, graph->nodes.size() - 1}));
  *node = reinterpret_cast<CUgraphNode>(g_node_handles.back().get());
  ++g_fake->stats_.child_nodes_added;
  return kCudaSuccess;
}
// Edges: nodes run in the order they were added, so an edge must point forward. A programmatic edge
// (from a kernel node's programmatic port to a kernel node) marks its downstream node; any other
// edge kind is refused.
CUresult f_add_dependencies(CUgraph g, const CUgraphNode* from, const CUgraphNode* to, const GraphEdgeData* edges,
                            size_t n) {
  if (!g || (n && (!from || !to))) return kCudaErrorInvalidValue;
  auto* graph = reinterpret_cast<FakeDriver::Graph*>(g);
  for (size_t i = 0; i < n; ++i) {
    const auto* a = reinterpret_cast<const FakeNodeHandle*>(from[i]);
    const auto* b = reinterpret_cast<const FakeNodeHandle*>(to[i]);
    if (!a || !b || a->graph != graph || b->graph != graph || a->index >= b->index || b->index >= graph->nodes.size())
      return kCudaErrorInvalidValue;
    const GraphEdgeData e = edges ? edges[i] : GraphEdgeData{};
    if (e.type == 0 && e.from_port == 0 && e.to_port == 0) continue;
    if (e.type != kGraphDependencyProgrammatic || e.from_port != kGraphKernelPortProgrammatic || e.to_port != 0 ||
        graph->nodes[a->index].is_child || graph->nodes[b->index].is_child)
      return kCudaErrorInvalidValue;
    graph->nodes[b->index].programmatic = true;
    ++g_fake->stats_.programmatic_edges;
  }
  return kCudaSuccess;
}
// As the driver: the new child must have the topology of the one the node holds (here: as many
// nodes, each running the same kernel).
CUresult f_exec_child_set_params(CUgraphExec e, CUgraphNode node, CUgraph child) {
  auto* exec = reinterpret_cast<FakeExec*>(e);
  const auto* h = reinterpret_cast<const FakeNodeHandle*>(node);
  if (!exec || !h || !child || h->graph != exec->from || h->index >= exec->nodes.size()) return kCudaErrorInvalidValue;
  FakeNode& n = exec->nodes[h->index];
  const auto& next = reinterpret_cast<FakeDriver::Graph*>(child)->nodes;
  if (!n.is_child || next.size() != n.child.size()) return kCudaErrorInvalidValue;
  for (size_t i = 0; i < next.size(); ++i)
    if (next[i].kernel != n.child[i].kernel || next[i].is_child != n.child[i].is_child) return kCudaErrorInvalidValue;
  n.child = next;
  ++g_fake->stats_.child_updates;
  return kCudaSuccess;
}
CUresult f_graph_get_nodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  if (!g || !count) return kCudaErrorInvalidValue;
  auto* graph = reinterpret_cast<FakeDriver::Graph*>(g);
  if (!nodes) {
    *count = graph->nodes.size();
    return kCudaSuccess;
  }
  const size_t n = std::min(*count, graph->nodes.size());
  for (size_t i = 0; i < n; ++i) {
    g_node_handles.push_back(std::make_unique<FakeNodeHandle>(FakeNodeHandle{graph, i}));
    nodes[i] = reinterpret_cast<CUgraphNode>(g_node_handles.back().get());
  }
  *count = n;
  return kCudaSuccess;
}
CUresult f_node_get_type(CUgraphNode node, int* type) {
  const auto* h = reinterpret_cast<const FakeNodeHandle*>(node);
  if (!h || !type || h->index >= h->graph->nodes.size()) return kCudaErrorInvalidValue;
  *type = h->graph->nodes[h->index].is_child ? 1 : kGraphNodeTypeKernel;  // 1: another type (a child graph)
  return kCudaSuccess;
}
// The parameters of a kernel node: its argument pointers point into the node (valid while its graph lives).
CUresult f_kernel_node_get_params(CUgraphNode node, KernelNodeParams* p) {
  const auto* h = reinterpret_cast<const FakeNodeHandle*>(node);
  if (!h || !p || h->index >= h->graph->nodes.size() || h->graph->nodes[h->index].is_child) return kCudaErrorInvalidValue;
  FakeNode& n = h->graph->nodes[h->index];
  static thread_local std::vector<void*> args;
  args.clear();
  for (auto& a : n.params) args.push_back(a.data());
  *p = KernelNodeParams{};
  p->func = fake_function(n.kernel);
  p->grid_x = n.grid[0], p->grid_y = n.grid[1], p->grid_z = n.grid[2];
  p->block_x = n.block[0], p->block_y = n.block[1], p->block_z = n.block[2];
  p->shared_bytes = n.shared_bytes;
  p->kernel_params = args.data();
  return kCudaSuccess;
}
CUresult f_kernel_node_copy_attributes(CUgraphNode dst, CUgraphNode src) {
  return dst && src ? kCudaSuccess : kCudaErrorInvalidValue;
}
CUresult f_instantiate(CUgraphExec* e, CUgraph g, unsigned long long) {
  if (!g) return kCudaErrorInvalidValue;
  auto* graph = reinterpret_cast<FakeDriver::Graph*>(g);
  *e = reinterpret_cast<CUgraphExec>(new FakeExec{graph, graph->nodes});
  ++g_fake->stats_.instantiations;
  ++g_fake->stats_.live_execs;
  return kCudaSuccess;
}
CUresult f_exec_set_params(CUgraphExec e, CUgraphNode node, const KernelNodeParams* p) {
  auto* exec = reinterpret_cast<FakeExec*>(e);
  const auto* h = reinterpret_cast<const FakeNodeHandle*>(node);
  if (!exec || !h || !p || h->graph != exec->from || h->index >= exec->nodes.size()) return kCudaErrorInvalidValue;
  if (exec->nodes[h->index].is_child) return kCudaErrorInvalidValue;
  FakeNode n;
  const unsigned gr[3] = {p->grid_x, p->grid_y, p->grid_z}, b[3] = {p->block_x, p->block_y, p->block_z};
  if (CUresult r = make_node(n, p->func, gr, b, p->shared_bytes, p->kernel_params, p->extra); r != kCudaSuccess) return r;
  n.programmatic = exec->nodes[h->index].programmatic;  // an edge's kind is not a node parameter
  exec->nodes[h->index] = std::move(n);
  ++g_fake->stats_.node_updates;
  return kCudaSuccess;
}
CUresult f_graph_launch(CUgraphExec e, CUstream) {
  auto* exec = reinterpret_cast<FakeExec*>(e);
  if (!exec) return kCudaErrorInvalidValue;
  ++g_fake->stats_.graph_launches;
  for (const FakeNode& n : exec->nodes) run_node(n, true);
  return kCudaSuccess;
}
CUresult f_graph_upload(CUgraphExec e, CUstream s) {
  if (!e) return kCudaErrorInvalidValue;
  ++g_fake->stats_.graph_uploads;
  g_fake->stats_.last_upload_stream = s;
  return kCudaSuccess;
}
CUresult f_graph_exec_destroy(CUgraphExec e) {
  delete reinterpret_cast<FakeExec*>(e);
  --g_fake->stats_.live_execs;
  return kCudaSuccess;
}
CUresult f_graph_destroy(CUgraph g) {
  delete reinterpret_cast<FakeDriver::Graph*>(g);
  --g_fake->stats_.live_graphs;
  return kCudaSuccess;
}
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
  a.cuEventQuery = f_event_query;
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
  a.cuFuncGetAttribute = f_func_get_attr;
  a.cuLaunchKernel = f_launch;
  a.cuLaunchKernelEx = f_launch_ex;
  a.cuGraphAddDependencies = f_add_dependencies;
  a.cuStreamBeginCapture = f_begin_capture;
  a.cuStreamEndCapture = f_end_capture;
  a.cuGraphInstantiateWithFlags = f_instantiate;
  a.cuGraphLaunch = f_graph_launch;
  a.cuGraphUpload = f_graph_upload;
  a.cuGraphExecDestroy = f_graph_exec_destroy;
  a.cuGraphDestroy = f_graph_destroy;
  a.cuGraphCreate = f_graph_create;
  a.cuGraphAddKernelNode = f_add_kernel_node;
  a.cuGraphExecKernelNodeSetParams = f_exec_set_params;
  a.cuGraphAddChildGraphNode = f_add_child_node;
  a.cuGraphExecChildGraphNodeSetParams = f_exec_child_set_params;
  a.cuGraphGetNodes = f_graph_get_nodes;
  a.cuGraphNodeGetType = f_node_get_type;
  a.cuGraphKernelNodeGetParams = f_kernel_node_get_params;
  a.cuGraphKernelNodeCopyAttributes = f_kernel_node_copy_attributes;
  a.cuGetErrorName = f_error_name;
  a.cuGetErrorString = f_error_string;
  set_driver_for_testing(&api_);
}

FakeDriver::~FakeDriver() {
  set_driver_for_testing(nullptr);
  for (auto& [p, n] : blocks_) std::free(reinterpret_cast<void*>(p));
  delete capture_graph_;
  g_node_handles.clear();
  g_fake = nullptr;
}

void FakeDriver::define_kernel(const std::string& name, std::vector<size_t> param_sizes,
                               std::function<void(const FakeLaunch&)> body) {
  const unsigned cluster = kernels_.count(name) ? kernels_[name].cluster : 0;  // set_cluster_width stays
  kernels_[name] = Kernel{std::move(param_sizes), std::move(body), cluster};
}

}  // namespace protean::cuda
