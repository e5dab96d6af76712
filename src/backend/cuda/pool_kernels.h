// Pooling and resizing on backend cuda: hand-written kernels appended to the graph's translation unit
// (like index_select and cumsum in pipeline.cpp), sizes as kernel arguments. NCHW (4-D) f32 buffers.
//  * adaptive_avg_pool2d (torch.nn.functional.adaptive_avg_pool2d): output cell (i, j) averages input
//    rows [floor(i·H/OH), ceil((i+1)·H/OH)) and columns likewise; one block of 256 threads per output
//    cell reduces its window (a global pool over a 160×160 map is one block per channel, not one thread).
//  * avg_pool2d (kernel, stride, padding, count_include_pad; ceil_mode is in the output size the graph
//    gives): the window clipped to [−p, L+p) as PyTorch, divided by that size (count_include_pad) or by
//    its in-bounds part; one thread per output element.
//  * max_pool2d (kernel, stride, padding, dilation): the maximum of the in-bounds elements, NaN
//    propagating as eager; one thread per output element.
//  * upsample_nearest2d (mode 'nearest'): source index min(floor(dst·in/out), in − 1) in integers, as
//    the eager kernel; one thread per output element.
// Sums are in f32 in window order; results match the eager kernels within f32 rounding.
#pragma once

#include <optional>
#include <string>

#include "backend/cuda/program.h"
#include "loop/loop_ir.h"

namespace protean::backend::cuda {

/// The kernel for `e` when it is one of the ops above on f32 NCHW buffers, appended to `source`;
/// nullopt with `why` otherwise.
std::optional<CudaKernel> pool_kernel(const loop::Program& p, const loop::Extern& e, const std::string& name,
                                      std::string& source, std::string& why);

}  // namespace protean::backend::cuda
