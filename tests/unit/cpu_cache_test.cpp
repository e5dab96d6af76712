// The artifact cache behind the cpu backend: memory and disk hits, a second process compiling
// nothing, corrupt entries recovering, concurrent writers, compile errors, `protean cache`.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <utime.h>

#include <atomic>
#include <thread>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/cpu/codegen.h"
#include "backend/cpu/pipeline.h"
#include "backend/cpu/toolchain.h"
#include "backend/interp/interp.h"
#include "cache/kernel_cache.h"
#include "ir_test_util.h"
#include "observe/log.h"
#include "protean/cache_cmd.h"
#include "protean/ops.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

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

// A relative PROTEAN_CACHE_DIR is taken against the working directory: the compiler, which runs in
// a build directory inside the cache, is handed absolute paths (it was handed the relative ones and
// could not write its output there, so every cpu compile failed).
TEST(CpuCache, ARelativeCacheDirIsTakenAgainstTheWorkingDirectory) {
  CacheDirScope scope("relative");
  fs::create_directories(scope.dir());
  const fs::path cwd = fs::current_path();
  fs::current_path(scope.dir());
  setenv("PROTEAN_CACHE_DIR", "rel/cache", 1);
  EXPECT_EQ(cache::cache_dir(), (fs::path(scope.dir()) / "rel/cache").string());
  EXPECT_FALSE(compile_and_check(4.25));
  EXPECT_EQ(cache::disk_usage().entries, 1);
  fs::current_path(cwd);
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

/// A BuildFn that compiles a one-function C library after `delay_ms`, counting its calls and the most
/// builds seen running at once.
struct CountingBuild {
  std::atomic<int> calls{0}, running{0}, most{0};
  int delay_ms = 300;
  bool fail = false;
  cache::BuildFn fn() {
    return [this](const std::string& source, const std::string& dir, const std::string& so) {
      ++calls;
      int now = ++running;
      for (int m = most.load(); now > m && !most.compare_exchange_weak(m, now);) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      --running;
      if (fail) throw CompileError("test build failed on purpose");
      std::ofstream(dir + "/k.c") << source;
      std::string cmd = "cc -shared -fPIC -o '" + so + "' '" + dir + "/k.c'";
      if (std::system(cmd.c_str()) != 0) throw CompileError("cc failed: " + cmd);
    };
  }
};

// Another process stores the same key while this one builds it: the complete entry it left is kept
// (its .json and .so untouched), not overwritten file by file, which could leave one writer's .json
// beside the other's .so. Here the other writer's commit happens inside this process's build.
TEST(CpuCache, AnEntryStoredDuringTheBuildIsKept) {
  CacheDirScope scope("store-race");
  const std::string src = "int protean_test_race(void) { return 5; }\n";
  const uint64_t key = XXH64(src.data(), src.size(), 7);
  CountingBuild first;
  first.delay_ms = 0;
  ASSERT_TRUE(cache::get_or_build(key, src, first.fn(), {"protean_test_race"}));
  const std::string base = cache::kernels_dir() + "/" + cache::key_hex(key);
  const std::string theirs_json = slurp(base + ".json"), theirs_so = slurp(base + ".so");
  ASSERT_FALSE(theirs_json.empty());
  for (const char* ext : {".json", ".so", ".cpp"}) fs::remove(base + ext);
  cache::clear_memory_cache();
  CountingBuild second;
  second.delay_ms = 0;
  cache::BuildFn inner = second.fn();
  cache::BuildFn racing = [&](const std::string& source, const std::string& dir, const std::string& so) {
    std::ofstream(base + ".cpp") << source;  // the other process commits: .cpp, .json, then the .so
    std::ofstream(base + ".json", std::ios::binary) << theirs_json;
    std::ofstream(base + ".so", std::ios::binary) << theirs_so;
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // this build's .json would differ (its time)
    inner(source, dir, so);
  };
  auto lib = cache::get_or_build(key, src, racing, {"protean_test_race"});
  ASSERT_TRUE(lib);
  EXPECT_EQ(second.calls.load(), 1);
  EXPECT_EQ(slurp(base + ".json"), theirs_json) << "the stored entry was overwritten";
  EXPECT_EQ(slurp(base + ".so"), theirs_so);
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  EXPECT_TRUE(cache::get_or_build(key, src, second.fn(), {"protean_test_race"}));
  EXPECT_EQ(second.calls.load(), 1) << "the kept entry loads from disk";
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 0);
}

TEST(CpuCache, ConcurrentLookupsBuildAKeyOnceAndDifferentKeysTogether) {
  CacheDirScope scope("inflight");
  const std::string src_a = "int protean_test_a(void) { return 1; }\n";
  const std::string src_b = "int protean_test_b(void) { return 2; }\n";
  const uint64_t key_a = XXH64(src_a.data(), src_a.size(), 7), key_b = XXH64(src_b.data(), src_b.size(), 7);
  // Four threads ask for one key: one build, one library for all of them.
  CountingBuild one;
  std::vector<std::shared_ptr<const cache::Library>> got(4);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < got.size(); ++i)
    ts.emplace_back([&, i] { got[i] = cache::get_or_build(key_a, src_a, one.fn(), {"protean_test_a"}); });
  for (auto& t : ts) t.join();
  EXPECT_EQ(one.calls.load(), 1);
  for (const auto& l : got) {
    ASSERT_TRUE(l);
    EXPECT_EQ(l.get(), got[0].get());
  }
  // Two keys: built at the same time when the machine has two hardware threads.
  cache::clear_memory_cache();
  CountingBuild two;
  two.delay_ms = 1000;  // long enough that both threads are inside their builds on a loaded machine
  const std::string src_c = "int protean_test_c(void) { return 3; }\n";
  const uint64_t key_c = XXH64(src_c.data(), src_c.size(), 7);
  std::thread tb([&] { cache::get_or_build(key_b, src_b, two.fn(), {"protean_test_b"}); });
  std::thread tc([&] { cache::get_or_build(key_c, src_c, two.fn(), {"protean_test_c"}); });
  tb.join();
  tc.join();
  EXPECT_EQ(two.calls.load(), 2);
  if (std::thread::hardware_concurrency() >= 2) EXPECT_EQ(two.most.load(), 2);
  else EXPECT_EQ(two.most.load(), 1);
  // A failed build fails every waiter with its error, and the next lookup builds again.
  const std::string src_d = "int protean_test_d(void) { return 4; }\n";
  const uint64_t key_d = XXH64(src_d.data(), src_d.size(), 7);
  CountingBuild bad;
  bad.fail = true;
  bad.delay_ms = 1000;
  std::atomic<int> errors{0};
  std::vector<std::thread> ws;
  for (int i = 0; i < 3; ++i)
    ws.emplace_back([&] {
      try {
        cache::get_or_build(key_d, src_d, bad.fn(), {"protean_test_d"});
      } catch (const CompileError& e) {
        if (std::string(e.what()).find("on purpose") != std::string::npos) ++errors;
      }
    });
  for (auto& t : ws) t.join();
  EXPECT_EQ(errors.load(), 3);
  EXPECT_EQ(bad.calls.load(), 1);
  CountingBuild good;
  good.delay_ms = 0;
  EXPECT_TRUE(cache::get_or_build(key_d, src_d, good.fn(), {"protean_test_d"}));
  EXPECT_EQ(good.calls.load(), 1);
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
  {
    const auto j = nlohmann::json::parse(out.str());
    EXPECT_EQ(j["entries"], 1) << out.str();
    EXPECT_EQ(j["corrupt_entries"], 0) << out.str();
  }
  // an entry whose library no longer matches its .json, and a stray .so that names no key: both are
  // entries a load would rebuild, and stats says so (it counted them as whole entries)
  compile_and_check(7.5);
  std::string so;
  for (const auto& e : fs::directory_iterator(cache::kernels_dir()))
    if (e.path().extension() == ".so") so = e.path().string();
  ASSERT_FALSE(so.empty());
  std::ofstream(so, std::ios::binary | std::ios::app) << "appended";
  std::ofstream(cache::kernels_dir() + "/not-a-key.so") << "x";
  EXPECT_EQ(cache::disk_usage().corrupt, -1);
  EXPECT_EQ(cache::disk_usage(true).entries, 3);
  EXPECT_EQ(cache::disk_usage(true).corrupt, 2);
  // an entry under its key in capitals (loads look for lowercase names), a directory and a dangling
  // link in a library's place: entries a load would not take, counted as corrupt, not left out
  const std::string kdir = cache::kernels_dir();
  std::ofstream(kdir + "/00000000000000AB.so") << "x";
  fs::create_directories(kdir + "/00000000000000cd.so");
  fs::create_symlink(kdir + "/nowhere", kdir + "/00000000000000ef.so");
  EXPECT_EQ(cache::disk_usage(true).entries, 6);
  EXPECT_EQ(cache::disk_usage(true).corrupt, 5);
  EXPECT_EQ(cache::disk_usage().entries, 4) << "without verifying, only regular files";
  // a .json recording more bytes than memory holds: corrupt, not a failed command
  compile_and_check(8.5);
  std::string js8;
  for (const auto& e : fs::directory_iterator(kdir))
    if (e.path().extension() == ".json") {
      std::ifstream in(e.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("so_bytes") && e.path().string() != so.substr(0, so.size() - 3) + ".json")
        js8 = e.path().string();
    }
  ASSERT_FALSE(js8.empty());
  {
    std::ifstream in(js8);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto j = nlohmann::json::parse(text);
    j["so_bytes"] = uint64_t{1} << 50;
    std::ofstream(js8, std::ios::trunc) << j.dump();
  }
  EXPECT_EQ(cache::disk_usage(true).entries, 7);
  EXPECT_EQ(cache::disk_usage(true).corrupt, 6);
  args.json = false;
  out.str("");
  EXPECT_EQ(tools::cache_command(args, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("entries: 7 (6 corrupt: rebuilt at their next use"), std::string::npos) << out.str();
  fs::remove(kdir + "/00000000000000cd.so");
  fs::remove(kdir + "/00000000000000ef.so");
  args = {"clear", false};
  out.str("");
  EXPECT_EQ(tools::cache_command(args, out, err), 0);
  EXPECT_NE(out.str().find("removed 5 entries"), std::string::npos) << out.str();
  EXPECT_EQ(cache::disk_usage().entries, 0);
}


// A cache path that is a regular file read as an empty cache: stats, clear and export exited 0 (and
// export wrote an empty bundle). Each names the path and what it is.
TEST(CpuCache, CacheCommandsRefuseACachePathThatIsNoDirectory) {
  CacheDirScope scope("notadir");
  { std::ofstream(cache::cache_dir()) << "x"; }
  for (const char* action : {"stats", "clear", "export"}) {
    std::ostringstream out, err;
    tools::CacheArgs args{action, false};
    args.path = fmt::format("/tmp/protean-notadir-{}.bundle", getpid());
    EXPECT_EQ(tools::cache_command(args, out, err), 1) << action;
    EXPECT_NE(err.str().find("the cache directory '" + cache::cache_dir() + "' (PROTEAN_CACHE_DIR) is a regular file, not a directory"),
              std::string::npos)
        << action << ": " << err.str();
    EXPECT_FALSE(fs::exists(args.path)) << action;
  }
  fs::remove(cache::cache_dir());
  // the cache a directory, its kernels dir a file: stats and clear said "0 entries" as if empty
  fs::create_directories(cache::cache_dir());
  { std::ofstream(cache::cache_dir() + "/kernels") << "x"; }  // (kernels_dir() would make the directory)
  for (const char* action : {"stats", "clear"}) {
    std::ostringstream out, err;
    tools::CacheArgs args{action, false};
    EXPECT_EQ(tools::cache_command(args, out, err), 1) << action;
    EXPECT_NE(err.str().find("the cache's kernel directory '" + cache::cache_dir() + "/kernels' is a regular file"), std::string::npos)
        << action << ": " << err.str();
  }
  fs::remove_all(cache::cache_dir());
}

// stats --json is JSON whatever the cache's path holds (quotes, backslashes)
TEST(CpuCache, CacheStatsJsonEscapesThePath) {
  CacheDirScope scope("json \"quoted\" back\\slash");
  compile_and_check(9.5);
  std::ostringstream out, err;
  tools::CacheArgs args{"stats", true};
  ASSERT_EQ(tools::cache_command(args, out, err), 0) << err.str();
  const auto j = nlohmann::json::parse(out.str(), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out.str();
  EXPECT_EQ(j["dir"], cache::kernels_dir());
  EXPECT_EQ(j["entries"], 1);
}

// ---- robustness: what a damaged, foreign or unwritable cache does (docs/cpu.md: "a warning and a
// rebuild, never the run") ------------------------------------------------------------------------------

/// The one entry's .so in the kernels dir (after one compile).
std::string only_so() {
  std::string so;
  for (const auto& e : fs::directory_iterator(cache::kernels_dir()))
    if (e.path().extension() == ".so") so = e.path().string();
  return so;
}
std::string json_of(const std::string& so) { return so.substr(0, so.size() - 3) + ".json"; }
std::string key_hex_of(const std::string& bytes) { return fmt::format("{:016x}", XXH64(bytes.data(), bytes.size(), 0)); }

TEST(CpuCacheRobust, UnwritableScratchStillLoadsValidEntries) {
  CacheDirScope scope("ro-tmp");
  compile_and_check(5.5);
  ASSERT_FALSE(only_so().empty());
  // tmp/ (build dirs, private library copies) cannot be created: a file is in the way. As a read-only
  // cache this fails every write, also for root.
  fs::remove_all(scope.dir() + "/tmp");
  std::ofstream(scope.dir() + "/tmp") << "in the way";
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_TRUE(compile_and_check(5.5)) << cap.str();
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 0) << cap.str();
  EXPECT_EQ(cache::kernel_cache_stats().disk_hits, 1);
  // a new key builds in a private temporary directory
  EXPECT_FALSE(compile_and_check(5.75)) << cap.str();
  EXPECT_NE(cap.str().find("cannot be written"), std::string::npos) << cap.str();
  EXPECT_EQ(cache::kernel_cache_stats().build_errors, 0);
}

// A cache whose filesystem is (nearly) full still takes a directory, and a build there failed in the
// linker with no word of the disk. Too little free space counts as unwritable: the build goes to a
// private temporary directory, with a warning naming the free space, and the entry is still stored
// where it fits (here the same filesystem; the threshold is raised to make "full").
TEST(CpuCacheRobust, AFullCacheFilesystemBuildsElsewhere) {
  CacheDirScope scope("full");
  setenv("PROTEAN_CACHE_MIN_FREE_MB", "1099511627775", 1);
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(7.25)) << cap.str();
  unsetenv("PROTEAN_CACHE_MIN_FREE_MB");
  EXPECT_NE(cap.str().find("KiB free, less than the 1099511627775 MiB a build may need"), std::string::npos) << cap.str();
  EXPECT_EQ(cache::kernel_cache_stats().build_errors, 0);
  EXPECT_FALSE(only_so().empty()) << "the entry was not stored";
  cache::clear_memory_cache();
  EXPECT_TRUE(compile_and_check(7.25));  // and loads from the cache
}

TEST(CpuCacheRobust, ReadOnlyCacheLoadsValidEntries) {
  if (geteuid() == 0) GTEST_SKIP() << "root writes through read-only permissions";
  CacheDirScope scope("ro");
  compile_and_check(6.5);
  fs::remove_all(scope.dir() + "/tmp");
  for (const std::string& d : {cache::kernels_dir(), scope.dir()}) ::chmod(d.c_str(), 0555);
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_TRUE(compile_and_check(6.5)) << cap.str();
  EXPECT_FALSE(compile_and_check(6.75)) << cap.str();  // empty for this key: built, not stored
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 0) << cap.str();
  for (const std::string& d : {scope.dir(), scope.dir() + "/kernels"}) ::chmod(d.c_str(), 0755);
}

TEST(CpuCacheRobust, CacheDirThatIsAFileBuildsUncached) {
  CacheDirScope scope("is-file");
  std::ofstream(scope.dir()) << "not a directory";
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(7.5)) << cap.str();
  EXPECT_TRUE(compile_and_check(7.5)) << cap.str();  // the memory tier
  EXPECT_EQ(cache::kernel_cache_stats().build_errors, 0);
  EXPECT_NE(cap.str().find("cannot be written"), std::string::npos) << cap.str();
  fs::remove(scope.dir());
}

TEST(CpuCacheRobust, EntryOfAnotherGraphUnderAKeyIsCorrupt) {
  CacheDirScope scope("foreign");
  compile_and_check(8.5);
  std::string a = only_so();
  std::string a_so = scope.dir() + "/a.so", a_js = scope.dir() + "/a.json";
  fs::copy_file(a, a_so);
  fs::copy_file(json_of(a), a_js);
  fs::remove(a);
  fs::remove(json_of(a));
  // another graph (a different op), then its entry replaced by the first one's files
  std::vector<sym::Expr> syms;
  GraphBuilder b("other");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 32});
  ValueId y = b.call(OpKind::exp, {b.call(OpKind::tanh, {x})});
  syms = {s0.expr()};
  auto g = std::make_shared<const ir::Graph>(std::move(b.done({y})));
  compile_cpu(BackendInput{g, syms, "0/0", "default"});
  std::string bso = only_so();
  fs::copy_file(a_so, bso, fs::copy_options::overwrite_existing);
  fs::copy_file(a_js, json_of(bso), fs::copy_options::overwrite_existing);
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  auto art = compile_cpu(BackendInput{g, syms, "0/0", "default"});
  EXPECT_EQ(cache::kernel_cache_stats().corrupt_entries, 1) << cap.str();
  EXPECT_NE(cap.str().find("an entry of another graph"), std::string::npos) << cap.str();
  Tensor xt = randn({6, 32});
  int64_t n = 6;
  auto got = art->run(std::vector<Tensor>{xt}, std::span<const int64_t>(&n, 1));
  EXPECT_TRUE(allclose(got[0], exp(tanh(xt)), 1e-4, 1e-5));
}

TEST(CpuCacheRobust, LibraryWithoutItsKernelIsRebuilt) {
  CacheDirScope scope("no-kernel");
  compile_and_check(9.5);
  std::string so = only_so();
  // a valid library that defines something else, with a .json whose size and checksum match it
  std::string src = scope.dir() + "/other.cpp", other = scope.dir() + "/other.so";
  std::ofstream(src) << "extern \"C\" int not_a_kernel() { return 1; }\n";
  ASSERT_EQ(std::system(fmt::format("c++ -shared -fPIC {} -o {}", src, other).c_str()), 0);
  std::string bytes = slurp(other);
  nlohmann::json meta = nlohmann::json::parse(slurp(json_of(so)));
  meta["so_xxh64"] = key_hex_of(bytes);
  meta["so_bytes"] = bytes.size();
  fs::copy_file(other, so, fs::copy_options::overwrite_existing);
  std::ofstream(json_of(so), std::ios::trunc) << meta.dump();
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(9.5)) << cap.str();
  EXPECT_NE(cap.str().find("does not define kernel0"), std::string::npos) << cap.str();
  cache::clear_memory_cache();
  EXPECT_TRUE(compile_and_check(9.5)) << "the rebuilt entry loads";
}

TEST(CpuCacheRobust, OversizedLibraryIsRejectedBeforeReading) {
  CacheDirScope scope("sparse");
  compile_and_check(10.5);
  std::string so = only_so();
  ASSERT_EQ(::truncate(so.c_str(), int64_t{3} << 30), 0);  // a 3 GiB sparse file
  cache::clear_memory_cache();
  cache::reset_kernel_cache_stats();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(10.5)) << cap.str();
  EXPECT_NE(cap.str().find("the library has 3221225472 bytes, the .json records"), std::string::npos) << cap.str();
  EXPECT_LT(cache::kernel_cache_stats().load_seconds, 1.0);
}

TEST(CpuCacheRobust, FifoInPlaceOfAnEntryFileDoesNotBlock) {
  CacheDirScope scope("fifo");
  compile_and_check(11.5);
  std::string so = only_so();
  for (const std::string& p : {json_of(so), so}) {
    fs::remove(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
    cache::clear_memory_cache();
    cache::reset_kernel_cache_stats();
    observe::LogCapture cap("");
    EXPECT_FALSE(compile_and_check(11.5)) << cap.str();  // would block forever in open()
    EXPECT_NE(cap.str().find("FIFO"), std::string::npos) << cap.str();
    cache::clear_memory_cache();
    EXPECT_TRUE(compile_and_check(11.5));
  }
}

TEST(CpuCacheRobust, StaleBuildDirsOfKilledCompilesAreRemoved) {
  CacheDirScope scope("stale");
  std::string old_dir = scope.dir() + "/tmp/build-killed", fresh = scope.dir() + "/tmp/build-running";
  fs::create_directories(old_dir);
  fs::create_directories(fresh);
  std::ofstream(old_dir + "/kernel.cpp") << "// left by a killed compile";
  struct utimbuf two_hours_ago {};
  two_hours_ago.actime = two_hours_ago.modtime = ::time(nullptr) - 7200;
  ASSERT_EQ(::utime(old_dir.c_str(), &two_hours_ago), 0);
  compile_and_check(12.5);
  EXPECT_FALSE(fs::exists(old_dir));
  EXPECT_TRUE(fs::exists(fresh)) << "a build dir younger than an hour may belong to a running compile";
}

// ---- split translation units (cold compile time) --------------------------------------------------

TEST(CpuToolchain, GeneratedCodeIncludesOnlyStdint) {
  // Parsing <cmath>/<cstring>/<limits> in C++20 mode was about half of a small unit's compile time.
  const std::string p(prelude());
  size_t includes = 0;
  for (size_t pos = 0; (pos = p.find("#include", pos)) != std::string::npos; ++pos) ++includes;
  EXPECT_EQ(includes, 1u);
  EXPECT_NE(p.find("#include <stdint.h>"), std::string::npos);
  EXPECT_EQ(p.find("std::"), p.find("std::numeric_limits' members"));  // only in that comment
}

TEST(CpuToolchain, SplitKeepsEveryDefinitionOnceAndAliasesBesideTheirTarget) {
  const std::string header = "// header\nstatic inline int twice(int x) { return 2 * x; }\n";
  const std::string src = header +
                          "extern \"C\" int k0(int x) { return twice(x) + 0; }\n"
                          "extern \"C\" int k1(int x) { return twice(x) + 1; /* a longer body ............ */ }\n"
                          "extern \"C\" int k2(int x) __attribute__((alias(\"k0\")));\n"
                          "extern \"C\" int k3(int x) { return twice(x) + 3; }\n"
                          "extern \"C\" int k4(int x) __attribute__((alias(\"k3\")));\n";
  EXPECT_EQ(split_translation_unit(src, 1), std::vector<std::string>{src});
  auto parts = split_translation_unit(src, 2);
  ASSERT_EQ(parts.size(), 2u);
  size_t defs = 0;
  for (const std::string& part : parts) {
    EXPECT_EQ(part.rfind(header, 0), 0u) << part;
    for (const char* k : {"int k0(", "int k1(", "int k3("}) defs += part.find(k) != std::string::npos;
    if (part.find("alias(\"k0\")") != std::string::npos) {
      EXPECT_NE(part.find("int k0(int x) {"), std::string::npos) << part;
    }
    if (part.find("alias(\"k3\")") != std::string::npos) {
      EXPECT_NE(part.find("int k3(int x) {"), std::string::npos) << part;
    }
  }
  EXPECT_EQ(defs, 3u);
  EXPECT_EQ(split_translation_unit(src, 10).size(), 3u);  // never more parts than definitions
  // An alias whose target is not in the unit: not split.
  EXPECT_EQ(split_translation_unit(header + "extern \"C\" int a(int x) { return x; }\nextern \"C\" int b(int x) "
                                            "__attribute__((alias(\"elsewhere\")));\n",
                                   2)
                .size(),
            1u);
}

TEST(CpuToolchain, SplitBuildLinksOneLibraryWithEveryKernel) {
  CacheDirScope scope("split");
  setenv("PROTEAN_CPU_COMPILE_JOBS", "3", 1);
  std::string src = std::string(prelude());
  for (int i = 0; i < 6; ++i) {
    src += fmt::format("extern \"C\" void kernel{}(char* const* B, const int64_t* S) {{\n", i);
    src += "  float* b0 = reinterpret_cast<float*>(B[0]);\n";
    // Bodies long enough that the unit is over three 16 KB parts.
    for (int j = 0; j < 160; ++j) src += fmt::format("  b0[{}] = pt::exp(b0[{}] * 0.0f) + {}.0f + float(S[0]);\n", j % 4, j % 4, i);
    src += "}\n";
  }
  src += "extern \"C\" void kernel6(char* const* B, const int64_t* S) __attribute__((alias(\"kernel2\")));\n";
  auto lib = build_library(src, {"kernel0", "kernel5", "kernel6"});
  unsetenv("PROTEAN_CPU_COMPILE_JOBS");
  ASSERT_TRUE(lib);
  for (int i = 0; i < 7; ++i) {
    auto* fn = reinterpret_cast<void (*)(char* const*, const int64_t*)>(lib->symbol(fmt::format("kernel{}", i).c_str()));
    ASSERT_NE(fn, nullptr) << i;
    float buf[4] = {0, 0, 0, 0};
    char* B[1] = {reinterpret_cast<char*>(buf)};
    const int64_t S[1] = {10};
    fn(B, S);
    EXPECT_EQ(buf[0], 1.0f + (i == 6 ? 2 : i) + 10) << i;
  }
  // The split's pieces are gone; the whole unit is kept as the artifact's source.
  for (const auto& e : fs::recursive_directory_iterator(scope.dir()))
    EXPECT_EQ(e.path().filename().string().find(".part"), std::string::npos) << e.path();
}

TEST(CpuToolchain, BadCompileJobsIsAValueError) {
  setenv("PROTEAN_CPU_COMPILE_JOBS", "0", 1);
  EXPECT_THROW(compile_jobs(), ValueError);
  setenv("PROTEAN_CPU_COMPILE_JOBS", "two", 1);
  EXPECT_THROW(compile_jobs(), ValueError);
  setenv("PROTEAN_CPU_COMPILE_JOBS", "2", 1);
  EXPECT_EQ(compile_jobs(), 2u);
  unsetenv("PROTEAN_CPU_COMPILE_JOBS");
  EXPECT_GE(compile_jobs(), 1u);
}

}  // namespace
}  // namespace protean::backend::cpu
