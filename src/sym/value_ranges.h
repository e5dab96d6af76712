// Value ranges: a sound integer interval for every SymExpr node, given intervals for its symbols.
//
// Needs: expressions from expr.h; symbol intervals supplied by the owner (a ShapeEnv gives backed
// size symbols VR[2, int_oo] and tightens them as guards are added).
// Guarantees (soundness): for every assignment of the symbols inside their intervals under which e
// is defined (no division by zero), evaluate(e) lies in range(e). Booleans use [0, 1]: VR[1, 1] is
// "always true", VR[0, 0] "always false". Ends are int64 or +-int_oo (kIntOo / kNegIntOo); any
// arithmetic that would overflow saturates to int_oo, which only widens the interval.
// Example: s0 in VR[2, int_oo] ⇒ FloorDiv(s0 + 1, 2) in VR[1, int_oo], Mod(s0, 4) in VR[0, 3].
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sym/expr.h"

namespace protean::sym {

inline constexpr int64_t kIntOo = std::numeric_limits<int64_t>::max();     ///< int_oo
inline constexpr int64_t kNegIntOo = std::numeric_limits<int64_t>::min();  ///< -int_oo

struct ValueRange {
  int64_t lo = kNegIntOo;
  int64_t hi = kIntOo;

  static constexpr ValueRange full() { return {}; }
  static constexpr ValueRange point(int64_t v) { return {v, v}; }
  static constexpr ValueRange boolean() { return {0, 1}; }
  bool is_singleton() const { return lo == hi && lo != kNegIntOo && lo != kIntOo; }
  bool empty() const { return lo > hi; }
  bool contains(int64_t v) const { return lo <= v && v <= hi; }
  bool contains(const ValueRange& o) const { return lo <= o.lo && o.hi <= hi; }
  bool known_true() const { return lo >= 1; }    ///< for booleans
  bool known_false() const { return hi <= 0 && lo >= 0; }
  ValueRange intersect(const ValueRange& o) const;
  ValueRange hull(const ValueRange& o) const;
  bool operator==(const ValueRange&) const = default;
};

/// "VR[2, int_oo]" (PyTorch's ValueRanges printing).
std::string to_string(const ValueRange& r);
/// Parses "VR[2, int_oo]", "[-int_oo, 5]" (the "VR" prefix is optional). Throws std::invalid_argument.
ValueRange parse_value_range(std::string_view text);

/// Interval analysis with a per-analyzer cache keyed by node address (nodes are hash-consed, so the
/// cache key is structural). Not thread-safe: one analyzer belongs to one ShapeEnv / one thread.
class RangeAnalyzer {
 public:
  explicit RangeAnalyzer(ValueRange default_symbol_range = ValueRange::full())
      : default_symbol_range_(default_symbol_range) {}

  /// Sets (replaces) a symbol's interval and invalidates cached ranges.
  void set_symbol_range(Expr symbol, ValueRange r);
  /// The interval of a symbol (the default one when never set).
  ValueRange symbol_range(Expr symbol) const;
  bool has_symbol_range(Expr symbol) const { return symbols_.count(symbol) != 0; }
  const std::unordered_map<Expr, ValueRange>& symbol_ranges() const { return symbols_; }
  void set_default_symbol_range(ValueRange r);
  ValueRange default_symbol_range() const { return default_symbol_range_; }

  /// Sound interval of e (cached).
  ValueRange range(Expr e) const;
  void clear_cache() const { cache_.clear(); }

 private:
  ValueRange compute(Expr e) const;

  ValueRange default_symbol_range_;
  std::unordered_map<Expr, ValueRange> symbols_;
  mutable std::unordered_map<Expr, ValueRange> cache_;
};

// Interval arithmetic on ends (saturating; exposed for tests and the simplifier).
ValueRange range_add(ValueRange a, ValueRange b);
ValueRange range_mul(ValueRange a, ValueRange b);
ValueRange range_neg(ValueRange a);
ValueRange range_floordiv(ValueRange a, ValueRange b);
ValueRange range_mod(ValueRange a, ValueRange b);
ValueRange range_pow(ValueRange base, ValueRange exponent);

}  // namespace protean::sym
