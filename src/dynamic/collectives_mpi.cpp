// MPI CollectiveBackend: an all-gather made of nonblocking point-to-point messages, polled against a
// deadline. (A nonblocking MPI_Iallgather would also avoid the hang, but it cannot say *which* ranks
// are missing; per-peer receives can.) Messages of exchange k use tag 1 + k mod 30000 on a private
// communicator; MPI orders messages between two ranks with one tag, so exchanges never mix.
#include "protean/mpi.h"

// The C API only (the deprecated C++ bindings do not build with -Werror).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <fmt/format.h>
#include <thread>

#include "dynamic/collectives.h"
#include "observe/trace.h"
#include "protean/error.h"

namespace protean::mpi {

namespace {

class MpiCollectives final : public dynamic::CollectiveBackend {
 public:
  MpiCollectives() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCollectives() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  bool all_gather(const std::string& mine, double timeout_s, std::vector<std::string>& out,
                  std::vector<int>& missing) override {
    const int tag = 1 + static_cast<int>(seq_++ % 30000);
    out.assign(static_cast<size_t>(size_), std::string());
    out[static_cast<size_t>(rank_)] = mine;
    missing.clear();
    std::vector<MPI_Request> sends;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request r;
      MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_CHAR, p, tag, comm_, &r);
      sends.push_back(r);
    }
    std::vector<int> pending;
    for (int p = 0; p < size_; ++p)
      if (p != rank_) pending.push_back(p);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    auto pause = std::chrono::microseconds(20);
    while (!pending.empty()) {
      for (size_t i = 0; i < pending.size();) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(pending[i], tag, comm_, &flag, &st);
        if (!flag) {
          ++i;
          continue;
        }
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        std::string& buf = out[static_cast<size_t>(pending[i])];
        buf.resize(static_cast<size_t>(n));
        MPI_Recv(buf.data(), n, MPI_CHAR, pending[i], tag, comm_, MPI_STATUS_IGNORE);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      }
      if (pending.empty() || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(pause);
      if (pause < std::chrono::milliseconds(2)) pause *= 2;
    }
    // Our sends complete once their peers received them (or were buffered eagerly).
    for (;;) {
      int done = 0;
      MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE);
      if (done || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& r : sends)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // a peer that never receives: let MPI drop it
    missing = pending;
    return pending.empty();
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  uint64_t seq_ = 0;
};

}  // namespace

void install_compiler_collectives() {
  int init = 0;
  MPI_Initialized(&init);
  if (!init) throw RuntimeError("protean::mpi::install_compiler_collectives: call MPI_Init first");
  auto b = std::make_shared<MpiCollectives>();
  observe::set_trace_rank(b->rank());
  dynamic::set_collective_backend(std::move(b));
}

void uninstall_compiler_collectives() { dynamic::set_collective_backend(nullptr); }

}  // namespace protean::mpi
