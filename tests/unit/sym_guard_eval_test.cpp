// Guard programs: evaluate/explain agree with direct evaluation of the guard set on random inputs.
#include <gtest/gtest.h>

#include <random>

#include "protean/symint.h"
#include "sym/guard_eval.h"
#include "sym/printer.h"
#include "sym/shape_env.h"
#include "sym_testing.h"

namespace protean::sym {
namespace {

TEST(SymGuardEval, SpecializationDuckAndRanges) {
  ShapeEnv env;
  SymInt a = env.create_symbol("x.size()[0]", 33, DimKind::Duck);
  env.create_symbol("y.size()[0]", 33, DimKind::Duck);
  SymInt b = env.create_symbol("x.size()[1]", 6, DimKind::Dynamic);
  env.create_symbol("x.size()[2]", 1, DimKind::Dynamic);
  {
    ShapeEnvScope scope(env);
    EXPECT_TRUE(static_cast<bool>(a == 33));
    EXPECT_TRUE(static_cast<bool>(b < 100));
  }
  GuardProgram p = compile_guards(env, {{"x.size()[0]", 0}, {"y.size()[0]", 1}, {"x.size()[1]", 2}, {"x.size()[2]", 3}});
  int64_t ok[] = {33, 33, 6, 1};
  EXPECT_TRUE(p.evaluate(ok));
  EXPECT_EQ(p.explain(ok), "");
  int64_t spec[] = {34, 34, 6, 1};
  EXPECT_FALSE(p.evaluate(spec));
  EXPECT_EQ(p.explain(spec), "Eq(s0, 33)");
  EXPECT_EQ(p.explain(spec, true), "Eq(x.size()[0], 33)");
  int64_t small[] = {33, 33, 1, 1};
  EXPECT_EQ(p.explain(small), "2 <= s1");
  EXPECT_EQ(p.explain(small, true), "2 <= x.size()[1]");
  int64_t big[] = {33, 33, 100, 1};
  EXPECT_EQ(p.explain(big), "s1 <= 99");
  int64_t one[] = {33, 33, 6, 2};
  EXPECT_EQ(p.explain(one), "x.size()[2] == 1");
}

TEST(SymGuardEval, DuckSizedSourcesMustStayEqual) {
  ShapeEnv env;
  env.create_symbol("x.size()[0]", 8, DimKind::Duck);
  env.create_symbol("y.size()[0]", 8, DimKind::Duck);
  GuardProgram p = compile_guards(env, {{"x.size()[0]", 0}, {"y.size()[0]", 1}});
  int64_t same[] = {5, 5}, differ[] = {5, 6};
  EXPECT_TRUE(p.evaluate(same));
  EXPECT_EQ(p.explain(differ), "y.size()[0] == x.size()[0]");
}

TEST(SymGuardEval, ReplacementsAreChecked) {
  ShapeEnv env;
  SymInt a = env.create_symbol("x.size()[0]", 4, DimKind::Dynamic);
  SymInt b = env.create_symbol("y.size()[0]", 8, DimKind::Dynamic);
  {
    ShapeEnvScope scope(env);
    EXPECT_TRUE(static_cast<bool>(b == 2 * a));
    EXPECT_TRUE(static_cast<bool>(a % 2 == 0));
  }
  GuardProgram p = compile_guards(env, {{"x.size()[0]", 0}, {"y.size()[0]", 1}});
  int64_t good[] = {6, 12}, bad[] = {6, 13}, odd[] = {7, 14};
  EXPECT_TRUE(p.evaluate(good));
  EXPECT_EQ(p.explain(bad), "Eq(s1, 2*s0)");
  EXPECT_EQ(p.explain(bad, true), "Eq(y.size()[0], 2*x.size()[0])");
  EXPECT_EQ(p.explain(odd), "Eq(Mod(s0, 2), 0)");
  EXPECT_NE(p.dump().find("check_eq"), std::string::npos);
}

TEST(SymGuardEval, UnboundSymbolIsAnError) {
  ShapeEnv env;
  SymInt a = env.create_symbol("x.size()[0]", 4, DimKind::Dynamic);
  (void)a;
  EXPECT_THROW(compile_guards(env, {}), std::logic_error);
}

TEST(SymGuardEval, DivisionByZeroFailsTheGuard) {
  GuardProgramBuilder b;
  Expr s0 = symbol("s0"), s1 = symbol("s1");
  b.bind(s0, 0);
  b.bind(s1, 1);
  b.add_check(eq(mod(s0, s1), integer(0)), "Eq(Mod(s0, s1), 0)");
  GuardProgram p = b.build();
  int64_t zero[] = {4, 0}, fine[] = {4, 2};
  EXPECT_FALSE(p.evaluate(zero));
  EXPECT_TRUE(p.evaluate(fine));
}

// Random guard sets over 10 slots; the program must agree with evaluating each guard directly.
TEST(SymGuardEval, AgreesWithDirectEvaluationOnRandomInputs) {
  testing::ExprGen gen(31337);
  std::mt19937 rng(7);
  std::vector<Expr> syms = testing::fuzz_symbols();
  for (int round = 0; round < 200; ++round) {
    GuardProgramBuilder b;
    for (size_t i = 0; i < syms.size(); ++i) b.bind(syms[i], static_cast<int32_t>(i * 2));
    std::vector<Expr> guards;
    for (int g = 0; g < 1 + round % 20; ++g) {
      guards.push_back(gen.bool_expr(2));
      b.add_check(guards.back(), print(guards.back()));
    }
    GuardProgram p = b.build();
    for (int k = 0; k < 20; ++k) {
      auto v = gen.assignment();
      int64_t slots[10] = {};
      for (size_t i = 0; i < syms.size(); ++i) slots[i * 2] = v[syms[i]];
      int expected = -1;
      for (size_t g = 0; g < guards.size() && expected < 0; ++g) {
        bool holds;
        try {
          holds = evaluate(guards[g], v) != 0;
        } catch (const std::domain_error&) {
          holds = false;
        }
        if (!holds) expected = static_cast<int>(g);
      }
      ASSERT_EQ(p.first_failure(slots), expected) << "round " << round;
      ASSERT_EQ(p.evaluate(slots), expected < 0);
      if (expected >= 0) {
        ASSERT_EQ(p.explain(slots), print(guards[static_cast<size_t>(expected)]));
      }
    }
  }
}

}  // namespace
}  // namespace protean::sym
