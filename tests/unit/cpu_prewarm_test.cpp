// The first call of a cpu artifact: the prewarm thread (backend/cpu/runner.h) builds the program's
// convolution primitives and packs their weights while the run proceeds, so results must not depend on
// it; and the oneDNN primitive caches (ops/dnnl_util.h) build an entry once when a second thread asks
// for a key that is being built, passing a failed build's error to the waiter without keeping the key.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "ops/dnnl_stats.h"
#include "ops/dnnl_util.h"
#include "protean/compile.h"
#include "protean/error.h"
#include "protean/ops.h"

namespace protean {
namespace {

using TestCache = ops::PrimitiveCache<int64_t, int64_t>;

TEST(DnnlPrimitiveCache, AKeyBeingBuiltIsWaitedForNotBuiltTwice) {
  const int64_t key = 0x5eed0001;
  std::atomic<int> makes{0};
  std::mutex mu;
  std::condition_variable cv;
  bool second_asking = false;
  std::shared_ptr<const int64_t> a, b;
  std::thread first([&] {
    a = TestCache::instance().get(key, [&] {
      ++makes;
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::seconds(5), [&] { return second_asking; });
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the second thread reaches get()
      return std::make_shared<const int64_t>(7);
    });
  });
  while (makes.load() == 0) std::this_thread::yield();
  std::thread second([&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      second_asking = true;
    }
    cv.notify_all();
    b = TestCache::instance().get(key, [&] {
      ++makes;
      return std::make_shared<const int64_t>(8);
    });
  });
  first.join();
  second.join();
  EXPECT_EQ(makes.load(), 1);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a, 7);
  EXPECT_EQ(a.get(), b.get()) << "the waiter gets the entry the builder inserted";
}

TEST(DnnlPrimitiveCache, AFailedBuildThrowsAndTheKeyIsBuiltAgainLater) {
  const int64_t key = 0x5eed0002;
  EXPECT_THROW(TestCache::instance().get(key, []() -> std::shared_ptr<const int64_t> { throw ValueError("no"); }),
               ValueError);
  auto e = TestCache::instance().get(key, [] { return std::make_shared<const int64_t>(3); });
  EXPECT_EQ(*e, 3);
}

TEST(CpuPrewarm, TheFirstRunWithThePrewarmThreadEqualsTheRunWithoutIt) {
  manual_seed(3);
  // A first layer (3 channels, stride 2), a depthwise conv, 1x1 convs on a small image: the layouts
  // the avoids_gemm rule of ops/conv.cpp picks, each conv with constant weights (packed once).
  Tensor w1 = randn({16, 3, 3, 3}) * 0.3, b1 = randn({16}) * 0.1, w2 = randn({16, 1, 3, 3}) * 0.3;
  Tensor w3 = randn({32, 16, 1, 1}) * 0.2, w4 = randn({24, 32, 1, 1}) * 0.2;
  auto net = [=](const Tensor& x) {
    Tensor h = relu(conv2d(x, w1, b1, {2, 2}, {1, 1}));
    h = conv2d(h, w2, {}, {1, 1}, {1, 1}, {1, 1}, 16);
    h = relu(conv2d(h, w3));
    return conv2d(h, w4);
  };
  Tensor x = randn({1, 3, 22, 38});
  Tensor eager = net(x);
  auto first_run = [&](const char* prewarm, const char* name) {
    setenv("PROTEAN_CPU_PREWARM", prewarm, 1);
    auto f = compile(net, {.name = name, .backend = "cpu"});
    Tensor y = f(x);
    Tensor again = f(x);
    unsetenv("PROTEAN_CPU_PREWARM");
    EXPECT_EQ(max_abs_diff(y, again), 0.0) << name;
    return y;
  };
  Tensor with = first_run("1", "prewarm_on");
  Tensor without = first_run("0", "prewarm_off");
  EXPECT_TRUE(allclose(with, eager, 1e-4, 1e-5)) << max_abs_diff(with, eager);
  EXPECT_EQ(max_abs_diff(with, without), 0.0);
}

}  // namespace
}  // namespace protean
