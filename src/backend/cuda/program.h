// CudaProgram: what the cuda backend's compile produces and its runtime executes. Plain data (no
// driver calls, no CUDA headers), so tests build, inspect and check one without a GPU.
//
// A compile (backend/cuda/pipeline.h) turns one graph into:
//  * one CUDA C translation unit (`source`) and its cubin (`cubin`, for `key.arch`), with the parts of
//    its artifact-cache key (CubinKey);
//  * per loop kernel, a CudaKernel: two entry points of the same computation (an aligned variant that
//    uses 16-byte accesses, and a general one), its parameter layout, how its grid and block follow
//    from the bound symbol values (LaunchRule), and the rule that picks the variant per launch from
//    the size arguments and buffer addresses (VariantRule). Choosing a variant is never a guard and
//    never a recompile: both variants are always in the cubin;
//  * the buffer plan (BufferPlan): every buffer of the loop program with its symbolic byte size, and
//    the memory slots temporaries share (sized per call by the largest member, aligned to 256 bytes);
//  * the steps in program order: a generated kernel, a BLAS call (matmul / linear / bmm / addmm, for
//    cuBLASLt, with its epilogue), a convolution (conv2d, for cuDNN) or a host step (an op with no GPU lowering runs its eager CPU kernel
//    on host copies of its inputs; the compile logs it under `perf_hints`).
//
// Sizes: every size is a sym::Expr over `symbols` (the backend's size arguments, BackendInput::symbols
// first, then the symbols the graph defines); eval_size() computes one from the bound values. Kernels
// receive the symbol values they use as int64 arguments (see KernelParam), so one cubin serves every
// size.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loop/loop_ir.h"
#include "ops/registry.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace protean::backend::cuda {

// ---- kernel parameters ---------------------------------------------------------------------------

/// What one kernel parameter carries.
enum class ParamKind : uint8_t {
  Buffer,  ///< a device pointer to the first element of buffer `index` (BufferPlan::buffers[index])
  Symbol,  ///< the int64 value of CudaProgram::symbols[index]
  /// A device pointer to the call's symbol values (int64 each, in CudaProgram::symbols order; `index`
  /// is -1): the kernel reads its sizes from memory (codegen.h: SizeArgs::FromMemory) and tolerates a
  /// grid larger than its launch rule gives (the extra blocks return at once).
  Sizes,
};

/// One kernel parameter. Every parameter is 8 bytes (a pointer or an int64_t) at `offset` in the
/// kernel's argument block, in declaration order: the block can be prebuilt once per launch site and
/// passed with CU_LAUNCH_PARAM_BUFFER_POINTER, or its fields' addresses as cuLaunchKernel's
/// kernelParams.
struct KernelParam {
  ParamKind kind = ParamKind::Buffer;
  int index = 0;        ///< buffer id (Buffer) or symbol index (Symbol)
  uint32_t offset = 0;  ///< byte offset in the argument block
  uint32_t size = 8;    ///< bytes (always 8)
};

// ---- launch geometry -----------------------------------------------------------------------------

/// How a kernel maps its loop nest onto threads (chosen by the cuda schedule policy,
/// loop/schedule_cuda.h).
enum class LaunchShape : uint8_t {
  GridStride,   ///< pointwise: a grid-stride loop over `work` items; blocks = min(ceil(work / (threads
                ///< * items_per_thread)), max_blocks), at least 1
  BlockPerRow,  ///< row kernel: one block of `block_threads` threads per row; blocks = work (rows)
  WarpPerRow,   ///< row kernel: one warp per row, block_threads / 32 rows per block;
                ///< blocks = ceil(work / rows_per_block)
  Single,       ///< one block of block_threads (a kernel with no outer domain: a full reduction)
};

/// The launch rule of one kernel variant: grid and block from the symbol values.
struct LaunchRule {
  LaunchShape shape = LaunchShape::GridStride;
  sym::Expr work{};               ///< GridStride: elements; *PerRow: rows (product of the outer domain)
  int block_threads = 256;        ///< threads per block: also the kernel's __launch_bounds__
  int items_per_thread = 1;       ///< GridStride: elements one thread handles per loop step (vector width)
  int rows_per_block = 1;         ///< WarpPerRow: block_threads / 32; else 1
  int64_t max_blocks = 1 << 16;   ///< GridStride: cap on the grid (the loop covers the rest)
  uint32_t shared_bytes = 0;      ///< dynamic shared memory per block (static shared memory is in the cubin)
  /// Row kernels that keep the row in registers (loop/schedule_cuda.h: rows_persist): the row's length
  /// and the most elements the registers hold. Compiled from an upper bound the guards keep; a launch
  /// with a longer row is refused by launch_dims (ShapeError), never run short.
  sym::Expr row_length{};  ///< null without a row kept in registers
  int64_t row_capacity = 0;
  /// BlockPerRow kernels whose row stays in registers and whose code strides by blockDim.x: the
  /// launch uses the fewest threads (a power of two from 32 up to block_threads) that hold this
  /// launch's row at row_capacity / block_threads elements each, so a row shorter than its bound
  /// (dynamic sizes) runs like a kernel compiled for its length.
  bool block_from_row = false;
  /// BlockPerRow only (mode "max-autotune", a split variant, TuneVariant::split): each row is reduced by
  /// this many blocks, one thread-block cluster of `cluster` blocks along x (the entry declares
  /// `__cluster_dims__(cluster, 1, 1)`, sm_90+): blocks = work * cluster, and a row kept in registers
  /// holds row_capacity / cluster elements per block.
  int cluster = 1;
  /// WarpPerRow only: when > 0, a launch whose grid would have fewer than this many blocks takes fewer
  /// rows per block (halving from rows_per_block down to 1, block = 32 x rows) until it has at least
  /// this many or a row each; the kernel text derives its rows per block from blockDim.x, so any of
  /// them runs it. The cuda pipeline sets it to the multiprocessors of the target
  /// (CudaScheduleOptions::warp_fill_blocks): 448 rows at 4 a block leave 20 of an H100's 132 idle.
  /// 0 keeps rows_per_block at every size (max-autotune's candidate variants, which the tuner times).
  int64_t fill_blocks = 0;

  /// Every field alike (sym::Expr compares hash-consed nodes): a field added later joins the comparison.
  friend bool operator==(const LaunchRule&, const LaunchRule&) = default;
};

/// A launch's dimensions (x only: every generated kernel is one-dimensional).
struct LaunchDims {
  uint32_t grid = 1;
  uint32_t block = 1;
  uint32_t shared_bytes = 0;
  uint32_t cluster = 1;  ///< blocks per thread-block cluster (x), fixed by the entry (LaunchRule::cluster)
};

/// Grid and block for `rule` at `symbol_values` (indexed like CudaProgram::symbols). A zero-sized
/// work gives grid 0 (the runtime skips the launch). Throws ShapeError when the grid would exceed
/// 2^31 - 1 blocks (row kernels over more rows than that) and when a row kept in registers is longer
/// than the kernel holds (`row_capacity`).
LaunchDims launch_dims(const LaunchRule& rule, const std::vector<sym::Expr>& symbols,
                       std::span<const int64_t> symbol_values);
/// The same from the rule's evaluated sizes: `work` (rule.work's value, 1 without one) and
/// `row_length` (rule.row_length's value, ignored without one). Callers that evaluate the sizes of many
/// launches at once (graphs.h: one table per new size) use it. Throws as above.
LaunchDims launch_dims_at(const LaunchRule& rule, int64_t work, int64_t row_length);

// ---- variants ------------------------------------------------------------------------------------

/// When the aligned variant may run: every expression in `divisible` (sizes whose multiples the
/// aligned code steps by: the innermost extent of each vector access, row lengths) is a multiple of
/// `multiple` at the bound symbol values, and every buffer in `aligned_buffers` starts at a 16-byte
/// aligned address. Otherwise the general variant runs (same results, scalar accesses). Mirrors the
/// two-variant dispatch Inductor adds for dynamic sizes (tt.divisibility=16 on size arguments), chosen
/// per launch instead of guarded.
struct VariantRule {
  std::vector<sym::Expr> divisible;
  int64_t multiple = 1;
  std::vector<int> aligned_buffers;  ///< buffer ids
  /// When set, the aligned variant also needs `size` >= `at_least` (the attention kernel's Hopper form
  /// takes long query lengths only; shorter ones run the general entry).
  sym::Expr size = nullptr;
  int64_t at_least = 0;
};

/// The ptxas resource report of one entry point (`-Xptxas -v`, parsed by parse_ptxas_info in nvrtc.h).
struct PtxasInfo {
  bool present = false;     ///< false when the log had no line for this entry
  int registers = 0;        ///< registers per thread
  int spill_stores = 0;     ///< bytes of spill stores
  int spill_loads = 0;      ///< bytes of spill loads
  int stack_bytes = 0;      ///< stack frame bytes (local memory per thread)
  int shared_bytes = 0;     ///< static shared memory per block
  int constant_bytes = 0;   ///< cmem[0] bytes (parameters)
};

/// One entry point in the cubin.
struct KernelVariant {
  std::string entry;  ///< extern "C" name in the cubin ("kernel3_aligned", "kernel3_general")
  LaunchRule launch;
  PtxasInfo resources;
};

/// mode "max-autotune" (autotune.h): one candidate variant of a row kernel, the same computation
/// rendered with other compiled-in parameters (rows per block of a warp-per-row kernel, vector width of
/// the 16-bit or f32 accesses), its entry in CudaProgram::tune_source. It takes the kernel's parameters
/// and replaces the kernel's aligned entry (or its only one) where its own rule holds; candidate 0 of
/// the site is the kernel's own entry.
struct TuneVariant {
  int rows_per_block = 1;  ///< rows of one block (warp per row: block = 32 x rows); 1 for a block per row
  int vector_width = 1;    ///< elements per vector access
  /// Blocks that share one row (a block per row only; codegen.h: tune_candidates): 1, or 2 / 4 blocks
  /// of a thread-block cluster (sm_90+) that each reduce a slice of the row and exchange their partial
  /// statistics through distributed shared memory. The entry then exists only in cubins for sm_90 and
  /// newer; the runtime never loads it on an older device.
  int split = 1;
  KernelVariant variant;   ///< its entry and launch rule
  VariantRule rule;        ///< when it may run: sizes multiples of vector_width, buffers 16-byte aligned
  /// Short text naming it in tuning keys and logs: "r2v4" (2 rows per block, vectors of 4), "r1v8s4"
  /// (a row split over a cluster of 4 blocks).
  std::string tag() const;
};

/// One generated kernel (a loop::Kernel) with both variants. When the schedule found nothing to
/// vectorize, `aligned` and `general` name the same entry and `rule.divisible` is empty.
struct CudaKernel {
  std::string name;                 ///< the loop kernel's name ("kernel3")
  KernelVariant aligned, general;
  VariantRule rule;
  std::vector<KernelParam> params;  ///< both variants take the same parameters
  uint32_t arg_block_bytes = 0;     ///< size of the argument block (8 per parameter)
  /// Both entries start by waiting for the grids ahead of them (codegen.h: kWaitPriorGrids), so the
  /// runtime may launch the kernel programmatically (it starts while the kernel ahead finishes). Set
  /// by the compile from the source text; false for kernels built any other way.
  bool waits_for_prior_grids = false;
  /// max-autotune only: the candidate variants tuned per size bucket (empty: not tunable, or another
  /// mode). Entries in CudaProgram::tune_source.
  std::vector<TuneVariant> tune;
};

/// Whether `k` reads its sizes from memory (a ParamKind::Sizes parameter): its arguments do not change
/// with the sizes, and it may be launched over a larger grid than its launch rule gives at them.
bool sizes_from_memory(const CudaKernel& k);

/// The 8 bytes parameter `a` carries at a launch: buffer `a.index`'s device address
/// (`address(id)`), symbol `a.index`'s value in `symbol_values`, or `sizes_address` (where the call's
/// symbol values are in device memory).
template <class Address>
uint64_t param_value(const KernelParam& a, const Address& address, std::span<const int64_t> symbol_values,
                     uint64_t sizes_address) {
  switch (a.kind) {
    case ParamKind::Buffer: return address(a.index);
    case ParamKind::Symbol: return static_cast<uint64_t>(symbol_values[static_cast<size_t>(a.index)]);
    case ParamKind::Sizes: return sizes_address;
  }
  return 0;
}

/// The size part of VariantRule: `k` has two entries, its divisible sizes are multiples of `multiple`
/// and its bounded size (if any) is at least `at_least` at these symbol values. ShapeError as
/// eval_size.
bool sizes_allow_aligned_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                                 std::span<const int64_t> symbol_values);
/// True when `k`'s aligned variant may run at these symbol values, `buffer_address(id)` giving the
/// device address of each buffer (VariantRule).
bool use_aligned_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                         std::span<const int64_t> symbol_values, const std::function<uint64_t(int)>& buffer_address);
/// The variant to launch (aligned when use_aligned_variant, else general).
const KernelVariant& select_variant(const CudaKernel& k, const std::vector<sym::Expr>& symbols,
                                    std::span<const int64_t> symbol_values,
                                    const std::function<uint64_t(int)>& buffer_address);

// ---- buffers -------------------------------------------------------------------------------------

/// Alignment of every buffer the runtime allocates (slots, outputs): 256 bytes, which makes every
/// 16-byte access of an aligned variant legal whatever the element offset of a row.
inline constexpr int64_t kBufferAlignment = 256;

/// One buffer of the program (ids are loop::Program buffer ids).
struct PlannedBuffer {
  int id = 0;
  DType dtype = DType::F32;
  std::vector<sym::Expr> sizes;        ///< dense, row-major
  sym::Expr bytes{};                   ///< numel * itemsize
  loop::BufferKind kind = loop::BufferKind::Temp;
  int input_index = -1;                ///< Input: which graph input (a contiguous device tensor)
  int output_index = -1;               ///< Output: the first graph output it is (see BufferPlan::outputs)
  int slot = -1;                       ///< Temp: its memory slot
  Tensor constant;                     ///< Constant: the host data to upload once at load time
  bool from_extern = false;            ///< written by a BLAS or host step (which produce its tensor)
  /// Constant computed from other constants by the compile (a LayerNormPrologue's weight and
  /// vectors): derive_prologue_constants makes it again from the plan instead of storing its bytes.
  bool derived = false;
};

/// Memory of the temporaries: slots sized at run time by their largest member.
struct Slot {
  sym::Expr bytes{};                      ///< max over the members' byte sizes
  int64_t alignment = kBufferAlignment;
  std::vector<int> members;               ///< buffer ids
};

struct BufferPlan {
  std::vector<PlannedBuffer> buffers;  ///< indexed by buffer id
  std::vector<Slot> slots;
  std::vector<int> outputs;            ///< buffer id of each graph output, in order
};

// ---- externs -------------------------------------------------------------------------------------

/// The library matrix products a BLAS step mirrors (PyTorch's torch.matmul 2-D / batched cases,
/// F.linear, torch.bmm, torch.addmm).
enum class BlasOp : uint8_t { Matmul, Linear, Bmm, Addmm };

/// GELU in the epilogue: none, the exact erf form (gelu(approximate="none")) or the tanh form.
enum class GeluForm : uint8_t { None, Erf, Tanh };

/// What cuBLASLt applies to the product before the store: out = gelu(alpha * A·B + bias) + beta * C.
struct BlasEpilogue {
  int bias = -1;            ///< buffer of N values broadcast over rows (linear's bias, addmm's input) or -1
  GeluForm gelu = GeluForm::None;
  int residual = -1;        ///< buffer C added with beta = 1 (a residual add folded into the call) or -1
  double alpha = 1.0;
  double beta = 0.0;        ///< 1 when residual >= 0
};

/// One matrix product for cuBLASLt, f32 accumulation: out[batch, m, n] = a[batch, m, k] · b[batch, k, n]
/// (Linear: b is weight[n, k], used transposed). Sizes are expressions of the symbols; batch is 1 for
/// 2-D products, and a batch stride of 0 broadcasts an operand.
/// A LayerNorm over the product's depth folded into a BLAS step (pipeline.h:
/// fold_layer_norm_prologues): `a` = layer_norm(x)[m, k] in bf16, computed by the kernel at step
/// `kernel_step`, whose only reader is the product. With gamma folded into the weight (W'[k, n] =
/// bf16(gamma[k] * W[k, n]), in b's layout) and beta into a column vector,
///   layer_norm(x) · W = rstd[m] * (x · W' - mean[m] * colsum(W')) + beta · W,
/// so a generated product (hopper_gemm.h) reads x instead of `a`, takes each row's mean and variance
/// from the tiles of x it streams through shared memory anyway, and applies the rest in its epilogue;
/// the LayerNorm kernel is then not launched. Where the product runs on cuBLASLt (more rows, another
/// device, a tuned algorithm) the kernel runs and the product reads `a`: both forms stay in the plan.
struct LayerNormPrologue {
  int kernel_step = -1;    ///< index into CudaProgram::steps of the LayerNorm kernel that writes `a`
  int x = -1;              ///< buffer the LayerNorm normalizes: bf16, m rows of k (dense)
  int gamma = -1, beta = -1;  ///< its constants: k values each (f32 or bf16)
  int weight = -1;         ///< derived constant: b with gamma folded in (bf16, b's sizes)
  int vectors = -1;        ///< derived constant: f32 [2, n]: colsum(W') (as rounded), then beta · W
  double eps = 1e-5;       ///< added to the biased variance
};

struct BlasStep {
  BlasOp op = BlasOp::Matmul;
  ops::OpKind kind = ops::OpKind::matmul;  ///< the graph op it came from
  int a = -1, b = -1, out = -1;            ///< buffer ids
  DType dtype = DType::F32;                ///< of a, b and out (bf16, f16, f32)
  bool transpose_b = false;                ///< Linear: b is [n, k]
  sym::Expr batch{}, m{}, n{}, k{};
  sym::Expr batch_stride_a{}, batch_stride_b{};  ///< elements; 0 = broadcast
  BlasEpilogue epilogue;
  LayerNormPrologue prologue;  ///< kernel_step < 0: none
  bool has_prologue() const { return prologue.kernel_step >= 0; }
};

/// An op with no GPU lowering: its eager kernel runs on host copies of its inputs and its outputs are
/// copied back (a cond runs its taken branch's graph the same way).
struct HostStep {
  loop::Extern ext;
  std::string reason;  ///< why it is not on the GPU (for the perf_hints log line)
};

/// One 2-D convolution for cuDNN (dnn.h): torch.nn.functional.conv2d on dense NCHW buffers, out =
/// conv(x, w) + bias, or conv_transpose2d (`kind`; w is [C, O/groups, KH, KW], cuDNN's backward-data
/// convolution). Sizes are expressions of the symbols; the parameters are per spatial dim (H, W).
struct ConvStep {
  ops::OpKind kind = ops::OpKind::conv2d;  ///< the graph op it came from
  int x = -1, w = -1, bias = -1, out = -1;  ///< buffer ids (bias -1: none)
  DType dtype = DType::F32;                 ///< of x, w, bias and out (f32, bf16, f16)
  std::vector<sym::Expr> x_sizes, w_sizes, out_sizes;  ///< [N, C, H, W], [O, C/groups, KH, KW], [N, O, OH, OW]
  std::array<int64_t, 2> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::array<int64_t, 2> output_padding{0, 0};  ///< conv_transpose2d only
  int64_t groups = 1;
  bool transposed() const { return kind == ops::OpKind::conv_transpose2d; }
};
enum class StepKind : uint8_t { Kernel, Blas, Host, Conv };

struct Step {
  StepKind kind = StepKind::Kernel;
  int index = 0;               ///< into kernels, blas, host or conv
  std::vector<int> release;    ///< Temp buffers whose last use this step is
  /// A kernel that is BLAS step `prologue_of`'s LayerNormPrologue: not launched where that product
  /// runs as a generated product (layer_norm_folded), which then computes it. -1: none.
  int prologue_of = -1;
};

// ---- the program ---------------------------------------------------------------------------------

/// The parts of a cubin's artifact-cache key.
struct CubinKey {
  uint64_t source_hash = 0;      ///< xxhash64 of the translation unit
  std::string nvrtc_version;     ///< "13.0"
  std::string arch;              ///< "sm_90"
  std::string flags;             ///< NVRTC options, space-separated
  std::string protean_version;
  /// One 64-bit hash of all parts (the artifact cache's key).
  uint64_t combined() const;
};

struct CudaProgram {
  std::string name;
  std::string source;                ///< the CUDA C translation unit
  std::vector<uint8_t> cubin;        ///< empty when there are no kernels
  CubinKey key;
  std::string compile_log;           ///< NVRTC's log (ptxas -v lines included)
  std::vector<sym::Expr> symbols;    ///< symbol values come in this order
  BufferPlan buffers;
  std::vector<CudaKernel> kernels;
  std::vector<BlasStep> blas;
  std::vector<HostStep> host;
  std::vector<ConvStep> conv;        ///< cuDNN convolutions (StepKind::Conv)
  std::vector<Step> steps;           ///< program order
  /// max-autotune only: the translation unit of every kernel's TuneVariant entries (the prelude, then
  /// the entries), compiled by NVRTC when a bucket first needs one (graphs.h), never in other modes.
  /// Empty when no kernel has candidates.
  std::string tune_source;
  /// The cubin of tune_source when it was compiled with the program (CudaCompileOptions::compile, or
  /// tests); empty otherwise (the graph runner compiles it, through the artifact cache).
  std::vector<uint8_t> tune_cubin;
};

/// The value of size expression `e` with `symbols[i]` bound to `symbol_values[i]`. Throws ShapeError
/// naming the symbol when `e` uses one that is not in `symbols`.
int64_t eval_size(const sym::Expr& e, const std::vector<sym::Expr>& symbols, std::span<const int64_t> symbol_values);

/// Computes the derived constants of every BLAS step's LayerNormPrologue (its folded weight and
/// vectors, PlannedBuffer::derived) from the weight, gamma and beta constants: after a compile folds
/// a LayerNorm, and after a plan read from the program cache (which stores the recipe, not the
/// bytes). Host arithmetic: W' = bf16(gamma[k] * W[k, n]), colsum summed in f64 over the rounded W',
/// beta · W in f64; both rounded to f32 once. Throws CompileError when a named buffer is not a loaded
/// constant or the sizes disagree.
void derive_prologue_constants(CudaProgram& p);

/// Text form of the program's plan (steps, launch rules, variants, buffers): logs and golden tests.
std::string to_text(const CudaProgram& p);

}  // namespace protean::backend::cuda
