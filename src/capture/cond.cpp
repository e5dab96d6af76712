// protean::cond and its capture: see capture/cond.h (tracing the branches into subgraphs) and
// docs/breaks.md (the rewrite of a break-causing `if`).
#include "capture/cond.h"

#include <fmt/format.h>

#include <stdexcept>
#include <unordered_map>

#include "capture/graph_break.h"
#include "capture/location.h"
#include "capture/tracer.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "protean/ops.h"

namespace protean::capture {

namespace {

constexpr const char* kInBranch = " inside a cond branch (a branch is one subgraph and cannot break)";

TensorMeta contiguous_meta(const Tensor& t) {
  TensorMeta m;
  m.sizes = t.sizes();
  m.strides = ir::contiguous_strides_of(m.sizes);
  m.dtype = t.dtype();
  m.device = t.device();
  return m;
}

/// Traces one branch into its own graph (see cond.h).
class BranchTracer final : public ops::TraceHook {
 public:
  BranchTracer(ops::TraceHook* parent, std::span<const Tensor> operands, std::string name) : parent_(parent) {
    graph_ = std::make_shared<ir::Graph>();
    graph_->name = std::move(name);
    for (const Tensor& t : operands) {
      ir::ValueId v = graph_->add_placeholder(fmt::format("arg{}", operands_.size()), t.dtype(), t.sizes(), t.strides());
      operands_.push_back(own_fake(t.meta(), v));
      outer_.emplace(t.impl(), v);
    }
  }
  // Fakes of this branch that outlive it (stored by the user) must not be mistaken for the fakes of
  // a later tracer at the same address.
  ~BranchTracer() override {
    for (const auto& impl : made_)
      if (impl->trace.tracer == this) impl->trace = {};
  }
  BranchTracer(const BranchTracer&) = delete;
  BranchTracer& operator=(const BranchTracer&) = delete;

  /// Runs `fn` on the fake operands with this tracer installed; returns its outputs.
  std::vector<Tensor> run(const ops::BranchFn& fn) {
    std::vector<Tensor> outs;
    {
      ops::TraceHookScope scope(this);
      outs = fn(operands_);
    }
    return outs;
  }

  /// The branch's graph value of `t`: a value of this graph, or a tensor of the caller's world
  /// (an operand, or lifted: a new placeholder, remembered in lifted()).
  ir::ValueId value_of(const Tensor& t) {
    const TensorImpl* impl = t.impl();
    if (impl->trace.tracer == this) return static_cast<ir::ValueId>(impl->trace.value);
    auto it = outer_.find(impl);
    if (it != outer_.end()) return it->second;
    ir::ValueId v = graph_->add_placeholder("lifted", t.dtype(), t.sizes(), t.strides());
    outer_.emplace(impl, v);
    lifted_.push_back(t);
    lifted_values_.push_back(v);
    return v;
  }

  /// Ends the graph with `outs` as its outputs.
  void set_outputs(const std::vector<Tensor>& outs) {
    std::vector<ir::ValueId> ids;
    for (const Tensor& t : outs) ids.push_back(value_of(t));
    graph_->set_outputs(std::move(ids));
  }

  /// Gives the graph its final signature: the operands, then `all_lifted` (the union over both
  /// branches, in that order; a tensor this branch does not read gets an unused placeholder),
  /// placeholders first and named %arg0, %arg1, ... in order.
  std::shared_ptr<const ir::Graph> finish(const std::vector<Tensor>& all_lifted) {
    ir::Graph& g = *graph_;
    std::vector<ir::ValueId> order;
    for (size_t i = 0; i < operands_.size(); ++i) order.push_back(g.inputs()[i]);
    for (const Tensor& t : all_lifted) order.push_back(value_of(t));
    // Stable reorder: placeholders in `order`, then every other node as recorded.
    std::vector<ir::Node>& nodes = g.nodes();
    std::vector<ir::Node> reordered;
    reordered.reserve(nodes.size());
    std::vector<bool> taken(nodes.size(), false);
    for (ir::ValueId v : order) {
      size_t idx = static_cast<size_t>(g.value(v).node);
      taken[idx] = true;
      reordered.push_back(std::move(nodes[idx]));
    }
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!taken[i]) reordered.push_back(std::move(nodes[i]));
    nodes = std::move(reordered);
    for (size_t i = 0; i < nodes.size(); ++i)
      for (ir::ValueId v : nodes[i].outputs) g.values()[static_cast<size_t>(v)].node = static_cast<int32_t>(i);
    for (size_t i = 0; i < order.size(); ++i) {
      ir::Value& val = g.values()[static_cast<size_t>(order[i])];
      val.name = fmt::format("arg{}", i);
      nodes[i].source = val.name;
    }
    return graph_;
  }

  const std::vector<Tensor>& lifted() const { return lifted_; }

  // ---- TraceHook ------------------------------------------------------------------------------
  void before_meta(ops::OpKind, std::span<const Tensor>) override {
    loc_ = where();
    have_loc_ = true;
  }

  std::vector<Tensor> record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                             std::vector<TensorMeta> metas) override {
    core::SourceLocation ul = have_loc_ ? loc_ : where();
    have_loc_ = false;
    if (parent_ && op == ops::OpKind::full && in.empty() && metas.size() == 1 && metas[0].sizes.empty()) {
      // A wrapped C++ scalar (`o[0] * 2.0`): made by the caller's world and lifted when used, so a
      // dynamic float stays a graph input and a scalar read on the host in segmented execution stays
      // data (not a new segment per value).
      return parent_->record(op, in, attrs, std::move(metas));
    }
    std::vector<ir::ValueId> ids;
    ids.reserve(in.size());
    for (const Tensor& t : in) ids.push_back(t.defined() ? value_of(t) : ir::kNoValue);
    std::vector<ir::ValueId> outs =
        graph_->add_call(op, std::move(ids), attrs, metas, ul);
    return fakes(outs, metas);
  }

  void on_host_read(const Tensor& t, const char* what) override {
    if (!t.is_fake()) return;  // a real tensor (a closure over a constant): the read is allowed
    BreakInfo b = host_read_break(what);
    b.reason += kInBranch;
    throw GraphBreakError(std::move(b));
  }

  void on_graph_break(const std::string& reason) override { throw_graph_break(reason + kInBranch, "graph_break"); }

  std::vector<Tensor> on_data_dependent(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs) override {
    bool any_fake = false;
    for (const auto& t : in) any_fake |= t.defined() && t.is_fake();
    if (!any_fake) {  // real inputs: the size is known now; the result is a real tensor, lifted when used
      ops::TraceHookScope eager(nullptr);
      return ops::run_eager(op, in, attrs);
    }
    throw_graph_break(std::string("data-dependent output shape") + kInBranch, ops::describe_call(op, in));
  }

  bool inlines_compiled_calls() const override { return true; }

  std::vector<Tensor> on_cond(const Tensor& pred, const ops::BranchFn& true_fn, const ops::BranchFn& false_fn,
                              std::span<const Tensor> operands) override {
    core::SourceLocation ul = where();
    TracedCond c = trace_cond(this, pred, true_fn, false_fn, operands);
    std::vector<ir::ValueId> ids;
    for (const Tensor& t : c.inputs) ids.push_back(value_of(t));
    std::vector<ir::ValueId> outs = graph_->add_call(ops::OpKind::cond, std::move(ids), {}, c.outputs,
                                                     ul, c.branches);
    return fakes(outs, c.outputs);
  }

 private:
  /// The user's line for a node; not looked up for the eager signature check (no caller, the graph is
  /// only compared and dropped).
  core::SourceLocation where() const { return parent_ ? current_user_location() : core::SourceLocation{}; }

  /// A fake for this branch's value `v`, remembered in made_ so the destructor can detach it.
  Tensor own_fake(const TensorMeta& m, ir::ValueId v) {
    Tensor t = make_fake(m, this, v);
    made_.push_back(t.impl_ptr());
    return t;
  }

  std::vector<Tensor> fakes(const std::vector<ir::ValueId>& vs, const std::vector<TensorMeta>& metas) {
    std::vector<Tensor> r;
    r.reserve(vs.size());
    for (size_t i = 0; i < vs.size(); ++i) r.push_back(own_fake(metas[i], vs[i]));
    return r;
  }

  ops::TraceHook* parent_;
  std::shared_ptr<ir::Graph> graph_;
  std::vector<Tensor> operands_;                                // fakes of the operand placeholders
  std::unordered_map<const TensorImpl*, ir::ValueId> outer_;   // caller's tensors → placeholders
  std::vector<Tensor> lifted_;                                  // caller's tensors read by the branch
  std::vector<ir::ValueId> lifted_values_;
  std::vector<std::shared_ptr<TensorImpl>> made_;
  core::SourceLocation loc_;
  bool have_loc_ = false;
};

void check_defined(const std::vector<Tensor>& outs, const char* fn) {
  for (size_t i = 0; i < outs.size(); ++i)
    if (!outs[i].defined()) throw ValueError(fmt::format("cond: output {} of {} is an undefined tensor", i, fn));
}

/// Both branches must return the same number of tensors with equal dtypes and sizes. Symbolic sizes
/// compare through the current ShapeEnv (a comparison it cannot decide from ranges is guarded).
void check_same_outputs(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size())
    throw ValueError(fmt::format("cond: true_fn returned {} outputs, false_fn {}; both branches must return the same "
                                 "number of tensors",
                                 a.size(), b.size()));
  check_defined(a, "true_fn");
  check_defined(b, "false_fn");
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dtype() != b[i].dtype())
      throw TypeError(fmt::format("cond: output {} is {} in true_fn and {} in false_fn; both branches must agree", i,
                                  short_name(a[i].dtype()), short_name(b[i].dtype())));
    bool same = a[i].dim() == b[i].dim();
    for (int64_t d = 0; same && d < a[i].dim(); ++d) same = static_cast<bool>(a[i].sizes()[d] == b[i].sizes()[d]);
    if (!same)
      throw ShapeError(fmt::format("cond: output {} has sizes {} in true_fn and {} in false_fn; both branches must agree",
                                   i, to_string(a[i].sizes()), to_string(b[i].sizes())));
  }
}

/// Eager cond: only the chosen branch runs. The other one is traced on fake operands (metadata only,
/// no kernels) so that branches that disagree fail here as they would under compile. A branch that
/// reads data on the host cannot be traced; the outputs are then not compared.
std::vector<Tensor> eager_cond(const Tensor& pred, const ops::BranchFn& true_fn, const ops::BranchFn& false_fn,
                               const std::vector<Tensor>& operands) {
  const bool taken = pred.item<bool>();
  std::vector<Tensor> out = taken ? true_fn(operands) : false_fn(operands);
  std::vector<Tensor> other;
  try {
    BranchTracer t(nullptr, operands, taken ? "false_branch" : "true_branch");
    other = t.run(taken ? false_fn : true_fn);
  } catch (const GraphBreakError&) {
    return out;
  }
  if (taken)
    check_same_outputs(out, other);
  else
    check_same_outputs(other, out);
  return out;
}

}  // namespace

TracedCond trace_cond(ops::TraceHook* parent, const Tensor& pred, const ops::BranchFn& true_fn,
                      const ops::BranchFn& false_fn, std::span<const Tensor> operands) {
  BranchTracer t(parent, operands, "true_branch");
  BranchTracer f(parent, operands, "false_branch");
  std::vector<Tensor> out_t = t.run(true_fn);
  std::vector<Tensor> out_f = f.run(false_fn);
  check_same_outputs(out_t, out_f);
  t.set_outputs(out_t);
  f.set_outputs(out_f);
  // Both branches take the same operands: the union of what either closed over.
  std::vector<Tensor> lifted = t.lifted();
  for (const Tensor& x : f.lifted()) {
    bool seen = false;
    for (const Tensor& y : lifted) seen |= y.impl() == x.impl();
    if (!seen) lifted.push_back(x);
  }
  TracedCond r;
  r.branches = {t.finish(lifted), f.finish(lifted)};
  r.inputs.push_back(pred);
  r.inputs.insert(r.inputs.end(), operands.begin(), operands.end());
  r.inputs.insert(r.inputs.end(), lifted.begin(), lifted.end());
  for (const Tensor& o : out_t) r.outputs.push_back(contiguous_meta(o));
  return r;
}

std::vector<Tensor> call_node(ops::OpKind op, const ops::Attrs& attrs,
                              const std::vector<std::shared_ptr<const ir::Graph>>& subgraphs,
                              std::span<const Tensor> inputs) {
  if (op == ops::OpKind::call_region) return call_graph(*subgraphs.at(0), inputs);  // the body, inlined
  if (op != ops::OpKind::cond) return ops::call(op, inputs, attrs);
  std::shared_ptr<const ir::Graph> a = subgraphs.at(0), b = subgraphs.at(1);
  CondFn ta = [a](const TensorList& o) { return call_graph(*a, o); };
  CondFn fb = [b](const TensorList& o) { return call_graph(*b, o); };
  if (inputs.empty()) throw std::out_of_range("cond node without a predicate");
  return protean::cond(inputs[0], ta, fb, TensorList(inputs.begin() + 1, inputs.end()));
}

std::vector<Tensor> call_graph(const ir::Graph& g, std::span<const Tensor> inputs) {
  std::vector<ir::ValueId> ins = g.inputs();
  if (ins.size() != inputs.size())
    throw ValueError(fmt::format("graph '{}' takes {} inputs, got {}", g.name, ins.size(), inputs.size()));
  std::vector<Tensor> vals(g.values().size());
  for (size_t i = 0; i < ins.size(); ++i) vals[static_cast<size_t>(ins[i])] = inputs[i];
  std::vector<Tensor> in;
  for (const ir::Node& n : g.nodes()) {
    switch (n.kind) {
      case ir::NodeKind::Placeholder:
        break;
      case ir::NodeKind::Constant:
        if (!n.constant.defined())
          throw CompileError(fmt::format("graph '{}': constant %{} has no data", g.name, g.value(n.outputs[0]).name));
        vals[static_cast<size_t>(n.outputs[0])] = n.constant;
        break;
      case ir::NodeKind::Call: {
        in.clear();
        for (ir::ValueId v : n.inputs) in.push_back(v == ir::kNoValue ? Tensor() : vals[static_cast<size_t>(v)]);
        std::vector<Tensor> out = call_node(n.op, n.attrs, n.subgraphs, in);
        for (size_t k = 0; k < n.outputs.size() && k < out.size(); ++k) vals[static_cast<size_t>(n.outputs[k])] = out[k];
        break;
      }
      case ir::NodeKind::Output: {
        std::vector<Tensor> r;
        for (ir::ValueId v : n.inputs) r.push_back(vals[static_cast<size_t>(v)]);
        return r;
      }
    }
  }
  return {};
}

}  // namespace protean::capture

namespace protean {

TensorList cond(const Tensor& pred, const CondFn& true_fn, const CondFn& false_fn, const TensorList& operands) {
  if (!pred.defined()) throw ValueError("cond: pred is an undefined tensor");
  if (pred.dtype() != DType::Bool)
    throw TypeError(fmt::format("cond: pred must be a bool tensor with one element, got {}{} (compare it first, "
                                "e.g. x.sum() > 0)",
                                short_name(pred.dtype()), to_string(pred.sizes())));
  for (const SymInt& s : pred.sizes())
    if (s.is_symbolic() || s.hint() != 1)
      throw ValueError(fmt::format("cond: pred must have exactly one element, got sizes {}", to_string(pred.sizes())));
  if (!true_fn || !false_fn) throw ValueError("cond: true_fn and false_fn must be callable");
  for (size_t i = 0; i < operands.size(); ++i)
    if (!operands[i].defined()) throw ValueError(fmt::format("cond: operand {} is an undefined tensor", i));
  if (ops::TraceHook* h = ops::current_trace_hook()) {
    Tensor p = pred.dim() == 0 ? pred : pred.reshape({});
    return h->on_cond(p, true_fn, false_fn, operands);
  }
  return capture::eager_cond(pred, true_fn, false_fn, operands);
}

Tensor cond(const Tensor& pred, const std::function<Tensor(const TensorList&)>& true_fn,
            const std::function<Tensor(const TensorList&)>& false_fn, const TensorList& operands) {
  if (!true_fn || !false_fn) throw ValueError("cond: true_fn and false_fn must be callable");
  CondFn t = [&](const TensorList& ops) { return TensorList{true_fn(ops)}; };
  CondFn f = [&](const TensorList& ops) { return TensorList{false_fn(ops)}; };
  return cond(pred, t, f, operands).at(0);
}

}  // namespace protean
