// Protean's own team for splitting one f32 GEMM over the intra-op threads (gemm_team.h).
#include "ops/gemm_team.h"

#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "observe/env.h"
#include "ops/thread_binding.h"

namespace protean::ops {

namespace {

using Clock = std::chrono::steady_clock;

GemmTeamMode mode_from_env() {
  static const GemmTeamMode m = [] {
    const char* e = std::getenv("PROTEAN_GEMM_TEAM");
    if (e && std::strcmp(e, "0") == 0) return GemmTeamMode::Off;
    if (e && std::strcmp(e, "1") == 0) return GemmTeamMode::On;
    return GemmTeamMode::Auto;
  }();
  return m;
}

/// Whether libgomp's workers sleep as soon as a region ends: GOMP_SPINCOUNT, where it parses, sets
/// the spin (0: none) whatever the policy; otherwise OMP_WAIT_POLICY=passive means no spin.
bool omp_workers_sleep() {
  static const bool sleep = [] {
    if (const char* s = std::getenv("GOMP_SPINCOUNT"); s && *s) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(s, &end, 10);
      if (end != s) return v == 0;
    }
    const char* p = std::getenv("OMP_WAIT_POLICY");
    if (!p) return false;
    std::string w(p);
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return w == "passive";
  }();
  return sleep;
}

std::atomic<int> g_override{-1};  // a GemmTeamMode set by set_gemm_team_mode, -1: the environment's

struct Counters {
  std::atomic<int64_t> splits{0}, busy{0}, wakeups{0}, hot{0};
};
Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: kernels may run at exit
  return *c;
}

thread_local bool tl_team_worker = false;

/// One worker: a generation counter the caller bumps to post a slice, and the CPU to run it on.
struct alignas(64) Worker {
  std::atomic<uint32_t> gen{0};
  std::atomic<uint32_t> sleeping{0};  // 1 while the worker waits on `gen` with a futex
  int index = 0;                      // the fn index it runs (1 .. n-1)
  int cpu = -1;                       // the CPU to run on, -1: its own (the process's) mask
};

class Team {
 public:
  static Team& instance() {
    static Team* t = new Team();  // never destroyed: its threads sleep in a futex at exit
    return *t;
  }

  bool hot(int n) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock() || static_cast<int>(workers_.size()) < n - 1) return false;
    for (int i = 0; i < n - 1; ++i)
      if (workers_[static_cast<size_t>(i)]->sleeping.load(std::memory_order_acquire)) return false;
    return true;
  }

  bool run(int n, const std::function<void(int)>& fn, const std::vector<int>& cpus) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      counters().busy.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    while (static_cast<int>(workers_.size()) < n - 1) start_worker();
    fn_ = &fn;
    error_ = nullptr;
    pending_.store(n - 1, std::memory_order_relaxed);
    Counters& c = counters();
    for (int i = 1; i < n; ++i) {
      Worker& w = *workers_[static_cast<size_t>(i - 1)];
      w.index = i;
      w.cpu = cpus.size() >= static_cast<size_t>(n) ? cpus[static_cast<size_t>(i)] : -1;
      w.gen.fetch_add(1, std::memory_order_seq_cst);
      if (w.sleeping.load(std::memory_order_seq_cst)) {
        c.wakeups.fetch_add(1, std::memory_order_relaxed);
        w.gen.notify_one();
      } else {
        c.hot.fetch_add(1, std::memory_order_relaxed);
      }
    }
    std::exception_ptr mine;
    try {
      fn(0);
    } catch (...) {
      mine = std::current_exception();
    }
    // The workers' slices are about as long as this one: spin, then sleep if one is late.
    const auto until = Clock::now() + spin_;
    for (int k = 0;; ++k) {
      const int p = pending_.load(std::memory_order_acquire);
      if (p == 0) break;
      if ((k & 63) == 63 && Clock::now() >= until) {
        // announced before the last look at `pending_`, so that a worker finishing meanwhile sees it
        caller_sleeping_.store(1, std::memory_order_seq_cst);
        if (pending_.load(std::memory_order_seq_cst) == p) pending_.wait(p, std::memory_order_acquire);
        caller_sleeping_.store(0, std::memory_order_relaxed);
        continue;
      }
      _mm_pause();
    }
    c.splits.fetch_add(1, std::memory_order_relaxed);
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

 private:
  Team() : spin_(gemm_team_spin_us()) {}

  void start_worker() {
    workers_.push_back(std::make_unique<Worker>());
    Worker* w = workers_.back().get();
    // threads inherit the creating thread's mask: give them the caller's own, not a narrowed one
    with_caller_mask([&] { std::thread([this, w] { loop(*w); }).detach(); });
  }

  void loop(Worker& w) {
    tl_team_worker = true;
    omp_set_num_threads(1);  // the slices' oneDNN primitives are one-thread ones
    cpu_set_t home;
    CPU_ZERO(&home);
    sched_getaffinity(0, sizeof home, &home);
    int pinned = -1;
    uint32_t seen = 0;
    for (;;) {
      uint32_t g = w.gen.load(std::memory_order_acquire);
      if (g == seen) {
        // Bounded spin: the next GEMM of the same call comes within microseconds. sched_yield lets
        // a thread that is runnable on this CPU (an OpenMP worker, another process) go first.
        const auto until = Clock::now() + spin_;
        for (int k = 1; (g = w.gen.load(std::memory_order_acquire)) == seen; ++k) {
          _mm_pause();
          if ((k & 63) == 0) {
            if (Clock::now() >= until) break;
            sched_yield();
          }
        }
        while (g == seen) {
          w.sleeping.store(1, std::memory_order_seq_cst);
          g = w.gen.load(std::memory_order_seq_cst);
          if (g == seen) w.gen.wait(seen, std::memory_order_acquire);
          w.sleeping.store(0, std::memory_order_relaxed);
          g = w.gen.load(std::memory_order_acquire);
        }
      }
      seen = g;
      if (w.cpu != pinned) {
        if (w.cpu >= 0) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(w.cpu, &one);
          sched_setaffinity(0, sizeof one, &one);
        } else {
          sched_setaffinity(0, sizeof home, &home);
        }
        pinned = w.cpu;
      }
      try {
        (*fn_)(w.index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mu_);
        if (!error_) error_ = std::current_exception();
      }
      // The wake only when the caller sleeps: std::atomic's notify makes a futex system call whenever
      // any thread waits on an address that shares its bucket in the library's table of waiters (a
      // sleeping worker of another pool), though the caller itself is still spinning.
      if (pending_.fetch_sub(1, std::memory_order_seq_cst) == 1 && caller_sleeping_.load(std::memory_order_seq_cst))
        pending_.notify_one();
    }
  }

  std::mutex mu_;  // one split at a time
  std::vector<std::unique_ptr<Worker>> workers_;
  const std::function<void(int)>* fn_ = nullptr;
  std::atomic<int> pending_{0};
  std::atomic<uint32_t> caller_sleeping_{0};  // 1 while the caller waits on `pending_` with a futex
  std::mutex error_mu_;
  std::exception_ptr error_;
  std::chrono::microseconds spin_{100};
};

}  // namespace

bool gemm_team_enabled() {
  int o = g_override.load(std::memory_order_relaxed);
  const GemmTeamMode m = o >= 0 ? static_cast<GemmTeamMode>(o) : mode_from_env();
  if (m == GemmTeamMode::Off) return false;
  if (m == GemmTeamMode::On) return true;
  return omp_workers_sleep();
}

void set_gemm_team_mode(GemmTeamMode mode) {
  g_override.store(mode == GemmTeamMode::Auto ? static_cast<int>(mode_from_env()) : static_cast<int>(mode),
                   std::memory_order_relaxed);
}

int64_t gemm_team_spin_us() {
  static const int64_t us = observe::env_int("PROTEAN_GEMM_TEAM_SPIN_US", 100, 0, 100000);
  return us;
}

bool run_on_gemm_team(int n, const std::function<void(int)>& fn, const std::vector<int>& cpus) {
  if (n < 2 || tl_team_worker || omp_in_parallel()) return false;
  return Team::instance().run(n, fn, cpus);
}

std::atomic<int64_t> g_cold_override{-1};

int64_t gemm_team_cold_min_macs() {
  const int64_t o = g_cold_override.load(std::memory_order_relaxed);
  if (o >= 0) return o;
  static const int64_t env = observe::env_int("PROTEAN_GEMM_TEAM_COLD_MACS", int64_t{1} << 22, 0, int64_t{1} << 40);
  return env;
}

void set_gemm_team_cold_min_macs(int64_t macs) { g_cold_override.store(macs < 0 ? -1 : macs, std::memory_order_relaxed); }

bool gemm_team_hot(int n) { return n >= 2 && !tl_team_worker && Team::instance().hot(n); }

bool run_on_bound_gemm_team(int n, const std::function<void(int)>& fn, bool bind) {
  TeamBinding binding(bind);
  return run_on_gemm_team(n, fn, binding.bound() ? bound_team_cpus() : std::vector<int>{});
}

GemmTeamStats gemm_team_stats() {
  const Counters& c = counters();
  return {c.splits.load(), c.busy.load(), c.wakeups.load(), c.hot.load()};
}

}  // namespace protean::ops
