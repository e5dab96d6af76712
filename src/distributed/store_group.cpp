// Jobs without MPI (include/protean/distributed.h): the store group, init_from_env and the compiler
// collectives' backend over the store. The files and their format: src/distributed/file_store.h.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <optional>

#include "distributed/file_store.h"
#include "dynamic/collectives.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "protean/distributed.h"
#include "protean/error.h"

namespace protean::distributed {

namespace {

/// The error of a tensor collective (`call`, e.g. "all_reduce(cuda:0, sum)") on the store group.
ValueError tensor_collective_refused(const std::string& call) {
  return ValueError(fmt::format(
      "distributed: {} over the store group: the store group is a bootstrap group that carries only small host "
      "byte strings (all_gather_bytes), no tensors. Make a group for the tensors from it: "
      "distributed::nccl_group(store, store->local_rank()) for CUDA tensors, protean::mpi::process_group() "
      "(protean_mpi) for CPU tensors",
      call));
}

// Channels of one store: the rendezvous, the group's all_gather_bytes, the compiler collectives.
constexpr const char* kJoin = "join";
constexpr const char* kGroup = "pg";
constexpr const char* kCompiler = "cc";

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

}  // namespace

StoreGroup::StoreGroup(const StoreOptions& o) : timeout_s_(o.timeout_s) {
  if (!(o.timeout_s >= 0))
    throw ValueError(fmt::format("distributed::store_group: timeout_s must be >= 0 (0: PROTEAN_COLLECTIVES_TIMEOUT_S), got {}",
                                 o.timeout_s));
  if (o.world_size < 1)
    throw ValueError(fmt::format("distributed::store_group: world_size must be at least 1, got {}", o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw ValueError(fmt::format("distributed::store_group: rank {} is not a rank of a world of {}", o.rank, o.world_size));
  local_world_size_ = o.local_world_size == 0 ? o.world_size : o.local_world_size;
  local_rank_ = o.local_rank < 0 ? (o.local_world_size == 0 ? o.rank : -1) : o.local_rank;
  if (local_world_size_ < 1 || local_world_size_ > o.world_size)
    throw ValueError(fmt::format("distributed::store_group: local_world_size {} must be between 1 and the world size {}",
                                 local_world_size_, o.world_size));
  if (local_rank_ < 0 || local_rank_ >= local_world_size_)
    throw ValueError(fmt::format("distributed::store_group: local_rank {} is not a rank of a host with {} ranks",
                                 o.local_rank, local_world_size_));
  store_ = std::make_shared<detail::FileStore>(o.path, o.run_id, o.rank, o.world_size);

  // The rendezvous: every rank's group exists, with the same world size (checked by the store's
  // headers). The payload (pid, host, local rank) is for the log.
  const auto t0 = std::chrono::steady_clock::now();
  const std::string me = fmt::format("{} {} {}", ::getpid(), host_name(), local_rank_);
  std::vector<std::string> all;
  std::vector<int> missing;
  if (!store_->all_gather(kJoin, me, timeout(), all, missing)) {
    broken_ = true;
    throw RuntimeError(fmt::format(
        "distributed::store_group: rank {} of {}: ranks {} did not arrive within {} s (PROTEAN_COLLECTIVES_TIMEOUT_S) at "
        "the store {} (run {}). Start every rank with the same PROTEAN_STORE and PROTEAN_RUN_ID (protean launch does), "
        "and make every rank create its store groups in the same order",
        o.rank, o.world_size, fmt::join(missing, ", "), timeout(), store_->dir(), store_->run_id()));
  }
  if (observe::log_enabled(observe::LogCat::Pgo))
    observe::log_line(observe::LogCat::Pgo, "",
                      fmt::format("distributed: store group rank {} of {} (local {} of {}) at {} (run {}, generation {}) "
                                  "ready after {:.3f} s",
                                  o.rank, o.world_size, local_rank_, local_world_size_, store_->dir(), store_->run_id(),
                                  store_->generation(),
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
}

StoreGroup::~StoreGroup() = default;  // the store closes when the compiler collectives' backend lets go too

int StoreGroup::rank() const { return store_->rank(); }
int StoreGroup::size() const { return store_->size(); }
const std::string& StoreGroup::path() const { return store_->dir(); }
const std::string& StoreGroup::run_id() const { return store_->run_id(); }

double StoreGroup::timeout() const { return timeout_s_ > 0 ? timeout_s_ : dynamic::collectives_timeout_s(); }

void StoreGroup::all_reduce(const Tensor& t, ReduceOp op) {
  throw tensor_collective_refused(fmt::format("all_reduce({}, {})", t.device().str(), to_string(op)));
}

void StoreGroup::broadcast(const Tensor& t, int root) {
  throw tensor_collective_refused(fmt::format("broadcast(root {}, {})", root, t.device().str()));
}

std::vector<std::string> StoreGroup::all_gather_bytes(const std::string& mine) {
  if (broken_)
    throw RuntimeError(fmt::format("distributed: the store group at {} is unusable after an earlier timeout; end the job",
                                   store_->dir()));
  std::vector<std::string> out;
  std::vector<int> missing;
  const uint64_t seq = store_->next_seq(kGroup);
  bool ok = false;
  try {
    ok = store_->all_gather(kGroup, mine, timeout(), out, missing);
  } catch (...) {
    broken_ = true;  // a corrupt file: the exchanges are out of step from here on
    throw;
  }
  if (!ok) {
    broken_ = true;
    throw RuntimeError(fmt::format(
        "distributed: all_gather_bytes #{} on rank {} of {} over the store {} (run {}): ranks {} did not take part within "
        "{} s (PROTEAN_COLLECTIVES_TIMEOUT_S): they exited, crashed or are stuck elsewhere. Every rank must call the "
        "collectives in the same order; raise PROTEAN_COLLECTIVES_TIMEOUT_S if they are only slow",
        seq, rank(), size(), store_->dir(), store_->run_id(), fmt::join(missing, ", "), timeout()));
  }
  return out;
}

std::shared_ptr<StoreGroup> store_group(const StoreOptions& options) { return std::make_shared<StoreGroup>(options); }

// ---- init_from_env ------------------------------------------------------------------------------

namespace {

const char* kHint =
    "start the program with `protean launch --nproc N -- PROGRAM ARGS...`, which sets PROTEAN_RANK, PROTEAN_WORLD_SIZE, "
    "PROTEAN_LOCAL_RANK, PROTEAN_LOCAL_WORLD_SIZE, PROTEAN_STORE and PROTEAN_RUN_ID";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

std::string required(const char* name) {
  auto v = env(name);
  if (!v || v->empty())
    throw ValueError(fmt::format("distributed::init_from_env: {} is not set; {}", name, kHint));
  return *v;
}

int integer(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || v < INT_MIN || v > INT_MAX)
    throw ValueError(fmt::format("distributed::init_from_env: {}='{}' is not an integer", name, text));
  return static_cast<int>(v);
}

}  // namespace

std::shared_ptr<StoreGroup> init_from_env() {
  StoreOptions o;
  o.world_size = integer("PROTEAN_WORLD_SIZE", required("PROTEAN_WORLD_SIZE"));
  if (o.world_size < 1)
    throw ValueError(fmt::format("distributed::init_from_env: PROTEAN_WORLD_SIZE={} must be at least 1", o.world_size));
  o.rank = integer("PROTEAN_RANK", required("PROTEAN_RANK"));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw ValueError(fmt::format("distributed::init_from_env: PROTEAN_RANK={} is not a rank of PROTEAN_WORLD_SIZE={} "
                                 "(ranks are 0 to {})",
                                 o.rank, o.world_size, o.world_size - 1));
  const auto lws = env("PROTEAN_LOCAL_WORLD_SIZE");
  const auto lr = env("PROTEAN_LOCAL_RANK");
  if (lws && !lws->empty()) {
    o.local_world_size = integer("PROTEAN_LOCAL_WORLD_SIZE", *lws);
    if (o.local_world_size < 1 || o.local_world_size > o.world_size)
      throw ValueError(fmt::format("distributed::init_from_env: PROTEAN_LOCAL_WORLD_SIZE={} must be between 1 and "
                                   "PROTEAN_WORLD_SIZE={}",
                                   o.local_world_size, o.world_size));
  }
  if (lr && !lr->empty()) {
    o.local_rank = integer("PROTEAN_LOCAL_RANK", *lr);
    const int lw = o.local_world_size ? o.local_world_size : o.world_size;
    if (o.local_rank < 0 || o.local_rank >= lw)
      throw ValueError(fmt::format("distributed::init_from_env: PROTEAN_LOCAL_RANK={} is not a rank of {}={}",
                                   o.local_rank, o.local_world_size ? "PROTEAN_LOCAL_WORLD_SIZE" : "PROTEAN_WORLD_SIZE",
                                   lw));
  } else if (o.local_world_size != 0) {
    throw ValueError("distributed::init_from_env: PROTEAN_LOCAL_WORLD_SIZE is set but PROTEAN_LOCAL_RANK is not; set both "
                     "or neither");
  }
  o.path = required("PROTEAN_STORE");
  o.run_id = required("PROTEAN_RUN_ID");
  detail::check_run_id(o.run_id, "distributed::init_from_env: PROTEAN_RUN_ID");
  return store_group(o);
}

// ---- compiler collectives over the store --------------------------------------------------------

namespace {

class StoreCollectives final : public dynamic::CollectiveBackend {
 public:
  explicit StoreCollectives(std::shared_ptr<detail::FileStore> store) : store_(std::move(store)) {}
  int rank() const override { return store_->rank(); }
  int size() const override { return store_->size(); }
  bool all_gather(const std::string& mine, double timeout_s, std::vector<std::string>& out,
                  std::vector<int>& missing) override {
    return store_->all_gather(kCompiler, mine, timeout_s, out, missing);
  }

 private:
  std::shared_ptr<detail::FileStore> store_;
};

}  // namespace

std::shared_ptr<dynamic::CollectiveBackend> detail::make_store_collectives(std::shared_ptr<FileStore> store) {
  return std::make_shared<StoreCollectives>(std::move(store));
}

void install_compiler_collectives(const std::shared_ptr<StoreGroup>& store) {
  if (!store) throw ValueError("distributed::install_compiler_collectives: the store group is null");
  observe::set_trace_rank(store->rank());
  dynamic::set_collective_backend(detail::make_store_collectives(store->store()));
}

void uninstall_compiler_collectives() { dynamic::set_collective_backend(nullptr); }

}  // namespace protean::distributed
