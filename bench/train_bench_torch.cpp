// The libtorch peer of bench/train_bench.cpp: the same four models written with libtorch 1.13's C++
// API (functional ops over registered parameters), its autograd and torch::optim::AdamW. Attention is
// written out (q·kᵀ·scale, causal mask, softmax, ·v): libtorch 1.13 has no public SDPA.
#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "train_bench.h"

namespace train_bench {
namespace {

class TorchRunner final : public Runner {
 public:
  TorchRunner(Model m, const std::vector<Weight>& weights, const GptConfig& cfg, double wd, bool f64, bool sgd)
      : model_(m), cfg_(cfg), dtype_(f64 ? torch::kFloat64 : torch::kFloat32), sgd_(sgd) {
    for (const Weight& w : weights) {
      torch::Tensor t = torch::from_blob(const_cast<float*>(w.data.data()), w.shape, torch::kFloat32).to(dtype_, /*non_blocking=*/false, /*copy=*/true);
      t.requires_grad_(true);
      params_.push_back(t);
    }
    if (m == Model::CnnBn)  // running statistics of bn1 and bn2 (torch.nn.BatchNorm2d's buffers)
      for (int64_t c : {6, 16}) {
        stats_.push_back(torch::zeros({c}, dtype_));
        stats_.push_back(torch::ones({c}, dtype_));
      }
    if (sgd) {
      torch::optim::SGDOptions o(1e-3);
      o.momentum(kSgdMomentum);
      opt_ = std::make_unique<torch::optim::SGD>(params_, o);
    } else {
      torch::optim::AdamWOptions o(1e-3);
      o.betas({0.9, 0.999}).eps(1e-8).weight_decay(wd);
      opt_ = std::make_unique<torch::optim::AdamW>(params_, o);
    }
  }

  double step(const Batch& b, double lr) override {
    if (sgd_) static_cast<torch::optim::SGDOptions&>(opt_->param_groups()[0].options()).lr(lr);
    else static_cast<torch::optim::AdamWOptions&>(opt_->param_groups()[0].options()).lr(lr);
    opt_->zero_grad();
    torch::Tensor loss;
    switch (model_) {
      case Model::Mlp: loss = mlp(b); break;
      case Model::Cnn: loss = cnn(b); break;
      case Model::CnnBn: loss = cnn_bn(b); break;
      case Model::Gpt: loss = gpt(b); break;
    }
    loss.backward();
    opt_->step();
    return loss.to(torch::kFloat64).item<double>();
  }
  std::vector<std::vector<double>> parameters() const override {
    std::vector<std::vector<double>> r;
    for (const torch::Tensor& p : params_) {
      torch::Tensor c = p.detach().to(torch::kFloat64).contiguous();
      r.emplace_back(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    }
    return r;
  }
  std::vector<std::vector<double>> gradients() const override {
    std::vector<std::vector<double>> r;
    for (const torch::Tensor& p : params_) {
      torch::Tensor c = p.grad().detach().to(torch::kFloat64).contiguous();
      r.emplace_back(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
    }
    return r;
  }

 private:
  torch::Tensor x_of(const Batch& b) {
    return torch::from_blob(const_cast<float*>(b.x.data()), b.x_shape, torch::kFloat32).to(dtype_);
  }
  torch::Tensor y_of(const Batch& b) {
    return torch::from_blob(const_cast<int64_t*>(b.y.data()), {static_cast<int64_t>(b.y.size())}, torch::kInt64);
  }
  torch::Tensor mlp(const Batch& b) {
    auto& p = params_;
    torch::Tensor h = torch::relu(torch::linear(x_of(b), p[0], p[1]));
    h = torch::relu(torch::linear(h, p[2], p[3]));
    return torch::nll_loss(torch::log_softmax(torch::linear(h, p[4], p[5]), 1), y_of(b));
  }
  torch::Tensor cnn_bn(const Batch& b) {
    auto& p = params_;
    auto bn = [&](const torch::Tensor& h, size_t w, size_t st) {
      return torch::batch_norm(h, p[w], p[w + 1], stats_[st], stats_[st + 1], /*training=*/true, 0.1, 1e-5,
                               /*cudnn_enabled=*/false);
    };
    torch::Tensor h = torch::max_pool2d(torch::relu(bn(torch::conv2d(x_of(b), p[0], p[1], 1, 2), 2, 0)), 2);
    h = torch::max_pool2d(torch::relu(bn(torch::conv2d(h, p[4], p[5]), 6, 2)), 2);
    h = torch::flatten(h, 1);
    h = torch::relu(torch::linear(h, p[8], p[9]));
    h = torch::relu(torch::linear(h, p[10], p[11]));
    return torch::nll_loss(torch::log_softmax(torch::linear(h, p[12], p[13]), 1), y_of(b));
  }
  torch::Tensor cnn(const Batch& b) {
    auto& p = params_;
    torch::Tensor h = torch::max_pool2d(torch::relu(torch::conv2d(x_of(b), p[0], p[1], 1, 2)), 2);
    h = torch::max_pool2d(torch::relu(torch::conv2d(h, p[2], p[3])), 2);
    h = torch::flatten(h, 1);
    h = torch::relu(torch::linear(h, p[4], p[5]));
    h = torch::relu(torch::linear(h, p[6], p[7]));
    return torch::nll_loss(torch::log_softmax(torch::linear(h, p[8], p[9]), 1), y_of(b));
  }
  torch::Tensor gpt(const Batch& b) {
    auto& p = params_;
    const int64_t B = b.x_shape[0], T = b.x_shape[1], d = cfg_.d, H = cfg_.heads, dh = d / H;
    torch::Tensor tok = torch::from_blob(const_cast<int64_t*>(b.tokens.data()), {B, T}, torch::kInt64);
    torch::Tensor h = torch::embedding(p[0], tok) + p[1].slice(0, 0, T);
    torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);
    size_t k = 2;
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      torch::Tensor a = torch::layer_norm(h, {d}, p[k], p[k + 1], 1e-5);
      torch::Tensor qkv = torch::linear(a, p[k + 2], p[k + 3]);
      auto parts = qkv.chunk(3, 2);
      auto heads = [&](const torch::Tensor& t) { return t.reshape({B, T, H, dh}).transpose(1, 2); };
      torch::Tensor q = heads(parts[0]), kk = heads(parts[1]), v = heads(parts[2]);
      torch::Tensor s = torch::matmul(q, kk.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(dh)));
      s = s.masked_fill(mask, -std::numeric_limits<float>::infinity());
      torch::Tensor o = torch::matmul(torch::softmax(s, -1), v).transpose(1, 2).reshape({B, T, d});
      h = h + torch::linear(o, p[k + 4], p[k + 5]);
      torch::Tensor m = torch::layer_norm(h, {d}, p[k + 6], p[k + 7], 1e-5);
      h = h + torch::linear(torch::gelu(torch::linear(m, p[k + 8], p[k + 9])), p[k + 10], p[k + 11]);
      k += 12;
    }
    h = torch::layer_norm(h, {d}, p[k], p[k + 1], 1e-5);
    torch::Tensor logits = torch::linear(h, p[k + 2]).reshape({B * T, cfg_.vocab});
    return torch::nll_loss(torch::log_softmax(logits, 1), y_of(b));
  }

  Model model_;
  GptConfig cfg_;
  torch::ScalarType dtype_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> stats_;  // CnnBn: running mean and variance of bn1, then of bn2
  bool sgd_;
  std::unique_ptr<torch::optim::Optimizer> opt_;
};

}  // namespace

std::unique_ptr<Runner> make_torch_runner(Model m, const std::vector<Weight>& weights, const GptConfig& cfg,
                                          double weight_decay, bool f64, bool sgd) {
  return std::make_unique<TorchRunner>(m, weights, cfg, weight_decay, f64, sgd);
}
// at::set_num_threads sets ATen's OpenMP threads only; Debian's libtorch does its GEMMs in OpenBLAS
// (pthreads build), whose own pool keeps every core: a "1 thread" libtorch step used 1.74 CPUs. The
// pool is set too, through OpenBLAS's entry point found at run time (libtorch loads the library).
void torch_set_threads(int n) {
  at::set_num_threads(n);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) f(n);
}
/// The OpenBLAS threads in use (-1 when OpenBLAS is not loaded): recorded in the JSON.
int torch_blas_threads() {
  using GetThreads = int (*)();
  auto f = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return f ? f() : -1;
}
std::string torch_version() { return TORCH_VERSION; }

}  // namespace train_bench
