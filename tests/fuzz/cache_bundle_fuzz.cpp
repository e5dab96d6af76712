// libFuzzer target: the cache bundle decoder (bundle files, `protean cache import | show`, and the
// values of the Redis artifact tier). Bad input must be a protean::Error; an accepted bundle must
// round-trip. Each input is tried as is and with a correct file checksum and an empty signature
// appended, so the fuzzer gets past the checksum to the record framing and the zstd frames.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "cache/bundle.h"
#include "fuzz_util.h"
#include "protean/error.h"

namespace {
void check(const std::string& bytes, const std::string& key) {
  using namespace protean::cache;
  Bundle b;
  try {
    b = decode_bundle(bytes, "fuzz", key);
  } catch (const protean::Error&) {
    return;
  }
  (void)check_bundle_header(b.header);
  for (const BundleRecord& r : b.records) {
    try {
      (void)unpack_parts(r.bytes, 3, "fuzz record");
    } catch (const protean::Error&) {
    }
  }
  // Round trip: what was accepted encodes to a bundle that decodes to the same records.
  Bundle again = decode_bundle(encode_bundle(b.header, b.records, key), "fuzz again", key);
  if (again.header != b.header || again.records.size() != b.records.size()) __builtin_trap();
  for (size_t i = 0; i < b.records.size(); ++i)
    if (again.records[i].kind != b.records[i].kind || again.records[i].name != b.records[i].name ||
        again.records[i].bytes != b.records[i].bytes)
      __builtin_trap();
  if (!key.empty() && !again.signature_ok) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  try {
    check(raw, "");
    std::string fixed = raw;
    const uint64_t sum = XXH64(fixed.data(), fixed.size(), 0);
    fixed.append(reinterpret_cast<const char*>(&sum), 8);
    fixed.push_back('\0');
    check(fixed, "");
    check(fixed, "fuzz-key");
  } catch (const protean::Error&) {
    __builtin_trap();  // a round trip of an accepted bundle failed
  }
  return 0;
}
