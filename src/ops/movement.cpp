// Data movement: cat, stack (copies) and split (views).
//
// cat/stack promote dtypes like torch.cat (promote_types over every input, including skipped ones).
// cat skips 1-D tensors of size 0 whatever the other inputs' ranks are — PyTorch's legacy rule, kept
// because exported models still rely on it (torch.cat([x, torch.empty(0)]) works for any x).
#include <fmt/format.h>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"

namespace protean::ops {

namespace {

void check_defined(OpKind op, std::span<const Tensor> in) {
  if (in.empty())
    throw ValueError(fmt::format("{}: expected a non-empty list of tensors", op_name(op)));
  for (size_t i = 0; i < in.size(); ++i)
    if (!in[i].defined())
      throw ValueError(fmt::format("{}: tensor {} of the list is undefined", describe_call(op, in), i));
}

DType promoted(std::span<const Tensor> in) {
  DType t = in[0].dtype();
  for (const auto& x : in) t = promote_types(t, x.dtype());
  return t;
}

bool legacy_empty(const Tensor& t) { return t.dim() == 1 && static_cast<bool>(t.sizes()[0] == 0); }

// ---- cat --------------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_cat(std::span<const Tensor> in, const Attrs& a) {
  check_defined(OpKind::cat, in);
  DType dt = promoted(in);
  const Tensor* ref = nullptr;
  for (const auto& t : in)
    if (!legacy_empty(t)) {
      ref = &t;
      break;
    }
  if (!ref) {
    wrap_dim(a.i("dim"), 1, "cat");
    return one({SymInt(0)}, dt);
  }
  int64_t r = ref->dim();
  if (r == 0)
    throw ShapeError(fmt::format("{}: zero-dimensional tensors cannot be concatenated (unsqueeze or use stack)",
                                 describe_call(OpKind::cat, in)));
  int64_t d = wrap_dim(a.i("dim"), r, "cat");
  SymIntVec sizes = ref->sizes();
  SymInt total = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    const Tensor& t = in[k];
    if (legacy_empty(t)) continue;
    if (t.dim() != r)
      throw ShapeError(fmt::format("{}: tensor {} has rank {} but tensor 0 has rank {} (all inputs need the same "
                                   "rank, except legacy 1-D empty tensors)",
                                   describe_call(OpKind::cat, in), k, t.dim(), r));
    for (int64_t i = 0; i < r; ++i) {
      if (i == d) continue;
      const SymInt& s = t.sizes()[static_cast<size_t>(i)];
      const SymInt& e = sizes[static_cast<size_t>(i)];
      if (s.expr() == e.expr() && (s.is_symbolic() || s.hint() == e.hint())) continue;
      if (!static_cast<bool>(s == e))
        throw ShapeError(fmt::format("{}: sizes must match except in dim {}; tensor {} has size {} at dim {}, "
                                     "expected {}",
                                     describe_call(OpKind::cat, in), d, k, s.str(), i, e.str()));
    }
    total = total + t.sizes()[static_cast<size_t>(d)];
  }
  sizes[static_cast<size_t>(d)] = total;
  return one(std::move(sizes), dt);
}

std::vector<Tensor> kernel_cat(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  Tensor y = empty_like_meta(out[0]);
  if (y.dim() == 1 && y.int_sizes()[0] == 0) return {y};
  int64_t d = wrap_dim(a.i("dim"), y.dim(), "cat");
  IntVec ystrides = y.int_strides();
  int64_t off = 0;
  for (const auto& t : in) {
    if (legacy_empty(t)) continue;
    IntVec sz = t.int_sizes();
    core::copy_into(core::strided_view(y, sz, ystrides, off * ystrides[static_cast<size_t>(d)]), t);
    off += sz[static_cast<size_t>(d)];
  }
  return {y};
}

// ---- stack ------------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_stack(std::span<const Tensor> in, const Attrs& a) {
  check_defined(OpKind::stack, in);
  const Tensor& ref = in[0];
  int64_t r = ref.dim();
  int64_t d = a.i("dim");
  if (d < -(r + 1) || d > r)
    throw ValueError(fmt::format("{}: dim {} out of range (valid: [{}, {}])", describe_call(OpKind::stack, in), d,
                                 -(r + 1), r));
  if (d < 0) d += r + 1;
  for (size_t k = 1; k < in.size(); ++k) {
    const Tensor& t = in[k];
    bool same = t.dim() == r;
    for (int64_t i = 0; same && i < r; ++i) {
      const SymInt& s = t.sizes()[static_cast<size_t>(i)];
      const SymInt& e = ref.sizes()[static_cast<size_t>(i)];
      if (s.expr() == e.expr() && (s.is_symbolic() || s.hint() == e.hint())) continue;
      same = static_cast<bool>(s == e);
    }
    if (!same)
      throw ShapeError(fmt::format("{}: all tensors must have the same shape; tensor {} is {} but tensor 0 is {}",
                                   describe_call(OpKind::stack, in), k, to_string(t.sizes()), to_string(ref.sizes())));
  }
  SymIntVec sizes = ref.sizes();
  sizes.insert(sizes.begin() + d, SymInt(static_cast<int64_t>(in.size())));
  return one(std::move(sizes), promoted(in));
}

std::vector<Tensor> kernel_stack(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  Tensor y = empty_like_meta(out[0]);
  int64_t r = in[0].dim();
  int64_t d = a.i("dim");
  if (d < 0) d += r + 1;
  IntVec ys = y.int_strides();
  IntVec sub_strides = ys;
  sub_strides.erase(sub_strides.begin() + d);
  for (size_t k = 0; k < in.size(); ++k)
    core::copy_into(
        core::strided_view(y, in[k].int_sizes(), sub_strides, static_cast<int64_t>(k) * ys[static_cast<size_t>(d)]),
        in[k]);
  return {y};
}

// ---- split ------------------------------------------------------------------------------------------
std::vector<TensorMeta> meta_split(std::span<const Tensor> in, const Attrs& a) {
  const Tensor& x = in[0];
  int64_t r = x.dim();
  if (r == 0) throw ValueError(fmt::format("{}: cannot split a 0-dim tensor", describe_call(OpKind::split, in)));
  int64_t d = wrap_dim(a.i("dim"), r, "split");
  const SymIntVec& pieces = a.sym_ints("sizes");
  SymInt sum = 0;
  for (const auto& p : pieces) {
    if (!p.is_symbolic() && p.hint() < 0)
      throw ValueError(fmt::format("{}: split sizes must be >= 0, got {}", describe_call(OpKind::split, in),
                                   to_string(pieces)));
    sum = sum + p;
  }
  const SymInt& size = x.sizes()[static_cast<size_t>(d)];
  if (!static_cast<bool>(sum == size))
    throw ShapeError(fmt::format("{}: split sizes {} sum to {} but dim {} has size {}", describe_call(OpKind::split, in),
                                 to_string(pieces), sum.str(), d, size.str()));
  std::vector<TensorMeta> outs;
  SymInt start = 0;
  for (const auto& p : pieces) {
    TensorMeta m;
    m.sizes = x.sizes();
    m.sizes[static_cast<size_t>(d)] = p;
    m.strides = x.strides();
    m.storage_offset = x.storage_offset() + start * x.strides()[static_cast<size_t>(d)];
    m.dtype = x.dtype();
    m.device = x.device();
    m.alias_of = 0;
    outs.push_back(std::move(m));
    start = start + p;
  }
  return outs;
}

std::vector<Tensor> kernel_split(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  std::vector<Tensor> r;
  r.reserve(out.size());
  for (const auto& m : out) r.push_back(make_view(in[0], m));
  return r;
}

}  // namespace

PROTEAN_REGISTER_OP(cat, meta_cat, kernel_cat);
PROTEAN_REGISTER_OP(stack, meta_stack, kernel_stack);
PROTEAN_REGISTER_OP(split, meta_split, kernel_split);

}  // namespace protean::ops
