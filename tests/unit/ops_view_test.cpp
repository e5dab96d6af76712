// View ops (view reshape permute expand squeeze unsqueeze slice select): values against a float64
// reference computed from the base by plain index arithmetic, storage sharing (data_ptr arithmetic),
// writes through views, Python slicing edge cases, meta == eager metadata, error paths.
#include <gtest/gtest.h>

#include <functional>
#include <limits>
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
    size_t d = sizes.size();
    while (d > 0) {
      --d;
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (sizes.empty()) return;
  }
}

/// Element at `idx`, read through the tensor's own sizes/strides/offset, as double.
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

/// A float64 tensor 0, 1, 2, ... (exact values make mismatches easy to read).
Tensor iota(const IntVec& sizes, DType dt = DType::F64) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i);
  Tensor t = pt::tensor<double>(v, sizes);
  return dt == DType::F64 ? t : t.to(dt);
}

/// A non-contiguous f64 tensor of `sizes`: a transposed buffer, values = row-major position.
Tensor noncontig(const IntVec& sizes) {
  // storage laid out with dims reversed (Fortran order), plus a leading offset of 3 elements
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  auto* buf = new double[static_cast<size_t>(n + 3)];
  IntVec st(sizes.size());
  int64_t acc = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    st[i] = acc;
    acc *= std::max<int64_t>(sizes[i], 1);
  }
  Tensor t = pt::from_blob(buf + 3, sizes, DType::F64, st, [buf](void*) { delete[] buf; });
  int64_t k = 0;
  for_each_index(sizes, [&](const IntVec& idx) {
    int64_t off = 0;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * st[i];
    t.data_ptr<double>()[off] = static_cast<double>(k++);
  });
  return t;
}

bool shares_storage(const Tensor& a, const Tensor& b) { return a.impl()->storage == b.impl()->storage; }

/// The view's first element is where its storage offset says, relative to the base's.
void expect_view_of(const Tensor& y, const Tensor& x) {
  ASSERT_TRUE(shares_storage(y, x));
  auto dp = static_cast<const char*>(y.data_ptr()) - static_cast<const char*>(x.data_ptr());
  EXPECT_EQ(dp, (y.storage_offset().hint() - x.storage_offset().hint()) * static_cast<int64_t>(x.itemsize()));
}

/// Meta (run_meta) must describe exactly what eager returned, strides and offset included.
void expect_meta_matches(pt::ops::OpKind op, std::vector<Tensor> in, const pt::ops::Attrs& attrs) {
  auto metas = pt::ops::run_meta(op, in, attrs);
  auto outs = pt::ops::run_eager(op, in, attrs);
  ASSERT_EQ(metas.size(), outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(pt::hints(metas[i].sizes), outs[i].int_sizes()) << pt::ops::op_name(op);
    EXPECT_EQ(pt::hints(metas[i].strides), outs[i].int_strides()) << pt::ops::op_name(op);
    EXPECT_EQ(metas[i].storage_offset.hint(), outs[i].storage_offset().hint()) << pt::ops::op_name(op);
    EXPECT_EQ(metas[i].dtype, outs[i].dtype());
    if (metas[i].alias_of == 0) {
      EXPECT_TRUE(shares_storage(outs[i], in[0])) << pt::ops::op_name(op);
    }
  }
}

const DType kAllDTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64,
                            DType::I32, DType::I8,  DType::U8,   DType::Bool};

}  // namespace

TEST(OpsView, PermuteMatchesReferenceAndShares) {
  for (bool nc : {false, true}) {
    Tensor x = nc ? noncontig({2, 3, 4}) : iota({2, 3, 4});
    Tensor y = pt::permute(x, {2, 0, 1});
    EXPECT_EQ(y.int_sizes(), (IntVec{4, 2, 3}));
    expect_view_of(y, x);
    for_each_index(y.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(y, i), at(x, {i[1], i[2], i[0]})); });
    Tensor z = pt::permute(x, {-1, 0, -2});
    EXPECT_EQ(z.int_sizes(), (IntVec{4, 2, 3}));
  }
  expect_meta_matches(pt::ops::OpKind::permute, {iota({2, 3, 4})}, {{"dims", pt::SymIntVec{1, 2, 0}}});
}

TEST(OpsView, PermuteEveryDType) {
  for (DType dt : kAllDTypes) {
    Tensor x = iota({3, 2}, dt);
    Tensor y = pt::transpose(x, 0, 1);
    EXPECT_EQ(y.dtype(), dt);
    for_each_index(y.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(y, i), at(x, {i[1], i[0]})) << pt::short_name(dt); });
  }
}

TEST(OpsView, WritesThroughViewsReachTheBase) {
  Tensor x = iota({3, 4});
  Tensor row = pt::select(x, 0, 1);
  row.data_ptr<double>()[2] = -7;  // x[1, 2]
  EXPECT_EQ(at(x, {1, 2}), -7);
  Tensor col = pt::slice(x, 1, 1, 4, 2);  // columns 1 and 3
  double* p = col.data_ptr<double>();
  p[1 * col.int_strides()[0] + 1 * col.int_strides()[1]] = 99;  // x[1, 3]
  EXPECT_EQ(at(x, {1, 3}), 99);
  Tensor t = pt::transpose(x, 0, 1);
  t.data_ptr<double>()[3 * t.int_strides()[0] + 2 * t.int_strides()[1]] = 5.5;  // x[2, 3]
  EXPECT_EQ(at(x, {2, 3}), 5.5);
  Tensor v = pt::view(x, {12});
  v.data_ptr<double>()[0] = 123;
  EXPECT_EQ(at(x, {0, 0}), 123);
}

TEST(OpsView, ViewAndReshapeOfContiguous) {
  Tensor x = iota({2, 3, 4});
  for (const pt::SymIntVec& shape : {pt::SymIntVec{6, 4}, pt::SymIntVec{-1}, pt::SymIntVec{2, -1, 2},
                                     pt::SymIntVec{24, 1}, pt::SymIntVec{1, 2, 1, 12}}) {
    Tensor v = pt::view(x, shape);
    Tensor r = pt::reshape(x, shape);
    expect_view_of(v, x);
    expect_view_of(r, x);
    EXPECT_EQ(v.int_sizes(), r.int_sizes());
    EXPECT_EQ(v.to_vector<double>(), x.to_vector<double>());
    EXPECT_TRUE(v.is_contiguous());
  }
  EXPECT_EQ(pt::view(x, {2, -1, 2}).int_sizes(), (IntVec{2, 6, 2}));
  Tensor s = pt::scalar_tensor(4.0, DType::F64);
  EXPECT_EQ(pt::view(s, {1, 1}).int_sizes(), (IntVec{1, 1}));
  EXPECT_EQ(pt::reshape(pt::view(s, {1}), {}).dim(), 0);
}

TEST(OpsView, ReshapeViewsWhenStridesAllow) {
  // Transposed [4, 6] → split/merge dims that stay contiguous with each other: still a view.
  Tensor base = iota({6, 4});
  Tensor x = pt::transpose(base, 0, 1);  // [4, 6], strides [1, 4]
  Tensor y = pt::reshape(x, {2, 2, 6});  // splits dim 0 only
  expect_view_of(y, base);
  EXPECT_EQ(y.int_strides(), (IntVec{2, 1, 4}));
  for_each_index(y.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(y, i), at(x, {i[0] * 2 + i[1], i[2]})); });
  // A sliced row range keeps rows contiguous: merging dims is a view.
  Tensor rows = pt::slice(iota({5, 4}), 0, 1, 4);
  Tensor flat = pt::reshape(rows, {-1});
  expect_view_of(flat, rows);
  EXPECT_EQ(flat.to_vector<double>()[0], 4.0);
}

TEST(OpsView, ReshapeCopiesWhenItMust) {
  Tensor base = iota({3, 4});
  Tensor x = pt::transpose(base, 0, 1);  // [4, 3]
  Tensor y = pt::reshape(x, {12});
  EXPECT_FALSE(shares_storage(y, x));
  EXPECT_TRUE(y.is_contiguous());
  std::vector<double> got = y.to_vector<double>();
  int64_t k = 0;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(got[static_cast<size_t>(k++)], at(base, {j, i}));
  // meta says copy (alias_of -1) when strides do not allow a view, view (0) otherwise
  Tensor in[] = {x};
  EXPECT_EQ(pt::ops::run_meta(pt::ops::OpKind::reshape, in, {{"shape", pt::SymIntVec{12}}})[0].alias_of, -1);
  EXPECT_EQ(pt::ops::run_meta(pt::ops::OpKind::reshape, in, {{"shape", pt::SymIntVec{2, 2, 3}}})[0].alias_of, 0);
  // view refuses
  try {
    pt::view(x, {12});
    FAIL() << "view should have thrown";
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("view"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("reshape"), std::string::npos);
  }
  // non-contiguous inputs of every kind copy correctly
  Tensor nc = noncontig({2, 3, 4});
  Tensor r = pt::reshape(nc, {4, 6});
  std::vector<double> rv = r.to_vector<double>();
  for (size_t i = 0; i < rv.size(); ++i) EXPECT_EQ(rv[i], static_cast<double>(i));
  expect_meta_matches(pt::ops::OpKind::reshape, {nc}, {{"shape", pt::SymIntVec{-1, 6}}});
  expect_meta_matches(pt::ops::OpKind::reshape, {pt::transpose(iota({6, 4}), 0, 1)}, {{"shape", pt::SymIntVec{2, 2, 6}}});
}

TEST(OpsView, ReshapeEmptyAndErrors) {
  Tensor e = pt::zeros({0, 3});
  EXPECT_EQ(pt::reshape(e, {3, 0}).int_sizes(), (IntVec{3, 0}));
  EXPECT_EQ(pt::reshape(e, {-1}).int_sizes(), (IntVec{0}));
  EXPECT_THROW(pt::reshape(e, {0, -1, 3}), pt::ShapeError);  // -1 could be anything
  EXPECT_THROW(pt::reshape(e, {-1, 0}), pt::ShapeError);  // ambiguous
  Tensor x = iota({2, 3});
  EXPECT_THROW(pt::reshape(x, {4, -1}), pt::ShapeError);
  EXPECT_THROW(pt::reshape(x, {-1, -1}), pt::ValueError);
  EXPECT_THROW(pt::view(x, {7}), pt::ShapeError);
  EXPECT_THROW(pt::reshape(x, {-2, 3}), pt::ValueError);
  try {
    pt::reshape(x, {5});
  } catch (const pt::ShapeError& e2) {
    EXPECT_NE(std::string(e2.what()).find("reshape(f64[2, 3])"), std::string::npos) << e2.what();
  }
}

TEST(OpsView, ExpandNewLeadingDimsAndMinusOne) {
  Tensor x = iota({3, 1});
  Tensor y = pt::expand(x, {2, -1, 4});
  EXPECT_EQ(y.int_sizes(), (IntVec{2, 3, 4}));
  EXPECT_EQ(y.int_strides(), (IntVec{0, 1, 0}));
  expect_view_of(y, x);
  for_each_index(y.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(y, i), at(x, {i[1], 0})); });
  EXPECT_EQ(pt::expand(x, {3, 2}).int_strides(), (IntVec{1, 0}));
  EXPECT_THROW(pt::expand(x, {2, 2}), pt::ShapeError);
  EXPECT_THROW(pt::expand(x, {1}), pt::ShapeError);
  EXPECT_THROW(pt::expand(x, {-1, 3, 1}), pt::ValueError);
  EXPECT_EQ(pt::expand(x, {0, 3, 5}).int_sizes(), (IntVec{0, 3, 5}));
  Tensor s = pt::scalar_tensor(2.0);
  EXPECT_EQ(pt::expand(s, {2, 2}).to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
  expect_meta_matches(pt::ops::OpKind::expand, {noncontig({1, 4})}, {{"sizes", pt::SymIntVec{3, 5, -1}}});
}

TEST(OpsView, SqueezeUnsqueeze) {
  Tensor x = noncontig({1, 3, 1, 2});
  EXPECT_EQ(pt::squeeze(x).int_sizes(), (IntVec{3, 2}));
  EXPECT_EQ(pt::squeeze(x, {2}).int_sizes(), (IntVec{1, 3, 2}));
  EXPECT_EQ(pt::squeeze(x, {1}).int_sizes(), (IntVec{1, 3, 1, 2}));  // not size 1: no-op
  EXPECT_EQ(pt::squeeze(x, {0, -2}).int_sizes(), (IntVec{3, 2}));
  Tensor q = pt::squeeze(x);
  expect_view_of(q, x);
  for_each_index(q.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(q, i), at(x, {0, i[0], 0, i[1]})); });
  EXPECT_THROW(pt::squeeze(x, {4}), pt::ValueError);
  Tensor u = pt::unsqueeze(x, -1);
  EXPECT_EQ(u.int_sizes(), (IntVec{1, 3, 1, 2, 1}));
  EXPECT_EQ(pt::unsqueeze(x, 0).int_sizes(), (IntVec{1, 1, 3, 1, 2}));
  EXPECT_EQ(pt::unsqueeze(x, 2).int_sizes(), (IntVec{1, 3, 1, 1, 2}));
  expect_view_of(u, x);
  EXPECT_THROW(pt::unsqueeze(x, 5), pt::ValueError);
  EXPECT_THROW(pt::unsqueeze(x, -6), pt::ValueError);
  EXPECT_EQ(pt::unsqueeze(pt::scalar_tensor(1.0), 0).int_sizes(), (IntVec{1}));
  EXPECT_EQ(pt::squeeze(pt::scalar_tensor(1.0)).dim(), 0);
  expect_meta_matches(pt::ops::OpKind::squeeze, {x}, {{"dims", pt::SymIntVec{}}});
  expect_meta_matches(pt::ops::OpKind::unsqueeze, {x}, {{"dim", pt::SymInt(1)}});
}

TEST(OpsView, SlicePythonSemantics) {
  Tensor x = iota({10});
  auto vals = [](const Tensor& t) { return t.to_vector<double>(); };
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  // Compare against Python's range(*slice(start, stop, step).indices(10)), written out by hand.
  struct Case { int64_t start, end, step; std::vector<double> want; };
  std::vector<Case> cases = {
      {2, 5, 1, {2, 3, 4}},     {-3, kMax, 1, {7, 8, 9}}, {0, -1, 3, {0, 3, 6}},   {-100, 3, 1, {0, 1, 2}},
      {8, 100, 1, {8, 9}},      {5, 2, 1, {}},            {12, 20, 1, {}},         {0, kMax, 4, {0, 4, 8}},
      {-1, kMax, 5, {9}},       {1, 10, 3, {1, 4, 7}},    {-20, -15, 1, {}},       {3, 3, 1, {}},
  };
  for (const auto& c : cases) {
    Tensor y = pt::slice(x, 0, c.start, c.end, c.step);
    EXPECT_EQ(vals(y), c.want) << c.start << ":" << c.end << ":" << c.step;
    expect_view_of(y, x);
  }
  EXPECT_THROW(pt::slice(x, 0, 0, 5, 0), pt::ValueError);
  EXPECT_THROW(pt::slice(x, 0, 0, 5, -1), pt::ValueError);
  EXPECT_THROW(pt::slice(x, 1, 0, 5, 1), pt::ValueError);
  EXPECT_THROW(pt::slice(pt::scalar_tensor(1.0), 0, 0, 1, 1), pt::ValueError);
  // multi-dim, non-contiguous base, step > 1
  Tensor b = noncontig({4, 5, 3});
  Tensor s = pt::slice(b, 1, 1, -1, 2);
  EXPECT_EQ(s.int_sizes(), (IntVec{4, 2, 3}));
  expect_view_of(s, b);
  for_each_index(s.int_sizes(), [&](const IntVec& i) { EXPECT_EQ(at(s, i), at(b, {i[0], 1 + 2 * i[1], i[2]})); });
  expect_meta_matches(pt::ops::OpKind::slice, {b},
                      {{"dim", pt::SymInt(-1)}, {"start", pt::SymInt(-2)}, {"end", pt::SymInt(kMax)}, {"step", pt::SymInt(1)}});
  EXPECT_EQ(pt::narrow(x, 0, 2, 3).to_vector<double>(), (std::vector<double>{2, 3, 4}));
}

TEST(OpsView, SelectWrapsAndChecks) {
  Tensor b = noncontig({3, 4});
  Tensor r = pt::select(b, 0, -1);
  EXPECT_EQ(r.int_sizes(), (IntVec{4}));
  expect_view_of(r, b);
  for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(at(r, {j}), at(b, {2, j}));
  Tensor c = pt::select(b, 1, 2);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(at(c, {i}), at(b, {i, 2}));
  EXPECT_EQ(pt::select(pt::select(b, 0, 1), 0, 3).dim(), 0);
  EXPECT_EQ(pt::select(pt::select(b, 0, 1), 0, 3).item<double>(), at(b, {1, 3}));
  for (int64_t bad : {3, -4, 100}) {
    try {
      pt::select(b, 0, bad);
      FAIL() << "select should have thrown for index " << bad;
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("select"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(pt::select(pt::scalar_tensor(1.0), 0, 0), pt::ValueError);
  expect_meta_matches(pt::ops::OpKind::select, {b}, {{"dim", pt::SymInt(1)}, {"index", pt::SymInt(-3)}});
}

TEST(OpsView, RandomViewChainsMatchReference) {
  // Random chains of view ops on random shapes; each result is checked against an index map
  // maintained by hand alongside (position in the base for every output index).
  std::mt19937 rng(123);
  for (int trial = 0; trial < 60; ++trial) {
    int rank = 1 + static_cast<int>(rng() % 4);
    IntVec sizes;
    for (int i = 0; i < rank; ++i) sizes.push_back(static_cast<int64_t>(rng() % 4));  // includes 0 and 1
    Tensor base = trial % 2 ? noncontig(sizes) : iota(sizes);
    Tensor cur = base;
    // map: for the current view, a function from its index to the base index
    std::function<IntVec(const IntVec&)> map = [](const IntVec& i) { return i; };
    for (int step = 0; step < 3; ++step) {
      int64_t r = cur.dim();
      IntVec cs = cur.int_sizes();
      int kind = static_cast<int>(rng() % 4);
      if (r == 0) kind = 3;
      if (kind == 0) {  // permute (reverse)
        IntVec p;
        for (int64_t i = r - 1; i >= 0; --i) p.push_back(i);
        cur = pt::permute(cur, p);
        map = [map, r](const IntVec& i) {
          IntVec j(i.rbegin(), i.rend());
          (void)r;
          return map(j);
        };
      } else if (kind == 1) {  // slice dim 0 [1:], step 2
        cur = pt::slice(cur, 0, 1, std::numeric_limits<int64_t>::max(), 2);
        map = [map](const IntVec& i) {
          IntVec j = i;
          j[0] = 1 + 2 * i[0];
          return map(j);
        };
      } else if (kind == 2 && cs[0] > 0) {  // select dim 0, last
        int64_t last = cs[0] - 1;
        cur = pt::select(cur, 0, -1);
        map = [map, last](const IntVec& i) {
          IntVec j{last};
          j.insert(j.end(), i.begin(), i.end());
          return map(j);
        };
      } else {  // unsqueeze at 0
        cur = pt::unsqueeze(cur, 0);
        map = [map](const IntVec& i) { return map(IntVec(i.begin() + 1, i.end())); };
      }
      expect_view_of(cur, base);
      for_each_index(cur.int_sizes(), [&](const IntVec& i) { ASSERT_EQ(at(cur, i), at(base, map(i))); });
    }
  }
}

TEST(OpsView, ErrorsNameTheOp) {
  Tensor x = iota({2, 3});
  try {
    pt::permute(x, {0, 0});
    FAIL();
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("permute"), std::string::npos);
  }
  try {
    pt::expand(x, {4, 3});
    FAIL();
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("expand"), std::string::npos);
  }
  EXPECT_THROW(pt::permute(x, {0}), pt::ValueError);
  EXPECT_THROW(pt::permute(x, {0, 2}), pt::ValueError);
}

TEST(OpsView, ExtremeSliceBoundsAndSteps) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  Tensor x = pt::arange(10, DType::I64);
  // Python: list(range(10))[0:maxsize:maxsize] == [0]
  Tensor a = pt::slice(x, 0, 0, kMax, kMax);
  ASSERT_EQ(a.int_sizes(), (IntVec{1}));
  EXPECT_EQ(pt::select(a, 0, 0).item<int64_t>(), 0);
  Tensor b = pt::slice(x, 0, kMin, kMax, kMax);
  ASSERT_EQ(b.int_sizes(), (IntVec{1}));
  EXPECT_EQ(pt::slice(x, 0, 3, kMax, kMax - 1).int_sizes(), (IntVec{1}));
  EXPECT_EQ(pt::slice(x, 0, 5, 5, kMax).int_sizes(), (IntVec{0}));
  EXPECT_EQ(pt::slice(x, 0, 1, 10, 4).int_sizes(), (IntVec{3}));
}

TEST(OpsView, NarrowChecksItsRange) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  Tensor x = pt::arange(10, DType::I64);
  EXPECT_THROW(pt::narrow(x, 0, kMin, 2), pt::ValueError);
  EXPECT_THROW(pt::narrow(x, 0, 11, 0), pt::ValueError);
  EXPECT_THROW(pt::narrow(x, 0, 8, 3), pt::ValueError);
  EXPECT_THROW(pt::narrow(x, 0, 1, kMax), pt::ValueError);
  EXPECT_THROW(pt::narrow(x, 0, 1, -1), pt::ValueError);
  Tensor n = pt::narrow(x, 0, -3, 2);
  ASSERT_EQ(n.int_sizes(), (IntVec{2}));
  EXPECT_EQ(pt::select(n, 0, 0).item<int64_t>(), 7);
  EXPECT_EQ(pt::narrow(x, 0, 10, 0).int_sizes(), (IntVec{0}));
}

TEST(OpsView, ArangeWithExtremeBounds) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  Tensor a = pt::arange(kMin, kMax, kMax, DType::I64);
  ASSERT_EQ(a.int_sizes(), (IntVec{3}));
  EXPECT_EQ(pt::select(a, 0, 0).item<int64_t>(), kMin);
  EXPECT_EQ(pt::select(a, 0, 1).item<int64_t>(), -1);
  EXPECT_EQ(pt::select(a, 0, 2).item<int64_t>(), kMax - 1);
  Tensor b = pt::arange(kMax, kMin, kMin, DType::I64);
  ASSERT_EQ(b.int_sizes(), (IntVec{2}));
  EXPECT_EQ(pt::select(b, 0, 1).item<int64_t>(), -1);
  EXPECT_EQ(pt::arange(5, 1, 1, DType::I64).int_sizes(), (IntVec{0}));
}
