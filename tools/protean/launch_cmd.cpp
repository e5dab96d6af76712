// `protean launch` (tools/protean/launch_cmd.h).
#include "protean/launch_cmd.h"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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
  if (args.command.empty()) {
    err << "protean launch: no program to start; usage: protean launch --nproc N -- PROGRAM ARGS...\n";
    return 2;
  }
  if (!(args.grace_s >= 0)) {
    err << fmt::format("protean launch: --grace must be >= 0, got {}\n", args.grace_s);
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
    for (const Child& c : kids) signal_group(c, sig);
    if (stop_deadline == std::chrono::steady_clock::time_point::max())
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double>(args.grace_s));
  };

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

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    if (!args.no_prefix) {
      if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
        err << fmt::format("protean launch: pipe: {}\n", std::strerror(errno));
        exit_code = 1;
        posix_spawn_file_actions_destroy(&fa);
        break;
      }
      posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
      posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t def, empty;
    sigemptyset(&def);
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&def, s);
    sigemptyset(&empty);
    posix_spawnattr_setsigdefault(&attr, &def);
    posix_spawnattr_setsigmask(&attr, &empty);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    const int rc = ::posix_spawnp(&c.pid, argv[0], &fa, &attr, argv.data(), envp.data());
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
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
