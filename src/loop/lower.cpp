#include "loop/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>

#include "loop/decompose.h"
#include "loop/lowering.h"
#include "ir/sym_util.h"
#include "sym/simplify.h"

namespace protean::loop {

using ir::kNoValue;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;
using ops::OpKind;

namespace {
/// A value used several times is realized when its expression is larger than this (recomputing a
/// small expression in every consumer is cheaper than a round trip through memory).
constexpr size_t kInlineLimit = 24;
/// A value used several times, one of its consumers a row reduction, is realized when it reads more
/// distinct buffers than this: every consumer would read all of them again (a transformer's residual
/// stream x + a1 + m1 + a2 + ..., inlined into each LayerNorm, reads one more buffer per layer),
/// where a realized value is one read. With one, each partial sum is stored; the cuda backend then
/// folds the add into the product before it (a residual epilogue), so the LayerNorm reads one buffer.
constexpr size_t kInlineLoadLimit = 1;

/// Distinct buffers `e` loads (shared subtrees visited once).
size_t loaded_buffers(const SExpr& e) {
  std::set<int> bufs;
  std::set<const SNode*> seen;
  std::vector<const SNode*> stack{e.get()};
  while (!stack.empty()) {
    const SNode* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (n->op == SOp::Load) bufs.insert(n->buffer);
    for (const auto& a : n->args) stack.push_back(a.get());
  }
  return bufs.size();
}

std::vector<sym::Expr> vars(size_t n) {
  std::vector<sym::Expr> v;
  for (size_t k = 0; k < n; ++k) v.push_back(outer_var(k));
  return v;
}
sym::Expr e_of(const SymInt& s) { return ir::to_expr(s); }
int64_t wrap(int64_t d, size_t rank) {
  int64_t r = static_cast<int64_t>(rank);
  if (d < 0) d += r;
  if (d < 0 || d >= std::max<int64_t>(r, 1)) throw Unsupported{"dim out of range"};
  return d;
}
}  // namespace

namespace {
/// The constant operand of a binary node and its other operand, when one of the two is a
/// floating constant.
bool split_const(const SExpr& n, double& c, SExpr& other) {
  if (n->op != SOp::Binary) return false;
  for (int k = 0; k < 2; ++k)
    if (n->args[k]->op == SOp::Const && is_floating(n->args[k]->dtype)) {
      c = n->args[k]->fval;
      other = n->args[1 - k];
      return true;
    }
  return false;
}
/// (erf(x · 1/√2) + 1) · 0.5, the standard normal CDF Φ(x) as the GELU rule writes it for its
/// derivative, as the one normal_cdf node: the GELU forward computes normal_cdf(x) from the same x, so
/// the fused forward + backward kernel evaluates Φ once (and normal_cdf is the cheaper function: a
/// table-driven polynomial on the cpu, erfc in f64, against erf's division and 16th power).
SExpr as_normal_cdf(const SExpr& n) {
  if (n->op != SOp::Binary || n->fn != ScalarOp::mul || (n->dtype != DType::F32 && n->dtype != DType::F64)) return nullptr;
  double c = 0;
  SExpr sum, e, scaled, x;
  if (!split_const(n, c, sum) || c != 0.5 || sum->fn != ScalarOp::add) return nullptr;
  if (!split_const(sum, c, e) || c != 1.0 || e->op != SOp::Unary || e->fn != ScalarOp::erf) return nullptr;
  scaled = e->args[0];
  if (!split_const(scaled, c, x) || scaled->fn != ScalarOp::mul || std::abs(c - 0.70710678118654752440) > 1e-7)
    return nullptr;
  if (x->dtype != n->dtype || e->dtype != n->dtype || sum->dtype != n->dtype) return nullptr;
  return s_unary(ScalarOp::normal_cdf, x, n->dtype);
}
/// pow(a, c) for a literal exponent c in {0, 1, 2, 3, -1, -2, 0.5, -0.5} as the products, square root
/// or reciprocal that give it (ATen's pow with a scalar exponent takes the same forms: a * a, a * a * a,
/// 1 / (a * a), sqrt, rsqrt, reciprocal; 0 and 1 are exact in any pow), so the loop neither calls the
/// libm pow per element nor leaves the vector forms; nullptr for any other exponent. The runtime pow
/// of the cpu and cuda backends and the eager kernel take the same forms for those values, so results
/// do not depend on whether the exponent was a literal.
SExpr pow_by_literal(const SExpr& a, const SExpr& b, DType d) {
  if (b->op != SOp::Const || !is_floating(d)) return nullptr;
  const double c = b->fval;
  if (c == 0) return s_const(1.0, d);
  if (c == 1) return a;
  if (c == 2) return s_binary(ScalarOp::mul, a, a, d);
  if (c == 3) return s_binary(ScalarOp::mul, s_binary(ScalarOp::mul, a, a, d), a, d);
  if (c == -1) return s_unary(ScalarOp::reciprocal, a, d);
  if (c == -2) return s_unary(ScalarOp::reciprocal, s_binary(ScalarOp::mul, a, a, d), d);
  if (c == 0.5) return s_unary(ScalarOp::sqrt, a, d);
  if (c == -0.5) return s_unary(ScalarOp::rsqrt, a, d);
  return nullptr;
}
}  // namespace

SExpr canonical_body(const SExpr& e) {
  // s_text per node of the rewritten tree (the node is held, so its address is not reused)
  std::unordered_map<const SNode*, std::pair<SExpr, std::string>> text;
  auto key = [&](const SExpr& x) -> const std::string& {
    auto it = text.find(x.get());
    if (it == text.end()) it = text.emplace(x.get(), std::pair{x, s_text(x) + ":" + std::string(short_name(x->dtype))}).first;
    return it->second.second;
  };
  auto commutative = [](ScalarOp f) {
    return f == ScalarOp::add || f == ScalarOp::mul || f == ScalarOp::eq || f == ScalarOp::ne ||
           f == ScalarOp::logical_and || f == ScalarOp::logical_or;
  };
  return s_rewrite(e, [&](const SExpr& n) -> SExpr {
    if (n->op == SOp::Load || n->op == SOp::Index) {
      sym::Expr idx = simplify_index(n->index);
      if (idx == n->index) return nullptr;
      SNode c = *n;
      c.index = std::move(idx);
      return std::make_shared<const SNode>(std::move(c));
    }
    if (n->op != SOp::Binary) return nullptr;
    if (SExpr cdf = as_normal_cdf(n)) return cdf;
    const SExpr& a = n->args[0];
    const SExpr& b = n->args[1];
    if (n->fn == ScalarOp::gt) return s_binary(ScalarOp::lt, b, a, n->dtype);
    if (n->fn == ScalarOp::ge) return s_binary(ScalarOp::le, b, a, n->dtype);
    if (!commutative(n->fn)) return nullptr;
    // constants last; two leaves (loads, indices, locals, constants) by text. Larger operands keep
    // their order: reordering them would renumber every kernel's temporaries for no shared value.
    auto leaf = [](const SExpr& x) { return x->op == SOp::Load || x->op == SOp::Index || x->op == SOp::Local || x->op == SOp::Const; };
    const bool ca = a->op == SOp::Const, cb = b->op == SOp::Const;
    const bool swap = ca != cb ? ca : leaf(a) && leaf(b) && key(a) > key(b);
    return swap ? s_binary(n->fn, b, a, n->dtype) : nullptr;
  });
}

bool lowerable_dtype(DType t) {
  switch (t) {
    case DType::Bool: case DType::I32: case DType::I64: case DType::F32: case DType::F64: return true;
    case DType::U8: case DType::I8: case DType::F16: case DType::BF16: return false;
  }
  return false;
}

std::vector<sym::Expr> value_sizes(const ir::Value& v) {
  std::vector<sym::Expr> r;
  for (const SymInt& s : v.sizes) r.push_back(e_of(s));
  return r;
}

sym::Expr Lowerer::numel(const std::vector<sym::Expr>& sizes) {
  sym::Expr n = sym::integer(1);
  for (auto s : sizes) n = sym::mul(n, s);
  return n;
}

std::vector<sym::Expr> Lowerer::broadcast_sizes(const std::vector<sym::Expr>& a, const std::vector<sym::Expr>& b) {
  size_t n = std::max(a.size(), b.size());
  std::vector<sym::Expr> r(n);
  for (size_t i = 0; i < n; ++i) {
    sym::Expr x = i + a.size() >= n ? a[i + a.size() - n] : sym::integer(1);
    sym::Expr y = i + b.size() >= n ? b[i + b.size() - n] : sym::integer(1);
    r[i] = x->is_integer(1) ? y : x;
  }
  return r;
}

bool Lowerer::lowerable(DType t) const {
  return lowerable_dtype(t) || (options_.half_storage && (t == DType::BF16 || t == DType::F16));
}

Lowerer::Lowerer(const ir::Graph& g, std::vector<sym::Expr> symbols, LowerOptions options) : g_(g), options_(options) {
  p_.name = g.name;
  p_.symbols = std::move(symbols);
  values_.resize(g.values().size());
  uses_.assign(g.values().size(), 0);
  chain_.assign(g.values().size(), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs)
      if (v != kNoValue) uses_[static_cast<size_t>(v)] += n.kind == NodeKind::Output ? 2 : 1;
  // Row reductions reading each value, directly or through casts and views (nodes newest first).
  row_uses_.assign(g.values().size(), 0);
  for (auto it = g.nodes().rbegin(); it != g.nodes().rend(); ++it) {
    const Node& n = *it;
    if (n.kind != NodeKind::Call || n.outputs.empty()) continue;
    const LowerRule r = lowering_row(n.op).rule;
    const bool row_op = r == LowerRule::reduce || r == LowerRule::mean_var || r == LowerRule::softmax || r == LowerRule::norm;
    const bool passes = r == LowerRule::cast || r == LowerRule::reshape || r == LowerRule::permute ||
                        r == LowerRule::squeeze || r == LowerRule::unsqueeze || r == LowerRule::expand;
    const int through = passes && n.outputs[0] != kNoValue ? row_uses_[static_cast<size_t>(n.outputs[0])] : 0;
    for (ValueId v : n.inputs)
      if (v != kNoValue && (row_op || through > 0)) row_uses_[static_cast<size_t>(v)] += row_op ? 1 : through;
  }
  // Extern steps reading each value, directly or through reshapes and permutes (nodes newest first, so
  // a view's count is complete before its input's).
  extern_uses_.assign(g.values().size(), 0);
  const auto& nodes = g.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    const Node& n = *it;
    if (n.kind != NodeKind::Call || n.inputs.empty()) continue;
    const LoweringRow& row = lowering_row(n.op);
    const bool view = row.rule == LowerRule::reshape || row.rule == LowerRule::permute;
    if (view && !n.outputs.empty() && n.inputs[0] != kNoValue)
      extern_uses_[static_cast<size_t>(n.inputs[0])] += extern_uses_[static_cast<size_t>(n.outputs[0])];
    else if (row.how == Lowering::Extern)
      for (ValueId v : n.inputs)
        if (v != kNoValue) extern_uses_[static_cast<size_t>(v)] += 1;
  }
}

int Lowerer::new_buffer(DType dtype, std::vector<sym::Expr> sizes, BufferKind kind) {
  Buffer b;
  b.id = static_cast<int>(p_.buffers.size());
  b.dtype = dtype;
  b.sizes = std::move(sizes);
  b.kind = kind;
  p_.buffers.push_back(std::move(b));
  return p_.buffers.back().id;
}

TRef Lowerer::from_buffer(int buffer) const {
  const Buffer& b = p_.buffers[static_cast<size_t>(buffer)];
  TRef t;
  t.dtype = b.dtype;
  t.sizes = b.sizes;
  t.buffer = buffer;
  std::vector<sym::Expr> sizes = b.sizes;
  DType dt = b.dtype;
  t.fn = [buffer, sizes, dt](const std::vector<sym::Expr>& idx) { return s_load(buffer, dt, linear_index(idx, sizes)); };
  return t;
}

TRef Lowerer::input(const Node& n, size_t k) const {
  ValueId v = n.inputs.at(k);
  if (v == kNoValue) throw Unsupported{"absent input"};
  const TRef& t = values_[static_cast<size_t>(v)];
  if (!t.fn) throw Unsupported{"input not lowered"};
  return t;
}

TRef Lowerer::broadcast_to(const TRef& a, const std::vector<sym::Expr>& sizes) const {
  if (a.sizes == sizes) return a;
  size_t n = sizes.size(), k = a.sizes.size();
  if (k > n) throw Unsupported{"broadcast to fewer dims"};
  TRef t = a;
  t.sizes = sizes;
  t.buffer = -1;
  t.permute_base = nullptr;
  auto src = a;
  t.fn = [src, n, k](const std::vector<sym::Expr>& idx) {
    std::vector<sym::Expr> s(k);
    for (size_t j = 0; j < k; ++j) s[j] = src.sizes[j]->is_integer(1) ? sym::integer(0) : idx[n - k + j];
    return src.fn(s);
  };
  return t;
}

TRef Lowerer::map(const std::vector<TRef>& in, std::vector<sym::Expr> sizes, DType dtype,
                  const std::function<SExpr(const std::vector<SExpr>&)>& f) const {
  std::vector<TRef> b;
  for (const TRef& t : in) b.push_back(broadcast_to(t, sizes));
  TRef r;
  r.dtype = dtype;
  r.sizes = std::move(sizes);
  r.fn = [b, f](const std::vector<sym::Expr>& idx) {
    std::vector<SExpr> xs;
    for (const TRef& t : b) xs.push_back(t.fn(idx));
    return f(xs);
  };
  return r;
}

TRef Lowerer::unary(const TRef& a, DType dtype, const std::function<SExpr(SExpr)>& f) const {
  return map({a}, a.sizes, dtype, [f](const std::vector<SExpr>& x) { return f(x[0]); });
}

TRef Lowerer::binary(const TRef& a, const TRef& b, DType dtype, const std::function<SExpr(SExpr, SExpr)>& f) const {
  return map({a, b}, broadcast_sizes(a.sizes, b.sizes), dtype,
             [f](const std::vector<SExpr>& x) { return f(x[0], x[1]); });
}

TRef Lowerer::permute(const TRef& a, const std::vector<int64_t>& dims) const {
  TRef t = a;
  t.buffer = -1;
  t.permute_base = std::make_shared<const TRef>(a);
  t.permute_dims = dims;
  t.sizes.clear();
  for (int64_t d : dims) t.sizes.push_back(a.sizes[static_cast<size_t>(d)]);
  t.fn = [a, dims](const std::vector<sym::Expr>& idx) {
    std::vector<sym::Expr> s(idx.size());
    for (size_t i = 0; i < dims.size(); ++i) s[static_cast<size_t>(dims[i])] = idx[i];
    return a.fn(s);
  };
  return t;
}

TRef Lowerer::unsqueeze(const TRef& a, int64_t dim) const {
  TRef t = a;
  t.buffer = -1;
  t.permute_base = nullptr;
  t.sizes.insert(t.sizes.begin() + dim, sym::integer(1));
  t.fn = [a, dim](const std::vector<sym::Expr>& idx) {
    std::vector<sym::Expr> s = idx;
    s.erase(s.begin() + dim);
    return a.fn(s);
  };
  return t;
}

TRef Lowerer::realize(const TRef& a, BufferKind kind) {
  if (a.buffer >= 0 && kind == BufferKind::Temp) return a;
  int b = new_buffer(a.dtype, a.sizes, kind);
  Kernel k;
  k.name = fmt::format("kernel{}", p_.kernels.size());
  k.outer = a.sizes;
  Stage s;
  s.kind = StageKind::Pointwise;
  std::vector<sym::Expr> idx = vars(a.sizes.size());
  s.body = canonical_body(s_cast(a.fn(idx), a.dtype));
  s.out = b;
  s.out_index = linear_index(idx, a.sizes);
  k.stages.push_back(std::move(s));
  p_.steps.push_back({true, static_cast<int>(p_.kernels.size()), {}});
  p_.kernels.push_back(std::move(k));
  return from_buffer(b);
}

Stage& Lowerer::reduction_kernel(const TRef& in, std::vector<int64_t>& dims, const std::string& op, DType acc,
                                 std::vector<sym::Expr>& kept) {
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  std::vector<sym::Expr> red;
  std::vector<bool> is_red(in.sizes.size(), false);
  for (int64_t d : dims) is_red[static_cast<size_t>(d)] = true;
  kept.clear();
  for (size_t i = 0; i < in.sizes.size(); ++i) (is_red[i] ? red : kept).push_back(in.sizes[i]);
  Kernel k;
  k.name = fmt::format("kernel{}", p_.kernels.size());
  k.outer = kept;
  Stage s;
  s.kind = StageKind::Reduction;
  s.inner = red;
  s.reduce_op = op;
  s.local = fmt::format("acc{}", next_local_++);
  std::vector<sym::Expr> idx(in.sizes.size()), xs;
  size_t xi = 0, ri = 0;
  for (size_t i = 0; i < in.sizes.size(); ++i) {
    idx[i] = is_red[i] ? inner_var(ri++) : outer_var(xi++);
    if (!is_red[i]) xs.push_back(idx[i]);
  }
  s.body = canonical_body(s_cast(in.fn(idx), acc));
  s.out_index = linear_index(xs, kept);
  k.stages.push_back(std::move(s));
  p_.steps.push_back({true, static_cast<int>(p_.kernels.size()), {}});
  p_.kernels.push_back(std::move(k));
  return p_.kernels.back().stages.back();
}

TRef Lowerer::reduce(const TRef& in, std::vector<int64_t> dims, const std::string& op, DType acc, bool keepdim) {
  std::vector<sym::Expr> kept;
  Stage& s = reduction_kernel(in, dims, op, acc, kept);
  int b = new_buffer(acc, kept, BufferKind::Temp);  // (buffers only: `s` stays valid)
  s.out = b;
  TRef r = from_buffer(b);
  if (keepdim)
    for (int64_t d : dims) r = unsqueeze(r, d);
  return r;
}

std::pair<TRef, TRef> Lowerer::welford(const TRef& in, std::vector<int64_t> dims, DType acc) {
  if (!is_floating(acc)) throw Unsupported{"integer welford"};
  if (dims.empty()) throw Unsupported{"welford over no dims"};
  std::vector<sym::Expr> kept;
  Stage& s = reduction_kernel(in, dims, "welford", acc, kept);
  int mean = new_buffer(acc, kept, BufferKind::Temp);
  int m2 = new_buffer(acc, kept, BufferKind::Temp);
  s.out = mean;
  s.out2 = m2;
  s.local2 = s.local + "_m2";
  TRef a = from_buffer(mean), b = from_buffer(m2);
  for (int64_t d : dims) {
    a = unsqueeze(a, d);
    b = unsqueeze(b, d);
  }
  return {a, b};
}

bool Lowerer::strided_view(const TRef& t, int& buffer, ExternView& view) const {
  const std::vector<sym::Expr> xs = vars(t.sizes.size());
  const SExpr e = t.fn(xs);
  if (!e || e->op != SOp::Load || e->dtype != t.dtype || !e->index) return false;
  const sym::Expr idx = simplify_index(e->index);
  std::unordered_map<sym::Expr, sym::Expr> at;
  for (const sym::Expr& x : xs) at[x] = sym::integer(0);
  const sym::Expr off = simplify_index(sym::substitute(idx, at));
  sym::Expr rebuilt = off;
  std::vector<sym::Expr> strides;
  for (size_t k = 0; k < xs.size(); ++k) {
    at[xs[k]] = sym::integer(1);
    sym::Expr st = sym::simplify(sym::sub(sym::substitute(idx, at), off));
    at[xs[k]] = sym::integer(0);
    for (const sym::Expr& f : sym::free_symbols(st))
      if (std::find(xs.begin(), xs.end(), f) != xs.end()) return false;
    strides.push_back(st);
    rebuilt = sym::add(rebuilt, sym::mul(st, xs[k]));
  }
  if (!sym::simplify(sym::sub(idx, rebuilt))->is_integer(0)) return false;  // not affine (a // or a mod)
  buffer = e->buffer;
  view.sizes = t.sizes;
  view.strides = std::move(strides);
  view.offset = off;
  return true;
}

bool Lowerer::extern_view(OpKind op, size_t k, const TRef& t, int& buffer, ExternView& view) {
  if (!options_.extern_views || t.buffer >= 0) return false;
  const bool gemm = op == OpKind::matmul || op == OpKind::bmm || op == OpKind::matmul_fused || op == OpKind::linear ||
                    op == OpKind::linear_fused;
  // the cpu backend's fused attention reads q, k and v in place where their rows are unit-stride (the
  // heads of a fused QKV projection: a slice, a reshape and a transpose of one buffer)
  const bool attention = op == OpKind::scaled_dot_product_attention && k < 3;
  if ((!gemm || k >= 2) && !attention) return false;
  if (t.sizes.empty() || (attention && t.sizes.size() < 2)) return false;
  // what the GEMM reads in place: a matrix whose rows or columns are unit-stride (else it copies)
  auto readable = [&](const ExternView& v) {
    const size_t r = v.strides.size();
    if (attention) return v.strides[r - 1]->is_integer(1) && !v.strides[r - 2]->is_integer(0);
    if (r == 1) return v.strides[0]->is_integer(1);
    const sym::Expr& rs = v.strides[r - 2];
    const sym::Expr& cs = v.strides[r - 1];
    return (cs->is_integer(1) && !rs->is_integer(0)) || (rs->is_integer(1) && !cs->is_integer(0));
  };
  if (strided_view(t, buffer, view)) return readable(view);
  if (!t.permute_base || t.permute_base->buffer >= 0) return false;
  // a permute of a computed value: the value realized in its own order, read transposed. Rules that
  // copy a TRef keep the record (a reshape, a narrow or an expand of the permute), so check that `t`
  // is that permute: the same rank and sizes (a narrow from 0 has the same element function), then
  // the same element function.
  const TRef& pb = *t.permute_base;
  if (t.permute_dims.size() != t.sizes.size() || pb.sizes.size() != t.sizes.size()) return false;
  for (size_t i = 0; i < t.sizes.size(); ++i) {
    const int64_t d = t.permute_dims[i];
    if (d < 0 || static_cast<size_t>(d) >= pb.sizes.size() || !sym::simplify(sym::sub(t.sizes[i], pb.sizes[static_cast<size_t>(d)]))->is_integer(0))
      return false;
  }
  const std::vector<sym::Expr> xs = vars(t.sizes.size());
  const SExpr mine = t.fn(xs), theirs = permute(*t.permute_base, t.permute_dims).fn(xs);
  if (!mine || !theirs || mine->dtype != theirs->dtype || s_text(mine) != s_text(theirs)) return false;
  const TRef base = realize(*t.permute_base);
  if (!strided_view(permute(base, t.permute_dims), buffer, view) || !readable(view)) {
    buffer = -1;
    return false;
  }
  return true;
}

std::vector<TRef> Lowerer::extern_call(OpKind op, const ops::Attrs& attrs, const std::vector<const TRef*>& in,
                                       const std::vector<std::pair<DType, std::vector<sym::Expr>>>& outs) {
  Extern e;
  e.op = op;
  e.attrs = attrs;
  e.where = where_;
  for (size_t k = 0; k < in.size(); ++k) {
    const TRef* t = in[k];
    int b = -1;
    ExternView v;
    if (t && extern_view(op, k, *t, b, v)) {
      e.views.resize(k + 1);
      e.views[k] = std::move(v);
      e.inputs.push_back(b);
      continue;
    }
    e.inputs.push_back(t ? realize(*t).buffer : -1);
  }
  if (!e.views.empty()) e.views.resize(e.inputs.size());
  std::vector<TRef> r;
  for (const auto& [dt, sizes] : outs) {
    int b = new_buffer(dt, sizes, BufferKind::Temp);
    p_.buffers[static_cast<size_t>(b)].from_extern = true;
    e.outputs.push_back(b);
    r.push_back(from_buffer(b));
  }
  p_.steps.push_back({false, static_cast<int>(p_.externs.size()), {}});
  p_.externs.push_back(std::move(e));
  return r;
}

void Lowerer::lower_extern(const Node& n) {
  std::vector<TRef> ins(n.inputs.size());
  std::vector<const TRef*> ptrs;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    ValueId v = n.inputs[k];
    if (v == kNoValue) {
      ptrs.push_back(nullptr);
      continue;
    }
    ins[k] = values_[static_cast<size_t>(v)];
    ptrs.push_back(&ins[k]);
  }
  std::vector<std::pair<DType, std::vector<sym::Expr>>> outs;
  for (ValueId v : n.outputs) outs.push_back({g_.value(v).dtype, value_sizes(g_.value(v))});
  std::vector<TRef> r = extern_call(n.op, n.attrs, ptrs, outs);
  // An input the call realized into a buffer of its own (a view it cannot read in place: the heads of a
  // fused qkv projection for the attention forward and its backward) is that buffer from now on, so a
  // later extern step reading the same value does not copy it again.
  const Extern& e = p_.externs.back();
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const ValueId v = n.inputs[k];
    const bool in_place_view = k < e.views.size() && e.views[k].offset;
    if (v != kNoValue && ins[k].buffer < 0 && e.inputs[k] >= 0 && !in_place_view && n.op != OpKind::cond &&
        n.op != OpKind::call_region) {
      TRef t = from_buffer(e.inputs[k]);
      t.dtype = ins[k].dtype;
      values_[static_cast<size_t>(v)] = t;
    }
  }
  for (size_t k = 0; k < n.outputs.size(); ++k) values_[static_cast<size_t>(n.outputs[k])] = r[k];
}

TRef Lowerer::lower_pointwise(const Node& n, const LoweringRow& row) {
  const ir::Value& ov = g_.value(n.outputs[0]);
  DType od = ov.dtype;
  std::vector<sym::Expr> sizes = value_sizes(ov);
  std::vector<TRef> in;
  for (size_t k = 0; k < n.inputs.size(); ++k) in.push_back(input(n, k));
  auto un = [&](auto f) { return map(in, sizes, od, [f, od](const std::vector<SExpr>& x) { return f(x[0], od); }); };
  auto fn1 = [&](ScalarOp name) {
    return un([name](SExpr a, DType d) { return s_unary(name, s_cast(a, d), d); });
  };
  auto bin = [&](ScalarOp name) {
    return map(in, sizes, od, [name, od](const std::vector<SExpr>& x) {
      return s_binary(name, s_cast(x[0], od), s_cast(x[1], od), od);
    });
  };
  auto cmp = [&](ScalarOp name) {
    DType ct = promote_types(in[0].dtype, in[1].dtype);
    return map(in, sizes, od, [name, ct](const std::vector<SExpr>& x) {
      return s_binary(name, s_cast(x[0], ct), s_cast(x[1], ct), DType::Bool);
    });
  };
  auto logical = [&](ScalarOp name) {
    return map(in, sizes, od, [name](const std::vector<SExpr>& x) {
      return s_binary(name, s_cast(x[0], DType::Bool), s_cast(x[1], DType::Bool), DType::Bool);
    });
  };
  const bool fl = is_floating(od);
  switch (row.rule) {
    case LowerRule::abs: return fl || od != DType::Bool ? fn1(*row.scalar) : in[0];
    case LowerRule::cast: return un([](SExpr a, DType d) { return s_cast(a, d); });
    case LowerRule::rounding: return fl ? fn1(*row.scalar) : un([](SExpr a, DType d) { return s_cast(a, d); });
    case LowerRule::clamp: {
      auto lo = n.attrs.opt_f("min"), hi = n.attrs.opt_f("max");
      return un([lo, hi](SExpr a, DType d) {
        SExpr x = s_cast(a, d);
        if (lo) x = s_binary(ScalarOp::max, x, s_const(*lo, d), d);
        if (hi) x = s_binary(ScalarOp::min, x, s_const(*hi, d), d);
        return x;
      });
    }
    case LowerRule::unary: return fn1(*row.scalar);
    case LowerRule::logical_not:
      return un([](SExpr a, DType) { return s_unary(ScalarOp::logical_not, s_cast(a, DType::Bool), DType::Bool); });
    case LowerRule::binary: return bin(*row.scalar);
    case LowerRule::pow:
      if (!fl) throw Unsupported{"integer pow"};
      return map(in, sizes, od, [od](const std::vector<SExpr>& x) {
        const SExpr a = s_cast(x[0], od), b = s_cast(x[1], od);
        if (SExpr r = pow_by_literal(a, b, od)) return r;
        return s_binary(ScalarOp::pow, a, b, od);
      });
    case LowerRule::compare: return cmp(*row.scalar);
    case LowerRule::logical: return logical(*row.scalar);
    case LowerRule::where:
      return map(in, sizes, od, [od](const std::vector<SExpr>& x) {
        return s_where(s_cast(x[0], DType::Bool), s_cast(x[1], od), s_cast(x[2], od));
      });
    case LowerRule::expand: case LowerRule::permute: case LowerRule::reshape: case LowerRule::select:
    case LowerRule::slice: case LowerRule::squeeze: case LowerRule::unsqueeze: case LowerRule::cat:
    case LowerRule::clone: case LowerRule::pad: case LowerRule::arange: case LowerRule::full:
    case LowerRule::gelu: case LowerRule::silu: case LowerRule::hardsigmoid: case LowerRule::hardswish:
    case LowerRule::reduce: case LowerRule::mean_var: case LowerRule::softmax: case LowerRule::norm:
    case LowerRule::batch_norm: case LowerRule::attention: case LowerRule::extern_call: case LowerRule::cond:
      break;
  }
  throw CompileError(fmt::format("lowering: rule {} of op {} is not a pointwise rule", rule_name(row.rule), ops::op_name(n.op)));
}

TRef Lowerer::lower_view(const Node& n, LowerRule rule) {
  const ir::Value& ov = g_.value(n.outputs[0]);
  std::vector<sym::Expr> osz = value_sizes(ov);
  TRef a = input(n, 0);
  const size_t r = a.sizes.size();
  TRef t = a;
  t.buffer = -1;
  t.sizes = osz;
  switch (rule) {
    case LowerRule::expand: return broadcast_to(a, osz);
    case LowerRule::permute: {
      IntVec d = n.attrs.ints("dims");
      std::vector<int64_t> dims;
      for (int64_t x : d) dims.push_back(wrap(x, r));
      return permute(a, dims);
    }
    case LowerRule::unsqueeze: return unsqueeze(a, wrap(n.attrs.i("dim"), r + 1));
    case LowerRule::squeeze: {
      std::vector<bool> drop(r, false);
      IntVec d = n.attrs.has("dims") ? n.attrs.ints("dims") : IntVec{};
      if (d.empty())
        for (size_t i = 0; i < r; ++i) drop[i] = a.sizes[i]->is_integer(1);
      for (int64_t x : d) {
        size_t k = static_cast<size_t>(wrap(x, r));
        drop[k] = a.sizes[k]->is_integer(1);
      }
      if (static_cast<size_t>(std::count(drop.begin(), drop.end(), false)) != osz.size()) throw Unsupported{"squeeze"};
      t.fn = [a, drop](const std::vector<sym::Expr>& idx) {
        std::vector<sym::Expr> s;
        size_t j = 0;
        for (bool dr : drop) s.push_back(dr ? sym::integer(0) : idx[j++]);
        return a.fn(s);
      };
      return t;
    }
    case LowerRule::select: {
      size_t d = static_cast<size_t>(wrap(n.attrs.i("dim"), r));
      sym::Expr i = e_of(n.attrs.sym_int("index"));
      if (i->is_integer() && i->value < 0) i = sym::add(i, a.sizes[d]);
      t.fn = [a, d, i](const std::vector<sym::Expr>& idx) {
        std::vector<sym::Expr> s = idx;
        s.insert(s.begin() + static_cast<int64_t>(d), i);
        return a.fn(s);
      };
      return t;
    }
    case LowerRule::slice: {
      size_t d = static_cast<size_t>(wrap(n.attrs.i("dim"), r));
      sym::Expr start = e_of(n.attrs.sym_int("start"));
      sym::Expr step = e_of(n.attrs.sym_int("step"));
      if (!start->is_integer() || !step->is_integer() || step->value <= 0) throw Unsupported{"symbolic slice"};
      sym::Expr size = a.sizes[d];
      if (start->value < 0) start = sym::maximum(sym::integer(0), sym::add(size, start));
      else start = sym::minimum(start, size);
      start = simplify_index(start);
      t.fn = [a, d, start, step](const std::vector<sym::Expr>& idx) {
        std::vector<sym::Expr> s = idx;
        s[d] = sym::add(start, sym::mul(idx[d], step));
        return a.fn(s);
      };
      return t;
    }
    case LowerRule::reshape: {
      // Logical row-major re-indexing: equal leading and trailing dims map directly, the middle is
      // linearized and split again (FloorDiv/Mod the simplifier removes when it can).
      std::vector<sym::Expr> isz = a.sizes;
      size_t pre = 0;
      while (pre < isz.size() && pre < osz.size() && isz[pre] == osz[pre]) ++pre;
      size_t suf = 0;
      while (suf + pre < isz.size() && suf + pre < osz.size() && isz[isz.size() - 1 - suf] == osz[osz.size() - 1 - suf]) ++suf;
      t.fn = [a, isz, osz, pre, suf](const std::vector<sym::Expr>& idx) {
        std::vector<sym::Expr> s(isz.size());
        for (size_t i = 0; i < pre; ++i) s[i] = idx[i];
        for (size_t i = 0; i < suf; ++i) s[isz.size() - 1 - i] = idx[osz.size() - 1 - i];
        std::vector<sym::Expr> mid_o(idx.begin() + static_cast<int64_t>(pre), idx.end() - static_cast<int64_t>(suf));
        std::vector<sym::Expr> mid_os(osz.begin() + static_cast<int64_t>(pre), osz.end() - static_cast<int64_t>(suf));
        sym::Expr lin = linear_index(mid_o, mid_os);
        size_t n_mid = isz.size() - pre - suf;
        sym::Expr stride = sym::integer(1);
        for (size_t k = n_mid; k-- > 0;) {
          sym::Expr sz = isz[pre + k];
          // A dim of size 0 (the tensor has no elements: the loop over it never runs) divides by 0;
          // its index is never evaluated, so any index will do.
          if (sz->is_integer(0) || stride->is_integer(0)) {
            s[pre + k] = sym::integer(0);
          } else {
            sym::Expr q = sym::floordiv(lin, stride);
            s[pre + k] = simplify_index(k == 0 ? q : sym::mod(q, sz));
          }
          stride = sym::mul(stride, sz);
        }
        return a.fn(s);
      };
      return t;
    }
    case LowerRule::abs: case LowerRule::cast: case LowerRule::rounding: case LowerRule::clamp:
    case LowerRule::unary: case LowerRule::logical_not: case LowerRule::binary: case LowerRule::pow:
    case LowerRule::compare: case LowerRule::logical: case LowerRule::where: case LowerRule::cat:
    case LowerRule::clone: case LowerRule::pad: case LowerRule::arange: case LowerRule::full:
    case LowerRule::gelu: case LowerRule::silu: case LowerRule::hardsigmoid: case LowerRule::hardswish:
    case LowerRule::reduce: case LowerRule::mean_var: case LowerRule::softmax: case LowerRule::norm:
    case LowerRule::batch_norm: case LowerRule::attention: case LowerRule::extern_call: case LowerRule::cond:
      break;
  }
  throw CompileError(fmt::format("lowering: rule {} of op {} is not a view rule", rule_name(rule), ops::op_name(n.op)));
}

TRef Lowerer::lower_other(const Node& n, LowerRule rule) {
  const ir::Value& ov = g_.value(n.outputs[0]);
  std::vector<sym::Expr> osz = value_sizes(ov);
  DType od = ov.dtype;
  switch (rule) {
    case LowerRule::clone: return input(n, 0);
    case LowerRule::full: {
      double v = n.attrs.f("value");
      TRef t;
      t.dtype = od;
      t.sizes = osz;
      t.fn = [v, od](const std::vector<sym::Expr>&) { return s_const(v, od); };
      return t;
    }
    case LowerRule::arange: {
      sym::Expr start = e_of(n.attrs.sym_int("start")), step = e_of(n.attrs.sym_int("step"));
      TRef t;
      t.dtype = od;
      t.sizes = osz;
      t.fn = [start, step, od](const std::vector<sym::Expr>& idx) {
        return s_index(sym::add(start, sym::mul(idx[0], step)), od);
      };
      return t;
    }
    case LowerRule::cat: {
      size_t d = static_cast<size_t>(wrap(n.attrs.i("dim"), osz.size()));
      std::vector<TRef> parts;
      std::vector<sym::Expr> offs{sym::integer(0)};
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        TRef p = input(n, k);
        if (p.sizes.size() != osz.size()) throw Unsupported{"cat of a legacy empty tensor"};
        parts.push_back(p);
        offs.push_back(simplify_index(sym::add(offs.back(), p.sizes[d])));
      }
      const bool any_part = std::any_of(parts.begin(), parts.end(), [d](const TRef& x) { return !x.sizes[d]->is_integer(0); });
      if (options_.cat_stages && parts.size() > kCatSelectParts && any_part) {
        // one kernel over the dims before `d`; stage k copies part k (its dims from `d` on) into the
        // result at offset offs[k] along `d`
        const int b = new_buffer(od, osz, BufferKind::Temp);
        Kernel k;
        k.name = fmt::format("kernel{}", p_.kernels.size());
        k.outer.assign(osz.begin(), osz.begin() + static_cast<int64_t>(d));
        for (size_t j = 0; j < parts.size(); ++j) {
          if (parts[j].sizes[d]->is_integer(0)) continue;
          Stage s;
          s.kind = StageKind::Pointwise;
          s.inner.assign(parts[j].sizes.begin() + static_cast<int64_t>(d), parts[j].sizes.end());
          std::vector<sym::Expr> pidx;
          for (size_t i = 0; i < osz.size(); ++i) pidx.push_back(i < d ? outer_var(i) : inner_var(i - d));
          std::vector<sym::Expr> oidx = pidx;
          oidx[d] = sym::add(pidx[d], offs[j]);
          s.body = canonical_body(s_cast(parts[j].fn(pidx), od));
          s.out = b;
          s.out_index = linear_index(oidx, osz);
          k.stages.push_back(std::move(s));
        }
        p_.steps.push_back({true, static_cast<int>(p_.kernels.size()), {}});
        p_.kernels.push_back(std::move(k));
        return from_buffer(b);
      }
      TRef t;
      t.dtype = od;
      t.sizes = osz;
      t.fn = [parts, offs, d, od](const std::vector<sym::Expr>& idx) {
        SExpr r;
        for (size_t k = parts.size(); k-- > 0;) {
          std::vector<sym::Expr> s = idx;
          s[d] = simplify_index(sym::sub(idx[d], offs[k]));
          SExpr v = s_cast(parts[k].fn(s), od);
          r = r ? s_where(s_index(sym::lt(idx[d], offs[k + 1]), DType::Bool), v, r) : v;
        }
        return r;
      };
      return t;
    }
    case LowerRule::pad: {
      std::string mode = n.attrs.has("mode") ? n.attrs.s("mode") : std::string("constant");
      if (mode != "constant") throw Unsupported{"pad mode"};
      double value = n.attrs.has("value") ? n.attrs.f("value") : 0.0;
      const SymIntVec& pads = n.attrs.sym_ints("pads");
      TRef a = input(n, 0);
      size_t r = a.sizes.size();
      std::vector<sym::Expr> lo(r, sym::integer(0));
      for (size_t k = 0; k + 1 < pads.size() + 1 && k / 2 < r; k += 2) {
        // a symbolic amount (the backward of a slice up to a dynamic length pads by max_len - s0):
        // the bounds test below holds for it as for a constant one
        if (!pads[k].is_symbolic() && !pads[k + 1].is_symbolic() && (pads[k].hint() < 0 || pads[k + 1].hint() < 0))
          throw Unsupported{"negative pad"};
        lo[r - 1 - k / 2] = simplify_index(e_of(pads[k]));
      }
      TRef t;
      t.dtype = od;
      t.sizes = osz;
      t.fn = [a, lo, value, od](const std::vector<sym::Expr>& idx) {
        std::vector<sym::Expr> s(idx.size());
        std::vector<sym::Expr> conds;
        for (size_t i = 0; i < idx.size(); ++i) {
          s[i] = simplify_index(sym::sub(idx[i], lo[i]));
          if (!lo[i]->is_integer(0)) conds.push_back(sym::ge(idx[i], lo[i]));
          conds.push_back(sym::lt(s[i], a.sizes[i]));
        }
        return s_where(s_index(sym::and_(conds), DType::Bool), s_cast(a.fn(s), od), s_const(value, od));
      };
      return t;
    }
    case LowerRule::abs: case LowerRule::cast: case LowerRule::rounding: case LowerRule::clamp:
    case LowerRule::unary: case LowerRule::logical_not: case LowerRule::binary: case LowerRule::pow:
    case LowerRule::compare: case LowerRule::logical: case LowerRule::where: case LowerRule::expand:
    case LowerRule::permute: case LowerRule::reshape: case LowerRule::select: case LowerRule::slice:
    case LowerRule::squeeze: case LowerRule::unsqueeze:
    case LowerRule::gelu: case LowerRule::silu: case LowerRule::hardsigmoid: case LowerRule::hardswish:
    case LowerRule::reduce: case LowerRule::mean_var: case LowerRule::softmax: case LowerRule::norm:
    case LowerRule::batch_norm: case LowerRule::attention: case LowerRule::extern_call: case LowerRule::cond:
      break;
  }
  throw CompileError(fmt::format("lowering: rule {} of op {} is not a movement or factory rule", rule_name(rule), ops::op_name(n.op)));
}

bool Lowerer::lower_split(const Node& n) {
  const ValueId in = n.inputs.at(0);
  if (in == kNoValue || !values_[static_cast<size_t>(in)].fn) return false;
  for (ValueId v : n.outputs)
    if (!lowerable(g_.value(v).dtype)) return false;
  if (!lowerable(g_.value(in).dtype)) return false;
  const TRef a = values_[static_cast<size_t>(in)];
  const size_t d = static_cast<size_t>(wrap(n.attrs.i("dim"), a.sizes.size()));
  const size_t chain = a.buffer >= 0 ? 1 : chain_[static_cast<size_t>(in)] + 1;
  sym::Expr off = sym::integer(0);
  for (ValueId v : n.outputs) {
    TRef t;
    t.dtype = g_.value(v).dtype;
    t.sizes = value_sizes(g_.value(v));
    t.fn = [a, d, off](const std::vector<sym::Expr>& idx) {
      std::vector<sym::Expr> s = idx;
      s[d] = simplify_index(sym::add(idx[d], off));
      return a.fn(s);
    };
    off = simplify_index(sym::add(off, t.sizes[d]));
    values_[static_cast<size_t>(v)] = t;
    chain_[static_cast<size_t>(v)] = chain;
  }
  return true;
}

TRef Lowerer::lower_node(const Node& n) {
  for (ValueId v : n.inputs)
    if (v != kNoValue && !lowerable(g_.value(v).dtype)) throw Unsupported{"dtype"};
  for (ValueId v : n.outputs)
    if (!lowerable(g_.value(v).dtype)) throw Unsupported{"dtype"};
  if (n.outputs.size() != 1) throw Unsupported{"several outputs"};
  // The lowering table (lowering.def) names the rule; one case per rule, no default.
  const LoweringRow& row = lowering_row(n.op);
  switch (row.rule) {
    case LowerRule::abs: case LowerRule::cast: case LowerRule::rounding: case LowerRule::clamp:
    case LowerRule::unary: case LowerRule::logical_not: case LowerRule::binary: case LowerRule::pow:
    case LowerRule::compare: case LowerRule::logical: case LowerRule::where:
      return lower_pointwise(n, row);
    case LowerRule::expand: case LowerRule::permute: case LowerRule::reshape: case LowerRule::select:
    case LowerRule::slice: case LowerRule::squeeze: case LowerRule::unsqueeze:
      return lower_view(n, row.rule);
    case LowerRule::cat: case LowerRule::clone: case LowerRule::pad: case LowerRule::arange: case LowerRule::full:
      return lower_other(n, row.rule);
    case LowerRule::gelu: case LowerRule::silu: case LowerRule::hardsigmoid: case LowerRule::hardswish:
    case LowerRule::reduce: case LowerRule::mean_var: case LowerRule::softmax: case LowerRule::norm:
    case LowerRule::batch_norm: case LowerRule::attention:
      return lower_composite(*this, n, row.rule);
    case LowerRule::extern_call:
      if (n.op == OpKind::scaled_dot_product_attention_backward && options_.decompose_attention_backward)
        return lower_composite(*this, n, LowerRule::attention);
      throw Unsupported{"extern op"};
    case LowerRule::cond:
      throw Unsupported{"extern op"};
  }
  throw Unsupported{"unknown rule"};
}

Program Lowerer::run() {
  for (const Node& n : g_.nodes()) {
    where_ = n.loc.describe();
    switch (n.kind) {
      case NodeKind::Placeholder: {
        const ir::Value& v = g_.value(n.outputs[0]);
        int b = new_buffer(v.dtype, value_sizes(v), BufferKind::Input);
        int idx = 0;
        for (const Buffer& x : p_.buffers)
          if (x.kind == BufferKind::Input && x.id != b) ++idx;
        p_.buffers[static_cast<size_t>(b)].input_index = idx;
        values_[static_cast<size_t>(n.outputs[0])] = from_buffer(b);
        break;
      }
      case NodeKind::Constant: {
        const ir::Value& v = g_.value(n.outputs[0]);
        if (!n.constant.defined())
          throw CompileError(fmt::format("lowering: constant %{} has no data", v.name));
        Tensor c = n.constant.contiguous();
        if (lowerable_dtype(v.dtype) && c.int_numel() == 1 && v.sizes.size() <= 1) {
          // The value is read here, on the host: a device constant (a captured CUDA tensor) is copied
          // first (one element); reading its device address would fault.
          if (c.device().type != DeviceType::CPU) c = c.to(kCPU);
          double x = 0;
          switch (v.dtype) {
            case DType::Bool: x = c.data_ptr<bool>()[0]; break;
            case DType::I32: x = c.data_ptr<int32_t>()[0]; break;
            case DType::I64: x = static_cast<double>(c.data_ptr<int64_t>()[0]); break;
            case DType::F32: x = c.data_ptr<float>()[0]; break;
            case DType::F64: x = c.data_ptr<double>()[0]; break;
            case DType::U8: case DType::I8: case DType::F16: case DType::BF16: break;
          }
          if (v.dtype != DType::I64 || std::abs(x) < 9e15) {
            TRef t;
            t.dtype = v.dtype;
            t.sizes = value_sizes(v);
            DType dt = v.dtype;
            t.fn = [x, dt](const std::vector<sym::Expr>&) { return s_const(x, dt); };
            values_[static_cast<size_t>(n.outputs[0])] = t;
            break;
          }
        }
        int b = new_buffer(v.dtype, value_sizes(v), BufferKind::Constant);
        p_.buffers[static_cast<size_t>(b)].constant = c;
        values_[static_cast<size_t>(n.outputs[0])] = from_buffer(b);
        break;
      }
      case NodeKind::Call: {
        if (n.op == OpKind::cond || n.op == OpKind::call_region) {  // one extern step; the pipeline compiles the subgraphs
          lower_extern(n);
          p_.externs.back().subgraphs = n.subgraphs;
          break;
        }
        if (n.op == OpKind::split && options_.split_views && lower_split(n)) break;
        size_t nk = p_.kernels.size(), ne = p_.externs.size(), ns = p_.steps.size(), nb = p_.buffers.size();
        int nl = next_local_;
        try {
          TRef t = lower_node(n);
          ValueId v = n.outputs[0];
          t.dtype = g_.value(v).dtype;
          if (t.buffer < 0) {
            // A value used several times with a large expression, or one whose expression (or chain
            // of inlined rules: views add no node) is deeper than kMaxExprDepth, a long chain each
            // link used once, becomes a buffer: the second keeps every expression, and everything
            // that walks one or calls a TRef's fn, shallow (loop_ir.h).
            size_t chain = 1;
            for (ValueId in : n.inputs)
              if (in != kNoValue && values_[static_cast<size_t>(in)].buffer < 0)
                chain = std::max(chain, chain_[static_cast<size_t>(in)] + 1);
            const SExpr body = chain > kMaxExprDepth ? nullptr : t.fn(vars(t.sizes.size()));
            // A computed value that several extern steps read is realized once here, whatever its
            // size: otherwise each extern input realized its own copy (a fused qkv projection's
            // gradient, a concatenation, feeds the input-, weight- and bias-gradient GEMMs; a GELU's
            // output feeds the next linear forward and its weight gradient in the backward). A bare
            // load (a view of a buffer) stays a view: a GEMM may read it in place.
            const bool shared_extern = extern_uses_[static_cast<size_t>(v)] > 1 && body && body->op != SOp::Load;
            // A value several consumers read, one of them a row reduction, that loads more than
            // kInlineLoadLimit buffers is realized too (its kernel then runs as the row kernel's first
            // stage: schedule.h, "Pointwise producers into row kernels").
            const bool shared = uses_[static_cast<size_t>(v)] > 1;
            const bool wide = shared && row_uses_[static_cast<size_t>(v)] > 0 && body && loaded_buffers(body) > kInlineLoadLimit;
            if (!body || (shared && s_size(body) > kInlineLimit) || wide || s_depth(body) > kMaxExprDepth ||
                shared_extern)
              t = realize(t);
            chain_[static_cast<size_t>(v)] = t.buffer >= 0 ? 0 : chain;
          }
          values_[static_cast<size_t>(v)] = t;
        } catch (const Unsupported&) {
          p_.kernels.resize(nk);
          p_.externs.resize(ne);
          p_.steps.resize(ns);
          p_.buffers.resize(nb);
          next_local_ = nl;
          lower_extern(n);
        }
        break;
      }
      case NodeKind::Output: {
        for (ValueId v : n.inputs) {
          TRef& t = values_[static_cast<size_t>(v)];
          int b = t.buffer;
          const bool from_call = g_.producer(v).kind == NodeKind::Call;
          if (b >= 0 && !(from_call && (p_.buffers[static_cast<size_t>(b)].kind == BufferKind::Input ||
                                        p_.buffers[static_cast<size_t>(b)].kind == BufferKind::Constant))) {
            Buffer& buf = p_.buffers[static_cast<size_t>(b)];
            if (buf.kind == BufferKind::Temp) buf.kind = BufferKind::Output;
          } else {
            t = realize(t, BufferKind::Output);
          }
          p_.outputs.push_back(t.buffer);
        }
        break;
      }
    }
  }
  return std::move(p_);
}

Program lower_graph(const ir::Graph& g, const std::vector<sym::Expr>& symbols, const LowerOptions& options) {
  Lowerer l(g, symbols, options);
  return l.run();
}

}  // namespace protean::loop
