// mode "reduce-overhead" of the cuda backend (backend/cuda/graphs.h) against the fake driver: the
// patch plan, the arena layout, one recording per (artifact, bucket), exact sizes patched into the
// nodes, outputs that later replays never overwrite, plain launches (and why) when a graph cannot be
// used, and the split around steps that are not recorded. No GPU needed; these run in CI.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "backend/cuda/graphs.h"
#include "backend/cuda/program.h"
#include "fake_program.h"
#include "backend/cuda/runner.h"
#include "backend/graph_stats.h"
#include "device/fake_driver.h"
#include "observe/log.h"
#include "protean/ops.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;

namespace {

std::vector<float> values(const pt::Tensor& t) { return t.to_vector<float>(); }

// tmp = in * 2 (k0), out = tmp + 1 (k1); tmp lives in slot 0. With `host`, a host step
// out2 = -tmp follows, and out2 is the output instead.
std::shared_ptr<bc::CudaProgram> two_kernels(bool host = false) {
  auto p = std::make_shared<bc::CudaProgram>();
  p->name = "two";
  p->cubin = {'f', 'a', 'k', 'e', 0};
  pt::sym::Expr s0 = pt::sym::symbol("s0");
  p->symbols = {s0};
  bc::testing::plan_input_temp_output(*p, s0);
  p->kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, s0), bc::testing::grid_stride_kernel("k1", 1, 2, s0)};
  p->steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Kernel, 1, {1}}};
  if (host) {
    bc::PlannedBuffer out2 = bc::testing::f32_buffer(3, pt::loop::BufferKind::Output, s0);
    out2.output_index = 0;
    out2.from_extern = true;
    p->buffers.buffers[2].kind = pt::loop::BufferKind::Temp;  // out of k1 becomes a temporary
    p->buffers.buffers.push_back(out2);
    p->buffers.outputs = {3};
    bc::HostStep h;
    h.ext.op = pt::ops::OpKind::neg;
    h.ext.inputs = {2};
    h.ext.outputs = {3};
    h.reason = "test";
    p->host = {h};
    p->steps.push_back(bc::Step{bc::StepKind::Host, 0, {2}});
  }
  return p;
}

void define_two(drv::FakeDriver& fake) {
  auto scale = [](const drv::FakeLaunch& l) {
    auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
    auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
    for (int64_t i = 0; i < l.param<int64_t>(2); ++i) out[i] = in[i] * 2.0f;
  };
  auto inc = [](const drv::FakeLaunch& l) {
    auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
    auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
    for (int64_t i = 0; i < l.param<int64_t>(2); ++i) out[i] = in[i] + 1.0f;
  };
  for (const char* v : {"_aligned", "_general"}) {
    fake.define_kernel(std::string("k0") + v, {8, 8, 8}, scale);
    fake.define_kernel(std::string("k1") + v, {8, 8, 8}, inc);
  }
}

pt::backend::BackendInput graph_input(const std::string& policy = "") {
  pt::backend::BackendInput in;
  in.symbols = {pt::sym::symbol("s0")};
  in.compile_id = "7/0";
  in.mode = "reduce-overhead";
  in.buckets.policy = pt::dynamic::BucketPolicy::parse(policy, "test").str();
  in.buckets.ranges = std::vector<pt::backend::BackendInput::SymbolRange>(1);
  return in;
}

void expect_result(const pt::Tensor& x, const pt::Tensor& out) {
  const std::vector<float> xv = values(x), ov = values(out);
  ASSERT_EQ(xv.size(), ov.size());
  for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(ov[i], xv[i] * 2.0f + 1.0f) << i;
}

}  // namespace

TEST(CudaGraphs, PatchPlanAndArenaLayout) {
  auto p = two_kernels();
  EXPECT_EQ(bc::to_text(bc::patch_plan(*p), *p),
            "k0 (step 0); sizes p2; io p0; arena p1; grid varies\n"
            "k1 (step 1); sizes p2; io p1; arena p0; grid varies\n");
  const std::vector<int64_t> upper{64};
  bc::ArenaLayout l = bc::plan_arena(*p, upper);
  EXPECT_EQ(l.offset, (std::vector<int64_t>{-1, 0, -1})) << "only the temporary lives in the arena";
  EXPECT_EQ(l.capacity[1], 256);
  EXPECT_EQ(l.bytes, 256);
  const std::vector<int64_t> upper2{1280};
  EXPECT_EQ(bc::plan_arena(*p, upper2).bytes, 1280 * 4);
  // With the host step, k1's output is a temporary too: its own 256-aligned region after the slot.
  auto h = two_kernels(true);
  l = bc::plan_arena(*h, std::vector<int64_t>{33});
  EXPECT_EQ(l.offset, (std::vector<int64_t>{-1, 0, 256, -1}));
  EXPECT_EQ(l.bytes, 256 + 33 * 4);
  const auto segs = bc::graph_segments(*h);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].first, 0u);
  EXPECT_EQ(segs[0].end, 2u);
  // Bucket keys follow the policy and the symbol's known range.
  const auto pol = pt::dynamic::BucketPolicy{};
  EXPECT_EQ(bc::bucket_key(pol, std::vector<pt::backend::BackendInput::SymbolRange>(1), std::vector<int64_t>{40}).at(0), (pt::dynamic::Bucket{33, 64}));
  EXPECT_EQ(bc::bucket_key(pol, {pt::backend::BackendInput::SymbolRange{1, 50, "mark"}}, std::vector<int64_t>{40}).at(0), (pt::dynamic::Bucket{33, 50}));
}

TEST(CudaGraphs, OneRecordingPerBucketExactSizesPatchedOutputsNeverOverwritten) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("graphs,perf_hints");
  auto art = bc::make_cuda_artifact(two_kernels(), graph_input());
  std::vector<pt::Tensor> inputs, held;
  uint64_t arena_tmp = 0;
  for (int64_t n : {33, 40, 64, 37}) {  // one bucket: [33, 64]
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    ASSERT_EQ(fake.launches().size(), 2u);
    for (const auto& l : fake.launches()) {
      EXPECT_TRUE(l.from_graph) << l.kernel;
      EXPECT_EQ(l.param<int64_t>(2), n) << "exact size, not the bucket's 64";
      EXPECT_EQ(l.grid[0], static_cast<unsigned>((n + (n % 4 ? 127 : 511)) / (n % 4 ? 128 : 512)));
      EXPECT_EQ(l.kernel.substr(2), n % 4 == 0 ? "_aligned" : "_general");
    }
    const uint64_t tmp = fake.launches()[0].param<uint64_t>(1);
    if (!arena_tmp) arena_tmp = tmp;
    EXPECT_EQ(tmp, arena_tmp) << "the temporary keeps its arena address inside the bucket";
    EXPECT_EQ(fake.launches()[1].param<uint64_t>(1), reinterpret_cast<uint64_t>(outs[0].data_ptr()));
    EXPECT_NE(reinterpret_cast<uint64_t>(outs[0].data_ptr()), arena_tmp);
    expect_result(x, outs[0]);
    inputs.push_back(x);
    held.push_back(outs[0]);
  }
  EXPECT_EQ(fake.stats().instantiations, 1);
  EXPECT_EQ(fake.stats().graph_launches, 4);
  auto gs = pt::backend::graph_stats();
  EXPECT_EQ(gs.recordings, 1);
  EXPECT_EQ(gs.buckets, 1);
  EXPECT_EQ(gs.replays, 4);
  EXPECT_EQ(gs.patches, 6) << "both nodes at each of the 3 calls after the recording (size and addresses changed)";
  EXPECT_EQ(gs.buckets_per_frame.at("7"), 1);

  // A new bucket records once; a new size inside a known bucket records nothing.
  for (int64_t n : {100, 65, 50, 128}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    expect_result(x, outs[0]);
    inputs.push_back(x);
    held.push_back(outs[0]);
  }
  gs = pt::backend::graph_stats();
  EXPECT_EQ(gs.recordings, 2) << "[65, 128] once; 50 is in [33, 64]";
  EXPECT_EQ(fake.stats().instantiations, 2);
  EXPECT_EQ(gs.buckets, 2);
  // Outputs held across every later call keep their values.
  for (size_t i = 0; i < held.size(); ++i) expect_result(inputs[i], held[i]);

  // Same size, same input, output not held: the caching allocator returns the same block and no node
  // changes, so nothing is patched.
  pt::Tensor x = pt::randn({50}).to(pt::kCUDA);
  { auto o = art->run({&x, 1}, std::vector<int64_t>{50}); }
  const int64_t before = pt::backend::graph_stats().patches;
  { auto o = art->run({&x, 1}, std::vector<int64_t>{50}); expect_result(x, o[0]); }
  EXPECT_EQ(pt::backend::graph_stats().patches, before);
  EXPECT_NE(logs.str().find("new bucket s0 in [33, 64] of 'two'"), std::string::npos) << logs.str();
  EXPECT_NE(logs.str().find("s0 in [0, inf] (unknown), buckets pow2=64"), std::string::npos) << logs.str();
}

TEST(CudaGraphs, EmptyGridRunsPlainAndSaysWhy) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  auto art = bc::make_cuda_artifact(two_kernels(), graph_input());
  pt::Tensor x = pt::empty({0}, pt::DType::F32, pt::kCUDA);
  auto outs = art->run({&x, 1}, std::vector<int64_t>{0});
  EXPECT_EQ(outs[0].int_numel(), 0);
  EXPECT_EQ(fake.stats().launches, 0);
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 1);
  EXPECT_EQ(pt::backend::graph_stats().recordings, 0);
  EXPECT_NE(logs.str().find("k0 has no work at these sizes"), std::string::npos) << logs.str();
}

TEST(CudaGraphs, HostStepSplitsTheGraphAndRunsBetweenSegments) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  auto art = bc::make_cuda_artifact(two_kernels(true), graph_input());
  for (int64_t n : {20, 24}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    const std::vector<float> xv = values(x), ov = values(outs[0]);
    for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(ov[i], -(xv[i] * 2.0f + 1.0f));
  }
  EXPECT_EQ(pt::backend::graph_stats().recordings, 1);
  EXPECT_NE(logs.str().find("split into 1 segment(s) around 0 cuBLASLt and 1 host step(s)"), std::string::npos)
      << logs.str();
}

TEST(CudaGraphs, ExactPolicyRecordsEverySize) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  auto art = bc::make_cuda_artifact(two_kernels(), graph_input("exact"));
  for (int64_t n : {33, 40, 33}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    expect_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
  }
  EXPECT_EQ(pt::backend::graph_stats().recordings, 2);
}

TEST(CudaGraphs, DefaultModeRecordsNothing) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::backend::BackendInput in = graph_input();
  in.mode = "default";
  auto art = bc::make_cuda_artifact(two_kernels(), in);
  pt::Tensor x = pt::randn({40}).to(pt::kCUDA);
  expect_result(x, art->run({&x, 1}, std::vector<int64_t>{40})[0]);
  EXPECT_EQ(fake.stats().graphs_created, 0);
  EXPECT_FALSE(fake.launches().back().from_graph);
}
