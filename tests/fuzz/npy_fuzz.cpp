// libFuzzer target: the .npy reader (core::load_npy_bytes, the parser behind load_npy). A tensor it
// returns has a shape whose bytes the input actually held.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/npy.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  protean::fuzz::expect_only_protean_errors("npy", [&] {
    protean::Tensor t = protean::core::load_npy_bytes(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    if (static_cast<size_t>(t.int_numel()) * t.itemsize() > size) __builtin_trap();  // more data than the input had
  });
  return 0;
}
