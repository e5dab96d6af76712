// conv1d / conv2d / conv_transpose2d against direct float64 loops.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/dnnl_stats.h"
#include "ops/post_ops.h"
#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g(1234);
  return g;
}

int64_t numel_of(const IntVec& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

/// Reads element `flat` (row-major logical index) of a strided tensor as double.
std::vector<double> values(const Tensor& t) {
  IntVec sz = t.int_sizes(), st = t.int_strides();
  int64_t n = numel_of(sz);
  std::vector<double> out(static_cast<size_t>(n));
  pt::dispatch_dtype(t.dtype(), [&]<typename T>() {
    const T* p = n ? t.data_ptr<T>() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (size_t d = sz.size(); d-- > 0;) {
        off += (rem % sz[d]) * st[d];
        rem /= sz[d];
      }
      out[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(p[off]));
      if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) out[static_cast<size_t>(i)] = static_cast<double>(p[off]);
    }
  });
  return out;
}

/// A tensor with the given logical values laid out in memory in `perm` order with a gap of `gap`
/// between innermost elements (so it is non-contiguous whenever perm is not identity or gap > 1).
Tensor make(const IntVec& sizes, DType dt, const std::vector<double>& v, IntVec perm = {}, int64_t gap = 1) {
  size_t r = sizes.size();
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(i));
  // memory order: dims perm[0] outermost ... perm[r-1] innermost
  IntVec strides(r, 0);
  int64_t acc = gap;
  for (size_t k = r; k-- > 0;) {
    strides[static_cast<size_t>(perm[k])] = acc;
    acc *= std::max<int64_t>(sizes[static_cast<size_t>(perm[k])], 1);
  }
  Tensor base = pt::empty({acc}, dt);
  Tensor t = pt::ops::make_view(base, pt::TensorMeta{pt::to_symint_vec(sizes), pt::to_symint_vec(strides), 0, dt});
  int64_t n = numel_of(sizes);
  pt::dispatch_dtype(dt, [&]<typename T>() {
    T* p = base.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (size_t d = r; d-- > 0;) {
        off += (rem % sizes[d]) * strides[d];
        rem /= sizes[d];
      }
      if constexpr (std::is_same_v<T, pt::Half> || std::is_same_v<T, pt::BFloat16>)
        p[off] = T(static_cast<float>(v[static_cast<size_t>(i)]));
      else
        p[off] = static_cast<T>(v[static_cast<size_t>(i)]);
    }
  });
  return t;
}

std::vector<double> random_values(int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> di(-3, 3);
  std::normal_distribution<double> dn(0.0, 1.0);
  for (auto& x : v) {
    if (pt::is_floating(dt)) {
      x = dn(rng());
      if (dt == DType::F16) x = static_cast<float>(pt::Half(static_cast<float>(x)));
      if (dt == DType::BF16) x = static_cast<float>(pt::BFloat16(static_cast<float>(x)));
      if (dt == DType::F32) x = static_cast<float>(x);
    } else {
      x = dt == DType::U8 ? std::abs(di(rng())) : di(rng());
    }
  }
  return v;
}

struct ConvCase {
  int64_t N, C, H, W, O, KH, KW, g, sh, sw, ph, pw, dh, dw, oph = 0, opw = 0;
};

/// Direct conv2d reference (cross-correlation, PyTorch weight layout [O, C/g, kh, kw]).
std::vector<double> ref_conv2d(const ConvCase& c, const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>* b, int64_t& OH, int64_t& OW) {
  OH = (c.H + 2 * c.ph - c.dh * (c.KH - 1) - 1) / c.sh + 1;
  OW = (c.W + 2 * c.pw - c.dw * (c.KW - 1) - 1) / c.sw + 1;
  int64_t cg = c.C / c.g, og = c.O / c.g;
  std::vector<double> y(static_cast<size_t>(c.N * c.O * OH * OW));
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double s = b ? (*b)[static_cast<size_t>(o)] : 0.0;
          int64_t grp = o / og;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                int64_t ih = oh * c.sh - c.ph + kh * c.dh, iw = ow * c.sw - c.pw + kw * c.dw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                s += x[static_cast<size_t>(((n * c.C + grp * cg + ci) * c.H + ih) * c.W + iw)] *
                     w[static_cast<size_t>(((o * cg + ci) * c.KH + kh) * c.KW + kw)];
              }
          y[static_cast<size_t>(((n * c.O + o) * OH + oh) * OW + ow)] = s;
        }
  return y;
}

/// Direct transposed conv reference (scatter form; weight [C, O/g, kh, kw]).
std::vector<double> ref_conv_t2d(const ConvCase& c, const std::vector<double>& x, const std::vector<double>& w,
                                 const std::vector<double>* b, int64_t& OH, int64_t& OW) {
  OH = (c.H - 1) * c.sh - 2 * c.ph + c.dh * (c.KH - 1) + c.oph + 1;
  OW = (c.W - 1) * c.sw - 2 * c.pw + c.dw * (c.KW - 1) + c.opw + 1;
  int64_t cg = c.C / c.g, og = c.O / c.g;
  std::vector<double> y(static_cast<size_t>(c.N * c.O * OH * OW), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t i = 0; i < OH * OW; ++i) y[static_cast<size_t>((n * c.O + o) * OH * OW + i)] = b ? (*b)[static_cast<size_t>(o)] : 0.0;
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ci = 0; ci < c.C; ++ci)
      for (int64_t ih = 0; ih < c.H; ++ih)
        for (int64_t iw = 0; iw < c.W; ++iw) {
          double xv = x[static_cast<size_t>(((n * c.C + ci) * c.H + ih) * c.W + iw)];
          int64_t grp = ci / cg;
          for (int64_t oo = 0; oo < og; ++oo)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                int64_t oh = ih * c.sh - c.ph + kh * c.dh, ow = iw * c.sw - c.pw + kw * c.dw;
                if (oh < 0 || oh >= OH || ow < 0 || ow >= OW) continue;
                int64_t o = grp * og + oo;
                y[static_cast<size_t>(((n * c.O + o) * OH + oh) * OW + ow)] +=
                    xv * w[static_cast<size_t>(((ci * og + oo) * c.KH + kh) * c.KW + kw)];
              }
        }
  return y;
}

void expect_close(const Tensor& got, const IntVec& shape, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.int_sizes(), shape) << what;
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
}

std::string describe(const ConvCase& c) {
  return "N" + std::to_string(c.N) + " C" + std::to_string(c.C) + " " + std::to_string(c.H) + "x" + std::to_string(c.W) +
         " O" + std::to_string(c.O) + " k" + std::to_string(c.KH) + "x" + std::to_string(c.KW) + " g" +
         std::to_string(c.g) + " s" + std::to_string(c.sh) + "," + std::to_string(c.sw) + " p" + std::to_string(c.ph) +
         "," + std::to_string(c.pw) + " d" + std::to_string(c.dh) + "," + std::to_string(c.dw) + " op" +
         std::to_string(c.oph) + "," + std::to_string(c.opw);
}

double conv_tol(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-9;
    case DType::F32: return 2e-4;
    case DType::F16: return 3e-2;
    default: return 1e-1;
  }
}

void check_conv2d(const ConvCase& c, DType dt, bool bias, bool noncontig) {
  auto xv = random_values(c.N * c.C * c.H * c.W, dt), wv = random_values(c.O * (c.C / c.g) * c.KH * c.KW, dt),
       bv = random_values(c.O, dt);
  IntVec perm = noncontig ? IntVec{0, 2, 3, 1} : IntVec{};  // channels-last memory
  Tensor x = make({c.N, c.C, c.H, c.W}, dt, xv, perm, noncontig ? 2 : 1);
  Tensor w = make({c.O, c.C / c.g, c.KH, c.KW}, dt, wv, noncontig ? IntVec{1, 0, 2, 3} : IntVec{});
  Tensor b = bias ? make({c.O}, dt, bv) : Tensor();
  Tensor y = pt::conv2d(x, w, b, {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw}, c.g);
  int64_t OH, OW;
  auto want = ref_conv2d(c, xv, wv, bias ? &bv : nullptr, OH, OW);
  std::string what = "conv2d " + describe(c) + " " + std::string(pt::short_name(dt)) + (bias ? " bias" : "") +
                     (noncontig ? " strided" : "");
  expect_close(y, {c.N, c.O, OH, OW}, want, conv_tol(dt), what);
  EXPECT_EQ(y.dtype(), dt);
  auto metas = pt::ops::run_meta(pt::ops::OpKind::conv2d, std::vector<Tensor>{x, w, b},
                                 {{"stride", pt::to_symint_vec({c.sh, c.sw})}, {"padding", pt::to_symint_vec({c.ph, c.pw})},
                                  {"dilation", pt::to_symint_vec({c.dh, c.dw})}, {"groups", pt::SymInt(c.g)}});
  EXPECT_EQ(pt::hints(metas[0].sizes), y.int_sizes()) << what;
  EXPECT_EQ(pt::hints(metas[0].strides), y.int_strides()) << what;
}

}  // namespace

TEST(OpsConv, Conv2dFixedCases) {
  std::vector<ConvCase> cases = {
      {1, 3, 8, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},      // plain 3x3 same
      {2, 16, 10, 12, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1},  // depthwise
      {1, 32, 7, 9, 32, 3, 3, 32, 2, 2, 1, 1, 1, 1},   // depthwise stride 2
      {1, 24, 6, 20, 24, 5, 5, 24, 1, 2, 2, 2, 1, 1},  // depthwise 5x5, asymmetric stride
      {2, 8, 9, 9, 12, 3, 3, 4, 1, 1, 2, 2, 2, 2},     // grouped + dilation
      {1, 20, 5, 7, 30, 1, 1, 1, 1, 1, 0, 0, 1, 1},    // 1x1
      {1, 32, 9, 11, 16, 3, 3, 1, 2, 1, 1, 0, 1, 3},   // blocked path, stride/dilation mix
      {3, 4, 1, 1, 5, 1, 1, 1, 1, 1, 0, 0, 1, 1},      // 1x1 spatial
      {1, 4, 1, 8, 6, 1, 3, 2, 1, 1, 0, 1, 1, 1},      // H = 1
      {1, 6, 5, 5, 6, 3, 2, 3, 3, 2, 0, 1, 1, 1},      // non-square kernel, stride > kernel overlap
      {1, 16, 12, 12, 32, 3, 3, 1, 1, 1, 0, 0, 1, 1},  // valid padding, blocked
  };
  for (const auto& c : cases)
    for (int bias = 0; bias < 2; ++bias)
      for (int nc = 0; nc < 2; ++nc) check_conv2d(c, DType::F32, bias, nc);
}

TEST(OpsConv, Conv2dDtypes) {
  ConvCase c{2, 6, 7, 8, 9, 3, 3, 3, 2, 1, 1, 1, 1, 2};
  for (DType dt : {DType::F64, DType::F16, DType::BF16}) check_conv2d(c, dt, true, dt == DType::F64);
}

TEST(OpsConv, Conv2dRandomShapes) {
  std::uniform_int_distribution<int64_t> small(1, 4), sp(1, 13), k(1, 4), gpick(0, 2);
  for (int it = 0; it < 40; ++it) {
    ConvCase c{};
    c.N = small(rng()) - 1 + (it % 7 == 0 ? 0 : 1);  // N = 0 sometimes
    int64_t g = std::array<int64_t, 3>{1, 2, 4}[static_cast<size_t>(gpick(rng()))];
    c.g = g;
    c.C = g * small(rng());
    c.O = g * small(rng());
    if (it % 5 == 0) {  // depthwise with channel multiplier
      c.g = c.C;
      c.O = c.C * small(rng());
    }
    c.KH = k(rng());
    c.KW = k(rng());
    c.sh = small(rng());
    c.sw = small(rng());
    c.dh = small(rng()) % 3 + 1;
    c.dw = small(rng()) % 3 + 1;
    c.ph = std::min<int64_t>(small(rng()) - 1, c.KH);
    c.pw = std::min<int64_t>(small(rng()) - 1, c.KW);
    c.H = sp(rng()) + c.dh * (c.KH - 1);
    c.W = sp(rng()) + c.dw * (c.KW - 1);
    check_conv2d(c, DType::F32, it % 2 == 0, it % 3 == 0);
  }
}

TEST(OpsConv, Conv2dPpOcrShapes) {
  check_conv2d({1, 64, 12, 40, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::F32, true, false);
  check_conv2d({1, 128, 6, 20, 256, 1, 1, 1, 1, 1, 0, 0, 1, 1}, DType::F32, true, false);
  check_conv2d({1, 96, 12, 40, 96, 3, 3, 96, 1, 1, 1, 1, 1, 1}, DType::F32, true, false);
  check_conv2d({1, 3, 16, 40, 16, 3, 3, 1, 2, 2, 1, 1, 1, 1}, DType::F32, false, false);
  // squeeze-and-excitation convs on 1x1 images (a matrix-vector product of their own, conv.cpp)
  check_conv2d({1, 240, 1, 1, 60, 1, 1, 1, 1, 1, 0, 0, 1, 1}, DType::F32, true, false);
  check_conv2d({1, 60, 1, 1, 240, 1, 1, 1, 1, 1, 0, 0, 1, 1}, DType::F32, true, true);
  check_conv2d({2, 480, 1, 1, 120, 1, 1, 1, 1, 1, 0, 0, 1, 1}, DType::F32, false, false);
  check_conv2d({3, 37, 1, 1, 5, 1, 1, 1, 2, 2, 0, 0, 1, 1}, DType::F32, true, true);
}

TEST(OpsConv, Conv2dRepeatedCallsUseCacheCorrectly) {
  ConvCase c{1, 16, 8, 8, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1};
  for (int i = 0; i < 3; ++i) check_conv2d(c, DType::F32, true, false);
  ConvCase c2 = c;
  c2.W = 10;  // same everything but one size: a different cache entry
  check_conv2d(c2, DType::F32, true, false);
  check_conv2d(c, DType::F32, false, false);
}

namespace {

/// The eltwise post-op list of a depthwise case applied in double (post_ops.h's formulas, NaN kept by
/// relu and clamp as eager keeps it).
double ref_post(const std::string& post, double v) {
  auto hs = [](double x) { return std::min(std::max(x + 3.0, 0.0), 6.0) / 6.0; };
  if (post.empty()) return v;
  for (const pt::ops::PostOp& p : pt::ops::parse_post_ops(post)) {
    switch (p.kind) {
      case pt::ops::PostOpKind::relu: v = v < 0 ? 0.0 : v; break;
      case pt::ops::PostOpKind::hardswish: v = v * hs(v); break;
      case pt::ops::PostOpKind::hardsigmoid: v = hs(v); break;
      case pt::ops::PostOpKind::clamp: v = v < p.alpha ? p.alpha : (v > p.beta ? p.beta : v); break;
      case pt::ops::PostOpKind::linear: v = p.alpha * v + p.beta; break;
      case pt::ops::PostOpKind::sigmoid: case pt::ops::PostOpKind::tanh: case pt::ops::PostOpKind::swish:
      case pt::ops::PostOpKind::gelu_erf: case pt::ops::PostOpKind::gelu_tanh: case pt::ops::PostOpKind::add:
      case pt::ops::PostOpKind::sub: case pt::ops::PostOpKind::mul: case pt::ops::PostOpKind::div:
      case pt::ops::PostOpKind::batch_norm:
        ADD_FAILURE() << "no reference for " << post;
        break;
    }
  }
  return v;
}

/// Depthwise conv2d on channels-last storage (src_layout = dst_layout = "nhwc", the cpu backend's
/// chains) against the float64 loops: the vector kernel of conv_depthwise.h when the CPU has AVX-512.
void check_depthwise_nhwc(const ConvCase& c, bool bias, const std::string& post, bool constant) {
  auto xv = random_values(c.N * c.C * c.H * c.W, DType::F32), wv = random_values(c.C * c.KH * c.KW, DType::F32),
       bv = random_values(c.C, DType::F32);
  Tensor x = make({c.N, c.C, c.H, c.W}, DType::F32, xv);
  Tensor x_nhwc = pt::permute(x, {0, 2, 3, 1}).contiguous();
  Tensor w = make({c.C, 1, c.KH, c.KW}, DType::F32, wv), b = bias ? make({c.C}, DType::F32, bv) : Tensor();
  pt::ops::Attrs a{{"stride", pt::to_symint_vec({c.sh, c.sw})}, {"padding", pt::to_symint_vec({c.ph, c.pw})},
                   {"dilation", pt::to_symint_vec({1, 1})}, {"groups", pt::SymInt(c.C)},
                   {"src_layout", std::string("nhwc")}, {"dst_layout", std::string("nhwc")}};
  if (constant) a.set("weights", std::string("constant"));
  pt::ops::OpKind op = pt::ops::OpKind::conv2d;
  if (!post.empty()) {
    op = pt::ops::OpKind::conv2d_fused;
    a.set("post_ops", post);
  }
  int64_t OH, OW;
  auto want = ref_conv2d(c, xv, wv, bias ? &bv : nullptr, OH, OW);
  for (double& v : want) v = ref_post(post, v);
  std::string what = "depthwise nhwc " + describe(c) + (bias ? " bias" : "") + " [" + post + "]" +
                     (constant ? " constant" : "");
  for (int rep = 0; rep < 2; ++rep) {  // the second call of a constant weight takes the kept packing
    Tensor y = pt::ops::run_eager(op, std::vector<Tensor>{x_nhwc, w, b}, a)[0];
    ASSERT_EQ(y.int_sizes(), (IntVec{c.N, OH, OW, c.C})) << what;
    expect_close(pt::permute(y, {0, 3, 1, 2}), {c.N, c.C, OH, OW}, want, conv_tol(DType::F32), what);
  }
}

}  // namespace

TEST(OpsConv, DepthwiseChannelsLastMatchesFloat64) {
  // N, C, H, W, O(=C), KH, KW, g(=C), sh, sw, ph, pw, dh, dw
  std::vector<ConvCase> cases = {
      {1, 16, 5, 30, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1},      // 3x3: strips of 12, a tail, both borders
      {2, 240, 7, 40, 240, 5, 5, 240, 1, 1, 2, 2, 1, 1},   // rec's 5x5, two images
      {1, 40, 9, 27, 40, 5, 5, 40, 2, 1, 2, 2, 1, 1},      // 2.5 channel blocks (masked tail), stride (2, 1)
      {1, 7, 6, 33, 7, 3, 3, 7, 1, 2, 1, 1, 1, 1},         // fewer channels than a vector, stride (1, 2)
      {1, 48, 8, 21, 48, 3, 3, 48, 2, 2, 0, 0, 1, 1},      // no padding, stride 2
      {1, 24, 6, 19, 24, 5, 5, 24, 1, 2, 1, 2, 1, 1},      // asymmetric padding, 5x5 stride (1, 2)
      {1, 32, 3, 3, 32, 5, 5, 32, 1, 1, 2, 2, 1, 1},       // narrower than the kernel: every output a border
      {1, 16, 1, 50, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1},      // one row
      {1, 16, 4, 1, 16, 3, 3, 16, 1, 1, 1, 1, 1, 1},       // one column
      {1, 64, 5, 26, 64, 1, 3, 64, 1, 1, 0, 1, 1, 1},      // 1x3
      {1, 32, 11, 17, 32, 7, 5, 32, 3, 1, 3, 2, 1, 1},     // 7x5, stride 3 along H
      {1, 33, 13, 37, 33, 5, 5, 33, 2, 2, 2, 2, 1, 1},     // odd sizes, 2 blocks + 1 channel, stride 2
      {1, 17, 10, 64, 17, 3, 5, 17, 1, 1, 1, 2, 1, 1},     // 3x5
      {1, 480, 6, 61, 480, 5, 5, 480, 1, 1, 2, 2, 1, 1},   // wide channels: column tiles of 12
      {1, 200, 5, 97, 200, 3, 3, 200, 1, 2, 1, 1, 1, 1},   // column tiles with stride 2, a masked tail
  };
  // Every post-op the kernel applies, alone and chained (hardswish + linear is one FMA in the kernel).
  const std::vector<std::string> posts = {"", "relu", "hardswish, linear(0.5, -0.25)", "clamp(-0.5, 0.75)",
                                          "hardsigmoid", "hardswish", "linear(-1.5, 0.25)",
                                          "linear(2, 0.5), relu, clamp(-1, 0.3)", "hardswish, linear(3, 0), hardsigmoid"};
  const int64_t created = pt::ops::dnnl_stats().primitives_created;
  for (size_t i = 0; i < cases.size(); ++i)
    for (int bias = 0; bias < 2; ++bias)
      check_depthwise_nhwc(cases[i], bias, posts[(i + static_cast<size_t>(bias)) % posts.size()], (i + bias) % 2 == 0);
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_EQ(pt::ops::dnnl_stats().primitives_created, created);
  }
  // Several threads over the output rows.
  const int threads = pt::num_threads();
  pt::set_num_threads(2);
  check_depthwise_nhwc({1, 96, 24, 80, 96, 3, 3, 96, 1, 1, 1, 1, 1, 1}, true, "hardswish, linear(0.5, -0.25)", true);
  check_depthwise_nhwc({3, 240, 12, 40, 240, 5, 5, 240, 2, 1, 2, 2, 1, 1}, false, "relu", false);
  pt::set_num_threads(threads);
}

TEST(OpsConv, DepthwiseChannelsLastKeepsNaN) {
  // NaN inputs stay NaN through every post-op, relu and clamp included (eager's rule); infinities
  // saturate as eager's do.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Tensor x = pt::zeros({1, 3, 20, 16});  // NHWC: 3 rows, 20 columns, 16 channels
  float* xp = x.data_ptr<float>();
  xp[(1 * 20 + 10) * 16 + 3] = nan;
  xp[(1 * 20 + 4) * 16 + 5] = inf;
  xp[(1 * 20 + 15) * 16 + 6] = -inf;
  Tensor w = pt::ones({16, 1, 3, 3});
  for (const char* post : {"relu", "clamp(-1, 1)", "hardswish", "hardsigmoid", "linear(2, 1)", "hardswish, linear(0.5, 1)"}) {
    pt::ops::Attrs a{{"stride", pt::to_symint_vec({1, 1})}, {"padding", pt::to_symint_vec({1, 1})},
                     {"dilation", pt::to_symint_vec({1, 1})}, {"groups", pt::SymInt(16)},
                     {"src_layout", std::string("nhwc")}, {"dst_layout", std::string("nhwc")},
                     {"post_ops", std::string(post)}};
    Tensor y = pt::ops::run_eager(pt::ops::OpKind::conv2d_fused, std::vector<Tensor>{x, w, Tensor()}, a)[0];
    const float* yp = y.data_ptr<float>();
    EXPECT_TRUE(std::isnan(yp[(1 * 20 + 10) * 16 + 3])) << post;
    EXPECT_TRUE(std::isnan(yp[(0 * 20 + 9) * 16 + 3])) << post;  // a neighbour reads the NaN too
    EXPECT_EQ(yp[(1 * 20 + 10) * 16 + 4], static_cast<float>(ref_post(post, 0.0))) << post;
    const float up = yp[(1 * 20 + 4) * 16 + 5], down = yp[(1 * 20 + 15) * 16 + 6];
    const std::string p = post;
    if (p == "relu") {
      EXPECT_EQ(up, inf);
    } else if (p == "clamp(-1, 1)") {
      EXPECT_EQ(down, -1.0f);
    } else if (p == "hardsigmoid") {
      EXPECT_EQ(up, 1.0f);
      EXPECT_EQ(down, 0.0f);
    } else if (p == "linear(2, 1)") {
      EXPECT_EQ(up, inf);
      EXPECT_EQ(down, -inf);
    } else {
      EXPECT_EQ(up, inf);              // hardswish(inf) = inf · 6 / 6
      EXPECT_TRUE(std::isnan(down));  // hardswish(-inf) = -inf · 0 / 6, as eager computes it
    }
  }
}

TEST(OpsConv, Conv2dUnbatchedInput) {
  auto xv = random_values(3 * 5 * 6, DType::F32), wv = random_values(2 * 3 * 9, DType::F32);
  Tensor x = make({3, 5, 6}, DType::F32, xv), w = make({2, 3, 3, 3}, DType::F32, wv);
  Tensor y = pt::conv2d(x, w, {}, {1, 1}, {1, 1});
  int64_t OH, OW;
  auto want = ref_conv2d({1, 3, 5, 6, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1}, xv, wv, nullptr, OH, OW);
  expect_close(y, {2, OH, OW}, want, 1e-4, "unbatched");
}

TEST(OpsConv, Conv1d) {
  for (int64_t g : {1, 4}) {
    int64_t N = 2, C = 8, L = 17, O = 12, K = 3, s = 2, p = 1, d = 2;
    auto xv = random_values(N * C * L, DType::F32), wv = random_values(O * (C / g) * K, DType::F32),
         bv = random_values(O, DType::F32);
    Tensor x = make({N, C, L}, DType::F32, xv, {0, 2, 1}), w = make({O, C / g, K}, DType::F32, wv),
           b = make({O}, DType::F32, bv);
    Tensor y = pt::conv1d(x, w, b, {s}, {p}, {d}, g);
    int64_t OH, OW;
    auto want = ref_conv2d({N, C, 1, L, O, 1, K, g, 1, s, 0, p, 1, d}, xv, wv, &bv, OH, OW);
    expect_close(y, {N, O, OW}, want, 1e-4, "conv1d g" + std::to_string(g));
    auto metas = pt::ops::run_meta(pt::ops::OpKind::conv1d, std::vector<Tensor>{x, w, b},
                                   {{"stride", pt::SymIntVec{s}}, {"padding", pt::SymIntVec{p}},
                                    {"dilation", pt::SymIntVec{d}}, {"groups", pt::SymInt(g)}});
    EXPECT_EQ(pt::hints(metas[0].sizes), y.int_sizes());
  }
}

TEST(OpsConv, ConvTranspose2d) {
  std::vector<ConvCase> cases = {
      {1, 4, 5, 6, 3, 3, 3, 1, 1, 1, 0, 0, 1, 1, 0, 0},
      {2, 8, 6, 7, 8, 2, 2, 1, 2, 2, 0, 0, 1, 1, 0, 0},  // PP-OCR DB head style 2x2 stride 2
      {1, 6, 4, 5, 9, 3, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1},  // groups + output_padding
      {1, 4, 5, 5, 4, 3, 3, 4, 2, 1, 1, 0, 2, 1, 1, 0},  // depthwise, dilation, output_padding < dilation
      {1, 2, 3, 3, 2, 3, 3, 1, 3, 3, 0, 0, 1, 1, 2, 1},  // output_padding > padding
      {1, 32, 5, 6, 16, 3, 3, 1, 2, 2, 1, 1, 1, 1, 1, 1},
  };
  for (const auto& c : cases)
    for (DType dt : {DType::F32, DType::F64}) {
      auto xv = random_values(c.N * c.C * c.H * c.W, dt), wv = random_values(c.C * (c.O / c.g) * c.KH * c.KW, dt),
           bv = random_values(c.O, dt);
      Tensor x = make({c.N, c.C, c.H, c.W}, dt, xv, {}, 2), w = make({c.C, c.O / c.g, c.KH, c.KW}, dt, wv),
             b = make({c.O}, dt, bv);
      Tensor y = pt::conv_transpose2d(x, w, b, {c.sh, c.sw}, {c.ph, c.pw}, {c.oph, c.opw}, c.g, {c.dh, c.dw});
      int64_t OH, OW;
      auto want = ref_conv_t2d(c, xv, wv, &bv, OH, OW);
      expect_close(y, {c.N, c.O, OH, OW}, want, conv_tol(dt), "conv_transpose2d " + describe(c));
    }
}

// A 2x2 stride-2 transposed conv without padding (a learned 2x upsampling: PP-OCR det's head) runs
// a row kernel of its own (every output pixel has one tap), not oneDNN's deconvolution: widths with
// and without whole 16-column vectors, one and several output channels, with and without a bias,
// f32 against the double reference; it builds no oneDNN primitive.
TEST(OpsConv, ConvTranspose2dUpsampleForm) {
  std::vector<ConvCase> cases = {
      {1, 24, 5, 37, 1, 2, 2, 1, 2, 2, 0, 0, 1, 1, 0, 0},   // det's 24→1
      {2, 24, 3, 48, 24, 2, 2, 1, 2, 2, 0, 0, 1, 1, 0, 0},  // det's 24→24, two images
      {1, 3, 4, 16, 5, 2, 2, 1, 2, 2, 0, 0, 1, 1, 0, 0},
      {1, 64, 2, 21, 64, 2, 2, 1, 2, 2, 0, 0, 1, 1, 0, 0},  // the largest channel product it takes
  };
  for (const auto& c : cases)
    for (bool bias : {true, false}) {
      auto xv = random_values(c.N * c.C * c.H * c.W, DType::F32), wv = random_values(c.C * c.O * 4, DType::F32),
           bv = random_values(c.O, DType::F32);
      Tensor x = make({c.N, c.C, c.H, c.W}, DType::F32, xv), w = make({c.C, c.O, 2, 2}, DType::F32, wv),
             b = bias ? make({c.O}, DType::F32, bv) : Tensor();
      const int64_t created = pt::ops::dnnl_stats().primitives_created;
      Tensor y = pt::conv_transpose2d(x, w, b, {2, 2}, {0, 0}, {0, 0}, 1, {1, 1});
      EXPECT_EQ(pt::ops::dnnl_stats().primitives_created, created) << describe(c);
      int64_t OH, OW;
      auto want = ref_conv_t2d(c, xv, wv, bias ? &bv : nullptr, OH, OW);
      expect_close(y, {c.N, c.O, OH, OW}, want, conv_tol(DType::F32),
                   "conv_transpose2d upsample " + describe(c) + (bias ? " bias" : ""));
    }
}

TEST(OpsConv, Errors) {
  auto expect_msg = [](auto fn, const char* op) {
    try {
      fn();
      FAIL() << "no exception for " << op;
    } catch (const pt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  Tensor x = pt::empty({1, 4, 5, 5});
  EXPECT_THROW(pt::conv2d(x, pt::empty({2, 3, 3, 3})), pt::ShapeError);             // channel mismatch
  EXPECT_THROW(pt::conv2d(x, pt::empty({3, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}, 2), pt::ShapeError);  // O % g
  EXPECT_THROW(pt::conv2d(x, pt::empty({2, 4, 7, 7})), pt::ShapeError);             // kernel larger than input
  EXPECT_THROW(pt::conv2d(x, pt::empty({2, 4, 3, 3}), pt::empty({3})), pt::ShapeError);  // bias size
  EXPECT_THROW(pt::conv2d(x, pt::empty({2, 4, 3, 3}), {}, {0, 1}), pt::ValueError);  // stride 0
  EXPECT_THROW(pt::conv2d(pt::empty({1, 4, 5, 5}, DType::I64), pt::empty({2, 4, 3, 3}, DType::I64)), pt::TypeError);
  EXPECT_THROW(pt::conv2d(x, pt::empty({2, 4, 3, 3}, DType::F64)), pt::TypeError);
  EXPECT_THROW(pt::conv2d(pt::empty({4, 5}), pt::empty({2, 4, 3, 3})), pt::ShapeError);
  EXPECT_THROW(pt::conv_transpose2d(x, pt::empty({4, 2, 3, 3}), {}, {1, 1}, {0, 0}, {1, 1}), pt::ValueError);
  expect_msg([&] { pt::conv2d(x, pt::empty({2, 3, 3, 3})); }, "conv2d");
  expect_msg([&] { pt::conv1d(pt::empty({1, 4, 5}), pt::empty({2, 4, 9})); }, "conv1d");
  expect_msg([&] { pt::conv_transpose2d(x, pt::empty({3, 2, 3, 3})); }, "conv_transpose2d");
}

TEST(OpsConv, OneDnnPrimitivesFollowTheThreadCount) {
  // oneDNN fixes a primitive's thread partition when it is made, so a cached convolution, backward
  // convolution or matmul made at 2 threads must not serve a call at 1 (it ran two threads there, whose
  // barriers spin when the second core is busy) and one made at 1 must not serve a call at 2: each
  // thread count gets its own primitives, and both stay cached.
  const int threads = pt::num_threads();
  Tensor x0 = pt::randn({8, 1, 12, 12}), w0 = pt::randn({6, 1, 5, 5}), b0 = pt::randn({6}), m0 = pt::randn({6 * 8 * 8, 10});
  auto step = [&]() {
    Tensor x = x0.clone(), w = w0.clone(), m = m0.clone();
    x.requires_grad_();
    w.requires_grad_();
    m.requires_grad_();
    Tensor y = pt::conv2d(x, w, b0);
    Tensor l = pt::sum(pt::matmul(pt::flatten(y, 1), m));
    l.backward();
    return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), m.grad()};
  };
  auto created = [] { return pt::ops::dnnl_stats().primitives_created; };
  pt::set_num_threads(2);
  std::vector<Tensor> at2 = step();
  const int64_t c2 = created();
  step();
  EXPECT_EQ(created(), c2) << "a second call at 2 threads finds every primitive cached";
  pt::set_num_threads(1);
  std::vector<Tensor> at1 = step();
  const int64_t c1 = created();
  EXPECT_GT(c1, c2) << "a call at 1 thread reused primitives made for 2";
  step();
  EXPECT_EQ(created(), c1);
  pt::set_num_threads(2);
  step();
  EXPECT_EQ(created(), c1) << "the 2-thread primitives stay cached";
  pt::set_num_threads(threads);
  for (size_t i = 0; i < at1.size(); ++i) {
    const auto a = values(at1[i]), b = values(at2[i]);
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-4 * (1 + std::abs(b[j]))) << i << " " << j;
  }
}

TEST(OpsConv, SmallWeightGradientsRunOnOneThread) {
  // A weight gradient below 2^24 multiply-adds runs on one thread whatever the thread count (oneDNN's
  // backward-weights kernels reduce the threads' sums behind a spinning barrier): at 2 threads it
  // reuses the primitive made at 1, gives the same values, and leaves the caller's OpenMP count as it
  // was. A large one still gets its own 2-thread primitive.
  const int threads = pt::num_threads();
  auto dw = [](const Tensor& g, const Tensor& x, int64_t k) {
    pt::ops::Attrs a{{"kernel_size", pt::to_symint_vec({k, k})}};
    return pt::ops::run_eager(pt::ops::OpKind::conv2d_backward_weight, std::vector<Tensor>{g, x}, a)[0];
  };
  Tensor x = pt::randn({64, 6, 14, 14}), g = pt::randn({64, 16, 10, 10});  // LeNet's second conv: 15.4 M
  Tensor xl = pt::randn({8, 32, 40, 40}), gl = pt::randn({8, 64, 38, 38});  // 170 M multiply-adds
  pt::set_num_threads(1);
  Tensor at1 = dw(g, x, 5), l1 = dw(gl, xl, 3);
  pt::set_num_threads(2);
  const int64_t c = pt::ops::dnnl_stats().primitives_created;
  Tensor at2 = dw(g, x, 5);
  EXPECT_EQ(pt::ops::dnnl_stats().primitives_created, c) << "the small weight gradient made a 2-thread primitive";
  EXPECT_EQ(omp_get_max_threads(), 2);
  Tensor l2 = dw(gl, xl, 3);
  EXPECT_GT(pt::ops::dnnl_stats().primitives_created, c) << "the large weight gradient reused the 1-thread primitive";
  EXPECT_EQ(omp_get_max_threads(), 2);
  pt::set_num_threads(threads);
  for (auto [p, q] : {std::pair{at1, at2}, std::pair{l1, l2}}) {
    const auto a = values(p), b = values(q);
    ASSERT_EQ(a.size(), b.size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-3 * (1 + std::abs(b[j])));
  }
}
