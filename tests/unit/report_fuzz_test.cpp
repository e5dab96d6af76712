// Fuzzed trace files: seeded random truncation, byte flips, garbage and shuffled lines applied to the
// golden scenario traces. The reader, the analysis and both renderers must never crash or throw, and
// every non-blank line must be accounted for exactly once (used, malformed, unknown or newer).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <unistd.h>

#include "observe/report.h"

namespace fs = std::filesystem;
namespace rep = protean::observe::report;

namespace {

const fs::path kGolden = fs::path(PROTEAN_SOURCE_DIR) / "tests" / "golden" / "report";

std::vector<std::string> corpus() {
  std::vector<std::string> texts;
  for (const auto& e : fs::recursive_directory_iterator(kGolden))
    if (e.path().extension() == ".jsonl") {
      std::ifstream in(e.path(), std::ios::binary);
      std::ostringstream ss;
      ss << in.rdbuf();
      texts.push_back(ss.str());
    }
  std::sort(texts.begin(), texts.end());
  return texts;
}

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur)) out.push_back(cur);
  return out;
}

std::string garbage_line(std::mt19937& rng) {
  std::uniform_int_distribution<int> kind(0, 7), len(0, 200), byte(0, 255);
  switch (kind(rng)) {
    case 0: {  // random bytes (NUL and invalid UTF-8 included; never a newline)
      std::string s;
      for (int i = 0, n = len(rng); i < n; ++i) {
        char c = static_cast<char>(byte(rng));
        s += c == '\n' ? ' ' : c;
      }
      return s;
    }
    case 1: return std::string(20000, '[');  // deep nesting
    case 2: return R"({"v":1,"event":"graph","compile_id":"0/0","ir":"graph f(%x : f32[)";
    case 3: return R"({"v":1,"event":"compile_start","compile_id":{"nested":[1,2]},"frame":"zero","reasons":[[],{}]})";
    case 4: return R"({"v":999999999999999999999,"event":"graph"})";
    case 5: return R"({"v":1,"event":"compilation_metrics","compile_id":"7/","phases":{"capture":"fast"},"cache":[1]})";
    case 6: return R"({"v":1,"event":"chromium_event","name":null,"ts":1e300,"dur":-5,"args":"x"})";
    default: return R"({"v":1,"event":"recompile","compile_id":"1/2/3","reasons":"0/0: not a list","rank":-4,"pid":1.5})";
  }
}

std::string mutate(const std::string& base, std::mt19937& rng) {
  std::vector<std::string> lines = split_lines(base);
  std::uniform_int_distribution<int> op(0, 5);
  std::uniform_int_distribution<int> count(1, 6);
  for (int k = 0, n = count(rng); k < n && !lines.empty(); ++k) {
    std::uniform_int_distribution<size_t> pick(0, lines.size() - 1);
    std::string& l = lines[pick(rng)];
    switch (op(rng)) {
      case 0:  // truncate a line
        if (!l.empty()) l.resize(std::uniform_int_distribution<size_t>(0, l.size() - 1)(rng));
        break;
      case 1:  // flip bytes
        for (int i = 0; i < 3 && !l.empty(); ++i) {
          char& c = l[std::uniform_int_distribution<size_t>(0, l.size() - 1)(rng)];
          c = static_cast<char>(c ^ (1 << std::uniform_int_distribution<int>(0, 7)(rng)));
          if (c == '\n') c = ' ';
        }
        break;
      case 2:  // garbage line
        lines.insert(lines.begin() + static_cast<long>(pick(rng)), garbage_line(rng));
        break;
      case 3:  // duplicate a line
        lines.insert(lines.begin() + static_cast<long>(pick(rng)), l);
        break;
      case 4:  // swap two lines
        std::swap(l, lines[pick(rng)]);
        break;
      default:  // drop a line
        lines.erase(lines.begin() + static_cast<long>(pick(rng)));
        break;
    }
  }
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  if (!out.empty() && rng() % 3 == 0) out.resize(std::uniform_int_distribution<size_t>(0, out.size() - 1)(rng));
  return out;
}

int64_t nonblank_lines(const std::string& s) {
  int64_t n = 0;
  for (const auto& l : split_lines(s))
    if (l.find_first_not_of(" \t\r\f\v") != std::string::npos) ++n;
  return n;
}

TEST(ReportFuzz, MutatedTracesNeverCrashAndAreCounted) {
  const std::vector<std::string> texts = corpus();
  ASSERT_GE(texts.size(), 5u);
  std::mt19937 rng(20261129);
  const fs::path out = fs::temp_directory_path() / ("protean_report_fuzz_" + std::to_string(::getpid()));
  int64_t skipped_total = 0;
  constexpr int kCases = 400;
  for (int i = 0; i < kCases; ++i) {
    std::vector<std::pair<std::string, std::string>> files;
    int nfiles = 1 + static_cast<int>(rng() % 3);
    for (int f = 0; f < nfiles; ++f)
      files.emplace_back("fuzz_" + std::to_string(f) + ".jsonl", mutate(texts[rng() % texts.size()], rng));
    SCOPED_TRACE("case " + std::to_string(i));
    rep::TraceModel m;
    rep::Analysis a;
    std::string text;
    ASSERT_NO_THROW({
      m = rep::read_trace_texts(files);
      a = rep::analyse(m);
      text = rep::render_plain_text(m, a);
      (void)rep::chromium_events_json(m);
      if (i % 25 == 0) rep::write_html_site(m, a, out);
    });
    for (size_t f = 0; f < files.size(); ++f) {
      const rep::FileStats& st = m.files[f];
      EXPECT_EQ(st.events + st.malformed + st.unknown + st.newer, nonblank_lines(files[f].second))
          << "every line is used or counted, in " << files[f].first;
      skipped_total += st.malformed + st.unknown + st.newer;
      if (st.malformed > 0) {
        EXPECT_NE(text.find(" skipped in file " + files[f].first + " (first at line "), std::string::npos);
      }
    }
  }
  EXPECT_GT(skipped_total, kCases);  // the mutations really produced damage
  fs::remove_all(out);
}

TEST(ReportFuzz, EmptyAndBinaryFiles) {
  std::string binary;
  for (int i = 0; i < 4096; ++i) binary += static_cast<char>((i * 131) & 0xff);
  rep::TraceModel m = rep::read_trace_texts({{"empty.jsonl", ""}, {"bin.jsonl", binary}, {"nl.jsonl", "\n\n\n"}});
  rep::Analysis a = rep::analyse(m);
  EXPECT_EQ(m.files[0].events, 0);
  EXPECT_GT(m.files[1].malformed, 0);
  EXPECT_EQ(m.files[2].malformed, 0);
  EXPECT_NO_THROW((void)rep::render_plain_text(m, a));
}

}  // namespace
