// The cpu lowering of what a training step's joint graph is made of: GEMM operands that are
// transposes and slices read in place (Extern::views), a flat gradient cat of many parts written by
// one stage per part, split as views. Each against the interpreter on several sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "backend/cpu/program_plan.h"
#include "cpu_test_util.h"
#include "ir_test_util.h"
#include "loop/parse.h"
#include "protean/ops.h"

namespace protean::backend::cpu {
namespace {

using namespace loop;

using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::check;
using testing::compile;
using testing::Compiled;

/// The extern steps of the program that run `op`.
std::vector<const Extern*> externs_of(const Program& p, OpKind op) {
  std::vector<const Extern*> r;
  for (const Extern& e : p.externs)
    if (e.op == op) r.push_back(&e);
  return r;
}
bool has_view(const Extern& e, size_t k) { return k < e.views.size() && e.views[k].offset != nullptr; }

TEST(CpuTrainLowering, GemmOperandsThatArePermutesOrSlicesAreReadInPlace) {
  // dW = gᵀ·x with g and x inputs; dV = exp(g)ᵀ·x (a permute of a computed value: exp is realized
  // once in its own order and read transposed); y = x·Wᵀ with W sliced out of a flat arena.
  manual_seed(11);
  GraphBuilder b("gemm_views");
  SymInt s0 = b.symbol("x.size()[0]", 6);
  ValueId x = b.input("x", {s0, 24}), g = b.input("g", {s0, 16}), arena = b.input("arena", {500});
  ValueId gt = b.call(OpKind::permute, {g}, {{"dims", SymIntVec{1, 0}}});
  ValueId dw = b.call(OpKind::matmul, {gt, x});
  ValueId eg = b.call(OpKind::permute, {b.call(OpKind::exp, {g})}, {{"dims", SymIntVec{1, 0}}});
  ValueId dv = b.call(OpKind::matmul, {eg, x});
  ValueId flat = b.call(OpKind::slice, {arena}, {{"dim", SymInt(0)}, {"start", SymInt(100)}, {"end", SymInt(100 + 16 * 24)}, {"step", SymInt(1)}});
  ValueId w = b.call(OpKind::reshape, {flat}, {{"shape", SymIntVec{16, 24}}});
  ValueId y = b.call(OpKind::linear, {x, w, ir::kNoValue});
  Compiled c = compile(b, {dw, dv, y}, {s0});
  const Program& p = c.cpu->program();
  const auto mm = externs_of(p, OpKind::matmul);
  ASSERT_EQ(mm.size(), 2u) << c.info.loop_ir;
  for (const Extern* e : mm) EXPECT_TRUE(has_view(*e, 0)) << "a transposed operand was copied:\n" << c.info.loop_ir;
  const auto lin = externs_of(p, OpKind::linear);
  ASSERT_EQ(lin.size(), 1u);
  EXPECT_TRUE(has_view(*lin[0], 1)) << "the weight was copied out of the arena:\n" << c.info.loop_ir;
  // the one kernel left computes exp(g) (in g's own order); no kernel copies an operand
  EXPECT_EQ(c.info.kernels, 1) << c.info.loop_ir;
  for (int64_t n : {1, 6, 37}) check(c, {randn({n, 24}), randn({n, 16}), randn({500})}, {n}, std::to_string(n));
  // the text form carries the views (the program cache stores plans as text)
  const std::string text = to_text(p);
  EXPECT_NE(text.find("view(b"), std::string::npos) << text;
  EXPECT_EQ(to_text(parse_program(text)), text);
}

TEST(CpuTrainLowering, ACatOfManyPartsIsOneStagePerPart) {
  // A flat gradient: the cat of seven parameters' gradients (a reduction, products, views). As a
  // select chain every element walked up to seven conditions; one stage per part copies its range.
  manual_seed(12);
  GraphBuilder b("flat_grad");
  SymInt s0 = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {s0, 8}), g = b.input("g", {s0, 4});
  std::vector<ValueId> parts;
  ValueId dw = b.call(OpKind::matmul, {b.call(OpKind::permute, {g}, {{"dims", SymIntVec{1, 0}}}), x});
  parts.push_back(b.call(OpKind::reshape, {dw}, {{"shape", SymIntVec{32}}}));
  parts.push_back(b.call(OpKind::sum, {g}, {{"dims", SymIntVec{0}}, {"keepdim", false}}));
  parts.push_back(b.call(OpKind::sum, {x}, {{"dims", SymIntVec{0}}, {"keepdim", false}}));
  parts.push_back(b.call(OpKind::amax, {x}, {{"dims", SymIntVec{0}}, {"keepdim", false}}));
  parts.push_back(b.call(OpKind::reshape, {b.call(OpKind::exp, {dw})}, {{"shape", SymIntVec{32}}}));
  parts.push_back(b.call(OpKind::sum, {g}, {{"dims", SymIntVec{1}}, {"keepdim", false}}));  // [s0]
  {
    sym::ShapeEnvScope scope(b.env);
    parts.push_back(b.call(OpKind::reshape, {b.call(OpKind::tanh, {x})}, {{"shape", SymIntVec{s0 * 8}}}));
  }
  ValueId flat = b.call(OpKind::cat, parts, {{"dim", SymInt(0)}});
  ValueId out = b.call(OpKind::mul, {flat, flat});
  Compiled c = compile(b, {out}, {s0});
  const Program& p = c.cpu->program();
  size_t most_stages = 0;
  for (const Kernel& k : p.kernels) most_stages = std::max(most_stages, k.stages.size());
  EXPECT_GE(most_stages, parts.size()) << "no kernel writes the cat part by part:\n" << c.info.loop_ir;
  for (int64_t n : {1, 5, 40}) check(c, {randn({n, 8}), randn({n, 4})}, {n}, std::to_string(n));
}

TEST(CpuTrainLowering, GemmResultsOfAFlatGradientAreWrittenIntoIt) {
  // The flat gradient of a parameter arena: five weight gradients gᵀ·x (GEMMs, static [4, 8] over a
  // dynamic batch) and a bias gradient (a reduction) concatenated, read by the update. The GEMMs
  // write their results into the cat's buffer; no slot of their own and no copy stage.
  manual_seed(15);
  GraphBuilder b("flat_grad_in_place");
  SymInt s0 = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {s0, 8}), g = b.input("g", {s0, 4}), arena = b.input("arena", {5 * 32 + 4});
  std::vector<ValueId> parts;
  for (int k = 0; k < 5; ++k) {
    ValueId gk = k == 0 ? g : b.call(OpKind::mul, {g, b.call(OpKind::exp, {b.call(OpKind::mul, {g, g})})});
    if (k > 1) gk = b.call(OpKind::add, {gk, b.call(OpKind::sin, {g})});
    if (k > 2) gk = b.call(OpKind::add, {gk, b.call(OpKind::cos, {g})});
    if (k > 3) gk = b.call(OpKind::neg, {gk});
    ValueId dw = b.call(OpKind::matmul, {b.call(OpKind::permute, {gk}, {{"dims", SymIntVec{1, 0}}}), x});
    parts.push_back(b.call(OpKind::reshape, {dw}, {{"shape", SymIntVec{32}}}));
  }
  parts.push_back(b.call(OpKind::sum, {g}, {{"dims", SymIntVec{0}}, {"keepdim", false}}));
  ValueId flat = b.call(OpKind::cat, parts, {{"dim", SymInt(0)}});
  ValueId out = b.call(OpKind::sub, {arena, b.call(OpKind::mul, {flat, flat})});
  Compiled c = compile(b, {out}, {s0});
  const Program& p = c.cpu->program();
  int into = -1, written_into = 0;
  for (const Buffer& buf : p.buffers)
    if (buf.alias >= 0) {
      ++written_into;
      EXPECT_TRUE(into < 0 || into == buf.alias) << c.info.loop_ir;
      into = buf.alias;
      EXPECT_EQ(buf.alias_offset % 32, 0) << c.info.loop_ir;
      EXPECT_LT(buf.slot, 0) << c.info.loop_ir;
    }
  ASSERT_GE(into, 0) << "no GEMM writes into the flat gradient:\n" << c.info.loop_ir;
  // the matmuls whose inputs differ (the first reads g itself and so may be a view; every result counts)
  EXPECT_EQ(written_into, 5) << c.info.loop_ir;
  for (const Kernel& k : p.kernels)
    for (const Stage& s : k.stages) {
      if (s.out == into && s.body->op == SOp::Load) {  // only the reduction's part is still copied
        EXPECT_FALSE(p.buffers[static_cast<size_t>(s.body->buffer)].from_extern) << "a GEMM result is still copied:\n"
                                                                                 << c.info.loop_ir;
      }
    }
  for (int64_t n : {1, 5, 40}) check(c, {randn({n, 8}), randn({n, 4}), randn({5 * 32 + 4})}, {n}, std::to_string(n));
  // the text form carries it (the program cache stores plans as text)
  const std::string text = to_text(p);
  EXPECT_NE(text.find(fmt::format(" into b{}[", into)), std::string::npos) << text;
  EXPECT_EQ(to_text(parse_program(text)), text);
}

TEST(CpuTrainLowering, ACatAlongAnInnerDimKeepsTheOuterLoop) {
  manual_seed(13);
  GraphBuilder b("cat_dim1");
  SymInt s0 = b.symbol("x.size()[0]", 3);
  std::vector<ValueId> parts;
  for (int64_t w : {1, 2, 3, 0, 5, 4}) parts.push_back(b.input("p" + std::to_string(parts.size()), {s0, w}));
  ValueId y = b.call(OpKind::cat, parts, {{"dim", SymInt(1)}});
  Compiled c = compile(b, {b.call(OpKind::neg, {y})}, {s0});
  for (int64_t n : {1, 3, 19}) {
    std::vector<Tensor> in;
    for (int64_t w : {1, 2, 3, 0, 5, 4}) in.push_back(randn({n, w}));
    check(c, in, {n}, std::to_string(n));
  }
}

TEST(CpuTrainLowering, SplitPartsAreViewsNotAnExtern) {
  // q, k, v = split(qkv): each part read in place by its consumer.
  manual_seed(14);
  GraphBuilder b("split");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId qkv = b.input("qkv", {s0, 12});
  ValueId w = b.input("w", {4, 4});
  std::vector<ValueId> parts = b.calls(OpKind::split, {qkv}, {{"dim", SymInt(1)}, {"sizes", SymIntVec{4, 4, 4}}});
  ASSERT_EQ(parts.size(), 3u);
  ValueId q = parts[0], k = parts[1], v = parts[2];
  ValueId y = b.call(OpKind::add, {b.call(OpKind::mul, {q, k}), b.call(OpKind::matmul, {v, w})});
  Compiled c = compile(b, {y}, {s0});
  EXPECT_TRUE(externs_of(c.cpu->program(), OpKind::split).empty()) << c.info.loop_ir;
  for (int64_t n : {1, 4, 21}) check(c, {randn({n, 12}), randn({4, 4})}, {n}, std::to_string(n));
}

TEST(CpuTrainLowering, APlanKeyNamesTheBuildThatLowersIt) {
  // A plan is this build's lowering and code generation: one stored by another build of the same
  // version (the lowering above changed without a version bump) must miss, so the key names the
  // library's GNU build ID.
  GraphBuilder b("plan_key");
  ValueId x = b.input("x", {4, 4});
  auto g = std::make_shared<const ir::Graph>(std::move(b.done({b.call(OpKind::exp, {x})})));
  BackendInput in;
  in.graph = g;
  in.compile_id = "0/0";
  const PlanKey k = plan_key(in);
  ASSERT_TRUE(k.cacheable);
  const size_t at = k.text.find(" build ");
  ASSERT_NE(at, std::string::npos) << k.text;
  const std::string id = k.text.substr(at + 7, k.text.find('\n', at) - at - 7);
  EXPECT_GE(id.size(), 16u) << "no GNU build ID found: " << id;
  EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
}

}  // namespace
}  // namespace protean::backend::cpu
