// Vector kernels of the commonest max pooling: a 2x2 window with stride 2, no padding and no
// dilation, over f32 planes whose columns are contiguous (LeNet-style CNNs, the pooling of most
// convolutional backbones). One call handles one (batch, channel) plane; the caller checks the shape
// and layout and keeps its general loops for everything else. Both need AVX-512F; without it
// (max_pool_2x2_supported() false) the caller runs its general path.
//
// Semantics are those of the general kernels (ops/pool.cpp, ops/autograd_ops.cpp), which mirror
// ATen's CPU max_pool2d: the forward is the window's maximum, NaN when any element is NaN; the
// backward routes each output's gradient to the first maximum of its window in row-major order (the
// index ATen's max_pool2d_with_indices records), or to the window's first NaN.
#pragma once

#include <cstdint>

namespace protean::ops {

/// True when this CPU runs the kernels below (AVX-512F).
bool max_pool_2x2_supported();

/// y[oh * OW + ow] = max(x[2oh][2ow], x[2oh][2ow+1], x[2oh+1][2ow], x[2oh+1][2ow+1]) for oh < OH,
/// ow < OW, with x's rows `ld` floats apart (2 * OH <= rows, 2 * OW <= ld). NaN when any of the four is NaN.
void max_pool_2x2_forward(const float* x, int64_t ld, int64_t OH, int64_t OW, float* y);

/// The gradient of the above: gx (H x W floats, dense) receives g[oh * gld + ow] at the first maximum of
/// each window (or its first NaN) and zero everywhere else, including the row and column a floor-mode
/// pooling of odd H or W leaves out (2 * OH <= H, 2 * OW <= W).
void max_pool_2x2_backward(const float* x, int64_t ld, const float* g, int64_t gld, int64_t OH, int64_t OW, float* gx,
                           int64_t H, int64_t W);

}  // namespace protean::ops
