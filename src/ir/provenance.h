// Backward provenance: while a reverse-mode rule runs under capture, the source line of the forward
// op it differentiates, so the ops the rule records print `# [bwd of file:line]`. Set by the autograd
// engine (src/autograd), read by the tracer (src/capture); both sit above this layer.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

/// The forward op's line while a rule runs under capture; null otherwise.
inline thread_local const core::SourceLocation* t_backward_provenance = nullptr;

/// True while a compiled training step traces its optimizer part (the flat gradients and the update
/// of the arenas, src/autograd/train_step.cpp). The tracer then sets the nodes' location function to
/// kOptimizerMarker, which SourceLocation::str() prints as `[optim at file:line]` (the line that made
/// the train step), so IR text and reports can tell forward, backward and optimizer nodes apart.
inline thread_local bool t_optimizer_update = false;
inline constexpr const char* kOptimizerMarker = "[optim]";

/// Marks the ops traced in its scope as the optimizer part.
class OptimizerUpdateScope {
 public:
  OptimizerUpdateScope() : prev_(t_optimizer_update) { t_optimizer_update = true; }
  ~OptimizerUpdateScope() { t_optimizer_update = prev_; }
  OptimizerUpdateScope(const OptimizerUpdateScope&) = delete;
  OptimizerUpdateScope& operator=(const OptimizerUpdateScope&) = delete;

 private:
  bool prev_;
};

}  // namespace protean::ir
