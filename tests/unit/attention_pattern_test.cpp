// The attention pattern pass with masks (backend/attention_pattern.h) and the causal-mask proof
// (backend/causal_mask.h): transformers' causal mask, as the tiny GPT-2 export builds it (aranges,
// comparisons, its packed-sequence cumsum gathered at i and j), becomes is_causal with no mask left in
// the graph; masks that differ from causal anywhere (the diagonal, the direction, the masked value,
// a term read from an input) stay loaded masks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "backend/attention_pattern.h"
#include "backend/causal_mask.h"
#include "backend/registry.h"
#include "ir/printer.h"
#include "ir_test_util.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/protean.h"

namespace protean::backend {
namespace {

using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;

AttentionPatternOptions exported_forms() {
  AttentionPatternOptions o;
  o.half_dtypes = true;
  o.masks = true;
  return o;
}

const ir::Node* only_attention(const ir::Graph& g) {
  const ir::Node* found = nullptr;
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && n.op == OpKind::scaled_dot_product_attention) {
      if (found) return nullptr;
      found = &n;
    }
  return found;
}

enum class MaskForm { Causal, Strict, AntiCausal, SmallNegative, WithInputTerm, CausalF16 };

// softmax(q kᵀ * c + M), where(isnan), · v with M built from aranges as transformers does:
// where(and(True, kv <= q), 0, finfo.min) over [1, 1, s, s], in the variant `form`.
ir::Graph masked_attention(MaskForm form) {
  const DType t = form == MaskForm::CausalF16 ? DType::F16 : DType::BF16;
  GraphBuilder b("masked_attention");
  SymInt s = b.symbol("x.size()[2]", 24);
  ValueId q = b.input("q", {1, 2, s, 32}, t);
  ValueId k = b.input("k", {1, 2, s, 32}, t);
  ValueId v = b.input("v", {1, 2, s, 32}, t);
  ValueId keep = b.input("keep", {1, s}, DType::Bool);
  ValueId ar = b.call(OpKind::arange, {}, {{"start", SymInt(0)}, {"end", s}, {"step", SymInt(1)}, {"dtype", DType::I64}});
  ValueId r = b.call(OpKind::unsqueeze, {b.call(OpKind::unsqueeze, {ar}, {{"dim", SymInt(0)}})}, {{"dim", SymInt(0)}});
  ValueId rows = b.call(OpKind::unsqueeze, {r}, {{"dim", SymInt(3)}});  // [1, 1, s, 1]
  ValueId cols = b.call(OpKind::unsqueeze, {r}, {{"dim", SymInt(2)}});  // [1, 1, 1, s]
  const OpKind rel = form == MaskForm::Strict ? OpKind::lt : OpKind::le;
  ValueId allowed = form == MaskForm::AntiCausal ? b.call(OpKind::le, {rows, cols}) : b.call(rel, {cols, rows});
  allowed = b.call(OpKind::logical_and, {b.constant(full({}, 1.0, DType::Bool)), allowed});
  if (form == MaskForm::WithInputTerm) {  // a padding term read from an input: not provable
    ValueId pad = b.call(OpKind::unsqueeze, {b.call(OpKind::unsqueeze, {keep}, {{"dim", SymInt(1)}})}, {{"dim", SymInt(1)}});
    allowed = b.call(OpKind::logical_and, {allowed, pad});
  }
  const double masked = form == MaskForm::SmallNegative ? -1.0 : (t == DType::F16 ? -65504.0 : -3.3895313892515355e38);
  ValueId mask = b.call(OpKind::where, {allowed, b.constant(full({}, 0.0, t)), b.constant(full({}, masked, t))});
  ValueId kt = b.call(OpKind::permute, {k}, {{"dims", SymIntVec{0, 1, 3, 2}}});
  ValueId sc = b.call(OpKind::mul, {b.call(OpKind::matmul, {q, kt}), b.constant(full({}, 0.125, t))});
  ValueId p = b.call(OpKind::softmax, {b.call(OpKind::add, {sc, mask})}, {{"dim", SymInt(3)}});
  ValueId p0 = b.call(OpKind::where, {b.call(OpKind::ne, {p, p}), b.constant(full({}, 0.0, t)), p});
  return b.done({b.call(OpKind::matmul, {p0, v})});
}

TEST(AttentionPattern, ArangeCausalMaskBecomesIsCausal) {
  for (MaskForm form : {MaskForm::Causal, MaskForm::CausalF16}) {
    ir::Graph g = masked_attention(form);
    int64_t causal = 0;
    ASSERT_EQ(fuse_attention_patterns(g, exported_forms(), &causal), 1);
    EXPECT_EQ(causal, 1);
    const ir::Node* a = only_attention(g);
    ASSERT_TRUE(a) << ir::print(g);
    EXPECT_TRUE(a->attrs.b("is_causal"));
    ASSERT_EQ(a->inputs.size(), 4u);
    EXPECT_EQ(a->inputs[3], ir::kNoValue) << "no mask input left";
    for (const ir::Node& n : g.nodes())  // the mask's subgraph is dead
      EXPECT_FALSE(n.kind == ir::NodeKind::Call && (n.op == OpKind::arange || n.op == OpKind::where)) << ir::print(g);
  }
}

TEST(AttentionPattern, MasksThatDifferFromCausalStayLoaded) {
  for (MaskForm form : {MaskForm::Strict, MaskForm::AntiCausal, MaskForm::SmallNegative, MaskForm::WithInputTerm}) {
    ir::Graph g = masked_attention(form);
    int64_t causal = -1;
    ASSERT_EQ(fuse_attention_patterns(g, exported_forms(), &causal), 1) << static_cast<int>(form);
    EXPECT_EQ(causal, 0) << static_cast<int>(form);
    const ir::Node* a = only_attention(g);
    ASSERT_TRUE(a);
    EXPECT_FALSE(a->attrs.b("is_causal")) << static_cast<int>(form);
    ASSERT_EQ(a->inputs.size(), 4u);
    EXPECT_NE(a->inputs[3], ir::kNoValue) << "the mask stays an input of the attention: " << static_cast<int>(form);
  }
}

TEST(AttentionPattern, MaskFromAGraphInputIsNotCausal) {
  GraphBuilder b("input_mask");
  SymInt s = b.symbol("m.size()[2]", 24);
  ValueId m = b.input("m", {1, 1, s, s}, DType::BF16);
  ir::Graph g = b.done({m});
  EXPECT_FALSE(is_proven_causal_mask(g, m));
}

// The tiny GPT-2 (tests/data/onnx/tiny_gpt2.onnx, torch 2.11's dynamo export): its mask is causal AND
// "same packed sequence" (a cumsum over position-id jumps, gathered at i and at j through GatherND),
// proven constant true since the position ids are an arange. Both layers become is_causal and the
// cumsum leaves the graph.
TEST(AttentionPattern, TinyGpt2MaskIsProvenCausal) {
  static std::shared_ptr<const ir::Graph> seen;
  register_backend("record_graph_for_attention", [](const BackendInput& in) {
    seen = in.graph;
    return make_artifact("interp", in);
  });
  onnx::LoadOptions lo;
  lo.float_dtype = DType::BF16;
  auto m = onnx::load(std::string(PROTEAN_SOURCE_DIR) + "/tests/data/onnx/tiny_gpt2.onnx", lo);
  CompileOptions o;
  o.backend = "record_graph_for_attention";
  o.dynamic = Dynamic::On;
  auto f = compile([m](const Tensor& x) { return m->forward({x})[0]; }, o);
  seen.reset();
  f(randint(0, 100, {1, 7}, DType::I64));
  ASSERT_TRUE(seen);
  ir::Graph g = *seen;
  bool had_cumsum = false;
  for (const ir::Node& n : g.nodes()) had_cumsum = had_cumsum || (n.kind == ir::NodeKind::Call && n.op == OpKind::cumsum);
  EXPECT_TRUE(had_cumsum) << "the export's packed-sequence term";
  int64_t causal = 0;
  EXPECT_EQ(fuse_attention_patterns(g, exported_forms(), &causal), 2);
  EXPECT_EQ(causal, 2) << ir::print(g);
  for (const ir::Node& n : g.nodes()) {
    if (n.kind != ir::NodeKind::Call) continue;
    EXPECT_NE(n.op, OpKind::cumsum) << "the mask's subgraph is gone";
    if (n.op == OpKind::scaled_dot_product_attention) {
      EXPECT_TRUE(n.attrs.b("is_causal"));
      EXPECT_EQ(n.inputs[3], ir::kNoValue);
    }
  }
}

}  // namespace
}  // namespace protean::backend
