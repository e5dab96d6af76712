// Program cache: a backend's compiled plan (its scheduled program, the kernels' names and buffer
// tables, the translation unit the kernels are built from), stored beside the kernel libraries so a
// warm process skips lowering, scheduling and code generation, not only the C++ compiler. The plan's
// bytes are the backend's own encoding (backend/cpu/program_plan.h); this file only stores them.
// The role is that of torch.compile's FX graph cache (a post-pass graph hash → the compiled module),
// with the backend's plan in place of generated Python.
//
// Layout: cache_dir()/programs/<key>.json + <key>.plan. The key is a 64-bit hash the backend computes
// over everything that determines the plan (the post-pass graph text, its constants' bytes, the size
// symbols and runtime assertions, the backend's switches, the Protean version). The .json records the
// key, the xxhash64 of the key text (the graph text: an entry of another graph copied under this key
// names another text), the plan's size and xxhash64 and the format; it is read first and the size of
// the .plan checked against it before a byte of the plan is read.
//
// Guarantees (as kernel_cache.h's): atomic writes (temp file + rename, .json first, .plan last: a
// .json without its .plan is an entry another writer has not committed, a plain miss); a
// corrupt or foreign entry (unparsable .json, another key or key text, another format or Protean
// version, wrong size or checksum, a FIFO or other non-regular file, or a plan its backend cannot
// decode: report_corrupt_program) is reported once per key with a warning and rebuilt, never trusted
// and never a crash; an unwritable cache costs one warning and the compile goes on without storing.
// There is no memory tier: a plan is decoded once per compile, and the artifact it becomes is what
// the frame keeps. Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace protean::cache {

/// Version of the .json + .plan layout; an entry of another format is rebuilt.
inline constexpr int kProgramCacheFormat = 1;

struct ProgramCacheStats {
  int64_t hits = 0;            ///< plans read and decoded (lowering and codegen skipped), remote ones included
  int64_t remote_hits = 0;     ///< plans the disk lacked and the remote tier (remote.h) had
  int64_t misses = 0;          ///< lookups without a usable entry (the backend then lowers)
  int64_t stores = 0;          ///< plans written
  int64_t corrupt_entries = 0; ///< entries rejected (then rebuilt)
  double load_seconds = 0;     ///< wall time spent reading and verifying entries
};
ProgramCacheStats program_cache_stats();
void reset_program_cache_stats();
/// JSON object of the counters (reports, `--stats-json`).
std::string program_cache_stats_json();

/// PROTEAN_PROGRAM_CACHE=0 turns the program cache off (read on every call); on by default.
bool program_cache_enabled();

/// cache_dir()/programs (created on demand).
std::string programs_dir();

/// The plan stored under `key` when a valid entry is on disk (its .json names `key`, the hash of
/// `key_text`, this format and Protean version, and the .plan has the recorded size and checksum),
/// else, with PROTEAN_CACHE_REMOTE set, a valid entry of the remote tier (installed on disk), else
/// std::nullopt (a miss; a corrupt entry is reported). Counts a miss when nothing is returned;
/// the caller counts the hit with note_program_hit once the plan decoded.
std::optional<std::string> find_program(uint64_t key, const std::string& key_text);
/// Counts a plan that find_program returned and the backend decoded.
void note_program_hit();
/// Reports a plan find_program returned but the backend could not decode or use (`why`): one warning
/// per key, counted as corrupt; the caller then builds and stores a fresh plan.
void report_corrupt_program(uint64_t key, const std::string& why);
/// Stores `plan` under `key` (atomic; an existing entry is replaced) and queues it for the remote tier
/// when that is on. `describe` goes into the .json
/// for inspection (graph name, kernel and extern counts). Never throws: an unwritable cache costs one
/// warning.
void store_program(uint64_t key, const std::string& key_text, const std::string& plan, const std::string& describe);

/// The files of one entry (bundles).
struct ProgramEntry {
  uint64_t key = 0;
  std::string meta;  ///< the .json text
  std::string plan;  ///< the .plan bytes
};
/// Keys of the entries on disk (those with a .plan), in key order.
std::vector<uint64_t> program_keys();
/// Checks an entry's parts: the .json parses, names `key`, this format and Protean version, and the
/// plan's size and checksum. "" when they do, else the reason. Never throws.
std::string verify_program_entry(const ProgramEntry& e);
/// Reads and verifies the disk entry of `key`: "" and `out` filled, or the reason it cannot be used.
std::string read_program_entry(uint64_t key, ProgramEntry& out);
/// Writes a verified entry (temp files renamed into place) unless a valid one of that key is there.
/// True when written. Throws FormatError for an entry that does not verify, RuntimeError when the
/// cache cannot be written.
bool install_program_entry(const ProgramEntry& e);
/// Removes every program entry; returns the number removed. Throws RuntimeError naming the first
/// entry it could not remove, after removing what it could.
int64_t clear_program_cache();

}  // namespace protean::cache
