// bitwise_* (and, or, xor, not, shifts with out-of-range counts, logical right shift), linalg_det
// (pivoting, singular, batched, n = 0), scatter_reduce (sum / prod / amax / amin, include_self, NaN,
// bad index) and lstm's peephole weights: values checked by hand in the comments.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::Tensor;

namespace {

TEST(Bitwise, AndOrXorNotOnIntegersAndBool) {
  Tensor a = pt::tensor<int32_t>({12, -1, 5}, {3}), b = pt::tensor<int32_t>({10, 7, 0}, {3});
  EXPECT_EQ(pt::bitwise_and(a, b).to_vector<int64_t>(), (std::vector<int64_t>{8, 7, 0}));    // 1100 & 1010
  EXPECT_EQ(pt::bitwise_or(a, b).to_vector<int64_t>(), (std::vector<int64_t>{14, -1, 5}));
  EXPECT_EQ(pt::bitwise_xor(a, b).to_vector<int64_t>(), (std::vector<int64_t>{6, -8, 5}));   // -1 ^ 7 = ~7
  EXPECT_EQ(pt::bitwise_not(a).to_vector<int64_t>(), (std::vector<int64_t>{-13, 0, -6}));
  Tensor u = pt::tensor<uint8_t>({0x0F, 0xF0}, {2});
  EXPECT_EQ(pt::bitwise_not(u).to_vector<int64_t>(), (std::vector<int64_t>{0xF0, 0x0F}));
  EXPECT_EQ(pt::bitwise_not(u).dtype(), DType::U8);
  Tensor t = pt::tensor<bool>({true, false}, {2});
  EXPECT_EQ(pt::bitwise_xor(t, pt::tensor<bool>({true, true}, {2})).to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  // broadcasting: [2, 1] with [3]
  Tensor c = pt::bitwise_and(pt::tensor<int64_t>({1, 2}, {2, 1}), pt::tensor<int64_t>({1, 2, 3}, {3}));
  EXPECT_EQ(c.int_sizes(), (pt::IntVec{2, 3}));
  EXPECT_EQ(c.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 1, 0, 2, 2}));
  EXPECT_THROW(pt::bitwise_and(a, pt::tensor<int64_t>({1, 2, 3}, {3})), pt::TypeError);  // no promotion
  EXPECT_THROW(pt::bitwise_not(pt::tensor<float>({1.f}, {1})), pt::TypeError);
}

TEST(Bitwise, ShiftsDefineOutOfRangeCountsAndLogicalRightShift) {
  Tensor x = pt::tensor<int64_t>({1, 1, 1, -8, -8}, {5}), c = pt::tensor<int64_t>({3, 63, 64, 1, 70}, {5});
  EXPECT_EQ(pt::bitwise_left_shift(x, c).to_vector<int64_t>(),
            (std::vector<int64_t>{8, std::numeric_limits<int64_t>::min(), 0, -16, 0}));
  // arithmetic: -8 >> 1 = -4, a count past the width is the sign fill
  EXPECT_EQ(pt::bitwise_right_shift(x, c).to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 0, -4, -1}));
  // logical: -8 is 0xFFFFFFFFFFFFFFF8, >> 1 = 0x7FFFFFFFFFFFFFFC
  EXPECT_EQ(pt::bitwise_right_shift(x, c, true).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 0, 0, 0x7FFFFFFFFFFFFFFC, 0}));
  Tensor u = pt::tensor<uint8_t>({0x81, 0x81}, {2}), k = pt::tensor<uint8_t>({1, 7}, {2});
  EXPECT_EQ(pt::bitwise_left_shift(u, k).to_vector<int64_t>(), (std::vector<int64_t>{0x02, 0x80}));  // wraps at 8 bits
  EXPECT_EQ(pt::bitwise_right_shift(u, k).to_vector<int64_t>(), (std::vector<int64_t>{0x40, 0x01}));
  EXPECT_THROW(pt::bitwise_left_shift(pt::tensor<bool>({true}, {1}), pt::tensor<bool>({true}, {1})), pt::TypeError);
}

TEST(LinalgDet, PivotsSingularBatchedAndEmpty) {
  // [[1, 2], [3, 4]]: -2.  [[0, 1], [1, 0]]: a zero first pivot, one swap: -1.
  Tensor a = pt::tensor<double>({1, 2, 3, 4, 0, 1, 1, 0}, {2, 2, 2});
  std::vector<double> d = pt::linalg_det(a).to_vector<double>();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_NEAR(d[0], -2.0, 1e-12);
  EXPECT_NEAR(d[1], -1.0, 1e-12);
  // [[0, 2, 1], [1, 1, 1], [2, 1, 3]]: 0(3 - 1) - 2(3 - 2) + 1(1 - 2) = -3
  EXPECT_NEAR(pt::linalg_det(pt::tensor<float>({0, 2, 1, 1, 1, 1, 2, 1, 3}, {3, 3})).to_vector<double>()[0], -3.0, 1e-6);
  // rows 1 and 3 equal: singular
  EXPECT_EQ(pt::linalg_det(pt::tensor<float>({1, 2, 3, 4, 5, 6, 1, 2, 3}, {3, 3})).to_vector<double>()[0], 0.0);
  Tensor e = pt::linalg_det(pt::zeros({4, 0, 0}, DType::F32));
  EXPECT_EQ(e.int_sizes(), (pt::IntVec{4}));
  EXPECT_EQ(e.to_vector<double>(), (std::vector<double>{1, 1, 1, 1}));
  EXPECT_EQ(pt::linalg_det(a.to(DType::F32)).dtype(), DType::F32);
  EXPECT_THROW(pt::linalg_det(pt::tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3})), pt::ShapeError);
  EXPECT_THROW(pt::linalg_det(pt::tensor<int64_t>({1, 2, 3, 4}, {2, 2})), pt::TypeError);
}

TEST(ScatterReduce, EveryReductionWithAndWithoutSelf) {
  Tensor x = pt::tensor<float>({1, 2, 3, 4}, {4}), idx = pt::tensor<int64_t>({0, 0, 2}, {3});
  Tensor src = pt::tensor<float>({5, 6, 7}, {3});
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "sum").to_vector<double>(), (std::vector<double>{12, 2, 10, 4}));
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "prod").to_vector<double>(), (std::vector<double>{30, 2, 21, 4}));
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "amax").to_vector<double>(), (std::vector<double>{6, 2, 7, 4}));
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "amin").to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "sum", false).to_vector<double>(), (std::vector<double>{11, 2, 7, 4}));
  EXPECT_EQ(pt::scatter_reduce(x, 0, idx, src, "amin", false).to_vector<double>(), (std::vector<double>{5, 2, 7, 4}));
  // 2-D along dim 1, negative index: row 0 gets 10 at col 2 (via -1), row 1 multiplies col 0 by 3
  Tensor x2 = pt::tensor<int64_t>({1, 1, 1, 2, 2, 2}, {2, 3});
  Tensor y2 = pt::scatter_reduce(x2, 1, pt::tensor<int64_t>({-1, 0}, {2, 1}), pt::tensor<int64_t>({10, 3}, {2, 1}), "prod");
  EXPECT_EQ(y2.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 10, 6, 2, 2}));
  // NaN wins amax
  Tensor yn = pt::scatter_reduce(x, 0, pt::tensor<int64_t>({1}, {1}), pt::tensor<float>({NAN}, {1}), "amax");
  EXPECT_TRUE(std::isnan(yn.to_vector<double>()[1]));
  EXPECT_THROW(pt::scatter_reduce(x, 0, pt::tensor<int64_t>({4}, {1}), pt::tensor<float>({1}, {1}), "sum"), pt::ValueError);
  EXPECT_THROW(pt::scatter_reduce(x, 0, idx, src, "mean"), pt::ValueError);
}

TEST(LstmPeepholes, GatesSeeTheCellState) {
  // T = N = I = H = 1, W = R = B = 0, h0 = 0, c0 = 1, P = (p_i, p_o, p_f) = (1, 1, 1):
  // i = f = σ(1 · c0) = 0.7310585786, c̃ = tanh(0) = 0, c = f · c0 = 0.7310585786,
  // o = σ(1 · c) = 0.6750375273, h = o · tanh(c) = 0.4210293774.
  Tensor X = pt::tensor<double>({1}, {1, 1, 1}), W = pt::zeros({1, 4, 1}, DType::F64);
  Tensor R = pt::zeros({1, 4, 1}, DType::F64);
  Tensor h0 = pt::tensor<double>({0}, {1, 1, 1}), c0 = pt::tensor<double>({1}, {1, 1, 1});
  Tensor P = pt::tensor<double>({1, 1, 1}, {1, 3});
  auto [Y, Yh, Yc] = pt::lstm(X, W, R, {}, h0, c0, "forward", P);
  EXPECT_NEAR(Yc.to_vector<double>()[0], 0.7310585786300049, 1e-12);
  EXPECT_NEAR(Yh.to_vector<double>()[0], 0.421029377428353, 1e-12);
  EXPECT_NEAR(Y.to_vector<double>()[0], 0.421029377428353, 1e-12);
  // without P the same inputs give i = f = o = 0.5: c = 0.5, h = 0.5 tanh(0.5) = 0.2310585786
  auto [Y0, Yh0, Yc0] = pt::lstm(X, W, R, {}, h0, c0);
  EXPECT_NEAR(Yh0.to_vector<double>()[0], 0.5 * std::tanh(0.5), 1e-12);
  EXPECT_THROW(pt::lstm(X, W, R, {}, h0, c0, "forward", pt::tensor<double>({1, 1}, {1, 2})), pt::ShapeError);
}

}  // namespace
