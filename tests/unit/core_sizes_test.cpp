// Checked sizes: element counts and byte counts that do not fit in 64 bits are a ShapeError naming
// the shape and the caller — in every factory, in views (expand), in the .npy reader — never a
// wrapped count that allocates a tiny buffer and then indexes it as a huge one. Plus the regular-
// file rule: a FIFO given as a file is refused, not waited on.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/checked_size.h"
#include "core/files.h"
#include "observe/env.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace protean {
namespace {

constexpr int64_t k31 = int64_t{1} << 31, k32 = int64_t{1} << 32;

std::string shape_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ShapeError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a ShapeError: ") + e.what();
  }
  return "no error";
}

TEST(CheckedSize, CountsAndBytes) {
  const int64_t a[] = {k31, k31};
  EXPECT_EQ(core::checked_numel(a, "t"), int64_t{1} << 62);
  EXPECT_NE(shape_error([&] { core::checked_nbytes(a, 4, "t"); }).find("t: shape [2147483648, 2147483648] of 4-byte"),
            std::string::npos);
  const int64_t b[] = {k32, k32};
  EXPECT_NE(shape_error([&] { core::checked_numel(b, "t"); }).find("more elements than fit in 64 bits"), std::string::npos);
  const int64_t empty_big[] = {0, k31, k31};
  EXPECT_EQ(core::checked_numel(empty_big, "t"), 0);
  // empty, but its contiguous strides (products of max(size, 1)) would overflow
  const int64_t empty_huge[] = {0, k32, k32};
  EXPECT_NE(shape_error([&] { core::checked_numel(empty_huge, "t"); }).find("empty dims counted as 1"), std::string::npos);
  EXPECT_NE(shape_error([] { empty({0, k32, k32}); }).find("empty dims counted as 1"), std::string::npos);
  const int64_t neg[] = {3, -1};
  EXPECT_NE(shape_error([&] { core::checked_numel(neg, "t"); }).find("negative size at dim 1"), std::string::npos);
  const int64_t sz[] = {3, 4}, st[] = {int64_t{1} << 62, 1};
  EXPECT_NE(shape_error([&] { core::checked_extent(sz, st, 4, "t"); }).find("spans more"), std::string::npos);
}

TEST(CheckedSize, FactoriesRefuseOverflowingShapes) {
  for (auto [what, fn] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"randn", [] { randn({k31, k31}); }},
           {"rand", [] { rand({k32, k32}); }},
           {"empty", [] { empty({k32, k32}); }},
           {"zeros", [] { zeros({k31, k31}); }},
           {"full", [] { full(to_symint_vec({k31, k31}), 1.0); }},
           {"arange", [] { arange(0, int64_t{1} << 62); }},
           {"empty_strided", [] { empty_strided({k31, 4}, {k32 * 4, 1}, DType::F32); }},
       }) {
    std::string msg = shape_error(fn);
    EXPECT_NE(msg.find("fit in 64 bits"), std::string::npos) << what << ": " << msg;
  }
  EXPECT_NE(shape_error([] { empty({2, -3}); }).find("negative size at dim 1"), std::string::npos);
}

TEST(CheckedSize, ExpandToAnOverflowingShapeIsAShapeError) {
  Tensor one = ones({1, 1});
  std::string msg = shape_error([&] { expand(one, to_symint_vec({k32, k32})); });
  EXPECT_NE(msg.find("more elements than fit in 64 bits"), std::string::npos) << msg;
  msg = shape_error([&] { add(expand(one, to_symint_vec({k31, k31})), 1.0); });
  EXPECT_NE(msg.find("fit in 64 bits"), std::string::npos) << msg;
  // a large but representable expand stays a cheap view
  Tensor v = expand(one, to_symint_vec({k31, 4}));
  EXPECT_EQ(v.int_numel(), k31 * 4);
}

TEST(CheckedSize, NpyClaimingAHugeShapeIsRefused) {
  std::string path = fmt::format("/tmp/protean-huge-{}.npy", getpid());
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2147483648, 2147483648), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  {
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
    f.write(len, 2);
    f << header;
  }
  std::string msg = shape_error([&] { load_npy(path); });
  EXPECT_NE(msg.find("load_npy('" + path + "'): shape [2147483648, 2147483648]"), std::string::npos) << msg;
  std::filesystem::remove(path);
}

TEST(RegularFiles, FifoIsRefusedNotOpened) {
  std::string fifo = fmt::format("/tmp/protean-fifo-{}.npy", getpid());
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(core::file_kind(fifo), "a FIFO (named pipe)");
  try {
    load_npy(fifo);  // blocked forever in open() before
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it is a FIFO (named pipe), not a regular file"), std::string::npos) << e.what();
  }
  try {
    core::read_regular_file(fifo, "test file");
    ADD_FAILURE() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open test file '" + fifo + "': it is a FIFO"), std::string::npos) << e.what();
  }
  ::unlink(fifo.c_str());
  EXPECT_EQ(core::file_kind(fifo), "missing");
}

// Everything a failed atomic write leaves behind: the earlier file unchanged, no temporary file.
std::vector<std::string> entries_of(const std::string& dir) {
  std::vector<std::string> r;
  for (const auto& e : std::filesystem::directory_iterator(dir)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

/// An empty directory /tmp/protean-<name>-<pid>.
std::string fresh_dir(const std::string& name) {
  const std::string dir = fmt::format("/tmp/protean-{}-{}", name, getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(AtomicWrite, ReplacesTheFileWhole) {
  const std::string dir = fresh_dir("atomic");
  const std::string path = dir + "/table.json";
  core::write_file_atomic(path, "first", "test table");
  core::write_file_atomic(path, std::string(100000, 'x'), "test table", /*durable=*/true);
  EXPECT_EQ(core::read_regular_file(path, "test table"), std::string(100000, 'x'));
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"table.json"});
  std::filesystem::remove_all(dir);
}

TEST(AtomicWrite, AFailedWriteKeepsTheEarlierFileAndLeavesNoTemporary) {
  const std::string dir = fresh_dir("atomic-fail");
  const std::string path = dir + "/profile.json";
  core::write_file_atomic(path, "old", "test profile");
  // A file-size limit makes write() fail part-way (EFBIG), as a full disk does (ENOSPC).
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &before), 0);
  rlimit small = before;
  small.rlim_cur = 4096;
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg;
  try {
    core::write_file_atomic(path, std::string(1 << 20, 'n'), "test profile");
  } catch (const RuntimeError& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &before);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("test profile: cannot write '" + path + "': File too large"), std::string::npos) << msg;
  EXPECT_EQ(core::read_regular_file(path, "test profile"), "old");
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"profile.json"});
  // A directory that does not exist: the error names the file, nothing is created.
  try {
    core::write_file_atomic(dir + "/missing/x.json", "x", "test profile");
    ADD_FAILURE() << "no error";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + dir + "/missing/x.json': No such file or directory"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

/// Creates `dir/name` with `age` subtracted from its modification time.
void make_file_aged(const std::string& dir, const std::string& name, std::chrono::seconds age) {
  const std::string path = dir + "/" + name;
  std::ofstream(path) << "partial";
  std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now() - age);
}

TEST(AtomicWrite, StaleTemporariesOfKilledWritersAreRemovedAndNothingElse) {
  const std::string dir = fresh_dir("atomic-stale");
  using std::chrono::hours;
  using std::chrono::seconds;
  make_file_aged(dir, "0123456789abcdef.so.tmp.4242.0", hours(2));  // a writer killed two hours ago
  make_file_aged(dir, "profile.json.tmp.77.12", hours(5));
  make_file_aged(dir, "table.json.tmp.99.3", seconds(5));             // a writer still at work
  make_file_aged(dir, "notes.tmp.x.1", hours(5));                     // not the writer's form
  make_file_aged(dir, "model.tmp.", hours(5));
  make_file_aged(dir, ".tmp.1.2", hours(5));
  make_file_aged(dir, "0123456789abcdef.so", hours(5));
  std::filesystem::create_directories(dir + "/build.tmp.1.2");        // a directory, not a temporary
  EXPECT_EQ(core::remove_stale_temporaries(dir + "/missing"), 0);
  EXPECT_EQ(core::remove_stale_temporaries(dir), 2);
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{".tmp.1.2", "0123456789abcdef.so", "build.tmp.1.2",
                                                       "model.tmp.", "notes.tmp.x.1", "table.json.tmp.99.3"}));
  // A shorter age takes the young one too.
  EXPECT_EQ(core::remove_stale_temporaries(dir, seconds(1)), 1);
  std::filesystem::remove_all(dir);
}

TEST(AtomicWrite, TheFirstWriteIntoADirectorySweepsItsStaleTemporaries) {
  const std::string dir = fresh_dir("atomic-sweep");
  make_file_aged(dir, "cache.plan.tmp.31337.0", std::chrono::hours(3));
  core::write_file_atomic(dir + "/cache.plan", "whole", "test cache");
  EXPECT_EQ(entries_of(dir), std::vector<std::string>{"cache.plan"});
  // Swept once per process: a temporary left later stays until the next process.
  make_file_aged(dir, "cache.plan.tmp.31338.0", std::chrono::hours(3));
  core::write_file_atomic(dir + "/cache.plan", "again", "test cache");
  EXPECT_EQ(entries_of(dir), (std::vector<std::string>{"cache.plan", "cache.plan.tmp.31338.0"}));
  std::filesystem::remove_all(dir);
}

TEST(EnvKnobs, AnIntegerKnobTakesWholeNumbersInItsRangeAndWarnsOnceOtherwise) {
  const char* knob = "PROTEAN_TEST_INTEGER_KNOB";
  auto read = [&](const char* value) {
    if (value) ::setenv(knob, value, 1);
    else ::unsetenv(knob);
    return observe::env_int(knob, 8, 1, 64);
  };
  EXPECT_EQ(read(nullptr), 8);
  EXPECT_EQ(read(""), 8);
  EXPECT_EQ(read("12"), 12);
  EXPECT_EQ(read(" 64 "), 64);
  observe::LogCapture cap("");
  EXPECT_EQ(read("8x"), 8);   // atoi would have read 8
  EXPECT_EQ(read("x"), 8);    // and 0
  EXPECT_EQ(read("65"), 8);
  EXPECT_EQ(read("0"), 8);
  EXPECT_EQ(read("99999999999999999999"), 8);
  EXPECT_EQ(read("8x"), 8);   // warned already
  ::unsetenv(knob);
  const std::string w = cap.str();
  EXPECT_NE(w.find("PROTEAN_TEST_INTEGER_KNOB='8x' is not an integer in [1, 64]; using 8"), std::string::npos) << w;
  EXPECT_NE(w.find("PROTEAN_TEST_INTEGER_KNOB='99999999999999999999'"), std::string::npos) << w;
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 5) << w;
}

TEST(EnvKnobs, AChoiceTakesOneOfItsValuesAndWarnsOnceOtherwise) {
  const char* knob = "PROTEAN_TEST_CHOICE";
  ::unsetenv(knob);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 2);
  ::setenv(knob, "4", 1);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 4);
  ::setenv(knob, "0", 1);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 0);
  observe::LogCapture cap("");
  ::setenv(knob, "3", 1);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 2);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 2);  // warned already
  ::setenv(knob, "04", 1);
  EXPECT_EQ(observe::env_choice(knob, {0, 2, 4}, 2), 2);
  ::unsetenv(knob);
  const std::string w = cap.str();
  EXPECT_NE(w.find("PROTEAN_TEST_CHOICE='3' is not one of 0, 2, 4; using 2"), std::string::npos) << w;
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 2) << w;
}

TEST(EnvKnobs, ASwitchTakesTheUsualSpellingsAndWarnsOnceOtherwise) {
  const char* knob = "PROTEAN_TEST_SWITCH";
  auto set = [&](const char* value) {
    if (value) ::setenv(knob, value, 1);
    else ::unsetenv(knob);
  };
  set(nullptr);
  EXPECT_TRUE(observe::env_on(knob));
  EXPECT_FALSE(observe::env_opt_in(knob));
  set("");
  EXPECT_TRUE(observe::env_on(knob));
  for (const char* off : {"0", "false", "OFF", "No"}) {
    set(off);
    EXPECT_FALSE(observe::env_on(knob)) << off;  // "false" used to leave a default-on switch on
    EXPECT_FALSE(observe::env_opt_in(knob)) << off;
  }
  for (const char* on : {"1", "true", "On", "YES"}) {
    set(on);
    EXPECT_TRUE(observe::env_on(knob)) << on;
    EXPECT_TRUE(observe::env_opt_in(knob)) << on;  // "true" used to leave an opt-in switch off
  }
  observe::LogCapture cap("");
  set("maybe");
  EXPECT_TRUE(observe::env_on(knob));
  EXPECT_FALSE(observe::env_opt_in(knob));
  EXPECT_TRUE(observe::env_on(knob));  // warned already
  ::unsetenv(knob);
  const std::string w = cap.str();
  EXPECT_NE(w.find("PROTEAN_TEST_SWITCH='maybe' is not a switch (0/1, true/false, on/off, yes/no); using 1"), std::string::npos)
      << w;
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 1) << w;
}

}  // namespace
}  // namespace protean
