// Reverse-mode automatic differentiation (PyTorch's autograd, libtorch's C++ names).
//
// Eager tape: every op call (ops::call, the single dispatch point) on an input that requires grad,
// while grad mode is on, records a node holding the op, its attributes, what its rule needs (inputs
// and/or outputs, src/ops/derivatives.def) and edges to the nodes (or leaves) its inputs came from.
// Tensor::backward() walks the nodes in reverse order of recording and runs each op's rule — written
// with the public ops of protean/ops.h — accumulating into leaf tensors' grad(), like
// torch.Tensor.backward. Gradients are reduced to each input's shape (broadcasting: sum_to_size) and
// cast to its dtype. Higher-order gradients (create_graph) are not supported: rules run without
// recording. An op whose rule is missing (derivatives.def PT_UNSUPPORTED) throws NotImplementedError
// naming it when it is recorded.
//
// Under protean::compile the same tape runs over the capture-time FakeTensors: value_and_grad's
// backward is traced into the same Graph IR as the forward, during the same trace (one frame, one
// cache entry; every guard a rule adds is installed before the entry is sealed). Backward IR lines say
// `# [bwd of file:line]` for the forward op's line. See docs/training.md.
#pragma once

#include <cstdint>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "protean/compile.h"
#include "protean/tensor.h"

namespace protean {

/// Whether ops record onto the tape on this thread (torch.is_grad_enabled). On by default.
bool is_grad_enabled();
void set_grad_enabled(bool enabled);

/// RAII: disables recording on this thread for the scope (torch::NoGradGuard).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// RAII: sets grad mode to `enabled` for the scope (torch.set_grad_enabled as a context manager).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(is_grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

namespace autograd {

/// torch.autograd.backward: accumulates d(sum_i <outputs[i], grad_outputs[i]>)/d(leaf) into every leaf's
/// grad(). A missing grad_output (or an undefined one) means 1 for a one-element output; for other
/// outputs ValueError. A given grad_output must have its output's sizes (ShapeError, as torch's
/// "Mismatch in shape") and a floating dtype (TypeError); another floating dtype is cast to the
/// output's. Outputs that do not require grad: ValueError. The graph is freed afterwards.
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {});

/// torch.autograd.grad: the gradients of the outputs with respect to `inputs` (leaves or intermediate
/// results), returned instead of accumulated into grad(). grad_outputs as for backward(). An input the
/// outputs do not depend on gets
/// an undefined tensor, or zeros of its shape when `zeros_for_unused` (ValueError when
/// neither allow_unused nor zeros_for_unused). The graph is freed afterwards.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool allow_unused = false,
                         bool zeros_for_unused = false);

/// x reduced by summation to `sizes` (the broadcasting backward, torch.Tensor.sum_to_size): leading
/// extra dims are summed away, dims where sizes has 1 and x does not are summed with keepdim.
/// ShapeError when sizes is not broadcastable to x's shape.
Tensor sum_to_size(const Tensor& x, const SymIntVec& sizes);

/// Whether `op` (by ops.def name) has a reverse rule, is not differentiable, or has no rule yet.
enum class Derivative { Rule, NoGradient, Unsupported };
/// The table's decision for an op name; ValueError for an unknown name.
Derivative derivative_of(const std::string& op_name);
/// The table's note for an op: the formula or the reason.
std::string derivative_note(const std::string& op_name);

}  // namespace autograd

/// Options of value_and_grad (jax.value_and_grad's argnums, torch.func.grad_and_value's argnums).
struct GradOptions {
  /// Indices of the arguments to differentiate: Tensor arguments (one gradient each) or
  /// std::vector<Tensor> arguments (one gradient per element, in order).
  std::vector<int> wrt = {0};
};

namespace detail {
/// A fresh leaf aliasing t (same storage, same capture value) that requires grad.
Tensor grad_leaf(const Tensor& t);
[[noreturn]] void throw_bad_wrt(int index, int arity, const char* why);
/// value_and_grad's backward: the gradients of `root` with respect to `leaves` (zeros for a leaf the
/// root does not depend on). ValueError naming value_and_grad when root is undefined, not floating,
/// has more than one element, or depends on no leaf through differentiable ops.
std::vector<Tensor> value_and_grad_backward(const Tensor& root, const std::vector<Tensor>& leaves);
template <typename T> struct IsTensorList : std::false_type {};
template <> struct IsTensorList<std::vector<Tensor>> : std::true_type {};
/// The differentiated output of a result: the Tensor itself, or the first element of a pair/tuple (the
/// rest is auxiliary, like jax's has_aux).
inline const Tensor& grad_root(const Tensor& t) { return t; }
template <typename A, typename B> const Tensor& grad_root(const std::pair<A, B>& p) { return grad_root(p.first); }
template <typename... Ts> const Tensor& grad_root(const std::tuple<Ts...>& t) { return grad_root(std::get<0>(t)); }

template <typename Sig> struct ValueAndGrad;
template <typename R, typename... Args>
struct ValueAndGrad<R(Args...)> {
  template <typename F>
  static auto make(F fn, GradOptions opts) {
    constexpr int arity = static_cast<int>(sizeof...(Args));
    for (int w : opts.wrt) {
      if (w < 0 || w >= arity) throw_bad_wrt(w, arity, "is out of range");
      bool ok = false;
      size_t i = 0;
      ((ok = ok || (static_cast<int>(i) == w && (std::is_same_v<std::decay_t<Args>, Tensor> ||
                                                 IsTensorList<std::decay_t<Args>>::value)),
        ++i), ...);
      if (!ok) throw_bad_wrt(w, arity, "is not a Tensor or std::vector<Tensor> argument");
    }
    return [fn = std::move(fn), opts = std::move(opts)](Args... args) -> std::pair<R, std::vector<Tensor>> {
      GradModeGuard enable(true);
      std::tuple<std::decay_t<Args>...> vals{args...};
      // Each argument becomes leaves once (an index listed twice gets its gradients twice): marking
      // it again would differentiate with respect to the second leaf only.
      std::vector<Tensor> leaves;
      std::vector<std::pair<size_t, size_t>> span_of(arity, {0, 0});  // [first leaf, count) per argument
      std::vector<bool> marked(arity, false);
      for (int w : opts.wrt) {
        if (marked[static_cast<size_t>(w)]) continue;
        marked[static_cast<size_t>(w)] = true;
        const size_t first = leaves.size();
        auto mark = [&]<size_t... I>(std::index_sequence<I...>) {
          ((static_cast<int>(I) == w ? mark_one(std::get<I>(vals), leaves) : void()), ...);
        };
        mark(std::index_sequence_for<Args...>{});
        span_of[static_cast<size_t>(w)] = {first, leaves.size() - first};
      }
      R result = std::apply([&](auto&... a) { return fn(a...); }, vals);
      std::vector<Tensor> per_leaf = value_and_grad_backward(grad_root(result), leaves);
      std::vector<Tensor> grads;
      grads.reserve(per_leaf.size());
      for (int w : opts.wrt) {
        const auto [first, count] = span_of[static_cast<size_t>(w)];
        for (size_t k = 0; k < count; ++k) grads.push_back(per_leaf[first + k]);
      }
      return {std::move(result), std::move(grads)};
    };
  }
  static void mark_one(Tensor& t, std::vector<Tensor>& leaves) {
    t = grad_leaf(t);
    leaves.push_back(t);
  }
  static void mark_one(std::vector<Tensor>& ts, std::vector<Tensor>& leaves) {
    for (Tensor& t : ts) mark_one(t, leaves);
  }
  template <typename T> static void mark_one(T&, std::vector<Tensor>&) {}
};
}  // namespace detail

/// Wraps `fn` (a function, lambda or functor with one call operator, as protean::compile takes) into a
/// callable with the same parameters returning {fn's result, gradients}: the gradients of the result
/// (a one-element Tensor, or the first element of a returned pair/tuple) with respect to the
/// arguments listed in opts.wrt, in that order (an index listed twice gets its gradient twice; zeros
/// for an argument the result does not depend on, when it depends on another one).
/// The arguments themselves are not modified: fresh leaves alias them. Works eagerly and under
/// protean::compile, where forward and backward are traced into one graph (one frame, one compile):
///   auto step = protean::compile(protean::value_and_grad(loss_fn, {.wrt = {1, 2}}));
///   auto [loss, grads] = step(x, w1, w2);
/// Throws ValueError (at wrap time) for a wrt index that is out of range or not a tensor argument, and
/// when called, ValueError when the differentiated result is not a one-element floating tensor or
/// depends on none of the wrt arguments through differentiable ops (e.g. it is itself a gradient:
/// higher-order gradients are not supported).
template <typename F>
auto value_and_grad(F fn, GradOptions opts = {}) {
  using Sig = typename detail::FnSig<std::decay_t<F>>::type;
  return detail::ValueAndGrad<Sig>::make(std::move(fn), std::move(opts));
}

}  // namespace protean
