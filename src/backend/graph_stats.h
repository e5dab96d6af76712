// Counters of device-graph replay (mode "reduce-overhead"; backend/cuda/graphs.h), read into
// protean::Stats and the report. Process-wide, relaxed atomics; protean::reset() zeroes them.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace protean::backend {

struct GraphStats {
  int64_t recordings = 0;   ///< bucket graphs built and instantiated (each instantiates the bucket's segments)
  int64_t replays = 0;      ///< calls served by replaying recorded graphs
  int64_t patches = 0;      ///< kernel nodes updated in place (cuGraphExecKernelNodeSetParams)
  int64_t buckets = 0;      ///< distinct (artifact, bucket) pairs recorded
  int64_t plain_runs = 0;   ///< reduce-overhead calls that ran plain launches (and why: perf_hints)
  int64_t size_changes = 0; ///< replays at sizes other than their bucket's previous call
  int64_t size_change_ns = 0;  ///< host time of those replays in the graph runner (checks, patches, launches)
  /// Of size_change_ns: the size checks (prepare), and the critical path of each such call: host time
  /// from the start of the checks until the first graph chunk's cuGraphLaunch returned (the device
  /// can start no earlier; the later chunks are patched while it runs).
  int64_t size_change_check_ns = 0;
  int64_t size_change_first_launch_ns = 0;
  /// Copies of a call's size values to the device (cuda runner's write_sizes, on calls whose sizes
  /// differ from the last ones copied; graph and plain launches alike) and their host time: the copy
  /// is from pageable memory, so the driver stages it before cuMemcpyHtoDAsync returns.
  int64_t size_copies = 0;
  int64_t size_copy_ns = 0;
  /// Buckets recorded per frame ("F" of the compile id "F/C"), for the report.
  std::map<std::string, int64_t> buckets_per_frame;
};

GraphStats graph_stats();
void reset_graph_stats();

// Incremented by the graph runner.
void count_graph_recording(int64_t segments);
void count_graph_replay(int64_t patches);
void count_graph_bucket(const std::string& compile_id);
void count_graph_plain_run();
void count_graph_size_change(int64_t host_ns, int64_t check_ns = 0, int64_t first_launch_ns = 0);
void count_size_copy(int64_t host_ns);

}  // namespace protean::backend
