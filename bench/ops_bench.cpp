// Eager op baselines: the numbers Protean's code generator has to beat.
//
//  * matmul n×n·n×n for n = 512, 1024, 2048: counter GFLOP/s = 2n³ / time.
//  * conv2d at PP-OCR sizes: 3×3 64→64 on [1, 64, 48, 160], 1×1 128→256 on [1, 128, 12, 80],
//    depthwise 3×3 on [1, 64, 48, 160]: GFLOP/s = 2·N·O·OH·OW·(C/groups)·kh·kw / time.
//  * bandwidth-bound ops, counter GB/s = (bytes read + bytes written) / time, and mem_frac = that
//    bandwidth divided by the memcpy bandwidth of the same byte count measured in this binary:
//      softmax and layer_norm over [1024, 4096] f32 (read 16 MiB, write 16 MiB),
//      add of two 16M-float tensors (read 128 MiB, write 64 MiB),
//      memcpy of 64 MiB (read 64 MiB, write 64 MiB) — the reference, run by as many threads as the
//      eager kernels use (protean::num_threads(), each thread copying its own contiguous chunk;
//      memcpy_peer.h).
// Run (see docs/benchmarks.md):
//   ./build/ops_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//       --benchmark_out=bench/results/ops_<date>.json --benchmark_out_format=json
//       --benchmark_context=commit=$(git rev-parse --short HEAD) --benchmark_context=machine="..."
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "memcpy_peer.h"
#include "protean/protean.h"

namespace {

namespace pt = protean;

/// memcpy of 64 MiB on the eager kernels' thread count: the peer of the bandwidth counters below.
double memcpy_bandwidth() { return protean::bench::memcpy_bandwidth(size_t{16} << 22, pt::num_threads()); }

void set_bandwidth(benchmark::State& state, double bytes_per_iter) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_iter / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes"] = bytes_per_iter;
}

void BM_Matmul(benchmark::State& state) {
  int64_t n = state.range(0);
  pt::manual_seed(0);
  pt::Tensor a = pt::randn({n, n}), b = pt::randn({n, n});
  benchmark::DoNotOptimize(pt::matmul(a, b));  // warm-up: creates and caches the oneDNN primitive
  for (auto _ : state) benchmark::DoNotOptimize(pt::matmul(a, b));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(n * n * n) / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Matmul)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

void conv_bench(benchmark::State& state, pt::IntVec x_shape, int64_t out_ch, int64_t k, int64_t groups) {
  pt::manual_seed(0);
  pt::Tensor x = pt::randn(x_shape);
  int64_t C = x_shape[1];
  pt::Tensor w = pt::randn({out_ch, C / groups, k, k});
  pt::Tensor b = pt::randn({out_ch});
  int64_t p = k / 2;
  benchmark::DoNotOptimize(pt::conv2d(x, w, b, {1, 1}, {p, p}, {1, 1}, groups));  // warm-up (primitive JIT)
  for (auto _ : state) benchmark::DoNotOptimize(pt::conv2d(x, w, b, {1, 1}, {p, p}, {1, 1}, groups));
  double flops = 2.0 * static_cast<double>(x_shape[0] * out_ch * x_shape[2] * x_shape[3] * (C / groups) * k * k);
  state.counters["GFLOP/s"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
void BM_Conv2d_3x3_64x48x160(benchmark::State& s) { conv_bench(s, {1, 64, 48, 160}, 64, 3, 1); }
void BM_Conv2d_1x1_128x12x80_to256(benchmark::State& s) { conv_bench(s, {1, 128, 12, 80}, 256, 1, 1); }
void BM_Conv2d_dw3x3_64x48x160(benchmark::State& s) { conv_bench(s, {1, 64, 48, 160}, 64, 3, 64); }
BENCHMARK(BM_Conv2d_3x3_64x48x160)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Conv2d_1x1_128x12x80_to256)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_Conv2d_dw3x3_64x48x160)->Unit(benchmark::kMicrosecond)->UseRealTime();

void report_mem_frac(benchmark::State& state, double bytes) {
  set_bandwidth(state, bytes);
  // A rate counter of bytes / memcpy-bytes-per-second comes out as (achieved GB/s) / (memcpy GB/s).
  double ref = memcpy_bandwidth();
  state.counters["mem_frac"] = benchmark::Counter(bytes / (ref * 1e9), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_GB/s"] = ref;
}

void BM_Memcpy64MiB(benchmark::State& state) {
  const size_t bytes = size_t{16} << 22;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  for (auto _ : state) {
    protean::bench::parallel_memcpy(b.data(), a.data(), bytes, pt::num_threads());
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  report_mem_frac(state, 2.0 * static_cast<double>(bytes));
}
BENCHMARK(BM_Memcpy64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Softmax_1024x4096(benchmark::State& state) {
  pt::manual_seed(0);
  pt::Tensor x = pt::randn({1024, 4096});
  for (auto _ : state) benchmark::DoNotOptimize(pt::softmax(x, -1));
  report_mem_frac(state, 2.0 * 1024 * 4096 * 4);
}
BENCHMARK(BM_Softmax_1024x4096)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_LayerNorm_1024x4096(benchmark::State& state) {
  pt::manual_seed(0);
  pt::Tensor x = pt::randn({1024, 4096}), w = pt::randn({4096}), b = pt::randn({4096});
  for (auto _ : state) benchmark::DoNotOptimize(pt::layer_norm(x, {4096}, w, b));
  report_mem_frac(state, 2.0 * 1024 * 4096 * 4);
}
BENCHMARK(BM_LayerNorm_1024x4096)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Add_16M(benchmark::State& state) {
  pt::manual_seed(0);
  const int64_t n = int64_t{1} << 24;
  pt::Tensor a = pt::randn({n}), b = pt::randn({n});
  for (auto _ : state) benchmark::DoNotOptimize(pt::add(a, b));
  report_mem_frac(state, 3.0 * static_cast<double>(n) * 4);
}
BENCHMARK(BM_Add_16M)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
