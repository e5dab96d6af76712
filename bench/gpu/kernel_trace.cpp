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
// cuProfilerStop are written (the --profile-call window of protean_gpt2_bench), one line each:
// start_ns, end_ns, graph id, graph node id, grid x, block x, cluster x, name. The timestamps are
// CUPTI's (ns, one clock for the device). Tracing adds a little time to each kernel; the figures are
// for attribution (which kernel, which gap), not for the steady latency, which is measured without it.
//
// Several windows (protean_gpt2_bench --profile-new-length: one call per window) are written one after
// another, each under a line `# window I START END` (I from 0; START and END the CUPTI times at
// cuProfilerStart's return and cuProfilerStop's entry, the records' clock). PROTEAN_KERNEL_TRACE_MEMCPY=1
// also records the copies (CUPTI_ACTIVITY_KIND_MEMCPY) as lines with graph, node, grid, block and
// cluster 0 and the name `memcpy KIND BYTES` (KIND HtoD, DtoH, DtoD, ...).
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
uint64_t g_window_start = 0;                         // the open window's (g_mu)
std::vector<std::pair<uint64_t, uint64_t>> g_windows;  // closed windows (g_mu)
size_t g_written_windows = 0;                          // windows already in the file (g_mu)
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
    if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      static const char* kinds[] = {"unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
      Kernel x;
      x.start = m->start;
      x.end = m->end;
      x.name = std::string("memcpy ") + (m->copyKind < sizeof kinds / sizeof *kinds ? kinds[m->copyKind] : "other") + " " +
               std::to_string(m->bytes);
      got.push_back(std::move(x));
      continue;
    }
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

/// Appends the windows closed since the last write to PROTEAN_KERNEL_TRACE (stderr when unset), each
/// with the records that started inside it. Called at cuProfilerStop's return and at exit.
void write_trace() {
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_written_windows == g_windows.size()) {
    if (g_windows.empty() && !g_kernels.empty())
      std::fprintf(stderr, "kernel_trace: no cuProfilerStart seen, %zu records not written\n", g_kernels.size());
    g_kernels.clear();
    return;
  }
  const char* path = std::getenv("PROTEAN_KERNEL_TRACE");
  FILE* f = path && *path ? std::fopen(path, g_written_windows ? "a" : "w") : stderr;
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", path);
    return;
  }
  std::sort(g_kernels.begin(), g_kernels.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
  if (g_written_windows == 0) std::fprintf(f, "# start_ns\tend_ns\tgraph\tgraph_node\tgrid\tblock\tcluster\tname\n");
  size_t kept = 0;
  for (size_t w = g_written_windows; w < g_windows.size(); ++w) {
    const auto [a, b] = g_windows[w];
    std::fprintf(f, "# window %zu %llu %llu\n", w, static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
    for (const Kernel& k : g_kernels) {
      if (k.start < a || k.start > b) continue;
      ++kept;
      std::fprintf(f, "%llu\t%llu\t%u\t%llu\t%d\t%d\t%u\t%s\n", static_cast<unsigned long long>(k.start),
                   static_cast<unsigned long long>(k.end), k.graph, static_cast<unsigned long long>(k.graph_node), k.grid,
                   k.block, k.cluster, k.name.c_str());
    }
  }
  std::fprintf(stderr, "kernel_trace: windows %zu..%zu, %zu of %zu records in them, %llu records dropped\n",
               g_written_windows, g_windows.size() - 1, kept, g_kernels.size(),
               static_cast<unsigned long long>(g_dropped.load()));
  g_written_windows = g_windows.size();
  g_kernels.clear();  // a later window starts after this one ends
  if (f != stderr) std::fclose(f);
}

// A window: cuProfilerStart's return to cuProfilerStop's entry (the caller synchronized before it, so
// every kernel of the window has ended); windows are written at cuProfilerStop's return, while the
// context is alive (at exit, any not yet written).
void CUPTIAPI on_driver_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  uint64_t now = 0;
  cuptiGetTimestamp(&now);
  if (id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart && info->callbackSite == CUPTI_API_EXIT) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_window_start = now;
  }
  if (id == CUPTI_DRIVER_TRACE_CBID_cuProfilerStop && info->callbackSite == CUPTI_API_ENTER) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_window_start) g_windows.emplace_back(g_window_start, now);
    g_window_start = 0;
  }
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
  if (const char* m = std::getenv("PROTEAN_KERNEL_TRACE_MEMCPY"); m && std::strcmp(m, "1") == 0)
    ok(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(MEMCPY)");
  if (ok(cuptiSubscribe(&g_subscriber, on_driver_call, nullptr), "cuptiSubscribe")) {
    ok(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart),
       "cuptiEnableCallback(cuProfilerStart)");
    ok(cuptiEnableCallback(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop),
       "cuptiEnableCallback(cuProfilerStop)");
  }
  std::atexit(write_trace);
  return 1;
}
