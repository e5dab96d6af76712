// Tracer: runs the user's function on FakeTensors with a fresh ShapeEnv and records a Graph IR plus
// everything needed to build the cache entry's guards (see trace_frame).
//
// Capture semantics:
//  * Each tensor argument becomes a Placeholder whose sizes follow the dimension policy
//    (dynamic/policy.h); SymInt arguments become symbols when dynamic, other ints/bools/strings/
//    floats are constants guarded by value. Dynamic floats become 0-dim f64 placeholders: a scalar
//    op operand (`x * alpha`) reads the placeholder; a float baked anywhere else gets a value guard.
//  * Module parameters/buffers become placeholders `self.<name>`; other real tensors reaching an op
//    become Constants (baked in, unguarded).
//  * Every Call node carries the user's file:line (capture/location.h).
//  * A host read of a FakeTensor's data (item, data_ptr, to_vector, printing), a data-dependent op
//    (nonzero, unless capture_scalar_outputs) or protean::graph_break() is a graph break: the tracer
//    throws GraphBreakError and the frame switches to segmented execution (capture/segments.h), or
//    reports an error under fullgraph.
//  * protean::cond records one `cond` node owning both branches, each traced into a subgraph that
//    shares this trace's ShapeEnv (capture/cond.h); a host read inside a branch breaks the frame.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "capture/cache_entry.h"
#include "capture/frame.h"
#include "capture/graph_break.h"

namespace protean::capture {

/// Traces `frame`'s function on `args`, builds the entry (guards, slots, input/output mapping, graph;
/// no artifact yet). Throws CompileError for graph breaks and strict-mark violations.
std::unique_ptr<CacheEntry> trace_frame(detail::CompiledFunctionImpl& frame, std::span<const detail::ArgValue> args,
                                        const std::string& compile_id);

/// A FakeTensor of type `m` (sizes, strides, storage offset, dtype, device; no storage) standing for
/// value `v` of the graph that `tracer` records: its TraceRef is {tracer, v}, so that tracer maps it
/// back to `v` when an op reads it, and a host read of its data is a graph break. Used by the frame's
/// Tracer and by cond's BranchTracer (capture/cond.h).
Tensor make_fake(const TensorMeta& m, const void* tracer, ir::ValueId v);

}  // namespace protean::capture
