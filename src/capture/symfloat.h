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
  const void* owner;          ///< the FloatOwner (capture) that made it
  Tensor value;               ///< 0-dim f64 FakeTensor of that capture's graph
  uint64_t float_args;        ///< bit i: computed from dynamic float argument i (bit 63: any i >= 63)
  std::vector<SymInt> ints;   ///< symbolic SymInts it was computed from
};
}  // namespace protean::detail

namespace protean::capture {

/// The capture that owns symbolic SymFloats (the frame's Tracer).
class FloatOwner {
 public:
  virtual ~FloatOwner() = default;
  /// The float arguments in `float_args` (bit i = argument i) were specialized: guard them by value.
  virtual void specialize_floats(uint64_t float_args) = 0;
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
