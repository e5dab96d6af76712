// Decompositions: composite ops lowered as compositions of primitives (reductions and pointwise
// scalar expressions), so the scheduler can fuse them.
//
//   softmax(x, d)      m = max_d(x); e = exp(x - m); e / sum_d(e)
//   log_softmax(x, d)  x - m - log(sum_d(exp(x - m)))
//   layer_norm         mean = sum(x)/N; var = sum((x - mean)²)/N; (x - mean)·rsqrt(var + eps)·w + b
//   rms_norm           x·rsqrt(sum(x²)/N + eps)·w   (eps defaults to the dtype's epsilon)
//   batch_norm (inference)  (x - rm[c])·rsqrt(rv[c] + eps)·w[c] + b[c]   (scale/shift per channel)
//   gelu               0.5·x·(1 + erf(x/√2))  |  0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
//   silu               x·sigmoid(x);  hardsigmoid = clamp(x + 3, 0, 6)/6;  hardswish = x·hardsigmoid(x)
//   sum/prod/amax/amin reductions; mean = sum/N; var = sum((x - mean)²)/max(0, N - correction)
//   scaled_dot_product_attention  matmul(q, kᵀ) (extern) · scale (+ mask | causal) → softmax → matmul(·, v) (extern)
//   scaled_dot_product_attention_backward (LowerOptions::decompose_attention_backward)  p as above;
//                      dv = pᵀ·g, dp = g·vᵀ, ds = p·(dp − Σ dp·p)·scale, dq = ds·k, dk = dsᵀ·q (matmuls extern)
//
// Needs: the node's inputs lowered (Lowerer::input) and a Decomposed row in the lowering table.
// Guarantees: throws Unsupported for a variant it cannot handle (the node then runs as an extern).
#pragma once

#include "loop/lower.h"

namespace protean::loop {

/// Lowers `n` by its decomposition rule `rule` (the row of its op in lowering.def). Throws Unsupported
/// for a variant it cannot handle, CompileError when `rule` is not a decomposition.
TRef lower_composite(Lowerer& L, const ir::Node& n, LowerRule rule);

}  // namespace protean::loop
