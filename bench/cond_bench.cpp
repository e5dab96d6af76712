// cond benchmarks (docs/breaks.md, `cond`): a compiled function whose branches differ a lot in cost,
//   heavy: tanh(x @ w) @ w, four times  (x [64, 256], w [256, 256])    (BM_Cond, BM_Where)
//   heavy: twelve pointwise ops on x [512, 512]                       (BM_CondPointwise)
//   cheap: -x
// called with the predicate selecting one side, on the interp and cpu backends; against the same
// computation written with `where` (both sides always computed, joined per element).
//   BM_Cond/<backend>/<taken>   backend 0 = interp, 1 = cpu; taken 1 = heavy, 0 = cheap
//   BM_Where/<backend>/<taken>
//   BM_CondPointwise/<backend>/<taken>
#include <benchmark/benchmark.h>

#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;
using pt::TensorList;

namespace {

Tensor heavy(const Tensor& x, const Tensor& w) {
  Tensor y = x;
  for (int i = 0; i < 4; ++i) y = pt::matmul(pt::tanh(pt::matmul(y, w)), w);
  return y;
}

const char* backend_of(int64_t i) { return i == 0 ? "interp" : "cpu"; }

void BM_Cond(benchmark::State& st) {
  pt::reset();
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& w) {
    return pt::cond(
        p, [](const TensorList& o) { return heavy(o[0], o[1]); }, [](const TensorList& o) { return pt::neg(o[0]); },
        {x, w});
  };
  auto f = pt::compile(fn, {.name = "cond_bench", .arg_names = {"p", "x", "w"}, .backend = backend_of(st.range(0))});
  Tensor p = pt::scalar_tensor(st.range(1) ? 1 : 0, pt::DType::Bool);
  Tensor x = pt::randn({64, 256}) * 0.05, w = pt::randn({256, 256}) * 0.05;
  f(p, x, w);
  for (auto _ : st) benchmark::DoNotOptimize(f(p, x, w));
}
BENCHMARK(BM_Cond)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

void BM_Where(benchmark::State& st) {
  pt::reset();
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& w) { return pt::where(p, heavy(x, w), pt::neg(x)); };
  auto f = pt::compile(fn, {.name = "where_bench", .arg_names = {"p", "x", "w"}, .backend = backend_of(st.range(0))});
  Tensor p = pt::scalar_tensor(st.range(1) ? 1 : 0, pt::DType::Bool);
  Tensor x = pt::randn({64, 256}) * 0.05, w = pt::randn({256, 256}) * 0.05;
  f(p, x, w);
  for (auto _ : st) benchmark::DoNotOptimize(f(p, x, w));
}
BENCHMARK(BM_Where)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

Tensor pointwise_chain(const Tensor& x) {
  Tensor y = x;
  for (int i = 0; i < 3; ++i) y = pt::sigmoid(pt::tanh(y * 1.1 + 0.3) * y);
  return y;
}

void BM_CondPointwise(benchmark::State& st) {
  pt::reset();
  auto fn = [](const Tensor& p, const Tensor& x) {
    return pt::cond(
        p, [](const TensorList& o) { return pointwise_chain(o[0]); }, [](const TensorList& o) { return pt::neg(o[0]); },
        {x});
  };
  auto f = pt::compile(fn, {.name = "cond_pw_bench", .arg_names = {"p", "x"}, .backend = backend_of(st.range(0))});
  Tensor p = pt::scalar_tensor(st.range(1) ? 1 : 0, pt::DType::Bool);
  Tensor x = pt::randn({512, 512});
  f(p, x);
  for (auto _ : st) benchmark::DoNotOptimize(f(p, x));
}
BENCHMARK(BM_CondPointwise)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
