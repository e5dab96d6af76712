// Interface between bench/train_bench.cpp (Protean side, data, timing, JSON) and
// bench/train_bench_torch.cpp (the libtorch peer). Plain data only, so neither translation unit sees
// the other library's headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace train_bench {

/// Cnn: LeNet-style (conv-relu-pool twice, three linear layers). CnnBn: the same with a training-mode
/// BatchNorm after each convolution (running statistics updated every step, momentum 0.1).
enum class Model { Mlp, Cnn, CnnBn, Gpt };

/// One initial weight, shared by every runner (row-major float32 values).
struct Weight {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// The character-level GPT: pre-LayerNorm blocks, causal attention, GELU MLP of 4·d, untied head.
struct GptConfig {
  int64_t vocab = 0;
  int64_t d = 128;
  int64_t heads = 4;
  int64_t layers = 4;
  int64_t max_t = 256;
};

/// One batch. MLP: x [B, 784] float; CNN: x [B, 1, 28, 28] float; GPT: tokens [B, T] and targets
/// [B, T]. Labels/targets are int64 class indices.
struct Batch {
  std::vector<int64_t> x_shape;
  std::vector<float> x;
  std::vector<int64_t> tokens;
  std::vector<int64_t> y;
};

/// SGD's settings for `train_bench --curve-sgd` (every runner alike): torch.optim.SGD with momentum
/// 0.9, no dampening, no weight decay, the learning rate of the AdamW runs times kSgdLrScale.
constexpr double kSgdMomentum = 0.9;
constexpr double kSgdLrScale = 10.0;

/// A model + AdamW(lr, betas 0.9/0.999, eps 1e-8, weight_decay) that trains one step per call (or
/// SGD with momentum, see kSgdMomentum).
class Runner {
 public:
  virtual ~Runner() = default;
  /// Runs forward, backward and the optimizer's update with learning rate `lr`; returns the loss (a double,
  /// so that float64 runners' curves keep their precision).
  virtual double step(const Batch& b, double lr) = 0;
  /// The current parameters, one vector per weight (in init_weights' order), as doubles.
  virtual std::vector<std::vector<double>> parameters() const = 0;
  /// The gradients the last step() applied, in the same form; empty when the runner does not keep them
  /// (the compiled train step).
  virtual std::vector<std::vector<double>> gradients() const { return {}; }
};

/// The libtorch 1.13 eager peer: its autograd and torch::optim::AdamW over the given weights; `f64`
/// trains in float64 (weights and inputs converted), the reference the float32 curves are measured from;
/// `sgd`: torch::optim::SGD with momentum kSgdMomentum instead of AdamW (`weight_decay` unused).
std::unique_ptr<Runner> make_torch_runner(Model m, const std::vector<Weight>& weights, const GptConfig& cfg,
                                          double weight_decay, bool f64 = false, bool sgd = false);
/// ATen's threads and OpenBLAS's pool (Debian's libtorch runs its GEMMs there) both set to n.
void torch_set_threads(int n);
/// OpenBLAS's thread count, -1 when the process has no OpenBLAS.
int torch_blas_threads();
std::string torch_version();

}  // namespace train_bench
