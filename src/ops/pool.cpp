// max_pool2d, avg_pool2d, adaptive_avg_pool2d: meta functions and CPU kernels.
//
// Semantics (torch.nn.functional, NCHW; a 3-D input [C, H, W] is unbatched; batch 0 is allowed):
//  * window output size per spatial dim (PyTorch's pooling_output_shape):
//      out = floordiv(L + 2p - d(k-1) - 1 + (ceil_mode ? s-1 : 0), s) + 1
//      and with ceil_mode, when the last window would start at or past L + p (entirely in the right
//      padding), it is dropped: if (out-1)·s >= L + p then out -= 1. out must be ≥ 1.
//  * padding must be ≤ half the (dilated) kernel size.
//  * max_pool2d: maximum over the in-bounds elements of each window (padding never wins); NaN propagates.
//  * avg_pool2d: the window is clipped to [−p, L+p); count_include_pad divides by that clipped size,
//    otherwise by the number of in-bounds elements. Integer inputs divide with truncation.
//    layout="nhwc" (set by the cpu backend's conv_layout pass in channels-last regions): input and
//    output stored channels-last, sizes [N, H, W, C] and [N, OH, OW, C]; the same windows and divisors.
//  * adaptive_avg_pool2d: output cell i averages input [floor(i·L/O), ceil((i+1)·L/O)).
//    src_layout="nhwc" (set by the cpu backend's conv_layout pass on the global pooling of an SE block):
//    the input is stored channels-last, its sizes [N, H, W, C]; the output is [N, C, OH, OW] as always.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/layout_attr.h"
#include "ops/meta_utils.h"
#include "ops/pool2x2.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

IntVec pair_param(const Attrs& attrs, const char* name, OpKind op, std::span<const Tensor> in, int64_t min_value,
                  IntVec dflt) {
  IntVec v = attrs.has(name) ? attrs.ints(name) : dflt;
  if (v.empty()) v = dflt;
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2)
    throw ValueError(fmt::format("{}: {} must have 1 or 2 values, got {}", describe_call(op, in), name,
                                 to_string(to_symint_vec(v))));
  for (int64_t x : v)
    if (x < min_value)
      throw ValueError(fmt::format("{}: {} must be ≥ {}, got {}", describe_call(op, in), name, min_value,
                                   to_string(to_symint_vec(v))));
  return v;
}

void check_input_rank(OpKind op, std::span<const Tensor> in) {
  const Tensor& x = in[0];
  if (x.dim() != 3 && x.dim() != 4)
    throw ShapeError(fmt::format("{}: expected a 3-D [C, H, W] or 4-D [N, C, H, W] input, got rank {}",
                                 describe_call(op, in), x.dim()));
  for (int64_t d = x.dim() - 3; d < x.dim(); ++d)
    if (static_cast<bool>(x.size(d) == 0))
      throw ShapeError(fmt::format("{}: only the batch dim may be empty (dim {} has size 0)", describe_call(op, in), d));
}

struct PoolArgs {
  IntVec k, s, p, d;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

PoolArgs pool_args(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  PoolArgs a;
  a.k = pair_param(attrs, "kernel_size", op, in, 1, {});
  a.s = pair_param(attrs, "stride", op, in, 1, a.k);
  a.p = pair_param(attrs, "padding", op, in, 0, {0, 0});
  a.d = op == OpKind::max_pool2d ? pair_param(attrs, "dilation", op, in, 1, {1, 1}) : IntVec{1, 1};
  a.ceil_mode = attrs.has("ceil_mode") && attrs.b("ceil_mode");
  a.count_include_pad = !attrs.has("count_include_pad") || attrs.b("count_include_pad");
  for (size_t i = 0; i < 2; ++i) {
    int64_t eff = op == OpKind::max_pool2d ? (a.k[i] - 1) * a.d[i] + 1 : a.k[i];
    if (a.p[i] * 2 > eff)
      throw ValueError(fmt::format("{}: padding {} must be at most half of the kernel size {}", describe_call(op, in),
                                   to_string(to_symint_vec(a.p)), to_string(to_symint_vec(a.k))));
  }
  return a;
}

SymInt pooled_size(const SymInt& L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  SymInt out = (L + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0)) / s + 1;
  if (ceil_mode && static_cast<bool>((out - 1) * s >= L + p)) out = out - 1;
  return out;
}

/// avg_pool2d's layout attribute (ops/layout_attr.h).
bool window_pool_nhwc(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  const bool nhwc = layout_is_nhwc(op, in, attrs, OpKind::avg_pool2d);
  if (nhwc && in[0].dim() != 4)
    throw ValueError(fmt::format("{}: layout=\"nhwc\" needs a batched (4-D) input", describe_call(op, in)));
  return nhwc;
}

std::vector<TensorMeta> meta_window_pool(OpKind op, std::span<const Tensor> in, const Attrs& attrs) {
  check_input_rank(op, in);
  const Tensor& x = in[0];
  if (x.dtype() == DType::Bool || (op == OpKind::avg_pool2d && is_integral(x.dtype()) && x.dtype() != DType::I64))
    throw TypeError(fmt::format("{}: dtype {} not supported (expected {})", describe_call(op, in),
                                short_name(x.dtype()),
                                op == OpKind::max_pool2d ? "a floating or integer dtype" : "a floating dtype or i64"));
  PoolArgs a = pool_args(op, in, attrs);
  const bool nhwc = window_pool_nhwc(op, in, attrs);
  SymIntVec out(x.sizes().begin(), x.sizes().end() - (nhwc ? 3 : 2));
  for (int i = 0; i < 2; ++i) {
    size_t ui = static_cast<size_t>(i);
    SymInt L = x.size(x.dim() - (nhwc ? 3 : 2) + i);
    SymInt o = pooled_size(L, a.k[ui], a.s[ui], a.p[ui], a.d[ui], a.ceil_mode);
    if (static_cast<bool>(o < 1))
      throw ShapeError(fmt::format("{}: output size {} in spatial dim {} is too small (input {}, kernel {}, stride {}, "
                                   "padding {}, dilation {})",
                                   describe_call(op, in), o.str(), i, L.str(), a.k[ui], a.s[ui], a.p[ui], a.d[ui]));
    out.push_back(o);
  }
  if (nhwc) out.push_back(x.size(3));
  return one(std::move(out), x.dtype());
}

std::vector<TensorMeta> meta_max_pool2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_window_pool(OpKind::max_pool2d, in, attrs);
}
std::vector<TensorMeta> meta_avg_pool2d(std::span<const Tensor> in, const Attrs& attrs) {
  return meta_window_pool(OpKind::avg_pool2d, in, attrs);
}

/// adaptive_avg_pool2d's src_layout attribute: true for "nhwc" (a 4-D input stored [N, H, W, C]).
bool pool_src_nhwc(std::span<const Tensor> in, const Attrs& attrs) {
  if (!attrs.has("src_layout")) return false;
  const std::string& v = attrs.s("src_layout");
  if (v != "nchw" && v != "nhwc")
    throw ValueError(fmt::format("{}: src_layout must be \"nchw\" or \"nhwc\", got \"{}\"",
                                 describe_call(OpKind::adaptive_avg_pool2d, in), v));
  if (v == "nhwc" && in[0].dim() != 4)
    throw ValueError(fmt::format("{}: src_layout=\"nhwc\" needs a batched (4-D) input",
                                 describe_call(OpKind::adaptive_avg_pool2d, in)));
  return v == "nhwc";
}

std::vector<TensorMeta> meta_adaptive_avg_pool2d(std::span<const Tensor> in, const Attrs& attrs) {
  check_input_rank(OpKind::adaptive_avg_pool2d, in);
  const Tensor& x = in[0];
  if (!is_floating(x.dtype()))
    throw TypeError(fmt::format("{}: dtype {} not supported (expected a floating dtype)",
                                describe_call(OpKind::adaptive_avg_pool2d, in), short_name(x.dtype())));
  IntVec os = attrs.ints("output_size");
  if (os.size() == 1) os.push_back(os[0]);
  if (os.size() != 2 || os[0] < 1 || os[1] < 1)
    throw ValueError(fmt::format("{}: output_size must be 1 or 2 positive values, got {}",
                                 describe_call(OpKind::adaptive_avg_pool2d, in), to_string(to_symint_vec(os))));
  if (pool_src_nhwc(in, attrs)) return one({x.sizes()[0], x.sizes()[3], os[0], os[1]}, x.dtype());
  SymIntVec out(x.sizes().begin(), x.sizes().end() - 2);
  out.push_back(os[0]);
  out.push_back(os[1]);
  return one(std::move(out), x.dtype());
}

// ---- kernels ------------------------------------------------------------------------------------------
/// Input viewed as planes [P = N·C] of [H, W] with arbitrary strides; output contiguous.
struct Planes {
  int64_t N, C, H, W, sn, sc, sh, sw;
};
Planes planes_of(const Tensor& x) {
  IntVec sz = x.int_sizes(), st = x.int_strides();
  if (sz.size() == 3) {
    sz.insert(sz.begin(), 1);
    st.insert(st.begin(), 0);
  }
  return {sz[0], sz[1], sz[2], sz[3], st[0], st[1], st[2], st[3]};
}

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, double>, double,
                               std::conditional_t<std::is_floating_point_v<T> || std::is_same_v<T, Half> ||
                                                      std::is_same_v<T, BFloat16>,
                                                  float, int64_t>>;

template <typename T>
T from_acc(Acc<T> v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

std::vector<Tensor> kernel_window_pool(OpKind op, std::span<const Tensor> in, const Attrs& attrs,
                                       std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  PoolArgs a = pool_args(op, in, attrs);
  Tensor y = empty_like_meta(out[0]);
  if (y.int_numel() == 0) return {y};
  Planes pl = planes_of(x);
  IntVec ys = y.int_sizes();
  int64_t OH = ys[ys.size() - 2], OW = ys.back();
  int64_t kh = a.k[0], kw = a.k[1], sh = a.s[0], sw = a.s[1], ph = a.p[0], pw = a.p[1], dh = a.d[0], dw = a.d[1];
  if (window_pool_nhwc(op, in, attrs)) {
    // avg_pool2d on channels-last storage: x [N, H, W, C], y [N, OH, OW, C]; each output pixel sums its
    // window's channel rows (contiguous when x's channel stride is 1), with the divisor rule below.
    IntVec xs = x.int_sizes(), st = x.int_strides();
    const int64_t N = xs[0], H = xs[1], W = xs[2], C = xs[3];
    OH = ys[1];
    OW = ys[2];
    dispatch_dtype(x.dtype(), [&]<typename T>() {
      if constexpr (!std::is_same_v<T, bool>) {
        using A = Acc<T>;
        const T* src = x.data_ptr<T>();
        T* dst = y.data_ptr<T>();
#pragma omp parallel num_threads(protean::num_threads()) if (N * OH * OW * C * kh * kw > (1 << 16))
        {
          std::vector<A> sum(static_cast<size_t>(C));
#pragma omp for
          for (int64_t r = 0; r < N * OH * OW; ++r) {
            const int64_t n = r / (OH * OW), oh = r / OW % OH, ow = r % OW;
            const int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
            int64_t hs = h0, ws = w0, he = std::min(h0 + kh, H + ph), we = std::min(w0 + kw, W + pw);
            const int64_t pool_size = (he - hs) * (we - ws);
            hs = std::max<int64_t>(hs, 0);
            ws = std::max<int64_t>(ws, 0);
            he = std::min(he, H);
            we = std::min(we, W);
            std::fill(sum.begin(), sum.end(), A(0));
            A* acc = sum.data();
            for (int64_t h = hs; h < he; ++h)
              for (int64_t w = ws; w < we; ++w) {
                const T* px = src + n * st[0] + h * st[1] + w * st[2];
                if (st[3] == 1) {
#pragma omp simd
                  for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<A>(px[c]);
                } else {
                  for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<A>(px[c * st[3]]);
                }
              }
            const int64_t div = a.count_include_pad ? pool_size : (he - hs) * (we - ws);
            T* o = dst + r * C;
            for (int64_t c = 0; c < C; ++c) o[c] = from_acc<T>(div > 0 ? acc[c] / static_cast<A>(div) : A(0));
          }
        }
      }
    });
    return {y};
  }
  int64_t P = pl.N * pl.C;
  bool is_max = op == OpKind::max_pool2d;
  // 2x2 windows, stride 2, no padding or dilation, f32 rows with contiguous columns: the vector kernel
  if (is_max && x.dtype() == DType::F32 && kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 &&
      dw == 1 && pl.sw == 1 && 2 * OH <= pl.H && 2 * OW <= pl.W && max_pool_2x2_supported()) {
    const float* src = x.data_ptr<float>();
    float* dst = y.data_ptr<float>();
#pragma omp parallel for num_threads(protean::num_threads()) if (P * OH * OW > (1 << 16))
    for (int64_t pi = 0; pi < P; ++pi)
      max_pool_2x2_forward(src + (pi / pl.C) * pl.sn + (pi % pl.C) * pl.sc, pl.sh, OH, OW, dst + pi * OH * OW);
    return {y};
  }
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      using A = Acc<T>;
      const T* src = x.data_ptr<T>();
      T* dst = y.data_ptr<T>();
#pragma omp parallel for num_threads(protean::num_threads()) if (P * OH * OW * kh * kw > (1 << 16))
      for (int64_t pi = 0; pi < P; ++pi) {
        const T* plane = src + (pi / pl.C) * pl.sn + (pi % pl.C) * pl.sc;
        T* o = dst + pi * OH * OW;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
            if constexpr (std::is_floating_point_v<T>) {
              // A max window entirely inside the plane: no bounds tests; any NaN in the window makes the
              // maximum NaN, as on the general path.
              if (is_max && h0 >= 0 && w0 >= 0 && h0 + (kh - 1) * dh < pl.H && w0 + (kw - 1) * dw < pl.W) {
                const T* wp = plane + h0 * pl.sh + w0 * pl.sw;
                T best = wp[0];
                bool nan = false;
                for (int64_t i = 0; i < kh; ++i)
                  for (int64_t j = 0; j < kw; ++j) {
                    const T v = wp[i * dh * pl.sh + j * dw * pl.sw];
                    nan |= v != v;
                    best = v > best ? v : best;  // a max instruction, no data-dependent branch
                  }
                o[oh * OW + ow] = nan ? std::numeric_limits<T>::quiet_NaN() : best;
                continue;
              }
            }
            if (is_max) {
              A best = std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity()
                                                            : std::numeric_limits<A>::lowest();
              bool nan = false;
              for (int64_t i = 0; i < kh; ++i) {
                int64_t h = h0 + i * dh;
                if (h < 0 || h >= pl.H) continue;
                for (int64_t j = 0; j < kw; ++j) {
                  int64_t w = w0 + j * dw;
                  if (w < 0 || w >= pl.W) continue;
                  A v = static_cast<A>(plane[h * pl.sh + w * pl.sw]);
                  if constexpr (std::is_floating_point_v<A>)
                    if (std::isnan(v)) nan = true;
                  if (v > best) best = v;
                }
              }
              if constexpr (std::is_floating_point_v<A>)
                if (nan) best = std::numeric_limits<A>::quiet_NaN();
              o[oh * OW + ow] = from_acc<T>(best);
            } else {
              int64_t hs = h0, ws = w0;
              int64_t he = std::min(h0 + kh, pl.H + ph), we = std::min(w0 + kw, pl.W + pw);
              int64_t pool_size = (he - hs) * (we - ws);
              hs = std::max<int64_t>(hs, 0);
              ws = std::max<int64_t>(ws, 0);
              he = std::min(he, pl.H);
              we = std::min(we, pl.W);
              A sum = 0;
              for (int64_t h = hs; h < he; ++h)
                for (int64_t w = ws; w < we; ++w) sum += static_cast<A>(plane[h * pl.sh + w * pl.sw]);
              int64_t div = a.count_include_pad ? pool_size : (he - hs) * (we - ws);
              o[oh * OW + ow] = from_acc<T>(div > 0 ? sum / static_cast<A>(div) : A(0));
            }
          }
      }
    }
  });
  return {y};
}

std::vector<Tensor> kernel_max_pool2d(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return kernel_window_pool(OpKind::max_pool2d, in, attrs, out);
}
std::vector<Tensor> kernel_avg_pool2d(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return kernel_window_pool(OpKind::avg_pool2d, in, attrs, out);
}

std::vector<Tensor> kernel_adaptive_avg_pool2d(std::span<const Tensor> in, const Attrs& attrs,
                                               std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  Tensor y = empty_like_meta(out[0]);
  if (y.int_numel() == 0) return {y};
  Planes pl = planes_of(x);
  const bool nhwc = pool_src_nhwc(in, attrs);
  if (nhwc) {  // sizes [N, H, W, C]: the same planes, channels at stride st[3]
    IntVec sz = x.int_sizes(), st = x.int_strides();
    pl = {sz[0], sz[3], sz[1], sz[2], st[0], st[3], st[1], st[2]};
  }
  IntVec ys = y.int_sizes();
  int64_t OH = ys[ys.size() - 2], OW = ys.back();
  int64_t P = pl.N * pl.C;
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      using A = Acc<T>;
      const T* src = x.data_ptr<T>();
      T* dst = y.data_ptr<T>();
      if (OH == 1 && OW == 1 && pl.sc == 1 && pl.sw == pl.C && pl.sh == pl.W * pl.C) {
        // Global pooling of channels-last images: each pixel adds a contiguous row of C sums.
        std::vector<A> sum(static_cast<size_t>(pl.C));
        for (int64_t n = 0; n < pl.N; ++n) {
          std::fill(sum.begin(), sum.end(), A(0));
          const T* img = src + n * pl.sn;
          A* acc = sum.data();
          for (int64_t px = 0; px < pl.H * pl.W; ++px) {
            const T* row = img + px * pl.C;
#pragma omp simd
            for (int64_t c = 0; c < pl.C; ++c) acc[c] += static_cast<A>(row[c]);
          }
          const A count = static_cast<A>(pl.H * pl.W);
          for (int64_t c = 0; c < pl.C; ++c) dst[n * pl.C + c] = from_acc<T>(sum[static_cast<size_t>(c)] / count);
        }
        return;
      }
#pragma omp parallel for num_threads(protean::num_threads()) if (P * pl.H * pl.W > (1 << 16))
      for (int64_t pi = 0; pi < P; ++pi) {
        const T* plane = src + (pi / pl.C) * pl.sn + (pi % pl.C) * pl.sc;
        for (int64_t oh = 0; oh < OH; ++oh) {
          int64_t hs = (oh * pl.H) / OH, he = ((oh + 1) * pl.H + OH - 1) / OH;
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t ws = (ow * pl.W) / OW, we = ((ow + 1) * pl.W + OW - 1) / OW;
            A sum = 0;
            if (ws == 0 && we == pl.W && pl.sw == 1 && pl.sh == pl.W) {  // whole contiguous rows: one run
              const T* run = plane + hs * pl.sh;
              int64_t n = (he - hs) * pl.W;
#pragma omp simd reduction(+ : sum)
              for (int64_t i = 0; i < n; ++i) sum += static_cast<A>(run[i]);
            } else {
              for (int64_t h = hs; h < he; ++h)
                for (int64_t w = ws; w < we; ++w) sum += static_cast<A>(plane[h * pl.sh + w * pl.sw]);
            }
            dst[(pi * OH + oh) * OW + ow] = from_acc<T>(sum / static_cast<A>((he - hs) * (we - ws)));
          }
        }
      }
    }
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(max_pool2d, meta_max_pool2d, kernel_max_pool2d);
PROTEAN_REGISTER_OP(avg_pool2d, meta_avg_pool2d, kernel_avg_pool2d);
PROTEAN_REGISTER_OP(adaptive_avg_pool2d, meta_adaptive_avg_pool2d, kernel_adaptive_avg_pool2d);

}  // namespace protean::ops
