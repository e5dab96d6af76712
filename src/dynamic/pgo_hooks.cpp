#include "dynamic/pgo_hooks.h"

#include "dynamic/collectives.h"
#include "dynamic/profile_store.h"

namespace protean::dynamic {

FrameIdentity frame_identity(const CompileOptions& opts, const std::vector<std::string>& parameter_names) {
  FrameIdentity id;
  id.name = opts.name;
  id.file = opts.file;
  id.line = opts.line;
  id.content_hash = content_hash(opts.name, opts.arg_names, parameter_names);
  return id;
}

FrameSeeds make_seeds(const CompileOptions& opts, const std::vector<std::string>& parameter_names) {
  FrameSeeds s;
  s.id = frame_identity(opts, parameter_names);
  s.collectives = collectives_active(opts.compiler_collectives);
  return s;
}

void before_compile(FrameSeeds& s, Dynamic mode, bool first_compile, const FrameState& fs, const std::string& compile_id) {
  if (first_compile) s.pgo = pgo_before_first_compile(s.id, mode, compile_id);
  if (!s.collectives) return;
  FrameProfile mine = to_profile(s.id, fs);
  if (s.pgo) merge_frame(mine, *s.pgo);
  if (s.collective) merge_frame(mine, *s.collective);  // never narrower than the last agreement
  s.collective = exchange_frame_state(s.id, mine, compile_id);
}

void after_compile(const FrameSeeds& s, Dynamic mode, const FrameState& fs, const std::string& compile_id) {
  pgo_after_compile(s.id, fs, mode, compile_id);
}

}  // namespace protean::dynamic
