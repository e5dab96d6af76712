// Regional compilation (docs/regions.md): a repeated child Module traced once per region key and
// called through one call_region node per use. Each scenario checks the region counts
// (Stats::region_compiles / region_hits), what the `regions` log says split two variants, and that
// the result equals both the full (inlined) compile and eager. Runs on interp, and on cpu under the
// `cpu.` prefix (scenario_util.h), where a body is built once and called per use.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "breaks_test_util.h"
#include "observe/log.h"
#include "protean/protean.h"
#include "region_model.h"
#include "scenario_util.h"

namespace pt = protean;
using pt::Tensor;
using pt::scenario::Block;
using pt::scenario::expect_same;
using pt::scenario::Model;

namespace {

class Regions : public pt::scenario::BreaksTest {};

/// The suite's backend (scenario_util.h) for compile_regions.
pt::CompileOptions region_opts(pt::CompileOptions o = {}) {
  if (o.backend == pt::CompileOptions{}.backend) o.backend = pt::scenario::scenario_backend();
  return o;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

TEST_F(Regions, RepeatedBlockCompilesOnceAndMatchesFullCompileAndEager) {
  auto m = std::make_shared<Model>(4, 32, 4);
  Tensor x = pt::randn({2, 8, 32});
  Tensor eager = m->forward(x);
  Tensor full = pt::scenario::scenario_compile(m, {.name = "full"})(x);
  EXPECT_EQ(pt::stats().region_compiles, 0);  // no region types: every block inlined
  pt::reset();
  pt::observe::LogCapture logs("regions");
  auto f = pt::compile_regions(m, {.types = {"Block"}}, region_opts({.name = "regional"}));
  Tensor y = f(x);
  expect_same(y, eager);
  expect_same(y, full);
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.region_compiles, 1);
  EXPECT_EQ(s.region_hits, 3);
  const std::string text = logs.str();
  EXPECT_EQ(count(text, "region protean::scenario::Block#0 compiled at self.blocks.0"), 1u) << text;
  EXPECT_EQ(count(text, "region protean::scenario::Block#0 hit at self.blocks."), 3u) << text;
  // Steady calls are cache hits of the frame; regions are not traced again.
  expect_same(f(x), eager);
  EXPECT_EQ(pt::stats().region_compiles, 1);
  EXPECT_EQ(pt::stats().cache_hits, 1);
}

TEST_F(Regions, PerInstanceWeightsAreInputsNotConstants) {
  auto m = std::make_shared<Model>(3, 16, 2);
  auto f = pt::compile_regions(m, {.types = {"Block"}}, region_opts({.name = "weights"}));
  Tensor x = pt::randn({1, 4, 16});
  expect_same(f(x), m->forward(x));
  // New weights in block 2 only: the same compiled body reads them (no recompile).
  *m->blocks[2]->w1 = pt::randn({64, 16});
  *m->blocks[1]->attn->wo = pt::randn({16, 16});
  expect_same(f(x), m->forward(x));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.region_compiles, 1);
  EXPECT_EQ(s.region_hits, 2);
}

TEST_F(Regions, AttributeDifferenceSplitsVariantsAndTheLogNamesIt) {
  auto m = std::make_shared<Model>(4, 32, 4);
  m->blocks[2]->attn->set_attribute("causal", 1);
  pt::observe::LogCapture logs("regions");
  auto f = pt::compile_regions(m, {.types = {"Block"}}, region_opts({.name = "causal"}));
  Tensor x = pt::randn({2, 8, 32});
  expect_same(f(x), m->forward(x));
  auto s = pt::stats();
  EXPECT_EQ(s.region_compiles, 2);  // Block#0 (causal 0) and Block#1 (causal 1)
  EXPECT_EQ(s.region_hits, 2);      // blocks 1 and 3 reuse Block#0
  const std::string text = logs.str();
  EXPECT_NE(text.find("region protean::scenario::Block#1 compiled at self.blocks.2 ("), std::string::npos) << text;
  EXPECT_NE(text.find("split from earlier variants by attribute self.blocks.2.attn.causal: 1 vs 0 "
                      "(protean::scenario::Block#0)"),
            std::string::npos)
      << text;
  // The attribute stays guarded: flipping it back on block 2 recompiles the frame, never a wrong body.
  m->blocks[2]->attn->set_attribute("causal", 0);
  expect_same(f(x), m->forward(x));
  EXPECT_EQ(pt::stats().compiles, 2);
}

TEST_F(Regions, NestedRegionsKeyOnInnerAttributes) {
  auto m = std::make_shared<Model>(4, 32, 4);
  m->blocks[2]->attn->set_attribute("causal", 1);
  auto f = pt::compile_regions(m, {.types = {"Block", "Attention"}}, region_opts({.name = "nested"}));
  Tensor x = pt::randn({2, 8, 32});
  expect_same(f(x), m->forward(x));
  auto s = pt::stats();
  // Block#0 traces Attention#0; blocks 1 and 3 hit Block#0; block 2 (causal) traces Block#1, whose
  // attention is Attention#1: an outer body never reuses an inner body keyed on another value.
  EXPECT_EQ(s.region_compiles, 4);
  EXPECT_EQ(s.region_hits, 2);
}

TEST_F(Regions, SameBlockInTwoContextsGetsOneVariantPerInputType) {
  auto b = std::make_shared<Block>(16, 2);
  struct Twice : pt::Module {
    std::shared_ptr<Block> b;
    Tensor forward(const Tensor& x, const Tensor& y) {
      return pt::cat({pt::call(b, x), pt::call(b, y), pt::call(b, x)}, 1);
    }
  };
  auto m = std::make_shared<Twice>();
  m->b = m->register_module("b", b);
  pt::observe::LogCapture logs("regions");
  auto f = pt::compile_regions(m, {.types = {"Block"}}, region_opts({.name = "twice", .arg_names = {"x", "y"}}));
  Tensor x = pt::randn({1, 6, 16}), y = pt::randn({1, 3, 16});
  expect_same(f(x, y), m->forward(x, y));
  auto s = pt::stats();
  EXPECT_EQ(s.region_compiles, 2);
  EXPECT_EQ(s.region_hits, 1);
  const std::string text = logs.str();
  EXPECT_NE(text.find("split from earlier variants by argument 0: f32[1, 3, 16]"), std::string::npos) << text;
}

TEST_F(Regions, VariantLimitInlinesWithOneWarningOrFailsWhenAsked) {
  auto m = std::make_shared<Model>(4, 16, 2);
  for (int i = 0; i < 4; ++i) m->blocks[static_cast<size_t>(i)]->attn->set_attribute("heads", i % 2 ? 2 : 1);
  m->blocks[3]->attn->set_attribute("heads", 4);  // keys: heads 1, 2, 1, 4 → three variants
  {
    pt::observe::LogCapture logs("");
    auto f = pt::compile_regions(m, {.types = {"Block"}, .max_variants = 2}, region_opts({.name = "limited"}));
    Tensor x = pt::randn({1, 4, 16});
    expect_same(f(x), m->forward(x));
    auto s = pt::stats();
    EXPECT_EQ(s.region_compiles, 2);
    EXPECT_EQ(s.region_hits, 1);
    EXPECT_EQ(s.eager_fallbacks, 0);  // never eager: the fourth block is traced inline
    const std::string text = logs.str();
    EXPECT_EQ(count(text, "hit its variant limit (2)"), 1u) << text;
    EXPECT_NE(text.find("attribute self.blocks.3.attn.heads: 4 vs 1"), std::string::npos) << text;
  }
  pt::reset();
  auto g = pt::compile_regions(m, {.types = {"Block"}, .max_variants = 2},
                               region_opts({.name = "strict", .fail_on_recompile_limit_hit = true}));
  Tensor x = pt::randn({1, 4, 16});
  std::string err = pt::scenario::compile_error_of([&] { g(x); });
  EXPECT_NE(err.find("region protean::scenario::Block hit its variant limit (2) in strict at self.blocks.3."),
            std::string::npos)
      << err;
}

TEST_F(Regions, RecompileForANewShapeTracesRegionsAgain) {
  auto m = std::make_shared<Model>(3, 16, 2);
  auto f = pt::compile_regions(m, {.types = {"Block"}}, region_opts({.name = "shapes"}));
  for (int64_t t : {4, 6, 9}) {
    Tensor x = pt::randn({2, t, 16});
    expect_same(f(x), m->forward(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);         // static, then T dynamic (automatic dynamic)
  EXPECT_EQ(s.region_compiles, 2);  // one body per compile
  EXPECT_EQ(s.region_hits, 4);
}

TEST_F(Regions, CallOutsideCompileIsForward) {
  auto m = std::make_shared<Model>(2, 16, 2);
  Tensor x = pt::randn({1, 3, 16});
  expect_same(pt::call(m, x), m->forward(x));
  EXPECT_EQ(pt::stats().region_compiles, 0);
  EXPECT_THROW(pt::compile_regions(m, {}), pt::ValueError);
}

// ---- modular compilation (include/protean/submodules.h) ----------------------------------------------
namespace {
struct Enc : pt::Module {
  Enc() { w = &register_parameter("w", pt::randn({16, 16}) * 0.25); }
  Tensor forward(const Tensor& x) { return pt::relu(pt::matmul(x, *w)); }
  Tensor* w;
};
struct Head : pt::Module {
  Tensor forward(const Tensor& x) { return pt::tanh(x * 2.0 + 1.0); }
};
struct Net : pt::Module {
  Net() {
    e0 = register_module("enc0", std::make_shared<Enc>());
    e1 = register_module("enc1", std::make_shared<Enc>());
    head = register_module("head", std::make_shared<Head>());
  }
  Tensor forward(const Tensor& x) { return pt::call(head, pt::call(e1, pt::call(e0, x)) + 0.5); }
  std::shared_ptr<Enc> e0, e1;
  std::shared_ptr<Head> head;
};
}  // namespace

TEST_F(Regions, SubmodulesWithEqualOptionsInlineAndOthersStayBoundaries) {
  auto net = std::make_shared<Net>();
  pt::observe::LogCapture logs("regions");
  const pt::CompileOptions root = region_opts({.name = "net"});
  pt::CompileOptions enc = root, head = root;
  enc.name = "";
  head.name = "";
  head.dynamic = pt::Dynamic::On;
  auto f = pt::compile_submodules(net, {{"enc.*", enc}, {"head", head}}, root);
  for (int64_t b : {2, 3, 5}) {
    Tensor x = pt::randn({b, 16});
    expect_same(f(x), net->forward(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.eager_fallbacks, 0);
  EXPECT_EQ(s.graph_breaks, 1);
  ASSERT_EQ(s.graph_break_reasons.size(), 1u);
  EXPECT_NE(s.graph_break_reasons.begin()->first.find(
                "submodule boundary: self.head runs its own frame (dynamic On vs Auto)"),
            std::string::npos)
      << s.graph_break_reasons.begin()->first;
  EXPECT_TRUE(f.segmented());
  const std::string text = logs.str();
  EXPECT_NE(text.find("submodule self.enc0 inlined into net: equal options"), std::string::npos) << text;
  EXPECT_NE(text.find("submodule self.enc1 inlined into net: equal options"), std::string::npos) << text;
  EXPECT_NE(text.find("submodule self.head is a boundary in net: its own frame (dynamic On vs Auto)"), std::string::npos)
      << text;
  EXPECT_THROW(pt::compile_submodules(net, {{"enc(", enc}}), pt::ValueError);
}

TEST_F(Regions, SubmoduleBoundaryUnderFullgraphIsAnError) {
  auto net = std::make_shared<Net>();
  pt::CompileOptions root = region_opts({.name = "strictnet", .fullgraph = true});
  pt::CompileOptions head = root;
  head.mode = "max-autotune";
  auto f = pt::compile_submodules(net, {{"head", head}}, root);
  std::string err = pt::scenario::compile_error_of([&] { f(pt::randn({2, 16})); });
  EXPECT_NE(err.find("submodule boundary: self.head runs its own frame (mode max-autotune vs default)"), std::string::npos)
      << err;
}

// ---- kernel dedup (cpu backend, every compile) -------------------------------------------------------
TEST_F(Regions, FullCompileOfRepeatedBlocksBuildsEachKernelBodyOnce) {
  auto m = std::make_shared<Model>(4, 16, 2);
  pt::observe::LogCapture logs("output_code");
  auto f = pt::compile(m, {.name = "dedup", .backend = "cpu"});
  Tensor x = pt::randn({2, 5, 16});
  expect_same(f(x), m->forward(x));
  const std::string text = logs.str();
  const std::string tag = "cpu kernel dedup: ";
  size_t at = text.find(tag);
  ASSERT_NE(at, std::string::npos) << "no dedup line";
  int kernels = 0, distinct = 0;
  ASSERT_EQ(std::sscanf(text.c_str() + at + tag.size(), "%d kernels, %d distinct", &kernels, &distinct), 2);
  // Four blocks: each block's kernels repeat the first block's (the final LayerNorm is extra).
  EXPECT_GT(kernels, 4);
  EXPECT_LE(distinct * 3, kernels) << kernels << " kernels, " << distinct << " distinct";
}

// A region inside a training step (compile_train_step): the loss and the parameters after two SGD
// steps, i.e. the gradients, equal the flat compile's; the blocks stay one region body.
TEST_F(Regions, TrainStepThroughRegionsGivesTheFlatCompilesGradients) {
  auto train = [](bool regional, pt::Stats& stats) {
    pt::reset();
    pt::manual_seed(5);
    auto m = std::make_shared<Model>(2, 8, 2);
    std::vector<Tensor> params;
    for (auto& [name, p] : m->named_parameters()) params.push_back(p);
    pt::optim::SGD opt(params, pt::optim::SGDOptions{.lr = 0.1});
    pt::CompileOptions o = region_opts({.name = regional ? "regional_step" : "flat_step"});
    if (regional) o.region_types = {"Block"};
    auto step = pt::compile_train_step(
        m,
        [m](Tensor x) {
          Tensor y = m->forward(x);
          return pt::mean(y * y);
        },
        opt, o);
    Tensor x = pt::randn({2, 4, 8});
    std::vector<Tensor> out;
    for (int i = 0; i < 2; ++i) out.push_back(step(x).clone());
    for (auto& [name, p] : m->named_parameters()) out.push_back(p.detach().clone());
    stats = pt::stats();
    return out;
  };
  pt::Stats flat_stats, regional_stats;
  std::vector<Tensor> flat = train(false, flat_stats);
  pt::observe::LogCapture logs("regions");
  std::vector<Tensor> regional = train(true, regional_stats);
  ASSERT_EQ(flat.size(), regional.size());
  for (size_t i = 0; i < flat.size(); ++i)
    EXPECT_TRUE(pt::allclose(regional[i], flat[i], 1e-4, 1e-5))
        << "tensor " << i << " (0, 1: losses; then the parameters): " << pt::max_abs_diff(regional[i], flat[i]);
  EXPECT_EQ(regional_stats.region_compiles, 1) << logs.str();
  EXPECT_EQ(regional_stats.region_hits, 1) << logs.str();
  EXPECT_EQ(flat_stats.region_compiles, 0);
}
