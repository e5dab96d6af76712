// `protean launch --nproc N [--store DIR] -- PROGRAM ARGS...`: starts the N ranks of a job on this host
// without MPI (torchrun's role). Each child gets the parent's environment plus PROTEAN_RANK,
// PROTEAN_WORLD_SIZE, PROTEAN_LOCAL_RANK, PROTEAN_LOCAL_WORLD_SIZE, PROTEAN_STORE and PROTEAN_RUN_ID,
// which distributed::init_from_env() reads (include/protean/distributed.h; docs/distributed.md).
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace protean::tools {

struct LaunchArgs {
  int nproc = 0;
  std::string store;     // the store directory; empty: a fresh one under $TMPDIR, removed at the end
  std::string run_id;    // empty: a random one
  double grace_s = 5;    // seconds between SIGTERM and SIGKILL when stopping the ranks
  bool no_prefix = false;  // pass the ranks' output through as is (no "[rank R] " prefix)
  std::vector<std::string> command;  // PROGRAM ARGS...
};

/// Takes `protean launch ... -- PROGRAM ARGS...` apart before CLI11 sees it (CLI11 hands what follows
/// "--" in a subcommand back to the parent): when argv[1] is "launch" and a "--" comes before the first
/// word that is not a launch option, everything after it goes to `args.command` and argv is cut there.
/// Returns the argc to parse. Without "--", PROGRAM is the first word that is not a launch option.
int split_launch_argv(int argc, char** argv, LaunchArgs& args);

/// Adds the `launch` subcommand to `app`, filling `args`. Returns the subcommand.
CLI::App* add_launch_command(CLI::App& app, LaunchArgs& args);

/// Runs the job:
///  * spawns `nproc` children (fork and execve; PROGRAM is looked up in PATH as execvp does), each in a
///    process group of its own with stdin from /dev/null and the environment above (NCCL_* and every
///    other variable pass through unchanged), and with SIGKILL as its parent-death signal, so a
///    launcher killed by SIGKILL leaves no rank behind;
///  * copies each line the children write to stdout / stderr onto the same stream, prefixed with
///    "[rank R] " (unless no_prefix, when the children write to the launcher's streams directly);
///  * forwards SIGINT, SIGTERM and SIGHUP to every rank;
///  * when a rank exits with a non-zero status or is killed by a signal, sends SIGTERM to the other
///    ranks and SIGKILL to those still running `grace_s` later (each rank's whole process group), so a
///    dead rank never leaves the others hanging;
///  * removes the store directory when it made it.
/// Returns 0 when every rank exited with 0; the failing rank's exit status (128 + the signal number
/// when it was killed) when one failed, after a message naming the rank, its pid and its status on
/// `err`; 128 + the signal when the launcher was interrupted; 2 for bad arguments (nproc outside 1 to
/// 4096, grace outside 0 to 86400 s, a bad run id, or a `store` that already holds files of the run
/// id), 1 when the store directory cannot be made, 127 when PROGRAM cannot be started.
int launch_command(const LaunchArgs& args, std::ostream& err);

}  // namespace protean::tools
