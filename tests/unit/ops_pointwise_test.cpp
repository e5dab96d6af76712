// Pointwise ops, cast/clone/full/arange and the numerics helpers, against float64 references written
// out plainly here. Inputs cover broadcasting, non-contiguous layouts (column-major, strided with an
// offset), size-0/size-1 dims, 0-dim tensors and every dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/protean.h"
#include "ops_test_util.h"

namespace pointwise_test {

using namespace ops_test;  // reference helpers: ops_test_util.h

const std::vector<IntVec> kShapes = {{3, 5}, {2, 1, 7}, {0, 4}, {1}, {}, {4, 3, 2}};
const std::vector<DType> kFloatTypes = {DType::F32, DType::F64, DType::F16, DType::BF16};
const std::vector<DType> kIntTypes = {DType::I64, DType::I32, DType::I8, DType::U8};

struct UnaryCase {
  OpKind op;
  std::function<double(double)> ref;
  double lo, hi;
  Attrs attrs = {};
};

double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

}  // namespace pointwise_test
using namespace pointwise_test;

// ---- unary -----------------------------------------------------------------------------------------
TEST(OpsPointwise, UnaryFloatOpsMatchReference) {
  std::vector<UnaryCase> cases = {
      {OpKind::exp, [](double x) { return std::exp(x); }, -5, 5},
      {OpKind::log, [](double x) { return std::log(x); }, 0.01, 10},
      {OpKind::sin, [](double x) { return std::sin(x); }, -4, 4},
      {OpKind::cos, [](double x) { return std::cos(x); }, -4, 4},
      {OpKind::tanh, [](double x) { return std::tanh(x); }, -4, 4},
      {OpKind::erf, [](double x) { return std::erf(x); }, -3, 3},
      {OpKind::sqrt, [](double x) { return std::sqrt(x); }, 0, 10},
      {OpKind::rsqrt, [](double x) { return 1 / std::sqrt(x); }, 0.1, 10},
      {OpKind::reciprocal, [](double x) { return 1 / x; }, 0.5, 10},
      {OpKind::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, -8, 8},
      {OpKind::silu, [](double x) { return x / (1 + std::exp(-x)); }, -8, 8},
      {OpKind::gelu, gelu_erf, -5, 5, {{"approximate", std::string("none")}}},
      {OpKind::gelu, gelu_tanh, -5, 5, {{"approximate", std::string("tanh")}}},
      {OpKind::hardsigmoid, [](double x) { return std::clamp(x / 6 + 0.5, 0.0, 1.0); }, -5, 5},
      {OpKind::hardswish, [](double x) { return x * std::clamp(x + 3, 0.0, 6.0) / 6; }, -5, 5},
      {OpKind::relu, [](double x) { return x < 0 ? 0 : x; }, -3, 3},
      {OpKind::abs, [](double x) { return std::fabs(x); }, -3, 3},
      {OpKind::neg, [](double x) { return -x; }, -3, 3},
      {OpKind::ceil, [](double x) { return std::ceil(x); }, -3, 3},
      {OpKind::floor, [](double x) { return std::floor(x); }, -3, 3},
      {OpKind::round, [](double x) { return std::nearbyint(x); }, -3, 3},
      {OpKind::sign, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; }, -3, 3},
  };
  for (const auto& c : cases)
    for (DType t : kFloatTypes)
      for (const IntVec& s : kShapes)
        for (Layout l : {kContig, kColMajor, kStrided}) {
          Tensor x = make(s, t, l, uniform(c.lo, c.hi));
          Tensor y = run(c.op, {x}, c.attrs);
          EXPECT_EQ(y.dtype(), t);
          std::vector<double> ref;
          for (double v : values(x)) ref.push_back(c.ref(v));
          std::string what = std::string(pt::ops::op_name(c.op)) + " " + std::string(pt::short_name(t)) + " " +
                             pt::to_string(pt::to_symint_vec(s)) + " layout " + std::to_string(l);
          // rounding ops are exact on the stored value
          expect_values(y, ref, what, rtol_of(t) * 4);
        }
}

TEST(OpsPointwise, UnaryIntegerOps) {
  for (DType t : kIntTypes) {
    bool uns = t == DType::U8;
    Tensor x = make({4, 6}, t, kStrided, uniform(uns ? 0 : -50, 50, true));
    std::vector<double> xv = values(x);
    auto check = [&](OpKind op, const std::function<double(double)>& f, DType out_t) {
      Tensor y = run(op, {x});
      EXPECT_EQ(y.dtype(), out_t) << pt::ops::op_name(op);
      std::vector<double> ref;
      for (double v : xv) ref.push_back(round_to(f(v), out_t));
      expect_values(y, ref, std::string(pt::ops::op_name(op)) + " " + std::string(pt::short_name(t)), 1e-5);
    };
    check(OpKind::abs, [](double v) { return std::fabs(v); }, t);
    check(OpKind::relu, [](double v) { return v < 0 ? 0 : v; }, t);
    check(OpKind::sign, [](double v) { return v > 0 ? 1 : v < 0 ? -1 : 0; }, t);
    check(OpKind::floor, [](double v) { return v; }, t);
    check(OpKind::round, [](double v) { return v; }, t);
    if (!uns) check(OpKind::neg, [](double v) { return -v; }, t);
    // math functions of integers give f32
    check(OpKind::exp, [](double v) { return std::exp(v); }, DType::F32);
    check(OpKind::logical_not, [](double v) { return v == 0 ? 1 : 0; }, DType::Bool);
  }
  // neg of u8 wraps
  Tensor u = pt::tensor<uint8_t>({0, 1, 200}, {3});
  EXPECT_EQ(values(run(OpKind::neg, {u})), (std::vector<double>{0, 255, 56}));
}

TEST(OpsPointwise, RoundHalfToEvenAndSignOfZero) {
  Tensor x = pt::tensor<float>({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.49f, 0.f, -0.f}, {9});
  EXPECT_EQ(values(pt::round(x)), (std::vector<double>{0, 2, 2, -0., -2, -2, 3, 0, 0}));
  EXPECT_EQ(values(pt::sign(x)), (std::vector<double>{1, 1, 1, -1, -1, -1, 1, 0, 0}));
  Tensor n = pt::tensor<float>({NAN, -1.f, 2.f}, {3});
  EXPECT_TRUE(std::isnan(values(pt::relu(n))[0]));
  EXPECT_TRUE(std::isnan(values(pt::clamp(n, 0.0, 1.0))[0]));
}

TEST(OpsPointwise, ActivationsRejectIntegers) {
  Tensor i = pt::tensor<int64_t>({1, 2}, {2});
  for (OpKind op : {OpKind::silu, OpKind::hardswish, OpKind::hardsigmoid}) {
    try {
      pt::ops::run_eager(op, std::vector<Tensor>{i}, {});
      ADD_FAILURE() << "expected TypeError";
    } catch (const pt::TypeError& e) {
      EXPECT_NE(std::string(e.what()).find(pt::ops::op_name(op)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(pt::gelu(i), pt::TypeError);
  EXPECT_THROW(pt::neg(pt::tensor<bool>({true}, {1})), pt::TypeError);
  EXPECT_THROW(pt::ops::run_eager(OpKind::gelu, std::vector<Tensor>{pt::tensor<float>({1.f}, {1})},
                                  {{"approximate", std::string("cubic")}}),
               pt::ValueError);
}

TEST(OpsPointwise, ClampBoundsAndPromotion) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::I64, DType::I8}) {
    Tensor x = make({5, 3}, t, kColMajor, uniform(-10, 10, !is_float(t)));
    std::vector<double> xv = values(x);
    struct B { std::optional<double> lo, hi; };
    for (B b : {B{-2.0, 3.0}, B{-2.0, std::nullopt}, B{std::nullopt, 3.0}, B{4.0, -1.0}}) {
      Attrs a;
      if (b.lo) a.set("min", *b.lo);
      if (b.hi) a.set("max", *b.hi);
      Tensor y = run(OpKind::clamp, {x}, a);
      EXPECT_EQ(y.dtype(), t);
      std::vector<double> ref;
      for (double v : xv) {
        double r = v;
        if (b.lo) r = std::max(r, *b.lo);
        if (b.hi) r = std::min(r, *b.hi);
        ref.push_back(r);
      }
      expect_values(y, ref, "clamp " + std::string(pt::short_name(t)));
    }
  }
  Tensor i = pt::tensor<int64_t>({-3, 0, 3}, {3});
  Tensor y = pt::clamp(i, -0.5, 1.5);
  EXPECT_EQ(y.dtype(), DType::F32);
  EXPECT_EQ(values(y), (std::vector<double>{-0.5, 0, 1.5}));
  EXPECT_THROW(pt::clamp(i, std::nullopt, std::nullopt), pt::ValueError);
}

TEST(OpsPointwise, CastConversions) {
  Tensor x = pt::tensor<float>({-2.7f, -0.5f, 0.f, 0.5f, 2.7f, 100.f}, {6});
  EXPECT_EQ(values(pt::cast(x, DType::I32)), (std::vector<double>{-2, 0, 0, 0, 2, 100}));
  EXPECT_EQ(values(pt::cast(x, DType::Bool)), (std::vector<double>{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(values(pt::cast(x, DType::F16)), (std::vector<double>{round_to(-2.7, DType::F16), -0.5, 0, 0.5,
                                                                  round_to(2.7, DType::F16), 100}));
  for (DType from : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8,
                     DType::Bool})
    for (DType to : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8,
                     DType::Bool}) {
      Tensor s = make({3, 4}, from, kStrided, uniform(0, 100, true));
      Tensor y = run(OpKind::cast, {s}, {{"dtype", to}});
      EXPECT_EQ(y.dtype(), to);
      std::vector<double> ref;
      for (double v : values(s)) ref.push_back(round_to(to == DType::Bool ? (v != 0) : v, to));
      expect_values(y, ref, std::string("cast ") + std::string(pt::short_name(from)) + "->" +
                                std::string(pt::short_name(to)));
    }
}

// ---- binary ---------------------------------------------------------------------------------------
namespace {
struct BinCase {
  OpKind op;
  std::function<double(double, double)> ref;
  double lo, hi;
  int kind;  // 0 arith, 1 div, 2 compare, 3 logical
};
std::vector<BinCase> bin_cases() {
  return {
      {OpKind::add, [](double a, double b) { return a + b; }, -10, 10, 0},
      {OpKind::sub, [](double a, double b) { return a - b; }, -10, 10, 0},
      {OpKind::mul, [](double a, double b) { return a * b; }, -10, 10, 0},
      {OpKind::div, [](double a, double b) { return a / b; }, 1, 10, 1},
      {OpKind::maximum, [](double a, double b) { return std::max(a, b); }, -10, 10, 0},
      {OpKind::minimum, [](double a, double b) { return std::min(a, b); }, -10, 10, 0},
      {OpKind::pow, [](double a, double b) { return std::pow(a, b); }, 0.5, 3, 0},
      {OpKind::eq, [](double a, double b) { return a == b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::ne, [](double a, double b) { return a != b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::lt, [](double a, double b) { return a < b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::le, [](double a, double b) { return a <= b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::gt, [](double a, double b) { return a > b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::ge, [](double a, double b) { return a >= b ? 1.0 : 0.0; }, -2, 2, 2},
      {OpKind::logical_and, [](double a, double b) { return a != 0 && b != 0 ? 1.0 : 0.0; }, -1, 2, 3},
      {OpKind::logical_or, [](double a, double b) { return a != 0 || b != 0 ? 1.0 : 0.0; }, -1, 2, 3},
  };
}
const std::vector<std::pair<IntVec, IntVec>> kBinShapes = {
    {{2, 3, 4}, {4}}, {{2, 1, 4}, {3, 1}}, {{5}, {}}, {{}, {5}}, {{0, 3}, {1, 3}}, {{1}, {1}}, {{3, 4}, {3, 4}},
    {{6, 1}, {1, 6}}};
}  // namespace

TEST(OpsPointwise, BinaryOpsBroadcastAcrossLayoutsAndDtypes) {
  std::vector<std::pair<DType, DType>> dts = {{DType::F32, DType::F32}, {DType::F64, DType::F64},
                                              {DType::F16, DType::F16}, {DType::BF16, DType::BF16},
                                              {DType::F32, DType::F64}, {DType::I64, DType::F32},
                                              {DType::I32, DType::I32}, {DType::I8, DType::I64},
                                              {DType::U8, DType::U8},   {DType::F16, DType::I64}};
  for (const auto& c : bin_cases())
    for (auto [ta, tb] : dts)
      for (const auto& [sa, sb] : kBinShapes)
        for (Layout l : {kContig, kStrided, kColMajor}) {
          bool ints = !is_float(ta) && !is_float(tb);
          double lo = c.lo, hi = c.hi;
          if (ints && c.op == OpKind::pow) lo = 0, hi = 4;
          if ((ta == DType::U8 || tb == DType::U8) && c.op != OpKind::div) lo = std::max(lo, 0.0);
          Tensor a = make(sa, ta, l, uniform(lo, hi, ints || !is_float(ta)));
          Tensor b = make(sb, tb, l == kColMajor ? kContig : l, uniform(lo, hi, ints || !is_float(tb)));
          Tensor y = run(c.op, {a, b});
          Tensor pair[] = {a, b};
          DType rt = pt::ops::result_type(pair);
          DType expect_t = c.kind == 1 ? (is_float(rt) ? rt : DType::F32) : c.kind >= 2 ? DType::Bool : rt;
          ASSERT_EQ(y.dtype(), expect_t);
          IntVec os = bshape(sa, sb);
          ASSERT_EQ(y.int_sizes(), os);
          std::vector<double> av = values(a), bv = values(b), ref;
          DType compute = c.kind == 1 ? expect_t : rt;
          for_each_index(os, [&](const IntVec& idx) {
            double x = round_to(av[static_cast<size_t>(bcast_index(idx, sa))], compute);
            double z = round_to(bv[static_cast<size_t>(bcast_index(idx, sb))], compute);
            double r = c.ref(x, z);
            if (compute == DType::U8 && c.op == OpKind::sub) r = static_cast<double>(static_cast<uint8_t>(static_cast<int>(r)));
            ref.push_back(c.kind >= 2 ? r : round_to(r, expect_t));
          });
          std::string what = std::string(pt::ops::op_name(c.op)) + " " + std::string(pt::short_name(ta)) + "," +
                             std::string(pt::short_name(tb)) + " " + pt::to_string(pt::to_symint_vec(sa)) + " " +
                             pt::to_string(pt::to_symint_vec(sb)) + " layout " + std::to_string(l);
          expect_values(y, ref, what, c.op == OpKind::pow ? 4 * rtol_of(expect_t) : -1);
        }
}

TEST(OpsPointwise, IntegerArithmeticWrapsAndPowIsExact) {
  Tensor a = pt::tensor<int8_t>({100, -100, 7}, {3});
  Tensor b = pt::tensor<int8_t>({100, -100, 3}, {3});
  EXPECT_EQ(values(pt::add(a, b)), (std::vector<double>{-56, 56, 10}));
  Tensor base = pt::tensor<int64_t>({2, -3, 1, -1, 5, 0, 3}, {7});
  Tensor ex = pt::tensor<int64_t>({10, 3, -4, -3, -1, 0, 39}, {7});
  Tensor p = pt::pow(base, ex);
  EXPECT_EQ(p.dtype(), DType::I64);
  std::vector<int64_t> got = p.to_vector<int64_t>();
  EXPECT_EQ(got, (std::vector<int64_t>{1024, -27, 1, -1, 0, 1, 4052555153018976267LL}));
  // div of integers is true division into f32
  Tensor q = pt::div(pt::tensor<int64_t>({7, -7}, {2}), pt::tensor<int64_t>({2, 2}, {2}));
  EXPECT_EQ(q.dtype(), DType::F32);
  EXPECT_EQ(values(q), (std::vector<double>{3.5, -3.5}));
  // bool add is or, bool mul is and
  Tensor t = pt::tensor<bool>({true, true, false}, {3}), f = pt::tensor<bool>({false, true, false}, {3});
  EXPECT_EQ(values(pt::add(t, f)), (std::vector<double>{1, 1, 0}));
  EXPECT_EQ(values(pt::mul(t, f)), (std::vector<double>{0, 1, 0}));
  EXPECT_THROW(pt::sub(t, f), pt::TypeError);
}

TEST(OpsPointwise, ScalarPromotionFollowsResultType) {
  Tensor h = pt::tensor<float>({1.f, 2.f}, {2}).to(DType::F16);
  EXPECT_EQ((h * 2.0).dtype(), DType::F16);
  Tensor i = pt::tensor<int64_t>({1, 2}, {2});
  EXPECT_EQ((i * 2.5).dtype(), DType::F32);
  EXPECT_EQ(values(i * 2.5), (std::vector<double>{2.5, 5}));
  EXPECT_EQ((i + 1.0).dtype(), DType::I64);
  EXPECT_EQ((pt::tensor<int32_t>({1}, {1}) + pt::scalar_tensor(1.0, DType::F64)).dtype(), DType::F64);
}

TEST(OpsPointwise, MaximumMinimumPropagateNaN) {
  Tensor a = pt::tensor<float>({NAN, 1.f, 3.f}, {3});
  Tensor b = pt::tensor<float>({0.f, NAN, 2.f}, {3});
  auto mx = values(pt::maximum(a, b)), mn = values(pt::minimum(a, b));
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]));
  EXPECT_EQ(mx[2], 3);
  EXPECT_EQ(mn[2], 2);
}

TEST(OpsPointwise, WhereBroadcastsThreeWays) {
  for (DType t : {DType::F32, DType::F16, DType::I64, DType::Bool}) {
    IntVec sc = {4, 1, 3}, sa = {5, 1}, sb = {};
    Tensor c = make(sc, DType::Bool, kStrided, uniform(0, 2, true));
    Tensor a = make(sa, t, kColMajor, uniform(0, 9, !is_float(t)));
    Tensor b = make(sb, t, kContig, uniform(0, 9, !is_float(t)));
    Tensor y = run(OpKind::where, {c, a, b});
    IntVec os = {4, 5, 3};
    ASSERT_EQ(y.int_sizes(), os);
    EXPECT_EQ(y.dtype(), t);
    auto cv = values(c), av = values(a), bv = values(b);
    std::vector<double> ref;
    for_each_index(os, [&](const IntVec& idx) {
      ref.push_back(cv[static_cast<size_t>(bcast_index(idx, sc))] != 0 ? av[static_cast<size_t>(bcast_index(idx, sa))]
                                                                        : bv[0]);
    });
    expect_values(y, ref, "where");
  }
  Tensor i = pt::tensor<int64_t>({1}, {1});
  try {
    pt::where(i, i, i);
    ADD_FAILURE() << "expected TypeError";
  } catch (const pt::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("where"), std::string::npos);
  }
  Tensor f = pt::tensor<float>({1.f}, {1});
  EXPECT_EQ(pt::where(pt::tensor<bool>({true}, {1}), pt::tensor<int64_t>({3}, {1}), f).dtype(), DType::F32);
}

TEST(OpsPointwise, BroadcastErrorNamesOpAndShapes) {
  Tensor a = pt::zeros({2, 3}), b = pt::zeros({4});
  try {
    pt::add(a, b);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const pt::ShapeError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("add"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
  EXPECT_THROW(pt::ops::run_eager(OpKind::mul, std::vector<Tensor>{a, Tensor()}, {}), pt::ValueError);
}

TEST(OpsPointwise, LargeTensorsUseThreadsCorrectly) {
  int saved = pt::num_threads();
  pt::set_num_threads(4);
  // broadcast + non-contiguous + large enough for the parallel path
  Tensor a = make({300, 257}, DType::F32, kColMajor, uniform(-1, 1));
  Tensor b = make({257}, DType::F32, kContig, uniform(-1, 1));
  Tensor y = pt::mul(a, b);
  auto av = values(a), bv = values(b);
  std::vector<double> ref;
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 257; ++j) ref.push_back(av[static_cast<size_t>(i * 257 + j)] * bv[static_cast<size_t>(j)]);
  expect_values(y, ref, "mul large");
  Tensor big = make({1 << 17}, DType::F32, kContig, uniform(-1, 1));
  Tensor z = pt::add(big, big);
  auto bg = values(big);
  for (double& v : bg) v *= 2;
  expect_values(z, bg, "add large");
  pt::set_num_threads(saved);
  EXPECT_EQ(pt::num_threads(), saved);
  EXPECT_THROW(pt::set_num_threads(0), pt::ValueError);
}

// ---- clone, factories -----------------------------------------------------------------------------
TEST(OpsPointwise, CloneIsContiguousCopy) {
  for (DType t : {DType::F32, DType::F16, DType::I8, DType::Bool, DType::F64})
    for (const IntVec& s : kShapes) {
      Tensor x = make(s, t, kColMajor, uniform(0, 2, true));
      Tensor y = run(OpKind::clone, {x});
      EXPECT_TRUE(y.is_contiguous());
      EXPECT_EQ(y.dtype(), t);
      EXPECT_EQ(values(y), values(x));
      if (numel_of(s) > 0) {
        EXPECT_NE(y.data_ptr(), x.data_ptr());
      }
    }
}

TEST(OpsPointwise, FullAndArange) {
  Tensor f = run(OpKind::full, {}, {{"shape", pt::SymIntVec{2, 3}}, {"value", 2.5}, {"dtype", DType::F16}});
  EXPECT_EQ(values(f), std::vector<double>(6, 2.5));
  Tensor fi = pt::full({4}, -1.7, DType::I32);
  EXPECT_EQ(values(fi), std::vector<double>(4, -1));
  EXPECT_EQ(values(pt::zeros({0, 3})).size(), 0u);
  EXPECT_EQ(pt::ones({}).int_sizes(), IntVec{});
  EXPECT_THROW(pt::full({-1}, 0.0), pt::ValueError);

  auto ar = [](int64_t s, int64_t e, int64_t st, DType t) {
    return run(OpKind::arange, {}, {{"start", pt::SymInt(s)}, {"end", pt::SymInt(e)}, {"step", pt::SymInt(st)}, {"dtype", t}});
  };
  EXPECT_EQ(values(ar(0, 5, 1, DType::I64)), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(values(ar(1, 8, 3, DType::F32)), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(values(ar(5, 0, -2, DType::I32)), (std::vector<double>{5, 3, 1}));
  EXPECT_EQ(ar(5, 0, 1, DType::I64).int_sizes(), IntVec{0});
  EXPECT_EQ(values(pt::arange(4)), (std::vector<double>{0, 1, 2, 3}));
  EXPECT_THROW(ar(0, 4, 0, DType::I64), pt::ValueError);
}

// ---- numerics helpers ------------------------------------------------------------------------------
TEST(OpsPointwise, AllcloseAndMaxAbsDiff) {
  Tensor a = pt::tensor<float>({1.f, 2.f, 3.f}, {3});
  Tensor b = pt::tensor<double>({1.0, 2.0 + 1e-7, 3.0}, {3});
  EXPECT_TRUE(pt::allclose(a, b));
  EXPECT_FALSE(pt::allclose(a, pt::tensor<float>({1.f, 2.1f, 3.f}, {3})));
  EXPECT_FALSE(pt::allclose(a, pt::tensor<float>({1.f, 2.f}, {2})));
  Tensor n = pt::tensor<float>({NAN, INFINITY}, {2});
  EXPECT_FALSE(pt::allclose(n, n));
  EXPECT_TRUE(pt::allclose(n, n, 1e-5, 1e-8, true));
  EXPECT_NEAR(pt::max_abs_diff(a, pt::tensor<float>({1.f, 2.5f, 2.f}, {3})), 1.0, 1e-12);
  // broadcasting
  EXPECT_NEAR(pt::max_abs_diff(make({2, 3}, DType::F32, kColMajor, [] { return 1.0; }), pt::scalar_tensor(3.0)), 2.0,
              1e-12);
  EXPECT_TRUE(std::isnan(pt::max_abs_diff(n, pt::tensor<float>({1.f, 2.f}, {2}))));
  EXPECT_THROW(pt::max_abs_diff(a, pt::zeros({4})), pt::ShapeError);
}
