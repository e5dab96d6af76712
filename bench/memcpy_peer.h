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

/// Median of `v` (the upper middle element for an even count; 0 for none).
inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

/// The same-run median peer. Before and after a kernel benchmark's timed loop, `copies` back-to-back
/// copies of `bytes` from the kernel's input into a buffer the caller allocated like the kernel's
/// output (parallel_memcpy on `threads` threads) are timed, after one untimed copy. The kernel runs
/// back to back as well, so each is measured in its own steady state (a copy that directly follows a
/// kernel runs up to ~12% slower on the development VM, and would flatter the kernel); the fraction
/// is median copy time / median kernel time, the comparison the project's benchmark rules ask for.
/// memcpy_bandwidth() above (best copy of many, measured once per size) is kept for continuity.
class CopyPeer {
 public:
  CopyPeer(const void* src, void* dst, size_t bytes, int threads)
      : src_(static_cast<const char*>(src)), dst_(static_cast<char*>(dst)), bytes_(bytes), threads_(threads) {}

  /// One untimed copy, then `n` timed ones.
  void time_copies(int n) {
    parallel_memcpy(dst_, src_, bytes_, threads_);
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      parallel_memcpy(dst_, src_, bytes_, threads_);
      benchmark::DoNotOptimize(dst_);
      copies_.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  /// Records one kernel time in seconds.
  void kernel(double seconds) { kernels_.push_back(seconds); }

  double copy_median() const { return median_of(copies_); }
  double kernel_median() const { return median_of(kernels_); }
  /// GB/s of the median copy, counting bytes read + written.
  double copy_gbps() const { return copy_median() > 0 ? 2.0 * static_cast<double>(bytes_) / copy_median() / 1e9 : 0; }
  /// Median copy time / median kernel time: the kernel's bandwidth as a fraction of memcpy's.
  double fraction() const { return kernel_median() > 0 ? copy_median() / kernel_median() : 0; }

 private:
  const char* src_;
  char* dst_;
  size_t bytes_;
  int threads_;
  std::vector<double> copies_, kernels_;
};

}  // namespace protean::bench
