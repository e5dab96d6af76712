// Scenarios of programs written the way a new user writes them (issue: dynamic-shape gaps and API
// rough edges): chunk/split of a dynamic dim, a Module attribute bumped every call, size 1 under
// dynamic=On, SymFloat arithmetic, per-function stats, forward's parameter names, the recompile-limit
// advice and the default backend. Each asserts the exact compile count and message, and compares
// every compiled result with the eager one. Runs on interp, and on cpu under the `cpu.` prefix
// (PROTEAN_SCENARIO_BACKEND, scenario_util.h).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "breaks_test_util.h"
#include "observe/log.h"
#include "protean/protean.h"
#include "scenario_util.h"

namespace pt = protean;
using pt::SymFloat;
using pt::SymInt;
using pt::Tensor;
using pt::scenario::expect_same;
using pt::scenario::scenario_compile;

namespace {

class Api : public pt::scenario::BreaksTest {
 protected:
  void SetUp() override {
    BreaksTest::SetUp();
    unsetenv("PROTEAN_DYNAMIC_SOURCES");
  }
};
using ApiChunkSplit = Api;
using ApiAttributes = Api;
using ApiSizeOne = Api;
using ApiSymFloat = Api;
using ApiRoughEdges = Api;
using ApiLimitAdvice = Api;

std::string fid(int frame, int c) { return std::to_string(frame) + "/" + std::to_string(c); }

void expect_same_list(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) expect_same(got[i], want[i]);
}

}  // namespace

// ---- 1. chunk / split keep sizes symbolic ------------------------------------------------------------
TEST_F(ApiChunkSplit, ChunkOfGrowingLengthCompilesTwice) {
  auto fn = [](const Tensor& x) {
    auto p = pt::chunk(x, 4, 0);
    return p[0] + p[3] * 2.0;
  };
  auto f = scenario_compile(fn, {.name = "chunk4", .arg_names = {"x"}});
  for (int64_t i = 2; i <= 11; ++i) {
    Tensor x = pt::randn({4 * i});
    expect_same(f(x), fn(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.recompiles, 1);
  EXPECT_EQ(s.cache_hits, 8);
  EXPECT_EQ(s.eager_fallbacks, 0);
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first, fid(f.frame_id(), 0) + ": tensor 'x' size mismatch at index 0. expected 8, actual 12");
}

TEST_F(ApiChunkSplit, ChunkOfMarkedDimCompilesOnceWithoutError) {
  auto fn = [](const Tensor& x) {
    auto p = pt::chunk(x, 2, 0);
    return p[0] * 2.0 + p[1];
  };
  auto f = scenario_compile(fn, {.name = "chunk2", .arg_names = {"x"}});
  for (int k = 0; k < 8; ++k) {
    Tensor x = pt::randn({16});
    pt::mark_dynamic(x, 0);
    expect_same(f(x), fn(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.cache_hits, 7);
}

TEST_F(ApiChunkSplit, PieceCountGuardsTheSizesDoNot) {
  // chunk(x, 3) gives 3 pieces for every length >= 5, and 2 for a length of 4: the count guards.
  auto fn = [](const Tensor& x) {
    std::vector<Tensor> r;
    for (const Tensor& p : pt::chunk(x, 3, 0)) r.push_back(p * 2.0);
    return r;
  };
  auto f = scenario_compile(fn, {.name = "chunk3", .arg_names = {"x"}});
  for (int64_t n : {7, 10, 11, 13, 20, 31}) {
    Tensor x = pt::randn({n, 2});
    expect_same_list(f(x), fn(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  Tensor x4 = pt::randn({4, 2});
  expect_same_list(f(x4), fn(x4));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 3);
  EXPECT_EQ(s.recompile_reasons.count(fid(f.frame_id(), 1) +
                                      ": Eq(CeilDiv(s0, CeilDiv(s0, 3)), 3) (s0 = x.size()[0])"),
            1u)
      << ::testing::PrintToString(s.recompile_reasons);
}

TEST_F(ApiChunkSplit, SplitBySymbolicSizeCompilesTwice) {
  auto fn = [](const Tensor& x) {
    auto p = pt::split(x, (x.size(0) + 1) / 2, 0);  // two pieces, the last one smaller for an odd length
    return pt::cat({p[1] * 3.0, p[0]}, 0);
  };
  auto f = scenario_compile(fn, {.name = "halves", .arg_names = {"x"}});
  for (int64_t n : {6, 7, 9, 12, 15}) {
    Tensor x = pt::randn({n});
    expect_same(f(x), fn(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
}

// The audited ops (docs/capture.md "Int conversions of SymInts"): sizes computed from a dynamic dim
// flow through reshape(-1), narrow, pad, expand, arange, full, upsample and layer_norm without
// specializing it.
TEST_F(ApiChunkSplit, AuditedOpsKeepADynamicDimSymbolic) {
  auto fn = [](const Tensor& x) {
    SymInt n = x.size(0);
    Tensor a = x.reshape({-1, 2}).sum({1});                        // [2n]
    Tensor b = pt::narrow(x.reshape({-1}), 0, 1, 2 * n - 2);         // [4n - 2] → [2n - 2]
    Tensor c = pt::pad(b, {1, 1});                                   // [2n]
    Tensor d = pt::arange(0, 2 * n, 1, pt::DType::F32) + pt::full({2 * n}, 0.5);
    Tensor e = a.unsqueeze(0).expand({3, 2 * n}).sum({0});
    Tensor g = pt::upsample_nearest2d(x.reshape({1, 1, n, 4}), {2 * n, 8}).reshape({-1}).narrow(0, 0, 2 * n);
    Tensor h = pt::layer_norm(x, {x.size(-1)});
    return a + c + d + e + g + h.reshape({-1}).narrow(0, 0, 2 * n);
  };
  auto f = scenario_compile(fn, {.name = "audited", .arg_names = {"x"}});
  for (int64_t n : {3, 4, 5, 8, 11}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), fn(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.cache_hits, 3);
}

// ---- 2. registered int attributes follow automatic dynamic --------------------------------------------
namespace {
struct Stepper : pt::Module {
  Stepper() { register_attribute("step", 0); }
  Tensor forward(const Tensor& x) {
    SymInt step = attribute("step");
    return x + pt::arange(step, step + 4, 1, pt::DType::F32);
  }
};
}  // namespace

TEST_F(ApiAttributes, AttributeBumpedEveryCallCompilesTwice) {
  auto m = std::make_shared<Stepper>();
  auto f = scenario_compile(m, {.name = "stepper"});
  Tensor x = pt::randn({4});
  for (int64_t k = 0; k < 10; ++k) {
    m->set_attribute("step", k);
    expect_same(f(x), m->forward(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.recompiles, 1);
  EXPECT_EQ(s.eager_fallbacks, 0);
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first, fid(f.frame_id(), 0) + ": int 'self.step' mismatch. expected 0, actual 1");
}

TEST_F(ApiAttributes, MarkedStaticAttributeRecompilesAndTheWarningNamesIt) {
  pt::observe::LogCapture logs("");
  auto m = std::make_shared<Stepper>();
  m->mark_static("step");
  auto f = scenario_compile(m, {.name = "stepper", .recompile_limit = 3});
  Tensor x = pt::randn({4});
  for (int64_t k = 0; k < 5; ++k) {
    m->set_attribute("step", k);
    expect_same(f(x), m->forward(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 3);
  EXPECT_EQ(s.eager_fallbacks, 2);
  const std::string text = logs.str();
  EXPECT_NE(text.find("stepper hit config.recompile_limit (3)"), std::string::npos) << text;
  EXPECT_NE(text.find("the Module attribute 'self.step' keeps changing: it is marked static "
                      "(Module::mark_static(\"step\")): remove the mark to let it vary as a SymInt"),
            std::string::npos)
      << text;
}

TEST_F(ApiAttributes, OptionKeepsAttributesStatic) {
  pt::observe::LogCapture logs("");
  auto m = std::make_shared<Stepper>();
  auto f = scenario_compile(m, {.name = "stepper", .recompile_limit = 2, .dynamic_attributes = false});
  Tensor x = pt::randn({4});
  for (int64_t k = 0; k < 4; ++k) {
    m->set_attribute("step", k);
    expect_same(f(x), m->forward(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_NE(logs.str().find("the Module attribute 'self.step' keeps changing: CompileOptions::dynamic_attributes is "
                            "false: set it to true to let the attribute vary as a SymInt"),
            std::string::npos)
      << logs.str();
}

// ---- 3. dynamic=On keeps size 1 symbolic unless a broadcast needs it ----------------------------------
TEST_F(ApiSizeOne, BatchOneThenTwoCompilesOnce) {
  auto fn = [](const Tensor& x, const Tensor& w) { return pt::relu(pt::matmul(x, w)); };
  auto f = scenario_compile(fn, {.name = "on", .arg_names = {"x", "w"}, .dynamic = pt::Dynamic::On});
  Tensor w = pt::randn({8, 4});
  for (int64_t b : {1, 2, 5, 1}) {
    Tensor x = pt::randn({b, 8});
    expect_same(f(x, w), fn(x, w));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.cache_hits, 3);
}

TEST_F(ApiSizeOne, TwoInputsOfBatchOneShareTheBatch) {
  // x [B, 4] * y [B, 1]: the batch dims are compared by equality, y's trailing 1 is the broadcast.
  auto fn = [](const Tensor& x, const Tensor& y) { return x * y + 1.0; };
  auto f = scenario_compile(fn, {.name = "scale_rows", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On});
  for (int64_t b : {1, 2, 3}) {
    Tensor x = pt::randn({b, 4}), y = pt::randn({b, 1});
    expect_same(f(x, y), fn(x, y));
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ApiSizeOne, ABroadcastThatNeedsTheOneSpecializesIt) {
  // bias [1, 4] against x [B, 4]: traced with B = 1 the two are equal; B = 2 needs the bias dim to be
  // the broadcast one, which the second graph specializes.
  auto fn = [](const Tensor& x, const Tensor& bias) { return x + bias; };
  auto f = scenario_compile(fn, {.name = "add_bias", .arg_names = {"x", "bias"}, .dynamic = pt::Dynamic::On});
  Tensor bias = pt::randn({1, 4});
  for (int64_t b : {1, 2, 3, 1}) {
    Tensor x = pt::randn({b, 4});
    expect_same(f(x, bias), fn(x, bias));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first,
            fid(f.frame_id(), 0) + ": Eq(s2, s0) (s2 = bias.size()[0], s0 = x.size()[0])");
}

TEST_F(ApiSizeOne, OptionOffSpecializesOneAsPyTorchDoes) {
  auto fn = [](const Tensor& x, const Tensor& w) { return pt::relu(pt::matmul(x, w)); };
  auto f = scenario_compile(fn, {.name = "on_off", .arg_names = {"x", "w"}, .dynamic = pt::Dynamic::On,
                                 .keep_size_one_symbolic = false});
  Tensor w = pt::randn({8, 4});
  for (int64_t b : {1, 2}) {
    Tensor x = pt::randn({b, 8});
    expect_same(f(x, w), fn(x, w));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
}

// ---- 4. SymFloat is a number --------------------------------------------------------------------------
TEST_F(ApiSymFloat, TensorTimesSymFloatCompilesTwice) {
  auto fn = [](const Tensor& x, SymFloat y) { return x * y; };
  auto f = scenario_compile(fn, {.name = "scale", .arg_names = {"x", "y"}});
  Tensor x = pt::randn({4});
  for (double y : {0.5, 1.5, 2.5, 3.5, 4.5}) expect_same(f(x, y), fn(x, y));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first, fid(f.frame_id(), 0) + ": float 'y' mismatch. expected 0.5, actual 1.5");
}

TEST_F(ApiSymFloat, ArithmeticWithDoublesIntsAndSymIntsStaysSymbolic) {
  auto fn = [](const Tensor& x, SymFloat y) {
    SymFloat a = y * 2.0 + 1;            // with a double and an int
    SymFloat b = (a - y) / 4.0 - -y;     // SymFloat with SymFloat, unary minus
    SymFloat c = x.size(0) * 0.5 + b;    // SymInt · double → SymFloat
    return 1.0 - x * a + b / x.abs().add(pt::full({}, 1.0)) + c * x;
  };
  auto f = scenario_compile(fn, {.name = "float_math", .arg_names = {"x", "y"}});
  for (double y : {0.25, 0.75, -2.0, 8.0})
    for (int64_t n : {3, 6}) {
      Tensor x = pt::randn({n});
      expect_same(f(x, y), fn(x, y));
    }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 3);  // 0/0 static; 0/1 with n dynamic; 0/2 with y dynamic too
  EXPECT_EQ(s.eager_fallbacks, 0);
}

TEST_F(ApiSymFloat, DynamicOnIsSymbolicFromTheStart) {
  auto fn = [](const Tensor& x, SymFloat y) { return (y - x) / (y * y + 1.0); };
  auto f = scenario_compile(fn, {.name = "on_float", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({5});
  for (double y : {0.1, 0.2, 0.3}) expect_same(f(x, y), fn(x, y));
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ApiSymFloat, AComparisonSpecializesTheValue) {
  auto fn = [](const Tensor& x, SymFloat y) { return y > 1.0 ? x * y : x - y; };
  auto f = scenario_compile(fn, {.name = "branch", .arg_names = {"x", "y"}});
  Tensor x = pt::randn({4});
  for (double y : {0.5, 2.0, 3.0, 2.0, 0.5}) expect_same(f(x, y), fn(x, y));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 3);  // the comparison guards the value: 0.5, 2.0 and 3.0 each compile
  EXPECT_EQ(s.cache_hits, 2);
}

TEST_F(ApiSymFloat, ASymFloatKeptFromAnEndedCaptureIsAnErrorInTheNext) {
  // A function that keeps a symbolic SymFloat past its capture (in a static) and uses it when another
  // function is traced: the kept value belongs to a graph that no longer exists, so the second trace
  // must refuse it by name, never record the old graph's value (capture ids are never reused).
  static SymFloat kept;
  auto keep = [](const Tensor& x, SymFloat y) {
    kept = y * 2.0;
    return x * y;
  };
  auto use = [](const Tensor& x, SymFloat) { return x * kept; };
  auto f = scenario_compile(keep, {.name = "keep", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({3});
  expect_same(f(x, 1.5), x * 1.5);
  ASSERT_TRUE(kept.is_symbolic());
  auto g = scenario_compile(use, {.name = "use", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On});
  try {
    (void)g(x, 0.5);
    ADD_FAILURE() << "a SymFloat of an ended capture was accepted";
  } catch (const pt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("belongs to a capture that is not running"), std::string::npos) << e.what();
  }
  kept = SymFloat();
}

// ---- 8. smaller rough edges ----------------------------------------------------------------------------
namespace {
struct Scaler : pt::Module {
  Tensor forward(const Tensor& input, const Tensor& gain) { return input * 2.0 + gain; }
};
struct Holder {
  pt::CompiledFunction<Tensor(const Tensor&)> f;  // declared first, assigned later
};
}  // namespace

TEST_F(ApiRoughEdges, ModuleReasonsNameForwardsParameters) {
  auto m = std::make_shared<Scaler>();
  auto f = scenario_compile(m, {.name = "scaler"});
  Tensor g = pt::randn({1});
  Tensor x4 = pt::randn({4});
  expect_same(f(x4, g), m->forward(x4, g));
  Tensor x5 = pt::randn({5});
  expect_same(f(x5, g), m->forward(x5, g));
  auto s = pt::stats();
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first,
            fid(f.frame_id(), 0) + ": tensor 'input' size mismatch at index 0. expected 4, actual 5");
  EXPECT_EQ(f.options().arg_names, (std::vector<std::string>{"input", "gain"}));
}

TEST_F(ApiRoughEdges, StatsPerCompiledFunction) {
  auto f = scenario_compile([](const Tensor& x) { return x + 1.0; }, {.name = "f", .arg_names = {"x"}});
  auto g = scenario_compile([](const Tensor& x) { return x * 3.0; }, {.name = "g", .arg_names = {"x"}});
  for (int64_t n : {2, 3, 4}) f(pt::randn({n}));
  g(pt::randn({2}));
  g(pt::randn({2}));
  pt::Stats fs = f.stats(), gs = g.stats();
  EXPECT_EQ(fs.frames, 1);
  EXPECT_EQ(fs.compiles, 2);
  EXPECT_EQ(fs.recompiles, 1);
  EXPECT_EQ(fs.cache_hits, 1);
  EXPECT_EQ(fs.cache_misses, 2);
  ASSERT_EQ(fs.recompile_reasons.size(), 1u);
  EXPECT_EQ(fs.recompile_reasons.begin()->first, fid(f.frame_id(), 0) + ": tensor 'x' size mismatch at index 0. expected 2, actual 3");
  EXPECT_EQ(gs.compiles, 1);
  EXPECT_EQ(gs.recompiles, 0);
  EXPECT_EQ(gs.cache_hits, 1);
  EXPECT_EQ(pt::stats().compiles, 3);
  pt::reset();
  EXPECT_EQ(f.stats().compiles, 0);
  EXPECT_TRUE(f.stats().recompile_reasons.empty());
}

TEST_F(ApiRoughEdges, DefaultConstructedCompiledFunction) {
  Holder h;
  EXPECT_FALSE(static_cast<bool>(h.f));
  try {
    h.f(pt::randn({2}));
    ADD_FAILURE() << "calling an empty CompiledFunction must throw";
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("CompiledFunction::call: this CompiledFunction is empty"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)h.f.stats(), pt::RuntimeError);
  h.f = scenario_compile([](const Tensor& x) { return x - 1.0; }, {.name = "later", .arg_names = {"x"}});
  EXPECT_TRUE(static_cast<bool>(h.f));
  Tensor x = pt::randn({3});
  expect_same(h.f(x), x - 1.0);
}

TEST_F(ApiRoughEdges, LayerNormTakesSymInts) {
  auto fn = [](const Tensor& x) { return pt::layer_norm(x, {x.size(-1)}); };
  auto f = scenario_compile(fn, {.name = "ln", .arg_names = {"x"}});
  for (int64_t d : {8, 16, 24, 40}) {
    Tensor x = pt::randn({3, d});
    expect_same(f(x), fn(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
}

// ---- the recompile-limit warning names the source and how to make it dynamic ---------------------------
TEST_F(ApiLimitAdvice, StaticSizeNamesMarkDynamic) {
  pt::observe::LogCapture logs("");
  auto f = scenario_compile([](const Tensor& x) { return x * 2.0; },
                            {.name = "off", .arg_names = {"x"}, .dynamic = pt::Dynamic::Off, .recompile_limit = 2});
  for (int64_t n : {2, 3, 4}) f(pt::randn({n}));
  const std::string text = logs.str();
  EXPECT_NE(text.find("'x.size()[0]' keeps changing but stays static (the function is compiled with dynamic=Off, "
                      "which keeps every size and int static: compile with dynamic=Auto to let it vary)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("`pt::mark_dynamic(x, 0);`"), std::string::npos) << text;
}

TEST_F(ApiLimitAdvice, PlainDoubleNamesSymFloat) {
  pt::observe::LogCapture logs("");
  auto fn = [](const Tensor& x, double a) { return x * a; };
  auto f = scenario_compile(fn, {.name = "by_double", .arg_names = {"x", "a"}, .recompile_limit = 2});
  Tensor x = pt::randn({3});
  for (double a : {1.0, 2.0, 3.0}) expect_same(f(x, a), fn(x, a));
  EXPECT_NE(logs.str().find("'a' is a plain double argument and keeps changing: declare it protean::SymFloat to let it "
                            "vary without recompiling"),
            std::string::npos)
      << logs.str();
}

// ---- 5. the default backend compiles ------------------------------------------------------------------
TEST_F(Api, DefaultBackendIsAutoCompilingInTheBackground) {
  EXPECT_EQ(pt::CompileOptions{}.backend, "auto");
  auto f = pt::compile([](const Tensor& x) { return pt::relu(x * 2.0 - 1.0); }, {.name = "auto_default", .arg_names = {"x"}});
  EXPECT_EQ(f.options().backend, "cpu");
  EXPECT_TRUE(f.options().async_compile);
  Tensor x = pt::randn({6});
  expect_same(f(x), pt::relu(x * 2.0 - 1.0));
  EXPECT_EQ(pt::stats().compiles, 1);
}

// ---- 6. sources name one input each; what the trace cannot see is guarded --------------------------
TEST_F(ApiRoughEdges, ArgumentNamesMustNameOneInputEach) {
  auto fn = [](const Tensor& a, const Tensor& b) { return a + b * 2.0; };
  for (std::vector<std::string> names : {std::vector<std::string>{"x", "x"}, std::vector<std::string>{"args[1]"},
                                         std::vector<std::string>{"x", "self.w"}}) {
    try {
      (void)pt::compile(fn, {.name = "dup", .arg_names = names, .backend = "interp"});
      ADD_FAILURE() << "accepted arg_names {" << names[0] << ", ...}";
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("CompileOptions::arg_names of 'dup'"), std::string::npos) << e.what();
    }
  }
  // a name args[k] at position k is the default name: fine
  auto f = scenario_compile(fn, {.name = "own", .arg_names = {"args[0]", "b"}});
  Tensor a = pt::ones({3}), b = pt::full({3}, 5.0);
  expect_same(f(a, b), fn(a, b));
}

struct TiedPair : pt::Module {
  Tensor *w1, *w2;
  TiedPair() {
    Tensor w = pt::ones({3});
    w1 = &register_parameter("w1", w);
    w2 = &register_parameter("w2", w);
  }
  Tensor forward(const Tensor& x) { return x * *w1 + *w2 * 2.0; }
};

// A weight registered under two names reads as one graph input; once a name gets a tensor of its own
// the entry misses (it gave x * w2 + w2 * 2 with the old tie).
TEST_F(ApiRoughEdges, UntyingATiedWeightRecompiles) {
  auto m = std::make_shared<TiedPair>();
  pt::observe::LogCapture logs("recompiles");
  auto f = pt::compile(m, {.name = "tied", .backend = "interp"});
  Tensor x = pt::ones({3});
  expect_same(f(x), m->forward(x));
  *m->w2 = pt::full({3}, 10.0);
  expect_same(f(x), m->forward(x));
  expect_same(f(x), m->forward(x));
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_NE(logs.str().find("module members 'self.w2' and 'self.w1' are no longer one tensor"), std::string::npos) << logs.str();
}

// An argument no op reads is still guarded: its static sizes may have been read in C++.
TEST_F(ApiRoughEdges, AnArgumentReadOnlyForItsSizesIsGuarded) {
  auto fn = [](const Tensor& x, const Tensor& like) { return x.expand(like.sizes()) * 2.0; };
  auto f = scenario_compile(fn, {.name = "expand_like"});
  Tensor x = pt::randn({1, 4});
  for (int64_t n : {2, 5, 7}) {
    Tensor like = pt::randn({n, 4});
    expect_same(f(x, like), fn(x, like));
  }
}

// A SymInt argument is an int, not a size: negative values work once it is dynamic, and from the start
// under dynamic=On.
TEST_F(ApiRoughEdges, NegativeSymIntArguments) {
  auto fn = [](const Tensor& x, SymInt k) { return x + pt::arange(k, k + 3, 1, pt::DType::F32); };
  auto f = scenario_compile(fn, {.name = "neg_auto"});
  auto g = scenario_compile(fn, {.name = "neg_on", .dynamic = pt::Dynamic::On});
  Tensor x = pt::zeros({3});
  for (int64_t k : {5, 7, -4, 9, -1}) {
    expect_same(f(x, k), fn(x, k));
    expect_same(g(x, -k), fn(x, -k));
  }
}

// narrow's range errors under dynamic shapes name the symbols with their values in the failing call
// ("start s1 (= 9 in this call) + length ..."): the symbol alone did not say which input was wrong.
TEST_F(ApiRoughEdges, NarrowErrorsGiveTheSymbolsValues) {
  auto fn = [](const Tensor& x, SymInt n) { return pt::narrow(x, 0, n, 2); };
  auto f = scenario_compile(fn, {.name = "narrow_err", .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({8});
  expect_same(f(x, 3), fn(x, 3));
  std::string e;
  try {
    f(pt::randn({8}), 7);
  } catch (const pt::ValueError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("(= 7 in this call) + length 2 exceeds dim 0 of size"), std::string::npos) << e;
  EXPECT_NE(e.find("(= 8 in this call)"), std::string::npos) << e;
}

// A segment whose ops change with a host value read after a graph break compiles at most
// recompile_limit variants; then new variants run eagerly (it compiled on every call).
TEST_F(ApiRoughEdges, SegmentVariantsStopAtTheRecompileLimit) {
  pt::observe::LogCapture logs("");
  auto fn = [](const Tensor& x) {
    const float s = x.amax().item<float>();
    return pt::clamp(x * 2.0, std::nullopt, s);
  };
  auto f = scenario_compile(fn, {.name = "seg_flood", .recompile_limit = 3});
  for (int i = 0; i < 12; ++i) {
    Tensor x = pt::randn({8});
    expect_same(f(x), fn(x));
  }
  EXPECT_LE(f.segment_frame_ids().size(), 4u);
  EXPECT_NE(logs.str().find("has hit config.recompile_limit (3) variants"), std::string::npos) << logs.str();
}

TEST_F(ApiRoughEdges, UnknownModeIsAValueError) {
  auto fn = [](const Tensor& a) { return a * 2.0; };
  try {
    (void)pt::compile(fn, {.name = "moded", .backend = "interp", .mode = "nonsense"});
    ADD_FAILURE() << "mode 'nonsense' accepted";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("CompileOptions::mode of 'moded' is 'nonsense'"), std::string::npos) << e.what();
  }
  for (const char* m : {"default", "reduce-overhead", "max-autotune"})
    EXPECT_NO_THROW((void)pt::compile(fn, {.name = "moded", .backend = "interp", .mode = m})) << m;
}
