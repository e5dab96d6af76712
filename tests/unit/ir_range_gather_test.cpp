// index_select of arange(0, n) rewritten as a slice (ir/passes/range_gather.h), and index_select's
// wrap_negative (ONNX Gather's negative indices).
#include <gtest/gtest.h>

#include "backend/interp/interp.h"
#include "ir/passes/dce.h"
#include "ir/passes/range_gather.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "sym/printer.h"
#include "ir_test_util.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::ir {
namespace {

using ops::OpKind;
using testing::GraphBuilder;

size_t count_op(const Graph& g, OpKind op) {
  size_t n = 0;
  for (const Node& node : g.nodes()) n += node.kind == NodeKind::Call && node.op == op;
  return n;
}

/// out = x[idx] + table[arange(0, s0)] with a [rows, 4] table; idx : i64[s0].
struct PositionLookup {
  GraphBuilder b;
  SymInt s0;
  Tensor table;
  explicit PositionLookup(int64_t rows, std::vector<std::pair<std::string, OpKind>> views = {{"unsqueeze", OpKind::unsqueeze},
                                                                                             {"reshape", OpKind::reshape}},
                          int64_t start = 0, int64_t step = 1)
      : s0(b.symbol("x.size()[0]", 6)), table(arange(0, rows * 4, 1, DType::F32).view({rows, 4})) {
    ValueId x = b.input("x", {s0, 4});
    SymInt end;
    {
      sym::ShapeEnvScope scope(b.env);
      end = start + s0 * step;
    }
    ValueId r = b.call(OpKind::arange, {}, {{"start", SymInt(start)}, {"end", end}, {"step", SymInt(step)}, {"dtype", DType::I64}});
    for (const auto& [name, op] : views) {
      if (op == OpKind::unsqueeze) r = b.call(op, {r}, {{"dim", SymInt(0)}});
      else if (op == OpKind::reshape) r = b.call(op, {r}, {{"shape", SymIntVec{-1}}});
      else if (op == OpKind::expand) r = b.call(op, {r}, {{"sizes", SymIntVec{s0}}});
    }
    ValueId t = b.constant(table, "table");
    ValueId gathered = b.call(OpKind::index_select, {t, r}, {{"dim", SymInt(0)}});
    b.done({b.call(OpKind::add, {x, gathered})});
  }
};

TEST(IrRangeGather, PositionLookupBecomesASliceWithABoundCheck) {
  PositionLookup p(10);
  Graph& g = p.b.g;
  Graph before = g;
  std::vector<sym::RuntimeAssert> asserts;
  EXPECT_EQ(range_gather_as_slice(g, &asserts), 1u);
  dead_code_elimination(g);
  EXPECT_NO_THROW(verify(g));
  EXPECT_EQ(count_op(g, OpKind::index_select), 0u) << print(g);
  EXPECT_EQ(count_op(g, OpKind::arange), 0u) << print(g);
  ASSERT_EQ(count_op(g, OpKind::slice), 1u) << print(g);
  ASSERT_EQ(asserts.size(), 1u);
  EXPECT_EQ(sym::print(asserts[0].expr), "s0 <= 10");
  EXPECT_NE(asserts[0].message.find("of size 10"), std::string::npos) << asserts[0].message;
  std::vector<sym::Expr> syms = {p.s0.expr()};
  backend::Interpreter want(std::make_shared<const Graph>(before), syms);
  backend::Interpreter got(std::make_shared<const Graph>(g), syms, asserts);
  for (int64_t n : {1, 3, 10}) {
    std::vector<Tensor> in = {randn({n, 4})};
    Tensor a = want.run(in, std::span<const int64_t>(&n, 1)).at(0);
    Tensor c = got.run(in, std::span<const int64_t>(&n, 1)).at(0);
    EXPECT_TRUE(allclose(c, a, 0, 0)) << "length " << n;
  }
  // Past the table: the gather failed on its index; the slice fails on its assertion, naming it.
  int64_t n = 11;
  std::vector<Tensor> in = {randn({n, 4})};
  EXPECT_THROW(want.run(in, std::span<const int64_t>(&n, 1)), Error);
  try {
    got.run(in, std::span<const int64_t>(&n, 1));
    ADD_FAILURE() << "a length past the table ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s0 <= 10"), std::string::npos) << e.what();
  }
}

TEST(IrRangeGather, LeavesWhatIsNotARangeFromZero) {
  {  // start 1: rows 1..n, not a prefix... still a slice in principle, but not this rewrite's form
    PositionLookup p(10, {{"unsqueeze", OpKind::unsqueeze}, {"reshape", OpKind::reshape}}, 1);
    std::vector<sym::RuntimeAssert> asserts;
    EXPECT_EQ(range_gather_as_slice(p.b.g, &asserts), 0u);
    EXPECT_TRUE(asserts.empty());
  }
  {  // step 2
    PositionLookup p(40, {{"reshape", OpKind::reshape}}, 0, 2);
    std::vector<sym::RuntimeAssert> asserts;
    EXPECT_EQ(range_gather_as_slice(p.b.g, &asserts), 0u);
  }
  {  // without a place for the bound check, a symbolic length is left alone
    PositionLookup p(10);
    EXPECT_EQ(range_gather_as_slice(p.b.g, nullptr), 0u);
    EXPECT_EQ(count_op(p.b.g, OpKind::index_select), 1u);
  }
  {  // a length a data-dependent op defines (u0 of nonzero) is not known when a call starts
    GraphBuilder b;
    const SymInt u0 = b.env.create_unbacked_symint("nonzero", /*size_like=*/true);
    ASSERT_TRUE(u0.is_symbolic());
    ValueId r = b.call(OpKind::arange, {}, {{"start", SymInt(0)}, {"end", u0}, {"step", SymInt(1)}, {"dtype", DType::I64}});
    ValueId t = b.constant(randn({10, 4}), "table");
    b.done({b.call(OpKind::index_select, {t, r}, {{"dim", SymInt(0)}})});
    std::vector<sym::RuntimeAssert> asserts;
    EXPECT_EQ(range_gather_as_slice(b.g, &asserts), 0u) << print(b.g);
    EXPECT_TRUE(asserts.empty());
  }
  {  // a gather by data is left alone
    GraphBuilder b;
    ValueId t = b.constant(randn({10, 4}), "table");
    ValueId i = b.input("i", {SymInt(3)}, DType::I64);
    b.done({b.call(OpKind::index_select, {t, i}, {{"dim", SymInt(0)}})});
    std::vector<sym::RuntimeAssert> asserts;
    EXPECT_EQ(range_gather_as_slice(b.g, &asserts), 0u);
  }
}

TEST(IrRangeGather, ConcreteLengthsNeedNoCheckAndPastTheEndStaysAGather) {
  for (int64_t len : {3, 12}) {
    GraphBuilder b;
    ValueId t = b.constant(arange(0, 40, 1, DType::F32).view({10, 4}), "table");
    ValueId r = b.call(OpKind::arange, {}, {{"start", SymInt(0)}, {"end", SymInt(len)}, {"step", SymInt(1)}, {"dtype", DType::I64}});
    b.done({b.call(OpKind::index_select, {t, r}, {{"dim", SymInt(0)}})});
    std::vector<sym::RuntimeAssert> asserts;
    EXPECT_EQ(range_gather_as_slice(b.g, &asserts), len <= 10 ? 1u : 0u) << len;
    EXPECT_TRUE(asserts.empty());
    if (len <= 10) {
      EXPECT_NO_THROW(verify(b.g));
      Tensor got = backend::Interpreter(b.g).run({}).at(0);
      EXPECT_TRUE(allclose(got, arange(0, len * 4, 1, DType::F32).view({len, 4}), 0, 0));
    }
  }
}

TEST(IrRangeGather, ThePipelineRewritesAndHandsBackTheCheck) {
  PositionLookup p(16);
  std::vector<sym::RuntimeAssert> asserts;
  PassOptions o;
  o.verify = true;
  o.runtime_asserts = &asserts;
  run_passes(p.b.g, o);
  EXPECT_EQ(count_op(p.b.g, OpKind::index_select), 0u) << print(p.b.g);
  EXPECT_EQ(asserts.size(), 1u);
  PositionLookup off(16);
  PassOptions o2 = o;
  o2.range_gather_as_slice = false;
  asserts.clear();
  run_passes(off.b.g, o2);
  EXPECT_EQ(count_op(off.b.g, OpKind::index_select), 1u);
  EXPECT_TRUE(asserts.empty());
}

TEST(IndexSelect, WrapNegativeCountsFromTheEnd) {
  Tensor x = arange(0, 12, 1, DType::F32).view({4, 3});
  Tensor idx = tensor<int64_t>({-1, 0, -4, 2}, {4});
  Tensor got = index_select(x, 0, idx, /*wrap_negative=*/true);
  Tensor want = index_select(x, 0, tensor<int64_t>({3, 0, 0, 2}, {4}));
  EXPECT_TRUE(allclose(got, want, 0, 0));
  // without it, and past -size with it, the index is named
  EXPECT_THROW(index_select(x, 0, idx), ValueError);
  try {
    index_select(x, 0, tensor<int64_t>({-5}, {1}), true);
    ADD_FAILURE() << "index -5 of 4 rows was taken";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("index -5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[-4, 4)"), std::string::npos) << e.what();
  }
  // along dim 1, and i32 indices
  Tensor got1 = index_select(x, 1, tensor<int32_t>({-1, 1}, {2}), true);
  EXPECT_TRUE(allclose(got1, index_select(x, 1, tensor<int64_t>({2, 1}, {2})), 0, 0));
}

}  // namespace
}  // namespace protean::ir
