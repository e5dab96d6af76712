// Partitioner of a joint forward + backward graph (value_and_grad / compile_train_step traced into
// one graph): decides which forward values the backward keeps (saved) and which it recomputes from
// saved ones, as a minimum cut — the save-vs-recompute choice of PyTorch's min-cut rematerialization
// partitioner, applied inside one frame.
//
// Network: each forward value v is an edge v_in → v_out of capacity bytes(v): its sizes evaluated with
// each symbol at PartitionOptions::size_at (the largest size the frame is known to see: a mark's max
// or the PGO profile's observed max), else at its hint, so a frame compiled at a short length does not
// save what is cheap only there; an op's inputs connect to its outputs with infinite capacity; graph inputs, constants and
// the outputs of ops that must not be recomputed (kExtern: matmul/linear/conv; kRandom; reductions;
// pooling, scans, attention, data-dependent and control-flow ops) are fed from the source; values the
// backward reads drain to the sink. Values that are graph outputs anyway cost nothing to keep. A
// recomputable value that the backward reads in a kernel that cannot fuse its computation (a matmul,
// attention, pooling, an indexing op...; directly or through views) is fed from the source too:
// recomputing it would cost a kernel writing it in full again (PyTorch's partitioner likewise never
// recomputes what the backward materializes). A view of a kept value is never copied into the
// backward: it costs nothing to keep. The cut
// taken is the source-side-minimal one (what is reachable from the source in the residual network of a
// maximum flow), which does not depend on the order flows were found in: ties are deterministic.
//
// Rewrite: every backward use of a forward value that is not saved reads a copy recomputed right before
// its first backward use, from saved values (the copies' lines say `[bwd of file:line]`); forward nodes
// left without users are then removed by DCE. Backward nodes are those whose core::SourceLocation has backward set.
//
// `memory_budget` (0-1, like activation_memory_budget): when the saved bytes exceed budget × the
// bytes the backward reads, the largest recomputable saved values are recomputed too until they fit
// (or nothing recomputable is left). PROTEAN_LOGS=partition prints one line per saved value:
//   saved f32[s0, 1024] gelu at mlp.cpp:12 (4 MiB at s0=1024)
// (the bytes at the values the capacities used).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace protean::ir {

struct PartitionOptions {
  std::optional<double> memory_budget;  // fraction in (0, 1]; none = the min cut as is
  /// Symbol name ("s0") → the value byte capacities evaluate it at (a mark's or the PGO profile's max);
  /// symbols not listed are taken at their hints. Values below 0 are ignored.
  std::unordered_map<std::string, int64_t> size_at = {};
};

struct PartitionResult {
  int64_t saved_values = 0;       // forward values the backward reads as they are
  int64_t recomputed_nodes = 0;   // nodes copied into the backward
  int64_t saved_bytes = 0;        // at size_at, else the hints
  std::vector<std::string> lines; // the log lines (also emitted under PROTEAN_LOGS=partition)
};

/// True when `g` has backward nodes (core::SourceLocation::backward).
bool has_backward(const Graph& g);
/// Partitions `g` in place (a no-op without backward nodes). Throws ValueError for a budget outside (0, 1].
PartitionResult partition(Graph& g, const PartitionOptions& options = {});

}  // namespace protean::ir
