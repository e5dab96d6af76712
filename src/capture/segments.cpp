#include "capture/segments.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <functional>

#include "capture/cond.h"
#include "capture/graph_break.h"
#include "capture/location.h"
#include "observe/log.h"
#include "ops/dispatch.h"
#include "protean/ops.h"

namespace protean::capture {

namespace {

constexpr int32_t kUndefined = INT32_MIN;  // an absent optional input
constexpr uint64_t kSeed = 0xcbf29ce484222325ULL;

uint64_t mix(uint64_t h, uint64_t v) { return (h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2))) * 0x100000001b3ULL; }

uint64_t hash_attr(const ops::AttrValue& v) {
  struct H {
    uint64_t operator()(const SymInt& s) const { return static_cast<uint64_t>(s.hint()); }
    uint64_t operator()(const SymIntVec& s) const {
      uint64_t h = s.size();
      for (const auto& e : s) h = mix(h, static_cast<uint64_t>(e.hint()));
      return h;
    }
    uint64_t operator()(double d) const {
      uint64_t b;
      std::memcpy(&b, &d, sizeof b);
      return b;
    }
    uint64_t operator()(bool b) const { return b ? 3 : 5; }
    uint64_t operator()(const std::string& s) const { return std::hash<std::string>{}(s); }
    uint64_t operator()(DType d) const { return 7 + static_cast<uint64_t>(d); }
  };
  return mix(v.index(), std::visit(H{}, v));
}

/// Structure of a recorded cond branch for the segment key: ops, wiring, attributes (by hint, as for
/// the segment's own ops) and nested branches; not the value types, so a size change does not make
/// a new segment frame.
uint64_t hash_graph(const ir::Graph& g) {
  uint64_t h = mix(kSeed, g.nodes().size());
  for (const ir::Node& n : g.nodes()) {
    h = mix(mix(h, static_cast<uint64_t>(n.kind)), static_cast<uint64_t>(n.op));
    for (ir::ValueId v : n.inputs) h = mix(h, static_cast<uint64_t>(v + 2));
    for (const auto& a : n.attrs.items()) h = mix(mix(h, std::hash<std::string>{}(a.name)), hash_attr(a.value));
    for (const auto& sub : n.subgraphs) h = mix(h, hash_graph(*sub));
  }
  return h;
}

/// One recorded op call.
struct SegNode {
  ops::OpKind op;
  int32_t in_begin, in_count;    // into Recording::inputs
  int32_t out_begin, out_count;  // value ids
  ops::Attrs attrs;
  std::vector<std::shared_ptr<const ir::Graph>> subgraphs;  // cond: the branches (replayed by call_node)
};

/// The ops of the pending segment. Inputs: >= 0 a value id, < 0 external -(k + 1), kUndefined.
struct Recording {
  std::vector<SegNode> nodes;
  std::vector<int32_t> inputs;
  std::vector<std::shared_ptr<TensorImpl>> values;  // lazy tensors, by value id
  std::vector<Tensor> externals;                    // real tensors the segment reads
  std::unordered_map<const TensorImpl*, int32_t> external_index;
  std::vector<int32_t> outputs;  // value ids still referenced by the body at the flush
  uint64_t hash = kSeed;
  // Lazy TensorImpls nobody else holds any more, kept (with their sizes/strides capacity) for the next
  // ops: recording then allocates nothing per op beyond what the dispatcher itself does.
  std::vector<std::shared_ptr<TensorImpl>> spare;

  void clear() {
    nodes.clear();
    inputs.clear();
    for (auto& v : values)
      if (v.use_count() == 1 && spare.size() < 4096) {
        v->trace = {};
        spare.push_back(std::move(v));
      }
    values.clear();
    externals.clear();
    external_index.clear();
    outputs.clear();
    hash = kSeed;
  }
};

/// Recordings are reused across calls on a thread, so their vectors keep their capacity.
thread_local std::vector<std::unique_ptr<Recording>> t_pool;

class PooledRecording {
 public:
  PooledRecording() {
    if (t_pool.empty()) {
      rec_ = std::make_unique<Recording>();
    } else {
      rec_ = std::move(t_pool.back());
      t_pool.pop_back();
    }
  }
  ~PooledRecording() {
    rec_->clear();
    if (t_pool.size() < 4) t_pool.push_back(std::move(rec_));
  }
  PooledRecording(const PooledRecording&) = delete;
  PooledRecording& operator=(const PooledRecording&) = delete;
  Recording& get() { return *rec_; }

 private:
  std::unique_ptr<Recording> rec_;
};

/// The recording a segment frame's body replays (set around each segment dispatch).
thread_local const Recording* t_replay = nullptr;

/// A segment frame's body: replays the recording's ops on `args[0]` (the externals) through the
/// dispatcher (so it is traced by capture, or runs eagerly) and returns the outputs.
std::vector<detail::OutValue> replay(std::span<const detail::ArgValue> args) {
  if (!t_replay) throw RuntimeError("segment body called outside segmented execution");
  const Recording& r = *t_replay;
  const std::vector<Tensor>& ext = args[0].tensors;
  std::vector<Tensor> vals(r.values.size());
  std::vector<Tensor> in;
  for (const SegNode& n : r.nodes) {
    in.clear();
    for (int32_t k = 0; k < n.in_count; ++k) {
      int32_t id = r.inputs[static_cast<size_t>(n.in_begin + k)];
      in.push_back(id == kUndefined ? Tensor() : id < 0 ? ext[static_cast<size_t>(-id - 1)] : vals[static_cast<size_t>(id)]);
    }
    // A cond is re-traced by the segment frame's capture (fresh symbolic sizes), or run eagerly.
    std::vector<Tensor> out = call_node(n.op, n.attrs, n.subgraphs, in);
    for (int32_t k = 0; k < n.out_count; ++k) vals[static_cast<size_t>(n.out_begin + k)] = std::move(out[static_cast<size_t>(k)]);
  }
  std::vector<detail::OutValue> outs(r.outputs.size());
  for (size_t k = 0; k < r.outputs.size(); ++k) outs[k].tensor = vals[static_cast<size_t>(r.outputs[k])];
  return outs;
}

class ReplayScope {
 public:
  explicit ReplayScope(const Recording* r) : prev_(t_replay) { t_replay = r; }
  ~ReplayScope() { t_replay = prev_; }
  ReplayScope(const ReplayScope&) = delete;
  ReplayScope& operator=(const ReplayScope&) = delete;

 private:
  const Recording* prev_;
};

/// The segment frame for `key`, created (and the break that ended the segment reported) on first use.
std::shared_ptr<detail::CompiledFunctionImpl> segment_frame(detail::CompiledFunctionImpl& f, int index, uint64_t key,
                                                            const std::function<BreakInfo()>* why) {
  std::lock_guard<std::mutex> lock(f.segments_mu);
  // The break that ends a segment is reported the first time the segment is seen (again after reset()).
  if (why && f.reported_segments.insert(key).second) detail::report_graph_break(f, (*why)(), "");
  auto it = f.segments.find(key);
  if (it != f.segments.end()) return it->second;
  // A segment whose recording changes with a host value (a value read after the break lands in an op
  // attribute: `clamp(x, {}, s)` with s = x.amax().item()) makes a new frame per value: past the
  // recompile limit, new variants run eagerly instead of compiling on every call.
  if (f.segment_variants[index] >= f.opts.recompile_limit) {
    if (!f.segment_limit_warned) {
      f.segment_limit_warned = true;
      observe::warn(fmt::format(
          "{}: segment {} after a graph break has hit config.recompile_limit ({}) variants: its ops differ from "
          "call to call (a value read on the host after the break ends up in an op attribute or shape). Further "
          "new variants run eagerly. Pass such a value as a tensor, or keep the read out of the compiled function.",
          f.opts.name, index, f.opts.recompile_limit));
    }
    return nullptr;
  }
  CompileOptions o = f.opts;
  int variant = ++f.segment_variants[index];
  o.name = variant == 1 ? fmt::format("{}.seg{}", f.opts.name, index) : fmt::format("{}.seg{}.v{}", f.opts.name, index, variant);
  o.arg_names = {"inputs"};
  o.fullgraph = false;
  o.verify_every = 0;
  auto seg = detail::make_compiled(std::move(o), replay);
  seg->is_segment = true;
  seg->verify_every = 0;
  f.segments.emplace(key, seg);
  f.segment_frame_ids.push_back(seg->frame_id);
  return seg;
}

/// The TraceHook of segmented execution.
class LazyRunner final : public ops::TraceHook {
 public:
  explicit LazyRunner(detail::CompiledFunctionImpl& f)
      : f_(f), rec_(pooled_.get()), learned_(f.learned.load(std::memory_order_acquire)) {}
  // When the body threw, lazy tensors of the pending segment may still be held somewhere: detach them
  // from this runner so a later runner at the same address cannot mistake them for its own (using one
  // is then the usual "FakeTensor reached eager execution" error).
  ~LazyRunner() override {
    for (const auto& v : rec_.values)
      if (v->trace.tracer == this) v->trace = {};
  }
  LazyRunner(const LazyRunner&) = delete;
  LazyRunner& operator=(const LazyRunner&) = delete;

  std::vector<Tensor> record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                             std::vector<TensorMeta> metas) override {
    if (op == ops::OpKind::full && in.empty() && metas.size() == 1 && metas[0].sizes.empty()) {
      // A wrapped C++ scalar (`y * s`): a real 0-dim tensor, so it reaches the segment as an input and
      // a value computed on the host (s = x.sum().item<float>()) does not become a new segment per value.
      ops::TraceHookScope eager(nullptr);
      return ops::run_eager(op, in, attrs);
    }
    if (f_.op_support || learned_) [[unlikely]]
      if (std::optional<std::string> why = rejection(op, in, attrs, metas)) return run_rejected(op, in, attrs, *why);
    return record_node(op, in, attrs, std::move(metas), {});
  }

  /// A cond in a segment is one node owning its branches (traced now, on the lazy operands). When a
  /// branch cannot be traced (it reads data on the host), the cond runs the eager way instead: the
  /// pending segment ends (the predicate is needed), the predicate is read and the chosen branch is
  /// recorded inline into the next segment.
  std::vector<Tensor> on_cond(const Tensor& pred, const ops::BranchFn& true_fn, const ops::BranchFn& false_fn,
                              std::span<const Tensor> operands) override {
    TracedCond c;
    try {
      c = trace_cond(this, pred, true_fn, false_fn, operands);
    } catch (const GraphBreakError& e) {
      if (pred.impl()->trace.tracer == this) {
        BreakInfo info = e.info;
        std::function<BreakInfo()> why = [info] { return info; };
        flush(&why);
      }
      std::vector<Tensor> args(operands.begin(), operands.end());
      return pred.item<bool>() ? true_fn(args) : false_fn(args);
    }
    return record_node(ops::OpKind::cond, c.inputs, {}, std::move(c.outputs), std::move(c.branches));
  }

  std::vector<Tensor> record_node(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                                  std::vector<TensorMeta> metas, std::vector<std::shared_ptr<const ir::Graph>> subgraphs) {
    SegNode n{op, static_cast<int32_t>(rec_.inputs.size()), static_cast<int32_t>(in.size()),
              static_cast<int32_t>(rec_.values.size()), static_cast<int32_t>(metas.size()), attrs, std::move(subgraphs)};
    uint64_t h = mix(rec_.hash, static_cast<uint64_t>(op));
    for (const auto& sub : n.subgraphs) h = mix(h, hash_graph(*sub));
    for (const Tensor& t : in) {
      int32_t id = ref_of(t, op);
      rec_.inputs.push_back(id);
      h = mix(h, static_cast<uint32_t>(id));
    }
    for (const auto& a : attrs.items()) {
      const uint64_t name = a.name.size() * 131 + (a.name.empty() ? 0u : static_cast<uint8_t>(a.name[0]));
      h = mix(mix(h, name), hash_attr(a.value));
    }
    rec_.hash = h;
    std::vector<Tensor> out;
    out.reserve(metas.size());
    for (TensorMeta& m : metas) {
      std::shared_ptr<TensorImpl> impl;
      if (!rec_.spare.empty()) {
        impl = std::move(rec_.spare.back());
        rec_.spare.pop_back();
        impl->sizes.assign(m.sizes.begin(), m.sizes.end());  // reuses the capacity
        impl->strides.assign(m.strides.begin(), m.strides.end());
        impl->requires_grad = false;
      } else {
        impl = std::make_shared<TensorImpl>();
        impl->sizes = std::move(m.sizes);
        impl->strides = std::move(m.strides);
      }
      impl->storage_offset = m.storage_offset;
      impl->dtype = m.dtype;
      impl->device = m.device;
      impl->trace = {this, static_cast<int64_t>(rec_.values.size())};
      out.emplace_back(impl);
      rec_.values.push_back(std::move(impl));
    }
    rec_.nodes.push_back(std::move(n));
    return out;
  }

  void on_host_read(const Tensor& t, const char* what) override {
    if (!t.defined()) return;
    if (t.impl()->trace.tracer == this) {
      std::function<BreakInfo()> why = [what] { return host_read_break(what); };
      flush(&why);
    } else if (!t.is_fake() && std::strcmp(what, "data_ptr()") == 0 && rec_.external_index.count(t.impl())) {
      // The host may write through the pointer: pending ops must read the data as it is now.
      // (item(), to_vector() and printing of a real tensor only read, so they do not end the segment.)
      std::function<BreakInfo()> why = [what] {
        BreakInfo b = host_read_break(what);
        b.reason = fmt::format("host access through Tensor::{} to a tensor that pending ops read", what);
        return b;
      };
      flush(&why);
    }
  }

  void on_graph_break(const std::string& reason) override {
    std::function<BreakInfo()> why = [&reason] { return make_break(reason, "graph_break"); };
    flush(&why);
  }

  std::vector<Tensor> on_data_dependent(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs) override {
    bool any_lazy = false;
    for (const auto& t : in) any_lazy |= t.defined() && t.impl()->trace.tracer == this;
    if (any_lazy) {
      std::function<BreakInfo()> why = [&] {
        return make_break(f_.opts.capture_scalar_outputs
                              ? "data-dependent output shape (in segmented execution the op runs between segments)"
                              : "data-dependent output shape (set CompileOptions::capture_scalar_outputs to capture it)",
                          ops::describe_call(op, in));
      };
      flush(&why);
    }
    ops::TraceHookScope eager(nullptr);
    return ops::run_eager(op, in, attrs);  // inputs are real now
  }

  bool inlines_compiled_calls() const override { return true; }

  /// Why the frame's backend does not take `op` on these inputs (its predicate, or an op the frame
  /// learned it rejects), or std::nullopt.
  std::optional<std::string> rejection(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                                       const std::vector<TensorMeta>& metas) const {
    if (learned_)
      for (const RejectedOp& r : *learned_)
        if (r.matches(op, in)) return r.why;
    if (!f_.op_support) return std::nullopt;
    return f_.op_support(backend::OpQuery{op, in, attrs, metas});
  }

  /// An op the backend rejects: the pending segment ends here (the break), the op runs eagerly on the
  /// now real inputs, and the next segment starts after it.
  std::vector<Tensor> run_rejected(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs,
                                   const std::string& why) {
    std::function<BreakInfo()> brk = [&] {
      return rejected_op_break(f_.opts.backend, ops::describe_call(op, in), why, current_user_location());
    };
    if (!rec_.nodes.empty()) {
      flush(&brk);
    } else {
      // Nothing pending (the body starts with the op, or two rejected ops follow each other): no
      // segment ends, but the site is still reported once.
      // Keyed by the op, the segment index and how many such ops this call has met, so each site is
      // reported once without a backtrace per call.
      uint64_t key = mix(mix(kSeed ^ 0x52454a454354ULL, static_cast<uint64_t>(op)), static_cast<uint64_t>(index_));
      key = mix(key, static_cast<uint64_t>(++idle_rejections_));
      std::lock_guard<std::mutex> lock(f_.segments_mu);
      if (f_.reported_segments.insert(key).second) detail::report_graph_break(f_, brk(), "");
    }
    ops::TraceHookScope eager(nullptr);
    return ops::run_eager(op, in, attrs);
  }

  /// Runs the pending segment (`why`: the break that ends it; nullptr at the function's return).
  void flush(const std::function<BreakInfo()>* why) {
    if (rec_.nodes.empty()) return;
    for (size_t id = 0; id < rec_.values.size(); ++id)
      if (rec_.values[id].use_count() > 1) rec_.outputs.push_back(static_cast<int32_t>(id));
    if (rec_.outputs.empty()) {  // nothing the body can still see: the ops have no effect
      rec_.clear();
      return;
    }
    uint64_t key = mix(rec_.hash, static_cast<uint64_t>(index_));
    key = mix(key, rec_.externals.size());
    for (int32_t id : rec_.outputs) key = mix(key, static_cast<uint64_t>(id));
    std::shared_ptr<detail::CompiledFunctionImpl> seg = segment_frame(f_, index_, key, why);

    detail::ArgValue arg;
    arg.kind = detail::ArgValue::Kind::TensorList;
    arg.tensors = std::move(rec_.externals);
    std::span<const detail::ArgValue> args(&arg, 1);
    std::vector<detail::OutValue> outs;
    {
      ReplayScope replay_scope(&rec_);
      ops::TraceHookScope no_hook(nullptr);
      try {
        if (!seg || detail::dispatch(*seg, args, outs) == detail::Action::RunEager) outs = replay(args);
      } catch (const GraphBreakError& e) {
        if (!e.info.learn) throw;
        // The backend rejected an op of this segment only when the segment frame was traced (a
        // predicate deciding on symbolic sizes) or its artifact built (a lowering that rejects late):
        // this frame learns the op, so later calls break at it; this call runs the segment eagerly.
        detail::learn_rejected(f_, e.info);
        detail::report_graph_break(f_, e.info, "");
        outs = replay(args);
      }
    }
    if (outs.size() != rec_.outputs.size())
      throw RuntimeError(fmt::format("segment {} of {} returned {} values, expected {}", index_, f_.opts.name, outs.size(),
                                     rec_.outputs.size()));
    for (size_t k = 0; k < outs.size(); ++k) {
      TensorImpl& impl = *rec_.values[static_cast<size_t>(rec_.outputs[k])];
      const Tensor& r = outs[k].tensor;
      if (!r.defined() || r.is_fake() || r.sizes().size() != impl.sizes.size())
        throw RuntimeError(fmt::format("segment {} of {}: output {} is not a real tensor of rank {}", index_, f_.opts.name, k,
                                       impl.sizes.size()));
      for (size_t d = 0; d < impl.sizes.size(); ++d)
        if (r.sizes()[d].hint() != impl.sizes[d].hint())
          throw RuntimeError(fmt::format("segment {} of {}: output {} has sizes {}, its meta function said {}", index_,
                                         f_.opts.name, k, to_string(r.sizes()), to_string(impl.sizes)));
      impl.storage = r.impl()->storage;
      impl.sizes = r.sizes();
      impl.strides = r.strides();
      impl.storage_offset = r.storage_offset();
      impl.trace = {};
    }
    rec_.clear();
    ++index_;
  }

 private:
  int32_t ref_of(const Tensor& t, ops::OpKind op) {
    if (!t.defined()) return kUndefined;
    TensorImpl* impl = t.impl();
    if (impl->trace.tracer == this) return static_cast<int32_t>(impl->trace.value);
    if (t.is_fake())
      throw ValueError(fmt::format("{} in segmented function {}: an input is a FakeTensor or a lazy tensor of another "
                                   "call (a tensor escaped the function, e.g. stored in a global)",
                                   ops::op_name(op), f_.opts.name));
    // The last external is the common case (`x + y`, then `t * y`): no hash lookup for it.
    if (!rec_.externals.empty() && rec_.externals.back().impl() == impl) return -static_cast<int32_t>(rec_.externals.size());
    auto it = rec_.external_index.find(impl);  // find first: emplace would allocate a node every time
    if (it != rec_.external_index.end()) return -it->second - 1;
    int32_t k = static_cast<int32_t>(rec_.externals.size());
    rec_.external_index.emplace(impl, k);
    rec_.externals.push_back(t);
    return -k - 1;
  }

  detail::CompiledFunctionImpl& f_;
  PooledRecording pooled_;
  Recording& rec_;
  const std::vector<RejectedOp>* learned_;  // the frame's learned rejections when this call started
  int index_ = 0;  // segments run so far in this call
  int idle_rejections_ = 0;  // rejected ops met with no segment pending, in this call
};

}  // namespace

void run_segmented(detail::CompiledFunctionImpl& f, std::span<const detail::ArgValue> args,
                   std::vector<detail::OutValue>& outs) {
  LazyRunner runner(f);
  LocationContextScope location_scope(f.opts.name);  // breaks without a user line name the function
  SymbolizerSessionScope symbolizer_scope;
  {
    ops::TraceHookScope scope(&runner);
    outs = f.body(args);
  }
  runner.flush(nullptr);
}

}  // namespace protean::capture
