// Graph breaks (docs/breaks.md): a function that reads a value on the host runs in segments, each
// compiled and cached as its own frame; the same logic written with cond stays one graph; verify mode
// catches a captured variable that changed behind the guards' back.
// Run with PROTEAN_LOGS=graph_breaks,recompiles to see each break once and each segment's recompile.
#include <cstdio>

#include <protean/protean.h>

namespace pt = protean;

// Reads the sum on the host: one graph break, two segments.
pt::Tensor normalize(const pt::Tensor& x, const pt::Tensor& w) {
  pt::Tensor y = pt::tanh(pt::matmul(x, w));
  float total = y.abs().sum().item<float>();
  return y / (total + 1.0f);
}

// The same data-dependent choice without a break: both branches in one graph.
pt::Tensor pick(const pt::Tensor& x) {
  return pt::cond(
      x.sum() > 0.0, [](const pt::TensorList& o) { return o[0] * 2.0; },
      [](const pt::TensorList& o) { return pt::neg(o[0]); }, {x});
}

int main() {
  pt::manual_seed(0);
  pt::Tensor w = pt::randn({16, 8});
  auto f = pt::compile(normalize, {.name = "normalize", .arg_names = {"x", "w"}});
  for (int64_t n : {4, 7, 12, 30}) {
    pt::Tensor x = pt::randn({n, 16});
    bool same = pt::allclose(f(x, w), normalize(x, w), 1e-4, 1e-5);
    std::printf("normalize rows=%2lld matches eager: %s\n", static_cast<long long>(n), same ? "yes" : "NO");
  }
  std::printf("normalize: frame %d, segment frames:", f.frame_id());
  for (int id : f.segment_frame_ids()) std::printf(" %d", id);
  std::printf("\n");

  auto g = pt::compile(pick, {.name = "pick", .arg_names = {"x"}});
  for (int i = 0; i < 4; ++i) {
    pt::Tensor x = pt::randn({5});
    std::printf("pick sum=%+.3f matches eager: %s\n", x.sum().item<float>(), pt::allclose(g(x), pick(x)) ? "yes" : "NO");
  }

  int scale = 2;  // captured by reference: not an argument, so no guard sees it
  auto h = pt::compile([&scale](const pt::Tensor& x) { return pt::relu(x) * static_cast<double>(scale); },
                       {.name = "scaled", .arg_names = {"x"}, .verify_every = 1});
  pt::Tensor x = pt::randn({4});
  h(x);
  scale = 3;  // verify mode re-traces, warns with the differing node and line, and runs this call eagerly
  std::printf("scaled after the change matches eager: %s\n", pt::allclose(h(x), pt::relu(x) * 3.0) ? "yes" : "NO");

  pt::Stats s = pt::stats();
  std::printf("frames=%lld compiles=%lld recompiles=%lld graph_breaks=%lld verify_failures=%lld\n",
              static_cast<long long>(s.frames), static_cast<long long>(s.compiles), static_cast<long long>(s.recompiles),
              static_cast<long long>(s.graph_breaks), static_cast<long long>(s.verify_failures));
  return 0;
}
