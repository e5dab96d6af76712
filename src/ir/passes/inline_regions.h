// Region inlining: every call_region node replaced by its body's nodes.
// Regional compilation (capture/region.h) traces a repeated module once per key and records one
// call_region per use, whose subgraph is the body. The interp and cpu backends run the body as a
// program of its own; a backend without region calls (cuda: one NVRTC unit and one launch plan per
// graph, kernel dedup keeping equal bodies' kernels once) takes the flat graph this pass makes, so the
// capture still happens once per key and only the backend sees every use. Nested regions are inlined
// too. The call's inputs feed the body's placeholders in order (operands, then the instance's
// parameters); its outputs become the body's outputs; body nodes keep their source locations.
// Needs: a structurally valid graph (verifier.h). Guarantees: the same values at the outputs, no
// call_region node at any depth outside cond branches' own call_regions (cond subgraphs are inlined
// in turn); values renumbered in the new order. Mirrors what torch.compile's regional compilation
// does when a nested compiled region is inlined into its caller's graph.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

/// A copy of `g` with every call_region inlined (recursively, cond branches included). Returns `g`
/// unchanged (a copy) when it has none. Throws CompileError when a call_region's body does not take
/// its inputs or give its outputs (count or type mismatch).
Graph inline_regions(const Graph& g);

/// Whether `g` or any graph nested in it has a call_region node.
bool has_regions(const Graph& g);

}  // namespace protean::ir
