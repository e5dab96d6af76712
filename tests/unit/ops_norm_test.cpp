// Normalization ops (softmax, log_softmax, layer_norm, rms_norm, batch_norm, group_norm) against
// float64 references written out plainly, over dims, layouts, dtypes, optional weight/bias and edge
// cases (-inf masks, size-0 batches), plus error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>

#include "ops/registry.h"
#include "protean/protean.h"
#include "ops_test_util.h"

namespace norm_test {

using namespace ops_test;  // reference helpers: ops_test_util.h

pt::SymIntVec sv(const IntVec& v) { return pt::to_symint_vec(v); }

/// Reference softmax / log_softmax of row-major values of shape s along dim d.
std::vector<double> ref_softmax(const std::vector<double>& v, const IntVec& s, int64_t d, bool log) {
  int64_t O = 1, R = s.empty() ? 1 : s[static_cast<size_t>(d)], I = 1;
  for (int64_t k = 0; k < d; ++k) O *= s[static_cast<size_t>(k)];
  for (size_t k = static_cast<size_t>(d) + 1; k < s.size(); ++k) I *= s[k];
  std::vector<double> out(v.size());
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i) {
      auto at = [&](int64_t r) { return static_cast<size_t>((o * R + r) * I + i); };
      double mx = -INFINITY;
      for (int64_t r = 0; r < R; ++r) mx = std::max(mx, v[at(r)]);
      if (std::isinf(mx) && mx < 0) mx = 0;
      double sum = 0;
      for (int64_t r = 0; r < R; ++r) sum += std::exp(v[at(r)] - mx);
      for (int64_t r = 0; r < R; ++r)
        out[at(r)] = log ? v[at(r)] - mx - std::log(sum) : std::exp(v[at(r)] - mx) / sum;
    }
  return out;
}

}  // namespace norm_test
using namespace norm_test;

TEST(OpsNorm, SoftmaxAndLogSoftmaxEveryDim) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const IntVec& s : {IntVec{3, 4, 5}, IntVec{7}, IntVec{2, 1, 9}, IntVec{0, 3}, IntVec{}, IntVec{4, 33}})
      for (Layout l : {kContig, kColMajor, kStrided})
        for (int64_t d = -static_cast<int64_t>(std::max<size_t>(s.size(), 1)); d < static_cast<int64_t>(std::max<size_t>(s.size(), 1)); ++d)
          for (bool log : {false, true}) {
            Tensor x = make(s, t, l, uniform(-6, 6));
            OpKind op = log ? OpKind::log_softmax : OpKind::softmax;
            Tensor y = run(op, {x}, {{"dim", pt::SymInt(d)}});
            EXPECT_EQ(y.dtype(), t);
            int64_t dd = s.empty() ? 0 : (d < 0 ? d + static_cast<int64_t>(s.size()) : d);
            expect_values(y, ref_softmax(values(x), s, dd, log),
                          std::string(pt::ops::op_name(op)) + " " + std::string(pt::short_name(t)) + " " +
                              pt::to_string(sv(s)) + " dim " + std::to_string(d) + " layout " + std::to_string(l),
                          4 * rtol_of(t));
          }
}

TEST(OpsNorm, SoftmaxLongRowsMasksAndExtremes) {
  // rows of 4096 (the benchmark shape) with -inf masked entries and large magnitudes
  const int64_t rows = 8, n = 4096;
  int64_t k = 0;
  Tensor x = make({rows, n}, DType::F32, kContig, [&]() {
    int64_t i = k++;
    if (i % 7 == 3) return -std::numeric_limits<double>::infinity();
    return std::uniform_real_distribution<double>(-80, 80)(rng());
  });
  auto xv = values(x);
  expect_values(pt::softmax(x, -1), ref_softmax(xv, {rows, n}, 1, false), "softmax 4096", 1e-6);
  expect_values(pt::log_softmax(x, 1), ref_softmax(xv, {rows, n}, 1, true), "log_softmax 4096", 1e-5);
  auto sm = values(pt::softmax(x, -1));
  EXPECT_EQ(sm[3], 0.0);  // exp(-inf) is exactly 0
  // an all -inf row gives NaN (0/0) like torch; a NaN anywhere in a row poisons the row
  Tensor m = pt::tensor<float>({-INFINITY, -INFINITY, 1.f, NAN}, {2, 2});
  auto mv = values(pt::softmax(m, 1));
  EXPECT_TRUE(std::isnan(mv[0]) && std::isnan(mv[1]) && std::isnan(mv[2]) && std::isnan(mv[3]));
  // inputs far outside exp's range
  Tensor big = pt::tensor<float>({1000.f, 0.f, -1000.f}, {3});
  auto bv = values(pt::softmax(big, 0));
  EXPECT_NEAR(bv[0], 1.0, 1e-7);
  EXPECT_EQ(bv[2], 0.0);
}

// log_softmax of large values (ONNX's LogSoftmax tests, logits of a big model): (x - max) - log(sum)
// keeps the small results exact; x - (max + log(sum)) loses log(sum) to the rounding of max + log(sum)
// (about 1e-3 at 1e4 in f32). Both the fast last-dim path and the strided path.
TEST(OpsNorm, LogSoftmaxOfLargeValuesIsAccurate) {
  for (float base : {1e4f, -3e4f, 2e5f}) {
    std::vector<float> v;
    for (int i = 0; i < 64; ++i) v.push_back(base + static_cast<float>(i % 5) * 0.75f);
    Tensor x = pt::tensor<float>(v, {2, 32});
    std::vector<double> xv = values(x);
    expect_values(pt::log_softmax(x, 1), ref_softmax(xv, {2, 32}, 1, true), "log_softmax last dim", 2e-6);
    expect_values(pt::log_softmax(x, 0), ref_softmax(xv, {2, 32}, 0, true), "log_softmax dim 0", 2e-6);
  }
}

TEST(OpsNorm, LayerNormAndRmsNorm) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const auto& [s, ns] : std::vector<std::pair<IntVec, IntVec>>{
             {{4, 10}, {10}}, {{2, 3, 8}, {3, 8}}, {{5}, {5}}, {{0, 6}, {6}}, {{3, 1}, {1}}, {{2, 2, 64}, {64}}})
      for (Layout l : {kContig, kStrided})
        for (int wb = 0; wb < 4; ++wb) {
          Tensor x = make(s, t, l, uniform(-3, 5));
          Tensor w = wb & 1 ? make(ns, t, kContig, uniform(0.5, 1.5)) : Tensor();
          Tensor b = wb & 2 ? make(ns, t, kColMajor, uniform(-1, 1)) : Tensor();
          int64_t N = numel_of(ns), rows = N ? numel_of(s) / N : 0;
          auto xv = values(x);
          std::vector<double> wv = w.defined() ? values(w) : std::vector<double>(), bv = b.defined() ? values(b) : std::vector<double>();
          const double eps = 1e-5;
          std::vector<double> ref_ln, ref_rms;
          for (int64_t r = 0; r < rows; ++r) {
            double mean = 0, ms = 0;
            for (int64_t i = 0; i < N; ++i) mean += xv[static_cast<size_t>(r * N + i)];
            mean /= static_cast<double>(N);
            double var = 0;
            for (int64_t i = 0; i < N; ++i) {
              double d = xv[static_cast<size_t>(r * N + i)] - mean;
              var += d * d;
              ms += xv[static_cast<size_t>(r * N + i)] * xv[static_cast<size_t>(r * N + i)];
            }
            var /= static_cast<double>(N);
            ms /= static_cast<double>(N);
            double rms_eps = t == DType::F64 ? std::numeric_limits<double>::epsilon()
                             : t == DType::F32 ? std::numeric_limits<float>::epsilon()
                             : t == DType::F16 ? 0.0009765625 : 0.0078125;
            for (int64_t i = 0; i < N; ++i) {
              double v = xv[static_cast<size_t>(r * N + i)];
              double wi = w.defined() ? wv[static_cast<size_t>(i)] : 1, bi = b.defined() ? bv[static_cast<size_t>(i)] : 0;
              ref_ln.push_back((v - mean) / std::sqrt(var + eps) * wi + bi);
              ref_rms.push_back(v / std::sqrt(ms + rms_eps) * wi);
            }
          }
          std::string what = std::string(pt::short_name(t)) + " " + pt::to_string(sv(s)) + " wb " + std::to_string(wb);
          Tensor y = run(OpKind::layer_norm, {x, w, b}, {{"normalized_shape", sv(ns)}, {"eps", eps}});
          EXPECT_EQ(y.dtype(), t);
          expect_values(y, ref_ln, "layer_norm " + what, 8 * rtol_of(t));
          Tensor z = run(OpKind::rms_norm, {x, w}, {{"normalized_shape", sv(ns)}});
          expect_values(z, ref_rms, "rms_norm " + what, 8 * rtol_of(t));
        }
  // explicit rms eps through the public API
  Tensor x = pt::tensor<float>({3.f, 4.f}, {1, 2});
  auto v = values(pt::rms_norm(x, {2}, {}, 0.5));
  EXPECT_NEAR(v[0], 3.0 / std::sqrt(12.5 + 0.5), 1e-6);
  // accuracy with a large mean (one-pass sums in double)
  Tensor off = make({2, 4096}, DType::F32, kContig, uniform(1000, 1001));
  auto ov = values(off);
  double mean = 0, var = 0;
  for (int i = 0; i < 4096; ++i) mean += ov[static_cast<size_t>(i)];
  mean /= 4096;
  for (int i = 0; i < 4096; ++i) var += (ov[static_cast<size_t>(i)] - mean) * (ov[static_cast<size_t>(i)] - mean);
  var /= 4096;
  auto lv = values(pt::layer_norm(off, {4096}));
  EXPECT_NEAR(lv[7], (ov[7] - mean) / std::sqrt(var + 1e-5), 2e-3);
}

TEST(OpsNorm, BatchNormInference) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const IntVec& s : {IntVec{2, 3, 4, 5}, IntVec{4, 3}, IntVec{1, 3, 7}, IntVec{0, 3, 2}})
      for (int wb = 0; wb < 4; ++wb) {
        Tensor x = make(s, t, kStrided, uniform(-2, 2));
        Tensor rm = make({3}, t, kContig, uniform(-1, 1)), rv = make({3}, DType::F32, kStrided, uniform(0.5, 2));
        Tensor w = wb & 1 ? make({3}, t, kContig, uniform(0.5, 1.5)) : Tensor();
        Tensor b = wb & 2 ? make({3}, t, kContig, uniform(-1, 1)) : Tensor();
        Tensor y = run(OpKind::batch_norm, {x, w, b, rm, rv}, {{"eps", 1e-3}});
        EXPECT_EQ(y.dtype(), t);
        auto xv = values(x), mv = values(rm), vv = values(rv);
        auto wv = w.defined() ? values(w) : std::vector<double>(3, 1.0), bv = b.defined() ? values(b) : std::vector<double>(3, 0.0);
        std::vector<double> ref;
        size_t k = 0;
        for_each_index(s, [&](const IntVec& idx) {
          size_t c = static_cast<size_t>(idx[1]);
          ref.push_back((xv[k++] - mv[c]) / std::sqrt(vv[c] + 1e-3) * wv[c] + bv[c]);
        });
        expect_values(y, ref, "batch_norm " + std::string(pt::short_name(t)) + " " + pt::to_string(sv(s)), 8 * rtol_of(t));
      }
}

TEST(OpsNorm, GroupNorm) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const auto& [s, g] : std::vector<std::pair<IntVec, int64_t>>{
             {{2, 6, 5}, 3}, {{1, 4, 3, 3}, 2}, {{3, 4}, 4}, {{2, 6, 5}, 1}, {{0, 4, 2}, 2}})
      for (int wb = 0; wb < 4; ++wb) {
        Tensor x = make(s, t, kColMajor, uniform(-2, 3));
        int64_t C = s[1];
        Tensor w = wb & 1 ? make({C}, t, kContig, uniform(0.5, 1.5)) : Tensor();
        Tensor b = wb & 2 ? make({C}, t, kContig, uniform(-1, 1)) : Tensor();
        Tensor y = run(OpKind::group_norm, {x, w, b}, {{"groups", pt::SymInt(g)}, {"eps", 1e-5}});
        auto xv = values(x);
        auto wv = w.defined() ? values(w) : std::vector<double>(static_cast<size_t>(C), 1.0);
        auto bv = b.defined() ? values(b) : std::vector<double>(static_cast<size_t>(C), 0.0);
        int64_t N = s[0], S = numel_of(s) / std::max<int64_t>(1, N * C), Cg = C / g, len = Cg * S;
        std::vector<double> ref(xv.size());
        for (int64_t n = 0; n < N; ++n)
          for (int64_t gi = 0; gi < g; ++gi) {
            size_t base = static_cast<size_t>((n * g + gi) * len);
            double mean = 0, var = 0;
            for (int64_t i = 0; i < len; ++i) mean += xv[base + static_cast<size_t>(i)];
            mean /= static_cast<double>(len);
            for (int64_t i = 0; i < len; ++i) var += std::pow(xv[base + static_cast<size_t>(i)] - mean, 2);
            var /= static_cast<double>(len);
            for (int64_t i = 0; i < len; ++i) {
              size_t c = static_cast<size_t>(gi * Cg + i / S);
              ref[base + static_cast<size_t>(i)] = (xv[base + static_cast<size_t>(i)] - mean) / std::sqrt(var + 1e-5) * wv[c] + bv[c];
            }
          }
        expect_values(y, ref, "group_norm " + std::string(pt::short_name(t)) + " " + pt::to_string(sv(s)), 8 * rtol_of(t));
      }
}

TEST(OpsNorm, ErrorsNameTheOp) {
  Tensor x = pt::zeros({2, 6});
  auto expect_msg = [](auto fn, const char* op) {
    try {
      fn();
      ADD_FAILURE() << "expected an error from " << op;
    } catch (const pt::Error& e) {
      EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
    }
  };
  EXPECT_THROW(pt::layer_norm(x, {5}), pt::ShapeError);
  expect_msg([&] { pt::layer_norm(x, {5}); }, "layer_norm");
  EXPECT_THROW(pt::layer_norm(x, {6}, pt::zeros({5})), pt::ShapeError);
  EXPECT_THROW(pt::rms_norm(x, {2, 6, 1}), pt::ShapeError);
  EXPECT_THROW(pt::group_norm(pt::zeros({2, 6, 3}), 4), pt::ValueError);
  expect_msg([&] { pt::group_norm(pt::zeros({2, 6, 3}), 4); }, "group_norm");
  EXPECT_THROW(pt::softmax(pt::tensor<int64_t>({1, 2}, {2}), 0), pt::TypeError);
  expect_msg([&] { pt::softmax(pt::tensor<int64_t>({1, 2}, {2}), 0); }, "softmax");
  EXPECT_THROW(pt::softmax(x, 2), pt::ValueError);
  EXPECT_THROW(pt::batch_norm(x, {}, {}, pt::zeros({5}), pt::ones({5})), pt::ShapeError);
  EXPECT_THROW(pt::batch_norm(pt::zeros({4}), {}, {}, pt::zeros({4}), pt::ones({4})), pt::ShapeError);
  EXPECT_THROW(pt::batch_norm(x, {}, {}, {}, {}), pt::ValueError);
}
