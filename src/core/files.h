// Opening files a user names: only regular files. A FIFO, a character device or a socket given as a
// model, a .npy input, a cache metadata file or a PGO profile would block forever in open() or read
// forever; a directory reads as an empty or truncated file. These helpers refuse them by name.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace protean::core {

/// What `path` is, as a user reads it: "a regular file", "a directory", "a FIFO (named pipe)",
/// "a character device", "a block device", "a socket", "missing" (also for an unreadable parent).
std::string file_kind(const std::string& path);

/// Throws RuntimeError "cannot open `what` '`path`': it is a FIFO (named pipe), not a regular file"
/// (or "no such file", "a directory", ...) unless `path` is a regular file; returns its size in bytes.
/// Symbolic links are followed.
uint64_t require_regular_file(const std::string& path, std::string_view what);

/// An open read-only descriptor (blocking, close-on-exec) of the regular file `path`, and its size in
/// `*size`: opened non-blocking, then checked with fstat, so a FIFO swapped in after a check cannot
/// block. The caller closes it. RuntimeError naming `what` and the path when it is not a regular
/// file or cannot be opened ("permission denied", "no such file").
int open_regular_file(const std::string& path, std::string_view what, uint64_t* size);

/// The whole content of the regular file `path` (opened non-blocking, then checked with fstat, so a
/// FIFO swapped in after a check cannot block). RuntimeError naming `what` and the path when it is
/// not a regular file, cannot be opened ("permission denied", "no such file") or is larger than
/// `max_bytes`.
std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes = UINT64_MAX);

/// Removes every entry of the directory `dir` (files and subdirectories, recursively) and returns how
/// many of the removed entries have the extension `counted_ext` (".so": a cache's entries). An entry
/// that cannot be removed (a read-only cache) is skipped; the first such is described in `*failed`
/// ("PATH: reason"; left empty when everything went). A missing `dir` removes nothing.
int64_t remove_dir_entries(const std::string& dir, std::string_view counted_ext, std::string* failed);

/// Replaces the file `path` with `bytes` so that a reader sees the old content or the new, never a
/// part: the bytes go to a temporary file beside it (`path.tmp.<pid>.<n>`, unique per process and
/// call, so threads writing one path do not share it), every write and the close are checked (a full
/// disk reports at close() for buffered data), `durable` adds an fsync before the rename, and only
/// then is it renamed over `path`. On any failure the temporary file is removed, `path` keeps its
/// earlier content, and RuntimeError "`what`: cannot write '`path`': <reason>" is thrown (the reason
/// as strerror gives it: "No space left on device", "Permission denied").
void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what, bool durable = false);
/// The first call that writes into a directory (per process) also removes that directory's stale
/// temporaries (remove_stale_temporaries with kStaleTemporaryAge): those a process killed between
/// creating and renaming one left behind.
/// The same with the content given in pieces, written one after the other (a header and a tensor's
/// data, without copying them into one string first).
void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces, std::string_view what,
                       bool durable = false);

/// The current UTC time as "20261206T153012.345Z" (file-name safe, sorts by time).
std::string utc_timestamp();

/// Renames the damaged file `path` to "<path>.corrupt-<utc_timestamp>" ("-1", "-2" appended while that
/// name is taken), so a rewrite of `path` loses nothing. Returns the new name; RuntimeError
/// "`what`: cannot back up '`path`' as '<name>': <reason>" when the rename fails.
std::string backup_corrupt_file(const std::string& path, std::string_view what);

/// How old a temporary of write_file_atomic must be before it counts as left behind: a writer finishes
/// in seconds; one hour also leaves alone a writer on another machine sharing the directory whose
/// clock is a few minutes off.
constexpr std::chrono::seconds kStaleTemporaryAge{3600};

/// Removes the regular files of `dir` that are write_file_atomic's temporaries (`NAME.tmp.<pid>.<n>`,
/// both numbers decimal) and were last modified more than `min_age` ago; returns how many went.
/// Other files, subdirectories and temporaries that cannot be removed are left as they are; a
/// missing or unreadable `dir` removes nothing. Never throws.
int64_t remove_stale_temporaries(const std::string& dir, std::chrono::seconds min_age = kStaleTemporaryAge);

/// An exclusive advisory lock (flock) on the file `path`, created if missing, held for the object's
/// lifetime: the writers of one store (the kernel cache, a PGO profile, the tuning table) take turns.
/// Blocks until the lock is free; a signal while waiting retries. Throws RuntimeError "`what`: cannot
/// open (or lock) `path`: <reason>" when the file cannot be opened or locked.
class FileLock {
 public:
  FileLock(const std::string& path, std::string_view what);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace protean::core
