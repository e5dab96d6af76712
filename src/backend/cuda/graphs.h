// CUDA graphs per size bucket: mode "reduce-overhead" of the cuda backend (docs/graphs.md).
//
// torch.compile's reduce-overhead records one CUDA graph per distinct size and hands out outputs that
// live in the graph's memory pool (a later replay overwrites them). Here one graph serves a whole size
// bucket (dynamic/buckets.h) of every dynamic symbol:
//  * Arena. The temporaries of the program (its memory slots, and any other buffer that is neither an
//    input, a constant nor an output) live in one device arena planned at the bucket's upper bounds,
//    so their addresses are fixed for the bucket's lifetime.
//  * Recording. A bucket's graph is built explicitly (cuGraphCreate, one kernel node per generated
//    kernel, chained in program order) and instantiated on the process's compile worker
//    (async_compile.h): the first call in a new bucket runs plain launches and hands the recording to
//    the worker, with its sizes and the arena's and constants' addresses; calls in the bucket run
//    plain until the graph is ready (counted in Stats::graph_plain_runs), then replay it. With
//    PROTEAN_CUDA_GRAPH_RECORD=inline the first call records on the calling thread and replays at
//    once (tests, and callers that want every call of a bucket from the graph). The instantiated
//    graph is uploaded on the recording's stream (PROTEAN_CUDA_GRAPH_UPLOAD=launch: on the device's
//    stream; =off: left to its first launch).
//  * Library nodes (library_plan). A cuBLASLt call is captured on a capture stream
//    (cuStreamBeginCapture) and added as a child-graph node:
//      - Padded: when only its row count m follows the symbols (batch 1, n and k fixed) and every
//        operand is in the arena or a constant, it is captured once per bucket at m evaluated at the
//        bucket's upper bounds. Rows past the call's m are computed on pad rows of the arena (a GEMM's
//        rows are independent) and never read: kernels get the exact sizes. Algorithm (the heuristic's
//        choice at the padded shape) and workspace (the device's) are fixed for the bucket.
//      - Exact: other symbolic sizes (attention's L×L products) cannot be padded without changing the
//        layout the kernels read, so the call is captured at the call's exact shape and captured again
//        when the shape changes (cuGraphExecChildGraphNodeSetParams; a changed topology re-records
//        the bucket).
//      With PROTEAN_CUDA_GRAPH_FLAT_LIBRARY=1 (opt-in: measured no faster on an H200), a captured call
//      that is one kernel node is added to the graph as a kernel node of its own (its launch
//      attributes copied) instead of a child graph, so the generated kernel after it hangs on a
//      programmatic edge as after another kernel (it is scheduled while the product's last blocks
//      run, and waits for the product in griddepcontrol.wait).
//      - Plain: a call that reads or writes a per-call buffer (a graph input or output) and host
//        steps are not recorded: the program is split into graph segments around them and they run
//        as plain calls between the segments' launches (one perf_hints line says so).
//      A product with a LayerNorm prologue (program.h) that runs as a generated product at the
//      bucket's shape and follows a kernel node (a generated kernel or product: it then hangs on a
//      programmatic edge) is recorded with the LayerNorm folded in, and the LayerNorm kernel's node is
//      left out; otherwise the LayerNorm kernel is recorded and the product captured reading its
//      output. The recording's `graphs` log line counts the folded LayerNorms.
//  * Replay with exact sizes. Every later call in the bucket computes each kernel's arguments (symbol
//    values, input/output addresses, arena addresses), its variant (aligned/general) and its grid, and
//    updates only the nodes whose launch changed (cuGraphExecKernelNodeSetParams); a call with the same
//    sizes and buffers as the previous one patches nothing. A new size inside a known bucket records
//    nothing. Sizes come from a SizeTable (each distinct size expression evaluated once per new size).
//  * Sizes in memory. Compiled for these modes, the loop kernels and the attention kernel read their
//    sizes from device memory that the runtime writes before each call's launches when they change
//    (one 8-byte value per symbol; codegen.h: SizeArgs::FromMemory), and their nodes are launched at
//    the bucket's upper bounds (the blocks past a call's work return at once): a new size inside a
//    known bucket changes none of their arguments or grids, so it patches only what takes sizes by
//    value (the other extern kernels) and what changes every call (input/output addresses).
//  * Pipelined patching (sizes by value: PROTEAN_CUDA_SIZES_IN_MEMORY=0, or a program with by-value
//    kernels). Each segment is split into growing chunks (pipeline_chunks), each patched right before
//    its launch, so at a new size the device runs the first chunks while the host patches the next.
//    When every kernel node keeps its arguments and grid at a new size, one graph per segment.
//  * Outputs come from the caching allocator, one fresh buffer per call, and are patched into the
//    nodes that write them: they are never part of the arena, so no replay overwrites an output a
//    caller still holds.
// mode "max-autotune" adds tuning per bucket before its recording (autotune.h).
// A call falls back to plain launches (counted in Stats::graph_plain_runs, with a perf_hints line
// naming why, once per reason) when a kernel's grid is empty at its sizes, when a temporary would not
// fit the bucket's arena (a size expression that is not monotone in its symbols), or when the driver
// refuses an update.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/blas.h"
#include "backend/cuda/nvrtc.h"
#include "backend/cuda/program.h"
#include "backend/registry.h"
#include "device/driver.h"
#include "dynamic/buckets.h"

namespace protean::backend::cuda {

/// Where the temporaries live in a bucket's arena. `offset[id]` is the byte offset of buffer `id`, or
/// -1 when the buffer is not in the arena (inputs, constants, outputs). Slots get one region each
/// (their members share it), other temporaries their own; every region is aligned to
/// kBufferAlignment and sized at `upper` (symbol values at the bucket's upper bounds).
struct ArenaLayout {
  int64_t bytes = 0;
  std::vector<int64_t> offset;        ///< per buffer id
  std::vector<int64_t> capacity;      ///< per buffer id: bytes reserved (0 outside the arena)
  std::vector<int64_t> slot_offset;   ///< per slot
};
ArenaLayout plan_arena(const CudaProgram& p, std::span<const int64_t> upper);

/// How a BLAS step runs under a bucket's graph (see the header comment).
enum class LibraryCapture : uint8_t { Padded, Exact, Plain };
const char* to_string(LibraryCapture c);

/// The capture plan of one BLAS step.
struct LibraryNodePlan {
  size_t step = 0;
  int blas = 0;                 ///< index into CudaProgram::blas
  LibraryCapture how = LibraryCapture::Plain;
  std::string why;              ///< for Exact and Plain: what keeps it from the padded form
};
std::vector<LibraryNodePlan> library_plan(const CudaProgram& p);
/// Text of the plan ("blas0 (step 1): padded" / "blas1 (step 3): exact (n follows the symbols)").
std::string to_text(const std::vector<LibraryNodePlan>& plan);

/// One graph segment: the steps [first, end) of CudaProgram::steps, all kernel steps or captured
/// (Padded, Exact) BLAS steps.
struct GraphSegment {
  size_t first = 0, end = 0;
};
/// Maximal runs of recordable steps; Plain BLAS steps and host steps separate them.
std::vector<GraphSegment> graph_segments(const CudaProgram& p);
std::vector<GraphSegment> graph_segments(const CudaProgram& p, const std::vector<LibraryNodePlan>& library);

/// Pipelined patching: `segments` split into chunks of `first` steps, then each `growth` times the
/// previous (rounded down), so that at a new size the device starts on the first chunk while the host
/// patches the next. The first chunk is short because the device waits for all of its patches (and
/// their upload in its cuGraphLaunch) before it starts. The growth keeps the host ahead of the device:
/// measured with GPT-2 small, the host spends ~2.5 us per step patched (cuGraphExecKernelNodeSetParams
/// and its share of the next launch's upload) and the device ~3.9 us per step at length 45, so a chunk
/// may be up to ~1.56 times its predecessor before the device waits for the host. Chosen on the H200
/// (bench/results/graphs_2026-12-04c_h200_newlength.json, docs/graphs.md): 3 steps growing 1.4x gave
/// a new length's first call 15-31 us extra against 10-55 us with 4 x 1.5 and 26-49 us with 8 x 1.75,
/// steady latency within the run's spread. A steady call pays one cuGraphLaunch per chunk (GPT-2
/// small: 119 steps in 9 chunks of 3, 4, 5, 8, 11, 16, 22, 31 and 19).
/// With PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1 (opt-in: measured slower on an H200), graph inputs that
/// kernel nodes read are copied, when at most this many bytes at a bucket's upper bounds, into a
/// region of the bucket (one device-to-device copy per call, ahead of its first launch)
/// and the nodes read the copy: a new input tensor (another address) then patches no node. Each patch
/// of an instantiated graph makes its next cuGraphLaunch upload the graph again (GPT-2 small on an
/// H100: a new length's first launch 18-63 us of host time with one node patched, where a launch of an
/// unchanged graph takes a few), and a model's token ids are a new tensor at every call.
/// Without the variable every input is read in place (its node patched when its address changes).
inline constexpr int64_t kStagedInputBytes = int64_t{1} << 20;
inline constexpr size_t kPipelineFirstChunk = 3;
inline constexpr double kPipelineGrowth = 1.4;
std::vector<GraphSegment> pipeline_chunks(const std::vector<GraphSegment>& segments, size_t first, double growth);
/// PROTEAN_CUDA_GRAPH_PIPELINE: "" or "1" the chunks above ("" while some kernel node is patched at a
/// new size; with none, one graph per segment), "0" one graph per segment, "FIRST,GROWTH"
/// chunks of FIRST steps (1..4096) growing GROWTH times (1..16), e.g. "8,1.75" (the chunks before the
/// change). Anything else is a ValueError naming the variable.
struct PipelineSetting {
  bool on = true;
  size_t first = kPipelineFirstChunk;
  double growth = kPipelineGrowth;
};
PipelineSetting parse_pipeline_setting(const std::string& text);

/// The patch plan of one kernel node: which of its parameters change inside a bucket.
struct NodePatchPlan {
  size_t step = 0;
  int kernel = 0;
  std::vector<int> symbol_params;  ///< parameter indices carrying symbol values (change with sizes)
  std::vector<int> io_params;      ///< parameter indices carrying input/output addresses (change per call)
  /// parameter indices carrying constants' addresses (the artifact uploads its constants once: fixed
  /// for its life, so a call with the sizes of the last one looks at no node whose only addresses
  /// are constants and arena regions)
  std::vector<int> constant_params;
  std::vector<int> arena_params;   ///< parameter indices carrying arena addresses (fixed in a bucket)
  /// No size and no input or output address among the arguments: every value is fixed in a bucket, so
  /// the node's launch changes with the sizes only through its variant and grid (the new-size skip).
  bool fixed_arguments() const { return symbol_params.empty() && io_params.empty(); }
  bool grid_varies = false;        ///< the launch rule's work depends on a symbol
  /// The kernel reads its sizes from memory (sizes_from_memory) and its grid varies: its node is
  /// launched at the bucket's upper bounds (the blocks past a call's work return at once), so a new
  /// size inside the bucket changes neither its arguments nor its grid.
  bool grid_at_bound = false;
};
std::vector<NodePatchPlan> patch_plan(const CudaProgram& p);
/// Text of the plan ("kernel3 (step 2): sizes p1 p2; io p0; arena p3; grid varies"), for logs/tests.
std::string to_text(const std::vector<NodePatchPlan>& plan, const CudaProgram& p);

/// A SizeTable's expressions compiled into a flat register program, so a new size evaluates them
/// without recursion, symbol lookups, std::function calls or allocation: one instruction per distinct
/// node of the expressions' DAG (a subexpression shared by several expressions is computed once).
/// Register i < exprs.size() holds SizeTable::exprs[i]; the registers above hold subexpressions.
/// Arithmetic is sym::evaluate's: overflow throws OverflowError, a division or modulo by zero
/// std::domain_error; a symbol the program does not bind throws ShapeError as eval_size.
struct SizeProgram {
  enum class Op : uint8_t {
    Const, Load, Unbound, Move, Add, Mul, FloorDiv, CeilDiv, Mod, Max, Min, Pow,
    Eq, Ne, Lt, Le, Gt, Ge, And, Or, Not,
  };
  struct Insn {
    Op op = Op::Const;
    int32_t dst = 0, a = 0, b = 0;
    int64_t imm = 0;               ///< Const: the value; Load: the symbol's index
    sym::Expr what = nullptr;      ///< Load, Unbound: the expression (for the error's text)
  };
  std::vector<Insn> code;
  size_t registers = 0;
};

/// Every size expression a call at new sizes needs (launch work and row lengths of both variants, the
/// variant rule's divisible sizes, every buffer's bytes, every BLAS step's shape), each distinct
/// expression once: expressions are hash-consed (equal means pointer-equal) and a model's repeated
/// layers share theirs, so a new size evaluates a few dozen expressions instead of one per use (GPT-2
/// small: hundreds of uses). Indices are into `exprs`, -1 where the program has no expression.
struct SizeTable {
  std::vector<sym::Expr> exprs;
  SizeProgram program;           ///< exprs compiled (size_table)
  struct Kernel {
    int work[2] = {-1, -1}, row[2] = {-1, -1};  ///< [0] general variant, [1] aligned
    std::vector<int> divisible;                 ///< VariantRule::divisible
    int at_least = -1;                          ///< VariantRule::size (-1: none)
    /// Per CudaKernel::tune entry (max-autotune's candidate variants): its launch's work and row
    /// length, and its rule's divisible sizes.
    struct Tune {
      int work = -1, row = -1;
      std::vector<int> divisible;
    };
    std::vector<Tune> tune;
  };
  std::vector<Kernel> kernels;   ///< per CudaProgram::kernels
  std::vector<int> buffer_bytes; ///< per buffer id
  struct Blas {
    int batch = -1, m = -1, n = -1, k = -1, stride_a = -1, stride_b = -1;
  };
  std::vector<Blas> blas;        ///< per CudaProgram::blas
};
SizeTable size_table(const CudaProgram& p);
/// Compiles `exprs` over `symbols` (SizeProgram); register i holds exprs[i].
SizeProgram compile_sizes(const std::vector<sym::Expr>& exprs, const std::vector<sym::Expr>& symbols);
/// `values[i]` = `t.exprs[i]` at the symbol values `S` (values is resized to the program's registers:
/// the entries past exprs.size() are its scratch; no allocation once it has that size). Throws as
/// eval_size: ShapeError for a symbol without a value in S, OverflowError, std::domain_error.
void evaluate_sizes(const SizeTable& t, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S,
                    std::vector<int64_t>& values);
/// From evaluated sizes: kernel `k`'s launch (variant `aligned`), whether the sizes allow its aligned
/// variant (the address part of the rule is the caller's), and BLAS step `i`'s shape; equal to
/// launch_dims, use_aligned_variant's size part and blas_shape at the same symbol values.
LaunchDims launch_dims_of(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k, bool aligned);
bool sizes_allow_aligned(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k);
/// Kernel `k`'s tune candidate `v` (an index into CudaKernel::tune) from evaluated sizes: whether its
/// rule's size part holds, and its launch. Throws as launch_dims.
bool sizes_allow_tune_variant(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k, size_t v);
LaunchDims tune_launch_dims_of(const CudaProgram& p, const SizeTable& t, std::span<const int64_t> values, size_t k, size_t v);
BlasShape blas_shape_of(const SizeTable& t, std::span<const int64_t> values, size_t i);

/// The bucket key of one call: per symbol, the bucket of its value under `policy`, clipped to the
/// symbol's known range. Returns the bucket's upper bounds in `upper` (the arena's sizes).
std::vector<dynamic::Bucket> bucket_key(const dynamic::BucketPolicy& policy,
                                        const std::vector<BackendInput::SymbolRange>& ranges,
                                        std::span<const int64_t> symbol_values);

/// The most size buckets one artifact records (PROTEAN_CUDA_GRAPH_MAX_BUCKETS, default 64; read when a
/// new bucket would be made). Each holds an arena at its upper bounds and its graphs; calls whose sizes
/// fall outside the recorded buckets past it run plain launches (one perf_hints line). Values of a
/// symbol that is not a size (0 or negative each make a bucket of their own) cannot grow memory
/// without bound.
int64_t graph_max_buckets();

struct NodeLaunchKey;  // graphs.cpp

/// The graphs of one artifact, per bucket. Not thread-safe: the artifact calls it under its lock.
class GraphRunner {
 public:
  /// `functions[k]` are kernel k's (aligned, general) entry points in the loaded module.
  /// `sizes_address`: where the caller writes each call's symbol values on the device before run()
  /// (kernels with a ParamKind::Sizes parameter read them there; 0 when none does).
  GraphRunner(const CudaProgram& p, const BackendInput& in, int device,
              std::vector<std::pair<::protean::cuda::CUfunction, ::protean::cuda::CUfunction>> functions,
              uint64_t sizes_address = 0);
  ~GraphRunner();
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  /// A bucket ready to run a call with symbol values `S`: its arena base address, or 0 when the call
  /// cannot use a graph (then the caller runs plain launches; the reason was logged and counted).
  /// Inline recording: records the bucket's graphs on its first call. Background recording: returns
  /// 0 until the worker has recorded them; after such a plain call the caller calls
  /// `after_plain_run`.
  uint64_t prepare(std::span<const int64_t> S);
  /// After a plain call that `prepare` answered 0 for a bucket not recorded yet: hands its recording
  /// to the compile worker (once per bucket). `address(id)` gives the constants' addresses.
  void after_plain_run(std::span<const int64_t> S, const std::function<uint64_t(int)>& address);
  /// The arena layout of the bucket `prepare` chose.
  const ArenaLayout& layout() const;
  /// Bytes to allocate for graph output `id` in the bucket `prepare` chose: its size at the bucket's
  /// upper bounds, so every length of a bucket asks the caching allocator for one size class and a
  /// new length reuses a freed block instead of reaching the driver (cuMemAllocAsync) on its first
  /// call. 0 for buffers that are not graph outputs.
  int64_t output_capacity(int id) const;
  /// Runs the call through the prepared bucket: patches the nodes whose launch changed (captures the
  /// Exact library nodes again when their shape changed), launches the segments and runs the steps
  /// between them through `run_step` (Plain BLAS and host steps). `address(id)` is each buffer's
  /// device address for this call.
  void run(std::span<const int64_t> S, const std::function<uint64_t(int)>& address,
           const std::function<void(const Step&)>& run_step);

  size_t buckets() const;
  const dynamic::BucketPolicy& policy() const { return policy_; }

 private:
  struct Bucket;
  const CudaProgram& p_;
  const BackendInput& in_;
  int device_;
  std::vector<std::pair<::protean::cuda::CUfunction, ::protean::cuda::CUfunction>> functions_;
  uint64_t sizes_address_ = 0;       ///< the call's symbol values on the device (ParamKind::Sizes)
  dynamic::BucketPolicy policy_;
  std::vector<LibraryNodePlan> library_;
  std::vector<GraphSegment> segments_;
  std::vector<NodePatchPlan> plan_;
  SizeTable table_;
  std::vector<int64_t> values_;      ///< table_ evaluated at values_at_
  std::vector<int64_t> values_at_;   ///< the symbol values of values_
  bool values_valid_ = false;        ///< values_ holds table_ at values_at_
  /// values_ at `S` (evaluated when S differs from the last sizes asked for).
  std::span<const int64_t> size_values(std::span<const int64_t> S);
  /// prepare's checks at new sizes, laid out so that they touch little memory (a new size's first
  /// call finds the runner's data out of the caches after the host waited for the device): the
  /// distinct kernels of the graph, and per captured library call the size-table entries of its
  /// batch, m and n (the bucket's own part is in Bucket::fits and Bucket::pad_m).
  std::vector<uint32_t> check_kernels_;
  std::vector<int> stage_inputs_;    ///< graph inputs kernel nodes read (Bucket::staged: those small enough)
  bool stage_ = false;               ///< stage small inputs (PROTEAN_CUDA_GRAPH_STAGE_INPUTS=1)
  bool flatten_ = false;             ///< library calls as kernel nodes (PROTEAN_CUDA_GRAPH_FLAT_LIBRARY=1)
  struct LibraryCheck {
    int32_t batch = -1, m = -1, n = -1;  ///< into table_ (-1: no expression)
    int32_t blas = 0;
    uint32_t lib = 0;                    ///< into library_
    bool padded = false;
  };
  std::vector<LibraryCheck> check_library_;
  bool has_exact_ = false;            ///< a library node is captured Exact (run() looks for new shapes)
  std::vector<dynamic::Bucket> key_;  ///< prepare: the call's bucket key (reused, no allocation per call)
  /// A call at sizes new to its bucket: host time of prepare's checks (ns), for the size-change line.
  int64_t change_check_ns_ = -1;
  std::chrono::steady_clock::time_point change_t0_;  ///< when prepare's checks of that call started
  std::vector<uint64_t> scratch_;    ///< run(): a node's argument block being built
  ::protean::cuda::CUstream capture_stream_ = nullptr;
  std::vector<std::shared_ptr<Bucket>> buckets_;
  Bucket* current_ = nullptr;
  Bucket* to_record_ = nullptr;      ///< background: the bucket whose recording after_plain_run hands off
  bool background_ = true;           ///< record on the compile worker (PROTEAN_CUDA_GRAPH_RECORD)
  bool upload_on_launch_stream_ = false;  ///< upload a recorded graph on the calls' stream (PROTEAN_CUDA_GRAPH_UPLOAD)
  bool upload_ = true;                    ///< upload a recorded graph before its first launch (PROTEAN_CUDA_GRAPH_UPLOAD)
  bool programmatic_ = false;        ///< kernel-to-kernel edges are programmatic (runner.h: programmatic_launch)
  ::protean::cuda::CUstream worker_stream_ = nullptr;  ///< the worker's capture stream
  struct Shared;                     ///< what a queued recording holds: the runner while it lives
  std::shared_ptr<Shared> shared_;
  std::mutex hint_mu_;
  std::vector<std::string> hinted_;  ///< perf_hints reasons already logged
  void hint(const std::string& reason);
  void record(Bucket& b, std::span<const int64_t> S, const std::function<uint64_t(int)>& address,
              ::protean::cuda::CUstream& capture_stream);
  void destroy_graphs(Bucket& b);
  /// `step`: the BLAS step to run instead of the plan's (its LayerNorm prologue off); null: the plan's.
  ::protean::cuda::CUgraph capture(const LibraryNodePlan& lib, const BlasShape& shape,
                                   const std::function<uint64_t(int)>& address, ::protean::cuda::CUstream& stream,
                                   int algorithm, const BlasStep* step = nullptr);
  /// mode "max-autotune" (autotune.h): times the bucket's tunable sites at its upper bounds (or finds
  /// them in the tuning table) and keeps the winners in the bucket; `address` gives the constants.
  void tune(Bucket& b, const std::function<uint64_t(int)>& address, ::protean::cuda::CUstream& stream);
  /// `d` for kernel `k` launched with `rule` in bucket `b`: the tuned threads per row where the rule
  /// sizes its block at launch.
  void apply_tuning(const Bucket& b, size_t k, const LaunchRule& rule, LaunchDims& d) const;
  /// The size values kernel `k`'s launch dimensions come from in bucket `b`: the bucket's upper bounds
  /// where it is launched there (Bucket::at_bound), else the call's `values`.
  std::span<const int64_t> dims_values(const Bucket& b, size_t k, std::span<const int64_t> values) const;
  /// What kernel `k`'s node in bucket `b` launches by at evaluated sizes `values` (graphs.cpp:
  /// NodeLaunchKey): one computation for the key set at recording and the one the new-size skip
  /// compares with it.
  NodeLaunchKey launch_key(const Bucket& b, size_t k, std::span<const int64_t> values) const;
  /// Kernel `k`'s node in bucket `b` at evaluated sizes `values`: `fn` and `d` start as the kernel's
  /// own entry (`aligned`: its aligned variant's rule holds, sizes and addresses) and become the
  /// bucket's tuned variant where that applies (the aligned path, or the kernel's only entry, and the
  /// variant's own rule), then get the tuned threads per row.
  void node_launch(const Bucket& b, size_t k, std::span<const int64_t> values, bool aligned,
                   const std::function<uint64_t(int)>& address, ::protean::cuda::CUfunction& fn, LaunchDims& d) const;
  /// max-autotune: loads the tune candidates' module (CudaProgram::tune_cubin, else tune_source
  /// compiled by NVRTC through the artifact cache) on first need; false when it failed (one warning;
  /// sites keep their own entries). Adds its time to `compile_ms`. On the recording thread only.
  bool load_tune_variants(double& compile_ms, std::string& how);
  int tune_state_ = 0;                ///< 0 not loaded, 1 loaded, 2 failed
  bool tune_nvrtc_ = false;           ///< the load compiled with NVRTC (not from the artifact cache)
  CubinModules tune_modules_;  ///< the variants' cubin: a module per part of their translation unit
  std::vector<std::vector<::protean::cuda::CUfunction>> tune_fns_;  ///< per kernel, per CudaKernel::tune entry
  bool autotune_ = false;            ///< mode "max-autotune"
  bool pipeline_ = true;             ///< segments split by pipeline_chunks (PROTEAN_CUDA_GRAPH_PIPELINE)

};

}  // namespace protean::backend::cuda
