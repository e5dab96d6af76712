// Post-op fusion: the post-op text form, the fused extern ops in eager (oneDNN post-ops, the `sum`
// form, and the plain-loop fallback) against the unfused composition, the cpu backend's rewrite
// (what fuses, what must not, constant folding into weights), and fused vs unfused vs interp on
// random and symbolic shapes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <cstdlib>
#include <functional>
#include <random>
#include <thread>

#include "backend/cpu/fuse_post_ops.h"
#include "backend/cpu/pipeline.h"
#include "backend/interp/interp.h"
#include "cpu_test_util.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ir_test_util.h"
#include "ops/dnnl_util.h"
#include "ops/post_ops.h"
#include "core/source_location.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu {
namespace {

using ir::kNoValue;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::Built;
using testing::apply_one;
using testing::expect_close;
using testing::finish;
using testing::rnd;
using testing::use_test_cache_dir;
using ops::PostOp;
using ops::PostOpKind;

int count_op(const ir::Graph& g, OpKind op) {
  int n = 0;
  for (const ir::Node& node : g.nodes()) n += node.kind == ir::NodeKind::Call && node.op == op;
  return n;
}

std::string post_ops_of(const ir::Graph& g, OpKind op) {
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && n.op == op) return n.attrs.s("post_ops");
  return "";
}

// ---- text form ---------------------------------------------------------------------------------------
TEST(PostOps, TextRoundTrips) {
  std::string text = "linear(0.5, -3), hardswish, add(#3), clamp(-inf, 6), swish(1.5), batch_norm(_, #4, #5, #6, 1e-05), "
                     "gelu_erf, gelu_tanh, relu, sigmoid, tanh, hardsigmoid, sub(#7), mul(#8), div(#9)";
  std::vector<PostOp> p = ops::parse_post_ops(text);
  ASSERT_EQ(p.size(), 15u);
  EXPECT_EQ(p[0].kind, PostOpKind::linear);
  EXPECT_EQ(p[0].alpha, 0.5);
  EXPECT_EQ(p[0].beta, -3);
  EXPECT_EQ(p[2].operand[0], 3);
  EXPECT_TRUE(std::isinf(p[3].alpha) && p[3].alpha < 0);
  EXPECT_EQ(p[5].operand, (std::array<int, 4>{-1, 4, 5, 6}));
  EXPECT_EQ(p[5].alpha, 1e-5);
  EXPECT_EQ(ops::post_ops_text(p), text);
  EXPECT_EQ(ops::parse_post_ops(ops::post_ops_text(p)), p);
  EXPECT_EQ(ops::post_ops_text(ops::parse_post_ops("silu")), "swish(1)");
  // a double that needs 17 digits survives
  PostOp lin{PostOpKind::linear, 0.1 + 0.2, 1.0 / 3.0};
  EXPECT_EQ(ops::parse_post_ops(ops::post_ops_text({lin}))[0], lin);
}

TEST(PostOps, BadTextNamesTheEntry) {
  auto msg = [](const std::string& t) {
    try {
      ops::parse_post_ops(t);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("relu, softplus").find("'softplus' is not a post-op"), std::string::npos) << msg("relu, softplus");
  EXPECT_NE(msg("clamp(0)").find("needs 2 argument(s)"), std::string::npos);
  EXPECT_NE(msg("add(3)").find("where an input (#k) belongs"), std::string::npos);
  EXPECT_NE(msg("linear(a, 1)").find("bad number 'a'"), std::string::npos);
  EXPECT_NE(msg("relu,,tanh").find("empty entry"), std::string::npos);
  EXPECT_NE(msg("").find("empty"), std::string::npos);
}

// ---- eager fused ops vs the unfused composition ---------------------------------------------------------


/// Runs `fused` on base inputs + operands and compares with the base op followed by the post-ops.
void check_fused(OpKind base, OpKind fused, std::vector<Tensor> in, ops::Attrs attrs, const std::string& post,
                 const std::string& what, double tol = 2e-4) {
  size_t nbase = base == OpKind::matmul ? 2 : 3;
  std::vector<Tensor> base_in(in.begin(), in.begin() + static_cast<int64_t>(nbase));
  Tensor want = ops::run_eager(base, base_in, attrs)[0];
  for (const PostOp& p : ops::parse_post_ops(post)) want = apply_one(want, p, in);
  attrs.set("post_ops", post);
  Tensor got = ops::run_eager(fused, in, attrs)[0];
  expect_close(got, want, what + " [" + post + "]", tol);
}

ops::Attrs conv_attrs(IntVec stride, IntVec padding, int64_t groups) {
  return {{"stride", to_symint_vec(stride)}, {"padding", to_symint_vec(padding)},
          {"dilation", to_symint_vec(IntVec(stride.size(), 1))}, {"groups", SymInt(groups)}};
}

// The last ones repeat an eltwise algorithm with other parameters (oneDNN 2.6's brgemm kernels get
// that wrong; a repeated linear becomes binary ops, other repeats fall back to loops).
const char* kEltwiseLists[] = {"relu", "sigmoid", "tanh", "swish(1)", "swish(0.75)", "hardswish", "hardsigmoid",
                               "gelu_erf", "gelu_tanh", "clamp(0, 6)", "clamp(-0.5, inf)", "linear(0.5, -1)",
                               "linear(2, 0.25), hardswish, linear(0.3, 0.1)", "linear(0.5, 1), hardsigmoid",
                               "hardsigmoid, linear(2, -1)", "clamp(0, 6), tanh, clamp(-0.5, 0.5)",
                               "swish(1), swish(2)"};

TEST(PostOps, EagerConv2dFusedMatchesComposition) {
  manual_seed(7);
  // plain NCHW (1x1, GEMM kernel), blocked (3x3 with 32 channels), depthwise (blocked, nhwc)
  struct Case {
    int64_t N, C, O, H, W, k, g;
  };
  for (Case c : {Case{2, 8, 16, 9, 11, 1, 1}, Case{1, 32, 32, 12, 20, 3, 1}, Case{2, 24, 24, 10, 13, 3, 24}}) {
    std::string what = fmt::format("conv2d N{} C{} O{} {}x{} k{} g{}", c.N, c.C, c.O, c.H, c.W, c.k, c.g);
    Tensor x = rnd({c.N, c.C, c.H, c.W}), w = rnd({c.O, c.C / c.g, c.k, c.k}, 0.3), b = rnd({c.O});
    ops::Attrs a = conv_attrs({1, 1}, {c.k / 2, c.k / 2}, c.g);
    for (const char* post : kEltwiseLists) check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b}, a, post, what);
    Tensor ch = rnd({c.O, 1, 1}), sc = rnd({1}), full = rnd({c.N, c.O, c.H, c.W});
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, ch, sc}, a, "mul(#3), relu, add(#4)", what);
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, ch, sc}, a, "add(#3), relu, add(#4)", what);
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, ch, sc}, a, "mul(#3), mul(#4)", what);
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, ch}, a, "sub(#3)", what);
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, add(abs(ch), 0.5)}, a, "div(#3)", what);
    // residual first (the `sum` form on a blocked destination), then an activation
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, full}, a, "add(#3), relu", what);
    // residual after another post-op: oneDNN would switch kernels, so the kernel falls back to loops
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, Tensor(), full}, a, "hardswish, add(#3)", what);
    // a non-contiguous operand
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, permute(rnd({c.N, c.W, c.H, c.O}), {0, 3, 2, 1})}, a,
                "mul(#3)", what);
    // batch_norm with and without affine parameters
    Tensor mean = rnd({c.O}), var = add(abs(rnd({c.O})), 0.1), gw = rnd({c.O}), gb = rnd({c.O});
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, gw, gb, mean, var}, a,
                "batch_norm(#3, #4, #5, #6, 1e-05), hardswish", what);
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {x, w, b, mean, var}, a, "batch_norm(_, _, #3, #4, 0.001)",
                what);
  }
}

// A 1-pixel conv's post-ops run as eager's loops: NaN passes through relu and clamp, -inf saturates.
TEST(PostOps, OnePixelConvKeepsNaN) {
  Tensor x = full({1, 20, 1, 1}, 1.0);
  x.data_ptr<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  Tensor w = full({3, 20, 1, 1}, 0.5);
  w.data_ptr<float>()[2 * 20 + 3] = 0.0f;  // 0 · NaN is still NaN
  Tensor b = full({3}, -100.0);
  ops::Attrs a = conv_attrs({1, 1}, {0, 0}, 1);
  for (const char* post : {"relu", "clamp(0, 6)", "hardsigmoid"}) {
    a.set("post_ops", post);
    std::vector<Tensor> in{x, w, b};
    Tensor y = ops::run_eager(OpKind::conv2d_fused, in, a)[0];
    ASSERT_EQ(y.int_numel(), 3);
    for (int o = 0; o < 3; ++o) EXPECT_TRUE(std::isnan(y.data_ptr<float>()[o])) << post << " output " << o;
  }
  x.data_ptr<float>()[3] = -std::numeric_limits<float>::infinity();
  a.set("post_ops", "relu");
  std::vector<Tensor> in{x, w, b};
  Tensor y = ops::run_eager(OpKind::conv2d_fused, in, a)[0];
  EXPECT_EQ(y.data_ptr<float>()[0], 0.0f);
  EXPECT_TRUE(std::isnan(y.data_ptr<float>()[2]));  // 0 · -inf
}

TEST(PostOps, EagerConv1dUnbatchedTransposedAndF64) {
  manual_seed(8);
  Tensor x = rnd({2, 6, 17}), w = rnd({10, 6, 3}, 0.3), b = rnd({10});
  ops::Attrs a1 = conv_attrs({1}, {1}, 1);
  for (const char* post : kEltwiseLists) check_fused(OpKind::conv1d, OpKind::conv1d_fused, {x, w, b}, a1, post, "conv1d");
  check_fused(OpKind::conv1d, OpKind::conv1d_fused, {x, w, b, rnd({10, 1}), rnd({2, 10, 17})}, a1, "mul(#3), add(#4)",
              "conv1d");
  // unbatched conv2d: the channel dim is dim 0
  Tensor xu = rnd({16, 9, 7}), wu = rnd({16, 16, 3, 3}, 0.2);
  check_fused(OpKind::conv2d, OpKind::conv2d_fused, {xu, wu, Tensor(), rnd({16, 1, 1}), rnd({16, 9, 7})},
              conv_attrs({1, 1}, {1, 1}, 1), "add(#3), tanh, add(#4)", "unbatched conv2d");
  // 1x1 convs of 1x1 images (squeeze-and-excitation): the product and the post-ops outside oneDNN
  ops::Attrs a11 = conv_attrs({1, 1}, {0, 0}, 1);
  for (const char* post : {"relu", "hardsigmoid", "hardswish, linear(0.5, 0.25)"})
    check_fused(OpKind::conv2d, OpKind::conv2d_fused, {rnd({2, 240, 1, 1}), rnd({60, 240, 1, 1}, 0.1), rnd({60})}, a11,
                post, "1-pixel conv2d");
  check_fused(OpKind::conv2d, OpKind::conv2d_fused, {rnd({1, 60, 1, 1}), rnd({240, 60, 1, 1}, 0.1), rnd({240}),
                                                      rnd({1, 240, 1, 1})},
              a11, "add(#3), sigmoid", "1-pixel conv2d, binary post-op");
  // transposed: [C, O/g, kh, kw]
  Tensor xt = rnd({1, 24, 8, 8}), wt = rnd({24, 12, 2, 2}, 0.3), bt = rnd({12});
  ops::Attrs at{{"stride", to_symint_vec({2, 2})}, {"padding", to_symint_vec({0, 0})},
                {"output_padding", to_symint_vec({0, 0})}, {"dilation", to_symint_vec({1, 1})}, {"groups", SymInt(1)}};
  for (const char* post : {"relu", "sigmoid", "hardswish"})
    check_fused(OpKind::conv_transpose2d, OpKind::conv_transpose2d_fused, {xt, wt, bt}, at, post, "conv_transpose2d");
  check_fused(OpKind::conv_transpose2d, OpKind::conv_transpose2d_fused, {xt, wt, bt, rnd({12, 1, 1})}, at,
              "add(#3), relu", "conv_transpose2d");
  // f64: no oneDNN; the post-ops run as loops in double
  Tensor xd = x.to(DType::F64), wd = w.to(DType::F64), bd = b.to(DType::F64);
  check_fused(OpKind::conv1d, OpKind::conv1d_fused, {xd, wd, bd, rnd({10, 1}).to(DType::F64)}, a1,
              "gelu_erf, mul(#3), clamp(-1, 1)", "conv1d f64", 1e-9);
}

TEST(PostOps, EagerLinearAndMatmulFusedMatchComposition) {
  manual_seed(9);
  Tensor x = rnd({3, 5, 64}), w = rnd({48, 64}, 0.2), b = rnd({48});
  for (const char* post : kEltwiseLists) check_fused(OpKind::linear, OpKind::linear_fused, {x, w, b}, {}, post, "linear");
  Tensor res = rnd({3, 5, 48}), col = rnd({48}), sc = rnd({});
  check_fused(OpKind::linear, OpKind::linear_fused, {x, w, b, res, col}, {}, "add(#3), swish(1), mul(#4)", "linear");
  check_fused(OpKind::linear, OpKind::linear_fused, {x, w, Tensor(), sc}, {}, "div(#3), relu", "linear no bias");
  // tiny product (cblas, loops) and a batch that needs several oneDNN calls
  check_fused(OpKind::linear, OpKind::linear_fused, {rnd({2, 8}), rnd({4, 8}), rnd({4}), rnd({2, 4})}, {},
              "add(#3), sigmoid", "tiny linear");
  Tensor a = rnd({4, 40, 120}), m = rnd({120, 96}, 0.1);
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a, m, rnd({96}), rnd({4, 40, 96})}, {}, "add(#2), gelu_tanh, add(#3)",
              "matmul");
  Tensor bm = rnd({4, 120, 64}, 0.1);
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a, bm, rnd({4, 40, 64})}, {}, "add(#2), relu", "batched matmul");
  Tensor at = transpose(rnd({4, 120, 40}), 1, 2);  // a strided left operand
  check_fused(OpKind::matmul, OpKind::matmul_fused, {at, m, rnd({40, 1})}, {}, "mul(#2), hardswish", "strided matmul");
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a.to(DType::F64), m.to(DType::F64), rnd({96}).to(DType::F64)}, {},
              "add(#2), tanh", "matmul f64", 1e-9);
  // a leading add of a vector along N runs as oneDNN's bias: alone (nothing left for the post-op list),
  // as [1, N] before a residual, on a transposed left operand (PP-OCRv4 rec's head), in a tiny product
  // (OpenBLAS, the bias added by the kernel's loop), and a strided vector that stays a binary post-op
  Tensor a2 = rnd({1, 20, 120});
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a2, m, rnd({96})}, {}, "add(#2)", "matmul bias only");
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a2, m, rnd({1, 96}), rnd({1, 20, 96})}, {}, "add(#2), add(#3)",
              "matmul [1, N] bias and residual");
  check_fused(OpKind::matmul, OpKind::matmul_fused, {transpose(rnd({1, 120, 20}), 1, 2), m, rnd({96})}, {}, "add(#2)",
              "matmul bias, transposed left operand");
  check_fused(OpKind::matmul, OpKind::matmul_fused, {rnd({2, 8}), rnd({8, 4}), rnd({4}), rnd({2, 4})}, {},
              "add(#2), mul(#3)", "tiny matmul bias");
  Tensor strided = slice(rnd({192}), 0, 0, 192, 2);
  check_fused(OpKind::matmul, OpKind::matmul_fused, {a2, m, strided}, {}, "add(#2), swish(1)", "matmul strided vector");
}

// The two ways a result is finished outside a fused primitive: run_post_ops (a oneDNN binary
// primitive carrying the list) and apply_post_ops (plain loops; f32 in one blocked pass, other
// dtypes per post-op), on operands with strides, broadcasting along inner dims and batch_norm.
TEST(PostOps, EpilogueAndLoopsMatchComposition) {
  manual_seed(10);
  IntVec shape{2, 5, 7, 33};
  Tensor full_op = permute(rnd({2, 33, 7, 5}), {0, 3, 2, 1});  // non-contiguous
  Tensor row = rnd({1, 1, 7, 1}), last = rnd({33}), ch = rnd({5, 1, 1}), sc = rnd({});
  Tensor mean = rnd({5}), var = add(abs(rnd({5})), 0.2), gw = rnd({5});
  std::vector<Tensor> in{Tensor(), full_op, row, last, ch, sc, gw, mean, var};
  const char* lists[] = {"relu, add(#1)", "mul(#2), hardswish, sub(#3)", "div(#4), gelu_tanh, add(#5)",
                         "batch_norm(#6, _, #7, #8, 0.001), sigmoid", "linear(0.5, 1), hardsigmoid, clamp(-0.2, 0.7)",
                         "swish(1.5), tanh, gelu_erf"};
  for (const char* text : lists) {
    std::vector<PostOp> ops = ops::parse_post_ops(text);
    std::vector<Tensor> used = in;
    Tensor y = rnd(shape);
    Tensor want = y;
    for (const PostOp& p : ops) want = apply_one(want, p, used);
    expect_close(ops::apply_post_ops(y.clone(), ops, used), want, std::string("loops f32 ") + text);
    expect_close(ops::run_post_ops(y.clone(), ops, used), want, std::string("epilogue ") + text);
    std::vector<Tensor> used64;
    for (const Tensor& t : used) used64.push_back(t.defined() ? t.to(DType::F64) : t);
    Tensor want64 = y.to(DType::F64);
    for (const PostOp& p : ops) want64 = apply_one(want64, p, used64);
    expect_close(ops::apply_post_ops(y.to(DType::F64), ops, used64), want64, std::string("loops f64 ") + text, 1e-9);
  }
  // a per-channel list on a conv-shaped result builds one JIT primitive (then hits it)
  ops::reset_dnnl_stats();
  Tensor y = rnd({3, 5, 11, 13});
  std::vector<PostOp> ops = ops::parse_post_ops("hardswish, mul(#4)");
  ops::run_post_ops(y.clone(), ops, in);
  ops::run_post_ops(y.clone(), ops, in);
  EXPECT_EQ(ops::dnnl_stats().primitives_created, 1) << ops::dnnl_stats_json();
  EXPECT_EQ(ops::dnnl_stats().cache_hits, 1) << ops::dnnl_stats_json();
}

TEST(PostOps, MetaChecksOperands) {
  Tensor x = randn({1, 4, 6, 6}), w = randn({8, 4, 1, 1});
  ops::Attrs a = conv_attrs({1, 1}, {0, 0}, 1);
  auto run = [&](std::vector<Tensor> in, const std::string& post) {
    ops::Attrs at = a;
    at.set("post_ops", post);
    return ops::run_eager(OpKind::conv2d_fused, in, at);
  };
  // an operand that would grow the output: [2, 8, 6, 6] against [1, 8, 6, 6]
  EXPECT_THROW(run({x, w, Tensor(), randn({2, 8, 6, 6})}, "add(#3)"), ShapeError);
  EXPECT_THROW(run({x, w, Tensor(), randn({8, 6})}, "add(#3)"), ShapeError);
  EXPECT_THROW(run({x, w, Tensor(), randn({8, 1, 1}).to(DType::F64)}, "add(#3)"), TypeError);
  EXPECT_THROW(run({x, w, Tensor(), randn({8, 1, 1})}, "relu"), ValueError);           // operand not used
  EXPECT_THROW(run({x, w, Tensor(), randn({8, 1, 1})}, "add(#3), mul(#3)"), ValueError);  // used twice
  EXPECT_THROW(run({x, w, Tensor()}, "add(#4)"), ValueError);
  EXPECT_THROW(run({x, w, Tensor(), randn({7}), randn({8})}, "batch_norm(_, _, #3, #4, 1e-05)"), ShapeError);
  EXPECT_THROW(run({x, w, Tensor()}, "clamp(1, 0)"), ValueError);
  EXPECT_NO_THROW(run({x, w, Tensor(), randn({8, 1, 1})}, "add(#3)"));
}

// ---- the rewrite ------------------------------------------------------------------------------------------
/// Runs the pass on a copy; checks it verifies and round-trips through the IR text.
ir::Graph fused_copy(const Built& b, FusePostOpsStats* stats = nullptr) {
  ir::Graph g = *b.g;
  FusePostOpsStats s = fuse_post_ops(g);
  if (stats) *stats = s;
  ir::verify(g);
  std::string text = ir::print(g);
  EXPECT_EQ(ir::print(ir::parse(text)), text);
  return g;
}

/// cpu backend (with fusion) and the interpreter on the fused graph, both against the interpreter on
/// the original graph, for each shape.
void differential(const Built& b, const std::function<std::vector<Tensor>(int64_t, int64_t)>& inputs,
                  const std::vector<std::pair<int64_t, int64_t>>& sizes, CpuCompileInfo* info_out = nullptr,
                  double tol = 2e-4) {
  use_test_cache_dir();
  BackendInput in{b.g, b.syms, "0/0", "default"};
  CpuCompileInfo info;
  auto cpu = compile_cpu(in, &info);
  if (info_out) *info_out = info;
  Interpreter plain(b.g, b.syms);
  Interpreter fused(fused_copy(b), b.syms);
  for (auto [s0, s1] : sizes) {
    std::vector<Tensor> x = inputs(s0, s1);
    std::vector<int64_t> sv;
    if (b.syms.size() >= 1) sv.push_back(s0);
    if (b.syms.size() >= 2) sv.push_back(s1);
    std::vector<Tensor> want = plain.run(x, std::span<const int64_t>(sv));
    std::vector<Tensor> got_cpu = cpu->run(x, sv);
    std::vector<Tensor> got_fused = fused.run(x, std::span<const int64_t>(sv));
    for (size_t i = 0; i < want.size(); ++i) {
      expect_close(got_cpu[i], want[i], fmt::format("cpu output {} at {}x{}", i, s0, s1), tol);
      expect_close(got_fused[i], want[i], fmt::format("interp on the fused graph, output {} at {}x{}", i, s0, s1), tol);
    }
  }
}

ops::Attrs conv2d_attrs(int64_t pad, int64_t groups = 1) { return conv_attrs({1, 1}, {pad, pad}, groups); }

// PP-OCR's block, as exported: conv → x·a + b → x·clamp(x + 3, 0, 6)/6 → x·c + d, with symbolic batch
// and width; and the conv → batch_norm → conv stem.
TEST(PostOpFusion, OnnxStyleConvBlockWithSymbolicBatchAndWidth) {
  manual_seed(11);
  GraphBuilder b("block");
  SymInt n = b.symbol("x.size()[0]", 2), wd = b.symbol("x.size()[3]", 20);
  ValueId x = b.input("x", {n, 8, 12, wd});
  ValueId w0 = b.constant(rnd({16, 8, 3, 3}, 0.2)), b0 = b.constant(rnd({16}));
  ValueId c = b.call(OpKind::conv2d, {x, w0, b0}, conv2d_attrs(1));
  ValueId bn = b.call(OpKind::batch_norm, {c, b.constant(rnd({16})), b.constant(rnd({16})), b.constant(rnd({16})),
                                          b.constant(add(abs(rnd({16})), 0.5))},
                      {{"eps", 1e-5}});
  ValueId c1 = b.call(OpKind::conv2d, {bn, b.constant(rnd({16, 1, 3, 3}, 0.3)), b.constant(rnd({16}))},
                      conv2d_attrs(1, 16));
  ValueId s = b.call(OpKind::mul, {b.constant(tensor<float>({1.3f}, {1})), c1});
  ValueId t = b.call(OpKind::add, {s, b.constant(tensor<float>({0.2f}, {1}))});
  ValueId p3 = b.call(OpKind::add, {t, b.constant(scalar_tensor(3.0))});
  ValueId cl = b.call(OpKind::clamp, {p3}, {{"min", 0.0}, {"max", 6.0}});
  ValueId m = b.call(OpKind::mul, {t, cl});
  ValueId hs = b.call(OpKind::div, {m, b.constant(scalar_tensor(6.0))});
  ValueId u = b.call(OpKind::mul, {b.constant(tensor<float>({0.7f}, {1})), hs});
  ValueId v = b.call(OpKind::add, {u, b.constant(tensor<float>({-0.1f}, {1}))});
  Built g = finish(b, {v}, {n, wd});

  FusePostOpsStats st;
  ir::Graph f = fused_copy(g, &st);
  EXPECT_EQ(count_op(f, OpKind::batch_norm), 0);
  EXPECT_EQ(count_op(f, OpKind::clamp), 0);
  EXPECT_EQ(count_op(f, OpKind::conv2d), 1) << ir::print(f);  // the stem: batch_norm folded into its weights
  EXPECT_EQ(count_op(f, OpKind::conv2d_fused), 1) << ir::print(f);
  EXPECT_EQ(count_op(f, OpKind::mul) + count_op(f, OpKind::add) + count_op(f, OpKind::div), 0) << ir::print(f);
  EXPECT_EQ(post_ops_of(f, OpKind::conv2d_fused), "hardswish, linear(0.699999988079071, -0.10000000149011612)")
      << ir::print(f);
  EXPECT_EQ(st.fused_calls, 1);
  EXPECT_EQ(st.post_ops, 1 + 1);
  EXPECT_EQ(st.folded_links, 1 + 2);  // batch_norm; 1.3·x and + 0.2

  CpuCompileInfo info;
  differential(g, [](int64_t s0, int64_t s1) { return std::vector<Tensor>{rnd({s0, 8, 12, s1})}; },
               {{2, 20}, {3, 33}, {1, 7}}, &info);
  EXPECT_EQ(info.fused_externs, 1);
  EXPECT_EQ(info.fused_post_ops, 2);
  EXPECT_EQ(info.kernels, 0);  // nothing left for generated code
  EXPECT_EQ(info.externs, 2);
  // The loop IR shows the post-ops on the extern.
  EXPECT_NE(info.loop_ir.find("extern conv2d_fused("), std::string::npos) << info.loop_ir;
  EXPECT_NE(info.loop_ir.find("post_ops=\"hardswish, linear("), std::string::npos) << info.loop_ir;
}

// Folded weights come from 4 MiB blocks shared by the convolutions of one pass (fuse_post_ops.cpp
// FoldArena) once the first 256 KiB of them have come from the ordinary allocator: the later ones sit in
// one block, one larger than half a block gets its own storage, and all stay valid after the pass
// and its input graph are gone.
TEST(PostOpFusion, FoldedWeightsShareBlocksAndOutliveThePass) {
  manual_seed(23);
  GraphBuilder b("many_folds");
  SymInt n = b.symbol("x.size()[0]", 2);
  ValueId x = b.input("x", {n, 8, 6, 6});
  ValueId h = x;
  int64_t cin = 8;
  // weights of 36 KiB (ordinary allocator), then five of 576 KiB and one of 36 KiB (one block)
  for (int64_t cout : {128, 128, 128, 128, 128, 128, 8}) {
    h = b.call(OpKind::conv2d, {h, b.constant(rnd({cout, cin, 3, 3}, 0.05)), b.constant(rnd({cout}))}, conv2d_attrs(1));
    h = b.call(OpKind::batch_norm, {h, b.constant(rnd({cout})), b.constant(rnd({cout})), b.constant(rnd({cout})),
                                    b.constant(add(abs(rnd({cout})), 0.5))},
               {{"eps", 1e-5}});
    cin = cout;
  }
  // 520·8·3·3·... : a 520×520×3×3 weight (9.7 MB) is more than half a block
  h = b.call(OpKind::conv2d, {h, b.constant(rnd({520, 8, 3, 3}, 0.1)), b.constant(rnd({520}))}, conv2d_attrs(1));
  h = b.call(OpKind::conv2d, {h, b.constant(rnd({520, 520, 3, 3}, 0.02)), b.constant(rnd({520}))}, conv2d_attrs(1));
  h = b.call(OpKind::batch_norm, {h, b.constant(rnd({520})), b.constant(rnd({520})), b.constant(rnd({520})),
                                  b.constant(add(abs(rnd({520})), 0.5))},
             {{"eps", 1e-5}});
  Built g = finish(b, {h}, {n});
  FusePostOpsStats st;
  ir::Graph f = fused_copy(g, &st);
  EXPECT_EQ(count_op(f, OpKind::batch_norm), 0) << ir::print(f);
  EXPECT_EQ(st.folded_links, 8);
  std::vector<const char*> mid;  // the 128x128 weights, in graph order
  for (const ir::Node& node : f.nodes()) {
    if (node.kind != ir::NodeKind::Constant) continue;
    const IntVec sz = node.constant.int_sizes();
    if (sz == IntVec{128, 128, 3, 3}) mid.push_back(static_cast<const char*>(node.constant.data_ptr()));
  }
  ASSERT_EQ(mid.size(), 5u);
  for (size_t i = 1; i < mid.size(); ++i)  // after the first 256 KiB: one block
    EXPECT_LT(std::abs(mid[i] - mid[0]), std::ptrdiff_t{4} << 20) << "weight " << i;
  // The fused graph alone (the original and the pass are gone) against the original's interpreter.
  auto fused = std::make_shared<const ir::Graph>(std::move(f));
  Interpreter want(g.g, g.syms);
  for (int64_t s0 : {1, 2}) {
    std::vector<Tensor> in{rnd({s0, 8, 6, 6})};
    std::vector<int64_t> sv{s0};
    Interpreter got(fused, g.syms);
    expect_close(got.run(in, std::span<const int64_t>(sv))[0], want.run(in, std::span<const int64_t>(sv))[0],
                 fmt::format("batch {}", s0), 2e-3);
  }
  differential(g, [](int64_t s0, int64_t) { return std::vector<Tensor>{rnd({s0, 8, 6, 6})}; }, {{1, 0}, {2, 0}}, nullptr,
               2e-3);
}

// Every eltwise kind after a graph-input weight (no folding), plus per-channel and residual operands.
TEST(PostOpFusion, EachKindFusesAndMatchesInterp) {
  manual_seed(12);
  struct Kind {
    OpKind op;
    ops::Attrs attrs;
    std::string post;
  };
  std::vector<Kind> kinds = {
      {OpKind::relu, {}, "relu"},
      {OpKind::sigmoid, {}, "sigmoid"},
      {OpKind::tanh, {}, "tanh"},
      {OpKind::silu, {}, "swish(1)"},
      {OpKind::hardswish, {}, "hardswish"},
      {OpKind::hardsigmoid, {}, "hardsigmoid"},
      {OpKind::gelu, {{"approximate", std::string("none")}}, "gelu_erf"},
      {OpKind::gelu, {{"approximate", std::string("tanh")}}, "gelu_tanh"},
      {OpKind::clamp, {{"min", 0.0}, {"max", 6.0}}, "clamp(0, 6)"},
      {OpKind::clamp, {{"max", 0.5}}, "clamp(-inf, 0.5)"},
  };
  for (const Kind& k : kinds) {
    GraphBuilder b("kind");
    SymInt n = b.symbol("x.size()[0]", 3);
    ValueId x = b.input("x", {n, 6, 5, 7});
    ValueId w = b.input("w", {12, 6, 1, 1});
    ValueId ch = b.input("ch", {12, 1, 1});
    ValueId c = b.call(OpKind::conv2d, {x, w, kNoValue}, conv2d_attrs(0));
    ValueId a = b.call(k.op, {c}, k.attrs);
    ValueId m = b.call(OpKind::mul, {ch, a});
    Built g = finish(b, {m}, {n});
    ir::Graph f = fused_copy(g);
    EXPECT_EQ(post_ops_of(f, OpKind::conv2d_fused), k.post + ", mul(#3)") << ir::print(f);
    EXPECT_EQ(f.num_calls(), 1u) << ir::print(f);
    Tensor wt = rnd({12, 6, 1, 1}, 0.5), cht = rnd({12, 1, 1});
    differential(g, [&](int64_t s0, int64_t) { return std::vector<Tensor>{rnd({s0, 6, 5, 7}), wt, cht}; },
                 {{3, 0}, {1, 0}, {5, 0}});
  }
}

// linear / matmul: bias add, swish spelled out (x·sigmoid(x·c)), residual add, per-channel scale.
TEST(PostOpFusion, LinearAndMatmulChains) {
  manual_seed(13);
  GraphBuilder b("mlp");
  SymInt t = b.symbol("x.size()[1]", 40);
  ValueId x = b.input("x", {1, t, 120});
  ValueId w1 = b.constant(rnd({120, 240}, 0.1)), b1 = b.constant(rnd({240}));
  ValueId h = b.call(OpKind::matmul, {x, w1});
  ValueId hb = b.call(OpKind::add, {h, b1});
  ValueId sc = b.call(OpKind::mul, {hb, b.constant(tensor<float>({1.0f}, {1}))});
  ValueId sg = b.call(OpKind::sigmoid, {sc});
  ValueId sw = b.call(OpKind::mul, {hb, sg});
  ValueId w2 = b.constant(rnd({120, 240}, 0.1));
  ValueId o = b.call(OpKind::linear, {sw, w2, b.constant(rnd({120}))});
  ValueId r = b.call(OpKind::add, {x, o});  // residual, operand first
  ValueId g2 = b.call(OpKind::gelu, {r}, {{"approximate", std::string("none")}});
  Built g = finish(b, {g2}, {t});
  ir::Graph f = fused_copy(g);
  EXPECT_EQ(post_ops_of(f, OpKind::matmul_fused), "add(#2), swish(1)") << ir::print(f);
  EXPECT_EQ(post_ops_of(f, OpKind::linear_fused), "add(#3), gelu_erf") << ir::print(f);
  EXPECT_EQ(f.num_calls(), 2u) << ir::print(f);
  differential(g, [](int64_t s0, int64_t) { return std::vector<Tensor>{rnd({1, s0, 120})}; }, {{40, 0}, {7, 0}, {129, 0}});
}

// Things that must stay in generated code.
TEST(PostOpFusion, WhatDoesNotFuse) {
  manual_seed(14);
  GraphBuilder b("nofuse");
  SymInt n = b.symbol("x.size()[0]", 2);
  ValueId x = b.input("x", {1, 8, 6, 6});
  ValueId z = b.input("z", {n, 8, 6, 6});
  ValueId w = b.input("w", {8, 8, 3, 3});
  // 1. the residual broadcasts the conv output to a larger shape
  ValueId c1 = b.call(OpKind::conv2d, {x, w, kNoValue}, conv2d_attrs(1));
  ValueId r1 = b.call(OpKind::add, {c1, z});
  // 2. the conv output has a second user
  ValueId c2 = b.call(OpKind::conv2d, {x, w, kNoValue}, conv2d_attrs(1, 1));
  ValueId r2 = b.call(OpKind::relu, {c2});
  ValueId e2 = b.call(OpKind::exp, {c2});
  // 3. operand − conv and operand / conv
  ValueId c3 = b.call(OpKind::conv2d, {r2, w, kNoValue}, conv2d_attrs(1));
  ValueId s3 = b.call(OpKind::sub, {x, c3});
  ValueId c4 = b.call(OpKind::conv2d, {e2, w, kNoValue}, conv2d_attrs(1));
  ValueId d4 = b.call(OpKind::div, {x, c4});
  // 4. a conv whose output is a graph output
  ValueId c5 = b.call(OpKind::conv2d, {d4, w, kNoValue}, conv2d_attrs(1));
  ValueId t5 = b.call(OpKind::tanh, {c5});
  // 5. a residual after another post-op on a conv (oneDNN would change kernels): the chain stops there
  ValueId c6 = b.call(OpKind::conv2d, {s3, w, kNoValue}, conv2d_attrs(1));
  ValueId a6 = b.call(OpKind::relu, {c6});
  ValueId r6 = b.call(OpKind::add, {a6, x});
  // 6. a per-row operand ([1, 1, 6, 1]) is neither per-channel nor full
  ValueId c7 = b.call(OpKind::conv2d, {r6, w, kNoValue}, conv2d_attrs(1));
  ValueId m7 = b.call(OpKind::mul, {c7, b.input("rows", {1, 1, 6, 1})});
  Built g = finish(b, {r1, s3, c5, t5, m7}, {n});
  FusePostOpsStats st;
  ir::Graph f = fused_copy(g, &st);
  EXPECT_EQ(count_op(f, OpKind::add), 2) << ir::print(f);   // r1, r6
  EXPECT_EQ(count_op(f, OpKind::sub), 1);
  EXPECT_EQ(count_op(f, OpKind::div), 1);
  EXPECT_EQ(count_op(f, OpKind::tanh), 1);
  EXPECT_EQ(count_op(f, OpKind::exp), 1);
  EXPECT_EQ(count_op(f, OpKind::mul), 1);
  EXPECT_EQ(count_op(f, OpKind::conv2d_fused), 1) << ir::print(f);  // only c6 → relu
  EXPECT_EQ(post_ops_of(f, OpKind::conv2d_fused), "relu");
  EXPECT_EQ(st.fused_calls, 1);
  Tensor wt = rnd({8, 8, 3, 3}, 0.2), xt = rnd({1, 8, 6, 6}), rows = rnd({1, 1, 6, 1});
  differential(g, [&](int64_t s0, int64_t) { return std::vector<Tensor>{xt, rnd({s0, 8, 6, 6}), wt, rows}; },
               {{2, 0}, {3, 0}});
}

// batch_norm with graph-input parameters stays a post-op (no folding), on conv1d with a symbolic length.
TEST(PostOpFusion, BatchNormWithInputParametersIsAPostOp) {
  manual_seed(15);
  GraphBuilder b("bn");
  SymInt l = b.symbol("x.size()[2]", 30);
  ValueId x = b.input("x", {2, 4, l});
  ValueId w = b.input("w", {6, 4, 3});
  ValueId mean = b.input("mean", {6}), var = b.input("var", {6}), gw = b.input("gw", {6});
  ValueId c = b.call(OpKind::conv1d, {x, w, kNoValue}, conv_attrs({1}, {1}, 1));
  ValueId bn = b.call(OpKind::batch_norm, {c, gw, kNoValue, mean, var}, {{"eps", 1e-3}});
  ValueId r = b.call(OpKind::relu, {bn});
  Built g = finish(b, {r}, {l});
  ir::Graph f = fused_copy(g);
  EXPECT_EQ(post_ops_of(f, OpKind::conv1d_fused), "batch_norm(#3, _, #4, #5, 0.001), relu") << ir::print(f);
  Tensor wt = rnd({6, 4, 3}, 0.4), mt = rnd({6}), vt = add(abs(rnd({6})), 0.2), gt = rnd({6});
  differential(g, [&](int64_t s0, int64_t) { return std::vector<Tensor>{rnd({2, 4, s0}), wt, mt, vt, gt}; },
               {{30, 0}, {5, 0}, {64, 0}});
}

// A residual add right after a conv uses oneDNN's `sum` (blocked destination); conv_transpose2d too.
TEST(PostOpFusion, ResidualAndTransposedConv) {
  manual_seed(16);
  GraphBuilder b("res");
  SymInt h = b.symbol("x.size()[2]", 10);
  ValueId x = b.input("x", {1, 32, h, 12});
  ValueId c = b.call(OpKind::conv2d, {x, b.constant(rnd({32, 32, 3, 3}, 0.1)), b.constant(rnd({32}))},
                     conv2d_attrs(1));
  ValueId r = b.call(OpKind::add, {x, c});
  ValueId a = b.call(OpKind::relu, {r});
  ValueId ct = b.call(OpKind::conv_transpose2d, {a, b.constant(rnd({32, 4, 2, 2}, 0.2)), kNoValue},
                      {{"stride", to_symint_vec({2, 2})}, {"padding", to_symint_vec({0, 0})},
                       {"output_padding", to_symint_vec({0, 0})}, {"dilation", to_symint_vec({1, 1})},
                       {"groups", SymInt(1)}});
  ValueId ab = b.call(OpKind::add, {ct, b.constant(rnd({4, 1, 1}))});
  ValueId sg = b.call(OpKind::sigmoid, {ab});
  Built g = finish(b, {sg}, {h});
  FusePostOpsStats st;
  ir::Graph f = fused_copy(g, &st);
  EXPECT_EQ(post_ops_of(f, OpKind::conv2d_fused), "add(#3), relu") << ir::print(f);
  EXPECT_EQ(post_ops_of(f, OpKind::conv_transpose2d_fused), "sigmoid") << ir::print(f);  // the bias add folded
  EXPECT_EQ(st.folded_links, 1);
  EXPECT_EQ(f.num_calls(), 2u);
  ops::reset_dnnl_stats();
  differential(g, [](int64_t s0, int64_t) { return std::vector<Tensor>{rnd({1, 32, s0, 12})}; }, {{10, 0}, {3, 0}, {17, 0}});
  // both finish in a separate pass, one per call, 3 shapes on the cpu backend and 3 on the interpreter
  // running the fused graph: the conv's list holds relu, which oneDNN would map NaN to 0 with (so it
  // never goes to oneDNN, post_ops.h), and the deconvolution always does (see conv.cpp)
  EXPECT_EQ(ops::dnnl_stats().post_op_fallbacks, 12) << ops::dnnl_stats_json();
  EXPECT_GT(ops::dnnl_stats().primitives_created, 0);
}

// The frame's graph is not touched: compiling leaves the BackendInput graph as it was.
TEST(PostOpFusion, BackendLeavesTheFrameGraphAlone) {
  GraphBuilder b("keep");
  ValueId x = b.input("x", {2, 3, 4, 4});
  ValueId c = b.call(OpKind::conv2d, {x, b.constant(rnd({5, 3, 1, 1})), kNoValue}, conv2d_attrs(0));
  ValueId r = b.call(OpKind::relu, {c});
  Built g = finish(b, {r}, {});
  std::string before = ir::print(*g.g);
  use_test_cache_dir();
  CpuCompileInfo info;
  compile_cpu(BackendInput{g.g, {}, "0/0", "default"}, &info);
  EXPECT_EQ(ir::print(*g.g), before);
  EXPECT_EQ(info.fused_post_ops, 1);
}

// Several threads share the process-wide primitive cache (one primitive, many callers).
TEST(PostOps, ConcurrentCallsShareCachedPrimitives) {
  manual_seed(17);
  Tensor x = rnd({1, 16, 24, 40}), w = rnd({16, 1, 3, 3}, 0.3), b = rnd({16}), res = rnd({1, 16, 24, 40});
  ops::Attrs a = conv2d_attrs(1, 16);
  a.set("post_ops", std::string("add(#3), hardswish"));
  std::vector<Tensor> in{x, w, b, res};
  Tensor want = ops::run_eager(OpKind::conv2d_fused, in, a)[0];
  std::vector<std::thread> ts;
  std::vector<double> diffs(4, -1);
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      double d = 0;
      for (int k = 0; k < 20; ++k) d = std::max(d, max_abs_diff(ops::run_eager(OpKind::conv2d_fused, in, a)[0], want));
      diffs[static_cast<size_t>(i)] = d;
    });
  for (auto& t : ts) t.join();
  for (double d : diffs) EXPECT_EQ(d, 0.0);
}

// A run-time error of an extern step names its own node's source also after post-op fusion rebuilt the
// graph the program was lowered from (linear + relu became one node before the embedding), from a
// fresh compile and from the plan read back from the cache. The nodes are given sources the way a front
// end does (core::FrontendProvenanceScope), one per op.
Tensor fused_then_embedding(Tensor x, Tensor w, Tensor table, Tensor idx) {
  auto at = [](const char* what) { return core::SourceLocation{.file = what, .line = 0, .function = "", .backward = false}; };
  Tensor r, s, e;
  {
    core::FrontendProvenanceScope p(at("node 'proj' (Linear)"));
    r = linear(x, w, Tensor());
  }
  {
    core::FrontendProvenanceScope p(at("node 'act' (Relu)"));
    r = relu(r);
  }
  {
    core::FrontendProvenanceScope p(at("node 'squash' (Sigmoid)"));
    s = sigmoid(r);
  }
  {
    core::FrontendProvenanceScope p(at("node 'lookup' (Gather)"));
    e = embedding(table, idx);
  }
  return sum(s) + sum(e);
}

TEST(PostOps, AnExternErrorAfterFusionNamesItsOwnNode) {
  Tensor x = randn({4, 8}), w = randn({16, 8}), table = randn({5, 3});
  for (int run = 0; run < 2; ++run) {  // the second compile reads the cached plan
    SCOPED_TRACE(run);
    auto f = compile(fused_then_embedding, {.name = fmt::format("fused_then_embedding_{}", run), .backend = "cpu"});
    f(x, w, table, tensor<int64_t>({0, 1}, {2}));
    try {
      f(x, w, table, tensor<int64_t>({0, 9}, {2}));
      ADD_FAILURE() << "an index out of range ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("(at node 'lookup' (Gather))"), std::string::npos) << e.what();
    }
    reset();
  }
}

}  // namespace
}  // namespace protean::backend::cpu
