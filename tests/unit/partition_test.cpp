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
#include "sym/shape_env.h"

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

/// A cut whose cheapest side depends on the length: m = matmul(w1, w2) [16, 16] (1 KiB, never
/// recomputed) → reshape [1, 256] → expand [s0, 256] → · y [s0, 256] → slice [:, :8] = v [s0, 8]; the
/// backward reads v. Keeping v costs 32·s0 bytes, keeping m 1 KiB (the chain after it is recomputable).
Graph length_dependent(pt::sym::ShapeEnv& env) {
  pt::sym::ShapeEnvScope scope(env);
  pt::SymInt s0 = env.create_symbol("y.size()[0]", 4, pt::sym::DimKind::Duck);
  Graph g;
  g.name = "lengths";
  ValueId y = g.add_placeholder("y", DType::F32, {s0, 256});
  ValueId w1 = g.add_placeholder("w1", DType::F32, {16, 4});
  ValueId w2 = g.add_placeholder("w2", DType::F32, {4, 16});
  ValueId m = g.add_call(OpKind::matmul, {w1, w2}, {}, meta({16, 16}), fwd_at(10))[0];
  ValueId r = g.add_call(OpKind::reshape, {m}, {{"shape", pt::SymIntVec{1, 256}}}, meta({1, 256}), fwd_at(11))[0];
  ValueId e = g.add_call(OpKind::expand, {r}, {{"sizes", pt::SymIntVec{s0, 256}}}, meta({s0, 256}), fwd_at(12))[0];
  ValueId p = g.add_call(OpKind::mul, {e, y}, {}, meta({s0, 256}), fwd_at(13))[0];
  ValueId v = g.add_call(OpKind::slice, {p}, {{"dim", pt::SymInt(1)}, {"start", pt::SymInt(0)}, {"end", pt::SymInt(8)}, {"step", pt::SymInt(1)}},
                         meta({s0, 8}), fwd_at(14))[0];
  ValueId s = g.add_call(OpKind::sum, {v}, {{"dims", pt::SymIntVec{}}, {"keepdim", false}}, meta({}), fwd_at(15))[0];
  ValueId u = g.add_call(OpKind::mul, {v, v}, {}, meta({s0, 8}), bwd_at(15))[0];
  g.set_outputs({s, u});
  return g;
}

TEST(Partition, BytesAreWeighedAtTheLargestKnownSize) {
  // PartitionOptions::size_at (a mark's or the PGO profile's max) sets the size a symbol is weighed
  // at; without it, the traced size (hint 4). At s0 = 4 keeping v (128 B) beats keeping m (1 KiB); at
  // s0 = 1024 (32 KiB) the backward recomputes v from m. A max below the traced size weighs the trace.
  struct Case { int64_t at; const char* want; int64_t bytes; int64_t recomputed; };
  for (const Case& c : {Case{-1, "saved f32[s0, 8] slice at mlp.cpp:14 (128 B at s0=4)", 128, 0},
                        Case{2, "saved f32[s0, 8] slice at mlp.cpp:14 (128 B at s0=4)", 128, 0},
                        // mul and slice recomputed; the reshape and expand of the kept m are views of it
                        Case{1024, "saved f32[16, 16] matmul at mlp.cpp:10 (1 KiB)", 1024, 2}}) {
    SCOPED_TRACE(c.at);
    pt::sym::ShapeEnv env;
    Graph g = length_dependent(env);
    pt::ir::PartitionOptions o;
    if (c.at >= 0) o.size_at["s0"] = c.at;
    pt::observe::LogCapture cap("partition");
    auto r = pt::ir::partition(g, o);
    pt::ir::dead_code_elimination(g);
    pt::ir::verify(g);
    EXPECT_EQ(r.saved_values, 1);
    EXPECT_EQ(r.saved_bytes, c.bytes);
    EXPECT_EQ(r.recomputed_nodes, c.recomputed);
    EXPECT_NE(cap.str().find(c.want), std::string::npos) << cap.str();
  }
}

}  // namespace

/// x @ w → relu → r; the backward reads r in a matmul (dW = rᵀ · g), through a permute when `through_view`,
/// and relu's mask from r in a pointwise op.
Graph materialized(bool through_view) {
  Graph g;
  g.name = "materialized";
  ValueId x = g.add_placeholder("x", DType::F32, {4, 8});
  ValueId w = g.add_placeholder("w", DType::F32, {8, 8});
  ValueId gy = g.add_placeholder("g", DType::F32, {4, 8});
  ValueId a = g.add_call(OpKind::matmul, {x, w}, {}, meta({4, 8}), fwd_at(10))[0];
  ValueId r = g.add_call(OpKind::relu, {a}, {}, meta({4, 8}), fwd_at(11))[0];
  ValueId s = g.add_call(OpKind::sum, {r}, {{"dims", pt::SymIntVec{}}, {"keepdim", false}}, meta({}), fwd_at(12))[0];
  ValueId rt = through_view ? g.add_call(OpKind::permute, {r}, {{"dims", pt::SymIntVec{1, 0}}}, meta({8, 4}), bwd_at(11))[0]
                            : r;
  ValueId dw = through_view ? g.add_call(OpKind::matmul, {rt, gy}, {}, meta({8, 8}), bwd_at(11))[0]
                            : g.add_call(OpKind::matmul, {gy, w}, {}, meta({4, 8}), bwd_at(11))[0];
  ValueId m = g.add_call(OpKind::mul, {r, r}, {}, meta({4, 8}), bwd_at(11))[0];
  ValueId d = through_view ? dw : g.add_call(OpKind::matmul, {r, w}, {}, meta({4, 8}), bwd_at(11))[0];
  g.set_outputs({s, d, m});
  return g;
}

TEST(Partition, KeepsWhatTheBackwardReadsInALibraryKernel) {
  // Recomputing relu for a matmul would write it again in a kernel of its own: relu's output is
  // kept (PyTorch's partitioner never recomputes values materialized in the backward), also when the
  // matmul reads it through a view; a view of a kept value is not copied into the backward either.
  for (bool through_view : {false, true}) {
    SCOPED_TRACE(through_view);
    Graph g = materialized(through_view);
    pt::observe::LogCapture cap("partition");
    auto r = pt::ir::partition(g);
    pt::ir::dead_code_elimination(g);
    pt::ir::verify(g);
    EXPECT_EQ(r.recomputed_nodes, 0);
    EXPECT_EQ(r.saved_values, 1);
    EXPECT_NE(cap.str().find("saved f32[4, 8] relu at mlp.cpp:11 (128 B)"), std::string::npos) << cap.str();
    const std::string ir = pt::ir::print(g);
    EXPECT_EQ(ir.find("relu", ir.find("relu") + 1), std::string::npos) << ir;
  }
}
