// The partitioner (ir/passes/partition.h): the min cut saves a library kernel's output and recomputes
// the cheap elementwise chain after it in the backward; reductions and random ops are never
// recomputed; ties break the same way every time; the budget and the log lines.
#include <gtest/gtest.h>

#include "ir/graph.h"
#include "ir/passes/dce.h"
#include "ir/passes/partition.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "observe/log.h"
#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::ir::Graph;
using pt::core::SourceLocation;
using pt::ir::ValueId;
using pt::ops::OpKind;

namespace {

std::vector<pt::TensorMeta> meta(pt::SymIntVec sizes, DType dt = DType::F32) {
  return {pt::TensorMeta::contiguous(std::move(sizes), dt)};
}
SourceLocation fwd_at(int line) { return {"mlp.cpp", line, ""}; }
SourceLocation bwd_at(int line) {
  SourceLocation l{"mlp.cpp", line, ""};
  l.backward = true;
  return l;
}

/// x @ w → relu → tanh → sum (output); the backward reads tanh's and relu's outputs.
Graph chain() {
  Graph g;
  g.name = "chain";
  ValueId x = g.add_placeholder("x", DType::F32, {4, 8});
  ValueId w = g.add_placeholder("w", DType::F32, {8, 8});
  ValueId a = g.add_call(OpKind::matmul, {x, w}, {}, meta({4, 8}), fwd_at(10))[0];
  ValueId r = g.add_call(OpKind::relu, {a}, {}, meta({4, 8}), fwd_at(11))[0];
  ValueId t = g.add_call(OpKind::tanh, {r}, {}, meta({4, 8}), fwd_at(12))[0];
  ValueId s = g.add_call(OpKind::sum, {t}, {{"dims", pt::SymIntVec{}}, {"keepdim", false}}, meta({}), fwd_at(13))[0];
  ValueId u = g.add_call(OpKind::mul, {t, t}, {}, meta({4, 8}), bwd_at(12))[0];
  ValueId v = g.add_call(OpKind::add, {u, r}, {}, meta({4, 8}), bwd_at(11))[0];
  g.set_outputs({s, v});
  return g;
}

TEST(Partition, SavesTheMatmulAndRecomputesTheElementwiseChain) {
  Graph g = chain();
  pt::observe::LogCapture cap("partition");
  auto r = pt::ir::partition(g);
  pt::ir::dead_code_elimination(g);
  pt::ir::verify(g);
  EXPECT_EQ(r.saved_values, 1);
  EXPECT_EQ(r.recomputed_nodes, 2);  // relu and tanh, once each
  EXPECT_EQ(r.saved_bytes, 4 * 8 * 4);
  const std::string ir = pt::ir::print(g);
  EXPECT_NE(ir.find("relu(%0)  # [bwd of mlp.cpp:11]"), std::string::npos) << ir;
  EXPECT_NE(ir.find("# [bwd of mlp.cpp:12]"), std::string::npos) << ir;
  EXPECT_NE(cap.str().find("saved f32[4, 8] matmul at mlp.cpp:10 (128 B)"), std::string::npos) << cap.str();
  // Deterministic: the same graph partitions to the same text.
  Graph again = chain();
  pt::ir::partition(again);
  pt::ir::dead_code_elimination(again);
  EXPECT_EQ(pt::ir::print(again), ir);
}

TEST(Partition, NeverRecomputesReductionsOrRandomOps) {
  Graph g;
  g.name = "banned";
  ValueId x = g.add_placeholder("x", DType::F32, {4, 8});
  ValueId m = g.add_call(OpKind::amax, {x}, {{"dims", pt::SymIntVec{1}}, {"keepdim", true}}, meta({4, 1}), fwd_at(20))[0];
  ValueId d = g.add_call(OpKind::philox_uniform, {},
                         {{"shape", pt::SymIntVec{4, 8}}, {"seed", pt::SymInt(1)}, {"offset", pt::SymInt(0)}, {"dtype", DType::F32}},
                         meta({4, 8}), fwd_at(21))[0];
  ValueId y = g.add_call(OpKind::mul, {x, d}, {}, meta({4, 8}), fwd_at(22))[0];
  ValueId b1 = g.add_call(OpKind::mul, {m, m}, {}, meta({4, 1}), bwd_at(20))[0];
  ValueId b2 = g.add_call(OpKind::add, {d, b1}, {}, meta({4, 8}), bwd_at(21))[0];
  g.set_outputs({y, b2});
  auto r = pt::ir::partition(g);
  EXPECT_EQ(r.recomputed_nodes, 0);
  EXPECT_EQ(r.saved_values, 2);  // amax's output and the random numbers
  const std::string ir = pt::ir::print(g);
  EXPECT_EQ(ir.find("philox_uniform", ir.find("philox_uniform") + 1), std::string::npos) << ir;
}

TEST(Partition, BudgetAndOptions) {
  Graph g = chain();
  EXPECT_THROW(pt::ir::partition(g, {.memory_budget = 0.0}), pt::ValueError);
  EXPECT_THROW(pt::ir::partition(g, {.memory_budget = 1.5}), pt::ValueError);
  // The saved matmul output cannot be recomputed: a tiny budget keeps it.
  auto r = pt::ir::partition(g, {.memory_budget = 0.01});
  EXPECT_EQ(r.saved_values, 1);
  Graph plain;
  ValueId x = plain.add_placeholder("x", DType::F32, {2});
  plain.set_outputs({plain.add_call(OpKind::relu, {x}, {}, meta({2}), fwd_at(1))[0]});
  EXPECT_FALSE(pt::ir::has_backward(plain));
  EXPECT_EQ(pt::ir::partition(plain).saved_values, 0);
}

}  // namespace
