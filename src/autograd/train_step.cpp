// compile_train_step's runtime (include/protean/optim.h): flat arenas, parameter binding during the
// trace, the joint backward + optimizer update, and the copy back into the arenas.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "autograd/engine.h"
#include "autograd/running_stats.h"
#include "backend/donation.h"
#include "core/device_copy.h"
#include "core/host_blocks.h"
#include "core/strided_copy.h"
#include "ir/provenance.h"
#include "observe/env.h"
#include "protean/autograd.h"
#include "protean/ops.h"
#include "protean/optim.h"
#include "protean/tensor_version.h"

namespace protean::detail {

struct TrainArenas {
  struct Slot {
    Tensor param;  // the user's handle (its impl is re-pointed into the arena)
    size_t arena = 0;
    int64_t offset = 0, numel = 0;
    SymIntVec sizes;
    std::string name;       // 'w1' (the module's name) or #i of the optimizer, for errors
    bool has_grad = true;   // whether the loss reaches it with a gradient (known once traced)
    bool frozen = false;    // requires_grad false while another parameter's is true: not trained
  };
  struct Arena {
    DType dtype = DType::F32;
    size_t group = 0;
    int64_t numel = 0;
    Tensor params;               // 1-D
    std::vector<Tensor> states;  // 1-D, one per optimizer state name
    std::map<std::string, Tensor> kept_states;  // states the current structure does not use
  };
  std::vector<Slot> slots;
  std::vector<Arena> arenas;
  std::vector<std::string> state_names;
  std::string structure;        // Optimizer::structure() the states are laid out for
  std::vector<Tensor> buffers;  // the module's buffers (handles sharing the module's TensorImpls)
  Device device = kCPU;         // where the parameters are, and so the arenas
  int64_t step = 0;             // successful steps
  bool grads_traced = false;    // Slot::has_grad is known
  // Which buffers a traced step rewrites (batch_norm_train's statistics); known once a trace finished.
  bool buffers_traced = false;
  std::vector<char> buffer_rewritten;
  // The module and, per slot, its parameter names: a name bound to another TensorImpl at a call means
  // the module's parameter was reassigned.
  std::weak_ptr<Module> module;
  std::vector<std::pair<std::string, size_t>> module_names;
  // The module's other parameters (not in the optimizer: frozen) and its buffers, by name: the step
  // reads the tensors it was made with, so one the module rebinds is an error at the next call.
  std::vector<std::pair<std::string, const TensorImpl*>> frozen_names, buffer_names;
  // Per param group, its parameters when the step was made: the arenas and the compiled update follow
  // this layout, so a changed param_groups is an error at the next call.
  std::vector<std::vector<const TensorImpl*>> group_layout;
  // Optimizer::state_epoch() when the optimizer's state buffers were last made views of the state
  // arenas (bind_optimizer_state): a different value means they may have changed outside the step.
  uint64_t state_epoch = 0;
};

/// The optimizer's per-parameter state without counting an access (Optimizer::state_epoch): the
/// step's own reads and writes of it are not changes from outside.
struct OptimizerStateAccess {
  static optim::ParamState& state(optim::Optimizer& opt, const Tensor& p) { return opt.state_[p.impl()]; }
};

namespace {
/// Slot `s`'s slice of a 1-D arena of its layout (the parameter's, or a state's), in the parameter's shape.
Tensor slot_view(const Tensor& arena, const TrainArenas::Slot& s) {
  return reshape(slice(arena, 0, s.offset, s.offset + s.numel, 1), s.sizes);
}
/// Whether `b` is exactly slot `s`'s slice of the 1-D arena `arena` (same storage, offset and sizes,
/// contiguous).
bool is_slot_view(const Tensor& b, const Tensor& arena, const TrainArenas::Slot& s) {
  if (b.impl()->storage != arena.impl()->storage || !b.is_contiguous() || b.int_sizes() != s.param.int_sizes())
    return false;
  int64_t off = -1, arena_off = 0;
  b.impl()->storage_offset.maybe_as_int(off);
  arena.impl()->storage_offset.maybe_as_int(arena_off);
  return off == arena_off + s.offset;
}
}  // namespace

namespace {

/// Whether two parameters share an element of memory (exact: the element offsets of both are
/// compared when their extents intersect).
/// Per slot, whether its parameter is frozen by requires_grad as torch users freeze with it: once any
/// parameter has it set, one without it is frozen (no gradient, not updated, as the eager step skips a
/// parameter without a grad). When none has it set (Module::register_parameter leaves it unset) every
/// parameter is trained.
std::vector<bool> frozen_now(const TrainArenas& a) {
  bool any_requires = false;
  for (const auto& s : a.slots) any_requires = any_requires || s.param.requires_grad();
  std::vector<bool> r;
  for (const auto& s : a.slots) r.push_back(any_requires && !s.param.requires_grad());
  return r;
}

bool overlaps(const Tensor& x, const Tensor& y) {
  if (x.impl()->storage != y.impl()->storage || x.int_numel() == 0 || y.int_numel() == 0) return false;
  // Byte extents first (O(rank)): slices of one buffer, what parameters mostly are (a step's arena),
  // end here; the element lists below only for extents that intersect.
  auto extent = [](const Tensor& t) {
    int64_t lo = 0, hi = 0;
    t.impl()->storage_offset.maybe_as_int(lo);
    hi = lo;
    const IntVec sizes = t.int_sizes(), strides = t.int_strides();
    for (size_t d = 0; d < sizes.size(); ++d)
      (strides[d] < 0 ? lo : hi) += (sizes[d] - 1) * strides[d];
    const int64_t isz = static_cast<int64_t>(t.itemsize());
    return std::pair{lo * isz, (hi + 1) * isz};
  };
  const auto [xlo, xhi] = extent(x);
  const auto [ylo, yhi] = extent(y);
  if (xhi <= ylo || yhi <= xlo) return false;
  auto offsets = [](const Tensor& t) {
    std::vector<int64_t> v;
    v.reserve(static_cast<size_t>(t.int_numel()));
    int64_t base = 0;
    t.impl()->storage_offset.maybe_as_int(base);
    const int64_t isz = static_cast<int64_t>(t.itemsize());
    core::for_each_offset2(t.int_sizes(), t.int_strides(), t.int_strides(),
                           [&](int64_t o, int64_t) { v.push_back((base + o) * isz); });
    std::sort(v.begin(), v.end());
    return v;
  };
  std::vector<int64_t> a = offsets(x), b = offsets(y);
  const int64_t ia = static_cast<int64_t>(x.itemsize()), ib = static_cast<int64_t>(y.itemsize());
  // Byte ranges [o, o + itemsize) of the two sorted lists, merged.
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] + ia <= b[j]) ++i;
    else if (b[j] + ib <= a[i]) ++j;
    else return true;
  }
  return false;
}

}  // namespace

struct ParamBinding::Saved {
  TensorImpl* impl;
  TensorImpl before;
};

namespace {
/// The live arenas of each optimizer: a second compile_train_step with the same optimizer (another
/// loss function) shares them, so the optimizer has one state and one step count, as it has eagerly.
std::mutex g_live_mu;
std::map<const optim::Optimizer*, std::weak_ptr<TrainArenas>> g_live;

/// How the optimizer's param_groups differ from the ones the arenas were laid out for ("" when they
/// hold the same parameters in the same groups; options may differ).
std::string param_groups_change(const TrainArenas& a, const optim::Optimizer& opt) {
  const size_t G = opt.num_groups();
  if (G != a.group_layout.size())
    return fmt::format("it has {} param groups, the step was made with {}", G, a.group_layout.size());
  for (size_t g = 0; g < G; ++g) {
    const std::vector<Tensor>& ps = opt.group_params(g);
    const auto& was = a.group_layout[g];
    if (ps.size() != was.size()) return fmt::format("param group {} has {} parameters, it had {}", g, ps.size(), was.size());
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].impl() != was[i]) return fmt::format("parameter {} of param group {} is another tensor", i, g);
  }
  return "";
}
}  // namespace

void bind_optimizer_state(TrainArenas& a, optim::Optimizer& opt);

std::shared_ptr<TrainArenas> make_train_arenas(optim::Optimizer& opt, const std::shared_ptr<Module>& module) {
  std::lock_guard<std::mutex> live_lock(g_live_mu);
  if (auto it = g_live.find(&opt); it != g_live.end()) {
    if (std::shared_ptr<TrainArenas> shared = it->second.lock(); shared && param_groups_change(*shared, opt).empty()) {
      if (shared->module.lock() != module)
        throw ValueError(
            "compile_train_step: this optimizer already drives a compile_train_step over another module (or none); "
            "steps that share an optimizer share its state and parameter arenas, and the module's buffers with "
            "them. Pass the same module, or give this step its own optimizer");
      return shared;
    }
    g_live.erase(it);
  }
  auto a = std::make_shared<TrainArenas>();
  a->state_names = opt.state_names();
  std::vector<Tensor> params = opt.parameters();
  std::set<const TensorImpl*> seen;
  std::map<std::pair<int, size_t>, size_t> arena_of;  // (dtype, group) → arena
  // The arenas live on the parameters' device: every parameter must be on one device.
  std::map<const TensorImpl*, std::string> names;
  if (module)
    for (const auto& [name, t] : module->named_parameters()) names.emplace(t.impl(), name);
  auto name_of = [&](size_t i) {
    auto it = names.find(params[i].impl());
    return it != names.end() ? fmt::format("'{}'", it->second) : fmt::format("#{} of the optimizer", i);
  };
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || params[i].device() == params[0].device()) continue;
    throw ValueError(fmt::format(
        "compile_train_step: the parameters are on two devices: parameter {} is on {} and parameter {} on {}; "
        "the arenas live on one device (move the model with Module::to or each tensor with .to(device))",
        name_of(0), params[0].device().str(), name_of(i), params[i].device().str()));
  }
  if (params.empty())
    throw ValueError("compile_train_step: the optimizer has no parameters, so the step has nothing to train (give "
                     "the optimizer the tensors the loss is computed from, e.g. module->parameters())");
  a->device = params[0].device();
  for (size_t g = 0; g < opt.num_groups(); ++g) {
    a->group_layout.emplace_back();
    for (const Tensor& p : opt.group_params(g)) a->group_layout.back().push_back(p.impl());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!seen.insert(p.impl()).second)
      throw ValueError(fmt::format("compile_train_step: parameter {} appears twice in the optimizer's param_groups",
                                   name_of(i)));
    if (p.is_fake()) throw ValueError("compile_train_step: a parameter is a capture-time FakeTensor");
    size_t group = opt.group_of(p);
    auto key = std::make_pair(static_cast<int>(p.dtype()), group);
    auto it = arena_of.find(key);
    if (it == arena_of.end()) {
      it = arena_of.emplace(key, a->arenas.size()).first;
      a->arenas.push_back({p.dtype(), group, 0, {}, {}, {}});
    }
    TrainArenas::Arena& ar = a->arenas[it->second];
    a->slots.push_back({p, it->second, ar.numel, p.int_numel(), p.sizes(), name_of(i), true});
    ar.numel += p.int_numel();
  }
  // Parameters that are views sharing elements would become separate slices of an arena: refused.
  for (size_t i = 0; i < params.size(); ++i)
    for (size_t j = i + 1; j < params.size(); ++j)
      if (overlaps(params[i], params[j]))
        throw ValueError(fmt::format(
            "compile_train_step: parameters {} and {} overlap in memory (views of one tensor that share "
            "elements); the step packs every parameter into its own slice of a flat arena, which would "
            "separate them. Train their base tensor as one parameter, or clone() one of them",
            name_of(i), name_of(j)));
  a->structure = opt.structure();
  if (module) {
    std::set<const TensorImpl*> in_module;
    for (const auto& [name, t] : module->named_parameters()) in_module.insert(t.impl());
    for (size_t i = 0; i < params.size(); ++i)
      if (!in_module.count(params[i].impl()))
        throw ValueError(fmt::format("compile_train_step: parameter {} is not a parameter of the "
                                     "module (register it with register_parameter, or pass no module)",
                                     name_of(i)));
    std::map<const TensorImpl*, size_t> slot_of;
    for (size_t i = 0; i < a->slots.size(); ++i) slot_of.emplace(a->slots[i].param.impl(), i);
    for (const auto& [name, t] : module->named_parameters()) {
      auto it = slot_of.find(t.impl());
      if (it != slot_of.end()) a->module_names.emplace_back(name, it->second);
      else a->frozen_names.emplace_back(name, t.impl());
    }
    for (const auto& [name, b] : module->named_buffers()) a->buffer_names.emplace_back(name, b.impl());
    a->module = module;
    std::set<const TensorImpl*> seen_buffers;
    for (const auto& [name, b] : module->named_buffers()) {
      if (!b.defined() || in_module.count(b.impl()) || !seen_buffers.insert(b.impl()).second) continue;
      if (b.is_fake()) throw ValueError(fmt::format("compile_train_step: buffer '{}' is a capture-time FakeTensor", name));
      if (!params.empty() && b.device() != a->device)
        throw ValueError(fmt::format("compile_train_step: buffer '{}' is on {} but the parameters are on {} (move the "
                                     "model with Module::to)",
                                     name, b.device().str(), a->device.str()));
      a->buffers.push_back(b);
    }
    a->buffer_rewritten.assign(a->buffers.size(), 0);
  }
  // Move the values into the arenas and re-point every parameter's impl (all handles follow).
  // On a CUDA device the copies are device-to-device, queued on the device's stream.
  for (auto& ar : a->arenas) {
    ar.params = empty({ar.numel}, ar.dtype, a->device);
    for (size_t i = 0; i < a->state_names.size(); ++i) ar.states.push_back(zeros({ar.numel}, ar.dtype, a->device));
  }
  NoGradGuard no_grad;
  // The parameters' and states' own storages die here (their values now live in the arenas): of
  // sizes no step asks for again, so they go back to the system rather than stay resident in the
  // cache of freed blocks (core/host_blocks.h).
  core::ReturnFreedBlocksScope return_freed;
  for (auto& s : a->slots) {
    TrainArenas::Arena& ar = a->arenas[s.arena];
    core::copy_into(slice(ar.params, 0, s.offset, s.offset + s.numel, 1), reshape(s.param, {SymInt(-1)}),
                    "compile_train_step: a parameter's values");
    TensorImpl* impl = s.param.impl();
    impl->storage = ar.params.impl()->storage;
    impl->storage_offset = s.offset;
    impl->strides = contiguous_strides(impl->sizes);
  }
  const std::vector<bool> frozen = frozen_now(*a);
  for (size_t i = 0; i < a->slots.size(); ++i) a->slots[i].frozen = frozen[i];
  // State from eager steps before this one (or loaded into the optimizer) continues in the arenas.
  bind_optimizer_state(*a, opt);
  g_live[&opt] = a;
  return a;
}

ParamBinding::ParamBinding(TrainArenas& a, const std::vector<Tensor>& param_arenas) {
  for (auto& s : a.slots) {
    Tensor view = slot_view(param_arenas.at(s.arena), s);
    TensorImpl* impl = s.param.impl();
    saved_.push_back(std::make_unique<Saved>(Saved{impl, *impl}));
    std::shared_ptr<autograd::AutogradMeta> keep_out = nullptr;
    *impl = *view.impl();  // the arena view (a FakeTensor of the trace while compiling)
    if (s.frozen) {  // read as a value: the loss reaches it with no gradient, the update skips it
      impl->autograd = nullptr;
      impl->requires_grad = false;
      continue;
    }
    impl->autograd = std::make_shared<autograd::AutogradMeta>();
    impl->requires_grad = true;
  }
}
ParamBinding::~ParamBinding() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) *(*it)->impl = (*it)->before;
}

struct BufferBinding::Saved {
  TensorImpl* impl;
  TensorImpl before;
  TrainArenas* arenas;
  size_t index;
};

BufferBinding::BufferBinding(TrainArenas& a, const std::vector<Tensor>& buffer_inputs) {
  if (buffer_inputs.size() != a.buffers.size())
    throw RuntimeError(fmt::format("compile_train_step: {} buffer inputs for {} buffers", buffer_inputs.size(),
                                   a.buffers.size()));
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    TensorImpl* impl = a.buffers[i].impl();
    saved_.push_back(std::make_unique<Saved>(Saved{impl, *impl, &a, i}));
    *impl = *buffer_inputs[i].impl();
    autograd::detail::mark_traced_buffer(impl);
  }
}
BufferBinding::~BufferBinding() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (autograd::detail::unmark_traced_buffer((*it)->impl)) (*it)->arenas->buffer_rewritten.at((*it)->index) = 1;
    *(*it)->impl = (*it)->before;
  }
}
std::vector<Tensor> BufferBinding::values() const {
  std::vector<Tensor> r;
  NoGradGuard no_grad;
  for (const auto& s : saved_) {
    r.push_back(Tensor(std::make_shared<TensorImpl>(*s->impl)));
    s->arenas->buffers_traced = true;  // the trace got to its results: the rewritten ones are marked
  }
  return r;
}

Tensor train_loss(const TrainArenas& a, const optim::Optimizer&, const Tensor& loss) {
  if (!loss.defined()) throw ValueError("compile_train_step: the loss function returned an undefined Tensor");
  if (!is_floating(loss.dtype()))
    throw TypeError(fmt::format("compile_train_step: the loss is {}; it must be a floating one-element tensor (the "
                                "mean or sum of the per-example losses)",
                                short_name(loss.dtype())));
  int64_t n = 0;
  if (!loss.numel().maybe_as_int(n) || n != 1)
    throw ValueError(fmt::format("compile_train_step: the loss has shape {}; it must have one element (reduce it "
                                 "with mean or sum)",
                                 to_string(loss.sizes())));
  if (!loss.requires_grad())
    throw ValueError(fmt::format(
        "compile_train_step: the loss does not require grad, so none of the optimizer's {} parameters gets a "
        "gradient (parameter {} among them): it was computed under NoGradGuard, through detach(), or from "
        "none of the parameters. Compute it from the parameters with grad mode on",
        a.slots.size(), a.slots.empty() ? std::string("-") : a.slots[0].name));
  return loss;
}

std::vector<Tensor> train_grads(TrainArenas& a, const Tensor& loss) {
  std::vector<Tensor> leaves;
  std::vector<size_t> leaf_slot;  // frozen parameters are no leaves: no gradient
  for (size_t i = 0; i < a.slots.size(); ++i)
    if (!a.slots[i].frozen) {
      leaves.push_back(a.slots[i].param);
      leaf_slot.push_back(i);
    }
  std::vector<Tensor> grads(a.slots.size());
  if (!leaves.empty()) {
    std::vector<Tensor> g = autograd::grad({loss}, leaves, {}, /*allow_unused=*/true, /*zeros_for_unused=*/false);
    for (size_t k = 0; k < g.size(); ++k) grads[leaf_slot[k]] = std::move(g[k]);
  }
  // A parameter the loss does not reach with a gradient is skipped by the update (train_apply), as
  // torch.optim skips a parameter whose grad is None. Which ones those are is part of the step's
  // structure: every compiled graph of the step must agree, since the arenas share one step count.
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const bool has = grads[i].defined();
    if (a.grads_traced && a.slots[i].has_grad != has)
      throw NotImplementedError(fmt::format(
          "compile_train_step: parameter {} gets a gradient in one compiled graph of the step and none in "
          "another (the loss function reaches different parameters for different inputs); a step skips a "
          "parameter without a gradient in every call or in none. Make the loss reach the same parameters "
          "in every call",
          a.slots[i].name));
    a.slots[i].has_grad = has;
  }
  a.grads_traced = true;
  NoGradGuard no_grad;
  for (size_t i = 0; i < a.slots.size(); ++i)
    if (!grads[i].defined()) grads[i] = full(a.slots[i].sizes, 0.0, a.arenas[a.slots[i].arena].dtype);
  ir::OptimizerUpdateScope optimizer_part;  // the flat per-arena gradients feed only the update
  std::vector<Tensor> out;
  for (size_t k = 0; k < a.arenas.size(); ++k) {
    std::vector<Tensor> flat;
    for (size_t i = 0; i < a.slots.size(); ++i)
      if (a.slots[i].arena == k) flat.push_back(reshape(grads[i], {SymInt(-1)}));
    out.push_back(flat.size() == 1 ? flat[0] : cat(flat, 0));
  }
  return out;
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> train_apply(TrainArenas& a, const optim::Optimizer& opt,
                                                                const std::vector<Tensor>& grads,
                                                                const std::vector<Tensor>& params,
                                                                const std::vector<Tensor>& states, const Tensor& hyper) {
  NoGradGuard no_grad;
  ir::OptimizerUpdateScope optimizer_part;
  std::vector<Tensor> new_params, new_states;
  const size_t ns = a.state_names.size();
  for (size_t k = 0; k < a.arenas.size(); ++k) {
    TrainArenas::Arena& ar = a.arenas[k];
    std::vector<Tensor> st(states.begin() + static_cast<int64_t>(k * ns), states.begin() + static_cast<int64_t>((k + 1) * ns));
    // Runs of slots (in arena order) that get a gradient or not: the ones without keep their values.
    std::vector<std::pair<int64_t, bool>> runs;  // (start, has_grad)
    for (const auto& sl : a.slots)
      if (sl.arena == k && (runs.empty() || runs.back().second != sl.has_grad)) runs.emplace_back(sl.offset, sl.has_grad);
    if (runs.size() == 1 && !runs[0].second) {  // no parameter of this arena gets a gradient
      new_params.push_back(params.at(k));
      new_states.insert(new_states.end(), st.begin(), st.end());
      continue;
    }
    auto [np, nst] = opt.update(params.at(k), grads.at(k), st, select(hyper, 0, static_cast<int64_t>(ar.group)), ar.group);
    auto keep_skipped = [&](const Tensor& updated, const Tensor& old) {
      if (runs.size() == 1) return updated;
      std::vector<Tensor> parts;
      for (size_t r = 0; r < runs.size(); ++r) {
        const int64_t end = r + 1 < runs.size() ? runs[r + 1].first : ar.numel;
        parts.push_back(slice(runs[r].second ? updated : old, 0, runs[r].first, end, 1));
      }
      return cat(parts, 0);
    };
    new_params.push_back(keep_skipped(np, params.at(k)));
    for (size_t i = 0; i < nst.size(); ++i) new_states.push_back(keep_skipped(nst[i], st.at(i)));
  }
  return {new_params, new_states};
}

std::pair<std::vector<Tensor>, std::vector<Tensor>> train_update(TrainArenas& a, const optim::Optimizer& opt,
                                                                 const Tensor& loss, const std::vector<Tensor>& params,
                                                                 const std::vector<Tensor>& states, const Tensor& hyper) {
  return train_apply(a, opt, train_grads(a, loss), params, states, hyper);
}

std::vector<Tensor> param_arenas(const TrainArenas& a) {
  std::vector<Tensor> r;
  for (const auto& ar : a.arenas) r.push_back(ar.params);
  return r;
}
std::vector<Tensor> buffers(const TrainArenas& a) { return a.buffers; }
std::vector<Tensor> state_arenas(const TrainArenas& a) {
  std::vector<Tensor> r;
  for (const auto& ar : a.arenas) r.insert(r.end(), ar.states.begin(), ar.states.end());
  return r;
}
Tensor next_hyper(TrainArenas& a, optim::Optimizer& opt) {
  const size_t G = opt.num_groups();
  std::vector<double> rows;
  size_t width = 0;
  for (size_t g = 0; g < G; ++g) {
    std::vector<double> h = opt.hyperparameters(g);
    h.push_back(static_cast<double>(a.step + 1));
    width = h.size();
    rows.insert(rows.end(), h.begin(), h.end());
  }
  // On the arenas' device (one small host-to-device copy queued on the stream), so every input of the
  // step's graph is on one device.
  return tensor<double>(rows, {static_cast<int64_t>(G), static_cast<int64_t>(width)}).to(a.device);
}

void commit_step(TrainArenas& a, optim::Optimizer& opt) {
  a.step += 1;
  for (const auto& s : a.slots)
    if (s.has_grad) OptimizerStateAccess::state(opt, s.param).step = a.step;
}

/// Makes each parameter's state buffers of the current structure views of its slices of the state
/// arenas. A buffer that is something else (made by an eager step, assigned from a checkpoint) is
/// first copied into the arena; the step count continues from the largest state(p).step (lower
/// than the step's own after a checkpoint of an earlier step was loaded). Checks
/// every buffer before changing anything: ValueError naming the parameter and the state for one of
/// another shape or dtype.
void bind_optimizer_state(TrainArenas& a, optim::Optimizer& opt) {
  NoGradGuard no_grad;
  struct Bind {
    optim::ParamState* state;
    const std::string* name;
    Tensor view;
    Tensor from;  // the buffer to copy into the view (undefined: none, the state starts at zeros)
  };
  std::vector<Bind> binds;
  int64_t step = 0;  // the parameters' step counts rule (a loaded checkpoint may set them back)
  // Adam's bias correction reads the step count, and the compiled update has one for every parameter:
  // trained parameters whose counts differ (one that starts training after eager steps of the others,
  // a checkpoint that sets some counts only) would be corrected with another parameter's count.
  const bool counts_matter = dynamic_cast<const optim::Adam*>(&opt) != nullptr;
  const TrainArenas::Slot* counted = nullptr;
  int64_t counted_step = 0;
  // Checked first, written after: nothing changes (no entry is added to the state) when one is wrong.
  for (const auto& s : a.slots) {
    optim::ParamState& st = OptimizerStateAccess::state(opt, s.param);
    if (counts_matter && (!a.grads_traced || s.has_grad)) {
      if (!counted) {
        counted = &s;
        counted_step = st.step;
      } else if (st.step != counted_step) {
        throw ValueError(fmt::format(
            "compile_train_step: parameters {} and {} have different Adam step counts ({} and {}); the compiled "
            "update takes one step count for all its parameters, and bias correction with another parameter's "
            "count would change the update. Train parameters that start later (or were loaded with another "
            "count) with an optimizer of their own",
            counted->name, s.name, counted_step, st.step));
      }
    }
    step = std::max(step, st.step);
    const TrainArenas::Arena& ar = a.arenas[s.arena];
    for (size_t i = 0; i < a.state_names.size(); ++i) {
      auto it = st.buffers.find(a.state_names[i]);
      const Tensor b = it != st.buffers.end() ? it->second : Tensor();
      const Tensor& arena = ar.states.at(i);
      if (b.defined() && is_slot_view(b, arena, s)) continue;
      if (b.defined() && (b.int_sizes() != s.param.int_sizes() || b.dtype() != ar.dtype))
        throw ValueError(fmt::format(
            "compile_train_step: the optimizer state '{}' of parameter {} is {}{}, but the parameter is {}{}; "
            "a state buffer has its parameter's shape and dtype",
            a.state_names[i], s.name, short_name(b.dtype()), to_string(b.sizes()), short_name(ar.dtype),
            to_string(s.param.sizes())));
      binds.push_back({&st, &a.state_names[i], slot_view(arena, s), b});
    }
  }
  for (Bind& b : binds) {
    if (b.from.defined()) {
      const Tensor src = b.from.device() == a.device ? b.from : b.from.to(a.device);
      core::copy_into(b.view, src, "compile_train_step: an optimizer state buffer");
      increment_version(b.view);
    }
    b.state->buffers[*b.name] = b.view;
  }
  a.step = step;
  a.state_epoch = opt.state_epoch();
}

namespace {
/// Whether buffer i is donated to a step's call (and so saved before it): the ones a traced step
/// rewrites, all of them until a trace has said which. No result is written into a buffer only read.
bool donates_buffer(const TrainArenas& a, size_t i) { return !a.buffers_traced || a.buffer_rewritten.at(i); }
}  // namespace

bool donation_enabled() {
  static const bool on = observe::env_on("PROTEAN_DONATE");
  return on;
}

ArenaDonation::ArenaDonation(const TrainArenas& a) {
  if (!donation_enabled()) return;
  std::vector<const void*> ptrs;
  for (const auto& ar : a.arenas) {
    ptrs.push_back(ar.params.data_ptr());
    for (const Tensor& s : ar.states) ptrs.push_back(s.data_ptr());
  }
  for (size_t i = 0; i < a.buffers.size(); ++i)
    if (donates_buffer(a, i)) ptrs.push_back(a.buffers[i].data_ptr());
  saved_ = std::move(backend::donation_slot());
  backend::donation_slot() = std::move(ptrs);
  active_ = true;
}
ArenaDonation::~ArenaDonation() {
  if (active_) backend::donation_slot() = std::move(saved_);
}

void write_back(TrainArenas& a, const std::vector<Tensor>& params, const std::vector<Tensor>& states) {
  const size_t ns = a.state_names.size();
  // A backend that took the donation wrote each result into an arena's memory: normally its own
  // (the copy below is then a no-op), but it may have put a result into another arena of the same size.
  std::vector<const void*> arena_ptrs;
  for (const auto& ar : a.arenas) {
    arena_ptrs.push_back(ar.params.data_ptr());
    for (const Tensor& s : ar.states) arena_ptrs.push_back(s.data_ptr());
  }
  std::vector<Tensor> results;
  for (size_t k = 0; k < a.arenas.size(); ++k) {
    results.push_back(params.at(k));
    for (size_t i = 0; i < ns; ++i) results.push_back(states.at(k * ns + i));
  }
  bool permuted = false;
  for (size_t j = 0; j < results.size(); ++j)
    for (size_t i = 0; i < arena_ptrs.size(); ++i)
      permuted = permuted || (i != j && results[j].data_ptr() == arena_ptrs[i]);
  // A result in another arena's memory would be overwritten by the copy into that arena before it is
  // read: copy every result out first. (The arenas keep their storage: re-pointing the parameters at
  // the results' storage instead left every other view of a parameter on the old memory.)
  std::vector<Tensor> snap_params, snap_states;
  if (permuted) {
    for (const Tensor& p : params) snap_params.push_back(core::copy_of(p));
    for (const Tensor& st : states) snap_states.push_back(core::copy_of(st));
  }
  const std::vector<Tensor>& src_params = permuted ? snap_params : params;
  const std::vector<Tensor>& src_states = permuted ? snap_states : states;
  auto copy = [](const Tensor& dst, const Tensor& src) {
    // The arenas live on the parameters' device: device-to-device copies on a CUDA device (queued on
    // its stream, no host wait); a result on another device (arenas on the host, backend cuda) is
    // copied across, never read through a device address.
    if (src.dtype() != dst.dtype() || src.int_numel() != dst.int_numel())
      throw RuntimeError("compile_train_step: a step returned an arena of the wrong type or size");
    core::copy_into(dst, src, "compile_train_step: an arena");
    increment_version(dst);  // also when the step wrote the arena in place (donation)
  };
  for (size_t k = 0; k < a.arenas.size(); ++k) {
    copy(a.arenas[k].params, src_params.at(k));
    for (size_t i = 0; i < ns; ++i) copy(a.arenas[k].states[i], src_states.at(k * ns + i));
  }
}

void write_back(TrainArenas& a, const std::vector<Tensor>& params, const std::vector<Tensor>& states,
                const std::vector<Tensor>& bufs) {
  if (bufs.size() != a.buffers.size())
    throw RuntimeError(fmt::format("compile_train_step: a step returned {} buffers for {}", bufs.size(), a.buffers.size()));
  std::set<const void*> buffer_ptrs;
  for (const Tensor& b : a.buffers) buffer_ptrs.insert(b.data_ptr());
  // Results living in memory that a later copy overwrites are copied out first (all are [C]-sized,
  // since the backend donates only between tensors of the same size).
  std::vector<Tensor> nb;
  for (size_t i = 0; i < bufs.size(); ++i)
    nb.push_back(!bufs[i].defined() || bufs[i].data_ptr() == a.buffers[i].data_ptr() ? bufs[i] : core::copy_of(bufs[i]));
  auto own = [&](const Tensor& t) { return buffer_ptrs.count(t.data_ptr()) ? core::copy_of(t) : t; };
  std::vector<Tensor> np, ns;
  for (const Tensor& t : params) np.push_back(own(t));
  for (const Tensor& t : states) ns.push_back(own(t));
  write_back(a, np, ns);
  for (size_t i = 0; i < nb.size(); ++i) {
    const Tensor& dst = a.buffers[i];
    const Tensor& c = nb[i];
    if (c.dtype() != dst.dtype() || c.int_numel() != dst.int_numel())
      throw RuntimeError("compile_train_step: a step returned a buffer of the wrong type or size");
    if (c.data_ptr() == dst.data_ptr()) continue;  // unchanged, or written in place (donation bumped its version)
    core::copy_into(dst, c, "compile_train_step: a buffer");
    increment_version(dst);
  }
}

namespace {

/// The module's parameters must still be the TensorImpls the step was made with; parameters another
/// step moved into its arenas are packed back into this step's (values copied, TensorImpls re-pointed).
void check_and_repack_parameters(TrainArenas& a) {
  const std::vector<bool> frozen = frozen_now(a);
  for (size_t i = 0; i < a.slots.size(); ++i) {
    const auto& s = a.slots[i];
    if (s.frozen != frozen[i])
      throw ValueError(fmt::format(
          "compile_train_step: parameter {} was {} after the step was made (requires_grad {}); the step "
          "trains the parameters whose requires_grad was set when it was made (all of them when none was). "
          "Make the step again after freezing or unfreezing parameters",
          s.name, s.frozen ? "unfrozen" : "frozen", s.param.requires_grad() ? "true" : "false"));
  }
  if (auto m = a.module.lock()) {
    using ByName = std::map<std::string, const TensorImpl*>;
    auto by_name = [](const std::vector<std::pair<std::string, Tensor>>& list) {
      ByName r;
      for (const auto& [name, t] : list) r.emplace(name, t.impl());
      return r;
    };
    auto rebound = [](const ByName& now, const std::string& name, const TensorImpl* then) {
      auto it = now.find(name);
      return it == now.end() || it->second != then;
    };
    // a tensor the step reads but does not train (a frozen parameter, a buffer)
    auto read_only_rebound = [](const char* what, const std::string& name) {
      return ValueError(fmt::format(
          "compile_train_step: the module's {} '{}' was reassigned after the step was made; the step reads the "
          "tensor it was made with, which the module no longer holds. Write the new values into it instead (under "
          "NoGradGuard), or make the step again",
          what, name));
    };
    if (!a.module_names.empty() || !a.frozen_names.empty()) {
      const ByName params = by_name(m->named_parameters());
      for (const auto& [name, impl] : a.frozen_names)
        if (rebound(params, name, impl)) throw read_only_rebound("parameter (not trained by the optimizer)", name);
      for (const auto& [name, slot] : a.module_names)
        if (rebound(params, name, a.slots[slot].param.impl()))
          throw ValueError(fmt::format(
              "compile_train_step: the module's parameter '{}' was reassigned after the step was made; the step and "
              "its optimizer train the tensor they were given, which the module no longer reads. Write the new "
              "values into the parameter instead (under NoGradGuard), or make a new optimizer and "
              "compile_train_step for the new tensors",
              name));
    }
    if (!a.buffer_names.empty()) {
      const ByName buffers = by_name(m->named_buffers());
      for (const auto& [name, impl] : a.buffer_names)
        if (rebound(buffers, name, impl)) throw read_only_rebound("buffer", name);
    }
  }
  NoGradGuard no_grad;
  for (auto& s : a.slots) {
    const Tensor& arena = a.arenas[s.arena].params;
    if (is_slot_view(s.param, arena, s)) continue;
    TensorImpl* impl = s.param.impl();
    int64_t arena_off = 0;
    arena.impl()->storage_offset.maybe_as_int(arena_off);
    core::copy_into(slice(arena, 0, s.offset, s.offset + s.numel, 1), reshape(s.param, {SymInt(-1)}),
                    "compile_train_step: a parameter's values");
    impl->storage = arena.impl()->storage;
    impl->storage_offset = arena_off + s.offset;
    impl->strides = contiguous_strides(impl->sizes);
    increment_version(s.param);
  }
}

/// The optimizer's param_groups must hold the parameters they held when the step was made (a group
/// added or removed, a parameter moved, added or removed would otherwise be ignored: the arenas, their
/// groups and the compiled update were laid out for the old groups). Options may change freely.
void check_param_groups(const TrainArenas& a, const optim::Optimizer& opt) {
  const std::string why = param_groups_change(a, opt);
  if (why.empty()) return;
  throw ValueError(fmt::format(
      "compile_train_step: the optimizer's param_groups changed after the step was made ({}); the step's "
      "arenas and compiled update are laid out for the groups it was made with. Change options (lr, momentum, "
      "...) in place, or make a new optimizer and compile_train_step for the new groups",
      why));
}

/// Lays the state arenas out for the optimizer's current structure (Optimizer::structure()). Returns
/// whether it changed.
bool sync_structure(TrainArenas& a, const optim::Optimizer& opt) {
  std::string structure = opt.structure();
  if (structure == a.structure) return false;
  std::vector<std::string> names = opt.state_names();
  for (auto& ar : a.arenas) {
    std::map<std::string, Tensor> all = std::move(ar.kept_states);
    for (size_t i = 0; i < a.state_names.size(); ++i) all[a.state_names[i]] = ar.states.at(i);
    ar.states.clear();
    for (const std::string& n : names) {
      auto it = all.find(n);
      if (it != all.end()) {
        ar.states.push_back(it->second);
        all.erase(it);
      } else {
        ar.states.push_back(zeros({ar.numel}, ar.dtype, a.device));  // a new state starts at zeros, as eagerly
      }
    }
    ar.kept_states = std::move(all);
  }
  a.state_names = std::move(names);
  a.structure = std::move(structure);
  return true;
}

}  // namespace

void prepare_train_step(TrainArenas& a, optim::Optimizer& opt) {
  check_param_groups(a, opt);
  check_and_repack_parameters(a);
  const bool relaid = sync_structure(a, opt);
  if (relaid || opt.state_epoch() != a.state_epoch) bind_optimizer_state(a, opt);
}

const std::string& train_structure(const TrainArenas& a) { return a.structure; }

void check_train_inputs(const TrainArenas& a, const std::vector<Tensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    for (const auto& s : a.slots)
      if (overlaps(inputs[i], s.param))
        throw ValueError(fmt::format(
            "compile_train_step: input {} of the call is parameter {} (or a view of it); the step reads its "
            "inputs as data, so the loss would get no gradient through it. Read the parameter inside loss_fn, "
            "or pass a copy (clone()) if it is meant as data",
            i, s.name));
  }
}

Tensor run_train_step(TrainArenas& a, optim::Optimizer& opt, const std::function<TrainOut(const TrainCallInputs&)>& call) {
  prepare_train_step(a, opt);
  TrainCallInputs in{param_arenas(a), state_arenas(a), buffers(a), next_hyper(a, opt), a.structure};
  // The buffers a step rewrites are donated, so a step that throws after the op that rewrites one
  // (an index out of range later in the forward) would leave it half updated: keep a copy to put back.
  // They are small (running statistics, [C]). The arenas need none: only the update writes them, and
  // it reads the whole backward.
  std::vector<std::pair<size_t, Tensor>> saved_buffers;
  if (donation_enabled())
    for (size_t i = 0; i < a.buffers.size(); ++i)
      if (donates_buffer(a, i)) saved_buffers.emplace_back(i, core::copy_of(a.buffers[i]));
  TrainOut out;
  try {
    ArenaDonation donate(a);
    out = call(in);
  } catch (...) {
    for (const auto& [i, b] : saved_buffers) {
      core::copy_into(a.buffers[i], b, "compile_train_step: a buffer");
      increment_version(a.buffers[i]);
    }
    throw;
  }
  write_back(a, std::get<1>(out), std::get<2>(out), std::get<3>(out));
  commit_step(a, opt);
  return std::get<0>(out);
}

}  // namespace protean::detail
