// Test fixtures shared by the unit suites: an environment variable set for a scope, and a
// redis-server of the test's own on a free loopback port (the PGO and artifact-cache remote tiers are
// tested against a real server, killed mid-run where a test says so).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace protean::testing {

/// Sets (or, with a null value, unsets) an environment variable for a scope and restores the
/// previous value at its end.
class EnvScope {
 public:
  EnvScope(const char* name, const char* value) : name_(name) {
    if (const char* p = std::getenv(name)) prev_ = p;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  EnvScope(const char* name, const std::string& value) : EnvScope(name, value.c_str()) {}
  ~EnvScope() {
    if (prev_) setenv(name_, prev_->c_str(), 1);
    else unsetenv(name_);
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  const char* name_;
  std::optional<std::string> prev_;
};

/// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's choice for port 0).
inline int free_loopback_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

/// A connected socket to 127.0.0.1:port, or -1.
inline int connect_loopback(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

inline bool have_redis_server() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

/// A redis-server of the test's own (no persistence, data in `dir`) on a free loopback port; the
/// constructor waits up to 5 s for it to accept connections. kill() (or the destructor) SIGKILLs it.
struct RedisServer {
  pid_t pid = -1;
  int port = 0;
  std::string prefix;  ///< the key prefix url() names

  RedisServer(const std::string& dir, std::string key_prefix) : prefix(std::move(key_prefix)) {
    port = free_loopback_port();
    pid = ::fork();
    if (pid == 0) {
      std::string p = std::to_string(port);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--daemonize", "no", "--dir", dir.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 100; ++i) {
      int s = connect_loopback(port);
      if (s >= 0) {
        ::close(s);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~RedisServer() { kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  /// redis://127.0.0.1:PORT/PREFIX, as PROTEAN_PGO_REMOTE and PROTEAN_CACHE_REMOTE take it.
  std::string url() const { return fmt::format("redis://127.0.0.1:{}/{}", port, prefix); }
};

}  // namespace protean::testing
