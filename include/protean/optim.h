// Optimizers with torch.optim's update equations and option names: SGD (momentum, dampening,
// nesterov, weight_decay, maximize), Adam (betas, eps, weight_decay, amsgrad, maximize) and AdamW
// (decoupled weight decay). They update parameters in place (the tensors' storage) from their grad(),
// eagerly, and also build the same update from ops for a compiled training step
// (compile_train_step, below).
//
// State names follow torch.optim's state_dict: "momentum_buffer" (SGD), "step", "exp_avg",
// "exp_avg_sq", "max_exp_avg_sq" (Adam/AdamW). A parameter without a grad is skipped, as in PyTorch.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "protean/compile.h"
#include "protean/module.h"
#include "protean/tensor.h"

namespace protean::detail {
struct OptimizerStateAccess;
}

namespace protean::optim {

/// torch.optim.SGD's arguments.
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;
};
/// torch.optim.Adam's / AdamW's arguments (AdamW's default weight_decay is 1e-2).
struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  bool maximize = false;
};

/// A group of parameters sharing options (torch.optim's param_groups entries).
template <typename Options>
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;
};

/// Per-parameter state (tensors of the parameter's shape and dtype, and the step count).
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;  // "momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"
};

/// The interface compile_train_step uses: hyperparameters as numbers, state names, and the update
/// written with ops (so it can be traced).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update of every parameter with a grad (torch.optim.Optimizer.step). Runs without recording.
  virtual void step() = 0;
  /// Clears the grads: undefined (set_to_none, PyTorch's default) or zero-filled.
  virtual void zero_grad(bool set_to_none = true) = 0;
  /// Every parameter, in group order.
  virtual std::vector<Tensor> parameters() const = 0;
  /// State of a parameter (created on its first step), torch's optimizer.state[p]. Keyed by the
  /// parameter's TensorImpl. The buffers may be read, written in place or replaced (loading a
  /// checkpoint); a compile_train_step over this optimizer keeps them as views of its state arenas, so
  /// they always hold the compiled steps' moments, and takes replaced or eagerly made ones (and a
  /// larger step count) into its arenas at its next call.
  ParamState& state(const Tensor& p) {
    ++state_epoch_;
    return state_[p.impl()];
  }
  const std::map<const TensorImpl*, ParamState>& states() const { return state_; }
  /// Counts the calls of the non-const state(): a compiled step compares it to find out whether the
  /// state may have changed outside it since its last call.
  uint64_t state_epoch() const { return state_epoch_; }

  // ---- used by compile_train_step ----
  /// The names of the per-parameter state buffers the update reads and writes: the union over the
  /// groups, so it changes with the structural options (momentum ≠ 0 adds "momentum_buffer", amsgrad
  /// "max_exp_avg_sq").
  virtual std::vector<std::string> state_names() const = 0;
  /// The hyperparameters of group `g` as numbers, in the order update() reads them; they become one f64
  /// graph input, so changing them never recompiles.
  virtual std::vector<double> hyperparameters(size_t group) const = 0;
  virtual size_t num_groups() const = 0;
  /// Index of the group holding parameter p (ValueError if none).
  virtual size_t group_of(const Tensor& p) const = 0;
  /// The parameters of group `g` (torch's param_groups[g]["params"]); std::out_of_range past the last.
  virtual const std::vector<Tensor>& group_params(size_t g) const = 0;
  /// The structural options of every group, the ones the update's ops depend on (SGD: nesterov,
  /// maximize, momentum ≠ 0; Adam/AdamW: amsgrad, maximize), as text such as
  /// `group 0: nesterov=1 maximize=0 momentum=1`. compile_train_step compiles the step again when it
  /// changes (torch.compile guards on these attributes of the optimizer likewise).
  virtual std::string structure() const = 0;
  /// The update as ops: p, g and the state tensors (in state_names() order) → new p and new state, with
  /// the structural options of param group `group` (a state this group does not use is returned
  /// unchanged). `hyper` is a 1-D f64 tensor: hyperparameters(group) followed by the step count (after
  /// increment).
  virtual std::pair<Tensor, std::vector<Tensor>> update(const Tensor& p, const Tensor& g,
                                                        const std::vector<Tensor>& state, const Tensor& hyper,
                                                        size_t group) const = 0;

 protected:
  std::map<const TensorImpl*, ParamState> state_;

 private:
  friend struct protean::detail::OptimizerStateAccess;
  uint64_t state_epoch_ = 0;
};

/// torch.optim.SGD: g ← grad (+ weight_decay·p); with momentum, buf ← g on the first step, else
/// momentum·buf + (1 − dampening)·g, then g ← g + momentum·buf (nesterov) or buf; p ← p − lr·g.
/// Throws ValueError for lr < 0, momentum < 0, weight_decay < 0, or nesterov without momentum or with
/// dampening (PyTorch's checks).
class SGD final : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  explicit SGD(std::vector<ParamGroup<SGDOptions>> groups);
  void step() override;
  void zero_grad(bool set_to_none = true) override;
  std::vector<Tensor> parameters() const override;
  std::vector<ParamGroup<SGDOptions>> param_groups;

  std::vector<std::string> state_names() const override;
  std::vector<double> hyperparameters(size_t group) const override;
  size_t num_groups() const override { return param_groups.size(); }
  size_t group_of(const Tensor& p) const override;
  const std::vector<Tensor>& group_params(size_t g) const override { return param_groups.at(g).params; }
  std::string structure() const override;
  std::pair<Tensor, std::vector<Tensor>> update(const Tensor& p, const Tensor& g, const std::vector<Tensor>& state,
                                                const Tensor& hyper, size_t group) const override;
};

/// torch.optim.Adam (decoupled = false) and torch.optim.AdamW (decoupled = true):
///   t ← t + 1; g ← grad (Adam: + weight_decay·p; AdamW: p ← p·(1 − lr·weight_decay));
///   m ← β1·m + (1 − β1)·g; v ← β2·v + (1 − β2)·g²; (amsgrad: v̂ ← max(v̂, v), used for v)
///   p ← p − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps).
/// Throws ValueError for lr < 0, eps < 0, betas outside [0, 1), weight_decay < 0.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options);
  explicit Adam(std::vector<ParamGroup<AdamOptions>> groups);
  void step() override;
  void zero_grad(bool set_to_none = true) override;
  std::vector<Tensor> parameters() const override;
  std::vector<ParamGroup<AdamOptions>> param_groups;

  std::vector<std::string> state_names() const override;
  std::vector<double> hyperparameters(size_t group) const override;
  size_t num_groups() const override { return param_groups.size(); }
  size_t group_of(const Tensor& p) const override;
  const std::vector<Tensor>& group_params(size_t g) const override { return param_groups.at(g).params; }
  std::string structure() const override;
  std::pair<Tensor, std::vector<Tensor>> update(const Tensor& p, const Tensor& g, const std::vector<Tensor>& state,
                                                const Tensor& hyper, size_t group) const override;

 protected:
  Adam(std::vector<ParamGroup<AdamOptions>> groups, bool decoupled);
  bool decoupled_ = false;
};

/// torch.optim.AdamW (see Adam). Its AdamOptions default weight_decay to 1e-2 when built from
/// AdamWOptions().
class AdamW final : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamOptions options);
  explicit AdamW(std::vector<ParamGroup<AdamOptions>> groups);
};
/// AdamW's defaults (weight_decay 1e-2), as torch.optim.AdamW.
inline AdamOptions AdamWOptions(double lr = 1e-3) {
  AdamOptions o;
  o.lr = lr;
  o.weight_decay = 1e-2;
  return o;
}

}  // namespace protean::optim

// ---- training-mode layers with state --------------------------------------------------------------------

namespace protean {
/// Training-mode batch norm (torch.nn.functional.batch_norm with training=True, torch.nn.BatchNorm2d in
/// train()) over channel dim 1 of x [N, C, *]: y = (x − mean) / sqrt(var + eps) · weight + bias with the
/// batch's per-channel mean and biased variance over N and the trailing dims. weight, bias (optional)
/// and the running statistics are 1-D [C]. When running_mean and running_var are given they are
/// updated in place as BatchNorm2d does (computed in f64, rounded once to their dtype):
///   running_mean ← (1 − momentum)·running_mean + momentum·mean
///   running_var  ← (1 − momentum)·running_var  + momentum·var·n/(n − 1)   (n values per channel).
/// Written with ops (mean, var, rsqrt, ...), so the derivative table's rules give the gradients of x,
/// weight and bias; the running statistics never require grad. Inside compile_train_step the running
/// statistics must be buffers of its module (they become donated graph inputs and outputs: updated in
/// place, never a recompile). Throws ValueError for n ≤ 1 (as torch), momentum outside [0, 1], eps < 0,
/// only one running statistic; ShapeError for x below 2-D or a [C] tensor of the wrong size; TypeError
/// for non-floating tensors; NotImplementedError when a traced call would update statistics that are
/// not buffers of a compiled training step (the update would be lost or baked into the graph).
Tensor batch_norm_train(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                        const Tensor& running_var, double momentum = 0.1, double eps = 1e-5);
}  // namespace protean

// ---- compiled training step ----------------------------------------------------------------------------

namespace protean {
namespace detail {
/// The flat arenas of a compiled training step: per (dtype, param group) one 1-D parameter arena that
/// the parameters become views of (their TensorImpls are re-pointed, so every handle — the module's,
/// the optimizer's, the user's — sees it), plus one arena per optimizer state buffer. src/autograd/train_step.cpp.
struct TrainArenas;
std::shared_ptr<TrainArenas> make_train_arenas(optim::Optimizer& opt, const std::shared_ptr<Module>& module);
/// While alive, each parameter's TensorImpl is a view of the given arenas (capture-time fakes while
/// tracing) that requires grad; restored afterwards.
class ParamBinding {
 public:
  ParamBinding(TrainArenas& a, const std::vector<Tensor>& param_arenas);
  ~ParamBinding();
  ParamBinding(const ParamBinding&) = delete;
  ParamBinding& operator=(const ParamBinding&) = delete;

 private:
  struct Saved;
  std::vector<std::unique_ptr<Saved>> saved_;
};
/// While alive, each buffer of the module (running statistics, masks) is the given graph input
/// (a capture-time fake) and may be rewritten by a training-mode op (batch_norm_train: its TensorImpl
/// is re-pointed to the new traced value); values() are the buffers' current values, the step's
/// outputs. Restored afterwards. src/autograd/running_stats.h.
class BufferBinding {
 public:
  BufferBinding(TrainArenas& a, const std::vector<Tensor>& buffer_inputs);
  ~BufferBinding();
  BufferBinding(const BufferBinding&) = delete;
  BufferBinding& operator=(const BufferBinding&) = delete;
  std::vector<Tensor> values() const;

 private:
  struct Saved;
  std::vector<std::unique_ptr<Saved>> saved_;
};
/// The loss of a traced step, checked: ValueError naming compile_train_step when it is undefined, not
/// floating or not one element, or when it does not require grad (computed under NoGradGuard,
/// detached, or from none of the optimizer's parameters), saying what to do.
Tensor train_loss(const TrainArenas& a, const optim::Optimizer& opt, const Tensor& loss);
/// Backward of `loss` with respect to the bound parameters, gradients flattened per arena, then the
/// optimizer's update on whole arenas (one elementwise chain each). Returns {new parameter arenas, new
/// state arenas}.
std::pair<std::vector<Tensor>, std::vector<Tensor>> train_update(TrainArenas& a, const optim::Optimizer& opt,
                                                                 const Tensor& loss, const std::vector<Tensor>& param_arenas,
                                                                 const std::vector<Tensor>& state_arenas, const Tensor& hyper);
/// The two halves of train_update, for a step that exchanges gradients between them (data-parallel
/// training, include/protean/distributed.h): the flat gradient of each parameter arena (1-D, the
/// arena's dtype and numel), and the optimizer's update of every arena from given flat gradients.
std::vector<Tensor> train_grads(TrainArenas& a, const Tensor& loss);
std::pair<std::vector<Tensor>, std::vector<Tensor>> train_apply(TrainArenas& a, const optim::Optimizer& opt,
                                                                const std::vector<Tensor>& grads,
                                                                const std::vector<Tensor>& param_arenas,
                                                                const std::vector<Tensor>& state_arenas, const Tensor& hyper);
/// The arenas' current tensors, and the hyperparameters of the next step (rows [groups,
/// hyperparameters + 1], the last column the step count + 1). next_hyper does not advance the step
/// count: commit_step does, once the step's results are written back, so a step that throws leaves
/// it (and every parameter's state().step) unchanged. commit_step advances the state().step of the
/// parameters that received a gradient only (as torch.optim skips a parameter whose grad is None).
std::vector<Tensor> param_arenas(const TrainArenas& a);
std::vector<Tensor> state_arenas(const TrainArenas& a);
Tensor next_hyper(TrainArenas& a, optim::Optimizer& opt);
void commit_step(TrainArenas& a, optim::Optimizer& opt);
/// The module's buffers given to compile_train_step (graph inputs of the step, donated).
std::vector<Tensor> buffers(const TrainArenas& a);
/// Copies a step's results into the arenas' storage (the parameters change in place).
void write_back(TrainArenas& a, const std::vector<Tensor>& params, const std::vector<Tensor>& states);
/// write_back, then the buffers' new values into the buffers' storage. A donated result the backend
/// put into another buffer's memory (or a parameter or state result put into a buffer's) is copied
/// out first, so no result is overwritten before it is read.
void write_back(TrainArenas& a, const std::vector<Tensor>& params, const std::vector<Tensor>& states,
                const std::vector<Tensor>& buffers);
/// Donates the parameter and state arenas and the buffers to the compiled call made while it lives (the
/// backend may write the new values into them in place: see src/backend/donation.h).
/// PROTEAN_DONATE=0 turns it off.
class ArenaDonation {
 public:
  explicit ArenaDonation(const TrainArenas& a);
  ~ArenaDonation();
  ArenaDonation(const ArenaDonation&) = delete;
  ArenaDonation& operator=(const ArenaDonation&) = delete;

 private:
  std::vector<const void*> saved_;
  bool active_ = false;
};

/// The checks and layout a training step makes before each call (the first four points of
/// run_train_step below; distributed::compile_train_step makes them too). Throws ValueError for changed
/// param_groups, a reassigned parameter or a state buffer of the wrong shape or dtype, naming it;
/// nothing is changed then.
void prepare_train_step(TrainArenas& a, optim::Optimizer& opt);
/// ValueError when a tensor handed to the step's call is (a view of) one of its parameters: the step
/// reads its inputs as data, so the loss's dependence through that input would get no gradient.
void check_train_inputs(const TrainArenas& a, const std::vector<Tensor>& inputs);
inline void collect_train_inputs(std::vector<Tensor>& out, const Tensor& t) { out.push_back(t); }
inline void collect_train_inputs(std::vector<Tensor>& out, const std::vector<Tensor>& ts) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename T> void collect_train_inputs(std::vector<Tensor>&, const T&) {}
/// check_train_inputs over a call's arguments (their Tensor and std::vector<Tensor> ones).
template <typename... A>
void check_train_args(const TrainArenas& a, const A&... args) {
  std::vector<Tensor> inputs;
  (collect_train_inputs(inputs, args), ...);
  check_train_inputs(a, inputs);
}
/// The optimizer structure the state arenas are laid out for (Optimizer::structure() as of the last
/// prepare_train_step): one compiled update per structure.
const std::string& train_structure(const TrainArenas& a);

/// What run_train_step hands the compiled frame: the arenas, the buffers, the hyperparameters, and
/// the optimizer's structure (Optimizer::structure(); one compiled frame per structure).
struct TrainCallInputs {
  std::vector<Tensor> params, states, buffers;
  Tensor hyper;
  std::string structure;
};
using TrainOut = std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>>;
/// One call of a compiled training step, around `call` (the compiled frame):
///  * the parameters must still be the step's: ValueError naming the parameter when the module's
///    parameter was reassigned after the step was made; when another step (over the same
///    parameters) moved them into its arenas, they are packed back into this step's (values copied,
///    TensorImpls re-pointed), so both steps train the same values;
///  * a changed Optimizer::structure() re-lays the state arenas (a new state starts at zeros, a
///    dropped one is kept for when it comes back, as in the eager optimizer's state);
///  * the optimizer's per-parameter state follows the arenas: each state buffer of the current
///    structure is a view of its slice of the state arena, so reading optimizer.state(p) after
///    compiled steps gives their moments and an eager step() writes into the arenas. When the state
///    may have changed outside the step (Optimizer::state_epoch() moved: an eager step, a loaded
///    checkpoint), a buffer that is not that view is copied into the arena (then replaced by the
///    view: a handle to the old tensor, such as the checkpoint's, is left alone and no longer
///    follows the state; read state(p) again), and the step count continues from the largest
///    state(p).step;
///  * the call runs with the arenas and buffers donated, then the results are written back and only
///    then the step count advances. When `call` throws, the step count, the parameters, the
///    optimizer state and the buffers are as before the call (the buffers a traced step rewrites are
///    saved before the call and put back; the arenas are written only by the update, after the
///    forward and backward ops that can throw at run time, such as an index out of range).
Tensor run_train_step(TrainArenas& a, optim::Optimizer& opt, const std::function<TrainOut(const TrainCallInputs&)>& call);

/// The compiled frames of one step, one per optimizer structure (Optimizer::structure()): a
/// structural option changed compiles the step (or its update) again; switching back reuses the frame.
template <typename Fn>
struct FramesByStructure {
  std::function<Fn()> compile;
  std::map<std::string, Fn> by_structure;
  Fn& at(const std::string& structure) {
    auto it = by_structure.find(structure);
    if (it == by_structure.end()) it = by_structure.emplace(structure, compile()).first;
    return it->second;
  }
};

template <typename Sig> struct TrainStepMaker;
template <typename... Args>
struct TrainStepMaker<Tensor(Args...)> {
  template <typename F>
  static auto make(std::shared_ptr<Module> module, F loss_fn, optim::Optimizer& opt, CompileOptions opts) {
    std::shared_ptr<TrainArenas> arenas = make_train_arenas(opt, module);
    auto body = std::make_shared<std::function<TrainOut(Args..., std::vector<Tensor>, std::vector<Tensor>,
                                                        std::vector<Tensor>, Tensor)>>(
        [arenas, &opt, loss_fn = std::move(loss_fn)](Args... args, std::vector<Tensor> params,
                                                    std::vector<Tensor> states, std::vector<Tensor> bufs,
                                                    Tensor hyper) -> TrainOut {
          ParamBinding bind(*arenas, params);
          BufferBinding bind_buffers(*arenas, bufs);
          Tensor loss = train_loss(*arenas, opt, loss_fn(args...));
          auto [np, ns] = train_update(*arenas, opt, loss, params, states, hyper);
          return TrainOut{loss.detach(), std::move(np), std::move(ns), bind_buffers.values()};
        });
    using Sig = TrainOut(Args..., std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, Tensor);
    using Frame = CompiledFunction<Sig>;
    auto frames = std::make_shared<FramesByStructure<Frame>>();
    frames->compile = [body, opts]() {
      return compile_as<Sig>([body](Args... args, std::vector<Tensor> params, std::vector<Tensor> states,
                                    std::vector<Tensor> bufs, Tensor hyper) {
        return (*body)(args..., std::move(params), std::move(states), std::move(bufs), std::move(hyper));
      }, opts, nullptr);
    };
    frames->at(opt.structure());
    return [arenas, frames, &opt](Args... args) -> Tensor {
      check_train_args(*arenas, args...);
      return run_train_step(*arenas, opt, [&](const TrainCallInputs& in) -> TrainOut {
        return frames->at(in.structure)(args..., in.params, in.states, in.buffers, in.hyper);
      });
    };
  }
};
}  // namespace detail

/// Compiles one training step — loss_fn's forward, its backward and `optimizer`'s update — into ONE
/// frame (one graph, one cache entry per shape class) and returns a callable with loss_fn's parameters
/// that runs it and returns the loss. `loss_fn(inputs...)` returns a one-element Tensor and reads the
/// optimizer's parameters (through `module` or directly).
///  * On creation the parameters move into flat arenas, one per (dtype, param group), and become views
///    of them (their storage changes; the values and handles stay). The optimizer state lives in arenas
///    of the same layout, so the update is one elementwise chain per arena whatever the parameter count.
///  * The learning rate, betas, eps, weight decay, momentum, dampening and the step count are one f64
///    graph input read on every call: changing them (a scheduler) never recompiles.
///  * Structural options (SGD's nesterov, maximize and momentum ≠ 0, Adam's amsgrad and maximize, per
///    param group) decide the update's ops: changing one compiles the step again (one compiled frame
///    per combination; a state it adds starts at zeros, as the eager optimizer's does).
///  * A parameter that does not reach the loss with a gradient (not used, used under NoGradGuard or
///    through detach()) is skipped, as torch.optim skips a parameter whose grad is None: its value,
///    its state and its state().step stay as they are.
///  * requires_grad freezes as in torch once any of the optimizer's parameters has it set: a parameter
///    whose requires_grad is false is then read as a value and skipped the same way. When none has it
///    set (Module::register_parameter leaves it unset) every parameter is trained. Freezing or
///    unfreezing after the step was made is a ValueError at the next call naming the parameter.
///  * The module's buffers are graph inputs read on every call (not constants); the ones a
///    training-mode op rewrites (batch_norm_train's running statistics) are also outputs, donated and
///    written back in place, so updating them never recompiles. A buffer, or a parameter the
///    optimizer does not train, that the module reassigns after this call is a ValueError at the next
///    call naming it (the step reads the tensors it was made with; values written into them are seen).
///  * The parameters and the state are updated in place: the arenas are donated to the compiled call
///    (the cpu backend writes the new values into them where its loop program proves it safe); a
///    result the backend put elsewhere is copied back. PROTEAN_DONATE=0 turns donation off.
///  * A call that throws (a batch of the wrong dtype or size, an index out of range) leaves the step
///    count, the parameters, the optimizer state and the buffers as they were.
///  * The optimizer's state follows the step (optimizer.state(p).buffers are views of the state
///    arenas, so a checkpoint taken after compiled steps holds their moments), and the step takes up
///    state made or loaded outside it: eager step()s before or between compiled calls, or buffers
///    assigned from a checkpoint, continue where they left off.
///  * Two steps over the same parameters (two optimizers, or two loss functions) both train the one
///    set of values: a step whose parameters another step moved into its arenas packs them back
///    into its own (a copy of every parameter) before it runs.
///  * Reassigning a module parameter after this call (`net->w = new_tensor`) is a ValueError at the
///    next call naming the parameter: the step trains the tensors it was made with. Write new values
///    into the parameter instead (under NoGradGuard), or make a new optimizer and step.
/// Throws ValueError when the optimizer has no parameters, a parameter is not floating, appears
/// twice or overlaps another in memory (views sharing elements: the arena would separate them), and,
/// at a call, when an input is (a view of) a parameter, when Adam's parameters being trained have
/// different step counts (one count serves the whole update), or when the loss does not require grad
/// or is not one floating element; and what compile and the optimizer throw.
template <typename F>
auto compile_train_step(std::shared_ptr<Module> module, F loss_fn, optim::Optimizer& optimizer, CompileOptions opts = {},
                        std::source_location loc = std::source_location::current()) {
  using Sig = typename detail::FnSig<std::decay_t<F>>::type;
  detail::fill_location(opts, loc);
  if (opts.name == "fn") opts.name = "train_step";
  return detail::TrainStepMaker<Sig>::make(std::move(module), std::move(loss_fn), optimizer, std::move(opts));
}

}  // namespace protean
