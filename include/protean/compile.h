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
//  * Sizes 0 and 1 are specialized (broadcasting semantics depend on them); dynamic symbols get the
//    range [2, int_oo]. Under dynamic = On a size 1 stays symbolic ([1, int_oo]) and is specialized
//    only by an op that depends on it (CompileOptions::keep_size_one_symbolic).
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
#include <source_location>
#include <span>
#include <array>
#include <concepts>
#include <cstring>
#include <utility>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
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
  /// "auto" (the default: the best compiling backend for the device of the first call's tensor inputs
  /// — "cpu" for CPU tensors today — compiling in the background as with async_compile = true, so
  /// the first call of a new graph runs on the interpreter instead of waiting for the C++ compiler;
  /// "interp" when no compiling backend is registered), "eager" (capture only: the user's function
  /// runs directly once guards hold), "interp" (Graph IR interpreter), "cpu" (codegen, synchronous
  /// unless async_compile), or a backend registered with backend::register_backend. Unknown names
  /// are a ValueError listing the registered backends. An op the backend declares it does not take is
  /// a graph break (the op runs eagerly between segments; docs/breaks.md).
  std::string backend = "auto";
  /// "default" | "reduce-overhead" | "max-autotune". On backend cuda, "reduce-overhead" replays one
  /// CUDA graph per (graph, size bucket) with exact sizes patched in (docs/graphs.md); other
  /// backends accept and ignore it. Any other text is a ValueError when the function is compiled.
  std::string mode = "default";
  /// Size-bucket policy for the dynamic symbols (docs/graphs.md; PROTEAN_BUCKETS overrides it):
  /// "" / "default" (powers of two up to 64, then 64 wide up to 1024, then at most 1.25x wide),
  /// "exact" (every size its own bucket) or "pow2=N,step=N,from=N,ratio=R". A symbol's known range
  /// (PGO profile, mark_dynamic min/max) clips its buckets. Bad text is a ValueError at compile time.
  std::string buckets = {};
  /// The first graph break is a CompileError naming the reason, the op and the user's file:line
  /// (otherwise the function runs in segments, docs/breaks.md). Also makes recompile limits errors.
  bool fullgraph = false;
  /// Cache entries per frame before misses run eagerly (torch._dynamo.config.recompile_limit).
  int recompile_limit = 8;
  /// Compiles per frame over the whole process before the frame runs eagerly for good
  /// (torch._dynamo.config.accumulated_recompile_limit).
  int accumulated_recompile_limit = 256;
  /// Hitting a recompile limit is a CompileError instead of a warning + eager fallback.
  bool fail_on_recompile_limit_hit = false;
  /// Verify mode (also PROTEAN_VERIFY=N): re-trace every Nth cache hit (0 = off, 1 = every call) and
  /// compare the fresh graph with the cached one. A difference is one warning naming the first
  /// differing node and its user line (hidden C++ state the guards cannot see); that call runs eagerly
  /// and Stats::verify_failures counts it. Segmented functions are not verified.
  int verify_every = 0;
  /// Under dynamic=On, size-1 dims stay symbolic (VR[1, int_oo], never duck-sized) instead of
  /// specializing to 1: one graph serves batch 1 and batch 2. An op whose result depends on the size
  /// being 1 (a broadcast against another size, squeeze) still guards `Eq(s0, 1)` and specializes it
  /// there. false: 1 specializes as under dynamic=Auto (PyTorch's behaviour). docs/capture.md.
  bool keep_size_one_symbolic = true;
  /// Module parameters/buffers may become dynamic (off: always static, like PyTorch's
  /// force_parameter_static_shapes=True).
  bool dynamic_parameters = false;
  /// Registered int attributes of a compiled Module (Module::attribute) follow automatic dynamic: a
  /// value that changed between compiles becomes a SymInt on the recompile (no 0/1 specialization),
  /// symbolic from the start under dynamic=On, like a SymInt argument (PyTorch needs
  /// allow_unspec_int_on_nn_module for this). false: every attribute is a guarded constant and each
  /// new value recompiles; Module::mark_static(name) does that for one attribute.
  bool dynamic_attributes = true;
  /// Compile in the background (cpu backend): a compile whose C++ library is not in the artifact
  /// cache runs the graph on the interpreter at once while the C++ compiler works on a worker thread;
  /// later calls of the entry switch to the compiled kernels when they are ready, without waiting. A
  /// failed background build is a warning and the entry keeps the interpreter. Counted in
  /// Stats::async_compiles / async_compile_failures / async_fallback_runs. Backends without a slow
  /// step (interp, eager) ignore it.
  bool async_compile = false;
  /// Data-dependent values become unbacked symbols (u0, u1, ...) instead of graph breaks:
  /// nonzero's row count and Tensor::item_symint()'s value (torch._dynamo.config.
  /// capture_scalar_outputs). Guards on them still break; item<T>() and other host reads still
  /// break. docs/breaks.md.
  bool capture_scalar_outputs = false;
  /// Source file/line identifying the function (for PGO identity); filled by PROTEAN_COMPILE or by
  /// std::source_location in compile().
  std::string file = {};
  int line = 0;
  /// Compiler collectives (torch's enable_compiler_collectives; also PROTEAN_COMPILER_COLLECTIVES=1): the
  /// ranks of an MPI job agree on dynamic dims before each compile and compile together. Needs the
  /// protean_mpi library's backend installed; without it this is a no-op. See docs/pgo.md.
  bool compiler_collectives = false;

  // ---- regions (compile_regions; docs/regions.md) ------------------------------------------------
  /// Child Module types compiled as regions: a child called through protean::call(child, ...) whose
  /// class is listed (the demangled C++ name, with or without its namespaces: "Block" or
  /// "mylib::Block") is traced once per region key and recorded as one `call_region` node per use;
  /// its parameters and buffers are inputs of every use, never constants. Empty: no regions (the
  /// child's ops are inlined into the caller's graph, as before).
  std::vector<std::string> region_types = {};
  /// Variants (distinct keys) per region type within one compile. A use whose key would be one more
  /// is traced inline into the caller's graph with one warning naming the region and what split the
  /// variants; under fail_on_recompile_limit_hit or fullgraph it is a CompileError instead.
  int region_variant_limit = 8;
  /// Regions a frontend finds by itself: the repeated blocks of an ONNX model (same ops, attributes
  /// and weight shapes, different weights; docs/regions.md, "ONNX models") are compiled once each and
  /// called per use, like region_types' children. false: they are traced inline (one flat graph).
  bool auto_regions = true;

  // ---- training (value_and_grad, compile_train_step; docs/training.md) -------------------------------
  /// Activation memory budget of a joint forward + backward graph: the fraction in (0, 1] of the
  /// bytes the backward reads that the partitioner may keep saved; above it, the largest saved values
  /// that can be recomputed are recomputed in the backward until the rest fits (PyTorch's
  /// torch._functorch.config.activation_memory_budget). Unset: the min cut as it is. Must lie in
  /// (0, 1]: compile and compile_train_step throw ValueError otherwise (NaN included).
  std::optional<double> memory_budget = std::nullopt;
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
  /// Verify mode: calls whose fresh trace differed from the cached graph (they ran eagerly).
  int64_t verify_failures = 0;
  int64_t async_compiles = 0;          ///< compiles handed to the background worker (async_compile)
  int64_t async_compile_failures = 0;  ///< background compiles that failed (entry stays on interp)
  int64_t async_fallback_runs = 0;     ///< calls run on the interpreter while their compile was pending
  int64_t region_compiles = 0;  ///< region variants traced (one per distinct region key per compile)
  int64_t region_hits = 0;      ///< uses of a region served by an already traced variant
  // ---- CUDA graphs (mode "reduce-overhead" on backend cuda; docs/graphs.md) ----
  int64_t graph_recordings = 0;  ///< CUDA graphs built and instantiated (per size bucket and segment)
  int64_t graph_replays = 0;     ///< calls served by replaying a recorded graph
  int64_t graph_patches = 0;     ///< kernel nodes updated in place (exact sizes, new input/output addresses)
  int64_t graph_buckets = 0;     ///< (graph, size bucket) pairs recorded
  int64_t graph_plain_runs = 0;  ///< reduce-overhead calls that used plain launches (perf_hints says why)
  std::map<std::string, int64_t> graph_buckets_per_frame;  ///< frame id → buckets recorded
  std::map<std::string, int64_t> recompile_reasons;  // reason text → count
  std::map<std::string, int64_t> graph_break_reasons;
  std::map<std::string, double> phase_seconds;  // capture, guards, passes, backend ...
  /// JSON object with every field above.
  std::string to_json() const;
  /// Adds `o`'s counters, reason counts, buckets and phase seconds to these (the sum over frames).
  Stats& operator+=(const Stats& o);
};
Stats stats();
/// Clears counters, every frame's cache entries and FrameState (like torch._dynamo.reset()).
void reset();

// ---- marks (torch._dynamo.mark_dynamic and friends) ---------------------------------------------------
/// Strict: dim `dim` of `t` must stay symbolic; a specialization is a CompileError naming the source,
/// the guard and the user line. Optional range [min, max]. ValueError for a dim out of range, min > max
/// or a negative bound.
void mark_dynamic(const Tensor& t, int64_t dim, std::optional<int64_t> min = std::nullopt,
                  std::optional<int64_t> max = std::nullopt);
/// Hint: make the dim dynamic, but specialization is allowed.
void maybe_mark_dynamic(const Tensor& t, int64_t dim);
/// The dim is never made dynamic (blocks automatic dynamic).
void mark_static(const Tensor& t, int64_t dim);
/// The dim becomes an unbacked symbol (no hint-based guards; size-oblivious reasoning).
void mark_unbacked(const Tensor& t, int64_t dim);

/// Inside a compiled function: split the graph here (segmented execution; a CompileError under
/// fullgraph). No-op in eager code.
void graph_break(const std::string& reason = "protean::graph_break()");

/// Stances (torch.compiler.set_stance).
enum class Stance { Default, EagerOnRecompile, FailOnRecompile, ForceEager };
void set_stance(Stance s);
Stance stance();

class Module;

namespace detail {
/// A type-erased argument of a compiled function.
struct ArgValue {
  enum class Kind : uint8_t { Tensor, Int, SymInt, Float, SymFloat, Bool, String, TensorList };
  Kind kind = Kind::Int;
  Tensor tensor;
  int64_t i = 0;
  SymInt sym;  // Kind::SymInt: symbolic while tracing
  double f = 0;
  SymFloat symf;  // Kind::SymFloat: symbolic while tracing a dynamic float
  bool b = false;
  std::string s;
  std::vector<Tensor> tensors;
};
/// A flattened output value.
struct OutValue {
  enum class Kind : uint8_t { Tensor, Int, SymInt, Float, Bool };
  Kind kind = Kind::Tensor;
  Tensor tensor;
  SymInt sym;  // Int / SymInt (symbolic while tracing)
  double f = 0;
  bool b = false;
};

// ---- argument / output conversion --------------------------------------------------------------------
template <typename T> struct ArgConv;  // to_arg / from_arg per supported parameter type
template <> struct ArgConv<Tensor> {
  static ArgValue to(const Tensor& t) { ArgValue a; a.kind = ArgValue::Kind::Tensor; a.tensor = t; return a; }
  static Tensor from(const ArgValue& a) { return a.tensor; }
};
template <std::integral T> requires(!std::same_as<T, bool>) struct ArgConv<T> {
  static ArgValue to(T v) { ArgValue a; a.kind = ArgValue::Kind::Int; a.i = static_cast<int64_t>(v); return a; }
  static T from(const ArgValue& a) { return static_cast<T>(a.i); }
};
template <> struct ArgConv<bool> {
  static ArgValue to(bool v) { ArgValue a; a.kind = ArgValue::Kind::Bool; a.b = v; return a; }
  static bool from(const ArgValue& a) { return a.b; }
};
template <> struct ArgConv<SymInt> {
  static ArgValue to(const SymInt& v) {
    ArgValue a; a.kind = ArgValue::Kind::SymInt; a.i = v.hint(); a.sym = v; return a;
  }
  static SymInt from(const ArgValue& a) { return a.sym; }
};
template <std::floating_point T> struct ArgConv<T> {
  static ArgValue to(T v) { ArgValue a; a.kind = ArgValue::Kind::Float; a.f = static_cast<double>(v); return a; }
  static T from(const ArgValue& a) { return static_cast<T>(a.f); }
};
template <> struct ArgConv<SymFloat> {
  static ArgValue to(const SymFloat& v) {
    ArgValue a; a.kind = ArgValue::Kind::SymFloat; a.f = v.hint(); a.symf = v; return a;
  }
  static SymFloat from(const ArgValue& a) { return a.symf.is_symbolic() ? a.symf : SymFloat(a.f); }
};
template <> struct ArgConv<std::string> {
  static ArgValue to(const std::string& v) { ArgValue a; a.kind = ArgValue::Kind::String; a.s = v; return a; }
  static std::string from(const ArgValue& a) { return a.s; }
};
template <> struct ArgConv<std::vector<Tensor>> {
  static ArgValue to(const std::vector<Tensor>& v) {
    ArgValue a; a.kind = ArgValue::Kind::TensorList; a.tensors = v; return a;
  }
  static std::vector<Tensor> from(const ArgValue& a) { return a.tensors; }
};

template <typename T> struct OutConv;
template <> struct OutConv<Tensor> {
  static void flatten(const Tensor& t, std::vector<OutValue>& o) { OutValue v; v.tensor = t; o.push_back(std::move(v)); }
  static Tensor rebuild(std::vector<OutValue>& o, size_t& k) { return std::move(o.at(k++).tensor); }
};
template <> struct OutConv<std::vector<Tensor>> {
  // Encoded as an Int count followed by the tensors.
  static void flatten(const std::vector<Tensor>& ts, std::vector<OutValue>& o) {
    OutValue n; n.kind = OutValue::Kind::Int; n.sym = SymInt(static_cast<int64_t>(ts.size())); o.push_back(n);
    for (const auto& t : ts) OutConv<Tensor>::flatten(t, o);
  }
  static std::vector<Tensor> rebuild(std::vector<OutValue>& o, size_t& k) {
    int64_t n = o.at(k++).sym.hint();
    std::vector<Tensor> r;
    r.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) r.push_back(OutConv<Tensor>::rebuild(o, k));
    return r;
  }
};
template <> struct OutConv<SymInt> {
  static void flatten(const SymInt& s, std::vector<OutValue>& o) { OutValue v; v.kind = OutValue::Kind::SymInt; v.sym = s; o.push_back(v); }
  static SymInt rebuild(std::vector<OutValue>& o, size_t& k) { return o.at(k++).sym; }
};
template <std::integral T> requires(!std::same_as<T, bool>) struct OutConv<T> {
  static void flatten(T s, std::vector<OutValue>& o) { OutValue v; v.kind = OutValue::Kind::Int; v.sym = SymInt(static_cast<int64_t>(s)); o.push_back(v); }
  static T rebuild(std::vector<OutValue>& o, size_t& k) { return static_cast<T>(o.at(k++).sym.hint()); }
};
template <> struct OutConv<bool> {
  static void flatten(bool b, std::vector<OutValue>& o) { OutValue v; v.kind = OutValue::Kind::Bool; v.b = b; o.push_back(v); }
  static bool rebuild(std::vector<OutValue>& o, size_t& k) { return o.at(k++).b; }
};
template <std::floating_point T> struct OutConv<T> {
  static void flatten(T f, std::vector<OutValue>& o) { OutValue v; v.kind = OutValue::Kind::Float; v.f = static_cast<double>(f); o.push_back(v); }
  static T rebuild(std::vector<OutValue>& o, size_t& k) { return static_cast<T>(o.at(k++).f); }
};
template <typename... Ts> struct OutConv<std::tuple<Ts...>> {
  static void flatten(const std::tuple<Ts...>& t, std::vector<OutValue>& o) {
    std::apply([&](const auto&... e) { (OutConv<std::decay_t<decltype(e)>>::flatten(e, o), ...); }, t);
  }
  static std::tuple<Ts...> rebuild(std::vector<OutValue>& o, size_t& k) {
    return std::tuple<Ts...>{OutConv<Ts>::rebuild(o, k)...};  // braces: left-to-right evaluation
  }
};
template <typename A, typename B> struct OutConv<std::pair<A, B>> {
  static void flatten(const std::pair<A, B>& t, std::vector<OutValue>& o) {
    OutConv<A>::flatten(t.first, o);
    OutConv<B>::flatten(t.second, o);
  }
  static std::pair<A, B> rebuild(std::vector<OutValue>& o, size_t& k) {
    return std::pair<A, B>{OutConv<A>::rebuild(o, k), OutConv<B>::rebuild(o, k)};
  }
};

/// The engine behind CompiledFunction (src/capture/frame.cpp). Thread-safe.
class CompiledFunctionImpl;
/// Calls the user's function with arguments in their C++ types (FakeTensors / SymInts while tracing)
/// and returns its outputs flattened.
using Body = std::function<std::vector<OutValue>(std::span<const ArgValue> args)>;
/// What the caller must do after dispatch().
enum class Action : uint8_t {
  Ran,       ///< `outs` holds the results of a cache entry's artifact
  RunEager,  ///< call the user's function directly (eager backend, force_eager, recompile limit)
};
std::shared_ptr<CompiledFunctionImpl> make_compiled(CompileOptions opts, Body body,
                                                    std::shared_ptr<Module> module = nullptr);
/// One call: checks guards of each cache entry (newest first), compiles on a miss (once, other threads
/// wait), runs the artifact. Throws CompileError for fullgraph/graph breaks/strict marks/limits.
Action dispatch(CompiledFunctionImpl& impl, std::span<const ArgValue> args, std::vector<OutValue>& outs);
int compiled_frame_id(const CompiledFunctionImpl& impl);
Stats compiled_stats(CompiledFunctionImpl& impl);
[[noreturn]] void throw_empty_compiled_function(const char* what);
std::vector<int> compiled_segment_frames(CompiledFunctionImpl& impl);
bool compiled_segmented(const CompiledFunctionImpl& impl);
const CompileOptions& compiled_options(const CompiledFunctionImpl& impl);

template <typename F> struct FnSig;
template <typename R, typename... A> struct FnSig<R (*)(A...)> { using type = R(A...); };
template <typename R, typename... A> struct FnSig<R(A...)> { using type = R(A...); };
template <typename C, typename R, typename... A> struct FnSig<R (C::*)(A...)> { using type = R(A...); };
template <typename C, typename R, typename... A> struct FnSig<R (C::*)(A...) const> { using type = R(A...); };
template <typename F> requires requires { &F::operator(); }
struct FnSig<F> : FnSig<decltype(&F::operator())> {};
}  // namespace detail

template <typename Sig> class CompiledFunction;

/// A compiled function: call it like the original. Copies share the same frame (cache entries,
/// FrameState). Thread-safe.
template <typename R, typename... Args>
class CompiledFunction<R(Args...)> {
 public:
  /// An empty compiled function (a member to assign `protean::compile(...)` to later). Calling it, or
  /// any method but operator bool, throws RuntimeError.
  CompiledFunction() = default;
  CompiledFunction(std::function<R(Args...)> fn, std::shared_ptr<detail::CompiledFunctionImpl> impl)
      : fn_(std::move(fn)), impl_(std::move(impl)) {}

  /// False for a default-constructed CompiledFunction.
  explicit operator bool() const { return impl_ != nullptr; }

  R operator()(Args... args) const {
    if (!impl_) detail::throw_empty_compiled_function("call");
    std::array<detail::ArgValue, sizeof...(Args)> av{detail::ArgConv<std::decay_t<Args>>::to(args)...};
    std::vector<detail::OutValue> outs;
    if (detail::dispatch(*impl_, av, outs) == detail::Action::RunEager) return fn_(args...);
    if constexpr (!std::is_void_v<R>) {
      size_t k = 0;
      return detail::OutConv<R>::rebuild(outs, k);
    }
  }
  /// The frame index (printed as F in compile ids `F/C`).
  int frame_id() const { return detail::compiled_frame_id(impl("frame_id")); }
  /// This function's counters since the last reset() (its own frame plus its segments' frames after
  /// a graph break): frames, compiles, recompiles, cache_hits, cache_misses, graph_breaks,
  /// guard_evaluations, eager_fallbacks, verify_failures and recompile_reasons. The process-wide
  /// fields (async_*, phase_seconds, graph_break_reasons) are left empty: see protean::stats().
  Stats stats() const { return detail::compiled_stats(impl("stats")); }
  /// True once a graph break switched the function to segmented execution (docs/breaks.md).
  bool segmented() const { return detail::compiled_segmented(impl("segmented")); }
  /// Frame ids of the segments' frames, in creation order (empty until the first graph break). A
  /// function with k breaks on one path has k + 1 segments; another path adds its own segments.
  std::vector<int> segment_frame_ids() const { return detail::compiled_segment_frames(impl("segment_frame_ids")); }
  const CompileOptions& options() const { return detail::compiled_options(impl("options")); }
  /// The user's function (uncompiled).
  const std::function<R(Args...)>& original() const { return fn_; }

  /// Builds the type-erased body that converts arguments back and flattens outputs.
  static detail::Body make_body(std::function<R(Args...)> fn) {
    return [fn = std::move(fn)](std::span<const detail::ArgValue> a) {
      std::vector<detail::OutValue> outs;
      auto call = [&]<size_t... I>(std::index_sequence<I...>) {
        if constexpr (std::is_void_v<R>) {
          fn(detail::ArgConv<std::decay_t<Args>>::from(a[I])...);
        } else {
          detail::OutConv<R>::flatten(fn(detail::ArgConv<std::decay_t<Args>>::from(a[I])...), outs);
        }
      };
      call(std::index_sequence_for<Args...>{});
      return outs;
    };
  }

 private:
  detail::CompiledFunctionImpl& impl(const char* what) const {
    if (!impl_) detail::throw_empty_compiled_function(what);
    return *impl_;
  }
  std::function<R(Args...)> fn_;
  std::shared_ptr<detail::CompiledFunctionImpl> impl_;
};

namespace detail {
inline void fill_location(CompileOptions& opts, const std::source_location& loc) {
  if (opts.file.empty()) {
    opts.file = loc.file_name();
    opts.line = static_cast<int>(loc.line());
  }
}
/// Names of the parameters of the function whose code starts at `code`, from the binary's debug info
/// (empty when it has none for that function). src/capture/location.cpp.
std::vector<std::string> function_parameter_names(const void* code);
/// The parameter names of member function `pmf` (e.g. a Module's forward), or empty for a virtual
/// one or without debug info. The Itanium C++ ABI stores a non-virtual member function pointer as
/// the code address (even) followed by the `this` adjustment; a virtual one as vtable offset + 1.
template <typename PMF>
std::vector<std::string> member_parameter_names(PMF pmf) {
  static_assert(sizeof(PMF) >= sizeof(uintptr_t), "unexpected member function pointer layout");
  uintptr_t word = 0;
  std::memcpy(&word, &pmf, sizeof word);
  if (word & 1u) return {};
  return function_parameter_names(reinterpret_cast<const void*>(word));
}
template <typename Sig, typename Fn>
CompiledFunction<Sig> compile_as(Fn fn, CompileOptions opts, std::shared_ptr<Module> module) {
  using CF = CompiledFunction<Sig>;
  typename std::function<Sig> f(std::move(fn));
  auto impl = make_compiled(std::move(opts), CF::make_body(f), std::move(module));
  return CF(std::move(f), std::move(impl));
}
}  // namespace detail

/// Compiles `fn` (function pointer, lambda or functor with one non-template call operator). Parameters
/// may be Tensor (by value or const&), integers, SymInt, double/float, SymFloat, bool, std::string and
/// std::vector<Tensor>; results may be Tensor, std::vector<Tensor>, SymInt, integers, double, bool,
/// std::tuple / std::pair of those, or void. Nothing is traced until the first call.
/// Throws ValueError for an unknown backend (listing the registered ones).
template <typename F>
auto compile(F fn, CompileOptions opts = {}, std::source_location loc = std::source_location::current()) {
  using Sig = typename detail::FnSig<std::decay_t<F>>::type;
  detail::fill_location(opts, loc);
  return detail::compile_as<Sig>(std::move(fn), std::move(opts), nullptr);
}

/// Compiles `module->forward(...)`. Parameters and buffers become graph inputs with sources
/// `self.<dotted name>` (static shapes unless opts.dynamic_parameters); registered int attributes read
/// through Module::attribute are guarded constants (`self.<name>`) until one changes, then SymInts
/// (opts.dynamic_attributes). Arguments are named by opts.arg_names, else by forward's parameter
/// names when the binary has debug info for it, else `args[i]`. Register every parameter before the
/// first call. Real tensors the forward reads that are not registered are baked in as constants.
template <typename M>
auto compile(std::shared_ptr<M> module, CompileOptions opts = {},
             std::source_location loc = std::source_location::current()) {
  using Sig = typename detail::FnSig<decltype(&M::forward)>::type;
  detail::fill_location(opts, loc);
  if (opts.arg_names.empty()) opts.arg_names = detail::member_parameter_names(&M::forward);
  auto fn = [m = module.get()](auto&&... a) { return m->forward(std::forward<decltype(a)>(a)...); };
  return detail::compile_as<Sig>(std::move(fn), std::move(opts), std::static_pointer_cast<Module>(module));
}


// ---- regional compilation (docs/regions.md) ----------------------------------------------------------
// A transformer's blocks are the same code with different weights. Under compile_regions (or
// CompileOptions::region_types) the caller's trace records each call of such a child as one
// `call_region(operands..., parameters...)` node whose body, a subgraph, is traced once per region
// key and shared by every use with that key; backends compile the body once and call it per use
// (torch.compiler.nested_compile_region and regional compilation of a repeated block mirror this).
//
// Region key (what must be equal for two uses to share a body):
//   * the child's C++ type and the types of all its descendants (by dotted name);
//   * the names, dtypes and traced sizes/strides of its parameters and buffers (static unless
//     CompileOptions::dynamic_parameters: then their symbols);
//   * the traced metadata of its tensor arguments (dtype, device, sizes and strides, symbols
//     included) and the values of its other arguments (ints, bools, floats, strings);
//   * the values of the registered attributes its forward (or a nested region's) reads.
// Attributes are only known after a trace, so a use first matches type, parameters and arguments,
// then checks the attribute values of each recorded variant. A split names what differed
// (`attribute self.blocks.3.causal: 1 vs 0`, `argument 0: f32[4, 64] vs f32[8, 64]`) in the
// `regions` log and in Stats::region_compiles / region_hits.
//
// C++ caveat (as for every compiled function): members of the child that are not parameters,
// buffers or registered attributes are baked into the body unguarded; two instances that differ
// only in such a member would share a body. Register them as attributes.
namespace detail {
/// True while a trace that compiles regions (CompileOptions::region_types) runs on this thread.
bool region_capture_active();
/// Records a call of `m` (dynamic type `type`) as a region when its type is a region type: traces
/// `body` (once per key) and appends one call_region node; `outs` gets the outputs (FakeTensors).
/// Returns false when the call is to be traced inline (not a region type, a non-tensor output, the
/// variant limit hit: logged). Throws CompileError past the variant limit under
/// fail_on_recompile_limit_hit or fullgraph.
bool region_call(Module& m, const std::type_info& type, const Body& body, std::span<const ArgValue> args,
                 std::vector<OutValue>& outs);

/// A region found by a frontend (CompileOptions::auto_regions; the ONNX importer's repeated blocks):
/// like region_call with `type` as the region type's name (it is not matched against region_types)
/// and `site` naming the use in logs. The body may throw InlineRegion to have the use traced inline;
/// a graph break while its body is traced does the same (logged under `regions`).
bool auto_region_call(Module& m, const std::string& type, const std::string& site, const Body& body,
                      std::span<const ArgValue> args, std::vector<OutValue>& outs);
/// Thrown by an auto region's body: this use cannot be a region (why is logged); it is traced inline.
struct InlineRegion {
  std::string why;
};

template <typename Sig> struct ModuleCall;
template <typename R, typename... P> struct ModuleCall<R(P...)> {
  template <typename M, typename... A>
  static R run(M& m, A&&... a) {
    static_assert(sizeof...(A) == sizeof...(P), "protean::call: wrong number of arguments for forward");
    if (region_capture_active()) {
      std::array<ArgValue, sizeof...(P)> av{ArgConv<std::decay_t<P>>::to(a)...};
      Body body = [&m](std::span<const ArgValue> args) {
        std::vector<OutValue> outs;
        [&]<size_t... I>(std::index_sequence<I...>) {
          if constexpr (std::is_void_v<R>) m.forward(ArgConv<std::decay_t<P>>::from(args[I])...);
          else OutConv<R>::flatten(m.forward(ArgConv<std::decay_t<P>>::from(args[I])...), outs);
        }(std::index_sequence_for<P...>{});
        return outs;
      };
      std::vector<OutValue> outs;
      if (region_call(m, typeid(m), body, av, outs)) {
        if constexpr (!std::is_void_v<R>) {
          size_t k = 0;
          return OutConv<R>::rebuild(outs, k);
        } else {
          return;
        }
      }
    }
    return m.forward(std::forward<A>(a)...);
  }
};
}  // namespace detail

/// Calls `child->forward(args...)`. Outside a compiled trace, and for a child whose type is not a
/// region type, this is exactly the call (ops inlined into the caller's graph when traced). While a
/// trace with region types runs (compile_regions), a child of a listed type becomes a region use:
/// one call_region node, the body traced once per region key. Use it in a parent's forward where
/// torch code writes `self.block(x)`. Arguments must convert to forward's parameter types.
template <typename M, typename... A>
auto call(const std::shared_ptr<M>& child, A&&... args) {
  if (!child) throw ValueError("protean::call: the child module is null");
  using Sig = typename detail::FnSig<decltype(&M::forward)>::type;
  return detail::ModuleCall<Sig>::run(*child, std::forward<A>(args)...);
}

/// Options of compile_regions.
struct RegionOptions {
  /// Child Module class names to compile as regions (demangled, with or without namespaces).
  std::vector<std::string> types = {};
  /// Distinct keys per region type within one compile (the recompile limit's default).
  int max_variants = 8;
};

/// Compiles `module->forward` like compile(module, opts), with every child of a type in
/// `regions.types` that forward calls through protean::call compiled as a region: one body per
/// region key, one call_region node per use (see the block comment above). Throws ValueError for
/// an empty type list or a limit below 1.
template <typename M>
auto compile_regions(std::shared_ptr<M> module, RegionOptions regions, CompileOptions opts = {},
                     std::source_location loc = std::source_location::current()) {
  if (regions.types.empty()) throw ValueError("compile_regions: RegionOptions::types is empty; name the repeated child class(es)");
  if (regions.max_variants < 1) throw ValueError("compile_regions: RegionOptions::max_variants must be at least 1");
  opts.region_types = std::move(regions.types);
  opts.region_variant_limit = regions.max_variants;
  return compile(std::move(module), std::move(opts), loc);
}
}  // namespace protean
