// Loop-level IR: what a lowered graph becomes before a backend renders it (the cpu backend as C++,
// backend/cpu/codegen.h). Backend-neutral: nothing here knows about a target.
//
// Semantics every stage (lower, schedule, render) must respect:
//  * A Program is a list of Steps run in order: a Kernel (generated code) or an Extern (an eager op,
//    ops::run_eager, for everything that is not lowered; or a cond, which reads its predicate input
//    and runs the compiled program of the taken branch on the other inputs). Steps read and write
//    Buffers.
//  * A Buffer is a dense, row-major (contiguous) array of `dtype` with symbolic `sizes`. Inputs that
//    arrive non-contiguous are made contiguous by the runner before the first step.
//  * A Kernel is a loop nest over its `outer` domain (loop variables x0, x1, ...) containing Stages run
//    in order for every outer point. A Stage iterates its own `inner` domain (r0, r1, ...):
//      - Pointwise: for each inner point, stores `body` to out[out_index];
//      - Reduction: folds `body` over the inner domain with `reduce_op` (sum | prod | max | min),
//        stores the result to out[out_index] (unless out < 0) and names it `local` so later stages of
//        the same kernel read it without a load (that is what "a reduction fused with its epilogue" is).
//        `welford` is the one reduction with two results: the mean of the body values (`local`,
//        stored to out[out_index]) and M2, the sum of their squared deviations from that mean
//        (`local2`, stored to out2[out_index]); variance = M2 / (count - correction). It is computed
//        in one pass with Welford's update (per vector lane, lanes merged with Chan et al.'s pairwise
//        formula), so it does not lose precision when the mean is large compared with the spread,
//        as the sum-of-squares form does. An empty domain gives mean NaN and M2 0.
//  * Index expressions are sym::Expr over loop variables and the program's size symbols; they are
//    simplified by sym::simplify and are non-negative, so a renderer may print FloorDiv/Mod as C's / and %.
//  * Scalar expressions (SExpr) are immutable trees; every node has a dtype. None is deeper than
//    kMaxExprDepth plus the few nodes one lowering rule adds: lowering realizes a deeper value into a
//    buffer (a chain of 10,000 pointwise ops becomes kernels of about kMaxExprDepth ops each), so
//    every pass may walk an expression recursively whatever the size of the graph. Unary and Binary nodes
//    apply a ScalarOp (loop/scalar_ops.def). Loads of a buffer only
//    read elements a previous step (or an earlier stage of the same outer point) wrote.
//  * Kernels never write a buffer they read (no in-place update), so their loops may run in parallel
//    over the outer domain and vectorize over the innermost index. One exception, made by the
//    scheduler: a reduction may stash its body values into the buffer a later stage of the same kernel
//    writes, and that stage reads each element back just before overwriting it (same outer point,
//    same index), which keeps both properties.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loop/scalar_ops.h"
#include "ops/registry.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace protean::ir {
class Graph;
}
namespace protean::backend {
class Artifact;
}

namespace protean::loop {

// ---- scalar expressions -------------------------------------------------------------------------
enum class SOp : uint8_t {
  Load,    ///< buffer[index]
  Const,   ///< a literal (fval for floats, ival for integers/bool)
  Index,   ///< the integer value of `index` (a sym::Expr over loop vars and size symbols)
  Local,   ///< a named scalar computed by an earlier stage (a reduction result)
  Cast,    ///< args[0] converted to dtype
  Unary,   ///< fn(args[0]) for a unary ScalarOp: exp log sqrt rsqrt ... (loop/scalar_ops.def)
  Binary,  ///< fn(args[0], args[1]) for a binary ScalarOp: add sub mul div max min pow eq ... and or
  Where,   ///< args[0] ? args[1] : args[2]
  Fma,     ///< args[0] * args[1] + args[2] rounded once (f32/f64; only where a decomposition asks for it:
           ///< generated code is compiled with contraction off)
};

struct SNode;
using SExpr = std::shared_ptr<const SNode>;
struct SNode {
  SOp op = SOp::Const;
  DType dtype = DType::F32;
  ScalarOp fn = ScalarOp::add;  ///< Unary/Binary: the function
  std::string name;          ///< Local: the scalar's name
  int buffer = -1;           ///< Load
  sym::Expr index = nullptr; ///< Load, Index
  double fval = 0;           ///< Const (floating)
  int64_t ival = 0;          ///< Const (integral / bool)
  std::vector<SExpr> args;
};

SExpr s_load(int buffer, DType dtype, sym::Expr index);
SExpr s_const(double v, DType dtype);
/// The integer value of `index` converted to `dtype` (a constant when `index` is one).
SExpr s_index(sym::Expr index, DType dtype = DType::I64);
SExpr s_local(const std::string& name, DType dtype);
/// args[0] converted to `dtype` (returns `a` itself when the dtype already matches).
SExpr s_cast(SExpr a, DType dtype);
/// fn(a) for a unary ScalarOp; throws std::invalid_argument for a binary one.
SExpr s_unary(ScalarOp fn, SExpr a, DType dtype);
/// fn(a, b) for a binary ScalarOp; throws std::invalid_argument for a unary one.
SExpr s_binary(ScalarOp fn, SExpr a, SExpr b, DType dtype);
SExpr s_where(SExpr c, SExpr a, SExpr b);
/// a * b + c with one rounding (std::fma), in a's dtype, which must be f32 or f64 (b and c are cast to
/// it). Throws std::invalid_argument for any other dtype.
SExpr s_fma(SExpr a, SExpr b, SExpr c);
/// Depth beyond which lowering realizes a value instead of inlining it into its consumer.
inline constexpr size_t kMaxExprDepth = 128;

/// Number of nodes (shared subtrees counted each time).
size_t s_size(const SExpr& e);
/// Nodes on the longest path from `e` to a leaf (a leaf has depth 1). Iterative, linear in the
/// distinct nodes: safe on any expression, however deep.
size_t s_depth(const SExpr& e);
/// Rewrites every node bottom-up with `f` (f returns nullptr to keep the node).
SExpr s_rewrite(const SExpr& e, const std::function<SExpr(const SExpr&)>& f);
/// Text form: `exp(sub(load(b3, 4096*x0 + r0), acc0))`. `typed` adds the dtype of constants (`1:f32`)
/// and of non-i64 index values (`index(x0):i32`), which the loop text form (to_text) prints so that
/// loop/parse.h can read it back; the untyped form is the key passes and renderers compare
/// expressions by (together with the node's own dtype).
std::string s_text(const SExpr& e, bool typed = false);

// ---- buffers, kernels, programs -----------------------------------------------------------------
enum class BufferKind : uint8_t { Input, Constant, Temp, Output };

struct Buffer {
  int id = 0;
  DType dtype = DType::F32;
  std::vector<sym::Expr> sizes;
  BufferKind kind = BufferKind::Temp;
  int input_index = -1;  ///< Input: which graph input
  Tensor constant;       ///< Constant: the (contiguous) data
  int slot = -1;         ///< Temp: memory slot from buffer planning (buffers sharing a slot never overlap in time)
  bool from_extern = false;  ///< written by an Extern step (the runner takes the extern's tensor)
  /// Temp written by an extern: no memory of its own; the extern writes it into buffer `alias`, a
  /// Temp with static sizes, at element `alias_offset` (contiguous, numel elements), and nothing
  /// else writes that region (schedule.h: "Extern results in place of their copies"). -1: none.
  /// Printed as `into b46[803840]`.
  int alias = -1;
  int64_t alias_offset = 0;
};

enum class StageKind : uint8_t { Pointwise, Reduction };

struct Stage {
  StageKind kind = StageKind::Pointwise;
  std::vector<sym::Expr> inner;   ///< inner domain (loop vars r0, r1, ...)
  SExpr body;
  int out = -1;                   ///< buffer written (-1: a reduction whose result is only used as `local`)
  sym::Expr out_index = nullptr;  ///< element written (over x and r vars)
  std::string reduce_op;          ///< Reduction: sum | prod | max | min | welford
  std::string local;              ///< Reduction: name of the result scalar (welford: the mean)
  int out2 = -1;                  ///< welford: buffer receiving M2 at out_index (-1: not stored)
  std::string local2;             ///< welford: name of the M2 scalar
  /// Reduction: also store every body value to stash[stash_index] (a later stage of the same kernel
  /// writes that element and reads the value back instead of recomputing it; see schedule.h).
  int stash = -1;
  sym::Expr stash_index = nullptr;
};

// ---- schedules: how a target runs a kernel (set by a SchedulePolicy, loop/schedule_policy.h) ----

/// How a reduction stage folds its values. The cpu renderer renders None..Welford; Warp and Block are
/// for a GPU policy (a renderer throws CompileError for a strategy it does not implement).
enum class ReductionStrategy : uint8_t {
  None,          ///< a pointwise stage
  Serial,        ///< one accumulator per thread (cpu: `omp simd reduction(op:acc)`, max/min with a NaN flag)
  VectorMinMax,  ///< f32 max/min in lanes / vector_width vector accumulators plus a NaN mask
  Lanes,         ///< sum/prod over `lanes` accumulator lanes, folded pairwise at the end
  Welford,       ///< welford: each of `lanes` lanes runs Welford's update, lanes merged by Chan et al.
  Warp,          ///< one warp per outer point, combined by register shuffles
  Block,         ///< threads_per_row threads per outer point, combined through shared memory
};
/// Name of a strategy in the loop text form ("lanes", "welford", ...).
const char* strategy_name(ReductionStrategy s);

/// A buffer element the next outer point's first stage will load (an index over inner variables and
/// the outer variables): a stage's prefetch plan lists these.
struct PrefetchLoad {
  int buffer = -1;
  DType dtype = DType::F32;
  sym::Expr index = nullptr;
};

/// The schedule of one stage.
struct StageSchedule {
  ReductionStrategy reduction = ReductionStrategy::None;
  /// The innermost loop runs in the explicit vector form (Schedule::vector_width values per step,
  /// then a scalar tail).
  bool vector = false;
  /// Lanes / Welford / VectorMinMax: scalar lanes of the accumulators (a multiple of vector_width when
  /// `vector`: 64 = four 16-float vectors).
  int lanes = 0;
  /// Pointwise: the innermost loop runs in blocks of this many values (0: one loop); prefetch hints
  /// are issued at the top of each block.
  int block = 0;
  /// Next-outer-point elements this stage prefetches, one hint per cache line per block.
  std::vector<PrefetchLoad> prefetch;
};

/// How a GPU policy maps a kernel onto the grid (GpuForm::None: a cpu schedule).
enum class GpuForm : uint8_t {
  None,         ///< not a GPU schedule
  GridStride,   ///< fused pointwise kernel: a grid-stride loop over the flattened outer domain
  WarpPerRow,   ///< one warp per outer point, rows_per_block rows per block
  BlockPerRow,  ///< one block per outer point
  SingleBlock,  ///< no outer domain: one block runs the whole kernel
};
/// Name of a GPU form in the loop text form ("grid_stride", "block_per_row", ...).
const char* gpu_form_name(GpuForm f);

/// How a target runs one kernel: the iteration domain split into parallel (grid) axes and inner axes,
/// the vector width, each stage's reduction strategy and prefetch plan, and the work threshold below
/// which the kernel runs on one thread. Data only: a SchedulePolicy sets it, a renderer prints it.
struct Schedule {
  std::string target;            ///< the policy that set it ("cpu"); empty: not scheduled yet
  /// Every stage is pointwise without an inner domain: the kernel is one loop nest over the outer
  /// domain whose innermost axis is the vector axis, and the stages share one set of temporaries.
  bool fused_pointwise = false;
  size_t parallel_axes = 0;      ///< leading outer axes distributed over threads (cpu) or the grid (gpu)
  size_t collapse = 0;           ///< cpu: OpenMP collapse(n) over those axes (0: no clause)
  /// Kernels without an outer domain: each stage's first inner loop is its parallel loop.
  bool parallel_inner = false;
  /// fused_pointwise: the innermost outer loop runs in the explicit vector form.
  bool vector = false;
  int vector_width = 0;          ///< values of the explicit vector form (f32 lanes); 0: no vector form
  int vector_bytes = 0;          ///< bytes of one vector (cpu: 64, one AVX-512 register)
  int threads_per_row = 1;       ///< threads cooperating on one outer point (cpu: 1)
  int rows_per_block = 1;        ///< outer points per thread block (gpu); cpu: 1
  /// The stages of one outer point run back to back on one thread, so the row stays in cache (cpu
  /// row kernels); on a GPU: one block keeps its row in registers / shared memory across stages.
  bool rows_persist = false;
  sym::Expr work = nullptr;      ///< work estimate: outer points x the largest inner domain (gpu: the
                                 ///< launch's items: elements for GridStride, rows for the row forms)
  int64_t work_threshold = 0;    ///< run in parallel only when work >= this (0: always)
  // ---- gpu only (a cpu policy leaves them at their defaults) ----
  GpuForm gpu_form = GpuForm::None;
  int block_threads = 0;         ///< threads per block: the kernel's __launch_bounds__
  int min_blocks = 0;            ///< __launch_bounds__' minimum resident blocks per multiprocessor (0: none)
  /// rows_persist: elements of its row each of the row's threads keeps in registers (at scalar
  /// access; the 16-byte variant rounds up to whole vectors)
  int persist_chunks = 0;
  bool index32 = false;          ///< index math in 32-bit ints (the symbols' bounds prove it fits)
  std::vector<StageSchedule> stages;  ///< one per Kernel::stages entry
};

struct Kernel {
  std::string name;               ///< "kernel0", ...
  std::vector<sym::Expr> outer;   ///< outer domain (loop vars x0, x1, ...)
  std::vector<Stage> stages;
  Schedule schedule;              ///< set by apply_schedule (loop/schedule_policy.h); renderers require it
};

/// An extern input read through a strided view of its buffer instead of the whole buffer: element
/// i (a multi-index over `sizes`) is buffer[offset + sum_k i_k * strides[k]]. Lowering makes one
/// where the input is a permute, slice or reshape of a buffer that the op reads strided in place
/// (a GEMM's transposed operand), so no kernel copies it first. Sizes, strides (elements) and the
/// offset are over the program's size symbols.
struct ExternView {
  std::vector<sym::Expr> sizes, strides;
  sym::Expr offset = nullptr;
};

struct Extern {
  ops::OpKind op;
  ops::Attrs attrs;               ///< may mention size symbols (evaluated per run)
  std::vector<int> inputs;        ///< buffer ids (-1 for an absent optional input)
  /// Empty, or one per input: a strided view of the input's buffer (offset set) or the whole buffer
  /// (offset null). Printed as `view(b3, [sizes], [strides], offset)`.
  std::vector<ExternView> views;
  std::vector<int> outputs;       ///< buffer ids
  /// cond: the branch graphs (true, false) from lowering, and their compiled programs (same order),
  /// built by the pipeline with this program's symbols; inputs[0] is the predicate.
  std::vector<std::shared_ptr<const ir::Graph>> subgraphs;
  std::vector<std::shared_ptr<const backend::Artifact>> branches;
  /// The source of the graph node this step was lowered from (SourceLocation::describe(): "model.cpp:12
  /// in f", "onnx node 'gather_3' (Gather)"; "" when unknown), which the step's run-time errors name.
  /// Printed `at="..."` with double quotes and control characters replaced (a cpu plan's key holds every
  /// node's location, so a plan read back from the cache names the graph's own).
  std::string where;
};

struct Step {
  bool is_kernel = true;
  int index = 0;                  ///< into kernels or externs
  std::vector<int> release;       ///< Temp buffers whose last use is this step
};

struct Program {
  std::string name;
  std::vector<Buffer> buffers;
  std::vector<Kernel> kernels;
  std::vector<Extern> externs;
  std::vector<Step> steps;
  std::vector<int> outputs;          ///< buffer id of each graph output
  std::vector<sym::Expr> symbols;    ///< size symbols; kernels receive their values in this order
  int num_slots = 0;                 ///< memory slots after buffer planning
};

/// Loop variable symbols: x<k> (outer) and r<k> (inner).
sym::Expr outer_var(size_t k);
sym::Expr inner_var(size_t k);
/// Row-major linear index of `idx` in a buffer of `sizes`, simplified.
sym::Expr linear_index(const std::vector<sym::Expr>& idx, const std::vector<sym::Expr>& sizes);
/// Simplifies an index expression (loop vars are >= 0, sizes >= 0).
sym::Expr simplify_index(sym::Expr e);

/// Removes stage `stage` of kernel `kernel` (and its schedule entry, when scheduled), and the kernel and
/// its step when no stage is left: the step's buffer releases move to the next step, later kernel
/// indices shift down. For passes that make a stage's work unnecessary (a copy a consumer reads
/// through); the caller keeps buffer lifetimes right (Buffer::slot).
void remove_stage(Program& p, int kernel, int stage);

/// Text dump of the whole program (buffers, steps, kernels with their stages): golden tests and
/// PROTEAN_LOGS=output_code.
std::string to_text(const Program& p);

}  // namespace protean::loop
