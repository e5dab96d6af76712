#include "backend/cpu/gemm_weights.h"

#include <string>

namespace protean::backend::cpu {

namespace {
bool is_gemm(const ir::Node& n) {
  using ops::OpKind;
  return n.kind == ir::NodeKind::Call && (n.op == OpKind::linear || n.op == OpKind::linear_fused ||
                                          n.op == OpKind::matmul || n.op == OpKind::matmul_fused);
}
}  // namespace

GemmWeightStats mark_gemm_weights(ir::Graph& g) {
  GemmWeightStats st;
  for (ir::Node& n : g.nodes()) {
    if (!is_gemm(n) || n.inputs.size() < 2 || n.inputs[1] == ir::kNoValue || n.attrs.has("weights")) continue;
    const ir::Value& w = g.values()[static_cast<size_t>(n.inputs[1])];
    if (w.dtype != DType::F32 || w.sizes.size() != 2) continue;
    const ir::NodeKind k = g.producer(n.inputs[1]).kind;
    if (k == ir::NodeKind::Constant) {
      n.attrs.set("weights", std::string("constant"));
      ++st.constant_weights;
    } else if (k == ir::NodeKind::Placeholder) {
      n.attrs.set("weights", std::string("reuse"));
      ++st.reused_weights;
    }
  }
  return st;
}

}  // namespace protean::backend::cpu
