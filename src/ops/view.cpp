// View ops: view reshape permute expand squeeze unsqueeze slice select.
//
// Every meta function here computes the output's sizes, strides and storage offset symbolically from
// the input's (SymInt arithmetic; comparisons that decide a branch guard during capture). Outputs of
// true views carry alias_of = 0 and the eager kernels return make_view(input, meta): no data moves.
// reshape is the one op that may copy: its meta decides (alias_of = 0 for a view, -1 for a copy).
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"

namespace protean::ops {

namespace {

bool is_concrete(const SymInt& s, int64_t v) { return !s.is_symbolic() && s.hint() == v; }

TensorMeta view_meta(const Tensor& x, SymIntVec sizes, SymIntVec strides, SymInt offset) {
  TensorMeta m;
  m.sizes = std::move(sizes);
  m.strides = std::move(strides);
  m.storage_offset = std::move(offset);
  m.dtype = x.dtype();
  m.device = x.device();
  m.alias_of = 0;
  return m;
}

std::vector<Tensor> kernel_view(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  return {make_view(in[0], out[0])};
}

// ---- view / reshape -------------------------------------------------------------------------------

/// Resolves a requested shape against `numel`: at most one -1 (inferred), other entries >= 0, and the
/// product must equal numel. Throws ShapeError/ValueError naming the call.
SymIntVec infer_shape(OpKind op, std::span<const Tensor> in, const SymIntVec& shape) {
  const SymInt numel = in[0].numel();
  int infer = -1;
  SymInt known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const SymInt& s = shape[i];
    if (is_concrete(s, -1)) {
      if (infer >= 0)
        throw ValueError(fmt::format("{}: only one dimension can be inferred (-1) in shape {}", describe_call(op, in),
                                     to_string(shape)));
      infer = static_cast<int>(i);
      continue;
    }
    if (!s.is_symbolic() && s.hint() < 0)
      throw ValueError(fmt::format("{}: invalid size {} at index {} of shape {} (sizes are >= 0, or -1 once)",
                                   describe_call(op, in), s.hint(), i, to_string(shape)));
    known = known * s;
  }
  SymIntVec out = shape;
  if (infer >= 0) {
    if (static_cast<bool>(known == 0))
      throw ShapeError(fmt::format("{}: cannot infer the -1 in shape {}: the other sizes multiply to 0, so any "
                                   "size would fit",
                                   describe_call(op, in), to_string(shape)));
    if (!static_cast<bool>(numel % known == 0))
      throw ShapeError(fmt::format("{}: shape {} is invalid for an input of {} elements", describe_call(op, in),
                                   to_string(shape), numel.str()));
    out[static_cast<size_t>(infer)] = numel / known;
  } else if (!static_cast<bool>(numel == known)) {
    throw ShapeError(fmt::format("{}: shape {} is invalid for an input of {} elements", describe_call(op, in),
                                 to_string(shape), numel.str()));
  }
  return out;
}

/// Strides that let a tensor (old sizes/strides) be viewed with `nsizes` without copying, or nullopt.
/// Same rule as PyTorch's computeStride: the old dims are grouped into maximal runs that are
/// contiguous with each other ("chunks"); each chunk must be covered exactly by a run of new dims, which
/// then get strides derived from the chunk's innermost stride. Size-1 dims fit anywhere.
std::optional<SymIntVec> view_strides(const SymIntVec& osizes, const SymIntVec& ostrides, const SymIntVec& nsizes) {
  SymIntVec nstrides(nsizes.size());
  if (osizes.empty()) {  // a 0-dim tensor: every new dim has size 1
    for (auto& s : nstrides) s = 1;
    return nstrides;
  }
  SymInt numel = sym_product(osizes);
  if (static_cast<bool>(numel == 0)) {
    // Nothing to address: any strides work; use contiguous ones (size 0 treated as 1).
    SymInt acc = 1;
    for (size_t i = nsizes.size(); i-- > 0;) {
      nstrides[i] = acc;
      acc = acc * sym_max(nsizes[i], 1);
    }
    return nstrides;
  }
  int64_t vd = static_cast<int64_t>(nsizes.size()) - 1;
  SymInt base = ostrides.back();
  SymInt tnumel = 1, vnumel = 1;
  for (int64_t td = static_cast<int64_t>(osizes.size()) - 1; td >= 0; --td) {
    tnumel = tnumel * osizes[static_cast<size_t>(td)];
    bool chunk_ends = td == 0;
    if (!chunk_ends) {
      const SymInt& prev_size = osizes[static_cast<size_t>(td - 1)];
      const SymInt& prev_stride = ostrides[static_cast<size_t>(td - 1)];
      chunk_ends = static_cast<bool>(prev_size != 1) && static_cast<bool>(prev_stride != tnumel * base);
    }
    if (!chunk_ends) continue;
    while (vd >= 0 && (static_cast<bool>(vnumel < tnumel) || static_cast<bool>(nsizes[static_cast<size_t>(vd)] == 1))) {
      nstrides[static_cast<size_t>(vd)] = vnumel * base;
      vnumel = vnumel * nsizes[static_cast<size_t>(vd)];
      --vd;
    }
    if (!static_cast<bool>(vnumel == tnumel)) return std::nullopt;
    if (td > 0) {
      base = ostrides[static_cast<size_t>(td - 1)];
      tnumel = 1;
      vnumel = 1;
    }
  }
  if (vd != -1) return std::nullopt;
  return nstrides;
}

std::vector<TensorMeta> meta_view(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  SymIntVec shape = infer_shape(OpKind::view, in, a.sym_ints("shape"));
  auto st = view_strides(x.sizes(), x.strides(), shape);
  if (!st)
    throw ShapeError(fmt::format("{}: shape {} is not compatible with the input's strides {} (at least one "
                                 "dimension spans two non-contiguous chunks); use reshape, which copies",
                                 describe_call(OpKind::view, in), to_string(shape), to_string(x.strides())));
  return {view_meta(x, std::move(shape), std::move(*st), x.storage_offset())};
}

std::vector<TensorMeta> meta_reshape(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  SymIntVec shape = infer_shape(OpKind::reshape, in, a.sym_ints("shape"));
  if (auto st = view_strides(x.sizes(), x.strides(), shape))
    return {view_meta(x, std::move(shape), std::move(*st), x.storage_offset())};
  return {TensorMeta::contiguous(std::move(shape), x.dtype(), x.device())};  // alias_of = -1: a copy
}

std::vector<Tensor> kernel_reshape(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  if (out[0].alias_of == 0) return {make_view(in[0], out[0])};
  // Copy: read the input in row-major order into a contiguous tensor of the new shape. Viewing the
  // fresh contiguous result with the input's shape gives a destination with matching element order.
  Tensor y = empty_like_meta(out[0]);
  Tensor dst = core::strided_view(y, in[0].int_sizes(), hints(contiguous_strides(in[0].sizes())), 0);
  core::copy_into(dst, in[0]);
  return {y};
}

// ---- permute ----------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_permute(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  IntVec dims = a.ints("dims");
  int64_t r = x.dim();
  if (static_cast<int64_t>(dims.size()) != r)
    throw ValueError(fmt::format("{}: dims {} must list each of the {} dims exactly once", describe_call(OpKind::permute, in),
                                 to_string(to_symint_vec(dims)), r));
  std::vector<bool> seen(static_cast<size_t>(r), false);
  SymIntVec sizes, strides;
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, r, "permute");
    if (r == 0) continue;
    if (seen[static_cast<size_t>(w)])
      throw ValueError(fmt::format("{}: dim {} repeats in dims {}", describe_call(OpKind::permute, in), d,
                                   to_string(to_symint_vec(dims))));
    seen[static_cast<size_t>(w)] = true;
    sizes.push_back(x.sizes()[static_cast<size_t>(w)]);
    strides.push_back(x.strides()[static_cast<size_t>(w)]);
  }
  return {view_meta(x, std::move(sizes), std::move(strides), x.storage_offset())};
}

// ---- expand -----------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_expand(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  const SymIntVec& target = a.sym_ints("sizes");
  int64_t r = x.dim(), n = static_cast<int64_t>(target.size());
  if (n < r)
    throw ShapeError(fmt::format("{}: the number of sizes {} ({}) must be at least the input's rank {}",
                                 describe_call(OpKind::expand, in), to_string(target), n, r));
  SymIntVec sizes(static_cast<size_t>(n)), strides(static_cast<size_t>(n));
  for (int64_t i = n - 1; i >= 0; --i) {
    const SymInt& t = target[static_cast<size_t>(i)];
    int64_t j = i - (n - r);
    if (j < 0) {
      if (!t.is_symbolic() && t.hint() < 0)
        throw ValueError(fmt::format("{}: size {} for the new leading dim {} (new dims need an explicit size >= 0)",
                                     describe_call(OpKind::expand, in), t.hint(), i));
      sizes[static_cast<size_t>(i)] = t;
      strides[static_cast<size_t>(i)] = 0;
      continue;
    }
    const SymInt& s = x.sizes()[static_cast<size_t>(j)];
    const SymInt& st = x.strides()[static_cast<size_t>(j)];
    if (is_concrete(t, -1) || (t.expr() == s.expr() && (t.is_symbolic() || t.hint() == s.hint()))) {
      sizes[static_cast<size_t>(i)] = s;
      strides[static_cast<size_t>(i)] = st;
    } else if (!t.is_symbolic() && t.hint() < 0) {
      throw ValueError(fmt::format("{}: invalid size {} at index {} (sizes are >= 0, or -1 to keep)",
                                   describe_call(OpKind::expand, in), t.hint(), i));
    } else if (static_cast<bool>(s == 1)) {
      sizes[static_cast<size_t>(i)] = t;
      strides[static_cast<size_t>(i)] = 0;
    } else if (static_cast<bool>(s == t)) {
      sizes[static_cast<size_t>(i)] = s;
      strides[static_cast<size_t>(i)] = st;
    } else {
      throw ShapeError(fmt::format("{}: cannot expand to {}: dim {} has size {} (only size-1 dims expand)",
                                   describe_call(OpKind::expand, in), to_string(target), j, s.str()));
    }
  }
  return {view_meta(x, std::move(sizes), std::move(strides), x.storage_offset())};
}

// ---- squeeze / unsqueeze ---------------------------------------------------------------------------
std::vector<TensorMeta> meta_squeeze(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  IntVec dims = a.ints("dims");
  int64_t r = x.dim();
  std::vector<bool> cand(static_cast<size_t>(r), dims.empty());
  for (int64_t d : wrap_dims(dims, r, "squeeze", /*empty_means_all=*/false)) cand[static_cast<size_t>(d)] = true;
  SymIntVec sizes, strides;
  for (int64_t i = 0; i < r; ++i) {
    const SymInt& s = x.sizes()[static_cast<size_t>(i)];
    // Only size-1 dims are removed; naming a dim of another size is a no-op, as in PyTorch.
    if (cand[static_cast<size_t>(i)] && static_cast<bool>(s == 1)) continue;
    sizes.push_back(s);
    strides.push_back(x.strides()[static_cast<size_t>(i)]);
  }
  return {view_meta(x, std::move(sizes), std::move(strides), x.storage_offset())};
}

std::vector<TensorMeta> meta_unsqueeze(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  int64_t r = x.dim();
  int64_t d = a.i("dim");
  if (d < -(r + 1) || d > r)
    throw ValueError(fmt::format("{}: dim {} out of range (valid: [{}, {}])", describe_call(OpKind::unsqueeze, in), d,
                                 -(r + 1), r));
  if (d < 0) d += r + 1;
  SymIntVec sizes = x.sizes(), strides = x.strides();
  SymInt st = d == r ? SymInt(1) : sizes[static_cast<size_t>(d)] * strides[static_cast<size_t>(d)];
  sizes.insert(sizes.begin() + d, SymInt(1));
  strides.insert(strides.begin() + d, st);
  return {view_meta(x, std::move(sizes), std::move(strides), x.storage_offset())};
}

// ---- slice / select --------------------------------------------------------------------------------
/// Python slice bound: negative counts from the end, then clamp to [0, size].
SymInt clamp_bound(SymInt v, const SymInt& size) {
  if (static_cast<bool>(v < 0)) {
    v = v + size;
    if (static_cast<bool>(v < 0)) v = 0;
  } else if (static_cast<bool>(v > size)) {
    v = size;
  }
  return v;
}

std::vector<TensorMeta> meta_slice(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  int64_t r = x.dim();
  if (r == 0)
    throw ValueError(fmt::format("{}: cannot slice a 0-dim tensor", describe_call(OpKind::slice, in)));
  int64_t d = wrap_dim(a.i("dim"), r, "slice");
  SymInt step = a.sym_int("step");
  if (static_cast<bool>(step <= 0))
    throw ValueError(fmt::format("{}: step must be positive, got {}", describe_call(OpKind::slice, in), step.str()));
  const SymInt& size = x.sizes()[static_cast<size_t>(d)];
  SymInt start = clamp_bound(a.sym_int("start"), size);
  SymInt end = clamp_bound(a.sym_int("end"), size);
  if (static_cast<bool>(end < start)) end = start;
  SymIntVec sizes = x.sizes(), strides = x.strides();
  SymInt offset = x.storage_offset() + start * strides[static_cast<size_t>(d)];
  // start and end are clamped to [0, size], so end - start cannot overflow; (n + step - 1) can for a
  // huge step, hence the form (n - 1) / step + 1 for a non-empty concrete range.
  int64_t ci_start = 0, ci_end = 0, ci_step = 0;
  if (is_concrete(step, 1))
    sizes[static_cast<size_t>(d)] = end - start;
  else if (start.maybe_as_int(ci_start) && end.maybe_as_int(ci_end) && step.maybe_as_int(ci_step))
    sizes[static_cast<size_t>(d)] = SymInt(ci_end == ci_start ? 0 : (ci_end - ci_start - 1) / ci_step + 1);
  else
    sizes[static_cast<size_t>(d)] = (end - start + step - 1) / step;
  strides[static_cast<size_t>(d)] = strides[static_cast<size_t>(d)] * step;
  return {view_meta(x, std::move(sizes), std::move(strides), std::move(offset))};
}

std::vector<TensorMeta> meta_select(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  int64_t r = x.dim();
  if (r == 0)
    throw ValueError(fmt::format("{}: cannot select from a 0-dim tensor", describe_call(OpKind::select, in)));
  int64_t d = wrap_dim(a.i("dim"), r, "select");
  const SymInt& size = x.sizes()[static_cast<size_t>(d)];
  SymInt idx = a.sym_int("index");
  SymInt orig = idx;
  if (static_cast<bool>(idx < 0)) idx = idx + size;
  if (static_cast<bool>(idx < 0) || static_cast<bool>(idx >= size))
    throw ValueError(fmt::format("{}: index {} is out of range for dim {} of size {} (valid: [{}, {}))",
                                 describe_call(OpKind::select, in), orig.str(), d, size.str(), (-size).str(),
                                 size.str()));
  SymIntVec sizes = x.sizes(), strides = x.strides();
  SymInt offset = x.storage_offset() + idx * strides[static_cast<size_t>(d)];
  sizes.erase(sizes.begin() + d);
  strides.erase(strides.begin() + d);
  return {view_meta(x, std::move(sizes), std::move(strides), std::move(offset))};
}

}  // namespace

PROTEAN_REGISTER_OP(view, meta_view, kernel_view);
PROTEAN_REGISTER_OP(reshape, meta_reshape, kernel_reshape);
PROTEAN_REGISTER_OP(permute, meta_permute, kernel_view);
PROTEAN_REGISTER_OP(expand, meta_expand, kernel_view);
PROTEAN_REGISTER_OP(squeeze, meta_squeeze, kernel_view);
PROTEAN_REGISTER_OP(unsqueeze, meta_unsqueeze, kernel_view);
PROTEAN_REGISTER_OP(slice, meta_slice, kernel_view);
PROTEAN_REGISTER_OP(select, meta_select, kernel_view);

}  // namespace protean::ops
