// ONNX operator evaluators (onnx_ops.cpp): one function per op type, each a client of protean/ops.h.
// Host values (shape arithmetic) are handled on the host whenever every input is a host value or a
// small integer constant; otherwise inputs are materialized as tensors.
#pragma once

#include <string>

#include "frontends/onnx/onnx_ir.h"

namespace protean::onnx::detail {

struct OpDef {
  OpFn fn = nullptr;
  /// Load-time check of attributes/inputs this importer does not support for an otherwise known op:
  /// returns "" when supported, else a short reason ("mode 'linear' (only 'nearest')").
  std::string (*check)(const Node& n) = nullptr;
};

/// The evaluator of `op_type` in the default domain, or nullptr when unsupported. Constant and If
/// have entries with fn == nullptr (the model evaluates them itself).
const OpDef* find_op(const std::string& op_type);

/// Throws TypeError when a sequence value reaches an input of an op that takes tensors (only the
/// sequence ops and Identity take sequences).
void check_sequence_inputs(const Node& n, const Inputs& in);

/// Value → Tensor (host values become small integer/bool tensors; traceable when symbolic).
Tensor as_tensor(const Value& v);
/// The value of a Constant node (value / value_float(s) / value_int(s) attributes).
Value constant_value(const Node& n);

}  // namespace protean::onnx::detail
