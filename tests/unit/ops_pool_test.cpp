// max_pool2d / avg_pool2d / adaptive_avg_pool2d / upsample_nearest2d / upsample_bilinear2d / pad
// against plain float64 loops.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;

namespace {

std::mt19937_64& rng() {
  static std::mt19937_64 g(1234);
  return g;
}

int64_t numel_of(const IntVec& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

/// Reads element `flat` (row-major logical index) of a strided tensor as double.
std::vector<double> values(const Tensor& t) {
  IntVec sz = t.int_sizes(), st = t.int_strides();
  int64_t n = numel_of(sz);
  std::vector<double> out(static_cast<size_t>(n));
  pt::dispatch_dtype(t.dtype(), [&]<typename T>() {
    const T* p = n ? t.data_ptr<T>() : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (size_t d = sz.size(); d-- > 0;) {
        off += (rem % sz[d]) * st[d];
        rem /= sz[d];
      }
      out[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(p[off]));
      if constexpr (std::is_same_v<T, double> || std::is_same_v<T, int64_t>) out[static_cast<size_t>(i)] = static_cast<double>(p[off]);
    }
  });
  return out;
}

/// A tensor with the given logical values laid out in memory in `perm` order with a gap of `gap`
/// between innermost elements (so it is non-contiguous whenever perm is not identity or gap > 1).
Tensor make(const IntVec& sizes, DType dt, const std::vector<double>& v, IntVec perm = {}, int64_t gap = 1) {
  size_t r = sizes.size();
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(i));
  // memory order: dims perm[0] outermost ... perm[r-1] innermost
  IntVec strides(r, 0);
  int64_t acc = gap;
  for (size_t k = r; k-- > 0;) {
    strides[static_cast<size_t>(perm[k])] = acc;
    acc *= std::max<int64_t>(sizes[static_cast<size_t>(perm[k])], 1);
  }
  Tensor base = pt::empty({acc}, dt);
  Tensor t = pt::ops::make_view(base, pt::TensorMeta{pt::to_symint_vec(sizes), pt::to_symint_vec(strides), 0, dt});
  int64_t n = numel_of(sizes);
  pt::dispatch_dtype(dt, [&]<typename T>() {
    T* p = base.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) {
      int64_t rem = i, off = 0;
      for (size_t d = r; d-- > 0;) {
        off += (rem % sizes[d]) * strides[d];
        rem /= sizes[d];
      }
      if constexpr (std::is_same_v<T, pt::Half> || std::is_same_v<T, pt::BFloat16>)
        p[off] = T(static_cast<float>(v[static_cast<size_t>(i)]));
      else
        p[off] = static_cast<T>(v[static_cast<size_t>(i)]);
    }
  });
  return t;
}

std::vector<double> random_values(int64_t n, DType dt) {
  std::vector<double> v(static_cast<size_t>(n));
  std::uniform_int_distribution<int> di(-3, 3);
  std::normal_distribution<double> dn(0.0, 1.0);
  for (auto& x : v) {
    if (pt::is_floating(dt)) {
      x = dn(rng());
      if (dt == DType::F16) x = static_cast<float>(pt::Half(static_cast<float>(x)));
      if (dt == DType::BF16) x = static_cast<float>(pt::BFloat16(static_cast<float>(x)));
      if (dt == DType::F32) x = static_cast<float>(x);
    } else {
      x = dt == DType::U8 ? std::abs(di(rng())) : di(rng());
    }
  }
  return v;
}

void expect_close(const Tensor& got, const IntVec& shape, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.int_sizes(), shape) << what;
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(want[i])) {
      ASSERT_TRUE(std::isnan(g[i])) << what << " at " << i;
      continue;
    }
    ASSERT_NEAR(g[i], want[i], tol * (1 + std::abs(want[i]))) << what << " at " << i;
  }
}

double dtol(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-12;
    case DType::F32: return 1e-5;
    case DType::F16: return 2e-3;
    case DType::BF16: return 1e-2;
    default: return 0.0;
  }
}

/// PyTorch's pooling output size, written out plainly.
int64_t pool_out(int64_t L, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  int64_t num = L + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (o - 1) * s >= L + p) --o;
  return o;
}

struct PoolCase {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  bool ceil = false, cip = true;
};

std::vector<double> ref_pool(const PoolCase& c, const std::vector<double>& x, bool is_max, bool integer,
                             int64_t& OH, int64_t& OW) {
  OH = pool_out(c.H, c.kh, c.sh, c.ph, c.dh, c.ceil);
  OW = pool_out(c.W, c.kw, c.sw, c.pw, c.dw, c.ceil);
  std::vector<double> y;
  for (int64_t p = 0; p < c.N * c.C; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        if (is_max) {
          double m = -std::numeric_limits<double>::infinity();
          for (int64_t i = 0; i < c.kh; ++i)
            for (int64_t j = 0; j < c.kw; ++j) {
              int64_t h = oh * c.sh - c.ph + i * c.dh, w = ow * c.sw - c.pw + j * c.dw;
              if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
              double v = x[static_cast<size_t>((p * c.H + h) * c.W + w)];
              if (std::isnan(v) || v > m) m = v;
              if (std::isnan(m)) break;
            }
          y.push_back(m);
        } else {
          int64_t h0 = oh * c.sh - c.ph, w0 = ow * c.sw - c.pw;
          int64_t h1 = std::min(h0 + c.kh, c.H + c.ph), w1 = std::min(w0 + c.kw, c.W + c.pw);
          int64_t full = (h1 - h0) * (w1 - w0);
          double sum = 0;
          int64_t cnt = 0;
          for (int64_t h = std::max<int64_t>(h0, 0); h < std::min(h1, c.H); ++h)
            for (int64_t w = std::max<int64_t>(w0, 0); w < std::min(w1, c.W); ++w) {
              sum += x[static_cast<size_t>((p * c.H + h) * c.W + w)];
              ++cnt;
            }
          int64_t div = c.cip ? full : cnt;
          y.push_back(integer ? static_cast<double>(static_cast<int64_t>(sum) / div) : sum / static_cast<double>(div));
        }
      }
  return y;
}

void check_pool(const PoolCase& c, DType dt, bool is_max, bool noncontig) {
  auto xv = random_values(c.N * c.C * c.H * c.W, dt);
  Tensor x = make({c.N, c.C, c.H, c.W}, dt, xv, noncontig ? IntVec{0, 2, 3, 1} : IntVec{}, noncontig ? 2 : 1);
  Tensor y = is_max ? pt::max_pool2d(x, {c.kh, c.kw}, {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw}, c.ceil)
                    : pt::avg_pool2d(x, {c.kh, c.kw}, {c.sh, c.sw}, {c.ph, c.pw}, c.ceil, c.cip);
  int64_t OH, OW;
  auto want = ref_pool(c, xv, is_max, !pt::is_floating(dt), OH, OW);
  std::string what = std::string(is_max ? "max" : "avg") + "_pool2d " + std::string(pt::short_name(dt)) + " H" +
                     std::to_string(c.H) + " W" + std::to_string(c.W) + " k" + std::to_string(c.kh) + "x" +
                     std::to_string(c.kw) + " s" + std::to_string(c.sh) + "," + std::to_string(c.sw) + " p" +
                     std::to_string(c.ph) + "," + std::to_string(c.pw) + " ceil " + std::to_string(c.ceil) +
                     " cip " + std::to_string(c.cip);
  expect_close(y, {c.N, c.C, OH, OW}, want, dtol(dt), what);
  pt::ops::Attrs attrs{{"kernel_size", pt::to_symint_vec({c.kh, c.kw})}, {"stride", pt::to_symint_vec({c.sh, c.sw})},
                       {"padding", pt::to_symint_vec({c.ph, c.pw})}, {"ceil_mode", c.ceil}};
  if (is_max) attrs.set("dilation", pt::to_symint_vec({c.dh, c.dw}));
  else attrs.set("count_include_pad", c.cip);
  auto metas = pt::ops::run_meta(is_max ? pt::ops::OpKind::max_pool2d : pt::ops::OpKind::avg_pool2d,
                                 std::vector<Tensor>{x}, attrs);
  EXPECT_EQ(pt::hints(metas[0].sizes), y.int_sizes()) << what;
  EXPECT_EQ(metas[0].dtype, y.dtype());
}

}  // namespace

TEST(OpsPool, MaxAndAvgFixedCases) {
  std::vector<PoolCase> cases = {
      {1, 2, 6, 6, 2, 2, 2, 2, 0, 0},
      {2, 3, 7, 9, 3, 3, 2, 2, 1, 1},
      {1, 1, 5, 5, 3, 3, 2, 2, 1, 1, 1, 1, true, true},    // ceil_mode: last window would start in padding
      {1, 1, 5, 5, 3, 3, 2, 2, 1, 1, 1, 1, true, false},
      {1, 2, 6, 7, 2, 2, 2, 2, 0, 0, 1, 1, true, true},    // ceil adds a partial window
      {1, 2, 8, 25, 2, 2, 2, 1, 0, 0, 1, 1, false, true},  // PP-OCR rec style asymmetric stride
      {1, 1, 1, 1, 1, 1, 1, 1, 0, 0},                      // 1x1
      {0, 3, 4, 4, 2, 2, 2, 2, 0, 0},                      // empty batch
      {2, 2, 9, 8, 3, 2, 3, 1, 1, 1, 1, 1, true, false},
      {1, 3, 10, 11, 4, 3, 3, 2, 2, 1, 1, 1, true, true},
  };
  for (const auto& c : cases)
    for (int is_max = 0; is_max < 2; ++is_max)
      for (int nc = 0; nc < 2; ++nc) check_pool(c, DType::F32, is_max, nc);
}

TEST(OpsPool, MaxPoolDilation) {
  check_pool({1, 2, 11, 12, 3, 3, 2, 1, 1, 2, 2, 3, false}, DType::F32, true, false);
  check_pool({1, 2, 11, 12, 3, 2, 2, 3, 2, 1, 2, 2, true}, DType::F32, true, true);
}

TEST(OpsPool, Dtypes) {
  PoolCase c{2, 3, 7, 8, 3, 3, 2, 2, 1, 1, 1, 1, true, false};
  for (DType dt : {DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8, DType::I8})
    check_pool(c, dt, true, dt == DType::F64);
  for (DType dt : {DType::F64, DType::F16, DType::BF16, DType::I64}) check_pool(c, dt, false, false);
}

TEST(OpsPool, RandomShapes) {
  std::uniform_int_distribution<int64_t> k(1, 4), s(1, 3), sp(1, 12);
  for (int it = 0; it < 60; ++it) {
    PoolCase c{};
    c.N = it % 9 == 0 ? 0 : 1 + it % 2;
    c.C = 1 + it % 3;
    c.kh = k(rng());
    c.kw = k(rng());
    c.sh = s(rng());
    c.sw = s(rng());
    c.dh = 1;
    c.dw = 1;
    bool is_max = it % 2 == 0;
    if (is_max && it % 4 == 0) {
      c.dh = s(rng());
      c.dw = s(rng());
    }
    c.ph = std::uniform_int_distribution<int64_t>(0, ((c.kh - 1) * c.dh + 1) / 2)(rng());
    c.pw = std::uniform_int_distribution<int64_t>(0, ((c.kw - 1) * c.dw + 1) / 2)(rng());
    if (!is_max) {
      c.ph = std::min(c.ph, c.kh / 2);
      c.pw = std::min(c.pw, c.kw / 2);
    }
    c.H = sp(rng()) + (c.kh - 1) * c.dh;
    c.W = sp(rng()) + (c.kw - 1) * c.dw;
    c.ceil = it % 3 == 0;
    c.cip = it % 5 != 0;
    check_pool(c, DType::F32, is_max, it % 2 == 1);
  }
}

TEST(OpsPool, MaxPoolPropagatesNan) {
  std::vector<double> v{1, std::nan(""), 3, 4};
  Tensor x = make({1, 1, 2, 2}, DType::F32, v);
  Tensor y = pt::max_pool2d(x, {2, 2});
  EXPECT_TRUE(std::isnan(values(y)[0]));
}

// The input gradient of max_pool2d against a float64 loop: each window routes its output gradient to the first
// maximum, or to the first NaN of a window holding one. Values drawn from a few integers make ties common;
// windows inside the plane and windows crossing the padding, overlapping and dilated windows, a strided input.
TEST(OpsPool, MaxPoolBackwardRoutesToTheFirstMaximumOrNan) {
  struct Case {
    int64_t kh, kw, sh, sw, ph, pw, dh, dw, H, W;
  };
  // 2x2 / stride 2 in f32 takes the vector kernel (ops/pool2x2.h): rows of 4, 14, 16 and 21 windows
  // (masked tails, a full vector plus a tail), odd H and W (a row and a column no window covers)
  const Case cases[] = {{2, 2, 2, 2, 0, 0, 1, 1, 8, 8},   {2, 2, 2, 2, 0, 0, 1, 1, 7, 9},  {3, 3, 2, 2, 1, 1, 1, 1, 7, 6},
                        {3, 2, 1, 2, 1, 0, 2, 1, 9, 8},   {2, 3, 3, 1, 1, 1, 1, 2, 6, 10}, {2, 2, 2, 2, 0, 0, 1, 1, 28, 28},
                        {2, 2, 2, 2, 0, 0, 1, 1, 5, 32},  {2, 2, 2, 2, 0, 0, 1, 1, 4, 43}};
  std::uniform_int_distribution<int> pick(0, 3), nan_draw(0, 24);
  int it = 0;
  for (DType dt : {DType::F32, DType::F64})
    for (const Case& c : cases) {
      const int64_t N = 2, C = 3;
      std::vector<double> xv(static_cast<size_t>(N * C * c.H * c.W));
      for (double& v : xv) v = nan_draw(rng()) == 0 ? std::nan("") : static_cast<double>(pick(rng()));
      // every other case reads x through a channels-last layout
      Tensor x = it++ % 2 ? make({N, C, c.H, c.W}, dt, xv, {0, 2, 3, 1}) : make({N, C, c.H, c.W}, dt, xv);
      x.requires_grad_();
      Tensor y = pt::max_pool2d(x, {c.kh, c.kw}, {c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw}, false);
      const IntVec ys = y.int_sizes();
      const int64_t OH = ys[2], OW = ys[3];
      // the forward: each window's maximum over its in-bounds elements, NaN when one is NaN
      const std::vector<double> yv = values(y);
      for (int64_t p = 0; p < N * C; ++p)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double m = -std::numeric_limits<double>::infinity();
            bool nan = false;
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t h = oh * c.sh - c.ph + i * c.dh, w = ow * c.sw - c.pw + j * c.dw;
                if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
                const double v = xv[static_cast<size_t>(p * c.H * c.W + h * c.W + w)];
                nan |= std::isnan(v);
                m = std::max(m, v);
              }
            const double got_y = yv[static_cast<size_t>((p * OH + oh) * OW + ow)];
            if (nan) ASSERT_TRUE(std::isnan(got_y)) << "case " << it;
            else ASSERT_EQ(got_y, m) << "case " << it;
          }
      std::vector<double> gv = random_values(numel_of(ys), dt);
      y.backward(make(ys, dt, gv));
      std::vector<double> want(xv.size(), 0.0);
      for (int64_t p = 0; p < N * C; ++p)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            int64_t best = -1;
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const int64_t h = oh * c.sh - c.ph + i * c.dh, w = ow * c.sw - c.pw + j * c.dw;
                if (h < 0 || h >= c.H || w < 0 || w >= c.W) continue;
                const int64_t at = p * c.H * c.W + h * c.W + w;
                const double v = xv[static_cast<size_t>(at)];
                if (best >= 0 && std::isnan(xv[static_cast<size_t>(best)])) continue;
                if (best < 0 || std::isnan(v) || v > xv[static_cast<size_t>(best)]) best = at;
              }
            ASSERT_GE(best, 0);
            want[static_cast<size_t>(best)] += gv[static_cast<size_t>((p * OH + oh) * OW + ow)];
          }
      std::vector<double> got = values(x.grad());
      const double tol = dt == DType::F32 ? 1e-5 : 1e-12;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], tol) << "case " << it << " element " << i;
    }
}

TEST(OpsPool, UnbatchedInput) {
  auto xv = random_values(2 * 5 * 5, DType::F32);
  Tensor x = make({2, 5, 5}, DType::F32, xv);
  Tensor y = pt::avg_pool2d(x, {2, 2});
  EXPECT_EQ(y.int_sizes(), (IntVec{2, 2, 2}));
  int64_t OH, OW;
  auto want = ref_pool({1, 2, 5, 5, 2, 2, 2, 2, 0, 0}, xv, false, false, OH, OW);
  expect_close(y, {2, 2, 2}, want, 1e-6, "unbatched avg");
}

TEST(OpsPool, AdaptiveAvgPool) {
  for (auto [H, W, OH, OW] : std::vector<std::array<int64_t, 4>>{{7, 9, 3, 4}, {5, 5, 1, 1}, {4, 6, 4, 6}, {3, 2, 5, 7},
                                                                 {10, 1, 3, 1}, {1, 80, 1, 40}}) {
    for (DType dt : {DType::F32, DType::F64, DType::BF16}) {
      auto xv = random_values(2 * 3 * H * W, dt);
      Tensor x = make({2, 3, H, W}, dt, xv, {1, 0, 3, 2});
      Tensor y = pt::adaptive_avg_pool2d(x, {OH, OW});
      std::vector<double> want;
      for (int64_t p = 0; p < 6; ++p)
        for (int64_t i = 0; i < OH; ++i)
          for (int64_t j = 0; j < OW; ++j) {
            int64_t h0 = static_cast<int64_t>(std::floor(static_cast<double>(i * H) / OH));
            int64_t h1 = static_cast<int64_t>(std::ceil(static_cast<double>((i + 1) * H) / OH));
            int64_t w0 = static_cast<int64_t>(std::floor(static_cast<double>(j * W) / OW));
            int64_t w1 = static_cast<int64_t>(std::ceil(static_cast<double>((j + 1) * W) / OW));
            double s = 0;
            for (int64_t h = h0; h < h1; ++h)
              for (int64_t w = w0; w < w1; ++w) s += xv[static_cast<size_t>((p * H + h) * W + w)];
            want.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
          }
      expect_close(y, {2, 3, OH, OW}, want, dtol(dt) * 10, "adaptive " + std::to_string(H) + "x" + std::to_string(W));
    }
  }
  EXPECT_EQ(pt::adaptive_avg_pool2d(pt::empty({0, 3, 4, 4}), {2, 2}).int_sizes(), (IntVec{0, 3, 2, 2}));
}

TEST(OpsPool, UpsampleNearest) {
  for (auto [H, W, OH, OW] : std::vector<std::array<int64_t, 4>>{{4, 5, 8, 10}, {5, 7, 3, 4}, {3, 3, 7, 2}, {1, 1, 3, 3},
                                                                 {6, 4, 6, 4}}) {
    for (DType dt : {DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool}) {
      auto xv = random_values(2 * 2 * H * W, dt);
      if (dt == DType::Bool)
        for (auto& v : xv) v = v > 0 ? 1 : 0;
      Tensor x = make({2, 2, H, W}, dt, xv, {0, 1, 3, 2}, 2);
      Tensor y = pt::upsample_nearest2d(x, {OH, OW});
      std::vector<double> want;
      for (int64_t p = 0; p < 4; ++p)
        for (int64_t i = 0; i < OH; ++i)
          for (int64_t j = 0; j < OW; ++j) {
            int64_t h = std::min(i * H / OH, H - 1), w = std::min(j * W / OW, W - 1);
            want.push_back(xv[static_cast<size_t>((p * H + h) * W + w)]);
          }
      expect_close(y, {2, 2, OH, OW}, want, 0.0, "nearest");
      auto metas = pt::ops::run_meta(pt::ops::OpKind::upsample_nearest2d, std::vector<Tensor>{x},
                                     {{"output_size", pt::SymIntVec{OH, OW}}});
      EXPECT_EQ(pt::hints(metas[0].sizes), y.int_sizes());
    }
  }
}

TEST(OpsPool, UpsampleBilinear) {
  auto axis = [](int64_t in, int64_t out, int64_t d, bool ac, int64_t& i0, int64_t& i1, double& l) {
    double src;
    if (ac) src = out > 1 ? static_cast<double>(d) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
    else src = std::max((static_cast<double>(d) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5, 0.0);
    i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    i1 = std::min(i0 + 1, in - 1);
    l = src - static_cast<double>(i0);
  };
  for (auto [H, W, OH, OW] : std::vector<std::array<int64_t, 4>>{{4, 5, 8, 10}, {5, 7, 3, 4}, {3, 3, 7, 2}, {1, 1, 3, 3},
                                                                 {6, 4, 1, 1}, {2, 9, 5, 9}}) {
    for (int ac = 0; ac < 2; ++ac)
      for (DType dt : {DType::F32, DType::F64, DType::F16}) {
        auto xv = random_values(1 * 3 * H * W, dt);
        Tensor x = make({1, 3, H, W}, dt, xv, {0, 2, 3, 1});
        Tensor y = pt::upsample_bilinear2d(x, {OH, OW}, ac);
        std::vector<double> want;
        for (int64_t p = 0; p < 3; ++p)
          for (int64_t i = 0; i < OH; ++i)
            for (int64_t j = 0; j < OW; ++j) {
              int64_t h0, h1, w0, w1;
              double lh, lw;
              axis(H, OH, i, ac, h0, h1, lh);
              axis(W, OW, j, ac, w0, w1, lw);
              auto at = [&](int64_t h, int64_t w) { return xv[static_cast<size_t>((p * H + h) * W + w)]; };
              want.push_back((1 - lh) * ((1 - lw) * at(h0, w0) + lw * at(h0, w1)) +
                             lh * ((1 - lw) * at(h1, w0) + lw * at(h1, w1)));
            }
        expect_close(y, {1, 3, OH, OW}, want, dt == DType::F16 ? 5e-3 : dt == DType::F32 ? 1e-5 : 1e-12,
                     "bilinear ac=" + std::to_string(ac) + " " + std::to_string(H) + "x" + std::to_string(W) + "->" +
                         std::to_string(OH) + "x" + std::to_string(OW));
      }
  }
}

/// Reference pad: source index for output index o of a dim, or -1 for the constant.
int64_t pad_src(int64_t o, int64_t lo, int64_t size, const std::string& mode) {
  int64_t p = o - lo;
  if (p >= 0 && p < size) return p;
  if (mode == "constant") return -1;
  if (mode == "reflect") return p < 0 ? -p : 2 * (size - 1) - p;
  return p < 0 ? 0 : size - 1;
}

TEST(OpsPool, Pad) {
  struct Case {
    IntVec shape;
    IntVec pads;
    std::string mode;
  };
  std::vector<Case> cases = {
      {{2, 3, 4}, {1, 2}, "constant"},          {{2, 3, 4}, {1, 2, 0, 1}, "constant"},
      {{2, 3, 4}, {-1, 2, 1, -2}, "constant"},  {{2, 3, 4}, {1, 1, 1, 1, 1, 1}, "constant"},
      {{1, 2, 5, 6}, {2, 3, 1, 4}, "reflect"},  {{1, 2, 5, 6}, {0, 5, 4, 0}, "reflect"},
      {{1, 2, 5, 6}, {3, 1, 2, 6}, "replicate"}, {{1, 2, 5, 6}, {-2, 1, 1, -1}, "replicate"},
      {{3, 4}, {1, 1}, "reflect"},              {{0, 4}, {1, 1}, "constant"},
      {{2, 0}, {1, 2}, "constant"},             {{2, 1, 3}, {2, 2, 0, 0}, "replicate"},
      {{1, 1, 2, 2}, {1, 1, 1, 1}, "reflect"},
  };
  for (const auto& c : cases)
    for (DType dt : {DType::F32, DType::I64, DType::BF16, DType::Bool}) {
      auto xv = random_values(numel_of(c.shape), dt);
      if (dt == DType::Bool)
        for (auto& v : xv) v = v > 0 ? 1 : 0;
      IntVec perm;
      for (size_t i = 0; i < c.shape.size(); ++i) perm.push_back(static_cast<int64_t>(c.shape.size() - 1 - i));
      Tensor x = make(c.shape, dt, xv, perm);
      double value = dt == DType::Bool ? 1.0 : 2.5;
      Tensor y = pt::pad(x, pt::to_symint_vec(c.pads), c.mode, value);
      size_t r = c.shape.size();
      IntVec lo(r, 0), out = c.shape;
      for (size_t i = 0; i < c.pads.size() / 2; ++i) {
        lo[r - 1 - i] = c.pads[2 * i];
        out[r - 1 - i] += c.pads[2 * i] + c.pads[2 * i + 1];
      }
      double fill = dt == DType::I64 ? 2.0 : dt == DType::BF16 ? 2.5 : value;
      std::vector<double> want;
      for (int64_t i = 0; i < numel_of(out); ++i) {
        int64_t rem = i, src = 0, mul = 1;
        bool constant = false;
        for (size_t d = r; d-- > 0;) {
          int64_t o = rem % out[d];
          rem /= out[d];
          int64_t s = pad_src(o, lo[d], c.shape[d], c.mode);
          if (s < 0) constant = true;
          else src += s * mul;
          mul *= c.shape[d];
        }
        want.push_back(constant ? fill : xv[static_cast<size_t>(src)]);
      }
      expect_close(y, out, want, 0.0, "pad " + c.mode + " " + pt::to_string(pt::to_symint_vec(c.pads)) + " " +
                                          std::string(pt::short_name(dt)));
      auto metas = pt::ops::run_meta(pt::ops::OpKind::pad, std::vector<Tensor>{x},
                                     {{"pads", pt::to_symint_vec(c.pads)}, {"mode", c.mode}, {"value", value}});
      EXPECT_EQ(pt::hints(metas[0].sizes), y.int_sizes());
    }
}

TEST(OpsPool, Errors) {
  auto expect_msg = [](auto fn, const char* op) {
    try {
      fn();
      FAIL() << "no exception for " << op;
    } catch (const pt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  Tensor x = pt::empty({1, 2, 4, 4});
  EXPECT_THROW(pt::max_pool2d(x, {3, 3}, {1, 1}, {2, 2}), pt::ValueError);  // padding > half kernel
  EXPECT_THROW(pt::max_pool2d(x, {5, 5}), pt::ShapeError);                  // output too small
  EXPECT_THROW(pt::max_pool2d(pt::empty({4, 4}), {2, 2}), pt::ShapeError);
  EXPECT_THROW(pt::avg_pool2d(x, {2, 2}, {0, 1}), pt::ValueError);
  EXPECT_THROW(pt::avg_pool2d(pt::empty({1, 2, 4, 4}, DType::I32), {2, 2}), pt::TypeError);
  EXPECT_THROW(pt::max_pool2d(pt::empty({1, 2, 4, 4}, DType::Bool), {2, 2}), pt::TypeError);
  EXPECT_THROW(pt::adaptive_avg_pool2d(x, {0, 2}), pt::ValueError);
  EXPECT_THROW(pt::upsample_nearest2d(pt::empty({2, 4, 4}), {8, 8}), pt::ShapeError);
  EXPECT_THROW(pt::upsample_bilinear2d(pt::empty({1, 1, 4, 4}, DType::I64), {8, 8}), pt::TypeError);
  EXPECT_THROW(pt::upsample_bilinear2d(x, {0, 8}), pt::ValueError);
  EXPECT_THROW(pt::pad(x, {1, 2, 3}), pt::ValueError);
  EXPECT_THROW(pt::pad(x, {4, 0}, "reflect"), pt::ValueError);  // reflect needs pad < size
  EXPECT_THROW(pt::pad(x, {-3, -2}), pt::ShapeError);
  EXPECT_THROW(pt::pad(x, {1, 1}, "wrap"), pt::ValueError);
  expect_msg([&] { pt::max_pool2d(x, {5, 5}); }, "max_pool2d");
  expect_msg([&] { pt::avg_pool2d(x, {3, 3}, {1, 1}, {2, 2}); }, "avg_pool2d");
  expect_msg([&] { pt::pad(x, {4, 0}, "reflect"); }, "pad");
  expect_msg([&] { pt::upsample_bilinear2d(x, {0, 8}); }, "upsample_bilinear2d");
}
