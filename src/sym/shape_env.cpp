// ShapeEnv: symbol creation, guard recording, replacements, range refinement, guard production.
#include "sym/shape_env.h"

#include <algorithm>
#include <unordered_set>

#include "sym/printer.h"
#include "sym/simplify.h"

namespace protean::sym {

namespace {
thread_local ShapeEnv* tls_current = nullptr;

std::string at(const core::SourceLocation& w) { return w.empty() ? "" : " at " + w.describe(); }

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

// A relation `p OP c` over the non-constant polynomial p (leading coefficient positive), as the
// interval p must lie in (Lt/Le/Eq) or the single value it must avoid (Ne).
struct LinearFact {
  Expr p = nullptr;
  ValueRange in;
  std::optional<int64_t> excluded;
};

std::optional<LinearFact> linear_fact(Expr e) {
  Expr n = normalize_relation(e);
  if (!n->is_relation()) return std::nullopt;
  LinearTerms t = as_terms(sub(n->args[0], n->args[1]));  // n is `t OP 0`
  if (t.terms.empty()) return std::nullopt;
  bool flip = t.terms.front().second < 0;
  std::vector<Expr> parts;
  for (auto& [m, c] : t.terms) parts.push_back(mul(integer(flip ? -c : c), m));
  LinearFact f;
  f.p = add(parts);
  int64_t c = flip ? t.constant : -t.constant;  // p OP' c
  switch (n->kind) {
    case Kind::Lt: f.in = flip ? ValueRange{c + 1, kIntOo} : ValueRange{kNegIntOo, c - 1}; break;
    case Kind::Le: f.in = flip ? ValueRange{c, kIntOo} : ValueRange{kNegIntOo, c}; break;
    case Kind::Eq: f.in = ValueRange::point(c); break;
    case Kind::Ne: f.excluded = c; break;
    case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
    case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
    case Kind::True: case Kind::False: case Kind::Gt: case Kind::Ge: case Kind::And: case Kind::Or:
    case Kind::Not:
      return std::nullopt;  // not a linear relation over the normalized kinds
  }
  return f;
}

bool implies(const LinearFact& h, const LinearFact& g) {
  if (h.p != g.p || h.excluded) return false;
  if (g.excluded) return !h.in.contains(*g.excluded);
  return g.in.contains(h.in);
}

}  // namespace

ShapeEnv::ShapeEnv(ShapeEnvOptions options) : options_(options) {}

ShapeEnv* current_shape_env() { return tls_current; }
ShapeEnvScope::ShapeEnvScope(ShapeEnv& env) : previous_(tls_current) { tls_current = &env; }
ShapeEnvScope::~ShapeEnvScope() { tls_current = previous_; }

void ShapeEnv::emit(ShapeEventKind kind, std::string message, Expr expr, const core::SourceLocation& where) {
  events_.push_back({kind, std::move(message), expr, where});
  if (listener_) listener_(events_.back());
}

SymbolInfo* ShapeEnv::info(Expr symbol) {
  auto it = symbol_index_.find(symbol);
  return it == symbol_index_.end() ? nullptr : &symbols_[it->second];
}
const SymbolInfo* ShapeEnv::symbol_info(Expr symbol) const {
  auto it = symbol_index_.find(symbol);
  return it == symbol_index_.end() ? nullptr : &symbols_[it->second];
}
Expr ShapeEnv::symbol_for_source(const std::string& source) const {
  auto it = source_symbol_.find(source);
  return it == source_symbol_.end() ? nullptr : it->second;
}

Expr ShapeEnv::new_symbol(const std::string& prefix) {
  int n = prefix == "u" ? next_unbacked_++ : next_backed_++;
  return symbol(prefix + std::to_string(n));
}

void ShapeEnv::violation(const SymbolInfo& s, const std::string& what, const core::SourceLocation& w) const {
  std::string src = s.sources.empty() ? s.symbol->name : s.sources.front();
  throw ConstraintViolation("Constraints violated (" + src + ")! " + src + " was marked dynamic (" +
                            s.symbol->name + " " + to_string(s.declared) + ") but " + what + at(w) +
                            ". Use maybe_mark_dynamic to allow specialization, or remove the code that "
                            "constrains " + src + ".");
}

// ---- symbols --------------------------------------------------------------------------------------
SymInt ShapeEnv::create_symbol(const std::string& source, int64_t hint, DimKind kind, const SymbolConstraint& c) {
  if (kind == DimKind::Unbacked) return create_unbacked_symint(source, true);
  if (kind == DimKind::Static) {
    statics_.push_back({source, hint});
    return SymInt(hint);
  }
  if (hint < 0) throw ShapeError("negative size " + std::to_string(hint) + " for " + source);
  bool zero_one = hint == 0 || (hint == 1 && !options_.keep_one_symbolic);
  if (options_.specialize_zero_one && zero_one) {
    if (c.strict) {
      core::SourceLocation w = where();
      throw ConstraintViolation("Constraints violated (" + source + ")! " + source +
                                " was marked dynamic but its size is " + std::to_string(hint) +
                                ", which is always specialized (0/1 specialization)" + at(w) +
                                ". Use maybe_mark_dynamic, or trace with a size >= 2.");
    }
    statics_.push_back({source, hint});
    return SymInt(hint);
  }
  // A kept size 1 (keep_one_symbolic) is not duck-sized: size-1 dims are mostly broadcast dims, and
  // sharing one symbol would tie unrelated inputs together with equality guards.
  const bool duck = kind == DimKind::Duck && !c.strict && !c.min && !c.max && hint != 1;
  if (duck) {
    if (auto it = duck_.find(hint); it != duck_.end()) {
      Expr s = it->second;
      info(s)->sources.push_back(source);
      source_symbol_[source] = s;
      emit(ShapeEventKind::DuckSize, "duck sizing: " + source + " = " + std::to_string(hint) + " shares " + s->name, s, {});
      Expr e = simplify(s);
      return e->is_integer() ? SymInt(e->value) : SymInt(e, hint);
    }
  }
  ValueRange r{hint == 1 ? 1 : 2, kIntOo};
  if (c.min) r.lo = std::max(r.lo, *c.min);
  if (c.max) r.hi = std::min(r.hi, *c.max);
  core::SourceLocation w = where();
  if (!r.contains(hint))
    throw ConstraintViolation("Constraints violated (" + source + ")! " + source + " = " + std::to_string(hint) +
                              " is outside the range " + to_string(r) + " it was marked with" + at(w) + ".");
  Expr s = new_symbol("s");
  symbol_index_[s] = symbols_.size();
  symbols_.push_back({s, {source}, hint, kind, r, c.strict, false, w});
  source_symbol_[source] = s;
  if (duck) duck_.emplace(hint, s);
  ranges_.set_symbol_range(s, r);
  emit(ShapeEventKind::CreateSymbol,
       "create_symbol " + s->name + " = " + std::to_string(hint) + " for " + source + " " +
           to_string(r).substr(2) + at(w),
       s, w);
  return SymInt(s, hint);
}

SymInt ShapeEnv::create_int_symbol(const std::string& source, int64_t hint) {
  ValueRange r = hint >= 0 ? ValueRange{0, kIntOo} : ValueRange::full();
  core::SourceLocation w = where();
  Expr s = new_symbol("s");
  symbol_index_[s] = symbols_.size();
  symbols_.push_back({s, {source}, hint, DimKind::Dynamic, r, false, false, w});
  source_symbol_[source] = s;
  ranges_.set_symbol_range(s, r);
  emit(ShapeEventKind::CreateSymbol,
       "create_symbol " + s->name + " = " + std::to_string(hint) + " for " + source + " " + to_string(r).substr(2) + at(w),
       s, w);
  return SymInt(s, hint);
}

SymInt ShapeEnv::create_unbacked_symint(const std::string& source, bool size_like) {
  core::SourceLocation w = where();
  Expr s = new_symbol("u");
  ValueRange r = size_like ? ValueRange{0, kIntOo} : ValueRange::full();
  symbol_index_[s] = symbols_.size();
  std::vector<std::string> sources;
  if (!source.empty()) sources.push_back(source);
  symbols_.push_back({s, sources, std::nullopt, DimKind::Unbacked, r, false, size_like, w});
  if (!source.empty()) source_symbol_[source] = s;
  ranges_.set_symbol_range(s, r);
  emit(ShapeEventKind::CreateUnbacked, "create_unbacked_symint " + s->name + " " + to_string(r).substr(2) + at(w), s, w);
  return SymInt(s, kUnbackedHint);
}

void ShapeEnv::constrain_range(const SymInt& s, ValueRange r) {
  if (!s.is_symbolic()) {
    if (!r.contains(s.hint()))
      throw RuntimeError("protean::ShapeEnv: value " + std::to_string(s.hint()) + " is outside " + to_string(r));
    return;
  }
  Expr e = simplify(s.expr());
  if (!e->is_symbol()) throw ValueError("protean::ShapeEnv::constrain_range needs a plain symbol, got " + print(e));
  update_range(e, ranges_.symbol_range(e).intersect(r), "constrain_range", where());
}

// ---- queries ----------------------------------------------------------------------------------------
Expr ShapeEnv::simplify(Expr e) const { return sym::simplify(substitute(e, replacements_), &ranges_); }
ValueRange ShapeEnv::range_of(Expr e) const { return ranges_.range(simplify(e)); }

std::optional<int64_t> ShapeEnv::hint_of(Expr e) const {
  try {
    return evaluate(e, [&](Expr s) -> int64_t {
      const SymbolInfo* i = symbol_info(s);
      if (!i || !i->hint) throw std::out_of_range("unbacked");
      return *i->hint;
    });
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<bool> ShapeEnv::statically_known(Expr boolean) const {
  Expr s = simplify(boolean);
  if (s->kind == Kind::True) return true;
  if (s->kind == Kind::False) return false;
  return std::nullopt;
}

// ---- guards -----------------------------------------------------------------------------------------
bool ShapeEnv::evaluate_guard(const SymBool& b) {
  if (!b.is_symbolic()) return b.hint();
  return evaluate_expr(b.expr(), "guard");
}

bool ShapeEnv::evaluate_expr(Expr e, const char* what) {
  Expr s = simplify(e);
  if (s->kind == Kind::True || s->kind == Kind::False) {
    emit(ShapeEventKind::StaticallyKnown, "eval " + print(e) + " == " + print(s) + " [statically known]", s, {});
    return s->kind == Kind::True;
  }
  // Runtime-asserted facts decide guards over unbacked symbols like axioms.
  if (!assert_facts_.empty()) {
    std::optional<bool> known;
    if (assert_facts_.count(s)) known = true;
    else if (assert_facts_.count(simplify(not_(s)))) known = false;
    if (known) {
      emit(ShapeEventKind::StaticallyKnown,
           "eval " + print(e) + " == " + (*known ? "True" : "False") + " [known from a runtime assert]", s, {});
      return *known;
    }
  }
  std::optional<int64_t> h = hint_of(s);
  if (!h) {
    core::SourceLocation w = where();
    throw DataDependentError("Could not guard on data-dependent expression " + print(s) + at(w) +
                             ": it involves unbacked symbols whose values are only known at run time. "
                             "Use check() to assert the fact, guard_size_oblivious() for size checks, "
                             "or move the decision out of the compiled function.",
                             w);
  }
  bool value = *h != 0;
  Expr fact = value ? s : simplify(not_(s));
  // A fact guarded before is known (like PyTorch's guard axioms): evaluating `Ne(s0//4, 0)` again for
  // every op of a model adds nothing and records no new guard or location.
  if (guard_facts_.count(fact)) {
    emit(ShapeEventKind::StaticallyKnown, "eval " + print(e) + " == " + (value ? "True" : "False") + " [known from an earlier guard]",
         fact, {});
    return value;
  }
  add_guard(fact, std::string(what) + " " + print(fact), where());
  return value;
}

int64_t ShapeEnv::guard_int(const SymInt& v) {
  if (!v.is_symbolic()) return v.hint();
  Expr e = simplify(v.expr());
  if (e->is_integer()) return e->value;
  std::optional<int64_t> h = hint_of(e);
  if (!h) {
    core::SourceLocation w = where();
    throw DataDependentError("Could not convert data-dependent expression " + print(e) + " to an int" + at(w) +
                             ". Keep it a SymInt, or use check() to constrain it.",
                             w);
  }
  Expr fact = simplify(eq(e, integer(*h)));
  if (fact->kind != Kind::True) add_guard(fact, "int conversion of " + print(e), where());
  return *h;
}

bool ShapeEnv::guard_size_oblivious(const SymBool& b) {
  if (!b.is_symbolic()) return b.hint();
  Expr s = simplify(b.expr());
  if (s->kind == Kind::True || s->kind == Kind::False) return s->kind == Kind::True;
  RangeAnalyzer oblivious = ranges_;
  for (const SymbolInfo& i : symbols_)
    if (i.size_like) {
      ValueRange r = ranges_.symbol_range(i.symbol);
      oblivious.set_symbol_range(i.symbol, {std::max<int64_t>(r.lo, 2), std::max<int64_t>(r.hi, 2)});
    }
  Expr so = sym::simplify(s, &oblivious);
  if (so->kind == Kind::True || so->kind == Kind::False) {
    emit(ShapeEventKind::StaticallyKnown, "eval size_oblivious(" + print(s) + ") == " + print(so) + " [statically known]", s, {});
    return so->kind == Kind::True;
  }
  return evaluate_expr(s, "size_oblivious guard");
}

void ShapeEnv::check(const SymBool& cond, std::string_view message) {
  std::string msg = message.empty() ? "check failed" : std::string(message);
  if (!cond.is_symbolic()) {
    if (!cond.hint()) throw RuntimeError("protean::check: " + msg + at(where()));
    return;
  }
  Expr s = simplify(cond.expr());
  if (s->kind == Kind::True) return;
  if (s->kind == Kind::False)
    throw RuntimeError("protean::check: " + msg + ": " + print(cond.expr()) + " is always false" + at(where()));
  if (std::optional<int64_t> h = hint_of(s)) {
    if (*h == 0) throw RuntimeError("protean::check: " + msg + ": " + print(s) + " is false for the traced sizes" + at(where()));
    add_guard(s, "check " + print(s), where());
    return;
  }
  if (assert_facts_.count(s)) return;  // asserted before
  core::SourceLocation w = where();
  runtime_asserts_.push_back({s, msg, w});
  assert_facts_.insert(s);
  if (s->kind == Kind::And)
    for (Expr a : s->args) assert_facts_.insert(simplify(a));
  emit(ShapeEventKind::RuntimeAssert, "runtime_assert " + print(s) + " [guard added]" + at(w), s, w);
  apply_fact(s, "runtime_assert " + print(s), w);
}

void ShapeEnv::check_is_size(const SymInt& s, std::string_view message) {
  std::string msg = message.empty() ? "a size must be >= 0" : std::string(message);
  if (!s.is_symbolic()) {
    check(SymBool(s.hint() >= 0), msg);
    return;
  }
  check(SymBool(simplify(le(integer(0), s.expr())), true), msg);
  Expr e = simplify(s.expr());
  if (e->is_symbol())
    if (SymbolInfo* i = info(e); i && !i->hint) i->size_like = true;
}

void ShapeEnv::add_guard(Expr fact, const std::string& reason, const core::SourceLocation& w) {
  guards_.push_back({fact, w});
  guard_facts_.insert(fact);
  emit(ShapeEventKind::GuardAdded, "eval " + print(fact) + " [guard added]" + at(w), fact, w);
  apply_fact(fact, reason, w);
}

void ShapeEnv::apply_fact(Expr fact, const std::string& reason, const core::SourceLocation& w) {
  if (fact->kind == Kind::And) {
    for (Expr a : fact->args) apply_fact(simplify(a), reason, w);
    return;
  }
  if (fact->kind == Kind::Eq) {
    try_replacement(fact, reason, w);
    return;
  }
  if (fact->kind != Kind::Lt && fact->kind != Kind::Le && fact->kind != Kind::Ne) return;
  std::optional<LinearFact> f = linear_fact(fact);
  if (!f) return;
  // Single symbol with coefficient 1 (normalization divides out common factors).
  if (!f->p->is_symbol()) return;
  ValueRange r = ranges_.symbol_range(f->p);
  if (f->excluded) {
    if (*f->excluded == r.lo) r.lo = r.lo + 1;
    else if (*f->excluded == r.hi) r.hi = r.hi - 1;
    else return;
  } else {
    r = r.intersect(f->in);
  }
  update_range(f->p, r, reason, w);
}

void ShapeEnv::update_range(Expr s, ValueRange r, const std::string& reason, const core::SourceLocation& w) {
  ValueRange old = ranges_.symbol_range(s);
  if (r == old) return;
  SymbolInfo* i = info(s);
  if (r.empty())
    throw std::logic_error("protean::ShapeEnv: " + reason + " leaves no value for " + s->name +
                           (i && !i->sources.empty() ? " (" + i->sources.front() + ")" : std::string()) + " (was " +
                           to_string(old) + ")");
  if (i && i->strict && !r.contains(i->declared)) violation(*i, "the guard " + reason + " restricts it to " + to_string(r), w);
  ranges_.set_symbol_range(s, r);
  emit(ShapeEventKind::RangeUpdate, "_update_var_to_range " + s->name + " = " + to_string(r) + " (" + reason + ")", s, w);
  if (r.is_singleton() && !replacements_.count(s)) set_replacement(s, integer(r.lo), reason, w);
}

void ShapeEnv::try_replacement(Expr fact, const std::string& reason, const core::SourceLocation& w) {
  LinearTerms t = as_terms(sub(fact->args[0], fact->args[1]));  // t == 0
  // Pick the symbol to eliminate: coefficient +-1, unbacked first, then the newest.
  Expr best = nullptr;
  int64_t best_coef = 0;
  auto rank = [&](Expr s) {
    const SymbolInfo* i = symbol_info(s);
    size_t idx = symbol_index_.count(s) ? symbol_index_.at(s) : 0;
    return std::pair<int, size_t>{i && i->kind == DimKind::Unbacked ? 1 : 0, idx};
  };
  // A symbol that also occurs inside another term (`Eq(s0, 4*CeilDiv(s0, 4))` from chunk's pieces,
  // s1 == (s0*s1)//3 from a reshape of [s0, s1] to [3, -1])
  // cannot be solved for: replacing it by an expression over itself would loop. Such a fact stays a
  // plain guard.
  auto occurs_elsewhere = [&](Expr s) {
    for (auto& [m, c] : t.terms)
      if (m != s)
        for (Expr f : free_symbols(m))
          if (f == s) return true;
    return false;
  };
  for (auto& [m, c] : t.terms) {
    if (!m->is_symbol() || (c != 1 && c != -1) || occurs_elsewhere(m)) continue;
    if (!best || rank(m) > rank(best)) best = m, best_coef = c;
  }
  if (best) {
    Expr rest = sub(add(fact->args[0], neg(fact->args[1])), mul(integer(best_coef), best));
    set_replacement(best, simplify(mul(integer(-best_coef), rest)), reason, w);
    return;
  }
  if (t.terms.size() == 1 && t.terms[0].first->is_symbol() && t.constant % t.terms[0].second == 0)
    set_replacement(t.terms[0].first, integer(-t.constant / t.terms[0].second), reason, w);
}

void ShapeEnv::set_replacement(Expr s, Expr value, const std::string& reason, const core::SourceLocation& w) {
  SymbolInfo* i = info(s);
  if (i && i->strict)
    violation(*i, value->is_integer() ? "it was specialized to " + print(value) + " by " + reason
                                      : "it was replaced by " + print(value) + " (" + reason + ")", w);
  ValueRange old = ranges_.symbol_range(s);
  replacements_[s] = value;
  std::unordered_map<Expr, Expr> one{{s, value}};
  for (auto& [k, v] : replacements_)
    if (k != s) v = sym::simplify(substitute(v, one), &ranges_);
  emit(ShapeEventKind::Replacement, "set_replacement " + s->name + " = " + print(value) + " (" + reason + ")", s, w);
  if (value->is_integer()) {
    ranges_.set_symbol_range(s, ValueRange::point(value->value));
    std::vector<std::string> sources = i ? i->sources : std::vector<std::string>{};
    specializations_.push_back({s, sources, value->value, reason, w});
    emit(ShapeEventKind::Specialization,
         "specialize " + s->name + " = " + print(value) + (sources.empty() ? "" : " for " + join(sources)) + " (" +
             reason + ")" + at(w),
         s, w);
    return;
  }
  // The eliminated symbol's range constrains the symbols of its replacement.
  ranges_.set_symbol_range(s, old.intersect(ranges_.range(value)));
  if (old.lo != kNegIntOo) apply_fact(simplify(le(integer(old.lo), value)), reason, w);
  if (old.hi != kIntOo) apply_fact(simplify(le(value, integer(old.hi))), reason, w);
}

// ---- guard production -----------------------------------------------------------------------------------
GuardSet ShapeEnv::produce_guards() const {
  GuardSet gs;
  gs.statics = statics_;
  std::vector<Expr> free;
  for (const SymbolInfo& i : symbols_) {
    if (!i.hint) continue;  // unbacked: checked by runtime asserts in the graph
    auto it = replacements_.find(i.symbol);
    if (it != replacements_.end()) {
      gs.replaced.push_back({i.symbol, i.sources, it->second});
    } else {
      gs.symbols.push_back({i.symbol, i.sources});
      free.push_back(i.symbol);
    }
  }
  for (Expr s : free) {
    ValueRange r = ranges_.symbol_range(s);
    if (r.lo != kNegIntOo) gs.checks.push_back({le(integer(r.lo), s), print(le(integer(r.lo), s))});
    if (r.hi != kIntOo) gs.checks.push_back({le(s, integer(r.hi)), print(le(s, integer(r.hi)))});
  }
  // Recorded guards under the final replacements and ranges; drop the ones now known true
  // (they are implied by the range checks above) and the ones implied by another kept guard.
  std::vector<Expr> kept;
  std::unordered_set<Expr> seen;
  for (const Guard& g : guards_) {
    Expr s = simplify(g.expr);
    if (s->kind == Kind::True || !seen.insert(s).second) continue;
    bool unbacked = false;
    for (Expr sym : free_symbols(s)) {
      const SymbolInfo* i = symbol_info(sym);
      unbacked |= !i || !i->hint;
    }
    if (!unbacked) kept.push_back(s);
  }
  std::vector<std::optional<LinearFact>> facts;
  for (Expr e : kept) facts.push_back(linear_fact(e));
  for (size_t i = 0; i < kept.size(); ++i) {
    bool implied = false;
    for (size_t j = 0; j < kept.size() && !implied; ++j) {
      if (i == j || !facts[i] || !facts[j]) continue;
      // Of two equivalent facts keep the first.
      implied = implies(*facts[j], *facts[i]) && (!implies(*facts[i], *facts[j]) || j < i);
    }
    if (!implied) gs.checks.push_back({kept[i], print(kept[i])});
  }
  return gs;
}

}  // namespace protean::sym
