// Graph verifier: checks the invariants of graph.h. Run between passes in tests and debug builds
// (PassOptions::verify) and on graphs parsed from text.
//
// Checks, in order, throwing protean::CompileError naming the node (its printed line) on the first
// violation:
//  * structure: exactly one Output node and it is last; Placeholder/Constant nodes define one value
//    and have no inputs; every value is defined by exactly one node (no multiple definitions, no
//    dangling value that no node defines, no reference to a value that does not exist); value names
//    are unique and non-empty;
//  * order: every input is defined by an earlier node (no use before def); graph outputs are values;
//  * arity: a Call's input and output counts match ops.def (variadic ops need at least one input);
//  * control flow: only a control-flow op owns subgraphs; a cond has a 0-dim bool predicate (input 0),
//    two subgraphs (true, false), each verified as a graph of its own, whose placeholders match the
//    operand types and whose outputs match the node's output types (the error names the output index
//    and both types);
//  * types: re-running the op's meta function on fake tensors built from the input types gives the
//    recorded dtypes and sizes (symbolic sizes compare by expression node, after simplification).
//    The meta function runs in a scratch ShapeEnv (nothing is recorded in the capture's); a node whose
//    meta function would need a guard to decide (e.g. s0 == s1) is not type-checked. Ops without a
//    meta function are skipped.
#pragma once

#include "ir/graph.h"

namespace protean::ir {

struct VerifyOptions {
  /// Re-run meta functions and compare output types (the most expensive check).
  bool check_types = true;
};

void verify(const Graph& g, const VerifyOptions& options = {});

/// A FakeTensor (metadata only, no storage) with `v`'s dtype, sizes and strides.
Tensor fake_tensor(const Value& v);

}  // namespace protean::ir
