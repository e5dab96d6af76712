// The reverse rule of call_region (regional compilation, docs/regions.md): the use's saved inputs
// (its tensor arguments, then the child's parameters and buffers) go through the region body again
// with grad mode on, so every op of the body is recorded on a tape of its own, and that tape is
// differentiated with the gradients of the use's outputs. Under capture both the recomputation and its
// backward are traced into the frame's graph, inline (the forward keeps its one call_region node per
// use); the result is the gradient the inlined (flat) compile computes, op for op. This is activation
// checkpointing at region granularity: the body's intermediates are not kept from the forward.
#include <fmt/format.h>

#include "autograd/rules.h"
#include "capture/cond.h"
#include "capture/region.h"

namespace protean::autograd {

Grads rule_call_region(const GradCtx& c) {
  std::shared_ptr<const ir::Graph> body = capture::region_body(c.attrs().i("body_id"));
  const size_t n = c.num_inputs();
  std::vector<Tensor> in(n), wrt;
  std::vector<size_t> wrt_index;
  for (size_t i = 0; i < n; ++i) {
    if (!c.in_defined(i)) continue;
    in[i] = c.in(i);
    if (c.needs(i) && is_floating(in[i].dtype())) {
      in[i] = protean::detail::grad_leaf(in[i]);
      wrt.push_back(in[i]);
      wrt_index.push_back(i);
    }
  }
  Grads r(n);
  if (wrt.empty()) return r;
  std::vector<Tensor> outs;
  {
    GradModeGuard record(true);
    outs = capture::call_graph(*body, in);
  }
  if (outs.size() != c.g.size())
    throw RuntimeError(fmt::format("call_region backward: region {} returned {} outputs again, its use had {}",
                                   c.attrs().s("region"), outs.size(), c.g.size()));
  std::vector<Tensor> roots, seeds;
  for (size_t k = 0; k < outs.size(); ++k)
    if (c.g[k].defined() && outs[k].defined() && outs[k].impl()->requires_grad) {
      roots.push_back(outs[k]);
      seeds.push_back(c.g[k]);
    }
  if (roots.empty()) return r;
  std::vector<Tensor> g = grad(roots, wrt, seeds, /*allow_unused=*/true, /*zeros_for_unused=*/false);
  for (size_t j = 0; j < wrt.size(); ++j) r[wrt_index[j]] = g[j];
  return r;
}

}  // namespace protean::autograd
