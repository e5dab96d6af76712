// Indexing: gather, index_select, embedding.
//
// Index tensors are integer (i64 as in PyTorch; i32/i8/u8 accepted too). Indices are not wrapped:
// a negative or too-large index is a ValueError naming the bad value, the dim and its size (checked
// in a serial pass before the parallel copy, so no exception crosses an OpenMP region).
// index_select with the attribute `wrap_negative = true` takes indices in [-size, size) and reads
// index i < 0 as size + i: ONNX Gather's semantics, so the importer needs no normalizing pointwise
// pass over the indices (that pass was a kernel of its own on the GPU).
#include <fmt/format.h>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"

namespace protean::ops {

namespace {

void check_index_dtype(OpKind op, std::span<const Tensor> in, const Tensor& idx) {
  if (!is_integral(idx.dtype()))
    throw TypeError(fmt::format("{}: index tensor must be an integer tensor (i64 or i32), got {}",
                                describe_call(op, in), short_name(idx.dtype())));
}

/// Index values in row-major order (a contiguous i64 copy), each checked against [0, size); with
/// `wrap_negative` one in [-size, 0) is first read as size + index.
std::vector<int64_t> checked_indices(OpKind op, std::span<const Tensor> in, const Tensor& idx, int64_t size,
                                     int64_t dim, bool wrap_negative = false) {
  std::vector<int64_t> v(static_cast<size_t>(idx.int_numel()));
  if (v.empty()) return v;
  const void* p = idx.data_ptr();
  size_t k = 0;
  core::for_each_offset2(idx.int_sizes(), idx.int_strides(), idx.int_strides(), [&](int64_t o, int64_t) {
    v[k++] = core::read_index(p, idx.dtype(), o);
  });
  for (int64_t& i : v) {
    if (wrap_negative && i < 0 && i >= -size) i += size;
    if (i < 0 || i >= size)
      throw ValueError(fmt::format("{}: index {} is out of bounds for dim {} with size {} (valid: [{}, {}))",
                                   describe_call(op, in), i, dim, size, wrap_negative ? -size : 0, size));
  }
  return v;
}

// ---- gather -----------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_gather(std::span<const Tensor> in, const Attrs& a) {
  const Tensor &x = in[0], &idx = in[1];
  check_index_dtype(OpKind::gather, in, idx);
  int64_t r = x.dim();
  int64_t d = wrap_dim(a.i("dim"), r, "gather");
  int64_t ri = idx.dim();
  if (std::max<int64_t>(r, 1) != std::max<int64_t>(ri, 1))
    throw ShapeError(fmt::format("{}: index must have the same rank as the input ({}), got {}",
                                 describe_call(OpKind::gather, in), r, ri));
  for (int64_t i = 0; i < ri && r > 0; ++i) {
    if (i == d) continue;
    if (!static_cast<bool>(idx.sizes()[static_cast<size_t>(i)] <= x.sizes()[static_cast<size_t>(i)]))
      throw ShapeError(fmt::format("{}: index size {} at dim {} exceeds the input's size {} (only dim {} may be "
                                   "larger)",
                                   describe_call(OpKind::gather, in), idx.sizes()[static_cast<size_t>(i)].str(), i,
                                   x.sizes()[static_cast<size_t>(i)].str(), d));
  }
  return one(idx.sizes(), x.dtype());
}

std::vector<Tensor> kernel_gather(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  const Tensor &x = in[0], &idx = in[1];
  Tensor y = empty_like_meta(out[0]);
  int64_t r = x.dim();
  int64_t d = r == 0 ? 0 : wrap_dim(a.i("dim"), r, "gather");
  IntVec xs = r == 0 ? IntVec{1} : x.int_sizes();
  IntVec xst = r == 0 ? IntVec{1} : x.int_strides();
  std::vector<int64_t> iv = checked_indices(OpKind::gather, in, idx, xs[static_cast<size_t>(d)], d);
  if (iv.empty()) return {y};
  IntVec isz = idx.dim() == 0 ? IntVec{1} : idx.int_sizes();
  int64_t n = static_cast<int64_t>(iv.size());
  size_t rr = isz.size();
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    const T* px = x.data_ptr<T>();
    T* py = y.data_ptr<T>();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (int64_t lin = 0; lin < n; ++lin) {
      int64_t rem = lin, off = 0;
      for (size_t k = rr; k-- > 0;) {
        int64_t c = rem % isz[k];
        rem /= isz[k];
        off += (static_cast<int64_t>(k) == d ? iv[static_cast<size_t>(lin)] : c) * xst[k];
      }
      py[lin] = px[off];
    }
  });
  return {y};
}

// ---- index_select -------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_index_select(std::span<const Tensor> in, const Attrs& a) {
  const Tensor &x = in[0], &idx = in[1];
  check_index_dtype(OpKind::index_select, in, idx);
  if (idx.dim() > 1)
    throw ShapeError(fmt::format("{}: index must be 0-D or 1-D, got rank {}", describe_call(OpKind::index_select, in),
                                 idx.dim()));
  if (x.dim() == 0)
    throw ValueError(fmt::format("{}: index_select on a 0-dim tensor is not supported (unsqueeze it first)",
                                 describe_call(OpKind::index_select, in)));
  int64_t d = wrap_dim(a.i("dim"), x.dim(), "index_select");
  SymIntVec sizes = x.sizes();
  sizes[static_cast<size_t>(d)] = idx.numel();
  return one(std::move(sizes), x.dtype());
}

std::vector<Tensor> kernel_index_select(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  const Tensor &x = in[0], &idx = in[1];
  Tensor y = empty_like_meta(out[0]);
  int64_t d = wrap_dim(a.i("dim"), x.dim(), "index_select");
  IntVec xs = x.int_sizes();
  std::vector<int64_t> iv = checked_indices(OpKind::index_select, in, idx, xs[static_cast<size_t>(d)], d,
                                            a.has("wrap_negative") && a.b("wrap_negative"));
  if (y.int_numel() == 0) return {y};
  // y viewed as [outer, k, inner] ← x slices: copy x.select(d, iv[j]) into y.select(d, j).
  IntVec sub_sizes = xs;
  sub_sizes.erase(sub_sizes.begin() + d);
  IntVec xst = x.int_strides(), yst = y.int_strides();
  int64_t xsd = xst[static_cast<size_t>(d)], ysd = yst[static_cast<size_t>(d)];
  xst.erase(xst.begin() + d);
  yst.erase(yst.begin() + d);
  int64_t xoff = x.storage_offset().hint();
  int64_t k = static_cast<int64_t>(iv.size());
#pragma omp parallel for schedule(static) if (y.int_numel() > 32768 && k > 1)
  for (int64_t j = 0; j < k; ++j)
    core::copy_into(core::strided_view(y, sub_sizes, yst, j * ysd),
                      core::strided_view(x, sub_sizes, xst, xoff + iv[static_cast<size_t>(j)] * xsd));
  return {y};
}

// ---- embedding ----------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_embedding(std::span<const Tensor> in, const Attrs&) {
  const Tensor &w = in[0], &idx = in[1];
  if (w.dim() != 2)
    throw ShapeError(fmt::format("{}: weight must be 2-D [num_embeddings, embedding_dim], got rank {}",
                                 describe_call(OpKind::embedding, in), w.dim()));
  check_index_dtype(OpKind::embedding, in, idx);
  SymIntVec sizes = idx.sizes();
  sizes.push_back(w.sizes()[1]);
  return one(std::move(sizes), w.dtype());
}

std::vector<Tensor> kernel_embedding(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  const Tensor &w = in[0], &idx = in[1];
  Tensor y = empty_like_meta(out[0]);
  IntVec ws = w.int_sizes(), wst = w.int_strides();
  std::vector<int64_t> iv = checked_indices(OpKind::embedding, in, idx, ws[0], 0);
  int64_t n = static_cast<int64_t>(iv.size()), dim = ws[1];
  if (n == 0 || dim == 0) return {y};
  dispatch_dtype(w.dtype(), [&]<typename T>() {
    const T* pw = w.data_ptr<T>();
    T* py = y.data_ptr<T>();
#pragma omp parallel for schedule(static) if (n * dim > 32768)
    for (int64_t i = 0; i < n; ++i) {
      const T* row = pw + iv[static_cast<size_t>(i)] * wst[0];
      T* dst = py + i * dim;
      if (wst[1] == 1)
        std::memcpy(static_cast<void*>(dst), static_cast<const void*>(row), static_cast<size_t>(dim) * sizeof(T));
      else
        for (int64_t j = 0; j < dim; ++j) dst[j] = row[j * wst[1]];
    }
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(gather, meta_gather, kernel_gather);
PROTEAN_REGISTER_OP(index_select, meta_index_select, kernel_index_select);
PROTEAN_REGISTER_OP(embedding, meta_embedding, kernel_embedding);

}  // namespace protean::ops
