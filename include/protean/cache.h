// Compiled artifacts that travel: bundle files (save / load) for the artifact cache.
//
// A bundle holds, from $PROTEAN_CACHE_DIR (default ~/.cache/protean): every kernel library of the
// current build target (binary + generated source + metadata), the PGO profiles (pgo/<job>/rank<R>.json),
// the source-location caches (locations/<ELF build id>.tsv: symbolized C++ frames of a binary, valid
// wherever that binary runs) and later kinds (compiled programs, tuning results, device binaries) as generic records. Loading one
// into a fresh cache directory lets the first compile of every graph it covers skip the C++ compiler
// — the analogue of torch.compiler.save_cache_artifacts / load_cache_artifacts (Mega-Cache), with
// a version and target check instead of "no compatibility guarantees".
//
// Trust model: loading a bundle installs shared libraries that the process later dlopen's and runs —
// native code with the process's rights. Load only bundles you would run as programs. Set
// $PROTEAN_CACHE_SIGNING_KEY (any secret string) on the producer and on the consumer: bundles are then
// signed (HMAC-SHA256) when saved, and an unsigned bundle or one with another signature is refused
// when loaded. Checksums (xxhash64 per record and per file) catch corruption, not tampering.
//
// Keys are portable only when the bundle is made with PROTEAN_CACHE_PORTABLE=1 (kernels built for a
// named x86-64 level, docs/cache.md); a bundle of `-march=native` kernels is useful on the same CPU
// model only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace protean {

/// One record of a bundle (save / load / inspect).
struct CacheArtifactRecord {
  std::string kind;    ///< "kernel", "pgo", ...
  std::string name;    ///< kernel: its key (16 hex digits); pgo: "<job>/rank<R>.json"
  int64_t bytes = 0;   ///< uncompressed size
  int64_t stored = 0;  ///< compressed size in the file
};

/// What a save, load or inspect did.
struct CacheArtifactsSummary {
  std::string path;
  std::string header;             ///< the bundle header (JSON: format, protean_version, compiler, target, ...)
  std::string target;             ///< "native" or an x86-64 level (x86-64-v3, ...)
  bool signed_ = false;           ///< the file carries an HMAC signature
  int64_t kernels = 0;            ///< kernel records saved; on load: entries written into the cache
  int64_t kernels_present = 0;    ///< load: entries already in the cache (kept as they are)
  int64_t kernels_rebuilt = 0;    ///< load: kernels of another target or compiler rebuilt from their source
  int64_t kernels_left_out = 0;   ///< save: entries of another target (or unreadable) not saved
  int64_t programs = 0;           ///< compiled plans (program cache) saved; on load: entries written
  int64_t programs_present = 0;   ///< load: plans already in the cache (kept as they are)
  int64_t profiles = 0;           ///< PGO profiles saved / merged into the local store
  int64_t locations = 0;          ///< source-location caches saved / written (locations/<build id>.tsv)
  int64_t other_records = 0;      ///< records of kinds this version does not install (kept in the file)
  int64_t file_bytes = 0;
  double seconds = 0;             ///< wall time of the call
  std::vector<CacheArtifactRecord> records;
};

struct LoadCacheOptions {
  /// Kernels built for a target this CPU cannot run (another x86-64 level, -march=native on another
  /// CPU) or by another compiler: true rebuilds them from the bundled source with this machine's
  /// settings (their binaries are never loaded; one warning names how many), false refuses the
  /// bundle (ValueError) before anything is written.
  bool rebuild = true;
};

/// Writes every artifact of the cache directory that this process's settings can use (kernels of the
/// current target: `-march=native`, or PROTEAN_CACHE_PORTABLE's level) and every PGO profile into one
/// bundle at `path` (written atomically: a temp file renamed into place). Signed when
/// $PROTEAN_CACHE_SIGNING_KEY is set. Throws RuntimeError when `path` cannot be written.
CacheArtifactsSummary save_cache_artifacts(const std::string& path);

/// Installs a bundle into the cache directory. The whole file is read and verified first (magic,
/// format, Protean version, file and record checksums, signature policy, every kernel entry's
/// metadata and binary checksum); a bundle that fails any check is refused — FormatError (not a
/// bundle, truncated, corrupt), ValueError (another Protean version or format, a missing or wrong
/// signature, another target with rebuild = false) — and nothing in the cache is touched. Then each
/// kernel is written atomically unless an entry with its key is already there (existing entries are
/// never overwritten), and each profile is merged into the local PGO store.
CacheArtifactsSummary load_cache_artifacts(const std::string& path, const LoadCacheOptions& options = {});

/// Reads and verifies a bundle (as load_cache_artifacts) without installing anything: header and
/// records (`protean cache show`).
CacheArtifactsSummary inspect_cache_artifacts(const std::string& path);

}  // namespace protean
