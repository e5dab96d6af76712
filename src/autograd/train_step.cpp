// compile_train_step's runtime (include/protean/optim.h): flat arenas, parameter binding during the
// trace, the joint backward + optimizer update, and the copy back into the arenas.
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "autograd/engine.h"
#include "autograd/running_stats.h"
#include "backend/donation.h"
#include "core/device_copy.h"
#include "ir/provenance.h"
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
  };
  struct Arena {
    DType dtype = DType::F32;
    size_t group = 0;
    int64_t numel = 0;
    Tensor params;               // 1-D
    std::vector<Tensor> states;  // 1-D, one per optimizer state name
  };
  std::vector<Slot> slots;
  std::vector<Arena> arenas;
  std::vector<std::string> state_names;
  std::vector<Tensor> buffers;  // the module's buffers (handles sharing the module's TensorImpls)
  Device device = kCPU;         // where the parameters are, and so the arenas
  int64_t step = 0;
};

struct ParamBinding::Saved {
  TensorImpl* impl;
  TensorImpl before;
};

std::shared_ptr<TrainArenas> make_train_arenas(optim::Optimizer& opt, const std::shared_ptr<Module>& module) {
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
  if (!params.empty()) a->device = params[0].device();
  for (const Tensor& p : params) {
    if (!seen.insert(p.impl()).second)
      throw ValueError("compile_train_step: a parameter appears twice in the optimizer's param_groups");
    if (p.is_fake()) throw ValueError("compile_train_step: a parameter is a capture-time FakeTensor");
    size_t group = opt.group_of(p);
    auto key = std::make_pair(static_cast<int>(p.dtype()), group);
    auto it = arena_of.find(key);
    if (it == arena_of.end()) {
      it = arena_of.emplace(key, a->arenas.size()).first;
      a->arenas.push_back({p.dtype(), group, 0, {}, {}});
    }
    TrainArenas::Arena& ar = a->arenas[it->second];
    a->slots.push_back({p, it->second, ar.numel, p.int_numel(), p.sizes()});
    ar.numel += p.int_numel();
  }
  if (module) {
    std::set<const TensorImpl*> in_module;
    for (const auto& [name, t] : module->named_parameters()) in_module.insert(t.impl());
    for (const Tensor& p : params)
      if (!in_module.count(p.impl()))
        throw ValueError("compile_train_step: an optimizer parameter is not a parameter of the module");
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
  }
  // Move the values into the arenas and re-point every parameter's impl (all handles follow).
  // On a CUDA device the copies are device-to-device, queued on the device's stream.
  for (auto& ar : a->arenas) {
    ar.params = empty({ar.numel}, ar.dtype, a->device);
    for (size_t i = 0; i < a->state_names.size(); ++i) ar.states.push_back(zeros({ar.numel}, ar.dtype, a->device));
  }
  NoGradGuard no_grad;
  for (auto& s : a->slots) {
    TrainArenas::Arena& ar = a->arenas[s.arena];
    core::copy_into(slice(ar.params, 0, s.offset, s.offset + s.numel, 1), reshape(s.param, {SymInt(-1)}),
                    "compile_train_step: a parameter's values");
    TensorImpl* impl = s.param.impl();
    impl->storage = ar.params.impl()->storage;
    impl->storage_offset = s.offset;
    impl->strides = contiguous_strides(impl->sizes);
  }
  return a;
}

ParamBinding::ParamBinding(TrainArenas& a, const std::vector<Tensor>& param_arenas) {
  for (auto& s : a.slots) {
    Tensor view = reshape(slice(param_arenas.at(s.arena), 0, s.offset, s.offset + s.numel, 1), s.sizes);
    TensorImpl* impl = s.param.impl();
    saved_.push_back(std::make_unique<Saved>(Saved{impl, *impl}));
    std::shared_ptr<autograd::AutogradMeta> keep_out = nullptr;
    *impl = *view.impl();  // the arena view (a FakeTensor of the trace while compiling)
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
};

BufferBinding::BufferBinding(TrainArenas& a, const std::vector<Tensor>& buffer_inputs) {
  if (buffer_inputs.size() != a.buffers.size())
    throw RuntimeError(fmt::format("compile_train_step: {} buffer inputs for {} buffers", buffer_inputs.size(),
                                   a.buffers.size()));
  for (size_t i = 0; i < a.buffers.size(); ++i) {
    TensorImpl* impl = a.buffers[i].impl();
    saved_.push_back(std::make_unique<Saved>(Saved{impl, *impl}));
    *impl = *buffer_inputs[i].impl();
    autograd::detail::mark_traced_buffer(impl);
  }
}
BufferBinding::~BufferBinding() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    autograd::detail::unmark_traced_buffer((*it)->impl);
    *(*it)->impl = (*it)->before;
  }
}
std::vector<Tensor> BufferBinding::values() const {
  std::vector<Tensor> r;
  NoGradGuard no_grad;
  for (const auto& s : saved_) r.push_back(Tensor(std::make_shared<TensorImpl>(*s->impl)));
  return r;
}

std::vector<Tensor> train_grads(TrainArenas& a, const Tensor& loss) {
  std::vector<Tensor> leaves;
  for (auto& s : a.slots) leaves.push_back(s.param);
  std::vector<Tensor> grads = autograd::grad({loss}, leaves, {}, true, true);
  NoGradGuard no_grad;
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
    auto [np, nst] = opt.update(params.at(k), grads.at(k), st, select(hyper, 0, static_cast<int64_t>(ar.group)), ar.group);
    new_params.push_back(np);
    new_states.insert(new_states.end(), nst.begin(), nst.end());
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
  a.step += 1;
  const size_t G = opt.num_groups();
  std::vector<double> rows;
  size_t width = 0;
  for (size_t g = 0; g < G; ++g) {
    std::vector<double> h = opt.hyperparameters(g);
    h.push_back(static_cast<double>(a.step));
    width = h.size();
    rows.insert(rows.end(), h.begin(), h.end());
  }
  for (const auto& s : a.slots) opt.state(s.param).step = a.step;
  // On the arenas' device (one small host-to-device copy queued on the stream), so every input of the
  // step's graph is on one device.
  return tensor<double>(rows, {static_cast<int64_t>(G), static_cast<int64_t>(width)}).to(a.device);
}

bool donation_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("PROTEAN_DONATE");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

ArenaDonation::ArenaDonation(const TrainArenas& a) {
  if (!donation_enabled()) return;
  std::vector<const void*> ptrs;
  for (const auto& ar : a.arenas) {
    ptrs.push_back(ar.params.data_ptr());
    for (const Tensor& s : ar.states) ptrs.push_back(s.data_ptr());
  }
  for (const Tensor& b : a.buffers) ptrs.push_back(b.data_ptr());
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
  // (nothing to do), but it may have put a result into another arena of the same size. Then every
  // arena adopts its result's storage (the parameters are re-pointed) instead of copying, since a
  // copy would overwrite a result not yet read.
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
  if (permuted) {
    size_t j = 0;
    auto adopt = [&](const Tensor& r) {
      Tensor t = r.to(a.device);
      return t.is_contiguous() ? t : core::copy_of(t);
    };
    for (auto& ar : a.arenas) {
      Tensor np = adopt(results[j++]);
      if (np.dtype() != ar.dtype || np.int_numel() != ar.numel)
        throw RuntimeError("compile_train_step: a step returned an arena of the wrong type or size");
      ar.params = np;
      for (Tensor& s : ar.states) s = adopt(results[j++]);
    }
    for (auto& s : a.slots) {
      const Tensor& arena = a.arenas[s.arena].params;
      TensorImpl* impl = s.param.impl();
      impl->storage = arena.impl()->storage;
      impl->storage_offset = arena.impl()->storage_offset + s.offset;
    }
    return;
  }
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
    copy(a.arenas[k].params, params.at(k));
    for (size_t i = 0; i < ns; ++i) copy(a.arenas[k].states[i], states.at(k * ns + i));
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

}  // namespace protean::detail
