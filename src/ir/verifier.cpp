#include "ir/verifier.h"

#include <fmt/format.h>

#include <unordered_set>

#include "ir/printer.h"
#include "ir/sym_util.h"
#include "sym/shape_env.h"
#include "sym/simplify.h"

namespace protean::ir {

Tensor fake_tensor(const Value& v) {
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = v.sizes;
  impl->strides = v.strides.size() == v.sizes.size() ? v.strides : contiguous_strides_of(v.sizes);
  impl->dtype = v.dtype;
  return Tensor(std::move(impl));
}

namespace {

bool equivalent(const SymInt& a, const SymInt& b) {
  if (same_symint(a, b)) return true;
  if (!a.is_symbolic() && !b.is_symbolic()) return false;
  return sym::simplify(to_expr(a)) == sym::simplify(to_expr(b));
}

class Verifier {
 public:
  Verifier(const Graph& g, const VerifyOptions& o) : g_(g), opts_(o) {}

  void run() {
    const auto& nodes = g_.nodes();
    const auto& values = g_.values();
    if (nodes.empty() || nodes.back().kind != NodeKind::Output)
      fail(nullptr, "the last node must be the Output node (call Graph::set_outputs)");
    std::vector<int> defs(values.size(), 0);
    std::vector<bool> defined(values.size(), false);
    std::unordered_set<std::string_view> names;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      if (n.kind == NodeKind::Output && i + 1 != nodes.size())
        fail(&n, fmt::format("Output node at position {} of {}: it must be the single last node", i, nodes.size()));
      for (ValueId in : n.inputs) {
        if (in == kNoValue) {
          if (n.kind == NodeKind::Output) fail(&n, "a graph output is None");
          continue;
        }
        if (in < 0 || static_cast<size_t>(in) >= values.size())
          fail(&n, fmt::format("uses value id {}, which does not exist (dangling reference)", in));
        if (!defined[static_cast<size_t>(in)])
          fail(&n, fmt::format("uses %{} before its definition", values[static_cast<size_t>(in)].name));
      }
      switch (n.kind) {
        case NodeKind::Placeholder:
        case NodeKind::Constant:
          if (!n.inputs.empty() || n.outputs.size() != 1) fail(&n, "a Placeholder/Constant takes no inputs and defines one value");
          if (n.kind == NodeKind::Constant && n.constant.defined()) check_constant(n);
          break;
        case NodeKind::Call:
          check_arity(n);
          if (n.op == ops::OpKind::call_region)
            check_region(n);
          else if (ops::op_info(n.op).category == ops::OpCategory::ControlFlow)
            check_cond(n);
          else if (!n.subgraphs.empty())
            fail(&n, fmt::format("{} owns {} subgraph(s); only a control-flow op (cond) has subgraphs", ops::op_name(n.op),
                                 n.subgraphs.size()));
          break;
        case NodeKind::Output:
          if (!n.outputs.empty()) fail(&n, "the Output node defines values");
          break;
      }
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        ValueId v = n.outputs[k];
        if (v < 0 || static_cast<size_t>(v) >= values.size())
          fail(&n, fmt::format("defines value id {}, which does not exist", v));
        const Value& val = values[static_cast<size_t>(v)];
        if (++defs[static_cast<size_t>(v)] > 1) fail(&n, fmt::format("%{} is defined more than once", val.name));
        if (val.node != static_cast<int32_t>(i) || val.output_index != static_cast<int32_t>(k))
          fail(&n, fmt::format("%{} records producer node {} output {}, but is output {} of node {}", val.name,
                               val.node, val.output_index, k, i));
        if (val.name.empty()) fail(&n, "defines a value without a name");
        if (!names.insert(val.name).second) fail(&n, fmt::format("value name %{} is used twice", val.name));
        defined[static_cast<size_t>(v)] = true;
      }
      if (n.kind == NodeKind::Call && opts_.check_types) check_types(n);
    }
    for (size_t v = 0; v < values.size(); ++v)
      if (defs[v] == 0)
        fail(nullptr, fmt::format("value %{} (id {}) is not defined by any node (dangling value)", values[v].name, v));
  }

 private:
  [[noreturn]] void fail(const Node* n, const std::string& what) {
    std::string where;
    if (n) {
      where = fmt::format(" at node {}: `{}`", n - g_.nodes().data(), print_node(g_, *n));
    }
    throw CompileError(fmt::format("IR verification failed for graph '{}'{}: {}", g_.name, where, what));
  }

  void check_arity(const Node& n) {
    const ops::OpInfo& info = ops::op_info(n.op);
    if (info.inputs >= 0 && n.inputs.size() != static_cast<size_t>(info.inputs))
      fail(&n, fmt::format("{} takes {} inputs (ops.def), got {}", info.name, info.inputs, n.inputs.size()));
    if (info.inputs < 0 && n.inputs.empty()) fail(&n, fmt::format("{} needs at least one input", info.name));
    if (info.outputs >= 0 && n.outputs.size() != static_cast<size_t>(info.outputs))
      fail(&n, fmt::format("{} has {} outputs (ops.def), got {}", info.name, info.outputs, n.outputs.size()));
    if (n.outputs.empty()) fail(&n, "a call defines no values");
  }

  static bool same_type(const Value& a, const Value& b) {
    bool ok = a.dtype == b.dtype && a.sizes.size() == b.sizes.size();
    for (size_t d = 0; ok && d < a.sizes.size(); ++d) ok = equivalent(a.sizes[d], b.sizes[d]);
    return ok;
  }

  /// cond(pred, operands...): two branches whose placeholders take the operands and whose outputs have
  /// the node's output types; each branch is verified as a graph of its own.
  void check_cond(const Node& n) {
    if (n.subgraphs.size() != 2)
      fail(&n, fmt::format("cond needs two subgraphs (true branch, false branch), got {}", n.subgraphs.size()));
    if (n.inputs.empty() || n.inputs[0] == kNoValue) fail(&n, "cond needs a predicate (input 0)");
    const Value& pred = g_.value(n.inputs[0]);
    if (pred.dtype != DType::Bool || !pred.sizes.empty())
      fail(&n, fmt::format("the predicate %{} is {}; cond needs a 0-dim bool (b8[])", pred.name, type_str(pred)));
    for (size_t k = 1; k < n.inputs.size(); ++k)
      if (n.inputs[k] == kNoValue) fail(&n, fmt::format("cond operand {} is None", k - 1));
    static constexpr const char* kBranch[2] = {"true branch", "false branch"};
    std::vector<ValueId> outs[2];
    for (size_t b = 0; b < 2; ++b) {
      const Graph& sub = *n.subgraphs[b];
      try {
        verify(sub, opts_);
      } catch (const CompileError& e) {
        fail(&n, fmt::format("in the {}: {}", kBranch[b], e.what()));
      }
      std::vector<ValueId> ins = sub.inputs();
      if (ins.size() + 1 != n.inputs.size())
        fail(&n, fmt::format("the {} takes {} inputs but cond passes {} operands", kBranch[b], ins.size(), n.inputs.size() - 1));
      for (size_t k = 0; k < ins.size(); ++k) {
        const Value& p = sub.value(ins[k]);
        const Value& a = g_.value(n.inputs[k + 1]);
        if (!same_type(p, a))
          fail(&n, fmt::format("operand {} (%{}) is {} but the {} input %{} is {}", k, a.name, type_str(a), kBranch[b], p.name,
                               type_str(p)));
      }
      outs[b] = sub.outputs();
      if (outs[b].size() != n.outputs.size())
        fail(&n, fmt::format("the {} returns {} outputs, the cond node has {}", kBranch[b], outs[b].size(), n.outputs.size()));
    }
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const Value& t = n.subgraphs[0]->value(outs[0][k]);
      const Value& f = n.subgraphs[1]->value(outs[1][k]);
      if (!same_type(t, f))
        fail(&n, fmt::format("output {} is {} in the true branch and {} in the false branch; both branches must agree", k,
                             type_str(t), type_str(f)));
      const Value& v = g_.value(n.outputs[k]);
      if (!same_type(v, t))
        fail(&n, fmt::format("output {} is recorded as {} but the branches return {}", k, type_str(v), type_str(t)));
    }
  }

  /// call_region(operands...): one body whose placeholders take the operands and whose outputs have
  /// the node's output types; the body is verified as a graph of its own (once per distinct body).
  void check_region(const Node& n) {
    if (n.subgraphs.size() != 1) fail(&n, fmt::format("call_region needs one subgraph (its body), got {}", n.subgraphs.size()));
    const Graph& body = *n.subgraphs[0];
    if (verified_bodies_.insert(&body).second) {
      try {
        verify(body, opts_);
      } catch (const CompileError& e) {
        fail(&n, fmt::format("in the region body: {}", e.what()));
      }
    }
    std::vector<ValueId> ins = body.inputs();
    if (ins.size() != n.inputs.size())
      fail(&n, fmt::format("the region body takes {} inputs but call_region passes {}", ins.size(), n.inputs.size()));
    for (size_t k = 0; k < ins.size(); ++k) {
      if (n.inputs[k] == kNoValue) fail(&n, fmt::format("call_region operand {} is None", k));
      const Value& p = body.value(ins[k]);
      const Value& a = g_.value(n.inputs[k]);
      if (!same_type(p, a))
        fail(&n, fmt::format("operand {} (%{}) is {} but the body input %{} is {}", k, a.name, type_str(a), p.name, type_str(p)));
    }
    std::vector<ValueId> outs = body.outputs();
    if (outs.size() != n.outputs.size())
      fail(&n, fmt::format("the region body returns {} outputs, the call_region node has {}", outs.size(), n.outputs.size()));
    for (size_t k = 0; k < outs.size(); ++k) {
      const Value& b = body.value(outs[k]);
      const Value& v = g_.value(n.outputs[k]);
      if (!same_type(v, b))
        fail(&n, fmt::format("output {} is recorded as {} but the body returns {}", k, type_str(v), type_str(b)));
    }
  }

  void check_constant(const Node& n) {
    const Value& v = g_.value(n.outputs[0]);
    if (n.constant.dtype() != v.dtype || !same_symints(n.constant.sizes(), v.sizes))
      fail(&n, fmt::format("constant data is {}{} but the value type is {}", short_name(n.constant.dtype()),
                           symints_text(n.constant.sizes()), type_str(v)));
  }

  void check_types(const Node& n) {
    if (!ops::meta_fn(n.op)) return;
    std::vector<Tensor> in;
    in.reserve(n.inputs.size());
    for (ValueId v : n.inputs) in.push_back(v == kNoValue ? Tensor() : fake_tensor(g_.value(v)));
    std::vector<TensorMeta> metas;
    try {
      // A scratch ShapeEnv: symbolic arithmetic works, facts decided by ranges alone (s0 != 1) hold,
      // and nothing is recorded in the capture's ShapeEnv. A decision that would need a guard makes
      // the types undecidable here: that node's type check is skipped.
      sym::ShapeEnv scratch;
      sym::ShapeEnvScope scope(scratch);
      metas = ops::run_meta(n.op, in, n.attrs);
    } catch (const sym::DataDependentError&) {
      return;
    } catch (const Error& e) {
      fail(&n, fmt::format("the meta function rejects the input types: {}", e.what()));
    } catch (const std::logic_error&) {
      return;
    } catch (const std::exception& e) {
      fail(&n, fmt::format("the meta function rejects the input types: {}", e.what()));
    }
    if (metas.size() != n.outputs.size())
      fail(&n, fmt::format("the meta function gives {} outputs, the node has {}", metas.size(), n.outputs.size()));
    for (size_t k = 0; k < metas.size(); ++k) {
      const Value& v = g_.value(n.outputs[k]);
      bool ok = metas[k].dtype == v.dtype && metas[k].sizes.size() == v.sizes.size();
      for (size_t d = 0; ok && d < v.sizes.size(); ++d) ok = equivalent(metas[k].sizes[d], v.sizes[d]);
      if (!ok)
        fail(&n, fmt::format("output {} is recorded as {} but the meta function gives {}{}", k, type_str(v),
                             short_name(metas[k].dtype), symints_text(metas[k].sizes)));
    }
  }

  const Graph& g_;
  const VerifyOptions& opts_;
  std::unordered_set<const Graph*> verified_bodies_;  // region bodies shared by several uses
};

}  // namespace

void verify(const Graph& g, const VerifyOptions& options) { Verifier(g, options).run(); }

}  // namespace protean::ir
