#include "ir/passes/range_gather.h"

#include <unordered_set>

#include <fmt/format.h>

#include "ir/sym_util.h"

namespace protean::ir {

namespace {

/// The arange node whose values `v` holds in the same flat order, else nullptr.
const Node* flat_range_source(const Graph& g, ValueId v) {
  for (int hops = 0; hops < 16; ++hops) {
    const Node& n = g.producer(v);
    if (n.kind != NodeKind::Call) return nullptr;
    switch (n.op) {
      case ops::OpKind::arange: return &n;
      case ops::OpKind::reshape: case ops::OpKind::view: case ops::OpKind::unsqueeze: case ops::OpKind::squeeze:
      case ops::OpKind::clone:
        v = n.inputs.at(0);
        break;
      default: return nullptr;
    }
  }
  return nullptr;
}

bool concrete_is(const SymInt& s, int64_t want) {
  int64_t v = 0;
  return s.maybe_as_int(v) && v == want;
}

}  // namespace

size_t range_gather_as_slice(Graph& g, std::vector<sym::RuntimeAssert>* asserts) {
  size_t rewritten = 0;
  // Symbols bound before the first op runs (the inputs' sizes): an assertion over them is checked at
  // the start of a call. One over a symbol a data-dependent op defines (u0) would have to wait for it.
  std::unordered_set<sym::Expr> bound_at_entry;
  for (ValueId v : g.inputs())
    for (const SymInt& s : g.value(v).sizes)
      for (sym::Expr f : sym::free_symbols(to_expr(s))) bound_at_entry.insert(f);
  auto bound_at_start = [&](sym::Expr e) {
    for (sym::Expr f : sym::free_symbols(e))
      if (!bound_at_entry.count(f)) return false;
    return true;
  };
  for (Node& n : g.nodes()) {
    if (n.kind != NodeKind::Call || n.op != ops::OpKind::index_select || n.inputs.size() != 2) continue;
    const Value& x = g.value(n.inputs[0]);
    const Value& idx = g.value(n.inputs[1]);
    if (idx.sizes.size() != 1 || x.sizes.empty()) continue;
    const Node* range = flat_range_source(g, n.inputs[1]);
    if (!range) continue;
    const DType range_dtype = g.value(range->outputs.at(0)).dtype;
    if (range_dtype != DType::I64 && range_dtype != DType::I32) continue;  // a narrower type could wrap before n
    const ops::Attrs& ra = range->attrs;
    if (!ra.has("start") || !ra.has("step") || !concrete_is(ra.sym_int("start"), 0) ||
        !concrete_is(ra.sym_int("step"), 1))
      continue;
    const SymInt count = idx.sizes[0];  // = the arange's length, since start 0 and step 1
    int64_t dim = 0;
    if (!n.attrs.sym_int("dim").maybe_as_int(dim)) continue;
    const int64_t rank = static_cast<int64_t>(x.sizes.size());
    if (dim < -rank || dim >= rank) continue;
    if (dim < 0) dim += rank;
    const SymInt rows = x.sizes[static_cast<size_t>(dim)];
    int64_t c = 0, r = 0;
    const bool concrete = count.maybe_as_int(c) && rows.maybe_as_int(r);
    if (concrete && c > r) continue;  // the original fails at run time: keep it
    if (!concrete) {
      const sym::Expr bound = sym::le(to_expr(count), to_expr(rows));
      if (!asserts || !bound_at_start(bound)) continue;
      if (bound->kind == sym::Kind::False) continue;
      if (bound->kind != sym::Kind::True)
        asserts->push_back({bound,
                            fmt::format("index_select of arange(0, {}) from dim {} of size {} reads past its end "
                                        "(a sequence longer than a position-embedding table?)",
                                        symint_text(count), dim, symint_text(rows)),
                            n.loc});
    }
    // The node becomes the view; its output value keeps its name, dtype and sizes.
    n.op = ops::OpKind::slice;
    n.inputs = {n.inputs[0]};
    n.attrs = ops::Attrs{{"dim", SymInt(dim)}, {"start", SymInt(0)}, {"end", count}, {"step", SymInt(1)}};
    Value& out = g.values()[static_cast<size_t>(n.outputs.at(0))];
    out.strides = g.value(n.inputs[0]).strides;
    ++rewritten;
  }
  return rewritten;
}

}  // namespace protean::ir
