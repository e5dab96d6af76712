#include "observe/env.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "observe/log.h"

namespace protean::observe {

namespace {

// Warns once per "name=value" (knobs may be read on every call).
void warn_once(const char* name, const char* value, const std::string& msg) {
  static std::mutex& mu = *new std::mutex;  // never destroyed: knobs may be read at exit
  static auto& warned = *new std::set<std::string>;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.insert(fmt::format("{}={}", name, value)).second) return;
  }
  warn(msg);
}

}  // namespace

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
  warn_once(name, e, fmt::format("{}='{}' is not an integer in [{}, {}]; using {}", name, e, lo, hi, fallback));
  return fallback;
}

bool env_switch(const char* name, bool fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  std::string v(e);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  warn_once(name, e, fmt::format("{}='{}' is not a switch (0/1, true/false, on/off, yes/no); using {}", name, e,
                                 fallback ? 1 : 0));
  return fallback;
}

int env_choice(const char* name, std::initializer_list<int> allowed, int fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  std::string list;
  for (int a : allowed) {
    if (std::to_string(a) == e) return a;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  warn_once(name, e, fmt::format("{}='{}' is not one of {}; using {}", name, e, list, fallback));
  return fallback;
}

bool env_on(const char* name) { return env_switch(name, true); }

bool env_opt_in(const char* name) { return env_switch(name, false); }

}  // namespace protean::observe
