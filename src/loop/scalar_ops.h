// ScalarOp: the scalar functions of loop IR (loop/scalar_ops.def), with their text names and the
// properties lowering and scheduling read. Renderers map each one to their own text with a switch
// over ScalarOp (no `default:`), so a new function is a build error wherever it has no form yet.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace protean::loop {

enum class ScalarOp : uint8_t {
#define PT_SCALAR(op, name, arity, call) op,
#include "loop/scalar_ops.def"
};

inline constexpr size_t kNumScalarOps = 0
#define PT_SCALAR(op, name, arity, call) +1
#include "loop/scalar_ops.def"
    ;

/// The loop IR text name ("exp", "max", "and").
std::string_view scalar_name(ScalarOp op);
/// 1 (an SOp::Unary node) or 2 (SOp::Binary).
int scalar_arity(ScalarOp op);
/// True for a function worth not evaluating twice (the `call` column of scalar_ops.def).
bool scalar_is_call(ScalarOp op);
/// The op whose text name is `name`; nullopt when there is none.
std::optional<ScalarOp> scalar_from_name(std::string_view name);

}  // namespace protean::loop
