// The eager tape and the backward engine (include/protean/autograd.h describes the semantics).
#pragma once

#include <atomic>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ops/registry.h"
#include "ops/tape.h"
#include "protean/autograd.h"

namespace protean::autograd {

/// What the tape keeps of a node for its rule (derivatives.def's `saves` column).
enum Saves : uint8_t { SaveNone = 0, SaveIn = 1, SaveOut = 2, SaveInOut = 3 };

struct Node;

/// Per-tensor autograd state (TensorImpl::autograd).
struct AutogradMeta {
  std::shared_ptr<Node> grad_fn;  // null for a leaf
  int output_nr = 0;
  Tensor grad;  // accumulated by backward() (leaves only)
};

/// Where an input's gradient goes: a node's output, or a leaf's grad.
struct Edge {
  std::shared_ptr<Node> fn;
  int output_nr = 0;
  std::shared_ptr<AutogradMeta> leaf;
  bool defined() const { return fn || leaf; }
};

/// One recorded op call.
struct Node {
  ops::OpKind op{};
  ops::Attrs attrs;
  std::vector<Tensor> in;        // saved inputs (detached), when the rule saves them
  std::vector<TensorMeta> in_meta;
  std::vector<bool> in_defined;
  std::vector<Tensor> out;       // saved outputs (detached), when the rule saves them
  std::vector<TensorMeta> out_meta;
  // The storage version (protean/tensor_version.h) of each saved input and output when it was saved
  // (kNotVersioned for none, or a capture-time fake): a rule that reads one written in place since
  // gets an error instead of the new values (torch's saved-variable version check).
  static constexpr uint64_t kNotVersioned = ~uint64_t{0};
  std::vector<uint64_t> in_version, out_version;
  std::vector<Edge> next;        // one per input
  core::SourceLocation loc;             // the forward op's user line (under capture)
  uint64_t seq = 0;              // recording order: backward runs newest first
  bool released = false;         // saved tensors freed by a backward
};

/// What a rule sees.
struct GradCtx {
  const Node& node;
  std::vector<Tensor> g;  // gradient of each output (undefined: the output got none)
  const ops::Attrs& attrs() const { return node.attrs; }
  /// Saved input i (NotImplementedError-free: rules only read what their row saves).
  const Tensor& in(size_t i) const;
  const Tensor& out(size_t i) const;
  const SymIntVec& in_sizes(size_t i) const { return node.in_meta.at(i).sizes; }
  DType in_dtype(size_t i) const { return node.in_meta.at(i).dtype; }
  bool in_defined(size_t i) const { return node.in_defined.at(i); }
  /// True when input i's gradient is used (it has an edge).
  bool needs(size_t i) const { return i < node.next.size() && node.next[i].defined(); }
  size_t num_inputs() const { return node.in_meta.size(); }
};
using RuleFn = std::vector<Tensor> (*)(const GradCtx&);

/// The table row of an op.
struct DerivativeRow {
  Derivative kind = Derivative::Unsupported;
  Saves saves = SaveNone;
  RuleFn rule = nullptr;
  const char* note = "";
  bool decided = false;  // false: derivatives.def has no row for the op (a build error via static_assert)
};
const DerivativeRow& derivative_row(ops::OpKind op);

namespace detail {
using ops::t_grad_enabled;  // grad mode lives in the op layer (ops/tape.h)
/// True when an op on `in` must be recorded (grad mode on and an input requires grad).
inline bool should_record(std::span<const Tensor> in) { return ops::tape_should_record(in); }
/// Records `op` (called by ops::call after the op ran or was traced).
void record(ops::OpKind op, std::span<const Tensor> in, const ops::Attrs& attrs, std::vector<Tensor>& outs);
/// While a rule runs under capture: the forward line its ops are attributed to (null otherwise).
const core::SourceLocation* backward_provenance();
}  // namespace detail

}  // namespace protean::autograd
