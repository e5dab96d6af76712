// A vector kernel for depthwise 2-D convolutions on channels-last storage: x [N, H, W, C],
// y [N, OH, OW, C], one KH x KW filter per channel (groups = C = O), no dilation — the depthwise convs
// of mobile backbones (PP-OCR's PPLCNet: 3x3 and 5x5, strides 1 and 2 along either axis).
//
// oneDNN 2.6 runs these (brdgmm_dw) at 45–63 GFLOP/s on one core of the machine the benchmarks run on,
// whose f32 FMA peak is 110; here each 16-channel block of a strip of 12 or 16 output pixels keeps its
// sums in registers while one kernel row's KW weight vectors are held too, and every input vector
// loaded is used by every output of the strip that reads it. The eltwise post-ops (post_ops.h: relu,
// hardswish, hardsigmoid, clamp, linear) are applied in registers before the store, with eager's NaN
// rules (NaN passes through relu and clamp).
//
// The caller (conv.cpp) checks depthwise_nhwc_fits() and packs the weights with
// pack_depthwise_weights(); without AVX-512F the kernel is never used.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/post_ops.h"

namespace protean::ops {

struct DepthwiseShape {
  int64_t N, C, H, W, OH, OW, KH, KW;
  int64_t sh, sw, ph, pw;  ///< strides and (top, left) padding; OH / OW fix the bottom and right padding
};

/// True when depthwise_nhwc() computes this convolution: AVX-512F present, 1 <= KH <= 7, KW in
/// {3, 5}, stride along W 1 or 2, any stride along H, padding < kernel size, every post-op in `post` (if
/// any) one of relu, hardswish, hardsigmoid, clamp, linear.
bool depthwise_nhwc_fits(const DepthwiseShape& s, const std::vector<PostOp>* post);

/// The weights w [C, 1, KH, KW] (contiguous) as [KH, KW, C]: the layout depthwise_nhwc() reads.
void pack_depthwise_weights(const float* w, int64_t C, int64_t KH, int64_t KW, float* packed);

/// y[n, oh, ow, c] = post(b[c] + Σ_{kh, kw} x[n, oh·sh − ph + kh, ow·sw − pw + kw, c] · wp[kh, kw, c]), taps
/// outside x contributing nothing. `b` may be null; `post` may be null or empty. Runs on
/// protean::num_threads() threads (over output rows) when the work is large enough.
void depthwise_nhwc(const DepthwiseShape& s, const float* x, const float* wp, const float* b, float* y,
                    const std::vector<PostOp>* post);

}  // namespace protean::ops
