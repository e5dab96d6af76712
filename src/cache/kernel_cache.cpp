#include "cache/kernel_cache.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/remote.h"
#include "core/files.h"
#include "observe/counter.h"
#include "observe/env.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::cache {

namespace fs = std::filesystem;

namespace {
/// KernelCacheStats' counters; reset_kernel_cache_stats() assigns {} (every counter to 0).
struct Counters {
  observe::Counter memory_hits, disk_hits, remote_hits, misses, corrupt, build_errors;
  observe::Counter build_us, load_us;
};
// The cache's process-wide state is never destroyed: the compile worker (backend/async_compile.cpp)
// may still be building when the process exits, and statics first used on its thread are destroyed
// before it is joined (the reverse order of construction): it then used a destroyed map.
Counters& counters() {
  static Counters& c = *new Counters;
  return c;
}
thread_local uint64_t thread_misses = 0;

using LibraryFuture = std::shared_future<std::shared_ptr<const Library>>;
struct Memory {
  std::mutex mu;  // guards the maps below; never held while a tier is read or a library built
  std::unordered_map<uint64_t, std::shared_ptr<const Library>> libs;
  /// Keys some thread is looking up in the disk or remote tier or building: a second caller for the
  /// same key waits for that result instead of building it again; other keys build concurrently.
  std::unordered_map<uint64_t, LibraryFuture> in_flight;
  std::mutex warned_mu;
  std::set<uint64_t> warned;
};

/// At most this many library builds at once in the process (the hardware threads, at least 1):
/// concurrent compiles (a region body beside its caller, async compiles of several frames) share the
/// cores instead of oversubscribing them. (One build may itself run several compiler processes for a
/// large program: PROTEAN_CPU_COMPILE_JOBS.)
class BuildSlots {
 public:
  BuildSlots() : free_(std::max<int64_t>(static_cast<int64_t>(std::thread::hardware_concurrency()), 1)) {}
  void acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return free_ > 0; });
    --free_;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++free_;
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t free_ = 1;
};
BuildSlots& build_slots() {
  static BuildSlots& s = *new BuildSlots;  // never destroyed: see counters()
  return s;
}
Memory& memory() {
  static Memory& m = *new Memory;  // never destroyed: see counters()
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
/// Writes an entry's three files, each replaced whole (core::write_file_atomic: a temporary beside
/// it, then a rename), the .so last: it is the commit point, so a reader never takes an entry whose
/// .json and .cpp are not in place. When a write fails the .cpp and .json written here are removed
/// again (a full disk takes the small files and refuses the library) and the error is rethrown.
void write_entry(const std::string& base, std::string_view cpp, std::string_view meta, std::string_view so,
                 std::string* target) {
  try {
    *target = base + ".cpp";
    core::write_file_atomic(*target, cpp, "artifact cache");
    *target = base + ".json";
    core::write_file_atomic(*target, meta, "artifact cache");
    *target = base + ".so";
    core::write_file_atomic(*target, so, "artifact cache");
  } catch (...) {
    std::error_code ec;
    fs::remove(base + ".cpp", ec);
    fs::remove(base + ".json", ec);
    throw;
  }
}
std::string make_private_dir(const std::string& parent, const char* prefix = "build") {
  std::error_code ec;
  fs::create_directories(parent, ec);
  std::string templ = fmt::format("{}/{}-XXXXXX", parent, prefix);
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data()))
    throw RuntimeError(fmt::format("artifact cache: cannot create a temp dir in {}: {}", parent, std::strerror(errno)));
  return std::string(buf.data());
}

// Build and load dirs older than this in the cache's tmp/ are left over from killed processes.
constexpr auto kStaleAge = std::chrono::hours(1);

// Removes build-* and load-* entries of `dir` last modified more than kStaleAge ago.
void remove_stale(const std::string& dir) {
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("build-", 0) != 0 && name.rfind("load-", 0) != 0) continue;
    std::error_code tec;
    auto t = fs::last_write_time(e.path(), tec);
    if (tec || now - t < kStaleAge) continue;
    fs::remove_all(e.path(), tec);
  }
}

/// Free bytes below which the cache's filesystem does not take builds (a large program's objects and
/// library are tens of MiB): 64 MiB, or PROTEAN_CACHE_MIN_FREE_MB (read when a cache dir is first used).
uint64_t min_scratch_bytes() {
  return static_cast<uint64_t>(observe::env_int("PROTEAN_CACHE_MIN_FREE_MB", 64, 0, (int64_t{1} << 40) - 1)) << 20;
}

/// The directory for build dirs and private library copies: cache_dir()/tmp when it can be written,
/// else (a read-only cache, a cache path that is a file) a private temporary directory, with one
/// warning per cache dir. Stale leftovers of killed processes are removed once per cache dir.
std::string scratch_dir() {
  static std::mutex& mu = *new std::mutex;  // never destroyed: see counters()
  static auto& chosen = *new std::unordered_map<std::string, std::string>;  // cache dir → scratch dir
  const std::string cdir = cache_dir();
  std::lock_guard<std::mutex> lock(mu);
  std::error_code ec;
  if (auto it = chosen.find(cdir); it != chosen.end() && fs::is_directory(it->second, ec)) return it->second;
  const std::string want = cdir + "/tmp";
  std::string why;
  try {
    std::string probe = make_private_dir(want, "probe");
    fs::remove(probe, ec);
    remove_stale(want);
    // A full filesystem still takes a directory; a build there then fails in the linker with no word
    // of the disk. Too little room for a build is treated as not writable.
    struct statvfs vfs {};
    if (::statvfs(want.c_str(), &vfs) == 0) {
      const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
      if (const uint64_t need = min_scratch_bytes(); avail < need)
        throw RuntimeError(fmt::format("its filesystem has {} KiB free, less than the {} MiB a build may need "
                                       "(PROTEAN_CACHE_MIN_FREE_MB)",
                                       avail / 1024, need >> 20));
    }
    return chosen[cdir] = want;
  } catch (const std::exception& e) {
    why = e.what();
  }
  const char* t = std::getenv("TMPDIR");
  std::string dir = make_private_dir(t && *t ? t : "/tmp", "protean-scratch");
  // The private directory is this process's own: removed at exit (every run with an unwritable cache
  // left one behind in /tmp).
  static auto& made = *new std::vector<std::string>;  // never destroyed: read by the exit handler
  if (made.empty())
    std::atexit([] {
      std::error_code rec;
      for (const std::string& d : made) fs::remove_all(d, rec);
    });
  made.push_back(dir);
  observe::warn(fmt::format("artifact cache: {} cannot be written ({}); builds and loads use {} instead (valid "
                            "entries still load; a new one is stored only if the kernels dir takes it)",
                            want, why, dir));
  return chosen[cdir] = dir;
}

/// dlopen's a private copy of verified library bytes (then unlinks it): the mapping can never change
/// under us, whatever happens to the cache file later (rewritten, truncated, cleared), and every load
/// gets its own handle (glibc would otherwise hand back an earlier handle loaded from the same path).
void* dlopen_private(const std::string& bytes, uint64_t key, std::string& error) {
  std::string dir = scratch_dir();
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
  // PROTEAN_KEEP_LOADED_KERNELS=1 leaves the copy in place so a profiler (perf report) can name the
  // generated kernels; the stale sweep of the kernels dir removes it later.
  if (const char* keep = std::getenv("PROTEAN_KEEP_LOADED_KERNELS"); !keep || std::string_view(keep) != "1") ::unlink(buf.data());
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
  std::lock_guard<std::mutex> lock(m.warned_mu);
  if (m.warned.insert(key).second)
    observe::warn(fmt::format("artifact cache: corrupt entry {} in {} ({}); recompiling", key_hex(key),
                              kernels_dir(), why));
}

/// The first of `symbols` that `h` does not export, or "" when all are there.
std::string missing_symbol(void* h, const std::vector<std::string>& symbols) {
  for (const auto& name : symbols)
    if (!dlsym(h, name.c_str())) return name;
  return "";
}

// The .json of an entry is a few hundred bytes; more is not ours.
constexpr uint64_t kMaxMetaBytes = 1 << 20;

/// Why `base` (.so, .json) does not hold a complete entry of `key` for `source` (any source when
/// empty), or "" when it does. Checks, in order, before any byte of the .so is read: both files are
/// regular files, the .json names this key and source and records the .so's size, and the .so has that
/// size; then the checksum of its bytes, which land in `bytes` when given. Reads only regular files (a
/// FIFO or a directory in an entry's place is not complete and never blocks).
std::string entry_problem(const std::string& base, uint64_t key, const std::string& source, std::string* bytes = nullptr) {
  const std::string so = base + ".so", js = base + ".json";
  if (std::string kind = core::file_kind(so); kind != "a regular file") return so + " is " + kind + ", not a regular file";
  std::error_code ec;
  if (!fs::exists(js, ec)) return "the .json is missing";
  std::string meta_text;
  try {
    meta_text = core::read_regular_file(js, "artifact cache metadata", kMaxMetaBytes);
  } catch (const Error& e) {
    return e.what();
  }
  uint64_t so_bytes = 0;
  std::string so_sum;
  if (std::string why = check_entry_meta(meta_text, key, source, so_bytes, so_sum); !why.empty()) return why;
  // the size first: a .json recording more bytes than the .so has (or than memory holds) is not read
  const uint64_t actual = fs::file_size(so, ec);
  if (ec || actual != so_bytes) return fmt::format("the library has {} bytes, the .json records {}", ec ? 0 : actual, so_bytes);
  std::string data;
  try {
    data = core::read_regular_file(so, "artifact cache library", so_bytes);
  } catch (const Error& e) {
    return e.what();
  } catch (const std::bad_alloc&) {  // a library past memory
    return fmt::format("the library's {} bytes could not be read into memory", so_bytes);
  } catch (const std::exception& e) {
    return e.what();
  }
  if (data.size() != so_bytes) return fmt::format("the library has {} bytes, the .json records {}", data.size(), so_bytes);
  if (key_hex(XXH64(data.data(), data.size(), 0)) != so_sum) return "checksum mismatch";
  if (bytes) *bytes = std::move(data);
  return "";
}

/// Whether `base` holds a complete entry of `key` for `source` (entry_problem finds nothing).
bool entry_is_complete(const std::string& base, uint64_t key, const std::string& source) {
  return entry_problem(base, key, source).empty();
}

/// Verifies (entry_problem) and loads a disk entry; nullptr when absent or corrupt (corruption is
/// reported with entry_problem's reason). Then dlopen and every name of `symbols`.
std::shared_ptr<const Library> load_from_disk(uint64_t key, const std::string& source,
                                              const std::vector<std::string>& symbols) {
  std::string base = kernels_dir() + "/" + key_hex(key);
  std::string so = base + ".so";
  std::error_code ec;
  // The .so is renamed into place last, so an entry without it is absent (or still being written).
  if (!fs::exists(fs::symlink_status(so, ec)) && !fs::exists(so, ec)) return nullptr;
  int64_t t0 = now_us();
  auto fail = [&](const std::string& why) -> std::shared_ptr<const Library> {
    report_corrupt(key, why);
    return nullptr;
  };
  std::string bytes;
  if (std::string why = entry_problem(base, key, source, &bytes); !why.empty()) return fail(why);
  std::string err;
  void* h = dlopen_private(bytes, key, err);
  if (!h) return fail(fmt::format("dlopen: {}", err));
  if (std::string m = missing_symbol(h, symbols); !m.empty()) {
    dlclose(h);  // nothing of it ran
    return fail(fmt::format("the library does not define {}", m));
  }
  auto lib = std::make_shared<Library>();
  lib->handle = h;
  lib->path = so;
  lib->from_disk = true;
  counters().load_us += now_us() - t0;
  return lib;
}
}  // namespace

std::string check_entry_meta(const std::string& text, uint64_t key, const std::string& source, uint64_t& so_bytes,
                             std::string& so_xxh64) {
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) return "the .json does not parse";
  if (!meta.is_object()) return "the .json is not an object";
  auto str = [&](const char* k) {
    auto it = meta.find(k);
    return it != meta.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  so_xxh64 = str("so_xxh64");
  if (so_xxh64.empty()) return "the .json has no checksum";
  if (str("key") != key_hex(key))
    return fmt::format("the .json names key '{}', not {} (an entry of another graph stored under this key)", str("key"),
                       key_hex(key));
  if (!source.empty()) {
    const std::string src_sum = key_hex(XXH64(source.data(), source.size(), 0));
    if (str("source_xxh64").empty()) return "the .json records no source hash";
    if (str("source_xxh64") != src_sum)
      return fmt::format("the .json's source hash {} is not this source's {}", str("source_xxh64"), src_sum);
  }
  auto it = meta.find("so_bytes");
  if (it == meta.end() || !it->is_number_unsigned()) return "the .json records no library size";
  so_bytes = it->get<uint64_t>();
  return "";
}

void* Library::symbol(const char* name) const { return handle ? dlsym(handle, name) : nullptr; }

uint64_t thread_kernel_misses() { return thread_misses; }

KernelCacheStats kernel_cache_stats() {
  auto& c = counters();
  KernelCacheStats s;
  s.memory_hits = c.memory_hits;
  s.disk_hits = c.disk_hits;
  s.remote_hits = c.remote_hits;
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
                      {"remote_hits", s.remote_hits},
                      {"misses", s.misses},           {"corrupt_entries", s.corrupt_entries},
                      {"build_errors", s.build_errors}, {"build_seconds", s.build_seconds},
                      {"load_seconds", s.load_seconds}};
  return j.dump();
}

std::string cache_dir() {
  std::string d;
  if (const char* e = std::getenv("PROTEAN_CACHE_DIR"); e && *e) {
    d = e;
  } else {
    const char* home = std::getenv("HOME");
    d = std::string(home && *home ? home : "/tmp") + "/.cache/protean";
  }
  // Absolute, against the working directory of now: the compiler runs in a build directory below it
  // and is handed paths in it, which a relative PROTEAN_CACHE_DIR would resolve a second time there.
  std::error_code ec;
  fs::path abs = fs::absolute(d, ec);
  return ec ? d : abs.lexically_normal().string();
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
  std::lock_guard<std::mutex> wlock(m.warned_mu);
  m.warned.clear();
}

std::shared_ptr<const Library> find_cached(uint64_t key, const std::string& source, const std::vector<std::string>& symbols) {
  auto& m = memory();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (auto it = m.libs.find(key); it != m.libs.end()) {
      counters().memory_hits++;
      return it->second;
    }
    if (m.in_flight.count(key)) return nullptr;  // being looked up or built: answer "not cached", never wait
  }
  std::shared_ptr<const Library> lib = load_from_disk(key, source, symbols);
  if (!lib) return nullptr;
  counters().disk_hits++;
  std::lock_guard<std::mutex> lock(m.mu);
  auto [it, inserted] = m.libs.emplace(key, lib);
  return it->second;  // a library another thread stored meanwhile wins (one handle per key in use)
}

namespace {
std::shared_ptr<const Library> lookup_or_build(uint64_t key, const std::string& source, const BuildFn& build,
                                               const std::vector<std::string>& symbols, const EntryAttrs& attrs);
}  // namespace

std::shared_ptr<const Library> get_or_build(uint64_t key, const std::string& source, const BuildFn& build,
                                            const std::vector<std::string>& symbols, const EntryAttrs& attrs) {
  auto& m = memory();
  std::promise<std::shared_ptr<const Library>> promise;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    if (auto it = m.libs.find(key); it != m.libs.end()) {
      counters().memory_hits++;
      trace_cache("memory", key, "hit");
      return it->second;
    }
    if (auto it = m.in_flight.find(key); it != m.in_flight.end()) {
      LibraryFuture pending = it->second;
      lock.unlock();
      trace_cache("memory", key, "wait");
      return pending.get();  // the other caller's library, or its exception
    }
    m.in_flight.emplace(key, promise.get_future().share());
  }
  trace_cache("memory", key, "miss");
  std::shared_ptr<const Library> lib;
  try {
    lib = lookup_or_build(key, source, build, symbols, attrs);
  } catch (...) {
    std::lock_guard<std::mutex> lock(m.mu);
    promise.set_exception(std::current_exception());
    m.in_flight.erase(key);
    throw;
  }
  std::lock_guard<std::mutex> lock(m.mu);
  m.libs[key] = lib;
  promise.set_value(lib);
  m.in_flight.erase(key);
  return lib;
}

namespace {
/// The disk tier, the remote tier, then a build (in a compiler slot); the caller holds `key` in flight.
std::shared_ptr<const Library> lookup_or_build(uint64_t key, const std::string& source, const BuildFn& build,
                                               const std::vector<std::string>& symbols, const EntryAttrs& attrs) {
  if (auto lib = load_from_disk(key, source, symbols)) {
    counters().disk_hits++;
    trace_cache("disk", key, "hit");
    return lib;
  }
  trace_cache("disk", key, "miss");
  if (remote::enabled()) {
    // A verified value becomes a disk entry, loaded (and verified again) from there like any other.
    if (std::optional<EntryFiles> e = remote::fetch_entry(key)) {
      bool stored = false;
      try {
        install_entry(*e);
        stored = true;
      } catch (const Error& err) {
        trace_cache("remote", key, "store_failed", err.what());
      }
      if (stored) {
        if (auto lib = load_from_disk(key, source, symbols)) {
          counters().remote_hits++;
          trace_cache("remote", key, "hit");
          return lib;
        }
      }
    } else {
      trace_cache("remote", key, "miss");
    }
  }
  counters().misses++;
  ++thread_misses;
  int64_t t0 = now_us();
  const std::string kdir = kernels_dir();
  std::string work = make_private_dir(scratch_dir());
  std::string so_tmp = work + "/kernel.so";
  // An entry on disk now failed to load (corrupt, or missing a symbol): it is replaced. One that
  // appears during the build was stored by another process: it is kept (below).
  std::error_code exists_ec;
  const bool replace_existing = fs::exists(fs::symlink_status(kdir + "/" + key_hex(key) + ".so", exists_ec));
  try {
    build_slots().acquire();
    struct Release {
      ~Release() { build_slots().release(); }
    } release;
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
                         {"source_xxh64", key_hex(XXH64(source.data(), source.size(), 0))},
                         {"protean_version", version()},
                         {"created_unix", std::chrono::duration_cast<std::chrono::seconds>(
                                              std::chrono::system_clock::now().time_since_epoch()).count()}};
  for (const auto& [k, v] : attrs) meta[k] = v;
  const std::string meta_text = meta.dump(2);
  // Writers of one key take turns (one lock file for the kernels directory: no per-key lock files), and a writer that finds a complete entry of the key
  // (another process built the same kernel meanwhile) keeps it: otherwise two writers could leave one's
  // .json beside the other's .so, which the next reader would take for corruption.
  // Storing is best effort: an entry that cannot be written (a directory in the way, a read-only or
  // full disk) costs a warning and a rebuild next time, never the run. The library is then used
  // from its build dir, which stays.
  std::string lib_path = base + ".so";
  std::string target;
  try {
    target = kdir + "/.store.lock";
    core::FileLock store_lock(target, "artifact cache");
    std::error_code ec;
    if (!replace_existing && entry_is_complete(base, key, source)) {
      trace_cache("disk", key, "store_skipped", "a complete entry of this key was stored meanwhile");
    } else {
      write_entry(base, source, meta_text, bytes, &target);
    }
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
  if (std::string miss = missing_symbol(h, symbols); !miss.empty())
    throw CompileError(fmt::format("cpu: the freshly built {}.so does not define {}", base, miss));
  auto lib = std::make_shared<Library>();
  lib->handle = h;
  lib->path = lib_path;
  counters().build_us += now_us() - t0;
  if (lib_path != so_tmp) {
    trace_cache("disk", key, "store");
    if (remote::enabled()) remote::publish_entry(EntryFiles{key, meta_text, bytes, source});
  }
  return lib;
}
}  // namespace

std::vector<uint64_t> disk_keys() {
  std::vector<uint64_t> keys;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(kernels_dir(), ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 19 || e.path().extension() != ".so") continue;
    uint64_t k = 0;
    auto [ptr, err] = std::from_chars(name.data(), name.data() + 16, k, 16);
    if (err == std::errc() && ptr == name.data() + 16) keys.push_back(k);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string verify_entry(const EntryFiles& e) {
  uint64_t so_bytes = 0;
  std::string so_sum;
  if (e.cpp.empty()) return "the entry has no source";
  if (std::string why = check_entry_meta(e.meta, e.key, e.cpp, so_bytes, so_sum); !why.empty()) return why;
  if (so_bytes != e.so.size()) return fmt::format("the library has {} bytes, the .json records {}", e.so.size(), so_bytes);
  if (key_hex(XXH64(e.so.data(), e.so.size(), 0)) != so_sum) return "checksum mismatch";
  return "";
}

std::string read_entry(uint64_t key, EntryFiles& out) {
  const std::string base = kernels_dir() + "/" + key_hex(key);
  out.key = key;
  try {
    out.meta = core::read_regular_file(base + ".json", "artifact cache metadata", kMaxMetaBytes);
    uint64_t so_bytes = 0;
    std::string so_sum;
    if (std::string why = check_entry_meta(out.meta, key, "", so_bytes, so_sum); !why.empty()) return why;
    out.so = core::read_regular_file(base + ".so", "artifact cache library", so_bytes);
    out.cpp = core::read_regular_file(base + ".cpp", "artifact cache source", uint64_t{1} << 31);
  } catch (const Error& e) {
    return e.what();
  }
  return verify_entry(out);
}

bool install_entry(const EntryFiles& e) {
  if (std::string why = verify_entry(e); !why.empty())
    throw FormatError(fmt::format("artifact cache: entry {} does not verify: {}", key_hex(e.key), why));
  EntryFiles present;
  std::error_code ec;
  const std::string base = kernels_dir() + "/" + key_hex(e.key);
  if (fs::exists(base + ".so", ec) && read_entry(e.key, present).empty()) return false;
  try {
    std::string target;
    write_entry(base, e.cpp, e.meta, e.so, &target);
  } catch (const std::exception& ex) {
    throw RuntimeError(fmt::format("artifact cache: cannot write entry {} into {}: {}", key_hex(e.key), kernels_dir(),
                                   ex.what()));
  }
  return true;
}

std::string entry_attr(const std::string& meta, const char* name) {
  nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

DiskUsage disk_usage(bool verify) {
  DiskUsage u;
  if (verify) u.corrupt = 0;
  std::error_code ec;
  const std::string dir = kernels_dir();  // (it makes the directory: once, not per entry)
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code fec;
    const bool regular = e.is_regular_file(fec);
    if (regular) u.bytes += static_cast<int64_t>(e.file_size(fec));
    if (e.path().extension() != ".so") continue;
    // a .so that is no regular file (a directory, a FIFO, a dangling link) is an entry a load finds
    // and rejects: counted when verifying, as a corrupt one
    if (!regular && !verify) continue;
    ++u.entries;
    if (!verify) continue;
    // the stem is the key in 16 lowercase hex digits (key_hex); anything else is not an entry a load
    // would find
    const std::string stem = e.path().stem().string();
    uint64_t key = 0;
    const auto [end, err] = std::from_chars(stem.data(), stem.data() + stem.size(), key, 16);
    const bool named = stem.size() == 16 && err == std::errc() && end == stem.data() + stem.size() &&
                       stem == key_hex(key);
    if (!regular || !named || !entry_is_complete(dir + "/" + stem, key, "")) ++u.corrupt;
  }
  return u;
}

int64_t clear_disk_cache() {
  std::string failed;  // the first entry that could not be removed, and why
  const int64_t n = core::remove_dir_entries(kernels_dir(), ".so", &failed);
  std::error_code ec;
  fs::remove_all(cache_dir() + "/tmp", ec);
  clear_memory_cache();
  if (!failed.empty())
    throw RuntimeError(fmt::format("artifact cache: removed {} entries, but cannot remove {}", n, failed));
  return n;
}

}  // namespace protean::cache
