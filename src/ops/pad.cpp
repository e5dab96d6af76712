// pad: meta function and CPU kernel.
//
// Semantics (torch.nn.functional.pad): `pads` lists (lo, hi) pairs starting from the last dim
// ({left, right, top, bottom, ...}); an even count, at most 2·rank. Output size of a padded dim is
// size + lo + hi (must be ≥ 0). Negative pads crop. Modes:
//  * constant: new elements are `value` (converted to the dtype).
//  * reflect: mirror without repeating the edge (x[1], x[0] | x[0], x[1], ...); needs lo, hi < size.
//  * replicate: repeat the edge element; needs size ≥ 1 when anything is added.
#include <fmt/format.h>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

std::vector<TensorMeta> meta_pad(std::span<const Tensor> in, const Attrs& attrs) {
  const Tensor& x = in[0];
  const SymIntVec& pads = attrs.sym_ints("pads");
  const std::string& mode = attrs.has("mode") ? attrs.s("mode") : std::string("constant");
  if (mode != "constant" && mode != "reflect" && mode != "replicate")
    throw ValueError(fmt::format("{}: mode must be constant, reflect or replicate, got \"{}\"",
                                 describe_call(OpKind::pad, in), mode));
  if (pads.size() % 2 != 0 || static_cast<int64_t>(pads.size()) > 2 * x.dim())
    throw ValueError(fmt::format("{}: pads must be (lo, hi) pairs for at most {} dims, got {}",
                                 describe_call(OpKind::pad, in), x.dim(), to_string(pads)));
  SymIntVec out = x.sizes();
  for (size_t i = 0; i < pads.size() / 2; ++i) {
    size_t d = static_cast<size_t>(x.dim()) - 1 - i;
    const SymInt& lo = pads[2 * i];
    const SymInt& hi = pads[2 * i + 1];
    const SymInt& size = out[d];
    if (mode == "reflect" && (static_cast<bool>(lo >= size) || static_cast<bool>(hi >= size)))
      throw ValueError(fmt::format("{}: reflect padding ({}, {}) of dim {} must be smaller than its size {}",
                                   describe_call(OpKind::pad, in), lo.str(), hi.str(), d, size.str()));
    SymInt o = size + lo + hi;
    if (mode == "replicate" && static_cast<bool>(size == 0) && static_cast<bool>(o > 0))
      throw ValueError(fmt::format("{}: replicate padding of the empty dim {}", describe_call(OpKind::pad, in), d));
    if (static_cast<bool>(o < 0))
      throw ShapeError(fmt::format("{}: pads ({}, {}) make dim {} of size {} negative", describe_call(OpKind::pad, in),
                                   lo.str(), hi.str(), d, size.str()));
    out[d] = o;
  }
  return one(std::move(out), x.dtype());
}

std::vector<Tensor> kernel_pad(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  Tensor y = empty_like_meta(out[0]);
  int64_t n = y.int_numel();
  if (n == 0) return {y};
  IntVec xs = x.int_sizes(), st = x.int_strides(), ys = y.int_sizes();
  IntVec pads = attrs.ints("pads");
  std::string mode = attrs.has("mode") ? attrs.s("mode") : std::string("constant");
  double value = attrs.has("value") ? attrs.f("value") : 0.0;
  size_t r = xs.size();
  IntVec lo(r, 0);
  for (size_t i = 0; i < pads.size() / 2; ++i) lo[r - 1 - i] = pads[2 * i];
  int m = mode == "constant" ? 0 : mode == "reflect" ? 1 : 2;
  // Per dim and output index: the source offset, or -1 for "constant value".
  std::vector<std::vector<int64_t>> maps(r);
  for (size_t d = 0; d < r; ++d) {
    maps[d].resize(static_cast<size_t>(ys[d]));
    for (int64_t o = 0; o < ys[d]; ++o) {
      int64_t p = o - lo[d];
      if (p < 0 || p >= xs[d]) {
        if (m == 0) p = -1;
        else if (m == 1) p = p < 0 ? -p : 2 * (xs[d] - 1) - p;
        else p = p < 0 ? 0 : xs[d] - 1;
      }
      maps[d][static_cast<size_t>(o)] = p < 0 ? -1 : p * st[d];
    }
  }
  int64_t inner = r ? ys[r - 1] : 1;
  int64_t rows = n / inner;
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    const T* src = x.int_numel() ? x.data_ptr<T>() : nullptr;
    T* dst = y.data_ptr<T>();
    T fill;
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      fill = T(static_cast<float>(value));
    else
      fill = static_cast<T>(value);
#pragma omp parallel for num_threads(protean::num_threads()) if (n > (1 << 18))
    for (int64_t row = 0; row < rows; ++row) {
      int64_t rem = row, off = 0;
      bool outside = false;
      for (size_t d = r - 1; d-- > 0;) {
        int64_t idx = rem % ys[d];
        rem /= ys[d];
        int64_t s = maps[d][static_cast<size_t>(idx)];
        if (s < 0) outside = true;
        else off += s;
      }
      T* o = dst + row * inner;
      if (r == 0) {
        o[0] = src[0];
        continue;
      }
      const std::vector<int64_t>& last = maps[r - 1];
      for (int64_t j = 0; j < inner; ++j) {
        int64_t s = last[static_cast<size_t>(j)];
        o[j] = outside || s < 0 ? fill : src[off + s];
      }
    }
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(pad, meta_pad, kernel_pad);

}  // namespace protean::ops
