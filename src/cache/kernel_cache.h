// Artifact cache for compiled kernel libraries: memory → disk → remote (Redis, when
// PROTEAN_CACHE_REMOTE is set; cache/remote.h) → build.
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
//  * Counters (kernel_cache_stats) count memory hits, disk hits, remote hits, misses (= builds),
//    corrupt entries.
//  * The remote tier is consulted after a disk miss: a verified value is written to disk as an entry
//    (as an imported one) and loaded from there; a fresh build is published to it asynchronously.
//    A remote that fails costs one warning and is off for the rest of the process (cache/remote.h).
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
  int64_t remote_hits = 0;     ///< entries fetched from the remote tier (then on disk)
  int64_t misses = 0;          ///< builds (each runs the compiler once)
  int64_t corrupt_entries = 0; ///< disk entries rejected (then rebuilt)
  int64_t build_errors = 0;    ///< builds that threw
  double build_seconds = 0;    ///< wall time spent in builds
  double load_seconds = 0;     ///< wall time spent verifying + dlopen'ing disk entries
};
/// Process-wide counters since start or the last reset.
KernelCacheStats kernel_cache_stats();
/// Misses (builds started) counted on the calling thread over its lifetime: tells whether one lookup
/// built while other threads build concurrently (the process-wide misses counter mixes them).
uint64_t thread_kernel_misses();
void reset_kernel_cache_stats();
/// JSON object of the counters (for `protean cache stats` and reports).
std::string kernel_cache_stats_json();

/// $PROTEAN_CACHE_DIR, else $HOME/.cache/protean (read on every call, so tests can redirect it), made
/// absolute against the current working directory.
std::string cache_dir();
/// cache_dir()/kernels (created on demand).
std::string kernels_dir();

/// Builds a library: writes `source`, compiles it into `so_path`. Throws CompileError on failure.
/// `work_dir` is a fresh private directory (kept on failure for inspection).
using BuildFn = std::function<void(const std::string& source, const std::string& work_dir, const std::string& so_path)>;

/// Extra string fields recorded in a new entry's .json (the toolchain records "target", "opt" and
/// "compiler": what an importer needs to decide whether the binary runs here or must be rebuilt
/// from the entry's source).
using EntryAttrs = std::vector<std::pair<std::string, std::string>>;

/// The library for `key`: from memory, else from disk (verified), else built with `build` and stored.
/// A disk entry is used only when its .json names `key` and the hash of `source`, its .so has the
/// recorded size and checksum, and the loaded library exports every name in `symbols`; otherwise it
/// is corrupt (one warning) and rebuilt. A fresh build that lacks one of `symbols` is a CompileError.
std::shared_ptr<const Library> get_or_build(uint64_t key, const std::string& source, const BuildFn& build,
                                            const std::vector<std::string>& symbols = {}, const EntryAttrs& attrs = {});
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

/// The files of one disk entry (export, the remote tier).
struct EntryFiles {
  uint64_t key = 0;
  std::string meta;  ///< the .json text
  std::string so;    ///< the library's bytes
  std::string cpp;   ///< the generated source
};
/// Keys of the entries on disk (those with a .so), in key order.
std::vector<uint64_t> disk_keys();
/// Checks the parts of an entry: the .json names `key` and the hash of `cpp`, the library has the
/// recorded size and checksum. "" when they do, else the reason. Never throws.
std::string verify_entry(const EntryFiles& e);
/// Reads the disk entry of `key` (regular files, bounded sizes) and verifies it. "" and `out` filled,
/// or the reason it cannot be used.
std::string read_entry(uint64_t key, EntryFiles& out);
/// Writes a verified entry into the kernels dir (temp files renamed into place: .cpp, .json, then the
/// .so) unless a valid entry of that key is already there. Returns true when written, false when one
/// was present (it is never overwritten). Throws FormatError (naming the reason) for an entry that
/// does not verify, RuntimeError when the cache cannot be written.
bool install_entry(const EntryFiles& e);
/// The string field `name` of an entry's .json ("" when absent or unparsable).
std::string entry_attr(const std::string& meta, const char* name);

struct DiskUsage {
  int64_t entries = 0;
  int64_t bytes = 0;
  /// With `verify`: entries that would not load (the .json missing, unreadable or naming another key,
  /// the .so of another size or checksum, a file name that is not a key); the next use of one rebuilds
  /// it. Counted in `entries` too. -1 without `verify`.
  int64_t corrupt = -1;
};
/// The kernel entries in kernels_dir() and their bytes (.so, .json and .cpp files). `verify` reads every
/// entry and checks it as a load would (its checksum included: time in proportion to the bytes).
DiskUsage disk_usage(bool verify = false);
/// Removes every kernel entry from disk; returns the number of entries removed. Throws RuntimeError
/// naming the first entry it could not remove (a read-only cache), after removing what it could.
int64_t clear_disk_cache();

}  // namespace protean::cache
