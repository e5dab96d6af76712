// The tape (record) and the backward engine.
#include "autograd/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "capture/location.h"
#include "core/storage_version.h"
#include "ir/provenance.h"
#include "ops/dispatch.h"
#include "protean/autograd.h"
#include "protean/ops.h"

namespace protean {

bool is_grad_enabled() { return autograd::detail::t_grad_enabled; }
void set_grad_enabled(bool enabled) { autograd::detail::t_grad_enabled = enabled; }

namespace autograd {
namespace {

std::atomic<uint64_t> g_seq{0};

/// A handle sharing t's storage and capture value, without autograd state.
Tensor detached(const Tensor& t) {
  if (!t.defined()) return t;
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd.reset();
  impl->requires_grad = false;
  return Tensor(std::move(impl));
}

std::shared_ptr<AutogradMeta>& meta_of(const Tensor& t) { return t.impl()->autograd; }

Edge edge_of(const Tensor& t) {
  Edge e;
  if (!t.defined() || !t.impl()->requires_grad) return e;
  auto& m = meta_of(t);
  if (!m) m = std::make_shared<AutogradMeta>();  // a leaf that requires grad
  if (m->grad_fn) {
    e.fn = m->grad_fn;
    e.output_nr = m->output_nr;
  } else {
    e.leaf = m;
  }
  return e;
}

bool same_size(const SymInt& a, const SymInt& b) {
  if (!a.is_symbolic() && !b.is_symbolic()) return a.hint() == b.hint();
  if (a.expr() == b.expr()) return true;
  return static_cast<bool>(a == b);
}
bool same_sizes(const SymIntVec& a, const SymIntVec& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_size(a[i], b[i])) return false;
  return true;
}

/// Fits a rule's gradient to its input: reduces broadcast dims and casts to the input's dtype.
Tensor fit(Tensor g, const TensorMeta& m) {
  if (!same_sizes(g.sizes(), m.sizes)) g = sum_to_size(g, m.sizes);
  if (g.dtype() != m.dtype) g = cast(g, m.dtype);
  return g;
}

Tensor accumulate(const Tensor& a, const Tensor& b) { return a.defined() ? add(a, b) : b; }

/// A caller's grad_output for output i, checked as torch.autograd does: the output's sizes, a floating
/// dtype (another floating dtype is cast to the output's).
Tensor checked_grad_output(const Tensor& o, const Tensor& g, size_t i) {
  if (!same_sizes(g.sizes(), o.sizes()))
    throw ShapeError(fmt::format("autograd: grad_outputs[{}] has shape {} but output {} has shape {} (a gradient of "
                                 "an output has the output's shape)",
                                 i, to_string(g.sizes()), i, to_string(o.sizes())));
  if (!is_floating(g.dtype()))
    throw TypeError(fmt::format("autograd: grad_outputs[{}] is {} but output {} is {} (a gradient is floating; pass "
                                "it as {})",
                                i, short_name(g.dtype()), i, short_name(o.dtype()), short_name(o.dtype())));
  return g.dtype() == o.dtype() ? g : cast(g, o.dtype());
}

}  // namespace

namespace {
uint64_t saved_version(const Tensor& t) {
  return t.defined() && !t.is_fake() ? core::storage_version(t.impl()->storage.get()) : Node::kNotVersioned;
}
/// RuntimeError when saved tensor `t` (input or output `i` of the node) was written in place after it was
/// saved: the backward would use values the forward never saw.
void check_saved_version(const Node& node, const Tensor& t, const std::vector<uint64_t>& versions, size_t i,
                         const char* what) {
  if (i >= versions.size() || versions[i] == Node::kNotVersioned || t.is_fake()) return;
  const uint64_t now = core::storage_version(t.impl()->storage.get());
  if (now == versions[i]) return;
  throw RuntimeError(fmt::format(
      "autograd: {} {} of {} ({}), saved for the backward, was modified in place after it was saved (its storage is "
      "at version {}, it was saved at version {}); the backward would use values the forward never saw. Call "
      "backward() before changing it (an optimizer step, a write through data_ptr() announced with "
      "increment_version), or give the op a copy (clone())",
      what, i, ops::op_name(node.op), fmt::format("{}{}", short_name(t.dtype()), to_string(t.sizes())), now,
      versions[i]));
}
}  // namespace

const Tensor& GradCtx::in(size_t i) const {
  const Tensor& t = node.in.at(i);
  if (!t.defined() && node.in_defined.at(i))
    throw std::logic_error(fmt::format("autograd: the rule of {} reads input {} that its row does not save",
                                       ops::op_name(node.op), i));
  if (t.defined()) check_saved_version(node, t, node.in_version, i, "input");
  return t;
}
const Tensor& GradCtx::out(size_t i) const {
  const Tensor& t = node.out.at(i);
  if (!t.defined())
    throw std::logic_error(fmt::format("autograd: the rule of {} reads output {} that its row does not save",
                                       ops::op_name(node.op), i));
  check_saved_version(node, t, node.out_version, i, "output");
  return t;
}

namespace detail {

const core::SourceLocation* backward_provenance() { return ir::t_backward_provenance; }

/// Marks what the tape records in one scope as the backward of `loc` (the IR's `[bwd of file:line]`)
/// and restores the previous mark on every exit: a rule or a sum_to_size that throws must not leave
/// the thread pointing at this scope's dead location (the next capture on the thread read it).
class BackwardProvenanceScope {
 public:
  explicit BackwardProvenanceScope(const core::SourceLocation& loc) : prev_(ir::t_backward_provenance), prov_(loc) {
    prov_.backward = true;
    ir::t_backward_provenance = &prov_;
  }
  ~BackwardProvenanceScope() { ir::t_backward_provenance = prev_; }
  BackwardProvenanceScope(const BackwardProvenanceScope&) = delete;
  BackwardProvenanceScope& operator=(const BackwardProvenanceScope&) = delete;

 private:
  const core::SourceLocation* prev_;
  core::SourceLocation prov_;
};

namespace {
// ops::call reaches the tape through the op layer's recorder (ops/tape.h), installed at load.
const bool g_tape_installed = (ops::set_tape_recorder(&record), true);
}  // namespace

void record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs, std::vector<Tensor>& outs) {
  const DerivativeRow& row = derivative_row(op);
  if (row.kind == Derivative::NoGradient) return;
  if (row.kind == Derivative::Unsupported)
    throw NotImplementedError(fmt::format("autograd: {} has no derivative rule yet ({}); an input requires grad. "
                                          "Detach the input or run the op under protean::NoGradGuard",
                                          ops::describe_call(op, in), row.note));
  auto node = std::make_shared<Node>();
  node->op = op;
  node->attrs = attrs;
  node->seq = g_seq.fetch_add(1, std::memory_order_relaxed);
  node->in.resize(in.size());
  node->in_defined.resize(in.size());
  node->next.resize(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    node->in_defined[i] = in[i].defined();
    node->in_meta.push_back(in[i].defined() ? in[i].meta() : TensorMeta{});
    if (!in[i].defined()) continue;
    if (row.saves & SaveIn) node->in[i] = detached(in[i]);
    if (is_floating(in[i].dtype())) node->next[i] = edge_of(in[i]);
  }
  if (ops::current_trace_hook()) {
    core::SourceLocation ul = capture::current_user_location();
    node->loc = ul;
  }
  node->in_version.reserve(in.size());
  for (const Tensor& t : node->in) node->in_version.push_back(saved_version(t));
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor& o = outs[k];
    node->out_meta.push_back(o.meta());
    node->out.push_back((row.saves & SaveOut) ? detached(o) : Tensor());
    node->out_version.push_back(saved_version(node->out.back()));
    if (!is_floating(o.dtype())) continue;
    // A kernel may hand back an input's handle: give the output its own impl before marking it.
    for (const Tensor& t : in)
      if (t.defined() && t.impl() == o.impl()) {
        o = detached(o);
        break;
      }
    auto m = std::make_shared<AutogradMeta>();
    m->grad_fn = node;
    m->output_nr = static_cast<int>(k);
    o.impl()->autograd = std::move(m);
    o.impl()->requires_grad = true;
  }
}

}  // namespace detail

namespace {

/// A shape for an error: the sizes, and their traced values when some are symbols ("[s1] (here [3])").
std::string shape_text(const SymIntVec& sizes) {
  std::string r = to_string(sizes);
  bool symbolic = false;
  std::string hints;
  for (const SymInt& d : sizes) {
    int64_t v = 0;
    if (!d.maybe_as_int(v)) symbolic = true;
    hints += fmt::format("{}{}", hints.empty() ? "" : ", ", d.hint());
  }
  return symbolic ? fmt::format("{} (here [{}])", r, hints) : r;
}

struct Engine {
  // Targets of grad(): leaves by meta, intermediate results by (node, output).
  std::unordered_map<const AutogradMeta*, size_t> leaf_targets;
  std::map<std::pair<const Node*, int>, size_t> node_targets;
  std::vector<Tensor> captured;
  bool accumulate_leaves = true;

  void run(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
    NoGradGuard no_grad;  // rules run without recording (no higher-order gradients)
    if (grad_outputs.size() > outputs.size())
      throw ValueError(fmt::format("autograd: {} gradients given for {} outputs (one per output, or none)",
                                   grad_outputs.size(), outputs.size()));
    std::unordered_map<Node*, std::vector<Tensor>> buffers;
    std::unordered_map<Node*, int> deps;
    std::vector<Node*> roots;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Tensor& o = outputs[i];
      if (!o.defined() || !o.impl()->requires_grad)
        throw ValueError(fmt::format("autograd: output {} does not require grad (no input of the ops that made it "
                                     "requires grad, or it was made under NoGradGuard, or it came out of a compiled "
                                     "function). Module::register_parameter leaves requires_grad unset: call "
                                     "requires_grad_() on the parameters to train eagerly, or use "
                                     "compile_train_step / value_and_grad", i));
      Tensor g = i < grad_outputs.size() ? grad_outputs[i] : Tensor();
      if (g.defined()) g = checked_grad_output(o, g, i);
      if (!g.defined()) {
        int64_t n = 0;
        if (!o.numel().maybe_as_int(n) || n != 1)
          throw ValueError(fmt::format("autograd: grad can be implicitly created only for one-element outputs; "
                                       "output {} has shape {} (pass a gradient)", i, shape_text(o.sizes())));
        g = full(o.sizes(), 1.0, o.dtype());
      }
      Edge e = edge_of(o);
      if (e.leaf) {
        deliver_leaf(e.leaf, g);
        continue;
      }
      auto& buf = buffers[e.fn.get()];
      buf.resize(e.fn->out_meta.size());
      buf[static_cast<size_t>(e.output_nr)] = accumulate(buf[static_cast<size_t>(e.output_nr)], g);
      // an output listed twice (or two outputs of one node): one root, its gradients summed above
      if (std::find(roots.begin(), roots.end(), e.fn.get()) == roots.end()) roots.push_back(e.fn.get());
    }
    // Dependency counts over the reachable graph.
    std::vector<Node*> stack(roots.begin(), roots.end());
    std::unordered_set<Node*> seen(roots.begin(), roots.end());
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      if (n->released)
        throw RuntimeError(fmt::format("autograd: backward through the graph a second time ({} was already "
                                       "differentiated and its saved tensors freed)", ops::op_name(n->op)));
      for (const Edge& e : n->next)
        if (e.fn) {
          ++deps[e.fn.get()];
          if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
        }
    }
    auto later_first = [](Node* a, Node* b) { return a->seq < b->seq; };
    std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
    std::unordered_set<Node*> queued;
    for (Node* r : roots)
      if (deps[r] == 0 && queued.insert(r).second) ready.push(r);
    while (!ready.empty()) {
      Node* n = ready.top();
      ready.pop();
      std::vector<Tensor> gs = std::move(buffers[n]);
      buffers.erase(n);
      gs.resize(n->out_meta.size());
      for (size_t k = 0; k < gs.size(); ++k) {
        auto it = node_targets.find({n, static_cast<int>(k)});
        if (it != node_targets.end() && gs[k].defined()) captured[it->second] = accumulate(captured[it->second], gs[k]);
      }
      bool any = false;
      for (const Tensor& g : gs) any = any || g.defined();
      std::vector<Tensor> gin;
      if (any) {
        // Single-output rules get a defined gradient; multi-output rules see undefined ones.
        if (gs.size() == 1 && !gs[0].defined()) gs[0] = full(n->out_meta[0].sizes, 0.0, n->out_meta[0].dtype);
        detail::BackwardProvenanceScope scope(n->loc);
        GradCtx ctx{*n, std::move(gs)};
        gin = derivative_row(n->op).rule(ctx);
      }
      for (size_t i = 0; i < n->next.size(); ++i) {
        const Edge& e = n->next[i];
        if (!e.defined()) continue;
        Tensor g = i < gin.size() ? gin[i] : Tensor();
        if (g.defined()) {
          detail::BackwardProvenanceScope scope(n->loc);
          g = fit(g, n->in_meta[i]);
        }
        if (e.leaf) {
          if (g.defined()) deliver_leaf(e.leaf, g);
          continue;
        }
        Node* m = e.fn.get();
        if (g.defined()) {
          auto& buf = buffers[m];
          buf.resize(m->out_meta.size());
          buf[static_cast<size_t>(e.output_nr)] = accumulate(buf[static_cast<size_t>(e.output_nr)], g);
        }
        if (--deps[m] == 0 && queued.insert(m).second) ready.push(m);
      }
      // Free what the node saved (retain_graph = false).
      n->in.assign(n->in.size(), Tensor());
      n->out.assign(n->out.size(), Tensor());
      n->released = true;
    }
  }

  void deliver_leaf(const std::shared_ptr<AutogradMeta>& leaf, const Tensor& g) {
    if (!leaf_targets.empty() || !accumulate_leaves) {
      auto it = leaf_targets.find(leaf.get());
      if (it != leaf_targets.end()) captured[it->second] = accumulate(captured[it->second], g);
      return;
    }
    leaf->grad = leaf->grad.defined() ? add(leaf->grad, g) : detached(g);
  }
};

}  // namespace

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs) {
  // Inside a function being compiled the leaves' .grad would receive capture-time values, not the
  // call's: the gradient would be lost at run time and a FakeTensor left in a real tensor's grad.
  if (ops::current_trace_hook())
    throw NotImplementedError(
        "backward() inside a function being compiled is not supported: its .grad results would not reach "
        "the compiled calls. Compile protean::value_and_grad(fn) (gradients as results) or use "
        "protean::compile_train_step, or call backward() outside the compiled function");
  Engine e;
  e.run(outputs, grad_outputs);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool allow_unused, bool zeros_for_unused) {
  Engine e;
  e.accumulate_leaves = false;
  e.captured.resize(inputs.size());
  // An input listed twice gets the same gradient at both places (torch.autograd.grad): the engine
  // captures it once, at the first index.
  std::vector<size_t> first_of(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || !t.impl()->requires_grad)
      throw ValueError(fmt::format("autograd::grad: input {} does not require grad", i));
    Edge edge = edge_of(t);
    first_of[i] = i;
    if (edge.leaf) first_of[i] = e.leaf_targets.emplace(edge.leaf.get(), i).first->second;
    else first_of[i] = e.node_targets.emplace(std::pair{edge.fn.get(), edge.output_nr}, i).first->second;
  }
  e.run(outputs, grad_outputs);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (first_of[i] != i) e.captured[i] = e.captured[first_of[i]];
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (e.captured[i].defined()) {
      if (e.captured[i].dtype() != inputs[i].dtype()) e.captured[i] = cast(e.captured[i], inputs[i].dtype());
      continue;
    }
    if (zeros_for_unused) {
      NoGradGuard ng;
      e.captured[i] = full(inputs[i].sizes(), 0.0, inputs[i].dtype());
    } else if (!allow_unused) {
      throw ValueError(fmt::format("autograd::grad: input {} was not used to compute the outputs (pass allow_unused)", i));
    }
  }
  return e.captured;
}

Tensor sum_to_size(const Tensor& x, const SymIntVec& sizes) {
  const int64_t r = x.dim(), rs = static_cast<int64_t>(sizes.size());
  if (rs > r)
    throw ShapeError(fmt::format("sum_to_size: shape {} is not broadcastable to {}", to_string(sizes), to_string(x.sizes())));
  IntVec lead, keep;
  for (int64_t i = 0; i < r - rs; ++i) lead.push_back(i);
  for (int64_t i = 0; i < rs; ++i) {
    const SymInt& want = sizes[static_cast<size_t>(i)];
    const SymInt& have = x.sizes()[static_cast<size_t>(r - rs + i)];
    if (same_size(want, have)) continue;
    if (!static_cast<bool>(want == 1))
      throw ShapeError(fmt::format("sum_to_size: shape {} is not broadcastable to {}", to_string(sizes),
                                   to_string(x.sizes())));
    keep.push_back(r - rs + i);
  }
  Tensor y = x;
  if (!keep.empty()) y = sum(y, keep, true);
  if (!lead.empty()) y = sum(y, lead, false);
  return y;
}

}  // namespace autograd

// ---- Tensor methods (tensor.h's autograd block) ---------------------------------------------------
Tensor& Tensor::requires_grad_(bool r) {
  TensorImpl& t = ref();
  if (r && !is_floating(t.dtype))
    throw TypeError(fmt::format("requires_grad_: only floating tensors can require grad, got {}", short_name(t.dtype)));
  if (t.autograd && t.autograd->grad_fn)
    throw ValueError(fmt::format("requires_grad_: this tensor is the result of {} (not a leaf); detach() it first",
                                 ops::op_name(t.autograd->grad_fn->op)));
  t.requires_grad = r;
  if (r && !t.autograd) t.autograd = std::make_shared<autograd::AutogradMeta>();
  return *this;
}
Tensor Tensor::grad() const {
  const TensorImpl& t = ref();
  return t.autograd ? t.autograd->grad : Tensor();
}
void Tensor::set_grad(const Tensor& g) {
  TensorImpl& t = ref();
  if (g.defined()) {
    if (g.dtype() != t.dtype)
      throw TypeError(fmt::format("set_grad: the gradient is {} but the tensor is {} (a gradient has its tensor's "
                                  "dtype; cast it with .to({}))",
                                  short_name(g.dtype()), short_name(t.dtype), short_name(t.dtype)));
    if (!autograd::same_sizes(g.sizes(), t.sizes))
      throw ShapeError(fmt::format("set_grad: the gradient has shape {} but the tensor has shape {} (a gradient has "
                                   "its tensor's shape)",
                                   to_string(g.sizes()), to_string(t.sizes)));
    if (g.device() != t.device)
      throw ValueError(fmt::format("set_grad: the gradient is on {} but the tensor is on {} (move it with .to({}))",
                                   g.device().str(), t.device.str(), t.device.str()));
  }
  if (!t.autograd) t.autograd = std::make_shared<autograd::AutogradMeta>();
  t.autograd->grad = g;
}
bool Tensor::is_leaf() const {
  const TensorImpl& t = ref();
  return !t.autograd || !t.autograd->grad_fn;
}
std::string Tensor::grad_fn_name() const {
  const TensorImpl& t = ref();
  return t.autograd && t.autograd->grad_fn ? std::string(ops::op_name(t.autograd->grad_fn->op)) : std::string();
}
void Tensor::backward(const Tensor& gradient) const { autograd::backward({*this}, {gradient}); }
Tensor Tensor::detach() const { return autograd::detached(*this); }

namespace detail {
Tensor grad_leaf(const Tensor& t) {
  if (!t.defined()) throw ValueError("value_and_grad: an argument to differentiate is an undefined Tensor");
  if (!is_floating(t.dtype()))
    throw TypeError(fmt::format("value_and_grad: an argument to differentiate must be floating, got {}",
                                short_name(t.dtype())));
  auto impl = std::make_shared<TensorImpl>(*t.impl());
  impl->autograd = std::make_shared<autograd::AutogradMeta>();
  impl->requires_grad = true;
  return Tensor(std::move(impl));
}
std::vector<Tensor> value_and_grad_backward(const Tensor& root, const std::vector<Tensor>& leaves) {
  if (!root.defined()) throw ValueError("value_and_grad: the function returned an undefined Tensor to differentiate");
  if (!is_floating(root.dtype()))
    throw ValueError(fmt::format("value_and_grad: the result to differentiate is {}; it must be a one-element "
                                 "floating tensor (a loss)", short_name(root.dtype())));
  int64_t n = 0;
  if (!root.numel().maybe_as_int(n) || n != 1)
    throw ValueError(fmt::format("value_and_grad: the result to differentiate has shape {}; it must have one "
                                 "element (reduce it to a loss, e.g. with sum or mean)", autograd::shape_text(root.sizes())));
  if (leaves.empty())
    throw ValueError("value_and_grad: nothing to differentiate with respect to (wrt lists no tensor; an empty "
                     "std::vector<Tensor> argument gives none)");
  if (!root.requires_grad())
    throw ValueError("value_and_grad: the result does not depend on any wrt argument through differentiable ops "
                     "(computed without them, under NoGradGuard, after detach(), or from gradients: "
                     "higher-order gradients are not supported)");
  return autograd::grad({root}, leaves, {}, true, true);
}
void throw_bad_wrt(int index, int arity, const char* why) {
  throw ValueError(fmt::format("value_and_grad: wrt index {} {} (the function has {} arguments)", index, why, arity));
}
}  // namespace detail

}  // namespace protean
