// Scenario tests for graph breaks (docs/breaks.md): segmented execution (segment counts, frame ids,
// automatic dynamic per segment, results equal to eager), fullgraph errors, logs and stats, cond,
// capture_scalar_outputs with nonzero, and verify mode.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>

#include "breaks_test_util.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;
using pt::scenario::compile_error_of;
using pt::scenario::consecutive;
using pt::scenario::expect_same;

namespace {

using Breaks = pt::scenario::BreaksTest;
using BreaksSegments = Breaks;
using BreaksFullgraph = Breaks;
using BreaksLogs = Breaks;
using BreaksCond = Breaks;
using BreaksScalarOutputs = Breaks;
using BreaksVerify = Breaks;

constexpr int kLineItem1 = __LINE__ + 4;
// One break: item() in the middle.
Tensor one_break(const Tensor& x, const Tensor& w) {
  Tensor y = pt::tanh(pt::matmul(x, w)) * 2.0 + 1.0;
  float s = y.sum().item<float>();
  return pt::relu(y - s / 10.0f) * 3.0;
}

// Two breaks: item() and an explicit graph_break().
Tensor two_breaks(const Tensor& x) {
  Tensor a = pt::sigmoid(x) + 1.0;
  double m = a.mean().item<double>();
  Tensor b = a * m;
  pt::graph_break();
  return pt::exp(b * 0.1) - a;
}

// Three breaks: item(), to_vector() and graph_break().
Tensor three_breaks(const Tensor& x, const Tensor& y) {
  Tensor a = x * y + 0.5;
  float mx = a.amax().item<float>();
  Tensor b = a - mx;
  std::vector<float> row = b.sum({0}).to_vector<float>();
  Tensor c = b * static_cast<double>(row.size());
  pt::graph_break("three_breaks: explicit");
  return pt::sqrt(pt::abs(c)) + y;
}

constexpr int kLineItemInner = __LINE__ + 3;
// A break inside a function that is compiled on its own and called from another compiled function.
Tensor inner_brk(const Tensor& x) {
  float s = x.sum().item<float>();
  return x * double(s);
}

}  // namespace

// ---- segmented execution ---------------------------------------------------------------------------
TEST_F(BreaksSegments, OneBreakTwoSegmentsAutomaticDynamicInEach) {
  auto f = pt::compile(one_break, {.name = "one_break", .arg_names = {"x", "w"}, .backend = "interp"});
  Tensor w = pt::randn({8, 4});
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> n_of(2, 40);
  std::vector<int64_t> ns = {5, 9};
  for (int i = 0; i < 6; ++i) ns.push_back(n_of(rng));
  for (int64_t n : ns) {
    Tensor x = pt::randn({n, 8});
    expect_same(f(x, w), one_break(x, w));
  }
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(f.segment_frame_ids(), consecutive(f.frame_id() + 1, 2));
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 1);
  ASSERT_EQ(s.graph_break_reasons.size(), 1u);
  EXPECT_EQ(s.graph_break_reasons.begin()->first,
            "graph break: Tensor::item() reads tensor data on the host (op item) at breaks_scenarios.cpp:" +
                std::to_string(kLineItem1));
  // Each segment: a static compile, then one dynamic recompile when x's rows change; then hits.
  EXPECT_EQ(s.compiles, 4);
  EXPECT_EQ(s.recompiles, 2);
  int seg0 = f.segment_frame_ids()[0];
  EXPECT_EQ(s.recompile_reasons.count(std::to_string(seg0) + "/0: tensor 'inputs[0]' size mismatch at index 0. expected 5, actual 9"),
            1u);
}

TEST_F(BreaksSegments, TwoBreaksThreeSegments) {
  auto f = pt::compile(two_breaks, {.name = "two_breaks", .arg_names = {"x"}, .backend = "interp"});
  for (int64_t n : {3, 4, 7, 12, 30}) {
    Tensor x = pt::randn({n, 5});
    expect_same(f(x), two_breaks(x));
  }
  EXPECT_EQ(f.segment_frame_ids(), consecutive(f.frame_id() + 1, 3));
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 2);
  EXPECT_EQ(s.compiles, 6);  // 3 segments × (static + dynamic)
}

TEST_F(BreaksSegments, ThreeBreaksFourSegments) {
  auto f = pt::compile(three_breaks, {.name = "three_breaks", .arg_names = {"x", "y"}, .backend = "interp"});
  for (int64_t n : {2, 6, 11, 17}) {
    Tensor x = pt::randn({n, 3}), y = pt::randn({3});
    expect_same(f(x, y), three_breaks(x, y));
  }
  EXPECT_EQ(f.segment_frame_ids(), consecutive(f.frame_id() + 1, 4));
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 3);
  EXPECT_EQ(s.graph_break_reasons.size(), 3u);
  for (const auto& [reason, count] : s.graph_break_reasons) EXPECT_EQ(count, 1) << reason;
}

TEST_F(BreaksSegments, SideEffectsRunOnEveryCall) {
  int before = 0, after = 0;
  auto fn = [&](const Tensor& x) {
    ++before;
    float s = x.sum().item<float>();
    ++after;
    return x * s;
  };
  auto f = pt::compile(fn, {.name = "effects", .arg_names = {"x"}, .backend = "interp"});
  for (int i = 0; i < 3; ++i) {
    Tensor x = pt::randn({4});
    Tensor want = x * x.sum().item<float>();
    expect_same(f(x), want);
  }
  // The first call traces up to the break (on FakeTensors), then runs the whole body segmented.
  EXPECT_EQ(before, 4);
  EXPECT_EQ(after, 3);
}

TEST_F(BreaksSegments, PathAfterTheBreakPicksItsOwnSegment) {
  auto fn = [](const Tensor& x) {
    Tensor y = x * 2.0;
    if (y.sum().item<float>() > 0) return pt::exp(y * 0.1);
    return y - 1.0;
  };
  auto f = pt::compile(fn, {.name = "branchy", .arg_names = {"x"}, .backend = "interp"});
  bool saw_pos = false, saw_neg = false;
  for (int i = 0; i < 12; ++i) {
    Tensor x = pt::randn({6});
    (x.sum().item<float>() > 0 ? saw_pos : saw_neg) = true;
    expect_same(f(x), fn(x));
  }
  ASSERT_TRUE(saw_pos && saw_neg);
  EXPECT_EQ(f.segment_frame_ids().size(), 3u);  // the prefix, and one segment per branch
  EXPECT_EQ(pt::stats().graph_breaks, 1);
}

TEST_F(BreaksSegments, PrintingAndDataPtrBreakToo) {
  auto fn = [](const Tensor& x) {
    Tensor y = x + 1.0;
    std::string text = y.str();
    const float* p = y.data_ptr<float>();
    return y * static_cast<double>(p[0]) + static_cast<double>(text.size() % 2);
  };
  auto f = pt::compile(fn, {.name = "printing", .arg_names = {"x"}, .backend = "interp"});
  Tensor x = pt::randn({3});
  expect_same(f(x), fn(x));
  EXPECT_EQ(pt::stats().graph_breaks, 1);  // the print materializes y; data_ptr then reads a real tensor
}

TEST_F(BreaksSegments, ReadingARealArgumentIsNotABreak) {
  auto fn = [](const Tensor& x, const Tensor& s) {
    Tensor y = x * s;
    float v = s.item<float>();  // s is real: reading it does not end the pending segment
    Tensor z = y + static_cast<double>(v);
    float m = z.sum().item<float>();  // the one break
    return z * static_cast<double>(m);
  };
  auto f = pt::compile(fn, {.name = "real_read", .arg_names = {"x", "s"}, .backend = "interp"});
  for (int i = 0; i < 3; ++i) {
    Tensor x = pt::randn({4, 3}), s = pt::randn({});
    expect_same(f(x, s), fn(x, s));
  }
  // The trace breaks at s.item() (s is a FakeTensor there) and that site is counted; segmented, only
  // z.sum().item() ends a segment.
  EXPECT_EQ(pt::stats().graph_breaks, 2);
  EXPECT_EQ(f.segment_frame_ids().size(), 2u);
}

TEST_F(BreaksSegments, NonzeroWithoutCaptureScalarOutputsBreaks) {
  auto fn = [](const Tensor& x) {
    Tensor nz = pt::nonzero(x > 0.0);
    return nz.to(pt::DType::F32).sum() + x.sum();
  };
  auto f = pt::compile(fn, {.name = "nz_break", .arg_names = {"x"}, .backend = "interp"});
  for (int i = 0; i < 3; ++i) {
    Tensor x = pt::randn({10});
    expect_same(f(x), fn(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 1);
  ASSERT_EQ(s.graph_break_reasons.size(), 1u);
  EXPECT_NE(s.graph_break_reasons.begin()->first.find("data-dependent output shape"), std::string::npos);
  EXPECT_NE(s.graph_break_reasons.begin()->first.find("(op nonzero(b8[10]))"), std::string::npos)
      << s.graph_break_reasons.begin()->first;
}

TEST_F(BreaksSegments, EagerBackendSegmentsMatchToo) {
  auto f = pt::compile(two_breaks, {.name = "two_breaks_eager", .arg_names = {"x"}, .backend = "eager"});
  for (int64_t n : {3, 8}) {
    Tensor x = pt::randn({n, 2});
    expect_same(f(x), two_breaks(x));
  }
  EXPECT_EQ(f.segment_frame_ids().size(), 3u);
}

struct Gate : pt::Module {
  Tensor& w;
  Gate() : w(register_parameter("w", pt::randn({4, 4}))) {}
  Tensor forward(const Tensor& x) {
    Tensor h = pt::matmul(x, w);
    if (h.sum().item<float>() > 0) return pt::relu(h);
    return h * 0.5;
  }
};

TEST_F(BreaksSegments, ModuleForwardWithABreakReadsTheCurrentParameter) {
  auto m = std::make_shared<Gate>();
  auto f = pt::compile(m, {.name = "gate", .arg_names = {"x"}, .backend = "interp"});
  for (int i = 0; i < 6; ++i) {
    Tensor x = pt::randn({3, 4});
    expect_same(f(x), m->forward(x));
    if (i == 3) m->w = pt::randn({4, 4});  // replaced in place: segments read the current tensor
  }
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(pt::stats().graph_breaks, 1);
}

TEST_F(BreaksSegments, FourThreadsShareTheSegmentFrames) {
  auto f = pt::compile(two_breaks, {.name = "two_breaks_mt", .arg_names = {"x"}, .backend = "interp"});
  std::vector<Tensor> xs, want;
  for (int64_t n : {3, 5, 8, 13}) {
    xs.push_back(pt::randn({n, 4}));
    want.push_back(two_breaks(xs.back()));
  }
  f(xs[0]);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        size_t k = static_cast<size_t>((i + t) % 4);
        Tensor got = f(xs[k]);
        if (got.is_fake() || !pt::allclose(got, want[k], 1e-4, 1e-5)) bad++;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(f.segment_frame_ids().size(), 3u);
  EXPECT_EQ(pt::stats().graph_breaks, 2);
}

// A compiled function calling a compiled function that breaks: the callee is inlined into the
// caller's trace, so the break is the caller's, and the callee runs segmented when called on its own.
TEST_F(BreaksSegments, NestedCallOfABreakingFunctionRunsInline) {
  auto inner = pt::compile(inner_brk, {.name = "inner", .arg_names = {"x"}, .backend = "interp"});
  auto outer = pt::compile([&](const Tensor& x) { return inner(x * 2.0) + 1.0; }, {.name = "outer", .arg_names = {"x"}, .backend = "interp"});
  for (int64_t n : {3, 3, 5, 8, 8, 3}) {
    Tensor x = pt::randn({n});
    expect_same(outer(x), inner_brk(x * 2.0) + 1.0);
  }
  EXPECT_TRUE(outer.segmented());
  EXPECT_FALSE(inner.segmented()) << "inlined into outer's trace: inner's own frame compiles when called directly";
  for (int64_t n : {4, 4, 6}) {  // inner called directly: segmented on its own
    Tensor x = pt::randn({n, 2});
    expect_same(inner(x), inner_brk(x));
  }
  EXPECT_FALSE(inner.segment_frame_ids().empty());
  Tensor x = pt::randn({7});
  expect_same(outer(x), inner_brk(x * 2.0) + 1.0);
}

TEST_F(BreaksSegments, NestedCallAfterTheCalleeAlreadyBroke) {
  auto inner = pt::compile(inner_brk, {.name = "inner", .arg_names = {"x"}, .backend = "interp"});
  Tensor x0 = pt::randn({5});
  expect_same(inner(x0), inner_brk(x0));
  ASSERT_TRUE(inner.segmented());
  auto outer = pt::compile([&](const Tensor& x) { return pt::tanh(inner(x * 2.0)) + 1.0; }, {.name = "outer", .backend = "interp"});
  for (int64_t n : {2, 6, 6, 9}) {
    Tensor x = pt::randn({n});
    expect_same(outer(x), pt::tanh(inner_brk(x * 2.0)) + 1.0);
  }
  EXPECT_TRUE(outer.segmented());
  expect_same(inner(x0), inner_brk(x0));
}

// ---- fullgraph ---------------------------------------------------------------------------------------
TEST_F(BreaksFullgraph, ItemIsAnErrorNamingReasonOpAndLine) {
  auto f = pt::compile(one_break, {.name = "one_break", .arg_names = {"x", "w"}, .backend = "interp", .fullgraph = true});
  const std::string m = compile_error_of([&] { f(pt::randn({3, 8}), pt::randn({8, 4})); });
  EXPECT_NE(m.find("fullgraph=true: graph break in one_break in "), std::string::npos) << m;
  EXPECT_NE(m.find("(" + std::to_string(f.frame_id()) + "/0): Tensor::item() reads tensor data on the host (op item) at "
                   "breaks_scenarios.cpp:" + std::to_string(kLineItem1)),
            std::string::npos)
      << m;
  EXPECT_FALSE(f.segmented());
  EXPECT_EQ(pt::stats().graph_breaks, 1);
}

TEST_F(BreaksFullgraph, ExplicitBreakAndNonzeroName) {
  const int line = __LINE__ + 1;
  auto g = pt::compile([](const Tensor& x) { pt::graph_break("user says stop"); return x + 1.0; },
                       {.name = "explicit", .arg_names = {"x"}, .backend = "interp", .fullgraph = true});
  try {
    g(pt::randn({2}));
    FAIL();
  } catch (const pt::CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("user says stop (op graph_break) at breaks_scenarios.cpp:" + std::to_string(line)), std::string::npos)
        << m;
  }
  const int line2 = __LINE__ + 1;
  auto h = pt::compile([](const Tensor& x) { return pt::nonzero(x); }, {.name = "nz", .arg_names = {"x"}, .backend = "interp", .fullgraph = true});
  try {
    h(pt::randn({4}));
    FAIL();
  } catch (const pt::CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("data-dependent output shape"), std::string::npos) << m;
    EXPECT_NE(m.find("(op nonzero(f32[4])) at breaks_scenarios.cpp:" + std::to_string(line2)), std::string::npos) << m;
  }
}

TEST_F(BreaksFullgraph, NestedBreakInACalleeNamesItsLine) {
  auto inner = pt::compile(inner_brk, {.name = "inner", .arg_names = {"x"}, .backend = "interp"});
  auto outer = pt::compile([&](const Tensor& x) { return inner(x * 2.0) + 1.0; },
                           {.name = "outer", .arg_names = {"x"}, .backend = "interp", .fullgraph = true});
  for (int call = 0; call < 2; ++call) {  // the callee already segmented on the second call
    const std::string m = compile_error_of([&] { outer(pt::randn({3})); });
    EXPECT_NE(m.find("fullgraph=true: graph break in outer in "), std::string::npos) << m;
    EXPECT_NE(m.find("Tensor::item() reads tensor data on the host (op item) at breaks_scenarios.cpp:" +
                     std::to_string(kLineItemInner)),
              std::string::npos)
        << m;
  }
  EXPECT_FALSE(outer.segmented());
  Tensor x = pt::randn({4});
  expect_same(inner(x), inner_brk(x));  // on its own, the callee still runs segmented
}

// ---- logs and stats -----------------------------------------------------------------------------------
TEST_F(BreaksLogs, EachSiteLoggedOnce) {
  pt::observe::LogCapture cap("graph_breaks");
  auto f = pt::compile(two_breaks, {.name = "two_breaks", .arg_names = {"x"}, .backend = "interp"});
  for (int64_t n : {3, 4, 9}) f(pt::randn({n, 2}));
  std::string text = cap.str();
  size_t lines = 0;
  for (size_t p = text.find("Graph break in two_breaks"); p != std::string::npos; p = text.find("Graph break in two_breaks", p + 1))
    ++lines;
  EXPECT_EQ(lines, 2u) << text;
  EXPECT_NE(text.find("Tensor::item() reads tensor data on the host (op item) at breaks_scenarios.cpp:"), std::string::npos)
      << text;
  EXPECT_NE(text.find("protean::graph_break() (op graph_break) at breaks_scenarios.cpp:"), std::string::npos) << text;
  EXPECT_NE(pt::stats().to_json().find("\"graph_breaks\":2"), std::string::npos);
}

// ---- cond ---------------------------------------------------------------------------------------------
TEST_F(BreaksCond, BothBranchesAcrossCallsOneCompile) {
  auto fn = [](const Tensor& x, const Tensor& y) {
    return pt::cond(
        x.sum() > 0.0, [](const pt::TensorList& o) { return pt::tanh(o[0]) * o[1]; },
        [](const pt::TensorList& o) { return o[0] - o[1] * 2.0; }, {x, y});
  };
  auto f = pt::compile(fn, {.name = "cond", .arg_names = {"x", "y"}, .backend = "interp"});
  int pos = 0, neg = 0;
  for (int i = 0; i < 10; ++i) {
    Tensor x = pt::randn({5}), y = pt::randn({5});
    (x.sum().item<float>() > 0 ? pos : neg)++;
    expect_same(f(x, y), fn(x, y));
  }
  ASSERT_GT(pos, 0);
  ASSERT_GT(neg, 0);
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.graph_breaks, 0);
  EXPECT_EQ(s.cache_hits, 9);
}

TEST_F(BreaksCond, ACondAfterABreakIsOneNodeOfItsSegment) {
  // item() splits the function; the cond lands in segment 1 with its branches as subgraphs: a
  // predicate that flips makes neither a new segment frame nor a recompile, and sizes go dynamic.
  auto fn = [](const Tensor& x, const Tensor& y) {
    float s = x.sum().item<float>();
    Tensor z = x * static_cast<double>(s);
    return pt::cond(
        y.sum() > 0.0, [](const pt::TensorList& o) { return pt::tanh(o[0]) + o[1]; },
        [](const pt::TensorList& o) { return o[0] - o[1] * 2.0; }, {z, y});
  };
  auto f = pt::compile(fn, {.name = "seg_cond", .arg_names = {"x", "y"}, .backend = "interp"});
  int pos = 0, neg = 0;
  for (int64_t n : {4, 4, 4, 6, 6, 9, 9, 9, 12, 12}) {
    Tensor x = pt::randn({n}), y = pt::randn({n});
    (y.sum().item<float>() > 0 ? pos : neg)++;
    expect_same(f(x, y), fn(x, y));
  }
  ASSERT_GT(pos, 0);
  ASSERT_GT(neg, 0);
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(f.segment_frame_ids().size(), 2u);
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 1);
  EXPECT_EQ(s.compiles, 4);  // each segment: static, then one dynamic recompile
}

TEST_F(BreaksCond, AHostReadInsideABranchRunsTheCondTheEagerWayInSegments) {
  auto fn = [](const Tensor& x) {
    Tensor y = pt::sigmoid(x) - 0.5;
    return pt::cond(
        y.sum() > 0.0, [](const pt::TensorList& o) { return o[0] * static_cast<double>(o[0].amax().item<float>()); },
        [](const pt::TensorList& o) { return pt::neg(o[0]) + 1.0; }, {y});
  };
  auto f = pt::compile(fn, {.name = "host_branch", .arg_names = {"x"}, .backend = "interp"});
  int pos = 0, neg = 0;
  for (int i = 0; i < 8; ++i) {
    Tensor x = pt::randn({6});
    ((pt::sigmoid(x) - 0.5).sum().item<float>() > 0 ? pos : neg)++;
    expect_same(f(x), fn(x));
  }
  ASSERT_GT(pos, 0);
  ASSERT_GT(neg, 0);
  EXPECT_TRUE(f.segmented());
  auto s = pt::stats();
  bool named = false;
  for (const auto& [reason, n] : s.graph_break_reasons) named |= reason.find("inside a cond branch") != std::string::npos;
  EXPECT_TRUE(named) << s.to_json();
}

TEST_F(BreaksCond, WhereRewriteOfAnItemBranchNeverBreaks) {
  // if (x.sum().item<float>() > 0) return x * 2; else return -x;   →   where
  auto fn = [](const Tensor& x) { return pt::where(x.sum() > 0.0, x * 2.0, pt::neg(x)); };
  auto f = pt::compile(fn, {.name = "where", .arg_names = {"x"}, .backend = "interp"});
  for (int i = 0; i < 6; ++i) {
    Tensor x = pt::randn({4});
    expect_same(f(x), fn(x));
  }
  EXPECT_EQ(pt::stats().compiles, 1);
  EXPECT_EQ(pt::stats().graph_breaks, 0);
}

// ---- capture_scalar_outputs -------------------------------------------------------------------------
TEST_F(BreaksScalarOutputs, NonzeroFeedsALaterOpWithoutBreaking) {
  auto fn = [](const Tensor& x, const Tensor& y) {
    Tensor nz = pt::nonzero(x > 0.0);               // i64 [u0, 1]
    Tensor rows = nz.to(pt::DType::F32) * 2.0 + 1.0;  // [u0, 1], sizes from u0
    return std::make_pair(rows, rows.sum() + y.sum());
  };
  auto f = pt::compile(fn, {.name = "nz", .arg_names = {"x", "y"}, .backend = "interp", .capture_scalar_outputs = true});
  for (int i = 0; i < 5; ++i) {
    Tensor x = pt::randn({12}), y = pt::randn({3});
    auto [a, b] = f(x, y);
    auto [ea, eb] = fn(x, y);
    expect_same(a, ea);
    expect_same(b, eb);
  }
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 0);
  EXPECT_EQ(s.compiles, 1);
}

// ---- verify mode --------------------------------------------------------------------------------------
struct Scaler {
  int k = 2;  // read by the compiled lambda: neither an argument nor a registered attribute
};

TEST_F(BreaksVerify, CatchesACapturedIntMemberThatChanged) {
  Scaler sc;
  const int line = __LINE__ + 1;
  auto fn = [&sc](const Tensor& x) { return pt::relu(x) * static_cast<double>(sc.k); };
  auto f = pt::compile(fn, {.name = "scaled", .arg_names = {"x"}, .backend = "interp", .verify_every = 1});
  pt::observe::LogCapture cap("");
  Tensor x = pt::randn({4});
  expect_same(f(x), fn(x));
  expect_same(f(x), fn(x));
  EXPECT_EQ(cap.str().find("verify:"), std::string::npos) << cap.str();
  sc.k = 5;
  expect_same(f(x), fn(x));  // the mismatching call runs eagerly: the new k is used
  std::string text = cap.str();
  EXPECT_NE(text.find("verify: scaled in "), std::string::npos) << text;
  EXPECT_NE(text.find("first differing node"), std::string::npos) << text;
  EXPECT_NE(text.find("breaks_scenarios.cpp:" + std::to_string(line)), std::string::npos) << text;
  EXPECT_EQ(pt::stats().verify_failures, 1);
}

TEST_F(BreaksVerify, SeesAChangeInsideACondBranch) {
  // The clamp bound lives in the true branch's subgraph: only a comparison that includes the branches
  // sees it change.
  Scaler sc;
  auto fn = [&sc](const Tensor& x) {
    return pt::cond(
        x.sum() > -100.0, [&sc](const pt::TensorList& o) { return pt::clamp(o[0], std::nullopt, double(sc.k)); },
        [](const pt::TensorList& o) { return pt::neg(o[0]); }, {x});
  };
  auto f = pt::compile(fn, {.name = "branch_state", .arg_names = {"x"}, .backend = "interp", .verify_every = 1});
  pt::observe::LogCapture cap("");
  Tensor x = pt::randn({4}) * 10.0;
  expect_same(f(x), fn(x));
  expect_same(f(x), fn(x));
  EXPECT_EQ(cap.str().find("verify:"), std::string::npos) << cap.str();
  sc.k = 1;
  expect_same(f(x), fn(x));
  std::string text = cap.str();
  EXPECT_NE(text.find("verify: branch_state in "), std::string::npos) << text;
  EXPECT_NE(text.find("[true branch:"), std::string::npos) << text;
  EXPECT_NE(text.find("max=1."), std::string::npos) << text;
  EXPECT_EQ(pt::stats().verify_failures, 1);
}

TEST_F(BreaksVerify, SilentWhenNothingChanged) {
  Scaler sc;
  auto fn = [&sc](const Tensor& x, const Tensor& y) { return pt::matmul(x, y) * static_cast<double>(sc.k) + 1.0; };
  setenv("PROTEAN_VERIFY", "2", 1);
  auto f = pt::compile(fn, {.name = "steady", .arg_names = {"x", "y"}, .backend = "interp"});
  unsetenv("PROTEAN_VERIFY");
  pt::observe::LogCapture cap("");
  Tensor y = pt::randn({3, 2});
  for (int64_t n : {4, 5, 6, 7, 8, 9}) {
    Tensor x = pt::randn({n, 3});
    expect_same(f(x, y), fn(x, y));
  }
  EXPECT_EQ(cap.str().find("verify:"), std::string::npos) << cap.str();
  EXPECT_EQ(pt::stats().verify_failures, 0);
  EXPECT_EQ(pt::stats().compiles, 2);
}
