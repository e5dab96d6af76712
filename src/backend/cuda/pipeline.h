// The cuda backend's compile pipeline, one straight line (pipeline.cpp):
//   fuse_attention_patterns (backend/attention_pattern.h, on the backend's copy of the graph) →
//   lower_graph → schedule_program (fusion, buffer planning: the shared loop stage) →
//   apply_schedule(CudaSchedulePolicy) (loop/schedule_cuda.h; symbol bounds from BackendInput::upper_bounds)
//   → render_cuda (one translation unit, codegen.h) →
//   nvrtc_compile (nvrtc.h) → CudaProgram (program.h)
// Each step is a phase of one observe::PhaseTimer (names "cuda lowering", "cuda scheduling",
// "cuda schedule policy", "cuda codegen", "cuda nvrtc"). Under PROTEAN_LOGS=output_code the loop IR
// after scheduling, each kernel's CUDA schedule and the CUDA C are logged; each op that stays on the
// host is logged under perf_hints with the reason.
//
// Pointwise kernels of the form (product + bias) + residual or gelu_tanh(product + bias) after a matrix
// product fold into its epilogue (fold_blas_epilogues, phase "cuda epilogue folding"); the copies
// around an attention extern fold into its kernel (fold_attention_views, attention.h, phase "cuda
// attention views"), and a lookup reads its indices where they are (fold_index_copies, phase "cuda
// index copies").
// Externs become BLAS steps (matmul / linear / bmm in f32, bf16 or f16 with a shape cuBLASLt takes:
// 2-D, a batched left operand flattened into rows, or equal/broadcast batches) or host steps
// (everything else: its eager kernel runs on host copies). No GPU is needed: the result is data.
#pragma once

#include <map>
#include <string>

#include "backend/cuda/nvrtc.h"
#include "backend/cuda/program.h"
#include "backend/registry.h"
#include "loop/schedule.h"
#include "loop/schedule_cuda.h"
#include "observe/phase_timer.h"

namespace protean::backend::cuda {

struct CudaCompileOptions {
  NvrtcOptions nvrtc;                  ///< architecture (sm_90 by default) and extra NVRTC options
  /// grid cap, and symbol upper bounds beside BackendInput::upper_bounds (the tighter of the two wins)
  loop::CudaScheduleOptions schedule;
  bool compile = true;                 ///< false: stop after rendering (no NVRTC; cubin and key stay empty)
  /// Kernels whose CUDA C is equal up to their names and buffer parameter names are compiled once
  /// (transformer layers repeat theirs); PROTEAN_CUDA_KERNEL_DEDUP=0 turns it off as well.
  bool dedup_kernels = true;
  /// Kernels whose every output is bf16 or f16 use approximate f32 exp and normal_cdf (codegen.h:
  /// render_cuda); PROTEAN_CUDA_APPROX_MATH=0 turns it off as well.
  bool approx_math = true;
  /// Attention as one kernel (attention.h): matmul-softmax-matmul patterns become
  /// scaled_dot_product_attention (backend/attention_pattern.h), and bf16/f16 attention lowers to the
  /// fused kernel instead of two products and a softmax. PROTEAN_CUDA_FUSED_ATTENTION=0 turns it off.
  bool fused_attention = true;
  /// In modes "reduce-overhead" and "max-autotune" (CUDA graphs), the loop kernels, the attention
  /// kernel and index_select / embedding read their sizes from device memory (codegen.h: SizeArgs::FromMemory), so a graph node
  /// keeps its arguments and grid at every size of its bucket and a new size inside a recorded bucket
  /// patches no such node (graphs.h). PROTEAN_CUDA_SIZES_IN_MEMORY=0 turns it off as well (sizes by
  /// value, the nodes patched at each new size). Other modes always pass sizes by value.
  bool sizes_in_memory = true;
};

struct CudaCompileInfo {
  observe::PhaseTimer phases;
  loop::ScheduleStats schedule;        ///< fusions, stashes, slots (loop/schedule.h)
  std::string loop_ir;                 ///< loop IR text after scheduling (when `info` was passed or the
                                       ///< output_code log is on; else empty)
  std::string nvrtc_log;
  double nvrtc_ms = 0;
  int kernels = 0, blas = 0, host = 0, conv = 0;  ///< steps of each kind (conv: cuDNN, dnn.h)
  int folded_epilogues = 0;            ///< pointwise kernels folded into a BLAS step's epilogue
  int folded_layer_norms = 0;          ///< LayerNorm kernels a generated product may compute (fold_layer_norm_prologues)
  int deduplicated = 0;                ///< kernels that launch an equal earlier kernel's entry points
  int64_t fused_attention = 0;         ///< matmul-softmax-matmul patterns that became one attention
  int attention_views = 0;             ///< attention operands read in place instead of through a copy
  int index_copies = 0;                ///< lookups' index copies removed (fold_index_copies)
  int tune_variants = 0;               ///< max-autotune: candidate variants of row kernels (CudaKernel::tune)
};

/// Compiles `in.graph` into a CudaProgram. Throws CompileError when a size argument is not a symbol,
/// when NVRTC is absent (and `o.compile`) and NvrtcCompileError when the generated code does not
/// compile (a defect of the renderer: the message names the kernel). With `in.mode` "max-autotune"
/// the row kernels also get their candidate variants (codegen.h: render_tune_variants, unless
/// PROTEAN_AUTOTUNE_VARIANTS=0): CudaKernel::tune and CudaProgram::tune_source, compiled into
/// tune_cubin (with their ptxas reports) only when `o.compile`; other modes render exactly as before.
CudaProgram compile_cuda_program(const BackendInput& in, const CudaCompileOptions& o = {}, CudaCompileInfo* info = nullptr);

/// Folds the pointwise kernel right after a matrix product into the product's cuBLASLt epilogue when
/// that kernel is `(product [+ bias]) [+ residual]` over the product's shape (bias a vector over the
/// last dimension; residual a tensor of the product's shape added with beta = 1) and nothing else
/// reads the product: the extern then writes the kernel's output and the kernel is removed. Returns
/// the epilogue per extern index. A linear keeps its own bias (a residual folds onto it). The matcher
/// folds gelu's tanh form (`gelu(approximate="tanh")`, transformers' gelu_new; constants literal or
/// one-element constant buffers) into cuBLASLt's GELU epilogue, not with a residual. It recognizes
/// gelu's erf form `x * Phi(x)` too, but does not fold it: cuBLASLt's GELU epilogue is the tanh form
/// (a different function), so such a kernel stays. The same holds for the first stage of a row kernel
/// right after the product (a residual stream stored by its LayerNorm's kernel, loop/schedule.h) when
/// that stage runs over the product's elements (dims of extent 1 aside) and the later stages do not
/// read the product: the product then writes the stream, the stage goes, and the LayerNorm's stages
/// read what the product wrote. Run after schedule_program.
std::map<int, BlasEpilogue> fold_blas_epilogues(loop::Program& p);

/// Removes the copy of a lookup's indices into a buffer of their own: index_select's index and
/// embedding's indices are read by position only (their count is the product of their sizes), so where
/// that operand is a temp written by one pointwise stage `load(src, i) -> x[i]` that copies src's
/// elements in order (a reshape of a program input: ONNX Gather's [1, L] token ids flattened to [L] for
/// index_select), read by nothing else, of src's dtype and element count, the lookup reads src and the
/// stage (and its kernel, when it was the only stage) goes. Only where the lookup's kernel takes src
/// (index_select_kernel's rule), never for a host step, whose eager op checks the index's rank. src
/// leaves its memory slot (its life now reaches the lookup). Run after schedule_program. Returns how
/// many copies went.
int fold_index_copies(loop::Program& p);

/// Marks every LayerNorm kernel whose only reader is a matrix product that a generated product
/// (hopper_gemm.h) can compute it in: BlasStep::prologue and Step::prologue_of (program.h:
/// LayerNormPrologue), with the folded weight and vectors as new derived constant buffers (computed
/// by derive_prologue_constants). Taken: a kernel of exactly two stages over rows of k, a Welford
/// reduction of f32(x) (nothing stored) then bf16((x - mean) * rsqrt(M2 / k + eps) * gamma + beta)
/// into the product's left operand (the decomposition of layer_norm, loop/decompose.cpp), x bf16
/// with the output's layout, gamma and beta constants of k values; the product bf16, batch 1, its
/// weight a 2-D constant, n a multiple of 256 (the generated product shares the row statistics over
/// clusters of 4 column tiles), k a multiple of 64 up to 1024, m not a constant above
/// generated_product_max_rows(), no GELU and residual together. `x` leaves its memory slot when its
/// last read was the kernel (the product reads it now). Only for compute capability 9.0 targets
/// (`arch` "sm_90" or "sm_90a", where generated products run), with PROTEAN_CUDA_GENERATED_PRODUCTS
/// and PROTEAN_CUDA_FOLD_LAYER_NORM not "0". Returns how many it marked. Run on the assembled
/// program; the loop program gives the kernels' stages.
int fold_layer_norm_prologues(const loop::Program& p, CudaProgram& cp, const std::string& arch);

/// Appends one Symbol parameter (and a `long long NAME` to `sig`) per program symbol `exprs` use, in
/// order of first use, then lays out the 8-byte argument block. With `loads` (codegen.h:
/// SizeArgs::FromMemory) one Sizes parameter instead (`const long long* __restrict__ pt_sizes`), and
/// `loads` gets a `const long long NAME = pt_sizes[i];` line per symbol, for the caller to put first in
/// its entries' bodies (before kWaitPriorGrids). False (with `why`) when a symbol is not a program
/// symbol. For the extern kernels the pipeline renders (index_select, cumsum, attention).
bool add_symbol_params(const loop::Program& p, const std::vector<sym::Expr>& exprs, CudaKernel& k,
                       std::vector<std::string>& sig, std::string& why, std::string* loads = nullptr);

/// The BLAS step an extern becomes, or nullopt when it stays on the host (`why` says why).
std::optional<BlasStep> blas_step(const loop::Program& p, const loop::Extern& e, std::string& why);

}  // namespace protean::backend::cuda
