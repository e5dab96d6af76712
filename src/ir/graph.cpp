#include "ir/graph.h"

#include <fmt/format.h>

#include <unordered_set>

#include "ir/printer.h"
#include "ir/sym_util.h"

namespace protean::ir {

namespace {

bool is_number(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

/// Makes a source ("x", "self.w", "args[2]") usable as a value name: drops characters the printer
/// cannot quote (quotes, backslashes, whitespace, control characters) and keeps names of inputs and
/// constants apart from the numeric names of Call results.
std::string sanitize(std::string_view source, std::string_view fallback) {
  std::string r;
  for (char c : source) {
    unsigned char u = static_cast<unsigned char>(c);
    r += (u <= ' ' || c == '"' || c == '\\' || u == 0x7f) ? '_' : c;
  }
  if (r.empty()) r = fallback;
  if (is_number(r)) r = "_" + r;
  return r;
}

std::string unique_name(const std::vector<Value>& values, std::string base) {
  auto taken = [&](const std::string& n) {
    for (const auto& v : values)
      if (v.name == n) return true;
    return false;
  };
  if (!taken(base)) return base;
  for (int k = 1;; ++k) {
    std::string n = fmt::format("{}_{}", base, k);
    if (!taken(n)) return n;
  }
}

}  // namespace

ValueId Graph::new_value(DType dtype, SymIntVec sizes, SymIntVec strides, int32_t node, int32_t idx,
                         std::string name) {
  Value v;
  v.name = std::move(name);
  v.dtype = dtype;
  if (strides.empty() && !sizes.empty()) strides = contiguous_strides_of(sizes);
  v.sizes = std::move(sizes);
  v.strides = std::move(strides);
  v.node = node;
  v.output_index = idx;
  values_.push_back(std::move(v));
  return static_cast<ValueId>(values_.size() - 1);
}

ValueId Graph::add_placeholder(const std::string& source, DType dtype, SymIntVec sizes, SymIntVec strides) {
  int32_t node = static_cast<int32_t>(nodes_.size());
  std::string name = unique_name(values_, sanitize(source, fmt::format("arg{}", inputs().size())));
  ValueId v = new_value(dtype, std::move(sizes), std::move(strides), node, 0, std::move(name));
  Node n;
  n.kind = NodeKind::Placeholder;
  n.outputs = {v};
  n.source = source;
  nodes_.push_back(std::move(n));
  return v;
}

ValueId Graph::add_constant(const Tensor& t, const std::string& name_hint) {
  int32_t node = static_cast<int32_t>(nodes_.size());
  std::string name;
  if (!name_hint.empty()) {
    name = unique_name(values_, sanitize(name_hint, "c"));
  } else {
    int k = 0;
    for (const auto& n : nodes_) k += n.kind == NodeKind::Constant;
    name = unique_name(values_, fmt::format("c{}", k));
  }
  SymIntVec sizes = t.defined() ? t.sizes() : SymIntVec{};
  SymIntVec strides = t.defined() ? t.strides() : SymIntVec{};
  ValueId v = new_value(t.defined() ? t.dtype() : DType::F32, std::move(sizes), std::move(strides), node, 0,
                        std::move(name));
  Node n;
  n.kind = NodeKind::Constant;
  n.outputs = {v};
  n.constant = t;
  nodes_.push_back(std::move(n));
  return v;
}

std::vector<ValueId> Graph::add_call(ops::OpKind op, std::vector<ValueId> inputs, ops::Attrs attrs,
                                     const std::vector<TensorMeta>& metas, core::SourceLocation loc,
                                     std::vector<std::shared_ptr<const Graph>> subgraphs) {
  for (const auto& sub : subgraphs)
    if (!sub) throw CompileError(fmt::format("Graph::add_call({}): a subgraph is null", ops::op_name(op)));
  for (ValueId in : inputs)
    if (in != kNoValue && (in < 0 || static_cast<size_t>(in) >= values_.size()))
      throw CompileError(fmt::format("Graph::add_call({}): input %{} is not a value of this graph",
                                     ops::op_name(op), in));
  const ops::OpInfo& info = ops::op_info(op);
  if (info.outputs >= 0 && static_cast<size_t>(info.outputs) != metas.size())
    throw CompileError(fmt::format("Graph::add_call({}): op has {} outputs, got {} output types", info.name,
                                   info.outputs, metas.size()));
  int32_t node = static_cast<int32_t>(nodes_.size());
  Node n;
  n.kind = NodeKind::Call;
  n.op = op;
  n.inputs = std::move(inputs);
  n.attrs = std::move(attrs);
  n.loc = std::move(loc);
  n.subgraphs = std::move(subgraphs);
  for (size_t i = 0; i < metas.size(); ++i)
    n.outputs.push_back(new_value(metas[i].dtype, metas[i].sizes, metas[i].strides, node,
                                  static_cast<int32_t>(i), std::to_string(next_call_name_++)));
  std::vector<ValueId> outs = n.outputs;
  nodes_.push_back(std::move(n));
  return outs;
}

void Graph::set_outputs(std::vector<ValueId> outs) {
  for (ValueId v : outs)
    if (v < 0 || static_cast<size_t>(v) >= values_.size())
      throw CompileError(fmt::format("Graph::set_outputs: %{} is not a value of this graph", v));
  if (!nodes_.empty() && nodes_.back().kind == NodeKind::Output) {
    nodes_.back().inputs = std::move(outs);
    return;
  }
  Node n;
  n.kind = NodeKind::Output;
  n.inputs = std::move(outs);
  nodes_.push_back(std::move(n));
}

std::vector<ValueId> Graph::inputs() const {
  std::vector<ValueId> r;
  for (const auto& n : nodes_)
    if (n.kind == NodeKind::Placeholder) r.push_back(n.outputs.at(0));
  return r;
}

std::vector<ValueId> Graph::outputs() const {
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it)
    if (it->kind == NodeKind::Output) return it->inputs;
  return {};
}

size_t Graph::num_calls() const {
  size_t k = 0;
  for (const auto& n : nodes_) k += n.kind == NodeKind::Call;
  return k;
}

void Graph::compact(const std::vector<bool>& keep_node) {
  if (keep_node.size() != nodes_.size())
    throw CompileError(fmt::format("Graph::compact: {} flags for {} nodes", keep_node.size(), nodes_.size()));
  std::vector<ValueId> remap(values_.size(), kNoValue);
  std::vector<Node> nodes;
  std::vector<Value> values;
  int32_t call_name = 0;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!keep_node[i]) continue;
    Node n = std::move(nodes_[i]);
    int32_t idx = static_cast<int32_t>(nodes.size());
    for (ValueId& in : n.inputs) {
      if (in == kNoValue) continue;
      ValueId m = remap.at(static_cast<size_t>(in));
      if (m == kNoValue)
        throw CompileError(fmt::format("Graph::compact: a kept node uses %{}, whose producer was removed",
                                       values_[static_cast<size_t>(in)].name));
      in = m;
    }
    for (ValueId& out : n.outputs) {
      Value v = std::move(values_.at(static_cast<size_t>(out)));
      v.node = idx;
      if (n.kind == NodeKind::Call) v.name = std::to_string(call_name++);
      values.push_back(std::move(v));
      remap[static_cast<size_t>(out)] = static_cast<ValueId>(values.size() - 1);
      out = static_cast<ValueId>(values.size() - 1);
    }
    nodes.push_back(std::move(n));
  }
  nodes_ = std::move(nodes);
  values_ = std::move(values);
  next_call_name_ = call_name;
}

void Graph::rename_value(ValueId v, std::string name) {
  Value& val = values_.at(static_cast<size_t>(v));
  if (is_number(name)) {
    if (nodes_.at(static_cast<size_t>(val.node)).kind != NodeKind::Call)
      throw CompileError(fmt::format("value name %{} is reserved for Call results", name));
    int64_t k = std::stoll(name);
    if (k >= next_call_name_) next_call_name_ = static_cast<int32_t>(k + 1);
  }
  val.name = std::move(name);
}

namespace {

void constants_of(const Graph& g, std::vector<const Node*>& out) {
  for (const Node& n : g.nodes()) {
    if (n.kind == NodeKind::Constant) out.push_back(&n);
    for (const auto& sub : n.subgraphs) constants_of(*sub, out);
  }
}

bool same_data(const Tensor& a, const Tensor& b) {
  if (a.impl() == b.impl()) return true;
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.dtype() != b.dtype() || a.int_sizes() != b.int_sizes()) return false;
  return a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace

bool equal_graphs(const Graph& a, const Graph& b) {
  if (&a == &b) return true;
  if (print(a) != print(b)) return false;
  std::vector<const Node*> ca, cb;
  constants_of(a, ca);
  constants_of(b, cb);
  if (ca.size() != cb.size()) return false;
  for (size_t i = 0; i < ca.size(); ++i)
    if (!same_data(ca[i]->constant, cb[i]->constant)) return false;
  return true;
}

void for_each_subgraph(const Graph& g, const std::function<void(const Graph&)>& fn) {
  for (const Node& n : g.nodes())
    for (const auto& sub : n.subgraphs) {
      fn(*sub);
      for_each_subgraph(*sub, fn);
    }
}

}  // namespace protean::ir
