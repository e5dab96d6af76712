// conv2d_backward_input / conv2d_backward_weight (src/ops/conv_backward.cpp) against a float64 reference
// written in scatter form (every forward tap adds into dx and dw), over strides, paddings, dilations,
// groups, the channel counts of each oneDNN layout choice, channels-last and strided inputs, f16 and
// f64; and the conv2d rule on CPU tensors records them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ops/dispatch.h"
#include "ops/registry.h"
#include "protean/autograd.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;
using pt::ops::OpKind;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g(20261203);
  return g;
}

struct Case {
  int64_t N, C, H, W, O, KH, KW, g, sh, sw, ph, pw, dh, dw;
  int64_t OH() const { return (H + 2 * ph - dh * (KH - 1) - 1) / sh + 1; }
  int64_t OW() const { return (W + 2 * pw - dw * (KW - 1) - 1) / sw + 1; }
};

std::vector<double> randoms(int64_t n) {
  std::normal_distribution<double> d(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(d(rng()));  // exact in f32
  return v;
}

/// dx and dw of y = conv2d(x, w) for upstream gradient gy, all NCHW / OIHW row-major.
void reference(const Case& c, const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& gy,
               std::vector<double>& dx, std::vector<double>& dw) {
  const int64_t OH = c.OH(), OW = c.OW(), cg = c.C / c.g, og = c.O / c.g;
  dx.assign(static_cast<size_t>(c.N * c.C * c.H * c.W), 0.0);
  dw.assign(static_cast<size_t>(c.O * cg * c.KH * c.KW), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const double gv = gy[static_cast<size_t>(((n * c.O + o) * OH + oh) * OW + ow)];
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t kh = 0; kh < c.KH; ++kh)
              for (int64_t kw = 0; kw < c.KW; ++kw) {
                const int64_t ih = oh * c.sh - c.ph + kh * c.dh, iw = ow * c.sw - c.pw + kw * c.dw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const size_t xi = static_cast<size_t>(((n * c.C + (o / og) * cg + ci) * c.H + ih) * c.W + iw);
                const size_t wi = static_cast<size_t>(((o * cg + ci) * c.KH + kh) * c.KW + kw);
                dx[xi] += gv * w[wi];
                dw[wi] += gv * x[xi];
              }
        }
}

/// A tensor of `sizes` holding `v` (row-major logical order), stored channels-last when `nhwc`.
Tensor make(const IntVec& sizes, const std::vector<double>& v, DType dt, bool nhwc = false) {
  Tensor t = pt::tensor<double>(v, sizes);
  if (nhwc) t = pt::permute(pt::permute(t, {0, 2, 3, 1}).contiguous(), {0, 3, 1, 2});
  return pt::cast(t, dt);
}

double max_rel_err(const Tensor& got, const std::vector<double>& want) {
  Tensor g = pt::cast(got, DType::F64).contiguous();
  double scale = 1e-30, err = 0;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(g.data_ptr<double>()[i] - want[i]));
  return err / scale;
}

pt::ops::Attrs attrs(const Case& c, const char* size_name, IntVec size) {
  return {{size_name, pt::to_symint_vec(size)},
          {"stride", pt::to_symint_vec({c.sh, c.sw})},
          {"padding", pt::to_symint_vec({c.ph, c.pw})},
          {"dilation", pt::to_symint_vec({c.dh, c.dw})},
          {"groups", pt::SymInt(c.g)}};
}

void check(const Case& c, DType dt, bool nhwc, double tol) {
  SCOPED_TRACE(::testing::Message() << "N" << c.N << " C" << c.C << " " << c.H << "x" << c.W << " O" << c.O << " k"
                                    << c.KH << "x" << c.KW << " g" << c.g << " s" << c.sh << "," << c.sw << " p" << c.ph
                                    << "," << c.pw << " d" << c.dh << "," << c.dw << " " << pt::short_name(dt)
                                    << (nhwc ? " channels-last" : ""));
  const int64_t OH = c.OH(), OW = c.OW();
  std::vector<double> x = randoms(c.N * c.C * c.H * c.W), w = randoms(c.O * (c.C / c.g) * c.KH * c.KW),
                      gy = randoms(c.N * c.O * OH * OW), dx, dw;
  reference(c, x, w, gy, dx, dw);
  Tensor tx = make({c.N, c.C, c.H, c.W}, x, dt, nhwc), tw = make({c.O, c.C / c.g, c.KH, c.KW}, w, dt),
         tg = make({c.N, c.O, OH, OW}, gy, dt, nhwc);
  Tensor gx = pt::ops::call1(OpKind::conv2d_backward_input, {tg, tw}, attrs(c, "input_size", {c.H, c.W}));
  Tensor gw = pt::ops::call1(OpKind::conv2d_backward_weight, {tg, tx}, attrs(c, "kernel_size", {c.KH, c.KW}));
  ASSERT_EQ(gx.int_sizes(), (IntVec{c.N, c.C, c.H, c.W}));
  ASSERT_EQ(gw.int_sizes(), (IntVec{c.O, c.C / c.g, c.KH, c.KW}));
  EXPECT_EQ(gx.dtype(), dt);
  EXPECT_LE(max_rel_err(gx, dx), tol) << "input gradient";
  EXPECT_LE(max_rel_err(gw, dw), tol) << "weight gradient";
}

TEST(OpsConvBackward, MatchesFloat64ReferenceOverParametersAndLayouts) {
  const std::vector<Case> cases = {
      {64, 1, 28, 28, 6, 5, 5, 1, 1, 1, 2, 2, 1, 1},    // LeNet conv1: 1 input channel (NCHW GEMM for dx)
      {8, 6, 14, 14, 16, 5, 5, 1, 1, 1, 0, 0, 1, 1},    // LeNet conv2: few channels (NHWC)
      {2, 3, 9, 8, 5, 3, 2, 1, 2, 1, 1, 0, 2, 3},       // stride, padding, dilation, rows past the last window
      {2, 20, 7, 6, 24, 3, 3, 1, 1, 2, 1, 1, 1, 1},     // ≥ 16 channels (oneDNN's blocked choice)
      {2, 8, 6, 7, 12, 3, 3, 4, 2, 2, 1, 1, 1, 1},      // groups
      {2, 16, 5, 5, 16, 3, 3, 16, 1, 1, 1, 1, 2, 2},    // depthwise, dilated
      {3, 32, 4, 4, 8, 1, 1, 1, 1, 1, 0, 0, 1, 1},      // 1x1
      {1, 2, 6, 1, 3, 2, 1, 1, 3, 1, 0, 0, 1, 1},       // W = 1, stride 3 skipping rows
  };
  for (const Case& c : cases)
    for (bool nhwc : {false, true}) {
      check(c, DType::F32, nhwc, 2e-5);
      check(c, DType::F64, nhwc, 1e-12);
    }
  check(cases[2], DType::F16, false, 2e-2);
}

TEST(OpsConvBackward, EmptyBatchGivesZeroWeightGradient) {
  const Case c{0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  Tensor x = pt::zeros({0, 3, 5, 5}), g = pt::zeros({0, 4, 5, 5}), w = pt::ones({4, 3, 3, 3});
  Tensor gw = pt::ops::call1(OpKind::conv2d_backward_weight, {g, x}, attrs(c, "kernel_size", {3, 3}));
  EXPECT_EQ(gw.int_sizes(), (IntVec{4, 3, 3, 3}));
  EXPECT_EQ(pt::sum(pt::abs(gw)).item<float>(), 0.0f);
  Tensor gx = pt::ops::call1(OpKind::conv2d_backward_input, {g, w}, attrs(c, "input_size", {5, 5}));
  EXPECT_EQ(gx.int_sizes(), (IntVec{0, 3, 5, 5}));
}

TEST(OpsConvBackward, RejectsAGradientOfTheWrongSize) {
  const Case c{1, 3, 8, 8, 4, 3, 3, 1, 2, 2, 1, 1, 1, 1};  // conv2d gives 4x4
  Tensor g = pt::zeros({1, 4, 5, 4}), w = pt::zeros({4, 3, 3, 3}), x = pt::zeros({1, 3, 8, 8});
  try {
    pt::ops::call1(OpKind::conv2d_backward_input, {g, w}, attrs(c, "input_size", {8, 8}));
    FAIL() << "expected a ShapeError";
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_output has size 5 in spatial dim 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::ops::call1(OpKind::conv2d_backward_weight, {g, x}, attrs(c, "kernel_size", {3, 3})), pt::ShapeError);
  EXPECT_THROW(pt::ops::call1(OpKind::conv2d_backward_weight, {pt::zeros({1, 4, 4, 4}, DType::F64), x},
                              attrs(c, "kernel_size", {3, 3})),
               pt::TypeError);
}

TEST(OpsConvBackward, Conv2dGradientsOnCpuMatchTheCompositeFormsAndTheReference) {
  const Case c{2, 3, 6, 6, 4, 3, 3, 1, 2, 2, 1, 1, 1, 1};
  std::vector<double> xv = randoms(2 * 3 * 6 * 6), wv = randoms(4 * 3 * 3 * 3), gv(2 * 4 * 3 * 3, 1.0), dx, dw;
  reference(c, xv, wv, gv, dx, dw);
  Tensor x = make({2, 3, 6, 6}, xv, DType::F32, true), w = make({4, 3, 3, 3}, wv, DType::F32);
  auto [loss, grads] = pt::value_and_grad(
      [](Tensor x, Tensor w) { return pt::sum(pt::conv2d(x, w, Tensor(), {2, 2}, {1, 1}, {1, 1}, 1)); },
      {.wrt = {0, 1}})(x, w);
  EXPECT_LE(max_rel_err(grads[0], dx), 2e-5);
  EXPECT_LE(max_rel_err(grads[1], dw), 2e-5);
  // the input gradient as the transposed convolution other devices record
  Tensor gx_ref = pt::conv_transpose2d(pt::ones({2, 4, 3, 3}), w, Tensor(), {2, 2}, {1, 1}, {1, 1}, 1, {1, 1});
  EXPECT_LT(pt::amax(pt::abs(grads[0] - gx_ref)).item<float>(), 1e-5f);
}

}  // namespace
