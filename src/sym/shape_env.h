// ShapeEnv: the symbols of one capture, their ranges, and every guard / specialization / runtime
// assertion recorded while a function is traced (PyTorch's ShapeEnv, natively).
//
// Lifecycle (driven by the capture layer):
//   ShapeEnv env;
//   env.set_location_provider([&] { return current_user_frame(); });   // file:line of user code
//   env.set_event_listener([&](const ShapeEvent& ev) { log("dynamic", ev.message); });
//   SymInt n = env.create_symbol("x.size()[0]", 8, DimKind::Duck);       // s0, hint 8, VR[2, int_oo]
//   { ShapeEnvScope scope(env); fn(fake_inputs); }   // SymInt arithmetic and `if (n % 2 == 0)` land here
//   GuardProgram p = compile_guards(env, {{"x.size()[0]", 0}, ...});    // guard_eval.h
//
// Semantics (PyTorch 2.x; user-facing summary in docs/capture.md and docs/sym.md):
//  * 0/1 specialization: a Dynamic/Duck size whose hint is 0 or 1 becomes that constant (sizes 0/1
//    change broadcasting and emptiness semantics). With ShapeEnvOptions::keep_one_symbolic (what
//    dynamic=On may choose) a hint of 1 gets a symbol with range VR[1, int_oo] instead; 0 always
//    specializes. Every other size symbol gets VR[2, int_oo] (intersected with a mark's min/max).
//  * Duck sizing: only DimKind::Duck sizes with equal hints share one symbol (the second source is
//    recorded on the first symbol and guarded `y.size()[0] == x.size()[0]`); a size 1 kept symbolic
//    is never duck-sized.
//  * Turning a SymBool into bool (evaluate_guard) simplifies it under the current replacements and
//    ranges; statically known results add nothing. Otherwise the hint decides, the fact that held
//    (the expression or its negation) becomes a guard, and only then is the location provider
//    called. Facts feed back: Eq solves for a symbol (replacement `s1 → 2*s0`; a constant
//    replacement `s0 → 33` is also recorded as a Specialization), single-symbol inequalities tighten
//    the symbol's range (after `s0 < 100` it is VR[2, 99]).
//  * Strict marks (mark_dynamic): specializing, replacing or narrowing a strict symbol throws
//    ConstraintViolation naming the source, the guard and the user's location.
//  * Unbacked symbols (u0, u1, ...) have no hint: guarding on them throws DataDependentError;
//    check() records a runtime assertion (and refines ranges/replacements) instead, and
//    guard_size_oblivious() decides size questions as if size-like unbacked symbols were >= 2.
//    A runtime assertion is also an axiom: a later guard on the same fact (or its negation) is
//    decided by it (after check(u0 <= s0), `u0 > s0` is False) instead of raising.
//    SymInts over unbacked symbols carry the placeholder hint kUnbackedHint, never used for guards.
//  * Nothing is printed: every decision is a ShapeEvent (PyTorch's log line text in `message`)
//    appended to events() and passed to the listener.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/source_location.h"
#include "protean/error.h"
#include "protean/symint.h"
#include "sym/expr.h"
#include "sym/value_ranges.h"

namespace protean::sym {


/// How the capture layer wants an input dimension (or int) treated.
enum class DimKind : uint8_t {
  Static,    ///< plain int, no symbol (guarded by the capture layer's tensor-match checks)
  Dynamic,   ///< own symbol (unless 0/1)
  Duck,      ///< symbol shared with earlier Duck sizes of the same hint (dynamic=On, unmarked)
  Unbacked,  ///< symbol without a hint (data-dependent)
};

/// Optional user constraints on a symbol (mark_dynamic(t, dim, min, max)).
struct SymbolConstraint {
  bool strict = false;  ///< mark_dynamic: specializing or narrowing the symbol is an error
  std::optional<int64_t> min;
  std::optional<int64_t> max;
};

struct ShapeEnvOptions {
  bool specialize_zero_one = true;  ///< hints 0 and 1 become constants (PyTorch default)
  bool keep_one_symbolic = false;   ///< with specialize_zero_one: a hint of 1 stays symbolic, VR[1, int_oo]
};

/// Placeholder hint carried by SymInts that involve unbacked symbols (never used to decide guards).
inline constexpr int64_t kUnbackedHint = 8192;

struct SymbolInfo {
  Expr symbol = nullptr;
  std::vector<std::string> sources;  ///< first one is where the symbol was created
  std::optional<int64_t> hint;       ///< nullopt for unbacked symbols
  DimKind kind = DimKind::Dynamic;
  ValueRange declared;               ///< range at creation (after marks)
  bool strict = false;
  bool size_like = false;            ///< unbacked sizes (VR[0, int_oo], size-oblivious >= 2)
  core::SourceLocation created_at;
};

struct Guard {
  Expr expr;  ///< the fact that held when traced, simplified (e.g. `Eq(s0, 33)`, `s0 < 100`)
  core::SourceLocation where;
};

/// A symbol replaced by a constant (by a guard, an int conversion or a collapsed range).
struct Specialization {
  Expr symbol;
  std::vector<std::string> sources;
  int64_t value;
  std::string reason;  ///< "guard Eq(s0, 33)", "int conversion of s0", ...
  core::SourceLocation where;
};

/// A fact about unbacked symbols that can only be checked at run time (inserted into the graph).
struct RuntimeAssert {
  Expr expr;
  std::string message;
  core::SourceLocation where;
};

enum class ShapeEventKind : uint8_t {
  CreateSymbol,     ///< create_symbol s0 = 5 for x.size()[0] [2, int_oo] at f.cpp:3 in fn
  DuckSize,         ///< duck sizing: y.size()[0] = 5 shares s0
  CreateUnbacked,   ///< create_unbacked_symint u0 [-int_oo, int_oo] at ...
  GuardAdded,       ///< eval Eq(s0, 33) [guard added] at f.cpp:7 in fn
  StaticallyKnown,  ///< eval 2 <= s0 == True [statically known]
  Replacement,      ///< set_replacement s1 = 2*s0 (guard Eq(2*s0, s1))
  Specialization,   ///< specialize s0 = 33 for x.size()[0] (guard Eq(s0, 33)) at ...
  RangeUpdate,      ///< _update_var_to_range s0 = VR[2, 99] (guard s0 < 100)
  RuntimeAssert,    ///< runtime_assert u0 >= 0 [guard added] at ...
};

struct ShapeEvent {
  ShapeEventKind kind;
  std::string message;  ///< ready-to-print log line (PyTorch's wording)
  Expr expr = nullptr;  ///< the symbol or guard concerned
  core::SourceLocation where;
};

/// Specializing, replacing or narrowing a strict (mark_dynamic) symbol, or a marked size outside
/// its declared range. The message names the source, the guard and the user's location.
/// A strict mark (mark_dynamic, its min/max) that the traced sizes or the program violate. A
/// CompileError: it reaches the user as a protean::Error naming the source and the range.
class ConstraintViolation : public CompileError {
 public:
  using CompileError::CompileError;
};

/// Guarding on an expression over unbacked symbols (no hint to decide it). `where` is the user's
/// line that asked for the guard (taken when the error is raised, before the stack unwinds; empty
/// without a location provider).
class DataDependentError : public std::runtime_error {
 public:
  explicit DataDependentError(const std::string& what, core::SourceLocation where = {})
      : std::runtime_error(what), where(std::move(where)) {}
  core::SourceLocation where;
};

/// Everything the dispatcher must re-check, produced after capture (see guard_eval.h).
struct GuardSet {
  struct Bound {  ///< a free symbol: its value is read from the first bound source
    Expr symbol;
    std::vector<std::string> sources;
  };
  struct Replaced {  ///< a replaced symbol: each of its sources must equal `value`
    Expr symbol;
    std::vector<std::string> sources;
    Expr value;
  };
  struct Static {  ///< a 0/1-specialized (or DimKind::Static) source
    std::string source;
    int64_t value;
  };
  struct Check {
    Expr expr;
    std::string text;  ///< PyTorch style: `2 <= s0`, `Eq(Mod(s0, 2), 0)`
  };
  std::vector<Bound> symbols;
  std::vector<Replaced> replaced;
  std::vector<Static> statics;
  std::vector<Check> checks;  ///< range checks per free symbol, then the remaining guards
};

class ShapeEnv {
 public:
  explicit ShapeEnv(ShapeEnvOptions options = {});
  ShapeEnv(const ShapeEnv&) = delete;
  ShapeEnv& operator=(const ShapeEnv&) = delete;

  const ShapeEnvOptions& options() const { return options_; }

  // ---- capture-layer hooks ----------------------------------------------------------------------
  /// Installs the provider of the user's current location; called only when something is recorded
  /// (symbol created, guard added, specialization, runtime assert).
  void set_location_provider(std::function<core::SourceLocation()> provider) { location_ = std::move(provider); }
  /// Installs a listener called with every event (in addition to events()).
  void set_event_listener(std::function<void(const ShapeEvent&)> listener) { listener_ = std::move(listener); }

  // ---- symbols ----------------------------------------------------------------------------------
  /// A size (or int) read from `source` with traced value `hint`. Returns a plain SymInt for Static
  /// kinds and 0/1-specialized sizes. Throws ConstraintViolation when a strict mark cannot hold
  /// (hint 0/1, hint outside min/max) and ShapeError for a negative size hint.
  SymInt create_symbol(const std::string& source, int64_t hint, DimKind kind, const SymbolConstraint& constraint = {});
  /// An integer that is not a size (a registered Module attribute made dynamic): its own symbol, no
  /// 0/1 specialization and no duck sizing. Range VR[0, int_oo] for a non-negative hint (so that
  /// the value may still serve as a size; a negative value then fails the range guard and
  /// recompiles), VR[-int_oo, int_oo] for a negative one.
  SymInt create_int_symbol(const std::string& source, int64_t hint);
  /// A fresh unbacked symbol u<n> (data-dependent value). size_like: VR[0, int_oo], else VR[-int_oo, int_oo].
  SymInt create_unbacked_symint(const std::string& source = "", bool size_like = false);
  /// Intersects a symbol's range (torch._constrain_as_size / constrain_range).
  void constrain_range(const SymInt& s, ValueRange range);

  // ---- guards -----------------------------------------------------------------------------------
  /// `bool(b)`: the hint decides; records a guard unless statically known. DataDependentError when
  /// the expression involves unbacked symbols.
  bool evaluate_guard(const SymBool& b);
  /// `int(s)`: specializes to the hint (guard `Eq(e, hint)`, a Specialization for a single symbol).
  int64_t guard_int(const SymInt& s);
  /// Like evaluate_guard, but size-like unbacked symbols count as >= 2 when deciding statically.
  bool guard_size_oblivious(const SymBool& b);
  /// torch._check: statically false or false for the hints → RuntimeError with `message`;
  /// over unbacked symbols → a RuntimeAssert (and range/replacement refinement); else a guard.
  void check(const SymBool& cond, std::string_view message = {});
  /// torch._check_is_size: check(s >= 0), and a plain unbacked symbol becomes size-like (VR[0, int_oo];
  /// size-oblivious guards treat it as >= 2). What capture does when an unbacked value (item_symint)
  /// is first used as a size. Plain or backed values: like check().
  void check_is_size(const SymInt& s, std::string_view message = {});
  /// True/False when decided by ranges and replacements alone; never records anything.
  std::optional<bool> statically_known(Expr boolean) const;

  // ---- queries ----------------------------------------------------------------------------------
  /// Replacements substituted, then simplified under the current ranges.
  Expr simplify(Expr e) const;
  ValueRange range_of(Expr e) const;
  /// Value of e at the hints (nullopt when it involves unbacked symbols or divides by zero).
  std::optional<int64_t> hint_of(Expr e) const;
  const SymbolInfo* symbol_info(Expr symbol) const;
  /// The symbol originally created for `source` (nullptr for unknown or static sources).
  Expr symbol_for_source(const std::string& source) const;
  const std::vector<SymbolInfo>& symbols() const { return symbols_; }
  const std::unordered_map<Expr, Expr>& replacements() const { return replacements_; }
  const std::vector<Guard>& guards() const { return guards_; }
  const std::vector<Specialization>& specializations() const { return specializations_; }
  const std::vector<RuntimeAssert>& runtime_asserts() const { return runtime_asserts_; }
  const std::vector<ShapeEvent>& events() const { return events_; }
  const RangeAnalyzer& ranges() const { return ranges_; }

  /// The final guard set: sources per symbol, replacements, statics, range checks and the recorded
  /// guards minus those implied by ranges or by other guards.
  GuardSet produce_guards() const;

 private:
  SymbolInfo* info(Expr symbol);
  Expr new_symbol(const std::string& prefix);
  core::SourceLocation where() const { return location_ ? location_() : core::SourceLocation{}; }
  void emit(ShapeEventKind kind, std::string message, Expr expr, const core::SourceLocation& where);
  bool evaluate_expr(Expr e, const char* what);
  void add_guard(Expr fact, const std::string& reason, const core::SourceLocation& where);
  void apply_fact(Expr fact, const std::string& reason, const core::SourceLocation& where);
  void try_replacement(Expr eq_fact, const std::string& reason, const core::SourceLocation& where);
  void set_replacement(Expr symbol, Expr value, const std::string& reason, const core::SourceLocation& where);
  void update_range(Expr symbol, ValueRange r, const std::string& reason, const core::SourceLocation& where);
  [[noreturn]] void violation(const SymbolInfo& s, const std::string& what, const core::SourceLocation& where) const;

  ShapeEnvOptions options_;
  std::function<core::SourceLocation()> location_;
  std::function<void(const ShapeEvent&)> listener_;
  int next_backed_ = 0;
  int next_unbacked_ = 0;
  std::vector<SymbolInfo> symbols_;
  std::unordered_map<Expr, size_t> symbol_index_;
  std::unordered_map<std::string, Expr> source_symbol_;
  std::unordered_map<int64_t, Expr> duck_;
  std::vector<GuardSet::Static> statics_;
  std::unordered_map<Expr, Expr> replacements_;
  RangeAnalyzer ranges_{ValueRange{2, kIntOo}};
  std::vector<Guard> guards_;
  std::unordered_set<Expr> guard_facts_;  // every fact in guards_, for "already guarded" lookups
  std::vector<Specialization> specializations_;
  std::vector<RuntimeAssert> runtime_asserts_;
  std::unordered_set<Expr> assert_facts_;  // runtime-asserted facts (and their conjuncts), simplified
  std::vector<ShapeEvent> events_;
};

/// The ShapeEnv the SymInt hooks of this thread use (nullptr outside capture).
ShapeEnv* current_shape_env();

/// Makes `env` the current ShapeEnv of this thread for the scope's lifetime (nests; restores the
/// previous one).
class ShapeEnvScope {
 public:
  explicit ShapeEnvScope(ShapeEnv& env);
  ~ShapeEnvScope();
  ShapeEnvScope(const ShapeEnvScope&) = delete;
  ShapeEnvScope& operator=(const ShapeEnvScope&) = delete;

 private:
  ShapeEnv* previous_;
};

}  // namespace protean::sym
