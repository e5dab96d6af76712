// conv1d, conv2d, conv_transpose2d: meta functions and CPU kernels (oneDNN for f32).
//
// Semantics (torch.nn.functional.conv1d / conv2d / conv_transpose2d):
//  * x [N, C, *spatial] (or unbatched [C, *spatial]); conv weight [O, C/groups, *k]; transposed-conv
//    weight [C, O/groups, *k]; bias [O]. stride/padding/dilation are per spatial dim (a single value
//    applies to every dim). Padding is symmetric.
//  * conv output size:            (L + 2p - d(k-1) - 1) floordiv s + 1   (must be ≥ 1)
//  * conv_transpose output size:  (L - 1)s - 2p + d(k-1) + output_padding + 1, with
//    output_padding < stride or < dilation (PyTorch's rule).
//  * dtypes: f32 through oneDNN; f16/bf16 converted to f32 and back; f64 by a direct loop (oneDNN has
//    no f64). Integer inputs are a TypeError (as in PyTorch on CPU).
//
// oneDNN use: plain NCHW tensors in and out. The weights are given to oneDNN as `any` and reordered
// once per call into the layout its kernel wants (skipped when that layout is the plain one, as for
// the GEMM-based kernels). For grouped/depthwise convs and k>1 convs with ≥ 16
// input channels per group, src/dst are also `any` (blocked nChw16c) with reorders around the conv:
// measured here, that is 4–7× faster for depthwise convs and ~1.5× for a 64-channel 3×3, while 1×1
// and few-channel convs are faster directly on NCHW (oneDNN's GEMM-based kernel) — except 1×1 convs
// with < 32 input channels on ≥ 16384 output pixels, where that kernel collapses (see use_blocked),
// and few-channel k>1 convs and 1x1 convs on small images, where a direct kernel is as fast and a
// process that never calls the GEMM kernel skips oneDNN's one-time sgemm JIT (see avoids_gemm).
// 1x1 convs of 1x1 images (squeeze-and-excitation blocks) skip oneDNN: a matrix-vector product of
// our own (conv_pixel_gemv) and the eltwise post-ops in apply_post_ops' loops.
// Primitives (conv + reorders) are cached process-wide, keyed by every shape/parameter and the
// post-op structure: the OCR models call the same convs repeatedly and creating a oneDNN primitive
// costs 0.1–3 ms of JIT. Library-layout copies and the primitive scratchpad live in the calling
// thread's scratch slots (dnnl_util.h), so a cached primitive runs on any thread.
//
// Channels-last storage (conv2d, conv2d_fused; the cpu backend's conv_layout pass sets these): the
// attributes src_layout="nhwc" / dst_layout="nhwc" say the input / output tensor is stored as
// [N, H, W, C] (its sizes in that order) instead of [N, C, H, W]; the math is unchanged. oneDNN's
// depthwise and 1x1 kernels work on NHWC directly, so a chain of such convs needs no reorders.
// dst_layout="nhwc" takes no post-op with a tensor operand (those are shaped for NCHW).
// weights="constant" (set by the same pass on graph constants) promises that input 1 never changes
// while its storage lives: the weights are reordered into the kernel's layout once and kept
// (PackedWeights), not on every call.
//
// Fused forms (conv1d_fused, conv2d_fused, conv_transpose2d_fused): the base conv on inputs 0..2 and
// the `post_ops` list (post_ops.h) on its result. The post-ops become oneDNN post-ops (eltwise,
// binary, or `sum` for a first full-size add into a blocked destination) when oneDNN keeps the
// implementation and layouts it chooses without them, except on the GEMM-based kernel (see
// make_entry); otherwise (and for f64) the convolution runs bare and run_post_ops finishes the result
// in one more pass (a oneDNN binary primitive carrying the list, or plain loops).
#include <fmt/format.h>

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/storage_version.h"
#include "ops/conv_depthwise.h"
#include "ops/dnnl_util.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/post_ops.h"
#include "ops/registry.h"
#include "ops/thread_binding.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

struct ConvArgs {
  int spatial = 2;  // 1 or 2
  bool transposed = false;
  bool batched = true;
  IntVec stride, padding, dilation, output_padding;
  int64_t groups = 1;
  bool src_nhwc = false, dst_nhwc = false;  // channels-last storage of input / output (conv2d only)
  bool const_weights = false;               // weights="constant"
  bool reuse_weights = false;               // weights="reuse"
};

IntVec expand_param(const Attrs& attrs, const char* name, int spatial, OpKind op, std::span<const Tensor> in,
                    int64_t min_value, const IntVec& dflt) {
  IntVec v = attrs.has(name) ? attrs.ints(name) : dflt;
  if (v.size() == 1 && spatial > 1) v.assign(static_cast<size_t>(spatial), v[0]);
  if (static_cast<int>(v.size()) != spatial)
    throw ValueError(fmt::format("{}: {} must have 1 or {} values, got {}", describe_call(op, in), name, spatial,
                                 to_string(to_symint_vec(v))));
  for (int64_t x : v) {
    if (x < min_value)
      throw ValueError(fmt::format("{}: {} must be ≥ {}, got {}", describe_call(op, in), name, min_value,
                                   to_string(to_symint_vec(v))));
    // oneDNN (and the output-size arithmetic) take them as 32-bit values
    if (x > std::numeric_limits<int32_t>::max())
      throw ValueError(fmt::format("{}: {} must be < 2^31, got {}", describe_call(op, in), name,
                                   to_string(to_symint_vec(v))));
  }
  return v;
}

ConvArgs parse_args(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  ConvArgs a;
  a.spatial = op == OpKind::conv1d ? 1 : 2;
  a.transposed = op == OpKind::conv_transpose2d;
  IntVec zeros(static_cast<size_t>(a.spatial), 0), ones(static_cast<size_t>(a.spatial), 1);
  a.stride = expand_param(attrs, "stride", a.spatial, op, in, 1, ones);
  a.padding = expand_param(attrs, "padding", a.spatial, op, in, 0, zeros);
  a.dilation = expand_param(attrs, "dilation", a.spatial, op, in, 1, ones);
  if (a.transposed) a.output_padding = expand_param(attrs, "output_padding", a.spatial, op, in, 0, zeros);
  a.groups = attrs.has("groups") ? attrs.i("groups") : 1;
  auto layout = [&](const char* name) {
    if (!attrs.has(name)) return false;
    const std::string& v = attrs.s(name);
    if (v != "nchw" && v != "nhwc")
      throw ValueError(fmt::format("{}: {} must be \"nchw\" or \"nhwc\", got \"{}\"", describe_call(op, in), name, v));
    if (v == "nhwc" && (op != OpKind::conv2d || in[0].dim() != 4))
      throw ValueError(fmt::format("{}: {}=\"nhwc\" needs a batched conv2d", describe_call(op, in), name));
    return v == "nhwc";
  };
  a.src_nhwc = layout("src_layout");
  a.dst_nhwc = layout("dst_layout");
  if (attrs.has("weights")) {
    const std::string& wm = attrs.s("weights");
    if (wm != "constant" && wm != "reuse")
      throw ValueError(fmt::format("{}: weights=\"{}\" is not a weight mode (expected \"constant\" or \"reuse\")",
                                   describe_call(op, in), wm));
    a.const_weights = wm == "constant";
    a.reuse_weights = wm == "reuse";
  }
  if (a.groups < 1) throw ValueError(fmt::format("{}: groups must be ≥ 1, got {}", describe_call(op, in), a.groups));
  return a;
}

std::vector<TensorMeta> meta_conv_common(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const Tensor& b = in[2];
  ConvArgs a = parse_args(op, in, attrs);
  int64_t S = a.spatial;
  // Logical [N, C, H, W] sizes of x whatever its storage order.
  auto xsize = [&](int64_t d) { return a.src_nhwc ? x.size(d == 0 ? 0 : d == 1 ? 3 : d - 1) : x.size(d); };
  if (x.dim() != S + 2 && x.dim() != S + 1)
    throw ShapeError(fmt::format("{}: expected input of rank {} (batched [N, C, {}]) or {} (unbatched), got rank {}",
                                 describe_call(op, in), S + 2, S == 1 ? "L" : "H, W", S + 1, x.dim()));
  if (w.dim() != S + 2)
    throw ShapeError(fmt::format("{}: expected weight of rank {}, got rank {}", describe_call(op, in), S + 2, w.dim()));
  if (!is_floating(x.dtype()))
    throw TypeError(fmt::format("{}: dtype {} not supported (expected f32, f64, f16 or bf16)", describe_call(op, in),
                                short_name(x.dtype())));
  if (w.dtype() != x.dtype() || (b.defined() && b.dtype() != x.dtype()))
    throw TypeError(fmt::format("{}: input, weight and bias must have the same dtype", describe_call(op, in)));
  bool batched = x.dim() == S + 2;
  SymInt N = batched ? xsize(0) : SymInt(1);
  SymInt C = xsize(batched ? 1 : 0);
  int64_t g = a.groups;
  SymInt O;
  if (!a.transposed) {
    if (!static_cast<bool>(w.size(1) * g == C))
      throw ShapeError(fmt::format("{}: weight expects {} input channels ({} per group × {} groups) but the input has {}",
                                   describe_call(op, in), (w.size(1) * g).str(), w.size(1).str(), g, C.str()));
    if (!static_cast<bool>(w.size(0) % g == 0))
      throw ShapeError(fmt::format("{}: out channels {} not divisible by groups {}", describe_call(op, in),
                                   w.size(0).str(), g));
    O = w.size(0);
  } else {
    if (!static_cast<bool>(w.size(0) == C))
      throw ShapeError(fmt::format("{}: weight expects {} input channels but the input has {}", describe_call(op, in),
                                   w.size(0).str(), C.str()));
    if (!static_cast<bool>(C % g == 0))
      throw ShapeError(fmt::format("{}: in channels {} not divisible by groups {}", describe_call(op, in), C.str(), g));
    O = w.size(1) * g;
  }
  if (b.defined() && (b.dim() != 1 || !static_cast<bool>(b.size(0) == O)))
    throw ShapeError(fmt::format("{}: bias must be 1-D of size {} (out channels)", describe_call(op, in), O.str()));
  SymIntVec out;
  if (batched) out.push_back(N);
  out.push_back(O);
  for (int64_t i = 0; i < S; ++i) {
    SymInt L = xsize(x.dim() - S + i);
    SymInt k = w.size(2 + i);
    size_t ui = static_cast<size_t>(i);
    if (!a.transposed) {
      SymInt span = L + 2 * a.padding[ui];
      SymInt need = a.dilation[ui] * (k - 1) + 1;
      if (static_cast<bool>(span < need))
        throw ShapeError(fmt::format("{}: padded input size {} in spatial dim {} is smaller than the dilated kernel "
                                     "size {}; the output would be empty",
                                     describe_call(op, in), span.str(), i, need.str()));
      out.push_back((span - need) / a.stride[ui] + 1);
    } else {
      if (a.output_padding[ui] >= a.stride[ui] && a.output_padding[ui] >= a.dilation[ui])
        throw ValueError(fmt::format("{}: output_padding {} must be smaller than stride {} or dilation {}",
                                     describe_call(op, in), a.output_padding[ui], a.stride[ui], a.dilation[ui]));
      SymInt o = (L - 1) * a.stride[ui] - 2 * a.padding[ui] + a.dilation[ui] * (k - 1) + a.output_padding[ui] + 1;
      if (static_cast<bool>(o < 1))
        throw ShapeError(fmt::format("{}: output size {} in spatial dim {} is not positive", describe_call(op, in),
                                     o.str(), i));
      out.push_back(o);
    }
  }
  if (a.dst_nhwc) std::rotate(out.begin() + 1, out.begin() + 2, out.end());  // [N, O, OH, OW] → [N, OH, OW, O]
  return one(std::move(out), x.dtype());
}

std::vector<TensorMeta> meta_conv1d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_conv_common(OpKind::conv1d, in, attrs);
}
std::vector<TensorMeta> meta_conv2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_conv_common(OpKind::conv2d, in, attrs);
}
std::vector<TensorMeta> meta_conv_transpose2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_conv_common(OpKind::conv_transpose2d, in, attrs);
}

// ---- kernels ----------------------------------------------------------------------------------------
/// Everything as 2-D: conv1d is a conv2d with H = 1.
struct Conv2dShape {
  int64_t N, C, H, W, O, KH, KW, OH, OW, g;
  int64_t sh, sw, ph, pw, dh, dw, oph, opw;
  bool transposed;
  bool src_nhwc = false, dst_nhwc = false;  // storage of x / y: [N, H, W, C] instead of [N, C, H, W]
};

/// Contiguous copy of `x` converted to D (returns x itself when already contiguous D).
template <typename D>
Tensor as_contiguous(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype && x.is_contiguous()) return x;
  IntVec sizes = x.int_sizes(), strides = x.int_strides();
  Tensor out = empty(sizes, dtype);
  int64_t n = x.int_numel();
  if (n == 0) return out;
  dispatch_dtype(x.dtype(), [&]<typename S>() {
    const S* src = x.data_ptr<S>();
    D* dst = out.data_ptr<D>();
    IntVec idx(sizes.size(), 0);
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
        dst[i] = D(static_cast<float>(src[off]));
      else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
        dst[i] = static_cast<D>(static_cast<float>(src[off]));
      else
        dst[i] = static_cast<D>(src[off]);
      for (size_t d = sizes.size(); d-- > 0;) {
        off += strides[d];
        if (++idx[d] < sizes[d]) break;
        off -= strides[d] * sizes[d];
        idx[d] = 0;
      }
    }
  });
  return out;
}

/// A 2x2 transposed convolution of stride 2, without padding, output padding, dilation or groups, on
/// NCHW storage: a learned 2x upsampling (DBNet's heads in PP-OCR det) in which every output pixel
/// receives exactly one tap,
///   y[n, o, 2i + a, 2j + b] = bias[o] + Σ_c x[n, c, i, j] · w[c, o, a, b].
/// oneDNN 2.6 runs these on its generic deconvolution with a 16-channel blocked source and destination
/// (two reorders per call) and pads O to 16: det's 24→1 at 320² took 10.9 ms plus 4.5 ms of reorders
/// for 9.8 M multiply-adds. Limited to small channel products, where a row kernel keeps up with a GEMM.
bool deconv_is_upsample(const Conv2dShape& s) {
  return s.transposed && s.g == 1 && s.KH == 2 && s.KW == 2 && s.sh == 2 && s.sw == 2 && s.ph == 0 && s.pw == 0 &&
         s.oph == 0 && s.opw == 0 && s.dh == 1 && s.dw == 1 && !s.src_nhwc && !s.dst_nhwc && s.C * s.O <= 4096 &&
         s.OH == 2 * s.H && s.OW == 2 * s.W;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // Vec16 never crosses a call of another translation unit
typedef float Vec16 __attribute__((vector_size(64)));  // one AVX-512 register, or two AVX2 / four SSE
typedef int32_t Int16 __attribute__((vector_size(64)));

/// Input rows [r0, r1) of the flattened (n, o, i) rows of deconv_is_upsample's form: for each 16
/// columns j the four taps (a, b) are summed over the input channels in registers, then the two taps of
/// each output row are interleaved into 32 output columns. Compiled for AVX-512 and for the baseline
/// (the library is built for the baseline).
__attribute__((target_clones("avx512f", "default"))) void deconv_upsample_rows(const Conv2dShape& s, const float* x,
                                                                              const float* w, const float* b,
                                                                              float* y, int64_t r0, int64_t r1) {
  const int64_t W = s.W, HW = s.H * s.W;
  const Int16 lo = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
  const Int16 hi = lo + 8;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r % s.H, o = (r / s.H) % s.O, n = r / (s.H * s.O);
    const float init = b ? b[o] : 0.0f;
    const float* xr = x + (n * s.C * s.H + i) * W;  // channel c at xr + c·HW
    const float* wo = w + o * 4;                     // w[c, o, a, b] at wo + c·O·4 + 2a + b
    float* y0 = y + ((n * s.O + o) * s.OH + 2 * i) * s.OW;
    float* y1 = y0 + s.OW;
    int64_t j = 0;
    for (; j + 16 <= W; j += 16) {
      Vec16 a00 = Vec16{} + init, a01 = a00, a10 = a00, a11 = a00;
      for (int64_t c = 0; c < s.C; ++c) {
        Vec16 xv;
        std::memcpy(&xv, xr + c * HW + j, sizeof xv);
        const float* wc = wo + c * s.O * 4;
        a00 += wc[0] * xv;
        a01 += wc[1] * xv;
        a10 += wc[2] * xv;
        a11 += wc[3] * xv;
      }
      const Vec16 r0l = __builtin_shuffle(a00, a01, lo), r0h = __builtin_shuffle(a00, a01, hi);
      const Vec16 r1l = __builtin_shuffle(a10, a11, lo), r1h = __builtin_shuffle(a10, a11, hi);
      std::memcpy(y0 + 2 * j, &r0l, sizeof r0l);
      std::memcpy(y0 + 2 * j + 16, &r0h, sizeof r0h);
      std::memcpy(y1 + 2 * j, &r1l, sizeof r1l);
      std::memcpy(y1 + 2 * j + 16, &r1h, sizeof r1h);
    }
    for (; j < W; ++j) {
      float t00 = init, t01 = init, t10 = init, t11 = init;
      for (int64_t c = 0; c < s.C; ++c) {
        const float xv = xr[c * HW + j];
        const float* wc = wo + c * s.O * 4;
        t00 += wc[0] * xv;
        t01 += wc[1] * xv;
        t10 += wc[2] * xv;
        t11 += wc[3] * xv;
      }
      y0[2 * j] = t00;
      y0[2 * j + 1] = t01;
      y1[2 * j] = t10;
      y1[2 * j + 1] = t11;
    }
  }
}
#pragma GCC diagnostic pop

/// A 1x1 convolution of 1x1 images (a squeeze-and-excitation block's two convs, after its global
/// pooling): per image a matrix-vector product, y[n, o] = b[o] + Σ_c w[o, c] · x[n, c]. oneDNN took
/// 25–48 µs per call on PP-OCRv4 rec's 240→60 … 120→480 ones (primitive setup around ≤ 58 K
/// multiply-adds); the product is a few µs.
bool conv_is_pixel_gemv(const Conv2dShape& s) {
  return !s.transposed && s.g == 1 && s.KH == 1 && s.KW == 1 && s.H == 1 && s.W == 1 && s.OH == 1 && s.OW == 1 &&
         s.ph == 0 && s.pw == 0;
}

__attribute__((target_clones("avx512f", "default"))) void conv_pixel_gemv(const Conv2dShape& s, const float* x,
                                                                         const float* w, const float* b, float* y) {
  const int64_t C = s.C, rem = C % 16;
  for (int64_t n = 0; n < s.N; ++n) {
    const float* xn = x + n * C;
    Vec16 xt{};  // the last C % 16 channels as one vector padded with zeros
    std::memcpy(&xt, xn + C - rem, static_cast<size_t>(rem) * sizeof(float));
    for (int64_t o = 0; o < s.O; ++o) {
      const float* wo = w + o * C;
      Vec16 acc{};
      for (int64_t c = 0; c + 16 <= C; c += 16) {
        Vec16 wv, xv;
        std::memcpy(&wv, wo + c, sizeof wv);
        std::memcpy(&xv, xn + c, sizeof xv);
        acc += wv * xv;
      }
      Vec16 wt{};
      std::memcpy(&wt, wo + C - rem, static_cast<size_t>(rem) * sizeof(float));
      acc += wt * xt;
      // the 16 lanes summed pairwise in registers (outputs are independent, so their chains overlap)
      acc += __builtin_shuffle(acc, Int16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
      acc += __builtin_shuffle(acc, Int16{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
      acc += __builtin_shuffle(acc, Int16{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
      acc += __builtin_shuffle(acc, Int16{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
      y[n * s.O + o] = (b ? b[o] : 0.0f) + acc[0];
    }
  }
}

void deconv_upsample(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y) {
  const int64_t rows = s.N * s.O * s.H;
  const int threads = protean::num_threads();
  const double work = static_cast<double>(rows) * static_cast<double>(s.C * 4 * s.W);
#pragma omp parallel num_threads(threads) if (threads > 1 && work > 262144.0)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    deconv_upsample_rows(s, x, w, b, y, rows * t / nt, rows * (t + 1) / nt);
  }
}

/// Direct convolution in double accumulation (f64 inputs, and oneDNN's unsupported corner cases).
template <typename T>
void conv_direct(const Conv2dShape& s, const T* x, const T* w, const T* b, T* y) {
  int64_t cin_g = s.C / s.g, cout_g = s.O / s.g;
  int64_t total = s.N * s.O * s.OH * s.OW;
  if (!s.transposed) {
#pragma omp parallel for num_threads(protean::num_threads()) if (total * cin_g * s.KH * s.KW > (1 << 18))
    for (int64_t idx = 0; idx < total; ++idx) {
      int64_t ow = idx % s.OW, oh = (idx / s.OW) % s.OH, o = (idx / (s.OW * s.OH)) % s.O, n = idx / (s.OW * s.OH * s.O);
      int64_t grp = o / cout_g;
      double acc = b ? static_cast<double>(b[o]) : 0.0;
      for (int64_t c = 0; c < cin_g; ++c)
        for (int64_t kh = 0; kh < s.KH; ++kh) {
          int64_t ih = oh * s.sh - s.ph + kh * s.dh;
          if (ih < 0 || ih >= s.H) continue;
          for (int64_t kw = 0; kw < s.KW; ++kw) {
            int64_t iw = ow * s.sw - s.pw + kw * s.dw;
            if (iw < 0 || iw >= s.W) continue;
            acc += static_cast<double>(x[((n * s.C + grp * cin_g + c) * s.H + ih) * s.W + iw]) *
                   static_cast<double>(w[((o * cin_g + c) * s.KH + kh) * s.KW + kw]);
          }
        }
      y[idx] = static_cast<T>(acc);
    }
    return;
  }
  // Transposed: gather form. Output (oh, ow) receives x[ih, iw]·w[c, o, kh, kw] when
  // oh = ih·s - p + kh·d.
  int64_t cin_g_t = s.C / s.g;  // input channels per group
#pragma omp parallel for num_threads(protean::num_threads()) if (total * cin_g_t * s.KH * s.KW > (1 << 18))
  for (int64_t idx = 0; idx < total; ++idx) {
    int64_t ow = idx % s.OW, oh = (idx / s.OW) % s.OH, o = (idx / (s.OW * s.OH)) % s.O, n = idx / (s.OW * s.OH * s.O);
    int64_t grp = o / cout_g, oo = o % cout_g;
    double acc = b ? static_cast<double>(b[o]) : 0.0;
    for (int64_t c = 0; c < cin_g_t; ++c) {
      int64_t ci = grp * cin_g_t + c;
      for (int64_t kh = 0; kh < s.KH; ++kh) {
        int64_t th = oh + s.ph - kh * s.dh;
        if (th < 0 || th % s.sh != 0) continue;
        int64_t ih = th / s.sh;
        if (ih >= s.H) continue;
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          int64_t tw = ow + s.pw - kw * s.dw;
          if (tw < 0 || tw % s.sw != 0) continue;
          int64_t iw = tw / s.sw;
          if (iw >= s.W) continue;
          acc += static_cast<double>(x[((n * s.C + ci) * s.H + ih) * s.W + iw]) *
                 static_cast<double>(w[((ci * cout_g + oo) * s.KH + kh) * s.KW + kw]);
        }
      }
    }
    y[idx] = static_cast<T>(acc);
  }
}

// ---- oneDNN path ---------------------------------------------------------------------------------
// The key holds the OpenMP thread count the primitive is made under (oneDNN fixes a primitive's thread
// partition at creation: see MatmulKey in linear.cpp).
struct ConvKey {
  std::array<int64_t, 23> v;
  std::string post;  // DnnlPostOps::key of the requested post-ops ("" for none)
  bool operator==(const ConvKey& o) const = default;
};
struct ConvKeyHash {
  size_t operator()(const ConvKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h ^ (std::hash<std::string>()(k.post) * 31);
  }
};

/// A convolution primitive with the reorders around it. Immutable once built (scratch memory comes
/// from the calling thread), so one entry serves every thread.
struct ConvEntry {
  dnnl::primitive prim;
  dnnl::memory::desc user_x, user_w, user_y, bias;  // plain layouts of the tensors
  dnnl::memory::desc lib_x, lib_w, lib_y;           // the layouts the primitive wants
  dnnl::memory::desc scratchpad;
  dnnl::reorder x_reorder, w_reorder, y_reorder, sum_reorder;
  bool reorder_x = false, reorder_w = false, reorder_y = false;
  bool post_in_primitive = false;  // the post-ops run inside `prim`; else the caller applies them
};

/// Convs that would otherwise run on the GEMM-based kernel although a direct JIT kernel is as fast or
/// faster with its reorders: few-channel k>1 convs (a network's first layer: PP-OCR's 3→16 3x3 stride 2
/// on 48x320 takes 0.087 ms on GEMM, 0.024 ms direct with a blocked destination) and 1x1 convs on at
/// most 256 output pixels (equal time). Besides, oneDNN generates all of its sgemm JIT kernels on the
/// first GEMM call of a process (45–50 ms of CPU here), so a model whose convs all avoid the GEMM
/// kernel reaches its first result that much sooner.
/// Only NCHW sources: with a channels-last source (and for 1x1 convs, either side channels-last) oneDNN
/// already runs a direct kernel on the channels-last tensors without reorders.
bool avoids_gemm(const Conv2dShape& s) {
  if (s.transposed || s.g != 1 || s.src_nhwc) return false;
  int64_t cin = s.C;
  if (s.KH * s.KW > 1) return cin < 16;
  return !s.dst_nhwc && s.OH * s.OW <= 256;
}

/// The source keeps its plain layout (oneDNN's direct kernel reads few-channel NCHW as it is and
/// writes a blocked destination): no reorder of the input.
bool plain_src_blocked_dst(const Conv2dShape& s) { return avoids_gemm(s) && s.KH * s.KW > 1 && !s.src_nhwc; }

bool use_blocked(const Conv2dShape& s) {
  int64_t cin_g = s.C / s.g;
  // A 1x1 conv with few input channels on a large image is pathological for the NCHW GEMM kernel:
  // PP-OCR det's 16→32 1x1 at 320x320 took 65 ms there (fresh output pages included), 4 ms blocked
  // with both reorders.
  bool thin_1x1 = s.KH * s.KW == 1 && cin_g < 32 && s.OH * s.OW >= 16384;
  return s.g > 1 || (s.KH * s.KW > 1 && cin_g >= 16) || thin_1x1 || avoids_gemm(s);
}

dnnl::reorder make_reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  dnnl::engine& eng = dnnl_engine();
  return dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to));
}

/// Builds the primitive for `s`. With `post`, it asks oneDNN for the post-ops and keeps them only
/// when the library still picks the implementation and layouts it picks without them (some post-ops
/// make it fall back to a slow kernel); otherwise the entry runs the bare convolution.
ConvEntry make_entry(const Conv2dShape& s, bool has_bias, const DnnlPostOps* post) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using ft = dnnl::memory::format_tag;
  auto t0 = std::chrono::steady_clock::now();
  dnnl::engine& eng = dnnl_engine();
  bool blocked = use_blocked(s);
  md ux({s.N, s.C, s.H, s.W}, dt::f32, s.src_nhwc ? ft::nhwc : ft::nchw);
  md uy({s.N, s.O, s.OH, s.OW}, dt::f32, s.dst_nhwc ? ft::nhwc : ft::nchw);
  // Not blocked: the GEMM-based kernel on NCHW, or NHWC when both sides are NHWC, or one side of a
  // 1x1 conv is (there oneDNN picks its brgemm 1x1 kernel: as fast or faster on PP-OCR's 1x1 convs,
  // with the post-ops inside, where the GEMM kernel needs one more pass for them).
  bool nhwc = (s.src_nhwc && s.dst_nhwc) || ((s.src_nhwc || s.dst_nhwc) && s.KH * s.KW == 1);
  ft plain = nhwc ? ft::nhwc : ft::nchw;
  md ax({s.N, s.C, s.H, s.W}, dt::f32, blocked && !plain_src_blocked_dst(s) ? ft::any : plain);
  md ay({s.N, s.O, s.OH, s.OW}, dt::f32, blocked ? ft::any : plain);
  md uw;
  if (!s.transposed) {
    uw = s.g == 1 ? md({s.O, s.C, s.KH, s.KW}, dt::f32, ft::oihw)
                  : md({s.g, s.O / s.g, s.C / s.g, s.KH, s.KW}, dt::f32, ft::goihw);
  } else {
    // PyTorch's [C, O/g, kh, kw] is oneDNN's (g, i, o, h, w) order.
    uw = s.g == 1 ? md({s.O, s.C, s.KH, s.KW}, dt::f32, ft::iohw)
                  : md({s.g, s.O / s.g, s.C / s.g, s.KH, s.KW}, dt::f32, ft::giohw);
  }
  md aw(uw.dims(), dt::f32, ft::any);
  md ub = has_bias ? md({s.O}, dt::f32, ft::x) : md();
  dnnl::memory::dims strides{s.sh, s.sw}, dil{s.dh - 1, s.dw - 1}, pl{s.ph, s.pw};
  dnnl::primitive_attr bare;
  bare.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::primitive_attr with_post;  // not a copy of `bare`: attrs are shared handles
  with_post.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (post) with_post.set_post_ops(post->ops);

  ConvEntry e;
  md src_d, w_d, dst_d;
  // Creates the primitive descriptor for `attr`, its layouts and implementation name.
  auto describe = [&](const dnnl::primitive_attr& attr, auto& pd_out) {
    using PD = std::decay_t<decltype(pd_out)>;
    if constexpr (std::is_same_v<PD, dnnl::convolution_forward::primitive_desc>) {
      dnnl::memory::dims pr{s.ph, s.pw};
      // oneDNN wants the right padding that makes its output size formula land on OH/OW exactly.
      pr[0] = (s.OH - 1) * s.sh + (s.KH - 1) * s.dh + 1 - s.H - s.ph;
      pr[1] = (s.OW - 1) * s.sw + (s.KW - 1) * s.dw + 1 - s.W - s.pw;
      auto d = has_bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                           dnnl::algorithm::convolution_direct, ax, aw, ub, ay,
                                                           strides, dil, pl, pr)
                        : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                           dnnl::algorithm::convolution_direct, ax, aw, ay, strides,
                                                           dil, pl, pr);
      pd_out = PD(d, attr, eng);
    } else {
      dnnl::memory::dims pr{s.ph - s.oph, s.pw - s.opw};
      auto d = has_bias ? dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                             dnnl::algorithm::deconvolution_direct, ax, aw, ub, ay,
                                                             strides, dil, pl, pr)
                        : dnnl::deconvolution_forward::desc(dnnl::prop_kind::forward_inference,
                                                             dnnl::algorithm::deconvolution_direct, ax, aw, ay,
                                                             strides, dil, pl, pr);
      pd_out = PD(d, attr, eng);
    }
  };
  auto build = [&](auto pd) {
    describe(bare, pd);
    if (post) {
      decltype(pd) fused;
      bool ok = true;
      try {
        describe(with_post, fused);
      } catch (const dnnl::error&) {
        ok = false;
      }
      // The GEMM-based convolution applies post-ops other than relu with scalar loops after the GEMM
      // (a linear or binary post-op made a 64→128 1x1 conv 10–70× slower), so run_post_ops does it
      // in one JIT pass, like the generated kernel it replaces. (A 1x1 conv as a oneDNN matmul with
      // the post-ops inside was measured too: 15–120 % slower than this GEMM conv on rec.)
      ok = ok && std::string(fused.impl_info_str()) == pd.impl_info_str() && fused.src_desc() == pd.src_desc() &&
           fused.weights_desc() == pd.weights_desc() && fused.dst_desc() == pd.dst_desc() &&
           std::string(pd.impl_info_str()).find("gemm") == std::string::npos &&
           std::string(pd.impl_info_str()).find("ref") == std::string::npos;
      if (ok) {
        pd = fused;
        e.post_in_primitive = true;
      }
    }
    if constexpr (std::is_same_v<decltype(pd), dnnl::convolution_forward::primitive_desc>)
      e.prim = dnnl::convolution_forward(pd);
    else
      e.prim = dnnl::deconvolution_forward(pd);
    src_d = pd.src_desc();
    w_d = pd.weights_desc();
    dst_d = pd.dst_desc();
    e.scratchpad = pd.scratchpad_desc();
  };
  if (!s.transposed)
    build(dnnl::convolution_forward::primitive_desc());
  else
    build(dnnl::deconvolution_forward::primitive_desc());
  e.user_x = ux;
  e.user_w = uw;
  e.user_y = uy;
  e.bias = ub;
  e.lib_x = src_d;
  e.lib_w = w_d;
  e.lib_y = dst_d;
  int64_t made = 1;
  // The GEMM-based kernels (1x1 and few-channel convs) take the weights as they are: no per-call copy.
  if (w_d != uw) {
    e.reorder_w = true;
    e.w_reorder = make_reorder(uw, w_d);
    ++made;
  }
  if (src_d != ux) {
    e.reorder_x = true;
    e.x_reorder = make_reorder(ux, src_d);
    ++made;
  }
  if (dst_d != uy) {
    e.reorder_y = true;
    e.y_reorder = make_reorder(dst_d, uy);
    ++made;
    if (e.post_in_primitive && post->sum_first) {
      e.sum_reorder = make_reorder(uy, dst_d);
      ++made;
    }
  }
  note_dnnl_create(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), made);
  return e;
}

/// The process's convolution primitives, keyed by every shape/parameter and the post-op structure.
using ConvCache = PrimitiveCache<ConvKey, ConvEntry, ConvKeyHash>;

/// Library-layout copies of weights, keyed by the weights' address and layout. An entry holds a weak
/// reference to the weights' storage and the storage's version (protean/tensor_version.h) when it was
/// made; another storage at the address, or a bumped version, rebuilds it. weights="constant" (a graph
/// Constant) packs on the first call; weights="reuse" (a graph input: a parameter, a region use's
/// weights) records the first sighting and packs on the second call that sees the same storage at
/// the same version, so an input that changes on every call is never packed (gemm's policy, linear.cpp).
class PackedWeights {
 public:
  /// The weights `w` (plain layout `from`) in layout `to`, reordered by `reorder`; an undefined
  /// tensor when this call should reorder into scratch instead (`reuse`, first sighting). The packed
  /// tensor is returned by value (shared storage), so a caller keeps it alive even if the cache is
  /// cleared by another thread meanwhile.
  Tensor get(const Tensor& w, const dnnl::memory::desc& from, const dnnl::memory::desc& to,
             const dnnl::reorder& reorder, bool reuse) {
    return get(w, to, reuse, [&](void* packed) {
      dnnl::engine& eng = dnnl_engine();
      dnnl::memory src(from, eng, w.data_ptr()), dst(to, eng, packed);
      reorder.execute(dnnl_stream(), src, dst);
      dnnl_stream().wait();
    });
  }

  /// The same for a packing of our own: `pack(dst)` writes `to.get_size()` bytes; `to` names the
  /// packed layout in the key (a strided descriptor no oneDNN kernel asks for).
  template <typename Pack>
  Tensor get(const Tensor& w, const dnnl::memory::desc& to, bool reuse, Pack&& pack) {
    const std::shared_ptr<Storage>& owner = w.impl()->storage;
    const uint64_t version = core::storage_version(owner.get());
    const uint64_t sample = reuse ? sample_fingerprint(w) : 0;
    Key key{w.data_ptr(), to};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    // reuse: a sample of the plain weights catches new values written without a version bump.
    const bool same = it != map_.end() && it->second.owner.lock() == owner && it->second.version == version &&
                      it->second.sample == sample;
    if (same && it->second.packed.defined()) return it->second.packed;
    if (map_.size() >= kCapacity) std::erase_if(map_, [](const auto& kv) { return kv.second.owner.expired(); });
    if (map_.size() >= kCapacity) map_.clear();
    if (!same && reuse) {
      map_.insert_or_assign(key, Item{owner, version, sample, Tensor()});
      return Tensor();
    }
    Tensor packed = empty({static_cast<int64_t>(to.get_size())}, DType::U8);
    pack(packed.data_ptr());
    map_.insert_or_assign(key, Item{owner, version, sample, packed});
    return packed;
  }

 private:
  struct Key {
    const void* data;
    dnnl::memory::desc layout;
    bool operator==(const Key& o) const { return data == o.data && layout == o.layout; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.data) ^ (static_cast<size_t>(k.layout.get_size()) * 1099511628211ull);
    }
  };
  struct Item {
    std::weak_ptr<Storage> owner;
    uint64_t version = 0;
    uint64_t sample = 0;  // sample_fingerprint when made (reuse), else 0
    Tensor packed;        // undefined: seen once (reuse), not packed
  };
  /// A hash of 64 elements spread evenly over the (contiguous f32) weights, first and last included.
  static uint64_t sample_fingerprint(const Tensor& w) {
    const int64_t n = w.int_numel();
    uint64_t h = 1469598103934665603ull;
    if (n <= 0) return h;
    const auto* base = static_cast<const unsigned char*>(w.data_ptr());
    for (int64_t t = 0; t < 64; ++t) {
      uint32_t bits = 0;
      std::memcpy(&bits, base + (n - 1) * t / 63 * static_cast<int64_t>(sizeof(float)), sizeof bits);
      h = (h ^ bits) * 1099511628211ull;
    }
    return h;
  }
  static constexpr size_t kCapacity = 4096;
  std::mutex mu_;
  std::unordered_map<Key, Item, KeyHash> map_;
};

PackedWeights& packed_weights() {
  static PackedWeights* c = new PackedWeights();  // never destroyed, like conv_cache()
  return *c;
}

/// Post-ops of a fused call: the list, the call's inputs (operands by index) and its output sizes.
struct PostCall {
  const std::vector<PostOp>* ops = nullptr;
  std::span<const Tensor> in;
  IntVec out;  // logical output sizes of the fused op
  bool batched = true;
  int spatial = 2;
};

/// Runs the convolution through oneDNN into `y` (plain NCHW f32). Returns true when the post-ops of
/// `post` (if any) were applied inside the primitive; false means the caller must apply them.
bool conv_dnnl(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y, const PostCall* post,
               const Tensor* const_w = nullptr, bool reuse_w = false) {
  dnnl::stream& strm = dnnl_stream();
  // oneDNN (OpenMP build) runs with this thread's OpenMP thread count.
  if (omp_get_max_threads() != protean::num_threads()) omp_set_num_threads(protean::num_threads());
  ConvKey key{{s.N, s.C, s.H, s.W, s.O, s.KH, s.KW, s.g, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, s.oph, s.opw, s.transposed,
               b != nullptr, s.OH, s.OW, s.src_nhwc, s.dst_nhwc, omp_get_max_threads()},
              {}};
  DnnlPostOps dp;
  bool have_post = false;
  std::shared_ptr<const ConvEntry> ep;
  if (post) {
    // Logical operand dims → the 4-D destination [N, O, OH, OW] (unbatched: N = 1; conv1d: OH = 1).
    dnnl::memory::dims dst{s.N, s.O, s.OH, s.OW};
    auto dims_of = [&](const IntVec& logical, dnnl::memory::dims& d) {
      IntVec v = logical;
      if (!post->batched) v.insert(v.begin(), 1);
      if (post->spatial == 1) v.insert(v.begin() + 2, 1);
      if (v.size() != 4) return false;
      for (size_t i = 0; i < 4; ++i)
        if (v[i] != 1 && v[i] != dst[i]) return false;
      d.assign(v.begin(), v.end());
      return true;
    };
    have_post = build_dnnl_post_ops(*post->ops, post->in, post->out, dims_of, use_blocked(s), dp);
    if (have_post) key.post = dp.key;  // never empty: every post-op adds to it
  }
  ep = ConvCache::instance().get(
      key, [&] { return std::make_shared<const ConvEntry>(make_entry(s, b != nullptr, have_post ? &dp : nullptr)); });
  const ConvEntry& e = *ep;
  dnnl::engine& eng = dnnl_engine();
  // The plain-layout memory objects of this primitive, made once per thread and pointed at this
  // call's buffers: four dnnl_memory_create calls (each allocating) per conv were ~1 % of PP-OCRv4
  // rec at width 160. The map keeps its entries' primitives alive, so a key is never a reused address.
  struct UserMemories {
    std::shared_ptr<const ConvEntry> entry;
    dnnl::memory x, w, y, bias;
  };
  static thread_local std::unordered_map<const ConvEntry*, UserMemories> user_memories;
  UserMemories& um = user_memories[ep.get()];
  if (!um.entry) {
    if (user_memories.size() > 4096) {  // bounded like the primitive cache; rebuilt on demand
      user_memories.clear();
      return conv_dnnl(s, x, w, b, y, post, const_w, reuse_w);
    }
    um = {ep, dnnl::memory(e.user_x, eng, DNNL_MEMORY_NONE), dnnl::memory(e.user_w, eng, DNNL_MEMORY_NONE),
          dnnl::memory(e.user_y, eng, DNNL_MEMORY_NONE),
          b ? dnnl::memory(e.bias, eng, DNNL_MEMORY_NONE) : dnnl::memory()};
  }
  um.x.set_data_handle(const_cast<float*>(x));
  um.w.set_data_handle(const_cast<float*>(w));
  um.y.set_data_handle(y);
  dnnl::memory ux = um.x, uw = um.w, uy = um.y;
  dnnl::memory src = ux, wts = uw, dst = uy;
  Tensor packed_w;  // keeps the packed weights alive until the primitive has run
  if (e.reorder_w && const_w && !(reuse_w && dnnl_prepare_only())) {
    packed_w = packed_weights().get(*const_w, e.user_w, e.lib_w, e.w_reorder, reuse_w);
    if (packed_w.defined()) wts = dnnl::memory(e.lib_w, eng, packed_w.data_ptr());
  }
  if (dnnl_prepare_only()) return have_post && e.post_in_primitive;  // built and packed; run nothing
  // the team on distinct CPUs (ops/thread_binding.h): else a woken worker may share this CPU
  TeamBinding bind(s.N * s.O * s.OH * s.OW * (s.C / s.g) * s.KH * s.KW >= kBindTeamMinMacs);
  if (e.reorder_w && !packed_w.defined()) {
    wts = dnnl::memory(e.lib_w, eng, thread_scratch(ScratchSlot::Weights, e.lib_w.get_size()));
    e.w_reorder.execute(strm, uw, wts);
  }
  if (e.reorder_x) {
    src = dnnl::memory(e.lib_x, eng, thread_scratch(ScratchSlot::Src, e.lib_x.get_size()));
    e.x_reorder.execute(strm, ux, src);
  }
  if (e.reorder_y) dst = dnnl::memory(e.lib_y, eng, thread_scratch(ScratchSlot::Dst, e.lib_y.get_size()));
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wts}, {DNNL_ARG_DST, dst}};
  if (b) {
    um.bias.set_data_handle(const_cast<float*>(b));
    args.emplace(DNNL_ARG_BIAS, um.bias);
  }
  if (e.scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, scratch_memory(e.scratchpad));
  bool in_primitive = have_post && e.post_in_primitive;
  if (in_primitive) {
    add_post_op_args(dp, args);
    if (dp.sum_first) {  // the destination starts as the residual
      Tensor r = kernel::contiguous(kernel::to_dtype(dp.sum_operand, DType::F32));
      if (e.reorder_y) {
        dnnl::memory plain(e.user_y, eng, r.data_ptr());
        e.sum_reorder.execute(strm, plain, dst);
      } else
        std::memcpy(y, r.data_ptr(), e.user_y.get_size());
    }
  }
  e.prim.execute(strm, args);
  if (e.reorder_y) e.y_reorder.execute(strm, dst, uy);
  strm.wait();
  return in_primitive;
}

/// The depthwise convolutions conv_depthwise.h computes: channels-last on both sides, one filter per
/// channel, no dilation, an eltwise post-op list it applies itself.
std::optional<DepthwiseShape> depthwise_shape(const Conv2dShape& s, const std::vector<PostOp>* post) {
  // PROTEAN_CPU_DEPTHWISE=0 hands these to oneDNN (brdgmm_dw) as before: a measuring switch.
  static const bool enabled = [] {
    const char* e = std::getenv("PROTEAN_CPU_DEPTHWISE");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (!enabled || s.transposed || !s.src_nhwc || !s.dst_nhwc || s.g != s.C || s.O != s.C || s.dh != 1 || s.dw != 1)
    return std::nullopt;
  DepthwiseShape d{s.N, s.C, s.H, s.W, s.OH, s.OW, s.KH, s.KW, s.sh, s.sw, s.ph, s.pw};
  if (!depthwise_nhwc_fits(d, post)) return std::nullopt;
  return d;
}

/// Runs depthwise_nhwc with the weights packed as it reads them: kept across calls for constant and
/// reused weights (`const_w`, as conv_dnnl keeps oneDNN's layouts), else packed into scratch.
void conv_depthwise(const DepthwiseShape& d, const float* x, const float* w, const float* b, float* y,
                    const std::vector<PostOp>* post, const Tensor* const_w, bool reuse_w) {
  const int64_t K = d.KH * d.KW;
  // The key names this packing: [C, 1, 1, KH, KW] stored with C innermost.
  const dnnl::memory::desc packed_desc({d.C, 1, 1, d.KH, d.KW}, dnnl::memory::data_type::f32,
                                       dnnl::memory::dims{1, K * d.C, K * d.C, d.KW * d.C, d.C});
  auto pack = [&](void* dst) { pack_depthwise_weights(w, d.C, d.KH, d.KW, static_cast<float*>(dst)); };
  Tensor kept;
  if (const_w) kept = packed_weights().get(*const_w, packed_desc, reuse_w, pack);
  if (dnnl_prepare_only()) return;
  const float* wp = nullptr;
  if (kept.defined()) {
    wp = static_cast<const float*>(kept.data_ptr());
  } else {
    void* scratch = thread_scratch(ScratchSlot::Weights, static_cast<size_t>(K * d.C) * sizeof(float));
    pack(scratch);
    wp = static_cast<const float*>(scratch);
  }
  depthwise_nhwc(d, x, wp, b, y, post);
}

/// True when `post` (if any) holds only operand-free post-ops (relu … linear), which apply_post_ops
/// runs on the result whatever its layout.
bool eltwise_only(const std::vector<PostOp>* post) {
  if (post)
    for (const PostOp& p : *post)
      if (!is_eltwise(p.kind)) return false;
  return true;
}

std::vector<Tensor> conv_kernel(OpKind op, std::span<const Tensor> in, const Attrs& attrs,
                                std::span<const TensorMeta> out, const std::vector<PostOp>* post_ops) {
  ConvArgs a = parse_args(op, in, attrs);
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const Tensor& b = in[2];
  Tensor y = empty_like_meta(out[0]);
  IntVec xs = x.int_sizes(), ws = w.int_sizes(), ys = y.int_sizes();
  // Channels-last storage: the logical [N, C, H, W] sizes (the post-ops below have no operands).
  if (a.src_nhwc) std::rotate(xs.begin() + 1, xs.begin() + 3, xs.end());
  if (a.dst_nhwc) std::rotate(ys.begin() + 1, ys.begin() + 3, ys.end());
  PostCall pc;
  if (post_ops) pc = {post_ops, in, ys, x.dim() == a.spatial + 2, a.spatial};
  bool batched = x.dim() == a.spatial + 2;
  if (!batched) {
    xs.insert(xs.begin(), 1);
    ys.insert(ys.begin(), 1);
  }
  if (a.spatial == 1) {  // [N, C, L] → [N, C, 1, L]
    xs.insert(xs.begin() + 2, 1);
    ys.insert(ys.begin() + 2, 1);
    ws.insert(ws.begin() + 2, 1);
    a.stride.insert(a.stride.begin(), 1);
    a.padding.insert(a.padding.begin(), 0);
    a.dilation.insert(a.dilation.begin(), 1);
  }
  Conv2dShape s{xs[0], xs[1], xs[2], xs[3], ys[1], ws[2], ws[3], ys[2], ys[3], a.groups,
                a.stride[0], a.stride[1], a.padding[0], a.padding[1], a.dilation[0], a.dilation[1],
                a.transposed ? a.output_padding[0] : 0, a.transposed ? a.output_padding[1] : 0, a.transposed,
                a.src_nhwc, a.dst_nhwc};
  if (y.int_numel() == 0) return {y};
  auto finish = [&](const Tensor& r, bool post_done) -> std::vector<Tensor> {
    if (!post_ops || post_done) return {r};
    if (!dnnl_prepare_only()) note_dnnl_post_op_fallback();
    return {run_post_ops(r, *post_ops, in)};
  };
  DType dt = x.dtype();
  if (dt != DType::F32 && (a.src_nhwc || a.dst_nhwc))
    throw NotImplementedError(fmt::format("{}: channels-last layouts are implemented for f32 only", describe_call(op, in)));
  if (dt == DType::F64) {
    Tensor xc = as_contiguous<double>(x, dt), wc = as_contiguous<double>(w, dt);
    Tensor bc = b.defined() ? as_contiguous<double>(b, dt) : Tensor();
    conv_direct<double>(s, xc.data_ptr<double>(), wc.data_ptr<double>(), bc.defined() ? bc.data_ptr<double>() : nullptr,
                        y.data_ptr<double>());
    return finish(y, false);
  }
  Tensor xc = as_contiguous<float>(x, DType::F32), wc = as_contiguous<float>(w, DType::F32);
  Tensor bc = b.defined() ? as_contiguous<float>(b, DType::F32) : Tensor();
  Tensor yf = dt == DType::F32 ? y : empty(y.int_sizes(), DType::F32);
  const float* bp = bc.defined() ? bc.data_ptr<float>() : nullptr;
  bool degenerate = s.C == 0 || (s.transposed && (s.ph < s.oph || s.pw < s.opw));
  if (degenerate && (a.src_nhwc || a.dst_nhwc))
    throw NotImplementedError(fmt::format("{}: channels-last layouts need input channels", describe_call(op, in)));
  bool post_done = false;
  if (dnnl_prepare_only() && (degenerate || s.transposed || dt != DType::F32)) return {y};
  if (degenerate)
    conv_direct<float>(s, s.C ? xc.data_ptr<float>() : nullptr, s.C ? wc.data_ptr<float>() : nullptr, bp,
                       yf.data_ptr<float>());
  else if (auto dw = dt == DType::F32 ? depthwise_shape(s, post_ops) : std::nullopt) {
    conv_depthwise(*dw, xc.data_ptr<float>(), wc.data_ptr<float>(), bp, yf.data_ptr<float>(), post_ops,
                   (a.const_weights || a.reuse_weights) && wc.impl() == w.impl() ? &w : nullptr, a.reuse_weights);
    post_done = true;
  } else if (dt == DType::F32 && conv_is_pixel_gemv(s) && eltwise_only(post_ops)) {
    if (dnnl_prepare_only()) return {y};
    conv_pixel_gemv(s, xc.data_ptr<float>(), wc.data_ptr<float>(), bp, yf.data_ptr<float>());
    if (post_ops) apply_post_ops(yf, *post_ops, in);  // a few elements: plain loops, eager's NaN rules
    post_done = true;
  } else if (!s.transposed)
    post_done = conv_dnnl(s, xc.data_ptr<float>(), wc.data_ptr<float>(), bp, yf.data_ptr<float>(),
                          post_ops ? &pc : nullptr,
                          (a.const_weights || a.reuse_weights) && wc.impl() == w.impl() ? &w : nullptr, a.reuse_weights);
  else if (deconv_is_upsample(s)) {
    deconv_upsample(s, xc.data_ptr<float>(), wc.data_ptr<float>(), bp, yf.data_ptr<float>());
  } else {
    // oneDNN 2.6's deconvolution adds a bias and applies post-ops with scalar loops after its JIT
    // kernel (det's 24→1 2x2 deconv at 320²: 5.7 ms bare, 22 ms with a bias, 170 ms with a relu), so
    // the bias is one more pass here (a oneDNN binary primitive), and the post-ops stay with finish.
    conv_dnnl(s, xc.data_ptr<float>(), wc.data_ptr<float>(), nullptr, yf.data_ptr<float>(), nullptr);
    if (bp) {
      IntVec shape{s.O};
      shape.insert(shape.end(), static_cast<size_t>(yf.dim() - (batched ? 2 : 1)), 1);
      PostOp add{PostOpKind::add};
      add.operand[0] = 0;
      std::vector<Tensor> bias_in{reshape(bc, to_symint_vec(shape))};
      yf = run_post_ops(yf, {add}, bias_in);
    }
  }
  if (dt != DType::F32) {
    const float* src = yf.data_ptr<float>();
    dispatch_dtype(dt, [&]<typename T>() {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        T* dst = y.data_ptr<T>();
        for (int64_t i = 0; i < y.int_numel(); ++i) dst[i] = T(src[i]);
      }
    });
  }
  return finish(dt == DType::F32 ? yf : y, post_done);
}

std::vector<Tensor> kernel_conv1d(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return conv_kernel(OpKind::conv1d, in, attrs, out, nullptr);
}
std::vector<Tensor> kernel_conv2d(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return conv_kernel(OpKind::conv2d, in, attrs, out, nullptr);
}
std::vector<Tensor> kernel_conv_transpose2d(std::span<const Tensor> in, const Attrs& attrs,
                                            std::span<const TensorMeta> out) {
  return conv_kernel(OpKind::conv_transpose2d, in, attrs, out, nullptr);
}

// ---- fused forms: the base conv on inputs 0..2, then the post-op list (post_ops.h) ------------------
template <OpKind Base, OpKind Fused>
std::vector<TensorMeta> meta_conv_fused(std::span<const Tensor> in, const Attrs& attrs) {
  if (in.size() < 3)
    throw ValueError(fmt::format("{}: expected (x, w, bias or None, post-op operands...), got {} inputs",
                                 op_name(Fused), in.size()));
  std::vector<TensorMeta> m = meta_conv_common(Base, in.first(3), attrs);
  if (in.size() > 3 && attrs.has("dst_layout") && attrs.s("dst_layout") == "nhwc")
    throw ValueError(fmt::format("{}: dst_layout=\"nhwc\" takes no post-op operands", op_name(Fused)));
  check_post_ops(Fused, in, 3, parse_post_ops_cached(attrs.s("post_ops")), m[0].sizes, m[0].dtype);
  return m;
}
template <OpKind Base>
std::vector<Tensor> kernel_conv_fused(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  std::vector<PostOp> post = parse_post_ops_cached(attrs.s("post_ops"));
  return conv_kernel(Base, in, attrs, out, &post);
}

}  // namespace

PROTEAN_REGISTER_OP(conv1d, meta_conv1d, kernel_conv1d);
PROTEAN_REGISTER_OP(conv2d, meta_conv2d, kernel_conv2d);
PROTEAN_REGISTER_OP(conv_transpose2d, meta_conv_transpose2d, kernel_conv_transpose2d);
PROTEAN_REGISTER_OP(conv1d_fused, (meta_conv_fused<OpKind::conv1d, OpKind::conv1d_fused>),
                    kernel_conv_fused<OpKind::conv1d>);
PROTEAN_REGISTER_OP(conv2d_fused, (meta_conv_fused<OpKind::conv2d, OpKind::conv2d_fused>),
                    kernel_conv_fused<OpKind::conv2d>);
PROTEAN_REGISTER_OP(conv_transpose2d_fused, (meta_conv_fused<OpKind::conv_transpose2d, OpKind::conv_transpose2d_fused>),
                    kernel_conv_fused<OpKind::conv_transpose2d>);

}  // namespace protean::ops
