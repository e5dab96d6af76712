#include "backend/cpu/conv_layout.h"

#include <algorithm>
#include <vector>

#include "ir/sym_util.h"

namespace protean::backend::cpu {

namespace {
bool is_conv2d(const ir::Node& n) {
  return n.kind == ir::NodeKind::Call && (n.op == ops::OpKind::conv2d || n.op == ops::OpKind::conv2d_fused);
}
}  // namespace

ConvLayoutStats propagate_conv_layouts(ir::Graph& g) {
  ConvLayoutStats st;
  auto& nodes = g.nodes();
  // Uses of every value: count, and the one (node, input slot) when there is exactly one.
  std::vector<int> uses(g.values().size(), 0), user(g.values().size(), -1), slot(g.values().size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t k = 0; k < nodes[i].inputs.size(); ++k) {
      ir::ValueId v = nodes[i].inputs[k];
      if (v == ir::kNoValue) continue;
      auto u = static_cast<size_t>(v);
      ++uses[u];
      user[u] = static_cast<int>(i);
      slot[u] = static_cast<int>(k);
    }
  for (ir::Node& p : nodes) {
    if (is_conv2d(p) && p.inputs.size() > 1 && p.inputs[1] != ir::kNoValue && !p.attrs.has("weights")) {
      const ir::NodeKind k = g.producer(p.inputs[1]).kind;
      if (k == ir::NodeKind::Constant) {
        p.attrs.set("weights", std::string("constant"));
        ++st.constant_weights;
      } else if (k == ir::NodeKind::Placeholder) {
        p.attrs.set("weights", std::string("reuse"));
        ++st.reused_weights;
      }
    }
    if (!is_conv2d(p) || p.outputs.size() != 1 || p.inputs.size() > 3 || p.attrs.has("dst_layout")) continue;
    ir::ValueId v = p.outputs[0];
    auto u = static_cast<size_t>(v);
    ir::Value& val = g.values()[u];
    if (val.dtype != DType::F32 || val.sizes.size() != 4 || uses[u] != 1 || slot[u] != 0) continue;
    ir::Node& c = nodes[static_cast<size_t>(user[u])];  // an Output node is no conv: graph outputs stay
    if (!is_conv2d(c) || c.attrs.has("src_layout")) continue;
    p.attrs.set("dst_layout", std::string("nhwc"));
    c.attrs.set("src_layout", std::string("nhwc"));
    std::rotate(val.sizes.begin() + 1, val.sizes.begin() + 2, val.sizes.end());  // [N, C, H, W] → [N, H, W, C]
    val.strides = ir::contiguous_strides_of(val.sizes);
    ++st.nhwc_values;
  }
  return st;
}

}  // namespace protean::backend::cpu
