// Schedules as data: the cpu policy (loop/schedule_cpu.h) decides parallel axes, vector width,
// reduction strategies, prefetches and the work threshold; the cpu renderer prints only what the
// schedule says, and refuses a kernel without a cpu schedule or with a strategy it does not render.
#include <gtest/gtest.h>

#include <regex>

#include <cstdio>
#include <cstdlib>

#include "backend/cpu/codegen.h"
#include "ir/sym_util.h"
#include "ir_test_util.h"
#include "loop/lower.h"
#include "loop/schedule.h"
#include "loop/schedule_cpu.h"
#include "protean/error.h"

namespace protean::loop {
namespace {

using ir::testing::GraphBuilder;
using ops::OpKind;

Program softmax_program() {
  GraphBuilder b("softmax");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ir::ValueId x = b.input("x", {s0, 4096});
  b.done({b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}})});
  Program p = lower_graph(b.g, {ir::to_expr(s0)});
  schedule_program(p);
  return p;
}

Program pointwise_program() {
  GraphBuilder b("pw");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ir::ValueId x = b.input("x", {s0, 64});
  b.done({b.call(OpKind::exp, {b.call(OpKind::add, {x, x})})});
  Program p = lower_graph(b.g, {ir::to_expr(s0)});
  schedule_program(p);
  return p;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

TEST(LoopSchedule, CpuPolicyRowKernel) {
  Program p = softmax_program();
  apply_schedule(p, CpuSchedulePolicy(CpuScheduleOptions{}));
  ASSERT_EQ(p.kernels.size(), 1u);
  const Kernel& k = p.kernels[0];
  const Schedule& s = k.schedule;
  EXPECT_EQ(s.target, "cpu");
  EXPECT_FALSE(s.fused_pointwise);
  EXPECT_EQ(s.parallel_axes, 1u);
  EXPECT_EQ(s.collapse, 1u);
  EXPECT_EQ(s.work_threshold, 131072);
  EXPECT_EQ(s.vector_width, 16);
  EXPECT_EQ(s.vector_bytes, 64);
  EXPECT_TRUE(s.rows_persist);
  ASSERT_EQ(s.stages.size(), k.stages.size());
  ASSERT_GE(k.stages.size(), 3u);
  // max: vector accumulators with a NaN mask; sum of exp: 64 accumulator lanes in four vectors
  EXPECT_EQ(s.stages[0].reduction, ReductionStrategy::VectorMinMax);
  EXPECT_EQ(s.stages[0].lanes, 64);
  EXPECT_EQ(s.stages[1].reduction, ReductionStrategy::Lanes);
  EXPECT_EQ(s.stages[1].lanes, 64);
  EXPECT_TRUE(s.stages[1].vector);
  int prefetching = 0;
  for (size_t j = 0; j < s.stages.size(); ++j)
    if (!s.stages[j].prefetch.empty()) {
      ++prefetching;
      EXPECT_GT(j, 0u) << "the first stage streams the row; a later one prefetches the next";
    }
  EXPECT_EQ(prefetching, 1);
  // the text form prints the schedule
  const std::string text = to_text(p);
  EXPECT_TRUE(contains(text, "schedule cpu: parallel x0 collapse(1), work 4096*s0, threshold 131072")) << text;
  EXPECT_TRUE(contains(text, "{vector_minmax 64, vector}")) << text;
  EXPECT_TRUE(contains(text, "{lanes 64, vector")) << text;
  EXPECT_TRUE(contains(text, "prefetch b")) << text;
  // the renderer follows it
  const std::string code = backend::cpu::generate_kernels(p);
  EXPECT_TRUE(contains(code, "#pragma omp for collapse(1) nowait")) << code;
  EXPECT_TRUE(contains(code, "if (work >= 131072) {\n#pragma omp parallel\n")) << code;
  EXPECT_TRUE(contains(code, "pt::prefetch(")) << code;
  // the scalar tails after the vector loops carry no `omp simd` (backend/cpu/codegen.cpp kTailNote:
  // GCC 12 vectorized such tails into masked loads at the wrong address)
  EXPECT_TRUE(contains(code, "= r0_v; r0 < ")) << code;
  EXPECT_FALSE(std::regex_search(code, std::regex(R"(#pragma omp simd[^\n]*\n\s*for \(int64_t (\w+) = \1_v;)"))) << code;
}

// A softmax over [1, s, d] (batch 1, the last dim reduced: a classifier head's scores) is one row
// kernel like the 2-D one: the max, the sum of exp (stashed) and the normalization all run over the
// same [1, s] rows. The leading 1 once made row fusion look for B's dims without it and give up: three
// kernels, exp computed twice.
TEST(LoopSchedule, RowFusionKeepsALeadingUnitDim) {
  GraphBuilder b("softmax3");
  SymInt s0 = b.symbol("x.size()[1]", 20);
  ir::ValueId x = b.input("x", {1, s0, 6625});
  b.done({b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}})});
  Program p = lower_graph(b.g, {ir::to_expr(s0)});
  ScheduleStats st = schedule_program(p);
  ASSERT_EQ(p.kernels.size(), 1u) << to_text(p);
  EXPECT_EQ(st.stashed_reductions, 1) << to_text(p);
  EXPECT_GE(p.kernels[0].stages.size(), 3u);
}

TEST(LoopSchedule, RendererTakesThresholdAndVectorFormFromTheSchedule) {
  Program p = pointwise_program();
  CpuScheduleOptions o;
  o.work_threshold = 1000;
  apply_schedule(p, CpuSchedulePolicy(o));
  ASSERT_EQ(p.kernels.size(), 1u);
  EXPECT_TRUE(p.kernels[0].schedule.fused_pointwise);
  EXPECT_TRUE(p.kernels[0].schedule.vector);
  std::string code = backend::cpu::generate_kernels(p);
  EXPECT_TRUE(contains(code, "if (work >= 1000) {")) << code;
  EXPECT_TRUE(contains(code, "pt::vld(")) << code;

  o.work_threshold = 0;  // always parallel: no if clause
  o.vectorize = false;
  apply_schedule(p, CpuSchedulePolicy(o));
  EXPECT_FALSE(p.kernels[0].schedule.vector);
  code = backend::cpu::generate_kernels(p);
  EXPECT_FALSE(contains(code, "if (work")) << code;
  EXPECT_FALSE(contains(code, "pt::vld(")) << code;
  EXPECT_TRUE(contains(code, "#pragma omp parallel for collapse(1)\n")) << code;
}

/// A second target's policy: one warp per row (what a GPU policy would choose).
class WarpPolicy final : public SchedulePolicy {
 public:
  std::string_view target() const override { return "gpu-test"; }
  std::vector<Schedule> schedule(const Program& p) const override {
    std::vector<Schedule> out;
    for (const Kernel& k : p.kernels) {
      Schedule s;
      s.parallel_axes = k.outer.size();
      s.threads_per_row = 32;
      s.work = kernel_work(k);
      s.stages.resize(k.stages.size());
      for (size_t j = 0; j < k.stages.size(); ++j)
        if (k.stages[j].kind == StageKind::Reduction) s.stages[j].reduction = ReductionStrategy::Warp;
      out.push_back(std::move(s));
    }
    return out;
  }
};

TEST(LoopSchedule, CpuRendererRefusesOtherSchedules) {
  Program p = softmax_program();
  EXPECT_THROW(backend::cpu::generate_kernels(p), CompileError) << "no schedule";
  apply_schedule(p, WarpPolicy());
  EXPECT_EQ(p.kernels[0].schedule.target, "gpu-test");
  EXPECT_TRUE(contains(to_text(p), "threads_per_row 32")) << to_text(p);
  EXPECT_TRUE(contains(to_text(p), "{warp}")) << to_text(p);
  EXPECT_THROW(backend::cpu::generate_kernels(p), CompileError) << "a gpu schedule";
  // a cpu-named schedule with a strategy the cpu renderer does not implement
  for (Kernel& k : p.kernels) k.schedule.target = "cpu";
  try {
    backend::cpu::generate_kernels(p);
    FAIL() << "a warp reduction was rendered";
  } catch (const CompileError& e) {
    EXPECT_TRUE(contains(e.what(), "'warp'")) << e.what();
  }
}

/// A policy that forgets a stage.
class BrokenPolicy final : public SchedulePolicy {
 public:
  std::string_view target() const override { return "broken"; }
  std::vector<Schedule> schedule(const Program& p) const override { return std::vector<Schedule>(p.kernels.size()); }
};

TEST(LoopSchedule, ApplyScheduleChecksThePolicy) {
  Program p = softmax_program();
  EXPECT_THROW(apply_schedule(p, BrokenPolicy()), CompileError);
}

// merge_contiguous_dims: a per-channel sum of an NCHW tensor [s0, 3, 5, 7] (BatchNorm's statistics)
// reduces over [s0, 35], and a pointwise kernel over it runs one dim of 105*s0; a transposed read
// keeps its dims (its accesses are not contiguous across them).
TEST(LoopSchedule, ContiguousDimsMerge) {
  GraphBuilder b("bn_stats");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ir::ValueId x = b.input("x", {s0, 3, 5, 7});
  ir::ValueId sum = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{0, 2, 3}}, {"keepdim", true}});
  ir::ValueId y = b.call(OpKind::exp, {x});
  ir::ValueId t = b.call(OpKind::permute, {x}, {{"dims", SymIntVec{0, 1, 3, 2}}});
  ir::ValueId z = b.call(OpKind::add, {t, t});
  b.done({sum, y, z});
  Program p = lower_graph(b.g, {ir::to_expr(s0)});
  schedule_program(p);
  const std::string before = to_text(p);
  EXPECT_GT(merge_contiguous_dims(p), 0);
  if (std::getenv("PROTEAN_TEST_PRINT")) std::fprintf(stderr, "%s\n", to_text(p).c_str());
  const std::string after = to_text(p);
  EXPECT_TRUE(contains(after, "reduce_sum over [s0, 35]: load(b0, 105*r0 + r1 + 35*x0)")) << after;
  EXPECT_TRUE(contains(after, "over [105*s0]")) << after;
  EXPECT_FALSE(contains(before, "over [105*s0]")) << before;
  // the transposed copy merges only its batch and channel dims
  EXPECT_TRUE(contains(after, "over [3*s0, 7, 5]")) << after;
}

}  // namespace
}  // namespace protean::loop
