// cond(pred, true_fn, false_fn, operands): eager branch choice, the traced form (both branches joined
// by where, checked through the interp backend against per-element references), and its errors.
#include <gtest/gtest.h>

#include <cmath>

#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::Tensor;
using pt::TensorList;

namespace {

TensorList twice(const TensorList& o) { return {o[0] * 2.0, o[1] + 1.0}; }
TensorList negate(const TensorList& o) { return {pt::neg(o[0]), o[1] - 1.0}; }

}  // namespace

TEST(OpsCond, EagerRunsOnlyTheChosenBranch) {
  int t_calls = 0, f_calls = 0;
  auto t = [&](const TensorList& o) { ++t_calls; return o[0] + 10.0; };
  auto f = [&](const TensorList& o) { ++f_calls; return o[0] - 10.0; };
  Tensor x = pt::tensor<float>({1, 2, 3}, {3});
  Tensor a = pt::cond(pt::scalar_tensor(1, DType::Bool), t, f, {x});
  Tensor b = pt::cond(pt::tensor<bool>({false}, {1}), t, f, {x});
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{11, 12, 13}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{-9, -8, -7}));
  EXPECT_EQ(t_calls, 1);
  EXPECT_EQ(f_calls, 1);
}

TEST(OpsCond, CompiledMatchesEagerForBothPredicates) {
  auto fn = [](const Tensor& p, const Tensor& x, const Tensor& y) { return pt::cond(p, twice, negate, {x, y}); };
  auto f = pt::compile(fn, {.name = "cond2", .arg_names = {"p", "x", "y"}});
  for (bool p : {true, false, true}) {
    Tensor x = pt::randn({2, 3}), y = pt::randn({3});
    TensorList got = f(pt::scalar_tensor(p ? 1 : 0, DType::Bool), x, y);
    ASSERT_EQ(got.size(), 2u);
    std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>();
    std::vector<float> g0 = got[0].to_vector<float>(), g1 = got[1].to_vector<float>();
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_FLOAT_EQ(g0[i], p ? xs[i] * 2 : -xs[i]);
    for (size_t i = 0; i < ys.size(); ++i) EXPECT_FLOAT_EQ(g1[i], p ? ys[i] + 1 : ys[i] - 1);
  }
}

TEST(OpsCond, NanInTheBranchNotTakenDoesNotLeak) {
  auto fn = [](const Tensor& x) {
    return pt::cond(
        pt::amin(x) > 0.0, [](const TensorList& o) { return pt::log(o[0]); },
        [](const TensorList& o) { return o[0] * 0.0; }, {x});
  };
  auto f = pt::compile(fn, {.name = "safe_log", .arg_names = {"x"}});
  Tensor neg = pt::tensor<float>({-1, 2}, {2});
  std::vector<float> r = f(neg).to_vector<float>();
  EXPECT_FALSE(std::isnan(r[0]));
  EXPECT_EQ(r[0], 0.0f);
}

TEST(OpsCond, Errors) {
  auto id = [](const TensorList& o) { return o[0]; };
  Tensor x = pt::randn({3});
  EXPECT_THROW(pt::cond(pt::scalar_tensor(1.0), id, id, {x}), pt::TypeError);
  EXPECT_THROW(pt::cond(pt::tensor<bool>({true, false}, {2}), id, id, {x}), pt::ValueError);
  auto fn = [](const Tensor& p, const Tensor& y) {
    return pt::cond(p, [](const TensorList& o) { return o[0]; }, [](const TensorList& o) { return o[0].sum(); }, {y});
  };
  auto f = pt::compile(fn, {.name = "bad", .arg_names = {"p", "y"}});
  try {
    f(pt::scalar_tensor(1, DType::Bool), x);
    FAIL();
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("cond: output 0 has sizes [3] in true_fn and [] in false_fn"), std::string::npos)
        << e.what();
  }
  auto g = [](const Tensor& p, const Tensor& y) {
    return pt::cond(p, [](const TensorList& o) { return o[0]; }, [](const TensorList& o) { return o[0].to(DType::F64); }, {y});
  };
  auto cg = pt::compile(g, {.name = "bad_dtype", .arg_names = {"p", "y"}});
  EXPECT_THROW(cg(pt::scalar_tensor(0, DType::Bool), x), pt::TypeError);
}
