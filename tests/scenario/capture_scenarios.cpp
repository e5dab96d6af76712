// Scenario tests: compile behaviour per rule of PyTorch's dynamic-shape semantics (docs/capture.md) (compile counts,
// recompile reasons, error messages, which guards exist). Every compiled result is compared with the
// eager result of the same function.
//
// Backend: scenarios that do not name one run on $PROTEAN_SCENARIO_BACKEND when it is set (ctest runs
// the whole suite a second time with `cpu`: ScenarioCpu.*), else on interp (not the default "auto").
#include <gtest/gtest.h>

#include <cstdlib>
#include <source_location>
#include <string>
#include <mutex>
#include <thread>

#include "observe/log.h"
#include "scenario_util.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::SymFloat;
using pt::Tensor;

namespace {

void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_EQ(pt::hints(got.sizes()), pt::hints(want.sizes()));
  EXPECT_TRUE(pt::allclose(got.to(pt::DType::F64), want.to(pt::DType::F64), 1e-5, 1e-6));
}

class Scenario : public ::testing::Test {
 protected:
  void SetUp() override {
    pt::reset();
    pt::set_stance(pt::Stance::Default);
    unsetenv("PROTEAN_DYNAMIC_SOURCES");
    pt::manual_seed(0);
  }
  void TearDown() override {
    pt::set_stance(pt::Stance::Default);
    unsetenv("PROTEAN_DYNAMIC_SOURCES");
  }
};
using ScenarioAutomaticDynamic = Scenario;
using ScenarioZeroOne = Scenario;
using ScenarioDuckSizing = Scenario;
using ScenarioMarks = Scenario;
using ScenarioAllowlist = Scenario;
using ScenarioParameters = Scenario;
using ScenarioLimits = Scenario;
using ScenarioStances = Scenario;
using ScenarioGuardText = Scenario;
using ScenarioLogs = Scenario;
using ScenarioGraphBreaks = Scenario;
using ScenarioThreads = Scenario;
using ScenarioBackends = Scenario;

Tensor affine(const Tensor& x) { return pt::relu(x * 2.0 + 1.0); }

std::string fid(int frame, int c) { return std::to_string(frame) + "/" + std::to_string(c); }

using pt::scenario::scenario_compile;

}  // namespace

// ---- automatic dynamic --------------------------------------------------------------------------
TEST_F(ScenarioAutomaticDynamic, SizesTwoToSixCompileTwice) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  for (int64_t n : {2, 3, 4, 5, 6}) {
    Tensor x = pt::randn({n, 3});
    expect_same(f(x), affine(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.recompiles, 1);
  EXPECT_EQ(s.cache_hits, 3);
  ASSERT_EQ(s.recompile_reasons.size(), 1u);
  EXPECT_EQ(s.recompile_reasons.begin()->first,
            fid(f.frame_id(), 0) + ": tensor 'x' size mismatch at index 0. expected 2, actual 3");
}

TEST_F(ScenarioAutomaticDynamic, OneTwoThreeCompilesTwice) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  for (int64_t n : {1, 2, 3}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
}

// An argument no op reads is guarded all the same (the function may have read its sizes in C++, which
// the trace cannot see): its size changing recompiles once, with the size dynamic, as for a used one.
TEST_F(ScenarioAutomaticDynamic, UnusedInputChangingSizeRecompilesOnce) {
  auto f = scenario_compile([](const Tensor& x, const Tensor& unused) { return x + 1.0; },
                       {.name = "unused", .arg_names = {"x", "y"}});
  Tensor x = pt::randn({4, 4});
  for (int64_t n : {2, 5, 9}) expect_same(f(x, pt::randn({n})), x + 1.0);
  EXPECT_EQ(pt::stats().compiles, 2);
}

TEST_F(ScenarioAutomaticDynamic, SymIntArgGrowingCompilesTwice) {
  auto fn = [](const Tensor& x, pt::SymInt n) { return pt::full({n}, 1.0) + x.sum(); };
  auto f = scenario_compile(fn, {.name = "grow", .arg_names = {"x", "n"}});
  Tensor x = pt::randn({3});
  for (int64_t n = 4; n < 10; ++n) expect_same(f(x, n), fn(x, n));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.recompile_reasons.begin()->first, fid(f.frame_id(), 0) + ": int 'n' mismatch. expected 4, actual 5");
}

TEST_F(ScenarioAutomaticDynamic, SymFloatArgUnderDynamicOnCompilesOnce) {
  auto fn = [](const Tensor& x, SymFloat a) { return x * a; };
  auto f = scenario_compile(fn, {.name = "scale", .arg_names = {"x", "a"}, .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({5, 2});
  for (double a : {0.5, 1.5, -2.25}) expect_same(f(x, a), fn(x, a));
  EXPECT_EQ(pt::stats().compiles, 1);
}

// A plain double stays a guarded constant even under dynamic=On: what the function computes from it
// happens outside the trace. Each of these gave a wrong result when a double was a dynamic input found
// by its value: a literal equal to it (2.0 below, traced with a = 2.0), arithmetic on it, the dtype
// promotion it chose (i64 * 2.0 is i64, i64 * 2.5 is f32), a comparison.
TEST_F(ScenarioAutomaticDynamic, PlainDoubleUnderDynamicOnIsGuardedByValue) {
  auto literal = [](const Tensor& x, double a) { return x * a + x * 2.0; };
  auto derived = [](const Tensor& x, double a) { return x * (a * 2.0); };
  auto promote = [](const Tensor& x, double a) { return x * a; };
  auto branch = [](const Tensor& x, double a) { return a > 0 ? x : -x; };
  auto f1 = scenario_compile(literal, {.name = "literal", .dynamic = pt::Dynamic::On});
  auto f2 = scenario_compile(derived, {.name = "derived", .dynamic = pt::Dynamic::On});
  auto f3 = scenario_compile(promote, {.name = "promote", .dynamic = pt::Dynamic::On});
  auto f4 = scenario_compile(branch, {.name = "branch", .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({3}), xi = pt::arange(4);
  for (double a : {1.0, 2.0, 3.0, -1.5, 2.5}) {
    expect_same(f1(x, a), literal(x, a));
    expect_same(f2(x, a), derived(x, a));
    expect_same(f3(xi, a), promote(xi, a));
    expect_same(f4(x, a), branch(x, a));
  }
  EXPECT_EQ(pt::stats().compiles, 4 * 5);
}

// A SymFloat's value() is a double too: it specializes (the entry guards the value); a literal with
// the same bits as a dynamic SymFloat stays a literal (it made `x * 2.0` follow the argument).
TEST_F(ScenarioAutomaticDynamic, SymFloatLiteralAndValueStayCorrect) {
  auto literal = [](const Tensor& x, SymFloat a) { return x * a + x * 2.0; };
  auto via_value = [](const Tensor& x, SymFloat a) { return x * (a.value() * 2.0); };
  auto f1 = scenario_compile(literal, {.name = "literal"});
  auto f2 = scenario_compile(via_value, {.name = "via_value", .dynamic = pt::Dynamic::On});
  Tensor x = pt::ones({3});
  for (double a : {1.0, 2.0, 3.0, 2.0, -0.5}) {
    expect_same(f1(x, a), literal(x, a));
    expect_same(f2(x, a), via_value(x, a));
  }
  auto s = pt::stats();
  // literal: static at 1.0; dynamic, traced at 2.0, where the literal 2.0 has the traced value's bits
  // (an attribute a hint() could have produced), so that entry guards the value; dynamic again at 3.0,
  // which serves 2.0 (that entry), 3.0 and -0.5. via_value: one compile per distinct value.
  EXPECT_EQ(s.compiles, 3 + 4);
}

TEST_F(ScenarioAutomaticDynamic, PlainDoubleIsGuardedConstant) {
  auto fn = [](const Tensor& x, double a) { return x * a; };
  auto f = scenario_compile(fn, {.name = "scale", .arg_names = {"x", "a"}});
  Tensor x = pt::randn({5, 2});
  expect_same(f(x, 0.5), fn(x, 0.5));
  expect_same(f(x, 1.5), fn(x, 1.5));
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_EQ(pt::stats().recompile_reasons.begin()->first,
            fid(f.frame_id(), 0) + ": float 'a' mismatch. expected 0.5, actual 1.5");
}

TEST_F(ScenarioAutomaticDynamic, UserBranchOnParityAtMostThreeCompiles) {
  auto fn = [](const Tensor& x) {
    if (x.size(0) % 2 == 0) return x * 2.0;
    return x - 1.0;
  };
  pt::observe::LogCapture logs("+dynamic,recompiles");
  auto f = scenario_compile(fn, {.name = "parity", .arg_names = {"x"}});
  for (int64_t n : {4, 6, 7, 8, 9, 10}) {
    Tensor x = pt::randn({n});
    expect_same(f(x), fn(x));
  }
  EXPECT_LE(pt::stats().compiles, 3);
  std::string text = logs.str();
  EXPECT_NE(text.find("Eq(Mod(s0, 2), 0) [guard added]"), std::string::npos) << text;
  EXPECT_NE(text.find("capture_scenarios.cpp:"), std::string::npos) << text;
}

// ---- 0/1 specialization, duck sizing ---------------------------------------------------------------
TEST_F(ScenarioZeroOne, SizeOneStaysSymbolicUnderDynamicOn) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}, .dynamic = pt::Dynamic::On});
  for (int64_t n : {1, 2, 3}) {
    Tensor x = pt::randn({n, 2});
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 1);  // s0 in [1, int_oo]: no op depends on it being 1
}

TEST_F(ScenarioZeroOne, SizeOneSpecializesUnderDynamicOnWhenAsked) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}, .dynamic = pt::Dynamic::On,
                                     .keep_size_one_symbolic = false});
  for (int64_t n : {1, 2, 3}) {
    Tensor x = pt::randn({n, 2});
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);  // 1 static, then s0 in [2, int_oo]
}

TEST_F(ScenarioDuckSizing, EqualSizesShareASymbolUnderDynamicOn) {
  pt::observe::LogCapture logs("dynamic,guards");
  auto fn = [](const Tensor& x, const Tensor& y) { return x * 2.0 + y.sum(); };
  auto f = scenario_compile(fn, {.name = "duck", .arg_names = {"x", "y"}, .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({6}), y = pt::randn({6});
  expect_same(f(x, y), fn(x, y));
  std::string text = logs.str();
  EXPECT_NE(text.find("create_symbol s0 = 6 for x.size()[0]"), std::string::npos) << text;
  EXPECT_EQ(text.find("create_symbol s1"), std::string::npos) << text;
  // A different size for y alone breaks the duck guard and recompiles.
  Tensor y2 = pt::randn({7});
  expect_same(f(x, y2), fn(x, y2));
  EXPECT_EQ(pt::stats().compiles, 2);
}

// ---- marks ------------------------------------------------------------------------------------------
TEST_F(ScenarioMarks, DynamicOnThenMarkedDynamicCompilesOnce) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}, .dynamic = pt::Dynamic::On});
  Tensor x = pt::randn({10, 10});
  expect_same(f(x), affine(x));
  pt::mark_dynamic(x, 0);
  pt::mark_dynamic(x, 1);
  expect_same(f(x), affine(x));
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ScenarioMarks, MarkDynamicMakesFirstCompileDynamic) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  Tensor x = pt::randn({8, 3});
  pt::mark_dynamic(x, 0);
  expect_same(f(x), affine(x));
  for (int64_t n : {5, 12}) {
    Tensor y = pt::randn({n, 3});
    expect_same(f(y), affine(y));
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ScenarioMarks, StrictMarkUnifiedWithStaticInputIsAnError) {
  auto f = scenario_compile([](const Tensor& x, const Tensor& y) { return x + y; }, {.name = "add", .arg_names = {"x", "y"}});
  Tensor x = pt::randn({8, 4}), y = pt::randn({8, 4});
  pt::mark_dynamic(x, 0);
  try {
    f(x, y);
    FAIL() << "expected CompileError";
  } catch (const pt::CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("x.size()[0]"), std::string::npos) << m;
    EXPECT_NE(m.find("Eq(s0, 8)"), std::string::npos) << m;
    EXPECT_NE(m.find("unified with static y.size()[0] by add at capture_scenarios.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("maybe_mark_dynamic"), std::string::npos) << m;
  }
}

TEST_F(ScenarioMarks, MaybeMarkDynamicAllowsSpecialization) {
  auto fn = [](const Tensor& x, const Tensor& y) { return x + y; };
  auto f = scenario_compile(fn, {.name = "add", .arg_names = {"x", "y"}});
  Tensor x = pt::randn({8, 4}), y = pt::randn({8, 4});
  pt::maybe_mark_dynamic(x, 0);
  expect_same(f(x, y), fn(x, y));
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ScenarioMarks, MarkStaticBlocksAutomaticDynamic) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  for (int64_t n : {2, 3, 4}) {
    Tensor x = pt::randn({n});
    pt::mark_static(x, 0);
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 3);
}

// ---- allowlist ----------------------------------------------------------------------------------
TEST_F(ScenarioAllowlist, ExactNameMakesFirstCompileDynamic) {
  setenv("PROTEAN_DYNAMIC_SOURCES", "x", 1);
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  for (int64_t n : {4, 8, 16}) {
    Tensor x = pt::randn({n, 2});
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_F(ScenarioAllowlist, RegexOverridesMarkStatic) {
  setenv("PROTEAN_DYNAMIC_SOURCES", "in.*", 1);
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"input"}});
  for (int64_t n : {4, 8}) {
    Tensor x = pt::randn({n});
    pt::mark_static(x, 0);
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

// ---- module parameters / attributes --------------------------------------------------------------
namespace {
struct Block : pt::Module {
  Tensor& w;
  explicit Block(int64_t d) : w(register_parameter("w", pt::randn({d, d}))) {}
};
struct Net : pt::Module {
  Tensor& bias;
  std::shared_ptr<Block> block;
  explicit Net(int64_t d)
      : bias(register_buffer("bias", pt::randn({d}))), block(register_module("block", std::make_shared<Block>(d))) {
    register_attribute("scale", 2);
  }
  Tensor forward(const Tensor& x) {
    int64_t s = attribute("scale").guard_int();
    return pt::matmul(x, block->w) * static_cast<double>(s) + bias;
  }
};
}  // namespace

TEST_F(ScenarioParameters, ModuleParametersAreStaticInputsAndAttributesGuarded) {
  auto net = std::make_shared<Net>(4);
  pt::observe::LogCapture logs("guards,recompiles");
  auto f = scenario_compile(net, {.name = "net", .arg_names = {"x"}});
  for (int64_t n : {2, 3, 5}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), net->forward(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  std::string text = logs.str();
  EXPECT_NE(text.find("TENSOR_MATCH: check_tensor(self.block.w, f32, device=cpu, requires_grad=false, size=[4, 4]"),
            std::string::npos) << text;
  EXPECT_NE(text.find("self.bias"), std::string::npos) << text;
  EXPECT_NE(text.find("EQUALS_MATCH: self.scale == 2"), std::string::npos) << text;
  net->set_attribute("scale", 3);
  Tensor x = pt::randn({3, 4});
  expect_same(f(x), net->forward(x));
  EXPECT_NE(logs.str().find("int 'self.scale' mismatch. expected 2, actual 3"), std::string::npos) << logs.str();
}

// ---- recompile limit --------------------------------------------------------------------------------
TEST_F(ScenarioLimits, PlainIntHitsLimitWarnsOnceThenRunsEagerly) {
  pt::observe::LogCapture logs("");
  auto fn = [](const Tensor& x, int64_t n) { return x * static_cast<double>(n); };
  auto f = scenario_compile(fn, {.name = "scale_by", .arg_names = {"x", "n"}});
  Tensor x = pt::randn({3});
  for (int64_t n = 0; n < 12; ++n) expect_same(f(x, n), fn(x, n));
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 8);
  EXPECT_EQ(s.eager_fallbacks, 4);
  std::string text = logs.str();
  EXPECT_NE(text.find("scale_by hit config.recompile_limit (8)"), std::string::npos) << text;
  EXPECT_NE(text.find("last reason: " + fid(f.frame_id(), 7) + ": int 'n' mismatch. expected 7, actual 8"), std::string::npos)
      << text;
  EXPECT_NE(text.find("declare it protean::SymInt"), std::string::npos) << text;
  EXPECT_EQ(text.find("hit config"), text.rfind("hit config"));  // one warning
  // Cached values still hit.
  expect_same(f(x, 3), fn(x, 3));
  EXPECT_EQ(pt::stats().compiles, 8);
}

TEST_F(ScenarioLimits, FailOnRecompileLimitHitThrows) {
  auto fn = [](const Tensor& x, int64_t n) { return x * static_cast<double>(n); };
  auto f = scenario_compile(fn, {.name = "scale_by", .arg_names = {"x", "n"}, .recompile_limit = 2,
                            .fail_on_recompile_limit_hit = true});
  Tensor x = pt::randn({3});
  f(x, 1);
  f(x, 2);
  EXPECT_THROW(f(x, 3), pt::CompileError);
}

// ---- stances ----------------------------------------------------------------------------------------
TEST_F(ScenarioStances, FailOnRecompile) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  Tensor a = pt::randn({2}), b = pt::randn({3});
  expect_same(f(a), affine(a));
  pt::set_stance(pt::Stance::FailOnRecompile);
  expect_same(f(a), affine(a));  // hits are fine
  try {
    f(b);
    FAIL() << "expected CompileError";
  } catch (const pt::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x' size mismatch at index 0. expected 2, actual 3"), std::string::npos);
  }
}

TEST_F(ScenarioStances, EagerOnRecompileAndForceEager) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}});
  Tensor a = pt::randn({2}), b = pt::randn({3});
  f(a);
  pt::set_stance(pt::Stance::EagerOnRecompile);
  expect_same(f(b), affine(b));
  EXPECT_EQ(pt::stats().compiles, 1);
  pt::set_stance(pt::Stance::ForceEager);
  auto g = scenario_compile(affine, {.name = "affine2", .arg_names = {"x"}});
  expect_same(g(a), affine(a));
  EXPECT_EQ(pt::stats().compiles, 1);
  EXPECT_EQ(pt::stats().eager_fallbacks, 2);
}

// ---- guard failure texts ------------------------------------------------------------------------
TEST_F(ScenarioGuardText, DtypeRankStrideReasons) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}, .dynamic = pt::Dynamic::Off});
  const std::string id = fid(f.frame_id(), 0);
  Tensor x = pt::randn({4, 4});
  f(x);
  f(x.to(pt::DType::F64));
  f(pt::randn({4, 4, 1}));
  Tensor t = x.transpose(0, 1);
  expect_same(f(t), affine(t));
  auto r = pt::stats().recompile_reasons;
  EXPECT_EQ(r.count(id + ": tensor 'x' dtype mismatch. expected f32, actual f64"), 1u);
  EXPECT_EQ(r.count(id + ": tensor 'x' rank mismatch. expected 2, actual 3"), 1u);
  EXPECT_EQ(r.count(id + ": tensor 'x' stride mismatch at index 0. expected 4, actual 1"), 1u);
}

TEST_F(ScenarioGuardText, ShapeEnvGuardFailureNamesSources) {
  auto fn = [](const Tensor& x) {
    if (x.size(0) < 100) return x + 1.0;
    return x - 1.0;
  };
  auto f = scenario_compile(fn, {.name = "lt", .arg_names = {"x"}, .dynamic = pt::Dynamic::On});
  for (int64_t n : {4, 200}) {
    Tensor x = pt::randn({n});
    expect_same(f(x), fn(x));
  }
  auto r = pt::stats().recompile_reasons;
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r.begin()->first, fid(f.frame_id(), 0) + ": s0 <= 99 (s0 = x.size()[0])");
}

TEST_F(ScenarioGuardText, AnUndefinedTensorArgumentIsGuarded) {
  // An optional tensor left out (undefined) at the first call: the trace takes the "absent" branch, so a
  // later call with the tensor must not hit that entry (it would return x * 2: a silent wrong answer).
  auto fn = [](const Tensor& x, const Tensor& bias) { return bias.defined() ? x + bias : x * 2.0; };
  auto f = scenario_compile(fn, {.name = "optional_bias", .arg_names = {"x", "bias"}});
  Tensor x = pt::randn({3}), b = pt::randn({3});
  for (int round = 0; round < 2; ++round) {
    expect_same(f(x, Tensor()), x * 2.0);
    expect_same(f(x, b), x + b);
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  auto r = pt::stats().recompile_reasons;
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r.begin()->first, fid(f.frame_id(), 0) + ": tensor 'bias' is defined (f32[3]), the graph was traced with it undefined");
}

// ---- logs ---------------------------------------------------------------------------------------------
TEST_F(ScenarioLogs, RecompileAndCreateSymbolLines) {
  pt::observe::LogCapture logs("+dynamic,recompiles");
  auto f = scenario_compile(affine, {.name = "mlp", .arg_names = {"x"}});
  f(pt::randn({8, 2}));
  f(pt::randn({16, 2}));
  std::string text = logs.str();
  const std::string id1 = fid(f.frame_id(), 1);
  EXPECT_NE(text.find("[" + id1 + "] Recompiling function mlp in "), std::string::npos) << text;
  EXPECT_NE(text.find("triggered by the following guard failure(s):\n[" + id1 + "]     - " + fid(f.frame_id(), 0) +
                      ": tensor 'x' size mismatch at index 0. expected 8, actual 16"),
            std::string::npos) << text;
  EXPECT_NE(text.find("[" + id1 + "] create_symbol s0 = 16 for x.size()[0] [2, int_oo]"), std::string::npos) << text;
}

// ---- graph breaks -----------------------------------------------------------------------------------
TEST_F(ScenarioGraphBreaks, HostReadRunsSegmentedAndFullgraphNamesTheLine) {
  auto fn = [](const Tensor& x) { return x * x.sum().item<float>(); };
  auto f = pt::compile(fn, {.name = "item", .arg_names = {"x"}, .backend = "interp"});
  Tensor x = pt::randn({3});
  expect_same(f(x), fn(x));
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(pt::stats().graph_breaks, 1);
  auto g = pt::compile(fn, {.name = "item_fg", .arg_names = {"x"}, .backend = "interp", .fullgraph = true});
  try {
    g(x);
    FAIL() << "expected CompileError";
  } catch (const pt::CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("fullgraph=true: graph break in item_fg"), std::string::npos) << m;
    EXPECT_NE(m.find("Tensor::item() reads tensor data on the host (op item) at capture_scenarios.cpp:"), std::string::npos)
        << m;
  }
  EXPECT_EQ(pt::stats().graph_breaks, 2);
}

// ---- backends ---------------------------------------------------------------------------------------
TEST_F(ScenarioBackends, UnknownBackendListsRegisteredOnes) {
  try {
    scenario_compile(affine, {.backend = "nope"});
    FAIL();
  } catch (const pt::ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("unknown backend 'nope'"), std::string::npos) << m;
    EXPECT_NE(m.find("eager"), std::string::npos) << m;
    EXPECT_NE(m.find("interp"), std::string::npos) << m;
  }
}

TEST_F(ScenarioBackends, EagerBackendRunsUserFunctionAfterGuards) {
  auto f = scenario_compile(affine, {.name = "affine", .arg_names = {"x"}, .backend = "eager"});
  for (int64_t n : {2, 3, 4}) {
    Tensor x = pt::randn({n});
    expect_same(f(x), affine(x));
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_EQ(pt::stats().cache_hits, 1);
}

TEST_F(ScenarioBackends, TupleAndSymIntOutputs) {
  auto fn = [](const Tensor& x) { return std::make_tuple(x + 1.0, x.size(0) * 2, x.sum()); };
  auto f = scenario_compile(fn, {.name = "tuple", .arg_names = {"x"}, .dynamic = pt::Dynamic::On});
  for (int64_t n : {3, 7}) {
    Tensor x = pt::randn({n});
    auto [a, m, s] = f(x);
    auto [ea, em, es] = fn(x);
    expect_same(a, ea);
    EXPECT_EQ(m.hint(), em.hint());
    expect_same(s, es);
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

// ---- threads ----------------------------------------------------------------------------------------
TEST_F(ScenarioThreads, EightThreadsMixedShapesMatchEager) {
  auto fn = [](const Tensor& x, const Tensor& y) { return pt::tanh(x) * 2.0 + y; };
  auto f = scenario_compile(fn, {.name = "mixed", .arg_names = {"x", "y"}});
  const int64_t shapes[] = {3, 5, 8, 13};
  std::vector<Tensor> xs, ys, want;
  for (int64_t n : shapes) {
    xs.push_back(pt::randn({n, 4}));
    ys.push_back(pt::randn({4}));
    want.push_back(fn(xs.back(), ys.back()));
  }
  std::atomic<int> bad{0};
  std::mutex error_mu;
  std::string first_error;  // an exception inside a thread is reported, never std::terminate
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 1000; ++i) {
          size_t k = static_cast<size_t>((i * 7 + t) % 4);
          Tensor got = f(xs[k], ys[k]);
          if (!pt::allclose(got, want[k], 1e-5, 1e-6)) bad++;
        }
      } catch (const std::exception& e) {
        bad++;
        std::lock_guard<std::mutex> lock(error_mu);
        if (first_error.empty()) first_error = e.what();
      }
    });
  for (auto& th : threads) th.join();
  ASSERT_TRUE(first_error.empty()) << first_error;
  EXPECT_EQ(bad.load(), 0);
  EXPECT_LE(pt::stats().compiles, 2);
  EXPECT_EQ(pt::stats().cache_hits + pt::stats().cache_misses, 8000);
}
