#include "core/redis_client.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <charconv>
#include <vector>

#include "protean/error.h"

namespace protean::core {

RedisUrl parse_redis_url(const std::string& url, std::string_view what, const std::string& default_prefix) {
  const std::string scheme = "redis://";
  if (url.rfind(scheme, 0) != 0)
    throw ValueError(fmt::format("{}='{}': expected redis://host:port/prefix", what, url));
  RedisUrl r;
  r.prefix = default_prefix;
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos && slash + 1 < rest.size()) r.prefix = rest.substr(slash + 1);
  std::string port_text;
  if (!hostport.empty() && hostport.front() == '[') {  // an IPv6 literal: [::1] or [::1]:6380
    size_t close = hostport.find(']');
    if (close == std::string::npos)
      throw ValueError(fmt::format("{}='{}': unclosed '[' in the IPv6 address", what, url));
    r.host = hostport.substr(1, close - 1);
    std::string tail = hostport.substr(close + 1);
    if (!tail.empty() && tail.front() != ':')
      throw ValueError(fmt::format("{}='{}': expected ':port' after the IPv6 address", what, url));
    if (!tail.empty()) port_text = tail.substr(1);
    if (r.host.empty()) throw ValueError(fmt::format("{}='{}': empty IPv6 address", what, url));
  } else if (size_t colon = hostport.rfind(':'); colon != std::string::npos) {
    r.host = hostport.substr(0, colon);
    port_text = hostport.substr(colon + 1);
    if (r.host.find(':') != std::string::npos)
      throw ValueError(fmt::format("{}='{}': write an IPv6 address in brackets (redis://[::1]:6379/prefix)", what, url));
  } else if (!hostport.empty()) {
    r.host = hostport;
  }
  if (hostport.find(':') != std::string::npos && port_text.empty() && hostport.back() == ':')
    throw ValueError(fmt::format("{}='{}': bad port ''", what, url));
  if (!port_text.empty()) {
    int port = 0;
    auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port < 1 || port > 65535)
      throw ValueError(fmt::format("{}='{}': bad port '{}' (expected 1-65535)", what, url, port_text));
    r.port = port;
  }
  if (r.host.empty()) r.host = "127.0.0.1";
  return r;
}

namespace {
// Writing to a Redis whose socket the server closed raises SIGPIPE, which would kill the process.
// Block it in this thread for the duration of a command and swallow one that became pending, without
// touching the process's signal dispositions.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        sigset_t pipe;
        sigemptyset(&pipe);
        sigaddset(&pipe, SIGPIPE);
        timespec zero{0, 0};
        sigtimedwait(&pipe, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_;
  bool was_pending_ = false;
};
}  // namespace

RedisReply::~RedisReply() {
  if (r) freeReplyObject(r);
}
bool RedisReply::is_nil() const { return r && r->type == REDIS_REPLY_NIL; }
bool RedisReply::is_string() const { return r && r->type == REDIS_REPLY_STRING; }
std::string RedisReply::str() const { return r && r->str ? std::string(r->str, r->len) : std::string(); }
long long RedisReply::integer() const { return r && r->type == REDIS_REPLY_INTEGER ? r->integer : 0; }

RedisClient::RedisClient(const RedisUrl& u, int timeout_ms) {
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  c_ = redisConnectWithTimeout(u.host.c_str(), u.port, tv);
  if (!c_) throw RuntimeError("cannot allocate a Redis context");
  if (c_->err) {
    std::string e = c_->errstr;
    redisFree(c_);
    c_ = nullptr;
    throw RuntimeError(e);
  }
  redisSetTimeout(c_, tv);
}

RedisClient::~RedisClient() {
  if (c_) redisFree(c_);
}

redisReply* RedisClient::cmd(std::initializer_list<std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  SigpipeGuard no_sigpipe;
  void* r = redisCommandArgv(c_, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (!r) throw RuntimeError(c_->errstr[0] ? c_->errstr : "no reply");
  auto* rep = static_cast<redisReply*>(r);
  if (rep->type == REDIS_REPLY_ERROR) {
    std::string e(rep->str, rep->len);
    freeReplyObject(rep);
    throw RuntimeError(e);
  }
  return rep;
}

std::optional<std::string> RedisClient::get(std::string_view key) {
  RedisReply r(cmd({"GET", key}));
  if (r.is_nil()) return std::nullopt;
  if (!r.is_string()) throw RuntimeError("GET: unexpected reply type");
  return r.str();
}

bool RedisClient::set_nx(std::string_view key, std::string_view value) {
  RedisReply r(cmd({"SET", key, value, "NX"}));
  return !r.is_nil();  // "OK" when stored, nil when the key existed
}

}  // namespace protean::core
