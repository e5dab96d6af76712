// Fuzzers: random expressions, simplified, proven equivalent by Z3; value ranges checked for
// soundness on random assignments and by Z3.
#include <gtest/gtest.h>

#include "sym/printer.h"
#include "sym/simplify.h"
#include "sym_testing.h"

namespace protean::sym {
namespace {

using testing::ExprGen;
using testing::Proof;

// Evaluates e; nullopt where undefined (division by zero cannot happen with the generator's
// divisors, but overflow of the checked arithmetic can).
std::optional<int64_t> eval(Expr e, const std::unordered_map<Expr, int64_t>& v) {
  try {
    return evaluate(e, v);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

TEST(SymZ3, SimplifyPreservesMeaningOnIntegers) {
  ExprGen gen(1234);
  RangeAnalyzer ra = testing::fuzz_ranges();
  int proven = 0, unknown = 0, unchanged = 0;
  for (int i = 0; i < 250; ++i) {
    Expr e = gen.int_expr(4);
    Expr s = simplify(e, &ra);
    if (s == e) {
      ++unchanged;
      continue;
    }
    std::string model;
    Proof r = testing::prove_equal(e, s, ra, &model, 1000);
    ASSERT_NE(r, Proof::CounterExample) << print(e) << "\n  simplified to " << print(s) << "\n  counterexample: " << model;
    proven += r == Proof::Equivalent;
    unknown += r == Proof::Unknown;
  }
  EXPECT_GT(proven, 60);
  EXPECT_LT(unknown, 40);
}

TEST(SymZ3, SimplifyPreservesMeaningOnBooleans) {
  ExprGen gen(777);
  RangeAnalyzer ra = testing::fuzz_ranges();
  int proven = 0;
  for (int i = 0; i < 200; ++i) {
    Expr e = gen.bool_expr(3);
    Expr s = simplify(e, &ra);
    if (s == e) continue;
    std::string model;
    Proof r = testing::prove_equal(e, s, ra, &model, 1000);
    ASSERT_NE(r, Proof::CounterExample) << print(e) << "\n  simplified to " << print(s) << "\n  counterexample: " << model;
    proven += r == Proof::Equivalent;
  }
  EXPECT_GT(proven, 60);
}

TEST(SymZ3, SimplifyAgreesWithEvaluationOnRandomAssignments) {
  ExprGen gen(42);
  RangeAnalyzer ra = testing::fuzz_ranges();
  for (int i = 0; i < 2000; ++i) {
    Expr e = i % 3 == 0 ? gen.bool_expr(3) : gen.int_expr(5);
    Expr s = simplify(e, &ra);
    for (int k = 0; k < 8; ++k) {
      auto v = gen.assignment();
      auto a = eval(e, v), b = eval(s, v);
      if (!a || !b) continue;
      ASSERT_EQ(*a, *b) << print(e) << "  →  " << print(s);
    }
  }
}

TEST(SymZ3, ValueRangesAreSoundOnRandomAssignments) {
  ExprGen gen(99);
  RangeAnalyzer ra = testing::fuzz_ranges();
  for (int i = 0; i < 3000; ++i) {
    Expr e = i % 4 == 0 ? gen.bool_expr(3) : gen.int_expr(5);
    ValueRange r = ra.range(e);
    for (int k = 0; k < 8; ++k) {
      auto v = gen.assignment();
      auto x = eval(e, v);
      if (!x) continue;
      ASSERT_TRUE(r.contains(*x)) << print(e) << " = " << *x << " outside " << to_string(r);
    }
  }
}

TEST(SymZ3, ValueRangesAreSoundUnderZ3) {
  ExprGen gen(2024);
  RangeAnalyzer ra = testing::fuzz_ranges();
  int proven = 0;
  for (int i = 0; i < 120; ++i) {
    Expr e = gen.int_expr(3);
    ValueRange r = ra.range(e);
    if (r == ValueRange::full()) continue;
    z3::context ctx;
    testing::Z3Encoder enc(ctx);
    z3::expr z = enc.encode(e);
    z3::solver s(ctx);
    z3::params p(ctx);
    p.set("timeout", 1000u);
    s.set(p);
    s.add(enc.assumptions(ra));
    z3::expr outside = ctx.bool_val(false);
    if (r.lo != kNegIntOo) outside = outside || z < ctx.int_val(static_cast<int64_t>(r.lo));
    if (r.hi != kIntOo) outside = outside || z > ctx.int_val(static_cast<int64_t>(r.hi));
    s.add(outside);
    z3::check_result c = s.check();
    ASSERT_NE(c, z3::sat) << print(e) << " can leave " << to_string(r) << ": " << s.get_model().to_string();
    proven += c == z3::unsat;
  }
  EXPECT_GT(proven, 50);
}

TEST(SymZ3, RandomExpressionsRoundTripThroughText) {
  ExprGen gen(5);
  for (int i = 0; i < 2000; ++i) {
    Expr e = i % 2 ? gen.bool_expr(3) : gen.int_expr(5);
    std::string text = print(e);
    Expr back = parse(text);
    ASSERT_EQ(back, e) << text << " parsed back as " << print(back);
  }
}

}  // namespace
}  // namespace protean::sym
