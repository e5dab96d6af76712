// PGO profiles, stores and compiler collectives (docs/pgo.md): format round trip, the merge
// semilattice, FrameState conversion, corrupt/future-version files, concurrent writers, the
// "second run compiles once" rule, dynamic=Off, Redis (real redis-server), the CLI, and the collective
// logic over an in-process fake backend (tests/mpi/ runs the real MPI one).
#include <arpa/inet.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "dynamic/collectives.h"
#include "dynamic/pgo.h"
#include "dynamic/pgo_hooks.h"
#include "dynamic/policy.h"
#include "dynamic/profile_store.h"
#include "observe/log.h"
#include "protean/pgo_cmd.h"
#include "protean/protean.h"
#include "test_env.h"

namespace pt = protean;
namespace dyn = protean::dynamic;
namespace fs = std::filesystem;
using dyn::FrameProfile;
using dyn::LatticeValue;
using dyn::Profile;
using dyn::SourceProfile;
using State = LatticeValue::State;

namespace {

LatticeValue val(int64_t v) { return LatticeValue{State::Value, v}; }
LatticeValue dynv() { return LatticeValue{State::Dynamic, 0}; }

FrameProfile frame(const std::string& name) {
  FrameProfile f;
  f.id = {name, "model.cpp", 12, "00000000deadbeef"};
  return f;
}

SourceProfile tensor(std::vector<LatticeValue> sizes, std::vector<std::pair<int64_t, int64_t>> ranges = {}) {
  SourceProfile s;
  s.rank = sizes.size();
  s.strides.assign(sizes.size(), LatticeValue{});
  s.sizes = std::move(sizes);
  s.size_range = std::move(ranges);
  return s;
}

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh PGO environment (job id + cache dir) per test; restores the environment afterwards.
class PgoEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("protean_pgo_test_{}_{}", ::getpid(), ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
    setenv("PROTEAN_JOB_ID", "job1", 1);
    unsetenv("PROTEAN_PGO_REMOTE");
    unsetenv("PROTEAN_DYNAMIC_SOURCES");
    unsetenv("PROTEAN_COMPILER_COLLECTIVES");
    pt::reset();
    dyn::ProfileStore::instance().reset();
  }
  void TearDown() override {
    unsetenv("PROTEAN_CACHE_DIR");
    unsetenv("PROTEAN_JOB_ID");
    unsetenv("PROTEAN_PGO_REMOTE");
    pt::reset();
    dyn::ProfileStore::instance().reset();
    fs::remove_all(dir_);
  }
  // A new process, as far as PGO is concerned: every frame forgets its state, the profile is re-read.
  static void new_process() {
    pt::reset();
    dyn::ProfileStore::instance().reset();
  }
  std::string local_path() const { return (dir_ / "pgo" / "job1" / "rank0.json").string(); }
  fs::path dir_;
};

using PgoFormat = ::testing::Test;
using PgoMerge = ::testing::Test;
using PgoPolicy = ::testing::Test;
using PgoStore = PgoEnv;
using PgoEndToEnd = PgoEnv;
using PgoRedis = PgoEnv;
using PgoCli = PgoEnv;
using PgoCollectives = PgoEnv;

pt::Tensor affine(const pt::Tensor& x) { return pt::relu(x * 2.0 + 1.0); }

// Every run creates the compiled function here, so both "processes" see the same frame identity.
auto make_affine(pt::Dynamic mode = pt::Dynamic::Auto) {
  return pt::compile(affine, {.name = "affine", .arg_names = {"x"}, .dynamic = mode, .backend = "interp"});
}

}  // namespace

// ---- format ---------------------------------------------------------------------------------------
TEST_F(PgoFormat, RoundTripKeepsEveryLatticePoint) {
  Profile p;
  FrameProfile f = frame("mlp");
  f.sources["x"] = tensor({val(1), val(3), val(48), dynv()}, {{1, 1}, {3, 3}, {48, 48}, {160, 960}});
  f.sources["x"].strides = {dynv(), dynv(), val(1), val(1)};
  SourceProfile n;
  n.scalar = dynv();
  f.sources["n"] = n;
  SourceProfile r;
  r.rank_dynamic = true;
  f.sources["ragged"] = r;
  SourceProfile scalar4;
  scalar4.scalar = val(4);
  f.sources["k"] = scalar4;
  p.frames[f.id.key()] = f;
  const std::string text = dyn::dump_profile(p);
  Profile q = dyn::parse_profile(text, "mem");
  EXPECT_EQ(p, q);
  EXPECT_EQ(dyn::dump_profile(q), text);
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["format"], "protean-pgo");
  EXPECT_EQ(j["version"], 1);
  const auto& e = j["frames"]["mlp|model.cpp|12|00000000deadbeef"];
  EXPECT_EQ(e["name"], "mlp");
  EXPECT_EQ(e["line"], 12);
  EXPECT_EQ(e["sources"]["x"]["sizes"].dump(), R"([1,3,48,"dynamic"])");
  EXPECT_EQ(e["sources"]["x"]["size_range"][3].dump(), "[160,960]");
  EXPECT_TRUE(e["sources"]["x"]["scalar"].is_null());
  EXPECT_EQ(e["sources"]["n"]["scalar"], "dynamic");
  EXPECT_EQ(e["sources"]["k"]["scalar"], 4);
  EXPECT_EQ(e["sources"]["ragged"]["sizes"], "dynamic");
}

TEST_F(PgoFormat, FrameStateConversionBothWays) {
  dyn::FrameState fs;
  fs.update_tensor("x", {4, 16}, {16, 1});
  fs.update_tensor("x", {8, 16}, {16, 1});
  fs.update_tensor("y", {3}, {1});
  fs.update_tensor("y", {3, 3}, {3, 1});  // rank change
  fs.update_scalar("n", 5);
  fs.update_scalar("n", 6);
  fs.update_scalar("k", 2);
  FrameProfile p = dyn::to_profile(frame("f").id, fs);
  EXPECT_TRUE(p.size_dynamic("x", 0));
  EXPECT_FALSE(p.size_dynamic("x", 1));
  EXPECT_EQ(p.sources["x"].size_range, (std::vector<std::pair<int64_t, int64_t>>{{4, 8}, {16, 16}}));
  EXPECT_TRUE(p.sources["y"].rank_dynamic);
  EXPECT_TRUE(p.scalar_dynamic("n"));
  EXPECT_FALSE(p.scalar_dynamic("k"));
  dyn::FrameState back = dyn::to_frame_state(p);
  EXPECT_TRUE(back.size_dynamic("x", 0));
  EXPECT_FALSE(back.size_dynamic("x", 1));
  EXPECT_TRUE(back.size_dynamic("y", 7));
  EXPECT_TRUE(back.scalar_dynamic("n"));
  EXPECT_FALSE(back.scalar_dynamic("k"));
  FrameProfile again = dyn::to_profile(p.id, back);
  EXPECT_EQ(again.sources["x"], p.sources["x"]);
  EXPECT_EQ(again.sources["k"], p.sources["k"]);
}

TEST_F(PgoFormat, RejectsMalformedAndFutureVersions) {
  auto msg = [](const std::string& text) {
    try {
      dyn::parse_profile(text, "p.json");
    } catch (const pt::FormatError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg("{not json").find("p.json: not valid JSON"), std::string::npos);
  EXPECT_NE(msg(R"({"format":"other","version":1,"frames":{}})").find("not a Protean PGO profile"), std::string::npos);
  EXPECT_NE(msg(R"({"format":"protean-pgo","version":7,"frames":{}})").find("version 7 is newer"), std::string::npos);
  EXPECT_NE(msg(R"({"format":"protean-pgo","version":1,"frames":{"a|b|1|h":{"name":"a","file":"b","line":1,)"
                R"("content_hash":"h","sources":{"x":{"sizes":[1,"big"]}}}}})")
                .find("source 'x': sizes[1]"),
            std::string::npos);
  EXPECT_NE(msg(R"({"format":"protean-pgo","version":1,"frames":{"wrong|b|1|h":{"name":"a","file":"b","line":1,)"
                R"("content_hash":"h","sources":{}}}})")
                .find("does not match"),
            std::string::npos);
  EXPECT_EQ(msg(R"({"format":"protean-pgo","version":1,"frames":{}})"), "no error");
}

TEST_F(PgoFormat, ContentHashCoversInterfaceNames) {
  auto a = dyn::content_hash("f", {"x", "y"}, {});
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(a, dyn::content_hash("f", {"x", "y"}, {}));
  EXPECT_NE(a, dyn::content_hash("f", {"x", "z"}, {}));
  EXPECT_NE(a, dyn::content_hash("f", {"xy"}, {}));
  EXPECT_NE(a, dyn::content_hash("f", {"x", "y"}, {"w"}));
}

// ---- merge ---------------------------------------------------------------------------------------
TEST_F(PgoMerge, IsASemilattice) {
  std::mt19937 rng(7);
  auto point = [&]() -> LatticeValue {
    switch (rng() % 4) {
      case 0: return {};
      case 1: return dynv();
      default: return val(static_cast<int64_t>(rng() % 3));
    }
  };
  auto random_frame = [&]() {
    FrameProfile f = frame("f");
    for (const char* src : {"x", "y"}) {
      if (rng() % 5 == 0) continue;
      SourceProfile s;
      int kind = static_cast<int>(rng() % 6);
      if (kind == 0) {
        s.rank_dynamic = true;
      } else if (kind < 5) {
        size_t rank = 1 + rng() % 2;
        for (size_t d = 0; d < rank; ++d) {
          s.sizes.push_back(point().state == State::Unset ? val(2) : point());
          s.strides.push_back(point());
          int64_t lo = static_cast<int64_t>(rng() % 10);
          s.size_range.emplace_back(lo, lo + static_cast<int64_t>(rng() % 10));
        }
        s.rank = rank;
      }
      s.scalar = point();
      f.sources[src] = s;
    }
    return f;
  };
  auto join = [](FrameProfile a, const FrameProfile& b) {
    dyn::merge_frame(a, b);
    return a;
  };
  for (int i = 0; i < 500; ++i) {
    FrameProfile a = random_frame(), b = random_frame(), c = random_frame();
    EXPECT_EQ(join(a, a), a) << "idempotent";
    EXPECT_EQ(join(a, b), join(b, a)) << "commutative";
    EXPECT_EQ(join(join(a, b), c), join(a, join(b, c))) << "associative";
    // Monotone: nothing dynamic in a becomes less dynamic.
    FrameProfile ab = join(a, b);
    for (const auto& [src, s] : a.sources) {
      for (size_t d = 0; d < s.sizes.size(); ++d)
        if (s.sizes[d].dynamic()) {
          EXPECT_TRUE(ab.size_dynamic(src, d));
        }
      if (s.scalar.dynamic()) {
        EXPECT_TRUE(ab.scalar_dynamic(src));
      }
    }
  }
}

TEST_F(PgoMerge, ValuesJoinToDynamicAndRanksToAllDynamic) {
  FrameProfile a = frame("f"), b = frame("f");
  a.sources["x"] = tensor({val(4), val(16)}, {{4, 4}, {16, 16}});
  b.sources["x"] = tensor({val(8), val(16)}, {{8, 8}, {16, 16}});
  EXPECT_TRUE(dyn::merge_frame(a, b));
  EXPECT_TRUE(a.size_dynamic("x", 0));
  EXPECT_FALSE(a.size_dynamic("x", 1));
  EXPECT_EQ(a.sources["x"].size_range[0], (std::pair<int64_t, int64_t>{4, 8}));
  EXPECT_FALSE(dyn::merge_frame(a, b)) << "joining again changes nothing";
  FrameProfile c = frame("f");
  c.sources["x"] = tensor({val(4), val(16), val(2)});
  EXPECT_TRUE(dyn::merge_frame(a, c));
  EXPECT_TRUE(a.sources["x"].rank_dynamic);
  EXPECT_TRUE(a.size_dynamic("x", 2));
}

// ---- policy ----------------------------------------------------------------------------------------
TEST_F(PgoPolicy, ProfileRanksBelowAllowlistAndMarksAboveFrameState) {
  FrameProfile p = frame("f");
  p.sources["x"] = tensor({dynv(), val(16)});
  dyn::FrameState fs;
  fs.update_tensor("x", {4, 16}, {16, 1});
  dyn::PolicyInput in;
  in.frame_state = &fs;
  in.pgo = &p;
  auto d = dyn::decide_dim("x", "x.size()[0]", 0, {}, in);
  EXPECT_EQ(d.kind, pt::sym::DimKind::Dynamic);
  EXPECT_STREQ(d.why, "pgo");
  EXPECT_STREQ(dyn::decide_dim("x", "x.size()[1]", 1, {}, in).why, "default");
  dyn::DimMark st{dyn::MarkKind::Static, {}, {}};
  EXPECT_STREQ(dyn::decide_dim("x", "x.size()[0]", 0, st, in).why, "mark_static");
  setenv("PROTEAN_DYNAMIC_SOURCES", "x", 1);
  EXPECT_STREQ(dyn::decide_dim("x", "x.size()[0]", 0, {}, in).why, "allowlist");
  unsetenv("PROTEAN_DYNAMIC_SOURCES");
  in.mode = pt::Dynamic::Off;
  EXPECT_EQ(dyn::decide_dim("x", "x.size()[0]", 0, {}, in).kind, pt::sym::DimKind::Static);
  in.mode = pt::Dynamic::On;  // every dim is dynamic already; duck sizing stays
  EXPECT_EQ(dyn::decide_dim("x", "x.size()[0]", 0, {}, in).kind, pt::sym::DimKind::Duck);
  in.mode = pt::Dynamic::Auto;
  in.pgo = nullptr;
  FrameProfile joined = frame("f");
  joined.sources["x"] = tensor({val(4), dynv()});
  in.collective = &joined;
  EXPECT_STREQ(dyn::decide_dim("x", "x.size()[1]", 1, {}, in).why, "collectives");
}

// ---- stores ----------------------------------------------------------------------------------------
TEST_F(PgoStore, CorruptProfileIsReportedIgnoredAndBackedUp) {
  fs::create_directories(fs::path(local_path()).parent_path());
  {
    std::ofstream(local_path()) << "{\"format\": \"protean-pgo\", \"version\": 1, \"frames\": {tru";
  }
  pt::observe::LogCapture cap("pgo");
  auto f = make_affine();
  f(pt::randn({4, 3}));
  f(pt::randn({5, 3}));
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_NE(cap.str().find("ignoring profile"), std::string::npos) << cap.str();
  EXPECT_NE(cap.str().find("kept as"), std::string::npos) << cap.str();
  int backups = 0;
  for (const auto& e : fs::directory_iterator(fs::path(local_path()).parent_path()))
    if (e.path().filename().string().find("rank0.json.corrupt-") == 0) {
      ++backups;
      EXPECT_EQ(read_file(e.path().string()), "{\"format\": \"protean-pgo\", \"version\": 1, \"frames\": {tru");
    }
  EXPECT_EQ(backups, 1);
  auto p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->frames.size(), 1u);
}

TEST_F(PgoStore, FutureVersionIsReportedAndKept) {
  fs::create_directories(fs::path(local_path()).parent_path());
  const std::string future = R"({"format": "protean-pgo", "version": 2, "frames": {}})";
  { std::ofstream(local_path()) << future; }
  pt::observe::LogCapture cap("");
  EXPECT_FALSE(dyn::ProfileStore::instance().lookup("x|y|1|z"));
  EXPECT_NE(cap.str().find("version 2 is newer"), std::string::npos) << cap.str();
  FrameProfile f = frame("g");
  f.sources["x"] = tensor({val(3)});
  EXPECT_TRUE(dyn::ProfileStore::instance().record(f));
  bool backed_up = false;
  for (const auto& e : fs::directory_iterator(fs::path(local_path()).parent_path()))
    if (e.path().filename().string().find(".corrupt-") != std::string::npos)
      backed_up = read_file(e.path().string()) == future;
  EXPECT_TRUE(backed_up);
  EXPECT_EQ(dyn::read_profile_file(local_path())->frames.size(), 1u);
}

TEST_F(PgoStore, ConcurrentWritersAllLand) {
  constexpr int kProcs = 6, kRounds = 5;
  std::vector<pid_t> kids;
  for (int k = 0; k < kProcs; ++k) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int rc = 0;
      try {
        for (int r = 0; r < kRounds; ++r) {
          Profile p;
          FrameProfile f = frame(fmt::format("frame{}", k));
          f.sources["x"] = tensor({val(r + 2)}, {{r + 2, r + 2}});
          p.frames[f.id.key()] = f;
          dyn::merge_into_file(local_path(), p);
        }
      } catch (...) {
        rc = 1;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  ASSERT_EQ(p->frames.size(), static_cast<size_t>(kProcs));
  for (const auto& [key, f] : p->frames) {
    EXPECT_TRUE(f.size_dynamic("x", 0)) << key << ": every round of every writer was joined";
    EXPECT_EQ(f.sources.at("x").size_range[0], (std::pair<int64_t, int64_t>{2, kRounds + 1}));
  }
  for (const auto& e : fs::directory_iterator(fs::path(local_path()).parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "no temp files left";
}

TEST_F(PgoStore, OffWithoutJobId) {
  unsetenv("PROTEAN_JOB_ID");
  dyn::ProfileStore::instance().reset();
  auto f = make_affine();
  f(pt::randn({4, 3}));
  f(pt::randn({5, 3}));
  EXPECT_FALSE(fs::exists(dir_ / "pgo"));
}

// ---- the rule: the second run of a job compiles once -----------------------------------------------
TEST_F(PgoEndToEnd, SecondRunCompilesOnceFromTheProfile) {
  auto f = make_affine();
  for (int64_t n : {2, 3, 4}) f(pt::randn({n, 3}));
  EXPECT_EQ(pt::stats().compiles, 2) << "first run: static, then dynamic";
  auto p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  ASSERT_EQ(p->frames.size(), 1u);
  const FrameProfile& e = p->frames.begin()->second;
  EXPECT_EQ(e.id.name, "affine");
  EXPECT_TRUE(e.size_dynamic("x", 0));
  EXPECT_FALSE(e.size_dynamic("x", 1));
  EXPECT_EQ(e.sources.at("x").size_range[0], (std::pair<int64_t, int64_t>{2, 3})) << "observed at compiles";

  new_process();
  p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->frames.begin()->second.sources.at("x").size_range[0], (std::pair<int64_t, int64_t>{2, 4}))
      << "the cache hit on 4 reached the profile when the frame was reset";
  pt::observe::LogCapture cap("pgo");
  auto g = make_affine();
  for (int64_t n : {5, 6, 7}) {
    pt::Tensor x = pt::randn({n, 3});
    EXPECT_TRUE(pt::allclose(g(x), affine(x)));
  }
  EXPECT_EQ(pt::stats().compiles, 1) << cap.str();
  EXPECT_NE(cap.str().find("x.size()[0] starts dynamic [observed 2..4] (decision from PGO profile)"), std::string::npos)
      << cap.str();
}

// The same rule with real processes: this test binary runs PgoChild.Run twice in one job.
TEST(PgoChild, Run) {
  if (!std::getenv("PROTEAN_PGO_TEST_CHILD")) GTEST_SKIP() << "only runs as the child of PgoEndToEnd.TwoProcesses";
  auto f = make_affine();
  for (int64_t n : {2, 3, 4, 5}) f(pt::randn({n, 3}));
  std::printf("compiles=%lld\n", static_cast<long long>(pt::stats().compiles));
}

TEST_F(PgoEndToEnd, TwoProcessesOfOneJob) {
  auto run = [&](int i) {
    const std::string out = (dir_ / fmt::format("run{}.txt", i)).string();
    const std::string cmd = fmt::format("PROTEAN_PGO_TEST_CHILD=1 PROTEAN_LOGS=pgo /proc/{}/exe --gtest_filter=PgoChild.Run > {} 2>&1",
                                        ::getpid(), out);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << read_file(out);
    return read_file(out);
  };
  const std::string first = run(1), second = run(2);
  EXPECT_NE(first.find("compiles=2"), std::string::npos) << first;
  EXPECT_EQ(first.find("decision from PGO profile"), std::string::npos) << first;
  EXPECT_NE(second.find("compiles=1"), std::string::npos) << second;
  EXPECT_NE(second.find("x.size()[0] starts dynamic [observed 2..5] (decision from PGO profile)"), std::string::npos)
      << second;
}

TEST_F(PgoEndToEnd, DynamicLogShowsPgoDecisionToo) {
  auto f = make_affine();
  for (int64_t n : {2, 3}) f(pt::randn({n, 3}));
  new_process();
  pt::observe::LogCapture cap("+dynamic");
  auto g = make_affine();
  g(pt::randn({9, 3}));
  EXPECT_NE(cap.str().find("decision from PGO profile"), std::string::npos) << cap.str();
}

TEST_F(PgoEndToEnd, DynamicOffDoesNotClobberAStoredDecision) {
  auto f = make_affine();
  for (int64_t n : {2, 3}) f(pt::randn({n, 3}));
  const std::string before = read_file(local_path());
  new_process();
  pt::observe::LogCapture cap("");
  auto g = make_affine(pt::Dynamic::Off);
  for (int64_t n : {4, 5, 6}) g(pt::randn({n, 3}));
  EXPECT_EQ(pt::stats().compiles, 3) << "dynamic=Off: one graph per shape";
  EXPECT_NE(cap.str().find("dynamic=Off"), std::string::npos) << cap.str();
  EXPECT_NE(cap.str().find("stored dynamic decisions are kept"), std::string::npos);
  EXPECT_EQ(read_file(local_path()), before);
  new_process();
  auto h = make_affine();
  for (int64_t n : {7, 8}) h(pt::randn({n, 3}));
  EXPECT_EQ(pt::stats().compiles, 1) << "the decision survived the static run";
}

// ---- Redis -----------------------------------------------------------------------------------------
namespace {
using protean::testing::have_redis_server;
using protean::testing::RedisServer;

/// GET over a raw RESP exchange (the value, or nothing for a missing key or a dead server).
std::optional<std::string> redis_get(const RedisServer& server, const std::string& key) {
  int s = protean::testing::connect_loopback(server.port);
  if (s < 0) return std::nullopt;
  std::string req = fmt::format("*2\r\n$3\r\nGET\r\n${}\r\n{}\r\n", key.size(), key);
  if (::write(s, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(s);
    return std::nullopt;
  }
  std::string buf;
  char tmp[4096];
  for (;;) {
    ssize_t n = ::read(s, tmp, sizeof tmp);
    if (n <= 0) break;
    buf.append(tmp, static_cast<size_t>(n));
    size_t eol = buf.find("\r\n");
    if (eol == std::string::npos) continue;
    if (buf[0] != '$') break;
    long len = std::stol(buf.substr(1, eol - 1));
    if (len < 0) break;
    if (buf.size() >= eol + 2 + static_cast<size_t>(len)) {
      ::close(s);
      return buf.substr(eol + 2, static_cast<size_t>(len));
    }
  }
  ::close(s);
  return std::nullopt;
}

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}
}  // namespace

TEST_F(PgoRedis, RemoteStoreSharesProfilesAcrossMachines) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  RedisServer server(dir_, "pgotest");
  setenv("PROTEAN_PGO_REMOTE", server.url().c_str(), 1);
  new_process();
  auto f = make_affine();
  for (int64_t n : {2, 3}) f(pt::randn({n, 3}));
  auto text = redis_get(server, "pgotest/job1/rank0");
  ASSERT_TRUE(text) << "profile stored under <prefix>/<job>/rank<R>";
  Profile remote = dyn::parse_profile(*text, "redis");
  ASSERT_EQ(remote.frames.size(), 1u);
  EXPECT_TRUE(remote.frames.begin()->second.size_dynamic("x", 0));
  // Another machine: no local profile, same job and remote store.
  fs::remove_all(dir_ / "pgo");
  new_process();
  pt::observe::LogCapture cap("pgo");
  auto g = make_affine();
  for (int64_t n : {5, 6}) g(pt::randn({n, 3}));
  EXPECT_EQ(pt::stats().compiles, 1) << cap.str();
  EXPECT_EQ(count(cap.str(), "W protean:"), 0) << cap.str();
  EXPECT_TRUE(fs::exists(local_path())) << "the local store is written as well";
}

TEST_F(PgoRedis, DeadServerWarnsOnceAndLocalStoreContinues) {
  setenv("PROTEAN_PGO_REMOTE", fmt::format("redis://127.0.0.1:{}/pgotest", protean::testing::free_loopback_port()).c_str(), 1);
  new_process();
  pt::observe::LogCapture cap("");
  auto start = std::chrono::steady_clock::now();
  auto f = make_affine();
  for (int64_t n : {2, 3, 4}) f(pt::randn({n, 3}));
  auto g = pt::compile([](const pt::Tensor& y) { return y + 1.0; }, {.name = "plus1", .arg_names = {"y"}, .backend = "interp"});
  for (int64_t n : {2, 3}) g(pt::randn({n}));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(count(cap.str(), "is unavailable"), 1) << cap.str();
  auto p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->frames.size(), 2u);
}

TEST_F(PgoRedis, ServerKilledMidRunWarnsOnce) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  RedisServer server(dir_, "pgotest");
  setenv("PROTEAN_PGO_REMOTE", server.url().c_str(), 1);
  new_process();
  pt::observe::LogCapture cap("");
  auto f = make_affine();
  f(pt::randn({2, 3}));  // loads (connects) and stores the static entry
  ASSERT_TRUE(redis_get(server, "pgotest/job1/rank0"));
  server.kill();
  f(pt::randn({3, 3}));  // the dynamic decision: remote write fails
  auto g = pt::compile([](const pt::Tensor& y) { return y + 1.0; }, {.name = "plus1", .arg_names = {"y"}, .backend = "interp"});
  g(pt::randn({2}));
  EXPECT_EQ(count(cap.str(), "is unavailable"), 1) << cap.str();
  auto p = dyn::read_profile_file(local_path());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->frames.size(), 2u);
  bool dynamic_saved = false;
  for (const auto& [k, fr] : p->frames) dynamic_saved |= fr.id.name == "affine" && fr.size_dynamic("x", 0);
  EXPECT_TRUE(dynamic_saved);
}

// ---- CLI -------------------------------------------------------------------------------------------
TEST_F(PgoCli, ShowRendersDynamicDimsRangesAndMarks) {
  Profile p;
  FrameProfile f = frame("rec");
  f.sources["x"] = tensor({val(1), val(3), val(48), dynv()}, {{1, 1}, {3, 3}, {48, 48}, {160, 960}});
  SourceProfile n;
  n.scalar = dynv();
  f.sources["n"] = n;
  p.frames[f.id.key()] = f;
  std::string text = pt::tools::render_profile(p);
  EXPECT_NE(text.find("x: [1, 3, 48, ?]  (dim 3 in [160, 960])"), std::string::npos) << text;
  EXPECT_NE(text.find("protean::mark_dynamic(x, 3);"), std::string::npos) << text;
  EXPECT_NE(text.find("PROTEAN_DYNAMIC_SOURCES=n,x.size()[3]"), std::string::npos) << text;
  EXPECT_NE(text.find("n: ?"), std::string::npos) << text;

  // show --job, show FILE, merge, clear through the command functions.
  dyn::merge_into_file(local_path(), p);
  std::ostringstream out, err;
  pt::tools::PgoArgs a;
  a.job = "job1";
  EXPECT_EQ(pt::tools::pgo_show(a, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("x: [1, 3, 48, ?]"), std::string::npos) << out.str();
  Profile other;
  FrameProfile g = frame("rec");
  g.sources["x"] = tensor({val(2), val(3), val(48), val(320)}, {{2, 2}, {3, 3}, {48, 48}, {320, 320}});
  other.frames[g.id.key()] = g;
  const std::string b = (dir_ / "b.json").string(), o = (dir_ / "out" / "m.json").string();
  { std::ofstream(b) << dyn::dump_profile(other); }
  pt::tools::PgoArgs m;
  m.inputs = {local_path(), b};
  m.out = o;
  EXPECT_EQ(pt::tools::pgo_merge(m, out, err), 0) << err.str();
  auto merged = dyn::read_profile_file(o);
  ASSERT_TRUE(merged);
  EXPECT_TRUE(merged->frames.begin()->second.size_dynamic("x", 0));
  EXPECT_TRUE(merged->frames.begin()->second.size_dynamic("x", 3));
  pt::tools::PgoArgs s;
  s.file = o;
  std::ostringstream out2;
  EXPECT_EQ(pt::tools::pgo_show(s, out2, err), 0);
  EXPECT_NE(out2.str().find("x: [?, 3, 48, ?]  (dim 0 in [1, 2], dim 3 in [160, 960])"), std::string::npos) << out2.str();
  pt::tools::PgoArgs c;
  c.job = "job1";
  EXPECT_EQ(pt::tools::pgo_clear(c, out, err), 0);
  EXPECT_FALSE(fs::exists(local_path()));
  // A corrupt input is an error naming the file, not a crash.
  { std::ofstream(b) << "garbage"; }
  m.inputs = {o, b};
  std::ostringstream err2;
  EXPECT_EQ(pt::tools::pgo_merge(m, out, err2), 1);
  EXPECT_NE(err2.str().find("b.json: not valid JSON"), std::string::npos) << err2.str();
}

// ---- collectives over a fake in-process backend -----------------------------------------------------
namespace {
// Rank 0 of a job whose other ranks answer with canned payloads (or never answer).
class FakeRanks : public dyn::CollectiveBackend {
 public:
  std::function<std::string(int rank, const nlohmann::json& mine)> answer;
  std::vector<int> silent;  // ranks that never answer
  int n = 3;
  int rank() const override { return 0; }
  int size() const override { return n; }
  bool all_gather(const std::string& mine, double timeout_s, std::vector<std::string>& out,
                  std::vector<int>& missing) override {
    out.assign(static_cast<size_t>(n), "");
    out[0] = mine;
    auto j = nlohmann::json::parse(mine);
    missing = silent;
    if (!silent.empty()) {
      std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s));
      return false;
    }
    for (int r = 1; r < n; ++r) out[static_cast<size_t>(r)] = answer(r, j);
    return true;
  }
};
}  // namespace

TEST_F(PgoCollectives, WithoutBackendAProcessIsUnaffected) {
  dyn::set_collective_backend(nullptr);
  setenv("PROTEAN_COMPILER_COLLECTIVES", "1", 1);
  EXPECT_FALSE(dyn::collectives_active(false));
  unsetenv("PROTEAN_COMPILER_COLLECTIVES");
  auto f = make_affine();
  for (int64_t n : {2, 3, 4}) f(pt::randn({n, 3}));
  EXPECT_EQ(pt::stats().compiles, 2);
}

TEST_F(PgoCollectives, JoinMakesDimsThatDifferAcrossRanksDynamic) {
  auto fake = std::make_shared<FakeRanks>();
  fake->answer = [](int r, const nlohmann::json& mine) {
    nlohmann::json j = mine;
    if (mine["kind"] == "state") {
      FrameProfile f = dyn::frame_from_json(mine["entry"], "mine");
      f.sources["x"].sizes[0] = val(4 * (r + 1));
      j["entry"] = dyn::to_json(f);
    }
    return j.dump();
  };
  dyn::set_collective_backend(fake);
  FrameProfile mine = frame("f");
  mine.sources["x"] = tensor({val(4), val(16)});
  FrameProfile joined = dyn::exchange_frame_state(mine.id, mine, "0/0");
  EXPECT_TRUE(joined.size_dynamic("x", 0));
  EXPECT_FALSE(joined.size_dynamic("x", 1));
  EXPECT_FALSE(dyn::any_rank_missed(mine.id, false));
  dyn::set_collective_backend(nullptr);
}

TEST_F(PgoCollectives, MissingRankIsATimeoutErrorNamingFrameAndRanks) {
  auto fake = std::make_shared<FakeRanks>();
  fake->silent = {2};
  dyn::set_collective_backend(fake);
  setenv("PROTEAN_COLLECTIVES_TIMEOUT_S", "0.2", 1);
  auto start = std::chrono::steady_clock::now();
  try {
    dyn::any_rank_missed(frame("step").id, true);
    ADD_FAILURE() << "expected a CompileError";
  } catch (const pt::CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("frame 'step' (model.cpp:12)"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 2 did not take part"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  unsetenv("PROTEAN_COLLECTIVES_TIMEOUT_S");
  dyn::set_collective_backend(nullptr);
}

TEST_F(PgoCollectives, RanksAtDifferentFramesAreReported) {
  auto fake = std::make_shared<FakeRanks>();
  fake->answer = [](int r, const nlohmann::json& mine) {
    nlohmann::json j = mine;
    if (r == 1) j["frame"] = "other|x.cpp|1|h";
    return j.dump();
  };
  dyn::set_collective_backend(fake);
  try {
    dyn::any_rank_missed(frame("step").id, false);
    ADD_FAILURE() << "expected a CompileError";
  } catch (const pt::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks diverged"), std::string::npos) << e.what();
  }
  dyn::set_collective_backend(nullptr);
}

TEST(PgoCliArgs, PositionalJobIdHintsAtJobFlag) {
  std::ostringstream out, err;
  pt::tools::PgoArgs args;
  args.file = "job42";
  EXPECT_EQ(pt::tools::pgo_show(args, out, err), 1);
  EXPECT_NE(err.str().find("--job job42"), std::string::npos) << err.str();
  pt::tools::PgoArgs cargs;
  cargs.stray_job = "job42";
  std::ostringstream out2, err2;
  EXPECT_EQ(pt::tools::pgo_clear(cargs, out2, err2), 1);
  EXPECT_NE(err2.str().find("--job job42"), std::string::npos) << err2.str();
}
