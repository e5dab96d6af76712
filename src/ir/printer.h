// IR text printer. The form (graph.h has the full description; parser.h inverts it):
//
//   graph mlp(%x : f32[s0, 512], %w1 : f32[512, 64]):
//     %c0 : f32[64] = constant()
//     %0 : f32[s0, 64] = matmul(%x, %w1)  # mlp.cpp:4
//     %1 : f32[s0, 64], %2 : f32[s0, 64] = split(%0, dim=1, sizes=[32, 32])  # mlp.cpp:5
//     %3 : f32[s0, 64] = layer_norm(%1, None, None, normalized_shape=[64], eps=1e-05)
//     return (%3, %2)
//
// A node that owns subgraphs (cond) is followed by each subgraph in the same form, indented two
// spaces deeper than the node:
//     %4 : f32[s0, 64] = cond(%p, %3)
//       graph true_branch(%arg0 : f32[s0, 64]):
//         %0 : f32[s0, 64] = relu(%arg0)
//         return (%0)
//       graph false_branch(%arg0 : f32[s0, 64]):
//         return (%arg0)
//
// Guarantees: deterministic (golden tests compare it byte for byte; every line ends in '\n'); a value
// name that is not made of [A-Za-z0-9_.] is quoted (`%"args[2]"`); sizes and integer attributes print
// with sym::print; other attributes with ops::attr_to_string (strings are escaped). Constant data,
// strides and a node's function name are not printed.
#pragma once

#include <string>

#include "ir/graph.h"

namespace protean::ir {

/// The whole graph in text form (subgraphs included).
std::string print(const Graph& g);
/// One node as printed inside the graph (no indentation, no trailing newline, no subgraphs), for error
/// messages.
std::string print_node(const Graph& g, const Node& n);
/// `%x`, `%0`, `%"args[2]"`, or `None` for kNoValue.
std::string value_ref(const Graph& g, ValueId v);
/// `f32[s0, 512]`.
std::string type_str(const Value& v);
/// IR text of one attribute value (`3`, `[1, s0]`, `1e-05`, `true`, `"tanh"`, `f32`).
std::string attr_text(const ops::AttrValue& v);

}  // namespace protean::ir
