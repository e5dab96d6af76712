// lstm: one ONNX-semantics LSTM layer (onnx.ai operator LSTM, opset 7+; default activations
// sigmoid / tanh / tanh, no clipping, layout 0: the importer permutes a batch-first layout).
//
// Inputs (index: tensor):
//   0 X [T, N, I]   1 W [D, 4H, I]   2 R [D, 4H, H]   3 B? [D, 8H] = [Wb, Rb]
//   4 seq_lens? [N] (integer)        5 h0? [D, N, H]  6 c0? [D, N, H]   (absent h0/c0 → zeros)
//   7 P? [D, 3H] peephole weights p_i, p_o, p_f (absent → no peepholes)
// Gate order inside W, R, Wb, Rb: i, o, f, c (ONNX's, not PyTorch's i, f, g, o). Per step t:
//   g = W·x_t + R·h + Wb + Rb;  i = σ(g_i + p_i ⊙ c)  f = σ(g_f + p_f ⊙ c)  c̃ = tanh(g_c)
//   c' = f ⊙ c + i ⊙ c̃;        o = σ(g_o + p_o ⊙ c');  h = o ⊙ tanh(c')
// D = 1 for "forward"/"reverse", 2 for "bidirectional" (direction 0 forward, 1 reverse).
// seq_lens: batch entry n only runs its first seq_lens[n] steps (a reverse direction starts at step
// seq_lens[n] - 1); Y at t >= seq_lens[n] is 0 and Y_h / Y_c hold the state after the last valid step
// (the initial state when seq_lens[n] == 0), as ONNX Runtime does.
// Outputs: Y [T, D, N, H], Y_h [D, N, H], Y_c [D, N, H], dtype of X. f16/bf16/f32 compute in double
// like f64 (sizes in real models are small; exactness matters more).
#include <fmt/format.h>

#include <cmath>

#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "core/strided_copy.h"

namespace protean::ops {

namespace {

constexpr OpKind kOp = OpKind::lstm;

int64_t num_directions(OpKind, std::span<const Tensor> in, const std::string& dir) {
  if (dir == "forward" || dir == "reverse") return 1;
  if (dir == "bidirectional") return 2;
  throw ValueError(fmt::format("{}: direction must be forward, reverse or bidirectional, got \"{}\"",
                               describe_call(kOp, in), dir));
}

void expect_shape(std::span<const Tensor> in, size_t i, const char* name, const SymIntVec& want) {
  const Tensor& t = in[i];
  bool ok = t.dim() == static_cast<int64_t>(want.size());
  for (size_t d = 0; ok && d < want.size(); ++d) ok = static_cast<bool>(t.sizes()[d] == want[d]);
  if (!ok)
    throw ShapeError(fmt::format("{}: {} must have shape {}, got {}", describe_call(kOp, in), name, to_string(want),
                                 to_string(t.sizes())));
}

std::vector<TensorMeta> meta_lstm(std::span<const Tensor> in, const Attrs& a) {
  const Tensor &X = in[0], &W = in[1], &R = in[2];
  if (!X.defined() || !W.defined() || !R.defined())
    throw ValueError(fmt::format("{}: X, W and R are required", describe_call(kOp, in)));
  if (X.dim() != 3) throw ShapeError(fmt::format("{}: X must be [T, N, I]", describe_call(kOp, in)));
  check_dtype(is_floating(X.dtype()), "lstm", X.dtype(), "f16, bf16, f32 or f64");
  for (size_t i : {1, 2, 3, 5, 6, 7})
    if (in[i].defined() && in[i].dtype() != X.dtype())
      throw TypeError(fmt::format("{}: W, R, B, h0, c0 and P must have X's dtype {}", describe_call(kOp, in),
                                  short_name(X.dtype())));
  int64_t D = num_directions(kOp, in, a.s("direction"));
  SymInt H = a.sym_int("hidden_size");
  SymInt T = X.size(0), N = X.size(1), I = X.size(2);
  expect_shape(in, 1, "W", {D, 4 * H, I});
  expect_shape(in, 2, "R", {D, 4 * H, H});
  if (in[3].defined()) expect_shape(in, 3, "B", {D, 8 * H});
  if (in[4].defined()) {
    expect_shape(in, 4, "seq_lens", {N});
    if (!is_integral(in[4].dtype()))
      throw TypeError(fmt::format("{}: seq_lens must be an integer tensor", describe_call(kOp, in)));
  }
  if (in[5].defined()) expect_shape(in, 5, "h0", {D, N, H});
  if (in[6].defined()) expect_shape(in, 6, "c0", {D, N, H});
  if (in.size() > 7 && in[7].defined()) expect_shape(in, 7, "P", {D, 3 * H});
  std::vector<TensorMeta> out;
  out.push_back(TensorMeta::contiguous({T, SymInt(D), N, H}, X.dtype()));
  out.push_back(TensorMeta::contiguous({SymInt(D), N, H}, X.dtype()));
  out.push_back(TensorMeta::contiguous({SymInt(D), N, H}, X.dtype()));
  return out;
}

std::vector<double> as_f64(const Tensor& t) {
  if (!t.defined()) return {};
  Tensor c = core::contiguous_copy(t, DType::F64);
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.int_numel());
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

std::vector<Tensor> kernel_lstm(std::span<const Tensor> in, const Attrs& a, std::span<const TensorMeta> out) {
  IntVec xs = in[0].int_sizes();
  const int64_t T = xs[0], N = xs[1], I = xs[2];
  const int64_t H = a.i("hidden_size");
  const std::string& dir = a.s("direction");
  const int64_t D = num_directions(kOp, in, dir);
  std::vector<double> X = as_f64(in[0]), W = as_f64(in[1]), R = as_f64(in[2]), B = as_f64(in[3]);
  std::vector<double> h0 = as_f64(in[5]), c0 = as_f64(in[6]);
  std::vector<double> P = in.size() > 7 ? as_f64(in[7]) : std::vector<double>{};
  std::vector<int64_t> lens(static_cast<size_t>(N), T);
  if (in[4].defined()) {
    Tensor sl = core::contiguous_copy(in[4], DType::I64);
    for (int64_t n = 0; n < N; ++n) {
      int64_t v = sl.data_ptr<int64_t>()[n];
      if (v < 0 || v > T)
        throw ValueError(fmt::format("{}: seq_lens[{}] = {} is out of range [0, {}] (T = {})", describe_call(kOp, in),
                                     n, v, T, T));
      lens[static_cast<size_t>(n)] = v;
    }
  }
  std::vector<double> Y(static_cast<size_t>(T * D * N * H), 0.0), Yh(static_cast<size_t>(D * N * H)),
      Yc(static_cast<size_t>(D * N * H));
  const int64_t G = 4 * H;
  for (int64_t d = 0; d < D; ++d) {
    const bool reverse = dir == "reverse" || d == 1;
    const double* Wd = W.data() + d * G * I;
    const double* Rd = R.data() + d * G * H;
    const double* Wb = B.empty() ? nullptr : B.data() + d * 2 * G;
    const double* Rb = B.empty() ? nullptr : B.data() + d * 2 * G + G;
    const double* Pd = P.empty() ? nullptr : P.data() + d * 3 * H;  // p_i, p_o, p_f
#pragma omp parallel for schedule(static) if (N > 1 && T * N * G * (I + H) > 65536)
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> h(static_cast<size_t>(H), 0.0), c(static_cast<size_t>(H), 0.0), g(static_cast<size_t>(G));
      for (int64_t j = 0; j < H; ++j) {
        if (!h0.empty()) h[static_cast<size_t>(j)] = h0[static_cast<size_t>((d * N + n) * H + j)];
        if (!c0.empty()) c[static_cast<size_t>(j)] = c0[static_cast<size_t>((d * N + n) * H + j)];
      }
      const int64_t len = lens[static_cast<size_t>(n)];
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = reverse ? len - 1 - s : s;
        const double* x = X.data() + (t * N + n) * I;
        for (int64_t r = 0; r < G; ++r) {
          double acc = Wb ? Wb[r] + Rb[r] : 0.0;
          const double* wr = Wd + r * I;
          for (int64_t k = 0; k < I; ++k) acc += wr[k] * x[k];
          const double* rr = Rd + r * H;
          for (int64_t k = 0; k < H; ++k) acc += rr[k] * h[static_cast<size_t>(k)];
          g[static_cast<size_t>(r)] = acc;
        }
        for (int64_t j = 0; j < H; ++j) {
          const double cp = c[static_cast<size_t>(j)];
          double gi = sigmoid(g[static_cast<size_t>(j)] + (Pd ? Pd[j] * cp : 0.0));
          double gf = sigmoid(g[static_cast<size_t>(2 * H + j)] + (Pd ? Pd[2 * H + j] * cp : 0.0));
          double gc = std::tanh(g[static_cast<size_t>(3 * H + j)]);
          double cn = gf * cp + gi * gc;
          double go = sigmoid(g[static_cast<size_t>(H + j)] + (Pd ? Pd[H + j] * cn : 0.0));
          c[static_cast<size_t>(j)] = cn;
          h[static_cast<size_t>(j)] = go * std::tanh(cn);
        }
        double* y = Y.data() + ((t * D + d) * N + n) * H;
        for (int64_t j = 0; j < H; ++j) y[j] = h[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < H; ++j) {
        Yh[static_cast<size_t>((d * N + n) * H + j)] = h[static_cast<size_t>(j)];
        Yc[static_cast<size_t>((d * N + n) * H + j)] = c[static_cast<size_t>(j)];
      }
    }
  }
  std::vector<Tensor> res;
  std::vector<double>* bufs[] = {&Y, &Yh, &Yc};
  for (size_t i = 0; i < 3; ++i) {
    Tensor y = empty_like_meta(out[i]);
    IntVec sz = y.int_sizes();
    if (!bufs[i]->empty()) core::copy_into(y, from_blob(bufs[i]->data(), sz, DType::F64));
    res.push_back(y);
  }
  return res;
}

}  // namespace

PROTEAN_REGISTER_OP(lstm, meta_lstm, kernel_lstm);

}  // namespace protean::ops
