// Guard programs: the final guard set of a capture compiled into a flat, allocation-free register
// bytecode that the dispatcher runs on every call before reusing a cache entry.
//
// Needs: a GuardSet (ShapeEnv::produce_guards) and a binding of sources to *slots*: indices into an
// int64 array the dispatcher fills from the call's input sizes and int arguments, e.g.
//     slots[0] = x.size(0), slots[1] = x.size(1), slots[2] = y.size(0), slots[3] = n (an int arg)
//     compile_guards(env, {{"x.size()[0]", 0}, {"x.size()[1]", 1}, {"y.size()[0]", 2}, {"n", 3}})
// Each free symbol reads its value from the first bound source; further sources of the same
// symbol (duck sizing) are checked equal to it; sources of replaced symbols are checked against
// the replacement (`Eq(s0, 33)`, `Eq(s1, 2*s0)`); statics are checked against their value.
// Guarantees: evaluate(slots) == every guard of the set holds for the slot values (evaluated with
// floor division; a division by zero makes the guard containing it fail; int64 arithmetic wraps).
// evaluate/first_failure/explain never allocate except explain's returned string.
// Cost: one instruction per load, operator and fused compare-and-check; shared subexpressions are
// computed once (nodes are hash-consed). 20 range/equality guards over 10 inputs run in ~20-40 ns.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "sym/expr.h"
#include "sym/shape_env.h"

namespace protean::sym {

struct GuardCompiler;

struct SourceSlot {
  std::string source;
  int32_t slot;
};

class GuardProgram {
 public:
  /// Registers available to one program (constants + loads + temporaries).
  static constexpr size_t kMaxRegisters = 512;

  /// True when every guard holds.
  bool evaluate(const int64_t* slots) const { return run(slots) < 0; }
  /// Index of the first failing guard, or -1.
  int first_failure(const int64_t* slots) const { return run(slots); }
  /// The first failing guard as text (`Eq(s0, 33)`, `2 <= s0`), or "" when all hold.
  /// with_sources prints sources instead of symbols (`Eq(x.size()[0], 33)`).
  std::string explain(const int64_t* slots, bool with_sources = false) const;

  size_t num_guards() const { return texts_.size(); }
  const std::string& guard_text(size_t i) const { return texts_[i]; }
  const std::string& guard_source_text(size_t i) const { return source_texts_[i]; }
  size_t num_instructions() const { return code_.size(); }
  /// Bytecode listing, one instruction per line (for tests and `PROTEAN_LOGS=guards`).
  std::string dump() const;

  enum class Op : uint8_t {
    Load, Add, Sub, Mul, FloorDiv, CeilDiv, Mod, Max, Min, Pow,
    Eq, Ne, Lt, Le, And, Or, Not,
    Check, CheckEq, CheckNe, CheckLt, CheckLe,
  };
  struct Insn {
    Op op;
    int32_t dst;    ///< destination register (unused by checks)
    int32_t a;      ///< register (or slot for Load)
    int32_t b;      ///< register
    int32_t guard;  ///< guard this instruction belongs to (reported when it fails)
  };

 private:
  friend class GuardProgramBuilder;
  friend struct GuardCompiler;
  int run(const int64_t* slots) const;

  std::vector<Insn> code_;
  std::vector<int64_t> constants_;  ///< registers [0, constants_.size()) start with these values
  size_t num_registers_ = 0;
  std::vector<std::string> texts_;
  std::vector<std::string> source_texts_;
};

/// Incremental construction; compile_guards() below is the usual entry point.
class GuardProgramBuilder {
 public:
  /// The value of `symbol` is slots[slot].
  void bind(Expr symbol, int32_t slot);
  /// Guard: the boolean `cond` (over bound symbols) holds.
  void add_check(Expr cond, std::string text, std::string source_text = {});
  /// Guard: slots[slot] equals the integer expression `value` (over bound symbols).
  void add_slot_equals(int32_t slot, Expr value, std::string text, std::string source_text = {});
  /// Throws std::logic_error for a symbol without a slot or more than kMaxRegisters registers.
  GuardProgram build() const;

 private:
  struct Entry {
    Expr expr;
    int32_t slot;  ///< -1: boolean check; else slot == expr
    std::string text, source_text;
  };
  std::unordered_map<Expr, int32_t> slots_;
  std::vector<Entry> entries_;
};

/// Compiles a produced guard set. Sources not in `bindings` are not read: a symbol used by a check
/// without any bound source throws std::logic_error naming it and its sources.
GuardProgram compile_guards(const GuardSet& guards, const std::vector<SourceSlot>& bindings);
inline GuardProgram compile_guards(const ShapeEnv& env, const std::vector<SourceSlot>& bindings) {
  return compile_guards(env.produce_guards(), bindings);
}

}  // namespace protean::sym
