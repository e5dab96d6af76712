#include "backend/graph_stats.h"

#include <atomic>
#include <mutex>

namespace protean::backend {

namespace {
struct Counters {
  std::atomic<int64_t> recordings{0}, replays{0}, patches{0}, buckets{0}, plain_runs{0}, size_changes{0},
      size_change_ns{0}, size_change_check_ns{0}, size_change_first_launch_ns{0}, size_copies{0}, size_copy_ns{0};
  std::mutex mu;
  std::map<std::string, int64_t> per_frame;
};
Counters& counters() {
  static Counters c;
  return c;
}
}  // namespace

GraphStats graph_stats() {
  Counters& c = counters();
  GraphStats s;
  s.recordings = c.recordings.load(std::memory_order_relaxed);
  s.replays = c.replays.load(std::memory_order_relaxed);
  s.patches = c.patches.load(std::memory_order_relaxed);
  s.buckets = c.buckets.load(std::memory_order_relaxed);
  s.plain_runs = c.plain_runs.load(std::memory_order_relaxed);
  s.size_changes = c.size_changes.load(std::memory_order_relaxed);
  s.size_change_ns = c.size_change_ns.load(std::memory_order_relaxed);
  s.size_change_check_ns = c.size_change_check_ns.load(std::memory_order_relaxed);
  s.size_change_first_launch_ns = c.size_change_first_launch_ns.load(std::memory_order_relaxed);
  s.size_copies = c.size_copies.load(std::memory_order_relaxed);
  s.size_copy_ns = c.size_copy_ns.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(c.mu);
  s.buckets_per_frame = c.per_frame;
  return s;
}

void reset_graph_stats() {
  Counters& c = counters();
  for (auto* a : {&c.recordings, &c.replays, &c.patches, &c.buckets, &c.plain_runs, &c.size_changes, &c.size_change_ns,
                  &c.size_change_check_ns, &c.size_change_first_launch_ns, &c.size_copies, &c.size_copy_ns}) a->store(0, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(c.mu);
  c.per_frame.clear();
}

void count_graph_recording(int64_t segments) { counters().recordings.fetch_add(segments, std::memory_order_relaxed); }
void count_graph_replay(int64_t patches) {
  counters().replays.fetch_add(1, std::memory_order_relaxed);
  if (patches) counters().patches.fetch_add(patches, std::memory_order_relaxed);
}
void count_graph_bucket(const std::string& compile_id) {
  Counters& c = counters();
  c.buckets.fetch_add(1, std::memory_order_relaxed);
  const std::string frame = compile_id.substr(0, compile_id.find('/'));
  std::lock_guard<std::mutex> lock(c.mu);
  ++c.per_frame[frame];
}
void count_graph_plain_run() { counters().plain_runs.fetch_add(1, std::memory_order_relaxed); }
void count_graph_size_change(int64_t host_ns, int64_t check_ns, int64_t first_launch_ns) {
  Counters& c = counters();
  c.size_changes.fetch_add(1, std::memory_order_relaxed);
  c.size_change_ns.fetch_add(host_ns, std::memory_order_relaxed);
  c.size_change_check_ns.fetch_add(check_ns, std::memory_order_relaxed);
  c.size_change_first_launch_ns.fetch_add(first_launch_ns, std::memory_order_relaxed);
}

void count_size_copy(int64_t host_ns) {
  Counters& c = counters();
  c.size_copies.fetch_add(1, std::memory_order_relaxed);
  c.size_copy_ns.fetch_add(host_ns, std::memory_order_relaxed);
}

}  // namespace protean::backend
