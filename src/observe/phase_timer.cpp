#include "observe/phase_timer.h"

#include <chrono>
#include <ctime>

#include "observe/trace.h"

namespace protean::observe {

namespace {
double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

PhaseTimer::Mark PhaseTimer::mark() { return {trace_now_us(), wall_seconds(), thread_cpu_seconds()}; }

void PhaseTimer::record(std::string_view name, const Mark& m) {
  phases_.push_back({std::string(name), wall_seconds() - m.wall0, thread_cpu_seconds() - m.cpu0, m.start_us});
}

double PhaseTimer::wall(std::string_view name) const {
  double s = 0;
  for (const Phase& p : phases_)
    if (p.name == name) s += p.wall_s;
  return s;
}

void PhaseTimer::append(const PhaseTimer& other) { phases_.insert(phases_.end(), other.phases_.begin(), other.phases_.end()); }

void PhaseTimer::trace_spans(const std::string& compile_id, std::string_view prefix) const {
  if (!trace_enabled()) return;
  for (const Phase& p : phases_)
    trace_event("chromium_event", {{"name", std::string(prefix) + p.name}, {"ph", "X"}, {"ts", p.start_us},
                                   {"dur", static_cast<int64_t>(p.wall_s * 1e6)}, {"args", {{"compile_id", compile_id}}}});
}

}  // namespace protean::observe
