// The MLP of cpu2_bench written directly against oneDNN, as the ceiling of Protean's own split: the
// same three products (784→1024, relu, 1024→1024, relu, 1024→10) as one-thread oneDNN matmul
// primitives with packed weights and bias and relu inside the primitive, and on n threads the first two
// products cut into n slices run at once on a team of pinned threads that spin between slices (what
// Protean's GEMM team does, src/ops/gemm_team.h, without a compiled program, guards, a runtime or a
// separate relu pass around it). The slices follow the team's rule: by rows (one shared copy of the
// packed weights) from 8 rows a thread, else by columns. On the 2-vCPU VMs of the benchmarks, how far
// a second thread speeds this up is what the machine allows that split of these products; cpu2_bench
// reports it beside Protean's and libtorch's scaling.
#pragma once

#include <cstdint>
#include <memory>

namespace cpu2_bench {

class OnednnMlp {
 public:
  /// w1 [1024, 784], b1 [1024], w2 [1024, 1024], b2 [1024], w3 [10, 1024], b3 [10]: f32, row-major,
  /// copied (packed) at construction.
  OnednnMlp(const float* w1, const float* b1, const float* w2, const float* b2, const float* w3, const float* b3);
  ~OnednnMlp();
  OnednnMlp(const OnednnMlp&) = delete;
  OnednnMlp& operator=(const OnednnMlp&) = delete;

  /// y [batch, 10] = the MLP of x [batch, 784] on `threads` threads (1 or 2: the calling thread and
  /// one team worker; more are not supported and throw std::invalid_argument). Primitives and packed
  /// weights are made on the first call of each (batch, threads) and kept.
  void run(const float* x, int64_t batch, int threads, float* y);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpu2_bench
