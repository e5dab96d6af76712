// Helpers for the Ir* tests: a graph builder that records ops through their real meta functions (under
// a ShapeEnv, so sizes may be symbolic), and golden-text comparison that prints a line diff.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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
  std::vector<ValueId> calls(ops::OpKind op, std::vector<ValueId> in, ops::Attrs attrs = {}, SourceLoc loc = {}) {
    std::vector<Tensor> fakes;
    for (ValueId v : in) fakes.push_back(v == kNoValue ? Tensor() : fake_tensor(g.value(v)));
    std::vector<TensorMeta> metas;
    {
      sym::ShapeEnvScope scope(env);
      metas = ops::run_meta(op, fakes, attrs);
    }
    return g.add_call(op, std::move(in), std::move(attrs), metas, std::move(loc));
  }
  ValueId call(ops::OpKind op, std::vector<ValueId> in, ops::Attrs attrs = {}, SourceLoc loc = {}) {
    return calls(op, std::move(in), std::move(attrs), std::move(loc)).at(0);
  }
  Graph& done(std::vector<ValueId> outs) {
    g.set_outputs(std::move(outs));
    return g;
  }
};

inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) r.push_back(line);
  return r;
}

/// A line diff of `expected` → `actual` (LCS based): ' ' common, '-' only expected, '+' only actual.
inline std::string line_diff(const std::string& expected, const std::string& actual) {
  auto a = split_lines(expected), b = split_lines(actual);
  size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> l(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;) l[i][j] = a[i] == b[j] ? l[i + 1][j + 1] + 1 : std::max(l[i + 1][j], l[i][j + 1]);
  std::string out = "--- expected\n+++ actual\n";
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out += "  " + a[i++] + "\n";
      ++j;
    } else if (j < m && (i == n || l[i][j + 1] >= l[i + 1][j])) {
      out += "+ " + b[j++] + "\n";
    } else {
      out += "- " + a[i++] + "\n";
    }
  }
  return out;
}

/// EXPECT that `actual` equals `expected` text, printing a diff when not.
inline void expect_text(const std::string& actual, const std::string& expected) {
  if (actual != expected) ADD_FAILURE() << "IR text differs:\n" << line_diff(expected, actual);
}

inline std::string golden_path(const std::string& name) {
  return std::string(PROTEAN_SOURCE_DIR) + "/tests/golden/ir/" + name;
}
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Compares with tests/golden/ir/<name>; PROTEAN_UPDATE_GOLDEN=1 rewrites the file instead.
inline void expect_golden(const std::string& actual, const std::string& name) {
  std::string path = golden_path(name);
  if (const char* u = std::getenv("PROTEAN_UPDATE_GOLDEN"); u && std::string(u) == "1") {
    std::ofstream(path, std::ios::binary) << actual;
    return;
  }
  std::ifstream probe(path);
  if (!probe) {
    ADD_FAILURE() << "missing golden file " << path << " (run with PROTEAN_UPDATE_GOLDEN=1 to create it); actual:\n"
                  << actual;
    return;
  }
  std::string expected = read_file(path);
  if (actual != expected) ADD_FAILURE() << "golden " << name << " differs:\n" << line_diff(expected, actual);
}

}  // namespace protean::ir::testing
