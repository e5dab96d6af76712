// Helpers for the Ir* tests: a graph builder that records ops through their real meta functions (under
// a ShapeEnv, so sizes may be symbolic), and golden-text comparison that prints a line diff.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "golden.h"
#include "ir/graph.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/registry.h"
#include "sym/shape_env.h"

namespace protean::ir::testing {

/// Builds graphs the way capture does: output types come from the op's meta function.
struct GraphBuilder {
  Graph g;
  sym::ShapeEnv env;

  explicit GraphBuilder(std::string name = "f") { g.name = std::move(name); }

  /// A symbol for `source` with traced value `hint` (s0, s1, ... in creation order).
  SymInt symbol(const std::string& source, int64_t hint) {
    return env.create_symbol(source, hint, sym::DimKind::Dynamic);
  }
  ValueId input(const std::string& source, SymIntVec sizes, DType dtype = DType::F32) {
    return g.add_placeholder(source, dtype, std::move(sizes));
  }
  ValueId constant(const Tensor& t, const std::string& hint = "") { return g.add_constant(t, hint); }
  std::vector<ValueId> calls(ops::OpKind op, std::vector<ValueId> in, ops::Attrs attrs = {}, protean::core::SourceLocation loc = {}) {
    std::vector<Tensor> fakes;
    for (ValueId v : in) fakes.push_back(v == kNoValue ? Tensor() : fake_tensor(g.value(v)));
    std::vector<TensorMeta> metas;
    {
      sym::ShapeEnvScope scope(env);
      metas = ops::run_meta(op, fakes, attrs);
    }
    return g.add_call(op, std::move(in), std::move(attrs), metas, std::move(loc));
  }
  ValueId call(ops::OpKind op, std::vector<ValueId> in, ops::Attrs attrs = {}, protean::core::SourceLocation loc = {}) {
    return calls(op, std::move(in), std::move(attrs), std::move(loc)).at(0);
  }
  Graph& done(std::vector<ValueId> outs) {
    g.set_outputs(std::move(outs));
    return g;
  }
};

using protean::testing::split_lines;

using protean::testing::line_diff;
using protean::testing::read_file;

/// EXPECT that `actual` equals `expected` text, printing a diff when not.
inline void expect_text(const std::string& actual, const std::string& expected) {
  if (actual != expected) ADD_FAILURE() << "IR text differs:\n" << line_diff(expected, actual);
}

inline std::string golden_path(const std::string& name) { return protean::testing::golden_path("ir/" + name); }

/// Compares with tests/golden/ir/<name> (the shared helper, golden.h); PROTEAN_UPDATE_GOLDEN=1 rewrites the file.
inline void expect_golden(const std::string& actual, const std::string& name) {
  protean::testing::expect_golden(actual, "ir/" + name);
}

}  // namespace protean::ir::testing
