// `protean pgo`: inspect and maintain PGO profiles (docs/pgo.md).
//   protean pgo show [--job ID | FILE]   frames with `?` for dynamic dims and observed ranges, plus the
//                                        PROTEAN_DYNAMIC_SOURCES line and mark_dynamic calls that make
//                                        a cold run compile once
//   protean pgo merge A B... -o OUT      semilattice join of profiles
//   protean pgo clear [--job ID]         deletes the job's local profiles
// The job defaults to PROTEAN_JOB_ID; the store root to PROTEAN_CACHE_DIR (~/.cache/protean).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "dynamic/pgo.h"

namespace CLI {
class App;
}

namespace protean::tools {

struct PgoArgs {
  std::string job;                  // --job (show, clear)
  std::string file;                 // show FILE
  std::string stray_job;            // clear JOB: a positional job id (an extra argument), answered with a hint at --job
  std::vector<std::string> inputs;  // merge A B ...
  std::string out;                  // merge -o
};

/// Adds `pgo` with its `show`, `merge` and `clear` subcommands. Returns the `pgo` subcommand.
CLI::App* add_pgo_subcommand(CLI::App& app, PgoArgs& args);
/// Runs whichever of show/merge/clear was parsed on `pgo_cmd`. Returns the exit code (1 with a message on
/// `err` for unreadable/corrupt files or a missing job id).
int run_pgo(const CLI::App& pgo_cmd, const PgoArgs& args, std::ostream& out, std::ostream& err);

int pgo_show(const PgoArgs& args, std::ostream& out, std::ostream& err);
int pgo_merge(const PgoArgs& args, std::ostream& out, std::ostream& err);
int pgo_clear(const PgoArgs& args, std::ostream& out, std::ostream& err);

/// The text of `pgo show` for one profile: per frame its sources ("x: [1, 3, 48, ?]  (dim 3 in [160,
/// 960])"), the mark_dynamic calls, and at the end the PROTEAN_DYNAMIC_SOURCES line.
std::string render_profile(const dynamic::Profile& p);

}  // namespace protean::tools
