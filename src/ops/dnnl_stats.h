// Counters of the oneDNN primitive caches in the conv and matmul kernels (src/ops/dnnl_util.h): how
// many primitives were built and how long that took — the cost of a compiled function's first call.
// Process-wide since start or reset_dnnl_stats(); `protean run --stats-json` writes them as "dnnl".
#pragma once

#include <cstdint>
#include <string>

namespace protean::ops {

struct DnnlStats {
  int64_t primitives_created = 0;  ///< conv / deconv / matmul / reorder primitives built (JIT)
  int64_t cache_hits = 0;          ///< kernel calls that found their primitive cached
  int64_t post_op_fallbacks = 0;   ///< fused calls whose post-ops ran as a separate pass (run_post_ops)
  double create_seconds = 0;       ///< wall time spent building descriptors and primitives
  // Packed matmul weights (src/ops/linear.cpp, backend/cpu/gemm_weights.h):
  int64_t weight_packs = 0;        ///< weights reordered into a primitive's layout and kept
  int64_t packed_weight_hits = 0;  ///< calls that found their weights packed
  int64_t weight_sightings = 0;    ///< "reuse" weights seen at a new storage or version (not packed yet)
};
DnnlStats dnnl_stats();
void reset_dnnl_stats();
/// The stats as a JSON object text: {"primitives_created": .., "cache_hits": .., ...}.
std::string dnnl_stats_json();
/// Recorded by the kernels' caches.
void note_dnnl_create(double seconds, int64_t primitives);
void note_dnnl_hit();
void note_dnnl_post_op_fallback();
void note_dnnl_packed_weights(int64_t packs, int64_t hits, int64_t sightings);

/// While one is alive on a thread, the oneDNN kernels called on that thread (conv family, and the
/// epilogue pass of run_post_ops) build and cache their primitives and pack constant weights, but run
/// nothing and leave their outputs unwritten. The cpu runner's prewarm thread (backend/cpu/runner.h)
/// calls a program's convolutions this way ahead of its first run, so primitive creation (oneDNN's
/// JIT) and weight packing overlap the run instead of adding to the time to first result. Nests.
class DnnlPrepareOnly {
 public:
  DnnlPrepareOnly();
  ~DnnlPrepareOnly();
  DnnlPrepareOnly(const DnnlPrepareOnly&) = delete;
  DnnlPrepareOnly& operator=(const DnnlPrepareOnly&) = delete;
};
/// True on a thread inside a DnnlPrepareOnly scope.
bool dnnl_prepare_only();

}  // namespace protean::ops
