#include "ops/meta_utils.h"

#include <fmt/format.h>

#include <algorithm>

namespace protean::ops {

int64_t wrap_dim(int64_t dim, int64_t rank, std::string_view op) {
  int64_t r = rank == 0 ? 1 : rank;
  if (dim < -r || dim >= r)
    throw ValueError(fmt::format("{}: dim {} out of range for a tensor of rank {} (valid: [{}, {}])", op, dim, rank,
                                 -r, r - 1));
  return dim < 0 ? dim + r : dim;
}

IntVec wrap_dims(const IntVec& dims, int64_t rank, std::string_view op, bool empty_means_all) {
  IntVec out;
  if (dims.empty() && empty_means_all) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) out.push_back(rank == 0 ? (wrap_dim(d, rank, op), 0) : wrap_dim(d, rank, op));
  std::sort(out.begin(), out.end());
  if (rank > 0 && std::adjacent_find(out.begin(), out.end()) != out.end())
    throw ValueError(fmt::format("{}: dim appears more than once in {}", op, to_string(to_symint_vec(dims))));
  if (rank == 0) out.clear();
  return out;
}

SymIntVec broadcast_shapes(const SymIntVec& a, const SymIntVec& b, std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  SymIntVec out(n);
  for (size_t i = 0; i < n; ++i) {
    // align trailing dims
    bool ha = i < a.size(), hb = i < b.size();
    const SymInt& x = ha ? a[a.size() - 1 - i] : SymInt(1);
    const SymInt& y = hb ? b[b.size() - 1 - i] : SymInt(1);
    SymInt r;
    if (!ha) r = y;
    else if (!hb) r = x;
    else if (x.expr() == y.expr() && (x.is_symbolic() || x.hint() == y.hint())) r = x;  // same size, no guard
    // Two symbols traced with the same size (also 1, kept symbolic under dynamic=On): the result is
    // that size whenever they are equal, so guard the equality, not which one is 1.
    else if (x.is_symbolic() && y.is_symbolic() && x.hint() == y.hint() && static_cast<bool>(x == y)) r = x;
    else if (static_cast<bool>(x == 1)) r = y;
    else if (static_cast<bool>(y == 1)) r = x;
    else if (static_cast<bool>(x == y)) r = x;
    else
      throw ShapeError(fmt::format("{}: shapes {} and {} are not broadcastable (dim {} from the end: {} vs {})", op,
                                   to_string(a), to_string(b), i, x.str(), y.str()));
    out[n - 1 - i] = r;
  }
  return out;
}

SymIntVec broadcast_shapes(std::span<const Tensor> ts, std::string_view op) {
  SymIntVec out;
  bool first = true;
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    out = first ? t.sizes() : broadcast_shapes(out, t.sizes(), op);
    first = false;
  }
  return out;
}

namespace {
int category(DType t) { return t == DType::Bool ? 0 : is_floating(t) ? 2 : 1; }
}  // namespace

DType result_type(std::span<const Tensor> ts) {
  bool have_dim = false, have_zero = false;
  DType dim_t = DType::Bool, zero_t = DType::Bool;
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    if (t.dim() > 0) {
      dim_t = have_dim ? promote_types(dim_t, t.dtype()) : t.dtype();
      have_dim = true;
    } else {
      zero_t = have_zero ? promote_types(zero_t, t.dtype()) : t.dtype();
      have_zero = true;
    }
  }
  if (!have_dim) return zero_t;
  if (have_zero && category(zero_t) > category(dim_t)) return promote_types(dim_t, zero_t);
  return dim_t;
}

SymIntVec reduced_shape(const SymIntVec& in, const IntVec& dims, bool keepdim) {
  SymIntVec out;
  for (size_t i = 0; i < in.size(); ++i) {
    bool red = std::find(dims.begin(), dims.end(), static_cast<int64_t>(i)) != dims.end();
    if (!red) out.push_back(in[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

void check_dtype(bool ok, std::string_view op, DType got, std::string_view expected) {
  if (!ok) throw TypeError(fmt::format("{}: dtype {} is not supported (expected {})", op, short_name(got), expected));
}

}  // namespace protean::ops
