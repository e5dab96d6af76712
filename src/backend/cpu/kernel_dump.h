// Kernel replay: every translation unit the cpu backend generates, written under a stable name so that
// two builds of Protean can be compared kernel by kernel (scripts/kernel_replay.sh dump | diff).
//
// PROTEAN_KERNEL_DUMP_DIR=DIR turns it on (read once). For each compile, DIR/<graph>-<hash>.cpp receives
// the generated kernels (no prelude: that is written once, to DIR/prelude.h), where <graph> is the graph's
// name reduced to [A-Za-z0-9_] and <hash> the xxhash64 of the graph's IR text as the backend received it
// (before any cpu-specific rewrite) and of its size arguments. The name therefore depends only on what
// capture and the graph passes produced, never on the loop stage or codegen, which is what a refactor of
// those stages is checked against. Files are written to a temporary name and renamed, so concurrent test
// processes compiling the same graph leave one whole file. A write error is a warning, never the compile's
// failure.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"
#include "sym/expr.h"

namespace protean::backend::cpu {

/// True when PROTEAN_KERNEL_DUMP_DIR is set and non-empty.
bool kernel_dump_enabled();
/// Writes `kernels` (and, once per directory, `prelude`) for graph `g` compiled with size arguments
/// `symbols`. Does nothing when the dump is off.
void dump_kernels(const ir::Graph& g, const std::vector<sym::Expr>& symbols, const std::string& prelude,
                  const std::string& kernels);

}  // namespace protean::backend::cpu
