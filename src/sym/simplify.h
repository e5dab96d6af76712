// Simplifier: rewrites a SymExpr into a simpler equivalent one using value ranges and divisibility.
//
// Needs: canonical nodes (expr.h) and, optionally, symbol ranges (value_ranges.h). Without an
// analyzer every symbol ranges over all integers, so only unconditional rules fire.
// Guarantees: for every assignment of the symbols inside their ranges for which `e` is defined,
// simplify(e) evaluates to the same value (checked by the Z3 fuzzer in tests/unit/sym_z3_test.cpp).
// The result is canonical and simplify(simplify(e)) == simplify(e) for the rules below.
//
// Rules are listed one per line, grouped per operator, in simplify.cpp, e.g.
//   FloorDiv  fd_exact      (4*s0)//2        → 2*s0
//   FloorDiv  fd_gcd        (4*s0 + 2)//6    → (2*s0 + 1)//3
//   Mod       mod_exact     Mod(2*s0, 2)     → 0
//   Max       max_dominated Max(1, s0)       → s0              when s0 >= 2
//   Lt        rel_normalize s0 + 1 < 5       → s0 < 4
// Each rule has a hit counter (rule_stats()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sym/expr.h"
#include "sym/value_ranges.h"

namespace protean::sym {

/// Simplifies `e` under the symbol ranges of `ranges` (nullptr: no range facts).
Expr simplify(Expr e, const RangeAnalyzer* ranges = nullptr);

/// Normal form of a relation used by simplify and by guard bookkeeping: Gt/Ge become Lt/Le, all
/// symbols move to the side where their coefficient is positive, the constant to the side where it
/// is positive, common factors are divided out: `s0 + 1 < 5` → `s0 < 4`, `Ge(s0, 2)` → `2 <= s0`,
/// `Eq(33, s0)` → `Eq(s0, 33)`, `Eq(2*s0, 7)` → `False`. Returns `e` unchanged for non-relations.
Expr normalize_relation(Expr e);

struct RuleStat {
  std::string group;  ///< operator the rule belongs to ("FloorDiv")
  std::string name;   ///< rule name ("fd_exact")
  uint64_t hits;
};
/// Hit counters of every rule tried so far in this process.
std::vector<RuleStat> rule_stats();
void reset_rule_stats();

}  // namespace protean::sym
