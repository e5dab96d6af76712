// Binding an OpenMP team to distinct CPUs while it runs a parallel kernel (thread_binding.h).
#include "ops/thread_binding.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "protean/ops.h"

namespace protean::ops {

namespace {

struct Counters {
  std::atomic<int64_t> bindings{0}, team_setups{0}, one_thread{0}, nested{0}, few_cpus{0}, disabled{0}, busy{0},
      partial{0};
};
Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: kernels may run at exit
  return *c;
}

/// Whether this kernel's scheduler packs woken threads onto busy vCPUs: the non-standard
/// /proc/sys/kernel/sched_vcpu_pack present and not 0 (the PVM guest kernel of the benchmark VM). A
/// standard kernel wakes a sleeping worker on an idle CPU, so there the team is left to the scheduler:
/// binding would only add system calls, and callers on several user threads would pile their teams
/// onto the same CPUs.
bool scheduler_packs_vcpus() {
  FILE* f = std::fopen("/proc/sys/kernel/sched_vcpu_pack", "r");
  if (!f) return false;
  long v = 0;
  const bool read = std::fscanf(f, "%ld", &v) == 1;
  std::fclose(f);
  return read && v != 0;
}

/// Auto: bind on a quiet machine. Whole: the same, only for a team that spans every allowed CPU (the
/// default where the kernel does not announce packing): there the binding takes away no placement
/// the scheduler could have chosen better, and it keeps the workers off the caller's CPU whatever the
/// scheduler does on wake-up. The 2-vCPU Xeon VM of the benchmarks (no sched_vcpu_pack file) ran the
/// compiled MLP's 2-thread GEMMs at 0.76-1.0x of one thread in two or three processes of five and
/// 1.6-1.9x in the others; bound, 1.6-1.9x in every process (docs/cpu.md, "Threads").
enum class Mode { Off, Auto, Whole, Always };
Mode mode_from_env() {
  static const Mode m = [] {
    const char* e = std::getenv("PROTEAN_BIND_THREADS");
    if (e && std::strcmp(e, "0") == 0) return Mode::Off;
    if (e && std::strcmp(e, "1") == 0) return Mode::Always;
    return scheduler_packs_vcpus() ? Mode::Auto : Mode::Whole;
  }();
  return m;
}

/// Whether other work keeps the allowed CPUs busy: the 1-minute load average (which counts this
/// process's running threads too) at least `cpus` + 0.5, sampled at most once a second (libgomp's
/// OMP_DYNAMIC reads the same figure to size its teams). A pinned worker then waits for a CPU another
/// process holds, and every region waits for it: the compiled MLP at batch 128 took 7.7 ms bound
/// against 3.1 ms unbound at load average 7 on the 2-vCPU VM.
bool machine_busy(size_t cpus) {
  using Clock = std::chrono::steady_clock;
  static std::atomic<int64_t> next_ns{0};
  static std::atomic<bool> busy{false};
  const int64_t now = Clock::now().time_since_epoch().count();
  if (now >= next_ns.load(std::memory_order_relaxed)) {
    next_ns.store(now + std::chrono::duration_cast<Clock::duration>(std::chrono::seconds(1)).count(),
                  std::memory_order_relaxed);
    double load[1] = {0};
    busy.store(getloadavg(load, 1) == 1 && load[0] >= static_cast<double>(cpus) + 0.5, std::memory_order_relaxed);
  }
  return busy.load(std::memory_order_relaxed);
}

/// Per calling thread: the scope depth, the binding held (the caller's mask narrowed) and the team.
struct State {
  int scope_depth = 0;
  bool held = false;
  cpu_set_t saved;        // the caller's mask before the binding
  std::vector<int> team;  // CPU per OpenMP thread number of the last team set up (0: the caller's)
};
State& state() {
  static thread_local State s;
  return s;
}

bool pin_self(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  return sched_setaffinity(0, sizeof one, &one) == 0;
}

void release(State& s) {
  if (!s.held) return;
  sched_setaffinity(0, sizeof s.saved, &s.saved);
  s.held = false;
}

/// Pins workers 1..n-1 of the caller's team to team[1..n-1] (one parallel region). False when the
/// runtime gave fewer threads or a worker could not be pinned.
bool set_up_team(const std::vector<int>& team) {
  const int n = static_cast<int>(team.size());
  std::atomic<int> pinned{0};
  int got = 0;
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t == 0) got = omp_get_num_threads();
    else if (t < n && pin_self(team[static_cast<size_t>(t)])) pinned.fetch_add(1, std::memory_order_relaxed);
  }
  counters().team_setups.fetch_add(1, std::memory_order_relaxed);
  return got == n && pinned.load() == n - 1;
}

}  // namespace

bool automatic_mode_binds(bool kernel_packs_vcpus, int team, int allowed_cpus, bool busy) {
  if (team < 2 || allowed_cpus < team || busy) return false;
  return kernel_packs_vcpus || team == allowed_cpus;
}

TeamBindingScope::TeamBindingScope() { ++state().scope_depth; }

TeamBindingScope::~TeamBindingScope() {
  State& s = state();
  if (--s.scope_depth == 0) release(s);
}

TeamBinding::TeamBinding(bool wanted) {
  State& s = state();
  if (s.held) {
    bound_ = true;
    return;
  }
  if (!wanted) return;
  Counters& c = counters();
  const Mode mode = mode_from_env();
  if (mode == Mode::Off || omp_get_proc_bind() != omp_proc_bind_false) {
    c.disabled.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const int n = protean::num_threads();
  if (n < 2) {
    c.one_thread.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (omp_in_parallel()) {
    c.nested.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) {
    c.few_cpus.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::vector<int> allowed;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mask)) allowed.push_back(cpu);
  if (static_cast<int>(allowed.size()) < n) {
    c.few_cpus.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if ((mode == Mode::Auto || mode == Mode::Whole) &&
      !automatic_mode_binds(mode == Mode::Auto, n, static_cast<int>(allowed.size()), false)) {
    c.partial.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if ((mode == Mode::Auto || mode == Mode::Whole) && machine_busy(allowed.size())) {
    c.busy.fetch_add(1, std::memory_order_relaxed);
    // Workers pinned while the machine was quiet go back to the caller's mask (one parallel region,
    // once per change): pinned workers with a free caller are the worst of both.
    if (!s.team.empty()) {
      const int k = static_cast<int>(s.team.size());
#pragma omp parallel num_threads(k)
      {
        if (omp_get_thread_num() > 0) sched_setaffinity(0, sizeof mask, &mask);
      }
      s.team.clear();
    }
    return;
  }
  int here = sched_getcpu();
  if (here < 0 || !CPU_ISSET(here, &mask)) here = allowed[0];
  // Keep the workers of the last team when the size matches and their CPUs are still allowed: a
  // new set-up costs a parallel region and migrates the workers.
  auto allowed_cpu = [&](int cpu) { return cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &mask); };
  bool reuse = static_cast<int>(s.team.size()) == n && std::all_of(s.team.begin() + 1, s.team.end(), allowed_cpu);
  if (!reuse) {
    // The caller's CPU, then the next n-1 allowed CPUs after it (wrapping around).
    std::vector<int> team{here};
    const auto at = std::find(allowed.begin(), allowed.end(), here) - allowed.begin();
    for (size_t k = 1; team.size() < static_cast<size_t>(n); ++k)
      team.push_back(allowed[(static_cast<size_t>(at) + k) % allowed.size()]);
    if (!set_up_team(team)) {
      s.team.clear();
      c.few_cpus.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    s.team = std::move(team);
  }
  // The caller takes a CPU no worker has: its own when free, else the first free allowed one.
  auto worker_cpu = [&](int cpu) { return std::find(s.team.begin() + 1, s.team.end(), cpu) != s.team.end(); };
  int mine = here;
  if (worker_cpu(mine)) {
    auto free = std::find_if(allowed.begin(), allowed.end(), [&](int cpu) { return !worker_cpu(cpu); });
    mine = *free;  // exists: n - 1 workers, at least n allowed CPUs
  }
  if (!pin_self(mine)) return;
  s.team[0] = mine;
  s.saved = mask;
  s.held = true;
  c.bindings.fetch_add(1, std::memory_order_relaxed);
  bound_ = true;
  owner_ = s.scope_depth == 0;
}

TeamBinding::~TeamBinding() {
  if (owner_) release(state());
}

void with_caller_mask(const std::function<void()>& fn) {
  State& s = state();
  if (!s.held) {
    fn();
    return;
  }
  cpu_set_t narrowed;
  CPU_ZERO(&narrowed);
  sched_getaffinity(0, sizeof narrowed, &narrowed);
  sched_setaffinity(0, sizeof s.saved, &s.saved);
  try {
    fn();
  } catch (...) {
    sched_setaffinity(0, sizeof narrowed, &narrowed);
    throw;
  }
  sched_setaffinity(0, sizeof narrowed, &narrowed);
}

TeamBindingStats team_binding_stats() {
  const Counters& c = counters();
  TeamBindingStats r;
  r.bindings = c.bindings.load();
  r.team_setups = c.team_setups.load();
  r.skipped_one_thread = c.one_thread.load();
  r.skipped_nested = c.nested.load();
  r.skipped_few_cpus = c.few_cpus.load();
  r.skipped_disabled = c.disabled.load();
  r.skipped_busy = c.busy.load();
  r.skipped_partial = c.partial.load();
  return r;
}

std::vector<int> bound_team_cpus() { return state().team; }

}  // namespace protean::ops
