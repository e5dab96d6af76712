// The backend the compile-behaviour scenarios run on (capture_scenarios.cpp, api_scenarios.cpp).
#pragma once

#include <cstdlib>
#include <source_location>
#include <utility>

#include "protean/protean.h"

namespace protean::scenario {

/// The suite's backend: $PROTEAN_SCENARIO_BACKEND when set (ctest runs the whole suite a second time
/// with `cpu`: the `cpu.` tests), else interp — not the default ("auto": cpu, compiling in the
/// background), so the plain suite stays fast.
inline const char* scenario_backend() {
  const char* b = std::getenv("PROTEAN_SCENARIO_BACKEND");
  return b && *b ? b : "interp";
}

/// pt::compile on the suite's backend (scenario_backend()). A scenario naming a backend keeps it.
/// The caller's line stays the compiled function's location.
template <class F>
auto scenario_compile(F fn, CompileOptions opts = {}, std::source_location loc = std::source_location::current()) {
  if (opts.backend == CompileOptions{}.backend) opts.backend = scenario_backend();
  return compile(std::move(fn), std::move(opts), loc);
}

}  // namespace protean::scenario
