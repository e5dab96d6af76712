// The cuda backend's plan in the program cache (backend/cuda/plan_cache.h): the bytes of a hand-built
// program round trip and refuse every corruption; through the backend on the fake driver, a second
// compile of a graph takes its plan from the cache and launches exactly what the first launched, and
// a damaged entry is reported and rendered again.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/cuda/plan_cache.h"
#include "backend/cuda/program.h"
#include "cache/blob_cache.h"
#include "cache/program_cache.h"
#include "device/fake_driver.h"
#include "fake_program.h"
#include "ir/graph.h"
#include "protean/compile.h"
#include "protean/error.h"
#include "protean/ops.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;

namespace {

// x [s0] (input) → k0 → t (slot 0) → linear with weight w (a graph constant) and bias c (a constant
// lowering made: not in the graph) → y [s0, 3] (output).
struct PlanFixture {
  pt::Tensor w = pt::arange(12, pt::DType::F32).reshape({3, 4});
  pt::Tensor c = pt::tensor(std::vector<float>{0.5f, -1.0f, 2.0f}, pt::IntVec{3});
  pt::sym::Expr s0 = pt::sym::symbol("s0");
  pt::backend::BackendInput in;
  bc::CudaProgram p;
  PlanFixture() {
    auto g = std::make_shared<pt::ir::Graph>();
    g->add_constant(pt::randn({2}), "other");
    g->add_constant(w, "w");
    in.graph = g;
    in.symbols = {s0};
    p.name = "planned";
    p.source = "extern \"C\" __global__ void k0_general() {}\n";
    p.symbols = {s0};
    bc::testing::plan_input_temp_output(p, pt::sym::mul(s0, pt::sym::integer(4)));
    using K = pt::loop::BufferKind;
    auto wb = bc::testing::f32_buffer(3, K::Constant, pt::sym::integer(12));
    wb.constant = w;
    auto cb = bc::testing::f32_buffer(4, K::Constant, pt::sym::integer(3));
    cb.constant = c;
    p.buffers.buffers.push_back(wb);
    p.buffers.buffers.push_back(cb);
    p.buffers.buffers[2].sizes = {s0, pt::sym::integer(3)};
    p.kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, pt::sym::mul(s0, pt::sym::integer(4)))};
    p.kernels[0].aligned.launch.row_length = pt::sym::integer(512);
    p.kernels[0].aligned.launch.row_capacity = 1024;
    // a max-autotune candidate variant (vectors of 2) and its unit
    bc::TuneVariant t;
    t.rows_per_block = 1;
    t.vector_width = 2;
    t.variant = p.kernels[0].aligned;
    t.variant.entry = "k0_aligned_r1v2";
    t.rule = p.kernels[0].rule;
    t.rule.multiple = 2;
    bc::TuneVariant split = t;  // and the row split over a cluster of 4 blocks
    split.vector_width = 4;
    split.split = 4;
    split.variant.entry = "k0_aligned_r1v4s4";
    split.variant.launch.cluster = 4;
    split.rule.multiple = 4;
    p.kernels[0].tune = {t, split};
    p.tune_source = "extern \"C\" __global__ void k0_aligned_r1v2() {}\nextern \"C\" __global__ void k0_aligned_r1v4s4() {}\n";
    bc::BlasStep lin;
    lin.op = bc::BlasOp::Linear;
    lin.kind = pt::ops::OpKind::linear;
    lin.a = 1, lin.b = 3, lin.out = 2;
    lin.transpose_b = true;
    lin.batch = pt::sym::integer(1), lin.m = s0, lin.n = pt::sym::integer(3), lin.k = pt::sym::integer(4);
    lin.batch_stride_a = lin.batch_stride_b = pt::sym::integer(0);
    lin.epilogue.bias = 4;
    p.blas = {lin};
    p.steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Blas, 0, {1}}};
  }
};

}  // namespace

TEST(CudaPlanCache, RoundTripKeepsThePlanAndReferencesTheGraphsConstants) {
  PlanFixture f;
  f.p.kernels[0].rule.size = pt::sym::add(f.p.symbols[0], pt::sym::integer(1));
  f.p.kernels[0].rule.at_least = 321;
  const std::optional<std::string> bytes = bc::encode_cuda_plan(f.p, *f.in.graph);
  ASSERT_TRUE(bytes.has_value());
  const bc::CudaProgram back = bc::decode_cuda_plan(*bytes, f.in);
  EXPECT_EQ(bc::to_text(back), bc::to_text(f.p));
  EXPECT_EQ(back.source, f.p.source);
  EXPECT_EQ(back.kernels[0].aligned.launch.row_capacity, 1024);
  ASSERT_TRUE(back.kernels[0].rule.size);
  EXPECT_EQ(back.kernels[0].rule.size, f.p.kernels[0].rule.size);
  EXPECT_EQ(back.kernels[0].rule.at_least, 321);
  EXPECT_EQ(back.tune_source, f.p.tune_source);
  ASSERT_EQ(back.kernels[0].tune.size(), 2u);
  EXPECT_EQ(back.kernels[0].tune[0].tag(), "r1v2");
  EXPECT_EQ(back.kernels[0].tune[0].rule.multiple, 2);
  EXPECT_EQ(back.kernels[0].tune[1].tag(), "r1v4s4");
  EXPECT_EQ(back.kernels[0].tune[1].split, 4);
  EXPECT_EQ(back.kernels[0].tune[1].variant.launch.cluster, 4);
  EXPECT_NE(bc::to_text(back).find("tune r1v2 (k0_aligned_r1v2:"), std::string::npos) << bc::to_text(back);
  ASSERT_EQ(back.buffers.buffers.size(), 5u);
  EXPECT_EQ(back.buffers.buffers[3].constant.impl(), f.w.impl()) << "the weight is the graph's tensor, not a copy";
  EXPECT_EQ(back.buffers.buffers[4].constant.to_vector<float>(), f.c.to_vector<float>()) << "a constant lowering made";
  EXPECT_EQ(back.blas[0].epilogue.bias, 4);
  EXPECT_EQ(back.blas[0].kind, pt::ops::OpKind::linear);
  // A program with a host step is not cached.
  bc::CudaProgram with_host = f.p;
  with_host.host.emplace_back();
  EXPECT_FALSE(bc::encode_cuda_plan(with_host, *f.in.graph).has_value());
}

TEST(CudaPlanCache, CorruptOrForeignBytesAreAFormatErrorNeverACrash) {
  PlanFixture f;
  const std::string bytes = *bc::encode_cuda_plan(f.p, *f.in.graph);
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(bc::decode_cuda_plan(bytes.substr(0, n), f.in), pt::FormatError) << "truncated to " << n;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x21);
    EXPECT_THROW(bc::decode_cuda_plan(bad, f.in), pt::FormatError) << "byte " << i << " flipped";
  }
  // Valid bytes for another graph: other symbols, or a graph without the referenced constant.
  pt::backend::BackendInput other = f.in;
  other.symbols = {pt::sym::symbol("s1")};
  EXPECT_THROW(bc::decode_cuda_plan(bytes, other), pt::FormatError);
  auto g = std::make_shared<pt::ir::Graph>();
  g->add_constant(f.w, "w");  // the weight is now constant 0; constant 1 does not exist
  other = f.in;
  other.graph = g;
  EXPECT_THROW(bc::decode_cuda_plan(bytes, other), pt::FormatError);
}

TEST(CudaPlanCache, KeyFollowsSmallConstantValuesAndSwitchesNotTheWeightsValues) {
  PlanFixture f;
  const bc::CudaPlanKey k = bc::cuda_plan_key(f.in, "sm_90");
  ASSERT_TRUE(k.cacheable);
  EXPECT_EQ(bc::cuda_plan_key(f.in, "sm_90").key, k.key);
  EXPECT_NE(bc::cuda_plan_key(f.in, "sm_80").key, k.key);
  setenv("PROTEAN_CUDA_FUSED_ATTENTION", "0", 1);
  EXPECT_NE(bc::cuda_plan_key(f.in, "sm_90").key, k.key) << "a backend switch is part of the key";
  unsetenv("PROTEAN_CUDA_FUSED_ATTENTION");
  // Another value of a small constant (the compile may read it) changes the key...
  auto g = std::make_shared<pt::ir::Graph>();
  g->add_constant(pt::full({2}, 7.0), "other");
  g->add_constant(f.w, "w");
  pt::backend::BackendInput in2 = f.in;
  in2.graph = g;
  EXPECT_NE(bc::cuda_plan_key(in2, "sm_90").key, k.key);
  // ...a large one (weights: referenced by the plan, never read by the compile) does not.
  auto big = [](double v) {
    auto g = std::make_shared<pt::ir::Graph>();
    g->add_constant(pt::full({bc::kPlanHashedConstantElements + 1}, v), "weight");
    return g;
  };
  pt::backend::BackendInput a = f.in, b = f.in;
  a.graph = big(1.0);
  b.graph = big(2.0);
  EXPECT_EQ(bc::cuda_plan_key(a, "sm_90").key, bc::cuda_plan_key(b, "sm_90").key);
}

TEST(CudaPlanCache, SecondCompileTakesThePlanAndADamagedEntryIsRenderedAgain) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-cuda-plan-test-{}", ::getpid());
  fs::remove_all(dir);
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  const pt::Tensor bias = pt::randn({8}).to(pt::kCUDA);
  // one compile in a fresh function each time, as a new process would; the launches it makes
  auto compile_and_run = [&]() -> std::vector<std::string> {
    pt::CompileOptions o;
    o.name = "planned_relu";
    o.backend = "cuda";
    auto fn = pt::compile([bias](const pt::Tensor& x) { return pt::add(x.relu(), bias); }, o);
    fake.clear_launches();
    fn(pt::randn({16, 8}).to(pt::kCUDA));
    std::vector<std::string> launched;
    for (const auto& l : fake.launches()) launched.push_back(fmt::format("{} {} {}", l.kernel, l.grid[0], l.block[0]));
    return launched;
  };
  pt::cache::reset_program_cache_stats();
  pt::cache::reset_blob_cache_stats();
  std::vector<std::string> first;
  try {
    first = compile_and_run();
  } catch (const pt::CompileError& e) {
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(pt::cache::program_cache_stats().stores, 1);
  EXPECT_EQ(pt::cache::program_cache_stats().hits, 0);
  pt::cache::clear_blob_memory_cache();
  EXPECT_EQ(compile_and_run(), first) << "the plan from the cache launches what the rendered one did";
  EXPECT_EQ(pt::cache::program_cache_stats().hits, 1);
  EXPECT_EQ(pt::cache::blob_cache_stats().misses, 1) << "the cubin came from the artifact cache: NVRTC ran once";
  // Damage the plan (its .json still names it): reported once, rendered again, the same launches.
  const std::vector<uint64_t> keys = pt::cache::program_keys();
  ASSERT_EQ(keys.size(), 1u);
  const std::string plan = fmt::format("{}/{:016x}.plan", pt::cache::programs_dir(), keys[0]);
  ASSERT_TRUE(fs::exists(plan)) << plan;
  {
    std::fstream fplan(plan, std::ios::in | std::ios::out | std::ios::binary);
    fplan.seekp(12);
    fplan.put('\x7f');
  }
  EXPECT_EQ(compile_and_run(), first);
  EXPECT_EQ(pt::cache::program_cache_stats().corrupt_entries, 1);
  EXPECT_EQ(pt::cache::program_cache_stats().hits, 1);
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}
