// Element types, devices and type promotion.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace protean {

/// Element types. Order is the promotion lattice order inside each category (bool < integers <
/// floating). Names in IR text use the short form (`f32`), printing uses PyTorch's (`torch.float32`).
enum class DType : uint8_t { Bool, U8, I8, I32, I64, F16, BF16, F32, F64 };
inline constexpr int kNumDTypes = 9;

/// Bytes per element.
constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: case DType::U8: case DType::I8: return 1;
    case DType::F16: case DType::BF16: return 2;
    case DType::I32: case DType::F32: return 4;
    case DType::I64: case DType::F64: return 8;
  }
  return 0;
}
constexpr bool is_floating(DType t) {
  return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64;
}
constexpr bool is_integral(DType t, bool include_bool = false) {
  switch (t) {
    case DType::Bool: return include_bool;
    case DType::U8: case DType::I8: case DType::I32: case DType::I64: return true;
    case DType::F16: case DType::BF16: case DType::F32: case DType::F64: return false;
  }
  return false;
}
/// Short name used in IR text: f32, f16, bf16, f64, i64, i32, i8, u8, b8 (bool).
std::string_view short_name(DType t);
/// PyTorch-style name: torch.float32 ...
std::string_view torch_name(DType t);
/// Parses a short name ("f32") or an ONNX/NumPy-ish alias ("float32", "int64", "bool").
/// Throws protean::ValueError on an unknown name.
DType parse_dtype(std::string_view s);

/// PyTorch's promote_types: the smallest type both promote to (i64+f16 → f16, f16+bf16 → f32,
/// bool+u8 → u8). PyTorch promotes u8+i8 to i16; Protean has no i16 and returns i32.
DType promote_types(DType a, DType b);

/// Half-precision storage types. Arithmetic happens in float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f);
  operator float() const;  // NOLINT(google-explicit-constructor)
};
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = 0x7fc0; return; }  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                                    // round to nearest even
    bits = static_cast<uint16_t>(u >> 16);
  }
  operator float() const {  // NOLINT(google-explicit-constructor)
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

/// C++ type of each dtype, for kernels: `DTypeCpp<DType::F32>::type` is float.
template <DType D> struct DTypeCpp;
template <> struct DTypeCpp<DType::Bool> { using type = bool; };
template <> struct DTypeCpp<DType::U8> { using type = uint8_t; };
template <> struct DTypeCpp<DType::I8> { using type = int8_t; };
template <> struct DTypeCpp<DType::I32> { using type = int32_t; };
template <> struct DTypeCpp<DType::I64> { using type = int64_t; };
template <> struct DTypeCpp<DType::F16> { using type = Half; };
template <> struct DTypeCpp<DType::BF16> { using type = BFloat16; };
template <> struct DTypeCpp<DType::F32> { using type = float; };
template <> struct DTypeCpp<DType::F64> { using type = double; };

/// Calls `f.template operator()<T>()` with T the C++ type of `t`. Usage:
///   dispatch_dtype(t, [&]<typename T>() { ... });
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::Bool: return f.template operator()<bool>();
    case DType::U8: return f.template operator()<uint8_t>();
    case DType::I8: return f.template operator()<int8_t>();
    case DType::I32: return f.template operator()<int32_t>();
    case DType::I64: return f.template operator()<int64_t>();
    case DType::F16: return f.template operator()<Half>();
    case DType::BF16: return f.template operator()<BFloat16>();
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
  }
  return f.template operator()<float>();
}

/// Devices. CPU, and CUDA devices reached through the driver API loaded at run time (a CUDA tensor
/// needs a driver and a device: RuntimeError otherwise). Eager ops without a device kernel run on a
/// host copy (a `perf_hints` log line); compiled functions on CUDA tensors use backend `cuda`.
enum class DeviceType : uint8_t { CPU, CUDA };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:0"
};
inline constexpr Device kCPU{DeviceType::CPU, 0};
inline constexpr Device kCUDA{DeviceType::CUDA, 0};
/// Parses "cpu", "cuda", "cuda:N" (torch.device's strings). ValueError otherwise.
Device parse_device(std::string_view s);

}  // namespace protean
