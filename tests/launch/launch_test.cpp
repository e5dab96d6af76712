// `protean launch` end to end (docs/distributed.md, "Launching without MPI"): real processes started
// by the real CLI, no MPI. The compile scenarios run tests/launch/launch_rank_program.cpp on 2 ranks;
// the launcher's own behaviour (environment, prefixes, a failing or killed rank, forwarded signals)
// is checked with /bin/sh ranks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Result {
  int status = -1;  // the launcher's exit code (128 + signal when it was killed)
  std::string output;  // its stdout and stderr, interleaved
  double seconds = 0;
};

// Runs `protean launch ARGS...` with stdout and stderr in one file; `during(pid)` runs while it does.
Result launch(const std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& env = {},
              const std::function<void(pid_t)>& during = {}) {
  char path[] = "/tmp/protean-launch-test-XXXXXX";
  const int fd = ::mkstemp(path);
  std::vector<std::string> argv_s = {PROTEAN_CLI, "launch"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  if (during) during(pid);
  int st = 0;
  ::waitpid(pid, &st, 0);
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  ::close(fd);
  ::unlink(path);
  return r;
}

bool has(const Result& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

}  // namespace

// ---- compiler collectives over the store, 2 ranks -------------------------------------------------

TEST(LaunchScenario, RanksWithDifferentSizesCompileOneDynamicGraphAndRecompileTogether) {
  Result r = launch({"--nproc", "2", "--", PROTEAN_LAUNCH_RANK_PROGRAM, "varying"}, {{"PROTEAN_COLLECTIVES_TIMEOUT_S", "30"}});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] rank 0: OK varying")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] rank 1: OK varying")) << r.output;
  EXPECT_FALSE(has(r, "FAIL")) << r.output;
}

TEST(LaunchScenario, WithoutCompilerCollectivesEachRankCompilesTwice) {
  Result r = launch({"--nproc", "2", "--", PROTEAN_LAUNCH_RANK_PROGRAM, "no_collectives"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] rank 0: OK no_collectives")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] rank 1: OK no_collectives")) << r.output;
}

TEST(LaunchScenario, RankThatExitsEarlyMakesTheOtherThrowWithinTheTimeoutAndTheLaunchFail) {
  const double timeout = 2;
  Result r = launch({"--nproc", "2", "--grace", "2", "--", PROTEAN_LAUNCH_RANK_PROGRAM, "early_exit"},
                    {{"PROTEAN_COLLECTIVES_TIMEOUT_S", "2"}});
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] rank 0: error: compiler collectives: rank 0 waited 2 s at the guard check of frame 'step'"))
      << r.output;
  EXPECT_TRUE(has(r, "but ranks 1 did not take part")) << r.output;
  EXPECT_TRUE(has(r, "protean launch: failed: rank 0 (pid")) << r.output;
  EXPECT_TRUE(has(r, "exited with status 1")) << r.output;
  // Start-up and one compile per rank, then the timeout: never a hang.
  EXPECT_LT(r.seconds, timeout + 15) << r.output;
}

// The GPU job's bootstrap (NCCL's unique id over the store); skipped without 2 GPUs and NCCL.
TEST(LaunchScenario, NcclGroupBootstrappedOverTheStoreReducesDeviceTensors) {
  Result r = launch({"--nproc", "2", "--", PROTEAN_LAUNCH_RANK_PROGRAM, "nccl"}, {{"PROTEAN_COLLECTIVES_TIMEOUT_S", "60"}});
  if (has(r, "SKIP nccl")) GTEST_SKIP() << r.output;
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] rank 0: OK nccl")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] rank 1: OK nccl")) << r.output;
}

// ---- the launcher ---------------------------------------------------------------------------------

TEST(Launch, RanksGetTheirEnvironmentAndPrefixedOutputAndTheStoreIsRemoved) {
  Result r = launch({"--nproc", "2", "--", "/bin/sh", "-c",
                     "echo \"env $PROTEAN_RANK/$PROTEAN_WORLD_SIZE local $PROTEAN_LOCAL_RANK/$PROTEAN_LOCAL_WORLD_SIZE "
                     "nccl=$NCCL_SOCKET_IFNAME run=$PROTEAN_RUN_ID\"; echo \"store $PROTEAN_STORE\"; echo oops >&2; "
                     "printf 'no newline'"},
                    {{"NCCL_SOCKET_IFNAME", "lo"}, {"PROTEAN_RANK", "7"}});
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] env 0/2 local 0/2 nccl=lo run=")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] env 1/2 local 1/2 nccl=lo run=")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] oops\n")) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] no newline\n")) << r.output;
  const size_t at = r.output.find("[rank 0] store ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string store = r.output.substr(at + 15, r.output.find('\n', at) - at - 15);
  EXPECT_FALSE(std::filesystem::exists(store)) << "the launcher's store directory was left behind: " << store;
}

TEST(Launch, FailingRankStopsTheOthersAndGivesItsStatus) {
  Result r = launch({"--nproc", "3", "--grace", "1", "--", "/bin/sh", "-c",
                     "if [ $PROTEAN_RANK = 1 ]; then sleep 0.2; exit 3; fi; trap '' TERM; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_TRUE(has(r, "protean launch: failed: rank 1 (pid")) << r.output;
  EXPECT_TRUE(has(r, "exited with status 3")) << r.output;
  EXPECT_TRUE(has(r, "sending SIGKILL")) << r.output;  // the others ignored SIGTERM
  EXPECT_LT(r.seconds, 10) << r.output;
}

// A stopped rank (SIGSTOP) gets SIGCONT after the SIGTERM, so it ends now instead of at the SIGKILL
// --grace seconds later.
TEST(Launch, StoppedRankEndsOnSigtermWithoutWaitingForTheGracePeriod) {
  Result r = launch({"--nproc", "2", "--grace", "30", "--", "/bin/sh", "-c",
                     "if [ $PROTEAN_RANK = 0 ]; then sleep 0.3; exit 3; fi; kill -STOP $$; sleep 60"});
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_FALSE(has(r, "sending SIGKILL")) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(Launch, KilledRankIsNamedWithItsSignal) {
  Result r = launch({"--nproc", "2", "--", "/bin/sh", "-c", "if [ $PROTEAN_RANK = 0 ]; then kill -SEGV $$; fi; sleep 60"});
  EXPECT_EQ(r.status, 128 + SIGSEGV) << r.output;
  EXPECT_TRUE(has(r, "rank 0 (pid")) << r.output;
  EXPECT_TRUE(has(r, "was killed by signal 11 (SIGSEGV")) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(Launch, ForwardsSigtermToEveryRank) {
  Result r = launch({"--nproc", "2", "--", "/bin/sh", "-c",
                     "trap 'echo got TERM; exit 7' TERM; echo ready; sleep 60 & wait"},
                    {}, [](pid_t pid) {
                      std::this_thread::sleep_for(std::chrono::milliseconds(800));
                      ::kill(pid, SIGTERM);
                    });
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] got TERM")) << r.output;
  EXPECT_TRUE(has(r, "[rank 1] got TERM")) << r.output;
  EXPECT_TRUE(has(r, "protean launch: stopped by signal 15")) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
}

TEST(Launch, BadArgumentsAndAMissingProgramAreErrors) {
  Result r = launch({"--nproc", "0", "--", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--nproc must be at least 1")) << r.output;
  r = launch({"--nproc", "2", "--"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "no program to start")) << r.output;
  r = launch({"--nproc", "2", "--", "/nonexistent/program"});
  EXPECT_EQ(r.status, 127) << r.output;
  EXPECT_TRUE(has(r, "cannot start rank 0: /nonexistent/program")) << r.output;
  r = launch({"--nproc", "1", "--run-id", "bad/id", "--", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.output;
  for (const char* n : {"abc", "99999999999", "2.5"}) {  // CLI11's conversion errors, exit 2 as the others
    r = launch({"--nproc", n, "--", "/bin/true"});
    EXPECT_EQ(r.status, 2) << n << ": " << r.output;
    EXPECT_TRUE(has(r, "--nproc")) << r.output;
  }
  // A rank count no host runs is refused before anything is allocated or started.
  r = launch({"--nproc", "2000000000", "--", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "--nproc 2000000000 is more ranks than one host runs (at most 4096)")) << r.output;
  for (const char* g : {"inf", "1e300", "nan", "-1"}) {
    r = launch({"--nproc", "1", "--grace", g, "--", "/bin/true"});
    EXPECT_EQ(r.status, 2) << g << ": " << r.output;
    EXPECT_TRUE(has(r, "--grace must be a number of seconds from 0 to 86400")) << r.output;
  }
  char script[] = "/tmp/protean-launch-noexec-XXXXXX";
  const int sfd = ::mkstemp(script);  // mode 0600: not executable
  ASSERT_EQ(::write(sfd, "#!/bin/sh\n", 10), 10);
  ::close(sfd);
  r = launch({"--nproc", "2", "--", script});
  EXPECT_EQ(r.status, 127) << r.output;
  EXPECT_TRUE(has(r, std::string("cannot start rank 0: ") + script + ": Permission denied")) << r.output;
  ::unlink(script);
  r = launch({"--nproc", "2", "--", "no-such-program-in-path"});
  EXPECT_EQ(r.status, 127) << r.output;
  EXPECT_TRUE(has(r, "cannot start rank 0: no-such-program-in-path: No such file or directory")) << r.output;
  char file[] = "/tmp/protean-launch-file-XXXXXX";
  ::close(::mkstemp(file));
  r = launch({"--nproc", "1", "--store", file, "--", "/bin/true"});
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(has(r, std::string("cannot create the store directory ") + file + ": Not a directory")) << r.output;
  ::unlink(file);
}

// SIGKILL cannot be caught and forwarded: the ranks die with the launcher (PR_SET_PDEATHSIG) instead of
// running on as orphans.
TEST(Launch, RanksDieWithALauncherKilledBySigkill) {
  char dir[] = "/tmp/protean-launch-pids-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string pids = std::string(dir) + "/pids";
  std::vector<pid_t> ranks;
  Result r = launch({"--nproc", "2", "--", "/bin/sh", "-c", "echo $$ >> " + pids + "; exec sleep 60"}, {},
                    [&](pid_t pid) {
                      for (int i = 0; i < 500 && ranks.size() < 2; ++i) {
                        std::this_thread::sleep_for(std::chrono::milliseconds(10));
                        ranks.clear();
                        std::ifstream in(pids);
                        for (pid_t p; in >> p;) ranks.push_back(p);
                      }
                      ::kill(pid, SIGKILL);
                    });
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.output;
  ASSERT_EQ(ranks.size(), 2u) << r.output;
  for (pid_t p : ranks) {
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {  // at most 2 s
      gone = ::kill(p, 0) != 0;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_TRUE(gone) << "rank pid " << p << " outlived the launcher";
    if (!gone) ::kill(p, SIGKILL);
  }
  std::filesystem::remove_all(dir);
}

// A store directory that already holds files of the run id (a job still running with it, or one that
// crashed) would make a rank that never started look present: refused, naming the files.
TEST(Launch, RefusesAStoreThatHoldsFilesOfItsRunId) {
  char dir[] = "/tmp/protean-launch-stale-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::ofstream(std::string(dir) + "/job7.0.join.0.1") << "PROTEAN-STORE 1 job7 0 join 0 1 2 0 cbf29ce484222325\n";
  Result r = launch({"--nproc", "2", "--store", dir, "--run-id", "job7", "--", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(has(r, "already holds 1 file of run job7 (job7.0.join.0.1)")) << r.output;
  // Another run id in the same directory is fine, and leaves the other run's file alone.
  r = launch({"--nproc", "2", "--store", dir, "--run-id", "job8", "--", "/bin/true"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(std::string(dir) + "/job7.0.join.0.1"));
  std::filesystem::remove_all(dir);
}

TEST(Launch, ProgramOptionsNeedNoDoubleDash) {
  Result r = launch({"--nproc", "1", "/bin/sh", "-c", "echo args $0 $1", "x", "--y"});
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(has(r, "[rank 0] args x --y")) << r.output;
}

#ifdef PROTEAN_DDP_EXAMPLE
// examples/ddp_char_gpt's flags: a value that is not a whole integer in range, or an unknown mode, is
// a usage error naming the flag (exit 2) before any rank work; "--steps abc" used to abort the rank
// (an uncaught std::invalid_argument), "--steps 5x" ran 5 steps and "--batch 0" printed a NaN loss.
TEST(Launch, DataParallelExampleRejectsBadFlagsWithUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--steps", "abc"}, "--steps takes an integer, got 'abc'"},
      {{"--steps", "5x"}, "--steps takes an integer, got '5x'"},
      {{"--steps", "0"}, "--steps must be from 1 to 1000000, got 0"},
      {{"--steps", "99999999999999999999"}, "--steps takes an integer"},
      {{"--batch", "0"}, "--batch must be from 1 to 1048576, got 0"},
      {{"--warmup", "-1"}, "--warmup must be from 0"},
      {{"--d", "6"}, "--d must be a multiple of the 4 attention heads, got 6"},
      {{"--lengths", "foo"}, "--lengths must be per-rank or same, not foo"},
      {{"--steps"}, "--steps needs a value"},
      {{"--bogus"}, "unknown argument --bogus"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"--nproc", "1", "--", PROTEAN_DDP_EXAMPLE};
    args.insert(args.end(), flags.begin(), flags.end());
    Result r = launch(args);
    EXPECT_EQ(r.status, 2) << flags[0] << ": " << r.output;
    EXPECT_TRUE(has(r, "[rank 0] ddp_char_gpt: " + message)) << r.output;
    EXPECT_FALSE(has(r, "signal")) << r.output;
  }
}
#endif
