// protean::compile — capture a C++ function into a guarded, cached graph (TorchDynamo for C++).
//
// Behaviour mirrors torch.compile (PyTorch 2.11) where it applies:
//  * The first call of a compiled function traces it on FakeTensors (sizes are SymInts with hints)
//    into a Graph IR, builds guards over the arguments, hands the graph to a backend and caches the
//    result as a cache entry of the function's *frame*. Later calls check the guards of each entry
//    (newest first); a hit runs the entry, a miss recompiles ("recompile") or runs eagerly once a limit
//    is hit.
//  * Automatic dynamic (dynamic = Auto): the first compile specializes every size; when a guard fails
//    because a size (or an int argument) changed, that dim is marked dynamic in the frame's FrameState
//    and the recompile makes it symbolic, so a frame typically converges to 1 static + 1 dynamic graph.
//  * Sizes 0 and 1 are always specialized (broadcasting semantics depend on them); dynamic symbols get
//    the range [2, int_oo].
//  * A C++ function's body runs only while it is traced. Anything it reads that is not an argument,
//    a Module parameter/buffer/registered attribute is baked into the graph unguarded. Use
//    CompileOptions::verify (or PROTEAN_VERIFY=1) to re-trace calls and detect such hidden state.
//
// Compile ids print as `F/C` (frame index / compile index within the frame), e.g. `0/1`.
#pragma once

#include <any>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "protean/tensor.h"

namespace protean {

enum class Dynamic { Auto, On, Off };

/// Options of one compiled function. Field names follow torch.compile's arguments.
struct CompileOptions {
  /// Function name used in logs, traces, reports and PGO profiles (required for stable PGO identity).
  std::string name = "fn";
  /// Names of the positional arguments (sources). Missing names default to `args[i]`.
  std::vector<std::string> arg_names = {};
  /// Auto: automatic dynamic (static first, dynamic on change). On: every unmarked dim is dynamic
  /// from the first compile (duck-sized). Off: every dim static (each new shape recompiles).
  Dynamic dynamic = Dynamic::Auto;
  /// "eager" (capture only, runs ops directly), "interp" (Graph IR interpreter), "cpu" (codegen).
  std::string backend = "interp";
  /// "default" | "reduce-overhead" | "max-autotune" (accepted; backends may ignore).
  std::string mode = "default";
  /// A graph break becomes an error naming the reason and the user's line.
  bool fullgraph = false;
  /// Cache entries per frame before misses run eagerly (torch._dynamo.config.recompile_limit).
  int recompile_limit = 8;
  /// Re-trace calls and compare with the cached graph (0 = off, 1 = every call, N = every Nth call).
  int verify_every = 0;
  /// Under dynamic=On, keep size-1 dims symbolic instead of specializing them.
  bool keep_size_one_symbolic = false;
  /// Module parameters/buffers may become dynamic (off: always static, like PyTorch's
  /// force_parameter_static_shapes=True).
  bool dynamic_parameters = false;
  /// Compile in the background and run the interpreter until the artifact is ready (cpu backend).
  bool async_compile = false;
  /// Data-dependent sizes (nonzero, item) become unbacked symbols instead of graph breaks.
  bool capture_scalar_outputs = false;
  /// Source file/line identifying the function (for PGO identity); filled by PROTEAN_COMPILE or by
  /// std::source_location in compile().
  std::string file = {};
  int line = 0;
};

/// Process-wide counters since the last reset().
struct Stats {
  int64_t frames = 0;
  int64_t compiles = 0;
  int64_t recompiles = 0;
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
  int64_t graph_breaks = 0;
  int64_t guard_evaluations = 0;
  int64_t eager_fallbacks = 0;
  std::map<std::string, int64_t> recompile_reasons;  // reason text → count
  std::map<std::string, int64_t> graph_break_reasons;
  std::map<std::string, double> phase_seconds;  // capture, guards, passes, backend ...
  /// JSON object with every field above.
  std::string to_json() const;
};
Stats stats();
/// Clears counters, every frame's cache entries and FrameState (like torch._dynamo.reset()).
void reset();

// ---- marks (torch._dynamo.mark_dynamic and friends) ---------------------------------------------------
/// Strict: dim `dim` of `t` must stay symbolic; a specialization is a CompileError naming the source,
/// the guard and the user line. Optional range [min, max].
void mark_dynamic(const Tensor& t, int64_t dim, std::optional<int64_t> min = std::nullopt,
                  std::optional<int64_t> max = std::nullopt);
/// Hint: make the dim dynamic, but specialization is allowed.
void maybe_mark_dynamic(const Tensor& t, int64_t dim);
/// The dim is never made dynamic (blocks automatic dynamic).
void mark_static(const Tensor& t, int64_t dim);
/// The dim becomes an unbacked symbol (no hint-based guards; size-oblivious reasoning).
void mark_unbacked(const Tensor& t, int64_t dim);

/// Inside a compiled function: split the graph here (segmented execution). No-op in eager code.
void graph_break(const std::string& reason = "protean::graph_break()");

/// Stances (torch.compiler.set_stance).
enum class Stance { Default, EagerOnRecompile, FailOnRecompile, ForceEager };
void set_stance(Stance s);
Stance stance();

namespace detail {
/// A type-erased argument of a compiled function.
struct ArgValue {
  enum class Kind { Tensor, Int, SymInt, Float, SymFloat, Bool, String, TensorList } kind;
  Tensor tensor;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<Tensor> tensors;
};
/// The engine behind CompiledFunction (src/capture). Thread-safe.
class CompiledFunctionImpl;
std::shared_ptr<CompiledFunctionImpl> make_compiled(CompileOptions opts);
/// Runs one call: `body` calls the user's function with `args` converted back to their C++ types
/// (FakeTensors / SymInts while tracing) and returns its outputs flattened to tensors + a rebuild
/// function. Returns the flattened outputs.
using Body = std::function<std::vector<Tensor>(const std::vector<ArgValue>& args)>;
std::vector<Tensor> call_compiled(CompiledFunctionImpl& impl, const std::vector<ArgValue>& args, const Body& body);
}  // namespace detail

}  // namespace protean
