// The build identity of Protean's code, for cache keys of compiled plans (backend/cpu/program_plan.h,
// backend/cuda/plan_cache.h): a plan is the output of this build's lowering, scheduling and code
// generator, and the version string names a release, not a build.
#pragma once

#include <string>

namespace protean::cache {

/// The GNU build ID (hex) of the loaded object holding this code (libprotean, or the program it is
/// linked into); "-" when it has none. Computed once.
std::string code_build_id();

}  // namespace protean::cache
