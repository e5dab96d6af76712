// Deferred reclamation for lock-free readers (quiescent-state based, with asymmetric barriers).
//
// Dispatch reads a frame's cache-entry list with one acquire load and no lock; reset() must not free
// an entry or an artifact a concurrent call is still running. Readers bracket their use in a
// ReadSection; a writer first unpublishes what it wants to free (stores the new pointer), then hands
// the old objects to retire(). They are destroyed only once every thread that was inside a read
// section at that moment has left it.
//
// Invariant (what makes it sound): a reader publishes "inside" (an odd per-thread counter) before its
// first load of a shared pointer; retire() runs a process-wide barrier (Linux membarrier, or a full
// fence on both sides where membarrier is unavailable) between the writer's unpublish and its scan of
// the counters. So a reader either is seen inside by the scan, or its loads come after the unpublish
// and cannot reach the retired objects.
//
// Cost on the reader side: two thread-local stores and a compiler barrier (a full fence only when
// the kernel lacks MEMBARRIER_CMD_PRIVATE_EXPEDITED); no shared cache line is written. Sections nest.
// retire() never blocks: objects whose grace period has not ended wait in a limbo list, collected by
// later retire()/collect() calls (every reset and every compile).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace protean::core {

namespace reclaim_detail {
struct ThreadRecord {
  std::atomic<uint64_t> ctr{0};  // odd while the owner thread is inside a read section
  uint32_t depth = 0;            // nesting depth, owner thread only
  std::atomic<bool> in_use{false};
  ThreadRecord* next = nullptr;  // immutable once the record is published
};
ThreadRecord* acquire_record();  // slow path: the first section of a thread
extern bool g_light_barrier;     // set once (call_once) before any record exists; immutable after
// This thread's record. initial-exec: one %fs-relative load instead of a __tls_get_addr call on the
// hit path (libprotean is linked at startup; a late dlopen still finds room in glibc's static TLS
// surplus for one pointer).
extern constinit thread_local ThreadRecord* t_record __attribute__((tls_model("initial-exec")));
}  // namespace reclaim_detail

/// RAII read-side critical section. Pointers loaded from structures whose writers use retire() stay
/// valid until the outermost section of this thread ends.
class ReadSection {
 public:
  ReadSection() noexcept {
    using namespace reclaim_detail;
    ThreadRecord* r = t_record;
    if (!r) r = acquire_record();
    rec_ = r;
    if (r->depth++ == 0) {
      r->ctr.store(r->ctr.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      if (g_light_barrier)
        std::atomic_signal_fence(std::memory_order_seq_cst);
      else
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  }
  ~ReadSection() {
    if (--rec_->depth == 0) rec_->ctr.store(rec_->ctr.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  ReadSection(const ReadSection&) = delete;
  ReadSection& operator=(const ReadSection&) = delete;

 private:
  reclaim_detail::ThreadRecord* rec_;
};

/// Destroys `objects` once no read section that began before this call is still running (at once
/// when none is). The caller must already have unpublished them (no new reader can reach them).
/// Safe to call from inside a read section (the caller's own section delays the destruction).
void retire(std::vector<std::shared_ptr<void>> objects);

/// Destroys retired objects whose grace period has ended. Cheap when nothing waits.
void collect();

/// Retired objects still waiting for a grace period (tests).
size_t retired_pending();

}  // namespace protean::core
