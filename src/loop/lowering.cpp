#include "loop/lowering.h"

#include <array>

#include "protean/error.h"

namespace protean::loop {

using ops::OpKind;

namespace {
// The `scalar` column of lowering.def: `none` or a ScalarOp's name.
namespace row_scalar {
inline constexpr std::optional<ScalarOp> none{};
#define PT_SCALAR(op, name, arity, call) inline constexpr std::optional<ScalarOp> op{ScalarOp::op};
#include "loop/scalar_ops.def"
}  // namespace row_scalar

constexpr LoweringRow kRows[] = {
#define PT_LOWER(op, how, rule, scalar, note) {OpKind::op, Lowering::how, LowerRule::rule, row_scalar::scalar, note},
#include "loop/lowering.def"
};

constexpr int rows_of(OpKind op) {
  int n = 0;
  for (const LoweringRow& r : kRows) n += r.op == op;
  return n;
}

// One check per op of ops.def: an op added there without a row here stops the build, naming it.
#define PT_OP(name, inputs, outputs, category, flags)                                                \
  static_assert(rows_of(OpKind::name) == 1,                                                          \
                "src/loop/lowering.def needs exactly one row for op '" #name "' of src/ops/ops.def " \
                "(PT_LOWER(" #name ", Lowered | Decomposed | Extern, rule, scalar, note))");
#include "ops/ops.def"
static_assert(std::size(kRows) == ops::kNumOps, "src/loop/lowering.def and src/ops/ops.def list a different number of ops");

constexpr std::array<uint16_t, ops::kNumOps> row_index() {
  std::array<uint16_t, ops::kNumOps> r{};
  for (size_t i = 0; i < std::size(kRows); ++i) r[static_cast<size_t>(kRows[i].op)] = static_cast<uint16_t>(i);
  return r;
}
constexpr std::array<uint16_t, ops::kNumOps> kRowIndex = row_index();
}  // namespace

const LoweringRow& lowering_row(OpKind op) {
  const auto i = static_cast<size_t>(op);
  if (i >= ops::kNumOps) throw CompileError("lowering table: op kind " + std::to_string(i) + " is not an op of ops.def");
  return kRows[kRowIndex[i]];
}

std::string_view lowering_name(Lowering how) {
  switch (how) {
    case Lowering::Lowered: return "lowered";
    case Lowering::Decomposed: return "decomposed";
    case Lowering::Extern: return "extern";
  }
  return "?";
}

std::string_view rule_name(LowerRule rule) {
  switch (rule) {
#define PT_RULE(r) \
  case LowerRule::r: return #r;
    PT_RULE(abs) PT_RULE(cast) PT_RULE(rounding) PT_RULE(clamp) PT_RULE(unary) PT_RULE(logical_not) PT_RULE(binary)
    PT_RULE(pow) PT_RULE(compare) PT_RULE(logical) PT_RULE(where) PT_RULE(expand) PT_RULE(permute) PT_RULE(reshape)
    PT_RULE(select) PT_RULE(slice) PT_RULE(squeeze) PT_RULE(unsqueeze) PT_RULE(cat) PT_RULE(clone) PT_RULE(pad)
    PT_RULE(arange) PT_RULE(full) PT_RULE(gelu) PT_RULE(silu) PT_RULE(hardsigmoid) PT_RULE(hardswish) PT_RULE(reduce)
    PT_RULE(mean_var) PT_RULE(softmax) PT_RULE(norm) PT_RULE(batch_norm) PT_RULE(attention) PT_RULE(extern_call)
    PT_RULE(cond)
#undef PT_RULE
  }
  return "?";
}

}  // namespace protean::loop
