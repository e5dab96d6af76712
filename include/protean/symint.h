// SymInt, SymFloat, SymBool: sizes and scalars that are plain values outside capture and symbolic
// expressions while a function is being traced.
//
// Mirrors c10::SymInt / torch.SymInt semantics:
//  * Outside capture a SymInt is one int64 word and costs the same as one (each operator adds
//    well-predicted tag compares; see bench/sym_bench.cpp, BM_*OutsideCapture vs BM_PlainInt64*, and
//    docs/sym.md "SymInt representation").
//  * During capture a SymInt refers to a hash-consed integer expression over symbols (s0, s1, ...) of
//    the current ShapeEnv, plus a *hint*: the concrete value seen while tracing.
//  * Arithmetic builds expressions; comparisons build SymBools. Turning a SymBool into a C++ `bool`
//    (an `if`, `&&`, `assert`) evaluates it with the hints and records a guard plus the user's source
//    line, exactly like Python's `bool(SymBool)` under Dynamo.
//  * Converting a symbolic SymInt to int64_t (`static_cast<int64_t>(s)`, `guard_int()`) specializes the
//    symbol to its hint and records a specialization (like `int(SymInt)` in PyTorch).
#pragma once

#include <compare>
#include <concepts>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <type_traits>
#include <vector>

namespace protean {

namespace sym {
struct ExprNode;  // hash-consed symbolic integer/boolean expression (src/sym/expr.h)
}

class SymInt;
class SymBool;

namespace detail {
/// Operators understood by the symbolic hooks. Floor semantics for FloorDiv/Mod (Python's, not C's).
enum class SymOp : uint8_t { Add, Sub, Mul, FloorDiv, Mod, CeilDiv, Max, Min, Neg };
enum class SymCmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
// Out-of-line symbolic paths, implemented by src/sym. Only reached when an operand is symbolic.
// Operands are passed by value: SymInt/SymBool are one trivially copyable word (see below), so they
// travel in registers and the caller's variables never have to live in memory.
[[gnu::cold]] SymInt sym_binary(SymOp op, SymInt a, SymInt b);
[[gnu::cold]] SymBool sym_compare(SymCmp op, SymInt a, SymInt b);
[[gnu::cold]] SymBool sym_logic(bool is_and, SymBool a, SymBool b);
[[gnu::cold]] SymBool sym_not(SymBool a);
[[gnu::cold]] bool sym_guard_bool(SymBool b);
[[gnu::cold]] bool sym_check_symbolic(SymBool b, const char* message);
[[gnu::cold]] int64_t sym_guard_int(SymInt s);
std::string sym_str(const sym::ExprNode* e);
inline int64_t floordiv_i64(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
inline int64_t floormod_i64(int64_t a, int64_t b) { return a - floordiv_i64(a, b) * b; }
/// Throws ValueError for `a // b` or `a % b` that has no int64 result: a zero divisor, or
/// INT64_MIN // -1 (2^63 does not fit). Out of line and cold: only reached on bad input.
[[noreturn, gnu::cold]] void sym_division_error(const char* op, int64_t a, int64_t b);
/// floordiv_i64 that throws (sym_division_error) instead of trapping.
inline int64_t checked_floordiv(int64_t a, int64_t b) {
  if (b == 0 || (b == -1 && a == INT64_MIN)) [[unlikely]]
    sym_division_error("//", a, b);
  return floordiv_i64(a, b);
}
/// floormod_i64 that throws for a zero divisor; x % -1 is 0 (also for INT64_MIN, whose quotient overflows).
inline int64_t checked_floormod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) [[unlikely]] {
    if (b == 0) sym_division_error("%", a, b);
    return 0;
  }
  return floormod_i64(a, b);
}
/// ceil(a / b) that throws for a zero divisor or a quotient outside int64.
inline int64_t checked_ceildiv(int64_t a, int64_t b) {
  const int64_t q = checked_floordiv(a, b);
  return checked_floormod(a, b) != 0 ? q + 1 : q;
}

/// The out-of-line half of a SymInt: an expression with its traced value, or (expr == nullptr) a plain
/// integer too negative for the inline encoding. Interned and immortal (src/sym/symint_hooks.cpp).
struct SymNode {
  const sym::ExprNode* expr;
  int64_t hint;
};
/// Interns {expr, hint} and returns the tagged word for it (always below SymInt::kMinPlain).
int64_t encode_sym_node(const sym::ExprNode* expr, int64_t hint);
inline const SymNode* decode_sym_node(int64_t word) {
  // The tag is the sign bit; user-space pointers are below 2^62.
  return reinterpret_cast<const SymNode*>(static_cast<uintptr_t>(word) & ~(uintptr_t{1} << 63));
}
}  // namespace detail

/// An integer that may be symbolic during capture. Implicitly constructible from integers.
///
/// Representation (the same idea as c10::SymInt's tagged word): ONE int64. Values in
/// [-2^62, 2^63) are plain integers stored as themselves, so outside capture a SymInt has int64's size,
/// is passed in one register and every operator is "two compares + the int64 operation". Words below
/// -2^62 carry a pointer to an immortal, interned node {expr, hint}: either a symbolic value
/// (expr != nullptr) or a plain integer below -2^62 (expr == nullptr; e.g. ONNX's INT64_MIN slice ends).
/// Nodes are never freed, like sym::ExprNode, so a SymInt never dangles.
class SymInt {
 public:
  constexpr SymInt() = default;
  template <std::integral T>
  constexpr SymInt(T v) : data_(static_cast<int64_t>(v)) {  // NOLINT(google-explicit-constructor)
    if (data_ < kMinPlain) [[unlikely]]
      data_ = detail::encode_sym_node(nullptr, static_cast<int64_t>(v));
  }
  /// Builds a symbolic SymInt. `expr` must be a node owned by the sym engine; `hint` its traced value.
  SymInt(const sym::ExprNode* expr, int64_t hint) : data_(detail::encode_sym_node(expr, hint)) {}

  /// True for an expression over shape symbols (only during capture).
  bool is_symbolic() const { return is_heap() && node()->expr != nullptr; }
  /// The concrete value outside capture, or the hint (traced value) of a symbolic SymInt. Never guards.
  int64_t hint() const { return is_heap() ? node()->hint : data_; }
  const sym::ExprNode* expr() const { return is_heap() ? node()->expr : nullptr; }
  /// The value as int64. Specializes (and records a guard) when symbolic.
  int64_t guard_int() const { return is_heap() ? detail::sym_guard_int(*this) : data_; }
  explicit operator int64_t() const { return guard_int(); }
  /// Plain value if not symbolic: returns true and sets `out`; else false and leaves `out` untouched.
  bool maybe_as_int(int64_t& out) const {
    if (is_symbolic()) return false;
    out = hint();
    return true;
  }
  std::string str() const;

  /// The word holds a node pointer (symbolic, or a plain value below -2^62). Operators take their
  /// inline int64 path only when neither operand is a node.
  bool is_heap() const { return data_ < kMinPlain; }
  /// Smallest value stored inline: -2^62.
  static constexpr int64_t kMinPlain = -(int64_t{1} << 62);

 private:
  const detail::SymNode* node() const { return detail::decode_sym_node(data_); }
  int64_t data_ = 0;
};

/// A boolean that may be symbolic (the result of comparing SymInts during capture). One word: 0 and 1
/// are plain false/true; otherwise the word is an ExprNode pointer (8-byte aligned) with the hint in
/// bit 0.
class SymBool {
 public:
  constexpr SymBool(bool v = false) : data_(v ? 1u : 0u) {}  // NOLINT(google-explicit-constructor)
  SymBool(const sym::ExprNode* expr, bool hint)
      : data_(reinterpret_cast<uintptr_t>(expr) | static_cast<uintptr_t>(hint)) {}
  bool is_symbolic() const { return data_ > 1; }
  bool hint() const { return (data_ & 1u) != 0; }
  const sym::ExprNode* expr() const {
    return is_symbolic() ? reinterpret_cast<const sym::ExprNode*>(data_ & ~uintptr_t{1}) : nullptr;
  }
  /// Evaluates with the hint; when symbolic, adds a guard (with the user's source line) to the
  /// current ShapeEnv. This is what `if (x.size(0) % 2 == 0)` calls.
  explicit operator bool() const { return is_symbolic() ? detail::sym_guard_bool(*this) : data_ != 0; }
  bool guard_bool() const { return static_cast<bool>(*this); }
  std::string str() const;

 private:
  uintptr_t data_ = 0;
};

namespace detail {
/// The out-of-line half of a symbolic SymFloat (src/capture/symfloat.cpp): the 0-dim f64 graph value
/// of the capture that made it, and the dynamic float arguments and symbolic SymInts it was computed
/// from. Immortal, like SymNode.
struct SymFloatNode;
enum class FloatOp : uint8_t { Add, Sub, Mul, Div };
enum class FloatCmp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
}  // namespace detail

/// A floating-point scalar that may be symbolic during capture, used like a double.
///
/// Outside capture (and for a float the capture keeps static) a SymFloat is a plain double. When the
/// capture makes a float argument dynamic (a SymFloat parameter whose value changed between calls,
/// `dynamic=On`, or PROTEAN_DYNAMIC_SOURCES) the value is a 0-dim f64 input of the graph, and
///  * arithmetic (`+ - * /` with SymFloats, doubles, integers and SymInts) records 0-dim f64 ops, so
///    the result stays symbolic and a new value reuses the graph (no recompile);
///  * arithmetic with a Tensor (`x * y`, `y - x`) reads the graph value, converted like a Python float
///    operand: to the tensor's dtype when it is floating, else to f32;
///  * a comparison (`y > 0.5`) gives a C++ bool from the traced value and specializes what the value
///    was computed from (like PyTorch's guard on a SymFloat, but by value): the entry then guards
///    those float arguments by value and the SymInts involved by `Eq`, so another value recompiles
///    instead of taking the wrong branch. `double(y)` / guard_float() do the same;
///  * value() is the value as a double and specializes like double(y): the plain double it returns
///    is a constant of the graph, so the entry guards it (a `x * y.value()` recompiles per value; write
///    `x * y` to keep it dynamic). hint() returns the traced value without guarding, for heuristics
///    only: a result computed from it and used in the graph is not guarded (as SymInt::hint()), except
///    where the same bits appear in an op attribute (then the entry guards the value).
/// A SymInt converts explicitly (`SymFloat(n)`); a symbolic one becomes an f64 graph value of n.
class SymFloat {
 public:
  constexpr SymFloat(double v = 0.0) : v_(v) {}  // NOLINT(google-explicit-constructor)
  /// A symbolic value (capture only).
  SymFloat(const detail::SymFloatNode* node, double hint) : v_(hint), node_(node) {}
  /// The SymInt's value as a float; symbolic while `n` is.
  explicit SymFloat(const SymInt& n);

  bool is_symbolic() const { return node_ != nullptr; }
  /// The traced value (or the plain value). Never guards.
  double hint() const { return v_; }
  /// The value as a double; specializes a symbolic SymFloat as guard_float() does (the class comment).
  double value() const { return guard_float(); }
  /// The value as a double; specializes a symbolic SymFloat (see the class comment).
  double guard_float() const;
  explicit operator double() const { return guard_float(); }
  const detail::SymFloatNode* node() const { return node_; }
  std::string str() const;

 private:
  double v_;
  const detail::SymFloatNode* node_ = nullptr;
};

namespace detail {
[[gnu::cold]] SymFloat symfloat_binary(FloatOp op, const SymFloat& a, const SymFloat& b);
[[gnu::cold]] bool symfloat_compare(FloatCmp op, const SymFloat& a, const SymFloat& b);
inline double float_op(FloatOp op, double x, double y) {
  switch (op) {
    case FloatOp::Add: return x + y;
    case FloatOp::Sub: return x - y;
    case FloatOp::Mul: return x * y;
    case FloatOp::Div: return x / y;
  }
  return 0.0;
}
inline bool float_cmp(FloatCmp op, double x, double y) {
  switch (op) {
    case FloatCmp::Eq: return x == y;
    case FloatCmp::Ne: return x != y;
    case FloatCmp::Lt: return x < y;
    case FloatCmp::Le: return x <= y;
    case FloatCmp::Gt: return x > y;
    case FloatCmp::Ge: return x >= y;
  }
  return false;
}
inline SymFloat float_binary(FloatOp op, const SymFloat& a, const SymFloat& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) [[likely]] return SymFloat(float_op(op, a.hint(), b.hint()));
  return symfloat_binary(op, a, b);
}
inline bool float_compare(FloatCmp op, const SymFloat& a, const SymFloat& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) [[likely]] return float_cmp(op, a.hint(), b.hint());
  return symfloat_compare(op, a, b);
}
template <typename T>
concept Arithmetic = std::is_arithmetic_v<T>;
}  // namespace detail

// ---- SymFloat arithmetic and comparisons (double semantics; symbolic path out of line) -------------
// Division by zero follows IEEE (inf/nan), as for a double. Arithmetic with an integer type or a
// SymInt gives a SymFloat, as the double operation does.
#define PROTEAN_SYMFLOAT_BINOP(OPSYM, KIND)                                                                  \
  inline SymFloat operator OPSYM(const SymFloat& a, const SymFloat& b) {                                    \
    return detail::float_binary(detail::FloatOp::KIND, a, b);                                               \
  }                                                                                                         \
  template <detail::Arithmetic T>                                                                           \
  inline SymFloat operator OPSYM(const SymFloat& a, T b) { return a OPSYM SymFloat(static_cast<double>(b)); } \
  template <detail::Arithmetic T>                                                                           \
  inline SymFloat operator OPSYM(T a, const SymFloat& b) { return SymFloat(static_cast<double>(a)) OPSYM b; } \
  inline SymFloat operator OPSYM(const SymFloat& a, const SymInt& b) { return a OPSYM SymFloat(b); }         \
  inline SymFloat operator OPSYM(const SymInt& a, const SymFloat& b) { return SymFloat(a) OPSYM b; }         \
  template <std::floating_point T>                                                                          \
  inline SymFloat operator OPSYM(const SymInt& a, T b) { return SymFloat(a) OPSYM SymFloat(static_cast<double>(b)); } \
  template <std::floating_point T>                                                                          \
  inline SymFloat operator OPSYM(T a, const SymInt& b) { return SymFloat(static_cast<double>(a)) OPSYM SymFloat(b); } \
  inline SymFloat& operator OPSYM##=(SymFloat& a, const SymFloat& b) { return a = a OPSYM b; }

PROTEAN_SYMFLOAT_BINOP(+, Add)
PROTEAN_SYMFLOAT_BINOP(-, Sub)
PROTEAN_SYMFLOAT_BINOP(*, Mul)
PROTEAN_SYMFLOAT_BINOP(/, Div)
#undef PROTEAN_SYMFLOAT_BINOP
inline SymFloat operator-(const SymFloat& a) { return SymFloat(0.0) - a; }

#define PROTEAN_SYMFLOAT_CMP(OPSYM, KIND)                                                                    \
  inline bool operator OPSYM(const SymFloat& a, const SymFloat& b) {                                        \
    return detail::float_compare(detail::FloatCmp::KIND, a, b);                                             \
  }                                                                                                         \
  template <detail::Arithmetic T>                                                                           \
  inline bool operator OPSYM(const SymFloat& a, T b) { return a OPSYM SymFloat(static_cast<double>(b)); }    \
  template <detail::Arithmetic T>                                                                           \
  inline bool operator OPSYM(T a, const SymFloat& b) { return SymFloat(static_cast<double>(a)) OPSYM b; }    \
  inline bool operator OPSYM(const SymFloat& a, const SymInt& b) { return a OPSYM SymFloat(b); }             \
  inline bool operator OPSYM(const SymInt& a, const SymFloat& b) { return SymFloat(a) OPSYM b; }

PROTEAN_SYMFLOAT_CMP(==, Eq)
PROTEAN_SYMFLOAT_CMP(!=, Ne)
PROTEAN_SYMFLOAT_CMP(<, Lt)
PROTEAN_SYMFLOAT_CMP(<=, Le)
PROTEAN_SYMFLOAT_CMP(>, Gt)
PROTEAN_SYMFLOAT_CMP(>=, Ge)
#undef PROTEAN_SYMFLOAT_CMP

using SymIntVec = std::vector<SymInt>;
using IntVec = std::vector<int64_t>;

// ---- arithmetic: plain fast path inline, symbolic path out of line --------------------------------
#define PROTEAN_SYMINT_BINOP(OPSYM, KIND, PLAIN)                                              \
  inline SymInt operator OPSYM(const SymInt& a, const SymInt& b) {                           \
    if (!a.is_heap() && !b.is_heap()) [[likely]] {                                          \
      int64_t x = a.hint(), y = b.hint();                                                    \
      return SymInt(PLAIN);                                                                  \
    }                                                                                        \
    return detail::sym_binary(detail::SymOp::KIND, a, b);                                    \
  }                                                                                          \
  template <std::integral T>                                                                 \
  inline SymInt operator OPSYM(const SymInt& a, T b) { return a OPSYM SymInt(b); }           \
  template <std::integral T>                                                                 \
  inline SymInt operator OPSYM(T a, const SymInt& b) { return SymInt(a) OPSYM b; }           \
  inline SymInt& operator OPSYM##=(SymInt& a, const SymInt& b) { return a = a OPSYM b; }

PROTEAN_SYMINT_BINOP(+, Add, x + y)
PROTEAN_SYMINT_BINOP(-, Sub, x - y)
PROTEAN_SYMINT_BINOP(*, Mul, x * y)
/// Floor division (Python `//`), not C++ truncation: SymInt(-3) / 2 == -2. A zero divisor and
/// INT64_MIN / -1 (whose quotient 2^63 does not fit in int64) throw ValueError instead of trapping.
PROTEAN_SYMINT_BINOP(/, FloorDiv, detail::checked_floordiv(x, y))
/// Floor modulo (Python `%`): the result has the divisor's sign. A zero divisor throws ValueError.
PROTEAN_SYMINT_BINOP(%, Mod, detail::checked_floormod(x, y))
#undef PROTEAN_SYMINT_BINOP

inline SymInt operator-(const SymInt& a) {
  return a.is_heap() ? detail::sym_binary(detail::SymOp::Neg, a, SymInt(0)) : SymInt(-a.hint());
}
/// ceil(a / b) for b > 0 (a zero divisor throws ValueError).
inline SymInt ceil_div(const SymInt& a, const SymInt& b) {
  if (!a.is_heap() && !b.is_heap()) return SymInt(detail::checked_ceildiv(a.hint(), b.hint()));
  return detail::sym_binary(detail::SymOp::CeilDiv, a, b);
}
inline SymInt sym_max(const SymInt& a, const SymInt& b) {
  if (!a.is_heap() && !b.is_heap()) return a.hint() > b.hint() ? a : b;
  return detail::sym_binary(detail::SymOp::Max, a, b);
}
inline SymInt sym_min(const SymInt& a, const SymInt& b) {
  if (!a.is_heap() && !b.is_heap()) return a.hint() < b.hint() ? a : b;
  return detail::sym_binary(detail::SymOp::Min, a, b);
}

#define PROTEAN_SYMINT_CMP(OPSYM, KIND)                                                      \
  inline SymBool operator OPSYM(const SymInt& a, const SymInt& b) {                          \
    if (!a.is_heap() && !b.is_heap()) [[likely]] return SymBool(a.hint() OPSYM b.hint());   \
    return detail::sym_compare(detail::SymCmp::KIND, a, b);                                  \
  }                                                                                          \
  template <std::integral T>                                                                 \
  inline SymBool operator OPSYM(const SymInt& a, T b) { return a OPSYM SymInt(b); }          \
  template <std::integral T>                                                                 \
  inline SymBool operator OPSYM(T a, const SymInt& b) { return SymInt(a) OPSYM b; }

PROTEAN_SYMINT_CMP(==, Eq)
PROTEAN_SYMINT_CMP(!=, Ne)
PROTEAN_SYMINT_CMP(<, Lt)
PROTEAN_SYMINT_CMP(<=, Le)
PROTEAN_SYMINT_CMP(>, Gt)
PROTEAN_SYMINT_CMP(>=, Ge)
#undef PROTEAN_SYMINT_CMP

inline SymBool operator&&(const SymBool& a, const SymBool& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) return SymBool(a.hint() && b.hint());
  return detail::sym_logic(true, a, b);
}
inline SymBool operator||(const SymBool& a, const SymBool& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) return SymBool(a.hint() || b.hint());
  return detail::sym_logic(false, a, b);
}
// With a plain bool on one side (`x.size(0) > 4 && flag`): exact overloads, since the bool converts
// to a SymBool and the SymBool (explicitly) to a bool, which made such an expression ambiguous.
inline SymBool operator&&(const SymBool& a, bool b) { return a && SymBool(b); }
inline SymBool operator&&(bool a, const SymBool& b) { return SymBool(a) && b; }
inline SymBool operator||(const SymBool& a, bool b) { return a || SymBool(b); }
inline SymBool operator||(bool a, const SymBool& b) { return SymBool(a) || b; }
inline SymBool operator!(const SymBool& a) {
  return a.is_symbolic() ? detail::sym_not(a) : SymBool(!a.hint());
}

/// Product of sizes (numel). Symbolic when any size is.
inline SymInt sym_product(const SymIntVec& v) {
  SymInt r(1);
  for (const auto& s : v) r = r * s;
  return r;
}
/// Hints of a SymInt vector (concrete values; never guards).
inline IntVec hints(const SymIntVec& v) {
  IntVec r;
  r.reserve(v.size());
  for (const auto& s : v) r.push_back(s.hint());
  return r;
}
/// Wraps plain ints.
inline SymIntVec to_symint_vec(const IntVec& v) { return SymIntVec(v.begin(), v.end()); }
/// True when no element is symbolic.
inline bool all_concrete(const SymIntVec& v) {
  for (const auto& s : v)
    if (s.is_symbolic()) return false;
  return true;
}

// ---- checks (torch._check, torch._check_is_size) ---------------------------------------------------
namespace detail {
/// torch._check's decision, for library code that reports its own error: true when `cond` holds.
/// Plain values: the value. During capture, when the traced sizes decide it: a guard, and the value
/// for them. Over unbacked symbols (item_symint, nonzero): a runtime assertion named `message`,
/// checked when the graph runs, and true (the fact is assumed from then on).
inline bool sym_check(const SymBool& cond, const char* message) {
  return cond.is_symbolic() ? sym_check_symbolic(cond, message) : cond.hint();
}
}  // namespace detail

/// Asserts `cond`, like torch._check. Outside capture (and for plain values) a false `cond` throws
/// ValueError(message). While a function is traced: a condition the traced sizes decide becomes a
/// guard (ValueError when false for them); one over unbacked symbols (Tensor::item_symint() under
/// capture_scalar_outputs, nonzero's row count) becomes a runtime assertion, checked when the graph
/// runs (RuntimeError naming `message` and the user's line when it fails), and a fact later guards may
/// rely on: after `check(n <= x.size(0))`, `narrow(x, 0, 0, n)` traces without a graph break.
void check(const SymBool& cond, const std::string& message = "protean::check failed");
/// Asserts `n >= 0` like check() and marks an unbacked `n` as a size (torch._check_is_size):
/// size-oblivious decisions then treat it as >= 2 (docs/breaks.md). Capture does this by itself when
/// an unbacked value is first used as a size. Throws ValueError when `n` is negative (plain) or
/// negative for the traced sizes.
void check_is_size(const SymInt& n, const std::string& message = "protean::check_is_size: a size must be >= 0");

std::ostream& operator<<(std::ostream& os, const SymInt& s);
std::ostream& operator<<(std::ostream& os, const SymBool& s);
std::ostream& operator<<(std::ostream& os, const SymFloat& f);
/// "[2, s0, 512]"
std::string to_string(const SymIntVec& v);

}  // namespace protean
