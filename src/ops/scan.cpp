// Scans: cumsum.
//
// Output dtype follows torch.cumsum: bool and integer inputs accumulate into i64; floating inputs keep
// their dtype (accumulated in double, rounded once per output element).
#include <fmt/format.h>

#include "ops/meta_utils.h"
#include "ops/registry.h"

namespace protean::ops {

namespace {

DType cumsum_dtype(DType t) { return is_floating(t) ? t : DType::I64; }

std::vector<TensorMeta> meta_cumsum(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  wrap_dim(a.i("dim"), x.dim(), "cumsum");
  return one(x.sizes(), cumsum_dtype(x.dtype()));
}

std::vector<Tensor> kernel_cumsum(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  const Tensor& x = in[0];
  Tensor y = empty_like_meta(out[0]);
  if (y.int_numel() == 0) return {y};
  int64_t r = x.dim();
  int64_t d = r == 0 ? 0 : wrap_dim(a.i("dim"), r, "cumsum");
  IntVec xs = r == 0 ? IntVec{1} : x.int_sizes();
  IntVec xst = r == 0 ? IntVec{1} : x.int_strides();
  IntVec yst = r == 0 ? IntVec{1} : y.int_strides();
  // Lines along d: enumerate the other dims as one flattened index.
  IntVec osz;
  IntVec ox, oy;
  for (size_t i = 0; i < xs.size(); ++i)
    if (static_cast<int64_t>(i) != d) {
      osz.push_back(xs[i]);
      ox.push_back(xst[i]);
      oy.push_back(yst[i]);
    }
  int64_t lines = 1;
  for (int64_t s : osz) lines *= s;
  int64_t len = xs[static_cast<size_t>(d)], sx = xst[static_cast<size_t>(d)], sy = yst[static_cast<size_t>(d)];
  dispatch_dtype(x.dtype(), [&]<typename S>() {
    dispatch_dtype(y.dtype(), [&]<typename D>() {
      const S* px = x.data_ptr<S>();
      D* py = y.data_ptr<D>();
      using Acc = std::conditional_t<std::is_same_v<D, int64_t>, int64_t, double>;
#pragma omp parallel for schedule(static) if (lines * len > 32768 && lines > 1)
      for (int64_t l = 0; l < lines; ++l) {
        int64_t rem = l, offx = 0, offy = 0;
        for (size_t k = osz.size(); k-- > 0;) {
          int64_t c = rem % osz[k];
          rem /= osz[k];
          offx += c * ox[k];
          offy += c * oy[k];
        }
        Acc acc = 0;
        for (int64_t i = 0; i < len; ++i) {
          S v = px[offx + i * sx];
          if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
            acc += static_cast<Acc>(static_cast<float>(v));
          else
            acc += static_cast<Acc>(v);
          if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
            py[offy + i * sy] = D(static_cast<float>(acc));
          else
            py[offy + i * sy] = static_cast<D>(acc);
        }
      }
    });
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(cumsum, meta_cumsum, kernel_cumsum);

}  // namespace protean::ops
