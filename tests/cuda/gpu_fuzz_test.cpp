// The differential fuzzer on a real GPU: the random programs of CpuDifferential.RandomProgramsMatchInterp
// (cpu_test_util.h: build_random — pointwise chains, broadcasts, reductions, softmax and log_softmax,
// layer_norm, permutes, matmul, where, reshapes, gelu over symbolic [s0, s1] inputs) compiled once each
// by backend cuda with both sizes symbolic, run at several sizes (aligned and general variants, rows
// shorter and longer than a block, many row blocks), every output against the interpreter on the CPU.
// Skipped without a CUDA device. PROTEAN_FUZZ_ITERS sets the number of programs (default 16).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <random>

#include "backend/cuda/runner.h"
#include "cpu_test_util.h"
#include "device/runtime.h"
#include "ir/printer.h"
#include "protean/compile.h"

namespace protean::backend::cuda {
namespace {

TEST(CudaGpu, DifferentialRandomProgramsMatchInterp) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << ::protean::cuda::driver_unavailable_reason();
  cpu::testing::use_test_cache_dir();
  int iters = 16;
  if (const char* e = std::getenv("PROTEAN_FUZZ_ITERS")) iters = std::atoi(e);
  for (int it = 0; it < iters; ++it) {
    SCOPED_TRACE("program " + std::to_string(it));
    std::mt19937 rng(1000 + it);
    cpu::testing::RandomProgram rp;
    cpu::testing::build_random(rp, rng);
    const std::string text = ir::print(rp.b.g);
    auto g = std::make_shared<const ir::Graph>(std::move(rp.b.done(rp.outs)));
    BackendInput in;
    in.graph = g;
    in.symbols = {rp.s0.expr(), rp.s1.expr()};
    in.compile_id = fmt::format("{}/0", it);
    std::unique_ptr<Artifact> art = compile_cuda(in);
    Interpreter interp(g, in.symbols);
    for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{5, 6}, {2, 2}, {13, 70}, {3, 161}, {300, 64}, {7, 1024}}) {
      manual_seed(static_cast<uint64_t>(it * 31 + n0));
      std::vector<Tensor> host = {randn({n0, n1}), randn({n0, n1}), randn({n1}), randn({n0, 1}), randn({n1, n1}) * 0.3};
      std::vector<Tensor> dev;
      for (const Tensor& t : host) dev.push_back(t.to(kCUDA));
      const std::vector<int64_t> sv = {n0, n1};
      std::vector<Tensor> got = art->run(dev, sv);
      std::vector<Tensor> want = interp.run(host, std::span<const int64_t>(sv));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].device(), kCUDA);
        // f32 with accurate device functions; products through cuBLASLt in f32 (sums in another order)
        cpu::testing::expect_close(got[i].cpu(), want[i], fmt::format("{}x{} output {}\n{}", n0, n1, i, text), 1e-3);
      }
      if (HasFailure()) return;
    }
  }
}

}  // namespace
}  // namespace protean::backend::cuda
