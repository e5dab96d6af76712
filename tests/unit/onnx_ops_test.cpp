// ONNX importer: per-op and per-quirk numerics on hand-built models, against plain C++ references.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace protean
