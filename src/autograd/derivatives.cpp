// The derivative table compiled from src/ops/derivatives.def: one decision per op of ops.def, checked
// at compile time (static_assert) and by tests/unit/autograd_table_test.cpp (which names the op).
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "autograd/rules.h"

namespace protean::autograd {
namespace {

constexpr std::array<int, ops::kNumOps> decision_counts() {
  std::array<int, ops::kNumOps> c{};
#define PT_GRAD(op, saves, note) ++c[static_cast<size_t>(ops::OpKind::op)];
#define PT_NOGRAD(op, reason) ++c[static_cast<size_t>(ops::OpKind::op)];
#define PT_UNSUPPORTED(op, reason) ++c[static_cast<size_t>(ops::OpKind::op)];
#include "ops/derivatives.def"
  return c;
}
constexpr bool every_op_decided_once() {
  for (int n : decision_counts())
    if (n != 1) return false;
  return true;
}
static_assert(every_op_decided_once(),
              "src/ops/derivatives.def must hold exactly one PT_GRAD / PT_NOGRAD / PT_UNSUPPORTED row per op of "
              "ops.def (tests/unit/autograd_table_test.cpp names the op)");

std::array<DerivativeRow, ops::kNumOps> build_table() {
  std::array<DerivativeRow, ops::kNumOps> t{};
#define PT_GRAD(op, saves, note) t[static_cast<size_t>(ops::OpKind::op)] = {Derivative::Rule, saves, &rule_##op, note, true};
#define PT_NOGRAD(op, reason) t[static_cast<size_t>(ops::OpKind::op)] = {Derivative::NoGradient, SaveNone, nullptr, reason, true};
#define PT_UNSUPPORTED(op, reason) \
  t[static_cast<size_t>(ops::OpKind::op)] = {Derivative::Unsupported, SaveNone, nullptr, reason, true};
#include "ops/derivatives.def"
  return t;
}

}  // namespace

const DerivativeRow& derivative_row(ops::OpKind op) {
  static const std::array<DerivativeRow, ops::kNumOps> table = build_table();
  return table[static_cast<size_t>(op)];
}

Derivative derivative_of(const std::string& op_name) {
  auto op = ops::op_from_name(op_name);
  if (!op) throw ValueError(fmt::format("derivative_of: unknown op '{}'", op_name));
  return derivative_row(*op).kind;
}
std::string derivative_note(const std::string& op_name) {
  auto op = ops::op_from_name(op_name);
  if (!op) throw ValueError(fmt::format("derivative_note: unknown op '{}'", op_name));
  return derivative_row(*op).note;
}

Tensor size_scalar(const SymInt& n, DType dtype) {
  if (!n.is_symbolic()) return scalar(static_cast<double>(n.hint()), dtype);
  return reshape(cast(arange(n, n + 1, 1, DType::I64), dtype), SymIntVec{});
}

IntVec reduced_dims(const ops::Attrs& a, int64_t r) {
  IntVec dims = a.has("dims") ? a.ints("dims") : IntVec{};
  IntVec out;
  if (dims.empty()) {
    for (int64_t i = 0; i < r; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) out.push_back(wrap(d, r));
  std::sort(out.begin(), out.end());
  if (r == 0) out.clear();
  return out;
}

Tensor expand_back(const Tensor& g, const IntVec& dims, bool keepdim, const SymIntVec& sizes) {
  Tensor t = g;
  if (!keepdim)
    for (int64_t d : dims) t = unsqueeze(t, d);
  return expand(t, sizes);
}

SymInt count_of(const SymIntVec& sizes, const IntVec& dims) {
  SymInt n = 1;
  for (int64_t d : dims) n = n * sizes[static_cast<size_t>(d)];
  return n;
}

}  // namespace protean::autograd
