// Reference helpers shared by the op tests (ops_pointwise/reduction/norm_test.cpp): element access by
// dtype, tensors in contiguous / column-major / strided-with-offset layouts, float64 reference values,
// per-dtype tolerances, broadcasting index math. Independent of the kernels under test.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ops/registry.h"
#include "protean/protean.h"

namespace ops_test {

namespace pt = protean;
using pt::DType;
using pt::IntVec;
using pt::Tensor;
using pt::ops::Attrs;
using pt::ops::OpKind;

enum Layout { kContig, kColMajor, kStrided };

inline double read_elem(const void* base, DType t, int64_t i) {
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
inline void write_elem(void* base, DType t, int64_t i, double v) {
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
inline int64_t numel_of(const IntVec& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}
/// Row-major element values of any strided tensor, read through its strides.
inline std::vector<double> values(const Tensor& t) {
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
inline Tensor make(const IntVec& sz, DType t, Layout layout, const std::function<double()>& gen) {
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
inline std::mt19937_64& rng() {
  static std::mt19937_64 g(1234);
  return g;
}
inline std::function<double()> uniform(double lo, double hi, bool integer = false) {
  return [=]() {
    double v = std::uniform_real_distribution<double>(lo, hi)(rng());
    return integer ? std::floor(v) : v;
  };
}
inline bool is_float(DType t) { return pt::is_floating(t); }
inline double rtol_of(DType t) {
  switch (t) {
    case DType::F16: return 4e-3;
    case DType::BF16: return 2e-2;
    case DType::F32: return 2e-6;
    case DType::F64: return 1e-12;
    default: return 0;
  }
}
/// Expects `out` (any layout) to equal ref elementwise within the dtype's tolerance; NaNs must match.
inline void expect_values(const Tensor& out, const std::vector<double>& ref, const std::string& what, double atol = -1) {
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
inline double round_to(double v, DType t) {
  double buf[1];
  write_elem(buf, t, 0, v);
  return read_elem(buf, t, 0);
}
/// Runs the op eagerly and checks the meta function's output metadata against the result.
inline Tensor run(OpKind op, std::vector<Tensor> in, const Attrs& attrs = {}) {
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
inline int64_t bcast_index(const IntVec& idx, const IntVec& in) {
  int64_t off = 0;
  size_t lead = idx.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) off = off * in[d] + (in[d] == 1 ? 0 : idx[lead + d]);
  return off;
}
inline IntVec bshape(const IntVec& a, const IntVec& b) {
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
inline void for_each_index(const IntVec& shape, const std::function<void(const IntVec&)>& f) {
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

}  // namespace ops_test
