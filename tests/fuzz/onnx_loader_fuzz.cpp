// libFuzzer target: the ONNX loader (protobuf parse, graph conversion, attribute and initializer
// checks, input declarations). Every model it accepts names its inputs; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_util.h"
#include "protean/onnx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  protean::fuzz::expect_only_protean_errors("onnx_loader", [&] {
    auto model = protean::onnx::load_from_bytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.onnx");
    if (model->input_names().size() != model->inputs().size()) __builtin_trap();
  });
  return 0;
}
