// PhaseTimer: the one timer of a compile's phases. The compile driver (capture/compile.cpp) times
// capture, graph passes and the backend with it, the pass pipeline (ir/pipeline.cpp) each pass, and a
// backend pipeline (backend/cpu/pipeline.cpp) each of its steps. Each phase records its wall seconds,
// the calling thread's CPU seconds (time spent waiting for a core excluded) and its start on the trace
// clock, so a finished timer gives Stats::phase_seconds, the `compilation_metrics` phases and the
// chromium spans of the structured trace (docs/trace-format.md) without any other clock reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace protean::observe {

struct Phase {
  std::string name;
  double wall_s = 0;     ///< wall-clock seconds
  double cpu_s = 0;      ///< CPU seconds of the thread that ran it
  int64_t start_us = 0;  ///< trace_now_us() at its start
};

class PhaseTimer {
 public:
  /// Runs `f` as phase `name` and returns what it returns. A phase whose `f` throws is not recorded
  /// (it did not complete); the exception propagates.
  template <class F>
  decltype(auto) time(std::string_view name, F&& f) {
    const Mark m = mark();
    if constexpr (std::is_void_v<decltype(f())>) {
      f();
      record(name, m);
    } else {
      decltype(auto) r = f();
      record(name, m);
      return r;
    }
  }

  /// Every recorded phase, in the order they finished.
  const std::vector<Phase>& phases() const { return phases_; }
  /// Wall seconds of the phases named `name` (summed; 0 when none ran).
  double wall(std::string_view name) const;
  /// Appends another timer's phases (a sub-pipeline timed on its own).
  void append(const PhaseTimer& other);
  /// One chromium "X" event per phase named `prefix + name`, with args {compile_id}. Does nothing
  /// when tracing is off.
  void trace_spans(const std::string& compile_id, std::string_view prefix = "") const;

  /// A start mark: for a phase that cannot be one callable (it ends in another function).
  struct Mark {
    int64_t start_us;
    double wall0;
    double cpu0;
  };
  static Mark mark();
  /// Records the phase `name` that began at `m` and ends now.
  void record(std::string_view name, const Mark& m);

 private:
  std::vector<Phase> phases_;
};

/// CPU seconds the calling thread has run.
double thread_cpu_seconds();

}  // namespace protean::observe
