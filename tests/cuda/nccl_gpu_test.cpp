// The NCCL process group against the real libnccl.so.2 on one real GPU: a one-rank group (a rank's
// bootstrap that gathers only its own bytes), all_reduce in every ReduceOp on f32 and bf16 device
// tensors, broadcast, and the data-parallel helpers, with the results read back. One rank is all one
// device allows (NCCL refuses two ranks on one GPU); two GPUs are the 2-GPU machine's. Skipped without
// a CUDA device or without NCCL.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "device/runtime.h"
#include "distributed/nccl.h"
#include "protean/distributed.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace pt = protean;
namespace dist = protean::distributed;

namespace {

class SelfGroup final : public dist::ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "self"; }
  void all_reduce(const pt::Tensor&, dist::ReduceOp) override {}
  void broadcast(const pt::Tensor&, int) override {}
  std::vector<std::string> all_gather_bytes(const std::string& mine) override { return {mine}; }
};

TEST(DistributedNcclGpu, OneRankCollectivesOnTheRealDeviceKeepTheValues) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << protean::cuda::driver_unavailable_reason();
  if (!dist::nccl_available()) GTEST_SKIP() << protean::nccl::nccl_unavailable_reason();
  auto g = dist::nccl_group(std::make_shared<SelfGroup>(), 0);
  EXPECT_EQ(g->name(), "nccl");
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  pt::manual_seed(5);
  const pt::Tensor a = pt::randn({1000});
  for (pt::DType dt : {pt::DType::F32, pt::DType::BF16}) {
    const pt::Tensor want = a.to(dt).to(pt::DType::F64);
    for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max, dist::ReduceOp::Min}) {
      pt::Tensor t = a.to(dt).to(pt::kCUDA);
      g->all_reduce(t, op);
      EXPECT_EQ(t.device(), pt::kCUDA);
      EXPECT_EQ(t.cpu().to(pt::DType::F64).to_vector<double>(), want.to_vector<double>())
          << "one rank: " << dist::to_string(op) << " in " << pt::short_name(dt) << " keeps every value";
    }
    pt::Tensor b = a.to(dt).to(pt::kCUDA);
    g->broadcast(b, 0);
    EXPECT_EQ(b.cpu().to(pt::DType::F64).to_vector<double>(), want.to_vector<double>());
  }
  // the data-parallel helpers over several tensors (one all_reduce each), then a compiled use of the
  // results: the stream order holds
  std::vector<pt::Tensor> grads = {a.to(pt::kCUDA), pt::ones({7, 3}).to(pt::kCUDA)};
  dist::average_gradients(*g, grads);
  dist::broadcast_tensors(*g, grads, 0);
  EXPECT_EQ(grads[0].cpu().to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(grads[1].cpu().to_vector<float>(), std::vector<float>(21, 1.0f));
  // a CPU tensor is refused by name, the group stays usable
  EXPECT_THROW(g->all_reduce(pt::ones({2}), dist::ReduceOp::Sum), pt::Error);
  pt::Tensor c = pt::ones({4}).to(pt::kCUDA);
  g->all_reduce(c, dist::ReduceOp::Sum);
  EXPECT_EQ(c.cpu().to_vector<float>(), std::vector<float>(4, 1.0f));
}

}  // namespace
