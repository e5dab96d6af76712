#include "cache/kernel_cache.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unordered_map>

#include "observe/counter.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::cache {

namespace fs = std::filesystem;

namespace {
/// KernelCacheStats' counters; reset_kernel_cache_stats() assigns {} (every counter to 0).
struct Counters {
  observe::Counter memory_hits, disk_hits, misses, corrupt, build_errors;
  observe::Counter build_us, load_us;
};
Counters& counters() {
  static Counters c;
  return c;
}
struct Memory {
  std::mutex mu;  // guards the map and serializes builds in this process
  std::unordered_map<uint64_t, std::shared_ptr<const Library>> libs;
  std::set<uint64_t> warned;
};
Memory& memory() {
  static Memory m;
  return m;
}
int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool read_bytes(const std::string& path, std::string& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return true;
}
void write_atomic(const std::string& path, const std::string& data, const std::string& tmp_dir) {
  std::string tmp = fmt::format("{}/{}.tmp", tmp_dir, fs::path(path).filename().string());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) throw RuntimeError(fmt::format("artifact cache: cannot write {}", tmp));
  }
  fs::rename(tmp, path);
}
std::string make_private_dir(const std::string& parent) {
  fs::create_directories(parent);
  std::string templ = parent + "/build-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw RuntimeError(fmt::format("artifact cache: cannot create a temp dir in {}", parent));
  return std::string(buf.data());
}

/// dlopen's a private copy of verified library bytes (then unlinks it): the mapping can never change
/// under us, whatever happens to the cache file later (rewritten, truncated, cleared), and every load
/// gets its own handle (glibc would otherwise hand back an earlier handle loaded from the same path).
void* dlopen_private(const std::string& bytes, uint64_t key, std::string& error) {
  std::string dir = cache_dir() + "/tmp";
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string templ = fmt::format("{}/load-{}-XXXXXX", dir, key_hex(key));
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  int fd = mkstemp(buf.data());
  if (fd < 0) {
    error = "cannot create a private copy in " + dir;
    return nullptr;
  }
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t w = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  ::close(fd);
  void* h = off == bytes.size() ? dlopen(buf.data(), RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!h) error = off == bytes.size() ? std::string(dlerror()) : std::string("short write");
  ::unlink(buf.data());
  return h;
}

/// A `cache` trace event (docs/trace-format.md), tagged with the compile that asked, if any.
void trace_cache(const char* tier, uint64_t key, const char* result, const std::string& detail = {}) {
  if (!observe::trace_enabled()) return;
  nlohmann::json j = {{"tier", tier}, {"key", key_hex(key)}, {"result", result}};
  if (!observe::trace_compile_id().empty()) j["compile_id"] = observe::trace_compile_id();
  if (!detail.empty()) j["detail"] = detail;
  if (std::string_view r = result; r == "hit" || r == "miss" || r == "corrupt")
    observe::note_compile_cache(observe::trace_compile_id(), tier, result);
  observe::trace_event("cache", std::move(j));
}

void report_corrupt(uint64_t key, const std::string& why) {
  counters().corrupt++;
  trace_cache("disk", key, "corrupt", why + "; rebuilding");
  auto& m = memory();
  if (m.warned.insert(key).second)
    observe::warn(fmt::format("artifact cache: corrupt entry {} in {} ({}); recompiling", key_hex(key),
                              kernels_dir(), why));
}

/// Verifies and loads a disk entry; nullptr when absent or corrupt (corruption is reported).
std::shared_ptr<const Library> load_from_disk(uint64_t key) {
  std::string base = kernels_dir() + "/" + key_hex(key);
  std::string so = base + ".so", js = base + ".json";
  std::error_code ec;
  bool have_so = fs::exists(so, ec), have_js = fs::exists(js, ec);
  // The .so is renamed into place last, so an entry without it is absent (or still being written).
  if (!have_so) return nullptr;
  if (!fs::is_regular_file(so, ec)) {
    report_corrupt(key, so + " is not a regular file");
    return nullptr;
  }
  int64_t t0 = now_us();
  auto fail = [&](const std::string& why) -> std::shared_ptr<const Library> {
    report_corrupt(key, why);
    return nullptr;
  };
  if (!have_js) return fail("the .json is missing");
  std::string meta_text, bytes;
  if (!read_bytes(js, meta_text) || !read_bytes(so, bytes)) return fail("unreadable");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(meta_text);
  } catch (const std::exception&) {
    return fail("the .json does not parse");
  }
  if (!meta.is_object() || !meta.contains("so_xxh64") || !meta["so_xxh64"].is_string()) return fail("the .json has no checksum");
  std::string sum = key_hex(XXH64(bytes.data(), bytes.size(), 0));
  if (meta["so_xxh64"].get<std::string>() != sum) return fail("checksum mismatch");
  std::string err;
  void* h = dlopen_private(bytes, key, err);
  if (!h) return fail(fmt::format("dlopen: {}", err));
  auto lib = std::make_shared<Library>();
  lib->handle = h;
  lib->path = so;
  lib->from_disk = true;
  counters().load_us += now_us() - t0;
  return lib;
}
}  // namespace

void* Library::symbol(const char* name) const { return handle ? dlsym(handle, name) : nullptr; }

KernelCacheStats kernel_cache_stats() {
  auto& c = counters();
  KernelCacheStats s;
  s.memory_hits = c.memory_hits;
  s.disk_hits = c.disk_hits;
  s.misses = c.misses;
  s.corrupt_entries = c.corrupt;
  s.build_errors = c.build_errors;
  s.build_seconds = static_cast<double>(c.build_us.load()) / 1e6;
  s.load_seconds = static_cast<double>(c.load_us.load()) / 1e6;
  return s;
}

void reset_kernel_cache_stats() { counters() = {}; }

std::string kernel_cache_stats_json() {
  KernelCacheStats s = kernel_cache_stats();
  nlohmann::json j = {{"memory_hits", s.memory_hits}, {"disk_hits", s.disk_hits},
                      {"misses", s.misses},           {"corrupt_entries", s.corrupt_entries},
                      {"build_errors", s.build_errors}, {"build_seconds", s.build_seconds},
                      {"load_seconds", s.load_seconds}};
  return j.dump();
}

std::string cache_dir() {
  if (const char* d = std::getenv("PROTEAN_CACHE_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/protean";
}

std::string kernels_dir() {
  std::string d = cache_dir() + "/kernels";
  std::error_code ec;
  fs::create_directories(d, ec);
  return d;
}

std::string key_hex(uint64_t key) { return fmt::format("{:016x}", key); }

void clear_memory_cache() {
  auto& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  m.libs.clear();
  m.warned.clear();
}

std::shared_ptr<const Library> find_cached(uint64_t key) {
  auto& m = memory();
  std::unique_lock<std::mutex> lock(m.mu, std::try_to_lock);
  if (!lock.owns_lock()) return nullptr;  // a build is running: answer "not cached" rather than wait
  if (auto it = m.libs.find(key); it != m.libs.end()) {
    counters().memory_hits++;
    return it->second;
  }
  if (auto lib = load_from_disk(key)) {
    counters().disk_hits++;
    m.libs[key] = lib;
    return lib;
  }
  return nullptr;
}

std::shared_ptr<const Library> get_or_build(uint64_t key, const std::string& source, const BuildFn& build) {
  auto& m = memory();
  std::lock_guard<std::mutex> lock(m.mu);
  if (auto it = m.libs.find(key); it != m.libs.end()) {
    counters().memory_hits++;
    trace_cache("memory", key, "hit");
    return it->second;
  }
  trace_cache("memory", key, "miss");
  if (auto lib = load_from_disk(key)) {
    counters().disk_hits++;
    trace_cache("disk", key, "hit");
    m.libs[key] = lib;
    return lib;
  }
  counters().misses++;
  trace_cache("disk", key, "miss");
  int64_t t0 = now_us();
  const std::string kdir = kernels_dir();
  std::string work = make_private_dir(cache_dir() + "/tmp");
  std::string so_tmp = work + "/kernel.so";
  try {
    build(source, work, so_tmp);
  } catch (...) {
    counters().build_errors++;
    counters().build_us += now_us() - t0;
    throw;  // the work dir stays for inspection
  }
  std::string bytes;
  if (!read_bytes(so_tmp, bytes)) throw CompileError(fmt::format("cpu: the compiler produced no library in {}", work));
  std::string base = kdir + "/" + key_hex(key);
  nlohmann::json meta = {{"key", key_hex(key)},
                         {"so_xxh64", key_hex(XXH64(bytes.data(), bytes.size(), 0))},
                         {"so_bytes", bytes.size()},
                         {"protean_version", version()},
                         {"created_unix", std::chrono::duration_cast<std::chrono::seconds>(
                                              std::chrono::system_clock::now().time_since_epoch()).count()}};
  // Storing is best effort: an entry that cannot be written (a directory in the way, a read-only or
  // full disk) costs a warning and a rebuild next time, never the run. The library is then used
  // from its build dir, which stays.
  std::string lib_path = base + ".so";
  std::string target;
  try {
    target = base + ".cpp";
    write_atomic(target, source, work);
    target = base + ".json";
    write_atomic(target, meta.dump(2), work);
    target = base + ".so";
    fs::rename(so_tmp, target);  // the commit point
    std::error_code ec;
    fs::remove_all(work, ec);
  } catch (const std::exception& e) {
    lib_path = so_tmp;
    observe::warn(fmt::format("artifact cache: cannot store {} ({}); using the library uncached from {}", target,
                              e.what(), so_tmp));
    trace_cache("disk", key, "store_failed", fmt::format("{}: {}", target, e.what()));
  }
  std::string err;
  void* h = dlopen_private(bytes, key, err);
  if (!h) throw CompileError(fmt::format("cpu: dlopen of the freshly built {}.so failed: {}", base, err));
  auto lib = std::make_shared<Library>();
  lib->handle = h;
  lib->path = lib_path;
  counters().build_us += now_us() - t0;
  if (lib_path != so_tmp) trace_cache("disk", key, "store");
  m.libs[key] = lib;
  return lib;
}

DiskUsage disk_usage() {
  DiskUsage u;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kernels_dir(), ec)) {
    if (!e.is_regular_file(ec)) continue;
    u.bytes += static_cast<int64_t>(e.file_size(ec));
    if (e.path().extension() == ".so") ++u.entries;
  }
  return u;
}

int64_t clear_disk_cache() {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kernels_dir(), ec)) {
    if (e.path().extension() == ".so") ++n;
    fs::remove_all(e.path(), ec);
  }
  fs::remove_all(cache_dir() + "/tmp", ec);
  clear_memory_cache();
  return n;
}

}  // namespace protean::cache
