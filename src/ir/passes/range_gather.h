// Range gather as a slice: index_select(x, dim, i) whose index i is arange(0, n) (through reshapes,
// views and unsqueezes, which keep the flat order) reads rows 0 .. n-1 of x in order, which is
// slice(x, dim, 0, n): a view instead of a gather. Exported transformers look up their position
// embeddings this way (ONNX Gather(wpe, Range(0, L)), `wpe(torch.arange(T))`); as a slice the lookup
// is an indexed read inside the kernel that adds it to the token embedding, so the gather's launch
// and its index kernel go away.
//
// Needs: a structurally valid graph. Guarantees: the same outputs for every call the original accepts.
// A gather past x's rows fails in the original (an out-of-bounds index), so the slice must not read
// there: a concrete n > size is left as a gather; a symbolic n gets a runtime assertion n <= size,
// appended to `asserts` (BackendInput::runtime_asserts; every backend checks it before it runs a call,
// and its message names the op and the table's size). Without `asserts`, or where n or the size
// depends on a symbol that the inputs' sizes do not bind (u0 of a data-dependent op), a symbolic n is
// left alone.
// Only a 1-D index, an arange with concrete start 0 and step 1 and dtype i64 or i32. The rewritten
// node keeps its output value (same name, sizes, dtype), so nothing downstream changes; the arange
// and the views left unused go to dead code elimination.
#pragma once

#include <vector>

#include "ir/graph.h"
#include "sym/shape_env.h"

namespace protean::ir {

/// Returns the number of index_select nodes rewritten.
size_t range_gather_as_slice(Graph& g, std::vector<sym::RuntimeAssert>* asserts);

}  // namespace protean::ir
