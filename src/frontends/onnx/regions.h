// Repeated blocks of an ONNX model found at load, compiled as regions (docs/regions.md, "ONNX models").
//
// A transformer's layers, or the equal units of a convolutional stage, are the same nodes with the
// same attributes and weight shapes but different weights. find_regions looks for them in the
// top-level graph after constant folding:
//   1. Each node gets a signature: op type, domain, attributes (tensor attributes by content), and
//      per input whether it is left out, a constant (tensors by dtype and shape, host values by value)
//      or a computed value.
//   2. For a seed signature that occurs r >= 2 times, the r nodes are grown in lock step into r
//      instances: along inputs (the r producers must be distinct free nodes of one signature) and
//      along outputs (consumers matched by input slot and signature, in node order). A value the r
//      instances share (a mask computed once) is an input of each, never part of one.
//   3. A candidate is checked: every instance wired identically (internal edges, external inputs
//      numbered by first use), each constant slot either equal in every instance (a constant of the
//      body) or a float tensor that differs (a per-instance weight: an input of each use), and each
//      instance convex (no path leaves it and comes back). The best candidate (nodes saved:
//      size × (r − 1)) is taken; the search repeats on the nodes left.
//   4. Each instance becomes one node of op type `protean.Region` (RegionUse) at a topological
//      position of the contracted graph; its nodes move into its body graph.
// The structural hash of a group (signatures, wiring, shared constants' contents) names its region
// type, so equal blocks of two models share a compiled body and different ones never do.
//
// At run time a use traces inline (eager, or a compile with CompileOptions::auto_regions off), or,
// under a capture with auto regions, goes through protean::detail::auto_region_call: the body is
// traced once per region key and each use records one call_region whose inputs are its external
// values and its weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_ir.h"
#include "protean/module.h"

namespace protean::onnx::detail {

/// One use of a region: the Node of op type `protean.Region` points at it. Node::inputs are the
/// external values (in body order), Node::outputs the values used outside the block.
struct RegionUse {
  std::string type;                 ///< region type: "onnx.block<k>.<structural hash, 8 hex digits>"
  int group = 0;                    ///< index into Model's region list
  int instance = 0;                 ///< which use of the group (0-based, in graph order)
  std::string site;                 ///< "nodes 'first'..'last'" for logs
  std::shared_ptr<Graph> body;      ///< the block's nodes (inputs: Node::inputs; outputs: Node::outputs)
  std::vector<std::string> weights; ///< constant names that are per-instance weights, in slot order
  /// Holds the weights as buffers w0, w1, ... (the same tensors as the graph constants): what
  /// auto_region_call passes as the use's parameters.
  std::shared_ptr<Module> module;
};

/// What find_regions found, per group.
struct RegionGroupInfo {
  std::string type;
  int64_t uses = 0;
  int64_t nodes = 0;    ///< nodes per use
  int64_t weights = 0;  ///< per-instance weight inputs per use
  std::vector<std::string> sites;
};

/// Finds repeated blocks in `g` (top level) and contracts each use into a `protean.Region` node
/// (see the header comment). Returns one entry per group (empty: nothing found, `g` unchanged).
/// `min_nodes`: the fewest nodes a block must have; `min_saved`: the fewest nodes a group must save
/// (nodes per use × (uses − 1)).
std::vector<RegionGroupInfo> find_regions(Graph& g, int64_t min_nodes, int64_t min_saved);

/// The default of `min_saved` (PROTEAN_ONNX_REGION_MIN_SAVED overrides it). A region body is a C++
/// translation unit of its own, one more compiler run, while a flat compile already builds equal
/// kernels once (kernel dedup): measured on this machine (bench/results/onnx_regions_2026-12-02*.json,
/// docs/regions.md), 2 uses of a 49- or 53-node block (tiny GPT-2, PP-OCRv4 rec's SVTR neck) cost that
/// run and saved less (cold +2% / +27%, steady equal / -5%); 12 uses (a 12-layer GPT-2) compiled 4%
/// slower cold and ran 40% faster steady. So a group must save at least 4 uses' worth of a layer.
inline constexpr int64_t kRegionMinSavedNodes = 200;

/// Points every use's weight module at the current graph constants (after they moved to a device).
void refresh_region_weights(Graph& g);

}  // namespace protean::onnx::detail
