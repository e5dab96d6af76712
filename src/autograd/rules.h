// Shared helpers of the reverse rules (src/autograd/rules_*.cpp). Everything here is written with the
// public ops, so it runs eagerly and records into a capture alike.
#pragma once

#include <cmath>

#include "autograd/engine.h"
#include "protean/autograd.h"
#include "protean/ops.h"

namespace protean::autograd {

using Grads = std::vector<Tensor>;

#define PT_GRAD(op, saves, note) Grads rule_##op(const GradCtx& c);
#include "ops/derivatives.def"

/// 0-dim tensor of `dtype` holding v.
inline Tensor scalar(double v, DType dtype) { return full({}, v, dtype); }
/// 0-dim tensor holding a (possibly symbolic) size, as `dtype`: a graph value under capture.
Tensor size_scalar(const SymInt& n, DType dtype);
/// Reduction dims of attrs["dims"] wrapped for rank r (empty = all dims).
IntVec reduced_dims(const ops::Attrs& a, int64_t r);
/// g of a reduction over `dims` brought back to `sizes` (unsqueezed when !keepdim, then expanded).
Tensor expand_back(const Tensor& g, const IntVec& dims, bool keepdim, const SymIntVec& sizes);
/// Product of sizes[dims].
SymInt count_of(const SymIntVec& sizes, const IntVec& dims);
inline int64_t wrap(int64_t d, int64_t r) { return d < 0 ? d + std::max<int64_t>(r, 1) : d; }
/// Swaps the last two dims.
inline Tensor mT(const Tensor& t) { return transpose(t, -2, -1); }

}  // namespace protean::autograd
