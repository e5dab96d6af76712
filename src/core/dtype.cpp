#include "protean/dtype.h"

#include <fmt/format.h>

#include "protean/error.h"

namespace protean {

std::string_view short_name(DType t) {
  switch (t) {
    case DType::Bool: return "b8";
    case DType::U8: return "u8";
    case DType::I8: return "i8";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F32: return "f32";
    case DType::F64: return "f64";
  }
  return "?";
}

std::string_view torch_name(DType t) {
  switch (t) {
    case DType::Bool: return "torch.bool";
    case DType::U8: return "torch.uint8";
    case DType::I8: return "torch.int8";
    case DType::I32: return "torch.int32";
    case DType::I64: return "torch.int64";
    case DType::F16: return "torch.float16";
    case DType::BF16: return "torch.bfloat16";
    case DType::F32: return "torch.float32";
    case DType::F64: return "torch.float64";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias kAliases[] = {
      {"b8", DType::Bool},   {"bool", DType::Bool},     {"u8", DType::U8},       {"uint8", DType::U8},
      {"i8", DType::I8},     {"int8", DType::I8},       {"i32", DType::I32},     {"int32", DType::I32},
      {"i64", DType::I64},   {"int64", DType::I64},     {"f16", DType::F16},     {"float16", DType::F16},
      {"bf16", DType::BF16}, {"bfloat16", DType::BF16}, {"f32", DType::F32},     {"float32", DType::F32},
      {"float", DType::F32}, {"f64", DType::F64},       {"float64", DType::F64}, {"double", DType::F64},
  };
  for (const auto& a : kAliases)
    if (a.name == s) return a.t;
  throw ValueError(fmt::format("unknown dtype '{}' (expected one of f32 f16 bf16 f64 i64 i32 i8 u8 bool)", s));
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::Bool) return b;
  if (b == DType::Bool) return a;
  bool fa = is_floating(a), fb = is_floating(b);
  if (fa && !fb) return a;
  if (fb && !fa) return b;
  if (fa && fb) {
    if ((a == DType::F16 && b == DType::BF16) || (a == DType::BF16 && b == DType::F16)) return DType::F32;
    return static_cast<uint8_t>(a) > static_cast<uint8_t>(b) ? a : b;
  }
  // both integers (u8, i8, i32, i64)
  if ((a == DType::U8 && b == DType::I8) || (a == DType::I8 && b == DType::U8)) return DType::I32;
  return static_cast<uint8_t>(a) > static_cast<uint8_t>(b) ? a : b;
}

Half::Half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff) {  // inf / nan
    bits = static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
    return;
  }
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) {  // overflow → inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (e <= 0) {  // subnormal or zero
    if (e < -10) {
      bits = static_cast<uint16_t>(sign);
      return;
    }
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    bits = static_cast<uint16_t>(sign | h);
    return;
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
  bits = static_cast<uint16_t>(sign | h);
}

Half::operator float() const {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

std::string Device::str() const {
  switch (type) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return fmt::format("cuda:{}", index);
  }
  return "?";
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return kCPU;
  if (s == "cuda") return kCUDA;
  if (s.substr(0, 5) == "cuda:" && s.size() > 5 && s.size() <= 8) {
    int idx = 0;
    bool digits = true;
    for (char c : s.substr(5)) {
      digits = digits && c >= '0' && c <= '9';
      idx = idx * 10 + (c - '0');
    }
    if (digits) return Device{DeviceType::CUDA, idx};
  }
  throw ValueError(fmt::format("unknown device '{}'; expected cpu, cuda or cuda:N", s));
}

}  // namespace protean
