// Regional compilation under capture: a repeated child Module traced once per region key and recorded
// as one `call_region` node per use (docs/regions.md).
//
// The capture that records uses is a RegionHost: the frame's Tracer, or a RegionTracer while a
// region body is traced (regions nest). protean::call(child, ...) reaches detail::region_call, which
// asks the host of this thread:
//   1. Is the child's class a region type (CompileOptions::region_types) and the host's hook the
//      active trace hook (not a cond branch traced meanwhile)? Otherwise the call is traced inline.
//   2. The key without attributes: the child's type and its descendants' types, its parameters' and
//      buffers' names and traced types, its arguments' traced types and scalar values.
//   3. Each variant recorded for that key (in creation order) lists the attributes its trace read,
//      by dotted name relative to the child, with their values. The first whose values all equal the
//      child's current ones is a hit (the attributes are read again through the host, so the frame
//      guards them as it would inline). Otherwise a new variant is traced, and the log says what split
//      it from the nearest variant of the same type (`attribute self.blocks.3.causal: 1 vs 0`).
//   4. The host records `call_region(tensor args..., the child's parameters and buffers...)` with
//      the variant's body as its one subgraph: per-instance weights are inputs, never constants.
//
// A body is a graph over the host's ShapeEnv (symbols of the frame flow through, as in a cond
// branch); its placeholders are %arg0.. for the tensor arguments, then one per parameter/buffer of
// the child (`self.<relative name>`, registration order, undefined ones skipped). Variants live as
// long as one compile: a recompile has a fresh ShapeEnv and traces its regions again.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ops/dispatch.h"
#include "protean/compile.h"
#include "protean/module.h"
#include "sym/shape_env.h"

namespace protean::capture {

/// The body a region use recorded on the autograd tape refers to (its `body_id` tape attribute):
/// register_region_body hands out a process-unique id for `body` (kept while the body lives);
/// region_body returns it, or throws RuntimeError when it is gone. Used by call_region's reverse rule
/// (autograd/rules_region.cpp), which runs the body again under the tape and differentiates it.
int64_t register_region_body(const std::shared_ptr<const ir::Graph>& body);
std::shared_ptr<const ir::Graph> region_body(int64_t id);

/// One traced body of a region type.
struct RegionVariant {
  std::string type;                                            ///< demangled class name
  int index = 0;                                               ///< variant number within the type
  std::vector<std::pair<std::string, std::string>> key;        ///< (component, value), attributes excluded
  std::vector<std::pair<std::string, int64_t>> attributes;     ///< relative dotted name → value read
  std::shared_ptr<const ir::Graph> body;
  std::vector<TensorMeta> outputs;                             ///< the call_region node's output types
  std::vector<detail::OutValue> out_template;                  ///< the forward's flattened result (tensors replaced per use)
  int64_t uses = 0;
};

/// The variants of one compile, shared by the frame's Tracer and every RegionTracer below it.
struct RegionRegistry {
  const CompileOptions* opts = nullptr;
  std::string compile_id;
  const Module* root = nullptr;  ///< the compiled module (names attributes `self.<path>`), may be null
  std::map<std::string, std::vector<RegionVariant>> by_type;
  std::set<std::string> limit_warned;  ///< region types whose variant limit was reported
};

/// A capture that can record call_region nodes (see the header comment).
class RegionHost {
 public:
  virtual ~RegionHost() = default;
  /// The trace hook that records into this host's graph.
  virtual ops::TraceHook* region_hook() = 0;
  virtual RegionRegistry& region_registry() = 0;
  /// The type of `t` as this host's graph sees it: its fake's metadata, or the placeholder a real
  /// parameter maps to; a real tensor the graph does not know yet: its own metadata.
  virtual TensorMeta traced_meta(const Tensor& t) = 0;
  /// The dotted path of `m` below the compiled root ("blocks.3."), empty when unknown.
  virtual std::string module_path(const Module* m) = 0;
  /// Appends `call_region(inputs...)` owning `body`; returns the outputs as this host's fakes.
  virtual std::vector<Tensor> record_region(std::span<const Tensor> inputs, const ops::Attrs& attrs,
                                            const std::vector<TensorMeta>& outputs,
                                            std::shared_ptr<const ir::Graph> body) = 0;
};

/// The host of this thread (nullptr outside a capture with region types).
RegionHost* current_region_host();
class RegionHostScope {
 public:
  explicit RegionHostScope(RegionHost* h);
  ~RegionHostScope();
  RegionHostScope(const RegionHostScope&) = delete;
  RegionHostScope& operator=(const RegionHostScope&) = delete;

 private:
  RegionHost* prev_;
};

/// True when `type` (a demangled class name) is one of `types`: equal, or equal after dropping
/// namespaces on either side ("mylib::Block" matches "Block").
bool is_region_type(const std::vector<std::string>& types, const std::string& type);

/// The demangled name of a std::type_info name.
std::string demangled_type_name(const char* mangled);

/// One line per variant of `reg` for logs and tests: `Block#0 (uses 12): attributes {causal=1}`.
std::string describe_regions(const RegionRegistry& reg);

}  // namespace protean::capture
