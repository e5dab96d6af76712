// The NCCL table (src/distributed/nccl.h) and the NCCL process group (include/protean/distributed.h).
#include "distributed/nccl.h"

#include <fmt/format.h>

#include <cstdlib>
#include <cstdio>
#include <vector>
#include <thread>
#include <condition_variable>
#include <cmath>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>

#include "device/dynamic_library.h"
#include "device/runtime.h"
#include "protean/error.h"

namespace protean::nccl {

namespace {

struct Loaded {
  NcclApi api;
  bool ok = false;
  std::string reason;
};

Loaded load_real(const std::string& path) {
  Loaded l;
  std::string error;
  void* lib = cuda::open_first_library({path}, error);
  if (!lib) {
    l.reason = fmt::format(
        "NCCL not found (dlopen {}: {}); install NCCL (Debian's libnccl2, or the nvidia-nccl-cu13 wheel that "
        "PyTorch ships) or set PROTEAN_NCCL_LIBRARY to its path",
        path, error);
    return l;
  }
  NcclApi& a = l.api;
  a.name = "libnccl.so.2";
  std::string missing;
  bool ok = cuda::resolve_symbol(lib, a.ncclGetVersion, {"ncclGetVersion"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclGetUniqueId, {"ncclGetUniqueId"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclCommInitRank, {"ncclCommInitRank"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclCommDestroy, {"ncclCommDestroy"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclCommAbort, {"ncclCommAbort"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclCommGetAsyncError, {"ncclCommGetAsyncError"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclAllReduce, {"ncclAllReduce"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclBroadcast, {"ncclBroadcast"}, missing) &&
            cuda::resolve_symbol(lib, a.ncclGetErrorString, {"ncclGetErrorString"}, missing);
  if (!ok) {
    l.reason = fmt::format("the NCCL library {} lacks {}", path, missing);
    return l;
  }
  int version = 0;
  if (a.ncclGetVersion(&version) != kSuccess || version < kMinVersion) {
    l.reason = fmt::format("the NCCL library {} is version code {}; Protean needs NCCL 2.10 or newer ({})", path,
                           version, kMinVersion);
    return l;
  }
  l.ok = true;
  return l;  // the library stays loaded for the process
}

std::mutex g_mu;
const NcclApi* g_test = nullptr;
bool g_test_set = false;
std::unique_ptr<Loaded> g_real;  // loaded on first use (under g_mu); replaced by set_nccl_library_for_testing

const Loaded& real_locked() {
  if (!g_real) {
    const char* env = std::getenv("PROTEAN_NCCL_LIBRARY");
    g_real = std::make_unique<Loaded>(load_real(env && *env ? env : "libnccl.so.2"));
  }
  return *g_real;
}

}  // namespace

const NcclApi* nccl() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_test_set) return g_test;
  const Loaded& l = real_locked();
  return l.ok ? &l.api : nullptr;
}

std::string nccl_unavailable_reason() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_test_set) return "";
  const Loaded& l = real_locked();
  return l.ok ? "" : l.reason;
}

const NcclApi& require_nccl(std::string_view what) {
  if (const NcclApi* a = nccl()) return *a;
  throw RuntimeError(fmt::format("{} needs NCCL: {}", what, nccl_unavailable_reason()));
}

void set_nccl_for_testing(const NcclApi* api) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_test = api;
  g_test_set = api != nullptr;
}

void set_nccl_library_for_testing(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (path.empty()) {
    g_real.reset();
  } else {
    g_real = std::make_unique<Loaded>(load_real(path));
  }
}

void check(const NcclApi& api, ncclResult_t r, std::string_view call) {
  if (r == kSuccess) return;
  const char* text = api.ncclGetErrorString ? api.ncclGetErrorString(r) : nullptr;
  throw RuntimeError(fmt::format("{} failed: ncclResult_t {} ({})", call, r, text ? text : "no error text"));
}

ncclDataType_t data_type(DType t) {
  switch (t) {
    case DType::Bool: return kUint8;
    case DType::U8: return kUint8;
    case DType::I8: return kInt8;
    case DType::I32: return kInt32;
    case DType::I64: return kInt64;
    case DType::F16: return kFloat16;
    case DType::BF16: return kBfloat16;
    case DType::F32: return kFloat32;
    case DType::F64: return kFloat64;
  }
  return kUint8;
}

ncclRedOp_t red_op(distributed::ReduceOp op) {
  switch (op) {
    case distributed::ReduceOp::Sum: return kSum;
    case distributed::ReduceOp::Avg: return kAvg;
    case distributed::ReduceOp::Max: return kMax;
    case distributed::ReduceOp::Min: return kMin;
  }
  return kSum;
}

namespace {

/// PROTEAN_NCCL_TIMEOUT_S: seconds a collective may take before the watchdog aborts the group
/// (default 600, torch's NCCL timeout). Not a positive number: ValueError naming the variable.
double nccl_timeout_s() {
  const char* e = std::getenv("PROTEAN_NCCL_TIMEOUT_S");
  if (!e || !*e) return 600.0;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  if (!end || *end != '\0' || !(v > 0) || !std::isfinite(v))
    throw ValueError(fmt::format("PROTEAN_NCCL_TIMEOUT_S=\"{}\" is not a positive number of seconds", e));
  return v;
}

class NcclGroup final : public distributed::ProcessGroup {
 public:
  NcclGroup(std::shared_ptr<ProcessGroup> bootstrap, int device)
      : api_(require_nccl("distributed::nccl_group")), bootstrap_(std::move(bootstrap)), device_(device) {
    cuda::require_driver("distributed::nccl_group");
    if (device < 0 || device >= cuda::device_count())
      throw ValueError(fmt::format("distributed::nccl_group: cuda:{} is not a device of this machine ({} devices)", device,
                                   cuda::device_count()));
    ncclUniqueId id{};
    std::string mine;
    if (bootstrap_->rank() == 0) {
      check(api_, api_.ncclGetUniqueId(&id), "ncclGetUniqueId");
      mine.assign(id.internal, sizeof id.internal);
    }
    std::vector<std::string> all = bootstrap_->all_gather_bytes(mine);
    if (all.empty() || all[0].size() != sizeof id.internal)
      throw RuntimeError(fmt::format("distributed::nccl_group: rank 0's NCCL unique id did not arrive over {} "
                                     "(got {} bytes, expected {})",
                                     bootstrap_->name(), all.empty() ? 0 : all[0].size(), sizeof id.internal));
    std::memcpy(id.internal, all[0].data(), sizeof id.internal);
    cuda::stream(device_);  // makes the device's context current on this thread
    check(api_, api_.ncclCommInitRank(&comm_, bootstrap_->size(), id, bootstrap_->rank()),
          fmt::format("ncclCommInitRank(rank {} of {}, cuda:{})", bootstrap_->rank(), bootstrap_->size(), device_));
  }
  ~NcclGroup() override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stop_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    for (const Watch& w : watched_) driver_.cuEventDestroy(w.event);
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) api_.ncclCommDestroy(comm_);
  }
  void abort() override {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (comm_) api_.ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string name() const override { return "nccl"; }

  void all_reduce(const Tensor& t, distributed::ReduceOp op) override {
    void* p = checked(t, "all_reduce");
    const std::string call =
        fmt::format("ncclAllReduce({} x {}, {})", t.int_numel(), short_name(t.dtype()), distributed::to_string(op));
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (!comm_) throw RuntimeError(refusal("all_reduce"));
      check(api_,
            api_.ncclAllReduce(p, p, static_cast<size_t>(t.int_numel()), data_type(t.dtype()), red_op(op), comm_,
                               cuda::stream(device_)),
            call);
    }
    watch(call);
  }
  void broadcast(const Tensor& t, int root) override {
    if (root < 0 || root >= size())
      throw ValueError(fmt::format("distributed: broadcast root {} is not a rank of a group of {}", root, size()));
    void* p = checked(t, "broadcast");
    const std::string call = fmt::format("ncclBroadcast({} x {}, root {})", t.int_numel(), short_name(t.dtype()), root);
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (!comm_) throw RuntimeError(refusal("broadcast"));
      check(api_,
            api_.ncclBroadcast(p, p, static_cast<size_t>(t.int_numel()), data_type(t.dtype()), root, comm_,
                               cuda::stream(device_)),
            call);
    }
    watch(call);
  }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    return bootstrap_->all_gather_bytes(mine);
  }

 private:
  void* checked(const Tensor& t, const char* what) const {
    if (t.device().type != DeviceType::CUDA || t.device().index != device_)
      throw ValueError(fmt::format("distributed: {} over nccl takes tensors on cuda:{}, got one on {} (use the MPI "
                                   "group for CPU tensors)",
                                   what, device_, t.device().str()));
    if (!t.is_contiguous())
      throw ValueError(fmt::format("distributed: {} over nccl takes a contiguous tensor", what));
    return t.data_ptr();
  }
  std::string refusal(const char* what) const {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (!timed_out_.empty())
      return fmt::format("distributed: {} over nccl on cuda:{}: {}; the group was aborted and takes no more collectives",
                         what, device_, timed_out_);
    return fmt::format("distributed: {} over nccl on cuda:{}: the group was aborted (after an error); it takes no more "
                       "collectives",
                       what, device_);
  }

  /// The watchdog: each collective's completion is an event recorded after it on the device's stream. A
  /// collective that has not completed PROTEAN_NCCL_TIMEOUT_S seconds (default 600) after it was queued
  /// (a peer stopped, or left without aborting) aborts the communicator from the watchdog thread, as
  /// torch's NCCL watchdog does: NCCL's kernels then return, the rank's stream synchronizations finish,
  /// and the next collective throws a RuntimeError naming the one that did not complete.
  void watch(const std::string& call) {
    cuda::CUevent ev = nullptr;
    cuda::stream(device_);  // the device's context current on this thread
    if (driver_.cuEventCreate(&ev, 0x2 /* CU_EVENT_DISABLE_TIMING */) != cuda::kCudaSuccess) return;
    if (driver_.cuEventRecord(ev, cuda::stream(device_)) != cuda::kCudaSuccess) {
      driver_.cuEventDestroy(ev);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watched_.push_back({ev, std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                         std::chrono::duration<double>(timeout_s_)),
                          call});
      if (!watchdog_.joinable()) watchdog_ = std::thread([this] { watchdog_loop(); });
    }
    watch_cv_.notify_all();
  }
  void watchdog_loop() {
    cuda::stream(device_);  // the device's context current on the watchdog thread
    std::unique_lock<std::mutex> lock(watch_mu_);
    while (!stop_) {
      while (!watched_.empty()) {
        const cuda::CUresult q = driver_.cuEventQuery(watched_.front().event);
        if (q == cuda::kCudaSuccess) {  // done: the next one
          driver_.cuEventDestroy(watched_.front().event);
          watched_.erase(watched_.begin());
          continue;
        }
        if (q == cuda::kCudaErrorNotReady && std::chrono::steady_clock::now() < watched_.front().deadline) break;
        // Past its deadline (or the query failed: the context is gone): abort, stop watching.
        timed_out_ = q == cuda::kCudaErrorNotReady
                         ? fmt::format("{} did not complete within {} s (PROTEAN_NCCL_TIMEOUT_S): a rank stopped, or "
                                       "left without it",
                                       watched_.front().call, timeout_s_)
                         : fmt::format("waiting for {} failed (cuEventQuery: CUresult {})", watched_.front().call, q);
        for (const Watch& x : watched_) driver_.cuEventDestroy(x.event);
        watched_.clear();
        const std::string why = timed_out_;
        lock.unlock();
        {
          std::lock_guard<std::mutex> c(comm_mu_);
          if (comm_) api_.ncclCommAbort(comm_);
          comm_ = nullptr;
        }
        std::fprintf(stderr, "protean: distributed: rank %d: %s; aborting the NCCL group\n", rank(), why.c_str());
        lock.lock();
      }
      watch_cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }
  struct Watch {
    cuda::CUevent event;
    std::chrono::steady_clock::time_point deadline;
    std::string call;
  };
  const NcclApi& api_;
  const cuda::DriverApi& driver_ = cuda::require_driver("distributed::nccl_group");
  std::shared_ptr<ProcessGroup> bootstrap_;
  int device_ = 0;
  std::mutex comm_mu_;  // comm_: the calling thread's collectives against the watchdog's abort
  ncclComm_t comm_ = nullptr;
  double timeout_s_ = nccl_timeout_s();
  mutable std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::vector<Watch> watched_;  // queued collectives, oldest first
  std::string timed_out_;       // why the watchdog aborted, if it did
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

}  // namespace protean::nccl

namespace protean::distributed {

std::shared_ptr<ProcessGroup> nccl_group(std::shared_ptr<ProcessGroup> bootstrap, int device) {
  if (!bootstrap) throw ValueError("distributed::nccl_group: the bootstrap group is null");
  return std::make_shared<nccl::NcclGroup>(std::move(bootstrap), device);
}

bool nccl_available() { return nccl::nccl() != nullptr; }

}  // namespace protean::distributed
