// Post-op fusion: the cpu backend's graph pass before lowering (pipeline.cpp).
//
// A conv1d / conv2d / conv_transpose2d / linear / matmul Call (an extern step: a oneDNN kernel)
// whose f32 result feeds only an elementwise chain is replaced by one *_fused Call (ops.def) whose
// `post_ops` attribute is the chain (src/ops/post_ops.h), so oneDNN applies the chain to each
// output block while it is in registers instead of a generated kernel making another pass over
// memory. Recognized links, each on the current value v with no other users and not a graph output,
// result of the same shape and dtype (f32):
//   relu sigmoid tanh silu hardswish hardsigmoid gelu clamp (ops)
//   v·sigmoid(c·v) and v·sigmoid(v)                   → swish(c), swish(1)
//   v·clamp(v + 3, 0, 6) / 6 and v·hardsigmoid(v)     → hardswish  (ONNX exporters spell it out)
//   v + c, v − c, v·c, c·v (c a scalar constant)      → linear(a, b); v / c → div
//   v ∘ t, t ∘ v for ∘ in + ·, v − t, v / t           → add/mul/sub/div(t) when t is a scalar or a
//        per-channel tensor (only the channel dim ≠ 1: dim 1 of a batched conv, the last dim of
//        linear/matmul), or t has v's shape (a residual; for convolutions only as the first post-op,
//        where oneDNN keeps its fast kernels)
//   batch_norm(v, w, b, mean, var)                    → per-channel scale/shift constants when the
//        parameters are constants, else the batch_norm post-op
// A tensor operand that would broadcast v to a larger shape never fuses (the output shape is fixed).
// Constant folding into weights: when the base op's weight (and bias) are Constants, leading
// per-channel affine links with constant operands (scalar/per-channel mul, add, sub, div, linear,
// constant batch_norm) are folded into a new weight and bias (w'[o] = w[o]·s[o], b' = b·s + t),
// as ONNX Runtime does for Conv+BatchNormalization; this changes rounding, not the math.
//
// Needs: a structurally valid graph in topological order. Guarantees: the same outputs up to
// rounding; Placeholders, graph outputs, and every value's type unchanged; no new symbols; dead
// constants removed (values renumbered, Graph::compact). The frame's graph is not changed: the
// backend runs this on its own copy.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::backend::cpu {

struct FusePostOpsStats {
  int64_t fused_calls = 0;       ///< extern Calls that took a post-op list
  int64_t post_ops = 0;          ///< post-ops in those lists
  int64_t folded_links = 0;      ///< links folded into constant weights instead
  int64_t nodes_removed = 0;     ///< Calls the fusion replaced
};

/// Rewrites `g` in place (entry point of this pass).
FusePostOpsStats fuse_post_ops(ir::Graph& g);

}  // namespace protean::backend::cpu
