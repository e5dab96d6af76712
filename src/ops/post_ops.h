// Post-ops: an elementwise epilogue that an extern kernel applies to its result before storing it.
// They are the `post_ops` attribute of the fused extern ops (ops.def: conv1d_fused, conv2d_fused,
// conv_transpose2d_fused, linear_fused, matmul_fused), which the cpu backend's post-op fusion
// (src/backend/cpu/fuse_post_ops.h) builds from a conv/linear/matmul and the pointwise chain after it.
//
// Semantics. A fused call computes y = p_n(... p_2(p_1(base(in[0..k)))) ...), where base is the
// unfused op on its usual inputs and each p_i maps the output elementwise (shape and dtype never
// change). Extra inputs in[k..] are the operands of binary post-ops, referenced by index (#k):
//
//   relu                 max(x, 0)
//   sigmoid              1 / (1 + exp(-x))
//   tanh                 tanh(x)
//   swish(a)             x · sigmoid(a·x)           (silu = swish(1))
//   hardswish            x · min(max(x + 3, 0), 6) / 6
//   hardsigmoid          min(max(x + 3, 0), 6) / 6
//   gelu_erf             x/2 · (1 + erf(x/√2))
//   gelu_tanh            x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))
//   clamp(lo, hi)        min(max(x, lo), hi)        (lo may be -inf, hi inf)
//   linear(a, b)         a·x + b
//   add(#k) sub(#k) mul(#k) div(#k)
//                        x ∘ in[k]; in[k] has the output's dtype and broadcasts to the output's shape
//                        without growing it (a scalar, a per-channel vector, or a tensor of the
//                        output's shape); x is always the left operand
//   batch_norm(#w, #b, #mean, #var, eps)
//                        (x − mean[c]) / √(var[c] + eps) · w[c] + b[c] over the channel dim c = 1
//                        (the output has rank ≥ 2), operands 1-D; `_` stands for an absent w or b
//
// Text form (the attribute value, printed in the IR): entries separated by ", ", numbers in the
// shortest form that reads back exactly, e.g. "linear(0.5, 1), hardswish, add(#3)". Every extra
// input of a fused call is referenced exactly once.
//
// Kernels apply the list through oneDNN post-ops when the library runs the base op and accepts the
// list unchanged (same implementation and layout as without post-ops), otherwise with
// apply_post_ops() on the finished result; both compute the formulas above (rounding may differ).
// NaN and infinities follow eager: NaN passes through relu and clamp (x < lo ? lo : x), so a list
// with relu, clamp or hardsigmoid never goes to oneDNN, whose relu and clip map NaN to 0 / lo.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ops/registry.h"

namespace protean::ops {

enum class PostOpKind : uint8_t {
  relu, sigmoid, tanh, swish, hardswish, hardsigmoid, gelu_erf, gelu_tanh, clamp, linear,
  add, sub, mul, div, batch_norm
};

struct PostOp {
  PostOpKind kind = PostOpKind::relu;
  double alpha = 0;  ///< swish: a; clamp: lo; linear: a; batch_norm: eps
  double beta = 0;   ///< clamp: hi; linear: b
  /// Input indices of the operands: binary ops use [0]; batch_norm uses w, b, mean, var (-1 = absent).
  std::array<int, 4> operand{-1, -1, -1, -1};
  bool operator==(const PostOp& o) const = default;
};

/// Name as written in the text form ("hardswish", "add", ...).
std::string_view post_op_name(PostOpKind k);
/// True for add, sub, mul, div (one tensor operand).
bool is_binary(PostOpKind k);
/// True for the operand-free kinds (relu ... linear).
bool is_eltwise(PostOpKind k);

/// Parses the text form. Throws ValueError naming the entry that does not parse.
std::vector<PostOp> parse_post_ops(std::string_view text);
/// parse_post_ops through a per-thread cache of recent texts (kernels and meta functions parse the
/// same attribute on every call). The reference stays valid until this thread's next call.
const std::vector<PostOp>& parse_post_ops_cached(const std::string& text);
/// The text form of `ops` (parse_post_ops(post_ops_text(p)) == p).
std::string post_ops_text(const std::vector<PostOp>& ops);

/// Validates a fused call's post-op list against its inputs and output (meta functions): operands
/// are inputs first_operand.. (each referenced exactly once), have dtype `out_dtype` and broadcast to
/// `out` without growing it; batch_norm operands are 1-D of the channel count. `op` and `in` name
/// the call in the errors (ValueError for a bad list, ShapeError / TypeError for bad operands).
void check_post_ops(OpKind op, std::span<const Tensor> in, size_t first_operand, const std::vector<PostOp>& ops,
                    const SymIntVec& out, DType out_dtype);

/// Applies `ops` to `y` (a contiguous floating tensor the kernel just produced), in order, with plain
/// loops, and returns the result: a new contiguous tensor of y's shape and dtype, or y itself when
/// `ops` is empty (y may be overwritten). Operands are read from `in` by index, with broadcasting and
/// any strides.
Tensor apply_post_ops(const Tensor& y, const std::vector<PostOp>& ops, std::span<const Tensor> in);

/// A post-op list prepared for one contiguous f32 result of logical sizes `sizes` (the operands of
/// `in` converted to contiguous f32 once), applied in place with apply_post_ops' loops: to the whole
/// result (apply, parallel over blocks) or, on the calling thread alone, to the columns [c0, c1) of
/// the last dimension of every row (apply_columns: a GEMM's column slice) or to the rows [r0, r1)
/// (apply_rows: a GEMM's row slice; a row is the last dimension). `ops` and the operands
/// must outlive the object. Results equal apply_post_ops' (the same loops, NaN kept through relu).
class PostOpsF32 {
 public:
  /// A binary operand: contiguous f32 data and its element strides at the result's shape (0 along
  /// broadcast dims).
  struct Operand {
    Tensor data;
    IntVec strides;
  };
  PostOpsF32(const IntVec& sizes, const std::vector<PostOp>& ops, std::span<const Tensor> in);
  void apply(float* y) const;
  void apply_columns(float* y, int64_t c0, int64_t c1) const;
  void apply_rows(float* y, int64_t r0, int64_t r1) const;
  /// Whether every post-op of `ops` runs as a vector loop here (not sigmoid, tanh, swish, gelu, which
  /// run a scalar libm call per element and are faster in oneDNN).
  static bool vector_loops(const std::vector<PostOp>& ops);

 private:
  void apply_span(float* y, int64_t start, int64_t len, float* buf, float* buf2) const;
  /// Elements [begin, end) of the result, in spans of at most kBlock elements (post_ops.cpp; buf and
  /// buf2 hold kBlock floats each).
  void apply_range(float* y, int64_t begin, int64_t end, float* buf, float* buf2) const;
  IntVec sizes_;
  const std::vector<PostOp>* ops_;
  std::vector<Operand> first_, second_;
  int64_t n_ = 0, inner_ = 1;
};

/// Per-channel scale and shift of a batch_norm post-op, as contiguous f64 tensors of the channel
/// count: (x − mean)/√(var + eps)·w + b = x·scale + shift (the eager batch_norm's formula).
std::pair<Tensor, Tensor> batch_norm_scale_shift(const PostOp& p, std::span<const Tensor> in);

}  // namespace protean::ops
