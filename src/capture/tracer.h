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
//  * A host read of a FakeTensor's data or a data-dependent op is a graph break: a CompileError for now.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "capture/cache_entry.h"
#include "capture/frame.h"

namespace protean::capture {

/// Traces `frame`'s function on `args`, builds the entry (guards, slots, input/output mapping, graph;
/// no artifact yet). Throws CompileError for graph breaks and strict-mark violations.
std::unique_ptr<CacheEntry> trace_frame(detail::CompiledFunctionImpl& frame, std::span<const detail::ArgValue> args,
                                        const std::string& compile_id);

/// "graph break: <reason> at f.cpp:12 (graph breaks are not supported yet; fullgraph=true errors the
/// same way)" — thrown as CompileError.
[[noreturn]] void throw_graph_break(const std::string& reason);

}  // namespace protean::capture
