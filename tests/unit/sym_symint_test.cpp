// SymInt/SymBool representation: one tagged word, plain values inline (including the int64 extremes
// ONNX uses as slice sentinels), symbolic values through interned nodes, and the same arithmetic
// semantics on both paths.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>

#include "protean/error.h"
#include "protean/symint.h"
#include "sym/printer.h"
#include "sym/shape_env.h"

namespace protean::sym {
namespace {

static_assert(sizeof(SymInt) == sizeof(int64_t), "SymInt must cost one int64 outside capture");
static_assert(sizeof(SymBool) == sizeof(void*), "SymBool must be one word");
static_assert(std::is_trivially_copyable_v<SymInt> && std::is_trivially_copyable_v<SymBool>);

TEST(SymIntWord, PlainValuesRoundTripAcrossTheWholeInt64Range) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t v : {int64_t{0}, int64_t{1}, int64_t{-1}, kMax, SymInt::kMinPlain, SymInt::kMinPlain - 1, kMin,
                    kMin + 1}) {
    SymInt s(v);
    EXPECT_FALSE(s.is_symbolic()) << v;
    EXPECT_EQ(s.hint(), v);
    EXPECT_EQ(s.guard_int(), v);
    EXPECT_EQ(static_cast<int64_t>(s), v);
    int64_t out = 7;
    EXPECT_TRUE(s.maybe_as_int(out));
    EXPECT_EQ(out, v);
    EXPECT_EQ(s.str(), std::to_string(v));
  }
  EXPECT_TRUE(SymInt(kMin).is_heap());
  EXPECT_FALSE(SymInt(SymInt::kMinPlain).is_heap());
}

TEST(SymIntWord, ArithmeticMatchesInt64OnBothSidesOfTheTag) {
  // Operands straddle -2^62 so the inline and the out-of-line paths both run; results are compared with
  // Python-style floor division/modulo computed independently here.
  auto floordiv = [](int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
    return q;
  };
  std::mt19937_64 rng(7);
  const int64_t big = SymInt::kMinPlain;
  for (int i = 0; i < 2000; ++i) {
    int64_t a = (i % 3 == 0) ? big - static_cast<int64_t>(rng() % 1000) : static_cast<int64_t>(rng() % 2001) - 1000;
    int64_t b = static_cast<int64_t>(rng() % 19) - 9;
    if (b == 0) b = 3;
    SymInt sa(a), sb(b);
    EXPECT_EQ((sa + sb).hint(), a + b);
    EXPECT_EQ((sa - sb).hint(), a - b);
    EXPECT_EQ((sa / sb).hint(), floordiv(a, b));
    EXPECT_EQ((sa % sb).hint(), a - floordiv(a, b) * b);
    EXPECT_EQ(sym_max(sa, sb).hint(), std::max(a, b));
    EXPECT_EQ(sym_min(sa, sb).hint(), std::min(a, b));
    EXPECT_EQ(static_cast<bool>(sa < sb), a < b);
    EXPECT_EQ(static_cast<bool>(sa == sb), a == b);
    EXPECT_FALSE((sa + sb).is_symbolic());
  }
  // A plain result that crosses into the out-of-line range stays exact.
  SymInt crossing = SymInt(SymInt::kMinPlain) - 5;
  EXPECT_TRUE(crossing.is_heap());
  EXPECT_FALSE(crossing.is_symbolic());
  EXPECT_EQ(crossing.hint(), SymInt::kMinPlain - 5);
  EXPECT_EQ((crossing + 5).hint(), SymInt::kMinPlain);
  EXPECT_FALSE((crossing + 5).is_heap());
}

TEST(SymIntWord, SymbolicValuesKeepExpressionAndHint) {
  ShapeEnv env;
  ShapeEnvScope scope(env);
  SymInt s = env.create_symbol("x.size()[0]", 37, DimKind::Dynamic);
  ASSERT_TRUE(s.is_symbolic());
  EXPECT_TRUE(s.is_heap());
  EXPECT_EQ(s.hint(), 37);
  SymInt t = s * 2 + 1;
  EXPECT_TRUE(t.is_symbolic());
  EXPECT_EQ(t.hint(), 75);
  EXPECT_EQ(t.str(), "2*s0 + 1");
  // Interned: the same expression with the same hint is the same word, so copies compare cheaply.
  SymInt u = s * 2 + 1;
  EXPECT_EQ(u.expr(), t.expr());
  // The same expression with another hint is a different value (hints are per capture).
  SymInt other(t.expr(), 99);
  EXPECT_EQ(other.hint(), 99);
  EXPECT_EQ(t.hint(), 75);
  SymBool b = t > 10;
  EXPECT_TRUE(b.is_symbolic());
  EXPECT_TRUE(b.hint());
  SymBool nb = !b;
  EXPECT_TRUE(nb.is_symbolic());
  EXPECT_FALSE(nb.hint());
  EXPECT_EQ(print(b.expr()), "4 < s0");  // 2*s0 + 1 > 10, simplified
  // A plain bool on either side of && and || (this was an ambiguous overload and did not compile).
  const bool flag = true;
  SymBool both = b && flag;
  EXPECT_TRUE(both.is_symbolic());
  EXPECT_TRUE(both.hint());
  EXPECT_FALSE((false && b).hint());
  EXPECT_TRUE((flag || nb).hint());
  EXPECT_FALSE((nb || false).hint());
}

TEST(SymIntWord, PlainSymBoolIsZeroOrOne) {
  SymBool t(true), f(false);
  EXPECT_FALSE(t.is_symbolic());
  EXPECT_FALSE(f.is_symbolic());
  EXPECT_TRUE(static_cast<bool>(t));
  EXPECT_FALSE(static_cast<bool>(f));
  EXPECT_EQ(t.expr(), nullptr);
  EXPECT_EQ((t && f).hint(), false);
  EXPECT_EQ((t || f).hint(), true);
  EXPECT_EQ((!f).hint(), true);
  EXPECT_EQ((t && true).hint(), true);
  EXPECT_EQ((false || f).hint(), false);
}

// Division without an int64 quotient throws instead of trapping (SIGFPE): a zero divisor on both the
// inline and the out-of-line path, and INT64_MIN / -1, whose quotient 2^63 does not fit.
// A symbolic division or modulo by zero during capture is a protean::ValueError naming the input the
// symbol stands for (it used to escape as std::domain_error from the sym engine).
TEST(SymIntWord, SymbolicDivisionByZeroIsAValueErrorNamingTheInput) {
  ShapeEnv env;
  ShapeEnvScope scope(env);
  SymInt s = env.create_symbol("x.size()[0]", 6, DimKind::Dynamic);
  for (auto f : {+[](SymInt a) { return a / SymInt(0); }, +[](SymInt a) { return a % SymInt(0); },
                 +[](SymInt a) { return ceil_div(a, SymInt(0)); }}) {
    try {
      (void)f(s);
      ADD_FAILURE() << "no error";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("s0 = x.size()[0]"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("by zero"), std::string::npos) << e.what();
    }
  }
}

TEST(SymIntWord, DivisionWithoutAnInt64ResultThrows) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  auto expect_error = [](auto f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "expected ValueError containing '" << want << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expect_error([&] { (void)(SymInt(kMin) / -1); }, "SymInt: -9223372036854775808 // -1 overflows int64");
  expect_error([&] { (void)(SymInt(kMin) / SymInt(-1)); }, "overflows int64");
  expect_error([&] { (void)ceil_div(SymInt(kMin), SymInt(-1)); }, "overflows int64");
  expect_error([&] { (void)(SymInt(5) / 0); }, "SymInt: 5 // 0 divides by zero");
  expect_error([&] { (void)(SymInt(kMin) / 0); }, "divides by zero");
  expect_error([&] { (void)(SymInt(5) % 0); }, "SymInt: 5 % 0 divides by zero");
  expect_error([&] { (void)(SymInt(kMin) % 0); }, "divides by zero");
  expect_error([&] { (void)ceil_div(SymInt(5), SymInt(0)); }, "divides by zero");
  // Results that exist stay exact at the extremes.
  EXPECT_EQ((SymInt(kMin) % -1).hint(), 0);
  EXPECT_EQ((SymInt(kMin) / 1).hint(), kMin);
  EXPECT_EQ((SymInt(kMin) / 2).hint(), kMin / 2);
  EXPECT_EQ((SymInt(kMin + 1) / -1).hint(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(ceil_div(SymInt(kMin), SymInt(2)).hint(), kMin / 2);
  EXPECT_EQ(ceil_div(SymInt(7), SymInt(2)).hint(), 4);
  EXPECT_EQ(ceil_div(SymInt(-7), SymInt(2)).hint(), -3);
  EXPECT_EQ(ceil_div(SymInt(7), SymInt(-2)).hint(), -3);
}

}  // namespace
}  // namespace protean::sym
