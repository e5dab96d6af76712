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
      case NodeKind::Call:
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
