// cond(pred, true_fn, false_fn, operands): eager branch choice and the eager signature check, the
// compiled form (each branch a subgraph, only the taken one runs) on the interp and cpu backends:
// both predicates across calls without recompiling, a branch that would fail is not run when not
// taken, closures over outer tensors, nested cond, automatic dynamic through both branches, dynamic
// floats in a branch, multiple and zero operands, and the errors.
#include <gtest/gtest.h>

#include <cmath>

#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::Tensor;
using pt::TensorList;

namespace {

TensorList twice(const TensorList& o) { return {o[0] * 2.0, o[1] + 1.0}; }
TensorList negate(const TensorList& o) { return {pt::neg(o[0]), o[1] - 1.0}; }

Tensor bool_scalar(bool b) { return pt::scalar_tensor(b ? 1 : 0, DType::Bool); }

void expect_close(const Tensor& got, const Tensor& want) {
  ASSERT_FALSE(got.is_fake());
  ASSERT_EQ(pt::hints(got.sizes()), pt::hints(want.sizes()));
  EXPECT_TRUE(pt::allclose(got.to(DType::F64), want.to(DType::F64), 1e-5, 1e-6));
}

/// The IR of the first compile of `run` (PROTEAN_LOGS=output_code, the graph as captured).
template <typename F>
std::string captured_ir(F&& run) {
  pt::observe::LogCapture cap("output_code");
  run();
  std::string text = cap.str();
  size_t at = text.find("TRACED GRAPH after input");
  if (at == std::string::npos) return text;
  size_t end = text.find("TRACED GRAPH after", at + 1);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

class OpsCond : public ::testing::Test {
 protected:
  void SetUp() override { pt::reset(); }
};

class OpsCondCompiled : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { pt::reset(); }
  pt::CompileOptions opts(const std::string& name, std::vector<std::string> args) const {
    pt::CompileOptions o;
    o.name = name;
    o.arg_names = std::move(args);
    o.backend = GetParam();
    return o;
  }
};

}  // namespace

// ---- eager ------------------------------------------------------------------------------------------

TEST_F(OpsCond, EagerRunsOnlyTheChosenBranch) {
  // The branch not taken is traced on fake operands (the signature check): it is called, but none of
  // its ops runs on data.
  int t_real = 0, f_real = 0, t_fake = 0, f_fake = 0;
  auto t = [&](const TensorList& o) {
    ++(o[0].is_fake() ? t_fake : t_real);
    return o[0] + 10.0;
  };
  auto f = [&](const TensorList& o) {
    ++(o[0].is_fake() ? f_fake : f_real);
    return o[0] - 10.0;
  };
  Tensor x = pt::tensor<float>({1, 2, 3}, {3});
  Tensor a = pt::cond(pt::scalar_tensor(1, DType::Bool), t, f, {x});
  Tensor b = pt::cond(pt::tensor<bool>({false}, {1}), t, f, {x});
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{-9, -8, -7}));
  EXPECT_EQ(t_real, 1);
  EXPECT_EQ(f_real, 1);
  EXPECT_EQ(t_fake, 1);
  EXPECT_EQ(f_fake, 1);
}

TEST_F(OpsCond, EagerChecksThatTheBranchesAgree) {
  Tensor y = pt::randn({3});
  auto same = [](const TensorList& o) { return o[0]; };
  auto reduced = [](const TensorList& o) { return o[0].sum(); };
  for (bool p : {true, false}) {
    try {
      pt::cond(bool_scalar(p), same, reduced, {y});
      FAIL() << "pred " << p;
    } catch (const pt::ShapeError& e) {
      EXPECT_NE(std::string(e.what()).find("cond: output 0 has sizes [3] in true_fn and [] in false_fn"), std::string::npos)
          << e.what();
    }
  }
  auto other_dtype = [](const TensorList& o) { return o[0].to(DType::F64); };
  EXPECT_THROW(pt::cond(bool_scalar(true), same, other_dtype, {y}), pt::TypeError);
  pt::CondFn two = [](const TensorList& o) { return TensorList{o[0], o[0]}; };
  pt::CondFn one = [](const TensorList& o) { return TensorList{o[0]}; };
  EXPECT_THROW(pt::cond(bool_scalar(false), two, one, {y}), pt::ValueError);
}

TEST_F(OpsCond, EagerSkipsTheCheckOfABranchThatReadsTheHost) {
  Tensor x = pt::tensor<float>({1, 2}, {2});
  auto host = [](const TensorList& o) { return o[0] * static_cast<double>(o[0].sum().item<float>()); };
  auto neg = [](const TensorList& o) { return pt::neg(o[0]); };
  EXPECT_EQ(pt::cond(bool_scalar(false), host, neg, {x}).to_vector<float>(), (std::vector<float>{-1, -2}));
  EXPECT_EQ(pt::cond(bool_scalar(true), host, neg, {x}).to_vector<float>(), (std::vector<float>{3, 6}));
}

TEST_F(OpsCond, Errors) {
  auto id = [](const TensorList& o) { return o[0]; };
  Tensor x = pt::randn({3});
  EXPECT_THROW(pt::cond(pt::scalar_tensor(1.0), id, id, {x}), pt::TypeError);
  EXPECT_THROW(pt::cond(pt::tensor<bool>({true, false}, {2}), id, id, {x}), pt::ValueError);
  EXPECT_THROW(pt::cond(bool_scalar(true), id, id, {Tensor()}), pt::ValueError);
  auto fn = [](const Tensor& p, const Tensor& y) {
    return pt::cond(p, [](const TensorList& o) { return o[0]; }, [](const TensorList& o) { return o[0].sum(); }, {y});
  };
  auto f = pt::compile(fn, {.name = "bad", .arg_names = {"p", "y"}, .backend = "interp"});
  try {
    f(bool_scalar(true), x);
    FAIL();
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("cond: output 0 has sizes [3] in true_fn and [] in false_fn"), std::string::npos)
        << e.what();
  }
  auto g = [](const Tensor& p, const Tensor& y) {
    return pt::cond(p, [](const TensorList& o) { return o[0]; }, [](const TensorList& o) { return o[0].to(DType::F64); }, {y});
  };
  auto cg = pt::compile(g, {.name = "bad_dtype", .arg_names = {"p", "y"}, .backend = "interp"});
  EXPECT_THROW(cg(bool_scalar(false), x), pt::TypeError);
}

// ---- compiled (interp and cpu) --------------------------------------------------------------------

TEST_P(OpsCondCompiled, MatchesEagerForBothPredicatesWithOneCompile) {
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& y) { return pt::cond(p, twice, negate, {x, y}); };
  auto f = pt::compile(fn, opts("cond2", {"p", "x", "y"}));
  for (bool p : {true, false, true, false}) {
    Tensor x = pt::randn({2, 3}), y = pt::randn({3});
    TensorList got = f(bool_scalar(p), x, y);
    ASSERT_EQ(got.size(), 2u);
    expect_close(got[0], p ? x * 2.0 : pt::neg(x));
    expect_close(got[1], p ? y + 1.0 : y - 1.0);
  }
  EXPECT_EQ(pt::stats().compiles, 1);
  EXPECT_EQ(pt::stats().graph_breaks, 0);
}

TEST_P(OpsCondCompiled, TheBranchNotTakenDoesNotRun) {
  // The false branch gathers rows by `idx`; with an out-of-range index it fails when it runs. Joining
  // both branches with where (running both) would fail on every call.
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& idx) {
    return pt::cond(
        p, [](const TensorList& o) { return pt::relu(o[0]); },
        [](const TensorList& o) { return pt::index_select(o[0], 0, o[1]); }, {x, idx});
  };
  auto f = pt::compile(fn, opts("guarded_gather", {"p", "x", "idx"}));
  Tensor x = pt::randn({4, 3});
  Tensor bad = pt::tensor<int64_t>({0, 1, 100, 2}, {4});
  Tensor good = pt::tensor<int64_t>({3, 2, 1, 0}, {4});
  expect_close(f(bool_scalar(true), x, bad), pt::relu(x));
  EXPECT_THROW(f(bool_scalar(false), x, bad), pt::ValueError);  // taken: it runs (and fails)
  expect_close(f(bool_scalar(false), x, good), pt::index_select(x, 0, good));
  expect_close(f(bool_scalar(true), x, bad), pt::relu(x));
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_P(OpsCondCompiled, NanInTheBranchNotTakenDoesNotLeak) {
  auto fn = [](const Tensor& x) {
    return pt::cond(
        pt::amin(x) > 0.0, [](const TensorList& o) { return pt::log(o[0]); },
        [](const TensorList& o) { return o[0] * 0.0; }, {x});
  };
  auto f = pt::compile(fn, opts("safe_log", {"x"}));
  std::vector<float> r = f(pt::tensor<float>({-1, 2}, {2})).to_vector<float>();
  EXPECT_EQ(r, (std::vector<float>{0.0f, 0.0f}));
  r = f(pt::tensor<float>({1, 2}, {2})).to_vector<float>();
  EXPECT_FLOAT_EQ(r[1], std::log(2.0f));
}

TEST_P(OpsCondCompiled, ClosuresOverOuterTensorsAreLifted) {
  // `y` and `bias` reach the branches by capture, not as operands: both become cond operands.
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& y) {
    Tensor bias = y * 0.5;
    return pt::cond(
        p, [&y](const TensorList& o) { return o[0] + y; },
        [&bias](const TensorList& o) { return o[0] * bias; }, {x});
  };
  auto f = pt::compile(fn, opts("closure", {"p", "x", "y"}));
  Tensor x = pt::randn({3}), y = pt::randn({3});
  std::string ir = captured_ir([&] { expect_close(f(bool_scalar(true), x, y), x + y); });
  expect_close(f(bool_scalar(false), x, y), x * (y * 0.5));
  EXPECT_EQ(pt::stats().compiles, 1);
  // Both branches take (x, y, bias): the operand, then what each closed over.
  EXPECT_NE(ir.find("graph true_branch(%arg0 : f32[3], %arg1 : f32[3], %arg2 : f32[3]):"), std::string::npos) << ir;
  EXPECT_NE(ir.find("graph false_branch(%arg0 : f32[3], %arg1 : f32[3], %arg2 : f32[3]):"), std::string::npos) << ir;
  EXPECT_NE(ir.find("= cond(%"), std::string::npos) << ir;
  EXPECT_EQ(ir.find("where("), std::string::npos) << ir;
}

TEST_P(OpsCondCompiled, NestedCond) {
  auto fn = [](const Tensor& p, const Tensor& q, const Tensor& x) {
    return pt::cond(
        p,
        [&q](const TensorList& o) {
          return pt::cond(
              q, [](const TensorList& i) { return i[0] + 1.0; }, [](const TensorList& i) { return i[0] - 1.0; }, o);
        },
        [](const TensorList& o) { return o[0] * 3.0; }, {x});
  };
  auto f = pt::compile(fn, opts("nested", {"p", "q", "x"}));
  Tensor x = pt::randn({2, 2});
  std::string ir = captured_ir([&] { expect_close(f(bool_scalar(true), bool_scalar(true), x), x + 1.0); });
  expect_close(f(bool_scalar(true), bool_scalar(false), x), x - 1.0);
  expect_close(f(bool_scalar(false), bool_scalar(true), x), x * 3.0);
  expect_close(f(bool_scalar(false), bool_scalar(false), x), x * 3.0);
  EXPECT_EQ(pt::stats().compiles, 1);
  EXPECT_EQ(count(ir, "= cond("), 2u) << ir;
  EXPECT_EQ(count(ir, "graph true_branch("), 2u) << ir;
}

TEST_P(OpsCondCompiled, SymbolicSizesThroughBothBranchesWithAutomaticDynamic) {
  // Both branches use the size (a reshape to [2, n/2 * 3]) and change the values differently.
  auto fn = [](const Tensor& x, const Tensor& w) {
    return pt::cond(
        x.sum() > 0.0,
        [](const TensorList& o) { return pt::tanh(pt::matmul(o[0], o[1])).reshape({2, -1}); },
        [](const TensorList& o) { return (pt::matmul(o[0], o[1]) - 1.0).reshape({2, -1}); }, {x, w});
  };
  auto f = pt::compile(fn, opts("dyn", {"x", "w"}));
  Tensor w = pt::randn({5, 3});
  int pos = 0, neg = 0;
  for (int64_t n : {4, 8, 16, 32, 6, 10}) {
    for (double sign : {1.0, -1.0}) {
      Tensor x = pt::abs(pt::randn({n, 5})) * sign;
      (sign > 0 ? pos : neg)++;
      expect_close(f(x, w), fn(x, w));
    }
  }
  ASSERT_GT(pos, 0);
  ASSERT_GT(neg, 0);
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);  // static, then rows dynamic; every later size and predicate hits
  EXPECT_EQ(s.recompiles, 1);
  EXPECT_EQ(s.graph_breaks, 0);
}

TEST_P(OpsCondCompiled, DynamicFloatInABranchStaysAnInput) {
  auto fn = [](const Tensor& x, pt::SymFloat a) {
    return pt::cond(
        x.sum() > 0.0, [a](const TensorList& o) { return o[0] * a; },
        [](const TensorList& o) { return pt::neg(o[0]); }, {x});
  };
  pt::CompileOptions o = opts("alpha", {"x", "a"});
  o.dynamic = pt::Dynamic::On;
  auto f = pt::compile(fn, o);
  Tensor x = pt::abs(pt::randn({4})) + 0.1;
  for (double a : {2.0, 3.0, -1.5}) expect_close(f(x, pt::SymFloat(a)), x * a);
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_P(OpsCondCompiled, NoOperandsAndAOnePredicateOfShapeOne) {
  auto fn = [](const Tensor& p, const Tensor& x) {
    return pt::cond(
        p.reshape({1}), [&x](const TensorList& o) { return TensorList{x + 1.0, x.sum()}; },
        [&x](const TensorList& o) { return TensorList{x - 1.0, x.amax()}; }, {});
  };
  auto f = pt::compile(fn, opts("noops", {"p", "x"}));
  Tensor x = pt::randn({5});
  for (bool p : {false, true}) {
    TensorList got = f(bool_scalar(p), x);
    ASSERT_EQ(got.size(), 2u);
    expect_close(got[0], p ? x + 1.0 : x - 1.0);
    expect_close(got[1], p ? x.sum() : x.amax());
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

TEST_P(OpsCondCompiled, AHostReadInsideABranchBreaksTheFrame) {
  auto fn = [](const Tensor& x) {
    return pt::cond(
        x.sum() > 0.0, [](const TensorList& o) { return o[0] * static_cast<double>(o[0].amax().item<float>()); },
        [](const TensorList& o) { return pt::neg(o[0]); }, {x});
  };
  auto f = pt::compile(fn, opts("host_in_branch", {"x"}));
  for (double sign : {1.0, -1.0, 1.0}) {
    Tensor x = (pt::abs(pt::randn({4})) + 0.1) * sign;
    expect_close(f(x), fn(x));
  }
  // Two sites: the cond that cannot be captured (its reason names the branch), and, once the frame is
  // segmented and the cond runs the eager way, the item() in the taken branch ending a segment.
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 2);
  int in_branch = 0, plain = 0;
  for (const auto& [reason, n] : s.graph_break_reasons) {
    if (reason.find("Tensor::item() reads tensor data on the host inside a cond branch (a branch is one subgraph and "
                    "cannot break) (op item) at ops_cond_test.cpp:") != std::string::npos)
      ++in_branch;
    else if (reason.find("Tensor::item() reads tensor data on the host (op item)") != std::string::npos)
      ++plain;
  }
  EXPECT_EQ(in_branch, 1) << s.to_json();
  EXPECT_EQ(plain, 1) << s.to_json();

  pt::CompileOptions o = opts("host_in_branch_fullgraph", {"x"});
  o.fullgraph = true;
  auto g = pt::compile(fn, o);
  try {
    g(pt::randn({4}));
    FAIL();
  } catch (const pt::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("inside a cond branch"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsCondCompiled, ::testing::Values("interp", "cpu"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
