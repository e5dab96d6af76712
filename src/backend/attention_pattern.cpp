#include "backend/attention_pattern.h"

#include <optional>
#include <vector>

#include "backend/causal_mask.h"
#include "ir/passes/dce.h"
#include "ir/sym_util.h"

namespace protean::backend {

using ir::kNoValue;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;
using ops::OpKind;

namespace {

class Matcher {
 public:
  Matcher(ir::Graph& g, const AttentionPatternOptions& o) : g_(g), o_(o), prover_(g) {
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
    const bool dtype_ok = x.dtype == DType::F32 || (o_.half_dtypes && (x.dtype == DType::BF16 || x.dtype == DType::F16));
    return dtype_ok && x.sizes.size() == rank && x.dtype == g_.value(dtype_of_).dtype;
  }
  /// `v` times a scalar constant (either side) when masks are on: the other operand, scale in `s`.
  ValueId strip_scale(ValueId v, double& s) const {
    if (!o_.masks) return v;
    const Node* m = only_use_call(v);
    if (!m || m->op != OpKind::mul || m->inputs.size() != 2) return v;
    for (int k = 0; k < 2; ++k)
      if (std::optional<double> c = scalar_constant(m->inputs[static_cast<size_t>(k)])) {
        s *= *c;
        return m->inputs[static_cast<size_t>(1 - k)];
      }
    return v;
  }
  /// K when `kt` is K with its last two dims swapped: permute(K), or (masks on) the exporter's
  /// reshape(permute(reshape(K, [-1, s, d]), [0, 2, 1]), [..., d, s]); else kNoValue.
  ValueId untranspose(ValueId kt, size_t rank) const {
    const Node& tp = g_.producer(kt);
    if (tp.kind != NodeKind::Call) return kNoValue;
    if (tp.op == OpKind::permute) {
      const IntVec dims = tp.attrs.ints("dims");
      if (dims.size() != rank) return kNoValue;
      for (size_t d = 0; d < rank; ++d) {
        const int64_t want = d + 2 < rank ? static_cast<int64_t>(d) : static_cast<int64_t>(d + 2 == rank ? rank - 1 : rank - 2);
        if ((dims[d] < 0 ? dims[d] + static_cast<int64_t>(rank) : dims[d]) != want) return kNoValue;
      }
      return tp.inputs[0];
    }
    if (!o_.masks || tp.op != OpKind::reshape) return kNoValue;
    const Node& p3 = g_.producer(tp.inputs[0]);
    if (p3.kind != NodeKind::Call || p3.op != OpKind::permute || p3.attrs.ints("dims") != IntVec{0, 2, 1}) return kNoValue;
    const Node& r3 = g_.producer(p3.inputs[0]);
    if (r3.kind != NodeKind::Call || r3.op != OpKind::reshape) return kNoValue;
    const ValueId k = r3.inputs[0];
    const auto& ks = g_.value(k).sizes;
    const auto& ts = g_.value(kt).sizes;
    if (ks.size() != rank || ts.size() != rank) return kNoValue;
    for (size_t d = 0; d + 2 < rank; ++d)
      if (!ir::same_symint(ks[d], ts[d])) return kNoValue;
    if (!ir::same_symint(ks[rank - 1], ts[rank - 2]) || !ir::same_symint(ks[rank - 2], ts[rank - 1])) return kNoValue;
    return k;
  }

  bool try_rewrite(size_t i) {
    Node& n = g_.nodes()[i];
    if (n.kind != NodeKind::Call || n.op != OpKind::matmul || n.inputs.size() != 2) return false;
    ValueId p = n.inputs[0];
    const ValueId v = n.inputs[1];
    dtype_of_ = n.outputs[0];
    const size_t rank = g_.value(p).sizes.size();
    if (rank < 3 || !f32_rank(p, rank) || !f32_rank(v, rank) || !f32_rank(n.outputs[0], rank)) return false;
    // masks: P' = where(ne(P, P), 0, P), P used by the ne (twice) and the where only
    bool nan_to_zero = false;
    if (o_.masks) {
      const Node* w = only_use_call(p);
      if (w && w->op == OpKind::where && w->inputs.size() == 3 && uses_[static_cast<size_t>(w->inputs[2])] == 3) {
        const Node& ne = g_.producer(w->inputs[0]);
        const std::optional<double> zero = scalar_constant(w->inputs[1]);
        if (ne.kind == NodeKind::Call && ne.op == OpKind::ne && ne.inputs.size() == 2 && ne.inputs[0] == w->inputs[2] &&
            ne.inputs[1] == w->inputs[2] && uses_[static_cast<size_t>(w->inputs[0])] == 1 && zero && *zero == 0.0) {
          p = w->inputs[2];
          nan_to_zero = true;
        }
      }
    }
    const Node* sm = nan_to_zero ? &g_.producer(p) : only_use_call(p);
    if (!sm || sm->kind != NodeKind::Call || sm->op != OpKind::softmax || !sm->attrs.has("dim")) return false;
    int64_t dim = sm->attrs.i("dim");
    if (dim < 0) dim += static_cast<int64_t>(rank);
    if (dim != static_cast<int64_t>(rank) - 1) return false;
    ValueId x = sm->inputs[0];
    ValueId mask = kNoValue;
    if (nan_to_zero) {  // softmax(X + M): M of the scores' rank and dtype
      const Node* add = only_use_call(x);
      if (!add || add->op != OpKind::add || add->inputs.size() != 2) return false;
      mask = add->inputs[1];
      x = add->inputs[0];
      if (!f32_rank(mask, rank)) return false;
    }
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
    const ValueId q = strip_scale(mm->inputs[0], scale), kt = strip_scale(mm->inputs[1], scale);
    if (!f32_rank(q, rank) || !f32_rank(kt, rank)) return false;
    const ValueId k = untranspose(kt, rank);
    if (k == kNoValue || !f32_rank(k, rank)) return false;
    // a mask proven causal from its own subgraph (backend/causal_mask.h) becomes is_causal: the
    // kernel then skips the masked key tiles and the mask's subgraph goes (when nothing else reads it)
    bool causal = false;
    if (mask != kNoValue && prover_.proven(mask)) {
      causal = true;
      mask = kNoValue;
      ++causal_masks_;
    }
    n.op = OpKind::scaled_dot_product_attention;
    n.inputs = {q, k, v, mask};
    n.attrs = ops::Attrs{{"is_causal", causal}, {"scale", scale}};
    return true;
  }

  ir::Graph& g_;
  AttentionPatternOptions o_;
  CausalMaskProver prover_;  ///< one for the graph: the layers' masks share their subgraph
  std::vector<int> uses_;
 public:
  int64_t causal_masks_ = 0;  ///< masks proven causal
 private:
  ValueId dtype_of_ = 0;  ///< the candidate's output: every value of the pattern has its dtype
};

}  // namespace

int64_t fuse_attention_patterns(ir::Graph& g, const AttentionPatternOptions& o, int64_t* causal_masks) {
  Matcher m(g, o);
  const int64_t n = m.run();
  if (causal_masks) *causal_masks = m.causal_masks_;
  return n;
}

}  // namespace protean::backend
