// The symbols a compiled program's kernels receive, in the order both code-generating backends (cpu,
// cuda) pass them: the dispatcher's symbols first (BackendInput::symbols), then every other symbol
// appearing in a value's size, in the unbacked symbol a local_scalar_dense node defines
// (item_symint), or in a runtime assertion, each once, in graph order.
#pragma once

#include <vector>

#include "backend/registry.h"

namespace protean::backend {

std::vector<sym::Expr> kernel_symbols(const BackendInput& in);

}  // namespace protean::backend
