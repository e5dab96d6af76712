// ONNX importer: per-op and per-quirk numerics on hand-built models, against plain C++ references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "onnx_test_util.h"
#include "protean/compile.h"

namespace protean {
namespace {

using onnx_test::Builder;
using onnx_test::ftensor;
constexpr int32_t F32 = ::onnx::TensorProto::FLOAT;
constexpr int32_t I64 = ::onnx::TensorProto::INT64;

std::vector<float> seq(size_t n, uint64_t seed = 1) {
  std::mt19937_64 r(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(r);
  return v;
}

void expect_near(const Tensor& t, const std::vector<float>& ref, const IntVec& sizes, double tol = 1e-5) {
  ASSERT_EQ(t.int_sizes(), sizes);
  std::vector<float> got = t.contiguous().to_vector<float>();
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
  EXPECT_LE(worst, tol);
}

#define RUN(model, ...) PROTEAN_ONNX_RUN_OR_SKIP(out = (model)->forward(__VA_ARGS__))

TEST(OnnxOps, ShapeArithmeticThroughCastI32AndReshape) {
  // PP-OCR rec's flatten and attention reshapes (opset 9): Shape → Cast(i32) → Slice → Cast(i64) → Concat.
  Builder b(9);
  b.input("x", F32, {-1, 4, -1, -1}, {"N", "", "H", "W"}).output("flat").output("heads");
  b.node("Shape", {"x"}, {"s"});
  auto* c32 = b.node("Cast", {"s"}, {"s32"});
  Builder::attr_i(c32, "to", 6);
  auto* sl = b.node("Slice", {"s32"}, {"nc32"});
  Builder::attr_ints(sl, "starts", {0});
  Builder::attr_ints(sl, "ends", {2});
  Builder::attr_ints(sl, "axes", {0});
  auto* c64 = b.node("Cast", {"nc32"}, {"nc"});
  Builder::attr_i(c64, "to", 7);
  b.const_i64("m1", {-1});
  auto* cat = b.node("Concat", {"nc", "m1"}, {"shape1"});
  Builder::attr_i(cat, "axis", 0);
  b.node("Reshape", {"x", "shape1"}, {"flat"});  // [N, 4, H*W]
  // [0, W, 2, -1]: 0 copies N, W from Shape()[3] via i32.
  auto* sw = b.node("Slice", {"s32"}, {"w32"});
  Builder::attr_ints(sw, "starts", {3});
  Builder::attr_ints(sw, "ends", {4});
  Builder::attr_ints(sw, "axes", {0});
  auto* cw = b.node("Cast", {"w32"}, {"w"});
  Builder::attr_i(cw, "to", 7);
  b.const_i64("zero", {0}).const_i64("two", {2});
  auto* cat2 = b.node("Concat", {"zero", "w", "two", "m1"}, {"shape2"});
  Builder::attr_i(cat2, "axis", 0);
  auto* tr = b.node("Transpose", {"x"}, {"xt"});
  Builder::attr_ints(tr, "perm", {0, 3, 1, 2});
  b.node("Reshape", {"xt", "shape2"}, {"heads"});
  auto m = b.load();
  std::vector<float> v = seq(2 * 4 * 3 * 5);
  std::vector<Tensor> out;
  RUN(m, {ftensor(v, {2, 4, 3, 5})});
  expect_near(out[0], v, {2, 4, 15}, 0);
  EXPECT_EQ(out[1].int_sizes(), (IntVec{2, 5, 2, 6}));
}

onnx_test::Builder squeeze_if_model() {
  // Silero's pattern: If(Shape(x)[-1] == 1) then Squeeze(x, [-1]) else Identity — branches differ in rank.
  Builder b(16);
  b.input("x", F32, {-1, 2, -1}).output("y");
  b.node("Shape", {"x"}, {"s"});
  Builder::const_i64(b.graph(), "last", {-1}, {});
  b.node("Gather", {"s", "last"}, {"t"});
  Builder::const_i64(b.graph(), "one", {1}, {});
  b.node("Equal", {"t", "one"}, {"cond"});
  auto* n = b.node("If", {"cond"}, {"y"}, "if_t1");
  auto* th = Builder::attr_g(n, "then_branch", "then");
  Builder::const_i64(th, "ax", {-1});
  Builder::add_node(th, "Squeeze", {"x", "ax"}, {"ty"});
  th->add_output()->set_name("ty");
  auto* el = Builder::attr_g(n, "else_branch", "else");
  Builder::add_node(el, "Identity", {"x"}, {"ey"});
  el->add_output()->set_name("ey");
  return b;
}

TEST(OnnxOps, IfOnShapeConditionTakesOneBranch) {
  auto m = squeeze_if_model().load();
  std::vector<Tensor> out;
  RUN(m, {zeros({3, 2, 1})});
  EXPECT_EQ(out[0].int_sizes(), (IntVec{3, 2}));
  RUN(m, {zeros({3, 2, 4})});
  EXPECT_EQ(out[0].int_sizes(), (IntVec{3, 2, 4}));
}

TEST(OnnxOps, IfOnDataAndHostScalarInputs) {
  Builder b(16);
  b.input("sr", I64, {}).output("y");
  Builder::const_i64(b.graph(), "k", {16000}, {});
  b.node("Equal", {"sr", "k"}, {"is16k"});
  auto* n = b.node("If", {"is16k"}, {"y"}, "if_sr");
  auto* th = Builder::attr_g(n, "then_branch", "then");
  Builder::const_i64(th, "ty", {1}, {});
  th->add_output()->set_name("ty");
  auto* el = Builder::attr_g(n, "else_branch", "else");
  Builder::const_i64(el, "ey", {2}, {});
  el->add_output()->set_name("ey");
  // Host scalars: no kernels involved, the If specializes on the value.
  auto m = b.load();
  EXPECT_EQ(m->forward({}, {{"sr", SymInt(16000)}})[0].item<int64_t>(), 1);
  EXPECT_EQ(m->forward({}, {{"sr", SymInt(8000)}})[0].item<int64_t>(), 2);
  onnx::LoadOptions o;
  o.scalar_inputs_as_host = true;
  EXPECT_EQ(b.load(o)->forward({tensor<int64_t>({8000}, {})})[0].item<int64_t>(), 2);
  // Data condition (a real tensor): evaluated with item<bool>().
  std::vector<Tensor> out;
  RUN(m, {tensor<int64_t>({16000}, {})});
  EXPECT_EQ(out[0].item<int64_t>(), 1);
}

TEST(OnnxOps, IfOnATensorConditionCompilesAsCondWithoutABreak) {
  // If(flag == 1) then Relu(x * two) else Neg(x): the branches read `x` and the initializer `two` of
  // the enclosing graph. Under compile the If is a protean::cond: no graph break even with fullgraph,
  // one graph for both conditions and for every row count after the first recompile.
  Builder b(13);
  b.input("x", F32, {-1, 3}, {"N"}).input("flag", I64, {}).output("y");
  b.init("two", {1}, {2.0f});
  Builder::const_i64(b.graph(), "one", {1}, {});
  b.node("Equal", {"flag", "one"}, {"c"});
  auto* n = b.node("If", {"c"}, {"y"}, "if_flag");
  auto* th = Builder::attr_g(n, "then_branch", "then");
  Builder::add_node(th, "Mul", {"x", "two"}, {"tm"});
  Builder::add_node(th, "Relu", {"tm"}, {"ty"});
  th->add_output()->set_name("ty");
  auto* el = Builder::attr_g(n, "else_branch", "else");
  Builder::add_node(el, "Neg", {"x"}, {"ey"});
  el->add_output()->set_name("ey");
  auto m = b.load();
  reset();
  CompileOptions o;
  o.name = "onnx_if";
  o.arg_names = {"x", "flag"};
  o.backend = "interp";
  o.fullgraph = true;
  auto f = compile([m](const Tensor& x, const Tensor& flag) { return m->forward({x, flag}).at(0); }, o);
  for (int64_t rows : {2, 5, 7}) {
    for (int64_t flag : {1, 0}) {
      std::vector<float> v = seq(static_cast<size_t>(rows * 3), static_cast<uint64_t>(rows + flag));
      Tensor x = ftensor(v, {rows, 3});
      std::vector<float> ref(v.size());
      for (size_t i = 0; i < v.size(); ++i) ref[i] = flag ? std::max(0.0f, v[i] * 2) : -v[i];
      expect_near(f(x, tensor<int64_t>({flag}, {})), ref, {rows, 3}, 1e-6);
    }
  }
  EXPECT_EQ(stats().graph_breaks, 0);
  EXPECT_EQ(stats().compiles, 2);  // static, then rows dynamic
}

TEST(OnnxOps, SoftmaxOpset9FlattensAtAxis) {
  Builder b(9);
  b.input("x", F32, {2, 3, 4}).output("y");
  auto* n = b.node("Softmax", {"x"}, {"y"});
  Builder::attr_i(n, "axis", 1);
  std::vector<float> v = seq(24), ref(24);
  for (int r = 0; r < 2; ++r) {  // softmax over each row of the [2, 12] flattening
    double mx = -1e30, s = 0;
    for (int j = 0; j < 12; ++j) mx = std::max<double>(mx, v[r * 12 + j]);
    for (int j = 0; j < 12; ++j) s += std::exp(v[r * 12 + j] - mx);
    for (int j = 0; j < 12; ++j) ref[r * 12 + j] = static_cast<float>(std::exp(v[r * 12 + j] - mx) / s);
  }
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {2, 3, 4})});
  expect_near(out[0], ref, {2, 3, 4});
}

TEST(OnnxOps, SliceAttributeAndInputFormsWithInt64MaxAndNegativeStep) {
  std::vector<float> v = seq(2 * 6);
  {  // opset 9 attributes: axis 1, [1:INT64_MAX]
    Builder b(9);
    b.input("x", F32, {2, 6}).output("y");
    auto* n = b.node("Slice", {"x"}, {"y"});
    Builder::attr_ints(n, "starts", {1});
    Builder::attr_ints(n, "ends", {std::numeric_limits<int64_t>::max()});
    Builder::attr_ints(n, "axes", {1});
    std::vector<float> ref;
    for (int r = 0; r < 2; ++r)
      for (int j = 1; j < 6; ++j) ref.push_back(v[r * 6 + j]);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(v, {2, 6})});
    expect_near(out[0], ref, {2, 5}, 0);
  }
  {  // opset 13 inputs: step 2 on axis -1, and step -1 (reversal) on a data tensor
    Builder b(13);
    b.input("x", F32, {2, 6}).output("y").output("r");
    b.const_i64("st", {0}).const_i64("en", {std::numeric_limits<int64_t>::max()}).const_i64("ax", {-1});
    b.const_i64("sp", {2});
    b.node("Slice", {"x", "st", "en", "ax", "sp"}, {"y"});
    b.const_i64("st2", {-1}).const_i64("en2", {-std::numeric_limits<int64_t>::max()}).const_i64("sp2", {-1});
    b.node("Slice", {"x", "st2", "en2", "ax", "sp2"}, {"r"});
    std::vector<float> ref, rev;
    for (int r = 0; r < 2; ++r) {
      for (int j = 0; j < 6; j += 2) ref.push_back(v[r * 6 + j]);
      for (int j = 5; j >= 0; --j) rev.push_back(v[r * 6 + j]);
    }
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(v, {2, 6})});
    expect_near(out[0], ref, {2, 3}, 0);
    expect_near(out[1], rev, {2, 6}, 0);
  }
}

TEST(OnnxOps, SqueezeUnsqueezeAttributeAndInputForms) {
  for (int opset : {9, 13}) {
    Builder b(opset);
    b.input("x", F32, {1, 3, 1}).output("y");
    auto* sq = b.node("Squeeze", opset < 13 ? std::vector<std::string>{"x"} : std::vector<std::string>{"x", "a0"}, {"s"});
    auto* us = b.node("Unsqueeze", opset < 13 ? std::vector<std::string>{"s"} : std::vector<std::string>{"s", "a1"}, {"y"});
    if (opset < 13) {
      Builder::attr_ints(sq, "axes", {0});
      Builder::attr_ints(us, "axes", {0, 3});
    } else {
      // Constants must come first in the node list: rebuild in order.
      b.graph()->clear_node();
      b.const_i64("a0", {0}).const_i64("a1", {0, 3});
      b.node("Squeeze", {"x", "a0"}, {"s"});
      b.node("Unsqueeze", {"s", "a1"}, {"y"});
    }
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor({1, 2, 3}, {1, 3, 1})});
    EXPECT_EQ(out[0].int_sizes(), (IntVec{1, 3, 1, 1})) << "opset " << opset;
  }
}

TEST(OnnxOps, ClipAttributesAndInputsHardSigmoidGeneral) {
  std::vector<float> v = {-8, -1, 0, 0.5f, 3, 7, 9, 2};
  std::vector<float> clip, hs;
  for (float x : v) {
    clip.push_back(std::min(6.0f, std::max(0.0f, x)));
    hs.push_back(std::min(1.0f, std::max(0.0f, 0.2f * x + 0.5f)));
  }
  {
    Builder b(9);
    b.input("x", F32, {8}).output("y").output("h");
    auto* n = b.node("Clip", {"x"}, {"y"});
    Builder::attr_f(n, "min", 0);
    Builder::attr_f(n, "max", 6);
    auto* h = b.node("HardSigmoid", {"x"}, {"h"});
    Builder::attr_f(h, "alpha", 0.2f);
    Builder::attr_f(h, "beta", 0.5f);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(v, {8})});
    expect_near(out[0], clip, {8}, 0);
    expect_near(out[1], hs, {8}, 1e-6);
  }
  {
    Builder b(11);
    b.input("x", F32, {8}).output("y");
    b.const_f32("lo", {}, {0}).const_f32("hi", {}, {6});
    b.node("Clip", {"x", "lo", "hi"}, {"y"});
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(v, {8})});
    expect_near(out[0], clip, {8}, 0);
  }
}

TEST(OnnxOps, PadReflectFromConstantPads) {
  Builder b(16);
  b.input("x", F32, {1, 2, 5}).output("y");
  b.const_i64("pads", {0, 0, 0, 0, 0, 3});
  auto* n = b.node("Pad", {"x", "pads"}, {"y"});
  Builder::attr_s(n, "mode", "reflect");
  std::vector<float> v = seq(10), ref;
  for (int c = 0; c < 2; ++c) {
    for (int j = 0; j < 5; ++j) ref.push_back(v[c * 5 + j]);
    for (int j = 0; j < 3; ++j) ref.push_back(v[c * 5 + 3 - j]);
  }
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 2, 5})});
  expect_near(out[0], ref, {1, 2, 8}, 0);
}

TEST(OnnxOps, ResizeNearestAsymmetricFloor) {
  Builder b(11);
  b.input("x", F32, {1, 2, 3, 4}).output("y");
  b.init("roi", {0}, {});
  b.init("scales", {4}, {1, 1, 2, 2});
  auto* r = b.node("Resize", {"x", "roi", "scales"}, {"y"});
  Builder::attr_s(r, "mode", "nearest");
  Builder::attr_s(r, "coordinate_transformation_mode", "asymmetric");
  Builder::attr_s(r, "nearest_mode", "floor");
  std::vector<float> v = seq(24), ref;
  for (int c = 0; c < 2; ++c)
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 8; ++j) ref.push_back(v[c * 12 + (i / 2) * 4 + j / 2]);
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 2, 3, 4})});
  expect_near(out[0], ref, {1, 2, 6, 8}, 0);
}

TEST(OnnxOps, ConvTransposeKernel2Stride2) {
  Builder b(11);
  b.input("x", F32, {1, 2, 2, 3}).output("y");
  std::vector<float> w = seq(2 * 3 * 2 * 2, 7);  // [Cin=2, Cout=3, 2, 2]
  b.init("w", {2, 3, 2, 2}, w);
  auto* n = b.node("ConvTranspose", {"x", "w"}, {"y"});
  Builder::attr_ints(n, "kernel_shape", {2, 2});
  Builder::attr_ints(n, "strides", {2, 2});
  std::vector<float> v = seq(12), ref(3 * 4 * 6, 0);
  for (int ci = 0; ci < 2; ++ci)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j)
        for (int co = 0; co < 3; ++co)
          for (int a = 0; a < 2; ++a)
            for (int c = 0; c < 2; ++c)
              ref[co * 24 + (2 * i + a) * 6 + 2 * j + c] += v[ci * 6 + i * 3 + j] * w[((ci * 3 + co) * 2 + a) * 2 + c];
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 2, 2, 3})});
  expect_near(out[0], ref, {1, 3, 4, 6});
}

// Direct 2-D convolution reference with ONNX pads [top, left, bottom, right].
std::vector<float> conv_ref(const std::vector<float>& x, int C, int H, int W, const std::vector<float>& w, int O,
                            int kh, int kw, int sh, int sw, int pt, int pl, int pb, int pr, int groups,
                            const std::vector<float>& bias, int& OH, int& OW) {
  OH = (H + pt + pb - kh) / sh + 1;
  OW = (W + pl + pr - kw) / sw + 1;
  int cg = C / groups, og = O / groups;
  std::vector<float> y(O * OH * OW);
  for (int o = 0; o < O; ++o)
    for (int i = 0; i < OH; ++i)
      for (int j = 0; j < OW; ++j) {
        double s = bias.empty() ? 0 : bias[o];
        int g = o / og;
        for (int c = 0; c < cg; ++c)
          for (int a = 0; a < kh; ++a)
            for (int bb = 0; bb < kw; ++bb) {
              int yi = i * sh - pt + a, xj = j * sw - pl + bb;
              if (yi < 0 || yi >= H || xj < 0 || xj >= W) continue;
              s += x[((g * cg + c) * H + yi) * W + xj] * w[((o * cg + c) * kh + a) * kw + bb];
            }
        y[(o * OH + i) * OW + j] = static_cast<float>(s);
      }
  return y;
}

TEST(OnnxOps, ConvAsymmetricPadsStrides21AndGroups) {
  Builder b(9);
  b.input("x", F32, {1, 4, 5, 6}).output("y").output("z");
  std::vector<float> w = seq(4 * 2 * 1 * 3, 3), bias = {0.1f, -0.2f, 0.3f, 0.05f};
  b.init("w", {4, 2, 1, 3}, w).init("b", {4}, bias);
  auto* n = b.node("Conv", {"x", "w", "b"}, {"y"});
  Builder::attr_ints(n, "pads", {0, 1, 0, 1});
  Builder::attr_ints(n, "strides", {2, 1});
  Builder::attr_i(n, "group", 2);
  std::vector<float> w2 = seq(2 * 4 * 3 * 3, 5);
  b.init("w2", {2, 4, 3, 3}, w2);
  auto* n2 = b.node("Conv", {"x", "w2"}, {"z"});
  Builder::attr_ints(n2, "pads", {1, 0, 0, 2});  // asymmetric
  Builder::attr_ints(n2, "strides", {1, 2});
  std::vector<float> v = seq(4 * 5 * 6);
  int oh, ow, oh2, ow2;
  auto ref = conv_ref(v, 4, 5, 6, w, 4, 1, 3, 2, 1, 0, 1, 0, 1, 2, bias, oh, ow);
  auto ref2 = conv_ref(v, 4, 5, 6, w2, 2, 3, 3, 1, 2, 1, 0, 0, 2, 1, {}, oh2, ow2);
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 4, 5, 6})});
  expect_near(out[0], ref, {1, 4, oh, ow});
  expect_near(out[1], ref2, {1, 2, oh2, ow2});
}

TEST(OnnxOps, LstmOnnxGateOrder) {
  const int T = 2, N = 1, I = 3, H = 2;
  Builder b(16);
  b.input("x", F32, {T, N, I}).input("h0", F32, {1, N, H}).input("c0", F32, {1, N, H});
  b.output("Y").output("Yh").output("Yc");
  std::vector<float> W = seq(4 * H * I, 11), R = seq(4 * H * H, 12), B = seq(8 * H, 13);
  b.init("W", {1, 4 * H, I}, W).init("R", {1, 4 * H, H}, R).init("B", {1, 8 * H}, B);
  auto* n = b.node("LSTM", {"x", "W", "R", "B", "", "h0", "c0"}, {"Y", "Yh", "Yc"});
  Builder::attr_i(n, "hidden_size", H);
  std::vector<float> x = seq(T * N * I, 14), h = seq(H, 15), c = seq(H, 16), Y;
  std::vector<float> h0 = h, c0 = c;
  auto sig = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int t = 0; t < T; ++t) {
    double g[4][H];
    for (int k = 0; k < 4; ++k)  // i, o, f, c
      for (int u = 0; u < H; ++u) {
        int row = k * H + u;
        double s = B[row] + B[4 * H + row];
        for (int q = 0; q < I; ++q) s += W[row * I + q] * x[t * I + q];
        for (int q = 0; q < H; ++q) s += R[row * H + q] * h[q];
        g[k][u] = s;
      }
    for (int u = 0; u < H; ++u) {
      double cn = sig(g[2][u]) * c[u] + sig(g[0][u]) * std::tanh(g[3][u]);
      c[u] = static_cast<float>(cn);
      h[u] = static_cast<float>(sig(g[1][u]) * std::tanh(cn));
      Y.push_back(h[u]);
    }
  }
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(x, {T, N, I}), ftensor(h0, {1, N, H}), ftensor(c0, {1, N, H})});
  expect_near(out[0], Y, {T, 1, N, H});
  expect_near(out[1], h, {1, N, H});
  expect_near(out[2], c, {1, N, H});
}

TEST(OnnxOps, GatherOnTensorsAndShapes) {
  Builder b(13);
  b.input("s", F32, {2, 3, 4}).output("h").output("rows").output("n");
  Builder::const_i64(b.graph(), "i0", {1}, {});
  b.node("Gather", {"s", "i0"}, {"h"});  // scalar index drops dim 0 → [3, 4]
  b.const_i64("idx", {2, 0});
  auto* g = b.node("Gather", {"s", "idx"}, {"rows"});
  Builder::attr_i(g, "axis", 1);  // [2, 2, 4]
  b.node("Shape", {"s"}, {"shp"});
  b.node("Gather", {"shp", "i0"}, {"n"});  // host scalar 3
  std::vector<float> v = seq(24), h(v.begin() + 12, v.end()), rows;
  for (int a = 0; a < 2; ++a)
    for (int r : {2, 0})
      for (int k = 0; k < 4; ++k) rows.push_back(v[a * 12 + r * 4 + k]);
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {2, 3, 4})});
  expect_near(out[0], h, {3, 4}, 0);
  expect_near(out[1], rows, {2, 2, 4}, 0);
  EXPECT_EQ(out[2].dim(), 0);
  EXPECT_EQ(out[2].item<int64_t>(), 3);
}

TEST(OnnxOps, PoolsBatchNormReduceMeanMatMulPow) {
  Builder b(9);
  b.input("x", F32, {1, 2, 4, 4}).output("ap").output("mp").output("gap").output("bn").output("rm").output("mm");
  auto* ap = b.node("AveragePool", {"x"}, {"ap"});
  Builder::attr_ints(ap, "kernel_shape", {3, 3});
  Builder::attr_ints(ap, "strides", {2, 2});
  Builder::attr_ints(ap, "pads", {1, 1, 1, 1});
  Builder::attr_i(ap, "count_include_pad", 0);
  auto* mp = b.node("MaxPool", {"x"}, {"mp"});
  Builder::attr_ints(mp, "kernel_shape", {2, 2});
  Builder::attr_ints(mp, "strides", {2, 2});
  b.node("GlobalAveragePool", {"x"}, {"gap"});
  b.init("sc", {2}, {1.5f, -0.5f}).init("bi", {2}, {0.1f, 0.2f}).init("mu", {2}, {0.3f, -0.1f});
  b.init("var", {2}, {0.8f, 1.2f});
  auto* bn = b.node("BatchNormalization", {"x", "sc", "bi", "mu", "var"}, {"bn"});
  Builder::attr_f(bn, "epsilon", 1e-5f);
  b.init("two", {}, {2.0f});
  b.node("Pow", {"x", "two"}, {"sq"});
  auto* rm = b.node("ReduceMean", {"sq"}, {"rm"});
  Builder::attr_ints(rm, "axes", {-1});
  std::vector<float> wm = seq(4 * 3, 9);
  b.init("wm", {4, 3}, wm);
  b.node("MatMul", {"x", "wm"}, {"mm"});
  std::vector<float> v = seq(32);
  auto at = [&](int c, int i, int j) { return v[c * 16 + i * 4 + j]; };
  std::vector<float> rap, rmp, rgap, rbn, rrm, rmm;
  for (int c = 0; c < 2; ++c) {
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) {
        double s = 0;
        int cnt = 0;
        for (int a = 2 * i - 1; a < 2 * i + 2; ++a)
          for (int d = 2 * j - 1; d < 2 * j + 2; ++d)
            if (a >= 0 && a < 4 && d >= 0 && d < 4) s += at(c, a, d), ++cnt;
        rap.push_back(static_cast<float>(s / cnt));
        rmp.push_back(std::max({at(c, 2 * i, 2 * j), at(c, 2 * i + 1, 2 * j), at(c, 2 * i, 2 * j + 1),
                                at(c, 2 * i + 1, 2 * j + 1)}));
      }
    double g = 0;
    for (int k = 0; k < 16; ++k) g += v[c * 16 + k];
    rgap.push_back(static_cast<float>(g / 16));
    float sc[2] = {1.5f, -0.5f}, bi[2] = {0.1f, 0.2f}, mu[2] = {0.3f, -0.1f}, var[2] = {0.8f, 1.2f};
    for (int k = 0; k < 16; ++k)
      rbn.push_back(static_cast<float>((v[c * 16 + k] - mu[c]) / std::sqrt(var[c] + 1e-5) * sc[c] + bi[c]));
    for (int i = 0; i < 4; ++i) {
      double s = 0;
      for (int j = 0; j < 4; ++j) s += at(c, i, j) * at(c, i, j);
      rrm.push_back(static_cast<float>(s / 4));
      for (int o = 0; o < 3; ++o) {
        double m = 0;
        for (int j = 0; j < 4; ++j) m += at(c, i, j) * wm[j * 3 + o];
        rmm.push_back(static_cast<float>(m));
      }
    }
  }
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 2, 4, 4})});
  expect_near(out[0], rap, {1, 2, 2, 2});
  expect_near(out[1], rmp, {1, 2, 2, 2}, 0);
  expect_near(out[2], rgap, {1, 2, 1, 1});
  expect_near(out[3], rbn, {1, 2, 4, 4});
  expect_near(out[4], rrm, {1, 2, 4, 1});
  expect_near(out[5], rmm, {1, 2, 4, 3});
}

TEST(OnnxOps, ConstantOfShapeFromShapeValue) {
  // Silero's zero state: ConstantOfShape(Concat(Shape(x)[0:1], [128])).
  Builder b(16);
  b.input("x", F32, {-1, 7}).output("z");
  b.node("Shape", {"x"}, {"s"});
  b.const_i64("st", {0}).const_i64("en", {1}).const_i64("k", {5});
  b.node("Slice", {"s", "st", "en"}, {"b"});
  auto* c = b.node("Concat", {"b", "k"}, {"shape"});
  Builder::attr_i(c, "axis", 0);
  auto* n = b.node("ConstantOfShape", {"shape"}, {"z"});
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto::TENSOR);
  Builder::fill(a->mutable_t(), "", {1}, {0.0f});
  std::vector<Tensor> out;
  RUN(b.load(), {zeros({3, 7})});
  expect_near(out[0], std::vector<float>(15, 0.0f), {3, 5}, 0);
}


// Loop (opset 13): M = Shape(x)[0] (a host value), no cond input; body: acc ← 2·acc + x[i] (x read
// from the enclosing graph with the iteration number), each iteration's acc as the scan output.
onnx_test::Builder loop_model(bool with_cond) {
  Builder b(13);
  b.input("x", F32, {-1, 3}).input("acc0", F32, {3}).output("acc").output("trace");
  b.node("Shape", {"x"}, {"s"});
  Builder::const_i64(b.graph(), "zero", {0}, {});
  b.node("Gather", {"s", "zero"}, {"m"});
  if (with_cond) {
    Builder::const_i64(b.graph(), "c0", {1}, {});
    auto* cast = b.node("Cast", {"c0"}, {"c0b"});
    Builder::attr_i(cast, "to", ::onnx::TensorProto::BOOL);
  }
  auto* n = b.node("Loop", {"m", with_cond ? "c0b" : "", "acc0"}, {"acc", "trace"}, "loop");
  auto* body = Builder::attr_g(n, "body", "loop_body");
  Builder::set_type(body->add_input(), "i", I64, {});
  Builder::set_type(body->add_input(), "cond_in", ::onnx::TensorProto::BOOL, {});
  Builder::set_type(body->add_input(), "acc_in", F32, {3});
  Builder::const_f32_in(body, "two", {}, {2.0f});
  Builder::add_node(body, "Mul", {"acc_in", "two"}, {"acc2"});
  Builder::add_node(body, "Gather", {"x", "i"}, {"row"});
  Builder::add_node(body, "Add", {"acc2", "row"}, {"acc_out"});
  Builder::add_node(body, "Identity", {"acc_out"}, {"scan_out"});
  if (with_cond) {  // stop once acc's first element exceeds 1
    Builder::const_f32_in(body, "one", {}, {1.0f});
    Builder::const_i64(body, "first", {0}, {});
    Builder::add_node(body, "Gather", {"acc_out", "first"}, {"a0"});
    Builder::add_node(body, "LessOrEqual", {"a0", "one"}, {"cond_out"});
  } else {
    Builder::add_node(body, "Identity", {"cond_in"}, {"cond_out"});
  }
  for (const char* o : {"cond_out", "acc_out", "scan_out"}) body->add_output()->set_name(o);
  return b;
}

/// The reference of loop_model: {final acc, the stacked accs}; stops after the iteration where
/// acc[0] > 1 when `with_cond`.
std::pair<std::vector<float>, std::vector<float>> loop_reference(const std::vector<float>& x, int64_t rows,
                                                                 std::vector<float> acc, bool with_cond) {
  std::vector<float> trace;
  for (int64_t i = 0; i < rows; ++i) {
    for (int j = 0; j < 3; ++j) acc[j] = acc[j] * 2.0f + x[i * 3 + j];
    trace.insert(trace.end(), acc.begin(), acc.end());
    if (with_cond && !(acc[0] <= 1.0f)) break;
  }
  return {acc, trace};
}

TEST(OnnxOps, LoopWithTripCountFromShapeCompilesOncePerCount) {
  auto m = loop_model(false).load();
  reset();
  CompileOptions o;
  o.name = "onnx_loop";
  o.arg_names = {"x", "acc0"};
  o.backend = "interp";
  o.fullgraph = true;
  auto f = compile([m](const Tensor& x, const Tensor& a) { return m->forward({x, a}); }, o);
  for (int64_t rows : {2, 4, 5, 4}) {
    std::vector<float> x = seq(static_cast<size_t>(rows * 3), static_cast<uint64_t>(rows)), a = seq(3, 99);
    auto [acc, trace] = loop_reference(x, rows, a, false);
    std::vector<Tensor> out = f(ftensor(x, {rows, 3}), ftensor(a, {3}));
    expect_near(out[0], acc, {3}, 1e-5);
    expect_near(out[1], trace, {rows, 3}, 1e-5);
  }
  // The trip count follows x's rows: the iterations are unrolled, so each count is its own graph
  // (the second 4 is a cache hit), and nothing breaks the graph.
  EXPECT_EQ(stats().graph_breaks, 0);
  EXPECT_EQ(stats().compiles, 3);
}

TEST(OnnxOps, LoopStopsOnItsConditionAndRefusesEndlessLoops) {
  auto m = loop_model(true).load();
  std::vector<float> x = {0.5f, 0, 0, 0.5f, 0, 0, 0.5f, 0, 0, 0.5f, 0, 0, 0.5f, 0, 0}, a = {0, 1, 2};
  auto [acc, trace] = loop_reference(x, 5, a, true);  // 0.5, 1.5: stops after the second iteration
  ASSERT_EQ(trace.size(), 6u);
  std::vector<Tensor> out;
  RUN(m, {ftensor(x, {5, 3}), ftensor(a, {3})});
  expect_near(out[0], acc, {3}, 0);
  expect_near(out[1], trace, {2, 3}, 0);

  // No trip count and a condition that stays true: an error naming the node, not a hang.
  Builder b(13);
  b.input("c", ::onnx::TensorProto::BOOL, {}).output("n");
  Builder::const_i64(b.graph(), "n0", {0}, {});
  auto* n = b.node("Loop", {"", "c", "n0"}, {"n"}, "endless");
  auto* body = Builder::attr_g(n, "body", "endless_body");
  Builder::set_type(body->add_input(), "i", I64, {});
  Builder::set_type(body->add_input(), "cond_in", ::onnx::TensorProto::BOOL, {});
  Builder::set_type(body->add_input(), "n_in", I64, {});
  Builder::add_node(body, "Identity", {"cond_in"}, {"cond_out"});
  Builder::add_node(body, "Identity", {"i"}, {"n_out"});
  for (const char* o : {"cond_out", "n_out"}) body->add_output()->set_name(o);
  auto endless = b.load();
  EXPECT_EQ(endless->forward({tensor<bool>({false}, {})})[0].item<int64_t>(), 0);  // no iteration
  try {
    endless->forward({tensor<bool>({true}, {})});
    FAIL() << "an endless Loop returned";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("endless"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("at most 65536 iterations"), std::string::npos) << e.what();
  }
}

TEST(OnnxOps, ScanReversedInputAndOutputAxis) {
  // Scan (opset 11): a running sum over x's rows read backwards; each step's sum stacked along axis 1.
  Builder b(11);
  b.input("init", F32, {3}).input("x", F32, {-1, 3}).output("sum").output("steps");
  auto* n = b.node("Scan", {"init", "x"}, {"sum", "steps"}, "scan");
  Builder::attr_i(n, "num_scan_inputs", 1);
  Builder::attr_ints(n, "scan_input_directions", {1});
  Builder::attr_ints(n, "scan_output_axes", {-1});
  auto* body = Builder::attr_g(n, "body", "scan_body");
  Builder::set_type(body->add_input(), "s_in", F32, {3});
  Builder::set_type(body->add_input(), "row", F32, {3});
  Builder::add_node(body, "Add", {"s_in", "row"}, {"s_out"});
  Builder::add_node(body, "Identity", {"s_out"}, {"step"});
  for (const char* o : {"s_out", "step"}) body->add_output()->set_name(o);
  auto m = b.load();
  const int64_t L = 4;
  std::vector<float> init = seq(3, 5), x = seq(L * 3, 6), sum = init, steps(3 * L);
  for (int64_t t = 0; t < L; ++t)
    for (int j = 0; j < 3; ++j) {
      sum[j] += x[(L - 1 - t) * 3 + j];
      steps[j * L + t] = sum[j];
    }
  std::vector<Tensor> out;
  RUN(m, {ftensor(init, {3}), ftensor(x, {L, 3})});
  expect_near(out[0], sum, {3}, 1e-6);
  expect_near(out[1], steps, {3, L}, 1e-6);
}

TEST(OnnxOps, OnlyLoopBodiesTakeInputs) {
  Builder b(13);
  b.input("c", ::onnx::TensorProto::BOOL, {}).output("y");
  auto* n = b.node("If", {"c"}, {"y"}, "if_with_inputs");
  for (const char* br : {"then_branch", "else_branch"}) {
    auto* g = Builder::attr_g(n, br, br);
    Builder::set_type(g->add_input(), std::string(br) + "_in", F32, {});
    Builder::const_i64(g, std::string(br) + "_out", {1}, {});
    g->add_output()->set_name(std::string(br) + "_out");
  }
  try {
    b.load();
    FAIL() << "an If branch with inputs loaded";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("only Loop and Scan bodies"), std::string::npos) << e.what();
  }
}


TEST(OnnxOps, GroupNormalizationPerGroupAndPerChannelAffine) {
  // x [2, 4, 3], 2 groups. Opset 18: scale/bias per group; opset 21: per channel.
  const int64_t N = 2, C = 4, L = 3, G = 2;
  std::vector<float> x = seq(N * C * L, 11);
  auto reference = [&](const std::vector<float>& sc, const std::vector<float>& bi) {
    std::vector<float> y(x.size());
    for (int64_t nn = 0; nn < N; ++nn)
      for (int64_t g = 0; g < G; ++g) {
        int64_t base = (nn * C + g * (C / G)) * L, cnt = (C / G) * L;
        double mu = 0, var = 0;
        for (int64_t i = 0; i < cnt; ++i) mu += x[base + i];
        mu /= cnt;
        for (int64_t i = 0; i < cnt; ++i) var += (x[base + i] - mu) * (x[base + i] - mu);
        var /= cnt;
        for (int64_t i = 0; i < cnt; ++i) {
          int64_t ch = g * (C / G) + i / L;
          size_t k = sc.size() == static_cast<size_t>(C) ? ch : g;
          y[base + i] = static_cast<float>((x[base + i] - mu) / std::sqrt(var + 1e-3) * sc[k] + bi[k]);
        }
      }
    return y;
  };
  for (int opset : {18, 21}) {
    int64_t per = opset < 21 ? G : C;
    std::vector<float> sc = seq(per, 12 + opset), bi = seq(per, 13 + opset);
    Builder b(opset);
    b.input("x", F32, {N, C, L}).init("s", {per}, sc).init("b", {per}, bi).output("y");
    auto* n = b.node("GroupNormalization", {"x", "s", "b"}, {"y"});
    Builder::attr_i(n, "num_groups", G);
    Builder::attr_f(n, "epsilon", 1e-3f);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(x, {N, C, L})});
    expect_near(out[0], reference(sc, bi), {N, C, L}, 1e-5);
  }
}


TEST(OnnxOps, LpPoolWithPadsAndStrides) {
  // x [1, 2, 5, 4], kernel 3x2, strides 2x1, pads [1, 0, 1, 1] (top, left, bottom, right): the pads
  // are zeros in the window sums, as ONNX's reference pads.
  const int64_t C = 2, H = 5, W = 4, KH = 3, KW = 2, SH = 2, SW = 1, PT = 1, PL = 0, PB = 1, PR = 1;
  std::vector<float> x = seq(C * H * W, 21);
  const int64_t OH = (H + PT + PB - KH) / SH + 1, OW = (W + PL + PR - KW) / SW + 1;
  for (int64_t p : {1, 2, 3}) {
    std::vector<float> ref;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = 0;
          for (int64_t i = 0; i < KH; ++i)
            for (int64_t j = 0; j < KW; ++j) {
              int64_t h = oh * SH - PT + i, w = ow * SW - PL + j;
              if (h >= 0 && h < H && w >= 0 && w < W) acc += std::pow(std::abs(double(x[(c * H + h) * W + w])), double(p));
            }
          ref.push_back(static_cast<float>(std::pow(acc, 1.0 / double(p))));
        }
    Builder b(11);
    b.input("x", F32, {1, C, H, W}).output("y");
    auto* n = b.node("LpPool", {"x"}, {"y"});
    Builder::attr_ints(n, "kernel_shape", {KH, KW});
    Builder::attr_ints(n, "strides", {SH, SW});
    Builder::attr_ints(n, "pads", {PT, PL, PB, PR});
    Builder::attr_i(n, "p", p);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(x, {1, C, H, W})});
    expect_near(out[0], ref, {1, C, OH, OW}, 1e-5);
  }
}

// ---- convolution / pooling family ------------------------------------------------------------------------
/// Runs a one-input model eagerly and compiled on interp and cpu; every result must match `ref`.
void expect_everywhere(const std::shared_ptr<onnx::Model>& m, const std::string& name, const Tensor& x,
                       const std::vector<float>& ref, const IntVec& sizes, double tol, size_t output = 0) {
  std::vector<Tensor> out;
  RUN(m, {x});
  expect_near(out.at(output), ref, sizes, tol);
  for (const char* backend : {"interp", "cpu"}) {
    CompileOptions o;
    o.name = name + "_" + backend;
    o.arg_names = {"x"};
    o.backend = backend;
    auto f = compile([m](const Tensor& a) { return m->forward({a}); }, o);
    std::vector<Tensor> got = f(x);
    SCOPED_TRACE(backend);
    expect_near(got.at(output), ref, sizes, tol);
  }
}

TEST(OnnxOps, ConvTranspose3DWithGroupsStridesDilationsPadsAndOutputPadding) {
  // x [1, 4, 2, 3, 2], w [4, 1, 2, 2, 3] in 2 groups (2 output channels), strides (2, 1, 2), dilations
  // (1, 2, 1), pads (1, 0, 0 | 0, 1, 1), output_padding (1, 0, 1), bias: the full transposed
  // convolution scattered by hand, then cropped by the pads.
  const int C = 4, D = 2, H = 3, W = 2, G = 2, O = 2, KD = 2, KH = 2, KW = 3;
  const int s[3] = {2, 1, 2}, dl[3] = {1, 2, 1}, pb[3] = {1, 0, 0}, pe[3] = {0, 1, 1}, op[3] = {1, 0, 1};
  const int in[3] = {D, H, W}, k[3] = {KD, KH, KW};
  int full[3], out[3];
  for (int i = 0; i < 3; ++i) {
    full[i] = s[i] * (in[i] - 1) + dl[i] * (k[i] - 1) + 1 + op[i];
    out[i] = full[i] - pb[i] - pe[i];
  }
  std::vector<float> x = seq(C * D * H * W, 31), w = seq(C * (O / G) * KD * KH * KW, 32), bias = {0.25f, -0.5f};
  std::vector<double> acc(static_cast<size_t>(O * full[0] * full[1] * full[2]), 0.0);
  for (int ci = 0; ci < C; ++ci) {
    int g = ci / (C / G);
    for (int ol = 0; ol < O / G; ++ol) {
      int o = g * (O / G) + ol;
      for (int d = 0; d < D; ++d)
        for (int h = 0; h < H; ++h)
          for (int ww = 0; ww < W; ++ww)
            for (int a = 0; a < KD; ++a)
              for (int bb = 0; bb < KH; ++bb)
                for (int c = 0; c < KW; ++c) {
                  int od = d * s[0] + a * dl[0], oh = h * s[1] + bb * dl[1], ow = ww * s[2] + c * dl[2];
                  acc[static_cast<size_t>(((o * full[0] + od) * full[1] + oh) * full[2] + ow)] +=
                      double(x[static_cast<size_t>(((ci * D + d) * H + h) * W + ww)]) *
                      w[static_cast<size_t>((((ci * (O / G) + ol) * KD + a) * KH + bb) * KW + c)];
                }
    }
  }
  std::vector<float> ref;
  for (int o = 0; o < O; ++o)
    for (int d = 0; d < out[0]; ++d)
      for (int h = 0; h < out[1]; ++h)
        for (int ww = 0; ww < out[2]; ++ww)
          ref.push_back(static_cast<float>(
              acc[static_cast<size_t>(((o * full[0] + d + pb[0]) * full[1] + h + pb[1]) * full[2] + ww + pb[2])] +
              bias[static_cast<size_t>(o)]));
  Builder b(11);
  b.input("x", F32, {1, C, D, H, W}).output("y");
  b.init("w", {C, O / G, KD, KH, KW}, w);
  b.init("b", {O}, bias);
  auto* n = b.node("ConvTranspose", {"x", "w", "b"}, {"y"});
  Builder::attr_ints(n, "strides", {s[0], s[1], s[2]});
  Builder::attr_ints(n, "dilations", {dl[0], dl[1], dl[2]});
  Builder::attr_ints(n, "pads", {pb[0], pb[1], pb[2], pe[0], pe[1], pe[2]});
  Builder::attr_ints(n, "output_padding", {op[0], op[1], op[2]});
  Builder::attr_i(n, "group", G);
  expect_everywhere(b.load(), "convtranspose3d", ftensor(x, {1, C, D, H, W}), ref, {1, O, out[0], out[1], out[2]}, 1e-5);

  // The same weights with auto_pad=SAME_UPPER and no output_padding: output = input * stride, the odd
  // unit of the total padding cropped at the end.
  Builder b2(11);
  b2.input("x", F32, {1, C, D, H, W}).output("y");
  b2.init("w", {C, O / G, KD, KH, KW}, w);
  auto* n2 = b2.node("ConvTranspose", {"x", "w"}, {"y"});
  Builder::attr_ints(n2, "strides", {s[0], s[1], s[2]});
  Builder::attr_ints(n2, "dilations", {dl[0], dl[1], dl[2]});
  Builder::attr_i(n2, "group", G);
  Builder::attr_s(n2, "auto_pad", "SAME_UPPER");
  std::vector<float> ref2;
  int lo[3];
  for (int i = 0; i < 3; ++i) lo[i] = (full[i] - op[i] - in[i] * s[i]) / 2;  // full size without output_padding
  for (int o = 0; o < O; ++o)
    for (int d = 0; d < D * s[0]; ++d)
      for (int h = 0; h < H * s[1]; ++h)
        for (int ww = 0; ww < W * s[2]; ++ww)
          ref2.push_back(static_cast<float>(
              acc[static_cast<size_t>(((o * full[0] + d + lo[0]) * full[1] + h + lo[1]) * full[2] + ww + lo[2])]));
  // (acc's cells past the unpadded full size only exist through output_padding and are never read here)
  {
    std::vector<Tensor> out;
    RUN(b2.load(), {ftensor(x, {1, C, D, H, W})});
    expect_near(out[0], ref2, {1, O, D * s[0], H * s[1], W * s[2]}, 1e-5);
  }
}

// Max pooling reference with ONNX pads and both index orders, over [C, H, W] (N = 1).
void max_pool_ref(const std::vector<float>& x, int C, int H, int W, int KH, int KW, int SH, int SW, int PT, int PL,
                  int OH, int OW, bool col_major, std::vector<float>& y, std::vector<int64_t>& idx) {
  for (int c = 0; c < C; ++c)
    for (int oh = 0; oh < OH; ++oh)
      for (int ow = 0; ow < OW; ++ow) {
        float best = -INFINITY;
        int64_t at = -1;
        for (int i = 0; i < KH; ++i)
          for (int j = 0; j < KW; ++j) {
            int h = oh * SH - PT + i, w = ow * SW - PL + j;
            if (h < 0 || h >= H || w < 0 || w >= W) continue;
            float v = x[static_cast<size_t>((c * H + h) * W + w)];
            if (v > best) {
              best = v;
              at = col_major ? int64_t(c) * H * W + int64_t(w) * H + h : int64_t(c * H + h) * W + w;
            }
          }
        y.push_back(best);
        idx.push_back(at);
      }
}

TEST(OnnxOps, MaxPoolIndicesInBothStorageOrdersAndMaxUnpoolRoundTrip) {
  // x [1, 2, 5, 6], kernel 3x2, strides 2x2, pads (1, 0 | 0, 1): Y and Indices against the reference
  // (first largest in scan order); storage_order=1 numbers the spatial dims column-major.
  const int C = 2, H = 5, W = 6, KH = 3, KW = 2, SH = 2, SW = 2, PT = 1, PL = 0, PB = 0, PR = 1;
  const int OH = (H + PT + PB - KH) / SH + 1, OW = (W + PL + PR - KW) / SW + 1;
  std::vector<float> x = seq(C * H * W, 41);
  x[9] = x[8];  // a tie inside one window: the first in scan order wins
  for (int order : {0, 1}) {
    std::vector<float> yref;
    std::vector<int64_t> iref;
    max_pool_ref(x, C, H, W, KH, KW, SH, SW, PT, PL, OH, OW, order == 1, yref, iref);
    Builder b(12);
    b.input("x", F32, {1, C, H, W}).output("y").output("i");
    auto* n = b.node("MaxPool", {"x"}, {"y", "i"});
    Builder::attr_ints(n, "kernel_shape", {KH, KW});
    Builder::attr_ints(n, "strides", {SH, SW});
    Builder::attr_ints(n, "pads", {PT, PL, PB, PR});
    Builder::attr_i(n, "storage_order", order);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(x, {1, C, H, W})});
    expect_near(out[0], yref, {1, C, OH, OW}, 0);
    ASSERT_EQ(out[1].int_sizes(), (IntVec{1, C, OH, OW}));
    EXPECT_EQ(out[1].contiguous().to_vector<int64_t>(), iref) << "storage_order " << order;
  }
  // Hand-checked: [[1, 5, 2], [4, 3, 6]] with a 2x2 kernel, stride 1: maxima 5 (index 1) and 6 (5);
  // column-major indices 2 and 5.
  {
    Builder b(12);
    b.input("x", F32, {1, 1, 2, 3}).output("y").output("i");
    auto* n = b.node("MaxPool", {"x"}, {"y", "i"});
    Builder::attr_ints(n, "kernel_shape", {2, 2});
    Builder::attr_i(n, "storage_order", 1);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor({1, 5, 2, 4, 3, 6}, {1, 1, 2, 3})});
    expect_near(out[0], {5, 6}, {1, 1, 1, 2}, 0);
    EXPECT_EQ(out[1].contiguous().to_vector<int64_t>(), (std::vector<int64_t>{2, 5}));
  }
  // MaxPool (kernel 2, stride 2) then MaxUnpool: each maximum back in place, zeros elsewhere; with
  // output_shape [1, 2, 5, 7] each keeps its (c, h, w) and the extra row and column are zeros (as
  // ONNX's test_maxunpool_export_with_output_shape places them).
  const int UH = 4, UW = 6;
  std::vector<float> u = seq(C * UH * UW, 43), pooled;
  std::vector<int64_t> where;
  max_pool_ref(u, C, UH, UW, 2, 2, 2, 2, 0, 0, UH / 2, UW / 2, false, pooled, where);
  for (bool with_shape : {false, true}) {
    Builder b(11);
    b.input("x", F32, {1, C, UH, UW}).output("z");
    auto* p = b.node("MaxPool", {"x"}, {"y", "i"});
    Builder::attr_ints(p, "kernel_shape", {2, 2});
    Builder::attr_ints(p, "strides", {2, 2});
    std::vector<std::string> ins = {"y", "i"};
    if (with_shape) {
      b.const_i64("shape", {1, C, 5, 7});
      ins.push_back("shape");
    }
    auto* un = b.node("MaxUnpool", ins, {"z"});
    Builder::attr_ints(un, "kernel_shape", {2, 2});
    Builder::attr_ints(un, "strides", {2, 2});
    std::vector<float> ref(with_shape ? C * 5 * 7 : C * UH * UW, 0.0f);
    for (size_t j = 0; j < where.size(); ++j) {
      int64_t c = where[j] / (UH * UW), h = where[j] / UW % UH, w = where[j] % UW;
      ref[static_cast<size_t>(with_shape ? (c * 5 + h) * 7 + w : where[j])] = pooled[j];
    }
    IntVec sizes = with_shape ? IntVec{1, C, 5, 7} : IntVec{1, C, UH, UW};
    expect_everywhere(b.load(), with_shape ? "maxunpool_shape" : "maxunpool", ftensor(u, {1, C, UH, UW}), ref, sizes, 0);
  }
}

/// RoiAlign as ONNX Runtime defines it, one region [C, PH, PW] at a time (X is [C, H, W]).
std::vector<float> roi_align_ref(const std::vector<float>& X, int C, int H, int W, const float* roi, int PH, int PW,
                                 int sr, float scale, bool half, bool max_mode) {
  float off = half ? 0.5f : 0.0f;
  float x1 = roi[0] * scale - off, y1 = roi[1] * scale - off, x2 = roi[2] * scale - off, y2 = roi[3] * scale - off;
  float rw = x2 - x1, rh = y2 - y1;
  if (!half) {
    rw = std::max(rw, 1.0f);
    rh = std::max(rh, 1.0f);
  }
  float bh = rh / float(PH), bw = rw / float(PW);
  int gh = sr > 0 ? sr : int(std::ceil(rh / float(PH))), gw = sr > 0 ? sr : int(std::ceil(rw / float(PW)));
  float count = float(std::max(gh * gw, 1));
  std::vector<float> out;
  for (int c = 0; c < C; ++c)
    for (int ph = 0; ph < PH; ++ph)
      for (int pw = 0; pw < PW; ++pw) {
        float acc = 0;
        bool first = true;
        for (int iy = 0; iy < gh; ++iy)
          for (int ix = 0; ix < gw; ++ix) {
            float y = y1 + float(ph) * bh + (float(iy) + 0.5f) * bh / float(gh);
            float x = x1 + float(pw) * bw + (float(ix) + 0.5f) * bw / float(gw);
            float t[4] = {0, 0, 0, 0};
            if (!(y < -1.0f || y > float(H) || x < -1.0f || x > float(W))) {
              y = std::max(y, 0.0f);
              x = std::max(x, 0.0f);
              int yl = int(y), xl = int(x), yh, xh;
              if (yl >= H - 1) yh = yl = H - 1, y = float(yl); else yh = yl + 1;
              if (xl >= W - 1) xh = xl = W - 1, x = float(xl); else xh = xl + 1;
              float ly = y - float(yl), lx = x - float(xl), hy = 1 - ly, hx = 1 - lx;
              auto at = [&](int yy, int xx) { return X[static_cast<size_t>((c * H + yy) * W + xx)]; };
              t[0] = hy * hx * at(yl, xl);
              t[1] = hy * lx * at(yl, xh);
              t[2] = ly * hx * at(yh, xl);
              t[3] = ly * lx * at(yh, xh);
            }
            if (max_mode) {
              float v = std::max(std::max(std::max(t[0], t[1]), t[2]), t[3]);
              acc = first ? v : std::max(acc, v);
              first = false;
            } else {
              acc += t[0] + t[1] + t[2] + t[3];
            }
          }
        out.push_back(max_mode ? acc : acc / count);
      }
  return out;
}

TEST(OnnxOps, RoiAlignBothModesBothCoordinateTransformsAndAdaptiveSampling) {
  // Hand-checked: X [[1, 2], [3, 4]], region (0, 0, 1, 1), output_half_pixel, one 1x1 bin sampled once
  // at (0.5, 0.5): avg is the bilinear value 2.5; max is the largest corner term 0.25 * 4 = 1.
  for (const char* mode : {"avg", "max"}) {
    Builder b(16);
    b.input("x", F32, {1, 1, 2, 2}).output("y");
    b.const_f32("rois", {1, 4}, {0, 0, 1, 1});
    b.const_i64("bi", {0});
    auto* n = b.node("RoiAlign", {"x", "rois", "bi"}, {"y"});
    Builder::attr_s(n, "mode", mode);
    Builder::attr_s(n, "coordinate_transformation_mode", "output_half_pixel");
    Builder::attr_i(n, "sampling_ratio", 1);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor({1, 2, 3, 4}, {1, 1, 2, 2})});
    expect_near(out[0], {std::string(mode) == "avg" ? 2.5f : 1.0f}, {1, 1, 1, 1}, 1e-6);
  }
  // Two images, three regions (one partly outside, one in image 0 twice the size), every mode,
  // both transforms, a fixed and the adaptive grid: against the reference.
  const int N = 2, C = 3, H = 6, W = 7, PH = 3, PW = 2;
  std::vector<float> X = seq(N * C * H * W, 51);
  std::vector<float> rois = {0.5f, 1.0f, 5.0f, 4.5f, -2.0f, 3.0f, 4.0f, 9.0f, 1.0f, 0.0f, 2.5f, 1.0f};
  std::vector<int64_t> bidx = {1, 0, 0};
  for (int sr : {0, 2})
    for (bool half : {false, true})
      for (bool max_mode : {false, true}) {
        std::vector<float> ref;
        for (int r = 0; r < 3; ++r) {
          std::vector<float> img(X.begin() + bidx[r] * C * H * W, X.begin() + (bidx[r] + 1) * C * H * W);
          auto part = roi_align_ref(img, C, H, W, &rois[static_cast<size_t>(4 * r)], PH, PW, sr, 0.5f * 2, half, max_mode);
          ref.insert(ref.end(), part.begin(), part.end());
        }
        Builder b(16);
        b.input("x", F32, {N, C, H, W}).output("y");
        b.const_f32("rois", {3, 4}, rois);
        b.const_i64("bi", bidx);
        auto* n = b.node("RoiAlign", {"x", "rois", "bi"}, {"y"});
        Builder::attr_s(n, "mode", max_mode ? "max" : "avg");
        Builder::attr_s(n, "coordinate_transformation_mode", half ? "half_pixel" : "output_half_pixel");
        Builder::attr_i(n, "sampling_ratio", sr);
        Builder::attr_i(n, "output_height", PH);
        Builder::attr_i(n, "output_width", PW);
        Builder::attr_f(n, "spatial_scale", 1.0f);
        SCOPED_TRACE(::testing::Message() << "sr " << sr << " half " << half << " max " << max_mode);
        if ((sr == 2 && half && !max_mode) || (sr == 0 && !half && max_mode)) {
          expect_everywhere(b.load(), "roialign", ftensor(X, {N, C, H, W}), ref, {3, C, PH, PW}, 1e-5);
        } else {
          std::vector<Tensor> out;
          RUN(b.load(), {ftensor(X, {N, C, H, W})});
          expect_near(out[0], ref, {3, C, PH, PW}, 1e-5);
        }
      }
}

TEST(OnnxOps, Col2ImSumsOverlappingBlocks) {
  // Hand-checked: a 3x3 image from 2x2 blocks at stride 1 (4 blocks), every column entry 1: each pixel
  // counts the blocks covering it.
  {
    Builder b(18);
    b.input("x", F32, {1, 4, 4}).output("y");
    b.const_i64("img", {3, 3});
    b.const_i64("blk", {2, 2});
    b.node("Col2Im", {"x", "img", "blk"}, {"y"});
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(std::vector<float>(16, 1.0f), {1, 4, 4})});
    expect_near(out[0], {1, 2, 1, 2, 4, 2, 1, 2, 1}, {1, 1, 3, 3}, 0);
  }
  // Two channels, image 5x6, block 2x3, strides (2, 1), dilations (1, 2), pads (1, 0 | 0, 1): the blocks
  // stop short of the padded image's last row, which stays zero; against a direct scatter.
  const int C = 2, IH = 5, IW = 6, KH = 2, KW = 3, SH = 2, SW = 1, DH = 1, DW = 2, PT = 1, PL = 0, PB = 0, PR = 1;
  const int BH = (IH + PT + PB - DH * (KH - 1) - 1) / SH + 1, BW = (IW + PL + PR - DW * (KW - 1) - 1) / SW + 1;
  const int K = KH * KW, L = BH * BW;
  std::vector<float> cols = seq(C * K * L, 61), ref(C * IH * IW, 0.0f);
  for (int c = 0; c < C; ++c)
    for (int a = 0; a < KH; ++a)
      for (int bb = 0; bb < KW; ++bb)
        for (int i = 0; i < BH; ++i)
          for (int j = 0; j < BW; ++j) {
            int h = i * SH - PT + a * DH, w = j * SW - PL + bb * DW;
            if (h < 0 || h >= IH || w < 0 || w >= IW) continue;
            ref[static_cast<size_t>((c * IH + h) * IW + w)] += cols[static_cast<size_t>((c * K + a * KW + bb) * L + i * BW + j)];
          }
  Builder b(18);
  b.input("x", F32, {1, C * K, L}).output("y");
  b.const_i64("img", {IH, IW});
  b.const_i64("blk", {KH, KW});
  auto* n = b.node("Col2Im", {"x", "img", "blk"}, {"y"});
  Builder::attr_ints(n, "strides", {SH, SW});
  Builder::attr_ints(n, "dilations", {DH, DW});
  Builder::attr_ints(n, "pads", {PT, PL, PB, PR});
  expect_everywhere(b.load(), "col2im", ftensor(cols, {1, C * K, L}), ref, {1, C, IH, IW}, 1e-5);
}

TEST(OnnxOps, CenterCropPadCropsAndPadsAroundTheCentre) {
  // x [2, 5, 4] (values 0..39): axes (1, 2) to (3, 7): rows 1..3 kept; columns padded 1 before, 2 after.
  std::vector<float> x(40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  std::vector<float> ref;
  for (int a = 0; a < 2; ++a)
    for (int r = 1; r <= 3; ++r)
      for (int c = -1; c < 6; ++c) ref.push_back(c >= 0 && c < 4 ? x[static_cast<size_t>((a * 5 + r) * 4 + c)] : 0.0f);
  Builder b(18);
  b.input("x", F32, {2, 5, 4}).output("y");
  b.const_i64("shape", {3, 7});
  auto* n = b.node("CenterCropPad", {"x", "shape"}, {"y"});
  Builder::attr_ints(n, "axes", {1, -1});
  expect_everywhere(b.load(), "centercroppad", ftensor(x, {2, 5, 4}), ref, {2, 3, 7}, 0);
  // Every axis: [1, 4, 4] from [2, 5, 4] keeps batch 0 (start (2 - 1) / 2 = 0) and rows 0..3.
  Builder b2(18);
  b2.input("x", F32, {2, 5, 4}).output("y");
  b2.const_i64("shape", {1, 4, 4});
  b2.node("CenterCropPad", {"x", "shape"}, {"y"});
  std::vector<Tensor> out;
  RUN(b2.load(), {ftensor(x, {2, 5, 4})});
  expect_near(out[0], std::vector<float>(x.begin(), x.begin() + 16), {1, 4, 4}, 0);
}

TEST(OnnxOps, AffineGridTwoAndThreeDimsWithAndWithoutAlignCorners) {
  // Hand-checked: the identity on a 2x3 image: x = -2/3, 0, 2/3 and y = -1/2, 1/2 at the pixel
  // centres; x = -1, 0, 1 and y = -1, 1 with align_corners.
  for (int align : {0, 1}) {
    Builder b(20);
    b.input("x", F32, {1, 2, 3}).output("y");
    b.const_i64("size", {1, 1, 2, 3});
    auto* n = b.node("AffineGrid", {"x", "size"}, {"y"});
    Builder::attr_i(n, "align_corners", align);
    std::vector<float> xs = align ? std::vector<float>{-1, 0, 1} : std::vector<float>{-2.0f / 3, 0, 2.0f / 3};
    std::vector<float> ys = align ? std::vector<float>{-1, 1} : std::vector<float>{-0.5f, 0.5f};
    std::vector<float> ref;
    for (float y : ys)
      for (float xv : xs) {
        ref.push_back(xv);
        ref.push_back(y);
      }
    expect_everywhere(b.load(), "affinegrid2d", ftensor({1, 0, 0, 0, 1, 0}, {1, 2, 3}), ref, {1, 2, 3, 2}, 1e-6);
  }
  // 3-D, two batches of random theta [2, 3, 4] on a 2x3x4 volume, against theta times (x, y, z, 1).
  const int D = 2, H = 3, W = 4;
  std::vector<float> theta = seq(2 * 12, 71);
  for (int align : {0, 1}) {
    auto coord = [&](int i, int S) {
      return align ? (S > 1 ? -1.0 + 2.0 * i / (S - 1) : -1.0) : (2.0 * i + 1.0) / S - 1.0;
    };
    std::vector<float> ref;
    for (int nb = 0; nb < 2; ++nb)
      for (int d = 0; d < D; ++d)
        for (int h = 0; h < H; ++h)
          for (int w = 0; w < W; ++w) {
            double p[4] = {coord(w, W), coord(h, H), coord(d, D), 1.0};
            for (int r = 0; r < 3; ++r) {
              double acc = 0;
              for (int c = 0; c < 4; ++c) acc += theta[static_cast<size_t>(nb * 12 + r * 4 + c)] * p[c];
              ref.push_back(static_cast<float>(acc));
            }
          }
    Builder b(20);
    b.input("x", F32, {2, 3, 4}).output("y");
    b.const_i64("size", {2, 5, D, H, W});
    auto* n = b.node("AffineGrid", {"x", "size"}, {"y"});
    Builder::attr_i(n, "align_corners", align);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(theta, {2, 3, 4})});
    expect_near(out[0], ref, {2, D, H, W, 3}, 1e-5);
  }
}

/// Zero-padded bilinear read of one channel plane [H, W] at (y, x).
double bilinear_zero(const float* plane, int H, int W, double y, double x) {
  double y0 = std::floor(y), x0 = std::floor(x), acc = 0;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx) {
      int yy = int(y0) + dy, xx = int(x0) + dx;
      if (yy < 0 || yy >= H || xx < 0 || xx >= W) continue;
      double wy = dy ? y - y0 : 1 - (y - y0), wx = dx ? x - x0 : 1 - (x - x0);
      acc += wy * wx * plane[yy * W + xx];
    }
  return acc;
}

TEST(OnnxOps, DeformConvOffsetsMaskGroupsAndOffsetGroups) {
  // Hand-checked: X [[1, 2], [3, 4]], a 1x1 kernel of weight 1; offsets (0.5, 0.5) at output (0, 0)
  // read the centre 2.5; (0, 0.5) at (0, 1) reads half of 2 (the other corner is outside) = 1; zero
  // offsets read 3 and 4; the mask halves the last one.
  {
    Builder b(19);
    b.input("x", F32, {1, 1, 2, 2}).output("y");
    b.init("w", {1, 1, 1, 1}, {1});
    b.const_f32("off", {1, 2, 2, 2}, {0.5f, 0, 0, 0, 0.5f, 0.5f, 0, 0});
    b.const_f32("mask", {1, 1, 2, 2}, {1, 1, 1, 0.5f});
    auto* n = b.node("DeformConv", {"x", "w", "off", "", "mask"}, {"y"});
    Builder::attr_ints(n, "kernel_shape", {1, 1});
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor({1, 2, 3, 4}, {1, 1, 2, 2})});
    expect_near(out[0], {2.5f, 1.0f, 3.0f, 2.0f}, {1, 1, 2, 2}, 1e-6);
  }
  // N 2, C 4, 5x6, weight [4, 2, 2, 3] in 2 groups, 2 offset groups, strides (1, 2), pads (1, 1 | 0, 1),
  // dilations (2, 1), random offsets (some far outside), a mask and a bias: against a direct loop.
  const int N = 2, C = 4, H = 5, W = 6, O = 4, G = 2, OG = 2, KH = 2, KW = 3, SH = 1, SW = 2, PT = 1, PL = 1, PB = 0,
            PR = 1, DH = 2, DW = 1;
  const int OH = (H + PT + PB - DH * (KH - 1) - 1) / SH + 1, OW = (W + PL + PR - DW * (KW - 1) - 1) / SW + 1;
  const int K = KH * KW;
  std::vector<float> X = seq(N * C * H * W, 81), w = seq(O * (C / G) * K, 82), bias = seq(O, 83);
  std::vector<float> off = seq(N * OG * K * 2 * OH * OW, 84), mask = seq(N * OG * K * OH * OW, 85);
  for (auto& v : off) v *= 2.5f;
  off[3] = 40.0f;  // far outside: reads zero
  std::vector<float> ref;
  for (int nb = 0; nb < N; ++nb)
    for (int o = 0; o < O; ++o)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double acc = bias[static_cast<size_t>(o)];
          int g = o / (O / G);
          for (int cl = 0; cl < C / G; ++cl) {
            int c = g * (C / G) + cl, og = c / (C / OG);
            for (int a = 0; a < KH; ++a)
              for (int bb = 0; bb < KW; ++bb) {
                int k = a * KW + bb;
                size_t pos = static_cast<size_t>(oh * OW + ow);
                size_t ob = static_cast<size_t>(((nb * OG + og) * K + k) * 2) * OH * OW;
                double y = oh * SH - PT + a * DH + off[ob + pos], x = ow * SW - PL + bb * DW + off[ob + OH * OW + pos];
                double m = mask[static_cast<size_t>((nb * OG + og) * K + k) * OH * OW + pos];
                acc += w[static_cast<size_t>((o * (C / G) + cl) * K + k)] * m *
                       bilinear_zero(&X[static_cast<size_t>((nb * C + c) * H * W)], H, W, y, x);
              }
          }
          ref.push_back(static_cast<float>(acc));
        }
  Builder b(19);
  b.input("x", F32, {N, C, H, W}).output("y");
  b.init("w", {O, C / G, KH, KW}, w);
  b.init("b", {O}, bias);
  b.init("off", {N, OG * K * 2, OH, OW}, off);
  b.init("mask", {N, OG * K, OH, OW}, mask);
  auto* n = b.node("DeformConv", {"x", "w", "off", "b", "mask"}, {"y"});
  Builder::attr_ints(n, "strides", {SH, SW});
  Builder::attr_ints(n, "pads", {PT, PL, PB, PR});
  Builder::attr_ints(n, "dilations", {DH, DW});
  Builder::attr_i(n, "group", G);
  Builder::attr_i(n, "offset_group", OG);
  expect_everywhere(b.load(), "deformconv", ftensor(X, {N, C, H, W}), ref, {N, O, OH, OW}, 1e-5);
}

TEST(OnnxOps, GridSampleVolumetricLinearAndNearestWithZerosAndBorder) {
  // X [1, 2, 2, 3, 4], grid [1, 2, 2, 3, 3] with points inside and outside [-1, 1]: against trilinear
  // (8 taps, zeros outside) and nearest (half to even) references; border clamps the coordinate.
  const int C = 2, D = 2, H = 3, W = 4, OD = 2, OH = 2, OW = 3;
  std::vector<float> X = seq(C * D * H * W, 91), grid = seq(OD * OH * OW * 3, 92);
  for (auto& v : grid) v *= 1.3f;
  grid[0] = grid[1] = grid[2] = 0.0f;  // the centre
  for (const char* mode : {"linear", "nearest"})
    for (const char* padding : {"zeros", "border"})
      for (int align : {0, 1}) {
        auto unnorm = [&](double c, int S) { return align ? (c + 1) * (S - 1) / 2.0 : ((c + 1) * S - 1) / 2.0; };
        bool border = std::string(padding) == "border";
        auto at = [&](int c, int z, int y, int x) -> double {
          if (z < 0 || z >= D || y < 0 || y >= H || x < 0 || x >= W) return 0.0;
          return X[static_cast<size_t>(((c * D + z) * H + y) * W + x)];
        };
        std::vector<float> ref;
        for (int c = 0; c < C; ++c)
          for (int p = 0; p < OD * OH * OW; ++p) {
            double x = unnorm(grid[static_cast<size_t>(3 * p)], W), y = unnorm(grid[static_cast<size_t>(3 * p + 1)], H),
                   z = unnorm(grid[static_cast<size_t>(3 * p + 2)], D);
            if (border) {
              x = std::clamp(x, 0.0, double(W - 1));
              y = std::clamp(y, 0.0, double(H - 1));
              z = std::clamp(z, 0.0, double(D - 1));
            }
            double v = 0;
            if (std::string(mode) == "nearest") {
              v = at(c, int(std::nearbyint(z)), int(std::nearbyint(y)), int(std::nearbyint(x)));
            } else {
              double x0 = std::floor(x), y0 = std::floor(y), z0 = std::floor(z);
              for (int k = 0; k < 8; ++k) {
                int bx = k & 1, by = (k >> 1) & 1, bz = (k >> 2) & 1;
                double w = (bx ? x - x0 : 1 - (x - x0)) * (by ? y - y0 : 1 - (y - y0)) * (bz ? z - z0 : 1 - (z - z0));
                v += w * at(c, int(z0) + bz, int(y0) + by, int(x0) + bx);
              }
            }
            ref.push_back(static_cast<float>(v));
          }
        Builder b(20);
        b.input("x", F32, {1, C, D, H, W}).output("y");
        b.init("g", {1, OD, OH, OW, 3}, grid);
        auto* n = b.node("GridSample", {"x", "g"}, {"y"});
        Builder::attr_s(n, "mode", mode);
        Builder::attr_s(n, "padding_mode", padding);
        Builder::attr_i(n, "align_corners", align);
        SCOPED_TRACE(::testing::Message() << mode << " " << padding << " align " << align);
        if (align == 1 && !border) {
          expect_everywhere(b.load(), "gridsample3d", ftensor(X, {1, C, D, H, W}), ref, {1, C, OD, OH, OW}, 1e-5);
        } else {
          std::vector<Tensor> out;
          RUN(b.load(), {ftensor(X, {1, C, D, H, W})});
          expect_near(out[0], ref, {1, C, OD, OH, OW}, 1e-5);
        }
      }
}

TEST(OnnxOps, PoolsWithDilationsCeilModeAndAsymmetricPads) {
  // x [1, 2, 6, 7], kernel 2x3, dilations (2, 1), strides (2, 2), pads (1, 0 | 1, 1), ceil_mode: the
  // last windows hang over the padded input (never counted). AveragePool with and without
  // count_include_pad, and MaxPool, against direct loops.
  const int C = 2, H = 6, W = 7, KH = 2, KW = 3, DH = 2, DW = 1, SH = 2, SW = 2, PT = 1, PL = 0, PB = 1, PR = 1;
  auto out_size = [](int d, int pb, int pe, int k, int dl, int s) {
    int span = d + pb + pe - dl * (k - 1) - 1;
    int o = (span + s - 1) / s + 1;
    if ((o - 1) * s >= d + pb) --o;
    return o;
  };
  const int OH = out_size(H, PT, PB, KH, DH, SH), OW = out_size(W, PL, PR, KW, DW, SW);
  std::vector<float> x = seq(C * H * W, 95);
  for (const char* op : {"AveragePool", "MaxPool"})
    for (int count_pad : {0, 1}) {
      if (std::string(op) == "MaxPool" && count_pad) continue;
      std::vector<float> ref;
      for (int c = 0; c < C; ++c)
        for (int oh = 0; oh < OH; ++oh)
          for (int ow = 0; ow < OW; ++ow) {
            double acc = 0, n = 0, best = -INFINITY;
            for (int i = 0; i < KH; ++i)
              for (int j = 0; j < KW; ++j) {
                int h = oh * SH - PT + i * DH, w = ow * SW - PL + j * DW;
                bool in_pads = h >= -PT && h < H + PB && w >= -PL && w < W + PR;
                bool inside = h >= 0 && h < H && w >= 0 && w < W;
                if (inside) {
                  double v = x[static_cast<size_t>((c * H + h) * W + w)];
                  acc += v;
                  best = std::max(best, v);
                }
                if (inside || (count_pad && in_pads)) n += 1;
              }
            ref.push_back(static_cast<float>(std::string(op) == "MaxPool" ? best : acc / n));
          }
      Builder b(19);
      b.input("x", F32, {1, C, H, W}).output("y");
      auto* n = b.node(op, {"x"}, {"y"});
      Builder::attr_ints(n, "kernel_shape", {KH, KW});
      Builder::attr_ints(n, "dilations", {DH, DW});
      Builder::attr_ints(n, "strides", {SH, SW});
      Builder::attr_ints(n, "pads", {PT, PL, PB, PR});
      Builder::attr_i(n, "ceil_mode", 1);
      if (std::string(op) == "AveragePool") Builder::attr_i(n, "count_include_pad", count_pad);
      SCOPED_TRACE(::testing::Message() << op << " count_include_pad " << count_pad);
      if (count_pad == 0 && std::string(op) == "AveragePool") {
        expect_everywhere(b.load(), "avgpool_dilated", ftensor(x, {1, C, H, W}), ref, {1, C, OH, OW}, 1e-5);
      } else {
        std::vector<Tensor> out;
        RUN(b.load(), {ftensor(x, {1, C, H, W})});
        expect_near(out[0], ref, {1, C, OH, OW}, 1e-5);
      }
    }
  // 3-D MaxPool with ceil_mode (was refused): [1, 1, 3, 3, 3] values 0..26, kernel 2, stride 2: windows
  // start at 0 and 2 in each dim; the maxima are the windows' last corners.
  std::vector<float> v(27);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i);
  Builder b(12);
  b.input("x", F32, {1, 1, 3, 3, 3}).output("y");
  auto* n = b.node("MaxPool", {"x"}, {"y"});
  Builder::attr_ints(n, "kernel_shape", {2, 2, 2});
  Builder::attr_ints(n, "strides", {2, 2, 2});
  Builder::attr_i(n, "ceil_mode", 1);
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(v, {1, 1, 3, 3, 3})});
  expect_near(out[0], {13, 14, 16, 17, 22, 23, 25, 26}, {1, 1, 2, 2, 2}, 0);
}

TEST(OnnxOps, MaxPoolIndicesFollowADynamicBatch) {
  // The Indices count over the whole [N, C, H, W]: with N dynamic (the batch marked "N"), batches 1, 3
  // and 2 compile twice (static, then N symbolic) and each index is n * C * H * W + its plane's.
  const int C = 2, H = 4, W = 5;
  Builder b(12);
  b.input("x", F32, {-1, C, H, W}, {"N"}).output("y").output("i");
  auto* n = b.node("MaxPool", {"x"}, {"y", "i"});
  Builder::attr_ints(n, "kernel_shape", {2, 3});
  Builder::attr_ints(n, "strides", {2, 2});
  Builder::attr_ints(n, "pads", {0, 1, 0, 1});
  auto m = b.load();
  const int OH = 2, OW = 3;
  for (const char* backend : {"interp", "cpu"}) {
    reset();
    CompileOptions o;
    o.name = std::string("maxpool_indices_dynamic_") + backend;
    o.arg_names = {"x"};
    o.backend = backend;
    auto f = compile([m](const Tensor& a) { return m->forward({a}); }, o);
    for (int N : {1, 3, 2}) {
      std::vector<float> x = seq(static_cast<size_t>(N * C * H * W), static_cast<uint64_t>(100 + N));
      std::vector<float> yref;
      std::vector<int64_t> iref;
      max_pool_ref(x, N * C, H, W, 2, 3, 2, 2, 0, 1, OH, OW, false, yref, iref);  // N folded into the planes
      std::vector<Tensor> out = f(ftensor(x, {N, C, H, W}));
      SCOPED_TRACE(::testing::Message() << backend << " N " << N);
      expect_near(out[0], yref, {N, C, OH, OW}, 0);
      EXPECT_EQ(out[1].contiguous().to_vector<int64_t>(), iref);
    }
    EXPECT_EQ(stats().compiles, 2) << backend;
    EXPECT_EQ(stats().graph_breaks, 0) << backend;
  }
}

TEST(OnnxOps, DeformConvOneDimensional) {
  // Hand-checked, 1-D: x = (1, 2, 3, 4), kernel 2 of weights (1, 10), stride 1: output 3 positions.
  // Offsets (one per tap and position): tap 0 at position 0 moves +0.5 (reads 1.5), tap 1 at position 2
  // moves +1 (reads index 4: outside, 0); the others stay: y = 1.5 + 10*2, 2 + 10*3, 3 + 0 = 21.5, 32, 3.
  Builder b(19);
  b.input("x", F32, {1, 1, 4}).output("y");
  b.init("w", {1, 1, 2}, {1, 10});
  b.const_f32("off", {1, 2, 3}, {0.5f, 0, 0, 0, 0, 1.0f});
  b.node("DeformConv", {"x", "w", "off"}, {"y"});
  expect_everywhere(b.load(), "deformconv1d", ftensor({1, 2, 3, 4}, {1, 1, 4}), {21.5f, 32.0f, 3.0f}, {1, 1, 3}, 1e-6);
}

TEST(OnnxOps, ThreeDimensionalConvAndPoolsWithSameAutoPad) {
  // x [1, 2, 5, 4, 5]: Conv (kernel 3x2x3, strides 2, dilations (1, 2, 1), SAME_UPPER), MaxPool and
  // AveragePool (kernel 2x3x2, strides (2, 1, 2), SAME_LOWER, pads not counted): output = ceil(in /
  // stride) with the odd padding unit at the end (UPPER) or the start (LOWER); against direct loops.
  const int C = 2, D = 5, H = 4, W = 5;
  const int in[3] = {D, H, W};
  std::vector<float> x = seq(C * D * H * W, 97);
  auto at = [&](int c, int d, int h, int w, bool& ok) -> double {
    ok = d >= 0 && d < D && h >= 0 && h < H && w >= 0 && w < W;
    return ok ? x[static_cast<size_t>(((c * D + d) * H + h) * W + w)] : 0.0;
  };
  auto same = [&](const int* k, const int* s, const int* dl, bool upper, int* osz, int* lo) {
    for (int i = 0; i < 3; ++i) {
      osz[i] = (in[i] + s[i] - 1) / s[i];
      int total = std::max(0, (osz[i] - 1) * s[i] + (k[i] - 1) * dl[i] + 1 - in[i]);
      lo[i] = upper ? total / 2 : total - total / 2;
    }
  };
  {  // Conv
    const int O = 3, k[3] = {3, 2, 3}, s[3] = {2, 2, 2}, dl[3] = {1, 2, 1};
    int osz[3], lo[3];
    same(k, s, dl, true, osz, lo);
    std::vector<float> w = seq(O * C * 18, 98), ref;
    for (int o = 0; o < O; ++o)
      for (int od = 0; od < osz[0]; ++od)
        for (int oh = 0; oh < osz[1]; ++oh)
          for (int ow = 0; ow < osz[2]; ++ow) {
            double acc = 0;
            bool ok;
            for (int c = 0; c < C; ++c)
              for (int a = 0; a < k[0]; ++a)
                for (int bb = 0; bb < k[1]; ++bb)
                  for (int e = 0; e < k[2]; ++e) {
                    double v = at(c, od * s[0] - lo[0] + a * dl[0], oh * s[1] - lo[1] + bb * dl[1], ow * s[2] - lo[2] + e * dl[2], ok);
                    acc += v * w[static_cast<size_t>((((o * C + c) * k[0] + a) * k[1] + bb) * k[2] + e)];
                  }
            ref.push_back(static_cast<float>(acc));
          }
    Builder b(11);
    b.input("x", F32, {1, C, D, H, W}).output("y");
    b.init("w", {O, C, k[0], k[1], k[2]}, w);
    auto* n = b.node("Conv", {"x", "w"}, {"y"});
    Builder::attr_ints(n, "strides", {s[0], s[1], s[2]});
    Builder::attr_ints(n, "dilations", {dl[0], dl[1], dl[2]});
    Builder::attr_s(n, "auto_pad", "SAME_UPPER");
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(x, {1, C, D, H, W})});
    expect_near(out[0], ref, {1, O, osz[0], osz[1], osz[2]}, 1e-5);
  }
  for (const char* op : {"MaxPool", "AveragePool"}) {
    const int k[3] = {2, 3, 2}, s[3] = {2, 1, 2}, dl[3] = {1, 1, 1};
    int osz[3], lo[3];
    same(k, s, dl, false, osz, lo);
    bool is_max = std::string(op) == "MaxPool";
    std::vector<float> ref;
    for (int c = 0; c < C; ++c)
      for (int od = 0; od < osz[0]; ++od)
        for (int oh = 0; oh < osz[1]; ++oh)
          for (int ow = 0; ow < osz[2]; ++ow) {
            double acc = 0, best = -INFINITY, count = 0;
            bool ok;
            for (int a = 0; a < k[0]; ++a)
              for (int bb = 0; bb < k[1]; ++bb)
                for (int e = 0; e < k[2]; ++e) {
                  double v = at(c, od * s[0] - lo[0] + a, oh * s[1] - lo[1] + bb, ow * s[2] - lo[2] + e, ok);
                  if (!ok) continue;
                  acc += v;
                  count += 1;
                  best = std::max(best, v);
                }
            ref.push_back(static_cast<float>(is_max ? best : acc / count));
          }
    Builder b(11);
    b.input("x", F32, {1, C, D, H, W}).output("y");
    auto* n = b.node(op, {"x"}, {"y"});
    Builder::attr_ints(n, "kernel_shape", {k[0], k[1], k[2]});
    Builder::attr_ints(n, "strides", {s[0], s[1], s[2]});
    Builder::attr_s(n, "auto_pad", "SAME_LOWER");
    SCOPED_TRACE(op);
    std::vector<Tensor> out;
    RUN(b.load(), {ftensor(x, {1, C, D, H, W})});
    expect_near(out[0], ref, {1, C, osz[0], osz[1], osz[2]}, 1e-5);
  }
}

TEST(OnnxOps, UnsupportedConvPoolFamilyAttributesNameTheNodeAndAttribute) {
  auto message = [](const std::shared_ptr<onnx::Model>& m, const std::vector<Tensor>& in) {
    try {
      m->forward(in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    Builder b(20);
    b.input("x", F32, {1, 1, 2, 2, 2}).output("y");
    b.init("g", {1, 1, 1, 1, 3}, {0, 0, 0});
    auto* n = b.node("GridSample", {"x", "g"}, {"y"}, "sample_volume");
    Builder::attr_s(n, "mode", "cubic");
    std::string w = message(b.load(), {ftensor(std::vector<float>(8, 1.0f), {1, 1, 2, 2, 2})});
    EXPECT_NE(w.find("sample_volume"), std::string::npos) << w;
    EXPECT_NE(w.find("mode 'cubic'"), std::string::npos) << w;
  }
  {
    Builder b(16);
    b.input("x", F32, {1, 1, 2, 2}).output("y");
    b.const_f32("rois", {1, 4}, {0, 0, 1, 1});
    b.const_i64("bi", {0});
    auto* n = b.node("RoiAlign", {"x", "rois", "bi"}, {"y"}, "align_regions");
    Builder::attr_s(n, "coordinate_transformation_mode", "asymmetric");
    std::string w = message(b.load(), {ftensor({1, 2, 3, 4}, {1, 1, 2, 2})});
    EXPECT_NE(w.find("align_regions"), std::string::npos) << w;
    EXPECT_NE(w.find("coordinate_transformation_mode 'asymmetric'"), std::string::npos) << w;
  }
}

TEST(OnnxOps, PadAxesInputAndWrapMode) {
  // x [2, 5]; wrap on the last axis only (axes input), begin 3 and end 7 (longer than the dim: it wraps
  // twice): out[i][j] = x[i][(j - 3) mod 5].
  std::vector<float> v = seq(10, 91);
  {
    Builder b(19);
    b.input("x", F32, {2, 5}).output("y");
    b.const_i64("pads", {3, 7});
    b.const_i64("axes", {-1});
    auto* n = b.node("Pad", {"x", "pads", "", "axes"}, {"y"});
    Builder::attr_s(n, "mode", "wrap");
    std::vector<float> ref;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 15; ++j) ref.push_back(v[static_cast<size_t>(i * 5 + ((j - 3) % 5 + 5) % 5)]);
    expect_everywhere(b.load(), "pad_wrap", ftensor(v, {2, 5}), ref, {2, 15}, 0);
  }
  // Negative pads crop before the wrap (ONNX Runtime's order): rows i mod 2 for i in [0, 3); columns:
  // the first dropped, the 4 left wrapped by 2, so x[1..4] then x[1], x[2] (checked against ORT 1.30).
  {
    Builder b(19);
    b.input("x", F32, {2, 5}).output("y");
    b.const_i64("pads", {0, -1, 1, 2});
    auto* n = b.node("Pad", {"x", "pads"}, {"y"});
    Builder::attr_s(n, "mode", "wrap");
    std::vector<float> ref;
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 6; ++j) ref.push_back(v[static_cast<size_t>((i % 2) * 5 + 1 + j % 4)]);
    expect_everywhere(b.load(), "pad_wrap_crop", ftensor(v, {2, 5}), ref, {3, 6}, 0);
  }
  // Constant mode through axes (opset 18): one row of 9 before, nothing else.
  {
    Builder b(18);
    b.input("x", F32, {2, 5}).output("y");
    b.const_i64("pads", {1, 0});
    b.const_f32("val", {}, {9.0f});
    b.const_i64("axes", {0});
    b.node("Pad", {"x", "pads", "val", "axes"}, {"y"});
    std::vector<float> ref(5, 9.0f);
    ref.insert(ref.end(), v.begin(), v.end());
    expect_everywhere(b.load(), "pad_axes_const", ftensor(v, {2, 5}), ref, {3, 5}, 0);
  }
  // An axis named twice and a pads/axes count mismatch are errors naming the problem.
  for (auto [pads, axes, what] : {std::tuple{std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{1, -1}, "twice"},
                                  std::tuple{std::vector<int64_t>{1, 1, 1}, std::vector<int64_t>{1}, "need 2 per axis"}}) {
    Builder b(19);
    b.input("x", F32, {2, 5}).output("y");
    b.const_i64("pads", pads);
    b.const_i64("axes", axes);
    b.node("Pad", {"x", "pads", "", "axes"}, {"y"});
    std::vector<Tensor> out;
    try {
      RUN(b.load(), {ftensor(v, {2, 5})});
      ADD_FAILURE() << "accepted " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(OnnxOps, MaxRoiPoolBinsAsOnnxRuntime) {
  // X [2, 2, 6, 7], three regions, pooled 2x3, spatial_scale 0.5: against a direct loop with ONNX
  // Runtime's rounding, bin edges, clipping and empty bins (the third region lies outside the image).
  const int N = 2, C = 2, H = 6, W = 7, PH = 2, PW = 3;
  const float scale = 0.5f;
  std::vector<float> x = seq(N * C * H * W, 92);
  std::vector<float> rois = {1, 1, 2, 9, 11, 0, 0, 0, 3, 3, 0, 20, 20, 30, 30};
  const int R = 3;
  std::vector<float> ref;
  for (int r = 0; r < R; ++r) {
    const float* q = &rois[static_cast<size_t>(r * 5)];
    int b = static_cast<int>(q[0]);
    int x1 = static_cast<int>(std::round(q[1] * scale)), y1 = static_cast<int>(std::round(q[2] * scale));
    int x2 = static_cast<int>(std::round(q[3] * scale)), y2 = static_cast<int>(std::round(q[4] * scale));
    double bh = std::max(y2 - y1 + 1, 1) / double(PH), bw = std::max(x2 - x1 + 1, 1) / double(PW);
    for (int c = 0; c < C; ++c)
      for (int ph = 0; ph < PH; ++ph)
        for (int pw = 0; pw < PW; ++pw) {
          int hs = std::min(std::max(int(std::floor(ph * bh)) + y1, 0), H), he = std::min(std::max(int(std::ceil((ph + 1) * bh)) + y1, 0), H);
          int ws = std::min(std::max(int(std::floor(pw * bw)) + x1, 0), W), we = std::min(std::max(int(std::ceil((pw + 1) * bw)) + x1, 0), W);
          float m = -INFINITY;
          for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w) m = std::max(m, x[static_cast<size_t>(((b * C + c) * H + h) * W + w)]);
          ref.push_back(he <= hs || we <= ws ? 0.0f : m);
        }
  }
  ASSERT_EQ(ref[static_cast<size_t>(2 * C * PH * PW)], 0.0f);  // the outside region's bins are empty
  Builder b(1);
  b.input("x", F32, {N, C, H, W}).output("y");
  b.init("rois", {R, 5}, rois);
  auto* n = b.node("MaxRoiPool", {"x", "rois"}, {"y"});
  Builder::attr_ints(n, "pooled_shape", {PH, PW});
  Builder::attr_f(n, "spatial_scale", scale);
  expect_everywhere(b.load(), "maxroipool", ftensor(x, {N, C, H, W}), ref, {R, C, PH, PW}, 0);
}

TEST(OnnxOps, MultinomialSamplesItsDistribution) {
  // Rows with log-probabilities log(0.1, 0.2, 0.7) and log(0.5, 0.5, 0): 4000 draws each; the class
  // frequencies are within 0.03 of the probabilities, never a zero-probability class, int64 output.
  const int S = 4000;
  Builder b(7);
  b.input("x", F32, {2, 3}).output("y");
  auto* n = b.node("Multinomial", {"x"}, {"y"});
  Builder::attr_i(n, "sample_size", S);
  Builder::attr_i(n, "dtype", I64);
  Builder::attr_f(n, "seed", 5.0f);
  std::vector<float> lp = {std::log(0.1f), std::log(0.2f), std::log(0.7f), std::log(0.5f), std::log(0.5f), -INFINITY};
  std::vector<Tensor> out;
  RUN(b.load(), {ftensor(lp, {2, 3})});
  ASSERT_EQ(out[0].dtype(), DType::I64);
  ASSERT_EQ(out[0].int_sizes(), (IntVec{2, S}));
  std::vector<int64_t> k = out[0].contiguous().to_vector<int64_t>();
  const double p[2][3] = {{0.1, 0.2, 0.7}, {0.5, 0.5, 0.0}};
  for (int r = 0; r < 2; ++r) {
    int count[3] = {0, 0, 0};
    for (int j = 0; j < S; ++j) {
      int64_t c = k[static_cast<size_t>(r * S + j)];
      ASSERT_GE(c, 0);
      ASSERT_LT(c, 3);
      ++count[c];
    }
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(count[c] / double(S), p[r][c], 0.03) << "row " << r << " class " << c;
    if (r == 1) {
      EXPECT_EQ(count[2], 0);
    }
  }
  // Default dtype int32; the same seed draws the same samples.
  Builder b2(7);
  b2.input("x", F32, {2, 3}).output("y");
  auto* n2 = b2.node("Multinomial", {"x"}, {"y"});
  Builder::attr_i(n2, "sample_size", S);
  Builder::attr_f(n2, "seed", 5.0f);
  RUN(b2.load(), {ftensor(lp, {2, 3})});
  ASSERT_EQ(out[0].dtype(), DType::I32);
  std::vector<int32_t> k32 = out[0].contiguous().to_vector<int32_t>();
  for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(k32[i], k[i]) << i;
}

TEST(OnnxOps, OptionalHoldsAValueOrNothing) {
  // Optional(x) → has = true and get = x; the empty Optional() → has = false; OptionalGetElement of the
  // empty one is an error naming the node; on interp and cpu like eager.
  Builder b(18);
  b.input("x", F32, {2, 3}).output("y").output("has").output("none");
  b.node("Optional", {"x"}, {"ox"});
  auto* e = b.node("Optional", {}, {"oe"});
  auto* a = e->add_attribute();
  a->set_name("type");
  a->set_type(::onnx::AttributeProto::TYPE_PROTO);
  a->mutable_tp()->mutable_tensor_type()->set_elem_type(F32);
  b.node("OptionalGetElement", {"ox"}, {"g"});
  b.node("Relu", {"g"}, {"y"});
  b.node("OptionalHasElement", {"ox"}, {"has"});
  b.node("OptionalHasElement", {"oe"}, {"none"});
  std::vector<float> v = seq(6, 93), ref;
  for (float f : v) ref.push_back(std::max(f, 0.0f));
  auto m = b.load();
  std::vector<Tensor> out;
  RUN(m, {ftensor(v, {2, 3})});
  expect_near(out[0], ref, {2, 3}, 0);
  EXPECT_TRUE(out[1].item<bool>());
  EXPECT_FALSE(out[2].item<bool>());
  for (const char* backend : {"interp", "cpu"}) {
    CompileOptions o;
    o.name = std::string("optional_") + backend;
    o.backend = backend;
    auto f = compile([m](const Tensor& t) { return m->forward({t}); }, o);
    std::vector<Tensor> got = f(ftensor(v, {2, 3}));
    expect_near(got[0], ref, {2, 3}, 0);
    EXPECT_TRUE(got[1].item<bool>());
    EXPECT_FALSE(got[2].item<bool>());
  }
  Builder b2(18);
  b2.input("x", F32, {2}).output("y");
  auto* e2 = b2.node("Optional", {}, {"oe"});
  auto* a2 = e2->add_attribute();
  a2->set_name("type");
  a2->set_type(::onnx::AttributeProto::TYPE_PROTO);
  a2->mutable_tp()->mutable_tensor_type()->set_elem_type(F32);
  b2.node("OptionalGetElement", {"oe"}, {"g"}, "get_empty");
  b2.node("Add", {"x", "g"}, {"y"});
  try {
    RUN(b2.load(), {ftensor({1, 2}, {2})});
    ADD_FAILURE() << "read an empty optional";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("get_empty"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("empty optional"), std::string::npos) << err.what();
  }
}

TEST(OnnxOps, OptionalTypedModelInputsAndOutputs) {
  // An input declared optional(tensor(float)) takes an undefined Tensor as the empty optional; an output
  // declared optional comes back undefined when empty. y = OptionalHasElement(x), z = Identity(x).
  Builder b(18);
  auto declare_optional = [](::onnx::ValueInfoProto* vi, const std::string& name) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_optional_type()->mutable_elem_type()->mutable_tensor_type();
    tt->set_elem_type(F32);
    tt->mutable_shape()->add_dim()->set_dim_param("n");
  };
  declare_optional(b.graph()->add_input(), "x");
  b.output("has");
  declare_optional(b.graph()->add_output(), "z");
  b.node("OptionalHasElement", {"x"}, {"has"});
  b.node("Identity", {"x"}, {"z"});
  auto m = b.load();
  ASSERT_EQ(m->inputs().size(), 1u);
  EXPECT_TRUE(m->inputs()[0].optional);
  EXPECT_EQ(m->inputs()[0].str(), "optional(f32[n])");
  EXPECT_TRUE(m->outputs()[1].optional);
  std::vector<Tensor> out;
  RUN(m, {ftensor({1, -2, 3}, {3})});
  EXPECT_TRUE(out[0].item<bool>());
  expect_near(out[1], {1, -2, 3}, {3}, 0);
  RUN(m, {Tensor()});
  EXPECT_FALSE(out[0].item<bool>());
  EXPECT_FALSE(out[1].defined());
  // The declared element type and rank still hold for a present value.
  EXPECT_THROW(m->forward({tensor<int64_t>({1}, {1})}), ValueError);
  EXPECT_THROW(m->forward({ftensor({1, 2, 3, 4}, {2, 2})}), ValueError);
  // A tensor-typed input does not take the empty optional: the message says which input and why.
  Builder b2(18);
  b2.input("x", F32, {2}).output("y");
  b2.node("Relu", {"x"}, {"y"});
  try {
    b2.load()->forward({Tensor()});
    ADD_FAILURE() << "an undefined tensor was taken for a tensor input";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("optional"), std::string::npos) << e.what();
  }
  // Compiled, present and empty in turns (a guard on the argument's presence, never a stale graph);
  // interp and cpu.
  for (const char* backend : {"interp", "cpu"}) {
    CompileOptions o;
    o.name = std::string("optional_io_") + backend;
    o.backend = backend;
    auto f = compile([m](const Tensor& t) { return m->forward({t}); }, o);
    for (int round = 0; round < 2; ++round) {
      std::vector<Tensor> got = f(ftensor({1, 2}, {2}));
      EXPECT_TRUE(got.at(0).item<bool>()) << backend;
      expect_near(got.at(1), {1, 2}, {2}, 0);
      got = f(Tensor());
      EXPECT_FALSE(got.at(0).item<bool>()) << backend;
      EXPECT_FALSE(got.at(1).defined()) << backend;
      got = f(ftensor({4, 5, 6}, {3}));
      EXPECT_TRUE(got.at(0).item<bool>()) << backend;
      expect_near(got.at(1), {4, 5, 6}, {3}, 0);
    }
  }
}

TEST(OnnxOps, BatchNormalizationTrainingModeUpdatesRunningStatistics) {
  // x [2, 3, 4]: per channel c, mean and biased variance over N and the 4 positions (f64 reference);
  // running = old · momentum + batch · (1 − momentum), as ONNX's reference (opset 15).
  const int64_t N = 2, C = 3, L = 4;
  std::vector<float> x = seq(N * C * L, 71), sc = {1.5f, -0.5f, 2.0f}, bi = {0.1f, 0.2f, -0.3f},
                     rm = {0.5f, -1.0f, 0.0f}, rv = {1.0f, 2.0f, 0.5f};
  const double eps = 1e-3, mom = 0.8;
  Builder b(15);
  b.input("x", F32, {N, C, L}).input("s", F32, {C}).input("b", F32, {C}).input("m", F32, {C}).input("v", F32, {C});
  b.output("y").output("rm").output("rv");
  auto* n = b.node("BatchNormalization", {"x", "s", "b", "m", "v"}, {"y", "rm", "rv"});
  Builder::attr_i(n, "training_mode", 1);
  auto* e = n->add_attribute();
  e->set_name("epsilon");
  e->set_type(::onnx::AttributeProto::FLOAT);
  e->set_f(static_cast<float>(eps));
  auto* mo = n->add_attribute();
  mo->set_name("momentum");
  mo->set_type(::onnx::AttributeProto::FLOAT);
  mo->set_f(static_cast<float>(mom));
  std::vector<float> ry(x.size()), rrm(C), rrv(C);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t l = 0; l < L; ++l) s += x[static_cast<size_t>((i * C + c) * L + l)];
    double mu = s / (N * L);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t l = 0; l < L; ++l) {
        double d = x[static_cast<size_t>((i * C + c) * L + l)] - mu;
        ss += d * d;
      }
    double var = ss / (N * L);
    for (int64_t i = 0; i < N; ++i)
      for (int64_t l = 0; l < L; ++l) {
        size_t k = static_cast<size_t>((i * C + c) * L + l);
        ry[k] = static_cast<float>((x[k] - mu) / std::sqrt(var + static_cast<float>(eps)) * sc[c] + bi[c]);
      }
    rrm[c] = static_cast<float>(rm[c] * static_cast<float>(mom) + mu * (1 - static_cast<float>(mom)));
    rrv[c] = static_cast<float>(rv[c] * static_cast<float>(mom) + var * (1 - static_cast<float>(mom)));
  }
  auto m = b.load();
  std::vector<Tensor> in = {ftensor(x, {N, C, L}), ftensor(sc, {C}), ftensor(bi, {C}), ftensor(rm, {C}), ftensor(rv, {C})};
  std::vector<Tensor> out;
  RUN(m, in);
  expect_near(out[0], ry, {N, C, L}, 2e-5);
  expect_near(out[1], rrm, {C}, 1e-6);
  expect_near(out[2], rrv, {C}, 1e-6);
  for (const char* backend : {"interp", "cpu"}) {
    CompileOptions o;
    o.name = std::string("bn_train_") + backend;
    o.backend = backend;
    auto f = compile([m](const std::vector<Tensor>& xs) { return m->forward(xs); }, o);
    std::vector<Tensor> got = f(in);
    expect_near(got[0], ry, {N, C, L}, 2e-5);
    expect_near(got[1], rrm, {C}, 1e-6);
    expect_near(got[2], rrv, {C}, 1e-6);
  }
}

TEST(OnnxOps, DropoutTrainingModeKeepsAndScalesWithTheNodesSeed) {
  // ratio 0.3: every output is 0 or x / 0.7, the mask says which, about 70 % kept over 20,000 values
  // (the kept fraction's standard deviation is 0.0032; 0.02 is 6 of them); the same seed, the same mask.
  auto model = [](int64_t seed) {
    Builder b(13);
    b.input("x", F32, {20000}).input("r", F32, {}).input("t", ::onnx::TensorProto::BOOL, {}).output("y").output("mask");
    auto* n = b.node("Dropout", {"x", "r", "t"}, {"y", "mask"});
    Builder::attr_i(n, "seed", seed);
    return b.load();
  };
  std::vector<float> x = seq(20000, 5);
  for (float& v : x) v += 2.0f;  // no zeros in x, so a 0 in y means dropped
  std::vector<Tensor> in = {ftensor(x, {20000}), ftensor({0.3f}, {}), tensor<bool>(std::vector<bool>{true}, {})};
  std::vector<Tensor> a, out;
  RUN(model(7), in);
  a = out;
  std::vector<float> y = a[0].to_vector<float>();
  std::vector<bool> mask;
  for (int64_t i = 0; i < 20000; ++i) mask.push_back(a[1].contiguous().data_ptr<bool>()[i]);
  int64_t kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (mask[i]) {
      ++kept;
      EXPECT_NEAR(y[i], x[i] / 0.7f, 1e-5) << i;
    } else {
      EXPECT_EQ(y[i], 0.0f) << i;
    }
  }
  EXPECT_NEAR(static_cast<double>(kept) / 20000.0, 0.7, 0.02);
  RUN(model(7), in);
  EXPECT_TRUE(allclose(out[0], a[0], 0, 0));
  RUN(model(8), in);
  EXPECT_FALSE(allclose(out[0], a[0], 0, 0));  // another seed, another mask
  auto m = model(7);
  CompileOptions o;
  o.name = "dropout_train_cpu";
  o.backend = "cpu";
  auto f = compile([m](const std::vector<Tensor>& xs) { return m->forward(xs); }, o);
  EXPECT_TRUE(allclose(f(in)[0], a[0], 0, 0));  // the compiled graph draws the same numbers
}


// f(model) throws an Error whose text holds `what`
template <class F>
void expect_error_with(F f, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << what << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// What ONNX defines as an error is one, not a silent result: an index tuple component out of its dim
// whose linear index still falls inside the tensor ((0, 5) on [2, 4] read element (1, 1)); Squeeze of
// an axis whose size is not 1 (returned the input); an axis listed twice in Unsqueeze or Slice; a
// float Range whose element count is infinite or NaN (gave an empty tensor).
// Integer Div truncates toward zero exactly (it went through an f32 true division: 16777217 / 1 gave
// 16777216), and x / 0 is 0 on every backend (an infinite quotient's cast gave 0 in the interpreter and
// INT32_MIN in generated code).
TEST(OnnxOps, IntegerDivIsExactAndTheSameOnEveryBackend) {
  for (DType dt : {DType::I32, DType::I64}) {
    Builder b(13);
    const int32_t elem = dt == DType::I32 ? ::onnx::TensorProto::INT32 : I64;
    b.input("a", elem, {6}).input("b", elem, {6}).output("y");
    b.node("Div", {"a", "b"}, {"y"});
    auto m = b.load();
    auto make = [&](std::vector<int64_t> v) {
      return dt == DType::I32 ? tensor<int32_t>(std::vector<int32_t>(v.begin(), v.end()), {6}) : tensor<int64_t>(v, {6});
    };
    Tensor a = make({16777217, 100000007, -7, 7, 1, 2147483647}), d = make({1, 3, 2, -2, 0, 7});
    const std::vector<int64_t> want{16777217, 33333335, -3, -3, 0, 306783378};
    for (const char* be : {"eager", "interp", "cpu"}) {
      std::vector<Tensor> out;
      if (std::string(be) == "eager") {
        RUN(m, {a, d});
      } else {
        reset();
        CompileOptions o;
        o.backend = be;
        o.arg_names = {"a", "b"};
        auto f = compile([m](const Tensor& x, const Tensor& y) { return m->forward({x, y}).at(0); }, o);
        out = {f(a, d)};
      }
      ASSERT_EQ(out[0].dtype(), dt) << be;
      Tensor got = cast(out[0], DType::I64).contiguous();
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(got.data_ptr<int64_t>()[i], want[i]) << be << " " << short_name(dt) << " element " << i;
    }
  }
}

// OneHot's depth is a positive number: NaN went through an undefined cast to a negative size and
// failed in an internal reshape.
TEST(OnnxOps, OneHotDepthMustBePositive) {
  Builder b(11);
  b.input("i", I64, {3}).input("d", F32, {1}).output("y");
  b.const_f32("v", {2}, {0, 1});
  b.node("OneHot", {"i", "d", "v"}, {"y"});
  auto m = b.load();
  std::vector<Tensor> out;
  RUN(m, {tensor<int64_t>({0, 2, 1}, {3}), ftensor({3}, {1})});
  expect_near(out[0], {1, 0, 0, 0, 0, 1, 0, 1, 0}, {3, 3}, 0);
  for (float d : {std::numeric_limits<float>::quiet_NaN(), 0.0f, -2.0f, std::numeric_limits<float>::infinity()})
    expect_error_with([&] { (void)m->forward({tensor<int64_t>({0, 2, 1}, {3}), ftensor({d}, {1})}); },
                      "OneHot depth must be a positive number");
}

TEST(OnnxOps, DefinedErrorsAreErrors) {
  auto x24 = [] { return ftensor({1, 2, 3, 4, 5, 6, 7, 8}, {2, 4}); };
  {
    Builder b(13);
    b.input("x", F32, {2, 4}).input("i", I64, {1, 2}).output("y");
    b.node("GatherND", {"x", "i"}, {"y"});
    auto m = b.load();
    std::vector<Tensor> out;
    RUN(m, {x24(), tensor<int64_t>({1, 2}, {1, 2})});
    expect_near(out[0], {7}, {1}, 0);
    expect_error_with([&] { (void)m->forward({x24(), tensor<int64_t>({0, 5}, {1, 2})}); }, "out of bounds");
    expect_error_with([&] { (void)m->forward({x24(), tensor<int64_t>({0, -5}, {1, 2})}); }, "out of bounds");
  }
  {
    Builder b(13);
    b.input("x", F32, {2, 4}).input("i", I64, {1, 2}).input("u", F32, {1}).output("y");
    b.node("ScatterND", {"x", "i", "u"}, {"y"});
    auto m = b.load();
    std::vector<Tensor> out;
    RUN(m, {x24(), tensor<int64_t>({1, 1}, {1, 2}), ftensor({-1}, {1})});
    expect_near(out[0], {1, 2, 3, 4, 5, -1, 7, 8}, {2, 4}, 0);
    expect_error_with([&] { (void)m->forward({x24(), tensor<int64_t>({0, 5}, {1, 2}), ftensor({-1}, {1})}); }, "out of bounds");
  }
  {
    Builder b(13);
    b.input("x", F32, {2, 4}).output("y");
    b.const_i64("a", {0});
    b.node("Squeeze", {"x", "a"}, {"y"});
    auto m = b.load();
    expect_error_with([&] { (void)m->forward({x24()}); }, "Squeeze axis 0 of [2, 4] has size 2, not 1");
  }
  {
    Builder b(13);
    b.input("x", F32, {2, 4}).output("y");
    b.const_i64("a", {0, 0});
    b.node("Unsqueeze", {"x", "a"}, {"y"});
    auto m = b.load();
    expect_error_with([&] { (void)m->forward({x24()}); }, "name axis 0 twice");
  }
  {
    Builder b(13);
    b.input("x", F32, {2, 4}).output("y");
    b.const_i64("s", {0, 1}).const_i64("e", {1, 3}).const_i64("a", {1, -1});
    b.node("Slice", {"x", "s", "e", "a"}, {"y"});
    auto m = b.load();
    expect_error_with([&] { (void)m->forward({x24()}); }, "name axis 1 twice");
  }
  {
    Builder b(13);
    b.input("s", F32, {}).input("l", F32, {}).input("d", F32, {}).output("y");
    b.node("Range", {"s", "l", "d"}, {"y"});
    auto m = b.load();
    std::vector<Tensor> out;
    RUN(m, {ftensor({0}, {}), ftensor({2}, {}), ftensor({0.5f}, {})});
    expect_near(out[0], {0, 0.5f, 1, 1.5f}, {4}, 0);
    expect_error_with([&] { (void)m->forward({ftensor({0}, {}), ftensor({INFINITY}, {}), ftensor({1}, {})}); },
                      "has inf elements");
    expect_error_with([&] { (void)m->forward({ftensor({0}, {}), ftensor({NAN}, {}), ftensor({1}, {})}); },
                      "undefined number of elements");
    RUN(m, {ftensor({0}, {}), ftensor({-1e30f}, {}), ftensor({1}, {})});
    EXPECT_EQ(out[0].numel(), 0);
  }
}

}  // namespace
}  // namespace protean
