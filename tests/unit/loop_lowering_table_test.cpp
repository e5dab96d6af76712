// The lowering table (loop/lowering.def) against the ops it describes and against what lowering does.
// (An op of ops.def without a row does not get this far: lowering.cpp's static_assert names it.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <tuple>

#include "ir_test_util.h"
#include "loop/lower.h"
#include "loop/lowering.h"
#include "loop/scalar_ops.h"

namespace protean::loop {
namespace {

using ir::testing::GraphBuilder;
using ops::OpKind;

bool builds_scalar(LowerRule r) {
  switch (r) {
    case LowerRule::abs: case LowerRule::rounding: case LowerRule::unary: case LowerRule::logical_not:
    case LowerRule::binary: case LowerRule::pow: case LowerRule::compare: case LowerRule::logical:
      return true;
    case LowerRule::cast: case LowerRule::clamp: case LowerRule::where: case LowerRule::expand:
    case LowerRule::permute: case LowerRule::reshape: case LowerRule::select: case LowerRule::slice:
    case LowerRule::squeeze: case LowerRule::unsqueeze: case LowerRule::cat: case LowerRule::clone:
    case LowerRule::pad: case LowerRule::arange: case LowerRule::full: case LowerRule::gelu: case LowerRule::silu:
    case LowerRule::hardsigmoid: case LowerRule::hardswish: case LowerRule::reduce: case LowerRule::mean_var:
    case LowerRule::softmax: case LowerRule::norm: case LowerRule::batch_norm: case LowerRule::attention:
    case LowerRule::extern_call: case LowerRule::cond:
      return false;
  }
  return false;
}

/// The `how` a rule belongs to.
Lowering family(LowerRule r) {
  switch (r) {
    case LowerRule::gelu: case LowerRule::silu: case LowerRule::hardsigmoid: case LowerRule::hardswish:
    case LowerRule::reduce: case LowerRule::mean_var: case LowerRule::softmax: case LowerRule::norm:
    case LowerRule::batch_norm: case LowerRule::attention:
      return Lowering::Decomposed;
    case LowerRule::extern_call: case LowerRule::cond: return Lowering::Extern;
    case LowerRule::abs: case LowerRule::cast: case LowerRule::rounding: case LowerRule::clamp: case LowerRule::unary:
    case LowerRule::logical_not: case LowerRule::binary: case LowerRule::pow: case LowerRule::compare:
    case LowerRule::logical: case LowerRule::where: case LowerRule::expand: case LowerRule::permute:
    case LowerRule::reshape: case LowerRule::select: case LowerRule::slice: case LowerRule::squeeze:
    case LowerRule::unsqueeze: case LowerRule::cat: case LowerRule::clone: case LowerRule::pad: case LowerRule::arange:
    case LowerRule::full:
      return Lowering::Lowered;
  }
  return Lowering::Extern;
}

TEST(LoweringTable, EveryOpHasItsOwnRow) {
  for (size_t i = 0; i < ops::kNumOps; ++i) {
    const auto op = static_cast<OpKind>(i);
    const LoweringRow& row = lowering_row(op);
    EXPECT_EQ(row.op, op) << ops::op_name(op);
    EXPECT_EQ(family(row.rule), row.how) << ops::op_name(op) << ": rule " << rule_name(row.rule) << " is not a "
                                         << lowering_name(row.how) << " rule";
    if (row.how != Lowering::Lowered) {
      EXPECT_FALSE(row.note.empty()) << ops::op_name(op) << ": say into what / why";
    }
    EXPECT_EQ(row.scalar.has_value(), builds_scalar(row.rule)) << ops::op_name(op);
    if (row.scalar) {
      const int arity = scalar_arity(*row.scalar);
      const int inputs = ops::op_info(op).inputs;
      EXPECT_EQ(arity, inputs) << ops::op_name(op) << " takes " << inputs << " inputs, its scalar op "
                               << scalar_name(*row.scalar) << " " << arity;
    }
  }
  EXPECT_THROW(lowering_row(static_cast<OpKind>(ops::kNumOps)), CompileError);
}

TEST(LoweringTable, ScalarOpNamesAreUniqueAndParse) {
  std::set<std::string> names;
  for (size_t i = 0; i < kNumScalarOps; ++i) {
    const auto op = static_cast<ScalarOp>(i);
    EXPECT_TRUE(names.insert(std::string(scalar_name(op))).second) << scalar_name(op);
    EXPECT_EQ(scalar_from_name(scalar_name(op)), op);
  }
  EXPECT_EQ(scalar_from_name("no_such_function"), std::nullopt);
  EXPECT_THROW(s_unary(ScalarOp::add, s_const(1, DType::F32), DType::F32), std::invalid_argument);
  EXPECT_THROW(s_binary(ScalarOp::exp, s_const(1, DType::F32), s_const(1, DType::F32), DType::F32), std::invalid_argument);
}

/// Attributes a pointwise op needs to be called.
ops::Attrs attrs_for(OpKind op) {
  if (op == OpKind::cast) return {{"dtype", DType::F64}};
  if (op == OpKind::clamp) return {{"min", -0.5}, {"max", 0.5}};
  if (op == OpKind::gelu) return {{"approximate", std::string("none")}};
  return {};
}

// What the table claims for a pointwise op is what lowering does: a Lowered or Decomposed row gives a
// kernel and no extern step, an Extern row an extern step.
TEST(LoweringTable, PointwiseRowsMatchLowering) {
  int checked = 0;
  for (size_t i = 0; i < ops::kNumOps; ++i) {
    const auto op = static_cast<OpKind>(i);
    if (ops::op_info(op).category != ops::OpCategory::Pointwise) continue;
    GraphBuilder b("table");
    std::vector<ir::ValueId> in;
    for (int k = 0; k < ops::op_info(op).inputs; ++k)
    {
      // the bitwise ops take integers
      const bool bitwise = ops::op_name(op).starts_with("bitwise_");
      in.push_back(b.input(fmt::format("x{}", k), {4, 8},
                           op == OpKind::where && k == 0 ? DType::Bool : bitwise ? DType::I32 : DType::F32));
    }
    ir::ValueId y = b.call(op, in, attrs_for(op));
    b.done({y});
    const Program p = lower_graph(b.g, {});
    const Lowering how = lowering_row(op).how;
    const bool extern_step = !p.externs.empty();
    EXPECT_EQ(extern_step, how == Lowering::Extern) << ops::op_name(op) << " (" << lowering_name(how) << ")\n" << to_text(p);
    EXPECT_EQ(p.kernels.empty(), how == Lowering::Extern) << ops::op_name(op);
    ++checked;
  }
  EXPECT_GT(checked, 30);
}


// Commuted comparisons and operands of commutative ops are one canonical expression (CSE and stage
// fusion compare bodies by text); max, min and the non-commutative ops keep their operand order.
TEST(LoopCanonical, CommutedFormsAreOneExpression) {
  const sym::Expr x = outer_var(2), r = inner_var(0);
  const SExpr a = s_load(0, DType::F32, sym::add(sym::mul(x, sym::integer(8)), r)), b = s_load(1, DType::F32, r);
  auto text = [](const SExpr& e) { return s_text(canonical_body(e)); };
  // the index relation r0 > x2 is x2 < r0
  EXPECT_EQ(text(s_index(sym::gt(r, x), DType::Bool)), text(s_index(sym::lt(x, r), DType::Bool)));
  // scalar comparisons: gt(a, b) == lt(b, a), ge(a, b) == le(b, a)
  EXPECT_EQ(text(s_binary(ScalarOp::gt, a, b, DType::Bool)), text(s_binary(ScalarOp::lt, b, a, DType::Bool)));
  EXPECT_EQ(text(s_binary(ScalarOp::ge, a, b, DType::Bool)), text(s_binary(ScalarOp::le, b, a, DType::Bool)));
  for (ScalarOp f : {ScalarOp::add, ScalarOp::mul})
    EXPECT_EQ(text(s_binary(f, a, b, DType::F32)), text(s_binary(f, b, a, DType::F32))) << scalar_name(f);
  for (ScalarOp f : {ScalarOp::eq, ScalarOp::ne})
    EXPECT_EQ(text(s_binary(f, a, b, DType::Bool)), text(s_binary(f, b, a, DType::Bool))) << scalar_name(f);
  // a constant operand goes last; nested expressions are canonical at every level
  EXPECT_EQ(text(s_binary(ScalarOp::mul, s_const(2, DType::F32), a, DType::F32)), fmt::format("mul({}, 2)", s_text(a)));
  const SExpr e1 = s_unary(ScalarOp::exp, s_binary(ScalarOp::add, a, b, DType::F32), DType::F32);
  const SExpr e2 = s_unary(ScalarOp::exp, s_binary(ScalarOp::add, b, a, DType::F32), DType::F32);
  EXPECT_EQ(text(s_where(s_binary(ScalarOp::gt, a, b, DType::Bool), e1, b)), text(s_where(s_binary(ScalarOp::lt, b, a, DType::Bool), e2, b)));
  // left alone: sub, div, max, min (max(+0, -0) depends on the order)
  for (ScalarOp f : {ScalarOp::sub, ScalarOp::div, ScalarOp::max, ScalarOp::min})
    EXPECT_NE(text(s_binary(f, a, b, DType::F32)), text(s_binary(f, b, a, DType::F32))) << scalar_name(f);
}

// The GELU derivative's Φ(x) = (erf(x/√2) + 1)/2 is the forward's normal_cdf(x): one node, so the
// fused forward + backward kernel computes it once. Other constants, or another dtype inside, are
// left as written.
TEST(LoopCanonical, ErfFormOfTheNormalCdfIsNormalCdf) {
  for (DType dt : {DType::F32, DType::F64}) {
    SCOPED_TRACE(short_name(dt));
    const SExpr x = s_load(0, dt, inner_var(0));
    const double k = dt == DType::F32 ? static_cast<double>(static_cast<float>(0.70710678118654752440)) : 0.70710678118654752440;
    auto cdf = [&](double scale, double one, double half, bool const_first) {
      SExpr m = const_first ? s_binary(ScalarOp::mul, s_const(scale, dt), x, dt) : s_binary(ScalarOp::mul, x, s_const(scale, dt), dt);
      SExpr e = s_unary(ScalarOp::erf, m, dt);
      SExpr a = const_first ? s_binary(ScalarOp::add, s_const(one, dt), e, dt) : s_binary(ScalarOp::add, e, s_const(one, dt), dt);
      return const_first ? s_binary(ScalarOp::mul, s_const(half, dt), a, dt) : s_binary(ScalarOp::mul, a, s_const(half, dt), dt);
    };
    const std::string want = s_text(s_unary(ScalarOp::normal_cdf, x, dt));
    EXPECT_EQ(s_text(canonical_body(cdf(k, 1, 0.5, false))), want);
    EXPECT_EQ(s_text(canonical_body(cdf(k, 1, 0.5, true))), want);
    // inside a larger body, next to the forward's own normal_cdf: the same text twice (one value after CSE)
    const SExpr body = s_binary(ScalarOp::add, s_binary(ScalarOp::mul, x, s_unary(ScalarOp::normal_cdf, x, dt), dt),
                                cdf(k, 1, 0.5, false), dt);
    const std::string t = s_text(canonical_body(body));
    EXPECT_EQ(t.find("erf"), std::string::npos) << t;
    for (auto [scale, one, half] : {std::tuple{0.5, 1.0, 0.5}, std::tuple{k, 2.0, 0.5}, std::tuple{k, 1.0, 0.25}})
      EXPECT_NE(s_text(canonical_body(cdf(scale, one, half, false))).find("erf"), std::string::npos);
  }
}

}  // namespace
}  // namespace protean::loop
