// Generated products on Hopper (sm_90): a bf16 GEMM with TMA and warp-group MMA that waits on
// programmatic edges, for the short matrix products where cuBLASLt's kernels, which cannot wait
// on such an edge, lose their launch to the kernel ahead of them.
//
// What it computes: a BlasStep (program.h) of batch 1 in bf16, out[m, n] = act(a[m, k] · b + bias)
// (+ residual), f32 accumulation, where b is [k, n] (Matmul / Addmm: read N-major, as the model
// stores it) or [n, k] (Linear: read K-major), act none or GELU's tanh form (cuBLASLt's GELU
// epilogue), a residual added in f32 before the one rounding to bf16, as cuBLASLt's beta = 1 does.
// Tiles of 64 rows x 64 columns (K split over a cluster of 4 blocks where it is deeper than 1024 or
// the product has at most 16 column tiles: each block adds up a quarter of the tile's rows from the
// four blocks' f32 accumulators through distributed shared memory and runs the epilogue on them), K
// in steps of 64 through 8 stages of shared memory (128 KB): TMA loads with the 128-byte swizzle, one producer warp group that issues them through full / empty
// mbarriers, one consumer warp group issuing wgmma.mma_async m64n64k16. The weights' first stages
// are requested *before* griddepcontrol.wait (they do not depend on the kernel ahead) and the
// activations after it; griddepcontrol.launch_dependents follows the main loop. The tile is stored
// through shared memory in 16-byte pieces. Measured against cuBLASLt on GPT-2 small's shapes in
// bench/gpu/wgmma_probe.cu (docs/graphs.md, "The Hopper form of that probe"): faster in a chain
// behind a row kernel up to 128 rows, level or slower above; so the eligibility rule below keeps it
// to short products.
//
// A LayerNorm folded in (program.h: LayerNormPrologue; pipeline.h: fold_layer_norm_prologues): the
// product reads the LayerNorm's input x instead of its output and a copy of the weight with gamma
// folded in; each block's consumer threads sum their rows' values and squares from the A tiles as
// they pass through shared memory (shifted by the row's first element), the 4 blocks of a cluster
// (column tiles of the same 64 rows, n a multiple of 256) each summing 16 of the rows and exchanging
// mean and rstd through distributed shared memory; the epilogue applies rstd * (acc - mean *
// colsum(W')) + beta · W before the bias and the activation. Where it runs, the LayerNorm kernel is
// not launched (layer_norm_folded). Measured in GPT-2 on an H100 (docs/graphs.md): FC1 with its
// LayerNorm folded takes about 1 us less than the LayerNorm kernel and the product; QKV, whose
// LayerNorm follows FC2's cuBLASLt call, would take about 0.5 us more (no programmatic edge to start
// its weights early), so a bucket's graph keeps that LayerNorm kernel (graphs.h).
//
// The kernels are compiled by NVRTC for sm_90a once per process (kept in the artifact cache as
// "cubins"), on the first eligible call; their cubin runs only on compute capability 9.0.
//
// On by default; PROTEAN_CUDA_GENERATED_PRODUCTS=0 keeps every product on cuBLASLt. On an H100 they
// match cuBLASLt and a float64 reference (CudaGpu.GeneratedProductsMatchCublasLtAndFloat64, and every
// row of GPT-2's QKV shape up to 512 rows: CudaGpu.GeneratedProductsOverManyTilesMatchCublasLtInEveryRow),
// replayed graphs equal plain launches bit for bit (CudaGpuGraphs.*), and GPT-2 keeps its accuracy.
// A stage of the ring is released once each of the four consumer warps has waited for its own part of
// the warp-group MMAs (wgmma.wait_group covers the executing warp): released by one warp, a stage
// could be refilled while another warp's part still read it, which showed as wrong rows from the
// third row tile on (docs/graphs.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend/cuda/blas.h"
#include "backend/cuda/program.h"
#include "device/driver.h"

namespace protean::backend::cuda {

/// The most rows a product may have to run as a generated product
/// (PROTEAN_CUDA_GENERATED_PRODUCT_ROWS, default 128; 0 turns generated products off).
int64_t generated_product_max_rows();

/// The step's part of the rule below (no device, driver or address looked at): bf16, batch 1, alpha
/// 1, no erf GELU, not GELU and a residual together (beta 1 with a residual), 1 <= m <=
/// generated_product_max_rows(), n a multiple of 64, and k a multiple of 64 up to 1024 or, split over
/// a cluster of 4 blocks that each take a quarter of it, a multiple of 256 up to 4096 (GPT-2's FC2, k =
/// 3072, where one block per 64-column tile leaves 12 blocks for 132 multiprocessors). A k of 1024 or
/// less that is a multiple of 256 is split too where n is at most 16 tiles (GPT-2's output projection).
/// PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K: 2 (the default) both, 1 the deep k only, 0 neither (a deep k
/// then stays on cuBLASLt). In GPT-2 small under reduce-overhead on an H100 (docs/graphs.md) the splits
/// took the call at 37-128 tokens from 0.362-0.390 ms to 0.326-0.356 ms: FC2 and the output projection
/// became kernel nodes that wait on programmatic edges, cuBLASLt's split-K reduction kernel went, and
/// the LayerNorm after FC2 folds into the QKV product. With a
/// LayerNorm prologue (program.h) also: n a multiple of 256, k not split, PROTEAN_CUDA_FOLD_LAYER_NORM
/// not "0" (fold_layer_norm_prologues asks this rule before it marks one).
bool generated_product_fits(const BlasStep& step, const BlasShape& shape);

/// Whether a generated product of `step` at `shape` runs split over a cluster (the rule above; only
/// meaningful where generated_product_fits holds). Never throws.
bool generated_product_split(const BlasStep& step, const BlasShape& shape);

/// Whether run_blas_at runs `step` at `shape` on `device` as a generated product instead of
/// cuBLASLt: PROTEAN_CUDA_GENERATED_PRODUCTS not "0", no BLAS test hook, a driver with TMA descriptors
/// and cuLaunchKernelEx (the fake has neither), compute capability 9.0, NVRTC present, `algorithm`
/// < 0 (max-autotune's explicit cuBLASLt choices stay cuBLASLt's), generated_product_fits, and
/// every operand's address 16-byte aligned (the bias 4-byte). The first eligible call on a device
/// builds the module (NVRTC, or the artifact cache); a module that fails makes every later call
/// ineligible (one warning). Never throws.
bool generated_product_eligible(const BlasStep& step, const BlasShape& shape,
                                const std::function<uint64_t(int)>& address, int device, int algorithm = -1);

/// Whether `step` computes its LayerNormPrologue itself at `shape` (it has one and
/// generated_product_eligible holds with these arguments): the kernel at step prologue.kernel_step
/// is then not launched (or recorded). Every runner asks this with the arguments it then gives
/// run_blas_at, so a skipped LayerNorm always goes with a product that reads x. Never throws.
bool layer_norm_folded(const BlasStep& step, const BlasShape& shape, const std::function<uint64_t(int)>& address,
                       int device, int algorithm = -1);

/// Queues `step` at `shape` as the generated product on `stream` (a stream of `device`).
/// `programmatic`: launched with programmatic stream serialization (it then starts while the kernel
/// ahead of it finishes; it waits for it before reading the activations, but requests its first
/// weight tiles before: only for weights no step of the program writes, a constant or an input; a
/// bucket's graph gives the others a full edge). Throws RuntimeError when the
/// module cannot be built or loaded, CudaError from the driver. Call only where eligible.
void run_generated_product(const BlasStep& step, const BlasShape& shape, const std::function<uint64_t(int)>& address,
                           int device, ::protean::cuda::CUstream stream, bool programmatic);

/// The CUDA C translation unit of the generated products (four entry points: W N-major and K-major,
/// each whole and with K split over a cluster).
const std::string& generated_product_source();

/// How many products ran as generated products in this process (launched or captured).
int64_t generated_product_launches();

}  // namespace protean::backend::cuda
