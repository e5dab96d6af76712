// Data-parallel training under mpirun (registered with ctest as DdpMpi.*; docs/distributed.md). The
// model is examples/char_gpt.h on the interp backend (fast to compile), AdamW.
//   ddp_mpi_test sync          ranks start from different weights and see different sequence lengths
//                              (rank 0: 64, 128, 96…; rank 1: 80, 200, 50…) with compiler collectives:
//                              the parameters are identical on every rank after every step, and each
//                              rank compiles the backward frame once (one dynamic graph) and the
//                              optimizer frame once
//   ddp_mpi_test equivalence   2 ranks × batch B give the loss curve and weights of 1 rank × batch 2B
//   ddp_mpi_test no_collectives  the same lengths without compiler collectives: every rank compiles the
//                              backward frame twice (static, then dynamic); prints the steps
//   ddp_mpi_test new_batch     after the dynamic graph exists, rank 0 alone changes its batch size: every
//                              rank recompiles at that step (no hang), parameters stay identical
//   ddp_mpi_test early_exit    the last rank stops after two steps: the others get an error naming the
//                              frame and that rank within PROTEAN_COLLECTIVES_TIMEOUT_S (+ slack)
//   ddp_mpi_test buffers       batch_norm_train's running statistics: rank 0's at creation and before every
//                              step (broadcast_buffers), each rank's batch updating them
//   ddp_mpi_test dtypes        the MPI group's all_reduce on every dtype and reduction, broadcast, errors
//   ddp_mpi_test allreduce_timeout  without collectives, the last rank joins an all-reduce after the
//                              timeout: the others get RuntimeError naming the all-reduce, never a hang
// Exit code 0 when this rank's checks pass; every failure prints "rank R: FAIL ...".
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "char_gpt.h"
#include "protean/mpi.h"
#include "mpi_test_util.h"
#include "protean/distributed.h"
#include "protean/optim.h"
#include "protean/protean.h"
#include "protean/tensor_version.h"

namespace pt = protean;
namespace dist = protean::distributed;
using mpi_test::check;
using mpi_test::g_failures;
using mpi_test::g_rank;
using mpi_test::g_size;
using mpi_test::same_on_all_ranks;

namespace {

template <typename Step>
uint64_t arena_hash(const Step& step) {
  uint64_t h = 1469598103934665603ull;
  for (const pt::Tensor& a : step.parameter_arenas())
    h = mpi_test::fnv(a.data_ptr(), static_cast<size_t>(a.int_numel()) * a.itemsize(), h);
  return h;
}

const char* backend() {
  const char* b = std::getenv("PROTEAN_DDP_TEST_BACKEND");
  return b && *b ? b : "interp";
}

char_gpt::Config small_config() {
  char_gpt::Config c;
  c.d = 16;
  c.heads = 2;
  c.layers = 1;
  c.max_len = 256;
  return c;
}

struct Run {
  std::shared_ptr<char_gpt::Gpt> model;
  std::unique_ptr<pt::optim::AdamW> opt;
};

Run make_run(uint64_t seed) {
  pt::manual_seed(seed);
  Run r;
  r.model = std::make_shared<char_gpt::Gpt>(small_config());
  r.opt = std::make_unique<pt::optim::AdamW>(r.model->parameters(), pt::optim::AdamWOptions(1e-2));
  return r;
}

auto make_step(Run& r, std::shared_ptr<dist::ProcessGroup> group, bool collectives) {
  auto model = r.model;
  return dist::compile_train_step(
      model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, *r.opt, std::move(group),
      {.name = "gpt_step", .arg_names = {"tokens", "targets"}, .backend = backend(), .compiler_collectives = collectives});
}

const std::vector<int64_t>& text() {
  static const std::vector<int64_t> t = char_gpt::corpus(20000);
  return t;
}

int64_t length_at(int step) {
  static const int64_t r0[] = {64, 128, 96, 112, 72, 120};
  static const int64_t r1[] = {80, 200, 50, 144, 60, 176};
  const int64_t* l = g_rank == 0 ? r0 : r1;
  return g_rank <= 1 ? l[step % 6] : 40 + 8 * g_rank + step;  // a third rank: its own lengths too
}

// Ranks start from different weights (rank-specific seeds): the broadcast from rank 0 must align them.
int sync(std::shared_ptr<dist::ProcessGroup> group, bool collectives, bool expect_one_compile) {
  Run r = make_run(100 + static_cast<uint64_t>(g_rank));
  auto step = make_step(r, group, collectives);
  check(same_on_all_ranks(arena_hash(step)), "parameters differ across ranks after the initial broadcast");
  std::vector<int> compile_steps;
  int64_t compiles = 0;
  float first = 0, last = 0;
  const int steps = 6;
  for (int i = 0; i < steps; ++i) {
    auto [x, y] = char_gpt::batch_at(text(), 4 * i + 2 * g_rank, 2, length_at(i));
    pt::Tensor loss = step(x, y);
    if (i == 0) first = loss.item<float>();
    last = loss.item<float>();
    check(same_on_all_ranks(arena_hash(step)), fmt::format("parameters differ across ranks after step {}", i));
    auto s = step.stats();
    if (s.grad.compiles > compiles) compile_steps.push_back(i);
    compiles = s.grad.compiles;
  }
  auto s = step.stats();
  std::string steps_txt;
  for (int c : compile_steps) steps_txt += fmt::format(" {}", c);
  std::fprintf(stderr, "rank %d: backward-frame compiles %lld at steps%s; optimizer-frame compiles %lld; loss %.4f -> %.4f; "
               "%lld all-reduces, %lld bytes\n",
               g_rank, static_cast<long long>(s.grad.compiles), steps_txt.c_str(), static_cast<long long>(s.update.compiles),
               first, last, static_cast<long long>(s.all_reduces), static_cast<long long>(s.all_reduce_bytes));
  if (expect_one_compile) {
    check(s.grad.compiles == 1, fmt::format("expected 1 backward-frame compile with collectives, got {}", s.grad.compiles));
  } else {
    check(s.grad.compiles == 2, fmt::format("expected 2 backward-frame compiles without collectives, got {}", s.grad.compiles));
  }
  check(s.update.compiles == 1, fmt::format("expected 1 optimizer-frame compile, got {}", s.update.compiles));
  check(s.all_reduces == steps * static_cast<int64_t>(step.parameter_arenas().size()), "one all-reduce per arena per step");
  check(last < first, fmt::format("loss did not decrease: {} -> {}", first, last));
  return g_failures;
}

// 2 ranks × batch B vs 1 rank × batch 2B from the same initial weights and the same samples: rank r
// takes rows [r·B, (r+1)·B) of the reference batch. The data-parallel loss is the ranks' mean.
int equivalence(std::shared_ptr<dist::ProcessGroup> group) {
  const int64_t B = 2, steps = 6;
  const int64_t len[] = {48, 48, 64, 64, 40, 40};
  // The reference: one process, batch size·B, no exchange.
  Run ref = make_run(7);
  auto ref_model = ref.model;
  auto ref_step = pt::compile_train_step(
      ref_model, [ref_model](pt::Tensor x, pt::Tensor y) { return ref_model->loss(x, y); }, *ref.opt,
      {.name = "gpt_ref", .backend = backend()});
  std::vector<float> ref_losses;
  for (int64_t i = 0; i < steps; ++i) {
    auto [x, y] = char_gpt::batch_at(text(), 10 * i, B * g_size, len[i]);
    ref_losses.push_back(ref_step(x, y).item<float>());
  }
  std::vector<float> ref_w;
  for (const auto& [n, t] : ref.model->named_parameters()) {
    pt::Tensor c = t.contiguous();
    ref_w.insert(ref_w.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.int_numel());
  }

  Run r = make_run(7);
  auto step = make_step(r, group, true);
  double worst_loss = 0, worst_w = 0;
  for (int64_t i = 0; i < steps; ++i) {
    auto [x, y] = char_gpt::batch_at(text(), 10 * i + B * g_rank, B, len[i]);
    pt::Tensor loss = step(x, y).contiguous();
    group->all_reduce(loss, dist::ReduceOp::Avg);
    const double diff = std::abs(loss.item<float>() - ref_losses[static_cast<size_t>(i)]);
    worst_loss = std::max(worst_loss, diff);
    if (g_rank == 0)
      std::fprintf(stderr, "step %lld: 1 rank x %lld loss %.6f, %d ranks x %lld loss %.6f\n", static_cast<long long>(i),
                   static_cast<long long>(B * g_size), ref_losses[static_cast<size_t>(i)], g_size,
                   static_cast<long long>(B), loss.item<float>());
  }
  size_t k = 0;
  for (const auto& [n, t] : r.model->named_parameters()) {
    pt::Tensor c = t.contiguous();
    for (int64_t j = 0; j < c.int_numel(); ++j, ++k)
      worst_w = std::max(worst_w, static_cast<double>(std::abs(c.data_ptr<float>()[j] - ref_w[k])));
  }
  std::fprintf(stderr, "rank %d: largest loss difference %.3g, largest weight difference %.3g\n", g_rank, worst_loss, worst_w);
  check(k == ref_w.size(), "parameter counts differ");
  check(worst_loss < 1e-4, fmt::format("loss curves differ by {:.3g} (tolerance 1e-4)", worst_loss));
  check(worst_w < 1e-4, fmt::format("weights differ by {:.3g} after {} steps (tolerance 1e-4)", worst_w, steps));
  return g_failures;
}

int new_batch(std::shared_ptr<dist::ProcessGroup> group) {
  Run r = make_run(5);
  auto step = make_step(r, group, true);
  std::vector<int64_t> compiles_at;
  for (int i = 0; i < 5; ++i) {
    const int64_t batch = (i == 3 && g_rank == 0) ? 3 : 2;  // rank 0 alone changes its batch at step 3
    auto [x, y] = char_gpt::batch_at(text(), i, batch, length_at(i));
    step(x, y);
    compiles_at.push_back(step.stats().grad.compiles);
    check(same_on_all_ranks(arena_hash(step)), fmt::format("parameters differ across ranks after step {}", i));
  }
  check(compiles_at == std::vector<int64_t>({1, 1, 1, 2, 2}),
        fmt::format("expected backward-frame compiles 1,1,1,2,2 by step, got {}", fmt::join(compiles_at, ",")));
  check(same_on_all_ranks(static_cast<uint64_t>(compiles_at.back())), "compile counts differ across ranks");
  return g_failures;
}

// Module buffers (batch_norm_train's running statistics): ranks start from different ones and see
// different batches. The step broadcasts rank 0's buffers at creation and before every step (torch
// DDP's broadcast_buffers), so after a step each rank holds rank 0's statistics updated with its own
// batch; the parameters stay identical.
struct BnNet : pt::Module {
  pt::Tensor& w = register_parameter("w", pt::randn({4, 3}) * 0.5);
  pt::Tensor& gamma = register_parameter("gamma", pt::ones({4}));
  pt::Tensor& beta = register_parameter("beta", pt::zeros({4}));
  pt::Tensor& running_mean = register_buffer("running_mean", pt::full({4}, 0.1 * (g_rank + 1)));
  pt::Tensor& running_var = register_buffer("running_var", pt::full({4}, 1.0 + g_rank));
  // a buffer of another dtype the loss does not read: its own broadcast (the f32 ones share one)
  pt::Tensor& scale = register_buffer("scale", pt::cast(pt::full({3}, 2.0 + g_rank), pt::DType::F64));
  pt::Tensor loss(const pt::Tensor& x) {
    pt::Tensor h = pt::batch_norm_train(pt::linear(x, w, pt::Tensor()), gamma, beta, running_mean, running_var, 0.1, 1e-5);
    return pt::mean(pt::relu(h) * pt::relu(h));
  }
};

int buffers(std::shared_ptr<dist::ProcessGroup> group) {
  pt::manual_seed(40 + static_cast<uint64_t>(g_rank));
  auto net = std::make_shared<BnNet>();
  pt::optim::SGD opt({net->w, net->gamma, net->beta}, {.lr = 0.1});
  auto step = dist::compile_train_step(net, [net](pt::Tensor x) { return net->loss(x); }, opt, group,
                                       {.name = "bn_step", .backend = backend()});
  auto hash = [](const pt::Tensor& t) {
    return mpi_test::fnv(t.data_ptr(), static_cast<size_t>(t.int_numel()) * t.itemsize(), 1469598103934665603ull);
  };
  check(same_on_all_ranks(hash(net->running_mean)) && same_on_all_ranks(hash(net->running_var)) &&
            same_on_all_ranks(hash(net->scale)),
        "buffers differ across ranks after the initial broadcast");
  check(net->scale.to_vector<double>() == std::vector<double>(3, 2.0), "the f64 buffer is not rank 0's");
  for (int i = 0; i < 4; ++i) {
    // rank 0's statistics before the step, updated eagerly with this rank's batch
    pt::Tensor rm = net->running_mean.clone(), rv = net->running_var.clone();
    MPI_Bcast(rm.data_ptr(), 4, MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Bcast(rv.data_ptr(), 4, MPI_FLOAT, 0, MPI_COMM_WORLD);
    pt::Tensor x = pt::randn({8, 3}) * (1.0 + 0.5 * g_rank) + 0.3 * (i + g_rank);
    {
      pt::NoGradGuard no_grad;
      pt::batch_norm_train(pt::linear(x, net->w, pt::Tensor()), net->gamma, net->beta, rm, rv, 0.1, 1e-5);
    }
    step(x);
    check(pt::max_abs_diff(net->running_mean, rm) <= 1e-5 && pt::max_abs_diff(net->running_var, rv) <= 1e-5,
          fmt::format("step {}: running statistics are not rank 0's updated with this rank's batch", i));
    check(same_on_all_ranks(arena_hash(step)), fmt::format("parameters differ across ranks after step {}", i));
    if (g_rank != 0) {  // a rank's own write to a buffer: the next step replaces it with rank 0's
      std::memcpy(net->scale.data_ptr(), std::vector<double>(3, 9.0).data(), 3 * sizeof(double));
      pt::increment_version(net->scale);
    }
  }
  step(pt::randn({8, 3}));  // the next step broadcasts rank 0's again
  check(net->scale.to_vector<double>() == std::vector<double>(3, 2.0), "the f64 buffer written on rank 1 was not replaced by rank 0's");
  return g_failures;
}

double timeout_s() {
  const char* env = std::getenv("PROTEAN_COLLECTIVES_TIMEOUT_S");
  return env ? std::atof(env) : 60.0;
}

int early_exit(std::shared_ptr<dist::ProcessGroup> group) {
  Run r = make_run(3);
  auto step = make_step(r, group, true);
  for (int i = 0; i < 2; ++i) {
    auto [x, y] = char_gpt::batch_at(text(), i, 2, length_at(i));
    step(x, y);
  }
  if (g_rank == g_size - 1) return g_failures;  // leaves: the others must not hang
  auto t0 = std::chrono::steady_clock::now();
  bool thrown = false;
  try {
    auto [x, y] = char_gpt::batch_at(text(), 2, 2, length_at(2));
    step(x, y);
  } catch (const pt::Error& e) {
    thrown = true;
    const std::string m = e.what();
    std::fprintf(stderr, "rank %d: expected error: %s\n", g_rank, m.c_str());
    check(m.find("gpt_step.grad") != std::string::npos, "the error names the frame");
    check(m.find(fmt::format("ranks {} did not take part", g_size - 1)) != std::string::npos,
          "the error names the missing rank");
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check(thrown, "expected an error when a rank stopped taking part");
  check(took < timeout_s() + 5, fmt::format("the error took {:.1f} s (limit {} s)", took, timeout_s()));
  return g_failures;
}

int allreduce_timeout(std::shared_ptr<dist::ProcessGroup> group) {
  pt::Tensor t = pt::full({16}, static_cast<double>(g_rank + 1), pt::DType::F32);
  group->all_reduce(t, dist::ReduceOp::Sum);  // all ranks: works
  check(t.data_ptr<float>()[0] == static_cast<float>(g_size * (g_size + 1) / 2), "sum of ranks");
  if (g_rank == g_size - 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(timeout_s() + 1.5));
    group->all_reduce(t, dist::ReduceOp::Sum);  // late: the others already gave up on this one
    return g_failures;
  }
  auto t0 = std::chrono::steady_clock::now();
  bool thrown = false;
  try {
    group->all_reduce(t, dist::ReduceOp::Sum);
  } catch (const pt::RuntimeError& e) {
    thrown = true;
    const std::string m = e.what();
    std::fprintf(stderr, "rank %d: expected error: %s\n", g_rank, m.c_str());
    check(m.find("all_reduce(16 x f32, sum)") != std::string::npos, "the error names the all-reduce");
    check(m.find("PROTEAN_COLLECTIVES_TIMEOUT_S") != std::string::npos, "the error names the setting");
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  check(thrown, "expected RuntimeError from an all-reduce a rank did not join in time");
  check(took < timeout_s() + 5, fmt::format("the error took {:.1f} s (limit {} s)", took, timeout_s()));
  return g_failures;
}

// The MPI group on every dtype and reduction: rank r contributes r + 1 (true for Bool on rank 0 only).
int dtypes(std::shared_ptr<dist::ProcessGroup> group) {
  const double n = g_size, sum = n * (n + 1) / 2;
  for (pt::DType dt : {pt::DType::U8, pt::DType::I8, pt::DType::I32, pt::DType::I64, pt::DType::F16, pt::DType::BF16,
                       pt::DType::F32, pt::DType::F64}) {
    const struct {
      dist::ReduceOp op;
      double want;
    } cases[] = {{dist::ReduceOp::Sum, sum},
                 {dist::ReduceOp::Avg, pt::is_floating(dt) ? sum / n : std::floor(sum / n)},
                 {dist::ReduceOp::Max, n},
                 {dist::ReduceOp::Min, 1}};
    for (const auto& c : cases) {
      pt::Tensor t = pt::full({5}, static_cast<double>(g_rank + 1), dt);
      group->all_reduce(t, c.op);
      const double got = t.to(pt::DType::F64).data_ptr<double>()[4];
      check(got == c.want, fmt::format("all_reduce {} over {}: got {}, expected {}", dist::to_string(c.op),
                                       std::string(pt::short_name(dt)), got, c.want));
    }
  }
  pt::Tensor flag = pt::full({3}, g_rank == 0 ? 1.0 : 0.0, pt::DType::Bool);
  group->all_reduce(flag, dist::ReduceOp::Max);  // any
  check(flag.to(pt::DType::F64).data_ptr<double>()[0] == 1.0, "bool max is a logical or");
  group->all_reduce(flag, dist::ReduceOp::Min);
  check(flag.to(pt::DType::F64).data_ptr<double>()[0] == 1.0, "bool min of all-true is true");
  pt::Tensor b = pt::full({4}, static_cast<double>(g_rank * 10), pt::DType::F32);
  group->broadcast(b, g_size - 1);
  check(b.data_ptr<float>()[3] == static_cast<float>((g_size - 1) * 10), "broadcast from the last rank");
  bool threw = false;
  try {
    group->all_reduce(pt::transpose(pt::ones({2, 3}), 0, 1), dist::ReduceOp::Sum);
  } catch (const pt::ValueError&) {
    threw = true;
  }
  check(threw, "a non-contiguous tensor is a ValueError");
  return g_failures;
}

}  // namespace

int main(int argc, char** argv) {
  return mpi_test::main_with_scenarios(argc, argv, "sync", [](const std::string& scenario) {
    auto group = protean::mpi::process_group(pt::kCPU);
    if (scenario == "sync") return sync(group, true, true);
    if (scenario == "no_collectives") return sync(group, false, false);
    if (scenario == "equivalence") return equivalence(group);
    if (scenario == "new_batch") return new_batch(group);
    if (scenario == "early_exit") return early_exit(group);
    if (scenario == "allreduce_timeout") return allreduce_timeout(group);
    if (scenario == "dtypes") return dtypes(group);
    if (scenario == "buffers") return buffers(group);
    return -1;
  });
}
