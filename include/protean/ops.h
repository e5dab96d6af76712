// Operators (ATen names and semantics). Every function here is traceable: in eager code it runs a CPU
// kernel; while a function is captured it records a Graph IR node instead (same metadata either way).
//
// Conventions (PyTorch's):
//  * Broadcasting: trailing dims aligned; a dim of size 1 stretches; otherwise sizes must be equal
//    (ShapeError naming both shapes).
//  * Type promotion (torch.result_type): categories bool < integer < floating. Tensors with dim > 0
//    decide the type; 0-dim tensors and C++ scalars only raise the *category* (f16 tensor * 2.0 → f16;
//    i64 tensor * 2.5 → f32, the default float). Comparisons return bool; div of integers returns f32.
//  * Dims may be negative (counted from the end); out-of-range dims throw ValueError.
//  * Errors (ShapeError/TypeError/ValueError) name the op, the input shapes and dtypes, and what
//    would have been valid. Nothing aborts.
//  * Reductions take `dims` (empty = all dims) and `keepdim`.
//  * Threading: kernels use OpenMP with PROTEAN_NUM_THREADS threads (default: all cores).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "protean/tensor.h"

namespace protean {

using TensorList = std::vector<Tensor>;

// ---- pointwise unary -------------------------------------------------------------------------------
Tensor abs(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor floor(const Tensor& x);
/// approximate: "none" (x·Φ(x) via erf) or "tanh" (the tanh approximation), as torch.nn.functional.gelu.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
/// relu6(x + 3) / 6
Tensor hardsigmoid(const Tensor& x);
/// x · relu6(x + 3) / 6
Tensor hardswish(const Tensor& x);
Tensor log(const Tensor& x);
Tensor logical_not(const Tensor& x);
Tensor neg(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor relu(const Tensor& x);
/// Rounds half to even (torch.round).
Tensor round(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
/// Clamps to [min, max]; either bound may be absent.
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
/// Converts the element type (like Tensor.to(dtype)); floating → integer truncates toward zero.
/// Values the target cannot hold are defined as PyTorch on x86 gives them, on the interpreter and the
/// cpu backend alike: NaN, ±inf and values beyond int32 / int64 become that type's lowest value;
/// uint8 and int8 take the low 8 bits of the int64 conversion (300.0 → uint8 44, NaN → 0). The cuda
/// backend's conversions saturate to the target's range and map NaN to 0 (PyTorch on CUDA does the
/// same for int32 and int64). Bool is x != 0 (NaN → true).
Tensor cast(const Tensor& x, DType dtype);

// ---- pointwise binary (broadcasting + promotion) -----------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
/// True division (torch.div without rounding_mode).
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
/// Elementwise cond ? a : b; cond must be bool; a and b promote.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// Bitwise ops (torch.bitwise_*; src/ops/bitwise.cpp) on integer or bool tensors of one dtype (a and b
/// broadcast; a dtype mismatch or a floating input is a TypeError); the result has that dtype. Shifts
/// by a count outside [0, bits of the dtype) give 0 (left, logical right) or the sign fill (arithmetic
/// right) instead of C++'s undefined behaviour. `logical` right shifts read the bits as unsigned (zero
/// fill), e.g. a uint64 carried in i64; otherwise the sign is kept (torch.bitwise_right_shift).
Tensor bitwise_and(const Tensor& a, const Tensor& b);
Tensor bitwise_or(const Tensor& a, const Tensor& b);
Tensor bitwise_xor(const Tensor& a, const Tensor& b);
Tensor bitwise_not(const Tensor& a);
Tensor bitwise_left_shift(const Tensor& a, const Tensor& b);
Tensor bitwise_right_shift(const Tensor& a, const Tensor& b, bool logical = false);

/// A branch of cond: takes the operands, returns the branch's outputs.
using CondFn = std::function<TensorList(const TensorList& operands)>;
/// Data-dependent control flow without a graph break (mirrors torch.cond): `true_fn(operands)` when
/// the bool tensor `pred` (one element: 0-dim or all sizes 1) holds true, else `false_fn(operands)`.
///  * Eager: reads pred on the host and runs only the chosen branch; the other branch is traced on
///    fake operands (metadata only, no kernels) so that branches that disagree fail as they would
///    under compile (skipped when that branch reads tensor data on the host).
///  * Under capture: each branch is traced into a subgraph of its own (sharing the frame's symbolic
///    sizes and guards) and the graph holds one `cond` node owning both; backends read the predicate
///    when the graph runs and execute only the taken branch, so a predicate that flips between calls
///    neither guards, breaks nor recompiles. Outer tensors a branch reads without receiving them as
///    operands (closures, parameters) are lifted into operands automatically. Branches must be free
///    of side effects. A host read (item, data_ptr, graph_break) inside a branch is a graph break of
///    the whole frame (fullgraph: an error); in segmented execution such a cond runs the eager way.
///  * `operands` may be empty (branches that only close over outer tensors).
/// Both branches must return the same number of outputs with equal dtypes and sizes (symbolic sizes
/// compared through the ShapeEnv). Outputs are what the taken branch returns (contiguous when compiled).
/// Throws TypeError (pred not bool, output dtypes differ), ValueError (pred with more than one
/// element, output counts differ, an undefined operand or output) or ShapeError (output sizes differ),
/// naming the output index and both types. See docs/breaks.md.
TensorList cond(const Tensor& pred, const CondFn& true_fn, const CondFn& false_fn, const TensorList& operands);
/// Single-output form of cond.
Tensor cond(const Tensor& pred, const std::function<Tensor(const TensorList& operands)>& true_fn,
            const std::function<Tensor(const TensorList& operands)>& false_fn, const TensorList& operands);

/// Scalar operands are wrapped as 0-dim tensors whose dtype follows the promotion rule above.
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor pow(const Tensor& a, double b);
/// Wraps a C++ scalar for an op with `like` (dtype per the promotion rule). Traceable (a `full` node).
Tensor wrap_scalar(double value, const Tensor& like);

// ---- reductions ------------------------------------------------------------------------------------
/// `dtype` (optional) is the accumulation/output type; bool and integer inputs sum to i64 (torch.sum).
Tensor sum(const Tensor& x, const IntVec& dims = {}, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
/// Floating inputs only (TypeError otherwise, like torch.mean).
Tensor mean(const Tensor& x, const IntVec& dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, const IntVec& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const IntVec& dims = {}, bool keepdim = false);
Tensor prod(const Tensor& x, const IntVec& dims = {}, bool keepdim = false);
/// Variance with Bessel-style `correction` (1 = unbiased, torch.var default).
Tensor var(const Tensor& x, const IntVec& dims = {}, bool keepdim = false, int64_t correction = 1);
/// Index of the max (first on ties) along `dim`, or of the flattened tensor when dim is absent. i64.
Tensor argmax(const Tensor& x, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);

// ---- normalization -----------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
/// Normalizes over the trailing `normalized_shape` dims (torch.nn.functional.layer_norm); weight/bias
/// may be undefined, else shaped `normalized_shape`. The shape is SymInts, so generic code passes
/// `{x.size(-1)}` and a dynamic size stays symbolic. ShapeError when x's trailing dims differ.
Tensor layer_norm(const Tensor& x, const SymIntVec& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);
/// x / sqrt(mean(x², trailing dims) + eps) · weight (torch.nn.functional.rms_norm); eps defaults to
/// the dtype's machine epsilon. `normalized_shape` as for layer_norm.
Tensor rms_norm(const Tensor& x, const SymIntVec& normalized_shape, const Tensor& weight = {},
                std::optional<double> eps = std::nullopt);
/// Inference-mode batch norm over channel dim 1: (x - mean) / sqrt(var + eps) * w + b.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, double eps = 1e-5);
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight = {}, const Tensor& bias = {},
                  double eps = 1e-5);

// ---- linear algebra ------------------------------------------------------------------------------------
/// torch.matmul: 1-D/2-D/batched with broadcasting of batch dims. Floating dtypes.
Tensor matmul(const Tensor& a, const Tensor& b);
/// [B, n, k] x [B, k, m] → [B, n, m].
Tensor bmm(const Tensor& a, const Tensor& b);
/// x · weightᵀ + bias; weight is [out, in].
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// ---- convolution -------------------------------------------------------------------------------------
/// x [N, C, L], w [O, C/groups, K].
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& bias = {}, const IntVec& stride = {1},
              const IntVec& padding = {0}, const IntVec& dilation = {1}, int64_t groups = 1);
/// x [N, C, H, W], w [O, C/groups, kh, kw]. padding is symmetric per spatial dim ({ph, pw}).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = {}, const IntVec& stride = {1, 1},
              const IntVec& padding = {0, 0}, const IntVec& dilation = {1, 1}, int64_t groups = 1);
/// x [N, C, H, W], w [C, O/groups, kh, kw] (PyTorch layout).
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias = {},
                        const IntVec& stride = {1, 1}, const IntVec& padding = {0, 0},
                        const IntVec& output_padding = {0, 0}, int64_t groups = 1,
                        const IntVec& dilation = {1, 1});

// ---- pooling, resizing, padding ------------------------------------------------------------------------
Tensor max_pool2d(const Tensor& x, const IntVec& kernel_size, const IntVec& stride = {},
                  const IntVec& padding = {0, 0}, const IntVec& dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& x, const IntVec& kernel_size, const IntVec& stride = {},
                  const IntVec& padding = {0, 0}, bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& x, const IntVec& output_size);
/// Nearest-neighbour resize to output_size ({H, W}); source index = floor(dst · in / out).
Tensor upsample_nearest2d(const Tensor& x, const SymIntVec& output_size);
Tensor upsample_bilinear2d(const Tensor& x, const SymIntVec& output_size, bool align_corners = false);
/// pads: PyTorch order (last dim first: {left, right, top, bottom, ...}); mode constant|reflect|replicate.
Tensor pad(const Tensor& x, const SymIntVec& pads, const std::string& mode = "constant", double value = 0.0);

// ---- views and shape ops ------------------------------------------------------------------------------
Tensor view(const Tensor& x, const SymIntVec& shape);
Tensor reshape(const Tensor& x, const SymIntVec& shape);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor permute(const Tensor& x, const IntVec& dims);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
Tensor expand(const Tensor& x, const SymIntVec& sizes);
Tensor squeeze(const Tensor& x, const IntVec& dims = {});
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// Python slice semantics: negative start/end count from the end; out-of-range bounds clamp; step > 0.
Tensor slice(const Tensor& x, int64_t dim, const SymInt& start, const SymInt& end, const SymInt& step = 1);
Tensor select(const Tensor& x, int64_t dim, const SymInt& index);
/// Elements [start, start + length) of dim `dim` (a view; negative start counts from the end). Throws
/// ValueError when start is out of range or 0 <= length <= size - start fails. For a data-dependent
/// length (an unbacked SymInt from Tensor::item_symint under capture) the length bounds become
/// runtime assertions of the graph (protean::check) instead of guards, so it traces without a break.
Tensor narrow(const Tensor& x, int64_t dim, const SymInt& start, const SymInt& length);
Tensor cat(const TensorList& xs, int64_t dim = 0);
Tensor stack(const TensorList& xs, int64_t dim = 0);
/// Splits into pieces of the given sizes along dim (sum must equal the dim size).
TensorList split(const Tensor& x, const SymIntVec& sizes, int64_t dim = 0);
/// Splits into pieces of `split_size` (the last may be smaller), like torch.split(int). The sizes are
/// SymInt arithmetic (`split_size`, ..., last `n - (k-1)·split_size`): a symbolic dim stays symbolic.
/// Only the number of pieces k is read from the traced sizes, guarded `Eq(CeilDiv(n, split_size), k)`.
/// An empty dim gives one empty piece. ValueError for split_size <= 0.
TensorList split(const Tensor& x, const SymInt& split_size, int64_t dim = 0);
/// torch.chunk: pieces of ceil(n / chunks) (symbolic for a symbolic n), the last smaller; possibly
/// fewer than `chunks` pieces (n = 5, chunks = 4 gives 2, 2, 1), guarded like split. An empty dim
/// gives `chunks` empty pieces. ValueError for chunks <= 0.
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---- indexing -------------------------------------------------------------------------------------------
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// index_select that also takes indices in [-size, 0), read as size + index (ONNX Gather's semantics;
/// torch.index_select rejects them). index: integer, 0-D or 1-D. Out of [-size, size): ValueError on
/// the CPU, a device trap (a failed launch) on backend cuda. With wrap_negative false, index_select.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, bool wrap_negative);
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor cumsum(const Tensor& x, int64_t dim);

// ---- composite ops ----------------------------------------------------------------------------------------
/// softmax(q·kᵀ·scale + mask) · v over the last two dims; scale defaults to 1/sqrt(E); is_causal masks
/// j > i. mask is additive (float) or boolean (true = keep), broadcast to [.., L, S].
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = {}, bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);
/// One ONNX-semantics LSTM layer (forward, reverse or bidirectional). Shapes: X [T, N, I],
/// W [D, 4H, I], R [D, 4H, H], B [D, 8H] (Wb then Rb), h0/c0 [D, N, H]. Gate order i, o, f, c (ONNX),
/// activations sigmoid/tanh/tanh. Returns (Y [T, D, N, H], Y_h [D, N, H], Y_c [D, N, H]).
/// P [D, 3H] (optional): ONNX's peephole weights p_i, p_o, p_f: the input and forget gates add
/// p ⊙ c(t-1), the output gate p_o ⊙ c(t).
std::tuple<Tensor, Tensor, Tensor> lstm(const Tensor& X, const Tensor& W, const Tensor& R,
                                        const Tensor& B = {}, const Tensor& h0 = {}, const Tensor& c0 = {},
                                        const std::string& direction = "forward", const Tensor& P = {});

// ---- data-dependent -------------------------------------------------------------------------------------
/// Indices of non-zero elements, [n, rank] i64. Its size depends on data: under capture this is a graph
/// break, or an unbacked size when capture_scalar_outputs is on.
Tensor nonzero(const Tensor& x);

// ---- operators (libtorch-like) ----------------------------------------------------------------------------
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, double b);
Tensor operator<=(const Tensor& a, double b);
Tensor operator>(const Tensor& a, double b);
Tensor operator>=(const Tensor& a, double b);
/// A SymFloat operand (symint.h): plain, the same as the double; symbolic (a dynamic float under
/// capture), the op reads the graph's f64 value converted to a's dtype when a is floating, else to f32
/// (a Python float's promotion), so a new value reuses the graph.
Tensor operator+(const Tensor& a, const SymFloat& b);
Tensor operator-(const Tensor& a, const SymFloat& b);
Tensor operator*(const Tensor& a, const SymFloat& b);
Tensor operator/(const Tensor& a, const SymFloat& b);
Tensor operator+(const SymFloat& a, const Tensor& b);
Tensor operator-(const SymFloat& a, const Tensor& b);
Tensor operator*(const SymFloat& a, const Tensor& b);
Tensor operator/(const SymFloat& a, const Tensor& b);
Tensor operator<(const Tensor& a, const SymFloat& b);
Tensor operator<=(const Tensor& a, const SymFloat& b);
Tensor operator>(const Tensor& a, const SymFloat& b);
Tensor operator>=(const Tensor& a, const SymFloat& b);
/// The 0-dim tensor a SymFloat operand of `like` turns into: full({}, value, dtype) when plain, the
/// graph value converted to the dtype when symbolic (dtype: like's when floating, else f32).
Tensor scalar_operand(const SymFloat& v, const Tensor& like);

// ---- ops for reverse-mode rules and training (src/ops/autograd_ops.cpp) -----------------------------------------
/// x with source's slices added at `index` along `dim` (torch.index_add): x [.., L, ..], index i64 [n],
/// source [.., n, ..] of x's dtype. Repeated indices add in index order (deterministic).
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source);
/// x with src[i] added at position index[i] along `dim` (torch.scatter_add); index and src have x's rank.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);
/// torch.scatter_reduce: x with each src element combined into the position index names along `dim`
/// with `reduce` ("sum", "prod", "amax" or "amin"; NaN wins amax/amin); include_self = false starts a
/// position that is named from src alone. index (i64, x's rank, each dim <= src's) and src (x's dtype);
/// an index outside [-size, size) is a ValueError (negative ones count from the end). Positions never
/// named keep x. Repeated positions combine in index order (src/ops/scatter_reduce.cpp).
Tensor scatter_reduce(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, const std::string& reduce,
                      bool include_self = true);
/// Determinant of each square matrix of A [..., n, n] (floating) → [...] of A's dtype (torch.linalg.det):
/// LU factorization with partial pivoting, accumulated in double. n = 0 gives 1.
Tensor linalg_det(const Tensor& A);
/// Uniform [0, 1) numbers from a counter-based generator (Philox4x32-10): element i uses key `seed` and
/// counter `offset + i`, so the same (seed, offset) replays the same numbers — in eager code, in a
/// compiled graph and in a recomputed backward. Symbolic seed/offset stay graph values (no recompile).
Tensor philox_uniform(const SymIntVec& shape, const SymInt& seed, const SymInt& offset, DType dtype = DType::F32);
/// torch.nn.functional.dropout with an explicit counter-based mask: zeroes elements whose
/// philox_uniform(x.sizes(), seed, offset) number is < p, scales the rest by 1 / (1 - p). train = false
/// (or p = 0) returns x. Advance `offset` by x.numel() per call for fresh masks. ValueError unless 0 <= p <= 1.
Tensor dropout(const Tensor& x, double p, const SymInt& seed, const SymInt& offset, bool train = true);

// ---- numerics helpers -----------------------------------------------------------------------------------------
/// True when shapes match and |a - b| <= atol + rtol·|b| elementwise (NaNs equal when equal_nan).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
/// max |a - b| as double (after promotion to f64); shapes must broadcast.
double max_abs_diff(const Tensor& a, const Tensor& b);

/// Intra-op threads used by kernels (PROTEAN_NUM_THREADS, default: all cores).
int num_threads();
void set_num_threads(int n);

}  // namespace protean
