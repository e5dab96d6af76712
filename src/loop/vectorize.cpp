#include "loop/vectorize.h"

namespace protean::loop {

namespace {
bool has_index(const SExpr& e) {
  if (e->op == SOp::Index) return true;
  for (const auto& a : e->args)
    if (has_index(a)) return true;
  return false;
}
/// True for the ordered comparisons (lt le gt ge), whose vector form needs f32 operands.
bool ordered_comparison(ScalarOp f) { return f == ScalarOp::lt || f == ScalarOp::le || f == ScalarOp::gt || f == ScalarOp::ge; }
}  // namespace

bool unit_stride(sym::Expr index, sym::Expr v) {
  sym::Expr next = sym::substitute(index, {{v, sym::add(v, sym::integer(1))}});
  sym::Expr d = simplify_index(sym::sub(next, index));
  return d->is_integer() && d->value == 1;
}

bool VaryingAnalysis::varying(const SExpr& e) {
  if (auto it = varying_.find(e.get()); it != varying_.end()) return it->second;
  bool r = (e->op == SOp::Load || e->op == SOp::Index) && sym::has_symbol(e->index, v_);
  for (const auto& a : e->args) r = varying(a) || r;
  return varying_[e.get()] = r;
}

bool VaryingAnalysis::has_varying_load(const SExpr& e) {
  if (e->op == SOp::Load && varying(e)) return true;
  for (const auto& a : e->args)
    if (has_varying_load(a)) return true;
  return false;
}

bool VaryingAnalysis::supported(const SExpr& e) {
  if (!varying(e)) return true;
  if (e->dtype != DType::F32 && e->dtype != DType::Bool) return false;
  for (const auto& a : e->args)
    if (!supported(a)) return false;
  switch (e->op) {
    case SOp::Load: return e->dtype == DType::F32 && unit_stride(e->index, v_);
    case SOp::Index: return false;
    case SOp::Cast: {
      const DType from = e->args[0]->dtype;
      return from == DType::F32 || from == DType::Bool;
    }
    // a mask function on masks, every other function on f32 values
    case SOp::Unary: return (e->fn == ScalarOp::logical_not) == (e->dtype == DType::Bool);
    case SOp::Binary: {
      const DType a = e->args[0]->dtype;
      if (e->fn == ScalarOp::logical_and || e->fn == ScalarOp::logical_or) return a == DType::Bool;
      if (e->fn == ScalarOp::eq || e->fn == ScalarOp::ne) return true;
      if (ordered_comparison(e->fn)) return a == DType::F32;
      return e->dtype == DType::F32;
    }
    case SOp::Fma: return true;  // f32, checked above
    case SOp::Where:
      if (!has_varying_load(e->args[1]) && !has_varying_load(e->args[2])) return true;
      return varying(e->args[0]) && !has_index(e->args[0]);
    case SOp::Const:
    case SOp::Local: return true;
  }
  return false;
}

bool vectorizable_stage(const Stage& s, sym::Expr v) {
  if (s.body->dtype != DType::F32) return false;
  if (!VaryingAnalysis(v).supported(s.body)) return false;
  if (s.kind == StageKind::Pointwise && !unit_stride(s.out_index, v)) return false;
  return s.stash < 0 || unit_stride(s.stash_index, v);
}

}  // namespace protean::loop
