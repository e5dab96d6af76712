// Small SymInt helpers shared by the IR printer, parser, verifier, passes and the interpreter. They talk
// to the sym engine (src/sym/expr.h) directly so the IR does not depend on the capture-time SymInt
// hooks (which record guards): nothing here ever guards or specializes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>

#include "protean/symint.h"
#include "sym/expr.h"

namespace protean::ir {

/// Concrete values of symbols, keyed by the (hash-consed) symbol node.
using SymbolValues = std::unordered_map<sym::Expr, int64_t>;

/// The expression of `s` (an Integer node when `s` is concrete).
sym::Expr to_expr(const SymInt& s);
/// A SymInt for `e`: concrete when `e` is an integer, else symbolic with `hint`.
SymInt from_expr(sym::Expr e, int64_t hint);
/// IR text of a size or integer attribute: `512`, `s0`, `2*s0 + 1` (sym::print for symbolic values).
std::string symint_text(const SymInt& s);
/// "[2, s0]".
std::string symints_text(const SymIntVec& v);
/// Structural equality: concrete values compare by value, symbolic ones by expression node.
bool same_symint(const SymInt& a, const SymInt& b);
bool same_symints(const SymIntVec& a, const SymIntVec& b);
/// Row-major strides of `sizes`, built without guards.
SymIntVec contiguous_strides_of(const SymIntVec& sizes);
/// The value of `s` under `values`. Throws CompileError naming the symbol when one is unbound.
int64_t evaluate_symint(const SymInt& s, const SymbolValues& values);

}  // namespace protean::ir
