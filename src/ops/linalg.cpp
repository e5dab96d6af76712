// linalg_det (torch.linalg.det, ONNX Det): the determinant of each square matrix of A [..., n, n].
// Each matrix is factored as P·A = L·U by Gaussian elimination with partial pivoting (the row of
// largest magnitude in the column becomes the pivot), in double whatever A's dtype; det = sign(P) ·
// Π U[k][k]. A zero pivot column means a singular matrix: det 0. n = 0 gives 1 (the empty product).
// Non-finite entries propagate through the arithmetic (NaN in, NaN out).
#include <fmt/format.h>

#include <cmath>
#include <utility>
#include <vector>

#include "core/strided_copy.h"
#include "ops/dispatch.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

constexpr OpKind kOp = OpKind::linalg_det;

std::vector<TensorMeta> meta_det(std::span<const Tensor> in, const Attrs&) {
  const Tensor& A = in[0];
  if (!A.defined()) throw ValueError(fmt::format("{}: A is required", describe_call(kOp, in)));
  check_dtype(is_floating(A.dtype()), "linalg_det", A.dtype(), "f16, bf16, f32 or f64");
  if (A.dim() < 2) throw ShapeError(fmt::format("{}: A must be [..., n, n]", describe_call(kOp, in)));
  if (!static_cast<bool>(A.size(-1) == A.size(-2)))
    throw ShapeError(fmt::format("{}: A must hold square matrices, got {}", describe_call(kOp, in), to_string(A.sizes())));
  SymIntVec out(A.sizes().begin(), A.sizes().end() - 2);
  return one(std::move(out), A.dtype());
}

/// det of the n×n row-major matrix at m (overwritten by its U factor).
double lu_det(double* m, int64_t n) {
  double det = 1.0;
  for (int64_t k = 0; k < n; ++k) {
    int64_t p = k;
    double best = std::abs(m[k * n + k]);
    for (int64_t i = k + 1; i < n; ++i)
      if (std::abs(m[i * n + k]) > best) {
        best = std::abs(m[i * n + k]);
        p = i;
      }
    if (best == 0.0) return 0.0 * det;  // singular (0 * NaN stays NaN)
    if (p != k) {
      for (int64_t j = 0; j < n; ++j) std::swap(m[k * n + j], m[p * n + j]);
      det = -det;
    }
    const double piv = m[k * n + k];
    det *= piv;
    for (int64_t i = k + 1; i < n; ++i) {
      const double f = m[i * n + k] / piv;
      if (f == 0.0) continue;
      for (int64_t j = k + 1; j < n; ++j) m[i * n + j] -= f * m[k * n + j];
    }
  }
  return det;
}

std::vector<Tensor> kernel_det(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  Tensor a = core::contiguous_copy(in[0], DType::F64);
  const int64_t n = in[0].size(-1).guard_int();
  Tensor y = empty_like_meta(out[0]);
  const int64_t batch = y.int_numel();
  std::vector<double> dets(static_cast<size_t>(batch));
  double* p = a.data_ptr<double>();
  for (int64_t b = 0; b < batch; ++b) dets[static_cast<size_t>(b)] = n == 0 ? 1.0 : lu_det(p + b * n * n, n);
  if (batch > 0) core::copy_into(y, from_blob(dets.data(), y.int_sizes(), DType::F64));
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(linalg_det, meta_det, kernel_det);

}  // namespace protean::ops

namespace protean {

Tensor linalg_det(const Tensor& A) { return ops::call1(ops::OpKind::linalg_det, {A}); }

}  // namespace protean
