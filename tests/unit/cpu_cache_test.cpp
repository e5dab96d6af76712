// The artifact cache behind the cpu backend: memory and disk hits, a second process compiling
// nothing, corrupt entries recovering, concurrent writers, compile errors, `protean cache`.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/pipeline.h"
#include "backend/interp/interp.h"
#include "cache/kernel_cache.h"
#include "ir_test_util.h"
#include "observe/log.h"
#include "protean/cache_cmd.h"
#include "protean/ops.h"

namespace protean::backend::cpu {
namespace {

namespace fs = std::filesystem;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;

/// Sets PROTEAN_CACHE_DIR for a scope (restoring the previous value).
class CacheDirScope {
 public:
  explicit CacheDirScope(const std::string& name) {
    dir_ = fmt::format("/tmp/protean-cpu-cache-{}-{}", name, getpid());
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (const char* p = std::getenv("PROTEAN_CACHE_DIR")) prev_ = p;
    setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
    cache::clear_memory_cache();
  }
  ~CacheDirScope() {
    if (prev_) setenv("PROTEAN_CACHE_DIR", prev_->c_str(), 1);
    else unsetenv("PROTEAN_CACHE_DIR");
    cache::clear_memory_cache();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::optional<std::string> prev_;
};

/// A small graph; `salt` changes a constant so different tests get different cache keys.
std::shared_ptr<const ir::Graph> sample_graph(double salt, std::vector<sym::Expr>& syms) {
  GraphBuilder b("cached");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 32});
  ValueId c = b.constant(scalar_tensor(salt));
  ValueId y = b.call(OpKind::mul, {b.call(OpKind::softmax, {x}, {{"dim", SymInt(1)}}), c});
  syms = {s0.expr()};
  return std::make_shared<const ir::Graph>(std::move(b.done({y})));
}

/// Compiles and checks the result against interp; returns whether the library came from the cache.
bool compile_and_check(double salt) {
  std::vector<sym::Expr> syms;
  auto g = sample_graph(salt, syms);
  CpuCompileInfo info;
  auto art = compile_cpu(BackendInput{g, syms, "0/0", "default"}, &info);
  Interpreter interp(g, syms);
  Tensor x = randn({6, 32});
  int64_t n = 6;
  auto a = art->run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
  auto b = interp.run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
  EXPECT_TRUE(allclose(a[0], b[0], 1e-4, 1e-5)) << max_abs_diff(a[0], b[0]);
  return info.library_from_cache;
}

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

TEST(CpuCache, MemoryThenDiskHitWithoutCompiling) {
  CacheDirScope scope("hits");
  cache::reset_kernel_cache_stats();
  EXPECT_FALSE(compile_and_check(1.5));
  EXPECT_EQ(cache::kernel_cache_stats().misses, 1);
  EXPECT_TRUE(compile_and_check(1.5));
  EXPECT_EQ(cache::kernel_cache_stats().memory_hits, 1);
  cache::clear_memory_cache();  // as if a new process
  EXPECT_TRUE(compile_and_check(1.5));
  auto s = cache::kernel_cache_stats();
  EXPECT_EQ(s.disk_hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(cache::disk_usage().entries, 1);
}

TEST(CpuCache, CorruptEntriesAreReportedAndRebuilt) {
  CacheDirScope scope("corrupt");
  cache::reset_kernel_cache_stats();
  compile_and_check(2.5);
  std::string so;
  for (const auto& e : fs::directory_iterator(cache::kernels_dir()))
    if (e.path().extension() == ".so") so = e.path().string();
  ASSERT_FALSE(so.empty());
  std::string js = so.substr(0, so.size() - 3) + ".json";
  // 1. garbage .so
  cache::clear_memory_cache();
  std::ofstream(so, std::ios::binary | std::ios::trunc) << "this is not an ELF file";
  {
    observe::LogCapture cap("");
    EXPECT_FALSE(compile_and_check(2.5));
    EXPECT_NE(cap.str().find("corrupt entry"), std::string::npos) << cap.str();
  }
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 1);
  EXPECT_EQ(cache::kernel_cache_stats().misses, 2);
  // 2. truncated .json
  cache::clear_memory_cache();
  std::ofstream(js, std::ios::binary | std::ios::trunc) << "{\"so_xx";
  {
    observe::LogCapture cap("");
    EXPECT_FALSE(compile_and_check(2.5));
  }
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 2);
  // 3. the rebuilt entry loads cleanly
  cache::clear_memory_cache();
  EXPECT_TRUE(compile_and_check(2.5));
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 2);
}

TEST(CpuCache, UnstorableEntryWarnsAndRuns) {
  CacheDirScope scope("unstorable");
  cache::reset_kernel_cache_stats();
  compile_and_check(4.5);
  std::string so;
  for (const auto& e : fs::directory_iterator(cache::kernels_dir()))
    if (e.path().extension() == ".so") so = e.path().string();
  ASSERT_FALSE(so.empty());
  std::string js = so.substr(0, so.size() - 3) + ".json";
  // Directories where the entry's files go: neither can be replaced by a rename.
  for (const std::string& p : {so, js}) {
    fs::remove(p);
    fs::create_directories(p + "/sub");
  }
  cache::clear_memory_cache();
  {
    observe::LogCapture cap("");
    EXPECT_FALSE(compile_and_check(4.5));
    EXPECT_NE(cap.str().find("cannot store " + js), std::string::npos) << cap.str();
    EXPECT_EQ(cap.str().find("protean: protean:"), std::string::npos) << cap.str();
  }
  // Only the .so in the way.
  fs::remove_all(js);
  cache::clear_memory_cache();
  {
    observe::LogCapture cap("");
    EXPECT_FALSE(compile_and_check(4.5));
    EXPECT_NE(cap.str().find("cannot store " + so), std::string::npos) << cap.str();
  }
  EXPECT_TRUE(fs::is_directory(so));
}

// Run in a child process by the tests below (skipped otherwise): compiles the sample graph with salt
// $PROTEAN_CPU_CACHE_SALT and writes this process's cache counters to $PROTEAN_CPU_CACHE_CHILD.
TEST(CpuCacheChild, CompileSampleGraph) {
  const char* out = std::getenv("PROTEAN_CPU_CACHE_CHILD");
  if (!out) GTEST_SKIP() << "only runs as a child of CpuCache tests";
  cache::reset_kernel_cache_stats();
  compile_and_check(std::atof(std::getenv("PROTEAN_CPU_CACHE_SALT")));
  std::ofstream(out) << cache::kernel_cache_stats_json();
}

std::string run_child(const std::string& dir, double salt, const std::string& out, bool background) {
  return fmt::format("PROTEAN_CACHE_DIR={} PROTEAN_CPU_CACHE_SALT={} PROTEAN_CPU_CACHE_CHILD={} {} "
                     "--gtest_filter=CpuCacheChild.CompileSampleGraph > {}.log 2>&1{}",
                     dir, salt, out, self_exe(), out, background ? " &" : "");
}
std::string slurp(const std::string& p) { return ir::testing::read_file(p); }

TEST(CpuCache, SecondProcessPerformsNoCompilation) {
  CacheDirScope scope("process");
  std::string out1 = scope.dir() + "-child1.json", out2 = scope.dir() + "-child2.json";
  ASSERT_EQ(std::system(run_child(scope.dir(), 3.5, out1, false).c_str()), 0) << slurp(out1 + ".log");
  ASSERT_EQ(std::system(run_child(scope.dir(), 3.5, out2, false).c_str()), 0) << slurp(out2 + ".log");
  std::string first = slurp(out1), second = slurp(out2);
  EXPECT_NE(first.find("\"misses\":1"), std::string::npos) << first;
  EXPECT_NE(second.find("\"misses\":0"), std::string::npos) << second;
  EXPECT_NE(second.find("\"disk_hits\":1"), std::string::npos) << second;
  for (const auto& f : {out1, out2}) {
    fs::remove(f);
    fs::remove(f + ".log");
  }
}

TEST(CpuCache, ConcurrentWritersOfTheSameKey) {
  CacheDirScope scope("concurrent");
  std::string a = scope.dir() + "-a.json", b = scope.dir() + "-b.json";
  std::string cmd = run_child(scope.dir(), 4.5, a, true) + " " + run_child(scope.dir(), 4.5, b, true) + " wait";
  ASSERT_EQ(std::system(("bash -c '" + cmd + "'").c_str()), 0);
  for (const auto& f : {a, b}) {
    std::string log = slurp(f + ".log");
    EXPECT_NE(log.find("[  PASSED  ] 1 test"), std::string::npos) << log;
    EXPECT_EQ(log.find("corrupt"), std::string::npos) << log;
  }
  EXPECT_EQ(cache::disk_usage().entries, 1);
  cache::reset_kernel_cache_stats();
  EXPECT_TRUE(compile_and_check(4.5));  // the surviving entry verifies and loads
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 0);
  for (const auto& f : {a, b}) {
    fs::remove(f);
    fs::remove(f + ".log");
  }
}

TEST(CpuCache, CompileErrorKeepsTheGeneratedSource) {
  CacheDirScope scope("error");
  setenv("PROTEAN_CXX", "false", 1);
  try {
    compile_and_check(5.5);
    ADD_FAILURE() << "expected CompileError";
  } catch (const CompileError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("C++ compilation failed"), std::string::npos) << msg;
    size_t p = msg.find("source kept at ");
    ASSERT_NE(p, std::string::npos) << msg;
    std::string path = msg.substr(p + 15, msg.find(',', p) - p - 15);
    EXPECT_TRUE(fs::exists(path)) << path;
  }
  unsetenv("PROTEAN_CXX");
  EXPECT_EQ(cache::kernel_cache_stats().build_errors >= 1, true);
}

TEST(CpuCache, CacheCommandStatsAndClear) {
  CacheDirScope scope("cmd");
  compile_and_check(6.5);
  std::ostringstream out, err;
  tools::CacheArgs args{"stats", false};
  EXPECT_EQ(tools::cache_command(args, out, err), 0);
  EXPECT_NE(out.str().find("entries: 1"), std::string::npos) << out.str();
  args.json = true;
  out.str("");
  EXPECT_EQ(tools::cache_command(args, out, err), 0);
  EXPECT_NE(out.str().find("\"entries\": 1"), std::string::npos) << out.str();
  args = {"clear", false};
  out.str("");
  EXPECT_EQ(tools::cache_command(args, out, err), 0);
  EXPECT_NE(out.str().find("removed 1 entries"), std::string::npos) << out.str();
  EXPECT_EQ(cache::disk_usage().entries, 0);
}

}  // namespace
}  // namespace protean::backend::cpu
