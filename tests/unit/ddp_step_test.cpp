// distributed::compile_train_step on a one-rank in-process group: the same per-call contract as
// compile_train_step (param_groups checked, a reassigned parameter refused, a structural option
// compiling the update again, module buffers rewritten by batch_norm_train kept in step with eager).
// The exchanges themselves are tested under mpirun (tests/mpi/ddp_mpi_test.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>

#include "protean/distributed.h"
#include "protean/optim.h"
#include "protean/protean.h"

namespace pt = protean;
namespace dist = protean::distributed;
using pt::Tensor;

namespace {

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

struct Net : pt::Module {
  Tensor& w = register_parameter("w", pt::randn({3, 4}));
  Tensor& b = register_parameter("b", pt::randn({3}));
  Tensor& unused = register_parameter("unused", pt::randn({5}));
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor d = pt::linear(x, w, b) - y;
    return pt::mean(d * d);
  }
};

/// A copy of `m`'s values in separate storage, requiring grad (the eager reference).
std::shared_ptr<Net> twin(const Net& m) {
  auto e = std::make_shared<Net>();
  for (auto [dst, src] : {std::pair{&e->w, &m.w}, std::pair{&e->b, &m.b}, std::pair{&e->unused, &m.unused}}) {
    std::memcpy(dst->data_ptr(), src->contiguous().data_ptr(), static_cast<size_t>(src->int_numel()) * sizeof(float));
    dst->requires_grad_();
  }
  return e;
}

TEST(DataParallelStep, ChangedParamGroupsAreAnErrorAtTheNextCall) {
  using SO = pt::optim::SGDOptions;
  for (int change = 0; change < 3; ++change) {
    SCOPED_TRACE(change);
    pt::manual_seed(8);
    auto c = std::make_shared<Net>();
    pt::optim::SGD opt({{{c->w}, SO{.lr = 0.1}}, {{c->b}, SO{.lr = 0.1}}});
    auto step = dist::compile_train_step(c, [&](Tensor x, Tensor y) { return c->loss(x, y); }, opt,
                                         std::make_shared<OneRank>(), {.name = "ddp_groups_step", .backend = "interp"});
    Tensor x = pt::randn({6, 4}), y = pt::randn({6, 3});
    step(x, y);
    opt.param_groups[0].options.lr = 0.05;  // an option: fine
    step(x, y);
    const Tensor w = c->w.clone();
    if (change == 0) opt.param_groups.push_back({{c->unused}, SO{.lr = 1.0}});
    if (change == 1) std::swap(opt.param_groups[0].params, opt.param_groups[1].params);
    if (change == 2) opt.param_groups[1].params.clear();
    try {
      step(x, y);
      ADD_FAILURE() << "a changed param_groups was ignored";
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("param_groups changed after the step was made"), std::string::npos) << e.what();
    }
    EXPECT_EQ(pt::max_abs_diff(c->w, w), 0.0) << "the refused call changed a parameter";
  }
}

TEST(DataParallelStep, AReassignedParameterIsAnError) {
  pt::manual_seed(9);
  auto c = std::make_shared<Net>();
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
    auto c = std::make_shared<Net>();
    auto e = twin(*c);
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
// step by step, in the module's own storage (each rank keeps its own, as torch's DDP without
// broadcast_buffers).
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

}  // namespace
