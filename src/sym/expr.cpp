// Interning table and canonicalizing constructors of SymExpr. See expr.h for the semantics.
#include "sym/expr.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <unordered_set>

namespace protean::sym {

const char* kind_name(Kind k) {
  switch (k) {
#define PROTEAN_SYM_KIND_NAME(name, str, is_bool) \
  case Kind::name:                                 \
    return str;
    PROTEAN_SYM_KINDS(PROTEAN_SYM_KIND_NAME)
#undef PROTEAN_SYM_KIND_NAME
  }
  return "?";
}

bool kind_is_bool(Kind k) {
  switch (k) {
#define PROTEAN_SYM_KIND_BOOL(name, str, is_bool) \
  case Kind::name:                                 \
    return is_bool;
    PROTEAN_SYM_KINDS(PROTEAN_SYM_KIND_BOOL)
#undef PROTEAN_SYM_KIND_BOOL
  }
  return false;
}

bool kind_is_relation(Kind k) {
  return k == Kind::Eq || k == Kind::Ne || k == Kind::Lt || k == Kind::Le || k == Kind::Gt ||
         k == Kind::Ge;
}

// ---- checked integer helpers ------------------------------------------------------------------
int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw OverflowError("size arithmetic overflows int64: " + std::to_string(a) + " + " + std::to_string(b));
  return r;
}
int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw OverflowError("size arithmetic overflows int64: " + std::to_string(a) + " * " + std::to_string(b));
  return r;
}
int64_t checked_pow(int64_t base, int64_t exp) {
  if (exp < 0) throw std::domain_error("protean::sym: Pow with a negative exponent");
  int64_t r = 1;
  while (exp > 0) {
    if (exp & 1) r = checked_mul(r, base);
    exp >>= 1;
    if (exp > 0) base = checked_mul(base, base);
  }
  return r;
}
int64_t floordiv_int(int64_t a, int64_t b) {
  if (b == 0) throw std::domain_error("protean::sym: division by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1)
    throw OverflowError("size arithmetic overflows int64: FloorDiv(" + std::to_string(a) + ", -1)");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t mod_int(int64_t a, int64_t b) {
  if (b == 0) throw std::domain_error("protean::sym: modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
int64_t gcd_int(int64_t a, int64_t b) {
  // std::gcd on magnitudes; values near INT64_MIN never reach here in practice.
  return std::gcd(a < 0 ? -a : a, b < 0 ? -b : b);
}

// ---- interning table --------------------------------------------------------------------------
namespace {

struct NodeKey {
  Kind kind;
  int64_t value;
  std::string_view name;
  std::span<const Expr> args;
  size_t hash;
};

size_t mix(size_t h, size_t v) { return h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)); }

size_t hash_key(Kind kind, int64_t value, std::string_view name, std::span<const Expr> args) {
  size_t h = std::hash<int>()(static_cast<int>(kind));
  h = mix(h, std::hash<int64_t>()(value));
  if (!name.empty()) h = mix(h, std::hash<std::string_view>()(name));
  for (Expr a : args) h = mix(h, a->hash);
  return h;
}

struct NodeHash {
  using is_transparent = void;
  size_t operator()(const ExprNode* n) const { return n->hash; }
  size_t operator()(const NodeKey& k) const { return k.hash; }
};

bool same(const ExprNode* n, const NodeKey& k) {
  return n->hash == k.hash && n->kind == k.kind && n->value == k.value && n->name == k.name &&
         std::equal(n->args.begin(), n->args.end(), k.args.begin(), k.args.end());
}

struct NodeEq {
  using is_transparent = void;
  bool operator()(const ExprNode* a, const ExprNode* b) const { return a == b; }
  bool operator()(const NodeKey& k, const ExprNode* n) const { return same(n, k); }
  bool operator()(const ExprNode* n, const NodeKey& k) const { return same(n, k); }
};

struct Shard {
  std::mutex mu;
  std::unordered_set<ExprNode*, NodeHash, NodeEq> nodes;
};
constexpr size_t kShards = 16;
std::array<Shard, kShards>& shards() {
  static auto* s = new std::array<Shard, kShards>();  // never destroyed: nodes outlive statics
  return *s;
}

uint32_t sat_u32(uint64_t v) { return v > 0xffffffffULL ? 0xffffffffU : static_cast<uint32_t>(v); }

Expr make_node(Kind kind, int64_t value, std::string_view name, std::span<const Expr> args) {
  NodeKey key{kind, value, name, args, hash_key(kind, value, name, args)};
  Shard& shard = shards()[key.hash % kShards];
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.nodes.find(key);
  if (it != shard.nodes.end()) return *it;
  auto* n = new ExprNode{kind, value, std::string(name), std::vector<Expr>(args.begin(), args.end()),
                         key.hash, 0, 1};
  uint64_t count = 1;
  for (Expr a : args) count += a->node_count;
  n->node_count = sat_u32(count);
  switch (kind) {
    case Kind::Integer:
    case Kind::True:
    case Kind::False:
      n->degree = 0;
      break;
    case Kind::Symbol:
      n->degree = 1;
      break;
    case Kind::Pow:
      n->degree = args[1]->is_integer() ? sat_u32(uint64_t(args[0]->degree) * uint64_t(std::max<int64_t>(args[1]->value, 0))) : 1;
      break;
    case Kind::Mul: {
      uint64_t d = 0;
      for (Expr a : args) d += a->degree;
      n->degree = sat_u32(d);
      break;
    }
    case Kind::Add: {
      uint32_t d = 0;
      for (Expr a : args) d = std::max(d, a->degree);
      n->degree = d;
      break;
    }
    case Kind::FloorDiv:
    case Kind::CeilDiv:
    case Kind::Mod:
    case Kind::Max:
    case Kind::Min:
      n->degree = 1;
      break;
    case Kind::Eq:
    case Kind::Ne:
    case Kind::Lt:
    case Kind::Le:
    case Kind::Gt:
    case Kind::Ge:
    case Kind::And:
    case Kind::Or:
    case Kind::Not:
      n->degree = 0;
      break;
  }
  shard.nodes.insert(n);
  return n;
}

Expr make(Kind kind, std::span<const Expr> args) { return make_node(kind, 0, {}, args); }
Expr make2(Kind kind, Expr a, Expr b) {
  std::array<Expr, 2> args{a, b};
  return make(kind, args);
}

void require_int(Expr e, const char* what) {
  if (e->is_bool()) throw std::invalid_argument(std::string("protean::sym: ") + what + " needs an integer operand");
}
void require_bool(Expr e, const char* what) {
  if (!e->is_bool()) throw std::invalid_argument(std::string("protean::sym: ") + what + " needs a boolean operand");
}

// Natural order of symbol names: prefix first, then the trailing number numerically (s2 < s10).
int compare_names(const std::string& a, const std::string& b) {
  auto split = [](const std::string& s) {
    size_t i = s.size();
    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9') --i;
    std::string_view prefix(s.data(), i);
    std::string_view digits(s.data() + i, s.size() - i);
    return std::pair{prefix, digits};
  };
  auto [pa, da] = split(a);
  auto [pb, db] = split(b);
  if (pa != pb) return pa < pb ? -1 : 1;
  if (da.size() != db.size()) return da.size() < db.size() ? -1 : 1;
  if (da != db) return da < db ? -1 : 1;
  return 0;
}

}  // namespace

size_t interned_node_count() {
  size_t n = 0;
  for (Shard& s : shards()) {
    std::lock_guard<std::mutex> lock(s.mu);
    n += s.nodes.size();
  }
  return n;
}

int compare(Expr a, Expr b) {
  if (a == b) return 0;
  if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
  switch (a->kind) {
    case Kind::Integer:
      return a->value < b->value ? -1 : (a->value > b->value ? 1 : 0);
    case Kind::Symbol:
      return compare_names(a->name, b->name);
    case Kind::Pow: case Kind::Mul: case Kind::Add: case Kind::FloorDiv: case Kind::CeilDiv:
    case Kind::Mod: case Kind::Max: case Kind::Min: case Kind::True: case Kind::False:
    case Kind::Eq: case Kind::Ne: case Kind::Lt: case Kind::Le: case Kind::Gt: case Kind::Ge:
    case Kind::And: case Kind::Or: case Kind::Not:
      break;  // compared by their arguments below
  }
  size_t n = std::min(a->args.size(), b->args.size());
  for (size_t i = 0; i < n; ++i)
    if (int c = compare(a->args[i], b->args[i])) return c;
  if (a->args.size() != b->args.size()) return a->args.size() < b->args.size() ? -1 : 1;
  return 0;
}

// ---- leaves -------------------------------------------------------------------------------------
Expr integer(int64_t v) { return make_node(Kind::Integer, v, {}, {}); }
Expr symbol(std::string_view name) {
  if (name.empty()) throw std::invalid_argument("protean::sym: empty symbol name");
  return make_node(Kind::Symbol, 0, name, {});
}
Expr true_() {
  static Expr t = make_node(Kind::True, 0, {}, {});
  return t;
}
Expr false_() {
  static Expr f = make_node(Kind::False, 0, {}, {});
  return f;
}
Expr boolean(bool b) { return b ? true_() : false_(); }

// ---- polynomial helpers -------------------------------------------------------------------------
std::pair<int64_t, Expr> split_coefficient(Expr e) {
  if (e->is_integer()) return {e->value, integer(1)};
  if (e->kind == Kind::Mul && e->args[0]->is_integer()) {
    if (e->args.size() == 2) return {e->args[0]->value, e->args[1]};
    return {e->args[0]->value, make(Kind::Mul, std::span<const Expr>(e->args).subspan(1))};
  }
  return {1, e};
}

LinearTerms as_terms(Expr e) {
  LinearTerms t;
  auto take = [&](Expr x) {
    if (x->is_integer()) {
      t.constant = checked_add(t.constant, x->value);
      return;
    }
    auto [c, m] = split_coefficient(x);
    t.terms.emplace_back(m, c);
  };
  if (e->kind == Kind::Add)
    for (Expr a : e->args) take(a);
  else
    take(e);
  return t;
}

namespace {

// Orders monomials inside a sum: highest degree first, then structurally.
bool term_before(Expr a, Expr b) {
  if (a->degree != b->degree) return a->degree > b->degree;
  return compare(a, b) < 0;
}

Expr factor_base(Expr f) {
  return (f->kind == Kind::Pow && f->args[1]->is_integer()) ? f->args[0] : f;
}

// c * m for a coefficient-free monomial m, without re-canonicalizing m.
Expr scale_monomial(int64_t c, Expr m) {
  if (c == 0) return integer(0);
  if (c == 1) return m;
  std::vector<Expr> args{integer(c)};
  if (m->kind == Kind::Mul)
    args.insert(args.end(), m->args.begin(), m->args.end());
  else
    args.push_back(m);
  return make(Kind::Mul, args);
}

Expr build_sum(int64_t constant, std::vector<std::pair<Expr, int64_t>> terms) {
  std::erase_if(terms, [](const auto& t) { return t.second == 0; });
  std::sort(terms.begin(), terms.end(), [](const auto& x, const auto& y) { return term_before(x.first, y.first); });
  if (terms.empty()) return integer(constant);
  if (terms.size() == 1 && constant == 0) return scale_monomial(terms[0].second, terms[0].first);
  std::vector<Expr> args;
  args.reserve(terms.size() + 1);
  for (auto& [m, c] : terms) args.push_back(scale_monomial(c, m));
  if (constant != 0) args.push_back(integer(constant));
  return make(Kind::Add, args);
}

// Factor multiset of a coefficient-free monomial: base -> exponent (opaque factors exponent 1).
void collect_factors(Expr m, std::vector<std::pair<Expr, int64_t>>& out) {
  auto push = [&](Expr f) {
    Expr base = factor_base(f);
    int64_t exp = base == f ? 1 : f->args[1]->value;
    for (auto& [b, e] : out)
      if (b == base) {
        e = checked_add(e, exp);
        return;
      }
    out.emplace_back(base, exp);
  };
  if (m->kind == Kind::Mul)
    for (Expr f : m->args) push(f);
  else if (!m->is_integer())
    push(m);
}

Expr build_product(int64_t coef, std::vector<std::pair<Expr, int64_t>> factors) {
  if (coef == 0) return integer(0);
  std::erase_if(factors, [](const auto& f) { return f.second == 0; });
  std::sort(factors.begin(), factors.end(), [](const auto& x, const auto& y) { return compare(x.first, y.first) < 0; });
  std::vector<Expr> fs;
  fs.reserve(factors.size());
  for (auto& [b, e] : factors) fs.push_back(e == 1 ? b : make2(Kind::Pow, b, integer(e)));
  if (fs.empty()) return integer(coef);
  Expr m = fs.size() == 1 ? fs[0] : make(Kind::Mul, fs);
  return scale_monomial(coef, m);
}

}  // namespace

int64_t content(Expr e) {
  LinearTerms t = as_terms(e);
  int64_t g = t.constant;
  for (auto& [m, c] : t.terms) g = gcd_int(g, c);
  return g < 0 ? -g : g;
}

std::optional<Expr> exact_divide(Expr e, int64_t k) {
  if (k == 0) return std::nullopt;
  LinearTerms t = as_terms(e);
  if (t.constant % k != 0) return std::nullopt;
  for (auto& [m, c] : t.terms) {
    if (c % k != 0) return std::nullopt;
    c /= k;
  }
  return build_sum(t.constant / k, std::move(t.terms));
}

std::optional<Expr> exact_divide(Expr e, Expr m) {
  if (m->is_integer()) return exact_divide(e, m->value);
  if (m->kind == Kind::Add) {
    if (e == m) return integer(1);
    return std::nullopt;
  }
  auto [mc, mm] = split_coefficient(m);
  std::vector<std::pair<Expr, int64_t>> mf;
  collect_factors(mm, mf);
  LinearTerms t = as_terms(e);
  if (t.constant != 0) return std::nullopt;
  std::vector<Expr> out;
  for (auto& [tm, tc] : t.terms) {
    if (tc % mc != 0) return std::nullopt;
    std::vector<std::pair<Expr, int64_t>> tf;
    collect_factors(tm, tf);
    for (auto& [b, ex] : mf) {
      auto it = std::find_if(tf.begin(), tf.end(), [&](const auto& p) { return p.first == b; });
      if (it == tf.end() || it->second < ex) return std::nullopt;
      it->second -= ex;
    }
    out.push_back(build_product(tc / mc, std::move(tf)));
  }
  return add(out);
}

// ---- arithmetic constructors --------------------------------------------------------------------
Expr add(std::span<const Expr> xs) {
  int64_t constant = 0;
  std::vector<std::pair<Expr, int64_t>> terms;
  auto take = [&](Expr x) {
    if (x->is_integer()) {
      constant = checked_add(constant, x->value);
      return;
    }
    auto [c, m] = split_coefficient(x);
    for (auto& [tm, tc] : terms)
      if (tm == m) {
        tc = checked_add(tc, c);
        return;
      }
    terms.emplace_back(m, c);
  };
  for (Expr x : xs) {
    require_int(x, "Add");
    if (x->kind == Kind::Add)
      for (Expr a : x->args) take(a);
    else
      take(x);
  }
  return build_sum(constant, std::move(terms));
}
Expr add(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return add(xs);
}
Expr neg(Expr a) { return mul(integer(-1), a); }
Expr sub(Expr a, Expr b) { return add(a, neg(b)); }

Expr mul(std::span<const Expr> xs) {
  int64_t coef = 1;
  std::vector<std::pair<Expr, int64_t>> factors;
  std::vector<Expr> sums;
  auto push_factor = [&](Expr base, int64_t exp) {
    for (auto& [b, e] : factors)
      if (b == base) {
        e = checked_add(e, exp);
        return;
      }
    factors.emplace_back(base, exp);
  };
  std::function<void(Expr)> take = [&](Expr x) {
    require_int(x, "Mul");
    switch (x->kind) {
      case Kind::Integer:
        coef = checked_mul(coef, x->value);
        return;
      case Kind::Mul:
        for (Expr f : x->args) take(f);
        return;
      case Kind::Add:
        sums.push_back(x);
        return;
      case Kind::Symbol: case Kind::Pow: case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod:
      case Kind::Max: case Kind::Min: case Kind::True: case Kind::False: case Kind::Eq:
      case Kind::Ne: case Kind::Lt: case Kind::Le: case Kind::Gt: case Kind::Ge: case Kind::And:
      case Kind::Or: case Kind::Not:
        break;  // a factor of its own
    }
    Expr base = factor_base(x);
    push_factor(base, base == x ? 1 : x->args[1]->value);
  };
  for (Expr x : xs) take(x);
  if (coef == 0) return integer(0);
  if (!sums.empty()) {
    size_t total = 1;
    for (Expr s : sums) total *= s->args.size();
    if (total <= kMaxExpandTerms) {
      std::vector<Expr> terms{build_product(coef, std::move(factors))};
      for (Expr s : sums) {
        std::vector<Expr> next;
        next.reserve(terms.size() * s->args.size());
        for (Expr t : terms)
          for (Expr u : s->args) next.push_back(mul(t, u));  // neither operand is a sum
        terms = std::move(next);
      }
      return add(terms);
    }
    // Too large to expand: sums stay factors (merged into powers like any other base).
    for (Expr s : sums) push_factor(s, 1);
  }
  return build_product(coef, std::move(factors));
}
Expr mul(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return mul(xs);
}

Expr pow(Expr base, Expr exponent) {
  require_int(base, "Pow");
  require_int(exponent, "Pow");
  if (exponent->is_integer()) {
    int64_t k = exponent->value;
    if (k < 0) throw std::domain_error("protean::sym: Pow with a negative exponent");
    if (base->is_integer()) return integer(checked_pow(base->value, k));
    if (k == 0) return integer(1);
    if (k == 1) return base;
    if (base->kind == Kind::Mul || base->kind == Kind::Add || base->kind == Kind::Pow) {
      if (k <= 64) {
        std::vector<Expr> copies(static_cast<size_t>(k), base);
        return mul(copies);
      }
    }
    if (base->kind == Kind::Mul || base->kind == Kind::Pow) {
      // Large exponent of a product: scale every factor's exponent.
      auto [c, m] = split_coefficient(base);
      std::vector<std::pair<Expr, int64_t>> fs;
      collect_factors(m, fs);
      for (auto& f : fs) f.second = checked_mul(f.second, k);
      return build_product(checked_pow(c, k), std::move(fs));
    }
    return make2(Kind::Pow, base, exponent);
  }
  if (base->is_integer(1)) return integer(1);
  return make2(Kind::Pow, base, exponent);
}

Expr floordiv(Expr a, Expr b) {
  require_int(a, "FloorDiv");
  require_int(b, "FloorDiv");
  if (b->is_integer(0)) throw std::domain_error("protean::sym: FloorDiv by zero");
  if (a->is_integer() && b->is_integer()) return integer(floordiv_int(a->value, b->value));
  if (b->is_integer(1)) return a;
  if (b->is_integer(-1)) return neg(a);
  if (a->is_integer(0)) return a;
  return make2(Kind::FloorDiv, a, b);
}

Expr ceildiv(Expr a, Expr b) {
  require_int(a, "CeilDiv");
  require_int(b, "CeilDiv");
  if (b->is_integer(0)) throw std::domain_error("protean::sym: CeilDiv by zero");
  if (a->is_integer() && b->is_integer()) {
    if (a->value == std::numeric_limits<int64_t>::min()) throw OverflowError("size arithmetic overflows int64: CeilDiv(" + std::to_string(a->value) + ", " + std::to_string(b->value) + ")");
    return integer(-floordiv_int(-a->value, b->value));
  }
  if (b->is_integer(1)) return a;
  if (b->is_integer(-1)) return neg(a);
  if (a->is_integer(0)) return a;
  return make2(Kind::CeilDiv, a, b);
}

Expr mod(Expr a, Expr b) {
  require_int(a, "Mod");
  require_int(b, "Mod");
  if (b->is_integer(0)) throw std::domain_error("protean::sym: Mod by zero");
  if (a->is_integer() && b->is_integer()) return integer(mod_int(a->value, b->value));
  if (b->is_integer(1) || b->is_integer(-1)) return integer(0);
  if (a->is_integer(0) || a == b) return integer(0);
  return make2(Kind::Mod, a, b);
}

namespace {
Expr extremum(Kind kind, std::span<const Expr> xs) {
  if (xs.empty()) throw std::invalid_argument("protean::sym: Max/Min of nothing");
  bool is_max = kind == Kind::Max;
  std::optional<int64_t> constant;
  std::vector<Expr> args;
  std::function<void(Expr)> take = [&](Expr x) {
    require_int(x, kind_name(kind));
    if (x->kind == kind) {
      for (Expr a : x->args) take(a);
    } else if (x->is_integer()) {
      constant = !constant ? x->value : (is_max ? std::max(*constant, x->value) : std::min(*constant, x->value));
    } else if (std::find(args.begin(), args.end(), x) == args.end()) {
      args.push_back(x);
    }
  };
  for (Expr x : xs) take(x);
  if (constant) args.push_back(integer(*constant));
  if (args.size() == 1) return args[0];
  std::sort(args.begin(), args.end(), [](Expr x, Expr y) { return compare(x, y) < 0; });
  return make(kind, args);
}
}  // namespace

Expr maximum(std::span<const Expr> xs) { return extremum(Kind::Max, xs); }
Expr minimum(std::span<const Expr> xs) { return extremum(Kind::Min, xs); }
Expr maximum(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return maximum(xs);
}
Expr minimum(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return minimum(xs);
}

// ---- relations and logic ------------------------------------------------------------------------
Expr relation(Kind k, Expr a, Expr b) {
  if (!kind_is_relation(k)) throw std::invalid_argument("protean::sym: relation() needs Eq..Ge");
  require_int(a, kind_name(k));
  require_int(b, kind_name(k));
  if (a->is_integer() && b->is_integer()) {
    int64_t x = a->value, y = b->value;
    switch (k) {
      case Kind::Eq: return boolean(x == y);
      case Kind::Ne: return boolean(x != y);
      case Kind::Lt: return boolean(x < y);
      case Kind::Le: return boolean(x <= y);
      case Kind::Gt: return boolean(x > y);
      case Kind::Ge: return boolean(x >= y);
      case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
      case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
      case Kind::True: case Kind::False: case Kind::And: case Kind::Or: case Kind::Not:
        break;  // not a relation: refused above
    }
  }
  if (a == b) return boolean(k == Kind::Eq || k == Kind::Le || k == Kind::Ge);
  return make2(k, a, b);
}
Expr eq(Expr a, Expr b) { return relation(Kind::Eq, a, b); }
Expr ne(Expr a, Expr b) { return relation(Kind::Ne, a, b); }
Expr lt(Expr a, Expr b) { return relation(Kind::Lt, a, b); }
Expr le(Expr a, Expr b) { return relation(Kind::Le, a, b); }
Expr gt(Expr a, Expr b) { return relation(Kind::Gt, a, b); }
Expr ge(Expr a, Expr b) { return relation(Kind::Ge, a, b); }

Expr not_(Expr a) {
  require_bool(a, "Not");
  switch (a->kind) {
    case Kind::True: return false_();
    case Kind::False: return true_();
    case Kind::Not: return a->args[0];
    case Kind::Eq: return make2(Kind::Ne, a->args[0], a->args[1]);
    case Kind::Ne: return make2(Kind::Eq, a->args[0], a->args[1]);
    case Kind::Lt: return make2(Kind::Ge, a->args[0], a->args[1]);
    case Kind::Le: return make2(Kind::Gt, a->args[0], a->args[1]);
    case Kind::Gt: return make2(Kind::Le, a->args[0], a->args[1]);
    case Kind::Ge: return make2(Kind::Lt, a->args[0], a->args[1]);
    case Kind::Integer: case Kind::Symbol: case Kind::Pow: case Kind::Mul: case Kind::Add:
    case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
    case Kind::And: case Kind::Or:
      break;  // And, Or and non-boolean kinds: wrapped in a Not below
  }
  std::array<Expr, 1> args{a};
  return make(Kind::Not, args);
}

namespace {
Expr junction(Kind kind, std::span<const Expr> xs) {
  bool is_and = kind == Kind::And;
  Expr absorbing = is_and ? false_() : true_();
  Expr identity = is_and ? true_() : false_();
  std::vector<Expr> args;
  std::function<bool(Expr)> take = [&](Expr x) {  // false: result is `absorbing`
    require_bool(x, kind_name(kind));
    if (x == absorbing) return false;
    if (x == identity) return true;
    if (x->kind == kind) {
      for (Expr a : x->args)
        if (!take(a)) return false;
      return true;
    }
    if (std::find(args.begin(), args.end(), x) == args.end()) args.push_back(x);
    return true;
  };
  for (Expr x : xs)
    if (!take(x)) return absorbing;
  for (Expr x : args)  // x together with its complement
    if (std::find(args.begin(), args.end(), not_(x)) != args.end()) return absorbing;
  if (args.empty()) return identity;
  if (args.size() == 1) return args[0];
  std::sort(args.begin(), args.end(), [](Expr x, Expr y) { return compare(x, y) < 0; });
  return make(kind, args);
}
}  // namespace

Expr and_(std::span<const Expr> xs) { return junction(Kind::And, xs); }
Expr or_(std::span<const Expr> xs) { return junction(Kind::Or, xs); }
Expr and_(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return and_(xs);
}
Expr or_(Expr a, Expr b) {
  std::array<Expr, 2> xs{a, b};
  return or_(xs);
}

Expr rebuild(Expr like, std::span<const Expr> a) {
  switch (like->kind) {
    case Kind::Integer:
    case Kind::Symbol:
    case Kind::True:
    case Kind::False:
      return like;
    case Kind::Add: return add(a);
    case Kind::Mul: return mul(a);
    case Kind::Pow: return pow(a[0], a[1]);
    case Kind::FloorDiv: return floordiv(a[0], a[1]);
    case Kind::CeilDiv: return ceildiv(a[0], a[1]);
    case Kind::Mod: return mod(a[0], a[1]);
    case Kind::Max: return maximum(a);
    case Kind::Min: return minimum(a);
    case Kind::Eq:
    case Kind::Ne:
    case Kind::Lt:
    case Kind::Le:
    case Kind::Gt:
    case Kind::Ge:
      return relation(like->kind, a[0], a[1]);
    case Kind::And: return and_(a);
    case Kind::Or: return or_(a);
    case Kind::Not: return not_(a[0]);
  }
  return like;
}

// ---- traversal ----------------------------------------------------------------------------------
std::vector<Expr> free_symbols(Expr e) {
  std::vector<Expr> out;
  std::unordered_set<Expr> seen;
  std::vector<Expr> stack{e};
  while (!stack.empty()) {
    Expr x = stack.back();
    stack.pop_back();
    if (!seen.insert(x).second) continue;
    if (x->is_symbol()) out.push_back(x);
    for (Expr a : x->args) stack.push_back(a);
  }
  std::sort(out.begin(), out.end(), [](Expr a, Expr b) { return compare(a, b) < 0; });
  return out;
}

bool has_symbol(Expr e, Expr sym) {
  if (e == sym) return true;
  for (Expr a : e->args)
    if (has_symbol(a, sym)) return true;
  return false;
}

namespace {
Expr substitute_rec(Expr e, const std::unordered_map<Expr, Expr>& mapping, std::unordered_map<Expr, Expr>& memo) {
  if (e->is_symbol()) {
    auto it = mapping.find(e);
    return it == mapping.end() ? e : it->second;
  }
  if (e->args.empty()) return e;
  if (auto it = memo.find(e); it != memo.end()) return it->second;
  std::vector<Expr> args;
  args.reserve(e->args.size());
  bool changed = false;
  for (Expr a : e->args) {
    args.push_back(substitute_rec(a, mapping, memo));
    changed |= args.back() != a;
  }
  Expr r = changed ? rebuild(e, args) : e;
  memo.emplace(e, r);
  return r;
}
}  // namespace

Expr substitute(Expr e, const std::unordered_map<Expr, Expr>& mapping) {
  if (mapping.empty()) return e;
  std::unordered_map<Expr, Expr> memo;
  return substitute_rec(e, mapping, memo);
}

int64_t evaluate(Expr e, const std::function<int64_t(Expr)>& value) {
  auto ev = [&](Expr x) { return evaluate(x, value); };
  switch (e->kind) {
    case Kind::Integer: return e->value;
    case Kind::Symbol: return value(e);
    case Kind::True: return 1;
    case Kind::False: return 0;
    case Kind::Add: {
      int64_t r = 0;
      for (Expr a : e->args) r = checked_add(r, ev(a));
      return r;
    }
    case Kind::Mul: {
      int64_t r = 1;
      for (Expr a : e->args) r = checked_mul(r, ev(a));
      return r;
    }
    case Kind::Pow: return checked_pow(ev(e->args[0]), ev(e->args[1]));
    case Kind::FloorDiv: return floordiv_int(ev(e->args[0]), ev(e->args[1]));
    case Kind::CeilDiv: {
      int64_t a = ev(e->args[0]), b = ev(e->args[1]);
      return -floordiv_int(-a, b);
    }
    case Kind::Mod: return mod_int(ev(e->args[0]), ev(e->args[1]));
    case Kind::Max: {
      int64_t r = ev(e->args[0]);
      for (size_t i = 1; i < e->args.size(); ++i) r = std::max(r, ev(e->args[i]));
      return r;
    }
    case Kind::Min: {
      int64_t r = ev(e->args[0]);
      for (size_t i = 1; i < e->args.size(); ++i) r = std::min(r, ev(e->args[i]));
      return r;
    }
    case Kind::Eq: return ev(e->args[0]) == ev(e->args[1]);
    case Kind::Ne: return ev(e->args[0]) != ev(e->args[1]);
    case Kind::Lt: return ev(e->args[0]) < ev(e->args[1]);
    case Kind::Le: return ev(e->args[0]) <= ev(e->args[1]);
    case Kind::Gt: return ev(e->args[0]) > ev(e->args[1]);
    case Kind::Ge: return ev(e->args[0]) >= ev(e->args[1]);
    case Kind::And: {
      bool r = true;
      for (Expr a : e->args) r = ev(a) != 0 && r;
      return r;
    }
    case Kind::Or: {
      bool r = false;
      for (Expr a : e->args) r = ev(a) != 0 || r;
      return r;
    }
    case Kind::Not: return ev(e->args[0]) == 0;
  }
  return 0;
}

int64_t evaluate(Expr e, const std::unordered_map<Expr, int64_t>& values) {
  return evaluate(e, [&](Expr s) -> int64_t {
    auto it = values.find(s);
    if (it == values.end()) throw std::out_of_range("protean::sym: no value for symbol " + s->name);
    return it->second;
  });
}

}  // namespace protean::sym
