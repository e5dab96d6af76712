// conv2d_backward_input, conv2d_backward_weight: the two gradients of y = conv2d(x, w) (no bias), the
// ops autograd's conv2d / conv1d / conv_transpose2d rules record for CPU tensors (src/autograd/rules_nn.cpp).
//
// Semantics (torch.nn.grad.conv2d_input / conv2d_weight), with conv2d's stride, padding, dilation and
// groups (2 values each; padding symmetric):
//  * conv2d_backward_input(g [N, O, OH, OW], w [O, C/groups, KH, KW]; input_size = (H, W))
//      → dx [N, C, H, W], dx[n, c, ih, iw] = Σ g[n, o, oh, ow] · w[o, c mod C/groups, kh, kw] over the o
//      of c's group and every (oh, kh), (ow, kw) with ih = oh·s - p + kh·d (and the same for w).
//  * conv2d_backward_weight(g [N, O, OH, OW], x [N, C, H, W]; kernel_size = (KH, KW))
//      → dw [O, C/groups, KH, KW], dw[o, c, kh, kw] = Σ_{n, oh, ow} g[n, o, oh, ow] · x[n, group(o)·C/groups + c,
//      oh·s - p + kh·d, ow·s - p + kw·d] (taps in the padding read 0).
//  OH and OW must be conv2d's output sizes for (H, W) (a ShapeError names the mismatch); the
//  rows and columns of x past the last window (when (H + 2p - d(KH - 1) - 1) is not a multiple of
//  s) get a zero gradient, as in torch.
//  * dtypes: f32 through oneDNN's backward primitives; f16/bf16 converted to f32 and back; f64 by
//    direct loops accumulating in double (the float64 central-difference tests run through them).
//
// oneDNN use: convolution_backward_data / convolution_backward_weights, each created with a
// forward_training descriptor as its hint, cached process-wide by every shape and parameter (primitive
// creation is 0.1–3 ms of JIT; a training step calls the same ones every time). The layouts the
// primitives run on, measured here on LeNet's convolutions (batch 64) and a few wider ones (1 thread,
// AVX-512): plain NCHW takes oneDNN's GEMM-based backward, 2–4× slower than its direct kernels
// except for backward data into 1 to 3 input channels (6→1 5x5: GEMM 1.0 ms, NHWC 2.0, blocked 5.3);
// with fewer than 16 input channels per group the direct kernels are fastest on NHWC (16→6 backward
// data 0.71 ms, 6→16 backward weights 0.27 ms against 0.78 / 0.56 blocked); from 16 channels on, and
// for grouped convolutions, oneDNN's own choice (`any`: 16-channel blocks). Inputs come as they are
// stored: a contiguous NCHW or a channels-last (NHWC-strided) tensor is read in place; any other
// strides are copied first. Reorders between those and the chosen layouts run into the calling
// thread's scratch slots (dnnl_util.h), so a cached primitive runs on any thread.
#include <fmt/format.h>

#include <omp.h>

#include <array>
#include <chrono>
#include <dnnl.hpp>
#include <memory>
#include <unordered_map>

#include "ops/dnnl_util.h"
#include "ops/kernel_utils.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "ops/thread_binding.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

using Ins = std::span<const Tensor>;
using Outs = std::span<const TensorMeta>;

struct BwdArgs {
  IntVec stride, padding, dilation, size;  // size: input_size (H, W) or kernel_size (KH, KW)
  int64_t groups = 1;
};

IntVec pair_attr(OpKind op, Ins in, const Attrs& a, const char* name, int64_t min_value, std::optional<int64_t> dflt) {
  IntVec v;
  if (a.has(name)) v = a.ints(name);
  else if (dflt) v = {*dflt};
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2)
    throw ValueError(fmt::format("{}: {} must have 1 or 2 values, got {}", describe_call(op, in), name,
                                 to_string(to_symint_vec(v))));
  for (int64_t x : v)
    if (x < min_value || x > std::numeric_limits<int32_t>::max())
      throw ValueError(fmt::format("{}: {} must be in [{}, 2^31), got {}", describe_call(op, in), name, min_value,
                                   to_string(to_symint_vec(v))));
  return v;
}

BwdArgs parse(OpKind op, Ins in, const Attrs& a) {
  BwdArgs r;
  r.stride = pair_attr(op, in, a, "stride", 1, 1);
  r.padding = pair_attr(op, in, a, "padding", 0, 0);
  r.dilation = pair_attr(op, in, a, "dilation", 1, 1);
  const bool input = op == OpKind::conv2d_backward_input;
  r.size = pair_attr(op, in, a, input ? "input_size" : "kernel_size", input ? 0 : 1, std::nullopt);
  r.groups = a.has("groups") ? a.i("groups") : 1;
  if (r.groups < 1) throw ValueError(fmt::format("{}: groups must be ≥ 1, got {}", describe_call(op, in), r.groups));
  return r;
}

/// Checks g's spatial sizes against conv2d's output sizes for input (H, W) and kernel (KH, KW).
void check_output_size(OpKind op, Ins in, const BwdArgs& a, const SymInt& H, const SymInt& W, const SymInt& KH,
                       const SymInt& KW, const Tensor& g) {
  const SymInt L[2] = {H, W}, K[2] = {KH, KW};
  for (size_t i = 0; i < 2; ++i) {
    SymInt span = L[i] + 2 * a.padding[i], need = a.dilation[i] * (K[i] - 1) + 1;
    if (static_cast<bool>(span < need))
      throw ShapeError(fmt::format("{}: padded input size {} in spatial dim {} is smaller than the dilated kernel size {}",
                                   describe_call(op, in), span.str(), i, need.str()));
    SymInt o = (span - need) / a.stride[i] + 1;
    if (!static_cast<bool>(g.size(2 + static_cast<int64_t>(i)) == o))
      throw ShapeError(fmt::format("{}: grad_output has size {} in spatial dim {}, but conv2d of an input of size {} "
                                   "gives {}",
                                   describe_call(op, in), g.size(2 + static_cast<int64_t>(i)).str(), i, L[i].str(), o.str()));
  }
}

void check_common(OpKind op, Ins in) {
  const Tensor &g = in[0], &t = in[1];
  if (!g.defined() || !t.defined()) throw ValueError(fmt::format("{}: expects two tensors", describe_call(op, in)));
  if (g.dim() != 4 || t.dim() != 4)
    throw ShapeError(fmt::format("{}: expected 4-D grad_output and {} (batched NCHW), got ranks {} and {}",
                                 describe_call(op, in), op == OpKind::conv2d_backward_input ? "weight" : "input", g.dim(),
                                 t.dim()));
  if (!is_floating(g.dtype()) || t.dtype() != g.dtype())
    throw TypeError(fmt::format("{}: expected floating tensors of one dtype, got {} and {}", describe_call(op, in),
                                short_name(g.dtype()), short_name(t.dtype())));
}

std::vector<TensorMeta> meta_backward_input(Ins in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::conv2d_backward_input;
  check_common(op, in);
  const Tensor &g = in[0], &w = in[1];
  BwdArgs a = parse(op, in, attrs);
  if (!static_cast<bool>(w.size(0) == g.size(1)))
    throw ShapeError(fmt::format("{}: weight has {} output channels, grad_output {}", describe_call(op, in),
                                 w.size(0).str(), g.size(1).str()));
  if (!static_cast<bool>(w.size(0) % a.groups == 0))
    throw ShapeError(fmt::format("{}: out channels {} not divisible by groups {}", describe_call(op, in), w.size(0).str(),
                                 a.groups));
  const SymInt H(a.size[0]), W(a.size[1]);
  check_output_size(op, in, a, H, W, w.size(2), w.size(3), g);
  return one({g.size(0), w.size(1) * a.groups, H, W}, g.dtype());
}

std::vector<TensorMeta> meta_backward_weight(Ins in, const Attrs& attrs) {
  constexpr OpKind op = OpKind::conv2d_backward_weight;
  check_common(op, in);
  const Tensor &g = in[0], &x = in[1];
  BwdArgs a = parse(op, in, attrs);
  if (!static_cast<bool>(x.size(0) == g.size(0)))
    throw ShapeError(fmt::format("{}: batch sizes differ: grad_output {}, input {}", describe_call(op, in),
                                 g.size(0).str(), x.size(0).str()));
  if (!static_cast<bool>(x.size(1) % a.groups == 0) || !static_cast<bool>(g.size(1) % a.groups == 0))
    throw ShapeError(fmt::format("{}: channels {} (input) and {} (grad_output) must be divisible by groups {}",
                                 describe_call(op, in), x.size(1).str(), g.size(1).str(), a.groups));
  const SymInt KH(a.size[0]), KW(a.size[1]);
  check_output_size(op, in, a, x.size(2), x.size(3), KH, KW, g);
  return one({g.size(1), x.size(1) / a.groups, KH, KW}, g.dtype());
}

// ---- kernels ------------------------------------------------------------------------------------------
struct Shape {
  int64_t N, C, H, W, O, KH, KW, OH, OW, g, sh, sw, ph, pw, dh, dw;
};

/// Direct loops in double accumulation: f64, and f32 problems oneDNN has no primitive for.
template <typename T>
void input_direct(const Shape& s, const T* g, const T* w, T* dx) {
  const int64_t cin_g = s.C / s.g, cout_g = s.O / s.g;
  kernel::parallel_for(s.N * s.C * s.H * s.W, cout_g * s.KH * s.KW, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t iw = idx % s.W, ih = (idx / s.W) % s.H, c = (idx / (s.W * s.H)) % s.C, n = idx / (s.W * s.H * s.C);
      const int64_t grp = c / cin_g, cl = c % cin_g;
      double acc = 0;
      for (int64_t ol = 0; ol < cout_g; ++ol) {
        const int64_t o = grp * cout_g + ol;
        for (int64_t kh = 0; kh < s.KH; ++kh) {
          const int64_t th = ih + s.ph - kh * s.dh;
          if (th < 0 || th % s.sh != 0 || th / s.sh >= s.OH) continue;
          for (int64_t kw = 0; kw < s.KW; ++kw) {
            const int64_t tw = iw + s.pw - kw * s.dw;
            if (tw < 0 || tw % s.sw != 0 || tw / s.sw >= s.OW) continue;
            acc += static_cast<double>(g[((n * s.O + o) * s.OH + th / s.sh) * s.OW + tw / s.sw]) *
                   static_cast<double>(w[((o * cin_g + cl) * s.KH + kh) * s.KW + kw]);
          }
        }
      }
      dx[idx] = static_cast<T>(acc);
    }
  });
}

template <typename T>
void weight_direct(const Shape& s, const T* g, const T* x, T* dw) {
  const int64_t cin_g = s.C / s.g, cout_g = s.O / s.g;
  kernel::parallel_for(s.O * cin_g * s.KH * s.KW, s.N * s.OH * s.OW, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      const int64_t kw = idx % s.KW, kh = (idx / s.KW) % s.KH, cl = (idx / (s.KW * s.KH)) % cin_g,
                    o = idx / (s.KW * s.KH * cin_g);
      const int64_t c = (o / cout_g) * cin_g + cl;
      double acc = 0;
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t oh = 0; oh < s.OH; ++oh) {
          const int64_t ih = oh * s.sh - s.ph + kh * s.dh;
          if (ih < 0 || ih >= s.H) continue;
          for (int64_t ow = 0; ow < s.OW; ++ow) {
            const int64_t iw = ow * s.sw - s.pw + kw * s.dw;
            if (iw < 0 || iw >= s.W) continue;
            acc += static_cast<double>(g[((n * s.O + o) * s.OH + oh) * s.OW + ow]) *
                   static_cast<double>(x[((n * s.C + c) * s.H + ih) * s.W + iw]);
          }
        }
      dw[idx] = static_cast<T>(acc);
    }
  });
}

/// How an f32 4-D tensor is stored: NCHW (contiguous), NHWC (channels-last strides), or neither.
enum class Storage4 { Nchw, Nhwc, Other };
Storage4 storage_of(const Tensor& t) {
  if (t.is_contiguous()) return Storage4::Nchw;
  const IntVec s = t.int_sizes(), st = t.int_strides();
  // channels-last: strides [H·W·C, 1, W·C, C] (a size-1 dim may have any stride)
  const int64_t want[4] = {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  for (size_t d = 0; d < 4; ++d)
    if (s[d] != 1 && st[d] != want[d]) return Storage4::Other;
  return Storage4::Nhwc;
}

// The key holds the OpenMP thread count the primitive is made under (oneDNN fixes a primitive's thread
// partition at creation: an entry made at 2 threads ran 2 threads, spinning at its barriers, in a call at 1).
struct BwdKey {
  std::array<int64_t, 20> v;
  bool operator==(const BwdKey& o) const = default;
};
struct BwdKeyHash {
  size_t operator()(const BwdKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

/// One backward primitive with the reorders between the tensors' storage and its layouts. Immutable once
/// built, so one entry serves every thread. Roles: `a` is g (both ops); `b` is w (input gradient) or
/// x (weight gradient); `out` is dx or dw.
struct BwdEntry {
  dnnl::primitive prim;
  dnnl::memory::desc user_a, user_b, user_out;
  dnnl::memory::desc lib_a, lib_b, lib_out;
  dnnl::memory::desc scratchpad;
  dnnl::reorder a_reorder, b_reorder, out_reorder;
  std::string impl;
};

dnnl::reorder make_reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  dnnl::engine& eng = dnnl_engine();
  return dnnl::reorder(dnnl::reorder::primitive_desc(eng, from, eng, to));
}

/// The layout tag the primitive's activations run on (see the file comment), or `any`.
dnnl::memory::format_tag activation_layout(const Shape& s, bool input_grad) {
  using ft = dnnl::memory::format_tag;
  const int64_t cin_g = s.C / s.g;
  if (s.g > 1 || cin_g >= 16) return ft::any;
  if (input_grad && cin_g < 4) return ft::nchw;
  return ft::nhwc;
}

BwdEntry make_entry(const Shape& s, bool input_grad, bool a_nhwc, bool b_nhwc) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using ft = dnnl::memory::format_tag;
  const auto t0 = std::chrono::steady_clock::now();
  dnnl::engine& eng = dnnl_engine();
  const dnnl::memory::dims xd{s.N, s.C, s.H, s.W}, yd{s.N, s.O, s.OH, s.OW};
  const dnnl::memory::dims wd = s.g == 1 ? dnnl::memory::dims{s.O, s.C, s.KH, s.KW}
                                         : dnnl::memory::dims{s.g, s.O / s.g, s.C / s.g, s.KH, s.KW};
  const md uw(wd, dt::f32, s.g == 1 ? ft::oihw : ft::goihw);
  const md ux(xd, dt::f32, ft::nchw), uy(yd, dt::f32, a_nhwc ? ft::nhwc : ft::nchw);
  const ft act = activation_layout(s, input_grad);
  const md ax(xd, dt::f32, act), ay(yd, dt::f32, act), aw(wd, dt::f32, ft::any);
  const dnnl::memory::dims strides{s.sh, s.sw}, dil{s.dh - 1, s.dw - 1}, pl{s.ph, s.pw};
  // the right padding that makes oneDNN's output size formula land on OH/OW exactly
  const dnnl::memory::dims pr{(s.OH - 1) * s.sh + (s.KH - 1) * s.dh + 1 - s.H - s.ph,
                              (s.OW - 1) * s.sw + (s.KW - 1) * s.dw + 1 - s.W - s.pw};
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto fwd = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, ax, aw, ay,
                                      strides, dil, pl, pr),
      attr, eng);
  BwdEntry e;
  e.user_a = uy;
  if (input_grad) {
    auto pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, ax, aw, ay, strides, dil, pl, pr),
        attr, eng, fwd);
    e.prim = dnnl::convolution_backward_data(pd);
    e.user_b = uw;
    e.user_out = ux;
    e.lib_a = pd.diff_dst_desc();
    e.lib_b = pd.weights_desc();
    e.lib_out = pd.diff_src_desc();
    e.scratchpad = pd.scratchpad_desc();
    e.impl = pd.impl_info_str();
  } else {
    auto pd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, ax, aw, ay, strides, dil, pl, pr),
        attr, eng, fwd);
    e.prim = dnnl::convolution_backward_weights(pd);
    e.user_b = md(xd, dt::f32, b_nhwc ? ft::nhwc : ft::nchw);
    e.user_out = uw;
    e.lib_a = pd.diff_dst_desc();
    e.lib_b = pd.src_desc();
    e.lib_out = pd.diff_weights_desc();
    e.scratchpad = pd.scratchpad_desc();
    e.impl = pd.impl_info_str();
  }
  int64_t made = 2;  // the forward hint and the primitive
  if (e.lib_a != e.user_a) e.a_reorder = make_reorder(e.user_a, e.lib_a), ++made;
  if (e.lib_b != e.user_b) e.b_reorder = make_reorder(e.user_b, e.lib_b), ++made;
  if (e.lib_out != e.user_out) e.out_reorder = make_reorder(e.lib_out, e.user_out), ++made;
  note_dnnl_create(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), made);
  return e;
}

using BwdCache = PrimitiveCache<BwdKey, BwdEntry, BwdKeyHash>;

/// Multiply-adds of a weight gradient below which it runs on one thread (kSmallWeightGradMacs). oneDNN's
/// backward-weights kernels reduce the threads' partial sums behind a spinning barrier: LeNet's second
/// convolution (batch 64, 6 -> 16 channels, 5x5, 15.4 M multiply-adds) took 0.23 ms on one thread and
/// 9.1 ms per call on two with the second core busy (ONEDNN_VERBOSE, train_bench --child cnn_bn ... 2).
constexpr int64_t kSmallWeightGradMacs = int64_t{1} << 24;

/// Sets this thread's OpenMP thread count for one call and puts the previous count back.
class OmpThreadsFor {
 public:
  explicit OmpThreadsFor(int n) : prev_(omp_get_max_threads()) {
    if (n != prev_) omp_set_num_threads(n);
  }
  ~OmpThreadsFor() {
    if (omp_get_max_threads() != prev_) omp_set_num_threads(prev_);
  }
  OmpThreadsFor(const OmpThreadsFor&) = delete;
  OmpThreadsFor& operator=(const OmpThreadsFor&) = delete;

 private:
  int prev_;
};

/// Runs the backward primitive for `s` on f32 data; `a` is g, `b` is w or x (see BwdEntry), `out`
/// contiguous NCHW dx or OIHW dw. Returns false when oneDNN has no primitive for the problem.
bool run_dnnl(const Shape& s, bool input_grad, const float* a, bool a_nhwc, const float* b, bool b_nhwc, float* out) {
  if (omp_get_max_threads() != protean::num_threads()) omp_set_num_threads(protean::num_threads());
  const int64_t macs = s.N * s.O * s.OH * s.OW * (s.C / s.g) * s.KH * s.KW;
  OmpThreadsFor threads(!input_grad && macs < kSmallWeightGradMacs ? 1 : protean::num_threads());
  const BwdKey key{{s.N, s.C, s.H, s.W, s.O, s.KH, s.KW, s.OH, s.OW, s.g, s.sh, s.sw, s.ph, s.pw, s.dh, s.dw, input_grad,
                    a_nhwc, b_nhwc, omp_get_max_threads()}};
  std::shared_ptr<const BwdEntry> ep;
  try {
    ep = BwdCache::instance().get(key, [&] { return std::make_shared<const BwdEntry>(make_entry(s, input_grad, a_nhwc, b_nhwc)); });
  } catch (const dnnl::error&) {
    return false;
  }
  if (dnnl_prepare_only()) return true;
  const BwdEntry& e = *ep;
  // the team on distinct CPUs (ops/thread_binding.h): else a woken worker may share this CPU
  TeamBinding bind(omp_get_max_threads() > 1 && macs >= kBindTeamMinMacs);
  dnnl::engine& eng = dnnl_engine();
  dnnl::stream& strm = dnnl_stream();
  dnnl::memory ua(e.user_a, eng, const_cast<float*>(a)), ub(e.user_b, eng, const_cast<float*>(b)), uo(e.user_out, eng, out);
  dnnl::memory ma = ua, mb = ub, mo = uo;
  if (e.lib_a != e.user_a) {
    ma = dnnl::memory(e.lib_a, eng, thread_scratch(ScratchSlot::Dst, e.lib_a.get_size()));
    e.a_reorder.execute(strm, ua, ma);
  }
  if (e.lib_b != e.user_b) {
    mb = dnnl::memory(e.lib_b, eng, thread_scratch(input_grad ? ScratchSlot::Weights : ScratchSlot::Src, e.lib_b.get_size()));
    e.b_reorder.execute(strm, ub, mb);
  }
  if (e.lib_out != e.user_out)
    mo = dnnl::memory(e.lib_out, eng, thread_scratch(input_grad ? ScratchSlot::Src : ScratchSlot::Weights, e.lib_out.get_size()));
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_DIFF_DST, ma}};
  if (input_grad) {
    args.emplace(DNNL_ARG_WEIGHTS, mb);
    args.emplace(DNNL_ARG_DIFF_SRC, mo);
  } else {
    args.emplace(DNNL_ARG_SRC, mb);
    args.emplace(DNNL_ARG_DIFF_WEIGHTS, mo);
  }
  if (e.scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, scratch_memory(e.scratchpad));
  e.prim.execute(strm, args);
  if (e.lib_out != e.user_out) e.out_reorder.execute(strm, mo, uo);
  strm.wait();
  return true;
}

std::vector<Tensor> backward_kernel(OpKind op, Ins in, const Attrs& attrs, Outs outs) {
  const bool input_grad = op == OpKind::conv2d_backward_input;
  BwdArgs a = parse(op, in, attrs);
  Tensor out = empty_like_meta(outs[0]);
  const Tensor &g = in[0], &t = in[1];  // t: w (input gradient) or x (weight gradient)
  const IntVec gs = g.int_sizes(), ts = t.int_sizes(), os = out.int_sizes();
  const IntVec& xs = input_grad ? os : ts;
  const int64_t KH = input_grad ? ts[2] : a.size[0], KW = input_grad ? ts[3] : a.size[1];
  const Shape s{xs[0],        xs[1],        xs[2],       xs[3],       gs[1],       KH,
                KW,           gs[2],        gs[3],       a.groups,    a.stride[0], a.stride[1],
                a.padding[0], a.padding[1], a.dilation[0], a.dilation[1]};
  if (out.int_numel() == 0) return {out};
  const DType dt = g.dtype();
  if (dt == DType::F64) {
    Tensor gc = kernel::contiguous(g), tc = kernel::contiguous(t);
    if (input_grad) input_direct<double>(s, gc.data_ptr<double>(), tc.data_ptr<double>(), out.data_ptr<double>());
    else weight_direct<double>(s, gc.data_ptr<double>(), tc.data_ptr<double>(), out.data_ptr<double>());
    return {out};
  }
  // f32 (f16 / bf16 through f32 copies); NCHW or channels-last storage read in place
  auto as_f32 = [](const Tensor& x, bool allow_nhwc, bool& nhwc) {
    Tensor f = x.dtype() == DType::F32 ? x : kernel::to_dtype(x, DType::F32);
    const Storage4 st = storage_of(f);
    nhwc = allow_nhwc && st == Storage4::Nhwc;
    return st == Storage4::Nchw || nhwc ? f : kernel::contiguous(f);
  };
  bool g_nhwc = false, t_nhwc = false;
  Tensor gf = as_f32(g, true, g_nhwc), tf = as_f32(t, !input_grad, t_nhwc);
  Tensor of = dt == DType::F32 ? out : empty(os, DType::F32);
  const bool empty_reduction = s.N == 0 || s.C == 0 || s.O == 0;
  if (empty_reduction) {
    std::fill_n(of.data_ptr<float>(), of.int_numel(), 0.0f);
  } else if (!run_dnnl(s, input_grad, gf.data_ptr<float>(), g_nhwc, tf.data_ptr<float>(), t_nhwc, of.data_ptr<float>())) {
    if (dnnl_prepare_only()) return {out};
    Tensor gc = kernel::contiguous(gf), tc = kernel::contiguous(tf);
    if (input_grad) input_direct<float>(s, gc.data_ptr<float>(), tc.data_ptr<float>(), of.data_ptr<float>());
    else weight_direct<float>(s, gc.data_ptr<float>(), tc.data_ptr<float>(), of.data_ptr<float>());
  }
  if (dnnl_prepare_only()) return {out};
  if (dt != DType::F32) kernel::copy_into(out, of);
  return {out};
}

std::vector<Tensor> kernel_backward_input(Ins in, const Attrs& a, Outs out) {
  return backward_kernel(OpKind::conv2d_backward_input, in, a, out);
}
std::vector<Tensor> kernel_backward_weight(Ins in, const Attrs& a, Outs out) {
  return backward_kernel(OpKind::conv2d_backward_weight, in, a, out);
}

}  // namespace

PROTEAN_REGISTER_OP(conv2d_backward_input, meta_backward_input, kernel_backward_input);
PROTEAN_REGISTER_OP(conv2d_backward_weight, meta_backward_weight, kernel_backward_weight);

}  // namespace protean::ops
