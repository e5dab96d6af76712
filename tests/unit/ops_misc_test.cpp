// gather, index_select, embedding, cumsum, scaled_dot_product_attention, lstm, nonzero: each against
// a float64 reference written as plain loops in this file; non-contiguous inputs, size-0 dims, dtypes,
// meta == eager metadata, error paths (bad index values named in the message).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;

namespace {

void for_each_index(const IntVec& sizes, const std::function<void(const IntVec&)>& f) {
  for (int64_t s : sizes)
    if (s == 0) return;
  IntVec idx(sizes.size(), 0);
  while (true) {
    f(idx);
    if (sizes.empty()) return;
    size_t d = sizes.size();
    while (true) {
      --d;
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

double at(const Tensor& t, const IntVec& idx) {
  IntVec st = t.int_strides();
  int64_t off = 0;
  for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * st[i];
  return pt::dispatch_dtype(t.dtype(), [&]<typename T>() -> double {
    T v = t.data_ptr<T>()[off];
    if constexpr (std::is_same_v<T, pt::Half> || std::is_same_v<T, pt::BFloat16>)
      return static_cast<float>(v);
    else
      return static_cast<double>(v);
  });
}

std::mt19937& rng() {
  static std::mt19937 g(42);
  return g;
}

/// Normal values as f64, converted to `dt` (values rounded to dt first so the f64 reference sees the
/// same inputs as the kernel).
Tensor randn_t(const IntVec& sizes, DType dt = DType::F32) {
  std::normal_distribution<double> nd;
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng());
  Tensor t = pt::tensor<double>(v, sizes);
  return dt == DType::F64 ? t : t.to(dt);
}

Tensor randint_t(int64_t lo, int64_t hi, const IntVec& sizes, DType dt = DType::I64) {
  std::uniform_int_distribution<int64_t> u(lo, hi - 1);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = u(rng());
  Tensor t = pt::tensor<int64_t>(v, sizes);
  return dt == DType::I64 ? t : t.to(dt);
}

void expect_meta_matches(pt::ops::OpKind op, const std::vector<Tensor>& in, const pt::ops::Attrs& attrs) {
  auto metas = pt::ops::run_meta(op, in, attrs);
  auto outs = pt::ops::run_eager(op, in, attrs);
  ASSERT_EQ(metas.size(), outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(pt::hints(metas[i].sizes), outs[i].int_sizes()) << pt::ops::op_name(op);
    EXPECT_EQ(metas[i].dtype, outs[i].dtype()) << pt::ops::op_name(op);
  }
}

template <typename E>
void expect_throw_with(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

double tol(DType dt) { return dt == DType::F16 ? 2e-2 : dt == DType::BF16 ? 8e-2 : dt == DType::F32 ? 1e-5 : 1e-12; }

}  // namespace

// ---- gather / index_select / embedding -----------------------------------------------------------------
TEST(OpsMisc, GatherMatchesReference) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::I32, DType::U8, DType::Bool}) {
    for (int64_t dim : {0, 1, -1}) {
      Tensor x = pt::transpose(randn_t({5, 4}, DType::F64).to(dt), 0, 1);  // [4, 5], non-contiguous
      int64_t d = dim < 0 ? dim + 2 : dim;
      IntVec isz = {3, 2};
      Tensor idx = randint_t(0, x.int_sizes()[static_cast<size_t>(d)], isz, dim == 1 ? DType::I32 : DType::I64);
      Tensor y = pt::gather(x, dim, idx);
      ASSERT_EQ(y.int_sizes(), isz);
      ASSERT_EQ(y.dtype(), dt);
      for_each_index(isz, [&](const IntVec& i) {
        IntVec j = i;
        j[static_cast<size_t>(d)] = static_cast<int64_t>(at(idx, i));
        EXPECT_EQ(at(y, i), at(x, j));
      });
      expect_meta_matches(pt::ops::OpKind::gather, {x, idx}, {{"dim", pt::SymInt(dim)}});
    }
  }
  Tensor x = randn_t({3, 4});
  expect_throw_with<pt::ValueError>([&] { pt::gather(x, 1, pt::tensor<int64_t>({0, 4}, {1, 2})); },
                                    {"gather", "index 4", "size 4"});
  expect_throw_with<pt::ValueError>([&] { pt::gather(x, 0, pt::tensor<int64_t>({-1}, {1, 1})); }, {"index -1"});
  EXPECT_THROW(pt::gather(x, 0, pt::tensor<float>({0.f}, {1, 1})), pt::TypeError);
  EXPECT_THROW(pt::gather(x, 0, pt::tensor<int64_t>({0}, {1})), pt::ShapeError);
  EXPECT_THROW(pt::gather(x, 0, pt::zeros({1, 5}, DType::I64)), pt::ShapeError);
  EXPECT_EQ(pt::gather(x, 0, pt::zeros({0, 2}, DType::I64)).int_sizes(), (IntVec{0, 2}));
}

TEST(OpsMisc, IndexSelectMatchesReference) {
  for (DType dt : {DType::F32, DType::BF16, DType::I64, DType::I8}) {
    Tensor x = pt::permute(randn_t({3, 4, 5}, DType::F64).to(dt), {2, 0, 1});  // [5, 3, 4]
    for (int64_t dim : {0, 1, 2, -1}) {
      int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor idx = randint_t(0, x.int_sizes()[static_cast<size_t>(d)], {6});
      Tensor y = pt::index_select(x, dim, idx);
      IntVec ys = x.int_sizes();
      ys[static_cast<size_t>(d)] = 6;
      ASSERT_EQ(y.int_sizes(), ys);
      for_each_index(ys, [&](const IntVec& i) {
        IntVec j = i;
        j[static_cast<size_t>(d)] = static_cast<int64_t>(at(idx, {i[static_cast<size_t>(d)]}));
        EXPECT_EQ(at(y, i), at(x, j));
      });
      expect_meta_matches(pt::ops::OpKind::index_select, {x, idx}, {{"dim", pt::SymInt(dim)}});
    }
  }
  Tensor x = randn_t({3, 4});
  EXPECT_EQ(pt::index_select(x, 1, pt::zeros({0}, DType::I64)).int_sizes(), (IntVec{3, 0}));
  EXPECT_EQ(pt::index_select(x, 0, pt::scalar_tensor(2, DType::I64)).int_sizes(), (IntVec{1, 4}));
  expect_throw_with<pt::ValueError>([&] { pt::index_select(x, 0, pt::tensor<int64_t>({0, 7}, {2})); },
                                    {"index_select", "index 7", "size 3"});
  EXPECT_THROW(pt::index_select(x, 0, pt::zeros({1, 1}, DType::I64)), pt::ShapeError);
}

TEST(OpsMisc, EmbeddingMatchesReference) {
  for (DType dt : {DType::F32, DType::F16, DType::F64}) {
    Tensor w = randn_t({10, 6}, dt);
    Tensor wt = pt::transpose(randn_t({6, 10}, dt), 0, 1);  // non-contiguous rows
    for (const Tensor& ww : {w, wt}) {
      Tensor idx = randint_t(0, 10, {2, 3});
      Tensor y = pt::embedding(ww, idx);
      ASSERT_EQ(y.int_sizes(), (IntVec{2, 3, 6}));
      for_each_index({2, 3, 6}, [&](const IntVec& i) {
        EXPECT_EQ(at(y, i), at(ww, {static_cast<int64_t>(at(idx, {i[0], i[1]})), i[2]}));
      });
      expect_meta_matches(pt::ops::OpKind::embedding, {ww, idx}, {});
    }
  }
  Tensor w = randn_t({4, 2});
  expect_throw_with<pt::ValueError>([&] { pt::embedding(w, pt::tensor<int64_t>({1, 9, 2}, {3})); },
                                    {"embedding", "index 9", "size 4"});
  EXPECT_EQ(pt::embedding(w, pt::zeros({0}, DType::I64)).int_sizes(), (IntVec{0, 2}));
  EXPECT_EQ(pt::embedding(w, pt::scalar_tensor(3, DType::I64)).int_sizes(), (IntVec{2}));
  EXPECT_THROW(pt::embedding(pt::zeros({4}), pt::zeros({1}, DType::I64)), pt::ShapeError);
}

// ---- cumsum -----------------------------------------------------------------------------------------------
TEST(OpsMisc, CumsumMatchesReference) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I8, DType::U8, DType::Bool}) {
    Tensor x = pt::is_floating(dt) ? randn_t({4, 3, 5}, dt) : randint_t(0, 3, {4, 3, 5}, dt);
    x = pt::permute(x, {1, 2, 0});  // [3, 5, 4]
    for (int64_t dim : {0, 1, 2, -1}) {
      int64_t d = dim < 0 ? dim + 3 : dim;
      Tensor y = pt::cumsum(x, dim);
      DType want = pt::is_floating(dt) ? dt : DType::I64;
      ASSERT_EQ(y.dtype(), want);
      ASSERT_EQ(y.int_sizes(), x.int_sizes());
      for_each_index(x.int_sizes(), [&](const IntVec& i) {
        double ref = 0;
        IntVec j = i;
        for (int64_t k = 0; k <= i[static_cast<size_t>(d)]; ++k) {
          j[static_cast<size_t>(d)] = k;
          ref += at(x, j);
        }
        EXPECT_NEAR(at(y, i), ref, tol(dt) * (1 + std::abs(ref))) << pt::short_name(dt);
      });
      expect_meta_matches(pt::ops::OpKind::cumsum, {x}, {{"dim", pt::SymInt(dim)}});
    }
  }
  EXPECT_EQ(pt::cumsum(pt::zeros({0, 3}), 0).int_sizes(), (IntVec{0, 3}));
  EXPECT_EQ(pt::cumsum(pt::scalar_tensor(2.5), 0).item<double>(), 2.5);
  EXPECT_THROW(pt::cumsum(pt::zeros({2}), 1), pt::ValueError);
}

// ---- scaled_dot_product_attention --------------------------------------------------------------------------
namespace {
/// Reference over [B, L, E] x [B, S, E] x [B, S, Ev] with an optional [L, S] additive/bool mask.
std::vector<double> sdpa_ref(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                             double scale) {
  IntVec qs = q.int_sizes(), ks = k.int_sizes(), vs = v.int_sizes();
  int64_t B = qs[0], L = qs[1], E = qs[2], S = ks[1], Ev = vs[2];
  std::vector<double> out(static_cast<size_t>(B * L * Ev), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> s(static_cast<size_t>(S));
      double mx = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        double acc = 0;
        for (int64_t e = 0; e < E; ++e) acc += at(q, {b, i, e}) * at(k, {b, j, e});
        acc *= scale;
        if (causal && j > i) acc = -INFINITY;
        if (mask.defined()) {
          double m = at(mask, {i, j});
          if (mask.dtype() == DType::Bool) {
            if (m == 0) acc = -INFINITY;
          } else {
            acc += m;
          }
        }
        s[static_cast<size_t>(j)] = acc;
        mx = std::max(mx, acc);
      }
      if (mx == -INFINITY) continue;  // fully masked row → zeros
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < Ev; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < S; ++j) acc += s[static_cast<size_t>(j)] / sum * at(v, {b, j, c});
        out[static_cast<size_t>((b * L + i) * Ev + c)] = acc;
      }
    }
  return out;
}
}  // namespace

TEST(OpsMisc, AttentionMatchesReference) {
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16}) {
    for (int variant = 0; variant < 5; ++variant) {
      int64_t B = 2, L = 3 + variant % 2, S = variant == 4 ? 3 : 5, E = 4, Ev = 3;
      Tensor q = randn_t({B, L, E}, dt), k = randn_t({B, S, E}, dt);
      Tensor v = pt::transpose(randn_t({B, Ev, S}, dt), 1, 2);  // non-contiguous
      Tensor mask;
      bool causal = variant == 1 || variant == 4;
      std::optional<double> scale;
      if (variant == 2) mask = randn_t({L, S}, dt);
      if (variant == 3) {
        std::vector<bool> keep;
        for (int64_t i = 0; i < L * S; ++i) keep.push_back((i % 3) != 1 && i != 0);
        keep[0] = false;
        mask = pt::tensor<bool>(keep, {L, S});
        scale = 0.3;
      }
      Tensor y = pt::scaled_dot_product_attention(q, k, v, mask, causal, scale);
      ASSERT_EQ(y.int_sizes(), (IntVec{B, L, Ev}));
      ASSERT_EQ(y.dtype(), dt);
      auto ref = sdpa_ref(q, k, v, mask, causal, scale ? *scale : 1.0 / std::sqrt(static_cast<double>(E)));
      std::vector<double> got = y.to_vector<double>();
      for (size_t i = 0; i < ref.size(); ++i)
        EXPECT_NEAR(got[i], ref[i], dt == DType::F16 ? 5e-3 : dt == DType::BF16 ? 3e-2 : 1e-5) << "dtype " << pt::short_name(dt) << " variant " << variant;
      expect_meta_matches(pt::ops::OpKind::scaled_dot_product_attention, {q, k, v, mask},
                          {{"is_causal", causal}});
    }
  }
}

TEST(OpsMisc, AttentionBroadcastsBatchAndChecks) {
  Tensor q = randn_t({2, 1, 3, 4}), k = randn_t({1, 5, 6, 4}), v = randn_t({1, 1, 6, 2});
  Tensor y = pt::scaled_dot_product_attention(q, k, v);
  EXPECT_EQ(y.int_sizes(), (IntVec{2, 5, 3, 2}));
  // spot-check one batch against the 3-D reference
  Tensor q1 = pt::select(q, 0, 1), k1 = pt::select(k, 0, 0), v1 = pt::select(v, 0, 0);
  auto ref = sdpa_ref(pt::expand(q1, {5, 3, 4}), k1, pt::expand(v1, {5, 6, 2}), Tensor(), false, 0.5);
  Tensor y1 = pt::select(y, 0, 1);
  std::vector<double> got = y1.to_vector<double>();
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(got[i], ref[i], 1e-5);
  EXPECT_THROW(pt::scaled_dot_product_attention(q, randn_t({1, 5, 6, 3}), v), pt::ShapeError);
  EXPECT_THROW(pt::scaled_dot_product_attention(q, k, randn_t({1, 1, 7, 2})), pt::ShapeError);
  EXPECT_THROW(pt::scaled_dot_product_attention(q, k, v, randn_t({3, 6}), true), pt::ValueError);
  EXPECT_THROW(pt::scaled_dot_product_attention(q, k, v, randn_t({4, 6})), pt::ShapeError);
  EXPECT_THROW(pt::scaled_dot_product_attention(q.to(DType::I32), k.to(DType::I32), v.to(DType::I32)), pt::TypeError);
  EXPECT_THROW(pt::scaled_dot_product_attention(q, k.to(DType::F64), v), pt::TypeError);
}

// ---- lstm -----------------------------------------------------------------------------------------------------
namespace {
struct LstmRef {
  std::vector<double> Y, Yh, Yc;
};
LstmRef lstm_ref(const Tensor& X, const Tensor& W, const Tensor& R, const Tensor& B, const std::vector<int64_t>& lens,
                 const Tensor& h0, const Tensor& c0, const std::string& dir) {
  IntVec xs = X.int_sizes();
  int64_t T = xs[0], N = xs[1], I = xs[2], H = W.int_sizes()[1] / 4, D = W.int_sizes()[0];
  LstmRef r;
  r.Y.assign(static_cast<size_t>(T * D * N * H), 0.0);
  r.Yh.assign(static_cast<size_t>(D * N * H), 0.0);
  r.Yc.assign(static_cast<size_t>(D * N * H), 0.0);
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> h(static_cast<size_t>(H)), c(static_cast<size_t>(H));
      for (int64_t j = 0; j < H; ++j) {
        h[static_cast<size_t>(j)] = h0.defined() ? at(h0, {d, n, j}) : 0;
        c[static_cast<size_t>(j)] = c0.defined() ? at(c0, {d, n, j}) : 0;
      }
      int64_t len = lens.empty() ? T : lens[static_cast<size_t>(n)];
      bool rev = dir == "reverse" || d == 1;
      for (int64_t s = 0; s < len; ++s) {
        int64_t t = rev ? len - 1 - s : s;
        std::vector<double> g(static_cast<size_t>(4 * H));
        for (int64_t r4 = 0; r4 < 4 * H; ++r4) {
          double acc = B.defined() ? at(B, {d, r4}) + at(B, {d, 4 * H + r4}) : 0;
          for (int64_t k = 0; k < I; ++k) acc += at(W, {d, r4, k}) * at(X, {t, n, k});
          for (int64_t k = 0; k < H; ++k) acc += at(R, {d, r4, k}) * h[static_cast<size_t>(k)];
          g[static_cast<size_t>(r4)] = acc;
        }
        for (int64_t j = 0; j < H; ++j) {
          // ONNX gate order: i, o, f, c
          double i_ = sig(g[static_cast<size_t>(j)]), o_ = sig(g[static_cast<size_t>(H + j)]);
          double f_ = sig(g[static_cast<size_t>(2 * H + j)]), c_ = std::tanh(g[static_cast<size_t>(3 * H + j)]);
          c[static_cast<size_t>(j)] = f_ * c[static_cast<size_t>(j)] + i_ * c_;
          h[static_cast<size_t>(j)] = o_ * std::tanh(c[static_cast<size_t>(j)]);
          r.Y[static_cast<size_t>(((t * D + d) * N + n) * H + j)] = h[static_cast<size_t>(j)];
        }
      }
      for (int64_t j = 0; j < H; ++j) {
        r.Yh[static_cast<size_t>((d * N + n) * H + j)] = h[static_cast<size_t>(j)];
        r.Yc[static_cast<size_t>((d * N + n) * H + j)] = c[static_cast<size_t>(j)];
      }
    }
  return r;
}

void expect_close(const Tensor& t, const std::vector<double>& ref, double tolerance, const std::string& what) {
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(got[i], ref[i], tolerance) << what << " at " << i;
}
}  // namespace

TEST(OpsMisc, LstmMatchesOnnxReference) {
  const int64_t T = 4, N = 3, I = 5, H = 2;
  for (std::string dir : {"forward", "reverse", "bidirectional"}) {
    int64_t D = dir == "bidirectional" ? 2 : 1;
    for (DType dt : {DType::F32, DType::F64, DType::F16}) {
      for (int variant = 0; variant < 2; ++variant) {
        Tensor X = randn_t({T, N, I}, dt), W = randn_t({D, 4 * H, I}, dt), R = randn_t({D, 4 * H, H}, dt);
        Tensor B, h0, c0;
        if (variant == 1) {
          B = randn_t({D, 8 * H}, dt);
          h0 = randn_t({D, N, H}, dt);
          c0 = pt::transpose(randn_t({D, H, N}, dt), 1, 2);  // non-contiguous
        }
        auto [Y, Yh, Yc] = pt::lstm(X, W, R, B, h0, c0, dir);
        ASSERT_EQ(Y.int_sizes(), (IntVec{T, D, N, H}));
        ASSERT_EQ(Yh.int_sizes(), (IntVec{D, N, H}));
        ASSERT_EQ(Yc.dtype(), dt);
        LstmRef ref = lstm_ref(X, W, R, B, {}, h0, c0, dir);
        double t = dt == DType::F16 ? 4e-3 : dt == DType::F32 ? 1e-6 : 1e-12;
        expect_close(Y, ref.Y, t, dir + " Y");
        expect_close(Yh, ref.Yh, t, dir + " Y_h");
        expect_close(Yc, ref.Yc, t, dir + " Y_c");
      }
    }
  }
}

TEST(OpsMisc, LstmSeqLens) {
  const int64_t T = 5, N = 3, I = 2, H = 3;
  for (std::string dir : {"forward", "bidirectional"}) {
    int64_t D = dir == "bidirectional" ? 2 : 1;
    Tensor X = randn_t({T, N, I}, DType::F64), W = randn_t({D, 4 * H, I}, DType::F64),
           R = randn_t({D, 4 * H, H}, DType::F64), B = randn_t({D, 8 * H}, DType::F64);
    std::vector<int64_t> lens = {5, 2, 0};
    Tensor sl = pt::tensor<int32_t>({5, 2, 0}, {N});
    Tensor in[] = {X, W, R, B, sl, Tensor(), Tensor(), Tensor()};
    auto outs = pt::ops::run_eager(pt::ops::OpKind::lstm, in,
                                   {{"hidden_size", pt::SymInt(H)}, {"direction", std::string(dir)}});
    LstmRef ref = lstm_ref(X, W, R, B, lens, Tensor(), Tensor(), dir);
    expect_close(outs[0], ref.Y, 1e-12, dir + " Y");
    expect_close(outs[1], ref.Yh, 1e-12, dir + " Y_h");
    expect_close(outs[2], ref.Yc, 1e-12, dir + " Y_c");
    Tensor bad[] = {X, W, R, B, pt::tensor<int64_t>({5, 6, 1}, {N}), Tensor(), Tensor(), Tensor()};
    expect_throw_with<pt::ValueError>(
        [&] { pt::ops::run_eager(pt::ops::OpKind::lstm, bad, {{"hidden_size", pt::SymInt(H)}, {"direction", dir}}); },
        {"lstm", "seq_lens[1] = 6"});
  }
}

TEST(OpsMisc, LstmErrors) {
  Tensor X = randn_t({2, 1, 3}), W = randn_t({1, 8, 3}), R = randn_t({1, 8, 2});
  EXPECT_THROW(pt::lstm(X, W, randn_t({1, 8, 3})), pt::ShapeError);
  EXPECT_THROW(pt::lstm(X, W, R, randn_t({1, 15})), pt::ShapeError);
  EXPECT_THROW(pt::lstm(X, W, R, {}, {}, {}, "sideways"), pt::ValueError);
  EXPECT_THROW(pt::lstm(X, W, R, {}, {}, {}, "bidirectional"), pt::ShapeError);  // W has D = 1
  EXPECT_THROW(pt::lstm(X.to(DType::F64), W, R), pt::TypeError);
  EXPECT_THROW(pt::lstm(randn_t({2, 3}), W, R), pt::ShapeError);
  // T = 0: empty Y, state = initial state
  auto [Y, Yh, Yc] = pt::lstm(randn_t({0, 1, 3}), W, R);
  EXPECT_EQ(Y.int_sizes(), (IntVec{0, 1, 1, 2}));
  EXPECT_EQ(Yh.to_vector<double>(), (std::vector<double>{0, 0}));
}

// ---- nonzero -----------------------------------------------------------------------------------------------
TEST(OpsMisc, NonzeroMatchesReference) {
  for (DType dt : {DType::F32, DType::F16, DType::I64, DType::U8, DType::Bool, DType::BF16}) {
    Tensor x = pt::permute(randint_t(0, 3, {3, 4, 2}, DType::I64).to(dt), {1, 0, 2});  // [4, 3, 2]
    Tensor y = pt::nonzero(x);
    ASSERT_EQ(y.dtype(), DType::I64);
    std::vector<int64_t> ref;
    for_each_index(x.int_sizes(), [&](const IntVec& i) {
      if (at(x, i) != 0) ref.insert(ref.end(), i.begin(), i.end());
    });
    ASSERT_EQ(y.int_sizes(), (IntVec{static_cast<int64_t>(ref.size() / 3), 3}));
    EXPECT_EQ(y.to_vector<int64_t>(), ref);
    expect_meta_matches(pt::ops::OpKind::nonzero, {x}, {});
  }
  EXPECT_EQ(pt::nonzero(pt::zeros({2, 0})).int_sizes(), (IntVec{0, 2}));
  EXPECT_EQ(pt::nonzero(pt::scalar_tensor(3.0)).int_sizes(), (IntVec{1, 0}));
  EXPECT_EQ(pt::nonzero(pt::scalar_tensor(0.0)).int_sizes(), (IntVec{0, 0}));
  EXPECT_TRUE(pt::ops::op_info(pt::ops::OpKind::nonzero).flags & pt::ops::kDataDependentShape);
}

TEST(OpsMisc, NonzeroMetaRefusesFakeTensors) {
  auto impl = std::make_shared<pt::TensorImpl>();  // a FakeTensor: metadata, no storage
  impl->sizes = {3, 4};
  impl->strides = {4, 1};
  Tensor fake(impl);
  Tensor in[] = {fake};
  expect_throw_with<pt::CompileError>([&] { pt::ops::run_meta(pt::ops::OpKind::nonzero, in, {}); },
                                      {"nonzero", "depends on data"});
}
