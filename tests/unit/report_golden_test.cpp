// Golden tests of `protean report --plain-text` on hand-written scenario traces, plus targeted checks
// of the findings each scenario exists for (so a regenerated golden file cannot silently bless a wrong
// answer), the HTML site and the CLI glue.
//
// Scenarios live in tests/golden/report/: NAME.jsonl (one process) or NAME/ (a trace directory) with
// the expected output in NAME.txt. Regenerate with PROTEAN_UPDATE_GOLDEN=1 after checking the diff.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include "golden.h"
#include "observe/report.h"
#include "protean/error.h"
#include "protean/report_cmd.h"

namespace fs = std::filesystem;
namespace rep = protean::observe::report;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

const fs::path kGolden = fs::path(PROTEAN_SOURCE_DIR) / "tests" / "golden" / "report";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Scratch directories of this process, removed when it exits (ctest runs each test in a process of
/// its own; they had been left in /tmp, one per test run).
struct ScratchDirs {
  std::vector<fs::path> dirs;
  ~ScratchDirs() {
    std::error_code ec;
    for (const auto& d : dirs) fs::remove_all(d, ec);
  }
};

fs::path fresh_dir(const std::string& name) {
  static ScratchDirs scratch;
  fs::path d = fs::temp_directory_path() / ("protean_report_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  scratch.dirs.push_back(d);
  return d;
}

/// The trace directory of a scenario: NAME/ itself, or a temp dir holding a copy of NAME.jsonl.
fs::path scenario_dir(const std::string& name) {
  fs::path dir = kGolden / name;
  if (fs::is_directory(dir)) return dir;
  fs::path tmp = fresh_dir("scenario_" + name);
  fs::copy_file(kGolden / (name + ".jsonl"), tmp / (name + ".jsonl"));
  return tmp;
}

std::string plain_text(const std::string& name) {
  rep::TraceModel m = rep::read_trace_dir(scenario_dir(name));
  rep::Analysis a = rep::analyse(m);
  return rep::render_plain_text(m, a);
}


const std::vector<std::string> kScenarios = {"automatic_dynamic", "similar_static", "graph_break", "error",
                                             "two_ranks",         "damaged",        "two_functions"};

class ReportGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ReportGolden, PlainTextMatchesGolden) {
  const std::string name = GetParam();
  const std::string actual = plain_text(name);
  if (!protean::testing::expect_golden(actual, "report/" + name + ".txt")) GTEST_SKIP() << "updated the golden of " << name;
}

INSTANTIATE_TEST_SUITE_P(Scenarios, ReportGolden, ::testing::ValuesIn(kScenarios),
                         [](const auto& info) { return info.param; });

TEST(ReportGoldenFiles, EveryScenarioHasATest) {
  for (const auto& e : fs::directory_iterator(kGolden)) {
    std::string stem = e.path().stem().string();
    if (e.is_directory() || e.path().extension() == ".jsonl") {
      EXPECT_NE(std::find(kScenarios.begin(), kScenarios.end(), stem), kScenarios.end())
          << e.path() << " is not in kScenarios";
    }
  }
}

// ---- what each scenario is for ---------------------------------------------------------------------

TEST(ReportFindings, AutomaticDynamic) {
  const std::string t = plain_text("automatic_dynamic");
  EXPECT_THAT(t, HasSubstr("0/0  recompiled"));
  EXPECT_THAT(t, HasSubstr("0/1  success"));
  EXPECT_THAT(t, HasSubstr("reason: 0/0: tensor 'x' size mismatch at index 3. expected 160, actual 320"));
  EXPECT_THAT(t, HasSubstr("symbol: s0 = 320 for x.size()[3] [2, int_oo] at mlp.cpp:14"));
  EXPECT_THAT(t, HasSubstr("x dim 3     160  s0 (320)"));  // the similar-graph table
  EXPECT_THAT(t, HasSubstr("\nPROTEAN_DYNAMIC_SOURCES=x.size()[3]\n"));
  EXPECT_THAT(t, HasSubstr("\npt::mark_dynamic(x, 3);  // in C++, before calling mlp\n"));
  EXPECT_THAT(t, HasSubstr("0/1 (rank 0): automatic dynamic"));
}

TEST(ReportFindings, TrainStepPartsAreCountedFromLocationComments) {
  // Frame 0 is a train step (forward, `[bwd of ...]` and `[optim at ...]` ops, a constant in no part);
  // frame 1 a plain forward graph, which gets no parts line.
  std::string t;
  auto ev = [&](const std::string& body) { t += R"({"v":1,"ts_us":1,"pid":7,"rank":0,)" + body + "}\n"; };
  const std::string ir =
      R"(graph step(%x : f32[4], %w : f32[4]):\n)"
      R"(  %0 : f32[4] = mul(%x, %w)  # mlp.cpp:3\n)"
      R"(  %1 : f32[] = sum(%0, dims=[], keepdim=false)  # mlp.cpp:4\n)"
      R"(  %2 : f32[4] = mul(%x, %x)  # [bwd of mlp.cpp:3]\n)"
      R"(  %c0 : f32[] = constant()\n)"
      R"(  %3 : f32[4] = mul(%c0, %2)  # [optim at mlp.cpp:9]\n)"
      R"(  %4 : f32[4] = sub(%w, %3)  # [optim at mlp.cpp:9]\n)"
      R"(  return (%1, %4)\n)";
  ev(R"("event":"compile_start","frame":0,"compile_id":"0/0","function":"step")");
  ev(R"("event":"graph","frame":0,"compile_id":"0/0","ir":")" + ir + R"(","node_count":5,"graph_hash":"ab")");
  ev(R"("event":"compilation_metrics","frame":0,"status":"success","compile_id":"0/0")");
  ev(R"("event":"compile_start","frame":1,"compile_id":"1/0","function":"fwd")");
  ev(R"("event":"graph","frame":1,"compile_id":"1/0","ir":"graph fwd(%x : f32[4]):\n  %0 : f32[4] = relu(%x)  # a.cpp:1\n  return (%0)\n","node_count":1,"graph_hash":"cd")");
  ev(R"("event":"compilation_metrics","frame":1,"status":"success","compile_id":"1/0")");
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", t}});
  const std::string text = rep::render_plain_text(m, rep::analyse(m));
  EXPECT_THAT(text, HasSubstr("train step parts: forward 2 ops, backward 1 ops, optimizer 2 ops\n")) << text;
  EXPECT_EQ(text.find("train step parts:"), text.rfind("train step parts:")) << "one line only (frame 0)\n" << text;
}

TEST(ReportFindings, AMarkInOneFunctionDoesNotHideTheSameNameInAnother) {
  // Frame 0 (f) marks x dim 1; frame 1 (g) recompiled because its own x dim 1 changed.
  std::string t;
  auto ev = [&](const std::string& body) { t += R"({"v":1,"ts_us":1,"pid":7,"rank":0,)" + body + "}\n"; };
  ev(R"("event":"compile_start","frame":0,"compile_id":"0/0","function":"f")");
  ev(R"("event":"dimension_decision","compile_id":"0/0","frame":0,"source":"x","dim":1,"decision":"dynamic","why":"mark_dynamic","value":5)");
  for (int c = 0; c < 2; ++c) {
    std::string id = fmt::format("1/{}", c);
    ev(R"("event":"compile_start","frame":1,"function":"g","compile_id":")" + id + "\"");
    ev(R"("event":"graph","frame":1,"compile_id":")" + id + R"(","ir":"","node_count":1,"graph_hash":"aa","inputs":[{"source":"x","dtype":"f32","sizes":["4",")" +
       std::to_string(8 * (c + 1)) + R"("]}])");
    ev(R"("event":"compilation_metrics","frame":1,"status":"success","compile_id":")" + id + "\"");
  }
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", t}});
  rep::Analysis a = rep::analyse(m);
  ASSERT_EQ(a.already_dynamic.size(), 1u);
  EXPECT_EQ(a.already_dynamic[0].why, "mark_dynamic");
  ASSERT_EQ(a.suggestions.size(), 1u) << rep::render_plain_text(m, a);
  EXPECT_EQ(a.suggestions[0].source, "x");
  EXPECT_EQ(a.suggestions[0].dim, 1);
}

// Two compiled functions with an input named x each (the same trace twice, as frames of `mlp` and
// `head`): the suggestions are grouped per function, each with its allowlist line and the C++ line to
// paste before its call, and the merged line is given once more for setting every function at once.
TEST(ReportFindings, SuggestionsPerCompiledFunction) {
  rep::TraceModel m = rep::read_trace_dir(scenario_dir("two_functions"));
  rep::Analysis a = rep::analyse(m);
  ASSERT_EQ(a.per_function.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(a.per_function[i].function, i == 0 ? "mlp" : "head");
    EXPECT_EQ(a.per_function[i].allowlist_line, "PROTEAN_DYNAMIC_SOURCES=x.size()[3]");
    EXPECT_EQ(a.per_function[i].mark_dynamic_calls, (std::vector<std::string>{"pt::mark_dynamic(x, 3);"}));
  }
  EXPECT_EQ(a.allowlist_line, "PROTEAN_DYNAMIC_SOURCES=x.size()[3]");
  const std::string t = rep::render_plain_text(m, a);
  EXPECT_THAT(t, HasSubstr("function mlp:\nPROTEAN_DYNAMIC_SOURCES=x.size()[3]\npt::mark_dynamic(x, 3);  // in C++, "
                           "before calling mlp\nfunction head:\nPROTEAN_DYNAMIC_SOURCES=x.size()[3]\n"
                           "pt::mark_dynamic(x, 3);  // in C++, before calling head\n"
                           "every function at once: PROTEAN_DYNAMIC_SOURCES=x.size()[3]\n"));
}

TEST(ReportFindings, SimilarStaticGraphs) {
  rep::TraceModel m = rep::read_trace_dir(scenario_dir("similar_static"));
  rep::Analysis a = rep::analyse(m);
  ASSERT_EQ(a.groups.size(), 1u);
  EXPECT_EQ(a.groups[0].members, (std::vector<std::string>{"0/0", "0/1", "0/2"}));
  ASSERT_EQ(a.groups[0].rows.size(), 1u);  // only x dim 3 differs; w is identical
  EXPECT_EQ(a.groups[0].rows[0].concrete, (std::vector<std::string>{"160", "320", "480"}));
  EXPECT_EQ(a.allowlist_line, "PROTEAN_DYNAMIC_SOURCES=x.size()[3]");
  EXPECT_EQ(a.mark_dynamic_calls, (std::vector<std::string>{"pt::mark_dynamic(x, 3);"}));
  const std::string t = rep::render_plain_text(m, a);
  EXPECT_THAT(t, HasSubstr("x dim 3 took 160, 320, 480 → make it dynamic"));
  EXPECT_THAT(t, HasSubstr("0/0  recompiled"));
  EXPECT_THAT(t, HasSubstr("0/1  recompiled"));
  EXPECT_THAT(t, HasSubstr("0/2  success"));
}

TEST(ReportFindings, GraphBreak) {
  const std::string t = plain_text("graph_break");
  EXPECT_THAT(t, HasSubstr("0/0  graph break"));
  EXPECT_THAT(t, HasSubstr("graph break: Tensor.item() reads tensor data on the host (op item) at decode.cpp:43"));
  EXPECT_THAT(t, HasSubstr("1/0  success"));
  EXPECT_THAT(t, HasSubstr("Similar graphs ==\n  none"));
}

TEST(ReportFindings, Error) {
  const std::string t = plain_text("error");
  EXPECT_THAT(t, HasSubstr("0/1  error"));
  EXPECT_THAT(t, HasSubstr("error: mark_dynamic(q, 0) was specialized to 1"));
  EXPECT_THAT(t, HasSubstr("specialization: s0 = 1 (sources q.size()[0]): Eq(s0, 1) at attn.cpp:22"));
  EXPECT_THAT(t, HasSubstr("eager fallback: compile 0/1 failed"));
  EXPECT_THAT(t, HasSubstr("already dynamic: q dim 0 (mark_dynamic)"));
  EXPECT_THAT(t, Not(HasSubstr("PROTEAN_DYNAMIC_SOURCES")));  // q is already marked by the user
}

TEST(ReportFindings, TwoRanksWithMismatchedGraphs) {
  const std::string t = plain_text("two_ranks");
  EXPECT_THAT(t, HasSubstr("== Ranks =="));
  EXPECT_THAT(t, HasSubstr("WARNING: compile 0/1 (forward) exists on rank 0 but not on rank 1"));
  EXPECT_THAT(t, HasSubstr("WARNING: ranks compiled different graphs for 0/0 (forward): rank 0: graph_hash 5eed0000"));
  EXPECT_THAT(t, HasSubstr("rank 1: graph_hash 5eed0001, inputs x f32[6, 128]"));
  EXPECT_THAT(t, HasSubstr("PROTEAN_DYNAMIC_SOURCES=x"));
  EXPECT_THAT(t, HasSubstr("pt::mark_dynamic(x, 0);"));
}

TEST(ReportFindings, DamagedTraceIsCountedNotFatal) {
  rep::TraceModel m = rep::read_trace_dir(scenario_dir("damaged"));
  ASSERT_EQ(m.files.size(), 1u);
  const rep::FileStats& f = m.files[0];
  EXPECT_EQ(f.malformed, 6);  // truncated x3, not JSON, an array, no event name
  EXPECT_EQ(f.first_malformed, 3);
  EXPECT_EQ(f.unknown, 1);
  EXPECT_EQ(f.first_unknown_name, "kernel_autotune");
  EXPECT_EQ(f.newer, 1);
  EXPECT_EQ(f.bad_fields, 3);  // node_count "six", guards text a list, location/reasons of 0/1
  rep::Analysis a = rep::analyse(m);
  const std::string t = rep::render_plain_text(m, a);
  EXPECT_THAT(t, HasSubstr("6 malformed lines skipped in file damaged.jsonl (first at line 3)"));
  EXPECT_THAT(t, HasSubstr("1 unknown event skipped in file damaged.jsonl (first at line 4: \"kernel_autotune\")"));
  EXPECT_THAT(t, HasSubstr("1 event from a newer trace format skipped"));
  // A single reason string where a list was expected is still shown.
  EXPECT_THAT(t, HasSubstr("reason: 0/0: tensor 'x' size mismatch at index 0. expected 8, actual 9"));
}

// ---- parsing details -------------------------------------------------------------------------------

TEST(ReportReader, OpsAndInputsComeFromTheIrWhenTheEventHasNoInputs) {
  const std::string line =
      R"J({"v":1,"ts_us":1,"pid":1,"rank":0,"event":"graph","compile_id":"0/0","ir":"graph f(%x : f32[s0, 512], %self.w : bf16[512, 64]):\n  %0 : f32[s0, 64] = matmul(%x, %self.w)  # f.cpp:4\n  %1 : f32[s0, 64] = gelu(%0, approximate=\"none\")  # f.cpp:5\n  return (%1)"})J";
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", line}});
  ASSERT_EQ(m.processes.size(), 1u);
  const rep::Compile& c = m.processes[0].frames.at(0).compiles.begin()->second;
  EXPECT_EQ(c.ops, (std::vector<std::string>{"matmul", "gelu"}));
  ASSERT_EQ(c.inputs.size(), 2u);
  EXPECT_EQ(c.inputs[1].source, "self.w");
  EXPECT_EQ(c.inputs[1].dtype, "bf16");
  EXPECT_EQ(c.inputs[0].sizes, (std::vector<std::string>{"s0", "512"}));
}

TEST(ReportReader, CompilesSortNumerically) {
  std::string text;
  for (int c : {10, 2, 1})
    text += R"J({"v":1,"event":"compile_start","frame":3,"compile_id":"3/)J" + std::to_string(c) + R"J(","function":"f"})J" "\n";
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", text}});
  std::vector<std::string> ids;
  for (const auto& [k, c] : m.processes[0].frames.at(3).compiles) ids.push_back(c.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"3/1", "3/2", "3/10"}));
}

// A *.jsonl that is a FIFO (which would block a reader) or a directory is a warning naming what it
// is; it was passed over without a word.
TEST(ReportReader, TraceFilesThatAreNoFilesAreWarnings) {
  const std::string dir = fmt::format("/tmp/protean-report-fifo-{}", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/protean_trace_rank2_pid2_1.jsonl");
  ASSERT_EQ(::mkfifo((dir + "/protean_trace_rank1_pid1_1.jsonl").c_str(), 0644), 0);
  {
    std::ofstream(dir + "/protean_trace_rank0_pid7_1.jsonl")
        << R"J({"v":1,"event":"compile_start","frame":0,"compile_id":"0/0","function":"f"})J" << "\n";
  }
  rep::TraceModel m = rep::read_trace_dir(dir);
  const std::string t = rep::render_plain_text(m, rep::analyse(m));
  EXPECT_THAT(t, HasSubstr("file protean_trace_rank1_pid1_1.jsonl could not be read: it is a FIFO (named pipe), not a regular file"));
  EXPECT_THAT(t, HasSubstr("file protean_trace_rank2_pid2_1.jsonl could not be read: it is a directory, not a regular file"));
  std::filesystem::remove_all(dir);
}

TEST(ReportReader, MissingDirectoryThrows) {
  EXPECT_THROW(rep::read_trace_dir("/nonexistent/protean/trace"), protean::RuntimeError);
}

// ---- HTML site -------------------------------------------------------------------------------------

TEST(ReportHtml, WritesEveryPageAndEscapesTraceText) {
  std::string text =
      R"J({"v":1,"pid":7,"rank":0,"event":"compile_start","frame":0,"compile_id":"0/0","function":"f<T>","reasons":[]})J" "\n"
      R"J({"v":1,"pid":7,"rank":0,"event":"compile_start","frame":0,"compile_id":"0/1","function":"f<T>","reasons":["0/0: <script>alert(1)</script>&\"'"]})J" "\n"
      R"J({"v":1,"pid":7,"rank":0,"event":"graph","compile_id":"0/1","ir":"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x)  # <b>.cpp:1\n  return (%0)"})J" "\n"
      R"J({"v":1,"pid":7,"rank":0,"event":"compilation_metrics","compile_id":"0/1","status":"success","phases":{"capture":0.5,"<i>":0.25}})J" "\n";
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", text}});
  rep::Analysis a = rep::analyse(m);
  fs::path out = fresh_dir("html_escape");
  rep::write_html_site(m, a, out);
  for (const char* f : {"index.html", "dynamic.html", "compile_0_0.html", "compile_0_1.html", "chromium_events.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_FALSE(fs::exists(out / "ranks.html"));  // one process
  for (const char* f : {"index.html", "compile_0_1.html"}) {
    const std::string html = slurp(out / f);
    EXPECT_THAT(html, Not(HasSubstr("<script>"))) << f;
    EXPECT_THAT(html, Not(HasSubstr("<b>.cpp"))) << f;
    EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;")) << f;
    EXPECT_THAT(html, Not(HasSubstr("http://"))) << "no external resources in " << f;
  }
  EXPECT_THAT(slurp(out / "compile_0_1.html"), HasSubstr("&lt;b&gt;.cpp:1"));
  EXPECT_THAT(slurp(out / "index.html"), HasSubstr("<svg"));  // the compile-time plot
}

// Two runs of one program traced into one directory (both rank 0, two pids) are not ranks of one job:
// no rank comparison, a note saying so. Two ranks of one job (distinct ranks; a job id recorded or not)
// are compared; two jobs in one directory are compared each within itself.
TEST(ReportRanks, SeparateRunsInOneDirectoryAreNotComparedAsRanks) {
  auto proc = [](int pid, int rank, const std::string& job, const std::string& op) {
    std::string p = fmt::format(R"J("pid":{},"rank":{})J", pid, rank);
    return "{\"v\":1," + p + R"J(,"event":"process_start","version":"x","host":"h","job":")J" + job + "\"}\n" +
           "{\"v\":1," + p + R"J(,"event":"compile_start","frame":0,"compile_id":"0/0","function":"f"})J" "\n" +
           "{\"v\":1," + p + R"J(,"event":"graph","compile_id":"0/0","graph_hash":")J" + op +
           R"J(","ir":"graph f(%x : f32[2]):\n  %0 : f32[2] = )J" + op + "(%x)\\n  return (%0)\"}\n";
  };
  {
    rep::TraceModel m = rep::read_trace_texts({{"a.jsonl", proc(11, 0, "", "relu")}, {"b.jsonl", proc(12, 0, "", "tanh")}});
    rep::Analysis a = rep::analyse(m);
    EXPECT_FALSE(a.multi_rank);
    EXPECT_TRUE(a.rank_warnings.empty());
    ASSERT_EQ(a.run_notes.size(), 1u);
    EXPECT_THAT(a.run_notes[0], HasSubstr("rank 0 in 2 processes (pids 11, 12)"));
    EXPECT_THAT(rep::render_plain_text(m, a), HasSubstr("separate runs"));
  }
  {  // a job id is printed on one line, shortened
    rep::TraceModel m = rep::read_trace_texts({{"a.jsonl", proc(11, 0, "j\\nx", "relu")}, {"b.jsonl", proc(12, 0, "j\\nx", "relu")}});
    rep::Analysis a = rep::analyse(m);
    ASSERT_EQ(a.run_notes.size(), 1u);
    EXPECT_THAT(a.run_notes[0], HasSubstr("of job 'j x'"));
  }
  {  // ranks 0 and 1 of job 7, and ranks 0 and 1 of job 8: each job compared within itself
    rep::TraceModel m = rep::read_trace_texts({{"a.jsonl", proc(11, 0, "7", "relu")}, {"b.jsonl", proc(12, 1, "7", "relu")},
                                               {"c.jsonl", proc(21, 0, "8", "relu")}, {"d.jsonl", proc(22, 1, "8", "tanh")}});
    rep::Analysis a = rep::analyse(m);
    EXPECT_TRUE(a.multi_rank);
    EXPECT_TRUE(a.run_notes.empty());
    ASSERT_EQ(a.rank_warnings.size(), 1u) << ::testing::PrintToString(a.rank_warnings);
    EXPECT_THAT(a.rank_warnings[0], HasSubstr("pid 21"));
    EXPECT_THAT(a.rank_warnings[0], HasSubstr("pid 22"));
  }
}

// Two runs that got the same pid (every container starts its program at the same pid) are two
// processes when process_start records each one's instance; they had been merged into one, their
// compiles of frame 0 mixed.
TEST(ReportRanks, ProcessesWithTheSamePidAreToldApartByTheirInstance) {
  auto run = [](const std::string& instance, const std::string& op) {
    const std::string p = R"J("pid":7,"rank":0)J";
    return "{\"v\":1," + p + R"J(,"event":"process_start","version":"x","host":"h","job":"","instance":")J" + instance +
           "\"}\n" + "{\"v\":1," + p + R"J(,"event":"compile_start","frame":0,"compile_id":"0/0","function":"f"})J" "\n" +
           "{\"v\":1," + p + R"J(,"event":"graph","compile_id":"0/0","graph_hash":")J" + op +
           R"J(","ir":"graph f(%x : f32[2]):\n  %0 : f32[2] = )J" + op + "(%x)\\n  return (%0)\"}\n";
  };
  rep::TraceModel m = rep::read_trace_texts({{"protean_trace_rank0_pid7_100.jsonl", run("00000000000000a1", "relu")},
                                             {"protean_trace_rank0_pid7_200.jsonl", run("00000000000000b2", "tanh")}});
  ASSERT_EQ(m.processes.size(), 2u);
  EXPECT_EQ(m.processes[0].frames.at(0).compiles.size(), 1u);
  EXPECT_EQ(m.processes[1].frames.at(0).compiles.size(), 1u);
  EXPECT_NE(m.processes[0].label, m.processes[1].label);
  EXPECT_THAT(m.processes[0].label + " " + m.processes[1].label, HasSubstr("protean_trace_rank0_pid7_200.jsonl"));
  rep::Analysis a = rep::analyse(m);
  EXPECT_FALSE(a.multi_rank);
  ASSERT_EQ(a.run_notes.size(), 1u);
  EXPECT_THAT(a.run_notes[0], HasSubstr("rank 0 in 2 processes"));
}

TEST(ReportHtml, SiteForScenarios) {
  rep::TraceModel m = rep::read_trace_dir(scenario_dir("two_ranks"));
  rep::Analysis a = rep::analyse(m);
  fs::path out = fresh_dir("html_ranks");
  rep::write_html_site(m, a, out);
  EXPECT_TRUE(fs::exists(out / "ranks.html"));
  EXPECT_TRUE(fs::exists(out / "compile_0_0_rank0.html"));
  EXPECT_TRUE(fs::exists(out / "compile_0_0_rank1.html"));
  EXPECT_TRUE(fs::exists(out / "compile_0_1_rank0.html"));
  EXPECT_THAT(slurp(out / "ranks.html"), HasSubstr("ranks compiled different graphs for 0/0"));
  EXPECT_THAT(slurp(out / "dynamic.html"), HasSubstr("PROTEAN_DYNAMIC_SOURCES=x"));
  EXPECT_THAT(slurp(out / "dynamic.html"), HasSubstr("pt::mark_dynamic(x, 0);"));

  // Trace Event Format, pid/tid = rank.
  auto j = nlohmann::json::parse(slurp(out / "chromium_events.json"));
  ASSERT_TRUE(j.contains("traceEvents"));
  int phases = 0;
  std::set<int> pids;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++phases;
      EXPECT_EQ(e["pid"], e["tid"]);
      EXPECT_TRUE(e.contains("dur"));
      pids.insert(e["pid"].get<int>());
    }
  }
  EXPECT_EQ(phases, 2);
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
}

// ---- CLI glue --------------------------------------------------------------------------------------

TEST(ReportCli, PlainTextAndHtml) {
  std::ostringstream out, err;
  protean::tools::ReportArgs args;
  args.trace_dir = scenario_dir("similar_static").string();
  args.plain_text = true;
  EXPECT_EQ(protean::tools::run_report(args, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("PROTEAN_DYNAMIC_SOURCES=x"));

  std::ostringstream out2, err2;
  args.plain_text = false;
  args.out_dir = fresh_dir("cli_out").string();
  EXPECT_EQ(protean::tools::run_report(args, out2, err2), 0) << err2.str();
  EXPECT_TRUE(fs::exists(fs::path(args.out_dir) / "index.html"));
  EXPECT_THAT(out2.str(), HasSubstr("suggested: PROTEAN_DYNAMIC_SOURCES=x"));

  std::ostringstream out3, err3;
  args.trace_dir = "/nonexistent/trace/dir";
  EXPECT_EQ(protean::tools::run_report(args, out3, err3), 1);
  EXPECT_THAT(err3.str(), HasSubstr("not a directory"));

  std::ostringstream out4, err4;
  args.out_dir.clear();
  EXPECT_EQ(protean::tools::run_report(args, out4, err4), 2);
  EXPECT_THAT(err4.str(), HasSubstr("-o OUT"));
}

}  // namespace

namespace {

// ---- a real traced program ---------------------------------------------------------------------------
// tests/trace/traced_program.cpp runs twice with PROTEAN_TRACE (one trace dir per run), one PGO job id
// and one private cache dir: the first run starts without a profile and compiles every kernel, the
// second loads the stored profile and finds its kernels on disk; a third, over a damaged profile and
// damaged kernels, must report both corrupt and recover (checked by findings only). Its plain-text reports, with pids,
// times, byte counts, cache keys and temp paths normalized, are compared with live_program.txt.

std::string run_traced_program(const fs::path& trace_dir, const fs::path& cache_dir, const std::string& env = "") {
  std::string cmd = env + " PROTEAN_TRACE='" + trace_dir.string() + "' PROTEAN_CACHE_DIR='" + cache_dir.string() +
                    "' PROTEAN_JOB_ID=report-golden PROTEAN_LOGS= PROTEAN_DYNAMIC_SOURCES= PROTEAN_PGO_REMOTE= '" +
                    std::string(PROTEAN_TRACED_PROGRAM) + "' 2>&1";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return "cannot run " + cmd;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = ::pclose(p);
  if (rc != 0) out += "\nexit status " + std::to_string(rc);
  return out;
}

/// Every event named `event` in the trace files of `dir`, parsed.
std::vector<nlohmann::json> trace_events(const fs::path& dir, const std::string& event) {
  std::vector<nlohmann::json> r;
  for (const auto& f : fs::directory_iterator(dir)) {
    std::ifstream in(f.path());
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.value("event", "") == event) r.push_back(std::move(j));
    }
  }
  return r;
}

/// The `cache` objects of the successful compilation_metrics events of a trace, dumped.
std::vector<std::string> metrics_cache(const fs::path& dir) {
  std::vector<std::string> r;
  for (const auto& j : trace_events(dir, "compilation_metrics"))
    if (j.value("status", "") == "success") r.push_back(j.at("cache").dump());
  return r;
}

/// Replaces every match of `re` in `s` with `with`.
std::string replace_all(const std::string& s, const std::string& re, const std::string& with) {
  return std::regex_replace(s, std::regex(re), with);
}

std::string normalize_report(std::string t, const fs::path& cache_dir) {
  t = replace_all(t, std::regex_replace(cache_dir.string(), std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"), "<cache>");
  t = replace_all(t, R"(protean_trace_rank(\d+)_pid\d+_\d+\.jsonl)", "protean_trace_rank$1_pid<pid>_<ms>.jsonl");
  t = replace_all(t, R"(pid \d+)", "pid <pid>");
  t = replace_all(t, R"([^ ]*/traced_program\.cpp)", "traced_program.cpp");  // frame locations are build-relative
  t = replace_all(t, R"(\d+\.\d{3} s\b)", "<t> s");
  t = replace_all(t, R"(\(\d+ bytes\))", "(<n> bytes)");
  t = replace_all(t, R"(\d+ events\b)", "<n> events");
  return t;
}

TEST(ReportGoldenLive, TracedProgramPgoAndCache) {
  const fs::path root = fresh_dir("live");
  const fs::path cache = root / "cache";
  std::string report;
  std::vector<std::string> texts;
  for (int run = 1; run <= 2; ++run) {
    const fs::path trace = root / ("trace" + std::to_string(run));
    const std::string out = run_traced_program(trace, cache);
    ASSERT_THAT(out, HasSubstr("row_sums ok: yes")) << out;
    rep::TraceModel m = rep::read_trace_dir(trace);
    rep::Analysis a = rep::analyse(m);
    texts.push_back(rep::render_plain_text(m, a));
    report += fmt::format("#### run {}\n", run) + normalize_report(texts.back(), cache);
  }
  // What the scenario exists for (checked on the raw text, so a regenerated golden cannot bless a
  // report that lost them).
  const std::string& first = texts[0];
  EXPECT_THAT(first, HasSubstr("pgo: load missing " + (cache / "pgo" / "report-golden" / "rank0.json").string()));
  EXPECT_THAT(first, HasSubstr("pgo: store " + (cache / "pgo" / "report-golden" / "rank0.json").string()));
  EXPECT_THAT(first, HasSubstr("decision: x dim 1 dynamic (automatic, saw 16)"));
  EXPECT_THAT(first, HasSubstr("decision: b dim 0 dynamic (automatic, saw 16)"));
  EXPECT_THAT(first, HasSubstr("decision: x dim 1 static (zero_one, saw 1)"));
  EXPECT_THAT(first, HasSubstr("symbol: s0 = 16 for x.size()[1] [2, int_oo] at traced_program.cpp:"));
  EXPECT_THAT(first, HasSubstr("guard added: Eq(Mod(s0, 2), 0) at traced_program.cpp:"));
  EXPECT_THAT(first, HasSubstr("decision: m dim 0 dynamic (maybe_mark_dynamic, saw 6)"));
  EXPECT_THAT(first, HasSubstr("decision: m dim 1 dynamic (mark_dynamic, saw 5)"));
  EXPECT_THAT(first, HasSubstr("specialization: s0 = 6 (sources m.size()[0]): guard Eq(s0, 6) at traced_program.cpp:"));
  EXPECT_THAT(first, HasSubstr("artifact: cpp_source kernel translation unit"));
  EXPECT_THAT(first, HasSubstr("cache: memory miss, disk miss, disk store"));
  EXPECT_THAT(first, Not(HasSubstr("disk hit")));
  EXPECT_THAT(first, Not(HasSubstr("decision: x dim 0")));  // emitted (static, default) but not notable
  EXPECT_THAT(first, HasSubstr("\nPROTEAN_DYNAMIC_SOURCES=x.size()[1],b.size()[0]\n"));
  const std::string& second = texts[1];
  EXPECT_THAT(second, HasSubstr("pgo: load " + (cache / "pgo" / "report-golden" / "rank0.json").string() + " (2 frames)"));
  EXPECT_THAT(second, HasSubstr("decision: x dim 1 dynamic (pgo, saw 8)"));
  EXPECT_THAT(second, HasSubstr("disk hit"));
  // compilation_metrics carries each compile's first cache outcome per tier.
  EXPECT_THAT(metrics_cache(root / "trace1"), testing::Contains(R"({"disk":"miss","memory":"miss"})"));
  EXPECT_THAT(metrics_cache(root / "trace1"), testing::Not(testing::Contains(testing::HasSubstr("hit"))));
  EXPECT_THAT(metrics_cache(root / "trace2"), testing::Contains(R"({"disk":"hit","memory":"miss"})"));

  // A third run over a damaged profile and damaged kernels: both are reported corrupt and recovered.
  const fs::path profile = cache / "pgo" / "report-golden" / "rank0.json";
  std::ofstream(profile, std::ios::binary | std::ios::trunc) << "{ not json";
  int damaged = 0;
  for (const auto& e : fs::directory_iterator(cache / "kernels"))
    if (e.path().extension() == ".so") {
      std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "not a library";
      ++damaged;
    }
  ASSERT_GT(damaged, 0);
  const fs::path trace3 = root / "trace3";
  // (and with the inline artifact text capped at 100 bytes)
  const std::string out3 = run_traced_program(trace3, cache, "PROTEAN_TRACE_ARTIFACT_MAX_BYTES=100");
  ASSERT_THAT(out3, HasSubstr("row_sums ok: yes")) << out3;
  rep::TraceModel m3 = rep::read_trace_dir(trace3);
  rep::Analysis a3 = rep::analyse(m3);
  const std::string third = rep::render_plain_text(m3, a3);
  EXPECT_THAT(third, HasSubstr("pgo: load corrupt " + profile.string()));
  EXPECT_THAT(third, HasSubstr("pgo: store corrupt " + profile.string()));
  EXPECT_THAT(third, HasSubstr("cache: memory miss, disk corrupt, disk miss, disk store"));
  EXPECT_THAT(third, Not(HasSubstr("disk hit")));
  EXPECT_THAT(metrics_cache(trace3), testing::Contains(R"({"disk":"corrupt","memory":"miss"})"));
  int cut = 0;
  for (const auto& j : trace_events(trace3, "artifact")) {
    const std::string text = j.at("text").get<std::string>();
    ASSERT_LE(text.size(), 100u) << j.dump();
    if (j.at("bytes").get<size_t>() > 100) {
      EXPECT_EQ(j.value("truncated", false), true) << j.dump();
      ++cut;
    } else {
      EXPECT_FALSE(j.contains("truncated")) << j.dump();
    }
  }
  EXPECT_GT(cut, 0);

  if (!protean::testing::expect_golden(report, "report/live_program.txt")) GTEST_SKIP() << "updated live_program.txt";
}

}  // namespace
