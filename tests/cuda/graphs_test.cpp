// mode "reduce-overhead" of the cuda backend (backend/cuda/graphs.h) against the fake driver: the
// patch plan, the arena layout, one recording per (artifact, bucket), exact sizes patched into the
// nodes, outputs that later replays never overwrite, plain launches (and why) when a graph cannot be
// used, and the split around steps that are not recorded. No GPU needed; these run in CI.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "backend/async_compile.h"
#include "backend/cuda/autotune.h"
#include "backend/cuda/graphs.h"
#include "backend/cuda/program.h"
#include "fake_program.h"
#include "backend/cuda/runner.h"
#include "backend/graph_stats.h"
#include "cache/blob_cache.h"
#include "device/fake_driver.h"
#include "dynamic/buckets.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/protean.h"
#include "protean/tensor.h"
#include "sym/expr.h"
#include "sym/printer.h"

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

/// The fake k1 (its entries and its row-kernel variants): out[i] = in[i] + 1 over its third
/// parameter's count.
void add_one(const drv::FakeLaunch& l) {
  auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
  auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
  for (int64_t i = 0; i < l.param<int64_t>(2); ++i) out[i] = in[i] + 1.0f;
}

void define_two(drv::FakeDriver& fake) {
  auto scale = [](const drv::FakeLaunch& l) {
    auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
    auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
    for (int64_t i = 0; i < l.param<int64_t>(2); ++i) out[i] = in[i] * 2.0f;
  };
  for (const char* v : {"_aligned", "_general"}) {
    fake.define_kernel(std::string("k0") + v, {8, 8, 8}, scale);
    fake.define_kernel(std::string("k1") + v, {8, 8, 8}, add_one);
  }
}

// Graphs recorded on the calling thread (PROTEAN_CUDA_GRAPH_RECORD=inline): the fake driver is not
// thread-safe, and these tests check every call of a bucket, the first one included. The
// background recording has its own test (BackgroundRecording...).
pt::backend::BackendInput graph_input(const std::string& policy = "", const char* record = "inline") {
  setenv("PROTEAN_CUDA_GRAPH_RECORD", record, 1);
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
            "k0 (step 0); sizes p2; io p0; constants -; arena p1; grid varies\n"
            "k1 (step 1); sizes p2; io p1; constants -; arena p0; grid varies\n");
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
  EXPECT_EQ(fake.stats().graph_uploads, 1) << "uploaded when recorded, not at its first launch";
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
  EXPECT_EQ(fake.stats().graph_uploads, 2);
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

TEST(CudaGraphs, SizeTableEvaluatesEachDistinctExpressionOnceAndAgreesWithTheSymbolicForms) {
  auto p = two_kernels();
  const bc::SizeTable t = bc::size_table(*p);
  // s0 (both kernels' work, both variants, the divisible sizes) and 4*s0 (every buffer's bytes).
  EXPECT_EQ(t.exprs.size(), 2u);
  ASSERT_EQ(t.kernels.size(), 2u);
  EXPECT_EQ(t.kernels[0].work[0], t.kernels[1].work[1]);
  std::vector<int64_t> v;
  for (int64_t n : {1, 33, 40, 4096, 1000001}) {
    const std::vector<int64_t> S{n};
    bc::evaluate_sizes(t, p->symbols, S, v);
    for (size_t k = 0; k < p->kernels.size(); ++k) {
      for (bool aligned : {false, true}) {
        const bc::LaunchDims a = bc::launch_dims_of(*p, t, v, k, aligned);
        const bc::LaunchDims b = bc::launch_dims(aligned ? p->kernels[k].aligned.launch : p->kernels[k].general.launch,
                                                 p->symbols, S);
        EXPECT_EQ(a.grid, b.grid) << n;
        EXPECT_EQ(a.block, b.block) << n;
      }
      EXPECT_EQ(bc::sizes_allow_aligned(*p, t, v, k), n % 4 == 0) << n;
    }
    for (const bc::PlannedBuffer& b : p->buffers.buffers)
      EXPECT_EQ(v[static_cast<size_t>(t.buffer_bytes[static_cast<size_t>(b.id)])], 4 * n);
  }
}

// A variant rule's size bound (the attention kernel's Hopper form from a query length on) takes part in
// the graph runner's choice of entry, as in a plain launch's.
TEST(CudaGraphs, SizeTableKeepsTheAlignedVariantsSizeBound) {
  auto p = two_kernels();
  p->kernels[0].rule.size = p->symbols[0];
  p->kernels[0].rule.at_least = 40;
  const bc::SizeTable t = bc::size_table(*p);
  std::vector<int64_t> v;
  for (int64_t n : {4, 36, 40, 44, 4096}) {
    const std::vector<int64_t> S{n};
    bc::evaluate_sizes(t, p->symbols, S, v);
    EXPECT_EQ(bc::sizes_allow_aligned(*p, t, v, 0), n % 4 == 0 && n >= 40) << n;
    EXPECT_EQ(bc::sizes_allow_aligned(*p, t, v, 1), n % 4 == 0) << n;
    auto address = [](int) -> uint64_t { return 0x10000; };
    EXPECT_EQ(bc::use_aligned_variant(p->kernels[0], p->symbols, S, address), n % 4 == 0 && n >= 40) << n;
  }
}

// The compiled size program (SizeProgram) agrees with eval_size on every kind of node, shares
// subexpressions, and fails as eval_size does (unbound symbol, division by zero, overflow).
TEST(CudaGraphs, CompiledSizeProgramAgreesWithEvalSize) {
  namespace sy = pt::sym;
  const sy::Expr s0 = sy::symbol("s0"), s1 = sy::symbol("s1");
  const std::vector<sy::Expr> symbols{s0, s1};
  const sy::Expr shared = sy::mul(s0, sy::integer(768));
  const std::vector<sy::Expr> exprs{
      sy::integer(7), s0, shared, sy::add(shared, sy::integer(64)), sy::floordiv(shared, s1), sy::ceildiv(s0, sy::integer(3)),
      sy::mod(sy::add(s0, s1), sy::integer(5)), sy::maximum(s0, s1), sy::minimum(std::vector<sy::Expr>{s0, s1, sy::integer(9)}),
      sy::pow(s1, sy::integer(3)), sy::mul(std::vector<sy::Expr>{s0, s1, sy::integer(2)}), sy::add(std::vector<sy::Expr>{s0, s1, shared, sy::integer(-1)}),
      sy::lt(s0, s1), sy::ge(s0, s1), sy::eq(s0, s1), sy::ne(s0, s1), sy::and_(sy::lt(s0, s1), sy::gt(s1, sy::integer(2))),
      sy::or_(sy::le(s0, sy::integer(1)), sy::eq(s1, sy::integer(4))), sy::not_(sy::lt(s0, s1)), sy::true_(), sy::false_()};
  bc::SizeTable t;
  t.exprs = exprs;
  t.program = bc::compile_sizes(exprs, symbols);
  EXPECT_GE(t.program.registers, exprs.size());
  size_t muls = 0;
  for (const auto& i : t.program.code) muls += i.op == bc::SizeProgram::Op::Mul && i.dst == 2;
  EXPECT_EQ(muls, 1u) << "768*s0 is computed once though three expressions use it";
  std::vector<int64_t> v;
  for (const std::vector<int64_t>& S : std::vector<std::vector<int64_t>>{{1, 4}, {45, 3}, {480, 480}, {7, 1}, {-5, 2}, {0, 9}}) {
    bc::evaluate_sizes(t, symbols, S, v);
    for (size_t i = 0; i < exprs.size(); ++i)
      EXPECT_EQ(v[i], bc::eval_size(exprs[i], symbols, S)) << pt::sym::print(exprs[i]) << " at " << S[0] << ", " << S[1];
  }
  EXPECT_THROW(bc::evaluate_sizes(t, symbols, std::vector<int64_t>{4, 0}, v), std::domain_error) << "floordiv by s1 = 0";
  EXPECT_THROW(bc::evaluate_sizes(t, symbols, std::vector<int64_t>{int64_t{1} << 62, 3}, v), pt::sym::OverflowError);
  try {
    bc::evaluate_sizes(t, symbols, std::vector<int64_t>{4}, v);
    ADD_FAILURE() << "s1 has no value";
  } catch (const pt::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("uses symbol s1, which has no bound value (1 symbols bound)"), std::string::npos) << e.what();
  }
  bc::SizeTable u;
  u.exprs = {sy::add(sy::symbol("u9"), sy::integer(1))};
  u.program = bc::compile_sizes(u.exprs, symbols);
  EXPECT_THROW(bc::evaluate_sizes(u, symbols, std::vector<int64_t>{1, 2}, v), pt::ShapeError) << "u9 is not a program symbol";
}

TEST(CudaGraphs, PipelineSettingParsesAndRejectsBadText) {
  const bc::PipelineSetting d = bc::parse_pipeline_setting("");
  EXPECT_TRUE(d.on);
  EXPECT_EQ(d.first, bc::kPipelineFirstChunk);
  EXPECT_EQ(d.growth, bc::kPipelineGrowth);
  EXPECT_TRUE(bc::parse_pipeline_setting("1").on);
  EXPECT_FALSE(bc::parse_pipeline_setting("0").on);
  const bc::PipelineSetting old = bc::parse_pipeline_setting("8,1.75");
  EXPECT_TRUE(old.on);
  EXPECT_EQ(old.first, 8u);
  EXPECT_EQ(old.growth, 1.75);
  for (const char* bad : {"2", "yes", "0,1.5", "4,0.5", "4,", ",1.5", "4,1.5x", "4x,1.5", "4,17"}) {
    try {
      bc::parse_pipeline_setting(bad);
      ADD_FAILURE() << bad;
    } catch (const pt::ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("PROTEAN_CUDA_GRAPH_PIPELINE"), std::string::npos) << e.what();
    }
  }
}

TEST(CudaGraphs, PipelineChunksGrowSoTheDeviceStartsWhileTheHostPatches) {
  auto sizes = [](const std::vector<bc::GraphSegment>& v) {
    std::vector<size_t> r;
    for (const auto& s : v) r.push_back(s.end - s.first);
    return r;
  };
  // The default: a short first chunk (the device waits for its patches), then growth 1.5 (the host
  // patches a step in ~2.5 us, the device runs one in ~3.9 us).
  EXPECT_EQ(sizes(bc::pipeline_chunks({{0, 119}}, bc::kPipelineFirstChunk, bc::kPipelineGrowth)),
            (std::vector<size_t>{3, 4, 5, 8, 11, 16, 22, 31, 19}));
  const auto gpt2 = bc::pipeline_chunks({{0, 119}}, 8, 1.75);
  EXPECT_EQ(sizes(gpt2), (std::vector<size_t>{8, 14, 24, 42, 31}));
  EXPECT_EQ(gpt2.front().first, 0u);
  EXPECT_EQ(gpt2.back().end, 119u);
  for (size_t i = 1; i < gpt2.size(); ++i) EXPECT_EQ(gpt2[i].first, gpt2[i - 1].end) << "chunks tile the segment";
  // Each segment (host steps between them) is chunked on its own; short ones stay whole.
  const auto two = bc::pipeline_chunks({{0, 5}, {6, 30}}, 8, 1.75);
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0].first, 0u);
  EXPECT_EQ(two[0].end, 5u);
  EXPECT_EQ(two[1].first, 6u);
  EXPECT_EQ(sizes(two), (std::vector<size_t>{5, 8, 14, 2}));
}

TEST(CudaGraphs, NewSizeInAKnownBucketIsCountedAndItsOutputReusesTheBucketsAllocation) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("graphs");
  auto art = bc::make_cuda_artifact(two_kernels(), graph_input());
  // 1100 and 1250 floats fall in two size classes of the allocator (4608 and 5120 bytes); the inputs
  // are allocated first, so the blocks the calls ask for are the outputs'.
  pt::Tensor x1100 = pt::randn({1100}).to(pt::kCUDA), x1250 = pt::randn({1250}).to(pt::kCUDA);
  {
    pt::Tensor x = pt::randn({1030}).to(pt::kCUDA);
    auto outs = art->run({&x, 1}, std::vector<int64_t>{1030});  // records bucket [1025, 1280]
    expect_result(x, outs[0]);
  }
  EXPECT_EQ(pt::backend::graph_stats().size_changes, 0) << "the recording call is not a size change";
  for (const pt::Tensor& x : {x1100, x1250, x1100}) {  // outputs dropped at once: their blocks are reused
    const pt::cuda::AllocatorStats a0 = pt::cuda::allocator_stats(0);
    auto outs = art->run({&x, 1}, std::vector<int64_t>{x.size(0).hint()});
    EXPECT_EQ(pt::cuda::allocator_stats(0).driver_allocs, a0.driver_allocs)
        << "a new length inside the bucket reaches no driver allocation (" << x.size(0).hint() << ")";
    EXPECT_EQ(outs[0].size(0).hint(), x.size(0).hint()) << "exact sizes, whatever the block holds";
    EXPECT_GE(outs[0].impl()->storage->nbytes(), 1280u * 4) << "the output's block is sized at the bucket's bound";
    expect_result(x, outs[0]);
  }
  const auto gs = pt::backend::graph_stats();
  EXPECT_EQ(gs.size_changes, 3);
  EXPECT_GT(gs.size_change_ns, 0);
  EXPECT_NE(logs.str().find("new sizes s0=1100 in bucket 1 of 'two':"), std::string::npos) << logs.str();
  EXPECT_NE(logs.str().find("2 node(s) patched"), std::string::npos) << logs.str();
}

// Kernels that read their sizes from memory (ParamKind::Sizes): in -> tmp (x2), tmp -> tmp2 (copy),
// tmp2 -> out (+1), each with the size pointer as its third parameter.
std::shared_ptr<bc::CudaProgram> three_from_memory() {
  auto p = std::make_shared<bc::CudaProgram>();
  p->name = "three";
  p->cubin = {'f', 'a', 'k', 'e', 0};
  pt::sym::Expr s0 = pt::sym::symbol("s0");
  p->symbols = {s0};
  bc::testing::plan_input_temp_output(*p, s0);
  bc::PlannedBuffer tmp2 = bc::testing::f32_buffer(3, pt::loop::BufferKind::Temp, s0);
  tmp2.slot = 1;
  p->buffers.buffers.push_back(tmp2);
  p->buffers.slots.push_back(bc::Slot{pt::sym::mul(s0, pt::sym::integer(4)), 256, {3}});
  p->kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, s0), bc::testing::grid_stride_kernel("km", 1, 3, s0),
                bc::testing::grid_stride_kernel("k1", 3, 2, s0)};
  for (bc::CudaKernel& k : p->kernels) k.params[2] = {bc::ParamKind::Sizes, -1, 16, 8};
  p->steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Kernel, 1, {1}}, bc::Step{bc::StepKind::Kernel, 2, {3}}};
  return p;
}

TEST(CudaGraphs, SizesInMemoryANewSizeInABucketChangesNoKernelNode) {
  drv::FakeDriver fake;
  std::vector<int64_t> seen;  // the size each launch read from memory
  auto count = [&](const drv::FakeLaunch& l) {
    const int64_t n = *reinterpret_cast<const int64_t*>(l.param<uint64_t>(2));
    seen.push_back(n);
    return n;
  };
  for (const char* v : {"_aligned", "_general"}) {
    fake.define_kernel(std::string("k0") + v, {8, 8, 8}, [&](const drv::FakeLaunch& l) {
      auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
      for (int64_t i = 0, n = count(l); i < n; ++i) out[i] = in[i] * 2.0f;
    });
    fake.define_kernel(std::string("km") + v, {8, 8, 8}, [&](const drv::FakeLaunch& l) {
      auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
      for (int64_t i = 0, n = count(l); i < n; ++i) out[i] = in[i];
    });
    fake.define_kernel(std::string("k1") + v, {8, 8, 8}, [&](const drv::FakeLaunch& l) {
      auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
      for (int64_t i = 0, n = count(l); i < n; ++i) out[i] = in[i] + 1.0f;
    });
  }
  pt::backend::reset_graph_stats();
  unsetenv("PROTEAN_CUDA_GRAPH_PIPELINE");
  setenv("PROTEAN_CUDA_GRAPH_STAGE_INPUTS", "1", 1);  // the input read from its copy in the bucket
  struct Unset {
    ~Unset() { unsetenv("PROTEAN_CUDA_GRAPH_STAGE_INPUTS"); }
  } unset;
  pt::observe::LogCapture logs("graphs");
  auto art = bc::make_cuda_artifact(three_from_memory(), graph_input());
  EXPECT_NE(logs.str().find("km (step 1); sizes -; io -; constants -; arena p0 p1 p2; grid at the bucket's bound"), std::string::npos)
      << logs.str();
  EXPECT_NE(logs.str().find("in 1 segment(s)"), std::string::npos) << "no chunks: nothing to patch at a new size\n" << logs.str();
  // sizes that are not multiples of 4: every launch takes the general variant, so no function changes
  std::vector<pt::Tensor> xs;
  for (int64_t n : {1030, 1101, 1250, 1027}) xs.push_back(pt::randn({n}).to(pt::kCUDA));
  uint64_t sizes_at = 0, input_at = 0;
  int64_t updates = 0, htod = 0, dtod = 0;
  for (size_t c = 0; c < xs.size(); ++c) {  // bucket [1025, 1280]: recorded at 1030
    const int64_t n = xs[c].size(0).hint();
    fake.clear_launches();
    seen.clear();
    const int64_t u0 = fake.stats().node_updates, h0 = fake.stats().htod, d0 = fake.stats().dtod;
    auto outs = art->run({&xs[c], 1}, std::vector<int64_t>{n});
    expect_result(xs[c], outs[0]);
    EXPECT_EQ(seen, (std::vector<int64_t>{n, n, n})) << "each kernel read the call's size from memory";
    ASSERT_EQ(fake.launches().size(), 3u);
    for (const auto& l : fake.launches()) {
      EXPECT_TRUE(l.from_graph) << l.kernel;
      EXPECT_EQ(l.grid[0], 10u) << l.kernel << ": the bucket's 1280 elements in blocks of 128, at every size";
      if (!sizes_at) sizes_at = l.param<uint64_t>(2);
      EXPECT_EQ(l.param<uint64_t>(2), sizes_at) << "one place for the sizes";
    }
    // k0 reads the input's copy in the bucket (graphs.h: kStagedInputBytes), never the tensor itself
    if (!input_at) input_at = fake.launches()[0].param<uint64_t>(0);
    EXPECT_EQ(fake.launches()[0].param<uint64_t>(0), input_at);
    EXPECT_NE(input_at, reinterpret_cast<uint64_t>(xs[c].data_ptr()));
    if (c > 0) {
      updates += fake.stats().node_updates - u0;
      htod += fake.stats().htod - h0;
      dtod += fake.stats().dtod - d0;
    }
  }
  // k0 reads its input's copy, k1 writes into the block the previous call's output left (the bucket's
  // size class), km reads and writes the arena: no node changes at a new size
  EXPECT_EQ(updates, 0);
  EXPECT_EQ(dtod, 3) << "one copy of the input per call";
  EXPECT_EQ(htod, 3) << "one copy of the size values per new size";
  EXPECT_EQ(pt::backend::graph_stats().recordings, 1);
  // the copies are counted (4: the recording call's and the three new sizes') with their host time
  const pt::backend::GraphStats copies = pt::backend::graph_stats();
  EXPECT_EQ(copies.size_copies, 4);
  EXPECT_GT(copies.size_copy_ns, 0);
  // the same size again: the values in memory are current, nothing is copied
  const int64_t h0 = fake.stats().htod;
  { auto o = art->run({&xs.back(), 1}, std::vector<int64_t>{1027}); expect_result(xs.back(), o[0]); }
  EXPECT_EQ(fake.stats().htod, h0);
  EXPECT_EQ(pt::backend::graph_stats().size_copies, copies.size_copies) << "a steady call copies nothing";
  // a multiple of 4 in the same bucket flips km (arena and sizes only, launched at the bound) to its
  // aligned entry, and the next size back: a node skipped at a new size is one whose variant stays
  for (int64_t n : {int64_t{1100}, int64_t{1104}, int64_t{1027}}) {
    pt::Tensor xn = pt::randn({n}).to(pt::kCUDA);
    fake.clear_launches();
    auto o = art->run({&xn, 1}, std::vector<int64_t>{n});
    expect_result(xn, o[0]);
    ASSERT_EQ(fake.launches().size(), 3u);
    EXPECT_EQ(fake.launches()[1].kernel, n % 4 == 0 ? "km_aligned" : "km_general") << n;
  }
  // a call in another bucket (recorded at once: inline recording) reads its own size
  pt::Tensor x = pt::randn({100}).to(pt::kCUDA);
  seen.clear();
  { auto o = art->run({&x, 1}, std::vector<int64_t>{100}); expect_result(x, o[0]); }
  EXPECT_EQ(seen, (std::vector<int64_t>{100, 100, 100}));
  // plain launches (no graphs) write the sizes too, and launch exact grids
  pt::backend::BackendInput plain = graph_input();
  plain.mode = "default";
  auto art2 = bc::make_cuda_artifact(three_from_memory(), plain);
  for (const pt::Tensor& xi : {xs[1], xs[2]}) {
    seen.clear();
    fake.clear_launches();
    auto o = art2->run({&xi, 1}, std::vector<int64_t>{xi.size(0).hint()});
    expect_result(xi, o[0]);
    EXPECT_EQ(seen, std::vector<int64_t>(3, xi.size(0).hint()));
    for (const auto& l : fake.launches()) {
      EXPECT_FALSE(l.from_graph);
      EXPECT_EQ(l.grid[0], static_cast<unsigned>((xi.size(0).hint() + 127) / 128));
    }
  }
}

// A constant the program returns as an output (buffer 3, outputs {2, 3}): the call hands it back as
// a tensor with the constant's values in every mode (the other constants are set by address only),
// and with a host step reading buffers as tensors too.
TEST(CudaGraphs, AConstantReturnedAsAnOutputComesBackWithItsValues) {
  for (bool host : {false, true})
    for (const char* mode : {"reduce-overhead", "default"}) {
      SCOPED_TRACE(fmt::format("{}{}", mode, host ? ", a host step" : ""));
      drv::FakeDriver fake;
      define_two(fake);
      auto p = two_kernels(host);
      bc::PlannedBuffer c = bc::testing::f32_buffer(static_cast<int>(p->buffers.buffers.size()), pt::loop::BufferKind::Constant,
                                                    pt::sym::integer(3));
      c.constant = pt::tensor<float>({1.5f, -2.0f, 7.25f}, {3});
      p->buffers.buffers.push_back(c);
      p->buffers.outputs.push_back(c.id);
      pt::backend::BackendInput in = graph_input();
      in.mode = mode;
      auto art = bc::make_cuda_artifact(p, in);
      for (int64_t n : {40, 40, 37}) {
        pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
        auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
        ASSERT_EQ(outs.size(), 2u);
        if (!host) expect_result(x, outs[0]);
        EXPECT_EQ(values(outs[1].cpu()), (std::vector<float>{1.5f, -2.0f, 7.25f}));
      }
    }
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

// A temporary whose bytes shrink as s0 grows needs more than its region at the bucket's upper bound:
// that call runs plain launches and says why; a size where it fits replays the graph.
TEST(CudaGraphs, TemporaryLargerThanItsArenaRegionRunsPlainAndSaysWhy) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  auto p = two_kernels();
  const pt::sym::Expr s0 = p->symbols[0];
  // 4·max(s0, 96 - s0) bytes: 4·64 at the bound 64 of [33, 64], 4·56 at 40, 4·63 at 33
  const pt::sym::Expr bytes = pt::sym::mul(pt::sym::integer(4), pt::sym::maximum(s0, pt::sym::sub(pt::sym::integer(96), s0)));
  p->buffers.buffers[1].bytes = bytes;
  p->buffers.slots[0].bytes = bytes;
  auto art = bc::make_cuda_artifact(p, graph_input());
  for (int64_t n : {40, 33, 40}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    expect_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
  }
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 0) << logs.str();
  EXPECT_EQ(pt::backend::graph_stats().replays, 3);
  // 4·(96 - 33) = 252 fits 256; now 4·max(s0, 100 - s0): 4·67 = 268 at 33 does not
  auto q = two_kernels();
  const pt::sym::Expr grow = pt::sym::mul(pt::sym::integer(4), pt::sym::maximum(s0, pt::sym::sub(pt::sym::integer(100), s0)));
  q->buffers.buffers[1].bytes = grow;
  q->buffers.slots[0].bytes = grow;
  auto art2 = bc::make_cuda_artifact(q, graph_input());
  for (int64_t n : {64, 33, 50}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    expect_result(x, art2->run({&x, 1}, std::vector<int64_t>{n})[0]);
  }
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 1) << "33 only\n" << logs.str();
  EXPECT_EQ(pt::backend::graph_stats().replays, 5);
  EXPECT_NE(logs.str().find("buffer 1 needs more bytes than at the bucket's upper bounds"), std::string::npos) << logs.str();
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

// PROTEAN_CUDA_GRAPH_UPLOAD: a recorded graph is uploaded on the recording's stream (default), on the
// device's stream its calls launch it on ('launch'), or left to its first launch ('off'); the results
// are the same; any other value is refused naming the variable.
TEST(CudaGraphs, UploadSettingPicksTheStreamOrLeavesItToTheFirstLaunch) {
  struct Unset {
    ~Unset() { unsetenv("PROTEAN_CUDA_GRAPH_UPLOAD"); }
  } unset;
  for (const char* setting : {"", "recording", "launch", "off"}) {
    drv::FakeDriver fake;
    define_two(fake);
    setenv("PROTEAN_CUDA_GRAPH_UPLOAD", setting, 1);
    auto art = bc::make_cuda_artifact(two_kernels(), graph_input());
    for (int64_t n : {33, 40, 100}) {  // two buckets: [33, 64] and [65, 128]
      pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
      expect_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
    }
    const std::string s = setting;
    EXPECT_EQ(fake.stats().instantiations, 2) << s;
    EXPECT_EQ(fake.stats().graph_uploads, s == "off" ? 0 : 2) << s;
    if (s == "launch") {
      EXPECT_EQ(fake.stats().last_upload_stream, drv::stream(0));
    }
    if (s == "" || s == "recording") {
      EXPECT_NE(fake.stats().last_upload_stream, nullptr);
      EXPECT_NE(fake.stats().last_upload_stream, drv::stream(0)) << "the recording's own stream";
    }
  }
  drv::FakeDriver fake;
  define_two(fake);
  setenv("PROTEAN_CUDA_GRAPH_UPLOAD", "eager", 1);
  try {
    bc::make_cuda_artifact(two_kernels(), graph_input());
    ADD_FAILURE() << "no error for PROTEAN_CUDA_GRAPH_UPLOAD=eager";
  } catch (const pt::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("PROTEAN_CUDA_GRAPH_UPLOAD=eager"), std::string::npos) << e.what();
  }
}

// Past PROTEAN_CUDA_GRAPH_MAX_BUCKETS buckets, a size outside the recorded ones runs plain launches
// (counted, one perf_hints line), with the right result; sizes inside them still replay.
TEST(CudaGraphs, BucketCapRunsNewBucketsPlain) {
  drv::FakeDriver fake;
  define_two(fake);
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  setenv("PROTEAN_CUDA_GRAPH_MAX_BUCKETS", "2", 1);
  auto art = bc::make_cuda_artifact(two_kernels(), graph_input("exact"));
  for (int64_t n : {33, 40, 41, 42, 33, 40}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    expect_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
  }
  unsetenv("PROTEAN_CUDA_GRAPH_MAX_BUCKETS");
  EXPECT_EQ(pt::backend::graph_stats().recordings, 2);
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 2);
  EXPECT_EQ(pt::backend::graph_stats().replays, 4);
  EXPECT_NE(logs.str().find("2 size buckets recorded (PROTEAN_CUDA_GRAPH_MAX_BUCKETS)"), std::string::npos) << logs.str();
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

// ---- library (cuBLASLt) nodes ----------------------------------------------------------------------
// x [s0, 4] (input) → k0: t = 2x → blas0 (Linear, padded): u[s0, 3] = t · Wᵀ → blas1 (Bmm over s0
// batches, exact): v[s0, 1, 1] = u[i, 1, 3] · w2[3, 1] → k1: y = v + 1 (output). With `plain_out`,
// blas1 writes the output y = v directly (then it runs as a plain call after the graph).
// The test's hook stands in for cuBLASLt: it launches the fake kernel "gemm" with the call's shape on
// the stream it is given, so a capture records it.
namespace {

std::shared_ptr<bc::CudaProgram> with_library(bool plain_out = false) {
  auto p = std::make_shared<bc::CudaProgram>();
  p->name = "lib";
  p->cubin = {'f', 'a', 'k', 'e', 0};
  pt::sym::Expr s0 = pt::sym::symbol("s0");
  p->symbols = {s0};
  using K = pt::loop::BufferKind;
  auto x = bc::testing::f32_buffer(0, K::Input, pt::sym::mul(s0, pt::sym::integer(4)));
  x.input_index = 0;
  auto t = bc::testing::f32_buffer(1, K::Temp, pt::sym::mul(s0, pt::sym::integer(4)));
  auto w = bc::testing::f32_buffer(2, K::Constant, pt::sym::integer(12));
  w.constant = pt::arange(12, pt::DType::F32).reshape({3, 4});
  auto u = bc::testing::f32_buffer(3, K::Temp, pt::sym::mul(s0, pt::sym::integer(3)));
  auto w2 = bc::testing::f32_buffer(4, K::Constant, pt::sym::integer(3));
  w2.constant = pt::tensor(std::vector<float>{1.0f, -2.0f, 0.5f}, pt::IntVec{3});
  auto v = bc::testing::f32_buffer(5, plain_out ? K::Output : K::Temp, s0);
  auto y = bc::testing::f32_buffer(6, K::Output, s0);
  p->buffers.buffers = {x, t, w, u, w2, v, y};
  p->buffers.outputs = {plain_out ? 5 : 6};
  p->buffers.buffers[static_cast<size_t>(p->buffers.outputs[0])].output_index = 0;
  bc::BlasStep lin;
  lin.op = bc::BlasOp::Linear;
  lin.kind = pt::ops::OpKind::linear;
  lin.a = 1, lin.b = 2, lin.out = 3;
  lin.transpose_b = true;
  lin.batch = pt::sym::integer(1), lin.m = s0, lin.n = pt::sym::integer(3), lin.k = pt::sym::integer(4);
  lin.batch_stride_a = lin.batch_stride_b = pt::sym::integer(0);
  bc::BlasStep bmm;
  bmm.op = bc::BlasOp::Bmm;
  bmm.kind = pt::ops::OpKind::bmm;
  bmm.a = 3, bmm.b = 4, bmm.out = 5;
  bmm.batch = s0, bmm.m = pt::sym::integer(1), bmm.n = pt::sym::integer(1), bmm.k = pt::sym::integer(3);
  bmm.batch_stride_a = pt::sym::integer(3), bmm.batch_stride_b = pt::sym::integer(0);
  p->blas = {lin, bmm};
  p->kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, s0)};
  p->steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Blas, 0, {1}},
              bc::Step{bc::StepKind::Blas, 1, {3}}};
  if (!plain_out) {
    p->kernels.push_back(bc::testing::grid_stride_kernel("k1", 5, 6, s0));
    p->steps.push_back(bc::Step{bc::StepKind::Kernel, 1, {5}});
  }
  // k0 runs over the 4·s0 elements of x: its size argument is s0, its body reads 4·s0.
  return p;
}

struct LibraryFake {
  drv::FakeDriver fake;
  drv::CUfunction gemm = nullptr;
  std::vector<int> algorithms;  ///< the algorithm of each hooked call (blas_hook_algorithm)
  explicit LibraryFake(int candidates = 1) {
    auto scale4 = [](const drv::FakeLaunch& l) {  // t = 2x over 4·s0 elements
      auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
      for (int64_t i = 0; i < 4 * l.param<int64_t>(2); ++i) out[i] = in[i] * 2.0f;
    };
    for (const char* v : {"_aligned", "_general"}) {
      fake.define_kernel(std::string("k0") + v, {8, 8, 8}, scale4);
      fake.define_kernel(std::string("k1") + v, {8, 8, 8}, add_one);
    }
    // gemm(a, b, out, batch, m, n, k, stride_a, stride_b, transpose_b), row-major as BlasStep.
    fake.define_kernel("gemm", std::vector<size_t>(10, 8), [](const drv::FakeLaunch& l) {
      auto* a = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* b = reinterpret_cast<const float*>(l.param<uint64_t>(1));
      auto* o = reinterpret_cast<float*>(l.param<uint64_t>(2));
      const int64_t B = l.param<int64_t>(3), M = l.param<int64_t>(4), N = l.param<int64_t>(5), K = l.param<int64_t>(6);
      const int64_t sa = l.param<int64_t>(7), sb = l.param<int64_t>(8);
      const bool tb = l.param<int64_t>(9) != 0;
      for (int64_t q = 0; q < B; ++q)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            float acc = 0;
            for (int64_t k = 0; k < K; ++k) acc += a[q * sa + i * K + k] * (tb ? b[q * sb + j * K + k] : b[q * sb + k * N + j]);
            o[q * M * N + i * N + j] = acc;
          }
    });
    drv::check(fake.api().cuModuleGetFunction(&gemm, nullptr, "gemm"), "gemm");
    bc::set_blas_hook_for_testing([this](const bc::BlasStep& st, const bc::BlasShape& s,
                                         const std::function<uint64_t(int)>& address, drv::CUstream stream) {
      uint64_t v[10] = {address(st.a), address(st.b), address(st.out), static_cast<uint64_t>(s.batch),
                        static_cast<uint64_t>(s.m), static_cast<uint64_t>(s.n), static_cast<uint64_t>(s.k),
                        static_cast<uint64_t>(s.batch > 1 ? s.stride_a : 0), static_cast<uint64_t>(s.batch > 1 ? s.stride_b : 0),
                        st.transpose_b ? 1u : 0u};
      void* params[10];
      for (int i = 0; i < 10; ++i) params[i] = &v[i];
      drv::check(fake.api().cuLaunchKernel(gemm, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), "gemm");
      algorithms.push_back(bc::blas_hook_algorithm());
    }, candidates);
  }
  ~LibraryFake() { bc::set_blas_hook_for_testing({}); }
};

// y[i] = Σ_j (Σ_k 2·x[i,k]·W[j,k]) · w2[j] (+ 1 unless plain_out), in the order the fake gemm sums.
void expect_library_result(const pt::Tensor& x, const pt::Tensor& y, bool plain_out = false) {
  const std::vector<float> xv = values(x), yv = values(y);
  const float w2[3] = {1.0f, -2.0f, 0.5f};
  const int64_t n = static_cast<int64_t>(xv.size()) / 4;
  ASSERT_EQ(static_cast<int64_t>(yv.size()), n);
  for (int64_t i = 0; i < n; ++i) {
    float acc = 0;
    for (int j = 0; j < 3; ++j) {
      float u = 0;
      for (int k = 0; k < 4; ++k) u += xv[static_cast<size_t>(i * 4 + k)] * 2.0f * static_cast<float>(j * 4 + k);
      acc += u * w2[j];
    }
    ASSERT_EQ(yv[static_cast<size_t>(i)], plain_out ? acc : acc + 1.0f) << "row " << i;
  }
}

}  // namespace

TEST(CudaGraphs, LibraryCapturePlan) {
  auto p = with_library();
  const auto lib = bc::library_plan(*p);
  EXPECT_EQ(bc::to_text(lib),
            "blas0 (step 1): padded\n"
            "blas1 (step 2): exact (batch follows the symbols: padding it would change the layout kernels read)\n");
  const auto segs = bc::graph_segments(*p, lib);
  ASSERT_EQ(segs.size(), 1u) << "kernels and captured library calls make one graph";
  EXPECT_EQ(segs[0].end, 4u);
  auto q = with_library(true);
  EXPECT_EQ(bc::to_text(bc::library_plan(*q)),
            "blas0 (step 1): padded\n"
            "blas1 (step 2): plain (buffer 5 is a graph output (a new address every call))\n");
  const auto qs = bc::graph_segments(*q);
  ASSERT_EQ(qs.size(), 1u);
  EXPECT_EQ(qs[0].end, 2u) << "the plain call after the graph";
}

// Library calls as child-graph nodes (the default; PROTEAN_CUDA_GRAPH_FLAT_LIBRARY=1 adds a call's one
// kernel as a kernel node: LibraryCallsAreKernelNodes... below).
TEST(CudaGraphs, LibraryNodesPaddedPerBucketExactRecapturedOutputsKept) {
  LibraryFake lf;
  drv::FakeDriver& fake = lf.fake;
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("graphs,perf_hints");
  auto art = bc::make_cuda_artifact(with_library(), graph_input());
  std::vector<pt::Tensor> inputs, held;
  std::vector<int64_t> child_updates;
  for (int64_t n : {5, 7, 7, 6}) {  // one bucket: [5, 8]
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    ASSERT_EQ(fake.launches().size(), 4u);
    for (const auto& l : fake.launches()) EXPECT_TRUE(l.from_graph) << l.kernel;
    const auto& lin = fake.launches()[1];
    ASSERT_EQ(lin.kernel, "gemm");
    EXPECT_EQ(lin.param<int64_t>(4), 8) << "the Linear runs at the bucket's padded row count";
    const auto& bmm = fake.launches()[2];
    EXPECT_EQ(bmm.param<int64_t>(3), n) << "the batched product runs at the exact batch";
    EXPECT_EQ(fake.launches()[3].param<int64_t>(2), n);
    expect_library_result(x, outs[0]);
    child_updates.push_back(fake.stats().child_updates);
    inputs.push_back(x);
    held.push_back(outs[0]);
  }
  EXPECT_EQ(child_updates, (std::vector<int64_t>{0, 0, 0, 0})) << "child graphs are never replaced in place";
  EXPECT_EQ(fake.stats().child_nodes_added, 6) << "recorded at 5, again at 7 and 6 (the exact node's shape changed)";
  // the 4 steps are two chunks (3 + 1, kPipelineFirstChunk): each recording instantiates and each
  // replay launches both
  EXPECT_EQ(fake.stats().instantiations, 6);
  EXPECT_EQ(fake.stats().graph_launches, 8);
  auto gs = pt::backend::graph_stats();
  EXPECT_EQ(gs.recordings, 3);
  EXPECT_EQ(gs.replays, 4);
  // A new bucket: one more recording, the Linear padded to its bound 16.
  for (int64_t n : {9, 16, 6}) {
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    EXPECT_EQ(fake.launches()[1].param<int64_t>(4), n > 8 ? 16 : 8);
    expect_library_result(x, outs[0]);
    inputs.push_back(x);
    held.push_back(outs[0]);
  }
  gs = pt::backend::graph_stats();
  EXPECT_EQ(gs.recordings, 5) << "9 and 16 in the new bucket; 6 is the last size of [5, 8]";
  EXPECT_EQ(fake.stats().child_nodes_added, 10);
  for (size_t i = 0; i < held.size(); ++i) expect_library_result(inputs[i], held[i]);
  EXPECT_NE(logs.str().find("blas0 (step 1): padded"), std::string::npos) << logs.str();
  EXPECT_NE(logs.str().find("1 cuBLASLt call(s) are captured at their exact shape"), std::string::npos) << logs.str();
  EXPECT_NE(logs.str().find("blas1: a new shape inside the bucket: the bucket's graph is recorded again"),
            std::string::npos) << logs.str();
}

// A padded Linear whose output region at the bucket's bound is smaller than its padded rows (the
// output's size not monotone in s0) cannot be a graph node in that bucket: its calls run plain.
TEST(CudaGraphs, PaddedLibraryCallThatDoesNotFitItsRegionsRunsPlain) {
  LibraryFake lf;
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  auto p = with_library();
  const pt::sym::Expr s0 = p->symbols[0];
  p->buffers.buffers[3].bytes = pt::sym::mul(pt::sym::integer(12), pt::sym::minimum(s0, pt::sym::integer(6)));  // u
  auto art = bc::make_cuda_artifact(p, graph_input());
  for (int64_t n : {5, 6}) {  // bucket [5, 8]: padded to 8 rows, 96 bytes; u's region holds 72
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    expect_library_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
  }
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 2);
  EXPECT_EQ(pt::backend::graph_stats().recordings, 0);
  EXPECT_NE(logs.str().find("blas0 at the bucket's padded row count 8 does not fit its operands' arena regions"),
            std::string::npos) << logs.str();
}

TEST(CudaGraphs, LibraryCallWritingAnOutputRunsPlainAfterTheGraph) {
  LibraryFake lf;
  drv::FakeDriver& fake = lf.fake;
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("perf_hints");
  auto art = bc::make_cuda_artifact(with_library(true), graph_input());
  for (int64_t n : {5, 7}) {
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    ASSERT_EQ(fake.launches().size(), 3u);
    EXPECT_TRUE(fake.launches()[1].from_graph);
    EXPECT_FALSE(fake.launches()[2].from_graph) << "the call writing the output is a plain call";
    EXPECT_EQ(fake.launches()[2].param<uint64_t>(2), reinterpret_cast<uint64_t>(outs[0].data_ptr()));
    expect_library_result(x, outs[0], true);
  }
  EXPECT_EQ(pt::backend::graph_stats().recordings, 1);
  EXPECT_NE(logs.str().find("split into 1 segment(s) around 1 cuBLASLt and 0 host step(s)"), std::string::npos)
      << logs.str();
}

// The default: a new bucket's first call runs plain launches and hands the recording to the compile
// worker; once it is ready, calls replay it. An artifact destroyed with a recording queued is safe.
TEST(CudaGraphs, BackgroundRecordingOnTheCompileWorker) {
  LibraryFake lf;
  drv::FakeDriver& fake = lf.fake;
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("graphs,perf_hints");
  auto art = bc::make_cuda_artifact(with_library(), graph_input("", "worker"));
  std::vector<pt::Tensor> inputs, held;
  auto call = [&](int64_t n) {
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    expect_library_result(x, outs[0]);
    inputs.push_back(x);
    held.push_back(outs[0]);
  };
  call(6);  // a new bucket [5, 8]: plain launches, the recording queued after them
  for (const auto& l : fake.launches()) EXPECT_FALSE(l.from_graph) << l.kernel;
  EXPECT_EQ(fake.launches()[1].param<int64_t>(4), 6) << "the plain call runs at its exact size";
  pt::backend::wait_for_async_compiles();
  EXPECT_EQ(pt::backend::graph_stats().recordings, 1);
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 1);
  call(7);  // the recorded graph, patched to this call's sizes and buffers
  ASSERT_EQ(fake.launches().size(), 4u);
  for (const auto& l : fake.launches()) EXPECT_TRUE(l.from_graph) << l.kernel;
  EXPECT_EQ(fake.launches()[1].param<int64_t>(4), 8);
  call(5);
  EXPECT_EQ(pt::backend::graph_stats().replays, 2);
  EXPECT_EQ(pt::backend::graph_stats().recordings, 3) << "the exact node's shape changed at 7 and 5";
  for (size_t i = 0; i < held.size(); ++i) expect_library_result(inputs[i], held[i]);
  // two chunks of the one segment (3 + 1 steps, kPipelineFirstChunk)
  EXPECT_NE(logs.str().find("recorded 2 graph segment(s) of 'lib' for bucket 1 on the compile worker"), std::string::npos)
      << logs.str();
  // A new bucket's recording queued behind a blocked worker, then the artifact destroyed: nothing runs.
  std::mutex gate;
  std::unique_lock<std::mutex> hold(gate);
  pt::backend::run_on_compile_worker([&] { std::lock_guard<std::mutex> wait(gate); }, "test gate");
  call(12);
  art.reset();
  hold.unlock();
  pt::backend::wait_for_async_compiles();
  EXPECT_EQ(pt::backend::graph_stats().recordings, 3) << "the destroyed artifact's recording did nothing";
  unsetenv("PROTEAN_CUDA_GRAPH_RECORD");
}

// ---- mode "max-autotune" ---------------------------------------------------------------------------

TEST(Autotune, PickWinnerKeepsTheDefaultWithinNoise) {
  EXPECT_EQ(bc::pick_winner(std::vector<double>{10, 9.8, 12}), 0) << "2 % faster is noise";
  EXPECT_EQ(bc::pick_winner(std::vector<double>{10, 9.0, 9.5}), 1);
  EXPECT_EQ(bc::pick_winner(std::vector<double>{10, 9.5, 8.0}), 2) << "the fastest, not the first past the threshold";
  EXPECT_EQ(bc::pick_winner(std::vector<double>{-1, 5, 6}), 1) << "a default that failed loses to any that ran";
  EXPECT_EQ(bc::pick_winner(std::vector<double>{10, std::nan(""), 8, -1}), 2);
  EXPECT_EQ(bc::pick_winner(std::vector<double>{-1, -1}), 0);
  EXPECT_EQ(bc::pick_winner(std::vector<double>{}), 0);
}

TEST(Autotune, TuningTableRoundTripMergeAndBadFiles) {
  namespace fs = std::filesystem;
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-tuning-table-{}", ::getpid());
  fs::remove_all(dir);
  const std::string path = dir + "/sub/tuning.json";
  const std::string k1 = bc::TuningTable::key("NVIDIA H200", "blas", 0xabcull, "s0 in [257, 320]");
  EXPECT_EQ(k1, "NVIDIA H200|blas|0000000000000abc|s0 in [257, 320]");
  bc::TuningTable a;
  a.put(k1, bc::TuneEntry{3, 8, 12.5, 10.25});
  a.save(path);
  bc::TuningTable b;
  const std::string k2 = bc::TuningTable::key("NVIDIA H200", "threads", 7, "s0 in [33, 64]");
  b.put(k2, bc::TuneEntry{0, 4, 5, 5});
  b.save(path);  // merges with a's entry
  bc::TuningTable c;
  c.load(path);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(*c.find(k1), (bc::TuneEntry{3, 8, 12.5, 10.25}));
  EXPECT_EQ(*c.find(k2), (bc::TuneEntry{0, 4, 5, 5}));
  EXPECT_FALSE(c.find("other").has_value());
  EXPECT_THROW(bc::TuningTable::parse("{", "t"), pt::FormatError);
  EXPECT_THROW(bc::TuningTable::parse(R"({"version": 2, "entries": {}})", "t"), pt::FormatError);
  EXPECT_THROW(bc::TuningTable::parse(R"({"version": 1, "entries": {"k": {"choice": 4, "candidates": 4, "default_us": 1, "best_us": 1}}})", "t"),
               pt::FormatError);
  EXPECT_THROW(bc::TuningTable::parse(R"({"version": 1, "entries": {"k": {"choice": 1.5, "candidates": 4, "default_us": 1, "best_us": 1}}})", "t"),
               pt::FormatError);
  // A corrupt file: loading ignores it (one warning), saving replaces it.
  { std::ofstream(path) << "not json"; }
  bc::TuningTable d;
  d.load(path);
  EXPECT_EQ(d.size(), 0u);
  d.put(k2, bc::TuneEntry{1, 4, 5, 4});
  d.save(path);
  bc::TuningTable e;
  e.load(path);
  EXPECT_EQ(e.size(), 1u);
  // ... and keeps it aside first: the damaged bytes are in "<path>.corrupt-<timestamp>"
  int backups = 0;
  for (const auto& f : fs::directory_iterator(dir + "/sub"))
    if (f.path().filename().string().rfind("tuning.json.corrupt-", 0) == 0) {
      ++backups;
      std::ifstream in(f.path());
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      EXPECT_EQ(text, "not json");
    }
  EXPECT_EQ(backups, 1);
  // One bad entry among good ones (another device's): the bad one is skipped on load and dropped on
  // save, every good one is used and kept.
  const std::string k3 = bc::TuningTable::key("Other GPU", "blas", 0x1ull, "s0 in [1, 1]");
  {
    std::ofstream(path) << R"({"version": 1, "entries": {")" << k3
                        << R"(": {"choice": 1, "candidates": 4, "default_us": 3, "best_us": 2}, "bad": {"choice": 99, "candidates": 4, "default_us": 1, "best_us": 1}}})";
  }
  std::vector<std::string> skipped;
  EXPECT_EQ(bc::TuningTable::parse(R"({"version": 1, "entries": {"k": {"choice": 1.5, "candidates": 4, "default_us": 1, "best_us": 1}}})", "t",
                                   &skipped).size(), 0u);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("entry 'k'"), std::string::npos) << skipped[0];
  bc::TuningTable f;
  f.load(path);
  EXPECT_EQ(f.size(), 1u);
  EXPECT_EQ(*f.find(k3), (bc::TuneEntry{1, 4, 3, 2}));
  bc::TuningTable g;
  g.put(k1, bc::TuneEntry{3, 8, 12.5, 10.25});
  g.save(path);
  bc::TuningTable h;
  h.load(path);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.find(k3).has_value()) << "another device's entry survives a bad neighbour";
  EXPECT_FALSE(h.find("bad").has_value());
  fs::remove_all(dir);
}

namespace {

// with_library() whose k1 is a row kernel with its block sized at launch: rows of 512 kept in
// registers at 4 per thread (capacity 4096 at 1024 threads), so the rule's choice is 128 threads and
// the candidates are 128, 256, 512, 1024.
std::shared_ptr<bc::CudaProgram> with_library_and_row_kernel() {
  auto p = with_library();
  for (auto* v : {&p->kernels[1].aligned.launch, &p->kernels[1].general.launch}) {
    v->shape = bc::LaunchShape::BlockPerRow;
    v->work = p->symbols[0];
    v->row_length = pt::sym::integer(512);
    v->row_capacity = 4096;
    v->block_threads = 1024;
    v->block_from_row = true;
  }
  return p;
}

struct TuningDir {
  std::string dir;
  TuningDir() {
    dir = std::filesystem::temp_directory_path() / fmt::format("protean-autotune-test-{}", ::getpid());
    std::filesystem::remove_all(dir);
    setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
    unsetenv("PROTEAN_JOB_ID");
    bc::reset_process_tuning_table();
    bc::reset_autotune_stats();
  }
  ~TuningDir() {
    bc::set_autotune_timer_for_testing({});
    bc::reset_process_tuning_table();
    unsetenv("PROTEAN_CACHE_DIR");
    std::filesystem::remove_all(dir);
  }
};

}  // namespace

TEST(CudaGraphs, MaxAutotuneTunesEachBucketAtItsBoundAndAWarmRunStartsTuned) {
  TuningDir td;
  LibraryFake lf(4);  // cuBLASLt's heuristic offers 4 algorithms
  std::map<std::string, int> timed;
  bc::set_autotune_timer_for_testing([&](const std::string& key, int i) {
    ++timed[key];
    if (key.find("|threads|") != std::string::npos) return std::vector<double>{10, 7, 9, 12}.at(static_cast<size_t>(i));
    return std::vector<double>{5, 5, 3, 5}.at(static_cast<size_t>(i));
  });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  pt::observe::LogCapture logs("graphs");
  auto check_calls = [&](pt::backend::Artifact& art, std::initializer_list<int64_t> sizes) {
    for (int64_t n : sizes) {
      pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
      lf.fake.clear_launches();
      auto y = art.run({&x, 1}, std::vector<int64_t>{n});
      expect_library_result(x, y[0]);
      int rows = 0;
      for (const auto& l : lf.fake.launches())
        if (l.kernel.rfind("k1", 0) == 0) {
          ++rows;
          EXPECT_TRUE(l.from_graph);
          EXPECT_EQ(l.block[0], 256u) << "the tuned threads per row, not the rule's 128 (n = " << n << ")";
          EXPECT_EQ(l.grid[0], static_cast<unsigned>(n));
        }
      EXPECT_EQ(rows, 1);
    }
  };
  {
    auto art = bc::make_cuda_artifact(with_library_and_row_kernel(), in);
    check_calls(*art, {40, 50});  // bucket [33, 64]: tuned once, at its bound 64
    auto st = bc::autotune_stats();
    EXPECT_EQ(st.buckets_tuned, 1);
    EXPECT_EQ(st.sites_tuned, 2) << "blas0 (padded) and k1; blas1 is captured at its exact shape";
    EXPECT_EQ(st.candidates_timed, 8);
    EXPECT_EQ(st.sites_changed, 2);
    EXPECT_EQ(timed.size(), 2u);
    for (const auto& [k, n] : timed) EXPECT_EQ(n, 4) << k;
    ASSERT_FALSE(lf.algorithms.empty());
    EXPECT_EQ(lf.algorithms.front(), 2) << "blas0 captured with the winning algorithm";
    EXPECT_EQ(lf.algorithms.back(), -1) << "blas1 (exact) keeps the heuristic's first";
    EXPECT_NE(logs.str().find("max-autotune: bucket 1 of 'lib' (s0 in [33, 64]) at its upper bounds: 2 site(s) timed (8 "
                              "candidates)"),
              std::string::npos)
        << logs.str();
    EXPECT_NE(logs.str().find("changed: blas0 algorithm 2 (5.0 -> 3.0 us), k1 256 threads per row (10.0 -> 7.0 us)"),
              std::string::npos)
        << logs.str();
    check_calls(*art, {100});  // a new bucket [65, 128]: its own tuning (another key)
    EXPECT_EQ(bc::autotune_stats().sites_tuned, 4);
    EXPECT_EQ(timed.size(), 4u);
  }
  // The next run (a new process: the table is read from the file again) starts tuned: nothing is timed.
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  lf.algorithms.clear();
  auto art = bc::make_cuda_artifact(with_library_and_row_kernel(), in);
  check_calls(*art, {37, 128});
  const auto st = bc::autotune_stats();
  EXPECT_EQ(st.sites_tuned, 0);
  EXPECT_EQ(st.sites_from_table, 4);
  EXPECT_TRUE(timed.empty());
  EXPECT_EQ(lf.algorithms.front(), 2);
  EXPECT_TRUE(std::filesystem::exists(td.dir + "/tuning.json"));

  // A warm run whose symbol comes with a known range (the PGO profile's observed [37, 128], as a warm
  // GPT-2 run compiles with): its lowest bucket is [37, 64] where the cold run's was [33, 64], timed at
  // the same bound 64, so the table still answers every site (it was keyed by the range and missed).
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  pt::backend::BackendInput ranged = in;
  ranged.buckets.ranges = {pt::backend::BackendInput::SymbolRange{37, 128, "pgo"}};
  auto warm = bc::make_cuda_artifact(with_library_and_row_kernel(), ranged);
  check_calls(*warm, {37, 128});
  const auto st2 = bc::autotune_stats();
  EXPECT_EQ(st2.sites_tuned, 0);
  EXPECT_EQ(st2.sites_from_table, 4);
  EXPECT_TRUE(timed.empty());
  EXPECT_NE(logs.str().find("(s0 in [37, 64]) at its upper bounds: 0 site(s) timed"), std::string::npos) << logs.str();
}

TEST(CudaGraphs, MaxAutotuneTimesAsManyBlasAlgorithmsAsAsked) {
  // The heuristic offers 12 algorithms and the 11th (index 10) is the fastest: the default count (8)
  // does not reach it, PROTEAN_AUTOTUNE_BLAS_ALGOS=12 does, under a key of its own (the table tuned over
  // 8 is not reused), and an out-of-range count warns and times 8.
  TuningDir td;
  LibraryFake lf(12);
  std::map<std::string, int> timed;
  bc::set_autotune_timer_for_testing([&](const std::string& key, int i) {
    if (key.find("|blas|") == std::string::npos) return 5.0;
    ++timed[key];
    return i == 10 ? 1.0 : 5.0;
  });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  auto run_once = [&](const char* count, bool fresh = true) -> int {
    if (count) setenv("PROTEAN_AUTOTUNE_BLAS_ALGOS", count, 1);
    else unsetenv("PROTEAN_AUTOTUNE_BLAS_ALGOS");
    if (fresh) std::filesystem::remove(td.dir + "/tuning.json");
    bc::reset_process_tuning_table();
    timed.clear();
    lf.algorithms.clear();
    auto art = bc::make_cuda_artifact(with_library_and_row_kernel(), in);
    pt::Tensor x = pt::randn({40, 4}).to(pt::kCUDA);
    auto y = art->run({&x, 1}, std::vector<int64_t>{40});
    expect_library_result(x, y[0]);
    unsetenv("PROTEAN_AUTOTUNE_BLAS_ALGOS");
    EXPECT_EQ(timed.size(), 1u) << "blas0, the one product captured padded";
    return timed.empty() ? 0 : timed.begin()->second;
  };
  EXPECT_EQ(run_once(nullptr), 8);
  ASSERT_FALSE(lf.algorithms.empty());
  EXPECT_EQ(lf.algorithms.front(), -1) << "none of the first 8 beats the heuristic's first";
  EXPECT_EQ(run_once("12", false), 12) << "the table's entry tuned over 8 is not this key's";
  ASSERT_FALSE(lf.algorithms.empty());
  EXPECT_EQ(lf.algorithms.front(), 10);
  EXPECT_EQ(run_once("16"), 12) << "no more than the heuristic offers";
  {
    pt::observe::LogCapture warnings("");
    EXPECT_EQ(run_once("40"), 8);
    EXPECT_NE(warnings.str().find("PROTEAN_AUTOTUNE_BLAS_ALGOS='40'"), std::string::npos) << warnings.str();
  }
  bc::set_autotune_timer_for_testing({});
}

TEST(CudaGraphs, ProgramWithoutSymbolsReplaysAndTunes) {
  // A static program (no symbols: every size call has S empty) replayed with new input and output
  // addresses at every call, under reduce-overhead and max-autotune; its size table must be evaluated
  // although the (empty) sizes never change.
  TuningDir td;
  for (const char* mode : {"reduce-overhead", "max-autotune"}) {
    drv::FakeDriver fake;
    // k0: tmp = 2 in, k1: out = tmp + 1 over 48 elements; no size parameter (the program has no symbols).
    for (const char* v : {"_aligned", "_general"}) {
      fake.define_kernel(std::string("k0") + v, {8, 8}, [](const drv::FakeLaunch& l) {
        auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
        auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
        for (int i = 0; i < 48; ++i) out[i] = in[i] * 2.0f;
      });
      fake.define_kernel(std::string("k1") + v, {8, 8}, [](const drv::FakeLaunch& l) {
        auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
        auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
        for (int i = 0; i < 48; ++i) out[i] = in[i] + 1.0f;
      });
    }
    auto p = std::make_shared<bc::CudaProgram>();
    p->name = "static";
    p->cubin = {'f', 'a', 'k', 'e', 0};
    const pt::sym::Expr n = pt::sym::integer(48);
    bc::testing::plan_input_temp_output(*p, n);
    p->kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, n), bc::testing::grid_stride_kernel("k1", 1, 2, n)};
    for (bc::CudaKernel& k : p->kernels) {
      k.params.pop_back();  // the size parameter
      k.arg_block_bytes = 16;
    }
    p->steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Kernel, 1, {1}}};
    pt::backend::BackendInput in = graph_input();
    in.symbols.clear();
    in.buckets.ranges.clear();
    in.mode = mode;
    auto art = bc::make_cuda_artifact(p, in);
    for (int i = 0; i < 3; ++i) {
      pt::Tensor x = pt::randn({48}).to(pt::kCUDA);
      fake.clear_launches();
      auto outs = art->run({&x, 1}, std::vector<int64_t>{});
      expect_result(x, outs[0]);
      ASSERT_EQ(fake.launches().size(), 2u);
      EXPECT_TRUE(fake.launches()[0].from_graph) << mode;
      EXPECT_EQ(fake.launches()[0].kernel, "k0_aligned") << mode << ": 48 is a multiple of 4, buffers aligned";
    }
  }
}

// max-autotune tunes and records a new bucket on the calling thread, not on the compile worker, where
// the program's own calls would run beside the timings (and run plain meanwhile): with
// PROTEAN_CUDA_GRAPH_RECORD unset, the first call of each bucket already replays its tuned graph.
TEST(CudaGraphs, MaxAutotuneRecordsANewBucketOnTheCallingThread) {
  TuningDir td;
  LibraryFake lf(4);
  bc::set_autotune_timer_for_testing(
      [](const std::string&, int i) { return std::vector<double>{5, 5, 3, 5}.at(static_cast<size_t>(i)); });
  pt::backend::BackendInput in = graph_input();
  unsetenv("PROTEAN_CUDA_GRAPH_RECORD");
  in.mode = "max-autotune";
  pt::backend::reset_graph_stats();
  auto art = bc::make_cuda_artifact(with_library_and_row_kernel(), in);
  for (int64_t n : {40, 100, 50}) {
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    lf.fake.clear_launches();
    expect_library_result(x, art->run({&x, 1}, std::vector<int64_t>{n})[0]);
    for (const auto& l : lf.fake.launches()) EXPECT_TRUE(l.from_graph) << l.kernel << " at n = " << n;
  }
  EXPECT_EQ(pt::backend::graph_stats().plain_runs, 0);
  EXPECT_EQ(pt::backend::graph_stats().recordings, 3)
      << "buckets [33, 64] and [65, 128], then [33, 64] again for the exact product's new shape";
  EXPECT_EQ(bc::autotune_stats().buckets_tuned, 2);
}

TEST(CudaGraphs, MaxAutotuneBudgetLeavesSitesUntunedAndUnstored) {
  TuningDir td;
  LibraryFake lf(4);
  setenv("PROTEAN_AUTOTUNE_BUDGET_MS", "20", 1);
  bc::set_autotune_timer_for_testing([](const std::string&, int i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // the first site's 4 candidates spend the budget
    return i == 2 ? 1.0 : 5.0;
  });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  auto art = bc::make_cuda_artifact(with_library_and_row_kernel(), in);
  pt::Tensor x = pt::randn({40, 4}).to(pt::kCUDA);
  expect_library_result(x, art->run({&x, 1}, std::vector<int64_t>{40})[0]);
  unsetenv("PROTEAN_AUTOTUNE_BUDGET_MS");
  const auto st = bc::autotune_stats();
  EXPECT_EQ(st.sites_tuned, 1) << "the first site is timed, then the budget is spent";
  EXPECT_EQ(st.sites_over_budget, 1);
  bc::TuningTable t;
  t.load(td.dir + "/tuning.json");
  EXPECT_EQ(t.size(), 1u) << "a site past the budget is not stored: the next run tunes it";
  setenv("PROTEAN_AUTOTUNE_BUDGET_MS", "soon", 1);
  EXPECT_THROW(bc::autotune_budget_ms(), pt::ValueError);
  unsetenv("PROTEAN_AUTOTUNE_BUDGET_MS");
}

// Kernels that wait for their prior grids (the generated ones) hang on a programmatic edge when a
// kernel node precedes them, so the second kernel is scheduled while the first one's last blocks run;
// the first node of a segment, and kernels that do not wait, keep plain edges. Replays are unchanged.
// A captured library call that is one kernel node joins the graph as a kernel node (no child graph),
// so the generated kernel after it hangs on a programmatic edge as after another kernel; the library
// kernels themselves never do (they do not wait for their prior grids).
TEST(CudaGraphs, LibraryCallsAreKernelNodesAndTheKernelAfterOneHangsOnAProgrammaticEdge) {
  setenv("PROTEAN_CUDA_GRAPH_PIPELINE", "0", 1);  // one graph: k1 right after the bmm (not in a chunk of its own)
  setenv("PROTEAN_CUDA_GRAPH_FLAT_LIBRARY", "1", 1);
  struct Unset {
    ~Unset() {
      unsetenv("PROTEAN_CUDA_GRAPH_PIPELINE");
      unsetenv("PROTEAN_CUDA_GRAPH_FLAT_LIBRARY");
    }
  } unset;
  LibraryFake lf;
  drv::FakeDriver& fake = lf.fake;
  pt::backend::reset_graph_stats();
  pt::observe::LogCapture logs("graphs");
  auto p = with_library();
  for (bc::CudaKernel& k : p->kernels) k.waits_for_prior_grids = true;
  auto art = bc::make_cuda_artifact(p, graph_input());
  for (int64_t n : {5, 7, 6}) {  // one bucket: [5, 8]; the exact bmm records it again at 7 and 6
    pt::Tensor x = pt::randn({n, 4}).to(pt::kCUDA);
    fake.clear_launches();
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    expect_library_result(x, outs[0]);
    ASSERT_EQ(fake.launches().size(), 4u);
    EXPECT_EQ(fake.launches()[1].kernel, "gemm");
    EXPECT_EQ(fake.launches()[1].param<int64_t>(4), 8) << "padded to the bucket's bound";
    EXPECT_EQ(fake.launches()[2].param<int64_t>(3), n) << "the exact call at its shape";
    EXPECT_FALSE(fake.launches()[1].programmatic) << "a library kernel does not wait for the kernel ahead";
    EXPECT_FALSE(fake.launches()[2].programmatic);
    EXPECT_TRUE(fake.launches()[3].programmatic) << "k1 after the bmm's kernel node";
  }
  EXPECT_EQ(fake.stats().child_nodes_added, 0);
  EXPECT_NE(logs.str().find("(2 library call(s) as kernel nodes, "), std::string::npos) << logs.str();
}

TEST(CudaGraphs, KernelNodesAfterAKernelHangOnProgrammaticEdges) {
  for (bool waits : {true, false}) {
    drv::FakeDriver fake;
    define_two(fake);
    auto p = two_kernels();
    for (bc::CudaKernel& k : p->kernels) k.waits_for_prior_grids = waits;
    auto art = bc::make_cuda_artifact(p, graph_input());
    for (int64_t n : {40, 64, 37}) {
      pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
      fake.clear_launches();
      auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
      expect_result(x, outs[0]);
      ASSERT_EQ(fake.launches().size(), 2u);
      EXPECT_FALSE(fake.launches()[0].programmatic) << "the segment's first node has no kernel ahead of it";
      EXPECT_EQ(fake.launches()[1].programmatic, waits) << "k1 after k0, patched at each new size";
    }
    EXPECT_EQ(fake.stats().programmatic_edges, waits ? 1 : 0) << "one recording, one kernel-to-kernel edge";
    EXPECT_EQ(fake.stats().programmatic_launches, 0) << "graph nodes, no plain launch";
  }
}

namespace {

// two_kernels() whose k1 is a warp-per-row kernel (4 rows per block of 128 threads, one row per
// element here) with max-autotune candidate variants of its aligned entry: 1 and 2 rows per block at
// vectors of 4, and 4 rows per block at vectors of 2 (a rule of multiples of 2).
std::shared_ptr<bc::CudaProgram> with_row_variants(std::vector<std::string> tags = {"r1v4", "r2v4", "r4v2"}) {
  auto p = two_kernels();
  bc::CudaKernel& k = p->kernels[1];
  for (auto* v : {&k.aligned.launch, &k.general.launch}) {
    v->shape = bc::LaunchShape::WarpPerRow;
    v->block_threads = 128;
    v->rows_per_block = 4;
  }
  for (const std::string& tag : tags) {
    bc::TuneVariant t;
    t.rows_per_block = tag[1] - '0';
    t.vector_width = tag[3] - '0';
    t.variant.entry = "k1_aligned_" + tag;
    t.variant.launch = k.aligned.launch;
    t.variant.launch.rows_per_block = t.rows_per_block;
    t.variant.launch.block_threads = 32 * t.rows_per_block;
    t.rule = k.rule;
    t.rule.multiple = t.vector_width;
    k.tune.push_back(t);
  }
  p->tune_source = "// the variants' unit";
  p->tune_cubin = {'f', 'a', 'k', 'e', 0};
  return p;
}

void define_row_variants(drv::FakeDriver& fake) {
  define_two(fake);
  for (const char* tag : {"r1v4", "r2v4", "r4v2"}) fake.define_kernel(std::string("k1_aligned_") + tag, {8, 8, 8}, add_one);
}

// The k1 launch of the last call (exactly one).
drv::FakeLaunch row_launch(const drv::FakeDriver& fake) {
  std::vector<drv::FakeLaunch> r;
  for (const auto& l : fake.launches())
    if (l.kernel.rfind("k1", 0) == 0) r.push_back(l);
  EXPECT_EQ(r.size(), 1u);
  return r.empty() ? drv::FakeLaunch{} : r.back();
}

}  // namespace

// Rows per block and vector width are compiled into a row kernel's text: max-autotune times the
// kernel's own entry against each candidate variant per bucket at its upper bound, and the bucket's
// graph launches the winner (its own function, grid and block) wherever the variant's rule holds,
// the kernel's general entry elsewhere; another bucket has its own winner. The table's key names the
// candidates, and a warm run times nothing and loads the variants only when one of them won.
TEST(CudaGraphs, MaxAutotuneRowKernelVariantsPerBucket) {
  TuningDir td;
  drv::FakeDriver fake;
  define_row_variants(fake);
  std::map<std::string, int> timed;
  bc::set_autotune_timer_for_testing([&](const std::string& key, int i) {
    ++timed[key];
    EXPECT_NE(key.find("|variant|"), std::string::npos) << key;
    const bool first_bucket = key.find("s0 at 64") != std::string::npos;
    // [33, 64]: r2v4 (candidate 2) wins; [65, 128]: r1v4 (candidate 1); r4v2 within 3 % of the own entry
    return (first_bucket ? std::vector<double>{10, 9, 6, 9.9} : std::vector<double>{10, 6, 9, 9.8}).at(static_cast<size_t>(i));
  });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  pt::observe::LogCapture logs("graphs");
  struct Expect {
    int64_t n;
    const char* kernel;
    unsigned grid, block;
  };
  auto check = [&](pt::backend::Artifact& art, std::initializer_list<Expect> calls) {
    for (const Expect& e : calls) {
      pt::Tensor x = pt::randn({e.n}).to(pt::kCUDA);
      fake.clear_launches();
      auto y = art.run({&x, 1}, std::vector<int64_t>{e.n});
      expect_result(x, y[0]);
      const drv::FakeLaunch l = row_launch(fake);
      EXPECT_TRUE(l.from_graph) << e.n;
      EXPECT_EQ(l.kernel, e.kernel) << e.n;
      EXPECT_EQ(l.grid[0], e.grid) << e.n;
      EXPECT_EQ(l.block[0], e.block) << e.n;
    }
  };
  const int64_t loads0 = fake.stats().module_loads;
  {
    auto art = bc::make_cuda_artifact(with_row_variants(), in);
    EXPECT_EQ(fake.stats().module_loads, loads0 + 1) << "the variants are not loaded with the program";
    check(*art, {{40, "k1_aligned_r2v4", 20, 64},  // bucket [33, 64]: 2 rows per block of 64 threads
                 {37, "k1_general", 10, 128},      // not a multiple of 4: the general entry, its own launch
                 {42, "k1_general", 11, 128},      // a multiple of 2 but not of 4: the kernel's aligned rule fails
                 {64, "k1_aligned_r2v4", 32, 64},
                 {100, "k1_aligned_r1v4", 100, 32},  // bucket [65, 128]: its own winner, one row per block
                 {44, "k1_aligned_r2v4", 22, 64}});
    EXPECT_EQ(fake.stats().module_loads, loads0 + 2) << "the variants' module, once for both buckets";
    const auto st = bc::autotune_stats();
    EXPECT_EQ(st.sites_tuned, 2);
    EXPECT_EQ(st.candidates_timed, 8);
    EXPECT_EQ(st.sites_changed, 2);
    EXPECT_EQ(st.variant_kernels, 1);
    EXPECT_EQ(st.variant_entries, 3);
    EXPECT_EQ(st.variant_nvrtc, 0) << "the test's program comes with its variants' cubin";
    EXPECT_EQ(timed.size(), 2u);
    EXPECT_NE(logs.str().find("3 row-kernel variant(s) of 1 kernel(s) compiled with the program in"), std::string::npos)
        << logs.str();
    EXPECT_NE(logs.str().find("changed: k1 r2v4 (10.0 -> 6.0 us)"), std::string::npos) << logs.str();
    EXPECT_NE(logs.str().find("changed: k1 r1v4 (10.0 -> 6.0 us)"), std::string::npos) << logs.str();
  }
  // A warm run (a new process reads the table): nothing timed, the stored winners launched.
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  {
    auto art = bc::make_cuda_artifact(with_row_variants(), in);
    check(*art, {{48, "k1_aligned_r2v4", 24, 64}, {128, "k1_aligned_r1v4", 128, 32}});
    const auto st = bc::autotune_stats();
    EXPECT_EQ(st.sites_tuned, 0);
    EXPECT_EQ(st.sites_from_table, 2);
    EXPECT_TRUE(timed.empty());
  }
  // Other candidates (a table written for another list): the key differs, the site is timed again.
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  {
    auto art = bc::make_cuda_artifact(with_row_variants({"r1v4", "r2v4"}), in);
    check(*art, {{40, "k1_aligned_r2v4", 20, 64}});
    EXPECT_EQ(bc::autotune_stats().sites_tuned, 1);
    EXPECT_EQ(timed.size(), 1u);
  }
}

namespace {

// three_from_memory()'s kernels on the fake driver (each reads the size from memory), and km_aligned_r1v8:
// km's max-autotune candidate of vectors of 8 (a rule of multiples of 8, 8 items per thread).
void define_three_from_memory(drv::FakeDriver& fake) {
  auto copy = [](const drv::FakeLaunch& l) {
    auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
    auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
    const int64_t n = *reinterpret_cast<const int64_t*>(l.param<uint64_t>(2));
    for (int64_t i = 0; i < n; ++i) out[i] = in[i];
  };
  auto scale = [](float a, float b) {
    return [a, b](const drv::FakeLaunch& l) {
      auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
      auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
      const int64_t n = *reinterpret_cast<const int64_t*>(l.param<uint64_t>(2));
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * a + b;
    };
  };
  for (const char* v : {"_aligned", "_general"}) {
    fake.define_kernel(std::string("k0") + v, {8, 8, 8}, scale(2.0f, 0.0f));
    fake.define_kernel(std::string("km") + v, {8, 8, 8}, copy);
    fake.define_kernel(std::string("k1") + v, {8, 8, 8}, scale(1.0f, 1.0f));
  }
  fake.define_kernel("km_aligned_r1v8", {8, 8, 8}, copy);
}

std::shared_ptr<bc::CudaProgram> three_from_memory_tuned() {
  auto p = three_from_memory();
  bc::CudaKernel& km = p->kernels[1];
  bc::TuneVariant t;
  t.rows_per_block = 1;
  t.vector_width = 8;
  t.variant.entry = "km_aligned_r1v8";
  t.variant.launch = km.aligned.launch;
  t.variant.launch.items_per_thread = 8;
  t.rule = km.rule;
  t.rule.multiple = 8;
  km.tune.push_back(t);
  p->tune_source = "// the variants' unit";
  p->tune_cubin = {'f', 'a', 'k', 'e', 0};
  return p;
}

}  // namespace

// A node that reads only arena regions and the sizes' memory is skipped at a new size when nothing its
// launch follows changed; with a tuned variant (max-autotune's winner for the bucket) that includes
// the variant's own rule: km's winner needs multiples of 8, so 1104 launches it, 1100 (a multiple of
// 4 only) the kernel's aligned entry, 1027 the general one, each with its grid at the bucket's bound.
// Sizes that change none of that patch no node and do not compute km's launch again, the first new
// size after the recording included.
TEST(CudaGraphs, MaxAutotuneTunedVariantOfASizesInMemoryNodeFollowsItsRuleAtNewSizes) {
  TuningDir td;
  drv::FakeDriver fake;
  define_three_from_memory(fake);
  bc::set_autotune_timer_for_testing([](const std::string&, int i) { return i == 0 ? 10.0 : 6.0; });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  pt::backend::reset_graph_stats();
  auto art = bc::make_cuda_artifact(three_from_memory_tuned(), in);
  struct Expect {
    int64_t n;
    const char* kernel;
    unsigned grid;
    int64_t patched;     // nodes updated by this call: km's, and k0's and k1's where n % 4 flips their entry
    int64_t recomputed;  // nodes whose launch was computed again: k0 and k1 (the input's and output's), and km
                         // where its key changed (from the recording on: 1027 keeps 1030's)
  };
  // bucket [1025, 1280], recorded (and tuned at 1280) by the first call
  const std::vector<Expect> calls = {{1030, "km_general", 10, 0, 0},     {1027, "km_general", 10, 0, 2},
                                     {1104, "km_aligned_r1v8", 2, 3, 3}, {1112, "km_aligned_r1v8", 2, 0, 2},
                                     {1100, "km_aligned", 3, 1, 3},      {1108, "km_aligned", 3, 0, 2},
                                     {1029, "km_general", 10, 3, 3},     {1200, "km_aligned_r1v8", 2, 3, 3}};
  pt::observe::LogCapture logs("graphs");
  for (const Expect& e : calls) {
    pt::Tensor x = pt::randn({e.n}).to(pt::kCUDA);
    fake.clear_launches();
    const int64_t u0 = fake.stats().node_updates;
    auto y = art->run({&x, 1}, std::vector<int64_t>{e.n});
    expect_result(x, y[0]);
    ASSERT_EQ(fake.launches().size(), 3u) << e.n;
    const drv::FakeLaunch& l = fake.launches()[1];
    EXPECT_TRUE(l.from_graph) << e.n;
    EXPECT_EQ(l.kernel, e.kernel) << e.n;
    EXPECT_EQ(l.grid[0], e.grid) << e.n;
    if (&e != &calls.front()) {
      EXPECT_EQ(fake.stats().node_updates - u0, e.patched) << e.n;
      EXPECT_NE(logs.str().find(fmt::format("new sizes s0={} in bucket", e.n)), std::string::npos) << logs.str();
      const std::string line = logs.str().substr(logs.str().find(fmt::format("new sizes s0={} in bucket", e.n)));
      EXPECT_NE(line.substr(0, line.find('\n')).find(fmt::format("; {} node(s) recomputed)", e.recomputed)), std::string::npos)
          << e.n << ": " << line.substr(0, line.find('\n'));
    }
  }
  EXPECT_EQ(pt::backend::graph_stats().recordings, 1);
}

// Random sequences of sizes over four buckets of the default policy (from [961, 1024] on),
// under reduce-overhead and max-autotune (km's tuned variant winning in every bucket), against the rules
// each launch must follow whatever came before it: every call's result, km's entry (the tuned variant
// where its multiple of 8 holds under max-autotune, the aligned entry at multiples of 4, else the
// general one) and its grid at the bucket's bound. Every output is held to the end and keeps its values
// (no replay writes into an output handed out earlier).
TEST(CudaGraphs, RandomSizeSequencesFollowTheLaunchRulesAndKeepEveryOutput) {
  for (const char* mode : {"reduce-overhead", "max-autotune"})
    for (uint64_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(fmt::format("{}, seed {}", mode, seed));
      TuningDir td;
      drv::FakeDriver fake;
      define_three_from_memory(fake);
      bc::set_autotune_timer_for_testing([](const std::string&, int i) { return i == 0 ? 10.0 : 6.0; });
      pt::backend::BackendInput in = graph_input();
      in.mode = mode;
      pt::backend::reset_graph_stats();
      auto art = bc::make_cuda_artifact(three_from_memory_tuned(), in);
      const bool tuned = std::string(mode) == "max-autotune";
      std::mt19937_64 rng(seed);
      // four consecutive buckets of the default policy: [961, 1024], [1025, 1280], [1281, 1600], [1601, ...]
      std::vector<pt::dynamic::Bucket> buckets;
      for (int64_t v = 1000; buckets.size() < 4; v = buckets.back().hi + 1) buckets.push_back(pt::dynamic::BucketPolicy{}.bucket_of(v));
      ASSERT_EQ(buckets[1].lo, 1025);
      int64_t bounds[4], lows[4];
      for (size_t i = 0; i < 4; ++i) bounds[i] = buckets[i].hi, lows[i] = buckets[i].lo;
      std::vector<std::pair<pt::Tensor, pt::Tensor>> held;
      for (int c = 0; c < 60; ++c) {
        const size_t b = static_cast<size_t>(rng() % 4);
        // mostly multiples of 4 or 8, so the entries change often
        int64_t n = lows[b] + static_cast<int64_t>(rng() % static_cast<uint64_t>(bounds[b] - lows[b] + 1));
        if (rng() % 3 == 0) n = std::max(lows[b], n / 8 * 8);
        else if (rng() % 2 == 0) n = std::max(lows[b], n / 4 * 4);
        pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
        fake.clear_launches();
        auto y = art->run({&x, 1}, std::vector<int64_t>{n});
        expect_result(x, y[0]);
        ASSERT_EQ(fake.launches().size(), 3u) << n;
        const drv::FakeLaunch& l = fake.launches()[1];
        EXPECT_TRUE(l.from_graph) << n;
        const char* want = tuned && n % 8 == 0 ? "km_aligned_r1v8" : n % 4 == 0 ? "km_aligned" : "km_general";
        EXPECT_EQ(l.kernel, want) << n;
        const int64_t per_block = l.kernel == "km_aligned_r1v8" ? 1024 : l.kernel == "km_aligned" ? 512 : 128;
        EXPECT_EQ(l.grid[0], static_cast<unsigned>((bounds[b] + per_block - 1) / per_block)) << n << " " << l.kernel;
        held.emplace_back(x, y[0]);
      }
      for (const auto& [x, y] : held) expect_result(x, y);
      EXPECT_EQ(pt::backend::graph_stats().recordings, 4);
    }
}

namespace {

// two_kernels() whose k1 is a block-per-row kernel (one row per element here, 256 threads) with
// max-autotune candidates: vectors of 2, and its own entry split over clusters of 2 and 4 blocks
// (entries declaring __cluster_dims__: the fake driver knows their cluster widths).
std::shared_ptr<bc::CudaProgram> with_row_splits() {
  auto p = two_kernels();
  bc::CudaKernel& k = p->kernels[1];
  for (auto* v : {&k.aligned.launch, &k.general.launch}) {
    v->shape = bc::LaunchShape::BlockPerRow;
    v->block_threads = 256;
  }
  for (int split : {1, 2, 4}) {
    bc::TuneVariant t;
    t.vector_width = split == 1 ? 2 : 4;
    t.split = split;
    t.variant.entry = "k1_aligned_" + t.tag();
    t.variant.launch = k.aligned.launch;
    t.variant.launch.cluster = split;
    t.rule = k.rule;
    t.rule.multiple = t.vector_width;
    k.tune.push_back(t);
  }
  p->tune_source = "// the variants' unit";
  p->tune_cubin = {'f', 'a', 'k', 'e', 0};
  return p;
}

void define_row_splits(drv::FakeDriver& fake) {
  define_two(fake);
  for (const char* tag : {"r1v2", "r1v4s2", "r1v4s4"}) fake.define_kernel(std::string("k1_aligned_") + tag, {8, 8, 8}, add_one);
  fake.set_cluster_width("k1_aligned_r1v4s2", 2);
  fake.set_cluster_width("k1_aligned_r1v4s4", 4);
}

}  // namespace

// A row split over a thread-block cluster is a candidate like the others: timed at the bucket's bound
// (grid rows x split, the cluster the entry declares), stored under a key naming the candidates, and
// launched by the bucket's graph with its grid, block and cluster; only where the rows at the bound
// are fewer than the multiprocessors (132 on the fake device) and the device has clusters (sm_90+).
TEST(CudaGraphs, MaxAutotuneRowSplitVariantsPerBucket) {
  TuningDir td;
  drv::FakeDriver fake;
  define_row_splits(fake);
  std::map<std::string, std::vector<int>> timed;
  // candidates: 0 own, 1 r1v2, 2 r1v4s2, 3 r1v4s4; [33, 64]: s4 fastest; [65, 128]: s2; [129, 256]: s4 again
  bc::set_autotune_timer_for_testing([&](const std::string& key, int i) {
    timed[key].push_back(i);
    EXPECT_NE(key.find("|variant|"), std::string::npos) << key;
    if (key.find("s0 at 128") != std::string::npos) return std::vector<double>{10, 9.9, 5, 7}.at(static_cast<size_t>(i));
    return std::vector<double>{10, 9.9, 7, 5}.at(static_cast<size_t>(i));
  });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  pt::observe::LogCapture logs("graphs");
  struct Expect {
    int64_t n;
    const char* kernel;
    unsigned grid, block, cluster;
  };
  auto check = [&](pt::backend::Artifact& art, std::initializer_list<Expect> calls) {
    for (const Expect& e : calls) {
      pt::Tensor x = pt::randn({e.n}).to(pt::kCUDA);
      fake.clear_launches();
      auto y = art.run({&x, 1}, std::vector<int64_t>{e.n});
      expect_result(x, y[0]);
      const drv::FakeLaunch l = row_launch(fake);
      EXPECT_TRUE(l.from_graph) << e.n;
      EXPECT_EQ(l.kernel, e.kernel) << e.n;
      EXPECT_EQ(l.grid[0], e.grid) << e.n;
      EXPECT_EQ(l.block[0], e.block) << e.n;
      EXPECT_EQ(l.cluster, e.cluster) << e.n;
    }
  };
  {
    auto art = bc::make_cuda_artifact(with_row_splits(), in);
    check(*art, {{40, "k1_aligned_r1v4s4", 160, 256, 4},  // [33, 64]: 40 rows, 4 blocks each
                 {37, "k1_general", 37, 256, 1},          // the kernel's rule fails: its general entry
                 {64, "k1_aligned_r1v4s4", 256, 256, 4},  // a new size in the bucket: the node patched
                 {100, "k1_aligned_r1v4s2", 200, 256, 2},  // [65, 128]: its own winner
                 {200, "k1_aligned", 200, 256, 1}});       // [129, 256]: 256 rows fill the device, no split
    EXPECT_EQ(timed.size(), 3u);
    for (const auto& [key, cands] : timed) {
      if (key.find("s0 at 256") != std::string::npos)
        EXPECT_EQ(cands, (std::vector<int>{0, 1})) << "rows >= multiprocessors: the splits are not timed";
      else
        EXPECT_EQ(cands, (std::vector<int>{0, 1, 2, 3})) << key;
    }
    const auto st = bc::autotune_stats();
    EXPECT_EQ(st.sites_changed, 2);
    EXPECT_NE(logs.str().find("changed: k1 r1v4s4 (10.0 -> 5.0 us)"), std::string::npos) << logs.str();
    EXPECT_NE(logs.str().find("changed: k1 r1v4s2 (10.0 -> 5.0 us)"), std::string::npos) << logs.str();
  }
  // The key names the candidates (the splits' tags included): a warm run times nothing and launches
  // the stored winners with their clusters.
  {
    bc::TuningTable t;
    t.load(td.dir + "/tuning.json");
    EXPECT_EQ(t.size(), 3u);
  }
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  {
    auto art = bc::make_cuda_artifact(with_row_splits(), in);
    check(*art, {{48, "k1_aligned_r1v4s4", 192, 256, 4}, {128, "k1_aligned_r1v4s2", 256, 256, 2}});
    EXPECT_EQ(bc::autotune_stats().sites_tuned, 0);
    EXPECT_EQ(bc::autotune_stats().sites_from_table, 2);
    EXPECT_TRUE(timed.empty());
  }
  // The fake driver refuses a grid that is not a multiple of the entry's cluster, as the driver does.
  {
    void* args[3] = {nullptr, nullptr, nullptr};
    drv::CUfunction fn = nullptr;
    ASSERT_EQ(fake.api().cuModuleGetFunction(&fn, nullptr, "k1_aligned_r1v4s4"), drv::kCudaSuccess);
    int width = 0;
    EXPECT_EQ(fake.api().cuFuncGetAttribute(&width, drv::kFuncAttrRequiredClusterWidth, fn), drv::kCudaSuccess);
    EXPECT_EQ(width, 4);
    EXPECT_EQ(fake.api().cuLaunchKernel(fn, 6, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), drv::kCudaErrorInvalidClusterSize);
  }
}

// Below sm_90 (no thread-block clusters) a split is never timed nor launched, even when a table names
// it; an entry whose declared cluster differs from its launch rule is never launched either.
TEST(CudaGraphs, MaxAutotuneRowSplitsNeedClusters) {
  for (bool old_device : {true, false}) {
    SCOPED_TRACE(old_device ? "sm_80" : "cluster width mismatch");
    TuningDir td;
    drv::FakeDriver fake;
    define_row_splits(fake);
    if (old_device) fake.set_compute_capability(8, 0);
    else fake.set_cluster_width("k1_aligned_r1v4s4", 2);  // r1v4s2 stays right
    std::vector<int> timed;
    bc::set_autotune_timer_for_testing([&](const std::string&, int i) {
      timed.push_back(i);
      return std::vector<double>{10, 9.9, 7, 5}.at(static_cast<size_t>(i));
    });
    pt::backend::BackendInput in = graph_input();
    in.mode = "max-autotune";
    pt::observe::LogCapture logs("graphs");
    auto art = bc::make_cuda_artifact(with_row_splits(), in);
    pt::Tensor x = pt::randn({40}).to(pt::kCUDA);
    fake.clear_launches();
    expect_result(x, art->run({&x, 1}, std::vector<int64_t>{40})[0]);
    const drv::FakeLaunch l = row_launch(fake);
    EXPECT_EQ(l.kernel, old_device ? "k1_aligned" : "k1_aligned_r1v4s2");
    EXPECT_EQ(l.cluster, old_device ? 1u : 2u);
    EXPECT_EQ(timed, old_device ? (std::vector<int>{0, 1}) : (std::vector<int>{0, 1, 2}));
    if (!old_device) {
      EXPECT_NE(logs.str().find("declares clusters of 2 blocks, its launch rule 4"), std::string::npos) << logs.str();
    }
  }
}

// When the kernel's own entry wins (or the table says so), the bucket launches it, and a warm run
// does not load the variants' module at all; variants that cannot be loaded leave the kernel's own
// entry in the graph (one warning) and store nothing.
TEST(CudaGraphs, MaxAutotuneRowVariantsLoadedOnlyWhenNeeded) {
  TuningDir td;
  drv::FakeDriver fake;
  define_row_variants(fake);
  bc::set_autotune_timer_for_testing([&](const std::string&, int i) { return 5.0 - 0.01 * i; });
  pt::backend::BackendInput in = graph_input();
  in.mode = "max-autotune";
  auto call = [&](pt::backend::Artifact& art, int64_t n) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    fake.clear_launches();
    expect_result(x, art.run({&x, 1}, std::vector<int64_t>{n})[0]);
    return row_launch(fake).kernel;
  };
  const int64_t loads0 = fake.stats().module_loads;
  {
    auto art = bc::make_cuda_artifact(with_row_variants(), in);
    EXPECT_EQ(call(*art, 40), "k1_aligned") << "within 3 %: the own entry stays";
    EXPECT_EQ(fake.stats().module_loads, loads0 + 2) << "loaded to be timed";
  }
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  {
    auto art = bc::make_cuda_artifact(with_row_variants(), in);
    EXPECT_EQ(call(*art, 40), "k1_aligned");
    EXPECT_EQ(fake.stats().module_loads, loads0 + 3) << "the table says the own entry won: no variants loaded";
    EXPECT_EQ(bc::autotune_stats().sites_from_table, 1);
  }
  // A program whose variants are missing from its cubin: a warning, the own entry, nothing stored.
  TuningDir td2;
  bc::set_autotune_timer_for_testing([&](const std::string&, int i) { return i == 2 ? 1.0 : 5.0; });
  auto p = with_row_variants();
  p->kernels[1].tune[0].variant.entry = "k1_aligned_missing";
  pt::observe::LogCapture logs("graphs");
  auto art = bc::make_cuda_artifact(p, in);
  EXPECT_EQ(call(*art, 40), "k1_aligned");
  EXPECT_EQ(bc::autotune_stats().sites_tuned, 0);
  EXPECT_NE(logs.str().find("row-kernel variants not loaded"), std::string::npos) << logs.str();
  bc::TuningTable t;
  t.load(td2.dir + "/tuning.json");
  EXPECT_EQ(t.size(), 0u);
}

// Through the whole backend (real rendering, real NVRTC, the fake driver running no kernel): a
// max-autotune compile of LayerNorm+GELU over GPT-2 small's 768 bf16 columns (a warp per row) renders
// its 8 variants, the first bucket compiles their unit with NVRTC on the recording thread and its graph
// launches the variant the (test) timer made fastest; a later process takes the variants' cubin from
// the artifact cache (no NVRTC) and the winner from the table (nothing timed).
TEST(CudaGraphs, MaxAutotuneCompilesRowVariantsOnceAndLaunchesTheWinner) {
  TuningDir td;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  pt::cache::clear_blob_memory_cache();
  std::map<std::string, int> timed;
  bc::set_autotune_timer_for_testing([&](const std::string& key, int i) {
    ++timed[key];
    if (key.find("|variant|") != std::string::npos) return i == 5 ? 1.0 : 10.0;  // r2v4
    return i == 0 ? 1.0 : 10.0;
  });
  const pt::Tensor w = pt::randn({768}, pt::DType::BF16).to(pt::kCUDA), b = pt::randn({768}, pt::DType::BF16).to(pt::kCUDA);
  auto run = [&](const char* name) {
    pt::CompileOptions o;
    o.name = name;
    o.backend = "cuda";
    o.mode = "max-autotune";
    auto f = pt::compile([w, b](const pt::Tensor& x) { return pt::gelu(pt::layer_norm(x, {768}, w, b)); }, o);
    std::vector<std::string> rows;
    for (int64_t n : {40, 48}) {
      pt::Tensor x = pt::randn({n, 768}, pt::DType::BF16).to(pt::kCUDA);
      pt::mark_dynamic(x, 0, 2, 65536);  // one dynamic artifact from the first call
      fake.clear_launches();
      f(x);
      for (const auto& l : fake.launches())
        if (l.from_graph && l.kernel.rfind("kernel", 0) == 0) rows.push_back(fmt::format("{} {} {}", l.kernel, l.grid[0], l.block[0]));
    }
    return rows;
  };
  std::vector<std::string> first;
  try {
    first = run("ln_gelu_variants");
  } catch (const pt::CompileError& e) {
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  // both calls in the bucket [33, 64]: 2 rows per block of 64 threads, over the bucket's 64 rows (the
  // kernel reads its sizes from memory: the blocks past a call's rows return)
  EXPECT_EQ(first, (std::vector<std::string>{"kernel0_aligned_r2v4 32 64", "kernel0_aligned_r2v4 32 64"}));
  auto st = bc::autotune_stats();
  EXPECT_EQ(st.variant_kernels, 1);
  EXPECT_EQ(st.variant_entries, 8);
  EXPECT_EQ(st.variant_nvrtc, 1) << "compiled by NVRTC on the recording thread";
  EXPECT_GT(st.variant_compile_ms, 0.0);
  EXPECT_EQ(st.sites_changed, 1);
  // the next process: the cubin from the artifact cache, the winner from the table
  pt::reset();
  pt::cache::clear_blob_memory_cache();
  bc::reset_process_tuning_table();
  bc::reset_autotune_stats();
  timed.clear();
  const std::vector<std::string> again = run("ln_gelu_variants");
  EXPECT_EQ(again, first);
  st = bc::autotune_stats();
  EXPECT_EQ(st.variant_nvrtc, 0) << "the variants' cubin from the artifact cache";
  EXPECT_EQ(st.variant_entries, 8);
  EXPECT_EQ(st.sites_tuned, 0);
  EXPECT_TRUE(timed.empty());
}
