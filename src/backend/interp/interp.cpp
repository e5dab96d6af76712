#include "backend/interp/interp.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "core/rethrow.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "ops/dispatch.h"
#include "ops/thread_binding.h"
#include "protean/tensor_version.h"
#include "sym/printer.h"

namespace protean::backend {

using ir::kNoValue;
using ir::Node;
using ir::NodeKind;
using ir::ValueId;

Interpreter::Interpreter(ir::Graph graph, std::vector<sym::Expr> symbols, std::vector<sym::RuntimeAssert> asserts)
    : Interpreter(std::make_shared<const ir::Graph>(std::move(graph)), std::move(symbols), std::move(asserts)) {}

Interpreter::Interpreter(std::shared_ptr<const ir::Graph> graph, std::vector<sym::Expr> symbols,
                         std::vector<sym::RuntimeAssert> asserts)
    : graph_(std::move(graph)), asserts_(std::move(asserts)) {
  for (size_t i = 0; i < symbols.size(); ++i) symbol_index_.emplace(symbols[i], i);
  const ir::Graph& g = *graph_;
  const auto& nodes = g.nodes();
  const size_t nvalues = g.values().size();
  initial_.resize(nvalues);
  // Last step that reads each value; -2 = never read, -3 = a graph output (never released).
  std::vector<int32_t> last_use(nvalues, -2);
  std::vector<int32_t> producer_step(nvalues, -1);
  // Unbacked symbols already bound by an earlier step (the node that defines one binds it; later
  // nodes whose sizes mention it use that value).
  std::unordered_set<sym::Expr> bound;
  std::unordered_map<const ir::Graph*, std::shared_ptr<const Interpreter>> region_bodies;
  for (const Node& n : nodes) {
    switch (n.kind) {
      case NodeKind::Placeholder: {
        const ir::Value& v = g.value(n.outputs[0]);
        input_regs_.push_back(n.outputs[0]);
        input_dtypes_.push_back(v.dtype);
        input_ranks_.push_back(v.sizes.size());
        break;
      }
      case NodeKind::Constant:
        if (!n.constant.defined())
          throw CompileError(fmt::format("interp: constant %{} has no data (a graph parsed from text cannot be "
                                         "run until its constants are filled in)",
                                         g.value(n.outputs[0]).name));
        initial_[static_cast<size_t>(n.outputs[0])] = n.constant;
        break;
      case NodeKind::Call: {
        if (!ops::kernel_fn(n.op) && n.op != ops::OpKind::cond && n.op != ops::OpKind::call_region)
          throw CompileError(fmt::format("interp: op '{}' has no eager kernel", ops::op_name(n.op)));
        Step s;
        s.op = n.op;
        s.where = n.loc.describe();
        int32_t idx = static_cast<int32_t>(steps_.size());
        for (ValueId v : n.inputs) {
          s.in.push_back(v);
          if (v != kNoValue && last_use[static_cast<size_t>(v)] != -3) last_use[static_cast<size_t>(v)] = idx;
        }
        for (ValueId v : n.outputs) {
          const ir::Value& val = g.value(v);
          for (size_t d = 0; d < val.sizes.size(); ++d) {
            const SymInt& sz = val.sizes[d];
            if (sz.is_symbolic() && sz.expr()->is_symbol() && sz.expr()->name.rfind('u', 0) == 0 &&
                !symbol_index_.count(sz.expr()) && bound.insert(sz.expr()).second) {
              s.binds.push_back({static_cast<uint32_t>(s.out.size()), static_cast<uint32_t>(d), false, sz.expr()});
              has_binds_ = true;
            }
          }
          s.out.push_back(v);
          producer_step[static_cast<size_t>(v)] = idx;
        }
        if (n.op == ops::OpKind::cond) {
          if (n.subgraphs.size() != 2 || n.inputs.empty())
            throw CompileError(fmt::format("interp: cond node `{}` needs a predicate and two subgraphs",
                                           ir::print_node(g, n)));
          for (const auto& sub : n.subgraphs) s.branches.push_back(std::make_shared<const Interpreter>(sub, symbols));
        }
        if (n.op == ops::OpKind::call_region) {
          if (n.subgraphs.size() != 1)
            throw CompileError(fmt::format("interp: call_region node `{}` needs one subgraph (its body)", ir::print_node(g, n)));
          // One interpreter per distinct body: every use of a region shares it.
          auto& shared = region_bodies[n.subgraphs[0].get()];
          if (!shared) shared = std::make_shared<const Interpreter>(n.subgraphs[0], symbols);
          s.branches.push_back(shared);
          s.region = true;
        }
        s.attrs = n.attrs;
        // local_scalar_dense's `symbol` attribute names the unbacked symbol its value defines: bound
        // from the output after the step, never substituted into the attributes before it.
        int64_t value_symbol_attr = -1;
        if (n.op == ops::OpKind::local_scalar_dense)
          if (const auto* a = s.attrs.find("symbol"); a && std::holds_alternative<SymInt>(*a)) {
            const SymInt& u = std::get<SymInt>(*a);
            if (u.is_symbolic() && u.expr()->is_symbol() && !symbol_index_.count(u.expr()) && bound.insert(u.expr()).second) {
              s.binds.push_back({0, 0, true, u.expr()});
              has_binds_ = true;
              for (size_t k = 0; k < s.attrs.items().size(); ++k)
                if (s.attrs.items()[k].name == "symbol") value_symbol_attr = static_cast<int64_t>(k);
            }
          }
        const auto& items = s.attrs.items();
        for (uint32_t a = 0; a < items.size(); ++a) {
          if (static_cast<int64_t>(a) == value_symbol_attr) continue;
          if (const auto* si = std::get_if<SymInt>(&items[a].value)) {
            if (si->is_symbolic()) s.sym_attrs.push_back({a, -1, *si});
          } else if (const auto* sv = std::get_if<SymIntVec>(&items[a].value)) {
            for (size_t e = 0; e < sv->size(); ++e)
              if ((*sv)[e].is_symbolic()) s.sym_attrs.push_back({a, static_cast<int32_t>(e), (*sv)[e]});
          }
        }
        steps_.push_back(std::move(s));
        break;
      }
      case NodeKind::Output:
        for (ValueId v : n.inputs) {
          output_regs_.push_back(v);
          last_use[static_cast<size_t>(v)] = -3;
        }
        break;
    }
  }
  // Runtime assertions: each is checked after the step that binds the last of its unbacked symbols
  // (or before the first step when the dispatcher binds all of them).
  for (uint32_t k = 0; k < asserts_.size(); ++k) {
    int64_t after = -1;
    for (sym::Expr f : sym::free_symbols(asserts_[k].expr))
      for (size_t si = 0; si < steps_.size(); ++si)
        for (const Step::Bind& b : steps_[si].binds)
          if (b.symbol == f) after = std::max<int64_t>(after, static_cast<int64_t>(si));
    if (after < 0) asserts_at_start_.push_back(k);
    else steps_[static_cast<size_t>(after)].asserts.push_back(k);
  }
  // Input donation candidates: a graph output made by a step, and a graph input of the same dtype and
  // sizes that is not itself an output and whose last reader is that step or an earlier one.
  for (int32_t o : output_regs_) {
    const int32_t si = producer_step[static_cast<size_t>(o)];
    if (si < 0) continue;
    Step& s = steps_[static_cast<size_t>(si)];
    const ir::Value& ov = g.value(o);
    std::vector<uint32_t> cands;
    for (size_t i = 0; i < input_regs_.size(); ++i) {
      const int32_t r = input_regs_[i];
      const ir::Value& iv = g.value(r);
      const int32_t last = last_use[static_cast<size_t>(r)];
      if (last == -3 || last > si || iv.dtype != ov.dtype || !ir::same_symints(iv.sizes, ov.sizes)) continue;
      cands.push_back(static_cast<uint32_t>(i));
    }
    if (cands.empty()) continue;
    for (uint32_t k = 0; k < s.out.size(); ++k)
      if (s.out[k] == o) s.donors.emplace_back(k, std::move(cands));
  }
  // A value is released after its last reader; one nobody reads is released right after it is made.
  for (size_t v = 0; v < nvalues; ++v) {
    int32_t last = last_use[v];
    if (last >= 0) {
      steps_[static_cast<size_t>(last)].release.push_back(static_cast<int32_t>(v));
      continue;
    }
    if (last != -2) continue;
    const Node& producer = nodes[static_cast<size_t>(g.value(static_cast<ValueId>(v)).node)];
    if (producer.kind == NodeKind::Placeholder) release_inputs_.push_back(static_cast<int32_t>(v));
    if (producer_step[v] >= 0) steps_[static_cast<size_t>(producer_step[v])].release.push_back(static_cast<int32_t>(v));
  }
}

namespace {
/// The value of a cond's predicate (a real 0-dim bool), read without notifying any trace hook.
bool read_predicate(const Tensor& p) {
  if (!p.defined() || p.dtype() != DType::Bool || p.int_numel() != 1)
    throw ValueError("interp: the predicate of a cond must be a bool tensor with one element");
  ops::TraceHookScope no_hook(nullptr);
  return *static_cast<const bool*>(p.data_ptr());
}

int64_t eval(const SymInt& s, const std::function<int64_t(sym::Expr)>& lookup) {
  try {
    return sym::evaluate(s.expr(), lookup);
  } catch (const std::out_of_range&) {
    return ir::evaluate_symint(s, {});  // throws CompileError naming the unbound symbols
  } catch (const std::domain_error&) {
    throw CompileError(fmt::format("interp: size expression {} divides by zero", ir::symint_text(s)));
  }
}
}  // namespace

std::vector<Tensor> Interpreter::run(std::span<const Tensor> inputs, const SymbolValues& syms) const {
  return execute(inputs, [&](sym::Expr e) { return syms.at(e); });
}

std::vector<Tensor> Interpreter::run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values,
                                     std::span<const void* const> donated) const {
  return execute(inputs, [&](sym::Expr e) { return symbol_values[symbol_index_.at(e)]; }, donated);
}

std::vector<Tensor> Interpreter::execute(std::span<const Tensor> inputs, const Lookup& outer,
                                         std::span<const void* const> donated) const {
  // a GEMM or convolution that binds the team keeps it bound for the rest of the run
  ops::TeamBindingScope team_scope;
  const ir::Graph& g = *graph_;
  // Unbacked symbols get their values from the outputs that define them, as the steps run.
  std::vector<std::pair<sym::Expr, int64_t>> unbacked;
  Lookup with_unbacked;
  if (has_binds_)
    with_unbacked = [&](sym::Expr e) -> int64_t {
      for (const auto& [s, v] : unbacked)
        if (s == e) return v;
      return outer(e);
    };
  const Lookup& lookup = has_binds_ ? with_unbacked : outer;
  for (uint32_t k : asserts_at_start_) check_assert(asserts_[k], lookup);
  if (inputs.size() != input_regs_.size())
    throw ValueError(fmt::format("graph '{}' takes {} inputs, got {}", g.name, input_regs_.size(), inputs.size()));
  std::vector<Tensor> regs = initial_;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined() || t.dtype() != input_dtypes_[i] || static_cast<size_t>(t.dim()) != input_ranks_[i])
      throw TypeError(fmt::format("graph '{}' input {} (%{}) should be {} with {} dims, got {}", g.name, i,
                                  g.value(input_regs_[i]).name, short_name(input_dtypes_[i]), input_ranks_[i],
                                  t.defined() ? fmt::format("{} with {} dims", short_name(t.dtype()), t.dim())
                                              : std::string("an undefined tensor")));
    regs[static_cast<size_t>(input_regs_[i])] = t;
  }
  for (int32_t r : release_inputs_) regs[static_cast<size_t>(r)] = Tensor();
  std::vector<Tensor> in;
  std::vector<bool> donor_used(donated.empty() ? 0 : inputs.size(), false);
  // Writes `out` (a graph output made by step s) into the memory of a donated input when that is safe
  // at this point: the input is donated, contiguous and not shared with another input, and no live
  // register (the step's own inputs are already released; `out` is the output's register) views its
  // storage. The output register then holds the input's tensor and the fresh result is freed.
  auto donate = [&](const Step& s, uint32_t k, Tensor& out) {
    for (const auto& [ok, cands] : s.donors) {
      if (ok != k) continue;
      for (uint32_t i : cands) {
        const Tensor& t = inputs[i];
        // host tensors only: the copy below is a memcpy
        if (donor_used[i] || !t.defined() || t.device().type != DeviceType::CPU || out.device().type != DeviceType::CPU ||
            !t.is_contiguous() || t.int_numel() == 0 ||
            std::find(donated.begin(), donated.end(), t.data_ptr()) == donated.end() ||
            t.int_sizes() != out.int_sizes() || t.dtype() != out.dtype() || out.impl()->storage == t.impl()->storage)
          continue;
        bool shared = false;
        for (size_t j = 0; j < inputs.size() && !shared; ++j)
          shared = j != i && inputs[j].defined() && inputs[j].impl()->storage == t.impl()->storage;
        for (size_t r = 0; r < regs.size() && !shared; ++r)
          shared = &regs[r] != &out && regs[r].defined() && regs[r].impl()->storage == t.impl()->storage;
        if (shared) continue;
        const Tensor src = out.is_contiguous() ? out : out.contiguous();
        increment_version(t);  // its bytes are about to be overwritten
        std::memcpy(t.data_ptr(), src.data_ptr(), static_cast<size_t>(t.int_numel()) * t.itemsize());
        donor_used[i] = true;
        out = t;
        return;
      }
    }
  };
  for (const Step& s : steps_) {
    in.clear();
    for (int32_t r : s.in) in.push_back(r < 0 ? Tensor() : regs[static_cast<size_t>(r)]);
    std::vector<Tensor> out;
    if (s.region) {
      out = s.branches[0]->execute(in, lookup);
      for (Tensor& t : out)
        if (!t.is_contiguous()) t = t.contiguous();
    } else if (!s.branches.empty()) {
      const bool taken = read_predicate(in[0]);
      out = s.branches[taken ? 0 : 1]->execute(std::span<const Tensor>(in).subspan(1), lookup);
      for (Tensor& t : out)
        if (!t.is_contiguous()) t = t.contiguous();
    } else {
      const ops::Attrs* attrs = &s.attrs;
      ops::Attrs evaluated;
      if (!s.sym_attrs.empty()) {
        evaluated = s.attrs;
        auto& items = evaluated.items();
        for (const SymAttr& a : s.sym_attrs) {
          int64_t v = eval(a.value, lookup);
          if (a.element < 0)
            items[a.attr].value = SymInt(v);
          else
            std::get<SymIntVec>(items[a.attr].value)[static_cast<size_t>(a.element)] = SymInt(v);
        }
        attrs = &evaluated;
      }
      try {
        out = ops::run_eager(s.op, in, *attrs);
      } catch (const Error& e) {
        core::rethrow_at(e, s.where);
      }
    }
    in.clear();  // drop our references so released registers free their storage now
    if (out.size() != s.out.size())
      throw RuntimeError(fmt::format("interp: {} returned {} results, the graph expects {}", ops::op_name(s.op),
                                     out.size(), s.out.size()));
    for (const Step::Bind& b : s.binds) {
      if (!b.value) {
        unbacked.emplace_back(b.symbol, out[b.out].sizes()[b.dim].hint());
        continue;
      }
      ops::TraceHookScope no_hook(nullptr);  // a read of our own result, not of the user's data
      unbacked.emplace_back(b.symbol, out[b.out].item<int64_t>());
    }
    for (uint32_t k : s.asserts) check_assert(asserts_[k], lookup);
    for (size_t k = 0; k < out.size(); ++k) regs[static_cast<size_t>(s.out[k])] = std::move(out[k]);
    for (int32_t r : s.release) regs[static_cast<size_t>(r)] = Tensor();
    if (!donated.empty())
      for (const auto& d : s.donors) donate(s, d.first, regs[static_cast<size_t>(s.out[d.first])]);
  }
  std::vector<Tensor> result;
  result.reserve(output_regs_.size());
  for (int32_t r : output_regs_) result.push_back(regs[static_cast<size_t>(r)]);
  return result;
}

void Interpreter::check_assert(const sym::RuntimeAssert& a, const Lookup& lookup) const {
  int64_t ok = 0;
  try {
    ok = sym::evaluate(a.expr, lookup);
  } catch (const std::exception& e) {
    throw RuntimeError(fmt::format("graph '{}': cannot evaluate the runtime assertion {} ({}): {}", graph_->name,
                                   sym::print(a.expr), a.message, e.what()));
  }
  if (ok) return;
  std::string values;
  for (sym::Expr f : sym::free_symbols(a.expr)) {
    try {
      values += fmt::format("{}{} = {}", values.empty() ? "" : ", ", f->name, lookup(f));
    } catch (const std::exception&) {
    }
  }
  throw RuntimeError(fmt::format("graph '{}': runtime assertion {} failed for {} ({}{}): a value read at run time "
                                 "breaks a fact the graph was compiled under",
                                 graph_->name, sym::print(a.expr), values, a.message,
                                 a.where.empty() ? "" : ", at " + a.where.describe()));
}

std::vector<Tensor> Interpreter::run(std::span<const Tensor> inputs) const {
  return run(inputs, bind_symbols(*graph_, inputs));
}

SymbolValues bind_symbols(const ir::Graph& g, std::span<const Tensor> inputs) {
  SymbolValues r;
  std::vector<ValueId> ins = g.inputs();
  for (size_t i = 0; i < ins.size() && i < inputs.size(); ++i) {
    const ir::Value& v = g.value(ins[i]);
    if (!inputs[i].defined() || static_cast<size_t>(inputs[i].dim()) != v.sizes.size()) continue;
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      const SymInt& s = v.sizes[d];
      if (s.is_symbolic() && s.expr()->is_symbol()) r.emplace(s.expr(), inputs[i].sizes()[d].hint());
    }
  }
  return r;
}

}  // namespace protean::backend
