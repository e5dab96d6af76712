// The loop text form reads back (loop/parse.h), scheduling tests start from text, and the loop-IR
// verifier (loop/verify.h) names the invariant a program breaks.
#include <gtest/gtest.h>

#include "backend/cpu/codegen.h"
#include "ir/sym_util.h"
#include "ir_test_util.h"
#include "loop/lower.h"
#include "loop/parse.h"
#include "loop/schedule.h"
#include "loop/schedule_cpu.h"
#include "loop/verify.h"
#include "protean/error.h"

namespace protean::loop {
namespace {

using ir::testing::GraphBuilder;
using ops::OpKind;

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// Lowered, fused, planned and cpu-scheduled programs of a few graphs (softmax, layer_norm + gelu,
/// reductions with welford, a broadcast with an extern matmul).
std::vector<Program> corpus() {
  std::vector<Program> out;
  auto finish = [&](GraphBuilder& b, std::vector<SymInt> syms) {
    std::vector<sym::Expr> s;
    for (const SymInt& x : syms) s.push_back(ir::to_expr(x));
    Program p = lower_graph(b.g, s);
    verify(p, "after lowering");
    schedule_program(p);
    verify(p, "after scheduling");
    apply_schedule(p, CpuSchedulePolicy(CpuScheduleOptions{}));
    verify(p, "after the cpu policy");
    out.push_back(std::move(p));
  };
  {
    GraphBuilder b("softmax");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ir::ValueId x = b.input("x", {s0, 4096});
    b.done({b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}})});
    finish(b, {s0});
  }
  {
    GraphBuilder b("ln_gelu");
    SymInt s0 = b.symbol("x.size()[0]", 8);
    ir::ValueId x = b.input("x", {s0, 4096}), w = b.input("w", {4096}), bb = b.input("b", {4096});
    ir::ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
    b.done({b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}})});
    finish(b, {s0});
  }
  {
    GraphBuilder b("red");
    SymInt s0 = b.symbol("x.size()[0]", 5), s1 = b.symbol("x.size()[2]", 6);
    ir::ValueId x = b.input("x", {s0, 3, s1});
    std::vector<ir::ValueId> outs;
    outs.push_back(b.call(OpKind::sum, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));
    outs.push_back(b.call(OpKind::amax, {x}, {{"dims", SymIntVec{2}}, {"keepdim", false}}));
    ops::Attrs va{{"dims", SymIntVec{2}}, {"keepdim", false}};
    va.set("correction", SymInt(1));
    outs.push_back(b.call(OpKind::var, {x}, va));
    ops::Attrs vall{{"dims", SymIntVec{}}, {"keepdim", false}};
    vall.set("correction", SymInt(1));
    outs.push_back(b.call(OpKind::var, {x}, vall));
    ir::ValueId xi = b.input("xi", {s0, 3, s1}, DType::I64);
    outs.push_back(b.call(OpKind::sum, {xi}, {{"dims", SymIntVec{2}}, {"keepdim", false}}));
    outs.push_back(b.call(OpKind::where, {b.call(OpKind::gt, {x, x}), x, b.call(OpKind::neg, {x})}));
    b.done(outs);
    finish(b, {s0, s1});
  }
  {
    GraphBuilder b("bcast");
    SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 3);
    ir::ValueId x = b.input("x", {s0, s1}), y = b.input("y", {s1, 1});
    ir::ValueId p = b.call(OpKind::permute, {x}, {{"dims", SymIntVec{1, 0}}});
    ir::ValueId m = b.call(OpKind::matmul, {b.call(OpKind::add, {p, y}), x});
    b.done({b.call(OpKind::relu, {m})});
    finish(b, {s0, s1});
  }
  return out;
}

TEST(LoopParse, TextFormRoundTrips) {
  for (const Program& p : corpus()) {
    const std::string text = to_text(p);
    Program q = parse_program(text);
    EXPECT_EQ(to_text(q), text) << "program " << p.name;
    // the parsed program renders the same kernels
    EXPECT_EQ(backend::cpu::generate_kernels(q), backend::cpu::generate_kernels(p)) << "program " << p.name;
  }
}

// A row reduction and the pointwise kernel that reads its result, unscheduled: scheduling fuses them
// into one row kernel whose second stage reads the reduction's local, and drops the buffer.
constexpr const char* kTwoKernels = R"(program t (symbols: s0)
  b0 : f32[s0, 64] input #0
  b1 : f32[s0] temp
  b2 : f32[s0, 64] output
  kernel0 over [s0]:
    acc0 = reduce_max over [64]: load(b0, 64*x0 + r0) -> b1[x0]
  kernel1 over [s0, 64]:
    pointwise over []: exp(sub(load(b0, 64*x0 + x1), load(b1, x0))) -> b2[64*x0 + x1]
  return b2
)";

TEST(LoopParse, SchedulingStartsFromText) {
  Program p = parse_program(kTwoKernels);
  ASSERT_EQ(p.kernels.size(), 2u);
  const ScheduleStats st = schedule_program(p);
  verify(p, "after scheduling");
  EXPECT_EQ(st.kernels_before, 2);
  EXPECT_EQ(st.kernels_after, 1);
  EXPECT_EQ(st.reductions_to_locals, 1);
  ASSERT_EQ(p.kernels[0].stages.size(), 2u);
  EXPECT_EQ(s_text(p.kernels[0].stages[1].body), "exp(sub(load(b0, r0 + 64*x0), acc0))");
  apply_schedule(p, CpuSchedulePolicy(CpuScheduleOptions{}));
  const Schedule& s = p.kernels[0].schedule;
  EXPECT_EQ(s.parallel_axes, 1u);
  EXPECT_TRUE(s.rows_persist);
  EXPECT_EQ(s.stages[0].reduction, ReductionStrategy::VectorMinMax);
  EXPECT_EQ(s.stages[1].block, 64) << "the pointwise stage prefetches the next row in blocks";
  // and the scheduled text reads back
  EXPECT_EQ(to_text(parse_program(to_text(p))), to_text(p));
}

/// `kTwoKernels` with `from` replaced by `to`.
std::string edited(const std::string& from, const std::string& to) {
  std::string t = kTwoKernels;
  const size_t at = t.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return t.replace(at, from.size(), to);
}

void expect_verify_error(const std::string& text, const std::string& what) {
  try {
    parse_program(text);
    ADD_FAILURE() << "no error; expected one naming: " << what << "\n" << text;
  } catch (const CompileError& e) {
    EXPECT_TRUE(contains(e.what(), what)) << e.what();
    EXPECT_TRUE(contains(e.what(), "loop IR verifier")) << e.what();
  }
}

TEST(LoopVerify, NamesTheBrokenInvariant) {
  // an index over an inner variable the stage does not have
  expect_verify_error(edited("load(b0, 64*x0 + r0)", "load(b0, 64*x0 + r1)"), "'r1'");
  // an in-place update: the pointwise kernel writes what it reads
  expect_verify_error(edited("-> b2[64*x0 + x1]", "-> b1[x0]"), "no in-place update");
  // a load before any step writes the buffer
  expect_verify_error(edited("-> b1[x0]", "-> b2[x0]"), "no earlier step writes");
  // a write to an input
  expect_verify_error(edited("-> b2[64*x0 + x1]", "-> b0[64*x0 + x1]"), "an input or constant");
  // a reduction with an unknown operator
  expect_verify_error(edited("reduce_max", "reduce_mean"), "'mean'");
}

TEST(LoopVerify, ChecksSchedules) {
  Program p = parse_program(kTwoKernels);
  schedule_program(p);
  apply_schedule(p, CpuSchedulePolicy(CpuScheduleOptions{}));
  verify(p, "test");
  Program bad = p;
  bad.kernels[0].schedule.stages[0].reduction = ReductionStrategy::Lanes;  // lanes for a max
  EXPECT_THROW(verify(bad, "test"), CompileError);
  bad = p;
  bad.kernels[0].schedule.parallel_axes = 2;  // more parallel axes than outer axes
  EXPECT_THROW(verify(bad, "test"), CompileError);
  bad = p;
  bad.kernels[0].schedule.stages[1].reduction = ReductionStrategy::Serial;  // a strategy on a pointwise stage
  EXPECT_THROW(verify(bad, "test"), CompileError);
  bad = p;
  bad.kernels[0].schedule.stages.pop_back();
  EXPECT_THROW(verify(bad, "test"), CompileError);
}

TEST(LoopParse, ErrorsNameTheLine) {
  try {
    parse_program(edited("  b1 : f32[s0] temp", "  b1 : q32[s0] temp"));
    FAIL() << "an unknown dtype was accepted";
  } catch (const FormatError& e) {
    EXPECT_TRUE(contains(e.what(), "line 3")) << e.what();
    EXPECT_TRUE(contains(e.what(), "dtype")) << e.what();
  }
  EXPECT_THROW(parse_program("program t (symbols:)\n  b0 : f32[4] input #0\n"), FormatError) << "no return line";
  EXPECT_THROW(parse_program(edited("exp(", "nosuchfn(")), FormatError);
  // a local no earlier reduction of the kernel defines
  EXPECT_THROW(parse_program(edited("load(b1, x0)))", "acc9))")), FormatError);
}

}  // namespace
}  // namespace protean::loop
