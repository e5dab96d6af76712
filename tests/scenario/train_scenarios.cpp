// Training scenarios: value_and_grad compiled as one frame (forward and backward in one graph, with
// `[bwd of file:line]` provenance) against the eager tape on the suite's backend (interp, and cpu in
// the `cpu.` run), compile counts when the batch or sequence size changes, and compile_train_step
// (forward + backward + optimizer update in one frame, learning rate as a graph input).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "backend/donation.h"
#include "observe/log.h"
#include "observe/report.h"
#include "observe/trace.h"
#include "protean/autograd.h"
#include "protean/optim.h"
#include "protean/protean.h"
#include "scenario_util.h"

namespace pt = protean;
using pt::Tensor;
using pt::scenario::scenario_backend;
using pt::scenario::scenario_compile;

namespace {

class ScenarioTrain : public ::testing::Test {
 protected:
  void SetUp() override { pt::reset(); }
  void TearDown() override { pt::reset(); }
};

Tensor mlp_loss(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor y) {
  Tensor h = pt::gelu(pt::linear(x, w1, b1));
  Tensor logits = pt::matmul(h, pt::transpose(w2, 0, 1));
  return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, y));
}

Tensor labels(int64_t n, int64_t classes) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < n; ++i) v.push_back((i * 7 + 3) % classes);
  return pt::tensor<int64_t>(v, {n, 1});
}

void expect_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.int_sizes(), b.int_sizes()) << what;
  double scale = std::max(1.0, pt::amax(pt::abs(b)).item<double>());
  EXPECT_LE(pt::max_abs_diff(a, b), tol * scale) << what;
}

TEST_F(ScenarioTrain, CompiledValueAndGradMatchesTheEagerTapeInOneFrame) {
  pt::manual_seed(3);
  Tensor w1 = pt::randn({16, 8}) * 0.3, b1 = pt::randn({16}) * 0.1, w2 = pt::randn({4, 16}) * 0.3;
  auto vg = pt::value_and_grad(mlp_loss, {.wrt = {1, 2, 3}});
  auto compiled = scenario_compile(vg, {.name = "mlp_vg", .arg_names = {"x", "w1", "b1", "w2", "y"}});
  Tensor x = pt::randn({6, 8});
  auto [loss_e, g_e] = vg(x, w1, b1, w2, labels(6, 4));
  auto [loss_c, g_c] = compiled(x, w1, b1, w2, labels(6, 4));
  EXPECT_NEAR(loss_c.item<float>(), loss_e.item<float>(), 1e-5);
  ASSERT_EQ(g_c.size(), 3u);
  for (size_t i = 0; i < 3; ++i) expect_close(g_c[i], g_e[i], 1e-4, "grad " + std::to_string(i));
  auto s = pt::stats();
  EXPECT_EQ(s.frames, 1);
  EXPECT_EQ(s.compiles, 1);  // forward and backward: one compile
  // The arguments were not turned into leaves: they keep no grad and no history.
  EXPECT_FALSE(w1.requires_grad());
  EXPECT_FALSE(w1.grad().defined());
}

Tensor two_branch_loss(Tensor x, Tensor w1, Tensor w2, Tensor w3) {
  // the min cut saves a = tanh(h1 + h2) (one tensor) rather than h1 and h2 (two)
  Tensor a = pt::tanh(pt::linear(x, w1, Tensor()) + pt::linear(x, w2, Tensor()));
  return pt::sum(pt::linear(a, w3, Tensor()));
}

TEST_F(ScenarioTrain, ALowerMemoryBudgetSavesLessAndGivesTheSameGradients) {
  // CompileOptions::memory_budget reaches the partitioner: under a small budget the backward
  // recomputes the saved tanh from the products instead of keeping it, with the same gradients.
  pt::manual_seed(21);
  Tensor w1 = pt::randn({32, 16}) * 0.3, w2 = pt::randn({32, 16}) * 0.3, w3 = pt::randn({4, 32}) * 0.3;
  Tensor x = pt::randn({24, 16});
  auto vg = pt::value_and_grad(two_branch_loss, {.wrt = {3}});
  auto saved_lines = [](const std::string& log) {
    int n = 0;
    for (size_t at = log.find("] saved "); at != std::string::npos; at = log.find("] saved ", at + 1)) ++n;
    return n;
  };
  std::string logs[2];
  std::vector<Tensor> grads[2];
  for (int k = 0; k < 2; ++k) {
    pt::observe::LogCapture cap("partition");
    pt::CompileOptions o{.name = k ? "branches_small_budget" : "branches_min_cut"};
    if (k) o.memory_budget = 0.05;
    auto compiled = scenario_compile(vg, o);
    grads[k] = std::get<1>(compiled(x, w1, w2, w3));
    logs[k] = cap.str();
  }
  EXPECT_LT(saved_lines(logs[1]), saved_lines(logs[0])) << logs[0] << "\n---\n" << logs[1];
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) expect_close(grads[1][i], grads[0][i], 1e-5, "grad " + std::to_string(i));
}

Tensor broadcast_product_loss(Tensor x, Tensor w1, Tensor w2) {
  // m = w1 @ w2 is [16, 16]; v = (m as [1, 256] broadcast over x's rows · x)[:, :8] is [n, 8]. The
  // backward reads v: keeping it costs 32·n bytes, keeping m 1 KiB and recomputing the rest.
  Tensor m = pt::reshape(pt::matmul(w1, w2), {1, 256});
  Tensor v = pt::slice(m * x, 1, 0, 8);
  return pt::sum(v * v);
}

TEST_F(ScenarioTrain, ThePartitionerWeighsSavedValuesAtTheMarkedMaximum) {
  // The saved values' bytes are taken at the largest size the frame is known to see (mark_dynamic's
  // max here; the PGO profile's observed max in a warm run), not at the traced length: traced at 4
  // rows, a frame marked up to 4096 keeps the 1 KiB product, an unmarked one the [4, 8] slice.
  pt::manual_seed(23);
  Tensor w1 = pt::randn({16, 4}) * 0.3, w2 = pt::randn({4, 16}) * 0.3;
  auto vg = pt::value_and_grad(broadcast_product_loss, {.wrt = {1, 2}});
  std::string logs[2];
  std::vector<Tensor> grads[2];
  for (int k = 0; k < 2; ++k) {
    Tensor x = pt::randn({4, 256});
    if (k) pt::mark_dynamic(x, 0, 2, 4096);
    pt::observe::LogCapture cap("partition");
    auto compiled = scenario_compile(vg, pt::CompileOptions{.name = k ? "marked_rows" : "traced_rows"});
    grads[k] = std::get<1>(compiled(x, w1, w2));
    logs[k] = cap.str();
    if (k) {
      auto eager = vg(x, w1, w2);
      for (size_t i = 0; i < grads[k].size(); ++i) expect_close(grads[k][i], std::get<1>(eager)[i], 1e-5, "grad " + std::to_string(i));
    }
  }
  EXPECT_NE(logs[0].find("saved f32[4, 8] slice"), std::string::npos) << logs[0];
  EXPECT_NE(logs[1].find("saved f32[16, 16] matmul"), std::string::npos) << logs[1];
  EXPECT_EQ(logs[1].find("slice at"), std::string::npos) << logs[1];
}

TEST_F(ScenarioTrain, AMemoryBudgetOutsideZeroToOneIsAValueErrorAtCompile) {
  // The option is checked when the function is compiled (value_and_grad, compile_train_step, and a
  // forward-only function, whose graph never reaches the partitioner), with a message naming the
  // option, the function and the value; nothing is traced or run.
  pt::manual_seed(22);
  Tensor w1 = pt::randn({32, 16}) * 0.3, w2 = pt::randn({32, 16}) * 0.3, w3 = pt::randn({4, 32}) * 0.3;
  Tensor x = pt::randn({24, 16});
  auto vg = pt::value_and_grad(two_branch_loss, {.wrt = {3}});
  const std::string backend = scenario_backend();
  for (double budget : {0.0, -0.25, 1.5, std::nan("")}) {
    SCOPED_TRACE(budget);
    pt::CompileOptions o{.name = "bad_budget", .backend = backend};
    o.memory_budget = budget;
    try {
      auto compiled = pt::compile(vg, o);
      (void)compiled(x, w1, w2, w3);
      ADD_FAILURE() << "no ValueError for memory_budget = " << budget;
    } catch (const pt::ValueError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("CompileOptions::memory_budget"), std::string::npos) << what;
      EXPECT_NE(what.find("(0, 1]"), std::string::npos) << what;
      EXPECT_NE(what.find("bad_budget"), std::string::npos) << what;
    }
    pt::CompileOptions fo{.name = "bad_budget_forward", .backend = backend};
    fo.memory_budget = budget;
    EXPECT_THROW(pt::compile([](Tensor a) { return pt::tanh(a); }, fo), pt::ValueError);
    struct Net : pt::Module {
      Tensor w = pt::randn({4, 3});
      Net() { register_parameter("w", w); }
    };
    auto net = std::make_shared<Net>();
    pt::optim::SGD opt({net->w}, pt::optim::SGDOptions(0.1));
    pt::CompileOptions so{.name = "bad_budget_step", .backend = backend};
    so.memory_budget = budget;
    EXPECT_THROW(
        {
          auto step = pt::compile_train_step(
              net, [&](Tensor xin) { return pt::sum(pt::tanh(pt::matmul(xin, net->w))); }, opt, so);
          (void)step(pt::randn({2, 4}));
        },
        pt::ValueError);
  }
  EXPECT_EQ(pt::stats().compiles, 0);
  // The ends of the range are accepted: 1 keeps the min cut's saved set.
  pt::CompileOptions ok{.name = "full_budget", .backend = backend};
  ok.memory_budget = 1.0;
  auto compiled = pt::compile(vg, ok);
  auto [v, g] = compiled(x, w1, w2, w3);
  (void)v;
  EXPECT_EQ(g.size(), 1u);
}

TEST_F(ScenarioTrain, BackwardLinesNameTheForwardLine) {
  pt::observe::LogCapture cap("output_code");
  auto fn = [](Tensor x, Tensor w) {
    return pt::sum(pt::tanh(pt::matmul(x, w)));  // the forward line
  };
  auto compiled = pt::compile(pt::value_and_grad(fn, {.wrt = {1}}), {.name = "prov", .backend = "interp"});
  auto [v, g] = compiled(pt::randn({3, 4}), pt::randn({4, 2}));
  (void)v;
  ASSERT_EQ(g.size(), 1u);
  const std::string log = cap.str();
  // Forward ops carry the user's line; the rules' ops say which forward line they differentiate.
  EXPECT_NE(log.find("tanh("), std::string::npos) << log;
  EXPECT_NE(log.find("[bwd of train_scenarios.cpp:"), std::string::npos) << log;
}

TEST_F(ScenarioTrain, ChangingBatchAndSequenceSizeCompilesTwiceThenHits) {
  // A tiny attention block trained on sequences of changing length and batch.
  pt::manual_seed(5);
  Tensor wq = pt::randn({8, 8}) * 0.3, wk = pt::randn({8, 8}) * 0.3, wv = pt::randn({8, 8}) * 0.3;
  auto loss_fn = [](Tensor x, Tensor wq, Tensor wk, Tensor wv) {
    Tensor q = pt::matmul(x, wq), k = pt::matmul(x, wk), v = pt::matmul(x, wv);
    Tensor a = pt::scaled_dot_product_attention(q, k, v, {}, true);
    Tensor h = pt::layer_norm(a + x, {8}, Tensor(), Tensor(), 1e-5);
    return pt::mean(h * h);
  };
  auto vg = pt::value_and_grad(loss_fn, {.wrt = {1, 2, 3}});
  auto compiled = scenario_compile(vg, {.name = "attn_vg", .arg_names = {"x", "wq", "wk", "wv"}});
  const int64_t shapes[][2] = {{2, 16}, {3, 24}, {4, 32}, {2, 40}, {3, 17}};  // both dims change at once
  for (auto [b, t] : shapes) {
    Tensor x = pt::randn({b, t, 8});
    auto [le, ge] = vg(x, wq, wk, wv);
    auto [lc, gc] = compiled(x, wq, wk, wv);
    EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-4 * std::max(1.0f, std::abs(le.item<float>())));
    for (size_t i = 0; i < 3; ++i) expect_close(gc[i], ge[i], 1e-4, "shape " + std::to_string(t));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 2);  // static, then one dynamic graph for forward + backward
  EXPECT_EQ(s.cache_hits, 3);
}

TEST_F(ScenarioTrain, TrainStepMatchesEagerAdamWAndNeverRecompilesOnLrChanges) {
  struct Mlp : pt::Module {
    Tensor& w1;
    Tensor& b1;
    Tensor& w2;
    Mlp()
        : w1(register_parameter("w1", pt::randn({12, 6}) * 0.3)),
          b1(register_parameter("b1", pt::zeros({12}))),
          w2(register_parameter("w2", pt::randn({3, 12}) * 0.3)) {}
    Tensor forward(const Tensor& x) { return pt::linear(pt::relu(pt::linear(x, w1, b1)), w2, Tensor()); }
  };
  pt::manual_seed(11);
  auto eager_net = std::make_shared<Mlp>();
  auto net = std::make_shared<Mlp>();
  net->w1 = eager_net->w1.clone();
  net->b1 = eager_net->b1.clone();
  net->w2 = eager_net->w2.clone();
  for (Tensor* p : {&eager_net->w1, &eager_net->b1, &eager_net->w2}) p->requires_grad_();
  pt::optim::AdamW eager_opt({eager_net->w1, eager_net->b1, eager_net->w2}, pt::optim::AdamWOptions(0.05));
  pt::optim::AdamW opt({net->w1, net->b1, net->w2}, pt::optim::AdamWOptions(0.05));
  auto loss_of = [](Mlp& m, const Tensor& x, const Tensor& y) {
    return -pt::mean(pt::gather(pt::log_softmax(m.forward(x), 1), 1, y));
  };
  auto step = pt::compile_train_step(
      net, [&](Tensor x, Tensor y) { return loss_of(*net, x, y); }, opt,
      {.name = "mlp_step", .backend = scenario_backend()});
  float first = 0, last = 0;
  for (int i = 0; i < 12; ++i) {
    const double lr = 0.05 / (1 + i);  // a scheduler: a new learning rate every step
    eager_opt.param_groups[0].options.lr = lr;
    opt.param_groups[0].options.lr = lr;
    Tensor x = pt::randn({8, 6});
    Tensor y = labels(8, 3);
    eager_opt.zero_grad();
    Tensor le = loss_of(*eager_net, x, y);
    le.backward();
    eager_opt.step();
    Tensor lc = step(x, y);
    EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-4) << "step " << i;
    if (i == 0) first = lc.item<float>();
    last = lc.item<float>();
  }
  EXPECT_LT(last, first);
  expect_close(net->w1, eager_net->w1.detach(), 1e-4, "w1 after 12 steps");
  expect_close(net->w2, eager_net->w2.detach(), 1e-4, "w2 after 12 steps");
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.recompiles, 0);
  EXPECT_EQ(s.cache_hits, 11);
}

// Input donation (backend/donation.h) on the cpu backend: an output is written into a donated
// input's memory only where the loop program proves every element is read before it is overwritten.
TEST_F(ScenarioTrain, DonatedInputIsUpdatedInPlaceOnCpu) {
  pt::manual_seed(21);
  auto f = pt::compile([](Tensor p, Tensor g) { return p - 0.5 * g; }, {.name = "sgd_like", .backend = "cpu"});
  Tensor p = pt::randn({1000}), g = pt::randn({1000});
  Tensor expected = p - 0.5 * g;
  Tensor fresh = f(p, g);  // no donation: a new buffer, p unchanged
  EXPECT_NE(fresh.data_ptr(), p.data_ptr());
  EXPECT_EQ(pt::max_abs_diff(fresh, expected), 0.0);
  Tensor out;
  {
    pt::backend::DonationScope donate({p.data_ptr()});
    out = f(p, g);
  }
  EXPECT_EQ(out.data_ptr(), p.data_ptr());  // written in place
  EXPECT_EQ(pt::max_abs_diff(out, expected), 0.0);
  EXPECT_TRUE(pt::backend::donation_slot().empty());
}

TEST_F(ScenarioTrain, DonationIsRefusedWhereALaterStepReadsTheInput) {
  // The second output reads p at other elements (a reduction over all of p, and a reversed copy):
  // writing p + 1 into p would corrupt them, so whatever the fusion, the results must equal eager.
  pt::manual_seed(22);
  auto fn = [](Tensor p) {
    Tensor a = p + 1.0;
    Tensor b = pt::sum(p * p) + pt::slice(p, 0, 0, 1);
    Tensor c = pt::cumsum(p, 0);
    return std::make_tuple(a, b, c);
  };
  auto f = pt::compile(fn, {.name = "reads_after", .backend = "cpu"});
  Tensor p = pt::randn({257});
  auto [ea, eb, ec] = fn(p.clone());
  auto [ca, cb, cc] = [&] {
    pt::backend::DonationScope donate({p.data_ptr()});
    return f(p);
  }();
  EXPECT_LE(pt::max_abs_diff(ca, ea), 1e-6);
  EXPECT_LE(pt::max_abs_diff(cb, eb), 1e-3);
  EXPECT_LE(pt::max_abs_diff(cc, ec), 1e-4);
}

TEST_F(ScenarioTrain, TrainStepUpdatesTheArenasInPlaceOnCpu) {
  struct Lin : pt::Module {
    Tensor& w;
    Lin() : w(register_parameter("w", pt::randn({5, 4}) * 0.3)) {}
  };
  pt::manual_seed(23);
  auto net = std::make_shared<Lin>();
  auto ref = net->w.clone();
  pt::optim::AdamW opt({net->w}, pt::optim::AdamWOptions(0.01));
  auto step = pt::compile_train_step(
      net, [&](Tensor x) { return pt::mean(pt::linear(x, net->w) * pt::linear(x, net->w)); }, opt, {.name = "lin_step", .backend = "cpu"});
  Tensor x = pt::randn({3, 4});
  step(x);
  const void* where = net->w.data_ptr();
  for (int i = 0; i < 3; ++i) step(x);
  EXPECT_EQ(net->w.data_ptr(), where);
  EXPECT_GT(pt::max_abs_diff(net->w, ref), 0.0);  // trained
  // Eager AdamW from the same start reaches the same weights.
  Tensor w2 = ref.clone();
  w2.requires_grad_();
  pt::optim::AdamW eopt({w2}, pt::optim::AdamWOptions(0.01));
  for (int i = 0; i < 4; ++i) {
    eopt.zero_grad();
    pt::mean(pt::linear(x, w2) * pt::linear(x, w2)).backward();
    eopt.step();
  }
  EXPECT_LE(pt::max_abs_diff(net->w, w2.detach()), 1e-5);
}

// Input donation on the interp backend: the eager kernel computes the result and it is copied into
// the donated input's memory at the step that makes it, when no later step reads the input and no
// live value views it.
TEST_F(ScenarioTrain, DonatedInputIsUpdatedInPlaceOnInterp) {
  pt::manual_seed(24);
  auto f = pt::compile([](Tensor p, Tensor g) { return p - 0.5 * g; }, {.name = "sgd_like_interp", .backend = "interp"});
  Tensor p = pt::randn({1000}), g = pt::randn({1000});
  Tensor expected = p - 0.5 * g;
  Tensor fresh = f(p, g);
  EXPECT_NE(fresh.data_ptr(), p.data_ptr());
  EXPECT_EQ(pt::max_abs_diff(fresh, expected), 0.0);
  Tensor out;
  {
    pt::backend::DonationScope donate({p.data_ptr()});
    out = f(p, g);
  }
  EXPECT_EQ(out.data_ptr(), p.data_ptr());
  EXPECT_EQ(pt::max_abs_diff(out, expected), 0.0);
  EXPECT_EQ(pt::max_abs_diff(p, expected), 0.0);
  EXPECT_TRUE(pt::backend::donation_slot().empty());
}

TEST_F(ScenarioTrain, InterpDonatesOnlyAfterTheLastReadOfTheInput) {
  // a is made while later steps still read p, so it gets fresh memory; c (cumsum) is p's last reader
  // and of p's size, so it goes into p's memory; every result equals eager.
  pt::manual_seed(25);
  auto fn = [](Tensor p) {
    Tensor a = p + 1.0;
    Tensor b = pt::sum(p * p) + pt::slice(p, 0, 0, 1);
    Tensor c = pt::cumsum(p, 0);
    return std::make_tuple(a, b, c);
  };
  auto f = pt::compile(fn, {.name = "reads_after_interp", .backend = "interp"});
  Tensor p = pt::randn({257});
  auto [ea, eb, ec] = fn(p.clone());
  auto [ca, cb, cc] = [&] {
    pt::backend::DonationScope donate({p.data_ptr()});
    return f(p);
  }();
  EXPECT_NE(ca.data_ptr(), p.data_ptr());
  EXPECT_EQ(cc.data_ptr(), p.data_ptr());
  EXPECT_LE(pt::max_abs_diff(ca, ea), 1e-6);
  EXPECT_LE(pt::max_abs_diff(cb, eb), 1e-3);
  EXPECT_LE(pt::max_abs_diff(cc, ec), 1e-4);
}

TEST_F(ScenarioTrain, InterpRefusesDonationWhileAViewOfTheInputIsLive) {
  // q views p's memory and is read after a (p's last direct reader) is made: writing a into p would
  // change q + 1, so a gets fresh memory.
  pt::manual_seed(26);
  auto fn = [](Tensor p) {
    Tensor q = pt::transpose(p, 0, 1);
    Tensor a = p * 2.0;
    Tensor b = q + 1.0;
    return std::make_tuple(a, b);
  };
  auto f = pt::compile(fn, {.name = "view_live_interp", .backend = "interp"});
  Tensor p = pt::randn({4, 4});
  auto [ea, eb] = fn(p.clone());
  auto [ca, cb] = [&] {
    pt::backend::DonationScope donate({p.data_ptr()});
    return f(p);
  }();
  EXPECT_NE(ca.data_ptr(), p.data_ptr());
  EXPECT_EQ(pt::max_abs_diff(ca, ea), 0.0);
  EXPECT_EQ(pt::max_abs_diff(cb, eb), 0.0);
}

TEST_F(ScenarioTrain, TrainStepUpdatesTheArenasInPlaceOnInterp) {
  struct Lin : pt::Module {
    Tensor& w;
    Lin() : w(register_parameter("w", pt::randn({5, 4}) * 0.3)) {}
  };
  pt::manual_seed(27);
  auto net = std::make_shared<Lin>();
  auto ref = net->w.clone();
  pt::optim::AdamW opt({net->w}, pt::optim::AdamWOptions(0.01));
  auto step = pt::compile_train_step(
      net, [&](Tensor x) { return pt::mean(pt::linear(x, net->w) * pt::linear(x, net->w)); }, opt,
      {.name = "lin_step_interp", .backend = "interp"});
  Tensor x = pt::randn({3, 4});
  step(x);
  const void* where = net->w.data_ptr();
  for (int i = 0; i < 3; ++i) step(x);
  EXPECT_EQ(net->w.data_ptr(), where);
  Tensor w2 = ref.clone();
  w2.requires_grad_();
  pt::optim::AdamW eopt({w2}, pt::optim::AdamWOptions(0.01));
  for (int i = 0; i < 4; ++i) {
    eopt.zero_grad();
    pt::mean(pt::linear(x, w2) * pt::linear(x, w2)).backward();
    eopt.step();
  }
  EXPECT_LE(pt::max_abs_diff(net->w, w2.detach()), 1e-5);
}

// Training-mode batch norm in a compiled step: the running statistics are module buffers, donated
// graph inputs and outputs, so every step updates them in place with one compile; after N steps they
// equal the eager run's (the same formulas through the eager tape and optim::SGD).
struct BnNet : pt::Module {
  Tensor& w;
  Tensor& b;
  Tensor& gamma;
  Tensor& beta;
  Tensor& fc;
  Tensor& running_mean;
  Tensor& running_var;
  BnNet()
      : w(register_parameter("w", pt::randn({4, 1, 3, 3}) * 0.4)),
        b(register_parameter("b", pt::randn({4}) * 0.1)),
        gamma(register_parameter("gamma", pt::ones({4}))),
        beta(register_parameter("beta", pt::zeros({4}))),
        fc(register_parameter("fc", pt::randn({3, 4}) * 0.5)),
        running_mean(register_buffer("running_mean", pt::zeros({4}))),
        running_var(register_buffer("running_var", pt::ones({4}))) {}
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = pt::conv2d(x, w, b, {1, 1}, {1, 1});
    h = pt::relu(pt::batch_norm_train(h, gamma, beta, running_mean, running_var, 0.1, 1e-5));
    Tensor logits = pt::linear(pt::mean(h, {2, 3}), fc, Tensor());
    return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, y));
  }
  std::vector<Tensor> params() { return {w, b, gamma, beta, fc}; }
};

TEST_F(ScenarioTrain, BatchNormRunningStatsUpdateInPlaceWithOneCompile) {
  pt::manual_seed(31);
  auto eager = std::make_shared<BnNet>();
  auto net = std::make_shared<BnNet>();
  for (auto [dst, src] : {std::pair{&net->w, &eager->w}, {&net->b, &eager->b}, {&net->fc, &eager->fc}}) *dst = src->clone();
  for (Tensor p : eager->params()) p.requires_grad_();
  pt::optim::SGDOptions o{.lr = 0.2, .momentum = 0.9};
  pt::optim::SGD eager_opt(eager->params(), o);
  pt::optim::SGD opt(net->params(), o);
  auto step = pt::compile_train_step(
      net, [&](Tensor x, Tensor y) { return net->loss(x, y); }, opt, {.name = "bn_step", .backend = scenario_backend()});
  const void* rm_at = net->running_mean.data_ptr();
  const void* rv_at = net->running_var.data_ptr();
  const int steps = 6;
  for (int i = 0; i < steps; ++i) {
    Tensor x = pt::randn({5, 1, 6, 6}) * (1 + 0.2 * i) + 0.3 * i;  // statistics that move between steps
    Tensor y = labels(5, 3);
    eager_opt.zero_grad();
    Tensor le = eager->loss(x, y);
    le.backward();
    eager_opt.step();
    Tensor lc = step(x, y);
    EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-4) << "step " << i;
  }
  expect_close(net->running_mean, eager->running_mean, 1e-5, "running_mean after 6 steps");
  expect_close(net->running_var, eager->running_var, 1e-5, "running_var after 6 steps");
  expect_close(net->w, eager->w.detach(), 1e-4, "conv weight after 6 steps");
  expect_close(net->gamma, eager->gamma.detach(), 1e-4, "gamma after 6 steps");
  EXPECT_GT(pt::max_abs_diff(net->running_mean, pt::zeros({4})), 0.1);  // they moved
  EXPECT_EQ(net->running_mean.data_ptr(), rm_at);  // the module's buffers, updated in place
  EXPECT_EQ(net->running_var.data_ptr(), rv_at);
  auto s = pt::stats();
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.recompiles, 0);
  EXPECT_EQ(s.cache_hits, steps - 1);
  // A new batch size recompiles once (automatic dynamic), and the statistics keep following eager.
  for (int64_t B : {7, 9}) {
    Tensor x = pt::randn({B, 1, 6, 6});
    Tensor y = labels(B, 3);
    eager_opt.zero_grad();
    eager->loss(x, y).backward();
    eager_opt.step();
    step(x, y);
  }
  expect_close(net->running_var, eager->running_var, 1e-5, "running_var after dynamic batches");
  EXPECT_EQ(pt::stats().compiles, 2);
}

TEST_F(ScenarioTrain, BatchNormStatsOutsideTheModuleAreRefused) {
  // Statistics the step cannot see as buffers (captured by value) would be baked into the graph and
  // their update lost: a NotImplementedError at compile time names the remedy.
  pt::manual_seed(32);
  auto net = std::make_shared<BnNet>();
  Tensor rm = pt::zeros({4}), rv = pt::ones({4});
  pt::optim::SGD opt(net->params(), {.lr = 0.1});
  auto step = pt::compile_train_step(
      net,
      [&](Tensor x) {
        return pt::mean(pt::batch_norm_train(pt::conv2d(x, net->w, net->b), net->gamma, net->beta, rm, rv));
      },
      opt, {.name = "bn_captured_step", .backend = scenario_backend()});
  try {
    step(pt::randn({2, 1, 5, 5}));
    FAIL() << "expected NotImplementedError";
  } catch (const pt::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("buffer of the module"), std::string::npos) << e.what();
  }
}

// The three parts of one train-step compile: forward ops carry the user's line, the rules' ops
// `[bwd of file:line]`, the flat gradients and the optimizer update `[optim at file:line]` (the line
// that made the step); `protean report` counts each part from the trace's graph event.
TEST_F(ScenarioTrain, TrainStepGraphAndReportShowForwardBackwardAndOptimizerParts) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("protean_train_parts_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  pt::manual_seed(33);
  auto net = std::make_shared<BnNet>();
  pt::optim::SGD opt(net->params(), {.lr = 0.1, .momentum = 0.9});
  pt::observe::set_trace_dir(dir.string());
  const std::string trace_path = pt::observe::trace_file();
  {
    auto step = pt::compile_train_step(
        net, [&](Tensor x, Tensor y) { return net->loss(x, y); }, opt, {.name = "parts_step", .backend = "interp"});
    step(pt::randn({4, 1, 5, 5}), labels(4, 3));
  }
  pt::observe::set_trace_dir("");
  // The compiled graph (after the passes) as the trace's graph event holds it.
  std::ifstream in(trace_path);
  std::stringstream text;
  text << in.rdbuf();
  std::string ir;
  std::istringstream events(text.str());
  for (std::string ev; std::getline(events, ev);) {
    nlohmann::json j = nlohmann::json::parse(ev, nullptr, false);
    if (j.is_object() && j.value("event", "") == "graph") ir = j.value("ir", "");
  }
  ASSERT_FALSE(ir.empty()) << text.str();
  const std::string& log = ir;
  int64_t fwd = 0, bwd = 0, optim = 0, fwd_conv = 0;
  std::istringstream lines(ir);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" = ") == std::string::npos || line.find("constant()") != std::string::npos) continue;
    const bool b = line.find("# [bwd of train_scenarios.cpp:") != std::string::npos;
    const bool o = line.find("# [optim at train_scenarios.cpp:") != std::string::npos;
    (b ? bwd : o ? optim : fwd) += 1;
    if (line.find("= conv2d(") != std::string::npos && !b && !o) ++fwd_conv;
    if (line.find("= cat(") != std::string::npos) {
      EXPECT_TRUE(o) << line;  // the flat gradient of the arena
    }
  }
  EXPECT_EQ(fwd_conv, 1) << log;  // the forward conv; the gradients' convs are backward
  EXPECT_GT(fwd, 0) << log;
  EXPECT_GT(bwd, 0) << log;
  EXPECT_GE(optim, 4) << log;  // SGD with momentum: at least buf update, param update, flatten, cat
  // The report reads the same split from the trace.
  namespace rep = pt::observe::report;
  rep::TraceModel m = rep::read_trace_texts({{"t.jsonl", text.str()}});
  const std::string report = rep::render_plain_text(m, rep::analyse(m));
  const std::string expected = "train step parts: forward " + std::to_string(fwd) + " ops, backward " +
                               std::to_string(bwd) + " ops, optimizer " + std::to_string(optim) + " ops";
  EXPECT_NE(report.find(expected), std::string::npos) << expected << "\n" << report;
  fs::remove_all(dir);
}

// ---- compile_train_step: failures, skipped parameters, structure changes, shared parameters ----------

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

struct SmallMlp : pt::Module {
  Tensor& w1;
  Tensor& b1;
  Tensor& w2;
  SmallMlp()
      : w1(register_parameter("w1", pt::randn({12, 6}) * 0.3)),
        b1(register_parameter("b1", pt::zeros({12}))),
        w2(register_parameter("w2", pt::randn({3, 12}) * 0.3)) {}
  Tensor loss(const Tensor& x, const Tensor& y) const {
    Tensor d = pt::linear(pt::tanh(pt::linear(x, w1, b1)), w2, Tensor()) - y;
    return pt::mean(d * d);
  }
  std::vector<Tensor> params() { return {w1, b1, w2}; }
  std::shared_ptr<SmallMlp> twin() const {
    auto t = std::make_shared<SmallMlp>();
    t->w1 = w1.detach().clone();
    t->b1 = b1.detach().clone();
    t->w2 = w2.detach().clone();
    return t;
  }
};

TEST_F(ScenarioTrain, AStepThatThrowsLeavesStepCountParametersStateAndBuffersAsTheyWere) {
  // A wrong batch (dtype, size: errors while tracing) or a label out of range (an error while the
  // compiled program runs, after batch_norm_train rewrote the donated running statistics) changes
  // nothing: the next good step continues as if the failed ones had not been made.
  pt::manual_seed(41);
  auto eager = std::make_shared<BnNet>();
  auto net = std::make_shared<BnNet>();
  for (auto [dst, src] : {std::pair{&net->w, &eager->w}, {&net->b, &eager->b}, {&net->fc, &eager->fc}}) *dst = src->clone();
  for (Tensor p : eager->params()) p.requires_grad_();
  pt::optim::Adam eager_opt(eager->params(), {.lr = 0.05});
  pt::optim::Adam opt(net->params(), {.lr = 0.05});
  auto step = pt::compile_train_step(
      net, [&](Tensor x, Tensor y) { return net->loss(x, y); }, opt, {.name = "bn_fail", .backend = scenario_backend()});
  auto good = [&](int i) {
    Tensor x = pt::randn({5, 1, 6, 6}) + 0.3 * i;
    Tensor y = labels(5, 3);
    eager_opt.zero_grad();
    Tensor le = eager->loss(x, y);
    le.backward();
    eager_opt.step();
    EXPECT_NEAR(step(x, y).item<float>(), le.item<float>(), 1e-4) << "step " << i;
  };
  good(0);
  const Tensor rm = net->running_mean.clone(), rv = net->running_var.clone(), w = net->w.clone(), fc = net->fc.clone();
  Tensor x = pt::randn({5, 1, 6, 6}) * 3.0 + 1.0;  // statistics far from the running ones
  Tensor bad_label = pt::tensor<int64_t>({0, 1, 7, 2, 0}, {5, 1});
  std::string e = error_of<pt::ValueError>([&] { step(x, bad_label); });
  EXPECT_NE(e.find("index 7 is out of bounds"), std::string::npos) << e;
  EXPECT_THROW(step(x.to(pt::DType::F64), labels(5, 3)), pt::Error);
  EXPECT_THROW(step(pt::randn({5, 2, 6, 6}), labels(5, 3)), pt::Error);
  EXPECT_EQ(opt.state(net->w).step, 1);
  EXPECT_LE(pt::max_abs_diff(net->running_mean, rm), 0.0);
  EXPECT_LE(pt::max_abs_diff(net->running_var, rv), 0.0);
  EXPECT_LE(pt::max_abs_diff(net->w, w), 0.0);
  EXPECT_LE(pt::max_abs_diff(net->fc, fc), 0.0);
  good(1);
  good(2);
  EXPECT_EQ(opt.state(net->w).step, 3);
  // Not running_mean: the conv bias before a batch norm gets a gradient of rounding noise only, which
  // Adam turns into whole steps of either sign (the loss does not see it; running_mean does).
  expect_close(net->running_var, eager->running_var, 1e-5, "running_var");
  expect_close(net->w, eager->w.detach(), 1e-4, "conv weight");
  expect_close(net->fc, eager->fc.detach(), 1e-4, "fc");
}

TEST_F(ScenarioTrain, AParameterWithoutAGradientIsSkippedAsEagerly) {
  // torch.optim skips a parameter whose grad is None: no weight decay, no momentum, no state. Here u
  // is not used and v only under NoGradGuard; w between them in the arena keeps training.
  struct Net : pt::Module {
    Tensor& u;
    Tensor& w;
    Tensor& v;
    Net() : u(register_parameter("u", pt::randn({5}))), w(register_parameter("w", pt::randn({4, 3}))),
            v(register_parameter("v", pt::randn({3}))) {}
    Tensor loss(const Tensor& x) const {
      Tensor shift;
      {
        pt::NoGradGuard no_grad;
        shift = v * 0.5;
      }
      return pt::sum(pt::tanh(pt::matmul(x, w) + shift));
    }
  };
  auto check = [](auto make_opt, const char* name) {
    pt::manual_seed(43);
    auto eager = std::make_shared<Net>(), net = std::make_shared<Net>();
    net->u = eager->u.clone();
    net->w = eager->w.clone();
    net->v = eager->v.clone();
    for (Tensor* p : {&eager->u, &eager->w, &eager->v}) p->requires_grad_();
    auto eager_opt = make_opt(std::vector<Tensor>{eager->u, eager->w, eager->v});
    auto opt = make_opt(std::vector<Tensor>{net->u, net->w, net->v});
    auto step = pt::compile_train_step(net, [&](Tensor x) { return net->loss(x); }, *opt, {.name = name, .backend = scenario_backend()});
    const Tensor u0 = net->u.clone(), v0 = net->v.clone();
    for (int i = 0; i < 3; ++i) {
      Tensor x = pt::randn({2, 4});
      eager_opt->zero_grad();
      eager->loss(x).backward();
      eager_opt->step();
      step(x);
    }
    EXPECT_LE(pt::max_abs_diff(net->u, u0), 0.0) << name;
    EXPECT_LE(pt::max_abs_diff(net->v, v0), 0.0) << name;
    expect_close(net->w, eager->w.detach(), 1e-5, name);
    EXPECT_EQ(opt->state(net->w).step, 3) << name;
    EXPECT_EQ(opt->state(net->u).step, 0) << name;
    EXPECT_EQ(opt->state(net->v).step, 0) << name;
  };
  check([](std::vector<Tensor> ps) { return std::make_unique<pt::optim::AdamW>(ps, pt::optim::AdamWOptions(0.1)); }, "skip_adamw");
  check([](std::vector<Tensor> ps) {
    return std::make_unique<pt::optim::SGD>(ps, pt::optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
  }, "skip_sgd");
}

/// Six steps of an MLP, compiled and eager, with `change(options, i)` applied to both optimizers'
/// options before step i.
template <typename Opt, typename Options, typename Change>
void follow_eager_through_option_changes(Options options, Change change, const char* name) {
  pt::manual_seed(47);
  auto net = std::make_shared<SmallMlp>();
  auto eager = net->twin();
  for (Tensor p : eager->params()) p.requires_grad_();
  Opt eager_opt(eager->params(), options), opt(net->params(), options);
  auto step = pt::compile_train_step(net, [&](Tensor x, Tensor y) { return net->loss(x, y); }, opt,
                                     {.name = name, .backend = scenario_backend()});
  for (int i = 0; i < 6; ++i) {
    change(eager_opt.param_groups[0].options, i);
    change(opt.param_groups[0].options, i);
    Tensor x = pt::randn({8, 6}), y = pt::randn({8, 3});
    eager_opt.zero_grad();
    Tensor le = eager->loss(x, y);
    le.backward();
    eager_opt.step();
    Tensor lc = step(x, y);
    EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-5) << name << " step " << i;
  }
  expect_close(net->w1, eager->w1.detach(), 1e-5, name);
  expect_close(net->w2, eager->w2.detach(), 1e-5, name);
}

TEST_F(ScenarioTrain, ChangingAStructuralOptionCompilesTheStepAgain) {
  // SGD: momentum from 0 to nonzero (a momentum buffer appears), then nesterov; Adam: amsgrad, then
  // maximize. Each change compiles the step again and the step keeps following the eager optimizer.
  follow_eager_through_option_changes<pt::optim::SGD>(
      pt::optim::SGDOptions{.lr = 0.1},
      [](pt::optim::SGDOptions& o, int i) {
        o.momentum = i >= 2 ? 0.9 : 0.0;
        o.nesterov = i >= 4;
      },
      "sgd_structure");
  EXPECT_EQ(pt::stats().compiles, 3);
  pt::reset();
  follow_eager_through_option_changes<pt::optim::Adam>(
      pt::optim::AdamOptions{.lr = 0.01},
      [](pt::optim::AdamOptions& o, int i) {
        o.amsgrad = i >= 2;
        o.maximize = i >= 4;
      },
      "adam_structure");
  EXPECT_EQ(pt::stats().compiles, 3);
}

TEST_F(ScenarioTrain, TwoStepsOverTheSameParametersTrainOneSetOfValues) {
  // Two optimizers (plain SGD: no state) over the same parameters, their steps alternating, train as
  // one optimizer does eagerly: the step that runs packs the parameters back into its arenas.
  pt::manual_seed(53);
  auto net = std::make_shared<SmallMlp>();
  auto eager = net->twin();
  for (Tensor p : eager->params()) p.requires_grad_();
  pt::optim::SGD eager_opt(eager->params(), {.lr = 0.1});
  pt::optim::SGD opt1(net->params(), {.lr = 0.1}), opt2(net->params(), {.lr = 0.1});
  auto loss = [&](Tensor x, Tensor y) { return net->loss(x, y); };
  auto s1 = pt::compile_train_step(net, loss, opt1, {.name = "first", .backend = scenario_backend()});
  auto s2 = pt::compile_train_step(net, loss, opt2, {.name = "second", .backend = scenario_backend()});
  Tensor held = net->w1;  // a handle taken before: it follows the parameter
  for (int i = 0; i < 4; ++i) {
    Tensor x = pt::randn({8, 6}), y = pt::randn({8, 3});
    eager_opt.zero_grad();
    Tensor le = eager->loss(x, y);
    le.backward();
    eager_opt.step();
    Tensor lc = i % 2 ? s1(x, y) : s2(x, y);
    EXPECT_NEAR(lc.item<float>(), le.item<float>(), 1e-5) << "step " << i;
  }
  expect_close(net->w1, eager->w1.detach(), 1e-5, "w1");
  expect_close(net->w2, eager->w2.detach(), 1e-5, "w2");
  expect_close(held, eager->w1.detach(), 1e-5, "a handle to w1");
}

TEST_F(ScenarioTrain, OverlappingParametersAreRefusedAtConstruction) {
  struct Views : pt::Module {
    Tensor& a;
    Tensor& b;
    Views(const Tensor& x, const Tensor& y) : a(register_parameter("a", x)), b(register_parameter("b", y)) {}
  };
  Tensor base = pt::randn({3, 4});
  auto rows = std::make_shared<Views>(base.slice(0, 0, 2), base.slice(0, 1, 3));  // share row 1
  pt::optim::SGD opt({rows->a, rows->b}, {.lr = 0.1});
  std::string e = error_of<pt::ValueError>([&] {
    pt::compile_train_step(rows, [&](Tensor x) { return pt::sum(rows->a * x) + pt::sum(rows->b * x); }, opt,
                           {.name = "overlap", .backend = scenario_backend()});
  });
  EXPECT_NE(e.find("compile_train_step: parameters 'a' and 'b' overlap in memory"), std::string::npos) << e;
  // Interleaved columns share a storage but no element: accepted.
  auto cols = std::make_shared<Views>(base.slice(1, 0, 4, 2), base.slice(1, 1, 4, 2));
  pt::optim::SGD opt2({cols->a, cols->b}, {.lr = 0.1});
  EXPECT_NO_THROW(pt::compile_train_step(cols, [&](Tensor x) { return pt::sum(cols->a * x); }, opt2,
                                         {.name = "interleaved", .backend = scenario_backend()}));
}

TEST_F(ScenarioTrain, AReassignedParameterIsAnErrorAtTheNextCall) {
  pt::manual_seed(59);
  auto net = std::make_shared<SmallMlp>();
  pt::optim::SGD opt(net->params(), {.lr = 0.1});
  auto step = pt::compile_train_step(net, [&](Tensor x, Tensor y) { return net->loss(x, y); }, opt,
                                     {.name = "reassign", .backend = scenario_backend()});
  Tensor x = pt::randn({8, 6}), y = pt::randn({8, 3});
  step(x, y);
  net->w1 = pt::zeros({12, 6});
  std::string e = error_of<pt::ValueError>([&] { step(x, y); });
  EXPECT_NE(e.find("the module's parameter 'w1' was reassigned after the step was made"), std::string::npos) << e;
}

TEST_F(ScenarioTrain, AStepWithNothingToTrainSaysWhy) {
  auto net = std::make_shared<SmallMlp>();
  pt::optim::SGD opt(net->params(), {.lr = 0.1});
  Tensor x = pt::randn({8, 6}), y = pt::randn({8, 3});
  auto detached = pt::compile_train_step(net, [&](Tensor a, Tensor b) { return net->loss(a, b).detach(); }, opt,
                                         {.name = "detached", .backend = scenario_backend()});
  std::string e = error_of<pt::ValueError>([&] { detached(x, y); });
  EXPECT_NE(e.find("compile_train_step: the loss does not require grad"), std::string::npos) << e;
  EXPECT_NE(e.find("NoGradGuard"), std::string::npos) << e;
  auto no_grad = pt::compile_train_step(net, [&](Tensor a, Tensor b) {
    pt::NoGradGuard g;
    return net->loss(a, b);
  }, opt, {.name = "no_grad", .backend = scenario_backend()});
  e = error_of<pt::ValueError>([&] { no_grad(x, y); });
  EXPECT_NE(e.find("compile_train_step: the loss does not require grad"), std::string::npos) << e;
  EXPECT_EQ(opt.state(net->w1).step, 0);
  auto vector_loss = pt::compile_train_step(net, [&](Tensor a) { return pt::linear(a, net->w1, net->b1); }, opt,
                                            {.name = "vector_loss", .backend = scenario_backend()});
  e = error_of<pt::ValueError>([&] { vector_loss(x); });
  EXPECT_NE(e.find("compile_train_step: the loss has shape [8, 12]; it must have one element"), std::string::npos) << e;
}

}  // namespace

namespace {
// docs/training.md's compile_train_step example, as written there (Net, parameters(), the loss
// lambda, a learning rate changed every step): it compiles once and its loss falls.
struct DocNet : pt::Module {  // a 784-256-10 MLP
  Tensor& w1 = register_parameter("w1", pt::randn({256, 784}) * 0.05);
  Tensor& b1 = register_parameter("b1", pt::zeros({256}));
  Tensor& w2 = register_parameter("w2", pt::randn({10, 256}) * 0.05);
  Tensor loss(const Tensor& x, const Tensor& y) const {  // x [B, 784] f32, y [B] i64 class indices
    Tensor logits = pt::linear(pt::relu(pt::linear(x, w1, b1)), w2, Tensor());
    return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, pt::unsqueeze(y, 1)));
  }
};
}  // namespace

TEST_F(ScenarioTrain, TheDocsCompileTrainStepExampleTrains) {
  pt::manual_seed(3);
  auto net = std::make_shared<DocNet>();
  EXPECT_EQ(net->parameters().size(), 3u);
  EXPECT_EQ(net->parameters()[2].impl(), net->w2.impl());
  pt::optim::AdamW opt(net->parameters(), pt::optim::AdamWOptions(1e-3));
  auto step = pt::compile_train_step(net, [net](Tensor x, Tensor y) { return net->loss(x, y); }, opt,
                                     {.name = "docs_train_step", .arg_names = {"x", "y"}, .backend = "cpu"});
  Tensor x = pt::randn({32, 784}), y = pt::randint(0, 10, {32});
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    opt.param_groups[0].options.lr = 1e-3 * (1.0 + 0.1 * (i % 3));
    Tensor l = step(x, y);
    EXPECT_EQ(l.dim(), 0);
    (i == 0 ? first : last) = l.item<double>();
  }
  EXPECT_LT(last, first * 0.5) << "the loss of one repeated batch did not fall";
  EXPECT_EQ(pt::stats().compiles, 1);
  EXPECT_EQ(pt::stats().recompiles, 0);
}
