#include "observe/env.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "observe/log.h"

namespace protean::observe {

int64_t env_int(const char* name, int64_t fallback, int64_t lo, int64_t hi) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  const char* p = e;
  while (*p == ' ' || *p == '\t') ++p;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(p, &end, 10);
  const bool number = end != p && errno == 0;
  while (number && (*end == ' ' || *end == '\t')) ++end;
  if (number && *end == '\0' && v >= lo && v <= hi) return static_cast<int64_t>(v);
  static std::mutex& mu = *new std::mutex;  // never destroyed: knobs may be read at exit
  static auto& warned = *new std::set<std::string>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(fmt::format("{}={}", name, e)).second) return fallback;
  }
  warn(fmt::format("{}='{}' is not an integer in [{}, {}]; using {}", name, e, lo, hi, fallback));
  return fallback;
}

bool env_on(const char* name) {
  const char* v = std::getenv(name);
  return !(v && std::string_view(v) == "0");
}

bool env_opt_in(const char* name) {
  const char* v = std::getenv(name);
  return v && std::string_view(v) == "1";
}

}  // namespace protean::observe
