// libFuzzer target: the PGO profile parser. A profile that parses dumps and parses back to itself
// (what the store writes after a merge is what it read).
#include <cstddef>
#include <cstdint>
#include <string>

#include "dynamic/pgo.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  protean::fuzz::expect_only_protean_errors("pgo_profile", [&] {
    using namespace protean::dynamic;
    Profile p = parse_profile(std::string(reinterpret_cast<const char*>(data), size), "fuzz.json");
    Profile back = parse_profile(dump_profile(p), "fuzz.json (dumped)");
    if (!(back == p)) __builtin_trap();
    Profile merged = p;
    merge(merged, back);  // joining a profile with itself changes nothing
    if (!(merged == p)) __builtin_trap();
  });
  return 0;
}
