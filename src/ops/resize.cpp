// upsample_nearest2d, upsample_bilinear2d: meta functions and CPU kernels.
//
// Semantics (torch.nn.functional.interpolate on [N, C, H, W] with an explicit output size):
//  * nearest ('nearest' mode): source index = min(floor(dst · in / out), in - 1), computed exactly in
//    integers. Every dtype (it only copies elements).
//  * bilinear: with align_corners the corners of input and output align: src = dst · (in-1)/(out-1)
//    (0 when out == 1). Without it, PyTorch's half-pixel rule: src = max((dst + 0.5) · in/out - 0.5, 0).
//    Then i0 = floor(src), i1 = min(i0 + 1, in - 1), weights (1 - λ, λ) with λ = src - i0. Floating
//    dtypes only (f16/bf16 computed in f32, f64 in f64).
//  * output sizes must be ≥ 1 and input spatial sizes ≥ 1; the batch may be empty.
//  * upsample_nearest2d layout="nhwc" (set by the cpu backend's conv_layout pass in channels-last
//    regions): input and output stored channels-last, sizes [N, H, W, C] and [N, OH, OW, C]; the same
//    element mapping. layout="nchw" is the default.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/layout_attr.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

/// The layout attribute of upsample_nearest2d (ops/layout_attr.h).
bool resize_nhwc(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  return layout_is_nhwc(op, in, attrs, OpKind::upsample_nearest2d);
}

std::vector<TensorMeta> meta_resize(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x = in[0];
  if (x.dim() != 4)
    throw ShapeError(fmt::format("{}: expected a 4-D [N, C, H, W] input, got rank {}", describe_call(op, in), x.dim()));
  const bool nhwc = resize_nhwc(op, in, attrs);
  const int64_t hd = nhwc ? 1 : 2;  // the first spatial dim
  if (op == OpKind::upsample_bilinear2d && !is_floating(x.dtype()))
    throw TypeError(fmt::format("{}: dtype {} not supported (expected a floating dtype)", describe_call(op, in),
                                short_name(x.dtype())));
  const SymIntVec& os = attrs.sym_ints("output_size");
  if (os.size() != 2)
    throw ValueError(fmt::format("{}: output_size must have 2 values (H, W), got {}", describe_call(op, in),
                                 to_string(os)));
  for (int i = 0; i < 2; ++i) {
    if (static_cast<bool>(os[static_cast<size_t>(i)] < 1))
      throw ValueError(fmt::format("{}: output sizes must be ≥ 1, got {}", describe_call(op, in), to_string(os)));
    if (static_cast<bool>(x.size(hd + i) < 1))
      throw ShapeError(fmt::format("{}: input spatial sizes must be ≥ 1", describe_call(op, in)));
  }
  if (nhwc) return one({x.size(0), os[0], os[1], x.size(3)}, x.dtype());
  return one({x.size(0), x.size(1), os[0], os[1]}, x.dtype());
}

std::vector<TensorMeta> meta_upsample_nearest2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_resize(OpKind::upsample_nearest2d, in, attrs);
}
std::vector<TensorMeta> meta_upsample_bilinear2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_resize(OpKind::upsample_bilinear2d, in, attrs);
}

std::vector<Tensor> kernel_upsample_nearest2d(std::span<const Tensor> in, const Attrs& attrs,
                                              std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  Tensor y = empty_like_meta(out[0]);
  if (y.int_numel() == 0) return {y};
  IntVec xs = x.int_sizes(), st = x.int_strides(), ys = y.int_sizes();
  if (resize_nhwc(OpKind::upsample_nearest2d, in, attrs)) {
    // Channels-last: each output pixel copies its source pixel's C values (contiguous when x's
    // channel stride is 1, as the cpu backend's buffers are).
    const int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3], OH = ys[1], OW = ys[2];
    dispatch_dtype(x.dtype(), [&]<typename T>() {
      const T* src = x.data_ptr<T>();
      T* dst = y.data_ptr<T>();
#pragma omp parallel for num_threads(protean::num_threads()) if (N * OH * OW * C > (1 << 16))
      for (int64_t r = 0; r < N * OH; ++r) {
        const int64_t n = r / OH, i = r % OH;
        const T* row = src + n * st[0] + std::min(i * H / OH, H - 1) * st[1];
        T* o = dst + r * OW * C;
        for (int64_t j = 0; j < OW; ++j) {
          const T* px = row + std::min(j * W / OW, W - 1) * st[2];
          if (st[3] == 1) std::memcpy(o + j * C, px, static_cast<size_t>(C) * sizeof(T));
          else
            for (int64_t c = 0; c < C; ++c) o[j * C + c] = px[c * st[3]];
        }
      }
    });
    return {y};
  }
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];
  std::vector<int64_t> hmap(static_cast<size_t>(OH)), wmap(static_cast<size_t>(OW));
  for (int64_t i = 0; i < OH; ++i) hmap[static_cast<size_t>(i)] = std::min(i * H / OH, H - 1) * st[2];
  for (int64_t i = 0; i < OW; ++i) wmap[static_cast<size_t>(i)] = std::min(i * W / OW, W - 1) * st[3];
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    const T* src = x.data_ptr<T>();
    T* dst = y.data_ptr<T>();
#pragma omp parallel for num_threads(protean::num_threads()) if (N * C * OH * OW > (1 << 16))
    for (int64_t p = 0; p < N * C; ++p) {
      const T* plane = src + (p / C) * st[0] + (p % C) * st[1];
      T* o = dst + p * OH * OW;
      for (int64_t i = 0; i < OH; ++i) {
        const T* row = plane + hmap[static_cast<size_t>(i)];
        for (int64_t j = 0; j < OW; ++j) o[i * OW + j] = row[wmap[static_cast<size_t>(j)]];
      }
    }
  });
  return {y};
}

/// Source coordinates and weights for one output axis.
template <typename A>
void linear_axis(int64_t in, int64_t out, bool align_corners, std::vector<int64_t>& i0, std::vector<int64_t>& i1,
                 std::vector<A>& lam) {
  i0.resize(static_cast<size_t>(out));
  i1.resize(static_cast<size_t>(out));
  lam.resize(static_cast<size_t>(out));
  A scale = align_corners ? (out > 1 ? static_cast<A>(in - 1) / static_cast<A>(out - 1) : A(0))
                          : static_cast<A>(in) / static_cast<A>(out);
  for (int64_t d = 0; d < out; ++d) {
    A src = align_corners ? scale * static_cast<A>(d) : std::max(scale * (static_cast<A>(d) + A(0.5)) - A(0.5), A(0));
    int64_t a = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    size_t u = static_cast<size_t>(d);
    i0[u] = a;
    i1[u] = std::min(a + 1, in - 1);
    lam[u] = src - static_cast<A>(a);
  }
}

std::vector<Tensor> kernel_upsample_bilinear2d(std::span<const Tensor> in, const Attrs& attrs,
                                               std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  bool ac = attrs.has("align_corners") && attrs.b("align_corners");
  Tensor y = empty_like_meta(out[0]);
  if (y.int_numel() == 0) return {y};
  IntVec xs = x.int_sizes(), st = x.int_strides(), ys = y.int_sizes();
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
      std::vector<int64_t> h0, h1, w0, w1;
      std::vector<A> hl, wl;
      linear_axis<A>(H, OH, ac, h0, h1, hl);
      linear_axis<A>(W, OW, ac, w0, w1, wl);
      const T* src = x.data_ptr<T>();
      T* dst = y.data_ptr<T>();
#pragma omp parallel for num_threads(protean::num_threads()) if (N * C * OH * OW > (1 << 15))
      for (int64_t p = 0; p < N * C; ++p) {
        const T* plane = src + (p / C) * st[0] + (p % C) * st[1];
        T* o = dst + p * OH * OW;
        for (int64_t i = 0; i < OH; ++i) {
          size_t ui = static_cast<size_t>(i);
          const T* r0 = plane + h0[ui] * st[2];
          const T* r1 = plane + h1[ui] * st[2];
          A lh = hl[ui];
          for (int64_t j = 0; j < OW; ++j) {
            size_t uj = static_cast<size_t>(j);
            A lw = wl[uj];
            A a = static_cast<A>(r0[w0[uj] * st[3]]), b = static_cast<A>(r0[w1[uj] * st[3]]);
            A c = static_cast<A>(r1[w0[uj] * st[3]]), d = static_cast<A>(r1[w1[uj] * st[3]]);
            A v = (A(1) - lh) * ((A(1) - lw) * a + lw * b) + lh * ((A(1) - lw) * c + lw * d);
            if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
              o[i * OW + j] = T(static_cast<float>(v));
            else
              o[i * OW + j] = static_cast<T>(v);
          }
        }
      }
    }
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(upsample_nearest2d, meta_upsample_nearest2d, kernel_upsample_nearest2d);
PROTEAN_REGISTER_OP(upsample_bilinear2d, meta_upsample_bilinear2d, kernel_upsample_bilinear2d);

}  // namespace protean::ops
