// Host cost of a replayed call under mode "reduce-overhead" (backend/cuda/graphs.h), on the fake driver
// (device/fake_driver.h), so it runs on any machine:
//
//   graphs_replay_bench [CALLS] [LENGTH]     (defaults 20000 and 20; from the repository root, or with
//                                            PROTEAN_SOURCE_DIR naming it)
//
// The tiny GPT-2 of the tests (tests/data/onnx/tiny_gpt2.onnx, bf16, on the fake cuda device; cuBLASLt
// is a test hook that launches one fake kernel per call) compiled with backend cuda, automatic dynamic
// shapes and mode "reduce-overhead". After 50 calls at LENGTH tokens (the bucket recorded, every call
// a replay), CALLS more calls at the same length, each timed alone (steady clock around f(x)), and the
// heap allocations (global operator new) counted over all of them. Prints one JSON object: the
// median, p90 and p99 of a call's host time in microseconds, and the allocations per call.
//
// What it covers is everything a steady replayed call does on the host: the guards, the dispatch to
// the artifact, the runner's bookkeeping (sizes, addresses, the outputs from the caching allocator)
// and the graph launch. The fake driver's own launch costs something else than a real driver's
// cuGraphLaunch (it records the launch and walks the graph's nodes, 28 of the allocations per call at
// commit 143e4b8), so the time compares across builds of this benchmark, not with a GPU's host time.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>
#include <string>
#include <vector>

#include "backend/cuda/blas.h"
#include "cache/blob_cache.h"
#include "device/fake_driver.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"
#include "protean/protean.h"

namespace {
std::atomic<int64_t> g_news{0};
}  // namespace

// Every heap allocation of the process goes through these (the library's included: the executable's
// definitions take precedence over libstdc++'s), so a call's allocations can be counted.
void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 20000;
  const long length = argc > 2 ? std::atol(argv[2]) : 20;
  if (calls < 1 || length < 1 || length > 64) {
    std::fprintf(stderr, "usage: graphs_replay_bench [CALLS >= 1] [LENGTH 1..64]\n");
    return 2;
  }
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  bc::set_fake_blas_hook_for_testing(fake, 8);
  const std::string dir = (std::filesystem::temp_directory_path() / fmt::format("protean-replay-bench-{}", ::getpid())).string();
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);  // the fake driver is not thread-safe
  pt::cache::clear_blob_memory_cache();
  const char* src = std::getenv("PROTEAN_SOURCE_DIR");
  pt::onnx::LoadOptions lo;
  lo.float_dtype = pt::DType::BF16;
  lo.device = pt::kCUDA;
  auto m = pt::onnx::load(std::string(src && *src ? src : ".") + "/tests/data/onnx/tiny_gpt2.onnx", lo);
  pt::CompileOptions o;
  o.name = m->identity();
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  o.mode = "reduce-overhead";
  auto f = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
  pt::Tensor x = pt::zeros({1, length}, pt::DType::I64).to(pt::kCUDA);
  for (int i = 0; i < 50; ++i) f(x);
  const int64_t replays0 = pt::stats().graph_replays, plain0 = pt::stats().graph_plain_runs;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(calls));
  int64_t news = 0;
  for (long i = 0; i < calls; ++i) {
    if ((i & 255) == 0) fake.clear_launches();  // the fake driver keeps a record of every launch
    const int64_t n0 = g_news.load(std::memory_order_relaxed);
    const auto a = std::chrono::steady_clock::now();
    { pt::Tensor y = f(x); }
    const auto b = std::chrono::steady_clock::now();
    news += g_news.load(std::memory_order_relaxed) - n0;
    us.push_back(std::chrono::duration<double, std::micro>(b - a).count());
  }
  const int64_t replays = pt::stats().graph_replays - replays0, plain = pt::stats().graph_plain_runs - plain0;
  bc::set_blas_hook_for_testing({});
  std::filesystem::remove_all(dir);
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<size_t>(q * static_cast<double>(us.size())))]; };
  std::printf("%s\n", fmt::format("{{\"bench\": \"graphs_replay\", \"model\": \"tiny_gpt2\", \"length\": {}, \"calls\": {}, "
                                  "\"replays\": {}, \"plain_runs\": {}, \"host_us\": {{\"median\": {:.3f}, \"p90\": {:.3f}, "
                                  "\"p99\": {:.3f}}}, \"allocations_per_call\": {:.2f}}}",
                                  length, calls, replays, plain, at(0.5), at(0.9), at(0.99),
                                  static_cast<double>(news) / static_cast<double>(calls))
                          .c_str());
  return replays == calls && plain == 0 ? 0 : 1;
}
