// Data-parallel training of a character-level GPT (examples/char_gpt.h) over MPI ranks, each rank with
// its own sequence lengths, with compiler collectives on: the ranks agree that the sequence length is
// dynamic before the first compile, so each compiles one dynamic backward graph, and the gradients
// are averaged across ranks between the backward frame and the optimizer frame.
//
//   protean launch --nproc 2 -- build/example_ddp_char_gpt --device cuda [...]   (no MPI: the store group)
//   mpirun -np 2 build/example_ddp_char_gpt [--steps N] [--batch B] [--backend interp|cpu|cuda]
//          [--device cpu|cuda] [--lengths per-rank|same] [--no-collectives] [--d D] [--layers L]
//          [--mode default|reduce-overhead|max-autotune] (CompileOptions::mode of the step)
//          [--warmup W] [--json FILE] [--check-sync]
//
// --device cuda: each rank's model, batches, arenas, gradients and optimizer state live on
// cuda:<local rank> (the rank's index among the ranks of its host), the gradients are averaged by
// NCCL (bootstrapped over the store under `protean launch`, over MPI under mpirun) and the backend is
// cuda unless --backend says otherwise.
//
// Rank 0 sees lengths 64, 128, 96, 112, 72, 120…, rank 1 80, 200, 50, 144, 60, 176… (--lengths same:
// every rank rank 0's). Prints the mean loss across ranks per step, each rank's compile counts, and
// steps/s after the warm-up steps; --json writes those figures and the loss curve (rank 0).
// --check-sync compares a hash of every rank's parameters after each step (an error when they differ).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "char_gpt.h"
#include "device/runtime.h"
#include "protean/mpi.h"
#include "protean/distributed.h"

namespace pt = protean;
namespace dist = protean::distributed;

namespace {

struct Args {
  int steps = 12, warmup = 2;
  int64_t batch = 4, d = 32, layers = 1;
  std::string backend, device = "cpu", lengths = "per-rank", json, mode = "default";
  bool collectives = true;
  bool check_sync = false;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "ddp_char_gpt: %s\n", what.c_str());
  std::exit(2);
}

/// The whole of `text` as an integer in [lo, hi], or a usage error naming the flag.
int64_t integer_flag(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE)
    usage_error(flag + " takes an integer, got '" + text + "'");
  if (v < lo || v > hi)
    usage_error(flag + " must be from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " + text);
  return v;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--steps") a.steps = static_cast<int>(integer_flag(k, next(), 1, 1000000));
    else if (k == "--warmup") a.warmup = static_cast<int>(integer_flag(k, next(), 0, 1000000));
    else if (k == "--batch") a.batch = integer_flag(k, next(), 1, 1 << 20);
    else if (k == "--d") a.d = integer_flag(k, next(), 4, 1 << 16);
    else if (k == "--layers") a.layers = integer_flag(k, next(), 1, 1024);
    else if (k == "--backend") a.backend = next();
    else if (k == "--device") a.device = next();
    else if (k == "--lengths") a.lengths = next();
    else if (k == "--json") a.json = next();
    else if (k == "--mode") a.mode = next();
    else if (k == "--no-collectives") a.collectives = false;
    else if (k == "--check-sync") a.check_sync = true;
    else usage_error("unknown argument " + k);
  }
  if (a.device != "cpu" && a.device != "cuda") usage_error("--device must be cpu or cuda, not " + a.device);
  if (a.lengths != "per-rank" && a.lengths != "same") usage_error("--lengths must be per-rank or same, not " + a.lengths);
  if (a.mode != "default" && a.mode != "reduce-overhead" && a.mode != "max-autotune")
    usage_error("--mode must be default, reduce-overhead or max-autotune, not " + a.mode);
  if (a.d % 4 != 0) usage_error("--d must be a multiple of the 4 attention heads, got " + std::to_string(a.d));
  if (a.backend.empty()) a.backend = a.device == "cuda" ? "cuda" : "interp";
  return a;
}

/// How the ranks of this job found each other: `protean launch` (the store group, no MPI) or mpirun.
/// `boot` carries host bytes (barriers, the step times, parameter hashes); `group` averages the
/// gradients (NCCL for a model on a GPU, MPI for a model on the host).
struct Job {
  bool mpi = false;
  int rank = 0, size = 1, local_rank = 0;
  std::shared_ptr<dist::ProcessGroup> boot, group;

  void barrier() const { boot->all_gather_bytes(std::string()); }
  /// Element-wise maximum over the ranks.
  std::vector<double> max_over_ranks(const std::vector<double>& mine) const {
    std::string bytes(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double));
    std::vector<double> out = mine;
    for (const std::string& b : boot->all_gather_bytes(bytes)) {
      if (b.size() != bytes.size()) throw pt::RuntimeError("ddp_char_gpt: the ranks ran different step counts");
      for (size_t i = 0; i < out.size(); ++i) {
        double v;
        std::memcpy(&v, b.data() + i * sizeof(double), sizeof(double));
        out[i] = std::max(out[i], v);
      }
    }
    return out;
  }
};

/// This rank's index among the mpirun ranks on its host (its GPU on a multi-GPU host).
int mpi_local_rank() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int r = 0;
  MPI_Comm_rank(local, &r);
  MPI_Comm_free(&local);
  return r;
}

/// Started by `protean launch` (PROTEAN_RANK is set): the store group bootstraps NCCL and carries the
/// compiler collectives. Otherwise mpirun: MPI does both (NCCL's unique id over MPI on GPUs).
Job make_job(int* argc, char*** argv, bool cuda) {
  Job j;
  if (std::getenv("PROTEAN_RANK")) {
    auto store = dist::init_from_env();
    dist::install_compiler_collectives(store);
    j.rank = store->rank(), j.size = store->size(), j.local_rank = store->local_rank();
    j.boot = store;
    if (!cuda)
      throw pt::ValueError("ddp_char_gpt: ranks started by `protean launch` average gradients with NCCL: pass "
                           "--device cuda, or start CPU ranks with mpirun");
    j.group = dist::nccl_group(store, j.local_rank);
    return j;
  }
  MPI_Init(argc, argv);
  j.mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &j.size);
  protean::mpi::install_compiler_collectives();
  j.local_rank = mpi_local_rank();
  j.boot = protean::mpi::process_group(pt::kCPU);
  j.group = cuda ? protean::mpi::process_group(pt::Device{pt::DeviceType::CUDA, j.local_rank}) : j.boot;
  return j;
}

/// FNV-1a of every parameter arena's bytes (read back to the host).
std::string arenas_hash(const std::vector<pt::Tensor>& arenas) {
  uint64_t h = 1469598103934665603ull;
  for (const pt::Tensor& a : arenas) {
    const pt::Tensor c = a.cpu().contiguous();
    const auto* p = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0; i < static_cast<size_t>(c.int_numel()) * c.itemsize(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return std::to_string(h);
}

int64_t length_for(int rank, int step, const std::string& mode) {
  static const int64_t r0[] = {64, 128, 96, 112, 72, 120, 88, 104};
  static const int64_t r1[] = {80, 200, 50, 144, 60, 176, 96, 160};
  const int r = mode == "same" ? 0 : rank;
  if (r == 0) return r0[step % 8];
  if (r == 1) return r1[step % 8];
  return 48 + 16 * ((step + r) % 8);
}

/// "rank R: " before this rank's lines, except under `protean launch`, which prefixes every line of a
/// rank's output with "[rank R] " itself (PROTEAN_RUN_ID is set there).
std::string rank_tag(int rank) {
  const char* launched = std::getenv("PROTEAN_RUN_ID");
  return launched && *launched ? std::string() : "rank " + std::to_string(rank) + ": ";
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  int rc = 0;
  Job job;
  try {
    job = make_job(&argc, &argv, args.device == "cuda");
    const int rank = job.rank, size = job.size;
    const pt::Device device = args.device == "cuda" ? pt::Device{pt::DeviceType::CUDA, job.local_rank} : pt::kCPU;
    auto group = job.group;
    char_gpt::Config cfg;
    cfg.d = args.d;
    cfg.layers = args.layers;
    cfg.heads = 4;
    pt::manual_seed(1234 + static_cast<uint64_t>(rank));  // different on each rank: rank 0's weights are broadcast
    auto model = std::make_shared<char_gpt::Gpt>(cfg);
    model->to(device);  // before the optimizer: its state is made where the parameters are
    pt::optim::AdamW opt(model->parameters(), pt::optim::AdamWOptions(3e-3));
    auto step = dist::compile_train_step(
        model, [model](pt::Tensor x, pt::Tensor y) { return model->loss(x, y); }, opt, group,
        {.name = "gpt_step", .arg_names = {"tokens", "targets"}, .backend = args.backend, .mode = args.mode,
         .compiler_collectives = args.collectives});
    const std::vector<int64_t> text = char_gpt::corpus(200000);
    std::vector<double> step_ms;
    std::vector<int64_t> compiles_by_step;
    std::vector<double> losses;  // the mean over the ranks, per step
    int sync_checks = 0;
    for (int i = 0; i < args.steps; ++i) {
      const int64_t len = length_for(rank, i, args.lengths);
      auto [x, y] = char_gpt::batch_at(text, (static_cast<int64_t>(i) * size + rank) * args.batch, args.batch, len);
      x = x.to(device), y = y.to(device);
      job.barrier();  // steps are timed from a common start
      const auto t0 = std::chrono::steady_clock::now();
      pt::Tensor loss = step(x, y).contiguous();
      if (device.type == pt::DeviceType::CUDA) protean::cuda::synchronize(device.index);  // the step's work, not its queueing
      step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      group->all_reduce(loss, dist::ReduceOp::Avg);
      compiles_by_step.push_back(step.stats().grad.compiles);
      losses.push_back(loss.cpu().item<float>());
      if (args.check_sync) {  // DDP's invariant: every rank holds the same parameters after each step
        const std::vector<std::string> hashes = job.boot->all_gather_bytes(arenas_hash(step.parameter_arenas()));
        for (size_t r = 1; r < hashes.size(); ++r)
          if (hashes[r] != hashes[0])
            throw pt::RuntimeError("ddp_char_gpt: after step " + std::to_string(i) + " rank " + std::to_string(r) +
                                   "'s parameters differ from rank 0's");
        ++sync_checks;
      }
      if (rank == 0)
        std::printf("step %2d  T=%3lld  loss %.4f  %.1f ms\n", i, static_cast<long long>(len), loss.cpu().item<float>(),
                    step_ms.back());
    }
    // The slowest rank sets the pace: each step's time is the maximum over ranks.
    const std::vector<double> worst = job.max_over_ranks(step_ms);
    double steady_ms = 0;
    for (size_t i = static_cast<size_t>(args.warmup); i < worst.size(); ++i) steady_ms += worst[i];
    const int steady_steps = args.steps - args.warmup;
    const double steps_per_s = steady_steps > 0 ? 1000.0 * steady_steps / steady_ms : 0;
    const auto s = step.stats();
    std::fflush(stdout);
    job.barrier();
    std::printf("%sbackward-frame compiles %lld, optimizer-frame compiles %lld, %lld all-reduces (%.1f ms)\n",
                rank_tag(rank).c_str(), static_cast<long long>(s.grad.compiles), static_cast<long long>(s.update.compiles),
                static_cast<long long>(s.all_reduces), 1000 * s.all_reduce_seconds);
    std::fflush(stdout);
    job.barrier();
    if (rank == 0) {
      if (steady_steps > 0)
        std::printf("%d rank(s) x batch %lld: %.3f steps/s after %d warm-up steps (%d steps)\n", size,
                    static_cast<long long>(args.batch), steps_per_s, args.warmup, steady_steps);
      else
        std::printf("%d rank(s) x batch %lld: no timed steps (--warmup %d, --steps %d)\n", size,
                    static_cast<long long>(args.batch), args.warmup, args.steps);
      if (!args.json.empty()) {
        std::ofstream f(args.json);
        if (!f) throw pt::RuntimeError("ddp_char_gpt: cannot write --json " + args.json + ": " + std::strerror(errno));
        f << "{\"ranks\": " << size << ", \"batch_per_rank\": " << args.batch << ", \"mode\": \"" << args.mode
          << "\", \"backend\": \"" << args.backend
          << "\", \"device\": \"" << args.device << "\", \"lengths\": \"" << args.lengths << "\", \"collectives\": " << (args.collectives ? "true" : "false")
          << ", \"steps\": " << args.steps << ", \"warmup\": " << args.warmup << ", \"steps_per_s\": " << steps_per_s
          << ", \"step_ms_max_over_ranks\": [";
        for (size_t i = 0; i < worst.size(); ++i) f << (i ? ", " : "") << worst[i];
        f << "], \"backward_compiles_rank0\": " << s.grad.compiles << ", \"optimizer_compiles_rank0\": " << s.update.compiles
          << ", \"all_reduce_ms_rank0\": " << 1000 * s.all_reduce_seconds << ", \"all_reduce_bytes_per_step\": "
          << (s.all_reduces ? s.all_reduce_bytes / args.steps : 0) << ", \"d\": " << args.d << ", \"layers\": " << args.layers
          << ", \"launcher\": \"" << (job.mpi ? "mpirun" : "protean launch") << "\", \"parameter_checks_identical\": " << sync_checks
          << ", \"losses\": [";
        for (size_t i = 0; i < losses.size(); ++i) f << (i ? ", " : "") << fmt::format("{:.9g}", losses[i]);
        f << "]}\n";
      }
    }
  } catch (const std::exception& e) {
    // The job may have failed before it knew its rank: ask MPI, or the launcher's variable.
    int rank = job.rank;
    int mpi_up = 0;
    MPI_Initialized(&mpi_up);
    if (!job.boot && mpi_up) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    else if (const char* launched = std::getenv("PROTEAN_RANK"); !job.boot && launched) rank = std::atoi(launched);
    std::fprintf(stderr, "%serror: %s\n", rank_tag(rank).c_str(), e.what());
    rc = 1;
    // NCCL's teardown would wait for collectives a failed peer never completes: leave without them.
    if (job.group) job.group->abort();
  }
  dist::uninstall_compiler_collectives();
  job.boot.reset(), job.group.reset();  // the groups go before MPI does
  int mpi_up = 0;
  MPI_Initialized(&mpi_up);  // also when make_job failed after MPI_Init
  if (mpi_up) MPI_Finalize();
  return rc;
}
