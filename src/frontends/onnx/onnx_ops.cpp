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
#include <cmath>
#include <limits>
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
enum class Bin { Add, Sub, Mul, Div, Pow };

std::vector<Value> binary(const Node& n, const Inputs& in, Bin op) {
  const Value& a = need(n, in, 0);
  const Value& b = need(n, in, 1);
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
      Tensor r = div(ta, tb);
      // ONNX integer Div truncates; torch-style true division returns float.
      if (is_integral(ta.dtype(), true) && is_integral(tb.dtype(), true)) r = cast(r, ta.dtype());
      return one(r);
    }
    case Bin::Pow: {
      if (b.is_tensor() && !b.t.is_fake() && b.t.int_numel() == 1 && b.t.dim() <= ta.dim() && is_floating(ta.dtype()))
        return one(pow(ta, b.t.item<double>()));
      return one(pow(ta, as_tensor(b)));
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
  // Data-dependent indices: normalize negatives, gather along the flattened index, restore its shape.
  Tensor it = as_tensor(ind);
  if (it.dtype() != DType::I64) it = cast(it, DType::I64);
  it = where(lt(it, scalar_tensor(0, DType::I64)), add(it, wrap_scalar(static_cast<double>(x.size(ax).guard_int()), it)), it);
  SymIntVec out;
  for (int64_t i = 0; i < ax; ++i) out.push_back(x.size(i));
  for (const auto& s : it.sizes()) out.push_back(s);
  for (int64_t i = ax + 1; i < x.dim(); ++i) out.push_back(x.size(i));
  return one(reshape(index_select(x, ax, reshape(it, {-1})), out));
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

std::vector<Value> op_batch_norm(const Node& n, const Inputs& in) {
  return one(batch_norm(tin(n, in, 0), tin(n, in, 1), tin(n, in, 2), tin(n, in, 3), tin(n, in, 4),
                        n.get_float("epsilon", 1e-5)));
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

std::vector<Value> op_conv(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), wt = tin(n, in, 1), b = topt(in, 2);
  int64_t sp = x.dim() - 2;
  if (sp != 1 && sp != 2)
    throw NotImplementedError(fmt::format("Conv on a rank-{} input {} (only 1-D and 2-D convolutions)", x.dim(),
                                          to_string(x.sizes())));
  IntVec k;
  for (int64_t i = 0; i < sp; ++i) k.push_back(wt.size(2 + i).guard_int());
  Window w = window_attrs(n, x, k);
  int64_t group = n.get_int("group", 1);
  if (w.pad_begin != w.pad_end) {  // asymmetric: pad explicitly, then convolve without padding
    x = pad(x, torch_pads(w), "constant", 0.0);
    w.pad_begin.assign(sp, 0);
  }
  if (sp == 1) return one(conv1d(x, wt, b, w.stride, w.pad_begin, w.dilation, group));
  return one(conv2d(x, wt, b, w.stride, w.pad_begin, w.dilation, group));
}

std::vector<Value> op_conv_transpose(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0), wt = tin(n, in, 1), b = topt(in, 2);
  if (x.dim() != 4) throw NotImplementedError("ConvTranspose: only 2-D (rank-4 input) is supported");
  IntVec k = {wt.size(2).guard_int(), wt.size(3).guard_int()};
  Window w = window_attrs(n, x, k);
  if (w.pad_begin != w.pad_end) throw NotImplementedError("ConvTranspose with asymmetric pads");
  IntVec outpad = n.get_ints("output_padding", {0, 0});
  return one(conv_transpose2d(x, wt, b, w.stride, w.pad_begin, outpad, n.get_int("group", 1), w.dilation));
}

std::vector<Value> pool(const Node& n, const Inputs& in, bool is_max) {
  Tensor x = tin(n, in, 0);
  if (x.dim() != 4) throw NotImplementedError(fmt::format("{}: only 2-D pooling (rank-4 input)", n.op_type));
  IntVec k = n.get_ints("kernel_shape");
  if (k.size() != 2) throw ValueError("kernel_shape must have 2 entries");
  Window w = window_attrs(n, x, k);
  if (w.pad_begin != w.pad_end) throw NotImplementedError(fmt::format("{} with asymmetric pads", n.op_type));
  bool ceil_mode = n.get_int("ceil_mode", 0) != 0;
  if (is_max) return one(max_pool2d(x, k, w.stride, w.pad_begin, w.dilation, ceil_mode));
  return one(avg_pool2d(x, k, w.stride, w.pad_begin, ceil_mode, n.get_int("count_include_pad", 0) != 0));
}
std::vector<Value> op_max_pool(const Node& n, const Inputs& in) { return pool(n, in, true); }
std::vector<Value> op_avg_pool(const Node& n, const Inputs& in) { return pool(n, in, false); }

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
    if (opt(in, 3)) throw NotImplementedError("Pad with an axes input (opset 18)");
  }
  int64_t r = x.dim();
  if (static_cast<int64_t>(pads.size()) != 2 * r)
    throw ValueError(fmt::format("Pad: {} pads for a rank-{} input (need 2 per dim)", pads.size(), r));
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

std::vector<Value> op_resize(const Node& n, const Inputs& in) {
  Tensor x = tin(n, in, 0);
  if (x.dim() != 4) throw NotImplementedError("Resize: only rank-4 (N, C, H, W) inputs");
  std::string ctm = n.get_string("coordinate_transformation_mode", n.opset < 11 ? "asymmetric" : "half_pixel");
  const Value* scales = opt(in, n.opset < 11 ? 1 : 2);
  const Value* sizes = n.opset < 11 ? nullptr : opt(in, 3);
  auto empty_value = [](const Value* v) {
    return v && (v->is_host() ? v->host_size() == 0 : v->t.numel().hint() == 0);
  };
  if (empty_value(sizes)) sizes = nullptr;
  if (empty_value(scales)) scales = nullptr;
  if (sizes) {
    SymIntVec s = read_ints(*sizes, "Resize sizes");
    if (s.size() != 4) throw ValueError("Resize sizes must have 4 entries");
    if (ctm != "asymmetric")
      throw NotImplementedError("Resize with `sizes` needs coordinate_transformation_mode 'asymmetric'");
    return one(upsample_nearest2d(x, {s[2], s[3]}));
  }
  if (!scales) throw ValueError("Resize needs scales or sizes");
  std::vector<double> sc = read_floats(*scales, "Resize scales");
  if (sc.size() != 4) throw ValueError("Resize scales must have 4 entries");
  if (sc[0] != 1.0 || sc[1] != 1.0) throw NotImplementedError("Resize of the batch or channel dim");
  SymIntVec out;
  for (int i = 2; i < 4; ++i) {
    double s = sc[i];
    if (s < 1 || std::abs(s - std::round(s)) > 1e-6)
      throw NotImplementedError(fmt::format("Resize scale {} (only integer upsampling factors)", s));
    out.push_back(x.size(i) * static_cast<int64_t>(std::llround(s)));  // floor(H * s) for integer s
  }
  return one(upsample_nearest2d(x, out));
}

std::vector<Value> op_lstm(const Node& n, const Inputs& in) {
  Tensor X = tin(n, in, 0), W = tin(n, in, 1), R = tin(n, in, 2), B = topt(in, 3);
  if (const Value* sl = opt(in, 4)) {
    // Only the trivial case: every sequence is full length.
    int64_t T = X.size(0).guard_int();
    for (int64_t v : read_concrete_ints(*sl, "LSTM sequence_lens"))
      if (v != T) throw NotImplementedError("LSTM with sequence_lens shorter than the sequence");
  }
  Tensor h0 = topt(in, 5), c0 = topt(in, 6);
  auto [Y, Yh, Yc] = lstm(X, W, R, B, h0, c0, n.get_string("direction", "forward"));
  return {Value::tensor(Y), Value::tensor(Yh), Value::tensor(Yc)};
}

// ---- load-time feature checks ----------------------------------------------------------------------------
std::string check_resize(const Node& n) {
  std::string mode = n.get_string("mode", "nearest");
  if (mode != "nearest") return fmt::format("mode '{}' (only 'nearest')", mode);
  if (n.opset < 11) return "";
  std::string ctm = n.get_string("coordinate_transformation_mode", "half_pixel");
  std::string nm = n.get_string("nearest_mode", "round_prefer_floor");
  bool ok = (ctm == "asymmetric" && nm == "floor") ||
            ((ctm == "half_pixel" || ctm == "pytorch_half_pixel") &&
             (nm == "round_prefer_floor" || nm == "round_prefer_ceil"));
  if (!ok)
    return fmt::format("coordinate_transformation_mode '{}' with nearest_mode '{}' (supported: asymmetric+floor, "
                       "half_pixel+round_prefer_floor/ceil)", ctm, nm);
  return "";
}
std::string check_lstm(const Node& n) {
  if (n.get_int("layout", 0) != 0) return "layout=1 (batch-first)";
  if (n.attr("clip")) return "clip";
  if (n.get_int("input_forget", 0) != 0) return "input_forget=1";
  auto acts = n.get_strings("activations");
  for (size_t i = 0; i < acts.size(); ++i) {
    const char* want = (i % 3 == 0) ? "Sigmoid" : "Tanh";
    if (acts[i] != want) return fmt::format("activation '{}'", acts[i]);
  }
  if (n.has_input(7)) return "peephole weights (input P)";
  return "";
}
std::string check_pad(const Node& n) {
  std::string m = n.get_string("mode", "constant");
  if (m != "constant" && m != "reflect" && m != "edge") return fmt::format("mode '{}'", m);
  return "";
}
std::string check_cast(const Node& n) {
  int64_t to = n.get_int("to", 0);
  if (!dtype_from_onnx(static_cast<int32_t>(to))) return fmt::format("to={}", onnx_type_name(int32_t(to)));
  return "";
}
std::string check_pool(const Node& n) {
  std::string ap = n.get_string("auto_pad", "NOTSET");
  if (ap == "SAME_UPPER" || ap == "SAME_LOWER") return fmt::format("auto_pad={}", ap);
  if (n.outputs.size() > 1 && !n.outputs[1].empty()) return "the Indices output";
  return "";
}
std::string check_conv_transpose(const Node& n) {
  if (n.attr("output_shape")) return "the output_shape attribute";
  std::string ap = n.get_string("auto_pad", "NOTSET");
  if (ap != "NOTSET" && ap != "VALID") return fmt::format("auto_pad={}", ap);
  return "";
}
std::string check_batch_norm(const Node& n) {
  if (n.get_int("training_mode", 0) != 0) return "training_mode=1";
  for (size_t i = 1; i < n.outputs.size(); ++i)
    if (!n.outputs[i].empty()) return "training outputs (running mean/var)";
  return "";
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
      {"HardSwish", {op_hardswish}}, {"Identity", {op_identity}}, {"If", {nullptr}}, {"Log", {op_log}},
      {"LogSoftmax", {op_log_softmax}}, {"LSTM", {op_lstm, check_lstm}}, {"MatMul", {op_matmul}},
      {"MaxPool", {op_max_pool, check_pool}}, {"Mul", {op_mul}}, {"Neg", {op_neg}}, {"Not", {op_not}},
      {"Pad", {op_pad, check_pad}}, {"Pow", {op_pow}}, {"Reciprocal", {op_reciprocal}},
      {"ReduceMean", {op_reduce_mean}}, {"Relu", {op_relu}}, {"Reshape", {op_reshape}},
      {"Resize", {op_resize, check_resize}}, {"Shape", {op_shape}}, {"Sigmoid", {op_sigmoid}},
      {"Sin", {op_sin}}, {"Size", {op_size}}, {"Slice", {op_slice}}, {"Softmax", {op_softmax}},
      {"Sqrt", {op_sqrt}}, {"Squeeze", {op_squeeze}}, {"Sub", {op_sub}}, {"Tanh", {op_tanh}},
      {"Transpose", {op_transpose}}, {"Unsqueeze", {op_unsqueeze}},
  };
  return t;
}

}  // namespace

const OpDef* find_op(const std::string& op_type) {
  const auto& t = op_table();
  auto it = t.find(op_type);
  return it == t.end() ? nullptr : &it->second;
}

Tensor as_tensor(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Tensor: return v.t;
    case Value::Kind::None: throw ValueError("value is undefined");
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
