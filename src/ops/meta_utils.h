// Shared helpers for meta functions: dim wrapping, broadcasting and type promotion on (possibly
// symbolic) metadata. They never read tensor data.
#pragma once

#include <span>
#include <string>

#include "ops/registry.h"

namespace protean::ops {

/// Wraps a possibly-negative dim into [0, rank). For rank 0, dims -1 and 0 are accepted (PyTorch's
/// scalar rule). Throws ValueError naming `op`.
int64_t wrap_dim(int64_t dim, int64_t rank, std::string_view op);
/// Wraps a dim list, sorted ascending, without duplicates (ValueError on a repeated dim). Empty input
/// means "all dims" when `empty_means_all`.
IntVec wrap_dims(const IntVec& dims, int64_t rank, std::string_view op, bool empty_means_all = true);

/// PyTorch broadcasting of two shapes. Comparing a symbolic size with 1 adds a guard, as in PyTorch.
/// Throws ShapeError "op: shapes [..] and [..] are not broadcastable (dim i: a vs b)".
SymIntVec broadcast_shapes(const SymIntVec& a, const SymIntVec& b, std::string_view op);
SymIntVec broadcast_shapes(std::span<const Tensor> ts, std::string_view op);

/// torch.result_type over tensors: dim>0 tensors decide the dtype; 0-dim tensors only raise the
/// category (bool < integer < floating). Undefined tensors are skipped.
DType result_type(std::span<const Tensor> ts);
/// The float type an integer/bool input turns into for ops like div/exp/mean (f32, the default dtype).
inline DType to_float_type(DType t) { return is_floating(t) ? t : DType::F32; }

/// Output shape of a reduction over `dims` (already wrapped).
SymIntVec reduced_shape(const SymIntVec& in, const IntVec& dims, bool keepdim);

/// Throws TypeError "op: dtype X not supported (expected ...)" unless `ok`.
void check_dtype(bool ok, std::string_view op, DType got, std::string_view expected);

/// A single contiguous output.
inline std::vector<TensorMeta> one(SymIntVec sizes, DType dtype) {
  return {TensorMeta::contiguous(std::move(sizes), dtype)};
}

}  // namespace protean::ops
