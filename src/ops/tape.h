// The op layer's side of reverse-mode autograd: grad mode and the tape's entry point.
//
// ops::call records every op whose input requires grad on the autograd tape (src/autograd). The tape
// lives above this layer (its rules are written with the public ops), so the op layer only holds
// the thread's grad mode (torch.is_grad_enabled) and a recorder that src/autograd installs when the
// library loads. Without a recorder no op is recorded.
#pragma once

#include <span>
#include <vector>

#include "ops/registry.h"

namespace protean::ops {

/// Grad mode of this thread (NoGradGuard / GradModeGuard set it; ops called inside kernels run with
/// it off so only the outer op is recorded).
inline thread_local bool t_grad_enabled = true;

/// Records `op` on the tape after it ran (eager) or was traced (capture); `outs` may be rewritten
/// to carry autograd state.
using TapeRecorder = void (*)(OpKind op, std::span<const Tensor> in, const Attrs& attrs, std::vector<Tensor>& outs);

/// Installs the tape's recorder (src/autograd/engine.cpp, at load). Not thread-safe against calls.
void set_tape_recorder(TapeRecorder recorder);
TapeRecorder tape_recorder();

/// True when an op on `in` must be recorded: grad mode on and an input requires grad.
inline bool tape_should_record(std::span<const Tensor> in) {
  if (!t_grad_enabled) return false;
  for (const Tensor& t : in)
    if (t.defined() && t.impl()->requires_grad) return true;
  return false;
}

}  // namespace protean::ops
