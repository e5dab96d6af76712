// The NCCL process group (src/distributed/nccl.h) against an in-process fake NCCL table and the fake
// CUDA driver: two ranks as two threads, bootstrapped through an in-process group, exchange rank 0's
// unique id, all-reduce and broadcast device tensors on the device's stream. Also the dtype and
// reduction tables, the errors (CPU tensors, NCCL failures, NCCL absent), and the layout check of
// data-parallel steps. No GPU or NCCL needed; these run in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "device/fake_driver.h"
#include "device/runtime.h"
#include "distributed/nccl.h"
#include "protean/distributed.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace pt = protean;
namespace dist = protean::distributed;
namespace nc = protean::nccl;

namespace {

// ---- an in-process group of threads (the bootstrap): all_gather_bytes only ----------------------------
struct ThreadWorld {
  int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> slots, result;
  int arrived = 0;
  uint64_t generation = 0;
  explicit ThreadWorld(int n) : size(n), slots(static_cast<size_t>(n)) {}
};

class ThreadGroup final : public dist::ProcessGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadWorld> w, int rank) : w_(std::move(w)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_->size; }
  std::string name() const override { return "threads"; }
  void all_reduce(const pt::Tensor&, dist::ReduceOp) override { throw pt::RuntimeError("threads: no all_reduce"); }
  void broadcast(const pt::Tensor&, int) override { throw pt::RuntimeError("threads: no broadcast"); }
  std::vector<std::string> all_gather_bytes(const std::string& mine) override {
    std::unique_lock<std::mutex> lock(w_->mu);
    const uint64_t gen = w_->generation;
    w_->slots[static_cast<size_t>(rank_)] = mine;
    if (++w_->arrived == w_->size) {
      w_->arrived = 0;
      w_->generation += 1;
      w_->result = w_->slots;  // the next exchange cannot complete before every rank has read this one
      w_->cv.notify_all();
    } else {
      w_->cv.wait(lock, [&] { return w_->generation != gen; });
    }
    return w_->result;
  }

 private:
  std::shared_ptr<ThreadWorld> w_;
  int rank_;
};

// ---- the fake NCCL: communicators keyed by unique id, collectives meet at a rendezvous ------------------
struct FakeCall {
  std::string fn;
  size_t count;
  int dtype, op_or_root, rank;
  protean::cuda::CUstream stream;
};

struct FakeWorld {
  int nranks = 0;
  std::vector<void*> bufs;
  int arrived = 0;
  uint64_t generation = 0;
};

struct FakeNccl {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, FakeWorld> worlds;
  std::vector<FakeCall> calls;
  int ids = 0, inits = 0, destroys = 0, aborts = 0;
  nc::ncclResult_t fail_all_reduce = 0;
} g_fake;

struct nccl_comm_fake {
  std::string key;
  int rank;
};

nc::ncclResult_t f_version(int* v) {
  *v = 22105;
  return 0;
}
nc::ncclResult_t f_unique_id(nc::ncclUniqueId* id) {
  std::lock_guard<std::mutex> lock(g_fake.mu);
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "fake-nccl-%d", g_fake.ids++);
  return 0;
}
nc::ncclResult_t f_init(nc::ncclComm_t* comm, int nranks, nc::ncclUniqueId id, int rank) {
  std::lock_guard<std::mutex> lock(g_fake.mu);
  std::string key(id.internal);
  FakeWorld& w = g_fake.worlds[key];
  if (w.nranks != 0 && w.nranks != nranks) return 4;  // ncclInvalidArgument
  w.nranks = nranks;
  w.bufs.resize(static_cast<size_t>(nranks));
  g_fake.inits += 1;
  *comm = reinterpret_cast<nc::ncclComm_t>(new nccl_comm_fake{key, rank});
  return 0;
}
nc::ncclResult_t f_destroy(nc::ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_fake.mu);
  g_fake.destroys += 1;
  delete reinterpret_cast<nccl_comm_fake*>(comm);
  return 0;
}
nc::ncclResult_t f_abort(nc::ncclComm_t comm) {
  {
    std::lock_guard<std::mutex> lock(g_fake.mu);
    g_fake.aborts += 1;
  }
  return f_destroy(comm);
}
nc::ncclResult_t f_async_error(nc::ncclComm_t, nc::ncclResult_t* e) {
  *e = 0;
  return 0;
}

// Every rank deposits its buffer; the last to arrive combines them; all leave together.
template <typename Combine>
nc::ncclResult_t rendezvous(nc::ncclComm_t comm, void* buf, Combine combine) {
  auto* c = reinterpret_cast<nccl_comm_fake*>(comm);
  std::unique_lock<std::mutex> lock(g_fake.mu);
  FakeWorld& w = g_fake.worlds.at(c->key);
  const uint64_t gen = w.generation;
  w.bufs[static_cast<size_t>(c->rank)] = buf;
  if (++w.arrived == w.nranks) {
    combine(w.bufs);
    w.arrived = 0;
    w.generation += 1;
    g_fake.cv.notify_all();
  } else {
    g_fake.cv.wait(lock, [&] { return w.generation != gen; });
  }
  return 0;
}

nc::ncclResult_t f_all_reduce(const void* send, void* recv, size_t count, nc::ncclDataType_t dt, nc::ncclRedOp_t op,
                              nc::ncclComm_t comm, protean::cuda::CUstream stream) {
  auto* c = reinterpret_cast<nccl_comm_fake*>(comm);
  {
    std::lock_guard<std::mutex> lock(g_fake.mu);
    g_fake.calls.push_back({"all_reduce", count, dt, op, c->rank, stream});
    if (g_fake.fail_all_reduce) return g_fake.fail_all_reduce;
  }
  if (send != recv) return 4;             // the group reduces in place
  if (dt != nc::kFloat32) return 4;       // this fake reduces f32 only
  return rendezvous(comm, recv, [&](std::vector<void*>& bufs) {
    for (size_t i = 0; i < count; ++i) {
      float acc = op == nc::kMax ? -1e30f : 0.f;
      for (void* b : bufs) {
        const float v = static_cast<float*>(b)[i];
        acc = op == nc::kMax ? std::max(acc, v) : acc + v;
      }
      if (op == nc::kAvg) acc /= static_cast<float>(bufs.size());
      for (void* b : bufs) static_cast<float*>(b)[i] = acc;
    }
  });
}
nc::ncclResult_t f_broadcast(const void* send, void* recv, size_t count, nc::ncclDataType_t dt, int root,
                             nc::ncclComm_t comm, protean::cuda::CUstream stream) {
  auto* c = reinterpret_cast<nccl_comm_fake*>(comm);
  {
    std::lock_guard<std::mutex> lock(g_fake.mu);
    g_fake.calls.push_back({"broadcast", count, dt, root, c->rank, stream});
  }
  if (send != recv || dt != nc::kFloat32) return 4;
  const size_t bytes = count * sizeof(float);
  return rendezvous(comm, recv, [&](std::vector<void*>& bufs) {
    for (size_t r = 0; r < bufs.size(); ++r)
      if (static_cast<int>(r) != root) std::memcpy(bufs[r], bufs[static_cast<size_t>(root)], bytes);
  });
}
const char* f_error_string(nc::ncclResult_t r) { return r == 3 ? "fake: internal error" : "fake: other error"; }

nc::NcclApi fake_api() {
  nc::NcclApi a;
  a.name = "fake";
  a.ncclGetVersion = f_version;
  a.ncclGetUniqueId = f_unique_id;
  a.ncclCommInitRank = f_init;
  a.ncclCommDestroy = f_destroy;
  a.ncclCommAbort = f_abort;
  a.ncclCommGetAsyncError = f_async_error;
  a.ncclAllReduce = f_all_reduce;
  a.ncclBroadcast = f_broadcast;
  a.ncclGetErrorString = f_error_string;
  return a;
}

class DistributedNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    {
      std::lock_guard<std::mutex> lock(g_fake.mu);
      g_fake.worlds.clear();
      g_fake.calls.clear();
      g_fake.ids = g_fake.inits = g_fake.destroys = g_fake.aborts = 0;
      g_fake.fail_all_reduce = 0;
    }
    api_ = fake_api();
    nc::set_nccl_for_testing(&api_);
  }
  void TearDown() override { nc::set_nccl_for_testing(nullptr); }
  nc::NcclApi api_;
  protean::cuda::FakeDriver driver_;
};

std::vector<float> host(const pt::Tensor& t) { return t.to_vector<float>(); }

}  // namespace

TEST(DistributedNcclTables, EveryDTypeAndReductionHasAnNcclValue) {
  EXPECT_EQ(nc::data_type(pt::DType::Bool), nc::kUint8);
  EXPECT_EQ(nc::data_type(pt::DType::U8), nc::kUint8);
  EXPECT_EQ(nc::data_type(pt::DType::I8), nc::kInt8);
  EXPECT_EQ(nc::data_type(pt::DType::I32), nc::kInt32);
  EXPECT_EQ(nc::data_type(pt::DType::I64), nc::kInt64);
  EXPECT_EQ(nc::data_type(pt::DType::F16), nc::kFloat16);
  EXPECT_EQ(nc::data_type(pt::DType::BF16), nc::kBfloat16);
  EXPECT_EQ(nc::data_type(pt::DType::F32), nc::kFloat32);
  EXPECT_EQ(nc::data_type(pt::DType::F64), nc::kFloat64);
  EXPECT_EQ(nc::red_op(dist::ReduceOp::Sum), nc::kSum);
  EXPECT_EQ(nc::red_op(dist::ReduceOp::Avg), nc::kAvg);
  EXPECT_EQ(nc::red_op(dist::ReduceOp::Max), nc::kMax);
  EXPECT_EQ(nc::red_op(dist::ReduceOp::Min), nc::kMin);
}

TEST(DistributedNcclTables, WithoutNcclTheGroupIsAClearError) {
  nc::set_nccl_library_for_testing("/nonexistent/libnccl.so.2");
  EXPECT_FALSE(dist::nccl_available());
  auto boot = std::make_shared<ThreadGroup>(std::make_shared<ThreadWorld>(1), 0);
  try {
    dist::nccl_group(boot, 0);
    ADD_FAILURE() << "expected RuntimeError";
  } catch (const pt::RuntimeError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("distributed::nccl_group needs NCCL: NCCL not found (dlopen /nonexistent/libnccl.so.2"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("PROTEAN_NCCL_LIBRARY"), std::string::npos) << m;
  }
  nc::set_nccl_library_for_testing("");
}

TEST(DistributedNcclTables, TheRealLibraryLoadsWhereInstalled) {
  // The CUDA 13 toolkit image ships libnccl.so.2; elsewhere this is the absence test's reason.
  if (!dist::nccl_available()) GTEST_SKIP() << nc::nccl_unavailable_reason();
  const nc::NcclApi& api = nc::require_nccl("test");
  EXPECT_STREQ(api.name, "libnccl.so.2");
  int version = 0;
  EXPECT_EQ(api.ncclGetVersion(&version), nc::kSuccess);
  EXPECT_GE(version, nc::kMinVersion);
  EXPECT_NE(std::string(api.ncclGetErrorString(3)), "");
}

TEST_F(DistributedNccl, TwoRanksShareRankZerosIdThenAverageAndBroadcastOnTheDeviceStream) {
  auto world = std::make_shared<ThreadWorld>(2);
  // Device tensors are made before the threads start (the fake driver's allocator is exercised
  // from one thread); each rank's values differ.
  pt::Tensor t0 = pt::tensor<float>({1, 2, 3, 4, 5}, {5}).to(pt::kCUDA);
  pt::Tensor t1 = pt::tensor<float>({3, 6, 9, 12, 15}, {5}).to(pt::kCUDA);
  pt::Tensor b0 = pt::tensor<float>({0, 0, 0}, {3}).to(pt::kCUDA);
  pt::Tensor b1 = pt::tensor<float>({7, 8, 9}, {3}).to(pt::kCUDA);
  const protean::cuda::CUstream stream = protean::cuda::stream(0);
  std::string names[2];
  std::string errors[2];
  auto rank_main = [&](int r) {
    try {
      auto boot = std::make_shared<ThreadGroup>(world, r);
      auto g = dist::nccl_group(boot, 0);
      names[r] = g->name() + "/" + std::to_string(g->rank()) + "/" + std::to_string(g->size());
      dist::average_gradients(*g, {r == 0 ? t0 : t1});
      g->broadcast(r == 0 ? b0 : b1, 1);
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread a(rank_main, 0), b(rank_main, 1);
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(names[0], "nccl/0/2");
  EXPECT_EQ(names[1], "nccl/1/2");
  EXPECT_EQ(host(t0), std::vector<float>({2, 4, 6, 8, 10}));
  EXPECT_EQ(host(t1), std::vector<float>({2, 4, 6, 8, 10}));
  EXPECT_EQ(host(b0), std::vector<float>({7, 8, 9}));
  std::lock_guard<std::mutex> lock(g_fake.mu);
  EXPECT_EQ(g_fake.ids, 1);  // only rank 0 made a unique id; rank 1 received it through the bootstrap
  EXPECT_EQ(g_fake.worlds.size(), 1u);
  EXPECT_EQ(g_fake.inits, 2);
  EXPECT_EQ(g_fake.destroys, 2);  // the groups destroyed their communicators
  ASSERT_EQ(g_fake.calls.size(), 4u);
  for (const FakeCall& c : g_fake.calls) {
    EXPECT_EQ(c.stream, stream) << c.fn;  // queued on the stream every Protean kernel of cuda:0 uses
    EXPECT_EQ(c.dtype, nc::kFloat32) << c.fn;
    if (c.fn == "all_reduce") {
      EXPECT_EQ(c.count, 5u);
      EXPECT_EQ(c.op_or_root, nc::kAvg);
    } else {
      EXPECT_EQ(c.count, 3u);
      EXPECT_EQ(c.op_or_root, 1);
    }
  }
}

TEST_F(DistributedNccl, CpuTensorsAndNcclFailuresAreErrorsNamingTheCall) {
  auto boot = std::make_shared<ThreadGroup>(std::make_shared<ThreadWorld>(1), 0);
  auto g = dist::nccl_group(boot, 0);
  try {
    g->all_reduce(pt::ones({4}), dist::ReduceOp::Sum);
    FAIL() << "expected ValueError";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("over nccl takes tensors on cuda:0, got one on cpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g->broadcast(pt::ones({4}).to(pt::kCUDA), 3), pt::ValueError);  // root outside the group
  EXPECT_THROW(dist::nccl_group(boot, 5), pt::ValueError);                    // no such device
  {
    std::lock_guard<std::mutex> lock(g_fake.mu);
    g_fake.fail_all_reduce = 3;
  }
  try {
    g->all_reduce(pt::ones({4}).to(pt::kCUDA), dist::ReduceOp::Avg);
    FAIL() << "expected RuntimeError";
  } catch (const pt::RuntimeError& e) {
    EXPECT_EQ(std::string(e.what()), "ncclAllReduce(4 x f32, avg) failed: ncclResult_t 3 (fake: internal error)");
  }
}

TEST(DistributedLayout, RanksWithDifferentArenasAreAValueErrorNamingBoth) {
  auto world = std::make_shared<ThreadWorld>(2);
  std::string errors[2];
  auto rank_main = [&](int r) {
    ThreadGroup g(world, r);
    try {
      dist::check_same_layout(g, {pt::zeros({r == 0 ? 10 : 12})}, "parameter arena");
    } catch (const pt::ValueError& e) {
      errors[r] = e.what();
    }
  };
  std::thread a(rank_main, 0), b(rank_main, 1);
  a.join();
  b.join();
  EXPECT_NE(errors[0].find("the parameter arenas differ between rank 0 and rank 1 (1;f32[10]@cpu vs 1;f32[12]@cpu)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("between rank 1 and rank 0"), std::string::npos) << errors[1];
}

// Leaving after an error: abort() tears the communicator down with ncclCommAbort (a peer that died
// never completes the collectives in flight, and ncclCommDestroy would wait for them), once; the group
// then refuses collectives with an error naming it, and its destructor does not touch NCCL again.
TEST_F(DistributedNccl, AbortLeavesWithoutWaitingAndRefusesLaterCollectives) {
  auto boot = std::make_shared<ThreadGroup>(std::make_shared<ThreadWorld>(1), 0);
  {
    auto g = dist::nccl_group(boot, 0);
    g->abort();
    g->abort();
    try {
      g->all_reduce(pt::ones({4}).to(pt::kCUDA), dist::ReduceOp::Sum);
      FAIL() << "expected RuntimeError";
    } catch (const pt::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("all_reduce over nccl on cuda:0: the group was aborted"), std::string::npos) << e.what();
    }
  }
  std::lock_guard<std::mutex> lock(g_fake.mu);
  EXPECT_EQ(g_fake.aborts, 1);
  EXPECT_EQ(g_fake.destroys, 1);  // the abort's teardown only
}

// The watchdog: a collective whose completion event is still not reached PROTEAN_NCCL_TIMEOUT_S after it
// was queued (a peer stopped) aborts the communicator from the watchdog thread; the next collective
// throws a RuntimeError naming the one that did not complete. A bad timeout is a ValueError.
TEST_F(DistributedNccl, AStalledCollectiveIsAbortedByTheWatchdog) {
  auto boot = std::make_shared<ThreadGroup>(std::make_shared<ThreadWorld>(1), 0);
  setenv("PROTEAN_NCCL_TIMEOUT_S", "soon", 1);
  EXPECT_THROW(dist::nccl_group(boot, 0), pt::ValueError);
  setenv("PROTEAN_NCCL_TIMEOUT_S", "0.2", 1);
  {
    auto g = dist::nccl_group(boot, 0);
    pt::Tensor t = pt::ones({4}).to(pt::kCUDA);
    g->all_reduce(t, dist::ReduceOp::Sum);  // completes (events done): watched, then dropped
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
    {
      std::lock_guard<std::mutex> lock(g_fake.mu);
      EXPECT_EQ(g_fake.aborts, 0);
    }
    driver_.stall_events(true);
    g->all_reduce(t, dist::ReduceOp::Sum);
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(g_fake.mu);
        if (g_fake.aborts == 1) break;
      }
      ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "the watchdog did not abort";
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    try {
      g->all_reduce(t, dist::ReduceOp::Sum);
      FAIL() << "expected RuntimeError";
    } catch (const pt::RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("ncclAllReduce(4 x f32, sum) did not complete within 0.2 s"), std::string::npos)
          << e.what();
    }
    driver_.stall_events(false);
  }
  unsetenv("PROTEAN_NCCL_TIMEOUT_S");
  std::lock_guard<std::mutex> lock(g_fake.mu);
  EXPECT_EQ(g_fake.aborts, 1);
}
