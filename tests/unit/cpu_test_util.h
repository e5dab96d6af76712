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
#include <string>
#include <vector>

#include "backend/cpu/pipeline.h"
#include "backend/interp/interp.h"
#include "ir_test_util.h"

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
