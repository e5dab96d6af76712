// Text form of SymExpr in PyTorch's (sympy str) style, and a parser for it.
//
//   integers and symbols     33, -4, s0, u1
//   sums and products        2*s0 + s1, s0*s1 - 3, -s0 + 5, s0**2
//   floor division           (s0//2), ((s0 + 1)//2), ((2*s0)//3)
//   calls                    Mod(s0, 2), CeilDiv(s0, 4), Max(1, s0), Min(s0, s1), Eq(s0, 33), Ne(s0, 1)
//   inequalities             s0 < 100, 2 <= s0, s0 > s1, s0 >= 4
//   logic                    (s0 < 100) & Eq(s1, 2), (s0 < 4) | (s1 < 4), ~((s0 < 4) & (s1 < 4))
//   constants                True, False
// Guarantee: for every expression built by the constructors of expr.h,
// parse(print(e)) == e (the same node), except products of sums too large to expand
// (kMaxExpandTerms), which re-expand on parsing.
// The parser also accepts `%` (Mod), `==`/`!=` (Eq/Ne), and FloorDiv(a, b)/Pow(a, b)/And/Or/Not calls.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "sym/expr.h"

namespace protean::sym {

/// How a symbol is printed (default: its name). Lets guards print sources instead of symbols.
using SymbolNamer = std::function<std::string(Expr symbol)>;

std::string print(Expr e);
std::string print(Expr e, const SymbolNamer& namer);

/// Thrown by parse(): the message names the offending position and what was expected.
class ParseError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// Parses the text form above into canonical nodes. Throws ParseError.
Expr parse(std::string_view text);

}  // namespace protean::sym
