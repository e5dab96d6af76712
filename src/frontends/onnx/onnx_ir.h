// The ONNX importer's own in-memory form of a model: protobuf is parsed once at load into these plain
// structs (graphs, nodes, typed attributes, constant values), so forward() never touches protobuf.
//
// Value is what the evaluator keeps per ONNX value name: either a Tensor (real, or a FakeTensor under
// capture) or a *host value* — a rank-0/1 vector of SymInts (shape arithmetic: Shape, Size, Gather...)
// or of SymBools (Equal/Not on shapes, If conditions). Host values keep dynamic dims symbolic.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "protean/onnx.h"
#include "protean/symint.h"
#include "protean/tensor.h"

namespace protean::onnx::detail {

struct Graph;
struct Node;
struct Value;
struct RegionUse;
/// Inputs of a node as seen by an op function; nullptr for an optional input left out.
using Inputs = std::vector<const Value*>;
/// Evaluates one node (ops.cpp). Returns one Value per declared output (trailing ones may be missing).
using OpFn = std::vector<Value> (*)(const Node& n, const Inputs& in);

struct Attr {
  enum class Type { Float, Int, String, Tensor, Graph, Floats, Ints, Strings };
  Type type = Type::Int;
  double f = 0;
  int64_t i = 0;
  std::string s;
  Tensor t;
  std::shared_ptr<Graph> g;
  std::vector<double> floats;
  IntVec ints;
  std::vector<std::string> strings;
};
const char* attr_type_name(Attr::Type t);

struct Node {
  std::string name;
  std::string op_type;
  std::string domain;
  std::vector<std::string> inputs;   // "" = optional input left out
  std::vector<std::string> outputs;  // "" = optional output not requested
  std::map<std::string, Attr> attrs;
  int64_t opset = 0;
  /// The model file's own default-domain opset (opset differs when the version converter upgraded it).
  int64_t source_opset = 0;
  /// Names read from enclosing scopes by this node's subgraphs (If branches), for liveness.
  std::vector<std::string> captured;
  /// Values whose last use in this graph is this node (freed after it runs).
  std::vector<std::string> frees;
  /// The op's evaluator, resolved at load (null for Constant and If, which the model handles).
  OpFn fn = nullptr;
  /// Op type `protean.Region`: a use of a repeated block found at load (regions.h).
  std::shared_ptr<RegionUse> region;

  /// "'name' (OpType)", or "#index (OpType)" when the node has no name.
  std::string label() const;
  bool has_input(size_t i) const { return i < inputs.size() && !inputs[i].empty(); }
  const Attr* attr(const std::string& key) const;
  // Typed getters: a present attribute of another type is a FormatError naming the node.
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_float(const std::string& key, double dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  IntVec get_ints(const std::string& key, const IntVec& dflt = {}) const;
  std::optional<IntVec> opt_ints(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  const Tensor* get_tensor(const std::string& key) const;
  const Graph* get_graph(const std::string& key) const;
};

/// A host value or a tensor.
struct Value {
  enum class Kind { None, Tensor, Ints, Bools, Sequence };
  Kind kind = Kind::None;
  Tensor t;
  /// Kind::Sequence: an ONNX sequence of tensors (SequenceConstruct, SplitToSequence, ...), kept on
  /// the host as a list; only the sequence ops (takes_sequences()) accept one.
  std::vector<Tensor> seq;
  SymIntVec ints;
  std::vector<SymBool> bools;
  DType dtype = DType::I64;  // element type of a host value (I64/I32/... for ints, Bool for bools)
  bool scalar = false;       // rank 0 host value (one element)

  static Value tensor(Tensor t) {
    Value v;
    v.kind = Kind::Tensor;
    v.t = std::move(t);
    return v;
  }
  static Value host_ints(SymIntVec ints, DType dt = DType::I64, bool scalar = false) {
    Value v;
    v.kind = Kind::Ints;
    v.ints = std::move(ints);
    v.dtype = dt;
    v.scalar = scalar;
    return v;
  }
  static Value host_bools(std::vector<SymBool> b, bool scalar = false) {
    Value v;
    v.kind = Kind::Bools;
    v.bools = std::move(b);
    v.dtype = DType::Bool;
    v.scalar = scalar;
    return v;
  }
  static Value sequence(std::vector<Tensor> ts) {
    Value v;
    v.kind = Kind::Sequence;
    v.seq = std::move(ts);
    return v;
  }
  bool is_tensor() const { return kind == Kind::Tensor; }
  bool is_sequence() const { return kind == Kind::Sequence; }
  bool is_host() const { return kind == Kind::Ints || kind == Kind::Bools; }
  size_t host_size() const { return kind == Kind::Ints ? ints.size() : bools.size(); }
  /// "f32[1, 3, s0]" for tensors, "i64 host[2, s0]" for host values, "sequence of 3 tensors".
  std::string describe() const;
};

struct Graph {
  std::string name;
  std::vector<Node> nodes;
  std::vector<TensorInfo> inputs;  // graph inputs that are not initializers
  std::vector<TensorInfo> outputs;
  /// Initializers, Constant nodes and folded nodes.
  std::unordered_map<std::string, Value> constants;
  /// Names this graph reads from enclosing scopes (subgraphs only).
  std::vector<std::string> captured;
  /// Initializers and Constant outputs whose ONNX element type Protean carries in a wider dtype
  /// (is_carried_type): name → ONNX TensorProto.DataType.
  std::unordered_map<std::string, int32_t> carried;
};

/// ONNX TensorProto.DataType → DType (nullopt for types Protean lacks). ONNX's int16 and uint16 are
/// carried as i32, uint32 and uint64 as i64 (values at or above 2^63 are refused when read).
std::optional<DType> dtype_from_onnx(int32_t elem_type);
/// True for the ONNX types Protean carries in a wider dtype (int16, uint16, uint32, uint64).
bool is_carried_type(int32_t elem_type);
const char* onnx_type_name(int32_t elem_type);

}  // namespace protean::onnx::detail
