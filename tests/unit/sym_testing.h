// Helpers shared by the sym tests: a random expression generator and a Z3 encoding of SymExpr.
#pragma once

#include <z3++.h>

#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "sym/expr.h"
#include "sym/value_ranges.h"

namespace protean::sym::testing {

/// Symbols of the fuzzers: s0..s2 are sizes (VR[2, int_oo]), n0 may be any integer.
inline std::vector<Expr> fuzz_symbols() { return {symbol("s0"), symbol("s1"), symbol("s2"), symbol("n0")}; }

inline RangeAnalyzer fuzz_ranges() {
  RangeAnalyzer ra;
  for (const char* s : {"s0", "s1", "s2"}) ra.set_symbol_range(symbol(s), {2, kIntOo});
  ra.set_symbol_range(symbol("n0"), ValueRange::full());
  return ra;
}

/// Random expressions whose divisors are positive constants or size symbols (never zero).
class ExprGen {
 public:
  explicit ExprGen(uint32_t seed) : rng_(seed) {}

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  int64_t range(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }

  Expr leaf() {
    int k = pick(10);
    if (k < 6) return syms_[static_cast<size_t>(pick(k < 5 ? 3 : 4))];
    return integer(range(-4, 9));
  }
  Expr divisor() { return pick(4) == 0 ? syms_[static_cast<size_t>(pick(3))] : integer(range(1, 8)); }

  Expr int_expr(int depth) {
    if (depth <= 0 || pick(5) == 0) return leaf();
    Expr a = int_expr(depth - 1);
    switch (pick(11)) {
      case 0:
      case 1: return add(a, int_expr(depth - 1));
      case 2: return sub(a, int_expr(depth - 1));
      case 3: return mul(integer(range(-3, 6)), a);
      case 4: return pick(3) == 0 ? mul(a, leaf()) : add(mul(integer(range(1, 4)), a), leaf());
      case 5: return floordiv(a, divisor());
      case 6: return mod(a, divisor());
      case 7: return ceildiv(a, divisor());
      case 8: return maximum(a, int_expr(depth - 1));
      case 9: return minimum(a, int_expr(depth - 1));
      default: return floordiv(mul(integer(range(1, 8)), a), divisor());
    }
  }

  Expr bool_expr(int depth) {
    int k = pick(8);
    if (depth <= 0 || k < 5) {
      static const Kind rels[] = {Kind::Eq, Kind::Ne, Kind::Lt, Kind::Le, Kind::Gt, Kind::Ge};
      return relation(rels[pick(6)], int_expr(depth), pick(2) ? integer(range(-2, 20)) : int_expr(depth - 1));
    }
    if (k == 5) return and_(bool_expr(depth - 1), bool_expr(depth - 1));
    if (k == 6) return or_(bool_expr(depth - 1), bool_expr(depth - 1));
    return not_(bool_expr(depth - 1));
  }

  /// Values inside the fuzz ranges (sizes 2..40, n0 -40..40).
  std::unordered_map<Expr, int64_t> assignment() {
    std::unordered_map<Expr, int64_t> v;
    for (size_t i = 0; i < 3; ++i) v[syms_[i]] = range(2, 40);
    v[syms_[3]] = range(-40, 40);
    return v;
  }

 private:
  std::mt19937 rng_;
  std::vector<Expr> syms_ = fuzz_symbols();
};

/// Z3 encoding with floor semantics for FloorDiv/Mod/CeilDiv (Z3's integer div is Euclidean, which
/// agrees with floor only for positive divisors, so negative divisors are folded to positive ones).
class Z3Encoder {
 public:
  explicit Z3Encoder(z3::context& ctx) : ctx_(ctx) {}

  z3::expr floor_div(const z3::expr& a, const z3::expr& b) { return z3::ite(b > 0, a / b, (-a) / (-b)); }

  z3::expr encode(Expr e) {
    switch (e->kind) {
      case Kind::Integer: return ctx_.int_val(static_cast<int64_t>(e->value));
      case Kind::Symbol: return var(e);
      case Kind::True: return ctx_.bool_val(true);
      case Kind::False: return ctx_.bool_val(false);
      case Kind::Add: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) r = r + encode(e->args[i]);
        return r;
      }
      case Kind::Mul: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) r = r * encode(e->args[i]);
        return r;
      }
      case Kind::Pow: {
        if (!e->args[1]->is_integer()) throw std::runtime_error("Z3Encoder: symbolic exponent");
        z3::expr b = encode(e->args[0]);
        z3::expr r = ctx_.int_val(1);
        for (int64_t i = 0; i < e->args[1]->value; ++i) r = r * b;
        return r;
      }
      case Kind::FloorDiv: return floor_div(encode(e->args[0]), encode(e->args[1]));
      case Kind::CeilDiv: return -floor_div(-encode(e->args[0]), encode(e->args[1]));
      case Kind::Mod: {
        z3::expr a = encode(e->args[0]), b = encode(e->args[1]);
        return a - b * floor_div(a, b);
      }
      case Kind::Max: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) {
          z3::expr x = encode(e->args[i]);
          r = z3::ite(x > r, x, r);
        }
        return r;
      }
      case Kind::Min: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) {
          z3::expr x = encode(e->args[i]);
          r = z3::ite(x < r, x, r);
        }
        return r;
      }
      case Kind::Eq: return encode(e->args[0]) == encode(e->args[1]);
      case Kind::Ne: return encode(e->args[0]) != encode(e->args[1]);
      case Kind::Lt: return encode(e->args[0]) < encode(e->args[1]);
      case Kind::Le: return encode(e->args[0]) <= encode(e->args[1]);
      case Kind::Gt: return encode(e->args[0]) > encode(e->args[1]);
      case Kind::Ge: return encode(e->args[0]) >= encode(e->args[1]);
      case Kind::And: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) r = r && encode(e->args[i]);
        return r;
      }
      case Kind::Or: {
        z3::expr r = encode(e->args[0]);
        for (size_t i = 1; i < e->args.size(); ++i) r = r || encode(e->args[i]);
        return r;
      }
      case Kind::Not: return !encode(e->args[0]);
    }
    throw std::runtime_error("Z3Encoder: unknown kind");
  }

  /// Range constraints of every symbol seen so far.
  z3::expr assumptions(const RangeAnalyzer& ra) {
    z3::expr r = ctx_.bool_val(true);
    for (auto& [sym, v] : vars_) {
      ValueRange vr = ra.symbol_range(sym);
      if (vr.lo != kNegIntOo) r = r && v >= ctx_.int_val(static_cast<int64_t>(vr.lo));
      if (vr.hi != kIntOo) r = r && v <= ctx_.int_val(static_cast<int64_t>(vr.hi));
    }
    return r;
  }

 private:
  z3::expr var(Expr s) {
    auto it = vars_.find(s);
    if (it != vars_.end()) return it->second;
    z3::expr v = ctx_.int_const(s->name.c_str());
    vars_.emplace(s, v);
    return v;
  }

  z3::context& ctx_;
  std::unordered_map<Expr, z3::expr> vars_;
};

enum class Proof { Equivalent, CounterExample, Unknown };

/// Proves a == b for all symbol values inside the analyzer's ranges. On a counterexample, `model`
/// receives Z3's model text.
inline Proof prove_equal(Expr a, Expr b, const RangeAnalyzer& ra, std::string* model = nullptr, unsigned timeout_ms = 2000) {
  z3::context ctx;
  Z3Encoder enc(ctx);
  z3::expr za = enc.encode(a), zb = enc.encode(b);
  z3::solver s(ctx);
  z3::params p(ctx);
  p.set("timeout", timeout_ms);
  s.set(p);
  s.add(enc.assumptions(ra));
  s.add(za != zb);
  switch (s.check()) {
    case z3::unsat: return Proof::Equivalent;
    case z3::sat:
      if (model) *model = s.get_model().to_string();
      return Proof::CounterExample;
    case z3::unknown: return Proof::Unknown;
  }
  return Proof::Unknown;
}

}  // namespace protean::sym::testing
