// torch.optim's SGD / Adam / AdamW (include/protean/optim.h). One definition of each update, written
// with ops (update()): step() runs it eagerly per parameter and writes the results into the parameter's
// and the state's storage; compile_train_step traces the same function over flat arenas.
#include "protean/optim.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "protean/autograd.h"
#include "protean/ops.h"
#include "protean/tensor_version.h"

namespace protean::optim {

namespace {

void check_nonneg(double v, const char* what, const char* opt) {
  if (!(v >= 0)) throw ValueError(fmt::format("{}: invalid {} {} (must be >= 0)", opt, what, v));
}

/// Copies src's values into dst's storage (same sizes; dst's dtype). The in-place write of step().
void write_into(const Tensor& dst, const Tensor& src) {
  increment_version(dst);  // data derived from the old values (packed weights) is rebuilt
  Tensor s = src.dtype() == dst.dtype() ? src : cast(src, dst.dtype());
  if (dst.is_contiguous()) {
    Tensor c = s.contiguous();
    std::memcpy(dst.data_ptr(), c.data_ptr(), static_cast<size_t>(dst.int_numel()) * dst.itemsize());
    return;
  }
  // A non-contiguous parameter: element by element through its strides.
  Tensor c = s.contiguous();
  IntVec sz = dst.int_sizes(), st = dst.int_strides();
  const int64_t n = dst.int_numel();
  const size_t isz = dst.itemsize();
  auto* d = static_cast<char*>(dst.data_ptr());
  auto* p = static_cast<const char*>(c.data_ptr());
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rem = lin, off = 0;
    for (size_t k = sz.size(); k-- > 0;) {
      off += (rem % sz[k]) * st[k];
      rem /= sz[k];
    }
    std::memcpy(d + off * static_cast<int64_t>(isz), p + lin * static_cast<int64_t>(isz), isz);
  }
}

/// Hyperparameter i of the f64 vector, as a 0-dim tensor of `dtype`.
Tensor hp(const Tensor& hyper, int64_t i, DType dtype) {
  Tensor h = select(hyper, 0, i);
  return dtype == DType::F64 ? h : cast(h, dtype);
}

template <typename Group>
std::vector<Tensor> all_params(const std::vector<Group>& groups) {
  std::vector<Tensor> r;
  for (const auto& g : groups) r.insert(r.end(), g.params.begin(), g.params.end());
  return r;
}
template <typename Group>
size_t find_group(const std::vector<Group>& groups, const Tensor& p, const char* opt) {
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (const Tensor& q : groups[gi].params)
      if (q.impl() == p.impl()) return gi;
  throw ValueError(fmt::format("{}: the tensor is not one of its parameters", opt));
}
template <typename Group>
void zero_all(std::vector<Group>& groups, bool set_to_none) {
  for (auto& g : groups)
    for (Tensor& p : g.params) {
      if (set_to_none) p.set_grad({});
      else if (p.grad().defined()) p.set_grad(full(p.sizes(), 0.0, p.dtype()));
    }
}
/// torch.optim's check: an optimizer needs at least one parameter.
template <typename Group>
void check_not_empty(const std::vector<Group>& groups, const char* opt) {
  for (const auto& g : groups)
    if (!g.params.empty()) return;
  throw ValueError(fmt::format("{}: optimizer got an empty parameter list (pass the tensors to train, e.g. "
                               "module->parameters())",
                               opt));
}
/// Whether two elements of t share a location: dims of size > 1 sorted by |stride|, each stride must
/// pass the span of the smaller dims (a stride-0 dim of size > 1, an expand(), never does).
bool self_overlapping(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size)
  const IntVec sizes = t.int_sizes(), strides = t.int_strides();
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 0) return false;
    if (sizes[d] > 1) dims.emplace_back(std::abs(strides[d]), sizes[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // the largest offset the smaller dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return true;
    span += stride * (size - 1);
  }
  return false;
}
/// torch.optim refuses a parameter in two param groups; one listed twice would be updated twice per
/// step here (a tied weight taken from a list of parameters that was not deduplicated).
template <typename Group>
void check_distinct(const std::vector<Group>& groups, const char* opt) {
  std::map<const TensorImpl*, size_t> seen;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi].params.size(); ++i) {
      const Tensor& p = groups[gi].params[i];
      if (!p.defined()) continue;
      auto [it, fresh] = seen.emplace(p.impl(), gi);
      if (fresh) continue;
      throw ValueError(fmt::format(
          "{}: parameter {} of param group {} appears {} (a parameter may be in one group, once; "
          "Module::parameters() lists a tied weight once)",
          opt, i, gi, it->second == gi ? "twice in that group" : fmt::format("also in param group {}", it->second)));
    }
}
void check_params(const std::vector<Tensor>& ps, const char* opt) {
  for (const Tensor& p : ps) {
    if (!p.defined()) throw ValueError(fmt::format("{}: a parameter is an undefined Tensor", opt));
    if (!is_floating(p.dtype()))
      throw TypeError(fmt::format("{}: parameters must be floating, got {}", opt, short_name(p.dtype())));
    if (p.is_fake()) throw ValueError(fmt::format("{}: a parameter is a capture-time FakeTensor", opt));
    if (self_overlapping(p))
      throw ValueError(fmt::format(
          "{}: a parameter of shape {} and strides {} has elements that share memory (an expand()ed or "
          "otherwise self-overlapping view); an in-place update of it would write one location several "
          "times (PyTorch refuses such writes too). Train the tensor it views, or clone() it",
          opt, to_string(p.sizes()), to_string(p.strides())));
  }
}

/// One eager step of `opt` over its parameters (shared by SGD and Adam).
void eager_step(Optimizer& opt) {
  NoGradGuard no_grad;
  const std::vector<std::string> names = opt.state_names();
  for (const Tensor& p : opt.parameters()) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    ParamState& st = opt.state(p);
    std::vector<Tensor> state;
    for (const std::string& n : names) {
      Tensor& b = st.buffers[n];
      if (!b.defined()) b = zeros(p.int_sizes(), p.dtype());
      state.push_back(b);
    }
    st.step += 1;
    const size_t group = opt.group_of(p);
    std::vector<double> h = opt.hyperparameters(group);
    h.push_back(static_cast<double>(st.step));
    Tensor hyper = tensor<double>(h, {static_cast<int64_t>(h.size())});
    auto [np, ns] = opt.update(p.detach(), g.detach(), state, hyper, group);
    write_into(p, np);
    for (size_t i = 0; i < names.size(); ++i) write_into(state[i], ns[i]);
  }
}

}  // namespace

// ---- SGD --------------------------------------------------------------------------------------------------
SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(std::vector<ParamGroup<SGDOptions>>{{std::move(params), options}}) {}
SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups) : param_groups(std::move(groups)) {
  for (const auto& g : param_groups) {
    const SGDOptions& o = g.options;
    check_nonneg(o.lr, "learning rate", "SGD");
    check_nonneg(o.momentum, "momentum", "SGD");
    check_nonneg(o.weight_decay, "weight_decay", "SGD");
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
      throw ValueError("SGD: nesterov momentum requires a momentum and zero dampening");
    check_params(g.params, "SGD");
  }
  check_not_empty(param_groups, "SGD");
  check_distinct(param_groups, "SGD");
}
void SGD::step() { eager_step(*this); }
void SGD::zero_grad(bool set_to_none) { zero_all(param_groups, set_to_none); }
std::vector<Tensor> SGD::parameters() const { return all_params(param_groups); }
size_t SGD::group_of(const Tensor& p) const { return find_group(param_groups, p, "SGD"); }
std::vector<std::string> SGD::state_names() const {
  for (const auto& g : param_groups)
    if (g.options.momentum != 0) return {"momentum_buffer"};
  return {};
}
std::string SGD::structure() const {
  std::string r;
  for (size_t gi = 0; gi < param_groups.size(); ++gi) {
    const SGDOptions& o = param_groups[gi].options;
    r += fmt::format("{}group {}: nesterov={} maximize={} momentum={}", gi ? "; " : "", gi, int(o.nesterov),
                     int(o.maximize), int(o.momentum != 0));
  }
  return r;
}
std::vector<double> SGD::hyperparameters(size_t group) const {
  const SGDOptions& o = param_groups.at(group).options;
  return {o.lr, o.momentum, o.dampening, o.weight_decay};
}
std::pair<Tensor, std::vector<Tensor>> SGD::update(const Tensor& p, const Tensor& grad, const std::vector<Tensor>& state,
                                                   const Tensor& hyper, size_t group) const {
  const SGDOptions& o = param_groups.at(group).options;  // this group's structure (nesterov, maximize, momentum)
  const DType dt = p.dtype();
  Tensor g = o.maximize ? -grad : grad;
  Tensor lr = hp(hyper, 0, dt), wd = hp(hyper, 3, dt);
  g = g + wd * p;
  std::vector<Tensor> new_state;
  if (!state.empty() && o.momentum == 0) {
    new_state.push_back(state[0]);  // another group's momentum buffer: this group has none (torch.optim: None)
  } else if (!state.empty()) {
    Tensor momentum = hp(hyper, 1, dt);
    Tensor one_minus_dampening = 1.0 - select(hyper, 0, 2);  // in f64, then rounded once (as torch.optim)
    if (dt != DType::F64) one_minus_dampening = cast(one_minus_dampening, dt);
    Tensor first = eq(select(hyper, 0, 4), full({}, 1.0, DType::F64));  // buf ← g on the first step
    Tensor buf = where(first, g, momentum * state[0] + one_minus_dampening * g);
    g = o.nesterov ? g + momentum * buf : buf;
    new_state.push_back(buf);
  }
  return {p - lr * g, new_state};
}

// ---- Adam / AdamW ------------------------------------------------------------------------------------------
Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup<AdamOptions>>{{std::move(params), options}}, false) {}
Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups) : Adam(std::move(groups), false) {}
Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups, bool decoupled)
    : param_groups(std::move(groups)), decoupled_(decoupled) {
  const char* name = decoupled ? "AdamW" : "Adam";
  for (const auto& g : param_groups) {
    const AdamOptions& o = g.options;
    check_nonneg(o.lr, "learning rate", name);
    check_nonneg(o.eps, "epsilon value", name);
    check_nonneg(o.weight_decay, "weight_decay value", name);
    if (!(o.betas.first >= 0 && o.betas.first < 1) || !(o.betas.second >= 0 && o.betas.second < 1))
      throw ValueError(fmt::format("{}: invalid betas ({}, {}) (each must be in [0, 1))", name, o.betas.first,
                                   o.betas.second));
    check_params(g.params, name);
  }
  check_not_empty(param_groups, name);
  check_distinct(param_groups, name);
}
AdamW::AdamW(std::vector<Tensor> params, AdamOptions options)
    : Adam(std::vector<ParamGroup<AdamOptions>>{{std::move(params), options}}, true) {}
AdamW::AdamW(std::vector<ParamGroup<AdamOptions>> groups) : Adam(std::move(groups), true) {}

void Adam::step() { eager_step(*this); }
void Adam::zero_grad(bool set_to_none) { zero_all(param_groups, set_to_none); }
std::vector<Tensor> Adam::parameters() const { return all_params(param_groups); }
size_t Adam::group_of(const Tensor& p) const { return find_group(param_groups, p, decoupled_ ? "AdamW" : "Adam"); }
std::vector<std::string> Adam::state_names() const {
  for (const auto& g : param_groups)
    if (g.options.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}
std::string Adam::structure() const {
  std::string r;
  for (size_t gi = 0; gi < param_groups.size(); ++gi) {
    const AdamOptions& o = param_groups[gi].options;
    r += fmt::format("{}group {}: amsgrad={} maximize={}", gi ? "; " : "", gi, int(o.amsgrad), int(o.maximize));
  }
  return r;
}
std::vector<double> Adam::hyperparameters(size_t group) const {
  const AdamOptions& o = param_groups.at(group).options;
  return {o.lr, o.betas.first, o.betas.second, o.eps, o.weight_decay};
}
std::pair<Tensor, std::vector<Tensor>> Adam::update(const Tensor& p, const Tensor& grad, const std::vector<Tensor>& state,
                                                    const Tensor& hyper, size_t group) const {
  const AdamOptions& o = param_groups.at(group).options;
  const DType dt = p.dtype();
  Tensor g = o.maximize ? -grad : grad;
  Tensor lr64 = select(hyper, 0, 0), b1_64 = select(hyper, 0, 1), b2_64 = select(hyper, 0, 2), t = select(hyper, 0, 5);
  Tensor wd64 = select(hyper, 0, 4);
  // Scalar arithmetic on the hyperparameters is done in f64 and rounded to the parameter's dtype once,
  // as torch.optim does with Python floats (1 - beta2 rounded from f32 operands is 1.3e-5 off in f32,
  // which moves every exp_avg_sq and, over a few hundred steps, the loss curve by 1e-2).
  auto in_dt = [dt](const Tensor& x64) { return dt == DType::F64 ? x64 : cast(x64, dt); };
  Tensor b1 = in_dt(b1_64), b2 = in_dt(b2_64), eps = hp(hyper, 3, dt);
  Tensor one_minus_b1 = in_dt(1.0 - b1_64), one_minus_b2 = in_dt(1.0 - b2_64);
  Tensor param = p;
  if (decoupled_) param = param * in_dt(1.0 - lr64 * wd64);
  else g = g + in_dt(wd64) * param;
  Tensor m = b1 * state[0] + one_minus_b1 * g;
  Tensor v = b2 * state[1] + one_minus_b2 * g * g;
  // Bias corrections in f64, as torch.optim computes them in Python floats.
  Tensor bc1 = 1.0 - pow(b1_64, t), bc2_sqrt = sqrt(1.0 - pow(b2_64, t));
  std::vector<Tensor> new_state{m, v};
  Tensor vhat = v;
  if (state.size() > 2 && o.amsgrad) {
    vhat = maximum(state[2], v);
    new_state.push_back(vhat);
  } else if (state.size() > 2) {
    new_state.push_back(state[2]);  // another group's max_exp_avg_sq: this group is not amsgrad
  }
  Tensor denom = sqrt(vhat) / in_dt(bc2_sqrt) + eps;
  // torch's addcdiv_(exp_avg, denom, value = -lr / bc1): param + (value · exp_avg) / denom.
  Tensor neg_step_size = in_dt(-(lr64 / bc1));
  return {param + neg_step_size * m / denom, new_state};
}

}  // namespace protean::optim
