// Background compilation (CompileOptions::async_compile): a cache entry whose backend artifact is
// not ready yet runs on a fallback artifact (the graph interpreter) while the real artifact is built
// on the process's compile worker, then switches to it without any caller waiting.
//
//   auto art = make_deferred_artifact(make_artifact("interp", in),
//                                     [=] { return build_the_real_thing(); }, "0/0 cpu");
//   art->run(...);   // interp now, the built artifact once the worker has finished
//
// Guarantees:
//  * run() never blocks on the build; it is safe from any number of threads (it calls the fallback's
//    or the built artifact's run(), both thread-safe by the Artifact contract). The switch is one
//    atomic pointer publish: a call sees either artifact, never a half-built one.
//  * A build that throws is reported once (a warning naming `what` and the error) and counted in
//    AsyncCompileStats::failed; the artifact keeps using the fallback for good.
//  * One worker thread per process runs builds in submission order. An artifact destroyed before
//    its build started (reset()) cancels it. At process exit the worker finishes the build in flight
//    and drops queued ones (logged under PROTEAN_LOGS=cache and traced: see make_deferred_artifact).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/registry.h"

namespace protean::backend {

/// Process-wide counters since start or the last reset_async_compile_stats().
struct AsyncCompileStats {
  int64_t started = 0;        ///< builds handed to the worker
  int64_t finished = 0;       ///< builds that produced an artifact (calls switched to it)
  int64_t failed = 0;         ///< builds that threw (entries keep the fallback)
  int64_t cancelled = 0;      ///< builds dropped because their artifact was destroyed first
  int64_t fallback_runs = 0;  ///< calls served by the fallback while (or because) no build was ready
  int64_t compiled_runs = 0;  ///< calls served by a background-built artifact
  double build_seconds = 0;   ///< worker wall time spent in builds
};
AsyncCompileStats async_compile_stats();
void reset_async_compile_stats();

/// Blocks until the worker has no queued or running build (tests, benchmarks).
void wait_for_async_compiles();

/// Builds the real artifact on the worker thread; may throw (CompileError for a failed C++ build).
using BuildJob = std::function<std::unique_ptr<Artifact>()>;

/// Runs `task` on the compile worker, after the builds and tasks queued before it (CUDA graph
/// recording of a new size bucket, backend/cuda/graphs.h). A task that throws is reported once as a
/// warning naming `what`. Tasks still queued at process exit are dropped; wait_for_async_compiles()
/// also waits for tasks.
void run_on_compile_worker(std::function<void()> task, std::string what);

/// An artifact that runs `fallback` until `job` has produced the real one. `what` names the build
/// in warnings ("compile 0/1 (backend cpu)"). With tracing on, the build's outcome is a `cache` event
/// of tier "background" for `compile_id`: result "built" (detail: seconds), "failed" (the error),
/// "cancelled" (the artifact was destroyed before the build started) or "dropped" (still queued when
/// the process ended).
std::unique_ptr<Artifact> make_deferred_artifact(std::unique_ptr<Artifact> fallback, BuildJob job, std::string what,
                                                std::string compile_id = {});

}  // namespace protean::backend
