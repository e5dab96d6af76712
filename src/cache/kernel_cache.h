// Artifact cache for compiled kernel libraries: memory → disk.
//
// Layout: $PROTEAN_CACHE_DIR (default ~/.cache/protean)/kernels/<key>.so + <key>.json (+ <key>.cpp,
// the source, for inspection). The key is a 64-bit xxhash the caller computes over everything that
// determines the binary (generated source, compiler identity and flags, CPU features, Protean version).
// The .json records the xxhash64 of the .so bytes; it is verified before every load from disk, and the
// verified bytes are dlopen'ed from a private copy (later changes to the cache file cannot affect a
// loaded library).
//
// Guarantees:
//  * Atomic writes: files are produced in a private temp dir on the same file system and renamed into
//    place, the .json first and the .so last; readers never see a partial file. Two processes (or
//    threads) compiling the same key at once both succeed; the last rename wins with equal content.
//  * A corrupt entry (missing/unparsable .json, a .json naming another key or source, a size or
//    checksum mismatch, a FIFO or other non-regular file, dlopen failure, a missing kernel symbol) is
//    reported once per key with a warning on stderr and rebuilt; it never crashes the process. The
//    .json is read first and the recorded size checked before the .so is read.
//  * A cache that cannot be written (read-only, or a path that is a file) still works: builds and
//    private library copies go to a private temporary directory (one warning), new entries are not
//    stored, valid entries are still loaded. Build/load dirs left in tmp/ by killed processes are
//    removed after an hour.
//  * Counters (kernel_cache_stats) count memory hits, disk hits, misses (= builds), corrupt entries.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace protean::cache {

/// A dlopen'ed library. Never unloaded (kernels may still run on other threads); the handle lives
/// for the process.
struct Library {
  void* handle = nullptr;
  std::string path;      ///< the .so in the cache dir
  bool from_disk = false;
  /// dlsym; nullptr when missing.
  void* symbol(const char* name) const;
};

struct KernelCacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;          ///< builds (each runs the compiler once)
  int64_t corrupt_entries = 0; ///< disk entries rejected (then rebuilt)
  int64_t build_errors = 0;    ///< builds that threw
  double build_seconds = 0;    ///< wall time spent in builds
  double load_seconds = 0;     ///< wall time spent verifying + dlopen'ing disk entries
};
/// Process-wide counters since start or the last reset.
KernelCacheStats kernel_cache_stats();
void reset_kernel_cache_stats();
/// JSON object of the counters (for `protean cache stats` and reports).
std::string kernel_cache_stats_json();

/// $PROTEAN_CACHE_DIR, else $HOME/.cache/protean (read on every call, so tests can redirect it).
std::string cache_dir();
/// cache_dir()/kernels (created on demand).
std::string kernels_dir();

/// Builds a library: writes `source`, compiles it into `so_path`. Throws CompileError on failure.
/// `work_dir` is a fresh private directory (kept on failure for inspection).
using BuildFn = std::function<void(const std::string& source, const std::string& work_dir, const std::string& so_path)>;

/// The library for `key`: from memory, else from disk (verified), else built with `build` and stored.
/// A disk entry is used only when its .json names `key` and the hash of `source`, its .so has the
/// recorded size and checksum, and the loaded library exports every name in `symbols`; otherwise it
/// is corrupt (one warning) and rebuilt. A fresh build that lacks one of `symbols` is a CompileError.
std::shared_ptr<const Library> get_or_build(uint64_t key, const std::string& source, const BuildFn& build,
                                            const std::vector<std::string>& symbols = {});
/// The library for `key` when the memory or disk tier already holds it (counted as a hit), else
/// nullptr. Never builds and never waits for a build: while this process is building a library (any
/// key) it looks at the memory tier only. Disk entries are verified as by get_or_build (`source`
/// empty: its hash is not checked).
std::shared_ptr<const Library> find_cached(uint64_t key, const std::string& source = {},
                                           const std::vector<std::string>& symbols = {});
/// "00ab...": the key as 16 hex digits (file names).
std::string key_hex(uint64_t key);
/// Forgets the in-memory tier (tests: forces the next lookup to the disk tier).
void clear_memory_cache();

/// Checks the text of an entry's .json before anything of its library is read: it parses, names
/// `key`, records a checksum, a size and (when `source` is not empty) the hash of `source`. Returns ""
/// and sets `so_bytes` / `so_xxh64` when it does, else the reason (the corrupt-entry warning's text).
/// Never throws for any text (a fuzz target holds it to that).
std::string check_entry_meta(const std::string& text, uint64_t key, const std::string& source, uint64_t& so_bytes,
                             std::string& so_xxh64);

struct DiskUsage {
  int64_t entries = 0;
  int64_t bytes = 0;
};
DiskUsage disk_usage();
/// Removes every kernel entry from disk; returns the number of entries removed.
int64_t clear_disk_cache();

}  // namespace protean::cache
