// Post-ops on NaN and infinities: every post-op kind, fused after conv / linear / matmul (oneDNN
// post-ops, the `sum` form, the epilogue primitive and the plain loops), gives what the eager
// composition gives — NaN stays NaN through relu and clamp, ±inf saturate as eager saturates them —
// and so does the cpu backend's fusion end to end.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_test_util.h"
#include "ops/dnnl_util.h"
#include "ops/post_ops.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu {
namespace {

using ops::OpKind;
using ops::PostOp;
using ops::PostOpKind;
using testing::apply_one;
using testing::expect_close;
using testing::rnd;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kBig = 3e38f;  // doubled by the base op: ±inf


/// `t` (contiguous f32) with NaN, +big and -big written at the given flat indices.
Tensor with_specials(const Tensor& t, int64_t nan_at, int64_t pos_at, int64_t neg_at) {
  std::vector<float> v = t.contiguous().to_vector<float>();
  v[static_cast<size_t>(nan_at)] = kNaN;
  v[static_cast<size_t>(pos_at)] = kBig;
  v[static_cast<size_t>(neg_at)] = -kBig;
  return tensor<float>(v, t.int_sizes());
}

/// 2·I of size n×n (f32).
Tensor twice_identity(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n * n), 0.0f);
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i * n + i)] = 2.0f;
  return tensor<float>(v, {n, n});
}

/// A per-channel operand of `n` values (shaped `shape`) holding NaN, +inf and -inf among finite ones.
Tensor special_operand(int64_t n, const IntVec& shape) {
  std::vector<float> v = rnd({n}).to_vector<float>();
  v[1] = kNaN;
  v[2] = std::numeric_limits<float>::infinity();
  v[3] = -std::numeric_limits<float>::infinity();
  return tensor<float>(v, shape);
}

/// Every post-op kind alone (operands #3..#6), with parameters that reach both sides of each
/// saturation, and lists mixing them (the `sum` form first, an activation after a binary op).
std::vector<std::string> lists() {
  return {"relu", "sigmoid", "tanh", "swish(1)", "swish(0.5)", "hardswish", "hardsigmoid", "gelu_erf", "gelu_tanh",
          "clamp(0, 6)", "clamp(-inf, 0.5)", "clamp(-1, inf)", "linear(0.5, -1)", "add(#3)", "sub(#3)", "mul(#3)",
          "div(#3)", "batch_norm(#3, #4, #5, #6, 1e-05)", "add(#3), relu", "relu, add(#3)", "mul(#3), clamp(0, 6)",
          "linear(2, 0.25), hardswish, relu", "hardsigmoid, relu, tanh"};
}

/// Operand tensors for a list: #3 per channel (also batch_norm's w), #4 b, #5 mean, #6 var (>= 0).
std::vector<Tensor> operands(const std::string& list, int64_t channels, const IntVec& shape) {
  std::vector<Tensor> out;
  if (list.find("#3") != std::string::npos) out.push_back(special_operand(channels, shape));
  if (list.find("batch_norm") != std::string::npos) {
    out.push_back(special_operand(channels, {channels}));
    out.push_back(special_operand(channels, {channels}));
    out.push_back(abs(special_operand(channels, {channels})));
  }
  return out;
}

// `channels`: the size of the operands' broadcast dim (`operand_shape`); batch_norm's operands have
// the output's dim 1 (`bn_channels`, default `channels`).
void check(OpKind base, OpKind fused, std::vector<Tensor> in, ops::Attrs attrs, size_t nbase, int64_t channels,
           const IntVec& operand_shape, const std::string& what, int64_t bn_channels = -1) {
  if (bn_channels < 0) bn_channels = channels;
  for (const std::string& list : lists()) {
    std::vector<Tensor> all(in.begin(), in.begin() + static_cast<int64_t>(nbase));
    const bool bn = list.find("batch_norm") != std::string::npos;
    for (const Tensor& t : operands(list, bn ? bn_channels : channels, bn ? IntVec{bn_channels} : operand_shape))
      all.push_back(t);
    if (nbase == 2) {  // matmul's operands start at #2: renumber #3.. to #2..
      std::string l = list;
      for (int k = 3; k <= 6; ++k) {
        std::string from = fmt::format("#{}", k), to = fmt::format("#{}", k - 1);
        for (size_t at = l.find(from); at != std::string::npos; at = l.find(from, at)) l.replace(at, from.size(), to);
      }
      ops::Attrs a = attrs;
      Tensor want = ops::run_eager(base, std::vector<Tensor>{all[0], all[1]}, a)[0];
      for (const PostOp& p : ops::parse_post_ops(l)) want = apply_one(want, p, all);
      a.set("post_ops", l);
      expect_close(ops::run_eager(fused, all, a)[0], want, what + " [" + l + "]");
      continue;
    }
    Tensor want = ops::run_eager(base, std::vector<Tensor>{all[0], all[1], all[2]}, attrs)[0];
    for (const PostOp& p : ops::parse_post_ops(list)) want = apply_one(want, p, all);
    ops::Attrs a = attrs;
    a.set("post_ops", list);
    expect_close(ops::run_eager(fused, all, a)[0], want, what + " [" + list + "]");
  }
}

ops::Attrs conv_attrs(int64_t pad) {
  return {{"stride", to_symint_vec({1, 1})}, {"padding", to_symint_vec({pad, pad})},
          {"dilation", to_symint_vec({1, 1})}, {"groups", SymInt(1)}};
}

TEST(PostOpsNaN, LinearAndMatmulKeepNaNAndInf) {
  manual_seed(31);
  const int64_t K = 16;
  // y = 2x: row 0 all NaN, row 1 one +inf, row 2 one -inf, the other rows finite of both signs
  Tensor x = with_specials(rnd({6, K}, 3.0), 0 * K + 1, 1 * K + 2, 2 * K + 3);
  Tensor w = twice_identity(K), b = zeros({K});
  check(OpKind::linear, OpKind::linear_fused, {x, w, b}, {}, 3, K, {K}, "linear");
  check(OpKind::matmul, OpKind::matmul_fused, {x, w}, {}, 2, K, {K}, "matmul");
  // a batched matmul with a larger inner dim (oneDNN's own kernel rather than a tiny-product path)
  Tensor xb = with_specials(rnd({2, 40, 64}, 3.0), 5, 64 * 7 + 9, 64 * 40 + 11);
  check(OpKind::matmul, OpKind::matmul_fused, {xb, twice_identity(64)}, {}, 2, 64, {64}, "matmul 2x40x64", 40);
}

TEST(PostOpsNaN, ConvKeepsNaNAndInf) {
  manual_seed(32);
  // 1x1 with 2·I weights: pixel 0 all NaN, pixel 1 +inf in channel 1, pixel 2 -inf in channel 2
  const int64_t C = 16, HW = 7 * 9;
  Tensor x = with_specials(rnd({2, C, 7, 9}, 3.0), 0, 1 * HW + 1, 2 * HW + 2);
  Tensor w = reshape(twice_identity(C), to_symint_vec({C, C, 1, 1}));
  check(OpKind::conv2d, OpKind::conv2d_fused, {x, w, zeros({C})}, conv_attrs(0), 3, C, {C, 1, 1}, "conv2d 1x1");
  // 3x3, 32 channels (a blocked oneDNN kernel): NaN and inf spread through the window sums
  Tensor x3 = with_specials(rnd({1, 32, 10, 12}, 3.0), 13, 120 * 3 + 50, 120 * 20 + 77);
  check(OpKind::conv2d, OpKind::conv2d_fused, {x3, rnd({32, 32, 3, 3}, 0.2), rnd({32})}, conv_attrs(1), 3, 32,
        {32, 1, 1}, "conv2d 3x3");
}

// The two finishing paths outside a fused primitive, in f32 and f64.
TEST(PostOpsNaN, EpilogueAndLoopsKeepNaN) {
  Tensor y = with_specials(rnd({2, 16, 5, 3}, 3.0), 4, 17, 40);
  y = mul(y, 2.0);
  for (const std::string& list : lists()) {
    std::vector<Tensor> in{Tensor(), Tensor(), Tensor()};
    for (const Tensor& t : operands(list, 16, list.find("batch_norm") != std::string::npos ? IntVec{16} : IntVec{16, 1, 1}))
      in.push_back(t);
    std::vector<PostOp> ops = ops::parse_post_ops(list);
    Tensor want = y;
    for (const PostOp& p : ops) want = apply_one(want, p, in);
    expect_close(ops::apply_post_ops(y.clone(), ops, in), want, "loops f32 [" + list + "]");
    expect_close(ops::run_post_ops(y.clone(), ops, in), want, "epilogue [" + list + "]");
    std::vector<Tensor> in64;
    for (const Tensor& t : in) in64.push_back(t.defined() ? t.to(DType::F64) : t);
    Tensor want64 = y.to(DType::F64);
    for (const PostOp& p : ops) want64 = apply_one(want64, p, in64);
    expect_close(ops::apply_post_ops(y.to(DType::F64), ops, in64), want64, "loops f64 [" + list + "]", 1e-9);
  }
}

// End to end: what the cpu backend fuses (conv / linear + relu or clamp) on an all-NaN input, and on
// a NaN weight, gives eager's NaN.
TEST(PostOpsNaN, CpuBackendFusionKeepsNaN) {
  testing::use_test_cache_dir();
  manual_seed(33);
  auto conv_relu = [](const Tensor& x, const Tensor& w, const Tensor& b) { return relu(conv2d(x, w, b)); };
  auto linear_clamp = [](const Tensor& x, const Tensor& w, const Tensor& b) { return clamp(linear(x, w, b), 0.0, 6.0); };
  auto fc = compile(conv_relu, {.name = "conv_relu", .arg_names = {"x", "w", "b"}, .backend = "cpu"});
  auto fl = compile(linear_clamp, {.name = "linear_clamp", .arg_names = {"x", "w", "b"}, .backend = "cpu"});
  Tensor xn = full(to_symint_vec({1, 8, 6, 6}), kNaN), w = rnd({16, 8, 3, 3}, 0.3), b = rnd({16});
  expect_close(fc(xn, w, b), conv_relu(xn, w, b), "conv2d + relu, all-NaN input");
  Tensor x = rnd({1, 8, 6, 6});
  Tensor wn = with_specials(w, 5, 6, 7);
  expect_close(fc(x, wn, b), conv_relu(x, wn, b), "conv2d + relu, NaN/inf weights");
  Tensor xl = with_specials(rnd({4, 32}), 3, 40, 70), wl = rnd({24, 32}, 0.2), bl = rnd({24});
  expect_close(fl(xl, wl, bl), linear_clamp(xl, wl, bl), "linear + clamp(0, 6)");
}

}  // namespace
}  // namespace protean::backend::cpu
