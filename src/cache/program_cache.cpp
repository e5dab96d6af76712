#include "cache/program_cache.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <thread>

#include "cache/kernel_cache.h"
#include "cache/remote.h"
#include "core/files.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::cache {

namespace fs = std::filesystem;

namespace {
constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxPlanBytes = uint64_t{1} << 34;

struct State {
  std::mutex mu;
  std::set<uint64_t> reported;
  ProgramCacheStats stats;
  bool warned_unwritable = false;
};
State& st() {
  static auto* s = new State;
  return *s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string text_hash(const std::string& s) { return key_hex(XXH64(s.data(), s.size(), 0)); }

/// Checks the .json text of an entry; "" and `size`/`sum` set when it names `key`, this format and
/// version (and, `key_text` not null, the hash of *key_text), else the reason.
std::string check_meta(const std::string& text, uint64_t key, const std::string* key_text, uint64_t& size,
                       std::string& sum) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return "unparsable .json";
  auto str = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!j.contains("format") || !j["format"].is_number_integer() || j["format"].get<int64_t>() != kProgramCacheFormat)
    return fmt::format("another entry format (this Protean writes format {})", kProgramCacheFormat);
  if (str("protean_version") != version())
    return fmt::format("written by Protean '{}', this is {}", str("protean_version"), version());
  if (str("key") != key_hex(key)) return "the .json names another key";
  if (key_text && str("key_text_xxh64") != text_hash(*key_text)) return "the .json names another graph";
  if (!j.contains("size") || !j["size"].is_number_unsigned() || str("xxh64").size() != 16)
    return "the .json records no size or checksum";
  size = j["size"].get<uint64_t>();
  if (size > kMaxPlanBytes) return fmt::format("the .json records {} bytes", size);
  sum = str("xxh64");
  return "";
}

void write_atomic(const std::string& path, const std::string& data) {
  core::write_file_atomic(path, data, "program cache");
}

/// Reads and checks the entry of `key`: "" and `plan` filled, or the reason. `absent` is set when
/// the .plan does not exist (a plain miss, not a corrupt entry).
std::string read_checked(uint64_t key, const std::string* key_text, std::string& meta, std::string& plan, bool& absent) {
  const std::string base = programs_dir() + "/" + key_hex(key);
  std::error_code ec;
  // The .plan is renamed in last (store_program's commit point): metadata without it is an entry a
  // writer has not committed yet (another process between its two renames, or one killed there), a
  // miss that the next store completes, not a corrupt entry.
  absent = !fs::exists(fs::symlink_status(base + ".plan", ec));
  if (absent) return "no entry";
  try {
    meta = core::read_regular_file(base + ".json", "program cache metadata", kMaxMetaBytes);
    uint64_t size = 0;
    std::string sum;
    if (std::string why = check_meta(meta, key, key_text, size, sum); !why.empty()) return why;
    uint64_t actual = 0;
    int fd = core::open_regular_file(base + ".plan", "program cache plan", &actual);
    ::close(fd);
    if (actual != size) return fmt::format("the .plan has {} bytes, the .json records {}", actual, size);
    plan = core::read_regular_file(base + ".plan", "program cache plan", size);
    if (plan.size() != size) return fmt::format("the .plan has {} bytes, the .json records {}", plan.size(), size);
    if (text_hash(plan) != sum) return "checksum mismatch";
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void report_locked(State& s, uint64_t key, const std::string& why) {
  ++s.stats.corrupt_entries;
  if (!s.reported.insert(key).second) return;
  observe::warn(fmt::format("program cache: corrupt entry {} in {} ({}); lowering again and replacing it", key_hex(key),
                            programs_dir(), why));
}
}  // namespace

bool program_cache_enabled() {
  const char* e = std::getenv("PROTEAN_PROGRAM_CACHE");
  return !(e && std::string_view(e) == "0");
}

std::string programs_dir() {
  std::string d = cache_dir() + "/programs";
  std::error_code ec;
  fs::create_directories(d, ec);
  return d;
}

ProgramCacheStats program_cache_stats() {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().stats;
}
void reset_program_cache_stats() {
  std::lock_guard<std::mutex> lock(st().mu);
  st().stats = {};
  st().reported.clear();
}
std::string program_cache_stats_json() {
  ProgramCacheStats s = program_cache_stats();
  return nlohmann::json{{"hits", s.hits},
                        {"misses", s.misses},
                        {"stores", s.stores},
                        {"remote_hits", s.remote_hits},
                        {"corrupt_entries", s.corrupt_entries},
                        {"load_seconds", s.load_seconds}}
      .dump();
}

std::optional<std::string> find_program(uint64_t key, const std::string& key_text) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string meta, plan;
  bool absent = false;
  std::string why = read_checked(key, &key_text, meta, plan, absent);
  State& s = st();
  if (why.empty()) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.load_seconds += seconds_since(t0);
    return plan;
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!absent) report_locked(s, key, why);
  }
  // The remote tier (remote.h): a verified entry of this graph is installed on disk and used.
  if (std::optional<ProgramEntry> e = remote::fetch_program(key)) {
    uint64_t size = 0;
    std::string sum;
    if (check_meta(e->meta, key, &key_text, size, sum).empty()) {
      try {
        install_program_entry(*e);
      } catch (const Error&) {
        // a disk that cannot take it: the plan is still good for this process
      }
      std::lock_guard<std::mutex> lock(s.mu);
      s.stats.load_seconds += seconds_since(t0);
      ++s.stats.remote_hits;
      return std::move(e->plan);
    }
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.stats.load_seconds += seconds_since(t0);
  ++s.stats.misses;
  return std::nullopt;
}

void note_program_hit() {
  std::lock_guard<std::mutex> lock(st().mu);
  ++st().stats.hits;
}

void report_corrupt_program(uint64_t key, const std::string& why) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stats.misses;
  report_locked(s, key, why);
}

void store_program(uint64_t key, const std::string& key_text, const std::string& plan, const std::string& describe) {
  nlohmann::json j = {{"format", kProgramCacheFormat},
                      {"protean_version", version()},
                      {"key", key_hex(key)},
                      {"key_text_xxh64", text_hash(key_text)},
                      {"size", static_cast<uint64_t>(plan.size())},
                      {"xxh64", text_hash(plan)},
                      {"describe", describe}};
  const std::string base = programs_dir() + "/" + key_hex(key);
  State& s = st();
  const std::string meta = j.dump(1);
  if (remote::enabled()) remote::publish_program(ProgramEntry{key, meta, plan});
  try {
    write_atomic(base + ".json", meta);
    write_atomic(base + ".plan", plan);  // the commit point
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.warned_unwritable) {
      s.warned_unwritable = true;
      observe::warn(fmt::format("program cache: cannot store plans in {} ({}); compiles go on without them",
                                programs_dir(), e.what()));
    }
    return;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stats.stores;
  s.reported.erase(key);
}

std::vector<uint64_t> program_keys() {
  std::vector<uint64_t> keys;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(programs_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 21 || e.path().extension() != ".plan") continue;
    uint64_t k = 0;
    auto [ptr, err] = std::from_chars(name.data(), name.data() + 16, k, 16);
    if (err == std::errc() && ptr == name.data() + 16 && key_hex(k) == name.substr(0, 16)) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string verify_program_entry(const ProgramEntry& e) {
  uint64_t size = 0;
  std::string sum;
  if (std::string why = check_meta(e.meta, e.key, nullptr, size, sum); !why.empty()) return why;
  if (size != e.plan.size()) return fmt::format("the plan has {} bytes, the .json records {}", e.plan.size(), size);
  if (text_hash(e.plan) != sum) return "checksum mismatch";
  return "";
}

std::string read_program_entry(uint64_t key, ProgramEntry& out) {
  out.key = key;
  bool absent = false;
  return read_checked(key, nullptr, out.meta, out.plan, absent);
}

bool install_program_entry(const ProgramEntry& e) {
  if (std::string why = verify_program_entry(e); !why.empty())
    throw FormatError(fmt::format("program cache: entry {} does not verify: {}", key_hex(e.key), why));
  ProgramEntry present;
  if (read_program_entry(e.key, present).empty()) return false;
  const std::string base = programs_dir() + "/" + key_hex(e.key);
  try {
    write_atomic(base + ".json", e.meta);
    write_atomic(base + ".plan", e.plan);
  } catch (const std::exception& ex) {
    throw RuntimeError(fmt::format("program cache: cannot write entry {} into {}: {}", key_hex(e.key), programs_dir(),
                                   ex.what()));
  }
  return true;
}

int64_t clear_program_cache() {
  std::string failed;  // the first entry that could not be removed, and why
  const int64_t n = core::remove_dir_entries(programs_dir(), ".plan", &failed);
  if (!failed.empty())
    throw RuntimeError(fmt::format("program cache: removed {} entries, but cannot remove {}", n, failed));
  return n;
}

}  // namespace protean::cache
