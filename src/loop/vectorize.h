// Vectorizability of a loop body along its innermost variable: the analysis a schedule policy uses to
// choose the explicit vector form and a renderer uses to print it (which values are vectors).
//
// The explicit vector form runs W consecutive values of the innermost variable `v` per step: a value
// that depends on v through a load (or an index) is a vector (f32 values, or masks for bool), every
// other value stays a scalar, broadcast where a vector needs it.
#pragma once

#include <optional>
#include <unordered_map>

#include "loop/loop_ir.h"

namespace protean::loop {

/// True when `index` advances by exactly one element per step of `v` (for every value of the other
/// variables), so W consecutive steps read or write W adjacent elements.
bool unit_stride(sym::Expr index, sym::Expr v);

/// The lane step of an integer index expression along `v`: the constant c with e(v + 1) - e(v) = c for
/// every value of the other variables, or nullopt when there is none (e is not linear in v) or when
/// |c| > kMaxLaneStep.
std::optional<int64_t> lane_step(sym::Expr e, sym::Expr v);
inline constexpr int64_t kMaxLaneStep = int64_t{1} << 20;

/// True when the boolean index expression `cond` (a relation Eq..Ge of integer expressions, or And /
/// Or / Not of such) has a vector mask form along `v`: every relation's difference of sides has a
/// lane step. Its lanes are then computed from the difference at the first lane plus step × lane.
bool vector_mask(sym::Expr cond, sym::Expr v);

/// Which nodes of a body vary with the vector variable (memoized per node).
class VaryingAnalysis {
 public:
  explicit VaryingAnalysis(sym::Expr v) : v_(std::move(v)) {}
  const sym::Expr& var() const { return v_; }
  /// True when `e` depends on the vector variable through a load (or an index).
  bool varying(const SExpr& e);
  /// True when `e` holds a load that varies.
  bool has_varying_load(const SExpr& e);
  /// True when a body has the explicit vector form: its varying values are f32 or bool, its varying
  /// loads are unit-stride f32 loads, a varying condition on the index (a causal mask, cat, pad) is a
  /// bool Cast of an Index with a vector_mask form, and no select would execute a load its condition
  /// guards against: under a varying condition on the index every load of the branches varies and is
  /// rendered as a masked load (only the lanes the select takes are read), and under a condition
  /// on the index that does not vary no branch loads a varying value (a condition on data guards
  /// no load: load indices never depend on data).
  bool supported(const SExpr& e);

 private:
  sym::Expr v_;
  std::unordered_map<const SNode*, bool> varying_;
};

/// True when stage `s` can run its innermost loop (variable `v`) in the explicit vector form: an f32
/// body VaryingAnalysis supports, stored (and stashed) at unit stride.
bool vectorizable_stage(const Stage& s, sym::Expr v);

}  // namespace protean::loop
