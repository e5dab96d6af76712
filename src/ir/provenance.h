// Backward provenance: while a reverse-mode rule runs under capture, the source line of the forward
// op it differentiates, so the ops the rule records print `# [bwd of file:line]`. Set by the autograd
// engine (src/autograd), read by the tracer (src/capture); both sit above this layer.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

/// The forward op's line while a rule runs under capture; null otherwise.
inline thread_local const core::SourceLocation* t_backward_provenance = nullptr;

}  // namespace protean::ir
