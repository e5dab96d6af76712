// Graph-break benchmarks (docs/breaks.md):
//  * per-op recording overhead in segmented mode: a segmented body records N ops whose results it
//    drops, so the segment is recorded and then discarded without running (items = ops recorded;
//    ns/op = 1e9 / items_per_second). BM_EagerMetaOnly/N is the meta-function share (the same N ops
//    dispatched under a hook that only runs meta functions) for comparison;
//  * per-call overhead of a 2-segment function (one item() break) against the same computation
//    written without the break (one graph), both on the interp backend, and the plain eager body.
#include <benchmark/benchmark.h>

#include "ops/dispatch.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;

namespace {

void BM_SegmentedRecordPerOp(benchmark::State& st) {
  const int64_t n = st.range(0);
  auto body = [n](const Tensor& x, const Tensor& y) {
    pt::graph_break("bench: start segmented");
    for (int64_t i = 0; i < n; ++i) {
      Tensor t = x + y;  // recorded, never run (nobody holds the result at the flush)
      benchmark::DoNotOptimize(t);
    }
    return x;
  };
  auto f = pt::compile(body, {.name = "record", .arg_names = {"x", "y"}, .backend = "interp"});
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  f(x, y);
  if (!f.segmented()) st.SkipWithError("function did not become segmented");
  for (auto _ : st) benchmark::DoNotOptimize(f(x, y));
  st.SetItemsProcessed(st.iterations() * n);
}
BENCHMARK(BM_SegmentedRecordPerOp)->Arg(0)->Arg(1000);

// The meta functions alone (what any dispatch under capture pays), under a hook that records nothing.
class MetaOnlyHook final : public pt::ops::TraceHook {
 public:
  std::vector<Tensor> record(pt::ops::OpKind, std::span<const Tensor> in, const pt::ops::Attrs&,
                             std::vector<pt::TensorMeta>) override {
    return {in[0]};
  }
  void on_host_read(const Tensor&, const char*) override {}
  void on_graph_break(const std::string&) override {}
  std::vector<Tensor> on_data_dependent(pt::ops::OpKind, std::span<const Tensor> in, const pt::ops::Attrs&) override {
    return {in[0]};
  }
};

void BM_EagerMetaOnly(benchmark::State& st) {
  const int64_t n = st.range(0);
  Tensor x = pt::randn({8, 16}), y = pt::randn({8, 16});
  MetaOnlyHook hook;
  for (auto _ : st) {
    pt::ops::TraceHookScope scope(&hook);
    for (int64_t i = 0; i < n; ++i) {
      Tensor t = x + y;
      benchmark::DoNotOptimize(t);
    }
  }
  st.SetItemsProcessed(st.iterations() * n);
}
BENCHMARK(BM_EagerMetaOnly)->Arg(1000);

Tensor two_segments(const Tensor& x, const Tensor& w) {
  Tensor y = pt::tanh(pt::matmul(x, w)) * 2.0 + 1.0;
  float s = y.sum().item<float>();
  return pt::relu(y - s / 10.0f) * 3.0;
}
Tensor one_graph(const Tensor& x, const Tensor& w) {
  Tensor y = pt::tanh(pt::matmul(x, w)) * 2.0 + 1.0;
  return pt::relu(y - y.sum() / 10.0) * 3.0;
}

void BM_Eager2Segment(benchmark::State& st) {
  Tensor x = pt::randn({8, 16}), w = pt::randn({16, 16});
  for (auto _ : st) benchmark::DoNotOptimize(two_segments(x, w));
}
BENCHMARK(BM_Eager2Segment);

void BM_Compiled2Segment(benchmark::State& st) {
  auto f = pt::compile(two_segments, {.name = "two_segments", .arg_names = {"x", "w"}, .backend = "interp"});
  Tensor x = pt::randn({8, 16}), w = pt::randn({16, 16});
  f(x, w);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, w));
}
BENCHMARK(BM_Compiled2Segment);

void BM_CompiledNoBreak(benchmark::State& st) {
  auto f = pt::compile(one_graph, {.name = "one_graph", .arg_names = {"x", "w"}, .backend = "interp"});
  Tensor x = pt::randn({8, 16}), w = pt::randn({16, 16});
  f(x, w);
  for (auto _ : st) benchmark::DoNotOptimize(f(x, w));
}
BENCHMARK(BM_CompiledNoBreak);

}  // namespace

BENCHMARK_MAIN();
