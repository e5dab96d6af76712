// The public op functions (ops.h): each packs its arguments into tensor inputs + named attributes and
// goes through ops::call. This file fixes the attribute names that meta functions, kernels, the IR
// printer/parser and the code generators read (they match the comments in ops.def).
#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "ops/dispatch.h"
#include "protean/ops.h"

namespace protean {

using ops::Attrs;
using ops::OpKind;
using ops::call;
using ops::call1;

namespace {
SymIntVec sv(const IntVec& v) { return to_symint_vec(v); }
}  // namespace

// ---- pointwise unary -----------------------------------------------------------------------------
#define PROTEAN_UNARY(NAME) \
  Tensor NAME(const Tensor& x) { return call1(OpKind::NAME, {x}); }
PROTEAN_UNARY(abs)
PROTEAN_UNARY(ceil)
PROTEAN_UNARY(cos)
PROTEAN_UNARY(erf)
PROTEAN_UNARY(exp)
PROTEAN_UNARY(floor)
PROTEAN_UNARY(hardsigmoid)
PROTEAN_UNARY(hardswish)
PROTEAN_UNARY(log)
PROTEAN_UNARY(logical_not)
PROTEAN_UNARY(neg)
PROTEAN_UNARY(reciprocal)
PROTEAN_UNARY(relu)
PROTEAN_UNARY(round)
PROTEAN_UNARY(rsqrt)
PROTEAN_UNARY(sigmoid)
PROTEAN_UNARY(sign)
PROTEAN_UNARY(silu)
PROTEAN_UNARY(sin)
PROTEAN_UNARY(sqrt)
PROTEAN_UNARY(tanh)
#undef PROTEAN_UNARY

Tensor gelu(const Tensor& x, const std::string& approximate) {
  if (approximate != "none" && approximate != "tanh")
    throw ValueError(fmt::format("gelu: approximate must be \"none\" or \"tanh\", got \"{}\"", approximate));
  return call1(OpKind::gelu, {x}, {{"approximate", approximate}});
}
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  Attrs a;
  if (min) a.set("min", *min);
  if (max) a.set("max", *max);
  return call1(OpKind::clamp, {x}, a);
}
Tensor cast(const Tensor& x, DType dtype) { return call1(OpKind::cast, {x}, {{"dtype", dtype}}); }

// ---- pointwise binary ---------------------------------------------------------------------------
#define PROTEAN_BINARY(NAME) \
  Tensor NAME(const Tensor& a, const Tensor& b) { return call1(OpKind::NAME, {a, b}); }
PROTEAN_BINARY(add)
PROTEAN_BINARY(sub)
PROTEAN_BINARY(mul)
PROTEAN_BINARY(div)
PROTEAN_BINARY(pow)
PROTEAN_BINARY(maximum)
PROTEAN_BINARY(minimum)
PROTEAN_BINARY(eq)
PROTEAN_BINARY(ne)
PROTEAN_BINARY(lt)
PROTEAN_BINARY(le)
PROTEAN_BINARY(gt)
PROTEAN_BINARY(ge)
PROTEAN_BINARY(logical_and)
PROTEAN_BINARY(logical_or)
#undef PROTEAN_BINARY
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  return call1(OpKind::where, {cond, a, b});
}

Tensor wrap_scalar(double value, const Tensor& like) {
  DType t = like.dtype();
  bool whole = value == static_cast<double>(static_cast<int64_t>(value));
  DType d;
  if (is_floating(t)) d = t;
  else if (!whole) d = DType::F32;
  else if (t == DType::Bool) d = DType::I64;
  else d = t;
  return full({}, value, d);
}
Tensor add(const Tensor& a, double b) { return add(a, wrap_scalar(b, a)); }
Tensor sub(const Tensor& a, double b) { return sub(a, wrap_scalar(b, a)); }
Tensor mul(const Tensor& a, double b) { return mul(a, wrap_scalar(b, a)); }
Tensor div(const Tensor& a, double b) { return div(a, wrap_scalar(b, a)); }
Tensor pow(const Tensor& a, double b) { return pow(a, wrap_scalar(b, a)); }

// ---- reductions ---------------------------------------------------------------------------------
namespace {
Attrs red_attrs(const IntVec& dims, bool keepdim) { return {{"dims", sv(dims)}, {"keepdim", keepdim}}; }
}  // namespace
Tensor sum(const Tensor& x, const IntVec& dims, bool keepdim, std::optional<DType> dtype) {
  Attrs a = red_attrs(dims, keepdim);
  if (dtype) a.set("dtype", *dtype);
  return call1(OpKind::sum, {x}, a);
}
Tensor mean(const Tensor& x, const IntVec& dims, bool keepdim) { return call1(OpKind::mean, {x}, red_attrs(dims, keepdim)); }
Tensor amax(const Tensor& x, const IntVec& dims, bool keepdim) { return call1(OpKind::amax, {x}, red_attrs(dims, keepdim)); }
Tensor amin(const Tensor& x, const IntVec& dims, bool keepdim) { return call1(OpKind::amin, {x}, red_attrs(dims, keepdim)); }
Tensor prod(const Tensor& x, const IntVec& dims, bool keepdim) { return call1(OpKind::prod, {x}, red_attrs(dims, keepdim)); }
Tensor var(const Tensor& x, const IntVec& dims, bool keepdim, int64_t correction) {
  Attrs a = red_attrs(dims, keepdim);
  a.set("correction", SymInt(correction));
  return call1(OpKind::var, {x}, a);
}
Tensor argmax(const Tensor& x, std::optional<int64_t> dim, bool keepdim) {
  Attrs a;
  if (dim) a.set("dim", SymInt(*dim));
  a.set("keepdim", keepdim);
  return call1(OpKind::argmax, {x}, a);
}

// ---- normalization ------------------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim) { return call1(OpKind::softmax, {x}, {{"dim", SymInt(dim)}}); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return call1(OpKind::log_softmax, {x}, {{"dim", SymInt(dim)}}); }
Tensor layer_norm(const Tensor& x, const SymIntVec& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  return call1(OpKind::layer_norm, {x, weight, bias}, {{"normalized_shape", normalized_shape}, {"eps", eps}});
}
Tensor rms_norm(const Tensor& x, const SymIntVec& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  Attrs a{{"normalized_shape", normalized_shape}};
  if (eps) a.set("eps", *eps);
  return call1(OpKind::rms_norm, {x, weight}, a);
}
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, double eps) {
  return call1(OpKind::batch_norm, {x, weight, bias, running_mean, running_var}, {{"eps", eps}});
}
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps) {
  return call1(OpKind::group_norm, {x, weight, bias}, {{"groups", SymInt(groups)}, {"eps", eps}});
}

// ---- linear algebra -----------------------------------------------------------------------------
Tensor matmul(const Tensor& a, const Tensor& b) { return call1(OpKind::matmul, {a, b}); }
Tensor bmm(const Tensor& a, const Tensor& b) { return call1(OpKind::bmm, {a, b}); }
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return call1(OpKind::linear, {x, weight, bias});
}

// ---- convolution --------------------------------------------------------------------------------
Tensor conv1d(const Tensor& x, const Tensor& w, const Tensor& bias, const IntVec& stride, const IntVec& padding,
              const IntVec& dilation, int64_t groups) {
  return call1(OpKind::conv1d, {x, w, bias},
               {{"stride", sv(stride)}, {"padding", sv(padding)}, {"dilation", sv(dilation)}, {"groups", SymInt(groups)}});
}
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const IntVec& stride, const IntVec& padding,
              const IntVec& dilation, int64_t groups) {
  return call1(OpKind::conv2d, {x, w, bias},
               {{"stride", sv(stride)}, {"padding", sv(padding)}, {"dilation", sv(dilation)}, {"groups", SymInt(groups)}});
}
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias, const IntVec& stride,
                        const IntVec& padding, const IntVec& output_padding, int64_t groups, const IntVec& dilation) {
  return call1(OpKind::conv_transpose2d, {x, w, bias},
               {{"stride", sv(stride)}, {"padding", sv(padding)}, {"output_padding", sv(output_padding)},
                {"dilation", sv(dilation)}, {"groups", SymInt(groups)}});
}

// ---- pooling / resize / pad ---------------------------------------------------------------------
Tensor max_pool2d(const Tensor& x, const IntVec& kernel_size, const IntVec& stride, const IntVec& padding,
                  const IntVec& dilation, bool ceil_mode) {
  return call1(OpKind::max_pool2d, {x},
               {{"kernel_size", sv(kernel_size)}, {"stride", sv(stride.empty() ? kernel_size : stride)},
                {"padding", sv(padding)}, {"dilation", sv(dilation)}, {"ceil_mode", ceil_mode}});
}
Tensor avg_pool2d(const Tensor& x, const IntVec& kernel_size, const IntVec& stride, const IntVec& padding,
                  bool ceil_mode, bool count_include_pad) {
  return call1(OpKind::avg_pool2d, {x},
               {{"kernel_size", sv(kernel_size)}, {"stride", sv(stride.empty() ? kernel_size : stride)},
                {"padding", sv(padding)}, {"ceil_mode", ceil_mode}, {"count_include_pad", count_include_pad}});
}
Tensor adaptive_avg_pool2d(const Tensor& x, const IntVec& output_size) {
  return call1(OpKind::adaptive_avg_pool2d, {x}, {{"output_size", sv(output_size)}});
}
Tensor upsample_nearest2d(const Tensor& x, const SymIntVec& output_size) {
  return call1(OpKind::upsample_nearest2d, {x}, {{"output_size", output_size}});
}
Tensor upsample_bilinear2d(const Tensor& x, const SymIntVec& output_size, bool align_corners) {
  return call1(OpKind::upsample_bilinear2d, {x}, {{"output_size", output_size}, {"align_corners", align_corners}});
}
Tensor pad(const Tensor& x, const SymIntVec& pads, const std::string& mode, double value) {
  if (mode != "constant" && mode != "reflect" && mode != "replicate")
    throw ValueError(fmt::format("pad: mode must be constant, reflect or replicate, got \"{}\"", mode));
  return call1(OpKind::pad, {x}, {{"pads", pads}, {"mode", mode}, {"value", value}});
}

// ---- views and shape ops ------------------------------------------------------------------------
Tensor view(const Tensor& x, const SymIntVec& shape) { return call1(OpKind::view, {x}, {{"shape", shape}}); }
Tensor reshape(const Tensor& x, const SymIntVec& shape) { return call1(OpKind::reshape, {x}, {{"shape", shape}}); }
namespace {
int64_t wrap_dim(int64_t d, int64_t rank, const char* op) {
  int64_t r = rank == 0 ? 1 : rank;
  if (d < -r || d >= r)
    throw ValueError(fmt::format("{}: dim {} out of range for a tensor of rank {} (valid: [{}, {}])", op, d, rank, -r, r - 1));
  return d < 0 ? d + r : d;
}
}  // namespace
Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  int64_t r = x.dim();
  if (r == 0) return reshape(x, {1});
  int64_t s = wrap_dim(start_dim, r, "flatten"), e = wrap_dim(end_dim, r, "flatten");
  if (s > e) throw ValueError(fmt::format("flatten: start_dim {} is after end_dim {}", start_dim, end_dim));
  SymIntVec shape;
  for (int64_t i = 0; i < s; ++i) shape.push_back(x.size(i));
  SymInt m = 1;
  for (int64_t i = s; i <= e; ++i) m = m * x.size(i);
  shape.push_back(m);
  for (int64_t i = e + 1; i < r; ++i) shape.push_back(x.size(i));
  return reshape(x, shape);
}
Tensor permute(const Tensor& x, const IntVec& dims) { return call1(OpKind::permute, {x}, {{"dims", sv(dims)}}); }
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) {
  int64_t r = x.dim();
  if (r == 0) return x;
  d0 = wrap_dim(d0, r, "transpose");
  d1 = wrap_dim(d1, r, "transpose");
  IntVec p(static_cast<size_t>(r));
  for (int64_t i = 0; i < r; ++i) p[static_cast<size_t>(i)] = i;
  std::swap(p[static_cast<size_t>(d0)], p[static_cast<size_t>(d1)]);
  return permute(x, p);
}
Tensor expand(const Tensor& x, const SymIntVec& sizes) { return call1(OpKind::expand, {x}, {{"sizes", sizes}}); }
Tensor squeeze(const Tensor& x, const IntVec& dims) { return call1(OpKind::squeeze, {x}, {{"dims", sv(dims)}}); }
Tensor unsqueeze(const Tensor& x, int64_t dim) { return call1(OpKind::unsqueeze, {x}, {{"dim", SymInt(dim)}}); }
Tensor slice(const Tensor& x, int64_t dim, const SymInt& start, const SymInt& end, const SymInt& step) {
  return call1(OpKind::slice, {x}, {{"dim", SymInt(dim)}, {"start", start}, {"end", end}, {"step", step}});
}
Tensor select(const Tensor& x, int64_t dim, const SymInt& index) {
  return call1(OpKind::select, {x}, {{"dim", SymInt(dim)}, {"index", index}});
}
namespace {
/// A SymInt for an error message: a symbolic one with its value in the traced call ("s1 (= 9 in this
/// call)"), so that a user sees which input size made the call fail.
std::string with_value(const SymInt& v) {
  return v.is_symbolic() ? fmt::format("{} (= {} in this call)", v.str(), v.hint()) : v.str();
}
}  // namespace

Tensor narrow(const Tensor& x, int64_t dim, const SymInt& start, const SymInt& length) {
  if (x.dim() == 0) throw ValueError("narrow: cannot narrow a 0-dim tensor");
  int64_t d = wrap_dim(dim, x.dim(), "narrow");
  SymInt size = x.size(d);
  SymInt s = start;
  if (static_cast<bool>(s < 0)) s = s + size;
  if (static_cast<bool>(s < 0) || static_cast<bool>(s > size))
    throw ValueError(fmt::format("narrow: start {} is out of range for dim {} of size {} (valid: [{}, {}])",
                                 with_value(start), d, with_value(size), (-size).str(), size.str()));
  // The length bounds are checks (torch._check): guards for sizes the trace knows, runtime assertions
  // for a data-dependent length (item_symint), so `narrow(x, 0, 0, n)` traces with an unbacked n.
  if (!detail::sym_check(length >= 0, "narrow: length >= 0"))
    throw ValueError(fmt::format("narrow: length must be non-negative, got {}", with_value(length)));
  if (!detail::sym_check(length <= size - s, "narrow: start + length <= size"))  // not s + length: that can overflow
    throw ValueError(fmt::format("narrow: start {} + length {} exceeds dim {} of size {}", with_value(start),
                                 with_value(length), d, with_value(size)));
  return slice(x, d, s, s + length, 1);
}
Tensor cat(const TensorList& xs, int64_t dim) { return call1(OpKind::cat, xs, {{"dim", SymInt(dim)}}); }
Tensor stack(const TensorList& xs, int64_t dim) { return call1(OpKind::stack, xs, {{"dim", SymInt(dim)}}); }
TensorList split(const Tensor& x, const SymIntVec& sizes, int64_t dim) {
  Tensor in[] = {x};
  return call(OpKind::split, in, {{"dim", SymInt(dim)}, {"sizes", sizes}});
}
namespace {
/// Sizes of the pieces of a dim of size `n` cut every `step` elements (torch.split(int)): k pieces, the
/// first k - 1 of size `step`, the last `n - (k - 1)·step`. The sizes are SymInt arithmetic, so a
/// symbolic `n` stays symbolic; only the number of pieces k (a C++ int: it decides how many tensors
/// come back) is read from the traced sizes, guarded as `Eq(CeilDiv(n, step), k)`. An empty dim gives
/// one empty piece, as in PyTorch.
SymIntVec even_split_sizes(const SymInt& n, const SymInt& step, const char* op) {
  if (static_cast<bool>(step <= 0)) throw ValueError(fmt::format("{}: split_size must be positive, got {}", op, step.str()));
  int64_t cn = 0, cstep = 0;
  if (n.maybe_as_int(cn) && step.maybe_as_int(cstep)) {
    SymIntVec sizes;
    for (int64_t off = 0; off < cn; off += cstep) sizes.push_back(std::min(cstep, cn - off));
    if (sizes.empty()) sizes.push_back(0);
    return sizes;
  }
  const SymInt pieces = ceil_div(n, step);
  const int64_t k = std::max<int64_t>(pieces.hint(), 1);
  if (!static_cast<bool>(pieces == k))  // the piece count is the one fact the sizes depend on
    throw std::logic_error(fmt::format("{}: the piece count {} disagrees with its traced value {}", op, pieces.str(), k));
  SymIntVec sizes(static_cast<size_t>(k - 1), step);
  sizes.push_back(n - (k - 1) * step);
  return sizes;
}
}  // namespace

TensorList split(const Tensor& x, const SymInt& split_size, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "split");
  return split(x, even_split_sizes(x.size(d), split_size, "split"), d);
}
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  if (chunks <= 0) throw ValueError(fmt::format("chunk: chunks must be positive, got {}", chunks));
  int64_t d = wrap_dim(dim, x.dim(), "chunk");
  const SymInt n = x.size(d);
  int64_t cn = 0;
  // An empty dim: `chunks` empty pieces (torch.chunk); otherwise pieces of ceil(n / chunks).
  if (n.maybe_as_int(cn) && cn == 0) return split(x, SymIntVec(static_cast<size_t>(chunks), SymInt(0)), d);
  return split(x, even_split_sizes(n, ceil_div(n, SymInt(chunks)), "chunk"), d);
}

// ---- indexing -----------------------------------------------------------------------------------
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  return call1(OpKind::gather, {x, index}, {{"dim", SymInt(dim)}});
}
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  return call1(OpKind::index_select, {x, index}, {{"dim", SymInt(dim)}});
}
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index, bool wrap_negative) {
  if (!wrap_negative) return index_select(x, dim, index);
  return call1(OpKind::index_select, {x, index}, {{"dim", SymInt(dim)}, {"wrap_negative", true}});
}
Tensor embedding(const Tensor& weight, const Tensor& indices) { return call1(OpKind::embedding, {weight, indices}); }
Tensor cumsum(const Tensor& x, int64_t dim) { return call1(OpKind::cumsum, {x}, {{"dim", SymInt(dim)}}); }

// ---- composite ----------------------------------------------------------------------------------
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                    bool is_causal, std::optional<double> scale) {
  Attrs a{{"is_causal", is_causal}};
  if (scale) a.set("scale", *scale);
  return call1(OpKind::scaled_dot_product_attention, {q, k, v, mask}, a);
}
std::tuple<Tensor, Tensor, Tensor> lstm(const Tensor& X, const Tensor& W, const Tensor& R, const Tensor& B,
                                        const Tensor& h0, const Tensor& c0, const std::string& direction,
                                        const Tensor& P) {
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    throw ValueError(fmt::format("lstm: direction must be forward, reverse or bidirectional, got \"{}\"", direction));
  if (W.dim() != 3) throw ShapeError(fmt::format("lstm: W must be [D, 4H, I], got {}", to_string(W.sizes())));
  Tensor in[] = {X, W, R, B, Tensor(), h0, c0, P};
  auto outs = call(OpKind::lstm, in, {{"hidden_size", W.size(1) / 4}, {"direction", direction}});
  return {outs.at(0), outs.at(1), outs.at(2)};
}

// ---- data-dependent -----------------------------------------------------------------------------
Tensor nonzero(const Tensor& x) { return call1(OpKind::nonzero, {x}); }

// ---- factories that trace -----------------------------------------------------------------------
Tensor full(const SymIntVec& sizes, double value, DType dtype) {
  return call1(OpKind::full, std::span<const Tensor>(), {{"shape", sizes}, {"value", value}, {"dtype", dtype}});
}
Tensor arange(const SymInt& start, const SymInt& end, const SymInt& step, DType dtype) {
  if (step.hint() == 0) throw ValueError("arange: step must be non-zero");
  return call1(OpKind::arange, std::span<const Tensor>(),
               {{"start", start}, {"end", end}, {"step", step}, {"dtype", dtype}});
}
Tensor arange(const SymInt& end, DType dtype) { return arange(0, end, 1, dtype); }
Tensor scalar_tensor(double value, DType dtype) { return full({}, value, dtype); }
Tensor zeros(const IntVec& sizes, DType dtype) { return full(sv(sizes), 0.0, dtype); }
Tensor ones(const IntVec& sizes, DType dtype) { return full(sv(sizes), 1.0, dtype); }

// ---- operators ----------------------------------------------------------------------------------
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(wrap_scalar(a, b), b); }
Tensor operator-(double a, const Tensor& b) { return sub(wrap_scalar(a, b), b); }
Tensor operator*(double a, const Tensor& b) { return mul(wrap_scalar(a, b), b); }
Tensor operator/(double a, const Tensor& b) { return div(wrap_scalar(a, b), b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator<(const Tensor& a, double b) { return lt(a, wrap_scalar(b, a)); }
Tensor operator<=(const Tensor& a, double b) { return le(a, wrap_scalar(b, a)); }
Tensor operator>(const Tensor& a, double b) { return gt(a, wrap_scalar(b, a)); }
Tensor operator>=(const Tensor& a, double b) { return ge(a, wrap_scalar(b, a)); }

Tensor operator+(const Tensor& a, const SymFloat& b) { return add(a, scalar_operand(b, a)); }
Tensor operator-(const Tensor& a, const SymFloat& b) { return sub(a, scalar_operand(b, a)); }
Tensor operator*(const Tensor& a, const SymFloat& b) { return mul(a, scalar_operand(b, a)); }
Tensor operator/(const Tensor& a, const SymFloat& b) { return div(a, scalar_operand(b, a)); }
Tensor operator+(const SymFloat& a, const Tensor& b) { return add(scalar_operand(a, b), b); }
Tensor operator-(const SymFloat& a, const Tensor& b) { return sub(scalar_operand(a, b), b); }
Tensor operator*(const SymFloat& a, const Tensor& b) { return mul(scalar_operand(a, b), b); }
Tensor operator/(const SymFloat& a, const Tensor& b) { return div(scalar_operand(a, b), b); }
Tensor operator<(const Tensor& a, const SymFloat& b) { return lt(a, scalar_operand(b, a)); }
Tensor operator<=(const Tensor& a, const SymFloat& b) { return le(a, scalar_operand(b, a)); }
Tensor operator>(const Tensor& a, const SymFloat& b) { return gt(a, scalar_operand(b, a)); }
Tensor operator>=(const Tensor& a, const SymFloat& b) { return ge(a, scalar_operand(b, a)); }

// ---- Tensor methods -----------------------------------------------------------------------------
Tensor Tensor::add(const Tensor& o) const { return protean::add(*this, o); }
Tensor Tensor::sub(const Tensor& o) const { return protean::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return protean::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return protean::div(*this, o); }
Tensor Tensor::matmul(const Tensor& o) const { return protean::matmul(*this, o); }
Tensor Tensor::neg() const { return protean::neg(*this); }
Tensor Tensor::abs() const { return protean::abs(*this); }
Tensor Tensor::exp() const { return protean::exp(*this); }
Tensor Tensor::log() const { return protean::log(*this); }
Tensor Tensor::sqrt() const { return protean::sqrt(*this); }
Tensor Tensor::relu() const { return protean::relu(*this); }
Tensor Tensor::sigmoid() const { return protean::sigmoid(*this); }
Tensor Tensor::tanh() const { return protean::tanh(*this); }
Tensor Tensor::sum(const IntVec& dims, bool keepdim) const { return protean::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const IntVec& dims, bool keepdim) const { return protean::mean(*this, dims, keepdim); }
Tensor Tensor::amax(const IntVec& dims, bool keepdim) const { return protean::amax(*this, dims, keepdim); }
Tensor Tensor::softmax(int64_t dim) const { return protean::softmax(*this, dim); }
Tensor Tensor::reshape(const SymIntVec& shape) const { return protean::reshape(*this, shape); }
Tensor Tensor::view(const SymIntVec& shape) const { return protean::view(*this, shape); }
Tensor Tensor::flatten(int64_t s, int64_t e) const { return protean::flatten(*this, s, e); }
Tensor Tensor::permute(const IntVec& dims) const { return protean::permute(*this, dims); }
Tensor Tensor::transpose(int64_t d0, int64_t d1) const { return protean::transpose(*this, d0, d1); }
Tensor Tensor::expand(const SymIntVec& sizes) const { return protean::expand(*this, sizes); }
Tensor Tensor::squeeze(const IntVec& dims) const { return protean::squeeze(*this, dims); }
Tensor Tensor::unsqueeze(int64_t dim) const { return protean::unsqueeze(*this, dim); }
Tensor Tensor::slice(int64_t dim, const SymInt& start, const SymInt& end, const SymInt& step) const {
  return protean::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, const SymInt& index) const { return protean::select(*this, dim, index); }
Tensor Tensor::narrow(int64_t dim, const SymInt& start, const SymInt& length) const {
  return protean::narrow(*this, dim, start, length);
}
Tensor Tensor::to(DType dtype) const { return dtype == this->dtype() ? *this : protean::cast(*this, dtype); }
Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}
Tensor Tensor::clone() const { return ops::call1(OpKind::clone, {*this}); }

}  // namespace protean
