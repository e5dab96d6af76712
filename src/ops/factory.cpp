// Factory ops (full, arange: no tensor inputs, metadata from attributes) and clone (contiguous copy).
//
// full: `value` (a double) converts to the dtype like cast does (floating → integer truncates, bool is
//       value != 0).
// arange: integer start/end/step (SymInts, so a symbolic end gives a symbolic length
//       max(0, ceil((end - start) / step))); element i is start + i·step converted to the dtype.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {
namespace {
using namespace kernel;
using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using Result = std::vector<Tensor>;

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else if constexpr (is_float_v<T>) return static_cast<T>(static_cast<OpMath<T>>(v));
  else return std::isnan(v) ? T(0) : static_cast<T>(static_cast<int64_t>(v));
}

// ---- full ----------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_full(Ins, const Attrs& a) {
  const SymIntVec& shape = a.sym_ints("shape");
  for (size_t i = 0; i < shape.size(); ++i) {
    int64_t v;
    if (shape[i].maybe_as_int(v) && v < 0)
      throw ValueError(fmt::format("full: negative size {} at dim {} of shape {} (sizes must be >= 0)", v, i,
                                   to_string(shape)));
  }
  return one(shape, a.dtype("dtype"));
}
Result k_full(Ins, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  double value = a.f("value");
  dispatch_dtype(out.dtype(), [&]<typename T>() {
    const T v = from_double<T>(value);
    T* __restrict p = out.data_ptr<T>();
    parallel_for(out.int_numel(), 1, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) p[i] = v;
    });
  });
  return {out};
}

// ---- arange --------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_arange(Ins, const Attrs& a) {
  SymInt start = a.sym_int("start"), end = a.sym_int("end"), step = a.sym_int("step");
  DType t = a.dtype("dtype");
  if (t == DType::Bool) throw TypeError("arange: dtype bool is not supported (expected a numeric dtype)");
  if (static_cast<bool>(step == 0))
    throw ValueError(fmt::format("arange(start={}, end={}, step=0): step must be non-zero", start.str(), end.str()));
  int64_t ci_start = 0, ci_end = 0, ci_step = 0;
  if (start.maybe_as_int(ci_start) && end.maybe_as_int(ci_end) && step.maybe_as_int(ci_step)) {
    // Exact in 128 bits: end - start and the rounding both overflow int64 for extreme bounds.
    __int128 span = static_cast<__int128>(ci_end) - ci_start, st = ci_step;
    if (st < 0) span = -span, st = -st;
    __int128 n = span <= 0 ? 0 : (span + st - 1) / st;
    if (n > std::numeric_limits<int64_t>::max())
      throw ValueError(fmt::format("arange(start={}, end={}, step={}): too many elements", ci_start, ci_end, ci_step));
    return one({SymInt(static_cast<int64_t>(n))}, t);
  }
  SymInt len = static_cast<bool>(step > 0) ? ceil_div(end - start, step) : ceil_div(start - end, -step);
  return one({sym_max(SymInt(0), len)}, t);
}
Result k_arange(Ins, const Attrs& a, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  int64_t start = a.i("start"), step = a.i("step");
  dispatch_dtype(out.dtype(), [&]<typename T>() {
    T* __restrict p = out.data_ptr<T>();
    parallel_for(out.int_numel(), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // Wrapping unsigned arithmetic: start + i * step fits in int64, but i * step alone may not.
        int64_t v = static_cast<int64_t>(static_cast<uint64_t>(start) +
                                         static_cast<uint64_t>(i) * static_cast<uint64_t>(step));
        if constexpr (is_float_v<T>) p[i] = static_cast<T>(static_cast<OpMath<T>>(static_cast<double>(v)));
        else p[i] = static_cast<T>(v);
      }
    });
  });
  return {out};
}

// ---- clone ---------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_clone(Ins in, const Attrs&) {
  if (!in[0].defined()) throw ValueError("clone(None): input 0 is undefined; a tensor is required");
  return one(in[0].sizes(), in[0].dtype());
}
Result k_clone(Ins in, const Attrs&, Outs m) {
  Tensor out = empty_like_meta(m[0]);
  copy_into(out, in[0]);
  return {out};
}

}  // namespace

PROTEAN_REGISTER_OP(full, meta_full, k_full);
PROTEAN_REGISTER_OP(arange, meta_arange, k_arange);
PROTEAN_REGISTER_OP(clone, meta_clone, k_clone);

}  // namespace protean::ops
