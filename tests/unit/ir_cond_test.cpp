// A cond node in the Graph IR: printed with its branches indented under it (golden, nested cond),
// parsed back, checked by the verifier (branch signatures), treated as one node by DCE/CSE while the
// pipeline optimizes inside the branches, compared by equal_graphs, and run by the interpreter, which
// executes only the taken branch.
#include <gtest/gtest.h>

#include "backend/interp/interp.h"
#include "ir/parser.h"
#include "ir/passes/cse.h"
#include "ir/passes/dce.h"
#include "ir/pipeline.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "ir/verifier.h"
#include "ir_test_util.h"
#include "protean/ops.h"

namespace protean::ir {
namespace {

using ops::OpKind;
using testing::GraphBuilder;

/// Appends cond(pred, operands...) owning branches `t` and `f`; output types are `t`'s outputs.
ValueId add_cond(Graph& g, ValueId pred, std::vector<ValueId> operands, std::shared_ptr<const Graph> t,
                 std::shared_ptr<const Graph> f, protean::core::SourceLocation loc = {}) {
  std::vector<TensorMeta> metas;
  for (ValueId v : t->outputs()) {
    TensorMeta m;
    m.sizes = t->value(v).sizes;
    m.strides = contiguous_strides_of(m.sizes);
    m.dtype = t->value(v).dtype;
    metas.push_back(std::move(m));
  }
  std::vector<ValueId> in{pred};
  in.insert(in.end(), operands.begin(), operands.end());
  return g.add_call(OpKind::cond, std::move(in), {}, metas, std::move(loc), {std::move(t), std::move(f)}).at(0);
}

/// graph f(p, q, x[s0, 4], y[4]): cond(p) { x + y } else { cond(q) { relu(x) } else { x } } * x
Graph nested_graph() {
  GraphBuilder b("f");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId p = b.input("p", {}, DType::Bool);
  ValueId q = b.input("q", {}, DType::Bool);
  ValueId x = b.input("x", {s0, 4});
  ValueId y = b.input("y", {4});

  GraphBuilder t("true_branch");
  ValueId ta = t.input("arg0", {s0, 4}), tb = t.input("arg1", {4});
  t.input("arg2", {}, DType::Bool);
  t.done({t.call(OpKind::add, {ta, tb}, {}, {"f.cpp", 4, ""})});

  GraphBuilder it("true_branch"), ie("false_branch");
  ValueId ia = it.input("arg0", {s0, 4});
  it.done({it.call(OpKind::relu, {ia}, {}, {"f.cpp", 6, ""})});
  ValueId ea = ie.input("arg0", {s0, 4});
  ie.done({ea});

  GraphBuilder e("false_branch");
  ValueId fa = e.input("arg0", {s0, 4});
  e.input("arg1", {4});
  ValueId fq = e.input("arg2", {}, DType::Bool);
  ValueId inner = add_cond(e.g, fq, {fa}, std::make_shared<Graph>(it.g), std::make_shared<Graph>(ie.g), {"f.cpp", 6, ""});
  e.done({inner});

  ValueId c = add_cond(b.g, p, {x, y, q}, std::make_shared<Graph>(t.g), std::make_shared<Graph>(e.g), {"f.cpp", 3, ""});
  return b.done({b.call(OpKind::mul, {c, x})});
}

const char* const kNestedText =
    "graph f(%p : b8[], %q : b8[], %x : f32[s0, 4], %y : f32[4]):\n"
    "  %0 : f32[s0, 4] = cond(%p, %x, %y, %q)  # f.cpp:3\n"
    "    graph true_branch(%arg0 : f32[s0, 4], %arg1 : f32[4], %arg2 : b8[]):\n"
    "      %0 : f32[s0, 4] = add(%arg0, %arg1)  # f.cpp:4\n"
    "      return (%0)\n"
    "    graph false_branch(%arg0 : f32[s0, 4], %arg1 : f32[4], %arg2 : b8[]):\n"
    "      %0 : f32[s0, 4] = cond(%arg2, %arg0)  # f.cpp:6\n"
    "        graph true_branch(%arg0 : f32[s0, 4]):\n"
    "          %0 : f32[s0, 4] = relu(%arg0)  # f.cpp:6\n"
    "          return (%0)\n"
    "        graph false_branch(%arg0 : f32[s0, 4]):\n"
    "          return (%arg0)\n"
    "      return (%0)\n"
    "  %1 : f32[s0, 4] = mul(%0, %x)\n"
    "  return (%1)\n";

TEST(IrCond, PrinterNestsBranchesUnderTheNode) {
  Graph g = nested_graph();
  testing::expect_text(print(g), kNestedText);
  testing::expect_golden(print(g), "cond.txt");
  verify(g);
  // print_node is the node's own line (error messages); the branches are not part of it.
  EXPECT_EQ(print_node(g, g.nodes()[4]), "%0 : f32[s0, 4] = cond(%p, %x, %y, %q)  # f.cpp:3");
}

TEST(IrCond, ParserRoundTrip) {
  Graph g = parse(kNestedText);
  testing::expect_text(print(g), kNestedText);
  verify(g);
  const Node& c = g.nodes()[4];
  ASSERT_EQ(c.op, OpKind::cond);
  ASSERT_EQ(c.subgraphs.size(), 2u);
  EXPECT_EQ(c.subgraphs[1]->nodes()[3].subgraphs.size(), 2u);  // the nested cond
  EXPECT_TRUE(equal_graphs(g, nested_graph()));
  // Indentation is not significant; a following node after the branches belongs to the outer graph.
  Graph flat = parse(
      "graph g(%p : b8[], %x : f32[3]):\n"
      "%0 : f32[3] = cond(%p, %x)\n"
      "graph true_branch(%arg0 : f32[3]):\n"
      "return (%arg0)\n"
      "graph false_branch(%arg0 : f32[3]):\n"
      "%0 : f32[3] = neg(%arg0)\n"
      "return (%0)\n"
      "%1 : f32[3] = relu(%0)\n"
      "return (%1)\n");
  verify(flat);
  EXPECT_EQ(flat.num_calls(), 2u);
}

TEST(IrCond, ParserErrorsInsideABranchNameTheLine) {
  try {
    parse(
        "graph g(%p : b8[], %x : f32[3]):\n"
        "  %0 : f32[3] = cond(%p, %x)\n"
        "    graph true_branch(%arg0 : f32[3]):\n"
        "      %0 : f32[3] = nope(%arg0)\n"
        "      return (%0)\n");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("ir parse error at 4:21"), std::string::npos) << e.what();
  }
}

/// A graph the verifier must reject: the case's name, the IR text, and a part of the error message.
struct RejectedCond {
  const char* name;
  const char* text;
  const char* error;
};

const RejectedCond kRejectedConds[] = {
    // Outputs that disagree between the branches: the index and both types.
    {"BranchOutputsDisagree",
     "graph g(%p : b8[], %x : f32[s0, 4]):\n"
     "  %0 : f32[s0, 4] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[s0, 4]):\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[s0, 4]):\n"
     "      %0 : f32[4] = sum(%arg0, dims=[0], keepdim=false)\n"
     "      return (%0)\n"
     "  return (%0)\n",
     "output 0 is f32[s0, 4] in the true branch and f32[4] in the false branch"},
    // A branch whose inputs are not the operands.
    {"BranchInputIsNotTheOperand",
     "graph g(%p : b8[], %x : f32[3]):\n"
     "  %0 : f32[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[4]):\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "operand 0 (%x) is f32[3] but the true branch input %arg0 is f32[4]"},
    {"BranchTakesMoreInputsThanOperands",
     "graph g(%p : b8[], %x : f32[3]):\n"
     "  %0 : f32[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[3], %arg1 : f32[3]):\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "the true branch takes 2 inputs but cond passes 1 operands"},
    // The node's type must be the branches'.
    {"NodeTypeIsNotTheBranches",
     "graph g(%p : b8[], %x : f32[3]):\n"
     "  %0 : f64[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "output 0 is recorded as f64[3] but the branches return f32[3]"},
    {"PredicateIsNotABool",
     "graph g(%p : f32[], %x : f32[3]):\n"
     "  %0 : f32[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "the predicate %p is f32[]; cond needs a 0-dim bool"},
    {"OneSubgraph",
     "graph g(%p : b8[], %x : f32[3]):\n"
     "  %0 : f32[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "cond needs two subgraphs (true branch, false branch), got 1"},
    {"SubgraphOnANonControlFlowOp",
     "graph g(%x : f32[3]):\n"
     "  %0 : f32[3] = relu(%x)\n"
     "    graph true_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "relu owns 1 subgraph(s); only a control-flow op (cond) has subgraphs"},
    // A broken branch is reported through the cond node.
    {"BrokenBranch",
     "graph g(%p : b8[], %x : f32[3]):\n"
     "  %0 : f32[3] = cond(%p, %x)\n"
     "    graph true_branch(%arg0 : f32[3]):\n"
     "      %0 : f32[4] = relu(%arg0)\n"
     "      return (%arg0)\n"
     "    graph false_branch(%arg0 : f32[3]):\n"
     "      return (%arg0)\n"
     "  return (%0)\n",
     "in the true branch: IR verification failed for graph 'true_branch' at node 1"},
};

TEST(IrCond, VerifierChecksTheBranchSignatures) {
  for (const RejectedCond& c : kRejectedConds) {
    SCOPED_TRACE(c.name);
    Graph g = parse(c.text);
    try {
      verify(g);
      ADD_FAILURE() << "verify accepted:\n" << c.text;
    } catch (const CompileError& e) {
      EXPECT_NE(std::string(e.what()).find(c.error), std::string::npos) << e.what();
    }
  }
}

const char* const kTwoConds =
    "graph g(%p : b8[], %x : f32[3]):\n"
    "  %0 : f32[3] = cond(%p, %x)\n"
    "    graph true_branch(%arg0 : f32[3]):\n"
    "      %0 : f32[3] = relu(%arg0)\n"
    "      %1 : f32[3] = relu(%arg0)\n"
    "      %2 : f32[3] = add(%0, %1)\n"
    "      return (%2)\n"
    "    graph false_branch(%arg0 : f32[3]):\n"
    "      return (%arg0)\n"
    "  %1 : f32[3] = cond(%p, %x)\n"
    "    graph true_branch(%arg0 : f32[3]):\n"
    "      %0 : f32[3] = relu(%arg0)\n"
    "      %1 : f32[3] = relu(%arg0)\n"
    "      %2 : f32[3] = add(%0, %1)\n"
    "      return (%2)\n"
    "    graph false_branch(%arg0 : f32[3]):\n"
    "      return (%arg0)\n"
    "  %2 : f32[3] = cond(%p, %x)\n"
    "    graph true_branch(%arg0 : f32[3]):\n"
    "      %0 : f32[3] = relu(%arg0)\n"
    "      return (%0)\n"
    "    graph false_branch(%arg0 : f32[3]):\n"
    "      %0 : f32[3] = neg(%arg0)\n"
    "      return (%0)\n"
    "  %3 : f32[3] = cond(%p, %x)\n"
    "    graph true_branch(%arg0 : f32[3]):\n"
    "      return (%arg0)\n"
    "    graph false_branch(%arg0 : f32[3]):\n"
    "      return (%arg0)\n"
    "  %4 : f32[3] = add(%0, %1)\n"
    "  %5 : f32[3] = add(%4, %2)\n"
    "  return (%5)\n";

TEST(IrCond, CseMergesOnlyEqualBranchesAndDceDropsAnUnusedCond) {
  Graph g = parse(kTwoConds);
  EXPECT_EQ(common_subexpression_elimination(g), 1u);  // %1 is %0; %2 has other branches
  EXPECT_EQ(dead_code_elimination(g), 1u);            // %3 is unused
  verify(g);
  size_t conds = 0;
  for (const Node& n : g.nodes()) conds += n.op == OpKind::cond && n.kind == NodeKind::Call;
  EXPECT_EQ(conds, 2u);
}

TEST(IrCond, PipelineOptimizesInsideTheBranches) {
  Graph g = parse(kTwoConds);
  PassOptions o;
  o.verify = true;
  std::vector<std::string> steps;
  o.on_step = [&](std::string_view step, const Graph&) { steps.emplace_back(step); };
  run_passes(g, o);
  EXPECT_EQ(steps.back(), "subgraphs");
  testing::expect_text(print(g),
                       "graph g(%p : b8[], %x : f32[3]):\n"
                       "  %0 : f32[3] = cond(%p, %x)\n"
                       "    graph true_branch(%arg0 : f32[3]):\n"
                       "      %0 : f32[3] = relu(%arg0)\n"
                       "      %1 : f32[3] = add(%0, %0)\n"
                       "      return (%1)\n"
                       "    graph false_branch(%arg0 : f32[3]):\n"
                       "      return (%arg0)\n"
                       "  %1 : f32[3] = cond(%p, %x)\n"
                       "    graph true_branch(%arg0 : f32[3]):\n"
                       "      %0 : f32[3] = relu(%arg0)\n"
                       "      return (%0)\n"
                       "    graph false_branch(%arg0 : f32[3]):\n"
                       "      %0 : f32[3] = neg(%arg0)\n"
                       "      return (%0)\n"
                       "  %2 : f32[3] = add(%0, %0)\n"
                       "  %3 : f32[3] = add(%2, %1)\n"
                       "  return (%3)\n");
  // Without a cond, the step list is unchanged.
  Graph plain = parse("graph h(%x : f32[3]):\n  %0 : f32[3] = relu(%x)\n  return (%0)\n");
  steps.clear();
  run_passes(plain, o);
  EXPECT_NE(steps.back(), "subgraphs");
}

TEST(IrCond, EqualGraphsComparesBranchConstantsByValue) {
  auto with_constant = [](float v) {
    GraphBuilder b("g");
    ValueId p = b.input("p", {}, DType::Bool);
    ValueId x = b.input("x", {2});
    GraphBuilder t("true_branch");
    ValueId a = t.input("arg0", {2});
    ValueId c = t.constant(full({2}, v));
    t.done({t.call(OpKind::add, {a, c})});
    GraphBuilder f("false_branch");
    f.done({f.input("arg0", {2})});
    ValueId r = add_cond(b.g, p, {x}, std::make_shared<Graph>(t.g), std::make_shared<Graph>(f.g));
    return Graph(b.done({r}));
  };
  Graph a = with_constant(1.0f), b = with_constant(1.0f), c = with_constant(2.0f);
  EXPECT_EQ(print(a), print(c));  // constant data is not in the text
  EXPECT_TRUE(equal_graphs(a, b));
  EXPECT_FALSE(equal_graphs(a, c));
}

TEST(IrCond, InterpreterRunsOnlyTheTakenBranch) {
  // false branch: index_select with an index that is out of range when it runs.
  GraphBuilder b("g");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId p = b.input("p", {}, DType::Bool);
  ValueId x = b.input("x", {s0, 3});
  ValueId idx = b.input("idx", {s0}, DType::I64);
  GraphBuilder t("true_branch");
  ValueId ta = t.input("arg0", {s0, 3});
  t.input("arg1", {s0}, DType::I64);
  t.done({t.call(OpKind::relu, {ta})});
  GraphBuilder f("false_branch");
  ValueId fa = f.input("arg0", {s0, 3});
  ValueId fi = f.input("arg1", {s0}, DType::I64);
  f.done({f.call(OpKind::index_select, {fa, fi}, {{"dim", SymInt(0)}})});
  ValueId c = add_cond(b.g, p, {x, idx}, std::make_shared<Graph>(t.g), std::make_shared<Graph>(f.g));
  b.done({c});
  verify(b.g);
  backend::Interpreter interp(b.g);
  Tensor xs = randn({4, 3});
  Tensor bad = tensor<int64_t>({0, 1, 2, 40}, {4});
  std::vector<Tensor> in{scalar_tensor(1, DType::Bool), xs, bad};
  EXPECT_TRUE(allclose(interp.run(in).at(0), relu(xs)));
  in[0] = scalar_tensor(0, DType::Bool);
  EXPECT_THROW(interp.run(in), ValueError);
  in[2] = tensor<int64_t>({3, 3, 0, 1}, {4});
  EXPECT_TRUE(allclose(interp.run(in).at(0), index_select(xs, 0, in[2])));
}

}  // namespace
}  // namespace protean::ir
