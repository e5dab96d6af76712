// The cpu backend on bandwidth-bound rows × 4096 f32 programs, against eager and memcpy.
//
//  * softmax(x, -1) and gelu(layer_norm(x, [4096], w, b)) for rows = 256, 1024, 4096: the cpu
//    artifact (generated, fused kernel) vs the eager kernels. Counter GB/s = (bytes read + written)
//    / time (x read once + y written once, i.e. the minimum traffic).
//  * The peer is a memcpy of the same size measured in the same benchmark (memcpy_peer.h, CopyPeer):
//    8 copies of x into a same-size tensor before the kernel's timed loop and 8 after, the kernel
//    runs back to back in between; mem_frac = median copy time / median kernel time (memcpy_GB/s,
//    kernel_median_ms and memcpy_median_ms are those medians). Same-size peers matter: 256 rows
//    (4 MiB each way) stay in L2/L3, 4096 rows (64 MiB) go to DRAM. mem_frac_best compares with the
//    best of many copies measured apart (memcpy_best_GB/s, the peer of the earlier results).
//    BM_MemcpyAsKernel runs the copy itself as the "kernel": its mem_frac checks the method (≈ 1).
//  * The peer runs on as many threads as the kernels: the generated kernels parallelize over rows
//    with OpenMP (OMP_NUM_THREADS threads), so with T threads the peer is T OpenMP threads each
//    std::memcpy-ing its own contiguous 1/T of the buffer. With one thread it is a plain memcpy.
//    BM_Memcpy times the copy alone per iteration (std::vector buffers); counter `threads` records T.
//  * compile time of the softmax graph: cold (empty cache dir: codegen + g++ + dlopen) and warm
//    (in-memory tier dropped: verified disk hit + dlopen), milliseconds.
//  * first-call latency of a compiled function (backend cpu, empty artifact cache) without and with
//    CompileOptions::async_compile: capture + codegen + g++ vs capture + codegen + one interpreter run.
// Aggregates: besides mean/median/stddev, "min" and "max" over repetitions (best time = min, best
// GB/s = max), because the 2-core development VM is shared with other builds.
// Run (see docs/cpu.md), once per thread count T (1 and 2 on the development VM):
//   OMP_NUM_THREADS=T PROTEAN_NUM_THREADS=T ./build/cpu_bench --benchmark_repetitions=9
//       --benchmark_report_aggregates_only=true --benchmark_out=bench/results/cpu_<date>_t<T>.json
//       --benchmark_out_format=json --benchmark_context=commit=$(git rev-parse --short HEAD)
//       --benchmark_context=omp_threads=T --benchmark_context=machine="..."
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <vector>

#include "backend/async_compile.h"
#include "backend/cpu/pipeline.h"
#include "cache/kernel_cache.h"
#include "ir/graph.h"
#include "ir/verifier.h"
#include "memcpy_peer.h"
#include "ops/registry.h"
#include "protean/protean.h"
#include "sym/shape_env.h"

namespace {

namespace pt = protean;
using pt::backend::BackendInput;
using pt::ops::OpKind;

using protean::bench::memcpy_bandwidth;  // the same-size, same-threads memcpy peer
/// Threads of the generated kernels' parallel loops (and of the memcpy peer).
int kernel_threads() { return omp_get_max_threads(); }
/// Counters of a rows × 4096 f32 program that reads x once and writes y once: GB/s of the kernel,
/// the same-run median peer (memcpy_GB/s; mem_frac = median copy time / median kernel time;
/// kernel_median_ms, memcpy_median_ms) and the best-of-many peer measured apart (memcpy_best_GB/s,
/// mem_frac_best).
void set_bandwidth(benchmark::State& state, int64_t rows, const protean::bench::CopyPeer* peer) {
  const size_t one_way = static_cast<size_t>(rows) * 4096 * 4;
  const double bytes = 2.0 * static_cast<double>(one_way), best = memcpy_bandwidth(one_way, kernel_threads());
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["memcpy_best_GB/s"] = best;
  state.counters["mem_frac_best"] = benchmark::Counter(bytes / 1e9 / best, benchmark::Counter::kIsIterationInvariantRate);
  if (peer) {
    state.counters["memcpy_GB/s"] = peer->copy_gbps();
    state.counters["mem_frac"] = peer->fraction();
    state.counters["kernel_median_ms"] = peer->kernel_median() * 1e3;
    state.counters["memcpy_median_ms"] = peer->copy_median() * 1e3;
  }
  state.counters["threads"] = kernel_threads();
}

/// Times `kernel` once per iteration, back to back, between two series of copies of x of the same
/// size (see CopyPeer); the iteration time reported is the kernel's.
template <class F>
void run_against_memcpy(benchmark::State& state, int64_t rows, const pt::Tensor& x, F&& kernel) {
  pt::Tensor dst = pt::empty({rows, 4096});  // allocated like the kernel's output
  protean::bench::CopyPeer peer(x.data_ptr(), dst.data_ptr(), static_cast<size_t>(rows) * 4096 * 4, kernel_threads());
  constexpr int kCopies = 8;
  peer.time_copies(kCopies);
  kernel();  // untimed: the kernel's own warm-up after the copies
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    kernel();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    peer.kernel(s);
    state.SetIterationTime(s);
  }
  peer.time_copies(kCopies);
  set_bandwidth(state, rows, &peer);
}

/// Graph builders: x : f32[s0, 4096] (s0 symbolic), w, b : f32[4096]. kSoftmax: softmax(x, -1);
/// kLayerNormGelu: gelu(layer_norm(x, [4096], w, b)); kAffine: x * w + b, one pass that reads x once
/// and writes y with ordinary stores: what a generated kernel of these bytes costs with no reduction
/// and next to no arithmetic (the fused rows' bound on this machine, beside the copy).
enum Kind { kSoftmax = 0, kLayerNormGelu = 1, kAffine = 2 };
struct Built {
  std::shared_ptr<const pt::ir::Graph> graph;
  std::vector<pt::sym::Expr> symbols;
};
pt::ir::ValueId call(pt::ir::Graph& g, pt::sym::ShapeEnv& env, OpKind op, std::vector<pt::ir::ValueId> in, pt::ops::Attrs a) {
  std::vector<pt::Tensor> fakes;
  for (auto v : in) fakes.push_back(pt::ir::fake_tensor(g.value(v)));
  std::vector<pt::TensorMeta> metas;
  {
    pt::sym::ShapeEnvScope scope(env);
    metas = pt::ops::run_meta(op, fakes, a);
  }
  return g.add_call(op, std::move(in), std::move(a), metas).at(0);
}
Built build(Kind kind) {
  // Built once per program: a fresh symbol per call would change the generated source (and the key).
  static Built cached[3];
  if (cached[kind].graph) return cached[kind];
  static pt::sym::ShapeEnv env;
  pt::SymInt s0 = env.create_symbol("x.size()[0]", 64, pt::sym::DimKind::Dynamic);
  pt::ir::Graph g;
  g.name = kind == kLayerNormGelu ? "ln_gelu" : kind == kAffine ? "affine" : "softmax";
  auto x = g.add_placeholder("x", pt::DType::F32, {s0, 4096});
  pt::ir::ValueId y;
  if (kind == kAffine) {
    auto w = g.add_placeholder("w", pt::DType::F32, {4096});
    auto b = g.add_placeholder("b", pt::DType::F32, {4096});
    y = call(g, env, OpKind::add, {call(g, env, OpKind::mul, {x, w}, {}), b}, {});
  } else if (kind == kLayerNormGelu) {
    auto w = g.add_placeholder("w", pt::DType::F32, {4096});
    auto b = g.add_placeholder("b", pt::DType::F32, {4096});
    auto n = call(g, env, OpKind::layer_norm, {x, w, b}, {{"normalized_shape", pt::SymIntVec{4096}}, {"eps", 1e-5}});
    y = call(g, env, OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  } else {
    y = call(g, env, OpKind::softmax, {x}, {{"dim", pt::SymInt(-1)}});
  }
  g.set_outputs({y});
  cached[kind] = {std::make_shared<const pt::ir::Graph>(std::move(g)), {s0.expr()}};
  return cached[kind];
}

std::unique_ptr<pt::backend::cpu::CpuArtifact> artifact(Kind kind) {
  Built b = build(kind);
  return pt::backend::cpu::compile_cpu(BackendInput{b.graph, b.symbols, "bench", "default"});
}

void BM_Memcpy(benchmark::State& state) {
  int64_t rows = state.range(0);
  size_t bytes = static_cast<size_t>(rows) * 4096 * 4;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  for (auto _ : state) {
    protean::bench::parallel_memcpy(b.data(), a.data(), bytes, kernel_threads());
    benchmark::DoNotOptimize(b.data());
  }
  set_bandwidth(state, rows, nullptr);
}

/// The peer method checked on itself: the "kernel" is the same copy into a second tensor, so mem_frac
/// should be 1 within noise.
void BM_MemcpyAsKernel(benchmark::State& state) {
  int64_t rows = state.range(0);
  pt::Tensor x = pt::randn({rows, 4096}), y = pt::empty({rows, 4096});
  run_against_memcpy(state, rows, x, [&] {
    protean::bench::parallel_memcpy(y.data_ptr<char>(), x.data_ptr<char>(), static_cast<size_t>(rows) * 4096 * 4, kernel_threads());
    benchmark::DoNotOptimize(y.data_ptr());
  });
}

void BM_Softmax(benchmark::State& state) {
  const bool compiled = state.range(1) != 0;
  int64_t rows = state.range(0);
  pt::Tensor x = pt::randn({rows, 4096});
  static auto art = artifact(kSoftmax);
  std::vector<pt::Tensor> in{x};
  run_against_memcpy(state, rows, x, [&] {
    if (compiled) benchmark::DoNotOptimize(art->run(in, std::span<const int64_t>(&rows, 1)));
    else benchmark::DoNotOptimize(pt::softmax(x, -1));
  });
}

/// A row case of x : f32[rows, 4096] and w, b : f32[4096]: the compiled artifact `art` of the graph
/// (compiled:1) or `eager(x, w, b)` (compiled:0), timed against the copy.
template <class Eager>
void run_xwb_case(benchmark::State& state, const pt::backend::cpu::CpuArtifact& art, Eager&& eager) {
  const bool compiled = state.range(1) != 0;
  int64_t rows = state.range(0);
  pt::Tensor x = pt::randn({rows, 4096}), w = pt::randn({4096}), b = pt::randn({4096});
  std::vector<pt::Tensor> in{x, w, b};
  run_against_memcpy(state, rows, x, [&] {
    if (compiled) benchmark::DoNotOptimize(art.run(in, std::span<const int64_t>(&rows, 1)));
    else benchmark::DoNotOptimize(eager(x, w, b));
  });
}

void BM_LayerNormGelu(benchmark::State& state) {
  static auto art = artifact(kLayerNormGelu);
  run_xwb_case(state, *art, [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
    return pt::gelu(pt::layer_norm(x, {4096}, w, b, 1e-5));
  });
}

/// The bound beside the fused rows: a generated one-pass kernel over the same bytes (see kAffine);
/// compiled:0 is the eager pair of ops (two passes and a temporary).
void BM_Affine(benchmark::State& state) {
  static auto art = artifact(kAffine);
  run_xwb_case(state, *art, [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) { return x * w + b; });
}

void BM_CompileSoftmax(benchmark::State& state) {
  const bool warm = state.range(0) != 0;
  std::string dir = "/tmp/protean-cpu-bench-cache";
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  for (auto _ : state) {
    state.PauseTiming();
    pt::cache::clear_memory_cache();
    if (!warm) std::filesystem::remove_all(dir);
    else if (pt::cache::disk_usage().entries == 0) artifact(kSoftmax);  // populate the disk tier once
    pt::cache::clear_memory_cache();
    state.ResumeTiming();
    benchmark::DoNotOptimize(artifact(kSoftmax));
  }
  state.counters["ms"] = benchmark::Counter(1e3, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

pt::Tensor first_call_fn(const pt::Tensor& x) { return pt::gelu(pt::softmax(x, -1) * 64.0); }

void BM_FirstCall(benchmark::State& state) {
  const bool async = state.range(0) != 0;
  std::string dir = "/tmp/protean-cpu-bench-first-call";
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::Tensor x = pt::randn({64, 4096});
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove_all(dir);
    pt::cache::clear_memory_cache();
    pt::reset();
    auto f = pt::compile(first_call_fn, {.name = "first_call", .arg_names = {"x"}, .backend = "cpu", .async_compile = async});
    state.ResumeTiming();
    benchmark::DoNotOptimize(f(x));
    state.PauseTiming();
    pt::backend::wait_for_async_compiles();  // the background build must not overlap the next iteration
    state.ResumeTiming();
  }
  state.counters["ms"] = benchmark::Counter(1e3, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void add_min_max(benchmark::internal::Benchmark* b) {
  b->ComputeStatistics("min", [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); });
  b->ComputeStatistics("max", [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); });
}

}  // namespace

BENCHMARK(BM_Memcpy)->Arg(256)->Arg(1024)->Arg(4096)->UseRealTime()->Apply(add_min_max);
BENCHMARK(BM_MemcpyAsKernel)->Arg(256)->Arg(1024)->Arg(4096)->ArgName("rows")->UseManualTime()->Apply(add_min_max);
BENCHMARK(BM_Softmax)->ArgsProduct({{256, 1024, 4096}, {0, 1}})->ArgNames({"rows", "compiled"})->UseManualTime()->Apply(add_min_max);
BENCHMARK(BM_LayerNormGelu)->ArgsProduct({{256, 1024, 4096}, {0, 1}})->ArgNames({"rows", "compiled"})->UseManualTime()->Apply(add_min_max);
BENCHMARK(BM_Affine)->ArgsProduct({{256, 1024, 4096}, {0, 1}})->ArgNames({"rows", "compiled"})->UseManualTime()->Apply(add_min_max);
BENCHMARK(BM_CompileSoftmax)->Arg(0)->Arg(1)->ArgName("warm")->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FirstCall)->Arg(0)->Arg(1)->ArgName("async")->Iterations(2)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
