// Ops that reverse-mode rules need (src/ops/derivatives.def): index_add, scatter_add, the backward of
// the three 2-D pools, and philox_uniform (counter-based random numbers for dropout: the same seed and
// offset give the same numbers, so a recomputed dropout mask equals the one of the forward pass).
//
// Kernels read their inputs through strides (no contiguous copies, no nested op calls), accumulate in
// double for f32/f64 (and in float for f16/bf16) and write contiguous outputs.
#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "ops/dispatch.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/pool2x2.h"
#include "ops/registry.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;
using kernel::dispatch_float;
using kernel::parallel_for;

/// Element offset of row-major linear index `lin` in a tensor of `sizes`/`strides`.
int64_t offset_of(int64_t lin, const IntVec& sizes, const IntVec& strides) {
  int64_t off = 0;
  for (size_t k = sizes.size(); k-- > 0;) {
    int64_t c = lin % sizes[k];
    lin /= sizes[k];
    off += c * strides[k];
  }
  return off;
}

std::vector<int64_t> read_indices(OpKind op, Ins in, const Tensor& idx, int64_t bound, int64_t dim) {
  if (!is_integral(idx.dtype()) || idx.dtype() == DType::Bool)
    throw TypeError(fmt::format("{}: index must be an integer tensor, got {}", describe_call(op, in),
                                short_name(idx.dtype())));
  IntVec s = idx.int_sizes(), st = idx.int_strides();
  int64_t n = idx.int_numel();
  std::vector<int64_t> v(static_cast<size_t>(n));
  dispatch_dtype(idx.dtype(), [&]<typename T>() {
    const T* p = idx.data_ptr<T>();
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<int64_t>(p[offset_of(i, s, st)]);
  });
  for (int64_t i : v)
    if (i < 0 || i >= bound)
      throw ValueError(fmt::format("{}: index {} is out of bounds for dim {} with size {} (valid: [0, {}))",
                                   describe_call(op, in), i, dim, bound, bound));
  return v;
}

/// A contiguous copy of `x` into `out` (same sizes, any strides), element by element.
template <typename T>
void copy_into(const Tensor& x, T* out) {
  IntVec s = x.int_sizes(), st = x.int_strides();
  const T* p = x.data_ptr<T>();
  int64_t n = x.int_numel();
  for (int64_t i = 0; i < n; ++i) out[i] = p[offset_of(i, s, st)];
}

// ---- index_add(x, index, source; dim) ----------------------------------------------------------------
std::vector<TensorMeta> meta_index_add(Ins in, const Attrs& a) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  if (x.dim() == 0) throw ValueError(fmt::format("{}: x must have at least one dim", describe_call(OpKind::index_add, in)));
  int64_t d = wrap_dim(a.i("dim"), x.dim(), "index_add");
  if (idx.dim() > 1)
    throw ShapeError(fmt::format("{}: index must be 0-D or 1-D", describe_call(OpKind::index_add, in)));
  if (src.dtype() != x.dtype())
    throw TypeError(fmt::format("{}: source dtype must equal x's", describe_call(OpKind::index_add, in)));
  bool ok = src.dim() == x.dim();
  for (int64_t i = 0; ok && i < x.dim(); ++i)
    ok = i == d ? static_cast<bool>(src.size(i) == idx.numel()) : static_cast<bool>(src.size(i) == x.size(i));
  if (!ok)
    throw ShapeError(fmt::format("{}: source must have x's shape with dim {} of the index's length",
                                 describe_call(OpKind::index_add, in), d));
  return one(x.sizes(), x.dtype());
}

std::vector<Tensor> kernel_index_add(Ins in, const Attrs& a, Outs out) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  Tensor y = empty_like_meta(out[0]);
  int64_t d = wrap_dim(a.i("dim"), x.dim(), "index_add");
  IntVec xs = x.int_sizes();
  std::vector<int64_t> iv = read_indices(OpKind::index_add, in, idx, xs[static_cast<size_t>(d)], d);
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= xs[static_cast<size_t>(i)];
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= xs[static_cast<size_t>(i)];
  int64_t L = xs[static_cast<size_t>(d)], n = static_cast<int64_t>(iv.size());
  IntVec ss = src.int_sizes(), sst = src.int_strides();
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      T* py = y.data_ptr<T>();
      copy_into<T>(x, py);
      const T* ps = src.data_ptr<T>();
      if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        if (src.is_contiguous() && inner > 1) {
          // Rows of `inner` values added whole (an embedding's gradient: a [tokens, d] source into the
          // [vocab, d] table), each thread owning a range of columns, so repeated indices still add in
          // index order and every element sums exactly as below (a float sum rounded from double is
          // the float sum).
          parallel_for(inner, outer * n, [&](int64_t b, int64_t e) {
            for (int64_t o = 0; o < outer; ++o)
              for (int64_t k = 0; k < n; ++k) {
                T* dst = py + (o * L + iv[static_cast<size_t>(k)]) * inner;
                const T* row = ps + (o * n + k) * inner;
#pragma omp simd
                for (int64_t i = b; i < e; ++i) dst[i] += row[i];
              }
          });
          return;
        }
      }
      // Parallel over (outer, inner): every thread owns its output columns, so repeated indices add
      // in index order, deterministically.
      parallel_for(outer * inner, n, [&](int64_t b, int64_t e) {
        for (int64_t oi = b; oi < e; ++oi) {
          int64_t o = oi / inner, i = oi % inner;
          for (int64_t k = 0; k < n; ++k) {
            int64_t lin = (o * n + k) * inner + i;
            T& dst = py[(o * L + iv[static_cast<size_t>(k)]) * inner + i];
            dst = static_cast<T>(static_cast<double>(dst) + static_cast<double>(ps[offset_of(lin, ss, sst)]));
          }
        }
      });
    }
  });
  return {y};
}

// ---- scatter_add(x, index, src; dim) -----------------------------------------------------------------
std::vector<TensorMeta> meta_scatter_add(Ins in, const Attrs& a) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  int64_t r = std::max<int64_t>(x.dim(), 1);
  wrap_dim(a.i("dim"), x.dim(), "scatter_add");
  if (std::max<int64_t>(idx.dim(), 1) != r || std::max<int64_t>(src.dim(), 1) != r)
    throw ShapeError(fmt::format("{}: index and src must have x's rank", describe_call(OpKind::scatter_add, in)));
  if (src.dtype() != x.dtype())
    throw TypeError(fmt::format("{}: src dtype must equal x's", describe_call(OpKind::scatter_add, in)));
  for (int64_t i = 0; i < idx.dim(); ++i)
    if (!static_cast<bool>(idx.size(i) <= src.size(i)))
      throw ShapeError(fmt::format("{}: index size at dim {} exceeds src's", describe_call(OpKind::scatter_add, in), i));
  return one(x.sizes(), x.dtype());
}

std::vector<Tensor> kernel_scatter_add(Ins in, const Attrs& a, Outs out) {
  const Tensor &x = in[0], &idx = in[1], &src = in[2];
  Tensor y = empty_like_meta(out[0]);
  int64_t d = x.dim() == 0 ? 0 : wrap_dim(a.i("dim"), x.dim(), "scatter_add");
  IntVec xs = x.dim() == 0 ? IntVec{1} : x.int_sizes();
  std::vector<int64_t> iv = read_indices(OpKind::scatter_add, in, idx, xs[static_cast<size_t>(d)], d);
  IntVec is = idx.dim() == 0 ? IntVec{1} : idx.int_sizes();
  IntVec ss = src.dim() == 0 ? IntVec{1} : src.int_sizes(), sst = src.dim() == 0 ? IntVec{0} : src.int_strides();
  IntVec ys = hints(contiguous_strides(to_symint_vec(xs)));
  dispatch_dtype(x.dtype(), [&]<typename T>() {
    if constexpr (!std::is_same_v<T, bool>) {
      T* py = y.data_ptr<T>();
      copy_into<T>(x, py);
      const T* ps = src.data_ptr<T>();
      int64_t n = static_cast<int64_t>(iv.size());
      for (int64_t lin = 0; lin < n; ++lin) {  // serial: repeated indices add in order
        int64_t rem = lin, yo = 0, so = 0;
        for (size_t k = is.size(); k-- > 0;) {
          int64_t c = rem % is[k];
          rem /= is[k];
          so += c * sst[k];
          yo += (static_cast<int64_t>(k) == d ? iv[static_cast<size_t>(lin)] : c) * ys[k];
        }
        py[yo] = static_cast<T>(static_cast<double>(py[yo]) + static_cast<double>(ps[so]));
      }
    }
  });
  return {y};
}

// ---- pool backward ----------------------------------------------------------------------------------
IntVec pair_of(const Attrs& a, const char* name, IntVec dflt) {
  IntVec v = a.has(name) ? a.ints(name) : dflt;
  if (v.empty()) v = dflt;
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

std::vector<TensorMeta> meta_pool_backward(Ins in, const Attrs&) {
  const Tensor &g = in[0], &x = in[1];
  if ((x.dim() != 3 && x.dim() != 4) || g.dim() != x.dim())
    throw ShapeError(fmt::format("{}: expected grad_output and x of rank 3 or 4", describe_call(OpKind::max_pool2d_backward, in)));
  if (!is_floating(x.dtype()) || g.dtype() != x.dtype())
    throw TypeError(fmt::format("{}: expected floating grad_output and x of one dtype",
                                describe_call(OpKind::max_pool2d_backward, in)));
  return one(x.sizes(), x.dtype());
}

enum class PoolKind { Max, Avg, Adaptive };

std::vector<Tensor> pool_backward(PoolKind kind, Ins in, const Attrs& a, Outs out) {
  const Tensor &g = in[0], &x = in[1];
  Tensor gx = empty_like_meta(out[0]);
  IntVec xs = x.int_sizes(), xst = x.int_strides(), gs = g.int_sizes(), gst = g.int_strides();
  if (xs.size() == 3) {
    xs.insert(xs.begin(), 1), xst.insert(xst.begin(), 0), gs.insert(gs.begin(), 1), gst.insert(gst.begin(), 0);
  }
  int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], OH = gs[2], OW = gs[3];
  IntVec k = kind == PoolKind::Adaptive ? IntVec{1, 1} : pair_of(a, "kernel_size", {});
  IntVec s = kind == PoolKind::Adaptive ? IntVec{1, 1} : pair_of(a, "stride", k);
  IntVec p = kind == PoolKind::Adaptive ? IntVec{0, 0} : pair_of(a, "padding", {0, 0});
  IntVec dl = kind == PoolKind::Max ? pair_of(a, "dilation", {1, 1}) : IntVec{1, 1};
  bool include_pad = !a.has("count_include_pad") || a.b("count_include_pad");
  dispatch_float(x.dtype(), "pool backward", [&]<typename T>() {
    using A = std::conditional_t<std::is_same_v<T, double>, double, float>;
    T* po = gx.data_ptr<T>();
    const T* pg = g.data_ptr<T>();
    const T* px = x.data_ptr<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (kind == PoolKind::Max && k[0] == 2 && k[1] == 2 && s[0] == 2 && s[1] == 2 && p[0] == 0 && p[1] == 0 &&
          dl[0] == 1 && dl[1] == 1 && xst[3] == 1 && gst[3] == 1 && 2 * OH <= H && 2 * OW <= W && max_pool_2x2_supported()) {
        // 2x2 windows, stride 2, rows with contiguous columns: the vector kernel (ops/pool2x2.h)
        parallel_for(N * C, H * W, [&](int64_t b, int64_t e) {
          for (int64_t pc = b; pc < e; ++pc) {
            const int64_t n = pc / C, c = pc % C;
            max_pool_2x2_backward(px + n * xst[0] + c * xst[1], xst[2], pg + n * gst[0] + c * gst[1], gst[2], OH, OW,
                                  po + pc * H * W, H, W);
          }
        });
        return;
      }
    }
    if constexpr (std::is_same_v<T, A>) {
      if (kind == PoolKind::Max) {
        // Max pooling in f32/f64: each window's gradient goes straight into the zeroed output plane (no
        // accumulator, no per-window branching on the pool kind); windows entirely inside the plane skip the
        // bounds tests. The first maximum wins and a NaN, once seen, stays the maximum, as in the forward.
        const int64_t k0 = k[0], k1 = k[1], s0 = s[0], s1 = s[1], p0 = p[0], p1 = p[1], d0 = dl[0], d1 = dl[1];
        const int64_t xs2 = xst[2], xs3 = xst[3], gs2 = gst[2], gs3 = gst[3];
        parallel_for(N * C, H * W, [&](int64_t b, int64_t e) {
          for (int64_t pc = b; pc < e; ++pc) {
            const int64_t n = pc / C, c = pc % C;
            const T* gp = pg + n * gst[0] + c * gst[1];
            const T* xp = px + n * xst[0] + c * xst[1];
            T* op = po + pc * H * W;
            std::fill(op, op + H * W, T(0));
            for (int64_t oh = 0; oh < OH; ++oh) {
              const int64_t h0 = oh * s0 - p0;
              const bool h_in = h0 >= 0 && h0 + (k0 - 1) * d0 < H;
              for (int64_t ow = 0; ow < OW; ++ow) {
                const int64_t w0 = ow * s1 - p1;
                int64_t best = -1;
                T bv = T(0);
                if (h_in && w0 >= 0 && w0 + (k1 - 1) * d1 < W) {
                  // Masks and a max rather than branches: which element is the maximum is data-dependent
                  // and a branch on it mispredicts about every other window. A NaN compares false and is
                  // never taken here; a window holding one is searched again below for its first NaN.
                  const T* wp = xp + h0 * xs2 + w0 * xs3;
                  best = h0 * W + w0;
                  bv = wp[0];
                  bool nan = false;
                  for (int64_t i = 0; i < k0; ++i)
                    for (int64_t j = 0; j < k1; ++j) {
                      const T v = wp[i * d0 * xs2 + j * d1 * xs3];
                      nan |= v != v;
                      const int64_t m = -static_cast<int64_t>(v > bv);
                      best = (((h0 + i * d0) * W + w0 + j * d1) & m) | (best & ~m);
                      bv = v > bv ? v : bv;
                    }
                  if (nan)
                    for (int64_t i = k0 * k1 - 1; i >= 0; --i) {
                      const T v = wp[(i / k1) * d0 * xs2 + (i % k1) * d1 * xs3];
                      if (v != v) best = (h0 + (i / k1) * d0) * W + w0 + (i % k1) * d1;
                    }
                } else {
                  for (int64_t i = 0; i < k0; ++i) {
                    const int64_t h = h0 + i * d0;
                    if (h < 0 || h >= H) continue;
                    for (int64_t j = 0; j < k1; ++j) {
                      const int64_t w = w0 + j * d1;
                      if (w < 0 || w >= W) continue;
                      const T v = xp[h * xs2 + w * xs3];
                      if (best < 0 || (bv == bv && !(v <= bv))) bv = v, best = h * W + w;
                    }
                  }
                }
                if (best >= 0) op[best] += gp[oh * gs2 + ow * gs3];
              }
            }
          }
        });
        return;
      }
    }
    parallel_for(N * C, H * W, [&](int64_t b, int64_t e) {
      std::vector<A> acc(static_cast<size_t>(H * W));
      for (int64_t pc = b; pc < e; ++pc) {
        int64_t n = pc / C, c = pc % C;
        std::fill(acc.begin(), acc.end(), A(0));
        const T* gp = pg + n * gst[0] + c * gst[1];
        const T* xp = px + n * xst[0] + c * xst[1];
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            A gv = static_cast<A>(gp[oh * gst[2] + ow * gst[3]]);
            if (kind == PoolKind::Adaptive) {
              int64_t hs = oh * H / OH, he = ((oh + 1) * H + OH - 1) / OH;
              int64_t ws = ow * W / OW, we = ((ow + 1) * W + OW - 1) / OW;
              A share = gv / static_cast<A>((he - hs) * (we - ws));
              for (int64_t h = hs; h < he; ++h)
                for (int64_t w = ws; w < we; ++w) acc[static_cast<size_t>(h * W + w)] += share;
            } else if (kind == PoolKind::Avg) {
              int64_t hs = oh * s[0] - p[0], ws = ow * s[1] - p[1];
              int64_t he = std::min(hs + k[0], H + p[0]), we = std::min(ws + k[1], W + p[1]);
              int64_t pool_size = (he - hs) * (we - ws);
              hs = std::max<int64_t>(hs, 0), ws = std::max<int64_t>(ws, 0);
              he = std::min(he, H), we = std::min(we, W);
              int64_t div = include_pad ? pool_size : (he - hs) * (we - ws);
              if (div <= 0) continue;
              A share = gv / static_cast<A>(div);
              for (int64_t h = hs; h < he; ++h)
                for (int64_t w = ws; w < we; ++w) acc[static_cast<size_t>(h * W + w)] += share;
            } else {
              int64_t h0 = oh * s[0] - p[0], w0 = ow * s[1] - p[1], best = -1;
              A bv = -std::numeric_limits<A>::infinity();
              for (int64_t i = 0; i < k[0]; ++i) {
                int64_t h = h0 + i * dl[0];
                if (h < 0 || h >= H) continue;
                for (int64_t j = 0; j < k[1]; ++j) {
                  int64_t w = w0 + j * dl[1];
                  if (w < 0 || w >= W) continue;
                  A v = static_cast<A>(xp[h * xst[2] + w * xst[3]]);
                  if (best < 0 || v > bv || std::isnan(v)) {
                    if (best >= 0 && std::isnan(bv)) continue;
                    bv = v, best = h * W + w;
                  }
                }
              }
              if (best >= 0) acc[static_cast<size_t>(best)] += gv;
            }
          }
        T* op = po + pc * H * W;
        for (int64_t i = 0; i < H * W; ++i) op[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
      }
    });
  });
  return {gx};
}

std::vector<Tensor> kernel_max_pool2d_backward(Ins in, const Attrs& a, Outs out) { return pool_backward(PoolKind::Max, in, a, out); }
std::vector<Tensor> kernel_avg_pool2d_backward(Ins in, const Attrs& a, Outs out) { return pool_backward(PoolKind::Avg, in, a, out); }
std::vector<Tensor> kernel_adaptive_avg_pool2d_backward(Ins in, const Attrs& a, Outs out) {
  return pool_backward(PoolKind::Adaptive, in, a, out);
}

// ---- philox_uniform -----------------------------------------------------------------------------------
/// Philox4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11).
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0], p1 = static_cast<uint64_t>(kM1) * ctr[2];
    ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key[0], static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key[1], static_cast<uint32_t>(p0)};
    key[0] += kW0;
    key[1] += kW1;
  }
  return ctr;
}

std::vector<TensorMeta> meta_philox_uniform(Ins, const Attrs& a) {
  const SymIntVec& shape = a.sym_ints("shape");
  for (const SymInt& s : shape) {
    int64_t v;
    if (s.maybe_as_int(v) && v < 0) throw ValueError(fmt::format("philox_uniform: negative size in {}", to_string(shape)));
  }
  DType t = a.dtype("dtype");
  if (!is_floating(t)) throw TypeError(fmt::format("philox_uniform: dtype must be floating, got {}", short_name(t)));
  return one(shape, t);
}

std::vector<Tensor> kernel_philox_uniform(Ins, const Attrs& a, Outs out) {
  Tensor y = empty_like_meta(out[0]);
  uint64_t seed = static_cast<uint64_t>(a.i("seed")), offset = static_cast<uint64_t>(a.i("offset"));
  std::array<uint32_t, 2> key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  dispatch_float(y.dtype(), "philox_uniform", [&]<typename T>() {
    T* p = y.data_ptr<T>();
    parallel_for(y.int_numel(), 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        uint64_t c = offset + static_cast<uint64_t>(i);
        auto r = philox4x32_10({static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0u, 0u}, key);
        if constexpr (std::is_same_v<T, double>) {
          uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (r[1] >> 11);  // 53 bits
          p[i] = static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
        } else {
          p[i] = static_cast<T>(static_cast<float>(r[0] >> 8) * 0x1.0p-24f);  // 24 bits: < 1 exactly
        }
      }
    });
  });
  return {y};
}

}  // namespace

PROTEAN_REGISTER_OP(index_add, meta_index_add, kernel_index_add);
PROTEAN_REGISTER_OP(scatter_add, meta_scatter_add, kernel_scatter_add);
PROTEAN_REGISTER_OP(max_pool2d_backward, meta_pool_backward, kernel_max_pool2d_backward);
PROTEAN_REGISTER_OP(avg_pool2d_backward, meta_pool_backward, kernel_avg_pool2d_backward);
PROTEAN_REGISTER_OP(adaptive_avg_pool2d_backward, meta_pool_backward, kernel_adaptive_avg_pool2d_backward);
PROTEAN_REGISTER_OP(philox_uniform, meta_philox_uniform, kernel_philox_uniform);

}  // namespace protean::ops

// ---- public functions (protean/ops.h) ---------------------------------------------------------------------
namespace protean {
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& source) {
  return ops::call1(ops::OpKind::index_add, {x, index, source}, {{"dim", SymInt(dim)}});
}
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
  return ops::call1(ops::OpKind::scatter_add, {x, index, src}, {{"dim", SymInt(dim)}});
}
Tensor philox_uniform(const SymIntVec& shape, const SymInt& seed, const SymInt& offset, DType dtype) {
  return ops::call1(ops::OpKind::philox_uniform, std::initializer_list<Tensor>{},
                    {{"shape", shape}, {"seed", seed}, {"offset", offset}, {"dtype", dtype}});
}
Tensor dropout(const Tensor& x, double p, const SymInt& seed, const SymInt& offset, bool train) {
  if (p < 0 || p > 1) throw ValueError(fmt::format("dropout: p must be in [0, 1], got {}", p));
  if (!train || p == 0) return x;
  if (p == 1) return x * 0.0;
  Tensor keep = ge(philox_uniform(x.sizes(), seed, offset, is_floating(x.dtype()) ? x.dtype() : DType::F32),
                   full({}, p, is_floating(x.dtype()) ? x.dtype() : DType::F32));
  return where(keep, x * (1.0 / (1.0 - p)), full({}, 0.0, x.dtype()));
}
}  // namespace protean
