// Repeated blocks of an ONNX model found at load and compiled as regions (src/frontends/onnx/regions.h,
// docs/regions.md "ONNX models"): a hand-built model of N residual MLP blocks, each with its own
// weights, gives one region type with N uses; a compile traces the body once (1 region compile, N-1
// hits) and its outputs equal the flat compile's and eager's on interp and cpu; a block that differs
// in one attribute is left out of the group.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "observe/log.h"
#include "onnx_test_util.h"
#include "protean/compile.h"

namespace protean {
namespace {

using onnx_test::Builder;

std::vector<float> seeded(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) % 2001 - 1000) / 4000.0f;
  }
  return v;
}

/// x: f32[N, 16] → `blocks` residual blocks: MatMul, Add, LeakyRelu(alpha), MatMul, Add, Add(x), Sub, Mul(0.5).
/// `alphas[k]` is block k's LeakyRelu alpha (default 0.1 for all).
std::string blocks_model(int blocks, const std::vector<float>& alphas = {}) {
  Builder b(17, "blocks");
  b.input("x", 1, {-1, 16}, {"N"}).output("y");
  b.init("half", {}, {0.5f});
  std::string cur = "x";
  for (int k = 0; k < blocks; ++k) {
    const std::string p = "b" + std::to_string(k) + ".";
    b.init(p + "w1", {16, 32}, seeded(16 * 32, 10 * k + 1)).init(p + "b1", {32}, seeded(32, 10 * k + 2));
    b.init(p + "w2", {32, 16}, seeded(32 * 16, 10 * k + 3)).init(p + "b2", {16}, seeded(16, 10 * k + 4));
    b.init(p + "shift", {16}, seeded(16, 10 * k + 5));
    b.node("MatMul", {cur, p + "w1"}, {p + "h1"}, p + "mm1");
    b.node("Add", {p + "h1", p + "b1"}, {p + "h2"}, p + "add1");
    auto* lr = b.node("LeakyRelu", {p + "h2"}, {p + "h3"}, p + "act");
    Builder::attr_f(lr, "alpha", static_cast<size_t>(k) < alphas.size() ? alphas[static_cast<size_t>(k)] : 0.1f);
    b.node("MatMul", {p + "h3", p + "w2"}, {p + "h4"}, p + "mm2");
    b.node("Add", {p + "h4", p + "b2"}, {p + "h5"}, p + "add2");
    b.node("Add", {p + "h5", cur}, {p + "h6"}, p + "res");
    const std::string out = k + 1 == blocks ? "y" : p + "out";
    b.node("Sub", {p + "h6", p + "shift"}, {p + "h7"}, p + "shift");
    b.node("Mul", {p + "h7", "half"}, {out}, p + "scale");
    cur = out;
  }
  return b.bytes();
}

// The blocks here have 8 nodes; the default (24) leaves blocks that small flat, and a group must save
// 200 nodes by default (PROTEAN_ONNX_REGION_MIN_SAVED, set to 0 for these tests).
const onnx::LoadOptions kSmall{.region_min_nodes = 8};

struct MinSavedZero {
  MinSavedZero() { ::setenv("PROTEAN_ONNX_REGION_MIN_SAVED", "0", 1); }
  ~MinSavedZero() { ::unsetenv("PROTEAN_ONNX_REGION_MIN_SAVED"); }
};

void expect_close(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_LE(onnx_test::max_abs_err(a, b), 1e-5);
}

TEST(OnnxRegions, RepeatedBlocksAreFoundAtLoad) {
  MinSavedZero min_saved;
  auto m = onnx::load_from_bytes(blocks_model(5), "blocks.onnx", kSmall);
  ASSERT_EQ(m->regions().size(), 1u);
  const onnx::RegionInfo& r = m->regions()[0];
  EXPECT_EQ(r.uses, 5);
  EXPECT_EQ(r.nodes, 8);
  EXPECT_EQ(r.weights, 5);  // w1, b1, w2, b2, shift; `half` is the same in every block: a constant of the body
  EXPECT_EQ(r.type.rfind("onnx.block0.", 0), 0u) << r.type;
  EXPECT_EQ(m->num_live_nodes(), 40);  // counts the blocks' nodes, not the uses
  // Below the default size: flat; below the default saving (5 uses of 8 nodes save 32): flat too.
  EXPECT_TRUE(onnx::load_from_bytes(blocks_model(5), "blocks.onnx")->regions().empty());
  ::unsetenv("PROTEAN_ONNX_REGION_MIN_SAVED");
  EXPECT_TRUE(onnx::load_from_bytes(blocks_model(5), "blocks.onnx", kSmall)->regions().empty());
  ::setenv("PROTEAN_ONNX_REGION_MIN_SAVED", "0", 1);
  // Off: the graph as the file has it.
  EXPECT_TRUE(onnx::load_from_bytes(blocks_model(5), "blocks.onnx", {.find_regions = false, .region_min_nodes = 8})
                  ->regions()
                  .empty());
  // Equal blocks of two models have the same structural hash (they can share a compiled body).
  EXPECT_EQ(onnx::load_from_bytes(blocks_model(3), "three.onnx", kSmall)->regions().at(0).type, r.type);
}

TEST(OnnxRegions, EagerForwardIsUnchanged) {
  MinSavedZero min_saved;
  auto with = onnx::load_from_bytes(blocks_model(4), "blocks.onnx", kSmall);
  auto without = onnx::load_from_bytes(blocks_model(4), "blocks.onnx", {.find_regions = false});
  Tensor x = randn({3, 16});
  expect_close(with->forward({x})[0], without->forward({x})[0]);
}

class OnnxRegionsCompile : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxRegionsCompile, OneRegionCompileAndNMinusOneHitsWithTheFlatCompilesOutputs) {
  MinSavedZero min_saved;
  constexpr int kBlocks = 6;
  auto m = onnx::load_from_bytes(blocks_model(kBlocks), "blocks.onnx", kSmall);
  Tensor x = randn({4, 16});
  Tensor eager = m->forward({x})[0];
  reset();
  auto flat = compile([m](const Tensor& t) { return m->forward({t})[0]; },
                      {.name = "flat", .backend = GetParam(), .auto_regions = false});
  Tensor yf = flat(x);
  EXPECT_EQ(stats().region_compiles, 0);
  reset();
  observe::LogCapture logs("regions");
  auto regional = compile([m](const Tensor& t) { return m->forward({t})[0]; },
                          {.name = "regional", .backend = GetParam()});
  Tensor yr = regional(x);
  Stats s = stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.region_compiles, 1);
  EXPECT_EQ(s.region_hits, kBlocks - 1);
  expect_close(yr, yf);
  expect_close(yr, eager);
  const std::string text = logs.str();
  EXPECT_NE(text.find("compiled at nodes 'b0.mm1'..'b0.scale'"), std::string::npos) << text;
  EXPECT_NE(text.find("hit at nodes 'b5.mm1'..'b5.scale'"), std::string::npos) << text;
  // Another input of the same shape: a cache hit of the frame; the regions are not traced again.
  Tensor x2 = randn({4, 16});
  expect_close(regional(x2), m->forward({x2})[0]);
  EXPECT_EQ(stats().region_compiles, 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, OnnxRegionsCompile, ::testing::Values("interp", "cpu"));

TEST(OnnxRegions, ABlockThatDiffersInAnAttributeIsLeftOutOfTheGroup) {
  MinSavedZero min_saved;
  auto m = onnx::load_from_bytes(blocks_model(4, {0.1f, 0.1f, 0.2f, 0.1f}), "split.onnx", kSmall);
  ASSERT_EQ(m->regions().size(), 1u);
  const onnx::RegionInfo& r = m->regions()[0];
  EXPECT_EQ(r.uses, 3);
  EXPECT_EQ(r.sites, (std::vector<std::string>{"nodes 'b0.mm1'..'b0.scale'", "nodes 'b1.mm1'..'b1.scale'",
                                               "nodes 'b3.mm1'..'b3.scale'"}));
  // Another alpha everywhere: another structure, another region type.
  auto other = onnx::load_from_bytes(blocks_model(4, {0.2f, 0.2f, 0.2f, 0.2f}), "other.onnx", kSmall);
  ASSERT_EQ(other->regions().size(), 1u);
  EXPECT_NE(other->regions()[0].type.substr(other->regions()[0].type.rfind('.')),
            r.type.substr(r.type.rfind('.')));
  reset();
  Tensor x = randn({2, 16});
  auto f = compile([m](const Tensor& t) { return m->forward({t})[0]; }, {.name = "split", .backend = "interp"});
  expect_close(f(x), m->forward({x})[0]);
  EXPECT_EQ(stats().region_compiles, 1);
  EXPECT_EQ(stats().region_hits, 2);
}

}  // namespace
}  // namespace protean
