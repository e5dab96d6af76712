// One rank of the jobs tests/launch/launch_test.cpp starts with `protean launch --nproc 2` (no MPI):
// it joins through distributed::init_from_env(), installs the compiler collectives over the store and
// runs one scenario. Exit 0 when this rank's checks pass; every failure prints "rank R: FAIL ...";
// an error that escapes prints "rank R: error: ..." and exits 1, as a real program would.
//   varying          rank 0 sees batch sizes 4, 6, 5 and rank 1 sees 7, 9, 8 (collectives on): each rank
//                    compiles 1 graph, dynamic from the first call and identical on both ranks; then
//                    rank 0 alone sees a new feature size: both ranks recompile at that call, and
//                    later calls hit on both
//   no_collectives   the same sizes with collectives off: each rank compiles 2 graphs (static, then
//                    dynamic)
//   early_exit       rank 1 leaves after the first call; rank 0's next call throws the compiler
//                    collectives' CompileError naming rank 1 (and the job fails)
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "observe/log.h"
#include "protean/distributed.h"
#include "protean/protean.h"

namespace pt = protean;

namespace {

int g_rank = 0;
int g_failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", g_rank, what.c_str());
    ++g_failures;
  }
}

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

pt::Tensor step(const pt::Tensor& x) { return pt::relu(x * 2.0 + 1.0).sum({1}); }

auto make_step(bool collectives) {
  pt::CompileOptions o;
  o.name = "step";
  o.arg_names = {"x"};
  o.backend = "interp";
  o.compiler_collectives = collectives;
  return pt::compile(step, o);
}

void call_and_check(const auto& f, const pt::Tensor& x) {
  check(pt::allclose(f(x), step(x)), "compiled result differs from eager");
}

bool same_on_all_ranks(pt::distributed::ProcessGroup& g, const std::string& text) {
  const std::string mine = std::to_string(fnv(text));
  for (const std::string& other : g.all_gather_bytes(mine))
    if (other != mine) return false;
  return true;
}

int varying(pt::distributed::ProcessGroup& g, bool collectives) {
  auto f = make_step(collectives);
  const std::vector<int64_t> batches = g_rank == 0 ? std::vector<int64_t>{4, 6, 5} : std::vector<int64_t>{7, 9, 8};
  std::string graphs;
  {
    pt::observe::LogCapture cap("output_code");
    for (int64_t b : batches) call_and_check(f, pt::randn({b, 3}));
    graphs = cap.str();
  }
  const int64_t want = collectives ? 1 : 2;
  check(pt::stats().compiles == want, fmt::format("expected {} compile(s), got {}", want, pt::stats().compiles));
  if (!collectives) return g_failures;
  check(same_on_all_ranks(g, graphs), "graphs differ across ranks");

  {
    pt::observe::LogCapture cap("output_code");
    call_and_check(f, pt::randn({batches[0], g_rank == 0 ? 5 : 3}));  // rank 0 alone: a new feature size
    graphs = cap.str();
  }
  check(pt::stats().compiles == 2, fmt::format("expected both ranks to recompile at the new shape, got {} compiles",
                                               pt::stats().compiles));
  check(same_on_all_ranks(g, graphs), "recompiled graphs differ across ranks");
  for (int i = 0; i < 3; ++i) call_and_check(f, pt::randn({batches[0] + i, 3 + g_rank}));
  check(pt::stats().compiles == 2, fmt::format("expected no more compiles, got {}", pt::stats().compiles));
  return g_failures;
}

int early_exit() {
  auto f = make_step(true);
  call_and_check(f, pt::randn({4 + g_rank, 3}));
  if (g_rank == 1) return g_failures;  // leaves: rank 0 must not hang
  call_and_check(f, pt::randn({4, 3}));  // throws the CompileError
  check(false, "expected a CompileError when rank 1 stopped taking part");
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "varying";
  try {
    auto store = pt::distributed::init_from_env();
    g_rank = store->rank();
    pt::distributed::install_compiler_collectives(store);
    pt::manual_seed(static_cast<uint64_t>(g_rank));
    int failures = -1;
    if (scenario == "varying") failures = varying(*store, true);
    if (scenario == "no_collectives") failures = varying(*store, false);
    if (scenario == "early_exit") failures = early_exit();
    if (failures < 0) {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    if (failures == 0) std::fprintf(stderr, "rank %d: OK %s\n", g_rank, scenario.c_str());
    pt::distributed::uninstall_compiler_collectives();
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
}
