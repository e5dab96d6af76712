// Helpers for the cpu backend tests (cpu_backend_test.cpp, cpu_vector_form_test.cpp,
// cpu_post_ops_test.cpp, cpu_conv_layout_test.cpp): one private kernel cache directory per test
// process, scaled random inputs, a built graph with its size symbols, result comparison with a
// tolerance chosen by dtype, and a graph compiled by the cpu backend checked against the interpreter.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/pipeline.h"
#include "backend/interp/interp.h"
#include "ir_test_util.h"
#include "ops/post_ops.h"

#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu::testing {

/// Tests share one private cache dir per process (unless the environment already names one).
inline void use_test_cache_dir() {
  static bool done = [] {
    if (!std::getenv("PROTEAN_CACHE_DIR")) {
      std::string d = "/tmp/protean-cpu-test-" + std::to_string(getpid());
      setenv("PROTEAN_CACHE_DIR", d.c_str(), 1);
    }
    return true;
  }();
  (void)done;
}

/// The absolute and relative tolerance for results of dtype `t`: 1e-9 for f64, 2e-4 otherwise.
inline double default_tol(DType t) { return t == DType::F64 ? 1e-9 : 2e-4; }

/// `got` has `want`'s dtype and sizes and matches it within `tol` (default: default_tol of `want`'s
/// dtype), NaNs equal; `what` names the comparison in a failure.
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                         std::optional<double> tol = std::nullopt) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.int_sizes(), want.int_sizes()) << what;
  double t = tol.value_or(default_tol(want.dtype()));
  if (allclose(got, want, t, t, true)) return;
  // the first element that differs, for the failure message
  std::vector<double> g = got.contiguous().to(DType::F64).to_vector<double>(), w = want.contiguous().to(DType::F64).to_vector<double>();
  size_t at = 0;
  for (; at < g.size(); ++at) {
    const bool both_nan = std::isnan(g[at]) && std::isnan(w[at]);
    if (!both_nan && !(g[at] == w[at] || std::abs(g[at] - w[at]) <= t + t * std::abs(w[at]))) break;
  }
  ADD_FAILURE() << what << ": max abs diff " << max_abs_diff(got, want) << "; first difference at flat index " << at
                << ": got " << (at < g.size() ? g[at] : 0.0) << ", want " << (at < w.size() ? w[at] : 0.0);
}

/// The unfused meaning of one post-op with eager ops (for checking the fused kernels): `y` after `p`,
/// whose operands index `in`.
inline Tensor apply_one(const Tensor& y, const ops::PostOp& p, const std::vector<Tensor>& in) {
  auto operand = [&](int k) { return in[static_cast<size_t>(k)]; };
  switch (p.kind) {
    case ops::PostOpKind::relu: return relu(y);
    case ops::PostOpKind::sigmoid: return sigmoid(y);
    case ops::PostOpKind::tanh: return tanh(y);
    case ops::PostOpKind::swish: return mul(y, sigmoid(mul(y, p.alpha)));
    case ops::PostOpKind::hardswish: return hardswish(y);
    case ops::PostOpKind::hardsigmoid: return hardsigmoid(y);
    case ops::PostOpKind::gelu_erf: return gelu(y, "none");
    case ops::PostOpKind::gelu_tanh: return gelu(y, "tanh");
    case ops::PostOpKind::clamp: return clamp(y, p.alpha, p.beta);
    case ops::PostOpKind::linear: return add(mul(y, p.alpha), p.beta);
    case ops::PostOpKind::add: return add(y, operand(p.operand[0]));
    case ops::PostOpKind::sub: return sub(y, operand(p.operand[0]));
    case ops::PostOpKind::mul: return mul(y, operand(p.operand[0]));
    case ops::PostOpKind::div: return div(y, operand(p.operand[0]));
    case ops::PostOpKind::batch_norm: {
      auto opt = [&](int k) { return k < 0 ? Tensor() : operand(k); };
      return batch_norm(y, opt(p.operand[0]), opt(p.operand[1]), operand(p.operand[2]), operand(p.operand[3]),
                        p.alpha);
    }
  }
  return y;
}

/// A graph compiled by the cpu backend, and the interpreter on the same graph.
struct Compiled {
  std::unique_ptr<CpuArtifact> cpu;
  std::unique_ptr<Interpreter> interp;
  CpuCompileInfo info;
};

inline Compiled compile(ir::testing::GraphBuilder& b, std::vector<ir::ValueId> outs, std::vector<SymInt> syms) {
  use_test_cache_dir();
  auto g = std::make_shared<const ir::Graph>(std::move(b.done(std::move(outs))));
  BackendInput in;
  in.graph = g;
  for (const SymInt& s : syms) in.symbols.push_back(s.expr());
  in.compile_id = "0/0";
  Compiled c;
  c.cpu = compile_cpu(in, &c.info);
  c.interp = std::make_unique<Interpreter>(g, in.symbols);
  return c;
}

/// A random program of the differential fuzzer (CpuDifferential, and the cuda backend's NVRTC tests):
/// 3 to 9 random steps (pointwise, broadcasting, reductions, softmax, layer_norm, permutes, matmul,
/// where, reshape, gelu) over inputs x, y [s0, s1], row [s1], col [s0, 1], w [s1, s1].
struct RandomProgram {
  ir::testing::GraphBuilder b{"fuzz"};
  SymInt s0, s1;
  std::vector<ir::ValueId> outs;
  int n_inputs = 0;
};

inline void build_random(RandomProgram& rp, std::mt19937& rng) {
  ir::testing::GraphBuilder& b = rp.b;
  rp.s0 = b.symbol("x.size()[0]", 5);
  rp.s1 = b.symbol("x.size()[1]", 6);
  SymInt s0 = rp.s0, s1 = rp.s1;
  std::vector<ir::ValueId> pool = {b.input("x", {s0, s1}), b.input("y", {s0, s1})};
  ir::ValueId row = b.input("row", {s1});
  ir::ValueId col = b.input("col", {s0, 1});
  ir::ValueId w = b.input("w", {s1, s1});
  rp.n_inputs = 5;
  auto pick = [&]() { return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)]; };
  int steps = std::uniform_int_distribution<int>(3, 9)(rng);
  for (int s = 0; s < steps; ++s) {
    int kind = std::uniform_int_distribution<int>(0, 11)(rng);
    ir::ValueId a = pick(), r = a;
    switch (kind) {
      case 0: {
        static const ops::OpKind un[] = {ops::OpKind::tanh, ops::OpKind::sigmoid, ops::OpKind::relu, ops::OpKind::neg, ops::OpKind::abs, ops::OpKind::sin, ops::OpKind::silu};
        r = b.call(un[std::uniform_int_distribution<int>(0, 6)(rng)], {a});
        break;
      }
      case 1: r = b.call(ops::OpKind::exp, {b.call(ops::OpKind::tanh, {a})}); break;
      case 2: {
        static const ops::OpKind bin[] = {ops::OpKind::add, ops::OpKind::sub, ops::OpKind::mul, ops::OpKind::maximum, ops::OpKind::minimum};
        ir::ValueId other = std::uniform_int_distribution<int>(0, 2)(rng) == 0 ? row : std::uniform_int_distribution<int>(0, 1)(rng) ? col : pick();
        r = b.call(bin[std::uniform_int_distribution<int>(0, 4)(rng)], {a, other});
        break;
      }
      case 3: r = b.call(ops::OpKind::div, {a, b.call(ops::OpKind::add, {b.call(ops::OpKind::abs, {pick()}), b.constant(scalar_tensor(1.0))})}); break;
      case 4: {
        static const ops::OpKind red[] = {ops::OpKind::sum, ops::OpKind::amax, ops::OpKind::mean, ops::OpKind::amin};
        int64_t d = std::uniform_int_distribution<int>(0, 1)(rng);
        ir::ValueId rr = b.call(red[std::uniform_int_distribution<int>(0, 3)(rng)], {a}, {{"dims", SymIntVec{d}}, {"keepdim", true}});
        r = b.call(ops::OpKind::sub, {pick(), rr});
        break;
      }
      case 5: r = b.call(std::uniform_int_distribution<int>(0, 1)(rng) ? ops::OpKind::softmax : ops::OpKind::log_softmax, {a},
                         {{"dim", SymInt(std::uniform_int_distribution<int>(0, 1)(rng))}});
        break;
      case 6: r = b.call(ops::OpKind::layer_norm, {a, row, ir::kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}}); break;
      case 7: r = b.call(ops::OpKind::permute, {b.call(ops::OpKind::exp, {b.call(ops::OpKind::permute, {b.call(ops::OpKind::tanh, {a})}, {{"dims", SymIntVec{1, 0}}})})},
                         {{"dims", SymIntVec{1, 0}}});
        break;
      case 8: r = b.call(ops::OpKind::tanh, {b.call(ops::OpKind::matmul, {a, w})}); break;
      case 9: r = b.call(ops::OpKind::where, {b.call(ops::OpKind::gt, {a, pick()}), a, b.call(ops::OpKind::neg, {a})}); break;
      case 10: {
        sym::ShapeEnvScope scope(b.env);
        ir::ValueId flat = b.call(ops::OpKind::reshape, {a}, {{"shape", SymIntVec{s0 * s1}}});
        r = b.call(ops::OpKind::reshape, {b.call(ops::OpKind::tanh, {flat})}, {{"shape", SymIntVec{s0, s1}}});
        break;
      }
      default: r = b.call(ops::OpKind::gelu, {a}, {{"approximate", std::string("none")}}); break;
    }
    pool.push_back(r);
  }
  rp.outs.push_back(pool.back());
  if (pool.size() > 4) rp.outs.push_back(pool[pool.size() / 2 + 1]);
  rp.outs.push_back(b.call(ops::OpKind::sum, {pool.back()}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
}


/// A random residual stream (CpuDifferential.RandomResidualStreamsMatchInterp, and the cuda backend's
/// NVRTC test): inputs x [s0, s1], w [s1, s1], g [s1], row [s1], x2 [s0, s1]; the stream starts as x,
/// or as x + x2 (`two_inputs`: a token and a position embedding); 1 to 5 layers, each a row reduction
/// of the stream (layer_norm, softmax or a max subtracted), a product or a pointwise op of it, an
/// optional activation, then an add back into the stream (sometimes with a broadcast row, sometimes
/// scaled); some partial sums are outputs too; then the stream and its layer_norm.
inline void build_residual_stream(RandomProgram& rp, std::mt19937& rng, bool two_inputs) {
  ir::testing::GraphBuilder& b = rp.b;
  using ops::OpKind;
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  rp.s0 = b.symbol("x.size()[0]", 5);
  rp.s1 = b.symbol("x.size()[1]", 6);
  const SymInt s1 = rp.s1;
  ir::ValueId x = b.input("x", {rp.s0, s1}), w = b.input("w", {s1, s1}), g = b.input("g", {s1}), row = b.input("row", {s1});
  ir::ValueId x2 = b.input("x2", {rp.s0, s1});
  rp.n_inputs = 5;
  auto ln = [&](ir::ValueId v) {
    return b.call(OpKind::layer_norm, {v, g, ir::kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
  };
  ir::ValueId r = two_inputs ? b.call(OpKind::add, {x, x2}) : x;
  const int layers = 1 + pick(5);
  for (int l = 0; l < layers; ++l) {
    ir::ValueId h;
    switch (pick(3)) {
      case 0: h = ln(r); break;
      case 1: h = b.call(OpKind::softmax, {r}, {{"dim", SymInt(-1)}}); break;
      default: h = b.call(OpKind::sub, {r, b.call(OpKind::amax, {r}, {{"dims", SymIntVec{1}}, {"keepdim", true}})}); break;
    }
    ir::ValueId y = pick(2) ? b.call(OpKind::matmul, {h, w}) : b.call(OpKind::mul, {h, row});
    if (pick(2)) y = b.call(pick(2) ? OpKind::tanh : OpKind::relu, {y});
    switch (pick(3)) {
      case 0: r = b.call(OpKind::add, {r, y}); break;
      case 1: r = b.call(OpKind::add, {b.call(OpKind::add, {y, row}), r}); break;
      default: r = b.call(OpKind::add, {b.call(OpKind::mul, {r, b.constant(scalar_tensor(0.5))}), y}); break;
    }
    if (pick(4) == 0) rp.outs.push_back(r);
  }
  rp.outs.push_back(r);
  rp.outs.push_back(ln(r));
}

/// Runs both on `inputs` with symbol values `symvals`; every output matches (expect_close).
inline void check(const Compiled& c, const std::vector<Tensor>& inputs, const std::vector<int64_t>& symvals, const std::string& what = "") {
  std::vector<Tensor> a = c.cpu->run(inputs, symvals);
  std::vector<Tensor> b = c.interp->run(inputs, std::span<const int64_t>(symvals));
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_close(a[i], b[i], what + " output " + std::to_string(i));
}

/// randn(sizes) * scale.
inline Tensor rnd(const IntVec& sizes, double scale = 1.0) { return mul(randn(sizes), scale); }

/// A finished graph and its size symbols (BackendInput's graph and symbols).
struct Built {
  std::shared_ptr<const ir::Graph> g;
  std::vector<sym::Expr> syms;
};

/// Finishes `b` with outputs `outs`; `syms` are the graph's size symbols, in order.
inline Built finish(ir::testing::GraphBuilder& b, std::vector<ir::ValueId> outs, std::vector<SymInt> syms) {
  Built r;
  r.g = std::make_shared<const ir::Graph>(std::move(b.done(std::move(outs))));
  for (const SymInt& s : syms) r.syms.push_back(s.expr());
  return r;
}

}  // namespace protean::backend::cpu::testing
