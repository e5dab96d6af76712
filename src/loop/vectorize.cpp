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
  std::optional<int64_t> d = lane_step(std::move(index), std::move(v));
  return d && *d == 1;
}

std::optional<int64_t> lane_step(sym::Expr e, sym::Expr v) {
  sym::Expr next = sym::substitute(e, {{v, sym::add(v, sym::integer(1))}});
  sym::Expr d = simplify_index(sym::sub(next, e));
  if (!d->is_integer() || d->value > kMaxLaneStep || d->value < -kMaxLaneStep) return std::nullopt;
  return d->value;
}

bool vector_mask(sym::Expr cond, sym::Expr v) {
  using sym::Kind;
  switch (cond->kind) {
    case Kind::Eq: case Kind::Ne: case Kind::Lt: case Kind::Le: case Kind::Gt: case Kind::Ge:
      return lane_step(sym::sub(cond->args[0], cond->args[1]), v).has_value();
    case Kind::And: case Kind::Or: case Kind::Not:
      for (const auto& a : cond->args)
        if (!vector_mask(a, v)) return false;
      return true;
    case Kind::True: case Kind::False: return true;
    case Kind::Integer: case Kind::Symbol: case Kind::Add: case Kind::Mul: case Kind::Pow:
    case Kind::FloorDiv: case Kind::CeilDiv: case Kind::Mod: case Kind::Max: case Kind::Min:
      return false;
  }
  return false;
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

namespace {
bool has_invariant_load(VaryingAnalysis& va, const SExpr& e) {
  if (e->op == SOp::Load && !va.varying(e)) return true;
  for (const auto& a : e->args)
    if (has_invariant_load(va, a)) return true;
  return false;
}
}  // namespace

bool VaryingAnalysis::supported(const SExpr& e) {
  if (!varying(e)) return true;
  // a condition on the index: a mask computed from lane offsets
  if (e->op == SOp::Cast && e->dtype == DType::Bool && e->args[0]->op == SOp::Index)
    return vector_mask(e->args[0]->index, v_);
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
      // a condition that does not vary: both branches are computed, the select picks one. That is
      // safe unless the condition is on the index (cat / pad along an outer dim guard their loads);
      // a condition on data (a fully masked attention row's max == -inf) guards no load.
      if (!varying(e->args[0]))
        return !has_index(e->args[0]) || (!has_varying_load(e->args[1]) && !has_varying_load(e->args[2]));
      // a varying condition: the branches' varying loads are masked by it (or its negation); a load
      // that does not vary would run as a scalar before the select, so a condition on the index
      // (which may guard it: cat, pad) must not have one in its branches
      return !has_index(e->args[0]) || (!has_invariant_load(*this, e->args[1]) && !has_invariant_load(*this, e->args[2]));
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
