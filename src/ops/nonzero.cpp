// nonzero: indices of the non-zero elements, i64 [n, rank], in row-major order. Also
// local_scalar_dense, the value of a one-element tensor (Tensor::item_symint), at the end.
//
// Special case in the op table: n depends on the data (flag kDataDependentShape).
//  * Under capture (any FakeTensor input) the meta function cannot know n. Until the symbolic engine
//    can hand out unbacked sizes, it throws CompileError, which the capture layer turns into a graph
//    break (or an error under fullgraph).
//  * On real tensors the meta function reads the data to count n, so that run_meta and run_eager
//    agree. The kernel does not trust that count: it counts again and builds its own output
//    metadata ([n, rank], contiguous) — the only kernel that does not allocate from `out`.
#include <fmt/format.h>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"

namespace protean::ops {

namespace {

template <typename T>
bool is_nonzero(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return static_cast<float>(v) != 0.0f;
  else
    return v != T(0);
}

/// Row-major flat positions (0..numel) of the non-zero elements.
std::vector<int64_t> nonzero_positions(const Tensor& x) {
  std::vector<int64_t> pos;
  IntVec sz = x.int_sizes(), st = x.int_strides();
  if (x.int_numel() == 0) return pos;
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    const T* p = x.data_ptr<T>();
    int64_t lin = 0;
    core::for_each_offset2(sz, st, st, [&](int64_t o, int64_t) {
      if (is_nonzero(p[o])) pos.push_back(lin);
      ++lin;
    });
  });
  return pos;
}

std::vector<TensorMeta> meta_nonzero(std::span<const Tensor> in, const Attrs&) {
  const Tensor& x = in[0];
  if (x.is_fake())
    throw CompileError(fmt::format("{}: output size depends on data (the number of non-zero elements), which is "
                                   "unknown while capturing; this is a graph break",
                                   describe_call(OpKind::nonzero, in)));
  int64_t n = static_cast<int64_t>(nonzero_positions(x).size());
  return one({SymInt(n), SymInt(x.dim())}, DType::I64);
}

std::vector<Tensor> kernel_nonzero(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta>) {
  const Tensor& x = in[0];
  std::vector<int64_t> pos = nonzero_positions(x);
  int64_t n = static_cast<int64_t>(pos.size()), r = x.dim();
  Tensor y = empty_like_meta(TensorMeta::contiguous({SymInt(n), SymInt(r)}, DType::I64));
  IntVec sz = x.int_sizes();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = pos[static_cast<size_t>(i)];
    for (int64_t k = r; k-- > 0;) {
      py[i * r + k] = rem % sz[static_cast<size_t>(k)];
      rem /= sz[static_cast<size_t>(k)];
    }
  }
  return {y};
}

// ---- local_scalar_dense (Tensor::item_symint) ---------------------------------------------------
// The value of a one-element integer or bool tensor as an i64[] tensor. Under capture with
// capture_scalar_outputs the node's `symbol` attribute is the unbacked symbol u<n> standing for the
// value; backends bind it from this output when the graph runs. The kernel ignores the attribute.
std::vector<TensorMeta> meta_local_scalar_dense(std::span<const Tensor> in, const Attrs&) {
  const Tensor& x = in[0];
  if (!is_integral(x.dtype(), /*include_bool=*/true))
    throw TypeError(fmt::format("{}: item_symint() needs an integer or bool tensor; read a floating tensor with "
                                "item<double>()",
                                describe_call(OpKind::local_scalar_dense, in)));
  if (static_cast<bool>(x.numel() != 1))
    throw ValueError(fmt::format("{}: item_symint() needs a tensor with exactly one element",
                                 describe_call(OpKind::local_scalar_dense, in)));
  return one({}, DType::I64);
}

std::vector<Tensor> kernel_local_scalar_dense(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> m) {
  const Tensor& x = in[0];
  Tensor y = empty_like_meta(m[0]);
  const void* p = x.data_ptr();
  *y.data_ptr<int64_t>() = dispatch_dtype(x.dtype(), [&]<typename T>() -> int64_t {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return static_cast<int64_t>(static_cast<float>(*static_cast<const T*>(p)));
    else
      return static_cast<int64_t>(*static_cast<const T*>(p));
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(local_scalar_dense, meta_local_scalar_dense, kernel_local_scalar_dense);
PROTEAN_REGISTER_OP(nonzero, meta_nonzero, kernel_nonzero);

}  // namespace protean::ops
