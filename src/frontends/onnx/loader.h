// Parsing an ONNX ModelProto into the importer's IR (onnx_ir.h), with every structural check a
// malformed file can fail: protobuf parse errors, missing graph, bad tensors (size/type mismatch,
// external data), bad attribute types, dangling or duplicated value names.
#pragma once

#include <memory>
#include <string>

#include "frontends/onnx/onnx_ir.h"

namespace protean::onnx::detail {

struct ParsedModel {
  std::shared_ptr<Graph> graph;
  int64_t opset = 0;  // default domain
  int64_t ir_version = 0;
  std::string producer;
};

/// Parses serialized ModelProto bytes. `file` names the model in error messages.
/// Throws FormatError (malformed), NotImplementedError (a valid but unsupported construct).
ParsedModel parse_model(const std::string& bytes, const std::string& file);

}  // namespace protean::onnx::detail
