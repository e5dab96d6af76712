// protean::onnx::Model: loading (parse → unsupported-op report → constant folding → liveness →
// spatial-alignment analysis) and evaluation (value table, If, error context). See protean/onnx.h.
// An If on a tensor condition under capture becomes a protean::cond (no graph break); otherwise the
// condition is read (a host value: guarded; a tensor: item(), a graph break under capture).
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <typeinfo>
#include <unordered_map>

#include "core/files.h"
#include "core/checked_size.h"
#include "frontends/onnx/loader.h"
#include "frontends/onnx/onnx_ops.h"
#include "core/rethrow.h"
#include "core/source_location.h"
#include "frontends/onnx/regions.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"

namespace protean::onnx {

using detail::Graph;
using detail::Inputs;
using detail::Node;
using detail::Value;

std::string TensorInfo::str() const {
  std::string s = dtype ? std::string(short_name(*dtype)) : std::string(detail::onnx_type_name(onnx_elem_type));
  if (!has_shape) {
    s += "[any shape]";
  } else {
    s += "[";
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i) s += ", ";
      if (dims[i]) s += std::to_string(*dims[i]);
      else s += dim_params[i].empty() ? "?" : dim_params[i];
    }
    s += "]";
  }
  return optional ? "optional(" + s + ")" : s;
}

struct Model::Impl {
  std::string path;
  std::string identity;
  uint64_t hash = 0;
  LoadOptions options;
  detail::ParsedModel pm;
  std::vector<std::string> input_names, output_names;
  std::vector<TensorInfo> inputs, outputs;
  int64_t num_nodes = 0, num_live_nodes = 0;
  int64_t multiple_h = 0, multiple_w = 0;
  std::vector<RegionInfo> regions;
};

namespace {

// ---- evaluation -------------------------------------------------------------------------------------------
struct Scope {
  const Graph* g;
  const Scope* parent;
  std::unordered_map<std::string, Value> vals;
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent) {
      if (auto it = s->vals.find(name); it != s->vals.end()) return &it->second;
      if (auto it = s->g->constants.find(name); it != s->g->constants.end()) return &it->second;
    }
    return nullptr;
  }
};

/// Rethrows the error being handled with `prefix` prepended, keeping its class (core/rethrow.h).
[[noreturn]] void rethrow_with_context(const Error& e, const std::string& prefix) {
  core::rethrow_with_message(e, prefix + e.what());
}

bool truth(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Bools:
      if (v.bools.size() != 1) throw ValueError("If condition must have one element");
      return static_cast<bool>(v.bools[0]);  // a guard under capture
    case Value::Kind::Ints:
      if (v.ints.size() != 1) throw ValueError("If condition must have one element");
      return static_cast<bool>(v.ints[0] != 0);
    case Value::Kind::Tensor:
      if (v.t.numel().hint() != 1) throw ValueError("If condition must have one element");
      return v.t.item<bool>();  // a host read of data: a graph break under capture
    case Value::Kind::Sequence: throw TypeError("If condition is a sequence");
    case Value::Kind::None: break;
  }
  throw ValueError("If condition is undefined");
}

void run_graph(const Graph& g, Scope& scope);

/// A branch output that is not a tensor (a shape value): such an If cannot become a cond.
struct HostValueBranchOutput {};

/// The outputs of branch `br` of If node `n`, run in a scope nested in `scope`.
std::vector<Value> run_branch(const Node& n, const Graph* br, const char* which, Scope& scope) {
  if (!br) throw FormatError(fmt::format("If node {} has no {}", n.label(), which));
  Scope sub{br, &scope, {}};
  run_graph(*br, sub);
  std::vector<Value> outs;
  for (const auto& o : br->outputs) {
    const Value* v = sub.find(o.name);
    if (!v) throw RuntimeError(fmt::format("internal: branch output '{}' not found", o.name));
    outs.push_back(*v);
  }
  return outs;
}

/// A tensor condition under capture: protean::cond with each branch traced into a subgraph (values of
/// the enclosing graphs that a branch reads are lifted as cond operands), so the If costs no graph
/// break and only the taken branch runs. False when the If cannot be a cond (the condition is not one
/// bool element, a branch returns a host shape value, or the branches do not agree); the caller then
/// reads the condition.
bool try_if_as_cond(const Node& n, const Value& c, Scope& scope, std::vector<Value>& result) {
  // A fake (or lazy) tensor exists only while a capture or a segmented recording is active.
  if (!c.is_tensor() || !c.t.is_fake() || c.t.dtype() != DType::Bool) return false;
  for (const SymInt& s : c.t.sizes())
    if (s.is_symbolic() || s.hint() != 1) return false;
  const Graph* then_g = n.get_graph("then_branch");
  const Graph* else_g = n.get_graph("else_branch");
  auto branch = [&](const Graph* br, const char* which) {
    return CondFn([&n, &scope, br, which](const TensorList&) {
      TensorList outs;
      for (Value& v : run_branch(n, br, which, scope)) {
        if (!v.is_tensor()) throw HostValueBranchOutput{};
        outs.push_back(std::move(v.t));
      }
      return outs;
    });
  };
  TensorList outs;
  try {
    outs = cond(c.t, branch(then_g, "then_branch"), branch(else_g, "else_branch"), {});
  } catch (const HostValueBranchOutput&) {
    return false;
  } catch (const CompileError&) {
    throw;  // a graph break inside a branch (its reason names it) or a capture error
  } catch (const Error&) {
    // The branches disagree (ranks, dtypes) or one fails on shapes it would never see when not
    // taken: nothing was recorded yet, so read the condition instead, as eager evaluation does.
    return false;
  }
  for (Tensor& t : outs) result.push_back(Value::tensor(std::move(t)));
  return true;
}

std::vector<Value> run_if(const Node& n, Scope& scope) {
  const Value* c = scope.find(n.inputs.at(0));
  if (!c) throw RuntimeError(fmt::format("internal: value '{}' not found", n.inputs[0]));
  if (std::vector<Value> outs; try_if_as_cond(n, *c, scope, outs)) return outs;
  bool taken = truth(*c);
  const char* which = taken ? "then_branch" : "else_branch";
  return run_branch(n, n.get_graph(which), which, scope);
}

// ---- Loop and Scan: unrolled ---------------------------------------------------------------------------
// A loop body runs once per iteration in its own scope (nested in the caller's, so it reads outer
// values), with its inputs bound to this iteration's values. Under capture the iterations are traced
// one after the other: the trip count and the condition are read on the host (a guard when they derive
// from shapes, a graph break when they are data), so a loop whose count follows the input sizes
// compiles once per count, as a Python loop under torch.compile does.

/// Unrolled loops stop here: a Loop whose condition never turns false would otherwise never return.
constexpr int64_t kMaxLoopIterations = 1 << 16;

int64_t read_count(const Value& v, const std::string& what) {
  if (v.kind == Value::Kind::Ints) {
    if (v.ints.size() != 1) throw ValueError(fmt::format("{} must have one element, got {}", what, v.ints.size()));
    return v.ints[0].guard_int();
  }
  if (!v.is_tensor()) throw TypeError(fmt::format("{} must be an integer tensor, got {}", what, v.describe()));
  if (!is_integral(v.t.dtype()) || v.t.numel().guard_int() != 1)
    throw TypeError(fmt::format("{} must be one integer, got {}", what, v.describe()));
  return reshape(v.t.dtype() == DType::I64 ? v.t : cast(v.t, DType::I64), {}).item<int64_t>();
}

/// Runs `body` with its inputs bound to `args`; returns its outputs.
std::vector<Value> run_body(const Node& n, const Graph& body, std::vector<Value> args, Scope& scope) {
  if (args.size() != body.inputs.size())
    throw FormatError(fmt::format("{} node {}: its body takes {} inputs, the node gives it {}", n.op_type, n.label(),
                                  body.inputs.size(), args.size()));
  Scope sub{&body, &scope, {}};
  for (size_t i = 0; i < args.size(); ++i) sub.vals[body.inputs[i].name] = std::move(args[i]);
  run_graph(body, sub);
  std::vector<Value> outs;
  for (const auto& o : body.outputs) {
    const Value* v = sub.find(o.name);
    if (!v) throw RuntimeError(fmt::format("internal: body output '{}' not found", o.name));
    outs.push_back(*v);
  }
  return outs;
}

/// The per-iteration values of a scan output stacked along `axis` (in iteration order unless
/// `reverse`); with no iteration, an empty tensor of the body's declared element type and sizes.
Tensor stack_scan_output(std::vector<Tensor> parts, int64_t axis, bool reverse, const TensorInfo& declared,
                         const Node& n) {
  if (parts.empty()) {
    if (!declared.dtype || !declared.has_shape)
      throw NotImplementedError(fmt::format("{} node {} ran no iteration, and its body does not declare the "
                                            "element type and rank of scan output '{}'", n.op_type, n.label(),
                                            declared.name));
    IntVec sizes{0};
    for (const auto& d : declared.dims) {
      if (!d)
        throw NotImplementedError(fmt::format("{} node {} ran no iteration, and scan output '{}' has a dynamic dim",
                                              n.op_type, n.label(), declared.name));
      sizes.push_back(*d);
    }
    return zeros(sizes, *declared.dtype);
  }
  if (reverse) std::reverse(parts.begin(), parts.end());
  int64_t rank = parts[0].dim() + 1;
  if (axis < -rank || axis >= rank)
    throw ValueError(fmt::format("{} node {}: scan output axis {} is out of range for rank {}", n.op_type, n.label(),
                                 axis, rank));
  return stack(parts, axis < 0 ? axis + rank : axis);
}

std::vector<Value> run_loop(const Node& n, Scope& scope) {
  const Graph* body = n.get_graph("body");
  if (!body) throw FormatError(fmt::format("Loop node {} has no body", n.label()));
  auto input = [&](size_t i) -> const Value* {
    if (!n.has_input(i)) return nullptr;
    const Value* v = scope.find(n.inputs[i]);
    if (!v) throw RuntimeError(fmt::format("internal: value '{}' not found", n.inputs[i]));
    return v;
  };
  std::optional<int64_t> trip;
  if (const Value* m = input(0)) trip = read_count(*m, fmt::format("Loop node {}'s trip count M", n.label()));
  bool go = true;
  if (const Value* c = input(1)) go = truth(*c);
  size_t num_carried = n.inputs.size() > 2 ? n.inputs.size() - 2 : 0;
  if (body->inputs.size() != num_carried + 2 || body->outputs.size() < num_carried + 1)
    throw FormatError(fmt::format("Loop node {}: {} loop-carried values, but its body takes {} inputs and returns {} "
                                  "outputs (expected {} and at least {})", n.label(), num_carried,
                                  body->inputs.size(), body->outputs.size(), num_carried + 2, num_carried + 1));
  size_t num_scan = body->outputs.size() - num_carried - 1;
  std::vector<Value> carried;
  for (size_t i = 0; i < num_carried; ++i) {
    const Value* v = input(2 + i);
    if (!v) throw FormatError(fmt::format("Loop node {}: loop-carried value {} is missing", n.label(), i));
    carried.push_back(*v);
  }
  std::vector<std::vector<Tensor>> scans(num_scan);
  int64_t i = 0;
  for (; go && (!trip || i < *trip); ++i) {
    if (i >= kMaxLoopIterations)
      throw NotImplementedError(fmt::format("Loop node {} ran {} iterations without stopping: loops are unrolled, "
                                            "at most {} iterations", n.label(), i, kMaxLoopIterations));
    std::vector<Value> args;
    args.push_back(Value::host_ints({SymInt(i)}, DType::I64, /*scalar=*/true));
    args.push_back(Value::host_bools({SymBool(true)}, /*scalar=*/true));
    for (auto& v : carried) args.push_back(std::move(v));
    std::vector<Value> outs = run_body(n, *body, std::move(args), scope);
    go = truth(outs[0]);
    for (size_t k = 0; k < num_carried; ++k) carried[k] = std::move(outs[1 + k]);
    for (size_t k = 0; k < num_scan; ++k) scans[k].push_back(detail::as_tensor(outs[1 + num_carried + k]));
  }
  std::vector<Value> result = std::move(carried);
  for (size_t k = 0; k < num_scan; ++k)
    result.push_back(Value::tensor(stack_scan_output(std::move(scans[k]), 0, false,
                                                     body->outputs[1 + num_carried + k], n)));
  return result;
}

/// Scan (opset 9 and later): `num_states` states then the scan inputs, no batch dim.
std::vector<Value> scan_once(const Node& n, const Graph& body, std::vector<Value> states,
                             const std::vector<Tensor>& xs, Scope& scope) {
  size_t num_states = states.size(), num_in = xs.size();
  IntVec in_axes = n.get_ints("scan_input_axes", IntVec(num_in, 0));
  IntVec in_dirs = n.get_ints("scan_input_directions", IntVec(num_in, 0));
  if (in_axes.size() != num_in || in_dirs.size() != num_in)
    throw FormatError(fmt::format("Scan node {}: {} scan inputs, but scan_input_axes/directions have {}/{} entries",
                                  n.label(), num_in, in_axes.size(), in_dirs.size()));
  if (body.inputs.size() != num_states + num_in || body.outputs.size() < num_states)
    throw FormatError(fmt::format("Scan node {}: {} states and {} scan inputs, but its body takes {} inputs and returns "
                                  "{} outputs", n.label(), num_states, num_in, body.inputs.size(), body.outputs.size()));
  size_t num_out = body.outputs.size() - num_states;
  IntVec out_axes = n.get_ints("scan_output_axes", IntVec(num_out, 0));
  IntVec out_dirs = n.get_ints("scan_output_directions", IntVec(num_out, 0));
  if (out_axes.size() != num_out || out_dirs.size() != num_out)
    throw FormatError(fmt::format("Scan node {}: {} scan outputs, but scan_output_axes/directions have {}/{} entries",
                                  n.label(), num_out, out_axes.size(), out_dirs.size()));
  std::optional<int64_t> len;
  for (size_t j = 0; j < num_in; ++j) {
    int64_t r = xs[j].dim();
    if (in_axes[j] < -r || in_axes[j] >= r)
      throw ValueError(fmt::format("Scan node {}: scan input {} has rank {}, axis {} is out of range", n.label(), j, r,
                                   in_axes[j]));
    if (in_axes[j] < 0) in_axes[j] += r;
    int64_t l = xs[j].size(in_axes[j]).guard_int();  // the iteration count: a guard on a dynamic size
    if (len && *len != l)
      throw ValueError(fmt::format("Scan node {}: scan inputs have different lengths ({} and {})", n.label(), *len, l));
    len = l;
  }
  if (!len) throw FormatError(fmt::format("Scan node {} has no scan input", n.label()));
  if (*len > kMaxLoopIterations)
    throw NotImplementedError(fmt::format("Scan node {} would run {} iterations: loops are unrolled, at most {}",
                                          n.label(), *len, kMaxLoopIterations));
  std::vector<std::vector<Tensor>> scans(num_out);
  for (int64_t t = 0; t < *len; ++t) {
    std::vector<Value> args = std::move(states);
    for (size_t j = 0; j < num_in; ++j)
      args.push_back(Value::tensor(select(xs[j], in_axes[j], SymInt(in_dirs[j] ? *len - 1 - t : t))));
    std::vector<Value> outs = run_body(n, body, std::move(args), scope);
    states.assign(std::make_move_iterator(outs.begin()), std::make_move_iterator(outs.begin() + static_cast<long>(num_states)));
    for (size_t k = 0; k < num_out; ++k) scans[k].push_back(detail::as_tensor(outs[num_states + k]));
  }
  std::vector<Value> result = std::move(states);
  for (size_t k = 0; k < num_out; ++k)
    result.push_back(Value::tensor(
        stack_scan_output(std::move(scans[k]), out_axes[k], out_dirs[k] != 0, body.outputs[num_states + k], n)));
  return result;
}

std::vector<Value> run_scan(const Node& n, Scope& scope) {
  const Graph* body = n.get_graph("body");
  if (!body) throw FormatError(fmt::format("Scan node {} has no body", n.label()));
  int64_t num_in = n.get_int("num_scan_inputs", -1);
  bool batched = n.opset < 9;  // Scan-8: an optional sequence_lens first, every input with a batch dim
  size_t first = batched ? 1 : 0;
  if (num_in < 1 || static_cast<size_t>(num_in) > n.inputs.size() - first)
    throw FormatError(fmt::format("Scan node {}: num_scan_inputs {} does not fit its {} inputs", n.label(), num_in,
                                  n.inputs.size()));
  size_t num_states = n.inputs.size() - first - static_cast<size_t>(num_in);
  std::vector<Value> states;
  std::vector<Tensor> xs;
  for (size_t i = first; i < n.inputs.size(); ++i) {
    const Value* v = n.inputs[i].empty() ? nullptr : scope.find(n.inputs[i]);
    if (!v) throw FormatError(fmt::format("Scan node {}: input {} is missing", n.label(), i));
    if (i - first < num_states) states.push_back(*v);
    else xs.push_back(detail::as_tensor(*v));
  }
  if (!batched) return scan_once(n, *body, std::move(states), xs, scope);
  if (n.get_ints("scan_input_axes", {}).size() || n.get_ints("scan_output_axes", {}).size())
    throw FormatError(fmt::format("Scan node {} (opset {}) has axes attributes, which came with opset 9", n.label(),
                                  n.opset));
  // Scan-8 names the input directions `directions`; each batch entry is one opset-9 scan over axis 0.
  Node inner = n;
  if (const detail::Attr* d = n.attr("directions")) inner.attrs["scan_input_directions"] = *d;
  int64_t batch = -1;
  for (const Tensor& x : xs) {
    if (x.dim() < 2) throw ValueError(fmt::format("Scan node {} (opset 8): a scan input needs a batch and a sequence dim", n.label()));
    int64_t b = x.size(0).guard_int();
    if (batch >= 0 && b != batch) throw ValueError(fmt::format("Scan node {}: batch sizes differ", n.label()));
    batch = b;
  }
  if (n.has_input(0)) {
    const Value* sl = scope.find(n.inputs[0]);
    if (!sl) throw RuntimeError(fmt::format("internal: value '{}' not found", n.inputs[0]));
    int64_t full = xs[0].size(1).guard_int();
    Tensor lens = detail::as_tensor(*sl);
    for (int64_t l : cast(lens, DType::I64).contiguous().to_vector<int64_t>())
      if (l != full)
        throw NotImplementedError(fmt::format("Scan node {}: sequence_lens {} shorter than the sequence ({}) is not "
                                              "supported", n.label(), l, full));
  }
  if (batch < 1)
    throw NotImplementedError(fmt::format("Scan node {} (opset 8) with an empty batch", n.label()));
  std::vector<std::vector<Tensor>> per_output;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<Value> st;
    for (const Value& s : states) st.push_back(Value::tensor(select(detail::as_tensor(s), 0, SymInt(b))));
    std::vector<Tensor> xb;
    for (const Tensor& x : xs) xb.push_back(select(x, 0, SymInt(b)));
    std::vector<Value> outs = scan_once(inner, *body, std::move(st), xb, scope);
    per_output.resize(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(detail::as_tensor(outs[k]));
  }
  std::vector<Value> result;
  for (auto& parts : per_output) result.push_back(Value::tensor(stack(parts, 0)));
  return result;
}

/// The constants of the top-level graph, seen from a region body traced on its own (no caller values).
const Graph* constants_of(const Scope& scope) {
  const Scope* s = &scope;
  while (s->parent) s = s->parent;
  return s->g;
}

/// A use of a repeated block (regions.h): a region under a capture with auto regions, else its nodes
/// run inline in a nested scope.
std::vector<Value> run_region(const Node& n, Scope& scope) {
  const detail::RegionUse& u = *n.region;
  std::vector<const Value*> in;
  bool tensors = true;
  for (const auto& name : n.inputs) {
    const Value* v = scope.find(name);
    if (!v) throw RuntimeError(fmt::format("internal: value '{}' not found", name));
    tensors &= v->is_tensor() && v->t.defined();
    in.push_back(v);
  }
  auto outputs_of = [&](Scope& sub) {
    std::vector<Value> outs;
    for (const auto& o : n.outputs) {
      const Value* v = sub.find(o);
      if (!v) throw RuntimeError(fmt::format("internal: region output '{}' not computed", o));
      outs.push_back(*v);
    }
    return outs;
  };
  if (tensors && protean::detail::region_capture_active()) {
    std::vector<protean::detail::ArgValue> args;
    // Contiguous arguments: a use whose input is a view (a transpose) would otherwise need a body of
    // its own (the region key holds the strides).
    for (const Value* v : in) args.push_back(protean::detail::ArgConv<Tensor>::to(v->t.is_contiguous() ? v->t : v->t.contiguous()));
    const Graph* top = constants_of(scope);
    protean::detail::Body body = [&](std::span<const protean::detail::ArgValue> a) {
      Scope root{top, nullptr, {}};
      Scope sub{u.body.get(), &root, {}};
      for (size_t i = 0; i < n.inputs.size(); ++i) sub.vals[n.inputs[i]] = Value::tensor(a[i].tensor);
      // The weights as the module's tensors: what the use passes as its parameters.
      const auto weights = u.module->named_buffers();
      for (size_t i = 0; i < u.weights.size(); ++i) sub.vals[u.weights[i]] = Value::tensor(weights.at(i).second);
      run_graph(*u.body, sub);
      std::vector<protean::detail::OutValue> outs;
      for (const Value& v : outputs_of(sub)) {
        if (!v.is_tensor()) throw protean::detail::InlineRegion{fmt::format("an output is a {}", v.describe())};
        protean::detail::OutValue o;
        o.tensor = v.t;
        outs.push_back(std::move(o));
      }
      return outs;
    };
    std::vector<protean::detail::OutValue> outs;
    if (protean::detail::auto_region_call(*u.module, u.type, u.site, body, args, outs)) {
      std::vector<Value> r;
      for (auto& o : outs) r.push_back(Value::tensor(std::move(o.tensor)));
      return r;
    }
  }
  Scope sub{u.body.get(), &scope, {}};
  run_graph(*u.body, sub);
  return outputs_of(sub);
}

std::vector<Value> run_node(const Node& n, Scope& scope) {
  if (n.region) return run_region(n, scope);
  if (n.op_type == "If") return run_if(n, scope);
  if (n.op_type == "Loop") return run_loop(n, scope);
  if (n.op_type == "Scan") return run_scan(n, scope);
  if (n.op_type == "Constant") return {detail::constant_value(n)};
  Inputs in(n.inputs.size(), nullptr);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (n.inputs[i].empty()) continue;
    in[i] = scope.find(n.inputs[i]);
    if (!in[i]) throw RuntimeError(fmt::format("internal: value '{}' not found", n.inputs[i]));
  }
  detail::check_sequence_inputs(n, in);
  return n.fn(n, in);
}

void run_graph(const Graph& g, Scope& scope) {
  for (const Node& n : g.nodes) {
    std::vector<Value> outs;
    try {
      core::FrontendProvenanceScope provenance(core::SourceLocation{fmt::format("onnx node {}", n.label()), 0, ""});
      outs = run_node(n, scope);
    } catch (const Error& e) {
      rethrow_with_context(e, fmt::format("while running node {}: ", n.label()));
    }
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (n.outputs[i].empty()) continue;
      if (i >= outs.size())
        throw NotImplementedError(fmt::format("node {}: output {} ('{}') is not produced by this importer",
                                              n.label(), i, n.outputs[i]));
      scope.vals[n.outputs[i]] = std::move(outs[i]);
    }
    for (const auto& name : n.frees) scope.vals.erase(name);
  }
}

// ---- load-time passes ------------------------------------------------------------------------------------
int64_t count_nodes(const Graph& g) {
  int64_t c = 0;
  for (const auto& n : g.nodes) {
    ++c;
    for (const auto& [k, a] : n.attrs)
      if (a.g) c += count_nodes(*a.g);
  }
  return c;
}

/// Resolves op evaluators; collects every unsupported op type / feature (recursively). `carried`: the
/// values of carried ONNX types seen so far (detail::check_carried_types).
void resolve_ops(Graph& g, std::map<std::string, std::vector<std::string>>& unsupported,
                 std::unordered_map<std::string, int32_t> carried = {}) {
  for (const auto& in : g.inputs)
    if (detail::is_carried_type(in.onnx_elem_type)) carried[in.name] = in.onnx_elem_type;
  for (const auto& [name, t] : g.carried) carried[name] = t;
  for (auto& n : g.nodes) {
    if (std::string why = detail::check_carried_types(n, carried); !why.empty())
      unsupported[fmt::format("{} with {}", n.op_type, why)].push_back(n.name);
    std::string key;
    if (!n.domain.empty() && n.domain != "ai.onnx") {
      key = fmt::format("{} (domain '{}')", n.op_type, n.domain);
    } else if (const detail::OpDef* def = detail::find_op(n.op_type)) {
      n.fn = def->fn;
      std::string why = def->check ? def->check(n) : "";
      if (!why.empty()) key = fmt::format("{} with {}", n.op_type, why);
    } else {
      key = n.op_type;
    }
    if (!key.empty()) unsupported[key].push_back(n.name);
    if (n.op_type == "If" && key.empty()) {
      if (!n.get_graph("then_branch") || !n.get_graph("else_branch"))
        unsupported["If without both branches"].push_back(n.name);
    }
    for (auto& [k, a] : n.attrs)
      if (a.g) resolve_ops(*a.g, unsupported, carried);
  }
}

const Value* find_const(const std::vector<const Graph*>& chain, const std::string& name) {
  for (auto it = chain.rbegin(); it != chain.rend(); ++it)
    if (auto c = (*it)->constants.find(name); c != (*it)->constants.end()) return &c->second;
  return nullptr;
}

// Folding runs ops eagerly on the host while the model loads; a ConstantOfShape larger than this is
// left to the graph (a FakeTensor at capture, allocated only when the model runs).
constexpr int64_t kMaxFoldedElements = int64_t{1} << 22;
// The general bound: while a node is folded no host allocation may exceed this (core::
// HostAllocationLimit), and a folded value above it (a broadcast view of a small buffer counts at its
// full size) is discarded: the node stays in the graph and runs with the model.
constexpr uint64_t kMaxFoldedBytes = uint64_t{64} << 20;

bool small_folded_value(const Value& v) {
  if (v.kind != Value::Kind::Tensor || !v.t.defined() || v.t.is_fake()) return true;
  uint64_t bytes = v.t.itemsize();
  for (int64_t d : v.t.int_sizes())
    if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) || bytes > kMaxFoldedBytes) return false;
  return true;
}

bool small_constant_shape(const Value& shape) {
  if (shape.kind != Value::Kind::Ints && !(shape.kind == Value::Kind::Tensor && shape.t.defined() && !shape.t.is_fake()))
    return false;
  IntVec dims;
  if (shape.kind == Value::Kind::Ints) {
    for (const SymInt& d : shape.ints) {
      if (d.is_symbolic()) return false;
      dims.push_back(d.hint());
    }
  } else {
    if (shape.t.dim() > 1 || !is_integral(shape.t.dtype())) return false;
    dims = shape.t.to(DType::I64).contiguous().to_vector<int64_t>();
  }
  int64_t n = 1;
  for (int64_t d : dims)
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxFoldedElements) return false;
  return true;
}

/// Evaluates Constant nodes and nodes whose inputs are all constants; removes them from the graph.
void fold_constants(Graph& g, std::vector<const Graph*>& chain, bool fold_all) {
  chain.push_back(&g);
  std::vector<Node> kept;
  for (auto& n : g.nodes) {
    if (n.op_type == "Constant") {
      g.constants[n.outputs.at(0)] = detail::constant_value(n);
      continue;
    }
    if (n.op_type == "If") {
      for (auto& [k, a] : n.attrs)
        if (a.g) fold_constants(*a.g, chain, fold_all);
    }
    bool foldable = fold_all && n.fn && n.captured.empty();
    Inputs in(n.inputs.size(), nullptr);
    for (size_t i = 0; foldable && i < n.inputs.size(); ++i) {
      if (n.inputs[i].empty()) continue;
      in[i] = find_const(chain, n.inputs[i]);
      foldable = in[i] != nullptr;
    }
    if (foldable && n.op_type == "ConstantOfShape" && !in.empty() && in[0] && !small_constant_shape(*in[0]))
      foldable = false;
    if (foldable) {
      try {
        detail::check_sequence_inputs(n, in);
        std::vector<Value> outs;
        {
          core::HostAllocationLimit limit(kMaxFoldedBytes, "load-time constant folding");
          outs = n.fn(n, in);
        }
        bool complete = true;
        for (size_t i = 0; i < n.outputs.size(); ++i)
          complete &= n.outputs[i].empty() || (i < outs.size() && small_folded_value(outs[i]));
        if (complete) {
          for (size_t i = 0; i < n.outputs.size(); ++i)
            if (!n.outputs[i].empty()) g.constants[n.outputs[i]] = std::move(outs[i]);
          continue;
        }
      } catch (const Error&) {
        // Left for run time (e.g. a dead If branch that only fails on the values it would never see).
      }
    }
    kept.push_back(std::move(n));
  }
  g.nodes = std::move(kept);
  chain.pop_back();
}

/// Fills Node::frees: values produced in this graph (or its inputs) are dropped after their last use.
void compute_liveness(Graph& g) {
  std::unordered_map<std::string, size_t> last;
  std::set<std::string> keep;
  for (const auto& o : g.outputs) keep.insert(o.name);
  std::set<std::string> local;
  for (const auto& in : g.inputs) local.insert(in.name);
  for (const auto& n : g.nodes)
    for (const auto& o : n.outputs)
      if (!o.empty()) local.insert(o);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    for (const auto& in : n.inputs) if (local.count(in)) last[in] = i;
    for (const auto& in : n.captured) if (local.count(in)) last[in] = i;
    for (auto& [k, a] : n.attrs)
      if (a.g) compute_liveness(*a.g);
    if (n.region) compute_liveness(*n.region->body);
  }
  // Outputs nobody reads are freed right after they are produced.
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs)
      if (!o.empty() && !last.count(o)) last[o] = i;
  for (auto& n : g.nodes) n.frees.clear();
  for (const auto& [name, i] : last)
    if (!keep.count(name)) g.nodes[i].frees.push_back(name);
}

/// The FPN rule: tracks, per value, the cumulative spatial stride w.r.t. the rank-4 inputs and the
/// largest stride on any path into it; a merge (elementwise op or Concat) of equal-stride values whose
/// largest strides differ (one was downsampled further, then upsampled) requires the inputs' H/W to be
/// multiples of that largest stride. Returns {multiple_h, multiple_w} (0 = no constraint).
std::pair<int64_t, int64_t> spatial_alignment(const Graph& g) {
  struct St { double h, w, mh, mw; };
  std::unordered_map<std::string, St> st;
  for (const auto& in : g.inputs)
    if (in.has_shape && in.dims.size() == 4 && in.dtype && is_floating(*in.dtype)) st[in.name] = {1, 1, 1, 1};
  if (st.empty()) return {0, 0};
  double need_h = 0, need_w = 0;
  auto const_floats = [&](const std::string& name) -> std::vector<double> {
    auto it = g.constants.find(name);
    if (it == g.constants.end() || !it->second.is_tensor() || it->second.t.is_fake()) return {};
    return it->second.t.to_vector<double>();
  };
  static const std::set<std::string> kPassThrough = {
      "Relu", "Sigmoid", "Clip", "HardSigmoid", "HardSwish", "BatchNormalization", "Identity", "Tanh",
      "Add", "Sub", "Mul", "Div", "Concat", "Pow", "Sqrt", "Exp", "Neg", "Abs", "Erf", "Max", "Min", "Sum"};
  for (const auto& n : g.nodes) {
    std::vector<St> ins;
    for (const auto& i : n.inputs)
      if (auto it = st.find(i); it != st.end()) ins.push_back(it->second);
    if (ins.empty() || n.outputs.empty()) continue;
    St o = ins[0];
    if (n.op_type == "Conv" || n.op_type == "MaxPool" || n.op_type == "AveragePool") {
      IntVec s = n.get_ints("strides", {1, 1});
      if (s.size() != 2) continue;
      o.h *= s[0];
      o.w *= s[1];
      o.mh = std::max(o.mh, o.h);
      o.mw = std::max(o.mw, o.w);
    } else if (n.op_type == "ConvTranspose") {
      IntVec s = n.get_ints("strides", {1, 1});
      if (s.size() != 2) continue;
      o.h /= s[0];
      o.w /= s[1];
    } else if (n.op_type == "Resize") {
      std::vector<double> sc = n.inputs.size() > 2 ? const_floats(n.inputs[2]) : std::vector<double>{};
      if (n.opset < 11 && n.inputs.size() > 1) sc = const_floats(n.inputs[1]);
      if (sc.size() != 4 || sc[2] <= 0 || sc[3] <= 0) continue;
      o.h /= sc[2];
      o.w /= sc[3];
    } else if (kPassThrough.count(n.op_type)) {
      for (const auto& x : ins) {
        if (std::abs(x.h - o.h) > 1e-9 || std::abs(x.w - o.w) > 1e-9) continue;
        if (x.mh != o.mh) need_h = std::max({need_h, x.mh, o.mh});
        if (x.mw != o.mw) need_w = std::max({need_w, x.mw, o.mw});
        o.mh = std::max(o.mh, x.mh);
        o.mw = std::max(o.mw, x.mw);
      }
    } else {
      continue;  // GlobalAveragePool, Reshape, MatMul ...: no spatial correspondence any more
    }
    st[n.outputs[0]] = o;
  }
  return {static_cast<int64_t>(std::llround(need_h)), static_cast<int64_t>(std::llround(need_w))};
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw RuntimeError(fmt::format("ONNX model '{}' is a directory; pass the .onnx file", path));
  // Only a regular file: a FIFO or a pipe (`<(cat m.onnx)`) would block or read as unreadable; the
  // error says which it is. A protobuf message is at most 2 GiB (larger models keep their weights in
  // external data files), so a larger file is refused before it is read into memory.
  constexpr uint64_t kMaxProtobufBytes = (uint64_t{2} << 30) - 1;
  const uint64_t size = std::filesystem::is_regular_file(path, ec) ? std::filesystem::file_size(path, ec) : 0;
  if (!ec && size > kMaxProtobufBytes)
    throw RuntimeError(fmt::format("ONNX model '{}' has {} bytes; a protobuf message (an .onnx file) is at most 2 GiB, "
                                   "so this is not an ONNX model (a model with larger weights keeps them in external "
                                   "data files beside it)",
                                   path, size));
  return core::read_regular_file(path, "ONNX model", kMaxProtobufBytes);
}

/// "opset 13", or "opset 6, upgraded to 13" for a model the version converter upgraded.
std::string opset_text(const detail::ParsedModel& pm) {
  if (pm.opset == 0) return "no default-domain opset";
  if (pm.original_opset == pm.opset) return fmt::format("opset {}", pm.opset);
  return fmt::format("opset {}, upgraded to {}", pm.original_opset, pm.opset);
}

std::string describe_inputs(const std::vector<TensorInfo>& infos) {
  std::string s;
  for (size_t i = 0; i < infos.size(); ++i) s += (i ? ", " : "") + infos[i].name + ": " + infos[i].str();
  return s;
}

}  // namespace

// ---- Model -------------------------------------------------------------------------------------------------
Model::Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const std::string& Model::path() const { return impl_->path; }
const std::string& Model::identity() const { return impl_->identity; }
uint64_t Model::content_hash() const { return impl_->hash; }
const std::string& Model::graph_name() const { return impl_->pm.graph->name; }
int64_t Model::opset() const { return impl_->pm.original_opset; }
int64_t Model::ir_version() const { return impl_->pm.ir_version; }
const std::string& Model::producer() const { return impl_->pm.producer; }
const std::vector<std::string>& Model::input_names() const { return impl_->input_names; }
const std::vector<std::string>& Model::output_names() const { return impl_->output_names; }
const std::vector<TensorInfo>& Model::inputs() const { return impl_->inputs; }
const std::vector<TensorInfo>& Model::outputs() const { return impl_->outputs; }
int64_t Model::num_nodes() const { return impl_->num_nodes; }
int64_t Model::num_live_nodes() const { return impl_->num_live_nodes; }
int64_t Model::spatial_multiple() const { return std::max(impl_->multiple_h, impl_->multiple_w); }
const std::vector<RegionInfo>& Model::regions() const { return impl_->regions; }

std::vector<Tensor> Model::forward(const std::vector<Tensor>& inputs,
                                   const std::map<std::string, SymInt>& scalar_inputs) const {
  const Impl& m = *impl_;
  const Graph& g = *m.pm.graph;
  for (const auto& [name, v] : scalar_inputs) {
    auto it = std::find(m.input_names.begin(), m.input_names.end(), name);
    if (it == m.input_names.end())
      throw ValueError(fmt::format("ONNX model '{}': scalar input '{}' is not an input of the model (inputs: {})",
                                   m.path, name, describe_inputs(m.inputs)));
    const TensorInfo& info = m.inputs[it - m.input_names.begin()];
    if ((info.has_shape && !info.dims.empty()) || (info.dtype && !is_integral(*info.dtype)))
      throw ValueError(fmt::format("ONNX model '{}': input '{}' is declared {}; only rank-0 integer inputs can be "
                                   "passed as host scalars", m.path, name, info.str()));
  }
  size_t expected = m.input_names.size() - scalar_inputs.size();
  if (inputs.size() != expected)
    throw ValueError(fmt::format("ONNX model '{}' takes {} tensor input(s) ({}), got {}", m.path, expected,
                                 describe_inputs(m.inputs), inputs.size()));
  Scope scope{&g, nullptr, {}};
  size_t k = 0;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    const TensorInfo& info = m.inputs[i];
    if (auto it = scalar_inputs.find(info.name); it != scalar_inputs.end()) {
      scope.vals[info.name] = Value::host_ints({it->second}, info.dtype.value_or(DType::I64), true);
      continue;
    }
    Tensor t = inputs[k++];
    auto bad = [&](const std::string& what) {
      throw ValueError(fmt::format("ONNX model '{}': input '{}' is declared {}, got {}: {}", m.path, info.name,
                                   info.str(), t.defined() ? fmt::format("{}{}", short_name(t.dtype()),
                                                                         to_string(t.sizes())) : "an undefined tensor",
                                   what));
    };
    if (!t.defined()) {
      if (!info.optional) bad("undefined tensor (only an input declared optional takes the empty optional)");
      scope.vals[info.name] = Value();  // the empty optional
      continue;
    }
    if (m.options.float_dtype != DType::F32 && info.dtype == m.options.float_dtype && t.dtype() == DType::F32)
      t = cast(t, m.options.float_dtype);  // LoadOptions::float_dtype
    if (info.dtype && t.dtype() != *info.dtype) bad("wrong dtype");
    if (info.has_shape) {
      if (t.dim() != static_cast<int64_t>(info.dims.size())) bad("wrong rank");
      for (size_t d = 0; d < info.dims.size(); ++d)
        if (info.dims[d] && static_cast<bool>(t.size(static_cast<int64_t>(d)) != *info.dims[d]))
          bad(fmt::format("dim {} must be {}", d, *info.dims[d]));
    }
    if (m.options.check_spatial_alignment && t.dim() == 4 && is_floating(t.dtype())) {
      for (int d = 2; d < 4; ++d) {
        int64_t mult = d == 2 ? m.multiple_h : m.multiple_w;
        if (mult > 1 && static_cast<bool>(t.size(d) % mult != 0))
          throw ValueError(fmt::format(
              "ONNX model '{}': input '{}' has shape {}, but its {} (dim {}) must be a multiple of {}: the model "
              "downsamples it {}x and merges the upsampled feature maps with finer ones (declared {})",
              m.path, info.name, to_string(t.sizes()), d == 2 ? "height" : "width", d, mult, mult, info.str()));
      }
    }
    if (m.options.scalar_inputs_as_host && t.dim() == 0 && is_integral(t.dtype()) && !t.is_fake()) {
      scope.vals[info.name] = Value::host_ints({SymInt(t.item<int64_t>())}, t.dtype(), true);
      continue;
    }
    scope.vals[info.name] = Value::tensor(t);
  }
  std::vector<Value> given;  // the inputs as passed (the scope frees them after their last use)
  for (const auto& info : m.inputs) given.push_back(scope.vals[info.name]);
  try {
    run_graph(g, scope);
  } catch (const Error& e) {
    // Name the model and the input shapes, so a shape the model cannot take points back at the input.
    std::string shapes;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      shapes += fmt::format("{}{} {}", i ? ", " : "", m.inputs[i].name, given[i].describe());
    }
    rethrow_with_context(e, fmt::format("ONNX model '{}' on inputs ({}): ", m.path, shapes));
  }
  std::vector<Tensor> outs;
  for (const auto& o : g.outputs) {
    const Value* v = scope.find(o.name);
    if (!v) throw RuntimeError(fmt::format("internal: output '{}' not computed", o.name));
    if (v->kind == Value::Kind::None) {
      auto it = std::find(m.output_names.begin(), m.output_names.end(), o.name);
      if (it != m.output_names.end() && m.outputs[static_cast<size_t>(it - m.output_names.begin())].optional) {
        outs.emplace_back();  // an empty optional output
        continue;
      }
      throw ValueError(fmt::format("ONNX model '{}': output '{}' is an empty optional, but the model declares it "
                                   "a tensor", m.path, o.name));
    }
    outs.push_back(detail::as_tensor(*v));
  }
  return outs;
}

std::map<std::string, Tensor> Model::run(const std::map<std::string, Tensor>& inputs) const {
  std::vector<Tensor> in;
  for (const auto& [name, t] : inputs)
    if (std::find(impl_->input_names.begin(), impl_->input_names.end(), name) == impl_->input_names.end())
      throw ValueError(fmt::format("ONNX model '{}' has no input '{}' (inputs: {})", impl_->path, name,
                                   describe_inputs(impl_->inputs)));
  for (const auto& name : impl_->input_names) {
    auto it = inputs.find(name);
    if (it == inputs.end())
      throw ValueError(fmt::format("ONNX model '{}': input '{}' is missing (inputs: {})", impl_->path, name,
                                   describe_inputs(impl_->inputs)));
    in.push_back(it->second);
  }
  std::vector<Tensor> out = forward(in);
  std::map<std::string, Tensor> r;
  for (size_t i = 0; i < out.size(); ++i) r[impl_->output_names[i]] = out[i];
  return r;
}

// ---- loading -------------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kOnnxFloat = 1;  // TensorProto.DataType FLOAT

Tensor retyped(const Tensor& t, DType to) {
  return t.defined() && t.dtype() == DType::F32 ? cast(t, to).contiguous() : t;
}

/// LoadOptions::device: large tensor constants of `g` and its subgraphs move to `device` once.
void move_constants(Graph& g, Device device) {
  for (auto& [name, v] : g.constants)
    if (v.is_tensor() && v.t.defined() && !v.t.is_fake() && v.t.int_numel() >= kDeviceConstantElements)
      v.t = v.t.contiguous().to(device);
  for (Node& n : g.nodes)
    for (auto& [k, a] : n.attrs)
      if (a.g) move_constants(*a.g, device);
}

/// LoadOptions::float_dtype: float32 initializers, constants, casts and declared inputs/outputs of
/// `g` and its subgraphs become `to` (before constant folding, so folded values are computed in it).
void retype_floats(Graph& g, DType to) {
  const int64_t code = to == DType::BF16 ? 16 : 10;  // TensorProto BFLOAT16 / FLOAT16
  for (auto& [name, v] : g.constants)
    if (v.is_tensor()) v.t = retyped(v.t, to);
  for (Node& n : g.nodes) {
    if (n.op_type == "Constant" && (n.attr("value") || n.attr("value_float") || n.attr("value_floats"))) {
      Tensor t = detail::constant_value(n).t;
      n.attrs.erase("value_float");
      n.attrs.erase("value_floats");
      detail::Attr a;
      a.type = detail::Attr::Type::Tensor;
      a.t = retyped(t, to);
      n.attrs["value"] = std::move(a);
    } else if (n.op_type == "ConstantOfShape") {
      detail::Attr a;
      a.type = detail::Attr::Type::Tensor;
      a.t = n.get_tensor("value") ? retyped(*n.get_tensor("value"), to) : zeros({1}, to);  // default: float 0
      n.attrs["value"] = std::move(a);
    } else if (n.op_type == "Cast" && n.get_int("to", 0) == kOnnxFloat) {
      n.attrs["to"].i = code;
    }
    for (auto& [k, a] : n.attrs) {
      if (a.g) retype_floats(*a.g, to);
      if (a.type == detail::Attr::Type::Tensor && n.op_type != "Constant" && n.op_type != "ConstantOfShape")
        a.t = retyped(a.t, to);
    }
  }
  for (auto* infos : {&g.inputs, &g.outputs})
    for (TensorInfo& i : *infos)
      if (i.dtype == DType::F32) i.dtype = to;
}
/// The passes of a load after parsing: constant folding, the spatial alignment, regions, constants
/// moved to the model's device, liveness.
void load_passes(Model::Impl* impl, const std::string& name, const LoadOptions& options) {
  Graph& g = *impl->pm.graph;
  std::vector<const Graph*> chain;
  fold_constants(g, chain, options.fold_constants);
  impl->num_live_nodes = count_nodes(g);
  std::tie(impl->multiple_h, impl->multiple_w) = spatial_alignment(g);
  if (options.find_regions) {
    int64_t min_saved = detail::kRegionMinSavedNodes;
    if (const char* e = std::getenv("PROTEAN_ONNX_REGION_MIN_SAVED"); e && *e) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (*end || v < 0)
        throw ValueError(fmt::format("PROTEAN_ONNX_REGION_MIN_SAVED='{}' is not a count of nodes (a non-negative "
                                     "integer)", e));
      min_saved = v;
    }
    for (detail::RegionGroupInfo& r : detail::find_regions(g, options.region_min_nodes, min_saved)) {
      if (observe::log_enabled(observe::LogCat::Regions))
        observe::log_line(observe::LogCat::Regions, "load",
                          fmt::format("ONNX model '{}': region {} found: {} uses of {} nodes, {} weight(s) per use; "
                                      "first use at {}",
                                      name, r.type, r.uses, r.nodes, r.weights, r.sites.empty() ? "" : r.sites[0]));
      impl->regions.push_back(RegionInfo{r.type, r.uses, r.nodes, r.weights, std::move(r.sites)});
    }
  }
  if (options.device.type != DeviceType::CPU) {
    move_constants(g, options.device);
    detail::refresh_region_weights(g);
  }
  compute_liveness(g);
}

std::shared_ptr<Model> load_impl(const std::string& bytes, const std::string& name, const std::string& base_dir,
                                 const LoadOptions& options) {
  auto impl = std::make_shared<Model::Impl>();
  impl->path = name;
  impl->options = options;
  impl->pm = detail::parse_model(bytes, name, base_dir);
  impl->hash = XXH64(bytes.data(), bytes.size(), impl->pm.external_hash);
  Graph& g = *impl->pm.graph;
  impl->identity = fmt::format("onnx:{}:{:016x}", g.name, impl->hash);
  impl->num_nodes = count_nodes(g);

  std::map<std::string, std::vector<std::string>> unsupported;
  resolve_ops(g, unsupported);
  if (!unsupported.empty()) {
    std::string msg = fmt::format("ONNX model '{}' ({}) uses {} unsupported operator type(s) or feature(s):", name,
                                  opset_text(impl->pm), unsupported.size());
    for (const auto& [what, nodes] : unsupported) {
      msg += fmt::format("\n  - {}: {} node(s): ", what, nodes.size());
      for (size_t i = 0; i < nodes.size() && i < 8; ++i) msg += (i ? ", '" : "'") + nodes[i] + "'";
      if (nodes.size() > 8) msg += fmt::format(" and {} more", nodes.size() - 8);
    }
    throw NotImplementedError(msg);
  }
  if (impl->pm.opset != 0 && (impl->pm.opset < detail::kMinNativeOpset || impl->pm.opset > detail::kMaxOpset))
    throw NotImplementedError(fmt::format("ONNX model '{}' uses opset {}; Protean supports opsets 1-{} (below {} "
                                          "upgraded at load by ONNX's version converter)", name,
                                          impl->pm.original_opset, detail::kMaxOpset, detail::kMinNativeOpset));

  if (options.float_dtype != DType::F32) {
    if (options.float_dtype != DType::BF16 && options.float_dtype != DType::F16)
      throw ValueError(fmt::format("ONNX model '{}': LoadOptions::float_dtype is {}; it takes f32, bf16 or f16", name,
                                   short_name(options.float_dtype)));
    retype_floats(g, options.float_dtype);
    impl->identity += fmt::format("@{}", short_name(options.float_dtype));
  }
  // The load-time passes evaluate nodes (constant folding) and read attributes: an error they raise
  // names the node, and here also the model.
  try {
    load_passes(impl.get(), name, options);
  } catch (const Error& e) {
    if (std::string_view(e.what()).find("ONNX model '" + name + "'") != std::string_view::npos) throw;
    rethrow_with_context(e, fmt::format("ONNX model '{}': ", name));
  }

  for (const auto& in : g.inputs) {
    impl->input_names.push_back(in.name);
    impl->inputs.push_back(in);
  }
  for (const auto& out : g.outputs) {
    impl->output_names.push_back(out.name);
    impl->outputs.push_back(out);
  }
  return std::make_shared<Model>(std::move(impl));
}

}  // namespace

std::shared_ptr<Model> load_from_bytes(const std::string& bytes, const std::string& name, const LoadOptions& options) {
  return load_impl(bytes, name, "", options);
}

std::shared_ptr<Model> load(const std::string& path, const LoadOptions& options) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return load_impl(read_file(path), path, dir.empty() ? std::string(".") : dir.string(), options);
}

}  // namespace protean::onnx
