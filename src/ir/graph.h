// Graph IR: the captured program. One flat list of nodes in execution order (SSA values), like an FX
// graph. Semantics every pass must respect:
//  * Values are tensors with a symbolic type (dtype + sizes whose entries are SymInts over the
//    ShapeEnv's symbols s0, s1, ... and unbacked u0, ...). Strides are not part of the type: every op
//    result is contiguous except outputs of view ops, whose strides follow from the op's meta function.
//  * Nodes are Placeholder (a graph input: tensor argument, parameter, buffer, or a dynamic float as a
//    0-dim f64 tensor), Constant (a real tensor baked into the graph), Call (one op from ops.def with
//    named attributes; attributes may mention symbols) and Output (the single last node).
//  * Node order is a valid topological order. A value is defined exactly once; optional op inputs that
//    are absent are kNoValue.
//  * Ops are pure except aliasing: view-op outputs alias their input's storage. No op mutates.
//  * Symbols are bound from the inputs at run time by the dispatcher (see SymbolBinding); a pass may
//    never introduce a symbol that is not bound.
//  * Every Call node carries the user's source location (file:line, function) where it was recorded.
//  * Control flow: a `cond` Call owns two subgraphs (Node::subgraphs: true branch, false branch). Its
//    inputs are the predicate (a 0-dim bool) then the operands; each branch is a complete Graph whose
//    placeholders take the operands in order (the same types) and whose outputs have the cond's output
//    types. Only the taken branch runs. Branch graphs share the parent's symbols (one ShapeEnv) and
//    never refer to the parent's values except through their placeholders. To a pass over the parent,
//    a cond is one opaque pure node; subgraphs are immutable (shared_ptr<const Graph>): a pass that
//    rewrites a branch replaces the pointer with a rewritten copy.
//
// Text form (printer.h / parser.h), one node per line:
//   graph mlp(%x : f32[s0, 512], %w1 : f32[512, 64]):
//     %0 : f32[s0, 64] = matmul(%x, %w1)  # mlp.cpp:4
//     %1 : f32[s0, 64] = gelu(%0, approximate="none")  # mlp.cpp:4
//     return (%1)
//   and a cond with its branches indented under it (graph <name>(...): ... return (...)):
//     %2 : f32[s0, 64] = cond(%p, %1)  # mlp.cpp:5
//       graph true_branch(%arg0 : f32[s0, 64]):
//         %0 : f32[s0, 64] = relu(%arg0)  # mlp.cpp:5
//         return (%0)
//       graph false_branch(%arg0 : f32[s0, 64]):
//         return (%arg0)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/source_location.h"
#include "ops/registry.h"

namespace protean::ir {

using ValueId = int32_t;
inline constexpr ValueId kNoValue = -1;


class Graph;

enum class NodeKind : uint8_t { Placeholder, Constant, Call, Output };

struct Value {
  std::string name;  // printed as %name; inputs keep their source name ("x", "self.w"), others a number
  DType dtype = DType::F32;
  SymIntVec sizes;
  SymIntVec strides;  // from the meta function (contiguous for non-views)
  int32_t node = -1;  // defining node index
  int32_t output_index = 0;
};

struct Node {
  NodeKind kind = NodeKind::Call;
  ops::OpKind op = ops::OpKind::add;  // Call only
  std::vector<ValueId> inputs;        // Call: op inputs (kNoValue for absent); Output: graph outputs
  std::vector<ValueId> outputs;       // Placeholder/Constant/Call results
  ops::Attrs attrs;                   // Call only
  core::SourceLocation loc;
  std::string source;  // Placeholder: the input's source ("x", "args[2]", "self.blocks.3.w")
  Tensor constant;     // Constant: the data (may be undefined in a graph parsed from text)
  std::vector<std::shared_ptr<const Graph>> subgraphs;  // Call to a control-flow op (cond): its branches
};

/// A captured graph. Build with the add_* methods; they keep values and nodes consistent.
class Graph {
 public:
  std::string name;  // the compiled function's name (printed in the header)

  ValueId add_placeholder(const std::string& source, DType dtype, SymIntVec sizes, SymIntVec strides = {});
  ValueId add_constant(const Tensor& t, const std::string& name_hint = "");
  /// Appends a Call; output types come from `metas` (the op's meta function result). `subgraphs`:
  /// the branches of a control-flow op (cond), empty for every other op.
  std::vector<ValueId> add_call(ops::OpKind op, std::vector<ValueId> inputs, ops::Attrs attrs,
                                const std::vector<TensorMeta>& metas, core::SourceLocation loc = {},
                                std::vector<std::shared_ptr<const Graph>> subgraphs = {});
  void set_outputs(std::vector<ValueId> outs);

  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Value>& values() const { return values_; }
  std::vector<Value>& values() { return values_; }
  const Value& value(ValueId v) const { return values_.at(static_cast<size_t>(v)); }
  const Node& producer(ValueId v) const { return nodes_.at(static_cast<size_t>(value(v).node)); }
  /// Values of Placeholder nodes, in order.
  std::vector<ValueId> inputs() const;
  /// The Output node's inputs (empty before set_outputs).
  std::vector<ValueId> outputs() const;
  /// Number of Call nodes.
  size_t num_calls() const;

  /// Rebuilds the graph keeping only `keep[i]` nodes, renumbering values densely (Call results are
  /// renamed %0, %1, ... in the new order, so equal graphs print equally). A kept node keeps its
  /// subgraphs (their own values are not renumbered). Used by passes.
  void compact(const std::vector<bool>& keep_node);

  /// Renames a value (the parser restores printed names). Numeric names are reserved for Call results.
  void rename_value(ValueId v, std::string name);

 private:
  ValueId new_value(DType dtype, SymIntVec sizes, SymIntVec strides, int32_t node, int32_t idx, std::string name);
  std::vector<Node> nodes_;
  std::vector<Value> values_;
  int32_t next_call_name_ = 0;  // Call results are named %0, %1, ... in creation order
};

/// True when `a` and `b` compute the same thing: equal text form (ir::print, subgraphs included)
/// and, for every Constant (subgraphs included), equal data (same tensor, or same dtype, sizes and
/// values). Constants without data compare by type only. Used by CSE (two conds) and verify mode.
bool equal_graphs(const Graph& a, const Graph& b);

/// Visits every graph nested in `g`'s nodes (depth first, not `g` itself).
void for_each_subgraph(const Graph& g, const std::function<void(const Graph&)>& fn);

}  // namespace protean::ir
