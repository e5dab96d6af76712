// Parser of the loop text form (loop_ir.h: to_text), so that scheduling and rendering tests start from
// text instead of from a graph that lowers into the program they want.
//
// Reads what to_text prints: the program line and its size symbols, buffers (dtype, sizes, kind, input
// index, slot, `extern`), kernels with their stages (typed bodies: constants carry their dtype), the
// schedule line and each stage's `{...}` schedule, extern steps (op name, inputs, outputs; only the
// `post_ops` attribute, the one to_text prints), releases and the returned buffers.
// Guarantees: to_text(parse(to_text(p))) == to_text(p) for a program without cond externs, whose
// branch programs the text does not hold (parsing one throws), and the result passes loop::verify.
// The dtype of a Unary/Binary node is read from its operands: bool for comparisons and logical
// functions, the first operand's dtype otherwise (what lowering builds).
// Errors: FormatError "loop parse error at line N: expected ..., got '...'", or the verifier's
// CompileError for a program that reads but breaks an invariant.
#pragma once

#include <string_view>

#include "loop/loop_ir.h"

namespace protean::loop {

Program parse_program(std::string_view text);

}  // namespace protean::loop
