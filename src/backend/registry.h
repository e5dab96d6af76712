// Backend registry: a backend turns a captured Graph into an Artifact that runs it.
//
//   register_backend("interp", [](const BackendInput& in) { return std::make_unique<InterpArtifact>(in); });
//   auto art = make_artifact("interp", input);     // ValueError listing the registered names if unknown
//   std::vector<Tensor> outs = art->run(inputs, symbol_values);
//
// Contract: `inputs` are real tensors, one per Placeholder of the graph in graph order;
// `symbol_values[i]` is the value of `BackendInput::symbols[i]` for this call (bound by the
// dispatcher from the guard slots). Unbacked symbols (u0: nonzero's row count, item_symint's value)
// are not passed: the artifact binds them from the outputs of the nodes that define them and checks
// BackendInput::runtime_asserts once their symbols are bound (RuntimeError naming the assertion and
// the user's line when one fails). run() returns one tensor per graph output and may be called
// concurrently from several threads.
//
// Which ops a backend takes (docs/breaks.md, "Ops a backend rejects"): a backend may register an
// OpSupport predicate with its factory. Capture asks it about every op it records, segmented
// execution about every op it records into a segment; an op it rejects is a graph break (the op runs
// eagerly between two segments, or CompileError under fullgraph). A factory that finds an op it
// cannot lower only while building the artifact throws UnsupportedOpError: the dispatcher turns it
// into the same graph break and remembers the op (kind and input dtypes) for that frame.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "protean/tensor.h"
#include "sym/expr.h"
#include "sym/shape_env.h"

namespace protean::backend {

struct BackendInput {
  std::shared_ptr<const ir::Graph> graph;
  std::vector<sym::Expr> symbols;  ///< symbols whose values run() receives, in order
  std::string compile_id;          ///< "F/C", for logs
  std::string mode = "default";
  /// Facts over unbacked symbols the graph relies on (ShapeEnv::check during capture: the first use of
  /// item_symint's value as a size, narrow's bounds, protean::check); run() checks each one as soon as
  /// its symbols are bound.
  std::vector<sym::RuntimeAssert> runtime_asserts = {};
  /// Inclusive upper bound of a size symbol (by name) where the capture's ShapeEnv knows one that the
  /// guards keep: a mark_dynamic max, a guard such as `s0 < 100`, a range a runtime assertion
  /// enforces. Symbols without a finite bound are absent. A schedule policy may size on-chip storage
  /// from these (the cuda policy keeps a row in registers when its bound fits); a call outside a bound
  /// never reaches the artifact (the guard fails and the frame recompiles), so nothing may rely on a
  /// bound the guards do not keep (a PGO profile's observed max is not one unless it became a mark).
  std::map<std::string, int64_t> upper_bounds = {};
  /// Size buckets (mode "reduce-overhead"; docs/graphs.md): the policy spec in force
  /// (dynamic::resolve_bucket_policy's text) and, per entry of `symbols`, the known [min, max] of its
  /// values and where that came from ("pgo", "mark", "observed", "unknown").
  struct SymbolRange {
    int64_t min = 0;
    int64_t max = INT64_MAX;
    std::string why = "unknown";
  };
  struct Buckets {
    std::string policy;
    std::vector<SymbolRange> ranges;
  };
  Buckets buckets = {};
  /// The device of the graph's device tensor inputs (their guards keep it), kCPU when every input is
  /// on the host: a device backend runs the graph there (cuda:1 for a rank whose model is on cuda:1).
  Device device = kCPU;
};

/// One op call a backend is asked about. Inputs are FakeTensors (capture), lazy tensors (segmented
/// recording) or real tensors: a predicate reads their metadata (dtype, sizes, strides), never their
/// data. Sizes are symbolic during capture; deciding on them (`x.size(0) > 1024`) records a guard, as
/// in a meta function, so keep predicates to dtypes, ranks and attributes where possible.
struct OpQuery {
  ops::OpKind op;
  std::span<const Tensor> inputs;       ///< absent optional inputs are undefined Tensors
  const ops::Attrs& attrs;
  std::span<const TensorMeta> outputs;  ///< the op's meta function result
};
/// A backend's answer: std::nullopt when it takes the op, else why not (shown to users after
/// "backend 'X' does not support <op>(<dtypes/shapes>): "). Must be thread-safe and cheap: segmented
/// execution asks it for every recorded op of every call.
using OpSupport = std::function<std::optional<std::string>(const OpQuery&)>;

/// Thrown by a backend factory when building the artifact finds an op it cannot run (a lowering that
/// rejects late). The dispatcher turns it into a graph break at the node's user line, like a
/// rejection by the backend's OpSupport, and from then on breaks that frame at every op of the same
/// kind and input dtypes. Build it with the node so the break names the op and the line.
class UnsupportedOpError : public CompileError {
 public:
  UnsupportedOpError(const ir::Graph& g, const ir::Node& n, std::string why);
  ops::OpKind op;
  std::vector<DType> dtypes;  ///< input dtypes (absent optional inputs are left out)
  std::string call;           ///< "matmul(f64[s0, 3], f64[3, 2])"
  std::string why;
  core::SourceLocation loc;
};

class Artifact {
 public:
  virtual ~Artifact() = default;
  /// Capture-only backends (eager): the dispatcher calls the user's original function instead of run().
  virtual bool runs_user_function() const { return false; }
  virtual std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const = 0;
};

using BackendFactory = std::function<std::unique_ptr<Artifact>(const BackendInput&)>;

/// Registers (or replaces) a backend. `supports` (optional) says which ops it takes; without it the
/// backend takes every op (interp, eager and cpu: each has a kernel or an extern call for every op of
/// ops.def). A compiled function uses the predicate registered when it was compiled.
void register_backend(const std::string& name, BackendFactory factory, OpSupport supports = {});
bool has_backend(const std::string& name);
/// The support predicate of `name` (empty when it takes every op, or when `name` is unknown).
OpSupport op_support(const std::string& name);
/// Registered names, sorted.
std::vector<std::string> registered_backends();
/// Throws ValueError("unknown backend 'x'; registered backends: eager, interp") for unknown names.
/// "auto" is always valid (auto_backend resolves it).
void check_backend(const std::string& name);
/// What backend "auto" (CompileOptions::backend's default) means for tensors on `device`: the best
/// registered compiling backend for that device — "cuda" for a CUDA device when registered, "cpu"
/// for the CPU when registered — else "interp" (also for a CUDA device without a cuda backend).
std::string auto_backend(Device device);
std::unique_ptr<Artifact> make_artifact(const std::string& name, const BackendInput& input);

/// Registers the asynchronous form of a backend (CompileOptions::async_compile): it returns a ready
/// artifact when that is cheap (e.g. the compiled library is already cached) and otherwise a
/// deferred one that runs the interpreter until the background build is done (async_compile.h).
void register_async_backend(const std::string& name, BackendFactory factory);
/// The async factory of `name` when one is registered, else make_artifact (backends that compile
/// nothing slow, like interp and eager, have none).
std::unique_ptr<Artifact> make_artifact_async(const std::string& name, const BackendInput& input);

}  // namespace protean::backend
