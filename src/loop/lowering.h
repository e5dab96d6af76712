// The lowering table (loop/lowering.def): for every op, whether lowering builds loop IR for it
// directly, decomposes it into reductions and pointwise expressions, or runs it as an Extern step,
// and which rule of loop/lower.cpp or loop/decompose.cpp does it.
//
// Every op of src/ops/ops.def has exactly one row: lowering.cpp checks that at compile time, one
// static_assert per op, whose message names the op without a row. Lowering dispatches on the row's
// rule with a switch over LowerRule (no `default:`), so a new rule is a build error until it has code.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "loop/scalar_ops.h"
#include "ops/registry.h"

namespace protean::loop {

enum class Lowering : uint8_t {
  Lowered,     ///< a lowering rule builds its scalar expression or index arithmetic
  Decomposed,  ///< rewritten into reductions and pointwise expressions (loop/decompose.h)
  Extern,      ///< an Extern step runs its eager kernel
};

/// The code that lowers an op (several ops share one rule; the row's scalar op tells them apart).
enum class LowerRule : uint8_t {
  // pointwise (loop/lower.cpp)
  abs, cast, rounding, clamp, unary, logical_not, binary, pow, compare, logical, where,
  // views and movement (loop/lower.cpp)
  expand, permute, reshape, select, slice, squeeze, unsqueeze, cat, clone, pad,
  // factories (loop/lower.cpp)
  arange, full,
  // decompositions (loop/decompose.cpp)
  gelu, silu, hardsigmoid, hardswish, reduce, mean_var, softmax, norm, batch_norm, attention,
  // extern steps
  extern_call, cond,
};

struct LoweringRow {
  ops::OpKind op;
  Lowering how;
  LowerRule rule;
  std::optional<ScalarOp> scalar;  ///< the function node the rule builds, when it builds one
  std::string_view note;           ///< the decomposition, or why the op is an extern
};

/// The row of `op`.
const LoweringRow& lowering_row(ops::OpKind op);
std::string_view lowering_name(Lowering how);
std::string_view rule_name(LowerRule rule);

}  // namespace protean::loop
