// What the programs under tests/mpi share: this rank's checks, hashes compared across ranks, and a
// main that runs one named scenario between MPI_Init and MPI_Finalize with the compiler collectives'
// MPI backend installed. A program exits 0 when this rank's checks pass; every failure prints
// "rank R: FAIL ...".
#pragma once

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "protean/mpi.h"

namespace mpi_test {

inline int g_rank = 0, g_size = 1;
inline int g_failures = 0;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", g_rank, what.c_str());
    ++g_failures;
  }
}

/// FNV-1a over bytes, continuing from `h`.
inline uint64_t fnv(const void* p, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    h ^= c[i];
    h *= 1099511628211ull;
  }
  return h;
}
inline uint64_t fnv(const std::string& s) { return fnv(s.data(), s.size()); }

/// True when every rank passed the same value.
inline bool same_on_all_ranks(uint64_t v) {
  std::vector<uint64_t> all(static_cast<size_t>(g_size));
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  for (uint64_t x : all)
    if (x != v) return false;
  return true;
}

/// Runs scenario argv[1] (or `fallback`) through `run`, which returns this rank's failure count or -1
/// for a name it does not know. An escaping exception is a failure.
inline int main_with_scenarios(int argc, char** argv, const char* fallback,
                               const std::function<int(const std::string&)>& run) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  protean::mpi::install_compiler_collectives();
  const std::string scenario = argc > 1 ? argv[1] : fallback;
  int failures = 0;
  try {
    failures = run(scenario);
    if (failures < 0) {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      failures = 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: FAIL unexpected error: %s\n", g_rank, e.what());
    failures = 1;
  }
  if (failures == 0) std::fprintf(stderr, "rank %d: OK %s\n", g_rank, scenario.c_str());
  protean::mpi::uninstall_compiler_collectives();
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}

}  // namespace mpi_test
