// The peer every bandwidth benchmark is compared with: memcpy of the same size, measured in the same run.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <vector>

namespace protean::bench {

/// Best of five memcpy copies of `bytes`, in GB/s counting bytes read + written (2 × bytes per copy).
/// Measured once per size per process.
inline double memcpy_bandwidth(size_t bytes) {
  static std::map<size_t, double> best_by_size;
  if (auto it = best_by_size.find(bytes); it != best_by_size.end()) return it->second;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  return best_by_size[bytes] = best;
}

}  // namespace protean::bench
