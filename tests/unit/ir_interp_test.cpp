// The interp backend: results equal eager execution on random inputs, static and symbolic sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "backend/interp/interp.h"
#include "ir/parser.h"
#include "ir/pipeline.h"
#include "ir_test_util.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend {
namespace {

using ir::kNoValue;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.int_sizes(), b.int_sizes());
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
}

TEST(IrInterp, StaticMlpMatchesEager) {
  manual_seed(1);
  GraphBuilder b("mlp");
  ValueId x = b.input("x", {4, 8});
  ValueId w = b.input("w", {8, 16});
  Tensor bias_t = randn({16});
  ValueId bias = b.constant(bias_t, "bias");
  ValueId h = b.call(OpKind::matmul, {x, w});
  ValueId hb = b.call(OpKind::add, {h, bias});
  ValueId r = b.call(OpKind::relu, {hb});
  ValueId s = b.call(OpKind::sum, {r}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
  Interpreter interp(std::move(b.done({s, r})));
  for (int trial = 0; trial < 3; ++trial) {
    Tensor xt = randn({4, 8}), wt = randn({8, 16});
    std::vector<Tensor> in = {xt, wt};
    std::vector<Tensor> out = interp.run(in, SymbolValues{});
    ASSERT_EQ(out.size(), 2u);
    Tensor er = relu(add(matmul(xt, wt), bias_t));
    expect_same(out[1], er);
    expect_same(out[0], sum(er, {1}));
  }
}

TEST(IrInterp, SymbolicSizesMatchEager) {
  manual_seed(2);
  GraphBuilder b("dyn");
  SymInt s0 = b.symbol("x.size()[0]", 3);
  std::optional<sym::ShapeEnvScope> scope(std::in_place, b.env);  // for s0 * 2 below
  ValueId x = b.input("x", {s0, 6});
  ValueId y = b.input("y", {6});
  ValueId a = b.call(OpKind::mul, {x, y});
  ValueId r = b.call(OpKind::reshape, {a}, {{"shape", SymIntVec{s0 * 2, 3}}});
  std::vector<ValueId> parts = b.calls(OpKind::split, {r}, {{"dim", SymInt(0)}, {"sizes", SymIntVec{2, s0 * 2 - 2}}});
  ValueId f = b.call(OpKind::full, {}, {{"shape", SymIntVec{s0 * 2 - 2, 3}}, {"value", 0.5}, {"dtype", DType::F32}});
  ValueId t = b.call(OpKind::add, {parts[1], f});
  ValueId n = b.call(OpKind::layer_norm, {t, kNoValue, kNoValue}, {{"normalized_shape", SymIntVec{3}}, {"eps", 1e-5}});
  ir::Graph g = std::move(b.done({parts[0], n}));
  scope.reset();
  ir::PassOptions po;
  po.verify = true;
  ir::run_passes(g, po);
  sym::Expr s0e = s0.expr();
  Interpreter interp(std::move(g), {s0e});
  for (int64_t n0 : {2, 3, 5, 9}) {
    SCOPED_TRACE(n0);
    Tensor xt = randn({n0, 6}), yt = randn({6});
    std::vector<Tensor> in = {xt, yt};
    Tensor er = reshape(mul(xt, yt), {n0 * 2, 3});
    std::vector<Tensor> ep = split(er, {2, n0 * 2 - 2}, 0);
    Tensor en = layer_norm(add(ep[1], full({n0 * 2 - 2, 3}, 0.5)), {3});
    // Three ways to bind s0: a map, values in constructor order, and from the inputs.
    std::vector<std::vector<Tensor>> outs;
    outs.push_back(interp.run(in, SymbolValues{{s0e, n0}}));
    int64_t vals[] = {n0};
    outs.push_back(interp.run(in, std::span<const int64_t>(vals)));
    outs.push_back(interp.run(in));
    for (const auto& out : outs) {
      ASSERT_EQ(out.size(), 2u);
      expect_same(out[0], ep[0]);
      expect_same(out[1], en);
    }
  }
}

TEST(IrInterp, ParsedGraphRuns) {
  ir::Graph g = ir::parse(
      "graph f(%x : f32[s0, 4], %y : f32[4]):\n"
      "  %0 : f32[s0, 4] = sub(%x, %y)\n"
      "  %1 : f32[s0, 4] = exp(%0)\n"
      "  %2 : f32[s0, 1] = sum(%1, dims=[1], keepdim=true)\n"
      "  %3 : f32[s0, 4] = div(%1, %2)\n"
      "  return (%3, %x)\n");
  Interpreter interp(std::move(g));
  Tensor xt = randn({5, 4}), yt = randn({4});
  std::vector<Tensor> in = {xt, yt};
  std::vector<Tensor> out = interp.run(in);
  Tensor e = exp(sub(xt, yt));
  expect_same(out[0], div(e, sum(e, {1}, true)));
  EXPECT_EQ(out[1].impl(), xt.impl());  // a returned input is the caller's tensor
}

TEST(IrInterp, InputChecks) {
  ir::Graph g = ir::parse("graph f(%x : f32[s0]):\n  %0 : f32[s0] = relu(%x)\n  return (%0)\n");
  Interpreter interp(std::move(g));
  std::vector<Tensor> none;
  EXPECT_THROW(interp.run(none), ValueError);
  std::vector<Tensor> wrong_dtype = {zeros({3}, DType::I64)};
  EXPECT_THROW(interp.run(wrong_dtype), TypeError);
  std::vector<Tensor> wrong_rank = {zeros({3, 1})};
  EXPECT_THROW(interp.run(wrong_rank), TypeError);
}

TEST(IrInterp, UnboundSymbolAndMissingConstantData) {
  ir::Graph g = ir::parse(
      "graph f(%x : f32[s0]):\n  %0 : f32[s1] = full(shape=[s1], value=1.0, dtype=f32)\n  return (%0)\n");
  Interpreter interp(std::move(g));
  std::vector<Tensor> in = {zeros({3})};
  try {
    interp.run(in);
    FAIL();
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("s1"), std::string::npos) << e.what();
  }
  ir::Graph c = ir::parse("graph f():\n  %c0 : f32[2] = constant()\n  return (%c0)\n");
  EXPECT_THROW(Interpreter{std::move(c)}, CompileError);
}

TEST(IrInterp, ManyThreadsShareOneInterpreter) {
  GraphBuilder b;
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0});
  ValueId t = b.call(OpKind::tanh, {b.call(OpKind::mul, {x, x})});
  Interpreter interp(std::move(b.done({t})));
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        Tensor xt = full({SymInt(2 + (i + k) % 7)}, 0.25 * k);
        std::vector<Tensor> in = {xt};
        Tensor out = interp.run(in).at(0);
        if (out.to_vector<float>() != tanh(mul(xt, xt)).to_vector<float>()) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace protean::backend
