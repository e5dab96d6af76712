#include "backend/cpu/fuse_post_ops.h"

#include <fmt/format.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_set>

#include "ir/passes/dce.h"
#include "ir/sym_util.h"
#include "ops/post_ops.h"

namespace protean::backend::cpu {

using ir::Graph;
using ir::kNoValue;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;
using ops::OpKind;
using ops::PostOp;
using ops::PostOpKind;

namespace {

/// A post-op operand: an existing value of the graph, or a new constant the pass creates.
struct Operand {
  ValueId value = kNoValue;
  Tensor data;
};

/// One link of a chain.
struct Link {
  std::vector<PostOp> ops;               // operand fields index `operands` (0, 1, ...) until emitted
  std::vector<Operand> operands;
  std::vector<int> nodes;                // the Calls it replaces
  ValueId result = kNoValue;
  bool full_operand = false;             // a binary op on a tensor of the output's shape
  // Per-channel affine form x·scale + shift when every operand is a constant (size 1 = all channels).
  bool affine = false;
  std::vector<double> scale, shift;
};

bool is_one(const SymInt& s) { return !s.is_symbolic() && s.hint() == 1; }

/// Memory for the folded weights one run of the pass creates. The first 256 KiB come from the ordinary
/// allocator (a small model then holds no block at all); after that, weights come from 4 MiB blocks,
/// 2 MiB aligned and marked MADV_HUGEPAGE, handed out 64-byte aligned by bumping an offset, and every
/// tensor keeps its block alive. Allocated one by one, PP-OCRv4 rec's ~10 MB of folded weights came
/// from fresh 4 KiB pages faulted in one at a time (on a VM a fault costs several microseconds): ~9 ms
/// of a 37 ms warm compile. A weight that does not fit in the rest of the current block starts a new
/// one (the rest stays unused), and one larger than half a block gets its own storage (tensor.cpp
/// gives those huge pages already).
class FoldArena {
 public:
  Tensor empty_f32(const IntVec& sizes) {
    int64_t numel = 1;
    for (int64_t s : sizes) numel *= s;
    const size_t n = (static_cast<size_t>(numel) * sizeof(float) + 63) / 64 * 64;
    if (n == 0 || n > kBlock / 2 || small_bytes_ + n <= kPlainFirst) {
      small_bytes_ += n;
      return empty(sizes, DType::F32);
    }
    if (!block_ || used_ + n > kBlock) {
      void* p = std::aligned_alloc(kHugePage, kBlock);
      if (!p) return empty(sizes, DType::F32);
      (void)madvise(p, kBlock, MADV_HUGEPAGE);  // advisory: ignored where THP is off
      block_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
      used_ = 0;
    }
    void* at = static_cast<char*>(block_.get()) + used_;
    used_ += n;
    return from_blob(at, sizes, DType::F32, {}, [keep = block_](void*) {});
  }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20, kBlock = size_t{4} << 20, kPlainFirst = size_t{256} << 10;
  std::shared_ptr<void> block_;
  size_t used_ = 0;
  size_t small_bytes_ = 0;  // bytes handed out by the ordinary allocator so far
};

class Fuser {
 public:
  explicit Fuser(Graph& g) : g_(g), nodes_(g.nodes()) {
    uses_.resize(g.values().size());
    is_output_.assign(g.values().size(), false);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const Node& n = nodes_[i];
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue) continue;
        if (n.kind == NodeKind::Output) is_output_[static_cast<size_t>(v)] = true;
        else uses_[static_cast<size_t>(v)].push_back({static_cast<int>(i), static_cast<int>(k)});
      }
    }
    consumed_.assign(nodes_.size(), false);
    insert_before_.resize(nodes_.size());
    for (const ir::Value& v : g.values()) names_.insert(v.name);
  }

  FusePostOpsStats run() {
    for (size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].kind == NodeKind::Call && !consumed_[i]) try_base(static_cast<int>(i));
    if (stats_.fused_calls == 0 && stats_.folded_links == 0) return stats_;
    rebuild();
    ir::dead_code_elimination(g_);
    return stats_;
  }

 private:
  struct Use {
    int node, pos;
  };

  const ir::Value& val(ValueId v) const { return g_.value(v); }
  const std::vector<Use>& uses(ValueId v) const { return uses_[static_cast<size_t>(v)]; }
  bool free_value(ValueId v) const { return !is_output_[static_cast<size_t>(v)]; }

  /// The Call using `v` as its only use, or nullptr.
  const Node* single_user(ValueId v, int* index = nullptr) const {
    const auto& u = uses(v);
    if (u.size() != 1 || !free_value(v)) return nullptr;
    const Node& n = nodes_[static_cast<size_t>(u[0].node)];
    if (n.kind != NodeKind::Call || consumed_[static_cast<size_t>(u[0].node)]) return nullptr;
    if (index) *index = u[0].node;
    return &n;
  }

  /// The data of a Constant value, or an undefined tensor.
  Tensor constant_data(ValueId v) const {
    if (v == kNoValue) return Tensor();
    const Node& p = g_.producer(v);
    return p.kind == NodeKind::Constant && p.constant.defined() ? p.constant : Tensor();
  }
  /// The single element of a floating Constant with one element.
  std::optional<double> scalar_constant(ValueId v) const {
    Tensor t = constant_data(v);
    if (!t.defined() || !is_floating(t.dtype()) || t.int_numel() != 1) return std::nullopt;
    return t.to_vector<double>()[0];
  }

  /// `n` keeps v's type: one f32 output of v's sizes.
  bool same_type(const Node& n, ValueId v) const {
    if (n.outputs.size() != 1) return false;
    const ir::Value& o = val(n.outputs[0]);
    return o.dtype == DType::F32 && ir::same_symints(o.sizes, val(v).sizes);
  }

  enum class Shape { Scalar, Channel, Full, Other };
  /// How operand `t` broadcasts against the output value `v` (channel dim `cdim` of v).
  Shape classify(ValueId t, ValueId v, int cdim) const {
    const SymIntVec& ts = val(t).sizes;
    const SymIntVec& vs = val(v).sizes;
    if (ts.size() > vs.size()) return Shape::Other;
    size_t off = vs.size() - ts.size();
    bool all_one = true, channel = true;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (is_one(ts[i])) continue;
      all_one = false;
      if (static_cast<int>(i + off) != cdim || !ir::same_symint(ts[i], vs[i + off])) channel = false;
    }
    if (all_one) return Shape::Scalar;
    if (channel && cdim >= 0) return Shape::Channel;
    if (ts.size() == vs.size() && ir::same_symints(ts, vs)) return Shape::Full;
    return Shape::Other;
  }

  /// Constant operand values along the channel dim (size 1 for a scalar), or nothing.
  std::optional<std::vector<double>> channel_values(ValueId t, Shape s) const {
    if (s != Shape::Scalar && s != Shape::Channel) return std::nullopt;
    Tensor d = constant_data(t);
    if (!d.defined() || d.dtype() != DType::F32) return std::nullopt;
    return d.contiguous().to_vector<double>();
  }

  // ---- link matchers: each returns true and fills `l` when the node(s) after `v` form a link ----------
  bool match_unary(const Node& u, ValueId v, Link& l) const {
    if (u.inputs.size() != 1 || u.inputs[0] != v) return false;
    // The ops a post-op list can hold, each by its own test (an op not named here is no post-op; no
    // switch with `default:` over OpKind, so this list is the whole rule).
    PostOp p;
    const OpKind op = u.op;
    if (op == OpKind::relu) p.kind = PostOpKind::relu;
    else if (op == OpKind::sigmoid) p.kind = PostOpKind::sigmoid;
    else if (op == OpKind::tanh) p.kind = PostOpKind::tanh;
    else if (op == OpKind::silu) p = {PostOpKind::swish, 1.0};
    else if (op == OpKind::hardswish) p.kind = PostOpKind::hardswish;
    else if (op == OpKind::hardsigmoid) p.kind = PostOpKind::hardsigmoid;
    else if (op == OpKind::gelu) {
      const std::string& a = u.attrs.s("approximate");
      if (a != "none" && a != "tanh") return false;
      p.kind = a == "none" ? PostOpKind::gelu_erf : PostOpKind::gelu_tanh;
    } else if (op == OpKind::clamp) {
      p.kind = PostOpKind::clamp;
      p.alpha = u.attrs.opt_f("min").value_or(-std::numeric_limits<double>::infinity());
      p.beta = u.attrs.opt_f("max").value_or(std::numeric_limits<double>::infinity());
      if (!(p.alpha <= p.beta)) return false;
    } else {
      return false;
    }
    l.ops = {p};
    return true;
  }

  bool match_binary(const Node& u, ValueId v, int cdim, Link& l) const {
    PostOpKind kind;
    if (u.op == OpKind::add) kind = PostOpKind::add;
    else if (u.op == OpKind::sub) kind = PostOpKind::sub;
    else if (u.op == OpKind::mul) kind = PostOpKind::mul;
    else if (u.op == OpKind::div) kind = PostOpKind::div;
    else return false;
    if (u.inputs.size() != 2) return false;
    int pos = u.inputs[0] == v ? 0 : u.inputs[1] == v ? 1 : -1;
    if (pos < 0 || u.inputs[0] == u.inputs[1]) return false;
    if (pos == 1 && (kind == PostOpKind::sub || kind == PostOpKind::div)) return false;  // t − v, t / v
    ValueId t = u.inputs[static_cast<size_t>(1 - pos)];
    if (val(t).dtype != DType::F32) return false;
    Shape s = classify(t, v, cdim);
    if (s == Shape::Other) return false;
    if (auto c = scalar_constant(t); c && kind != PostOpKind::div) {
      double a = kind == PostOpKind::mul ? *c : 1.0;
      double b = kind == PostOpKind::add ? *c : kind == PostOpKind::sub ? -*c : 0.0;
      l.ops = {PostOp{PostOpKind::linear, a, b}};
    } else {
      PostOp p;
      p.kind = kind;
      p.operand[0] = 0;
      l.ops = {p};
      l.operands = {Operand{t, Tensor()}};
      l.full_operand = s == Shape::Full;
    }
    if (auto cv = channel_values(t, s)) {
      l.affine = true;
      for (double x : *cv) {
        switch (kind) {
          case PostOpKind::add: l.scale.push_back(1); l.shift.push_back(x); break;
          case PostOpKind::sub: l.scale.push_back(1); l.shift.push_back(-x); break;
          case PostOpKind::mul: l.scale.push_back(x); l.shift.push_back(0); break;
          case PostOpKind::div: l.scale.push_back(1.0 / x); l.shift.push_back(0); break;
          // not binary: `kind` is one of the four above
          case PostOpKind::relu: case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish:
          case PostOpKind::hardswish: case PostOpKind::hardsigmoid: case PostOpKind::gelu_erf:
          case PostOpKind::gelu_tanh: case PostOpKind::clamp: case PostOpKind::linear: case PostOpKind::batch_norm:
            return false;
        }
      }
    }
    return true;
  }

  bool match_batch_norm(const Node& u, ValueId v, int cdim, Link& l) const {
    if (u.op != OpKind::batch_norm || u.inputs.size() != 5 || u.inputs[0] != v || cdim != 1) return false;
    for (size_t k = 1; k < 5; ++k) {
      ValueId p = u.inputs[k];
      if (p == kNoValue) {
        if (k >= 3) return false;
        continue;
      }
      if (val(p).dtype != DType::F32 || val(p).sizes.size() != 1) return false;
    }
    double eps = u.attrs.f("eps");
    Tensor w = constant_data(u.inputs[1]), b = constant_data(u.inputs[2]), m = constant_data(u.inputs[3]),
           var = constant_data(u.inputs[4]);
    bool constants = (u.inputs[1] == kNoValue || w.defined()) && (u.inputs[2] == kNoValue || b.defined()) &&
                     m.defined() && var.defined();
    if (constants) {
      PostOp bn{PostOpKind::batch_norm, eps};
      bn.operand = {-1, -1, 0, 1};
      std::vector<Tensor> in{m, var};
      if (w.defined()) {
        bn.operand[0] = static_cast<int>(in.size());
        in.push_back(w);
      }
      if (b.defined()) {
        bn.operand[1] = static_cast<int>(in.size());
        in.push_back(b);
      }
      auto [scale, shift] = ops::batch_norm_scale_shift(bn, in);
      l.affine = true;
      l.scale = scale.to_vector<double>();
      l.shift = shift.to_vector<double>();
      size_t rank = val(v).sizes.size();
      IntVec shape{static_cast<int64_t>(l.scale.size())};
      for (size_t i = 2; i < rank; ++i) shape.push_back(1);
      auto as_f32 = [&](const std::vector<double>& x) {
        std::vector<float> f(x.begin(), x.end());
        return tensor<float>(f, shape);
      };
      PostOp mul{PostOpKind::mul}, add{PostOpKind::add};
      mul.operand[0] = 0;
      add.operand[0] = 1;
      l.ops = {mul, add};
      l.operands = {Operand{kNoValue, as_f32(l.scale)}, Operand{kNoValue, as_f32(l.shift)}};
      return true;
    }
    PostOp bn{PostOpKind::batch_norm, eps};
    for (size_t k = 1; k < 5; ++k) {
      if (u.inputs[k] == kNoValue) continue;
      bn.operand[k - 1] = static_cast<int>(l.operands.size());
      l.operands.push_back(Operand{u.inputs[k], Tensor()});
    }
    l.ops = {bn};
    return true;
  }

  /// v·sigmoid(c·v), v·sigmoid(v), v·clamp(v + 3, 0, 6) / 6, v·hardsigmoid(v): v has exactly these
  /// two users.
  bool match_two_use(ValueId v, Link& l) const {
    const auto& u = uses(v);
    if (u.size() != 2 || !free_value(v)) return false;
    for (const Use& x : u)
      if (nodes_[static_cast<size_t>(x.node)].kind != NodeKind::Call || consumed_[static_cast<size_t>(x.node)])
        return false;
    for (int first = 0; first < 2; ++first) {
      int ia = u[static_cast<size_t>(first)].node, ib = u[static_cast<size_t>(1 - first)].node;
      const Node& a = nodes_[static_cast<size_t>(ia)];
      const Node& b = nodes_[static_cast<size_t>(ib)];
      // b = mul(v, g) with g the end of a one-use chain starting at a.
      if (b.op != OpKind::mul || b.inputs.size() != 2 || !same_type(b, v) || !same_type(a, v)) continue;
      ValueId g = b.inputs[0] == v ? b.inputs[1] : b.inputs[1] == v ? b.inputs[0] : kNoValue;
      if (g == kNoValue || g == v) continue;
      std::vector<int> chain{ia};
      ValueId cur = a.outputs[0];
      auto step = [&](OpKind op) -> const Node* {  // the next one-use node if it is `op` on cur
        int idx = -1;
        const Node* n = single_user(cur, &idx);
        if (!n || n->op != op || !same_type(*n, v) || n->inputs[0] != cur) return nullptr;
        chain.push_back(idx);
        cur = n->outputs[0];
        return n;
      };
      std::optional<PostOp> p;
      if (a.op == OpKind::sigmoid && a.inputs[0] == v) {
        p = PostOp{PostOpKind::swish, 1.0};
      } else if (a.op == OpKind::hardsigmoid && a.inputs[0] == v) {
        p = PostOp{PostOpKind::hardswish};
      } else if (a.op == OpKind::mul && a.inputs.size() == 2) {  // mul(v, c) → sigmoid
        ValueId c = a.inputs[0] == v ? a.inputs[1] : a.inputs[1] == v ? a.inputs[0] : kNoValue;
        auto cv = c == kNoValue ? std::nullopt : scalar_constant(c);
        if (cv && step(OpKind::sigmoid)) p = PostOp{PostOpKind::swish, *cv};
      } else if (a.op == OpKind::add && a.inputs.size() == 2) {  // add(v, 3) → clamp(0, 6)
        ValueId c = a.inputs[0] == v ? a.inputs[1] : a.inputs[1] == v ? a.inputs[0] : kNoValue;
        auto cv = c == kNoValue ? std::nullopt : scalar_constant(c);
        const Node* cl = cv && *cv == 3.0 ? step(OpKind::clamp) : nullptr;
        if (cl && cl->attrs.opt_f("min") == 0.0 && cl->attrs.opt_f("max") == 6.0) p = PostOp{PostOpKind::hardswish};
      }
      if (!p || cur != g) continue;
      chain.push_back(ib);
      ValueId out = b.outputs[0];
      if (p->kind == PostOpKind::hardswish && a.op == OpKind::add) {
        // v·clamp(v + 3, 0, 6) still needs the division by 6 (or a product with 1/6).
        int idx = -1;
        const Node* d = single_user(out, &idx);
        if (!d || !same_type(*d, v) || d->inputs.size() != 2 || d->inputs[0] != out) continue;
        auto c = scalar_constant(d->inputs[1]);
        bool ok = c && ((d->op == OpKind::div && *c == 6.0) ||
                        (d->op == OpKind::mul && static_cast<float>(*c) == static_cast<float>(1.0 / 6.0)));
        if (!ok) continue;
        chain.push_back(idx);
        out = d->outputs[0];
      }
      l.ops = {*p};
      l.nodes = chain;
      l.result = out;
      return true;
    }
    return false;
  }

  /// The next link after `v`, or false.
  bool next_link(ValueId v, int cdim, Link& l) const {
    int idx = -1;
    if (const Node* u = single_user(v, &idx); u && same_type(*u, v)) {
      if (match_unary(*u, v, l) || match_binary(*u, v, cdim, l) || match_batch_norm(*u, v, cdim, l)) {
        l.nodes = {idx};
        l.result = u->outputs[0];
        return true;
      }
    }
    return match_two_use(v, l);
  }

  // ---- one base ----------------------------------------------------------------------------------------
  void try_base(int bi) {
    const Node& base = nodes_[static_cast<size_t>(bi)];
    OpKind fused;
    int spatial = 0;  // conv spatial dims; 0 for linear/matmul
    if (base.op == OpKind::conv1d) fused = OpKind::conv1d_fused, spatial = 1;
    else if (base.op == OpKind::conv2d) fused = OpKind::conv2d_fused, spatial = 2;
    else if (base.op == OpKind::conv_transpose2d) fused = OpKind::conv_transpose2d_fused, spatial = 2;
    else if (base.op == OpKind::linear) fused = OpKind::linear_fused;
    else if (base.op == OpKind::matmul) fused = OpKind::matmul_fused;
    else return;  // not a base the fused ops exist for
    if (base.outputs.size() != 1) return;
    // A 1-D weight (linear) or right operand (matmul) drops the output's channel dim.
    if ((base.op == OpKind::linear || base.op == OpKind::matmul) && val(base.inputs[1]).sizes.size() < 2) return;
    ValueId v0 = base.outputs[0];
    const ir::Value& ov = val(v0);
    if (ov.dtype != DType::F32 || ov.sizes.empty()) return;
    for (ValueId in : base.inputs)
      if (in != kNoValue && val(in).dtype != DType::F32) return;
    const int rank = static_cast<int>(ov.sizes.size());
    const int cdim = spatial ? rank - spatial - 1 : rank - 1;

    std::vector<Link> links;
    ValueId v = v0;
    while (true) {
      Link l;
      if (!next_link(v, cdim, l)) break;
      for (int n : l.nodes) consumed_[static_cast<size_t>(n)] = true;  // tentatively, so later matches skip them
      v = l.result;
      links.push_back(std::move(l));
    }
    auto release = [&](size_t from) {
      for (size_t i = from; i < links.size(); ++i)
        for (int n : links[i].nodes) consumed_[static_cast<size_t>(n)] = false;
      links.resize(from);
    };

    // Fold leading constant per-channel affine links into constant weights.
    std::vector<ValueId> inputs = base.inputs;
    size_t folded = fold_into_weights(base, links, inputs);
    // Convolutions: a full-size operand only as an add right after the (folded) convolution.
    for (size_t i = folded; i < links.size(); ++i) {
      bool first = i == folded;
      bool ok = !links[i].full_operand || !spatial || (first && links[i].ops[0].kind == PostOpKind::add);
      if (!ok) {
        release(i);
        break;
      }
    }
    if (links.empty()) return;

    std::vector<PostOp> post;
    for (size_t i = folded; i < links.size(); ++i) {
      Link& l = links[i];
      std::vector<int> index(l.operands.size());
      for (size_t k = 0; k < l.operands.size(); ++k) {
        index[k] = static_cast<int>(inputs.size());
        inputs.push_back(l.operands[k].value != kNoValue ? l.operands[k].value : new_constant(l.operands[k].data));
      }
      for (PostOp p : l.ops) {
        for (int& o : p.operand)
          if (o >= 0) o = index[static_cast<size_t>(o)];
        if (p.kind == PostOpKind::linear && !post.empty() && post.back().kind == PostOpKind::linear) {
          PostOp& q = post.back();  // a2·(a1·x + b1) + b2
          q.beta = p.alpha * q.beta + p.beta;
          q.alpha *= p.alpha;
          continue;
        }
        post.push_back(p);
      }
    }
    // The fused node takes the place of the chain's last node (all operands are defined before it).
    int last = bi;
    for (const Link& l : links)
      for (int n : l.nodes) last = std::max(last, n);
    Node& target = nodes_[static_cast<size_t>(last)];
    ValueId out = links.back().result;
    if (target.outputs.size() != 1 || target.outputs[0] != out) {  // not expected: every link ends the chain so far
      release(0);
      pending_constants_.clear();
      return;
    }
    Node fused_node;
    fused_node.kind = NodeKind::Call;
    fused_node.op = post.empty() ? base.op : fused;
    fused_node.inputs = inputs;
    fused_node.attrs = base.attrs;
    if (!post.empty()) fused_node.attrs.set("post_ops", ops::post_ops_text(post));
    fused_node.outputs = {out};
    fused_node.loc = base.loc;
    for (const Link& l : links)
      for (int n : l.nodes) removed_.push_back(n);
    removed_.push_back(bi);
    // Move the new constants created for this base before the target.
    for (Node& c : pending_constants_) insert_before_[static_cast<size_t>(last)].push_back(std::move(c));
    pending_constants_.clear();
    target = std::move(fused_node);
    removed_.erase(std::remove(removed_.begin(), removed_.end(), last), removed_.end());
    consumed_[static_cast<size_t>(bi)] = true;
    if (!post.empty()) {
      ++stats_.fused_calls;
      stats_.post_ops += static_cast<int64_t>(post.size());
    }
    stats_.folded_links += static_cast<int64_t>(folded);
    int64_t replaced = 0;
    for (const Link& l : links) replaced += static_cast<int64_t>(l.nodes.size());
    stats_.nodes_removed += replaced;
  }

  /// Folds the leading affine links of `links` into new weight/bias constants (updating `inputs`) when
  /// the base's weight and bias are Constants; returns how many links were folded.
  size_t fold_into_weights(const Node& base, const std::vector<Link>& links, std::vector<ValueId>& inputs) {
    bool conv = base.op == OpKind::conv1d || base.op == OpKind::conv2d || base.op == OpKind::conv_transpose2d;
    if (!conv && base.op != OpKind::linear) return 0;
    Tensor w = constant_data(base.inputs[1]);
    Tensor b = base.inputs[2] == kNoValue ? Tensor() : constant_data(base.inputs[2]);
    if (!w.defined() || (base.inputs[2] != kNoValue && !b.defined()) || w.dtype() != DType::F32) return 0;
    if (!conv && w.dim() != 2) return 0;
    IntVec ws = w.int_sizes();
    int64_t groups = conv && base.attrs.has("groups") ? base.attrs.i("groups") : 1;
    const bool transposed = base.op == OpKind::conv_transpose2d;
    int64_t C = transposed ? ws[1] * groups : ws[0];  // output channels
    std::vector<double> S(static_cast<size_t>(C), 1.0), T(static_cast<size_t>(C), 0.0);
    size_t n = 0;
    for (; n < links.size() && links[n].affine; ++n) {
      const Link& l = links[n];
      if (l.scale.size() != 1 && l.scale.size() != static_cast<size_t>(C)) break;
      for (size_t c = 0; c < S.size(); ++c) {
        double s = l.scale.size() == 1 ? l.scale[0] : l.scale[c];
        double t = l.shift.size() == 1 ? l.shift[0] : l.shift[c];
        S[c] *= s;
        T[c] = T[c] * s + t;
      }
    }
    if (n == 0) return 0;
    // w'[o, ...] = w[o, ...]·S[o]; for a transposed conv the output channel of w[ci, j] is
    // group(ci)·(O/g) + j.
    Tensor wc = w.contiguous();
    const float* wv = wc.data_ptr<float>();
    Tensor nwt = arena_.empty_f32(ws);
    float* nw = nwt.data_ptr<float>();
    const int64_t count = wc.int_numel();
    int64_t inner = 1;
    for (size_t d = 2; d < ws.size(); ++d) inner *= ws[d];
    if (!conv) inner = ws[1];
    if (!transposed) {
      // weights are [O, ...]: one run of `per` elements per output channel
      const int64_t per = conv ? ws[1] * inner : inner;
      for (int64_t o = 0; o < C; ++o)
        for (int64_t i = o * per; i < (o + 1) * per; ++i)
          nw[i] = static_cast<float>(static_cast<double>(wv[i]) * S[static_cast<size_t>(o)]);
    } else {
      for (int64_t i = 0; i < count; ++i) {
        int64_t j = (i / inner) % ws[1];
        int64_t ci = i / (inner * ws[1]);
        int64_t o = ci / (ws[0] / groups) * ws[1] + j;
        nw[i] = static_cast<float>(static_cast<double>(wv[i]) * S[static_cast<size_t>(o)]);
      }
    }
    std::vector<double> bv = b.defined() ? b.contiguous().to_vector<double>() : std::vector<double>(S.size(), 0.0);
    std::vector<float> nb(S.size());
    for (size_t c = 0; c < S.size(); ++c) nb[c] = static_cast<float>(bv[c] * S[c] + T[c]);
    inputs[1] = new_constant(nwt);
    inputs[2] = new_constant(tensor<float>(nb, {C}));
    return n;
  }

  /// A new Constant value (its node is placed before the fused node by try_base).
  ValueId new_constant(const Tensor& t) {
    ir::Value v;
    do v.name = fmt::format("fused_c{}", next_constant_++);
    while (names_.count(v.name));
    v.dtype = t.dtype();
    v.sizes = t.sizes();
    v.strides = t.strides();
    v.node = -1;
    g_.values().push_back(std::move(v));
    ValueId id = static_cast<ValueId>(g_.values().size() - 1);
    Node n;
    n.kind = NodeKind::Constant;
    n.outputs = {id};
    n.constant = t;
    pending_constants_.push_back(std::move(n));
    return id;
  }

  /// Applies the recorded removals and insertions, keeping the order valid.
  void rebuild() {
    std::vector<bool> drop(nodes_.size(), false);
    for (int r : removed_) drop[static_cast<size_t>(r)] = true;
    std::vector<Node> out;
    out.reserve(nodes_.size());
    auto emit = [&](Node&& n) {
      int32_t idx = static_cast<int32_t>(out.size());
      for (ValueId o : n.outputs) {
        g_.values()[static_cast<size_t>(o)].node = idx;
        g_.values()[static_cast<size_t>(o)].output_index = 0;
      }
      out.push_back(std::move(n));
    };
    for (size_t i = 0; i < nodes_.size(); ++i) {
      for (Node& c : insert_before_[i]) emit(std::move(c));
      if (drop[i]) continue;
      Node n = std::move(nodes_[i]);
      int32_t idx = static_cast<int32_t>(out.size());
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        g_.values()[static_cast<size_t>(n.outputs[k])].node = idx;
        g_.values()[static_cast<size_t>(n.outputs[k])].output_index = static_cast<int32_t>(k);
      }
      out.push_back(std::move(n));
    }
    nodes_ = std::move(out);
    g_.compact(std::vector<bool>(nodes_.size(), true));
  }

  Graph& g_;
  std::vector<Node>& nodes_;
  std::vector<std::vector<Use>> uses_;
  std::vector<bool> is_output_;
  std::vector<bool> consumed_;
  std::vector<int> removed_;
  std::vector<std::vector<Node>> insert_before_;
  std::vector<Node> pending_constants_;
  std::unordered_set<std::string> names_;
  int next_constant_ = 0;
  FoldArena arena_;  // the folded weights' memory
  FusePostOpsStats stats_;
};

}  // namespace

FusePostOpsStats fuse_post_ops(ir::Graph& g) { return Fuser(g).run(); }

}  // namespace protean::backend::cpu
