// oneDNN layouts for convolutions (channels-last chains, constant weights): the cpu backend's graph
// pass after post-op fusion (pipeline.cpp).
//
// oneDNN's depthwise (brdgmm_dw) and 1x1 (brgconv_1x1) kernels work on NHWC; on plain NCHW tensors
// every depthwise conv pays a reorder of its input and of its output (PP-OCRv4 rec at width 160: 45
// reorders, ~1 ms of ~6.5). This pass keeps the value between two convolutions in NHWC: for a value
// v made by conv2d / conv2d_fused that is used only as input 0 of one other conv2d / conv2d_fused,
// the producer gets dst_layout="nhwc" (and v's type becomes [N, H, W, C]), the consumer
// src_layout="nhwc" (src/ops/conv.cpp). A chain conv → conv → ... → conv then stores every inner
// value channels-last; its first input and last output stay NCHW, so every other op sees the same
// values as before.
//
// Constant weights: every conv2d / conv2d_fused whose weight (input 1) is a graph Constant gets
// weights="constant", so its kernel reorders the weights into oneDNN's layout once and keeps the
// copy instead of reordering them on every call (the brgemm 1x1 and depthwise kernels want blocked
// weights: ~0.3 ms of reorders per call on rec at width 160). A weight that is a graph input (a
// parameter, or a region use's weights: an ONNX model's repeated blocks) gets weights="reuse": packed
// on the second call that sees the same storage at the same version, like gemm_weights' inputs.
//
// Conditions on v: f32, 4-D (batched conv2d), not a graph output, exactly one use (input 0 of the
// consumer). On the producer: no post-op with a tensor operand (inputs beyond x, w, bias), whose
// broadcast shapes are written for NCHW.
//
// Squeeze-and-excitation blocks (PPLCNet, MobileNetV3): v = conv(...) [N, C, H, W] used by exactly a
// global adaptive_avg_pool2d (output 1x1) and a mul(v, s) with s = conv(...) [N, C, 1, 1] used only
// there, the product used only as input 0 of a conv. Then v and the product are stored [N, H, W, C],
// s [N, 1, 1, C] (the same memory as [N, C, 1, 1]: the mul broadcasts it along H and W), the pooling
// reads v with src_layout="nhwc" (its output stays [N, C, 1, 1]), and the conv after the mul reads the
// product channels-last. The block's convs then need no reorder (PP-OCRv4 rec: 4 reorders per call,
// ~1 ms at width 960), and the multiply runs along contiguous channels.
//
// Channels-last regions (PP-OCRv4 det's residual-SE FPN: conv outputs added to upsampled maps,
// multiplied by per-channel scales, concatenated, then read by convs): a set R of f32 4-D values, each
// made by a conv (no dst_layout yet, no post-op operands) or by a region op — add or mul of two tensors,
// upsample_nearest2d, avg_pool2d, cat along dim 1 — whose tensor inputs are all in R, and each used only as input 0
// of a conv without src_layout, by a global adaptive_avg_pool2d, or by a region op whose output is in
// R (so never a graph output). Every value of R is stored [N, H, W, C]; its producing conv gets
// dst_layout="nhwc", the upsampling and the average pooling layout="nhwc" (input and output
// channels-last, ops/resize.cpp, ops/pool.cpp),
// the cat dim=3; the convs and poolings reading it src_layout="nhwc". Pointwise ops stay correct on the
// rotated sizes because all their operands rotate together ([N, C, 1, 1] → [N, 1, 1, C] still
// broadcasts along H and W). R is the largest such set: start from every candidate, drop the values
// that break a rule until none does. det at 640x640: the NCHW↔NHWC reorders around its FPN's 3x3 convs
// (~20 ms of oneDNN reorders per call, verbose timer) go; rec: its last stage's conv → avg_pool2d → conv.
//
// Needs: a structurally valid graph in topological order (after fuse_post_ops). Guarantees: the same
// outputs up to rounding (oneDNN picking another kernel for a layout, the pooling's order of summation);
// Placeholders, graph outputs and the types of every value other than the re-laid-out ones unchanged;
// no new nodes or symbols.
#pragma once

#include <cstdint>

#include "ir/graph.h"

namespace protean::backend::cpu {

struct ConvLayoutStats {
  int64_t nhwc_values = 0;  ///< conv → conv values now stored channels-last
  int64_t constant_weights = 0;  ///< convs marked weights="constant"
  int64_t reused_weights = 0;    ///< convs marked weights="reuse" (weights that are graph inputs)
  int64_t se_blocks = 0;         ///< squeeze-and-excitation blocks kept channels-last (3 values each)
  int64_t region_values = 0;     ///< values of channels-last regions (also counted in nhwc_values)
};

/// Rewrites `g` in place (entry point of this pass).
ConvLayoutStats propagate_conv_layouts(ir::Graph& g);

}  // namespace protean::backend::cpu
