// The report at scale: a generated multi-rank trace (2 ranks × 10 frames × 20 compiles × 20 events)
// is read, analysed and rendered; every frame forms one similar-graph group. Timing lives in
// bench/report_bench.cpp (the 200k-event target), never in this test.
#include <gtest/gtest.h>

#include <unistd.h>

#include "../../bench/report_trace_gen.h"
#include "observe/report.h"

namespace fs = std::filesystem;
namespace rep = protean::observe::report;

TEST(ReportScale, ManyFramesAndRanks) {
  fs::path dir = fs::temp_directory_path() / ("protean_report_scale_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "trace");
  int64_t events = 0;
  for (int r = 0; r < 2; ++r)
    events += protean::bench::write_rank(dir / "trace" / fmt::format("protean_trace_rank{}_pid{}_1.jsonl", r, 1000 + r), r, 10, 20);
  ASSERT_EQ(events, 2 * 10 * 20 * 20);
  rep::TraceModel m = rep::read_trace_dir(dir / "trace");
  rep::Analysis a = rep::analyse(m);
  rep::write_html_site(m, a, dir / "html");
  EXPECT_EQ(m.total_events, events);
  EXPECT_EQ(a.groups.size(), 20u);  // one similar group per frame per rank
  EXPECT_EQ(a.allowlist_line, "PROTEAN_DYNAMIC_SOURCES=x.size()[1],n");
  EXPECT_TRUE(fs::exists(dir / "html" / "index.html"));
  fs::remove_all(dir);
}
