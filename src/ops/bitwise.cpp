// Bitwise ops (torch.bitwise_and / or / xor / not / left_shift / right_shift) on integer and bool
// tensors. Both operands must have the same dtype (no promotion: ONNX's BitwiseAnd and BitShift take
// one type) and the result keeps it; a and b broadcast.
//
// Shifts: a count c outside [0, bits of the dtype) is defined here (it is undefined behaviour in C++):
// a left shift or a logical right shift gives 0, an arithmetic right shift gives the sign fill (0 or
// -1). Left shifts wrap at the dtype's width (computed on the unsigned type). The logical right shift
// (attribute logical = true) reads the bits as an unsigned integer of the dtype's width, so a uint64
// carried in i64 shifts as uint64. bool: and / or / xor / not are the logical ops; shifts of bool are
// refused.
#include <fmt/format.h>

#include <type_traits>

#include "ops/dispatch.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

/// Calls f.template operator()<T>() for the integer dtypes and bool.
template <typename F>
void dispatch_int(DType t, F&& f) {
  switch (t) {
    case DType::Bool: f.template operator()<bool>(); return;
    case DType::U8: f.template operator()<uint8_t>(); return;
    case DType::I8: f.template operator()<int8_t>(); return;
    case DType::I32: f.template operator()<int32_t>(); return;
    case DType::I64: f.template operator()<int64_t>(); return;
    case DType::F16: case DType::BF16: case DType::F32: case DType::F64: break;
  }
  throw TypeError(fmt::format("bitwise ops take integer or bool tensors, got {}", short_name(t)));
}

template <OpKind K>
std::vector<TensorMeta> meta_bitwise(Ins in, const Attrs&) {
  constexpr bool kShift = K == OpKind::bitwise_left_shift || K == OpKind::bitwise_right_shift;
  for (const Tensor& t : in)
    if (!t.defined()) throw ValueError(fmt::format("{}: every input is required", describe_call(K, in)));
  const DType t = in[0].dtype();
  if (!is_integral(t, /*include_bool=*/!kShift))
    throw TypeError(fmt::format("{}: takes {} tensors, got {}", describe_call(K, in),
                                kShift ? "integer" : "integer or bool", short_name(t)));
  if (in.size() > 1 && in[1].dtype() != t)
    throw TypeError(fmt::format("{}: both operands must have one dtype (got {} and {}); cast one first",
                                describe_call(K, in), short_name(t), short_name(in[1].dtype())));
  SymIntVec shape = in.size() > 1 ? broadcast_shapes(in, op_name(K)) : in[0].sizes();
  return one(std::move(shape), t);
}

struct And {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else return static_cast<T>(a & b);
  }
};
struct Or {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else return static_cast<T>(a | b);
  }
};
struct Xor {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a != b;
    else return static_cast<T>(a ^ b);
  }
};

template <typename T>
T shift_left(T a, T c) {
  using U = std::make_unsigned_t<T>;
  constexpr int64_t kBits = sizeof(T) * 8;
  if (static_cast<int64_t>(c) < 0 || static_cast<int64_t>(c) >= kBits) return T(0);
  return static_cast<T>(static_cast<U>(static_cast<U>(a) << static_cast<int>(c)));
}
template <typename T>
T shift_right(T a, T c, bool logical) {
  using U = std::make_unsigned_t<T>;
  constexpr int64_t kBits = sizeof(T) * 8;
  const bool out_of_range = static_cast<int64_t>(c) < 0 || static_cast<int64_t>(c) >= kBits;
  if (logical || !std::is_signed_v<T>) {
    if (out_of_range) return T(0);
    return static_cast<T>(static_cast<U>(a) >> static_cast<int>(c));
  }
  if (out_of_range) return a < 0 ? T(-1) : T(0);
  return static_cast<T>(a >> static_cast<int>(c));  // arithmetic on signed types (C++20)
}

template <OpKind K, typename F>
Result k_bitwise(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  dispatch_int(out.dtype(), [&]<typename T>() { kernel::map<T, T, T>(out, {in[0], in[1]}, F{}); });
  return {out};
}
Result k_bitwise_not(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  dispatch_int(out.dtype(), [&]<typename T>() {
    kernel::map<T, T>(out, {in[0]}, [](T a) -> T {
      if constexpr (std::is_same_v<T, bool>) return !a;
      else return static_cast<T>(~a);
    });
  });
  return {out};
}
Result k_shift_left(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  dispatch_int(out.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>)
      kernel::map<T, T, T>(out, {in[0], in[1]}, [](T a, T c) { return shift_left(a, c); });
  });
  return {out};
}
Result k_shift_right(Ins in, const Attrs& attrs, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  const bool logical = attrs.has("logical") && attrs.b("logical");
  dispatch_int(out.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>)
      kernel::map<T, T, T>(out, {in[0], in[1]}, [logical](T a, T c) { return shift_right(a, c, logical); });
  });
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(bitwise_and, meta_bitwise<OpKind::bitwise_and>, (k_bitwise<OpKind::bitwise_and, And>));
PROTEAN_REGISTER_OP(bitwise_or, meta_bitwise<OpKind::bitwise_or>, (k_bitwise<OpKind::bitwise_or, Or>));
PROTEAN_REGISTER_OP(bitwise_xor, meta_bitwise<OpKind::bitwise_xor>, (k_bitwise<OpKind::bitwise_xor, Xor>));
PROTEAN_REGISTER_OP(bitwise_not, meta_bitwise<OpKind::bitwise_not>, k_bitwise_not);
PROTEAN_REGISTER_OP(bitwise_left_shift, meta_bitwise<OpKind::bitwise_left_shift>, k_shift_left);
PROTEAN_REGISTER_OP(bitwise_right_shift, meta_bitwise<OpKind::bitwise_right_shift>, k_shift_right);

}  // namespace protean::ops

namespace protean {

Tensor bitwise_and(const Tensor& a, const Tensor& b) { return ops::call1(ops::OpKind::bitwise_and, {a, b}); }
Tensor bitwise_or(const Tensor& a, const Tensor& b) { return ops::call1(ops::OpKind::bitwise_or, {a, b}); }
Tensor bitwise_xor(const Tensor& a, const Tensor& b) { return ops::call1(ops::OpKind::bitwise_xor, {a, b}); }
Tensor bitwise_not(const Tensor& a) { return ops::call1(ops::OpKind::bitwise_not, {a}); }
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b) {
  return ops::call1(ops::OpKind::bitwise_left_shift, {a, b});
}
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b, bool logical) {
  ops::Attrs attrs;
  if (logical) attrs.set("logical", true);
  return ops::call1(ops::OpKind::bitwise_right_shift, {a, b}, attrs);
}

}  // namespace protean
