// Golden simplification pairs (tests/golden/sym/simplify.txt), each also proven by Z3, plus
// rule-level checks.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "sym/printer.h"
#include "sym/simplify.h"
#include "golden.h"
#include "sym_testing.h"

#ifndef PROTEAN_SOURCE_DIR
#define PROTEAN_SOURCE_DIR "."
#endif

namespace protean::sym {
namespace {

struct GoldenPair {
  int line;
  std::string input, expected;
  RangeAnalyzer ranges;
};

std::vector<GoldenPair> load_golden(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<GoldenPair> pairs;
  RangeAnalyzer ra(ValueRange{2, kIntOo});
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("@range ", 0) == 0) {
      size_t sp = line.find(' ', 7);
      ra.set_symbol_range(symbol(line.substr(7, sp - 7)), parse_value_range(line.substr(sp + 1)));
      continue;
    }
    size_t arrow = line.find("  =>  ");
    EXPECT_NE(arrow, std::string::npos) << path << ":" << n << ": missing '  =>  '";
    if (arrow == std::string::npos) continue;
    pairs.push_back({n, line.substr(0, arrow), line.substr(arrow + 6), ra});
  }
  return pairs;
}

const std::string kGolden = protean::testing::golden_path("sym/simplify.txt");

TEST(SymSimplify, GoldenPairs) {
  auto pairs = load_golden(kGolden);
  ASSERT_GE(pairs.size(), 250u);
  std::string diff;
  int failures = 0;
  for (const GoldenPair& p : pairs) {
    std::string actual;
    try {
      actual = print(simplify(parse(p.input), &p.ranges));
    } catch (const std::exception& e) {
      actual = std::string("<exception: ") + e.what() + ">";
    }
    if (actual != p.expected) {
      ++failures;
      diff += "simplify.txt:" + std::to_string(p.line) + ": " + p.input + "\n  - " + p.expected + "\n  + " + actual + "\n";
    }
  }
  EXPECT_EQ(failures, 0) << "golden simplification mismatches (- expected, + actual):\n" << diff;
}

TEST(SymSimplify, GoldenPairsAreEquivalentUnderZ3) {
  auto pairs = load_golden(kGolden);
  int unknown = 0;
  for (const GoldenPair& p : pairs) {
    Expr in = parse(p.input);
    Expr out = parse(p.expected);
    if (p.input.find("**s") != std::string::npos) continue;  // symbolic exponents are not encoded
    std::string model;
    testing::Proof r = testing::prove_equal(in, out, p.ranges, &model, 1000);
    EXPECT_NE(r, testing::Proof::CounterExample)
        << "simplify.txt:" << p.line << ": " << p.input << "  =>  " << p.expected << " is wrong; counterexample:\n" << model;
    unknown += r == testing::Proof::Unknown;
  }
  EXPECT_LE(unknown, 5) << "too many pairs Z3 could not decide";
}

TEST(SymSimplify, GoldenOutputsAreFixpointsAndRoundTrip) {
  for (const GoldenPair& p : load_golden(kGolden)) {
    Expr out = simplify(parse(p.input), &p.ranges);
    EXPECT_EQ(simplify(out, &p.ranges), out) << p.input;
    EXPECT_EQ(parse(print(out)), out) << p.input;
  }
}

TEST(SymSimplify, WithoutRangesOnlyUnconditionalRulesFire) {
  EXPECT_EQ(print(simplify(parse("Max(s0, 1)"))), "Max(1, s0)");
  EXPECT_EQ(print(simplify(parse("(4*s0)//2"))), "2*s0");
  EXPECT_EQ(print(simplify(parse("Mod(2*s0, 2)"))), "0");
  EXPECT_EQ(print(simplify(parse("(s0*s1)//s0"))), "((s0*s1)//s0)");  // s0 may be 0
  EXPECT_EQ(print(simplify(parse("1//s0"))), "(1//s0)");
}

TEST(SymSimplify, RuleHitCountersCount) {
  reset_rule_stats();
  RangeAnalyzer ra(ValueRange{2, kIntOo});
  simplify(parse("(4*s0)//2"), &ra);
  simplify(parse("(4*s1)//2"), &ra);
  uint64_t hits = 0;
  bool found = false;
  for (const RuleStat& r : rule_stats())
    if (r.name == "fd_exact") {
      found = true;
      hits = r.hits;
      EXPECT_EQ(r.group, "FloorDiv");
    }
  EXPECT_TRUE(found);
  EXPECT_EQ(hits, 2u);
}

TEST(SymSimplify, NormalizeRelation) {
  EXPECT_EQ(print(normalize_relation(parse("s0 + 1 < 5"))), "s0 < 4");
  EXPECT_EQ(print(normalize_relation(parse("s0 >= 2"))), "2 <= s0");
  EXPECT_EQ(print(normalize_relation(parse("Eq(33, s0)"))), "Eq(s0, 33)");
  EXPECT_EQ(print(normalize_relation(parse("Eq(2*s0, 7)"))), "False");
  EXPECT_EQ(print(normalize_relation(parse("3 - s0 > 0"))), "s0 < 3");
  EXPECT_EQ(normalize_relation(parse("s0 + 1")), parse("s0 + 1"));
}

TEST(SymSimplify, FiftyNodeExpressionSimplifies) {
  RangeAnalyzer ra(ValueRange{2, kIntOo});
  Expr e = parse("Max(1, ((4*s0 + 8)//4)*s1 + Mod(2*s2, 2) - (s1*s0 + s1)) + Min(s0, 1) + ((s0*s1)//s1) + CeilDiv(6*s2, 3) + Mod(s0, 2) + 2*(s0//2)");
  EXPECT_GE(e->node_count, 30u);
  EXPECT_EQ(print(simplify(e, &ra)), "2*s0 + s1 + 2*s2 + 1");
}

}  // namespace
}  // namespace protean::sym
