#include "backend/cpu/conv_layout.h"

#include <algorithm>
#include <vector>

#include "ir/sym_util.h"

namespace protean::backend::cpu {

namespace {
bool is_conv2d(const ir::Node& n) {
  return n.kind == ir::NodeKind::Call && (n.op == ops::OpKind::conv2d || n.op == ops::OpKind::conv2d_fused);
}

/// A conv whose output may be stored channels-last: one output, no post-op operands (they are shaped
/// for NCHW), not yet re-laid-out.
bool may_write_nhwc(const ir::Node& n) {
  return is_conv2d(n) && n.outputs.size() == 1 && n.inputs.size() <= 3 && !n.attrs.has("dst_layout");
}

bool is_global_pool(const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call || n.op != ops::OpKind::adaptive_avg_pool2d || n.attrs.has("src_layout") ||
      !n.attrs.has("output_size"))
    return false;
  IntVec os = n.attrs.ints("output_size");
  return std::all_of(os.begin(), os.end(), [](int64_t v) { return v == 1; }) && !os.empty() && os.size() <= 2;
}

void to_nhwc(ir::Value& v) {
  std::rotate(v.sizes.begin() + 1, v.sizes.begin() + 2, v.sizes.end());  // [N, C, H, W] → [N, H, W, C]
  v.strides = ir::contiguous_strides_of(v.sizes);
}

struct Use {
  int node, slot;
};

/// An op of a channels-last region (see the header): add / mul of two tensors, nearest upsampling or
/// average pooling not yet re-laid-out, cat along the channels.
bool is_region_op(const ir::Node& n) {
  if (n.kind != ir::NodeKind::Call || n.outputs.size() != 1) return false;
  if (n.op == ops::OpKind::add || n.op == ops::OpKind::mul) return n.inputs.size() == 2 && n.attrs.empty();
  if (n.op == ops::OpKind::upsample_nearest2d || n.op == ops::OpKind::avg_pool2d)
    return n.inputs.size() == 1 && !n.attrs.has("layout");
  if (n.op == ops::OpKind::cat)
    return !n.inputs.empty() && n.attrs.has("dim") && (n.attrs.i("dim") == 1 || n.attrs.i("dim") == -3);
  return false;
}
}  // namespace

ConvLayoutStats propagate_conv_layouts(ir::Graph& g) {
  ConvLayoutStats st;
  auto& nodes = g.nodes();
  // Uses of every value: count, and the one (node, input slot) when there is exactly one.
  std::vector<int> uses(g.values().size(), 0), user(g.values().size(), -1), slot(g.values().size(), -1);
  std::vector<std::vector<Use>> users(g.values().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t k = 0; k < nodes[i].inputs.size(); ++k) {
      ir::ValueId v = nodes[i].inputs[k];
      if (v == ir::kNoValue) continue;
      auto u = static_cast<size_t>(v);
      ++uses[u];
      user[u] = static_cast<int>(i);
      slot[u] = static_cast<int>(k);
      users[u].push_back({static_cast<int>(i), static_cast<int>(k)});
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
    to_nhwc(val);
    ++st.nhwc_values;
  }
  // Squeeze-and-excitation blocks: v = conv(...) read by a global average pooling and by a multiply
  // with a per-channel scale s = conv(...)[N, C, 1, 1] whose product feeds a conv. v, s and the product
  // go channels-last (s as [N, 1, 1, C], the same memory), the pooling reads v channels-last.
  for (ir::Node& p : nodes) {
    if (!may_write_nhwc(p)) continue;
    const auto u = static_cast<size_t>(p.outputs[0]);
    ir::Value& val = g.values()[u];
    if (val.dtype != DType::F32 || val.sizes.size() != 4 || users[u].size() != 2) continue;
    const Use* pool = nullptr;
    const Use* mul = nullptr;
    for (const Use& us : users[u]) {
      const ir::Node& n = nodes[static_cast<size_t>(us.node)];
      if (us.slot == 0 && is_global_pool(n)) pool = &us;
      else if (n.kind == ir::NodeKind::Call && n.op == ops::OpKind::mul && n.inputs.size() == 2) mul = &us;
    }
    if (!pool || !mul) continue;
    ir::Node& m = nodes[static_cast<size_t>(mul->node)];
    const ir::ValueId sv = m.inputs[static_cast<size_t>(1 - mul->slot)];
    if (sv == ir::kNoValue || sv == p.outputs[0]) continue;
    ir::Value& scale = g.values()[static_cast<size_t>(sv)];
    ir::Node& q = nodes[static_cast<size_t>(scale.node)];
    const bool per_channel = scale.dtype == DType::F32 && scale.sizes.size() == 4 &&
                             ir::same_symint(scale.sizes[0], val.sizes[0]) && ir::same_symint(scale.sizes[1], val.sizes[1]) &&
                             ir::same_symint(scale.sizes[2], SymInt(1)) && ir::same_symint(scale.sizes[3], SymInt(1));
    if (!per_channel || !may_write_nhwc(q) || uses[static_cast<size_t>(sv)] != 1) continue;
    if (m.outputs.size() != 1) continue;
    const auto wu = static_cast<size_t>(m.outputs[0]);
    ir::Value& prod = g.values()[wu];
    if (prod.dtype != DType::F32 || !ir::same_symints(prod.sizes, val.sizes) || uses[wu] != 1 || slot[wu] != 0) continue;
    ir::Node& c = nodes[static_cast<size_t>(user[wu])];  // an Output node is no conv: graph outputs stay
    if (!is_conv2d(c) || c.attrs.has("src_layout")) continue;
    p.attrs.set("dst_layout", std::string("nhwc"));
    to_nhwc(val);
    nodes[static_cast<size_t>(pool->node)].attrs.set("src_layout", std::string("nhwc"));
    q.attrs.set("dst_layout", std::string("nhwc"));
    to_nhwc(scale);
    to_nhwc(prod);
    c.attrs.set("src_layout", std::string("nhwc"));
    st.nhwc_values += 3;
    ++st.se_blocks;
  }
  // Channels-last regions: f32 4-D values made by convs (that may write NHWC) and by region ops whose
  // tensor inputs are all in the region, every use of which reads NHWC: input 0 of a conv that has no
  // src_layout yet, a global average pooling, or a region op whose output is in the region. Start
  // from every candidate and drop the values that break a rule until none does.
  const size_t nv = g.values().size();
  std::vector<char> in(nv, 0);
  for (const ir::Node& n : nodes) {
    if (!may_write_nhwc(n) && !is_region_op(n)) continue;
    const ir::Value& v = g.values()[static_cast<size_t>(n.outputs[0])];
    if (v.dtype == DType::F32 && v.sizes.size() == 4) in[static_cast<size_t>(n.outputs[0])] = 1;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t u = 0; u < nv; ++u) {
      if (!in[u]) continue;
      bool ok = true;
      const ir::Node& p = nodes[static_cast<size_t>(g.values()[u].node)];
      if (is_region_op(p))
        for (ir::ValueId x : p.inputs) ok = ok && x != ir::kNoValue && in[static_cast<size_t>(x)];
      for (const Use& us : users[u]) {
        if (!ok) break;
        const ir::Node& n = nodes[static_cast<size_t>(us.node)];
        if (is_conv2d(n)) ok = us.slot == 0 && !n.attrs.has("src_layout");
        else if (is_global_pool(n)) ok = us.slot == 0;
        else ok = is_region_op(n) && in[static_cast<size_t>(n.outputs[0])];  // an Output node is none
      }
      if (!ok) {
        in[u] = 0;
        changed = true;
      }
    }
  }
  for (size_t u = 0; u < nv; ++u) {
    if (!in[u]) continue;
    ir::Node& p = nodes[static_cast<size_t>(g.values()[u].node)];
    if (is_conv2d(p)) p.attrs.set("dst_layout", std::string("nhwc"));
    else if (p.op == ops::OpKind::upsample_nearest2d || p.op == ops::OpKind::avg_pool2d)
      p.attrs.set("layout", std::string("nhwc"));
    else if (p.op == ops::OpKind::cat) p.attrs.set("dim", SymInt(3));
    for (const Use& us : users[u]) {
      ir::Node& n = nodes[static_cast<size_t>(us.node)];
      if (is_conv2d(n) || is_global_pool(n)) n.attrs.set("src_layout", std::string("nhwc"));
    }
    to_nhwc(g.values()[u]);
    ++st.nhwc_values;
    ++st.region_values;
  }
  return st;
}

}  // namespace protean::backend::cpu
