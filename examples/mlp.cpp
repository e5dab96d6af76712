// The README example: compile an MLP; the first call compiles a static graph (0/0), a new batch
// size recompiles once with the batch dimension dynamic (0/1), further sizes hit the cache.
// Run with PROTEAN_LOGS=recompiles,+dynamic,guards to see why each compile happened.
#include <cstdio>

#include <protean/protean.h>

namespace pt = protean;

pt::Tensor mlp(const pt::Tensor& x, const pt::Tensor& w1, const pt::Tensor& w2) {
  return pt::gelu(pt::matmul(x, w1)).matmul(w2);
}

int main() {
  pt::manual_seed(0);
  pt::Tensor w1 = pt::randn({512, 64}), w2 = pt::randn({64, 10});
  auto f = pt::compile(mlp, {.name = "mlp", .arg_names = {"x", "w1", "w2"}});
  pt::Tensor y = f(pt::randn({8, 512}), w1, w2);   // compile 0/0, static
  y = f(pt::randn({16, 512}), w1, w2);             // guard fails on x dim 0 → 0/1, dim 0 dynamic
  for (int64_t n : {3, 32, 100}) {
    pt::Tensor x = pt::randn({n, 512});
    pt::Tensor got = f(x, w1, w2);
    std::printf("batch %3lld: matches eager: %s\n", static_cast<long long>(n),
                pt::allclose(got, mlp(x, w1, w2), 1e-4, 1e-4) ? "yes" : "NO");
  }
  pt::Stats s = pt::stats();
  std::printf("frames=%lld compiles=%lld recompiles=%lld cache_hits=%lld\n", static_cast<long long>(s.frames),
              static_cast<long long>(s.compiles), static_cast<long long>(s.recompiles), static_cast<long long>(s.cache_hits));
  std::printf("%s\n", s.to_json().c_str());
  return 0;
}
