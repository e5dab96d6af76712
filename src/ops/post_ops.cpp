#include "ops/post_ops.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"

namespace protean::ops {

namespace {

struct KindName {
  PostOpKind kind;
  std::string_view name;
};
constexpr KindName kNames[] = {
    {PostOpKind::relu, "relu"},         {PostOpKind::sigmoid, "sigmoid"},
    {PostOpKind::tanh, "tanh"},         {PostOpKind::swish, "swish"},
    {PostOpKind::hardswish, "hardswish"}, {PostOpKind::hardsigmoid, "hardsigmoid"},
    {PostOpKind::gelu_erf, "gelu_erf"}, {PostOpKind::gelu_tanh, "gelu_tanh"},
    {PostOpKind::clamp, "clamp"},       {PostOpKind::linear, "linear"},
    {PostOpKind::add, "add"},           {PostOpKind::sub, "sub"},
    {PostOpKind::mul, "mul"},           {PostOpKind::div, "div"},
    {PostOpKind::batch_norm, "batch_norm"},
};

/// Number of numeric parameters and of operands in the text form of each kind.
struct Arity {
  int numbers, operands;
};
Arity arity(PostOpKind k) {
  switch (k) {
    case PostOpKind::relu: case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::hardswish:
    case PostOpKind::hardsigmoid: case PostOpKind::gelu_erf: case PostOpKind::gelu_tanh:
      return {0, 0};
    case PostOpKind::swish: return {1, 0};
    case PostOpKind::clamp: case PostOpKind::linear: return {2, 0};
    case PostOpKind::add: case PostOpKind::sub: case PostOpKind::mul: case PostOpKind::div: return {0, 1};
    case PostOpKind::batch_norm: return {1, 4};
  }
  return {0, 0};
}

std::string number_text(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{}", v);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

[[noreturn]] void bad_entry(std::string_view text, std::string_view entry, std::string_view why) {
  throw ValueError(fmt::format("post_ops \"{}\": entry '{}' {}", text, entry, why));
}

double parse_number(std::string_view text, std::string_view entry, std::string_view s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) bad_entry(text, entry, fmt::format("has a bad number '{}'", s));
  return v;
}

int parse_operand(std::string_view text, std::string_view entry, std::string_view s, bool may_be_absent) {
  if (may_be_absent && s == "_") return -1;
  int v = -1;
  if (s.size() < 2 || s[0] != '#') bad_entry(text, entry, fmt::format("has '{}' where an input (#k) belongs", s));
  auto [end, ec] = std::from_chars(s.data() + 1, s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0)
    bad_entry(text, entry, fmt::format("has a bad input reference '{}'", s));
  return v;
}

PostOp parse_entry(std::string_view text, std::string_view entry) {
  size_t open = entry.find('(');
  std::string_view name = trim(entry.substr(0, open));
  PostOp p;
  bool found = false;
  for (const KindName& k : kNames)
    if (k.name == name) {
      p.kind = k.kind;
      found = true;
    }
  if (name == "silu") {  // accepted on input; printed as swish(1)
    p.kind = PostOpKind::swish;
    p.alpha = 1;
    if (open != std::string_view::npos) bad_entry(text, entry, "takes no arguments");
    return p;
  }
  if (!found) bad_entry(text, entry, "is not a post-op (relu, sigmoid, tanh, swish, hardswish, hardsigmoid, "
                                     "gelu_erf, gelu_tanh, clamp, linear, add, sub, mul, div, batch_norm)");
  std::vector<std::string_view> args;
  if (open != std::string_view::npos) {
    if (entry.back() != ')') bad_entry(text, entry, "does not end with ')'");
    std::string_view inner = entry.substr(open + 1, entry.size() - open - 2);
    while (true) {
      size_t c = inner.find(',');
      args.push_back(trim(inner.substr(0, c)));
      if (c == std::string_view::npos) break;
      inner.remove_prefix(c + 1);
    }
  }
  Arity a = arity(p.kind);
  if (static_cast<int>(args.size()) != a.numbers + a.operands)
    bad_entry(text, entry, fmt::format("needs {} argument(s)", a.numbers + a.operands));
  for (int i = 0; i < a.operands; ++i)
    p.operand[static_cast<size_t>(i)] =
        parse_operand(text, entry, args[static_cast<size_t>(i)], p.kind == PostOpKind::batch_norm && i < 2);
  std::vector<double> nums;
  for (int i = 0; i < a.numbers; ++i) nums.push_back(parse_number(text, entry, args[static_cast<size_t>(a.operands + i)]));
  if (a.numbers >= 1) p.alpha = nums[0];
  if (a.numbers >= 2) p.beta = nums[1];
  return p;
}

}  // namespace

std::string_view post_op_name(PostOpKind k) {
  for (const KindName& n : kNames)
    if (n.kind == k) return n.name;
  return "?";
}

bool is_binary(PostOpKind k) {
  return k == PostOpKind::add || k == PostOpKind::sub || k == PostOpKind::mul || k == PostOpKind::div;
}

bool is_eltwise(PostOpKind k) { return arity(k).operands == 0; }

std::vector<PostOp> parse_post_ops(std::string_view text) {
  std::vector<PostOp> r;
  std::string_view rest = text;
  if (trim(rest).empty()) throw ValueError("post_ops: the list is empty");
  while (!rest.empty()) {
    int depth = 0;
    size_t end = 0;
    while (end < rest.size() && !(depth == 0 && rest[end] == ',')) {
      if (rest[end] == '(') ++depth;
      if (rest[end] == ')') --depth;
      ++end;
    }
    std::string_view entry = trim(rest.substr(0, end));
    if (entry.empty()) throw ValueError(fmt::format("post_ops \"{}\": empty entry", text));
    r.push_back(parse_entry(text, entry));
    rest = end < rest.size() ? rest.substr(end + 1) : std::string_view();
  }
  return r;
}

const std::vector<PostOp>& parse_post_ops_cached(const std::string& text) {
  static thread_local std::unordered_map<std::string, std::vector<PostOp>> cache;
  auto it = cache.find(text);
  if (it != cache.end()) return it->second;
  std::vector<PostOp> parsed = parse_post_ops(text);  // may throw: nothing is cached then
  if (cache.size() >= 256) cache.clear();
  return cache.emplace(text, std::move(parsed)).first->second;
}

std::string post_ops_text(const std::vector<PostOp>& ops) {
  std::string s;
  for (const PostOp& p : ops) {
    if (!s.empty()) s += ", ";
    s += post_op_name(p.kind);
    Arity a = arity(p.kind);
    if (a.numbers + a.operands == 0) continue;
    s += "(";
    for (int i = 0; i < a.operands; ++i) {
      int k = p.operand[static_cast<size_t>(i)];
      s += (i ? ", " : "") + (k < 0 ? std::string("_") : fmt::format("#{}", k));
    }
    if (a.numbers >= 1) s += (a.operands ? ", " : "") + number_text(p.alpha);
    if (a.numbers >= 2) s += ", " + number_text(p.beta);
    s += ")";
  }
  return s;
}

void check_post_ops(OpKind op, std::span<const Tensor> in, size_t first_operand, const std::vector<PostOp>& ops,
                    const SymIntVec& out, DType out_dtype) {
  std::vector<int> uses(in.size(), 0);
  auto operand = [&](const PostOp& p, int k) -> const Tensor& {
    if (k < static_cast<int>(first_operand) || k >= static_cast<int>(in.size()))
      throw ValueError(fmt::format("{}: post-op {} refers to input #{}, but operands are inputs #{}..#{}",
                                   describe_call(op, in), post_op_name(p.kind), k, first_operand,
                                   static_cast<int64_t>(in.size()) - 1));
    ++uses[static_cast<size_t>(k)];
    const Tensor& t = in[static_cast<size_t>(k)];
    if (!t.defined())
      throw ValueError(fmt::format("{}: post-op {} refers to input #{}, which is absent", describe_call(op, in),
                                   post_op_name(p.kind), k));
    if (t.dtype() != out_dtype)
      throw TypeError(fmt::format("{}: post-op {} operand #{} has dtype {}, the output {} (post-ops do not promote)",
                                  describe_call(op, in), post_op_name(p.kind), k, short_name(t.dtype()),
                                  short_name(out_dtype)));
    return t;
  };
  for (const PostOp& p : ops) {
    if (is_binary(p.kind)) {
      const Tensor& t = operand(p, p.operand[0]);
      bool fits = t.dim() <= static_cast<int64_t>(out.size());
      if (fits) {
        SymIntVec b = broadcast_shapes(out, t.sizes(), post_op_name(p.kind));
        for (size_t i = 0; i < out.size(); ++i) fits = fits && static_cast<bool>(b[i] == out[i]);
      }
      if (!fits)
        throw ShapeError(fmt::format("{}: post-op {} operand #{} of shape {} does not broadcast to the output shape {} "
                                     "without growing it",
                                     describe_call(op, in), post_op_name(p.kind), p.operand[0], to_string(t.sizes()),
                                     to_string(out)));
    } else if (p.kind == PostOpKind::batch_norm) {
      if (out.size() < 2)
        throw ShapeError(fmt::format("{}: post-op batch_norm needs an output of rank ≥ 2 (channels in dim 1), got {}",
                                     describe_call(op, in), to_string(out)));
      if (!(p.alpha >= 0))
        throw ValueError(fmt::format("{}: post-op batch_norm eps must be ≥ 0, got {}", describe_call(op, in), p.alpha));
      if (p.operand[2] < 0 || p.operand[3] < 0)
        throw ValueError(fmt::format("{}: post-op batch_norm needs the running mean and variance", describe_call(op, in)));
      for (int k : p.operand) {
        if (k < 0) continue;
        const Tensor& t = operand(p, k);
        if (t.dim() != 1 || !static_cast<bool>(t.size(0) == out[1]))
          throw ShapeError(fmt::format("{}: post-op batch_norm operand #{} must be 1-D of size {} (the channels), got {}",
                                       describe_call(op, in), k, out[1].str(), to_string(t.sizes())));
      }
    } else if (p.kind == PostOpKind::clamp && p.alpha > p.beta) {
      throw ValueError(fmt::format("{}: post-op clamp({}, {}) has min > max", describe_call(op, in), p.alpha, p.beta));
    }
  }
  for (size_t k = first_operand; k < in.size(); ++k)
    if (uses[k] != 1)
      throw ValueError(fmt::format("{}: input #{} is {} by the post-ops (each operand input is used exactly once)",
                                   describe_call(op, in), k, uses[k] == 0 ? "not used" : "used several times"));
}

std::pair<Tensor, Tensor> batch_norm_scale_shift(const PostOp& p, std::span<const Tensor> in) {
  auto vec = [&](int k) {
    return k < 0 ? std::vector<double>() : kernel::contiguous(in[static_cast<size_t>(k)]).to_vector<double>();
  };
  std::vector<double> w = vec(p.operand[0]), b = vec(p.operand[1]), mean = vec(p.operand[2]), var = vec(p.operand[3]);
  size_t C = mean.size();
  std::vector<double> scale(C), shift(C);
  for (size_t c = 0; c < C; ++c) {
    scale[c] = (w.empty() ? 1.0 : w[c]) / std::sqrt(var[c] + p.alpha);
    shift[c] = (b.empty() ? 0.0 : b[c]) - mean[c] * scale[c];
  }
  int64_t n = static_cast<int64_t>(C);
  return {tensor<double>(scale, {n}), tensor<double>(shift, {n})};
}

namespace {

/// The scalar function of an eltwise post-op, in the element's compute type.
template <typename T>
T eltwise(const PostOp& p, T x) {
  switch (p.kind) {
    case PostOpKind::relu: return x < T(0) ? T(0) : x;  // NaN passes through, as in eager relu
    case PostOpKind::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case PostOpKind::tanh: return std::tanh(x);
    case PostOpKind::swish: return x / (T(1) + std::exp(-T(p.alpha) * x));
    case PostOpKind::hardswish: {
      T r = std::min(std::max(x + T(3), T(0)), T(6));
      return x * r / T(6);
    }
    case PostOpKind::hardsigmoid: return std::min(std::max(x + T(3), T(0)), T(6)) / T(6);
    case PostOpKind::gelu_erf: return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
    case PostOpKind::gelu_tanh: {
      const T k = T(M_2_SQRTPI * M_SQRT1_2);
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case PostOpKind::clamp: return std::min(std::max(x, T(p.alpha)), T(p.beta));
    case PostOpKind::linear: return T(p.alpha) * x + T(p.beta);
    case PostOpKind::add: case PostOpKind::sub: case PostOpKind::mul: case PostOpKind::div:
    case PostOpKind::batch_norm:
      break;
  }
  return x;
}

template <typename T>
T binary(PostOpKind k, T x, T y) {
  switch (k) {
    case PostOpKind::add: return x + y;
    case PostOpKind::sub: return x - y;
    case PostOpKind::mul: return x * y;
    case PostOpKind::div: return x / y;
    case PostOpKind::relu: case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish:
    case PostOpKind::hardswish: case PostOpKind::hardsigmoid: case PostOpKind::gelu_erf: case PostOpKind::gelu_tanh:
    case PostOpKind::clamp: case PostOpKind::linear: case PostOpKind::batch_norm:
      break;
  }
  return x;
}


/// `t` (1-D, channels) viewed as [C, 1, ..., 1] so it broadcasts over dim 1 of a rank-`rank` output.
Tensor channel_view(const Tensor& t, size_t rank) {
  IntVec s{t.int_sizes()[0]};
  for (size_t i = 2; i < rank; ++i) s.push_back(1);
  return reshape(t, to_symint_vec(s));
}

/// A binary operand of the f32 fast path: contiguous f32 data and its element strides at y's shape
/// (0 along broadcast dims).
using Operand32 = PostOpsF32::Operand;

Operand32 operand32(const Tensor& t, const IntVec& ysizes) {
  Operand32 o;
  o.data = kernel::contiguous(kernel::to_dtype(t, DType::F32));
  IntVec ts = o.data.int_sizes();
  size_t r = ysizes.size(), k = ts.size();
  o.strides.assign(r, 0);
  int64_t acc = 1;
  for (size_t i = k; i-- > 0;) {
    if (ts[i] != 1) o.strides[r - k + i] = acc;
    acc *= ts[i];
  }
  return o;
}

/// Element `flat` of y's shape, as an offset into the operand (row-major index → strides).
int64_t operand_offset(int64_t flat, const IntVec& sizes, const IntVec& strides) {
  int64_t off = 0;
  for (size_t d = sizes.size(); d-- > 0;) {
    int64_t i = flat % sizes[d];
    flat /= sizes[d];
    off += i * strides[d];
  }
  return off;
}

constexpr int64_t kBlock = 1024;

}  // namespace

PostOpsF32::PostOpsF32(const IntVec& sizes, const std::vector<PostOp>& ops, std::span<const Tensor> in)
    : sizes_(sizes), ops_(&ops), first_(ops.size()), second_(ops.size()) {
  n_ = 1;
  for (int64_t s : sizes) n_ *= s;
  inner_ = sizes.empty() ? 1 : sizes.back();
  // binary: first = the operand; batch_norm: first = scale, second = shift (as [C, 1, ...])
  for (size_t i = 0; i < ops.size(); ++i) {
    if (is_binary(ops[i].kind)) first_[i] = operand32(in[static_cast<size_t>(ops[i].operand[0])], sizes);
    if (ops[i].kind == PostOpKind::batch_norm) {
      auto [scale, shift] = batch_norm_scale_shift(ops[i], in);
      first_[i] = operand32(channel_view(scale, sizes.size()), sizes);
      second_[i] = operand32(channel_view(shift, sizes.size()), sizes);
    }
  }
}

bool PostOpsF32::vector_loops(const std::vector<PostOp>& ops) {
  for (const PostOp& p : ops)
    switch (p.kind) {
      case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish: case PostOpKind::gelu_erf:
      case PostOpKind::gelu_tanh:
        return false;
      default:
        break;
    }
  return true;
}

void PostOpsF32::apply_span(float* y, int64_t start, int64_t len, float* buf, float* buf2) const {
  const IntVec& sizes = sizes_;
  const int64_t inner = inner_;
  float* v = y + start;
  // operand values for elements start .. start+len, in runs along the last dim
  auto gather = [&](const Operand32& o, float* dst) {
    const float* src = o.data.data_ptr<float>();
    const int64_t ist = sizes.empty() ? 0 : o.strides.back();
    for (int64_t i = 0; i < len;) {
      int64_t pos = (start + i) % inner, run = std::min(len - i, inner - pos);
      const float* s0 = src + operand_offset(start + i, sizes, o.strides);
      if (ist == 1) std::copy(s0, s0 + run, dst + i);
      else if (ist == 0) std::fill(dst + i, dst + i + run, *s0);
      else for (int64_t j = 0; j < run; ++j) dst[i + j] = s0[j * ist];
      i += run;
    }
  };
  const std::vector<PostOp>& ops = *ops_;
  for (size_t k = 0; k < ops.size(); ++k) {
    const PostOp& p = ops[k];
    float* t = buf;
    float* u = buf2;
    switch (p.kind) {
      case PostOpKind::relu:
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = v[i] < 0.0f ? 0.0f : v[i];  // keeps NaN
        break;
      case PostOpKind::linear: {
        const float a = static_cast<float>(p.alpha), c = static_cast<float>(p.beta);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = a * v[i] + c;
        break;
      }
      case PostOpKind::clamp: {
        const float lo = static_cast<float>(p.alpha), hi = static_cast<float>(p.beta);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = std::min(std::max(v[i], lo), hi);
        break;
      }
      case PostOpKind::hardswish:
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = v[i] * std::min(std::max(v[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
        break;
      case PostOpKind::hardsigmoid:
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = std::min(std::max(v[i] + 3.0f, 0.0f), 6.0f) / 6.0f;
        break;
      case PostOpKind::sigmoid: case PostOpKind::tanh: case PostOpKind::swish: case PostOpKind::gelu_erf:
      case PostOpKind::gelu_tanh:
        for (int64_t i = 0; i < len; ++i) v[i] = eltwise<float>(p, v[i]);
        break;
      case PostOpKind::add:
        gather(first_[k], t);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] += t[i];
        break;
      case PostOpKind::sub:
        gather(first_[k], t);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] -= t[i];
        break;
      case PostOpKind::mul:
        gather(first_[k], t);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] *= t[i];
        break;
      case PostOpKind::div:
        gather(first_[k], t);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] /= t[i];
        break;
      case PostOpKind::batch_norm:
        gather(first_[k], t);
        gather(second_[k], u);
#pragma omp simd
        for (int64_t i = 0; i < len; ++i) v[i] = v[i] * t[i] + u[i];
        break;
    }
  }
}

void PostOpsF32::apply(float* y) const {
  const int64_t blocks = (n_ + kBlock - 1) / kBlock;
  kernel::parallel_for(blocks, kBlock * static_cast<int64_t>(ops_->size()), [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(kBlock), buf2(kBlock);
    apply_range(y, b0 * kBlock, std::min(b1 * kBlock, n_), buf.data(), buf2.data());
  });
}

void PostOpsF32::apply_range(float* y, int64_t begin, int64_t end, float* buf, float* buf2) const {
  for (int64_t at = begin; at < end; at += kBlock) apply_span(y, at, std::min(kBlock, end - at), buf, buf2);
}

void PostOpsF32::apply_columns(float* y, int64_t c0, int64_t c1) const {
  c1 = std::min(c1, inner_);
  if (n_ == 0 || c0 >= c1) return;
  float buf[kBlock], buf2[kBlock];
  const int64_t rows = n_ / inner_;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; c += kBlock)
      apply_span(y, r * inner_ + c, std::min(kBlock, c1 - c), buf, buf2);
}

void PostOpsF32::apply_rows(float* y, int64_t r0, int64_t r1) const {
  float buf[kBlock], buf2[kBlock];
  apply_range(y, r0 * inner_, std::min(r1 * inner_, n_), buf, buf2);
}

namespace {

/// One pass over a contiguous f32 result: blocks of kBlock elements stay in L1 while every post-op
/// runs on them (a tensor operand is first gathered into a block-sized buffer).
void apply_f32(float* y, const IntVec& sizes, const std::vector<PostOp>& ops, std::span<const Tensor> in) {
  PostOpsF32(sizes, ops, in).apply(y);
}

}  // namespace

Tensor apply_post_ops(const Tensor& y, const std::vector<PostOp>& ops, std::span<const Tensor> in) {
  if (y.int_numel() == 0 || ops.empty()) return y;
  if (y.dtype() == DType::F32 && y.is_contiguous()) {
    apply_f32(y.data_ptr<float>(), y.int_sizes(), ops, in);
    return y;
  }
  Tensor cur = y;
  Tensor other = empty(y.int_sizes(), y.dtype());
  auto step = [&](auto&& run) {
    run(other, cur);
    std::swap(cur, other);
  };
  dispatch_dtype(y.dtype(), [&]<typename T>() {
    if constexpr (kernel::is_float_v<T>) {
      using M = kernel::OpMath<T>;
      for (const PostOp& p : ops) {
        if (is_eltwise(p.kind)) {
          step([&](const Tensor& o, const Tensor& x) {
            kernel::map<T, T>(o, {x}, [p](T v) { return static_cast<T>(eltwise<M>(p, static_cast<M>(v))); });
          });
        } else if (is_binary(p.kind)) {
          const Tensor& b = in[static_cast<size_t>(p.operand[0])];
          PostOpKind k = p.kind;
          step([&](const Tensor& o, const Tensor& x) {
            kernel::map<T, T, T>(o, {x, b}, [k](T u, T v) {
              return static_cast<T>(binary<M>(k, static_cast<M>(u), static_cast<M>(v)));
            });
          });
        } else {  // batch_norm: x·scale + shift in the compute type
          auto [scale, shift] = batch_norm_scale_shift(p, in);
          size_t r = y.int_sizes().size();
          Tensor s = channel_view(kernel::to_dtype(scale, y.dtype()), r);
          Tensor t = channel_view(kernel::to_dtype(shift, y.dtype()), r);
          step([&](const Tensor& o, const Tensor& x) {
            kernel::map<T, T, T, T>(o, {x, s, t}, [](T u, T a, T c) {
              return static_cast<T>(static_cast<M>(u) * static_cast<M>(a) + static_cast<M>(c));
            });
          });
        }
      }
    } else {
      throw TypeError(fmt::format("post-ops need a floating output, got {}", short_name(y.dtype())));
    }
  });
  return cur;
}

}  // namespace protean::ops
