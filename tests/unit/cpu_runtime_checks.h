// Checks of the cpu runtime header shared by the two translation units that include it (generic
// vector forms, and -mavx512f): each includes prelude.h first, then this file.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace runtime_checks {

/// Distance in units in the last place between two floats of the same sign.
inline int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return ia > ib ? int64_t(ia) - ib : int64_t(ib) - ia;
}

/// Sample points over [lo, hi], both ends included.
inline std::vector<float> grid(float lo, float hi, int n) {
  std::vector<float> v;
  for (int i = 0; i <= n; ++i) v.push_back(lo + (hi - lo) * float(i) / float(n));
  return v;
}

inline void scalar_functions() {
  for (float x : grid(-80.0f, 80.0f, 4001)) {
    const float want = static_cast<float>(std::exp(double(x)));
    EXPECT_LE(ulps(pt::exp(x), want), 1) << "exp(" << x << ")";
  }
  for (float x : grid(-6.0f, 6.0f, 2401)) {
    EXPECT_NEAR(pt::erf(x), std::erf(double(x)), 5e-7) << "erf(" << x << ")";
    EXPECT_LE(ulps(pt::tanh(x), static_cast<float>(std::tanh(double(x)))), 2) << "tanh(" << x << ")";
    EXPECT_NEAR(pt::normal_cdf(x), 0.5 * std::erfc(-double(x) / std::sqrt(2.0)), 2e-7) << "normal_cdf(" << x << ")";
    EXPECT_NEAR(pt::sigmoid(x), 1.0 / (1.0 + std::exp(-double(x))), 1e-7) << "sigmoid(" << x << ")";
  }
  EXPECT_EQ(pt::exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(pt::exp(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(pt::exp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(pt::tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(pt::erf(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_EQ(pt::round(2.5f), 2.0f);  // half to even, like the eager kernels
  EXPECT_EQ(pt::sign(-3), -1);
  EXPECT_EQ(pt::imax(3, -4), 3);
  EXPECT_EQ(pt::imin(3, -4), -4);
}

inline void nan_propagation() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(pt::maxn(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(pt::maxn(1.0f, nan)));
  EXPECT_TRUE(std::isnan(pt::minn(nan, 1.0f)));
  EXPECT_TRUE(std::isnan(pt::relu(nan)));
  EXPECT_TRUE(std::isnan(pt::exp(nan)));
  EXPECT_TRUE(std::isnan(pt::tanh(nan)));
  EXPECT_TRUE(std::isnan(pt::erf(nan)));
  EXPECT_TRUE(std::isnan(pt::normal_cdf(nan)));
  EXPECT_EQ(pt::maxn(2, 5), 5);
  const pt::vf v = pt::vmaxn(pt::vbf(nan), pt::vbf(1.0f));
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(v[i]));
  const pt::vf r = pt::v_relu(pt::vbf(nan));
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(r[i]));
}

/// Every vector form against its scalar form, lane by lane, on 16-value blocks over [-12, 12] plus
/// the special values.
inline void vector_forms() {
  std::vector<float> xs = grid(-12.0f, 12.0f, 16 * 64 - 1);
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.0f, -0.0f, inf, -inf, 1e-30f, -1e-30f, 88.5f, -103.0f, 5.5f, -5.8f, 0.624f, 0.626f,
                  std::numeric_limits<float>::quiet_NaN(), 1.0f, -1.0f, 0.5f})
    xs.push_back(s);
  auto same = [](float a, float b, float tol) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
    if (a == b) return true;
    return std::fabs(a - b) <= tol * std::fmax(1.0f, std::fabs(b));
  };
  for (size_t i = 0; i + 16 <= xs.size(); i += 16) {
    const pt::vf x = pt::vld(&xs[i]);
    const pt::vf e = pt::v_exp(x), t = pt::v_tanh(x), s = pt::v_sigmoid(x), c = pt::v_normal_cdf(x), f = pt::v_erf(x);
    const pt::vf a = pt::v_abs(x), g = pt::v_sign(x), q = pt::v_sqrt(pt::v_abs(x));
    for (int l = 0; l < 16; ++l) {
      const float v = xs[i + l];
      // the AVX-512 exp applies 2^n with one rounding where the scalar form builds it in two factors
      EXPECT_TRUE(same(e[l], pt::exp(v), 2e-7f)) << "v_exp(" << v << ") = " << e[l] << " vs " << pt::exp(v);
      EXPECT_TRUE(same(t[l], pt::tanh(v), 3e-7f)) << "v_tanh(" << v << ")";
      EXPECT_TRUE(same(s[l], pt::sigmoid(v), 3e-7f)) << "v_sigmoid(" << v << ")";
      EXPECT_TRUE(same(c[l], pt::normal_cdf(v), 0.0f)) << "v_normal_cdf(" << v << ")";
      EXPECT_TRUE(same(f[l], pt::erf(v), 0.0f)) << "v_erf(" << v << ")";
      EXPECT_TRUE(same(a[l], pt::abs(v), 0.0f)) << "v_abs(" << v << ")";
      EXPECT_TRUE(same(g[l], std::isnan(v) ? 0.0f : float((v > 0) - (v < 0)), 0.0f)) << "v_sign(" << v << ")";
      EXPECT_TRUE(same(q[l], pt::sqrt(pt::abs(v)), 0.0f)) << "v_sqrt(" << v << ")";
    }
  }
  // masks and selects
  const pt::vm m = pt::vbm(true);
  const pt::vf sel = pt::vsel(m, pt::vbf(1.0f), pt::vbf(2.0f));
  const pt::vf of = pt::vof(m);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(sel[l], 1.0f);
    EXPECT_EQ(of[l], 1.0f);
  }
  const pt::vf fm = pt::vfma(pt::vbf(3.0f), pt::vbf(1.0f / 3.0f), pt::vbf(-1.0f));
  EXPECT_EQ(fm[0], __builtin_fmaf(3.0f, 1.0f / 3.0f, -1.0f)) << "vfma rounds once";
}

}  // namespace runtime_checks
