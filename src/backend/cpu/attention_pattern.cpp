#include "backend/cpu/attention_pattern.h"

#include <optional>
#include <vector>

#include "ir/passes/dce.h"

namespace protean::backend::cpu {

using ir::kNoValue;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;
using ops::OpKind;

namespace {

class Matcher {
 public:
  explicit Matcher(ir::Graph& g) : g_(g) {
    uses_.assign(g.values().size(), 0);
    for (const Node& n : g.nodes())
      for (ValueId v : n.inputs)
        if (v != kNoValue) uses_[static_cast<size_t>(v)] += n.kind == NodeKind::Output ? 2 : 1;  // outputs never fold
  }

  int64_t run() {
    int64_t n = 0;
    for (size_t i = 0; i < g_.nodes().size(); ++i)
      if (try_rewrite(i)) ++n;
    if (n > 0) ir::dead_code_elimination(g_);
    return n;
  }

 private:
  /// The Call producing `v` when `v` has exactly one use (and is not a graph output).
  const Node* only_use_call(ValueId v) const {
    if (uses_[static_cast<size_t>(v)] != 1) return nullptr;
    const Node& p = g_.producer(v);
    return p.kind == NodeKind::Call ? &p : nullptr;
  }
  std::optional<double> scalar_constant(ValueId v) const {
    const Node& p = g_.producer(v);
    if (p.kind != NodeKind::Constant || !p.constant.defined()) return std::nullopt;
    if (!is_floating(p.constant.dtype()) || p.constant.int_numel() != 1) return std::nullopt;
    return p.constant.to_vector<double>()[0];
  }
  bool f32_rank(ValueId v, size_t rank) const {
    const ir::Value& x = g_.value(v);
    return x.dtype == DType::F32 && x.sizes.size() == rank;
  }

  bool try_rewrite(size_t i) {
    Node& n = g_.nodes()[i];
    if (n.kind != NodeKind::Call || n.op != OpKind::matmul || n.inputs.size() != 2) return false;
    const ValueId p = n.inputs[0], v = n.inputs[1];
    const size_t rank = g_.value(p).sizes.size();
    if (rank < 3 || !f32_rank(p, rank) || !f32_rank(v, rank) || !f32_rank(n.outputs[0], rank)) return false;
    const Node* sm = only_use_call(p);
    if (!sm || sm->op != OpKind::softmax || !sm->attrs.has("dim")) return false;
    int64_t dim = sm->attrs.i("dim");
    if (dim < 0) dim += static_cast<int64_t>(rank);
    if (dim != static_cast<int64_t>(rank) - 1) return false;
    ValueId x = sm->inputs[0];
    double scale = 1.0;
    const Node* mm = only_use_call(x);
    if (mm && (mm->op == OpKind::mul || mm->op == OpKind::div)) {
      std::optional<double> c = scalar_constant(mm->inputs[1]);
      ValueId other = mm->inputs[0];
      if (!c && mm->op == OpKind::mul) {
        c = scalar_constant(mm->inputs[0]);
        other = mm->inputs[1];
      }
      if (!c || (mm->op == OpKind::div && *c == 0)) return false;
      scale = mm->op == OpKind::mul ? *c : 1.0 / *c;
      mm = only_use_call(other);
    }
    if (!mm || mm->op != OpKind::matmul || !f32_rank(mm->outputs[0], rank)) return false;
    const ValueId q = mm->inputs[0], kt = mm->inputs[1];
    if (!f32_rank(q, rank) || !f32_rank(kt, rank)) return false;
    const Node& tp = g_.producer(kt);
    if (tp.kind != NodeKind::Call || tp.op != OpKind::permute) return false;
    const IntVec dims = tp.attrs.ints("dims");
    if (dims.size() != rank) return false;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t want = d + 2 < rank ? static_cast<int64_t>(d) : static_cast<int64_t>(d + 2 == rank ? rank - 1 : rank - 2);
      if ((dims[d] < 0 ? dims[d] + static_cast<int64_t>(rank) : dims[d]) != want) return false;
    }
    const ValueId k = tp.inputs[0];
    if (!f32_rank(k, rank)) return false;
    n.op = OpKind::scaled_dot_product_attention;
    n.inputs = {q, k, v, kNoValue};
    n.attrs = ops::Attrs{{"is_causal", false}, {"scale", scale}};
    return true;
  }

  ir::Graph& g_;
  std::vector<int> uses_;
};

}  // namespace

int64_t fuse_attention_patterns(ir::Graph& g) { return Matcher(g).run(); }

}  // namespace protean::backend::cpu
