// Deep graphs: a long chain of ops lowers into kernels of bounded expression depth, so nothing that
// walks an expression recurses with the graph's size, and a large program is rendered in the form
// that compiles in time linear in its size (no explicit vector form).
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cpu/codegen.h"
#include "ir_test_util.h"
#include "loop/lower.h"
#include "loop/schedule.h"

namespace protean::loop {
namespace {

using ir::testing::GraphBuilder;
using ops::OpKind;

size_t max_depth(const Program& p) {
  size_t d = 0;
  for (const Kernel& k : p.kernels)
    for (const Stage& s : k.stages) d = std::max(d, s_depth(s.body));
  return d;
}

TEST(LoopDeepGraph, PointwiseChainIsSplitIntoShallowKernels) {
  GraphBuilder b("deep");
  ir::ValueId y = b.input("x", {64, 256});
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: y = b.call(OpKind::mul, {y, b.constant(scalar_tensor(0.999))}); break;
      case 1: y = b.call(OpKind::add, {y, b.constant(scalar_tensor(0.001))}); break;
      case 2: y = b.call(OpKind::sin, {y}); break;
      case 3: y = b.call(OpKind::tanh, {y}); break;
    }
  }
  b.done({y});
  Program p = lower_graph(b.g, {});
  schedule_program(p);
  apply_schedule(p, CpuSchedulePolicy());
  EXPECT_TRUE(p.externs.empty());
  EXPECT_GE(p.kernels.size(), static_cast<size_t>(n) / (kMaxExprDepth * 2));  // a constant operand adds a level
  EXPECT_LE(max_depth(p), kMaxExprDepth + 4);
  EXPECT_TRUE(backend::cpu::large_program(p));
  const std::string code = backend::cpu::generate_kernels(p);
  EXPECT_EQ(code.find("pt::vld("), std::string::npos) << "a large program has no explicit vector form";
  EXPECT_FALSE(to_text(p).empty());
}

TEST(LoopDeepGraph, ALargeProgramOfShortKernelsKeepsTheVectorForm) {
  // A training step is large because it has many kernels, not deep ones: its short pointwise kernels
  // keep the explicit vector form (each at most kLargeProgramVectorKernelNodes nodes, here 60 x 56
  // nodes in all, within kLargeProgramVectorNodes).
  GraphBuilder b("wide");
  std::vector<ir::ValueId> outs;
  for (int i = 0; i < 60; ++i) {
    ir::ValueId y = b.input("x" + std::to_string(i), {64, 256 + 16 * i});  // distinct shapes: one kernel each
    for (int j = 0; j < 6; ++j) y = b.call(j % 2 ? OpKind::tanh : OpKind::sin, {b.call(OpKind::mul, {y, y})});
    outs.push_back(y);
  }
  b.done(outs);
  Program p = lower_graph(b.g, {});
  schedule_program(p);
  apply_schedule(p, CpuSchedulePolicy());
  ASSERT_TRUE(backend::cpu::large_program(p));
  size_t vector_kernels = 0;
  for (const Kernel& k : p.kernels) vector_kernels += k.schedule.vector ? 1 : 0;
  EXPECT_EQ(vector_kernels, p.kernels.size());
  EXPECT_NE(backend::cpu::generate_kernels(p).find("pt::vld("), std::string::npos);
}

TEST(LoopDeepGraph, ViewChainDoesNotNestClosures) {
  // Views add no expression node, only index arithmetic: the chain of inlined rules is bounded too.
  GraphBuilder b("views");
  ir::ValueId y = b.input("x", {8, 16});
  for (int i = 0; i < 4000; ++i) y = b.call(OpKind::permute, {y}, {{"dims", SymIntVec{1, 0}}});
  b.done({y});
  Program p = lower_graph(b.g, {});
  EXPECT_GT(p.kernels.size(), 1u);
  EXPECT_LE(max_depth(p), kMaxExprDepth + 4);
}

TEST(LoopDeepGraph, DepthIsIterativeAndCountsTheLongestPath) {
  SExpr e = s_load(0, DType::F32, sym::integer(0));
  for (int i = 0; i < 10000; ++i) e = s_unary(ScalarOp::neg, e, DType::F32);
  EXPECT_EQ(s_depth(e), 10001u);
  SExpr shared = s_binary(ScalarOp::add, e, e, DType::F32);
  EXPECT_EQ(s_depth(shared), 10002u);
}

}  // namespace
}  // namespace protean::loop

namespace protean::loop {
namespace {

TEST(LoopLower, ACatReadByTwoExternsIsRealizedOnce) {
  // The gradient of a fused projection, cat(dq, dk, dv), feeds the input-gradient and weight-gradient
  // GEMMs (the second through a reshape and a permute): one kernel gathers the parts into one buffer
  // that both read, instead of one gather per GEMM.
  for (bool second : {true, false}) {
    GraphBuilder b("cat_two_gemms");
    ir::ValueId q = b.input("q", {64, 32}), k = b.input("k", {64, 32}), w = b.input("w", {96, 16});
    ir::ValueId a = b.input("a", {64, 16});
    ir::ValueId c = b.call(OpKind::cat, {q, k, b.call(OpKind::neg, {q})}, {{"dim", SymInt(1)}});
    std::vector<ir::ValueId> outs = {b.call(OpKind::matmul, {c, w})};
    if (second) {
      ir::ValueId ct = b.call(OpKind::permute, {b.call(OpKind::reshape, {c}, {{"shape", SymIntVec{64, 96}}})},
                              {{"dims", SymIntVec{1, 0}}});
      outs.push_back(b.call(OpKind::matmul, {ct, a}));
    }
    b.done(outs);
    LowerOptions lo;  // the cpu backend's
    lo.cat_stages = lo.split_views = lo.extern_views = true;
    Program p = lower_graph(b.g, {}, lo);
    ASSERT_EQ(p.externs.size(), second ? 2u : 1u);
    EXPECT_EQ(p.kernels.size(), 1u) << to_text(p);
    // both GEMMs read the one buffer the kernel wrote
    const int gathered = p.kernels[0].stages[0].out;
    for (const Extern& e : p.externs) EXPECT_EQ(e.inputs[0], gathered) << to_text(p);
  }
}

TEST(LoopLower, AComputedValueReadByTwoExternsIsRealizedOnce) {
  // A GELU's output feeds the next linear and, in the backward, that linear's weight gradient: its
  // expression is small enough to inline, but an extern step reads memory, so it is written once and
  // both GEMMs read that buffer (before, each extern realized its own copy: one GELU kernel more).
  // A bare view of an input stays a view the GEMMs read in place.
  for (bool gelu : {true, false}) {
    SCOPED_TRACE(gelu);
    GraphBuilder b("gelu_two_gemms");
    ir::ValueId x = b.input("x", {64, 32}), w = b.input("w", {32, 16}), g = b.input("g", {64, 16});
    ir::ValueId h = gelu ? b.call(OpKind::gelu, {x}, {{"approximate", std::string("none")}})
                         : b.call(OpKind::reshape, {x}, {{"shape", SymIntVec{64, 32}}});
    ir::ValueId ht = b.call(OpKind::permute, {h}, {{"dims", SymIntVec{1, 0}}});
    b.done({b.call(OpKind::matmul, {h, w}), b.call(OpKind::matmul, {ht, g})});
    LowerOptions lo;  // the cpu backend's
    lo.cat_stages = lo.split_views = lo.extern_views = true;
    Program p = lower_graph(b.g, {}, lo);
    ASSERT_EQ(p.externs.size(), 2u);
    EXPECT_EQ(p.kernels.size(), gelu ? 1u : 0u) << to_text(p);
    if (gelu) {
      for (const Extern& e : p.externs) EXPECT_EQ(e.inputs[0], p.kernels[0].stages[0].out) << to_text(p);
    }
  }
}

}  // namespace
}  // namespace protean::loop
