#include "capture/tracer.h"
#include "ir/provenance.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "capture/cond.h"
#include "capture/location.h"
#include "capture/module_trace.h"
#include "capture/region.h"
#include "capture/shape_trace.h"
#include "capture/symfloat.h"
#include "dynamic/policy.h"
#include "ir/sym_util.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "ops/dispatch.h"
#include "protean/autograd.h"
#include "sym/printer.h"
#include "sym/shape_env.h"

namespace protean::capture {

using observe::LogCat;

std::string BreakInfo::where() const {
  if (loc.line > 0) return fmt::format("{}:{}", loc.file, loc.line);
  if (!loc.file.empty()) return loc.file;  // an imported model's node: "onnx node 'If_0' (If)"
  return loc.function.empty() ? "?" : loc.function;  // unresolved_location's explanation (capture/location.h)
}

std::string BreakInfo::text() const { return fmt::format("graph break: {} (op {}) at {}", reason, op, where()); }

BreakInfo make_break(std::string reason, std::string op) {
  // inside an imported model's node (an ONNX If reading its condition), that node, as its ops carry it
  core::SourceLocation where =
      core::t_frontend_provenance ? *core::t_frontend_provenance : user_location_or_unresolved(op);
  return BreakInfo{std::move(reason), std::move(op), std::move(where)};
}

[[noreturn]] void throw_graph_break(const std::string& reason, const std::string& op) {
  throw GraphBreakError(make_break(reason, op));
}

bool RejectedOp::matches(ops::OpKind k, std::span<const Tensor> in) const {
  if (k != op) return false;
  size_t j = 0;
  for (const Tensor& t : in) {
    if (!t.defined()) continue;
    if (j >= dtypes.size() || dtypes[j] != t.dtype()) return false;
    ++j;
  }
  return j == dtypes.size();
}

BreakInfo rejected_op_break(const std::string& backend, const std::string& call, const std::string& why,
                            core::SourceLocation loc) {
  BreakInfo b{fmt::format("backend '{}' does not support {}: {}", backend, call, why), call, std::move(loc)};
  b.rejected_op = true;
  return b;
}

Tensor make_fake(const TensorMeta& m, const void* tracer, ir::ValueId v) {
  auto impl = std::make_shared<TensorImpl>();
  impl->sizes = m.sizes;
  impl->strides = m.strides;
  impl->storage_offset = m.storage_offset;
  impl->dtype = m.dtype;
  impl->device = m.device;
  impl->trace = {tracer, v};
  return Tensor(std::move(impl));
}

BreakInfo host_read_break(const char* what) {
  std::string w = what;
  std::string op = w.substr(0, w.find('('));
  std::string reason;
  if (op == "item") reason = "Tensor::item() reads tensor data on the host";
  else if (op == "item_symint")
    reason = "Tensor::item_symint() reads tensor data on the host (set CompileOptions::capture_scalar_outputs to "
             "capture it as an unbacked symbol)";
  else if (op == "to_vector") reason = "Tensor::to_vector() copies tensor data to the host";
  else if (op == "str") reason = "printing a tensor reads its data on the host";
  else reason = fmt::format("Tensor::{} exposes tensor data to the host", w);
  return make_break(std::move(reason), std::move(op));
}

namespace {

struct PlaceholderInfo {
  ir::ValueId value = ir::kNoValue;
  InputRef ref;
  std::string source;
  const Tensor* real = nullptr;  // the call's tensor (for guards)
  Tensor fake;
  bool contiguous = false;  // strides guarded as "contiguous for the actual sizes"
  bool is_parameter = false;
};

struct DynFloat {
  double hint;
  ir::ValueId value;
  Tensor fake;
  int32_t arg;
  std::string source;
};

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string loc_str(const core::SourceLocation& l) {
  if (l.line > 0) return fmt::format("{}:{}", l.file, l.line);
  return l.function.empty() ? "?" : l.function;
}

class Tracer final : public ops::TraceHook, public AttributeReader, public FloatOwner, public RegionHost {
 public:
  Tracer(detail::CompiledFunctionImpl& frame, std::span<const detail::ArgValue> args, std::string compile_id)
      : frame_(frame), args_(args), compile_id_(std::move(compile_id)), env_(env_options(frame.opts)) {
    graph_ = std::make_shared<ir::Graph>();
    graph_->name = frame.opts.name;
    // Guards and errors name the user's line; without debug info, the function and the op instead.
    env_.set_location_provider([this] {
      return user_location_or_unresolved(have_loc_ && current_op_ ? ops::op_name(*current_op_) : std::string_view());
    });
    env_.set_event_listener([this](const sym::ShapeEvent& ev) {
      bool debug = ev.kind == sym::ShapeEventKind::StaticallyKnown;
      if (observe::log_enabled(LogCat::Dynamic, debug)) observe::log_line(LogCat::Dynamic, compile_id_, ev.message);
      if (tracing_) trace_shape_event(env_, ev, frame_.frame_id, compile_id_);
    });
  }

  std::unique_ptr<CacheEntry> run();
  std::string symbol_values_of(const std::string& text) const;

  // ---- TraceHook ------------------------------------------------------------------------------
  void before_meta(ops::OpKind op, std::span<const Tensor> in) override {
    current_op_ = op;
    current_inputs_.assign(in.begin(), in.end());
    current_loc_ = current_user_location();  // the meta function may guard or throw: attribute it here
    have_loc_ = true;
  }

  std::vector<Tensor> record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                             std::vector<TensorMeta> metas) override {
    current_inputs_.clear();
    core::SourceLocation ul = have_loc_ ? current_loc_ : current_user_location();
    have_loc_ = false;
    if (frame_.op_support) check_support(op, in, attrs, metas, ul);
    if (unbacked_values_) sizes_from_unbacked(op, metas);
    std::vector<ir::ValueId> ids;
    ids.reserve(in.size());
    for (const auto& t : in) ids.push_back(t.defined() ? value_of(t) : ir::kNoValue);
    core::SourceLocation loc{ul.file, ul.line, ul.function};
    // A reverse-mode rule's ops carry the forward op's line: `# [bwd of mlp.cpp:12]`.
    if (const core::SourceLocation* bwd = ir::t_backward_provenance) {
      loc = *bwd;
      saw_backward_ = true;
    }
    // The optimizer part of a training step: `# [optim at train.cpp:40]`.
    else if (ir::t_optimizer_update) loc.function = ir::kOptimizerMarker;
    // A node of an imported model: `# onnx node 'gather_3' (Gather)`.
    else if (const core::SourceLocation* node = core::t_frontend_provenance) loc = *node;
    std::vector<ir::ValueId> outs = graph_->add_call(op, std::move(ids), attrs, metas, loc);
    std::vector<Tensor> result;
    result.reserve(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) result.push_back(make_fake(metas[i], this, outs[i]));
    return result;
  }

  void on_host_read(const Tensor& t, const char* what) override {
    if (t.is_fake()) throw GraphBreakError(host_read_break(what));
  }

  void on_graph_break(const std::string& reason) override { throw_graph_break(reason, "graph_break"); }

  std::optional<SymInt> on_item_symint(const Tensor& t) override;

  std::vector<Tensor> on_data_dependent(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs) override;

  /// One node `cond(pred, operands..., lifted...)` owning both branches as subgraphs (capture/cond.h).
  std::vector<Tensor> on_cond(const Tensor& pred, const ops::BranchFn& true_fn, const ops::BranchFn& false_fn,
                              std::span<const Tensor> operands) override {
    current_op_ = ops::OpKind::cond;
    current_inputs_.clear();
    have_loc_ = false;
    core::SourceLocation ul = current_user_location();
    TracedCond c = trace_cond(this, pred, true_fn, false_fn, operands);
    std::vector<ir::ValueId> ids;
    ids.reserve(c.inputs.size());
    for (const Tensor& t : c.inputs) ids.push_back(value_of(t));
    std::vector<ir::ValueId> outs = graph_->add_call(ops::OpKind::cond, std::move(ids), {}, c.outputs,
                                                     ul, c.branches);
    std::vector<Tensor> result;
    result.reserve(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) result.push_back(make_fake(c.outputs[i], this, outs[i]));
    return result;
  }

  // ---- AttributeReader ---------------------------------------------------------------------------
  // A registered attribute follows automatic dynamic like a SymInt argument (policy.h decide_scalar),
  // unless CompileOptions::dynamic_attributes is off or the module marked it static. A dynamic one
  // is an int symbol (no 0/1 specialization: an attribute is a counter or an offset, not a size) bound
  // from the attribute's storage on every call (ScalarGuard::Kind::Attr with a slot).
  SymInt read_attribute(const Module* m, const std::string& name, int64_t value) override {
    auto it = module_prefix_.find(m);
    std::string source = "self." + (it == module_prefix_.end() ? std::string() : it->second) + name;
    std::optional<size_t> slot;
    for (size_t i = 0; i < frame_.module_slots.attributes.size(); ++i) {
      const auto& [n, ptr] = frame_.module_slots.attributes[i];
      if ("self." + n == source) {
        attr_reads_.insert(i);
        slot = i;
        break;
      }
    }
    if (!slot) return SymInt(value);
    if (auto known = attr_values_.find(*slot); known != attr_values_.end()) return known->second;
    dynamic::DimDecision dec;
    if (!frame_.opts.dynamic_attributes) {
      dec.why = "attribute_static";
    } else if (m->attribute_is_static(name)) {
      dec.why = "mark_static";
    } else {
      dynamic::PolicyInput pin{frame_.opts.dynamic, false, frame_.opts.dynamic_parameters, &frame_.frame_state,
                               frame_.seeds.pgo_ptr(), frame_.seeds.collective_ptr()};
      dec = dynamic::decide_scalar(source, true, pin);
    }
    SymInt v(value);
    if (dec.kind != sym::DimKind::Static) {
      v = env_.create_int_symbol(source, value);
      dyn_attrs_.insert(*slot);
    }
    if (tracing_) dynamic::trace_decision(compile_id_, source, -1, dec, value, v.is_symbolic());
    attr_values_.emplace(*slot, v);
    return v;
  }

  // ---- FloatOwner ---------------------------------------------------------------------------------
  void specialize_floats(uint64_t float_args) override { specialized_floats_ |= float_args; }

  // ---- RegionHost (capture/region.h) -----------------------------------------------------------------
  ops::TraceHook* region_hook() override { return this; }
  RegionRegistry& region_registry() override { return regions_; }
  TensorMeta traced_meta(const Tensor& t) override {
    const TensorImpl* impl = t.impl();
    ir::ValueId v = ir::kNoValue;
    if (impl->trace.tracer == this) v = static_cast<ir::ValueId>(impl->trace.value);
    else if (auto it = real_values_.find(impl); it != real_values_.end()) v = it->second;
    if (v == ir::kNoValue) return t.meta();
    const ir::Value& val = graph_->value(v);
    TensorMeta m;
    m.sizes = val.sizes;
    m.strides = val.strides;
    m.dtype = val.dtype;
    m.device = t.device();
    return m;
  }
  std::string module_path(const Module* m) override {
    auto it = module_prefix_.find(m);
    return it == module_prefix_.end() ? std::string() : it->second;
  }
  /// One node `call_region(inputs...)` owning the region's body (capture/region.h).
  std::vector<Tensor> record_region(std::span<const Tensor> inputs, const ops::Attrs& attrs,
                                    const std::vector<TensorMeta>& outputs, std::shared_ptr<const ir::Graph> body) override {
    current_op_ = ops::OpKind::call_region;
    current_inputs_.clear();
    have_loc_ = false;
    core::SourceLocation ul = current_user_location();
    std::vector<ir::ValueId> ids;
    ids.reserve(inputs.size());
    for (const Tensor& t : inputs) ids.push_back(value_of(t));
    std::vector<ir::ValueId> outs = graph_->add_call(ops::OpKind::call_region, std::move(ids), attrs, outputs,
                                                     ul, {std::move(body)});
    std::vector<Tensor> result;
    result.reserve(outs.size());
    for (size_t i = 0; i < outs.size(); ++i) result.push_back(make_fake(outputs[i], this, outs[i]));
    return result;
  }

 private:
  static sym::ShapeEnvOptions env_options(const CompileOptions& o) {
    sym::ShapeEnvOptions e;
    e.keep_one_symbolic = o.dynamic == Dynamic::On && o.keep_size_one_symbolic;
    return e;
  }

  ir::ValueId value_of(const Tensor& t) {
    const TensorImpl* impl = t.impl();
    if (impl->trace.tracer == this) return static_cast<ir::ValueId>(impl->trace.value);
    if (t.is_fake())
      throw CompileError(fmt::format("a FakeTensor from another capture reached {} in {}",
                                     current_op_ ? std::string(ops::op_name(*current_op_)) : "an op", frame_.opts.name));
    auto it = real_values_.find(impl);
    if (it != real_values_.end()) return it->second;
    ir::ValueId v = graph_->add_constant(t);
    constants_.push_back(t);
    real_values_.emplace(impl, v);
    return v;
  }

  std::string arg_name(size_t i) const {
    if (i < frame_.opts.arg_names.size() && !frame_.opts.arg_names[i].empty()) return frame_.opts.arg_names[i];
    return fmt::format("args[{}]", i);
  }

  void add_tensor_input(const Tensor& real, const std::string& source, InputRef ref, bool is_param);
  void add_inputs();
  void collect_module_prefixes(const Module& m, const std::string& prefix) {
    module_prefix_[&m] = prefix;
    for (const auto& [n, c] : m.named_children()) collect_module_prefixes(*c, prefix + n + ".");
  }
  [[noreturn]] void rethrow_violation(const sym::ConstraintViolation& e);
  void check_support(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                     const std::vector<TensorMeta>& metas, const core::SourceLocation& ul);
  void sizes_from_unbacked(ops::OpKind op, const std::vector<TensorMeta>& metas);
  std::unique_ptr<CacheEntry> build_entry(const std::vector<detail::OutValue>& outs);
  void substitute_specialized_ones();

  detail::CompiledFunctionImpl& frame_;
  std::span<const detail::ArgValue> args_;
  std::string compile_id_;
  sym::ShapeEnv env_;
  std::shared_ptr<ir::Graph> graph_;
  std::vector<PlaceholderInfo> placeholders_;
  std::vector<detail::ArgValue> traced_args_;
  std::vector<DynFloat> dyn_floats_;
  std::vector<std::pair<size_t, std::string>> dyn_ints_;  // (arg index, source)
  std::unordered_map<const TensorImpl*, ir::ValueId> real_values_;
  std::vector<Tensor> constants_;
  std::unordered_map<const Module*, std::string> module_prefix_;
  std::set<size_t> attr_reads_;
  std::set<size_t> dyn_attrs_;                     // attributes read as symbols
  std::unordered_map<size_t, SymInt> attr_values_;  // attribute slot → the value this trace reads
  uint64_t specialized_floats_ = 0;                 // float args a SymFloat comparison specialized
  std::optional<ops::OpKind> current_op_;
  std::vector<Tensor> current_inputs_;
  core::SourceLocation current_loc_;
  bool have_loc_ = false;
  bool unbacked_values_ = false;  // item_symint created an unbacked symbol that is not size-like yet
  bool saw_backward_ = false;     // a reverse-mode rule recorded ops (the body differentiates itself)
  const bool tracing_ = observe::trace_enabled();  // structured trace events (docs/trace-format.md)
  RegionRegistry regions_;                         // region variants of this compile (capture/region.h)
};

void Tracer::add_tensor_input(const Tensor& real, const std::string& source, InputRef ref, bool is_param) {
  dynamic::PolicyInput pin{frame_.opts.dynamic, is_param, frame_.opts.dynamic_parameters, &frame_.frame_state,
                           frame_.seeds.pgo_ptr(), frame_.seeds.collective_ptr()};
  std::vector<dynamic::DimMark> marks = dynamic::marks_of(real.impl());
  const IntVec sizes = real.int_sizes();
  const IntVec strides = real.int_strides();
  SymIntVec ssizes;
  bool any_symbolic = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::string size_source = fmt::format("{}.size()[{}]", source, d);
    dynamic::DimMark mark = d < marks.size() ? marks[d] : dynamic::DimMark{};
    dynamic::DimDecision dec = dynamic::decide_dim(source, size_source, d, mark, pin);
    if (dec.kind == sym::DimKind::Static) {
      ssizes.emplace_back(sizes[d]);
    } else {
      SymInt s = env_.create_symbol(size_source, sizes[d], dec.kind, dec.constraint);
      any_symbolic |= s.is_symbolic();
      ssizes.push_back(s);
    }
    if (tracing_)
      dynamic::trace_decision(compile_id_, source, static_cast<int64_t>(d), dec, sizes[d], ssizes.back().is_symbolic());
  }
  PlaceholderInfo p;
  p.ref = ref;
  p.source = source;
  p.is_parameter = is_param;
  SymIntVec sstrides;
  if (any_symbolic && real.is_contiguous()) {
    sstrides = ir::contiguous_strides_of(ssizes);
    p.contiguous = true;
  } else {
    sstrides = to_symint_vec(strides);
  }
  p.value = graph_->add_placeholder(source, real.dtype(), ssizes, sstrides);
  TensorMeta m;
  m.sizes = ssizes;
  m.strides = sstrides;
  m.dtype = real.dtype();
  m.device = real.device();
  p.fake = make_fake(m, this, p.value);
  p.fake.set_requires_grad(real.requires_grad());
  placeholders_.push_back(std::move(p));
}

void Tracer::add_inputs() {
  dynamic::PolicyInput pin{frame_.opts.dynamic, false, frame_.opts.dynamic_parameters, &frame_.frame_state,
                           frame_.seeds.pgo_ptr(), frame_.seeds.collective_ptr()};
  traced_args_.assign(args_.begin(), args_.end());
  for (size_t i = 0; i < args_.size(); ++i) {
    const detail::ArgValue& a = args_[i];
    std::string src = arg_name(i);
    using K = detail::ArgValue::Kind;
    switch (a.kind) {
      case K::Tensor:
        if (!a.tensor.defined()) break;
        add_tensor_input(a.tensor, src, {InputRef::Kind::Arg, static_cast<int32_t>(i), 0}, false);
        traced_args_[i].tensor = placeholders_.back().fake;
        break;
      case K::TensorList:
        for (size_t j = 0; j < a.tensors.size(); ++j) {
          if (!a.tensors[j].defined()) continue;
          add_tensor_input(a.tensors[j], fmt::format("{}[{}]", src, j),
                           {InputRef::Kind::ListElem, static_cast<int32_t>(i), static_cast<int32_t>(j)}, false);
          traced_args_[i].tensors[j] = placeholders_.back().fake;
        }
        break;
      case K::SymInt: {
        dynamic::DimDecision dec = dynamic::decide_scalar(src, true, pin);
        if (dec.kind != sym::DimKind::Static) {
          // Ints are not sizes: no duck sizing, but 0/1 still specialize (as PyTorch does for ints). A
          // negative value (an offset, a dim -1) is an int symbol over the whole range: it is no size.
          SymInt s = a.i < 0 ? env_.create_int_symbol(src, a.i) : env_.create_symbol(src, a.i, sym::DimKind::Dynamic);
          traced_args_[i].sym = s;
          if (s.is_symbolic()) dyn_ints_.emplace_back(i, src);
        } else {
          traced_args_[i].sym = SymInt(a.i);
        }
        if (tracing_) dynamic::trace_decision(compile_id_, src, -1, dec, a.i, traced_args_[i].sym.is_symbolic());
        break;
      }
      case K::Float:
      case K::SymFloat: {
        // Only a SymFloat is ever dynamic: what the function computes from it is traced (capture/symfloat.h).
        // A plain double reaches the function as a C++ value whose uses the trace cannot see (arithmetic,
        // comparisons, dtype choices), so it stays a constant guarded by value under every `dynamic`
        // setting, as torch.compile specializes Python floats by default (specialize_float).
        bool dyn = a.kind == K::SymFloat &&
                   (frame_.opts.dynamic == Dynamic::On ||
                    (frame_.opts.dynamic != Dynamic::Off && frame_.frame_state.scalar_dynamic(src)) ||
                    dynamic::allowlisted(src));
        if (dyn) {
          PlaceholderInfo p;
          p.ref = {InputRef::Kind::DynFloat, static_cast<int32_t>(i), 0};
          p.source = src;
          p.value = graph_->add_placeholder(src, DType::F64, {}, {});
          p.fake = make_fake(TensorMeta::contiguous({}, DType::F64), this, p.value);
          dyn_floats_.push_back({a.f, p.value, p.fake, static_cast<int32_t>(i), src});
          if (a.kind == K::SymFloat) traced_args_[i].symf = symbolic_float_arg(p.fake, a.f, static_cast<int32_t>(i));
          placeholders_.push_back(std::move(p));
        }
        break;
      }
      case K::Int:
      case K::Bool:
      case K::String:
        break;
    }
  }
  if (frame_.module) {
    collect_module_prefixes(*frame_.module, "");
    for (size_t k = 0; k < frame_.module_tensors.size(); ++k) {
      const Tensor& t = *frame_.module_tensors[k];
      if (!t.defined()) continue;
      add_tensor_input(t, "self." + frame_.module_slots.tensors[k].first,
                       {InputRef::Kind::ModuleTensor, static_cast<int32_t>(k), 0}, true);
      // Reads of the real parameter inside forward resolve to the placeholder.
      real_values_[t.impl()] = placeholders_.back().value;
    }
  }
}

void Tracer::rethrow_violation(const sym::ConstraintViolation& e) {
  std::string msg = e.what();
  // Name the input the strict dim was unified with (an op comparing it to a static size).
  if (current_op_ && !current_inputs_.empty()) {
    for (const auto& info : env_.symbols()) {
      if (!info.strict || info.sources.empty() || !info.hint) continue;
      if (msg.find(info.sources.front()) == std::string::npos) continue;
      for (const auto& t : current_inputs_) {
        if (!t.defined() || t.impl()->trace.tracer != this) continue;
        const ir::Value& v = graph_->value(static_cast<ir::ValueId>(t.impl()->trace.value));
        const ir::Node& n = graph_->nodes().at(static_cast<size_t>(v.node));
        if (n.kind != ir::NodeKind::Placeholder) continue;
        for (size_t d = 0; d < t.sizes().size(); ++d) {
          const SymInt& s = t.sizes()[d];
          if (!s.is_symbolic() && s.hint() == *info.hint && n.source + "" != "") {
            std::string other = fmt::format("{}.size()[{}]", n.source, d);
            if (other == info.sources.front()) continue;
            msg += fmt::format(" {} was unified with static {} by {} at {}.", info.sources.front(), other,
                               ops::op_name(*current_op_),
                               loc_str(current_loc_.line > 0 ? current_loc_ : unresolved_location(ops::op_name(*current_op_))));
            throw CompileError(msg);
          }
        }
      }
    }
  }
  throw CompileError(msg);
}

std::vector<Tensor> Tracer::on_data_dependent(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs) {
  const std::string call = ops::describe_call(op, in);
  bool any_fake = false;
  for (const auto& t : in) any_fake |= t.defined() && t.is_fake();
  if (!any_fake) {  // real (constant) inputs: the size is known now; bake the result in
    std::vector<Tensor> r;
    {
      ops::TraceHookScope eager(nullptr);
      r = ops::run_eager(op, in, attrs);
    }
    return r;
  }
  if (!frame_.opts.capture_scalar_outputs || op != ops::OpKind::nonzero)
    throw_graph_break("data-dependent output shape (set CompileOptions::capture_scalar_outputs to capture it)", call);
  // nonzero → i64 [u, rank] with a fresh size-like unbacked symbol u (bound by the backend at run time).
  before_meta(op, in);
  SymInt n = env_.create_unbacked_symint(fmt::format("{}.size()[0]", call), /*size_like=*/true);
  std::vector<TensorMeta> metas{TensorMeta::contiguous({n, SymInt(in[0].dim())}, DType::I64)};
  return record(op, in, attrs, std::move(metas));
}

// The backend's predicate (registry.h OpSupport) on an op about to be recorded: a rejection is a
// graph break at the op's user line.
void Tracer::check_support(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                           const std::vector<TensorMeta>& metas, const core::SourceLocation& ul) {
  backend::OpQuery q{op, in, attrs, metas};
  std::optional<std::string> why = frame_.op_support(q);
  if (!why) return;
  BreakInfo b = rejected_op_break(frame_.opts.backend, ops::describe_call(op, in), *why, ul);
  RejectedOp r{op, {}, *why};
  for (const Tensor& t : in)
    if (t.defined()) r.dtypes.push_back(t.dtype());
  b.learn = std::move(r);
  throw GraphBreakError(std::move(b));
}

// An unbacked value (item_symint) used in an output size is a size from now on: sizes must be >= 0,
// asserted when the graph runs (torch._check_is_size); a plain symbol becomes size-like.
void Tracer::sizes_from_unbacked(ops::OpKind op, const std::vector<TensorMeta>& metas) {
  bool pending = false;
  for (const TensorMeta& m : metas)
    for (const SymInt& sz : m.sizes) {
      if (!sz.is_symbolic()) continue;
      bool unbacked = false;
      for (sym::Expr f : sym::free_symbols(sz.expr())) {
        const sym::SymbolInfo* i = env_.symbol_info(f);
        unbacked |= i && !i->hint && !i->size_like;
      }
      if (!unbacked) continue;
      env_.check_is_size(sz, fmt::format("{}: the size {} must be >= 0", ops::op_name(op), sz.str()));
    }
  for (const sym::SymbolInfo& i : env_.symbols()) pending |= !i.hint && !i.size_like;
  unbacked_values_ = pending;
}

std::optional<SymInt> Tracer::on_item_symint(const Tensor& t) {
  if (!t.is_fake() || !frame_.opts.capture_scalar_outputs) return std::nullopt;
  const ops::OpKind op = ops::OpKind::local_scalar_dense;
  std::span<const Tensor> in(&t, 1);
  before_meta(op, in);
  // The meta function first: a wrong dtype or element count is the user's error, not a symbol.
  (void)ops::run_meta(op, in, {{"symbol", SymInt(0)}});
  SymInt u = env_.create_unbacked_symint(fmt::format("{}.item_symint()", ops::describe_call(op, in)), false);
  switch (t.dtype()) {
    case DType::Bool: env_.constrain_range(u, {0, 1}); break;
    case DType::U8: env_.constrain_range(u, {0, 255}); break;
    case DType::I8: env_.constrain_range(u, {-128, 127}); break;
    case DType::I32: env_.constrain_range(u, {INT32_MIN, INT32_MAX}); break;
    case DType::I64:
    case DType::F16:
    case DType::BF16:
    case DType::F32:
    case DType::F64:
      break;
  }
  ops::Attrs attrs{{"symbol", u}};
  record(op, in, attrs, ops::run_meta(op, in, attrs));
  unbacked_values_ = true;
  return u;
}

/// " (in this call s0 = 5 from args[0].size()[1], ...)" for the backed symbols `text` names, "" for none.
std::string Tracer::symbol_values_of(const std::string& text) const {
  std::string values;
  for (const sym::SymbolInfo& info : env_.symbols()) {
    if (!info.hint || !info.symbol) continue;
    const std::string& name = info.symbol->name;
    // the name as a whole word: s1 must not match inside s10
    bool named = false;
    for (size_t p = text.find(name); p != std::string::npos && !named; p = text.find(name, p + 1)) {
      const size_t end = p + name.size();
      const bool left = p == 0 || !std::isalnum(static_cast<unsigned char>(text[p - 1]));
      const bool right = end == text.size() || !std::isalnum(static_cast<unsigned char>(text[end]));
      named = left && right;
    }
    if (!named) continue;
    values += fmt::format("{}{} = {}", values.empty() ? "" : ", ", name, *info.hint);
    if (!info.sources.empty()) values += " from " + info.sources.front();
  }
  return values.empty() ? std::string() : " (in this call " + values + ")";
}

std::unique_ptr<CacheEntry> Tracer::run() {
  LocationContextScope location_scope(frame_.opts.name);  // messages without a user line name the function
  SymbolizerSessionScope symbolizer_scope;                // libdw's session closes when the last trace ends
  FloatOwnerScope float_scope(this);                      // add_inputs makes the dynamic SymFloats
  add_inputs();
  std::vector<detail::OutValue> outs;
  try {
    sym::ShapeEnvScope env_scope(env_);
    ops::TraceHookScope hook_scope(this);
    AttributeReaderScope attr_scope(this);
    regions_.opts = &frame_.opts;
    regions_.compile_id = compile_id_;
    regions_.root = frame_.module.get();
    RegionHostScope region_scope(frame_.opts.region_types.empty() && !frame_.opts.auto_regions ? nullptr : this);
    outs = frame_.body(traced_args_);
  } catch (const sym::ConstraintViolation& e) {
    rethrow_violation(e);
  } catch (const ShapeError& e) {
    // A shape error names sizes by their symbols ("inner dimensions do not match (s0 vs 4)"): say what
    // each symbol it mentions is in this call.
    throw ShapeError(std::string(e.what()) + symbol_values_of(e.what()));
  } catch (const sym::DataDependentError& e) {
    // The stack has unwound: the location is the one the ShapeEnv took when the guard was asked (the
    // user's line), else the op's whose meta function asked. The op is named only when the guard came
    // from its meta function (between before_meta and record), not from user code after it.
    const bool in_meta = have_loc_ && current_op_;
    core::SourceLocation where = !e.where.empty() ? e.where : in_meta ? current_loc_ : core::SourceLocation{};
    throw GraphBreakError(BreakInfo{fmt::format("data-dependent guard ({})", e.what()),
                                    in_meta ? std::string(ops::op_name(*current_op_)) : "guard", std::move(where)});
  }
  return build_entry(outs);
}

// A size 1 kept symbolic (dynamic=On) that an op then specialized (`Eq(s3, 1)` from a broadcast) is
// still a symbol in the values recorded before the guard: the placeholder, earlier ops. A lowering
// decides broadcasting by `size == 1`, so every recorded size, stride and SymInt attribute gets the
// 1 (or 0) substituted; the tensor guard then checks that dim as a static 1. Likewise a symbol an op
// found equal to another symbol (`Eq(s2, s1)`: scaled_dot_product_attention's key and value lengths,
// automatic-dynamic sizes that duck sizing did not share) becomes that symbol in every recorded
// value, so the backends see one size where the guards proved one (a kernel that needs equal lengths
// takes them; Inductor's sizevars simplify with the same replacements). The symbol stays bound from
// its source and guarded equal. Replacements by other values (`s1 -> 2*s0`, constants above 1) keep
// their symbol, as before.
void Tracer::substitute_specialized_ones() {
  std::unordered_map<sym::Expr, sym::Expr> ones;
  for (const auto& [symbol, value] : env_.replacements())
    if ((value->is_integer() && value->value >= 0 && value->value <= 1) || value->is_symbol()) ones.emplace(symbol, value);
  if (ones.empty()) return;
  auto fix = [&](SymInt& v) {
    if (!v.is_symbolic()) return;
    sym::Expr e = env_.simplify(sym::substitute(v.expr(), ones));
    if (e != v.expr()) v = ir::from_expr(e, v.hint());
  };
  for (ir::Value& v : graph_->values()) {
    for (SymInt& d : v.sizes) fix(d);
    for (SymInt& d : v.strides) fix(d);
  }
  for (ir::Node& n : graph_->nodes())
    for (ops::Attr& a : n.attrs.items()) {
      if (auto* si = std::get_if<SymInt>(&a.value)) fix(*si);
      else if (auto* sv = std::get_if<SymIntVec>(&a.value))
        for (SymInt& d : *sv) fix(d);
    }
}

std::unique_ptr<CacheEntry> Tracer::build_entry(const std::vector<detail::OutValue>& outs) {
  substitute_specialized_ones();
  auto entry = std::make_unique<CacheEntry>();
  entry->compile_id = compile_id_;
  // ---- outputs ----
  std::vector<ir::ValueId> graph_outs;
  for (const auto& o : outs) {
    OutSpec spec;
    switch (o.kind) {
      case detail::OutValue::Kind::Tensor:
        if (!o.tensor.defined()) {
          spec.kind = OutSpec::Kind::Undefined;
          break;
        }
        spec.kind = OutSpec::Kind::GraphOutput;
        spec.index = static_cast<int32_t>(graph_outs.size());
        graph_outs.push_back(value_of(o.tensor));
        break;
      case detail::OutValue::Kind::Int:
      case detail::OutValue::Kind::SymInt:
        if (o.sym.is_symbolic()) {
          spec.kind = OutSpec::Kind::SymExpr;
          spec.expr = env_.simplify(o.sym.expr());
        } else {
          spec.kind = OutSpec::Kind::Int;
          spec.i = o.sym.hint();
        }
        break;
      case detail::OutValue::Kind::Float:
        spec.kind = OutSpec::Kind::Float;
        spec.f = o.f;
        break;
      case detail::OutValue::Kind::Bool:
        spec.kind = OutSpec::Kind::Bool;
        spec.b = o.b;
        break;
    }
    entry->outputs.push_back(spec);
  }
  graph_->set_outputs(graph_outs);

  // ---- which inputs the graph reads ----
  std::unordered_set<ir::ValueId> read;
  for (const auto& n : graph_->nodes())
    if (n.kind == ir::NodeKind::Call || n.kind == ir::NodeKind::Output)
      for (ir::ValueId v : n.inputs) read.insert(v);
  sym::GuardSet gs = env_.produce_guards();
  std::unordered_set<std::string> guard_sources;
  for (const auto& b : gs.symbols)
    for (const auto& s : b.sources) guard_sources.insert(s);
  for (const auto& r : gs.replaced)
    for (const auto& s : r.sources) guard_sources.insert(s);

  // Floats baked anywhere other than as a scalar operand lose their dynamism: guard their value.
  std::set<int32_t> baked_floats;
  auto find_baked = [&](const ir::Graph& g) {
    for (const auto& n : g.nodes()) {
      if (n.kind != ir::NodeKind::Call) continue;
      for (const auto& a : n.attrs.items())
        if (const double* d = std::get_if<double>(&a.value))
          for (const auto& df : dyn_floats_)
            if (same_bits(*d, df.hint)) baked_floats.insert(df.arg);
    }
  };
  find_baked(*graph_);
  ir::for_each_subgraph(*graph_, find_baked);  // cond branches
  for (const auto& df : dyn_floats_)           // compared or converted to double (capture/symfloat.h)
    if (specialized_floats_ & (uint64_t{1} << (df.arg < 63 ? df.arg : 63))) baked_floats.insert(df.arg);

  // ---- guards and slots ----
  std::vector<sym::SourceSlot> bindings;
  auto new_slot = [&](const std::string& source) {
    int32_t s = entry->num_slots++;
    entry->slot_sources.push_back(source);
    bindings.push_back({source, s});
    return s;
  };
  std::vector<std::string> grad_inputs;  // inputs the graph reads that require grad
  for (const auto& p : placeholders_) {
    if (p.ref.kind == InputRef::Kind::DynFloat) continue;
    bool uses = read.count(p.value) != 0;
    const ir::Value& v = graph_->value(p.value);
    for (size_t d = 0; d < v.sizes.size() && !uses; ++d)
      uses = guard_sources.count(fmt::format("{}.size()[{}]", p.source, d)) != 0;
    // A tensor argument is guarded even when no op reads it: the function may have read its static
    // sizes in C++ (`x.expand(like.sizes())`), which the trace cannot see, so a new size must miss.
    // Module members keep the narrower rule (a model's unused parameters would cost every call a
    // guard each; their sizes rarely change).
    const bool argument = p.ref.kind == InputRef::Kind::Arg || p.ref.kind == InputRef::Kind::ListElem;
    if (!uses && !argument) continue;
    TensorGuard g;
    g.ref = p.ref;
    g.source = p.source;
    const Tensor* real = resolve_input(p.ref, args_, frame_.module_tensors);
    g.dtype = real->dtype();
    g.device = real->device();
    g.requires_grad = real->requires_grad();
    if (g.requires_grad && uses) grad_inputs.push_back(p.source);
    g.contiguous = p.contiguous;
    for (size_t d = 0; d < v.sizes.size(); ++d) {
      const SymInt& s = v.sizes[d];
      g.sizes.push_back(s.hint());
      g.slots.push_back(s.is_symbolic() ? new_slot(fmt::format("{}.size()[{}]", p.source, d)) : -1);
    }
    if (!p.contiguous) g.strides = real->int_strides();
    entry->tensors.push_back(std::move(g));
  }
  // Module members that are one tensor now (tied): forward's reads of both went to one placeholder.
  for (size_t k = 0; k < frame_.module_tensors.size(); ++k) {
    const Tensor& t = *frame_.module_tensors[k];
    if (!t.defined()) continue;
    for (size_t j = 0; j < k; ++j)
      if (frame_.module_tensors[j]->defined() && frame_.module_tensors[j]->impl() == t.impl()) {
        entry->module_ties.emplace_back(static_cast<int32_t>(k), static_cast<int32_t>(j));
        entry->module_tie_texts.push_back(fmt::format(
            "module members 'self.{}' and 'self.{}' are no longer one tensor (they were tied when traced)",
            frame_.module_slots.tensors[k].first, frame_.module_slots.tensors[j].first));
        break;
      }
  }
  // A compiled frame's outputs are plain tensors: no gradient flows from them back to its inputs
  // (torch.compile differentiates through the frame; here value_and_grad and compile_train_step
  // put the backward inside it). Traced with grad mode on and inputs that require grad, and no
  // backward of its own, a frame would silently leave those inputs without gradients in an eager
  // backward() after it: said once per compile.
  if (!grad_inputs.empty() && !saw_backward_ && is_grad_enabled()) {
    std::string names;
    for (size_t i = 0; i < grad_inputs.size() && i < 4; ++i) names += fmt::format("{}'{}'", i ? ", " : "", grad_inputs[i]);
    if (grad_inputs.size() > 4) names += fmt::format(" and {} more", grad_inputs.size() - 4);
    observe::warn(fmt::format(
        "{}: input(s) {} require grad, but gradients do not flow back through a compiled function: its outputs "
        "do not require grad, so a backward() through them leaves these inputs without gradients. Compute "
        "gradients inside the compiled function (protean::value_and_grad, compile_train_step), or call it "
        "under NoGradGuard (or with inputs that do not require grad) for inference",
        frame_.opts.name.empty() ? std::string("compiled function") : frame_.opts.name, names));
  }
  // Undefined tensor arguments: the trace took the branch for "absent", so a defined tensor there must
  // miss this entry (it would otherwise run the absent branch: a silent wrong answer).
  for (size_t i = 0; i < args_.size(); ++i) {
    const detail::ArgValue& a = args_[i];
    auto undefined_guard = [&](InputRef ref, std::string source) {
      TensorGuard g;
      g.ref = ref;
      g.source = std::move(source);
      g.undefined = true;
      entry->tensors.push_back(std::move(g));
    };
    if (a.kind == detail::ArgValue::Kind::Tensor && !a.tensor.defined())
      undefined_guard({InputRef::Kind::Arg, static_cast<int32_t>(i), 0}, arg_name(i));
    if (a.kind == detail::ArgValue::Kind::TensorList)
      for (size_t j = 0; j < a.tensors.size(); ++j)
        if (!a.tensors[j].defined())
          undefined_guard({InputRef::Kind::ListElem, static_cast<int32_t>(i), static_cast<int32_t>(j)},
                          fmt::format("{}[{}]", arg_name(i), j));
  }
  for (size_t i = 0; i < args_.size(); ++i) {
    const detail::ArgValue& a = args_[i];
    using K = detail::ArgValue::Kind;
    ScalarGuard g;
    g.arg = static_cast<int32_t>(i);
    g.source = arg_name(i);
    switch (a.kind) {
      case K::Tensor:
        continue;
      case K::TensorList:
        g.kind = ScalarGuard::Kind::ListLen;
        g.i = static_cast<int64_t>(a.tensors.size());
        break;
      case K::Int:
        g.kind = ScalarGuard::Kind::Int;
        g.i = a.i;
        break;
      case K::SymInt: {
        g.kind = ScalarGuard::Kind::Int;
        g.i = a.i;
        bool dyn = false;
        for (const auto& [idx, src] : dyn_ints_) dyn |= idx == i;
        if (dyn) g.slot = new_slot(g.source);
        break;
      }
      case K::Float:
      case K::SymFloat: {
        bool dyn = false;
        for (const auto& df : dyn_floats_) dyn |= df.arg == static_cast<int32_t>(i);
        if (dyn && !baked_floats.count(static_cast<int32_t>(i))) continue;
        g.kind = ScalarGuard::Kind::Float;
        g.f = a.f;
        break;
      }
      case K::Bool:
        g.kind = ScalarGuard::Kind::Bool;
        g.i = a.b;
        break;
      case K::String:
        g.kind = ScalarGuard::Kind::String;
        g.s = a.s;
        break;
    }
    entry->scalars.push_back(std::move(g));
  }
  for (size_t k : attr_reads_) {
    ScalarGuard g;
    g.kind = ScalarGuard::Kind::Attr;
    g.source = "self." + frame_.module_slots.attributes[k].first;
    g.attr = frame_.module_slots.attributes[k].second;
    g.i = *g.attr;
    if (dyn_attrs_.count(k)) g.slot = new_slot(g.source);
    entry->scalars.push_back(std::move(g));
  }
  if (!gs.checks.empty() || !gs.replaced.empty() || !gs.symbols.empty()) {
    entry->program = sym::compile_guards(gs, bindings);
    entry->has_program = entry->program.num_guards() > 0;
  }
  // Symbols the artifact may need: every symbol with a bound source.
  for (const auto& info : env_.symbols()) {
    for (const auto& s : info.sources) {
      auto it = std::find_if(bindings.begin(), bindings.end(), [&](const sym::SourceSlot& b) { return b.source == s; });
      if (it != bindings.end()) {
        entry->symbols.push_back(info.symbol);
        entry->symbol_slots.push_back(it->slot);
        break;
      }
    }
  }
  // Graph inputs, in placeholder order.
  for (const auto& n : graph_->nodes()) {
    if (n.kind != ir::NodeKind::Placeholder) continue;
    for (const auto& p : placeholders_)
      if (p.source == n.source) {
        entry->inputs.push_back(p.ref);
        break;
      }
  }
  entry->graph = graph_;
  // Runtime assertions over unbacked symbols (size-like uses, narrow's bounds, protean::check).
  entry->runtime_asserts = env_.runtime_asserts();
  // Upper bounds the guards (and runtime assertions) keep: mark_dynamic max, `s0 < 100` guards.
  for (const auto& info : env_.symbols()) {
    const sym::ValueRange r = env_.range_of(info.symbol);
    if (!r.empty() && r.hi < sym::kIntOo) entry->upper_bounds[info.symbol->name] = r.hi;
  }

  // ---- guard tree text (PROTEAN_LOGS=guards) ----
  std::string t = "GUARDS:\n";
  for (const auto& g : entry->tensors) {
    if (g.undefined) {
      t += fmt::format("+- TENSOR_MATCH: {} is None\n", g.source);
      continue;
    }
    std::string sizes, strides;
    for (size_t d = 0; d < g.sizes.size(); ++d)
      sizes += (d ? ", " : "") + (g.slots[d] >= 0 ? std::string("None") : std::to_string(g.sizes[d]));
    if (g.contiguous) strides = "contiguous";
    else
      for (size_t d = 0; d < g.strides.size(); ++d) strides += (d ? ", " : "") + std::to_string(g.strides[d]);
    t += fmt::format("+- TENSOR_MATCH: check_tensor({}, {}, device={}, requires_grad={}, size=[{}], stride=[{}])\n", g.source,
                     short_name(g.dtype), g.device.str(), g.requires_grad, sizes, strides);
  }
  for (const auto& g : entry->scalars) {
    if (g.slot >= 0) {
      t += fmt::format("+- TYPE_MATCH: {} is int (dynamic)\n", g.source);
      continue;
    }
    switch (g.kind) {
      case ScalarGuard::Kind::Int:
      case ScalarGuard::Kind::Attr: t += fmt::format("+- EQUALS_MATCH: {} == {}\n", g.source, g.i); break;
      case ScalarGuard::Kind::Bool: t += fmt::format("+- EQUALS_MATCH: {} == {}\n", g.source, g.i != 0); break;
      case ScalarGuard::Kind::Float: t += fmt::format("+- EQUALS_MATCH: {} == {}\n", g.source, g.f); break;
      case ScalarGuard::Kind::String: t += fmt::format("+- EQUALS_MATCH: {} == \"{}\"\n", g.source, g.s); break;
      case ScalarGuard::Kind::ListLen: t += fmt::format("+- LENGTH_CHECK: len({}) == {}\n", g.source, g.i); break;
    }
  }
  if (entry->has_program)
    for (size_t i = 0; i < entry->program.num_guards(); ++i)
      t += fmt::format("+- SHAPE_ENV: {}  # {}\n", entry->program.guard_source_text(i), entry->program.guard_text(i));
  entry->guards_text = t;
  return entry;
}

}  // namespace

std::unique_ptr<CacheEntry> trace_frame(detail::CompiledFunctionImpl& frame, std::span<const detail::ArgValue> args,
                                        const std::string& compile_id) {
  Tracer tracer(frame, args, compile_id);
  return tracer.run();
}

}  // namespace protean::capture

namespace protean {
void graph_break(const std::string& reason) {
  if (ops::TraceHook* h = ops::current_trace_hook()) h->on_graph_break(reason);
}
}  // namespace protean
