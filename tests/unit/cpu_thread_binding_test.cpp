// The OpenMP team on distinct CPUs while a GEMM runs (ops/thread_binding.h): after a compiled,
// interpreted or eager linear at 2 threads the worker is pinned to one CPU and the caller's mask is
// its own again; inside a run the caller is narrowed to a CPU no worker has; one thread binds nothing;
// calls that may create threads see the caller's own mask. Skipped with fewer than 2 allowed CPUs,
// under OMP_PROC_BIND or PROTEAN_BIND_THREADS=0 (the binding is off there by design). The tests set
// PROTEAN_BIND_THREADS=1 so that a loaded machine does not turn the binding off (automatic mode).
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "cpu_test_util.h"
#include "ops/thread_binding.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::ops {
namespace {

std::vector<int> my_cpus() {
  cpu_set_t m;
  CPU_ZERO(&m);
  EXPECT_EQ(sched_getaffinity(0, sizeof m, &m), 0);
  std::vector<int> r;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &m)) r.push_back(c);
  return r;
}

/// The CPU mask of each thread of a 2-thread team of the calling thread (thread number = index).
std::vector<std::vector<int>> team_masks() {
  std::vector<std::vector<int>> r(2);
#pragma omp parallel num_threads(2)
  {
    const int t = omp_get_thread_num();
    if (t < 2) r[static_cast<size_t>(t)] = my_cpus();
  }
  return r;
}

class ThreadBinding : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* e = std::getenv("PROTEAN_BIND_THREADS");
    if (e && std::strcmp(e, "0") == 0) GTEST_SKIP() << "PROTEAN_BIND_THREADS=0";
    // binding whatever the load average (the automatic mode skips it on a busy machine); read once
    // per process, so this holds when this test is the process's first binding (ctest runs each
    // test alone) and is skipped below otherwise
    setenv("PROTEAN_BIND_THREADS", "1", 0);
    if (omp_get_proc_bind() != omp_proc_bind_false) GTEST_SKIP() << "OMP_PROC_BIND in effect";
    if (my_cpus().size() < 2) GTEST_SKIP() << "fewer than 2 allowed CPUs";
    backend::cpu::testing::use_test_cache_dir();
    threads_ = num_threads();
    set_num_threads(2);
    omp_set_num_threads(2);
    before_ = my_cpus();
  }
  void TearDown() override {
    if (threads_ > 0) set_num_threads(threads_);
  }
  int threads_ = 0;
  std::vector<int> before_;
};

Tensor lin(const Tensor& x, const Tensor& w, const Tensor& b) { return relu(linear(x, w, b)); }

/// After a call, the worker runs on exactly the CPU the binding gave it, a different one from the
/// caller's, and the caller has its mask back.
void expect_bound_worker(const std::vector<int>& before) {
  EXPECT_EQ(my_cpus(), before) << "the caller's CPU mask is restored after the call";
  const std::vector<int> team = bound_team_cpus();
  ASSERT_EQ(team.size(), 2u);
  EXPECT_NE(team[0], team[1]);
  const auto masks = team_masks();
  ASSERT_EQ(masks[1].size(), 1u) << "the worker is pinned to one CPU";
  EXPECT_EQ(masks[1][0], team[1]);
}

TEST_F(ThreadBinding, CompiledLinearPinsWorkerAndRestoresCaller) {
  CompileOptions o;
  o.backend = "cpu";
  o.name = "bind_linear";
  auto f = compile(lin, o);
  Tensor x = randn({64, 512}), w = randn({512, 512}), b = randn({512});  // 16.8M multiply-adds
  const TeamBindingStats s0 = team_binding_stats();
  Tensor y = f(x, w, b);
  if (team_binding_stats().skipped_busy > s0.skipped_busy) GTEST_SKIP() << "automatic mode on a busy machine";
  EXPECT_LT(max_abs_diff(y, lin(x, w, b)), 1e-3);
  EXPECT_GT(team_binding_stats().bindings, s0.bindings);
  expect_bound_worker(before_);
}

TEST_F(ThreadBinding, InterpretedAndEagerLinearPinWorker) {
  CompileOptions o;
  o.backend = "interp";
  o.name = "bind_linear_interp";
  auto f = compile(lin, o);
  Tensor x = randn({64, 512}), w = randn({512, 512}), b = randn({512});
  const int64_t busy = team_binding_stats().skipped_busy;
  (void)f(x, w, b);
  if (team_binding_stats().skipped_busy > busy) GTEST_SKIP() << "automatic mode on a busy machine";
  expect_bound_worker(before_);
  (void)lin(x, w, b);  // eager: the guard around the primitive alone
  expect_bound_worker(before_);
}

TEST_F(ThreadBinding, ScopeKeepsCallerOnAFreeCpuUntilItEnds) {
  Tensor x = randn({64, 512}), w = randn({512, 512});
  {
    TeamBindingScope scope;
    const int64_t busy = team_binding_stats().skipped_busy;
    (void)linear(x, w, Tensor());
    if (team_binding_stats().skipped_busy > busy) GTEST_SKIP() << "automatic mode on a busy machine";
    const std::vector<int> team = bound_team_cpus();
    ASSERT_EQ(team.size(), 2u);
    EXPECT_EQ(my_cpus(), std::vector<int>{team[0]}) << "narrowed to its CPU while the scope lasts";
    TeamBinding nested(false);  // a small kernel: binds nothing itself, sees the scope's binding
    EXPECT_TRUE(nested.bound());
    std::vector<int> inside;
    with_caller_mask([&] { inside = my_cpus(); });
    EXPECT_EQ(inside, before_) << "thread-creating calls see the caller's own mask";
    EXPECT_EQ(my_cpus(), std::vector<int>{team[0]});
  }
  EXPECT_EQ(my_cpus(), before_);
}

TEST_F(ThreadBinding, SmallProductsAndOneThreadBindNothing) {
  const int64_t bindings = team_binding_stats().bindings;
  (void)linear(randn({1, 256}), randn({256, 256}), Tensor());  // 65536 multiply-adds: below the floor
  EXPECT_EQ(team_binding_stats().bindings, bindings);
  set_num_threads(1);
  const int64_t one = team_binding_stats().skipped_one_thread;
  (void)linear(randn({64, 512}), randn({512, 512}), Tensor());
  EXPECT_EQ(team_binding_stats().bindings, bindings);
  EXPECT_GT(team_binding_stats().skipped_one_thread, one);
  EXPECT_EQ(my_cpus(), before_);
}

// The automatic mode's rule: with sched_vcpu_pack any team of 2+ on a quiet machine; without it only
// a team that spans every allowed CPU (a smaller team is left to the scheduler, which can pick idle
// CPUs); never one thread, more threads than CPUs, or a busy machine.
TEST(ThreadBindingRule, AutomaticModeBindsWholeTeamsOrWhereTheKernelPacks) {
  EXPECT_TRUE(automatic_mode_binds(false, 2, 2, false));
  EXPECT_TRUE(automatic_mode_binds(false, 16, 16, false));
  EXPECT_FALSE(automatic_mode_binds(false, 2, 16, false));
  EXPECT_TRUE(automatic_mode_binds(true, 2, 16, false));
  EXPECT_FALSE(automatic_mode_binds(true, 2, 2, true));
  EXPECT_FALSE(automatic_mode_binds(false, 2, 2, true));
  EXPECT_FALSE(automatic_mode_binds(false, 1, 1, false));
  EXPECT_FALSE(automatic_mode_binds(true, 3, 2, false));
}

}  // namespace
}  // namespace protean::ops
