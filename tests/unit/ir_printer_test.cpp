// Golden text of hand-built graphs (tests/golden/ir/*.txt; PROTEAN_UPDATE_GOLDEN=1 rewrites them).
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir_test_util.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::ir {
namespace {

using ops::OpKind;
using testing::GraphBuilder;

Graph mlp_graph() {
  GraphBuilder b("mlp");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 512});
  ValueId w1 = b.input("w1", {512, 64});
  ValueId h = b.call(OpKind::matmul, {x, w1}, {}, {"mlp.cpp", 4, "mlp"});
  ValueId y = b.call(OpKind::gelu, {h}, {{"approximate", std::string("none")}}, {"mlp.cpp", 4, "mlp"});
  return b.done({y});
}

TEST(IrPrinter, MlpGolden) { testing::expect_golden(print(mlp_graph()), "mlp.txt"); }

TEST(IrPrinter, MlpInline) {
  testing::expect_text(print(mlp_graph()),
                       "graph mlp(%x : f32[s0, 512], %w1 : f32[512, 64]):\n"
                       "  %0 : f32[s0, 64] = matmul(%x, %w1)  # mlp.cpp:4\n"
                       "  %1 : f32[s0, 64] = gelu(%0, approximate=\"none\")  # mlp.cpp:4\n"
                       "  return (%1)\n");
}

Graph kinds_graph() {
  GraphBuilder b("kinds");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  sym::ShapeEnvScope scope(b.env);  // for s0 * 2 below
  ValueId x = b.input("x", {s0, 4});
  ValueId w = b.input("self.w", {3});
  ValueId a = b.input("args[2]", {}, DType::I64);
  ValueId c = b.constant(ones({4}));
  ValueId bias = b.constant(zeros({4}), "bias");
  ValueId t = b.call(OpKind::add, {x, c}, {}, {"kinds.cpp", 10, ""});
  std::vector<ValueId> parts = b.calls(OpKind::split, {t}, {{"dim", SymInt(1)}, {"sizes", SymIntVec{1, 3}}},
                                       {"kinds.cpp", 11, ""});
  ValueId n = b.call(OpKind::layer_norm, {x, kNoValue, bias},
                     {{"normalized_shape", SymIntVec{4}}, {"eps", 1e-05}}, {"kinds.cpp", 12, ""});
  ValueId r = b.call(OpKind::reshape, {n}, {{"shape", SymIntVec{s0 * 2, 2}}});
  ValueId s = b.call(OpKind::sum, {r}, {{"dims", SymIntVec{-1}}, {"keepdim", true}, {"dtype", DType::F64}});
  ValueId cl = b.call(OpKind::clamp, {parts[1]}, {{"min", 0.0}, {"max", 6.5}});
  ValueId wc = b.call(OpKind::mul, {cl, w});
  ValueId ac = b.call(OpKind::cast, {a}, {{"dtype", DType::F32}});
  return b.done({s, parts[0], wc, ac});
}

TEST(IrPrinter, AllNodeKindsGolden) { testing::expect_golden(print(kinds_graph()), "kinds.txt"); }

TEST(IrPrinter, DeterministicAcrossBuilds) { EXPECT_EQ(print(kinds_graph()), print(kinds_graph())); }

TEST(IrPrinter, EmptyGraphAndNoOutputNode) {
  Graph g;
  g.name = "nothing";
  EXPECT_EQ(print(g), "graph nothing():\n  return ()\n");
  g.set_outputs({});
  EXPECT_EQ(print(g), "graph nothing():\n  return ()\n");
}

TEST(IrPrinter, ValueNamesAndRefs) {
  GraphBuilder b;
  ValueId x = b.input("x", {2});
  ValueId x2 = b.input("x", {2});           // a second input with the same source gets a suffix
  ValueId q = b.input("a b\"c[0]", {2});       // quotes and spaces are not kept
  ValueId num = b.input("7", {2});          // numeric names are reserved for call results
  ValueId e = b.input("", {2});             // empty source
  EXPECT_EQ(value_ref(b.g, x), "%x");
  EXPECT_EQ(value_ref(b.g, x2), "%x_1");
  EXPECT_EQ(value_ref(b.g, q), "%\"a_b_c[0]\"");
  EXPECT_EQ(value_ref(b.g, num), "%_7");
  EXPECT_EQ(value_ref(b.g, e), "%arg4");
  EXPECT_EQ(value_ref(b.g, kNoValue), "None");
  EXPECT_EQ(b.g.nodes()[1].source, "x");
}

TEST(IrPrinter, AttrText) {
  EXPECT_EQ(attr_text(SymInt(3)), "3");
  EXPECT_EQ(attr_text(SymIntVec{1, -2}), "[1, -2]");
  EXPECT_EQ(attr_text(1e-05), "1e-05");
  EXPECT_EQ(attr_text(2.0), "2.0");
  EXPECT_EQ(attr_text(true), "true");
  EXPECT_EQ(attr_text(std::string("a\"b")), "\"a\\\"b\"");
  EXPECT_EQ(attr_text(DType::BF16), "bf16");
}

TEST(IrPrinter, CallNumberingFollowsCreationOrderAndCompaction) {
  GraphBuilder b;
  ValueId x = b.input("x", {3});
  ValueId a = b.call(OpKind::relu, {x});
  b.call(OpKind::neg, {x});  // %1, dropped below
  ValueId c = b.call(OpKind::exp, {a});
  Graph& g = b.done({c});
  EXPECT_EQ(g.value(c).name, "2");
  g.compact({true, true, false, true, true});
  testing::expect_text(print(g),
                       "graph f(%x : f32[3]):\n"
                       "  %0 : f32[3] = relu(%x)\n"
                       "  %1 : f32[3] = exp(%0)\n"
                       "  return (%1)\n");
}

}  // namespace
}  // namespace protean::ir
