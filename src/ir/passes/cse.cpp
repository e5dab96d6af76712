#include "ir/passes/cse.h"

#include <string>
#include <unordered_map>

namespace protean::ir {

namespace {
/// Equal attributes regardless of their order (Attrs::operator== compares values per name).
bool same_attrs(const ops::Attrs& a, const ops::Attrs& b) {
  if (a.items().size() != b.items().size()) return false;
  if (a == b) return true;
  for (const auto& item : a.items()) {
    const ops::AttrValue* other = b.find(item.name);
    if (!other || !(ops::Attrs{item} == ops::Attrs{{item.name, *other}})) return false;
  }
  return true;
}

/// Same branches (cond): the same graphs, or graphs that compute the same thing.
bool same_subgraphs(const Node& a, const Node& b) {
  if (a.subgraphs.size() != b.subgraphs.size()) return false;
  for (size_t k = 0; k < a.subgraphs.size(); ++k)
    if (a.subgraphs[k] != b.subgraphs[k] && !equal_graphs(*a.subgraphs[k], *b.subgraphs[k])) return false;
  return true;
}

/// The op, the inputs and the attribute values (order-independent over attributes, as same_attrs).
/// Without the values, calls that differ only in attributes (the slices of one arena, thousands in a
/// train step over many parameters) shared one bucket and CSE went quadratic.
size_t call_hash(const Node& n) {
  size_t h = static_cast<size_t>(n.op) * 0x9e3779b97f4a7c15ull;
  for (ValueId v : n.inputs) h = (h ^ static_cast<size_t>(v + 2)) * 0x100000001b3ull;
  size_t attrs = n.attrs.items().size();
  for (const auto& item : n.attrs.items())
    attrs += std::hash<std::string>()(item.name) * 31 + std::hash<std::string>()(ops::attr_to_string(item.value));
  return h ^ (attrs * 0xff51afd7ed558ccdull);
}
}  // namespace

size_t common_subexpression_elimination(Graph& g) {
  auto& nodes = g.nodes();
  std::vector<ValueId> replace(g.values().size());
  for (size_t v = 0; v < replace.size(); ++v) replace[v] = static_cast<ValueId>(v);
  std::vector<bool> keep(nodes.size(), true);
  std::unordered_multimap<size_t, size_t> calls;                 // hash → node index
  std::unordered_map<const TensorImpl*, size_t> constants;       // data → node index
  size_t removed = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node& n = nodes[i];
    for (ValueId& v : n.inputs)
      if (v != kNoValue) v = replace[static_cast<size_t>(v)];
    const Node* same = nullptr;
    if (n.kind == NodeKind::Constant && n.constant.defined()) {
      auto [it, inserted] = constants.emplace(n.constant.impl(), i);
      if (!inserted) same = &nodes[it->second];
    } else if (n.kind == NodeKind::Call && !(ops::op_info(n.op).flags & (ops::kRandom | ops::kUnbackedSymbol))) {
      // (A node defining an unbacked symbol is never merged: its symbol is distinct from its twin's.)
      size_t h = call_hash(n);
      auto [lo, hi] = calls.equal_range(h);
      for (auto it = lo; it != hi && !same; ++it) {
        const Node& m = nodes[it->second];
        if (m.op == n.op && m.inputs == n.inputs && m.outputs.size() == n.outputs.size() && same_attrs(m.attrs, n.attrs) &&
            same_subgraphs(m, n))
          same = &m;
      }
      if (!same) calls.emplace(h, i);
    }
    if (!same) continue;
    for (size_t k = 0; k < n.outputs.size(); ++k) replace[static_cast<size_t>(n.outputs[k])] = same->outputs[k];
    keep[i] = false;
    ++removed;
  }
  if (removed) g.compact(keep);
  return removed;
}

}  // namespace protean::ir
