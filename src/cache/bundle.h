// Cache bundles: compiled artifacts in one file that travels to another directory, machine or
// container (`protean cache export | import | show`, protean::save_cache_artifacts /
// load_cache_artifacts in include/protean/cache.h). The same encoding is the value format of the
// Redis artifact tier (cache/remote.h): a bundle of one record.
//
// File layout (integers little-endian):
//   "PROTBNDL"                  8-byte magic
//   u32 format                  kBundleFormat; another value is refused
//   u32 n, header               n bytes of JSON: format, protean_version, compiler (first line of
//                               `<cxx> --version`), target ("native" or an x86-64 level, cache/isa.h),
//                               cpu_flags_xxh64 (native only), created_unix, records
//   u32 count                   number of records, then per record:
//     u16 n, kind               "kernel", "pgo", "program", ... (generic: a later kind, e.g. a CUDA
//                               cubin, is a new name, not a new layout)
//     u16 n, name               kernel: the key as 16 hex digits; pgo: "<job>/rank<R>.json"
//     u64 raw_bytes, u64 zstd_bytes, u64 raw_xxh64
//     zstd_bytes                one zstd frame of the record's bytes
//   u64 xxh64                   of every byte before it
//   u8 n, signature             0 or 32 bytes: HMAC-SHA256 of every byte before it, keyed with
//                               $PROTEAN_CACHE_SIGNING_KEY
// Nothing may follow. A kernel record's bytes are three length-prefixed parts (u32 count, then per
// part u64 n + bytes): the entry's .json, .so and .cpp (cache/kernel_cache.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace protean::cache {

inline constexpr uint32_t kBundleFormat = 1;

struct BundleRecord {
  std::string kind;
  std::string name;
  std::string bytes;  ///< decompressed and checked against raw_xxh64
  uint64_t stored = 0;  ///< decode: the compressed size in the file
};

struct Bundle {
  std::string header;  ///< the header JSON text
  std::vector<BundleRecord> records;
  bool signed_ = false;
  bool signature_ok = false;  ///< signed and it matches $PROTEAN_CACHE_SIGNING_KEY (false without a key)
};

/// Encodes a bundle: `header_json` (an object; see above) and the records, zstd level 3, with the file
/// checksum, signed when `signing_key` is not empty.
std::string encode_bundle(const std::string& header_json, const std::vector<BundleRecord>& records,
                          const std::string& signing_key);

/// Decodes and verifies `bytes`: magic, format, the file checksum (before any record is
/// decompressed), every record's length fields, zstd frame and checksum, no trailing bytes; the
/// signature is checked against `signing_key` when both are present. Throws FormatError naming
/// `where` and what is wrong (not a bundle, another format, truncated at record i of n, checksum
/// mismatch, ...). Never crashes or allocates more than the records' decompressed sizes for any input
/// (a fuzz target holds it to that).
Bundle decode_bundle(const std::string& bytes, const std::string& where, const std::string& signing_key);

/// Reads the first 8 bytes of the regular file `path` and throws FormatError when they are not a
/// bundle's magic, so a large file that is no bundle is refused before it is read whole. Files that
/// are not regular, or shorter than 8 bytes, are left to the full read (which names what is wrong).
void check_bundle_file_magic(const std::string& path);

/// Kernel record bytes: the .json, .so and .cpp of an entry.
std::string pack_parts(const std::vector<std::string>& parts);
/// The inverse; FormatError naming `where` when the bytes are not `count` parts.
std::vector<std::string> unpack_parts(const std::string& bytes, size_t count, const std::string& where);

/// The bundle header of this process (format, version, compiler, target, ...) with `records` and
/// `kinds` counts filled by the caller.
std::string bundle_header_json(size_t records);
/// Why a bundle with header `header_json` cannot be used here ("" when it can): another format or
/// Protean version, or unparsable. The target and the compiler are checked per use (kernel records
/// of another target are rebuilt from their source or refused, load_cache_artifacts).
std::string check_bundle_header(const std::string& header_json);

/// The xxhash64 (16 hex digits) of this CPU's /proc/cpuinfo flags line: what a native build records.
std::string local_cpu_flags();
/// $PROTEAN_CACHE_SIGNING_KEY ("" when unset).
std::string signing_key();
/// The signature policy: with a signing key set, a bundle must be signed with it; without one, any
/// bundle is accepted (a signed one unverified). "" when `b` passes, else the reason.
std::string signature_problem(const Bundle& b);

}  // namespace protean::cache
