// Verifier: accepts well-formed graphs, and names each kind of broken graph.
#include <gtest/gtest.h>

#include "ir/parser.h"
#include "ir/verifier.h"
#include "ir_test_util.h"
#include "protean/tensor.h"

namespace protean::ir {
namespace {

using ops::OpKind;
using testing::GraphBuilder;

/// x[s0, 8] → relu → add(., c) → matmul with w[8, 4] → return
Graph good_graph() {
  GraphBuilder b;
  SymInt s0 = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {s0, 8});
  ValueId w = b.input("w", {8, 4});
  ValueId c = b.constant(ones({8}));
  ValueId r = b.call(OpKind::relu, {x});
  ValueId a = b.call(OpKind::add, {r, c});
  ValueId m = b.call(OpKind::matmul, {a, w});
  return b.done({m});
}

void expect_rejected(const Graph& g, const std::string& what) {
  try {
    verify(g);
    ADD_FAILURE() << "verify accepted a broken graph; expected: " << what;
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(IrVerifier, AcceptsGoodGraphs) {
  EXPECT_NO_THROW(verify(good_graph()));
  GraphBuilder b;
  ValueId x = b.input("x", {6});
  std::vector<ValueId> p = b.calls(OpKind::split, {x}, {{"dim", SymInt(0)}, {"sizes", SymIntVec{2, 4}}});
  ValueId n = b.call(OpKind::layer_norm, {p[1], kNoValue, kNoValue}, {{"normalized_shape", SymIntVec{4}}, {"eps", 1e-5}});
  EXPECT_NO_THROW(verify(b.done({n, p[0], x})));
}

TEST(IrVerifier, UseBeforeDefinition) {
  Graph g = good_graph();
  // relu (node 3) reads the add result (defined by node 4).
  g.nodes()[3].inputs[0] = g.nodes()[4].outputs[0];
  expect_rejected(g, "before its definition");
}

TEST(IrVerifier, MultipleDefinitions) {
  Graph g = good_graph();
  g.nodes()[4].outputs[0] = g.nodes()[3].outputs[0];
  expect_rejected(g, "defined more than once");
}

TEST(IrVerifier, WrongArity) {
  Graph g = good_graph();
  g.nodes()[3].inputs.push_back(g.inputs()[0]);
  expect_rejected(g, "relu takes 1 inputs (ops.def), got 2");
  Graph h = good_graph();
  h.nodes()[4].outputs.push_back(h.nodes()[3].outputs[0]);
  expect_rejected(h, "add has 1 outputs (ops.def), got 2");
}

TEST(IrVerifier, OutputNodeNotLast) {
  Graph g = good_graph();
  std::swap(g.nodes()[5], g.nodes()[6]);
  expect_rejected(g, "Output node");
  Graph h = good_graph();
  h.nodes().pop_back();
  expect_rejected(h, "the last node must be the Output node");
}

TEST(IrVerifier, DanglingValues) {
  Graph g = good_graph();
  g.nodes()[5].inputs[1] = 99;
  expect_rejected(g, "does not exist (dangling reference)");
  Graph h = good_graph();
  Value orphan;
  orphan.name = "orphan";
  orphan.node = 3;
  h.values().push_back(orphan);
  expect_rejected(h, "%orphan (id 6) is not defined by any node");
  Graph k = good_graph();
  k.nodes().back().inputs.push_back(kNoValue);
  expect_rejected(k, "a graph output is None");
}

TEST(IrVerifier, DuplicateNames) {
  Graph g = good_graph();
  g.values()[static_cast<size_t>(g.nodes()[4].outputs[0])].name = "x";
  expect_rejected(g, "value name %x is used twice");
}

TEST(IrVerifier, TypesDisagreeWithMeta) {
  Graph g = good_graph();
  g.values()[static_cast<size_t>(g.nodes()[5].outputs[0])].sizes[1] = 5;
  expect_rejected(g, "output 0 is recorded as f32[s0, 5] but the meta function gives f32[s0, 4]");
  Graph h = good_graph();
  h.values()[static_cast<size_t>(h.nodes()[3].outputs[0])].dtype = DType::F64;
  expect_rejected(h, "recorded as f64[s0, 8]");
  Graph k = good_graph();
  k.values()[static_cast<size_t>(k.nodes()[3].outputs[0])].sizes[0] = SymInt(sym::symbol("s9"), 3);
  expect_rejected(k, "recorded as f32[s9, 8]");
  // The check can be turned off.
  EXPECT_NO_THROW(verify(k, {.check_types = false}));
}

TEST(IrVerifier, MetaRejectsInputs) {
  Graph g = parse("graph f(%a : f32[2, 3], %b : f32[4, 5]):\n  %0 : f32[2, 5] = matmul(%a, %b)\n  return (%0)\n");
  expect_rejected(g, "the meta function rejects the input types");
}

TEST(IrVerifier, ConstantDataMustMatchType) {
  Graph g = good_graph();
  g.nodes()[2].constant = ones({3});
  expect_rejected(g, "constant data is f32[3] but the value type is f32[8]");
}

TEST(IrVerifier, UndecidableSymbolicTypesAreSkipped) {
  // add(f32[s0], f32[s1]) needs the guard Eq(s0, s1) (or a broadcast) to be typed: not checkable here.
  Graph g = parse("graph f(%a : f32[s0], %b : f32[s1]):\n  %0 : f32[s0] = add(%a, %b)\n  return (%0)\n");
  EXPECT_NO_THROW(verify(g));
}

TEST(IrVerifier, MessageNamesTheNode) {
  Graph g = good_graph();
  g.nodes()[3].inputs.push_back(g.inputs()[0]);
  try {
    verify(g);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("at node 3: `%0 : f32[s0, 8] = relu(%x, %x)`"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace protean::ir
