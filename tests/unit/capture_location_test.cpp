// The user location of a traced op: the disk tier of symbolized frames answers exactly what libdw
// answers, a later process (here: a dropped in-memory memo) reads it instead of symbolizing, and an
// unreadable cache file only costs a new symbolization.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "capture/location.h"

namespace protean::capture {
namespace {

namespace fs = std::filesystem;

/// A fresh PROTEAN_CACHE_DIR for a scope (restoring the previous value).
class CacheDirScope {
 public:
  explicit CacheDirScope(const std::string& name)
      : dir_(fs::temp_directory_path() / ("protean_loc_" + name + "_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    if (const char* old = std::getenv("PROTEAN_CACHE_DIR")) old_ = old;
    ::setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
  }
  ~CacheDirScope() {
    if (old_) ::setenv("PROTEAN_CACHE_DIR", old_->c_str(), 1);
    else ::unsetenv("PROTEAN_CACHE_DIR");
    fs::remove_all(dir_);
  }
  fs::path locations() const { return dir_ / "locations"; }

 private:
  fs::path dir_;
  std::optional<std::string> old_;
};

int g_call_line = 0;

// One fixed call site in this file (a user frame: not libprotean, not a skipped header).
[[gnu::noinline]] protean::core::SourceLocation where_am_i() {
  g_call_line = __LINE__ + 1;
  protean::core::SourceLocation l = current_user_location();
  asm volatile("" ::: "memory");  // keeps the call a call (not a tail call)
  return l;
}

void expect_same(const protean::core::SourceLocation& a, const protean::core::SourceLocation& b) {
  EXPECT_EQ(a.file, b.file);
  EXPECT_EQ(a.line, b.line);
  EXPECT_EQ(a.function, b.function);
}

TEST(CaptureLocation, DiskTierAnswersWhatSymbolizingAnswers) {
  CacheDirScope dir("disk");
  forget_locations_in_memory();
  LocationCacheStats s0 = location_cache_stats();
  protean::core::SourceLocation fresh = where_am_i();
  LocationCacheStats s1 = location_cache_stats();
  EXPECT_EQ(fresh.file, "capture_location_test.cpp");
  EXPECT_EQ(fresh.line, g_call_line);
  EXPECT_GT(s1.symbolized, s0.symbolized);
  ASSERT_TRUE(fs::exists(dir.locations()));
  ASSERT_FALSE(fs::is_empty(dir.locations()));

  // A new process with the same binary: the answer comes from disk, and it is the same.
  forget_locations_in_memory();
  protean::core::SourceLocation cached = where_am_i();
  LocationCacheStats s2 = location_cache_stats();
  expect_same(cached, fresh);
  EXPECT_EQ(s2.symbolized, s1.symbolized);
  EXPECT_GT(s2.disk_hits, s1.disk_hits);
}

TEST(CaptureLocation, UnreadableCacheFileIsSymbolizedAgain) {
  CacheDirScope dir("corrupt");
  forget_locations_in_memory();
  protean::core::SourceLocation fresh = where_am_i();
  for (const auto& e : fs::directory_iterator(dir.locations())) {
    std::ofstream(e.path(), std::ios::trunc) << "not\ta\tline\nzz\t1\tx\tf.cpp\tg\n\t\t\t\t\n";
  }
  forget_locations_in_memory();
  LocationCacheStats s0 = location_cache_stats();
  protean::core::SourceLocation again = where_am_i();
  LocationCacheStats s1 = location_cache_stats();
  expect_same(again, fresh);
  EXPECT_GT(s1.symbolized, s0.symbolized);
  EXPECT_EQ(s1.disk_hits, s0.disk_hits);
}


// The libdw session lives while a trace runs and closes when the last one ends; the memoized answer
// needs no session, and a new PC after the close opens one again.
[[gnu::noinline]] protean::core::SourceLocation where_am_i_too() {
  protean::core::SourceLocation l = current_user_location();
  asm volatile("" ::: "memory");
  return l;
}

TEST(CaptureLocation, TheLibdwSessionClosesWhenTheLastTraceEnds) {
  CacheDirScope dir("session");
  forget_locations_in_memory();
  protean::core::SourceLocation first;
  {
    SymbolizerSessionScope outer;
    {
      SymbolizerSessionScope inner;  // a nested (or another thread's) trace
      first = where_am_i();
      EXPECT_TRUE(location_cache_stats().session_open);
    }
    EXPECT_TRUE(location_cache_stats().session_open);  // the outer trace still runs
  }
  LocationCacheStats closed = location_cache_stats();
  EXPECT_FALSE(closed.session_open);
  // The same PC again: memoized, no session opened.
  {
    SymbolizerSessionScope again;
    expect_same(where_am_i(), first);
  }
  EXPECT_EQ(location_cache_stats().sessions, closed.sessions);
  // A PC not seen yet (and not on disk): a new session, closed with its trace.
  forget_locations_in_memory();
  std::filesystem::remove_all(dir.locations());
  {
    SymbolizerSessionScope next;
    EXPECT_EQ(where_am_i_too().file, "capture_location_test.cpp");
  }
  LocationCacheStats reopened = location_cache_stats();
  EXPECT_EQ(reopened.sessions, closed.sessions + 1);
  EXPECT_FALSE(reopened.session_open);
  // Outside any trace, a lookup closes the session it opened.
  forget_locations_in_memory();
  std::filesystem::remove_all(dir.locations());
  where_am_i();
  EXPECT_FALSE(location_cache_stats().session_open);
  EXPECT_EQ(location_cache_stats().sessions, reopened.sessions + 1);
}

TEST(CaptureLocation, FunctionNamesDropParametersAndNameLambdasByTheirEnclosingFunction) {
  EXPECT_EQ(short_function_name("ns::mlp(protean::Tensor const&)"), "ns::mlp");
  EXPECT_EQ(short_function_name("main::{lambda(protean::Tensor const&)#1}::operator()(protean::Tensor const&) const"),
            "lambda in main");
  EXPECT_EQ(short_function_name("std::_Function_handler<protean::Tensor (protean::Tensor const&), "
                                "run(int)::{lambda(protean::Tensor const&)#2}>::_M_invoke(std::_Any_data const&, "
                                "protean::Tensor const&)"),
            "lambda in run");
  EXPECT_EQ(short_function_name("app::Net::forward(protean::Tensor const&)::{lambda(int)#1}::operator()(int) const"),
            "lambda in app::Net::forward");
  EXPECT_EQ(short_function_name("std::vector<int, std::allocator<int> >::push_back(int const&)"),
            "std::vector<int, std::allocator<int> >::push_back");
  EXPECT_EQ(short_function_name("Box::operator()(int)"), "Box::operator()");
}

TEST(CaptureLocation, UnresolvedLocationNamesTheFunctionAndTheOp) {
  std::string name = "mlp";
  {
    LocationContextScope scope(name);
    protean::core::SourceLocation l = unresolved_location("matmul");
    EXPECT_EQ(l.line, 0);
    EXPECT_EQ(l.describe(), "function 'mlp', op matmul (no debug info: build with -g or RelWithDebInfo to see your line)");
  }
  EXPECT_EQ(unresolved_location("").describe(), "(no debug info: build with -g or RelWithDebInfo to see your line)");
  // This test binary has debug info: its own frames resolve.
  EXPECT_GT(user_location_or_unresolved("add").line, 0);
}

}  // namespace
}  // namespace protean::capture
