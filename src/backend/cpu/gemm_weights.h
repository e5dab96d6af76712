// Packed matmul weights: the cpu backend's graph pass that says which linear / matmul weights the
// kernel may keep in oneDNN's blocked layout across calls (pipeline.cpp, after post-op fusion).
//
// oneDNN's matmul kernels (brgemm) read the weights in a blocked layout; given plain weights they
// copy them into that layout inside every call — for a 1024×1024 f32 weight 4 MiB read and 4 MiB
// written per call, as much memory traffic as the product itself at batch 1–8. The kernels in
// src/ops/linear.cpp keep a packed copy instead when the node's `weights` attribute allows it:
//  * weights="constant": input 1 is a graph Constant (ONNX initializers, folded weights): packed on
//    the first call and kept while its storage lives;
//  * weights="reuse": input 1 is a graph input (a parameter or a weight passed as an argument):
//    packed on the second call that sees the same storage at the same version (tensor_version.h),
//    reused while both stay, repacked after an in-place write (an optimizer step bumps the version).
//    A weight that changes on every call (an activation, a parameter under training) is never
//    packed: the first sighting only records it and the call runs on the plain layout.
// The weight must be 2-D (one matrix for the whole batch); batched right operands stay plain.
//
// Needs: a structurally valid graph (after fuse_post_ops). Guarantees: only attributes change (no
// node, value or type); the interpreter ignores the attribute, so a marked graph gives the same
// results on it (up to the summation order oneDNN picks for the other layout).
// PROTEAN_CPU_PACKED_WEIGHTS=0 turns the pass off (read at each compile; comparisons, tests).
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::backend::cpu {

struct GemmWeightStats {
  int64_t constant_weights = 0;  ///< linear / matmul nodes marked weights="constant"
  int64_t reused_weights = 0;    ///< linear / matmul nodes marked weights="reuse"
};

/// Marks the weights of `g`'s linear, linear_fused, matmul and matmul_fused nodes in place (entry
/// point of this pass).
GemmWeightStats mark_gemm_weights(ir::Graph& g);

}  // namespace protean::backend::cpu
