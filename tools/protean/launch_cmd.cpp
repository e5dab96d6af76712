// `protean launch` (tools/protean/launch_cmd.h).
#include "protean/launch_cmd.h"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <dirent.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>

extern char** environ;

namespace protean::tools {

namespace {

const char* kHelp = R"(
Usage: protean launch --nproc N [--store DIR] [--run-id ID] [--grace S] [--no-prefix] [--] PROGRAM ARGS...

Starts N ranks of PROGRAM on this host, as torchrun does, for jobs without MPI. Every rank gets the
launcher's environment plus
  PROTEAN_RANK, PROTEAN_WORLD_SIZE              its rank and the number of ranks (N)
  PROTEAN_LOCAL_RANK, PROTEAN_LOCAL_WORLD_SIZE  the same on this host (the CUDA device to use)
  PROTEAN_STORE                                 the store directory the ranks meet in
  PROTEAN_RUN_ID                                this run (files of other runs are ignored)
and calls protean::distributed::init_from_env() to join the others. When a rank fails the others
get SIGTERM, then SIGKILL after --grace seconds; the launcher exits with the failing rank's status.

Example:
  protean launch --nproc 2 -- ./build/example_ddp_char_gpt --backend cuda)";

constexpr int kMaxRanks = 4096;       // each rank costs the launcher two pipes and a process
constexpr double kMaxGraceS = 86400;  // a day; keeps the deadline arithmetic finite

volatile sig_atomic_t g_signal = 0;
int g_wake_fd = -1;  // the write end of the self-pipe the signal handler pokes

void on_signal(int sig) {
  g_signal = sig;
  if (g_wake_fd >= 0) {
    const int saved = errno;
    const char c = 1;
    [[maybe_unused]] ssize_t n = ::write(g_wake_fd, &c, 1);
    errno = saved;
  }
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;  // a closed terminal or pipe: the output is lost, the job goes on
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string signal_text(int sig) {
  const char* d = ::strsignal(sig);
  const char* abbrev = ::sigabbrev_np(sig);
  return fmt::format("signal {} ({}{}{})", sig, abbrev ? "SIG" : "", abbrev ? abbrev : "", d ? fmt::format(", {}", d) : "");
}

std::string status_text(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by {}", signal_text(WTERMSIG(status)));
  return fmt::format("ended with wait status {}", status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<uint64_t> u;
  return fmt::format("{:016x}", u(rd) ^ (static_cast<uint64_t>(::getpid()) << 32));
}

// One output stream of one rank, copied line by line with the rank's prefix.
struct Stream {
  int fd = -1;      // our read end; -1 once at EOF
  int target = 1;   // 1 or 2
  std::string buf;  // bytes after the last newline
};

struct Child {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

void emit_lines(Stream& s, const std::string& prefix, bool flush_all) {
  size_t start = 0;
  for (;;) {
    size_t nl = s.buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = prefix + s.buf.substr(start, nl + 1 - start);
    write_all(s.target, line.data(), line.size());
    start = nl + 1;
  }
  s.buf.erase(0, start);
  // A line longer than 64 KiB, or the rest at EOF, goes out as it is.
  if (!s.buf.empty() && (flush_all || s.buf.size() > (64u << 10))) {
    std::string line = prefix + s.buf + (flush_all ? "\n" : "");
    write_all(s.target, line.data(), line.size());
    s.buf.clear();
  }
}

// Reads what is available; closes the stream at EOF or on an error.
void pump(Stream& s, const std::string& prefix) {
  char chunk[1 << 15];
  for (;;) {
    ssize_t n = ::read(s.fd, chunk, sizeof chunk);
    if (n > 0) {
      s.buf.append(chunk, static_cast<size_t>(n));
      emit_lines(s, prefix, false);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    ::close(s.fd);
    s.fd = -1;
    emit_lines(s, prefix, true);
    return;
  }
}

void signal_group(const Child& c, int sig) {
  if (c.running) ::kill(-c.pid, sig);  // the rank's process group: it and what it started
}

// The path execve gets for PROGRAM: as given when it has a '/', else the first executable regular
// file of that name in PATH (execvp's search, done before fork so the child only calls execve).
// Empty with `err_no` set when there is none.
std::string resolve_program(const std::string& prog, int& err_no) {
  err_no = 0;
  if (prog.empty()) {
    err_no = ENOENT;
    return {};
  }
  if (prog.find('/') != std::string::npos) return prog;
  const char* path_env = std::getenv("PATH");
  const std::string path = path_env && *path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  err_no = ENOENT;
  size_t start = 0;
  for (;;) {
    const size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    const std::string cand = dir + "/" + prog;
    struct stat st{};
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      if (::access(cand.c_str(), X_OK) == 0) {
        err_no = 0;
        return cand;
      }
      err_no = EACCES;
    }
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return {};
}

// Starts one rank: a process group of its own, the default dispositions of the signals the launcher
// handles, an empty signal mask, stdin from /dev/null, stdout / stderr onto `out_w` / `err_w` (-1:
// the launcher's), and SIGKILL when the launcher dies (PR_SET_PDEATHSIG), so a launcher killed by a
// signal it cannot forward (SIGKILL) leaves no rank running as an orphan. Only async-signal-safe
// calls between fork and execve. Returns 0 with `pid` set, or the errno of the fork or the exec.
int spawn_rank(const std::string& path, char** argv, char** envp, int out_w, int err_w, pid_t& pid) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return errno;
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigset_t empty;
  sigemptyset(&empty);
  const pid_t launcher = ::getpid();
  pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    return e;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    int e = 0;
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0 && null_fd != 0) {
      ::dup2(null_fd, 0);
      ::close(null_fd);
    }
    for (auto [from, to] : {std::pair{out_w, 1}, std::pair{err_w, 2}}) {
      if (from < 0) continue;
      if (from == to)
        ::fcntl(to, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
      else if (::dup2(from, to) < 0)
        e = errno;
    }
    if (e == 0 && ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) e = errno;
    if (e == 0 && ::getppid() != launcher) ::_exit(127);  // the launcher died before the prctl
    if (e == 0) {
      ::execve(path.c_str(), argv, envp);
      e = errno;
    }
    [[maybe_unused]] ssize_t n = ::write(report[1], &e, sizeof e);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so that signalling the group never races the child's setpgid
  ::close(report[1]);
  int e = 0;
  ssize_t n;
  do n = ::read(report[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n == static_cast<ssize_t>(sizeof e) && e != 0) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    pid = -1;
    return e;
  }
  return 0;  // the pipe closed on exec: the program runs
}

// Files of run `run` in the store directory `dir` (a job with this run id is running there, or one
// crashed): their names, at most `limit`, and their count.
std::vector<std::string> files_of_run(const std::string& dir, const std::string& run, size_t& count) {
  std::vector<std::string> names;
  count = 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return names;
  const std::string prefix = run + ".", tmp_prefix = "." + run + ".";
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(prefix, 0) == 0 || n.rfind(tmp_prefix, 0) == 0) {
      if (names.size() < 3) names.push_back(n);
      ++count;
    }
  }
  ::closedir(d);
  return names;
}

}  // namespace

int split_launch_argv(int argc, char** argv, LaunchArgs& args) {
  if (argc < 2 || std::string(argv[1]) != "launch") return argc;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      args.command.assign(argv + i + 1, argv + argc);
      return i;
    }
    if (a.empty() || a[0] != '-') return argc;  // PROGRAM: the rest is its command line
    if (a.find('=') == std::string::npos &&
        (a == "--nproc" || a == "--nproc-per-node" || a == "--store" || a == "--run-id" || a == "--grace"))
      ++i;  // the option's value
  }
  return argc;
}

CLI::App* add_launch_command(CLI::App& app, LaunchArgs& args) {
  auto* sub = app.add_subcommand("launch", "start the N ranks of a distributed job on this host (without MPI)");
  sub->footer(kHelp);
  sub->add_option("--nproc,--nproc-per-node", args.nproc, "number of ranks to start")->required();
  sub->add_option("--store", args.store,
                  "the store directory the ranks meet in (default: a fresh directory under $TMPDIR, removed at the end)");
  sub->add_option("--run-id", args.run_id, "this run's id, 1 to 64 of [A-Za-z0-9_-] (default: random)");
  sub->add_option("--grace", args.grace_s, "seconds between SIGTERM and SIGKILL when stopping the ranks (default 5)");
  sub->add_flag("--no-prefix", args.no_prefix, "pass the ranks' output through without the \"[rank R] \" prefix");
  // PROGRAM and everything after it (options included) are the ranks' command line, with or without "--".
  sub->prefix_command();
  sub->callback([sub, &args] {
    if (args.command.empty()) args.command = sub->remaining();  // no "--": split_launch_argv left them here
  });
  return sub;
}

int launch_command(const LaunchArgs& args, std::ostream& err) {
  if (args.nproc < 1) {
    err << fmt::format("protean launch: --nproc must be at least 1, got {}\n", args.nproc);
    return 2;
  }
  if (args.nproc > kMaxRanks) {
    err << fmt::format("protean launch: --nproc {} is more ranks than one host runs (at most {})\n", args.nproc,
                       kMaxRanks);
    return 2;
  }
  if (args.command.empty()) {
    err << "protean launch: no program to start; usage: protean launch --nproc N -- PROGRAM ARGS...\n";
    return 2;
  }
  if (!(args.grace_s >= 0) || !std::isfinite(args.grace_s) || args.grace_s > kMaxGraceS) {
    err << fmt::format("protean launch: --grace must be a number of seconds from 0 to {}, got {}\n", kMaxGraceS,
                       args.grace_s);
    return 2;
  }
  std::string run_id = args.run_id.empty() ? random_run_id() : args.run_id;
  if (run_id.size() > 64 || run_id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") !=
                                std::string::npos) {
    err << fmt::format("protean launch: --run-id '{}' must be 1 to 64 of [A-Za-z0-9_-]\n", run_id);
    return 2;
  }

  // The store directory.
  std::string store = args.store;
  bool made_store = false;
  if (store.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = fmt::format("{}/protean-launch-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!::mkdtemp(templ.data())) {
      err << fmt::format("protean launch: cannot create a store directory {}: {}\n", templ, std::strerror(errno));
      return 1;
    }
    store = templ;
    made_store = true;
  } else {
    std::error_code ec;
    std::filesystem::create_directories(store, ec);
    if (ec) {
      err << fmt::format("protean launch: cannot create the store directory {}: {}\n", store, ec.message());
      return 1;
    }
  }
  store = std::filesystem::absolute(store).string();
  if (!made_store) {
    // Files of this run id already in the directory would be read as this job's (a crashed job's
    // rendezvous file makes a rank that never started look present): refuse them.
    size_t count = 0;
    const std::vector<std::string> stale = files_of_run(store, run_id, count);
    if (count > 0) {
      err << fmt::format(
          "protean launch: the store directory {} already holds {} file{} of run {} ({}{}): another job with this run "
          "id is running there, or one that ended badly left them. Give another --run-id (or none, for a fresh one), "
          "or remove those files\n",
          store, count, count == 1 ? "" : "s", run_id, fmt::join(stale, ", "), count > stale.size() ? ", ..." : "");
      return 2;
    }
  }

  // Signals: recorded by the handler, forwarded by the loop below. SIGPIPE is ignored here (a closed
  // output must not kill the launcher and orphan the ranks); the children get default dispositions.
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    err << fmt::format("protean launch: pipe: {}\n", std::strerror(errno));
    return 1;
  }
  g_signal = 0;
  g_wake_fd = wake[1];
  struct sigaction sa{}, old_int{}, old_term{}, old_hup{}, old_pipe{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int);
  ::sigaction(SIGTERM, &sa, &old_term);
  ::sigaction(SIGHUP, &sa, &old_hup);
  struct sigaction ign{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_pipe);

  // The children's environment: ours, minus the variables we set.
  const std::vector<std::string> ours = {"PROTEAN_RANK=",       "PROTEAN_WORLD_SIZE=", "PROTEAN_LOCAL_RANK=",
                                         "PROTEAN_LOCAL_WORLD_SIZE=", "PROTEAN_STORE=", "PROTEAN_RUN_ID="};
  std::vector<std::string> base_env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    bool replaced = false;
    for (const std::string& o : ours) replaced |= kv.rfind(o, 0) == 0;
    if (!replaced) base_env.push_back(std::move(kv));
  }

  std::vector<Child> kids(static_cast<size_t>(args.nproc));
  int exit_code = 0;
  std::string failure;  // the first failure, for the final message
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  auto begin_stop = [&](int sig) {
    for (const Child& c : kids) {
      signal_group(c, sig);
      signal_group(c, SIGCONT);  // a stopped rank (SIGSTOP, a debugger's SIGTSTP) acts on it now, not at SIGKILL
    }
    if (stop_deadline == std::chrono::steady_clock::time_point::max())
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(args.grace_s));
  };

  int resolve_errno = 0;
  const std::string program = resolve_program(args.command[0], resolve_errno);
  for (int r = 0; r < args.nproc; ++r) {
    Child& c = kids[static_cast<size_t>(r)];
    c.rank = r;
    std::vector<std::string> env = base_env;
    env.push_back(fmt::format("PROTEAN_RANK={}", r));
    env.push_back(fmt::format("PROTEAN_WORLD_SIZE={}", args.nproc));
    env.push_back(fmt::format("PROTEAN_LOCAL_RANK={}", r));
    env.push_back(fmt::format("PROTEAN_LOCAL_WORLD_SIZE={}", args.nproc));
    env.push_back(fmt::format("PROTEAN_STORE={}", store));
    env.push_back(fmt::format("PROTEAN_RUN_ID={}", run_id));
    std::vector<char*> envp;
    for (std::string& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_s = args.command;
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);

    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (!args.no_prefix) {
      if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
        err << fmt::format("protean launch: cannot start rank {}: pipe: {}\n", r, std::strerror(errno));
        for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]})
          if (fd >= 0) ::close(fd);
        exit_code = 1;
        break;
      }
    }
    int rc = resolve_errno;
    if (rc == 0) rc = spawn_rank(program, argv.data(), envp.data(), out_pipe[1], err_pipe[1], c.pid);
    if (!args.no_prefix) {
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
    }
    if (rc != 0) {
      if (!args.no_prefix) {
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
      }
      err << fmt::format("protean launch: cannot start rank {}: {}: {}\n", r, args.command[0], std::strerror(rc));
      exit_code = 127;
      break;
    }
    c.running = true;
    if (!args.no_prefix) {
      c.out = {out_pipe[0], 1, {}};
      c.err = {err_pipe[0], 2, {}};
      ::fcntl(c.out.fd, F_SETFL, O_NONBLOCK);
      ::fcntl(c.err.fd, F_SETFL, O_NONBLOCK);
    }
  }
  if (exit_code != 0) begin_stop(SIGTERM);  // a rank did not start: stop the ones that did

  int forwarded = 0;  // the last signal the launcher got
  for (;;) {
    bool any_running = false;
    for (const Child& c : kids) any_running |= c.running;
    if (!any_running) break;

    std::vector<pollfd> fds;
    fds.push_back({wake[0], POLLIN, 0});
    for (Child& c : kids)
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 20);

    char drain[64];
    while (::read(wake[0], drain, sizeof drain) > 0) {
    }
    if (g_signal != 0) {
      const int sig = g_signal;
      g_signal = 0;
      forwarded = sig;
      err << fmt::format("protean launch: got {}; forwarding it to the ranks\n", signal_text(sig)) << std::flush;
      begin_stop(sig);
    }
    for (Child& c : kids) {
      const std::string prefix = fmt::format("[rank {}] ", c.rank);
      for (Stream* s : {&c.out, &c.err})
        if (s->fd >= 0) pump(*s, prefix);
    }
    for (Child& c : kids) {
      if (!c.running) continue;
      int status = 0;
      pid_t p = ::waitpid(c.pid, &status, WNOHANG);
      if (p != c.pid) continue;
      c.running = false;
      c.status = status;
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && failure.empty() && forwarded == 0 && stop_deadline == std::chrono::steady_clock::time_point::max()) {
        failure = fmt::format("rank {} (pid {}) {}", c.rank, c.pid, status_text(status));
        exit_code = exit_code_of(status);
        err << fmt::format("protean launch: {}; stopping the other ranks (SIGTERM, SIGKILL after {} s)\n", failure,
                           args.grace_s)
            << std::flush;
        begin_stop(SIGTERM);
      }
    }
    if (!killed && std::chrono::steady_clock::now() >= stop_deadline) {
      killed = true;
      for (const Child& c : kids)
        if (c.running) {
          err << fmt::format("protean launch: rank {} (pid {}) still running after {} s; sending SIGKILL\n", c.rank,
                             c.pid, args.grace_s)
              << std::flush;
          signal_group(c, SIGKILL);
        }
    }
  }
  // What the ranks wrote last (a grandchild that keeps a pipe open does not hold us up).
  for (Child& c : kids) {
    const std::string prefix = fmt::format("[rank {}] ", c.rank);
    for (Stream* s : {&c.out, &c.err})
      if (s->fd >= 0) {
        pump(*s, prefix);
        if (s->fd >= 0) {
          ::close(s->fd);
          s->fd = -1;
          emit_lines(*s, prefix, true);
        }
      }
  }

  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  ::sigaction(SIGHUP, &old_hup, nullptr);
  ::sigaction(SIGPIPE, &old_pipe, nullptr);
  g_wake_fd = -1;
  ::close(wake[0]);
  ::close(wake[1]);
  if (made_store) {
    std::error_code ec;
    std::filesystem::remove_all(store, ec);
  }

  if (forwarded != 0) {
    err << fmt::format("protean launch: stopped by {}\n", signal_text(forwarded));
    return 128 + forwarded;
  }
  if (!failure.empty()) {
    err << fmt::format("protean launch: failed: {}\n", failure);
    return exit_code == 0 ? 1 : exit_code;
  }
  return exit_code;
}

}  // namespace protean::tools
