// Repeated blocks of an ONNX model as regions: see regions.h.
#include "frontends/onnx/regions.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace protean::onnx::detail {

namespace {

/// A block's weights as the buffers of a Module (what auto_region_call passes per use).
class RegionWeights final : public Module {};

uint64_t mix(uint64_t h, uint64_t v) { return XXH64(&v, sizeof v, h); }
uint64_t mix(uint64_t h, const std::string& s) { return XXH64(s.data(), s.size(), h); }

uint64_t tensor_content(const Tensor& t) {
  if (!t.defined() || t.is_fake() || t.device().type != DeviceType::CPU) return 0;
  Tensor c = t.contiguous();
  uint64_t h = mix(0, std::string(short_name(c.dtype())));
  for (int64_t d : c.int_sizes()) h = mix(h, static_cast<uint64_t>(d));
  const size_t bytes = static_cast<size_t>(c.int_numel()) * c.itemsize();
  return bytes ? XXH64(c.data_ptr(), bytes, h) : h;
}

uint64_t value_content(const Value& v) {
  uint64_t h = mix(0, static_cast<uint64_t>(v.kind));
  switch (v.kind) {
    case Value::Kind::Tensor: return mix(h, tensor_content(v.t));
    case Value::Kind::Ints:
      h = mix(mix(h, std::string(short_name(v.dtype))), static_cast<uint64_t>(v.scalar));
      for (const SymInt& s : v.ints) h = mix(h, static_cast<uint64_t>(s.is_symbolic() ? -1 : s.hint()));
      return h;
    case Value::Kind::Bools:
      for (const SymBool& b : v.bools) h = mix(h, static_cast<uint64_t>(b.is_symbolic() ? 2 : static_cast<bool>(b)));
      return mix(h, static_cast<uint64_t>(v.scalar));
    case Value::Kind::Sequence:
      for (const Tensor& t : v.seq) h = mix(h, tensor_content(t));
      return h;
    case Value::Kind::None: return h;
  }
  return h;
}

/// The signature of a constant input: tensors by dtype and shape (their contents may differ per
/// instance: weights), host values by value.
uint64_t constant_shape_sig(const Value& v) {
  if (v.kind != Value::Kind::Tensor) return mix(1, value_content(v));
  uint64_t h = mix(2, std::string(short_name(v.t.dtype())));
  for (int64_t d : v.t.int_sizes()) h = mix(h, static_cast<uint64_t>(d));
  return h;
}

uint64_t attr_sig(const Attr& a) {
  uint64_t h = mix(0, static_cast<uint64_t>(a.type));
  h = mix(mix(h, static_cast<uint64_t>(a.i)), a.s);
  uint64_t fb = 0;
  std::memcpy(&fb, &a.f, sizeof fb);
  h = mix(h, fb);
  for (double f : a.floats) {
    std::memcpy(&fb, &f, sizeof fb);
    h = mix(h, fb);
  }
  for (int64_t i : a.ints) h = mix(h, static_cast<uint64_t>(i));
  for (const auto& s : a.strings) h = mix(h, s);
  if (a.type == Attr::Type::Tensor) h = mix(h, tensor_content(a.t));
  return h;
}

struct Finder {
  explicit Finder(Graph& graph) : g(graph) {}
  Graph& g;
  size_t n = 0;
  std::vector<uint64_t> sig;
  std::vector<bool> eligible;
  std::vector<int> taken;  // group id of an accepted instance, or -1
  std::unordered_map<std::string, std::pair<int, int>> producer;  // value → (node, output)
  std::vector<std::vector<std::vector<std::pair<int, int>>>> consumers;  // node → output → (consumer, slot)
  std::unordered_set<std::string> outside_uses;  // graph outputs and values read by subgraphs
  std::unordered_map<std::string, uint64_t> content_cache;

  const Value* constant(const std::string& name) const {
    auto it = g.constants.find(name);
    return it == g.constants.end() ? nullptr : &it->second;
  }
  uint64_t content(const std::string& name) {
    auto it = content_cache.find(name);
    if (it != content_cache.end()) return it->second;
    return content_cache[name] = value_content(*constant(name));
  }

  void prepare() {
    n = g.nodes.size();
    sig.assign(n, 0);
    eligible.assign(n, true);
    taken.assign(n, -1);
    consumers.assign(n, {});
    for (const auto& o : g.outputs) outside_uses.insert(o.name);
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = g.nodes[i];
      consumers[i].resize(nd.outputs.size());
      for (size_t o = 0; o < nd.outputs.size(); ++o)
        if (!nd.outputs[o].empty()) producer[nd.outputs[o]] = {static_cast<int>(i), static_cast<int>(o)};
      for (const auto& c : nd.captured) outside_uses.insert(c);
      uint64_t h = mix(mix(mix(0, nd.op_type), nd.domain), static_cast<uint64_t>(nd.opset));
      if (!nd.fn || nd.op_type == "If" || !nd.captured.empty()) eligible[i] = false;
      for (const auto& [k, a] : nd.attrs) {
        if (a.g) eligible[i] = false;
        h = mix(mix(h, k), attr_sig(a));
      }
      h = mix(h, nd.inputs.size());
      for (const auto& in : nd.inputs) {
        if (in.empty()) h = mix(h, uint64_t{1});
        else if (const Value* c = constant(in)) h = mix(mix(h, uint64_t{2}), constant_shape_sig(*c));
        else h = mix(h, uint64_t{3});
      }
      h = mix(h, nd.outputs.size());
      for (const auto& o : nd.outputs) h = mix(h, static_cast<uint64_t>(o.empty()));
      sig[i] = h;
    }
    for (size_t i = 0; i < n; ++i) {
      const Node& nd = g.nodes[i];
      auto edge = [&](const std::string& name, int slot) {
        auto it = producer.find(name);
        if (it == producer.end() || constant(name)) return;
        consumers[static_cast<size_t>(it->second.first)][static_cast<size_t>(it->second.second)].emplace_back(
            static_cast<int>(i), slot);
      };
      for (size_t j = 0; j < nd.inputs.size(); ++j) edge(nd.inputs[j], static_cast<int>(j));
      for (const auto& c : nd.captured) edge(c, -1);  // read by a subgraph (If branch)
    }
  }

  /// A candidate: tuples[t][i] is the node of tuple t in instance i.
  struct Candidate {
    std::vector<std::vector<int>> tuples;
    int64_t score = 0;
  };

  /// Grows `seed` (r nodes of one signature) in lock step (regions.h, step 2).
  Candidate grow(const std::vector<int>& seed) {
    const size_t r = seed.size();
    Candidate c;
    std::unordered_map<int, int> owner;  // node → instance
    auto add = [&](const std::vector<int>& nodes) {
      std::set<int> distinct(nodes.begin(), nodes.end());
      if (distinct.size() != nodes.size()) return false;
      for (int v : nodes)
        if (!eligible[static_cast<size_t>(v)] || taken[static_cast<size_t>(v)] >= 0 || owner.count(v) ||
            sig[static_cast<size_t>(v)] != sig[static_cast<size_t>(nodes[0])])
          return false;
      for (size_t i = 0; i < r; ++i) owner[nodes[i]] = static_cast<int>(i);
      c.tuples.push_back(nodes);
      return true;
    };
    if (!add(seed)) return c;
    for (size_t t = 0; t < c.tuples.size(); ++t) {
      const std::vector<int> cur = c.tuples[t];
      const Node& first = g.nodes[static_cast<size_t>(cur[0])];
      for (size_t j = 0; j < first.inputs.size(); ++j) {
        std::vector<int> prod(r);
        bool ok = true;
        int out = -1;
        for (size_t i = 0; i < r && ok; ++i) {
          const std::string& name = g.nodes[static_cast<size_t>(cur[i])].inputs[j];
          auto it = name.empty() || constant(name) ? producer.end() : producer.find(name);
          ok = it != producer.end() && (out < 0 || out == it->second.second);
          if (ok) {
            prod[i] = it->second.first;
            out = it->second.second;
          }
        }
        if (ok) add(prod);
      }
      for (size_t o = 0; o < first.outputs.size(); ++o) {
        for (const auto& [c0, slot] : consumers[static_cast<size_t>(cur[0])][o]) {
          if (owner.count(c0)) continue;
          std::vector<int> cons{c0};
          for (size_t i = 1; i < r; ++i) {
            int found = -1;
            for (const auto& [ci, si] : consumers[static_cast<size_t>(cur[i])][o])
              if (si == slot && !owner.count(ci) && sig[static_cast<size_t>(ci)] == sig[static_cast<size_t>(c0)] &&
                  std::find(cons.begin(), cons.end(), ci) == cons.end()) {
                found = ci;
                break;
              }
            if (found < 0) break;
            cons.push_back(found);
          }
          if (cons.size() == r) add(cons);
        }
      }
    }
    return c;
  }

  /// How one input slot of a tuple is wired (regions.h, step 3).
  struct Slot {
    enum class Kind { Empty, Internal, External, Shared, Weight } kind = Kind::Empty;
    int tuple = -1, output = -1;  // Internal
  };

  struct Checked {
    bool ok = false;
    std::string why;
    std::vector<std::vector<Slot>> slots;  // [tuple][input]
    uint64_t hash = 0;
  };

  Checked check(const Candidate& c) {
    Checked k;
    const size_t r = c.tuples[0].size(), T = c.tuples.size();
    std::unordered_map<int, std::pair<int, int>> where;  // node → (tuple, instance)
    for (size_t t = 0; t < T; ++t)
      for (size_t i = 0; i < r; ++i) where[c.tuples[t][i]] = {static_cast<int>(t), static_cast<int>(i)};
    uint64_t h = mix(0, static_cast<uint64_t>(T));
    k.slots.resize(T);
    for (size_t t = 0; t < T; ++t) {
      const Node& first = g.nodes[static_cast<size_t>(c.tuples[t][0])];
      h = mix(h, sig[static_cast<size_t>(c.tuples[t][0])]);
      for (size_t j = 0; j < first.inputs.size(); ++j) {
        Slot s;
        bool have = false;
        std::set<std::string> names;
        for (size_t i = 0; i < r; ++i) {
          const std::string& name = g.nodes[static_cast<size_t>(c.tuples[t][i])].inputs[j];
          Slot x;
          if (name.empty()) {
            x.kind = Slot::Kind::Empty;
          } else if (constant(name)) {
            x.kind = Slot::Kind::Shared;
            names.insert(name);
          } else if (auto p = producer.find(name); p != producer.end() && where.count(p->second.first) &&
                                                   where[p->second.first].second == static_cast<int>(i)) {
            x.kind = Slot::Kind::Internal;
            x.tuple = where[p->second.first].first;
            x.output = p->second.second;
          } else {
            x.kind = Slot::Kind::External;
          }
          if (!have) {
            s = x;
            have = true;
          } else if (x.kind != s.kind || x.tuple != s.tuple || x.output != s.output) {
            k.why = fmt::format("input {} of {} is wired differently in two instances", j, first.label());
            return k;
          }
        }
        if (s.kind == Slot::Kind::Shared && names.size() > 1) {
          std::set<uint64_t> contents;
          for (const auto& nm : names) contents.insert(content(nm));
          const Value& v0 = *constant(*names.begin());
          if (contents.size() > 1) {
            if (v0.kind != Value::Kind::Tensor || !is_floating(v0.t.dtype())) {
              k.why = fmt::format("input {} of {} is a non-float constant that differs between instances", j,
                                  first.label());
              return k;
            }
            s.kind = Slot::Kind::Weight;
          }
        }
        h = mix(mix(mix(mix(h, static_cast<uint64_t>(s.kind)), static_cast<uint64_t>(s.tuple)),
                    static_cast<uint64_t>(s.output)), j);
        if (s.kind == Slot::Kind::Shared) h = mix(h, content(*names.begin()));
        k.slots[t].push_back(s);
      }
    }
    // A boundary never separates a convolution or matrix product from the one node that reads its
    // result: the backends fuse that node (an activation, a scale) into the product.
    auto anchor = [&](int v) {
      const std::string& op = g.nodes[static_cast<size_t>(v)].op_type;
      return op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul";
    };
    auto single_reader = [&](int v) {
      size_t c = 0;
      for (const auto& outs : consumers[static_cast<size_t>(v)]) c += outs.size();
      return c == 1;
    };
    for (size_t t = 0; t < T; ++t)
      for (size_t i = 0; i < r; ++i) {
        const int v = c.tuples[t][i];
        const Node& nd = g.nodes[static_cast<size_t>(v)];
        for (const auto& name : nd.inputs) {
          auto p = name.empty() || constant(name) ? producer.end() : producer.find(name);
          if (p == producer.end()) continue;
          auto w = where.find(p->second.first);
          if ((w == where.end() || w->second.second != static_cast<int>(i)) && anchor(p->second.first) &&
              single_reader(p->second.first)) {
            k.why = fmt::format("it would separate {} from its only reader {}",
                                g.nodes[static_cast<size_t>(p->second.first)].label(), nd.label());
            return k;
          }
        }
        if (anchor(v) && single_reader(v))
          for (const auto& outs : consumers[static_cast<size_t>(v)])
            for (const auto& [cn, slot] : outs)
              if (auto w = where.find(cn); w == where.end() || w->second.second != static_cast<int>(i)) {
                k.why = fmt::format("it would separate {} from its only reader", nd.label());
                return k;
              }
      }
    // Convexity: nothing outside an instance both reads from it and feeds it.
    for (size_t i = 0; i < r; ++i) {
      int lo = INT32_MAX, hi = -1;
      for (size_t t = 0; t < T; ++t) {
        lo = std::min(lo, c.tuples[t][i]);
        hi = std::max(hi, c.tuples[t][i]);
      }
      std::vector<bool> seen(n, false);
      std::vector<int> stack;
      for (size_t t = 0; t < T; ++t)
        for (const auto& outs : consumers[static_cast<size_t>(c.tuples[t][i])])
          for (const auto& [cn, slot] : outs)
            if (!where.count(cn) || where[cn].second != static_cast<int>(i)) stack.push_back(cn);
      while (!stack.empty()) {
        int v = stack.back();
        stack.pop_back();
        if (v > hi || seen[static_cast<size_t>(v)]) continue;
        seen[static_cast<size_t>(v)] = true;
        if (auto w = where.find(v); w != where.end() && w->second.second == static_cast<int>(i)) {
          k.why = "an instance is not convex (a path leaves it and comes back)";
          return k;
        }
        for (const auto& outs : consumers[static_cast<size_t>(v)])
          for (const auto& [cn, slot] : outs) stack.push_back(cn);
      }
      (void)lo;
    }
    k.hash = h;
    k.ok = true;
    return k;
  }
};

}  // namespace

std::vector<RegionGroupInfo> find_regions(Graph& g, int64_t min_nodes, int64_t min_saved) {
  Finder f(g);
  f.prepare();
  const size_t n = f.n;
  struct Accepted {
    Finder::Candidate cand;
    Finder::Checked checked;
  };
  std::vector<Accepted> groups;
  for (int round = 0; round < 64; ++round) {
    std::map<uint64_t, std::vector<int>> by_sig;
    for (size_t i = 0; i < n; ++i)
      if (f.eligible[i] && f.taken[i] < 0) by_sig[f.sig[i]].push_back(static_cast<int>(i));
    std::optional<Accepted> best;
    std::set<std::vector<int>> tried;
    for (const auto& [s, nodes] : by_sig) {
      if (nodes.size() < 2) continue;
      Finder::Candidate c = f.grow(nodes);
      const int64_t size = static_cast<int64_t>(c.tuples.size());
      if (size < min_nodes) continue;
      c.score = size * static_cast<int64_t>(nodes.size() - 1);
      if (c.score < min_saved || (best && c.score <= best->cand.score)) continue;
      std::vector<int> key;
      for (const auto& t : c.tuples) key.push_back(t[0]);
      std::sort(key.begin(), key.end());
      if (!tried.insert(key).second) continue;
      Finder::Checked k = f.check(c);
      if (!k.ok) continue;
      best = Accepted{std::move(c), std::move(k)};
    }
    if (!best) break;
    const int gid = static_cast<int>(groups.size());
    for (const auto& t : best->cand.tuples)
      for (int v : t) f.taken[static_cast<size_t>(v)] = gid;
    groups.push_back(std::move(*best));
  }
  if (groups.empty()) return {};

  // Build the uses: body graphs, external inputs, outputs, weights.
  std::vector<RegionGroupInfo> infos;
  std::vector<std::vector<std::shared_ptr<RegionUse>>> uses(groups.size());
  std::vector<std::pair<int, int>> unit_of(n, {-1, -1});  // node → (group, instance)
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& tuples = groups[gi].cand.tuples;
    const auto& slots = groups[gi].checked.slots;
    const size_t r = tuples[0].size(), T = tuples.size();
    // Tuples in node order of the first instance (a topological order of the body).
    std::vector<size_t> order(T);
    for (size_t t = 0; t < T; ++t) order[t] = t;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tuples[a][0] < tuples[b][0]; });
    std::vector<std::set<int>> member_sets(r);
    for (size_t i = 0; i < r; ++i)
      for (size_t t = 0; t < T; ++t) member_sets[i].insert(tuples[t][i]);
    RegionGroupInfo info;
    info.type = fmt::format("onnx.block{}.{:08x}", gi, groups[gi].checked.hash & 0xffffffffu);
    info.uses = static_cast<int64_t>(r);
    info.nodes = static_cast<int64_t>(T);
    for (size_t i = 0; i < r; ++i) {
      auto u = std::make_shared<RegionUse>();
      u->type = info.type;
      u->group = static_cast<int>(gi);
      u->instance = static_cast<int>(i);
      u->body = std::make_shared<Graph>();
      u->body->name = info.type;
      auto m = std::make_shared<RegionWeights>();
      const std::set<int>& members = member_sets[i];
      std::set<std::string> ext_seen, weight_seen;
      std::vector<std::string> ext;
      for (size_t t : order) {
        const Node& nd = g.nodes[static_cast<size_t>(tuples[t][i])];
        for (size_t j = 0; j < nd.inputs.size(); ++j) {
          const Finder::Slot& s = slots[t][j];
          if (s.kind == Finder::Slot::Kind::External && ext_seen.insert(nd.inputs[j]).second) ext.push_back(nd.inputs[j]);
          if (s.kind == Finder::Slot::Kind::Weight && weight_seen.insert(nd.inputs[j]).second) {
            u->weights.push_back(nd.inputs[j]);
            m->register_buffer(fmt::format("w{}", u->weights.size() - 1), g.constants.at(nd.inputs[j]).t);
          }
        }
        u->body->nodes.push_back(nd);
      }
      // Outputs: values of the instance read outside it (by other nodes, graph outputs, subgraphs).
      std::vector<std::string> outs;
      for (size_t t : order) {
        const size_t v = static_cast<size_t>(tuples[t][i]);
        const Node& nd = g.nodes[v];
        for (size_t o = 0; o < nd.outputs.size(); ++o) {
          if (nd.outputs[o].empty()) continue;
          // The same output position of every instance: an output when any instance uses it outside.
          bool outside = false;
          for (size_t i2 = 0; i2 < r && !outside; ++i2) {
            const size_t v2 = static_cast<size_t>(tuples[t][i2]);
            outside |= f.outside_uses.count(g.nodes[v2].outputs[o]) > 0;
            for (const auto& [cn, slot] : f.consumers[v2][o]) outside |= !member_sets[i2].count(cn);
          }
          if (outside) outs.push_back(nd.outputs[o]);
        }
      }
      for (const auto& e : ext) {
        TensorInfo ti;
        ti.name = e;
        u->body->inputs.push_back(ti);
      }
      for (const auto& o : outs) {
        TensorInfo ti;
        ti.name = o;
        u->body->outputs.push_back(ti);
      }
      u->module = m;
      const Node& a = g.nodes[static_cast<size_t>(*members.begin())];
      const Node& b = g.nodes[static_cast<size_t>(*members.rbegin())];
      u->site = fmt::format("nodes '{}'..'{}'", a.name, b.name);
      info.sites.push_back(u->site);
      info.weights = static_cast<int64_t>(u->weights.size());
      for (int v : members) unit_of[static_cast<size_t>(v)] = {static_cast<int>(gi), static_cast<int>(i)};
      uses[gi].push_back(u);
    }
    infos.push_back(std::move(info));
  }

  // Contract: one unit per remaining node and per use; Kahn's algorithm by first node index.
  std::vector<int> unit(n);
  std::vector<Node> units;
  std::vector<int> unit_first;
  std::map<std::pair<int, int>, int> use_unit;
  for (size_t i = 0; i < n; ++i) {
    if (unit_of[i].first < 0) {
      unit[i] = static_cast<int>(units.size());
      units.push_back(g.nodes[i]);
      unit_first.push_back(static_cast<int>(i));
      continue;
    }
    auto [it, fresh] = use_unit.emplace(unit_of[i], static_cast<int>(units.size()));
    unit[i] = it->second;
    if (fresh) {
      const auto& u = uses[static_cast<size_t>(unit_of[i].first)][static_cast<size_t>(unit_of[i].second)];
      Node rn;
      rn.name = fmt::format("{}#use{}", u->type, u->instance);
      rn.op_type = "protean.Region";
      rn.domain = "protean";
      for (const auto& in : u->body->inputs) rn.inputs.push_back(in.name);
      for (const auto& o : u->body->outputs) rn.outputs.push_back(o.name);
      rn.region = u;
      units.push_back(std::move(rn));
      unit_first.push_back(static_cast<int>(i));
    }
  }
  const size_t U = units.size();
  std::vector<std::set<int>> succ(U);
  std::vector<int> indeg(U, 0);
  for (size_t i = 0; i < n; ++i)
    for (const auto& outs : f.consumers[i])
      for (const auto& [cn, slot] : outs) {
        int a = unit[i], b = unit[static_cast<size_t>(cn)];
        if (a != b && succ[static_cast<size_t>(a)].insert(b).second) ++indeg[static_cast<size_t>(b)];
      }
  std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>> ready;
  for (size_t u = 0; u < U; ++u)
    if (indeg[u] == 0) ready.emplace(unit_first[u], static_cast<int>(u));
  std::vector<Node> out;
  while (!ready.empty()) {
    int u = ready.top().second;
    ready.pop();
    out.push_back(std::move(units[static_cast<size_t>(u)]));
    for (int s : succ[static_cast<size_t>(u)])
      if (--indeg[static_cast<size_t>(s)] == 0) ready.emplace(unit_first[static_cast<size_t>(s)], s);
  }
  if (out.size() != U) return {};  // the contracted graph has a cycle: keep the flat graph
  g.nodes = std::move(out);
  return infos;
}

void refresh_region_weights(Graph& g) {
  for (Node& nd : g.nodes) {
    if (!nd.region) continue;
    auto m = std::make_shared<RegionWeights>();
    for (size_t k = 0; k < nd.region->weights.size(); ++k)
      m->register_buffer(fmt::format("w{}", k), g.constants.at(nd.region->weights[k]).t);
    nd.region->module = m;
  }
}

}  // namespace protean::onnx::detail
