// What the two GPT-2 benchmarks share (bench/gpu/gpt2_bench.cpp on the GPU, gpt2_cpu_bench.cpp on
// the CPU): wall-clock seconds, the error of an output against a reference, and the lengths file
// their work directory holds.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "protean/tensor.h"

namespace gpt2_bench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// Error of an output against a reference, in float64: max |a - b|, max |a - b| / max(|b|, 1e-3),
/// and ||a - b|| / ||b||, over the elements in order. A NaN counts as an infinite difference; a
/// different element count is infinite.
struct Err {
  double max_abs = 0, max_rel = 0, rel_l2 = 0;
};

inline Err compare(const protean::Tensor& got, const protean::Tensor& want) {
  Err e;
  if (got.int_numel() != want.int_numel()) return {INFINITY, INFINITY, INFINITY};
  std::vector<double> a = got.cpu().to(protean::DType::F64).contiguous().to_vector<double>();
  std::vector<double> b = want.cpu().to(protean::DType::F64).contiguous().to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::isnan(a[i]) ? INFINITY : std::fabs(a[i] - b[i]);
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / std::max(std::fabs(b[i]), 1e-3));
    num += d * d;
    den += b[i] * b[i];
  }
  e.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

/// The whitespace-separated integers of `path` (empty when the file is missing or holds none).
inline std::vector<int64_t> read_lengths(const std::string& path) {
  std::vector<int64_t> r;
  std::ifstream f(path);
  for (int64_t l; f >> l;) r.push_back(l);
  return r;
}

}  // namespace gpt2_bench
