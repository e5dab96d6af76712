// Artifact cache for binary blobs that are loaded by a driver rather than dlopen'ed: CUDA cubins.
//
// Layout: cache_dir()/<kind>/<key>.bin + <key>.json (kind "cubins"). The key is a 64-bit hash the
// caller computes over everything that determines the bytes (for a cubin: source hash, NVRTC version,
// arch, flags, Protean version: backend::cuda::CubinKey::combined). The .json records the key, the
// xxhash64 of the source, the blob's size and xxhash64, and the caller's `describe` text (NVRTC
// version, arch, flags), and is checked before the blob is read; the blob's checksum is verified on
// every load from disk.
//
// Guarantees (as kernel_cache.h's): atomic writes (temp file + rename, .json first, blob last: a .json
// without its blob is an entry another writer has not committed, a plain miss); a corrupt entry
// (unparsable or mismatching .json, wrong size or checksum, a blob without its .json) is reported
// once with a warning and rebuilt, never trusted and never a crash; an unwritable cache still builds
// (one warning) and serves from memory. A memory tier makes repeated lookups in one process free.
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace protean::cache {

using Blob = std::vector<uint8_t>;

struct BlobCacheStats {
  int64_t memory_hits = 0;
  int64_t disk_hits = 0;
  int64_t misses = 0;           ///< builds
  int64_t corrupt_entries = 0;  ///< disk entries rejected (then rebuilt)
};
BlobCacheStats blob_cache_stats();
void reset_blob_cache_stats();

/// The blob for (`kind`, `key`): from memory, else from disk (verified against `source`'s hash), else
/// built with `build` and stored. `describe` is written to the .json for inspection. Exceptions from
/// `build` propagate (nothing is stored).
std::shared_ptr<const Blob> get_or_build_blob(const std::string& kind, uint64_t key, const std::string& source,
                                              const std::string& describe, const std::function<Blob()>& build);
/// The blob when memory or disk already holds a valid entry, else nullptr (never builds).
std::shared_ptr<const Blob> find_blob(const std::string& kind, uint64_t key, const std::string& source);
/// cache_dir()/<kind>, created on demand.
std::string blob_dir(const std::string& kind);
/// Forgets the memory tier (tests: the next lookup reads the disk).
void clear_blob_memory_cache();

}  // namespace protean::cache
