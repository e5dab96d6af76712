// MPI process group (include/protean/mpi.h): nonblocking MPI collectives polled against a deadline.
#include "protean/mpi.h"

// The C API only (the deprecated C++ bindings do not build with -Werror).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "dynamic/collectives.h"
#include "protean/error.h"
#include "protean/tensor_version.h"

namespace protean::mpi {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::Bool: return MPI_UINT8_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::I8: return MPI_INT8_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::F16: return MPI_DATATYPE_NULL;  // widened to f32 (MPI has no 16-bit floats)
    case DType::BF16: return MPI_DATATYPE_NULL;
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(distributed::ReduceOp op, DType t) {
  switch (op) {
    case distributed::ReduceOp::Sum: return t == DType::Bool ? MPI_LOR : MPI_SUM;
    case distributed::ReduceOp::Avg: return MPI_SUM;
    case distributed::ReduceOp::Max: return t == DType::Bool ? MPI_LOR : MPI_MAX;
    case distributed::ReduceOp::Min: return t == DType::Bool ? MPI_LAND : MPI_MIN;
  }
  return MPI_SUM;
}

class MpiGroup final : public distributed::ProcessGroup {
 public:
  MpiGroup() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Requests abandoned by a timeout: a late peer may still complete them; give it a moment, so
    // MPI_Finalize does not meet an active request.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (MPI_Request& r : abandoned_) {
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < deadline) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  void all_reduce(const Tensor& t, distributed::ReduceOp op) override {
    check_cpu(t, "all_reduce");
    increment_version(t);  // written in place
    const int64_t n = t.int_numel();
    const std::string what = fmt::format("all_reduce({} x {}, {})", n, short_name(t.dtype()), distributed::to_string(op));
    if (t.dtype() == DType::F16 || t.dtype() == DType::BF16) {
      Tensor wide = t.to(DType::F32);
      all_reduce(wide, op);
      Tensor back = wide.to(t.dtype());
      std::memcpy(t.data_ptr(), back.data_ptr(), static_cast<size_t>(n) * t.itemsize());
      return;
    }
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, t.data_ptr(), count(n), mpi_type(t.dtype()), mpi_op(op, t.dtype()), comm_, &req);
    wait(req, what);
    if (op == distributed::ReduceOp::Avg && size_ > 1 && t.dtype() != DType::Bool) {
      dispatch_dtype(t.dtype(), [&]<typename T>() {
        T* p = t.data_ptr<T>();
        if constexpr (std::is_floating_point_v<T>) {
          const T inv = T(1) / static_cast<T>(size_);  // as NCCL's ncclAvg: sum times 1/size for floats
          for (int64_t i = 0; i < n; ++i) p[i] *= inv;
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(size_));
        }
      });
    }
  }

  void broadcast(const Tensor& t, int root) override {
    increment_version(t);  // written in place
    check_cpu(t, "broadcast");
    if (root < 0 || root >= size_)
      throw ValueError(fmt::format("distributed: broadcast root {} is not a rank of a group of {}", root, size_));
    const size_t bytes = static_cast<size_t>(t.int_numel()) * t.itemsize();
    MPI_Request req;
    MPI_Ibcast(t.data_ptr(), count(static_cast<int64_t>(bytes)), MPI_BYTE, root, comm_, &req);
    wait(req, fmt::format("broadcast({} x {}, root {})", t.int_numel(), short_name(t.dtype()), root));
  }

  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<size_t>(size_));
    MPI_Request req;
    MPI_Iallgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_, &req);
    wait(req, "all_gather of byte lengths");
    std::vector<int> displs(static_cast<size_t>(size_));
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += lens[static_cast<size_t>(r)];
    }
    std::string buf(static_cast<size_t>(total), '\0');
    MPI_Iallgatherv(mine.data(), len, MPI_CHAR, buf.data(), lens.data(), displs.data(), MPI_CHAR, comm_, &req);
    wait(req, fmt::format("all_gather of {} bytes", len));
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.push_back(buf.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                               static_cast<size_t>(lens[static_cast<size_t>(r)])));
    return out;
  }

 private:
  static void check_cpu(const Tensor& t, const char* what) {
    if (t.device().type != DeviceType::CPU)
      throw ValueError(fmt::format("distributed: {} over mpi takes CPU tensors, got one on {} (use "
                                   "protean::mpi::process_group({}) for an NCCL group)",
                                   what, t.device().str(), t.device().str()));
    if (!t.is_contiguous()) throw ValueError(fmt::format("distributed: {} over mpi takes a contiguous tensor", what));
  }
  static int count(int64_t n) {
    if (n > INT32_MAX)
      throw ValueError(fmt::format("distributed: {} elements exceed MPI's int count; split the tensor", n));
    return static_cast<int>(n);
  }
  /// Polls `req` until done or PROTEAN_COLLECTIVES_TIMEOUT_S has passed (then RuntimeError).
  void wait(MPI_Request& req, const std::string& what) {
    double timeout = 0;
    try {
      timeout = dynamic::collectives_timeout_s();  // ValueError for a mistyped variable
    } catch (...) {
      abandoned_.push_back(req);
      throw;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    auto pause = std::chrono::microseconds(1);
    for (;;) {
      int done = 0;
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::microseconds(500)) pause *= 2;
    }
    abandoned_.push_back(req);
    throw RuntimeError(fmt::format(
        "distributed: {} on rank {} of {} over mpi: not every rank took part within {} s "
        "(PROTEAN_COLLECTIVES_TIMEOUT_S); a rank stopped, failed, or is running a different step. The "
        "communicator cannot be used after this error",
        what, rank_, size_, timeout));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> abandoned_;
};

}  // namespace

std::shared_ptr<distributed::ProcessGroup> process_group(Device device) {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) throw RuntimeError("protean::mpi::process_group: call MPI_Init first");
  auto group = std::make_shared<MpiGroup>();
  switch (device.type) {
    case DeviceType::CPU: return group;
    case DeviceType::CUDA: return distributed::nccl_group(group, device.index);
  }
  return group;
}

}  // namespace protean::mpi
