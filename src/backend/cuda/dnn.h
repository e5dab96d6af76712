// 2-D convolution through cuDNN, loaded at run time (dlopen libcudnn.so.9), like cuBLASLt (blas.h).
//
// A ConvStep (program.h) mirrors torch.nn.functional.conv2d on NCHW tensors: out[N, O, OH, OW] =
// cross-correlation of x[N, C, H, W] with w[O, C/groups, KH, KW] (+ bias[O]), symmetric padding,
// strides, dilations and groups (depthwise included), OH = (H + 2p - d(KH-1) - 1) floordiv s + 1. The
// legacy cuDNN convolution API is used (cudnnConvolutionForward; the bias is one cudnnAddTensor after
// it, so NaN and infinity propagate as in eager: the epilogue activations stay generated pointwise
// kernels). conv_transpose2d (x [N, C, H, W], w [C, O/groups, KH, KW], output_padding) is cuDNN's
// backward-data convolution with x as the gradient (cudnnConvolutionBackwardData), its output size
// (H - 1)s - 2p + d(KH-1) + output_padding + 1. Data types: f32 (compute f32, CUDNN_FMA_MATH: no TF32, as PyTorch with
// torch.backends.cudnn.allow_tf32 = False), f16 and bf16 (compute f32, tensor cores allowed).
// The algorithm is chosen once per call signature (ConvKey: dtype and every size and parameter) by
// cuDNN's heuristic (cudnnGetConvolutionForwardAlgorithm_v7: its first algorithm that succeeds), and
// the descriptors are kept with it; the workspace comes from the device's caching allocator per call
// (stream-ordered: no allocation reaches the driver in steady state). One cuDNN handle per device,
// bound to the device's stream. Errors name the cuDNN call and its status text. With PROTEAN_LOGS=perf_hints
// each new call signature logs the algorithm, its workspace and the planning time.
#pragma once

#include <array>
#include <compare>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/program.h"
#include "device/driver.h"

namespace protean::backend::cuda {

/// The lowering decision for one extern: a ConvStep when `e` is a conv2d or conv_transpose2d cuDNN can run (4-D NCHW
/// input, dense operands, f32 / f16 / bf16 throughout, symmetric padding, cuDNN loadable); otherwise
/// nullopt and `why` says why (the pipeline then makes it a host step with a perf_hints line).
std::optional<ConvStep> conv_step(const loop::Program& p, const loop::Extern& e, std::string& why);

/// The sizes of one call of a ConvStep (elements).
struct ConvShape {
  std::array<int64_t, 4> x{}, w{}, out{};  ///< [N, C, H, W], w as the step has it, [N, O, OH, OW]
  bool operator==(const ConvShape&) const = default;
  bool empty() const;
};
/// The step's sizes at `symbol_values`. Throws ShapeError when the output sizes do not follow from the
/// input's, the weight's and the parameters (the plan and the call disagree), or a group count does
/// not divide the channels.
ConvShape conv_shape(const ConvStep& step, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values);

/// True when libcudnn could be loaded and has every function used; else `why` says what failed
/// ("cuDNN not found (dlopen libcudnn.so.9: ...)"). `$PROTEAN_CUDNN` names the library to open first;
/// PROTEAN_CUDNN=0 turns cuDNN off (conv then stays a host step). True while a test hook is set.
bool cudnn_available(std::string* why = nullptr);
/// cudnnGetVersion (e.g. 91400), 0 without cuDNN.
size_t cudnn_version();

/// Queues `step` on `device`'s stream. `address(id)` gives each buffer's device address. Throws
/// RuntimeError (library missing, a cuDNN call failing, no algorithm for the shape).
void run_conv(const ConvStep& step, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values,
              const std::function<uint64_t(int)>& address, int device);

/// What one cuDNN call is, for the algorithm choice: everything its descriptors depend on.
struct ConvKey {
  int32_t dtype = 0;
  std::array<int64_t, 4> x{}, w{};
  std::array<int64_t, 2> stride{}, padding{}, dilation{};
  std::array<int64_t, 2> output_padding{};
  int64_t groups = 1;
  int32_t transposed = 0;
  auto operator<=>(const ConvKey&) const = default;
};
/// Where the cuDNN side of a process's time went.
struct ConvStats {
  int64_t calls = 0;             ///< convolutions queued
  int64_t plans = 0;             ///< distinct call signatures planned (heuristic queried, descriptors made)
  double plan_seconds = 0;       ///< wall time planning
  double setup_seconds = 0;      ///< cudnnCreate
  int64_t workspace_bytes = 0;   ///< the largest workspace a chosen algorithm asked for
};
ConvStats conv_stats();
void reset_conv_stats();

/// Tests on the fake driver: `hook` runs instead of cuDNN for every call (it sees the step, its shape
/// at the call, the buffer addresses and the stream); an empty hook restores cuDNN.
using ConvHook = std::function<void(const ConvStep&, const ConvShape&, const std::function<uint64_t(int)>&,
                                    ::protean::cuda::CUstream)>;
void set_conv_hook_for_testing(ConvHook hook);

}  // namespace protean::backend::cuda
