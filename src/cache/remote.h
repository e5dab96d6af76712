// The remote tier of the artifact cache: Redis, shared by the processes and machines of a job.
//
//   PROTEAN_CACHE_REMOTE=redis://host:port/prefix    turns it on (default prefix "protean-cache")
//
// Lookup order (kernel_cache.h): memory → disk → remote → build; program plans (program_cache.h):
// disk → remote → lowering. Values are bundles of one record
// (cache/bundle.h: version, target and compiler in the header, zstd, xxhash64, HMAC-SHA256 when
// $PROTEAN_CACHE_SIGNING_KEY is set and then required) stored under "<prefix>:v1:<kind>:<name>";
// a kernel's name is its key, which already hashes the source, compiler, flags, target and version.
// A value larger than the chunk size (64 MiB) is stored as chunks "<key>:<i>" written first and a
// manifest under the key written last ("PROTCHNK", count, total bytes, xxhash64 of the whole value).
//
// Writes are asynchronous (one worker thread, FIFO) and use SET NX: the first writer of a key wins,
// nobody overwrites it (equal keys mean equal content). At exit the queue is drained for at most 5 s.
//
// Failure policy (the PGO store's, dynamic/profile_store.h): connect and command timeout 200 ms; the
// first failure (refused, timeout, a server killed mid-run) is one warning and the tier is off for the
// rest of the process; the local tiers continue. A value that does not verify (corrupt, another
// version, a bad signature) is one warning per key, is deleted, and counts as a miss.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cache/kernel_cache.h"
#include "cache/program_cache.h"

namespace protean::cache::remote {

/// PROTEAN_CACHE_REMOTE is set (and parses) and the tier has not failed in this process.
bool enabled();
/// The kernel entry of `key` from the remote store, verified (verify_entry + the value's checks);
/// nullopt when absent, invalid (one warning, the key is deleted) or the store is unavailable.
std::optional<EntryFiles> fetch_entry(uint64_t key);
/// Queues the entry for a SET NX and returns at once.
void publish_entry(EntryFiles e);
/// The program cache entry of `key` (program_cache.h: a backend's plan) from the remote store, stored
/// as a bundle of one "program" record and verified like a kernel's (header, signature, then
/// verify_program_entry); nullopt when absent, invalid (one warning, deleted) or unavailable.
std::optional<ProgramEntry> fetch_program(uint64_t key);
/// Queues the program entry for a SET NX under "<prefix>:v1:program:<key>" and returns at once.
void publish_program(ProgramEntry e);
/// Blocks until every queued write is done or failed.
void flush();

struct RemoteStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t writes = 0;        ///< values stored by this process
  int64_t already_present = 0; ///< SET NX found the key (another writer was first)
  int64_t invalid = 0;       ///< values that did not verify
  bool failed = false;       ///< the tier is off after a failure
  int64_t program_hits = 0;   ///< program plans found (and verified) remotely
  int64_t program_misses = 0; ///< program lookups that found nothing usable
};
RemoteStats remote_stats();
/// Values larger than this are chunked (default 64 MiB; tests set it small).
void set_chunk_bytes(size_t bytes);
/// Drains the queue, closes the connections and forgets the configuration and the failure: the next
/// use re-reads the environment (tests: a new process).
void reset();
/// "<prefix>:v1:<kind>:<name>" under the current configuration ("" when off).
std::string value_key(const std::string& kind, const std::string& name);

}  // namespace protean::cache::remote
