// PGO profile stores: where profiles live between runs.
//
//   PROTEAN_JOB_ID=<id>          turns PGO on (nothing is read or written without it)
//   PROTEAN_CACHE_DIR=<dir>      local store root (default ~/.cache/protean); the profile of rank R is
//                                <dir>/pgo/<id>/rank<R>.json
//   PROTEAN_PGO_REMOTE=redis://host:port/prefix
//                                remote store (Redis key "<prefix>/<id>/rank<R>"), merged with the
//                                local one on load and written after the local one
//
// The process loads the profile once, on first use (a frame's first compile). After any compile that
// changed the frame's entry it writes: locally under an exclusive flock on "<file>.lock", reading the
// file again, joining this process's profile into it and renaming a temp file over it, so concurrent
// writers (other processes of the job) merge instead of losing updates; remotely with WATCH/MULTI/EXEC
// (optimistic, retried). Failure policy:
//   * a corrupt or future-version profile is reported once (warning + `pgo` trace event with
//     action "error") and ignored; before it is replaced the bad file is renamed to
//     "<file>.corrupt-<timestamp>" — it is never overwritten without a backup;
//   * a dead or slow Redis (connect/command timeout 200 ms) produces one warning and the remote store
//     is off for the rest of the process; the local store continues;
//   * local I/O errors are one warning; PGO never makes a compile fail.
// Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "dynamic/pgo.h"
#include "protean/compile.h"

namespace protean::dynamic {

/// PGO configuration read from the environment.
/// Throws ValueError (naming `where`, e.g. "--job-id" or "PROTEAN_JOB_ID") unless `id` is a job id:
/// 1-128 characters of [A-Za-z0-9._-], not "." or "..". Job ids name a directory under the cache's
/// pgo/ (and a Redis key), so nothing else may reach the file system.
void check_job_id(const std::string& id, std::string_view where);

/// PROTEAN_PGO_REMOTE's parts: redis://host[:port][/prefix]; the host may be an IPv6 literal in
/// brackets (redis://[::1]:6379/p). ValueError for a bad port (not 1-65535), an unbracketed IPv6
/// address or another scheme.
struct RedisUrl {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string prefix = "protean-pgo";
};
RedisUrl parse_redis_url(const std::string& url);

struct PgoConfig {
  std::string job_id;     // empty: PGO off
  std::string cache_dir;  // PROTEAN_CACHE_DIR or ~/.cache/protean
  int rank = 0;           // observe::trace_rank() (PROTEAN_RANK / OMPI_COMM_WORLD_RANK / PMI_RANK)
  std::string remote;     // PROTEAN_PGO_REMOTE or ""
  /// From the environment; throws ValueError for a bad PROTEAN_JOB_ID (check_job_id) or rank
  /// variable (observe::trace_rank()).
  static PgoConfig from_env();
  /// "<cache_dir>/pgo/<job_id>"
  std::string job_dir() const;
  /// "<cache_dir>/pgo/<job_id>/rank<R>.json"
  std::string local_path() const;
};

/// Reads a profile file. Returns nullopt when the file does not exist; throws FormatError (naming the
/// file) when it is corrupt or of another version, RuntimeError when it cannot be read.
std::optional<Profile> read_profile_file(const std::string& path);

/// Joins `mine` into the profile at `path` under an exclusive lock and writes it atomically (temp
/// file + rename). A corrupt file is renamed to "<path>.corrupt-<timestamp>" first (its new name is
/// returned in `backup`). Returns the joined profile. Throws RuntimeError on I/O failure.
Profile merge_into_file(const std::string& path, const Profile& mine, std::string* backup = nullptr);

/// The process's profile store (configured from the environment on first use).
class ProfileStore {
 public:
  static ProfileStore& instance();

  /// True when PROTEAN_JOB_ID is set (loads the profile on first call).
  bool enabled();
  /// The stored entry of a frame (loads the profile on first use).
  std::optional<FrameProfile> lookup(const std::string& key);
  /// Joins `entry` into the stored one; when that changed it, writes the local (and remote) store.
  /// Returns true when something changed.
  bool record(const FrameProfile& entry);
  /// The configuration in use (after first use).
  PgoConfig config();
  /// Forgets the loaded profile, the configuration and the "warned" flags: the next use re-reads the
  /// environment and reloads (tests use this to simulate a new process).
  void reset();

  ProfileStore();
  ~ProfileStore();
  ProfileStore(const ProfileStore&) = delete;
  ProfileStore& operator=(const ProfileStore&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

// ---- hooks called by the frame (src/capture/frame.cpp), under the frame's compile mutex ----------

/// Before a frame's first compile in this process: the stored entry, when PGO is on and has one.
/// Logs (PROTEAN_LOGS=pgo, +dynamic) which dims start dynamic because of the profile. Under
/// dynamic=Off a stored dynamic decision is not applied (returns nullopt) and a warning says it is
/// kept in the store.
std::optional<FrameProfile> pgo_before_first_compile(const FrameIdentity& id, Dynamic mode,
                                                     const std::string& compile_id);
/// After a compile: records the frame's FrameState (not under dynamic=Off: such a run makes no
/// dynamic decisions, so it never overwrites one).
void pgo_after_compile(const FrameIdentity& id, const FrameState& fs, Dynamic mode, const std::string& compile_id);

}  // namespace protean::dynamic
