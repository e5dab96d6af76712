// The `interp` backend: executes a Graph IR node by node with the eager CPU kernels.
//
// Construction precomputes everything run() needs (register slots, which attributes mention symbols,
// when each intermediate dies), so run() does no string work and frees each intermediate right after
// its last use. Sizes are never re-derived here: symbolic attributes (e.g. `reshape(shape=[s0, 64])`)
// are evaluated under the symbol values the dispatcher bound from the inputs, then the eager kernel's
// own meta function computes output sizes from the real inputs.
//
// A cond node reads its predicate when it runs and executes only the taken branch (an Interpreter of
// its own over the branch graph, built up front with the same symbols); its outputs are made
// contiguous (the type of a cond output is contiguous whatever the branch returns).
//
// Thread safety: run() is const and keeps its state on the stack; many threads may call one
// Interpreter. Outputs may alias inputs (a graph that returns an input, or a view of one).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "ir/sym_util.h"
#include "sym/shape_env.h"

namespace protean::backend {

using ir::SymbolValues;

class Interpreter {
 public:
  /// `symbols` fixes the order of the values passed to run(inputs, symbol_values) (the backend
  /// registry's BackendInput::symbols). Throws CompileError when the graph has a Constant without
  /// data (e.g. parsed from text) or an op without an eager kernel.
  /// `asserts` (the capture's runtime assertions over unbacked symbols) are checked as soon as their
  /// symbols are bound: RuntimeError naming the assertion, the symbol values and the user's line.
  explicit Interpreter(std::shared_ptr<const ir::Graph> graph, std::vector<sym::Expr> symbols = {},
                       std::vector<sym::RuntimeAssert> asserts = {});
  explicit Interpreter(ir::Graph graph, std::vector<sym::Expr> symbols = {}, std::vector<sym::RuntimeAssert> asserts = {});

  /// Runs the graph. `inputs` are the Placeholder values in order. `syms` binds every symbol that
  /// appears in an attribute (CompileError naming the symbol otherwise). Throws ValueError/TypeError
  /// on a wrong input count, dtype or rank; kernel errors propagate.
  std::vector<Tensor> run(std::span<const Tensor> inputs, const SymbolValues& syms) const;
  /// `symbol_values[i]` is the value of the constructor's `symbols[i]`.
  /// `donated` (backend/donation.h: the data pointers of inputs the caller will not read again): a
  /// graph output is written into a donated input's memory (and returned as that input's tensor) when
  /// they have the same dtype and sizes, the input is contiguous and shares its storage with no other
  /// input, no later step reads the input, and no live value views it. The result is still computed
  /// by the eager kernel and then copied, so what donation saves here is memory: each result's own
  /// buffer is freed at the step that produces it instead of living until the call returns.
  std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values,
                          std::span<const void* const> donated = {}) const;
  /// Binds symbols from the inputs (bind_symbols) and runs.
  std::vector<Tensor> run(std::span<const Tensor> inputs) const;

  const ir::Graph& graph() const { return *graph_; }

 private:
  struct SymAttr {
    uint32_t attr;     // index into attrs.items()
    int32_t element;   // -1: a SymInt attribute; else the element of a SymIntVec
    SymInt value;
  };
  struct Step {
    ops::OpKind op;
    std::string where;             // the node's source (file:line, or the ONNX node), named in its errors
    std::vector<int32_t> in;       // register of each input, -1 for absent
    std::vector<int32_t> out;      // register of each output
    ops::Attrs attrs;              // attributes (symbolic entries substituted per run)
    std::vector<SymAttr> sym_attrs;
    std::vector<int32_t> release;  // registers whose last use is this step
    // Unbacked symbols bound from this step's actual outputs: a size (u0 = nonzero's row count), or
    // the value of a one-element output (local_scalar_dense: item_symint).
    struct Bind {
      uint32_t out;
      uint32_t dim;
      bool value;
      sym::Expr symbol;
    };
    std::vector<Bind> binds;
    std::vector<uint32_t> asserts;  // runtime assertions whose last unbacked symbol this step binds
    // cond: {true branch, false branch}, each run on this step's inputs after the predicate.
    std::vector<std::shared_ptr<const Interpreter>> branches;  ///< cond: {true, false}; call_region: {body}
    bool region = false;                                        ///< call_region: branches[0] runs on every input
    // Input donation: per output of this step that is a graph output, the graph inputs (indices into
    // run's `inputs`) of the same dtype and sizes that no later step reads.
    std::vector<std::pair<uint32_t, std::vector<uint32_t>>> donors;
  };
  void check_assert(const sym::RuntimeAssert& a, const std::function<int64_t(sym::Expr)>& lookup) const;
  using Lookup = std::function<int64_t(sym::Expr)>;  // throws std::out_of_range when unbound
  std::vector<Tensor> execute(std::span<const Tensor> inputs, const Lookup& lookup,
                              std::span<const void* const> donated = {}) const;

  std::shared_ptr<const ir::Graph> graph_;
  std::unordered_map<sym::Expr, size_t> symbol_index_;
  std::vector<Tensor> initial_;  // register file template: constants filled in
  std::vector<int32_t> input_regs_;
  std::vector<DType> input_dtypes_;
  std::vector<size_t> input_ranks_;
  std::vector<Step> steps_;
  std::vector<int32_t> output_regs_;
  std::vector<int32_t> release_inputs_;  // inputs no step reads (dropped before the first step)
  bool has_binds_ = false;               // some step binds an unbacked symbol
  std::vector<sym::RuntimeAssert> asserts_;
  std::vector<uint32_t> asserts_at_start_;  // assertions over dispatcher-bound symbols only
};

/// Binds each symbol that appears bare as a placeholder size (`f32[s0, 64]`) to the input's size.
/// Symbols only reachable through expressions (`2*s0`) are not solved for; the dispatcher binds those.
SymbolValues bind_symbols(const ir::Graph& g, std::span<const Tensor> inputs);

}  // namespace protean::backend
