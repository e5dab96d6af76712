// Protean's own team for splitting one f32 GEMM over the intra-op threads.
//
// Why: with OMP_WAIT_POLICY=passive libgomp's workers sleep (futex) as soon as a parallel region
// ends, so every oneDNN GEMM region wakes its worker again: on the 2-vCPU Zen 5 VM a wake-up costs
// ~10 us of scheduling delay plus the futex and IPI work on both sides, and the end of each region
// puts the caller to sleep in the same way. The compiled MLP 784-1024-1024-10 at batch 32 ran ~10
// context switches per call on 2 threads (5 regions: 3 GEMMs, 2 relu passes) and ~100 us of system
// time per call (`perf stat`), 470 us a call against 610 on one thread (docs/cpu.md "Threads").
//
// What: a GEMM that splits (gemm_dnnl in linear.cpp) runs one column slice on the caller and one on
// each team worker, each slice a one-thread oneDNN primitive followed by the call's post-ops on that
// slice; no OpenMP region is entered. A worker that finished a slice spins for a bounded time
// (gemm_team_spin_us(), default 100 us, with a sched_yield every few microseconds so that any other
// thread runnable on its CPU runs first) before it sleeps on a futex, so the next GEMM of the same
// call (the next layer) starts on a running worker. Workers are std::threads started on first use;
// when the caller's OpenMP team is bound to CPUs (thread_binding.h), worker i runs on the CPU of
// OpenMP thread i (the two never compute at the same time: a GEMM is either split here or an OpenMP
// region).
//
// When: the mode (PROTEAN_GEMM_TEAM, read once): 0 never; 1 always; unset or anything else only when
// OpenMP's workers sleep between regions (OMP_WAIT_POLICY=passive or GOMP_SPINCOUNT=0). libgomp's
// default policy spins its workers for milliseconds after each region, so there is no wake-up to save,
// and a spinning OpenMP worker and a team worker on one CPU would take turns by the time slice.
// PROTEAN_GEMM_TEAM_SPIN_US (read once, 0 .. 100000): the spin bound in microseconds.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace protean::ops {

/// The team's mode: off, on, or automatic (on when OpenMP workers sleep between regions).
enum class GemmTeamMode { Off, On, Auto };

/// Whether GEMMs may split over the team now (the mode, resolved; see the file comment).
bool gemm_team_enabled();

/// Overrides the mode for the rest of the process (tests and benchmarks; the environment is then
/// ignored). Auto resolves from the environment as at start.
void set_gemm_team_mode(GemmTeamMode mode);

/// The bound of a worker's spin after a slice, in microseconds (PROTEAN_GEMM_TEAM_SPIN_US, default 100).
int64_t gemm_team_spin_us();

/// Runs fn(0) on the calling thread and fn(1) .. fn(n - 1) on team workers 0 .. n - 2 (started on
/// first use), and returns when all have finished. `cpus` (empty, or at least one entry per index): the CPU
/// each index runs on, where the caller's team is bound (entry 0, the caller's, is not applied);
/// empty leaves the workers on the process's own mask. The first exception thrown by any fn is
/// rethrown here after all finished. Returns false, running nothing, when the team cannot take the
/// call: n < 2, the caller is a team worker or inside an OpenMP parallel region, or another thread's
/// split is in flight (the caller then runs its GEMM as it otherwise would).
bool run_on_gemm_team(int n, const std::function<void(int)>& fn, const std::vector<int>& cpus = {});

/// run_on_gemm_team on the bound team (ops/thread_binding.h): a TeamBinding(`bind`) around the call,
/// and where the team is bound then (by it or by an enclosing TeamBindingScope) each index runs on its
/// bound CPU. `bind` false binds nothing itself (a kernel too small to pay for the binding) but still
/// follows an enclosing scope's binding. Returns what run_on_gemm_team returns.
bool run_on_bound_gemm_team(int n, const std::function<void(int)>& fn, bool bind);

/// Counters since process start: splits run on the team, and those refused because the team was busy
/// with another thread's split. `wakeups`: slices posted to a worker that had gone to sleep (it had
/// spun out its bound), `hot`: slices a spinning worker picked up.
struct GemmTeamStats {
  int64_t splits = 0;
  int64_t busy = 0;
  int64_t wakeups = 0;
  int64_t hot = 0;
};
GemmTeamStats gemm_team_stats();

/// Products from which a GEMM splits over the team (multiply-adds): 1M, ~10 us on one core; a
/// smaller one runs on the caller alone (one-thread primitive) while the team is enabled.
constexpr int64_t kGemmTeamMinMacs = int64_t{1} << 20;

/// Products from kGemmTeamMinMacs up to this many multiply-adds split only over a hot team (one
/// whose workers still spin after their last slice, gemm_team_hot): waking a sleeping worker cost
/// 10-20 us on a quiet 2-vCPU VM and up to ~200 us on a busy one, more than splitting a product
/// below a few million multiply-adds saves (cpu2_bench's MLP at batch 1, whose one 1M product per call
/// came each time after the worker had gone to sleep, ran at 0.3-0.6x its 1-thread speed on 2 threads).
/// PROTEAN_GEMM_TEAM_COLD_MACS (default 4M; 0: every product from kGemmTeamMinMacs splits).
int64_t gemm_team_cold_min_macs();
/// Overrides gemm_team_cold_min_macs for the rest of the process (tests, benchmarks); -1 restores the
/// environment's value.
void set_gemm_team_cold_min_macs(int64_t macs);
/// Whether a split into `n` parts would find its n - 1 workers started and spinning, none asleep (a
/// hint: a worker may fall asleep right after). False while another thread's split is in flight.
bool gemm_team_hot(int n);
/// Columns of the smallest column slice: oneDNN's blocked f32 weights hold 64 columns a block
/// (BA16a64b), so slices start on a multiple of 64; a product with fewer than kGemmTeamMinRows rows and
/// fewer than 64 columns per thread does not split.
constexpr int64_t kGemmTeamColumnBlock = 64;
/// Rows of the smallest row slice: a product with at least this many rows per thread splits by rows
/// (linear.cpp gemm_dnnl: a row slice keeps oneDNN's brgemm kernel), a shorter one by columns.
constexpr int64_t kGemmTeamMinRows = 8;

}  // namespace protean::ops
