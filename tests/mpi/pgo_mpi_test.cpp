// Compiler collectives under mpirun (registered with ctest as PgoMpi.*; docs/pgo.md).
//   pgo_mpi_test batches     ranks see different batch sizes: each compiles exactly 1 graph, and the
//                            graphs are identical on every rank
//   pgo_mpi_test new_shape   then rank 0 alone sees a new shape: every rank recompiles (2 graphs each,
//                            identical), later calls hit on every rank
//   pgo_mpi_test early_exit  the last rank exits after the first compile: the others get a
//                            CompileError naming the frame and that rank within
//                            PROTEAN_COLLECTIVES_TIMEOUT_S (+ slack), never a hang
// Exit code 0 when this rank's checks pass; every failure prints "rank R: FAIL ...".
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mpi_test_util.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;
using mpi_test::check;
using mpi_test::fnv;
using mpi_test::g_failures;
using mpi_test::g_rank;
using mpi_test::g_size;
using mpi_test::same_on_all_ranks;

namespace {

pt::Tensor step(const pt::Tensor& x) { return pt::relu(x * 2.0 + 1.0).sum({1}); }

auto make_step() {
  pt::CompileOptions o;
  o.name = "step";
  o.arg_names = {"x"};
  o.backend = "interp";
  o.compiler_collectives = true;
  return pt::compile(step, o);
}

void call_and_check(const auto& f, const pt::Tensor& x) {
  check(pt::allclose(f(x), step(x)), "compiled result differs from eager");
}

int batches(bool then_new_shape) {
  auto f = make_step();
  const int64_t batch = 4 + 2 * g_rank;  // different on every rank
  std::string graphs;
  {
    pt::observe::LogCapture cap("output_code");
    for (int i = 0; i < 3; ++i) call_and_check(f, pt::randn({batch, 3}));
    graphs = cap.str();
  }
  check(pt::stats().compiles == 1, fmt::format("expected 1 compile, got {}", pt::stats().compiles));
  check(!graphs.empty(), "no graph was logged");
  check(same_on_all_ranks(fnv(graphs)), "graphs differ across ranks");
  if (!then_new_shape) return g_failures;

  {
    pt::observe::LogCapture cap("output_code");
    // Rank 0 alone sees a new feature size: every rank must compile with it.
    call_and_check(f, pt::randn({batch, g_rank == 0 ? 5 : 3}));
    graphs = cap.str();
  }
  check(pt::stats().compiles == 2, fmt::format("expected 2 compiles after the new shape, got {}", pt::stats().compiles));
  check(same_on_all_ranks(fnv(graphs)), "recompiled graphs differ across ranks");
  for (int i = 0; i < 3; ++i) call_and_check(f, pt::randn({batch + i, 3 + g_rank}));
  check(pt::stats().compiles == 2, fmt::format("expected no more compiles, got {}", pt::stats().compiles));
  return g_failures;
}

int early_exit() {
  auto f = make_step();
  call_and_check(f, pt::randn({4 + g_rank, 3}));
  if (g_rank == g_size - 1) return g_failures;  // leaves: the others must not hang
  const char* env = std::getenv("PROTEAN_COLLECTIVES_TIMEOUT_S");
  const double limit = env ? std::atof(env) : 60.0;
  auto t0 = std::chrono::steady_clock::now();
  bool thrown = false;
  try {
    call_and_check(f, pt::randn({4 + g_rank, 3}));
  } catch (const pt::CompileError& e) {
    thrown = true;
    const std::string m = e.what();
    std::fprintf(stderr, "rank %d: expected error: %s\n", g_rank, m.c_str());
    check(m.find("frame 'step'") != std::string::npos, "the error names the frame");
    check(m.find(fmt::format("ranks {} did not take part", g_size - 1)) != std::string::npos,
          "the error names the missing rank");
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check(thrown, "expected a CompileError when a rank stopped taking part");
  check(took < limit + 5, fmt::format("the error took {:.1f} s (limit {} s)", took, limit));
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  return mpi_test::main_with_scenarios(argc, argv, "batches", [](const std::string& scenario) {
    pt::manual_seed(static_cast<uint64_t>(g_rank));
    if (scenario == "batches") return batches(false);
    if (scenario == "new_shape") return batches(true);
    if (scenario == "early_exit") return early_exit();
    return -1;
  });
}
