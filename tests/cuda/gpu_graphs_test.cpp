// mode "reduce-overhead" on a real GPU (backend/cuda/graphs.h): replayed graphs give the same bits as
// plain launches at every size of a bucket, outputs held across many later calls keep their values,
// and a new size inside a known bucket records nothing. Most tests record on the calling thread
// (PROTEAN_CUDA_GRAPH_RECORD=inline) so that every call of a bucket comes from its graph; one checks
// the default, recording on the compile worker. Skipped without a CUDA device (CI runs the
// fake-driver CudaGraphs.* instead); bench/gpu/graphs.sh runs them, also under compute-sanitizer.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "backend/async_compile.h"
#include "backend/cuda/autotune.h"
#include "device/driver.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;
namespace drv = protean::cuda;

namespace {

pt::Tensor chain(const pt::Tensor& x, const pt::Tensor& w) {
  // pointwise, a row reduction, a broadcast against a weight: several generated kernels.
  pt::Tensor h = pt::add(pt::mul(x, 2.0), 1.0);
  pt::Tensor s = pt::softmax(h, -1);
  return pt::add(pt::mul(s, w), x);
}

bool same_bits(const pt::Tensor& a, const pt::Tensor& b) {
  const pt::Tensor ca = a.cpu().contiguous(), cb = b.cpu().contiguous();
  return ca.sizes() == cb.sizes() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.int_numel()) * ca.itemsize()) == 0;
}

}  // namespace

TEST(CudaGpuGraphs, ReplayEqualsPlainLaunchesBitForBitAndHeldOutputsKeepTheirValues) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  pt::reset();
  pt::CompileOptions plain, graphs;
  plain.name = "chain_plain";
  graphs.name = "chain_graphs";
  plain.backend = graphs.backend = "cuda";
  plain.dynamic = graphs.dynamic = pt::Dynamic::On;
  graphs.mode = "reduce-overhead";
  auto fp = pt::compile(chain, plain), fg = pt::compile(chain, graphs);
  pt::manual_seed(1);
  const pt::Tensor w = pt::randn({96}, pt::DType::F32, pt::kCUDA);
  std::vector<pt::Tensor> xs, held;
  for (int64_t n = 33; n <= 64; ++n) {  // every size of one bucket, in a shuffled order
    const int64_t m = 33 + (n * 7) % 32;
    xs.push_back(pt::randn({m, 96}, pt::DType::F32, pt::kCUDA));
    held.push_back(fg(xs.back(), w));
  }
  const pt::Stats s = pt::stats();
  EXPECT_EQ(s.graph_buckets, 1);
  EXPECT_EQ(s.graph_recordings, 1) << "one bucket, one segment";
  EXPECT_EQ(s.graph_replays, 32);
  // Many later calls in other buckets and the same one.
  for (int i = 0; i < 50; ++i) {
    pt::Tensor y = pt::randn({i % 2 ? 40 : 100, 96}, pt::DType::F32, pt::kCUDA);
    fg(y, w);
  }
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_TRUE(same_bits(held[i], fp(xs[i], w))) << "size " << xs[i].sizes()[0].hint();
  EXPECT_EQ(pt::stats().graph_recordings, 2) << "[65, 128] once; 40 is in [33, 64]";
  EXPECT_EQ(pt::stats().graph_plain_runs, 0);
}

TEST(CudaGpuGraphs, NewSizeInKnownBucketRecordsNothing) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  pt::reset();
  pt::CompileOptions o;
  o.name = "chain_bucket";
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  o.mode = "reduce-overhead";
  auto f = pt::compile(chain, o);
  const pt::Tensor w = pt::randn({96}, pt::DType::F32, pt::kCUDA);
  f(pt::randn({200, 96}, pt::DType::F32, pt::kCUDA), w);
  const int64_t rec = pt::stats().graph_recordings;
  pt::Tensor x = pt::randn({250, 96}, pt::DType::F32, pt::kCUDA);  // [193, 256]
  pt::Tensor y = f(x, w);
  EXPECT_EQ(pt::stats().graph_recordings, rec);
  EXPECT_GT(pt::stats().graph_patches, 0);
  pt::reset();
  pt::CompileOptions p = o;
  p.mode = "default";
  p.name = "chain_bucket_plain";
  auto g = pt::compile(chain, p);
  EXPECT_TRUE(same_bits(y, g(x, w)));
}

// A transformer block's shapes in bf16: LayerNorm, Linear+GELU(tanh), Linear + residual (cuBLASLt
// calls whose only dynamic size is the row count: captured padded to the bucket's bound), then an
// attention-like q·kᵀ → softmax → ·v (products over L×L: captured at the exact shape). The weights
// are constants of the graph (read from the closure), as a model's parameters are.
TEST(CudaGpuGraphs, LibraryNodesInsideTheGraphEqualPlainLaunchesBitForBit) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  pt::reset();
  pt::manual_seed(3);
  const auto bf = pt::DType::BF16;
  const pt::Tensor w1 = pt::mul(pt::randn({1024, 256}, bf, pt::kCUDA), 0.05), b1 = pt::randn({1024}, bf, pt::kCUDA);
  const pt::Tensor w2 = pt::mul(pt::randn({256, 1024}, bf, pt::kCUDA), 0.03);
  const pt::Tensor wq = pt::mul(pt::randn({64, 256}, bf, pt::kCUDA), 0.06), wk = pt::mul(pt::randn({64, 256}, bf, pt::kCUDA), 0.06);
  const pt::Tensor wv = pt::mul(pt::randn({64, 256}, bf, pt::kCUDA), 0.06);
  auto block = [=](const pt::Tensor& x) {
    pt::Tensor h = pt::layer_norm(x, {256});
    pt::Tensor a = pt::gelu(pt::linear(h, w1, b1), "tanh");
    pt::Tensor m = pt::add(pt::linear(a, w2), x);
    pt::Tensor q = pt::linear(m, wq), k = pt::linear(m, wk), v = pt::linear(m, wv);
    pt::Tensor s = pt::softmax(pt::mul(pt::matmul(q, pt::transpose(k, 0, 1)), 0.125), -1);
    return pt::layer_norm(pt::add(pt::matmul(s, v), q), {64});
  };
  pt::CompileOptions plain, graphs;
  plain.name = "block_plain";
  graphs.name = "block_graphs";
  plain.backend = graphs.backend = "cuda";
  graphs.mode = "reduce-overhead";
  auto fp = pt::compile(block, plain), fg = pt::compile(block, graphs);
  std::vector<pt::Tensor> xs, held;
  for (int64_t n = 33; n <= 64; ++n) {  // every size of the bucket [33, 64], shuffled
    const int64_t L = 33 + (n * 7) % 32;
    xs.push_back(pt::randn({L, 256}, bf, pt::kCUDA));
    pt::mark_dynamic(xs.back(), 0);  // the row count only: the feature size stays static
    held.push_back(fg(xs.back()));
  }
  const pt::Stats s = pt::stats();
  EXPECT_EQ(s.graph_buckets, 1);
  EXPECT_EQ(s.graph_recordings, 32) << "one graph (one segment) for the whole call, recorded again at each new length "
                                       "(the attention products are captured at their exact shape)";
  EXPECT_EQ(s.graph_plain_runs, 0);
  for (int i = 0; i < 20; ++i) {  // later calls, two buckets
    pt::Tensor y = pt::randn({i % 2 ? 40 : 100, 256}, bf, pt::kCUDA);
    pt::mark_dynamic(y, 0);
    fg(y);
  }
  int differ = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const pt::Tensor want = fp(xs[i]);
    if (!same_bits(held[i], want)) {
      ++differ;
      ADD_FAILURE() << "L = " << xs[i].sizes()[0].hint() << ": max |graph - plain| = "
                    << pt::amax(pt::abs(pt::sub(held[i].to(pt::DType::F32), want.to(pt::DType::F32)))).cpu().item<float>();
    }
  }
  EXPECT_EQ(differ, 0) << "of " << xs.size() << " sizes";

  // The default: the bucket [65, 128]'s graph recorded on the compile worker while its first call ran
  // plain launches; the later calls replay it, with the same bits as plain launches.
  unsetenv("PROTEAN_CUDA_GRAPH_RECORD");
  pt::reset();
  graphs.name = "block_graphs_worker";
  auto fw = pt::compile(block, graphs);
  std::vector<pt::Tensor> ws, wheld;
  for (int64_t L : {100, 70, 128, 65, 99}) {
    ws.push_back(pt::randn({L, 256}, bf, pt::kCUDA));
    pt::mark_dynamic(ws.back(), 0);
    wheld.push_back(fw(ws.back()));
    if (ws.size() == 1) pt::backend::wait_for_async_compiles();
  }
  EXPECT_EQ(pt::stats().graph_plain_runs, 1) << "the first call only";
  EXPECT_EQ(pt::stats().graph_replays, 4);
  EXPECT_EQ(pt::stats().graph_recordings, 5) << "on the worker, then again at each new length";
  for (size_t i = 0; i < ws.size(); ++i) {
    const pt::Tensor want = fp(ws[i]);
    EXPECT_TRUE(same_bits(wheld[i], want))
        << "L = " << ws[i].sizes()[0].hint() << " (call " << i << "): max |graph - plain| = "
        << pt::amax(pt::abs(pt::sub(wheld[i].to(pt::DType::F32), want.to(pt::DType::F32)))).cpu().item<float>();
  }
}

// Graphs recorded on the calling thread and a fresh artifact cache (its tuning table included) for a
// max-autotune test; returns the cache directory.
static std::string tuning_test_env(const char* what) {
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  const std::string dir = fmt::format("/tmp/protean-gpu-{}-{}", what, ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  unsetenv("PROTEAN_JOB_ID");
  return dir;
}
static pt::Tensor ln_gelu(const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
  return pt::gelu(pt::layer_norm(x, {x.size(-1)}, w, b));
}
static pt::Tensor softmax(const pt::Tensor& x, const pt::Tensor&, const pt::Tensor&) { return pt::softmax(x, -1); }

// mode "max-autotune" with each row-kernel variant forced to win (the autotune test timer makes it the
// fastest): the replayed results against the untuned kernel's (reduce-overhead) at several sizes of one
// bucket. A variant with the untuned vector width only regroups rows into blocks (each row keeps its
// warp or block and its lanes): bit for bit. Another vector width deals a row's elements to the threads
// differently, so reductions add in another order: within f32 rounding of the row's statistics
// (bf16 outputs: one unit in the last place).
TEST(CudaGpuGraphs, MaxAutotuneRowVariantsEqualTheUntunedKernel) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  namespace bc = protean::backend::cuda;
  const std::string dir = tuning_test_env("variants");
  struct Case {
    const char* name;
    std::function<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)> fn;
    pt::DType dtype;
    int64_t bound;
    std::vector<int64_t> cols;
    int own_width;  // the untuned schedule's vector width
    double tol;     // largest difference allowed where the width differs, relative to max(1, |untuned|)
  };
  const std::vector<Case> cases = {
      {"ln_gelu_bf16_warp", ln_gelu, pt::DType::BF16, 768, {705, 736, 768}, 8, 1.0 / 128},
      {"softmax_f32_block", softmax, pt::DType::F32, 4096, {3848, 4000, 4096}, 4, 1e-6},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<int64_t, pt::Tensor> xs, ws, bs, untuned;
    auto run = [&](const char* mode, const std::string& name) {
      pt::CompileOptions o;
      o.name = name;
      o.backend = "cuda";
      o.dynamic = pt::Dynamic::On;
      o.mode = mode;
      auto f = pt::compile(c.fn, o);
      std::map<int64_t, pt::Tensor> r;
      for (int64_t n : c.cols) {
        if (!xs.count(n)) {
          pt::manual_seed(static_cast<uint64_t>(n));
          xs[n] = pt::randn({512, n}, c.dtype, pt::kCUDA);
          ws[n] = pt::randn({n}, c.dtype, pt::kCUDA);
          bs[n] = pt::randn({n}, c.dtype, pt::kCUDA);
          pt::mark_dynamic(xs[n], 0, 2, 65536);
          pt::mark_dynamic(xs[n], 1, 2, c.bound);
        }
        r[n] = f(xs[n], ws[n], bs[n]);
      }
      return r;
    };
    pt::reset();
    untuned = run("reduce-overhead", std::string(c.name) + "_untuned");
    for (int forced = 1; forced <= 8; ++forced) {
      pt::reset();
      bc::reset_process_tuning_table();
      std::filesystem::remove_all(dir);
      bc::set_autotune_timer_for_testing([forced](const std::string& key, int i) {
        if (key.find("|variant|") == std::string::npos) return i == 0 ? 1.0 : 10.0;  // threads per row stay
        return i == forced ? 1.0 : 10.0;
      });
      pt::observe::LogCapture logs("graphs");
      const auto tuned = run("max-autotune", fmt::format("{}_tuned{}", c.name, forced));
      bc::set_autotune_timer_for_testing({});
      const std::string log = logs.str();
      const size_t at = log.find("changed: ");
      if (at == std::string::npos) break;  // fewer candidates than `forced`
      const size_t v = log.find('v', log.find(" r", at) + 2);
      ASSERT_NE(v, std::string::npos) << log;
      const int width = log[v + 1] - '0';
      SCOPED_TRACE(log.substr(at, log.find('\n', at) - at));
      for (int64_t n : c.cols) {
        const pt::Tensor a = tuned.at(n).to(pt::DType::F32).cpu().contiguous(), b = untuned.at(n).to(pt::DType::F32).cpu().contiguous();
        if (width == c.own_width) {
          EXPECT_TRUE(same_bits(tuned.at(n), untuned.at(n))) << "cols " << n;
          continue;
        }
        double diff = 0;
        for (int64_t i = 0; i < a.int_numel(); ++i)
          diff = std::max(diff, std::abs(double(a.data_ptr<float>()[i]) - double(b.data_ptr<float>()[i])) /
                                    std::max(1.0, std::abs(double(b.data_ptr<float>()[i]))));
        EXPECT_LE(diff, c.tol) << "cols " << n;
      }
    }
  }
  std::filesystem::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

// mode "max-autotune" with each row split (a block-per-row kernel over a thread-block cluster of 2 or 4
// blocks, sm_90) forced to win: few long rows (32 rows; the rows' bucket bound stays under the
// multiprocessor count, where splits are timed), LayerNorm+GELU and softmax over streamed rows (bound
// 65536 columns) and rows kept in registers (bound 4096), against the untuned kernel (reduce-overhead).
// A split sums the row's statistics per block and then across the blocks (in rank order, the same in
// every block), another order than the untuned block's: within f32 rounding of the statistics, which a
// bf16 store turns into at most one unit in the last place (relative 2^-7 of max(1, |value|)); f32
// outputs within 1e-6 of max(1, |value|). Run under compute-sanitizer memcheck and racecheck by
// build-gpu/callG.sh.
TEST(CudaGpuGraphs, MaxAutotuneRowSplitsEqualTheUntunedKernel) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  namespace bc = protean::backend::cuda;
  const std::string dir = tuning_test_env("splits");
  struct Case {
    const char* name;
    std::function<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)> fn;
    pt::DType dtype;
    int64_t bound;
    std::vector<int64_t> cols;
    // largest difference allowed, relative to max(1, |untuned|): a split adds a row's statistics in
    // another order, so bf16 outputs may move by one unit in the last place (2^-7) and f32 outputs by
    // the statistics' rounding, ~sqrt(columns) * 2^-24 relative to the row's mean (3 here) and the
    // weight: 2e-5 at up to 65536 columns (the H200 measured 1.8e-6 to 3.3e-6 at 16384 and 32768)
    double tol;
  };
  const std::vector<Case> cases = {
      {"ln_gelu_bf16_stream", ln_gelu, pt::DType::BF16, 65536, {16384, 24576, 32768}, 1.0 / 128},
      {"softmax_bf16_stream", softmax, pt::DType::BF16, 65536, {16384, 32768, 65536}, 1.0 / 128},
      {"ln_gelu_f32_stream", ln_gelu, pt::DType::F32, 65536, {16384, 32768}, 2e-5},
      {"ln_gelu_bf16_registers", ln_gelu, pt::DType::BF16, 4096, {3072, 4096}, 1.0 / 128},
      {"softmax_f32_registers", softmax, pt::DType::F32, 4096, {3848, 4096}, 2e-5},
  };
  const int64_t rows = 32;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<int64_t, pt::Tensor> xs, ws, bs, untuned;
    auto run = [&](const char* mode, const std::string& name) {
      pt::CompileOptions o;
      o.name = name;
      o.backend = "cuda";
      o.dynamic = pt::Dynamic::On;
      o.mode = mode;
      auto f = pt::compile(c.fn, o);
      std::map<int64_t, pt::Tensor> r;
      for (int64_t n : c.cols) {
        if (!xs.count(n)) {
          pt::manual_seed(static_cast<uint64_t>(n));
          xs[n] = pt::add(pt::randn({rows, n}, c.dtype, pt::kCUDA), 3.0);  // mean 3: a shifted sum matters
          ws[n] = pt::randn({n}, c.dtype, pt::kCUDA);
          bs[n] = pt::randn({n}, c.dtype, pt::kCUDA);
          pt::mark_dynamic(xs[n], 0, 2, 64);
          pt::mark_dynamic(xs[n], 1, 2, c.bound);
        }
        r[n] = f(xs[n], ws[n], bs[n]);
      }
      return r;
    };
    pt::reset();
    untuned = run("reduce-overhead", std::string(c.name) + "_untuned");
    std::set<std::string> splits;
    for (int forced = 1; forced <= 8; ++forced) {
      pt::reset();
      bc::reset_process_tuning_table();
      std::filesystem::remove_all(dir);
      // the forced candidate is the fastest where it may run (the timer replaces the timing, not the rule
      // that keeps a split from rows that fill the device or from a device without clusters)
      bc::set_autotune_timer_for_testing([forced](const std::string& key, int i) {
        if (key.find("|variant|") == std::string::npos) return i == 0 ? 1.0 : 10.0;  // threads per row stay
        return i == forced ? 1.0 : 10.0;
      });
      pt::observe::LogCapture logs("graphs");
      const auto tuned = run("max-autotune", fmt::format("{}_split{}", c.name, forced));
      bc::set_autotune_timer_for_testing({});
      const std::string log = logs.str();
      const size_t at = log.find("changed: ");
      if (at == std::string::npos) {
        if (log.find(" site(s) timed") == std::string::npos) ADD_FAILURE() << "no max-autotune line\n" << log;
        if (forced > 4) break;  // past the candidates
        continue;               // not a split: forced where it could not run
      }
      const std::string tag = log.substr(log.find(' ', at + 9) + 1, log.find(' ', log.find(' ', at + 9) + 1) - log.find(' ', at + 9) - 1);
      SCOPED_TRACE(log.substr(at, log.find('\n', at) - at));
      if (tag.find('s') == std::string::npos) continue;  // a vector-width variant: the other test's
      splits.insert(tag);
      for (int64_t n : c.cols) {
        const pt::Tensor a = tuned.at(n).to(pt::DType::F32).cpu().contiguous(), b = untuned.at(n).to(pt::DType::F32).cpu().contiguous();
        ASSERT_EQ(a.int_numel(), b.int_numel());
        double diff = 0;
        int64_t nonfinite = 0;
        for (int64_t i = 0; i < a.int_numel(); ++i) {
          const double x = a.data_ptr<float>()[i], y = b.data_ptr<float>()[i];
          if (!std::isfinite(x) || !std::isfinite(y)) {
            nonfinite += std::isfinite(x) != std::isfinite(y);
            continue;
          }
          diff = std::max(diff, std::abs(x - y) / std::max(1.0, std::abs(y)));
        }
        EXPECT_EQ(nonfinite, 0) << tag << " cols " << n;
        EXPECT_LE(diff, c.tol) << tag << " cols " << n;
      }
    }
    EXPECT_EQ(splits.size(), 2u) << "each split (2 and 4 blocks) forced and checked";
  }
  std::filesystem::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}
