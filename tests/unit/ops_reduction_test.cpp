// Reductions (sum, mean, prod, amax, amin, var, argmax) against float64 references written out
// plainly: every dim subset pattern, keepdim, non-contiguous layouts, size-0/size-1 dims, 0-dim
// tensors, each dtype, and the threaded paths.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>

#include "ops/registry.h"
#include "protean/protean.h"
#include "ops_test_util.h"

namespace reduction_test {

using namespace ops_test;  // reference helpers: ops_test_util.h

/// Reference reduction: groups the row-major values of shape `s` by output index (reduced dims
/// removed) and applies `f` to each group.
std::vector<double> ref_reduce(const std::vector<double>& v, const IntVec& s, const IntVec& dims,
                               const std::function<double(const std::vector<double>&)>& f) {
  std::vector<bool> red(s.size(), false);
  for (int64_t d : dims) red[static_cast<size_t>(d)] = true;
  IntVec os;
  for (size_t d = 0; d < s.size(); ++d)
    if (!red[d]) os.push_back(s[d]);
  std::vector<std::vector<double>> groups(static_cast<size_t>(numel_of(os)));
  size_t k = 0;
  for_each_index(s, [&](const IntVec& idx) {
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (!red[d]) o = o * s[d] + idx[d];
    groups[static_cast<size_t>(o)].push_back(v[k++]);
  });
  std::vector<double> out;
  for (const auto& g : groups) out.push_back(f(g));
  return out;
}
IntVec out_shape(const IntVec& s, const IntVec& dims, bool keepdim) {
  IntVec o;
  for (size_t d = 0; d < s.size(); ++d) {
    bool r = std::find(dims.begin(), dims.end(), static_cast<int64_t>(d)) != dims.end();
    if (!r) o.push_back(s[d]);
    else if (keepdim) o.push_back(1);
  }
  return o;
}
IntVec normalize(const IntVec& dims, size_t rank) {
  IntVec o;
  if (dims.empty())
    for (size_t d = 0; d < rank; ++d) o.push_back(static_cast<int64_t>(d));
  for (int64_t d : dims) o.push_back(d < 0 ? d + static_cast<int64_t>(rank) : d);
  return o;
}
pt::SymIntVec sv(const IntVec& v) { return pt::to_symint_vec(v); }

double r_sum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double r_prod(const std::vector<double>& g) {
  double s = 1;
  for (double v : g) s *= v;
  return s;
}
double r_max(const std::vector<double>& g) {
  double m = -INFINITY;
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return m;
}
double r_min(const std::vector<double>& g) {
  double m = INFINITY;
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::min(m, v);
  }
  return m;
}
double r_var(const std::vector<double>& g, int64_t corr) {
  double mean = r_sum(g) / static_cast<double>(g.size()), ss = 0;
  for (double v : g) ss += (v - mean) * (v - mean);
  return ss / static_cast<double>(std::max<int64_t>(0, static_cast<int64_t>(g.size()) - corr));
}

struct Shape {
  IntVec sizes;
  std::vector<IntVec> dim_sets;
};
const std::vector<Shape> kCases = {
    {{3, 4, 5}, {{}, {0}, {1}, {2}, {-1}, {0, 2}, {1, 2}, {0, 1}}},
    {{2, 3, 4, 5}, {{1, 3}, {0, 2}, {3}, {0, 1, 2}}},
    {{1, 7, 1}, {{}, {1}, {0, 2}, {0}}},
    {{6}, {{}, {0}}},
    {{}, {{}, {0}}},
    {{2, 0, 3}, {{2}, {0}}},
};

}  // namespace reduction_test
using namespace reduction_test;

TEST(OpsReduction, SumMeanProdAmaxAminMatchReference) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I8, DType::U8,
                  DType::Bool})
    for (const Shape& sc : kCases)
      for (const IntVec& dims0 : sc.dim_sets)
        for (bool keepdim : {false, true})
          for (Layout l : {kContig, kColMajor, kStrided}) {
            bool fl = is_float(t);
            Tensor x = make(sc.sizes, t, l, t == DType::Bool ? uniform(0, 2, true) : fl ? uniform(-2, 2) : uniform(0, 4, true));
            std::vector<double> xv = values(x);
            IntVec dims = normalize(dims0, sc.sizes.size());
            if (sc.sizes.empty()) dims.clear();
            IntVec os = out_shape(sc.sizes, dims, keepdim);
            Attrs a{{"dims", sv(dims0)}, {"keepdim", keepdim}};
            std::string what = std::string(pt::short_name(t)) + " " + pt::to_string(sv(sc.sizes)) + " dims " +
                               pt::to_string(sv(dims0)) + (keepdim ? " keepdim" : "") + " layout " + std::to_string(l);
            DType acc_t = fl ? t : DType::I64;
            Tensor s = run(OpKind::sum, {x}, a);
            EXPECT_EQ(s.dtype(), acc_t) << what;
            EXPECT_EQ(s.int_sizes(), os) << what;
            expect_values(s, ref_reduce(xv, sc.sizes, dims, r_sum), "sum " + what, 4 * rtol_of(acc_t));
            Tensor p = run(OpKind::prod, {x}, a);
            EXPECT_EQ(p.dtype(), acc_t) << what;
            expect_values(p, ref_reduce(xv, sc.sizes, dims, r_prod), "prod " + what, 4 * rtol_of(acc_t));
            if (fl) {
              Tensor m = run(OpKind::mean, {x}, a);
              auto ref = ref_reduce(xv, sc.sizes, dims, [](const std::vector<double>& g) {
                return g.empty() ? NAN : r_sum(g) / static_cast<double>(g.size());
              });
              expect_values(m, ref, "mean " + what, 4 * rtol_of(t));
            }
            bool empty_red = false;
            for (int64_t d : dims) empty_red |= sc.sizes[static_cast<size_t>(d)] == 0;
            if (empty_red) {
              EXPECT_THROW(run(OpKind::amax, {x}, a), pt::ValueError) << what;
              continue;
            }
            Tensor mx = run(OpKind::amax, {x}, a);
            EXPECT_EQ(mx.dtype(), t);
            expect_values(mx, ref_reduce(xv, sc.sizes, dims, r_max), "amax " + what);
            Tensor mn = run(OpKind::amin, {x}, a);
            expect_values(mn, ref_reduce(xv, sc.sizes, dims, r_min), "amin " + what);
          }
}

TEST(OpsReduction, VarWithCorrection) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16})
    for (const Shape& sc : kCases)
      for (const IntVec& dims0 : sc.dim_sets)
        for (int64_t corr : {0, 1, 2})
          for (Layout l : {kContig, kStrided}) {
            Tensor x = make(sc.sizes, t, l, uniform(-3, 3));
            IntVec dims = normalize(dims0, sc.sizes.size());
            if (sc.sizes.empty()) dims.clear();
            Tensor v = run(OpKind::var, {x}, {{"dims", sv(dims0)}, {"keepdim", true}, {"correction", pt::SymInt(corr)}});
            EXPECT_EQ(v.int_sizes(), out_shape(sc.sizes, dims, true));
            auto ref = ref_reduce(values(x), sc.sizes, dims, [corr](const std::vector<double>& g) {
              if (g.empty()) return static_cast<double>(NAN);
              return r_var(g, corr);
            });
            expect_values(v, ref, "var " + std::string(pt::short_name(t)) + " " + pt::to_string(sv(sc.sizes)) +
                                      " dims " + pt::to_string(sv(dims0)) + " corr " + std::to_string(corr),
                          4 * rtol_of(t));
          }
  // the public default is the unbiased estimate
  Tensor x = pt::tensor<double>({1, 2, 3, 4}, {4});
  EXPECT_DOUBLE_EQ(pt::var(x).item<double>(), 5.0 / 3.0);
}

TEST(OpsReduction, SumDtypeAttributeAndBoolSum) {
  Tensor b = pt::tensor<bool>({true, true, false, true}, {2, 2});
  Tensor s = pt::sum(b);
  EXPECT_EQ(s.dtype(), DType::I64);
  EXPECT_EQ(s.item<int64_t>(), 3);
  Tensor x = pt::tensor<float>({1.5f, 2.5f, 3.f}, {3});
  Tensor d = pt::sum(x, {}, false, DType::F64);
  EXPECT_EQ(d.dtype(), DType::F64);
  EXPECT_DOUBLE_EQ(d.item<double>(), 7.0);
  Tensor i = pt::sum(x, {0}, true, DType::I32);  // the input converts first: 1 + 2 + 3
  EXPECT_EQ(i.dtype(), DType::I32);
  EXPECT_EQ(i.int_sizes(), IntVec{1});
  EXPECT_EQ(i.item<int32_t>(), 6);
  Tensor h = make({5000}, DType::F16, kContig, [] { return 1.0; });  // f16 sum accumulates wider than f16
  EXPECT_DOUBLE_EQ(pt::sum(h).item<double>(), 5000.0);
}

TEST(OpsReduction, ArgmaxFirstOnTiesAndNaN) {
  for (DType t : {DType::F32, DType::F64, DType::F16, DType::I64, DType::I8, DType::U8})
    for (const IntVec& s : {IntVec{3, 4, 5}, IntVec{7}, IntVec{1, 6}, IntVec{4, 1}})
      for (Layout l : {kContig, kColMajor})
        for (int64_t d = -1; d < static_cast<int64_t>(s.size()); ++d)
          for (bool keepdim : {false, true}) {
            Tensor x = make(s, t, l, uniform(0, 5, true));  // many ties
            Attrs a{{"keepdim", keepdim}};
            if (d >= 0) a.set("dim", pt::SymInt(d));
            Tensor y = run(OpKind::argmax, {x}, a);
            EXPECT_EQ(y.dtype(), DType::I64);
            std::vector<double> xv = values(x), ref;
            if (d < 0) {
              EXPECT_EQ(y.int_sizes(), keepdim ? IntVec(s.size(), 1) : IntVec{});
              size_t bi = 0;
              for (size_t i = 1; i < xv.size(); ++i)
                if (xv[i] > xv[bi]) bi = i;
              ref.push_back(static_cast<double>(bi));
            } else {
              EXPECT_EQ(y.int_sizes(), out_shape(s, {d}, keepdim));
              // index along d of the first maximum, per output position
              IntVec os = out_shape(s, {d}, false);
              std::vector<double> best(static_cast<size_t>(numel_of(os)), -1), bidx(best.size(), 0);
              size_t k = 0;
              for_each_index(s, [&](const IntVec& idx) {
                int64_t o = 0;
                for (size_t q = 0; q < s.size(); ++q)
                  if (static_cast<int64_t>(q) != d) o = o * s[q] + idx[q];
                double v = xv[k++];
                if (v > best[static_cast<size_t>(o)]) {
                  best[static_cast<size_t>(o)] = v;
                  bidx[static_cast<size_t>(o)] = static_cast<double>(idx[static_cast<size_t>(d)]);
                }
              });
              ref = bidx;
            }
            expect_values(y, ref, "argmax " + std::string(pt::short_name(t)) + " " + pt::to_string(sv(s)) +
                                      " dim " + std::to_string(d));
          }
  Tensor n = pt::tensor<float>({1.f, NAN, 5.f, NAN}, {4});
  EXPECT_EQ(pt::argmax(n).item<int64_t>(), 1);
  EXPECT_TRUE(std::isnan(pt::amax(n).item<float>()));
  EXPECT_TRUE(std::isnan(pt::amin(n).item<float>()));
}

TEST(OpsReduction, LargeReductionsAreThreadedAndAccurate) {
  int saved = pt::num_threads();
  pt::set_num_threads(4);
  const int64_t n = 1 << 20;
  Tensor x = make({n}, DType::F32, kContig, uniform(0, 1));
  std::vector<double> xv = values(x);
  double s = 0, mx = -1;
  for (double v : xv) s += v, mx = std::max(mx, v);
  EXPECT_NEAR(pt::sum(x).item<double>(), s, 1e-6 * s);
  EXPECT_NEAR(pt::mean(x).item<double>(), s / static_cast<double>(n), 1e-6);
  EXPECT_EQ(pt::amax(x).item<double>(), mx);
  // rows and accumulate-rows paths on a large 2-D tensor
  Tensor m = make({512, 300}, DType::F32, kContig, uniform(-1, 1));
  auto mv = values(m);
  expect_values(pt::sum(m, {1}), ref_reduce(mv, {512, 300}, {1}, r_sum), "sum rows", 1e-5);
  expect_values(pt::sum(m, {0}), ref_reduce(mv, {512, 300}, {0}, r_sum), "sum cols", 1e-5);
  expect_values(pt::var(m, {0}), ref_reduce(mv, {512, 300}, {0}, [](const std::vector<double>& g) { return r_var(g, 1); }),
                "var cols", 1e-5);
  pt::set_num_threads(saved);
}

TEST(OpsReduction, ErrorsNameTheOp) {
  Tensor i = pt::tensor<int64_t>({1, 2}, {2});
  try {
    pt::mean(i);
    ADD_FAILURE() << "expected TypeError";
  } catch (const pt::TypeError& e) {
    EXPECT_NE(std::string(e.what()).find("mean"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::var(i), pt::TypeError);
  Tensor x = pt::zeros({2, 3});
  try {
    pt::sum(x, {2});
    ADD_FAILURE() << "expected ValueError";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("sum"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::sum(x, {0, -2}), pt::ValueError);  // repeated dim
  EXPECT_THROW(pt::amax(pt::zeros({0, 3}), {0}), pt::ValueError);
  EXPECT_THROW(pt::argmax(pt::zeros({0})), pt::ValueError);
  EXPECT_EQ(pt::amax(pt::zeros({0, 3}), {1}).int_sizes(), IntVec{0});
}
