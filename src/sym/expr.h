// SymExpr: hash-consed, immutable integer and boolean expressions over shape symbols.
//
// Semantics every constructor, rewrite rule and analysis in src/sym must respect
// ------------------------------------------------------------------------------------------------
//  * Values are mathematical integers. int64 overflow while folding constants throws
//    sym::OverflowError (a protean::ShapeError) instead of wrapping; value ranges saturate to
//    +-int_oo instead.
//  * FloorDiv(a, b) is floor(a / b) and Mod(a, b) = a - b * FloorDiv(a, b) (Python's `//` and `%`,
//    not C++'s truncation): FloorDiv(-3, 2) == -2, Mod(-3, 2) == 1, Mod(3, -2) == -1.
//    CeilDiv(a, b) == -FloorDiv(-a, b). Division by a constant zero throws std::domain_error.
//  * Pow(a, b) takes a natural exponent (b >= 0); a negative constant exponent throws.
//  * Max/Min are n-ary; And/Or are n-ary; relations (Eq Ne Lt Le Gt Ge) compare two integer
//    expressions and produce booleans; True/False are the boolean constants.
//  * Structurally equal nodes are the same object (hash-consing), so `a == b` on `Expr` is
//    structural equality and nodes can key caches (value ranges, substitutions) by address.
//  * Nodes live in one process-wide interning table guarded by mutexes and are NEVER freed: an
//    `Expr` stays valid for the life of the process. Shape expressions are few and small (thousands
//    per compiled program), so this trades a bounded leak for pointer equality and lock-free reads.
//
// Canonical form built by the constructors below (independent of any ShapeEnv):
//  * Add is a flat sum of distinct monomials with non-zero integer coefficients plus at most one
//    constant, ordered by degree (highest first) then structurally, constant last:
//    `s0*2 + s0` is `3*s0`, `(s0 + s1) - s1` is `s0`, `2*(s0 + 1)` is `2*s0 + 2`.
//  * Mul is `coefficient * factor * ...` with the coefficient (if != 1) first and repeated factors
//    merged into Pow: `s0*s0` is `s0**2`. Products of sums are distributed (up to kMaxExpandTerms).
//  * Constant operands are folded everywhere; x//1, Mod(x, 1), Max(x, x), Not(Not(x)) disappear;
//    Not of a relation is the complementary relation (Not(Lt(a, b)) is Ge(a, b)).
// Everything that needs value ranges or divisibility reasoning lives in simplify.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "protean/error.h"

namespace protean::sym {

// X-macro table of node kinds: name, printed function name (for call-style printing), is boolean.
#define PROTEAN_SYM_KINDS(X)  \
  X(Integer, "Integer", false) \
  X(Symbol, "Symbol", false)   \
  X(Pow, "Pow", false)         \
  X(Mul, "Mul", false)         \
  X(Add, "Add", false)         \
  X(FloorDiv, "FloorDiv", false) \
  X(CeilDiv, "CeilDiv", false) \
  X(Mod, "Mod", false)         \
  X(Max, "Max", false)         \
  X(Min, "Min", false)         \
  X(True, "True", true)        \
  X(False, "False", true)      \
  X(Eq, "Eq", true)            \
  X(Ne, "Ne", true)            \
  X(Lt, "Lt", true)            \
  X(Le, "Le", true)            \
  X(Gt, "Gt", true)            \
  X(Ge, "Ge", true)            \
  X(And, "And", true)          \
  X(Or, "Or", true)            \
  X(Not, "Not", true)

enum class Kind : uint8_t {
#define PROTEAN_SYM_KIND_ENUM(name, str, is_bool) name,
  PROTEAN_SYM_KINDS(PROTEAN_SYM_KIND_ENUM)
#undef PROTEAN_SYM_KIND_ENUM
};

const char* kind_name(Kind k);
bool kind_is_bool(Kind k);
bool kind_is_relation(Kind k);

}  // namespace protean::sym

namespace protean::sym {

/// One immutable, interned expression node. Create nodes only through the constructors below.
struct ExprNode {
  Kind kind;
  int64_t value = 0;                  ///< Integer: its value. Other kinds: 0.
  std::string name;                   ///< Symbol: its name ("s0", "u3"). Other kinds: empty.
  std::vector<const ExprNode*> args;  ///< operands (canonical order for commutative kinds)
  size_t hash = 0;                    ///< structural hash, computed once
  uint32_t degree = 0;                ///< polynomial degree (Integer 0, Symbol 1, opaque calls 1)
  uint32_t node_count = 1;            ///< nodes in the tree (shared subtrees counted each time)

  bool is_integer() const { return kind == Kind::Integer; }
  bool is_integer(int64_t v) const { return kind == Kind::Integer && value == v; }
  bool is_symbol() const { return kind == Kind::Symbol; }
  bool is_bool() const { return kind_is_bool(kind); }
  bool is_relation() const { return kind_is_relation(kind); }
  bool is_constant() const { return kind == Kind::Integer || kind == Kind::True || kind == Kind::False; }
};

using Expr = const ExprNode*;

/// Upper bound on the number of terms a product of sums may expand into; beyond it the sum stays a
/// factor (still canonical, just not expanded).
inline constexpr size_t kMaxExpandTerms = 64;

// ---- constructors (canonicalizing, thread-safe) -----------------------------------------------
Expr integer(int64_t v);
Expr symbol(std::string_view name);
Expr true_();
Expr false_();
Expr boolean(bool b);

Expr add(Expr a, Expr b);
Expr add(std::span<const Expr> terms);
Expr sub(Expr a, Expr b);
Expr neg(Expr a);
Expr mul(Expr a, Expr b);
Expr mul(std::span<const Expr> factors);
Expr floordiv(Expr a, Expr b);
Expr ceildiv(Expr a, Expr b);
Expr mod(Expr a, Expr b);
Expr maximum(Expr a, Expr b);
Expr maximum(std::span<const Expr> args);
Expr minimum(Expr a, Expr b);
Expr minimum(std::span<const Expr> args);
Expr pow(Expr base, Expr exponent);

Expr eq(Expr a, Expr b);
Expr ne(Expr a, Expr b);
Expr lt(Expr a, Expr b);
Expr le(Expr a, Expr b);
Expr gt(Expr a, Expr b);
Expr ge(Expr a, Expr b);
/// Relation of kind `k` (Eq..Ge).
Expr relation(Kind k, Expr a, Expr b);
Expr and_(Expr a, Expr b);
Expr and_(std::span<const Expr> args);
Expr or_(Expr a, Expr b);
Expr or_(std::span<const Expr> args);
Expr not_(Expr a);

/// Rebuilds a node of kind `k` from (possibly new) operands through the canonicalizing
/// constructors. `like` supplies Integer value / Symbol name for leaves.
Expr rebuild(Expr like, std::span<const Expr> new_args);

// ---- polynomial view ----------------------------------------------------------------------------
/// A sum viewed as `constant + sum(coefficient * monomial)`; monomials have coefficient 1.
struct LinearTerms {
  int64_t constant = 0;
  std::vector<std::pair<Expr, int64_t>> terms;  // (monomial, coefficient != 0), canonical order
};
LinearTerms as_terms(Expr e);
/// Splits a monomial term into (coefficient, monomial-with-coefficient-1): `6*s0*s1` → (6, s0*s1).
std::pair<int64_t, Expr> split_coefficient(Expr e);
/// gcd of all coefficients and the constant of `e` (0 for the constant 0); always >= 0.
int64_t content(Expr e);
/// `e / k` when every coefficient and the constant of e is divisible by k (k != 0), else nullopt.
std::optional<Expr> exact_divide(Expr e, int64_t k);
/// `e / m` for a monomial m (coefficient * product of factors) dividing every term of e exactly.
std::optional<Expr> exact_divide(Expr e, Expr m);

// ---- traversal ----------------------------------------------------------------------------------
/// Free symbols of e in canonical (natural name) order.
std::vector<Expr> free_symbols(Expr e);
bool has_symbol(Expr e, Expr sym);
/// Replaces symbols by expressions (simultaneously) and re-canonicalizes.
Expr substitute(Expr e, const std::unordered_map<Expr, Expr>& mapping);

/// Evaluates e with concrete symbol values. Integer results for integer nodes, 0/1 for booleans.
/// Throws std::domain_error on division by zero and std::out_of_range for an unbound symbol.
int64_t evaluate(Expr e, const std::function<int64_t(Expr)>& symbol_value);
int64_t evaluate(Expr e, const std::unordered_map<Expr, int64_t>& symbol_values);

/// Total structural order used for canonical operand order (deterministic across runs:
/// symbols compare by natural name order, s2 < s10).
int compare(Expr a, Expr b);

/// Number of distinct nodes in the interning table (diagnostics).
size_t interned_node_count();

/// int64 overflow in size arithmetic (folding constants): a ShapeError that names the operation and
/// its operands, e.g. "size arithmetic overflows int64: 4611686018427387904 * 4".
class OverflowError : public ShapeError {
  using ShapeError::ShapeError;
};

// ---- checked int64 helpers (throw OverflowError) ----------------------------------------------
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_pow(int64_t base, int64_t exp);
int64_t floordiv_int(int64_t a, int64_t b);  // throws std::domain_error on b == 0
int64_t mod_int(int64_t a, int64_t b);
int64_t gcd_int(int64_t a, int64_t b);

}  // namespace protean::sym
