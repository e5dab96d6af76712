// torch.optim's SGD / Adam / AdamW equations against float64 references written out here, element by
// element, over several steps with changing gradients (and a learning rate changed between steps).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "core/host_blocks.h"
#include "protean/autograd.h"
#include "protean/distributed.h"
#include "protean/optim.h"
#include "protean/protean.h"
#include "protean/tensor_version.h"

namespace pt = protean;
namespace dist = protean::distributed;
using pt::Tensor;

namespace {

std::vector<double> random_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<double> d(0, 1);
  std::vector<double> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

struct SgdRef {
  pt::optim::SGDOptions o;
  std::vector<double> buf;
  bool has_buf = false;
  void step(std::vector<double>& p, std::vector<double> g) {
    for (size_t i = 0; i < p.size(); ++i) {
      if (o.maximize) g[i] = -g[i];
      g[i] += o.weight_decay * p[i];
    }
    if (o.momentum != 0) {
      if (!has_buf) buf = g, has_buf = true;
      else
        for (size_t i = 0; i < p.size(); ++i) buf[i] = o.momentum * buf[i] + (1 - o.dampening) * g[i];
      for (size_t i = 0; i < p.size(); ++i) g[i] = o.nesterov ? g[i] + o.momentum * buf[i] : buf[i];
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= o.lr * g[i];
  }
};

struct AdamRef {
  pt::optim::AdamOptions o;
  bool decoupled = false;
  std::vector<double> m, v, vmax;
  int64_t t = 0;
  void step(std::vector<double>& p, std::vector<double> g) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0), vmax.assign(p.size(), 0);
    ++t;
    const double b1 = o.betas.first, b2 = o.betas.second;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      if (o.maximize) g[i] = -g[i];
      if (decoupled) p[i] *= 1 - o.lr * o.weight_decay;
      else g[i] += o.weight_decay * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double vv = v[i];
      if (o.amsgrad) vmax[i] = std::max(vmax[i], v[i]), vv = vmax[i];
      double denom = std::sqrt(vv) / std::sqrt(bc2) + o.eps;
      p[i] -= o.lr / bc1 * m[i] / denom;
    }
  }
};

template <typename Opt, typename Ref, typename SetLr>
void run_against(Opt& opt, Ref& ref, Tensor& p, std::vector<double>& pr, SetLr set_lr, const std::string& what) {
  SCOPED_TRACE(what);
  for (int s = 0; s < 6; ++s) {
    double lr = 0.1 / (1 + s);
    set_lr(lr);
    auto g = random_vec(pr.size(), 100 + static_cast<uint32_t>(s));
    p.set_grad(pt::tensor<double>(g, p.int_sizes()));
    opt.step();
    ref.step(pr, g);
    auto got = p.to_vector<double>();
    for (size_t i = 0; i < pr.size(); ++i) ASSERT_NEAR(got[i], pr[i], 1e-12 * std::max(1.0, std::abs(pr[i]))) << "step " << s;
  }
}

TEST(Optim, SgdVariantsMatchTorchEquations) {
  std::vector<pt::optim::SGDOptions> cases = {
      {.lr = 0.1},
      {.lr = 0.1, .momentum = 0.9},
      {.lr = 0.1, .momentum = 0.9, .dampening = 0.3, .weight_decay = 0.01},
      {.lr = 0.1, .momentum = 0.8, .weight_decay = 0.05, .nesterov = true},
      {.lr = 0.1, .momentum = 0.5, .maximize = true},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    auto init = random_vec(6, 7);
    Tensor p = pt::tensor<double>(init, {2, 3});
    p.requires_grad_();
    pt::optim::SGD opt({p}, cases[k]);
    SgdRef ref;
    ref.o = cases[k];
    auto pr = init;
    run_against(opt, ref, p, pr, [&](double lr) { opt.param_groups[0].options.lr = lr, ref.o.lr = lr; },
                "sgd case " + std::to_string(k));
  }
}

TEST(Optim, AdamAndAdamWMatchTorchEquations) {
  std::vector<pt::optim::AdamOptions> cases = {
      {},
      {.lr = 0.01, .betas = {0.8, 0.99}, .eps = 1e-6, .weight_decay = 0.1},
      {.lr = 0.01, .weight_decay = 0.02, .amsgrad = true},
      {.lr = 0.01, .maximize = true},
  };
  for (bool decoupled : {false, true})
    for (size_t k = 0; k < cases.size(); ++k) {
      auto init = random_vec(5, 9);
      Tensor p = pt::tensor<double>(init, {5});
      p.requires_grad_();
      auto pr = init;
      AdamRef ref;
      ref.o = cases[k];
      ref.decoupled = decoupled;
      std::string what = std::string(decoupled ? "adamw" : "adam") + " case " + std::to_string(k);
      if (decoupled) {
        pt::optim::AdamW opt({p}, cases[k]);
        run_against(opt, ref, p, pr, [&](double lr) { opt.param_groups[0].options.lr = lr, ref.o.lr = lr; }, what);
        EXPECT_EQ(opt.state(p).step, 6);
        EXPECT_TRUE(opt.state(p).buffers.at("exp_avg").defined());
      } else {
        pt::optim::Adam opt({p}, cases[k]);
        run_against(opt, ref, p, pr, [&](double lr) { opt.param_groups[0].options.lr = lr, ref.o.lr = lr; }, what);
      }
    }
}

// torch.optim's AdamW on float32 tensors, op by op as ATen runs it: every tensor op rounds to float, and
// the scalars (1 - beta1, 1 - beta2, 1 - lr·wd, lr / bc1) are computed in double and rounded to float
// once. Computing them from float operands instead (1 - 0.999f) puts exp_avg_sq 1.3e-5 off, which the
// MLP of bench/train_bench.cpp turns into a loss curve 6e-3 away from libtorch's within 50 steps.
struct AdamWF32Ref {
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  std::vector<float> m, v;
  int64_t t = 0;
  void step(std::vector<float>& p, const std::vector<float>& g) {
    if (m.empty()) m.assign(p.size(), 0), v.assign(p.size(), 0);
    ++t;
    const double bc1 = 1 - std::pow(b1, static_cast<double>(t)), bc2 = 1 - std::pow(b2, static_cast<double>(t));
    const auto f = [](double x) { return static_cast<float>(x); };
    for (size_t i = 0; i < p.size(); ++i) {
      volatile float x = p[i] * f(1 - lr * wd);  // volatile: no contraction into fused multiply-adds
      p[i] = x;
      volatile float a = f(b1) * m[i], b = f(1 - b1) * g[i];
      m[i] = a + b;
      volatile float c = f(b2) * v[i], d = f(1 - b2) * g[i];
      volatile float e = d * g[i];
      v[i] = c + e;
      volatile float r = std::sqrt(v[i]) / f(std::sqrt(bc2));
      volatile float denom = r + f(eps);
      volatile float num = f(-(lr / bc1)) * m[i];
      volatile float q = num / denom;
      p[i] = p[i] + q;
    }
  }
};

std::vector<float> random_vec_f32(size_t n, uint32_t seed, double scale) {
  std::vector<float> r;
  for (double x : random_vec(n, seed)) r.push_back(static_cast<float>(scale * x));
  return r;
}

TEST(Optim, AdamWOnF32RoundsLikeTorch) {
  const size_t n = 4096;
  auto init = random_vec_f32(n, 11, 0.05);
  Tensor p = pt::tensor<float>(init, {static_cast<int64_t>(n)});
  p.requires_grad_();
  pt::optim::AdamW opt({p}, {.lr = 1e-3, .weight_decay = 0.01});
  AdamWF32Ref ref;
  std::vector<float> pr = init;
  for (int s = 0; s < 20; ++s) {
    const double lr = 1e-3 * (1.0 - 0.03 * s);
    opt.param_groups[0].options.lr = lr;
    ref.lr = lr;
    auto g = random_vec_f32(n, 300 + static_cast<uint32_t>(s), 1e-3);
    p.set_grad(pt::tensor<float>(g, {static_cast<int64_t>(n)}));
    opt.step();
    ref.step(pr, g);
  }
  // Op-by-op eager arithmetic is the same float arithmetic: equal to the last bit.
  auto got = p.to_vector<float>();
  auto m = opt.state(p).buffers.at("exp_avg").to_vector<float>();
  auto v = opt.state(p).buffers.at("exp_avg_sq").to_vector<float>();
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(m[i], ref.m[i]) << "exp_avg " << i;
    ASSERT_EQ(v[i], ref.v[i]) << "exp_avg_sq " << i;
    ASSERT_EQ(got[i], pr[i]) << "param " << i;
  }
}

TEST(Optim, CompiledAdamWUpdateOnF32RoundsLikeTorch) {
  // The update compile_train_step traces, compiled for cpu: within a few ulp of torch's float
  // arithmetic (the generated code may divide by a scalar as a multiply by its reciprocal).
  const size_t n = 4096;
  auto init = random_vec_f32(n, 12, 0.05);
  Tensor p = pt::tensor<float>(init, {static_cast<int64_t>(n)}), m = pt::zeros({static_cast<int64_t>(n)}),
         v = pt::zeros({static_cast<int64_t>(n)});
  pt::optim::AdamW opt({p}, {.lr = 1e-3, .weight_decay = 0.01});
  auto upd = pt::compile(
      [&opt](Tensor p, Tensor g, Tensor m, Tensor v, Tensor hyper) {
        auto [np, ns] = opt.update(p, g, {m, v}, hyper, 0);
        return std::make_tuple(np, ns[0], ns[1]);
      },
      {.name = "adamw_f32_update", .backend = "cpu"});
  AdamWF32Ref ref;
  std::vector<float> pr = init;
  auto ulps = [](float a, float b) {
    int32_t ia, ib;
    std::memcpy(&ia, &a, 4);
    std::memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return a == b ? 0L : 1000000L;
    return std::abs(static_cast<long>(ia) - static_cast<long>(ib));
  };
  long worst_v = 0;
  double worst_p = 0;
  for (int s = 0; s < 20; ++s) {
    const double lr = 1e-3 * (1.0 - 0.03 * s);
    opt.param_groups[0].options.lr = lr;
    ref.lr = lr;
    auto g = random_vec_f32(n, 400 + static_cast<uint32_t>(s), 1e-3);
    std::vector<double> h = opt.hyperparameters(0);
    h.push_back(static_cast<double>(s + 1));
    auto [np, nm, nv] = upd(p, pt::tensor<float>(g, {static_cast<int64_t>(n)}), m, v, pt::tensor<double>(h, {6}));
    p = np, m = nm, v = nv;
    ref.step(pr, g);
    auto vs = v.to_vector<float>();
    auto ps = p.to_vector<float>();
    for (size_t i = 0; i < n; ++i) {
      worst_v = std::max(worst_v, ulps(vs[i], ref.v[i]));
      worst_p = std::max(worst_p, static_cast<double>(std::abs(ps[i] - pr[i])));
    }
  }
  EXPECT_LE(worst_v, 2) << "exp_avg_sq";
  RecordProperty("worst_param_abs_diff", std::to_string(worst_p));
  std::printf("compiled AdamW f32: worst exp_avg_sq %ld ulp, worst param |diff| %.3g\n", worst_v, worst_p);
  // |p| <= 0.25 here (ulp 1.5e-8): a few ulp over 20 steps; a wrong 1 - beta2 moves it by 1e-7.
  EXPECT_LE(worst_p, 6e-8) << "param";
}

TEST(Optim, F32ParametersStayInPlaceAndSkipMissingGrads) {
  Tensor a = pt::ones({3}), b = pt::ones({2});
  a.requires_grad_();
  b.requires_grad_();
  void* storage = a.data_ptr();
  pt::optim::SGD opt({a, b}, {.lr = 0.5});
  pt::sum(a * 2.0).backward();
  opt.step();
  EXPECT_EQ(a.data_ptr(), storage);  // updated in place
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{1, 1}));  // no grad: skipped
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  pt::sum(a).backward();
  opt.zero_grad(false);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

TEST(Optim, ParamGroupsHaveTheirOwnOptions) {
  Tensor a = pt::ones({2}), b = pt::ones({2});
  a.requires_grad_();
  b.requires_grad_();
  pt::optim::SGD opt(std::vector<pt::optim::ParamGroup<pt::optim::SGDOptions>>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 1.0}}});
  pt::sum(a + b).backward();
  opt.step();
  EXPECT_NEAR(a.to_vector<float>()[0], 0.9f, 1e-6);
  EXPECT_NEAR(b.to_vector<float>()[0], 0.0f, 1e-6);
}

TEST(Optim, InvalidOptionsAreValueErrors) {
  Tensor p = pt::ones({2});
  EXPECT_THROW(pt::optim::SGD({p}, {.lr = -1}), pt::ValueError);
  EXPECT_THROW(pt::optim::SGD({p}, {.lr = 0.1, .nesterov = true}), pt::ValueError);
  EXPECT_THROW(pt::optim::Adam({p}, {.betas = {1.0, 0.9}}), pt::ValueError);
  EXPECT_THROW(pt::optim::AdamW({pt::tensor<int64_t>({1}, {1})}, {}), pt::TypeError);
}

TEST(Optim, AnOptimizerNeedsParameters) {
  // torch.optim: "optimizer got an empty parameter list".
  try {
    pt::optim::SGD opt(std::vector<Tensor>{}, {.lr = 0.1});
    FAIL() << "no error";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("SGD: optimizer got an empty parameter list"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::optim::AdamW(std::vector<Tensor>{}, pt::optim::AdamWOptions()), pt::ValueError);
}

TEST(Optim, StructuralOptionsArePerParamGroup) {
  // Two groups in one optimizer update each parameter as two optimizers of one group each would
  // (torch.optim reads amsgrad, maximize, nesterov and momentum per group).
  pt::manual_seed(5);
  Tensor a0 = pt::randn({3}), d0 = pt::randn({3});
  auto run = [&](bool grouped, auto make_opts, auto make_opt) {
    Tensor a = a0.clone(), d = d0.clone();
    a.requires_grad_();
    d.requires_grad_();
    auto [oa, od] = make_opts();
    std::vector<std::unique_ptr<pt::optim::Optimizer>> opts;
    if (grouped) opts.push_back(make_opt({{{a}, oa}, {{d}, od}}));
    else {
      opts.push_back(make_opt({{{a}, oa}}));
      opts.push_back(make_opt({{{d}, od}}));
    }
    for (int i = 0; i < 4; ++i) {
      for (auto& o : opts) o->zero_grad();
      pt::sum(pt::tanh(a * d) * (1.0 + i)).backward();
      for (auto& o : opts) o->step();
    }
    return std::pair{a.detach(), d.detach()};
  };
  using AG = pt::optim::ParamGroup<pt::optim::AdamOptions>;
  auto adam_opts = [] {
    return std::pair{pt::optim::AdamOptions{.lr = 0.1}, pt::optim::AdamOptions{.lr = 0.1, .amsgrad = true, .maximize = true}};
  };
  auto adam = [](std::vector<AG> g) { return std::make_unique<pt::optim::Adam>(std::move(g)); };
  auto [ga, gd] = run(true, adam_opts, adam);
  auto [sa, sd] = run(false, adam_opts, adam);
  EXPECT_LE(pt::max_abs_diff(ga, sa), 1e-7);
  EXPECT_LE(pt::max_abs_diff(gd, sd), 1e-7);
  using SG = pt::optim::ParamGroup<pt::optim::SGDOptions>;
  auto sgd_opts = [] {
    return std::pair{pt::optim::SGDOptions{.lr = 0.1, .dampening = 0.5},
                     pt::optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}};
  };
  auto sgd = [](std::vector<SG> g) { return std::make_unique<pt::optim::SGD>(std::move(g)); };
  auto [ha, hd] = run(true, sgd_opts, sgd);
  auto [ta, td] = run(false, sgd_opts, sgd);
  EXPECT_LE(pt::max_abs_diff(ha, ta), 1e-7);
  EXPECT_LE(pt::max_abs_diff(hd, td), 1e-7);
}

}  // namespace

namespace {
struct TwoLayer : pt::Module {
  Tensor &w, &b, &unused;
  TwoLayer()
      : w(register_parameter("w", pt::randn({3, 4}))), b(register_parameter("b", pt::randn({3}))),
        unused(register_parameter("unused", pt::randn({5}))) {}
  Tensor loss(const Tensor& x, const Tensor& y) { return pt::mean((pt::linear(x, w, b) - y) * (pt::linear(x, w, b) - y)); }
};
/// An eager twin of `m` (the same values, separate storage, requiring grad).
std::shared_ptr<TwoLayer> eager_twin(const TwoLayer& m) {
  auto e = std::make_shared<TwoLayer>();
  for (auto [dst, src] : {std::pair{&e->w, &m.w}, std::pair{&e->b, &m.b}, std::pair{&e->unused, &m.unused}}) {
    std::memcpy(dst->data_ptr(), src->contiguous().data_ptr(), static_cast<size_t>(src->int_numel()) * sizeof(float));
    dst->requires_grad_();
  }
  return e;
}

/// One eager training step of `m` with `opt` on (x, y).
void eager_step(pt::optim::Optimizer& opt, TwoLayer& m, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  m.loss(x, y).backward();
  opt.step();
}

/// A group of one rank: collectives leave the tensors as they are (the average of one rank).
class OneRank final : public dist::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "one-rank"; }
  void all_reduce(const Tensor&, dist::ReduceOp) override { ++all_reduces; }
  void broadcast(const Tensor&, int) override {}
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return {mine}; }
  int all_reduces = 0;
};
}  // namespace

// A compiled step that throws (a batch of the wrong dtype, of the wrong width) does not count: the
// step count, and with it Adam's bias correction, stays where eager's is, and later steps agree.
TEST(CompiledTrainStep, AFailedStepDoesNotCount) {
  pt::manual_seed(4);
  auto c = std::make_shared<TwoLayer>();
  auto e = eager_twin(*c);
  pt::optim::Adam eopt({e->w, e->b}, pt::optim::AdamOptions(0.01));
  pt::optim::Adam copt({c->w, c->b}, pt::optim::AdamOptions(0.01));
  auto step = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, copt,
                                     {.name = "failing_step", .backend = "interp"});
  for (int i = 0; i < 5; ++i) {
    Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
    if (i == 1) {
      EXPECT_THROW(step(pt::cast(x, pt::DType::F64), y), pt::Error);
    }
    if (i == 2) {
      EXPECT_THROW(step(pt::randn({6, 5}), y), pt::Error);
    }
    eager_step(eopt, *e, x, y);
    step(x, y);
  }
  EXPECT_EQ(copt.state(c->w).step, eopt.state(e->w).step);
  EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6);
  EXPECT_LE(pt::max_abs_diff(c->b, e->b.detach()), 1e-6);
}

// A parameter the loss does not reach is skipped as torch.optim skips one whose .grad is None: no
// weight decay, no momentum, its state untouched (it was decayed by the compiled step before).
TEST(CompiledTrainStep, AParameterTheLossDoesNotReachIsLeftAlone) {
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    pt::manual_seed(5);
    auto c = std::make_shared<TwoLayer>();
    auto e = eager_twin(*c);
    pt::optim::AdamOptions o = pt::optim::AdamWOptions(0.01);
    o.weight_decay = 0.1;
    pt::optim::AdamW eopt({e->w, e->b, e->unused}, o), copt({c->w, c->b, c->unused}, o);
    auto step = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, copt,
                                       {.name = "unused_param_step", .backend = backend});
    const Tensor before = c->unused.clone();
    for (int i = 0; i < 4; ++i) {
      Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
      eager_step(eopt, *e, x, y);
      step(x, y);
    }
    EXPECT_EQ(pt::max_abs_diff(c->unused, before), 0.0);
    EXPECT_EQ(pt::max_abs_diff(e->unused.detach(), before), 0.0);
    EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6);
  }
}

// The cpu backend writes an output into a donated input's memory only when nothing reads that input
// afterwards; an input the step returns as it is (an arena of a param group without gradients, a
// momentum buffer a group does not use, a buffer the step only reads) is read by the caller after
// the call, so it is not a donor. The step wrote another result of the same size into it: the unused
// parameter took its group's momentum, the read-only buffer the loss.
TEST(CompiledTrainStep, InputsReturnedUnchangedAreNotOverwritten) {
  struct Net : pt::Module {
    Tensor& a = register_parameter("a", pt::randn({4}));
    Tensor& b = register_parameter("b", pt::randn({4}));  // the loss does not use it
    Tensor& scale = register_buffer("scale", pt::full({}, 2.0));
  };
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    pt::manual_seed(6);
    auto net = std::make_shared<Net>();
    const Tensor b0 = net->b.clone();
    using SO = pt::optim::SGDOptions;
    pt::optim::SGD opt({{{net->a}, SO{.lr = 0.1, .momentum = 0.9}}, {{net->b}, SO{.lr = 0.1, .momentum = 0.9}}});
    auto step = pt::compile_train_step(net, [&](Tensor x) { return pt::sum(net->a * x) * net->scale; }, opt,
                                       {.name = std::string("passthrough_step_") + backend, .backend = backend});
    Tensor a = net->a.clone(), buf = pt::zeros({4});
    for (int i = 0; i < 3; ++i) {
      Tensor x = pt::full({4}, 1.0 + i);
      Tensor loss = step(x);
      EXPECT_NEAR(loss.item<double>(), pt::sum(a * x).item<double>() * 2.0, 1e-5) << "step " << i;
      buf = i == 0 ? x * 2.0 : buf * 0.9 + x * 2.0;  // torch's SGD momentum: the first buffer is the gradient
      a = a - buf * 0.1;
    }
    EXPECT_LE(pt::max_abs_diff(net->a, a), 1e-5);
    EXPECT_EQ(pt::max_abs_diff(net->b, b0), 0.0) << "the parameter without a gradient changed";
    EXPECT_EQ(net->scale.item<float>(), 2.0f) << "the read-only buffer changed";
  }
}

// compile_train_step moves the parameters' values into its flat arena: their old blocks go back to
// the system instead of into the cache of freed blocks, where they would stay resident for good (the
// step never asks for their sizes again).
TEST(CompiledTrainStep, ParameterBlocksMovedIntoTheArenaGoBackToTheSystem) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "large blocks come from malloc under AddressSanitizer (nothing is kept)";
#else
  struct Net : pt::Module {
    Tensor& a = register_parameter("a", pt::randn({1024, 1024}));  // 4 MiB
    Tensor& b = register_parameter("b", pt::randn({768, 1024}));   // 3 MiB
  };
  pt::manual_seed(8);
  auto net = std::make_shared<Net>();
  pt::optim::SGD opt(net->parameters(), pt::optim::SGDOptions{.lr = 0.1});
  const Tensor a0 = net->a.clone();
  const size_t before = pt::core::returned_host_block_bytes();
  auto step = pt::compile_train_step(net, [&](Tensor x) { return (pt::sum(net->a) + pt::sum(net->b)) * x; }, opt,
                                     {.name = "arena_blocks_step", .backend = "interp"});
  step(pt::full({}, 1.0));
  EXPECT_GE(pt::core::returned_host_block_bytes(), before + (size_t{7} << 20)) << "the 4 and 3 MiB blocks were kept";
  EXPECT_LE(pt::max_abs_diff(net->a, a0 - 0.1), 1e-6) << "the parameter still reads its (updated) values";
#endif
}

// A weight registered under two names (tied) is one parameter: Module::parameters() lists it once, as
// torch's parameters() does, and an optimizer refuses a parameter given twice (it would be updated
// twice per step), in one group or in two.
TEST(Optim, ATiedWeightIsOneParameter) {
  struct Tied : pt::Module {
    Tensor& emb = register_parameter("emb", pt::randn({5, 3}));
    Tensor& head = register_parameter("head", emb);  // the same TensorImpl
    Tensor& b = register_parameter("b", pt::zeros({5}));
  };
  auto m = std::make_shared<Tied>();
  ASSERT_EQ(m->named_parameters().size(), 3u);
  std::vector<Tensor> ps = m->parameters();
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].impl(), m->emb.impl());
  EXPECT_EQ(ps[1].impl(), m->b.impl());
  EXPECT_NO_THROW(pt::optim::SGD(ps, {.lr = 0.1}));
  try {
    pt::optim::SGD bad({m->emb, m->b, m->head}, {.lr = 0.1});
    ADD_FAILURE() << "a parameter given twice was accepted";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 2 of param group 0 appears twice in that group"), std::string::npos) << e.what();
  }
  using AO = pt::optim::AdamOptions;
  EXPECT_THROW(pt::optim::Adam({{{m->emb}, AO(0.1)}, {{m->b, m->head}, AO(0.1)}}), pt::ValueError);
}

// The step's arenas, their groups and the compiled update are laid out for the param groups the step
// was made with: a group added, a parameter moved to another group or removed is an error at the next
// call naming what changed (they were ignored: the new parameter never trained, the moved one kept its
// old group's learning rate). Options change freely.
TEST(CompiledTrainStep, ChangedParamGroupsAreAnErrorAtTheNextCall) {
  using SO = pt::optim::SGDOptions;
  for (int change = 0; change < 6; ++change) {
    const bool distributed = change >= 3;  // the same contract for distributed::compile_train_step
    SCOPED_TRACE(change);
    pt::manual_seed(8);
    auto c = std::make_shared<TwoLayer>();
    pt::optim::SGD opt({{{c->w}, SO{.lr = 0.1}}, {{c->b}, SO{.lr = 0.1}}});
    auto loss = [&](Tensor x, Tensor y) { return c->loss(x, y); };
    std::function<Tensor(Tensor, Tensor)> step;
    if (distributed)
      step = dist::compile_train_step(c, loss, opt, std::make_shared<OneRank>(),
                                      {.name = "ddp_groups_step", .backend = "interp"});
    else
      step = pt::compile_train_step(c, loss, opt, {.name = "groups_step", .backend = "interp"});
    Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
    step(x, y);
    opt.param_groups[0].options.lr = 0.05;  // an option: fine
    step(x, y);
    const Tensor w = c->w.clone();
    if (change % 3 == 0) opt.param_groups.push_back({{c->unused}, SO{.lr = 1.0}});
    if (change % 3 == 1) std::swap(opt.param_groups[0].params, opt.param_groups[1].params);
    if (change % 3 == 2) opt.param_groups[1].params.clear();
    try {
      step(x, y);
      ADD_FAILURE() << "a changed param_groups was ignored";
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("param_groups changed after the step was made"), std::string::npos) << e.what();
    }
    EXPECT_EQ(pt::max_abs_diff(c->w, w), 0.0) << "the refused call changed a parameter";
  }
}

// Two compiled steps with one optimizer (two loss functions, alternating) share its state and step
// count, as one optimizer does eagerly (each step had kept its own Adam moments and count). A step over
// another module with the same optimizer is refused (the buffers would not be shared).
TEST(CompiledTrainStep, TwoStepsWithOneOptimizerShareItsState) {
  pt::manual_seed(9);
  auto c = std::make_shared<TwoLayer>();
  auto e = eager_twin(*c);
  pt::optim::Adam eopt({e->w, e->b}, pt::optim::AdamOptions(0.05)), copt({c->w, c->b}, pt::optim::AdamOptions(0.05));
  auto l2 = [](const Tensor& d) { return pt::mean(d * d); };
  auto s1 = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return l2(pt::linear(x, c->w, c->b) - y); }, copt,
                                   {.name = "mse_step", .backend = "interp"});
  auto s2 = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return pt::mean(pt::abs(pt::linear(x, c->w, c->b) - y)); },
                                   copt, {.name = "l1_step", .backend = "interp"});
  for (int i = 0; i < 4; ++i) {
    Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
    eopt.zero_grad();
    (i % 2 ? pt::mean(pt::abs(pt::linear(x, e->w, e->b) - y)) : l2(pt::linear(x, e->w, e->b) - y)).backward();
    eopt.step();
    if (i % 2) s2(x, y);
    else s1(x, y);
    EXPECT_EQ(copt.state(c->w).step, eopt.state(e->w).step) << "step " << i;
    EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6) << "step " << i;
  }
  auto other = std::make_shared<TwoLayer>();
  EXPECT_THROW(pt::compile_train_step(other, [&](Tensor x, Tensor y) { return l2(pt::linear(x, c->w, c->b) - y); }, copt,
                                      {.name = "other_module_step", .backend = "interp"}),
               pt::ValueError);
}

namespace {
/// Copies `src`'s values into `dst` in place (a checkpoint restored into a parameter).
void write_values(Tensor& dst, const Tensor& src) {
  std::memcpy(dst.data_ptr(), src.contiguous().data_ptr(), static_cast<size_t>(src.int_numel()) * sizeof(float));
  pt::increment_version(dst);
}
}  // namespace

// The optimizer's state follows compiled steps (optimizer.state(p) holds their moments) and the
// compiled step takes up state made outside it: eager steps before the step exists and between its
// calls continue as one run, equal to an all-eager twin's (parameters, moments, step count). The
// moments had stayed in the step's arenas: state(p) had no exp_avg after compiled steps, and an eager
// step after them started from zeros.
TEST(CompiledTrainStep, TheOptimizerStateFollowsCompiledAndEagerSteps) {
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    pt::manual_seed(12);
    auto c = std::make_shared<TwoLayer>();
    auto e = eager_twin(*c);
    c->w.requires_grad_();
    c->b.requires_grad_();
    pt::optim::AdamOptions o = pt::optim::AdamWOptions(0.02);
    o.weight_decay = 0.05;
    pt::optim::AdamW eopt({e->w, e->b}, o), copt({c->w, c->b}, o);
    auto same = [&](const std::string& when) {
      EXPECT_EQ(copt.state(c->w).step, eopt.state(e->w).step) << when;
      EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6) << when;
      EXPECT_LE(pt::max_abs_diff(c->b, e->b.detach()), 1e-6) << when;
      for (const char* n : {"exp_avg", "exp_avg_sq"}) {
        const Tensor cs = copt.state(c->w).buffers[n], es = eopt.state(e->w).buffers[n];
        ASSERT_TRUE(cs.defined()) << when << ": " << n;
        EXPECT_LE(pt::max_abs_diff(cs, es), 1e-6) << when << ": " << n;
      }
    };
    int i = 0;
    auto batch = [&] {
      pt::manual_seed(100 + i++);
      return std::pair{pt::randn({6, 4}), pt::randn({6, 3})};
    };
    for (int k = 0; k < 2; ++k) {  // eager steps before the compiled step exists
      auto [x, y] = batch();
      eager_step(eopt, *e, x, y);
      eager_step(copt, *c, x, y);
    }
    auto step = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, copt,
                                       {.name = "state_follows_step", .backend = backend});
    for (int round = 0; round < 2; ++round) {
      for (int k = 0; k < 3; ++k) {
        auto [x, y] = batch();
        eager_step(eopt, *e, x, y);
        step(x, y);
      }
      same(fmt::format("after compiled steps, round {}", round));
      for (int k = 0; k < 2; ++k) {  // eager steps between compiled calls
        auto [x, y] = batch();
        eager_step(eopt, *e, x, y);
        eager_step(copt, *c, x, y);
      }
      same(fmt::format("after eager steps, round {}", round));
    }
  }
}

// A state the structure adds (momentum switched on) made first by an eager step (its momentum buffer
// is the eager step's own tensor, outside the arenas) is taken into the new state arena when the
// compiled step lays it out, so the run continues as an all-eager one.
TEST(CompiledTrainStep, AStateAnEagerStepMadeAfterAStructureChangeIsTakenUp) {
  pt::manual_seed(14);
  auto c = std::make_shared<TwoLayer>();
  auto e = eager_twin(*c);
  c->w.requires_grad_();
  c->b.requires_grad_();
  pt::optim::SGD copt({c->w, c->b}, {.lr = 0.1}), eopt({e->w, e->b}, {.lr = 0.1});
  auto step = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, copt,
                                     {.name = "momentum_after_eager", .backend = "cpu"});
  for (int i = 0; i < 6; ++i) {
    if (i == 2)
      for (auto* o : {&copt, &eopt}) o->param_groups[0].options.momentum = 0.9;
    Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
    eager_step(eopt, *e, x, y);
    if (i == 2) {  // the first step with momentum is eager: its buffer starts outside the arenas
      eager_step(copt, *c, x, y);
    } else {
      step(x, y);
    }
    EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6) << "step " << i;
    EXPECT_LE(pt::max_abs_diff(c->b, e->b.detach()), 1e-6) << "step " << i;
  }
  EXPECT_LE(pt::max_abs_diff(copt.state(c->w).buffers["momentum_buffer"], eopt.state(e->w).buffers["momentum_buffer"]), 1e-6);
  EXPECT_EQ(copt.state(c->w).step, eopt.state(e->w).step);
}

// A checkpoint of the optimizer state taken after compiled steps and loaded back (the parameters
// written in place, the state buffers and step counts assigned) replays the same steps: the step
// reads the loaded moments and bias correction, not the ones it had in its arenas.
TEST(CompiledTrainStep, AnOptimizerCheckpointLoadedBetweenCallsIsUsed) {
  pt::manual_seed(13);
  auto c = std::make_shared<TwoLayer>();
  pt::optim::Adam opt({c->w, c->b}, pt::optim::AdamOptions(0.05));
  auto step = pt::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, opt,
                                     {.name = "checkpointed_step", .backend = "cpu"});
  std::vector<std::pair<Tensor, Tensor>> data;
  for (int k = 0; k < 6; ++k) data.emplace_back(pt::randn({6, 4}), pt::randn({6, 3}));
  for (int k = 0; k < 3; ++k) step(data[k].first, data[k].second);
  // the checkpoint: values copied out, as a state_dict save would
  struct Saved {
    Tensor value;
    int64_t step;
    std::map<std::string, Tensor> buffers;
  };
  std::vector<Saved> saved;
  for (Tensor* p : {&c->w, &c->b}) {
    Saved sv{p->clone(), opt.state(*p).step, {}};
    for (const auto& [n, t] : opt.state(*p).buffers) sv.buffers[n] = t.clone();
    ASSERT_EQ(sv.buffers.size(), 2u);
    saved.push_back(std::move(sv));
  }
  EXPECT_EQ(saved[0].step, 3);
  for (int k = 3; k < 6; ++k) step(data[k].first, data[k].second);
  const Tensor w_first = c->w.clone(), b_first = c->b.clone();
  // load it back and replay the last three steps
  Tensor* ps[] = {&c->w, &c->b};
  for (size_t j = 0; j < 2; ++j) {
    write_values(*ps[j], saved[j].value);
    opt.state(*ps[j]).step = saved[j].step;
    for (const auto& [n, t] : saved[j].buffers) opt.state(*ps[j]).buffers[n] = t.clone();
  }
  for (int k = 3; k < 6; ++k) step(data[k].first, data[k].second);
  EXPECT_EQ(opt.state(c->w).step, 6);
  EXPECT_EQ(pt::max_abs_diff(c->w, w_first), 0.0);
  EXPECT_EQ(pt::max_abs_diff(c->b, b_first), 0.0);
  // a state buffer of the wrong shape is refused, naming it, and changes nothing
  opt.state(c->w).buffers["exp_avg"] = pt::zeros({2, 2});
  const Tensor w_before = c->w.clone();
  try {
    step(data[0].first, data[0].second);
    ADD_FAILURE() << "no error";
  } catch (const pt::ValueError& err) {
    EXPECT_NE(std::string(err.what()).find("optimizer state 'exp_avg' of parameter 'w'"), std::string::npos) << err.what();
  }
  EXPECT_EQ(pt::max_abs_diff(c->w, w_before), 0.0);
}

namespace {
// A zero-element tensor reshaped in a cpu-compiled function, and a zero-element parameter of a cpu
// train step: the reshape's index arithmetic divided by the zero size at lowering
// (std::domain_error "Mod by zero", uncaught in the train step: the process aborted).
TEST(CompiledTrainStep, ZeroElementTensorsLowerOnTheCpuBackend) {
  auto f = pt::compile([](Tensor x) { return pt::reshape(x * 2.0, {-1}); }, {.name = "zero_reshape", .backend = "cpu"});
  Tensor y = f(pt::randn({2, 0, 3}));
  ASSERT_EQ(y.dim(), 1);
  EXPECT_EQ(y.int_numel(), 0);
  struct Net : pt::Module {
    Tensor& w = register_parameter("w", pt::randn({3}));
    Tensor& z = register_parameter("z", pt::randn({2, 0, 3}));
  };
  auto net = std::make_shared<Net>();
  pt::optim::Adam opt(net->parameters(), pt::optim::AdamOptions(0.1));
  auto step = pt::compile_train_step(net, [net](Tensor x) { return pt::sum(net->w * x) + pt::sum(net->z * net->z); },
                                     opt, {.name = "zero_param_step", .backend = "cpu"});
  const Tensor w0 = net->w.clone();
  for (int i = 0; i < 2; ++i) {
    const float expected = pt::sum(net->w).item<float>();  // the loss at the weights before the update
    EXPECT_NEAR(step(pt::ones({3})).item<float>(), expected, 1e-5) << "step " << i;
  }
  EXPECT_GT(pt::max_abs_diff(net->w, w0), 0.05);  // trained
  EXPECT_EQ(net->z.int_numel(), 0);
}
}  // namespace

namespace {
// A module parameter the optimizer does not train (frozen) or a buffer, rebound by the module after
// the step was made: the step kept reading the old tensor (the loss used b = 100 after b = 0). Now an
// error naming it; values written into it in place are seen.
TEST(CompiledTrainStep, AFrozenParameterOrBufferReassignedIsAnError) {
  struct Net : pt::Module {
    Tensor& w = register_parameter("w", pt::ones({3}));
    Tensor& b = register_parameter("b", pt::full({3}, 100.0));  // not in the optimizer
    Tensor& scale = register_buffer("scale", pt::full({}, 1.0));
  };
  for (int what = 0; what < 2; ++what) {
    auto net = std::make_shared<Net>();
    pt::optim::SGD opt({net->w}, {.lr = 0.1});
    auto step = pt::compile_train_step(net, [net](Tensor x) { return pt::sum(net->w * x + net->b) * net->scale; }, opt,
                                       {.name = "frozen_step", .backend = "interp"});
    const Tensor x = pt::ones({3});
    EXPECT_NEAR(step(x).item<float>(), 303.0f, 1e-3);
    std::memset(net->b.data_ptr(), 0, 3 * sizeof(float));  // in place: seen
    pt::increment_version(net->b);
    const float expected = pt::sum(net->w).item<float>();
    EXPECT_NEAR(step(x).item<float>(), expected, 1e-4);
    if (what == 0) net->b = pt::zeros({3});
    else net->scale = pt::full({}, 2.0);
    try {
      step(x);
      ADD_FAILURE() << "a reassigned " << (what == 0 ? "frozen parameter" : "buffer") << " was ignored";
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(what == 0 ? "parameter (not trained by the optimizer) 'b' was reassigned"
                                                     : "buffer 'scale' was reassigned"),
                std::string::npos)
          << e.what();
    }
  }
}
}  // namespace

namespace {
// On the cpu backend an Adam step may put a result into another arena's memory (donation). The arenas
// then adopted the results' storage and re-pointed the parameters only, so a view of a parameter taken
// after the step was made stayed on the old memory (it showed the second moment, and writes through
// it never reached the parameter). Every arena now keeps its storage.
TEST(CompiledTrainStep, AViewOfAParameterFollowsItAcrossSteps) {
  struct Net : pt::Module {
    Tensor& w = register_parameter("w", pt::randn({4, 8}));
  };
  pt::manual_seed(2);
  auto net = std::make_shared<Net>();
  pt::optim::Adam opt(net->parameters(), pt::optim::AdamOptions(0.1));
  auto step = pt::compile_train_step(net, [net](Tensor x) { return pt::mean(pt::tanh(pt::matmul(x, net->w))); }, opt,
                                     {.name = "view_step", .backend = "cpu"});
  Tensor row0 = net->w.select(0, 0);
  for (int i = 0; i < 3; ++i) {
    step(pt::randn({5, 4}));
    EXPECT_EQ(pt::max_abs_diff(row0, net->w.select(0, 0)), 0.0) << "step " << i;
  }
  std::memset(row0.data_ptr(), 0, 8 * sizeof(float));  // written through the view
  EXPECT_EQ(pt::max_abs_diff(net->w.select(0, 0), pt::zeros({8})), 0.0);
}
}  // namespace

// distributed::compile_train_step on a one-rank in-process group: compile_train_step's per-call
// contract (the exchanges themselves are tested under mpirun, tests/mpi/ddp_mpi_test.cpp).
namespace {
TEST(DataParallelStep, AReassignedParameterIsAnError) {
  pt::manual_seed(9);
  auto c = std::make_shared<TwoLayer>();
  pt::optim::SGD opt({c->w, c->b}, {.lr = 0.1});
  auto step = dist::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, opt,
                                       std::make_shared<OneRank>(), {.name = "ddp_reassigned_step", .backend = "interp"});
  Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
  step(x, y);
  c->w = pt::randn({3, 4});  // the module now reads a tensor the optimizer does not train
  try {
    step(x, y);
    ADD_FAILURE() << "a reassigned parameter was ignored";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'w' was reassigned"), std::string::npos) << e.what();
  }
}

// Momentum switched on, then nesterov, between steps: the update compiles again for each structure
// and follows the eager optimizer (the momentum buffer starts from the first gradient after the switch,
// as torch's does).
TEST(DataParallelStep, AStructuralOptionCompilesTheUpdateAgainAndFollowsEager) {
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    pt::manual_seed(10);
    auto c = std::make_shared<TwoLayer>();
    auto e = eager_twin(*c);
    pt::optim::SGD copt({c->w, c->b}, {.lr = 0.1}), eopt({e->w, e->b}, {.lr = 0.1});
    auto group = std::make_shared<OneRank>();
    auto step = dist::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, copt, group,
                                         {.name = std::string("ddp_structure_step_") + backend, .backend = backend});
    for (int i = 0; i < 6; ++i) {
      if (i == 2)
        for (auto* o : {&copt, &eopt}) o->param_groups[0].options.momentum = 0.9;
      if (i == 4)
        for (auto* o : {&copt, &eopt}) o->param_groups[0].options.nesterov = true;
      Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
      eopt.zero_grad();
      Tensor le = e->loss(x, y);
      le.backward();
      eopt.step();
      Tensor lc = step(x, y);
      EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-5) << "step " << i;
      EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-5) << "step " << i;
      EXPECT_LE(pt::max_abs_diff(c->b, e->b.detach()), 1e-5) << "step " << i;
    }
    EXPECT_EQ(group->all_reduces, 6);
    EXPECT_EQ(step.stats().update.compiles, 3) << "one update per structure";
  }
}

struct BnNet : pt::Module {
  Tensor& w = register_parameter("w", pt::randn({4, 3}) * 0.5);
  Tensor& gamma = register_parameter("gamma", pt::ones({4}));
  Tensor& beta = register_parameter("beta", pt::zeros({4}));
  Tensor& running_mean = register_buffer("running_mean", pt::zeros({4}));
  Tensor& running_var = register_buffer("running_var", pt::ones({4}));
  Tensor loss(const Tensor& x) {
    Tensor h = pt::batch_norm_train(pt::linear(x, w, Tensor()), gamma, beta, running_mean, running_var, 0.1, 1e-5);
    return pt::mean(pt::relu(h) * pt::relu(h));
  }
};

// batch_norm_train's running statistics are module buffers the step rewrites: they follow eager
// step by step, in the module's own storage (on one rank the per-step broadcast from rank 0 changes
// nothing; tests/mpi/ddp_mpi_test.cpp's buffers scenario checks it across ranks).
TEST(DataParallelStep, BatchNormRunningStatsFollowEager) {
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    pt::manual_seed(11);
    auto c = std::make_shared<BnNet>(), e = std::make_shared<BnNet>();
    for (auto [dst, src] : {std::pair{&e->w, &c->w}, std::pair{&e->gamma, &c->gamma}, std::pair{&e->beta, &c->beta}}) {
      *dst = src->clone();
      dst->requires_grad_();
    }
    pt::optim::SGD copt({c->w, c->gamma, c->beta}, {.lr = 0.1}), eopt({e->w, e->gamma, e->beta}, {.lr = 0.1});
    auto step = dist::compile_train_step(c, [&](Tensor x) { return c->loss(x); }, copt, std::make_shared<OneRank>(),
                                         {.name = std::string("ddp_bn_step_") + backend, .backend = backend});
    const void* rm_at = c->running_mean.data_ptr();
    for (int i = 0; i < 4; ++i) {
      Tensor x = pt::randn({8, 3}) * (1 + 0.5 * i) + 0.3 * i;
      eopt.zero_grad();
      Tensor le = e->loss(x);
      le.backward();
      eopt.step();
      Tensor lc = step(x);
      EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-5) << "step " << i;
      EXPECT_LE(pt::max_abs_diff(c->running_mean, e->running_mean), 1e-5) << "step " << i;
      EXPECT_LE(pt::max_abs_diff(c->running_var, e->running_var), 1e-5) << "step " << i;
      EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-5) << "step " << i;
    }
    EXPECT_EQ(c->running_mean.data_ptr(), rm_at) << "the buffer moved out of the module's storage";
    EXPECT_GT(pt::max_abs_diff(c->running_mean, pt::zeros({4})), 0.05) << "the running mean never moved";
  }
}

// A parameter handed to the step as an input would be read as data (no gradient through it): an
// error naming it, nothing trained. Adam's parameters being trained with different step counts (one
// that starts after eager steps of the others) would share one bias correction: an error at creation.
TEST(CompiledTrainStep, AParameterAsInputAndMixedAdamCountsAreErrors) {
  struct Net : pt::Module {
    Tensor& w = register_parameter("w", pt::full({2}, 1.0));
    Tensor& v = register_parameter("v", pt::full({2}, 3.0));
  };
  auto net = std::make_shared<Net>();
  pt::optim::SGD sgd(net->parameters(), {.lr = 0.1});
  auto step = pt::compile_train_step(net, [net](Tensor e) { return pt::sum(net->w * e); }, sgd,
                                     {.name = "param_as_input", .backend = "interp"});
  try {
    step(net->v);
    ADD_FAILURE() << "a parameter passed as input was taken as data";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 of the call is parameter 'v'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pt::max_abs_diff(net->w, pt::full({2}, 1.0)), 0.0);
  step(net->v.clone());  // as data: fine
  EXPECT_LE(pt::max_abs_diff(net->w, pt::full({2}, 0.7)), 1e-6);

  auto late = std::make_shared<Net>();
  for (Tensor& p : late->parameters()) p.requires_grad_();
  pt::optim::Adam adam(late->parameters(), {.lr = 0.1});
  for (int i = 0; i < 3; ++i) {  // v unused: its count stays 0
    adam.zero_grad();
    pt::sum(late->w * late->w).backward();
    adam.step();
  }
  try {
    pt::compile_train_step(late, [late](Tensor) { return pt::sum(late->w * late->v); }, adam,
                           {.name = "late_param", .backend = "interp"});
    ADD_FAILURE() << "parameters with Adam step counts 3 and 0 were given one count";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("different Adam step counts (3 and 0)"), std::string::npos) << e.what();
  }
}

// A self-overlapping parameter (an expand()ed view) is refused: its in-place update would write a
// location once per element that views it (the last write won, the others' gradient was lost), and
// the compiled step would have untied its elements. A transposed view does not overlap.
TEST(Optim, ASelfOverlappingParameterIsRefused) {
  Tensor base = pt::arange(1, 4, 1, pt::DType::F32);
  Tensor p = base.expand({2, 3});
  try {
    pt::optim::SGD bad({p}, {.lr = 1.0});
    ADD_FAILURE() << "an expanded parameter was accepted";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("strides [0, 1] has elements that share memory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::optim::Adam({p}, {}), pt::ValueError);
  Tensor t = pt::randn({3, 4}).transpose(0, 1);
  pt::optim::SGD ok({t}, {.lr = 1.0});
  Tensor s = pt::randn({4, 6}).narrow(1, 0, 3);
  pt::optim::AdamW ok2({s}, pt::optim::AdamWOptions(1e-3));
}

// requires_grad freezes as in torch once any parameter has it set: the compiled step leaves a
// parameter without it alone, as the eager step does (it was trained); changing the pattern after the
// step was made is an error naming the parameter.
TEST(CompiledTrainStep, RequiresGradFalseFreezesAParameter) {
  struct Net : pt::Module {
    Tensor& w = register_parameter("w", pt::full({2}, 1.0));
    Tensor& v = register_parameter("v", pt::full({2}, 1.0));
  };
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    auto e = std::make_shared<Net>(), c = std::make_shared<Net>();
    for (auto* n : {e.get(), c.get()}) {
      n->w.requires_grad_();
      n->v.requires_grad_(false);
    }
    pt::optim::SGD eo(e->parameters(), {.lr = 0.1, .momentum = 0.9}), co(c->parameters(), {.lr = 0.1, .momentum = 0.9});
    auto loss = [](Net& n, const Tensor& x) { return pt::sum(n.w * x) + pt::sum(n.v * n.w); };
    auto step = pt::compile_train_step(c, [c, loss](Tensor x) { return loss(*c, x); }, co,
                                       {.name = "frozen_v", .backend = backend});
    for (int i = 0; i < 3; ++i) {
      const Tensor x = pt::full({2}, 0.5 + i);
      eo.zero_grad();
      loss(*e, x).backward();
      eo.step();
      step(x);
    }
    EXPECT_EQ(pt::max_abs_diff(c->v, pt::full({2}, 1.0)), 0.0);
    EXPECT_LE(pt::max_abs_diff(c->w, e->w.detach()), 1e-6);
    c->v.requires_grad_();
    try {
      step(pt::ones({2}));
      ADD_FAILURE() << "an unfrozen parameter went unnoticed";
    } catch (const pt::ValueError& err) {
      EXPECT_NE(std::string(err.what()).find("parameter 'v' was unfrozen after the step was made"), std::string::npos)
          << err.what();
    }
  }
}
}  // namespace
