// ShapeEnv scenarios: 0/1 specialization, duck sizing, guards, replacements, specializations with
// the user's location, range tightening, strict marks, unbacked symbols, SymInt integration.
#include <gtest/gtest.h>

#include "protean/symint.h"
#include "sym/printer.h"
#include "sym/shape_env.h"

namespace protean::sym {
namespace {

struct Fixture : ::testing::Test {
  ShapeEnv env;
  int line = 0;
  int location_calls = 0;
  Fixture() {
    env.set_location_provider([this] {
      ++location_calls;
      return protean::core::SourceLocation{"model.cpp", line, "forward"};
    });
  }
  std::vector<std::string> messages(ShapeEventKind k) const {
    std::vector<std::string> out;
    for (const ShapeEvent& e : env.events())
      if (e.kind == k) out.push_back(e.message);
    return out;
  }
};

using SymShapeEnv = Fixture;

TEST_F(SymShapeEnv, CreateSymbolLogsPyTorchStyle) {
  line = 3;
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  ASSERT_TRUE(s.is_symbolic());
  EXPECT_EQ(s.hint(), 5);
  EXPECT_EQ(print(s.expr()), "s0");
  EXPECT_EQ(to_string(env.range_of(s.expr())), "VR[2, int_oo]");
  ASSERT_EQ(messages(ShapeEventKind::CreateSymbol).size(), 1u);
  EXPECT_EQ(messages(ShapeEventKind::CreateSymbol)[0], "create_symbol s0 = 5 for x.size()[0] [2, int_oo] at model.cpp:3 in forward");
  EXPECT_EQ(env.symbol_for_source("x.size()[0]"), s.expr());
}

TEST_F(SymShapeEnv, ZeroAndOneSpecialize) {
  SymInt z = env.create_symbol("x.size()[0]", 0, DimKind::Dynamic);
  SymInt o = env.create_symbol("x.size()[1]", 1, DimKind::Duck);
  EXPECT_FALSE(z.is_symbolic());
  EXPECT_FALSE(o.is_symbolic());
  EXPECT_EQ(o.hint(), 1);
  GuardSet gs = env.produce_guards();
  ASSERT_EQ(gs.statics.size(), 2u);
  EXPECT_EQ(gs.statics[1].source, "x.size()[1]");
}

TEST(SymShapeEnvOptions, KeepOneSymbolic) {
  ShapeEnv env(ShapeEnvOptions{.specialize_zero_one = true, .keep_one_symbolic = true});
  SymInt o = env.create_symbol("x.size()[0]", 1, DimKind::Dynamic);
  ASSERT_TRUE(o.is_symbolic());
  EXPECT_EQ(to_string(env.range_of(o.expr())), "VR[1, int_oo]");
  EXPECT_FALSE(env.create_symbol("x.size()[1]", 0, DimKind::Dynamic).is_symbolic());
}

TEST(SymShapeEnvOptions, KeptOneIsNotDuckSized) {
  ShapeEnv env(ShapeEnvOptions{.specialize_zero_one = true, .keep_one_symbolic = true});
  SymInt a = env.create_symbol("x.size()[0]", 1, DimKind::Duck);
  SymInt b = env.create_symbol("y.size()[1]", 1, DimKind::Duck);
  SymInt c = env.create_symbol("x.size()[1]", 8, DimKind::Duck);
  SymInt d = env.create_symbol("y.size()[0]", 8, DimKind::Duck);
  ASSERT_TRUE(a.is_symbolic() && b.is_symbolic());
  EXPECT_NE(a.expr(), b.expr());  // two size-1 dims: two symbols
  EXPECT_EQ(c.expr(), d.expr());  // sizes >= 2 still duck-size
}

TEST_F(SymShapeEnv, IntSymbolKeepsZeroAndOne) {
  SymInt zero = env.create_int_symbol("self.step", 0);
  SymInt one = env.create_int_symbol("self.k", 1);
  SymInt neg = env.create_int_symbol("self.offset", -3);
  ASSERT_TRUE(zero.is_symbolic() && one.is_symbolic() && neg.is_symbolic());
  EXPECT_EQ(to_string(env.range_of(zero.expr())), "VR[0, int_oo]");
  EXPECT_EQ(to_string(env.range_of(neg.expr())), "VR[-int_oo, int_oo]");
  EXPECT_EQ(messages(ShapeEventKind::CreateSymbol)[0], "create_symbol s0 = 0 for self.step [0, int_oo] at model.cpp in forward");
  GuardSet gs = env.produce_guards();
  EXPECT_TRUE(gs.statics.empty());
}

TEST_F(SymShapeEnv, EqualityOverASymbolAndAnExpressionOfItStaysAGuard) {
  // chunk's pieces: Eq(CeilDiv(s0, 4), s0 - 3*CeilDiv(s0, 4)) names s0 on both sides; solving for s0
  // would replace it by an expression over itself.
  SymInt n = env.create_symbol("x.size()[0]", 12, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  SymInt piece = ceil_div(n, SymInt(4));
  EXPECT_TRUE(static_cast<bool>(piece == n - 3 * piece));
  EXPECT_TRUE(env.replacements().empty());
  EXPECT_TRUE(env.specializations().empty());
  ASSERT_EQ(env.guards().size(), 1u);
  EXPECT_EQ(n.hint(), 12);
  EXPECT_TRUE(env.simplify(n.expr())->is_symbol());
}

TEST_F(SymShapeEnv, DuckSizingOnlyForDuckKind) {
  SymInt a = env.create_symbol("x.size()[0]", 8, DimKind::Duck);
  SymInt b = env.create_symbol("y.size()[0]", 8, DimKind::Duck);
  SymInt c = env.create_symbol("z.size()[0]", 8, DimKind::Dynamic);
  SymInt d = env.create_symbol("w.size()[0]", 9, DimKind::Duck);
  EXPECT_EQ(a.expr(), b.expr());
  EXPECT_NE(a.expr(), c.expr());
  EXPECT_NE(a.expr(), d.expr());
  EXPECT_EQ(env.symbol_info(a.expr())->sources, (std::vector<std::string>{"x.size()[0]", "y.size()[0]"}));
  EXPECT_EQ(messages(ShapeEventKind::DuckSize).size(), 1u);
}

TEST_F(SymShapeEnv, StaticKindIsPlain) {
  SymInt s = env.create_symbol("x.size()[0]", 7, DimKind::Static);
  EXPECT_FALSE(s.is_symbolic());
  EXPECT_EQ(s.hint(), 7);
}

TEST_F(SymShapeEnv, GuardAddedWithLocationOnlyWhenRecorded) {
  SymInt s = env.create_symbol("x.size()[0]", 6, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  int before = location_calls;
  EXPECT_TRUE(static_cast<bool>(s >= 2));  // statically known: no guard, no location lookup
  EXPECT_EQ(location_calls, before);
  EXPECT_TRUE(env.guards().empty());
  line = 12;
  EXPECT_TRUE(static_cast<bool>(s % 2 == 0));
  ASSERT_EQ(env.guards().size(), 1u);
  EXPECT_EQ(print(env.guards()[0].expr), "Eq(Mod(s0, 2), 0)");
  EXPECT_EQ(env.guards()[0].where.line, 12);
  EXPECT_EQ(env.guards()[0].where.file, "model.cpp");
  EXPECT_EQ(messages(ShapeEventKind::GuardAdded).back(), "eval Eq(Mod(s0, 2), 0) [guard added] at model.cpp:12 in forward");
  // The negation is recorded when the hint says false.
  EXPECT_FALSE(static_cast<bool>(s > 10));
  EXPECT_EQ(print(env.guards().back().expr), "s0 <= 10");
}

TEST_F(SymShapeEnv, RepeatedGuardIsKnownAndRecordedOnce) {
  SymInt s = env.create_symbol("x.size()[3]", 147, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  line = 30;
  EXPECT_TRUE(static_cast<bool>((s - 1) / 4 != 0));
  const size_t guards = env.guards().size();
  const size_t added = messages(ShapeEventKind::GuardAdded).size();
  int before = location_calls;
  line = 31;
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(static_cast<bool>((s - 1) / 4 != 0));  // same fact, every op of a model
  // Its negation is known false from the same guard.
  EXPECT_FALSE(static_cast<bool>((s - 1) / 4 == 0));
  EXPECT_EQ(env.guards().size(), guards);
  EXPECT_EQ(messages(ShapeEventKind::GuardAdded).size(), added);
  EXPECT_EQ(location_calls, before);  // no stack walk for a known fact
  EXPECT_EQ(env.guards().back().where.line, 30);
}

TEST_F(SymShapeEnv, GuardsTightenRanges) {
  SymInt s = env.create_symbol("x.size()[0]", 6, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(s < 100));
  EXPECT_EQ(to_string(env.range_of(s.expr())), "VR[2, 99]");
  EXPECT_TRUE(static_cast<bool>(2 * s > 7));
  EXPECT_EQ(to_string(env.range_of(s.expr())), "VR[4, 99]");
  EXPECT_TRUE(static_cast<bool>(s != 4));
  EXPECT_EQ(to_string(env.range_of(s.expr())), "VR[5, 99]");
  EXPECT_EQ(messages(ShapeEventKind::RangeUpdate)[0], "_update_var_to_range s0 = VR[2, 99] (guard s0 < 100)");
  // Now implied: no new guard.
  size_t n = env.guards().size();
  EXPECT_TRUE(static_cast<bool>(s < 200));
  EXPECT_EQ(env.guards().size(), n);
}

TEST_F(SymShapeEnv, EqualityBecomesReplacement) {
  SymInt a = env.create_symbol("x.size()[0]", 4, DimKind::Dynamic);
  SymInt b = env.create_symbol("y.size()[0]", 8, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(b == a * 2));
  ASSERT_EQ(env.replacements().size(), 1u);
  EXPECT_EQ(print(env.replacements().at(b.expr())), "2*s0");
  EXPECT_TRUE(env.specializations().empty());
  // Later expressions see the replacement.
  SymInt d = b - a;
  EXPECT_EQ(print(d.expr()), "s0");
  EXPECT_EQ(d.hint(), 4);
  EXPECT_EQ(messages(ShapeEventKind::Replacement)[0], "set_replacement s1 = 2*s0 (guard Eq(2*s0, s1))");
}

TEST_F(SymShapeEnv, ConstantReplacementIsSpecializationWithLocation) {
  SymInt a = env.create_symbol("x.size()[0]", 33, DimKind::Duck);
  env.create_symbol("y.size()[0]", 33, DimKind::Duck);
  SymInt b = env.create_symbol("z.size()[1]", 66, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(b == 2 * a));
  line = 21;
  EXPECT_TRUE(static_cast<bool>(a == 33));
  ASSERT_EQ(env.specializations().size(), 1u);
  const Specialization& sp = env.specializations()[0];
  EXPECT_EQ(sp.symbol->name, "s0");
  EXPECT_EQ(sp.value, 33);
  EXPECT_EQ(sp.sources, (std::vector<std::string>{"x.size()[0]", "y.size()[0]"}));
  EXPECT_EQ(sp.reason, "guard Eq(s0, 33)");
  EXPECT_EQ(sp.where.line, 21);
  EXPECT_EQ(sp.where.function, "forward");
  // The earlier replacement follows: s1 -> 66.
  EXPECT_EQ(print(env.replacements().at(b.expr())), "66");
  EXPECT_EQ(print(env.simplify(b.expr() )), "66");
  SymInt c = a + 1;
  EXPECT_FALSE(c.is_symbolic());
  EXPECT_EQ(c.hint(), 34);
  EXPECT_EQ(messages(ShapeEventKind::GuardAdded).back(), "eval Eq(s0, 33) [guard added] at model.cpp:21 in forward");
}

TEST_F(SymShapeEnv, GuardIntSpecializes) {
  SymInt a = env.create_symbol("n", 7, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  line = 5;
  EXPECT_EQ(static_cast<int64_t>(a), 7);
  ASSERT_EQ(env.specializations().size(), 1u);
  EXPECT_EQ(env.specializations()[0].reason, "int conversion of s0");
  EXPECT_EQ(env.specializations()[0].where.line, 5);
}

TEST_F(SymShapeEnv, StrictMarksRejectSpecialization) {
  SymInt a = env.create_symbol("x.size()[0]", 8, DimKind::Dynamic, SymbolConstraint{.strict = true, .min = {}, .max = {}});
  ShapeEnvScope scope(env);
  line = 9;
  try {
    (void)static_cast<bool>(a == 8);
    FAIL() << "expected ConstraintViolation";
  } catch (const ConstraintViolation& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("x.size()[0]"), std::string::npos) << m;
    EXPECT_NE(m.find("Eq(s0, 8)"), std::string::npos) << m;
    EXPECT_NE(m.find("model.cpp:9"), std::string::npos) << m;
  }
  EXPECT_THROW(env.create_symbol("y.size()[0]", 1, DimKind::Dynamic, SymbolConstraint{.strict = true, .min = {}, .max = {}}), ConstraintViolation);
  EXPECT_THROW(env.create_symbol("y.size()[1]", 100, DimKind::Dynamic, {.strict = true, .min = 2, .max = 64}), ConstraintViolation);
}

TEST_F(SymShapeEnv, StrictMarkRangeAllowsGuardsInsideIt) {
  SymInt a = env.create_symbol("x.size()[0]", 8, DimKind::Dynamic, {.strict = true, .min = 2, .max = 64});
  EXPECT_EQ(to_string(env.range_of(a.expr())), "VR[2, 64]");
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(a < 100));  // implied by the mark: fine
  EXPECT_THROW((void)static_cast<bool>(a < 10), ConstraintViolation);
}

TEST_F(SymShapeEnv, UnbackedSymbolsNeedChecks) {
  SymInt u = env.create_unbacked_symint("nonzero", true);
  EXPECT_EQ(print(u.expr()), "u0");
  EXPECT_EQ(to_string(env.range_of(u.expr())), "VR[0, int_oo]");
  EXPECT_EQ(messages(ShapeEventKind::CreateUnbacked)[0], "create_unbacked_symint u0 [0, int_oo] at model.cpp in forward");
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(u >= 0));  // decided by the range
  EXPECT_THROW((void)static_cast<bool>(u == 0), DataDependentError);
  line = 30;
  env.check(u >= 4, "need at least 4 rows");
  ASSERT_EQ(env.runtime_asserts().size(), 1u);
  EXPECT_EQ(print(env.runtime_asserts()[0].expr), "4 <= u0");
  EXPECT_EQ(env.runtime_asserts()[0].where.line, 30);
  EXPECT_EQ(to_string(env.range_of(u.expr())), "VR[4, int_oo]");
  EXPECT_TRUE(static_cast<bool>(u != 0));
  EXPECT_THROW(env.check(u < 2, "impossible"), std::runtime_error);
  EXPECT_TRUE(env.guards().empty());
}

// A runtime assertion decides later guards on the same fact (or its negation), as narrow's meta
// functions need after `check(u0 <= s0)`; facts it does not imply still raise.
TEST_F(SymShapeEnv, RuntimeAssertsDecideLaterGuards) {
  SymInt s = env.create_symbol("x.size()[0]", 8, DimKind::Dynamic);
  SymInt u = env.create_unbacked_symint("k.item_symint()", false);
  EXPECT_EQ(to_string(env.range_of(u.expr())), "VR[-int_oo, int_oo]");
  ShapeEnvScope scope(env);
  EXPECT_THROW((void)static_cast<bool>(u <= s), DataDependentError);
  env.check(u <= s, "narrow");
  env.check(u <= s, "narrow again");  // the same fact: asserted once
  ASSERT_EQ(env.runtime_asserts().size(), 1u);
  EXPECT_TRUE(static_cast<bool>(u <= s));
  EXPECT_FALSE(static_cast<bool>(u > s));
  EXPECT_TRUE(static_cast<bool>(s >= u));
  EXPECT_THROW((void)static_cast<bool>(u < s), DataDependentError);
  EXPECT_TRUE(env.guards().empty());
}

// check_is_size (torch._check_is_size): asserts >= 0 and makes the symbol size-like, so size-oblivious
// decisions treat it as >= 2; a negative plain value is an error.
TEST_F(SymShapeEnv, CheckIsSizeMakesAnUnbackedSymbolSizeLike) {
  SymInt u = env.create_unbacked_symint("k.item_symint()", false);
  ShapeEnvScope scope(env);
  EXPECT_FALSE(env.symbol_info(u.expr())->size_like);
  EXPECT_THROW((void)env.guard_size_oblivious(u == 1), DataDependentError);
  env.check_is_size(u, "used as a size");
  EXPECT_TRUE(env.symbol_info(u.expr())->size_like);
  EXPECT_EQ(to_string(env.range_of(u.expr())), "VR[0, int_oo]");
  ASSERT_EQ(env.runtime_asserts().size(), 1u);
  EXPECT_EQ(print(env.runtime_asserts()[0].expr), "0 <= u0");
  EXPECT_FALSE(env.guard_size_oblivious(u == 1));
  EXPECT_THROW(env.check_is_size(SymInt(-3), "negative"), std::runtime_error);
  env.check_is_size(SymInt(3), "fine");
}

TEST_F(SymShapeEnv, UnbackedEqualityReplacesWithBacked) {
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  SymInt u = env.create_unbacked_symint("item", false);
  ShapeEnvScope scope(env);
  env.check(u == s, "same length");
  EXPECT_EQ(print(env.replacements().at(u.expr())), "s0");
  SymInt d = u - s;
  EXPECT_FALSE(d.is_symbolic());
  EXPECT_EQ(d.hint(), 0);
}

TEST_F(SymShapeEnv, SizeObliviousEvaluation) {
  SymInt u = env.create_unbacked_symint("nnz", true);
  ShapeEnvScope scope(env);
  EXPECT_THROW((void)static_cast<bool>(u == 1), DataDependentError);
  EXPECT_FALSE(env.guard_size_oblivious(u == 1));
  EXPECT_TRUE(env.guard_size_oblivious(u != 0));
  EXPECT_TRUE(env.guards().empty());
}

TEST_F(SymShapeEnv, CheckOnBackedGuards) {
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  env.check(s > 3, "too small");
  EXPECT_EQ(env.guards().size(), 1u);
  EXPECT_THROW(env.check(s > 9, "too small"), std::runtime_error);
}

TEST_F(SymShapeEnv, ProduceGuardsDropsImpliedOnes) {
  SymInt a = env.create_symbol("x.size()[0]", 6, DimKind::Duck);
  SymInt b = env.create_symbol("y.size()[0]", 6, DimKind::Duck);
  SymInt c = env.create_symbol("z.size()[0]", 10, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  EXPECT_TRUE(static_cast<bool>(a < 100));
  EXPECT_TRUE(static_cast<bool>(a < 50));
  EXPECT_TRUE(static_cast<bool>(a < c));
  EXPECT_TRUE(static_cast<bool>(a <= c));  // implied by a < c
  EXPECT_TRUE(static_cast<bool>(a % 2 == 0));
  EXPECT_TRUE(static_cast<bool>(a % 2 == 0));
  (void)b;
  GuardSet gs = env.produce_guards();
  std::vector<std::string> texts;
  for (const auto& ch : gs.checks) texts.push_back(ch.text);
  EXPECT_EQ(texts, (std::vector<std::string>{"2 <= s0", "s0 <= 49", "2 <= s1", "s0 < s1", "Eq(Mod(s0, 2), 0)"}));
  ASSERT_EQ(gs.symbols.size(), 2u);
  EXPECT_EQ(gs.symbols[0].sources.size(), 2u);
}

TEST(SymHooks, NoShapeEnvThrowsLogicError) {
  ShapeEnv env;
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  try {
    SymInt t = s + 1;
    FAIL() << t.str();
    FAIL() << "expected logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("no current ShapeEnv"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("s0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(s.str(), "s0");  // printing needs no ShapeEnv
}

TEST(SymHooks, ArithmeticAndComparisonsBuildExpressions) {
  ShapeEnv env;
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  SymInt t = env.create_symbol("x.size()[1]", 3, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  EXPECT_EQ((s * 2 + s).str(), "3*s0");
  EXPECT_EQ((s * 2 + s).hint(), 15);
  EXPECT_EQ(((s + t) - t).str(), "s0");
  EXPECT_EQ(((s + 1) / 2).str(), "((s0 + 1)//2)");
  EXPECT_EQ(((s + 1) / 2).hint(), 3);
  EXPECT_EQ((s % 2).str(), "Mod(s0, 2)");
  EXPECT_EQ(sym_max(s, SymInt(1)).str(), "s0");
  EXPECT_EQ(sym_min(s, t).str(), "Min(s0, s1)");
  EXPECT_EQ(ceil_div(s, 2).str(), "CeilDiv(s0, 2)");
  EXPECT_EQ((-s).str(), "-s0");
  EXPECT_EQ((s - s).is_symbolic(), false);
  SymBool b = s < 100;
  EXPECT_TRUE(b.is_symbolic());
  EXPECT_EQ(b.str(), "s0 < 100");
  EXPECT_EQ((s == 33).str(), "Eq(s0, 33)");
  EXPECT_FALSE((s >= 2).is_symbolic());  // statically true
  EXPECT_EQ(((s < 100) && (t < 100)).str(), "(s0 < 100) & (s1 < 100)");
  EXPECT_EQ((!(s < 100)).str(), "100 <= s0");
  EXPECT_EQ(sym_product({s, t, SymInt(4)}).str(), "4*s0*s1");
  EXPECT_TRUE(env.guards().empty());
}

TEST(SymHooks, ScopesNest) {
  ShapeEnv a, b;
  EXPECT_EQ(current_shape_env(), nullptr);
  {
    ShapeEnvScope sa(a);
    EXPECT_EQ(current_shape_env(), &a);
    {
      ShapeEnvScope sb(b);
      EXPECT_EQ(current_shape_env(), &b);
    }
    EXPECT_EQ(current_shape_env(), &a);
  }
  EXPECT_EQ(current_shape_env(), nullptr);
}

TEST(SymHooks, ListenerSeesEvents) {
  ShapeEnv env;
  std::vector<std::string> lines;
  env.set_event_listener([&](const ShapeEvent& e) { lines.push_back(e.message); });
  SymInt s = env.create_symbol("x.size()[0]", 5, DimKind::Dynamic);
  ShapeEnvScope scope(env);
  (void)static_cast<bool>(s == 5);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_EQ(lines[0], "create_symbol s0 = 5 for x.size()[0] [2, int_oo]");
  EXPECT_EQ(lines[1], "eval Eq(s0, 5) [guard added]");
}

}  // namespace
}  // namespace protean::sym
