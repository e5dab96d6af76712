// Data-parallel training of a character-level GPT (examples/char_gpt.h) over MPI ranks, each rank with
// its own sequence lengths, with compiler collectives on: the ranks agree that the sequence length is
// dynamic before the first compile, so each compiles one dynamic backward graph, and the gradients
// are averaged across ranks between the backward frame and the optimizer frame.
//
//   mpirun -np 2 build/example_ddp_char_gpt [--steps N] [--batch B] [--backend interp|cpu|cuda]
//          [--device cpu|cuda] [--lengths per-rank|same] [--no-collectives] [--d D] [--layers L]
//          [--warmup W] [--json FILE]
//
// --device cuda: each rank's model, batches, arenas, gradients and optimizer state live on
// cuda:<local rank> (the rank's index among the ranks of its host), the gradients are averaged by
// NCCL (bootstrapped over MPI) and the backend is cuda unless --backend says otherwise.
//
// Rank 0 sees lengths 64, 128, 96, 112, 72, 120…, rank 1 80, 200, 50, 144, 60, 176… (--lengths same:
// every rank rank 0's). Prints the mean loss across ranks per step, each rank's compile counts, and
// steps/s after the warm-up steps; --json writes those figures (rank 0).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "char_gpt.h"
#include "device/runtime.h"
#include "distributed/mpi.h"
#include "dynamic/collectives_mpi.h"
#include "protean/distributed.h"

namespace pt = protean;
namespace dist = protean::distributed;

namespace {

struct Args {
  int steps = 12, warmup = 2;
  int64_t batch = 4, d = 32, layers = 1;
  std::string backend, device = "cpu", lengths = "per-rank", json;
  bool collectives = true;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--steps") a.steps = std::stoi(next());
    else if (k == "--warmup") a.warmup = std::stoi(next());
    else if (k == "--batch") a.batch = std::stoll(next());
    else if (k == "--d") a.d = std::stoll(next());
    else if (k == "--layers") a.layers = std::stoll(next());
    else if (k == "--backend") a.backend = next();
    else if (k == "--device") a.device = next();
    else if (k == "--lengths") a.lengths = next();
    else if (k == "--json") a.json = next();
    else if (k == "--no-collectives") a.collectives = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.device != "cpu" && a.device != "cuda") {
    std::fprintf(stderr, "--device must be cpu or cuda, not %s\n", a.device.c_str());
    std::exit(2);
  }
  if (a.backend.empty()) a.backend = a.device == "cuda" ? "cuda" : "interp";
  return a;
}

/// This rank's index among the ranks on its host (its GPU on a multi-GPU host).
int local_rank() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

/// The process group over every rank: MPI for a model on the host, NCCL (bootstrapped over MPI) for
/// a model on a GPU. The one place that knows how the ranks find each other.
std::shared_ptr<dist::ProcessGroup> make_group(pt::Device device) { return protean::mpi::process_group(device); }

int64_t length_for(int rank, int step, const std::string& mode) {
  static const int64_t r0[] = {64, 128, 96, 112, 72, 120, 88, 104};
  static const int64_t r1[] = {80, 200, 50, 144, 60, 176, 96, 160};
  const int r = mode == "same" ? 0 : rank;
  if (r == 0) return r0[step % 8];
  if (r == 1) return r1[step % 8];
  return 48 + 16 * ((step + r) % 8);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Args args = parse(argc, argv);
  int rc = 0;
  try {
    protean::mpi::install_compiler_collectives();
    const pt::Device device = args.device == "cuda" ? pt::Device{pt::DeviceType::CUDA, local_rank()} : pt::kCPU;
    auto group = make_group(device);
    char_gpt::Config cfg;
    cfg.d = args.d;
    cfg.layers = args.layers;
    cfg.heads = 4;
    pt::manual_seed(1234 + static_cast<uint64_t>(rank));  // different on each rank: rank 0's weights are broadcast
    auto model = std::make_shared<char_gpt::Gpt>(cfg);
    model->to(device);  // before the optimizer: its state is made where the parameters are
    pt::optim::AdamW opt(model->params(), pt::optim::AdamWOptions(3e-3));
    auto step = dist::compile_train_step(
        model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt, group,
        {.name = "gpt_step", .arg_names = {"tokens", "targets"}, .backend = args.backend,
         .compiler_collectives = args.collectives});
    const std::vector<int64_t> text = char_gpt::corpus(200000);
    std::vector<double> step_ms;
    std::vector<int64_t> compiles_by_step;
    for (int i = 0; i < args.steps; ++i) {
      const int64_t len = length_for(rank, i, args.lengths);
      auto [x, y] = char_gpt::batch_at(text, (static_cast<int64_t>(i) * size + rank) * args.batch, args.batch, len);
      x = x.to(device), y = y.to(device);
      MPI_Barrier(MPI_COMM_WORLD);  // steps are timed from a common start
      const auto t0 = std::chrono::steady_clock::now();
      pt::Tensor loss = step(x, y).contiguous();
      if (device.type == pt::DeviceType::CUDA) protean::cuda::synchronize(device.index);  // the step's work, not its queueing
      step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      group->all_reduce(loss, dist::ReduceOp::Avg);
      compiles_by_step.push_back(step.stats().grad.compiles);
      if (rank == 0)
        std::printf("step %2d  T=%3lld  loss %.4f  %.1f ms\n", i, static_cast<long long>(len), loss.cpu().item<float>(),
                    step_ms.back());
    }
    // The slowest rank sets the pace: each step's time is the maximum over ranks.
    std::vector<double> worst(step_ms.size());
    MPI_Allreduce(step_ms.data(), worst.data(), static_cast<int>(step_ms.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    double steady_ms = 0;
    for (size_t i = static_cast<size_t>(args.warmup); i < worst.size(); ++i) steady_ms += worst[i];
    const int steady_steps = args.steps - args.warmup;
    const double steps_per_s = steady_steps > 0 ? 1000.0 * steady_steps / steady_ms : 0;
    const auto s = step.stats();
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    std::printf("rank %d: backward-frame compiles %lld, optimizer-frame compiles %lld, %lld all-reduces (%.1f ms)\n",
                rank, static_cast<long long>(s.grad.compiles), static_cast<long long>(s.update.compiles),
                static_cast<long long>(s.all_reduces), 1000 * s.all_reduce_seconds);
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("%d rank(s) x batch %lld: %.3f steps/s after %d warm-up steps (%d steps)\n", size,
                  static_cast<long long>(args.batch), steps_per_s, args.warmup, steady_steps);
      if (!args.json.empty()) {
        std::ofstream f(args.json);
        f << "{\"ranks\": " << size << ", \"batch_per_rank\": " << args.batch << ", \"backend\": \"" << args.backend
          << "\", \"device\": \"" << args.device << "\", \"lengths\": \"" << args.lengths << "\", \"collectives\": " << (args.collectives ? "true" : "false")
          << ", \"steps\": " << args.steps << ", \"warmup\": " << args.warmup << ", \"steps_per_s\": " << steps_per_s
          << ", \"step_ms_max_over_ranks\": [";
        for (size_t i = 0; i < worst.size(); ++i) f << (i ? ", " : "") << worst[i];
        f << "], \"backward_compiles_rank0\": " << s.grad.compiles << ", \"optimizer_compiles_rank0\": " << s.update.compiles
          << ", \"all_reduce_ms_rank0\": " << 1000 * s.all_reduce_seconds << ", \"all_reduce_bytes_per_step\": "
          << (s.all_reduces ? s.all_reduce_bytes / args.steps : 0) << "}\n";
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    rc = 1;
  }
  protean::mpi::uninstall_compiler_collectives();
  MPI_Finalize();
  return rc;
}
