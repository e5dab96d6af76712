#include "ir/passes/constant_folding.h"

#include <fmt/format.h>

#include <unordered_set>

namespace protean::ir {

namespace {

bool concrete_attrs(const ops::Attrs& attrs) {
  for (const auto& a : attrs.items()) {
    if (const auto* s = std::get_if<SymInt>(&a.value))
      if (s->is_symbolic()) return false;
    if (const auto* v = std::get_if<SymIntVec>(&a.value))
      if (!all_concrete(*v)) return false;
  }
  return true;
}

int64_t numel_of(const SymIntVec& sizes) {
  int64_t n = 1;
  for (const auto& s : sizes) {
    if (s.is_symbolic()) return -1;
    n *= s.hint();
  }
  return n;
}

}  // namespace

size_t constant_folding(Graph& g, const ConstantFoldingOptions& options) {
  std::vector<Node>& nodes = g.nodes();
  std::vector<Value>& values = g.values();
  std::unordered_set<std::string> names;
  for (const auto& v : values) names.insert(v.name);
  int next_name = 0;
  auto fresh_name = [&] {
    std::string n;
    do n = fmt::format("c{}", next_name++);
    while (names.count(n));
    names.insert(n);
    return n;
  };

  std::vector<Node> out;
  out.reserve(nodes.size());
  size_t folded = 0;
  for (Node& n : nodes) {
    bool fold = n.kind == NodeKind::Call;
    const ops::OpInfo& info = ops::op_info(n.op);
    if (fold) fold = !(info.flags & (ops::kRandom | ops::kDataDependentShape | ops::kUnbackedSymbol)) && ops::kernel_fn(n.op);
    if (fold) fold = !n.inputs.empty() || info.category == ops::OpCategory::Factory;
    std::vector<Tensor> in;
    int64_t largest_input = 0;
    for (size_t k = 0; fold && k < n.inputs.size(); ++k) {
      ValueId v = n.inputs[k];
      if (v == kNoValue) {
        in.emplace_back();
        continue;
      }
      const Node& p = out[static_cast<size_t>(values[static_cast<size_t>(v)].node)];
      fold = p.kind == NodeKind::Constant && p.constant.defined();
      if (fold) {
        in.push_back(p.constant);
        largest_input = std::max(largest_input, p.constant.int_numel());
      }
    }
    if (fold) fold = concrete_attrs(n.attrs);
    for (size_t k = 0; fold && k < n.outputs.size(); ++k) {
      int64_t numel = numel_of(values[static_cast<size_t>(n.outputs[k])].sizes);
      fold = numel >= 0 && (numel <= options.max_elements || numel <= largest_input);
    }
    std::vector<Tensor> results;
    if (fold) {
      try {
        results = ops::run_eager(n.op, in, n.attrs);
      } catch (const std::exception&) {
        fold = false;
      }
      fold = fold && results.size() == n.outputs.size();
    }
    if (!fold) {
      int32_t idx = static_cast<int32_t>(out.size());
      for (ValueId v : n.outputs) values[static_cast<size_t>(v)].node = idx;
      out.push_back(std::move(n));
      continue;
    }
    ++folded;
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      Value& v = values[static_cast<size_t>(n.outputs[k])];
      v.node = static_cast<int32_t>(out.size());
      v.output_index = 0;
      v.name = fresh_name();
      v.dtype = results[k].dtype();
      v.sizes = results[k].sizes();
      v.strides = results[k].strides();
      Node c;
      c.kind = NodeKind::Constant;
      c.outputs = {n.outputs[k]};
      c.constant = results[k];
      c.loc = n.loc;
      out.push_back(std::move(c));
    }
  }
  nodes = std::move(out);
  if (folded) g.compact(std::vector<bool>(nodes.size(), true));
  return folded;
}

}  // namespace protean::ir
