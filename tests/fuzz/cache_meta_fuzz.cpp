// libFuzzer target: the artifact cache's entry metadata check (the .json read before any byte of a
// cached library). It must answer every text with "" or a reason, never throw, and accept only a
// text that names the key and the source hash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cache/kernel_cache.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const uint64_t key = 0x00ab00cd00ef0012ull;
  const std::string source = "extern \"C\" void kernel0() {}\n";  // its xxh64 is in the seeds
  try {
    uint64_t so_bytes = 0;
    std::string sum;
    std::string why = protean::cache::check_entry_meta(text, key, source, so_bytes, sum);
    if (why.empty() && (sum.empty() || text.find(protean::cache::key_hex(key)) == std::string::npos)) __builtin_trap();
    (void)protean::cache::check_entry_meta(text, key, "", so_bytes, sum);
  } catch (...) {
    __builtin_trap();  // documented never to throw
  }
  return 0;
}
