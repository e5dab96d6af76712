// CompileOptions::async_compile with the cpu backend: the first calls of a cache miss are served by
// the interpreter while the C++ compiles in the background, later calls by the compiled kernels;
// concurrent callers, failed background builds, and ready-at-once cache hits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "backend/async_compile.h"
#include "cache/kernel_cache.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace {

namespace pt = protean;
namespace fs = std::filesystem;
using pt::Tensor;

/// A private, empty PROTEAN_CACHE_DIR for one test (and a fresh memory tier), plus reset counters.
class AsyncScope {
 public:
  explicit AsyncScope(const std::string& name) {
    dir_ = fmt::format("/tmp/protean-cpu-async-{}-{}", name, getpid());
    std::error_code ec;
    fs::remove_all(dir_, ec);
    if (const char* p = std::getenv("PROTEAN_CACHE_DIR")) prev_ = p;
    setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
    pt::cache::clear_memory_cache();
    pt::reset();
  }
  ~AsyncScope() {
    pt::backend::wait_for_async_compiles();
    pt::reset();
    if (prev_) setenv("PROTEAN_CACHE_DIR", prev_->c_str(), 1);
    else unsetenv("PROTEAN_CACHE_DIR");
    pt::cache::clear_memory_cache();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

 private:
  std::string dir_;
  std::optional<std::string> prev_;
};

Tensor row_softmax_gelu(const Tensor& x) { return pt::gelu(pt::softmax(x * 3.0, -1) * 100.0); }

void expect_close(const Tensor& a, const Tensor& b) {
  EXPECT_TRUE(pt::allclose(a, b, 1e-4, 1e-4, true)) << pt::max_abs_diff(a, b);
}

TEST(CpuAsync, FirstCallsRunOnInterpThenSwitchToCompiledKernels) {
  AsyncScope scope("switch");
  auto f = pt::compile(row_softmax_gelu, {.name = "sm", .arg_names = {"x"}, .backend = "cpu", .async_compile = true});
  Tensor x = pt::randn({4, 64});
  Tensor first = f(x);  // returns without waiting for g++
  expect_close(first, row_softmax_gelu(x));
  auto st = pt::stats();
  EXPECT_EQ(st.compiles, 1);
  EXPECT_EQ(st.async_compiles, 1);
  EXPECT_GE(st.async_fallback_runs, 1);  // the first call certainly ran on the interpreter
  pt::backend::wait_for_async_compiles();
  auto as = pt::backend::async_compile_stats();
  EXPECT_EQ(as.finished, 1);
  EXPECT_EQ(as.failed, 0);
  const int64_t fallback_before = as.fallback_runs;
  auto ref = pt::compile(row_softmax_gelu, {.name = "ref", .arg_names = {"x"}, .backend = "interp"});  // interp backend
  for (int i = 0; i < 3; ++i) {
    Tensor y = pt::randn({4, 64});
    Tensor out = f(y);
    expect_close(out, row_softmax_gelu(y));
    expect_close(out, ref(y));
  }
  as = pt::backend::async_compile_stats();
  EXPECT_EQ(as.fallback_runs, fallback_before);
  EXPECT_EQ(as.compiled_runs, 3);
  EXPECT_EQ(pt::stats().compiles, 2);  // the cpu entry and the interp reference, no recompile
  EXPECT_GE(pt::cache::kernel_cache_stats().misses, 1);
}

TEST(CpuAsync, ConcurrentCallersDuringTheBackgroundCompile) {
  AsyncScope scope("threads");
  auto f = pt::compile(row_softmax_gelu, {.name = "sm", .arg_names = {"x"}, .backend = "cpu", .async_compile = true});
  Tensor x = pt::randn({8, 128});
  const Tensor want = row_softmax_gelu(x);
  f(x);  // compile (capture) once on this thread
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 40; ++i)
        if (!pt::allclose(f(x), want, 1e-4, 1e-4, true)) bad++;
    });
  for (auto& t : threads) t.join();
  pt::backend::wait_for_async_compiles();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(pt::allclose(f(x), want, 1e-4, 1e-4, true));
  EXPECT_EQ(bad.load(), 0);
  auto as = pt::backend::async_compile_stats();
  EXPECT_EQ(as.started, 1);
  EXPECT_EQ(as.finished, 1);
  EXPECT_EQ(as.fallback_runs + as.compiled_runs, 1 + 6 * 40 + 5);
  EXPECT_GE(as.compiled_runs, 5);
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST(CpuAsync, FailedBackgroundBuildIsReportedAndKeepsTheInterpreter) {
  AsyncScope scope("fail");
  setenv("PROTEAN_CXX", "false", 1);  // a "compiler" that always fails (and changes the cache key)
  pt::observe::LogCapture logs("");
  auto f = pt::compile(row_softmax_gelu, {.name = "sm", .arg_names = {"x"}, .backend = "cpu", .async_compile = true});
  Tensor x = pt::randn({3, 16});
  expect_close(f(x), row_softmax_gelu(x));
  pt::backend::wait_for_async_compiles();
  unsetenv("PROTEAN_CXX");
  for (int i = 0; i < 2; ++i) expect_close(f(x), row_softmax_gelu(x));
  auto st = pt::stats();
  EXPECT_EQ(st.async_compile_failures, 1);
  EXPECT_EQ(st.async_fallback_runs, 3);
  EXPECT_EQ(pt::backend::async_compile_stats().compiled_runs, 0);
  std::string text = logs.str();
  EXPECT_NE(text.find("(backend cpu) failed; the entry keeps running on the interpreter"), std::string::npos) << text;
  EXPECT_NE(text.find("C++ compilation failed"), std::string::npos) << text;
  EXPECT_NE(st.to_json().find("\"async_compile_failures\":1"), std::string::npos) << st.to_json();
}

TEST(CpuAsync, CachedLibraryIsReadyAtOnce) {
  AsyncScope scope("hit");
  Tensor x = pt::randn({2, 32});
  {
    auto warm = pt::compile(row_softmax_gelu, {.name = "sm", .arg_names = {"x"}, .backend = "cpu"});
    warm(x);  // puts the library in the disk tier
  }
  pt::reset();
  pt::cache::clear_memory_cache();
  auto f = pt::compile(row_softmax_gelu, {.name = "sm", .arg_names = {"x"}, .backend = "cpu", .async_compile = true});
  expect_close(f(x), row_softmax_gelu(x));
  auto st = pt::stats();
  EXPECT_EQ(st.async_compiles, 0);
  EXPECT_EQ(st.async_fallback_runs, 0);
  EXPECT_GE(pt::cache::kernel_cache_stats().disk_hits, 1);
}

}  // namespace

namespace {

Tensor exit_fn_a(const Tensor& x) { return pt::tanh(x * 2.0) + 1.0; }
Tensor exit_fn_b(const Tensor& x) { return pt::sigmoid(x) * x - 0.5; }
Tensor exit_fn_c(const Tensor& x) { return pt::softmax(x * 0.5, -1) * 3.0; }

}  // namespace

// The child of CpuAsync.BuildsQueuedAtExitAreTracedAsDropped: three frames whose builds queue on the
// compile worker, then the process ends at once.
TEST(CpuAsyncChild, ExitWithBuildsQueued) {
  if (!std::getenv("PROTEAN_ASYNC_EXIT_CHILD")) GTEST_SKIP() << "only runs as the child of CpuAsync.BuildsQueuedAtExitAreTracedAsDropped";
  const Tensor x = pt::randn({4, 8});
  // kept alive to the end (an entry destroyed before its build starts cancels the build instead)
  static std::vector<pt::CompiledFunction<Tensor(const Tensor&)>> fns;
  const int64_t finished_before = pt::backend::async_compile_stats().finished;
  for (auto fn : {exit_fn_a, exit_fn_b, exit_fn_c}) {
    fns.push_back(pt::compile(fn, {.name = "exit_fn", .backend = "cpu", .async_compile = true}));
    fns.back()(x);
  }
  // Exit once the first build has finished (the worker may not have picked any up yet on a loaded
  // machine): the second is then in flight or queued, the third queued.
  for (int i = 0; i < 60000 && pt::backend::async_compile_stats().finished == finished_before; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::fflush(stdout);
  std::exit(0);  // static destructors: the worker finishes the build in flight and drops the rest
}

// Builds still queued when a process ends used to vanish without a word: the trace now says which
// were built and which were dropped (cache events of tier "background"), and PROTEAN_LOGS=cache says so.
TEST(CpuAsync, BuildsQueuedAtExitAreTracedAsDropped) {
  const std::string dir = fmt::format("/tmp/protean-cpu-async-exit-{}", getpid());
  std::error_code ec;
  fs::remove_all(dir, ec);
  const std::string out = dir + ".log";
  const std::string cmd = fmt::format(
      "PROTEAN_ASYNC_EXIT_CHILD=1 PROTEAN_CACHE_DIR={0}/cache PROTEAN_TRACE={0}/trace PROTEAN_LOGS=cache "
      "/proc/{1}/exe --gtest_filter=CpuAsyncChild.ExitWithBuildsQueued > {2} 2>&1",
      dir, getpid(), out);
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string trace;
  for (const auto& e : fs::directory_iterator(dir + "/trace")) {
    std::ifstream in(e.path());
    trace.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ifstream log_in(out);
  const std::string log((std::istreambuf_iterator<char>(log_in)), std::istreambuf_iterator<char>());
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = trace.find(needle); p != std::string::npos; p = trace.find(needle, p + 1)) ++n;
    return n;
  };
  const size_t built = count(R"("result":"built")"), dropped = count(R"("result":"dropped")");
  EXPECT_EQ(count(R"("tier":"background")"), 3u) << trace;
  EXPECT_EQ(built + dropped, 3u) << trace;
  EXPECT_GE(built, 1u) << "the child exits after its first build finished";
  if (dropped > 0) {
    EXPECT_NE(log.find("dropped at exit: the process ended before it started"), std::string::npos) << log;
  }
  fs::remove_all(dir, ec);
  fs::remove(out, ec);
}
