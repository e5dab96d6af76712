#include "core/reclaim.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <utility>

namespace protean::core {

namespace reclaim_detail {

bool g_light_barrier = false;
constinit thread_local ThreadRecord* t_record __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

std::atomic<ThreadRecord*> g_records{nullptr};
std::once_flag g_init;

int membarrier(int cmd) { return static_cast<int>(syscall(__NR_membarrier, cmd, 0u, 0)); }

// Decides once, before any record is published, whether readers may use a compiler barrier only.
void init() {
  std::call_once(g_init, [] {
    int cmds = membarrier(MEMBARRIER_CMD_QUERY);
    g_light_barrier = cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                      membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
  });
}

// The writer's half of the barrier pair: after it, every reader's "inside" store that preceded its
// loads is visible to this thread.
// False when the barrier could not be run (the objects must then never be freed).
bool heavy_barrier() {
  if (g_light_barrier) return membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);  // readers fence as well in this mode
  return true;
}

// Gives the record back when its thread exits.
struct RecordReleaser {
  ThreadRecord* rec = nullptr;
  ~RecordReleaser() {
    if (rec) {
      t_record = nullptr;
      rec->in_use.store(false, std::memory_order_release);
    }
  }
};
thread_local RecordReleaser t_releaser;

}  // namespace

ThreadRecord* acquire_record() {
  init();
  ThreadRecord* r = nullptr;
  for (ThreadRecord* p = g_records.load(std::memory_order_acquire); p; p = p->next) {
    bool expected = false;
    if (!p->in_use.load(std::memory_order_relaxed) && p->in_use.compare_exchange_strong(expected, true)) {
      r = p;
      break;
    }
  }
  if (!r) {
    r = new ThreadRecord;  // never freed: records are reused by later threads
    r->in_use.store(true, std::memory_order_relaxed);
    ThreadRecord* head = g_records.load(std::memory_order_relaxed);
    do r->next = head;
    while (!g_records.compare_exchange_weak(head, r, std::memory_order_release, std::memory_order_relaxed));
  }
  t_record = r;
  t_releaser.rec = r;
  return r;
}

}  // namespace reclaim_detail

namespace {

using reclaim_detail::ThreadRecord;

struct Limbo {
  std::vector<std::shared_ptr<void>> objects;
  std::vector<std::pair<const ThreadRecord*, uint64_t>> waiting;  // threads inside a section at retire()
};

std::mutex g_limbo_mu;
std::vector<Limbo>& limbo() {
  static auto* l = new std::vector<Limbo>;  // never destroyed: retire() may run during static destruction
  return *l;
}
std::atomic<size_t> g_pending{0};

// Moves out the objects whose grace period ended. Caller holds g_limbo_mu.
void take_done(std::vector<std::shared_ptr<void>>& done) {
  auto& l = limbo();
  for (size_t i = 0; i < l.size();) {
    auto& w = l[i].waiting;
    std::erase_if(w, [](const auto& p) { return p.first->ctr.load(std::memory_order_acquire) != p.second; });
    if (w.empty()) {
      g_pending.fetch_sub(l[i].objects.size(), std::memory_order_relaxed);
      for (auto& o : l[i].objects) done.push_back(std::move(o));
      l.erase(l.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

}  // namespace

void retire(std::vector<std::shared_ptr<void>> objects) {
  reclaim_detail::init();
  if (!reclaim_detail::heavy_barrier()) {
    // Without the barrier no grace period can be proven: keep the objects alive (a leak, never a
    // use after free). Once registered, the kernel does not fail the expedited command.
    static auto* kept = new std::vector<std::shared_ptr<void>>;
    std::lock_guard<std::mutex> lock(g_limbo_mu);
    for (auto& o : objects) kept->push_back(std::move(o));
    return;
  }
  Limbo entry;
  entry.objects = std::move(objects);
  for (const ThreadRecord* p = reclaim_detail::g_records.load(std::memory_order_acquire); p; p = p->next) {
    uint64_t c = p->ctr.load(std::memory_order_acquire);
    if (c & 1) entry.waiting.emplace_back(p, c);
  }
  std::vector<std::shared_ptr<void>> done;
  {
    std::lock_guard<std::mutex> lock(g_limbo_mu);
    g_pending.fetch_add(entry.objects.size(), std::memory_order_relaxed);
    limbo().push_back(std::move(entry));
    take_done(done);
  }
  done.clear();  // destructors run outside the lock (they may retire more)
}

void collect() {
  if (g_pending.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::shared_ptr<void>> done;
  {
    std::lock_guard<std::mutex> lock(g_limbo_mu);
    take_done(done);
  }
}

size_t retired_pending() { return g_pending.load(std::memory_order_relaxed); }

}  // namespace protean::core
