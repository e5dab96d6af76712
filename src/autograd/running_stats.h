// Running statistics (BatchNorm's running_mean / running_var) written by a training-mode op.
//
// Eagerly the new values are written into the buffer's storage. While a compiled training step is
// traced, the module's buffers are graph inputs (FakeTensors) bound to the buffers' TensorImpls
// (detail::BufferBinding, include/protean/optim.h); a write re-points the buffer's TensorImpl to the
// new traced value, so a later read in the same trace sees it, and the step returns the buffers'
// final values as graph outputs, donated back into the buffers' memory. A write to anything else while
// tracing (a buffer that is a graph constant, or an input of an ordinary compiled function) is
// refused with NotImplementedError: it would be lost or baked into the graph.
#pragma once

#include "protean/tensor.h"

namespace protean::autograd::detail {

/// Marks `impl` as a buffer the trace on this thread may rewrite (BufferBinding); unmark restores and
/// says whether the trace rewrote it (write_running_stat) while it was marked.
void mark_traced_buffer(const TensorImpl* impl);
bool unmark_traced_buffer(const TensorImpl* impl);

/// Writes `value` (same sizes; cast to dst's dtype) into buffer `dst` as described above. `who` and
/// `what` name the op and the buffer in errors.
void write_running_stat(const Tensor& dst, const Tensor& value, const char* who, const char* what);

}  // namespace protean::autograd::detail
