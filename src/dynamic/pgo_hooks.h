// What a frame (src/capture/frame.cpp) calls to take part in PGO and compiler collectives. The frame
// owns one FrameSeeds, guarded by its compile mutex; the dimension policy reads `pgo` and
// `collective` (PolicyInput) with priority below allowlist/marks and above the frame's own FrameState:
//   1. allowlist  2. marks  3. PGO profile (why "pgo")  3b. ranks' joined FrameState (why "collectives")
//   4. automatic dynamic (FrameState)  5. dynamic=On/Off default
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dynamic/pgo.h"
#include "protean/compile.h"

namespace protean::dynamic {

struct FrameSeeds {
  FrameIdentity id;                        // name, file, line, content hash
  bool collectives = false;                // compiler collectives apply to this frame
  std::optional<FrameProfile> pgo;         // the profile entry, loaded before the first compile
  std::optional<FrameProfile> collective;  // every rank's FrameState joined, before the latest compile
  const FrameProfile* pgo_ptr() const { return pgo ? &*pgo : nullptr; }
  const FrameProfile* collective_ptr() const { return collective ? &*collective : nullptr; }
  /// reset(): the next compile is a first compile again (re-reads the profile).
  void clear() {
    pgo.reset();
    collective.reset();
  }
};

/// The frame identity of a compiled function (content hash over name, argument and parameter names).
FrameIdentity frame_identity(const CompileOptions& opts, const std::vector<std::string>& parameter_names);
/// Seeds for a new frame (decides whether collectives apply: CompileOptions::compiler_collectives or
/// PROTEAN_COMPILER_COLLECTIVES=1, with a collective backend of more than one rank).
FrameSeeds make_seeds(const CompileOptions& opts, const std::vector<std::string>& parameter_names);

/// Before every compile, after `fs` took this call's inputs: at the first compile loads the PGO entry;
/// under collectives exchanges (fs ⊔ PGO entry) with every rank. Throws CompileError when a rank
/// does not take part in time.
void before_compile(FrameSeeds& s, Dynamic mode, bool first_compile, const FrameState& fs, const std::string& compile_id);
/// After a successful compile: writes the frame's entry to the PGO store when it changed.
void after_compile(const FrameSeeds& s, Dynamic mode, const FrameState& fs, const std::string& compile_id);

}  // namespace protean::dynamic
