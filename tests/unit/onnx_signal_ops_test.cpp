// ONNX importer: DFT and STFT, Det, TfIdfVectorizer and Bernoulli on hand-built models, each value
// worked out by hand in the comments (ONNX's node tests in tests/conformance cover the rest).
#include <gtest/gtest.h>

#include <cmath>

#include "onnx_test_util.h"

namespace protean {
namespace {

using onnx_test::Builder;
using onnx_test::ftensor;
constexpr int32_t F32 = ::onnx::TensorProto::FLOAT;
constexpr int32_t I64 = ::onnx::TensorProto::INT64;

void expect_values(const Tensor& t, const std::vector<double>& want, const IntVec& sizes, double tol = 1e-5) {
  ASSERT_EQ(t.int_sizes(), sizes);
  std::vector<double> got = t.contiguous().to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "flat index " << i;
}

void attr_floats(::onnx::NodeProto* n, const std::string& k, const std::vector<float>& v) {
  auto* a = n->add_attribute();
  a->set_name(k);
  a->set_type(::onnx::AttributeProto::FLOATS);
  for (float f : v) a->add_floats(f);
}

TEST(OnnxSignalOps, DftRealOnesidedInverseAndLength) {
  // x = [1, 2, 3, 4] as [1, 4, 1]: X = [10, -2 + 2i, -2, -2 - 2i].
  auto run = [](int64_t opset, int64_t onesided, int64_t inverse, const std::vector<float>& x, int64_t c,
                int64_t len) {
    Builder b(opset);
    b.input("x", F32, {1, 4, c}).output("y");
    std::vector<std::string> ins = {"x"};
    if (len > 0) {
      b.const_i64("len", {len}, {});
      ins.push_back("len");
    }
    if (opset >= 20) {
      if (len <= 0) ins.push_back("");
      b.const_i64("axis", {1}, {});
      ins.push_back("axis");
    }
    auto* n = b.node("DFT", ins, {"y"});
    if (opset < 20) Builder::attr_i(n, "axis", 1);
    Builder::attr_i(n, "onesided", onesided);
    Builder::attr_i(n, "inverse", inverse);
    std::vector<Tensor> out;
    out = b.load()->forward({ftensor(x, {1, 4, c})});
    return out.at(0);
  };
  expect_values(run(17, 0, 0, {1, 2, 3, 4}, 1, 0), {10, 0, -2, 2, -2, 0, -2, -2}, {1, 4, 2});
  expect_values(run(20, 0, 0, {1, 2, 3, 4}, 1, 0), {10, 0, -2, 2, -2, 0, -2, -2}, {1, 4, 2});
  expect_values(run(17, 1, 0, {1, 2, 3, 4}, 1, 0), {10, 0, -2, 2, -2, 0}, {1, 3, 2});
  // dft_length 2 keeps [1, 2]: [3, -1]; dft_length 6 pads with zeros: X[3] = 1 - 2 + 3 - 4 = -2.
  expect_values(run(17, 0, 0, {1, 2, 3, 4}, 1, 2), {3, 0, -1, 0}, {1, 2, 2});
  Tensor six = run(17, 0, 0, {1, 2, 3, 4}, 1, 6);
  ASSERT_EQ(six.int_sizes(), (IntVec{1, 6, 2}));
  EXPECT_NEAR(six.to_vector<double>()[6], -2.0, 1e-5);
  EXPECT_NEAR(six.to_vector<double>()[7], 0.0, 1e-5);
  // The inverse of the spectrum is the signal (complex input [1, 4, 2]).
  expect_values(run(17, 0, 1, {10, 0, -2, 2, -2, 0, -2, -2}, 2, 0), {1, 0, 2, 0, 3, 0, 4, 0}, {1, 4, 2});
}

/// Bin k of Σ_n x[n] e^(sign·2πi nk / L) by a direct sum in long double (angles reduced exactly).
std::pair<double, double> direct_bin(const std::vector<double>& re, const std::vector<double>& im, int64_t L,
                                     int64_t k, double sign) {
  long double sr = 0, si = 0;
  for (int64_t n = 0; n < L; ++n) {
    long double ang = sign * 2.0L * 3.14159265358979323846264338327950288L *
                      static_cast<long double>((n * k) % L) / static_cast<long double>(L);
    long double c = std::cos(ang), s = std::sin(ang);
    long double xr = re[static_cast<size_t>(n)], xi = im.empty() ? 0.0L : im[static_cast<size_t>(n)];
    sr += xr * c - xi * s;
    si += xr * s + xi * c;
  }
  return {static_cast<double>(sr), static_cast<double>(si)};
}

TEST(OnnxSignalOps, DftLongLengthsMatchADirectSum) {
  // Lengths past the single-table form: powers of two, mixed radices, a prime above the direct
  // threshold (Bluestein) alone and as a factor, and a prime past 2^16. f64 in and out, so the
  // transform's own error is what is compared (a direct long double sum at 48 sampled bins).
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto rnd = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<double>(state >> 11) / static_cast<double>(1ull << 53) * 2.0 - 1.0;
  };
  for (int64_t L : {300, 4096, 2053, 4106, 40000, 65537}) {
    for (int complex_in = 0; complex_in < 2; ++complex_in) {
      const int64_t c = complex_in ? 2 : 1;
      std::vector<double> flat(static_cast<size_t>(L * c)), re(static_cast<size_t>(L)), im;
      if (complex_in) im.resize(static_cast<size_t>(L));
      for (int64_t n = 0; n < L; ++n) {
        re[static_cast<size_t>(n)] = flat[static_cast<size_t>(n * c)] = rnd();
        if (complex_in) im[static_cast<size_t>(n)] = flat[static_cast<size_t>(n * c + 1)] = rnd();
      }
      for (int inverse = 0; inverse < 2; ++inverse) {
        const bool onesided = !complex_in && !inverse;
        Builder b(17);
        b.input("x", ::onnx::TensorProto::DOUBLE, {1, L, c}).output("y");
        auto* n = b.node("DFT", {"x"}, {"y"});
        Builder::attr_i(n, "axis", 1);
        Builder::attr_i(n, "inverse", inverse);
        Builder::attr_i(n, "onesided", onesided ? 1 : 0);
        Tensor y = b.load()->forward({tensor<double>(flat, {1, L, c})}).at(0);
        const int64_t K = onesided ? L / 2 + 1 : L;
        ASSERT_EQ(y.int_sizes(), (IntVec{1, K, 2})) << "L " << L;
        std::vector<double> got = y.contiguous().to_vector<double>();
        const double scale = inverse ? 1.0 / static_cast<double>(L) : 1.0;
        for (int s = 0; s < 48; ++s) {
          int64_t k = s < 4 ? std::vector<int64_t>{0, 1, K - 1, K / 2}[static_cast<size_t>(s)]
                            : static_cast<int64_t>((rnd() + 1.0) / 2.0 * static_cast<double>(K - 1));
          auto [wr, wi] = direct_bin(re, im, L, k, inverse ? 1.0 : -1.0);
          const double tol = 1e-11 * std::sqrt(static_cast<double>(L)) * scale * 10;
          EXPECT_NEAR(got[static_cast<size_t>(2 * k)], wr * scale, tol) << "L " << L << " bin " << k
              << (complex_in ? " complex" : " real") << (inverse ? " inverse" : "");
          EXPECT_NEAR(got[static_cast<size_t>(2 * k + 1)], wi * scale, tol) << "L " << L << " bin " << k;
        }
      }
    }
  }
}

TEST(OnnxSignalOps, DftLongerThanTwoToThe24IsRefusedByName) {
  Builder b(17);
  b.input("x", F32, {1, 4, 1}).output("y");
  b.const_i64("len", {(1 << 24) + 1}, {});
  auto* n = b.node("DFT", {"x", "len"}, {"y"});
  Builder::attr_i(n, "axis", 1);
  try {
    b.load()->forward({ftensor({1, 2, 3, 4}, {1, 4, 1})});
    FAIL() << "a DFT of 2^24 + 1 points ran";
  } catch (const NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("16777217"), std::string::npos) << e.what();
  }
}

TEST(OnnxSignalOps, StftFramesWindowAndOnesidedBins) {
  // signal 0..7, frame_length 4, step 2: frames [0..3], [2..5], [4..7]. Window [0, 1, 1, 0]: frame 0 is
  // [0, 1, 2, 0]: X0 = 3, X1 = 1·(-i) + 2·(-1) = -2 - i, X2 = -1 + 2 = 1. Frame 1 [0, 3, 4, 0]:
  // 7, -4 - 3i, 1. Frame 2 [0, 5, 6, 0]: 11, -6 - 5i, 1.
  Builder b(17);
  b.input("x", F32, {1, 8, 1}).output("y");
  b.const_i64("step", {2}, {});
  b.const_f32("w", {4}, {0, 1, 1, 0});
  b.node("STFT", {"x", "step", "w"}, {"y"});
  std::vector<Tensor> out;
  out = b.load()->forward({ftensor({0, 1, 2, 3, 4, 5, 6, 7}, {1, 8, 1})});
  expect_values(out.at(0), {3, 0, -2, -1, 1, 0, 7, 0, -4, -3, 1, 0, 11, 0, -6, -5, 1, 0}, {1, 3, 3, 2});
}

TEST(OnnxSignalOps, DetBatched) {
  Builder b(13);
  b.input("a", F32, {2, 2, 2}).output("d");
  b.node("Det", {"a"}, {"d"});
  std::vector<Tensor> out;
  out = b.load()->forward({ftensor({1, 2, 3, 4, 0, 1, 1, 0}, {2, 2, 2})});
  expect_values(out.at(0), {-2, -1}, {2});
}

TEST(OnnxSignalOps, TfIdfVectorizerSkipsModesAndWeights) {
  // The tokens [1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8]; pool: unigrams 2, 3, 5, 4 and bigrams (5, 6),
  // (7, 8), (6, 7); max_skip_count 5 lets a bigram's tokens be 1 to 6 apart. Unigram 3 occurs 3 times,
  // 5 once; (7, 8) at positions (5, 6), (5, 11), (8, 11): 3; (5, 6) at (9, 10): 1; (6, 7) at (7, 8): 1.
  auto run = [](const std::string& mode, const std::vector<float>& weights) {
    Builder b(9);
    b.input("x", I64, {12}).output("y");
    auto* n = b.node("TfIdfVectorizer", {"x"}, {"y"});
    Builder::attr_i(n, "min_gram_length", 1);
    Builder::attr_i(n, "max_gram_length", 2);
    Builder::attr_i(n, "max_skip_count", 5);
    Builder::attr_s(n, "mode", mode);
    Builder::attr_ints(n, "ngram_counts", {0, 4});
    Builder::attr_ints(n, "ngram_indexes", {0, 1, 2, 3, 4, 5, 6});
    Builder::attr_ints(n, "pool_int64s", {2, 3, 5, 4, 5, 6, 7, 8, 6, 7});
    if (!weights.empty()) attr_floats(n, "weights", weights);
    std::vector<Tensor> out;
    out = b.load()->forward({tensor<int64_t>({1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8}, {12})});
    return out.at(0);
  };
  expect_values(run("TF", {}), {0, 3, 1, 0, 1, 3, 1}, {7}, 0);
  std::vector<float> w = {1, 0.5f, 2, 1, 4, 0.25f, 3};
  expect_values(run("IDF", w), {0, 0.5, 2, 0, 4, 0.25, 3}, {7}, 0);
  expect_values(run("TFIDF", w), {0, 1.5, 2, 0, 4, 0.75, 3}, {7}, 0);
}

TEST(OnnxSignalOps, BernoulliSeededMeanAndValueSet) {
  // 20000 draws at p = 0.3: the mean's standard deviation is sqrt(0.21 / 20000) = 0.0032; 0.02 is 6 of them.
  auto run = [](float seed) {
    Builder b(15);
    b.input("p", F32, {20000}).output("y");
    auto* n = b.node("Bernoulli", {"p"}, {"y"});
    Builder::attr_f(n, "seed", seed);
    Builder::attr_i(n, "dtype", ::onnx::TensorProto::DOUBLE);
    std::vector<Tensor> out;
    out = b.load()->forward({ftensor(std::vector<float>(20000, 0.3f), {20000})});
    return out.at(0);
  };
  Tensor y = run(1.0f);
  ASSERT_EQ(y.dtype(), DType::F64);
  std::vector<double> v = y.to_vector<double>();
  double mean = 0;
  for (double x : v) {
    ASSERT_TRUE(x == 0.0 || x == 1.0) << x;
    mean += x;
  }
  mean /= static_cast<double>(v.size());
  EXPECT_NEAR(mean, 0.3, 0.02);
  EXPECT_EQ(run(1.0f).to_vector<double>(), v);   // the same seed, the same draws
  EXPECT_NE(run(2.0f).to_vector<double>(), v);   // another seed, other draws
}

TEST(OnnxSignalOps, LpPoolWithDilations) {
  // x = [1, 2, 3, 4, 5], kernel 2, dilation 2: windows (1, 3), (2, 4), (3, 5). p = 1: 4, 6, 8;
  // p = 2: sqrt(10), sqrt(20), sqrt(34). With pads [1, 1] and stride 2 (p = 1): the padded
  // [0, 1, 2, 3, 4, 5, 0] gives windows (0, 2), (2, 4), (4, 0): 2, 6, 4.
  auto run = [](int64_t p, const std::vector<int64_t>& pads, int64_t stride) {
    Builder b(18);
    b.input("x", F32, {1, 1, 5}).output("y");
    auto* n = b.node("LpPool", {"x"}, {"y"});
    Builder::attr_ints(n, "kernel_shape", {2});
    Builder::attr_ints(n, "dilations", {2});
    Builder::attr_ints(n, "strides", {stride});
    if (!pads.empty()) Builder::attr_ints(n, "pads", pads);
    Builder::attr_i(n, "p", p);
    std::vector<Tensor> out;
    out = b.load()->forward({ftensor({1, 2, 3, 4, 5}, {1, 1, 5})});
    return out.at(0);
  };
  expect_values(run(1, {}, 1), {4, 6, 8}, {1, 1, 3});
  expect_values(run(2, {}, 1), {std::sqrt(10.0), std::sqrt(20.0), std::sqrt(34.0)}, {1, 1, 3});
  expect_values(run(1, {1, 1}, 2), {2, 6, 4}, {1, 1, 3});
}

}  // namespace
}  // namespace protean
