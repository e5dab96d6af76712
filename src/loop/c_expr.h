// C-style rendering of loop-IR expressions, shared by every target that emits C, C++ or CUDA C++:
// index expressions, literals, C types, the table from ScalarOp (loop/scalar_ops.def) to text, and
// a body emitter that turns a scalar expression into `const T tN = ...;` statements with common-
// subexpression elimination. A target renderer (backend/cpu/codegen.cpp: loops, OpenMP, the explicit
// vector forms) builds on it and says what differs through a CDialect: the namespace of its runtime
// header's functions, how it spells fused multiply-add and numeric limits.
//
// Every form is a pattern over {a}, {b} (the operands, already rendered), {T} (the C type of the
// result) and {ns} (CDialect::ns). Output is deterministic: equal expressions give equal text.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "loop/loop_ir.h"

namespace protean::loop {

/// What a C-family target spells its own way.
struct CDialect {
  std::string_view ns = "pt::";                 ///< namespace of the runtime header's functions (pt::exp, pt::maxn, pt::imax)
  std::string_view fma_f32 = "__builtin_fmaf";  ///< f32 a * b + c rounded once (cuda: fmaf)
  std::string_view fma_f64 = "__builtin_fma";   ///< f64 (cuda: fma)
  std::string_view limits = "pt::numeric_limits";  ///< numeric limits template (the runtime header's, cpu and cuda)
  /// f16 and bf16 values are computed in f32 registers (cuda: 16-bit storage, f32 compute): their
  /// temporaries and constants are `float`, f32 fma applies, and a cast to them rounds through
  /// `{ns}round_bf16` / `{ns}round_f16`. Off (cpu): they are their storage type.
  bool half_as_f32 = false;
  /// Pattern of a floating-point division over {a}, {b}, {ns} (empty: C's `/`; cuda: "{ns}fdiv({a}, {b})").
  std::string_view div_float = {};
  /// f32 `a * b + c` (either operand of the add) as one fused multiply-add, {fma_f32}(a, b, c): one
  /// rounding fewer (cuda kernels whose outputs are all 16-bit floats). Off: as written.
  bool contract_f32 = false;
};

/// The scalar form of a function: its pattern, and whether it is a C operator (whose result on a
/// narrow integer type C++ promotes to int, so the renderer casts it back to {T}).
struct CScalarForm {
  const char* pattern;
  bool infix;
};
/// The one table from ScalarOp to C text (a switch without `default:`: -Wswitch names a new op).
CScalarForm c_scalar_form(ScalarOp op);

/// The C type of a dtype's elements (f16/bf16: uint16_t bit patterns).
const char* c_type(DType t);
/// The C type a value of dtype `t` is computed in: c_type, except f16/bf16 under
/// CDialect::half_as_f32 (float).
const char* c_value_type(DType t, const CDialect& d);
/// C text of an index / boolean sym::Expr (operands are non-negative: / and % are floor ops).
std::string c_index(const sym::Expr& e, const CDialect& d);
/// C text of a Const node (NaN and infinities through CDialect::limits).
std::string c_const(const SNode& n, const CDialect& d);
/// `pattern` with its operands, result type and the dialect's namespace filled in.
std::string c_fill(std::string_view pattern, const std::vector<std::string>& a, std::string_view type, const CDialect& d);
/// C text of a Cast, Unary, Binary or Fma node over its rendered operands.
std::string c_apply(const SNode& n, const std::vector<std::string>& a, const CDialect& d);

/// Emits the statements of one loop body with common-subexpression elimination: every Load, Index,
/// Cast, Unary, Binary, Fma and Where node becomes `const T tN = ...;` at `indent` (N from a counter
/// shared by the kernel), once per distinct expression; constants and locals are inlined. The
/// branches of a Where are rendered inline, never hoisted: a load behind a false condition (cat, pad)
/// must not execute.
///
/// A target changes how loads and index expressions read by overriding load() and index() (cuda:
/// a value from a vector load or a register array, bf16 widened to f32; renamed loop variables).
class CBodyEmitter {
 public:
  CBodyEmitter(const CDialect& d, std::string indent, int& counter, std::string& out)
      : d_(d), indent_(std::move(indent)), counter_(counter), out_(out) {}
  virtual ~CBodyEmitter() = default;

  /// Returns a C expression (a temporary's name, a literal or a local) for `e`, emitting statements as needed.
  std::string emit(const SExpr& e);
  /// From now on `e` is the C expression `name` (a value computed earlier, e.g. hoisted out of a loop).
  void bind(const SExpr& e, std::string name);

 protected:
  /// C text of a Load node's value (default: `bN[index]`).
  virtual std::string load(const SNode& n);
  /// CDialect::contract_f32: the fused multiply-add text of `e` (an f32 add of a product), else "".
  std::string contracted(const SExpr& e);
  /// C text of an index expression (default: c_index).
  virtual std::string index(const sym::Expr& e);

 private:
  std::string inline_expr(const SExpr& e);
  const CDialect& d_;
  std::string indent_;
  int& counter_;
  std::string& out_;
  std::unordered_map<std::string, std::string> names_;
};

}  // namespace protean::loop
