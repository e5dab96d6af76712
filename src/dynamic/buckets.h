// Size buckets per dynamic symbol: which sizes share one padded plan (a CUDA graph recorded at the
// bucket's upper bound, a buffer plan sized for it). torch.compile's advice for CUDA graphs under
// dynamic shapes is "pad to a few lengths and warm up"; a bucket policy makes that automatic.
//
// A bucket is a closed range [lo, hi] of sizes; a size v falls in exactly one bucket:
//   v <= 0                       [v, v]                     (no padding for empty or negative sizes)
//   1 <= v <= pow2_until         powers of two: [2^(k-1)+1, 2^k] (and [1, 1], [2, 2])
//   pow2_until < v <= ratio_from `step`-wide buckets ending on a multiple of `step`
//   v > ratio_from               buckets whose bounds are multiples of `step` with hi / (lo - 1) <= ratio
//                                (the first one starts at ratio_from + 1)
// With the defaults (pow2=64, step=64, from=1024, ratio=1.25): 37 -> [33, 64], 200 -> [193, 256],
// 1100 -> [1025, 1280], 1500 -> [1281, 1600]. The padding waste is at most 2x below 64, at most 64
// elements up to 1024 and at most 25% above.
// A symbol's known range (PGO profile min/max, a mark_dynamic min/max, observed values) clips its
// buckets: a bucket never reaches above the range's max or below its min when the value lies inside
// it, so a symbol known to stay in [1, 40] pads 37 to 40, not 64.
//
// Spec text (CompileOptions::buckets, PROTEAN_BUCKETS — the variable wins):
//   ""  or "default"                       the defaults above
//   "pow2=N,step=N,from=N,ratio=R"         any subset of the four, others default
//   "exact"                                every size is its own bucket (a graph per size, as torch)
// A malformed spec is a ValueError naming the item and the accepted keys.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace protean::dynamic {

struct Bucket {
  int64_t lo = 0, hi = 0;  ///< sizes lo..hi inclusive
  bool operator==(const Bucket&) const = default;
  std::string str() const;  ///< "[33, 64]"
};

/// A symbol's known range ([min, max]; unknown ends are 0 / INT64_MAX).
struct SizeRange {
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
  /// Where it came from, for logs: "pgo", "mark", "observed", "unknown".
  std::string why = "unknown";
};

struct BucketPolicy {
  bool exact = false;
  int64_t pow2_until = 64;
  int64_t step = 64;
  int64_t ratio_from = 1024;
  double ratio = 1.25;

  /// Parses a spec (see the file comment). `what` names its origin in errors ("PROTEAN_BUCKETS").
  /// Throws ValueError on an unknown key, a bad number, pow2 not a power of two up to 2^40, step not
  /// in [1, 2^40], from not in [pow2, 2^40], ratio not in [1.01, 4].
  static BucketPolicy parse(std::string_view spec, std::string_view what);
  /// The spec text that parses back to this policy ("pow2=64,step=64,from=1024,ratio=1.25" / "exact").
  std::string str() const;

  /// The bucket of size `v`, clipped to `known` when v lies inside it. Allocation-free; a few ns with
  /// the defaults (past ratio_from, one step per geometric bucket below v: a few dozen with the
  /// defaults, at most a few thousand with ratio 1.01).
  Bucket bucket_of(int64_t v, const SizeRange& known = {}) const;
  /// The buckets covering [lo, hi] in order (for logs and the report); at most `limit` of them (the
  /// last one is then cut at hi).
  std::vector<Bucket> cover(const SizeRange& known, size_t limit = 64) const;
};

/// The policy in force for a frame: PROTEAN_BUCKETS when set and non-empty, else `options_spec`
/// (CompileOptions::buckets). ValueError as BucketPolicy::parse. compile() reads it once per function
/// (CompiledFunctionImpl::bucket_policy): text set later applies to functions compiled later.
BucketPolicy resolve_bucket_policy(const std::string& options_spec);

/// "s0 in [2, 600] (pgo): [2, 2] [3, 4] [5, 8] ... [577, 600]" — one log/report line for a symbol.
std::string describe_buckets(std::string_view symbol, const BucketPolicy& p, const SizeRange& known, size_t limit = 12);

}  // namespace protean::dynamic
