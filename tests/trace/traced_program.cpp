// A small compiled program that the report golden test (tests/unit/report_golden_test.cpp) runs with
// PROTEAN_TRACE, PROTEAN_JOB_ID and a private PROTEAN_CACHE_DIR set, twice, to get real traces that
// exercise every compile-scoped event: a width change that recompiles with the width dynamic
// (automatic dynamic), a width of 1 (0/1 specialization), maybe_mark_dynamic + mark_dynamic, a
// branch on a symbolic size (guard added) and an equality test that specializes a symbol, all on the
// cpu backend (generated C++ artifacts, artifact cache) with a PGO profile stored by the first run
// and loaded by the second.
#include <cstdio>

#include <protean/protean.h>

namespace pt = protean;

pt::Tensor bias_relu(const pt::Tensor& x, const pt::Tensor& b) {
  pt::Tensor y = pt::relu(x + b);
  if (x.size(1) % 2 == 0) y = y * 2.0;
  return y;
}

pt::Tensor row_sums(const pt::Tensor& x) {
  pt::Tensor y = x.sum({1});
  if (x.size(0) == 6) return y + 1.0;
  return y;
}

int main() {
  pt::manual_seed(0);
  auto f = pt::compile(bias_relu, {.name = "bias_relu", .arg_names = {"x", "b"}, .backend = "cpu"});
  f(pt::randn({4, 8}), pt::randn({8}));    // static (first run) or width dynamic from PGO (second run)
  f(pt::randn({4, 16}), pt::randn({16}));  // width changed: automatic dynamic
  f(pt::randn({4, 1}), pt::randn({1}));    // width 1: 0/1 specialization
  auto g = pt::compile(row_sums, {.name = "row_sums", .arg_names = {"m"}, .backend = "cpu"});
  pt::Tensor x = pt::randn({6, 5});
  pt::maybe_mark_dynamic(x, 0);
  pt::mark_dynamic(x, 1);
  pt::Tensor s = g(x);
  std::printf("row_sums ok: %s\n", pt::allclose(s, row_sums(x), 1e-5, 1e-5) ? "yes" : "NO");
  pt::Stats st = pt::stats();
  std::printf("compiles=%lld recompiles=%lld\n", static_cast<long long>(st.compiles),
              static_cast<long long>(st.recompiles));
  return 0;
}
