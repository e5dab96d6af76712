// A chain of N pointwise ops compiled once (issue: deep graphs must compile in time and memory linear
// in N, with no recursion whose depth grows with the graph). Run it under /usr/bin/time -v for the peak
// memory (the C++ compiler's children included):
//
//   build/protean_deep_graph N [backend]     (backend: cpu (default) | interp)
//
// The chain cycles through mul, add, sin and tanh on an f32[64, 256] input, so each op depends on the
// previous one and nothing folds away. Prints one JSON line: N, backend, the first call's wall seconds
// (capture + compile + run), the second call's (a guard hit) and the largest difference from the
// same chain run eagerly. Exits 1 when that difference exceeds 1e-4.
#include <protean/protean.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace pt = protean;

namespace {
pt::Tensor chain(const pt::Tensor& x, int n) {
  pt::Tensor y = x;
  for (int i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0: y = y * 0.999; break;
      case 1: y = y + 0.001; break;
      case 2: y = pt::sin(y); break;
      case 3: y = pt::tanh(y); break;
    }
  }
  return y;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s N [cpu|interp]\n", argv[0]);
    return 2;
  }
  const int n = std::atoi(argv[1]);
  const std::string backend = argc == 3 ? argv[2] : "cpu";
  if (n < 1) {
    std::fprintf(stderr, "N must be a positive number of ops, got '%s'\n", argv[1]);
    return 2;
  }
  try {
    auto f = pt::compile([n](const pt::Tensor& x) { return chain(x, n); },
                         {.name = "deep_chain", .arg_names = {"x"}, .backend = backend});
    pt::Tensor x = pt::randn({64, 256});
    auto t0 = std::chrono::steady_clock::now();
    pt::Tensor y = f(x);
    const double first = seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    y = f(x);
    const double second = seconds_since(t0);
    const double diff = pt::amax(pt::abs(y - chain(x, n))).item<float>();
    std::printf("{\"n\": %d, \"backend\": \"%s\", \"first_call_s\": %.3f, \"second_call_s\": %.6f, \"max_abs_diff\": %.3g}\n",
                n, backend.c_str(), first, second, diff);
    return diff <= 1e-4 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deep_graph: %s\n", e.what());
    return 1;
  }
}
