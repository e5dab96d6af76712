// mode "max-autotune" of the cuda backend: tuning per size bucket (docs/graphs.md).
//
// torch.compile's max-autotune benchmarks its candidate configs at the first shape it compiles for
// and keeps the winner for every later size. Here tuning follows the size buckets of
// reduce-overhead (graphs.h): when a bucket's graph is recorded (on the compile worker by default),
// each tunable site of the program is timed at the bucket's upper bounds, on scratch memory of the
// bucket's layout (never the arena a replay may be using) with a cuBLASLt workspace of its own, and
// the winner is what the bucket's graph records. Sites:
//   * products captured padded: the heuristic's top algorithms at the padded shape (8 by default,
//     PROTEAN_AUTOTUNE_BLAS_ALGOS up to 16: autotune_blas_algorithms; cublasLtMatmulAlgoGetHeuristic
//     is asked for 16), then (opt-in, autotune_blas_one_kernel) some it answers when asked for
//     algorithms without a split-K reduction kernel of their own. A product the untuned plan runs
//     as a generated product (hopper_gemm.h) keeps it and is not timed (autotune_generated_products);
//   * row kernels whose block is sized at launch (LaunchRule::block_from_row: the row stays in
//     registers and the code strides by blockDim.x): threads per row from the schedule's choice (the
//     fewest that hold the row) up to the kernel's __launch_bounds__, by powers of two.
//   * row kernels' compiled-in parameters (CudaKernel::tune, rendered by codegen.h's
//     render_tune_variants when the mode is max-autotune): rows per block of a warp-per-row kernel
//     (1, 2, 4), the vector width of its accesses (2, 4, 8 elements up to 16 bytes) and the split of
//     a block-per-row kernel's row over a thread-block cluster of 2 or 4 blocks (sm_90; timed only
//     where the bucket's rows are fewer than the multiprocessors), one entry per
//     candidate in a translation unit of their own (CudaProgram::tune_source), compiled by NVRTC the
//     first time a bucket has to time them or launch a stored winner (through the artifact cache, so a
//     later process reads the cubin), timed before the threads per row of the winner.
// The compile of the variants is not counted in the budget; its time is printed and counted
// (AutotuneStats::variant_compile_ms).
// Each candidate is timed inside a CUDA graph of its own, launched back to back (no host launch gap),
// a product's constant weights rotating over copies larger than the L2 cache
// (PROTEAN_AUTOTUNE_TIMING=graph, the default; "cold" and "hot" time stream launches, docs/graphs.md).
// Candidate 0 is always the untuned choice, and another candidate wins only when it is at least 3 %
// faster (pick_winner), so timing noise does not change a plan. Winners are stored in a tuning table
// beside the PGO profile (tuning_path), keyed by device, site kind, a hash of the site (the kernel's
// program source and entry, or the cuBLASLt call's types, epilogue and padded shape) and the bucket's
// upper bounds,
// so the next run and other ranks of the job start tuned: a site found in the table is not timed
// again. Tuning a bucket stops at PROTEAN_AUTOTUNE_BUDGET_MS (default 5000 ms of wall time per
// bucket); sites past the budget keep their untuned choice and are not stored (a later run tunes
// them). The time spent is printed (PROTEAN_LOGS=graphs) and counted (autotune_stats).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace protean::backend::cuda {

/// The winner among measured candidates (microseconds per call): candidate 0 is the untuned default;
/// another wins only when its time is at least `min_gain` (a fraction) below the default's, and then
/// the fastest wins. A negative or non-finite time (a candidate that failed to run) never wins; when
/// the default itself failed, the fastest candidate that ran wins. Returns an index into `us`.
int pick_winner(std::span<const double> us, double min_gain = 0.03);

/// One tuned site.
struct TuneEntry {
  int choice = 0;          ///< winning candidate (0 = the untuned default)
  int candidates = 0;      ///< how many were timed
  double default_us = 0;   ///< candidate 0's time
  double best_us = 0;      ///< the winner's time
  bool operator==(const TuneEntry&) const = default;
};

/// Tuning results by key (TuningTable::key). Thread-safe.
class TuningTable {
 public:
  TuningTable() = default;
  TuningTable(TuningTable&& o) noexcept {
    std::lock_guard<std::mutex> lock(o.mu_);
    entries_ = std::move(o.entries_);
  }
  TuningTable& operator=(TuningTable&& o) noexcept {
    if (this != &o) {
      std::scoped_lock lock(mu_, o.mu_);
      entries_ = std::move(o.entries_);
    }
    return *this;
  }
  /// "<device>|<kind>|<hash, 16 hex digits>|<bucket>", e.g. "NVIDIA H200|blas|9f0c...|s0 at 320": the
  /// bucket part names the sizes the site is timed at (the bucket's upper bounds), not the bucket's
  /// range, whose lower end moves with the symbol's known range (a PGO range in a warm run).
  static std::string key(std::string_view device, std::string_view kind, uint64_t hash, std::string_view bucket);
  std::optional<TuneEntry> find(const std::string& key) const;
  void put(const std::string& key, const TuneEntry& e);
  size_t size() const;
  /// JSON text: {"version": 1, "entries": {key: {"choice", "candidates", "default_us", "best_us"}}}.
  std::string dump() const;
  /// Parses dump()'s text; FormatError naming `what` (and the entry) for anything else. With
  /// `skipped`, a bad entry is left out and its message appended there instead; text that is not a
  /// table at all still throws.
  static TuningTable parse(const std::string& text, const std::string& what, std::vector<std::string>* skipped = nullptr);
  /// Reads `path` (a missing file is an empty table) and adds its entries that this table lacks.
  /// Bad entries are one warning and skipped; a file that is not a table is one warning and ignored.
  void load(const std::string& path);
  /// Writes this table merged with the file's current entries (this table's win; the file's bad
  /// entries dropped), under an exclusive flock on "<path>.lock", through a temporary file renamed
  /// over `path`. A file that is not a table is first renamed to "<path>.corrupt-<timestamp>".
  /// Failures are one warning: tuning never makes a call fail.
  void save(const std::string& path) const;

 private:
  static TuneEntry parse_entry(const std::string& key, const nlohmann::json& v, const std::string& what);
  mutable std::mutex mu_;
  std::map<std::string, TuneEntry> entries_;
};

/// Where tuning results live: "<cache_dir>/pgo/<job_id>/tuning.json" beside the PGO profile when
/// PROTEAN_JOB_ID is set, else "<cache_dir>/tuning.json" (cache_dir: PROTEAN_CACHE_DIR or
/// ~/.cache/protean).
std::string tuning_path();
/// The process's table, loaded from tuning_path() on first use.
TuningTable& process_tuning_table();
/// Drops the process's table (tests: the next use loads tuning_path() again, as a new process would).
void reset_process_tuning_table();

/// Wall-time budget for tuning one bucket, milliseconds (PROTEAN_AUTOTUNE_BUDGET_MS, default 5000).
/// ValueError for text that is not a positive number.
double autotune_budget_ms();

/// How many of cuBLASLt's heuristic algorithms a product site times (its first, the untuned choice,
/// included): PROTEAN_AUTOTUNE_BLAS_ALGOS, 1 to 16, default 8 (the heuristic is asked for 16, blas.h;
/// at GPT-2's shapes on an H100 it offers at most 8, docs/graphs.md). The count is part of a product site's tuning key, so a table
/// tuned over 8 is not reused for 16. A value outside 1..16 warns once and is 8.
int autotune_blas_algorithms();
/// How many of the algorithms cuBLASLt's heuristic answers when asked for no separate split-K
/// reduction kernel (blas.h: blas_tune_algorithms) a product site times beside those:
/// PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL, 0 to 8, default 0. Part of the site's tuning key. A value outside
/// 0..8 warns once and is 0. Measured on an H200 with GPT-2 small (docs/graphs.md): 4 of them changed no
/// latency and doubled the tuning time, so they are opt-in.
int autotune_blas_one_kernel();
/// Whether max-autotune times the product sites the untuned plan runs as generated products
/// (PROTEAN_AUTOTUNE_GENERATED_PRODUCTS=1; default off: they keep the generated product). Timed alone,
/// a generated product loses what it gains in a bucket's graph: it requests its weights while the
/// kernel ahead of it finishes, it lets the next product wait on a programmatic edge, and it computes
/// the LayerNorm before it. In GPT-2 small on an H100 (docs/graphs.md) the timed choices (cuBLASLt for
/// FC1 behind its LayerNorm kernel) made max-autotune 25-36 µs a call slower than reduce-overhead at
/// 37-128 tokens. When on, the generated product is candidate 0 (with its LayerNorm folded in, then
/// behind the LayerNorm's kernel, where it has one) and cuBLASLt's algorithms follow; it is part of the
/// site's tuning key.
bool autotune_generated_products();

/// Process-wide counters (protean::reset() does not touch them; reset_autotune_stats does).
struct AutotuneStats {
  int64_t buckets_tuned = 0;      ///< buckets whose sites were tuned or looked up
  int64_t sites_tuned = 0;        ///< sites timed here
  int64_t sites_from_table = 0;   ///< sites whose winner came from the tuning table
  int64_t sites_over_budget = 0;  ///< sites left untuned by the budget
  int64_t candidates_timed = 0;
  int64_t sites_changed = 0;      ///< sites whose winner is not the untuned default
  double tuning_ms = 0;           ///< wall time spent timing
  int64_t variant_kernels = 0;    ///< row kernels whose candidate variants were loaded for tuning
  int64_t variant_entries = 0;    ///< candidate variant entries loaded (compiled or from the artifact cache)
  int64_t variant_nvrtc = 0;      ///< of those loads, the ones NVRTC compiled (not in the artifact cache)
  double variant_compile_ms = 0;  ///< wall time of those loads (NVRTC or the cache, module load)
};
AutotuneStats autotune_stats();
void reset_autotune_stats();
void count_autotune(const AutotuneStats& add);

/// Tests on the fake driver: candidate `i` of a site takes `timer(site_key, i)` microseconds instead
/// of being timed on the device; an empty function restores device timing.
using AutotuneTimer = std::function<double(const std::string& key, int candidate)>;
void set_autotune_timer_for_testing(AutotuneTimer timer);
/// The test timer, or an empty function.
AutotuneTimer autotune_timer_for_testing();

}  // namespace protean::backend::cuda
