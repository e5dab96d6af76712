// compile_train_step and distributed::compile_train_step with the model on a CUDA device.
//
// CudaTrainStep.* (the fake driver, no GPU): Module::to moves parameters and buffers in place; the
// arenas of a model on cuda are device tensors and stay there through write_back (no device-to-host
// copy in a step); parameters on two devices are refused naming both; the whole char GPT step (joint
// forward+backward graph, AdamW update) compiles for cuda through the real NVRTC with no host step.
// CudaTrainStepGpu.* (skipped without a CUDA device): the char GPT and an MLP trained for 10 steps on
// cuda against the same model, weights and batches on the interp backend.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../../examples/char_gpt.h"
#include "backend/cuda/blas.h"
#include "backend/cuda/nvrtc.h"
#include "cache/blob_cache.h"
#include "device/fake_driver.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/distributed.h"
#include "protean/protean.h"

namespace pt = protean;
namespace bc = protean::backend::cuda;
namespace drv = protean::cuda;
namespace dist = protean::distributed;

namespace {

struct Mlp : pt::Module {
  pt::Tensor &w1, &b1, &w2, &b2;
  explicit Mlp(int64_t in = 16, int64_t hidden = 32, int64_t out = 4)
      : w1(register_parameter("w1", pt::randn({hidden, in}) * 0.2)),
        b1(register_parameter("b1", pt::randn({hidden}) * 0.1)),
        w2(register_parameter("w2", pt::randn({out, hidden}) * 0.2)),
        b2(register_parameter("b2", pt::randn({out}) * 0.1)) {}
  pt::Tensor loss(const pt::Tensor& x, const pt::Tensor& y) const {
    pt::Tensor h = pt::tanh(pt::linear(x, w1, b1));
    pt::Tensor d = pt::linear(h, w2, b2) - y;
    return pt::mean(d * d);
  }
  std::vector<pt::Tensor> params() const {
    std::vector<pt::Tensor> out;
    for (const auto& [n, t] : named_parameters()) out.push_back(t);
    return out;
  }
};

bool on_cuda(const pt::Tensor& t) { return t.device().type == pt::DeviceType::CUDA; }

/// Runs the real BLAS nowhere: the fake driver has no cuBLASLt (the products' values are not checked
/// here; the GPU tests below check them).
struct NoBlas {
  NoBlas() {
    bc::set_blas_hook_for_testing(
        [](const bc::BlasStep&, const bc::BlasShape&, const std::function<uint64_t(int)>&, drv::CUstream) {});
  }
  ~NoBlas() { bc::set_blas_hook_for_testing({}); }
};

/// An empty artifact cache for the scope, so every kernel goes through NVRTC (a cubin cached by an
/// earlier run would hide a kernel that no longer compiles).
struct FreshCacheDir {
  std::string dir;
  FreshCacheDir() {
    dir = std::filesystem::temp_directory_path() / fmt::format("protean-train-step-test-{}", ::getpid());
    std::filesystem::remove_all(dir);
    setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
    pt::cache::clear_blob_memory_cache();
  }
  ~FreshCacheDir() {
    unsetenv("PROTEAN_CACHE_DIR");
    pt::cache::clear_blob_memory_cache();
    std::filesystem::remove_all(dir);
  }
};

/// A one-rank group over device tensors (every collective keeps the values): the data-parallel step's
/// exchange without NCCL.
class SelfGroup final : public dist::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  void all_reduce(const pt::Tensor& t, dist::ReduceOp) override {
    ++reduces;
    all_on_cuda = all_on_cuda && on_cuda(t);
  }
  void broadcast(const pt::Tensor& t, int) override { all_on_cuda = all_on_cuda && on_cuda(t); }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return {mine}; }
  int reduces = 0;
  bool all_on_cuda = true;
};

TEST(CudaTrainStep, ModuleToMovesParametersAndBuffersInPlace) {
  drv::FakeDriver fake;
  pt::manual_seed(3);
  struct M : pt::Module {
    pt::Tensor &w, &b, &stat;
    M()
        : w(register_parameter("w", pt::randn({4, 3}))),
          b(register_parameter("b", pt::randn({4}))),
          stat(register_buffer("stat", pt::arange(0, 5).to(pt::DType::F32))) {}
  };
  auto m = std::make_shared<M>();
  m->w.requires_grad_();
  const std::vector<float> w0 = m->w.to_vector<float>(), s0 = m->stat.to_vector<float>();
  const pt::Tensor handle = m->w;  // another handle of the same parameter (an optimizer's)
  EXPECT_EQ(&m->to(pt::kCUDA), m.get());
  EXPECT_TRUE(on_cuda(m->w));
  EXPECT_TRUE(on_cuda(m->b));
  EXPECT_TRUE(on_cuda(m->stat));
  EXPECT_TRUE(on_cuda(handle)) << "every handle follows";
  EXPECT_EQ(handle.impl(), m->w.impl());
  EXPECT_TRUE(m->w.requires_grad());
  EXPECT_EQ(m->w.int_sizes(), (pt::IntVec{4, 3}));
  EXPECT_EQ(m->w.cpu().to_vector<float>(), w0);
  EXPECT_EQ(m->stat.cpu().to_vector<float>(), s0);
  m->to(pt::kCPU);
  EXPECT_EQ(m->w.device(), pt::kCPU);
  EXPECT_EQ(handle.to_vector<float>(), w0);
  EXPECT_EQ(m->stat.to_vector<float>(), s0);
}

TEST(CudaTrainStep, ModuleToKeepsSharedStoragesShared) {
  drv::FakeDriver fake;
  struct Tied : pt::Module {
    pt::Tensor base;
    pt::Tensor &a, &b;
    Tied() : base(pt::arange(0, 8).to(pt::DType::F32)), a(register_parameter("a", pt::slice(base, 0, 0, 4))),
             b(register_buffer("b", pt::slice(base, 0, 4, 8))) {}
  };
  auto m = std::make_shared<Tied>();
  m->to(pt::kCUDA);
  EXPECT_EQ(m->a.impl()->storage, m->b.impl()->storage) << "views of one tensor share one device storage";
  EXPECT_EQ(m->b.cpu().to_vector<float>(), (std::vector<float>{4, 5, 6, 7}));
}

TEST(CudaTrainStep, ArenasOfAModelOnCudaStayOnTheDevice) {
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  NoBlas no_blas;
  pt::reset();
  pt::manual_seed(11);
  auto model = std::make_shared<Mlp>();
  model->to(pt::kCUDA);
  pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(1e-3));
  pt::CompileOptions o;
  o.name = "mlp_step_cuda";
  o.backend = "cuda";
  o.fullgraph = true;
  auto step = pt::compile_train_step(model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt, o);
  for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(on_cuda(p)) << name;
  // The parameters are views of one device arena.
  EXPECT_EQ(model->w1.impl()->storage, model->b2.impl()->storage);
  const auto arena = model->w1.impl()->storage;
  const pt::Tensor x = pt::randn({8, 16}).to(pt::kCUDA), y = pt::randn({8, 4}).to(pt::kCUDA);
  for (int i = 0; i < 3; ++i) {
    const int64_t dtoh = fake.stats().dtoh;
    pt::Tensor loss;
    {
      pt::observe::LogCapture logs("perf_hints");
      loss = step(x, y);
      EXPECT_EQ(logs.str().find("runs on the host"), std::string::npos) << "no host step in the MLP's step:\n" << logs.str();
      EXPECT_EQ(logs.str().find("is on cpu"), std::string::npos) << "every input on the device:\n" << logs.str();
    }
    EXPECT_TRUE(on_cuda(loss));
    EXPECT_EQ(fake.stats().dtoh, dtoh) << "step " << i << ": nothing read back to the host";
    for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(on_cuda(p)) << name;
    EXPECT_EQ(model->w1.impl()->storage, arena) << "write_back keeps the arena (device-to-device copies)";
  }
  EXPECT_GT(fake.stats().dtod, 0);
}

TEST(CudaTrainStep, ParametersOnTwoDevicesAreRefused) {
  drv::FakeDriver fake;
  pt::manual_seed(1);
  auto model = std::make_shared<Mlp>();
  model->w2 = model->w2.to(pt::kCUDA);  // one member reassigned on the device, the rest on the host
  pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(1e-3));
  try {
    pt::compile_train_step(model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt,
                           {.backend = "cuda"});
    FAIL() << "parameters on two devices were accepted";
  } catch (const pt::ValueError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("parameter 'w1' is on cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("parameter 'w2' on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("Module::to"), std::string::npos) << m;
  }
}

TEST(CudaTrainStep, DataParallelStepKeepsGradientsOnTheDevice) {
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  NoBlas no_blas;
  pt::reset();
  pt::manual_seed(12);
  auto model = std::make_shared<Mlp>();
  model->to(pt::kCUDA);
  pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(1e-3));
  auto group = std::make_shared<SelfGroup>();
  auto step = dist::compile_train_step(
      model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt, group,
      {.name = "mlp_ddp_cuda", .backend = "cuda", .fullgraph = true});
  const pt::Tensor x = pt::randn({8, 16}).to(pt::kCUDA), y = pt::randn({8, 4}).to(pt::kCUDA);
  const int64_t dtoh = fake.stats().dtoh;
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(on_cuda(step(x, y)));
  EXPECT_EQ(fake.stats().dtoh, dtoh) << "no device-to-host copy in a data-parallel step";
  EXPECT_EQ(group->reduces, 2) << "one gradient arena, one all_reduce per step";
  EXPECT_TRUE(group->all_on_cuda) << "the broadcast and the all_reduce see device arenas";
  for (const pt::Tensor& a : step.parameter_arenas()) EXPECT_TRUE(on_cuda(a));
  EXPECT_EQ(step.stats().grad.compiles, 1);
  EXPECT_EQ(step.stats().update.compiles, 1);
}

/// The char GPT of examples/char_gpt.h (2 layers) with compile_train_step on backend cuda: every
/// kernel of the joint graph and the AdamW update compiles with NVRTC (a CompileError fails the test);
/// the ops that stay host steps are the perf_hints lines checked below.
TEST(CudaTrainStep, CharGptStepCompilesForCudaWithNvrtc) {
  if (!bc::nvrtc_available()) GTEST_SKIP() << "NVRTC not available: " << bc::nvrtc_unavailable_reason();
  FreshCacheDir fresh;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  NoBlas no_blas;
  pt::reset();
  pt::manual_seed(21);
  char_gpt::Config cfg;
  cfg.layers = 2;
  cfg.max_len = 64;
  auto model = std::make_shared<char_gpt::Gpt>(cfg);
  model->to(pt::kCUDA);
  pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(3e-3));
  auto step = pt::compile_train_step(
      model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt,
      {.name = "char_gpt_step_cuda", .backend = "cuda", .fullgraph = true});
  const std::vector<int64_t> text = char_gpt::corpus(4000);
  auto [x, y] = char_gpt::batch_at(text, 0, 2, 32);
  std::string hints;
  {
    pt::observe::LogCapture logs("perf_hints");
    pt::Tensor loss = step(x.to(pt::kCUDA), y.to(pt::kCUDA));
    EXPECT_TRUE(on_cuda(loss));
    // a second length: the dynamic recompile (symbolic lengths) must not bring host steps either
    auto [x2, y2] = char_gpt::batch_at(text, 0, 2, 48);
    EXPECT_TRUE(on_cuda(step(x2.to(pt::kCUDA), y2.to(pt::kCUDA))));
    hints = logs.str();
  }
  std::vector<std::string> host_steps;
  for (size_t at = hints.find("cuda: "); at != std::string::npos; at = hints.find("cuda: ", at + 1)) {
    const size_t end = hints.find(" runs on the host", at);
    if (end != std::string::npos && hints.find('\n', at) > end) host_steps.push_back(hints.substr(at + 6, end - at - 6));
  }
  std::sort(host_steps.begin(), host_steps.end());
  // Every op of a transformer's training step runs on the device (docs/training.md): embedding and
  // index_add, gather and scatter_add as extern kernels, the f32 attention backward decomposed.
  std::printf("char GPT train step host steps (%zu): %s\n", host_steps.size(), fmt::format("{}", fmt::join(host_steps, ", ")).c_str());
  EXPECT_TRUE(host_steps.empty()) << "host steps: " << fmt::format("{}", fmt::join(host_steps, ", ")) << "\n" << hints;
  EXPECT_EQ(hints.find("is on cpu"), std::string::npos) << "every input on the device:\n" << hints;
  for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(on_cuda(p)) << name;
}

// ---- on a real GPU ----------------------------------------------------------------------------------

struct Curve {
  std::vector<double> losses;
  std::vector<std::pair<std::string, std::vector<float>>> params;
};

template <typename M, typename MakeModel, typename Batch>
Curve train(const std::string& backend, MakeModel make_model, Batch batch, int steps, double lr) {
  pt::reset();
  std::shared_ptr<M> model = make_model();
  const bool cuda = backend == "cuda";
  if (cuda) model->to(pt::kCUDA);
  pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(lr));
  pt::CompileOptions o;
  o.name = "train_" + backend;
  o.backend = backend;
  o.fullgraph = true;
  auto step = pt::compile_train_step(model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt, o);
  Curve c;
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = batch(i);
    if (cuda) x = x.to(pt::kCUDA), y = y.to(pt::kCUDA);
    const pt::Tensor loss = step(x, y).cpu().to(pt::DType::F64);
    c.losses.push_back(loss.item<double>());
  }
  for (const auto& [name, p] : model->named_parameters()) {
    EXPECT_EQ(on_cuda(p), cuda) << name;
    const pt::Tensor host = p.cpu().contiguous();
    c.params.emplace_back(name, host.to_vector<float>());
  }
  return c;
}

/// Loss: relative 1e-4 per step (f32 forward sums over ≤ 64·32·64 terms in another order: a few ulp of
/// the loss). Parameters: AdamW moves each element by at most about lr per step, whatever its
/// gradient, and rounding-level gradient differences change that move by a few ulp except where the
/// gradient is near AdamW's eps; so a difference above lr (one whole step) after 10 steps is a wrong
/// result, not rounding. The largest differences are printed.
void expect_same_training(const Curve& cuda, const Curve& interp, double lr) {
  ASSERT_EQ(cuda.losses.size(), interp.losses.size());
  double worst_loss = 0, worst_param = 0;
  std::string worst_name;
  for (size_t i = 0; i < cuda.losses.size(); ++i) {
    const double d = std::abs(cuda.losses[i] - interp.losses[i]);
    worst_loss = std::max(worst_loss, d);
    EXPECT_LE(d, 1e-4 * std::max(1.0, std::abs(interp.losses[i])))
        << "step " << i << ": cuda " << cuda.losses[i] << " vs interp " << interp.losses[i];
  }
  ASSERT_EQ(cuda.params.size(), interp.params.size());
  for (size_t k = 0; k < cuda.params.size(); ++k) {
    const auto& [name, a] = cuda.params[k];
    const auto& b = interp.params[k].second;
    ASSERT_EQ(a.size(), b.size()) << name;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::abs(static_cast<double>(a[i]) - b[i]);
      if (d > worst_param) worst_param = d, worst_name = name;
    }
  }
  EXPECT_LE(worst_param, lr) << "largest parameter difference in " << worst_name;
  EXPECT_LT(cuda.losses.back(), cuda.losses.front()) << "the model learns";
  std::printf("cuda vs interp over %zu steps: largest loss difference %.3g, largest parameter difference %.3g (%s)\n",
              cuda.losses.size(), worst_loss, worst_param, worst_name.c_str());
}

TEST(CudaTrainStepGpu, CharGptTrainsLikeInterp) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  char_gpt::Config cfg;
  cfg.layers = 2;
  cfg.max_len = 64;
  auto make = [&] {
    pt::manual_seed(7);
    return std::make_shared<char_gpt::Gpt>(cfg);
  };
  const std::vector<int64_t> text = char_gpt::corpus(20000);
  auto batch = [&](int i) { return char_gpt::batch_at(text, 4 * i, 4, 48); };
  const double lr = 1e-3;
  const Curve interp = train<char_gpt::Gpt>("interp", make, batch, 10, lr);
  const Curve cuda = train<char_gpt::Gpt>("cuda", make, batch, 10, lr);
  expect_same_training(cuda, interp, lr);
}

TEST(CudaTrainStepGpu, MlpTrainsLikeInterp) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  auto make = [] {
    pt::manual_seed(8);
    return std::make_shared<Mlp>(64, 256, 8);
  };
  auto batch = [](int i) {
    pt::manual_seed(100 + static_cast<uint64_t>(i));
    pt::Tensor x = pt::randn({32, 64});
    return std::make_pair(x, pt::sin(pt::slice(x, 1, 0, 8)));
  };
  const double lr = 1e-3;
  const Curve interp = train<Mlp>("interp", make, batch, 10, lr);
  const Curve cuda = train<Mlp>("cuda", make, batch, 10, lr);
  expect_same_training(cuda, interp, lr);
}

}  // namespace
