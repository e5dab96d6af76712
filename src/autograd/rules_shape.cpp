// Reverse rules: views and data movement (src/ops/derivatives.def).
#include <fmt/format.h>

#include "autograd/rules.h"

namespace protean::autograd {

namespace {
/// pads list (protean::pad's order: last dim first) that pads only `dim` of a rank-r tensor.
SymIntVec pads_for(int64_t dim, int64_t r, const SymInt& lo, const SymInt& hi) {
  SymIntVec p(static_cast<size_t>(2 * (r - dim)), SymInt(0));
  p[p.size() - 2] = lo;
  p[p.size() - 1] = hi;
  return p;
}
}  // namespace

Grads rule_expand(const GradCtx& c) { return {c.g[0]}; }  // the engine's sum_to_size
Grads rule_permute(const GradCtx& c) {
  IntVec p = c.attrs().ints("dims");
  const int64_t r = static_cast<int64_t>(p.size());
  IntVec inv(p.size());
  for (int64_t i = 0; i < r; ++i) inv[static_cast<size_t>(wrap(p[static_cast<size_t>(i)], r))] = i;
  return {permute(c.g[0], inv)};
}
Grads rule_reshape(const GradCtx& c) { return {reshape(c.g[0], c.in_sizes(0))}; }
Grads rule_view(const GradCtx& c) { return {reshape(c.g[0], c.in_sizes(0))}; }
Grads rule_squeeze(const GradCtx& c) { return {reshape(c.g[0], c.in_sizes(0))}; }
Grads rule_unsqueeze(const GradCtx& c) { return {reshape(c.g[0], c.in_sizes(0))}; }
Grads rule_select(const GradCtx& c) {
  const SymIntVec& xs = c.in_sizes(0);
  const int64_t r = static_cast<int64_t>(xs.size());
  const int64_t d = wrap(c.attrs().i("dim"), r);
  const SymInt& size = xs[static_cast<size_t>(d)];
  SymInt idx = c.attrs().sym_int("index");
  if (static_cast<bool>(idx < 0)) idx = idx + size;
  Tensor g = unsqueeze(c.g[0], d);
  return {pad(g, pads_for(d, r, idx, size - idx - 1), "constant", 0.0)};
}
Grads rule_slice(const GradCtx& c) {
  const SymIntVec& xs = c.in_sizes(0);
  const int64_t r = static_cast<int64_t>(xs.size());
  const int64_t d = wrap(c.attrs().i("dim"), r);
  const SymInt& size = xs[static_cast<size_t>(d)];
  const SymInt n = c.node.out_meta[0].sizes[static_cast<size_t>(d)];
  const int64_t step = c.attrs().i("step");
  // The start as the forward clamped it (Python slicing).
  SymInt start = c.attrs().sym_int("start");
  if (static_cast<bool>(start < 0)) start = start + size;
  if (static_cast<bool>(start < 0)) start = SymInt(0);
  if (static_cast<bool>(start > size)) start = size;
  Tensor g = c.g[0];
  SymInt len = n;
  if (step > 1) {
    // Interleave step - 1 zeros after every element, then drop what runs past the input's end.
    Tensor t = pad(unsqueeze(g, d + 1), pads_for(d + 1, r + 1, 0, step - 1), "constant", 0.0);
    SymIntVec merged = g.sizes();
    merged[static_cast<size_t>(d)] = n * step;
    g = reshape(t, merged);
    len = n * step;
    if (static_cast<bool>(len > size - start)) {
      g = slice(g, d, 0, size - start, 1);
      len = size - start;
    }
  }
  return {pad(g, pads_for(d, r, start, size - start - len), "constant", 0.0)};
}
Grads rule_pad(const GradCtx& c) {
  const std::string& mode = c.attrs().s("mode");
  if (mode != "constant")
    throw NotImplementedError(fmt::format("autograd: pad backward for mode \"{}\" is not implemented (constant only)", mode));
  SymIntVec neg;
  for (const SymInt& p : c.attrs().sym_ints("pads")) neg.push_back(-p);
  return {pad(c.g[0], neg, "constant", 0.0)};  // negative pads crop
}
Grads rule_cat(const GradCtx& c) {
  const size_t n = c.num_inputs();
  const int64_t r = static_cast<int64_t>(c.node.out_meta[0].sizes.size());
  const int64_t d = wrap(c.attrs().i("dim"), r);
  Grads out(n);
  SymInt off = 0;
  for (size_t i = 0; i < n; ++i) {
    const SymIntVec& s = c.in_sizes(i);
    if (static_cast<int64_t>(s.size()) != r) continue;  // a legacy empty 1-D input takes no rows
    SymInt len = s[static_cast<size_t>(d)];
    if (c.needs(i)) out[i] = slice(c.g[0], d, off, off + len, 1);
    off = off + len;
  }
  return out;
}
Grads rule_clone(const GradCtx& c) { return {c.g[0]}; }
Grads rule_split(const GradCtx& c) {
  const int64_t r = static_cast<int64_t>(c.in_sizes(0).size());
  const int64_t d = wrap(c.attrs().i("dim"), r);
  TensorList parts;
  for (size_t k = 0; k < c.g.size(); ++k) {
    const TensorMeta& m = c.node.out_meta[k];
    parts.push_back(c.g[k].defined() ? c.g[k] : full(m.sizes, 0.0, m.dtype));
  }
  return {cat(parts, d)};
}
Grads rule_stack(const GradCtx& c) {
  const int64_t r = static_cast<int64_t>(c.node.out_meta[0].sizes.size());
  const int64_t d = wrap(c.attrs().i("dim"), r);
  Grads out(c.num_inputs());
  for (size_t i = 0; i < out.size(); ++i)
    if (c.needs(i)) out[i] = select(c.g[0], d, static_cast<int64_t>(i));
  return out;
}

}  // namespace protean::autograd
