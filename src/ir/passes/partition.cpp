#include "ir/passes/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include "observe/log.h"
#include "sym/expr.h"
#include "ops/registry.h"

namespace protean::ir {

namespace {

constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;

/// Dinic's maximum flow over int64 capacities.
class MaxFlow {
 public:
  explicit MaxFlow(int n) : adj_(static_cast<size_t>(n)) {}
  void add_edge(int u, int v, int64_t cap) {
    adj_[static_cast<size_t>(u)].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({v, cap});
    adj_[static_cast<size_t>(v)].push_back(static_cast<int>(edges_.size()));
    edges_.push_back({u, 0});
  }
  void run(int s, int t) {
    while (bfs(s, t)) {
      it_.assign(adj_.size(), 0);
      while (dfs(s, t, kInf) > 0) {
      }
    }
  }
  /// Vertices reachable from s in the residual network (the source side of the minimal min cut).
  std::vector<bool> reachable(int s) const {
    std::vector<bool> seen(adj_.size(), false);
    std::vector<int> stack{s};
    seen[static_cast<size_t>(s)] = true;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int e : adj_[static_cast<size_t>(u)]) {
        const Edge& ed = edges_[static_cast<size_t>(e)];
        if (ed.cap > 0 && !seen[static_cast<size_t>(ed.to)]) {
          seen[static_cast<size_t>(ed.to)] = true;
          stack.push_back(ed.to);
        }
      }
    }
    return seen;
  }

 private:
  struct Edge {
    int to;
    int64_t cap;
  };
  bool bfs(int s, int t) {
    level_.assign(adj_.size(), -1);
    std::queue<int> q;
    level_[static_cast<size_t>(s)] = 0;
    q.push(s);
    while (!q.empty()) {
      int u = q.front();
      q.pop();
      for (int e : adj_[static_cast<size_t>(u)]) {
        const Edge& ed = edges_[static_cast<size_t>(e)];
        if (ed.cap > 0 && level_[static_cast<size_t>(ed.to)] < 0) {
          level_[static_cast<size_t>(ed.to)] = level_[static_cast<size_t>(u)] + 1;
          q.push(ed.to);
        }
      }
    }
    return level_[static_cast<size_t>(t)] >= 0;
  }
  int64_t dfs(int u, int t, int64_t f) {
    if (u == t) return f;
    auto& i = it_[static_cast<size_t>(u)];
    for (; i < adj_[static_cast<size_t>(u)].size(); ++i) {
      int e = adj_[static_cast<size_t>(u)][i];
      Edge& ed = edges_[static_cast<size_t>(e)];
      if (ed.cap <= 0 || level_[static_cast<size_t>(ed.to)] != level_[static_cast<size_t>(u)] + 1) continue;
      int64_t got = dfs(ed.to, t, std::min(f, ed.cap));
      if (got > 0) {
        ed.cap -= got;
        edges_[static_cast<size_t>(e ^ 1)].cap += got;
        return got;
      }
    }
    return 0;
  }
  std::vector<std::vector<int>> adj_;
  std::vector<Edge> edges_;
  std::vector<int> level_;
  std::vector<size_t> it_;
};

bool is_backward(const Node& n) { return n.kind == NodeKind::Call && n.loc.backward; }

/// Ops the backward may recompute: cheap elementwise and layout work. Never library kernels
/// (matmul, linear, conv), random ops, reductions, normalizations, pooling, scans, attention,
/// data-dependent or control-flow ops.
bool recomputable(const Node& n) {
  if (n.kind != NodeKind::Call || n.loc.backward || !n.subgraphs.empty()) return false;
  const ops::OpInfo& info = ops::op_info(n.op);
  if (info.flags & (ops::kExtern | ops::kRandom | ops::kUnbackedSymbol | ops::kDataDependentShape)) return false;
  switch (info.category) {
    case ops::OpCategory::Pointwise: case ops::OpCategory::View: case ops::OpCategory::Movement:
    case ops::OpCategory::Factory:
      return true;
    case ops::OpCategory::Reduction: case ops::OpCategory::Normalization: case ops::OpCategory::Linear:
    case ops::OpCategory::Conv: case ops::OpCategory::Pool: case ops::OpCategory::Resize:
    case ops::OpCategory::Indexing: case ops::OpCategory::Scan: case ops::OpCategory::Attention:
    case ops::OpCategory::Recurrent: case ops::OpCategory::DataDependent: case ops::OpCategory::ControlFlow:
      return false;
  }
  return false;
}

/// A view op (its output aliases its input: nothing is computed or written).
bool is_view(const Node& n) {
  return n.kind == NodeKind::Call && ops::op_info(n.op).category == ops::OpCategory::View && !n.inputs.empty();
}

/// Backward ops that need their inputs in memory: library kernels and the kernels lowered as
/// whole-tensor calls (matmul/linear/conv, attention, pooling, indexing, scans...). A pointwise op or a
/// reduction reading a recomputed value fuses the recompute into its own loop; these cannot.
bool materializes_inputs(const Node& n) {
  if (n.kind != NodeKind::Call) return false;
  const ops::OpInfo& info = ops::op_info(n.op);
  if (info.flags & ops::kExtern) return true;
  switch (info.category) {
    case ops::OpCategory::Pointwise: case ops::OpCategory::View: case ops::OpCategory::Movement:
    case ops::OpCategory::Factory: case ops::OpCategory::Reduction: case ops::OpCategory::Normalization:
      return false;
    default:
      return true;
  }
}

/// Forward values the backward would read from memory (directly or through views, forward or
/// backward) in a kernel that cannot fuse their computation: recomputing such a value costs a full
/// kernel writing it again, so it is kept instead (the rule of PyTorch's min-cut partitioner that
/// values materialized in the backward are never recomputed).
std::vector<bool> materialized_in_backward(const Graph& g) {
  std::vector<bool> m(g.values().size(), false);
  const auto& nodes = g.nodes();
  for (const Node& n : nodes)
    if (is_backward(n) && materializes_inputs(n))
      for (ValueId v : n.inputs)
        if (v != kNoValue) m[static_cast<size_t>(v)] = true;
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it)  // users before producers
    if (is_view(*it) && it->inputs[0] != kNoValue)
      for (ValueId o : it->outputs)
        if (m[static_cast<size_t>(o)]) m[static_cast<size_t>(it->inputs[0])] = true;
  return m;
}

// What a size is worth to the capacities: each symbol at PartitionOptions::size_at when listed, else at
// its hint (read from the values whose size is that bare symbol: every symbol is some input's size).
class SizeValues {
 public:
  SizeValues(const Graph& g, const std::unordered_map<std::string, int64_t>& size_at) {
    for (const auto& [name, v] : size_at)
      if (v >= 0) at_[sym::symbol(name)] = v;
    if (at_.empty()) return;
    for (const Value& val : g.values())
      for (const SymInt& s : val.sizes)
        if (s.is_symbolic() && s.expr()->kind == sym::Kind::Symbol) hints_.emplace(s.expr(), s.hint());
    for (auto& [f, v] : at_)  // a call past the profile's max weighs at least what it traced
      if (auto h = hints_.find(f); h != hints_.end()) v = std::max(v, h->second);
  }
  int64_t of(const SymInt& s) const {
    if (!s.is_symbolic() || at_.empty()) return s.hint();
    bool listed = false, known = true;
    for (sym::Expr f : sym::free_symbols(s.expr())) {
      listed = listed || at_.count(f) > 0;
      known = known && (at_.count(f) > 0 || hints_.count(f) > 0);
    }
    if (!listed || !known) return s.hint();
    try {
      return sym::evaluate(s.expr(), [&](sym::Expr f) {
        auto a = at_.find(f);
        return a != at_.end() ? a->second : hints_.at(f);
      });
    } catch (const std::exception&) {
      return s.hint();  // e.g. a division by zero at these values: the traced size is still an answer
    }
  }
  int64_t bytes(const Value& v) const {
    int64_t n = static_cast<int64_t>(itemsize(v.dtype));
    for (const SymInt& s : v.sizes) {
      const int64_t d = std::max<int64_t>(of(s), 0);
      n = d != 0 && n > std::numeric_limits<int64_t>::max() / d ? std::numeric_limits<int64_t>::max() / 4 : n * d;
    }
    return n;
  }
  /// " at s0=1024, s1=64": the symbols of `sizes` with the values the bytes were taken at.
  std::string where(const SymIntVec& sizes) const {
    std::string r;
    for (const SymInt& s : sizes) {
      if (!s.is_symbolic()) continue;
      for (sym::Expr f : sym::free_symbols(s.expr())) {
        auto a = at_.find(f);
        auto h = hints_.find(f);
        std::string item;
        if (a != at_.end()) item = fmt::format("{}={}", f->name, a->second);
        else if (h != hints_.end()) item = fmt::format("{}={}", f->name, h->second);
        else if (s.expr()->kind == sym::Kind::Symbol) item = fmt::format("{}={}", f->name, s.hint());
        else continue;
        if (r.find(item) == std::string::npos) r += (r.empty() ? " at " : ", ") + item;
      }
    }
    return r;
  }

 private:
  std::unordered_map<sym::Expr, int64_t> at_, hints_;
};

std::string human_bytes(int64_t b) {
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.3g} MiB", static_cast<double>(b) / (1 << 20));
  if (b >= 1024) return fmt::format("{:.3g} KiB", static_cast<double>(b) / 1024);
  return fmt::format("{} B", b);
}

}  // namespace

bool has_backward(const Graph& g) {
  for (const Node& n : g.nodes())
    if (is_backward(n)) return true;
  return false;
}

PartitionResult partition(Graph& g, const PartitionOptions& options) {
  PartitionResult res;
  if (options.memory_budget && !(*options.memory_budget > 0 && *options.memory_budget <= 1))
    throw ValueError(fmt::format("partition: memory_budget must be in (0, 1], got {}", *options.memory_budget));
  if (!has_backward(g)) return res;
  const SizeValues sizes(g, options.size_at);
  const auto& nodes = g.nodes();
  const size_t nv = g.values().size();
  // Forward values and what reads them.
  std::vector<bool> fwd(nv, false), is_output(nv, false), bwd_reads(nv, false), free_input(nv, false);
  for (const Node& n : nodes) {
    if (n.kind == NodeKind::Output) {
      for (ValueId v : n.inputs) is_output[static_cast<size_t>(v)] = true;
      continue;
    }
    if (is_backward(n)) {
      for (ValueId v : n.inputs)
        if (v != kNoValue) bwd_reads[static_cast<size_t>(v)] = true;
      continue;
    }
    for (ValueId v : n.outputs) {
      fwd[static_cast<size_t>(v)] = true;
      if (n.kind != NodeKind::Call) free_input[static_cast<size_t>(v)] = true;
    }
  }
  // The network: S = 0, T = 1, value v: in = 2 + 2v, out = 3 + 2v.
  MaxFlow net(static_cast<int>(2 + 2 * nv));
  auto in_of = [](ValueId v) { return 2 + 2 * static_cast<int>(v); };
  auto out_of = [](ValueId v) { return 3 + 2 * static_cast<int>(v); };
  std::vector<int64_t> cap(nv, 0);
  const std::vector<bool> materialized = materialized_in_backward(g);
  for (const Node& n : nodes) {
    if (n.kind == NodeKind::Output || is_backward(n)) continue;
    bool must_compute = !recomputable(n) || n.kind != NodeKind::Call;
    if (!must_compute && !is_view(n))
      for (ValueId o : n.outputs) must_compute = must_compute || materialized[static_cast<size_t>(o)];
    for (ValueId o : n.outputs) {
      const size_t uo = static_cast<size_t>(o);
      cap[uo] = free_input[uo] || is_output[uo] ? 0 : sizes.bytes(g.value(o));
      net.add_edge(in_of(o), out_of(o), cap[uo]);
      if (must_compute) net.add_edge(0, in_of(o), kInf);
      for (ValueId i : n.inputs)
        if (i != kNoValue && fwd[static_cast<size_t>(i)]) net.add_edge(out_of(i), in_of(o), kInf);
      if (bwd_reads[uo]) net.add_edge(out_of(o), 1, kInf);
    }
  }
  net.run(0, 1);
  std::vector<bool> side = net.reachable(0);
  std::vector<bool> saved(nv, false);
  for (size_t v = 0; v < nv; ++v)
    if (fwd[v] && side[static_cast<size_t>(in_of(static_cast<ValueId>(v)))] &&
        !side[static_cast<size_t>(out_of(static_cast<ValueId>(v)))])
      saved[v] = true;
  // memory_budget: recompute the largest recomputable saved values until the saved bytes fit.
  if (options.memory_budget) {
    int64_t read = 0, kept = 0;
    for (size_t v = 0; v < nv; ++v) {
      if (fwd[v] && bwd_reads[v]) read += cap[v];
      if (saved[v]) kept += cap[v];
    }
    std::vector<size_t> order;
    for (size_t v = 0; v < nv; ++v)
      if (saved[v] && cap[v] > 0 && recomputable(nodes[static_cast<size_t>(g.value(static_cast<ValueId>(v)).node)]))
        order.push_back(v);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cap[a] > cap[b]; });
    const double limit = *options.memory_budget * static_cast<double>(read);
    for (size_t v : order) {
      if (static_cast<double>(kept) <= limit) break;
      saved[v] = false;
      kept -= cap[v];
    }
  }
  // A view of available values is available too: it costs nothing to keep (its base is kept), and a
  // copy recomputed in the backward would be a second value the lowering materializes again.
  std::function<bool(ValueId)> available = [&](ValueId v) {
    const size_t u = static_cast<size_t>(v);
    if (!fwd[u] || saved[u] || free_input[u] || is_output[u]) return true;
    const Node& n = nodes[static_cast<size_t>(g.value(v).node)];
    if (!recomputable(n)) return true;
    if (!is_view(n)) return false;
    for (ValueId i : n.inputs)
      if (i != kNoValue && !available(i)) return false;
    return true;
  };
  // Rebuild: forward as is; before each backward node, the recomputations it needs.
  Graph ng;
  ng.name = g.name;
  std::vector<ValueId> map_f(nv, kNoValue), map_b(nv, kNoValue);
  auto metas_of = [&](const Node& n) {
    std::vector<TensorMeta> m;
    for (ValueId o : n.outputs) {
      const Value& val = g.value(o);
      TensorMeta t;
      t.sizes = val.sizes;
      t.strides = val.strides;
      t.dtype = val.dtype;
      m.push_back(std::move(t));
    }
    return m;
  };
  std::vector<bool> counted(nodes.size(), false);
  std::function<ValueId(ValueId)> recompute = [&](ValueId v) -> ValueId {
    if (v == kNoValue) return kNoValue;
    if (available(v)) return map_f[static_cast<size_t>(v)];
    if (map_b[static_cast<size_t>(v)] != kNoValue) return map_b[static_cast<size_t>(v)];
    const size_t ni = static_cast<size_t>(g.value(v).node);
    const Node& n = nodes[ni];
    std::vector<ValueId> ins;
    for (ValueId i : n.inputs) ins.push_back(recompute(i));
    core::SourceLocation loc = n.loc;
    loc.backward = true;
    std::vector<ValueId> outs = ng.add_call(n.op, std::move(ins), n.attrs, metas_of(n), loc, n.subgraphs);
    for (size_t k = 0; k < outs.size(); ++k) map_b[static_cast<size_t>(n.outputs[k])] = outs[k];
    if (!counted[ni]) counted[ni] = true, ++res.recomputed_nodes;
    return map_b[static_cast<size_t>(v)];
  };
  for (const Node& n : nodes) {
    switch (n.kind) {
      case NodeKind::Placeholder: {
        const Value& val = g.value(n.outputs[0]);
        map_f[static_cast<size_t>(n.outputs[0])] = ng.add_placeholder(n.source, val.dtype, val.sizes, val.strides);
        break;
      }
      case NodeKind::Constant: {
        ValueId nvid = ng.add_constant(n.constant, g.value(n.outputs[0]).name);
        const Value& val = g.value(n.outputs[0]);
        Value& dst = ng.values()[static_cast<size_t>(nvid)];
        dst.dtype = val.dtype, dst.sizes = val.sizes, dst.strides = val.strides;
        map_f[static_cast<size_t>(n.outputs[0])] = nvid;
        break;
      }
      case NodeKind::Call: {
        std::vector<ValueId> ins;
        for (ValueId i : n.inputs)
          ins.push_back(i == kNoValue ? kNoValue : is_backward(n) ? recompute(i) : map_f[static_cast<size_t>(i)]);
        std::vector<ValueId> outs = ng.add_call(n.op, std::move(ins), n.attrs, metas_of(n), n.loc, n.subgraphs);
        for (size_t k = 0; k < outs.size(); ++k) map_f[static_cast<size_t>(n.outputs[k])] = outs[k];
        break;
      }
      case NodeKind::Output: {
        std::vector<ValueId> outs;
        for (ValueId v : n.inputs) outs.push_back(map_f[static_cast<size_t>(v)]);
        ng.set_outputs(std::move(outs));
        break;
      }
    }
  }
  // Report what stays saved for the backward (computed values only: inputs are alive anyway).
  for (size_t v = 0; v < nv; ++v) {
    if (!fwd[v] || free_input[v] || !(saved[v] || (bwd_reads[v] && available(static_cast<ValueId>(v))))) continue;
    if (cap[v] == 0 && !bwd_reads[v]) continue;  // a graph output nothing in the backward reads
    const Value& val = g.value(static_cast<ValueId>(v));
    const Node& n = nodes[static_cast<size_t>(val.node)];
    if (is_view(n) && !saved[v]) continue;  // kept through its base, which has its own line
    ++res.saved_values;
    res.saved_bytes += is_output[v] ? 0 : sizes.bytes(val);
    res.lines.push_back(fmt::format("saved {}{} {} at {} ({}{}{})", short_name(val.dtype), to_string(val.sizes),
                                    ops::op_name(n.op), n.loc.str(), human_bytes(sizes.bytes(val)), sizes.where(val.sizes),
                                    is_output[v] ? ", a graph output anyway" : ""));
  }
  res.lines.push_back(fmt::format("partition: {} saved ({}), {} node(s) recomputed in the backward", res.saved_values,
                                  human_bytes(res.saved_bytes), res.recomputed_nodes));
  if (observe::log_enabled(observe::LogCat::Partition))
    for (const std::string& l : res.lines) observe::log_line(observe::LogCat::Partition, g.name, l);
  if (res.recomputed_nodes > 0) g = std::move(ng);
  return res;
}

}  // namespace protean::ir
