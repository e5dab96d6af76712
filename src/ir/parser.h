// IR text parser: the inverse of printer.h.
//
// Needs: text in the form printed by ir::print (see graph.h / printer.h). Also accepts blank lines,
// comment-only lines (`# ...`), and any whitespace between tokens inside a line.
// Nested graphs (a cond's branches: `graph name(...):` blocks after the node line, up to their own
// `return`) become the node's subgraphs; indentation is not significant.
// Guarantees: print(parse(print(g))) == print(g) for every graph g. Value names are kept exactly;
// placeholders get source == name. Sizes and integer attributes that mention symbols become
// symbolic SymInts over sym::symbol(name) (the same hash-consed symbols as the capture's ShapeEnv);
// their hints come from ParseOptions::hints (default_hint for symbols not listed). Not recovered from
// text: constant data (Constant nodes hold an undefined Tensor), strides (contiguous), the function
// name of a source location.
// Errors: protean::FormatError "ir parse error at LINE:COL: expected ..., got '...'" followed by
// the offending line and a caret.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ir/graph.h"

namespace protean::ir {

struct ParseOptions {
  /// Hints for symbols by name ("s0" → 8).
  std::unordered_map<std::string, int64_t> hints;
  /// Hint for symbols not in `hints` (2: the smallest value of a backed size symbol's range).
  int64_t default_hint = 2;
};

Graph parse(std::string_view text, const ParseOptions& options = {});

}  // namespace protean::ir
