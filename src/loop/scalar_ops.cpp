#include "loop/scalar_ops.h"

#include <array>

namespace protean::loop {

namespace {
struct ScalarRow {
  std::string_view name;
  int arity;
  bool call;
};
constexpr std::array<ScalarRow, kNumScalarOps> kScalarRows = {{
#define PT_SCALAR(op, name, arity, call) {name, arity, call},
#include "loop/scalar_ops.def"
}};
const ScalarRow& row(ScalarOp op) { return kScalarRows[static_cast<size_t>(op)]; }
}  // namespace

std::string_view scalar_name(ScalarOp op) { return row(op).name; }
int scalar_arity(ScalarOp op) { return row(op).arity; }
bool scalar_is_call(ScalarOp op) { return row(op).call; }

std::optional<ScalarOp> scalar_from_name(std::string_view name) {
  for (size_t i = 0; i < kNumScalarOps; ++i)
    if (kScalarRows[i].name == name) return static_cast<ScalarOp>(i);
  return std::nullopt;
}

}  // namespace protean::loop
