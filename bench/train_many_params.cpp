// The time to make and first call compile_train_step over a module of N one- and two-element
// parameters (AdamW), per backend: the cost that grows with the parameter count (arena layout,
// capture of N parameter views, the passes over a graph of O(N) nodes). Prints one JSON object.
//   protean_train_many_params N [BACKEND]      (BACKEND: interp (default) or cpu)
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "protean/optim.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;

namespace {
struct Bag : pt::Module {
  std::vector<Tensor*> params;
};
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: protean_train_many_params N [interp|cpu]\n");
    return 2;
  }
  const int n = std::atoi(argv[1]);
  const std::string backend = argc > 2 ? argv[2] : "interp";
  if (n < 1) {
    std::fprintf(stderr, "protean_train_many_params: N must be at least 1 (got '%s')\n", argv[1]);
    return 2;
  }
  pt::manual_seed(9);
  auto bag = std::make_shared<Bag>();
  for (int i = 0; i < n; ++i) bag->params.push_back(&bag->register_parameter(fmt::format("p{}", i), pt::randn({1 + i % 2})));
  pt::optim::AdamW opt(bag->parameters(), pt::optim::AdamWOptions(0.01));
  auto loss = [bag](Tensor x) {
    std::vector<Tensor> all;
    for (Tensor* p : bag->params) all.push_back(*p);
    Tensor v = pt::cat(all, 0);
    return pt::sum(v * v * x);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto step = pt::compile_train_step(bag, loss, opt, {.name = "many_params_step", .backend = backend});
  const double make_s = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  step(pt::full({1}, 1.0));
  const double first_s = seconds_since(t1);
  const auto t2 = std::chrono::steady_clock::now();
  step(pt::full({1}, 2.0));
  const double second_s = seconds_since(t2);
  std::printf("{\"parameters\": %d, \"backend\": \"%s\", \"make_s\": %.4f, \"first_call_s\": %.4f, \"second_call_s\": %.5f}\n",
              n, backend.c_str(), make_s, first_s, second_s);
  return 0;
}
