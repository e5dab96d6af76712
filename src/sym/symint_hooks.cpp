// The symbolic paths of SymInt/SymBool (include/protean/symint.h): build expressions in the current
// ShapeEnv and route guards to it.
#include <fmt/format.h>

#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "protean/error.h"
#include "protean/symint.h"
#include "sym/expr.h"
#include "sym/printer.h"
#include "sym/shape_env.h"

namespace protean::detail {

namespace {

sym::ShapeEnv& env_for(const char* what, const sym::ExprNode* e) {
  sym::ShapeEnv* env = sym::current_shape_env();
  if (!env)
    throw std::logic_error(std::string("protean: ") + what + " on the symbolic value " + sym::print(e) +
                           " outside capture (no current ShapeEnv on this thread). Symbolic SymInts only "
                           "exist while protean::compile traces a function: use them inside that function, "
                           "or read .hint() for the traced value.");
  return *env;
}

/// The symbols of `e` with the sources they stand for: "s0 = x.size()[0], s1 = y.size()[1]".
std::string symbol_sources(const sym::ShapeEnv& env, sym::Expr e) {
  std::string out;
  for (sym::Expr s : sym::free_symbols(e)) {
    const sym::SymbolInfo* i = env.symbol_info(s);
    out += fmt::format("{}{}{}", out.empty() ? "" : ", ", s->name,
                       i && !i->sources.empty() ? " = " + i->sources.front() : std::string());
  }
  return out;
}

/// Runs `f`, turning the sym engine's std::domain_error (a division or modulo by zero, a negative
/// exponent) into a protean::ValueError that names the operation and the inputs its symbols come
/// from. Other std::logic_errors pass: ir/verifier.cpp reads them as "undecidable here".
template <class F>
auto user_errors(const sym::ShapeEnv& env, const char* what, sym::Expr involved, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::domain_error& e) {
    const std::string srcs = symbol_sources(env, involved);
    throw ValueError(fmt::format("{} on {}: {}{}", what, sym::print(involved), e.what(),
                                 srcs.empty() ? "" : " (symbols: " + srcs + ")"));
  }
}

sym::Expr as_expr(const SymInt& s) { return s.is_symbolic() ? s.expr() : sym::integer(s.hint()); }
sym::Expr as_expr(const SymBool& b) { return b.is_symbolic() ? b.expr() : sym::boolean(b.hint()); }
const sym::ExprNode* first_symbolic(const SymInt& a, const SymInt& b) { return a.is_symbolic() ? a.expr() : b.expr(); }

// Hint arithmetic on traced values. A zero divisor (only possible with placeholder hints of
// unbacked symbols) gives 0, and INT64_MIN / -1 wraps, instead of trapping.
int64_t hint_op(SymOp op, int64_t x, int64_t y) {
  const bool no_quotient = y == 0 || (y == -1 && x == INT64_MIN);
  switch (op) {
    case SymOp::Add: return static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y));
    case SymOp::Sub: return static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y));
    case SymOp::Mul: return static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y));
    case SymOp::FloorDiv: return no_quotient ? (y == 0 ? 0 : x) : floordiv_i64(x, y);
    case SymOp::Mod: return no_quotient ? 0 : floormod_i64(x, y);
    case SymOp::CeilDiv: return no_quotient ? (y == 0 ? 0 : x) : checked_ceildiv(x, y);
    case SymOp::Max: return x > y ? x : y;
    case SymOp::Min: return x < y ? x : y;
    case SymOp::Neg: return static_cast<int64_t>(0 - static_cast<uint64_t>(x));
  }
  return 0;
}

sym::Expr build(SymOp op, sym::Expr x, sym::Expr y) {
  switch (op) {
    case SymOp::Add: return sym::add(x, y);
    case SymOp::Sub: return sym::sub(x, y);
    case SymOp::Mul: return sym::mul(x, y);
    case SymOp::FloorDiv: return sym::floordiv(x, y);
    case SymOp::Mod: return sym::mod(x, y);
    case SymOp::CeilDiv: return sym::ceildiv(x, y);
    case SymOp::Max: return sym::maximum(x, y);
    case SymOp::Min: return sym::minimum(x, y);
    case SymOp::Neg: return sym::neg(x);
  }
  return x;
}

sym::Kind relation_kind(SymCmp op) {
  switch (op) {
    case SymCmp::Eq: return sym::Kind::Eq;
    case SymCmp::Ne: return sym::Kind::Ne;
    case SymCmp::Lt: return sym::Kind::Lt;
    case SymCmp::Le: return sym::Kind::Le;
    case SymCmp::Gt: return sym::Kind::Gt;
    case SymCmp::Ge: return sym::Kind::Ge;
  }
  return sym::Kind::Eq;
}

bool compare_hints(SymCmp op, int64_t x, int64_t y) {
  switch (op) {
    case SymCmp::Eq: return x == y;
    case SymCmp::Ne: return x != y;
    case SymCmp::Lt: return x < y;
    case SymCmp::Le: return x <= y;
    case SymCmp::Gt: return x > y;
    case SymCmp::Ge: return x >= y;
  }
  return false;
}

SymBool wrap(sym::Expr e, bool hint) {
  if (e->kind == sym::Kind::True) return SymBool(true);
  if (e->kind == sym::Kind::False) return SymBool(false);
  return SymBool(e, hint);
}

}  // namespace

SymInt sym_binary(SymOp op, SymInt a, SymInt b) {
  // Plain values below -2^62 live out of line too; they need no ShapeEnv. Division of plain values
  // checks its divisor like the inline path (ValueError instead of a trap).
  if (!a.is_symbolic() && !b.is_symbolic()) {
    const int64_t x = a.hint(), y = b.hint();
    switch (op) {
      case SymOp::FloorDiv: return SymInt(checked_floordiv(x, y));
      case SymOp::Mod: return SymInt(checked_floormod(x, y));
      case SymOp::CeilDiv: return SymInt(checked_ceildiv(x, y));
      case SymOp::Add:
      case SymOp::Sub:
      case SymOp::Mul:
      case SymOp::Max:
      case SymOp::Min:
      case SymOp::Neg:
        break;
    }
    return SymInt(hint_op(op, x, y));
  }
  sym::ShapeEnv& env = env_for("SymInt arithmetic", first_symbolic(a, b));
  sym::Expr e = user_errors(env, "SymInt arithmetic", first_symbolic(a, b),
                            [&] { return env.simplify(build(op, as_expr(a), as_expr(b))); });
  if (e->is_integer()) return SymInt(e->value);
  return SymInt(e, hint_op(op, a.hint(), b.hint()));
}

SymBool sym_compare(SymCmp op, SymInt a, SymInt b) {
  if (!a.is_symbolic() && !b.is_symbolic()) return SymBool(compare_hints(op, a.hint(), b.hint()));
  sym::ShapeEnv& env = env_for("SymInt comparison", first_symbolic(a, b));
  sym::Expr e = user_errors(env, "SymInt comparison", first_symbolic(a, b),
                            [&] { return env.simplify(sym::relation(relation_kind(op), as_expr(a), as_expr(b))); });
  return wrap(e, compare_hints(op, a.hint(), b.hint()));
}

SymBool sym_logic(bool is_and, SymBool a, SymBool b) {
  sym::ShapeEnv& env = env_for(is_and ? "SymBool &&" : "SymBool ||", a.is_symbolic() ? a.expr() : b.expr());
  sym::Expr e = env.simplify(is_and ? sym::and_(as_expr(a), as_expr(b)) : sym::or_(as_expr(a), as_expr(b)));
  return wrap(e, is_and ? (a.hint() && b.hint()) : (a.hint() || b.hint()));
}

SymBool sym_not(SymBool a) {
  sym::ShapeEnv& env = env_for("SymBool !", a.expr());
  return wrap(env.simplify(sym::not_(a.expr())), !a.hint());
}

bool sym_guard_bool(SymBool b) { return env_for("bool conversion", b.expr()).evaluate_guard(b); }

bool sym_check_symbolic(SymBool b, const char* message) {
  sym::ShapeEnv& env = env_for("check", b.expr());
  if (std::optional<bool> k = env.statically_known(b.expr())) return *k;
  if (env.hint_of(env.simplify(b.expr()))) return env.evaluate_guard(b);
  // Over unbacked symbols: a runtime assertion (or a fact already asserted: nothing new).
  env.check(b, message ? message : "");
  return true;
}

int64_t sym_guard_int(SymInt s) {
  if (!s.is_symbolic()) return s.hint();
  return env_for("int conversion", s.expr()).guard_int(s);
}

int64_t encode_sym_node(const sym::ExprNode* expr, int64_t hint) {
  // Interned per (expr, hint): a capture re-creates the same values many times, and interning bounds
  // the never-freed nodes by the distinct values seen (as sym::ExprNode is bounded by distinct
  // expressions). A thread-local direct-mapped cache in front of the shared table keeps the lock off
  // the common path.
  struct Key {
    const sym::ExprNode* expr;
    int64_t hint;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.expr) * 0x9E3779B97F4A7C15ull ^ std::hash<int64_t>()(k.hint);
    }
  };
  static std::mutex mu;
  static std::unordered_map<Key, const SymNode*, KeyHash>* table = new std::unordered_map<Key, const SymNode*, KeyHash>();
  thread_local const SymNode* recent[64] = {};
  const Key key{expr, hint};
  const size_t slot = KeyHash()(key) % 64;
  const SymNode* n = recent[slot];
  if (!n || n->expr != expr || n->hint != hint) {
    std::lock_guard<std::mutex> g(mu);
    auto [it, inserted] = table->try_emplace(key, nullptr);
    if (inserted) it->second = new SymNode{expr, hint};  // immortal by design
    n = it->second;
    recent[slot] = n;
  }
  const auto bits = reinterpret_cast<uintptr_t>(n);
  if (bits >> 62) throw std::logic_error("protean: SymInt node address does not fit the tagged encoding");
  return static_cast<int64_t>(bits | (uintptr_t{1} << 63));
}

std::string sym_str(const sym::ExprNode* e) { return sym::print(e); }

}  // namespace protean::detail

namespace protean {

void check(const SymBool& cond, const std::string& message) {
  if (!detail::sym_check(cond, message.c_str())) throw ValueError(message);
}

void check_is_size(const SymInt& n, const std::string& message) {
  if (!detail::sym_check(n >= 0, message.c_str()))
    throw ValueError(fmt::format("{}: {} is negative", message, n.is_symbolic() ? n.str() + " = " + std::to_string(n.hint()) : n.str()));
  if (n.is_symbolic()) detail::env_for("check_is_size", n.expr()).check_is_size(n, message);
}

}  // namespace protean
