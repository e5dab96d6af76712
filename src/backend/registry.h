// Backend registry: a backend turns a captured Graph into an Artifact that runs it.
//
//   register_backend("interp", [](const BackendInput& in) { return std::make_unique<InterpArtifact>(in); });
//   auto art = make_artifact("interp", input);     // ValueError listing the registered names if unknown
//   std::vector<Tensor> outs = art->run(inputs, symbol_values);
//
// Contract: `inputs` are real tensors, one per Placeholder of the graph in graph order;
// `symbol_values[i]` is the value of `BackendInput::symbols[i]` for this call (bound by the
// dispatcher from the guard slots). run() returns one tensor per graph output and may be called
// concurrently from several threads.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace protean::backend {

struct BackendInput {
  std::shared_ptr<const ir::Graph> graph;
  std::vector<sym::Expr> symbols;  ///< symbols whose values run() receives, in order
  std::string compile_id;          ///< "F/C", for logs
  std::string mode = "default";
};

class Artifact {
 public:
  virtual ~Artifact() = default;
  /// Capture-only backends (eager): the dispatcher calls the user's original function instead of run().
  virtual bool runs_user_function() const { return false; }
  virtual std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const = 0;
};

using BackendFactory = std::function<std::unique_ptr<Artifact>(const BackendInput&)>;

/// Registers (or replaces) a backend.
void register_backend(const std::string& name, BackendFactory factory);
bool has_backend(const std::string& name);
/// Registered names, sorted.
std::vector<std::string> registered_backends();
/// Throws ValueError("unknown backend 'x'; registered backends: eager, interp") for unknown names.
void check_backend(const std::string& name);
std::unique_ptr<Artifact> make_artifact(const std::string& name, const BackendInput& input);

/// Registers the asynchronous form of a backend (CompileOptions::async_compile): it returns a ready
/// artifact when that is cheap (e.g. the compiled library is already cached) and otherwise a
/// deferred one that runs the interpreter until the background build is done (async_compile.h).
void register_async_backend(const std::string& name, BackendFactory factory);
/// The async factory of `name` when one is registered, else make_artifact (backends that compile
/// nothing slow, like interp and eager, have none).
std::unique_ptr<Artifact> make_artifact_async(const std::string& name, const BackendInput& input);

}  // namespace protean::backend
