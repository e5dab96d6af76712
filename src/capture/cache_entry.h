// CacheEntry: one compiled graph of a frame plus the guards under which it may be reused.
//
// Guard check (the dispatch fast path), in order, for each input the graph reads:
//   TENSOR_MATCH  dtype, device, requires_grad, rank, each static size, strides (static values, or
//                 "contiguous for the actual sizes" when the trace saw a contiguous tensor with
//                 dynamic sizes); dynamic sizes are written into int64 *slots*
//   CONSTANT      int / bool / float / string arguments and module attributes not made dynamic
//   SLOT          dynamic ints (SymInt arguments) are written into slots
//   SHAPE_ENV     the ShapeEnv's guard program (sym/guard_eval.h) over the slots
// The check allocates nothing and takes no lock; failure texts are produced only on a miss.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/registry.h"
#include "ir/graph.h"
#include "protean/compile.h"
#include "sym/guard_eval.h"

namespace protean::capture {

/// Where a graph input comes from on each call.
struct InputRef {
  enum class Kind : uint8_t { Arg, ListElem, ModuleTensor, DynFloat } kind = Kind::Arg;
  int32_t arg = 0;   // argument index (Arg, ListElem, DynFloat) or module slot (ModuleTensor)
  int32_t elem = 0;  // ListElem: element index
};

struct TensorGuard {
  InputRef ref;
  std::string source;
  DType dtype = DType::F32;
  Device device = kCPU;
  bool requires_grad = false;
  std::vector<int64_t> sizes;     // expected size, ignored where slot >= 0
  std::vector<int32_t> slots;     // slot receiving the dynamic size, or -1
  bool contiguous = false;        // strides must be contiguous for the actual sizes
  std::vector<int64_t> strides;   // otherwise: exact strides (empty: unchecked)
  /// The traced call passed an undefined Tensor here (an optional argument left out, an empty ONNX
  /// optional): the guard holds only while it stays undefined; every other field is unused.
  bool undefined = false;
};

struct ScalarGuard {
  enum class Kind : uint8_t { Int, Bool, Float, String, ListLen, Attr } kind = Kind::Int;
  int32_t arg = 0;
  std::string source;
  int64_t i = 0;     // Int / Bool / ListLen / Attr expected value (ignored when slot >= 0)
  double f = 0;
  std::string s;
  int32_t slot = -1;  // dynamic int: bind instead of compare
  const int64_t* attr = nullptr;  // Attr: the module attribute's storage
};

/// How a flattened output is produced on a hit.
struct OutSpec {
  /// Undefined: the function returned an undefined Tensor there (an empty optional of an ONNX model;
  /// fixed per entry, since the inputs' presence is guarded).
  enum class Kind : uint8_t { GraphOutput, SymExpr, Int, Float, Bool, Undefined } kind = Kind::GraphOutput;
  int32_t index = 0;          // GraphOutput: index into the artifact's outputs
  sym::Expr expr = nullptr;   // SymExpr: evaluated with the symbol values
  int64_t i = 0;
  double f = 0;
  bool b = false;
};

struct CacheEntry {
  int compile_index = 0;
  std::string compile_id;  // "F/C"
  std::vector<TensorGuard> tensors;
  std::vector<ScalarGuard> scalars;
  /// Module members that were one tensor when traced (a tied weight registered under two names), as
  /// (member, the first member it was): forward's reads of either resolved to one graph input, so the
  /// entry holds only while they still are one tensor (torch's guards on parameter aliasing).
  std::vector<std::pair<int32_t, int32_t>> module_ties;
  std::vector<std::string> module_tie_texts;  ///< the failure text of each tie, for recompile reasons
  int32_t num_slots = 0;
  std::vector<std::string> slot_sources;  // for failure texts
  sym::GuardProgram program;
  bool has_program = false;
  // Symbols the artifact needs, and the slot each one is read from.
  std::vector<sym::Expr> symbols;
  std::vector<int32_t> symbol_slots;
  // Facts over unbacked symbols the graph relies on (ShapeEnv runtime asserts); the artifact checks them.
  std::vector<sym::RuntimeAssert> runtime_asserts;
  // Finite upper bound of each symbol's range at the end of capture (marks, guards), by name: what
  // backend::BackendInput::upper_bounds carries to the schedule policies.
  std::map<std::string, int64_t> upper_bounds;
  std::vector<InputRef> inputs;  // one per graph placeholder, graph order
  std::vector<OutSpec> outputs;
  std::shared_ptr<ir::Graph> graph;
  std::unique_ptr<backend::Artifact> artifact;
  bool runs_user_function = false;
  std::string guards_text;  // the guard tree, for logs

  /// Observed [min, max] of each slot's value over the calls that ran this entry (relaxed atomics,
  /// written on the hit path by observe()); init_ranges() sizes them once num_slots is final. The
  /// frame folds them into its FrameState so the PGO profile's size ranges are true ranges, not the
  /// range of the compiling calls only.
  mutable std::unique_ptr<std::atomic<int64_t>[]> slot_min, slot_max;
  void init_ranges();
  /// Records this call's slot values (a few ns: two relaxed loads per slot, a CAS only when a range
  /// widens). `slots` as filled by check().
  void observe(const int64_t* slots) const {
    for (int32_t i = 0; i < num_slots && slot_min; ++i) {
      const int64_t v = slots[i];
      int64_t lo = slot_min[i].load(std::memory_order_relaxed);
      while (v < lo && !slot_min[i].compare_exchange_weak(lo, v, std::memory_order_relaxed)) {
      }
      int64_t hi = slot_max[i].load(std::memory_order_relaxed);
      while (v > hi && !slot_max[i].compare_exchange_weak(hi, v, std::memory_order_relaxed)) {
      }
    }
  }
  /// Fast check; fills `slots` (size >= num_slots). No allocation.
  bool check(std::span<const detail::ArgValue> args, const std::vector<const Tensor*>& module_tensors,
             int64_t* slots) const;
  /// Text of the first failing guard (`tensor 'x' size mismatch at index 0. expected 4, actual 8`),
  /// or "" when all hold.
  std::string first_failure(std::span<const detail::ArgValue> args, const std::vector<const Tensor*>& module_tensors) const;
  /// Every failing guard (recompiles_verbose).
  std::vector<std::string> all_failures(std::span<const detail::ArgValue> args,
                                        const std::vector<const Tensor*>& module_tensors) const;
};

/// The real tensor an InputRef designates for this call (nullptr when absent).
const Tensor* resolve_input(const InputRef& r, std::span<const detail::ArgValue> args,
                            const std::vector<const Tensor*>& module_tensors);

}  // namespace protean::capture
