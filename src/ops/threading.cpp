// Intra-op thread count for eager kernels (OpenMP).
//
// PROTEAN_NUM_THREADS is read once, on first use: a positive integer sets the count; anything else
// prints one warning to stderr and falls back to the default, omp_get_num_procs() (all cores this
// process may run on). set_num_threads() overrides both for the rest of the process.
#include <omp.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "protean/error.h"
#include "protean/ops.h"

namespace protean {

namespace {
std::atomic<int> g_threads{0};  // 0 = not decided yet
std::once_flag g_once;

int threads_from_env() {
  int def = omp_get_num_procs();
  if (def < 1) def = 1;
  const char* env = std::getenv("PROTEAN_NUM_THREADS");
  if (!env || !*env) return def;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || v < 1 || v > 4096) {
    std::fprintf(stderr,
                 "protean: warning: PROTEAN_NUM_THREADS=\"%s\" is not a positive integer (1..4096); "
                 "using %d threads (all cores)\n",
                 env, def);
    return def;
  }
  return static_cast<int>(v);
}
}  // namespace

int num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  std::call_once(g_once, [] {
    int expected = 0;
    g_threads.compare_exchange_strong(expected, threads_from_env());
  });
  return g_threads.load(std::memory_order_relaxed);
}

void set_num_threads(int n) {
  if (n < 1) throw ValueError("set_num_threads: thread count must be >= 1, got " + std::to_string(n));
  std::call_once(g_once, [] {});  // the environment no longer matters
  g_threads.store(n, std::memory_order_relaxed);
}

}  // namespace protean
