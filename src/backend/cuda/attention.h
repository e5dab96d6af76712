// The cuda backend's fused attention: scaled_dot_product_attention (an extern of the loop program,
// from a user's call or from the matmul-softmax-matmul pattern of exported transformers,
// backend/attention_pattern.h) as one generated flash-style kernel appended to the graph's
// translation unit.
//
// out[b, i, :] = sum_j softmax_j(scale * q[b, i, :]·k[b, j, :] + mask[b, i, j]) v[b, j, :], computed
// the way FlashAttention-2 does: one block of 4 warps per 32 query rows of one batch entry (every
// dim before the last two flattens into the batch; the blocks of the last query tiles, the longest
// under a causal mask, are scheduled first; two warps per 16 rows, each over one half of every key
// tile, their softmax states merged at the end; PROTEAN_CUDA_ATTENTION_KEY_SPLIT=4: 8 warps over
// tiles of 128), key tiles of 64 staged in dynamic shared memory (two buffers, cp.async), the
// products on tensor cores (mma.sync m16n8k16, bf16 or f16 operands, f32 accumulation), an online
// softmax in f32 (running max and sum per row, the output rescaled when the max grows), so the [L, S]
// scores never reach memory. The causal mask (is_causal) is computed from the indices, not loaded,
// and the key tiles past a block's last row are skipped; an additive float mask of the scores'
// dtype is loaded per element, broadcast over batch dims of size 1 and over a row or column dim of
// size 1. A row whose every key is masked gives zeros (as where(isnan(P), 0, P) after the softmax,
// which the pattern pass folds in). The sequence lengths L and S are kernel arguments: one artifact
// serves every length. On compute capability 9.0 (the program compiled for sm_90a), head dim 64 without
// a loaded mask, lengths from attention_wgmma_from() launch a Hopper form instead: 64 query rows and
// two warp groups a block, Q·Kᵀ and P·V as warp-group MMAs (wgmma m64n64k16) on swizzled shared tiles,
// P kept in registers as the second product's A operand (FlashAttention-3's register path).
//
// Taken: q, k, v (and the output) bf16 or f16 of equal batch dims, head dim a multiple of 16 up to
// 128 and equal for q, k and v; the mask (optional) of q's dtype. Anything else returns nullopt with
// the reason, and the extern stays a host step (perf_hints says why).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "backend/cuda/codegen.h"
#include "backend/cuda/program.h"
#include "loop/loop_ir.h"

namespace protean::backend::cuda {

/// How the attention kernel reads one operand (q, k or v) straight from the buffer a copy kernel
/// would have read (the projection the heads are sliced from): element [batch..., row, d] at
/// `offset + sum(batch_i * batch_strides[i]) + row * row_stride + d` of `buffer`.
struct AttentionView {
  int buffer = -1;
  sym::Expr offset;
  std::vector<sym::Expr> batch_strides;
  sym::Expr row_stride;
};
/// Per attention extern (index into Program::externs), per operand 0..2 (q, k, v) and 3 (the output:
/// where it writes element [batch..., row, d]): the view, if any.
using AttentionViews = std::map<int, std::map<int, AttentionView>>;

/// Removes the copies around an attention extern the kernel can take. Inputs: a pointwise stage
/// `load(src, f(x)) -> X[x]` over X's shape, X read by nothing else, f affine in the loop variables
/// with unit stride in the last dim and even integer strides and offset (4-byte aligned pairs): the
/// kernel reads src. Output: the only reader of the output O, a pointwise stage `load(O, g(y)) ->
/// Y[y]` that permutes O's elements (the heads merged back, [B, H, L, D] -> [B, L, H*D]) with
/// constant strides (found by evaluating g at two sets of sizes): the kernel writes Y. The stage
/// (and its kernel, when it was the last one) goes; src and Y leave their memory slots (their lives
/// now reach the attention). Run after schedule_program. PROTEAN_CUDA_ATTENTION_VIEWS=0 keeps the
/// copies. Returns the views (attention_kernel reads them).
AttentionViews fold_attention_views(loop::Program& p);

/// The kernel for extern `e` (scaled_dot_product_attention) named `name`; its CUDA C is appended to
/// `source` unless an equal kernel (same dtype, head dim, mask form, causal flag and scale) is already
/// there (`entries`: variant text → entry name; transformer layers share one kernel).
/// `sizes` (codegen.h: SizeArgs): FromMemory reads BH, L and S's symbols from `pt_sizes` and returns
/// from blocks past the last (batch, head), so a graph node may launch it over its bucket's upper bounds.
/// `wgmma`: the translation unit is compiled for sm_90a, so the aligned variant of a head dim of 64 without
/// a loaded mask may take the warp-group MMA form (attention_wgmma_groups; the general variant keeps
/// mma.sync).
std::optional<CudaKernel> attention_kernel(const loop::Program& p, const loop::Extern& e, const std::string& name,
                                           std::string& source, std::map<std::string, std::string>& entries,
                                           std::string& why, const std::map<int, AttentionView>* views = nullptr,
                                           SizeArgs sizes = SizeArgs::ByValue, bool wgmma = false);

/// Warp groups per block of the attention kernel's Hopper form: PROTEAN_CUDA_ATTENTION_WGMMA=2 (the
/// default) or 4, each taking 64 keys of every key tile of 64 x groups; 0 keeps mma.sync everywhere.
/// The cuda backend compiles for sm_90a on compute capability 9.0 when it is not 0
/// (attention_wants_sm90a).
int attention_wgmma_groups();
/// The query length from which the Hopper form is launched (PROTEAN_CUDA_ATTENTION_WGMMA_FROM, default
/// 321: above the default bucket [257, 320]); shorter lengths launch the general entry, which runs the
/// mma.sync body of 32-row blocks (its 16-byte pipelined form where k and v allow it). Measured on an
/// H100 with GPT-2 small: the warp-group form gains from 400 tokens, is level from 128 to 311 and
/// loses a few microseconds a call below (docs/cuda.md); 64-row blocks of mma.sync lost up to 17 µs.
int64_t attention_wgmma_from();
/// Whether a program for compute capability `major`.`minor` should be compiled for sm_90a (the
/// attention kernel's Hopper form is on and the device is 9.0).
bool attention_wants_sm90a(int major, int minor);

/// Whether attention_kernel takes extern `e` (else `why`).
bool attention_supported(const loop::Program& p, const loop::Extern& e, std::string& why);

}  // namespace protean::backend::cuda
