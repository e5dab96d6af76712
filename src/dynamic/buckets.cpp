#include "dynamic/buckets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "protean/error.h"

namespace protean::dynamic {

std::string Bucket::str() const { return fmt::format("[{}, {}]", lo, hi); }

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad(std::string_view what, std::string_view spec, const std::string& why) {
  throw ValueError(fmt::format("{}='{}': {}. Expected \"default\", \"exact\" or comma-separated pow2=N, step=N, "
                               "from=N, ratio=R (e.g. \"pow2=64,step=64,from=1024,ratio=1.25\"; docs/graphs.md)",
                               what, spec, why));
}

int64_t parse_int(std::string_view what, std::string_view spec, std::string_view key, std::string_view v) {
  std::string s(v);
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE) bad(what, spec, fmt::format("{}={} is not an integer", key, v));
  return n;
}

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t saturating_add(int64_t a, int64_t b) { return a > kMax - b ? kMax : a + b; }

// The bucket holding v > ratio_from: from the exclusive lower end lo = ratio_from, each bucket is
// max(step, floor(lo * (ratio - 1) / step) * step) wide. While that is one step (lo below 2 step /
// (ratio - 1)) the buckets are step-wide and v's is found in one division, not one bucket at a time;
// past it they grow by at least the ratio (>= 1.01: at most a few thousand buckets up to 2^63, a few
// dozen with the defaults). Widths and
// ends saturate at INT64_MAX, so a size near it gets a bucket ending there, not an overflow.
Bucket geometric(const BucketPolicy& p, int64_t v) {
  int64_t lo = p.ratio_from;  // exclusive
  const double step = static_cast<double>(p.step);
  const double flat_until = 2.0 * step / (p.ratio - 1.0);  // lo below it: buckets one step wide
  for (;;) {
    const double grow = std::floor(static_cast<double>(lo) * (p.ratio - 1.0) / step);
    if (grow < 2.0 && static_cast<double>(lo) + 2.0 * step < flat_until) {
      // whole steps that keep lo two steps short of the end of the flat part (the loop then
      // re-checks with the formula above, so no bound moves)
      const int64_t to_v = (v - lo - 1) / p.step;  // steps before v's bucket
      const double room = std::floor((flat_until - static_cast<double>(lo)) / step) - 2.0;
      const int64_t jump = std::min<int64_t>(to_v, room >= 9.0e18 ? kMax : static_cast<int64_t>(room));
      if (jump > 0) {
        lo += jump * p.step;  // lo + jump * step < v: no overflow
        continue;
      }
    }
    const int64_t width = grow >= 2.0 ? (grow * step >= 9.0e18 ? kMax : static_cast<int64_t>(grow) * p.step) : p.step;
    const int64_t hi = saturating_add(lo, width);
    if (v <= hi) return {lo + 1, hi};
    lo = hi;
  }
}

}  // namespace

BucketPolicy BucketPolicy::parse(std::string_view spec, std::string_view what) {
  BucketPolicy p;
  const std::string_view t = trim(spec);
  if (t.empty() || t == "default") return p;
  if (t == "exact") {
    p.exact = true;
    return p;
  }
  size_t pos = 0;
  while (pos <= t.size()) {
    size_t end = t.find(',', pos);
    if (end == std::string_view::npos) end = t.size();
    const std::string_view item = trim(t.substr(pos, end - pos));
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) bad(what, spec, fmt::format("item '{}' has no '='", item));
    const std::string_view key = trim(item.substr(0, eq)), val = trim(item.substr(eq + 1));
    if (key == "pow2") {
      p.pow2_until = parse_int(what, spec, key, val);
    } else if (key == "step") {
      p.step = parse_int(what, spec, key, val);
    } else if (key == "from") {
      p.ratio_from = parse_int(what, spec, key, val);
    } else if (key == "ratio") {
      std::string s(val);
      char* e = nullptr;
      p.ratio = std::strtod(s.c_str(), &e);
      if (s.empty() || e != s.c_str() + s.size()) bad(what, spec, fmt::format("ratio={} is not a number", val));
    } else {
      bad(what, spec, fmt::format("unknown key '{}'", key));
    }
  }
  constexpr int64_t kBound = int64_t{1} << 40;  // sizes past it are never padded to buckets this wide
  if (p.pow2_until < 1 || (p.pow2_until & (p.pow2_until - 1)) != 0 || p.pow2_until > kBound)
    bad(what, spec, fmt::format("pow2={} is not a power of two up to 2^40", p.pow2_until));
  if (p.step < 1 || p.step > kBound) bad(what, spec, fmt::format("step={} must be in [1, 2^40]", p.step));
  if (p.ratio_from < p.pow2_until || p.ratio_from > kBound)
    bad(what, spec, fmt::format("from={} must be in [pow2, 2^40] (pow2={})", p.ratio_from, p.pow2_until));
  if (!(p.ratio >= 1.01 && p.ratio <= 4.0)) bad(what, spec, fmt::format("ratio={} must be in [1.01, 4]", p.ratio));
  return p;
}

std::string BucketPolicy::str() const {
  if (exact) return "exact";
  return fmt::format("pow2={},step={},from={},ratio={}", pow2_until, step, ratio_from, ratio);
}

Bucket BucketPolicy::bucket_of(int64_t v, const SizeRange& known) const {
  Bucket b{v, v};
  if (exact || v <= 0) return b;
  if (v <= pow2_until) {
    int64_t hi = 1;
    while (hi < v) hi <<= 1;
    b = {hi <= 2 ? hi : hi / 2 + 1, hi};
  } else if (v <= ratio_from) {
    // step-wide, ending on multiples of step; the first one starts right after pow2_until.
    // [k step + 1, (k + 1) step] cut to (pow2_until, ratio_from]: a step that does not divide
    // ratio_from leaves the last one shorter, never overlapping the one before
    const int64_t k = (v - 1) / step;
    b = {std::max(pow2_until + 1, k * step + 1), std::min(ratio_from, (k + 1) * step)};
  } else {
    b = geometric(*this, v);
  }
  if (v >= known.min && v <= known.max) {
    b.lo = std::max(b.lo, known.min);
    b.hi = std::min(b.hi, known.max);
  }
  return b;
}

std::vector<Bucket> BucketPolicy::cover(const SizeRange& known, size_t limit) const {
  std::vector<Bucket> r;
  int64_t v = std::max<int64_t>(known.min, 0);
  while (v <= known.max && r.size() < limit) {
    Bucket b = bucket_of(v, known);
    if (r.size() + 1 == limit) b.hi = known.max;
    r.push_back(b);
    if (b.hi == std::numeric_limits<int64_t>::max()) break;
    v = b.hi + 1;
  }
  return r;
}

BucketPolicy resolve_bucket_policy(const std::string& options_spec) {
  if (const char* e = std::getenv("PROTEAN_BUCKETS"); e && *e) return BucketPolicy::parse(e, "PROTEAN_BUCKETS");
  return BucketPolicy::parse(options_spec, "CompileOptions::buckets");
}

std::string describe_buckets(std::string_view symbol, const BucketPolicy& p, const SizeRange& known, size_t limit) {
  std::string range = known.max == std::numeric_limits<int64_t>::max() ? fmt::format("[{}, inf]", known.min)
                                                                        : fmt::format("[{}, {}]", known.min, known.max);
  std::string r = fmt::format("{} in {} ({}), buckets {}:", symbol, range, known.why, p.str());
  SizeRange shown = known;
  const bool open = known.max == std::numeric_limits<int64_t>::max();
  if (open) shown.max = std::max<int64_t>(known.min, 4096);  // an open range: the first buckets only
  const std::vector<Bucket> bs = p.cover(shown, limit + 1);
  for (size_t i = 0; i < bs.size() && i < limit; ++i) r += " " + bs[i].str();
  if (bs.size() > limit || open) r += " ...";
  return r;
}

}  // namespace protean::dynamic
