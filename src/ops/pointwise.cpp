// Pointwise ops: unary math and activations, cast, binary arithmetic/comparison/logical ops with
// broadcasting and type promotion, where; plus the numerics helpers allclose / max_abs_diff.
//
// Dtype rules (PyTorch's):
//  * math functions (exp, log, sin, cos, tanh, erf, sqrt, rsqrt, reciprocal, sigmoid) and div turn
//    bool/integer inputs into f32; activations gelu/silu/hardsigmoid/hardswish need a floating input.
//  * abs, neg, relu, sign, ceil, floor, round, clamp keep the dtype (ceil/floor/round of integers copy);
//    neg/relu/ceil/floor/round/clamp of bool are TypeErrors.
//  * binary ops compute in result_type(a, b); comparisons and logical ops return bool.
//  * integer arithmetic wraps (two's complement), as in PyTorch; pow of integers uses integer
//    exponentiation (a negative exponent gives 0 unless the base is 1 or -1).
//  * f16/bf16 compute in float and round once on store.
// NaN: maximum/minimum/clamp/relu propagate NaN; sign(NaN) = 0; round is half-to-even (nearbyint).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace kernel {

namespace {
template <typename O, typename I>
inline O convert(I v) {
  if constexpr (std::is_same_v<O, I>) {
    return v;
  } else if constexpr (std::is_same_v<O, bool>) {
    return static_cast<OpMath<I>>(v) != OpMath<I>(0);
  } else if constexpr (is_float_v<O>) {
    if constexpr (std::is_same_v<O, double>) return static_cast<double>(static_cast<OpMath<I>>(v));
    else return static_cast<O>(static_cast<OpMath<O>>(static_cast<OpMath<I>>(v)));
  } else if constexpr (is_float_v<I>) {
    // floating → integer truncates toward zero. The values C++ leaves undefined are defined as x86's
    // conversion instructions give them, which is what the cpu backend's generated casts and PyTorch
    // on x86 produce: NaN, ±inf and anything outside int32 / int64 give that type's lowest value (the
    // "integer indefinite"); 8-bit types take the low bits of the int64 conversion (PyTorch's route
    // for uint8), so 300.0 → uint8 44, NaN → 0. (The cuda backend's cvt.rzi saturates and maps NaN to
    // 0 instead; PyTorch on CUDA does the same for int32 and int64.)
    const double f = static_cast<double>(static_cast<OpMath<I>>(v));
    constexpr int kBits = sizeof(O) >= 4 ? static_cast<int>(8 * sizeof(O)) : 64;
    const double bound = std::ldexp(1.0, kBits - 1);  // exact in double
    if (!(f >= -bound && f < bound)) {                // NaN fails both
      if constexpr (sizeof(O) >= 4) return std::numeric_limits<O>::lowest();
      else return static_cast<O>(std::numeric_limits<int64_t>::lowest());
    }
    if constexpr (sizeof(O) >= 4) return static_cast<O>(f);
    else return static_cast<O>(static_cast<int64_t>(f));
  } else {
    return static_cast<O>(v);
  }
}
}  // namespace

void copy_into(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() &&
      dst.int_sizes() == src.int_sizes()) {
    const char* s = static_cast<const char*>(src.data_ptr());
    char* d = static_cast<char*>(dst.data_ptr());
    int64_t bytes = dst.int_numel() * static_cast<int64_t>(dst.itemsize());
    parallel_for(bytes, 1, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, static_cast<size_t>(e - b)); });
    return;
  }
  dispatch_dtype(dst.dtype(), [&]<typename O>() {
    dispatch_dtype(src.dtype(), [&]<typename I>() { map<O, I>(dst, {src}, [](I v) { return convert<O, I>(v); }); });
  });
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.int_sizes(), dtype);
  copy_into(out, t);
  return out;
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty(t.int_sizes(), t.dtype());
  copy_into(out, t);
  return out;
}

}  // namespace kernel

namespace {
using namespace kernel;
using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

[[noreturn]] void bad_dtype(OpKind op, Ins in, std::string_view expected) {
  throw TypeError(fmt::format("{}: dtype not supported (expected {})", describe_call(op, in), expected));
}
void need_defined(OpKind op, Ins in) {
  for (size_t i = 0; i < in.size(); ++i)
    if (!in[i].defined())
      throw ValueError(fmt::format("{}: input {} is undefined (None); a tensor is required", describe_call(op, in), i));
}

// ---- unary metas ----------------------------------------------------------------------------------
template <OpKind K>
std::vector<TensorMeta> meta_float_math(Ins in, const Attrs&) {
  need_defined(K, in);
  return one(in[0].sizes(), to_float_type(in[0].dtype()));
}
template <OpKind K>
std::vector<TensorMeta> meta_float_only(Ins in, const Attrs& a) {
  need_defined(K, in);
  if (!is_floating(in[0].dtype())) bad_dtype(K, in, "a floating dtype: f16, bf16, f32 or f64");
  if constexpr (K == OpKind::gelu) {
    const std::string& m = a.s("approximate");
    if (m != "none" && m != "tanh")
      throw ValueError(fmt::format("{}: approximate must be \"none\" or \"tanh\", got \"{}\"", describe_call(K, in), m));
  }
  return one(in[0].sizes(), in[0].dtype());
}
template <OpKind K, bool AllowBool>
std::vector<TensorMeta> meta_same(Ins in, const Attrs&) {
  need_defined(K, in);
  if (!AllowBool && in[0].dtype() == DType::Bool) bad_dtype(K, in, "a numeric dtype (not bool)");
  return one(in[0].sizes(), in[0].dtype());
}
std::vector<TensorMeta> meta_logical_not(Ins in, const Attrs&) {
  need_defined(OpKind::logical_not, in);
  return one(in[0].sizes(), DType::Bool);
}
std::vector<TensorMeta> meta_cast(Ins in, const Attrs& a) {
  need_defined(OpKind::cast, in);
  return one(in[0].sizes(), a.dtype("dtype"));
}
bool is_whole(double v) { return std::isfinite(v) && v == std::trunc(v); }
std::vector<TensorMeta> meta_clamp(Ins in, const Attrs& a) {
  need_defined(OpKind::clamp, in);
  DType t = in[0].dtype();
  if (t == DType::Bool) bad_dtype(OpKind::clamp, in, "a numeric dtype (not bool)");
  auto lo = a.opt_f("min"), hi = a.opt_f("max");
  if (!lo && !hi)
    throw ValueError(fmt::format("{}: at least one of min and max must be given", describe_call(OpKind::clamp, in)));
  // a fractional bound on an integer tensor promotes to the default float (torch.result_type)
  if (!is_floating(t) && ((lo && !is_whole(*lo)) || (hi && !is_whole(*hi)))) t = DType::F32;
  return one(in[0].sizes(), t);
}

// ---- unary functors (called with OpMath values: float, double or an integer type) -------------------
template <typename T>
using Unsigned = std::make_unsigned_t<std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>>;

struct Exp { template <typename T> T operator()(T x) const { return std::exp(x); } };
struct Log { template <typename T> T operator()(T x) const { return std::log(x); } };
struct Sin { template <typename T> T operator()(T x) const { return std::sin(x); } };
struct Cos { template <typename T> T operator()(T x) const { return std::cos(x); } };
struct Tanh { template <typename T> T operator()(T x) const { return std::tanh(x); } };
struct Erf { template <typename T> T operator()(T x) const { return std::erf(x); } };
struct Sqrt { template <typename T> T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <typename T> T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Reciprocal { template <typename T> T operator()(T x) const { return T(1) / x; } };
struct Sigmoid { template <typename T> T operator()(T x) const { return T(1) / (T(1) + std::exp(-x)); } };
struct Silu { template <typename T> T operator()(T x) const { return x / (T(1) + std::exp(-x)); } };
struct Hardsigmoid {
  template <typename T> T operator()(T x) const {
    T v = x / T(6) + T(0.5);
    v = v < T(0) ? T(0) : v;
    return v > T(1) ? T(1) : v;
  }
};
struct Hardswish {
  template <typename T> T operator()(T x) const {
    T v = x + T(3);
    v = v < T(0) ? T(0) : v;
    v = v > T(6) ? T(6) : v;
    return x * v / T(6);
  }
};
struct GeluErf {
  template <typename T> T operator()(T x) const { return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2))); }
};
struct GeluTanh {
  template <typename T> T operator()(T x) const {
    const T k = T(M_2_SQRTPI * M_SQRT1_2);  // sqrt(2/pi)
    return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
  }
};
struct Abs {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::fabs(x);
    else if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) return x;
    else return x < 0 ? static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(x)) : x;
  }
};
struct Neg {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return -x;
    else return static_cast<T>(Unsigned<T>(0) - static_cast<Unsigned<T>>(x));
  }
};
struct Relu {
  template <typename T> T operator()(T x) const { return x < T(0) ? T(0) : x; }  // NaN passes through
};
struct Sign {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_same_v<T, bool>) return x;
    else if constexpr (std::is_unsigned_v<T>) return static_cast<T>(x > 0);
    else return static_cast<T>((T(0) < x) - (x < T(0)));
  }
};
struct Ceil {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::ceil(x);
    else return x;
  }
};
struct Floor {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::floor(x);
    else return x;
  }
};
struct Round {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::nearbyint(x);
    else return x;
  }
};

template <typename F>
Result unary_float_kernel(Ins in, Outs m, F f) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = to_dtype(in[0], out.dtype());
  dispatch_float(out.dtype(), "", [&]<typename T>() { map_opmath<T, T>(out, {x}, f); });
  return {out};
}
template <typename F>
Result k_float_math(Ins in, const Attrs&, Outs m) {
  return unary_float_kernel(in, m, F{});
}
template <typename F>
Result k_same(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  dispatch_dtype(out.dtype(), [&]<typename T>() { map_opmath<T, T>(out, {in[0]}, F{}); });
  return {out};
}
Result k_gelu(Ins in, const Attrs& a, Outs m) {
  if (a.s("approximate") == "tanh") return unary_float_kernel(in, m, GeluTanh{});
  return unary_float_kernel(in, m, GeluErf{});
}
Result k_logical_not(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  dispatch_dtype(in[0].dtype(), [&]<typename T>() {
    map<bool, T>(out, {in[0]}, [](T v) { return !(static_cast<OpMath<T>>(v) != OpMath<T>(0)); });
  });
  return {out};
}
Result k_cast(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  copy_into(out, in[0]);
  return {out};
}
Result k_clamp(Ins in, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor x = to_dtype(in[0], out.dtype());
  auto lo = a.opt_f("min"), hi = a.opt_f("max");
  dispatch_dtype(out.dtype(), [&]<typename T>() {
    using C = OpMath<T>;
    if constexpr (std::is_same_v<T, bool>) {
      throw TypeError("clamp: bool is not supported");
    } else {
      // bounds beyond an integer type's range saturate instead of wrapping
      auto bound = [](double v) -> C {
        if constexpr (std::is_integral_v<C>) {
          if (v <= static_cast<double>(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
          if (v >= static_cast<double>(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
        }
        return static_cast<C>(v);
      };
      if (lo && hi) {
        C l = bound(*lo), h = bound(*hi);
        map_opmath<T, T>(out, {x}, [l, h](C v) -> C {
          C r = v < l ? l : v;
          return r > h ? h : r;
        });
      } else if (lo) {
        C l = bound(*lo);
        map_opmath<T, T>(out, {x}, [l](C v) -> C { return v < l ? l : v; });
      } else {
        C h = bound(*hi);
        map_opmath<T, T>(out, {x}, [h](C v) -> C { return v > h ? h : v; });
      }
    }
  });
  return {out};
}

// ---- binary ------------------------------------------------------------------------------------------
enum class BinKind { Arith, Div, Compare, Logical };

template <OpKind K, BinKind B>
std::vector<TensorMeta> meta_binary(Ins in, const Attrs&) {
  need_defined(K, in);
  SymIntVec shape = broadcast_shapes(in, op_name(K));
  DType t = result_type(in);
  if constexpr (B == BinKind::Div) t = to_float_type(t);
  if constexpr (B == BinKind::Compare || B == BinKind::Logical) t = DType::Bool;
  if constexpr (K == OpKind::sub || K == OpKind::pow) {
    if (t == DType::Bool) bad_dtype(K, in, "numeric dtypes (bool is not supported)");
  }
  return one(std::move(shape), t);
}

struct Add {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<Unsigned<T>>(a) + static_cast<Unsigned<T>>(b));
    else return a + b;
  }
};
struct Sub {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<Unsigned<T>>(a) - static_cast<Unsigned<T>>(b));
    else return a - b;
  }
};
struct Mul {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(static_cast<Unsigned<T>>(a) * static_cast<Unsigned<T>>(b));
    else return a * b;
  }
};
struct Div { template <typename T> T operator()(T a, T b) const { return a / b; } };
struct Pow {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      // the exponents ATen's pow with a scalar exponent computes without libm (the compiled backends
      // take the same forms: loop/lower.cpp pow_by_literal, the cpu and cuda runtimes' powf_)
      if (b == T(2)) return a * a;
      if (b == T(3)) return a * a * a;
      if (b == T(-2)) return T(1) / (a * a);
      if (b == T(0.5)) return std::sqrt(a);
      if (b == T(-0.5)) return T(1) / std::sqrt(a);
      if (b == T(-1)) return T(1) / a;
      return std::pow(a, b);
    } else {
      using U = Unsigned<T>;
      if constexpr (std::is_signed_v<T>) {
        if (b < 0) {
          if (a == 1) return 1;
          if (a == -1) return (b & 1) ? T(-1) : T(1);
          return 0;
        }
      }
      U base = static_cast<U>(a), r = 1;
      auto e = static_cast<U>(b);
      while (e) {
        if (e & 1) r = static_cast<U>(r * base);
        base = static_cast<U>(base * base);
        e = static_cast<U>(e >> 1);
      }
      return static_cast<T>(r);
    }
  }
};
struct Maximum {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
};
struct Minimum {
  template <typename T> T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
};
struct Eq { template <typename T> bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <typename T> bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <typename T> bool operator()(T a, T b) const { return a < b; } };
struct Le { template <typename T> bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <typename T> bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <typename T> bool operator()(T a, T b) const { return a >= b; } };
struct LogicalAnd { template <typename T> bool operator()(T a, T b) const { return (a != T(0)) && (b != T(0)); } };
struct LogicalOr { template <typename T> bool operator()(T a, T b) const { return (a != T(0)) || (b != T(0)); } };

template <typename F, BinKind B>
Result k_binary(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  DType c = B == BinKind::Compare || B == BinKind::Logical ? result_type(in) : out.dtype();
  Tensor a = to_dtype(in[0], c), b = to_dtype(in[1], c);
  dispatch_dtype(c, [&]<typename T>() {
    if constexpr (B == BinKind::Compare || B == BinKind::Logical) map_opmath<bool, T, T>(out, {a, b}, F{});
    else map_opmath<T, T, T>(out, {a, b}, F{});
  });
  return {out};
}

std::vector<TensorMeta> meta_where(Ins in, const Attrs&) {
  need_defined(OpKind::where, in);
  if (in[0].dtype() != DType::Bool) bad_dtype(OpKind::where, in, "a bool condition (input 0)");
  SymIntVec shape = broadcast_shapes(in, "where");
  return one(std::move(shape), result_type(in.subspan(1)));
}
Result k_where(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  Tensor a = to_dtype(in[1], out.dtype()), b = to_dtype(in[2], out.dtype());
  dispatch_dtype(out.dtype(), [&]<typename T>() {
    map<T, bool, T, T>(out, {in[0], a, b}, [](bool c, T x, T y) { return c ? x : y; });
  });
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(exp, meta_float_math<OpKind::exp>, k_float_math<Exp>);
PROTEAN_REGISTER_OP(log, meta_float_math<OpKind::log>, k_float_math<Log>);
PROTEAN_REGISTER_OP(sin, meta_float_math<OpKind::sin>, k_float_math<Sin>);
PROTEAN_REGISTER_OP(cos, meta_float_math<OpKind::cos>, k_float_math<Cos>);
PROTEAN_REGISTER_OP(tanh, meta_float_math<OpKind::tanh>, k_float_math<Tanh>);
PROTEAN_REGISTER_OP(erf, meta_float_math<OpKind::erf>, k_float_math<Erf>);
PROTEAN_REGISTER_OP(sqrt, meta_float_math<OpKind::sqrt>, k_float_math<Sqrt>);
PROTEAN_REGISTER_OP(rsqrt, meta_float_math<OpKind::rsqrt>, k_float_math<Rsqrt>);
PROTEAN_REGISTER_OP(reciprocal, meta_float_math<OpKind::reciprocal>, k_float_math<Reciprocal>);
PROTEAN_REGISTER_OP(sigmoid, meta_float_math<OpKind::sigmoid>, k_float_math<Sigmoid>);
PROTEAN_REGISTER_OP(silu, meta_float_only<OpKind::silu>, k_float_math<Silu>);
PROTEAN_REGISTER_OP(hardsigmoid, meta_float_only<OpKind::hardsigmoid>, k_float_math<Hardsigmoid>);
PROTEAN_REGISTER_OP(hardswish, meta_float_only<OpKind::hardswish>, k_float_math<Hardswish>);
PROTEAN_REGISTER_OP(gelu, meta_float_only<OpKind::gelu>, k_gelu);
PROTEAN_REGISTER_OP(abs, (meta_same<OpKind::abs, true>), k_same<Abs>);
PROTEAN_REGISTER_OP(neg, (meta_same<OpKind::neg, false>), k_same<Neg>);
PROTEAN_REGISTER_OP(relu, (meta_same<OpKind::relu, false>), k_same<Relu>);
PROTEAN_REGISTER_OP(sign, (meta_same<OpKind::sign, true>), k_same<Sign>);
PROTEAN_REGISTER_OP(ceil, (meta_same<OpKind::ceil, false>), k_same<Ceil>);
PROTEAN_REGISTER_OP(floor, (meta_same<OpKind::floor, false>), k_same<Floor>);
PROTEAN_REGISTER_OP(round, (meta_same<OpKind::round, false>), k_same<Round>);
PROTEAN_REGISTER_OP(logical_not, meta_logical_not, k_logical_not);
PROTEAN_REGISTER_OP(cast, meta_cast, k_cast);
PROTEAN_REGISTER_OP(clamp, meta_clamp, k_clamp);

PROTEAN_REGISTER_OP(add, (meta_binary<OpKind::add, BinKind::Arith>), (k_binary<Add, BinKind::Arith>));
PROTEAN_REGISTER_OP(sub, (meta_binary<OpKind::sub, BinKind::Arith>), (k_binary<Sub, BinKind::Arith>));
PROTEAN_REGISTER_OP(mul, (meta_binary<OpKind::mul, BinKind::Arith>), (k_binary<Mul, BinKind::Arith>));
PROTEAN_REGISTER_OP(div, (meta_binary<OpKind::div, BinKind::Div>), (k_binary<Div, BinKind::Div>));
PROTEAN_REGISTER_OP(pow, (meta_binary<OpKind::pow, BinKind::Arith>), (k_binary<Pow, BinKind::Arith>));
PROTEAN_REGISTER_OP(maximum, (meta_binary<OpKind::maximum, BinKind::Arith>), (k_binary<Maximum, BinKind::Arith>));
PROTEAN_REGISTER_OP(minimum, (meta_binary<OpKind::minimum, BinKind::Arith>), (k_binary<Minimum, BinKind::Arith>));
PROTEAN_REGISTER_OP(eq, (meta_binary<OpKind::eq, BinKind::Compare>), (k_binary<Eq, BinKind::Compare>));
PROTEAN_REGISTER_OP(ne, (meta_binary<OpKind::ne, BinKind::Compare>), (k_binary<Ne, BinKind::Compare>));
PROTEAN_REGISTER_OP(lt, (meta_binary<OpKind::lt, BinKind::Compare>), (k_binary<Lt, BinKind::Compare>));
PROTEAN_REGISTER_OP(le, (meta_binary<OpKind::le, BinKind::Compare>), (k_binary<Le, BinKind::Compare>));
PROTEAN_REGISTER_OP(gt, (meta_binary<OpKind::gt, BinKind::Compare>), (k_binary<Gt, BinKind::Compare>));
PROTEAN_REGISTER_OP(ge, (meta_binary<OpKind::ge, BinKind::Compare>), (k_binary<Ge, BinKind::Compare>));
PROTEAN_REGISTER_OP(logical_and, (meta_binary<OpKind::logical_and, BinKind::Logical>),
                    (k_binary<LogicalAnd, BinKind::Logical>));
PROTEAN_REGISTER_OP(logical_or, (meta_binary<OpKind::logical_or, BinKind::Logical>),
                    (k_binary<LogicalOr, BinKind::Logical>));
PROTEAN_REGISTER_OP(where, meta_where, k_where);

}  // namespace protean::ops

// ---- numerics helpers --------------------------------------------------------------------------------
namespace protean {

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  if (a.int_sizes() != b.int_sizes()) return false;
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    double u = x[i], v = y[i];
    if (std::isnan(u) || std::isnan(v)) {
      if (equal_nan && std::isnan(u) && std::isnan(v)) continue;
      return false;
    }
    if (u == v) continue;  // also equal infinities
    if (!(std::fabs(u - v) <= atol + rtol * std::fabs(v))) return false;
  }
  return true;
}

double max_abs_diff(const Tensor& a_in, const Tensor& b_in) {
  using namespace ops;
  // The kernels below read host memory: a device tensor is copied to the host first (cpu() is the
  // tensor itself on the host).
  const Tensor a = a_in.cpu(), b = b_in.cpu();
  Tensor ts[] = {a, b};
  SymIntVec shape = broadcast_shapes(ts, "max_abs_diff");
  Tensor d = empty(hints(shape), DType::F64);
  Tensor x = kernel::to_dtype(a, DType::F64), y = kernel::to_dtype(b, DType::F64);
  kernel::map<double, double, double>(d, {x, y}, [](double u, double v) {
    if (u == v) return 0.0;  // equal infinities
    return std::fabs(u - v);
  });
  const double* p = d.data_ptr<double>();
  double m = 0;
  for (int64_t i = 0, n = d.int_numel(); i < n; ++i) {
    if (std::isnan(p[i])) return p[i];
    m = std::max(m, p[i]);
  }
  return m;
}

}  // namespace protean
