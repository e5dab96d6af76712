// Rewrite rules of the SymExpr simplifier, one per line, grouped per operator.
//
// Reading a rule: PROTEAN_RULE(group, name, condition, result) returns `result` when `condition`
// holds and counts a hit. Conditions may assign the helper variable `r` (nullptr = no match).
// Every rule must preserve the value for all symbol assignments inside the analyzer's ranges
// (expr.h semantics: floor division); the Z3 fuzzer checks this.
#include "sym/simplify.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

namespace protean::sym {

namespace {

struct RuleCounter {
  const char* group;
  const char* name;
  std::atomic<uint64_t> hits{0};
  RuleCounter(const char* g, const char* n);
};

std::mutex& registry_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::vector<RuleCounter*>& registry() {
  static auto* r = new std::vector<RuleCounter*>();
  return *r;
}
RuleCounter::RuleCounter(const char* g, const char* n) : group(g), name(n) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().push_back(this);
}

#define PROTEAN_RULE(GROUP, NAME, COND, RESULT)                       \
  do {                                                                \
    static RuleCounter rule_##NAME(GROUP, #NAME);                     \
    if (COND) {                                                       \
      rule_##NAME.hits.fetch_add(1, std::memory_order_relaxed);       \
      return (RESULT);                                                \
    }                                                                 \
  } while (0)

bool is_pos_int(Expr e) { return e->is_integer() && e->value > 0; }

// Monomial-like divisor: a product, power or symbol (sums and calls are not split over).
bool is_monomial(Expr e) {
  return e->is_integer() || e->is_symbol() || e->kind == Kind::Mul || e->kind == Kind::Pow;
}

class Simplifier {
 public:
  explicit Simplifier(const RangeAnalyzer& ra) : ra_(ra) {}

  Expr run(Expr e) {
    if (e->is_constant()) return e;
    if (auto it = memo_.find(e); it != memo_.end()) return it->second;
    Expr x = e;
    if (!e->args.empty()) {
      std::vector<Expr> args;
      args.reserve(e->args.size());
      bool changed = false;
      for (Expr a : e->args) {
        args.push_back(run(a));
        changed |= args.back() != a;
      }
      if (changed) x = rebuild(e, args);
    }
    Expr y = rewrite(x);
    if (y != x && depth_ < 32) {
      ++depth_;
      y = run(y);
      --depth_;
    } else if (y == x && x != e && !x->is_constant()) {
      // rebuilt node may have a memoized simplification already
      if (auto it = memo_.find(x); it != memo_.end()) y = it->second;
    }
    memo_.emplace(e, y);
    return y;
  }

 private:
  ValueRange R(Expr e) const { return ra_.range(e); }
  bool positive(Expr e) const { return R(e).lo > 0; }
  bool nonzero(Expr e) const {
    ValueRange r = R(e);
    return r.lo > 0 || r.hi < 0;
  }

  // a / b when b divides every term of a exactly (b a nonzero integer or nonzero monomial).
  Expr exact(Expr a, Expr b) const {
    if (!is_monomial(b) || !nonzero(b)) return nullptr;
    auto q = exact_divide(a, b);
    return q ? *q : nullptr;
  }

  // (b*q + r) // b → q + r // b (also for CeilDiv and Mod): splits off the exactly divisible terms.
  Expr split(Expr a, Expr b, Kind kind) const {
    if (a->kind != Kind::Add || !is_monomial(b) || !nonzero(b)) return nullptr;
    std::vector<Expr> q, rest;
    for (Expr t : a->args) {
      auto d = exact_divide(t, b);
      if (d)
        q.push_back(*d);
      else
        rest.push_back(t);
    }
    if (q.empty() || rest.empty()) return nullptr;
    Expr r = add(rest);
    switch (kind) {
      case Kind::FloorDiv: return add(add(q), floordiv(r, b));
      case Kind::CeilDiv: return add(add(q), ceildiv(r, b));
      case Kind::Mod: return mod(r, b);
      case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
      case Kind::Max: case Kind::Min: case Kind::True: case Kind::False: case Kind::Eq:
      case Kind::Ne: case Kind::Lt: case Kind::Le: case Kind::Gt: case Kind::Ge: case Kind::And:
      case Kind::Or: case Kind::Not:
        return nullptr;  // only the division kinds split
    }
    return nullptr;
  }

  // Common factor of the numerator's coefficients and the divisor's coefficient:
  // (4*s0 + 2)//6 → (2*s0 + 1)//3, (8*s0)//(4*s1) → (2*s0)//s1.
  int64_t common(Expr a, Expr b) const {
    if (!is_monomial(b)) return 1;
    int64_t g = gcd_int(content(a), split_coefficient(b).first);
    return g > 1 ? g : 1;
  }
  Expr div_common(Expr x, Expr a, Expr b) const {  // x / common(a, b), exact by construction
    return *exact_divide(x, common(a, b));
  }

  // Mod(3*s0 + 5, 2) → Mod(s0 + 1, 2): coefficients and constant reduced modulo a constant divisor.
  Expr reduce_mod(Expr a, Expr b) const {
    if (!b->is_integer()) return nullptr;
    int64_t k = b->value;
    LinearTerms t = as_terms(a);
    std::vector<Expr> out;
    for (auto& [m, c] : t.terms) out.push_back(mul(integer(mod_int(c, k)), m));
    out.push_back(integer(mod_int(t.constant, k)));
    Expr r = add(out);
    return r != a ? r : nullptr;
  }

  // k*FloorDiv(x, y) + Mod(x, y) → x (with any common coefficient c on both terms).
  Expr fold_mod_floordiv(Expr e) const {
    LinearTerms t = as_terms(e);
    for (auto& [m, c] : t.terms) {
      if (m->kind != Kind::Mod) continue;
      Expr x = m->args[0], y = m->args[1];
      auto [c2, m2] = split_coefficient(mul(integer(c), mul(y, floordiv(x, y))));
      for (auto& [n, d] : t.terms)
        if (n == m2 && d == c2) return add(sub(sub(e, mul(integer(c), m)), mul(integer(c2), m2)), mul(integer(c), x));
    }
    return nullptr;
  }

  // Max/Min without the operands that can never be the result.
  Expr drop_dominated(Expr e, bool is_max) const {
    std::vector<Expr> args(e->args.begin(), e->args.end());
    bool changed = false;
    for (size_t i = 0; i < args.size() && args.size() > 1;) {
      bool dominated = false;
      for (size_t j = 0; j < args.size() && !dominated; ++j) {
        if (i == j) continue;
        ValueRange d = R(sub(args[j], args[i]));
        dominated = is_max ? d.lo >= 0 : d.hi <= 0;
      }
      if (dominated) {
        args.erase(args.begin() + static_cast<ptrdiff_t>(i));
        changed = true;
      } else {
        ++i;
      }
    }
    if (!changed) return nullptr;
    return is_max ? maximum(args) : minimum(args);
  }

  Expr rewrite(Expr e) const {
    Expr r = nullptr;
    // ---- any node ------------------------------------------------------------------------------
    if (!e->is_bool()) {
      PROTEAN_RULE("Any", const_range, R(e).is_singleton(), integer(R(e).lo));
    } else {
      PROTEAN_RULE("Any", bool_range, R(e).is_singleton(), boolean(R(e).lo != 0));
    }
    Expr a = e->args.size() > 0 ? e->args[0] : nullptr;
    Expr b = e->args.size() > 1 ? e->args[1] : nullptr;
    switch (e->kind) {
      case Kind::Integer:
      case Kind::Symbol:
      case Kind::True:
      case Kind::False:
      case Kind::Mul:
      case Kind::Pow:
      case Kind::Not:
        return e;
      case Kind::Add:
        PROTEAN_RULE("Add", add_mod_floordiv, (r = fold_mod_floordiv(e)) != nullptr, r);
        return e;
      case Kind::FloorDiv:
        PROTEAN_RULE("FloorDiv", fd_exact,      (r = exact(a, b)) != nullptr,                         r);
        PROTEAN_RULE("FloorDiv", fd_split,      (r = split(a, b, Kind::FloorDiv)) != nullptr,         r);
        PROTEAN_RULE("FloorDiv", fd_gcd,        common(a, b) > 1,                                     floordiv(div_common(a, a, b), div_common(b, a, b)));
        PROTEAN_RULE("FloorDiv", fd_nested,     a->kind == Kind::FloorDiv && positive(a->args[1]) && positive(b), floordiv(a->args[0], mul(a->args[1], b)));
        PROTEAN_RULE("FloorDiv", fd_small,      positive(b) && R(a).lo >= 0 && R(a).hi < R(b).lo,     integer(0));
        PROTEAN_RULE("FloorDiv", fd_neg_small,  positive(b) && R(a).hi < 0 && R(a).lo != kNegIntOo && R(a).lo >= -R(b).lo, integer(-1));
        return e;
      case Kind::CeilDiv:
        PROTEAN_RULE("CeilDiv", cd_exact,       (r = exact(a, b)) != nullptr,                         r);
        PROTEAN_RULE("CeilDiv", cd_split,       (r = split(a, b, Kind::CeilDiv)) != nullptr,          r);
        PROTEAN_RULE("CeilDiv", cd_gcd,         common(a, b) > 1,                                     ceildiv(div_common(a, a, b), div_common(b, a, b)));
        PROTEAN_RULE("CeilDiv", cd_nested,      a->kind == Kind::CeilDiv && positive(a->args[1]) && positive(b), ceildiv(a->args[0], mul(a->args[1], b)));
        PROTEAN_RULE("CeilDiv", cd_small,       positive(b) && R(a).lo >= 1 && R(a).hi <= R(b).lo,    integer(1));
        return e;
      case Kind::Mod:
        PROTEAN_RULE("Mod", mod_exact,          exact(a, b) != nullptr,                               integer(0));
        PROTEAN_RULE("Mod", mod_reduce,         (r = reduce_mod(a, b)) != nullptr,                    mod(r, b));
        PROTEAN_RULE("Mod", mod_split,          (r = split(a, b, Kind::Mod)) != nullptr,              r);
        PROTEAN_RULE("Mod", mod_gcd,            positive(b) && common(a, b) > 1,                    mul(integer(common(a, b)), mod(div_common(a, a, b), div_common(b, a, b))));
        PROTEAN_RULE("Mod", mod_small,          positive(b) && R(a).lo >= 0 && R(a).hi < R(b).lo,     a);
        PROTEAN_RULE("Mod", mod_neg_small,      positive(b) && R(a).hi < 0 && R(a).lo != kNegIntOo && R(a).lo >= -R(b).lo, add(a, b));
        PROTEAN_RULE("Mod", mod_nested,         a->kind == Kind::Mod && is_pos_int(a->args[1]) && is_pos_int(b) && a->args[1]->value % b->value == 0, mod(a->args[0], b));
        return e;
      case Kind::Max:
        PROTEAN_RULE("Max", max_dominated,      (r = drop_dominated(e, true)) != nullptr,             r);
        return e;
      case Kind::Min:
        PROTEAN_RULE("Min", min_dominated,      (r = drop_dominated(e, false)) != nullptr,            r);
        return e;
      case Kind::Eq:
      case Kind::Ne:
      case Kind::Lt:
      case Kind::Le:
      case Kind::Gt:
      case Kind::Ge:
        PROTEAN_RULE("Rel", rel_normalize,      (r = normalize_relation(e)) != e,                     r);
        return e;
      case Kind::And:
      case Kind::Or:
        return e;
    }
    return e;
  }

  const RangeAnalyzer& ra_;
  std::unordered_map<Expr, Expr> memo_;
  int depth_ = 0;
};

}  // namespace

Expr normalize_relation(Expr e) {
  if (!e->is_relation()) return e;
  Kind k = e->kind;
  Expr a = e->args[0], b = e->args[1];
  if (k == Kind::Gt) std::swap(a, b), k = Kind::Lt;
  if (k == Kind::Ge) std::swap(a, b), k = Kind::Le;
  try {
    LinearTerms t = as_terms(sub(a, b));  // relation is `t OP 0`
    if (t.terms.empty()) return relation(k, integer(t.constant), integer(0));
    int64_t g = 0;
    for (auto& [m, c] : t.terms) g = gcd_int(g, c);
    int64_t c = t.constant;
    switch (k) {
      case Kind::Lt: c = floordiv_int(c, g); break;   // g*q + c < 0  ⇔ q + floor(c/g) < 0
      case Kind::Le: c = -floordiv_int(-c, g); break;  // g*q + c <= 0 ⇔ q + ceil(c/g) <= 0
      case Kind::Eq:
      case Kind::Ne:
        if (c % g != 0) return boolean(k == Kind::Ne);
        c /= g;
        break;
      case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
      case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
      case Kind::True: case Kind::False: case Kind::Gt: case Kind::Ge: case Kind::And:
      case Kind::Or: case Kind::Not:
        break;  // Gt/Ge were turned into Lt/Le above; nothing else reaches here
    }
    for (auto& [m, coef] : t.terms) coef /= g;
    if ((k == Kind::Eq || k == Kind::Ne) && t.terms.front().second < 0) {
      for (auto& [m, coef] : t.terms) coef = -coef;
      c = -c;
    }
    // `lhs - rhs + c OP 0`: a lone constant side takes c as is; otherwise c goes where it is positive.
    std::vector<Expr> lhs, rhs;
    for (auto& [m, coef] : t.terms) (coef > 0 ? lhs : rhs).push_back(mul(integer(coef > 0 ? coef : -coef), m));
    if (lhs.empty() || (!rhs.empty() && c > 0))
      lhs.push_back(integer(c));
    else
      rhs.push_back(integer(-c));
    return relation(k, add(lhs), add(rhs));
  } catch (const OverflowError&) {
    return e;
  }
}

Expr simplify(Expr e, const RangeAnalyzer* ranges) {
  if (ranges) return Simplifier(*ranges).run(e);
  RangeAnalyzer none;
  return Simplifier(none).run(e);
}

std::vector<RuleStat> rule_stats() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<RuleStat> out;
  for (RuleCounter* r : registry()) out.push_back({r->group, r->name, r->hits.load(std::memory_order_relaxed)});
  return out;
}

void reset_rule_stats() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (RuleCounter* r : registry()) r->hits.store(0, std::memory_order_relaxed);
}

}  // namespace protean::sym
