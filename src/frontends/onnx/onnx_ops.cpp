// ONNX operator evaluators. Each takes the node and its input Values and returns output Values, using
// only the public op API (protean/ops.h), so it runs the same eagerly and under capture.
//
// Host values: Shape/Size produce vectors of SymInts; Gather/Slice/Concat/Cast/Squeeze/Unsqueeze/
// Reshape/Identity/Equal/Not/Add/Sub/Mul/Div keep them on the host when every input is a host value or
// a small integer constant (<= 8 elements), so dynamic dims stay symbolic all the way into Reshape.
//
// Opset differences handled here (the node carries the model's default opset):
//   Slice: attributes starts/ends/axes (< 10) vs inputs (>= 10, with steps).
//   Squeeze/Unsqueeze/ReduceMean: axes attribute (< 13, < 13, < 18) vs input.
//   Clip: min/max attributes (< 11) vs inputs.   Pad: pads/value attributes (< 11) vs inputs.
//   Softmax: < 13 flattens to 2-D at `axis` (default 1); >= 13 is per-axis (default -1).
//   Resize: opset 10 (X, scales) vs >= 11 (X, roi, scales, sizes).
#include "frontends/onnx/onnx_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <cctype>
#include <map>
#include <cmath>
#include <complex>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

#include "protean/ops.h"

namespace protean::onnx::detail {

namespace {

constexpr size_t kSmallConst = 8;

// ---- input access --------------------------------------------------------------------------------------
const Value& need(const Node& n, const Inputs& in, size_t i) {
  if (i >= in.size() || !in[i])
    throw ValueError(fmt::format("required input {} is missing", i));
  return *in[i];
}
const Value* opt(const Inputs& in, size_t i) { return i < in.size() ? in[i] : nullptr; }

bool is_small_int_const(const Value& v) {
  if (!v.is_tensor() || !v.t.defined() || v.t.is_fake()) return false;
  if (!is_integral(v.t.dtype(), /*include_bool=*/true) || v.t.dim() > 1) return false;
  return v.t.int_numel() <= static_cast<int64_t>(kSmallConst);
}

/// A small integer constant as a host value (ints, or bools for a bool tensor).
Value to_host(const Value& v) {
  if (v.is_host()) return v;
  bool scalar = v.t.dim() == 0;
  if (v.t.dtype() == DType::Bool) {
    std::vector<SymBool> b;
    for (int64_t x : v.t.to_vector<int64_t>()) b.emplace_back(x != 0);
    return Value::host_bools(std::move(b), scalar);
  }
  IntVec ints = v.t.to_vector<int64_t>();
  return Value::host_ints(to_symint_vec(ints), v.t.dtype(), scalar);
}

/// True when the node's (present) inputs at `idx` include a host value and all are host-convertible.
bool host_mode(const Inputs& in, std::initializer_list<size_t> idx = {}) {
  bool any_host = false;
  auto visit = [&](const Value* v) {
    if (!v) return true;
    if (v->is_host()) {
      any_host = true;
      return true;
    }
    return is_small_int_const(*v);
  };
  if (idx.size() == 0) {
    for (const Value* v : in)
      if (!visit(v)) return false;
  } else {
    for (size_t i : idx)
      if (!visit(opt(in, i))) return false;
  }
  return any_host;
}

/// Integer list from a host value or an integer tensor (a host read of the tensor: under capture a
/// graph break unless the tensor is a constant).
SymIntVec read_ints(const Value& v, const char* what) {
  if (v.kind == Value::Kind::Ints) return v.ints;
  if (v.kind == Value::Kind::Bools) {
    SymIntVec r;
    for (const auto& b : v.bools) r.emplace_back(static_cast<bool>(b) ? 1 : 0);
    return r;
  }
  if (!is_integral(v.t.dtype(), true))
    throw TypeError(fmt::format("{} must be an integer tensor, got {}", what, v.describe()));
  return to_symint_vec(v.t.to_vector<int64_t>());
}
IntVec read_concrete_ints(const Value& v, const char* what) {
  SymIntVec s = read_ints(v, what);
  IntVec r;
  for (const auto& x : s) r.push_back(x.guard_int());
  return r;
}
std::vector<double> read_floats(const Value& v, const char* what) {
  if (v.is_host()) {
    std::vector<double> r;
    for (int64_t x : read_concrete_ints(v, what)) r.push_back(static_cast<double>(x));
    return r;
  }
  return v.t.to_vector<double>();
}

Tensor tin(const Node& n, const Inputs& in, size_t i) { return as_tensor(need(n, in, i)); }
Tensor topt(const Inputs& in, size_t i) {
  const Value* v = opt(in, i);
  return v ? as_tensor(*v) : Tensor();
}

int64_t norm_axis(int64_t axis, int64_t rank, const char* what) {
  if (axis < -rank || axis >= rank)
    throw ValueError(fmt::format("{} {} is out of range for rank {}", what, axis, rank));
  return axis < 0 ? axis + rank : axis;
}

std::vector<Value> one(Tensor t) { return {Value::tensor(std::move(t))}; }
std::vector<Value> one(Value v) { return {std::move(v)}; }

// ---- host arithmetic -------------------------------------------------------------------------------------
template <typename F>
Value host_broadcast(const Value& a, const Value& b, F f) {
  size_t na = a.ints.size(), nb = b.ints.size();
  if (na != nb && na != 1 && nb != 1)
    throw ShapeError(fmt::format("cannot broadcast host values {} and {}", a.describe(), b.describe()));
  size_t n = std::max(na, nb);
  if (na == 0 || nb == 0) n = 0;
  SymIntVec r;
  for (size_t i = 0; i < n; ++i) r.push_back(f(a.ints[na == 1 ? 0 : i], b.ints[nb == 1 ? 0 : i]));
  return Value::host_ints(std::move(r), a.dtype, a.scalar && b.scalar);
}

SymInt host_div(const SymInt& x, const SymInt& y) {
  int64_t a, b;
  if (x.maybe_as_int(a) && y.maybe_as_int(b)) {
    if (b == 0) throw ValueError("integer division by zero in shape arithmetic");
    return SymInt(a / b);  // ONNX integer Div truncates like C
  }
  return x / y;  // sizes are non-negative: floor == truncation
}

// ---- elementwise ---------------------------------------------------------------------------------------
/// ONNX's type constraint "T" for ops whose inputs share one element type (Add, Equal, Where's X and
/// Y, Max, ...): a floating input beside an integer or boolean one is a malformed model (ONNX Runtime
/// refuses it at load time), not something to promote silently. Two floating types are not compared
/// (LoadOptions::float_dtype retypes a model's floats, and ops whose output type is an attribute, such
/// as RandomNormal's dtype, keep theirs), nor two integer types: int16/uint16/uint32/uint64 are carried
/// in wider integer dtypes (is_carried_type), so two inputs of one ONNX integer type may differ here.
void check_one_type(const Node& n, const Inputs& in, std::initializer_list<size_t> which) {
  const Value* first = nullptr;
  size_t fi = 0;
  DType fd = DType::F32;
  for (size_t i : which) {
    const Value* v = i < in.size() ? in[i] : nullptr;
    if (!v || v->is_sequence() || v->kind == Value::Kind::None) continue;
    const DType d = v->is_tensor() ? v->t.dtype() : v->dtype;
    if (!first) {
      first = v, fi = i, fd = d;
      continue;
    }
    if (is_floating(d) != is_floating(fd))
      throw TypeError(fmt::format("{} takes inputs of one element type (ONNX type constraint T), but input {} is {} "
                                  "and input {} is {}; insert a Cast in the model",
                                  n.op_type, fi, short_name(fd), i, short_name(d)));
  }
}

enum class Bin { Add, Sub, Mul, Div, Pow };

std::vector<Value> binary(const Node& n, const Inputs& in, Bin op) {
  const Value& a = need(n, in, 0);
  const Value& b = need(n, in, 1);
  if (op != Bin::Pow) check_one_type(n, in, {0, 1});  // Pow: base T, exponent T1
  if (op != Bin::Pow && host_mode(in, {0, 1})) {
    Value ha = to_host(a), hb = to_host(b);
    if (ha.kind == Value::Kind::Ints && hb.kind == Value::Kind::Ints) {
      switch (op) {
        case Bin::Add: return one(host_broadcast(ha, hb, [](const SymInt& x, const SymInt& y) { return x + y; }));
        case Bin::Sub: return one(host_broadcast(ha, hb, [](const SymInt& x, const SymInt& y) { return x - y; }));
        case Bin::Mul: return one(host_broadcast(ha, hb, [](const SymInt& x, const SymInt& y) { return x * y; }));
        case Bin::Div: return one(host_broadcast(ha, hb, host_div));
        case Bin::Pow: break;
      }
    }
  }
  Tensor ta = as_tensor(a);
  switch (op) {
    case Bin::Add: return one(add(ta, as_tensor(b)));
    case Bin::Sub: return one(sub(ta, as_tensor(b)));
    case Bin::Mul: return one(mul(ta, as_tensor(b)));
    case Bin::Div: {
      Tensor tb = as_tensor(b);
      if (!is_integral(ta.dtype(), true) || !is_integral(tb.dtype(), true)) return one(div(ta, tb));
      // ONNX integer Div truncates toward zero. The quotient is taken in f64, where trunc(a / b) is
      // the integer quotient for |a| < 2^53 (the default float, f32, rounded 16777217 / 1 to 16777216),
      // and x / 0 is defined as 0 here, as Mod's x mod 0 (ONNX leaves both undefined; a cast of the
      // infinite quotient gave 0 in the interpreter and INT32_MIN in generated code).
      Tensor fa = cast(ta, DType::F64), fb = cast(tb, DType::F64);
      Tensor q = div(fa, fb);
      Tensor t = mul(sign(q), floor(abs(q)));
      t = where(eq(fb, wrap_scalar(0, fb)), wrap_scalar(0, fb), t);
      return one(cast(t, ta.dtype()));
    }
    case Bin::Pow: {
      // ONNX: the result has the base's type (an integer base stays integer, computed in f64).
      if (b.is_tensor() && !b.t.is_fake() && b.t.int_numel() == 1 && b.t.dim() <= ta.dim() && is_floating(ta.dtype()))
        return one(pow(ta, b.t.item<double>()));
      Tensor tb = as_tensor(b);
      if (!is_floating(ta.dtype())) return one(cast(pow(cast(ta, DType::F64), cast(tb, DType::F64)), ta.dtype()));
      Tensor r = pow(ta, tb);
      return one(r.dtype() == ta.dtype() ? r : cast(r, ta.dtype()));
    }
  }
  return {};
}
std::vector<Value> op_add(const Node& n, const Inputs& in) { return binary(n, in, Bin::Add); }
std::vector<Value> op_sub(const Node& n, const Inputs& in) { return binary(n, in, Bin::Sub); }
std::vector<Value> op_mul(const Node& n, const Inputs& in) { return binary(n, in, Bin::Mul); }
std::vector<Value> op_div(const Node& n, const Inputs& in) { return binary(n, in, Bin::Div); }
std::vector<Value> op_pow(const Node& n, const Inputs& in) { return binary(n, in, Bin::Pow); }

#define PROTEAN_ONNX_UNARY(NAME, FN) \
  std::vector<Value> op_##NAME(const Node& n, const Inputs& in) { return one(FN(tin(n, in, 0))); }
PROTEAN_ONNX_UNARY(abs, abs)
PROTEAN_ONNX_UNARY(ceil, ceil)
PROTEAN_ONNX_UNARY(cos, cos)
PROTEAN_ONNX_UNARY(erf, erf)
PROTEAN_ONNX_UNARY(exp, exp)
PROTEAN_ONNX_UNARY(floor, floor)
PROTEAN_ONNX_UNARY(hardswish, hardswish)
PROTEAN_ONNX_UNARY(log, log)
PROTEAN_ONNX_UNARY(neg, neg)
PROTEAN_ONNX_UNARY(reciprocal, reciprocal)
PROTEAN_ONNX_UNARY(relu, relu)
PROTEAN_ONNX_UNARY(sigmoid, sigmoid)
PROTEAN_ONNX_UNARY(sin, sin)
PROTEAN_ONNX_UNARY(sqrt, sqrt)
PROTEAN_ONNX_UNARY(tanh, tanh)
#undef PROTEAN_ONNX_UNARY

std::vector<Value> op_identity(const Node& n, const Inputs& in) { return {need(n, in, 0)}; }

std::vector<Value> op_hardsigmoid(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  double alpha = n.get_float("alpha", 0.2), beta = n.get_float("beta", 0.5);
  // PyTorch's hardsigmoid is the alpha = 1/6, beta = 1/2 case (within float rounding of the attribute).
  if (std::abs(alpha - 1.0 / 6.0) < 1e-6 && beta == 0.5) return one(hardsigmoid(x));
  return one(clamp(add(mul(x, alpha), beta), 0.0, 1.0));
}

std::vector<Value> op_clip(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  std::optional<double> lo, hi;
  Tensor tlo, thi;
  if (n.opset < 11) {
    if (n.attr("min")) lo = n.get_float("min", 0);
    if (n.attr("max")) hi = n.get_float("max", 0);
  } else {
    auto bound = [&](size_t i, std::optional<double>& d, Tensor& t) {
      const Value* v = opt(in, i);
      if (!v) return;
      if (v->is_host() || !v->t.is_fake()) d = read_floats(*v, "Clip bound").at(0);
      else t = v->t;
    };
    bound(1, lo, tlo);
    bound(2, hi, thi);
  }
  Tensor y = (lo || hi) ? clamp(x, lo, hi) : x;
  if (tlo.defined()) y = maximum(y, tlo);
  if (thi.defined()) y = minimum(y, thi);
  return one(y);
}

std::vector<Value> op_equal(const Node& n, const Inputs& in) {
  check_one_type(n, in, {0, 1});
  if (host_mode(in, {0, 1})) {
    Value a = to_host(need(n, in, 0)), b = to_host(need(n, in, 1));
    if (a.kind == Value::Kind::Ints && b.kind == Value::Kind::Ints) {
      size_t na = a.ints.size(), nb = b.ints.size();
      if (na != nb && na != 1 && nb != 1)
        throw ShapeError(fmt::format("cannot broadcast {} and {}", a.describe(), b.describe()));
      std::vector<SymBool> r;
      for (size_t i = 0; i < std::max(na, nb); ++i) r.push_back(a.ints[na == 1 ? 0 : i] == b.ints[nb == 1 ? 0 : i]);
      return one(Value::host_bools(std::move(r), a.scalar && b.scalar));
    }
  }
  return one(eq(tin(n, in, 0), tin(n, in, 1)));
}

std::vector<Value> op_not(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  if (a.kind == Value::Kind::Bools) {
    std::vector<SymBool> r;
    for (const auto& b : a.bools) r.push_back(!b);
    return one(Value::host_bools(std::move(r), a.scalar));
  }
  return one(logical_not(as_tensor(a)));
}

std::vector<Value> op_cast(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  int64_t to = n.get_int("to", 0);
  std::optional<DType> dt = dtype_from_onnx(static_cast<int32_t>(to));
  if (!dt) throw NotImplementedError(fmt::format("Cast to ONNX type {} is not supported", onnx_type_name(int32_t(to))));
  if (a.is_host()) {
    if (*dt == DType::Bool) {
      if (a.kind == Value::Kind::Bools) return one(a);
      std::vector<SymBool> r;
      for (const auto& x : a.ints) r.push_back(x != 0);
      return one(Value::host_bools(std::move(r), a.scalar));
    }
    if (is_integral(*dt)) {
      Value r = a.kind == Value::Kind::Ints ? a : Value::host_ints(read_ints(a, "Cast input"), *dt, a.scalar);
      r.dtype = *dt;  // SymInts survive i64 → i32 → i64 (sizes fit)
      return one(r);
    }
  }
  Tensor x = as_tensor(a);
  if (x.dtype() == *dt) return one(x);
  return one(cast(x, *dt));
}

// ---- shape ops -------------------------------------------------------------------------------------------
std::vector<Value> op_shape(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  SymIntVec s;
  if (a.is_host()) {
    if (!a.scalar) s.emplace_back(static_cast<int64_t>(a.host_size()));
  } else {
    s = a.t.sizes();
  }
  int64_t r = static_cast<int64_t>(s.size());
  int64_t start = n.get_int("start", 0), end = n.get_int("end", r);
  if (start < 0) start += r;
  if (end < 0) end += r;
  start = std::clamp<int64_t>(start, 0, r);
  end = std::clamp<int64_t>(end, start, r);
  return one(Value::host_ints(SymIntVec(s.begin() + start, s.begin() + end)));
}

std::vector<Value> op_size(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  SymInt numel = a.is_host() ? SymInt(static_cast<int64_t>(a.host_size())) : a.t.numel();
  return one(Value::host_ints({numel}, DType::I64, /*scalar=*/true));
}

std::vector<Value> op_reshape(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  SymIntVec shape = read_ints(need(n, in, 1), "Reshape shape");
  bool allowzero = n.get_int("allowzero", 0) != 0;
  if (a.is_host() && shape.size() <= 1) {
    Value r = a;
    r.scalar = shape.empty();
    if (r.scalar && a.host_size() != 1)
      throw ShapeError(fmt::format("cannot reshape {} to a scalar", a.describe()));
    return one(r);
  }
  Tensor x = as_tensor(a);
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v;
    if (!allowzero && shape[i].maybe_as_int(v) && v == 0) {
      if (static_cast<int64_t>(i) >= x.dim())
        throw ShapeError(fmt::format("Reshape: 0 (copy dim) at position {} but the input {} has rank {}", i,
                                     to_string(x.sizes()), x.dim()));
      shape[i] = x.size(static_cast<int64_t>(i));
    }
  }
  return one(reshape(x, shape));
}

std::vector<Value> op_flatten(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t r = x.dim();
  int64_t axis = n.get_int("axis", 1);
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r) throw ValueError(fmt::format("Flatten axis {} out of range for rank {}", axis, r));
  SymInt outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer = outer * x.size(i);
  return one(reshape(x, {outer, -1}));
}

std::vector<Value> op_transpose(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  if (a.is_host()) return one(a);  // rank <= 1
  Tensor x = a.t;
  IntVec perm = n.get_ints("perm");
  if (perm.empty())
    for (int64_t i = x.dim() - 1; i >= 0; --i) perm.push_back(i);
  return one(permute(x, perm));
}

/// ONNX: an axis listed twice (after negative axes are normalized) is an error.
void check_distinct_axes(const IntVec& axes, const char* op) {
  for (size_t i = 0; i < axes.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (axes[i] == axes[j])
        throw ValueError(fmt::format("{} axes {} name axis {} twice", op, to_string(to_symint_vec(axes)), axes[i]));
}

IntVec axes_of(const Node& n, const Inputs& in, int64_t attr_until_opset, size_t input_index) {
  if (n.opset < attr_until_opset) return n.get_ints("axes");
  const Value* v = opt(in, input_index);
  return v ? read_concrete_ints(*v, "axes") : IntVec{};
}

std::vector<Value> op_squeeze(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  IntVec axes = axes_of(n, in, 13, 1);
  if (a.is_host()) {
    if (a.scalar) throw ValueError("Squeeze of a rank-0 value");
    if (a.host_size() != 1 || axes.size() > 1 || (axes.size() == 1 && axes[0] != 0 && axes[0] != -1))
      throw ShapeError(fmt::format("Squeeze axes {} on {}", to_string(to_symint_vec(axes)), a.describe()));
    Value r = a;
    r.scalar = true;
    return one(r);
  }
  Tensor x = a.t;
  if (axes.empty()) return one(squeeze(x));
  for (auto& ax : axes) ax = norm_axis(ax, x.dim(), "Squeeze axis");
  check_distinct_axes(axes, "Squeeze");
  // ONNX: an axis whose size is not 1 is an error (torch's squeeze(dim) would keep it)
  for (int64_t ax : axes)
    if (x.size(ax) != 1)
      throw ShapeError(fmt::format("Squeeze axis {} of {} has size {}, not 1", ax, to_string(x.sizes()), x.size(ax).str()));
  return one(squeeze(x, axes));
}

std::vector<Value> op_unsqueeze(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  IntVec axes = axes_of(n, in, 13, 1);
  if (axes.empty()) throw ValueError("Unsqueeze needs axes");
  if (a.is_host() && a.scalar && axes.size() == 1 && (axes[0] == 0 || axes[0] == -1)) {
    Value r = a;
    r.scalar = false;
    return one(r);
  }
  Tensor x = as_tensor(a);
  int64_t out_rank = x.dim() + static_cast<int64_t>(axes.size());
  for (auto& ax : axes) ax = norm_axis(ax, out_rank, "Unsqueeze axis");
  check_distinct_axes(axes, "Unsqueeze");
  std::sort(axes.begin(), axes.end());
  for (int64_t ax : axes) x = unsqueeze(x, ax);
  return one(x);
}

std::vector<Value> op_concat(const Node& n, const Inputs& in) {
  int64_t axis = n.get_int("axis", 0);
  if (host_mode(in)) {
    bool all_bools = true;
    std::vector<Value> hs;
    for (const Value* v : in)
      if (v) {
        hs.push_back(to_host(*v));
        all_bools &= hs.back().kind == Value::Kind::Bools;
      }
    if (!hs.empty() && all_bools) {
      std::vector<SymBool> r;
      for (const auto& h : hs) r.insert(r.end(), h.bools.begin(), h.bools.end());
      return one(Value::host_bools(std::move(r)));
    }
    SymIntVec r;
    for (const auto& h : hs) {
      SymIntVec xs = read_ints(h, "Concat input");
      r.insert(r.end(), xs.begin(), xs.end());
    }
    return one(Value::host_ints(std::move(r), hs.empty() ? DType::I64 : hs[0].dtype));
  }
  TensorList xs;
  for (const Value* v : in)
    if (v) xs.push_back(as_tensor(*v));
  if (xs.empty()) throw ValueError("Concat with no inputs");
  int64_t rank = xs[0].dim();
  return one(cat(xs, norm_axis(axis, rank, "Concat axis")));
}

// ONNX Slice bounds for one axis with a negative step, on a concrete dim: start in [0, d-1], end in
// [-1, d-1]; negative_step_indices lists the selected indices (host vectors only: their length is
// the host vector's).
std::pair<int64_t, int64_t> negative_step_bounds(int64_t start, int64_t end, int64_t d) {
  if (d <= 0) return {0, 0};  // nothing selected
  if (start < 0 && start > std::numeric_limits<int64_t>::min() / 2) start += d;
  if (end < 0 && end > std::numeric_limits<int64_t>::min() / 2) end += d;
  return {std::clamp<int64_t>(start, 0, d - 1), std::clamp<int64_t>(end, -1, d - 1)};
}
IntVec negative_step_indices(int64_t start, int64_t end, int64_t step, int64_t d) {
  auto [st, en] = negative_step_bounds(start, end, d);
  IntVec idx;
  for (int64_t i = st; i > en; i += step) idx.push_back(i);
  return idx;
}

std::vector<Value> op_slice(const Node& n, const Inputs& in) {
  const Value& a = need(n, in, 0);
  SymIntVec starts, ends;
  IntVec axes, steps;
  if (n.opset < 10) {
    starts = to_symint_vec(n.get_ints("starts"));
    ends = to_symint_vec(n.get_ints("ends"));
    axes = n.get_ints("axes");
  } else {
    starts = read_ints(need(n, in, 1), "Slice starts");
    ends = read_ints(need(n, in, 2), "Slice ends");
    if (const Value* v = opt(in, 3)) axes = read_concrete_ints(*v, "Slice axes");
    if (const Value* v = opt(in, 4)) steps = read_concrete_ints(*v, "Slice steps");
  }
  if (starts.size() != ends.size())
    throw ValueError(fmt::format("Slice: {} starts but {} ends", starts.size(), ends.size()));
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (axes.size() != starts.size() || steps.size() != starts.size())
    throw ValueError("Slice: starts, ends, axes and steps differ in length");
  {
    const int64_t rank = a.is_host() ? 1 : a.t.dim();
    IntVec normed = axes;
    for (auto& ax : normed) ax = norm_axis(ax, rank, "Slice axis");
    check_distinct_axes(normed, "Slice");
  }

  if (a.is_host()) {  // 1-D host vector
    if (a.scalar) throw ValueError("Slice of a rank-0 value");
    Value h = a;
    for (size_t k = 0; k < axes.size(); ++k) {
      if (norm_axis(axes[k], 1, "Slice axis") != 0) continue;
      int64_t d = static_cast<int64_t>(h.host_size());
      int64_t st = starts[k].guard_int(), en = ends[k].guard_int(), sp = steps[k];
      if (sp == 0) throw ValueError("Slice step 0");
      IntVec idx;
      if (sp > 0) {
        if (st < 0) st += d;
        if (en < 0) en += d;
        st = std::clamp<int64_t>(st, 0, d);
        en = std::clamp<int64_t>(en, 0, d);
        for (int64_t i = st; i < en; i += sp) idx.push_back(i);
      } else {
        idx = negative_step_indices(st, en, sp, d);
      }
      Value r = h;
      r.ints.clear();
      r.bools.clear();
      for (int64_t i : idx) {
        if (h.kind == Value::Kind::Ints) r.ints.push_back(h.ints[i]);
        else r.bools.push_back(h.bools[i]);
      }
      h = std::move(r);
    }
    return one(h);
  }
  Tensor x = a.t;
  for (size_t k = 0; k < axes.size(); ++k) {
    int64_t ax = norm_axis(axes[k], x.dim(), "Slice axis");
    int64_t sp = steps[k];
    if (sp == 0) throw ValueError("Slice step 0");
    if (sp > 0) {
      x = slice(x, ax, starts[k], ends[k], sp);
    } else {
      // The indices start, start + step, ... > end as an arange op: nothing proportional to the dim is
      // built on the host (a 2^36-long dim made a 2^36-entry list during capture).
      auto [st, en] = negative_step_bounds(starts[k].guard_int(), ends[k].guard_int(), x.size(ax).guard_int());
      if (st <= en) x = slice(x, ax, 0, 0, 1);
      else x = index_select(x, ax, arange(st, en, sp, DType::I64));
    }
  }
  return one(x);
}

std::vector<Value> op_gather(const Node& n, const Inputs& in) {
  const Value& data = need(n, in, 0);
  const Value& ind = need(n, in, 1);
  int64_t axis = n.get_int("axis", 0);
  bool index_on_host = ind.is_host() || (ind.is_tensor() && !ind.t.is_fake() && is_integral(ind.t.dtype()) &&
                                         ind.t.dim() <= 1);
  if (data.is_host()) {
    if (data.scalar || norm_axis(axis, 1, "Gather axis") != 0) throw ValueError("Gather on a rank-0 host value");
    Value hi = to_host(ind.is_host() ? ind : Value::tensor(as_tensor(ind)));
    int64_t d = static_cast<int64_t>(data.host_size());
    Value r = data;
    r.ints.clear();
    r.bools.clear();
    r.scalar = hi.scalar;
    for (int64_t i : read_concrete_ints(hi, "Gather indices")) {
      if (i < 0) i += d;
      if (i < 0 || i >= d) throw ValueError(fmt::format("Gather index out of range for {}", data.describe()));
      if (data.kind == Value::Kind::Ints) r.ints.push_back(data.ints[i]);
      else r.bools.push_back(data.bools[i]);
    }
    return one(r);
  }
  Tensor x = data.t;
  int64_t ax = norm_axis(axis, x.dim(), "Gather axis");
  if (index_on_host) {
    Value hi = to_host(ind);
    SymIntVec idx = read_ints(hi, "Gather indices");
    SymInt d = x.size(ax);
    for (auto& i : idx) {
      int64_t v;
      if (i.maybe_as_int(v) && v < 0) i = d + v;
    }
    if (hi.scalar) return one(select(x, ax, idx.at(0)));
    if (idx.size() == 1) return one(unsqueeze(select(x, ax, idx[0]), ax));
    IntVec c;
    for (const auto& i : idx) c.push_back(i.guard_int());
    return one(index_select(x, ax, tensor<int64_t>(c, {static_cast<int64_t>(c.size())})));
  }
  // Data-dependent indices: gather along the flattened index (negative ones counting from the end,
  // index_select's wrap_negative), restore its shape.
  Tensor it = as_tensor(ind);
  if (it.dtype() != DType::I64) it = cast(it, DType::I64);
  SymIntVec out;
  for (int64_t i = 0; i < ax; ++i) out.push_back(x.size(i));
  for (const auto& s : it.sizes()) out.push_back(s);
  for (int64_t i = ax + 1; i < x.dim(); ++i) out.push_back(x.size(i));
  return one(reshape(index_select(x, ax, reshape(it, {-1}), /*wrap_negative=*/true), out));
}

std::vector<Value> op_constant_of_shape(const Node& n, const Inputs& in) {
  SymIntVec shape = read_ints(need(n, in, 0), "ConstantOfShape shape");
  double v = 0;
  DType dt = DType::F32;
  if (const Tensor* t = n.get_tensor("value")) {
    if (t->int_numel() != 1) throw ValueError("ConstantOfShape value must have one element");
    dt = t->dtype();
    v = t->item<double>();
  }
  return one(full(shape, v, dt));
}

// ---- reductions / normalization -----------------------------------------------------------------------
std::vector<Value> op_reduce_mean(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec axes = axes_of(n, in, 18, 1);
  bool keep = n.get_int("keepdims", 1) != 0;
  if (axes.empty() && n.get_int("noop_with_empty_axes", 0)) return one(x);
  for (auto& a : axes) a = norm_axis(a, x.dim(), "ReduceMean axis");
  return one(mean(x, axes, keep));
}

std::vector<Value> softmax_like(const Node& n, const Inputs& in, bool log) {
  Tensor x = tin(n, in, 0);
  int64_t r = x.dim();
  int64_t axis = norm_axis(n.get_int("axis", n.opset < 13 ? 1 : -1), std::max<int64_t>(r, 1), "Softmax axis");
  auto f = [&](const Tensor& t, int64_t d) { return log ? log_softmax(t, d) : softmax(t, d); };
  if (n.opset >= 13 || axis == r - 1) return one(f(x, axis));
  // Opset < 13: softmax over the flattened [prod(dims < axis), prod(dims >= axis)] matrix.
  SymInt outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer = outer * x.size(i);
  return one(reshape(f(reshape(x, {outer, -1}), 1), x.sizes()));
}
std::vector<Value> op_softmax(const Node& n, const Inputs& in) { return softmax_like(n, in, false); }
std::vector<Value> op_log_softmax(const Node& n, const Inputs& in) { return softmax_like(n, in, true); }

/// BatchNormalization. Inference: the affine map over the running statistics. training_mode=1
/// (opsets 14 and 15; what ONNX Runtime's CPU provider runs): Y is normalized with the batch's mean and
/// biased variance over every dim but the channel (1), and the optional outputs are the updated running
/// statistics, running = input_running · momentum + batch · (1 − momentum), with the biased batch
/// variance, as ONNX's reference computes them. Statistics in f32 at least (f64 stays f64).
std::vector<Value> op_batch_norm(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = tin(n, in, 1), bias = tin(n, in, 2), rmean = tin(n, in, 3), rvar = tin(n, in, 4);
  const double eps = n.get_float("epsilon", 1e-5);
  if (n.get_int("training_mode", 0) == 0) return one(batch_norm(x, scale, bias, rmean, rvar, eps));
  if (x.dim() < 2) throw ShapeError(fmt::format("BatchNormalization input must be [N, C, ...], got {}", to_string(x.sizes())));
  const double momentum = n.get_float("momentum", 0.9);
  const DType acc = x.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor xf = cast(x, acc);
  IntVec dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  SymIntVec bshape(static_cast<size_t>(x.dim()), SymInt(1));
  bshape[1] = x.size(1);
  Tensor mu = mean(xf, dims), v = var(xf, dims, false, 0);  // [C], biased
  auto chan = [&](const Tensor& t) { return reshape(cast(t, acc), bshape); };
  Tensor y = add(mul(div(sub(xf, chan(mu)), sqrt(add(chan(v), eps))), chan(scale)), chan(bias));
  std::vector<Value> outs{Value::tensor(cast(y, x.dtype()))};
  auto running = [&](const Tensor& old, const Tensor& batch) {
    return cast(add(mul(cast(old, acc), momentum), mul(batch, 1.0 - momentum)), old.dtype());
  };
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) outs.push_back(Value::tensor(running(rmean, mu)));
  if (n.outputs.size() > 2 && !n.outputs[2].empty()) outs.push_back(Value::tensor(running(rvar, v)));
  return outs;
}

std::vector<Value> op_matmul(const Node& n, const Inputs& in) { return one(matmul(tin(n, in, 0), tin(n, in, 1))); }

// ---- convolution / pooling ------------------------------------------------------------------------------
struct Window {
  IntVec stride, dilation, pad_begin, pad_end;
};

// Reads strides/dilations/pads/auto_pad for `sp` spatial dims of x with kernel sizes `k`.
Window window_attrs(const Node& n, const Tensor& x, const IntVec& k) {
  size_t sp = k.size();
  Window w;
  w.stride = n.get_ints("strides", IntVec(sp, 1));
  w.dilation = n.get_ints("dilations", IntVec(sp, 1));
  IntVec pads = n.get_ints("pads", IntVec(2 * sp, 0));
  if (w.stride.size() != sp || w.dilation.size() != sp || pads.size() != 2 * sp)
    throw ValueError(fmt::format("strides/dilations/pads do not match {} spatial dims", sp));
  w.pad_begin.assign(pads.begin(), pads.begin() + sp);
  w.pad_end.assign(pads.begin() + sp, pads.end());
  std::string ap = n.get_string("auto_pad", "NOTSET");
  if (ap == "VALID") {
    w.pad_begin.assign(sp, 0);
    w.pad_end.assign(sp, 0);
  } else if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    // Output = ceil(in / stride); total padding as ONNX defines it (specializes a symbolic size).
    for (size_t i = 0; i < sp; ++i) {
      int64_t in_sz = x.size(static_cast<int64_t>(2 + i)).guard_int();
      int64_t out = (in_sz + w.stride[i] - 1) / w.stride[i];
      int64_t total = std::max<int64_t>(0, (out - 1) * w.stride[i] + (k[i] - 1) * w.dilation[i] + 1 - in_sz);
      int64_t small = total / 2;
      w.pad_begin[i] = ap == "SAME_UPPER" ? small : total - small;
      w.pad_end[i] = total - w.pad_begin[i];
    }
  }
  return w;
}

// PyTorch-order pads (last dim first) for the spatial dims of `w`.
SymIntVec torch_pads(const Window& w) {
  SymIntVec p;
  for (size_t i = w.pad_begin.size(); i-- > 0;) {
    p.emplace_back(w.pad_begin[i]);
    p.emplace_back(w.pad_end[i]);
  }
  return p;
}

/// 3-D convolution as one 2-D convolution per depth tap of the kernel: tap t reads the input depths
/// t * dilation + stride * d for every output depth d, which are folded into the batch
/// ([N * D_out, C, H, W]); the taps' outputs are summed. Pads are applied explicitly first.
Tensor conv3d_by_taps(Tensor x, const Tensor& wt, const Tensor& b, Window w, int64_t group) {
  if (w.pad_begin != IntVec{0, 0, 0} || w.pad_end != IntVec{0, 0, 0}) x = pad(x, torch_pads(w), "constant", 0.0);
  int64_t kd = wt.size(2).guard_int(), dp = x.size(2).guard_int();
  int64_t dout = (dp - w.dilation[0] * (kd - 1) - 1) / w.stride[0] + 1;
  if (dout < 1)
    throw ShapeError(fmt::format("Conv: depth {} (padded) is smaller than the dilated kernel depth {}", dp,
                                 w.dilation[0] * (kd - 1) + 1));
  SymInt N = x.size(0), C = x.size(1), H = x.size(3), W = x.size(4);
  Tensor acc;
  for (int64_t t = 0; t < kd; ++t) {
    int64_t start = t * w.dilation[0];
    Tensor xs = slice(x, 2, start, start + (dout - 1) * w.stride[0] + 1, w.stride[0]);  // [N, C, D_out, H, W]
    Tensor x2 = reshape(permute(xs, {0, 2, 1, 3, 4}), {N * dout, C, H, W});
    Tensor y2 = conv2d(x2, select(wt, 2, t), {}, {w.stride[1], w.stride[2]}, {0, 0}, {w.dilation[1], w.dilation[2]}, group);
    acc = acc.defined() ? add(acc, y2) : y2;
  }
  Tensor y = permute(reshape(acc, {N, SymInt(dout), acc.size(1), acc.size(2), acc.size(3)}), {0, 2, 1, 3, 4});
  if (b.defined()) y = add(y, reshape(b, {SymInt(1), b.size(0), SymInt(1), SymInt(1), SymInt(1)}));
  return y;
}

std::vector<Value> op_conv(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), wt = tin(n, in, 1), b = topt(in, 2);
  int64_t sp = x.dim() - 2;
  if (sp != 1 && sp != 2 && sp != 3)
    throw NotImplementedError(fmt::format("Conv on a rank-{} input {} (1-D, 2-D and 3-D convolutions)", x.dim(),
                                          to_string(x.sizes())));
  if (wt.dim() != x.dim())
    throw ShapeError(fmt::format("Conv weight {} for input {}", to_string(wt.sizes()), to_string(x.sizes())));
  IntVec k;
  for (int64_t i = 0; i < sp; ++i) k.push_back(wt.size(2 + i).guard_int());
  Window w = window_attrs(n, x, k);
  int64_t group = n.get_int("group", 1);
  if (sp == 3) return one(conv3d_by_taps(x, wt, b, w, group));
  if (w.pad_begin != w.pad_end) {  // asymmetric: pad explicitly, then convolve without padding
    x = pad(x, torch_pads(w), "constant", 0.0);
    w.pad_begin.assign(sp, 0);
  }
  if (sp == 1) return one(conv1d(x, wt, b, w.stride, w.pad_begin, w.dilation, group));
  return one(conv2d(x, wt, b, w.stride, w.pad_begin, w.dilation, group));
}

/// 3-D transposed convolution, unpadded, as one 2-D transposed convolution per depth tap of the
/// kernel: tap t's (H, W) result for every input depth at once (the depths folded into the batch)
/// belongs at output depths t * dilation + stride * d, so it is spread to that stride by interleaving
/// zeros, shifted into place by padding, and the taps' contributions are summed.
Tensor conv_transpose3d_by_taps(const Tensor& x, const Tensor& wt, const IntVec& stride, const IntVec& dil,
                                const IntVec& outpad, int64_t group) {
  SymInt N = x.size(0), C = x.size(1), H = x.size(3), W = x.size(4);
  int64_t D = x.size(2).guard_int(), kd = wt.size(2).guard_int(), s = stride[0];
  int64_t full_d = s * (D - 1) + dil[0] * (kd - 1) + 1 + outpad[0];
  int64_t spread = s * (D - 1) + 1;
  Tensor x2 = reshape(permute(x, {0, 2, 1, 3, 4}), {N * D, C, H, W});
  Tensor acc;
  for (int64_t t = 0; t < kd; ++t) {
    Tensor y2 = conv_transpose2d(x2, select(wt, 2, t), {}, {stride[1], stride[2]}, {0, 0}, {outpad[1], outpad[2]},
                                 group, {dil[1], dil[2]});
    SymInt O = y2.size(1), Ho = y2.size(2), Wo = y2.size(3);
    Tensor y = reshape(y2, {N, SymInt(D), O, Ho, Wo});
    if (s > 1) {
      Tensor z = full({N, SymInt(D), SymInt(s - 1), O, Ho, Wo}, 0.0, y.dtype());
      y = slice(reshape(cat({unsqueeze(y, 2), z}, 2), {N, SymInt(D * s), O, Ho, Wo}), 1, 0, spread);
    }
    int64_t lo = t * dil[0], hi = full_d - lo - spread;
    y = pad(permute(y, {0, 2, 1, 3, 4}), {0, 0, 0, 0, SymInt(lo), SymInt(hi)}, "constant", 0.0);
    acc = acc.defined() ? add(acc, y) : y;
  }
  return acc;
}

/// A transposed convolution over 1, 2 or 3 spatial dims (x [N, C, *S], wt [C, O / group, *K]) with
/// ONNX's explicit pads (begin..., end...) cropped from the full result and `extra` bias-only positions
/// appended at the end of each dim (an output_shape beyond the full size). 1-D runs as 2-D with H = 1.
Tensor conv_transpose_nd(Tensor x, Tensor wt, const Tensor& b, IntVec stride, IntVec dil, IntVec outpad, IntVec pads,
                         IntVec extra, int64_t group) {
  int64_t sp = x.dim() - 2;
  bool one_d = sp == 1;
  if (one_d) {
    x = unsqueeze(x, 2);
    wt = unsqueeze(wt, 2);
    stride.insert(stride.begin(), 1);
    dil.insert(dil.begin(), 1);
    outpad.insert(outpad.begin(), 0);
    pads = {0, pads[0], 0, pads[1]};
    extra.insert(extra.begin(), 0);
    sp = 2;
  }
  auto spu = static_cast<size_t>(sp);
  bool grow = std::any_of(extra.begin(), extra.end(), [](int64_t e) { return e != 0; });
  bool bias_after = grow || sp == 3;
  Tensor y = sp == 3 ? conv_transpose3d_by_taps(x, wt, stride, dil, outpad, group)
                     : conv_transpose2d(x, wt, bias_after ? Tensor() : b, stride, {0, 0}, outpad, group, dil);
  for (size_t i = 0; i < spu; ++i) {
    int64_t lo = pads[i], hi = pads[i + spu];
    auto d = static_cast<int64_t>(2 + i);
    if (lo != 0 || hi != 0) y = slice(y, d, SymInt(lo), y.size(d) - hi);
  }
  if (grow) {
    SymIntVec p;
    for (size_t i = spu; i-- > 0;) {
      p.emplace_back(0);
      p.emplace_back(extra[i]);
    }
    y = pad(y, p, "constant", 0.0);
  }
  if (bias_after && b.defined()) {
    SymIntVec bs(static_cast<size_t>(y.dim()), SymInt(1));
    bs[1] = b.size(0);
    y = add(y, reshape(b, bs));
  }
  return one_d ? squeeze(y, {2}) : y;
}

/// ConvTranspose in 1-D, 2-D and 3-D. Pads come from `pads`, or from output_shape / auto_pad=SAME_*
/// as ONNX defines them (total = stride * (in - 1) + output_padding + (k - 1) * dilation + 1 - out;
/// SAME_UPPER puts the odd unit at the end, otherwise at the start); the transposed convolution runs
/// unpadded and the result is cropped, so asymmetric pads work too.
std::vector<Value> op_conv_transpose(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), wt = tin(n, in, 1), b = topt(in, 2);
  int64_t sp = x.dim() - 2;
  if (sp != 1 && sp != 2 && sp != 3)
    throw NotImplementedError(fmt::format("ConvTranspose on a rank-{} input (1-D, 2-D and 3-D only)", x.dim()));
  if (wt.dim() != x.dim())
    throw ShapeError(fmt::format("ConvTranspose weight {} for input {}", to_string(wt.sizes()), to_string(x.sizes())));
  auto spu = static_cast<size_t>(sp);
  IntVec k;
  for (int64_t i = 0; i < sp; ++i) k.push_back(wt.size(2 + i).guard_int());
  IntVec stride = n.get_ints("strides", IntVec(spu, 1)), dil = n.get_ints("dilations", IntVec(spu, 1));
  IntVec outpad = n.get_ints("output_padding", IntVec(spu, 0));
  IntVec pads = n.get_ints("pads", IntVec(2 * spu, 0));
  if (stride.size() != spu || dil.size() != spu || outpad.size() != spu || pads.size() != 2 * spu)
    throw ValueError(fmt::format("ConvTranspose strides/dilations/output_padding/pads do not match {} spatial dims", sp));
  for (size_t i = 0; i < spu; ++i)
    if (stride[i] < 1 || dil[i] < 1 || outpad[i] < 0 || (outpad[i] >= stride[i] && outpad[i] >= dil[i]))
      throw ValueError(fmt::format("ConvTranspose spatial dim {}: stride {}, dilation {}, output_padding {} (strides and "
                                   "dilations must be >= 1, output_padding >= 0 and smaller than the stride or the "
                                   "dilation)", i, stride[i], dil[i], outpad[i]));
  std::string ap = n.get_string("auto_pad", "NOTSET");
  std::optional<IntVec> oshape = n.opt_ints("output_shape");
  IntVec extra(spu, 0);  // output_shape beyond the full size: positions no input reaches (bias only)
  if (oshape && oshape->size() == spu + 2) oshape = IntVec(oshape->begin() + 2, oshape->end());
  if (ap == "VALID") pads.assign(2 * spu, 0);
  if (oshape || ap == "SAME_UPPER" || ap == "SAME_LOWER") {
    if (oshape && oshape->size() != spu)
      throw ValueError(fmt::format("ConvTranspose output_shape has {} entries for {} spatial dims", oshape->size(), sp));
    for (size_t i = 0; i < spu; ++i) {
      int64_t in_sz = x.size(static_cast<int64_t>(2 + i)).guard_int();
      int64_t out = oshape ? (*oshape)[i] : in_sz * stride[i];
      int64_t total = stride[i] * (in_sz - 1) + outpad[i] + (k[i] - 1) * dil[i] + 1 - out;
      if (total < 0) {
        extra[i] = -total;
        total = 0;
      }
      int64_t half = total / 2;
      pads[i] = ap == "SAME_UPPER" ? half : total - half;
      pads[i + spu] = total - pads[i];
    }
  }
  return one(conv_transpose_nd(x, wt, b, stride, dil, outpad, pads, extra, n.get_int("group", 1)));
}

/// Col2Im (opset 18): columns [N, C * prod(block_shape), L] summed back into [N, C, *image_shape], the
/// inverse of im2col with strides, dilations and pads (1-D to 3-D). It is a transposed convolution
/// with C groups whose weight picks, for each of a block's positions, its own column (one-hot), run
/// over the L = prod(blocks) block positions laid out as their grid, then cropped by the pads.
std::vector<Value> op_col2im(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec image = read_concrete_ints(need(n, in, 1), "Col2Im image_shape");
  IntVec block = read_concrete_ints(need(n, in, 2), "Col2Im block_shape");
  size_t sp = image.size();
  if (sp < 1 || sp > 3 || block.size() != sp)
    throw NotImplementedError(fmt::format("Col2Im with image_shape of {} and block_shape of {} dims (1 to 3 spatial "
                                          "dims, equal counts)", image.size(), block.size()));
  if (x.dim() != 3) throw ShapeError(fmt::format("Col2Im input must be [N, C * prod(block_shape), L], got {}", to_string(x.sizes())));
  IntVec stride = n.get_ints("strides", IntVec(sp, 1)), dil = n.get_ints("dilations", IntVec(sp, 1));
  IntVec pads = n.get_ints("pads", IntVec(2 * sp, 0));
  if (stride.size() != sp || dil.size() != sp || pads.size() != 2 * sp)
    throw ValueError(fmt::format("Col2Im strides/dilations/pads do not match {} spatial dims", sp));
  int64_t K = 1, L = 1;
  IntVec grid, extra(sp, 0);
  for (size_t i = 0; i < sp; ++i) {
    if (block[i] < 1 || stride[i] < 1 || dil[i] < 1 || image[i] < 1)
      throw ValueError(fmt::format("Col2Im spatial dim {}: image {}, block {}, stride {}, dilation {} must be >= 1", i,
                                   image[i], block[i], stride[i], dil[i]));
    int64_t span = image[i] + pads[i] + pads[i + sp] - dil[i] * (block[i] - 1) - 1;
    if (span < 0)
      throw ShapeError(fmt::format("Col2Im spatial dim {}: the padded image ({}) is smaller than the dilated block ({})",
                                   i, image[i] + pads[i] + pads[i + sp], dil[i] * (block[i] - 1) + 1));
    grid.push_back(span / stride[i] + 1);
    // The blocks' reach can stop short of the padded image's end: those positions get zeros.
    int64_t reach = stride[i] * (grid[i] - 1) + dil[i] * (block[i] - 1) + 1;
    int64_t crop_end = reach - pads[i] - image[i];
    if (crop_end < 0) {
      extra[i] = -crop_end;
      crop_end = 0;
    }
    pads[i + sp] = crop_end;
    K *= block[i];
    L *= grid[i];
  }
  int64_t ck = x.size(1).guard_int();
  if (ck % K != 0 || x.size(2).guard_int() != L)
    throw ShapeError(fmt::format("Col2Im input {}: dim 1 must be a multiple of prod(block_shape) = {} and dim 2 the "
                                 "number of blocks {}", to_string(x.sizes()), K, L));
  int64_t C = ck / K;
  SymIntVec xs{x.size(0), SymInt(ck)}, ws{SymInt(C * K), SymInt(1)};
  for (size_t i = 0; i < sp; ++i) {
    xs.emplace_back(grid[i]);
    ws.emplace_back(block[i]);
  }
  std::vector<float> eye(static_cast<size_t>(K * K), 0.0f);
  for (int64_t i = 0; i < K; ++i) eye[static_cast<size_t>(i * K + i)] = 1.0f;
  Tensor w = reshape(expand(unsqueeze(tensor<float>(eye, {K, K}), 0), {SymInt(C), SymInt(K), SymInt(K)}), ws);
  if (w.dtype() != x.dtype()) w = cast(w, x.dtype());
  return one(conv_transpose_nd(reshape(x, xs), w, {}, stride, dil, IntVec(sp, 0), pads, extra, C));
}

/// 3-D pooling as two 2-D poolings: over (H, W) with the depth folded into the channels, then over
/// the depth with (H, W) flattened; max and sum are separable, and an average excluding padding is
/// the separable sum over the separable count of real elements.
Tensor pool3d(const Node& n, Tensor x, bool is_max) {
  IntVec k = n.get_ints("kernel_shape");
  if (k.size() != 3) throw ValueError("kernel_shape must have 3 entries for a 3-D pool");
  Window w = window_attrs(n, x, k);
  bool count_pad = n.get_int("count_include_pad", 0) != 0;
  bool padded = w.pad_begin != IntVec{0, 0, 0} || w.pad_end != IntVec{0, 0, 0};
  SymIntVec tp = torch_pads(w);
  auto separable = [&](Tensor t, bool max) {
    if (padded) t = pad(t, tp, "constant", max ? -INFINITY : 0.0);
    SymInt N = t.size(0), C = t.size(1), D = t.size(2), H = t.size(3), W = t.size(4);
    Tensor a = reshape(t, {N, C * D, H, W});
    a = max ? max_pool2d(a, {k[1], k[2]}, {w.stride[1], w.stride[2]}, {0, 0}, {w.dilation[1], w.dilation[2]}, false)
            : avg_pool2d(a, {k[1], k[2]}, {w.stride[1], w.stride[2]}, {0, 0}, false, true);
    SymInt H2 = a.size(2), W2 = a.size(3);
    a = reshape(a, {N, C, D, H2 * W2});
    a = max ? max_pool2d(a, {k[0], 1}, {w.stride[0], 1}, {0, 0}, {w.dilation[0], 1}, false)
            : avg_pool2d(a, {k[0], 1}, {w.stride[0], 1}, {0, 0}, false, true);
    return reshape(a, {N, C, a.size(2), H2, W2});
  };
  if (is_max || count_pad || !padded) return separable(x, is_max);
  Tensor ones = full({SymInt(1), SymInt(1), x.size(2), x.size(3), x.size(4)}, 1.0, x.dtype());
  return div(separable(x, false), separable(ones, false));
}

/// Pooling over 1, 2 or 3 spatial dims by kernel taps: x (padded with the pads, and at the end with
/// what ceil_mode's last windows need) is cut into one strided slice per kernel tap, and the taps are
/// stacked last. MaxPool: argmax picks the first largest in the kernel's row-major order (ONNX
/// Runtime's scan order); its Indices output gathers, at the same tap, each element's flat index
/// (row-major over [N, C, *S], or with the spatial dims column-major for storage_order=1, as ONNX
/// Runtime numbers them), padded alike with −1. AveragePool: the taps' sum over the sum of the same
/// taps of ones that mark the counted positions (the input, plus the pads with count_include_pad;
/// never ceil_mode's overhang, as PyTorch). Takes dilations, ceil_mode and any pads; integer inputs
/// are pooled in f64 (exact below 2^53) and cast back.
std::vector<Value> pool_by_taps(const Node& n, Tensor x, bool is_max, bool want_indices) {
  int64_t sp = x.dim() - 2;
  if (sp < 1 || sp > 3)
    throw NotImplementedError(fmt::format("{} on a rank-{} input (1-D, 2-D and 3-D only)", n.op_type, x.dim()));
  IntVec k = n.get_ints("kernel_shape");
  if (static_cast<int64_t>(k.size()) != sp)
    throw ValueError(fmt::format("{} kernel_shape has {} entries for {} spatial dims", n.op_type, k.size(), sp));
  Window w = window_attrs(n, x, k);
  bool ceil_mode = n.get_int("ceil_mode", 0) != 0;
  bool count_pad = n.get_int("count_include_pad", 0) != 0;
  int64_t order = n.get_int("storage_order", 0);
  if (order != 0 && order != 1) throw ValueError(fmt::format("MaxPool storage_order={} (0 or 1)", order));
  DType dt = x.dtype();
  if (!is_floating(dt)) x = cast(x, DType::F64);
  auto spu = static_cast<size_t>(sp);
  IntVec in_sz, out_sz, over(spu, 0);
  for (size_t i = 0; i < spu; ++i) {
    int64_t d = x.size(static_cast<int64_t>(2 + i)).guard_int();
    if (k[i] < 1 || w.stride[i] < 1 || w.dilation[i] < 1)
      throw ValueError(fmt::format("{} spatial dim {}: kernel {}, stride {}, dilation {} must be >= 1", n.op_type, i, k[i],
                                   w.stride[i], w.dilation[i]));
    int64_t span = d + w.pad_begin[i] + w.pad_end[i] - w.dilation[i] * (k[i] - 1) - 1;
    if (span < 0)
      throw ShapeError(fmt::format("{}: spatial dim {} ({} with pads) is smaller than the dilated kernel {}", n.op_type, i,
                                   d + w.pad_begin[i] + w.pad_end[i], w.dilation[i] * (k[i] - 1) + 1));
    int64_t o = (ceil_mode ? (span + w.stride[i] - 1) / w.stride[i] : span / w.stride[i]) + 1;
    if (ceil_mode && (o - 1) * w.stride[i] >= d + w.pad_begin[i]) --o;  // the last window starts in the input
    over[i] = std::max<int64_t>(0, (o - 1) * w.stride[i] + w.dilation[i] * (k[i] - 1) + 1 - d - w.pad_begin[i] - w.pad_end[i]);
    in_sz.push_back(d);
    out_sz.push_back(o);
  }
  SymIntVec tp = torch_pads(w), op;
  for (size_t i = spu; i-- > 0;) {
    op.emplace_back(0);
    op.emplace_back(over[i]);
  }
  bool overhang = std::any_of(over.begin(), over.end(), [](int64_t v) { return v != 0; });
  auto padded = [&](const Tensor& t, double pad_value, double over_value) {
    Tensor r = pad(t, tp, "constant", pad_value);
    return overhang ? pad(r, op, "constant", over_value) : r;
  };
  auto taps = [&](const Tensor& t) {
    TensorList parts;
    IntVec tap(spu, 0);
    for (;;) {
      Tensor a = t;
      for (size_t i = 0; i < spu; ++i) {
        auto d = static_cast<int64_t>(2 + i);
        int64_t st = tap[i] * w.dilation[i];
        a = slice(a, d, st, st + (out_sz[i] - 1) * w.stride[i] + 1, w.stride[i]);
      }
      parts.push_back(a);
      size_t i = spu;
      while (i-- > 0) {
        if (++tap[i] < k[i]) break;
        tap[i] = 0;
      }
      if (i == static_cast<size_t>(-1)) break;
    }
    return stack(parts, t.dim());
  };
  int64_t last = x.dim();
  auto back = [&](const Tensor& t) { return t.dtype() == dt ? t : cast(t, dt); };
  if (!is_max) {
    SymIntVec ones_shape{SymInt(1), SymInt(1)};
    for (int64_t d : in_sz) ones_shape.emplace_back(d);
    Tensor ones = full(ones_shape, 1.0, x.dtype());
    Tensor num = sum(taps(padded(x, 0.0, 0.0)), {last});
    Tensor den = sum(taps(padded(ones, count_pad ? 1.0 : 0.0, 0.0)), {last});
    return one(back(div(num, den)));
  }
  Tensor vals = taps(padded(x, -INFINITY, -INFINITY));
  Tensor best = argmax(vals, last, true);
  Value y = Value::tensor(back(squeeze(gather(vals, last, best), {last})));
  if (!want_indices) return {y};
  SymInt N = x.size(0), C = x.size(1);
  SymInt count = N * C;
  for (int64_t d : in_sz) count = count * d;
  Tensor pos = arange(count, DType::I64);
  if (order == 0) {
    pos = reshape(pos, x.sizes());
  } else {
    SymIntVec rev{N, C};
    IntVec perm{0, 1};
    for (size_t i = spu; i-- > 0;) rev.emplace_back(in_sz[i]);
    for (int64_t i = 0; i < sp; ++i) perm.push_back(1 + sp - i);
    pos = permute(reshape(pos, rev), perm);
  }
  return {y, Value::tensor(squeeze(gather(taps(padded(pos, -1.0, -1.0)), last, best), {last}))};
}

std::vector<Value> pool(const Node& n, const Inputs& in, bool is_max) {
  Tensor x = tin(n, in, 0);
  bool indices = is_max && n.outputs.size() > 1 && !n.outputs[1].empty();
  bool ceil_mode = n.get_int("ceil_mode", 0) != 0;
  IntVec dil = n.get_ints("dilations", {});
  bool dilated = std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; });
  // The tap form covers what the library pools do not: the Indices output, ceil_mode in 3-D or with
  // asymmetric or wide pads, and AveragePool with dilations.
  if (indices || (!is_max && dilated) || (ceil_mode && x.dim() == 5)) return pool_by_taps(n, x, is_max, indices);
  if (x.dim() == 5) return one(pool3d(n, x, is_max));
  bool one_d = x.dim() == 3;  // [N, C, L] runs as [N, C, 1, L]
  if (x.dim() != 4 && !one_d)
    throw NotImplementedError(fmt::format("{}: only 1-D and 2-D pooling (rank-3/4 input), got {}", n.op_type,
                                          to_string(x.sizes())));
  IntVec k = n.get_ints("kernel_shape");
  if (k.size() != (one_d ? 1u : 2u)) throw ValueError(fmt::format("kernel_shape must have {} entries", one_d ? 1 : 2));
  Window w = window_attrs(n, x, k);
  if (one_d) {
    x = unsqueeze(x, 2);
    k.insert(k.begin(), 1);
    w.stride.insert(w.stride.begin(), 1);
    w.dilation.insert(w.dilation.begin(), 1);
    w.pad_begin.insert(w.pad_begin.begin(), 0);
    w.pad_end.insert(w.pad_end.begin(), 0);
  }
  bool count_pad = n.get_int("count_include_pad", 0) != 0;
  bool explicit_pad = w.pad_begin != w.pad_end;
  for (size_t i = 0; i < 2; ++i) explicit_pad |= w.pad_begin[i] > k[i] / 2;
  Tensor y;
  if (explicit_pad) {
    // Asymmetric pads, or pads wider than half the kernel: pad explicitly, then pool without padding.
    if (ceil_mode) return pool_by_taps(n, tin(n, in, 0), is_max, false);
    SymIntVec tp = torch_pads(w);
    IntVec zero{0, 0};
    if (is_max) {
      y = max_pool2d(pad(x, tp, "constant", -INFINITY), k, w.stride, zero, w.dilation, false);
    } else {
      Tensor s = avg_pool2d(pad(x, tp, "constant", 0.0), k, w.stride, zero, false, true);
      if (count_pad) {
        y = s;
      } else {
        Tensor ones = full({SymInt(1), SymInt(1), x.size(2), x.size(3)}, 1.0, x.dtype());
        y = div(s, avg_pool2d(pad(ones, tp, "constant", 0.0), k, w.stride, zero, false, true));
      }
    }
  } else if (is_max) {
    y = max_pool2d(x, k, w.stride, w.pad_begin, w.dilation, ceil_mode);
  } else {
    y = avg_pool2d(x, k, w.stride, w.pad_begin, ceil_mode, count_pad);
  }
  return one(one_d ? squeeze(y, {2}) : y);
}
std::vector<Value> op_max_pool(const Node& n, const Inputs& in) { return pool(n, in, true); }

/// MaxUnpool: X's values written at their flat Indices (MaxPool's second output, counted over the
/// whole [N, C, *S] output) into zeros of the output shape: output_shape's (the third input) when
/// given, else (in - 1) * stride + kernel - pad_begin - pad_end per spatial dim. A position named
/// twice gets the mean of its values (MaxPool names a position twice only with one value).
std::vector<Value> op_max_unpool(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), idx = tin(n, in, 1);
  int64_t sp = x.dim() - 2;
  if (sp < 1) throw ShapeError(fmt::format("MaxUnpool on a rank-{} input (needs [N, C, spatial...])", x.dim()));
  if (!is_integral(idx.dtype()))
    throw TypeError(fmt::format("MaxUnpool indices must be integers, got {}", short_name(idx.dtype())));
  if (idx.dim() != x.dim())
    throw ShapeError(fmt::format("MaxUnpool indices {} for X {}", to_string(idx.sizes()), to_string(x.sizes())));
  SymIntVec shape{x.size(0), x.size(1)};
  auto spu = static_cast<size_t>(sp);
  IntVec k = n.get_ints("kernel_shape");
  IntVec stride = n.get_ints("strides", IntVec(spu, 1)), pads = n.get_ints("pads", IntVec(2 * spu, 0));
  if (k.size() != spu || stride.size() != spu || pads.size() != 2 * spu)
    throw ValueError(fmt::format("MaxUnpool kernel_shape/strides/pads do not match {} spatial dims", sp));
  for (size_t i = 0; i < spu; ++i)
    shape.push_back((x.size(static_cast<int64_t>(2 + i)) - 1) * stride[i] + k[i] - pads[i] - pads[i + spu]);
  SymInt count = 1;
  for (const auto& d : shape) count = count * d;
  Tensor flat_idx = reshape(idx.dtype() == DType::I64 ? idx : cast(idx, DType::I64), {-1});
  Tensor flat_x = reshape(x, {-1});
  Tensor sums = scatter_add(full({count}, 0.0, x.dtype()), 0, flat_idx, flat_x);
  Tensor hits = scatter_add(full({count}, 0.0, x.dtype()), 0, flat_idx, full(flat_x.sizes(), 1.0, x.dtype()));
  Tensor y = reshape(where(gt(hits, wrap_scalar(1.0, hits)), div(sums, hits), sums), shape);
  if (const Value* os = opt(in, 2)) {
    // ONNX's own test data: the indices keep their coordinates in the inferred shape, and the larger
    // output_shape adds zeros at the end of each spatial dim.
    IntVec want = read_concrete_ints(*os, "MaxUnpool output_shape");
    if (static_cast<int64_t>(want.size()) != x.dim())
      throw ShapeError(fmt::format("MaxUnpool output_shape has {} entries for a rank-{} input", want.size(), x.dim()));
    SymIntVec p;
    for (int64_t d = x.dim() - 1; d >= 0; --d) {
      int64_t have = shape[static_cast<size_t>(d)].guard_int(), need = want[static_cast<size_t>(d)];
      if (need < have || (d < 2 && need != have))
        throw ShapeError(fmt::format("MaxUnpool output_shape {} for an inferred shape {}: each spatial dim must be at "
                                     "least the inferred size, N and C equal", want.size() > 0 ? to_string(to_symint_vec(want)) : "[]",
                                     to_string(shape)));
      p.emplace_back(0);
      p.emplace_back(need - have);
    }
    y = pad(y, p, "constant", 0.0);
  }
  return one(y);
}
std::vector<Value> op_avg_pool(const Node& n, const Inputs& in) { return pool(n, in, false); }
/// LpPool with dilations: the window sum as the sum of one strided slice of the zero-padded |x|^p
/// per kernel tap (tap t of dim i starts at t * dilation[i]); any number of spatial dims; ceil_mode
/// adds the pad the last partial window needs at the end.
Tensor dilated_window_sum(const Node& n, const Tensor& powered) {
  IntVec k = n.get_ints("kernel_shape");
  const int64_t sp = powered.dim() - 2;
  if (sp < 1 || static_cast<int64_t>(k.size()) != sp)
    throw ShapeError(fmt::format("LpPool kernel_shape {} for an input {}", to_string(to_symint_vec(k)), to_string(powered.sizes())));
  Window w = window_attrs(n, powered, k);
  const bool ceil_mode = n.get_int("ceil_mode", 0) != 0;
  IntVec out(static_cast<size_t>(sp));
  for (int64_t i = 0; i < sp; ++i) {
    size_t u = static_cast<size_t>(i);
    int64_t span = (k[u] - 1) * w.dilation[u] + 1;
    int64_t room = powered.size(2 + i).guard_int() + w.pad_begin[u] + w.pad_end[u] - span;
    if (room < 0) throw ShapeError(fmt::format("LpPool: the dilated window ({}) is wider than the padded input at spatial dim {}", span, i));
    out[u] = (ceil_mode ? (room + w.stride[u] - 1) / w.stride[u] : room / w.stride[u]) + 1;
    if (ceil_mode && (out[u] - 1) * w.stride[u] >= powered.size(2 + i).guard_int() + w.pad_begin[u]) --out[u];
    // the extra zeros a last partial window reads
    w.pad_end[u] = std::max<int64_t>(w.pad_end[u], (out[u] - 1) * w.stride[u] + span - powered.size(2 + i).guard_int() - w.pad_begin[u]);
  }
  Tensor xp = pad(powered, torch_pads(w), "constant", 0.0);
  Tensor acc;
  IntVec tap(static_cast<size_t>(sp), 0);
  while (true) {
    Tensor t = xp;
    for (int64_t i = 0; i < sp; ++i) {
      size_t u = static_cast<size_t>(i);
      int64_t start = tap[u] * w.dilation[u];
      t = slice(t, 2 + i, start, start + (out[u] - 1) * w.stride[u] + 1, w.stride[u]);
    }
    acc = acc.defined() ? add(acc, t) : t;
    int64_t d = sp - 1;
    while (d >= 0 && ++tap[static_cast<size_t>(d)] == k[static_cast<size_t>(d)]) tap[static_cast<size_t>(d--)] = 0;
    if (d < 0) break;
  }
  return acc;
}

/// LpPool: (Σ_window |x|^p)^(1/p), the window sum as an average pool that counts the pads (zeros,
/// which add nothing) times the kernel volume; 1-D, 2-D and 3-D and every pad form of AveragePool;
/// with dilations, the sum of one strided slice per kernel tap.
std::vector<Value> op_lp_pool(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (!is_floating(x.dtype())) throw TypeError(fmt::format("LpPool takes a floating tensor, got {}", short_name(x.dtype())));
  int64_t p = n.get_int("p", 2);
  if (p < 1) throw ValueError(fmt::format("LpPool: p must be >= 1, got {}", p));
  IntVec dil = n.get_ints("dilations");
  if (std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d != 1; })) {
    if (std::any_of(dil.begin(), dil.end(), [](int64_t d) { return d < 1; }))
      throw ValueError(fmt::format("LpPool dilations {} must be >= 1", to_string(to_symint_vec(dil))));
    Tensor ax = abs(x);
    Tensor sum = dilated_window_sum(n, p == 1 ? ax : p == 2 ? mul(ax, ax) : pow(ax, static_cast<double>(p)));
    return one(p == 1 ? sum : p == 2 ? sqrt(sum) : pow(sum, 1.0 / static_cast<double>(p)));
  }
  Node avg = n;
  avg.op_type = "AveragePool";
  Attr count;
  count.type = Attr::Type::Int;
  count.i = 1;
  avg.attrs["count_include_pad"] = count;
  Tensor ax = abs(x);
  Value powered = Value::tensor(p == 1 ? ax : p == 2 ? mul(ax, ax) : pow(ax, static_cast<double>(p)));
  Inputs pin = {&powered};
  Tensor mean = pool(avg, pin, false).at(0).t;
  double volume = 1;
  for (int64_t k : n.get_ints("kernel_shape")) volume *= static_cast<double>(k);
  Tensor sum = mul(mean, volume);
  return one(p == 1 ? sum : p == 2 ? sqrt(sum) : pow(sum, 1.0 / static_cast<double>(p)));
}

std::vector<Value> op_global_avg_pool(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() == 4) return one(adaptive_avg_pool2d(x, {1, 1}));
  IntVec dims;
  for (int64_t i = 2; i < x.dim(); ++i) dims.push_back(i);
  return one(mean(x, dims, true));
}
std::vector<Value> op_global_max_pool(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec dims;
  for (int64_t i = 2; i < x.dim(); ++i) dims.push_back(i);
  return one(amax(x, dims, true));
}

std::vector<Value> op_pad(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  std::string mode = n.get_string("mode", "constant");
  SymIntVec pads;
  double value = 0;
  if (n.opset < 11) {
    pads = to_symint_vec(n.get_ints("pads"));
    value = n.get_float("value", 0.0);
  } else {
    pads = read_ints(need(n, in, 1), "Pad pads");
    if (const Value* v = opt(in, 2)) value = read_floats(*v, "Pad constant_value").at(0);
  }
  int64_t r = x.dim();
  if (const Value* a = n.opset >= 18 ? opt(in, 3) : nullptr) {
    // Opset 18's axes input: pads holds [begin per axis..., end per axis...] for the listed axes only.
    SymIntVec axes = read_ints(*a, "Pad axes");
    const size_t k = axes.size();
    if (pads.size() != 2 * k)
      throw ValueError(fmt::format("Pad: {} pads for {} axes (need 2 per axis)", pads.size(), k));
    SymIntVec all(static_cast<size_t>(2 * r), SymInt(0));
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (size_t i = 0; i < k; ++i) {
      int64_t d = axes[i].guard_int();
      if (d < -r || d >= r) throw ValueError(fmt::format("Pad axis {} is out of range for a rank-{} input", d, r));
      if (d < 0) d += r;
      if (seen[static_cast<size_t>(d)]) throw ValueError(fmt::format("Pad axes name dim {} twice", d));
      seen[static_cast<size_t>(d)] = true;
      all[static_cast<size_t>(d)] = pads[i];
      all[static_cast<size_t>(d + r)] = pads[i + k];
    }
    pads = std::move(all);
  }
  if (static_cast<int64_t>(pads.size()) != 2 * r)
    throw ValueError(fmt::format("Pad: {} pads for a rank-{} input (need 2 per dim)", pads.size(), r));
  if (mode == "wrap") {
    // Opset 19's wrap, in ONNX Runtime's order: negative pads crop first, then output index i of the
    // cropped dim of size L reads (i - begin) mod L, so pads longer than the dim wrap around again; one
    // narrow and one index_select per padded dim.
    for (int64_t d = 0; d < r; ++d) {
      int64_t bi, ei;
      if (pads[d].maybe_as_int(bi) && pads[d + r].maybe_as_int(ei) && bi == 0 && ei == 0) continue;
      SymInt L = x.size(d), b = pads[d], e = pads[d + r];
      SymInt keep_from = static_cast<bool>(b < 0) ? SymInt(0) - b : SymInt(0);
      SymInt keep_to = static_cast<bool>(e < 0) ? L + e : L;
      if (static_cast<bool>(keep_to <= keep_from))
        throw ShapeError(fmt::format("Pad mode 'wrap': pads {} and {} crop all of dim {} (size {})", b.str(), e.str(), d,
                                     L.str()));
      if (static_cast<bool>(keep_from > 0) || static_cast<bool>(keep_to < L)) {
        x = narrow(x, d, keep_from, keep_to - keep_from);
        L = keep_to - keep_from;
      }
      SymInt lo = static_cast<bool>(b < 0) ? SymInt(0) : SymInt(0) - b;
      SymInt hi = static_cast<bool>(e < 0) ? L : L + e;
      Tensor i = arange(lo, hi, 1, DType::F64);
      Tensor len = reshape(arange(L, L + 1, 1, DType::F64), {});
      Tensor idx = sub(i, mul(len, floor(div(i, len))));
      x = index_select(x, d, cast(idx, DType::I64));
    }
    return one(x);
  }
  // ONNX order [b0, b1, ..., e0, e1, ...] → PyTorch order (last dim first) down to the first padded dim.
  int64_t lowest = r;
  for (int64_t d = 0; d < r; ++d) {
    int64_t b, e;
    bool zero = pads[d].maybe_as_int(b) && pads[d + r].maybe_as_int(e) && b == 0 && e == 0;
    if (!zero) {
      lowest = d;
      break;
    }
  }
  if (lowest == r) return one(x);
  SymIntVec tp;
  for (int64_t d = r - 1; d >= lowest; --d) {
    tp.push_back(pads[d]);
    tp.push_back(pads[d + r]);
  }
  if (mode == "edge") mode = "replicate";
  return one(pad(x, tp, mode, value));
}

/// Resize mode 'linear' on [N, C, H, W] as upsample_bilinear2d: half_pixel / pytorch_half_pixel map to
/// align_corners = false and align_corners to true. With `scales` that is exact only when the output
/// size is the input size times the scale (ONNX then uses the given scale, PyTorch out / in), so other
/// scales are refused.
Tensor resize_linear(const Node& n, const Tensor& x, const Value* scales, const Value* sizes, const std::string& ctm) {
  SymIntVec out;
  if (sizes) {
    SymIntVec s = read_ints(*sizes, "Resize sizes");
    if (s.size() != 4) throw ValueError("Resize sizes must have 4 entries");
    if (static_cast<bool>(s[0] != x.size(0)) || static_cast<bool>(s[1] != x.size(1)))
      throw NotImplementedError("Resize of the batch or channel dim");
    out = {s[2], s[3]};  // with sizes ONNX's scale is out / in, as PyTorch's
  } else {
    if (!scales) throw ValueError("Resize needs scales or sizes");
    std::vector<double> sc = read_floats(*scales, "Resize scales");
    if (sc.size() != 4) throw ValueError("Resize scales must have 4 entries");
    if (sc[0] != 1.0 || sc[1] != 1.0) throw NotImplementedError("Resize of the batch or channel dim");
    for (int i = 2; i < 4; ++i) {
      int64_t in_sz = x.size(i).guard_int();
      double o = in_sz * sc[i];
      if (std::abs(o - std::round(o)) > 1e-6 || o < 1)
        throw NotImplementedError(fmt::format("Resize linear with scale {} on size {} (the output size must be the "
                                              "input size times the scale)", sc[i], in_sz));
      out.emplace_back(static_cast<int64_t>(std::llround(o)));
    }
  }
  if (ctm == "pytorch_half_pixel")
    for (const auto& o : out)
      if (static_cast<bool>(o == 1)) throw NotImplementedError("Resize pytorch_half_pixel to a size of 1");
  return upsample_bilinear2d(x, out, ctm == "align_corners");
}

/// Resize in every mode as separable 1-D interpolations, one axis at a time, as ONNX's reference
/// defines them: for output index j the source coordinate x = transform(j) (coordinate_transformation_mode),
/// then nearest (1 tap, nearest_mode), linear (2 taps) or cubic (4 taps, cubic_coeff_a, exclude_outside)
/// with edge replication outside [0, in - 1]; tf_crop_and_resize maps through the roi and writes
/// extrapolation_value where x falls outside the input. The taps' indices and weights are computed on
/// the host (f64) for the concrete sizes (a symbolic size is specialized), so each axis is
/// `sum_k index_select(x, axis, idx_k) * w_k`.
struct ResizeSpec {
  std::string mode, ctm, nearest_mode;
  double cubic_a = -0.75, extrapolation = 0.0;
  bool exclude_outside = false;
};

/// `out` is the output length the transform sees: the output size with `sizes`, in * scale (not
/// floored) with `scales`, as ONNX's reference.
double resize_coordinate(const ResizeSpec& p, int64_t j, int64_t in, double out, double scale, double r0, double r1) {
  double x = static_cast<double>(j);
  const std::string& m = p.ctm;
  if (m == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (m == "half_pixel_symmetric") {
    double adj = out / (scale * static_cast<double>(in));
    double offset = static_cast<double>(in) / 2.0 * (1.0 - adj);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (m == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (m == "align_corners") return out == 1 ? 0.0 : x * static_cast<double>(in - 1) / (out - 1);
  if (m == "asymmetric") return x / scale;
  if (m == "tf_half_pixel_for_nn") return (x + 0.5) / scale;
  if (m == "tf_crop_and_resize") {
    double span = static_cast<double>(in - 1);
    return out > 1 ? r0 * span + x * (r1 - r0) * span / (out - 1) : 0.5 * (r0 + r1) * span;
  }
  throw NotImplementedError(fmt::format("Resize coordinate_transformation_mode '{}'", m));
}

Tensor resize_axis(const ResizeSpec& p, const Tensor& x, int64_t axis, int64_t out, double out_len, double scale,
                   double r0, double r1) {
  int64_t in = x.size(axis).guard_int();
  int64_t taps = p.mode == "nearest" ? 1 : p.mode == "linear" ? 2 : 4;
  std::vector<IntVec> idx(static_cast<size_t>(taps), IntVec(static_cast<size_t>(out)));
  std::vector<std::vector<double>> w(static_cast<size_t>(taps), std::vector<double>(static_cast<size_t>(out)));
  std::vector<bool> inside(static_cast<size_t>(out), true);
  bool any_outside = false;
  auto clampi = [&](int64_t i) { return std::clamp<int64_t>(i, 0, in - 1); };
  for (int64_t j = 0; j < out; ++j) {
    auto ju = static_cast<size_t>(j);
    double xo = resize_coordinate(p, j, in, out_len, scale, r0, r1);
    if (p.ctm == "tf_crop_and_resize" && (xo < 0 || xo > static_cast<double>(in - 1))) {
      inside[ju] = false;
      any_outside = true;
    }
    double fl = std::floor(xo);
    auto base = static_cast<int64_t>(fl);
    double r = xo - fl;
    if (taps == 1) {
      bool up;
      if (r == 0) up = false;
      else if (p.nearest_mode == "round_prefer_floor") up = r > 0.5;
      else if (p.nearest_mode == "round_prefer_ceil") up = r >= 0.5;
      else if (p.nearest_mode == "floor") up = false;
      else if (p.nearest_mode == "ceil") up = true;
      else throw NotImplementedError(fmt::format("Resize nearest_mode '{}'", p.nearest_mode));
      idx[0][ju] = clampi(base + (up ? 1 : 0));
      w[0][ju] = 1.0;
      continue;
    }
    std::vector<double> c;
    int64_t first;
    if (taps == 2) {
      c = {1.0 - r, r};
      first = base;
    } else {
      double A = p.cubic_a, s = 1.0 - r;
      c = {((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A, ((A + 2) * r - (A + 3)) * r * r + 1,
           ((A + 2) * s - (A + 3)) * s * s + 1, ((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A};
      first = base - 1;
    }
    if (p.exclude_outside) {
      double total = 0;
      for (int64_t k = 0; k < taps; ++k) {
        int64_t i = first + k;
        if (i < 0 || i >= in) c[static_cast<size_t>(k)] = 0;
        total += c[static_cast<size_t>(k)];
      }
      if (total == 0) throw ValueError("Resize with exclude_outside: every tap of a sample lies outside the input");
      for (double& v : c) v /= total;
    }
    for (int64_t k = 0; k < taps; ++k) {
      idx[static_cast<size_t>(k)][ju] = clampi(first + k);
      w[static_cast<size_t>(k)][ju] = c[static_cast<size_t>(k)];
    }
  }
  SymIntVec wshape(static_cast<size_t>(x.dim()), SymInt(1));
  wshape[static_cast<size_t>(axis)] = SymInt(out);
  Tensor y;
  for (int64_t k = 0; k < taps; ++k) {
    Tensor g = index_select(x, axis, tensor<int64_t>(idx[static_cast<size_t>(k)], {out}));
    if (taps == 1) {
      y = g;
      break;
    }
    Tensor wk = reshape(cast(tensor<double>(w[static_cast<size_t>(k)], {out}), x.dtype()), wshape);
    y = k == 0 ? mul(g, wk) : add(y, mul(g, wk));
  }
  if (any_outside) {
    Tensor keep = reshape(tensor<bool>(inside, {out}), wshape);
    y = where(keep, y, scalar_tensor(p.extrapolation, x.dtype()));
  }
  return y;
}

Tensor resize_general(const Node& n, const Tensor& x, const Value* roi, const Value* scales, const Value* sizes,
                      const std::string& ctm) {
  ResizeSpec p;
  p.mode = n.get_string("mode", "nearest");
  p.ctm = ctm;
  p.nearest_mode = n.opset < 11 ? "floor" : n.get_string("nearest_mode", "round_prefer_floor");
  p.cubic_a = n.get_float("cubic_coeff_a", -0.75);
  p.exclude_outside = n.get_int("exclude_outside", 0) != 0;
  p.extrapolation = n.get_float("extrapolation_value", 0.0);
  if (p.mode != "nearest" && !is_floating(x.dtype()))
    throw NotImplementedError(fmt::format("Resize mode '{}' on {} data (floating point only)", p.mode,
                                          short_name(x.dtype())));
  int64_t r = x.dim();
  std::vector<double> sc(static_cast<size_t>(r), 1.0), r0(static_cast<size_t>(r), 0.0), r1(static_cast<size_t>(r), 1.0);
  IntVec out(static_cast<size_t>(r));
  std::vector<double> out_len(static_cast<size_t>(r));
  if (ctm == "tf_crop_and_resize") {
    if (!roi) throw ValueError("Resize tf_crop_and_resize needs the roi input");
    std::vector<double> rv = read_floats(*roi, "Resize roi");
    if (static_cast<int64_t>(rv.size()) != 2 * r)
      throw ValueError(fmt::format("Resize roi has {} entries for a rank-{} input (need {})", rv.size(), r, 2 * r));
    for (int64_t d = 0; d < r; ++d) {
      r0[static_cast<size_t>(d)] = rv[static_cast<size_t>(d)];
      r1[static_cast<size_t>(d)] = rv[static_cast<size_t>(d + r)];
    }
  }
  if (sizes) {
    IntVec s = read_concrete_ints(*sizes, "Resize sizes");
    if (static_cast<int64_t>(s.size()) != r)
      throw ValueError(fmt::format("Resize sizes has {} entries for a rank-{} input", s.size(), r));
    for (int64_t d = 0; d < r; ++d) {
      int64_t in_sz = x.size(d).guard_int();
      if (s[static_cast<size_t>(d)] < 0) throw ValueError("Resize sizes must be >= 0");
      out[static_cast<size_t>(d)] = s[static_cast<size_t>(d)];
      out_len[static_cast<size_t>(d)] = static_cast<double>(s[static_cast<size_t>(d)]);
      sc[static_cast<size_t>(d)] = in_sz == 0 ? 1.0 : static_cast<double>(s[static_cast<size_t>(d)]) / static_cast<double>(in_sz);
    }
  } else {
    if (!scales) throw ValueError("Resize needs scales or sizes");
    std::vector<double> sv = read_floats(*scales, "Resize scales");
    if (static_cast<int64_t>(sv.size()) != r)
      throw ValueError(fmt::format("Resize scales has {} entries for a rank-{} input", sv.size(), r));
    for (int64_t d = 0; d < r; ++d) {
      double s = sv[static_cast<size_t>(d)];
      if (!(s > 0)) throw ValueError(fmt::format("Resize scale {} must be > 0", s));
      double o = static_cast<double>(x.size(d).guard_int()) * s;
      if (ctm == "tf_crop_and_resize") o *= r1[static_cast<size_t>(d)] - r0[static_cast<size_t>(d)];
      out[static_cast<size_t>(d)] = static_cast<int64_t>(std::floor(o + 1e-9));
      out_len[static_cast<size_t>(d)] = o;
      sc[static_cast<size_t>(d)] = s;
    }
  }
  Tensor y = x;
  for (int64_t d = 0; d < r; ++d) {
    auto du = static_cast<size_t>(d);
    bool identity = out[du] == x.size(d).guard_int() && sc[du] == 1.0 && r0[du] == 0.0 && r1[du] == 1.0;
    if (identity && ctm != "tf_half_pixel_for_nn") continue;
    y = resize_axis(p, y, d, out[du], out_len[du], sc[du], r0[du], r1[du]);
  }
  return y;
}

std::vector<Value> op_resize(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  std::string ctm = n.get_string("coordinate_transformation_mode", n.opset < 11 ? "asymmetric" : "half_pixel");
  const Value* roi = n.opset < 11 ? nullptr : opt(in, 1);
  const Value* scales = opt(in, n.opset < 11 ? 1 : 2);
  const Value* sizes = n.opset < 11 ? nullptr : opt(in, 3);
  auto empty_value = [](const Value* v) {
    return v && (v->is_host() ? v->host_size() == 0 : v->t.numel().hint() == 0);
  };
  if (empty_value(sizes)) sizes = nullptr;
  if (empty_value(scales)) scales = nullptr;
  if (empty_value(roi)) roi = nullptr;
  std::string mode = n.get_string("mode", "nearest");
  // The fast paths: PyTorch's upsample ops on [N, C, H, W] where they are exactly ONNX's definition.
  try {
    if (x.dim() == 4 && mode == "linear" &&
        (ctm == "half_pixel" || ctm == "pytorch_half_pixel" || ctm == "align_corners"))
      return one(resize_linear(n, x, scales, sizes, ctm));
    if (x.dim() == 4 && mode == "nearest") {
      std::string nm = n.opset < 11 ? "floor" : n.get_string("nearest_mode", "round_prefer_floor");
      if (sizes && ctm == "asymmetric" && nm == "floor") {
        SymIntVec s = read_ints(*sizes, "Resize sizes");
        if (s.size() == 4 && !static_cast<bool>(s[0] != x.size(0)) && !static_cast<bool>(s[1] != x.size(1)))
          return one(upsample_nearest2d(x, {s[2], s[3]}));
      }
      if (!sizes && scales) {
        std::vector<double> sc = read_floats(*scales, "Resize scales");
        bool ok = sc.size() == 4 && sc[0] == 1.0 && sc[1] == 1.0;
        bool fast_ctm = (ctm == "asymmetric" && nm == "floor") ||
                        ((ctm == "half_pixel" || ctm == "pytorch_half_pixel") &&
                         (nm == "round_prefer_floor" || nm == "round_prefer_ceil"));
        for (size_t i = 2; ok && i < 4; ++i) ok = sc[i] >= 1 && std::abs(sc[i] - std::round(sc[i])) <= 1e-6;
        if (ok && fast_ctm)
          return one(upsample_nearest2d(x, {x.size(2) * static_cast<int64_t>(std::llround(sc[2])),
                                            x.size(3) * static_cast<int64_t>(std::llround(sc[3]))}));
      }
    }
  } catch (const NotImplementedError&) {
    // Outside the fast path's exact cases: the general interpolation below.
  }
  return one(resize_general(n, x, roi, scales, sizes, ctm));
}

/// LSTM through the lstm op; layout=1 (batch-first: X [N, T, I], states [N, D, H], Y [N, T, D, H]) is
/// permuted to layout 0 around it; P (input 7) is the peephole weights.
std::vector<Value> op_lstm(const Node& n, const Inputs& in) {
  const bool batch_first = n.get_int("layout", 0) == 1;
  Tensor X = tin(n, in, 0), W = tin(n, in, 1), R = tin(n, in, 2), B = topt(in, 3);
  if (batch_first) X = permute(X, {1, 0, 2});
  if (const Value* sl = opt(in, 4)) {
    // Only the trivial case: every sequence is full length.
    int64_t T = X.size(0).guard_int();
    for (int64_t v : read_concrete_ints(*sl, "LSTM sequence_lens"))
      if (v != T) throw NotImplementedError("LSTM with sequence_lens shorter than the sequence");
  }
  Tensor h0 = topt(in, 5), c0 = topt(in, 6), P = topt(in, 7);
  if (batch_first) {
    if (h0.defined()) h0 = permute(h0, {1, 0, 2});
    if (c0.defined()) c0 = permute(c0, {1, 0, 2});
  }
  auto [Y, Yh, Yc] = lstm(X, W, R, B, h0, c0, n.get_string("direction", "forward"), P);
  if (batch_first)
    return {Value::tensor(permute(Y, {2, 0, 1, 3})), Value::tensor(permute(Yh, {1, 0, 2})),
            Value::tensor(permute(Yc, {1, 0, 2}))};
  return {Value::tensor(Y), Value::tensor(Yh), Value::tensor(Yc)};
}

// ---- more elementwise ops ------------------------------------------------------------------------------------
/// A SymInt as an i64 rank-0 tensor (traceable when symbolic).
Tensor sym_scalar(const SymInt& s) { return as_tensor(Value::host_ints({s}, DType::I64, true)); }
/// Negative indices (ONNX: counted from the end of a dim of size d) made non-negative.
Tensor wrap_negative(Tensor idx, const SymInt& d) {
  if (idx.dtype() != DType::I64) idx = cast(idx, DType::I64);
  return where(lt(idx, scalar_tensor(0, DType::I64)), add(idx, sym_scalar(d)), idx);
}
/// One component of a GatherND / ScatterND index tuple, negative ones counted from the end of `d`; a
/// component outside [-d, d) becomes `past` (at least the flattened dim's size), so the linear index it
/// adds to is out of range and the gather or scatter fails on it. Checking only the linear index let
/// (0, 5) on a [2, 4] tensor read element (1, 1).
Tensor checked_component(const Tensor& idx, const SymInt& d, const SymInt& past) {
  Tensor c = wrap_negative(idx, d);
  Tensor ok = logical_and(ge(c, scalar_tensor(0, DType::I64)), lt(c, sym_scalar(d)));
  return where(ok, c, sym_scalar(past));
}
/// x reversed along `dim` (a copy; the dim size is specialized).
Tensor flip(const Tensor& x, int64_t dim) {
  int64_t d = x.size(dim).guard_int();
  if (d <= 1) return x;
  IntVec idx;
  for (int64_t i = d - 1; i >= 0; --i) idx.push_back(i);
  return index_select(x, dim, tensor<int64_t>(idx, {d}));
}
/// Integer inputs computed in f64 (exact below 2^53), the result cast back to the input's dtype.
Tensor as_f64_if_int(const Tensor& x) { return is_floating(x.dtype()) ? x : cast(x, DType::F64); }
Tensor like_dtype(const Tensor& y, DType dt) { return y.dtype() == dt ? y : cast(y, dt); }

std::vector<Value> compare_op(const Node& n, const Inputs& in, Tensor (*f)(const Tensor&, const Tensor&)) {
  check_one_type(n, in, {0, 1});
  return one(f(tin(n, in, 0), tin(n, in, 1)));
}
std::vector<Value> op_less(const Node& n, const Inputs& in) { return compare_op(n, in, lt); }
std::vector<Value> op_less_equal(const Node& n, const Inputs& in) { return compare_op(n, in, le); }
std::vector<Value> op_greater(const Node& n, const Inputs& in) { return compare_op(n, in, gt); }
std::vector<Value> op_greater_equal(const Node& n, const Inputs& in) { return compare_op(n, in, ge); }
std::vector<Value> op_and(const Node& n, const Inputs& in) { return compare_op(n, in, logical_and); }
std::vector<Value> op_or(const Node& n, const Inputs& in) { return compare_op(n, in, logical_or); }
std::vector<Value> op_xor(const Node& n, const Inputs& in) {
  return one(ne(cast(tin(n, in, 0), DType::Bool), cast(tin(n, in, 1), DType::Bool)));
}
std::vector<Value> op_where(const Node& n, const Inputs& in) {
  check_one_type(n, in, {1, 2});
  Tensor c = tin(n, in, 0), a = tin(n, in, 1), b = tin(n, in, 2);
  if (c.dtype() != DType::Bool) c = cast(c, DType::Bool);
  return one(where(c, a, b));
}
std::vector<Value> op_cast_like(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(like_dtype(x, tin(n, in, 1).dtype()));
}
std::vector<Value> op_sign(const Node& n, const Inputs& in) { return one(sign(tin(n, in, 0))); }
std::vector<Value> op_round(const Node& n, const Inputs& in) { return one(round(tin(n, in, 0))); }
std::vector<Value> op_isnan(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(ne(x, x));
}
std::vector<Value> op_isinf(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  bool neg_inf = n.get_int("detect_negative", 1) != 0, pos_inf = n.get_int("detect_positive", 1) != 0;
  Tensor pos = eq(x, wrap_scalar(INFINITY, x)), negv = eq(x, wrap_scalar(-INFINITY, x));
  if (neg_inf && pos_inf) return one(logical_or(pos, negv));
  if (pos_inf) return one(pos);
  if (neg_inf) return one(negv);
  return one(logical_and(pos, negv));  // all false
}
std::vector<Value> op_tan(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(div(sin(x), cos(x)));
}
std::vector<Value> op_sinh(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(mul(sub(exp(x), exp(neg(x))), 0.5));
}
std::vector<Value> op_cosh(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(mul(add(exp(x), exp(neg(x))), 0.5));
}
std::vector<Value> op_asinh(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(log(add(x, sqrt(add(mul(x, x), 1.0)))));
}
std::vector<Value> op_acosh(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(log(add(x, sqrt(sub(mul(x, x), 1.0)))));
}
std::vector<Value> op_atanh(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(mul(log(div(add(x, 1.0), sub(wrap_scalar(1.0, x), x))), 0.5));
}
/// atan by argument reduction and a series: |x| > 1 uses pi/2 - atan(1/|x|); above tan(pi/12),
/// atan(a) = pi/6 + atan((a*sqrt(3) - 1) / (sqrt(3) + a)); the reduced argument (|t| <= 0.268) goes
/// through the Taylor series to z^14 (z = t^2), below f64's rounding. Half types compute in f32.
Tensor atan_of(const Tensor& x0) {
  DType dt = x0.dtype();
  if (!is_floating(dt)) throw TypeError(fmt::format("atan of {} (floating point only)", short_name(dt)));
  Tensor x = dt == DType::F16 || dt == DType::BF16 ? cast(x0, DType::F32) : x0;
  const double kSqrt3 = std::sqrt(3.0), kTan15 = 2.0 - kSqrt3;
  Tensor a = abs(x);
  Tensor big = gt(a, wrap_scalar(1.0, a));
  a = where(big, div(wrap_scalar(1.0, a), a), a);
  Tensor mid = gt(a, wrap_scalar(kTan15, a));
  Tensor t = where(mid, div(sub(mul(a, kSqrt3), 1.0), add(a, kSqrt3)), a);
  Tensor z = mul(t, t);
  Tensor p = wrap_scalar(1.0 / 29.0, z);
  for (int k = 13; k >= 0; --k) p = add(mul(p, z), (k % 2 == 0 ? 1.0 : -1.0) / (2.0 * k + 1.0));
  // The series alternates: p = sum (-1)^k z^k / (2k+1), built by Horner from the top term (+z^14/29).
  Tensor r = mul(t, p);
  r = where(mid, add(r, M_PI / 6), r);
  r = where(big, sub(wrap_scalar(M_PI / 2, r), r), r);
  r = mul(sign(x), r);
  return r.dtype() == dt ? r : cast(r, dt);
}
std::vector<Value> op_atan(const Node& n, const Inputs& in) { return one(atan_of(tin(n, in, 0))); }
/// asin(x) = atan(x / sqrt((1 - x)(1 + x))); acos(x) = 2 atan(sqrt((1 - x) / (1 + x))).
std::vector<Value> op_asin(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(atan_of(div(x, sqrt(mul(sub(wrap_scalar(1.0, x), x), add(x, 1.0))))));
}
std::vector<Value> op_acos(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(mul(atan_of(sqrt(div(sub(wrap_scalar(1.0, x), x), add(x, 1.0)))), 2.0));
}
std::vector<Value> op_leaky_relu(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(where(lt(x, wrap_scalar(0, x)), mul(x, n.get_float("alpha", 0.01)), x));
}
std::vector<Value> op_prelu(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), slope = tin(n, in, 1);
  // Before opset 7 a 1-D slope of C elements is per channel (dim 1); the version converter keeps it.
  if (n.source_opset < 7 && slope.dim() == 1 && x.dim() > 2 && static_cast<bool>(slope.size(0) == x.size(1)) &&
      static_cast<bool>(slope.size(0) != 1)) {
    SymIntVec shape{slope.size(0)};
    for (int64_t i = 2; i < x.dim(); ++i) shape.push_back(1);
    slope = reshape(slope, shape);
  }
  return one(where(lt(x, wrap_scalar(0, x)), like_dtype(mul(x, slope), x.dtype()), x));
}
Tensor elu_of(const Tensor& x, double alpha) {
  return where(lt(x, wrap_scalar(0, x)), mul(sub(exp(x), 1.0), alpha), x);
}
std::vector<Value> op_elu(const Node& n, const Inputs& in) { return one(elu_of(tin(n, in, 0), n.get_float("alpha", 1.0))); }
std::vector<Value> op_selu(const Node& n, const Inputs& in) {
  double alpha = n.get_float("alpha", 1.67326319217681884765625), gamma = n.get_float("gamma", 1.05070102214813232421875);
  return one(mul(elu_of(tin(n, in, 0), alpha), gamma));
}
std::vector<Value> op_celu(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  double alpha = n.get_float("alpha", 1.0);
  Tensor zero = wrap_scalar(0, x);
  return one(add(maximum(x, zero), minimum(zero, mul(sub(exp(div(x, alpha)), 1.0), alpha))));
}
/// log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|).
Tensor softplus_of(const Tensor& x) { return add(relu(x), log(add(exp(neg(abs(x))), 1.0))); }
std::vector<Value> op_softplus(const Node& n, const Inputs& in) { return one(softplus_of(tin(n, in, 0))); }
std::vector<Value> op_softsign(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(div(x, add(abs(x), 1.0)));
}
std::vector<Value> op_mish(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(mul(x, tanh(softplus_of(x))));
}
std::vector<Value> op_gelu(const Node& n, const Inputs& in) {
  return one(gelu(tin(n, in, 0), n.get_string("approximate", "none")));
}
std::vector<Value> op_thresholded_relu(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  return one(where(gt(x, wrap_scalar(n.get_float("alpha", 1.0), x)), x, wrap_scalar(0, x)));
}
std::vector<Value> op_shrink(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  double bias = n.get_float("bias", 0.0), lambd = n.get_float("lambd", 0.5);
  DType dt = x.dtype();
  Tensor lo = like_dtype(add(x, bias), dt), hi = like_dtype(sub(x, bias), dt);
  return one(where(lt(x, wrap_scalar(-lambd, x)), lo, where(gt(x, wrap_scalar(lambd, x)), hi, wrap_scalar(0, x))));
}
std::vector<Value> op_mod(const Node& n, const Inputs& in) {
  check_one_type(n, in, {0, 1});
  Tensor a = tin(n, in, 0), b = tin(n, in, 1);
  bool fmod = n.get_int("fmod", 0) != 0;
  if (is_floating(a.dtype()) && !fmod) throw ValueError("Mod of floating-point inputs needs fmod=1 (as ONNX requires)");
  DType dt = a.dtype();
  // In f64 (exact for integers below 2^53): r = a - b * t with t = trunc(a / b) (fmod) or floor(a / b).
  Tensor fa = cast(a, DType::F64), fb = cast(b, DType::F64);
  Tensor q = div(fa, fb);
  Tensor t = fmod ? mul(sign(q), floor(abs(q))) : floor(q);
  Tensor r = sub(fa, mul(fb, t));
  if (!is_floating(dt)) r = where(eq(fb, wrap_scalar(0, fb)), wrap_scalar(0, fb), r);  // x mod 0: defined as 0 here
  return one(cast(r, dt));
}

// ---- variadic elementwise ------------------------------------------------------------------------------------
std::vector<Value> variadic(const Node& n, const Inputs& in, Tensor (*f)(const Tensor&, const Tensor&), bool mean_of) {
  for (size_t i = 1; i < in.size(); ++i) check_one_type(n, in, {0, i});
  TensorList xs;
  for (const Value* v : in)
    if (v) xs.push_back(as_tensor(*v));
  if (xs.empty()) throw ValueError(fmt::format("{} needs at least one input", n.op_type));
  Tensor acc = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) acc = f(acc, xs[i]);
  if (mean_of && xs.size() > 1) acc = div(acc, static_cast<double>(xs.size()));
  return one(like_dtype(acc, xs[0].dtype()));
}
std::vector<Value> op_max(const Node& n, const Inputs& in) { return variadic(n, in, maximum, false); }
std::vector<Value> op_min(const Node& n, const Inputs& in) { return variadic(n, in, minimum, false); }
std::vector<Value> op_sum(const Node& n, const Inputs& in) { return variadic(n, in, add, false); }
std::vector<Value> op_mean(const Node& n, const Inputs& in) { return variadic(n, in, add, true); }

// ---- reductions ------------------------------------------------------------------------------------------------
enum class Red { Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare };

std::vector<Value> reduce(const Node& n, const Inputs& in, Red r) {
  Tensor x = tin(n, in, 0);
  IntVec axes = axes_of(n, in, r == Red::Sum ? 13 : 18, 1);
  bool keep = n.get_int("keepdims", 1) != 0;
  if (axes.empty() && n.get_int("noop_with_empty_axes", 0)) return one(x);
  for (auto& a : axes) a = norm_axis(a, std::max<int64_t>(x.dim(), 1), "reduction axis");
  std::sort(axes.begin(), axes.end());
  axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
  if (x.dim() == 0) axes.clear();
  DType dt = x.dtype();
  Tensor y;
  switch (r) {
    case Red::Sum: y = sum(x, axes, keep); break;
    case Red::Mean: y = mean(as_f64_if_int(x), axes, keep); break;
    case Red::Max: y = amax(x, axes, keep); break;
    case Red::Min: y = amin(x, axes, keep); break;
    case Red::Prod: y = prod(x, axes, keep); break;
    case Red::L1: y = sum(abs(x), axes, keep); break;
    case Red::L2: {
      Tensor xf = as_f64_if_int(x);
      y = sqrt(sum(mul(xf, xf), axes, keep));
      break;
    }
    case Red::LogSum: y = log(sum(as_f64_if_int(x), axes, keep)); break;
    case Red::LogSumExp: {
      // Stable: m + log(sum(exp(x - m))) with m the (finite) max.
      Tensor xf = as_f64_if_int(x);
      Tensor m = amax(xf, axes, true);
      m = where(lt(abs(m), wrap_scalar(INFINITY, m)), m, wrap_scalar(0, m));
      y = log(sum(exp(sub(xf, m)), axes, true));
      y = add(y, m);
      if (!keep) y = axes.empty() ? reshape(y, {}) : squeeze(y, axes);
      break;
    }
    case Red::SumSquare: y = sum(mul(x, x), axes, keep); break;
  }
  return one(like_dtype(y, dt));
}
std::vector<Value> op_reduce_sum(const Node& n, const Inputs& in) { return reduce(n, in, Red::Sum); }
std::vector<Value> op_reduce_max(const Node& n, const Inputs& in) { return reduce(n, in, Red::Max); }
std::vector<Value> op_reduce_min(const Node& n, const Inputs& in) { return reduce(n, in, Red::Min); }
std::vector<Value> op_reduce_prod(const Node& n, const Inputs& in) { return reduce(n, in, Red::Prod); }
std::vector<Value> op_reduce_l1(const Node& n, const Inputs& in) { return reduce(n, in, Red::L1); }
std::vector<Value> op_reduce_l2(const Node& n, const Inputs& in) { return reduce(n, in, Red::L2); }
std::vector<Value> op_reduce_log_sum(const Node& n, const Inputs& in) { return reduce(n, in, Red::LogSum); }
std::vector<Value> op_reduce_log_sum_exp(const Node& n, const Inputs& in) { return reduce(n, in, Red::LogSumExp); }
std::vector<Value> op_reduce_sum_square(const Node& n, const Inputs& in) { return reduce(n, in, Red::SumSquare); }

std::vector<Value> arg_reduce(const Node& n, const Inputs& in, bool is_min) {
  Tensor x = tin(n, in, 0);
  if (x.dim() == 0) throw ValueError(fmt::format("{} of a rank-0 tensor", n.op_type));
  int64_t axis = norm_axis(n.get_int("axis", 0), x.dim(), "axis");
  bool keep = n.get_int("keepdims", 1) != 0, last = n.get_int("select_last_index", 0) != 0;
  Tensor v = x;
  if (is_min) v = neg(is_floating(x.dtype()) ? x : cast(x, DType::F64));  // neg of unsigned/bool would wrap
  if (last) v = flip(v, axis);
  Tensor idx = argmax(v, axis, keep);
  if (last) idx = sub(sub(sym_scalar(x.size(axis)), scalar_tensor(1, DType::I64)), idx);
  return one(idx);
}
std::vector<Value> op_argmax(const Node& n, const Inputs& in) { return arg_reduce(n, in, false); }
std::vector<Value> op_argmin(const Node& n, const Inputs& in) { return arg_reduce(n, in, true); }

/// [1, .., d, .., 1] iota along `axis` of a rank-`rank` shape.
Tensor iota_along(const SymInt& d, int64_t axis, int64_t rank) {
  SymIntVec shape(static_cast<size_t>(rank), SymInt(1));
  shape[static_cast<size_t>(axis)] = d;
  return reshape(arange(0, d, 1, DType::I64), shape);
}

std::vector<Value> op_hardmax(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t r = x.dim();
  int64_t axis = norm_axis(n.get_int("axis", n.opset < 13 ? 1 : -1), std::max<int64_t>(r, 1), "Hardmax axis");
  auto f = [](const Tensor& t, int64_t d) {
    Tensor idx = argmax(t, d, true);
    return cast(eq(iota_along(t.size(d), d, t.dim()), idx), t.dtype());
  };
  if (n.opset >= 13 || axis == r - 1) return one(f(x, axis));
  SymInt outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer = outer * x.size(i);
  return one(reshape(f(reshape(x, {outer, -1}), 1), x.sizes()));
}

std::vector<Value> op_cumsum(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t axis = norm_axis(read_concrete_ints(need(n, in, 1), "CumSum axis").at(0), std::max<int64_t>(x.dim(), 1),
                           "CumSum axis");
  bool exclusive = n.get_int("exclusive", 0) != 0, reverse = n.get_int("reverse", 0) != 0;
  Tensor v = reverse ? flip(x, axis) : x;
  Tensor y = like_dtype(cumsum(v, axis), x.dtype());
  if (exclusive) {
    SymIntVec zshape = y.sizes();
    zshape[static_cast<size_t>(axis)] = 1;
    y = cat({full(zshape, 0.0, y.dtype()), slice(y, axis, 0, -1)}, axis);
  }
  return one(reverse ? flip(y, axis) : y);
}

// ---- normalization -------------------------------------------------------------------------------------------
std::vector<Value> op_layer_norm(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = topt(in, 1), bias = topt(in, 2);
  int64_t r = x.dim();
  int64_t axis = norm_axis(n.get_int("axis", -1), r, "LayerNormalization axis");
  double eps = n.get_float("epsilon", 1e-5);
  bool stash_f32 = n.get_int("stash_type", 1) == 1;
  DType dt = x.dtype();
  Tensor xc = (stash_f32 && dt != DType::F32 && dt != DType::F64) ? cast(x, DType::F32) : x;
  SymIntVec ns;  // sizes stay symbolic: layer_norm takes SymInts
  IntVec axes;
  for (int64_t d = axis; d < r; ++d) {
    ns.push_back(x.size(d));
    axes.push_back(d);
  }
  auto matches = [&](const Tensor& t) {
    if (!t.defined()) return true;
    if (t.dim() != static_cast<int64_t>(ns.size())) return false;
    for (size_t i = 0; i < ns.size(); ++i)
      if (static_cast<bool>(t.size(static_cast<int64_t>(i)) != ns[i])) return false;
    return true;
  };
  Tensor sc = scale.defined() ? like_dtype(scale, xc.dtype()) : Tensor();
  Tensor bi = bias.defined() ? like_dtype(bias, xc.dtype()) : Tensor();
  Tensor y;
  if (matches(sc) && matches(bi)) {
    y = layer_norm(xc, ns, sc, bi, eps);
  } else {  // scale/bias broadcast to the normalized shape
    y = layer_norm(xc, ns, Tensor(), Tensor(), eps);
    if (sc.defined()) y = mul(y, sc);
    if (bi.defined()) y = add(y, bi);
  }
  std::vector<Value> outs{Value::tensor(like_dtype(y, dt))};
  bool want_stats = (n.outputs.size() > 1 && !n.outputs[1].empty()) || (n.outputs.size() > 2 && !n.outputs[2].empty());
  if (want_stats) {
    Tensor mu = mean(xc, axes, true);
    Tensor inv = rsqrt(add(var(xc, axes, true, 0), eps));
    DType st = stash_f32 ? DType::F32 : xc.dtype();
    outs.push_back(Value::tensor(like_dtype(mu, st)));
    outs.push_back(Value::tensor(like_dtype(inv, st)));
  }
  return outs;
}

std::vector<Value> op_instance_norm(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = tin(n, in, 1), bias = tin(n, in, 2);
  if (x.dim() < 3) throw ValueError(fmt::format("InstanceNormalization needs rank >= 3, got {}", to_string(x.sizes())));
  return one(group_norm(x, x.size(1).guard_int(), scale, bias, n.get_float("epsilon", 1e-5)));
}

/// GroupNormalization: opset 18 gives scale and bias per group (each applies to the group's C/G
/// channels), opset 21 per channel; statistics in f32 for f16/bf16 inputs (stash_type 1, the only one
/// accepted), as group_norm computes them.
std::vector<Value> op_group_norm(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = tin(n, in, 1), bias = tin(n, in, 2);
  if (x.dim() < 3) throw ValueError(fmt::format("GroupNormalization needs rank >= 3, got {}", to_string(x.sizes())));
  int64_t groups = n.get_int("num_groups", 0);
  int64_t c = x.size(1).guard_int();
  if (groups < 1 || c % groups != 0)
    throw ValueError(fmt::format("GroupNormalization: num_groups {} does not divide the {} channels", groups, c));
  int64_t per = n.opset < 21 ? groups : c;
  for (const Tensor* t : {&scale, &bias})
    if (t->dim() != 1 || t->size(0).guard_int() != per)
      throw ShapeError(fmt::format("GroupNormalization (opset {}): scale and bias must be [{}], got {}", n.opset, per,
                                   to_string(t->sizes())));
  if (per != c) {  // per group → per channel
    auto widen = [&](const Tensor& t) {
      return reshape(expand(reshape(t, {SymInt(groups), SymInt(1)}), {SymInt(groups), SymInt(c / groups)}), {SymInt(c)});
    };
    scale = widen(scale);
    bias = widen(bias);
  }
  return one(group_norm(x, groups, scale, bias, n.get_float("epsilon", 1e-5)));
}

std::string check_group_norm(const Node& n) {
  if (n.get_int("stash_type", 1) != 1) return fmt::format("stash_type {} (only 1, float32)", n.get_int("stash_type", 1));
  return "";
}

// ---- losses -------------------------------------------------------------------------------------------------
/// ONNX NegativeLogLikelihoodLoss on log-probabilities [N, C, d...] and targets [N, d...].
Tensor nll_loss(const Node& n, const Tensor& logp, const Tensor& target, const Tensor& weight) {
  std::string reduction = n.get_string("reduction", "mean");
  if (reduction != "none" && reduction != "sum" && reduction != "mean")
    throw ValueError(fmt::format("reduction '{}' (expected none, sum or mean)", reduction));
  if (logp.dim() < 2 || target.dim() != logp.dim() - 1)
    throw ShapeError(fmt::format("input {} and target {} do not fit [N, C, d...] and [N, d...]",
                                 to_string(logp.sizes()), to_string(target.sizes())));
  Tensor t = cast(target, DType::I64);
  bool has_ignore = n.attr("ignore_index") != nullptr;
  Tensor valid;
  if (has_ignore) {
    valid = ne(t, scalar_tensor(static_cast<double>(n.get_int("ignore_index", 0)), DType::I64));
    t = where(valid, t, scalar_tensor(0, DType::I64));
  }
  Tensor loss = neg(squeeze(gather(logp, 1, unsqueeze(t, 1)), {1}));
  Tensor wt;
  if (weight.defined()) {
    wt = reshape(index_select(weight, 0, reshape(t, {-1})), t.sizes());
    loss = mul(loss, wt);
  }
  if (has_ignore) {
    Tensor zero = wrap_scalar(0, loss);
    loss = where(valid, loss, zero);
    wt = wt.defined() ? where(valid, wt, zero) : cast(valid, loss.dtype());
  }
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  if (wt.defined()) return div(sum(loss), sum(wt));
  return mean(loss);
}
std::vector<Value> op_nll_loss(const Node& n, const Inputs& in) {
  return one(nll_loss(n, tin(n, in, 0), tin(n, in, 1), topt(in, 2)));
}
std::vector<Value> op_softmax_cross_entropy(const Node& n, const Inputs& in) {
  Tensor scores = tin(n, in, 0);
  if (scores.dim() < 2) throw ShapeError(fmt::format("scores {} must be [N, C, d...]", to_string(scores.sizes())));
  Tensor logp = log_softmax(scores, 1);
  return {Value::tensor(nll_loss(n, logp, tin(n, in, 1), topt(in, 2))), Value::tensor(logp)};
}

// ---- indexing ---------------------------------------------------------------------------------------------------
std::vector<Value> op_gather_elements(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), idx = tin(n, in, 1);
  int64_t axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(x.dim(), 1), "GatherElements axis");
  return one(gather(x, axis, wrap_negative(idx, x.size(axis))));
}

std::vector<Value> op_gather_nd(const Node& n, const Inputs& in) {
  Tensor data = tin(n, in, 0), idx = tin(n, in, 1);
  int64_t b = n.get_int("batch_dims", 0);
  if (idx.dim() < 1) throw ShapeError("GatherND indices must have rank >= 1");
  int64_t k = idx.size(-1).guard_int();
  if (b < 0 || b + k > data.dim() || b >= idx.dim())
    throw ShapeError(fmt::format("GatherND: indices {} (batch_dims {}) do not fit data {}", to_string(idx.sizes()), b,
                                 to_string(data.sizes())));
  // Flatten the batch dims and the K indexed dims of data into one dim; index it with a linear index.
  SymInt bsz = 1, ksz = 1;
  for (int64_t i = 0; i < b; ++i) bsz = bsz * data.size(i);
  SymIntVec strides(static_cast<size_t>(k));
  for (int64_t i = k - 1; i >= 0; --i) {
    strides[static_cast<size_t>(i)] = ksz;
    ksz = ksz * data.size(b + i);
  }
  SymIntVec flat_shape{bsz * ksz};
  SymIntVec rest;
  for (int64_t i = b + k; i < data.dim(); ++i) {
    flat_shape.push_back(data.size(i));
    rest.push_back(data.size(i));
  }
  Tensor flat = reshape(data, flat_shape);
  Tensor ind = cast(idx, DType::I64);
  Tensor lin = scalar_tensor(0, DType::I64);
  for (int64_t i = 0; i < k; ++i) {
    Tensor ci = checked_component(select(ind, ind.dim() - 1, i), data.size(b + i), bsz * ksz);
    lin = add(lin, mul(ci, sym_scalar(strides[static_cast<size_t>(i)])));
  }
  if (b > 0) {  // + batch index * ksz, the batch index broadcast over the index dims
    SymIntVec bshape{bsz};
    for (int64_t i = b; i < idx.dim() - 1; ++i) bshape.push_back(1);
    Tensor bi = mul(reshape(arange(0, bsz, 1, DType::I64), bshape), sym_scalar(ksz));
    SymIntVec lshape{bsz};
    for (int64_t i = b; i < idx.dim() - 1; ++i) lshape.push_back(idx.size(i));
    lin = add(reshape(lin, lshape), bi);
  }
  SymIntVec out_shape;
  for (int64_t i = 0; i < idx.dim() - 1; ++i) out_shape.push_back(idx.size(i));
  out_shape.insert(out_shape.end(), rest.begin(), rest.end());
  return one(reshape(index_select(flat, 0, reshape(lin, {-1})), out_shape));
}

std::vector<Value> op_one_hot(const Node& n, const Inputs& in) {
  Tensor indices = tin(n, in, 0), values = tin(n, in, 2);
  std::vector<double> dv = read_floats(need(n, in, 1), "OneHot depth");
  if (dv.size() != 1) throw ValueError("OneHot depth must have one element");
  // ONNX: depth is a positive scalar (a float one is cast); NaN, infinite or absurd values are errors
  // here, not an undefined cast and a negative size further on
  if (!(dv[0] >= 1 && dv[0] < 9.2e18))
    throw ValueError(fmt::format("OneHot depth must be a positive number, got {}", dv[0]));
  int64_t depth = static_cast<int64_t>(dv[0]);
  if (values.numel().guard_int() != 2) throw ValueError("OneHot values must have two elements [off, on]");
  int64_t r = indices.dim() + 1;
  int64_t axis = norm_axis(n.get_int("axis", -1), r, "OneHot axis");
  Tensor idx = wrap_negative(is_floating(indices.dtype()) ? cast(indices, DType::I64) : indices, SymInt(depth));
  Tensor mask = eq(unsqueeze(idx, axis), iota_along(SymInt(depth), axis, r));
  Tensor flat = reshape(values, {2});
  return one(where(mask, select(flat, 0, 1), select(flat, 0, 0)));
}

std::vector<Value> op_eye_like(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() != 2) throw ShapeError(fmt::format("EyeLike needs a rank-2 input, got {}", to_string(x.sizes())));
  DType dt = x.dtype();
  if (n.attr("dtype")) {
    std::optional<DType> d = dtype_from_onnx(static_cast<int32_t>(n.get_int("dtype", 1)));
    if (!d) throw NotImplementedError("EyeLike dtype not supported");
    dt = *d;
  }
  Tensor rows = reshape(arange(0, x.size(0), 1, DType::I64), {x.size(0), 1});
  Tensor cols = reshape(arange(0, x.size(1), 1, DType::I64), {1, x.size(1)});
  return one(cast(eq(sub(cols, rows), scalar_tensor(static_cast<double>(n.get_int("k", 0)), DType::I64)), dt));
}

std::vector<Value> op_trilu(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() < 2) throw ShapeError(fmt::format("Trilu needs rank >= 2, got {}", to_string(x.sizes())));
  int64_t k = 0;
  if (const Value* v = opt(in, 1)) k = read_concrete_ints(*v, "Trilu k").at(0);
  bool upper = n.get_int("upper", 1) != 0;
  SymInt R = x.size(-2), C = x.size(-1);
  Tensor rows = reshape(arange(0, R, 1, DType::I64), {R, 1});
  Tensor cols = reshape(arange(0, C, 1, DType::I64), {1, C});
  Tensor d = sub(cols, rows);
  Tensor kk = scalar_tensor(static_cast<double>(k), DType::I64);
  Tensor mask = upper ? ge(d, kk) : le(d, kk);
  return one(where(mask, x, wrap_scalar(0, x)));
}

// ---- linear algebra ----------------------------------------------------------------------------------------------
std::vector<Value> op_gemm(const Node& n, const Inputs& in) {
  Tensor a = tin(n, in, 0), b = tin(n, in, 1), c = topt(in, 2);
  if (a.dim() != 2 || b.dim() != 2)
    throw ShapeError(fmt::format("Gemm needs rank-2 A and B, got {} and {}", to_string(a.sizes()), to_string(b.sizes())));
  if (n.get_int("transA", 0)) a = transpose(a, 0, 1);
  if (n.get_int("transB", 0)) b = transpose(b, 0, 1);
  double alpha = n.get_float("alpha", 1.0), beta = n.get_float("beta", 1.0);
  Tensor y = matmul(a, b);
  if (alpha != 1.0) y = mul(y, alpha);
  if (c.defined() && beta != 0.0) y = add(y, beta != 1.0 ? mul(c, beta) : c);
  return one(y);
}

// ---- shape / movement ---------------------------------------------------------------------------------------------
std::vector<Value> op_expand(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  SymIntVec shape = read_ints(need(n, in, 1), "Expand shape");
  int64_t r = std::max<int64_t>(x.dim(), static_cast<int64_t>(shape.size()));
  while (x.dim() < r) x = unsqueeze(x, 0);
  while (static_cast<int64_t>(shape.size()) < r) shape.insert(shape.begin(), SymInt(1));
  SymIntVec out;
  for (int64_t i = 0; i < r; ++i) {
    const SymInt& xs = x.size(i);
    const SymInt& ss = shape[static_cast<size_t>(i)];
    int64_t v;
    if (ss.maybe_as_int(v) && v == 1) out.push_back(xs);
    else out.push_back(ss);
  }
  return one(expand(x, out));
}

std::vector<Value> op_tile(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  SymIntVec reps = read_ints(need(n, in, 1), "Tile repeats");
  if (static_cast<int64_t>(reps.size()) != x.dim())
    throw ShapeError(fmt::format("Tile: {} repeats for a rank-{} input", reps.size(), x.dim()));
  SymIntVec inter, expanded, out;
  for (int64_t i = 0; i < x.dim(); ++i) {
    inter.push_back(1);
    inter.push_back(x.size(i));
    expanded.push_back(reps[static_cast<size_t>(i)]);
    expanded.push_back(x.size(i));
    out.push_back(reps[static_cast<size_t>(i)] * x.size(i));
  }
  if (x.dim() == 0) return one(x);
  return one(reshape(expand(reshape(x, inter), expanded), out));
}

std::vector<Value> op_split(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(x.dim(), 1), "Split axis");
  SymIntVec sizes;
  if (n.opset >= 13) {
    if (const Value* v = opt(in, 1)) sizes = read_ints(*v, "Split split");
  } else {
    sizes = to_symint_vec(n.get_ints("split"));
  }
  if (sizes.empty()) {
    int64_t parts = n.attr("num_outputs") ? n.get_int("num_outputs", 1) : static_cast<int64_t>(n.outputs.size());
    if (parts < 1) throw ValueError("Split into 0 outputs");
    int64_t d = x.size(axis).guard_int();
    int64_t chunk = (d + parts - 1) / parts;
    if (n.opset < 18 && d % parts != 0)
      throw ValueError(fmt::format("Split of size {} into {} equal outputs", d, parts));
    for (int64_t i = 0; i < parts; ++i) sizes.emplace_back(std::max<int64_t>(0, std::min(chunk, d - i * chunk)));
  }
  // One view per piece (narrow), as torch.split returns: under capture each piece is a view the
  // consumers index into (loop kernels), not a several-output extern step.
  std::vector<Value> outs;
  SymInt start = 0;
  for (const SymInt& len : sizes) {
    outs.push_back(Value::tensor(narrow(x, axis, start, len)));
    start = start + len;
  }
  if (static_cast<bool>(start != x.size(axis)))
    throw ValueError(fmt::format("Split sizes {} do not add up to dim {} of {}", to_string(sizes), axis,
                                 to_string(x.sizes())));
  return outs;
}

std::vector<Value> op_range(const Node& n, const Inputs& in) {
  const Value &s = need(n, in, 0), &l = need(n, in, 1), &d = need(n, in, 2);
  DType dt = s.is_host() ? s.dtype : s.t.dtype();
  if (is_integral(dt)) {
    SymInt start = read_ints(s, "Range start").at(0), limit = read_ints(l, "Range limit").at(0);
    SymInt delta = read_ints(d, "Range delta").at(0);
    return one(like_dtype(arange(start, limit, delta, DType::I64), dt));
  }
  double start = read_floats(s, "Range start").at(0), limit = read_floats(l, "Range limit").at(0);
  double delta = read_floats(d, "Range delta").at(0);
  if (delta == 0) throw ValueError("Range delta 0");
  // The element count as a double first: inf, NaN or past 2^62 is an error, never a cast (undefined
  // behaviour that gave INT64_MIN, then an empty tensor).
  const double n_elems = std::ceil((limit - start) / delta);
  if (!(n_elems <= 4.6e18))
    throw ValueError(fmt::format("Range({}, {}, {}) has {} elements", start, limit, delta,
                                 std::isnan(n_elems) ? std::string("an undefined number of") : fmt::format("{:g}", n_elems)));
  const int64_t count = n_elems <= 0 ? 0 : static_cast<int64_t>(n_elems);
  Tensor i = cast(arange(0, count, 1, DType::I64), dt);
  return one(add(mul(i, scalar_tensor(delta, dt)), scalar_tensor(start, dt)));
}

std::vector<Value> op_depth_to_space(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() != 4) throw ShapeError(fmt::format("{} needs a rank-4 input, got {}", n.op_type, to_string(x.sizes())));
  int64_t bs = n.get_int("blocksize", 0);
  if (bs < 1) throw ValueError("blocksize must be >= 1");
  SymInt N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  if (n.op_type == "SpaceToDepth") {
    Tensor t = reshape(x, {N, C, H / bs, SymInt(bs), W / bs, SymInt(bs)});
    return one(reshape(permute(t, {0, 3, 5, 1, 2, 4}), {N, C * (bs * bs), H / bs, W / bs}));
  }
  SymInt c2 = C / (bs * bs);
  if (n.get_string("mode", "DCR") == "CRD") {
    Tensor t = reshape(x, {N, c2, SymInt(bs), SymInt(bs), H, W});
    return one(reshape(permute(t, {0, 1, 4, 2, 5, 3}), {N, c2, H * bs, W * bs}));
  }
  Tensor t = reshape(x, {N, SymInt(bs), SymInt(bs), c2, H, W});
  return one(reshape(permute(t, {0, 3, 4, 1, 5, 2}), {N, c2, H * bs, W * bs}));
}

int64_t random_seed(const Node& n);  // the random ops' section below

std::vector<Value> op_dropout(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  double ratio = n.opset < 12 ? n.get_float("ratio", 0.5) : 0.5;
  if (const Value* v = opt(in, 1); v && n.opset >= 12) ratio = read_floats(*v, "Dropout ratio").at(0);
  bool training = false;
  if (const Value* v = opt(in, 2)) {
    Tensor t = as_tensor(*v);
    training = t.item<bool>();
  }
  if (training && ratio != 0.0) {
    // Training mode (opset 12+): each element kept with probability 1 − ratio (a uniform number from
    // philox_uniform with the node's seed at or above ratio), kept ones scaled by 1 / (1 − ratio).
    if (!(ratio > 0.0 && ratio < 1.0))
      throw ValueError(fmt::format("Dropout node {}: ratio must be in [0, 1) in training mode, got {}", n.label(), ratio));
    Tensor u = philox_uniform(x.sizes(), random_seed(n), 0, DType::F64);
    Tensor keep = ge(u, wrap_scalar(ratio, u));
    Tensor y = mul(where(keep, x, wrap_scalar(0.0, x)), 1.0 / (1.0 - ratio));
    std::vector<Value> outs{Value::tensor(cast(y, x.dtype()))};
    if (n.outputs.size() > 1 && !n.outputs[1].empty()) outs.push_back(Value::tensor(keep));
    return outs;
  }
  std::vector<Value> outs{Value::tensor(x)};
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) outs.push_back(Value::tensor(full(x.sizes(), 1.0, DType::Bool)));
  return outs;
}

std::vector<Value> op_upsample(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  std::vector<double> sc;
  if (n.opset >= 9) sc = read_floats(need(n, in, 1), "Upsample scales");
  else if (const Attr* a = n.attr("scales")) sc = a->floats;
  if (n.get_string("mode", "nearest") != "nearest" || x.dim() != 4) {
    // Upsample is Resize with asymmetric coordinates (nearest: floor).
    std::vector<float> f(sc.begin(), sc.end());
    Value scales = Value::tensor(tensor<float>(f, {static_cast<int64_t>(f.size())}));
    return one(resize_general(n, x, nullptr, &scales, nullptr, "asymmetric"));
  }
  if (sc.size() != 4) throw ValueError("Upsample scales must have 4 entries");
  if (sc[0] != 1.0 || sc[1] != 1.0) throw NotImplementedError("Upsample of the batch or channel dim");
  SymIntVec out;
  for (int i = 2; i < 4; ++i) {
    if (sc[i] < 1 || std::abs(sc[i] - std::round(sc[i])) > 1e-6)
      throw NotImplementedError(fmt::format("Upsample scale {} (only integer upsampling factors)", sc[i]));
    out.push_back(x.size(i) * static_cast<int64_t>(std::llround(sc[i])));
  }
  return one(upsample_nearest2d(x, out));
}

/// Compress: the selected slices (a data-dependent size: a graph break under capture).
std::vector<Value> op_compress(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), c = tin(n, in, 1);
  bool flat = !n.attr("axis");
  if (flat) x = reshape(x, {-1});
  int64_t axis = flat ? 0 : norm_axis(n.get_int("axis", 0), x.dim(), "Compress axis");
  if (c.dim() != 1) throw ShapeError(fmt::format("Compress condition must be 1-D, got {}", to_string(c.sizes())));
  SymInt len = c.size(0);
  if (static_cast<bool>(len > x.size(axis))) c = slice(c, 0, 0, x.size(axis));
  Tensor idx = reshape(nonzero(cast(c, DType::Bool)), {-1});
  return one(index_select(x, axis, idx));
}

/// NonZero: [rank, n] indices of the non-zero elements (a data-dependent size).
std::vector<Value> op_nonzero(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() == 0) x = reshape(x, {1});
  return one(permute(nonzero(x), {1, 0}));
}
std::vector<Value> op_mean_variance_norm(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec axes = n.get_ints("axes", {0, 2, 3});
  for (auto& a : axes) a = norm_axis(a, x.dim(), "MeanVarianceNormalization axis");
  Tensor mu = mean(x, axes, true);
  Tensor centered = sub(x, mu);
  // ONNX's function body: (X - E[X]) / (sqrt(Var[X]) + 1e-9).
  return one(div(centered, add(sqrt(mean(mul(centered, centered), axes, true)), 1e-9)));
}
Tensor lp_norm(const Tensor& x, const IntVec& axes, int64_t p, bool keep) {
  if (p == 1) return sum(abs(x), axes, keep);
  if (p == 2) return sqrt(sum(mul(x, x), axes, keep));
  throw ValueError(fmt::format("p = {} (ONNX allows 1 and 2)", p));
}
std::vector<Value> op_lp_normalization(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t axis = norm_axis(n.get_int("axis", -1), x.dim(), "LpNormalization axis");
  return one(div(x, lp_norm(x, {axis}, n.get_int("p", 2), true)));
}
std::vector<Value> op_global_lp_pool(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec axes;
  for (int64_t i = 2; i < x.dim(); ++i) axes.push_back(i);
  return one(lp_norm(x, axes, n.get_int("p", 2), true));
}

/// HannWindow / HammingWindow / BlackmanWindow: a cosine-sum window of `size` points (periodic: the
/// period is size, else size - 1), computed in f64 and cast to output_datatype (default float).
std::vector<Value> op_window(const Node& n, const Inputs& in) {
  int64_t size = read_concrete_ints(need(n, in, 0), "window size").at(0);
  if (size < 0) throw ValueError(fmt::format("window size {} is negative", size));
  std::optional<DType> dt = dtype_from_onnx(static_cast<int32_t>(n.get_int("output_datatype", 1)));
  if (!dt) throw NotImplementedError("window output_datatype not supported");
  bool periodic = n.get_int("periodic", 1) != 0;
  double period = static_cast<double>(periodic ? size : size - 1);
  Tensor k = cast(arange(0, size, 1, DType::I64), DType::F64);
  Tensor a1 = cos(mul(k, 2 * M_PI / (period == 0 ? 1.0 : period)));
  Tensor w;
  if (n.op_type == "HannWindow") {
    w = sub(wrap_scalar(0.5, a1), mul(a1, 0.5));
  } else if (n.op_type == "HammingWindow") {
    const double alpha = 25.0 / 46.0;
    w = sub(wrap_scalar(alpha, a1), mul(a1, 1.0 - alpha));
  } else {
    Tensor a2 = cos(mul(k, 4 * M_PI / (period == 0 ? 1.0 : period)));
    w = add(sub(wrap_scalar(0.42, a1), mul(a1, 0.5)), mul(a2, 0.08));
  }
  return one(cast(w, *dt));
}

/// MelWeightMatrix: [dft_length / 2 + 1, num_mel_bins] triangular filters on the mel scale
/// (mel(f) = 2595 log10(1 + f / 700)), as ONNX's reference builds them: num_mel_bins + 2 points evenly
/// spaced in mel over [lower, upper] (step (high − low) / (num_mel_bins + 2)), mapped back to hertz and
/// to spectrogram bins by floor((dft_length + 1) · f / sample_rate); filter i rises from point i to
/// i + 1 and falls to i + 2, peak 1. Computed on the host in f64 (its inputs are read: a graph break
/// when they are data), cast to output_datatype.
std::vector<Value> op_mel_weight_matrix(const Node& n, const Inputs& in) {
  int64_t mels = read_concrete_ints(need(n, in, 0), "num_mel_bins").at(0);
  int64_t dft = read_concrete_ints(need(n, in, 1), "dft_length").at(0);
  int64_t rate = read_concrete_ints(need(n, in, 2), "sample_rate").at(0);
  double lo_hz = read_floats(need(n, in, 3), "lower_edge_hertz").at(0);
  double hi_hz = read_floats(need(n, in, 4), "upper_edge_hertz").at(0);
  if (mels < 1 || dft < 1 || rate < 1 || mels > (1 << 16) || dft > (1 << 24))
    throw ValueError(fmt::format("MelWeightMatrix: num_mel_bins {}, dft_length {} and sample_rate {} must be positive "
                                 "(at most 2^16 bins and a 2^24-point DFT)", mels, dft, rate));
  std::optional<DType> dt = dtype_from_onnx(static_cast<int32_t>(n.get_int("output_datatype", 1)));
  if (!dt) throw NotImplementedError("MelWeightMatrix output_datatype not supported");
  int64_t bins = dft / 2 + 1;
  auto mel = [](double hz) { return 2595.0 * std::log10(1.0 + hz / 700.0); };
  double lo = mel(lo_hz), step = (mel(hi_hz) - lo) / static_cast<double>(mels + 2);
  std::vector<int64_t> point(static_cast<size_t>(mels + 2));
  for (int64_t i = 0; i < mels + 2; ++i) {
    double hz = 700.0 * (std::pow(10.0, (static_cast<double>(i) * step + lo) / 2595.0) - 1.0);
    point[static_cast<size_t>(i)] = static_cast<int64_t>(std::floor(static_cast<double>(dft + 1) * hz / static_cast<double>(rate)));
  }
  std::vector<double> w(static_cast<size_t>(bins * mels), 0.0);
  auto at = [&](int64_t bin, int64_t m) -> double& {
    if (bin < 0 || bin >= bins)
      throw ValueError(fmt::format("MelWeightMatrix: filter {} reaches spectrogram bin {}, outside [0, {}) (edges above "
                                   "the Nyquist frequency?)", m, bin, bins));
    return w[static_cast<size_t>(bin * mels + m)];
  };
  for (int64_t m = 0; m < mels; ++m) {
    int64_t left = point[static_cast<size_t>(m)], centre = point[static_cast<size_t>(m + 1)],
            right = point[static_cast<size_t>(m + 2)];
    if (centre == left) {
      at(centre, m) = 1.0;
    } else {
      for (int64_t j = left; j <= centre; ++j) at(j, m) = static_cast<double>(j - left) / static_cast<double>(centre - left);
    }
    for (int64_t j = centre; j < right; ++j) at(j, m) = static_cast<double>(right - j) / static_cast<double>(right - centre);
  }
  return one(cast(tensor<double>(w, {bins, mels}), *dt));
}

/// LRN over channels: x / (bias + alpha / size * sum of x^2 over the window [c - (size-1)/2,
/// c + ceil((size-1)/2)]) ^ beta; the window sum is an average pool over [N, 1, C, H*W].
std::vector<Value> op_lrn(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() < 3) throw ShapeError(fmt::format("LRN needs [N, C, ...], got {}", to_string(x.sizes())));
  int64_t size = n.get_int("size", 0);
  if (size < 1) throw ValueError("LRN size must be >= 1");
  double alpha = n.get_float("alpha", 1e-4), beta = n.get_float("beta", 0.75), bias = n.get_float("bias", 1.0);
  int64_t lo = (size - 1) / 2, hi = size - 1 - lo;
  SymInt rest = 1;
  for (int64_t i = 2; i < x.dim(); ++i) rest = rest * x.size(i);
  Tensor sq = reshape(mul(x, x), {x.size(0), SymInt(1), x.size(1), rest});
  sq = pad(sq, {SymInt(0), SymInt(0), SymInt(lo), SymInt(hi)}, "constant", 0.0);
  Tensor s = mul(avg_pool2d(sq, {size, 1}, {1, 1}, {0, 0}, false, true), static_cast<double>(size));
  Tensor denom = pow(add(mul(reshape(s, x.sizes()), alpha / static_cast<double>(size)), bias), beta);
  return one(div(x, denom));
}

/// ReverseSequence: each batch entry's first seq_lens[b] steps reversed (a gather along the time axis).
std::vector<Value> op_reverse_sequence(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  Tensor lens = cast(tin(n, in, 1), DType::I64);
  int64_t t_axis = n.get_int("time_axis", 0), b_axis = n.get_int("batch_axis", 1);
  if (x.dim() < 2 || (t_axis != 0 && t_axis != 1) || b_axis != 1 - t_axis)
    throw ValueError(fmt::format("ReverseSequence time_axis {} / batch_axis {} on {}", t_axis, b_axis,
                                 to_string(x.sizes())));
  SymInt T = x.size(t_axis), B = x.size(b_axis);
  SymIntVec tb(2, SymInt(1));
  tb[static_cast<size_t>(t_axis)] = T;
  Tensor t = reshape(arange(0, T, 1, DType::I64), tb);
  tb.assign(2, SymInt(1));
  tb[static_cast<size_t>(b_axis)] = B;
  Tensor l = reshape(lens, tb);
  Tensor idx = where(lt(t, l), sub(sub(l, scalar_tensor(1, DType::I64)), t), t);  // [T, B] or [B, T]
  SymIntVec ishape = idx.sizes();
  for (int64_t i = 2; i < x.dim(); ++i) {
    idx = unsqueeze(idx, i);
    ishape.push_back(x.size(i));
  }
  return one(gather(x, t_axis, expand(idx, ishape)));
}

/// RNN and GRU (layout 0 or 1, default activations), unrolled over the time steps (T is specialized):
///   RNN: H_t = tanh(X_t W^T + H_{t-1} R^T + Wb + Rb)
///   GRU: z, r = sigmoid(X_t W_{z,r}^T + H_{t-1} R_{z,r}^T + b), h = tanh(X_t W_h^T + (r * H_{t-1}) R_h^T + Rb_h
///        + Wb_h) (linear_before_reset: r * (H_{t-1} R_h^T + Rb_h)), H_t = (1 - z) * h + z * H_{t-1}.
/// Outputs Y [T, D, N, H] and Y_h [D, N, H], as ONNX defines them.
std::vector<Value> op_rnn_gru(const Node& n, const Inputs& in) {
  bool gru = n.op_type == "GRU";
  Tensor X = tin(n, in, 0), W = tin(n, in, 1), R = tin(n, in, 2), B = topt(in, 3), h0 = topt(in, 5);
  bool batch_first = n.get_int("layout", 0) == 1;  // X [N, T, I], initial_h [N, D, H]
  if (batch_first && X.dim() == 3) X = transpose(X, 0, 1);
  if (batch_first && h0.defined() && h0.dim() == 3) h0 = transpose(h0, 0, 1);
  if (X.dim() != 3 || W.dim() != 3 || R.dim() != 3)
    throw ShapeError(fmt::format("{}: X {}, W {}, R {} must be rank 3", n.op_type, to_string(X.sizes()),
                                 to_string(W.sizes()), to_string(R.sizes())));
  int64_t T = X.size(0).guard_int();
  if (const Value* sl = opt(in, 4))
    for (int64_t v : read_concrete_ints(*sl, "sequence_lens"))
      if (v != T) throw NotImplementedError(fmt::format("{} with sequence_lens shorter than the sequence", n.op_type));
  std::string dir = n.get_string("direction", "forward");
  if (dir != "forward" && dir != "reverse" && dir != "bidirectional")
    throw ValueError(fmt::format("direction '{}'", dir));
  int64_t D = dir == "bidirectional" ? 2 : 1;
  int64_t H = R.size(2).guard_int(), G = gru ? 3 : 1;
  bool lbr = n.get_int("linear_before_reset", 0) != 0;
  TensorList ys_dir, hs;
  for (int64_t d = 0; d < D; ++d) {
    Tensor Wd = select(W, 0, d), Rd = select(R, 0, d), Wb, Rb;
    if (B.defined()) {
      Tensor Bd = select(B, 0, d);
      Wb = slice(Bd, 0, 0, G * H);
      Rb = slice(Bd, 0, G * H, 2 * G * H);
    }
    Tensor h = h0.defined() ? select(h0, 0, d) : full({X.size(1), SymInt(H)}, 0.0, X.dtype());
    bool rev = dir == "reverse" || d == 1;
    Tensor xw = matmul(X, transpose(Wd, 0, 1));  // [T, N, G*H]
    if (Wb.defined()) xw = add(xw, Wb);
    Tensor RdT = transpose(Rd, 0, 1);
    TensorList ys(static_cast<size_t>(T));
    for (int64_t step = 0; step < T; ++step) {
      int64_t t = rev ? T - 1 - step : step;
      Tensor xt = select(xw, 0, t);
      if (!gru) {
        Tensor a = add(xt, matmul(h, RdT));
        if (Rb.defined()) a = add(a, Rb);
        h = tanh(a);
      } else {
        Tensor hr = matmul(h, RdT);
        if (Rb.defined()) hr = add(hr, Rb);
        Tensor z = sigmoid(add(slice(xt, 1, 0, H), slice(hr, 1, 0, H)));
        Tensor r = sigmoid(add(slice(xt, 1, H, 2 * H), slice(hr, 1, H, 2 * H)));
        Tensor hh;
        if (lbr) {
          hh = tanh(add(slice(xt, 1, 2 * H, 3 * H), mul(r, slice(hr, 1, 2 * H, 3 * H))));
        } else {
          Tensor t2 = matmul(mul(r, h), transpose(slice(Rd, 0, 2 * H, 3 * H), 0, 1));
          if (Rb.defined()) t2 = add(t2, slice(Rb, 0, 2 * H, 3 * H));
          hh = tanh(add(slice(xt, 1, 2 * H, 3 * H), t2));
        }
        h = add(mul(sub(wrap_scalar(1.0, z), z), hh), mul(z, h));
      }
      ys[static_cast<size_t>(t)] = h;
    }
    ys_dir.push_back(stack(ys, 0));
    hs.push_back(h);
  }
  Tensor Y = stack(ys_dir, 1), Yh = stack(hs, 0);  // [T, D, N, H], [D, N, H]
  if (batch_first) return {Value::tensor(permute(Y, {2, 0, 1, 3})), Value::tensor(permute(Yh, {1, 0, 2}))};
  return {Value::tensor(Y), Value::tensor(Yh)};
}

// ---- scatter / top-k -----------------------------------------------------------------------------------
/// The reduction attribute of ScatterElements / ScatterND as scatter_reduce's name ("" for none).
std::string scatter_reduction(const Node& n) {
  std::string r = n.get_string("reduction", "none");
  if (r == "none") return "";
  if (r == "add") return "sum";
  if (r == "mul") return "prod";
  if (r == "max") return "amax";
  if (r == "min") return "amin";
  throw ValueError(fmt::format("{} reduction '{}' (none, add, mul, max or min)", n.op_type, r));
}

/// ScatterElements (and the older Scatter): data with updates written at indices along axis. "none"
/// writes (a position named twice gets the sum of its updates: ONNX leaves duplicates undefined there);
/// add / mul / max / min combine with scatter_reduce (torch.scatter_reduce, include_self).
std::vector<Value> op_scatter_elements(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), idx = tin(n, in, 1), upd = tin(n, in, 2);
  int64_t axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(x.dim(), 1), "ScatterElements axis");
  std::string red = n.op_type == "Scatter" ? "" : scatter_reduction(n);
  if (upd.dtype() != x.dtype()) upd = cast(upd, x.dtype());
  idx = wrap_negative(idx, x.size(axis));
  if (red == "sum") return one(scatter_add(x, axis, idx, upd));
  if (!red.empty()) return one(scatter_reduce(x, axis, idx, upd, red));
  Tensor hit = scatter_add(full(x.sizes(), 0.0, DType::I64), axis, idx, full(idx.sizes(), 1.0, DType::I64));
  Tensor vals = scatter_add(full(x.sizes(), 0.0, x.dtype()), axis, idx, upd);
  return one(where(gt(hit, scalar_tensor(0, DType::I64)), vals, x));
}

/// ScatterND: indices [..., k] address slices of data's first k dims; each is a row of the data seen
/// as [d0 * ... * d(k-1), rest], written (none) or added (add) with index_add, or combined (mul, max,
/// min) with scatter_reduce along the rows.
std::vector<Value> op_scatter_nd(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), idx = cast(tin(n, in, 1), DType::I64), upd = tin(n, in, 2);
  std::string red = scatter_reduction(n);
  if (idx.dim() < 1) throw ShapeError("ScatterND indices must have rank >= 1");
  int64_t k = idx.size(idx.dim() - 1).guard_int();
  if (k < 1 || k > x.dim())
    throw ShapeError(fmt::format("ScatterND indices' last dim {} for data of rank {}", k, x.dim()));
  SymInt rows = 1, rest = 1;
  std::vector<int64_t> stride(static_cast<size_t>(k), 1);
  for (int64_t d = k - 1; d >= 0; --d) {
    if (d < k - 1) stride[static_cast<size_t>(d)] = stride[static_cast<size_t>(d + 1)] * x.size(d + 1).guard_int();
  }
  for (int64_t d = 0; d < k; ++d) rows = rows * x.size(d);
  SymIntVec data2{rows};
  for (int64_t d = k; d < x.dim(); ++d) rest = rest * x.size(d);
  data2.push_back(rest);
  // Linear row index of each index tuple (negative indices count from the end of their dim).
  Tensor lin;
  for (int64_t d = 0; d < k; ++d) {
    Tensor c = checked_component(select(idx, idx.dim() - 1, d), x.size(d), rows);
    Tensor t = mul(c, scalar_tensor(static_cast<double>(stride[static_cast<size_t>(d)]), DType::I64));
    lin = d == 0 ? t : add(lin, t);
  }
  lin = reshape(lin, {-1});
  Tensor x2 = reshape(x, data2);
  Tensor u2 = reshape(upd.dtype() == x.dtype() ? upd : cast(upd, x.dtype()), {lin.size(0), rest});
  if (red == "sum") return one(reshape(index_add(x2, 0, lin, u2), x.sizes()));
  if (!red.empty()) {
    Tensor rows_idx = expand(unsqueeze(lin, 1), {lin.size(0), rest});
    return one(reshape(scatter_reduce(x2, 0, rows_idx, u2, red), x.sizes()));
  }
  Tensor hit = index_add(full({rows, SymInt(1)}, 0.0, DType::I64), 0, lin, full({lin.size(0), SymInt(1)}, 1.0, DType::I64));
  Tensor vals = index_add(full(data2, 0.0, x.dtype()), 0, lin, u2);
  return one(reshape(where(gt(hit, scalar_tensor(0, DType::I64)), vals, x2), x.sizes()));
}

/// TopK: the k largest (or smallest) elements along axis with their indices, sorted, ties to the lower
/// index; k rounds of argmax, each masking the chosen element (k is read on the host; O(k * n)).
std::vector<Value> op_topk(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t k = n.opset < 10 ? n.get_int("k", 0) : read_concrete_ints(need(n, in, 1), "TopK K").at(0);
  if (x.dim() == 0) throw ShapeError("TopK of a rank-0 tensor");
  int64_t axis = norm_axis(n.get_int("axis", -1), x.dim(), "TopK axis");
  bool largest = n.get_int("largest", 1) != 0;
  int64_t len = x.size(axis).guard_int();
  if (k < 0 || k > len) throw ValueError(fmt::format("TopK k = {} for a dim of size {}", k, len));
  // The key: larger is better; integers in f64 (exact below 2^53), negation for smallest.
  // NaN ranks above every number (as +inf; then by index).
  Tensor key = is_floating(x.dtype()) && x.dtype() != DType::F16 && x.dtype() != DType::BF16 ? x : cast(x, DType::F64);
  if (is_floating(key.dtype())) key = where(ne(key, key), scalar_tensor(INFINITY, key.dtype()), key);
  if (!largest) key = neg(key);
  Tensor iota = iota_along(x.size(axis), axis, x.dim());
  Tensor lowest = scalar_tensor(-INFINITY, key.dtype());
  Tensor taken = full(x.sizes(), 0.0, DType::Bool);
  TensorList vals, idxs;
  for (int64_t i = 0; i < k; ++i) {
    // The first untaken position holding the largest untaken key (exact ties, -inf included).
    Tensor k2 = i == 0 ? key : where(taken, lowest, key);
    Tensor best = logical_and(eq(k2, amax(k2, {axis}, true)), logical_not(taken));
    Tensor j = argmax(cast(best, DType::I32), axis, true);
    idxs.push_back(j);
    vals.push_back(gather(x, axis, j));
    if (i + 1 < k) taken = logical_or(taken, eq(iota, j));
  }
  if (k == 0) {
    SymIntVec shape = x.sizes();
    shape[static_cast<size_t>(axis)] = SymInt(0);
    return {Value::tensor(full(shape, 0.0, x.dtype())), Value::tensor(full(shape, 0.0, DType::I64))};
  }
  return {Value::tensor(cat(vals, axis)), Value::tensor(cat(idxs, axis))};
}

/// BitShift on unsigned integers (uint8 natively; uint16 / uint32 / uint64 carried in i32 / i64 / i64):
/// RIGHT is a logical shift, LEFT shifts and keeps the type's low bits (a mask for a carried type that
/// is narrower than its carrier). Shift counts of the type's width or more give 0.
int64_t carried_bits(const Node& n, const Tensor& x) {
  int64_t carried = n.get_int("protean_carried_type", 0);
  if (carried == 4) return 16;
  if (carried == 12) return 32;
  if (carried == 13) return 64;
  if (x.dtype() == DType::U8) return 8;
  return 0;
}
/// x with only the low `bits` bits kept, when its carrier is wider than the ONNX type.
Tensor keep_low_bits(const Tensor& x, int64_t bits) {
  int64_t carrier = static_cast<int64_t>(itemsize(x.dtype())) * 8;
  if (bits >= carrier) return x;
  return bitwise_and(x, scalar_tensor(std::ldexp(1.0, static_cast<int>(bits)) - 1.0, x.dtype()));
}
std::vector<Value> op_bitshift(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), y = tin(n, in, 1);
  int64_t bits = carried_bits(n, x);
  if (bits == 0) throw TypeError(fmt::format("BitShift takes unsigned integers, got {}", short_name(x.dtype())));
  std::string dir = n.get_string("direction", "");
  if (dir != "LEFT" && dir != "RIGHT") throw ValueError(fmt::format("BitShift direction '{}' (LEFT or RIGHT)", dir));
  if (y.dtype() != x.dtype()) y = cast(y, x.dtype());
  if (dir == "RIGHT") return one(bitwise_right_shift(x, y, /*logical=*/true));
  return one(keep_low_bits(bitwise_left_shift(x, y), bits));
}

/// BitwiseAnd / Or / Xor / Not (opset 18) on integer tensors; Not of a carried unsigned type keeps the
/// type's low bits.
std::vector<Value> op_bitwise(const Node& n, const Inputs& in) {
  Tensor a = tin(n, in, 0);
  if (!is_integral(a.dtype()))
    throw TypeError(fmt::format("{} takes integer tensors, got {}", n.op_type, short_name(a.dtype())));
  if (n.op_type == "BitwiseNot") {
    int64_t bits = carried_bits(n, a);
    return one(bits == 0 ? bitwise_not(a) : keep_low_bits(bitwise_not(a), bits));
  }
  Tensor b = tin(n, in, 1);
  if (b.dtype() != a.dtype())
    throw TypeError(fmt::format("{}: inputs of two types ({} and {})", n.op_type, short_name(a.dtype()), short_name(b.dtype())));
  if (n.op_type == "BitwiseAnd") return one(bitwise_and(a, b));
  if (n.op_type == "BitwiseOr") return one(bitwise_or(a, b));
  return one(bitwise_xor(a, b));
}

// ---- Det -------------------------------------------------------------------------------------------------------
std::vector<Value> op_det(const Node& n, const Inputs& in) { return one(linalg_det(tin(n, in, 0))); }

// ---- DFT / STFT ------------------------------------------------------------------------------------------------
/// A complex tensor as two f64 tensors of one shape; `im` undefined for a real one.
struct Cplx {
  Tensor re, im;
};

/// A complex table [rows, cols] of e^(i·angle(r, c)) as two f64 constants. `turns(r, c)` returns the
/// angle as an exact fraction num / den of a full turn, reduced so that cos/sin get an argument in
/// [0, 2π) and stay exact to the last bit however long the transform.
template <typename F>
Cplx unit_table(int64_t rows, int64_t cols, double sign, F turns) {
  std::vector<double> c(static_cast<size_t>(rows * cols)), s(c.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      auto [num, den] = turns(r, k);
      double ang = 2.0 * M_PI * static_cast<double>(num) / static_cast<double>(den);
      c[static_cast<size_t>(r * cols + k)] = std::cos(ang);
      s[static_cast<size_t>(r * cols + k)] = sign * std::sin(ang);
    }
  return {tensor<double>(c, {rows, cols}), tensor<double>(s, {rows, cols})};
}

/// (a.re + i a.im) · (w.re + i w.im), broadcasting; a.im may be undefined (a real a).
Cplx cmul(const Cplx& a, const Cplx& w) {
  if (!a.im.defined()) return {mul(a.re, w.re), mul(a.re, w.im)};
  return {sub(mul(a.re, w.re), mul(a.im, w.im)), add(mul(a.re, w.im), mul(a.im, w.re))};
}

/// Σ_n x[..., n] · T[n, k] for a complex table T: two or four real matmuls.
Cplx cmatmul(const Cplx& x, const Cplx& t) {
  Tensor yr = matmul(x.re, t.re), yi = matmul(x.re, t.im);
  if (x.im.defined()) {
    yr = sub(yr, matmul(x.im, t.im));
    yi = add(yi, matmul(x.im, t.re));
  }
  return {yr, yi};
}

Cplx map_parts(const Cplx& x, const std::function<Tensor(const Tensor&)>& f) {
  return {f(x.re), x.im.defined() ? f(x.im) : Tensor()};
}

/// The first K bins of the unscaled DFT of the last dim (length L) by one table matmul: O(L·K) per
/// row, used for short transforms and prime factors up to kDftPrimeDirect.
Cplx dft_direct(const Cplx& x, int64_t L, int64_t K, double sign) {
  Cplx t = unit_table(L, K, sign, [L](int64_t i, int64_t k) { return std::pair{(i * k) % L, L}; });
  return cmatmul(x, t);
}

constexpr int64_t kDftDirect = 256;         // lengths up to this: one table matmul
constexpr int64_t kDftPrimeDirect = 2048;   // a prime factor up to this: one table matmul
constexpr int64_t kDftMaxLength = 1 << 24;  // the longest transform (tables of 16 bytes per point)

Cplx fft_last(const Cplx& x, int64_t L, double sign);

/// Host radix-2 FFT (unscaled, e^(sign·2πi nk/M)) of a constant sequence, M a power of two.
std::vector<std::complex<double>> host_fft(std::vector<std::complex<double>> a, double sign) {
  const size_t m = a.size();
  for (size_t i = 1, j = 0; i < m; ++i) {
    size_t bit = m >> 1;
    for (; j & bit; bit >>= 1) j ^= bit;
    j ^= bit;
    if (i < j) std::swap(a[i], a[j]);
  }
  for (size_t len = 2; len <= m; len <<= 1) {
    for (size_t i = 0; i < m; i += len)
      for (size_t k = 0; k < len / 2; ++k) {
        double ang = sign * 2.0 * M_PI * static_cast<double>(k) / static_cast<double>(len);
        std::complex<double> w(std::cos(ang), std::sin(ang));
        std::complex<double> u = a[i + k], v = a[i + k + len / 2] * w;
        a[i + k] = u + v;
        a[i + k + len / 2] = u - v;
      }
  }
  return a;
}

/// Bluestein's chirp-z form of a length-L DFT (L with a prime factor above kDftPrimeDirect): with
/// w_n = e^(sign·πi n²/L), X_k = w_k Σ_n (x_n w_n) conj(w_(k−n)), a circular convolution of length
/// M = 2^⌈log2(2L−1)⌉ done as two power-of-two FFTs of the signal side; the chirp's own transform is
/// computed once on the host.
Cplx dft_bluestein(const Cplx& x, int64_t L, double sign) {
  int64_t M = 1;
  while (M < 2 * L - 1) M <<= 1;
  // n² mod 2L keeps the chirp's angle exact: e^(sign·πi n²/L) = e^(sign·2πi (n² mod 2L) / 2L).
  auto chirp_turns = [L](int64_t n) { return std::pair{(n * n) % (2 * L), 2 * L}; };
  Cplx w = unit_table(1, L, sign, [&](int64_t, int64_t n) { return chirp_turns(n); });
  Cplx wl = map_parts(w, [L](const Tensor& t) { return reshape(t, {SymInt(L)}); });
  Cplx a = cmul(x, wl);
  SymIntVec pad = x.re.sizes();
  pad.back() = SymInt(M - L);
  a = map_parts(a, [&](const Tensor& t) { return cat({t, full(pad, 0.0, DType::F64)}, t.dim() - 1); });
  std::vector<std::complex<double>> b(static_cast<size_t>(M));
  for (int64_t n = 0; n < L; ++n) {
    auto [num, den] = chirp_turns(n);
    double ang = -sign * 2.0 * M_PI * static_cast<double>(num) / static_cast<double>(den);
    b[static_cast<size_t>(n)] = {std::cos(ang), std::sin(ang)};
    if (n > 0) b[static_cast<size_t>(M - n)] = b[static_cast<size_t>(n)];
  }
  b = host_fft(std::move(b), -1.0);
  std::vector<double> br(static_cast<size_t>(M)), bi(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) {
    br[static_cast<size_t>(i)] = b[static_cast<size_t>(i)].real() / static_cast<double>(M);
    bi[static_cast<size_t>(i)] = b[static_cast<size_t>(i)].imag() / static_cast<double>(M);
  }
  Cplx A = fft_last(a, M, -1.0);
  Cplx conv = fft_last(cmul(A, {tensor<double>(br, {M}), tensor<double>(bi, {M})}), M, 1.0);
  conv = map_parts(conv, [&](const Tensor& t) { return slice(t, t.dim() - 1, 0, L); });
  return cmul(conv, wl);
}

/// The unscaled DFT e^(sign·2πi nk/L) of the last dim, all L bins. Composite L: the four-step form
/// (Cooley–Tukey over one split L = L1·L2, L1 the largest divisor ≤ √L): L2 transforms of length L1,
/// a twiddle multiply, L1 transforms of length L2, each recursive, so the work is O(L·Σ factors);
/// short or prime lengths: a table matmul; long primes: Bluestein.
Cplx fft_last(const Cplx& x, int64_t L, double sign) {
  if (L <= kDftDirect) return dft_direct(x, L, L, sign);
  int64_t L1 = 1;
  for (int64_t d = static_cast<int64_t>(std::sqrt(static_cast<double>(L))) + 1; d >= 2; --d)
    if (d * d <= L && L % d == 0) {
      L1 = d;
      break;
    }
  if (L1 == 1) return L <= kDftPrimeDirect ? dft_direct(x, L, L, sign) : dft_bluestein(x, L, sign);
  const int64_t L2 = L / L1;
  SymIntVec split = x.re.sizes();
  split.back() = SymInt(L1);
  split.push_back(SymInt(L2));
  const int64_t r = static_cast<int64_t>(split.size());
  // n = n1·L2 + n2: [..., n1, n2] → [..., n2, n1], transforms over n1.
  Cplx y = map_parts(x, [&](const Tensor& t) { return transpose(reshape(t, split), r - 2, r - 1); });
  y = fft_last(y, L1, sign);
  // [..., n2, k1] times e^(sign·2πi n2·k1 / L).
  y = cmul(y, unit_table(L2, L1, sign, [L](int64_t n2, int64_t k1) { return std::pair{n2 * k1, L}; }));
  // [..., k1, n2], transforms over n2 → [..., k1, k2]; bin k = k1 + L1·k2.
  y = fft_last(map_parts(y, [&](const Tensor& t) { return transpose(t, r - 2, r - 1); }), L2, sign);
  SymIntVec joined = x.re.sizes();
  return map_parts(y, [&](const Tensor& t) { return reshape(transpose(t, r - 2, r - 1), joined); });
}

/// The DFT of the last dim of (re, im) (im undefined for a real signal), in f64 (exact to ~1e-13
/// relative for lengths up to 2^24): X[k] = Σ_n x[n] e^(∓2πi nk / L), k < L (or < L/2 + 1 when
/// onesided), divided by L when inverse. The last dim is zero-padded or truncated to L first. Short
/// transforms are one table matmul; longer ones the recursive fft_last. Returns (re, im) in f64.
std::pair<Tensor, Tensor> dft_last(Tensor re, Tensor im, int64_t L, bool onesided, bool inverse) {
  int64_t len = re.size(re.dim() - 1).guard_int();
  auto fit = [&](Tensor t) {
    if (!t.defined()) return t;
    t = cast(t, DType::F64);
    if (L < len) return slice(t, t.dim() - 1, 0, L);
    if (L > len) {
      SymIntVec zs = t.sizes();
      zs.back() = SymInt(L - len);
      return cat({t, full(zs, 0.0, DType::F64)}, t.dim() - 1);
    }
    return t;
  };
  if (L > kDftMaxLength)
    throw NotImplementedError(fmt::format("DFT of length {} (at most 2^24 points)", L));
  Cplx x{fit(re), fit(im)};
  const int64_t K = onesided ? L / 2 + 1 : L;
  const double sign = inverse ? 1.0 : -1.0;
  Cplx y;
  if (L <= kDftDirect) {
    y = dft_direct(x, L, K, sign);
  } else {
    y = fft_last(x, L, sign);
    if (K < L) y = map_parts(y, [&](const Tensor& t) { return slice(t, t.dim() - 1, 0, K); });
  }
  if (inverse) y = map_parts(y, [L](const Tensor& t) { return mul(t, 1.0 / static_cast<double>(L)); });
  return {y.re, y.im};
}

/// DFT (opset 17: axis attribute, default 1; opset 20: axis input, default -2). The signal is
/// [batch, ..., 1] (real) or [..., 2] (complex); axis counts over every dim but the last (negative:
/// from the end of the whole rank, as opset 20 specifies). dft_length pads or truncates.
std::vector<Value> op_dft(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  const int64_t r = x.dim();
  if (r < 2) throw ShapeError(fmt::format("DFT input must have rank >= 2 ([..., 1] or [..., 2]), got {}", to_string(x.sizes())));
  const int64_t c = x.size(r - 1).guard_int();
  if (c != 1 && c != 2) throw ShapeError(fmt::format("DFT input's last dim must be 1 (real) or 2 (complex), got {}", c));
  if (!is_floating(x.dtype())) throw TypeError(fmt::format("DFT takes a floating tensor, got {}", short_name(x.dtype())));
  int64_t axis = n.opset >= 20 ? -2 : n.get_int("axis", 1);
  if (n.opset >= 20 && opt(in, 2)) axis = read_concrete_ints(*opt(in, 2), "DFT axis").at(0);
  const int64_t given = axis;
  if (axis < 0) axis += r;
  if (axis < 0 || axis > r - 2)
    throw ValueError(fmt::format("DFT axis {} is out of range for an input of rank {} (the last dim holds the "
                                 "real/imaginary parts)", given, r));
  const bool inverse = n.get_int("inverse", 0) != 0, onesided = n.get_int("onesided", 0) != 0;
  if (onesided && c == 2) throw ValueError("DFT onesided=1 takes a real signal (last dim 1), got a complex one");
  if (onesided && inverse) throw NotImplementedError("DFT with onesided=1 and inverse=1 (a complex-to-real inverse)");
  int64_t L = x.size(axis).guard_int();
  if (opt(in, 1)) L = read_concrete_ints(*opt(in, 1), "DFT dft_length").at(0);
  if (L < 1) throw ValueError(fmt::format("DFT dft_length must be >= 1, got {}", L));
  // The transformed axis last: [..., L].
  IntVec perm, back(static_cast<size_t>(r - 1));
  for (int64_t d = 0; d < r - 1; ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  for (size_t i = 0; i < perm.size(); ++i) back[static_cast<size_t>(perm[i])] = static_cast<int64_t>(i);
  Tensor re = permute(select(x, r - 1, 0), perm);
  Tensor im = c == 2 ? permute(select(x, r - 1, 1), perm) : Tensor();
  auto [yr, yi] = dft_last(re, im, L, onesided, inverse);
  Tensor y = stack({permute(yr, back), permute(yi, back)}, r - 1);
  return one(cast(y, x.dtype()));
}

/// STFT (opset 17): frames of frame_length samples every frame_step, times the window, each through
/// the DFT: signal [batch, length, 1 or 2] → [batch, frames, bins, 2], bins = frame_length / 2 + 1 when
/// onesided (the default; real signals only), else frame_length. The frames are one index_select.
std::vector<Value> op_stft(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() != 3) throw ShapeError(fmt::format("STFT signal must be [batch, length, 1 or 2], got {}", to_string(x.sizes())));
  const int64_t c = x.size(2).guard_int();
  if (c != 1 && c != 2) throw ShapeError(fmt::format("STFT signal's last dim must be 1 or 2, got {}", c));
  const int64_t step = read_concrete_ints(need(n, in, 1), "STFT frame_step").at(0);
  Tensor window = topt(in, 2);
  int64_t flen = -1;
  if (opt(in, 3)) flen = read_concrete_ints(*opt(in, 3), "STFT frame_length").at(0);
  if (window.defined()) {
    if (window.dim() != 1) throw ShapeError(fmt::format("STFT window must be 1-D, got {}", to_string(window.sizes())));
    int64_t wl = window.size(0).guard_int();
    if (flen >= 0 && flen != wl)
      throw ShapeError(fmt::format("STFT window has {} samples, frame_length is {}", wl, flen));
    flen = wl;
  }
  if (flen < 1) throw ValueError("STFT needs a frame_length or a window (a frame of >= 1 samples)");
  if (step < 1) throw ValueError(fmt::format("STFT frame_step must be >= 1, got {}", step));
  const int64_t len = x.size(1).guard_int();
  if (flen > len) throw ShapeError(fmt::format("STFT frame_length {} exceeds the signal length {}", flen, len));
  const bool onesided = n.get_int("onesided", 1) != 0;
  if (onesided && c == 2) throw ValueError("STFT onesided=1 takes a real signal (last dim 1), got a complex one");
  const int64_t frames = (len - flen) / step + 1;
  std::vector<int64_t> idx;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t j = 0; j < flen; ++j) idx.push_back(f * step + j);
  Tensor fr = reshape(index_select(x, 1, tensor<int64_t>(idx, {frames * flen})), {x.size(0), SymInt(frames), SymInt(flen), SymInt(c)});
  Tensor re = select(fr, 3, 0), im = c == 2 ? select(fr, 3, 1) : Tensor();
  if (window.defined()) {
    Tensor w = cast(window, DType::F64);
    re = mul(cast(re, DType::F64), w);
    if (im.defined()) im = mul(cast(im, DType::F64), w);
  }
  auto [yr, yi] = dft_last(re, im, flen, onesided, false);
  return one(cast(stack({yr, yi}, 3), x.dtype()));
}

// ---- random ops ------------------------------------------------------------------------------------------------
/// The Philox seed of a random op: its `seed` attribute's float bits when it has one (Dropout's int seed
/// as it is), else a fresh seed
/// per evaluation of the node (a compiled model replays the numbers it drew when it was traced).
int64_t random_seed(const Node& n) {
  if (const Attr* a = n.attr("seed"); a && a->type == Attr::Type::Int) return a->i & 0xffffffff;  // Dropout's int seed
  if (n.attr("seed")) {
    float f = static_cast<float>(n.get_float("seed", 0.0));
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    return static_cast<int64_t>(bits);
  }
  static std::atomic<int64_t> next{0x5eed0000};
  return next.fetch_add(1);
}
DType random_dtype(const Node& n, DType dflt, const char* key = "dtype") {
  if (!n.attr(key)) return dflt;
  std::optional<DType> dt = dtype_from_onnx(static_cast<int32_t>(n.get_int(key, 1)));
  if (!dt) throw NotImplementedError(fmt::format("{} {}={}", n.op_type, key, onnx_type_name(static_cast<int32_t>(n.get_int(key, 1)))));
  return *dt;
}
/// Bernoulli: 1 where a uniform [0, 1) number is below the probability, else 0, in `dtype` (default:
/// the input's). The numbers come from philox_uniform with the node's seed.
std::vector<Value> op_bernoulli(const Node& n, const Inputs& in) {
  Tensor p = tin(n, in, 0);
  if (!is_floating(p.dtype())) throw TypeError(fmt::format("Bernoulli takes floating probabilities, got {}", short_name(p.dtype())));
  DType dt = random_dtype(n, p.dtype());
  Tensor u = philox_uniform(p.sizes(), random_seed(n), 0, DType::F64);
  return one(cast(lt(u, cast(p, DType::F64)), dt));
}
/// Multinomial: sample_size draws per batch row from the categorical distribution whose unnormalized
/// log-probabilities are the row (input [batch, class_size]); output [batch, sample_size] in `dtype`
/// (int32 by default, or int64). Draw j of row b is the first class whose cumulative probability
/// exceeds a uniform [0, 1) number from philox_uniform with the node's seed (the inverse-CDF rule, as
/// ONNX Runtime's sampler), computed in f64 over a [batch, sample_size, class_size] comparison.
std::vector<Value> op_multinomial(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (!is_floating(x.dtype())) throw TypeError(fmt::format("Multinomial takes floating log-probabilities, got {}", short_name(x.dtype())));
  if (x.dim() != 2) throw ShapeError(fmt::format("Multinomial input must be [batch, class_size], got {}", to_string(x.sizes())));
  const int64_t samples = n.get_int("sample_size", 1);
  if (samples < 1) throw ValueError(fmt::format("Multinomial sample_size must be >= 1, got {}", samples));
  DType dt = random_dtype(n, DType::I32);
  if (dt != DType::I32 && dt != DType::I64)
    throw TypeError(fmt::format("Multinomial dtype must be int32 or int64, got {}", short_name(dt)));
  if (static_cast<bool>(x.size(1) == 0)) throw ShapeError("Multinomial over zero classes");
  Tensor cdf = cumsum(softmax(cast(x, DType::F64), 1), 1);                         // [B, C]
  Tensor u = philox_uniform({x.size(0), SymInt(samples)}, random_seed(n), 0, DType::F64);  // [B, S]
  Tensor below = le(unsqueeze(cdf, 1), unsqueeze(u, 2));                            // [B, S, C]
  Tensor k = sum(cast(below, DType::I64), {2});
  // Rounding can leave the last cumulative probability just below a u close to 1: the last class.
  Tensor last = reshape(sub(arange(x.size(1), x.size(1) + 1, 1, DType::I64), 1), {});
  return one(cast(minimum(k, last), dt));
}
/// RandomUniform / RandomUniformLike: low + (high - low) * u; RandomNormal / RandomNormalLike: mean +
/// scale * sqrt(-2 ln(1 - u1)) cos(2π u2) (Box–Muller), u1 and u2 from disjoint Philox counters.
std::vector<Value> op_random(const Node& n, const Inputs& in) {
  const bool like = n.op_type.ends_with("Like"), normal = n.op_type.starts_with("RandomNormal");
  SymIntVec shape;
  DType dt;
  if (like) {
    Tensor x = tin(n, in, 0);
    shape = x.sizes();
    dt = random_dtype(n, x.dtype());
  } else {
    for (int64_t s : n.get_ints("shape")) shape.push_back(SymInt(s));
    dt = random_dtype(n, DType::F32);
  }
  if (!is_floating(dt)) throw TypeError(fmt::format("{} makes floating tensors, got dtype {}", n.op_type, short_name(dt)));
  const int64_t seed = random_seed(n);
  Tensor u = philox_uniform(shape, seed, 0, DType::F64);
  if (!normal) {
    double lo = n.get_float("low", 0.0), hi = n.get_float("high", 1.0);
    return one(cast(add(mul(u, hi - lo), scalar_tensor(lo, DType::F64)), dt));
  }
  SymInt numel = 1;
  for (const auto& s : shape) numel = numel * s;
  Tensor u2 = philox_uniform(shape, seed, numel, DType::F64);
  Tensor rad = sqrt(mul(log(sub(scalar_tensor(1.0, DType::F64), u)), -2.0));
  Tensor z = mul(rad, cos(mul(u2, 2.0 * M_PI)));
  double mean = n.get_float("mean", 0.0), scale = n.get_float("scale", 1.0);
  return one(cast(add(mul(z, scale), scalar_tensor(mean, DType::F64)), dt));
}

// ---- TfIdfVectorizer -------------------------------------------------------------------------------------------
/// TfIdfVectorizer on integer tokens (pool_int64s). For each n-gram length n in [min_gram_length,
/// max_gram_length] and each skip s in [0, max_skip_count] (unigrams: once), an n-gram starts at every
/// position i whose tokens i, i + (s+1), ..., i + (n-1)(s+1) are in the row; each one equal to a pool
/// entry counts for that entry. Counts go to the output column ngram_indexes names (a one-hot matmul);
/// mode TF: the count, IDF: weight where the count > 0, TFIDF: count * weight (weights default 1;
/// weights[i] is the i-th pool n-gram's). X [C] → [O], X [N, C] → [N, O], O = max(ngram_indexes) + 1, f32.
std::vector<Value> op_tfidf(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (!is_integral(x.dtype()))
    throw NotImplementedError(fmt::format("TfIdfVectorizer on {} input (integer tokens only; strings have no tensor type here)",
                                          short_name(x.dtype())));
  if (n.attr("pool_strings")) throw NotImplementedError("TfIdfVectorizer with pool_strings");
  if (x.dim() != 1 && x.dim() != 2) throw ShapeError(fmt::format("TfIdfVectorizer input must be [C] or [N, C], got {}", to_string(x.sizes())));
  const bool one_d = x.dim() == 1;
  Tensor X = cast(one_d ? unsqueeze(x, 0) : x, DType::I64);
  const int64_t C = X.size(1).guard_int();
  const int64_t min_n = n.get_int("min_gram_length", 1), max_n = n.get_int("max_gram_length", 1);
  const int64_t max_skip = n.get_int("max_skip_count", 0);
  std::string mode = n.get_string("mode", "TF");
  if (mode != "TF" && mode != "IDF" && mode != "TFIDF") throw ValueError(fmt::format("TfIdfVectorizer mode '{}' (TF, IDF or TFIDF)", mode));
  IntVec pool = n.get_ints("pool_int64s"), starts = n.get_ints("ngram_counts"), outs = n.get_ints("ngram_indexes");
  std::vector<double> weights;
  if (const Attr* w = n.attr("weights")) weights.assign(w->floats.begin(), w->floats.end());
  if (min_n < 1 || max_n < min_n || max_skip < 0)
    throw ValueError(fmt::format("TfIdfVectorizer gram lengths [{}, {}] / max_skip_count {}", min_n, max_n, max_skip));
  int64_t O = 0;
  for (int64_t o : outs) {
    if (o < 0) throw ValueError(fmt::format("TfIdfVectorizer ngram_indexes holds {}", o));
    O = std::max(O, o + 1);
  }
  // The pool's n-grams in order: (length, first token position).
  std::vector<std::pair<int64_t, int64_t>> grams;
  for (size_t l = 0; l < starts.size(); ++l) {
    int64_t b = starts[l], e = l + 1 < starts.size() ? starts[l + 1] : static_cast<int64_t>(pool.size());
    int64_t len = static_cast<int64_t>(l) + 1;
    if (b < 0 || e < b || e > static_cast<int64_t>(pool.size()) || (e - b) % len != 0)
      throw ValueError(fmt::format("TfIdfVectorizer ngram_counts {} does not split a pool of {} tokens into {}-grams",
                                   to_string(to_symint_vec(starts)), pool.size(), len));
    for (int64_t p = b; p < e; p += len) grams.emplace_back(len, p);
  }
  if (grams.size() != outs.size())
    throw ValueError(fmt::format("TfIdfVectorizer: {} pool n-grams but {} ngram_indexes", grams.size(), outs.size()));
  if (!weights.empty() && weights.size() != grams.size())
    throw ValueError(fmt::format("TfIdfVectorizer: {} weights for {} pool n-grams", weights.size(), grams.size()));
  // counts [N, G] (f32), one column per pool n-gram, lengths outside [min, max] stay 0.
  TensorList cols;
  size_t g0 = 0;
  const SymInt N = X.size(0);
  while (g0 < grams.size()) {
    const int64_t len = grams[g0].first;
    size_t g1 = g0;
    while (g1 < grams.size() && grams[g1].first == len) ++g1;
    const int64_t P = static_cast<int64_t>(g1 - g0);
    Tensor cnt = full({N, SymInt(P)}, 0.0, DType::F32);
    if (len >= min_n && len <= max_n) {
      for (int64_t s = 0; s <= (len == 1 ? 0 : max_skip); ++s) {
        const int64_t span = (len - 1) * (s + 1), M = C - span;
        if (M <= 0) break;
        Tensor match;
        for (int64_t j = 0; j < len; ++j) {
          std::vector<int64_t> tok;
          for (size_t g = g0; g < g1; ++g) tok.push_back(pool[static_cast<size_t>(grams[g].second + j)]);
          Tensor w = unsqueeze(slice(X, 1, j * (s + 1), j * (s + 1) + M), 1);       // [N, 1, M]
          Tensor e = eq(w, tensor<int64_t>(tok, {1, P, 1}));                        // [N, P, M]
          match = j == 0 ? e : logical_and(match, e);
        }
        cnt = add(cnt, sum(cast(match, DType::F32), {2}));
      }
    }
    cols.push_back(cnt);
    g0 = g1;
  }
  Tensor counts = cols.size() == 1 ? cols[0] : cat(cols, 1);  // [N, G]
  const int64_t G = static_cast<int64_t>(grams.size());
  std::vector<float> w(static_cast<size_t>(G), 1.0f);
  for (size_t i = 0; i < weights.size(); ++i) w[i] = static_cast<float>(weights[i]);
  Tensor wt = tensor<float>(w, {G});
  Tensor val = mode == "TF" ? counts
               : mode == "IDF" ? mul(cast(gt(counts, scalar_tensor(0.0, DType::F32)), DType::F32), wt)
                               : mul(counts, wt);
  std::vector<float> onehot(static_cast<size_t>(G * O), 0.0f);
  for (int64_t g = 0; g < G; ++g) onehot[static_cast<size_t>(g * O + outs[static_cast<size_t>(g)])] = 1.0f;
  Tensor y = matmul(val, tensor<float>(onehot, {G, O}));
  return one(one_d ? squeeze(y, {0}) : y);
}

// ---- GridSample ----------------------------------------------------------------------------------------------
/// A grid coordinate through the padding mode: border clips to [0, size - 1]; reflection reflects
/// about the edges (align_corners: 0 and size - 1, else -0.5 and size - 0.5), then clips.
Tensor grid_pad_coord(const Tensor& x, int64_t size, const std::string& padding, bool align) {
  if (padding == "zeros") return x;
  Tensor c = x;
  if (padding == "reflection") {
    double lo = align ? 0.0 : -0.5, hi = align ? static_cast<double>(size - 1) : static_cast<double>(size) - 0.5;
    double span = hi - lo;
    if (span <= 0) return mul(x, 0.0);
    Tensor a = abs(sub(x, lo));
    Tensor flips = floor(div(a, span));
    Tensor extra = sub(a, mul(flips, span));
    Tensor even = eq(sub(flips, mul(floor(div(flips, 2.0)), 2.0)), wrap_scalar(0.0, flips));
    c = where(even, add(extra, lo), sub(wrap_scalar(span + lo, extra), extra));
  }
  return clamp(c, 0.0, static_cast<double>(size - 1));
}

/// X's values at integer (float-held) coordinates xi, yi [N, Ho, Wo] → [N, C, Ho, Wo]; positions
/// outside the input read 0.
Tensor grid_fetch(const Tensor& X, const Tensor& xi, const Tensor& yi, int64_t H, int64_t W) {
  Tensor inside = logical_and(logical_and(ge(xi, wrap_scalar(0.0, xi)), le(xi, wrap_scalar(static_cast<double>(W - 1), xi))),
                              logical_and(ge(yi, wrap_scalar(0.0, yi)), le(yi, wrap_scalar(static_cast<double>(H - 1), yi))));
  Tensor xc = cast(clamp(xi, 0.0, static_cast<double>(W - 1)), DType::I64);
  Tensor yc = cast(clamp(yi, 0.0, static_cast<double>(H - 1)), DType::I64);
  Tensor lin = add(mul(yc, scalar_tensor(static_cast<double>(W), DType::I64)), xc);  // [N, Ho, Wo]
  SymInt N = X.size(0), C = X.size(1), Ho = xi.size(1), Wo = xi.size(2);
  Tensor idx = expand(reshape(lin, {N, SymInt(1), Ho * Wo}), {N, C, Ho * Wo});
  Tensor v = reshape(gather(reshape(X, {N, C, SymInt(H * W)}), 2, idx), {N, C, Ho, Wo});
  return where(unsqueeze(inside, 1), v, scalar_tensor(0.0, X.dtype()));
}

/// GridSample (2-D, as PyTorch's grid_sample): modes bilinear / nearest (half to even) / bicubic
/// (A = -0.75), padding zeros / border / reflection, align_corners.
/// X [N, C, D, H, W]'s values at integer (float-held) coordinates zi, yi, xi [N, Do, Ho, Wo] →
/// [N, C, Do, Ho, Wo]; positions outside the input read 0.
Tensor grid_fetch3(const Tensor& X, const Tensor& xi, const Tensor& yi, const Tensor& zi, int64_t D, int64_t H, int64_t W) {
  auto in_range = [](const Tensor& c, int64_t size) {
    return logical_and(ge(c, wrap_scalar(0.0, c)), le(c, wrap_scalar(static_cast<double>(size - 1), c)));
  };
  Tensor inside = logical_and(logical_and(in_range(xi, W), in_range(yi, H)), in_range(zi, D));
  auto at = [&](const Tensor& c, int64_t size) { return cast(clamp(c, 0.0, static_cast<double>(size - 1)), DType::I64); };
  Tensor lin = add(mul(add(mul(at(zi, D), scalar_tensor(static_cast<double>(H), DType::I64)), at(yi, H)),
                       scalar_tensor(static_cast<double>(W), DType::I64)), at(xi, W));  // [N, Do, Ho, Wo]
  SymInt N = X.size(0), C = X.size(1), Do = xi.size(1), Ho = xi.size(2), Wo = xi.size(3);
  SymInt P = Do * Ho * Wo;
  Tensor idx = expand(reshape(lin, {N, SymInt(1), P}), {N, C, P});
  Tensor v = reshape(gather(reshape(X, {N, C, SymInt(D * H * W)}), 2, idx), {N, C, Do, Ho, Wo});
  return where(unsqueeze(inside, 1), v, scalar_tensor(0.0, X.dtype()));
}

/// Volumetric GridSample (X [N, C, D, H, W], grid [N, Do, Ho, Wo, 3] as (x, y, z)): linear (trilinear,
/// 8 taps) or nearest (half to even), every padding mode, as PyTorch's 5-D grid_sample; cubic (2-D
/// only, as PyTorch's bicubic) is refused naming the mode.
Tensor grid_sample3d(const Node& n, const Tensor& X, const Tensor& g, const std::string& mode,
                     const std::string& padding, bool align) {
  int64_t D = X.size(2).guard_int(), H = X.size(3).guard_int(), W = X.size(4).guard_int();
  auto unnorm = [&](const Tensor& c, int64_t size) {
    double sz = static_cast<double>(size);
    return align ? mul(add(c, 1.0), (sz - 1) / 2.0) : div(sub(mul(add(c, 1.0), sz), 1.0), 2.0);
  };
  Tensor ix = grid_pad_coord(unnorm(select(g, 4, 0), W), W, padding, align);
  Tensor iy = grid_pad_coord(unnorm(select(g, 4, 1), H), H, padding, align);
  Tensor iz = grid_pad_coord(unnorm(select(g, 4, 2), D), D, padding, align);
  if (mode == "nearest") return grid_fetch3(X, round(ix), round(iy), round(iz), D, H, W);
  if (mode != "bilinear")
    throw NotImplementedError(fmt::format("GridSample mode '{}' on a 5-D input (linear and nearest)", n.get_string("mode", "")));
  Tensor x0 = floor(ix), y0 = floor(iy), z0 = floor(iz);
  Tensor f[3] = {sub(ix, x0), sub(iy, y0), sub(iz, z0)};
  Tensor y;
  for (int corner = 0; corner < 8; ++corner) {
    int bx = corner & 1, by = (corner >> 1) & 1, bz = (corner >> 2) & 1;
    auto wt = [](const Tensor& t, int hi) { return hi ? t : sub(wrap_scalar(1.0, t), t); };
    Tensor w = mul(mul(wt(f[0], bx), wt(f[1], by)), wt(f[2], bz));
    Tensor v = grid_fetch3(X, add(x0, double(bx)), add(y0, double(by)), add(z0, double(bz)), D, H, W);
    Tensor term = mul(v, unsqueeze(w, 1));
    y = y.defined() ? add(y, term) : term;
  }
  return y;
}

std::vector<Value> op_grid_sample(const Node& n, const Inputs& in) {
  Tensor X = tin(n, in, 0), grid = tin(n, in, 1);
  bool vol = X.dim() == 5 && grid.dim() == 5;
  if (!vol && (X.dim() != 4 || grid.dim() != 4))
    throw NotImplementedError(fmt::format("GridSample on X {} and grid {} (2-D and 3-D only)", to_string(X.sizes()),
                                          to_string(grid.sizes())));
  if (!is_floating(X.dtype())) throw TypeError("GridSample takes floating-point X");
  std::string mode = n.get_string("mode", "bilinear");
  if (mode == "linear") mode = "bilinear";
  if (mode == "cubic") mode = "bicubic";
  std::string padding = n.get_string("padding_mode", "zeros");
  if (padding != "zeros" && padding != "border" && padding != "reflection")
    throw ValueError(fmt::format("GridSample padding_mode '{}'", padding));
  bool align = n.get_int("align_corners", 0) != 0;
  Tensor g = grid.dtype() == X.dtype() ? grid : cast(grid, X.dtype());
  if (vol) return one(grid_sample3d(n, X, g, mode, padding, align));
  int64_t H = X.size(2).guard_int(), W = X.size(3).guard_int();
  auto unnorm = [&](const Tensor& c, int64_t size) {
    double sz = static_cast<double>(size);
    return align ? mul(add(c, 1.0), (sz - 1) / 2.0) : div(sub(mul(add(c, 1.0), sz), 1.0), 2.0);
  };
  Tensor ix = unnorm(select(g, 3, 0), W), iy = unnorm(select(g, 3, 1), H);
  if (mode == "nearest") {
    ix = round(grid_pad_coord(ix, W, padding, align));
    iy = round(grid_pad_coord(iy, H, padding, align));
    return one(grid_fetch(X, ix, iy, H, W));
  }
  if (mode == "bilinear") {
    ix = grid_pad_coord(ix, W, padding, align);
    iy = grid_pad_coord(iy, H, padding, align);
    Tensor x0 = floor(ix), y0 = floor(iy);
    Tensor tx = sub(ix, x0), ty = sub(iy, y0);
    Tensor x1 = add(x0, 1.0), y1 = add(y0, 1.0);
    Tensor ux = sub(wrap_scalar(1.0, tx), tx), uy = sub(wrap_scalar(1.0, ty), ty);
    auto w = [](const Tensor& a, const Tensor& b) { return unsqueeze(mul(a, b), 1); };
    Tensor y = mul(grid_fetch(X, x0, y0, H, W), w(ux, uy));
    y = add(y, mul(grid_fetch(X, x1, y0, H, W), w(tx, uy)));
    y = add(y, mul(grid_fetch(X, x0, y1, H, W), w(ux, ty)));
    y = add(y, mul(grid_fetch(X, x1, y1, H, W), w(tx, ty)));
    return one(y);
  }
  if (mode != "bicubic") throw ValueError(fmt::format("GridSample mode '{}'", mode));
  const double A = -0.75;
  auto coeffs = [&](const Tensor& t) {
    auto cc1 = [&](const Tensor& v) { return add(mul(mul(sub(mul(v, A + 2), A + 3), v), v), 1.0); };
    auto cc2 = [&](const Tensor& v) { return sub(mul(add(mul(sub(mul(v, A), 5 * A), v), 8 * A), v), 4 * A); };
    Tensor one_minus = sub(wrap_scalar(1.0, t), t);
    return std::array<Tensor, 4>{cc2(add(t, 1.0)), cc1(t), cc1(one_minus), cc2(add(one_minus, 1.0))};
  };
  Tensor x0 = floor(ix), y0 = floor(iy);
  std::array<Tensor, 4> cx = coeffs(sub(ix, x0)), cy = coeffs(sub(iy, y0));
  Tensor y;
  for (int j = 0; j < 4; ++j) {
    Tensor yj = grid_pad_coord(add(y0, static_cast<double>(j - 1)), H, padding, align);
    for (int i = 0; i < 4; ++i) {
      Tensor xi = grid_pad_coord(add(x0, static_cast<double>(i - 1)), W, padding, align);
      Tensor term = mul(grid_fetch(X, xi, yj, H, W), unsqueeze(mul(cx[static_cast<size_t>(i)], cy[static_cast<size_t>(j)]), 1));
      y = y.defined() ? add(y, term) : term;
    }
  }
  return one(y);
}

// ---- CenterCropPad / AffineGrid / DeformConv ------------------------------------------------------------------
/// CenterCropPad (opset 18): each listed axis (all by default) brought to `shape`'s size around its
/// centre: a larger dim is cropped from (dim - size) / 2 (rounded down), a smaller one padded with
/// zeros, (size - dim) / 2 (rounded down) before and the rest after, as ONNX's reference does.
std::vector<Value> op_center_crop_pad(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  IntVec shape = read_concrete_ints(need(n, in, 1), "CenterCropPad shape");
  IntVec axes = n.get_ints("axes", {});
  if (axes.empty())
    for (int64_t i = 0; i < x.dim(); ++i) axes.push_back(i);
  if (axes.size() != shape.size())
    throw ShapeError(fmt::format("CenterCropPad: shape has {} entries for {} axes", shape.size(), axes.size()));
  std::set<int64_t> seen;
  for (size_t j = 0; j < axes.size(); ++j) {
    int64_t ax = norm_axis(axes[j], x.dim(), "CenterCropPad axis");
    if (!seen.insert(ax).second) throw ValueError(fmt::format("CenterCropPad: axis {} is listed twice", ax));
    int64_t want = shape[j], have = x.size(ax).guard_int();
    if (want < 0) throw ValueError(fmt::format("CenterCropPad: negative size {} for axis {}", want, ax));
    if (want < have) {
      int64_t start = (have - want) / 2;
      x = slice(x, ax, start, start + want);
    } else if (want > have) {
      int64_t before = (want - have) / 2;
      SymIntVec p(static_cast<size_t>(2 * (x.dim() - ax)), SymInt(0));
      p[p.size() - 2] = before;
      p[p.size() - 1] = want - have - before;
      x = pad(x, p, "constant", 0.0);
    }
  }
  return one(x);
}

/// AffineGrid (opset 20): the sampling grid [N, H, W, 2] (or [N, D, H, W, 3]) of theta [N, 2, 3] (or
/// [N, 3, 4]) applied to the normalized coordinates of an image of `size` [N, C, H, W] (or [N, C, D,
/// H, W]), as PyTorch's affine_grid: coordinates span [-1, 1] through the pixel centres
/// ((2 i + 1) / S - 1), or through the corner pixels with align_corners; the last dim is (x, y[, z]).
std::vector<Value> op_affine_grid(const Node& n, const Inputs& in) {
  Tensor theta = tin(n, in, 0);
  IntVec size = read_concrete_ints(need(n, in, 1), "AffineGrid size");
  bool align = n.get_int("align_corners", 0) != 0;
  if (size.size() != 4 && size.size() != 5)
    throw NotImplementedError(fmt::format("AffineGrid size with {} entries (4 for 2-D, 5 for 3-D)", size.size()));
  int64_t sp = static_cast<int64_t>(size.size()) - 2;
  if (!is_floating(theta.dtype())) throw TypeError(fmt::format("AffineGrid theta must be floating, got {}", short_name(theta.dtype())));
  if (theta.dim() != 3 || theta.size(1).guard_int() != sp || theta.size(2).guard_int() != sp + 1)
    throw ShapeError(fmt::format("AffineGrid theta {} for size of {} dims (needs [N, {}, {}])", to_string(theta.sizes()),
                                 size.size(), sp, sp + 1));
  if (theta.size(0).guard_int() != size[0])
    throw ShapeError(fmt::format("AffineGrid theta has {} matrices for a batch of {}", theta.size(0).guard_int(), size[0]));
  DType dt = theta.dtype();
  // One coordinate vector per spatial dim, fastest first (x over W, y over H, z over D).
  auto coords = [&](int64_t S) {
    Tensor i = cast(arange(S), DType::F64);
    Tensor c = align ? (S > 1 ? sub(mul(i, 2.0 / static_cast<double>(S - 1)), 1.0) : sub(mul(i, 0.0), 1.0))
                     : sub(div(add(mul(i, 2.0), 1.0), static_cast<double>(S)), 1.0);
    return cast(c, dt);
  };
  SymIntVec spatial;
  for (int64_t i = 2; i < 2 + sp; ++i) spatial.emplace_back(size[static_cast<size_t>(i)]);
  TensorList parts;
  for (int64_t j = 0; j < sp; ++j) {  // j = 0 is x (the last spatial dim)
    int64_t d = sp - 1 - j;
    SymIntVec shp(static_cast<size_t>(sp), SymInt(1));
    shp[static_cast<size_t>(d)] = spatial[static_cast<size_t>(d)];
    parts.push_back(expand(reshape(coords(size[static_cast<size_t>(2 + d)]), shp), spatial));
  }
  parts.push_back(full(spatial, 1.0, dt));
  SymInt points = 1;
  for (const auto& d : spatial) points = points * d;
  Tensor base = reshape(stack(parts, sp), {SymInt(1), points, SymInt(sp + 1)});
  Tensor g = matmul(expand(base, {theta.size(0), points, SymInt(sp + 1)}), transpose(theta, 1, 2));
  SymIntVec out{theta.size(0)};
  for (const auto& d : spatial) out.push_back(d);
  out.emplace_back(sp);
  return one(reshape(g, out));
}

/// X's values at float-held integer positions (yi, xi) [N, G, K, P] for offset group g's channels:
/// X [N, G, Cg, H * W] → [N, G, Cg, K, P]; positions outside the image read 0.
Tensor deform_fetch(const Tensor& Xg, const Tensor& yi, const Tensor& xi, int64_t H, int64_t W) {
  Tensor inside = logical_and(logical_and(ge(xi, wrap_scalar(0.0, xi)), le(xi, wrap_scalar(static_cast<double>(W - 1), xi))),
                              logical_and(ge(yi, wrap_scalar(0.0, yi)), le(yi, wrap_scalar(static_cast<double>(H - 1), yi))));
  Tensor zero = wrap_scalar(0.0, xi);
  Tensor lin = add(mul(cast(where(inside, yi, zero), DType::I64), scalar_tensor(static_cast<double>(W), DType::I64)),
                   cast(where(inside, xi, zero), DType::I64));  // [N, G, K, P]
  SymInt N = Xg.size(0), G = Xg.size(1), Cg = Xg.size(2), K = yi.size(2), P = yi.size(3);
  Tensor idx = expand(reshape(lin, {N, G, SymInt(1), K * P}), {N, G, Cg, K * P});
  Tensor v = reshape(gather(Xg, 3, idx), {N, G, Cg, K, P});
  return where(reshape(inside, {N, G, SymInt(1), K, P}), v, scalar_tensor(0.0, Xg.dtype()));
}

/// DeformConv (opset 19), 2-D, as torchvision's deform_conv2d: kernel tap k of output position p
/// reads X bilinearly (zeros outside) at p * stride - pad_begin + k * dilation + offset, with the
/// offsets [N, offset_group * kH * kW * 2, oH, oW] as (dy, dx) per group and tap, times the mask
/// [N, offset_group * kH * kW, oH, oW] when given; the sampled columns [N, C * kH * kW, oH * oW] are
/// multiplied by the grouped weight, plus the bias.
std::vector<Value> op_deform_conv(const Node& n, const Inputs& in) {
  Tensor X = tin(n, in, 0), Wt = tin(n, in, 1), off = tin(n, in, 2), B = topt(in, 3), mask = topt(in, 4);
  if (X.dim() == 3 && Wt.dim() == 3 && off.dim() == 3) {
    // 1-D as 2-D with H = 1: a unit kernel height, the offsets gain a zero dy per tap (offset layout
    // (dy, dx) per group and tap), the mask and the spatial attributes a leading unit row.
    Node n2 = n;
    auto set_ints = [&](const char* name, IntVec v) {
      Attr a;
      a.type = Attr::Type::Ints;
      a.ints = std::move(v);
      n2.attrs[name] = a;
    };
    auto front = [&](const char* name, int64_t lead, int64_t dflt) {
      IntVec v = n.get_ints(name, {dflt});
      if (v.size() != 1) throw ValueError(fmt::format("DeformConv {} has {} entries for 1 spatial dim", name, v.size()));
      set_ints(name, {lead, v[0]});
    };
    front("strides", 1, 1);
    front("dilations", 1, 1);
    front("kernel_shape", 1, Wt.size(2).guard_int());
    IntVec pads = n.get_ints("pads", {0, 0});
    if (pads.size() != 2) throw ValueError(fmt::format("DeformConv pads has {} entries for 1 spatial dim", pads.size()));
    set_ints("pads", {0, pads[0], 0, pads[1]});
    SymInt N = off.size(0), OW = off.size(2);
    Tensor dx = reshape(off, {N, SymInt(-1), SymInt(1), OW});
    Tensor off2 = reshape(cat({full(dx.sizes(), 0.0, off.dtype()), dx}, 2), {N, SymInt(-1), SymInt(1), OW});
    Value vx = Value::tensor(unsqueeze(X, 2)), vw = Value::tensor(unsqueeze(Wt, 2)), vo = Value::tensor(off2);
    Value vb = B.defined() ? Value::tensor(B) : Value(), vm = mask.defined() ? Value::tensor(unsqueeze(mask, 2)) : Value();
    Inputs in2 = {&vx, &vw, &vo, B.defined() ? &vb : nullptr, mask.defined() ? &vm : nullptr};
    return one(squeeze(op_deform_conv(n2, in2).at(0).t, {2}));
  }
  if (X.dim() != 4)
    throw NotImplementedError(fmt::format("DeformConv on a rank-{} input {} (1-D and 2-D only)", X.dim(), to_string(X.sizes())));
  if (!is_floating(X.dtype())) throw TypeError(fmt::format("DeformConv takes floating X, got {}", short_name(X.dtype())));
  if (Wt.dim() != 4) throw ShapeError(fmt::format("DeformConv weight {} for a 2-D input", to_string(Wt.sizes())));
  DType dt = X.dtype();
  int64_t N = X.size(0).guard_int(), C = X.size(1).guard_int(), H = X.size(2).guard_int(), W = X.size(3).guard_int();
  int64_t O = Wt.size(0).guard_int(), KH = Wt.size(2).guard_int(), KW = Wt.size(3).guard_int();
  int64_t group = n.get_int("group", 1), og = n.get_int("offset_group", 1);
  IntVec ks = n.get_ints("kernel_shape", {KH, KW});
  if (ks != IntVec{KH, KW})
    throw ShapeError(fmt::format("DeformConv kernel_shape ({}, {}) differs from the weight's ({}, {})", ks.size() > 0 ? ks[0] : 0,
                                 ks.size() > 1 ? ks[1] : 0, KH, KW));
  if (group < 1 || og < 1 || C % group != 0 || O % group != 0 || C % og != 0 || Wt.size(1).guard_int() * group != C)
    throw ShapeError(fmt::format("DeformConv: X has {} channels, weight {}, group {}, offset_group {} (C and oC must "
                                 "divide by group, C by offset_group, weight dim 1 = C / group)", C,
                                 to_string(Wt.sizes()), group, og));
  IntVec stride = n.get_ints("strides", {1, 1}), dil = n.get_ints("dilations", {1, 1});
  IntVec pads = n.get_ints("pads", {0, 0, 0, 0});
  if (stride.size() != 2 || dil.size() != 2 || pads.size() != 4)
    throw ValueError("DeformConv strides/dilations/pads do not match 2 spatial dims");
  int64_t OH = (H + pads[0] + pads[2] - dil[0] * (KH - 1) - 1) / stride[0] + 1;
  int64_t OW = (W + pads[1] + pads[3] - dil[1] * (KW - 1) - 1) / stride[1] + 1;
  int64_t K = KH * KW, P = OH * OW;
  if (OH < 1 || OW < 1) throw ShapeError(fmt::format("DeformConv: output size {}x{} for input {}", OH, OW, to_string(X.sizes())));
  if (off.int_sizes() != IntVec{N, og * K * 2, OH, OW})
    throw ShapeError(fmt::format("DeformConv offset {} (expected [{}, {}, {}, {}])", to_string(off.sizes()), N, og * K * 2, OH, OW));
  if (mask.defined() && mask.int_sizes() != IntVec{N, og * K, OH, OW})
    throw ShapeError(fmt::format("DeformConv mask {} (expected [{}, {}, {}, {}])", to_string(mask.sizes()), N, og * K, OH, OW));
  Tensor o5 = reshape(off.dtype() == dt ? off : cast(off, dt), {SymInt(N), SymInt(og), SymInt(K), SymInt(2), SymInt(P)});
  // Base positions of tap k at output p: [1, 1, K, P].
  std::vector<float> by, bx;
  for (int64_t i = 0; i < KH; ++i)
    for (int64_t j = 0; j < KW; ++j)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          by.push_back(static_cast<float>(oh * stride[0] - pads[0] + i * dil[0]));
          bx.push_back(static_cast<float>(ow * stride[1] - pads[1] + j * dil[1]));
        }
  auto base = [&](const std::vector<float>& v) { return cast(tensor<float>(v, {1, 1, K, P}), dt); };
  Tensor y = add(base(by), select(o5, 3, 0)), x = add(base(bx), select(o5, 3, 1));  // [N, og, K, P]
  Tensor Xg = reshape(X, {SymInt(N), SymInt(og), SymInt(C / og), SymInt(H * W)});
  Tensor y0 = floor(y), x0 = floor(x);
  Tensor ty = sub(y, y0), tx = sub(x, x0);
  Tensor uy = sub(wrap_scalar(1.0, ty), ty), ux = sub(wrap_scalar(1.0, tx), tx);
  Tensor y1 = add(y0, 1.0), x1 = add(x0, 1.0);
  auto wgt = [&](const Tensor& a, const Tensor& b) { return reshape(mul(a, b), {SymInt(N), SymInt(og), SymInt(1), SymInt(K), SymInt(P)}); };
  Tensor cols = mul(deform_fetch(Xg, y0, x0, H, W), wgt(uy, ux));
  cols = add(cols, mul(deform_fetch(Xg, y0, x1, H, W), wgt(uy, tx)));
  cols = add(cols, mul(deform_fetch(Xg, y1, x0, H, W), wgt(ty, ux)));
  cols = add(cols, mul(deform_fetch(Xg, y1, x1, H, W), wgt(ty, tx)));  // [N, og, C / og, K, P]
  if (mask.defined())
    cols = mul(cols, reshape(mask.dtype() == dt ? mask : cast(mask, dt), {SymInt(N), SymInt(og), SymInt(1), SymInt(K), SymInt(P)}));
  // Grouped product: [N, group, (C / group) * K, P] with weight [group, O / group, (C / group) * K].
  Tensor c2 = reshape(cols, {SymInt(N), SymInt(group), SymInt(C / group * K), SymInt(P)});
  Tensor w2 = reshape(Wt.dtype() == dt ? Wt : cast(Wt, dt), {SymInt(1), SymInt(group), SymInt(O / group), SymInt(C / group * K)});
  Tensor out = reshape(matmul(w2, c2), {SymInt(N), SymInt(O), SymInt(OH), SymInt(OW)});
  if (B.defined()) out = add(out, reshape(B.dtype() == dt ? B : cast(B, dt), {SymInt(1), SymInt(O), SymInt(1), SymInt(1)}));
  return one(out);
}

// ---- MaxRoiPool ----------------------------------------------------------------------------------------------
/// MaxRoiPool (opset 1), as ONNX Runtime's RoiPool: each region [batch, x1, y1, x2, y2] is scaled by
/// spatial_scale and rounded (half away from zero), widened to at least one pixel, and cut into
/// pooled_shape bins with floor/ceil edges, clipped to the image; a bin's output is the largest value
/// in it, 0 for an empty bin. The regions are read on the host (a graph break under capture unless
/// they are constant) to lay out the taps; X's taps are then one gather and one max.
std::vector<Value> op_max_roi_pool(const Node& n, const Inputs& in) {
  Tensor X = tin(n, in, 0), rois = tin(n, in, 1);
  if (X.dim() != 4) throw ShapeError(fmt::format("MaxRoiPool X must be [N, C, H, W], got {}", to_string(X.sizes())));
  if (!is_floating(X.dtype())) throw TypeError(fmt::format("MaxRoiPool takes floating X, got {}", short_name(X.dtype())));
  if (rois.dim() != 2 || rois.size(1).guard_int() != 5)
    throw ShapeError(fmt::format("MaxRoiPool rois must be [num_rois, 5] (batch, x1, y1, x2, y2), got {}", to_string(rois.sizes())));
  IntVec pooled = n.get_ints("pooled_shape");
  if (pooled.size() != 2 || pooled[0] < 1 || pooled[1] < 1)
    throw ValueError(fmt::format("MaxRoiPool pooled_shape must be two sizes >= 1, got {}", to_string(to_symint_vec(pooled))));
  const double scale = n.get_float("spatial_scale", 1.0);
  const int64_t PH = pooled[0], PW = pooled[1];
  const int64_t N = X.size(0).guard_int(), H = X.size(2).guard_int(), W = X.size(3).guard_int();
  std::vector<double> rv = cast(rois, DType::F64).contiguous().to_vector<double>();
  const int64_t R = static_cast<int64_t>(rv.size() / 5);
  std::vector<int64_t> batch(static_cast<size_t>(R)), taps;  // taps: [R, PH * PW, K], padded by repeating
  std::vector<bool> empty;
  std::vector<std::vector<int64_t>> bins;
  size_t K = 1;
  for (int64_t r = 0; r < R; ++r) {
    const double* q = &rv[static_cast<size_t>(r * 5)];
    if (!(q[0] >= 0 && q[0] < static_cast<double>(N)) || q[0] != std::floor(q[0]))
      throw ValueError(fmt::format("MaxRoiPool region {} names batch {} (X has {} images)", r, q[0], N));
    batch[static_cast<size_t>(r)] = static_cast<int64_t>(q[0]);
    for (int c = 1; c < 5; ++c)
      if (!std::isfinite(q[c])) throw ValueError(fmt::format("MaxRoiPool region {} has a non-finite coordinate {}", r, q[c]));
    auto rnd = [&](double v) { return static_cast<int64_t>(std::round(v * scale)); };
    const int64_t x1 = rnd(q[1]), y1 = rnd(q[2]), x2 = rnd(q[3]), y2 = rnd(q[4]);
    const double bh = static_cast<double>(std::max<int64_t>(y2 - y1 + 1, 1)) / static_cast<double>(PH);
    const double bw = static_cast<double>(std::max<int64_t>(x2 - x1 + 1, 1)) / static_cast<double>(PW);
    auto clip = [](int64_t v, int64_t hi) { return std::min(std::max<int64_t>(v, 0), hi); };
    for (int64_t ph = 0; ph < PH; ++ph)
      for (int64_t pw = 0; pw < PW; ++pw) {
        const int64_t hs = clip(static_cast<int64_t>(std::floor(static_cast<double>(ph) * bh)) + y1, H);
        const int64_t he = clip(static_cast<int64_t>(std::ceil(static_cast<double>(ph + 1) * bh)) + y1, H);
        const int64_t ws = clip(static_cast<int64_t>(std::floor(static_cast<double>(pw) * bw)) + x1, W);
        const int64_t we = clip(static_cast<int64_t>(std::ceil(static_cast<double>(pw + 1) * bw)) + x1, W);
        std::vector<int64_t> t;
        for (int64_t h = hs; h < he; ++h)
          for (int64_t w = ws; w < we; ++w) t.push_back(h * W + w);
        empty.push_back(t.empty());
        if (t.empty()) t.push_back(0);
        K = std::max(K, t.size());
        bins.push_back(std::move(t));
      }
  }
  if (static_cast<double>(bins.size()) * static_cast<double>(K) > 1e8)
    throw ValueError(fmt::format("MaxRoiPool: {} bins of up to {} pixels each is too many taps to lay out", bins.size(), K));
  for (const auto& t : bins)
    for (size_t j = 0; j < K; ++j) taps.push_back(t[std::min(j, t.size() - 1)]);
  const SymInt C = X.size(1);
  const int64_t B = PH * PW;
  Tensor planes = index_select(reshape(X, {SymInt(N), C, SymInt(H * W)}), 0, tensor<int64_t>(batch, {R}));  // [R, C, HW]
  Tensor idx = expand(reshape(tensor<int64_t>(taps, {R, B * static_cast<int64_t>(K)}), {SymInt(R), SymInt(1), SymInt(B * static_cast<int64_t>(K))}),
                      {SymInt(R), C, SymInt(B * static_cast<int64_t>(K))});
  Tensor m = amax(reshape(gather(planes, 2, idx), {SymInt(R), C, SymInt(B), SymInt(static_cast<int64_t>(K))}), {3});
  std::vector<bool> e = empty;
  Tensor zero = reshape(tensor<bool>(e, {R * B}), {SymInt(R), SymInt(1), SymInt(B)});
  m = where(zero, wrap_scalar(0.0, m), m);
  return one(reshape(m, {SymInt(R), C, SymInt(PH), SymInt(PW)}));
}

// ---- Optional ----------------------------------------------------------------------------------------------
/// Optional (opset 15): an optional holding its input, or the empty optional (no input; the `type`
/// attribute then names what it would hold). An optional is carried as its value; empty is a value of
/// kind None, which only OptionalHasElement and OptionalGetElement accept.
std::vector<Value> op_optional(const Node& n, const Inputs& in) {
  if (const Value* v = opt(in, 0)) return one(*v);
  return one(Value());
}
/// OptionalHasElement (opsets 15, 18): a bool scalar, false for an empty optional or (opset 18) a
/// left-out input, true for anything else.
std::vector<Value> op_optional_has_element(const Node& n, const Inputs& in) {
  const Value* v = opt(in, 0);
  const bool has = v && v->kind != Value::Kind::None;
  return one(tensor<bool>(std::vector<bool>{has}, {}));
}
/// OptionalGetElement (opsets 15, 18): the value an optional holds (a tensor or a sequence passes
/// through); an empty optional is an error naming the node.
std::vector<Value> op_optional_get_element(const Node& n, const Inputs& in) {
  const Value* v = opt(in, 0);
  if (!v || v->kind == Value::Kind::None)
    throw ValueError(fmt::format("OptionalGetElement node {} reads an empty optional", n.label()));
  return one(*v);
}

// ---- RoiAlign ----------------------------------------------------------------------------------------------
/// RoiAlign (opsets 10 and 16), as ONNX Runtime computes it: each region [x1, y1, x2, y2] (times
/// spatial_scale, minus 0.5 for half_pixel) is cut into output_height x output_width bins, each bin
/// sampled on a grid of sampling_ratio^2 points (0: ceil(roi size / output size) per region and axis),
/// each point bilinear from X[batch_indices[r]] (points beyond one pixel outside the image read 0;
/// coordinates clamp at the edges); avg averages the samples, max takes the largest corner term
/// (weight times value) over all samples. output_half_pixel (and opset 10) widens regions below one
/// pixel to one. Adaptive grids read the regions on the host (a graph break under capture unless they
/// are constant) to size the largest grid; smaller grids mask their extra points.
std::vector<Value> op_roi_align(const Node& n, const Inputs& in) {
  Tensor X = tin(n, in, 0), rois = tin(n, in, 1), bidx = tin(n, in, 2);
  if (X.dim() != 4) throw ShapeError(fmt::format("RoiAlign X must be [N, C, H, W], got {}", to_string(X.sizes())));
  if (!is_floating(X.dtype())) throw TypeError(fmt::format("RoiAlign takes floating X, got {}", short_name(X.dtype())));
  if (rois.dim() != 2 || rois.size(1).guard_int() != 4)
    throw ShapeError(fmt::format("RoiAlign rois must be [num_rois, 4], got {}", to_string(rois.sizes())));
  if (bidx.dim() != 1) throw ShapeError(fmt::format("RoiAlign batch_indices must be 1-D, got {}", to_string(bidx.sizes())));
  std::string mode = n.get_string("mode", "avg");
  if (mode != "avg" && mode != "max") throw ValueError(fmt::format("RoiAlign mode '{}' (avg or max)", mode));
  std::string ctm = n.get_string("coordinate_transformation_mode", n.opset >= 16 ? "half_pixel" : "output_half_pixel");
  if (ctm != "half_pixel" && ctm != "output_half_pixel")
    throw ValueError(fmt::format("RoiAlign coordinate_transformation_mode '{}' (half_pixel or output_half_pixel)", ctm));
  bool half = ctm == "half_pixel";
  int64_t PH = n.get_int("output_height", 1), PW = n.get_int("output_width", 1), sr = n.get_int("sampling_ratio", 0);
  double scale = n.get_float("spatial_scale", 1.0);
  if (PH < 1 || PW < 1 || sr < 0)
    throw ValueError(fmt::format("RoiAlign output_height {} / output_width {} / sampling_ratio {}", PH, PW, sr));
  int64_t H = X.size(2).guard_int(), W = X.size(3).guard_int();
  SymInt R = rois.size(0), C = X.size(1);
  DType dt = X.dtype();
  Tensor r = rois.dtype() == dt ? rois : cast(rois, dt);
  double off = half ? 0.5 : 0.0;
  auto coord = [&](int64_t c) { return sub(mul(select(r, 1, c), scale), off); };
  Tensor x1 = coord(0), y1 = coord(1), rw = sub(coord(2), x1), rh = sub(coord(3), y1);  // [R]
  if (!half) {
    rw = maximum(rw, wrap_scalar(1.0, rw));
    rh = maximum(rh, wrap_scalar(1.0, rh));
  }
  Tensor bin_h = div(rh, static_cast<double>(PH)), bin_w = div(rw, static_cast<double>(PW));
  Tensor grid_h, grid_w;  // [R] sample counts per bin along each axis
  int64_t SH = sr, SW = sr;
  if (sr > 0) {
    grid_h = full({R}, static_cast<double>(sr), dt);
    grid_w = grid_h;
  } else {
    grid_h = ceil(bin_h);
    grid_w = ceil(bin_w);
    std::vector<double> gh = grid_h.to_vector<double>(), gw = grid_w.to_vector<double>();
    SH = SW = 1;
    for (double g : gh) SH = std::max<int64_t>(SH, static_cast<int64_t>(g));
    for (double g : gw) SW = std::max<int64_t>(SW, static_cast<int64_t>(g));
  }
  // Sample coordinates along one axis: start + p * bin + (i + 0.5) * bin / grid, as [R, P, S].
  auto samples = [&](const Tensor& start, const Tensor& bin, const Tensor& grid, int64_t P, int64_t S) {
    Tensor p = reshape(cast(arange(P), dt), {SymInt(1), SymInt(P), SymInt(1)});
    Tensor i = reshape(add(cast(arange(S), dt), 0.5), {SymInt(1), SymInt(1), SymInt(S)});
    Tensor st = reshape(start, {R, SymInt(1), SymInt(1)}), b = reshape(bin, {R, SymInt(1), SymInt(1)});
    Tensor g = reshape(grid, {R, SymInt(1), SymInt(1)});
    Tensor pos = add(add(st, mul(p, b)), div(mul(i, b), g));
    Tensor used = expand(lt(i, g), {R, SymInt(P), SymInt(S)});  // points of a smaller adaptive grid
    return std::pair<Tensor, Tensor>{pos, used};
  };
  // Per axis: validity, low/high integer corners and the fractional weight, ONNX Runtime's rules.
  struct Axis {
    Tensor valid, lo, hi, l, h;
  };
  auto axis = [&](const Tensor& v, int64_t size) {
    Axis a;
    double sz = static_cast<double>(size);
    a.valid = logical_and(ge(v, wrap_scalar(-1.0, v)), le(v, wrap_scalar(sz, v)));
    Tensor c = maximum(v, wrap_scalar(0.0, v));
    Tensor lo = floor(c);
    Tensor edge = ge(lo, wrap_scalar(sz - 1, lo));
    a.lo = where(edge, wrap_scalar(sz - 1, lo), lo);
    a.hi = where(edge, wrap_scalar(sz - 1, lo), add(lo, 1.0));
    c = where(edge, a.lo, c);
    a.l = sub(c, a.lo);
    a.h = sub(wrap_scalar(1.0, a.l), a.l);
    return a;
  };
  auto [ys, yused] = samples(y1, bin_h, grid_h, PH, SH);
  auto [xs, xused] = samples(x1, bin_w, grid_w, PW, SW);
  Axis ay = axis(ys, H), ax = axis(xs, W);
  // Broadcast y terms [R, PH, SH] and x terms [R, PW, SW] to [R, PH, SH, PW, SW].
  auto by = [&](const Tensor& t) { return reshape(t, {R, SymInt(PH), SymInt(SH), SymInt(1), SymInt(1)}); };
  auto bx = [&](const Tensor& t) { return reshape(t, {R, SymInt(1), SymInt(1), SymInt(PW), SymInt(SW)}); };
  Tensor valid = logical_and(by(ay.valid), bx(ax.valid));
  int64_t M = PH * SH * PW * SW;
  // Each region reads its image's planes of the flattened X (no copy of X per region): the flat index of
  // (r, c, point) is (batch_indices[r] * C + c) * H * W + the point's position in the plane.
  SymInt HW = SymInt(H * W);
  Tensor Xflat = reshape(X, {SymInt(1), X.size(0) * C * HW});
  Tensor plane = add(reshape(mul(cast(bidx, DType::I64), as_tensor(Value::host_ints({C * HW}, DType::I64, true))), {R, SymInt(1), SymInt(1)}),
                     reshape(mul(arange(C), scalar_tensor(static_cast<double>(H * W), DType::I64)), {SymInt(1), C, SymInt(1)}));
  auto corner = [&](const Tensor& yi, const Tensor& yw, const Tensor& xi, const Tensor& xw) {
    // [R, PH, SH, PW, SW] in i64; invalid points (NaN coordinates included) read index 0 with weight 0
    auto index = [&](const Tensor& c, const Tensor& ok) { return cast(where(ok, c, scalar_tensor(0.0, dt)), DType::I64); };
    Tensor lin = add(mul(by(index(yi, ay.valid)), scalar_tensor(static_cast<double>(W), DType::I64)), bx(index(xi, ax.valid)));
    Tensor wgt = where(valid, mul(by(yw), bx(xw)), scalar_tensor(0.0, dt));
    Tensor flat = reshape(add(plane, reshape(lin, {R, SymInt(1), SymInt(M)})), {SymInt(1), R * C * SymInt(M)});
    Tensor v = reshape(gather(Xflat, 1, flat), {R, C, SymInt(M)});
    return mul(v, reshape(wgt, {R, SymInt(1), SymInt(M)}));  // [R, C, M]
  };
  Tensor t1 = corner(ay.lo, ay.h, ax.lo, ax.h), t2 = corner(ay.lo, ay.h, ax.hi, ax.l);
  Tensor t3 = corner(ay.hi, ay.l, ax.lo, ax.h), t4 = corner(ay.hi, ay.l, ax.hi, ax.l);
  SymIntVec six{R, C, SymInt(PH), SymInt(SH), SymInt(PW), SymInt(SW)};
  Tensor used = reshape(logical_and(by(yused), bx(xused)), {R, SymInt(1), SymInt(PH), SymInt(SH), SymInt(PW), SymInt(SW)});
  if (mode == "avg") {
    Tensor v = reshape(add(add(t1, t2), add(t3, t4)), six);
    if (sr == 0) v = where(used, v, scalar_tensor(0.0, dt));
    Tensor count = maximum(mul(grid_h, grid_w), wrap_scalar(1.0, grid_h));
    return one(div(sum(v, {3, 5}), reshape(count, {R, SymInt(1), SymInt(1), SymInt(1)})));
  }
  Tensor v = reshape(maximum(maximum(t1, t2), maximum(t3, t4)), six);
  if (sr == 0) v = where(used, v, scalar_tensor(-INFINITY, dt));
  return one(amax(v, {3, 5}));
}

// ---- Unique ---------------------------------------------------------------------------------------------------
/// Unique (NumPy's np.unique; flattened, or slices along `axis`): pairwise equality of the n elements
/// (rows) gives each one's first occurrence; the unique ones are selected by `nonzero` (a data-dependent
/// size: a graph break under capture) and, when sorted, ordered by their (lexicographic) rank.
/// O(n^2 * row) work and memory, so inputs above 2^24 pairwise element comparisons are refused.
std::vector<Value> op_unique(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  bool sorted_out = n.get_int("sorted", 1) != 0;
  bool has_axis = n.attr("axis") != nullptr;
  int64_t axis = 0;
  Tensor rows;  // [N, R]
  SymIntVec moved;
  if (has_axis) {
    axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(x.dim(), 1), "Unique axis");
    IntVec perm{axis};
    for (int64_t d = 0; d < x.dim(); ++d)
      if (d != axis) perm.push_back(d);
    Tensor xm = permute(x, perm);
    moved = xm.sizes();
    rows = reshape(xm, {xm.size(0), SymInt(-1)});
  } else {
    rows = reshape(x, {SymInt(-1), SymInt(1)});
  }
  int64_t N = rows.size(0).guard_int(), R = rows.size(1).guard_int();
  if (N * N * std::max<int64_t>(R, 1) > (int64_t(1) << 24))
    throw NotImplementedError(fmt::format("Unique of {} elements of size {} (pairwise comparison; at most 2^24 "
                                          "element pairs)", N, R));
  Tensor a = unsqueeze(rows, 1), b = unsqueeze(rows, 0);  // [N, 1, R], [1, N, R]
  Tensor same = eq(amin(cast(eq(a, b), DType::I32), {2}, false), scalar_tensor(1, DType::I32));  // [N, N]
  Tensor ii = iota_along(SymInt(N), 0, 2), jj = iota_along(SymInt(N), 1, 2);
  Tensor earlier = amax(cast(logical_and(same, lt(jj, ii)), DType::I32), {1}, false);  // [N]
  Tensor first = reshape(nonzero(eq(earlier, scalar_tensor(0, DType::I32))), {-1});  // [U] first occurrences
  SymInt U = first.size(0);
  Tensor order = first;
  if (sorted_out) {
    Tensor ur = index_select(rows, 0, first);  // [U, R]
    Tensor ua = unsqueeze(ur, 1), ub = unsqueeze(ur, 0);
    Tensor differ = ne(ua, ub);                                         // [U, U, R]
    Tensor k = argmax(cast(differ, DType::I32), 2, true);               // first differing position
    Tensor less_at = gather(lt(ua, ub), 2, k);                          // [U, U, 1]: row i < row j there
    Tensor any_diff = gt(amax(cast(differ, DType::I32), {2}, true), scalar_tensor(0, DType::I32));
    Tensor less = squeeze(logical_and(less_at, any_diff), {2});         // [U, U]
    Tensor rank = sum(cast(less, DType::I64), {0}, false);              // rows below each: its position
    Tensor pos = iota_along(U, 0, 2);                                   // [U, 1]
    Tensor perm = argmax(cast(eq(unsqueeze(rank, 0), pos), DType::I32), 1, false);  // [U]
    order = index_select(first, 0, perm);
  }
  Tensor y = index_select(rows, 0, order);
  if (has_axis) {
    SymIntVec shape = moved;
    shape[0] = U;
    y = reshape(y, shape);
    IntVec back(static_cast<size_t>(x.dim()));
    for (int64_t d = 0, src = 1; d < x.dim(); ++d) back[static_cast<size_t>(d)] = d == axis ? 0 : src++;
    y = permute(y, back);
  } else {
    y = reshape(y, {U});
  }
  Tensor match = index_select(same, 1, order);  // [N, U]
  Tensor inverse = argmax(cast(match, DType::I32), 1, false);
  Tensor counts = sum(cast(match, DType::I64), {0}, false);
  return {Value::tensor(y), Value::tensor(order), Value::tensor(inverse), Value::tensor(counts)};
}

// ---- NonMaxSuppression ----------------------------------------------------------------------------------------
/// NonMaxSuppression: greedy selection per (batch, class) on the host, as ONNX Runtime does: boxes with
/// a score above score_threshold, highest score first (ties: lower index), each kept unless its IoU with
/// a kept box exceeds iou_threshold, at most max_output_boxes_per_class. The inputs' values are read on
/// the host (a graph break under capture: the output size depends on them). → i64 [n, 3] (batch, class,
/// box index).
std::vector<Value> op_non_max_suppression(const Node& n, const Inputs& in) {
  Tensor boxes = tin(n, in, 0), scores = tin(n, in, 1);
  if (boxes.dim() != 3 || scores.dim() != 3 || boxes.size(2).guard_int() != 4)
    throw ShapeError(fmt::format("NonMaxSuppression: boxes {} must be [B, N, 4] and scores {} [B, C, N]",
                                 to_string(boxes.sizes()), to_string(scores.sizes())));
  int64_t B = boxes.size(0).guard_int(), N = boxes.size(1).guard_int(), C = scores.size(1).guard_int();
  if (scores.size(0).guard_int() != B || scores.size(2).guard_int() != N)
    throw ShapeError(fmt::format("NonMaxSuppression: scores {} do not match boxes {}", to_string(scores.sizes()),
                                 to_string(boxes.sizes())));
  int64_t max_out = 0;
  if (const Value* v = opt(in, 2); v && !(v->is_host() ? v->host_size() == 0 : v->t.numel().hint() == 0))
    max_out = read_concrete_ints(*v, "max_output_boxes_per_class").at(0);
  float iou_thr = 0, score_thr = 0;
  bool has_score_thr = false;
  if (const Value* v = opt(in, 3)) iou_thr = static_cast<float>(read_floats(*v, "iou_threshold").at(0));
  if (const Value* v = opt(in, 4)) {
    score_thr = static_cast<float>(read_floats(*v, "score_threshold").at(0));
    has_score_thr = true;
  }
  bool center = n.get_int("center_point_box", 0) != 0;
  std::vector<float> bx = boxes.to(DType::F32).contiguous().to_vector<float>();
  std::vector<float> sc = scores.to(DType::F32).contiguous().to_vector<float>();
  auto corners = [&](int64_t b, int64_t i) {
    const float* p = &bx[static_cast<size_t>((b * N + i) * 4)];
    std::array<float, 4> r{};  // y1, x1, y2, x2 with y1 <= y2, x1 <= x2
    if (center) {
      r = {p[1] - p[3] / 2, p[0] - p[2] / 2, p[1] + p[3] / 2, p[0] + p[2] / 2};
    } else {
      r = {std::min(p[0], p[2]), std::min(p[1], p[3]), std::max(p[0], p[2]), std::max(p[1], p[3])};
    }
    return r;
  };
  auto suppressed_by = [&](const std::array<float, 4>& a, const std::array<float, 4>& k) {
    float area_a = (a[2] - a[0]) * (a[3] - a[1]), area_k = (k[2] - k[0]) * (k[3] - k[1]);
    if (area_a <= 0 || area_k <= 0) return false;
    float ih = std::min(a[2], k[2]) - std::max(a[0], k[0]), iw = std::min(a[3], k[3]) - std::max(a[1], k[1]);
    if (ih <= 0 || iw <= 0) return false;
    float inter = ih * iw;
    return inter / (area_a + area_k - inter) > iou_thr;
  };
  std::vector<int64_t> out;
  for (int64_t b = 0; b < B && max_out > 0; ++b) {
    for (int64_t c = 0; c < C; ++c) {
      std::vector<int64_t> cand;
      const float* s = &sc[static_cast<size_t>((b * C + c) * N)];
      for (int64_t i = 0; i < N; ++i)  // a NaN score is never selected (and would break the ordering)
        if (!std::isnan(s[i]) && (!has_score_thr || s[i] > score_thr)) cand.push_back(i);
      std::stable_sort(cand.begin(), cand.end(), [&](int64_t x, int64_t y) { return s[x] > s[y]; });
      std::vector<std::array<float, 4>> kept;
      for (int64_t i : cand) {
        if (static_cast<int64_t>(kept.size()) >= max_out) break;
        std::array<float, 4> box = corners(b, i);
        bool drop = false;
        for (const auto& k : kept) drop = drop || suppressed_by(box, k);
        if (drop) continue;
        kept.push_back(box);
        out.insert(out.end(), {b, c, i});
      }
    }
  }
  return one(tensor<int64_t>(out, {static_cast<int64_t>(out.size() / 3), 3}));
}

// ---- Einsum -------------------------------------------------------------------------------------------------
/// One operand of an einsum: a tensor and one label per dim (letters; ellipsis dims get labels >= 1000,
/// right-aligned across operands as NumPy broadcasts them).
struct EinsumTerm {
  Tensor t;
  std::vector<int> labels;
};

/// Repeated labels in one term become their diagonal; labels in no other term and not in the output
/// are summed out.
void einsum_reduce_term(EinsumTerm& e, const std::multiset<int>& elsewhere) {
  for (size_t p = 0; p < e.labels.size(); ++p) {
    for (size_t q = p + 1; q < e.labels.size();) {
      if (e.labels[q] != e.labels[p]) {
        ++q;
        continue;
      }
      int64_t r = e.t.dim();
      Tensor ip = iota_along(e.t.size(static_cast<int64_t>(p)), static_cast<int64_t>(p), r);
      Tensor iq = iota_along(e.t.size(static_cast<int64_t>(q)), static_cast<int64_t>(q), r);
      Tensor kept = where(eq(ip, iq), e.t, scalar_tensor(0.0, e.t.dtype()));
      e.t = sum(kept, {static_cast<int64_t>(q)}, false);
      e.labels.erase(e.labels.begin() + static_cast<std::ptrdiff_t>(q));
    }
  }
  IntVec dims;
  std::vector<int> keep;
  for (size_t i = 0; i < e.labels.size(); ++i) {
    if (elsewhere.count(e.labels[i]) == 0) dims.push_back(static_cast<int64_t>(i));
    else keep.push_back(e.labels[i]);
  }
  if (!dims.empty()) {
    e.t = sum(e.t, dims, false);
    e.labels = keep;
  }
}

/// a and b contracted into one term holding the labels in `needed` (those later terms or the output
/// use): shared labels not needed are contracted by a batched matmul, shared needed ones are its batch.
EinsumTerm einsum_pair(EinsumTerm a, EinsumTerm b, const std::set<int>& needed) {
  std::vector<int> batch, ka, kb, contr;
  auto in = [](const std::vector<int>& v, int l) { return std::find(v.begin(), v.end(), l) != v.end(); };
  for (int l : a.labels) {
    if (in(b.labels, l)) (needed.count(l) ? batch : contr).push_back(l);
    else ka.push_back(l);
  }
  for (int l : b.labels)
    if (!in(a.labels, l)) kb.push_back(l);
  auto pos = [](const std::vector<int>& v, int l) {
    return static_cast<int64_t>(std::find(v.begin(), v.end(), l) - v.begin());
  };
  // Broadcast shared labels of size 1 against the other side.
  for (int l : batch) {
    SymInt sa = a.t.size(pos(a.labels, l)), sb = b.t.size(pos(b.labels, l));
    if (static_cast<bool>(sa == sb)) continue;
    if (static_cast<bool>(sa == 1)) {
      SymIntVec sz = a.t.sizes();
      sz[static_cast<size_t>(pos(a.labels, l))] = sb;
      a.t = expand(a.t, sz);
    } else if (static_cast<bool>(sb == 1)) {
      SymIntVec sz = b.t.sizes();
      sz[static_cast<size_t>(pos(b.labels, l))] = sa;
      b.t = expand(b.t, sz);
    } else {
      throw ShapeError(fmt::format("Einsum: a label has sizes {} and {}", to_string(SymIntVec{sa}), to_string(SymIntVec{sb})));
    }
  }
  IntVec pa, pb;
  SymInt B = 1, M = 1, N = 1, K = 1;
  SymIntVec out_sizes;
  for (int l : batch) {
    pa.push_back(pos(a.labels, l));
    B = B * a.t.size(pos(a.labels, l));
    out_sizes.push_back(a.t.size(pos(a.labels, l)));
  }
  for (int l : ka) {
    pa.push_back(pos(a.labels, l));
    M = M * a.t.size(pos(a.labels, l));
    out_sizes.push_back(a.t.size(pos(a.labels, l)));
  }
  for (int l : contr) {
    pa.push_back(pos(a.labels, l));
    K = K * a.t.size(pos(a.labels, l));
  }
  for (int l : batch) pb.push_back(pos(b.labels, l));
  for (int l : contr) {
    pb.push_back(pos(b.labels, l));
    if (static_cast<bool>(b.t.size(pos(b.labels, l)) != a.t.size(pos(a.labels, l))))
      throw ShapeError("Einsum: a contracted label has different sizes in two operands");
  }
  for (int l : kb) {
    pb.push_back(pos(b.labels, l));
    N = N * b.t.size(pos(b.labels, l));
    out_sizes.push_back(b.t.size(pos(b.labels, l)));
  }
  Tensor A = reshape(permute(a.t, pa), {B, M, K});
  Tensor Bm = reshape(permute(b.t, pb), {B, K, N});
  EinsumTerm r;
  r.t = reshape(matmul(A, Bm), out_sizes);
  r.labels = batch;
  r.labels.insert(r.labels.end(), ka.begin(), ka.end());
  r.labels.insert(r.labels.end(), kb.begin(), kb.end());
  return r;
}

/// Einsum (NumPy's notation, explicit `->` or implicit output, `...` broadcasting): diagonals and
/// single-term sums first, then the terms contracted pairwise left to right by batched matmuls, then
/// the output's order.
std::vector<Value> op_einsum(const Node& n, const Inputs& in) {
  std::string eq_text = n.get_string("equation", "");
  eq_text.erase(std::remove(eq_text.begin(), eq_text.end(), ' '), eq_text.end());
  std::string lhs = eq_text, rhs;
  bool explicit_out = false;
  if (auto arrow = eq_text.find("->"); arrow != std::string::npos) {
    lhs = eq_text.substr(0, arrow);
    rhs = eq_text.substr(arrow + 2);
    explicit_out = true;
  }
  std::vector<std::string> specs;
  for (size_t start = 0;;) {
    size_t comma = lhs.find(',', start);
    specs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (specs.size() != in.size())
    throw ValueError(fmt::format("Einsum equation '{}' names {} operand(s), the node has {}", eq_text, specs.size(),
                                 in.size()));
  auto parse = [&](const std::string& spec, int64_t rank, int64_t* ell_rank) {
    std::vector<int> labels;
    size_t letters = 0;
    bool ell = spec.find("...") != std::string::npos;
    for (char ch : spec)
      if (std::isalpha(static_cast<unsigned char>(ch))) ++letters;
      else if (ch != '.') throw ValueError(fmt::format("Einsum equation '{}': character '{}'", eq_text, ch));
    int64_t e = rank - static_cast<int64_t>(letters);
    if (!ell && e != 0)
      throw ShapeError(fmt::format("Einsum term '{}' has {} labels for a rank-{} operand", spec, letters, rank));
    if (e < 0) throw ShapeError(fmt::format("Einsum term '{}' has more labels than its operand's rank {}", spec, rank));
    if (ell_rank) *ell_rank = e;
    for (size_t i = 0; i < spec.size(); ++i) {
      if (spec[i] == '.') {
        if (spec.compare(i, 3, "...") != 0) throw ValueError(fmt::format("Einsum equation '{}': a lone '.'", eq_text));
        for (int64_t k = 0; k < e; ++k) labels.push_back(static_cast<int>(1000 - e + k));  // right-aligned
        i += 2;
      } else {
        labels.push_back(static_cast<unsigned char>(spec[i]));
      }
    }
    return labels;
  };
  std::vector<EinsumTerm> terms;
  int64_t max_ell = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    EinsumTerm t;
    t.t = tin(n, in, i);
    int64_t e = 0;
    t.labels = parse(specs[i], t.t.dim(), &e);
    max_ell = std::max(max_ell, e);
    terms.push_back(std::move(t));
  }
  std::vector<int> out;
  if (explicit_out) {
    for (size_t i = 0; i < rhs.size(); ++i) {
      if (!std::isalpha(static_cast<unsigned char>(rhs[i])) && rhs.compare(i, 3, "...") != 0)
        throw ValueError(fmt::format("Einsum equation '{}': output character '{}'", eq_text, rhs[i]));
      if (rhs[i] == '.') {
        for (int64_t k = 0; k < max_ell; ++k) out.push_back(static_cast<int>(1000 - max_ell + k));
        i += 2;
      } else {
        out.push_back(static_cast<unsigned char>(rhs[i]));
      }
    }
  } else {
    std::map<int, int> count;
    for (const auto& t : terms)
      for (int l : t.labels) ++count[l];
    for (int64_t k = 0; k < max_ell; ++k) out.push_back(static_cast<int>(1000 - max_ell + k));
    for (const auto& [l, c] : count)
      if (l < 1000 && c == 1) out.push_back(l);
  }
  // Reduce each term against the labels the other terms and the output use, then contract pairwise.
  auto others = [&](size_t skip, size_t from) {
    std::multiset<int> m(out.begin(), out.end());
    for (size_t j = from; j < terms.size(); ++j)
      if (j != skip) m.insert(terms[j].labels.begin(), terms[j].labels.end());
    return m;
  };
  einsum_reduce_term(terms[0], others(0, 1));
  EinsumTerm acc = terms[0];
  for (size_t i = 1; i < terms.size(); ++i) {
    std::multiset<int> rest = others(i, i + 1);
    rest.insert(acc.labels.begin(), acc.labels.end());
    einsum_reduce_term(terms[i], rest);
    std::multiset<int> later = others(i, i + 1);
    std::set<int> needed(later.begin(), later.end());
    acc = einsum_pair(acc, terms[i], needed);
  }
  einsum_reduce_term(acc, std::multiset<int>(out.begin(), out.end()));
  IntVec perm;
  for (int l : out) {
    auto it = std::find(acc.labels.begin(), acc.labels.end(), l);
    if (it == acc.labels.end())
      throw ValueError(fmt::format("Einsum equation '{}': an output label appears in no operand", eq_text));
    perm.push_back(static_cast<int64_t>(it - acc.labels.begin()));
  }
  if (perm.size() != acc.labels.size())
    throw ValueError(fmt::format("Einsum equation '{}': the output repeats a label", eq_text));
  return one(perm.empty() ? acc.t : permute(acc.t, perm));
}

// ---- quantization (ONNX's linear quantization: y = saturate(round_half_even(x / scale) + zero_point)) --------
/// A per-tensor (scalar or 1-element) or per-axis (1-D along `axis` of a rank-`rank` input) parameter,
/// reshaped to broadcast against the input.
Tensor quant_param(const Tensor& p, int64_t axis, int64_t rank, const char* what) {
  if (p.dim() == 0 || (p.dim() == 1 && static_cast<bool>(p.size(0) == 1))) return reshape(p, {});
  if (p.dim() != 1)
    throw NotImplementedError(fmt::format("{} of shape {} (per-tensor or per-axis 1-D only; block quantization is "
                                          "not supported)", what, to_string(p.sizes())));
  axis = norm_axis(axis, rank, "quantization axis");
  SymIntVec shape(static_cast<size_t>(rank), SymInt(1));
  shape[static_cast<size_t>(axis)] = p.size(0);
  return reshape(p, shape);
}

/// The saturation range of a quantized dtype (u8, i8, i32).
std::pair<double, double> quant_range(DType dt) {
  switch (dt) {
    case DType::U8: return {0.0, 255.0};
    case DType::I8: return {-128.0, 127.0};
    case DType::I32: return {-2147483648.0, 2147483647.0};
    case DType::Bool: case DType::I64: case DType::F16: case DType::BF16: case DType::F32: case DType::F64: break;
  }
  throw NotImplementedError(fmt::format("quantized type {} (uint8, int8 and int32 are supported)", short_name(dt)));
}

/// a / b in f32 as IEEE division rounds it: computed in f64 and rounded once to f32 (exact for f32
/// operands). Backends may turn a division by an invariant into a reciprocal multiplication, which can
/// move a quotient off a rounding tie (x / scale = 25.5 must round to 26).
Tensor f32_div(const Tensor& a, const Tensor& b) {
  return cast(div(cast(a, DType::F64), cast(b, DType::F64)), DType::F32);
}

/// round_half_even(v) + zero_point, saturated to `dt`'s range and cast (v and zp in f32 or f64).
Tensor quant_saturate(const Tensor& v, const Tensor& zp, DType dt) {
  auto [lo, hi] = quant_range(dt);
  Tensor r = round(v);
  if (zp.defined()) r = add(r, cast(zp, r.dtype()));
  return cast(clamp(r, lo, hi), dt);
}

int64_t quant_axis(const Node& n, int64_t rank) {
  if (n.get_int("block_size", 0) != 0) throw NotImplementedError(fmt::format("{} with block_size", n.op_type));
  return n.get_int("axis", 1);  // checked against the rank only for a per-axis parameter
}

std::vector<Value> op_quantize_linear(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = tin(n, in, 1), zp = topt(in, 2);
  int64_t axis = quant_axis(n, x.dim());
  DType out = zp.defined() ? zp.dtype() : DType::U8;
  if (n.attr("output_dtype") && n.get_int("output_dtype", 0) != 0) {
    std::optional<DType> d = dtype_from_onnx(static_cast<int32_t>(n.get_int("output_dtype", 0)));
    if (!d) throw NotImplementedError("QuantizeLinear output_dtype");
    out = *d;
  }
  Tensor s = quant_param(scale, axis, x.dim(), "QuantizeLinear y_scale");
  Tensor z = zp.defined() ? quant_param(zp, axis, x.dim(), "QuantizeLinear y_zero_point") : Tensor();
  Tensor q = x.dtype() == DType::F64 ? div(x, cast(s, DType::F64)) : f32_div(cast(x, DType::F32), cast(s, DType::F32));
  return one(quant_saturate(q, z, out));
}

std::vector<Value> op_dequantize_linear(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), scale = tin(n, in, 1), zp = topt(in, 2);
  int64_t axis = quant_axis(n, x.dim());
  Tensor s = quant_param(scale, axis, x.dim(), "DequantizeLinear x_scale");
  DType ct = s.dtype();
  Tensor v = cast(x, ct == DType::F32 ? DType::F64 : ct);  // x - zp exactly (i32 - i32 can exceed f32)
  if (zp.defined()) v = sub(v, cast(quant_param(zp, axis, x.dim(), "DequantizeLinear x_zero_point"), v.dtype()));
  return one(mul(cast(v, ct), s));
}

/// DynamicQuantizeLinear: uint8 with scale = (max(0, max x) - min(0, min x)) / 255 and zero point
/// round(-min / scale) saturated; an all-zero input gets scale 0 and zero point 0.
std::vector<Value> op_dynamic_quantize_linear(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dtype() != DType::F32) throw TypeError(fmt::format("DynamicQuantizeLinear takes float input, got {}", short_name(x.dtype())));
  Tensor zero = scalar_tensor(0.0, DType::F32);
  Tensor lo = minimum(amin(x), zero), hi = maximum(amax(x), zero);
  Tensor scale = f32_div(sub(hi, lo), scalar_tensor(255.0, DType::F32));
  Tensor safe = where(eq(scale, zero), scalar_tensor(1.0, DType::F32), scale);
  Tensor zp = cast(clamp(round(f32_div(sub(zero, lo), safe)), 0.0, 255.0), DType::U8);
  Tensor y = quant_saturate(f32_div(x, safe), zp, DType::U8);
  return {Value::tensor(y), Value::tensor(scale), Value::tensor(zp)};
}

/// x - zero_point in i32 (the zero point per tensor, or 1-D along `axis`).
Tensor minus_zero_point(const Tensor& x, const Tensor& zp, int64_t axis, const char* what) {
  Tensor v = cast(x, DType::I32);
  if (!zp.defined()) return v;
  return sub(v, cast(quant_param(zp, axis, x.dim(), what), DType::I32));
}

/// MatMulInteger: (A - a_zero_point) @ (B - b_zero_point) accumulated in int32 (a_zero_point per row of
/// A: 1-D of A's rows; b_zero_point per column of B).
std::vector<Value> op_matmul_integer(const Node& n, const Inputs& in) {
  Tensor a = tin(n, in, 0), b = tin(n, in, 1);
  Tensor azp = topt(in, 2), bzp = topt(in, 3);
  Tensor A = minus_zero_point(a, azp, std::max<int64_t>(a.dim() - 2, 0), "MatMulInteger a_zero_point");
  Tensor B = minus_zero_point(b, bzp, b.dim() - 1, "MatMulInteger b_zero_point");
  return one(matmul(A, B));
}

/// QLinearMatMul: C = (a - a_zp) @ (b - b_zp) in int32, then saturate(round(C * (a_scale * b_scale /
/// y_scale)) + y_zp) (the factor in f32, the product in f64, as ONNX's reference).
std::vector<Value> op_qlinear_matmul(const Node& n, const Inputs& in) {
  Tensor a = tin(n, in, 0), as = tin(n, in, 1), azp = tin(n, in, 2);
  Tensor b = tin(n, in, 3), bs = tin(n, in, 4), bzp = tin(n, in, 5), ys = tin(n, in, 6), yzp = tin(n, in, 7);
  for (const Tensor* t : {&as, &bs, &ys, &azp, &bzp, &yzp})
    if (t->numel().hint() != 1)
      throw NotImplementedError("QLinearMatMul with per-row/per-column scales or zero points (per-tensor only)");
  Tensor A = minus_zero_point(a, azp, 0, "QLinearMatMul a_zero_point");
  Tensor B = minus_zero_point(b, bzp, 0, "QLinearMatMul b_zero_point");
  Tensor C = cast(matmul(A, B), DType::F64);
  Tensor f = cast(f32_div(mul(reshape(as, {}), reshape(bs, {})), reshape(ys, {})), DType::F64);
  return one(quant_saturate(mul(C, f), reshape(yzp, {}), yzp.dtype()));
}

/// The integer convolution of ConvInteger / QLinearConv: (x - x_zp) conv (w - w_zp) with Conv's
/// attributes, computed by the f32 convolution, which is exact while every sum stays below 2^24 (checked:
/// in_channels / group * kernel volume * 255 * 255 < 2^24; larger convolutions are refused).
Tensor conv_integer(const Node& n, const Tensor& x, const Tensor& xzp, const Tensor& w, const Tensor& wzp) {
  Tensor X = minus_zero_point(x, xzp, 1, "x_zero_point");
  Tensor W = minus_zero_point(w, wzp, 0, "w_zero_point");
  int64_t taps = w.size(1).guard_int();
  for (int64_t i = 2; i < w.dim(); ++i) taps *= w.size(i).guard_int();
  if (taps * 255 * 255 >= (int64_t(1) << 24))
    throw NotImplementedError(fmt::format("{} with {} products per output (exact only below {})", n.op_type, taps,
                                          (int64_t(1) << 24) / (255 * 255)));
  Value xv = Value::tensor(cast(X, DType::F32)), wv = Value::tensor(cast(W, DType::F32));
  Inputs ci{&xv, &wv};
  Tensor y = as_tensor(op_conv(n, ci).at(0));
  return cast(round(y), DType::I32);
}

std::vector<Value> op_conv_integer(const Node& n, const Inputs& in) {
  return one(conv_integer(n, tin(n, in, 0), topt(in, 2), tin(n, in, 1), topt(in, 3)));
}

/// QLinearConv: the integer convolution plus an int32 bias, requantized as QLinearMatMul.
std::vector<Value> op_qlinear_conv(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), xs = tin(n, in, 1), xzp = tin(n, in, 2), w = tin(n, in, 3), ws = tin(n, in, 4);
  Tensor wzp = tin(n, in, 5), ys = tin(n, in, 6), yzp = tin(n, in, 7), b = topt(in, 8);
  if (xs.numel().hint() != 1 || ys.numel().hint() != 1 || yzp.numel().hint() != 1 || xzp.numel().hint() != 1)
    throw NotImplementedError("QLinearConv with per-channel x or y scales (per-tensor only)");
  Tensor acc = conv_integer(n, x, xzp, w, wzp);
  SymIntVec cshape(static_cast<size_t>(x.dim()), SymInt(1));
  cshape[1] = w.size(0);
  if (b.defined()) acc = add(acc, reshape(cast(b, DType::I32), cshape));
  Tensor wsb = ws.numel().hint() == 1 ? reshape(ws, {}) : reshape(ws, cshape);
  Tensor f = cast(f32_div(mul(reshape(xs, {}), wsb), reshape(ys, {})), DType::F64);
  return one(quant_saturate(mul(cast(acc, DType::F64), f), reshape(yzp, {}), yzp.dtype()));
}

// ---- sequences (host lists of tensors) -------------------------------------------------------------------
const std::vector<Tensor>& need_seq(const Node& n, const Inputs& in, size_t i) {
  const Value& v = need(n, in, i);
  if (!v.is_sequence()) throw TypeError(fmt::format("input {} must be a sequence, got {}", i, v.describe()));
  return v.seq;
}
/// A position input (default `dflt`), negative counted from the end, checked against [0, limit].
int64_t seq_position(const Node& n, const Inputs& in, size_t i, int64_t size, int64_t dflt, int64_t limit) {
  const Value* v = opt(in, i);
  if (!v) return dflt;
  int64_t p = read_concrete_ints(*v, "sequence position").at(0);
  if (p < 0) p += size;
  if (p < 0 || p > limit)
    throw ValueError(fmt::format("sequence position {} is out of range for a sequence of {} tensor(s)", p, size));
  return p;
}
std::vector<Value> op_sequence_empty(const Node& n, const Inputs& in) { return one(Value::sequence({})); }
std::vector<Value> op_sequence_construct(const Node& n, const Inputs& in) {
  std::vector<Tensor> ts;
  for (const Value* v : in)
    if (v) ts.push_back(as_tensor(*v));
  return one(Value::sequence(std::move(ts)));
}
std::vector<Value> op_sequence_insert(const Node& n, const Inputs& in) {
  std::vector<Tensor> ts = need_seq(n, in, 0);
  int64_t size = static_cast<int64_t>(ts.size());
  int64_t p = seq_position(n, in, 2, size, size, size);
  ts.insert(ts.begin() + p, tin(n, in, 1));
  return one(Value::sequence(std::move(ts)));
}
std::vector<Value> op_sequence_erase(const Node& n, const Inputs& in) {
  std::vector<Tensor> ts = need_seq(n, in, 0);
  int64_t size = static_cast<int64_t>(ts.size());
  if (size == 0) throw ValueError("SequenceErase on an empty sequence");
  int64_t p = seq_position(n, in, 1, size, size - 1, size - 1);
  ts.erase(ts.begin() + p);
  return one(Value::sequence(std::move(ts)));
}
std::vector<Value> op_sequence_at(const Node& n, const Inputs& in) {
  const std::vector<Tensor>& ts = need_seq(n, in, 0);
  int64_t size = static_cast<int64_t>(ts.size());
  if (!opt(in, 1)) throw ValueError("SequenceAt needs a position");
  return one(ts.at(static_cast<size_t>(seq_position(n, in, 1, size, 0, size - 1))));
}
std::vector<Value> op_sequence_length(const Node& n, const Inputs& in) {
  return one(Value::host_ints({SymInt(static_cast<int64_t>(need_seq(n, in, 0).size()))}, DType::I64, true));
}
std::vector<Value> op_concat_from_sequence(const Node& n, const Inputs& in) {
  const std::vector<Tensor>& ts = need_seq(n, in, 0);
  if (ts.empty()) throw ValueError("ConcatFromSequence of an empty sequence");
  bool new_axis = n.get_int("new_axis", 0) != 0;
  int64_t r = ts[0].dim() + (new_axis ? 1 : 0);
  int64_t axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(r, 1), "ConcatFromSequence axis");
  return one(new_axis ? stack(ts, axis) : cat(ts, axis));
}
std::vector<Value> op_split_to_sequence(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  int64_t axis = norm_axis(n.get_int("axis", 0), std::max<int64_t>(x.dim(), 1), "SplitToSequence axis");
  TensorList parts;
  if (const Value* v = opt(in, 1)) {
    SymIntVec s = read_ints(*v, "SplitToSequence split");
    bool scalar = v->is_host() ? v->scalar : v->t.dim() == 0;
    parts = scalar ? split(x, s.at(0), axis) : split(x, s, axis);
  } else {
    parts = split(x, SymInt(1), axis);
    if (n.get_int("keepdims", 1) == 0)
      for (Tensor& t : parts) t = squeeze(t, {axis});
  }
  return one(Value::sequence(std::move(parts)));
}

// ---- load-time feature checks ----------------------------------------------------------------------------
std::string check_upsample(const Node& n) {
  std::string mode = n.get_string("mode", "nearest");
  if (mode != "nearest" && mode != "linear") return fmt::format("mode '{}' (only 'nearest' and 'linear')", mode);
  return "";
}
std::string check_resize(const Node& n) {
  std::string mode = n.get_string("mode", "nearest");
  if (n.get_int("antialias", 0) != 0) return "antialias=1";
  if (n.attr("axes")) return "the axes attribute";
  if (n.get_string("keep_aspect_ratio_policy", "stretch") != "stretch") return "keep_aspect_ratio_policy";
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return fmt::format("mode '{}' (ONNX defines nearest, linear and cubic)", mode);
  static const std::set<std::string> kCtm = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                             "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                                             "tf_crop_and_resize"};
  std::string ctm = n.get_string("coordinate_transformation_mode", "half_pixel");
  if (!kCtm.count(ctm)) return fmt::format("coordinate_transformation_mode '{}'", ctm);
  static const std::set<std::string> kNm = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  if (mode == "nearest" && !kNm.count(n.get_string("nearest_mode", "round_prefer_floor")))
    return fmt::format("nearest_mode '{}'", n.get_string("nearest_mode", ""));
  return "";
}
std::string check_lstm(const Node& n) {
  if (n.get_int("layout", 0) != 0 && n.get_int("layout", 0) != 1) return fmt::format("layout={}", n.get_int("layout", 0));
  if (n.attr("clip")) return "clip";
  if (n.get_int("input_forget", 0) != 0) return "input_forget=1";
  auto acts = n.get_strings("activations");
  for (size_t i = 0; i < acts.size(); ++i) {
    const char* want = (i % 3 == 0) ? "Sigmoid" : "Tanh";
    if (acts[i] != want) return fmt::format("activation '{}'", acts[i]);
  }
  return "";
}
std::string check_rnn_gru(const Node& n) {
  if (n.attr("clip")) return "clip";
  auto acts = n.get_strings("activations");
  bool gru = n.op_type == "GRU";
  for (size_t i = 0; i < acts.size(); ++i) {
    const char* want = gru ? ((i % 2 == 0) ? "Sigmoid" : "Tanh") : "Tanh";
    if (acts[i] != want) return fmt::format("activation '{}'", acts[i]);
  }
  return "";
}
std::string check_pad(const Node& n) {
  std::string m = n.get_string("mode", "constant");
  if (m != "constant" && m != "reflect" && m != "edge" && !(m == "wrap" && n.opset >= 19)) return fmt::format("mode '{}'", m);
  return "";
}
std::string check_cast(const Node& n) {
  int64_t to = n.get_int("to", 0);
  if (!dtype_from_onnx(static_cast<int32_t>(to))) return fmt::format("to={}", onnx_type_name(int32_t(to)));
  return "";
}
std::string check_pool(const Node& n) {
  if (n.op_type != "MaxPool" && n.outputs.size() > 1 && !n.outputs[1].empty()) return "a second output";
  return "";
}
std::string check_conv_transpose(const Node& n) {
  std::string ap = n.get_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID" && ap != "SAME_UPPER" && ap != "SAME_LOWER") return fmt::format("auto_pad={}", ap);
  return "";
}
std::string check_batch_norm(const Node& n) {
  // Opsets 14+ say training with training_mode; older ones by asking for the statistics outputs
  // (mean, var, saved_mean, saved_var), whose meaning differs between versions: refused.
  if (n.opset >= 14) return "";
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return fmt::format("training outputs (running mean/var) at opset {}", n.opset);
  return "";
}
/// Loop and Scan run in model.cpp (unrolled, like If's branches); here only the body's presence.
std::string check_loop_body(const Node& n) {
  return n.get_graph("body") ? "" : "no body graph";
}

std::string check_constant(const Node& n) {
  for (const char* k : {"sparse_value", "value_string", "value_strings"})
    if (n.attr(k)) return fmt::format("attribute '{}'", k);
  return "";
}

const std::unordered_map<std::string, OpDef>& op_table() {
  static const std::unordered_map<std::string, OpDef> t = {
      {"Abs", {op_abs}}, {"Add", {op_add}}, {"AveragePool", {op_avg_pool, check_pool}},
      {"BatchNormalization", {op_batch_norm, check_batch_norm}}, {"Cast", {op_cast, check_cast}},
      {"Ceil", {op_ceil}}, {"Clip", {op_clip}}, {"Concat", {op_concat}}, {"Constant", {nullptr, check_constant}},
      {"ConstantOfShape", {op_constant_of_shape}}, {"Conv", {op_conv}},
      {"ConvTranspose", {op_conv_transpose, check_conv_transpose}}, {"Cos", {op_cos}}, {"Div", {op_div}},
      {"Equal", {op_equal}}, {"Erf", {op_erf}}, {"Exp", {op_exp}}, {"Flatten", {op_flatten}},
      {"Floor", {op_floor}}, {"Gather", {op_gather}}, {"GlobalAveragePool", {op_global_avg_pool}},
      {"GlobalMaxPool", {op_global_max_pool}}, {"HardSigmoid", {op_hardsigmoid}},
      {"HardSwish", {op_hardswish}}, {"Identity", {op_identity}}, {"If", {nullptr}},
      {"Loop", {nullptr, check_loop_body}}, {"Log", {op_log}},
      {"LogSoftmax", {op_log_softmax}}, {"LSTM", {op_lstm, check_lstm}}, {"MatMul", {op_matmul}},
      {"MaxPool", {op_max_pool, check_pool}}, {"MaxUnpool", {op_max_unpool}}, {"Mul", {op_mul}}, {"Neg", {op_neg}}, {"Not", {op_not}},
      {"Pad", {op_pad, check_pad}}, {"Pow", {op_pow}}, {"Reciprocal", {op_reciprocal}},
      {"ReduceMean", {op_reduce_mean}}, {"Scan", {nullptr, check_loop_body}}, {"Relu", {op_relu}},
      {"Reshape", {op_reshape}},
      {"Resize", {op_resize, check_resize}}, {"Shape", {op_shape}}, {"Sigmoid", {op_sigmoid}},
      {"Sin", {op_sin}}, {"Size", {op_size}}, {"Slice", {op_slice}}, {"Softmax", {op_softmax}},
      {"Sqrt", {op_sqrt}}, {"Squeeze", {op_squeeze}}, {"Sub", {op_sub}}, {"Tanh", {op_tanh}},
      {"Transpose", {op_transpose}}, {"Unsqueeze", {op_unsqueeze}},
      // Decomposed into existing ops (the graph shows the pieces):
      {"Acosh", {op_acosh}}, {"And", {op_and}}, {"ArgMax", {op_argmax}}, {"ArgMin", {op_argmin}},
      {"Asinh", {op_asinh}}, {"Atanh", {op_atanh}}, {"CastLike", {op_cast_like}}, {"Celu", {op_celu}},
      {"Cosh", {op_cosh}}, {"CumSum", {op_cumsum}}, {"DepthToSpace", {op_depth_to_space}},
      {"Dropout", {op_dropout}}, {"Elu", {op_elu}}, {"Expand", {op_expand}}, {"EyeLike", {op_eye_like}},
      {"GatherElements", {op_gather_elements}}, {"GatherND", {op_gather_nd}}, {"Gelu", {op_gelu}},
      {"Gemm", {op_gemm}}, {"Greater", {op_greater}}, {"GreaterOrEqual", {op_greater_equal}},
      {"Hardmax", {op_hardmax}}, {"InstanceNormalization", {op_instance_norm}},
      {"GroupNormalization", {op_group_norm, check_group_norm}}, {"IsInf", {op_isinf}},
      {"IsNaN", {op_isnan}}, {"LayerNormalization", {op_layer_norm}}, {"LeakyRelu", {op_leaky_relu}},
      {"Less", {op_less}}, {"LessOrEqual", {op_less_equal}}, {"Max", {op_max}}, {"Mean", {op_mean}},
      {"Min", {op_min}}, {"Mish", {op_mish}}, {"Mod", {op_mod}},
      {"NegativeLogLikelihoodLoss", {op_nll_loss}}, {"OneHot", {op_one_hot}}, {"Or", {op_or}},
      {"PRelu", {op_prelu}}, {"Range", {op_range}}, {"ReduceL1", {op_reduce_l1}}, {"ReduceL2", {op_reduce_l2}},
      {"ReduceLogSum", {op_reduce_log_sum}}, {"ReduceLogSumExp", {op_reduce_log_sum_exp}},
      {"ReduceMax", {op_reduce_max}}, {"ReduceMin", {op_reduce_min}}, {"ReduceProd", {op_reduce_prod}},
      {"ReduceSum", {op_reduce_sum}}, {"ReduceSumSquare", {op_reduce_sum_square}}, {"Round", {op_round}},
      {"Selu", {op_selu}}, {"Shrink", {op_shrink}}, {"Sign", {op_sign}}, {"Sinh", {op_sinh}},
      {"SoftmaxCrossEntropyLoss", {op_softmax_cross_entropy}}, {"Softplus", {op_softplus}},
      {"Softsign", {op_softsign}}, {"SpaceToDepth", {op_depth_to_space}}, {"Split", {op_split}},
      {"Sum", {op_sum}}, {"Tan", {op_tan}}, {"ThresholdedRelu", {op_thresholded_relu}}, {"Tile", {op_tile}},
      {"Trilu", {op_trilu}}, {"Where", {op_where}}, {"Xor", {op_xor}},
      {"Upsample", {op_upsample, check_upsample}}, {"Compress", {op_compress}},
      {"HannWindow", {op_window}}, {"HammingWindow", {op_window}}, {"BlackmanWindow", {op_window}},
      {"LRN", {op_lrn}}, {"RNN", {op_rnn_gru, check_rnn_gru}}, {"GRU", {op_rnn_gru, check_rnn_gru}}, {"ReverseSequence", {op_reverse_sequence}},
      {"NonZero", {op_nonzero}}, {"MeanVarianceNormalization", {op_mean_variance_norm}},
      {"LpNormalization", {op_lp_normalization}}, {"GlobalLpPool", {op_global_lp_pool}},
      {"LpPool", {op_lp_pool, check_pool}}, {"MelWeightMatrix", {op_mel_weight_matrix}},
      {"SequenceEmpty", {op_sequence_empty}}, {"SequenceConstruct", {op_sequence_construct}},
      {"SequenceInsert", {op_sequence_insert}}, {"SequenceErase", {op_sequence_erase}},
      {"SequenceAt", {op_sequence_at}}, {"SequenceLength", {op_sequence_length}},
      {"ConcatFromSequence", {op_concat_from_sequence}}, {"SplitToSequence", {op_split_to_sequence}},
      {"QuantizeLinear", {op_quantize_linear}}, {"DequantizeLinear", {op_dequantize_linear}},
      {"DynamicQuantizeLinear", {op_dynamic_quantize_linear}}, {"MatMulInteger", {op_matmul_integer}},
      {"QLinearMatMul", {op_qlinear_matmul}}, {"ConvInteger", {op_conv_integer}},
      {"QLinearConv", {op_qlinear_conv}},
      {"ScatterElements", {op_scatter_elements}}, {"Scatter", {op_scatter_elements}},
      {"ScatterND", {op_scatter_nd}}, {"TopK", {op_topk}},
      {"BitShift", {op_bitshift}}, {"BitwiseAnd", {op_bitwise}}, {"BitwiseOr", {op_bitwise}},
      {"BitwiseXor", {op_bitwise}}, {"BitwiseNot", {op_bitwise}}, {"Det", {op_det}}, {"DFT", {op_dft}},
      {"STFT", {op_stft}}, {"Bernoulli", {op_bernoulli}}, {"Multinomial", {op_multinomial}}, {"MaxRoiPool", {op_max_roi_pool}},
      {"Optional", {op_optional}}, {"OptionalHasElement", {op_optional_has_element}},
      {"OptionalGetElement", {op_optional_get_element}}, {"RandomUniform", {op_random}},
      {"RandomUniformLike", {op_random}}, {"RandomNormal", {op_random}}, {"RandomNormalLike", {op_random}},
      {"TfIdfVectorizer", {op_tfidf}},
      {"Einsum", {op_einsum}},
      {"Atan", {op_atan}}, {"Asin", {op_asin}}, {"Acos", {op_acos}},
      {"GridSample", {op_grid_sample}}, {"RoiAlign", {op_roi_align}}, {"Col2Im", {op_col2im}},
      {"CenterCropPad", {op_center_crop_pad}}, {"AffineGrid", {op_affine_grid}}, {"DeformConv", {op_deform_conv}},
      {"Unique", {op_unique}},
      {"NonMaxSuppression", {op_non_max_suppression}},
  };
  return t;
}

}  // namespace

std::string check_carried_types(Node& n, std::unordered_map<std::string, int32_t>& types) {
  auto carried_of = [&](const std::string& name) -> int32_t {
    auto it = types.find(name);
    return it == types.end() ? 0 : it->second;
  };
  auto mark_outputs = [&](int32_t t) {
    for (const auto& o : n.outputs)
      if (!o.empty()) types[o] = t;
  };
  if (n.op_type == "Cast" || n.op_type == "CastLike") {
    int32_t to = 0;
    if (n.op_type == "Cast") to = static_cast<int32_t>(n.get_int("to", 0));
    else if (n.inputs.size() > 1) to = carried_of(n.inputs[1]);
    int32_t from = n.inputs.empty() ? 0 : carried_of(n.inputs[0]);
    if (!is_carried_type(to)) return "";
    // uint16 → uint32/uint64 and uint32 → uint64 (and the same type) keep every value; others could wrap.
    bool widening = from == to || (from == 4 && (to == 12 || to == 13)) || (from == 12 && to == 13);
    if (!widening)
      return fmt::format("to={} from a value of another type (Protean carries {} in a wider type and does not "
                         "wrap at its width)", onnx_type_name(to), onnx_type_name(to));
    mark_outputs(to);
    return "";
  }
  if (n.op_type == "EyeLike" && is_carried_type(static_cast<int32_t>(n.get_int("dtype", 0)))) {
    mark_outputs(static_cast<int32_t>(n.get_int("dtype", 0)));  // zeros and ones
    return "";
  }
  int32_t seen = 0;
  size_t first = n.inputs.size();
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (int32_t t = carried_of(n.inputs[i]); t != 0 && seen == 0) {
      seen = t;
      first = i;
    }
  for (const auto& c : n.captured)
    if (carried_of(c) != 0) return fmt::format("a subgraph reading a {} value", onnx_type_name(carried_of(c)));
  if (seen == 0) return "";
  // Ops whose outputs hold only values of their carried inputs (or bounded by them).
  static const std::set<std::string> kKeep = {
      "Identity", "Max", "Min", "Mod", "Where", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose",
      "Concat", "Slice", "Gather", "GatherElements", "GatherND", "Expand", "Tile", "ReduceMax", "ReduceMin",
      "Split", "BitShift", "Clip", "Sign", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"};
  // Ops whose outputs are of a fixed other type.
  static const std::set<std::string> kOther = {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual",
                                               "Shape", "Size", "ArgMax", "ArgMin", "NonZero"};
  if (kOther.count(n.op_type)) return "";
  if (n.op_type == "Pow" && first == 1) return "";  // a carried exponent; the result has the base's type
  if (!kKeep.count(n.op_type))
    return fmt::format("{} input(s) (Protean carries {} in a wider type; this op could leave its range)",
                       onnx_type_name(seen), onnx_type_name(seen));
  if (n.op_type == "BitShift" || n.op_type == "BitwiseNot") {
    Attr a;
    a.type = Attr::Type::Int;
    a.i = seen;
    n.attrs["protean_carried_type"] = a;
  }
  mark_outputs(seen);
  return "";
}

void check_sequence_inputs(const Node& n, const Inputs& in) {
  static const std::set<std::string> kTakeSequences = {"SequenceInsert", "SequenceErase", "SequenceAt",
                                                        "SequenceLength", "ConcatFromSequence", "Identity",
                                                        "Optional", "OptionalHasElement", "OptionalGetElement"};
  if (kTakeSequences.count(n.op_type)) return;
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] && in[i]->is_sequence())
      throw TypeError(fmt::format("input {} is a {}; {} takes tensors", i, in[i]->describe(), n.op_type));
}

const OpDef* find_op(const std::string& op_type) {
  const auto& t = op_table();
  auto it = t.find(op_type);
  return it == t.end() ? nullptr : &it->second;
}

Tensor as_tensor(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Tensor: return v.t;
    case Value::Kind::None: throw ValueError("value is undefined");
    case Value::Kind::Sequence: throw TypeError(fmt::format("a {} where a tensor was expected", v.describe()));
    case Value::Kind::Bools: {
      std::vector<bool> b;
      for (const auto& x : v.bools) b.push_back(static_cast<bool>(x));
      IntVec sizes = v.scalar ? IntVec{} : IntVec{static_cast<int64_t>(b.size())};
      return tensor<bool>(b, sizes);
    }
    case Value::Kind::Ints: {
      IntVec sizes = v.scalar ? IntVec{} : IntVec{static_cast<int64_t>(v.ints.size())};
      Tensor t;
      if (all_concrete(v.ints)) {
        t = tensor<int64_t>(hints(v.ints), sizes);
      } else {
        // Traceable: each element is arange(s, s + 1), so symbolic sizes stay symbolic in the graph.
        TensorList parts;
        for (const auto& s : v.ints) parts.push_back(arange(s, s + 1, 1, DType::I64));
        t = cat(parts, 0);
        if (v.scalar) t = reshape(t, {});
      }
      return v.dtype == DType::I64 ? t : cast(t, v.dtype);
    }
  }
  return {};
}

Value constant_value(const Node& n) {
  if (const Tensor* t = n.get_tensor("value")) return Value::tensor(*t);
  if (n.attr("value_float")) return Value::tensor(scalar_tensor(n.get_float("value_float", 0), DType::F32));
  if (const Attr* a = n.attr("value_floats")) {
    std::vector<float> f(a->floats.begin(), a->floats.end());
    return Value::tensor(tensor<float>(f, {static_cast<int64_t>(f.size())}));
  }
  if (n.attr("value_int")) return Value::tensor(tensor<int64_t>({n.get_int("value_int", 0)}, {}));
  if (n.attr("value_ints")) {
    IntVec v = n.get_ints("value_ints");
    return Value::tensor(tensor<int64_t>(v, {static_cast<int64_t>(v.size())}));
  }
  throw FormatError(fmt::format("Constant node {} has no value attribute", n.label()));
}

}  // namespace protean::onnx::detail
