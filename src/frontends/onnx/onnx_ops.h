// ONNX operator evaluators (onnx_ops.cpp): one function per op type, each a client of protean/ops.h.
// Host values (shape arithmetic) are handled on the host whenever every input is a host value or a
// small integer constant; otherwise inputs are materialized as tensors.
#pragma once

#include <string>
#include <unordered_map>

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

/// ONNX's int16/uint16/uint32/uint64 values run in a wider carrier dtype (dtype_from_onnx), which
/// holds them exactly but does not wrap at their width. `types` maps value names to their carried ONNX
/// type (graph inputs, initializers, Constant outputs, and what this function adds): for a node that
/// reads a carried value, or casts to a carried type, returns "" when its result stays in range (Max,
/// Min, Mod, comparisons, movement and indexing, BitShift, Cast between carried types that widen...)
/// and records its outputs' carried types; else a reason for the unsupported-feature report (Add, Mul,
/// Sum... could leave the type's range). BitShift gets the attribute `protean_carried_type` (the width
/// it wraps at).
std::string check_carried_types(Node& n, std::unordered_map<std::string, int32_t>& types);

/// Value → Tensor (host values become small integer/bool tensors; traceable when symbolic).
Tensor as_tensor(const Value& v);
/// The value of a Constant node (value / value_float(s) / value_int(s) attributes).
Value constant_value(const Node& n);

}  // namespace protean::onnx::detail
