// Protean's GEMM team (ops/gemm_team.h): run_on_gemm_team runs every index once (index 0 on the
// caller, the others on other threads), refuses nested calls, passes exceptions back; a linear,
// linear_fused and matmul split into column slices on the team give what the unsplit OpenMP path
// gives (post-ops on each slice, NaN kept through relu, bias and full-size operands sliced), and
// products too small to split or with post-ops left to oneDNN take the paths the file comment names.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cpu_test_util.h"
#include "ops/gemm_team.h"
#include "ops/registry.h"
#include "protean/ops.h"
#include "protean/tensor.h"
#include "protean/tensor_version.h"

namespace protean::ops {
namespace {

using backend::cpu::testing::expect_close;
using backend::cpu::testing::rnd;

class GemmTeam : public ::testing::Test {
 protected:
  void SetUp() override {
    threads_ = num_threads();
    set_num_threads(2);
    set_gemm_team_cold_min_macs(0);  // every product from kGemmTeamMinMacs splits, hot team or not
  }
  void TearDown() override {
    set_gemm_team_mode(GemmTeamMode::Auto);
    set_gemm_team_cold_min_macs(-1);
    set_num_threads(threads_);
  }
  int threads_ = 1;
};

TEST_F(GemmTeam, RunsEveryIndexOnceIndexZeroOnTheCaller) {
  for (int n : {2, 3, 4}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
    std::vector<std::thread::id> who(static_cast<size_t>(n));
    std::function<void(int)> fn = [&](int i) {
      runs[static_cast<size_t>(i)].fetch_add(1);
      who[static_cast<size_t>(i)] = std::this_thread::get_id();
    };
    const int64_t splits = gemm_team_stats().splits;
    ASSERT_TRUE(run_on_gemm_team(n, fn));
    EXPECT_EQ(gemm_team_stats().splits, splits + 1);
    for (int i = 0; i < n; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "n " << n << " index " << i;
    EXPECT_EQ(who[0], std::this_thread::get_id());
    std::set<std::thread::id> distinct(who.begin(), who.end());
    EXPECT_EQ(distinct.size(), static_cast<size_t>(n)) << "each index on its own thread";
  }
  // many calls in a row (the worker spinning between them) all complete
  std::atomic<int> total{0};
  std::function<void(int)> add = [&](int) { total.fetch_add(1); };
  for (int k = 0; k < 200; ++k) ASSERT_TRUE(run_on_gemm_team(2, add));
  EXPECT_EQ(total.load(), 400);
}

TEST_F(GemmTeam, RefusesOneThreadNestedAndParallelCallers) {
  std::function<void(int)> nothing = [](int) {};
  EXPECT_FALSE(run_on_gemm_team(1, nothing));
  // from a team worker: refused (the caller runs its slice itself)
  std::atomic<int> refused{0};
  std::function<void(int)> nested = [&](int i) {
    if (i == 1 && !run_on_gemm_team(2, nothing)) refused.fetch_add(1);
  };
  ASSERT_TRUE(run_on_gemm_team(2, nested));
  EXPECT_EQ(refused.load(), 1);
  // inside an OpenMP parallel region: refused
  std::atomic<int> refused_in_region{0}, team{0};
#pragma omp parallel num_threads(2)
  {
    team.fetch_add(1);
    if (!run_on_gemm_team(2, nothing)) refused_in_region.fetch_add(1);
  }
  EXPECT_EQ(refused_in_region.load(), team.load());
}

TEST_F(GemmTeam, ExceptionsComeBackToTheCaller) {
  std::function<void(int)> worker_throws = [](int i) {
    if (i == 1) throw std::runtime_error("slice 1 failed");
  };
  try {
    run_on_gemm_team(2, worker_throws);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "slice 1 failed");
  }
  std::function<void(int)> caller_throws = [](int i) {
    if (i == 0) throw std::runtime_error("slice 0 failed");
  };
  EXPECT_THROW(run_on_gemm_team(2, caller_throws), std::runtime_error);
  // the team still works afterwards
  std::atomic<int> ran{0};
  std::function<void(int)> fn = [&](int) { ran.fetch_add(1); };
  EXPECT_TRUE(run_on_gemm_team(2, fn));
  EXPECT_EQ(ran.load(), 2);
}

Tensor eager(OpKind op, const std::vector<Tensor>& in, const Attrs& attrs = {}) { return run_eager(op, in, attrs)[0]; }

/// `op` on `in` with `attrs`, with the team off (OpenMP regions) and on; both results, and the
/// number of splits the team-on call made.
struct Both {
  Tensor off, on;
  int64_t splits = 0;
};
Both run_both(OpKind op, const std::vector<Tensor>& in, const Attrs& attrs = {}) {
  set_gemm_team_mode(GemmTeamMode::Off);
  Both r;
  r.off = run_eager(op, in, attrs)[0];
  set_gemm_team_mode(GemmTeamMode::On);
  const int64_t before = gemm_team_stats().splits;
  r.on = run_eager(op, in, attrs)[0];
  r.splits = gemm_team_stats().splits - before;
  return r;
}

TEST_F(GemmTeam, SplitLinearMatchesTheOpenMpPath) {
  manual_seed(3);
  // M x N x K, >= 1M multiply-adds: by rows (M >= 16 on 2 threads; an odd M leaves the slices one row
  // apart), by columns (fewer rows, N >= 128; N not a multiple of 64); not split: too small (a
  // one-thread primitive on the caller), too few rows and columns
  struct Shape {
    int64_t M, N, K;
    bool splits;
  };
  for (Shape s : {Shape{32, 1024, 784, true}, Shape{33, 1024, 784, true}, Shape{7, 1000, 784, true},
                  Shape{1, 1024, 1024, true}, Shape{64, 130, 256, true}, Shape{32, 10, 1024, false},
                  Shape{4, 256, 64, false}, Shape{4096, 100, 64, true}, Shape{15, 100, 1024, false}}) {
    const std::string what = "linear " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K);
    Tensor x = rnd({s.M, s.K}), w = rnd({s.N, s.K}, 0.05), b = rnd({s.N});
    Both r = run_both(OpKind::linear, {x, w, b});
    expect_close(r.on, r.off, what);
    EXPECT_EQ(r.splits, s.splits ? 1 : 0) << what;
    Attrs relu;
    relu.set("post_ops", "relu");
    r = run_both(OpKind::linear_fused, {x, w, b}, relu);
    expect_close(r.on, r.off, what + ", relu");
    EXPECT_EQ(r.splits, s.splits ? 1 : 0) << what << ", relu";
    // a residual of the output's shape and a per-column scale: operands sliced with the columns
    Attrs bin;
    bin.set("post_ops", "add(#3), mul(#4), relu");
    r = run_both(OpKind::linear_fused, {x, w, b, rnd({s.M, s.N}), rnd({s.N})}, bin);
    expect_close(r.on, r.off, what + ", add, mul, relu");
  }
  // a 3-D input folded into one product of 2 x 17 rows, split by rows between the two batch items'
  // rows: a residual of the output's shape and a per-column scale are read at each slice's rows
  {
    Tensor x3 = rnd({2, 17, 256}), w3 = rnd({512, 256}, 0.05), b3 = rnd({512});
    Attrs bin;
    bin.set("post_ops", "add(#3), mul(#4), relu");
    Both r3 = run_both(OpKind::linear_fused, {x3, w3, b3, rnd({2, 17, 512}), rnd({512})}, bin);
    expect_close(r3.on, r3.off, "linear 2x17x256 -> 512, add, mul, relu");
    EXPECT_EQ(r3.splits, 1);
  }
  // a 1-D weight: the output drops the column dim (N = 1), post-ops on the whole result
  Tensor x = rnd({64, 512}), w = rnd({512}, 0.05);
  Attrs relu;
  relu.set("post_ops", "relu");
  Both r = run_both(OpKind::linear_fused, {x, w, rnd({})}, relu);
  expect_close(r.on, r.off, "linear, 1-D weight, relu");
  EXPECT_EQ(r.splits, 0);
}

// Below gemm_team_cold_min_macs a product does not wake a sleeping worker: it runs on the caller
// alone, with the split path's results; a larger one still splits.
TEST_F(GemmTeam, ASmallProductDoesNotWakeASleepingTeam) {
  manual_seed(6);
  set_gemm_team_cold_min_macs(int64_t{1} << 22);
  set_gemm_team_mode(GemmTeamMode::On);
  Tensor big_x = rnd({32, 784}), big_w = rnd({1024, 784}, 0.05), big_b = rnd({1024});
  const int64_t before = gemm_team_stats().splits;
  eager(OpKind::linear, {big_x, big_w, big_b});  // 25.7M multiply-adds: splits, the worker exists
  EXPECT_EQ(gemm_team_stats().splits, before + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // past the worker's spin: asleep
  EXPECT_FALSE(gemm_team_hot(2));
  Tensor x = rnd({1, 1024}), w = rnd({1024, 1024}, 0.05), b = rnd({1024});  // 1M multiply-adds
  Both r = run_both(OpKind::linear, {x, w, b});
  expect_close(r.on, r.off, "linear 1x1024x1024, cold team");
  EXPECT_EQ(r.splits, 0);
  Tensor x8 = rnd({8, 1024});  // 8.4M: splits however cold the team
  r = run_both(OpKind::linear, {x8, w, b});
  expect_close(r.on, r.off, "linear 8x1024x1024, cold team");
  EXPECT_EQ(r.splits, 1);
}

TEST_F(GemmTeam, SplitKeepsNanThroughReluAndSlicesEveryColumn) {
  const int64_t M = 8, N = 256, K = 1024;
  Tensor x = full({M, K}, 0.01), w = full({N, K}, 0.01), b = full({N}, -1.0);
  x.data_ptr<float>()[3 * K + 5] = std::numeric_limits<float>::quiet_NaN();  // row 3 all NaN
  w.data_ptr<float>()[200 * K + 7] = std::numeric_limits<float>::infinity();  // column 200: ±inf
  b.data_ptr<float>()[10] = 100.0f;                                          // column 10 positive
  Attrs relu;
  relu.set("post_ops", "relu");
  set_gemm_team_mode(GemmTeamMode::On);
  const int64_t before = gemm_team_stats().splits;
  Tensor y = eager(OpKind::linear_fused, {x, w, b}, relu);
  EXPECT_EQ(gemm_team_stats().splits, before + 1);
  const float* p = y.data_ptr<float>();
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float v = p[i * N + j];
      if (i == 3) EXPECT_TRUE(std::isnan(v)) << i << "," << j;
      else if (j == 200) EXPECT_TRUE(std::isinf(v) && v > 0) << i << "," << j;
      else if (j == 10) EXPECT_NEAR(v, 100.0f + K * 1e-4f, 1e-3f) << i << "," << j;
      else EXPECT_EQ(v, 0.0f) << i << "," << j;  // 0.1024 - 1 < 0: relu
    }
}

TEST_F(GemmTeam, MatmulSlicesAndOneDnnPostOps) {
  manual_seed(4);
  // matmul with a row-major right operand (column slices at an offset of c0 elements)
  Tensor a = rnd({48, 512}), m = rnd({512, 384}, 0.05);
  Both r = run_both(OpKind::matmul, {a, m});
  expect_close(r.on, r.off, "matmul");
  EXPECT_EQ(r.splits, 1);
  // a batched left operand folds into rows
  Tensor a3 = rnd({2, 24, 512});
  r = run_both(OpKind::matmul, {a3, m});
  expect_close(r.on, r.off, "matmul, folded batch");
  EXPECT_EQ(r.splits, 1);
  // gelu stays with oneDNN's post-ops (the OpenMP path): no split
  Attrs gelu;
  gelu.set("post_ops", "gelu_erf");
  r = run_both(OpKind::matmul_fused, {a, m}, gelu);
  expect_close(r.on, r.off, "matmul, gelu");
  EXPECT_EQ(r.splits, 0);
  // a true batch (several products): the OpenMP path
  r = run_both(OpKind::bmm, {rnd({3, 64, 256}), rnd({3, 256, 256}, 0.05)});
  expect_close(r.on, r.off, "bmm");
  EXPECT_EQ(r.splits, 0);
}

TEST_F(GemmTeam, PackedWeightsPerSliceAcrossCalls) {
  manual_seed(5);
  Tensor x = rnd({32, 784}), w = rnd({1024, 784}, 0.05), b = rnd({1024});
  Attrs packed;
  packed.set("weights", "reuse");
  packed.set("post_ops", "relu");
  set_gemm_team_mode(GemmTeamMode::Off);
  Tensor want = eager(OpKind::linear_fused, {x, w, b}, packed);
  set_gemm_team_mode(GemmTeamMode::On);
  for (int call = 0; call < 3; ++call)  // first sighting, packing, packed
    expect_close(eager(OpKind::linear_fused, {x, w, b}, packed), want, "call " + std::to_string(call));
  // new weights in the same storage, announced: the slices repack
  Tensor w2 = rnd({1024, 784}, 0.05);
  std::memcpy(w.data_ptr<float>(), w2.data_ptr<float>(), sizeof(float) * 1024 * 784);
  increment_version(w);
  set_gemm_team_mode(GemmTeamMode::Off);
  want = eager(OpKind::linear_fused, {x, w, b}, packed);
  set_gemm_team_mode(GemmTeamMode::On);
  expect_close(eager(OpKind::linear_fused, {x, w, b}, packed), want, "after the weights changed");
}

}  // namespace
}  // namespace protean::ops
