#include "cache/bundle.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cache/kernel_toolchain.h"
#include "cache/isa.h"
#include "cache/kernel_cache.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::cache {

namespace {
constexpr char kMagic[] = "PROTBNDL";
constexpr size_t kSigBytes = 32;
constexpr uint64_t kMaxHeaderBytes = 1 << 20;
constexpr uint64_t kMaxRecordBytes = uint64_t{1} << 34;  // 16 GiB decompressed per record

void put_u8(std::string& o, uint8_t v) { o.push_back(static_cast<char>(v)); }
void put_u16(std::string& o, uint16_t v) { o.append(reinterpret_cast<const char*>(&v), 2); }
void put_u32(std::string& o, uint32_t v) { o.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& o, uint64_t v) { o.append(reinterpret_cast<const char*>(&v), 8); }

/// Bounds-checked little-endian reads; every short read is a FormatError naming the field.
struct Reader {
  const std::string& s;
  const std::string& where;
  size_t pos = 0;
  void need(size_t n, const std::string& what) {
    if (n > s.size() - pos)
      throw FormatError(fmt::format("{}: truncated: {} needs {} bytes at offset {}, the file has {}", where, what, n, pos,
                                    s.size()));
  }
  template <class T>
  T get(const std::string& what) {
    need(sizeof(T), what);
    T v{};
    std::memcpy(&v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string bytes(size_t n, const std::string& what) {
    need(n, what);
    std::string out = s.substr(pos, n);
    pos += n;
    return out;
  }
};

std::string hmac_sha256(const std::string& key, const char* data, size_t n) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data), n, md,
            &len) ||
      len != kSigBytes)
    throw RuntimeError("cache bundle: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string zstd_compress(const std::string& raw) {
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  if (ZSTD_isError(n)) throw RuntimeError(fmt::format("cache bundle: zstd: {}", ZSTD_getErrorName(n)));
  out.resize(n);
  return out;
}

/// Decompresses one zstd frame of exactly `raw_bytes`; the output grows with what the frame really
/// produces, so a forged size allocates nothing it does not fill.
std::string zstd_decompress(const char* data, size_t n, uint64_t raw_bytes, const std::string& what) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> d(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!d) throw RuntimeError("cache bundle: cannot allocate a zstd context");
  std::string out;
  out.resize(static_cast<size_t>(std::min<uint64_t>(raw_bytes, std::max<uint64_t>(uint64_t{n} * 4, 1 << 16))));
  size_t pos = 0;
  ZSTD_inBuffer in{data, n, 0};
  for (;;) {
    if (pos == out.size() && out.size() < raw_bytes)
      out.resize(static_cast<size_t>(std::min<uint64_t>(raw_bytes, uint64_t{out.size()} * 2)));
    ZSTD_outBuffer o{out.data(), out.size(), pos};
    size_t r = ZSTD_decompressStream(d.get(), &o, &in);
    if (ZSTD_isError(r)) throw FormatError(fmt::format("{}: zstd: {}", what, ZSTD_getErrorName(r)));
    pos = o.pos;
    if (r == 0) break;  // frame complete
    if (pos == out.size() && out.size() == raw_bytes) {
      // Full at the declared size with the frame not finished: more data than declared, unless the
      // frame only has its epilogue left (checked with a one-byte probe).
      char probe;
      ZSTD_outBuffer p{&probe, 1, 0};
      size_t r2 = ZSTD_decompressStream(d.get(), &p, &in);
      if (ZSTD_isError(r2)) throw FormatError(fmt::format("{}: zstd: {}", what, ZSTD_getErrorName(r2)));
      if (p.pos != 0) throw FormatError(fmt::format("{}: decompresses to more than the recorded {} bytes", what, raw_bytes));
      if (r2 == 0) break;
      if (in.pos == in.size) throw FormatError(fmt::format("{}: the zstd frame is truncated", what));
      continue;
    }
    if (in.pos == in.size && o.pos < o.size) throw FormatError(fmt::format("{}: the zstd frame is truncated", what));
  }
  if (pos != raw_bytes)
    throw FormatError(fmt::format("{}: decompresses to {} bytes, the record says {}", what, pos, raw_bytes));
  if (in.pos != in.size) throw FormatError(fmt::format("{}: bytes after the zstd frame", what));
  out.resize(pos);
  return out;
}

std::string xxh_hex(const std::string& s) { return key_hex(XXH64(s.data(), s.size(), 0)); }


}  // namespace

// ---- encoding ---------------------------------------------------------------------------------------
std::string pack_parts(const std::vector<std::string>& parts) {
  std::string out;
  put_u32(out, static_cast<uint32_t>(parts.size()));
  for (const auto& p : parts) {
    put_u64(out, p.size());
    out += p;
  }
  return out;
}

std::vector<std::string> unpack_parts(const std::string& bytes, size_t count, const std::string& where) {
  Reader r{bytes, where};
  const uint32_t n = r.get<uint32_t>("the part count");
  if (n != count) throw FormatError(fmt::format("{}: {} parts, expected {}", where, n, count));
  std::vector<std::string> parts;
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t len = r.get<uint64_t>(fmt::format("the length of part {}", i));
    if (len > bytes.size()) throw FormatError(fmt::format("{}: part {} claims {} bytes", where, i, len));
    parts.push_back(r.bytes(static_cast<size_t>(len), fmt::format("part {}", i)));
  }
  if (r.pos != bytes.size()) throw FormatError(fmt::format("{}: {} bytes after the last part", where, bytes.size() - r.pos));
  return parts;
}

std::string encode_bundle(const std::string& header_json, const std::vector<BundleRecord>& records,
                          const std::string& key) {
  std::string out(kMagic, 8);
  put_u32(out, kBundleFormat);
  put_u32(out, static_cast<uint32_t>(header_json.size()));
  out += header_json;
  put_u32(out, static_cast<uint32_t>(records.size()));
  for (const BundleRecord& r : records) {
    if (r.kind.size() > 0xffff || r.name.size() > 0xffff) throw ValueError("cache bundle: a record kind or name over 64 KiB");
    put_u16(out, static_cast<uint16_t>(r.kind.size()));
    out += r.kind;
    put_u16(out, static_cast<uint16_t>(r.name.size()));
    out += r.name;
    std::string z = zstd_compress(r.bytes);
    put_u64(out, r.bytes.size());
    put_u64(out, z.size());
    put_u64(out, XXH64(r.bytes.data(), r.bytes.size(), 0));
    out += z;
  }
  put_u64(out, XXH64(out.data(), out.size(), 0));
  if (key.empty()) {
    put_u8(out, 0);
  } else {
    std::string sig = hmac_sha256(key, out.data(), out.size());
    put_u8(out, static_cast<uint8_t>(sig.size()));
    out += sig;
  }
  return out;
}

void check_bundle_file_magic(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  std::ifstream f(path, std::ios::binary);
  char head[8] = {};
  f.read(head, sizeof head);
  if (f.gcount() == 8 && std::memcmp(head, kMagic, 8) != 0)
    throw FormatError(fmt::format("{}: not a Protean cache bundle (it does not start with {})", path, kMagic));
}

Bundle decode_bundle(const std::string& bytes, const std::string& where, const std::string& key) {
  Reader r{bytes, where};
  if (bytes.size() < 8 || bytes.compare(0, 8, kMagic, 8) != 0)
    throw FormatError(fmt::format("{}: not a Protean cache bundle (it does not start with {})", where, kMagic));
  r.pos = 8;
  const uint32_t format = r.get<uint32_t>("the format version");
  if (format != kBundleFormat)
    throw FormatError(fmt::format("{}: bundle format {}; this Protean {} reads format {} only (export the bundle again "
                                  "with this version)",
                                  where, format, version(), kBundleFormat));
  const uint32_t hlen = r.get<uint32_t>("the header length");
  if (hlen > kMaxHeaderBytes) throw FormatError(fmt::format("{}: a header of {} bytes (corrupt)", where, hlen));
  Bundle b;
  b.header = r.bytes(hlen, "the header");
  const uint32_t count = r.get<uint32_t>("the record count");
  struct Pending {
    std::string kind, name;
    uint64_t raw, sum;
    size_t at, stored;
  };
  std::vector<Pending> pending;
  // Pass 1: the records' framing (no decompression), so the file checksum is checked first.
  for (uint32_t i = 0; i < count; ++i) {
    const std::string rec = fmt::format("record {} of {}", i + 1, count);
    Pending p;
    p.kind = r.bytes(r.get<uint16_t>(rec + " kind length"), rec + " kind");
    p.name = r.bytes(r.get<uint16_t>(rec + " name length"), rec + " name");
    p.raw = r.get<uint64_t>(rec + " size");
    const uint64_t stored = r.get<uint64_t>(rec + " stored size");
    p.sum = r.get<uint64_t>(rec + " checksum");
    if (p.kind.empty()) throw FormatError(fmt::format("{}: {} has no kind", where, rec));
    if (p.raw > kMaxRecordBytes) throw FormatError(fmt::format("{}: {} claims {} bytes", where, rec, p.raw));
    if (stored > bytes.size() - r.pos)
      throw FormatError(fmt::format("{}: truncated: {} data needs {} bytes at offset {}, the file has {}", where, rec,
                                    stored, r.pos, bytes.size()));
    p.at = r.pos;
    p.stored = static_cast<size_t>(stored);
    r.pos += p.stored;
    pending.push_back(std::move(p));
  }
  const size_t body_end = r.pos;
  const uint64_t file_sum = r.get<uint64_t>("the file checksum");
  if (file_sum != XXH64(bytes.data(), body_end, 0))
    throw FormatError(fmt::format("{}: file checksum mismatch (the bundle is corrupt)", where));
  const size_t signed_end = r.pos;
  const uint8_t sig_len = r.get<uint8_t>("the signature length");
  if (sig_len != 0 && sig_len != kSigBytes)
    throw FormatError(fmt::format("{}: a signature of {} bytes (expected 0 or {})", where, sig_len, kSigBytes));
  std::string sig = r.bytes(sig_len, "the signature");
  if (r.pos != bytes.size())
    throw FormatError(fmt::format("{}: {} bytes after the end of the bundle", where, bytes.size() - r.pos));
  b.signed_ = sig_len != 0;
  if (b.signed_ && !key.empty()) {
    std::string want = hmac_sha256(key, bytes.data(), signed_end);
    b.signature_ok = CRYPTO_memcmp(want.data(), sig.data(), kSigBytes) == 0;
  }
  // Pass 2: decompress and check every record.
  for (size_t i = 0; i < pending.size(); ++i) {
    const Pending& p = pending[i];
    const std::string rec = fmt::format("{}: record {} of {} ({} '{}')", where, i + 1, count, p.kind, p.name);
    std::string raw = zstd_decompress(bytes.data() + p.at, p.stored, p.raw, rec);
    if (XXH64(raw.data(), raw.size(), 0) != p.sum) throw FormatError(fmt::format("{}: checksum mismatch", rec));
    b.records.push_back({p.kind, p.name, std::move(raw), p.stored});
  }
  return b;
}

std::string local_cpu_flags() { return xxh_hex(kernel_toolchain("bundle").cpu_features()); }

std::string signing_key() {
  const char* k = std::getenv("PROTEAN_CACHE_SIGNING_KEY");
  return k ? std::string(k) : std::string();
}

std::string signature_problem(const Bundle& b) {
  if (signing_key().empty()) return "";
  if (!b.signed_) return "PROTEAN_CACHE_SIGNING_KEY is set and the bundle is not signed";
  if (!b.signature_ok) return "the bundle's signature does not match PROTEAN_CACHE_SIGNING_KEY (another key, or tampered with)";
  return "";
}

std::string bundle_header_json(size_t records) {
  const std::string target = build_target();
  nlohmann::json h = {{"format", kBundleFormat},
                      {"protean_version", version()},
                      {"compiler", kernel_toolchain("bundle").compiler_identity()},
                      {"target", target},
                      {"created_unix", std::chrono::duration_cast<std::chrono::seconds>(
                                           std::chrono::system_clock::now().time_since_epoch()).count()},
                      {"records", records}};
  if (target == "native") h["cpu_flags_xxh64"] = local_cpu_flags();
  return h.dump();
}

std::string check_bundle_header(const std::string& header_json) {
  nlohmann::json h = nlohmann::json::parse(header_json, nullptr, false);
  if (!h.is_object()) return "the header is not a JSON object";
  auto str = [&](const char* k) {
    auto it = h.find(k);
    return it != h.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (!h.contains("format") || !h["format"].is_number_unsigned() || h["format"].get<uint64_t>() != kBundleFormat)
    return fmt::format("the header names another format (this Protean reads format {})", kBundleFormat);
  if (str("protean_version") != version())
    return fmt::format("made by Protean {}, this is Protean {}: artifacts are not shared across versions (export the "
                       "bundle again with this version)",
                       str("protean_version").empty() ? "?" : str("protean_version"), version());
  return "";
}

}  // namespace protean::cache


namespace protean::cache {
namespace {
KernelToolchain g_toolchain;
}
void set_kernel_toolchain(const KernelToolchain& toolchain) { g_toolchain = toolchain; }
const KernelToolchain& kernel_toolchain(const char* what) {
  if (!g_toolchain.compiler_identity || !g_toolchain.cpu_features || !g_toolchain.rebuild_kernel)
    throw RuntimeError(fmt::format("{}: no kernel toolchain is installed (the cpu backend installs it when the library "
                                   "loads)", what));
  return g_toolchain;
}
}  // namespace protean::cache
