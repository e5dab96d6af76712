// Segmented execution: how a compiled function that hit a graph break keeps running compiled.
//
// A C++ function cannot be resumed in the middle of its body, so after a graph break the frame runs
// the user's body on every call, on the real arguments, with a lazy recorder installed as the
// thread's TraceHook:
//  * every op call is recorded into the current *segment* (a small struct per op; outputs are lazy
//    tensors: TensorImpls with metadata and no storage);
//  * a host read of a lazy tensor (item, data_ptr, to_vector, printing), protean::graph_break(), a
//    data-dependent op (nonzero) or a host access to a real tensor that pending ops read ends the
//    segment: its ops become a sub-program whose inputs are the real tensors it reads and whose outputs
//    are the lazy tensors still referenced by the body. The sub-program is dispatched through its own
//    frame (own frame id, guards, automatic dynamic, recompiles, cache), the lazy tensors receive the
//    real results in place, and the body continues with real values;
//  * when the body returns, the last segment runs the same way.
// A segment's frame is keyed by the segment index within the call and a hash of the segment's
// structure (ops, attributes, wiring, outputs), so a body that takes another path after a break gets
// another segment frame. Side effects of the body happen on every call, as written. Calls of other
// compiled functions inside a segmented body are recorded inline. A protean::cond is recorded as
// one node with its branches traced into subgraphs (capture/cond.h) and re-traced by the segment's
// capture; a cond whose branch reads the host ends the segment, reads its predicate and records the
// taken branch inline.
#pragma once

#include <span>
#include <vector>

#include "capture/frame.h"

namespace protean::capture {

/// Runs one call of the segmented frame `f` on real `args`; `outs` receives real results.
/// Throws whatever the body, an op or a segment's compile throws.
void run_segmented(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                   std::vector<detail::OutValue>& outs);

}  // namespace protean::capture
