// Size-bucket policy (src/dynamic/buckets.h): the default ladder (powers of two, 64-wide, ratio 1.25),
// clipping by a symbol's known range, spec parsing and its errors, PROTEAN_BUCKETS overriding
// CompileOptions::buckets, and the log line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <vector>

#include "dynamic/buckets.h"
#include "protean/compile.h"
#include "protean/error.h"
#include "observe/log.h"
#include "protean/ops.h"

namespace dyn = protean::dynamic;
using dyn::Bucket;
using dyn::BucketPolicy;
using dyn::SizeRange;

TEST(Buckets, DefaultLadder) {
  const BucketPolicy p;
  EXPECT_EQ(p.bucket_of(1), (Bucket{1, 1}));
  EXPECT_EQ(p.bucket_of(2), (Bucket{2, 2}));
  EXPECT_EQ(p.bucket_of(3), (Bucket{3, 4}));
  EXPECT_EQ(p.bucket_of(5), (Bucket{5, 8}));
  EXPECT_EQ(p.bucket_of(37), (Bucket{33, 64}));
  EXPECT_EQ(p.bucket_of(64), (Bucket{33, 64}));
  EXPECT_EQ(p.bucket_of(65), (Bucket{65, 128}));
  EXPECT_EQ(p.bucket_of(200), (Bucket{193, 256}));
  EXPECT_EQ(p.bucket_of(1024), (Bucket{961, 1024}));
  EXPECT_EQ(p.bucket_of(1025), (Bucket{1025, 1280}));
  EXPECT_EQ(p.bucket_of(1500), (Bucket{1281, 1600}));
  EXPECT_EQ(p.bucket_of(0), (Bucket{0, 0}));
  EXPECT_EQ(p.bucket_of(-3), (Bucket{-3, -3}));
}

TEST(Buckets, EveryValueInExactlyOneBucketAndRatioHolds) {
  const BucketPolicy p;
  Bucket prev{0, 0};
  for (int64_t v = 1; v <= 200000; ++v) {
    const Bucket b = p.bucket_of(v);
    ASSERT_LE(b.lo, v);
    ASSERT_GE(b.hi, v);
    if (b != prev) {
      ASSERT_EQ(b.lo, prev.hi + 1) << "gap or overlap at " << v;
      prev = b;
    }
    for (int64_t w : {b.lo, b.hi}) {
      ASSERT_EQ(p.bucket_of(w), b) << v;  // same bucket for both ends
    }
    if (v > 64 && v <= 1024) {
      ASSERT_LE(b.hi - b.lo + 1, 64);
    }
    if (v > 1024) {
      ASSERT_LE(static_cast<double>(b.hi) / static_cast<double>(b.lo - 1), 1.25 + 1e-12) << b.str();
      ASSERT_EQ(b.hi % 64, 0) << b.str();
    }
  }
  // GPT-2 lengths of [cuda]: 12 lengths fall into 8 buckets.
  std::vector<Bucket> distinct;
  for (int64_t n : {64, 128, 37, 200, 256, 91, 311, 512, 77, 400, 150, 300}) {
    const Bucket b = p.bucket_of(n);
    if (std::find(distinct.begin(), distinct.end(), b) == distinct.end()) distinct.push_back(b);
  }
  EXPECT_EQ(distinct.size(), 7u) << "[graphs] asks for at most 8 recordings for these 12 lengths";
}

// The geometric ladder as its definition reads, one bucket at a time (sizes well below 2^62): the
// policy's faster walk must give the same bounds.
Bucket one_at_a_time(const BucketPolicy& p, int64_t v) {
  int64_t lo = p.ratio_from;
  for (;;) {
    const double grow = std::floor(static_cast<double>(lo) * (p.ratio - 1.0) / static_cast<double>(p.step));
    const int64_t hi = lo + std::max<int64_t>(p.step, static_cast<int64_t>(grow) * p.step);
    if (v <= hi) return {lo + 1, hi};
    lo = hi;
  }
}

TEST(Buckets, NearOneRatiosTinyStepsAndHugeSizesStayFastAndExact) {
  for (const char* spec : {"ratio=1.01,step=1", "ratio=1.02,step=3,from=1000", "ratio=1.25", "ratio=4,step=1,pow2=1,from=1",
                           "step=100"}) {
    const BucketPolicy p = BucketPolicy::parse(spec, "t");
    Bucket prev{0, 0};
    for (int64_t v = 1; v <= 100000; v += v < 5000 ? 1 : 7) {
      const Bucket b = p.bucket_of(v);
      ASSERT_TRUE(b.lo <= v && v <= b.hi) << spec << " " << v << " " << b.str();
      if (v > p.ratio_from) {
        ASSERT_EQ(b, one_at_a_time(p, v)) << spec << " " << v;
      }
      if (v > 1 && b != prev) {
        ASSERT_GT(b.lo, prev.hi) << spec << ": overlap at " << v << " " << b.str() << " " << prev.str();
      }
      prev = b;
    }
    // a size near INT64_MAX: a bucket holding it (no overflow; walking one step at a time, as before,
    // took seconds here or never ended)
    for (int64_t v : {int64_t{5000000000000000000}, std::numeric_limits<int64_t>::max(), int64_t{1} << 40}) {
      const Bucket b = p.bucket_of(v);
      EXPECT_TRUE(b.lo <= v && v <= b.hi) << spec << " " << v << " " << b.str();
    }
  }
  // step not dividing from: the last step-wide bucket is cut at from, never overlapping the one before
  const BucketPolicy s = BucketPolicy::parse("step=100", "t");
  EXPECT_EQ(s.bucket_of(950), (Bucket{901, 1000}));
  EXPECT_EQ(s.bucket_of(1010), (Bucket{1001, 1024}));
  EXPECT_EQ(s.bucket_of(1025).lo, 1025);
}

TEST(Buckets, KnownRangeClips) {
  const BucketPolicy p;
  const SizeRange r{2, 40, "pgo"};
  EXPECT_EQ(p.bucket_of(37, r), (Bucket{33, 40}));
  EXPECT_EQ(p.bucket_of(2, r), (Bucket{2, 2}));
  EXPECT_EQ(p.bucket_of(50, r), (Bucket{33, 64})) << "outside the known range: the plain bucket";
  const SizeRange m{100, 300, "mark"};
  EXPECT_EQ(p.bucket_of(110, m), (Bucket{100, 128}));
  const auto cover = p.cover(m);
  ASSERT_FALSE(cover.empty());
  EXPECT_EQ(cover.front(), (Bucket{100, 128}));
  EXPECT_EQ(cover.back(), (Bucket{257, 300}));
  for (size_t i = 1; i < cover.size(); ++i) EXPECT_EQ(cover[i].lo, cover[i - 1].hi + 1);
}

TEST(Buckets, SpecParsingAndErrors) {
  EXPECT_EQ(BucketPolicy::parse("", "t").str(), "pow2=64,step=64,from=1024,ratio=1.25");
  EXPECT_EQ(BucketPolicy::parse("default", "t").str(), BucketPolicy{}.str());
  const BucketPolicy e = BucketPolicy::parse("exact", "t");
  EXPECT_TRUE(e.exact);
  EXPECT_EQ(e.bucket_of(37), (Bucket{37, 37}));
  const BucketPolicy c = BucketPolicy::parse(" pow2=16 , step=32,from=512,ratio=1.5", "t");
  EXPECT_EQ(c.bucket_of(9), (Bucket{9, 16}));
  EXPECT_EQ(c.bucket_of(17), (Bucket{17, 32}));
  EXPECT_EQ(c.bucket_of(600), (Bucket{513, 768}));
  EXPECT_EQ(BucketPolicy::parse(c.str(), "t").str(), c.str()) << "str() parses back";
  for (const char* bad : {"pow2=12", "step=0", "from=8", "ratio=1", "ratio=x", "size=3", "pow2", "pow2=1e3", "ratio=1.0000001",
                          "ratio=nan", "step=9223372036854775807", "from=9223372036854775807", "pow2=4611686018427387904",
                          "step=99999999999999999999"}) {
    try {
      BucketPolicy::parse(bad, "PROTEAN_BUCKETS");
      ADD_FAILURE() << bad << " parsed";
    } catch (const protean::ValueError& err) {
      EXPECT_NE(std::string(err.what()).find("PROTEAN_BUCKETS='"), std::string::npos) << err.what();
      EXPECT_NE(std::string(err.what()).find("pow2=N"), std::string::npos) << err.what();
    }
  }
}

TEST(Buckets, EnvironmentOverridesOptions) {
  unsetenv("PROTEAN_BUCKETS");
  EXPECT_TRUE(dyn::resolve_bucket_policy("exact").exact);
  setenv("PROTEAN_BUCKETS", "pow2=8", 1);
  const BucketPolicy p = dyn::resolve_bucket_policy("exact");
  EXPECT_FALSE(p.exact);
  EXPECT_EQ(p.pow2_until, 8);
  setenv("PROTEAN_BUCKETS", "nonsense", 1);
  EXPECT_THROW(dyn::resolve_bucket_policy(""), protean::ValueError);
  unsetenv("PROTEAN_BUCKETS");
}

// PROTEAN_BUCKETS is read when the function is compiled: text set afterwards, bad or good, neither
// fails its later recompiles nor changes its buckets; a function compiled afterwards reads it.
TEST(Buckets, TheEnvironmentIsReadWhenTheFunctionIsCompiled) {
  setenv("PROTEAN_BUCKETS", "pow2=8", 1);
  protean::CompileOptions o;
  o.backend = "interp";
  o.name = "bucket_env";
  auto f = protean::compile([](protean::Tensor x) { return protean::mul(x, 2.0); }, o);
  setenv("PROTEAN_BUCKETS", "nonsense", 1);
  std::string log;
  {
    protean::observe::LogCapture cap("graphs");
    EXPECT_NO_THROW(f(protean::randn({3})));
    EXPECT_NO_THROW(f(protean::randn({5})));  // a new size: the dynamic recompile reads the policy
    log = cap.str();
  }
  EXPECT_NE(log.find("buckets pow2=8,step=64"), std::string::npos) << log;
  EXPECT_THROW(protean::compile([](protean::Tensor x) { return x; }, o), protean::ValueError);
  unsetenv("PROTEAN_BUCKETS");
}

TEST(Buckets, DescribeLine) {
  const std::string s = dyn::describe_buckets("s0", BucketPolicy{}, {2, 600, "pgo"});
  EXPECT_EQ(s.rfind("s0 in [2, 600] (pgo), buckets pow2=64,step=64,from=1024,ratio=1.25: [2, 2] [3, 4] [5, 8]", 0), 0u)
      << s;
  EXPECT_NE(s.find(" ..."), std::string::npos) << s;
  const std::string open = dyn::describe_buckets("s1", BucketPolicy{}, {});
  EXPECT_NE(open.find("s1 in [0, inf] (unknown)"), std::string::npos) << open;
}

// Bad bucket text is a ValueError when the function is compiled (compile(), compile_train_step), not
// at its first dynamic compile.
TEST(Buckets, BadTextIsAnErrorWhenCompiled) {
  protean::CompileOptions o;
  o.backend = "interp";
  o.buckets = "garbage";
  try {
    protean::compile([](protean::Tensor x) { return x; }, o);
    ADD_FAILURE() << "bad bucket text accepted";
  } catch (const protean::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CompileOptions::buckets='garbage'"), std::string::npos) << e.what();
  }
}
