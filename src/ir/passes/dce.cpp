#include "ir/passes/dce.h"

namespace protean::ir {

size_t dead_code_elimination(Graph& g) {
  const auto& nodes = g.nodes();
  std::vector<bool> used(g.values().size(), false);
  std::vector<bool> keep(nodes.size(), false);
  size_t removed = 0;
  for (size_t i = nodes.size(); i-- > 0;) {
    const Node& n = nodes[i];
    bool live = false;
    switch (n.kind) {
      case NodeKind::Placeholder:
      case NodeKind::Output:
        live = true;
        break;
      case NodeKind::Constant:
        for (ValueId v : n.outputs) live = live || used[static_cast<size_t>(v)];
        break;
      case NodeKind::Call:
        // A node that defines an unbacked symbol (nonzero's row count, item_symint's value) stays even
        // when its tensor is unused: later sizes and runtime assertions may mention the symbol.
        live = (ops::op_info(n.op).flags & ops::kUnbackedSymbol) != 0;
        for (ValueId v : n.outputs) live = live || used[static_cast<size_t>(v)];
        break;
    }
    keep[i] = live;
    if (!live) {
      ++removed;
      continue;
    }
    for (ValueId v : n.inputs)
      if (v != kNoValue) used[static_cast<size_t>(v)] = true;
  }
  if (removed) g.compact(keep);
  return removed;
}

}  // namespace protean::ir
