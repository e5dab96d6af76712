// matmul / bmm / linear against plain float64 loops.
#include <gtest/gtest.h>

#include <cmath>
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

double tol(DType dt, int64_t k) {
  switch (dt) {
    case DType::F64: return 1e-10 * (k + 1);
    case DType::F32: return 1e-4 * std::sqrt(static_cast<double>(k + 1));
    case DType::F16: return 2e-2 * std::sqrt(static_cast<double>(k + 1));
    case DType::BF16: return 1e-1 * std::sqrt(static_cast<double>(k + 1));
    default: return 0.0;
  }
}

/// Reference torch.matmul on row-major value arrays with explicit shapes.
std::vector<double> ref_matmul(const IntVec& as0, const std::vector<double>& a, const IntVec& bs0,
                               const std::vector<double>& b, IntVec& out_shape) {
  IntVec as = as0, bs = bs0;
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  size_t nb = std::max(as.size(), bs.size()) - 2;
  IntVec ab(nb, 1), bb(nb, 1), ob(nb, 1);
  for (size_t i = 0; i + 2 < as.size(); ++i) ab[nb - (as.size() - 2) + i] = as[i];
  for (size_t i = 0; i + 2 < bs.size(); ++i) bb[nb - (bs.size() - 2) + i] = bs[i];
  for (size_t i = 0; i < nb; ++i) ob[i] = ab[i] == 1 ? bb[i] : ab[i];
  int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  int64_t B = numel_of(ob);
  std::vector<double> out(static_cast<size_t>(B * M * N), 0.0);
  for (int64_t bi = 0; bi < B; ++bi) {
    int64_t rem = bi, ai = 0, bj = 0, amul = 1, bmul = 1;
    for (size_t d = nb; d-- > 0;) {
      int64_t idx = rem % ob[d];
      rem /= ob[d];
      ai += (ab[d] == 1 ? 0 : idx) * amul;
      bj += (bb[d] == 1 ? 0 : idx) * bmul;
      amul *= ab[d];
      bmul *= bb[d];
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a[static_cast<size_t>((ai * M + i) * K + k)] * b[static_cast<size_t>((bj * K + k) * N + j)];
        out[static_cast<size_t>((bi * M + i) * N + j)] = s;
      }
  }
  out_shape = ob;
  if (!a1) out_shape.push_back(M);
  if (!b1) out_shape.push_back(N);
  return out;
}

void expect_close(const Tensor& got, const IntVec& shape, const std::vector<double>& want, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(got.int_sizes(), shape) << what;
  std::vector<double> g = values(got);
  ASSERT_EQ(g.size(), want.size()) << what;
  for (size_t i = 0; i < g.size(); ++i)
    ASSERT_NEAR(g[i], want[i], tolerance * (1 + std::abs(want[i]))) << what << " at " << i;
}

void expect_meta_matches(pt::ops::OpKind op, std::vector<Tensor> in, const Tensor& out) {
  auto metas = pt::ops::run_meta(op, in, {});
  ASSERT_EQ(metas.size(), 1u);
  EXPECT_EQ(pt::hints(metas[0].sizes), out.int_sizes());
  EXPECT_EQ(metas[0].dtype, out.dtype());
}

}  // namespace

TEST(OpsLinear, MatmulShapesAndBroadcastingF32) {
  const std::vector<std::pair<IntVec, IntVec>> cases = {
      {{5}, {5}},           {{3, 5}, {5}},          {{5}, {5, 4}},          {{3, 5}, {5, 4}},
      {{2, 3, 5}, {5, 4}},  {{2, 3, 5}, {5}},       {{5}, {2, 5, 4}},       {{2, 3, 5}, {2, 5, 4}},
      {{2, 1, 3, 5}, {4, 5, 6}}, {{1, 3, 5}, {7, 5, 2}}, {{0, 3, 5}, {5, 4}}, {{3, 0}, {0, 4}},
      {{1, 1}, {1, 1}},     {{4, 1}, {1, 6}},       {{2, 64, 70}, {70, 90}}, {{3, 40, 33}, {3, 33, 50}},
      {{1, 200}, {200, 300}}, {{2, 2, 3, 0}, {0, 4}}, {{3, 7}, {7, 0}}};
  for (const auto& [as, bs] : cases) {
    for (int layout = 0; layout < 3; ++layout) {
      auto av = random_values(numel_of(as), DType::F32), bv = random_values(numel_of(bs), DType::F32);
      IntVec pa, pb;
      int64_t gap = 1;
      if (layout == 1 && as.size() >= 2) {  // transposed inner matrices
        for (size_t i = 0; i < as.size(); ++i) pa.push_back(static_cast<int64_t>(i));
        std::swap(pa[as.size() - 1], pa[as.size() - 2]);
        for (size_t i = 0; i < bs.size(); ++i) pb.push_back(static_cast<int64_t>(i));
        if (bs.size() >= 2) std::swap(pb[bs.size() - 1], pb[bs.size() - 2]);
      }
      if (layout == 2) gap = 2;
      Tensor a = make(as, DType::F32, av, pa, gap), b = make(bs, DType::F32, bv, pb, gap);
      Tensor out = pt::matmul(a, b);
      IntVec oshape;
      auto want = ref_matmul(as, av, bs, bv, oshape);
      std::string what = pt::to_string(pt::to_symint_vec(as)) + " @ " + pt::to_string(pt::to_symint_vec(bs)) +
                         " layout " + std::to_string(layout);
      expect_close(out, oshape, want, tol(DType::F32, as.back()), what);
      expect_meta_matches(pt::ops::OpKind::matmul, {a, b}, out);
      EXPECT_EQ(out.dtype(), DType::F32);
    }
  }
}

TEST(OpsLinear, MatmulEveryDtype) {
  for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8}) {
    for (const auto& [as, bs] : std::vector<std::pair<IntVec, IntVec>>{{{3, 17}, {17, 5}}, {{2, 4, 9}, {2, 9, 3}},
                                                                        {{50, 40}, {40, 30}}, {{6}, {6}}}) {
      auto av = random_values(numel_of(as), dt), bv = random_values(numel_of(bs), dt);
      Tensor a = make(as, dt, av), b = make(bs, dt, bv);
      Tensor out = pt::matmul(a, b);
      IntVec oshape;
      auto want = ref_matmul(as, av, bs, bv, oshape);
      if (dt == DType::I8)
        for (auto& w : want) w = static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(w)));
      if (dt == DType::U8)
        for (auto& w : want) w = static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(w)));
      EXPECT_EQ(out.dtype(), dt);
      expect_close(out, oshape, want, tol(dt, as.back()), std::string(pt::short_name(dt)));
      expect_meta_matches(pt::ops::OpKind::matmul, {a, b}, out);
    }
  }
}

TEST(OpsLinear, MatmulRandomShapes) {
  std::uniform_int_distribution<int64_t> d(0, 6), big(1, 70), rank(1, 4);
  for (int it = 0; it < 60; ++it) {
    int64_t M = big(rng()), K = big(rng()), N = big(rng());
    int64_t ra = rank(rng()), rb = rank(rng());
    IntVec as, bs;
    IntVec batch{d(rng()) % 3 + 1, d(rng()) % 3 + 1};
    // batch dims are right-aligned: an operand with j batch dims takes the last j of `batch`
    for (int64_t i = 2; i < ra; ++i) as.push_back(rng()() % 2 ? batch[static_cast<size_t>(i - 2 + 4 - ra)] : 1);
    for (int64_t i = 2; i < rb; ++i) bs.push_back(rng()() % 2 ? batch[static_cast<size_t>(i - 2 + 4 - rb)] : 1);
    if (ra >= 2) as.push_back(M);
    as.push_back(K);
    bs.push_back(K);
    if (rb >= 2) bs.push_back(N);
    auto av = random_values(numel_of(as), DType::F32), bv = random_values(numel_of(bs), DType::F32);
    Tensor a = make(as, DType::F32, av, {}, it % 2 + 1), b = make(bs, DType::F32, bv);
    IntVec oshape;
    auto want = ref_matmul(as, av, bs, bv, oshape);
    expect_close(pt::matmul(a, b), oshape, want, tol(DType::F32, K), "random " + std::to_string(it));
  }
}

TEST(OpsLinear, Bmm) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::I32}) {
    IntVec as{3, 4, 20}, bs{3, 20, 6};
    auto av = random_values(numel_of(as), dt), bv = random_values(numel_of(bs), dt);
    Tensor a = make(as, dt, av, {2, 0, 1}), b = make(bs, dt, bv, {0, 2, 1});
    Tensor out = pt::bmm(a, b);
    IntVec oshape;
    auto want = ref_matmul(as, av, bs, bv, oshape);
    expect_close(out, oshape, want, tol(dt, 20), "bmm");
    expect_meta_matches(pt::ops::OpKind::bmm, {a, b}, out);
  }
  Tensor e = pt::bmm(pt::empty({0, 3, 4}), pt::empty({0, 4, 5}));
  EXPECT_EQ(e.int_sizes(), (IntVec{0, 3, 5}));
}

TEST(OpsLinear, LinearWithAndWithoutBias) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64}) {
    for (const IntVec& xs : {IntVec{7}, IntVec{4, 7}, IntVec{2, 3, 7}, IntVec{0, 7}, IntVec{33, 7}}) {
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        IntVec ws{5, 7};
        auto xv = random_values(numel_of(xs), dt), wv = random_values(35, dt), bv = random_values(5, dt);
        Tensor x = make(xs, dt, xv, {}, 2), w = make(ws, dt, wv, {1, 0});
        Tensor b = with_bias ? make({5}, dt, bv) : Tensor();
        Tensor out = pt::linear(x, w, b);
        // reference: x · wᵀ + b
        int64_t rows = numel_of(xs) / 7;
        std::vector<double> want(static_cast<size_t>(rows * 5));
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < 5; ++o) {
            double s = with_bias ? bv[static_cast<size_t>(o)] : 0.0;
            for (int64_t k = 0; k < 7; ++k) s += xv[static_cast<size_t>(r * 7 + k)] * wv[static_cast<size_t>(o * 7 + k)];
            want[static_cast<size_t>(r * 5 + o)] = s;
          }
        IntVec oshape(xs.begin(), xs.end() - 1);
        oshape.push_back(5);
        expect_close(out, oshape, want, tol(dt, 8), std::string("linear ") + std::string(pt::short_name(dt)));
        expect_meta_matches(pt::ops::OpKind::linear, {x, w, b}, out);
      }
    }
  }
}

TEST(OpsLinear, LinearLargeUsesLibraryWithBias) {
  IntVec xs{2, 40, 120};
  auto xv = random_values(numel_of(xs), DType::F32), wv = random_values(96 * 120, DType::F32),
       bv = random_values(96, DType::F32);
  Tensor x = make(xs, DType::F32, xv), w = make({96, 120}, DType::F32, wv), b = make({96}, DType::F32, bv);
  Tensor out = pt::linear(x, w, b);
  std::vector<double> want(80 * 96);
  for (int64_t r = 0; r < 80; ++r)
    for (int64_t o = 0; o < 96; ++o) {
      double s = bv[static_cast<size_t>(o)];
      for (int64_t k = 0; k < 120; ++k) s += xv[static_cast<size_t>(r * 120 + k)] * wv[static_cast<size_t>(o * 120 + k)];
      want[static_cast<size_t>(r * 96 + o)] = s;
    }
  expect_close(out, {2, 40, 96}, want, tol(DType::F32, 120), "linear large");
  // A 1-D weight gives a dot product per row.
  Tensor w1 = make({120}, DType::F32, std::vector<double>(wv.begin(), wv.begin() + 120));
  Tensor o1 = pt::linear(x, w1);
  EXPECT_EQ(o1.int_sizes(), (IntVec{2, 40}));
}

TEST(OpsLinear, Errors) {
  auto expect_msg = [](auto fn, const char* op) {
    try {
      fn();
      FAIL() << "no exception for " << op;
    } catch (const pt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  EXPECT_THROW(pt::matmul(pt::empty({2, 3}), pt::empty({4, 5})), pt::ShapeError);
  EXPECT_THROW(pt::matmul(pt::empty({2, 3}), pt::empty({3, 5}, DType::F64)), pt::TypeError);
  EXPECT_THROW(pt::matmul(pt::empty({}), pt::empty({3})), pt::ShapeError);
  EXPECT_THROW(pt::matmul(pt::empty({2, 3, 4}), pt::empty({3, 4, 5})), pt::ShapeError);
  EXPECT_THROW(pt::matmul(pt::empty({2, 3}, DType::Bool), pt::empty({3, 2}, DType::Bool)), pt::TypeError);
  EXPECT_THROW(pt::bmm(pt::empty({2, 3, 4}), pt::empty({3, 4, 5})), pt::ShapeError);
  EXPECT_THROW(pt::bmm(pt::empty({3, 4}), pt::empty({4, 5})), pt::ShapeError);
  EXPECT_THROW(pt::linear(pt::empty({2, 3}), pt::empty({4, 5})), pt::ShapeError);
  EXPECT_THROW(pt::linear(pt::empty({2, 3}), pt::empty({4, 3}), pt::empty({5})), pt::ShapeError);
  expect_msg([] { pt::matmul(pt::empty({2, 3}), pt::empty({4, 5})); }, "matmul");
  expect_msg([] { pt::bmm(pt::empty({2, 3, 4}), pt::empty({2, 5, 4})); }, "bmm");
  expect_msg([] { pt::linear(pt::empty({2, 3}), pt::empty({4, 3}), pt::empty({3})); }, "linear");
}
