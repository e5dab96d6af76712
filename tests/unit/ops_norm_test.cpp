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

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;
using pt::ops::Attrs;
using pt::ops::OpKind;

namespace norm_test {

// ---- helpers (independent of the kernels under test) ---------------------------------------------
enum Layout { kContig, kColMajor, kStrided };

double read_elem(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::Bool: return static_cast<const bool*>(base)[i];
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
    case DType::I8: return static_cast<const int8_t*>(base)[i];
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::F16: return static_cast<float>(static_cast<const pt::Half*>(base)[i]);
    case DType::BF16: return static_cast<float>(static_cast<const pt::BFloat16*>(base)[i]);
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
  }
  return 0;
}
void write_elem(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::Bool: static_cast<bool*>(base)[i] = v != 0; break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case DType::I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::F16: static_cast<pt::Half*>(base)[i] = pt::Half(static_cast<float>(v)); break;
    case DType::BF16: static_cast<pt::BFloat16*>(base)[i] = pt::BFloat16(static_cast<float>(v)); break;
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
  }
}
int64_t numel_of(const IntVec& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}
/// Row-major element values of any strided tensor, read through its strides.
std::vector<double> values(const Tensor& t) {
  IntVec sz = t.int_sizes(), st = t.int_strides();
  int64_t n = numel_of(sz);
  std::vector<double> out;
  if (n == 0) return out;
  const void* base = t.data_ptr();
  IntVec idx(sz.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < sz.size(); ++d) off += idx[d] * st[d];
    out.push_back(read_elem(base, t.dtype(), off));
    for (size_t d = sz.size(); d-- > 0;) {
      if (++idx[d] < sz[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}
/// A tensor with values from gen(), in the given layout (non-contiguous for kColMajor/kStrided).
Tensor make(const IntVec& sz, DType t, Layout layout, const std::function<double()>& gen) {
  const size_t r = sz.size();
  IntVec st(r);
  int64_t offset = 0, acc = 1;
  if (layout == kColMajor) {
    for (size_t d = 0; d < r; ++d) { st[d] = acc; acc *= std::max<int64_t>(sz[d], 1); }
  } else {
    int64_t step = layout == kStrided ? 2 : 1;
    acc = step;
    for (size_t d = r; d-- > 0;) { st[d] = acc; acc *= std::max<int64_t>(sz[d], 1); }
    offset = layout == kStrided ? 1 : 0;
  }
  int64_t extent = offset + acc + 1;
  auto* buf = new double[static_cast<size_t>(extent)];  // 8-byte aligned, large enough for any dtype
  char* base = reinterpret_cast<char*>(buf) + offset * static_cast<int64_t>(pt::itemsize(t));
  Tensor x = pt::from_blob(base, sz, t, st, [buf](void*) { delete[] buf; });
  int64_t n = numel_of(sz);
  IntVec idx(r, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t off = 0;
    for (size_t d = 0; d < r; ++d) off += idx[d] * st[d];
    write_elem(base, t, off, gen());
    for (size_t d = r; d-- > 0;) {
      if (++idx[d] < sz[d]) break;
      idx[d] = 0;
    }
  }
  return x;
}
std::mt19937_64& rng() {
  static std::mt19937_64 g(1234);
  return g;
}
std::function<double()> uniform(double lo, double hi, bool integer = false) {
  return [=]() {
    double v = std::uniform_real_distribution<double>(lo, hi)(rng());
    return integer ? std::floor(v) : v;
  };
}
bool is_float(DType t) { return pt::is_floating(t); }
double rtol_of(DType t) {
  switch (t) {
    case DType::F16: return 4e-3;
    case DType::BF16: return 2e-2;
    case DType::F32: return 2e-6;
    case DType::F64: return 1e-12;
    default: return 0;
  }
}
/// Expects `out` (any layout) to equal ref elementwise within the dtype's tolerance; NaNs must match.
void expect_values(const Tensor& out, const std::vector<double>& ref, const std::string& what, double atol = -1) {
  std::vector<double> got = values(out);
  ASSERT_EQ(got.size(), ref.size()) << what;
  double rt = rtol_of(out.dtype());
  double at = atol >= 0 ? atol : rt;
  for (size_t i = 0; i < ref.size(); ++i) {
    double g = got[i], r = ref[i];
    if (std::isnan(r)) {
      EXPECT_TRUE(std::isnan(g)) << what << " at " << i << ": got " << g << ", expected nan";
    } else if (std::isinf(r)) {
      EXPECT_EQ(g, r) << what << " at " << i;
    } else {
      EXPECT_NEAR(g, r, at + rt * std::fabs(r)) << what << " at " << i;
    }
    if (::testing::Test::HasFailure()) return;
  }
}
/// Rounds a double to what dtype t stores.
double round_to(double v, DType t) {
  double buf[1];
  write_elem(buf, t, 0, v);
  return read_elem(buf, t, 0);
}
/// Runs the op eagerly and checks the meta function's output metadata against the result.
Tensor run(OpKind op, std::vector<Tensor> in, const Attrs& attrs = {}) {
  auto outs = pt::ops::run_eager(op, in, attrs);
  auto metas = pt::ops::run_meta(op, in, attrs);
  EXPECT_EQ(outs.size(), metas.size());
  Tensor o = outs.at(0);
  EXPECT_EQ(pt::hints(metas[0].sizes), o.int_sizes()) << pt::ops::op_name(op);
  EXPECT_EQ(pt::hints(metas[0].strides), o.int_strides()) << pt::ops::op_name(op);
  EXPECT_EQ(metas[0].dtype, o.dtype()) << pt::ops::op_name(op);
  return o;
}
/// Row-major index into an input of shape `in` for output multi-index `idx` (broadcasting).
int64_t bcast_index(const IntVec& idx, const IntVec& in) {
  int64_t off = 0;
  size_t lead = idx.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : idx[lead + d]);
  return off;
}
IntVec bshape(const IntVec& a, const IntVec& b) {
  size_t n = std::max(a.size(), b.size());
  IntVec o(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    o[i] = x == 1 ? y : x;
  }
  return o;
}
/// For each output multi-index of `shape`, calls f(idx).
void for_each_index(const IntVec& shape, const std::function<void(const IntVec&)>& f) {
  int64_t n = numel_of(shape);
  IntVec idx(shape.size(), 0);
  for (int64_t k = 0; k < n; ++k) {
    f(idx);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}


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
