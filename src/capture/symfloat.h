// Symbolic SymFloats (include/protean/symint.h): while a function is traced, a dynamic float argument
// is a 0-dim f64 graph input, and SymFloat arithmetic records 0-dim f64 ops on it. This header is the
// capture side: the frame's tracer owns the SymFloats it hands out and learns which float arguments
// a comparison (or a conversion to double) specialized, so the cache entry guards them by value.
#pragma once

#include <cstdint>
#include <vector>

#include "protean/symint.h"
#include "protean/tensor.h"

namespace protean::detail {
struct SymFloatNode {
  uint64_t owner;             ///< id of the FloatOwner (capture) that made it; ids are never reused
  Tensor value;               ///< 0-dim f64 FakeTensor of that capture's graph; released when it ends
  uint64_t float_args;        ///< bit i: computed from dynamic float argument i (bit 63: any i >= 63)
  std::vector<SymInt> ints;   ///< symbolic SymInts it was computed from
};
}  // namespace protean::detail

namespace protean::capture {

/// The capture that owns symbolic SymFloats (the frame's Tracer). A SymFloat may outlive its capture
/// (a lambda can keep a copy), so its node is never freed; when the capture ends, the nodes it made
/// drop their graph values (the fake tensors that point into the capture) and keep only the id, which
/// is never reused, so a stale SymFloat used in a later capture is an error and never a value of
/// another graph.
class FloatOwner {
 public:
  FloatOwner();
  virtual ~FloatOwner();
  FloatOwner(const FloatOwner&) = delete;
  FloatOwner& operator=(const FloatOwner&) = delete;
  /// The float arguments in `float_args` (bit i = argument i) were specialized: guard them by value.
  virtual void specialize_floats(uint64_t float_args) = 0;
  /// This capture's id (from 1, process-wide, never reused).
  uint64_t float_owner_id() const { return id_; }
  /// Records a node this capture made (its value is released when the capture ends).
  void adopt_float_node(detail::SymFloatNode* node) { nodes_.push_back(node); }

 private:
  uint64_t id_;
  std::vector<detail::SymFloatNode*> nodes_;
};

/// Makes `owner` this thread's FloatOwner for the scope's lifetime (nests).
class FloatOwnerScope {
 public:
  explicit FloatOwnerScope(FloatOwner* owner);
  ~FloatOwnerScope();
  FloatOwnerScope(const FloatOwnerScope&) = delete;
  FloatOwnerScope& operator=(const FloatOwnerScope&) = delete;

 private:
  FloatOwner* previous_;
};

/// A symbolic SymFloat for the dynamic float argument `arg` whose graph value is `value`.
SymFloat symbolic_float_arg(const Tensor& value, double hint, int32_t arg);

/// True while SymFloat arithmetic records a plain operand (full({}, v)): such a literal is a constant,
/// never a dynamic float's graph input, even when its value equals a dynamic float's traced value.
bool in_symfloat_literal();

}  // namespace protean::capture
