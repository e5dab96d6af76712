// The `protean` command line tool.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "protean/protean.h"

namespace pt = protean;

namespace {
int run_example() {
  // A small tensor program: a two-layer MLP on a fixed seed, printed.
  pt::manual_seed(0);
  pt::Tensor x = pt::randn({2, 4});
  pt::Tensor w1 = pt::randn({4, 8});
  pt::Tensor w2 = pt::randn({8, 3});
  pt::Tensor y = pt::softmax(pt::matmul(pt::gelu(pt::matmul(x, w1)), w2), -1);
  std::cout << "softmax(gelu(x @ w1) @ w2) =\n" << y << "\n";
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"protean: a JIT compiler for tensor programs with dynamic shapes"};
  app.require_subcommand(1);
  auto* demo = app.add_subcommand("demo", "run the bundled demo");
  auto* ver = app.add_subcommand("version", "print the version");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ver) {
      std::cout << "protean " << pt::version() << "\n";
      return 0;
    }
    if (*demo) return run_example();
  } catch (const pt::Error& e) {
    std::cerr << "protean: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
