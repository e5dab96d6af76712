// Times `protean report` on a generated 200k-event trace (2 ranks × 50 frames × 100 compiles × 20
// events): read, analyse, render HTML, render plain text. Target: under 10 s in total on the CI machine.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include "observe/report.h"
#include "report_trace_gen.h"

namespace fs = std::filesystem;
namespace rep = protean::observe::report;

namespace {
fs::path make_trace() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("protean_report_bench_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d / "trace");
    for (int r = 0; r < 2; ++r)
      protean::bench::write_rank(d / "trace" / fmt::format("protean_trace_rank{}_pid{}_1.jsonl", r, 1000 + r), r, 50, 100);
    return d;
  }();
  return dir;
}

void BM_Report200kEventsHtml(benchmark::State& state) {
  fs::path dir = make_trace();
  for (auto _ : state) {
    rep::TraceModel m = rep::read_trace_dir(dir / "trace");
    rep::Analysis a = rep::analyse(m);
    rep::write_html_site(m, a, dir / "html");
    state.counters["events"] = static_cast<double>(m.total_events);
  }
}
BENCHMARK(BM_Report200kEventsHtml)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

void BM_Report200kEventsPlainText(benchmark::State& state) {
  fs::path dir = make_trace();
  for (auto _ : state) {
    rep::TraceModel m = rep::read_trace_dir(dir / "trace");
    rep::Analysis a = rep::analyse(m);
    benchmark::DoNotOptimize(rep::render_plain_text(m, a));
  }
}
BENCHMARK(BM_Report200kEventsPlainText)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();
}  // namespace

BENCHMARK_MAIN();
