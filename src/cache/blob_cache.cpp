#include "cache/blob_cache.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "cache/kernel_cache.h"
#include "core/files.h"
#include "observe/log.h"

namespace protean::cache {

namespace fs = std::filesystem;

namespace {

struct State {
  std::mutex mu;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<const Blob>> memory;
  std::set<std::pair<std::string, uint64_t>> reported;
  BlobCacheStats stats;
  bool warned_unwritable = false;
};
State& st() {
  static auto* s = new State;
  return *s;
}

std::string hex64(uint64_t v) { return fmt::format("{:016x}", v); }

bool read_file(const std::string& path, std::string& out) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return static_cast<bool>(f) || f.eof();
}

void write_atomic(const std::string& path, const void* data, size_t n) {
  core::write_file_atomic(path, std::string_view(static_cast<const char*>(data), n), "artifact cache");
}

void report_corrupt(const std::string& kind, uint64_t key, const std::string& why) {
  State& s = st();
  ++s.stats.corrupt_entries;
  if (!s.reported.insert({kind, key}).second) return;
  observe::warn(fmt::format("artifact cache: corrupt {} entry {} in {} ({}); rebuilding", kind, hex64(key),
                            blob_dir(kind), why));
}

// Caller holds st().mu. nullptr when missing or corrupt (corrupt ones are reported).
std::shared_ptr<const Blob> load_disk(const std::string& kind, uint64_t key, const std::string& source) {
  const std::string base = fmt::format("{}/{}", blob_dir(kind), hex64(key));
  std::string meta_text;
  std::error_code ec;
  const bool has_meta = fs::exists(base + ".json", ec);
  const bool has_bin = fs::exists(base + ".bin", ec);
  // store_disk renames the .bin in last: metadata without it is an entry another writer has not
  // committed yet (or one killed between the two renames), a miss the next store completes.
  if (!has_bin) return nullptr;
  if (!has_meta || !read_file(base + ".json", meta_text)) {
    report_corrupt(kind, key, "missing or unreadable .json");
    return nullptr;
  }
  nlohmann::json j = nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("key") || !j.contains("size") || !j.contains("xxh64") ||
      !j["key"].is_string() || !j["size"].is_number_unsigned() || !j["xxh64"].is_string()) {
    report_corrupt(kind, key, "unparsable .json");
    return nullptr;
  }
  if (j["key"].get<std::string>() != hex64(key)) {
    report_corrupt(kind, key, "the .json names another key");
    return nullptr;
  }
  if (!source.empty() && (!j.contains("source_xxh64") || !j["source_xxh64"].is_string() ||
                          j["source_xxh64"].get<std::string>() != hex64(XXH64(source.data(), source.size(), 0)))) {
    report_corrupt(kind, key, "the .json names another source");
    return nullptr;
  }
  std::string bytes;
  if (!has_bin || !read_file(base + ".bin", bytes)) {
    report_corrupt(kind, key, "missing or unreadable .bin");
    return nullptr;
  }
  if (bytes.size() != j["size"].get<uint64_t>()) {
    report_corrupt(kind, key, fmt::format("size {} but the .json records {}", bytes.size(), j["size"].get<uint64_t>()));
    return nullptr;
  }
  if (hex64(XXH64(bytes.data(), bytes.size(), 0)) != j["xxh64"].get<std::string>()) {
    report_corrupt(kind, key, "checksum mismatch");
    return nullptr;
  }
  return std::make_shared<const Blob>(bytes.begin(), bytes.end());
}

void store_disk(const std::string& kind, uint64_t key, const std::string& source, const std::string& describe,
                const Blob& blob) {
  const std::string base = fmt::format("{}/{}", blob_dir(kind), hex64(key));
  nlohmann::json j;
  j["key"] = hex64(key);
  j["source_xxh64"] = hex64(XXH64(source.data(), source.size(), 0));
  j["size"] = static_cast<uint64_t>(blob.size());
  j["xxh64"] = hex64(XXH64(blob.data(), blob.size(), 0));
  j["describe"] = describe;
  const std::string text = j.dump(1);
  try {
    write_atomic(base + ".json", text.data(), text.size());
    write_atomic(base + ".bin", blob.data(), blob.size());
  } catch (const std::exception& e) {
    State& s = st();
    if (!s.warned_unwritable) {
      s.warned_unwritable = true;
      observe::warn(fmt::format("artifact cache: cannot store {} entries in {} ({}); they are kept in memory only", kind,
                                blob_dir(kind), e.what()));
    }
  }
}

}  // namespace

std::string blob_dir(const std::string& kind) {
  std::string d = cache_dir() + "/" + kind;
  std::error_code ec;
  fs::create_directories(d, ec);
  return d;
}

BlobCacheStats blob_cache_stats() {
  std::lock_guard<std::mutex> lock(st().mu);
  return st().stats;
}
void reset_blob_cache_stats() {
  std::lock_guard<std::mutex> lock(st().mu);
  st().stats = {};
}
void clear_blob_memory_cache() {
  std::lock_guard<std::mutex> lock(st().mu);
  st().memory.clear();
  st().reported.clear();
}

std::shared_ptr<const Blob> find_blob(const std::string& kind, uint64_t key, const std::string& source) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (auto it = s.memory.find({kind, key}); it != s.memory.end()) {
    ++s.stats.memory_hits;
    return it->second;
  }
  auto b = load_disk(kind, key, source);
  if (b) {
    ++s.stats.disk_hits;
    s.memory[{kind, key}] = b;
  }
  return b;
}

std::shared_ptr<const Blob> get_or_build_blob(const std::string& kind, uint64_t key, const std::string& source,
                                              const std::string& describe, const std::function<Blob()>& build) {
  if (auto b = find_blob(kind, key, source)) return b;
  auto blob = std::make_shared<const Blob>(build());  // outside the lock: a build may take a while
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.stats.misses;
  s.reported.erase({kind, key});
  store_disk(kind, key, source, describe, *blob);
  s.memory[{kind, key}] = blob;
  return blob;
}

}  // namespace protean::cache
