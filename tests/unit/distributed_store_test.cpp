// The store group and the compiler collectives over it (include/protean/distributed.h,
// src/distributed/file_store.h), with threads as the ranks of a job: exchanges in order, a rank that
// does not arrive or stops taking part (a timeout naming it and the store), files of other runs and
// of earlier groups never read, corrupt and truncated files, cleanup, and init_from_env's checks.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "distributed/file_store.h"
#include "dynamic/collectives.h"
#include "protean/distributed.h"
#include "protean/error.h"
#include "protean/protean.h"
#include "test_env.h"

namespace pt = protean;
namespace dist = protean::distributed;
namespace fs = std::filesystem;
using pt::testing::EnvScope;

namespace {

// A fresh directory per test, removed at its end.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "protean-store-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

dist::StoreOptions opts(const std::string& dir, int rank, int size, double timeout_s = 5, const std::string& run = "run1") {
  dist::StoreOptions o;
  o.path = dir;
  o.run_id = run;
  o.rank = rank;
  o.world_size = size;
  o.timeout_s = timeout_s;
  return o;
}

// Runs body(rank) on `n` threads; returns each thread's error text ("" when none).
std::vector<std::string> as_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Planted whole, as the ranks write theirs (a temporary renamed into place): a rank polling the
// directory never sees the file half written.
void write_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".planting";
  std::ofstream(tmp, std::ios::binary) << text;
  std::filesystem::rename(tmp, path);
}

}  // namespace

TEST(DistributedStore, ThreadsAsRanksGatherEveryExchangeInOrderAndCleanUp) {
  TempDir dir;
  const int n = 3;
  const std::string big(300000, 'x');
  auto errors = as_ranks(n, [&](int r) {
    auto g = dist::store_group(opts(dir.path, r, n));
    EXPECT_EQ(g->rank(), r);
    EXPECT_EQ(g->size(), n);
    EXPECT_EQ(g->local_rank(), r);
    EXPECT_EQ(g->name(), "store");
    for (int k = 0; k < 30; ++k) {
      std::string mine = fmt::format("rank {} exchange {}", r, k);
      if (k == 5) mine = std::string("\0\n\xff", 3) + std::to_string(r);  // binary, with a newline
      if (k == 6) mine = r == 1 ? "" : "x";                               // empty on one rank
      if (k == 7) mine = big + std::to_string(r);
      auto all = g->all_gather_bytes(mine);
      ASSERT_EQ(all.size(), static_cast<size_t>(n));
      for (int p = 0; p < n; ++p) {
        std::string want = fmt::format("rank {} exchange {}", p, k);
        if (k == 5) want = std::string("\0\n\xff", 3) + std::to_string(p);
        if (k == 6) want = p == 1 ? "" : "x";
        if (k == 7) want = big + std::to_string(p);
        EXPECT_EQ(all[static_cast<size_t>(p)], want) << "rank " << r << " exchange " << k << " from rank " << p;
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // The last rank to let go removed every file of the group.
  EXPECT_TRUE(dir.files().empty()) << fmt::format("{}", fmt::join(dir.files(), " "));
}

TEST(DistributedStore, RankThatNeverArrivesIsATimeoutNamingItAndTheStore) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    dist::store_group(opts(dir.path, 0, 3, 0.3));
    ADD_FAILURE() << "expected a RuntimeError";
  } catch (const pt::RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ranks 1, 2 did not arrive within 0.3 s"), std::string::npos) << m;
    EXPECT_NE(m.find(dir.path), std::string::npos) << m;
    EXPECT_NE(m.find("run run1"), std::string::npos) << m;
  }
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(DistributedStore, RankThatStopsTakingPartMakesAllGatherThrowWithinTheEnvTimeout) {
  TempDir dir;
  EnvScope timeout("PROTEAN_COLLECTIVES_TIMEOUT_S", "0.3");
  std::string message, second;
  double took = 0;
  auto errors = as_ranks(2, [&](int r) {
    auto g = dist::store_group(opts(dir.path, r, 2, /*timeout_s=*/0));  // 0: the variable's
    g->all_gather_bytes("both");
    if (r == 1) return;  // leaves
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g->all_gather_bytes("alone");
    } catch (const pt::RuntimeError& e) {
      message = e.what();
    }
    took = seconds_since(t0);
    try {
      g->all_gather_bytes("again");
    } catch (const pt::RuntimeError& e) {
      second = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_NE(message.find("ranks 1 did not take part within 0.3 s (PROTEAN_COLLECTIVES_TIMEOUT_S)"), std::string::npos)
      << message;
  EXPECT_NE(message.find(dir.path), std::string::npos) << message;
  EXPECT_NE(message.find("all_gather_bytes #1 on rank 0 of 2"), std::string::npos) << message;
  EXPECT_GE(took, 0.25);
  EXPECT_LT(took, 3.0);
  EXPECT_NE(second.find("unusable after an earlier timeout"), std::string::npos) << second;
}

TEST(DistributedStore, FilesOfOtherRunsAndEarlierGroupsAreNeverRead) {
  TempDir dir;
  // A finished group of this run (generation 0) that left a file behind, as a crashed rank would,
  // and files of another run with the names this run's next group will use.
  as_ranks(2, [&](int r) { dist::store_group(opts(dir.path, r, 2))->all_gather_bytes("gen0"); });
  const std::string stale_header = "PROTEAN-STORE 1 {} {} pg 0 1 2 5 0000000000000000\nstale";
  write_text(dir.path + "/run1.0.pg.0.1", fmt::format(fmt::runtime(stale_header), "run1", 0));
  write_text(dir.path + "/old.1.pg.0.1", fmt::format(fmt::runtime(stale_header), "old", 1));
  write_text(dir.path + "/old.1.join.0.1", "garbage that is never opened");
  std::vector<std::string> got(2);
  auto errors = as_ranks(2, [&](int r) {
    auto g = dist::store_group(opts(dir.path, r, 2));  // generation 1
    got[static_cast<size_t>(r)] = g->all_gather_bytes(fmt::format("fresh{}", r))[static_cast<size_t>(1 - r)];
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(got[0], "fresh1");
  EXPECT_EQ(got[1], "fresh0");
  // Only the planted files are left: the groups cleaned up their own.
  auto left = dir.files();
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"old.1.join.0.1", "old.1.pg.0.1", "run1.0.pg.0.1"}));
}

TEST(DistributedStore, CorruptOrTruncatedFilesAreClearErrors) {
  TempDir dir;
  struct Case {
    std::string what, content, expect;
  };
  const std::vector<Case> cases = {
      {"truncated payload", "PROTEAN-STORE 1 run1 {gen} pg 0 1 2 100 0000000000000000\nonly ten b",
       "the header says 100 payload bytes, the file has 10 (truncated?)"},
      {"no header", "PROTEAN-STORE 1 run1", "no header line"},
      {"not a store file", "hello world\npayload", "is not a store header"},
      {"bad checksum", "PROTEAN-STORE 1 run1 {gen} pg 0 1 2 3 0000000000000000\nabc", "does not match its checksum"},
      {"another exchange", "PROTEAN-STORE 1 run1 {gen} pg 9 1 2 3 0000000000000000\nabc", "exchange 9"},
  };
  for (const Case& c : cases) {
    std::string message;
    auto errors = as_ranks(2, [&](int r) {
      auto g = dist::store_group(opts(dir.path, r, 2, 2));
      if (r == 1) {  // does not take part: plants a bad file where its part goes
        const std::string path = g->store()->file_path("pg", 0, 1);
        std::string content = c.content;
        const size_t at = content.find("{gen}");
        if (at != std::string::npos) content.replace(at, 5, std::to_string(g->store()->generation()));
        write_text(path, content);
        return;
      }
      try {
        g->all_gather_bytes("mine");
      } catch (const pt::RuntimeError& e) {
        message = e.what();
      }
    });
    for (const auto& e : errors) EXPECT_EQ(e, "") << c.what;
    EXPECT_NE(message.find(c.expect), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(dir.path + "/run1."), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find("is corrupt"), std::string::npos) << c.what << ": " << message;
  }
}

TEST(DistributedStore, RanksWithDifferentWorldSizesAreAnError) {
  TempDir dir;
  auto errors = as_ranks(2, [&](int r) { dist::store_group(opts(dir.path, r, r == 0 ? 2 : 3, 1)); });
  EXPECT_NE(errors[0].find("rank 1 was started with a world size of 3, rank 0 with 2"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("PROTEAN_WORLD_SIZE"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1], "");  // rank 1 sees rank 0's size (or waits for a rank 2 that never comes)
}

TEST(DistributedStore, TensorCollectivesSayWhichGroupToUse) {
  TempDir dir;
  auto g = dist::store_group(opts(dir.path, 0, 1));
  EXPECT_EQ(g->all_gather_bytes("solo"), std::vector<std::string>{"solo"});
  try {
    g->all_reduce(pt::ones({4}), dist::ReduceOp::Avg);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const pt::ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nccl_group(store, store->local_rank())"), std::string::npos) << m;
    EXPECT_NE(m.find("protean::mpi::process_group()"), std::string::npos) << m;
  }
  EXPECT_THROW(g->broadcast(pt::ones({4}), 0), pt::ValueError);
  // A data-parallel step over it fails the same way, at its initial broadcast.
  EXPECT_THROW(dist::broadcast_tensors(*g, {pt::ones({2})}), pt::ValueError);
}

TEST(DistributedStore, BadOptionsAreValueErrors) {
  TempDir dir;
  EXPECT_THROW(dist::store_group(opts(dir.path, 2, 2)), pt::ValueError);
  EXPECT_THROW(dist::store_group(opts(dir.path, 0, 0)), pt::ValueError);
  EXPECT_THROW(dist::store_group(opts(dir.path, 0, 1, 1, "has space")), pt::ValueError);
  EXPECT_THROW(dist::store_group(opts(dir.path, 0, 1, 1, "")), pt::ValueError);
  auto o = opts(dir.path, 0, 2);
  o.local_world_size = 1;
  o.local_rank = 1;
  EXPECT_THROW(dist::store_group(o), pt::ValueError);
  write_text(dir.path + "/file", "");
  EXPECT_THROW(dist::store_group(opts(dir.path + "/file", 0, 1)), pt::RuntimeError);
}

TEST(DistributedStore, CompilerCollectivesBackendGathersOnItsOwnChannelAndReportsMissingRanks) {
  TempDir dir;
  std::vector<int> missing_seen;
  bool timed_out_ok = true;
  auto errors = as_ranks(2, [&](int r) {
    auto g = dist::store_group(opts(dir.path, r, 2));
    auto b = dist::detail::make_store_collectives(g->store());
    EXPECT_EQ(b->rank(), r);
    EXPECT_EQ(b->size(), 2);
    for (int k = 0; k < 5; ++k) {
      // The group's exchanges and the backend's interleave without mixing.
      auto pg = g->all_gather_bytes(fmt::format("pg{}.{}", k, r));
      std::vector<std::string> out;
      std::vector<int> missing;
      ASSERT_TRUE(b->all_gather(fmt::format("cc{}.{}", k, r), 5, out, missing));
      EXPECT_EQ(out, (std::vector<std::string>{fmt::format("cc{}.0", k), fmt::format("cc{}.1", k)}));
      EXPECT_EQ(pg, (std::vector<std::string>{fmt::format("pg{}.0", k), fmt::format("pg{}.1", k)}));
    }
    if (r == 1) return;
    std::vector<std::string> out;
    std::vector<int> missing;
    const auto t0 = std::chrono::steady_clock::now();
    timed_out_ok = !b->all_gather("alone", 0.2, out, missing);
    EXPECT_LT(seconds_since(t0), 3.0);
    missing_seen = missing;
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_TRUE(timed_out_ok);
  EXPECT_EQ(missing_seen, std::vector<int>{1});
}

TEST(DistributedStore, InstalledBackendTurnsCompilerCollectivesOnForMoreThanOneRank) {
  TempDir dir;
  auto solo = dist::store_group(opts(dir.path, 0, 1));
  dist::install_compiler_collectives(solo);
  ASSERT_NE(pt::dynamic::collective_backend(), nullptr);
  EXPECT_FALSE(pt::dynamic::collectives_active(true));  // one rank: nothing to agree on
  dist::uninstall_compiler_collectives();
  EXPECT_EQ(pt::dynamic::collective_backend(), nullptr);
  EXPECT_THROW(dist::install_compiler_collectives(nullptr), pt::ValueError);
}

// ---- init_from_env ------------------------------------------------------------------------------

namespace {

struct LaunchEnv {
  EnvScope rank, world, local_rank, local_world, store, run;
  LaunchEnv(const char* r, const char* w, const char* lr, const char* lw, const char* s, const char* id)
      : rank("PROTEAN_RANK", r), world("PROTEAN_WORLD_SIZE", w), local_rank("PROTEAN_LOCAL_RANK", lr),
        local_world("PROTEAN_LOCAL_WORLD_SIZE", lw), store("PROTEAN_STORE", s), run("PROTEAN_RUN_ID", id) {}
};

std::string init_error() {
  try {
    dist::init_from_env();
  } catch (const pt::ValueError& e) {
    return e.what();
  }
  return "no ValueError";
}

}  // namespace

TEST(DistributedInitFromEnv, JoinsTheStoreTheVariablesName) {
  TempDir dir;
  LaunchEnv env("0", "1", "0", "1", dir.path.c_str(), "job-7_a");
  auto g = dist::init_from_env();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  EXPECT_EQ(g->local_rank(), 0);
  EXPECT_EQ(g->local_world_size(), 1);
  EXPECT_EQ(g->path(), dir.path);
  EXPECT_EQ(g->run_id(), "job-7_a");
  LaunchEnv no_local("0", "1", nullptr, nullptr, dir.path.c_str(), "job-7_a");
  EXPECT_EQ(dist::init_from_env()->local_rank(), 0);  // defaults to the rank
}

TEST(DistributedInitFromEnv, BadOrMissingVariablesAreValueErrorsNamingThem) {
  TempDir dir;
  const char* d = dir.path.c_str();
  struct Case {
    const char *r, *w, *lr, *lw, *s, *id;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {nullptr, "2", "0", "2", d, "j", "PROTEAN_RANK is not set; start the program with `protean launch"},
      {"0", nullptr, "0", "2", d, "j", "PROTEAN_WORLD_SIZE is not set"},
      {"abc", "2", "0", "2", d, "j", "PROTEAN_RANK='abc' is not an integer"},
      {"1", "2x", "0", "2", d, "j", "PROTEAN_WORLD_SIZE='2x' is not an integer"},
      {"2", "2", "0", "2", d, "j", "PROTEAN_RANK=2 is not a rank of PROTEAN_WORLD_SIZE=2"},
      {"-1", "2", "0", "2", d, "j", "PROTEAN_RANK=-1 is not a rank"},
      {"0", "0", "0", "2", d, "j", "PROTEAN_WORLD_SIZE=0 must be at least 1"},
      {"0", "2", "2", "2", d, "j", "PROTEAN_LOCAL_RANK=2 is not a rank of PROTEAN_LOCAL_WORLD_SIZE=2"},
      {"0", "2", "0", "3", d, "j", "PROTEAN_LOCAL_WORLD_SIZE=3 must be between 1 and PROTEAN_WORLD_SIZE=2"},
      {"0", "2", "x", "2", d, "j", "PROTEAN_LOCAL_RANK='x' is not an integer"},
      {"0", "2", nullptr, "2", d, "j", "PROTEAN_LOCAL_WORLD_SIZE is set but PROTEAN_LOCAL_RANK is not"},
      {"0", "2", "0", "2", nullptr, "j", "PROTEAN_STORE is not set"},
      {"0", "2", "0", "2", "", "j", "PROTEAN_STORE is not set"},
      {"0", "2", "0", "2", d, nullptr, "PROTEAN_RUN_ID is not set"},
      {"0", "2", "0", "2", d, "a/b", "PROTEAN_RUN_ID: the run id 'a/b' has the character '/'"},
  };
  for (const Case& c : cases) {
    LaunchEnv env(c.r, c.w, c.lr, c.lw, c.s, c.id);
    const std::string m = init_error();
    EXPECT_NE(m.find(c.expect), std::string::npos) << m;
  }
  EXPECT_TRUE(dir.files().empty());  // nothing was written by a refused start
}

TEST(DistributedStore, ChannelsUsedFromTwoThreadsOfEachRankDoNotWaitOnEachOther) {
  // Rank 0's group exchange starts before rank 1's, and rank 1's compiler exchange before rank 0's:
  // with one lock for the whole store each rank would hold the other's channel up until the timeout.
  TempDir dir;
  std::vector<std::string> pg(2), cc(2);
  auto errors = as_ranks(2, [&](int r) {
    auto g = dist::store_group(opts(dir.path, r, 2, 5));
    auto b = dist::detail::make_store_collectives(g->store());
    std::thread other([&] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<std::string> out;
      std::vector<int> missing;
      if (b->all_gather(fmt::format("cc{}", r), 5, out, missing)) cc[static_cast<size_t>(r)] = out[static_cast<size_t>(1 - r)];
    });
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    pg[static_cast<size_t>(r)] = g->all_gather_bytes(fmt::format("pg{}", r))[static_cast<size_t>(1 - r)];
    EXPECT_LT(seconds_since(t0), 2.0);
    other.join();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(pg, (std::vector<std::string>{"pg1", "pg0"}));
  EXPECT_EQ(cc, (std::vector<std::string>{"cc1", "cc0"}));
}

// PROTEAN_COLLECTIVES_TIMEOUT_S: a mistyped value is an error naming it (it was silently 60 s, or the
// number's prefix for "5x"); "inf" and huge values are capped instead of overflowing the deadline.
TEST(DistributedStore, CollectivesTimeoutVariableIsCheckedAndHugeValuesAreCapped) {
  for (const char* bad : {"abc", "5x", "0", "-1", "nan", " "}) {
    EnvScope v("PROTEAN_COLLECTIVES_TIMEOUT_S", bad);
    try {
      pt::dynamic::collectives_timeout_s();
      ADD_FAILURE() << "no error for '" << bad << "'";
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("PROTEAN_COLLECTIVES_TIMEOUT_S='{}' is not a number of seconds", bad)),
                std::string::npos)
          << e.what();
    }
  }
  {
    EnvScope v("PROTEAN_COLLECTIVES_TIMEOUT_S", nullptr);
    EXPECT_EQ(pt::dynamic::collectives_timeout_s(), 60.0);
  }
  {
    EnvScope v("PROTEAN_COLLECTIVES_TIMEOUT_S", "2.5");
    EXPECT_EQ(pt::dynamic::collectives_timeout_s(), 2.5);
  }
  for (const char* huge : {"inf", "1e300"}) {
    EnvScope v("PROTEAN_COLLECTIVES_TIMEOUT_S", huge);
    EXPECT_EQ(pt::dynamic::collectives_timeout_s(), pt::dynamic::kMaxCollectivesTimeoutS) << huge;
  }
  TempDir dir;
  auto o = opts(dir.path, 0, 1);
  o.timeout_s = std::nan("");
  EXPECT_THROW(dist::store_group(o), pt::ValueError);
}

// A deadline of "inf" (or 1e300) waits for a late rank (it must never wrap to a deadline in the past).
TEST(DistributedStore, InfiniteTimeoutWaitsForALateRank) {
  for (const char* huge : {"inf", "1e300"}) {
    TempDir dir;
    EnvScope v("PROTEAN_COLLECTIVES_TIMEOUT_S", huge);
    std::vector<std::vector<std::string>> got(2);
    auto errors = as_ranks(2, [&](int r) {
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
      auto g = dist::store_group(opts(dir.path, r, 2, /*timeout_s=*/0));
      got[static_cast<size_t>(r)] = g->all_gather_bytes(fmt::format("from {}", r));
    });
    EXPECT_EQ(errors[0], "") << huge;
    EXPECT_EQ(errors[1], "") << huge;
    EXPECT_EQ(got[0], (std::vector<std::string>{"from 0", "from 1"})) << huge;
  }
  // The same through StoreOptions::timeout_s.
  TempDir dir;
  auto errors = as_ranks(2, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    dist::store_group(opts(dir.path, r, 2, std::numeric_limits<double>::infinity()));
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// One process per rank of a run: a second process (here a thread) taking a rank that is already taken
// in the store, as two jobs given one run id or a rerun over a badly ended job's files would, is an
// error naming the claim file, not a second writer of that rank's files.
TEST(DistributedStore, RankTakenTwiceInOneRunIsAnErrorNamingTheFile) {
  TempDir dir;
  std::string message;
  auto errors = as_ranks(2, [&](int r) {
    if (r == 0) {
      auto g = dist::store_group(opts(dir.path, 0, 1, 2));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // holds rank 0 while the other tries
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      // Another "process": the same directory spelled differently, so its group is generation 0 too.
      try {
        dist::store_group(opts(dir.path + "/.", 0, 1, 2));
      } catch (const pt::RuntimeError& e) {
        message = e.what();
      }
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_NE(message.find("rank 0 of run run1 (store group #0) is already taken in the store"), std::string::npos) << message;
  EXPECT_NE(message.find("run1.0.rank.0.0 exists"), std::string::npos) << message;
  EXPECT_NE(message.find("give every job a fresh run id"), std::string::npos) << message;
  // The claims go with the group's files when every rank has closed.
  EXPECT_EQ(dir.files(), std::vector<std::string>{}) ;
}
