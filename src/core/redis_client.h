// The Redis client shared by the remote stores (PGO profiles, dynamic/profile_store.h; compiled
// artifacts, cache/remote.h): hiredis with one connect and command timeout, SIGPIPE blocked around
// every command (a server that closed the socket must not kill the process), binary-safe argv.
//
// Failure policy (the callers implement it): any RuntimeError from here means the store is
// unavailable; the caller warns once, turns its remote tier off for the rest of the process and
// continues with the local tier.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

struct redisContext;
struct redisReply;

namespace protean::core {

/// redis://host[:port][/prefix]; the host may be an IPv6 literal in brackets (redis://[::1]:6379/p).
struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string prefix;
};
/// Parses `url`; `what` names where it came from (an environment variable) in errors, `default_prefix`
/// is used when the URL has none. Throws ValueError for another scheme, a bad port (not 1-65535), an
/// unbracketed IPv6 address.
RedisUrl parse_redis_url(const std::string& url, std::string_view what, const std::string& default_prefix);

/// A freed-on-scope-exit reply.
struct RedisReply {
  redisReply* r = nullptr;
  explicit RedisReply(redisReply* p) : r(p) {}
  ~RedisReply();
  RedisReply(const RedisReply&) = delete;
  RedisReply& operator=(const RedisReply&) = delete;
  bool is_nil() const;
  bool is_string() const;
  std::string str() const;
  long long integer() const;
};

/// One connection. Not thread-safe (each user holds its own, under its own mutex).
class RedisClient {
 public:
  /// Connects with `timeout_ms` as connect and command timeout. Throws RuntimeError when the server
  /// cannot be reached.
  explicit RedisClient(const RedisUrl& url, int timeout_ms = 200);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  /// Runs a command given as argv (binary safe). Throws RuntimeError on a connection, timeout or
  /// protocol error and on an error reply.
  redisReply* cmd(std::initializer_list<std::string_view> args);
  /// GET: the value, or nullopt for a missing key.
  std::optional<std::string> get(std::string_view key);
  /// SET key value NX: true when this call stored it, false when the key already existed.
  bool set_nx(std::string_view key, std::string_view value);

 private:
  redisContext* c_ = nullptr;
};

}  // namespace protean::core
