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
//   nccl             the GPU job's bootstrap: nccl_group(store, local rank) on cuda:<local rank>, then
//                    sum, average and broadcast of device tensors checked on the host (prints "SKIP"
//                    and exits 0 without enough GPUs or without NCCL)
#include <fmt/format.h>

#include <chrono>
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

int nccl(const std::shared_ptr<pt::distributed::StoreGroup>& store) {
  if (!pt::cuda_is_available() || pt::cuda_device_count() < store->local_world_size() ||
      !pt::distributed::nccl_available()) {
    std::fprintf(stderr, "rank %d: SKIP nccl: %d CUDA device(s), NCCL %s\n", g_rank,
                 pt::cuda_is_available() ? pt::cuda_device_count() : 0,
                 pt::distributed::nccl_available() ? "found" : "not found (PROTEAN_NCCL_LIBRARY)");
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto g = pt::distributed::nccl_group(store, store->local_rank());
  const double init_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int n = g->size();
  const float r = static_cast<float>(g_rank);
  const pt::Device dev{pt::DeviceType::CUDA, store->local_rank()};
  pt::Tensor t = pt::tensor<float>({r + 1, 2 * (r + 1), 3}, {3}).to(dev);
  g->all_reduce(t, pt::distributed::ReduceOp::Sum);
  const float tri = static_cast<float>(n * (n + 1) / 2);
  check(pt::allclose(t.to(pt::kCPU), pt::tensor<float>({tri, 2 * tri, 3.0f * static_cast<float>(n)}, {3})),
        "all_reduce(sum) over nccl");
  pt::Tensor big = (pt::ones({1 << 22}) * static_cast<double>(g_rank)).to(dev);
  g->all_reduce(big, pt::distributed::ReduceOp::Avg);
  check(pt::allclose(big.to(pt::kCPU), pt::ones({1 << 22}) * ((n - 1) / 2.0)), "all_reduce(avg) of 16 MB over nccl");
  pt::Tensor b = pt::tensor<float>({r, r, r, r}, {4}).to(dev);
  g->broadcast(b, n - 1);
  check(pt::allclose(b.to(pt::kCPU), pt::ones({4}) * static_cast<double>(n - 1)), "broadcast from the last rank");
  std::fprintf(stderr, "rank %d: nccl group on %s ready in %.3f s\n", g_rank, dev.str().c_str(), init_s);
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
    if (scenario == "nccl") failures = nccl(store);
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
