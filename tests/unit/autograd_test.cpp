// Autograd: the derivative table covers every op, and every rule matches float64 central differences
// (broadcasting, sizes 0 and 1, non-contiguous inputs); the tape's semantics (accumulation, NoGradGuard,
// leaves, errors).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <tuple>

#include "autograd/engine.h"
#include "ops/dispatch.h"
#include "ops/registry.h"
#include "protean/autograd.h"
#include "protean/optim.h"
#include "protean/protean.h"
#include "protean/tensor_version.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;

namespace {

TEST(AutogradTable, EveryOpHasADecision) {
  std::string missing;
  for (size_t i = 0; i < pt::ops::kNumOps; ++i) {
    auto op = static_cast<pt::ops::OpKind>(i);
    const auto& row = pt::autograd::derivative_row(op);
    if (!row.decided) missing += " " + std::string(pt::ops::op_name(op));
    if (row.kind == pt::autograd::Derivative::Rule) {
      EXPECT_NE(row.rule, nullptr) << pt::ops::op_name(op);
    }
    EXPECT_NE(std::string(row.note), "") << pt::ops::op_name(op) << " needs a formula or a reason";
  }
  EXPECT_EQ(missing, "") << "ops of ops.def without a row in src/ops/derivatives.def:" << missing;
}

TEST(AutogradTable, FusedRowsAreNeverDifferentiated) {
  for (size_t i = 0; i < pt::ops::kNumOps; ++i) {
    std::string name(pt::ops::op_name(static_cast<pt::ops::OpKind>(i)));
    if (name.ends_with("_fused")) {
      EXPECT_EQ(pt::autograd::derivative_of(name), pt::autograd::Derivative::NoGradient) << name;
    }
  }
  EXPECT_EQ(pt::autograd::derivative_of("mul"), pt::autograd::Derivative::Rule);
  EXPECT_THROW(pt::autograd::derivative_of("no_such_op"), pt::ValueError);
}

// ---- gradcheck -------------------------------------------------------------------------------------------
std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}
Tensor rnd(const IntVec& sizes, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng());
  return pt::tensor<double>(v, sizes);
}
/// A non-contiguous f64 tensor of `sizes` (a transposed base), values in [lo, hi).
Tensor rnd_nc(const IntVec& sizes, double lo = -1, double hi = 1) {
  if (sizes.size() < 2) return pt::slice(rnd({sizes.empty() ? 1 : sizes[0] * 2}, lo, hi), 0, 0, sizes.empty() ? 1 : sizes[0] * 2, 2).reshape(pt::to_symint_vec(sizes));
  IntVec s = sizes;
  std::swap(s[0], s[1]);
  return pt::transpose(rnd(s, lo, hi), 0, 1);
}

int64_t offset_of(int64_t lin, const IntVec& sizes, const IntVec& strides) {
  int64_t off = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    off += (lin % sizes[k]) * strides[k];
    lin /= sizes[k];
  }
  return off;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

/// Compares the tape's gradient of sum(f(inputs) * w) (w random: a non-trivial upstream gradient)
/// with central differences (eps 1e-6) on every input element; tolerance 1e-6 + 1e-4·|numeric|.
void gradcheck(const std::string& what, const Fn& f, std::vector<Tensor> inputs, std::vector<bool> wrt = {}) {
  SCOPED_TRACE(what);
  if (wrt.empty()) wrt.assign(inputs.size(), true);
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (wrt[i]) inputs[i].requires_grad_();
    leaves.push_back(inputs[i]);
  }
  Tensor y = f(inputs);
  Tensor w = rnd(y.int_sizes());
  Tensor loss = pt::sum(y * w);
  loss.backward();
  auto eval = [&]() {
    pt::NoGradGuard ng;
    return pt::sum(f(inputs) * w).item<double>();
  };
  const double eps = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!wrt[i]) continue;
    Tensor x = inputs[i];
    Tensor g = x.grad();
    IntVec sz = x.int_sizes(), st = x.int_strides();
    int64_t n = x.int_numel();
    if (n == 0) {
      if (g.defined()) {
        EXPECT_EQ(g.int_numel(), 0);
      }
      continue;
    }
    ASSERT_TRUE(g.defined()) << "input " << i << " got no gradient";
    ASSERT_EQ(g.int_sizes(), sz) << "input " << i;
    ASSERT_EQ(g.dtype(), x.dtype());
    Tensor gc = g.contiguous();
    double* p = x.data_ptr<double>();
    for (int64_t e = 0; e < n; ++e) {
      double& v = p[offset_of(e, sz, st)];
      const double orig = v;
      v = orig + eps;
      double fp = eval();
      v = orig - eps;
      double fm = eval();
      v = orig;
      double num = (fp - fm) / (2 * eps);
      double ana = gc.data_ptr<double>()[e];
      EXPECT_NEAR(ana, num, 1e-6 + 1e-4 * std::abs(num)) << "input " << i << " element " << e;
    }
  }
}

Tensor pos(const IntVec& s) { return rnd(s, 0.5, 2.0); }

TEST(AutogradGradcheck, PointwiseUnary) {
  using V = const std::vector<Tensor>&;
  struct U {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool positive;
  };
  std::vector<U> us = {
      {"abs", [](const Tensor& x) { return pt::abs(x); }, false},
      {"cos", [](const Tensor& x) { return pt::cos(x); }, false},
      {"sin", [](const Tensor& x) { return pt::sin(x); }, false},
      {"erf", [](const Tensor& x) { return pt::erf(x); }, false},
      {"exp", [](const Tensor& x) { return pt::exp(x); }, false},
      {"gelu", [](const Tensor& x) { return pt::gelu(x); }, false},
      {"gelu_tanh", [](const Tensor& x) { return pt::gelu(x, "tanh"); }, false},
      {"hardsigmoid", [](const Tensor& x) { return pt::hardsigmoid(x * 4.0); }, false},
      {"hardswish", [](const Tensor& x) { return pt::hardswish(x * 4.0); }, false},
      {"log", [](const Tensor& x) { return pt::log(x); }, true},
      {"neg", [](const Tensor& x) { return pt::neg(x); }, false},
      {"reciprocal", [](const Tensor& x) { return pt::reciprocal(x); }, true},
      {"relu", [](const Tensor& x) { return pt::relu(x); }, false},
      {"rsqrt", [](const Tensor& x) { return pt::rsqrt(x); }, true},
      {"sigmoid", [](const Tensor& x) { return pt::sigmoid(x); }, false},
      {"silu", [](const Tensor& x) { return pt::silu(x); }, false},
      {"sqrt", [](const Tensor& x) { return pt::sqrt(x); }, true},
      {"tanh", [](const Tensor& x) { return pt::tanh(x); }, false},
      {"clamp", [](const Tensor& x) { return pt::clamp(x, -0.5, 0.5); }, false},
  };
  for (const auto& u : us) {
    auto f = [&](V in) { return u.f(in[0]); };
    gradcheck(std::string(u.name) + " contiguous", f, {u.positive ? pos({3, 4}) : rnd({3, 4})});
    gradcheck(std::string(u.name) + " non-contiguous", f, {u.positive ? rnd_nc({3, 4}, 0.5, 2) : rnd_nc({3, 4})});
    gradcheck(std::string(u.name) + " empty", f, {rnd({0, 3})});
    gradcheck(std::string(u.name) + " size 1", f, {u.positive ? pos({1}) : rnd({1})});
  }
}

TEST(AutogradGradcheck, CastRoundTripIsNotAnF64Gradcheck) {
  // cast to f32 loses precision: check the f64 → f64 identity cast separately.
  gradcheck("cast f64", [](const std::vector<Tensor>& in) { return pt::cast(in[0], DType::F64) * 2.0; }, {rnd({3})});
}

TEST(AutogradGradcheck, BinaryWithBroadcasting) {
  using V = const std::vector<Tensor>&;
  std::vector<std::pair<const char*, Fn>> bs = {
      {"add", [](V in) { return in[0] + in[1]; }},
      {"sub", [](V in) { return in[0] - in[1]; }},
      {"mul", [](V in) { return in[0] * in[1]; }},
      {"div", [](V in) { return in[0] / (pt::abs(in[1]) + 0.5); }},
      {"maximum", [](V in) { return pt::maximum(in[0], in[1]); }},
      {"minimum", [](V in) { return pt::minimum(in[0], in[1]); }},
      {"pow", [](V in) { return pt::pow(pt::abs(in[0]) + 0.5, in[1]); }},
      {"where", [](V in) { return pt::where(pt::gt(in[0], in[1]), in[0] * 2.0, in[1]); }},
  };
  for (auto& [name, f] : bs) {
    gradcheck(std::string(name) + " same shape", f, {rnd({2, 3}), rnd({2, 3})});
    gradcheck(std::string(name) + " broadcast [2,3]x[3]", f, {rnd({2, 3}), rnd({3})});
    gradcheck(std::string(name) + " broadcast [2,1,3]x[4,1]", f, {rnd({2, 1, 3}), rnd({4, 1})});
    gradcheck(std::string(name) + " 0-dim", f, {rnd({2, 3}), rnd({})});
    gradcheck(std::string(name) + " non-contiguous", f, {rnd_nc({3, 2}), rnd_nc({3, 2})});
    gradcheck(std::string(name) + " empty", f, {rnd({0, 3}), rnd({3})});
  }
}

TEST(AutogradGradcheck, Reductions) {
  using V = const std::vector<Tensor>&;
  gradcheck("sum all", [](V in) { return pt::sum(in[0]); }, {rnd({3, 4})});
  gradcheck("sum dim", [](V in) { return pt::sum(in[0], {1}); }, {rnd_nc({3, 4})});
  gradcheck("sum keepdim", [](V in) { return pt::sum(in[0], {0}, true); }, {rnd({3, 4})});
  gradcheck("sum empty", [](V in) { return pt::sum(in[0], {0}); }, {rnd({0, 4})});
  gradcheck("mean", [](V in) { return pt::mean(in[0], {-1}); }, {rnd({3, 4})});
  gradcheck("mean all", [](V in) { return pt::mean(in[0]); }, {rnd_nc({3, 4})});
  gradcheck("var", [](V in) { return pt::var(in[0], {1}, false, 1); }, {rnd({3, 4})});
  gradcheck("var keepdim c0", [](V in) { return pt::var(in[0], {0}, true, 0); }, {rnd({3, 4})});
  gradcheck("amax", [](V in) { return pt::amax(in[0], {1}); }, {rnd({3, 4})});
  gradcheck("amin keepdim", [](V in) { return pt::amin(in[0], {0}, true); }, {rnd_nc({3, 4})});
  gradcheck("prod", [](V in) { return pt::prod(in[0], {1}); }, {rnd({3, 4})});
  gradcheck("cumsum", [](V in) { return pt::cumsum(in[0], 1); }, {rnd({3, 4})});
  gradcheck("cumsum nc", [](V in) { return pt::cumsum(in[0], 0); }, {rnd_nc({3, 4})});
}

TEST(AutogradGradcheck, ProdWithZerosIsExact) {
  Tensor x = pt::tensor<double>({2, 0, 3, 0, 0, 5, 4, 1}, {2, 4});
  x.requires_grad_();
  pt::sum(pt::prod(x, {1})).backward();
  // row 0 has two zeros: every gradient is 0; row 1 has one zero: its gradient is 5·4·1 = 20.
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 0, 0, 20, 0, 0, 0}));
}

TEST(AutogradGradcheck, NormsAndSoftmax) {
  using V = const std::vector<Tensor>&;
  gradcheck("softmax", [](V in) { return pt::softmax(in[0], 1); }, {rnd({3, 4})});
  gradcheck("softmax nc dim0", [](V in) { return pt::softmax(in[0], 0); }, {rnd_nc({3, 4})});
  gradcheck("log_softmax", [](V in) { return pt::log_softmax(in[0], -1); }, {rnd({3, 4})});
  gradcheck("layer_norm", [](V in) { return pt::layer_norm(in[0], {4}, in[1], in[2], 1e-5); },
            {rnd({3, 4}), rnd({4}), rnd({4})});
  gradcheck("layer_norm 2 dims no affine", [](V in) { return pt::layer_norm(in[0], {3, 4}, Tensor(), Tensor(), 1e-5); },
            {rnd_nc({2, 3, 4})});
  // weight and bias gradients over 2 normalized dims and 2 leading dims (on CPU: GEMVs over [N, 6])
  gradcheck("layer_norm 2 dims affine", [](V in) { return pt::layer_norm(in[0], {2, 3}, in[1], in[2], 1e-5); },
            {rnd_nc({2, 2, 2, 3}), rnd({2, 3}), rnd({2, 3})});
  gradcheck("rms_norm", [](V in) { return pt::rms_norm(in[0], {4}, in[1], 1e-6); }, {rnd({3, 4}), rnd({4})});
  gradcheck("group_norm", [](V in) { return pt::group_norm(in[0], 2, in[1], in[2], 1e-5); },
            {rnd({2, 4, 3}), rnd({4}), rnd({4})});
  gradcheck("batch_norm", [](V in) { return pt::batch_norm(in[0], in[1], in[2], in[3], in[4], 1e-5); },
            {rnd({2, 3, 2}), rnd({3}), rnd({3}), rnd({3}), pos({3})}, {true, true, true, false, false});
}

TEST(AutogradGradcheck, LinearAlgebra) {
  using V = const std::vector<Tensor>&;
  gradcheck("matmul 2d", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd({3, 4}), rnd({4, 2})});
  gradcheck("matmul nc", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd_nc({3, 4}), rnd_nc({4, 2})});
  gradcheck("matmul batch broadcast", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd({2, 3, 4}), rnd({4, 2})});
  gradcheck("matmul 1d x 2d", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd({4}), rnd({4, 2})});
  gradcheck("matmul 2d x 1d", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd({3, 4}), rnd({4})});
  gradcheck("matmul 1d x 1d", [](V in) { return pt::matmul(in[0], in[1]); }, {rnd({4}), rnd({4})});
  gradcheck("bmm", [](V in) { return pt::bmm(in[0], in[1]); }, {rnd({2, 3, 4}), rnd({2, 4, 2})});
  gradcheck("linear", [](V in) { return pt::linear(in[0], in[1], in[2]); }, {rnd({2, 3, 4}), rnd({5, 4}), rnd({5})});
  gradcheck("linear 1d no bias", [](V in) { return pt::linear(in[0], in[1], Tensor()); }, {rnd({4}), rnd_nc({5, 4})});
  gradcheck("linear batch 1", [](V in) { return pt::linear(in[0], in[1], in[2]); }, {rnd({1, 4}), rnd({5, 4}), rnd({5})});
  // the bias gradient on CPU is a row of ones times g (a GEMV); also for no rows and a 1-D input
  gradcheck("linear empty batch", [](V in) { return pt::linear(in[0], in[1], in[2]); }, {rnd({0, 4}), rnd({5, 4}), rnd({5})});
  gradcheck("linear 1d bias", [](V in) { return pt::linear(in[0], in[1], in[2]); }, {rnd({4}), rnd({5, 4}), rnd({5})});
  gradcheck("linear nc", [](V in) { return pt::linear(pt::transpose(in[0], 0, 1), in[1], in[2]) * 2.0; },
            {rnd({4, 3, 2}), rnd({5, 2}), rnd({5})});
}

TEST(AutogradGradcheck, Convolution) {
  using V = const std::vector<Tensor>&;
  gradcheck("conv2d", [](V in) { return pt::conv2d(in[0], in[1], in[2], {1, 1}, {1, 1}, {1, 1}, 1); },
            {rnd({2, 3, 5, 5}), rnd({4, 3, 3, 3}), rnd({4})});
  gradcheck("conv2d stride 2 dilation 2",
            [](V in) { return pt::conv2d(in[0], in[1], in[2], {2, 2}, {1, 0}, {2, 1}, 1); },
            {rnd({1, 2, 7, 6}), rnd({2, 2, 2, 3}), rnd({2})});
  gradcheck("conv2d groups", [](V in) { return pt::conv2d(in[0], in[1], Tensor(), {1, 1}, {0, 0}, {1, 1}, 2); },
            {rnd({1, 4, 4, 4}), rnd({6, 2, 2, 2})});
  gradcheck("conv1d", [](V in) { return pt::conv1d(in[0], in[1], in[2], {2}, {1}, {1}, 1); },
            {rnd({2, 3, 7}), rnd({2, 3, 3}), rnd({2})});
  gradcheck("conv_transpose2d",
            [](V in) { return pt::conv_transpose2d(in[0], in[1], in[2], {2, 2}, {1, 1}, {1, 0}, 1, {1, 1}); },
            {rnd({1, 2, 3, 3}), rnd({2, 3, 3, 3}), rnd({3})});
  // channels-last input (an NHWC-stored x read through its strides), with stride, padding, dilation
  // and groups at once; a conv1d with groups; conv_transpose2d with groups and an output_padding that
  // reaches past the last window (≥ stride, < dilation)
  auto nhwc = [](const IntVec& s) { return pt::permute(rnd({s[0], s[2], s[3], s[1]}), {0, 3, 1, 2}); };
  gradcheck("conv2d channels-last stride padding dilation groups",
            [](V in) { return pt::conv2d(in[0], in[1], in[2], {2, 1}, {1, 2}, {2, 1}, 2); },
            {nhwc({2, 4, 7, 5}), rnd({6, 2, 2, 3}), rnd({6})});
  gradcheck("conv1d groups", [](V in) { return pt::conv1d(in[0], in[1], Tensor(), {1}, {2}, {2}, 3); },
            {rnd({1, 3, 6}), rnd({3, 1, 2})});
  gradcheck("conv_transpose2d groups output_padding past the windows",
            [](V in) { return pt::conv_transpose2d(in[0], in[1], Tensor(), {1, 2}, {0, 1}, {1, 1}, 2, {2, 1}); },
            {rnd({1, 4, 3, 3}), rnd({4, 1, 2, 2})});
}

TEST(AutogradGradcheck, Pooling) {
  using V = const std::vector<Tensor>&;
  gradcheck("max_pool2d", [](V in) { return pt::max_pool2d(in[0], {2, 2}, {2, 2}, {0, 0}, {1, 1}, false); },
            {rnd({1, 2, 4, 5})});
  gradcheck("max_pool2d pad overlap", [](V in) { return pt::max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, {1, 1}, false); },
            {rnd_nc({2, 1, 5, 5})});
  gradcheck("avg_pool2d", [](V in) { return pt::avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, false, true); },
            {rnd({1, 2, 5, 5})});
  gradcheck("avg_pool2d exclude pad", [](V in) { return pt::avg_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, true, false); },
            {rnd({1, 2, 5, 5})});
  gradcheck("adaptive_avg_pool2d", [](V in) { return pt::adaptive_avg_pool2d(in[0], {3, 2}); }, {rnd({1, 2, 7, 5})});
}

TEST(AutogradGradcheck, ViewsAndMovement) {
  using V = const std::vector<Tensor>&;
  gradcheck("expand", [](V in) { return pt::expand(in[0], {2, 3, 4}); }, {rnd({3, 1})});
  gradcheck("permute", [](V in) { return pt::permute(in[0], {2, 0, 1}); }, {rnd({2, 3, 4})});
  gradcheck("reshape nc", [](V in) { return pt::reshape(in[0], {-1}); }, {rnd_nc({3, 4})});
  gradcheck("view", [](V in) { return pt::view(in[0], {2, 6}); }, {rnd({3, 4})});
  gradcheck("select", [](V in) { return pt::select(in[0], 1, -1); }, {rnd({3, 4})});
  gradcheck("slice step 1", [](V in) { return pt::slice(in[0], 1, 1, 3); }, {rnd({3, 4})});
  gradcheck("slice step 2", [](V in) { return pt::slice(in[0], 0, 1, 100, 2); }, {rnd({6, 2})});
  gradcheck("slice step 3 nc", [](V in) { return pt::slice(in[0], 1, 0, 5, 3); }, {rnd_nc({2, 5})});
  gradcheck("slice negative start", [](V in) { return pt::slice(in[0], 0, -3, -1); }, {rnd({5})});
  gradcheck("squeeze", [](V in) { return pt::squeeze(in[0]); }, {rnd({3, 1, 2})});
  gradcheck("unsqueeze", [](V in) { return pt::unsqueeze(in[0], 1); }, {rnd({3, 2})});
  gradcheck("cat", [](V in) { return pt::cat({in[0], in[1]}, 1); }, {rnd({2, 3}), rnd_nc({2, 2})});
  gradcheck("stack", [](V in) { return pt::stack({in[0], in[1]}, 0); }, {rnd({2, 3}), rnd({2, 3})});
  gradcheck("split", [](V in) {
    auto p = pt::split(in[0], pt::SymIntVec{1, 3}, 1);
    return p[1] * 2.0;  // the first piece gets no gradient: zeros
  }, {rnd({2, 4})});
  gradcheck("clone", [](V in) { return in[0].clone(); }, {rnd_nc({2, 3})});
  gradcheck("pad constant", [](V in) { return pt::pad(in[0], {1, 2, 0, 1}, "constant", 0.5); }, {rnd({2, 3})});
  gradcheck("pad crop", [](V in) { return pt::pad(in[0], {-1, 1}, "constant", 0.0); }, {rnd({2, 3})});
}

TEST(AutogradGradcheck, Indexing) {
  using V = const std::vector<Tensor>&;
  Tensor idx = pt::tensor<int64_t>({0, 2, 2, 1, 0}, {5});
  gradcheck("embedding (repeated rows)", [&](V in) { return pt::embedding(in[0], pt::reshape(idx, {5, 1})); },
            {rnd({4, 3})});
  gradcheck("index_select", [&](V in) { return pt::index_select(in[0], 1, idx); }, {rnd({2, 3})});
  Tensor neg = pt::tensor<int64_t>({-1, 2, -3, 1, 0, -1}, {6});  // ONNX Gather: -1 is the last row
  gradcheck("index_select wrap_negative", [&](V in) { return pt::index_select(in[0], 1, neg, true); }, {rnd({2, 3})});
  Tensor gi = pt::tensor<int64_t>({0, 1, 1, 2, 0, 0}, {2, 3});
  gradcheck("gather", [&](V in) { return pt::gather(in[0], 1, gi); }, {rnd({2, 4})});
}

TEST(AutogradGradcheck, Attention) {
  using V = const std::vector<Tensor>&;
  gradcheck("sdpa", [](V in) { return pt::scaled_dot_product_attention(in[0], in[1], in[2]); },
            {rnd({2, 3, 4}), rnd({2, 5, 4}), rnd({2, 5, 2})});
  gradcheck("sdpa causal scale", [](V in) { return pt::scaled_dot_product_attention(in[0], in[1], in[2], {}, true, 0.3); },
            {rnd({1, 4, 3}), rnd({1, 4, 3}), rnd_nc({1, 4, 2})});
  Tensor mask = pt::tensor<double>({0, -1, 0.5, 0, 0, -2}, {2, 3});
  gradcheck("sdpa float mask", [&](V in) { return pt::scaled_dot_product_attention(in[0], in[1], in[2], mask); },
            {rnd({1, 2, 4}), rnd({1, 3, 4}), rnd({1, 3, 2})});
  // q, k, v of one shape: the rule is scaled_dot_product_attention_backward (one op)
  gradcheck("sdpa self-attention causal", [](V in) { return pt::scaled_dot_product_attention(in[0], in[1], in[2], {}, true); },
            {rnd({2, 2, 5, 3}), rnd_nc({2, 2, 5, 3}), rnd({2, 2, 5, 3})});
  gradcheck("sdpa self-attention", [](V in) { return pt::scaled_dot_product_attention(in[0], in[1], in[2], {}, false, 0.7); },
            {rnd({3, 4, 2}), rnd({3, 4, 2}), rnd_nc({3, 4, 2})});
}

// scaled_dot_product_attention_backward in f32 (16-float vectors, a polynomial exp) against the
// composite backward in f64: sequence lengths that are not multiples of 16, head widths 32 and 20,
// causal or not, a non-contiguous q (heads split from a [B, L, H·E] activation, as in a GPT block).
TEST(AutogradAttention, FusedBackwardF32MatchesCompositeF64) {
  for (auto [L, E, causal] : {std::tuple{37, 32, true}, std::tuple{70, 20, false}, std::tuple{1, 32, true},
                              std::tuple{16, 16, false}, std::tuple{50, 64, true}, std::tuple{33, 48, false}}) {
    SCOPED_TRACE(fmt::format("L {} E {} causal {}", L, E, causal));
    const int64_t B = 2, H = 3;
    Tensor q = pt::transpose(rnd({B, L, H, E}, -2, 2), 1, 2), k = rnd({B, H, L, E}, -2, 2), v = rnd({B, H, L, E}),
           g = rnd({B, H, L, E});
    const double scale = 1.0 / std::sqrt(static_cast<double>(E));
    pt::ops::Attrs a;
    a.set("is_causal", causal);
    auto f32 = [](const Tensor& t) { return pt::cast(t, pt::DType::F32); };
    Tensor d = pt::ops::call1(pt::ops::OpKind::scaled_dot_product_attention_backward, {f32(g), f32(q), f32(k), f32(v)}, a);
    ASSERT_EQ(d.dtype(), pt::DType::F32);
    ASSERT_EQ(d.int_sizes(), (pt::IntVec{3, B, H, L, E}));
    // the composite backward in f64
    Tensor s = pt::matmul(q, pt::transpose(k, -2, -1)) * scale;
    if (causal) {
      Tensor keep = pt::le(pt::unsqueeze(pt::arange(L), 0), pt::unsqueeze(pt::arange(L), 1));
      s = pt::where(keep, s, pt::full({}, -std::numeric_limits<double>::infinity(), pt::DType::F64));
    }
    Tensor p = pt::softmax(s, -1);
    Tensor gp = pt::matmul(g, pt::transpose(v, -2, -1));
    Tensor gs = p * (gp - pt::sum(gp * p, {-1}, true));
    Tensor want[3] = {pt::matmul(gs, k) * scale, pt::matmul(pt::transpose(gs, -2, -1), q) * scale,
                      pt::matmul(pt::transpose(p, -2, -1), g)};
    for (int64_t i = 0; i < 3; ++i) {
      Tensor got = pt::cast(pt::select(d, 0, i), pt::DType::F64);
      const double err = pt::amax(pt::abs(got - want[i])).item<double>();
      const double ref = pt::amax(pt::abs(want[i])).item<double>();
      EXPECT_LE(err, 2e-5 * std::max(1.0, ref)) << "gradient " << i;
    }
  }
}

// The f32 kernel reads q, k, v and g in place when their rows are contiguous (the heads of a fused
// QKV projection: [B, L, 3, H, E] split and permuted to [B, H, L, E]); the result equals the one from
// contiguous copies bit for bit. A layout whose last dim is strided is copied first.
TEST(AutogradAttention, FusedBackwardF32ReadsPermutedHeadsInPlace) {
  for (auto [L, E, causal] : {std::tuple{37, 32, true}, std::tuple{1, 16, false}, std::tuple{19, 20, false}}) {
    SCOPED_TRACE(fmt::format("L {} E {} causal {}", L, E, causal));
    const int64_t B = 2, H = 3;
    auto f32 = [](const Tensor& t) { return pt::cast(t, pt::DType::F32); };
    Tensor qkv = f32(rnd({B, L, 3, H, E}, -2, 2)), gl = f32(rnd({B, L, H, E}));
    auto head = [&](int64_t i) { return pt::permute(pt::select(qkv, 2, i), {0, 2, 1, 3}); };  // [B, H, L, E] view
    Tensor q = head(0), k = head(1), v = head(2), g = pt::permute(gl, {0, 2, 1, 3});
    ASSERT_FALSE(q.is_contiguous());
    pt::ops::Attrs a;
    a.set("is_causal", causal);
    const auto op = pt::ops::OpKind::scaled_dot_product_attention_backward;
    Tensor in_place = pt::ops::call1(op, {g, q, k, v}, a);
    Tensor copied = pt::ops::call1(op, {g.contiguous(), q.contiguous(), k.contiguous(), v.contiguous()}, a);
    EXPECT_EQ(pt::amax(pt::abs(in_place - copied)).item<float>(), 0.0f);
    // the last dim strided: [B, H, E, L] transposed back
    Tensor kt = pt::transpose(pt::transpose(k, -2, -1).contiguous(), -2, -1);
    Tensor strided = pt::ops::call1(op, {g, q, kt, v}, a);
    EXPECT_EQ(pt::amax(pt::abs(strided - copied)).item<float>(), 0.0f);
  }
}

TEST(AutogradGradcheck, CompositeMlpLoss) {
  using V = const std::vector<Tensor>&;
  Tensor labels = pt::tensor<int64_t>({1, 0, 2}, {3, 1});
  gradcheck("mlp cross-entropy", [&](V in) {
    Tensor h = pt::relu(pt::linear(in[0], in[1], in[2]));
    Tensor logits = pt::linear(h, in[3], in[4]);
    return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, labels));
  }, {rnd({3, 4}), rnd({5, 4}), rnd({5}), rnd({3, 5}), rnd({3})});
}

// ---- tape semantics -----------------------------------------------------------------------------------------
TEST(AutogradTape, AccumulatesAcrossBackwardCalls) {
  Tensor x = pt::tensor<float>({1, 2, 3}, {3});
  x.requires_grad_();
  EXPECT_TRUE(x.is_leaf());
  pt::sum(x * x).backward();
  pt::sum(x * 3.0).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{5, 7, 9}));
  x.set_grad({});
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradTape, SharedSubexpressionsSumTheirGradients) {
  Tensor x = pt::tensor<double>({2}, {1});
  x.requires_grad_();
  Tensor y = x * x;
  Tensor z = y * y + y;  // x^4 + x^2: 4x^3 + 2x = 36
  EXPECT_EQ(z.grad_fn_name(), "add");
  EXPECT_FALSE(z.is_leaf());
  z.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 36.0);
}

TEST(AutogradTape, NoGradGuardRecordsNothing) {
  Tensor x = pt::ones({2});
  x.requires_grad_();
  {
    pt::NoGradGuard ng;
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_THROW(pt::sum(y).backward(), pt::ValueError);
  }
  EXPECT_TRUE(pt::is_grad_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(AutogradTape, ErrorsNameWhatIsWrong) {
  Tensor i = pt::tensor<int64_t>({1}, {1});
  EXPECT_THROW(i.requires_grad_(), pt::TypeError);
  Tensor x = pt::ones({2, 2});
  x.requires_grad_();
  Tensor y = x * 2.0;
  EXPECT_THROW(y.requires_grad_(), pt::ValueError);  // not a leaf
  EXPECT_THROW(y.backward(), pt::ValueError);         // not one element, no gradient given
  Tensor s = pt::sum(y);
  s.backward();
  EXPECT_THROW(s.backward(), pt::RuntimeError);  // saved tensors were freed
}

TEST(AutogradTape, UnsupportedOpThrowsWhenRecorded) {
  Tensor x = pt::ones({1, 1, 2, 2});
  x.requires_grad_();
  EXPECT_THROW(pt::upsample_nearest2d(x, {4, 4}), pt::NotImplementedError);
  pt::NoGradGuard ng;
  EXPECT_NO_THROW(pt::upsample_nearest2d(x, {4, 4}));
}

TEST(AutogradTape, GradOfIntermediateAndUnused) {
  Tensor x = pt::tensor<double>({1, 2}, {2});
  Tensor u = pt::tensor<double>({5}, {1});
  x.requires_grad_();
  u.requires_grad_();
  Tensor h = x * 3.0;
  Tensor y = pt::sum(h * h);
  auto g = pt::autograd::grad({y}, {h, x, u}, {}, true);
  EXPECT_EQ(g[0].to_vector<double>(), (std::vector<double>{6, 12}));
  EXPECT_EQ(g[1].to_vector<double>(), (std::vector<double>{18, 36}));
  EXPECT_FALSE(g[2].defined());
  EXPECT_FALSE(x.grad().defined());  // grad() does not accumulate
}

TEST(AutogradTape, SumToSize) {
  Tensor x = pt::ones({2, 3, 4});
  EXPECT_EQ(pt::autograd::sum_to_size(x, {3, 1}).to_vector<float>(), (std::vector<float>{8, 8, 8}));
  EXPECT_THROW(pt::autograd::sum_to_size(x, {2, 4}), pt::ShapeError);
}

TEST(AutogradOps, PhiloxReplaysAndDropoutScales) {
  Tensor a = pt::philox_uniform({1000}, 42, 7);
  Tensor b = pt::philox_uniform({1000}, 42, 7);
  Tensor c = pt::philox_uniform({1000}, 42, 8);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  // Counter-based: offset 8 is offset 7 shifted by one element.
  auto av = a.to_vector<float>(), cv = c.to_vector<float>();
  for (size_t i = 0; i + 1 < av.size(); ++i) ASSERT_EQ(av[i + 1], cv[i]);
  double m = pt::mean(a).item<float>();
  EXPECT_NEAR(m, 0.5, 0.05);
  EXPECT_GE(pt::amin(a).item<float>(), 0.0f);
  EXPECT_LT(pt::amax(a).item<float>(), 1.0f);
  Tensor x = pt::ones({4000});
  x.requires_grad_();
  Tensor y = pt::dropout(x, 0.25, 3, 0);
  auto yv = y.to_vector<float>();
  int kept = 0;
  for (float v : yv) {
    ASSERT_TRUE(v == 0.0f || std::abs(v - 1.0f / 0.75f) < 1e-6f);
    kept += v != 0.0f;
  }
  EXPECT_NEAR(kept / 4000.0, 0.75, 0.03);
  pt::sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), yv);  // d/dx of mask·x/(1-p) is the same pattern
}

TEST(AutogradOps, IndexAddAndScatterAddMatchLoops) {
  Tensor x = pt::zeros({3, 2});
  Tensor src = pt::tensor<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor idx = pt::tensor<int64_t>({2, 0, 2}, {3});
  EXPECT_EQ(pt::index_add(x, 0, idx, src).to_vector<float>(), (std::vector<float>{3, 4, 0, 0, 6, 8}));
  Tensor sidx = pt::tensor<int64_t>({1, 1, 0, 0, 0, 1}, {3, 2});
  EXPECT_EQ(pt::scatter_add(pt::zeros({2, 2}), 0, sidx, src).to_vector<float>(), (std::vector<float>{8, 4, 1, 8}));
  EXPECT_THROW(pt::index_add(x, 0, pt::tensor<int64_t>({3}, {1}), pt::ones({1, 2})), pt::ValueError);
}

// The row form (a contiguous source, rows added whole, columns split over threads) and the element
// form (a transposed source) against a loop adding in index order: equal bit for bit, repeated
// indices included, along dim 0 (an embedding's gradient) and dim 1 (outer > 1), f32 and f64.
TEST(AutogradOps, IndexAddRowsEqualALoopInIndexOrder) {
  pt::manual_seed(11);
  for (pt::DType dt : {pt::DType::F32, pt::DType::F64})
    for (int64_t dim : {0, 1})
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(fmt::format("{} dim {} transposed {}", pt::short_name(dt), dim, transposed));
        const int64_t L = 7, n = 300, other = 37;  // x [L, other] (dim 0) or [other, L] (dim 1)
        Tensor x = pt::randn(dim == 0 ? pt::IntVec{L, other} : pt::IntVec{other, L}).to(dt);
        pt::IntVec ss = dim == 0 ? pt::IntVec{n, other} : pt::IntVec{other, n};
        Tensor src = transposed ? pt::randn({ss[1], ss[0]}).to(dt).transpose(0, 1) : pt::randn(ss).to(dt);
        Tensor idx = pt::randint(0, L, {n});
        Tensor y = pt::index_add(x, dim, idx, src);
        Tensor want = x.contiguous().clone();
        Tensor sc = src.contiguous();
        const auto iv = idx.to_vector<int64_t>();
        auto run = [&]<typename T>() {
          T* w = want.data_ptr<T>();
          const T* sp = sc.data_ptr<T>();
          for (int64_t k = 0; k < n; ++k)
            for (int64_t j = 0; j < other; ++j) {
              if (dim == 0) w[iv[k] * other + j] += sp[k * other + j];
              else w[j * L + iv[k]] += sp[j * n + k];
            }
        };
        if (dt == pt::DType::F32) run.template operator()<float>();
        else run.template operator()<double>();
        EXPECT_TRUE(pt::allclose(y, want, 0.0, 0.0));
      }
}

// ---- training-mode batch norm --------------------------------------------------------------------------------
// float64 transcription of torch.nn.BatchNorm2d in train(): normalization by the batch's mean and biased
// variance per channel; running stats r ← (1 − m)·r + m·stat with the unbiased variance.
struct BnRef {
  std::vector<double> y, rm, rv;
};
BnRef bn_reference(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv, double m,
                   double eps) {
  Tensor xd = pt::cast(x, DType::F64).contiguous();
  const IntVec sz = x.int_sizes();
  const int64_t N = sz[0], C = sz[1];
  int64_t S = 1;
  for (size_t d = 2; d < sz.size(); ++d) S *= sz[d];
  auto xv = xd.to_vector<double>();
  auto wv = pt::cast(w, DType::F64).to_vector<double>(), bv = pt::cast(b, DType::F64).to_vector<double>();
  BnRef r{std::vector<double>(xv.size()), pt::cast(rm, DType::F64).to_vector<double>(),
          pt::cast(rv, DType::F64).to_vector<double>()};
  const double n = static_cast<double>(N * S);
  for (int64_t c = 0; c < C; ++c) {
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t s = 0; s < S; ++s) sum += xv[static_cast<size_t>((i * C + c) * S + s)];
    const double mean = sum / n;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t s = 0; s < S; ++s) {
        double d = xv[static_cast<size_t>((i * C + c) * S + s)] - mean;
        sq += d * d;
      }
    const double var = sq / n;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t s = 0; s < S; ++s) {
        size_t k = static_cast<size_t>((i * C + c) * S + s);
        r.y[k] = (xv[k] - mean) / std::sqrt(var + eps) * wv[static_cast<size_t>(c)] + bv[static_cast<size_t>(c)];
      }
    r.rm[static_cast<size_t>(c)] = (1 - m) * r.rm[static_cast<size_t>(c)] + m * mean;
    r.rv[static_cast<size_t>(c)] = (1 - m) * r.rv[static_cast<size_t>(c)] + m * sq / (n - 1);
  }
  return r;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(AutogradBatchNormTrain, MatchesTorchFormulasAndUpdatesRunningStatsInPlace) {
  for (DType dt : {DType::F64, DType::F32}) {
    SCOPED_TRACE(std::string(pt::short_name(dt)));
    const double tol = dt == DType::F64 ? 1e-12 : 2e-5;
    for (const IntVec& sz : {IntVec{4, 3, 2, 3}, IntVec{5, 2}, IntVec{2, 3, 7}}) {
      const int64_t C = sz[1];
      Tensor x = pt::cast(rnd(sz, -2, 3), dt), w = pt::cast(rnd({C}), dt), b = pt::cast(rnd({C}), dt);
      Tensor rm = pt::cast(rnd({C}), dt), rv = pt::cast(rnd({C}, 0.5, 2), dt);
      BnRef ref = bn_reference(x, w, b, rm, rv, 0.1, 1e-5);
      const void* rm_at = rm.data_ptr();
      const uint64_t v0 = pt::tensor_version(rm);
      Tensor y = pt::batch_norm_train(x, w, b, rm, rv, 0.1, 1e-5);
      EXPECT_LE(max_diff(pt::cast(y, DType::F64).to_vector<double>(), ref.y), tol * 10);
      EXPECT_LE(max_diff(pt::cast(rm, DType::F64).to_vector<double>(), ref.rm), tol);
      EXPECT_LE(max_diff(pt::cast(rv, DType::F64).to_vector<double>(), ref.rv), tol);
      EXPECT_EQ(rm.data_ptr(), rm_at);  // in place
      EXPECT_GT(pt::tensor_version(rm), v0);
      // Momentum 1 replaces the running stats by the batch's (a check that the update is not a no-op).
      BnRef ref1 = bn_reference(x, w, b, rm, rv, 1.0, 1e-5);
      pt::batch_norm_train(x, w, b, rm, rv, 1.0, 1e-5);
      EXPECT_LE(max_diff(pt::cast(rv, DType::F64).to_vector<double>(), ref1.rv), tol);
    }
  }
}

TEST(AutogradBatchNormTrain, GradientsMatchCentralDifferences) {
  using V = const std::vector<Tensor>&;
  gradcheck("batch_norm_train", [](V in) { return pt::batch_norm_train(in[0], in[1], in[2], Tensor(), Tensor(), 0.1, 1e-5); },
            {rnd({3, 2, 2, 2}), rnd({2}), rnd({2})});
  gradcheck("batch_norm_train 2-D nc", [](V in) { return pt::batch_norm_train(in[0], in[1], in[2], Tensor(), Tensor()); },
            {rnd_nc({4, 3}), rnd({3}), rnd({3})});
  gradcheck("batch_norm_train no affine",
            [](V in) { return pt::batch_norm_train(in[0], Tensor(), Tensor(), Tensor(), Tensor()); }, {rnd({2, 3, 3})});
  // With running stats: they never require grad and the input gradient is the same.
  Tensor rm = pt::zeros({2}, DType::F64), rv = pt::ones({2}, DType::F64);
  Tensor x = rnd({3, 2, 4});
  x.requires_grad_();
  pt::sum(pt::batch_norm_train(x, Tensor(), Tensor(), rm, rv) * pt::reshape(pt::arange(24, DType::F64), {3, 2, 4})).backward();
  Tensor g1 = x.grad().clone();
  Tensor x2 = x.detach().clone();
  x2.requires_grad_();
  pt::sum(pt::batch_norm_train(x2, Tensor(), Tensor(), Tensor(), Tensor()) * pt::reshape(pt::arange(24, DType::F64), {3, 2, 4})).backward();
  EXPECT_LE(pt::max_abs_diff(g1, x2.grad()), 1e-12);
  EXPECT_FALSE(rm.requires_grad());
}

// batch_norm_train on CPU runs batch_norm_stats and batch_norm_train_apply, whose rule is the whole
// normalization backward (batch_norm_train_grad_sums, batch_norm_train_backward): its output and
// gradients against the same formula written with ops (mean, var, rsqrt and their rules), f64, with
// odd sizes, non-contiguous inputs and an upstream gradient broadcast over the batch.
TEST(AutogradBatchNormTrain, FusedOpsMatchTheCompositeFormula) {
  using pt::SymInt;
  for (const IntVec& sz : {IntVec{5, 3, 7}, IntVec{7, 3}, IntVec{2, 5, 3, 3}, IntVec{3, 1, 1, 2}}) {
    SCOPED_TRACE(pt::to_string(pt::to_symint_vec(sz)));
    const int64_t C = sz[1];
    IntVec perm(sz.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(perm.size() - 1 - i);
    IntVec rev(sz.rbegin(), sz.rend());
    Tensor x0 = pt::permute(rnd(rev, -2, 3), perm);  // non-contiguous
    ASSERT_FALSE(x0.is_contiguous());
    Tensor w0 = rnd({C}), b0 = rnd({C});
    IntVec dims{0};
    pt::SymIntVec bshape{SymInt(1), SymInt(C)};
    IntVec gsz = sz;
    gsz[0] = 1;  // the upstream weights broadcast over N
    for (size_t d = 2; d < sz.size(); ++d) dims.push_back(static_cast<int64_t>(d)), bshape.push_back(SymInt(1));
    Tensor r = rnd(gsz);
    auto run = [&](bool fused) {
      Tensor x = x0.detach(), w = w0.clone(), b = b0.clone();
      for (Tensor* t : {&x, &w, &b}) t->requires_grad_();
      Tensor y;
      if (fused) {
        y = pt::batch_norm_train(x, w, b, Tensor(), Tensor(), 0.1, 1e-5);
      } else {
        Tensor mu = pt::mean(x, dims, true), v = pt::var(x, dims, true, 0);
        y = (x - mu) * pt::rsqrt(v + 1e-5) * pt::reshape(w, bshape) + pt::reshape(b, bshape);
      }
      pt::sum(y * r).backward();
      return std::vector<Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
    };
    std::vector<Tensor> f = run(true), c = run(false);
    const char* what[] = {"y", "dx", "dw", "db"};
    for (size_t i = 0; i < f.size(); ++i) EXPECT_LE(pt::max_abs_diff(f[i], c[i]), 1e-12) << what[i];
  }
  // The ops check what they are given.
  Tensor x = pt::randn({4, 3}), st = pt::zeros({2, 3}, DType::F64);
  pt::ops::Attrs eps;
  eps.set("eps", 1e-5);
  EXPECT_THROW(pt::ops::call1(pt::ops::OpKind::batch_norm_train_apply, {x, pt::zeros({2, 4}, DType::F64), Tensor(), Tensor()}, eps),
               pt::ShapeError);
  EXPECT_THROW(pt::ops::call1(pt::ops::OpKind::batch_norm_train_apply, {x, st, pt::ones({3}, DType::F64), Tensor()}, eps),
               pt::TypeError);
  EXPECT_THROW(pt::ops::call1(pt::ops::OpKind::batch_norm_train_grad_sums, {pt::randn({4, 2}), x, st}, eps), pt::ShapeError);
  EXPECT_THROW(pt::ops::call1(pt::ops::OpKind::batch_norm_stats, {pt::randn({4})}), pt::ShapeError);
}

// The compiled joint graph (cpu backend: the four ops as externs) gives the eager tape's value and
// gradients, and a weight of another dtype keeps the composite form, with the same gradients.
TEST(AutogradBatchNormTrain, CompiledGradientsMatchTheEagerTape) {
  auto fn = [](Tensor x, Tensor w, Tensor b) {
    Tensor y = pt::batch_norm_train(x, w, b, Tensor(), Tensor(), 0.1, 1e-5);
    return pt::sum(pt::relu(y) * pt::reshape(pt::arange(y.numel(), DType::F32), y.sizes()));
  };
  auto step = pt::compile(pt::value_and_grad(fn, {.wrt = {0, 1, 2}}), {.name = "bn_vg", .backend = "cpu"});
  for (const IntVec& sz : {IntVec{6, 3, 5, 5}, IntVec{6, 3, 5, 5}, IntVec{9, 3, 4, 7}}) {
    Tensor x = pt::cast(rnd(sz, -1, 2), DType::F32), w = pt::cast(rnd({3}), DType::F32), b = pt::cast(rnd({3}), DType::F32);
    auto [loss, grads] = step(x, w, b);
    Tensor xe = x.clone(), we = w.clone(), be = b.clone();
    for (Tensor* t : {&xe, &we, &be}) t->requires_grad_();
    Tensor le = fn(xe, we, be);
    le.backward();
    EXPECT_NEAR(loss.item<float>(), le.item<float>(), 1e-5 * std::abs(le.item<float>()) + 1e-3);
    EXPECT_LE(pt::max_abs_diff(grads[0], xe.grad()), 1e-3);
    EXPECT_LE(pt::max_abs_diff(grads[1], we.grad()), 1e-2);
    EXPECT_LE(pt::max_abs_diff(grads[2], be.grad()), 1e-2);
  }
}

TEST(AutogradBatchNormTrain, BadInputsAreClearErrors) {
  Tensor rm = pt::zeros({3}), rv = pt::ones({3});
  EXPECT_THROW(pt::batch_norm_train(pt::randn({1, 3}), Tensor(), Tensor(), rm, rv), pt::ValueError);  // 1 value per channel
  EXPECT_THROW(pt::batch_norm_train(pt::randn({4, 3}), Tensor(), Tensor(), rm, rv, 1.5), pt::ValueError);
  EXPECT_THROW(pt::batch_norm_train(pt::randn({4, 3}), Tensor(), Tensor(), rm, rv, 0.1, -1), pt::ValueError);
  EXPECT_THROW(pt::batch_norm_train(pt::randn({4, 3}), Tensor(), Tensor(), rm, Tensor()), pt::ValueError);
  EXPECT_THROW(pt::batch_norm_train(pt::randn({4, 2}), Tensor(), Tensor(), rm, rv), pt::ShapeError);
  EXPECT_THROW(pt::batch_norm_train(pt::randn({4}), Tensor(), Tensor(), Tensor(), Tensor()), pt::ShapeError);
  EXPECT_THROW(pt::batch_norm_train(pt::ones({4, 3}, DType::I64), Tensor(), Tensor(), Tensor(), Tensor()), pt::TypeError);
  // Compiled outside compile_train_step: the update cannot be a graph's, so it is refused, whether the
  // statistics are inputs (fakes) or captured tensors (constants).
  auto f = pt::compile([](Tensor x, Tensor m, Tensor v) { return pt::batch_norm_train(x, Tensor(), Tensor(), m, v); },
                       {.name = "bn_inputs", .backend = "interp"});
  EXPECT_THROW(f(pt::randn({4, 3}), rm, rv), pt::NotImplementedError);
  auto g = pt::compile([&](Tensor x) { return pt::batch_norm_train(x, Tensor(), Tensor(), rm, rv); },
                       {.name = "bn_captured", .backend = "interp"});
  EXPECT_THROW(g(pt::randn({4, 3})), pt::NotImplementedError);
  EXPECT_EQ(pt::max_abs_diff(rm, pt::zeros({3})), 0.0);  // untouched
  // Without running statistics it compiles (nothing to update).
  auto h = pt::compile([](Tensor x) { return pt::batch_norm_train(x, Tensor(), Tensor(), Tensor(), Tensor()); },
                       {.name = "bn_no_stats", .backend = "interp"});
  Tensor x = pt::randn({4, 3});
  EXPECT_LE(pt::max_abs_diff(h(x), pt::batch_norm_train(x, Tensor(), Tensor(), Tensor(), Tensor())), 1e-6);
}

/// A compiled value_and_grad `step` against the eager tape `vg` on the same arguments: the loss and
/// every gradient within 1e-4.
template <class Step, class Vg, class... Args>
void expect_matches_tape(Step& step, Vg& vg, const Args&... xs) {
  const std::pair<Tensor, std::vector<Tensor>> got = step(xs...), want = vg(xs...);
  EXPECT_NEAR(got.first.item<float>(), want.first.item<float>(), 1e-4);
  ASSERT_EQ(got.second.size(), want.second.size());
  for (size_t k = 0; k < want.second.size(); ++k)
    EXPECT_LE(pt::max_abs_diff(got.second[k], want.second[k]), 1e-4) << "gradient " << k;
}

}  // namespace

// A joint graph whose gradient kernel reads the row after its own ([n + 1, 4] cat gradient, read at
// x + 4) and prefetches further ahead: the prefetch hint is emitted on integers (pt::prefetch), since
// GCC 12 folded the hint's address `&b[4x + 8]` into the masked load of `b[r + 4x + 4]` below it and
// the compiled gradient read the next row (and, for the last row, past the buffer).
TEST(AutogradCompiled, GradientKernelReadsItsOwnRowBesideAPrefetch) {
  auto fn = [](Tensor a, Tensor c) {
    Tensor m = pt::minimum(pt::var(a, {1}, true), a * 0.5);
    Tensor cat = pt::cat({pt::mean(c, {0}, true), m}, 0);  // [n + 1, 4]
    Tensor s = pt::cumsum(a, 0);
    return pt::sum(s * s) * 0.1 + pt::sum(pt::tanh(cat)) * 0.25;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1}});
  auto step = pt::compile(vg, {.name = "cat_min_vg", .backend = "cpu"});
  for (int64_t n : {6, 8, 11, 7}) {
    SCOPED_TRACE(fmt::format("n {}", n));
    Tensor a = pt::cast(rnd({n, 4}, -2, 2), DType::F32), c = pt::cast(rnd({n, 4}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, c);
  }
}

// amax's backward routes the gradient through eq(x, amax(x)) with x recomputed in another kernel:
// both kernels must compute x to the same bits. The scheduler turned x / 5 into x · 0.2 (1 ulp
// apart) inside the max reduction but not under the eq, and the maximum's row got no gradient.
TEST(AutogradCompiled, MaxReductionAndItsBackwardSeeTheSameDivision) {
  auto fn = [](Tensor a, Tensor b) {
    Tensor cat = pt::cat({pt::var(b, {1}, true), a}, 1);  // var: M2 / 5 for rows of 6
    Tensor m = pt::amax(cat, {0}, true);
    Tensor d = pt::amax(a / 5.0, {0}, true);
    return pt::sum(pt::tanh(m)) + pt::sum(pt::tanh(d)) + pt::sum(pt::tanh(cat)) * 0.5;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1}});
  auto step = pt::compile(vg, {.name = "amax_div_vg", .backend = "cpu"});
  for (int i = 0; i < 24; ++i) {
    const int64_t n = 4 + i % 5;
    SCOPED_TRACE(fmt::format("call {} n {}", i, n));
    Tensor a = pt::cast(rnd({n, 6}, -1, 1), DType::F32), b = pt::cast(rnd({n, 6}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, b);
  }
}

// A training step whose GEMM operands are reshapes of permuted heads (split into [B, 2, T, 4], merged
// back after the attention): lowering's in-place view of a permuted value must only take the permute
// itself. It took a reshape of it (a different rank), indexed the permute's dims past the index it
// was given (a heap overflow: crashes, or bogus compile errors), then compared the element functions.
TEST(AutogradCompiled, TrainStepOverSplitAndMergedHeadsMatchesEager) {
  struct Attn : pt::Module {
    Tensor &emb, &wq, &wk, &wv, &lnw, &lnb, &head;
    Attn()
        : emb(register_parameter("emb", pt::randn({11, 8}) * 0.5)), wq(register_parameter("wq", pt::randn({8, 8}) * 0.3)),
          wk(register_parameter("wk", pt::randn({8, 8}) * 0.3)), wv(register_parameter("wv", pt::randn({8, 8}) * 0.3)),
          lnw(register_parameter("lnw", pt::ones({8}))), lnb(register_parameter("lnb", pt::zeros({8}))),
          head(register_parameter("head", pt::randn({11, 8}) * 0.3)) {}
    Tensor loss(const Tensor& tok, const Tensor& y) {
      Tensor h = pt::embedding(emb, tok);  // [B, T, 8]
      Tensor hn = pt::layer_norm(h, {8}, lnw, lnb);
      auto split = [](const Tensor& t) { return t.reshape({t.size(0), t.size(1), 2, 4}).transpose(1, 2); };
      Tensor a = pt::scaled_dot_product_attention(split(pt::linear(hn, wq, Tensor())), split(pt::linear(hn, wk, Tensor())),
                                                  split(pt::linear(hn, wv, Tensor())), Tensor(), true);
      a = a.transpose(1, 2).reshape({h.size(0), h.size(1), 8});
      Tensor logits = pt::linear(h + a, head, Tensor()).flatten(0, 1);
      return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, y.flatten().unsqueeze(1)));
    }
  };
  pt::manual_seed(7);
  auto eager = std::make_shared<Attn>(), compiled = std::make_shared<Attn>();
  std::vector<Tensor> ep, cp;
  auto cparams = compiled->named_parameters();
  for (const auto& [name, t] : eager->named_parameters()) {
    Tensor c = cparams[ep.size()].second;
    std::memcpy(c.data_ptr(), t.contiguous().data_ptr(), static_cast<size_t>(t.int_numel()) * sizeof(float));
    Tensor e = t;
    e.requires_grad_();
    ep.push_back(e);
    cp.push_back(c);
  }
  pt::optim::AdamW eopt(ep, pt::optim::AdamWOptions(0.01)), copt(cp, pt::optim::AdamWOptions(0.01));
  auto step = pt::compile_train_step(compiled, [&](Tensor x, Tensor y) { return compiled->loss(x, y); }, copt,
                                     {.name = "split_heads_step", .backend = "cpu"});
  for (int64_t t : {5, 5, 3, 9, 1, 7}) {
    SCOPED_TRACE(fmt::format("T {}", t));
    Tensor x = pt::randint(0, 11, {2, t}), y = pt::randint(0, 11, {2, t});
    eopt.zero_grad();
    Tensor le = eager->loss(x, y);
    le.backward();
    eopt.step();
    Tensor lc = step(x, y);
    EXPECT_NEAR(le.item<double>(), lc.item<double>(), 1e-5);
    auto a = eager->named_parameters(), b = compiled->named_parameters();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_LE(pt::max_abs_diff(a[k].second, b[k].second), 1e-5) << a[k].first;
  }
}

// A backward that throws (here sum_to_size: a grad_output of the wrong shape) leaves no backward
// provenance behind on the thread: the next capture on it read the dead scope's location.
TEST(AutogradTape, AThrowingBackwardLeavesNoProvenanceBehind) {
  Tensor w = pt::randn({3, 3});
  w.requires_grad_();
  EXPECT_THROW(pt::autograd::grad({w * 3.0}, {w}, {pt::ones({2, 2})}), pt::ShapeError);
  EXPECT_EQ(pt::autograd::detail::backward_provenance(), nullptr);
  auto vg = pt::compile(pt::value_and_grad([](Tensor a) { return pt::sum(a * a); }), {.name = "after_throw", .backend = "interp"});
  auto [loss, grads] = vg(pt::ones({2}));
  EXPECT_EQ(loss.item<float>(), 2.0f);
  EXPECT_EQ(pt::max_abs_diff(grads[0], pt::full({2}, 2.0, DType::F32)), 0.0);
}

// The scalar tail after a vector loop (here the last values of each 4-wide row) selects between
// loads (minimum's gradient: `c ? b20[i] : b13[i] * ...`). With `omp simd` on the tail, GCC 12
// vectorized it into masked loads one row further on (past the buffer on the last row).
TEST(AutogradCompiled, ScalarTailsOfVectorStagesReadTheirOwnRow) {
  auto fn = [](Tensor a, Tensor b, Tensor c) {
    Tensor m = pt::amin(b, {1}, true) + pt::prod(pt::tanh(b) * 0.5 + 1.0, {1}, true);
    Tensor low = pt::minimum(m, c * 1.25);
    Tensor picked = pt::index_select(c, 1, pt::tensor<int64_t>({0, 0, 1}, {3}));
    return pt::sum(picked * picked) * 0.1 + pt::sum(pt::tanh(picked)) - pt::sum(pt::tanh(low)) + pt::sum(a) * 0.0;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1, 2}});
  auto step = pt::compile(vg, {.name = "tail_select_vg", .backend = "cpu"});
  for (int i = 0; i < 24; ++i) {
    const int64_t n = 5 + i % 4;
    SCOPED_TRACE(fmt::format("call {} n {}", i, n));
    Tensor a = pt::cast(rnd({n, 4}, -2, 2), DType::F32), b = pt::cast(rnd({n, 4}, -2, 2), DType::F32),
           c = pt::cast(rnd({n, 4}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, b, c);
  }
}

// An extern that returns a view of its input (a slice of a cat's gradient) while that input lives in
// a memory slot: the slot is reused after the input's last use, so the view must not outlive it (it
// is copied). Here pad's gradient took the slot and overwrote the slice's first rows.
TEST(AutogradCompiled, AViewOfASlotDoesNotOutliveTheSlot) {
  auto fn = [](Tensor a, Tensor, Tensor c) {
    Tensor scaled = pt::select(c, 1, 1).unsqueeze(1) * c;
    Tensor t = pt::tanh(a);
    Tensor tt = pt::reshape(pt::permute(pt::unsqueeze(t, 2), {1, 0, 2}), {t.size(1), t.size(0)}).transpose(0, 1);
    Tensor padded = pt::pad(pt::layer_norm(tt, {tt.size(-1)}), pt::SymIntVec{0, 0, 2, 1}, "constant", 1.0);
    Tensor rows = pt::slice(padded, 0, 1, padded.size(0));
    Tensor cat = pt::cat({scaled, tt}, 0);
    Tensor m = pt::mean(t, {1}, true);
    return pt::sum(m * m) * 0.1 - pt::sum(pt::tanh(m)) - pt::sum(pt::tanh(cat)) * 0.5 + pt::sum(pt::tanh(rows)) * 0.0;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1, 2}});
  auto step = pt::compile(vg, {.name = "slot_view_vg", .backend = "cpu"});
  for (int64_t n : {6, 8, 11, 7}) {
    SCOPED_TRACE(fmt::format("n {}", n));
    Tensor a = pt::cast(rnd({n, 5}, -2, 2), DType::F32), b = pt::cast(rnd({n, 5}, -2, 2), DType::F32),
           c = pt::cast(rnd({n, 5}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, b, c);
  }
}

// The same through a value a pointwise kernel stores (rms_norm's output, read by index_select) and a
// max reduction recomputes (amax over dim 0): the scheduler's division rewrite must not depend on
// the kernel (x·0.2 stored, x/5 inside the max: the maximum's gradient was lost).
TEST(AutogradCompiled, AMaxOfAStoredValueSeesTheSameDivision) {
  auto fn = [](Tensor a, Tensor b, Tensor c) {
    Tensor r = pt::rms_norm(b, {b.size(-1)});
    Tensor top = pt::amax(r, {0}, true);
    Tensor soft = pt::relu(b) + b * 0.1;
    Tensor tail = pt::gelu(pt::slice(c, 0, 1, c.size(0)));
    Tensor picked = pt::index_select(r, 1, pt::tensor<int64_t>({0, 0, 1}, {3}));
    Tensor mix = pt::where(pt::gt(top, tail), top, tail * 2.0);
    return pt::sum(mix * mix) * 0.1 + pt::sum(pt::tanh(picked)) + pt::sum(pt::tanh(tail)) * 0.5 +
           pt::sum(pt::softmax(soft, 0)) * 0.0 + pt::sum(a) * 0.0;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1, 2}});
  auto step = pt::compile(vg, {.name = "amax_stored_vg", .backend = "cpu"});
  for (int i = 0; i < 16; ++i) {
    const int64_t n = 4 + i % 5;
    SCOPED_TRACE(fmt::format("call {} n {}", i, n));
    Tensor a = pt::cast(rnd({n, 5}, -2, 2), DType::F32), c = pt::cast(rnd({n, 5}, -2, 2), DType::F32);
    Tensor b = i % 2 ? pt::transpose(pt::cast(rnd({5, n}, -2, 2), DType::F32), 0, 1) : pt::cast(rnd({n, 5}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, b, c);
  }
}

// A division by a computed value (x / (|m| + 1), m one per row) is invariant along a row and not down
// a column: rewritten to a reciprocal multiplication in the kernel that runs along rows only, it gave
// values 1 ulp off the max down the columns, and amax's backward lost whole rows of gradient.
TEST(AutogradCompiled, DivisionByAComputedValueHasTheSameBitsInEveryKernel) {
  auto fn = [](Tensor a, Tensor b) {
    Tensor m = pt::amin(a, {1}, true) + pt::prod(pt::tanh(a) * 0.5 + 1.0, {1}, true);
    Tensor q = a / (pt::abs(m) + 1.0);
    Tensor top = pt::amax(q, {0}, true) + b;
    return pt::sum(pt::tanh(top)) * -0.5 + pt::sum(q * q) * 0.0;
  };
  auto vg = pt::value_and_grad(fn, {.wrt = {0, 1}});
  auto step = pt::compile(vg, {.name = "div_computed_vg", .backend = "cpu"});
  for (int i = 0; i < 16; ++i) {
    const int64_t n = 3 + i % 6;
    SCOPED_TRACE(fmt::format("call {} n {}", i, n));
    Tensor a = pt::cast(rnd({n, 6}, -2, 2), DType::F32), b = pt::cast(rnd({n, 6}, -2, 2), DType::F32);
    expect_matches_tape(step, vg, a, b);
  }
}

TEST(AutogradGrads, SetGradChecksShapeDtypeAndDevice) {
  // torch's `p.grad = g` checks: an optimizer's step() must never meet a gradient it cannot apply.
  Tensor w = pt::randn({3});
  w.requires_grad_();
  try {
    w.set_grad(pt::randn({4}));
    FAIL() << "no error";
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("set_grad: the gradient has shape [4] but the tensor has shape [3]"),
              std::string::npos)
        << e.what();
  }
  try {
    w.set_grad(pt::ones({3}, pt::DType::I64));
    FAIL() << "no error";
  } catch (const pt::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("set_grad: the gradient is i64 but the tensor is f32"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(w.set_grad(pt::ones({3}, pt::DType::F64)), pt::TypeError);
  EXPECT_FALSE(w.grad().defined());  // nothing was set
  w.set_grad(pt::ones({3}));
  EXPECT_TRUE(w.grad().defined());
  w.set_grad({});
  EXPECT_FALSE(w.grad().defined());
}

TEST(AutogradGrads, GradOutputsMustMatchTheOutput) {
  Tensor w = pt::randn({3, 3});
  w.requires_grad_();
  try {
    pt::autograd::grad({w * 3.0}, {w}, {pt::ones({2, 2})});
    FAIL() << "no error";
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_outputs[0] has shape [2, 2] but output 0 has shape [3, 3]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(pt::autograd::grad({w * 3.0}, {w}, {pt::ones({3})}), pt::ShapeError);  // no broadcasting
  try {
    pt::autograd::grad({w * 3.0}, {w}, {pt::ones({3, 3}, pt::DType::I64)});
    FAIL() << "no error";
  } catch (const pt::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("grad_outputs[0] is i64 but output 0 is f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::autograd::backward({w * 3.0}, {pt::ones({3, 3}, pt::DType::Bool)}), pt::TypeError);
  // Another floating dtype is cast to the output's, as torch does.
  auto g = pt::autograd::grad({w * 3.0}, {w}, {pt::ones({3, 3}, pt::DType::F64)});
  EXPECT_EQ(g[0].dtype(), pt::DType::F32);
  EXPECT_LE(pt::max_abs_diff(g[0], pt::full({3, 3}, 3.0)), 0.0);
}

namespace {
// A tensor saved for the backward and then written in place (an optimizer step between the forward
// and the backward) made backward() use the new values silently (gradient [-18, -16, -14] for
// sum(w*w) recorded at w = [1, 2, 3]). As torch's saved-variable check, it is now an error naming
// the op and the input; a backward before the write is unaffected.
TEST(Autograd, ASavedTensorWrittenInPlaceBeforeTheBackwardIsAnError) {
  Tensor w = pt::arange(1, 4, 1, pt::DType::F32);
  w.requires_grad_();
  pt::optim::SGD opt({w}, {.lr = 5.0});
  Tensor first = pt::sum(w * w);
  first.backward();  // gradient 2w at w = [1, 2, 3]
  EXPECT_LE(pt::max_abs_diff(w.grad(), Tensor(pt::arange(2, 8, 2, pt::DType::F32))), 0.0);
  Tensor second = pt::sum(w * w);  // saves w at version 0
  opt.step();                      // writes w in place: version 1
  try {
    second.backward();
    ADD_FAILURE() << "the backward used values written after the forward";
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("of mul (f32[3]), saved for the backward, was modified in place"),
              std::string::npos)
        << e.what();
  }
}

// An output listed twice contributes twice (torch.autograd.backward sums repeated roots); the root's
// node used to be walked twice, its inputs' dependency counts never reached zero and the gradient
// was dropped.
TEST(Autograd, AnOutputListedTwiceCountsTwice) {
  Tensor w = pt::ones({2});
  w.requires_grad_();
  Tensor a = pt::sum(w * 2.0);
  pt::autograd::backward({a, a});
  ASSERT_TRUE(w.grad().defined());
  EXPECT_LE(pt::max_abs_diff(w.grad(), pt::full({2}, 4.0)), 0.0);
  Tensor v = pt::ones({2});
  v.requires_grad_();
  Tensor b = pt::sum(v * 2.0), c = pt::sum(v * 3.0);
  pt::autograd::backward({b, c, b});
  EXPECT_LE(pt::max_abs_diff(v.grad(), pt::full({2}, 7.0)), 0.0);
  Tensor u = pt::ones({2});
  u.requires_grad_();
  Tensor d = pt::sum(pt::tanh(u * 2.0));
  std::vector<Tensor> g = pt::autograd::grad({d, d}, {u});
  Tensor once = pt::autograd::grad({pt::sum(pt::tanh(u * 2.0))}, {u})[0];
  EXPECT_LE(pt::max_abs_diff(g[0], once * 2.0), 1e-6);
  // more gradients than outputs: an error, not ignored
  Tensor e = pt::sum(u * 3.0);
  EXPECT_THROW(pt::autograd::backward({e}, {pt::ones({}), pt::ones({})}), pt::ValueError);
}

// An input listed twice gets its gradient at both places (torch.autograd.grad); value_and_grad with a
// wrt index listed twice likewise, eagerly and compiled (it differentiated the second leaf only: zeros
// for the first).
TEST(Autograd, AnInputListedTwiceGetsItsGradientTwice) {
  Tensor w = pt::ones({2});
  w.requires_grad_();
  std::vector<Tensor> g = pt::autograd::grad({pt::sum(w * w)}, {w, w});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_LE(pt::max_abs_diff(g[0], pt::full({2}, 2.0)), 0.0);
  EXPECT_LE(pt::max_abs_diff(g[1], pt::full({2}, 2.0)), 0.0);
  auto f = [](Tensor x, Tensor y) { return pt::sum(x * x * y); };
  const Tensor x = pt::full({2}, 3.0), y = pt::full({2}, 2.0);
  auto [loss, grads] = pt::value_and_grad(f, {.wrt = {0, 1, 0}})(x, y);
  ASSERT_EQ(grads.size(), 3u);
  EXPECT_LE(pt::max_abs_diff(grads[0], pt::full({2}, 12.0)), 0.0);
  EXPECT_LE(pt::max_abs_diff(grads[1], pt::full({2}, 9.0)), 0.0);
  EXPECT_LE(pt::max_abs_diff(grads[2], pt::full({2}, 12.0)), 0.0);
  pt::CompileOptions o;
  o.backend = "interp";
  auto compiled = pt::compile(pt::value_and_grad(f, {.wrt = {0, 1, 0}}), o);
  auto [closs, cgrads] = compiled(x, y);
  ASSERT_EQ(cgrads.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_LE(pt::max_abs_diff(cgrads[i], grads[i]), 0.0) << i;
}

// value_and_grad's own errors name it: a result with no path to a wrt argument (also a gradient taken
// inside: no higher-order gradients), an integer or many-element result, nothing to differentiate.
TEST(Autograd, ValueAndGradErrorsNameWhatIsWrong) {
  auto expect_error = [](auto&& call, const std::string& part) {
    try {
      call();
      ADD_FAILURE() << "no error; expected one containing: " << part;
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const Tensor x = pt::full({2}, 3.0), y = pt::full({2}, 2.0);
  expect_error([&] { pt::value_and_grad([](Tensor, Tensor b) { return pt::sum(b); }, {.wrt = {0}})(x, y); },
               "value_and_grad: the result does not depend on any wrt argument");
  expect_error([&] { pt::value_and_grad([](Tensor a) { return a * 2.0; })(x); }, "has shape [2]; it must have one element");
  expect_error([&] { pt::value_and_grad([](Tensor a) { return pt::cast(pt::sum(a), pt::DType::I64); })(x); },
               "value_and_grad: the result to differentiate is i64");
  expect_error([&] { pt::value_and_grad([](std::vector<Tensor> v) { return pt::sum(pt::ones({1})); })(std::vector<Tensor>{}); },
               "nothing to differentiate");
  auto inner = pt::value_and_grad([](Tensor a) { return pt::sum(a * a); });
  expect_error([&] { pt::value_and_grad([&](Tensor a) { return pt::sum(inner(a).second[0]); })(x); },
               "higher-order gradients are not supported");
  // still zeros for an argument the result does not depend on, when it depends on another
  auto [l, g] = pt::value_and_grad([](Tensor a, Tensor) { return pt::sum(a); }, {.wrt = {0, 1}})(x, y);
  EXPECT_LE(pt::max_abs_diff(g[1], pt::zeros({2})), 0.0);
}

// backward() inside a function being compiled is an error naming the alternatives: it lost the
// gradient of an argument and left a capture-time FakeTensor in a closed-over leaf's grad().
TEST(Autograd, BackwardInsideACompiledFunctionIsAnError) {
  Tensor v = pt::full({2}, 3.0);
  v.requires_grad_();
  pt::CompileOptions o;
  o.backend = "interp";
  auto c = pt::compile([v](Tensor x) { Tensor l = pt::sum(v * x); l.backward(); return l; }, o);
  try {
    c(pt::ones({2}));
    ADD_FAILURE() << "backward() ran inside the capture";
  } catch (const pt::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("backward() inside a function being compiled"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(v.grad().defined());
  pt::sum(v * 2.0).backward();  // the leaf is intact
  EXPECT_LE(pt::max_abs_diff(v.grad(), pt::full({2}, 2.0)), 0.0);
}
}  // namespace
