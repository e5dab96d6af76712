// The explicit 16-lane vector form of the cpu backend's innermost loops (codegen.cpp VecBodyEmitter)
// against the interpreter on the inputs and programs where it could go wrong: selects whose branches
// read different (broadcast) buffers, masks from comparisons and logical ops, casts, integer and f64
// values next to f32 ones, strided / permuted / broadcast loads, index-dependent selects (cat, pad)
// reading next to unmapped memory, NaN / inf / -0 / huge / tiny values in the vector part and in the
// tail, rows of every length around 16 and 64, empty dims, reductions over several inner dims, and
// horizontally fused stages sharing loads. Also which loops take the vector form.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/codegen.h"
#include "cpu_test_util.h"
#include "ir_test_util.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu {
namespace {

using namespace loop;  // the loop IR the cpu backend renders

using ir::kNoValue;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::check;
using testing::compile;
using testing::Compiled;

/// randn * scale with special values written at the first element of each row, at element 16 (in the
/// vector part when the row is longer) and at the last element (in the scalar tail). The large finite
/// ones stay below 2^64, whose squares are still finite f32 (interp's reductions accumulate in f64).
Tensor with_specials(const IntVec& sizes, double scale = 2.0) {
  Tensor t = mul(randn(sizes), scale);
  if (t.int_numel() == 0) return t;
  const int64_t row = sizes.back(), rows = t.int_numel() / row;
  const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f, 1e15f, 2e15f, 1e-40f, -1e-30f, 1e18f};
  float* p = t.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 4 == 3) continue;  // some rows stay finite
    float* q = p + r * row;
    q[0] = specials[r % 9];
    if (row > 16) q[16] = specials[(r + 3) % 9];
    if (row > 1) q[row - 1] = specials[(r + 5) % 9];
  }
  return t;
}

// where() whose branches load from different buffers, broadcast along either dim; masks from
// comparisons combined by logical ops; bool <-> f32 casts and casts to the same dtype; NaN-aware
// comparisons (x != x); scalar-constant branches (inf, NaN).
TEST(CpuVectorForm, SelectsMasksAndCastsMatchInterp) {
  manual_seed(31);
  GraphBuilder b("selects");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 20);
  ValueId x = b.input("x", {s0, s1}), w = b.input("w", {s0, s1});
  ValueId row = b.input("row", {s1}), col = b.input("col", {s0, 1});
  ValueId zero = b.constant(scalar_tensor(0.0));
  ValueId ninf = b.constant(scalar_tensor(-INFINITY)), nan = b.constant(scalar_tensor(NAN));
  ValueId gx = b.call(OpKind::gt, {x, zero}), lw = b.call(OpKind::lt, {w, zero});
  std::vector<ValueId> outs;
  outs.push_back(b.call(OpKind::where, {b.call(OpKind::gt, {x, row}), w, col}));
  outs.push_back(b.call(OpKind::where, {b.call(OpKind::le, {col, x}), b.call(OpKind::exp, {row}), b.call(OpKind::neg, {w})}));
  ValueId isnan = b.call(OpKind::ne, {x, x});
  outs.push_back(b.call(OpKind::where, {b.call(OpKind::logical_or, {isnan, b.call(OpKind::ge, {w, row})}), b.call(OpKind::sigmoid, {col}), x}));
  ValueId both = b.call(OpKind::logical_and, {gx, b.call(OpKind::logical_not, {lw})});
  outs.push_back(b.call(OpKind::mul, {x, b.call(OpKind::cast, {both}, {{"dtype", DType::F32}})}));
  outs.push_back(b.call(OpKind::cast, {b.call(OpKind::eq, {gx, lw})}, {{"dtype", DType::F32}}));
  outs.push_back(b.call(OpKind::add, {b.call(OpKind::cast, {x}, {{"dtype", DType::F32}}), w}));  // same-dtype cast
  ValueId bb = b.call(OpKind::cast, {gx}, {{"dtype", DType::Bool}});                          // same-dtype cast
  outs.push_back(b.call(OpKind::where, {bb, x, w}));
  ValueId xb = b.call(OpKind::cast, {x}, {{"dtype", DType::Bool}});                            // NaN, -0 → bool
  outs.push_back(b.call(OpKind::add, {b.call(OpKind::cast, {xb}, {{"dtype", DType::F32}}), w}));
  outs.push_back(b.call(OpKind::where, {gx, ninf, b.call(OpKind::where, {lw, nan, x})}));
  outs.push_back(b.call(OpKind::clamp, {x}, {{"min", -1.0}, {"max", 1.0}}));
  outs.push_back(b.call(OpKind::maximum, {b.call(OpKind::minimum, {x, w}), col}));
  Compiled c = compile(b, outs, {s0, s1});
  EXPECT_NE(generate_kernels(c.cpu->program()).find("pt::vsel("), std::string::npos) << "no vector select";
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{3, 20}, {5, 1}, {2, 16}, {4, 33}, {9, 64}, {3, 129}, {0, 7}, {4, 0}})
    check(c, {with_specials({n0, n1}), with_specials({n0, n1}), with_specials({n1}), with_specials({n0, 1})}, {n0, n1},
          fmt::format("{}x{}", n0, n1));
}

// Floating → integer casts of the values C++ leaves undefined (NaN, ±inf, beyond int32 / int64) and of
// ordinary ones, in the vector part and the scalar tail: the generated code (x86's conversions) and the
// interpreter's eager kernels give the same bits: the type's lowest value for int32 / int64, the low
// bits of the int64 conversion for 8-bit types.
TEST(CpuVectorForm, FloatToIntegerCastsOfOutOfRangeValuesMatchInterp) {
  GraphBuilder b("cast_specials");
  SymInt s0 = b.symbol("x.size()[0]", 40);
  ValueId x = b.input("x", {s0}), d = b.input("d", {s0}, DType::F64);
  std::vector<ValueId> outs;
  for (ValueId v : {x, d})
    for (DType to : {DType::I32, DType::I64, DType::U8, DType::I8})
      outs.push_back(b.call(OpKind::cast, {b.call(OpKind::mul, {v, v == x ? b.constant(scalar_tensor(1.0))
                                                                       : b.constant(scalar_tensor(1.0, DType::F64))})},
                            {{"dtype", to}}));
  Compiled c = compile(b, outs, {s0});
  const std::vector<double> specials = {NAN, INFINITY, -INFINITY, 1e10, -1e10, 3e9, -3e9, 2147483520.0, -2147483648.0,
                                        2147483648.0, 9.3e18, -9.3e18, 300.0, -200.0, 255.9, -0.9, 3.7, -3.7, 0.0, -0.0};
  const int64_t n = 40;  // two vectors of 16 and a tail of 8
  Tensor xf = zeros({n}), xd = zeros({n}, DType::F64);
  for (int64_t i = 0; i < n; ++i) {
    const double v = specials[static_cast<size_t>((i * 7) % static_cast<int64_t>(specials.size()))];
    xf.data_ptr<float>()[i] = static_cast<float>(v);
    xd.data_ptr<double>()[i] = v;
  }
  const std::vector<Tensor> in{xf, xd};
  const std::vector<int64_t> sv{n};
  std::vector<Tensor> a = c.cpu->run(in, sv);
  std::vector<Tensor> r = c.interp->run(in, std::span<const int64_t>(sv));
  ASSERT_EQ(a.size(), r.size());
  for (size_t k = 0; k < a.size(); ++k) {
    ASSERT_EQ(a[k].dtype(), r[k].dtype());
    ASSERT_EQ(std::memcmp(a[k].data_ptr(), r[k].data_ptr(), static_cast<size_t>(n) * a[k].itemsize()), 0)
        << "output " << k << " (" << short_name(a[k].dtype()) << "): compiled " << cast(a[k], DType::F64)
        << " interp " << cast(r[k], DType::F64);
  }
  // The eager values themselves (PyTorch on x86): NaN and 1e10 → int32 lowest, 300 → uint8 44.
  Tensor e = tensor(std::vector<float>{NAN, 1e10f, 300.f, -3.7f}, {4});
  Tensor i32 = cast(e, DType::I32), i64 = cast(e, DType::I64), u8 = cast(e, DType::U8);
  EXPECT_EQ(i32.data_ptr<int32_t>()[0], INT32_MIN);
  EXPECT_EQ(i32.data_ptr<int32_t>()[1], INT32_MIN);
  EXPECT_EQ(i32.data_ptr<int32_t>()[3], -3);
  EXPECT_EQ(i64.data_ptr<int64_t>()[0], INT64_MIN);
  EXPECT_EQ(i64.data_ptr<int64_t>()[1], int64_t{10000000000});
  EXPECT_EQ(u8.data_ptr<uint8_t>()[0], 0);
  EXPECT_EQ(u8.data_ptr<uint8_t>()[2], 44);
  EXPECT_EQ(u8.data_ptr<uint8_t>()[3], 253);
}

// Integer and f64 values next to f32 ones in one kernel: casts from i32 / i64 / f64, comparisons on
// integers as where() conditions, an f64 output and an i64 output fused with f32 outputs.
TEST(CpuVectorForm, IntegerAndF64ValuesNextToF32MatchInterp) {
  manual_seed(32);
  GraphBuilder b("mixed");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 20);
  ValueId x = b.input("x", {s0, s1});
  ValueId i = b.input("i", {s0, s1}, DType::I32), l = b.input("l", {s1}, DType::I64), d = b.input("d", {s0, s1}, DType::F64);
  ValueId m = b.input("m", {s0, s1}, DType::Bool);
  std::vector<ValueId> outs;
  outs.push_back(b.call(OpKind::mul, {x, b.call(OpKind::cast, {i}, {{"dtype", DType::F32}})}));
  outs.push_back(b.call(OpKind::where, {b.call(OpKind::gt, {i, b.constant(scalar_tensor(int64_t{0}))}), x, b.call(OpKind::exp, {x})}));
  outs.push_back(b.call(OpKind::add, {x, d}));                                      // f64
  outs.push_back(b.call(OpKind::add, {b.call(OpKind::cast, {x}, {{"dtype", DType::I64}}), l}));  // i64
  outs.push_back(b.call(OpKind::where, {m, x, b.call(OpKind::cast, {d}, {{"dtype", DType::F32}})}));  // bool loads
  outs.push_back(b.call(OpKind::tanh, {x}));
  outs.push_back(b.call(OpKind::sum, {b.call(OpKind::mul, {x, b.call(OpKind::cast, {m}, {{"dtype", DType::F32}})})},
                        {{"dims", SymIntVec{1}}, {"keepdim", false}}));
  Compiled c = compile(b, outs, {s0, s1});
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{3, 20}, {2, 64}, {5, 131}, {1, 1}}) {
    Tensor xt = mul(randn({n0, n1}), 3.0);  // finite: the f32 → i64 cast of inf / NaN is undefined
    check(c, {xt, randint(-4, 4, {n0, n1}, DType::I32), randint(-9, 9, {n1}), randn({n0, n1}, DType::F64),
              gt(randn({n0, n1}), scalar_tensor(0.0))},
          {n0, n1}, fmt::format("{}x{}", n0, n1));
  }
}

// Loads that are not unit-stride in the innermost index (permuted, strided slices, reshapes of
// permuted values) stay scalar; broadcast loads are hoisted as scalars; results match interp.
TEST(CpuVectorForm, StridedPermutedAndBroadcastLoadsMatchInterp) {
  manual_seed(33);
  GraphBuilder b("strided");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[2]", 20);
  std::optional<sym::ShapeEnvScope> scope(std::in_place, b.env);
  ValueId x = b.input("x", {s0, 6, s1});
  ValueId y = b.input("y", {s1, 6, s0});
  ValueId col = b.input("col", {s0, 6, 1});
  std::vector<ValueId> outs;
  ValueId yp = b.call(OpKind::permute, {y}, {{"dims", SymIntVec{2, 1, 0}}});  // [s0, 6, s1], stride s0*6 along s1
  outs.push_back(b.call(OpKind::mul, {b.call(OpKind::exp, {x}), yp}));
  ValueId sl = b.call(OpKind::slice, {x}, {{"dim", SymInt(1)}, {"start", SymInt(0)}, {"end", SymInt(6)}, {"step", SymInt(2)}});
  outs.push_back(b.call(OpKind::mul, {sl, b.call(OpKind::sigmoid, {sl})}));
  ValueId sl2 = b.call(OpKind::slice, {b.call(OpKind::permute, {x}, {{"dims", SymIntVec{0, 2, 1}}})},
                       {{"dim", SymInt(2)}, {"start", SymInt(1)}, {"end", SymInt(6)}, {"step", SymInt(2)}});  // [s0, s1, 3]
  outs.push_back(b.call(OpKind::tanh, {sl2}));
  ValueId pr = b.call(OpKind::reshape, {b.call(OpKind::permute, {x}, {{"dims", SymIntVec{0, 2, 1}}})}, {{"shape", SymIntVec{s0, s1 * 6}}});
  outs.push_back(b.call(OpKind::sub, {pr, b.call(OpKind::amax, {pr}, {{"dims", SymIntVec{1}}, {"keepdim", true}})}));
  outs.push_back(b.call(OpKind::softmax, {yp}, {{"dim", SymInt(2)}}));
  outs.push_back(b.call(OpKind::var, {yp}, {{"dims", SymIntVec{2}}, {"keepdim", false}, {"correction", SymInt(1)}}));
  outs.push_back(b.call(OpKind::mul, {b.call(OpKind::expand, {col}, {{"sizes", SymIntVec{s0, 6, s1}}}), x}));
  scope.reset();
  Compiled c = compile(b, outs, {s0, s1});
  const std::string code = generate_kernels(c.cpu->program());
  // no vector load of the permuted input: its innermost stride is not 1
  const int yb = [&] {
    for (const Buffer& buf : c.cpu->program().buffers)
      if (buf.kind == BufferKind::Input && buf.input_index == 1) return buf.id;
    return -1;
  }();
  ASSERT_GE(yb, 0);
  EXPECT_EQ(code.find(fmt::format("pt::vld(&b{}[", yb)), std::string::npos) << code;
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{3, 20}, {2, 16}, {1, 65}, {4, 3}, {0, 5}})
    check(c, {with_specials({n0, 6, n1}), with_specials({n1, 6, n0}), with_specials({n0, 6, 1})}, {n0, n1},
          fmt::format("{}x{}", n0, n1));
  // non-contiguous inputs are accepted
  Tensor big = with_specials({20, 6, 3});
  check(c, {permute(big, {2, 1, 0}), with_specials({20, 6, 3}), with_specials({3, 6, 1})}, {3, 20}, "noncontiguous");
}

/// `n` floats readable at the returned address with unmapped pages on both sides, so a kernel that
/// reads before the first or after the last element faults. `at_end`: the data ends at the page
/// boundary (else it starts at one).
class GuardedFloats {
 public:
  GuardedFloats(const Tensor& src, bool at_end) {
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    bytes_ = static_cast<size_t>(src.int_numel()) * sizeof(float);
    const size_t data_pages = (bytes_ + page - 1) / page + 1;
    len_ = (data_pages + 2) * page;
    base_ = static_cast<char*>(mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    mprotect(base_, page, PROT_NONE);
    mprotect(base_ + len_ - page, page, PROT_NONE);
    char* data = at_end ? base_ + len_ - page - bytes_ : base_ + page;
    std::memcpy(data, src.contiguous().data_ptr(), bytes_);
    tensor_ = from_blob(data, src.int_sizes(), DType::F32);
  }
  ~GuardedFloats() { munmap(base_, len_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  const Tensor& tensor() const { return tensor_; }

 private:
  char* base_ = nullptr;
  size_t len_ = 0, bytes_ = 0;
  Tensor tensor_;
};

// cat and pad select by index: in the vector form each branch's loads are masked by the select's
// condition (pt::vldm), so no load runs outside its input, checked with the inputs placed next to
// unmapped pages; a branch holding a load that does not vary with the row keeps the scalar form.
TEST(CpuVectorForm, CatAndPadNeverReadOutsideTheirInputs) {
  manual_seed(34);
  GraphBuilder b("catpad");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 20);
  std::optional<sym::ShapeEnvScope> scope(std::in_place, b.env);
  ValueId x = b.input("x", {s0, s1}), y = b.input("y", {s0, 5}), col = b.input("col", {s0, 1});
  std::vector<ValueId> outs;
  ValueId cat1 = b.call(OpKind::cat, std::vector<ValueId>{x, y}, {{"dim", SymInt(1)}});  // [s0, s1 + 5]
  outs.push_back(b.call(OpKind::exp, {cat1}));
  outs.push_back(b.call(OpKind::softmax, {cat1}, {{"dim", SymInt(1)}}));
  ValueId cat0 = b.call(OpKind::cat, std::vector<ValueId>{x, x}, {{"dim", SymInt(0)}});  // [2 s0, s1]
  outs.push_back(b.call(OpKind::tanh, {cat0}));
  ValueId pad = b.call(OpKind::pad, {x}, {{"pads", SymIntVec{3, 2, 1, 1}}, {"mode", std::string("constant")}, {"value", -1.5}});
  outs.push_back(b.call(OpKind::sigmoid, {pad}));
  outs.push_back(b.call(OpKind::sum, {pad}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
  outs.push_back(b.call(OpKind::amax, {pad}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
  ValueId ex = b.call(OpKind::expand, {col}, {{"sizes", SymIntVec{s0, s1}}});  // broadcast along the row, then padded
  ValueId pe = b.call(OpKind::pad, {ex}, {{"pads", SymIntVec{1, 1, 2, 1}}, {"mode", std::string("constant")}, {"value", 0.0}});
  outs.push_back(b.call(OpKind::mul, {pe, b.call(OpKind::exp, {pe})}));
  ValueId cut = b.call(OpKind::pad, {x}, {{"pads", SymIntVec{-1, 2}}, {"mode", std::string("constant")}, {"value", 2.0}});
  outs.push_back(b.call(OpKind::layer_norm, {cut, kNoValue, kNoValue}, {{"normalized_shape", SymIntVec{s1 + 1}}, {"eps", 1e-5}}));
  scope.reset();
  Compiled c = compile(b, outs, {s0, s1});
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{3, 20}, {2, 16}, {1, 64}, {4, 1}, {2, 100}}) {
    for (bool at_end : {true, false}) {
      GuardedFloats gx(with_specials({n0, n1}), at_end), gy(with_specials({n0, 5}), at_end), gc(randn({n0, 1}), at_end);
      check(c, {gx.tensor(), gy.tensor(), gc.tensor()}, {n0, n1}, fmt::format("{}x{} {}", n0, n1, at_end ? "end" : "start"));
    }
  }
}

// NaN / inf / -0 / huge values in the vector part and in the tail of row reductions and
// normalizations, rows of lengths around the vector (16) and lane-block (64) sizes.
TEST(CpuVectorForm, ReductionsWithSpecialValuesMatchInterp) {
  manual_seed(35);
  GraphBuilder b("reductions");
  SymInt s0 = b.symbol("x.size()[0]", 9), s1 = b.symbol("x.size()[1]", 20);
  ValueId x = b.input("x", {s0, s1});
  ValueId wt = b.input("w", {s1});
  std::vector<ValueId> outs;
  auto red = [&](OpKind op) {
    ops::Attrs a{{"dims", SymIntVec{1}}, {"keepdim", false}};
    if (op == OpKind::var) a.set("correction", SymInt(1));
    outs.push_back(b.call(op, {x}, a));
  };
  for (OpKind op : {OpKind::amax, OpKind::amin, OpKind::sum, OpKind::prod, OpKind::mean, OpKind::var}) red(op);
  outs.push_back(b.call(OpKind::softmax, {x}, {{"dim", SymInt(1)}}));
  outs.push_back(b.call(OpKind::log_softmax, {x}, {{"dim", SymInt(1)}}));
  outs.push_back(b.call(OpKind::layer_norm, {x, wt, kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}}));
  outs.push_back(b.call(OpKind::rms_norm, {x, wt}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-6}}));
  Compiled c = compile(b, outs, {s0, s1});
  for (int64_t n1 : {1, 2, 15, 16, 17, 31, 48, 63, 64, 65, 80, 127, 128, 129, 191, 300}) {
    check(c, {with_specials({9, n1}), randn({n1})}, {9, n1}, fmt::format("specials 9x{}", n1));
    Tensor m = mul(randn({9, n1}), 0.5);  // magnitudes from 1e-30 to 1e12 per row, rows of equal values
    float* p = m.data_ptr<float>();
    for (int64_t r = 0; r < 9; ++r)
      for (int64_t j = 0; j < n1; ++j) p[r * n1 + j] = r == 8 ? -0.0f : r == 7 ? 100.0f : p[r * n1 + j] * std::pow(10.0f, float(6 * r - 30));
    check(c, {m, randn({n1})}, {9, n1}, fmt::format("magnitudes 9x{}", n1));
  }
}

// Reductions over several inner dims (the vector form on the innermost one, scalar loops around it),
// with lengths that are not multiples of 16 and empty dims.
TEST(CpuVectorForm, ReductionsOverSeveralInnerDimsMatchInterp) {
  manual_seed(36);
  GraphBuilder b("multi");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 5), s2 = b.symbol("x.size()[2]", 20);
  ValueId x = b.input("x", {s0, s1, s2});
  std::vector<ValueId> outs;
  for (OpKind op : {OpKind::amax, OpKind::amin, OpKind::sum, OpKind::prod, OpKind::var, OpKind::mean}) {
    ops::Attrs a{{"dims", SymIntVec{1, 2}}, {"keepdim", true}};
    if (op == OpKind::var) a.set("correction", SymInt(0));
    outs.push_back(b.call(op, {op == OpKind::prod ? b.call(OpKind::sigmoid, {x}) : x}, a));
  }
  outs.push_back(b.call(OpKind::layer_norm, {x, kNoValue, kNoValue}, {{"normalized_shape", SymIntVec{s1, s2}}, {"eps", 1e-5}}));
  outs.push_back(b.call(OpKind::sum, {b.call(OpKind::exp, {x})}, {{"dims", SymIntVec{0, 2}}, {"keepdim", false}}));
  Compiled c = compile(b, outs, {s0, s1, s2});
  for (auto [n0, n1, n2] : std::vector<std::array<int64_t, 3>>{{3, 5, 20}, {2, 3, 64}, {2, 7, 65}, {1, 2, 129}, {4, 1, 17}, {2, 3, 1}})
    check(c, {with_specials({n0, n1, n2})}, {n0, n1, n2}, fmt::format("{}x{}x{}", n0, n1, n2));
  for (auto [n0, n1, n2] : std::vector<std::array<int64_t, 3>>{{3, 5, 20}, {2, 7, 65}})
    check(c, {randn({n0, n1, n2})}, {n0, n1, n2}, fmt::format("finite {}x{}x{}", n0, n1, n2));
}

// exp, tanh, sigmoid, gelu (both forms), silu, erf, hardswish on very large and very small
// magnitudes, in the vector part and in the tail, in the pointwise (one outer loop) and the row forms.
TEST(CpuVectorForm, TranscendentalsAtExtremeMagnitudesMatchInterp) {
  GraphBuilder b("extremes");
  SymInt s0 = b.symbol("x.size()[0]", 2), s1 = b.symbol("x.size()[1]", 40);
  ValueId x = b.input("x", {s0, s1});
  ValueId flat = b.input("flat", {s1});
  std::vector<ValueId> outs;
  for (ValueId v : {x, flat}) {
    for (OpKind op : {OpKind::exp, OpKind::tanh, OpKind::sigmoid, OpKind::silu, OpKind::erf, OpKind::hardswish})
      outs.push_back(b.call(op, {v}));
    outs.push_back(b.call(OpKind::gelu, {v}, {{"approximate", std::string("none")}}));
    outs.push_back(b.call(OpKind::gelu, {v}, {{"approximate", std::string("tanh")}}));
  }
  Compiled c = compile(b, outs, {s0, s1});
  std::vector<float> vals = {0.0f,   -0.0f,  1e-40f, -1e-40f, 1e-30f, -1e-30f, 0.3f,   -0.3f,   0.62f,  0.63f,
                             5.0f,   -5.0f,  9.0f,   -9.0f,   20.0f,  -20.0f,  80.0f,  -80.0f,  87.3f,  -87.3f,
                             88.72f, 88.73f, -88.8f, 89.0f,   -89.0f, -103.9f, -104.0f, -110.0f, 200.0f, -200.0f,
                             1e10f,  -1e10f, 3e38f,  -3e38f,  INFINITY, -INFINITY, NAN,    -NAN};
  for (int64_t n1 : {38, 17, 64, 100}) {
    std::vector<float> row(static_cast<size_t>(n1));
    for (int64_t j = 0; j < n1; ++j) row[static_cast<size_t>(j)] = vals[static_cast<size_t>((j * 7 + n1) % static_cast<int64_t>(vals.size()))];
    std::vector<float> two = row;
    two.insert(two.end(), row.rbegin(), row.rend());
    check(c, {tensor(two, {2, n1}), tensor(row, {n1})}, {2, n1}, fmt::format("2x{}", n1));
  }
}

// sqrt, floor, ceil and round (half to even) in the vector part (one AVX-512 instruction each) and in
// the scalar tail equal the interpreter bit for bit: halves, values next to them, -0 and the sign of
// a zero result (ceil(-0.3) is -0), integers beyond 2^23, tiny, huge, negative (sqrt: NaN), inf, NaN.
TEST(CpuVectorForm, SqrtAndRoundingMatchInterpBitForBit) {
  GraphBuilder b("rounding");
  SymInt s0 = b.symbol("x.size()[0]", 40);
  ValueId x = b.input("x", {s0});
  std::vector<ValueId> outs;
  for (OpKind op : {OpKind::sqrt, OpKind::floor, OpKind::ceil, OpKind::round}) outs.push_back(b.call(op, {x}));
  Compiled c = compile(b, outs, {s0});
  const std::vector<float> vals = {0.5f,  1.5f,   2.5f,        -0.5f,      -1.5f,     -2.5f,     0.49999997f, -0.49999997f,
                                   0.0f,  -0.0f,  -0.3f,       0.3f,       1e-40f,    -1e-40f,   8388609.0f,  -8388609.5f,
                                   1e30f, -1e30f, 3.4e38f,     -1.0f,      2.0f,      1e-30f,    INFINITY,    -INFINITY,
                                   NAN,   -NAN,   4194304.5f,  -4194304.5f, 100.25f,  7.75f,     -7.75f,      0.75f};
  for (int64_t n : {32, 40, 16, 7}) {
    std::vector<float> row(static_cast<size_t>(n));
    for (int64_t j = 0; j < n; ++j) row[static_cast<size_t>(j)] = vals[static_cast<size_t>((j * 5 + n) % static_cast<int64_t>(vals.size()))];
    const std::vector<Tensor> in = {tensor(row, {n})};
    const std::vector<int64_t> sym = {n};
    std::vector<Tensor> got = c.cpu->run(in, sym);
    std::vector<Tensor> want = c.interp->run(in, std::span<const int64_t>(sym));
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      const std::vector<float> g = got[o].contiguous().to_vector<float>(), w = want[o].contiguous().to_vector<float>();
      ASSERT_EQ(g.size(), w.size());
      for (size_t i = 0; i < g.size(); ++i) {
        uint32_t gb = 0, wb = 0;
        std::memcpy(&gb, &g[i], 4);
        std::memcpy(&wb, &w[i], 4);
        const bool both_nan = std::isnan(g[i]) && std::isnan(w[i]);
        EXPECT_TRUE(both_nan || gb == wb) << "n=" << n << " output " << o << " of " << row[i] << ": got " << g[i]
                                          << ", want " << w[i];
      }
    }
  }
}

// A multiply of one op followed by an add of the next must not become one fused multiply-add: the
// product's overflow has to show (exp(1e18) + -inf is NaN, exp(89) - 3e38 is inf). Checked in the
// vector part, in the scalar tail and in a scalar loop over a permuted (strided) operand.
TEST(CpuVectorForm, SeparateMultiplyAndAddKeepTheirOverflow) {
  GraphBuilder b("no_contraction");
  SymInt s0 = b.symbol("x.size()[0]", 2), s1 = b.symbol("x.size()[2]", 20);
  ValueId x = b.input("x", {s0, 6, s1}), y = b.input("y", {s0, 6, s1}), yt = b.input("yt", {s0, s1, 6});
  ValueId e = b.call(OpKind::exp, {x});
  ValueId direct = b.call(OpKind::add, {e, y});
  ValueId strided = b.call(OpKind::add, {e, b.call(OpKind::permute, {yt}, {{"dims", SymIntVec{0, 2, 1}}})});
  ValueId scaled = b.call(OpKind::add, {b.call(OpKind::mul, {x, y}), y});
  Compiled c = compile(b, {direct, strided, scaled}, {s0, s1});
  for (int64_t n : {37, 16, 3}) {
    Tensor xt = full({2, 6, n}, 1e18), yv = full({2, 6, n}, -INFINITY);
    float* px = xt.data_ptr<float>();
    float* py = yv.data_ptr<float>();
    for (int64_t i = 0; i < xt.int_numel(); i += 2) {
      px[i] = 89.0f;
      py[i] = -3e38f;
    }
    Tensor ytt = permute(yv, {0, 2, 1}).contiguous();
    auto out = c.cpu->run(std::vector<Tensor>{xt, yv, ytt}, std::vector<int64_t>{2, n});
    for (int k = 0; k < 2; ++k) {
      const float* o = out[static_cast<size_t>(k)].data_ptr<float>();
      for (int64_t i = 0; i < xt.int_numel(); ++i) {
        if (i % 2 == 0) EXPECT_EQ(o[i], INFINITY) << "output " << k << " n=" << n << " at " << i;
        else EXPECT_TRUE(std::isnan(o[i])) << "output " << k << " n=" << n << " at " << i << ": " << o[i];
      }
    }
    check(c, {xt, yv, ytt}, {2, n}, fmt::format("n={}", n));
  }
}

// Horizontally fused stages sharing loads: pointwise outputs, row reductions and normalizations of
// the same inputs in one kernel.
// A causal softmax (scaled_dot_product_attention with is_causal, the mask never materialized): the
// mask `j > i` of the max stage and the `i < j` the fused stages see after substitution are one value
// (lower.h canonical_body), so exp runs once per element; the masked reductions take the vector form
// (a mask from lane offsets, pt::vlin). Lengths around 16 and 64, symbolic.
TEST(CpuVectorForm, CausalSoftmaxIsOneVectorKernelWithOneExp) {
  manual_seed(38);
  GraphBuilder b("causal");
  SymInt s0 = b.symbol("q.size()[1]", 37);
  ValueId q = b.input("q", {2, s0, 16}), k = b.input("k", {2, s0, 16}), v = b.input("v", {2, s0, 16});
  ValueId o = b.call(OpKind::scaled_dot_product_attention, {q, k, v, ir::kNoValue}, {{"is_causal", true}});
  setenv("PROTEAN_CPU_FUSED_ATTENTION", "0", 1);  // the decomposed form (the fused kernel: CpuSdpa.*)
  Compiled c = compile(b, {o}, {s0});
  unsetenv("PROTEAN_CPU_FUSED_ATTENTION");
  const std::string kernels = c.info.source.substr(c.info.source.find("extern \"C\""));
  EXPECT_NE(kernels.find("pt::vlin("), std::string::npos) << kernels;
  size_t exps = 0;
  for (size_t at = kernels.find("exp("); at != std::string::npos; at = kernels.find("exp(", at + 1)) ++exps;
  EXPECT_EQ(exps, 2u) << "one vector exp and one in the scalar tail\n" << kernels;
  for (int64_t n : {37, 16, 1, 64, 65, 100})
    check(c, {randn({2, n, 16}), randn({2, n, 16}), randn({2, n, 16})}, {n}, fmt::format("L={}", n));
}

TEST(CpuVectorForm, FusedStagesSharingLoadsMatchInterp) {
  manual_seed(37);
  GraphBuilder b("shared");
  SymInt s0 = b.symbol("x.size()[0]", 4), s1 = b.symbol("x.size()[1]", 70);
  ValueId x = b.input("x", {s0, s1}), y = b.input("y", {s0, s1});
  std::vector<ValueId> outs;
  outs.push_back(b.call(OpKind::exp, {x}));
  outs.push_back(b.call(OpKind::mul, {x, y}));
  outs.push_back(b.call(OpKind::where, {b.call(OpKind::gt, {x, y}), y, x}));
  outs.push_back(b.call(OpKind::sum, {b.call(OpKind::mul, {x, y})}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
  outs.push_back(b.call(OpKind::amax, {y}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
  outs.push_back(b.call(OpKind::var, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}, {"correction", SymInt(1)}}));
  outs.push_back(b.call(OpKind::softmax, {y}, {{"dim", SymInt(1)}}));
  Compiled c = compile(b, outs, {s0, s1});
  EXPECT_EQ(c.info.kernels, 1) << c.info.loop_ir;
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{4, 70}, {3, 16}, {5, 64}, {2, 1}, {0, 9}}) {
    check(c, {with_specials({n0, n1}), with_specials({n0, n1})}, {n0, n1}, fmt::format("{}x{}", n0, n1));
    check(c, {randn({n0, n1}), randn({n0, n1})}, {n0, n1}, fmt::format("finite {}x{}", n0, n1));
  }
}

}  // namespace
}  // namespace protean::backend::cpu
