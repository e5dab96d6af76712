#include "backend/async_compile.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "observe/counter.h"
#include "observe/log.h"
#include "observe/trace.h"

namespace protean::backend {

namespace {

/// AsyncCompileStats' counters; reset_async_compile_stats() assigns {} (every counter to 0).
struct Counters {
  observe::Counter started, finished, failed, cancelled, fallback_runs, compiled_runs;
  observe::Counter build_us;
};
Counters& counters() {
  static Counters c;
  return c;
}

/// Shared by a DeferredArtifact and its queued build.
struct State {
  std::unique_ptr<Artifact> fallback;
  std::unique_ptr<Artifact> built;           ///< written once by the worker, before `ready` is published
  std::atomic<const Artifact*> ready{nullptr};
  BuildJob job;
  std::string what;
  std::string compile_id;  ///< the compile the build is for ("" for tasks): its trace events name it
  std::function<void()> task;  ///< a plain task (run_on_compile_worker) instead of a build
};

/// The process's compile worker: one thread, FIFO queue.
class Worker {
 public:
  Worker() {
    (void)counters();  // constructed first, so it outlives the worker at exit
    observe::log_enabled(observe::LogCat::Cache);
    (void)observe::trace_enabled();  // the trace, too: the worker reports dropped builds at exit
    thread_ = std::thread([this] { loop(); });
  }
  ~Worker() {
    std::vector<std::shared_ptr<State>> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      for (const auto& q : queue_)
        if (auto s = q.state.lock(); s && s->job) dropped.push_back(std::move(s));
      queue_.clear();
      owned_.clear();
    }
    // Builds still queued when the process ends never run: say so (the next run compiles them again,
    // on the worker as well, unless it waits for them: wait_for_async_compiles or backend "cpu" with
    // async_compile off).
    for (const auto& s : dropped) {
      trace_outcome(s->what, s->compile_id, "dropped", "the process ended before the build started");
      if (observe::log_enabled(observe::LogCat::Cache))
        observe::log_line(observe::LogCat::Cache, s->compile_id,
                          fmt::format("background {} dropped at exit: the process ended before it started", s->what));
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  /// Tasks are owned by the queue (nobody else holds their State).
  void submit_owned(std::shared_ptr<State> s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      owned_.push_back(s);
      queue_.push_back({s, s->what, s->compile_id});
    }
    cv_.notify_all();
  }
  void submit(const std::shared_ptr<State>& s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({s, s->what, s->compile_id});
    }
    cv_.notify_all();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void loop() {
    for (;;) {
      std::shared_ptr<State> s;
      Queued cancelled;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        s = queue_.front().state.lock();
        if (!s) cancelled = std::move(queue_.front());
        queue_.pop_front();
        if (s && s->task) std::erase(owned_, s);
        busy_ = s != nullptr;
      }
      if (!s) {
        counters().cancelled++;
        trace_outcome(cancelled.what, cancelled.compile_id, "cancelled",
                      "the compiled function's entry was dropped before the build started");
      } else {
        run(*s);
        s.reset();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }
  static void run(State& s) {
    if (s.task) {
      try {
        s.task();
      } catch (const std::exception& e) {
        observe::warn(fmt::format("background {} failed: {}", s.what, e.what()));
      }
      s.task = nullptr;
      return;
    }
    auto t0 = std::chrono::steady_clock::now();
    auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    try {
      std::unique_ptr<Artifact> a = s.job();
      if (!a) throw CompileError("the backend returned no artifact");
      s.built = std::move(a);
      s.ready.store(s.built.get(), std::memory_order_release);
      counters().finished++;
      trace_outcome(s.what, s.compile_id, "built", fmt::format("{:.3f} s", seconds()));
    } catch (const std::exception& e) {
      counters().failed++;
      observe::warn(fmt::format("background {} failed; the entry keeps running on the interpreter: {}", s.what,
                                e.what()));
      trace_outcome(s.what, s.compile_id, "failed", e.what());
    }
    s.job = nullptr;  // release what the job captured (graph, generated source)
    counters().build_us += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  /// A `cache` trace event of tier "background" for a build's compile (docs/trace-format.md).
  static void trace_outcome(const std::string& what, const std::string& compile_id, const char* result,
                            const std::string& detail) {
    if (!observe::trace_enabled()) return;
    nlohmann::json j = {{"tier", "background"}, {"key", what}, {"result", result}, {"detail", detail}};
    if (!compile_id.empty()) j["compile_id"] = compile_id;
    observe::trace_event("cache", std::move(j));
  }

  /// A queued build or task; its name and compile stay known after its artifact is gone (cancelled).
  struct Queued {
    std::weak_ptr<State> state;
    std::string what, compile_id;
  };

  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Queued> queue_;
  std::vector<std::shared_ptr<State>> owned_;  ///< queued tasks
  bool stop_ = false, busy_ = false;
  std::thread thread_;
};
Worker& worker() {
  static Worker w;
  return w;
}

class DeferredArtifact final : public Artifact {
 public:
  explicit DeferredArtifact(std::shared_ptr<State> s) : s_(std::move(s)) {}
  std::vector<Tensor> run(std::span<const Tensor> inputs, std::span<const int64_t> symbol_values) const override {
    if (const Artifact* a = s_->ready.load(std::memory_order_acquire)) {
      counters().compiled_runs.fetch_add(1, std::memory_order_relaxed);
      return a->run(inputs, symbol_values);
    }
    counters().fallback_runs.fetch_add(1, std::memory_order_relaxed);
    return s_->fallback->run(inputs, symbol_values);
  }

 private:
  std::shared_ptr<State> s_;
};

}  // namespace

AsyncCompileStats async_compile_stats() {
  const Counters& c = counters();
  AsyncCompileStats r;
  r.started = c.started.load();
  r.finished = c.finished.load();
  r.failed = c.failed.load();
  r.cancelled = c.cancelled.load();
  r.fallback_runs = c.fallback_runs.load();
  r.compiled_runs = c.compiled_runs.load();
  r.build_seconds = static_cast<double>(c.build_us.load()) / 1e6;
  return r;
}

void reset_async_compile_stats() { counters() = {}; }

void wait_for_async_compiles() { worker().wait_idle(); }

void run_on_compile_worker(std::function<void()> task, std::string what) {
  if (!task) throw ValueError("run_on_compile_worker needs a task");
  auto s = std::make_shared<State>();
  s->task = std::move(task);
  s->what = std::move(what);
  worker().submit_owned(std::move(s));
}

std::unique_ptr<Artifact> make_deferred_artifact(std::unique_ptr<Artifact> fallback, BuildJob job, std::string what,
                                                std::string compile_id) {
  if (!fallback || !job) throw ValueError("make_deferred_artifact needs a fallback artifact and a build job");
  auto s = std::make_shared<State>();
  s->fallback = std::move(fallback);
  s->job = std::move(job);
  s->what = std::move(what);
  s->compile_id = std::move(compile_id);
  counters().started++;
  worker().submit(s);
  return std::make_unique<DeferredArtifact>(std::move(s));
}

}  // namespace protean::backend
