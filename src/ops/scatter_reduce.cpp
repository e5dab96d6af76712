// scatter_reduce (torch.scatter_reduce): x with each element of src combined into the position that
// index names along `dim`, with reduce = sum, prod, amax or amin. Every other coordinate is the
// element's own (index and src have x's rank; index's sizes are at most src's, and at most x's off
// `dim`). include_self = false starts each named position from its first src element instead of x's
// value. Elements combine serially in index order (row-major over index), so repeated positions give the
// same answer on every run. Floating dtypes combine in their OpMath type (f16/bf16 in float); amax / amin
// propagate NaN like torch.maximum. ONNX's ScatterElements and ScatterND (reduction add / mul / max /
// min) are built on it by the importer.
#include <fmt/format.h>

#include <cmath>
#include <type_traits>

#include "core/strided_copy.h"
#include "ops/dispatch.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
constexpr OpKind kOp = OpKind::scatter_reduce;

enum class Reduce { Sum, Prod, Amax, Amin };
template <typename T>
using Unsigned = std::make_unsigned_t<T>;
Reduce parse_reduce(const std::string& r, Ins in) {
  if (r == "sum") return Reduce::Sum;
  if (r == "prod") return Reduce::Prod;
  if (r == "amax") return Reduce::Amax;
  if (r == "amin") return Reduce::Amin;
  throw ValueError(fmt::format("{}: reduce must be sum, prod, amax or amin, got \"{}\"", describe_call(kOp, in), r));
}

std::vector<TensorMeta> meta_scatter_reduce(Ins in, const Attrs& a) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  if (!x.defined() || !idx.defined() || !src.defined())
    throw ValueError(fmt::format("{}: x, index and src are required", describe_call(kOp, in)));
  parse_reduce(a.s("reduce"), in);
  const int64_t r = std::max<int64_t>(x.dim(), 1);
  const int64_t d = wrap_dim(a.i("dim"), r, "scatter_reduce");
  if (!is_integral(idx.dtype())) throw TypeError(fmt::format("{}: index must be an integer tensor", describe_call(kOp, in)));
  if (std::max<int64_t>(idx.dim(), 1) != r || std::max<int64_t>(src.dim(), 1) != r)
    throw ShapeError(fmt::format("{}: index and src must have x's rank", describe_call(kOp, in)));
  if (src.dtype() != x.dtype())
    throw TypeError(fmt::format("{}: src dtype {} must equal x's {}", describe_call(kOp, in), short_name(src.dtype()),
                                short_name(x.dtype())));
  if (x.dtype() == DType::Bool) throw TypeError(fmt::format("{}: bool tensors are not supported", describe_call(kOp, in)));
  for (int64_t i = 0; i < idx.dim(); ++i) {
    if (!static_cast<bool>(idx.size(i) <= src.size(i)))
      throw ShapeError(fmt::format("{}: index size at dim {} exceeds src's", describe_call(kOp, in), i));
    if (i != d && !static_cast<bool>(idx.size(i) <= x.size(i)))
      throw ShapeError(fmt::format("{}: index size at dim {} exceeds x's", describe_call(kOp, in), i));
  }
  return one(x.sizes(), x.dtype());
}

template <typename M>
M combine(Reduce r, M a, M b) {
  switch (r) {
    case Reduce::Sum:  // integers wrap (two's complement), as torch does
      if constexpr (std::is_integral_v<M>) return static_cast<M>(static_cast<Unsigned<M>>(a) + static_cast<Unsigned<M>>(b));
      else return a + b;
    case Reduce::Prod:
      if constexpr (std::is_integral_v<M>) return static_cast<M>(static_cast<Unsigned<M>>(a) * static_cast<Unsigned<M>>(b));
      else return a * b;
    case Reduce::Amax:
      if constexpr (std::is_floating_point_v<M>) { if (a != a) return a; if (b != b) return b; }
      return a > b ? a : b;
    case Reduce::Amin:
      if constexpr (std::is_floating_point_v<M>) { if (a != a) return a; if (b != b) return b; }
      return a < b ? a : b;
  }
  return a;
}

std::vector<Tensor> kernel_scatter_reduce(Ins in, const Attrs& a, Outs out) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  const Reduce red = parse_reduce(a.s("reduce"), in);
  const bool include_self = a.b("include_self");
  const int64_t r = std::max<int64_t>(x.dim(), 1);
  const int64_t d = wrap_dim(a.i("dim"), r, "scatter_reduce");
  Tensor y = core::contiguous_copy(x, x.dtype());
  Tensor iv = core::contiguous_copy(idx, DType::I64);
  Tensor sv = core::contiguous_copy(src, src.dtype());
  IntVec xs = x.dim() == 0 ? IntVec{1} : x.int_sizes();
  IntVec is = idx.dim() == 0 ? IntVec{1} : idx.int_sizes();
  IntVec ss = src.dim() == 0 ? IntVec{1} : src.int_sizes();
  IntVec ystr(static_cast<size_t>(r), 1), sstr(static_cast<size_t>(r), 1);
  for (int64_t k = r - 2; k >= 0; --k) {
    ystr[static_cast<size_t>(k)] = ystr[static_cast<size_t>(k + 1)] * xs[static_cast<size_t>(k + 1)];
    sstr[static_cast<size_t>(k)] = sstr[static_cast<size_t>(k + 1)] * ss[static_cast<size_t>(k + 1)];
  }
  const int64_t n = iv.int_numel(), len = xs[static_cast<size_t>(d)];
  const int64_t* pi = iv.data_ptr<int64_t>();
  std::vector<bool> started(include_self ? 0 : static_cast<size_t>(y.int_numel()), false);
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      using M = kernel::OpMath<T>;
      T* py = y.data_ptr<T>();
      const T* ps = sv.data_ptr<T>();
      for (int64_t lin = 0; lin < n; ++lin) {  // serial: repeated positions combine in index order
        int64_t v = pi[lin];
        if (v < -len || v >= len)
          throw ValueError(fmt::format("{}: index {} is out of range for size {} at dim {}", describe_call(kOp, in), v,
                                       len, d));
        if (v < 0) v += len;
        int64_t rem = lin, yo = 0, so = 0;
        for (size_t k = is.size(); k-- > 0;) {
          const int64_t c = rem % is[k];
          rem /= is[k];
          so += c * sstr[k];
          yo += (static_cast<int64_t>(k) == d ? v : c) * ystr[k];
        }
        const M s = static_cast<M>(ps[so]);
        if (!include_self && !started[static_cast<size_t>(yo)]) {
          started[static_cast<size_t>(yo)] = true;
          py[yo] = static_cast<T>(s);
        } else {
          py[yo] = static_cast<T>(combine<M>(red, static_cast<M>(py[yo]), s));
        }
      }
    }
  });
  Tensor res = empty_like_meta(out[0]);
  core::copy_into(res, y);
  return {res};
}

}  // namespace

PROTEAN_REGISTER_OP(scatter_reduce, meta_scatter_reduce, kernel_scatter_reduce);

}  // namespace protean::ops

namespace protean {

Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce,
                      bool include_self) {
  return ops::call1(ops::OpKind::scatter_reduce, {x, index, src},
                    {{"dim", SymInt(dim)}, {"reduce", reduce}, {"include_self", include_self}});
}

}  // namespace protean
