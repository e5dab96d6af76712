// Regional compilation under capture: see capture/region.h and docs/regions.md.
#include "capture/region.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "ops/tape.h"
#include "capture/cond.h"
#include "capture/graph_break.h"
#include "capture/location.h"
#include "capture/module_trace.h"
#include "capture/tracer.h"
#include "ir/sym_util.h"
#include "observe/log.h"

namespace protean::detail {
void count_region(bool compiled);  // capture/frame.cpp: Stats::region_compiles / region_hits
// capture/submodules.cpp (include/protean/submodules.h): a submodule with options of its own.
bool submodules_registered();
bool submodule_call(Module& m, const Body& body, std::span<const ArgValue> args, std::vector<OutValue>& outs);
}

namespace protean::capture {

using observe::LogCat;

namespace {
thread_local RegionHost* t_host = nullptr;

/// Thrown inside a region trace when the body cannot be a region (it reads a traced tensor it did
/// not receive); region_call then traces the call inline.
struct NotARegion {
  std::string why;
};

std::string meta_text(const TensorMeta& m) {
  return fmt::format("{}{} stride {} {}", short_name(m.dtype), to_string(m.sizes), to_string(m.strides),
                     m.device.str());
}

std::string strip_namespaces(const std::string& s) {
  // The last component outside template arguments: "a::B<c::D>" → "B<c::D>".
  int depth = 0;
  size_t cut = 0;
  for (size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    else if (s[i] == '>') --depth;
    else if (depth == 0 && s[i] == ':' && s[i + 1] == ':') cut = i + 2;
  }
  return s.substr(cut);
}

void collect_paths(const Module& m, const std::string& prefix, std::unordered_map<const Module*, std::string>& out) {
  out.emplace(&m, prefix);
  for (const auto& [n, c] : m.named_children()) collect_paths(*c, prefix + n + ".", out);
}

/// The submodule of `m` at dotted path `path` ("attn.proj"; empty: m itself).
const Module* submodule(const Module& m, const std::string& path) {
  const Module* cur = &m;
  size_t pos = 0;
  while (pos < path.size()) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    const Module* next = nullptr;
    for (const auto& [n, c] : cur->named_children())
      if (n == part) next = c.get();
    if (!next) return nullptr;
    cur = next;
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

TensorMeta contiguous_meta(const Tensor& t) {
  TensorMeta m;
  m.sizes = t.sizes();
  m.strides = ir::contiguous_strides_of(m.sizes);
  m.dtype = t.dtype();
  m.device = t.device();
  return m;
}

/// Traces one region body into its own graph (the header comment of region.h).
class RegionTracer final : public ops::TraceHook, public AttributeReader, public RegionHost {
 public:
  RegionTracer(RegionHost& host, Module& m, const std::string& type, std::span<const detail::ArgValue> args)
      : host_(host), module_(m), reader_(current_attribute_reader()) {
    graph_ = std::make_shared<ir::Graph>();
    graph_->name = type;
    collect_paths(m, "", paths_);
    args_.assign(args.begin(), args.end());
    int k = 0;
    for (detail::ArgValue& a : args_) {
      if (a.kind != detail::ArgValue::Kind::Tensor || !a.tensor.defined()) continue;
      ir::ValueId v = graph_->add_placeholder(fmt::format("arg{}", k++), a.tensor.dtype(), a.tensor.sizes(),
                                              a.tensor.strides());
      outer_.emplace(a.tensor.impl(), v);
      a.tensor = own_fake(a.tensor.meta(), v);
    }
    for (const auto& [name, ptr] : m.slots().tensors) {
      if (!ptr->defined()) continue;
      TensorMeta tm = host.traced_meta(*ptr);
      ir::ValueId v = graph_->add_placeholder("self." + name, tm.dtype, tm.sizes, tm.strides);
      outer_.emplace(ptr->impl(), v);
      param_metas_.emplace(ptr->impl(), tm);
    }
  }
  ~RegionTracer() override {
    for (const auto& impl : made_)
      if (impl->trace.tracer == this) impl->trace = {};
  }
  RegionTracer(const RegionTracer&) = delete;
  RegionTracer& operator=(const RegionTracer&) = delete;

  /// Runs the body with this tracer installed; returns its flattened result.
  std::vector<detail::OutValue> run(const detail::Body& body) {
    ops::TraceHookScope hook(this);
    AttributeReaderScope reader(this);
    RegionHostScope region(this);
    return body(args_);
  }

  /// Ends the graph with the tensors of `outs` as its outputs (in order).
  std::shared_ptr<const ir::Graph> finish(const std::vector<detail::OutValue>& outs) {
    std::vector<ir::ValueId> ids;
    for (const auto& o : outs)
      if (o.kind == detail::OutValue::Kind::Tensor) ids.push_back(value_of(o.tensor));
    graph_->set_outputs(std::move(ids));
    return graph_;
  }

  const std::vector<std::pair<std::string, int64_t>>& attributes_read() const { return attrs_; }

  // ---- TraceHook --------------------------------------------------------------------------------
  void before_meta(ops::OpKind, std::span<const Tensor>) override {
    loc_ = current_user_location();
    have_loc_ = true;
  }

  std::vector<Tensor> record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                             std::vector<TensorMeta> metas) override {
    core::SourceLocation ul = have_loc_ ? loc_ : current_user_location();
    have_loc_ = false;
    std::vector<ir::ValueId> ids;
    ids.reserve(in.size());
    for (const Tensor& t : in) ids.push_back(t.defined() ? value_of(t) : ir::kNoValue);
    std::vector<ir::ValueId> outs =
        graph_->add_call(op, std::move(ids), attrs, metas, ul);
    return fakes(outs, metas);
  }

  void on_host_read(const Tensor& t, const char* what) override {
    if (!t.is_fake()) return;
    BreakInfo b = host_read_break(what);
    b.reason += " inside region " + graph_->name;
    throw GraphBreakError(std::move(b));
  }

  void on_graph_break(const std::string& reason) override {
    throw_graph_break(reason + " inside region " + graph_->name, "graph_break");
  }

  std::vector<Tensor> on_data_dependent(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs) override {
    bool any_fake = false;
    for (const auto& t : in) any_fake |= t.defined() && t.is_fake();
    if (!any_fake) {
      ops::TraceHookScope eager(nullptr);
      return ops::run_eager(op, in, attrs);
    }
    throw_graph_break("data-dependent output shape inside region " + graph_->name, ops::describe_call(op, in));
  }

  bool inlines_compiled_calls() const override { return true; }

  std::vector<Tensor> on_cond(const Tensor& pred, const ops::BranchFn& true_fn, const ops::BranchFn& false_fn,
                              std::span<const Tensor> operands) override {
    core::SourceLocation ul = current_user_location();
    TracedCond c = trace_cond(this, pred, true_fn, false_fn, operands);
    std::vector<ir::ValueId> ids;
    for (const Tensor& t : c.inputs) ids.push_back(value_of(t));
    std::vector<ir::ValueId> outs = graph_->add_call(ops::OpKind::cond, std::move(ids), {}, c.outputs,
                                                     ul, c.branches);
    return fakes(outs, c.outputs);
  }

  // ---- AttributeReader: the enclosing capture guards the read; the body sees a constant ---------
  SymInt read_attribute(const Module* m, const std::string& name, int64_t value) override {
    SymInt v = reader_ ? reader_->read_attribute(m, name, value) : SymInt(value);
    const int64_t c = v.is_symbolic() ? v.guard_int() : v.hint();
    auto it = paths_.find(m);
    std::string rel = (it == paths_.end() ? std::string() : it->second) + name;
    bool seen = false;
    for (const auto& [n, x] : attrs_) seen |= n == rel;
    if (!seen) attrs_.emplace_back(rel, c);
    return SymInt(c);
  }

  // ---- RegionHost (nested regions) ----------------------------------------------------------------
  ops::TraceHook* region_hook() override { return this; }
  RegionRegistry& region_registry() override { return host_.region_registry(); }
  TensorMeta traced_meta(const Tensor& t) override {
    if (auto it = param_metas_.find(t.impl()); it != param_metas_.end()) return it->second;
    return t.meta();
  }
  std::string module_path(const Module* m) override {
    auto it = paths_.find(m);
    return host_.module_path(&module_) + (it == paths_.end() ? std::string() : it->second);
  }
  std::vector<Tensor> record_region(std::span<const Tensor> inputs, const ops::Attrs& attrs,
                                    const std::vector<TensorMeta>& outputs, std::shared_ptr<const ir::Graph> body) override {
    core::SourceLocation ul = current_user_location();
    std::vector<ir::ValueId> ids;
    for (const Tensor& t : inputs) ids.push_back(value_of(t));
    std::vector<ir::ValueId> outs = graph_->add_call(ops::OpKind::call_region, std::move(ids), attrs, outputs,
                                                     ul, {std::move(body)});
    return fakes(outs, outputs);
  }

 private:
  ir::ValueId value_of(const Tensor& t) {
    const TensorImpl* impl = t.impl();
    if (impl->trace.tracer == this) return static_cast<ir::ValueId>(impl->trace.value);
    if (auto it = outer_.find(impl); it != outer_.end()) return it->second;
    if (t.is_fake())
      throw NotARegion{"its forward reads a traced tensor it did not receive as an argument (a closure over the "
                       "caller's values); pass it as an argument to make the child a region"};
    // A real tensor that is neither an argument nor a parameter/buffer of the child (a global): a
    // constant of the body, as it would be of the caller's graph.
    ir::ValueId v = graph_->add_constant(t);
    outer_.emplace(impl, v);
    constants_.push_back(t);
    return v;
  }

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

  RegionHost& host_;
  Module& module_;
  AttributeReader* reader_;
  std::shared_ptr<ir::Graph> graph_;
  std::vector<detail::ArgValue> args_;
  std::unordered_map<const TensorImpl*, ir::ValueId> outer_;
  std::unordered_map<const TensorImpl*, TensorMeta> param_metas_;
  std::unordered_map<const Module*, std::string> paths_;
  std::vector<std::pair<std::string, int64_t>> attrs_;
  std::vector<Tensor> constants_;
  std::vector<std::shared_ptr<TensorImpl>> made_;
  core::SourceLocation loc_;
  bool have_loc_ = false;
};

/// The key of a use, attributes excluded (region.h, step 2). Empty `why` when the call can be a region.
struct UseKey {
  std::vector<std::pair<std::string, std::string>> parts;
  std::string why_not;
};

void child_types(const Module& m, const std::string& prefix, UseKey& k) {
  for (const auto& [n, c] : m.named_children()) {
    k.parts.emplace_back("child " + prefix + n, demangled_type_name(typeid(*c).name()));
    child_types(*c, prefix + n + ".", k);
  }
}

UseKey use_key(RegionHost& host, const Module& m, const std::string& type, std::span<const detail::ArgValue> args) {
  UseKey k;
  k.parts.emplace_back("type", type);
  child_types(m, "", k);
  for (const auto& [name, ptr] : m.slots().tensors)
    k.parts.emplace_back("parameter " + name, ptr->defined() ? meta_text(host.traced_meta(*ptr)) : "undefined");
  using K = detail::ArgValue::Kind;
  for (size_t i = 0; i < args.size(); ++i) {
    const detail::ArgValue& a = args[i];
    std::string label = fmt::format("argument {}", i);
    switch (a.kind) {
      case K::Tensor:
        k.parts.emplace_back(label, a.tensor.defined() ? meta_text(host.traced_meta(a.tensor)) : "undefined");
        break;
      case K::Int: k.parts.emplace_back(label, fmt::format("int {}", a.i)); break;
      case K::Bool: k.parts.emplace_back(label, a.b ? "true" : "false"); break;
      case K::Float: k.parts.emplace_back(label, fmt::format("float {}", a.f)); break;
      case K::String: k.parts.emplace_back(label, "string " + a.s); break;
      case K::SymInt:
        if (a.sym.is_symbolic()) k.why_not = fmt::format("argument {} is a symbolic SymInt", i);
        else k.parts.emplace_back(label, fmt::format("int {}", a.sym.hint()));
        break;
      case K::SymFloat:
        if (a.symf.is_symbolic()) k.why_not = fmt::format("argument {} is a symbolic SymFloat", i);
        else k.parts.emplace_back(label, fmt::format("float {}", a.f));
        break;
      case K::TensorList: k.why_not = fmt::format("argument {} is a tensor list", i); break;
    }
  }
  return k;
}

/// Reads attribute `rel` (dotted, relative to `m`) through the current reader, so the enclosing
/// capture guards it; returns its value, or nullopt when `m` no longer has it.
std::optional<int64_t> read_relative_attribute(const Module& m, const std::string& rel) {
  size_t dot = rel.rfind('.');
  const Module* owner = dot == std::string::npos ? &m : submodule(m, rel.substr(0, dot));
  if (!owner) return std::nullopt;
  std::string leaf = dot == std::string::npos ? rel : rel.substr(dot + 1);
  for (const auto& [n, v] : owner->named_attributes())
    if (n == leaf) {
      SymInt s = owner->attribute(leaf);
      return s.is_symbolic() ? s.guard_int() : s.hint();
    }
  return std::nullopt;
}

/// What split a new use from the variants of its type: the first differing key component, or the
/// first attribute whose value differs.
std::string split_reason(const std::vector<RegionVariant>& variants, const UseKey& key, const Module& m,
                         const std::string& path) {
  for (const RegionVariant& v : variants) {
    if (v.key != key.parts) continue;
    for (const auto& [rel, value] : v.attributes) {
      std::optional<int64_t> now;
      {
        AttributeReaderScope quiet(nullptr);
        now = read_relative_attribute(m, rel);
      }
      if (!now || *now != value)
        return fmt::format("attribute self.{}{}: {} vs {} ({}#{})", path, rel, now ? std::to_string(*now) : "absent",
                           value, v.type, v.index);
    }
  }
  for (const RegionVariant& v : variants)
    for (size_t i = 0; i < key.parts.size() && i < v.key.size(); ++i)
      if (key.parts[i] != v.key[i]) {
        std::string what = key.parts[i].first == v.key[i].first ? key.parts[i].first
                                                                 : key.parts[i].first + " / " + v.key[i].first;
        return fmt::format("{}: {} vs {} ({}#{})", what, key.parts[i].second, v.key[i].second, v.type, v.index);
      }
  if (!variants.empty()) return fmt::format("{} components vs {}", key.parts.size(), variants.front().key.size());
  return "first use";
}

}  // namespace

RegionHost* current_region_host() { return t_host; }
RegionHostScope::RegionHostScope(RegionHost* h) : prev_(t_host) { t_host = h; }
RegionHostScope::~RegionHostScope() { t_host = prev_; }

namespace {
struct BodyTable {
  std::mutex mu;
  int64_t next = 1;
  std::unordered_map<int64_t, std::weak_ptr<const ir::Graph>> bodies;
};
BodyTable& body_table() {
  static auto* t = new BodyTable;  // never destroyed: tapes may outlive static destruction order
  return *t;
}
}  // namespace

int64_t register_region_body(const std::shared_ptr<const ir::Graph>& body) {
  BodyTable& t = body_table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto it = t.bodies.begin(); it != t.bodies.end();) it = it->second.expired() ? t.bodies.erase(it) : std::next(it);
  const int64_t id = t.next++;
  t.bodies.emplace(id, body);
  return id;
}

std::shared_ptr<const ir::Graph> region_body(int64_t id) {
  BodyTable& t = body_table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.bodies.find(id);
  std::shared_ptr<const ir::Graph> b = it == t.bodies.end() ? nullptr : it->second.lock();
  if (!b)
    throw RuntimeError(fmt::format("call_region backward: region body {} no longer exists (the compile that traced "
                                   "it is gone); differentiate within the compiled function",
                                   id));
  return b;
}

std::string demangled_type_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string r = status == 0 && d ? d : mangled;
  std::free(d);
  return r;
}

bool is_region_type(const std::vector<std::string>& types, const std::string& type) {
  const std::string bare = strip_namespaces(type);
  for (const std::string& t : types)
    if (t == type || t == bare || strip_namespaces(t) == bare) return true;
  return false;
}

std::string describe_regions(const RegionRegistry& reg) {
  std::string r;
  for (const auto& [type, vs] : reg.by_type)
    for (const RegionVariant& v : vs) {
      std::string attrs;
      for (const auto& [n, x] : v.attributes) attrs += fmt::format("{}{}={}", attrs.empty() ? "" : ", ", n, x);
      r += fmt::format("{}#{} (uses {}, {} nodes): attributes {{{}}}\n", type, v.index, v.uses, v.body->nodes().size(),
                       attrs);
    }
  return r;
}

}  // namespace protean::capture

namespace protean::detail {

// Also true while any capture runs once compile_submodules registered submodules: protean::call
// then goes through region_call, which handles submodule boundaries first.
bool region_capture_active() {
  return capture::current_region_host() != nullptr || (submodules_registered() && ops::current_trace_hook() != nullptr);
}

namespace {

/// region_call and auto_region_call: `site` (non-empty for an auto region) names the use in logs
/// instead of the module path; an auto region's body may throw InlineRegion or break the graph,
/// and the use is then traced inline.
bool region_call_impl(Module& m, const std::string& tname, const std::string& site, const Body& body,
                      std::span<const ArgValue> args, std::vector<OutValue>& outs) {
  using namespace capture;
  RegionHost* host = current_region_host();
  RegionRegistry& reg = host->region_registry();
  const bool automatic = !site.empty();
  const std::string path = automatic ? site + "." : host->module_path(&m);
  const std::string where = automatic ? site : "self." + path.substr(0, path.empty() ? 0 : path.size() - 1);
  auto log = [&](const std::string& msg) {
    if (observe::log_enabled(LogCat::Regions)) observe::log_line(LogCat::Regions, reg.compile_id, msg);
  };
  UseKey key = use_key(*host, m, tname, args);
  if (!key.why_not.empty()) {
    log(fmt::format("region {} at {}: traced inline ({})", tname, where, key.why_not));
    return false;
  }
  std::vector<RegionVariant>& variants = reg.by_type[tname];
  RegionVariant* hit = nullptr;
  for (RegionVariant& v : variants) {
    if (v.key != key.parts) continue;
    bool same = true;
    for (const auto& [rel, value] : v.attributes) {
      std::optional<int64_t> now = read_relative_attribute(m, rel);  // guarded by the enclosing capture
      if (!now || *now != value) {
        same = false;
        break;
      }
    }
    if (same) {
      hit = &v;
      break;
    }
  }
  if (hit) {
    count_region(false);
    log(fmt::format("region {}#{} hit at {}", tname, hit->index, where));
  } else {
    const std::string reason = split_reason(variants, key, m, path);
    if (static_cast<int>(variants.size()) >= reg.opts->region_variant_limit) {
      std::string msg = fmt::format(
          "region {} hit its variant limit ({}) in {} at {}: the use differs by {}. It is traced inline "
          "into {}'s graph (still compiled, not eager). Make the instances agree on what split them, or raise "
          "RegionOptions::max_variants",
          tname, reg.opts->region_variant_limit, reg.opts->name, automatic ? site : "self." + path, reason,
          reg.opts->name);
      if (reg.opts->fail_on_recompile_limit_hit || reg.opts->fullgraph) throw CompileError(msg);
      if (reg.limit_warned.insert(tname).second) observe::warn(fmt::format("[{}] {}", reg.compile_id, msg));
      log(msg);
      return false;
    }
    RegionVariant v;
    v.type = tname;
    v.index = static_cast<int>(variants.size());
    v.key = key.parts;
    std::vector<OutValue> traced;
    {
      RegionTracer rt(*host, m, tname, args);
      try {
        traced = rt.run(body);
        for (const OutValue& o : traced)
          if (o.kind == OutValue::Kind::SymInt && o.sym.is_symbolic())
            throw NotARegion{"its forward returns a symbolic SymInt"};
        v.body = rt.finish(traced);
      } catch (const NotARegion& e) {
        log(fmt::format("region {} at {}: traced inline ({})", tname, where, e.why));
        return false;
      } catch (const InlineRegion& e) {
        log(fmt::format("region {} at {}: traced inline ({})", tname, where, e.why));
        return false;
      } catch (const GraphBreakError& e) {
        if (!automatic) throw;
        log(fmt::format("region {} at {}: traced inline ({})", tname, where, e.info.reason));
        return false;
      }
      v.attributes = rt.attributes_read();
    }
    for (const OutValue& o : traced)
      if (o.kind == OutValue::Kind::Tensor) v.outputs.push_back(contiguous_meta(o.tensor));
    v.out_template = traced;
    for (OutValue& o : v.out_template) o.tensor = Tensor();
    count_region(true);
    log(fmt::format("region {}#{} compiled at {} ({} nodes, {} attribute(s) in its key){}", tname, v.index,
                    where, v.body->nodes().size(), v.attributes.size(),
                    variants.empty() ? std::string() : "; split from earlier variants by " + reason));
    variants.push_back(std::move(v));
    hit = &variants.back();
  }
  ++hit->uses;
  // call_region(tensor args..., the child's parameters and buffers...)
  std::vector<Tensor> inputs;
  for (const ArgValue& a : args)
    if (a.kind == ArgValue::Kind::Tensor && a.tensor.defined()) inputs.push_back(a.tensor);
  for (const auto& [name, ptr] : m.slots().tensors)
    if (ptr->defined()) inputs.push_back(*ptr);
  ops::Attrs attrs{{"region", fmt::format("{}#{}", tname, hit->index)}};
  std::vector<Tensor> res = host->record_region(inputs, attrs, hit->outputs, hit->body);
  // Training (value_and_grad, compile_train_step): the use goes on the tape like any op; its rule
  // differentiates the body (call_region in derivatives.def). The IR node keeps only `region`.
  if (ops::tape_should_record(inputs)) {
    if (ops::TapeRecorder rec = ops::tape_recorder()) {
      ops::Attrs tape_attrs{{"region", fmt::format("{}#{}", tname, hit->index)},
                            {"body_id", SymInt(register_region_body(hit->body))}};
      rec(ops::OpKind::call_region, inputs, tape_attrs, res);
    }
  }
  outs = hit->out_template;
  size_t k = 0;
  for (OutValue& o : outs)
    if (o.kind == OutValue::Kind::Tensor) o.tensor = res.at(k++);
  return true;
}

}  // namespace

bool region_call(Module& m, const std::type_info& type, const Body& body, std::span<const ArgValue> args,
                 std::vector<OutValue>& outs) {
  using namespace capture;
  if (submodule_call(m, body, args, outs)) return true;
  RegionHost* host = current_region_host();
  if (!host || ops::current_trace_hook() != host->region_hook()) return false;
  const std::string tname = demangled_type_name(type.name());
  if (!is_region_type(host->region_registry().opts->region_types, tname)) return false;
  return region_call_impl(m, tname, "", body, args, outs);
}

bool auto_region_call(Module& m, const std::string& type, const std::string& site, const Body& body,
                      std::span<const ArgValue> args, std::vector<OutValue>& outs) {
  using namespace capture;
  RegionHost* host = current_region_host();
  if (!host || ops::current_trace_hook() != host->region_hook() || !host->region_registry().opts->auto_regions)
    return false;
  // The cuda backend runs no region bodies (a call_region would be a host step): device inputs, or
  // backend cuda, trace the use inline as before.
  const RegionRegistry& reg = host->region_registry();
  bool device = reg.opts->backend == "cuda";
  for (const ArgValue& a : args)
    device |= a.kind == ArgValue::Kind::Tensor && a.tensor.defined() && a.tensor.device().type != DeviceType::CPU;
  if (device) {
    if (observe::log_enabled(LogCat::Regions))
      observe::log_line(LogCat::Regions, reg.compile_id,
                        fmt::format("region {} at {}: traced inline (device tensors or backend cuda: only interp and "
                                    "cpu compile region bodies)", type, site));
    return false;
  }
  return region_call_impl(m, type, site.empty() ? type : site, body, args, outs);
}

}  // namespace protean::detail
