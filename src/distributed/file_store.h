// A rendezvous store in a directory: the ranks of one job exchange small byte strings through files
// (the idea of torch.distributed's FileStore, with a format of our own). It carries the store group
// (include/protean/distributed.h: StoreGroup, the bootstrap of NCCL) and the compiler collectives'
// store backend; it never carries tensors.
//
// Format. Every exchange is an all-gather on a named channel ("join", "pg", "cc"): exchange `seq` of
// channel C has one file per rank,
//     <run>.<gen>.<C>.<seq>.<rank>
// where <run> is the job's run id (PROTEAN_RUN_ID, a fresh one per `protean launch`) and <gen> the
// generation: the how-many-th store group this rank made for this directory and run id (ranks make
// them in the same order), so files of another job, or of an earlier group of this job, are never
// read. A file is a header line then the payload:
//     PROTEAN-STORE 1 <run> <gen> <channel> <seq> <rank> <world size> <payload bytes> <fnv1a64 hex>\n
// written to a hidden temporary (".<name>.tmp.<pid>.<n>") and renamed into place, so a reader sees a
// whole file or none. A file whose header does not match the name, or whose payload is shorter than
// the header says or fails the checksum, is an error naming the file (never a silent wrong answer).
//
// Cleanup. When rank r completes exchange k of a channel it has every rank's file of k, so every rank
// has finished exchange k-1: r then deletes its own file of k-1. Its last file of each channel stays
// until close(): each rank writes "<run>.<gen>.done.0.<rank>", and the rank that finds every rank's
// marker deletes all of this group's files (the last one out cleans, as FileStore's reference count
// does). Files of ranks that crashed stay; `protean launch` removes the directory it made.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace protean::dynamic {
class CollectiveBackend;
}

namespace protean::distributed::detail {

class FileStore {
 public:
  /// Opens (creating the directory, one level, when missing) the store at `dir` for `rank` of `size`.
  /// Throws ValueError for a bad rank, size or run id (it must be 1 to 64 of [A-Za-z0-9_-]), and
  /// RuntimeError when the directory cannot be made or is not a writable directory.
  FileStore(std::string dir, std::string run_id, int rank, int size);
  /// close(), never throwing.
  ~FileStore();
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& dir() const { return dir_; }
  const std::string& run_id() const { return run_; }
  int generation() const { return gen_; }

  /// All-gather on `channel` (its own sequence): writes this rank's file of the next exchange, then
  /// waits until every rank's file of that exchange exists or `timeout_s` has passed. On success
  /// returns true with out[r] = rank r's payload; on timeout returns false with `missing` = the ranks
  /// whose file did not appear. Throws RuntimeError naming the file for a corrupt or truncated file,
  /// or one from a rank of another world size. Thread-safe: calls on one channel are serialized,
  /// calls on different channels run side by side.
  bool all_gather(const std::string& channel, const std::string& mine, double timeout_s,
                  std::vector<std::string>& out, std::vector<int>& missing);

  /// The path of rank `rank`'s file of exchange `seq` on `channel` (tests write corrupt ones there).
  std::string file_path(const std::string& channel, uint64_t seq, int rank) const;
  /// The sequence number the next all_gather on `channel` will use.
  uint64_t next_seq(const std::string& channel) const;

  /// Writes this rank's done marker and, when every rank's is there, deletes this group's files.
  /// Idempotent; never throws.
  void close() noexcept;

 private:
  // Each channel has its own lock, so that an exchange waiting on one channel (all_gather_bytes on
  // one thread) never holds up another's (the compiler collectives on another thread).
  struct Channel {
    std::mutex mu;
    uint64_t seq = 0;
  };
  Channel& channel(const std::string& name);
  void write_file(const std::string& path, const std::string& channel, uint64_t seq, const std::string& payload) const;
  /// Reads `path`: false when it does not exist yet; true with the payload; throws when corrupt.
  bool read_file(const std::string& path, const std::string& channel, uint64_t seq, int rank, std::string& payload) const;

  std::string dir_, run_;
  int rank_ = 0, size_ = 1, gen_ = 0;
  mutable std::mutex mu_;  // guards channels_ (not the exchanges) and closed_
  std::map<std::string, std::unique_ptr<Channel>> channels_;
  bool closed_ = false;
};

/// The compiler collectives' backend over `store` (its own channel, "cc"): what
/// distributed::install_compiler_collectives installs. all_gather never throws for a missing rank (it
/// returns false with the missing ranks); a corrupt file is the store's RuntimeError.
std::shared_ptr<dynamic::CollectiveBackend> make_store_collectives(std::shared_ptr<FileStore> store);

/// Checks a run id: 1 to 64 characters of [A-Za-z0-9_-]. Throws ValueError("<where>: ...").
void check_run_id(const std::string& id, const std::string& where);

}  // namespace protean::distributed::detail
