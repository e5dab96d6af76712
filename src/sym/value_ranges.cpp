// Interval analysis for SymExpr. See value_ranges.h for the soundness contract.
#include "sym/value_ranges.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace protean::sym {

namespace {

bool is_inf(int64_t v) { return v == kIntOo || v == kNegIntOo; }

int64_t clamp128(__int128 v) {
  if (v >= static_cast<__int128>(kIntOo)) return kIntOo;
  if (v <= static_cast<__int128>(kNegIntOo)) return kNegIntOo;
  return static_cast<int64_t>(v);
}

int64_t sat_add(int64_t a, int64_t b) {
  if (a == kNegIntOo || b == kNegIntOo) return kNegIntOo;
  if (a == kIntOo || b == kIntOo) return kIntOo;
  return clamp128(static_cast<__int128>(a) + b);
}

int64_t sat_neg(int64_t a) {
  if (a == kIntOo) return kNegIntOo;
  if (a == kNegIntOo) return kIntOo;
  return -a;
}

int64_t sat_mul(int64_t a, int64_t b) {
  if (a == 0 || b == 0) return 0;  // the finite value behind an infinite end times 0 is 0
  if (is_inf(a) || is_inf(b)) return ((a < 0) != (b < 0)) ? kNegIntOo : kIntOo;
  return clamp128(static_cast<__int128>(a) * b);
}

int64_t sat_pow(int64_t base, int64_t exp) {
  int64_t r = 1;
  for (int64_t i = 0; i < exp; ++i) {
    r = sat_mul(r, base);
    if (is_inf(r)) return (base < 0 && (exp % 2 == 1)) ? kNegIntOo : kIntOo;
    if (r == 0 || r == 1) break;  // 0 and 1 are fixed points; (-1)^k handled below
  }
  if (base == -1) return (exp % 2 == 0) ? 1 : -1;
  return r;
}

// floor(x / y) for one end x (maybe infinite) and y > 0 (maybe int_oo).
int64_t div_end(int64_t x, int64_t y) {
  if (y == kIntOo) {
    if (x == kIntOo) return kIntOo;  // only reached as an upper end: any quotient is possible
    return x >= 0 ? 0 : (x == kNegIntOo ? kNegIntOo : -1);
  }
  if (is_inf(x)) return x;
  return floordiv_int(x, y);
}

}  // namespace

ValueRange ValueRange::intersect(const ValueRange& o) const { return {std::max(lo, o.lo), std::min(hi, o.hi)}; }
ValueRange ValueRange::hull(const ValueRange& o) const { return {std::min(lo, o.lo), std::max(hi, o.hi)}; }

std::string to_string(const ValueRange& r) {
  auto end = [](int64_t v) -> std::string {
    if (v == kIntOo) return "int_oo";
    if (v == kNegIntOo) return "-int_oo";
    return std::to_string(v);
  };
  return "VR[" + end(r.lo) + ", " + end(r.hi) + "]";
}

ValueRange parse_value_range(std::string_view text) {
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  if (s.rfind("VR", 0) == 0) s = s.substr(2);
  auto fail = [&]() -> ValueRange {
    throw std::invalid_argument("protean::sym: cannot parse value range '" + std::string(text) + "'");
  };
  if (s.size() < 5 || s.front() != '[' || s.back() != ']') return fail();
  size_t comma = s.find(',');
  if (comma == std::string::npos) return fail();
  auto end = [&](const std::string& t) -> int64_t {
    if (t == "int_oo" || t == "oo") return kIntOo;
    if (t == "-int_oo" || t == "-oo") return kNegIntOo;
    try {
      size_t used = 0;
      int64_t v = std::stoll(t, &used);
      if (used != t.size()) fail();
      return v;
    } catch (const std::logic_error&) {
      fail();
    }
    return 0;
  };
  return {end(s.substr(1, comma - 1)), end(s.substr(comma + 1, s.size() - comma - 2))};
}

ValueRange range_add(ValueRange a, ValueRange b) { return {sat_add(a.lo, b.lo), sat_add(a.hi, b.hi)}; }
ValueRange range_neg(ValueRange a) { return {sat_neg(a.hi), sat_neg(a.lo)}; }

ValueRange range_mul(ValueRange a, ValueRange b) {
  int64_t c[4] = {sat_mul(a.lo, b.lo), sat_mul(a.lo, b.hi), sat_mul(a.hi, b.lo), sat_mul(a.hi, b.hi)};
  return {*std::min_element(c, c + 4), *std::max_element(c, c + 4)};
}

ValueRange range_floordiv(ValueRange a, ValueRange b) {
  if (b.lo > 0) {
    int64_t lo = a.lo >= 0 ? div_end(a.lo, b.hi) : div_end(a.lo, b.lo);
    int64_t hi = a.hi >= 0 ? div_end(a.hi, b.lo) : div_end(a.hi, b.hi);
    return {lo, hi};
  }
  if (b.hi < 0) return range_floordiv(range_neg(a), range_neg(b));  // floor(a/b) == floor(-a/-b)
  return ValueRange::full();
}

ValueRange range_mod(ValueRange a, ValueRange b) {
  if (b.lo > 0) {
    if (a.lo >= 0 && a.hi < b.lo) return a;
    int64_t hi = b.hi == kIntOo ? kIntOo : b.hi - 1;
    if (a.lo >= 0) hi = std::min(hi, a.hi);
    return {0, hi};
  }
  // The result has the divisor's sign and is smaller in magnitude.
  int64_t lo = b.lo < 0 ? (b.lo == kNegIntOo ? kNegIntOo : b.lo + 1) : 0;
  int64_t hi = b.hi > 0 ? (b.hi == kIntOo ? kIntOo : b.hi - 1) : 0;
  return {lo, hi};
}

ValueRange range_pow(ValueRange base, ValueRange exponent) {
  if (exponent.is_singleton()) {
    int64_t k = exponent.lo;
    if (k < 0) return ValueRange::full();
    if (k == 0) return ValueRange::point(1);
    int64_t plo = sat_pow(base.lo, k), phi = sat_pow(base.hi, k);
    if (base.lo >= 0 || k % 2 == 1) return {plo, phi};
    if (base.hi <= 0) return {phi, plo};
    return {0, std::max(plo, phi)};
  }
  if (base.lo >= 1 && exponent.lo >= 0) return {1, kIntOo};
  if (base.lo >= 0) return {0, kIntOo};
  return ValueRange::full();
}

void RangeAnalyzer::set_symbol_range(Expr symbol, ValueRange r) {
  symbols_[symbol] = r;
  cache_.clear();
}

void RangeAnalyzer::set_default_symbol_range(ValueRange r) {
  default_symbol_range_ = r;
  cache_.clear();
}

ValueRange RangeAnalyzer::symbol_range(Expr symbol) const {
  auto it = symbols_.find(symbol);
  return it == symbols_.end() ? default_symbol_range_ : it->second;
}

ValueRange RangeAnalyzer::range(Expr e) const {
  if (e->is_integer()) return ValueRange::point(e->value);
  if (auto it = cache_.find(e); it != cache_.end()) return it->second;
  ValueRange r = compute(e);
  cache_.emplace(e, r);
  return r;
}

namespace {
// Decides a relation from the ranges of its sides; [0, 1] when undecided.
ValueRange decide(Kind k, ValueRange a, ValueRange b) {
  auto known = [](bool t, bool f) { return t ? ValueRange::point(1) : (f ? ValueRange::point(0) : ValueRange::boolean()); };
  switch (k) {
    case Kind::Eq: return known(a.is_singleton() && a == b, a.hi < b.lo || b.hi < a.lo);
    case Kind::Ne: return known(a.hi < b.lo || b.hi < a.lo, a.is_singleton() && a == b);
    case Kind::Lt: return known(a.hi < b.lo, a.lo >= b.hi);
    case Kind::Le: return known(a.hi <= b.lo, a.lo > b.hi);
    case Kind::Gt: return known(a.lo > b.hi, a.hi <= b.lo);
    case Kind::Ge: return known(a.lo >= b.hi, a.hi < b.lo);
    case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
    case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
    case Kind::True: case Kind::False: case Kind::And: case Kind::Or: case Kind::Not:
      return ValueRange::boolean();  // not a relation: undecided
  }
  return ValueRange::boolean();
}
}  // namespace

ValueRange RangeAnalyzer::compute(Expr e) const {
  auto r = [&](size_t i) { return range(e->args[i]); };
  switch (e->kind) {
    case Kind::Integer: return ValueRange::point(e->value);
    case Kind::Symbol: return symbol_range(e);
    case Kind::True: return ValueRange::point(1);
    case Kind::False: return ValueRange::point(0);
    case Kind::Add: {
      ValueRange acc = ValueRange::point(0);
      for (Expr a : e->args) acc = range_add(acc, range(a));
      return acc;
    }
    case Kind::Mul: {
      ValueRange acc = ValueRange::point(1);
      for (Expr a : e->args) acc = range_mul(acc, range(a));
      return acc;
    }
    case Kind::Pow: return range_pow(r(0), r(1));
    case Kind::FloorDiv: return range_floordiv(r(0), r(1));
    case Kind::CeilDiv: return range_neg(range_floordiv(range_neg(r(0)), r(1)));
    case Kind::Mod: return range_mod(r(0), r(1));
    case Kind::Max: {
      ValueRange acc = r(0);
      for (size_t i = 1; i < e->args.size(); ++i) {
        ValueRange x = r(i);
        acc = {std::max(acc.lo, x.lo), std::max(acc.hi, x.hi)};
      }
      return acc;
    }
    case Kind::Min: {
      ValueRange acc = r(0);
      for (size_t i = 1; i < e->args.size(); ++i) {
        ValueRange x = r(i);
        acc = {std::min(acc.lo, x.lo), std::min(acc.hi, x.hi)};
      }
      return acc;
    }
    case Kind::Eq:
    case Kind::Ne:
    case Kind::Lt:
    case Kind::Le:
    case Kind::Gt:
    case Kind::Ge: {
      ValueRange d = decide(e->kind, r(0), r(1));
      if (d.is_singleton()) return d;
      // The difference often cancels shared terms: s0 + 1 > s0.
      ValueRange diff = range(sub(e->args[0], e->args[1]));
      return decide(e->kind, diff, ValueRange::point(0));
    }
    case Kind::And: {
      bool all_true = true;
      for (Expr a : e->args) {
        ValueRange x = range(a);
        if (x.known_false()) return ValueRange::point(0);
        all_true &= x.known_true();
      }
      return all_true ? ValueRange::point(1) : ValueRange::boolean();
    }
    case Kind::Or: {
      bool all_false = true;
      for (Expr a : e->args) {
        ValueRange x = range(a);
        if (x.known_true()) return ValueRange::point(1);
        all_false &= x.known_false();
      }
      return all_false ? ValueRange::point(0) : ValueRange::boolean();
    }
    case Kind::Not: {
      ValueRange x = r(0);
      if (x.known_true()) return ValueRange::point(0);
      if (x.known_false()) return ValueRange::point(1);
      return ValueRange::boolean();
    }
  }
  return ValueRange::full();
}

}  // namespace protean::sym
