#include "backend/causal_mask.h"

#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ir/sym_util.h"
#include "sym/simplify.h"
#include "sym/value_ranges.h"

namespace protean::backend {

using ir::Node;
using ir::NodeKind;
using ir::ValueId;
using ops::OpKind;
using sym::Expr;

namespace {

constexpr size_t kMaxPieces = 64;  // more pieces than this: not proven (keeps the analysis small)

/// Index variable d of the value being evaluated (a name no graph symbol takes).
Expr var(size_t d) { return sym::symbol("attn_mask_i" + std::to_string(d)); }

/// One piece of a value: a box over its indices (per dim, every candidate bound holds: lo <= i <= hi,
/// bounds in size symbols only) and the element there (an integer or boolean expression of the
/// indices; for floats the condition C of `C ? a : b`).
struct Piece {
  std::vector<std::vector<Expr>> lo, hi;
  Expr v = nullptr;
};

struct Abs {
  enum Kind { Int, Bool, Float } kind = Int;
  std::vector<Piece> pieces;
  double a = 0, b = 0;  ///< Float: the values where C holds and where it does not
};

class Prover {
 public:
  explicit Prover(const ir::Graph& g) : g_(g), ranges_(sym::ValueRange{1, sym::kIntOo}) {
    for (size_t d = 0; d < 8; ++d) vars_.insert(var(d));
  }

  std::optional<Abs> eval(ValueId v) {
    if (auto it = memo_.find(v); it != memo_.end()) return it->second;
    std::optional<Abs> r;
    if (++depth_ < 400) r = compute(v);
    --depth_;
    memo_[v] = r;
    return r;
  }

  /// The full box of value `v`'s indices: 0 <= i_d <= size_d - 1.
  Piece full_box(ValueId v) const {
    Piece p;
    for (const SymInt& s : g_.value(v).sizes) {
      p.lo.push_back({sym::integer(0)});
      p.hi.push_back({sym::simplify(sym::sub(ir::to_expr(s), sym::integer(1)))});
    }
    return p;
  }

  /// Whether e >= 0 at every point of `box` (true), at none (false), or unknown. e must be affine in
  /// the index variables with integer coefficients.
  std::optional<bool> ge0(Expr e, const Piece& box) const {
    e = sym::simplify(e);
    const sym::LinearTerms t = sym::as_terms(e);
    Expr base = sym::integer(t.constant);
    std::vector<std::pair<size_t, int64_t>> idx;  // (dim, coefficient)
    for (const auto& [mono, c] : t.terms) {
      if (vars_.count(mono)) {
        size_t d = 0;
        while (var(d) != mono) ++d;
        if (d >= box.lo.size()) return std::nullopt;
        idx.emplace_back(d, c);
        continue;
      }
      for (Expr s : sym::free_symbols(mono))
        if (vars_.count(s)) return std::nullopt;  // an index times a symbol: not affine
      base = sym::add(base, sym::mul(sym::integer(c), mono));
    }
    // the least and greatest value over the box, for every choice of candidate bounds (each choice is
    // a valid bound, so any of them deciding is a proof)
    auto extreme = [&](bool least) -> std::optional<bool> {
      std::vector<size_t> pick(idx.size(), 0);
      for (int guard = 0; guard < 256; ++guard) {
        Expr x = base;
        for (size_t k = 0; k < idx.size(); ++k) {
          const auto& [d, c] = idx[k];
          const auto& cands = (c > 0) == least ? box.lo[d] : box.hi[d];
          if (cands.empty()) return std::nullopt;
          x = sym::add(x, sym::mul(sym::integer(c), cands[pick[k] % cands.size()]));
        }
        const sym::ValueRange r = ranges_.range(sym::simplify(x));
        if (least && r.lo >= 0) return true;
        if (!least && r.hi < 0) return false;
        size_t k = 0;  // next choice
        for (; k < idx.size(); ++k) {
          const auto& [d, c] = idx[k];
          const size_t n = ((c > 0) == least ? box.lo[d] : box.hi[d]).size();
          if (++pick[k] < n) break;
          pick[k] = 0;
        }
        if (k == idx.size()) break;
      }
      return std::nullopt;
    };
    if (auto r = extreme(true)) return r;
    return extreme(false);
  }

  /// A boolean expression decided over the box, when it can be.
  std::optional<bool> decide(Expr b, const Piece& box) const {
    if (b->kind == sym::Kind::True) return true;
    if (b->kind == sym::Kind::False) return false;
    if (b->kind == sym::Kind::Not) {
      if (auto r = decide(b->args[0], box)) return !*r;
      return std::nullopt;
    }
    if (b->kind == sym::Kind::And || b->kind == sym::Kind::Or) {
      const bool is_and = b->kind == sym::Kind::And;
      bool all = true;
      for (Expr a : b->args) {
        std::optional<bool> r = decide(a, box);
        if (r && *r != is_and) return !is_and;  // a false conjunct / a true disjunct
        all = all && r.has_value();
      }
      if (all) return is_and;
      return std::nullopt;
    }
    if (!b->is_relation()) return std::nullopt;
    const Expr x = b->args[0], y = b->args[1];
    const sym::Kind k = b->kind;
    if (k == sym::Kind::Ge) return ge0(sym::sub(x, y), box);
    if (k == sym::Kind::Le) return ge0(sym::sub(y, x), box);
    if (k == sym::Kind::Gt) return ge0(sym::sub(sym::sub(x, y), sym::integer(1)), box);
    if (k == sym::Kind::Lt) return ge0(sym::sub(sym::sub(y, x), sym::integer(1)), box);
    if (k != sym::Kind::Eq && k != sym::Kind::Ne) return std::nullopt;
    std::optional<bool> lo = ge0(sym::sub(x, y), box), hi = ge0(sym::sub(y, x), box);
    std::optional<bool> eq;
    if (lo && hi) eq = *lo && *hi;
    else if ((lo && !*lo) || (hi && !*hi)) eq = false;
    if (!eq) return std::nullopt;
    return k == sym::Kind::Eq ? *eq : !*eq;
  }

  /// Fixes the indices whose bounds meet (substituted into the value), drops a box proven empty.
  bool normalize(Piece& p) const {
    std::unordered_map<Expr, Expr> fix;
    for (size_t d = 0; d < p.lo.size(); ++d) {
      for (Expr l : p.lo[d])
        for (Expr h : p.hi[d]) {
          if (std::optional<bool> r = ge0(sym::sub(sym::sub(l, h), sym::integer(1)), Piece{}); r && *r) return false;
          if (!fix.count(var(d)) && sym::simplify(sym::sub(h, l))->is_integer(0)) fix[var(d)] = sym::simplify(l);
        }
    }
    if (!fix.empty()) p.v = sym::substitute(p.v, fix);
    p.v = sym::simplify(p.v);
    return true;
  }

  /// Value `src` read at index `at` (one expression per dim of src, in the consumer's indices) inside
  /// the consumer's box `box`: the consumer's pieces, or nullopt when a bound cannot be decided or
  /// turned into a bound of one consumer index.
  std::optional<std::vector<Piece>> pull(const Abs& src, const std::vector<Expr>& at, const Piece& box) const {
    std::vector<Piece> out;
    for (const Piece& sp : src.pieces) {
      if (sp.lo.size() != at.size()) return std::nullopt;
      Piece cp = box;
      bool dropped = false;
      for (size_t d = 0; d < at.size() && !dropped; ++d) {
        std::vector<std::pair<Expr, bool>> cons;  // (bound, is lower)
        for (Expr l : sp.lo[d]) cons.emplace_back(l, true);
        for (Expr h : sp.hi[d]) cons.emplace_back(h, false);
        for (const auto& [bound, lower] : cons) {
          const Expr c = lower ? sym::sub(at[d], bound) : sym::sub(bound, at[d]);
          std::optional<bool> r = ge0(c, cp);
          if (r && *r) continue;
          if (r && !*r) {
            dropped = true;
            break;
          }
          // at[d] = i_k + rest with rest free of indices: a bound of i_k
          const Expr e = sym::simplify(at[d]);
          std::optional<size_t> k;
          for (size_t j = 0; j < cp.lo.size(); ++j)
            if (sym::has_symbol(e, var(j))) {
              if (k) return std::nullopt;
              k = j;
            }
          if (!k) return std::nullopt;
          const Expr rest = sym::simplify(sym::sub(e, var(*k)));
          if (sym::has_symbol(rest, var(*k))) return std::nullopt;
          (lower ? cp.lo[*k] : cp.hi[*k]).push_back(sym::simplify(sym::sub(bound, rest)));
        }
      }
      if (dropped) continue;
      // substitute through fresh names first: the source's and the consumer's indices share names
      std::unordered_map<Expr, Expr> to_tmp, from_tmp;
      for (size_t d = 0; d < at.size(); ++d) {
        const Expr tmp = sym::symbol("attn_mask_t" + std::to_string(d));
        to_tmp[var(d)] = tmp;
        from_tmp[tmp] = at[d];
      }
      cp.v = sym::substitute(sym::substitute(sp.v, to_tmp), from_tmp);
      if (!normalize(cp)) continue;
      out.push_back(std::move(cp));
      if (out.size() > kMaxPieces) return std::nullopt;
    }
    return out;
  }

  /// The consumer's index map for an operand of `sizes` broadcast to the output's rank (numpy rules).
  std::vector<Expr> broadcast_at(const SymIntVec& in, const SymIntVec& out) const {
    std::vector<Expr> at;
    const size_t off = out.size() - in.size();
    for (size_t d = 0; d < in.size(); ++d) {
      const bool one = ir::to_expr(in[d])->is_integer(1) && !ir::to_expr(out[d + off])->is_integer(1);
      at.push_back(one ? sym::integer(0) : var(d + off));
    }
    return at;
  }

 private:
  static bool binary_op(OpKind op) {
    return op == OpKind::add || op == OpKind::sub || op == OpKind::mul || op == OpKind::eq || op == OpKind::ne ||
           op == OpKind::lt || op == OpKind::le || op == OpKind::gt || op == OpKind::ge || op == OpKind::logical_and ||
           op == OpKind::logical_or;
  }
  static bool integral(DType t) {
    return t == DType::I64 || t == DType::I32 || t == DType::I8 || t == DType::U8;
  }

  std::optional<Abs> compute(ValueId v) {
    const Node& n = g_.producer(v);
    const ir::Value& out = g_.value(v);
    const size_t R = out.sizes.size();
    if (R > 8) return std::nullopt;
    const Piece box = full_box(v);
    if (n.kind == NodeKind::Constant) return constant(n, box);
    if (n.kind != NodeKind::Call || n.outputs.size() != 1) return std::nullopt;
    auto in = [&](size_t k) { return n.inputs.size() > k && n.inputs[k] != ir::kNoValue ? eval(n.inputs[k]) : std::nullopt; };
    auto size_of = [&](size_t k) -> const SymIntVec& { return g_.value(n.inputs[k]).sizes; };
    auto int_attr = [&](const char* name) -> std::optional<int64_t> {
      if (!n.attrs.has(name)) return std::nullopt;
      int64_t x = 0;
      if (!n.attrs.sym_int(name).maybe_as_int(x)) return std::nullopt;
      return x;
    };
    auto norm_dim = [&](int64_t d, size_t rank) -> std::optional<size_t> {
      if (d < 0) d += static_cast<int64_t>(rank);
      if (d < 0 || d >= static_cast<int64_t>(rank)) return std::nullopt;
      return static_cast<size_t>(d);
    };
    // a movement op: the source read at `at` over the whole box
    auto moved = [&](const std::vector<Expr>& at) -> std::optional<Abs> {
      std::optional<Abs> s = in(0);
      if (!s) return std::nullopt;
      std::optional<std::vector<Piece>> ps = pull(*s, at, box);
      if (!ps) return std::nullopt;
      Abs r = *s;
      r.pieces = std::move(*ps);
      return r;
    };
    if (n.op == OpKind::arange) {
      if (R != 1 || !integral(out.dtype) || !n.attrs.has("start") || !n.attrs.has("step")) return std::nullopt;
      Abs r;
      Piece p = box;
      p.v = sym::simplify(sym::add(ir::to_expr(n.attrs.sym_int("start")), sym::mul(ir::to_expr(n.attrs.sym_int("step")), var(0))));
      if (!normalize(p)) return Abs{};
      r.pieces.push_back(p);
      return r;
    }
    if (n.op == OpKind::unsqueeze) {
      std::optional<int64_t> d0 = int_attr("dim");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R) : std::nullopt;
      if (!d) return std::nullopt;
      std::vector<Expr> at;
      for (size_t k = 0; k < R; ++k)
        if (k != *d) at.push_back(var(k));
      return moved(at);
    }
    if (n.op == OpKind::reshape) {  // only dims of size 1 added or dropped
      const SymIntVec& is = size_of(0);
      std::vector<size_t> a, b;
      for (size_t k = 0; k < is.size(); ++k)
        if (!ir::to_expr(is[k])->is_integer(1)) a.push_back(k);
      for (size_t k = 0; k < R; ++k)
        if (!ir::to_expr(out.sizes[k])->is_integer(1)) b.push_back(k);
      if (a.size() != b.size()) return std::nullopt;
      std::vector<Expr> at(is.size(), sym::integer(0));
      for (size_t k = 0; k < a.size(); ++k) {
        if (sym::simplify(ir::to_expr(is[a[k]])) != sym::simplify(ir::to_expr(out.sizes[b[k]]))) return std::nullopt;
        at[a[k]] = var(b[k]);
      }
      return moved(at);
    }
    if (n.op == OpKind::expand) return moved(broadcast_at(size_of(0), out.sizes));
    if (n.op == OpKind::slice) {
      std::optional<int64_t> d0 = int_attr("dim"), start = int_attr("start"), step = int_attr("step");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R) : std::nullopt;
      if (!d || !start || !step || *start < 0 || *step < 1) return std::nullopt;  // an empty slice has no element
      std::vector<Expr> at;
      for (size_t k = 0; k < R; ++k)
        at.push_back(k == *d ? sym::add(sym::integer(*start), sym::mul(sym::integer(*step), var(k))) : var(k));
      return moved(at);
    }
    if (n.op == OpKind::select) {
      std::optional<int64_t> d0 = int_attr("dim"), index = int_attr("index");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R + 1) : std::nullopt;
      if (!d || !index || *index < 0) return std::nullopt;
      std::vector<Expr> at;
      for (size_t k = 0, j = 0; k < R + 1; ++k) at.push_back(k == *d ? sym::integer(*index) : var(j++));
      return moved(at);
    }
    if (n.op == OpKind::cat) {
      std::optional<int64_t> d0 = int_attr("dim");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R) : std::nullopt;
      if (!d || n.inputs.empty()) return std::nullopt;
      Abs r;
      Expr off = sym::integer(0);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        std::optional<Abs> s = in(k);
        if (!s || (k > 0 && (s->kind != r.kind || s->a != r.a || s->b != r.b))) return std::nullopt;
        if (k == 0) {
          r.kind = s->kind;
          r.a = s->a;
          r.b = s->b;
        }
        const Expr len = ir::to_expr(size_of(k)[*d]);
        Piece part = box;
        part.lo[*d].push_back(off);
        part.hi[*d].push_back(sym::simplify(sym::sub(sym::add(off, len), sym::integer(1))));
        std::vector<Expr> at;
        for (size_t j = 0; j < R; ++j) at.push_back(j == *d ? sym::sub(var(j), off) : var(j));
        std::optional<std::vector<Piece>> ps = pull(*s, at, part);
        if (!ps) return std::nullopt;
        for (Piece& p : *ps) r.pieces.push_back(std::move(p));
        off = sym::simplify(sym::add(off, len));
      }
      if (r.pieces.size() > kMaxPieces) return std::nullopt;
      return r;
    }
    if (n.op == OpKind::cast) {
      std::optional<Abs> s = in(0);
      if (!s) return std::nullopt;
      const DType from = g_.value(n.inputs[0]).dtype;
      if (from == out.dtype) return s;
      if (s->kind == Abs::Float || !integral(out.dtype)) return std::nullopt;
      if (s->kind == Abs::Int) {  // integer to integer: only widening to i64 keeps every value
        if (out.dtype != DType::I64) return std::nullopt;
        return s;
      }
      for (Piece& p : s->pieces) {      // bool to integer: a decided condition
        std::optional<bool> b = decide(p.v, p);
        if (!b) return std::nullopt;
        p.v = sym::integer(*b ? 1 : 0);
      }
      s->kind = Abs::Int;
      return s;
    }
    if (n.op == OpKind::logical_not) {
      std::optional<Abs> s = in(0);
      if (!s || s->kind != Abs::Bool) return std::nullopt;
      for (Piece& p : s->pieces) p.v = sym::simplify(sym::not_(p.v));
      return s;
    }
    if (binary_op(n.op)) return binary(n, box, out.sizes);
    if (n.op == OpKind::where) return where(n, box, out.sizes);
    if (n.op == OpKind::cumsum) {
      std::optional<int64_t> d0 = int_attr("dim");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R) : std::nullopt;
      std::optional<Abs> s = in(0);
      if (!d || !s || s->kind != Abs::Int) return std::nullopt;
      std::optional<int64_t> c;
      for (const Piece& p : s->pieces) {
        if (!p.v->is_integer() || (c && *c != p.v->value)) return std::nullopt;
        c = p.v->value;
      }
      Abs r;
      Piece p = box;
      p.v = sym::simplify(sym::mul(sym::integer(c.value_or(0)), sym::add(var(*d), sym::integer(1))));
      if (normalize(p)) r.pieces.push_back(p);
      return r;
    }
    if (n.op == OpKind::index_select) {
      if (n.attrs.has("wrap_negative") && n.attrs.b("wrap_negative")) return std::nullopt;  // index < 0 is not a row
      std::optional<int64_t> d0 = int_attr("dim");
      std::optional<size_t> d = d0 ? norm_dim(*d0, R) : std::nullopt;
      std::optional<Abs> x = in(0), idx = in(1);
      if (!d || !x || !idx || idx->kind != Abs::Int || size_of(1).size() != 1) return std::nullopt;
      std::optional<std::vector<Piece>> ips = pull(*idx, {var(*d)}, box);
      if (!ips) return std::nullopt;
      Abs r = *x;
      r.pieces.clear();
      for (const Piece& ip : *ips) {
        std::vector<Expr> at;
        for (size_t k = 0; k < R; ++k) at.push_back(k == *d ? ip.v : var(k));
        std::optional<std::vector<Piece>> ps = pull(*x, at, ip);  // the box bounds the index: in range
        if (!ps) return std::nullopt;
        for (Piece& p : *ps) r.pieces.push_back(std::move(p));
        if (r.pieces.size() > kMaxPieces) return std::nullopt;
      }
      return r;
    }
    return std::nullopt;
  }

  std::optional<Abs> constant(const Node& n, const Piece& box) const {
    if (!n.constant.defined() || n.constant.int_numel() < 1 || n.constant.int_numel() > 4096) return std::nullopt;
    const DType t = n.constant.dtype();
    Abs r;
    Piece p = box;
    if (is_floating(t)) {
      const std::vector<double> x = n.constant.to_vector<double>();
      for (double y : x)
        if (!(y == x[0]) && !(std::isnan(y) && std::isnan(x[0]))) return std::nullopt;
      r.kind = Abs::Float;
      r.a = r.b = x[0];
      p.v = sym::true_();
    } else {
      const std::vector<int64_t> x = n.constant.to(DType::I64).to_vector<int64_t>();
      for (int64_t y : x)
        if (y != x[0]) return std::nullopt;
      r.kind = t == DType::Bool ? Abs::Bool : Abs::Int;
      p.v = t == DType::Bool ? sym::boolean(x[0] != 0) : sym::integer(x[0]);
    }
    if (normalize(p)) r.pieces.push_back(p);
    return r;
  }

  std::optional<Abs> binary(const Node& n, const Piece& box, const SymIntVec& out) {
    if (n.inputs.size() != 2) return std::nullopt;
    std::optional<Abs> x = eval(n.inputs[0]), y = eval(n.inputs[1]);
    if (!x || !y) return std::nullopt;
    const bool logical = n.op == OpKind::logical_and || n.op == OpKind::logical_or;
    const bool arith = n.op == OpKind::add || n.op == OpKind::sub || n.op == OpKind::mul;
    if (logical ? (x->kind != Abs::Bool || y->kind != Abs::Bool) : (x->kind != Abs::Int || y->kind != Abs::Int))
      return std::nullopt;
    std::optional<std::vector<Piece>> xs = pull(*x, broadcast_at(g_.value(n.inputs[0]).sizes, out), box);
    if (!xs) return std::nullopt;
    Abs r;
    r.kind = arith ? Abs::Int : Abs::Bool;
    for (const Piece& xp : *xs) {
      std::optional<std::vector<Piece>> ys = pull(*y, broadcast_at(g_.value(n.inputs[1]).sizes, out), xp);
      if (!ys) return std::nullopt;
      for (Piece& p : *ys) {
        const Expr a = xp.v, b = p.v;
        Expr v = nullptr;
        if (n.op == OpKind::add) v = sym::add(a, b);
        else if (n.op == OpKind::sub) v = sym::sub(a, b);
        else if (n.op == OpKind::mul) v = sym::mul(a, b);
        else if (n.op == OpKind::eq) v = sym::eq(a, b);
        else if (n.op == OpKind::ne) v = sym::ne(a, b);
        else if (n.op == OpKind::lt) v = sym::lt(a, b);
        else if (n.op == OpKind::le) v = sym::le(a, b);
        else if (n.op == OpKind::gt) v = sym::gt(a, b);
        else if (n.op == OpKind::ge) v = sym::ge(a, b);
        else if (n.op == OpKind::logical_and) v = sym::and_(a, b);
        else if (n.op == OpKind::logical_or) v = sym::or_(a, b);
        else return std::nullopt;
        if (!arith)
          if (std::optional<bool> dv = decide(v, p)) v = sym::boolean(*dv);
        p.v = v;
        if (!normalize(p)) continue;
        r.pieces.push_back(std::move(p));
        if (r.pieces.size() > kMaxPieces) return std::nullopt;
      }
    }
    return r;
  }

  std::optional<Abs> where(const Node& n, const Piece& box, const SymIntVec& out) {
    if (n.inputs.size() != 3) return std::nullopt;
    std::optional<Abs> c = eval(n.inputs[0]), x = eval(n.inputs[1]), y = eval(n.inputs[2]);
    if (!c || !x || !y || c->kind != Abs::Bool || x->kind != y->kind || x->kind == Abs::Bool) return std::nullopt;
    std::optional<std::vector<Piece>> cs = pull(*c, broadcast_at(g_.value(n.inputs[0]).sizes, out), box);
    if (!cs) return std::nullopt;
    Abs r;
    r.kind = x->kind;
    if (x->kind == Abs::Float) {  // two constants: the result is `C ? a : b`
      for (const Abs* s : {&*x, &*y})
        for (const Piece& p : s->pieces)
          if (p.v->kind != sym::Kind::True || s->a != s->b) return std::nullopt;
      r.a = x->a;
      r.b = y->a;
      r.pieces = std::move(*cs);
      return r;
    }
    for (const Piece& cp : *cs) {  // integers: the condition must be decided in each piece
      std::optional<bool> dv = decide(cp.v, cp);
      if (!dv) return std::nullopt;
      const ValueId pick = *dv ? n.inputs[1] : n.inputs[2];
      std::optional<std::vector<Piece>> ps = pull(*dv ? *x : *y, broadcast_at(g_.value(pick).sizes, out), cp);
      if (!ps) return std::nullopt;
      for (Piece& p : *ps) r.pieces.push_back(std::move(p));
      if (r.pieces.size() > kMaxPieces) return std::nullopt;
    }
    return r;
  }

  const ir::Graph& g_;
  sym::RangeAnalyzer ranges_;  ///< size symbols >= 1 (a size 0 leaves no element to reason about)
  std::unordered_set<Expr> vars_;
  std::map<ValueId, std::optional<Abs>> memo_;
  int depth_ = 0;
};

double lowest_finite(DType t) {
  switch (t) {
    case DType::F16: return -65504.0;
    case DType::BF16: return -3.3895313892515355e38;
    case DType::F32: return -static_cast<double>(std::numeric_limits<float>::max());
    case DType::F64: return -std::numeric_limits<double>::max();
    case DType::I64:
    case DType::I32:
    case DType::I8:
    case DType::U8:
    case DType::Bool: return 0.0;
  }
  return 0.0;
}

}  // namespace

struct CausalMaskProver::Impl {
  explicit Impl(const ir::Graph& g) : g(g), pr(g) {}
  const ir::Graph& g;
  Prover pr;
};

CausalMaskProver::CausalMaskProver(const ir::Graph& g) : impl_(std::make_unique<Impl>(g)) {}
CausalMaskProver::~CausalMaskProver() = default;

bool is_proven_causal_mask(const ir::Graph& g, ValueId mask) { return CausalMaskProver(g).proven(mask); }

bool CausalMaskProver::proven(ValueId mask) {
  const ir::Graph& g = impl_->g;
  Prover& pr = impl_->pr;
  const ir::Value& m = g.value(mask);
  const size_t R = m.sizes.size();
  if (R < 2 || !is_floating(m.dtype)) return false;
  try {
    std::optional<Abs> a = pr.eval(mask);
    if (!a || a->kind != Abs::Float || a->pieces.empty()) return false;
    // kept: exactly 0; masked: -inf or at most half the lowest finite value
    if (a->a != 0.0 || !(a->b <= 0.5 * lowest_finite(m.dtype))) return false;
    const Expr causal = sym::normalize_relation(sym::simplify(sym::le(var(R - 1), var(R - 2))));
    for (const Piece& p : a->pieces) {
      const Expr c = sym::simplify(p.v);
      if (c->is_relation() && sym::normalize_relation(c) == causal) continue;
      // a piece where both are decided the same way (e.g. a row's first key)
      std::optional<bool> x = pr.decide(c, p), y = pr.decide(causal, p);
      if (!x || !y || *x != *y) return false;
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace protean::backend
