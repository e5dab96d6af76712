// The cpu backend's fused scaled-dot-product attention: softmax(q·kᵀ·scale, masked) · v in one pass
// over the keys per query row, never storing the [L, S] scores (the tiled, online-softmax scheme of
// FlashAttention, Dao et al. 2022, on one core: keys in tiles of 64, a running row maximum and sum,
// the output rescaled when the maximum grows). A causal mask (key j > query i is -inf, top-left
// aligned like tril(ones(L, S))) is computed from the indices, never materialized, and key tiles
// entirely above the diagonal are skipped. Sizes are run-time values: one compiled program serves
// every sequence length.
//
// Lowering (loop/decompose.cpp, under LowerOptions::fused_attention, which the cpu pipeline sets)
// keeps scaled_dot_product_attention without a mask as one extern step, its q, k and v views of the
// buffers they come from where their rows are unit-stride; the runner calls sdpa_fused for it and falls
// back to the eager kernel (ops/attention.cpp) where sdpa_fused declines.
#pragma once

#include <optional>
#include <span>

#include "ops/registry.h"
#include "protean/tensor.h"

namespace protean::backend::cpu {

/// Runs scaled_dot_product_attention(q, k, v, mask, is_causal, scale) fused when it can: f32 q
/// [..., L, E], k [..., S, E], v [..., S, Ev] with equal batch dims, E > 0, no mask (in[3] undefined
/// or absent), each with unit-stride rows and any other strides (read in place: the heads of a fused
/// QKV projection need no copy; lowering passes them as views, LowerOptions::extern_views). Attrs as the op's: `is_causal` (bool, default false), `scale` (double,
/// default 1/sqrt(E)). Returns the output f32 [..., L, Ev] (contiguous), or nullopt when the inputs
/// are outside that case (the caller runs the eager kernel). A row whose keys are all masked (S = 0)
/// gives zeros, as the eager kernel does. Parallel over batch × query rows on protean::num_threads()
/// threads. Results match the eager kernel within f32 rounding (a different summation order and a
/// polynomial exp: relative error about 1e-6 per term).
std::optional<Tensor> sdpa_fused(std::span<const Tensor> in, const ops::Attrs& attrs);

}  // namespace protean::backend::cpu
