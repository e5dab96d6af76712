#include <gtest/gtest.h>

#include <cmath>

#include "ops/registry.h"
#include "protean/protean.h"

namespace pt = protean;

TEST(CoreTensor, EmptyIsAlignedAndContiguous) {
  pt::Tensor t = pt::empty({3, 5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.int_strides(), (pt::IntVec{35, 7, 1}));
  EXPECT_EQ(t.numel().hint(), 105);
  EXPECT_EQ(t.size(-1).hint(), 7);
  EXPECT_THROW(t.size(3), pt::ValueError);
}

TEST(CoreTensor, FromBlobSharesMemory) {
  std::vector<float> v{1, 2, 3, 4, 5, 6};
  pt::Tensor t = pt::from_blob(v.data(), {2, 3}, pt::DType::F32);
  EXPECT_EQ(t.data_ptr<float>(), v.data());
  v[4] = 42;
  EXPECT_EQ(t.to_vector<float>()[4], 42.f);
}

TEST(CoreTensor, HalfRoundTrip) {
  for (float f : {0.f, 1.f, -2.5f, 65504.f, 6.1035156e-05f, 5.9604645e-08f, 0.1f}) {
    pt::Half h(f);
    EXPECT_NEAR(static_cast<float>(h), f, std::abs(f) * 1e-3 + 1e-8) << f;
  }
  EXPECT_TRUE(std::isinf(static_cast<float>(pt::Half(1e6f))));
  pt::BFloat16 b(3.140625f);
  EXPECT_EQ(static_cast<float>(b), 3.140625f);
}

TEST(CoreTensor, PromoteTypes) {
  using D = pt::DType;
  EXPECT_EQ(pt::promote_types(D::I64, D::F16), D::F16);
  EXPECT_EQ(pt::promote_types(D::F16, D::BF16), D::F32);
  EXPECT_EQ(pt::promote_types(D::Bool, D::U8), D::U8);
  EXPECT_EQ(pt::promote_types(D::I32, D::I64), D::I64);
  EXPECT_EQ(pt::promote_types(D::F32, D::F64), D::F64);
  EXPECT_EQ(pt::parse_dtype("float32"), D::F32);
  EXPECT_THROW(pt::parse_dtype("complex64"), pt::ValueError);
}

TEST(CoreTensor, OpTableNamesRoundTrip) {
  for (size_t i = 0; i < pt::ops::kNumOps; ++i) {
    auto op = static_cast<pt::ops::OpKind>(i);
    auto back = pt::ops::op_from_name(pt::ops::op_name(op));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, op);
  }
}

TEST(CoreTensor, SymIntPlainArithmeticIsFloorSemantics) {
  pt::SymInt a(-7), b(2);
  EXPECT_EQ((a / b).hint(), -4);
  EXPECT_EQ((a % b).hint(), 1);
  EXPECT_EQ(pt::ceil_div(pt::SymInt(7), 2).hint(), 4);
  EXPECT_TRUE(static_cast<bool>(a < b));
  EXPECT_FALSE(a.is_symbolic());
}
