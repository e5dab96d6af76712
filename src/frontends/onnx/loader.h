// Parsing an ONNX ModelProto into the importer's IR (onnx_ir.h), with every structural check a
// malformed file can fail: protobuf parse errors, missing graph, bad tensors (size/type mismatch,
// external data), bad attribute types, dangling or duplicated value names.
#pragma once

#include <memory>
#include <string>

#include "frontends/onnx/onnx_ir.h"

namespace onnx {
class TensorProto;
}

namespace protean::onnx::detail {

/// Models importing a default-domain opset below this are upgraded at load to kUpgradeOpset with
/// ONNX's version converter (libonnx); the importer's evaluators handle kMinNativeOpset..kMaxOpset.
constexpr int64_t kMinNativeOpset = 7;
constexpr int64_t kUpgradeOpset = 13;
constexpr int64_t kMaxOpset = 21;

struct ParsedModel {
  std::shared_ptr<Graph> graph;
  int64_t opset = 0;           // default domain, as the importer sees it (after any upgrade)
  int64_t original_opset = 0;  // default domain, as the file imports it
  int64_t ir_version = 0;
  std::string producer;
  /// XXH64 chain over the external data files the initializers read (0 when self-contained).
  uint64_t external_hash = 0;
  int64_t external_files = 0;
};

/// Parses serialized ModelProto bytes. `file` names the model in error messages. `base_dir` is the
/// model file's directory: tensors with external data (TensorProto.data_location = EXTERNAL) are
/// memory-mapped from files there (relative locations that stay inside it; offset/length checked);
/// empty refuses external data. Models below kMinNativeOpset are upgraded with ONNX's converter.
/// Throws FormatError (malformed), NotImplementedError (a valid but unsupported construct).
ParsedModel parse_model(const std::string& bytes, const std::string& file, const std::string& base_dir = "");

/// One TensorProto (raw or typed data) as a Tensor; `file` and `what` name it in errors. The same
/// conversion the loader applies to initializers (used by the conformance runner for test data).
/// Throws FormatError (size mismatch, negative dim) or NotImplementedError (element type Protean lacks,
/// external data).
Tensor tensor_from_proto(const ::onnx::TensorProto& tp, const std::string& file, const std::string& what);

}  // namespace protean::onnx::detail
