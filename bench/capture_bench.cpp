// Capture-layer benchmarks:
//  * dispatch overhead on a cache hit: a 2-input compiled function with the `eager` backend (guards
//    checked, then the user's function runs directly) against calling the function directly;
//  * capture (trace + guards + backend setup) time of a 500-node graph.
#include <benchmark/benchmark.h>

#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;

namespace {
Tensor pick(const Tensor& x, const Tensor& y) { return x; }  // no op: isolates dispatch cost
Tensor add2(const Tensor& x, const Tensor& y) { return x + y; }

void BM_DirectNoOp(benchmark::State& st) {
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  for (auto _ : st) benchmark::DoNotOptimize(pick(x, y));
}
BENCHMARK(BM_DirectNoOp);

void BM_CompiledHitNoOpEager(benchmark::State& st) {
  auto f = pt::compile(pick, {.name = "pick", .arg_names = {"x", "y"}, .backend = "eager"});
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
}
BENCHMARK(BM_CompiledHitNoOpEager);

void BM_CompiledHitNoOpEagerDynamic(benchmark::State& st) {
  auto f = pt::compile(pick, {.name = "pick_dyn", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On, .backend = "eager"});
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
}
BENCHMARK(BM_CompiledHitNoOpEagerDynamic);

void BM_DirectAdd(benchmark::State& st) {
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  for (auto _ : st) benchmark::DoNotOptimize(add2(x, y));
}
BENCHMARK(BM_DirectAdd);

void BM_CompiledHitAddEager(benchmark::State& st) {
  auto f = pt::compile(add2, {.name = "add2", .arg_names = {"x", "y"}, .backend = "eager"});
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
}
BENCHMARK(BM_CompiledHitAddEager);

void BM_CompiledHitAddInterp(benchmark::State& st) {
  auto f = pt::compile(add2, {.name = "add2_interp", .arg_names = {"x", "y"}, .backend = "interp"});
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  f(x, y);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
}
BENCHMARK(BM_CompiledHitAddInterp);

Tensor chain500(const Tensor& x) {
  Tensor h = x;
  for (int i = 0; i < 250; ++i) h = pt::tanh(pt::relu(h));
  return h;
}

void BM_Capture500Nodes(benchmark::State& st) {
  Tensor x = pt::randn({8, 16});
  for (auto _ : st) {
    auto f = pt::compile(chain500, {.name = "chain500", .arg_names = {"x"}, .backend = "eager"});
    benchmark::DoNotOptimize(f(x));
  }
}
BENCHMARK(BM_Capture500Nodes)->Unit(benchmark::kMillisecond);

void BM_Capture500NodesDynamic(benchmark::State& st) {
  Tensor x = pt::randn({8, 16});
  for (auto _ : st) {
    auto f = pt::compile(chain500, {.name = "chain500", .arg_names = {"x"}, .dynamic = pt::Dynamic::On, .backend = "eager"});
    benchmark::DoNotOptimize(f(x));
  }
}
BENCHMARK(BM_Capture500NodesDynamic)->Unit(benchmark::kMillisecond);
}  // namespace

BENCHMARK_MAIN();
