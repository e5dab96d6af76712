// Where a replayed call's GPU time goes, kernel by kernel, inside its CUDA graph: a CUPTI injection
// library (the driver loads it at cuInit when CUDA_INJECTION64_PATH names it).
//
//   CUDA_INJECTION64_PATH=libprotean_kernel_trace.so PROTEAN_KERNEL_TRACE=OUT.tsv
//   protean_gpt2_bench MODEL WORK LABEL --mode=max-autotune --profile-call L --profile-repeat 5
//
// ncu times each kernel alone (it serializes them and replays each); this records the kernels as they
// run inside the graph, programmatic edges and L2 contents as in a steady call. Concurrent-kernel
// activity is enabled at cuInit (CUPTI instruments a graph's kernels only when tracing was on before
// the graph was made), and only kernels that start between the process's cuProfilerStart and
// cuProfilerStop are written (the --profile-call window of protean_gpt2_bench), one line each at exit:
// start_ns, end_ns, graph id, graph node id, grid x, block x, cluster x, name. The timestamps are
// CUPTI's (ns, one clock for the device). Tracing adds a little time to each kernel; the figures are
// for attribution (which kernel, which gap), not for the steady latency, which is measured without it.
#include <cupti.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Kernel {
  uint64_t start = 0, end = 0, graph_node = 0;
  uint32_t graph = 0;
  int32_t grid = 0, block = 0;
  uint32_t cluster = 0;
  std::string name;
};

std::mutex g_mu;
std::vector<Kernel> g_kernels;
std::atomic<uint64_t> g_window_start{0}, g_window_end{0};
std::atomic<uint64_t> g_dropped{0};
CUpti_SubscriberHandle g_subscriber = nullptr;

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::vector<Kernel> got;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    Kernel x;
    x.start = k->start;
    x.end = k->end;
    x.graph = k->graphId;
    x.graph_node = k->graphNodeId;
    x.grid = k->gridX;
    x.block = k->blockX;
    x.cluster = k->clusterX;
    x.name = k->name ? k->name : "?";
    got.push_back(std::move(x));
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  g_dropped += dropped;
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  for (Kernel& k : got) g_kernels.push_back(std::move(k));
}

std::once_flag g_written;

void write_trace_once() {
  cuptiActivityFlushAll(1);
  const char* path = std::getenv("PROTEAN_KERNEL_TRACE");
  FILE* f = path && *path ? std::fopen(path, "w") : stderr;
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  std::sort(g_kernels.begin(), g_kernels.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  const uint64_t a = g_window_start, b = g_window_end ? g_window_end.load() : UINT64_MAX;
  size_t kept = 0;
  std::fprintf(f, "# start_ns\tend_ns\tgraph\tgraph_node\tgrid\tblock\tcluster\tname\n");
  for (const Kernel& k : g_kernels) {
    if (a == 0 || k.start < a || k.start > b) continue;
    ++kept;
    std::fprintf(f, "%llu\t%llu\t%u\t%llu\t%d\t%d\t%u\t%s\n", static_cast<unsigned long long>(k.start),
                 static_cast<unsigned long long>(k.end), k.graph, static_cast<unsigned long long>(k.graph_node), k.grid,
                 k.block, k.cluster, k.name.c_str());
  }
  std::fprintf(stderr, "kernel_trace: %zu of %zu kernels in the profiled window%s, %llu records dropped\n", kept,
               g_kernels.size(), a == 0 ? " (no cuProfilerStart seen)" : "",
               static_cast<unsigned long long>(g_dropped.load()));
  if (f != stderr) std::fclose(f);
}

void write_trace() { std::call_once(g_written, write_trace_once); }

// The window: cuProfilerStart's return to cuProfilerStop's entry (the caller synchronized before it, so
// every kernel of the window has ended); the trace is written at cuProfilerStop's return, while the
// context is alive (at exit when no cuProfilerStop came).
void CUPTIAPI on_driver_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  if (id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart && info->callbackSite == CUPTI_API_EXIT) g_window_start = now;
  if (id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop && info->callbackSite == CUPTI_API_ENTER) g_window_end = now;
  if (id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop && info->callbackSite == CUPTI_API_EXIT) write_trace();
}

bool ok(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, s ? s : "?");
  return false;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  if (!ok(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks")) return 0;
  if (!ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)")) return 0;
  if (ok(cuptiSubscribe(&g_subscriber, on_driver_call, nullptr), "cuptiSubscribe")) {
    ok(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart),
       "cuptiEnableCallback(cuProfilerStart)");
    ok(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop),
       "cuptiEnableCallback(cuProfilerStop)");
  }
  std::atexit(write_trace);
  return 1;
}
