// Browser test of the HTML report: headless Chromium loads index.html, a compile page and the dynamic
// decisions page from file:// and dumps the DOM; the test checks it holds the compile ids, the recompile
// reasons and the suggested allowlist. A screenshot of the index is kept as a test artifact at
// <build>/report_screenshot.png. Skipped (with a message) only when no Chromium is installed
// (Debian: apt-get install chromium). See tests/browser/README.md.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "observe/report.h"

namespace fs = std::filesystem;
namespace rep = protean::observe::report;
using ::testing::HasSubstr;

namespace {

const fs::path kGolden = fs::path(PROTEAN_SOURCE_DIR) / "tests" / "golden" / "report";

std::string find_chromium() {
  if (const char* env = std::getenv("PROTEAN_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"})
    for (const char* dir : {"/usr/bin", "/usr/local/bin", "/snap/bin"}) {
      fs::path p = fs::path(dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  return {};
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct RunResult {
  int status = -1;
  std::string out;
};

RunResult run(const std::string& cmd) {
  RunResult r;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[8192];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return r;
}

class ReportBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    chromium_ = find_chromium();
    if (chromium_.empty()) GTEST_SKIP() << "chromium is not installed (Debian: apt-get install chromium); browser test skipped";
    root_ = fs::temp_directory_path() / ("protean_report_browser_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "trace");
    fs::copy_file(kGolden / "similar_static.jsonl", root_ / "trace" / "similar_static.jsonl");
    rep::TraceModel m = rep::read_trace_dir(root_ / "trace");
    rep::Analysis a = rep::analyse(m);
    rep::write_html_site(m, a, root_ / "site");
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  std::string flags() const {
    return "--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
           "--disable-background-networking --disable-component-update --disable-sync --user-data-dir=" +
           quote((root_ / "profile").string());
  }
  std::string url(const std::string& page) const { return "file://" + (root_ / "site" / page).string(); }

  std::string dump_dom(const std::string& page) {
    RunResult r = run("timeout 120 " + quote(chromium_) + " " + flags() + " --dump-dom " + quote(url(page)) +
                      " 2>/dev/null");
    EXPECT_EQ(r.status, 0) << "chromium --dump-dom " << page << " failed";
    return r.out;
  }

  std::string chromium_;
  fs::path root_;
};

TEST_F(ReportBrowser, DomHoldsCompileIdsReasonsAndAllowlist) {
  const std::string index = dump_dom("index.html");
  ASSERT_THAT(index, HasSubstr("</html>")) << "no DOM came back:\n" << index.substr(0, 2000);
  for (const char* id : {">0/0<", ">0/1<", ">0/2<"}) EXPECT_THAT(index, HasSubstr(id));
  EXPECT_THAT(index, HasSubstr("0/0: tensor 'x' size mismatch at index 3. expected 160, actual 320"));
  EXPECT_THAT(index, HasSubstr("PROTEAN_DYNAMIC_SOURCES=x"));
  EXPECT_THAT(index, HasSubstr("x dim 3 took 160, 320, 480 → make it dynamic"));
  EXPECT_THAT(index, HasSubstr("<svg"));

  const std::string compile = dump_dom("compile_0_2.html");
  EXPECT_THAT(compile, HasSubstr("Compile 0/2"));
  EXPECT_THAT(compile, HasSubstr("0/1: tensor 'x' size mismatch at index 3. expected 320, actual 480"));
  EXPECT_THAT(compile, HasSubstr("Guards"));
  EXPECT_THAT(compile, HasSubstr("= mul(%x, %w)"));

  const std::string dynamic = dump_dom("dynamic.html");
  EXPECT_THAT(dynamic, HasSubstr("PROTEAN_DYNAMIC_SOURCES=x"));
  EXPECT_THAT(dynamic, HasSubstr("pt::mark_dynamic(x, 3);"));
}

TEST_F(ReportBrowser, ScreenshotIsKept) {
  const fs::path shot = fs::path(PROTEAN_BINARY_DIR) / "report_screenshot.png";
  fs::remove(shot);
  RunResult r = run("timeout 120 " + quote(chromium_) + " " + flags() + " --screenshot=" + quote(shot.string()) +
                    " --window-size=1280,900 " + quote(url("index.html")) + " 2>&1");
  EXPECT_EQ(r.status, 0) << r.out;
  ASSERT_TRUE(fs::exists(shot)) << r.out;
  EXPECT_GT(fs::file_size(shot), 5000u);  // a real 1280x900 page, not an empty image
}

}  // namespace
