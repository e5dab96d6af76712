// Dispatch under hostile use: reset() while other threads call compiled functions (entries and
// artifacts stay alive while a call runs them), deferred reclamation itself, a compiled function
// that calls itself while it is traced (inlined on the trace's tensors, a CompileError otherwise,
// never a deadlock), and compiled functions calling compiled functions on every backend.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/reclaim.h"
#include "cpu_test_util.h"
#include "observe/log.h"
#include "protean/autograd.h"
#include "protean/compile.h"
#include "protean/module.h"
#include "protean/optim.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean {
namespace {

// Runs `fn` on a thread; a call still blocked after `seconds` is a deadlock: the test binary cannot
// recover the blocked thread, so it reports and exits.
void within(double seconds, const std::string& what, const std::function<void()>& fn) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr err;
  std::thread t([&] {
    try {
      fn();
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done; })) {
      std::fprintf(stderr, "FATAL: %s did not return within %.0f s (deadlock)\n", what.c_str(), seconds);
      std::fflush(stderr);
      _exit(3);
    }
  }
  t.join();
  if (err) std::rethrow_exception(err);
}

// ---- deferred reclamation ------------------------------------------------------------------------------
struct Flag {
  explicit Flag(std::atomic<bool>* d) : destroyed(d) {}
  Flag(const Flag&) = delete;
  Flag& operator=(const Flag&) = delete;
  ~Flag() { destroyed->store(true); }
  std::atomic<bool>* destroyed;
};

TEST(Reclaim, ObjectOutlivesTheReadSectionsThatMaySeeIt) {
  std::atomic<bool> destroyed{false}, entered{false}, leave{false};
  std::thread reader([&] {
    core::ReadSection section;
    entered = true;
    while (!leave) std::this_thread::yield();
  });
  while (!entered) std::this_thread::yield();
  core::retire({std::make_shared<Flag>(&destroyed)});
  EXPECT_FALSE(destroyed) << "freed while a read section that began before retire() was running";
  core::collect();
  EXPECT_FALSE(destroyed);
  EXPECT_GE(core::retired_pending(), 1u);
  leave = true;
  reader.join();
  core::collect();
  EXPECT_TRUE(destroyed) << "not freed after the grace period";
  // No section running: retire() frees at once; a nested section of this thread delays it.
  std::atomic<bool> d2{false}, d3{false};
  core::retire({std::make_shared<Flag>(&d2)});
  EXPECT_TRUE(d2);
  {
    core::ReadSection outer;
    {
      core::ReadSection inner;
    }
    core::retire({std::make_shared<Flag>(&d3)});
    core::collect();
    EXPECT_FALSE(d3) << "the inner section's end must not end the outer one";
  }
  core::collect();
  EXPECT_TRUE(d3);
}

// ---- reset() during calls ------------------------------------------------------------------------------
Tensor body(const Tensor& x, const Tensor& w) { return add(mul(tanh(x), w), 1.0); }

void calls_while_resetting(const std::string& backend, int resets) {
  reset();
  auto f = compile(body, {.name = "reset_race_" + backend, .arg_names = {"x", "w"}, .backend = backend});
  manual_seed(41);
  std::vector<Tensor> xs{randn({4, 8}), randn({6, 8}), randn({9, 8})};
  Tensor w = randn({8});
  std::vector<Tensor> want;
  for (const Tensor& x : xs) want.push_back(body(x, w));
  for (const Tensor& x : xs) f(x, w);  // static, then dynamic entries
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0}, wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&, t] {
      for (int64_t i = t; !stop.load(std::memory_order_relaxed); ++i) {
        size_t k = static_cast<size_t>(i % 3);
        if (!allclose(f(xs[k], w), want[k], 1e-5, 1e-5, true)) wrong.fetch_add(1);
        calls.fetch_add(1, std::memory_order_relaxed);
      }
    });
  for (int r = 0; r < resets; ++r) {
    reset();
    std::this_thread::sleep_for(std::chrono::microseconds(200 + 37 * (r % 7)));
  }
  stop = true;
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong.load(), 0) << backend << ": results that differ from eager";
  EXPECT_GT(calls.load(), resets) << backend;
  // Every call returned: nothing reset() retired may still be waiting.
  core::collect();
  EXPECT_EQ(core::retired_pending(), 0u) << backend;
  reset();
}

TEST(ResetDuringCalls, InterpCallersSurviveConcurrentResets) { within(120, "interp callers vs reset()", [] { calls_while_resetting("interp", 300); }); }

TEST(ResetDuringCalls, CpuCallersSurviveConcurrentResets) {
  backend::cpu::testing::use_test_cache_dir();
  within(300, "cpu callers vs reset()", [] { calls_while_resetting("cpu", 40); });
}

// reset() waits for each frame's compile mutex; a compile that holds it and then creates (and
// destroys) a compiled function must not wait for reset() in turn (reset() used to hold the frame
// registry's lock while it waited, and creating a frame takes that lock: a deadlock).
TEST(ResetDuringCalls, AResetWaitingForACompileThatCreatesAFrameReturns) {
  reset();
  std::atomic<bool> tracing{false}, resetting{false};
  std::atomic<int> inner_frames{0};
  auto f = compile(
      [&](const Tensor& x) {
        tracing = true;
        while (!resetting.load()) std::this_thread::yield();
        // reset() is now called on the other thread and waits (or is about to wait) for this compile.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        {
          auto inner = compile([](const Tensor& y) { return mul(y, 2.0); }, {.name = "inner_frame"});
          inner_frames.fetch_add(1);
        }  // destroyed here too (unregisters)
        return add(x, 1.0);
      },
      {.name = "frame_maker", .arg_names = {"x"}, .backend = "interp"});
  Tensor x = randn({3});
  within(60, "reset() against a compile that creates a frame", [&] {
    std::thread caller([&] { EXPECT_TRUE(allclose(f(x), add(x, 1.0))); });
    while (!tracing.load()) std::this_thread::yield();
    std::thread resetter([&] {
      resetting = true;
      reset();
    });
    caller.join();
    resetter.join();
  });
  EXPECT_EQ(inner_frames.load(), 1);
  // Both frames work afterwards; a frame made and dropped during a reset is gone from the registry.
  EXPECT_TRUE(allclose(f(x), add(x, 1.0)));
  reset();
}

// ---- re-entry and nesting -------------------------------------------------------------------------------
TEST(ReentrantCompile, SelfCallOnUntracedTensorsIsACompileError) {
  reset();
  Tensor outside = randn({3});
  std::optional<CompiledFunction<Tensor(const Tensor&)>> f;
  f.emplace(compile([&](const Tensor& x) { return add(x, (*f)(outside)); }, {.name = "self_caller", .arg_names = {"x"}}));
  std::string msg;
  within(60, "a compiled function calling itself while traced", [&] {
    try {
      (*f)(randn({3}));
    } catch (const CompileError& e) {
      msg = e.what();
    }
  });
  EXPECT_NE(msg.find("re-entrant compile: self_caller"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Call the plain (uncompiled) function"), std::string::npos) << msg;
  // The frame is usable afterwards (its compile mutex was released).
  std::optional<CompiledFunction<Tensor(const Tensor&)>> g;
  g.emplace(compile([](const Tensor& x) { return mul(x, 3.0); }, {.name = "after"}));
  Tensor y = randn({2});
  EXPECT_TRUE(allclose((*g)(y), mul(y, 3.0)));
}

TEST(ReentrantCompile, RecursionOnTracedTensorsIsInlined) {
  for (const char* backend : {"interp", "cpu"}) {
    reset();
    backend::cpu::testing::use_test_cache_dir();
    std::optional<CompiledFunction<Tensor(const Tensor&, int64_t)>> f;
    std::function<Tensor(const Tensor&, int64_t)> plain = [&](const Tensor& x, int64_t depth) {
      return depth == 0 ? mul(x, 2.0) : add((*f)(tanh(x), depth - 1), 1.0);
    };
    f.emplace(compile(plain, {.name = "recursive", .arg_names = {"x", "depth"}, .backend = backend}));
    std::function<Tensor(const Tensor&, int64_t)> eager = [&](const Tensor& x, int64_t depth) {
      return depth == 0 ? mul(x, 2.0) : add(eager(tanh(x), depth - 1), 1.0);
    };
    Tensor x = randn({5});
    Tensor got;
    within(120, fmt::format("a recursive compiled function on {}", backend), [&] { got = (*f)(x, 4); });
    EXPECT_TRUE(allclose(got, eager(x, 4), 1e-5, 1e-5)) << backend;
    EXPECT_EQ(stats().compiles, 1) << backend << ": the recursion is one graph";
  }
}

TEST(NestedCompiled, InnerCompiledFunctionIsInlinedOnEveryBackend) {
  for (const char* backend : {"interp", "cpu", "eager"}) {
    reset();
    backend::cpu::testing::use_test_cache_dir();
    auto inner_fn = [](const Tensor& x) { return add(mul(x, 2.0), 1.0); };
    auto inner = compile(inner_fn, {.name = "inner", .arg_names = {"x"}, .backend = backend});
    auto outer_fn = [&](const Tensor& x, const Tensor& y) { return add(relu(inner(x)), inner(y)); };
    auto outer = compile(outer_fn, {.name = "outer", .arg_names = {"x", "y"}, .backend = backend});
    Tensor x = randn({4, 3}), y = randn({4, 3});
    Tensor want = add(relu(inner_fn(x)), inner_fn(y));
    std::string err;
    Tensor got;
    try {
      got = outer(x, y);
    } catch (const Error& e) {
      err = e.what();
    }
    ASSERT_TRUE(err.empty()) << backend << ": " << err;
    EXPECT_TRUE(allclose(got, want, 1e-6, 1e-6)) << backend;
    EXPECT_TRUE(allclose(outer(x, y), want, 1e-6, 1e-6)) << backend << " (second call)";
    // the inner function still works on its own
    EXPECT_TRUE(allclose(inner(x), inner_fn(x), 1e-6, 1e-6)) << backend;
  }
}

TEST(ReentrantCompile, ResetFromATracedBodyIsACompileError) {
  reset();
  auto f = compile(
      [](const Tensor& x) {
        reset();
        return mul(x, 2.0);
      },
      {.name = "resets_inside"});
  std::string msg;
  within(60, "reset() from a traced body", [&] {
    try {
      f(randn({2}));
    } catch (const CompileError& e) {
      msg = e.what();
    }
  });
  EXPECT_NE(msg.find("reset() was called from the body of resets_inside"), std::string::npos) << msg;
}

}  // namespace
}  // namespace protean

namespace protean {
namespace {
// A shape error raised while tracing names a dynamic size by its symbol ("inner dimensions do not
// match (s0 vs 4)"); the message now also says what the symbol is in this call and where it comes from.
TEST(CaptureErrors, AShapeErrorSaysWhatItsSymbolsAreInThisCall) {
  auto f = compile([](Tensor x, Tensor w) { return linear(x, w, Tensor()); }, {.name = "lin", .backend = "interp"});
  const Tensor w = randn({8, 4});
  f(randn({6, 4}), w);
  f(randn({7, 4}), w);  // the batch becomes dynamic
  try {
    f(randn({6, 5}), w);
    ADD_FAILURE() << "a wrong width was accepted";
  } catch (const ShapeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("inner dimensions do not match"), std::string::npos) << what;
    EXPECT_NE(what.find("= 5 from args[0].size()[1])"), std::string::npos) << what;
  }
}
}  // namespace
}  // namespace protean

namespace protean {
namespace {
// An undefined Tensor where an op needs one (a default-constructed argument) names the op and the
// input, eagerly, in a compiled function and in a training step; the message had been only
// "operation on an undefined Tensor". An optional input left undefined (linear's bias) is not blamed.
TEST(CaptureErrors, AnUndefinedInputNamesTheOpAndTheInput) {
  auto expect_named = [](const std::function<void()>& fn, const std::string& op, const char* where) {
    try {
      fn();
      ADD_FAILURE() << where << ": no error";
    } catch (const ValueError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(op + "(None"), std::string::npos) << where << ": " << what;
      EXPECT_NE(what.find("input 0 is an undefined Tensor"), std::string::npos) << where << ": " << what;
    }
  };
  const Tensor w = randn({3, 4});
  expect_named([&] { matmul(Tensor(), w); }, "matmul", "eager");
  auto f = compile([](Tensor x, Tensor w) { return linear(x, w, Tensor()); }, {.name = "undef_in", .backend = "interp"});
  expect_named([&] { f(Tensor(), w); }, "linear", "compiled");
  struct M : Module {
    Tensor& w = register_parameter("w", randn({3, 4}));
  };
  auto m = std::make_shared<M>();
  optim::SGD opt({m->w}, optim::SGDOptions{.lr = 0.1});
  auto step = compile_train_step(m, [&](Tensor x) { return sum(linear(x, m->w, Tensor())); }, opt,
                                 {.name = "undef_step", .backend = "interp"});
  expect_named([&] { step(Tensor()); }, "linear", "train step");
}
}  // namespace
}  // namespace protean

namespace protean {
namespace {
// A compiled function's outputs carry no gradient back to its inputs. Traced with grad mode on and an
// input that requires grad (a parameter registered for training) and no backward of its own, it says
// so once per compile, naming the input: an eager backward() after it would otherwise leave that
// input's gradient silently missing. Nothing is said under NoGradGuard, for inputs that do not require
// grad, or for a frame that differentiates itself (value_and_grad).
TEST(CaptureErrors, AnInputThatRequiresGradIsNamedWhenTheFrameCannotPassGradientsBack) {
  Tensor w = randn({3, 4});
  w.requires_grad_();
  const std::string kSays = "gradients do not flow back through a compiled function";
  {
    observe::LogCapture cap("");
    auto f = compile([](Tensor x, Tensor w) { return matmul(x, w); }, {.name = "fwd_only", .backend = "interp"});
    f(randn({2, 3}), w);
    f(randn({2, 3}), w);  // a cache hit: not said again
    const std::string log = cap.str();
    EXPECT_NE(log.find("fwd_only: input(s) 'args[1]' require grad"), std::string::npos) << log;
    EXPECT_EQ(log.find(kSays), log.rfind(kSays)) << "once per compile: " << log;
  }
  {
    observe::LogCapture cap("");
    auto f = compile([](Tensor x, Tensor w) { return matmul(x, w); }, {.name = "under_no_grad", .backend = "interp"});
    NoGradGuard no_grad;
    f(randn({2, 3}), w);
    EXPECT_EQ(cap.str().find(kSays), std::string::npos) << cap.str();
  }
  {
    observe::LogCapture cap("");
    auto g = compile(value_and_grad([](Tensor x, Tensor w) { return sum(matmul(x, w)); }, {.wrt = {1}}),
                     {.name = "differentiates_itself", .backend = "interp"});
    g(randn({2, 3}), w);
    EXPECT_EQ(cap.str().find(kSays), std::string::npos) << cap.str();
  }
}
}  // namespace
}  // namespace protean
