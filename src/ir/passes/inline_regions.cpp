#include "ir/passes/inline_regions.h"

#include <fmt/format.h>

#include "ir/sym_util.h"
#include "protean/error.h"

namespace protean::ir {

namespace {

TensorMeta meta_of(const Value& v) {
  TensorMeta m;
  m.dtype = v.dtype;
  m.sizes = v.sizes;
  m.strides = v.strides;  // as recorded (no SymInt arithmetic: backends run outside capture)
  return m;
}

/// Copies `src`'s nodes into `dst`: placeholders map to `args` (in order), the Output node's values
/// are returned (mapped). call_region nodes are expanded in place; cond branches are inlined in turn.
std::vector<ValueId> copy_into(Graph& dst, const Graph& src, const std::vector<ValueId>* args) {
  std::vector<ValueId> map(src.values().size(), kNoValue);
  auto mapped = [&](ValueId v) {
    if (v == kNoValue) return kNoValue;
    ValueId m = map.at(static_cast<size_t>(v));
    if (m == kNoValue) throw CompileError(fmt::format("inline_regions: value %{} of graph '{}' is used before it is defined",
                                                      src.value(v).name, src.name));
    return m;
  };
  size_t next_arg = 0;
  std::vector<ValueId> outs;
  for (const Node& n : src.nodes()) {
    switch (n.kind) {
      case NodeKind::Placeholder: {
        const Value& v = src.value(n.outputs.at(0));
        if (!args) {
          map[static_cast<size_t>(n.outputs[0])] = dst.add_placeholder(n.source, v.dtype, v.sizes, v.strides);
        } else {
          if (next_arg >= args->size())
            throw CompileError(fmt::format("inline_regions: the body '{}' has more inputs than its call passes ({})",
                                           src.name, args->size()));
          ValueId a = (*args)[next_arg++];
          const Value& av = dst.value(a);
          if (av.dtype != v.dtype || !same_symints(av.sizes, v.sizes))
            throw CompileError(fmt::format("inline_regions: input {} of body '{}' is {}{}, its call passes {}{}",
                                           next_arg - 1, src.name, short_name(v.dtype), to_string(v.sizes),
                                           short_name(av.dtype), to_string(av.sizes)));
          map[static_cast<size_t>(n.outputs[0])] = a;
        }
        break;
      }
      case NodeKind::Constant: {
        const Value& v = src.value(n.outputs.at(0));
        ValueId c = dst.add_constant(n.constant, v.name);
        Value& cv = dst.values()[static_cast<size_t>(c)];
        cv.dtype = v.dtype;  // a constant without data (a parsed graph) keeps its declared type
        cv.sizes = v.sizes;
        cv.strides = v.strides;
        map[static_cast<size_t>(n.outputs[0])] = c;
        break;
      }
      case NodeKind::Call: {
        std::vector<ValueId> ins;
        for (ValueId v : n.inputs) ins.push_back(mapped(v));
        if (n.op == ops::OpKind::call_region) {
          if (n.subgraphs.size() != 1)
            throw CompileError(fmt::format("inline_regions: a call_region in '{}' has {} subgraphs, expected its body",
                                           src.name, n.subgraphs.size()));
          std::vector<ValueId> res = copy_into(dst, *n.subgraphs[0], &ins);
          if (res.size() != n.outputs.size())
            throw CompileError(fmt::format("inline_regions: body '{}' returns {} values, its call in '{}' has {} outputs",
                                           n.subgraphs[0]->name, res.size(), src.name, n.outputs.size()));
          for (size_t i = 0; i < res.size(); ++i) map[static_cast<size_t>(n.outputs[i])] = res[i];
          break;
        }
        std::vector<std::shared_ptr<const Graph>> subs;
        for (const auto& sub : n.subgraphs)
          subs.push_back(has_regions(*sub) ? std::make_shared<const Graph>(inline_regions(*sub)) : sub);
        std::vector<TensorMeta> metas;
        for (ValueId v : n.outputs) metas.push_back(meta_of(src.value(v)));
        std::vector<ValueId> res = dst.add_call(n.op, std::move(ins), n.attrs, metas, n.loc, std::move(subs));
        for (size_t i = 0; i < res.size(); ++i) map[static_cast<size_t>(n.outputs[i])] = res[i];
        break;
      }
      case NodeKind::Output:
        for (ValueId v : n.inputs) outs.push_back(mapped(v));
        break;
    }
  }
  if (args && next_arg != args->size())
    throw CompileError(fmt::format("inline_regions: the body '{}' takes {} inputs, its call passes {}", src.name,
                                   next_arg, args->size()));
  return outs;
}

}  // namespace

bool has_regions(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.kind != NodeKind::Call) continue;
    if (n.op == ops::OpKind::call_region) return true;
    for (const auto& sub : n.subgraphs)
      if (has_regions(*sub)) return true;
  }
  return false;
}

Graph inline_regions(const Graph& g) {
  if (!has_regions(g)) return g;
  Graph out;
  out.name = g.name;
  out.set_outputs(copy_into(out, g, nullptr));
  return out;
}

}  // namespace protean::ir
