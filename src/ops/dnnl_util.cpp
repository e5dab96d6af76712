#include "ops/dnnl_util.h"

#include <fmt/format.h>

#include <omp.h>
#include <sys/mman.h>

#include <array>
#include <chrono>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <tuple>

#include "ops/kernel_utils.h"
#include "protean/ops.h"

namespace protean::ops {

dnnl::engine& dnnl_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& dnnl_stream() {
  static thread_local dnnl::stream strm(dnnl_engine());
  return strm;
}

namespace {

struct Block {
  void* p = nullptr;
  size_t bytes = 0;
  ~Block() { std::free(p); }
};

}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  static thread_local std::array<Block, static_cast<size_t>(ScratchSlot::kCount)> blocks;
  Block& b = blocks[static_cast<size_t>(slot)];
  if (b.bytes < bytes || !b.p) {
    std::free(b.p);
    // grow by at least a quarter so a sequence of slightly larger requests does not reallocate each time
    size_t n = std::max(bytes, b.bytes + b.bytes / 4);
    // Blocks of 4 MiB and more are 2 MiB aligned and asked for transparent huge pages (one fault per
    // 2 MiB on the first call instead of 512), like the tensor storage cache (src/core/tensor.cpp).
    const size_t align = n >= (size_t{4} << 20) ? (size_t{2} << 20) : 64;
    n = std::max<size_t>((n + align - 1) / align * align, 64);
    b.p = std::aligned_alloc(align, n);
    if (!b.p) throw RuntimeError(fmt::format("oneDNN scratch: cannot allocate {} bytes", n));
    if (align > 64) (void)madvise(b.p, n, MADV_HUGEPAGE);  // advisory: ignored where THP is off
    b.bytes = n;
  }
  return b.p;
}

dnnl::memory scratch_memory(const dnnl::memory::desc& desc) {
  size_t n = desc.get_size();
  return dnnl::memory(desc, dnnl_engine(), n ? thread_scratch(ScratchSlot::Primitive, n) : nullptr);
}

namespace {
std::mutex stats_mu;
DnnlStats stats;
}  // namespace

DnnlStats dnnl_stats() {
  std::lock_guard<std::mutex> lock(stats_mu);
  return stats;
}
void reset_dnnl_stats() {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats = DnnlStats();
}
std::string dnnl_stats_json() {
  DnnlStats s = dnnl_stats();
  return fmt::format(
      "{{\"primitives_created\": {}, \"cache_hits\": {}, \"post_op_fallbacks\": {}, \"create_seconds\": {:.6f}, "
      "\"weight_packs\": {}, \"packed_weight_hits\": {}, \"weight_sightings\": {}}}",
      s.primitives_created, s.cache_hits, s.post_op_fallbacks, s.create_seconds, s.weight_packs, s.packed_weight_hits,
      s.weight_sightings);
}
void note_dnnl_create(double seconds, int64_t primitives) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.primitives_created += primitives;
  stats.create_seconds += seconds;
}
void note_dnnl_hit() {
  std::lock_guard<std::mutex> lock(stats_mu);
  ++stats.cache_hits;
}
namespace {
thread_local int prepare_only_depth = 0;
}
DnnlPrepareOnly::DnnlPrepareOnly() { ++prepare_only_depth; }
DnnlPrepareOnly::~DnnlPrepareOnly() { --prepare_only_depth; }
bool dnnl_prepare_only() { return prepare_only_depth > 0; }

void note_dnnl_post_op_fallback() {
  std::lock_guard<std::mutex> lock(stats_mu);
  ++stats.post_op_fallbacks;
}
void note_dnnl_packed_weights(int64_t packs, int64_t hits, int64_t sightings) {
  std::lock_guard<std::mutex> lock(stats_mu);
  stats.weight_packs += packs;
  stats.packed_weight_hits += hits;
  stats.weight_sightings += sightings;
}

namespace {

/// Contiguous f32 copy of `t` (t itself when it already is one).
Tensor f32_contiguous(const Tensor& t) { return kernel::contiguous(kernel::to_dtype(t, DType::F32)); }

/// `t`'s shape right-aligned to `rank` dims (leading 1s).
IntVec logical_shape(const Tensor& t, size_t rank) {
  IntVec s = t.int_sizes();
  s.insert(s.begin(), rank - s.size(), 1);
  return s;
}

/// PROTEAN_DNNL_NAN_UNSAFE_POST_OPS=1 (read once): relu post-ops go to oneDNN (NaN → 0), for the
/// benchmark of the NaN-keeping pass only.
bool nan_unsafe_post_ops() {
  static const bool on = [] {
    const char* e = std::getenv("PROTEAN_DNNL_NAN_UNSAFE_POST_OPS");
    return e && e[0] == '1' && e[1] == '\0';
  }();
  return on;
}

dnnl::memory::dims plain_strides(const dnnl::memory::dims& d) {
  dnnl::memory::dims s(d.size());
  int64_t acc = 1;
  for (size_t i = d.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<int64_t>(d[i], 1);
  }
  return s;
}

}  // namespace

bool build_dnnl_post_ops(const std::vector<PostOp>& ops, std::span<const Tensor> in, const IntVec& out,
                         const OperandDimsFn& dims_of, bool sum_first, DnnlPostOps& r) {
  using alg = dnnl::algorithm;
  r = DnnlPostOps();
  int index = 0;  // oneDNN post-op index (one of ours may take several)
  // The key is bytes (a tag and a 64-bit value per item), cheap to build on every call.
  auto key_bytes = [&](char tag, int64_t v) {
    r.key += tag;
    r.key.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  // oneDNN 2.6's brgemm convolutions compute wrong results when one eltwise algorithm appears twice
  // with different parameters (e.g. linear(1, 3) ... linear(1/6, 0)): each algorithm may be used with
  // one (alpha, beta) only. A second linear becomes binary ops on scalar operands; other repeats
  // leave the list to apply_post_ops.
  std::vector<std::tuple<alg, float, float>> used;
  bool clash = false;
  auto eltwise = [&](alg a, double alpha, double beta) {
    float fa = static_cast<float>(alpha), fb = static_cast<float>(beta);
    for (auto [ua, ualpha, ubeta] : used)
      if (ua == a && (ualpha != fa || ubeta != fb)) clash = true;
    used.emplace_back(a, fa, fb);
    r.ops.append_eltwise(1.0f, a, fa, fb);
    key_bytes('e', static_cast<int64_t>(a));
    r.key.append(reinterpret_cast<const char*>(&fa), sizeof fa);
    r.key.append(reinterpret_cast<const char*>(&fb), sizeof fb);
    ++index;
  };
  auto eltwise_used = [&](alg a) {
    for (auto [ua, ualpha, ubeta] : used)
      if (ua == a) return true;
    return false;
  };
  auto binary = [&](alg a, const Tensor& t) {
    IntVec logical = logical_shape(t, out.size());
    dnnl::memory::dims dims;
    if (!dims_of(logical, dims)) return false;
    dnnl::memory::desc md(dims, dnnl::memory::data_type::f32, plain_strides(dims));
    r.ops.append_binary(a, md);
    r.operands.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1, md, f32_contiguous(t)});
    key_bytes('b', static_cast<int64_t>(a));
    for (int64_t d : dims) key_bytes(',', d);
    ++index;
    return true;
  };
  // a·x + b as binary ops on one-element operands (their values are not part of the key)
  auto scalar_linear = [&](double a, double b) {
    IntVec one(out.size(), 1);
    if (a != 1.0 && !binary(alg::binary_mul, full(to_symint_vec(one), a, DType::F32))) return false;
    if (b != 0.0 && !binary(alg::binary_add, full(to_symint_vec(one), b, DType::F32))) return false;
    return true;
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    const PostOp& p = ops[i];
    switch (p.kind) {
      // oneDNN's relu and clip (also behind hardsigmoid) map NaN to 0 / the lower bound (measured on
      // oneDNN 2.6: eltwise_relu, eltwise_clip and eltwise_clip_v2, JIT and reference kernels alike),
      // where eager keeps NaN. A list with them runs as a separate pass (apply_post_ops' loops).
      // PROTEAN_DNNL_NAN_UNSAFE_POST_OPS=1 gives them to oneDNN anyway: only for measuring what the
      // separate pass costs (bench/results/nan_post_ops_*.json); NaN then becomes 0 / lo.
      case PostOpKind::relu:
        if (!nan_unsafe_post_ops()) return false;
        eltwise(alg::eltwise_relu, 0, 0);
        break;
      case PostOpKind::clamp: case PostOpKind::hardsigmoid: return false;
      case PostOpKind::sigmoid: eltwise(alg::eltwise_logistic, 0, 0); break;
      case PostOpKind::tanh: eltwise(alg::eltwise_tanh, 0, 0); break;
      case PostOpKind::swish: eltwise(alg::eltwise_swish, p.alpha, 0); break;
      case PostOpKind::hardswish: eltwise(alg::eltwise_hardswish, 0, 0); break;
      case PostOpKind::gelu_erf: eltwise(alg::eltwise_gelu_erf, 0, 0); break;
      case PostOpKind::gelu_tanh: eltwise(alg::eltwise_gelu_tanh, 0, 0); break;
      case PostOpKind::linear:
        if (eltwise_used(alg::eltwise_linear)) {
          if (!scalar_linear(p.alpha, p.beta)) return false;
        } else {
          eltwise(alg::eltwise_linear, p.alpha, p.beta);
        }
        break;
      case PostOpKind::add: case PostOpKind::sub: case PostOpKind::mul: case PostOpKind::div: {
        const Tensor& t = in[static_cast<size_t>(p.operand[0])];
        if (i == 0 && sum_first && p.kind == PostOpKind::add && logical_shape(t, out.size()) == out) {
          r.ops.append_sum(1.0f);
          r.sum_first = true;
          r.sum_operand = t;
          key_bytes('s', 0);
          ++index;
          break;
        }
        alg a = p.kind == PostOpKind::add   ? alg::binary_add
                : p.kind == PostOpKind::sub ? alg::binary_sub
                : p.kind == PostOpKind::mul ? alg::binary_mul
                                            : alg::binary_div;
        if (!binary(a, t)) return false;
        break;
      }
      case PostOpKind::batch_norm: {
        auto [scale, shift] = batch_norm_scale_shift(p, in);
        IntVec shape(out.size() - 1, 1);
        shape[0] = scale.int_sizes()[0];
        if (!binary(alg::binary_mul, reshape(scale, to_symint_vec(shape)))) return false;
        if (!binary(alg::binary_add, reshape(shift, to_symint_vec(shape)))) return false;
        break;
      }
    }
  }
  return !clash;
}

void add_post_op_args(const DnnlPostOps& p, std::unordered_map<int, dnnl::memory>& args) {
  for (const DnnlPostOps::Operand& o : p.operands)
    args.emplace(o.arg, dnnl::memory(o.desc, dnnl_engine(), const_cast<void*>(o.data.data_ptr())));
}

namespace {

/// A binary primitive y + 0 carrying a post-op list (the standalone epilogue); no `prim` when oneDNN
/// only has its reference kernel for it.
struct EpilogueEntry {
  dnnl::binary prim;
  dnnl::memory::desc y, zero, scratchpad;
};

/// Builds the epilogue primitive for a plain f32 tensor of sizes `dims` carrying `post`.
std::shared_ptr<const EpilogueEntry> make_epilogue_entry(const IntVec& dims, const DnnlPostOps& post) {
  auto t0 = std::chrono::steady_clock::now();
  auto e = std::make_shared<EpilogueEntry>();
  dnnl::memory::dims d(dims.begin(), dims.end());
  e->y = dnnl::memory::desc(d, dnnl::memory::data_type::f32, plain_strides(d));
  dnnl::memory::dims ones(d.size(), 1);
  e->zero = dnnl::memory::desc(ones, dnnl::memory::data_type::f32, plain_strides(ones));
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_post_ops(post.ops);
  try {
    dnnl::binary::primitive_desc pd(dnnl::binary::desc(dnnl::algorithm::binary_add, e->y, e->zero, e->y), attr,
                                    dnnl_engine());
    if (std::string(pd.impl_info_str()).find("ref") == std::string::npos) {
      e->prim = dnnl::binary(pd);
      e->scratchpad = pd.scratchpad_desc();
    }
  } catch (const dnnl::error&) {
  }
  note_dnnl_create(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), e->prim ? 1 : 0);
  return e;
}

/// The process's epilogue primitives, keyed by the post-op structure and the output dims (as bytes).
using EpilogueCache = PrimitiveCache<std::string, EpilogueEntry>;

}  // namespace

Tensor run_post_ops(const Tensor& y, const std::vector<PostOp>& ops, std::span<const Tensor> in) {
  if (ops.empty() || y.int_numel() == 0) return y;
  if (y.dtype() == DType::F32 && y.is_contiguous() && y.dim() >= 1) {
    IntVec out = y.int_sizes();
    auto dims_of = [&](const IntVec& logical, dnnl::memory::dims& d) {
      for (size_t i = 0; i < logical.size(); ++i)
        if (logical[i] != 1 && logical[i] != out[i]) return false;
      d.assign(logical.begin(), logical.end());
      return true;
    };
    DnnlPostOps dp;
    if (build_dnnl_post_ops(ops, in, out, dims_of, false, dp)) {
      std::string key = dp.key;
      for (int64_t d : out) key.append(reinterpret_cast<const char*>(&d), sizeof d);
      // The thread count the primitive is made and run under, in the key: oneDNN fixes a primitive's
      // thread partition when it is created.
      if (omp_get_max_threads() != protean::num_threads()) omp_set_num_threads(protean::num_threads());
      const int64_t threads = omp_get_max_threads();
      key.append(reinterpret_cast<const char*>(&threads), sizeof threads);
      std::shared_ptr<const EpilogueEntry> e =
          EpilogueCache::instance().get(key, [&] { return make_epilogue_entry(out, dp); });
      if (e->prim && dnnl_prepare_only()) return y;
      if (e->prim) {
        static const float zero = 0.0f;
        dnnl::engine& eng = dnnl_engine();
        dnnl::memory my(e->y, eng, y.data_ptr()), mz(e->zero, eng, const_cast<float*>(&zero));
        std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC_0, my}, {DNNL_ARG_SRC_1, mz}, {DNNL_ARG_DST, my}};
        if (e->scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, scratch_memory(e->scratchpad));
        add_post_op_args(dp, args);
        dnnl::stream& strm = dnnl_stream();
        e->prim.execute(strm, args);
        strm.wait();
        return y;
      }
    }
  }
  if (dnnl_prepare_only()) return y;  // nothing of oneDNN's to build
  return apply_post_ops(y, ops, in);
}

}  // namespace protean::ops
