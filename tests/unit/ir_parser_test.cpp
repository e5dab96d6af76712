// Parser: round trips (print(parse(print(g))) == print(g)) and syntax errors with line:column.
#include <gtest/gtest.h>

#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ir_test_util.h"
#include "sym/expr.h"

namespace protean::ir {
namespace {

void expect_round_trip(const std::string& text) {
  Graph g = parse(text);
  testing::expect_text(print(g), text);
  Graph g2 = parse(print(g));
  testing::expect_text(print(g2), text);
}

TEST(IrParser, RoundTripGoldens) {
  for (const char* name : {"mlp.txt", "kinds.txt", "dce_before.txt", "cse_before.txt"}) {
    SCOPED_TRACE(name);
    std::string text = testing::read_file(testing::golden_path(name));
    ASSERT_FALSE(text.empty()) << name;
    expect_round_trip(text);
  }
}

TEST(IrParser, RoundTripHandWritten) {
  expect_round_trip(
      "graph g(%x : f32[s0, s1], %\"args[0]\" : i64[], %self.w : bf16[s1]):\n"
      "  %c0 : f32[2, 3] = constant()\n"
      "  %bias : f64[] = constant()  # weights.cpp:1\n"
      "  %0 : f32[s0, s1] = relu(%x)  # dir/file name.cpp:12\n"
      "  %1 : f32[2*s0, (s1//2)] = reshape(%0, shape=[2*s0, (s1//2)])\n"
      "  %2 : f32[s0 + 1] = full(shape=[s0 + 1], value=-inf, dtype=f32)\n"
      "  %3 : f32[Max(1, s0)] = full(shape=[Max(1, s0)], value=1e-05, dtype=f32)\n"
      "  %4 : f32[1], %5 : f32[Mod(s0, 3)] = split(%2, dim=0, sizes=[1, Mod(s0, 3)])\n"
      "  %6 : f32[s0, s1] = layer_norm(%0, None, None, normalized_shape=[s1], eps=0.5, s=\"a, b)\", b=false)\n"
      "  return (%6, %\"args[0]\", %5)\n");
}

TEST(IrParser, SymbolsAreTheSymEngineSymbolsWithHints) {
  ParseOptions o;
  o.hints["s0"] = 16;
  Graph g = parse("graph f(%x : f32[s0, s1]):\n  %0 : f32[2*s0] = reshape(%x, shape=[2*s0])\n  return (%0)\n", o);
  const Value& x = g.value(g.inputs()[0]);
  ASSERT_TRUE(x.sizes[0].is_symbolic());
  EXPECT_EQ(x.sizes[0].expr(), sym::symbol("s0"));
  EXPECT_EQ(x.sizes[0].hint(), 16);
  EXPECT_EQ(x.sizes[1].hint(), 2);  // default hint
  const auto& shape = g.nodes()[1].attrs.sym_ints("shape");
  EXPECT_EQ(shape[0].expr(), sym::mul(sym::integer(2), sym::symbol("s0")));
  EXPECT_EQ(shape[0].hint(), 32);
  EXPECT_EQ(g.nodes()[0].source, "x");
}

TEST(IrParser, AttributeKinds) {
  Graph g = parse(
      "graph f(%x : f32[4]):\n"
      "  %0 : f32[4] = clamp(%x, min=0.0, max=6, dt=i64, flag=true, name=\"n\", list=[], neg=-3, e=1e+20)\n"
      "  return (%0)\n");
  const ops::Attrs& a = g.nodes()[1].attrs;
  EXPECT_TRUE(std::holds_alternative<double>(*a.find("min")));
  EXPECT_TRUE(std::holds_alternative<SymInt>(*a.find("max")));
  EXPECT_EQ(a.dtype("dt"), DType::I64);
  EXPECT_TRUE(a.b("flag"));
  EXPECT_EQ(a.s("name"), "n");
  EXPECT_TRUE(a.sym_ints("list").empty());
  EXPECT_EQ(a.i("neg"), -3);
  EXPECT_EQ(a.f("e"), 1e20);
}

TEST(IrParser, CommentsAndBlankLines) {
  Graph g = parse(
      "# a comment before the graph\n\n"
      "graph f(%x : f32[2]):  # trailing comment\n"
      "\n"
      "  # a comment line\n"
      "  %0 : f32[2] = relu(%x)   #   a.cpp:7  \n"
      "  return (%0)\n\n");
  EXPECT_EQ(g.nodes()[1].loc.file, "a.cpp");
  EXPECT_EQ(g.nodes()[1].loc.line, 7);
  EXPECT_EQ(print(g), "graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x)  # a.cpp:7\n  return (%0)\n");
}

TEST(IrParser, NonDenseNamesContinueNumbering) {
  Graph g = parse("graph f(%x : f32[2]):\n  %7 : f32[2] = relu(%x)\n  return (%7)\n");
  // A call added after parsing must not reuse %7.
  std::vector<TensorMeta> m = {TensorMeta::contiguous({2}, DType::F32)};
  ValueId v = g.add_call(ops::OpKind::neg, {g.outputs()[0]}, {}, m).at(0);
  EXPECT_EQ(g.value(v).name, "8");
}

struct BadText {
  const char* text;
  const char* where;     // "line:col"
  const char* expected;  // substring of the message
};

TEST(IrParser, SyntaxErrorsNameLineColumnAndExpectation) {
  const BadText cases[] = {
      {"grph f():\n  return ()\n", "1:1", "expected 'graph'"},
      {"graph f(%x f32[2]):\n  return ()\n", "1:12", "expected ':'"},
      {"graph f(%x : f33[2]):\n  return ()\n", "1:14", "expected a dtype"},
      {"graph f(%x : f32[2):\n  return ()\n", "1:19", "expected ']'"},
      {"graph f(%x : f32[2 +]):\n  return ()\n", "1:18", "size expression"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%y)\n  return (%0)\n", "2:22", "%y is not defined"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = frobnicate(%x)\n  return (%0)\n", "2:17", "'frobnicate' is not an op"},
      {"graph f(%x : f32[2]):\n  %x : f32[2] = relu(%x)\n  return (%x)\n", "2:3", "%x is already defined"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x\n  return (%0)\n", "2:24", "expected ')'"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = clamp(%x, min=1.0, %x)\n  return (%0)\n", "2:36",
       "positional inputs come first"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = clamp(%x, min=\"a)\n  return (%0)\n", "2:34", "closing '\"'"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x) extra\n  return (%0)\n", "2:26", "end of line"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x)\n", "3:1", "'return (...)'"},
      {"graph f(%x : f32[2]):\n  return (%x)\n  %0 : f32[2] = relu(%x)\n", "3:3", "end of text after 'return'"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x)\n  return (None)\n", "3:11", "None cannot be returned"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2], %1 : f32[2] = constant()\n  return (%0)\n", "2:30",
       "one value defined by constant()"},
      {"graph f(%x : f32[2]):\n  %0 : f32[2] = relu(%x, %x)\n  return (%0)\n", "", ""},  // arity: verifier's job
  };
  for (const BadText& c : cases) {
    SCOPED_TRACE(c.text);
    if (!*c.where) {
      EXPECT_NO_THROW(parse(c.text));
      continue;
    }
    try {
      parse(c.text);
      ADD_FAILURE() << "no FormatError";
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("at ") + c.where + ":"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
      EXPECT_NE(msg.find('^'), std::string::npos) << msg;
    }
  }
}

TEST(IrParser, ParsedGraphsVerify) {
  Graph g = parse(testing::read_file(testing::golden_path("mlp.txt")));
  EXPECT_NO_THROW(verify(g));
}

}  // namespace
}  // namespace protean::ir
