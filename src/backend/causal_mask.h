// Proves from the graph that an attention mask is the causal mask: a value M of the scores' rank
// whose element [..., i, j] is 0 when key j <= query i and a large negative number (-inf, or at most
// half the dtype's lowest finite value: torch.finfo(dtype).min as transformers writes it) when j > i,
// for every value of the size symbols. Such an additive mask gives the same softmax as
// is_causal = true (scaled_dot_product_attention's top-left alignment), because every row keeps key 0
// and a masked score's exp(s + M - max) underflows to exactly 0 in f32.
//
// How: an abstract interpretation of M's defining subgraph over element functions. Every value of
// the subgraph is a list of pieces; a piece is a box over the value's own indices (per dim, candidate
// lower and upper bounds, symbolic) and the element there as a symbolic expression of the indices
// and size symbols (integer, boolean, or for floats `C ? a : b` with a boolean C and two constants).
// Index maps (arange, unsqueeze, reshape that only adds or drops dims of size 1, expand, slice,
// select, cat, index_select) substitute indices; cat splits into pieces; relations are decided per
// piece from the box's bounds (symbols >= 1) when they can be, else kept symbolic; cumsum takes a
// constant integer; where on integers needs a decided condition. Anything else (a graph input, an op
// outside that list, a relation it cannot decide where it must) means "not proven": the mask stays
// a loaded mask with its exact semantics. Transformers' causal mask with its "packed sequence" term
// (the cumsum of position-id jumps, compared by gathering at i and at j) is proven: position ids are
// an arange there, so the term is constant.
//
// Needs: a structurally valid graph. Guarantees: reads `g` only; never throws (an exception of the
// sym layer is "not proven").
#pragma once

#include <memory>

#include "ir/graph.h"

namespace protean::backend {

/// True when value `mask` (rank >= 2, float dtype) is proven to be the additive causal mask over its
/// last two dims (rows: queries, columns: keys), the same for every leading index.
bool is_proven_causal_mask(const ir::Graph& g, ir::ValueId mask);

/// The same proof for several masks of one graph (the layers of a transformer build theirs from one
/// subgraph): the element functions found for one mask are reused for the next. The graph's mask
/// subgraphs must not change while it lives (other nodes may).
class CausalMaskProver {
 public:
  explicit CausalMaskProver(const ir::Graph& g);
  ~CausalMaskProver();
  CausalMaskProver(const CausalMaskProver&) = delete;
  CausalMaskProver& operator=(const CausalMaskProver&) = delete;
  bool proven(ir::ValueId mask);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace protean::backend
