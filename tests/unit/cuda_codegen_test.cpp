// The cuda backend's compile half, without a GPU: launch geometry and variant choice (program.h), the
// CUDA schedule policy (loop/schedule_cuda.h), the ptxas report parser, BLAS step classification,
// CHECK-line goldens of the generated CUDA C (tests/golden/cuda), and NVRTC compiles of every cpu
// golden graph and of the differential fuzzer's random programs with a clean ptxas report (skipped
// with a reason where libnvrtc is absent).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>
#include <set>

#include "backend/cuda/attention.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/graphs.h"
#include "backend/cuda/hopper_gemm.h"
#include "backend/cuda/nvrtc.h"
#include "backend/cuda/pipeline.h"
#include "backend/cuda/plan_cache.h"
#include "backend/cuda/program.h"
#include "cpu_test_util.h"
#include "ir_test_util.h"
#include "loop/lower.h"
#include "loop/schedule.h"
#include "loop/parse.h"
#include "loop/schedule_cuda.h"
#include "loop/verify.h"
#include "protean/protean.h"
#include "sym/printer.h"

namespace protean::backend::cuda {
namespace {

using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;

BackendInput input_of(GraphBuilder& b, std::vector<ValueId> outs, std::vector<SymInt> syms) {
  BackendInput in;
  in.graph = std::make_shared<const ir::Graph>(std::move(b.done(std::move(outs))));
  for (const SymInt& s : syms) in.symbols.push_back(s.expr());
  in.compile_id = "0/0";
  return in;
}

CudaCompileOptions render_only(std::map<std::string, int64_t> bounds = {}) {
  CudaCompileOptions o;
  o.compile = false;
  o.schedule.upper_bounds = std::move(bounds);
  return o;
}

// ---- program.h: launch geometry and variants ----------------------------------------------------

TEST(CudaProgram, LaunchDimsPerShape) {
  const sym::Expr s0 = sym::symbol("s0"), s1 = sym::symbol("s1");
  const std::vector<sym::Expr> syms = {s0, s1};
  LaunchRule r;
  r.shape = LaunchShape::GridStride;
  r.work = sym::mul(s0, s1);
  r.block_threads = 256;
  r.items_per_thread = 4;
  r.max_blocks = 100;
  std::vector<int64_t> v = {10, 100};  // 1000 elements, 1024 per block
  EXPECT_EQ(launch_dims(r, syms, v).grid, 1u);
  v = {1000, 1000};  // 10^6 elements: 977 blocks, capped at 100
  EXPECT_EQ(launch_dims(r, syms, v).grid, 100u);
  EXPECT_EQ(launch_dims(r, syms, v).block, 256u);
  v = {0, 7};
  EXPECT_EQ(launch_dims(r, syms, v).grid, 0u);

  r.shape = LaunchShape::BlockPerRow;
  r.work = s0;
  v = {37, 5};
  EXPECT_EQ(launch_dims(r, syms, v).grid, 37u);
  r.shape = LaunchShape::WarpPerRow;
  r.block_threads = 128;
  r.rows_per_block = 4;
  EXPECT_EQ(launch_dims(r, syms, v).grid, 10u);  // ceil(37 / 4)
  EXPECT_EQ(launch_dims(r, syms, v).block, 128u);
  // fewer rows per block until the grid fills `fill_blocks` multiprocessors, a row each at the least
  r.fill_blocks = 16;
  EXPECT_EQ(launch_dims(r, syms, v).grid, 19u);  // 10 blocks of 4 rows < 16: ceil(37 / 2)
  EXPECT_EQ(launch_dims(r, syms, v).block, 64u);
  r.fill_blocks = 132;
  EXPECT_EQ(launch_dims_at(r, 37, 0).grid, 37u);  // one row a block is the least
  EXPECT_EQ(launch_dims_at(r, 37, 0).block, 32u);
  EXPECT_EQ(launch_dims_at(r, 448, 0).grid, 224u);  // 112 blocks of 4 would leave 20 of 132 idle
  EXPECT_EQ(launch_dims_at(r, 448, 0).block, 64u);
  EXPECT_EQ(launch_dims_at(r, 528, 0).grid, 132u);  // 4 rows a block fill them
  EXPECT_EQ(launch_dims_at(r, 528, 0).block, 128u);
  EXPECT_EQ(launch_dims_at(r, 0, 0).grid, 0u);
  r.fill_blocks = 0;
  EXPECT_EQ(launch_dims_at(r, 448, 0).grid, 112u);  // fixed rows per block
  EXPECT_EQ(launch_dims_at(r, 448, 0).block, 128u);
  r.shape = LaunchShape::Single;
  EXPECT_EQ(launch_dims(r, syms, v).grid, 1u);

  // a row kept in registers refuses a longer row instead of running short
  r.shape = LaunchShape::BlockPerRow;
  r.row_length = s1;
  r.row_capacity = 4096;
  v = {2, 4096};
  EXPECT_EQ(launch_dims(r, syms, v).grid, 2u);
  v = {2, 4097};
  EXPECT_THROW(launch_dims(r, syms, v), ShapeError);
  // an unbound symbol is an error naming it
  LaunchRule u;
  u.work = sym::symbol("s7");
  try {
    launch_dims(u, syms, v);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("s7"), std::string::npos) << e.what();
  }
}

TEST(CudaProgram, VariantSelectionFollowsSizesAndAlignment) {
  const sym::Expr s0 = sym::symbol("s0"), s1 = sym::symbol("s1");
  const std::vector<sym::Expr> syms = {s0, s1};
  CudaKernel k;
  k.general.entry = "kernel0_general";
  k.aligned.entry = "kernel0_aligned";
  k.rule.divisible = {s1, sym::mul(sym::integer(3), s0)};
  k.rule.multiple = 4;
  k.rule.aligned_buffers = {0, 2};
  auto aligned = [](int) -> uint64_t { return 0x10000; };
  auto off = [](int b) -> uint64_t { return b == 2 ? 0x10008 : 0x10000; };
  std::vector<int64_t> v = {4, 64};
  EXPECT_EQ(select_variant(k, syms, v, aligned).entry, "kernel0_aligned");
  EXPECT_EQ(select_variant(k, syms, v, off).entry, "kernel0_general");  // a buffer 8 bytes off
  v = {4, 66};
  EXPECT_EQ(select_variant(k, syms, v, aligned).entry, "kernel0_general");  // s1 % 4 != 0
  v = {6, 64};
  EXPECT_EQ(select_variant(k, syms, v, aligned).entry, "kernel0_general");  // 3 * s0 % 4 != 0
  v = {8, 64};
  EXPECT_TRUE(use_aligned_variant(k, syms, v, aligned));
  // a size bound on top (the attention kernel's Hopper form from a query length on)
  k.rule.size = sym::add(s1, sym::integer(1));
  k.rule.at_least = 66;
  EXPECT_EQ(select_variant(k, syms, v, aligned).entry, "kernel0_general");  // s1 + 1 = 65 < 66
  v = {8, 68};
  EXPECT_EQ(select_variant(k, syms, v, aligned).entry, "kernel0_aligned");
  // one entry for both: never "aligned"
  k.aligned.entry = k.general.entry = "kernel0";
  EXPECT_FALSE(use_aligned_variant(k, syms, v, aligned));
}

TEST(CudaProgram, CubinKeyChangesWithEachPart) {
  CubinKey a{1, "13.0", "sm_90", "--fmad=false", "0.1.0"};
  const uint64_t h = a.combined();
  CubinKey b = a;
  b.source_hash = 2;
  EXPECT_NE(b.combined(), h);
  b = a;
  b.nvrtc_version = "13.1";
  EXPECT_NE(b.combined(), h);
  b = a;
  b.arch = "sm_90a";
  EXPECT_NE(b.combined(), h);
  b = a;
  b.flags = "";
  EXPECT_NE(b.combined(), h);
  b = a;
  b.protean_version = "0.2.0";
  EXPECT_NE(b.combined(), h);
  EXPECT_EQ(a.combined(), h);
}

// ---- the schedule policy -----------------------------------------------------------------------

TEST(CudaSchedule, UpperBounds) {
  const sym::Expr s0 = sym::symbol("s0"), s1 = sym::symbol("s1");
  std::map<std::string, int64_t> b = {{"s0", 100}, {"s1", 7}};
  EXPECT_EQ(loop::upper_bound(sym::mul(s0, s1), b), 700);
  EXPECT_EQ(loop::upper_bound(sym::add(s0, sym::integer(-1)), b), 99);
  EXPECT_EQ(loop::upper_bound(sym::floordiv(s0, sym::integer(3)), b), 33);
  EXPECT_EQ(loop::upper_bound(sym::ceildiv(s0, sym::integer(3)), b), 34);
  EXPECT_EQ(loop::upper_bound(sym::maximum(s0, s1), b), 100);
  EXPECT_FALSE(loop::upper_bound(sym::sub(s1, s0), b).has_value());  // decreasing in s0
  EXPECT_FALSE(loop::upper_bound(sym::mul(s0, sym::symbol("s2")), b).has_value());
  EXPECT_EQ(loop::upper_bound(sym::integer(4096), {}), 4096);
}

/// The kernels of a graph with their CUDA schedules (Kernel::schedule).
std::vector<loop::Kernel> schedules_of(GraphBuilder& b, std::vector<ValueId> outs, std::vector<SymInt> syms,
                                       std::map<std::string, int64_t> bounds = {}, int warp_rows_per_block = 4) {
  BackendInput in = input_of(b, std::move(outs), std::move(syms));
  loop::Program p = loop::lower_graph(*in.graph, in.symbols);
  loop::schedule_program(p);
  loop::CudaScheduleOptions o;
  o.upper_bounds = std::move(bounds);
  o.warp_rows_per_block = warp_rows_per_block;
  loop::apply_schedule(p, loop::CudaSchedulePolicy(o));
  EXPECT_NO_THROW(loop::verify(p, "cuda schedule policy"));
  return p.kernels;
}

TEST(CudaSchedule, RowFormFollowsTheRowsUpperBound) {
  {  // constant row of 4096 f32 with a stash (softmax's exp): 8 bytes per element, so 8 values per
     // thread (64 of the 96 register bytes), a block of 512
    GraphBuilder b("softmax");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, 4096})}, {{"dim", SymInt(-1)}});
    auto k = schedules_of(b, {y}, {s0});
    ASSERT_EQ(k.size(), 1u);
    const loop::Schedule& s = k[0].schedule;
    EXPECT_EQ(s.target, "cuda");
    EXPECT_EQ(s.gpu_form, loop::GpuForm::BlockPerRow) << loop::schedule_text(k[0]);
    EXPECT_EQ(s.block_threads, 512);
    EXPECT_EQ(s.min_blocks, 2);  // >= 1024 resident threads: at most 64 registers
    EXPECT_TRUE(s.rows_persist);
    EXPECT_EQ(s.persist_chunks, 8);
    EXPECT_EQ(s.vector_width, 4);
    EXPECT_EQ(s.vector_bytes, 16);
    EXPECT_FALSE(s.index32);  // s0 unbounded
    EXPECT_NE(loop::schedule_text(k[0]).find("grid block_per_row, block_threads 512, min_blocks 2, persist 8, index64"),
              std::string::npos)
        << loop::schedule_text(k[0]);
  }
  {  // layer_norm over 4096 f32 (no stash): 16 values per thread (64 bytes), a block of 256
    GraphBuilder b("ln");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId x = b.input("x", {s0, 4096});
    ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {4096}), b.input("b", {4096})},
                       {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
    auto k = schedules_of(b, {n}, {s0});
    ASSERT_EQ(k.size(), 1u);
    EXPECT_EQ(k[0].schedule.gpu_form, loop::GpuForm::BlockPerRow) << loop::schedule_text(k[0]);
    EXPECT_EQ(k[0].schedule.block_threads, 256);
    EXPECT_EQ(k[0].schedule.persist_chunks, 16);
  }
  {  // symbolic row without a bound: a block of 256, streamed, 64-bit index math
    GraphBuilder b("softmax_sym");
    SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 100);
    ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, s1})}, {{"dim", SymInt(-1)}});
    auto k = schedules_of(b, {y}, {s0, s1});
    ASSERT_EQ(k.size(), 1u);
    EXPECT_EQ(k[0].schedule.gpu_form, loop::GpuForm::BlockPerRow);
    EXPECT_EQ(k[0].schedule.block_threads, 256);
    EXPECT_FALSE(k[0].schedule.rows_persist);
    EXPECT_FALSE(k[0].schedule.index32);
  }
  {  // the same with bounds s1 <= 200, s0 <= 4096: one warp per row, row in registers, 32-bit index math
    GraphBuilder b("softmax_bounded");
    SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 100);
    ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, s1})}, {{"dim", SymInt(-1)}});
    auto k = schedules_of(b, {y}, {s0, s1}, {{"s0", 4096}, {"s1", 200}});
    ASSERT_EQ(k.size(), 1u);
    const loop::Schedule& s = k[0].schedule;
    EXPECT_EQ(s.gpu_form, loop::GpuForm::WarpPerRow) << loop::schedule_text(k[0]);
    EXPECT_EQ(s.rows_per_block, 4);
    EXPECT_EQ(s.block_threads, 128);
    EXPECT_TRUE(s.rows_persist);
    EXPECT_EQ(s.persist_chunks, 7);  // ceil(200 / 32)
    EXPECT_TRUE(s.index32);
    for (size_t j = 0; j < s.stages.size(); ++j)
      if (k[0].stages[j].kind == loop::StageKind::Reduction) {
        EXPECT_EQ(s.stages[j].reduction, loop::ReductionStrategy::Warp);
      }
    // CudaScheduleOptions::warp_rows_per_block (PROTEAN_CUDA_WARP_ROWS_PER_BLOCK) sets the block
    for (int rows : {1, 2}) {
      GraphBuilder b2("softmax_bounded");
      SymInt t0 = b2.symbol("x.size()[0]", 8), t1 = b2.symbol("x.size()[1]", 100);
      ValueId y2 = b2.call(OpKind::softmax, {b2.input("x", {t0, t1})}, {{"dim", SymInt(-1)}});
      auto k2 = schedules_of(b2, {y2}, {t0, t1}, {{"s0", 4096}, {"s1", 200}}, rows);
      EXPECT_EQ(k2[0].schedule.rows_per_block, rows);
      EXPECT_EQ(k2[0].schedule.block_threads, 32 * rows);
    }
  }
  {  // pointwise: grid-stride; a full reduction: one block
    GraphBuilder b("pw");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId x = b.input("x", {s0, 64});
    ValueId e = b.call(OpKind::exp, {x});
    ValueId t = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{0, 1}}, {"keepdim", false}});
    auto k = schedules_of(b, {e, t}, {s0});
    ASSERT_EQ(k.size(), 2u);
    int grid_stride = 0, single = 0;
    for (const auto& kk : k) {
      grid_stride += kk.schedule.gpu_form == loop::GpuForm::GridStride;
      single += kk.schedule.gpu_form == loop::GpuForm::SingleBlock;
    }
    EXPECT_EQ(grid_stride, 1);
    EXPECT_EQ(single, 1);
  }
}

TEST(CudaSchedule, MarkedBoundsReachTheBackendInput) {
  // a recording backend: what capture hands a backend about the symbols' upper bounds
  static std::map<std::string, int64_t> seen;
  backend::register_backend("record_bounds", [](const BackendInput& in) {
    seen = in.upper_bounds;
    return backend::make_artifact("interp", in);
  });
  auto body = [](const Tensor& x) { return protean::softmax(x, -1); };
  {  // mark_dynamic with a max: that max is the bound (the guards keep it)
    Tensor x = protean::randn({8, 64});
    protean::mark_dynamic(x, 0, 2, 1000);
    protean::CompileOptions o;
    o.backend = "record_bounds";
    auto f = protean::compile(body, o);
    seen.clear();
    f(x);
    ASSERT_EQ(seen.size(), 1u);
    EXPECT_EQ(seen.begin()->second, 1000);
  }
  {  // dynamic without marks: no finite bound, nothing passed
    Tensor x = protean::randn({8, 64});
    protean::CompileOptions o;
    o.backend = "record_bounds";
    o.dynamic = protean::Dynamic::On;
    auto f = protean::compile(body, o);
    seen = {{"stale", 1}};
    f(x);
    EXPECT_TRUE(seen.empty());
  }
}

TEST(CudaSchedule, BackendInputBoundsKeepTheRowInRegisters) {
  // softmax over a symbolic row: unbounded streams the row; BackendInput::upper_bounds (s1 <= 8192)
  // keeps it in registers, and the launch then sizes its block to the row
  auto program = [](std::map<std::string, int64_t> bounds) {
    GraphBuilder b("softmax_bounds");
    SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 100);
    ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, s1}, DType::BF16)}, {{"dim", SymInt(-1)}});
    BackendInput in = input_of(b, {y}, {s0, s1});
    in.upper_bounds = std::move(bounds);
    return compile_cuda_program(in, render_only());
  };
  const CudaProgram open = program({});
  EXPECT_EQ(open.kernels[0].general.launch.row_capacity, 0);
  EXPECT_EQ(open.source.find("pr0"), std::string::npos);
  const CudaProgram bounded = program({{"s0", 65536}, {"s1", 8192}});
  const LaunchRule& r = bounded.kernels[0].aligned.launch;
  EXPECT_EQ(r.block_threads, 512);
  EXPECT_EQ(r.row_capacity, 8192);
  EXPECT_TRUE(r.block_from_row);
  EXPECT_NE(bounded.source.find("pt::Vec<pt::u16, 8, 16> pr0[2];"), std::string::npos) << bounded.source;
  {  // PROTEAN_CUDA_WIDEN_ROW_VALUES=16: the 16 values per thread are widened once, as they are loaded
    setenv("PROTEAN_CUDA_WIDEN_ROW_VALUES", "16", 1);
    const CudaProgram wide = program({{"s0", 65536}, {"s1", 8192}});
    unsetenv("PROTEAN_CUDA_WIDEN_ROW_VALUES");
    EXPECT_NE(wide.source.find("float pr0[16];"), std::string::npos) << wide.source;
    EXPECT_NE(wide.source.find("for (int l = 0; l < 8; ++l) pr0[c * 8 + l] = pt::bf16_lane(v, l);"), std::string::npos);
    EXPECT_EQ(wide.source.find("pt::bf16_lane(pr0[c]"), std::string::npos);
    if (nvrtc_available()) {  // compiles, without spills
      const NvrtcResult r = nvrtc_compile(wide.source, "softmax_wide.cu");
      EXPECT_FALSE(r.resources.empty()) << r.log;
      for (const auto& [entry, info] : r.resources) EXPECT_EQ(info.spill_stores, 0) << entry;
    }
  }
  const std::vector<int64_t> v = {100, 4096};  // a 4096 row: 256 threads of the 512 the bound needs
  EXPECT_EQ(launch_dims(r, bounded.symbols, v).block, 256u);
  EXPECT_EQ(launch_dims(r, bounded.symbols, std::vector<int64_t>{100, 8192}).block, 512u);
  EXPECT_EQ(launch_dims(r, bounded.symbols, std::vector<int64_t>{100, 40}).block, 32u);
}

TEST(CudaSchedule, ScheduleTextParsesBack) {
  GraphBuilder b("softmax_text");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, 4096})}, {{"dim", SymInt(-1)}});
  BackendInput in = input_of(b, {y}, {s0});
  loop::Program p = loop::lower_graph(*in.graph, in.symbols);
  loop::schedule_program(p);
  loop::apply_schedule(p, loop::CudaSchedulePolicy());
  const std::string text = loop::to_text(p);
  loop::Program q = loop::parse_program(text);
  EXPECT_EQ(loop::to_text(q), text);
  EXPECT_EQ(q.kernels[0].schedule.gpu_form, loop::GpuForm::BlockPerRow);
  EXPECT_EQ(q.kernels[0].schedule.persist_chunks, 8);
}

// ---- ptxas report, BLAS steps ---------------------------------------------------------------------

TEST(CudaNvrtc, ParsesThePtxasReport) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kernel0_general' for 'sm_90'\n"
      "ptxas info    : Function properties for kernel0_general\n"
      "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
      "ptxas info    : Used 40 registers, used 1 barriers, 128 bytes smem, 380 bytes cmem[0]\n"
      "ptxas info    : Compile time = 1.5 ms\n"
      "ptxas info    : Compiling entry function 'kernel1' for 'sm_90'\n"
      "ptxas info    : Function properties for kernel1\n"
      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 12 registers, used 0 barriers\n";
  auto r = parse_ptxas_info(log);
  ASSERT_EQ(r.size(), 2u);
  const PtxasInfo& a = r.at("kernel0_general");
  EXPECT_EQ(a.registers, 40);
  EXPECT_EQ(a.stack_bytes, 16);
  EXPECT_EQ(a.spill_stores, 8);
  EXPECT_EQ(a.spill_loads, 4);
  EXPECT_EQ(a.shared_bytes, 128);
  EXPECT_EQ(a.constant_bytes, 380);
  EXPECT_EQ(r.at("kernel1").registers, 12);
  EXPECT_EQ(r.at("kernel1").shared_bytes, 0);
}

TEST(CudaPipeline, MatrixProductsBecomeBlasStepsOthersHostSteps) {
  GraphBuilder b("blas");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 64});
  ValueId w = b.input("w", {32, 64});
  ValueId bias = b.input("bias", {32});
  ValueId lin = b.call(OpKind::linear, {x, w, bias});
  ValueId x3 = b.input("x3", {s0, 5, 64});
  ValueId w2 = b.input("w2", {64, 16});
  ValueId mm = b.call(OpKind::matmul, {x3, w2});
  ValueId am = b.call(OpKind::argmax, {x}, {{"dim", SymInt(1)}, {"keepdim", false}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {lin, mm, am}, {s0}), render_only(), &info);
  ASSERT_EQ(p.blas.size(), 2u) << to_text(p);
  const BlasStep& l = p.blas[0];
  EXPECT_EQ(l.op, BlasOp::Linear);
  EXPECT_TRUE(l.transpose_b);
  EXPECT_EQ(sym::print(l.m), "s0");
  EXPECT_EQ(sym::print(l.n), "32");
  EXPECT_EQ(sym::print(l.k), "64");
  EXPECT_GE(l.epilogue.bias, 0);
  const BlasStep& m = p.blas[1];
  EXPECT_EQ(m.op, BlasOp::Matmul);
  EXPECT_EQ(sym::print(m.m), "5*s0");  // the batch flattens into rows
  EXPECT_EQ(sym::print(m.n), "16");
  ASSERT_EQ(p.host.size(), 1u);
  EXPECT_EQ(p.host[0].ext.op, OpKind::argmax);
  EXPECT_EQ(p.host[0].reason, "no GPU lowering");
  EXPECT_EQ(info.blas, 2);
  EXPECT_EQ(info.host, 1);
  EXPECT_EQ(p.steps.size(), 3u);
}

// LayerNorm over [1, s, 64] read as [s, 64] by the next projection (GPT-2's exported form): the
// statistics over [1, s] rows and the normalization over [s, 64] are one kernel (row fusion across
// the dropped dim of size 1), then the product.
TEST(CudaPipeline, LayerNormBeforeAProjectionIsOneKernel) {
  GraphBuilder b("ln_proj");
  SymInt s0 = b.symbol("x.size()[1]", 40);
  // two [s, 64] rows viewed as [1, s, 64] and added (the token and position embeddings)
  ValueId e1 = b.call(OpKind::reshape, {b.input("e1", {s0, 64}, DType::BF16)}, {{"shape", SymIntVec{1, s0, 64}}});
  ValueId e2 = b.call(OpKind::reshape, {b.input("e2", {s0, 64}, DType::BF16)}, {{"shape", SymIntVec{1, s0, 64}}});
  ValueId xf = b.call(OpKind::cast, {b.call(OpKind::add, {e1, e2})}, {{"dtype", DType::F32}});
  ValueId n = b.call(OpKind::layer_norm, {xf, b.input("w", {64}), b.input("b", {64})},
                     {{"normalized_shape", SymIntVec{64}}, {"eps", 1e-5}});
  ValueId h = b.call(OpKind::reshape, {b.call(OpKind::cast, {n}, {{"dtype", DType::BF16}})}, {{"shape", SymIntVec{-1, 64}}});
  ValueId y = b.call(OpKind::matmul, {h, b.input("p", {64, 96}, DType::BF16)});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), render_only(), &info);
  ASSERT_EQ(p.kernels.size(), 1u) << "statistics and normalization in one launch: " << to_text(p);
  EXPECT_EQ(p.blas.size(), 1u) << to_text(p);
  EXPECT_NE(info.loop_ir.find("reduce_welford"), std::string::npos) << info.loop_ir;
}

// A LayerNorm read only by a projection with constant weights (GPT-2's ln_1 -> c_attn and ln_2 ->
// c_fc): marked for the generated product (program.h: LayerNormPrologue), gamma folded into a copy of
// the weight, the column vectors derived. The fused form's arithmetic, done here in f64 from the plan's
// constants (the row statistics of x, x . W', the epilogue), matches layer_norm(x) . W + bias, on rows
// whose mean is far from 0 too; the plan survives the program cache, the derived constants made again
// from the recipe. Not folded: another reader of the LayerNorm, a weight that is an input, a target
// other than compute capability 9.0, PROTEAN_CUDA_FOLD_LAYER_NORM=0.
TEST(CudaPipeline, LayerNormBeforeAConstantProjectionFoldsIntoTheProduct) {
  const int64_t K = 128, N = 256;
  protean::manual_seed(21);
  const Tensor gamma = protean::add(protean::mul(protean::randn({K}), 0.2), 1.0), beta = protean::mul(protean::randn({K}), 0.1);
  const Tensor w_kn = protean::mul(protean::randn({K, N}), 0.1).to(DType::BF16);
  const Tensor w_nk = protean::mul(protean::randn({N, K}), 0.1).to(DType::BF16);
  const Tensor bias = protean::randn({N}).to(DType::BF16);
  enum class Form { Matmul, Linear, SecondReader, WeightInput };
  auto program = [&](Form form, const std::string& arch, CudaCompileInfo* info, BackendInput* keep = nullptr) {
    GraphBuilder b("ln_fold");
    SymInt s0 = b.symbol("x.size()[0]", 40);
    ValueId xf = b.call(OpKind::cast, {b.input("x", {s0, K}, DType::BF16)}, {{"dtype", DType::F32}});
    ValueId n = b.call(OpKind::layer_norm, {xf, b.constant(gamma, "gamma"), b.constant(beta, "beta")},
                       {{"normalized_shape", SymIntVec{K}}, {"eps", 1e-5}});
    ValueId h = b.call(OpKind::cast, {n}, {{"dtype", DType::BF16}});
    std::vector<ValueId> outs;
    if (form == Form::Linear) outs.push_back(b.call(OpKind::linear, {h, b.constant(w_nk, "w"), b.constant(bias, "bias")}));
    else if (form == Form::WeightInput) outs.push_back(b.call(OpKind::matmul, {h, b.input("w", {K, N}, DType::BF16)}));
    else outs.push_back(b.call(OpKind::matmul, {h, b.constant(w_kn, "w")}));
    if (form == Form::SecondReader) outs.push_back(h);
    BackendInput in = input_of(b, std::move(outs), {s0});
    if (keep) *keep = in;
    CudaCompileOptions o = render_only();
    o.nvrtc.arch = arch;
    return compile_cuda_program(in, o, info);
  };
  for (Form form : {Form::Matmul, Form::Linear}) {
    SCOPED_TRACE(form == Form::Matmul ? "matmul, W [k, n]" : "linear, W [n, k], with a bias");
    CudaCompileInfo info;
    BackendInput in;
    const CudaProgram p = program(form, "sm_90a", &info, &in);
    EXPECT_EQ(info.folded_layer_norms, 1) << to_text(p);
    ASSERT_EQ(p.blas.size(), 1u) << to_text(p);
    const BlasStep& s = p.blas[0];
    ASSERT_TRUE(s.has_prologue()) << to_text(p);
    const LayerNormPrologue& pr = s.prologue;
    ASSERT_EQ(p.steps[static_cast<size_t>(pr.kernel_step)].kind, StepKind::Kernel);
    EXPECT_EQ(p.steps[static_cast<size_t>(pr.kernel_step)].prologue_of, 0);
    EXPECT_NEAR(pr.eps, 1e-5, 1e-12);
    EXPECT_NE(to_text(p).find("layer_norm prologue: step"), std::string::npos) << to_text(p);
    const Tensor& wf = p.buffers.buffers[static_cast<size_t>(pr.weight)].constant;
    const Tensor& vec = p.buffers.buffers[static_cast<size_t>(pr.vectors)].constant;
    ASSERT_TRUE(wf.defined() && vec.defined());
    EXPECT_EQ(wf.int_sizes(), (form == Form::Matmul ? IntVec{K, N} : IntVec{N, K}));
    EXPECT_EQ(vec.int_sizes(), (IntVec{2, N}));
    // the fused arithmetic on the host, in f64, against the reference
    const int64_t M = 5;
    const Tensor x = protean::add(protean::randn({M, K}), protean::full({M, 1}, 6.0)).to(DType::BF16);
    const std::vector<float> xv = x.to(DType::F32).to_vector<float>(), wv = wf.to(DType::F32).to_vector<float>();
    const std::vector<float> cv = vec.to_vector<float>(), bv = bias.to(DType::F32).to_vector<float>();
    const Tensor w = form == Form::Matmul ? w_kn : w_nk;
    Tensor ref = protean::matmul(protean::layer_norm(x.to(DType::F64), {K}, gamma.to(DType::F64), beta.to(DType::F64), 1e-5),
                                 form == Form::Matmul ? w.to(DType::F64) : w.to(DType::F64).transpose(0, 1));
    if (form == Form::Linear) ref = protean::add(ref, bias.to(DType::F64));
    const std::vector<double> rv = ref.contiguous().to_vector<double>();
    double err = 0, norm = 0;
    for (int64_t m = 0; m < M; ++m) {
      double s1 = 0, s2 = 0;
      for (int64_t k = 0; k < K; ++k) s1 += xv[static_cast<size_t>(m * K + k)];
      const double mean = s1 / K;
      for (int64_t k = 0; k < K; ++k) s2 += (xv[static_cast<size_t>(m * K + k)] - mean) * (xv[static_cast<size_t>(m * K + k)] - mean);
      const double rstd = 1.0 / std::sqrt(s2 / K + 1e-5);
      for (int64_t n2 = 0; n2 < N; ++n2) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += xv[static_cast<size_t>(m * K + k)] * wv[static_cast<size_t>(form == Form::Matmul ? k * N + n2 : n2 * K + k)];
        double out = rstd * (acc - mean * cv[static_cast<size_t>(n2)]) + cv[static_cast<size_t>(N + n2)];
        if (form == Form::Linear) out += bv[static_cast<size_t>(n2)];
        const double r = rv[static_cast<size_t>(m * N + n2)];
        err += (out - r) * (out - r);
        norm += r * r;
      }
    }
    EXPECT_LT(std::sqrt(err / norm), 4e-3) << "the folded arithmetic against layer_norm(x) . W";
    // the program cache keeps the recipe; the derived constants are made again, equal
    const std::optional<std::string> bytes = encode_cuda_plan(p, *in.graph);
    ASSERT_TRUE(bytes.has_value()) << "a folded plan is cacheable";
    EXPECT_LT(bytes->size(), static_cast<size_t>(K * N)) << "the folded weight's bytes are not stored";
    const CudaProgram back = decode_cuda_plan(*bytes, in);
    EXPECT_EQ(to_text(back), to_text(p));
    EXPECT_EQ(back.buffers.buffers[static_cast<size_t>(pr.weight)].constant.to(DType::F32).to_vector<float>(), wv);
    EXPECT_EQ(back.buffers.buffers[static_cast<size_t>(pr.vectors)].constant.to_vector<float>(), cv);
    // a plan whose checksum holds but whose prologue does not add up is a FormatError naming it
    auto refused = [&](const std::function<void(CudaProgram&)>& damage, const std::string& says) {
      CudaProgram bad = p;
      damage(bad);
      const std::optional<std::string> b = encode_cuda_plan(bad, *in.graph);
      ASSERT_TRUE(b.has_value());
      try {
        (void)decode_cuda_plan(*b, in);
        ADD_FAILURE() << "decoded: " << says;
      } catch (const protean::FormatError& e) {
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    };
    refused([&](CudaProgram& b) { b.blas[0].prologue.weight = b.blas[0].b; }, "is not a derived constant");
    refused([&](CudaProgram& b) { b.steps[static_cast<size_t>(pr.kernel_step)].prologue_of = -1; }, "not marked as its prologue");
    refused([&](CudaProgram& b) { b.blas[0].prologue.gamma = b.blas[0].out; }, "gamma b");
    refused([&](CudaProgram& b) { b.blas[0].prologue.eps = -1.0; }, "prologue eps");
  }
  {  // x from a product before it, the output read by a kernel after it: the folded product is
     // captured into a bucket's graph (Padded), and x's life reaches it
    GraphBuilder b("ln_fold_chain");
    SymInt s0 = b.symbol("x.size()[0]", 40);
    ValueId x = b.call(OpKind::add, {b.call(OpKind::matmul, {b.input("x", {s0, K}, DType::BF16), b.constant(protean::mul(protean::randn({K, K}), 0.1).to(DType::BF16), "w0")}),
                                     b.constant(protean::full({K}, 3.0, DType::BF16), "b0")});
    ValueId n = b.call(OpKind::layer_norm, {b.call(OpKind::cast, {x}, {{"dtype", DType::F32}}), b.constant(gamma, "gamma"),
                                            b.constant(beta, "beta")},
                       {{"normalized_shape", SymIntVec{K}}, {"eps", 1e-5}});
    ValueId y = b.call(OpKind::matmul, {b.call(OpKind::cast, {n}, {{"dtype", DType::BF16}}), b.constant(w_kn, "w")});
    // the stream x read again by the last product's residual (GPT-2's residual stream), so it is stored
    ValueId out = b.call(OpKind::add, {b.call(OpKind::matmul, {b.call(OpKind::tanh, {y}), b.constant(w_nk, "w2")}), x});
    CudaCompileOptions o = render_only();
    o.nvrtc.arch = "sm_90a";
    const CudaProgram p = compile_cuda_program(input_of(b, {out}, {s0}), o);
    ASSERT_EQ(p.blas.size(), 3u) << to_text(p);
    ASSERT_TRUE(p.blas[1].has_prologue()) << to_text(p);
    EXPECT_EQ(p.blas[1].prologue.x, p.blas[0].out) << to_text(p);
    const std::vector<LibraryNodePlan> lib = library_plan(p);
    ASSERT_EQ(lib.size(), 3u);
    EXPECT_EQ(lib[0].how, LibraryCapture::Plain) << "it reads the input";
    EXPECT_EQ(lib[1].how, LibraryCapture::Padded) << lib[1].why;
    for (size_t i = 0; i + 1 < p.steps.size(); ++i)  // x is released at the folded product's step or later
      for (int r : p.steps[i].release) EXPECT_TRUE(r != p.blas[1].prologue.x || i >= static_cast<size_t>(p.blas[1].prologue.kernel_step) + 1) << to_text(p);
  }
  CudaCompileInfo info;
  EXPECT_FALSE(program(Form::SecondReader, "sm_90a", &info).blas[0].has_prologue()) << "the LayerNorm is also an output";
  EXPECT_FALSE(program(Form::WeightInput, "sm_90a", &info).blas[0].has_prologue()) << "the weight is an input";
  EXPECT_FALSE(program(Form::Matmul, "sm_80", &info).blas[0].has_prologue()) << "no generated products there";
  setenv("PROTEAN_CUDA_FOLD_LAYER_NORM", "0", 1);
  EXPECT_FALSE(program(Form::Matmul, "sm_90a", &info).blas[0].has_prologue());
  unsetenv("PROTEAN_CUDA_FOLD_LAYER_NORM");
}

// A transformer's residual stream in bf16: x + y1 + y2 + ..., each y a product and each partial sum
// read by a LayerNorm and the next add. A sum that loads more than one buffer is stored by the
// LayerNorm's kernel itself: its first stage writes the sum, the row's threads wait for each other
// (the warp's __syncwarp), and the statistics and the normalization read it back. No kernel reads more
// than two of the stream's buffers (inlined into every LayerNorm, the last one read all nine). Here a
// tanh sits between the product and the add, so no epilogue takes the add (next test).
TEST(CudaPipeline, AResidualStreamIsStoredByTheLayerNormThatReadsIt) {
  GraphBuilder b("residual_stream");
  SymInt s0 = b.symbol("x.size()[0]", 40);
  ValueId x = b.input("x", {s0, 256}, DType::BF16);
  ValueId w = b.input("w", {256, 256}, DType::BF16);
  ValueId g = b.input("g", {256}, DType::BF16);
  auto ln = [&](ValueId v) {
    return b.call(OpKind::layer_norm, {v, g, ir::kNoValue}, {{"normalized_shape", SymIntVec{256}}, {"eps", 1e-5}});
  };
  ValueId r = x;
  for (int i = 0; i < 8; ++i) r = b.call(OpKind::add, {r, b.call(OpKind::tanh, {b.call(OpKind::matmul, {ln(r), w})})});
  BackendInput in = input_of(b, {ln(r)}, {s0});
  {  // the loop program the cuda pipeline schedules (bf16 storage, f32 compute)
    loop::LowerOptions lo;
    lo.half_storage = true;
    loop::Program lp = loop::lower_graph(*in.graph, in.symbols, lo);
    loop::schedule_program(lp);
    int stored = 0;
    for (const loop::Kernel& k : lp.kernels) {
      std::set<int> stream, own;  // the [s0, 256] buffers the kernel reads; those it writes (read back)
      for (const loop::Stage& st : k.stages) own.insert(st.out);
      for (const loop::Stage& st : k.stages) {
        std::function<void(const loop::SExpr&)> walk = [&](const loop::SExpr& e) {
          if (e->op == loop::SOp::Load && lp.buffers[static_cast<size_t>(e->buffer)].sizes.size() == 2 && !own.count(e->buffer))
            stream.insert(e->buffer);
          for (const auto& a : e->args) walk(a);
        };
        walk(st.body);
      }
      EXPECT_LE(stream.size(), 2u) << k.name << ":\n" << loop::to_text(lp);
      if (k.stages.size() > 1 && k.stages[0].kind == loop::StageKind::Pointwise && !k.stages[0].inner.empty()) ++stored;
    }
    EXPECT_GE(stored, 3) << loop::to_text(lp);
  }
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(in, render_only({{"s0", 512}}), &info);
  EXPECT_EQ(p.kernels.size(), 9u) << info.loop_ir;
  // the row's lanes wait after the stage that stores the sum, before the statistics read it back
  const size_t store = p.source.find("// stage 0: pointwise");
  ASSERT_NE(store, std::string::npos) << p.source;
  const size_t sync = p.source.find("__syncwarp();", store), stats = p.source.find("// stage 1:", store);
  EXPECT_LT(sync, stats) << p.source;
}

// GPT-2's form of the stream: r = r + (ln(r) · W + bias). The add the LayerNorm's kernel would store
// first is the product's epilogue (bias, then the residual with beta = 1): the product writes the
// stream, and every LayerNorm but the last reads that one buffer.
TEST(CudaPipeline, AResidualAddBeforeALayerNormIsTheProductsEpilogue) {
  GraphBuilder b("residual_epilogue");
  SymInt s0 = b.symbol("x.size()[1]", 40);
  ValueId x = b.input("x", {1, s0, 256}, DType::BF16);
  ValueId w = b.input("w", {256, 256}, DType::BF16);
  ValueId bias = b.input("bias", {256}, DType::BF16);
  ValueId g = b.input("g", {256}, DType::BF16);
  auto ln = [&](ValueId v) {
    return b.call(OpKind::layer_norm, {v, g, ir::kNoValue}, {{"normalized_shape", SymIntVec{256}}, {"eps", 1e-5}});
  };
  ValueId r = x;
  for (int i = 0; i < 6; ++i) r = b.call(OpKind::add, {r, b.call(OpKind::add, {b.call(OpKind::matmul, {ln(r), w}), bias})});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {ln(r)}, {s0}), render_only({{"s0", 512}}), &info);
  ASSERT_EQ(p.blas.size(), 6u) << info.loop_ir;
  EXPECT_EQ(info.folded_epilogues, 5) << "every add but the last, which only the final LayerNorm reads\n" << info.loop_ir;
  int residual = 0;
  for (const BlasStep& st : p.blas) {
    // the product's output, planned as the kernel's, keeps no slot another buffer of the product
    // (its input, whose last read is the product) could hold
    const int out_slot = p.buffers.buffers[static_cast<size_t>(st.out)].slot;
    EXPECT_TRUE(out_slot < 0 || out_slot != p.buffers.buffers[static_cast<size_t>(st.a)].slot) << to_text(p);
    if (st.epilogue.residual < 0) continue;
    ++residual;
    EXPECT_EQ(out_slot, -1) << to_text(p);
    EXPECT_GE(st.epilogue.bias, 0);
    EXPECT_EQ(st.epilogue.beta, 1.0);
  }
  EXPECT_EQ(residual, 5);
  EXPECT_EQ(p.kernels.size(), 7u) << info.loop_ir;
  // the LayerNorms between the products are one kernel (deduplicated) that reads one stream buffer
  for (size_t i = 2; i + 1 < p.kernels.size(); ++i) EXPECT_EQ(p.kernels[i].general.entry, p.kernels[1].general.entry);
}

// Attention's products ([B, H, s, d] x [B, H, d, s]: equal batch dims flatten into one strided batch)
// go to cuBLASLt; index_select and cumsum become extern kernels of the translation unit.
TEST(CudaPipeline, FourDimProductsAndExternKernels) {
  GraphBuilder b("attn");
  SymInt s0 = b.symbol("q.size()[2]", 8);
  ValueId q = b.input("q", {1, 12, s0, 64}, DType::BF16);
  ValueId k = b.input("k", {1, 12, 64, s0}, DType::BF16);
  ValueId qk = b.call(OpKind::matmul, {q, k});
  ValueId w = b.input("w", {1, 1, 64, 32}, DType::BF16);
  ValueId qw = b.call(OpKind::matmul, {q, w});  // broadcast right operand: batch stride 0
  ValueId table = b.input("table", {100, 64}, DType::BF16);
  ValueId ids = b.input("ids", {s0}, DType::I64);
  ValueId emb = b.call(OpKind::index_select, {table, ids}, {{"dim", SymInt(0)}});
  ValueId mask = b.input("mask", {1, s0}, DType::I64);
  ValueId cs = b.call(OpKind::cumsum, {mask}, {{"dim", SymInt(1)}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {qk, qw, emb, cs}, {s0}), render_only(), &info);
  ASSERT_EQ(p.blas.size(), 2u) << to_text(p);
  EXPECT_EQ(sym::print(p.blas[0].batch), "12");
  EXPECT_EQ(sym::print(p.blas[0].batch_stride_a), "64*s0");
  EXPECT_EQ(sym::print(p.blas[0].batch_stride_b), "64*s0");
  EXPECT_EQ(sym::print(p.blas[1].batch), "12");
  EXPECT_EQ(sym::print(p.blas[1].batch_stride_b), "0");
  EXPECT_TRUE(p.host.empty());
  int ext = 0;
  for (const CudaKernel& kk : p.kernels) ext += kk.name.rfind("ext", 0) == 0;
  EXPECT_EQ(ext, 2);
  EXPECT_NE(p.source.find("(extern index_select, dim 0)"), std::string::npos);
  EXPECT_NE(p.source.find("(extern cumsum, dim 1)"), std::string::npos);
  EXPECT_NE(p.source.find("__trap()"), std::string::npos) << "an index out of range must not read out of bounds";
}

// The indexing ops of a language model's training step become extern kernels of the translation
// unit, not host steps: embedding (the index_select kernel with dim 0), gather along the last dim,
// scatter_add (gather's backward) and index_add (embedding's backward), with dynamic sizes, i64 and
// i32 indices; the translation unit compiles through NVRTC. An index tensor smaller than the input
// outside dim (PyTorch allows it) stays a host step that says why.
TEST(CudaPipeline, IndexingOpsAreExternKernels) {
  GraphBuilder b("indexing");
  SymInt s0 = b.symbol("ids.size()[0]", 8);
  ValueId wte = b.input("wte", {65, 32});
  ValueId ids = b.input("ids", {s0, 16}, DType::I64);
  ValueId emb = b.call(OpKind::embedding, {wte, ids});  // [s0, 16, 32]
  ValueId tgt = b.input("tgt", {s0, 16, 1}, DType::I64);
  ValueId g = b.call(OpKind::gather, {emb, tgt}, {{"dim", SymInt(2)}});
  ValueId sa = b.call(OpKind::scatter_add, {b.call(OpKind::mul, {emb, emb}), tgt, g}, {{"dim", SymInt(-1)}});
  ValueId ids32 = b.input("ids32", {s0}, DType::I32);
  ValueId ia = b.call(OpKind::index_add, {wte, ids32, b.input("src", {s0, 32})}, {{"dim", SymInt(0)}});
  ValueId ii = b.call(OpKind::index_add, {b.input("ci", {4, 5}, DType::I64), b.input("j", {3}, DType::I64),
                                          b.input("cs", {4, 3}, DType::I64)},
                      {{"dim", SymInt(1)}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {emb, g, sa, ia, ii}, {s0}), render_only(), &info);
  EXPECT_TRUE(p.host.empty()) << to_text(p);
  for (const char* what : {"(extern embedding, dim 0)", "(extern gather, dim 2)", "(extern scatter_add, dim 2)",
                           "(extern index_add, dim 0)", "(extern index_add, dim 1)"})
    EXPECT_NE(p.source.find(what), std::string::npos) << what << "\n" << p.source;
  EXPECT_NE(p.source.find("const int* __restrict__ idx"), std::string::npos) << "i32 indices read as int";
  EXPECT_NE(p.source.find("long long acc[S];"), std::string::npos) << "an i64 index_add adds in i64";
  if (nvrtc_available()) {
    const NvrtcResult r = nvrtc_compile(p.source, "indexing.cu");
    for (const char* entry : {"_embedding_general", "_embedding_aligned", "_gather", "_scatter_add", "_index_add"}) {
      bool found = false;
      for (const auto& [name, info2] : r.resources) found = found || name.find(entry) != std::string::npos;
      EXPECT_TRUE(found) << entry << "\n" << r.log;
    }
  }
  {  // an index shorter than the input outside dim (or of its own symbol there, as the targets of a
     // dynamic training step): the coordinate-walking kernels, no host step
    GraphBuilder b2("gather_short");
    SymInt s0 = b2.symbol("x.size()[0]", 6), s1 = b2.symbol("i.size()[0]", 4);
    ValueId x = b2.input("x", {s0, 5});
    ValueId i = b2.input("i", {s1, 2}, DType::I64);
    ValueId y = b2.call(OpKind::gather, {x, i}, {{"dim", SymInt(1)}});
    ValueId z = b2.call(OpKind::scatter_add, {x, i, b2.input("u", {s1, 3})}, {{"dim", SymInt(1)}});
    CudaProgram q = compile_cuda_program(input_of(b2, {y, z}, {s0, s1}), render_only());
    EXPECT_TRUE(q.host.empty()) << to_text(q);
    EXPECT_NE(q.source.find("index sizes apart from the input's"), std::string::npos) << q.source;
    if (nvrtc_available()) {
      const NvrtcResult r = nvrtc_compile(q.source, "indexing_short.cu");
      EXPECT_FALSE(r.cubin.empty()) << r.log;
    }
  }
}

// A lookup reads its indices where they are (fold_index_copies): ONNX Gather's [1, L] token ids
// flattened to [L] for index_select, and ids flattened for embedding, are copied by no kernel; a
// flattening that reorders them (a transpose first) or whose copy is read elsewhere keeps its copy.
TEST(CudaPipeline, ALookupReadsItsIndicesWhereTheyAre) {
  auto lookup = [](bool transposed, bool flat_out, OpKind op) {
    GraphBuilder b("lookup");
    SymInt s0 = b.symbol("ids.size()[1]", 8);
    ValueId wte = b.input("wte", {50, 32}, DType::BF16);
    ValueId ids = b.input("ids", {2, s0}, DType::I64);
    if (transposed) ids = b.call(OpKind::permute, {ids}, {{"dims", SymIntVec{1, 0}}});
    ValueId flat = b.call(OpKind::reshape, {ids}, {{"shape", SymIntVec{-1}}});
    ops::Attrs attrs;
    if (op == OpKind::index_select) attrs = {{"dim", SymInt(0)}, {"wrap_negative", true}};
    ValueId out = b.call(op, {wte, flat}, attrs);
    std::vector<ValueId> outs = {out};
    if (flat_out) outs.push_back(b.call(OpKind::add, {flat, flat}));
    CudaCompileInfo info;
    CudaProgram p = compile_cuda_program(input_of(b, outs, {s0}), render_only(), &info);
    EXPECT_TRUE(p.host.empty()) << to_text(p);
    return std::pair{info.index_copies, p.kernels.size()};
  };
  EXPECT_EQ(lookup(false, false, OpKind::index_select), std::pair(1, size_t{1})) << "the lookup's kernel alone";
  EXPECT_EQ(lookup(false, false, OpKind::embedding), std::pair(1, size_t{1}));
  EXPECT_EQ(lookup(true, false, OpKind::index_select).first, 0) << "a transposed copy reorders the ids";
  EXPECT_EQ(lookup(false, true, OpKind::index_select).first, 0) << "the flattened ids are read elsewhere";
  {  // computed ids (a temp): the lookup reads them where the cumsum wrote them, and releases them
    GraphBuilder b("lookup_cumsum");
    SymInt s0 = b.symbol("ids.size()[1]", 8);
    ValueId cs = b.call(OpKind::cumsum, {b.input("ids", {1, s0}, DType::I64)}, {{"dim", SymInt(1)}});
    ValueId flat = b.call(OpKind::reshape, {cs}, {{"shape", SymIntVec{-1}}});
    // a table computed after the ids are flattened: a step between the copy and the lookup
    ValueId wte = b.input("wte", {50, 32}, DType::BF16);
    ValueId table = b.call(OpKind::mul, {wte, wte});
    ValueId out = b.call(OpKind::index_select, {table, flat}, {{"dim", SymInt(0)}});
    CudaCompileInfo info;
    CudaProgram p = compile_cuda_program(input_of(b, {out}, {s0}), render_only(), &info);
    EXPECT_EQ(info.index_copies, 1) << to_text(p);
    int lookup_step = -1, ids = -1;
    for (size_t i = 0; i < p.steps.size(); ++i) {
      const Step& st = p.steps[i];
      if (st.kind != StepKind::Kernel || p.kernels[static_cast<size_t>(st.index)].name.find("index_select") == std::string::npos) continue;
      lookup_step = static_cast<int>(i);
      ids = p.kernels[static_cast<size_t>(st.index)].params[1].index;  // x, idx, out
    }
    ASSERT_GE(lookup_step, 0) << to_text(p);
    for (int i = 0; i < lookup_step; ++i)
      EXPECT_EQ(std::count(p.steps[static_cast<size_t>(i)].release.begin(), p.steps[static_cast<size_t>(i)].release.end(), ids), 0)
          << "the ids are released before the lookup reads them, at step " << i << "\n" << to_text(p);
    const auto& rel = p.steps[static_cast<size_t>(lookup_step)].release;
    EXPECT_EQ(std::count(rel.begin(), rel.end(), ids), 1) << to_text(p);
  }
}

// f32 scaled_dot_product_attention_backward (causal, dynamic length) is decomposed on the cuda
// backend: four cuBLASLt products plus the scores' product, loop kernels for the causal softmax and
// its backward, no host step; the translation unit compiles through NVRTC.
TEST(CudaPipeline, AttentionBackwardF32IsDecomposed) {
  GraphBuilder b("sdpa_bwd");
  SymInt s0 = b.symbol("q.size()[2]", 64);
  std::vector<ValueId> in;
  for (const char* name : {"g", "q", "k", "v"}) in.push_back(b.input(name, {2, 4, s0, 32}));
  ValueId d = b.call(OpKind::scaled_dot_product_attention_backward, in, {{"is_causal", true}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {d}, {s0}), render_only(), &info);
  EXPECT_TRUE(p.host.empty()) << to_text(p);
  EXPECT_EQ(p.blas.size(), 5u) << to_text(p);
  EXPECT_FALSE(p.kernels.empty());
  if (nvrtc_available()) {
    const NvrtcResult r = nvrtc_compile(p.source, "sdpa_bwd.cu");
    EXPECT_FALSE(r.cubin.empty()) << r.log;
  }
}

TEST(CudaPipeline, BiasAndResidualFoldIntoTheBlasEpilogue) {
  {  // linear (own bias) -> + residual: one cuBLASLt call with beta = 1, no kernel
    GraphBuilder b("linear_residual");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId x = b.input("x", {s0, 64});
    ValueId res = b.input("res", {s0, 32});
    ValueId l = b.call(OpKind::linear, {x, b.input("w", {32, 64}), b.input("bias", {32})});
    ValueId y = b.call(OpKind::add, {res, l});
    CudaCompileInfo info;
    CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), render_only(), &info);
    ASSERT_EQ(p.blas.size(), 1u) << to_text(p);
    EXPECT_TRUE(p.kernels.empty()) << to_text(p);
    EXPECT_EQ(info.folded_epilogues, 1);
    const BlasEpilogue& ep = p.blas[0].epilogue;
    EXPECT_EQ(p.buffers.buffers[static_cast<size_t>(ep.bias)].input_index, 3);
    EXPECT_EQ(ep.gelu, GeluForm::None);
    ASSERT_GE(ep.residual, 0);
    EXPECT_EQ(p.buffers.buffers[static_cast<size_t>(ep.residual)].input_index, 1);
    EXPECT_EQ(ep.beta, 1.0);
    EXPECT_EQ(p.blas[0].out, p.buffers.outputs[0]);  // the product writes the graph output itself
  }
  {  // matmul -> + bias -> + residual: both fold
    GraphBuilder b("mm_bias_residual");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId x = b.input("x", {s0, 64});
    ValueId m = b.call(OpKind::matmul, {x, b.input("w", {64, 32})});
    ValueId a = b.call(OpKind::add, {m, b.input("bias", {32})});
    ValueId y = b.call(OpKind::add, {a, b.input("res", {s0, 32})});
    CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), render_only());
    ASSERT_EQ(p.blas.size(), 1u);
    EXPECT_TRUE(p.kernels.empty()) << to_text(p);
    EXPECT_EQ(p.buffers.buffers[static_cast<size_t>(p.blas[0].epilogue.bias)].input_index, 2);
    EXPECT_EQ(p.buffers.buffers[static_cast<size_t>(p.blas[0].epilogue.residual)].input_index, 3);
  }
  {  // matmul -> + bias -> gelu (erf form): cuBLASLt's GELU is the tanh form, so nothing folds
    GraphBuilder b("mm_bias_gelu");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId m = b.call(OpKind::matmul, {b.input("x", {s0, 64}), b.input("w", {64, 32})});
    ValueId a = b.call(OpKind::add, {m, b.input("bias", {32})});
    ValueId g = b.call(OpKind::gelu, {a}, {{"approximate", std::string("none")}});
    CudaProgram p = compile_cuda_program(input_of(b, {g}, {s0}), render_only());
    ASSERT_EQ(p.blas.size(), 1u);
    EXPECT_EQ(p.kernels.size(), 1u) << to_text(p);
    EXPECT_EQ(p.blas[0].epilogue.bias, -1);
    EXPECT_EQ(p.blas[0].epilogue.gelu, GeluForm::None);
  }
  {  // matmul -> gelu_new as the ONNX importer sees it in bf16 (transformers' GPT-2: 0.5 * y * (1 + tanh(
     // sqrt(2/pi) * (y + 0.044715 * pow(y, 3)))), scalars as 0-d constants rounded to bf16): cuBLASLt's
     // GELU epilogue (the tanh form) takes it, and the kernel goes
    GraphBuilder b("mm_gelu_new");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    auto c = [&](double v) { return b.constant(full({}, v, DType::BF16)); };
    ValueId y = b.call(OpKind::matmul, {b.input("x", {s0, 64}, DType::BF16), b.input("w", {64, 256}, DType::BF16)});
    ValueId cube = b.call(OpKind::pow, {y, c(3.0)});
    ValueId inner = b.call(OpKind::add, {y, b.call(OpKind::mul, {cube, c(0.044715)})});
    ValueId t = b.call(OpKind::tanh, {b.call(OpKind::mul, {inner, c(0.7978845608028654)})});
    ValueId g = b.call(OpKind::mul, {b.call(OpKind::mul, {y, c(0.5)}), b.call(OpKind::add, {t, c(1.0)})});
    CudaCompileInfo info;
    CudaProgram p = compile_cuda_program(input_of(b, {g}, {s0}), render_only(), &info);
    ASSERT_EQ(p.blas.size(), 1u) << to_text(p);
    EXPECT_TRUE(p.kernels.empty()) << to_text(p);
    EXPECT_EQ(info.folded_epilogues, 1);
    EXPECT_EQ(p.blas[0].epilogue.gelu, GeluForm::Tanh);
    EXPECT_EQ(p.blas[0].out, p.buffers.outputs[0]);
    // the same with a wrong constant (0.045 is not 0.044715 in bf16) is another function: it stays a kernel
    GraphBuilder b2("mm_not_gelu");
    SymInt s1 = b2.symbol("x.size()[0]", 8);
    auto c2 = [&](double v) { return b2.constant(full({}, v, DType::BF16)); };
    ValueId y2 = b2.call(OpKind::matmul, {b2.input("x", {s1, 64}, DType::BF16), b2.input("w", {64, 256}, DType::BF16)});
    ValueId inner2 = b2.call(OpKind::add, {y2, b2.call(OpKind::mul, {b2.call(OpKind::pow, {y2, c2(3.0)}), c2(0.046)})});
    ValueId t2 = b2.call(OpKind::tanh, {b2.call(OpKind::mul, {inner2, c2(0.7978845608028654)})});
    ValueId g2 = b2.call(OpKind::mul, {b2.call(OpKind::mul, {y2, c2(0.5)}), b2.call(OpKind::add, {t2, c2(1.0)})});
    CudaProgram p2 = compile_cuda_program(input_of(b2, {g2}, {s1}), render_only());
    EXPECT_EQ(p2.kernels.size(), 1u) << to_text(p2);
    EXPECT_EQ(p2.blas[0].epilogue.gelu, GeluForm::None);
  }
  {  // gelu(approximate="tanh") + residual: cuBLASLt cannot apply both, so nothing folds
    GraphBuilder b("mm_gelu_tanh_residual");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId m = b.call(OpKind::matmul, {b.input("x", {s0, 64}), b.input("w", {64, 32})});
    ValueId g = b.call(OpKind::gelu, {m}, {{"approximate", std::string("tanh")}});
    ValueId y = b.call(OpKind::add, {g, b.input("res", {s0, 32})});
    CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), render_only());
    ASSERT_EQ(p.blas.size(), 1u);
    EXPECT_EQ(p.kernels.size(), 1u) << to_text(p);
    EXPECT_EQ(p.blas[0].epilogue.gelu, GeluForm::None);
  }
  {  // the product read by two kernels stays where it is
    GraphBuilder b("mm_two_readers");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId m = b.call(OpKind::matmul, {b.input("x", {s0, 64}), b.input("w", {64, 32})});
    ValueId a = b.call(OpKind::add, {m, b.input("bias", {32})});
    ValueId t = b.call(OpKind::sum, {m}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
    CudaProgram p = compile_cuda_program(input_of(b, {a, t}, {s0}), render_only());
    ASSERT_EQ(p.blas.size(), 1u);
    EXPECT_EQ(p.blas[0].epilogue.bias, -1) << to_text(p);
    ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);  // the sum and the add: one row kernel
    EXPECT_EQ(p.blas[0].out, p.kernels[0].params[0].index);  // that reads the product
  }
}

// ---- golden CUDA C (CHECK lines) -----------------------------------------------------------------

/// Every `CHECK: text` line of tests/golden/cuda/<name> must occur in `actual`, each in a line after
/// the previous match; `CHECK-NOT: text` must not occur between the previous and the next match.
void expect_checks(const std::string& actual, const std::string& name) {
  const std::string path = std::string(PROTEAN_SOURCE_DIR) + "/tests/golden/cuda/" + name;
  std::ifstream in(path);
  ASSERT_TRUE(in) << "missing " << path << "; actual:\n" << actual;
  const std::vector<std::string> lines = ir::testing::split_lines(actual);
  size_t at = 0;
  std::vector<std::string> nots;
  std::string l;
  int checks = 0;
  while (std::getline(in, l)) {
    if (l.rfind("CHECK-NOT: ", 0) == 0) {
      nots.push_back(l.substr(11));
      continue;
    }
    if (l.rfind("CHECK: ", 0) != 0) continue;
    ++checks;
    const std::string want = l.substr(7);
    size_t found = at;
    while (found < lines.size() && lines[found].find(want) == std::string::npos) ++found;
    if (found == lines.size()) {
      ADD_FAILURE() << name << ": no line after line " << at << " contains '" << want << "'; actual:\n" << actual;
      return;
    }
    for (size_t i = at; i < found; ++i)
      for (const std::string& n : nots)
        if (lines[i].find(n) != std::string::npos) ADD_FAILURE() << name << ": line " << i + 1 << " contains '" << n << "': " << lines[i];
    nots.clear();
    at = found + 1;
  }
  for (size_t i = at; i < lines.size(); ++i)
    for (const std::string& n : nots)
      if (lines[i].find(n) != std::string::npos) ADD_FAILURE() << name << ": line " << i + 1 << " contains '" << n << "': " << lines[i];
  EXPECT_GT(checks, 0) << name << " has no CHECK line";
}

std::string cuda_text(GraphBuilder& b, std::vector<ValueId> outs, std::vector<SymInt> syms, std::map<std::string, int64_t> bounds = {}) {
  CudaProgram p = compile_cuda_program(input_of(b, std::move(outs), std::move(syms)), render_only(std::move(bounds)));
  // PROTEAN_TEST_DUMP_CUDA=DIR writes each rendered translation unit whole (prelude included) to
  // DIR/kN.cu, for reading the PTX or SASS of a golden with the toolkit
  if (const char* d = std::getenv("PROTEAN_TEST_DUMP_CUDA")) { static int n = 0; std::ofstream(std::string(d) + "/k" + std::to_string(n++) + ".cu") << p.source; }
  return to_text(p) + "\n" + p.source.substr(cuda_prelude().size());
}

TEST(CudaGolden, Pointwise) {
  GraphBuilder b("pointwise");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 3);
  ValueId x = b.input("x", {s0, s1});
  ValueId y = b.input("y", {s1});
  ValueId r = b.call(OpKind::mul, {b.call(OpKind::tanh, {x}), y});
  expect_checks(cuda_text(b, {r}, {s0, s1}), "pointwise.cu.check");
}

TEST(CudaGolden, Softmax) {
  GraphBuilder b("softmax");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, 4096})}, {{"dim", SymInt(-1)}});
  expect_checks(cuda_text(b, {y}, {s0}), "softmax.cu.check");
}

TEST(CudaGolden, LayerNormGelu) {
  GraphBuilder b("ln_gelu");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 4096});
  ValueId w = b.input("w", {4096});
  ValueId bb = b.input("b", {4096});
  ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
  ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  expect_checks(cuda_text(b, {g}, {s0}), "layer_norm_gelu.cu.check");
}

TEST(CudaGolden, LayerNormGeluBf16) {
  GraphBuilder b("ln_gelu_bf16");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 4096}, DType::BF16);
  ValueId w = b.input("w", {4096}, DType::BF16);
  ValueId bb = b.input("b", {4096}, DType::BF16);
  ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
  ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  expect_checks(cuda_text(b, {g}, {s0}), "layer_norm_gelu_bf16.cu.check");
}

TEST(CudaGolden, SumOverSymbolicLength) {
  GraphBuilder b("sum_sym");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 1000);
  ValueId x = b.input("x", {s0, s1});
  ValueId r = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
  expect_checks(cuda_text(b, {r}, {s0, s1}), "sum_symbolic.cu.check");
}

// ---- NVRTC: every cpu golden graph and every fuzzer program compiles cleanly ----------------------

/// The text of entry `entry` in `source` (up to the next entry).
std::string entry_text(const std::string& source, const std::string& entry) {
  const size_t at = source.find(" " + entry + "(");
  if (at == std::string::npos) return "";
  const size_t end = source.find("extern \"C\"", at);
  return source.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

/// Programs rendered for one NVRTC call: each program's kernels get the prefix `p<i>_`, so the kernels
/// of many programs compile as one translation unit (one NVRTC call: its fixed cost is paid once).
struct Batch {
  std::string source = std::string(cuda_prelude());
  struct Entry {
    std::string name;  ///< in the batch's source
    int block_threads;
    std::string what;
  };
  std::vector<Entry> entries;

  void add(const BackendInput& in, const std::map<std::string, int64_t>& bounds, const std::string& what) {
    CudaProgram p = compile_cuda_program(in, render_only(bounds));
    const std::string prefix = fmt::format("p{}_", entries.size());
    std::string kernels = p.source.substr(cuda_prelude().size());
    std::set<std::string> renamed;  // deduplicated kernels launch an earlier kernel's entries
    for (const CudaKernel& k : p.kernels)
      for (const KernelVariant* v : {&k.general, &k.aligned}) {
        if (!renamed.insert(v->entry).second) continue;
        const std::string from = " " + v->entry + "(", to = " " + prefix + v->entry + "(";
        const size_t at = kernels.find(from);
        ASSERT_NE(at, std::string::npos) << v->entry;
        kernels.replace(at, from.size(), to);
        entries.push_back({prefix + v->entry, v->launch.block_threads, what});
      }
    source += kernels;
  }

  /// Compiles the batch for sm_90 and checks the ptxas report of every entry: present, no spills,
  /// registers within what __launch_bounds__ allows (65536 per block, 255 per thread), and no stack
  /// frame (a register array indexed at run time would have one) except the few dozen bytes of sin and
  /// cos's argument reduction (CUDA's sinf/cosf slow path for large arguments).
  void expect_clean(const std::string& name) {
    NvrtcResult r;
    try {
      r = nvrtc_compile(source, name);
    } catch (const NvrtcCompileError& e) {
      ADD_FAILURE() << e.what() << "\n" << source;
      return;
    }
    EXPECT_FALSE(r.cubin.empty());
    for (const Entry& e : entries) {
      SCOPED_TRACE(e.what + " " + e.name);
      auto it = r.resources.find(e.name);
      ASSERT_NE(it, r.resources.end()) << r.log;
      const PtxasInfo& info = it->second;
      const std::string text = entry_text(source, e.name);
      EXPECT_EQ(info.spill_stores, 0) << text;
      EXPECT_EQ(info.spill_loads, 0) << text;
      const bool trig = text.find("pt::sin(") != std::string::npos || text.find("pt::cos(") != std::string::npos;
      EXPECT_LE(info.stack_bytes, trig ? 64 : 0) << text;
      EXPECT_LE(info.registers, std::min(255, 65536 / e.block_threads)) << text;
    }
  }
};

#define REQUIRE_NVRTC() \
  if (!nvrtc_available()) GTEST_SKIP() << "NVRTC not available: " << nvrtc_unavailable_reason()

TEST(CudaNvrtc, GoldenGraphsCompileCleanly) {
  REQUIRE_NVRTC();
  Batch batch;
  for (bool bounded : {false, true}) {
    std::map<std::string, int64_t> bounds;
    if (bounded) bounds = {{"s0", 1 << 16}, {"s1", 1000}};
    {
      GraphBuilder b("softmax");
      SymInt s0 = b.symbol("x.size()[0]", 8);
      ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, 4096})}, {{"dim", SymInt(-1)}});
      batch.add(input_of(b, {y}, {s0}), bounds, "softmax");
    }
    {
      GraphBuilder b("ln_gelu");
      SymInt s0 = b.symbol("x.size()[0]", 8);
      ValueId x = b.input("x", {s0, 4096});
      ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {4096}), b.input("b", {4096})},
                         {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
      ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
      batch.add(input_of(b, {g}, {s0}), bounds, "layer_norm_gelu");
    }
    {
      GraphBuilder b("ln_gelu_bf16");
      SymInt s0 = b.symbol("x.size()[0]", 8);
      ValueId x = b.input("x", {s0, 4096}, DType::BF16);
      ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {4096}, DType::BF16), b.input("b", {4096}, DType::BF16)},
                         {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
      ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
      batch.add(input_of(b, {g}, {s0}), bounds, "layer_norm_gelu_bf16");
    }
    {
      GraphBuilder b("softmax_f16");
      SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 100);
      ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, s1}, DType::F16)}, {{"dim", SymInt(-1)}});
      batch.add(input_of(b, {y}, {s0, s1}), bounds, "softmax_f16");
    }
    {
      GraphBuilder b("bcast");
      SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 3);
      ValueId x = b.input("x", {s0, s1});
      ValueId p = b.call(OpKind::permute, {x}, {{"dims", SymIntVec{1, 0}}});
      ValueId a = b.call(OpKind::add, {p, b.input("y", {s1, 1})});
      ValueId r = b.call(OpKind::relu, {b.call(OpKind::matmul, {a, x})});
      batch.add(input_of(b, {r}, {s0, s1}), bounds, "broadcast_permute_add");
    }
    {
      GraphBuilder b("horizontal");
      SymInt s0 = b.symbol("x.size()[0]", 8);
      ValueId x = b.input("x", {s0, 256});
      ValueId e = b.call(OpKind::exp, {x});
      ValueId si = b.call(OpKind::sin, {x});
      ValueId sum = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
      ValueId mm = b.call(OpKind::matmul, {x, b.input("w", {256, 4})});
      ValueId v = b.call(OpKind::var, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}, {"correction", SymInt(1)}});
      batch.add(input_of(b, {e, si, sum, mm, v}, {s0}), bounds, "horizontal");
    }
  }
  batch.expect_clean("goldens.cu");
}

TEST(CudaNvrtc, PipelineFillsCubinKeyAndReports) {
  REQUIRE_NVRTC();
  GraphBuilder b("softmax");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, 4096})}, {{"dim", SymInt(-1)}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), {}, &info);
  EXPECT_FALSE(p.cubin.empty());
  EXPECT_EQ(p.key.arch, "sm_90");
  EXPECT_EQ(p.key.nvrtc_version, nvrtc_version());
  EXPECT_NE(p.key.flags.find("--fmad=false"), std::string::npos);
  EXPECT_NE(p.key.source_hash, 0u);
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_TRUE(p.kernels[0].general.resources.present) << p.compile_log;
  EXPECT_TRUE(p.kernels[0].aligned.resources.present) << p.compile_log;
  EXPECT_GT(p.kernels[0].general.resources.registers, 0);
  EXPECT_GT(p.kernels[0].general.resources.shared_bytes, 0);  // the block reduction's one value per warp
  EXPECT_GT(info.phases.wall("cuda nvrtc"), 0.0);
  EXPECT_GT(info.phases.wall("cuda codegen"), 0.0);
}

// Attention as torch's ONNX exporter writes it (GPT-2): q, k, v sliced from one projection and split
// into heads, sqrt(scale) on q and on kᵀ (kᵀ as reshape-permute-reshape), an additive mask, softmax,
// where(isnan(P), 0, P), matmul. The pattern pass makes it one scaled_dot_product_attention with the
// mask, lowered to the fused kernel of attention.h, which reads q, k and v in place from the
// projection (fold_attention_views: the head-splitting copies go): two layers share one entry, the
// kernel compiles for sm_90 with no spills, and the scores matrix is never a buffer of the program.
ValueId exported_attention(GraphBuilder& b, ValueId qkv, ValueId mask, SymInt s, ValueId c) {
  const int64_t H = 2, D = 32;
  auto head = [&](int64_t at) {
    ValueId x = b.call(OpKind::slice, {qkv}, {{"dim", SymInt(2)}, {"start", SymInt(at)}, {"end", SymInt(at + H * D)}, {"step", SymInt(1)}});
    x = b.call(OpKind::reshape, {x}, {{"shape", SymIntVec{1, -1, H, D}}});
    return b.call(OpKind::permute, {x}, {{"dims", SymIntVec{0, 2, 1, 3}}});
  };
  ValueId q = head(0), k = head(H * D), v = head(2 * H * D);
  ValueId k3 = b.call(OpKind::reshape, {k}, {{"shape", SymIntVec{-1, s, D}}});
  ValueId kt = b.call(OpKind::reshape, {b.call(OpKind::permute, {k3}, {{"dims", SymIntVec{0, 2, 1}}})}, {{"shape", SymIntVec{1, H, D, s}}});
  ValueId sc = b.call(OpKind::matmul, {b.call(OpKind::mul, {q, c}), b.call(OpKind::mul, {kt, c})});
  ValueId p = b.call(OpKind::softmax, {b.call(OpKind::add, {sc, mask})}, {{"dim", SymInt(3)}});
  ValueId nan = b.call(OpKind::ne, {p, p});
  ValueId p0 = b.call(OpKind::where, {nan, b.constant(full({}, 0.0, DType::BF16)), p});
  return b.call(OpKind::matmul, {p0, v});
}

TEST(CudaNvrtc, ExportedAttentionBecomesOneFusedKernel) {
  auto build = [](GraphBuilder& b, SymInt& s0) {
    s0 = b.symbol("x.size()[1]", 40);
    ValueId qkv = b.input("x", {1, s0, 192}, DType::BF16);
    ValueId mask = b.input("mask", {1, 1, s0, s0}, DType::BF16);
    ValueId c = b.constant(full({}, std::sqrt(1.0 / std::sqrt(32.0)), DType::BF16));
    ValueId a1 = exported_attention(b, qkv, mask, s0, c);
    ValueId a2 = exported_attention(b, qkv, mask, s0, c);
    return b.call(OpKind::add, {a1, a2});
  };
  {  // off: two products and a softmax per attention
    GraphBuilder b("attn_off");
    SymInt s0;
    ValueId y = build(b, s0);
    CudaCompileOptions o = render_only();
    o.fused_attention = false;
    CudaCompileInfo info;
    CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), o, &info);
    EXPECT_EQ(info.fused_attention, 0);
    EXPECT_EQ(p.blas.size(), 4u) << to_text(p);
  }
  REQUIRE_NVRTC();
  GraphBuilder b("attn_on");
  SymInt s0;
  ValueId y = build(b, s0);
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {y}, {s0}), {}, &info);
  EXPECT_EQ(info.fused_attention, 2);
  EXPECT_EQ(info.attention_views, 6) << "q, k and v read in place from the projection: no copy kernel";
  EXPECT_NE(p.source.find("const long long k_rs = 192;"), std::string::npos) << p.source;
  EXPECT_TRUE(p.blas.empty()) << to_text(p);
  EXPECT_TRUE(p.host.empty()) << to_text(p);
  std::vector<const CudaKernel*> attn;
  for (const CudaKernel& k : p.kernels)
    if (k.name.find("scaled_dot_product_attention") != std::string::npos) attn.push_back(&k);
  ASSERT_EQ(attn.size(), 2u) << to_text(p);
  EXPECT_EQ(attn[0]->general.entry, attn[1]->general.entry) << "the layers share one attention kernel";
  EXPECT_EQ(attn[0]->general.launch.block_threads, 128) << "4 warps: two per 16 query rows, one per key half";
  EXPECT_EQ(sym::print(attn[0]->general.launch.work), "2*CeilDiv(s0, 32)") << "blocks: heads x query tiles of 32";
  EXPECT_NE(p.source.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), std::string::npos);
  EXPECT_NE(attn[0]->aligned.entry, attn[0]->general.entry) << "16-byte and 4-byte tile loads";
  EXPECT_EQ(attn[0]->rule.multiple, 8);
  EXPECT_NE(p.source.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"), std::string::npos);
  // the aligned variant (head dim 32) copies the next key/value tile asynchronously into a second buffer
  const size_t aligned_at = p.source.find(attn[0]->aligned.entry + "(");
  const size_t general_at = p.source.find(attn[0]->general.entry + "(");
  ASSERT_NE(aligned_at, std::string::npos);
  ASSERT_NE(general_at, std::string::npos);
  EXPECT_NE(p.source.find("cp.async.wait_group 1;", aligned_at), std::string::npos);
  EXPECT_EQ(p.source.substr(general_at).find("cp.async"), std::string::npos) << "4-byte loads stay synchronous";
  // two key and two value tiles of [64][32 + 8] in dynamic shared memory for the aligned variant, one each for the general
  EXPECT_NE(p.source.find("extern __shared__ __align__(16) unsigned char pt_attn_dyn[];", aligned_at), std::string::npos);
  EXPECT_EQ(attn[0]->aligned.launch.shared_bytes, 2u * 2u * 64u * (32u + 8u) * 2u);
  EXPECT_EQ(attn[0]->general.launch.shared_bytes, 2u * 64u * (32u + 8u) * 2u);
  for (const PtxasInfo* r : {&attn[0]->general.resources, &attn[0]->aligned.resources}) {
    ASSERT_TRUE(r->present) << p.compile_log;
    EXPECT_EQ(r->spill_stores, 0) << p.compile_log;
    EXPECT_EQ(r->spill_loads, 0) << p.compile_log;
    EXPECT_LE(r->registers, 255);
  }
  for (const PlannedBuffer& pb : p.buffers.buffers) {  // no [.., s, s] buffer but the mask input
    if (pb.sizes.size() == 4 && pb.kind != loop::BufferKind::Input) {
      EXPECT_FALSE(sym::print(pb.sizes[2]) == "s0" && sym::print(pb.sizes[3]) == "s0") << "scores stored: " << to_text(p);
    }
  }
}

// scaled_dot_product_attention over q, k, v of [1, 4, s0, hd] (s0 a symbol hinted 40), compiled with
// `o` (NVRTC for sm_90 by default).
CudaProgram compile_sdpa(const std::string& name, int64_t hd, DType dt, bool causal, double scale,
                         const CudaCompileOptions& o = {}) {
  GraphBuilder b(name);
  SymInt s0 = b.symbol("q.size()[2]", 40);
  ValueId q = b.input("q", {1, 4, s0, hd}, dt);
  ValueId k = b.input("k", {1, 4, s0, hd}, dt);
  ValueId v = b.input("v", {1, 4, s0, hd}, dt);
  ValueId y = b.call(OpKind::scaled_dot_product_attention, {q, k, v, ir::kNoValue}, {{"is_causal", causal}, {"scale", scale}});
  return compile_cuda_program(input_of(b, {y}, {s0}), o, nullptr);
}

// is_causal with the largest head dim (128: 64 accumulators per thread) in f16, and GPT-2's 64 in bf16
// (every 16-byte tile load in flight at once): both variants compile for sm_90 without spills.
TEST(CudaNvrtc, CausalAttentionCompilesCleanly) {
  REQUIRE_NVRTC();
  for (const auto& [hd, dt] : {std::pair<int64_t, DType>{128, DType::F16}, std::pair<int64_t, DType>{64, DType::BF16},
                               std::pair<int64_t, DType>{48, DType::F16}, std::pair<int64_t, DType>{32, DType::BF16}}) {
    CudaProgram p = compile_sdpa("attn_causal_" + std::to_string(hd), hd, dt, true, 0.088);
    ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);
    const CudaKernel& k0 = p.kernels[0];
    EXPECT_NE(p.source.find("causal true"), std::string::npos);
    for (const PtxasInfo* r : {&k0.general.resources, &k0.aligned.resources}) {
      ASSERT_TRUE(r->present) << p.compile_log;
      EXPECT_EQ(r->spill_stores, 0) << "head dim " << hd << ": " << p.compile_log;
      EXPECT_EQ(r->spill_loads, 0) << "head dim " << hd << ": " << p.compile_log;
    }
  }
}

// PROTEAN_CUDA_ATTENTION_LAZY_RESCALE=1: the rescale of the running sum and output sits behind a warp
// vote on a grown max; the kernel still compiles for sm_90 without spills. Without it, no vote.
TEST(CudaNvrtc, LazyRescaleAttentionCompilesCleanly) {
  REQUIRE_NVRTC();
  for (const char* lazy : {"1", "0"}) {
    setenv("PROTEAN_CUDA_ATTENTION_LAZY_RESCALE", lazy, 1);
    CudaProgram p = compile_sdpa(std::string("attn_lazy_") + lazy, 64, DType::BF16, true, 0.125);
    unsetenv("PROTEAN_CUDA_ATTENTION_LAZY_RESCALE");
    ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);
    EXPECT_EQ(p.source.find("__any_sync(0xffffffffu, n0 != m0 || n1 != m1)") != std::string::npos, std::string(lazy) == "1");
    for (const PtxasInfo* r : {&p.kernels[0].general.resources, &p.kernels[0].aligned.resources}) {
      ASSERT_TRUE(r->present) << p.compile_log;
      EXPECT_EQ(r->spill_stores, 0) << p.compile_log;
    }
  }
}

// PROTEAN_CUDA_ATTENTION_WGMMA=2 (the default) and 4 with a unit compiled for sm_90a: the aligned variant of a causal bf16
// and a plain f16 attention of head dim 64 takes warp-group MMAs (64 query rows a block, 128 threads a
// warp group, Q and two buffers of K and V tiles in dynamic shared memory, q's alignment part of the
// rule); the general variant stays mma.sync; both compile without spills and ptxas does not serialize
// the MMAs. For sm_90, or a head dim of 32, nothing changes.
TEST(CudaNvrtc, HopperAttentionCompilesCleanly) {
  REQUIRE_NVRTC();
  auto compile = [](const std::string& name, int64_t hd, DType dt, bool causal, const char* arch) {
    CudaCompileOptions o;
    o.nvrtc.arch = arch;
    return compile_sdpa(name, hd, dt, causal, 0.125, o);
  };
  for (const char* groups : {"2", "4"}) {
    setenv("PROTEAN_CUDA_ATTENTION_WGMMA", groups, 1);
    const int nwg = std::atoi(groups);
    EXPECT_TRUE(attention_wants_sm90a(9, 0));
    EXPECT_FALSE(attention_wants_sm90a(8, 0));
    for (const auto& [dt, causal] : {std::pair<DType, bool>{DType::BF16, true}, std::pair<DType, bool>{DType::F16, false}}) {
      CudaProgram p = compile("attn_wgmma_" + std::string(groups), 64, dt, causal, "sm_90a");
      ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);
      const CudaKernel& k0 = p.kernels[0];
      const size_t aligned_at = p.source.find(k0.aligned.entry + "(");
      const size_t general_at = p.source.find(k0.general.entry + "(");
      ASSERT_NE(aligned_at, std::string::npos);
      ASSERT_NE(general_at, std::string::npos);
      const std::string aligned_src = p.source.substr(aligned_at, general_at > aligned_at ? general_at - aligned_at : std::string::npos);
      EXPECT_NE(aligned_src.find(dt == DType::BF16 ? "pt_attn_pv_bf16" : "pt_attn_pv_f16"), std::string::npos) << aligned_src;
      EXPECT_EQ(aligned_src.find("mma.sync"), std::string::npos);
      // from 321 query rows on; shorter lengths take the general entry, which holds the 16-byte
      // pipelined mma.sync body (chosen in the kernel from k's and v's alignment) and the 4-byte one
      ASSERT_TRUE(k0.rule.size);
      EXPECT_EQ(sym::print(k0.rule.size), "s0");
      EXPECT_EQ(k0.rule.at_least, 321);
      const std::string general_src = p.source.substr(general_at);
      EXPECT_NE(general_src.find("cp.async.wait_group 1;"), std::string::npos);
      EXPECT_NE(general_src.find("& 15) == 0 && k_rs % 8 == 0"), std::string::npos) << general_src;
      EXPECT_EQ(k0.general.launch.shared_bytes, 2u * 2u * 64u * (64u + 8u) * 2u);
      EXPECT_NE(p.source.substr(general_at).find("mma.sync.aligned.m16n8k16"), std::string::npos);
      EXPECT_EQ(k0.aligned.launch.block_threads, 128 * nwg);
      EXPECT_EQ(sym::print(k0.aligned.launch.work), "4*CeilDiv(s0, 64)");
      EXPECT_EQ(k0.aligned.launch.shared_bytes, static_cast<uint32_t>(1024 + 8192 + 4 * 64 * nwg * 128));
      EXPECT_EQ(k0.general.launch.block_threads, 128);
      EXPECT_EQ(k0.rule.aligned_buffers.size(), 3u) << "q is copied 16 bytes at a time too";
      for (const PtxasInfo* r : {&k0.general.resources, &k0.aligned.resources}) {
        ASSERT_TRUE(r->present) << p.compile_log;
        EXPECT_EQ(r->spill_stores, 0) << p.compile_log;
        EXPECT_EQ(r->spill_loads, 0) << p.compile_log;
      }
      EXPECT_EQ(p.compile_log.find("serialized"), std::string::npos) << "wgmma serialized by ptxas:\n" << p.compile_log;
    }
    // sm_90 (no wgmma) and a head dim of 32 keep the mma.sync kernel
    for (const auto& [hd, arch] : {std::pair<int64_t, const char*>{64, "sm_90"}, std::pair<int64_t, const char*>{32, "sm_90a"}}) {
      CudaProgram p = compile("attn_no_wgmma", hd, DType::BF16, true, arch);
      ASSERT_EQ(p.kernels.size(), 1u);
      EXPECT_EQ(p.source.find("wgmma"), std::string::npos) << arch << " head dim " << hd;
      EXPECT_EQ(p.kernels[0].aligned.launch.block_threads, 128);
    }
    unsetenv("PROTEAN_CUDA_ATTENTION_WGMMA");
  }
  EXPECT_TRUE(attention_wants_sm90a(9, 0)) << "on by default";
  setenv("PROTEAN_CUDA_ATTENTION_WGMMA", "0", 1);
  EXPECT_FALSE(attention_wants_sm90a(9, 0));
  unsetenv("PROTEAN_CUDA_ATTENTION_WGMMA");
}

// The generated products' translation unit (hopper_gemm.h) compiles for sm_90a: every entry point
// (whole, K split over a cluster, a LayerNorm folded in), no spills, within the 255 registers a thread
// of a 256-thread block may have.
TEST(CudaNvrtc, GeneratedProductsCompileCleanly) {
  REQUIRE_NVRTC();
  NvrtcOptions o;
  o.arch = "sm_90a";
  const NvrtcResult r = nvrtc_compile(generated_product_source(), "generated_products.cu", o);
  EXPECT_FALSE(r.cubin.empty());
  for (const char* entry : {"pt_product_w_kn", "pt_product_w_nk", "pt_product_w_kn_ksplit", "pt_product_w_nk_ksplit",
                            "pt_product_w_kn_ln", "pt_product_w_nk_ln"}) {
    auto it = r.resources.find(entry);
    ASSERT_NE(it, r.resources.end()) << entry << "\n" << r.log;
    EXPECT_EQ(it->second.spill_stores, 0) << r.log;
    EXPECT_LE(it->second.registers, 255) << r.log;
  }
  EXPECT_EQ(r.log.find("serialized"), std::string::npos) << "wgmma serialized by ptxas:\n" << r.log;
}

// Which products the generated kernel takes (the step's part of the rule): bf16 GPT-2-sized linears
// up to 128 rows, FC2's K = 3072 split over a cluster unless PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K=0
// (not a deep K that is no multiple of 4 steps, not past 4096); not f32, not a width that is not whole
// 64-column tiles, not GELU and a residual together.
TEST(CudaGeneratedProducts, TheStepsPartOfTheRule) {
  BlasStep st;
  st.dtype = DType::BF16;
  st.epilogue.bias = 3;
  BlasShape sh;
  sh.m = 37, sh.n = 2304, sh.k = 768;
  EXPECT_TRUE(generated_product_fits(st, sh));
  sh.m = 128;
  EXPECT_TRUE(generated_product_fits(st, sh));
  sh.m = 129;
  EXPECT_FALSE(generated_product_fits(st, sh)) << "more rows than generated_product_max_rows()";
  sh.m = 64, sh.k = 3072, sh.n = 768;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "FC2: K split over a cluster by default";
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "0", 1);
  EXPECT_FALSE(generated_product_fits(st, sh)) << "=0: FC2 stays on cuBLASLt";
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "1", 1);
  EXPECT_TRUE(generated_product_fits(st, sh)) << "FC2: K split over a cluster";
  sh.k = 4096;
  EXPECT_TRUE(generated_product_fits(st, sh));
  sh.k = 4352;
  EXPECT_FALSE(generated_product_fits(st, sh)) << "deeper than 4096";
  sh.k = 1088;
  EXPECT_FALSE(generated_product_fits(st, sh)) << "17 steps: not four equal parts";
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "2", 1);
  sh.k = 3072;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "=2 splits FC2 too";
  sh.k = 768;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "=2: the output projection, split";
  sh.k = 832;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "13 steps: whole, not split";
  sh.k = 0;
  EXPECT_FALSE(generated_product_fits(st, sh)) << "k = 0: no 64-deep step";
  sh.k = 128;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "k = 128: two steps, whole";
  EXPECT_FALSE(generated_product_split(st, sh)) << "k = 128 split four ways is no whole step each";
  sh.n = 2304, sh.k = 0;
  EXPECT_FALSE(generated_product_fits(st, sh)) << "k = 0, not split";
  sh.n = 768, sh.k = 3072;
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "off", 1);
  EXPECT_FALSE(generated_product_fits(st, sh)) << "the switch's old spelling of 0";
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "on", 1);
  EXPECT_TRUE(generated_product_fits(st, sh)) << "the switch's old spelling of 1";
  sh.k = 768;
  EXPECT_FALSE(generated_product_split(st, sh)) << "=on is mode 1: the output projection whole";
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "3", 1);
  EXPECT_TRUE(generated_product_split(st, sh)) << "an unknown split mode is the default (2)";
  sh.k = 3072;
  EXPECT_TRUE(generated_product_fits(st, sh)) << "an unknown split mode is the default";
  unsetenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K");
  sh.k = 768, sh.n = 96;
  EXPECT_FALSE(generated_product_fits(st, sh));
  sh.n = 768, sh.batch = 2;
  EXPECT_FALSE(generated_product_fits(st, sh));
  sh.batch = 1;
  st.epilogue.residual = 4, st.epilogue.beta = 1.0;
  EXPECT_TRUE(generated_product_fits(st, sh));
  st.epilogue.gelu = GeluForm::Tanh;
  EXPECT_FALSE(generated_product_fits(st, sh));
  st.epilogue.residual = -1, st.epilogue.beta = 0.0;
  EXPECT_TRUE(generated_product_fits(st, sh));
  st.epilogue.gelu = GeluForm::Erf;
  EXPECT_FALSE(generated_product_fits(st, sh));
  st.epilogue.gelu = GeluForm::None, st.dtype = DType::F32;
  EXPECT_FALSE(generated_product_fits(st, sh));
  st.dtype = DType::BF16, st.epilogue.alpha = 0.5;
  EXPECT_FALSE(generated_product_fits(st, sh));
}

// The heads merged back as the exporter writes it (permute [0, 2, 1, 3], reshape [-1, H*D]): the
// attention kernel writes that layout itself, so one layer's attention is one launch.
TEST(CudaPipeline, AttentionWritesTheMergedHeadsLayout) {
  GraphBuilder b("attn_merge");
  SymInt s0 = b.symbol("x.size()[1]", 40);
  ValueId qkv = b.input("x", {1, s0, 192}, DType::BF16);
  ValueId mask = b.input("mask", {1, 1, s0, s0}, DType::BF16);
  ValueId c = b.constant(full({}, 0.42, DType::BF16));
  ValueId a = exported_attention(b, qkv, mask, s0, c);
  ValueId m = b.call(OpKind::reshape, {b.call(OpKind::permute, {a}, {{"dims", SymIntVec{0, 2, 1, 3}}})}, {{"shape", SymIntVec{-1, 64}}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {m}, {s0}), render_only(), &info);
  EXPECT_EQ(info.fused_attention, 1);
  EXPECT_EQ(info.attention_views, 4) << "q, k, v read in place and the output written merged";
  ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);
  EXPECT_NE(p.source.find("const long long o_rs = 64;"), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("o_off += (rem % (long long)(2)) * (long long)(32);"), std::string::npos) << p.source;
  EXPECT_EQ(p.kernels[0].params[4].index, p.buffers.outputs[0]) << "the kernel's out is the graph output";
}

TEST(CudaNvrtc, FuzzerProgramsCompileCleanly) {
  REQUIRE_NVRTC();
  int iters = 16;
  if (const char* e = std::getenv("PROTEAN_FUZZ_ITERS")) iters = std::atoi(e);
  Batch batch;
  for (int it = 0; it < iters; ++it) {
    std::mt19937 rng(1000 + it);  // the programs of CpuDifferential.RandomProgramsMatchInterp
    cpu::testing::RandomProgram rp;
    cpu::testing::build_random(rp, rng);
    const std::string text = ir::print(rp.b.g);
    // alternately without bounds and with bounds (row kernels in registers, 32-bit index math)
    std::map<std::string, int64_t> bounds;
    if (it % 2) bounds = {{"s0", 4096}, {"s1", 200}};
    batch.add(input_of(rp.b, rp.outs, {rp.s0, rp.s1}), bounds, fmt::format("program {}\n{}", it, text));
  }
  batch.expect_clean("fuzz.cu");
}

// The random residual streams of CpuDifferential.RandomResidualStreamsMatchInterp in bf16 storage on
// the cuda backend: stored sums read back after the row's barrier, residual epilogues; with and
// without bounds (a warp or a block per row), NVRTC-clean.
TEST(CudaNvrtc, ResidualStreamProgramsCompileCleanly) {
  REQUIRE_NVRTC();
  int iters = 10;
  if (const char* e = std::getenv("PROTEAN_FUZZ_ITERS")) iters = std::atoi(e);
  Batch batch;
  for (int it = 0; it < iters; ++it) {
    std::mt19937 rng(7000 + it);
    cpu::testing::RandomProgram rp;
    cpu::testing::build_residual_stream(rp, rng, it % 2 == 1);
    const std::string text = ir::print(rp.b.g);
    std::map<std::string, int64_t> bounds;
    if (it % 2) bounds = {{"s0", 4096}, {"s1", 768}};
    batch.add(input_of(rp.b, rp.outs, {rp.s0, rp.s1}), bounds, fmt::format("program {}\n{}", it, text));
  }
  batch.expect_clean("residual_fuzz.cu");
}

TEST(CudaNvrtc, PartsCompileOnThreadsIntoOneContainer) {
  // containers: one cubin stays as it is; several round-trip; a truncated one is refused
  const std::vector<uint8_t> a = {1, 2, 3}, b(40, 7);
  EXPECT_EQ(pack_cubins({a}), a);
  const std::vector<uint8_t> both = pack_cubins({a, b}, {{"k0"}, {"k1", "k2"}});
  const auto parts = unpack_cubins(both);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(std::vector<uint8_t>(parts[0].data, parts[0].data + parts[0].size), a);
  EXPECT_EQ(std::vector<uint8_t>(parts[1].data, parts[1].data + parts[1].size), b);
  EXPECT_EQ(parts[0].entries, std::vector<std::string>{"k0"});
  EXPECT_EQ(parts[1].entries, (std::vector<std::string>{"k1", "k2"}));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(parts[1].data) % 16, reinterpret_cast<uintptr_t>(both.data()) % 16);
  EXPECT_EQ(unpack_cubins(a).size(), 1u);
  EXPECT_TRUE(unpack_cubins(a)[0].entries.empty());
  EXPECT_THROW(unpack_cubins(std::vector<uint8_t>(both.begin(), both.begin() + 40)), CompileError);
  REQUIRE_NVRTC();
  // three entry points (one behind a guarded definition block) compiled as two parts
  const std::string src = std::string(cuda_prelude()) + "#define PT_TEST_ATTR(n)\n" +
                          "extern \"C\" __global__ void __launch_bounds__(256) kernel0(float* b0) { b0[0] = pt::exp(b0[1]); }\n"
                          "#ifndef PT_TEST_DEF\n#define PT_TEST_DEF\nstruct pt_test_def { float v; };\n#endif\n"
                          "extern \"C\" __global__ void __launch_bounds__(256) kernel1(float* b0) { pt_test_def d{b0[0]}; b0[1] = d.v; }\n"
                          "extern \"C\" __global__ void __launch_bounds__(128) kernel2(float* b0) { pt_test_def d{b0[2]}; b0[3] = d.v; }\n"
                          // an attribute macro before __launch_bounds__, as the max-autotune row splits write
                          // their cluster (PT_CLUSTER_DIMS): the part still names the entry
                          "extern \"C\" __global__ void PT_TEST_ATTR(2) __launch_bounds__(64) kernel3(float* b0) { b0[4] = 2.f; }\n";
  const NvrtcResult r = nvrtc_compile_parts(src, "parts.cu", {}, 2);
  const auto rp = unpack_cubins(r.cubin);
  ASSERT_EQ(rp.size(), 2u);
  EXPECT_EQ(rp[0].entries.size() + rp[1].entries.size(), 4u);  // every entry in exactly one part
  for (const char* k : {"kernel0", "kernel1", "kernel2", "kernel3"}) {
    EXPECT_TRUE(r.resources.count(k)) << k << "\n" << r.log;
    int in = 0;
    for (const CubinPart& p : rp) in += static_cast<int>(std::count(p.entries.begin(), p.entries.end(), k));
    EXPECT_EQ(in, 1) << k;
  }
  const NvrtcResult one = nvrtc_compile_parts(src, "parts.cu", {}, 1);
  EXPECT_EQ(unpack_cubins(one.cubin).size(), 1u);
  EXPECT_EQ(one.resources.size(), 4u);
}

TEST(CudaNvrtc, EntryNameSkipsAttributesWrittenAsCalls) {
  const std::string a = "extern \"C\" __global__ void kernel0(float* b0) {}";
  const std::string b = "extern \"C\" __global__ void __launch_bounds__(256, 2) kernel1_aligned(float* b0, int64_t s0) {}";
  const std::string c = "extern \"C\" __global__ void PT_CLUSTER_DIMS(4) __launch_bounds__(1024) kernel2_aligned_r1v8s4(float* b0) {}";
  const std::string d = "x\nextern \"C\" __global__ void PT_CLUSTER_DIMS(2) k3(const float* __restrict__ b0, int64_t s0) {}";
  EXPECT_EQ(entry_name_at(a, 0), "kernel0");
  EXPECT_EQ(entry_name_at(b, 0), "kernel1_aligned");
  EXPECT_EQ(entry_name_at(c, 0), "kernel2_aligned_r1v8s4");
  EXPECT_EQ(entry_name_at(d, 0), "k3");
  EXPECT_EQ(entry_name_at("no declaration here", 0), "");
}

TEST(CudaNvrtc, CompileErrorNamesTheKernel) {
  REQUIRE_NVRTC();
  const std::string src = std::string(cuda_prelude()) +
                          "extern \"C\" __global__ void __launch_bounds__(256) kernel0(float* b0) { b0[0] = 1.0f; }\n"
                          "extern \"C\" __global__ void __launch_bounds__(256) kernel1(float* b0) {\n"
                          "  b0[0] = undefined_name;\n}\n";
  try {
    nvrtc_compile(src, "broken.cu");
    ADD_FAILURE() << "no error";
  } catch (const NvrtcCompileError& e) {
    EXPECT_EQ(e.kernel(), "kernel1");
    const std::string m = e.what();
    EXPECT_NE(m.find("kernel 'kernel1' of broken.cu"), std::string::npos) << m;
    EXPECT_NE(m.find("undefined_name"), std::string::npos) << m;
    EXPECT_NE(m.find("sm_90"), std::string::npos) << m;
  }
}


// Every kernel entry the compile emits — loop kernels (pointwise, row), the fused attention, and the
// externs' kernels (index_select, cumsum, pooling) — starts by waiting for the grids ahead of it, so
// the runtime may launch each programmatically; the flag follows the text, not the kernel's kind.
TEST(CudaPipeline, EveryKernelEntryWaitsForThePriorGrids) {
  GraphBuilder b("pdl");
  SymInt s0 = b.symbol("x.size()[1]", 40);
  ValueId qkv = b.input("x", {1, s0, 192}, DType::BF16);
  ValueId mask = b.input("mask", {1, 1, s0, s0}, DType::BF16);
  ValueId c = b.constant(full({}, std::sqrt(1.0 / std::sqrt(32.0)), DType::BF16));
  ValueId att = exported_attention(b, qkv, mask, s0, c);
  ValueId sm = b.call(OpKind::softmax, {b.call(OpKind::exp, {qkv})}, {{"dim", SymInt(-1)}});
  ValueId table = b.input("table", {100, 64}, DType::BF16);
  ValueId ids = b.input("ids", {s0}, DType::I64);
  ValueId emb = b.call(OpKind::index_select, {table, ids}, {{"dim", SymInt(0)}});
  ValueId cs = b.call(OpKind::cumsum, {b.input("m", {1, s0}, DType::I64)}, {{"dim", SymInt(1)}});
  ValueId img = b.input("img", {1, 4, s0, 16});
  ValueId mp = b.call(OpKind::max_pool2d, {img}, {{"kernel_size", SymIntVec{2, 2}}, {"stride", SymIntVec{2, 2}},
                                                  {"padding", SymIntVec{0, 0}}, {"dilation", SymIntVec{1, 1}},
                                                  {"ceil_mode", false}});
  CudaCompileInfo info;
  CudaProgram p = compile_cuda_program(input_of(b, {att, sm, emb, cs, mp}, {s0}), render_only(), &info);
  EXPECT_EQ(info.fused_attention, 1) << to_text(p);
  std::set<std::string> kinds;
  for (const CudaKernel& k : p.kernels) {
    EXPECT_TRUE(k.waits_for_prior_grids) << k.name << "\n" << p.source;
    kinds.insert(k.name.rfind("ext", 0) == 0 ? k.name.substr(k.name.find('_') + 1) : "loop");
  }
  EXPECT_EQ(kinds, (std::set<std::string>{"loop", "scaled_dot_product_attention", "index_select", "cumsum", "max_pool2d"}))
      << to_text(p);

  // the parse: only entries whose body opens with the wait
  const std::string src = std::string("extern \"C\" __global__ void __launch_bounds__(256) a_aligned(const float* x) {\n") +
                          kWaitPriorGrids + "  x[0];\n}\n" +
                          "extern \"C\" __global__ void __launch_bounds__(128, 2) b_general(float* y, long long s0_arg) {\n"
                          "  const long long s0 = (long long)s0_arg;\n" + kWaitPriorGrids + "}\n" +
                          "extern \"C\" __global__ void c(float* y) {\n" + kWaitPriorGrids + "}\n" +
                          "extern \"C\" __global__ void d(float* y, const long long* __restrict__ pt_sizes) {\n"
                          "  const int s0 = (int)pt_sizes[0];\n  const long long s1 = pt_sizes[1];\n" + kWaitPriorGrids + "}\n" +
                          "extern \"C\" __global__ void e(float* y, const long long* __restrict__ pt_sizes) {\n"
                          "  const int s0 = (int)pt_sizes[0];\n  y[0] = 1;\n" + kWaitPriorGrids + "}\n";
  EXPECT_EQ(entries_waiting_for_prior_grids(src), (std::set<std::string>{"a_aligned", "c", "d"}))
      << "size loads from memory may come first; nothing else may";
}

// Modes reduce-overhead and max-autotune (CUDA graphs): the loop kernels, the fused attention and
// index_select read their sizes from memory, before they wait for the prior grids, and their blocks
// past the work return, so a graph node launched at its bucket's bound computes the same; the other
// externs (here cumsum) keep their sizes by value. Other modes, and PROTEAN_CUDA_SIZES_IN_MEMORY=0, pass every size by value.
TEST(CudaPipeline, GraphModesReadSizesFromMemory) {
  auto build = [](const std::string& mode) {
    GraphBuilder b("sizes");
    SymInt s0 = b.symbol("x.size()[1]", 40);
    ValueId qkv = b.input("x", {1, s0, 192}, DType::BF16);
    ValueId mask = b.input("mask", {1, 1, s0, s0}, DType::BF16);
    ValueId c = b.constant(full({}, std::sqrt(1.0 / std::sqrt(32.0)), DType::BF16));
    ValueId att = exported_attention(b, qkv, mask, s0, c);
    ValueId rows = b.call(OpKind::softmax, {b.input("h", {s0, 4096})}, {{"dim", SymInt(-1)}});  // a block per row
    ValueId table = b.input("table", {100, 64}, DType::BF16);
    ValueId emb = b.call(OpKind::index_select, {table, b.input("ids", {s0}, DType::I64)}, {{"dim", SymInt(0)}});
    ValueId cs = b.call(OpKind::cumsum, {b.input("m", {1, s0}, DType::I64)}, {{"dim", SymInt(1)}});
    BackendInput in = input_of(b, {att, rows, emb, cs}, {s0});
    in.mode = mode;
    return in;
  };
  auto has = [](const CudaKernel& k, ParamKind kind) {
    return std::any_of(k.params.begin(), k.params.end(), [&](const KernelParam& a) { return a.kind == kind; });
  };
  CudaProgram p = compile_cuda_program(build("reduce-overhead"), render_only());
  int from_memory = 0, by_value = 0;
  for (const CudaKernel& k : p.kernels) {
    EXPECT_TRUE(k.waits_for_prior_grids) << k.name << "\n" << p.source;
    const bool loop_or_attention = k.name.rfind("ext", 0) != 0 || k.name.find("scaled_dot_product_attention") != std::string::npos ||
                                   k.name.find("index_select") != std::string::npos;
    EXPECT_EQ(sizes_from_memory(k), loop_or_attention) << k.name;
    EXPECT_EQ(has(k, ParamKind::Symbol), !loop_or_attention) << k.name;
    (loop_or_attention ? from_memory : by_value) += 1;
  }
  EXPECT_GE(from_memory, 3);
  EXPECT_EQ(by_value, 1) << "cumsum";
  // the loads come first, then the wait; the block-per-row softmax and the attention return past their work
  EXPECT_NE(p.source.find("  const long long s0 = (long long)pt_sizes[0];\n" + std::string(kWaitPriorGrids)), std::string::npos)
      << p.source;
  EXPECT_NE(p.source.find("  if (row >= s0) return;\n"), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("  if (bh >= BH) return;\n"), std::string::npos) << p.source;
  EXPECT_NE(to_text(p).find(", sizes)"), std::string::npos) << to_text(p);

  for (const CudaKernel& k : compile_cuda_program(build("default"), render_only()).kernels)
    EXPECT_FALSE(sizes_from_memory(k)) << k.name;
  setenv("PROTEAN_CUDA_SIZES_IN_MEMORY", "0", 1);
  const CudaProgram off = compile_cuda_program(build("max-autotune"), render_only());
  unsetenv("PROTEAN_CUDA_SIZES_IN_MEMORY");
  for (const CudaKernel& k : off.kernels) EXPECT_FALSE(sizes_from_memory(k)) << k.name;
  EXPECT_EQ(off.source.find("pt_sizes"), std::string::npos);

  // NVRTC compiles it (where the toolkit is installed)
  try {
    const CudaProgram compiled = compile_cuda_program(build("reduce-overhead"));
    EXPECT_FALSE(compiled.cubin.empty());
  } catch (const CompileError& e) {
    if (std::string(e.what()).find("NVRTC") == std::string::npos) throw;
  }
}

// ---- max-autotune: candidate variants of row kernels -------------------------------------------

TEST(CudaSchedule, TuneCandidatesOfRowKernels) {
  auto tags = [](const std::vector<TuneChoice>& c) {
    std::string t;
    for (const TuneChoice& x : c)
      t += fmt::format("{}r{}v{}{}", t.empty() ? "" : " ", x.rows_per_block, x.vector_width, x.split > 1 ? fmt::format("s{}", x.split) : "");
    return t;
  };
  loop::Schedule s;
  s.target = "cuda";
  s.gpu_form = loop::GpuForm::WarpPerRow;
  s.rows_per_block = 4;
  s.vector_width = 8;  // bf16
  EXPECT_EQ(tags(tune_candidates(s)), "r4v8 r1v2 r1v4 r1v8 r2v2 r2v4 r2v8 r4v2 r4v4") << "candidate 0 is the schedule's own";
  s.vector_width = 4;  // f32
  EXPECT_EQ(tags(tune_candidates(s)), "r4v4 r1v2 r1v4 r2v2 r2v4 r4v2");
  s.gpu_form = loop::GpuForm::BlockPerRow;
  s.rows_per_block = 1;
  s.block_threads = 1024;
  EXPECT_EQ(tags(tune_candidates(s)), "r1v4 r1v2 r1v4s2 r1v4s4") << "a block per row: vector widths, then splits at its own width";
  s.rows_persist = true;
  s.persist_chunks = 2;
  EXPECT_EQ(tags(tune_candidates(s)), "r1v4 r1v2 r1v4s2") << "a row in registers: its values per thread divide by the split";
  s.rows_persist = false;
  s.vector_width = 1;
  EXPECT_EQ(tags(tune_candidates(s)), "r1v1 r1v1s2 r1v1s4") << "splits only";
  s.block_threads = 32;
  EXPECT_TRUE(tune_candidates(s).empty()) << "nothing to vary";
  s.gpu_form = loop::GpuForm::GridStride;
  s.vector_width = 4;
  EXPECT_TRUE(tune_candidates(s).empty()) << "not a row kernel";
}

/// LN+GELU and softmax rows (bf16 and f32) as max-autotune compiles them.
std::vector<std::pair<std::string, BackendInput>> tunable_rows() {
  std::vector<std::pair<std::string, BackendInput>> r;
  auto ln_gelu = [&](const char* name, int64_t cols, DType t) {
    GraphBuilder b(name);
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ValueId x = b.input("x", {s0, cols}, t);
    ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {cols}, t), b.input("b", {cols}, t)},
                       {{"normalized_shape", SymIntVec{cols}}, {"eps", 1e-5}});
    ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
    BackendInput in = input_of(b, {g}, {s0});
    in.upper_bounds = {{"s0", 1 << 16}};
    r.push_back({name, in});
  };
  auto softmax = [&](const char* name, DType t) {
    GraphBuilder b(name);
    SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 100);
    ValueId y = b.call(OpKind::softmax, {b.input("x", {s0, s1}, t)}, {{"dim", SymInt(-1)}});
    BackendInput in = input_of(b, {y}, {s0, s1});
    in.upper_bounds = {{"s0", 1 << 16}, {"s1", 4096}};
    r.push_back({name, in});
  };
  ln_gelu("ln_gelu_768_bf16", 768, DType::BF16);    // a warp per row (GPT-2 small's width)
  ln_gelu("ln_gelu_4096_bf16", 4096, DType::BF16);  // a block per row, the row in registers
  ln_gelu("ln_gelu_1024_f32", 1024, DType::F32);
  softmax("softmax_bf16", DType::BF16);
  softmax("softmax_f32", DType::F32);
  // few long rows: columns up to 65536 do not stay in registers (the row streams), a block per row
  auto streaming = [&](const char* name, bool ln, DType t) {
    GraphBuilder b(name);
    SymInt s0 = b.symbol("x.size()[0]", 32), s1 = b.symbol("x.size()[1]", 16384);
    ValueId x = b.input("x", {s0, s1}, t);
    ValueId y = x;
    if (ln) {
      ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {s1}, t), b.input("b", {s1}, t)},
                         {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
      y = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
    } else {
      y = b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}});
    }
    BackendInput in = input_of(b, {y}, {s0, s1});
    in.upper_bounds = {{"s0", 1 << 16}, {"s1", 65536}};
    r.push_back({name, in});
  };
  streaming("ln_gelu_stream_bf16", true, DType::BF16);
  streaming("softmax_stream_bf16", false, DType::BF16);
  streaming("ln_gelu_stream_f32", true, DType::F32);
  for (auto& [name, in] : r) in.mode = "max-autotune";
  return r;
}

TEST(CudaPipeline, MaxAutotuneRendersRowKernelVariants) {
  for (auto [name, in] : tunable_rows()) {
    SCOPED_TRACE(name);
    CudaCompileInfo info;
    const CudaProgram p = compile_cuda_program(in, render_only(), &info);
    ASSERT_EQ(p.kernels.size(), 1u);
    const CudaKernel& k = p.kernels[0];
    ASSERT_FALSE(k.tune.empty()) << to_text(p);
    EXPECT_EQ(info.tune_variants, static_cast<int>(k.tune.size()));
    EXPECT_TRUE(p.tune_source.starts_with(cuda_prelude()));
    EXPECT_EQ(p.source.find("_r1v"), std::string::npos) << "the program's own unit is unchanged";
    for (const TuneVariant& t : k.tune) {
      EXPECT_EQ(t.variant.entry, k.aligned.entry + "_" + t.tag());
      EXPECT_NE(p.tune_source.find(t.variant.entry + "("), std::string::npos) << t.variant.entry;
      EXPECT_EQ(t.rule.multiple, t.vector_width);
      EXPECT_EQ(t.variant.launch.work, k.aligned.launch.work);
      EXPECT_EQ(t.variant.launch.row_capacity, k.aligned.launch.row_capacity);
      if (k.aligned.launch.shape == LaunchShape::WarpPerRow) {
        EXPECT_EQ(k.aligned.launch.fill_blocks, 132) << "the kernel's own entry fills the multiprocessors";
        EXPECT_NE(entry_text(p.source, k.aligned.entry).find("blockIdx.x * (int)(blockDim.x / 32)"), std::string::npos)
            << "its rows per block come from the launch\n" << entry_text(p.source, k.aligned.entry);
        EXPECT_EQ(t.variant.launch.fill_blocks, 0) << "a candidate keeps the rows per block it is timed at";
        EXPECT_EQ(t.variant.launch.block_threads, 32 * t.rows_per_block);
        EXPECT_EQ(t.variant.launch.rows_per_block, t.rows_per_block);
      } else {
        EXPECT_EQ(t.rows_per_block, 1);
        EXPECT_EQ(t.variant.launch.block_threads, k.aligned.launch.block_threads);
      }
      EXPECT_EQ(t.variant.launch.cluster, t.split);
      if (t.split > 1) {  // a thread-block cluster of `split` blocks per row, sm_90 only
        const std::string text = entry_text(p.tune_source, t.variant.entry);
        const size_t at = p.tune_source.find(" " + t.variant.entry + "(");
        ASSERT_NE(at, std::string::npos);
        const std::string header = p.tune_source.substr(p.tune_source.rfind('\n', at) + 1, at - p.tune_source.rfind('\n', at));
        EXPECT_NE(header.find(fmt::format("PT_CLUSTER_DIMS({}) __launch_bounds__", t.split)), std::string::npos) << header;
        EXPECT_NE(text.find("pt::cluster_ld("), std::string::npos) << text;
        EXPECT_EQ(text.find("if (lane == 0) {\n"), std::string::npos) << "only block 0 stores the row's statistics\n" << text;
        EXPECT_EQ(launch_dims_at(t.variant.launch, 24, 1000).grid, 24u * static_cast<unsigned>(t.split));
        EXPECT_EQ(launch_dims_at(t.variant.launch, 24, 1000).cluster, static_cast<unsigned>(t.split));
      }
    }
    if (const char* dump = std::getenv("PROTEAN_TEST_DUMP_TUNE"); dump && name == dump) std::cout << p.tune_source;
    // the same program in the other modes: no variants; reduce-overhead renders the same unit (both
    // graph modes read the sizes from memory), the default mode takes them by value
    for (const char* mode : {"default", "reduce-overhead"}) {
      in.mode = mode;
      const CudaProgram q = compile_cuda_program(in, render_only());
      EXPECT_TRUE(q.kernels[0].tune.empty()) << mode;
      EXPECT_TRUE(q.tune_source.empty()) << mode;
      if (std::string(mode) == "reduce-overhead") EXPECT_EQ(q.source, p.source) << mode;
      else EXPECT_EQ(q.source.find("pt_sizes"), std::string::npos) << mode;
    }
  }
  // GPT-2 small's LayerNorm rows: a warp per row at 4 rows per block, 8 bf16 per vector
  const CudaProgram p = compile_cuda_program(tunable_rows()[0].second, render_only());
  std::string tags;
  for (const TuneVariant& t : p.kernels[0].tune) tags += (tags.empty() ? "" : " ") + t.tag();
  EXPECT_EQ(tags, "r1v2 r1v4 r1v8 r2v2 r2v4 r2v8 r4v2 r4v4") << to_text(p);
  {  // two equal LayerNorm+GELU layers around a product (kernel dedup): the second launches the first's variants
    GraphBuilder b("two_layers");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    auto layer = [&](ValueId x) {
      ValueId n = b.call(OpKind::layer_norm, {x, b.input("w", {768}, DType::BF16), b.input("b", {768}, DType::BF16)},
                         {{"normalized_shape", SymIntVec{768}}, {"eps", 1e-5}});
      return b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
    };
    ValueId g = layer(b.call(OpKind::matmul, {layer(b.input("x", {s0, 768}, DType::BF16)), b.input("W", {768, 768}, DType::BF16)}));
    BackendInput in = input_of(b, {g}, {s0});
    in.mode = "max-autotune";
    CudaCompileInfo info;
    const CudaProgram two = compile_cuda_program(in, render_only(), &info);
    ASSERT_EQ(two.kernels.size(), 2u) << to_text(two);
    EXPECT_EQ(info.deduplicated, 1);
    ASSERT_EQ(two.kernels[1].tune.size(), two.kernels[0].tune.size());
    for (size_t i = 0; i < two.kernels[0].tune.size(); ++i)
      EXPECT_EQ(two.kernels[1].tune[i].variant.entry, two.kernels[0].tune[i].variant.entry);
    size_t entries = 0;
    for (size_t at = two.tune_source.find("extern \"C\""); at != std::string::npos; at = two.tune_source.find("extern \"C\"", at + 1))
      ++entries;
    EXPECT_EQ(entries, two.kernels[0].tune.size()) << "each variant once";
  }
  setenv("PROTEAN_AUTOTUNE_VARIANTS", "0", 1);
  EXPECT_TRUE(compile_cuda_program(tunable_rows()[0].second, render_only()).kernels[0].tune.empty());
  unsetenv("PROTEAN_AUTOTUNE_VARIANTS");
}

// Every candidate variant compiles for sm_90 through the same NVRTC path as the program, with no
// spills and no stack frame, and registers within its own __launch_bounds__.
TEST(CudaNvrtc, MaxAutotuneRowVariantsCompileWithoutSpills) {
  REQUIRE_NVRTC();
  for (const auto& [name, in] : tunable_rows()) {
    SCOPED_TRACE(name);
    CudaCompileOptions o;
    CudaProgram p;
    try {
      p = compile_cuda_program(in, o);
    } catch (const NvrtcCompileError& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    ASSERT_FALSE(p.tune_cubin.empty());
    for (const TuneVariant& t : p.kernels[0].tune) {
      SCOPED_TRACE(t.variant.entry);
      const PtxasInfo& r = t.variant.resources;
      ASSERT_TRUE(r.present) << p.compile_log;
      EXPECT_EQ(r.spill_stores, 0) << entry_text(p.tune_source, t.variant.entry);
      EXPECT_EQ(r.spill_loads, 0);
      EXPECT_EQ(r.stack_bytes, 0);
      EXPECT_LE(r.registers, std::min(255, 65536 / t.variant.launch.block_threads));
    }
  }
}

}  // namespace
}  // namespace protean::backend::cuda
