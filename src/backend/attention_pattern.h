// Attention written out as matmul, softmax, matmul (what the ONNX importer sees in exported
// transformers, e.g. PP-OCRv4 rec's SVTR blocks: MatMul(Softmax(MatMul(q·s, Transpose(k))), v)):
// a graph pass before lowering (cpu and cuda backends) that turns it into one scaled_dot_product_attention Call, which
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
// With AttentionPatternOptions (the cuda backend's use; the cpu backend keeps the defaults), also:
//   bf16 and f16 values (`half_dtypes`);
//   the scale on both operands, Q' = mul(Q, c1), K' = mul(Kᵀ, c2) (scale c1 * c2: what torch's ONNX
//   exporter writes, sqrt(scale) on each side), with Kᵀ a permute of K or the exporter's
//   reshape(permute(reshape(K, [-1, s, d]), [0, 2, 1]), [..., d, s]);
//   an additive mask before the softmax, softmax(X + M) with M of the scores' rank (`masks`),
//   followed by where(isnan(P), 0, P), written ne(P, P) (a fully masked row gives zeros): M becomes
//   the attention's mask input, and the where is part of what the fused kernel computes. A mask
//   proven causal from its own subgraph (backend/causal_mask.h: transformers' causal mask, built
//   from aranges, comparisons and its packed-sequence cumsum) becomes is_causal = true with no mask
//   input; any other mask stays the attention's mask input with its exact values.
//
// Needs: a structurally valid graph in topological order. Guarantees: Placeholders, graph outputs
// and every kept value's type unchanged; no new symbols. The frame's graph is not changed: the
// backend runs this on its own copy.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::backend {

struct AttentionPatternOptions {
  bool half_dtypes = false;  ///< bf16 and f16 values too (else f32 only)
  bool masks = false;        ///< additive masks followed by where(isnan(P), 0, P); scales on both operands
};

/// Rewrites `g` in place; returns the number of attention patterns replaced (`causal_masks`, when
/// given: how many of them had a mask proven causal).
int64_t fuse_attention_patterns(ir::Graph& g, const AttentionPatternOptions& o = {}, int64_t* causal_masks = nullptr);

}  // namespace protean::backend
