// True ranges in PGO profiles: sizes seen on cache hits reach the profile (not only the sizes of the
// compiling calls), and the next process's size buckets start from that range.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "dynamic/profile_store.h"
#include "observe/log.h"
#include "protean/protean.h"
#include "scenario_util.h"

namespace pt = protean;
namespace fs = std::filesystem;
using pt::scenario::scenario_compile;

namespace {

pt::Tensor affine_rows(const pt::Tensor& x) { return pt::relu(x * 2.0 + 1.0); }

// One place, so every compiled function here has the same frame identity (name, file, line).
auto make_affine_rows() { return scenario_compile(affine_rows, {.name = "affine_rows", .arg_names = {"x"}}); }

class ScenarioPgoRanges : public ::testing::Test {
 protected:
  void SetUp() override {
    // A job of its own under the suite's cache dir (the cpu kernels stay cached across runs).
    job_ = "ranges-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    setenv("PROTEAN_JOB_ID", job_.c_str(), 1);
    pt::reset();
    pt::dynamic::ProfileStore::instance().reset();
    path_ = pt::dynamic::ProfileStore::instance().config().local_path();
    fs::remove_all(fs::path(path_).parent_path());
  }
  void TearDown() override {
    unsetenv("PROTEAN_JOB_ID");
    pt::reset();
    pt::dynamic::ProfileStore::instance().reset();
    fs::remove_all(fs::path(path_).parent_path());
  }
  pt::dynamic::FrameProfile entry() const {
    auto p = pt::dynamic::read_profile_file(path_);
    EXPECT_TRUE(p) << path_;
    EXPECT_EQ(p ? p->frames.size() : 0u, 1u);
    return p && !p->frames.empty() ? p->frames.begin()->second : pt::dynamic::FrameProfile{};
  }
  std::string job_, path_;
};

}  // namespace

TEST_F(ScenarioPgoRanges, SizesSeenOnCacheHitsReachTheProfile) {
  {
    auto f = make_affine_rows();
    for (int64_t n = 2; n <= 6; ++n) f(pt::randn({n, 3}));
    EXPECT_EQ(pt::stats().compiles, 2) << "static, then dynamic; 4, 5, 6 are cache hits";
    EXPECT_EQ(entry().sources.at("x").size_range.at(0), (std::pair<int64_t, int64_t>{2, 3}))
        << "written at the compiles; the hits are folded in when the frame goes away";
  }
  const pt::dynamic::FrameProfile e = entry();
  EXPECT_EQ(e.sources.at("x").size_range.at(0), (std::pair<int64_t, int64_t>{2, 6}));
  EXPECT_NE(e.render().find("x: [?, 3]  (dim 0 in [2, 6])"), std::string::npos) << e.render();

  // The next process starts dynamic over the true range; its size buckets are clipped to it.
  pt::reset();
  pt::dynamic::ProfileStore::instance().reset();
  pt::observe::LogCapture cap("graphs");
  {
    auto g = make_affine_rows();
    for (int64_t n : {5, 9, 12}) g(pt::randn({n, 3}));
    EXPECT_EQ(pt::stats().compiles, 1) << cap.str();
  }
  EXPECT_NE(cap.str().find("in [2, 6] (pgo), buckets pow2=64,step=64,from=1024,ratio=1.25: [2, 2] [3, 4] [5, 6]"),
            std::string::npos)
      << cap.str();
  EXPECT_EQ(entry().sources.at("x").size_range.at(0), (std::pair<int64_t, int64_t>{2, 12})) << "widened by the hits";
}

TEST_F(ScenarioPgoRanges, ResetWritesTheRangesOfLiveFrames) {
  auto f = make_affine_rows();
  for (int64_t n : {4, 8, 16, 32, 7}) f(pt::randn({n, 3}));
  pt::reset();  // clears the frame: its ranges are written first
  EXPECT_EQ(entry().sources.at("x").size_range.at(0), (std::pair<int64_t, int64_t>{4, 32}));
}
