#include "backend/cuda/pipeline.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <functional>
#include <unordered_set>

#include "backend/attention_pattern.h"
#include "backend/cuda/attention.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/dnn.h"
#include "backend/cuda/hopper_gemm.h"
#include "backend/cuda/pool_kernels.h"
#include "backend/kernel_symbols.h"
#include "ir/passes/inline_regions.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "loop/c_expr.h"
#include "loop/lower.h"
#include "observe/env.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/version.h"
#include "sym/printer.h"

namespace protean::backend::cuda {

using namespace loop;  // the IR this file compiles

namespace {


template <class Text>
void log_step(const std::string& id, const std::string& what, Text&& text) {
  if (observe::log_enabled(observe::LogCat::OutputCode)) observe::log_line(observe::LogCat::OutputCode, id, what + ":\n" + text());
}

sym::Expr product(const std::vector<sym::Expr>& d, size_t from = 0, size_t to = SIZE_MAX) {
  sym::Expr n = sym::integer(1);
  for (size_t i = from; i < d.size() && i < to; ++i) n = sym::mul(n, d[i]);
  return simplify_index(n);
}

BufferPlan plan_buffers(const Program& p) {
  BufferPlan plan;
  plan.outputs = p.outputs;
  plan.slots.resize(static_cast<size_t>(p.num_slots));
  for (const Buffer& b : p.buffers) {
    PlannedBuffer pb;
    pb.id = b.id;
    pb.dtype = b.dtype;
    pb.sizes = b.sizes;
    pb.bytes = simplify_index(sym::mul(product(b.sizes), sym::integer(static_cast<int64_t>(itemsize(b.dtype)))));
    pb.kind = b.kind;
    pb.input_index = b.input_index;
    pb.slot = b.slot;
    pb.constant = b.constant;
    pb.from_extern = b.from_extern;
    for (size_t i = 0; i < p.outputs.size(); ++i)
      if (p.outputs[i] == b.id) {
        pb.output_index = static_cast<int>(i);
        break;
      }
    if (b.slot >= 0 && b.slot < p.num_slots) {
      Slot& s = plan.slots[static_cast<size_t>(b.slot)];
      s.bytes = s.bytes ? simplify_index(sym::maximum(s.bytes, pb.bytes)) : pb.bytes;
      s.members.push_back(b.id);
    }
    plan.buffers.push_back(std::move(pb));
  }
  for (Slot& s : plan.slots)
    if (!s.bytes) s.bytes = sym::integer(0);
  return plan;
}

bool blas_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

/// Whether two buffers' sizes are the same once dims of extent 1 are dropped ([1, s, d] and [s, d]).
bool same_dims(const std::vector<sym::Expr>& a, const std::vector<sym::Expr>& b) {
  std::vector<sym::Expr> x, y;
  for (const sym::Expr& d : a)
    if (!d->is_integer(1)) x.push_back(d);
  for (const sym::Expr& d : b)
    if (!d->is_integer(1)) y.push_back(d);
  return x == y;
}

/// Whether `e` loads buffer `b`.
bool loads_buffer(const SExpr& e, int b) {
  if (e->op == SOp::Load && e->buffer == b) return true;
  for (const SExpr& a : e->args)
    if (loads_buffer(a, b)) return true;
  return false;
}

/// Whether a stage of `k` from `first` on reads `b`.
bool reads_buffer(const Kernel& k, size_t first, int b) {
  for (size_t i = first; i < k.stages.size(); ++i)
    if (loads_buffer(k.stages[i].body, b)) return true;
  return false;
}

/// Whether any step other than `skip_kernel` (a kernel index) and the extern `skip_extern` reads `b`.
bool read_elsewhere(const Program& p, int b, int skip_kernel, int skip_extern) {
  for (size_t k = 0; k < p.kernels.size(); ++k)
    if (static_cast<int>(k) != skip_kernel && reads_buffer(p.kernels[k], 0, b)) return true;
  for (size_t e = 0; e < p.externs.size(); ++e)
    if (static_cast<int>(e) != skip_extern)
      for (int in : p.externs[e].inputs)
        if (in == b) return true;
  for (int o : p.outputs)
    if (o == b) return true;
  return false;
}

/// The value of a scalar constant: a literal, or a load of a one-element constant buffer (what the
/// ONNX importer makes of a scalar initializer), through casts.
std::optional<double> scalar_value(const Program& p, const SExpr& e) {
  if (e->op == SOp::Const) return is_floating(e->dtype) ? e->fval : static_cast<double>(e->ival);
  if (e->op == SOp::Cast) return scalar_value(p, e->args[0]);
  if (e->op != SOp::Load || e->buffer < 0) return std::nullopt;
  const Buffer& b = p.buffers[static_cast<size_t>(e->buffer)];
  if (b.kind != BufferKind::Constant || !b.constant.defined() || b.constant.int_numel() != 1) return std::nullopt;
  return b.constant.to(DType::F64).contiguous().to_vector<double>()[0];
}

/// Whether constant `c` of type `t` is `v` rounded to `t` (within half a unit in the last place).
bool is_rounded(double c, double v, DType t) {
  const double ulp = t == DType::BF16 ? 0x1p-8 : t == DType::F16 ? 0x1p-11 : t == DType::F32 ? 0x1p-24 : 0x1p-53;
  return std::fabs(c - v) <= std::fabs(v) * ulp;
}

/// The leaves of a tree of multiplications.
void mul_factors(const SExpr& e, std::vector<SExpr>& out) {
  if (e->op == SOp::Binary && e->fn == ScalarOp::mul) {
    mul_factors(e->args[0], out);
    mul_factors(e->args[1], out);
  } else {
    out.push_back(e);
  }
}

/// Matches GELU's tanh form (PyTorch's gelu(approximate="tanh"), transformers' gelu_new, what cuBLASLt's
/// GELU epilogue computes): 0.5 * y * (1 + tanh(sqrt(2/pi) * (y + 0.044715 * y^3))), its products in any
/// order and grouping, y^3 as pow(y, 3) or y * y * y, the constants literals or one-element constant
/// buffers equal to those values rounded to their type. Returns y's text form's operand, or nullptr.
SExpr match_gelu_tanh(const Program& p, const SExpr& e) {
  const double k0 = 0.5, k1 = 0.044715, k2 = 0.7978845608028654;  // sqrt(2 / pi)
  auto is_const = [&](const SExpr& x, double v) {
    const std::optional<double> c = scalar_value(p, x);
    return c && is_rounded(*c, v, x->dtype);
  };
  auto is_add = [](const SExpr& x) { return x->op == SOp::Binary && x->fn == ScalarOp::add; };
  // the factors: exactly 0.5, y and (1 + tanh(T)) | (tanh(T) + 1)
  std::vector<SExpr> f;
  mul_factors(e, f);
  if (f.size() != 3) return nullptr;
  SExpr half, y, one_tanh;
  for (const SExpr& x : f) {
    if (!half && is_const(x, k0)) half = x;
    else if (!one_tanh && is_add(x) && ((x->args[0]->op == SOp::Unary && x->args[0]->fn == ScalarOp::tanh && is_const(x->args[1], 1.0)) ||
                                        (x->args[1]->op == SOp::Unary && x->args[1]->fn == ScalarOp::tanh && is_const(x->args[0], 1.0))))
      one_tanh = x;
    else if (!y) y = x;
    else return nullptr;
  }
  if (!half || !y || !one_tanh) return nullptr;
  const std::string yt = s_text(y);
  const SExpr th = one_tanh->args[0]->op == SOp::Unary && one_tanh->args[0]->fn == ScalarOp::tanh ? one_tanh->args[0] : one_tanh->args[1];
  // T = sqrt(2/pi) * (y + 0.044715 * y^3)
  std::vector<SExpr> t;
  mul_factors(th->args[0], t);
  if (t.size() != 2) return nullptr;
  const SExpr inner = is_const(t[0], k2) ? t[1] : is_const(t[1], k2) ? t[0] : nullptr;
  if (!inner || !is_add(inner)) return nullptr;
  for (int s = 0; s < 2; ++s) {
    if (s_text(inner->args[s]) != yt) continue;
    std::vector<SExpr> c;
    mul_factors(inner->args[1 - s], c);
    int consts = 0, ys = 0, cubes = 0;
    for (const SExpr& x : c) {
      if (is_const(x, k1)) ++consts;
      else if (s_text(x) == yt) ++ys;
      else if (x->op == SOp::Binary && x->fn == ScalarOp::pow && s_text(x->args[0]) == yt && is_const(x->args[1], 3.0)) ++cubes;
      else return nullptr;
    }
    if (consts == 1 && ((ys == 3 && cubes == 0) || (ys == 0 && cubes == 1))) return y;
  }
  return nullptr;
}

/// Matches the body of the pointwise kernel after a matrix product writing `o` against
/// `[gelu](o [+ bias]) [+ residual]` (gelu's erf form x * Phi(x) or its tanh form, bias broadcast over rows, residual of
/// the product's shape), reading `o` at `idx` and the bias at `col`. Fills `ep`; false when it is
/// something else.
bool match_epilogue(const Program& p, const SExpr& body, int o, sym::Expr idx, sym::Expr col, BlasEpilogue& ep) {
  const Buffer& ob = p.buffers[static_cast<size_t>(o)];
  auto is_o = [&](const SExpr& e) { return e->op == SOp::Load && e->buffer == o && e->index == idx; };
  auto is_add = [](const SExpr& e) { return e->op == SOp::Binary && e->fn == ScalarOp::add; };
  auto operand_load = [&](const SExpr& e, bool bias) -> int {
    if (e->op != SOp::Load || e->buffer == o) return -1;
    const Buffer& b = p.buffers[static_cast<size_t>(e->buffer)];
    if (b.dtype != ob.dtype) return -1;
    if (bias) return b.sizes.size() == 1 && b.sizes[0] == ob.sizes.back() && e->index == col ? e->buffer : -1;
    return same_dims(b.sizes, ob.sizes) && e->index == idx ? e->buffer : -1;
  };
  // y = o [+ bias]
  auto match_y = [&](const SExpr& e, int& bias) {
    if (is_o(e)) return true;
    if (!is_add(e)) return false;
    for (int k = 0; k < 2; ++k)
      if (is_o(e->args[k]) && (bias = operand_load(e->args[1 - k], true)) >= 0) return true;
    return false;
  };
  // r = gelu(y) | y
  auto match_r = [&](const SExpr& e, int& bias, GeluForm& g) {
    if (const SExpr y = match_gelu_tanh(p, e); y && match_y(y, bias)) {
      g = GeluForm::Tanh;
      return true;
    }
    if (e->op == SOp::Binary && e->fn == ScalarOp::mul)
      for (int k = 0; k < 2; ++k) {
        const SExpr& phi = e->args[1 - k];
        if (phi->op == SOp::Unary && phi->fn == ScalarOp::normal_cdf && s_text(phi->args[0]) == s_text(e->args[k]) &&
            match_y(e->args[k], bias)) {
          g = GeluForm::Erf;
          return true;
        }
      }
    return match_y(e, bias);
  };
  int bias = -1, residual = -1;
  GeluForm g = GeluForm::None;
  bool ok = match_r(body, bias, g);
  if (!ok && is_add(body))
    for (int k = 0; k < 2 && !ok; ++k) {
      bias = -1;
      g = GeluForm::None;
      if ((residual = operand_load(body->args[1 - k], false)) >= 0) ok = match_r(body->args[k], bias, g);
    }
  if (!ok || (bias < 0 && g == GeluForm::None && residual < 0)) return false;
  // cuBLASLt's GELU epilogue is the tanh form, and it does not combine GELU with a residual (beta = 1)
  // add: an erf-form GELU stays in its kernel (and the kernel with it)
  if (g == GeluForm::Erf || (g == GeluForm::Tanh && residual >= 0)) return false;
  ep.bias = bias;
  ep.gelu = g;
  ep.residual = residual;
  ep.beta = residual >= 0 ? 1.0 : 0.0;
  return true;
}


const char* copy_type(size_t bytes) {
  switch (bytes) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    case 8: return "unsigned long long";
  }
  return nullptr;
}


/// A data-movement extern with a hand-written kernel in the graph's translation unit: index_select
/// (embedding lookups, ONNX Gather on a tensor of indices) as out[o, j, i] = x[o, idx[j], i] over
/// outer = prod(x.sizes[:dim]), the index count and inner = prod(x.sizes[dim+1:]). A general entry
/// copies one element per thread step; an aligned one copies 16 bytes per step when inner is a
/// multiple of 16 / itemsize and x and out are 16-byte aligned (VariantRule). An index outside
/// [0, size) traps (the launch fails with a driver error, as PyTorch's device-side assert does); with
/// the attribute wrap_negative (ONNX Gather) an index in [-size, 0) reads row size + index first.
/// Sizes are the symbols' values.
/// embedding(weight, indices) is the same kernel with dim 0 (`fixed_dim`): weight [V, E], indices of
/// any shape (count = their product), out = indices' shape + [E].
std::optional<CudaKernel> index_select_kernel(const Program& p, const Extern& e, const std::string& name,
                                              std::string& source, std::string& why,
                                              std::optional<int64_t> fixed_dim = std::nullopt,
                                              SizeArgs size_args = SizeArgs::ByValue) {
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  if (e.inputs.size() != 2 || e.outputs.size() != 1 || e.inputs[0] < 0 || e.inputs[1] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  const Buffer& x = buf(e.inputs[0]);
  const Buffer& idx = buf(e.inputs[1]);
  const Buffer& out = buf(e.outputs[0]);
  const char* t = copy_type(itemsize(x.dtype));
  if (!t || out.dtype != x.dtype || (idx.dtype != DType::I64 && idx.dtype != DType::I32) || x.sizes.empty()) {
    why = fmt::format("{} of {} by {}", ops::op_name(e.op), short_name(x.dtype), short_name(idx.dtype));
    return std::nullopt;
  }
  int64_t dim = fixed_dim.value_or(0);
  if (!fixed_dim && !e.attrs.sym_int("dim").maybe_as_int(dim)) {
    why = "a symbolic dim";
    return std::nullopt;
  }
  if (dim < 0) dim += static_cast<int64_t>(x.sizes.size());
  const size_t d = static_cast<size_t>(dim);
  const sym::Expr outer = product(x.sizes, 0, d), src = x.sizes[d], inner = product(x.sizes, d + 1);
  const sym::Expr count = product(idx.sizes), total = simplify_index(sym::mul(sym::mul(outer, count), inner));
  CudaKernel k;
  k.name = name;
  std::vector<std::string> sig = {fmt::format("const {}* __restrict__ x", t),
                                  fmt::format("const {}* __restrict__ idx", idx.dtype == DType::I64 ? "long long" : "int"),
                                  fmt::format("{}* __restrict__ out", t)};
  for (int b : {e.inputs[0], e.inputs[1], e.outputs[0]}) k.params.push_back({ParamKind::Buffer, b, 0, 8});
  // sizes from memory: a grid-stride loop, so a larger grid computes the same
  std::string loads;
  if (!add_symbol_params(p, {outer, src, inner, count}, k, sig, why, size_args == SizeArgs::FromMemory ? &loads : nullptr))
    return std::nullopt;
  const CDialect dialect;
  const int64_t v = 16 / static_cast<int64_t>(itemsize(x.dtype));
  const bool wrap = !fixed_dim && e.attrs.has("wrap_negative") && e.attrs.b("wrap_negative");
  const std::string load_index = wrap ? "    long long s = (long long)idx[j];\n    if (s < 0) s += src;\n"
                                      : "    const long long s = (long long)idx[j];\n";
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  const std::string sizes = fmt::format(
      "  const long long outer = {}, src = {}, inner = {}, count = {};\n  (void)outer;\n", c_index(outer, dialect),
      c_index(src, dialect), c_index(inner, dialect), c_index(count, dialect));
  // general: one element per step; aligned: V elements (16 bytes) per step, inner % V == 0
  source += fmt::format(
      "\n#ifndef PT_EXT_V16\n#define PT_EXT_V16\nstruct alignas(16) pt_ext_v16 {{ unsigned long long lo, hi; }};\n#endif\n"
      "// {} (extern {}, dim {})\n"
      "extern \"C\" __global__ void __launch_bounds__(256) {}_general({}) {{\n{}{}{}"
      "  const long long n = outer * count * inner;\n"
      "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {{\n"
      "    const long long i = g % inner, r = g / inner, j = r % count, o = r / count;\n{}"
      "    if (s < 0 || s >= src) __trap();\n"
      "    out[g] = x[(o * src + s) * inner + i];\n"
      "  }}\n}}\n"
      "extern \"C\" __global__ void __launch_bounds__(256) {}_aligned({}) {{\n{}{}{}"
      "  const long long vi = inner / {}, n = outer * count * vi;\n"
      "  const pt_ext_v16* __restrict__ xv = reinterpret_cast<const pt_ext_v16*>(x);\n"
      "  pt_ext_v16* __restrict__ ov = reinterpret_cast<pt_ext_v16*>(out);\n"
      "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {{\n"
      "    const long long i = g % vi, r = g / vi, j = r % count, o = r / count;\n{}"
      "    if (s < 0 || s >= src) __trap();\n"
      "    ov[g] = xv[(o * src + s) * vi + i];\n"
      "  }}\n}}\n",
      name, ops::op_name(e.op), dim, name, params, loads, kWaitPriorGrids, sizes, load_index, name, params, loads,
      kWaitPriorGrids, sizes, v, load_index);
  k.general.entry = name + "_general";
  k.general.launch.shape = LaunchShape::GridStride;
  k.general.launch.work = total;
  k.general.launch.block_threads = 256;
  k.aligned = k.general;
  k.aligned.entry = name + "_aligned";
  k.aligned.launch.items_per_thread = static_cast<int>(v);
  k.rule.divisible = {inner};
  k.rule.multiple = v;
  k.rule.aligned_buffers = {e.inputs[0], e.outputs[0]};
  return k;
}


/// cumsum (torch.cumsum) of integer and bool inputs into i64, and of f32 / f64 inputs (accumulated in
/// double, like the eager kernel): one block of 256 threads per line along `dim`, a parallel scan over
/// chunks of 256 elements (a shuffle scan per warp, the warps' totals through shared memory, a running
/// carry between chunks), so a transformer's position or mask cumsum over a sequence of 512 is two
/// chunk steps instead of 512 dependent additions on one thread. Integer sums are exact; a floating
/// sum in double may round differently from the eager kernel's sequential order, far below f32.
std::optional<CudaKernel> cumsum_kernel(const Program& p, const Extern& e, const std::string& name, std::string& source,
                                        std::string& why) {
  if (e.inputs.size() != 1 || e.outputs.size() != 1 || e.inputs[0] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  const Buffer& x = p.buffers[static_cast<size_t>(e.inputs[0])];
  const Buffer& out = p.buffers[static_cast<size_t>(e.outputs[0])];
  auto ctype = [](DType t) -> const char* {
    switch (t) {
      case DType::F32: return "float";
      case DType::F64: return "double";
      case DType::I64: return "long long";
      case DType::I32: return "int";
      case DType::I8: return "signed char";
      case DType::U8: return "unsigned char";
      case DType::Bool: return "unsigned char";
      case DType::F16:
      case DType::BF16: return nullptr;
    }
    return nullptr;
  };
  const char* tx = ctype(x.dtype);
  const char* ty = ctype(out.dtype);
  if (!tx || !ty || x.sizes.empty()) {
    why = fmt::format("cumsum of {} (the GPU scan takes integer, bool, f32 and f64 tensors of rank >= 1)", short_name(x.dtype));
    return std::nullopt;
  }
  int64_t dim = 0;
  if (!e.attrs.sym_int("dim").maybe_as_int(dim)) {
    why = "a symbolic dim";
    return std::nullopt;
  }
  if (dim < 0) dim += static_cast<int64_t>(x.sizes.size());
  const size_t d = static_cast<size_t>(dim);
  const sym::Expr outer = product(x.sizes, 0, d), len = x.sizes[d], inner = product(x.sizes, d + 1);
  CudaKernel k;
  k.name = name;
  std::vector<std::string> sig = {fmt::format("const {}* __restrict__ x", tx), fmt::format("{}* __restrict__ out", ty)};
  k.params.push_back({ParamKind::Buffer, e.inputs[0], 0, 8});
  k.params.push_back({ParamKind::Buffer, e.outputs[0], 0, 8});
  if (!add_symbol_params(p, {outer, len, inner}, k, sig, why)) return std::nullopt;
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  const CDialect dialect;
  const bool fp = is_floating(out.dtype);
  const char* acc = fp ? "double" : "long long";
  source += fmt::format(
      "\n// {0} (extern cumsum, dim {1})\n"
      "extern \"C\" __global__ void __launch_bounds__(256) {0}({2}) {{\n{8}"
      "  const long long outer = {3}, len = {4}, inner = {5};\n  (void)outer;\n"
      "  __shared__ {6} warp_total[8];\n"
      "  const long long l = blockIdx.x;\n"
      "  const long long base = (l / inner) * len * inner + l % inner;\n"
      "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
      "  {6} carry = 0;\n"
      "  for (long long t0 = 0; t0 < len; t0 += 256) {{\n"
      "    const long long t = t0 + threadIdx.x;\n"
      "    {6} a = t < len ? ({6})x[base + t * inner] : ({6})0;\n"
      "#pragma unroll\n"
      "    for (int o = 1; o < 32; o <<= 1) {{\n"
      "      const {6} b = __shfl_up_sync(0xffffffffu, a, o);\n"
      "      if (lane >= o) a += b;\n"
      "    }}\n"
      "    if (lane == 31) warp_total[warp] = a;\n"
      "    __syncthreads();\n"
      "    {6} before = carry, total = 0;\n"
      "#pragma unroll\n"
      "    for (int w = 0; w < 8; ++w) {{\n"
      "      if (w < warp) before += warp_total[w];\n"
      "      total += warp_total[w];\n"
      "    }}\n"
      "    if (t < len) out[base + t * inner] = ({7})(before + a);\n"
      "    carry += total;\n"
      "    __syncthreads();\n"
      "  }}\n}}\n",
      name, dim, params, c_index(outer, dialect), c_index(len, dialect), c_index(inner, dialect), acc, ty, kWaitPriorGrids);
  k.general.entry = name;
  k.general.launch.shape = LaunchShape::BlockPerRow;
  k.general.launch.work = simplify_index(sym::mul(outer, inner));
  k.general.launch.block_threads = 256;
  k.aligned = k.general;
  return k;
}

/// gather (torch.gather), scatter_add (torch.Tensor.scatter_add) and index_add (torch.index_add)
/// along `dim`, each viewed as [outer, L or count, inner] around that dim:
///   gather:      out[o, j, i] = x[o, idx[o, j, i], i]            (out has idx's shape)
///   scatter_add: out[o, s, i] = x[o, s, i] + sum_{j: idx[o, j, i] == s} src[o, j, i]
///   index_add:   out[o, s, i] = x[o, s, i] + sum_{j: idx[j] == s}       src[o, j, i]
/// gather needs idx's sizes equal to x's outside `dim`; scatter_add needs idx's sizes equal to src's
/// and to x's outside `dim` (PyTorch allows smaller index tensors: those stay host steps). The adds
/// are one thread per output element looping over the `count` indices of its line in index order:
/// deterministic, and for f32 / f64 bit-equal to the eager kernel (which adds in index order, one
/// rounding per add), at a cost of out.numel x count index reads (an embedding's backward over B*T
/// tokens reads the B*T indices once per weight element). Element types: f32, f64, i32, i64. An
/// index outside [0, size of dim) traps the launch, as PyTorch's device-side assert does (for the
/// adds only when the output has an element: an empty x with indices is not checked).
/// gather and scatter_add when the index's sizes outside `dim` are not provably those of the input
/// (torch allows smaller ones: a dynamic graph has the targets' length as its own symbol, s1 beside
/// the logits' s0): each thread walks its element's coordinates.
///   gather:      out (idx's shape)[c] = x[c with c_dim = idx[c]]; c_k >= x.size(k) traps
///   scatter_add: out (x's shape)[c] = x[c] + sum over j < idx.size(dim) with idx[c, c_dim = j] == c_dim
///                of src[c, c_dim = j], for c inside idx's sizes outside dim (x[c] elsewhere)
/// An index outside [0, x.size(dim)) traps, as in the equal-shape kernels; adds in index order.
std::optional<CudaKernel> strided_scatter_gather_kernel(const Program& p, const Extern& e, const std::string& name,
                                                        size_t d, const char* t, const char* it, std::string& source,
                                                        std::string& why) {
  using ops::OpKind;
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  const bool is_gather = e.op == OpKind::gather;
  const Buffer& x = buf(e.inputs[0]);
  const Buffer& idx = buf(e.inputs[1]);
  const size_t rank = x.sizes.size();
  const CDialect dialect;
  std::vector<sym::Expr> exprs;
  auto c = [&](const sym::Expr& ex) {
    exprs.push_back(simplify_index(ex));
    return "(" + c_index(exprs.back(), dialect) + ")";
  };
  CudaKernel k;
  k.name = name;
  std::vector<std::string> sig = {fmt::format("const {}* __restrict__ x", t), fmt::format("const {}* __restrict__ idx", it)};
  const size_t n_in = is_gather ? 2 : 3;
  for (size_t i = 0; i < n_in; ++i) k.params.push_back({ParamKind::Buffer, e.inputs[i], 0, 8});
  if (!is_gather) sig.push_back(fmt::format("const {}* __restrict__ src", t));
  sig.push_back(fmt::format("{}* __restrict__ out", t));
  k.params.push_back({ParamKind::Buffer, e.outputs[0], 0, 8});
  std::string body;
  const std::vector<sym::Expr>& walk = is_gather ? idx.sizes : x.sizes;  // the thread's element runs over these
  body += fmt::format("  const long long n = {}, len = {};\n", c(product(walk)), c(x.sizes[d]));
  body += "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {\n";
  body += "    long long rem = g;\n";
  for (size_t q = rank; q-- > 0;)
    body += fmt::format("    const long long c{0} = rem % {1};\n    rem /= {1};\n", q, c(walk[q]));
  if (is_gather) {
    std::string off = "0";
    for (size_t q = 0; q < rank; ++q) {
      if (q == d) continue;
      body += fmt::format("    if (c{} >= {}) __trap();\n", q, c(x.sizes[q]));
      off += fmt::format(" + c{} * {}", q, c(product(x.sizes, q + 1)));
    }
    body += fmt::format(
        "    const long long s = (long long)idx[g];\n"
        "    if (s < 0 || s >= len) __trap();\n"
        "    out[g] = x[{} + s * {}];\n",
        off, c(product(x.sizes, d + 1)));
  } else {
    const Buffer& src = buf(e.inputs[2]);
    std::string inside = "true", ioff = "0", soff = "0";
    for (size_t q = 0; q < rank; ++q) {
      if (q == d) continue;
      inside += fmt::format(" && c{} < {}", q, c(idx.sizes[q]));
      ioff += fmt::format(" + c{} * {}", q, c(product(idx.sizes, q + 1)));
      soff += fmt::format(" + c{} * {}", q, c(product(src.sizes, q + 1)));
    }
    body += fmt::format(
        "    {0} acc = x[g];\n"
        "    if ({1}) {{\n"
        "      const long long count = {2}, istep = {3}, sstep = {4};\n"
        "      const long long ib = {5}, sb = {6};\n"
        "      for (long long j = 0; j < count; ++j) {{\n"
        "        const long long t = (long long)idx[ib + j * istep];\n"
        "        if (t < 0 || t >= len) __trap();\n"
        "        if (t == c{7}) acc += src[sb + j * sstep];\n"
        "      }}\n"
        "    }}\n"
        "    out[g] = acc;\n",
        t, inside, c(idx.sizes[d]), c(product(idx.sizes, d + 1)), c(product(src.sizes, d + 1)), ioff, soff, d);
  }
  body += "  }\n";
  if (!add_symbol_params(p, exprs, k, sig, why)) return std::nullopt;
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  source += fmt::format("\n// {0} (extern {1}, dim {2}, index sizes apart from the input's)\nextern \"C\" __global__ void "
                        "__launch_bounds__(256) {0}({3}) {{\n{4}{5}}}\n",
                        name, ops::op_name(e.op), d, params, kWaitPriorGrids, body);
  k.general.entry = name;
  k.general.launch.block_threads = 256;
  k.general.launch.shape = LaunchShape::GridStride;
  k.general.launch.work = simplify_index(product(walk));
  k.aligned = k.general;
  return k;
}

/// Rows of dim per block of the index_add kernel (registers per thread: one accumulator per row).
constexpr int kIndexAddRows = 16;

std::optional<CudaKernel> scatter_gather_kernel(const Program& p, const Extern& e, const std::string& name,
                                                std::string& source, std::string& why) {
  using ops::OpKind;
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  const bool is_gather = e.op == OpKind::gather, is_index_add = e.op == OpKind::index_add;
  const size_t n_in = is_gather ? 2 : 3;
  if (e.inputs.size() != n_in || e.outputs.size() != 1 ||
      std::any_of(e.inputs.begin(), e.inputs.end(), [](int b) { return b < 0; })) {
    why = "unexpected operands";
    return std::nullopt;
  }
  const Buffer& x = buf(e.inputs[0]);
  const Buffer& idx = buf(e.inputs[1]);
  const Buffer& out = buf(e.outputs[0]);
  const bool element_ok =
      x.dtype == DType::F32 || x.dtype == DType::F64 || x.dtype == DType::I64 || x.dtype == DType::I32;
  const char* t = storage_type(x.dtype);
  if (!element_ok || out.dtype != x.dtype || (idx.dtype != DType::I64 && idx.dtype != DType::I32) || x.sizes.empty() ||
      (!is_gather && buf(e.inputs[2]).dtype != x.dtype)) {
    why = fmt::format("{} of {} by {} (the GPU kernel takes f32, f64, i32 and i64 tensors of rank >= 1 and i64 or i32 "
                      "indices)",
                      ops::op_name(e.op), short_name(x.dtype), short_name(idx.dtype));
    return std::nullopt;
  }
  int64_t dim = 0;
  if (!e.attrs.sym_int("dim").maybe_as_int(dim)) {
    why = "a symbolic dim";
    return std::nullopt;
  }
  const size_t rank = x.sizes.size();
  if (dim < 0) dim += static_cast<int64_t>(rank);
  if (dim < 0 || static_cast<size_t>(dim) >= rank) {
    why = "dim out of range";
    return std::nullopt;
  }
  const size_t d = static_cast<size_t>(dim);
  auto same = [](sym::Expr a, sym::Expr b) { return simplify_index(a) == simplify_index(b); };
  sym::Expr count;
  if (is_index_add) {
    const Buffer& src = buf(e.inputs[2]);
    count = product(idx.sizes);
    bool ok = src.sizes.size() == rank;
    for (size_t k = 0; ok && k < rank; ++k) ok = same(src.sizes[k], k == d ? count : x.sizes[k]);
    if (!ok) {
      why = "source not of x's shape with dim's size the index count";
      return std::nullopt;
    }
  } else {
    bool ok = idx.sizes.size() == rank;
    for (size_t k = 0; ok && k < rank; ++k) ok = k == d || same(idx.sizes[k], x.sizes[k]);
    if (ok && !is_gather) {
      const Buffer& src = buf(e.inputs[2]);
      ok = src.sizes.size() == rank;
      for (size_t k = 0; ok && k < rank; ++k) ok = same(src.sizes[k], idx.sizes[k]);
    }
    if (!ok) {
      if (idx.sizes.size() == rank && (is_gather || buf(e.inputs[2]).sizes.size() == rank))
        return strided_scatter_gather_kernel(p, e, name, d, t, storage_type(idx.dtype), source, why);
      why = "index, source and input of different ranks";
      return std::nullopt;
    }
    count = idx.sizes[d];
  }
  const sym::Expr outer = product(x.sizes, 0, d), len = x.sizes[d], inner = product(x.sizes, d + 1);
  CudaKernel k;
  k.name = name;
  std::vector<std::string> sig = {fmt::format("const {}* __restrict__ x", t),
                                  fmt::format("const {}* __restrict__ idx", storage_type(idx.dtype))};
  for (size_t i = 0; i < n_in; ++i) k.params.push_back({ParamKind::Buffer, e.inputs[i], 0, 8});
  if (!is_gather) sig.push_back(fmt::format("const {}* __restrict__ src", t));
  sig.push_back(fmt::format("{}* __restrict__ out", t));
  k.params.push_back({ParamKind::Buffer, e.outputs[0], 0, 8});
  if (!add_symbol_params(p, {outer, len, inner, count}, k, sig, why)) return std::nullopt;
  std::string params;
  for (size_t i = 0; i < sig.size(); ++i) params += (i ? ", " : "") + sig[i];
  const CDialect dialect;
  const std::string sizes = fmt::format(
      "  const long long outer = {}, len = {}, inner = {}, count = {};\n  (void)outer;\n", c_index(outer, dialect),
      c_index(len, dialect), c_index(inner, dialect), c_index(count, dialect));
  std::string body;
  if (is_index_add) {
    // One block per (o, tile of kIndexAddRows rows of dim, 256 columns of inner): the block walks the
    // indices 256 at a time, compacts (in index order: warp ballots and the warps' counts) those that
    // fall in its tile into shared memory, and each thread adds their source values into the tile's
    // rows of its column, held in registers. Same adds in the same order as one thread per element,
    // at outer x tiles x column blocks x count index reads instead of out.numel x count.
    body = fmt::format(
        "  constexpr int S = {1};\n"
        "  __shared__ long long list[256];\n"
        "  __shared__ int warp_count[8];\n"
        "  const long long tiles = (len + S - 1) / S, col_blocks = (inner + 255) / 256;\n"
        "  long long b = blockIdx.x;\n"
        "  const long long cb = b % col_blocks;\n"
        "  b /= col_blocks;\n"
        "  const long long row0 = (b % tiles) * S, o = b / tiles, i = cb * 256 + threadIdx.x;\n"
        "  if (o >= outer) return;\n"
        "  const bool col = i < inner;\n"
        "  {0} acc[S];\n"
        "#pragma unroll\n"
        "  for (int r = 0; r < S; ++r) acc[r] = col && row0 + r < len ? x[(o * len + row0 + r) * inner + i] : ({0})0;\n"
        "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n"
        "  for (long long base = 0; base < count; base += 256) {{\n"
        "    const long long j = base + threadIdx.x;\n"
        "    bool in = false;\n"
        "    if (j < count) {{\n"
        "      const long long t = (long long)idx[j];\n"
        "      if (t < 0 || t >= len) __trap();\n"
        "      in = t >= row0 && t < row0 + S;\n"
        "    }}\n"
        "    const unsigned m = __ballot_sync(0xffffffffu, in);\n"
        "    if (lane == 0) warp_count[warp] = __popc(m);\n"
        "    __syncthreads();\n"
        "    int before = 0, total = 0;\n"
        "    for (int q = 0; q < 8; ++q) {{\n"
        "      const int n = warp_count[q];\n"
        "      if (q < warp) before += n;\n"
        "      total += n;\n"
        "    }}\n"
        "    if (in) list[before + __popc(m & ((1u << lane) - 1u))] = j;\n"
        "    __syncthreads();\n"
        "    if (col)\n"
        "      for (int e = 0; e < total; ++e) {{\n"
        "        const long long jj = list[e];\n"
        "        const long long r = (long long)idx[jj] - row0;\n"
        "        const {0} v = src[(o * count + jj) * inner + i];\n"
        "#pragma unroll\n"
        "        for (int q = 0; q < S; ++q)\n"
        "          if (q == r) acc[q] += v;\n"
        "      }}\n"
        "    __syncthreads();\n"
        "  }}\n"
        "#pragma unroll\n"
        "  for (int r = 0; r < S; ++r)\n"
        "    if (col && row0 + r < len) out[(o * len + row0 + r) * inner + i] = acc[r];\n",
        t, kIndexAddRows);
  } else if (is_gather)
    body =
        "  const long long n = outer * count * inner;\n"
        "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {\n"
        "    const long long i = g % inner, o = g / inner / count;\n"
        "    const long long s = (long long)idx[g];\n"
        "    if (s < 0 || s >= len) __trap();\n"
        "    out[g] = x[(o * len + s) * inner + i];\n"
        "  }\n";
  else
    body = fmt::format(
        "  const long long n = outer * len * inner;\n"
        "  for (long long g = (long long)blockIdx.x * 256 + threadIdx.x; g < n; g += (long long)gridDim.x * 256) {{\n"
        "    const long long i = g % inner, r = g / inner, s = r % len, o = r / len;\n"
        "    {0} acc = x[g];\n"
        "    for (long long j = 0; j < count; ++j) {{\n"
        "      const long long at = (o * count + j) * inner + i;\n"
        "      const long long t = (long long)idx[{1}];\n"
        "      if (t < 0 || t >= len) __trap();\n"
        "      if (t == s) acc += src[at];\n"
        "    }}\n"
        "    out[g] = acc;\n"
        "  }}\n",
        t, "at");
  source += fmt::format("\n// {0} (extern {1}, dim {2})\nextern \"C\" __global__ void __launch_bounds__(256) {0}({3}) {{\n{4}{5}{6}}}\n",
                        name, ops::op_name(e.op), dim, params, kWaitPriorGrids, sizes, body);
  k.general.entry = name;
  k.general.launch.block_threads = 256;
  if (is_index_add) {
    k.general.launch.shape = LaunchShape::BlockPerRow;
    k.general.launch.work = simplify_index(sym::mul(
        sym::mul(outer, sym::ceildiv(len, sym::integer(kIndexAddRows))), sym::ceildiv(inner, sym::integer(256))));
  } else {
    k.general.launch.shape = LaunchShape::GridStride;
    k.general.launch.work = simplify_index(is_gather ? product(idx.sizes) : product(x.sizes));
  }
  k.aligned = k.general;
  return k;
}

/// The GPU form of an extern that is neither a matrix product nor a host step: a kernel of this file
/// appended to the translation unit (index_select and embedding, gather, scatter_add, index_add, cumsum,
/// scaled_dot_product_attention: attention.h;
/// pooling and nearest resize: pool_kernels.h).
/// nullopt (with `why`) for other ops.
std::optional<CudaKernel> extern_kernel(const Program& p, const Extern& e, const std::string& name, std::string& source,
                                        std::map<std::string, std::string>& entries, std::string& why,
                                        const std::map<int, AttentionView>* views, SizeArgs sizes, bool wgmma) {
  using ops::OpKind;
  // the attention and index_select / embedding kernels take their sizes as the loop kernels do; the
  // other externs by value
  if (e.op == OpKind::scaled_dot_product_attention)
    return attention_kernel(p, e, name, source, entries, why, views, sizes, wgmma);
  if (e.op == OpKind::index_select) return index_select_kernel(p, e, name, source, why, std::nullopt, sizes);
  if (e.op == OpKind::embedding) return index_select_kernel(p, e, name, source, why, 0, sizes);
  if (e.op == OpKind::gather || e.op == OpKind::scatter_add || e.op == OpKind::index_add)
    return scatter_gather_kernel(p, e, name, source, why);
  if (e.op == OpKind::cumsum) return cumsum_kernel(p, e, name, source, why);
  return pool_kernel(p, e, name, source, why);  // pool_kernels.h: pooling and nearest resize, else "no GPU lowering"
}


/// Kernel dedup (the cpu backend's, for CUDA C): kernels whose entry points are the same text once
/// their own names and their buffer parameters are made local are compiled once. Buffers are numbered
/// by first appearance in the bodies (parameter lists are in buffer-id order, which differs between
/// the layers of a model when they share constants), and the parameter list is compared as a set of
/// (type, local number) plus the size parameters in order. A later equal kernel leaves the translation
/// unit; it launches the first one's entry points with its own buffers put in the first one's
/// parameter order, and keeps its own launch and variant rules. Transformer layers repeat the same
/// kernels: NVRTC time then stops growing with the depth. Returns the number of kernels removed.
int dedup_kernels(RenderedProgram& r) {
  const std::string marker = "extern \"C\" __global__";
  const size_t first = r.source.find(marker);
  if (first == std::string::npos) return 0;
  // entry chunks: from one `extern "C" __global__` at a line start to the next
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t at = first; at != std::string::npos;) {
    size_t next = r.source.find("\n" + marker, at + 1);
    const size_t end = next == std::string::npos ? r.source.size() : next + 1;
    chunks.push_back({at, end});
    at = next == std::string::npos ? next : next + 1;
  }
  auto entry_name = [&](const std::pair<size_t, size_t>& c) {  // `void [__launch_bounds__(T)] NAME(`
    size_t from = r.source.find(" void ", c.first) + 6;
    if (r.source.compare(from, 18, "__launch_bounds__(") == 0) from = r.source.find(')', from) + 2;
    return r.source.substr(from, r.source.find('(', from) - from);
  };
  std::map<std::string, size_t> chunk_of;
  for (size_t i = 0; i < chunks.size(); ++i) chunk_of[entry_name(chunks[i])] = i;
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  // Replaces every whole token b<digits> of `text` through `local` (numbering new ones); fills `order`.
  auto renumber = [&](const std::string& text, std::map<int, int>& local, std::vector<int>& order) {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      size_t j = i + 1;
      const bool start = text[i] == 'b' && (i == 0 || !ident(text[i - 1]));
      while (start && j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
      if (start && j > i + 1 && j - i < 10 && (j == text.size() || !ident(text[j]))) {
        const int id = std::stoi(text.substr(i + 1, j - i - 1));
        auto [it, fresh] = local.try_emplace(id, static_cast<int>(local.size()));
        if (fresh) order.push_back(id);
        out += "B" + std::to_string(it->second);
        i = j;
      } else {
        out += text[i++];
      }
    }
    return out;
  };
  struct Canon {
    bool ok = false;
    std::string text;
    std::map<int, int> local;  // buffer id → local number
    std::vector<int> by_local; // local number → buffer id
  };
  auto canonical = [&](const CudaKernel& k) {
    Canon c;
    std::vector<std::string> entries = {k.general.entry};
    if (k.aligned.entry != k.general.entry) entries.push_back(k.aligned.entry);
    std::vector<std::string> sigs, bodies;
    for (const std::string& e : entries) {
      auto it = chunk_of.find(e);
      if (it == chunk_of.end()) return c;
      const auto [b, end] = chunks[it->second];
      const size_t open = r.source.find('(', r.source.find(e, b));
      const size_t brace = r.source.find('{', open);
      const size_t close = r.source.rfind(')', brace);
      if (open == std::string::npos || brace == std::string::npos || brace >= end || close < open) return c;
      sigs.push_back(r.source.substr(open + 1, close - open - 1));
      bodies.push_back(r.source.substr(brace, end - brace));
    }
    // accumulators are numbered across the program (acc<N>, acc<N>_s): made local too
    std::map<std::string, int> accs;
    auto local_accs = [&](const std::string& text) {
      std::string out;
      for (size_t i = 0; i < text.size();) {
        size_t j = i + 3;
        const bool start = text.compare(i, 3, "acc") == 0 && (i == 0 || !ident(text[i - 1]));
        while (start && j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) ++j;
        if (start && j > i + 3 && (j == text.size() || !std::isalnum(static_cast<unsigned char>(text[j])))) {
          auto [it, fresh] = accs.try_emplace(text.substr(i, j - i), static_cast<int>(accs.size()));
          out += "ACC" + std::to_string(it->second);
          i = j;
        } else {
          out += text[i++];
        }
      }
      return out;
    };
    for (const std::string& body : bodies) c.text += renumber(local_accs(body), c.local, c.by_local) + "\n";
    for (const std::string& sig : sigs) {  // parameters: buffers as a sorted set, sizes in order
      std::map<int, std::string> buffers;
      std::string sizes;
      size_t at = 0;
      while (at <= sig.size()) {
        size_t comma = sig.find(", ", at);
        const std::string prm = sig.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        const size_t sp = prm.rfind(' ');
        const std::string name = sp == std::string::npos ? prm : prm.substr(sp + 1);
        std::vector<int> extra;
        const std::string n = renumber(name, c.local, extra);
        for (int id : extra) c.by_local.push_back(id);
        if (n != name) buffers[std::stoi(n.substr(1))] = prm.substr(0, sp + 1) + n;
        else sizes += prm + ";";
        if (comma == std::string::npos) break;
        at = comma + 2;
      }
      c.text += "(";
      for (const auto& [l, t] : buffers) c.text += t + ";";
      c.text += "|" + sizes + ")";
    }
    for (const KernelParam& prm : k.params)  // every buffer parameter is a b<id> of the text
      if (prm.kind == ParamKind::Buffer && !c.local.count(prm.index)) return c;
    c.ok = true;
    return c;
  };
  std::map<std::string, size_t> seen;
  std::vector<Canon> canons(r.kernels.size());
  std::vector<bool> drop(chunks.size(), false);
  int removed = 0;
  for (size_t i = 0; i < r.kernels.size(); ++i) {
    CudaKernel& k = r.kernels[i];
    canons[i] = canonical(k);
    if (!canons[i].ok) continue;
    auto [it, fresh] = seen.try_emplace(canons[i].text, i);
    if (fresh) continue;
    const CudaKernel& orig = r.kernels[it->second];
    const Canon& oc = canons[it->second];
    const Canon& kc = canons[i];
    if (orig.params.size() != k.params.size() || oc.by_local.size() != kc.by_local.size()) continue;
    std::vector<KernelParam> params = orig.params;  // the first kernel's order, this kernel's buffers
    bool ok = true;
    size_t sym = 0;
    std::vector<int> own_symbols;
    for (const KernelParam& prm : k.params)
      if (prm.kind == ParamKind::Symbol) own_symbols.push_back(prm.index);
    for (KernelParam& prm : params) {
      if (prm.kind == ParamKind::Buffer) {
        prm.index = kc.by_local[static_cast<size_t>(oc.local.at(prm.index))];
      } else if (prm.kind == ParamKind::Symbol) {
        if (sym >= own_symbols.size()) ok = false;
        else prm.index = own_symbols[sym++];
      }
    }
    if (!ok) continue;
    drop[chunk_of[k.general.entry]] = true;
    drop[chunk_of[k.aligned.entry]] = true;
    k.general.entry = orig.general.entry;
    k.aligned.entry = orig.aligned.entry;
    k.params = std::move(params);
    k.arg_block_bytes = orig.arg_block_bytes;
    ++removed;
  }
  if (!removed) return 0;
  std::string src = r.source.substr(0, first);
  for (size_t i = 0; i < chunks.size(); ++i)
    if (!drop[i]) src += r.source.substr(chunks[i].first, chunks[i].second - chunks[i].first);
  r.source = std::move(src);
  return removed;
}

}  // namespace

bool add_symbol_params(const Program& p, const std::vector<sym::Expr>& exprs, CudaKernel& k,
                       std::vector<std::string>& sig, std::string& why, std::string* loads) {
  std::vector<sym::Expr> used;
  for (const sym::Expr& ex : exprs)
    for (const sym::Expr& f : sym::free_symbols(ex))
      if (std::find(used.begin(), used.end(), f) == used.end()) used.push_back(f);
  for (const sym::Expr& f : used) {
    const auto it = std::find(p.symbols.begin(), p.symbols.end(), f);
    if (it == p.symbols.end()) {
      why = fmt::format("size symbol {} is not a program symbol", sym::print(f));
      return false;
    }
    const int index = static_cast<int>(it - p.symbols.begin());
    if (loads) {
      *loads += size_load("long long", f->name, static_cast<size_t>(index));
      continue;
    }
    k.params.push_back({ParamKind::Symbol, index, 0, 8});
    sig.push_back("long long " + f->name);
  }
  if (loads && !loads->empty()) {
    k.params.push_back({ParamKind::Sizes, -1, 0, 8});
    sig.push_back(kSizesParam);
  }
  for (size_t i = 0; i < k.params.size(); ++i) k.params[i].offset = static_cast<uint32_t>(8 * i);
  k.arg_block_bytes = static_cast<uint32_t>(8 * k.params.size());
  return true;
}

std::map<int, BlasEpilogue> fold_blas_epilogues(Program& p) {
  std::map<int, BlasEpilogue> folded;
  for (size_t i = 0; i + 1 < p.steps.size(); ++i) {
    const loop::Step& st = p.steps[i];
    const loop::Step& next = p.steps[i + 1];
    if (st.is_kernel || !next.is_kernel) continue;
    Extern& e = p.externs[static_cast<size_t>(st.index)];
    std::string why;
    std::optional<BlasStep> b = blas_step(p, e, why);
    if (!b) continue;
    const int o = b->out;
    const Buffer& ob = p.buffers[static_cast<size_t>(o)];
    if (ob.kind != BufferKind::Temp || ob.sizes.empty()) continue;
    Kernel& k = p.kernels[static_cast<size_t>(next.index)];
    if (k.stages.empty() || k.stages[0].kind != StageKind::Pointwise) continue;
    // The kernel is the epilogue alone (one stage over the product's elements), or a row kernel whose
    // first stage computes it over the row (a residual stream stored by its LayerNorm's kernel,
    // loop/schedule.h); the row's later stages then read what the product writes.
    const bool row = k.stages.size() > 1 && !k.stages[0].inner.empty();
    if (!row && (k.stages.size() != 1 || !k.stages[0].inner.empty())) continue;
    const Stage& s = k.stages[0];
    // the stage's loop variables and extents, dims of extent 1 dropped, against the product's dims
    std::vector<sym::Expr> vars, extents, dims;
    for (size_t d = 0; d < k.outer.size(); ++d)
      if (!row || !k.outer[d]->is_integer(1)) {
        vars.push_back(outer_var(d));
        extents.push_back(k.outer[d]);
      }
    for (size_t d = 0; row && d < s.inner.size(); ++d)
      if (!s.inner[d]->is_integer(1)) {
        vars.push_back(loop::inner_var(d));
        extents.push_back(s.inner[d]);
      }
    for (const sym::Expr& d : ob.sizes)
      if (!row || !d->is_integer(1)) dims.push_back(d);
    if (vars.empty() || extents != dims) continue;
    const sym::Expr idx = linear_index(vars, dims);
    const Buffer& out = p.buffers[static_cast<size_t>(s.out)];
    if (s.out_index != idx || out.dtype != ob.dtype || out.kind == BufferKind::Input) continue;
    if (row ? product(out.sizes) != product(ob.sizes) : out.sizes != ob.sizes) continue;
    if (read_elsewhere(p, o, next.index, st.index)) continue;
    if (row && reads_buffer(k, 1, o)) continue;
    BlasEpilogue ep;
    if (!match_epilogue(p, s.body, o, idx, vars.back(), ep)) continue;
    if (ep.bias >= 0 && b->epilogue.bias >= 0) continue;  // a linear's own bias and a second one
    // the product writes the kernel's output directly; the kernel (or its first stage) goes
    e.outputs[0] = s.out;
    p.buffers[static_cast<size_t>(s.out)].from_extern = true;
    // written by the product now, one step earlier than planned: out of any shared slot (the slot's
    // previous holder may be the product's own input, whose last read is this step)
    p.buffers[static_cast<size_t>(s.out)].slot = -1;
    folded[st.index] = ep;
    if (row) {
      k.stages.erase(k.stages.begin());
      if (!k.schedule.stages.empty()) k.schedule.stages.erase(k.schedule.stages.begin());
      continue;
    }
    const int gone = next.index;
    std::vector<int> release = next.release;
    p.kernels.erase(p.kernels.begin() + gone);
    p.steps.erase(p.steps.begin() + static_cast<long>(i) + 1);
    for (loop::Step& x : p.steps)
      if (x.is_kernel && x.index > gone) --x.index;
    p.steps[i].release.insert(p.steps[i].release.end(), release.begin(), release.end());
  }
  return folded;
}

int fold_index_copies(Program& p) {
  int folded = 0;
  for (size_t ei = 0; ei < p.externs.size(); ++ei) {
    Extern& e = p.externs[ei];
    if ((e.op != ops::OpKind::index_select && e.op != ops::OpKind::embedding) || e.inputs.size() != 2) continue;
    const int x = e.inputs[1];
    if (x < 0 || e.inputs[0] == x) continue;
    const Buffer& xb = p.buffers[static_cast<size_t>(x)];
    if (xb.kind != BufferKind::Temp || xb.from_extern) continue;
    // the one stage writing x
    int kernel = -1, stage = -1, writers = 0;
    for (size_t ki = 0; ki < p.kernels.size(); ++ki)
      for (size_t si = 0; si < p.kernels[ki].stages.size(); ++si) {
        const Stage& st = p.kernels[ki].stages[si];
        if (st.out == x || st.out2 == x) {
          ++writers;
          kernel = static_cast<int>(ki);
          stage = static_cast<int>(si);
        }
      }
    if (writers != 1) continue;
    const Kernel& k = p.kernels[static_cast<size_t>(kernel)];
    const Stage& st = k.stages[static_cast<size_t>(stage)];
    if (st.kind != StageKind::Pointwise || !st.inner.empty() || k.outer != xb.sizes || st.body->op != SOp::Load) continue;
    const int src = st.body->buffer;
    const Buffer& sb = p.buffers[static_cast<size_t>(src)];
    if (src == x || sb.dtype != xb.dtype || st.out2 >= 0) continue;
    std::vector<sym::Expr> vars;
    for (size_t d = 0; d < k.outer.size(); ++d) vars.push_back(outer_var(d));
    const sym::Expr idx = linear_index(vars, xb.sizes);
    // element i of x is element i of src: the same position in both, and as many elements
    if (st.out_index != idx || simplify_index(st.body->index) != idx) continue;
    if (simplify_index(product(sb.sizes)) != simplify_index(product(xb.sizes))) continue;
    if (read_elsewhere(p, x, kernel, static_cast<int>(ei)) || reads_buffer(k, 0, x)) continue;
    Extern probe = e;
    probe.inputs[1] = src;
    std::string scratch, why;
    if (!index_select_kernel(p, probe, "probe", scratch, why, e.op == ops::OpKind::embedding ? std::optional<int64_t>(0) : std::nullopt))
      continue;
    e.inputs[1] = src;
    if (sb.kind == BufferKind::Temp) p.buffers[static_cast<size_t>(src)].slot = -1;  // lives on to the lookup
    loop::remove_stage(p, kernel, stage);
    // src's release, where its last reader was the copy, moves to the lookup's step
    bool released = false;
    for (loop::Step& step : p.steps) {
      if (!step.is_kernel && step.index == static_cast<int>(ei)) {
        if (released) step.release.push_back(src);
        break;
      }
      const auto it = std::find(step.release.begin(), step.release.end(), src);
      if (it != step.release.end()) {
        step.release.erase(it);
        released = true;
      }
    }
    ++folded;
  }
  return folded;
}

namespace {

/// `e` is Cast(f32, Load(x, idx)) of a bf16 buffer: x, else -1.
int f32_load_of(const SExpr& e, const sym::Expr& idx) {
  if (e->op != SOp::Cast || e->dtype != DType::F32) return -1;
  const SExpr& l = e->args[0];
  if (l->op != SOp::Load || l->dtype != DType::BF16 || l->index != idx) return -1;
  return l->buffer;
}

/// `e` is a Load of a constant buffer at `idx` (through a cast to f32): the buffer, else -1.
int constant_load_of(const Program& p, const SExpr& e, const sym::Expr& idx) {
  const SExpr& l = e->op == SOp::Cast ? e->args[0] : e;
  if (l->op != SOp::Load || l->index != idx) return -1;
  const Buffer& b = p.buffers[static_cast<size_t>(l->buffer)];
  if (b.kind != BufferKind::Constant || !b.constant.defined()) return -1;
  return l->buffer;
}

/// The two operands of binary `fn` node `e`, in either order, such that `first(a)` holds: (a, b).
std::optional<std::pair<SExpr, SExpr>> operands(const SExpr& e, ScalarOp fn, const std::function<bool(const SExpr&)>& first) {
  if (e->op != SOp::Binary || e->fn != fn || e->args.size() != 2) return std::nullopt;
  if (first(e->args[0])) return std::pair{e->args[0], e->args[1]};
  if (first(e->args[1])) return std::pair{e->args[1], e->args[0]};
  return std::nullopt;
}

struct LayerNormMatch {
  int x = -1, y = -1, gamma = -1, beta = -1;
  int64_t k = 0;
  double eps = 0;
};

/// Loop kernel `k` as a LayerNorm over rows of a constant length (fold_layer_norm_prologues' form).
std::optional<LayerNormMatch> match_layer_norm_kernel(const Program& p, const Kernel& k) {
  if (k.stages.size() != 2) return std::nullopt;
  const Stage& r = k.stages[0];
  const Stage& w = k.stages[1];
  if (r.kind != StageKind::Reduction || r.reduce_op != "welford" || w.kind != StageKind::Pointwise) return std::nullopt;
  if (r.inner.size() != 1 || w.inner != r.inner || !r.inner[0]->is_integer() || r.stash >= 0) return std::nullopt;
  if (r.out >= 0 || r.out2 >= 0 || w.out < 0 || !w.out_index) return std::nullopt;
  LayerNormMatch m;
  m.k = r.inner[0]->value;
  m.y = w.out;
  const sym::Expr idx = w.out_index;
  m.x = f32_load_of(r.body, idx);
  if (m.x < 0 || p.buffers[static_cast<size_t>(m.y)].dtype != DType::BF16) return std::nullopt;
  // bf16(fma(mul(sub(f32(x), mean), rsqrt(add(mul(M2, 1/k), eps))), gamma, beta))
  const SExpr& body = w.body;
  if (body->op != SOp::Cast || body->dtype != DType::BF16) return std::nullopt;
  const SExpr& f = body->args[0];
  if (f->op != SOp::Fma || f->args.size() != 3) return std::nullopt;
  const sym::Expr r0 = loop::inner_var(0);
  m.gamma = constant_load_of(p, f->args[1], r0);
  m.beta = constant_load_of(p, f->args[2], r0);
  if (m.gamma < 0 || m.beta < 0) return std::nullopt;
  auto is_local = [](const SExpr& e, const std::string& name) { return e->op == SOp::Local && e->name == name; };
  auto centered = operands(f->args[0], ScalarOp::mul, [&](const SExpr& e) {  // sub(f32(x), mean)
    return e->op == SOp::Binary && e->fn == ScalarOp::sub && f32_load_of(e->args[0], idx) == m.x &&
           is_local(e->args[1], r.local);
  });
  if (!centered) return std::nullopt;
  const SExpr& rs = centered->second;
  if (rs->op != SOp::Unary || rs->fn != ScalarOp::rsqrt) return std::nullopt;
  auto var_eps = operands(rs->args[0], ScalarOp::add, [&](const SExpr& e) { return e->op == SOp::Binary; });
  if (!var_eps || var_eps->second->op != SOp::Const) return std::nullopt;
  auto m2 = operands(var_eps->first, ScalarOp::mul, [&](const SExpr& e) { return is_local(e, r.local2); });
  if (!m2 || m2->second->op != SOp::Const) return std::nullopt;
  if (static_cast<float>(m2->second->fval) != static_cast<float>(1.0 / static_cast<double>(m.k))) return std::nullopt;  // biased
  m.eps = var_eps->second->fval;
  for (int c : {m.gamma, m.beta})
    if (p.buffers[static_cast<size_t>(c)].constant.int_numel() != m.k) return std::nullopt;
  return m;
}

}  // namespace

int fold_layer_norm_prologues(const Program& p, CudaProgram& cp, const std::string& arch) {
  if (arch.rfind("sm_90", 0) != 0 || !observe::env_on("PROTEAN_CUDA_GENERATED_PRODUCTS") ||
      !observe::env_on("PROTEAN_CUDA_FOLD_LAYER_NORM"))
    return 0;
  if (cp.steps.size() != p.steps.size()) return 0;  // one step per loop step (compile_cuda_program)
  int folded = 0;
  for (size_t bi = 0; bi < cp.steps.size(); ++bi) {
    if (cp.steps[bi].kind != StepKind::Blas) continue;
    BlasStep& s = cp.blas[static_cast<size_t>(cp.steps[bi].index)];
    if ((s.op != BlasOp::Matmul && s.op != BlasOp::Linear) || !s.batch->is_integer(1) || !s.n->is_integer() ||
        !s.k->is_integer())
      continue;
    // the generated product's own rule for a folded LayerNorm (hopper_gemm.h), at the step's rows (1
    // where they follow the symbols: the rule is then asked again per call)
    BlasStep probe = s;
    probe.prologue.kernel_step = 0;
    BlasShape shape;
    shape.m = s.m->is_integer() ? s.m->value : 1;
    shape.n = s.n->value;
    shape.k = s.k->value;
    if (!generated_product_fits(probe, shape)) continue;
    const PlannedBuffer& wb = cp.buffers.buffers[static_cast<size_t>(s.b)];
    if (wb.kind != BufferKind::Constant || !wb.constant.defined() || wb.sizes.size() != 2) continue;
    // the kernel step that writes the product's left operand
    size_t li = bi;
    std::optional<LayerNormMatch> m;
    for (size_t i = bi; i-- > 0;) {
      if (!p.steps[i].is_kernel) continue;
      const Kernel& k = p.kernels[static_cast<size_t>(p.steps[i].index)];
      bool writes = false;
      for (const Stage& st : k.stages) writes = writes || st.out == s.a || st.out2 == s.a;
      if (!writes) continue;
      m = match_layer_norm_kernel(p, k);
      li = i;
      break;
    }
    if (!m || m->y != s.a || m->k != s.k->value || cp.steps[li].kind != StepKind::Kernel) continue;
    if (read_elsewhere(p, s.a, p.steps[li].index, p.steps[bi].index)) continue;
    const PlannedBuffer& xb = cp.buffers.buffers[static_cast<size_t>(m->x)];
    const PlannedBuffer& yb = cp.buffers.buffers[static_cast<size_t>(s.a)];
    if (xb.dtype != DType::BF16 || xb.sizes.empty() || !(xb.sizes.back() == s.k) ||
        simplify_index(product(xb.sizes)) != simplify_index(product(yb.sizes)))
      continue;
    // x is read by the product now: where its last read was the kernel or a step before the product,
    // its life reaches the product (out of any shared slot, its release moved to the product's step)
    bool released = false;
    for (size_t i = li; i < bi; ++i) {
      std::vector<int>& rel = cp.steps[i].release;
      if (auto it = std::find(rel.begin(), rel.end(), m->x); it != rel.end()) {
        rel.erase(it);
        released = true;
      }
    }
    if (released) {
      cp.steps[bi].release.push_back(m->x);
      PlannedBuffer& x = cp.buffers.buffers[static_cast<size_t>(m->x)];
      if (x.slot >= 0) {
        std::vector<int>& members = cp.buffers.slots[static_cast<size_t>(x.slot)].members;
        members.erase(std::remove(members.begin(), members.end(), m->x), members.end());
        x.slot = -1;
      }
    }
    auto add_constant = [&](DType t, std::vector<sym::Expr> sizes) {
      PlannedBuffer b;
      b.id = static_cast<int>(cp.buffers.buffers.size());
      b.dtype = t;
      b.bytes = sym::integer(static_cast<int64_t>(itemsize(t)) * product(sizes)->value);
      b.sizes = std::move(sizes);
      b.kind = BufferKind::Constant;
      b.derived = true;
      cp.buffers.buffers.push_back(std::move(b));
      return cp.buffers.buffers.back().id;
    };
    LayerNormPrologue& pr = s.prologue;
    pr.kernel_step = static_cast<int>(li);
    pr.x = m->x;
    pr.gamma = m->gamma;
    pr.beta = m->beta;
    pr.eps = m->eps;
    pr.weight = add_constant(DType::BF16, cp.buffers.buffers[static_cast<size_t>(s.b)].sizes);
    pr.vectors = add_constant(DType::F32, {sym::integer(2), s.n});
    cp.steps[li].prologue_of = cp.steps[bi].index;
    ++folded;
  }
  if (folded) derive_prologue_constants(cp);
  return folded;
}

std::optional<BlasStep> blas_step(const Program& p, const Extern& e, std::string& why) {
  using ops::OpKind;
  auto buf = [&](int id) -> const Buffer& { return p.buffers[static_cast<size_t>(id)]; };
  BlasStep s;
  s.kind = e.op;
  if (e.op == OpKind::matmul) s.op = BlasOp::Matmul;
  else if (e.op == OpKind::bmm) s.op = BlasOp::Bmm;
  else if (e.op == OpKind::linear) s.op = BlasOp::Linear;
  else {
    why = "no GPU lowering";
    return std::nullopt;
  }
  if (e.inputs.size() < 2 || e.outputs.size() != 1 || e.inputs[0] < 0 || e.inputs[1] < 0) {
    why = "unexpected operands";
    return std::nullopt;
  }
  const Buffer& a = buf(e.inputs[0]);
  const Buffer& b = buf(e.inputs[1]);
  const Buffer& o = buf(e.outputs[0]);
  if (!blas_dtype(a.dtype) || a.dtype != b.dtype || a.dtype != o.dtype) {
    why = fmt::format("dtype {} (cuBLASLt steps take f32, bf16 and f16)", short_name(a.dtype));
    return std::nullopt;
  }
  s.a = e.inputs[0];
  s.b = e.inputs[1];
  s.out = e.outputs[0];
  s.dtype = a.dtype;
  s.batch = sym::integer(1);
  s.batch_stride_a = sym::integer(0);
  s.batch_stride_b = sym::integer(0);
  const size_t ra = a.sizes.size(), rb = b.sizes.size();
  if (s.op == BlasOp::Linear) {
    if (ra < 1 || rb != 2) {
      why = "linear with a weight that is not 2-D";
      return std::nullopt;
    }
    s.transpose_b = true;
    s.m = product(a.sizes, 0, ra - 1);
    s.k = a.sizes[ra - 1];
    s.n = b.sizes[0];
    if (e.inputs.size() > 2 && e.inputs[2] >= 0) s.epilogue.bias = e.inputs[2];
    return s;
  }
  if (ra < 2 || rb < 2) {
    why = "a matrix-vector product";
    return std::nullopt;
  }
  s.m = a.sizes[ra - 2];
  s.k = a.sizes[ra - 1];
  s.n = b.sizes[rb - 1];
  if (rb == 2) {  // [..., m, k] x [k, n]: the batch flattens into rows
    s.m = product(a.sizes, 0, ra - 1);
    return s;
  }
  if (ra == rb && ra > 3) {  // [B..., m, k] x [B..., k, n]: the batch dims flatten into one (dense buffers)
    const sym::Expr ba = product(a.sizes, 0, ra - 2), bb = product(b.sizes, 0, rb - 2);
    bool same = true, a_ones = true, b_ones = true;
    for (size_t d = 0; d + 2 < ra; ++d) {
      same = same && a.sizes[d] == b.sizes[d];
      a_ones = a_ones && a.sizes[d]->is_integer(1);
      b_ones = b_ones && b.sizes[d]->is_integer(1);
    }
    if (!same && !a_ones && !b_ones) {
      why = "batch dims that broadcast partly";
      return std::nullopt;
    }
    s.batch = same || b_ones ? ba : bb;
    s.batch_stride_a = a_ones && !same ? sym::integer(0) : simplify_index(sym::mul(s.m, s.k));
    s.batch_stride_b = b_ones && !same ? sym::integer(0) : simplify_index(sym::mul(s.k, s.n));
    return s;
  }
  if (ra == 3 && rb == 3) {
    const sym::Expr ba = a.sizes[0], bb = b.sizes[0];
    s.batch = ba;
    s.batch_stride_a = simplify_index(sym::mul(s.m, s.k));
    s.batch_stride_b = simplify_index(sym::mul(s.k, s.n));
    if (ba != bb) {
      if (bb->is_integer(1)) s.batch_stride_b = sym::integer(0);
      else if (ba->is_integer(1)) {
        s.batch = bb;
        s.batch_stride_a = sym::integer(0);
      } else {
        why = "batch sizes that differ";
        return std::nullopt;
      }
    }
    return s;
  }
  why = fmt::format("a {}-D x {}-D product (2-D, flattened, and batches of equal rank go to cuBLASLt)", ra, rb);
  return std::nullopt;
}

CudaProgram compile_cuda_program(const BackendInput& in, const CudaCompileOptions& o, CudaCompileInfo* info) {
  CudaCompileInfo local;
  CudaCompileInfo& ci = info ? *info : local;
  const std::string graph = in.graph ? in.graph->name : "?";
  if (!in.graph) throw CompileError("cuda backend: no graph to compile");
  for (size_t i = 0; i < in.symbols.size(); ++i) {
    if (!in.symbols[i] || !in.symbols[i]->is_symbol())
      throw CompileError(fmt::format("cuda backend: size argument {} of graph '{}' is {}, not a size symbol", i, graph,
                                     in.symbols[i] ? "'" + sym::print(in.symbols[i]) + "'" : "missing"));
    for (size_t j = 0; j < i; ++j)
      if (in.symbols[j] == in.symbols[i])
        throw CompileError(fmt::format("cuda backend: size arguments {} and {} of graph '{}' are the same symbol {}", j, i, graph,
                                       sym::print(in.symbols[i])));
  }

  // graph rewrites on the backend's own copy: attention written out as matmul-softmax-matmul becomes
  // one scaled_dot_product_attention (backend/attention_pattern.h), the fused kernel of attention.h
  const bool fused_attention = o.fused_attention && observe::env_on("PROTEAN_CUDA_FUSED_ATTENTION");
  ir::Graph g = *in.graph;
  // A regional compile's call_regions: the body of each use inlined (ir/passes/inline_regions.h): the
  // capture still ran once per region key; kernel dedup below builds the uses' equal kernels once.
  if (ir::has_regions(g)) {
    g = ci.phases.time("cuda region inlining", [&] { return ir::inline_regions(g); });
    log_step(in.compile_id, "cuda graph after region inlining", [&] { return ir::print(g); });
  }
  if (fused_attention) {
    AttentionPatternOptions ao;
    ao.half_dtypes = true;
    ao.masks = true;
    ci.fused_attention = ci.phases.time("cuda attention fusion", [&] { return fuse_attention_patterns(g, ao); });
    if (ci.fused_attention)
      log_step(in.compile_id,
               fmt::format("cuda graph after attention fusion ({} matmul-softmax-matmul patterns became "
                           "scaled_dot_product_attention)", ci.fused_attention),
               [&] { return ir::print(g); });
  }
  loop::LowerOptions lo;
  lo.half_storage = true;  // bf16/f16 buffers, f32 compute (codegen.h)
  lo.fused_attention_half = fused_attention;  // bf16/f16 attention, masked or not, as the kernel of attention.h
  lo.decompose_attention_backward = true;  // f32 attention backward: cuBLASLt products and loop kernels
  Program p = ci.phases.time("cuda lowering", [&] { return loop::lower_graph(g, kernel_symbols(in), lo); });
  ci.schedule = ci.phases.time("cuda scheduling", [&] { return loop::schedule_program(p); });
  const std::map<int, BlasEpilogue> epilogues = ci.phases.time("cuda epilogue folding", [&] { return fold_blas_epilogues(p); });
  ci.folded_epilogues = static_cast<int>(epilogues.size());
  const AttentionViews views = ci.phases.time("cuda attention views", [&] { return fold_attention_views(p); });
  for (const auto& [ext, v] : views) ci.attention_views += static_cast<int>(v.size());
  ci.index_copies = ci.phases.time("cuda index copies", [&] { return fold_index_copies(p); });
  // the capture's symbol bounds (marks, guards), then the options' own (tests), the tighter one winning
  loop::CudaScheduleOptions so = o.schedule;
  if (const int64_t t = observe::env_int("PROTEAN_CUDA_MIN_RESIDENT_THREADS", 0, 1, int64_t{1} << 30); t > 0)
    so.min_resident_threads = static_cast<int>(t);
  // rows per block of the warp-per-row kernels (1, 2 or 4): part of the plan's key, as every
  // PROTEAN_CUDA_* variable
  so.warp_rows_per_block = observe::env_choice("PROTEAN_CUDA_WARP_ROWS_PER_BLOCK", {1, 2, 4}, so.warp_rows_per_block);
  so.warp_fill_blocks = observe::env_int("PROTEAN_CUDA_WARP_FILL_BLOCKS", so.warp_fill_blocks, 0, int64_t{1} << 20);
  for (const auto& [name, hi] : in.upper_bounds) {
    auto [it, fresh] = so.upper_bounds.emplace(name, hi);
    if (!fresh) it->second = std::min(it->second, hi);
  }
  ci.phases.time("cuda schedule policy", [&] { loop::apply_schedule(p, loop::CudaSchedulePolicy(so)); });
  // the loop IR text (with each kernel's schedule) only when asked for (compile_cuda_program with
  // `info`, or the output_code log)
  if (info || observe::log_enabled(observe::LogCat::OutputCode)) ci.loop_ir = to_text(p);
  log_step(in.compile_id, "cuda loop IR after scheduling", [&] { return ci.loop_ir; });
  log_step(in.compile_id, "cuda schedules", [&] {
    std::string t;
    for (const loop::Kernel& k : p.kernels) t += k.name + ": " + loop::schedule_text(k) + "\n";
    return t;
  });

  CudaProgram cp;
  cp.name = graph;
  cp.symbols = p.symbols;
  const char* approx_env = std::getenv("PROTEAN_CUDA_APPROX_MATH");
  const bool approx = o.approx_math && !(approx_env && std::string(approx_env) == "0");
  // CUDA graphs (modes reduce-overhead and max-autotune): sizes from memory, so that a graph node keeps
  // its arguments and grid at every size of its bucket (graphs.h)
  const SizeArgs sizes = o.sizes_in_memory && (in.mode == "reduce-overhead" || in.mode == "max-autotune") &&
                                 observe::env_on("PROTEAN_CUDA_SIZES_IN_MEMORY")
                             ? SizeArgs::FromMemory
                             : SizeArgs::ByValue;
  RenderedProgram r = ci.phases.time("cuda codegen", [&] { return render_cuda(p, approx, sizes); });
  const char* dedup_env = std::getenv("PROTEAN_CUDA_KERNEL_DEDUP");
  if (o.dedup_kernels && !(dedup_env && std::string(dedup_env) == "0"))
    ci.deduplicated = ci.phases.time("cuda kernel dedup", [&] { return dedup_kernels(r); });
  // the grid-stride cap, and for the generated kernels (whose warp-per-row text reads its rows per block
  // from blockDim.x) the blocks a warp-per-row launch fills; tuned variants keep theirs fixed
  auto grid_limits = [&](CudaKernel& k, bool generated) {
    for (LaunchRule* l : {&k.general.launch, &k.aligned.launch}) {
      l->max_blocks = o.schedule.max_grid_blocks;
      if (generated && l->shape == LaunchShape::WarpPerRow) l->fill_blocks = so.warp_fill_blocks;
    }
  };
  for (CudaKernel& k : r.kernels) grid_limits(k, true);
  // max-autotune: the row kernels' candidate variants (rows per block, vector width), tuned per bucket
  // by the graph runner (graphs.h), which compiles their unit when a bucket first needs it
  if (in.mode == "max-autotune" && observe::env_on("PROTEAN_AUTOTUNE_VARIANTS")) {
    cp.tune_source = ci.phases.time("cuda tune variants", [&] { return render_tune_variants(p, r.kernels, approx, kMaxTunedRowKernels, sizes); });
    for (const CudaKernel& k : r.kernels) ci.tune_variants += static_cast<int>(k.tune.size());
  }
  cp.source = std::move(r.source);
  cp.kernels = std::move(r.kernels);
  cp.buffers = plan_buffers(p);

  // steps in program order
  std::map<std::string, std::string> extern_entries;  // equal extern kernels share one entry (attention.h)
  for (const loop::Step& st : p.steps) {
    Step s;
    s.release = st.release;
    if (st.is_kernel) {
      s.kind = StepKind::Kernel;
      s.index = st.index;
    } else {
      const Extern& e = p.externs[static_cast<size_t>(st.index)];
      std::string why, conv_why;
      if (std::optional<BlasStep> b = blas_step(p, e, why)) {
        if (auto f = epilogues.find(st.index); f != epilogues.end()) {
          const int bias = b->epilogue.bias;  // linear's own bias stays
          b->epilogue = f->second;
          if (bias >= 0) b->epilogue.bias = bias;
        }
        s.kind = StepKind::Blas;
        s.index = static_cast<int>(cp.blas.size());
        cp.blas.push_back(std::move(*b));
      } else if (std::optional<ConvStep> c = conv_step(p, e, conv_why)) {  // cuDNN (dnn.h)
        s.kind = StepKind::Conv;
        s.index = static_cast<int>(cp.conv.size());
        cp.conv.push_back(std::move(*c));
      } else if (std::optional<CudaKernel> k = extern_kernel(p, e, fmt::format("ext{}_{}", st.index, ops::op_name(e.op)),
                                                             cp.source, extern_entries, why,
                                                             views.count(st.index) ? &views.at(st.index) : nullptr, sizes,
                                                             o.nvrtc.arch == "sm_90a")) {
        s.kind = StepKind::Kernel;
        s.index = static_cast<int>(cp.kernels.size());
        grid_limits(*k, false);
        cp.kernels.push_back(std::move(*k));
      } else {
        if (e.op == ops::OpKind::conv2d || e.op == ops::OpKind::conv_transpose2d) why = conv_why;  // why cuDNN did not take it
        s.kind = StepKind::Host;
        s.index = static_cast<int>(cp.host.size());
        if (observe::log_enabled(observe::LogCat::PerfHints))
          observe::log_line(observe::LogCat::PerfHints, in.compile_id,
                            fmt::format("cuda backend: {} runs on the host ({}): its inputs and outputs are copied between "
                                        "device and host",
                                        ops::op_name(e.op), why));
        cp.host.push_back({e, why});
      }
    }
    cp.steps.push_back(std::move(s));
  }
  ci.folded_layer_norms = ci.phases.time("cuda layer_norm folding", [&] { return fold_layer_norm_prologues(p, cp, o.nvrtc.arch); });
  if (ci.folded_layer_norms)
    log_step(in.compile_id, fmt::format("cuda layer_norm folding ({} LayerNorm kernels a generated product may compute)", ci.folded_layer_norms),
             [&] {
               std::string t;
               for (size_t i = 0; i < cp.blas.size(); ++i)
                 if (const LayerNormPrologue& pr = cp.blas[i].prologue; pr.kernel_step >= 0)
                   t += fmt::format("blas{} (b{}): the LayerNorm of b{} at step {} (gamma b{}, beta b{}), folded weight b{}, "
                                    "vectors b{}\n",
                                    i, cp.blas[i].out, pr.x, pr.kernel_step, pr.gamma, pr.beta, pr.weight, pr.vectors);
               return t;
             });
  log_step(in.compile_id, "cuda output code", [&] { return cp.source; });
  ci.kernels = static_cast<int>(cp.kernels.size());
  ci.blas = static_cast<int>(cp.blas.size());
  ci.host = static_cast<int>(cp.host.size());
  ci.conv = static_cast<int>(cp.conv.size());
  const std::set<std::string> waiting = entries_waiting_for_prior_grids(cp.source);
  for (CudaKernel& k : cp.kernels)
    k.waits_for_prior_grids = waiting.count(k.general.entry) && waiting.count(k.aligned.entry);

  if (o.compile && !cp.kernels.empty()) {
    const std::string tu = fmt::format("{}.cu", graph.empty() ? "graph" : graph);
    NvrtcResult res = ci.phases.time("cuda nvrtc", [&] { return nvrtc_compile(cp.source, tu, o.nvrtc); });
    cp.cubin = std::move(res.cubin);
    cp.compile_log = res.log;
    ci.nvrtc_log = res.log;
    ci.nvrtc_ms = res.seconds * 1e3;
    for (CudaKernel& k : cp.kernels) {
      if (auto it = res.resources.find(k.general.entry); it != res.resources.end()) k.general.resources = it->second;
      if (auto it = res.resources.find(k.aligned.entry); it != res.resources.end()) k.aligned.resources = it->second;
    }
    cp.key.source_hash = XXH64(cp.source.data(), cp.source.size(), 0);
    cp.key.nvrtc_version = nvrtc_version();
    cp.key.arch = o.nvrtc.arch;
    for (const std::string& f : nvrtc_flags(o.nvrtc)) cp.key.flags += (cp.key.flags.empty() ? "" : " ") + f;
    cp.key.protean_version = version();
    if (!cp.tune_source.empty()) {
      NvrtcResult t = ci.phases.time("cuda nvrtc (tune variants)",
                                     [&] { return nvrtc_compile(cp.tune_source, tu.substr(0, tu.size() - 3) + "_tune.cu", o.nvrtc); });
      cp.tune_cubin = std::move(t.cubin);
      ci.nvrtc_log += t.log;
      for (CudaKernel& k : cp.kernels)
        for (TuneVariant& v : k.tune)
          if (auto it = t.resources.find(v.variant.entry); it != t.resources.end()) v.variant.resources = it->second;
    }
  }
  return cp;
}

}  // namespace protean::backend::cuda
