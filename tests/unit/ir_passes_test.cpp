// DCE, CSE, constant folding and the pipeline: before → after golden pairs.
#include <gtest/gtest.h>

#include "ir/parser.h"
#include "ir/passes/constant_folding.h"
#include "ir/passes/cse.h"
#include "ir/passes/dce.h"
#include "ir/passes/inline_regions.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "backend/interp/interp.h"
#include "ir_test_util.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::ir {
namespace {

using ops::OpKind;
using testing::GraphBuilder;

Graph golden(const char* name) { return parse(testing::read_file(testing::golden_path(name))); }

TEST(IrDce, GoldenPair) {
  Graph g = golden("dce_before.txt");
  EXPECT_EQ(dead_code_elimination(g), 3u);
  testing::expect_golden(print(g), "dce_after.txt");
  EXPECT_NO_THROW(verify(g, {.check_types = false}));
  EXPECT_EQ(dead_code_elimination(g), 0u);  // idempotent
  EXPECT_EQ(g.inputs().size(), 2u);         // placeholders are kept even when unused
}

TEST(IrDce, KeepsEverythingLive) {
  Graph g = golden("mlp.txt");
  std::string before = print(g);
  EXPECT_EQ(dead_code_elimination(g), 0u);
  EXPECT_EQ(print(g), before);
}

TEST(IrCse, GoldenPair) {
  Graph g = golden("cse_before.txt");
  EXPECT_NO_THROW(verify(g));
  EXPECT_EQ(common_subexpression_elimination(g), 4u);
  testing::expect_golden(print(g), "cse_after.txt");
  EXPECT_NO_THROW(verify(g));
  EXPECT_EQ(common_subexpression_elimination(g), 0u);
}

TEST(IrCse, DifferentSymbolicAttrsAreKept) {
  Graph g = parse(
      "graph f(%x : f32[s0, 4]):\n"
      "  %0 : f32[2*s0, 2] = reshape(%x, shape=[2*s0, 2])\n"
      "  %1 : f32[s0, 2, 2] = reshape(%x, shape=[s0, 2, 2])\n"
      "  return (%0, %1)\n");
  EXPECT_EQ(common_subexpression_elimination(g), 0u);
}

TEST(IrCse, SameConstantObjectMerged) {
  GraphBuilder b;
  Tensor t = ones({4});
  ValueId x = b.input("x", {4});
  ValueId c1 = b.constant(t);
  ValueId c2 = b.constant(t);
  ValueId c3 = b.constant(ones({4}));  // equal data, different object: kept
  ValueId a = b.call(OpKind::add, {x, c1});
  ValueId m = b.call(OpKind::add, {x, c2});
  ValueId k = b.call(OpKind::add, {x, c3});
  Graph& g = b.done({a, m, k});
  EXPECT_EQ(common_subexpression_elimination(g), 2u);
  EXPECT_EQ(dead_code_elimination(g), 0u);
  testing::expect_text(print(g),
                       "graph f(%x : f32[4]):\n"
                       "  %c0 : f32[4] = constant()\n"
                       "  %c2 : f32[4] = constant()\n"
                       "  %0 : f32[4] = add(%x, %c0)\n"
                       "  %1 : f32[4] = add(%x, %c2)\n"
                       "  return (%0, %0, %1)\n");
}

TEST(IrConstantFolding, FoldsConstantSubgraphsAndFactories) {
  GraphBuilder b("fold");
  SymInt s0 = b.symbol("x.size()[0]", 3);
  ValueId x = b.input("x", {s0, 4});
  ValueId w = b.constant(tensor<float>({1, 2, 3, 4}, {4}), "w");
  ValueId two = b.call(OpKind::full, {}, {{"shape", SymIntVec{4}}, {"value", 2.0}, {"dtype", DType::F32}},
                       {"fold.cpp", 3, ""});
  ValueId scaled = b.call(OpKind::mul, {w, two}, {}, {"fold.cpp", 4, ""});
  ValueId shifted = b.call(OpKind::add, {scaled, w}, {}, {"fold.cpp", 5, ""});
  ValueId y = b.call(OpKind::mul, {x, shifted}, {}, {"fold.cpp", 6, ""});
  ValueId dyn = b.call(OpKind::full, {}, {{"shape", SymIntVec{s0}}, {"value", 1.0}, {"dtype", DType::F32}});
  Graph& g = b.done({y, dyn});
  EXPECT_EQ(constant_folding(g), 3u);
  EXPECT_NO_THROW(verify(g));
  EXPECT_EQ(dead_code_elimination(g), 3u);
  testing::expect_text(print(g),
                       "graph fold(%x : f32[s0, 4]):\n"
                       "  %c2 : f32[4] = constant()  # fold.cpp:5\n"
                       "  %0 : f32[s0, 4] = mul(%x, %c2)  # fold.cpp:6\n"
                       "  %1 : f32[s0] = full(shape=[s0], value=1.0, dtype=f32)\n"
                       "  return (%0, %1)\n");
  const Tensor& folded = g.nodes()[1].constant;
  EXPECT_EQ(folded.to_vector<float>(), (std::vector<float>{3, 6, 9, 12}));
}

/// x + sum(sum(big)), where big is a 64x64 factory (or neg of a 64x64 constant when big_input).
Graph threshold_graph(bool big_input) {
  GraphBuilder b;
  ValueId x = b.input("x", {4});
  ValueId big;
  if (big_input) {
    big = b.call(OpKind::neg, {b.constant(zeros({64, 64}))});
  } else {
    ops::Attrs fa;
    fa.set("shape", SymIntVec{64, 64}).set("value", 0.0).set("dtype", DType::F32);
    big = b.call(OpKind::full, {}, fa);
  }
  ops::Attrs s1, s2;
  s1.set("dims", SymIntVec{0}).set("keepdim", false);
  s2.set("dims", SymIntVec()).set("keepdim", false);
  ValueId s = b.call(OpKind::sum, {b.call(OpKind::sum, {big}, s1)}, s2);
  b.done({b.call(OpKind::add, {x, s})});
  return std::move(b.g);
}

TEST(IrConstantFolding, SizeThreshold) {
  auto make = threshold_graph;
  Graph small_limit = make(false);
  EXPECT_EQ(constant_folding(small_limit, {.max_elements = 1000}), 0u);  // 4096-element factory: not folded
  Graph large_limit = make(false);
  EXPECT_EQ(constant_folding(large_limit, {.max_elements = 4096}), 3u);
  Graph big_input = make(true);
  EXPECT_EQ(constant_folding(big_input, {.max_elements = 1000}), 3u);    // no growth: input as large
}

TEST(IrConstantFolding, LeavesPlaceholderAndUnfoldableWork) {
  Graph g = parse(
      "graph f(%x : f32[4]):\n"
      "  %c0 : f32[4] = constant()\n"  // no data (parsed): cannot fold through it
      "  %0 : f32[4] = neg(%c0)\n"
      "  %1 : f32[4] = permute(%x, dims=[0])\n"
      "  return (%0, %1)\n");
  std::string before = print(g);
  EXPECT_EQ(constant_folding(g), 0u);
  EXPECT_EQ(print(g), before);
}

TEST(IrPipeline, StepsTimingsAndLogging) {
  Graph g = golden("cse_before.txt");
  std::vector<std::string> seen;
  PassOptions o;
  o.verify = true;
  o.on_step = [&](std::string_view step, const Graph& graph) {
    seen.push_back(std::string(step) + ":" + std::to_string(graph.num_calls()));
  };
  PassTimings t = run_passes(g, o);
  EXPECT_EQ(seen, (std::vector<std::string>{"input:12", "dead_code_elimination:12", "constant_folding:12",
                                            "range_gather_as_slice:12", "common_subexpression_elimination:8",
                                            "dead_code_elimination:8"}));
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[3].first, "common_subexpression_elimination");
  for (const auto& [name, secs] : t) EXPECT_GE(secs, 0.0) << name;
  testing::expect_golden(print(g), "cse_after.txt");
}

TEST(IrPipeline, VerifierNamesTheBrokenInput) {
  Graph g = golden("mlp.txt");
  g.nodes().back().inputs.push_back(99);
  PassOptions o;
  o.verify = true;
  try {
    run_passes(g, o);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("after IR step 'input'"), std::string::npos) << e.what();
  }
}

TEST(IrPipeline, PassesCanBeTurnedOff) {
  Graph g = golden("cse_before.txt");
  PassOptions o;
  o.common_subexpression_elimination = false;
  o.constant_folding = false;
  o.range_gather_as_slice = false;
  PassTimings t = run_passes(g, o);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(g.num_calls(), 12u);
}

TEST(IrPasses, InlineRegionsExpandsEveryUseAndKeepsTheResults) {
  // body(a [s0, 8], w [8, 8]) = relu(a @ w) + a, called twice with different weights, then *2.
  GraphBuilder bb("Block");
  SymInt s0 = bb.symbol("x.size()[0]", 5);
  ValueId a = bb.input("a", {s0, 8}), w = bb.input("w", {8, 8});
  ValueId r = bb.call(OpKind::add, {bb.call(OpKind::relu, {bb.call(OpKind::matmul, {a, w})}), a});
  auto body = std::make_shared<const Graph>(std::move(bb.done({r})));
  GraphBuilder& b = bb;  // the same ShapeEnv: the body shares the caller's symbols
  b.g = Graph();
  b.g.name = "outer";
  ValueId x = b.input("x", {s0, 8}), w1 = b.input("w1", {8, 8}), w2 = b.input("w2", {8, 8});
  auto region = [&](ValueId in, ValueId wt) {
    sym::ShapeEnvScope scope(b.env);
    TensorMeta m = TensorMeta::contiguous(b.g.value(in).sizes, DType::F32);
    return b.g.add_call(OpKind::call_region, {in, wt}, {{"region", std::string("Block")}}, {m}, {}, {body}).at(0);
  };
  ValueId y = b.call(OpKind::mul, {region(region(x, w1), w2), b.constant(scalar_tensor(2.0))});
  Graph g = b.done({y});
  verify(g);
  ASSERT_TRUE(has_regions(g));
  Graph flat = inline_regions(g);
  verify(flat);
  EXPECT_FALSE(has_regions(flat));
  size_t matmuls = 0;
  for (const Node& n : flat.nodes()) matmuls += n.kind == NodeKind::Call && n.op == OpKind::matmul;
  EXPECT_EQ(matmuls, 2u);
  EXPECT_EQ(flat.inputs().size(), 3u);
  std::vector<sym::Expr> syms = {s0.expr()};
  backend::Interpreter nested(std::make_shared<const Graph>(g), syms), inlined(std::make_shared<const Graph>(flat), syms);
  for (int64_t n : {1, 5, 12}) {
    std::vector<Tensor> in = {randn({n, 8}), randn({8, 8}), randn({8, 8})};
    Tensor want = nested.run(in, std::span<const int64_t>(&n, 1)).at(0);
    Tensor got = inlined.run(in, std::span<const int64_t>(&n, 1)).at(0);
    EXPECT_TRUE(allclose(got, want, 0, 0)) << "rows " << n << ": " << max_abs_diff(got, want);
  }
  // A body that does not take what its call passes is a CompileError naming the body.
  GraphBuilder b2("bad");
  ValueId x2 = b2.input("x", {SymInt(4), 8});
  TensorMeta m2 = TensorMeta::contiguous({SymInt(4), SymInt(8)}, DType::F32);
  ValueId y2 = b2.g.add_call(OpKind::call_region, {x2}, {{"region", std::string("Block")}}, {m2}, {}, {body}).at(0);
  Graph bad = b2.done({y2});
  try {
    inline_regions(bad);
    ADD_FAILURE() << "a call passing one input to a two-input body was inlined";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("Block"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace protean::ir
