// The peer every bandwidth benchmark is compared with: memcpy of the same size, by the same number of
// threads as the measured kernels, measured in the same run.
//
// Peer definition: `threads` OpenMP threads each std::memcpy their own contiguous chunk (bytes /
// threads, rounded up to 64 bytes) of a `bytes`-long source into a separate destination; bandwidth
// counts bytes read + bytes written (2 × bytes per copy); the best copy of at least five, and of as
// many as fit in a quarter of a second (so that one unlucky moment on a shared machine does not set
// the peer), after one untimed copy that faults both buffers in. With one thread it is a plain
// memcpy. A kernel running on N threads
// is compared with the N-thread copy, so the fraction says how close it comes to what the memory
// system delivers to that many cores, not to one core.
#pragma once

#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace protean::bench {

/// Copies `bytes` from `src` to `dst` with `threads` OpenMP threads, each one its own contiguous
/// chunk (std::memcpy).
inline void parallel_memcpy(char* dst, const char* src, size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t chunk = (bytes / static_cast<size_t>(threads) + 63) / 64 * 64;
#pragma omp parallel num_threads(threads)
  {
    const size_t begin = std::min(bytes, chunk * static_cast<size_t>(omp_get_thread_num()));
    const size_t end = std::min(bytes, begin + chunk);
    if (end > begin) std::memcpy(dst + begin, src + begin, end - begin);
  }
}

/// Best copy of `bytes` by `threads` threads (see the peer definition above), in GB/s counting bytes
/// read + written. Measured once per (size, threads) per process.
inline double memcpy_bandwidth(size_t bytes, int threads = 1) {
  static std::map<std::pair<size_t, int>, double> best_by_size;
  if (auto it = best_by_size.find({bytes, threads}); it != best_by_size.end()) return it->second;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  parallel_memcpy(b.data(), a.data(), bytes, threads);
  double best = 0, total = 0;
  for (int rep = 0; rep < 5 || (total < 0.25 && rep < 1000); ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    parallel_memcpy(b.data(), a.data(), bytes, threads);
    benchmark::DoNotOptimize(b.data());
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total += s;
    best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
  }
  return best_by_size[{bytes, threads}] = best;
}

}  // namespace protean::bench
