// Data-parallel training: process groups, gradient all-reduce and a compiled training step whose
// gradients are averaged across ranks (PyTorch's torch.distributed ProcessGroup and
// DistributedDataParallel, for compile_train_step).
//
//  * A ProcessGroup is the ranks of one job and the collectives over them. libprotean has no MPI or
//    NCCL link dependency: the MPI group lives in the library protean_mpi (include/protean/mpi.h:
//    protean::mpi::process_group()), and NCCL is loaded at run time (dlopen libnccl.so.2, like the
//    CUDA driver) by nccl_group(). protean::mpi::process_group(device) picks MPI for CPU tensors and
//    NCCL, bootstrapped over MPI, for CUDA tensors.
//  * distributed::compile_train_step(module, loss_fn, optimizer, group, opts) is compile_train_step
//    (include/protean/optim.h) for SPMD data parallelism: at creation the parameter arenas are checked
//    to agree across ranks and broadcast from rank 0 (DDP's initial broadcast); each call runs the
//    forward and backward as one compiled frame ("<name>.grad"), averages the flat gradient arenas with
//    one all-reduce per arena (DDP's gradient averaging: the mean of the ranks' gradients), then runs
//    the optimizer update as a second compiled frame ("<name>.update"). The exchange sits between the
//    two frames, as DDP's all-reduce sits outside the graphs torch.compile builds.
//  * Turn on CompileOptions::compiler_collectives (and install the compiler collectives' backend,
//    include/protean/mpi.h) when ranks see different shapes: the ranks then agree on dynamic
//    dims before the first compile and recompile together, so no rank waits in the all-reduce while
//    another compiles on its own schedule.
//
// Every rank must call the collectives and the training step in the same order (SPMD).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "protean/compile.h"
#include "protean/module.h"
#include "protean/optim.h"
#include "protean/tensor.h"

namespace protean::distributed {

/// Reductions of all_reduce (torch.distributed.ReduceOp). Avg divides the sum by the group's size
/// (NCCL's ncclAvg; over MPI a sum followed by a division).
enum class ReduceOp : uint8_t { Sum, Avg, Max, Min };
const char* to_string(ReduceOp op);

/// The ranks of a job and the collectives over them (torch.distributed.ProcessGroup). The tensor
/// collectives work in place on one contiguous tensor, which every rank passes with the same dtype
/// and numel; a group takes tensors of one device type (name() says which). Implementations:
/// protean::mpi::process_group (CPU tensors, MPI), nccl_group (CUDA tensors, NCCL), and tests' fakes.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "mpi", "nccl", ...
  virtual std::string name() const = 0;
  /// In place: every rank's `t` becomes the reduction of all ranks' `t`. Throws ValueError for a
  /// non-contiguous tensor, a dtype the transport lacks or a tensor on the wrong device type, and
  /// RuntimeError when the transport fails or peers do not take part within the group's timeout.
  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  /// In place: every rank's `t` becomes rank `root`'s. Same errors as all_reduce.
  virtual void broadcast(const Tensor& t, int root) = 0;
  /// All-gather of small host byte strings (metadata checks, NCCL's unique id); result[r] is rank r's.
  virtual std::vector<std::string> all_gather_bytes(const std::string& mine) = 0;
  /// Leaves the group after an error, without waiting for collectives in flight: a peer that died or
  /// stopped elsewhere never completes them, and the ordinary teardown would wait for it forever
  /// (NCCL: ncclCommAbort instead of ncclCommDestroy, as torch's ProcessGroupNCCL::abort). The group
  /// takes no further collectives. A no-op for transports whose teardown does not wait (MPI, the store).
  virtual void abort() {}
};

/// Throws ValueError naming the first rank and tensor that differ unless every rank passes tensors
/// of the same count, dtypes and sizes (`what` names them in the message: "parameter arena").
void check_same_layout(ProcessGroup& group, const std::vector<Tensor>& tensors, const std::string& what);
/// check_same_layout, then broadcasts each tensor from `root` in place (DDP's initial parameter sync).
void broadcast_tensors(ProcessGroup& group, const std::vector<Tensor>& tensors, int root = 0);
/// Averages each tensor across ranks in place (ReduceOp::Avg), one all_reduce per tensor: with flat
/// per-dtype gradient arenas, one call per arena whatever the parameter count.
void average_gradients(ProcessGroup& group, const std::vector<Tensor>& grads);

/// An NCCL process group on CUDA device `device` of this rank, with `bootstrap` (for example the MPI
/// group) carrying rank 0's ncclUniqueId to the other ranks. Its size and rank are the bootstrap's.
/// Collectives are queued on the device's stream (the stream every Protean kernel of that device runs
/// on), so the compiled update that follows is ordered after the all-reduce without a host wait. A
/// watchdog thread aborts the communicator (ncclCommAbort) when a collective has not completed
/// PROTEAN_NCCL_TIMEOUT_S seconds (default 600; not a positive number: ValueError here) after it was
/// queued, as torch's NCCL watchdog does: the stream's waits then return, and the next collective
/// throws RuntimeError naming the one that did not complete. Compiler collectives (which time out
/// sooner) keep ranks from reaching a step apart; abort() leaves the group after an error.
/// Throws RuntimeError when libnccl.so.2 cannot be loaded ("NCCL not found (dlopen libnccl.so.2: ...);
/// install NCCL (e.g. the nvidia-nccl-cu13 wheel) or set PROTEAN_NCCL_LIBRARY"), or without a CUDA
/// driver, or when ncclCommInitRank fails (the NCCL error text).
std::shared_ptr<ProcessGroup> nccl_group(std::shared_ptr<ProcessGroup> bootstrap, int device);
/// True when libnccl.so.2 (or PROTEAN_NCCL_LIBRARY, or a table installed for testing) is loadable.
bool nccl_available();

// ---- Jobs without MPI: a store group, `protean launch` and init_from_env (docs/distributed.md) -------

namespace detail {
class FileStore;
}

/// Where the ranks of a job meet (the arguments of store_group). torch.distributed's FileStore with
/// init_method="file://...", made for one host or a shared filesystem.
struct StoreOptions {
  std::string path;    ///< the store directory (created, one level, when missing)
  std::string run_id;  ///< this run of the job: 1 to 64 of [A-Za-z0-9_-]; files of other runs are never read
  int rank = -1;       ///< this process's rank, 0 <= rank < world_size
  int world_size = 0;  ///< the number of ranks
  int local_rank = -1;       ///< the rank on this host (-1: the rank), e.g. the CUDA device to use
  int local_world_size = 0;  ///< ranks on this host (0: world_size)
  double timeout_s = 0;      ///< deadline of each exchange; 0: PROTEAN_COLLECTIVES_TIMEOUT_S (default 60 s)
};

/// A bootstrap process group whose ranks exchange small host byte strings through files in a
/// directory: the MPI-free way to start the ranks of a job (`protean launch`) and to carry NCCL's
/// unique id (`nccl_group(store, store->local_rank())`). Creating one is a rendezvous: it returns once
/// every rank has made its group (in the same order on every rank), after checking that they agree on
/// the world size.
///  * all_gather_bytes: every rank writes its part (a temporary renamed into place, so a reader never
///    sees half a file), under the run id, the group's generation and a sequence number of its own, so
///    two exchanges, two groups or two jobs in one directory never mix; then waits for the others'.
///  * No hangs: each exchange (the rendezvous included) waits at most the timeout (StoreOptions, or
///    PROTEAN_COLLECTIVES_TIMEOUT_S, default 60 s), then throws RuntimeError naming the missing ranks
///    and the store directory; the group is unusable afterwards. A corrupt or truncated file, or a rank
///    with another world size, is a RuntimeError naming the file.
///  * Tensor collectives are not offered: all_reduce and broadcast throw ValueError saying to use
///    nccl_group(store, device) for CUDA tensors or protean::mpi::process_group() for CPU tensors (a
///    gradient exchange through files would be correct but orders of magnitude slower than either).
///  * Cleanup: each rank deletes its files once every rank has read them; the last rank to destroy its
///    group deletes what is left (its files of the last exchange, the markers). Files of a rank that
///    crashed stay behind (`protean launch` removes the directory it made).
/// Thread-safe; every rank must call all_gather_bytes the same number of times, in the same order.
class StoreGroup final : public ProcessGroup {
 public:
  /// Opens the store and rendezvouses (see above). Throws ValueError for a rank outside the world, a
  /// bad run id or local rank; RuntimeError when the directory is unusable or a rank does not arrive
  /// in time ("... ranks 1 did not arrive within 60 s (PROTEAN_COLLECTIVES_TIMEOUT_S) at the store /tmp/x
  /// (run 7f3a...)").
  explicit StoreGroup(const StoreOptions& options);
  ~StoreGroup() override;
  int rank() const override;
  int size() const override;
  std::string name() const override { return "store"; }
  /// Throw ValueError: the store carries no tensors (see above).
  void all_reduce(const Tensor& t, ReduceOp op) override;
  void broadcast(const Tensor& t, int root) override;
  std::vector<std::string> all_gather_bytes(const std::string& mine) override;

  int local_rank() const { return local_rank_; }
  int local_world_size() const { return local_world_size_; }
  const std::string& path() const;
  const std::string& run_id() const;
  /// The store shared with the compiler collectives' backend (install_compiler_collectives).
  std::shared_ptr<detail::FileStore> store() const { return store_; }

 private:
  double timeout() const;
  std::shared_ptr<detail::FileStore> store_;
  int local_rank_ = 0, local_world_size_ = 1;
  double timeout_s_ = 0;
  std::atomic<bool> broken_{false};
};

/// A StoreGroup (see above): the ranks rendezvous in `options.path`.
std::shared_ptr<StoreGroup> store_group(const StoreOptions& options);

/// The store group of a job started by `protean launch --nproc N -- PROGRAM ...` (torchrun's
/// environment, torch.distributed's init_method="env://"), from the variables the launcher sets:
///   PROTEAN_RANK, PROTEAN_WORLD_SIZE        this process's rank and the number of ranks
///   PROTEAN_LOCAL_RANK, PROTEAN_LOCAL_WORLD_SIZE  the same on this host (default: the global ones)
///   PROTEAN_STORE                           the store directory
///   PROTEAN_RUN_ID                          this run of the job (not PROTEAN_JOB_ID, which names PGO
///                                           profiles and stays the same across runs)
/// Collective (a rendezvous, as StoreGroup's constructor). For a data-parallel job on GPUs:
///     auto store = pt::distributed::init_from_env();
///     auto group = pt::distributed::nccl_group(store, store->local_rank());
/// Throws ValueError naming the variable when one is missing, not an integer, out of range or
/// inconsistent with the others (PROTEAN_RANK=2 with PROTEAN_WORLD_SIZE=2); StoreGroup's errors.
std::shared_ptr<StoreGroup> init_from_env();

/// Installs the compiler collectives' backend (src/dynamic/collectives.h) over `store`, so that
/// CompileOptions::compiler_collectives works in jobs without MPI (the MPI one is
/// protean::mpi::install_compiler_collectives, in protean_mpi). Its exchanges use a channel of their
/// own in the same directory (they never mix with all_gather_bytes), wait at most
/// PROTEAN_COLLECTIVES_TIMEOUT_S and report the ranks that did not take part. Sets the trace rank.
/// Call on every rank before creating compiled functions. Throws ValueError for a null store.
void install_compiler_collectives(const std::shared_ptr<StoreGroup>& store);
/// Removes the process's compiler collectives backend (whichever was installed).
void uninstall_compiler_collectives();

/// Counters of a data-parallel step (its two frames' stats, and the exchanges).
struct TrainStepStats {
  Stats grad;    ///< the forward + backward frame
  Stats update;  ///< the optimizer frame
  int64_t all_reduces = 0;       ///< all_reduce calls (one per gradient arena per step)
  int64_t all_reduce_bytes = 0;  ///< bytes reduced, summed over calls
  double all_reduce_seconds = 0; ///< wall time inside all_reduce
};

namespace detail {
struct DataParallelState {
  std::shared_ptr<protean::detail::TrainArenas> arenas;
  std::shared_ptr<ProcessGroup> group;
  int64_t all_reduces = 0, all_reduce_bytes = 0;
  double all_reduce_seconds = 0;
};
/// Checks and broadcasts the parameter arenas and the module's buffers from rank 0 (creation).
void sync_initial_parameters(DataParallelState& s);
/// Broadcasts the module's buffers from rank 0 before a step (torch DDP's broadcast_buffers, its
/// default): every rank's running statistics are rank 0's. Nothing to do on one rank.
void broadcast_buffers(DataParallelState& s);
/// Gradients that are not contiguous or share their storage (views, aliases of frame inputs) are
/// replaced by copies before the in-place exchange.
void exchange_gradients(DataParallelState& s, std::vector<Tensor>& grads);

template <typename Sig> struct DataParallelMaker;
template <typename... Args>
struct DataParallelMaker<Tensor(Args...)> {
  using GradOut = std::tuple<Tensor, std::vector<Tensor>, std::vector<Tensor>>;  // loss, grads, buffers
  using GradFn = CompiledFunction<GradOut(Args..., std::vector<Tensor>, std::vector<Tensor>)>;
  using UpdOut = std::pair<std::vector<Tensor>, std::vector<Tensor>>;
  using UpdateFn = CompiledFunction<UpdOut(std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, Tensor)>;
  /// One compiled update per optimizer structure, as compile_train_step's frames.
  using Updates = protean::detail::FramesByStructure<UpdateFn>;

  template <typename F>
  static auto make(std::shared_ptr<Module> module, F loss_fn, optim::Optimizer& opt,
                   std::shared_ptr<ProcessGroup> group, CompileOptions opts) {
    if (!group) throw ValueError("distributed::compile_train_step: the process group is null");
    auto st = std::make_shared<DataParallelState>();
    st->arenas = protean::detail::make_train_arenas(opt, module);
    st->group = std::move(group);
    sync_initial_parameters(*st);
    auto arenas = st->arenas;
    auto grad_body = [arenas, &opt, loss_fn = std::move(loss_fn)](Args... args, std::vector<Tensor> params,
                                                                 std::vector<Tensor> bufs) -> GradOut {
      protean::detail::ParamBinding bind(*arenas, params);
      protean::detail::BufferBinding bind_buffers(*arenas, bufs);
      Tensor loss = protean::detail::train_loss(*arenas, opt, loss_fn(args...));
      std::vector<Tensor> grads = protean::detail::train_grads(*arenas, loss);
      return GradOut{loss.detach(), std::move(grads), bind_buffers.values()};
    };
    CompileOptions gopts = opts, uopts = opts;
    gopts.name = opts.name + ".grad";
    uopts.name = opts.name + ".update";
    uopts.arg_names = {"params", "grads", "states", "hyper"};
    auto grad = protean::detail::compile_as<GradOut(Args..., std::vector<Tensor>, std::vector<Tensor>)>(
        std::move(grad_body), gopts, nullptr);
    auto updates = std::make_shared<Updates>();
    updates->compile = [arenas, &opt, uopts]() {
      return protean::detail::compile_as<UpdOut(std::vector<Tensor>, std::vector<Tensor>, std::vector<Tensor>, Tensor)>(
          [arenas, &opt](std::vector<Tensor> params, std::vector<Tensor> grads, std::vector<Tensor> states,
                         Tensor hyper) -> UpdOut {
            return protean::detail::train_apply(*arenas, opt, grads, params, states, hyper);
          },
          uopts, nullptr);
    };
    updates->at(protean::detail::train_structure(*arenas));
    return std::make_tuple(st, grad, updates);
  }
};
}  // namespace detail

/// A data-parallel training step (distributed::compile_train_step): call it like loss_fn; returns this
/// rank's loss (average it with group().all_reduce for a global figure).
template <typename... Args>
class TrainStep {
  using Maker = detail::DataParallelMaker<Tensor(Args...)>;

 public:
  TrainStep(std::shared_ptr<detail::DataParallelState> st, typename Maker::GradFn grad,
            std::shared_ptr<typename Maker::Updates> updates, optim::Optimizer& opt)
      : st_(std::move(st)), grad_(std::move(grad)), updates_(std::move(updates)), opt_(&opt) {}

  /// As compile_train_step's call (its checks, errors and guarantees), with the gradients averaged
  /// across ranks between the backward and the update.
  Tensor operator()(Args... args) const {
    protean::detail::TrainArenas& a = *st_->arenas;
    protean::detail::check_train_args(a, args...);
    protean::detail::prepare_train_step(a, *opt_);
    detail::broadcast_buffers(*st_);
    // The forward and backward write nothing in place (no donation): a call that throws there leaves
    // the parameters, the state and the buffers as they were.
    auto [loss, grads, bufs] = grad_(args..., protean::detail::param_arenas(a), protean::detail::buffers(a));
    detail::exchange_gradients(*st_, grads);
    Tensor hyper = protean::detail::next_hyper(a, *opt_);
    typename Maker::UpdOut updated;
    {
      // As in compile_train_step: the arenas are donated, so the update may write in place. The step
      // count advances (commit_step) only once the update's results are written back.
      protean::detail::ArenaDonation donate(a);
      updated = updates_->at(protean::detail::train_structure(a))(
          protean::detail::param_arenas(a), grads, protean::detail::state_arenas(a), hyper);
    }
    protean::detail::write_back(a, updated.first, updated.second, bufs);
    protean::detail::commit_step(a, *opt_);
    return loss;
  }
  ProcessGroup& group() const { return *st_->group; }
  /// The parameter arenas (1-D; the parameters are views of them).
  std::vector<Tensor> parameter_arenas() const { return protean::detail::param_arenas(*st_->arenas); }
  /// The forward + backward frame's counters, and the sum over the update frames (one per optimizer
  /// structure used).
  TrainStepStats stats() const {
    Stats update;
    for (const auto& [structure, fn] : updates_->by_structure) update += fn.stats();
    return {grad_.stats(), update, st_->all_reduces, st_->all_reduce_bytes, st_->all_reduce_seconds};
  }

 private:
  std::shared_ptr<detail::DataParallelState> st_;
  typename Maker::GradFn grad_;
  std::shared_ptr<typename Maker::Updates> updates_;
  optim::Optimizer* opt_;
};

/// compile_train_step for data parallelism over `group` (see the top of this file). The parameters
/// move into flat arenas as in compile_train_step; rank 0's values (and its module buffers) are
/// broadcast to every rank at creation (after a check that every rank has the same arenas and buffers:
/// ValueError naming the rank otherwise). Each call makes compile_train_step's checks (changed
/// param_groups, a reassigned parameter: ValueError), broadcasts the module's buffers from rank 0 (as
/// torch's DDP does by default), runs forward + backward (frame "<name>.grad"; buffers a training-mode
/// op rewrites, such as batch_norm_train's running statistics, are its outputs), averages the gradient
/// arenas across ranks, runs the optimizer update (frame "<name>.update", one per optimizer structure,
/// the arenas donated to it as in compile_train_step) and updates the arenas and buffers in place.
/// Hyperparameters stay graph inputs (never a recompile). Errors: compile_train_step's, and the group's
/// RuntimeError when a peer does not take part in time.
template <typename F>
auto compile_train_step(std::shared_ptr<Module> module, F loss_fn, optim::Optimizer& optimizer,
                        std::shared_ptr<ProcessGroup> group, CompileOptions opts = {},
                        std::source_location loc = std::source_location::current()) {
  using Sig = typename protean::detail::FnSig<std::decay_t<F>>::type;
  protean::detail::fill_location(opts, loc);
  if (opts.name == "fn") opts.name = "train_step";
  auto made = detail::DataParallelMaker<Sig>::make(std::move(module), std::move(loss_fn), optimizer, std::move(group),
                                                   std::move(opts));
  return [&]<typename... A>(Tensor (*)(A...)) {
    return TrainStep<A...>(std::get<0>(made), std::get<1>(made), std::get<2>(made), optimizer);
  }(static_cast<Sig*>(nullptr));
}

}  // namespace protean::distributed
