// Binding an OpenMP team to distinct CPUs while it runs a parallel kernel.
//
// Why: with OMP_WAIT_POLICY=passive (or any wait that ends in a futex sleep) a kernel's worker
// thread sleeps between parallel regions, and the scheduler picks its CPU again at every wake-up. On
// some virtual machines the guest scheduler places a woken thread on its waker's CPU (the 2-vCPU
// Zen 5 VM of the benchmarks runs a kernel that packs tasks onto busy vCPUs,
// /proc/sys/kernel/sched_vcpu_pack): the worker then shares the caller's CPU, both threads compute
// in turns, and a 2-thread GEMM takes as long as a 1-thread one (measured with `perf sched
// timehist`: before the binding both threads of the compiled MLP ran on CPU 0 for the whole run;
// docs/cpu.md "Threads"). A CPU affinity per thread leaves the scheduler no such choice.
//
// What: the team of the calling thread for protean::num_threads() threads gets one CPU each, out of
// the caller's own affinity mask: the caller keeps the CPU it is on, the workers take the others
// (pinned once per team, and again when the thread count changes; libgomp keeps its pool threads, so
// later regions of the same size run on the same pinned workers). The caller's own mask is narrowed
// to its CPU only while a binding is held, and restored when the outermost one ends, so threads and
// processes it creates afterwards (compiler jobs, user threads) inherit its original mask.
//
// Not bound: one thread; a call inside a parallel region; fewer allowed CPUs than threads; an
// OpenMP binding the user asked for (OMP_PROC_BIND, omp_get_proc_bind() != false); a busy machine
// (1-minute load average >= allowed CPUs + 0.5, sampled once a second: a pinned worker would wait for
// a CPU another process holds, and each region for it; workers pinned earlier are unpinned then).
// When: where the kernel packs woken threads onto busy vCPUs (/proc/sys/kernel/sched_vcpu_pack
// present and not 0), any team; elsewhere only a team that spans every allowed CPU (threads = CPUs of
// the affinity mask, as on a 2-vCPU VM with 2 threads): binding it takes away no placement the
// scheduler could choose better, and guest kernels without that file pack too (the 2-vCPU Xeon VM of
// the benchmarks: 2-thread GEMMs at 0.76-1.0x of one thread in some processes unbound, 1.6-1.9x in
// every process bound). A smaller team on a larger machine is left to the scheduler, which wakes a
// worker on an idle CPU there. PROTEAN_BIND_THREADS (read once): 0 never binds, 1 binds whatever the
// kernel, the team's size and the load, unset or anything else is the automatic mode above.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace protean::ops {

/// A region of the calling thread (a compiled program's run, an interpreter run) in which parallel
/// kernels may bind the team. Nothing happens on construction: the first bind_team() inside the
/// scope binds, and the binding then lasts until the outermost scope ends (one narrowing and one
/// restore of the caller's mask per run, instead of one per kernel). Scopes nest; not copyable.
class TeamBindingScope {
 public:
  TeamBindingScope();
  ~TeamBindingScope();
  TeamBindingScope(const TeamBindingScope&) = delete;
  TeamBindingScope& operator=(const TeamBindingScope&) = delete;
};

/// Binds the team for a parallel kernel about to run on this thread (see the file comment). Inside a
/// TeamBindingScope the binding outlives the guard (it ends with the scope); outside one, the
/// guard's destructor restores the caller's mask. `wanted` false (a kernel too small to pay for the
/// binding: three system calls, more on a first set-up) binds nothing, but bound() still tells
/// whether an enclosing scope's binding is in effect.
class TeamBinding {
 public:
  explicit TeamBinding(bool wanted = true);
  ~TeamBinding();
  TeamBinding(const TeamBinding&) = delete;
  TeamBinding& operator=(const TeamBinding&) = delete;
  /// Whether this thread's team is bound now (by this guard or an enclosing scope's binding).
  bool bound() const { return bound_; }

 private:
  bool bound_ = false;
  bool owner_ = false;  // this guard narrowed the caller's mask and restores it
};

/// The automatic mode's rule: whether a team of `team` threads (the caller included) out of
/// `allowed_cpus` CPUs in the caller's mask is bound, given whether the kernel announces vCPU packing
/// (sched_vcpu_pack) and whether the machine is busy (see the file comment). Pure; for tests.
bool automatic_mode_binds(bool kernel_packs_vcpus, int team, int allowed_cpus, bool busy);

/// Runs `fn` with the caller's own mask while a binding narrows it (as is otherwise): for calls
/// that may create threads, which inherit the mask (openblas_set_num_threads growing its pool).
void with_caller_mask(const std::function<void()>& fn);

/// Counters since process start (all threads): bindings made (the caller's mask narrowed),
/// workers pinned (team set-ups, one parallel region each), and bindings skipped by reason.
struct TeamBindingStats {
  int64_t bindings = 0;
  int64_t team_setups = 0;
  int64_t skipped_one_thread = 0;
  int64_t skipped_nested = 0;
  int64_t skipped_few_cpus = 0;
  int64_t skipped_disabled = 0;  ///< PROTEAN_BIND_THREADS=0 or OMP_PROC_BIND in effect
  int64_t skipped_busy = 0;      ///< load average at least the allowed CPUs + 0.5 (automatic mode)
  int64_t skipped_partial = 0;   ///< a team smaller than the allowed CPUs (automatic mode without sched_vcpu_pack)
};
TeamBindingStats team_binding_stats();

/// The CPUs the calling thread's team was last pinned to (index = OpenMP thread number; entry 0 is
/// the CPU the caller was given), empty before the first binding on this thread. For tests.
std::vector<int> bound_team_cpus();

/// Work (multiply-adds) from which a GEMM or convolution binds the team: 16M, ~80 us on one core
/// (the MLP's products from batch 20, the attention block's QKV product from L = 82). With 4M the
/// attention block at L = 37 and 64 (7-13M QKV products) ran 4-6 % slower on 2 threads after an MLP
/// in the same process (`cpu2_bench --threads 2 --cases attention,mlp`, the two thresholds alternating
/// twice on the idle VM); the MLP did not change.
/// Smaller kernels run bound only inside a scope whose binding a larger one already made.
constexpr int64_t kBindTeamMinMacs = int64_t{1} << 24;

}  // namespace protean::ops
