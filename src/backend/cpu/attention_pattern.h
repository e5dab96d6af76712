// Attention written out as matmul, softmax, matmul (what the ONNX importer sees in exported
// transformers, e.g. PP-OCRv4 rec's SVTR blocks: MatMul(Softmax(MatMul(q·s, Transpose(k))), v)):
// a cpu graph pass before lowering that turns it into one scaled_dot_product_attention Call, which
// the cpu backend runs as its fused kernel (sdpa.h) instead of writing and re-reading the [L, S]
// scores.
//
// Recognized, on f32 values of equal rank >= 3, every intermediate value used once and not a graph
// output:
//   matmul(softmax(X, last dim), V) with X = matmul(Q, permute(K, last two dims swapped)),
//   X = mul(that, c) / mul(c, that) / div(that, c) for a scalar Constant c (scale c or 1/c).
// The final matmul becomes scaled_dot_product_attention(Q, K, V, no mask, is_causal = false, scale),
// which computes the same values up to rounding; the nodes it replaces are removed.
//
// Needs: a structurally valid graph in topological order. Guarantees: Placeholders, graph outputs
// and every kept value's type unchanged; no new symbols. The frame's graph is not changed: the
// backend runs this on its own copy.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::backend::cpu {

/// Rewrites `g` in place; returns the number of attention patterns replaced.
int64_t fuse_attention_patterns(ir::Graph& g);

}  // namespace protean::backend::cpu
