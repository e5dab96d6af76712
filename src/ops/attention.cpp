// scaled_dot_product_attention, kept whole in the graph and decomposed here for eager execution:
//
//   scores = q · kᵀ · scale            (protean::matmul; [..., L, S])
//   scores += mask                      (float mask: additive; bool mask: false → -inf)
//   scores[i, j] = -inf for j > i       (is_causal: top-left aligned, like tril(ones(L, S)))
//   p = softmax(scores, -1)             (a row with every entry -inf gives zeros, not NaN, like
//                                        PyTorch's math backend since 2.5)
//   out = p · v                         (protean::matmul; [..., L, Ev])
//
// Shapes: q [..., L, E], k [..., S, E], v [..., S, Ev]; batch dims broadcast. scale defaults to
// 1/sqrt(E). f16/bf16 compute in f32, f32 in f32, f64 in f64. A mask together with is_causal is a
// ValueError (as in PyTorch).
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ops/dispatch.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"
#include "protean/ops.h"

namespace protean::ops {

namespace {

constexpr OpKind kOp = OpKind::scaled_dot_product_attention;

SymIntVec batch_of(const Tensor& t) { return SymIntVec(t.sizes().begin(), t.sizes().end() - 2); }

std::vector<TensorMeta> meta_sdpa(std::span<const Tensor> in, const Attrs& a) {
  const Tensor &q = in[0], &k = in[1], &v = in[2], &mask = in[3];
  for (int i = 0; i < 3; ++i) {
    if (!in[static_cast<size_t>(i)].defined())
      throw ValueError(fmt::format("{}: q, k and v are required", describe_call(kOp, in)));
    if (in[static_cast<size_t>(i)].dim() < 2)
      throw ShapeError(fmt::format("{}: q, k and v need at least 2 dims ([..., L, E])", describe_call(kOp, in)));
  }
  check_dtype(is_floating(q.dtype()), "scaled_dot_product_attention", q.dtype(), "f16, bf16, f32 or f64");
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw TypeError(fmt::format("{}: q, k and v must have the same dtype", describe_call(kOp, in)));
  if (!static_cast<bool>(q.size(-1) == k.size(-1)))
    throw ShapeError(fmt::format("{}: q and k must have the same embedding size E (last dim)", describe_call(kOp, in)));
  if (!static_cast<bool>(k.size(-2) == v.size(-2)))
    throw ShapeError(fmt::format("{}: k and v must have the same sequence length S (dim -2)", describe_call(kOp, in)));
  // On a GPU the fused attention kernel is generated per head dim (its tiles and fragments are sized
  // by it), so a symbolic head dim (dynamic=On) is specialized to the traced one, recorded as a
  // specialization with a guard, rather than leaving the whole attention to a host step. On the CPU
  // the kernels take any head dim and the symbol stays.
  if (q.device().type == DeviceType::CUDA) {
    if (q.size(-1).is_symbolic()) (void)q.size(-1).guard_int();
    if (v.size(-1).is_symbolic()) (void)v.size(-1).guard_int();
  }
  SymIntVec batch = broadcast_shapes(broadcast_shapes(batch_of(q), batch_of(k), "scaled_dot_product_attention"),
                                     batch_of(v), "scaled_dot_product_attention");
  SymInt L = q.size(-2), S = k.size(-2), Ev = v.size(-1);
  if (mask.defined()) {
    if (a.has("is_causal") && a.b("is_causal"))
      throw ValueError(fmt::format("{}: pass either an explicit mask or is_causal=true, not both",
                                   describe_call(kOp, in)));
    if (mask.dtype() != DType::Bool && !is_floating(mask.dtype()))
      throw TypeError(fmt::format("{}: mask must be bool (true = keep) or floating (additive), got {}",
                                  describe_call(kOp, in), short_name(mask.dtype())));
    SymIntVec full = batch;
    full.push_back(L);
    full.push_back(S);
    SymIntVec b = broadcast_shapes(mask.sizes(), full, "scaled_dot_product_attention (mask)");
    if (b.size() != full.size())
      throw ShapeError(fmt::format("{}: mask of shape {} does not broadcast to {}", describe_call(kOp, in),
                                   to_string(mask.sizes()), to_string(full)));
    for (size_t i = 0; i < b.size(); ++i)
      if (!static_cast<bool>(b[i] == full[i]))
        throw ShapeError(fmt::format("{}: mask of shape {} does not broadcast to {}", describe_call(kOp, in),
                                     to_string(mask.sizes()), to_string(full)));
  }
  batch.push_back(L);
  batch.push_back(Ev);
  return one(std::move(batch), q.dtype());
}

std::vector<Tensor> kernel_sdpa(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  const Tensor &q = in[0], &k = in[1], &v = in[2], &mask = in[3];
  TraceHookScope eager(nullptr);  // the decomposition runs eagerly even if a hook is installed
  DType ct = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor qc = q.dtype() == ct ? q : core::contiguous_copy(q, ct);
  Tensor kc = k.dtype() == ct ? k : core::contiguous_copy(k, ct);
  Tensor vc = v.dtype() == ct ? v : core::contiguous_copy(v, ct);
  int64_t E = q.int_sizes().back();
  double scale = a.has("scale") ? a.f("scale") : 1.0 / std::sqrt(static_cast<double>(E));
  bool causal = a.has("is_causal") && a.b("is_causal");

  Tensor scores = matmul(qc, transpose(kc, -2, -1));
  if (!scores.is_contiguous() || scores.dtype() != ct) scores = core::contiguous_copy(scores, ct);
  IntVec ss = scores.int_sizes();
  int64_t L = ss[ss.size() - 2], S = ss.back();
  int64_t rows = scores.int_numel() / std::max<int64_t>(S, 1);
  if (S > 0 && rows > 0) {
    // The mask, broadcast to the scores' shape and converted to f64 once (bool: 1 keep / 0 drop).
    Tensor m;
    if (mask.defined()) m = core::contiguous_copy(expand(mask, scores.sizes()), DType::F64);
    const bool bool_mask = mask.defined() && mask.dtype() == DType::Bool;
    dispatch_dtype(ct, [&]<typename T>() {
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        T* ps = scores.data_ptr<T>();
        const double* pm = m.defined() ? m.data_ptr<double>() : nullptr;
        const double ninf = -std::numeric_limits<double>::infinity();
#pragma omp parallel for schedule(static) if (rows * S > 16384)
        for (int64_t row = 0; row < rows; ++row) {
          int64_t i = row % L;
          T* s = ps + row * S;
          const double* mrow = pm ? pm + row * S : nullptr;
          std::vector<double> buf(static_cast<size_t>(S));
          double mx = ninf;
          for (int64_t j = 0; j < S; ++j) {
            double x = static_cast<double>(s[j]) * scale;
            if (causal && j > i) x = ninf;
            if (mrow) {
              if (bool_mask) {
                if (mrow[j] == 0.0) x = ninf;
              } else {
                x += mrow[j];
              }
            }
            buf[static_cast<size_t>(j)] = x;
            mx = std::max(mx, x);
          }
          if (mx == ninf) {  // fully masked row
            for (int64_t j = 0; j < S; ++j) s[j] = T(0);
            continue;
          }
          double sum = 0;
          for (int64_t j = 0; j < S; ++j) sum += (buf[static_cast<size_t>(j)] = std::exp(buf[static_cast<size_t>(j)] - mx));
          for (int64_t j = 0; j < S; ++j) s[j] = static_cast<T>(buf[static_cast<size_t>(j)] / sum);
        }
      }
    });
  }
  Tensor o = matmul(scores, vc);
  Tensor y = empty_like_meta(out[0]);
  core::copy_into(y, o.int_sizes() == y.int_sizes() ? o : expand(o, y.sizes()));
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(scaled_dot_product_attention, meta_sdpa, kernel_sdpa);

}  // namespace protean::ops
