// The cpu backend's fused scaled-dot-product attention (backend/cpu/sdpa.h) against the eager
// kernel (ops/attention.cpp: matmul, masked softmax, matmul): causal and not, query and key lengths
// that differ and are not multiples of the key tile (64) or the vector (16), head sizes with and
// without the 64-wide fast path (value rows of 15 or 20 floats padded to whole vectors), explicit
// scale, empty key sets, NaN and large scores; and through a compiled graph whose sequence length is
// symbolic (one artifact for every length, the fused step as one extern).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/sdpa.h"
#include "cpu_test_util.h"
#include "ir_test_util.h"
#include "ops/gemm_team.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::backend::cpu {
namespace {

using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::check;
using testing::compile;
using testing::Compiled;

Tensor eager_sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const ops::Attrs& a) {
  std::vector<Tensor> in{q, k, v, Tensor()};
  return ops::run_eager(OpKind::scaled_dot_product_attention, in, a).at(0);
}

void expect_matches_eager(const Tensor& q, const Tensor& k, const Tensor& v, const ops::Attrs& a, const std::string& what) {
  std::vector<Tensor> in{q, k, v, Tensor()};
  std::optional<Tensor> got = sdpa_fused(in, a);
  ASSERT_TRUE(got.has_value()) << what;
  Tensor want = eager_sdpa(q, k, v, a);
  ASSERT_EQ(got->int_sizes(), want.int_sizes()) << what;
  EXPECT_TRUE(allclose(*got, want, 1e-4, 1e-5, true)) << what << ": max |diff| " << max_abs_diff(*got, want);
}

TEST(CpuSdpa, MatchesEagerOverShapesAndMasks) {
  manual_seed(51);
  struct Case {
    IntVec batch;
    int64_t L, S, E, Ev;
  };
  const Case cases[] = {{{1, 4}, 37, 37, 64, 64}, {{2}, 1, 1, 64, 64},   {{1, 2}, 100, 100, 64, 64},
                        {{3}, 17, 130, 24, 40},   {{2, 2}, 65, 64, 16, 8}, {{1}, 256, 256, 64, 64},
                        {{2}, 40, 7, 33, 64},     {{2, 4}, 70, 70, 32, 32}, {{1}, 33, 90, 16, 16},
                        {{1, 2}, 50, 50, 48, 48},  // head dims 16/32/48: the narrower register form
                        {{1, 8}, 120, 120, 15, 15}, {{2}, 90, 90, 20, 20}};  // value rows padded to 16 / 32
  for (const Case& c : cases)
    for (bool causal : {false, true}) {
      IntVec qs = c.batch, ks = c.batch, vs = c.batch;
      qs.insert(qs.end(), {c.L, c.E});
      ks.insert(ks.end(), {c.S, c.E});
      vs.insert(vs.end(), {c.S, c.Ev});
      Tensor q = mul(randn(qs), 2.0), k = randn(ks), v = randn(vs);
      ops::Attrs a{{"is_causal", causal}};
      expect_matches_eager(q, k, v, a, fmt::format("L={} S={} E={} Ev={} causal={}", c.L, c.S, c.E, c.Ev, causal));
      ops::Attrs scaled{{"is_causal", causal}, {"scale", 0.37}};
      expect_matches_eager(q, k, v, scaled, fmt::format("L={} S={} scale 0.37 causal={}", c.L, c.S, causal));
    }
}

TEST(CpuSdpa, LargeScoresNaNAndEmptyKeys) {
  manual_seed(52);
  // scores in the hundreds: every tile raises the running maximum; exp underflows to 0 for most keys
  Tensor q = mul(randn({1, 2, 70, 64}), 30.0), k = randn({1, 2, 70, 64}), v = randn({1, 2, 70, 64});
  expect_matches_eager(q, k, v, {{"is_causal", true}}, "large scores");
  // a NaN in a key row makes every query row that sees it NaN, as eager
  Tensor kn = k.clone();
  kn.data_ptr<float>()[5 * 64 + 3] = NAN;
  expect_matches_eager(q, kn, v, {{"is_causal", true}}, "NaN key");
  expect_matches_eager(q, kn, v, {{"is_causal", false}}, "NaN key, not causal");
  // no keys: zeros
  Tensor k0 = randn({1, 2, 0, 64}), v0 = randn({1, 2, 0, 64});
  std::vector<Tensor> in{q, k0, v0, Tensor()};
  std::optional<Tensor> got = sdpa_fused(in, {});
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(max_abs_diff(*got, zeros({1, 2, 70, 64})), 0.0);
}

// Heads of a fused QKV projection, read in place: q, k and v are views of one [1, L, 3·H·D] buffer
// (slice, reshape, transpose), their rows unit-stride but H·D·3 floats apart and their heads D apart;
// value rows of 15 (padded) and a q with a broadcast (stride 0) batch dim too.
TEST(CpuSdpa, ReadsHeadsOfAFusedProjectionInPlace) {
  for (const auto& [L, H, D] : {std::tuple<int64_t, int64_t, int64_t>{37, 4, 64}, {70, 2, 16}, {17, 8, 15}, {130, 3, 24}}) {
    const Tensor qkv = randn({1, L, 3 * H * D});
    auto head = [&](int64_t part) {
      return qkv.narrow(2, part * H * D, H * D).reshape({1, L, H, D}).transpose(1, 2);
    };
    const Tensor q = head(0), k = head(1), v = head(2);
    ASSERT_FALSE(q.is_contiguous());
    ASSERT_EQ(q.int_strides().back(), 1);
    for (bool causal : {false, true})
      expect_matches_eager(q, k, v, {{"is_causal", causal}}, fmt::format("L={} H={} D={} causal={}", L, H, D, causal));
  }
  const Tensor q1 = randn({1, 1, 20, 32}), k = randn({2, 3, 20, 32}), v = randn({2, 3, 20, 32});
  expect_matches_eager(q1.expand({2, 3, 20, 32}), k, v, {}, "q broadcast over batch and heads (stride 0)");
}

TEST(CpuSdpa, DeclinesWhatItDoesNotCover) {
  Tensor q = randn({2, 8, 16}), k = randn({2, 8, 16}), v = randn({2, 8, 16});
  auto declines = [](std::vector<Tensor> in) { return !sdpa_fused(in, {}).has_value(); };
  EXPECT_TRUE(declines({q, k, v, randn({8, 8})}));                                  // a mask
  EXPECT_TRUE(declines({q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), Tensor()}));  // f64
  EXPECT_TRUE(declines({q, randn({1, 8, 16}), randn({1, 8, 16}), Tensor()}));      // broadcast batch
  EXPECT_TRUE(declines({q.transpose(1, 2).contiguous().transpose(1, 2), k, v, Tensor()}));  // strided
  EXPECT_TRUE(declines({randn({2, 8, 0}), randn({2, 3, 0}), randn({2, 3, 4}), Tensor()}));  // empty heads: eager's answer
}

// On 2 threads with the GEMM team on (as when OpenMP's workers sleep between regions) the rows are
// shared with the team's worker: the same results as eager, causal or not, and the split counted.
TEST(CpuSdpa, RowsSharedWithTheGemmTeam) {
  manual_seed(54);
  const int threads = protean::num_threads();
  set_num_threads(2);
  ops::set_gemm_team_mode(ops::GemmTeamMode::On);
  for (int64_t L : {37, 200})
    for (bool causal : {false, true}) {
      Tensor q = randn({1, 4, L, 64}), k = randn({1, 4, L, 64}), v = randn({1, 4, L, 64});
      const int64_t splits = ops::gemm_team_stats().splits;
      expect_matches_eager(q, k, v, {{"is_causal", causal}}, fmt::format("team L={} causal={}", L, causal));
      EXPECT_EQ(ops::gemm_team_stats().splits, splits + 1) << "L=" << L << " causal=" << causal;
    }
  // below the work threshold: the calling thread alone
  Tensor q = randn({1, 1, 8, 16}), k = randn({1, 1, 8, 16}), v = randn({1, 1, 8, 16});
  const int64_t splits = ops::gemm_team_stats().splits;
  expect_matches_eager(q, k, v, {{"is_causal", true}}, "small");
  EXPECT_EQ(ops::gemm_team_stats().splits, splits);
  ops::set_gemm_team_mode(ops::GemmTeamMode::Auto);
  set_num_threads(threads);
}

// Through the cpu backend: the fused step is one extern, the sequence length symbolic, results equal
// to the interpreter (which runs the eager kernel) at every length.
// The heads of a fused QKV buffer (slice, reshape, permute) reach the fused kernel as views of that
// buffer: one extern step and no copy kernel before it, at every length, matching the interpreter.
TEST(CpuSdpa, HeadsOfAFusedBufferAreViewsInTheCompiledProgram) {
  manual_seed(59);
  GraphBuilder b("sdpa_heads");
  SymInt s0 = b.symbol("x.size()[1]", 37);
  ValueId qkv = b.input("qkv", {1, s0, 192});
  auto head = [&](int64_t part) {
    ValueId sl = b.call(OpKind::slice, {qkv}, {{"dim", SymInt(2)}, {"start", SymInt(part * 64)}, {"end", SymInt(part * 64 + 64)},
                                                {"step", SymInt(1)}});
    ValueId r = b.call(OpKind::reshape, {sl}, {{"shape", SymIntVec{1, s0, 4, 16}}});
    return b.call(OpKind::permute, {r}, {{"dims", SymIntVec{0, 2, 1, 3}}});
  };
  ValueId o = b.call(OpKind::scaled_dot_product_attention, {head(0), head(1), head(2), ir::kNoValue}, {{"is_causal", true}});
  Compiled c = compile(b, {o}, {s0});
  EXPECT_EQ(c.info.externs, 1) << c.info.source;
  EXPECT_EQ(c.info.kernels, 0) << "q, k and v copied before the attention:\n" << c.info.source;
  for (int64_t n : {37, 1, 16, 65, 130})
    check(c, {randn({1, n, 192})}, {n}, fmt::format("L={}", n));
}

TEST(CpuSdpa, CompiledGraphServesEveryLength) {
  manual_seed(53);
  GraphBuilder b("sdpa");
  SymInt s0 = b.symbol("x.size()[1]", 37);
  ValueId q = b.input("q", {1, 4, s0, 64}), k = b.input("k", {1, 4, s0, 64}), v = b.input("v", {1, 4, s0, 64});
  ValueId o = b.call(OpKind::scaled_dot_product_attention, {q, k, v, ir::kNoValue}, {{"is_causal", true}});
  Compiled c = compile(b, {o}, {s0});
  EXPECT_EQ(c.info.externs, 1) << c.info.source;
  EXPECT_EQ(c.info.kernels, 0) << c.info.source;
  for (int64_t n : {37, 1, 16, 64, 200})
    check(c, {randn({1, 4, n, 64}), randn({1, 4, n, 64}), randn({1, 4, n, 64})}, {n}, fmt::format("L={}", n));
}

}  // namespace
}  // namespace protean::backend::cpu
