// Unit tests of the capture layer's building blocks: FrameState semilattice, dimension policy,
// log spec parsing and capture.
#include <gtest/gtest.h>

#include <cstdlib>

#include "dynamic/frame_state.h"
#include "dynamic/policy.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/ops.h"

namespace pt = protean;
using pt::dynamic::FrameState;

TEST(CaptureFrameState, ValueThenChangeBecomesDynamic) {
  FrameState fs;
  EXPECT_TRUE(fs.update_tensor("x", {8, 512}, {512, 1}).empty());
  EXPECT_FALSE(fs.size_dynamic("x", 0));
  EXPECT_TRUE(fs.update_tensor("x", {8, 512}, {512, 1}).empty());
  auto newly = fs.update_tensor("x", {16, 512}, {512, 1});
  ASSERT_EQ(newly.size(), 1u);
  EXPECT_EQ(newly[0], 0u);
  EXPECT_TRUE(fs.size_dynamic("x", 0));
  EXPECT_FALSE(fs.size_dynamic("x", 1));
  // Dynamic is the top: never goes back.
  fs.update_tensor("x", {8, 512}, {512, 1});
  EXPECT_TRUE(fs.size_dynamic("x", 0));
}

TEST(CaptureFrameState, RankChangeMakesEveryDimDynamic) {
  FrameState fs;
  fs.update_tensor("x", {4, 4}, {4, 1});
  fs.update_tensor("x", {4, 4, 2}, {8, 2, 1});
  for (size_t d = 0; d < 3; ++d) EXPECT_TRUE(fs.size_dynamic("x", d));
}

TEST(CaptureFrameState, Scalars) {
  FrameState fs;
  EXPECT_FALSE(fs.update_scalar("n", 4));
  EXPECT_FALSE(fs.update_scalar("n", 4));
  EXPECT_TRUE(fs.update_scalar("n", 5));
  EXPECT_TRUE(fs.scalar_dynamic("n"));
  EXPECT_FALSE(fs.scalar_dynamic("m"));
}

TEST(CapturePolicy, PriorityAllowlistOverMarkOverFrameState) {
  using pt::dynamic::DimMark;
  using pt::dynamic::MarkKind;
  FrameState fs;
  fs.update_tensor("x", {4}, {1});
  fs.update_tensor("x", {5}, {1});
  pt::dynamic::PolicyInput in{pt::Dynamic::Auto, false, false, &fs};
  unsetenv("PROTEAN_DYNAMIC_SOURCES");
  EXPECT_EQ(pt::dynamic::decide_dim("x", "x.size()[0]", 0, {}, in).kind, pt::sym::DimKind::Dynamic);
  EXPECT_EQ(pt::dynamic::decide_dim("x", "x.size()[0]", 0, DimMark{MarkKind::Static, {}, {}}, in).kind,
            pt::sym::DimKind::Static);
  setenv("PROTEAN_DYNAMIC_SOURCES", "y,x\\.size\\(\\)\\[0\\]", 1);
  EXPECT_EQ(pt::dynamic::decide_dim("x", "x.size()[0]", 0, DimMark{MarkKind::Static, {}, {}}, in).kind,
            pt::sym::DimKind::Dynamic);
  EXPECT_TRUE(pt::dynamic::allowlisted("y.size()[1]", "y"));
  EXPECT_FALSE(pt::dynamic::allowlisted("z.size()[0]", "z"));
  unsetenv("PROTEAN_DYNAMIC_SOURCES");
  pt::dynamic::PolicyInput on{pt::Dynamic::On, false, false, nullptr};
  EXPECT_EQ(pt::dynamic::decide_dim("z", "z.size()[0]", 0, {}, on).kind, pt::sym::DimKind::Duck);
  pt::dynamic::PolicyInput param{pt::Dynamic::On, true, false, nullptr};
  EXPECT_EQ(pt::dynamic::decide_dim("self.w", "self.w.size()[0]", 0, {}, param).kind, pt::sym::DimKind::Static);
  auto strict = pt::dynamic::decide_dim("x", "x.size()[0]", 0, DimMark{MarkKind::Dynamic, 2, 64}, in);
  EXPECT_TRUE(strict.constraint.strict);
  EXPECT_EQ(*strict.constraint.max, 64);
}

TEST(CaptureLog, SpecAndCapture) {
  pt::observe::LogCapture cap("+dynamic,recompiles_verbose");
  EXPECT_TRUE(pt::observe::log_enabled(pt::observe::LogCat::Dynamic, true));
  EXPECT_TRUE(pt::observe::log_enabled(pt::observe::LogCat::Recompiles));
  EXPECT_FALSE(pt::observe::log_enabled(pt::observe::LogCat::Guards));
  pt::observe::log_line(pt::observe::LogCat::Dynamic, "0/1", "a\nb");
  EXPECT_EQ(cap.str(), "[0/1] a\n[0/1] b\n");
}

// A symbol an op proves equal to another (scaled_dot_product_attention's `k.size(-2) == v.size(-2)`:
// automatic dynamic gives q, k and v lengths their own symbols) is that symbol in the recorded graph
// the backends lower, and the proof stays a guard: a call whose key and value lengths differ is a
// clear ShapeError from eager's check after a guard failure, never a silent mix.
TEST(CaptureReplacements, SymbolsProvenEqualShareOneSymbolInTheGraph) {
  pt::CompileOptions o;
  o.name = "sdpa_lengths";
  o.backend = "interp";
  auto f = pt::compile([](const pt::Tensor& q, const pt::Tensor& k, const pt::Tensor& v) {
    return pt::scaled_dot_product_attention(q, k, v, {}, true);
  }, o);
  auto qkv = [](int64_t L, int64_t S) {
    return std::vector<pt::Tensor>{pt::randn({1, 2, L, 8}), pt::randn({1, 2, S, 8}), pt::randn({1, 2, S, 8})};
  };
  std::string log;
  {
    pt::observe::LogCapture cap("output_code");
    for (int64_t L : {5, 9, 12}) {
      auto t = qkv(L, L);
      EXPECT_EQ(f(t[0], t[1], t[2]).int_sizes(), (pt::IntVec{1, 2, L, 8}));
    }
    log = cap.str();
  }
  EXPECT_NE(log.find(": f32[1, 2, s1, 8], %\"args[2]\" : f32[1, 2, s1, 8]"), std::string::npos) << log;
  EXPECT_EQ(f.stats().compiles, 2);
  auto bad = qkv(9, 9);
  bad[2] = pt::randn({1, 2, 7, 8});
  EXPECT_THROW(f(bad[0], bad[1], bad[2]), pt::ShapeError);
}
