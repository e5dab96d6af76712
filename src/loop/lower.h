// Lowering: Graph IR → loop-level IR (loop_ir.h).
//
// Needs: a verified graph whose sizes are SymInts over the symbols the caller lists (others are bound
// from input sizes at run time), data for every Constant.
// Guarantees: every Call node is either lowered to loop IR or becomes an Extern step running its eager
// kernel, so lowering never fails because an op is not supported. What each op becomes is its row of
// the lowering table (lowering.def): a Lowered row's rule is here, a Decomposed row's in decompose.cpp. A cond becomes one Extern step
// carrying its branch graphs (the pipeline compiles them into programs of their own). Values are lowered lazily, the way
// Inductor does it: a lowered value is a function from an index to a scalar expression, so pointwise
// chains inline into their consumer (vertical fusion) and views are index arithmetic. A value becomes
// a buffer ("is realized") when it is a graph output, an extern's input, a reduction's result, or used
// several times with a large expression, or used several times, a row reduction among its consumers,
// with an expression that loads more than one buffer (a residual stream: schedule.h).
//
// Example: softmax(x, -1) on f32[s0, 4096] becomes three kernels (max, sum of exp, normalize) that the
// scheduler (schedule.h) fuses into one kernel over rows.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "loop/loop_ir.h"
#include "loop/lowering.h"
#include "ir/graph.h"

namespace protean::loop {

/// The canonical form of a stage body, so that equal values are equal expressions (common-subexpression
/// elimination and stage fusion compare bodies by their text, loop_ir.h s_text):
///  * index expressions of Load and Index nodes are simplified (sym::simplify: `r0 > x2` becomes
///    `x2 < r0`, the form a fused stage's substituted index takes);
///  * gt(a, b) becomes lt(b, a) and ge(a, b) becomes le(b, a) (the same result for every input, NaN included);
///  * the operands of add, mul, eq, ne, logical_and and logical_or are ordered: a constant last, two
///    leaves (loads, indices, locals) by text; larger operands keep their order. These ops are exactly
///    commutative in IEEE arithmetic (max and min are left alone: their result for +0 and -0 depends
///    on the operand order).
/// The result computes the same value as `e` for every input.
SExpr canonical_body(const SExpr& e);

/// A lowered tensor value: a function from a full index to a scalar expression. `buffer` >= 0 when the
/// value lives in a buffer (then fn loads from it).
struct TRef {
  DType dtype = DType::F32;
  std::vector<sym::Expr> sizes;
  std::function<SExpr(const std::vector<sym::Expr>&)> fn;
  int buffer = -1;
  /// Set by permute: the value permuted and the dims. An extern that reads operands strided in place
  /// takes the base realized in its own order and a transposed view of it (LowerOptions::extern_views).
  std::shared_ptr<const TRef> permute_base;
  std::vector<int64_t> permute_dims;
};

/// Thrown by a lowering rule that cannot handle a node; the node then runs as an extern.
struct Unsupported {
  std::string why;
};

/// What a backend's renderer can hold besides lowerable_dtype's dtypes.
struct LowerOptions {
  /// Lower values stored as bf16 or f16 instead of running every op on them as an extern. Their
  /// scalar nodes keep the 16-bit dtype; the renderer computes them in f32 and rounds to the 16-bit
  /// dtype where a buffer is stored or a Cast asks for it (Inductor's upcast-compute-downcast, so a
  /// chain of bf16 ops rounds once at its store instead of after every op as eager does). The cuda
  /// renderer takes them; the cpu renderer does not (off there).
  bool half_storage = false;
  /// Keep scaled_dot_product_attention without a mask as one extern step (the renderer's runtime has
  /// a fused kernel: backend/cpu/sdpa.h) instead of decomposing it into matmul, masked softmax, matmul.
  bool fused_attention = false;
  /// Keep bf16 / f16 scaled_dot_product_attention as one extern step, with or without a mask (its 4th
  /// input, an additive mask of the same dtype broadcast to the scores): the cuda backend's kernel
  /// (backend/cuda/attention.h).
  bool fused_attention_half = false;
  /// Lower scaled_dot_product_attention_backward (f32 / f64, no mask; autograd's op for self-attention
  /// shapes) as its composition instead of one extern: scores and dP as matmul externs, the causal mask
  /// and the softmax and its backward as loop kernels, dQ, dK, dV as matmul externs (decompose.cpp).
  /// The probabilities [.., L, L] are stored. The cuda backend takes it (the products on cuBLASLt); the
  /// cpu backend keeps its eager kernel, which never stores them.
  bool decompose_attention_backward = false;
  /// Lower a cat of more than kCatSelectParts parts as one kernel with a pointwise stage per part,
  /// each copying its part into its range of the result, instead of a chain of selects on the index
  /// that every element of the result walks (a training step's flat gradient is a cat of every
  /// parameter's gradient: 50 parts for a 4-layer GPT, 106 ns per element as a select chain). The
  /// cpu backend takes it; a GPU grid wants the select form (one thread per element).
  bool cat_stages = false;
  /// Lower split as one view per output (each part read in place by its consumers) instead of an
  /// extern step whose strided outputs the runner copies into fresh memory.
  bool split_views = false;
  /// Pass a GEMM's (matmul, bmm, linear and their fused forms) operands that are permutes, slices or
  /// reshapes of a buffer as strided views (Extern::views) that the op reads in place, instead of
  /// copying each into a buffer of its own first (a training step's transposed activations and
  /// gradients, its weights sliced from the parameter arena), and scaled_dot_product_attention's q, k
  /// and v whose rows are unit-stride (heads of a fused projection; the cpu backend's fused kernel
  /// reads them in place, backend/cpu/sdpa.h).
  bool extern_views = false;
};

/// The most parts a cat keeps as a select chain on the index (fused into its consumers) under
/// LowerOptions::cat_stages.
inline constexpr size_t kCatSelectParts = 4;

/// The lowering context. Lowering rules (here and in decompose.cpp) build TRefs through it.
class Lowerer {
 public:
  Lowerer(const ir::Graph& g, std::vector<sym::Expr> symbols, LowerOptions options = {});
  /// Lowers the whole graph.
  Program run();

  // ---- building blocks for lowering rules ----
  TRef input(const ir::Node& n, size_t k) const;
  const ir::Graph& graph() const { return g_; }
  const LowerOptions& options() const { return options_; }
  TRef from_buffer(int buffer) const;
  /// Pointwise map over inputs broadcast to `sizes`: f receives the inputs' scalars at each point.
  TRef map(const std::vector<TRef>& in, std::vector<sym::Expr> sizes, DType dtype,
           const std::function<SExpr(const std::vector<SExpr>&)>& f) const;
  TRef unary(const TRef& a, DType dtype, const std::function<SExpr(SExpr)>& f) const;
  TRef binary(const TRef& a, const TRef& b, DType dtype, const std::function<SExpr(SExpr, SExpr)>& f) const;
  TRef broadcast_to(const TRef& a, const std::vector<sym::Expr>& sizes) const;
  TRef permute(const TRef& a, const std::vector<int64_t>& dims) const;
  TRef unsqueeze(const TRef& a, int64_t dim) const;
  /// Reduces `dims` (sorted, distinct) with op sum|prod|max|min, accumulating in `acc`. The result is
  /// a buffer (the reduction kernel is emitted now); keepdim keeps size-1 dims.
  TRef reduce(const TRef& in, std::vector<int64_t> dims, const std::string& op, DType acc, bool keepdim);
  /// Mean and M2 (sum of squared deviations from the mean) of `in` over `dims` in one Welford
  /// reduction (loop_ir.h), accumulating in `acc`; both results keep the reduced dims as size 1.
  /// Variance = M2 / (count - correction).
  std::pair<TRef, TRef> welford(const TRef& in, std::vector<int64_t> dims, DType acc);
  /// Emits a pointwise kernel writing `a` to a new buffer (kind Temp unless `kind` says otherwise).
  TRef realize(const TRef& a, BufferKind kind = BufferKind::Temp);
  /// Emits an extern step running `op` on realized inputs; returns one TRef per output.
  std::vector<TRef> extern_call(ops::OpKind op, const ops::Attrs& attrs, const std::vector<const TRef*>& in,
                                const std::vector<std::pair<DType, std::vector<sym::Expr>>>& outs);
  int new_buffer(DType dtype, std::vector<sym::Expr> sizes, BufferKind kind);
  /// Broadcast shape of two size lists (right-aligned; a constant 1 stretches).
  static std::vector<sym::Expr> broadcast_sizes(const std::vector<sym::Expr>& a, const std::vector<sym::Expr>& b);
  /// Product of sizes.
  static sym::Expr numel(const std::vector<sym::Expr>& sizes);

 private:
  TRef lower_node(const ir::Node& n);
  /// The rules of the lowering table (lowering.h), by family.
  TRef lower_pointwise(const ir::Node& n, const LoweringRow& row);
  TRef lower_view(const ir::Node& n, LowerRule rule);
  TRef lower_other(const ir::Node& n, LowerRule rule);
  void lower_extern(const ir::Node& n);
  /// split as views of its input (LowerOptions::split_views); false when it stays an extern.
  bool lower_split(const ir::Node& n);
  /// `t` as a strided view of one buffer (t reads buffer[offset + sum_k idx_k * strides_k] and
  /// nothing else), or false.
  bool strided_view(const TRef& t, int& buffer, ExternView& view) const;
  /// Input k of an extern `op` as a view its kernel reads in place (LowerOptions::extern_views):
  /// sets buffer and view and returns true, realizing a permute's base first when it has to.
  bool extern_view(ops::OpKind op, size_t k, const TRef& t, int& buffer, ExternView& view);
  /// Emits a one-stage reduction kernel over `dims` (sorted and deduplicated in place) of `in`; sets
  /// `kept` to the outer sizes and returns the stage (the caller sets its outputs).
  Stage& reduction_kernel(const TRef& in, std::vector<int64_t>& dims, const std::string& op, DType acc,
                          std::vector<sym::Expr>& kept);

  /// lowerable_dtype, plus bf16/f16 under LowerOptions::half_storage.
  bool lowerable(DType t) const;

  const ir::Graph& g_;
  LowerOptions options_;
  Program p_;
  std::vector<TRef> values_;       // per ValueId (fn empty = not lowered yet)
  std::vector<int> uses_;          // per ValueId
  std::vector<int> row_uses_;      // per ValueId: consumers lowered by a row-reduction rule
  std::vector<size_t> chain_;      // per ValueId: lowering rules inlined since the last buffer
  std::vector<int> extern_uses_;   // per ValueId: extern steps reading it, directly or through views
  int next_local_ = 0;
  std::string where_;              // the source of the graph node being lowered (Extern::where)
};

/// Lowers `g` (entry point of this stage).
Program lower_graph(const ir::Graph& g, const std::vector<sym::Expr>& symbols, const LowerOptions& options = {});

/// Sizes of an IR value as expressions.
std::vector<sym::Expr> value_sizes(const ir::Value& v);
/// True when loop IR can hold this dtype (bool, i32, i64, f32, f64); other dtypes run as externs.
bool lowerable_dtype(DType t);

}  // namespace protean::loop
