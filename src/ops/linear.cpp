// matmul, bmm, linear: meta functions and CPU kernels.
//
// Semantics (torch.matmul / torch.bmm / torch.nn.functional.linear):
//  * matmul: 1-D·1-D is a dot product (0-dim result); 2-D·1-D and 1-D·2-D drop the added dim; for
//    rank > 2 the batch dims (all but the last two) broadcast. Both inputs must have the same dtype.
//  * bmm: [B, n, k]·[B, k, m] → [B, n, m], no broadcasting.
//  * linear: x[..., in]·weight[out, in]ᵀ + bias (bias broadcasts to the output; weight may be 1-D).
//  * dtypes: f32 f64 f16 bf16 (half types computed in f32 and rounded once) and the integer types
//    (plain loops, wrapping like PyTorch's CPU integer matmul). bool is a TypeError.
//
// Library choice (measured on the development machine, a 2-core AVX-512 EPYC, see docs/benchmarks.md):
// oneDNN's matmul is 1.5–2× faster than Debian's OpenBLAS sgemm for f32 on both square (512²–2048²)
// and PP-OCR-sized shapes ([40, 480]·[480, 96], [40, 120]·[120, 6625]), because its JIT kernels use
// AVX-512 while the packaged OpenBLAS runs an AVX2 kernel here. oneDNN has a fixed per-call cost
// (~4 µs), so tiny products (< kTinyMacs multiply-adds) go to cblas_sgemm; f64 always uses cblas_dgemm
// (oneDNN has no f64 matmul). oneDNN primitives are cached process-wide, keyed by shapes, strides and
// the post-op structure; their scratchpads come from the calling thread (dnnl_util.h).
//
// Packed weights (the `weights` attribute, set by the cpu backend's gemm_weights pass on a 2-D weight:
// "constant" for a graph constant, "reuse" for a graph input): the primitive is created with the
// weights in oneDNN's own (blocked) layout and the weights are reordered into it once and kept
// (PackedGemmWeights, keyed by the storage, its version (protean/tensor_version.h) and the layout), instead of brgemm copying
// the plain weights into that layout inside every call. "reuse" packs on the second call that sees
// the same storage at the same version, so a weight that changes every call runs on the plain layout
// and is never packed. Without the attribute (eager, the interpreter) nothing is packed.
//
// Fused forms (linear_fused, matmul_fused): the base op, then the `post_ops` list (post_ops.h). They
// run as oneDNN post-ops when the product is one oneDNN call (f32, not tiny, batch strides uniform,
// bias absent or passed to oneDNN) and oneDNN keeps its implementation; otherwise run_post_ops
// finishes the result in one more pass.
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <dnnl.hpp>
#include <memory>
#include <unordered_map>

#include "core/storage_version.h"
#include "observe/log.h"
#include "ops/dnnl_util.h"
#include "ops/gemm_team.h"
#include "ops/post_ops.h"
#include "ops/meta_utils.h"
#include "ops/registry.h"
#include "ops/thread_binding.h"
#include "protean/ops.h"

namespace protean::ops {
namespace {

constexpr int64_t kTinyMacs = 1 << 16;

/// What the kernel may do with its weight operand across calls (the `weights` attribute).
enum class WeightPacking { None, Constant, Reuse };
WeightPacking weight_packing(const Attrs& attrs) {
  if (!attrs.has("weights")) return WeightPacking::None;
  const std::string& w = attrs.s("weights");
  if (w == "constant") return WeightPacking::Constant;
  if (w == "reuse") return WeightPacking::Reuse;
  throw ValueError(fmt::format("linear/matmul: weights=\"{}\" is not a weight mode (expected \"constant\" or \"reuse\")", w));
}

// ---- meta ---------------------------------------------------------------------------------------
void check_matmul_dtypes(OpKind op, std::span<const Tensor> in, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    throw TypeError(fmt::format("{}: expected both inputs to have the same dtype, got {} and {}", describe_call(op, in),
                                short_name(a.dtype()), short_name(b.dtype())));
  if (a.dtype() == DType::Bool)
    throw TypeError(fmt::format("{}: dtype b8 not supported (expected a floating or integer dtype)",
                                describe_call(op, in)));
}

void check_inner(OpKind op, std::span<const Tensor> in, const SymInt& ka, const SymInt& kb) {
  if (!static_cast<bool>(ka == kb))
    throw ShapeError(fmt::format("{}: inner dimensions do not match ({} vs {}); expected a[..., n, k] and b[..., k, m]",
                                 describe_call(op, in), ka.str(), kb.str()));
}

std::vector<TensorMeta> meta_matmul(std::span<const Tensor> in, const Attrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  if (a.dim() == 0 || b.dim() == 0)
    throw ShapeError(fmt::format("{}: both arguments need at least 1 dimension", describe_call(OpKind::matmul, in)));
  check_matmul_dtypes(OpKind::matmul, in, a, b);
  const SymIntVec& as = a.sizes();
  const SymIntVec& bs = b.sizes();
  SymInt ka = as.back();
  SymInt kb = b.dim() == 1 ? bs[0] : bs[bs.size() - 2];
  check_inner(OpKind::matmul, in, ka, kb);
  SymIntVec abatch = a.dim() > 2 ? SymIntVec(as.begin(), as.end() - 2) : SymIntVec{};
  SymIntVec bbatch = b.dim() > 2 ? SymIntVec(bs.begin(), bs.end() - 2) : SymIntVec{};
  SymIntVec out = broadcast_shapes(abatch, bbatch, "matmul");
  if (a.dim() >= 2) out.push_back(as[as.size() - 2]);
  if (b.dim() >= 2) out.push_back(bs.back());
  return one(std::move(out), a.dtype());
}

std::vector<TensorMeta> meta_bmm(std::span<const Tensor> in, const Attrs&) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  if (a.dim() != 3 || b.dim() != 3)
    throw ShapeError(fmt::format("{}: expected two 3-D tensors [B, n, k] and [B, k, m]", describe_call(OpKind::bmm, in)));
  check_matmul_dtypes(OpKind::bmm, in, a, b);
  if (!static_cast<bool>(a.size(0) == b.size(0)))
    throw ShapeError(fmt::format("{}: batch sizes differ ({} vs {}); bmm does not broadcast (use matmul)",
                                 describe_call(OpKind::bmm, in), a.size(0).str(), b.size(0).str()));
  check_inner(OpKind::bmm, in, a.size(2), b.size(1));
  return one({a.size(0), a.size(1), b.size(2)}, a.dtype());
}

std::vector<TensorMeta> meta_linear(std::span<const Tensor> in, const Attrs&) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const Tensor& bias = in[2];
  if (x.dim() == 0 || (w.dim() != 1 && w.dim() != 2))
    throw ShapeError(fmt::format("{}: expected x[..., in] (at least 1-D) and weight[out, in] or weight[in]",
                                 describe_call(OpKind::linear, in)));
  check_matmul_dtypes(OpKind::linear, in, x, w);
  check_inner(OpKind::linear, in, x.sizes().back(), w.sizes().back());
  SymIntVec out(x.sizes().begin(), x.sizes().end() - 1);
  if (w.dim() == 2) out.push_back(w.size(0));
  if (bias.defined()) {
    if (bias.dtype() != x.dtype())
      throw TypeError(fmt::format("{}: bias dtype {} differs from input dtype {}", describe_call(OpKind::linear, in),
                                  short_name(bias.dtype()), short_name(x.dtype())));
    SymIntVec bshape = broadcast_shapes(out, bias.sizes(), "linear");
    if (bshape.size() != out.size())
      throw ShapeError(fmt::format("{}: bias of shape {} does not broadcast to the output shape {}",
                                   describe_call(OpKind::linear, in), to_string(bias.sizes()), to_string(out)));
    for (size_t i = 0; i < out.size(); ++i)
      if (!static_cast<bool>(bshape[i] == out[i]))
        throw ShapeError(fmt::format("{}: bias of shape {} does not broadcast to the output shape {}",
                                     describe_call(OpKind::linear, in), to_string(bias.sizes()), to_string(out)));
  }
  return one(std::move(out), x.dtype());
}

// ---- kernels --------------------------------------------------------------------------------------
/// A batch of matrices viewed in an input's storage: element offsets per output batch, plus the
/// matrix's rows/cols strides (in elements).
struct MatOperand {
  const void* base = nullptr;  // data_ptr of the (possibly copied) input
  std::vector<int64_t> offsets;  // one per output batch
  int64_t rows = 0, cols = 0, rs = 0, cs = 0;
};

/// Iterates the broadcast batch index space; `fn(batch, offset_a, offset_b)`.
void batch_offsets(const IntVec& out_batch, const IntVec& sa, const IntVec& ta, std::vector<int64_t>& offs) {
  // sa/ta: the operand's batch sizes/strides right-aligned to out_batch (missing dims: size 1).
  int64_t n = 1;
  for (int64_t s : out_batch) n *= s;
  offs.assign(static_cast<size_t>(n), 0);
  IntVec idx(out_batch.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < out_batch.size(); ++d)
      if (sa[d] != 1) off += idx[d] * ta[d];
    offs[static_cast<size_t>(i)] = off;
    for (size_t d = out_batch.size(); d-- > 0;) {
      if (++idx[d] < out_batch[d]) break;
      idx[d] = 0;
    }
  }
}

/// Normalizes strides of size-1 dims and reports whether BLAS/oneDNN can read the matrix in place
/// (row-major or column-major with a leading dimension large enough).
bool blas_layout(int64_t rows, int64_t cols, int64_t& rs, int64_t& cs) {
  if (cols == 1) cs = 1;
  if (rows == 1) rs = std::max<int64_t>(cols, 1);
  if (cs == 1 && rs >= std::max<int64_t>(cols, 1)) return true;
  if (cols == 1 && rows > 1 && rs == 1) {  // a column vector is also column-major
    cs = rows;
    return true;
  }
  if (rs == 1 && cs >= std::max<int64_t>(rows, 1)) return true;
  return false;
}

/// Copies the strided view (sizes, strides) of `x`'s data into a new contiguous tensor of `dtype`.
Tensor copy_view(const Tensor& x, const IntVec& sizes, const IntVec& strides, DType dtype) {
  Tensor out = empty(sizes, dtype);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  if (n == 0) return out;
  dispatch_dtype(x.dtype(), [&]<typename S>() {
    dispatch_dtype(dtype, [&]<typename D>() {
      const S* src = x.data_ptr<S>();
      D* dst = out.data_ptr<D>();
      IntVec idx(sizes.size(), 0);
      int64_t off = 0;
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>)
          dst[i] = D(static_cast<float>(src[off]));
        else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>)
          dst[i] = static_cast<D>(static_cast<float>(src[off]));
        else
          dst[i] = static_cast<D>(src[off]);
        for (size_t d = sizes.size(); d-- > 0;) {
          off += strides[d];
          if (++idx[d] < sizes[d]) break;
          off -= strides[d] * sizes[d];
          idx[d] = 0;
        }
      }
    });
  });
  return out;
}
Tensor copy_contiguous(const Tensor& x, DType dtype) { return copy_view(x, x.int_sizes(), x.int_strides(), dtype); }

/// Builds the operand for the matrix made of the last two of `sizes` (after 1-D promotion), with
/// batch dims broadcast to `out_batch`. `keep` receives a contiguous copy when the layout needs one.
MatOperand make_operand(const Tensor& t, IntVec sizes, IntVec strides, const IntVec& out_batch, DType dtype,
                        Tensor& keep) {
  MatOperand m;
  size_t r = sizes.size();
  m.rows = sizes[r - 2];
  m.cols = sizes[r - 1];
  m.rs = strides[r - 2];
  m.cs = strides[r - 1];
  keep = t;
  if (!blas_layout(m.rows, m.cols, m.rs, m.cs) || t.dtype() != dtype) {
    // Copy the (promoted, possibly transposed) view to a contiguous `dtype` tensor.
    keep = copy_view(t, sizes, strides, dtype);
    IntVec cstr(sizes.size());
    int64_t acc = 1;
    for (size_t d = sizes.size(); d-- > 0;) {
      cstr[d] = acc;
      acc *= std::max<int64_t>(sizes[d], 1);
    }
    strides = cstr;
    m.rs = strides[r - 2];
    m.cs = strides[r - 1];
    blas_layout(m.rows, m.cols, m.rs, m.cs);
  }
  m.base = keep.numel().hint() > 0 ? keep.data_ptr() : nullptr;
  size_t nb = out_batch.size();
  IntVec bs(nb, 1), bt(nb, 0);
  for (size_t i = 0; i + 2 < r; ++i) {
    bs[nb - (r - 2) + i] = sizes[i];
    bt[nb - (r - 2) + i] = strides[i];
  }
  batch_offsets(out_batch, bs, bt, m.offsets);
  return m;
}

/// OpenBLAS (pthreads build) and oneDNN (OpenMP build) follow protean::num_threads(): OpenBLAS through
/// openblas_set_num_threads, oneDNN through this thread's OpenMP thread count.
void set_blas_threads() {
  static thread_local int last = -1;
  int n = protean::num_threads();
  if (n != last) {
    // may start pool threads, which inherit this thread's CPU mask: give them the caller's own
    with_caller_mask([n] { openblas_set_num_threads(n); });
    last = n;
  }
}
void set_omp_threads() {
  int n = protean::num_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

template <typename T>
void gemm_cblas(const MatOperand& a, const MatOperand& b, T* out, int64_t nbatch) {
  int64_t M = a.rows, K = a.cols, N = b.cols;
  bool ta = a.cs != 1, tb = b.cs != 1;
  int64_t lda = ta ? a.cs : a.rs, ldb = tb ? b.cs : b.rs;
  set_blas_threads();
  for (int64_t i = 0; i < nbatch; ++i) {
    const T* pa = static_cast<const T*>(a.base) + a.offsets[static_cast<size_t>(i)];
    const T* pb = static_cast<const T*>(b.base) + b.offsets[static_cast<size_t>(i)];
    T* pc = out + i * M * N;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                  static_cast<int>(N), static_cast<int>(K), 1.0f, pa, static_cast<int>(lda), pb, static_cast<int>(ldb),
                  0.0f, pc, static_cast<int>(std::max<int64_t>(N, 1)));
    else
      cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
                  static_cast<int>(N), static_cast<int>(K), 1.0, pa, static_cast<int>(lda), pb, static_cast<int>(ldb),
                  0.0, pc, static_cast<int>(std::max<int64_t>(N, 1)));
  }
}

template <typename T>
void gemm_loops(const MatOperand& a, const MatOperand& b, T* out, int64_t nbatch) {
  int64_t M = a.rows, K = a.cols, N = b.cols;
  const T* A = static_cast<const T*>(a.base);
  const T* B = static_cast<const T*>(b.base);
#pragma omp parallel for collapse(2) num_threads(protean::num_threads()) if (nbatch * M * N * K > (1 << 16))
  for (int64_t bi = 0; bi < nbatch; ++bi)
    for (int64_t i = 0; i < M; ++i) {
      const T* pa = A + a.offsets[static_cast<size_t>(bi)] + i * a.rs;
      const T* pb = B + b.offsets[static_cast<size_t>(bi)];
      T* pc = out + (bi * M + i) * N;
      for (int64_t j = 0; j < N; ++j) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += static_cast<int64_t>(pa[k * a.cs]) * static_cast<int64_t>(pb[k * b.rs + j * b.cs]);
        pc[j] = static_cast<T>(acc);
      }
    }
}

// oneDNN matmul with a process-wide primitive cache.

// Every key holds the OpenMP thread count the primitive is made under: oneDNN fixes a primitive's
// thread partition when it is created (and runs that many threads whatever the caller's count later),
// so an entry made at 2 threads must not serve a call at 1 (it ran 2 threads, and its threads spin at
// the primitive's barriers) nor one made at 1 a call at 2 (it ran on one thread).
struct MatmulKey {
  std::array<int64_t, 16> v;
  std::string post;  // DnnlPostOps::key of the requested post-ops ("" for none)
  bool operator==(const MatmulKey& o) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : k.v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h ^ (std::hash<std::string>()(k.post) * 31);
  }
};
/// A matmul primitive; immutable once built (its scratchpad comes from the calling thread).
struct MatmulEntry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, bias, scratchpad;
  bool post_in_primitive = false;  // the post-ops run inside `prim`; else the caller applies them
  // Packed weights: `b` is oneDNN's own layout, filled from the plain `b_plain` by `b_reorder`.
  bool packed = false;
  dnnl::memory::desc b_plain;
  dnnl::reorder b_reorder;
};

/// Weights kept in a primitive's layout across calls (WeightPacking), keyed by their address, the
/// layout they are read in (the same memory may be a linear's weight, read transposed, and a
/// matmul's right operand) and the packed layout. An item remembers the storage (weak reference: its control block identifies the storage
/// even after the address is reused) and the storage's version when it was made; a different storage
/// or version makes it stale. Reuse mode records the first sighting without packing.
class PackedGemmWeights {
 public:
  static PackedGemmWeights& instance() {
    static PackedGemmWeights* c = new PackedGemmWeights();  // never destroyed: kernels may run at exit
    return *c;
  }

  /// `w`'s matrix at `data` (layout e.b_plain) in layout e.b, or an undefined tensor when this call
  /// should run on the plain layout (Reuse mode, first sighting of this storage version).
  Tensor get(const Tensor& w, const void* data, const MatmulEntry& e, WeightPacking mode) {
    const std::shared_ptr<Storage>& owner = w.impl()->storage;
    const uint64_t version = core::storage_version(owner.get());
    const uint64_t sample = sample_fingerprint(data, e.b_plain);
    Key key{data, e.b_plain, e.b};
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    bool same = it != map_.end() && !it->second.owner.owner_before(owner) &&
                !owner.owner_before(it->second.owner) && it->second.version == version;
    if (same && it->second.sample != sample) {
      // The bytes changed but the version did not: a write through data_ptr(), DLPack or from_blob
      // memory that was not announced. Never run on the stale copy; say once how to avoid the repack.
      same = false;
      static std::once_flag warned;
      std::call_once(warned, [] {
        observe::warn(
            "cpu: a matmul weight's bytes changed without a version bump; its packed copy is rebuilt. Call "
            "protean::increment_version(t) (protean/tensor_version.h) after writing a tensor through data_ptr(), "
            "or set PROTEAN_CPU_PACKED_WEIGHTS=0");
      });
    }
    if (same && it->second.packed.defined()) {
      note_dnnl_packed_weights(0, 1, 0);
      return it->second.packed;
    }
    if (!same && mode == WeightPacking::Reuse) {
      insert(key, Item{owner, version, sample, Tensor()});
      note_dnnl_packed_weights(0, 0, 1);
      return Tensor();
    }
    Tensor packed = empty({static_cast<int64_t>(e.b.get_size())}, DType::U8);
    dnnl::engine& eng = dnnl_engine();
    dnnl::memory src(e.b_plain, eng, const_cast<void*>(data)), dst(e.b, eng, packed.data_ptr());
    e.b_reorder.execute(dnnl_stream(), src, dst);
    dnnl_stream().wait();
    insert(key, Item{owner, version, sample, packed});
    note_dnnl_packed_weights(1, 0, 0);
    return packed;
  }

 private:
  struct Key {
    const void* data;
    dnnl::memory::desc from, layout;
    bool operator==(const Key& o) const { return data == o.data && from == o.from && layout == o.layout; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.data) ^ (static_cast<size_t>(k.layout.get_size()) * 1099511628211ull);
    }
  };
  struct Item {
    std::weak_ptr<Storage> owner;
    uint64_t version = 0;
    uint64_t sample = 0;  // sample_fingerprint of the plain matrix when the item was made
    Tensor packed;        // undefined: seen once (Reuse), not packed
  };
  /// A hash of 64 f32 elements of the plain matrix at `data`: 8 anchors spread evenly over it (first
  /// and last element included), at each anchor 8 elements that are neighbours in memory (along the
  /// dim of smallest stride). A version bump is what keeps packed weights current
  /// (protean/tensor_version.h); this sample catches the common unannounced write — new weights loaded
  /// into the same memory — at the cost of 8 cache lines and 8 pages per call (0.45 us on the 2-vCPU
  /// VM). 64 anchors on 64 pages cost 2.5 us per call there (a TLB miss and a nested page walk each:
  /// the plain weights are not otherwise read once packed), which a GEMM split over two threads paid
  /// on both slices.
  static uint64_t sample_fingerprint(const void* data, const dnnl::memory::desc& md) {
    const int nd = md.data.ndims;
    const auto& dims = md.data.dims;
    const auto& strides = md.data.format_desc.blocking.strides;
    int64_t total = 1;
    for (int d = 0; d < nd; ++d) total *= dims[d];
    uint64_t h = 1469598103934665603ull;
    if (total <= 0) return h;
    int inner = nd - 1;  // the dim whose neighbours are closest in memory
    for (int d = 0; d < nd; ++d)
      if (dims[d] > 1 && (dims[inner] <= 1 || strides[d] < strides[inner])) inner = d;
    const auto* base = static_cast<const unsigned char*>(data);
    constexpr int64_t kAnchors = 8, kRun = 8;
    for (int64_t t = 0; t < kAnchors; ++t) {
      int64_t lin = (total - 1) * t / (kAnchors - 1), off = 0, at_inner = 0;
      for (int d = nd - 1; d >= 0; --d) {
        const int64_t i = lin % dims[d];
        if (d == inner) at_inner = i;
        off += i * strides[d];
        lin /= dims[d];
      }
      // the run starts at the anchor, or earlier where the anchor is near the dim's end
      const int64_t run = std::min<int64_t>(kRun, dims[inner]);
      off -= (at_inner - std::min(at_inner, dims[inner] - run)) * strides[inner];
      for (int64_t j = 0; j < run; ++j) {
        uint32_t bits = 0;
        std::memcpy(&bits, base + (off + j * strides[inner]) * static_cast<int64_t>(sizeof(float)), sizeof bits);
        h = (h ^ bits) * 1099511628211ull;
      }
    }
    return h;
  }
  void insert(const Key& key, Item item) {
    // Packed copies of weights that are gone are dropped as soon as the map grows, not at capacity.
    if (map_.size() >= 64) std::erase_if(map_, [](const auto& kv) { return kv.second.owner.expired(); });
    if (map_.size() >= kCapacity) map_.clear();
    map_.insert_or_assign(key, std::move(item));
  }
  static constexpr size_t kCapacity = 4096;
  std::mutex mu_;
  std::unordered_map<Key, Item, KeyHash> map_;
};

/// Post-ops of a fused call: the list, the call's inputs (operands by index), the logical output
/// sizes, and whether the kernel applied them (set by gemm_dnnl).
struct GemmPost {
  const std::vector<PostOp>* ops = nullptr;
  std::span<const Tensor> in;
  IntVec out;
  bool done = false;
};

/// Builds the matmul primitive for C[nb] = A[batch_a] · B[batch_b] (+ bias) with the given batch
/// strides and operand layouts, keeping `post` inside it only where oneDNN's brgemm kernel runs it.
std::shared_ptr<const MatmulEntry> make_entry(int64_t batch_a, int64_t batch_b, int64_t nb, int64_t M, int64_t N,
                                              int64_t K, int64_t bsa, int64_t bsb, const MatOperand& a,
                                              const MatOperand& b, bool bias, const DnnlPostOps* post, bool pack_b,
                                              int64_t ldc) {
  auto t0 = std::chrono::steady_clock::now();
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  // One product (no batch): 2-D descriptors. oneDNN 2.6 answers weights of format `any` with its
  // blocked brgemm layout (BA16a64b) only for 2-D problems; for 3-D ones it picks the plain [K, N]
  // layout, which brgemm reads in place but 1.1-2.5x slower than the blocked one (1024x1024 weights,
  // M = 128..1, one thread).
  const bool flat = batch_a == 1 && batch_b == 1 && nb == 1;
  md da = flat ? md({M, K}, dt::f32, {a.rs, a.cs}) : md({batch_a, M, K}, dt::f32, {bsa, a.rs, a.cs});
  md db_plain = flat ? md({K, N}, dt::f32, {b.rs, b.cs}) : md({batch_b, K, N}, dt::f32, {bsb, b.rs, b.cs});
  // packed: the weights in whatever layout the kernel oneDNN picks wants (format `any`)
  md db = !pack_b ? db_plain
          : flat  ? md({K, N}, dt::f32, dnnl::memory::format_tag::any)
                  : md({batch_b, K, N}, dt::f32, dnnl::memory::format_tag::any);
  // ldc: the output's row stride (a column slice of a wider result, gemm_team.h; N otherwise)
  md dc = flat ? md({M, N}, dt::f32, {ldc, 1}) : md({nb, M, N}, dt::f32, {M * N, N, 1});
  md dbias = !bias ? md() : flat ? md({1, N}, dt::f32, {N, 1}) : md({1, 1, N}, dt::f32, {N, N, 1});
  dnnl::matmul::desc d = bias ? dnnl::matmul::desc(da, db, dbias, dc) : dnnl::matmul::desc(da, db, dc);
  dnnl::primitive_attr bare;
  bare.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(d, bare, dnnl_engine());
  auto e = std::make_shared<MatmulEntry>();
  if (post) {
    // Keep the post-ops only when oneDNN runs them in the (brgemm) implementation it picks without them.
    dnnl::primitive_attr with_post;  // not a copy of `bare`: attrs are shared handles
    with_post.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    with_post.set_post_ops(post->ops);
    try {
      dnnl::matmul::primitive_desc fused(d, with_post, dnnl_engine());
      // brgemm kernels inject post-ops into their JIT code; others apply them with slower loops
      std::string impl = pd.impl_info_str();
      if (std::string(fused.impl_info_str()) == impl && impl.rfind("brg", 0) == 0 &&
          fused.weights_desc() == pd.weights_desc()) {
        pd = fused;
        e->post_in_primitive = true;
      }
    } catch (const dnnl::error&) {
    }
  }
  e->prim = dnnl::matmul(pd);
  e->a = da;
  e->b = pd.weights_desc();
  e->b_plain = db_plain;
  e->packed = !(e->b == db_plain);
  int made = 1;
  if (e->packed) {
    e->b_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), db_plain, dnnl_engine(), e->b));
    ++made;
  }
  e->c = dc;
  e->bias = dbias;
  e->scratchpad = pd.scratchpad_desc();
  note_dnnl_create(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), made);
  return e;
}

/// The process's matmul primitives, keyed by shapes, strides, bias and the post-op structure.
using MatmulCache = PrimitiveCache<MatmulKey, MatmulEntry, MatmulKeyHash>;

bool uniform_stride(const std::vector<int64_t>& offs, int64_t& stride) {
  stride = offs.size() > 1 ? offs[1] - offs[0] : 0;
  if (offs.empty() || offs[0] != 0) return false;
  for (size_t i = 1; i < offs.size(); ++i)
    if (offs[i] - offs[i - 1] != stride) return false;
  return true;
}

/// A weight operand the kernel may keep packed: the tensor whose storage B reads, and the mode.
struct GemmPack {
  const Tensor* w = nullptr;
  WeightPacking mode = WeightPacking::None;
};

/// The argument memories of a matmul primitive's call (its post-op operands aside), kept on this
/// thread across calls: the last 8 primitives it ran, each with its memories, whose data handles are set
/// again only where the call's pointers differ. A dnnl::memory made per call costs an allocation and
/// its set-up; a brgemm matmul of 16x128x128 took 2-4 us longer per call with its four memories made
/// afresh than with kept ones (one thread, the 2-vCPU Zen 5 VM). New weights get a new memory rather
/// than set_data_handle, which zeroes a padded layout's padding: packed weights are read by the other
/// threads of a split meanwhile, and are never written here.
const std::unordered_map<int, dnnl::memory>& kept_call_memories(const std::shared_ptr<const MatmulEntry>& e, const float* a,
                                                                const void* b, float* c, const float* bias,
                                                                const void* scratch) {
  struct Kept {
    std::shared_ptr<const MatmulEntry> entry;  // held: its address identifies the slot
    const void* ptr[5] = {};                   // the handles set: a, b, c, bias, scratchpad
    std::unordered_map<int, dnnl::memory> args;
  };
  static thread_local std::array<Kept, 8> slots;
  static thread_local size_t next = 0;
  const void* want[5] = {a, b, c, bias, scratch};
  constexpr int kArg[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS, DNNL_ARG_SCRATCHPAD};
  Kept* k = nullptr;
  for (Kept& s : slots)
    if (s.entry == e) k = &s;
  if (!k) {
    k = &slots[next];
    next = (next + 1) % slots.size();
    k->entry = e;
    k->args.clear();
    const dnnl::memory::desc* md[5] = {&e->a, &e->b, &e->c, &e->bias, &e->scratchpad};
    dnnl::engine& eng = dnnl_engine();
    for (int i = 0; i < 5; ++i) {
      k->ptr[i] = want[i];
      if (want[i]) k->args.emplace(kArg[i], dnnl::memory(*md[i], eng, const_cast<void*>(want[i])));
    }
    return k->args;
  }
  for (int i = 0; i < 5; ++i) {
    if (k->ptr[i] == want[i]) continue;
    // a slot made without this argument (no bias, no scratchpad) keeps it absent: same primitive,
    // so the same arguments; a null pointer cannot come where one was set
    auto it = k->args.find(kArg[i]);
    if (it != k->args.end() && want[i]) {
      if (i == 1)  // the weights: a new memory of their own (see above)
        it->second = dnnl::memory(e->b, dnnl_engine(), const_cast<void*>(want[i]));
      else
        it->second.set_data_handle(const_cast<void*>(want[i]));
    }
    k->ptr[i] = want[i];
  }
  return k->args;
}

/// out = A·B (+ bias) through oneDNN; with `post`, also the post-ops when one primitive covers the
/// whole batch and oneDNN accepts them (then post->done is set). With `pack` (B one matrix read in
/// place from pack->w), B comes from PackedGemmWeights when that has it.
void gemm_dnnl(const MatOperand& a, const MatOperand& b, float* out, int64_t nbatch, const float* bias,
               GemmPost* post, const GemmPack* pack = nullptr) {
  dnnl::stream& strm = dnnl_stream();
  set_omp_threads();
  int64_t M = a.rows, K = a.cols, N = b.cols;
  int64_t sa = 0, sb = 0;
  bool one_call = uniform_stride(a.offsets, sa) && uniform_stride(b.offsets, sb);
  // One primitive call: C[nb] (M rows ldc apart, N columns) = A · B + bias; `bind`: the team may be
  // bound for it (an OpenMP region of the primitive's threads; false for a one-thread slice).
  auto run_part = [&](int64_t nb, int64_t ba, int64_t bb, int64_t bsa, int64_t bsb, const float* pa, const float* pb,
                      float* pc, const DnnlPostOps* dp, int64_t M, int64_t N, int64_t ldc, const float* bias, bool bind) {
    auto entry = [&](bool packed) {
      MatmulKey key{{nb, ba, bb, M, N, K, bsa, bsb, a.rs, a.cs, b.rs, b.cs, bias != nullptr, packed, omp_get_max_threads(), ldc},
                    dp ? dp->key : ""};
      return MatmulCache::instance().get(
          key, [&] { return make_entry(ba, bb, nb, M, N, K, bsa, bsb, a, b, bias != nullptr, dp, packed, ldc); });
    };
    std::shared_ptr<const MatmulEntry> e;
    Tensor packed_b;  // keeps the packed weights alive until the primitive has run
    const void* wb = pb;
    if (pack && pack->mode != WeightPacking::None && bb == 1) {
      e = entry(true);
      if (e->packed) {
        packed_b = PackedGemmWeights::instance().get(*pack->w, pb, *e, pack->mode);
        if (packed_b.defined()) wb = packed_b.data_ptr();
        else e = nullptr;  // not packed this call: the plain-layout primitive
      }
    }
    if (!e) e = entry(false);
    const bool in_primitive = dp && e->post_in_primitive;
    const void* scratch = e->scratchpad.get_size() > 0 ? thread_scratch(ScratchSlot::Primitive, e->scratchpad.get_size()) : nullptr;
    const std::unordered_map<int, dnnl::memory>& kept = kept_call_memories(e, pa, wb, pc, bias, scratch);
    std::unordered_map<int, dnnl::memory> with_post;  // post-op operands vary per call: added to a copy
    if (in_primitive) {
      with_post = kept;
      add_post_op_args(*dp, with_post);
    }
    const std::unordered_map<int, dnnl::memory>* args = in_primitive ? &with_post : &kept;
    if (bind) {
      // the team on distinct CPUs (ops/thread_binding.h): else a woken worker may share this CPU
      TeamBinding binding(nb * M * N * K >= kBindTeamMinMacs);
      e->prim.execute(strm, *args);
    } else {
      e->prim.execute(strm, *args);
    }
    strm.wait();
    return in_primitive;
  };
  auto run = [&](int64_t nb, int64_t ba, int64_t bb, int64_t bsa, int64_t bsb, const float* pa, const float* pb,
                 float* pc, const DnnlPostOps* dp) {
    return run_part(nb, ba, bb, bsa, bsb, pa, pb, pc, dp, M, N, N, bias, true);
  };
  const float* A = static_cast<const float*>(a.base);
  const float* B = static_cast<const float*>(b.base);
  // Protean's GEMM team (gemm_team.h): one product split into slices, each a one-thread primitive
  // followed by the post-ops on its part of the output, no OpenMP region; a product too small to split
  // runs the same way on this thread alone. Post-ops that are scalar loops here stay with oneDNN.
  // A product with enough rows splits by rows: each slice is the whole product's kind of primitive on
  // fewer rows, dense rows of N columns, so oneDNN 2.6 keeps its brgemm kernel on the blocked packed
  // weights (one copy for both slices). A column slice writes rows wider than its columns (ldc > N),
  // which 2.6's brgemm matmul does not take; it runs the jit gemm on plain weights instead, about a
  // third slower per multiply-add (the MLP of bench/cpu2_mlp_gap.cpp at batch 100 on the Zen 5 VM:
  // 530-590 us a column slice against 400-520 us for half the rows). Few rows split by columns.
  const int threads = protean::num_threads();
  if (one_call && nbatch == 1 && threads > 1 &&
      (!post || (PostOpsF32::vector_loops(*post->ops) && !post->out.empty() && post->out.back() == N)) &&
      gemm_team_enabled() && !omp_in_parallel()) {
    const int64_t macs = M * N * K;
    // too small to split, or too small to pay for waking a sleeping worker: the caller alone
    const bool small = macs < kGemmTeamMinMacs || (macs < gemm_team_cold_min_macs() && !gemm_team_hot(threads));
    const bool by_rows = !small && M >= kGemmTeamMinRows * threads;
    const bool by_columns = !small && !by_rows && N >= kGemmTeamColumnBlock * threads;
    // rows per slice: M / threads rounded up; columns per slice: N / threads rounded up to whole blocks
    // (the last slice takes the rest)
    const int64_t height = by_rows ? (M + threads - 1) / threads : M;
    const int64_t chunk = (N + threads - 1) / threads;
    const int64_t width = by_columns ? (chunk + kGemmTeamColumnBlock - 1) / kGemmTeamColumnBlock * kGemmTeamColumnBlock : N;
    const int parts = static_cast<int>(by_rows ? (M + height - 1) / height : (N + width - 1) / width);
    if (parts > 1 || small) {
      std::optional<PostOpsF32> ops;
      if (post) ops.emplace(post->out, *post->ops, post->in);
      auto slice = [&](int t) {
        const int64_t r0 = by_rows ? t * height : 0, r1 = by_rows ? std::min(M, r0 + height) : M;
        const int64_t c0 = by_rows ? 0 : t * width, c1 = by_rows ? N : std::min(N, c0 + width);
        if (c0 >= c1 || r0 >= r1) return;
        const int before = omp_get_max_threads();
        if (before != 1) omp_set_num_threads(1);
        try {
          run_part(1, 1, 1, (r1 - r0) * K, K * N, A + r0 * a.rs, B + c0 * b.cs, out + r0 * N + c0, nullptr, r1 - r0,
                   c1 - c0, N, bias ? bias + c0 : nullptr, false);
        } catch (...) {
          if (before != 1) omp_set_num_threads(before);
          throw;
        }
        if (before != 1) omp_set_num_threads(before);
        if (ops) {
          if (by_rows) ops->apply_rows(out, r0, r1);
          else ops->apply_columns(out, c0, c1);
        }
      };
      bool done = false;
      if (parts == 1) {
        slice(0);
        done = true;
      } else {
        done = run_on_bound_gemm_team(parts, slice, macs >= kBindTeamMinMacs);
      }
      if (done) {
        if (post) post->done = true;
        return;
      }
    }
  }
  if (one_call) {
    // A batch stride of 0 means the operand is broadcast: oneDNN broadcasts a batch dim of size 1.
    int64_t ba = sa == 0 ? 1 : nbatch, bb = sb == 0 ? 1 : nbatch;
    DnnlPostOps dp;
    bool have_post = false;
    if (post) {
      // Logical operand dims → the destination [nbatch, M, N]: a scalar, a vector along N, or the
      // whole output (the output is contiguous, so its logical shape flattens to [nbatch, M, N]).
      // (one product: the primitive is 2-D, see make_entry)
      const bool flat = nbatch == 1;
      auto dims_of = [&](const IntVec& logical, dnnl::memory::dims& d) {
        int64_t n = 1;
        bool only_last = true;
        for (size_t i = 0; i < logical.size(); ++i) {
          n *= logical[i];
          if (i + 1 < logical.size() && logical[i] != 1) only_last = false;
        }
        if (n == 1) d = flat ? dnnl::memory::dims{1, 1} : dnnl::memory::dims{1, 1, 1};
        else if (logical == post->out) d = flat ? dnnl::memory::dims{M, N} : dnnl::memory::dims{nbatch, M, N};
        else if (only_last && !post->out.empty() && logical.back() == N && post->out.back() == N)
          d = flat ? dnnl::memory::dims{1, N} : dnnl::memory::dims{1, 1, N};
        else return false;
        return true;
      };
      have_post = build_dnnl_post_ops(*post->ops, post->in, post->out, dims_of, false, dp);
    }
    bool done = run(nbatch, ba, bb, sa == 0 ? M * K : sa, sb == 0 ? K * N : sb, A, B, out, have_post ? &dp : nullptr);
    if (post) post->done = done;
    return;
  }
  for (int64_t i = 0; i < nbatch; ++i)
    run(1, 1, 1, M * K, K * N, A + a.offsets[static_cast<size_t>(i)], B + b.offsets[static_cast<size_t>(i)],
        out + i * M * N, nullptr);
}

/// Adds a bias (broadcast to `out`'s contiguous shape) in place.
template <typename T>
void add_bias(T* out, const IntVec& osizes, const Tensor& bias) {
  IntVec bs = bias.int_sizes(), bt = bias.int_strides();
  size_t r = osizes.size();
  IntVec s(r, 0);
  for (size_t i = 0; i < bs.size(); ++i)
    if (bs[i] != 1) s[r - bs.size() + i] = bt[i];
  int64_t n = 1;
  for (int64_t x : osizes) n *= x;
  const T* b = bias.data_ptr<T>();
  IntVec idx(r, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      out[i] = T(static_cast<float>(out[i]) + static_cast<float>(b[off]));
    else
      out[i] = static_cast<T>(out[i] + b[off]);
    for (size_t d = r; d-- > 0;) {
      off += s[d];
      if (++idx[d] < osizes[d]) break;
      off -= s[d] * osizes[d];
      idx[d] = 0;
    }
  }
}

/// Computes out[batch..., M, N] = A·B for operands given as (tensor, promoted sizes, promoted strides).
/// `bias`, when defined, is added (broadcast to the output). `post` (fused calls): post-ops oneDNN may
/// apply in the same primitive; post->done tells whether it did.
Tensor run_gemm(const Tensor& a, IntVec asz, IntVec ast, const Tensor& b, IntVec bsz, IntVec bst,
                const TensorMeta& out_meta, const Tensor& bias, GemmPost* post = nullptr,
                WeightPacking packing = WeightPacking::None) {
  DType dt = out_meta.dtype;
  int64_t M = asz[asz.size() - 2], N = bsz.back(), K = asz.back();
  // Fold batch dims of `a` into rows when `b` is a single matrix and `a`'s [batch..., M] dims collapse
  // into one strided dim: one large GEMM instead of many small ones.
  if (bsz.size() == 2 && asz.size() > 2 && (!bias.defined() || bias.dim() <= 1) && (ast.back() == 1 || K == 1)) {
    int64_t rows = 1, row_stride = K, expected = -1;
    bool foldable = true;
    for (size_t d = asz.size() - 1; d-- > 0;) {
      if (asz[d] == 1) continue;
      if (expected >= 0 && ast[d] != expected) foldable = false;
      if (expected < 0) row_stride = ast[d];
      expected = ast[d] * asz[d];
      rows *= asz[d];
    }
    if (foldable) {
      TensorMeta m2 = TensorMeta::contiguous(to_symint_vec({rows, N}), dt);
      Tensor r = run_gemm(a, {rows, K}, {row_stride, ast.back()}, b, bsz, bst, m2, bias, post, packing);
      return make_view(r, out_meta);
    }
  }
  Tensor out = empty_like_meta(out_meta);
  IntVec osizes = out.int_sizes();
  // Broadcast batch shape.
  size_t nb = std::max(asz.size(), bsz.size()) - 2;
  IntVec out_batch(nb, 1);
  for (size_t i = 0; i < nb; ++i) {
    int64_t x = i + asz.size() >= nb + 2 ? asz[i + asz.size() - nb - 2] : 1;
    int64_t y = i + bsz.size() >= nb + 2 ? bsz[i + bsz.size() - nb - 2] : 1;
    out_batch[i] = x == 1 ? y : x;
  }
  int64_t nbatch = 1;
  for (int64_t x : out_batch) nbatch *= x;
  if (out.int_numel() == 0) return out;
  bool half = dt == DType::F16 || dt == DType::BF16;
  DType cdt = half ? DType::F32 : dt;
  if (K == 0) {
    dispatch_dtype(dt, [&]<typename T>() {
      T* p = out.data_ptr<T>();
      for (int64_t i = 0; i < out.int_numel(); ++i) p[i] = T(0.0f);
      if (bias.defined()) add_bias(p, osizes, bias);
    });
    return out;
  }
  Tensor keep_a, keep_b;
  MatOperand ma = make_operand(a, asz, ast, out_batch, cdt, keep_a);
  MatOperand mb = make_operand(b, bsz, bst, out_batch, cdt, keep_b);
  Tensor res = half ? empty(osizes, DType::F32) : out;
  bool dnnl_bias = false;
  if (cdt == DType::F32) {
    bool tiny = nbatch * M * N * K < kTinyMacs;
    const float* bias_ptr = nullptr;
    if (bias.defined() && !half && bias.dim() == 1 && bias.int_sizes()[0] == N && N > 1 &&
        bias.int_strides()[0] == 1 && !tiny) {
      bias_ptr = bias.data_ptr<float>();
      dnnl_bias = true;
    }
    // B packable: one matrix for the whole batch, read in place from b's storage (no layout copy)
    GemmPack pack{&b, bsz.size() == 2 && keep_b.impl() == b.impl() ? packing : WeightPacking::None};
    if (tiny)
      gemm_cblas<float>(ma, mb, res.data_ptr<float>(), nbatch);
    else
      gemm_dnnl(ma, mb, res.data_ptr<float>(), nbatch, bias_ptr, bias.defined() && !dnnl_bias ? nullptr : post, &pack);
  } else if (cdt == DType::F64) {
    gemm_cblas<double>(ma, mb, res.data_ptr<double>(), nbatch);
  } else {
    dispatch_dtype(cdt, [&]<typename T>() {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) gemm_loops<T>(ma, mb, res.data_ptr<T>(), nbatch);
    });
  }
  if (half) {
    const float* src = res.data_ptr<float>();
    dispatch_dtype(dt, [&]<typename T>() {
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
        T* dst = out.data_ptr<T>();
        int64_t n = out.int_numel();
        if (bias.defined()) {
          Tensor b32 = copy_contiguous(bias, DType::F32);
          float* r = res.data_ptr<float>();
          add_bias(r, osizes, b32);
        }
        for (int64_t i = 0; i < n; ++i) dst[i] = T(src[i]);
      }
    });
  } else if (bias.defined() && !dnnl_bias) {
    dispatch_dtype(dt, [&]<typename T>() { add_bias(out.data_ptr<T>(), osizes, bias); });
  }
  return out;
}

Tensor matmul_impl(std::span<const Tensor> in, std::span<const TensorMeta> out, GemmPost* post,
                   WeightPacking packing = WeightPacking::None, const Tensor& bias = Tensor()) {
  const Tensor& a = in[0];
  const Tensor& b = in[1];
  IntVec asz = a.int_sizes(), ast = a.int_strides(), bsz = b.int_sizes(), bst = b.int_strides();
  if (asz.size() == 1) {
    asz.insert(asz.begin(), 1);
    ast.insert(ast.begin(), asz[1]);
  }
  if (bsz.size() == 1) {
    bsz.push_back(1);
    bst.push_back(1);
  }
  // Compute into the promoted shape [batch..., M, N], then view it as the meta shape (same data).
  IntVec psz;
  size_t nb = std::max(asz.size(), bsz.size()) - 2;
  for (size_t i = 0; i < nb; ++i) {
    int64_t x = i + asz.size() >= nb + 2 ? asz[i + asz.size() - nb - 2] : 1;
    int64_t y = i + bsz.size() >= nb + 2 ? bsz[i + bsz.size() - nb - 2] : 1;
    psz.push_back(x == 1 ? y : x);
  }
  psz.push_back(asz[asz.size() - 2]);
  psz.push_back(bsz.back());
  Tensor r = run_gemm(a, asz, ast, b, bsz, bst, TensorMeta::contiguous(to_symint_vec(psz), out[0].dtype), bias, post,
                      b.dim() == 2 ? packing : WeightPacking::None);
  return make_view(r, out[0]);
}

std::vector<Tensor> kernel_matmul(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return {matmul_impl(in, out, nullptr, weight_packing(attrs))};
}

std::vector<Tensor> kernel_bmm(std::span<const Tensor> in, const Attrs&, std::span<const TensorMeta> out) {
  return {run_gemm(in[0], in[0].int_sizes(), in[0].int_strides(), in[1], in[1].int_sizes(), in[1].int_strides(), out[0],
                   Tensor())};
}

Tensor linear_impl(std::span<const Tensor> in, std::span<const TensorMeta> out, GemmPost* post,
                   WeightPacking packing = WeightPacking::None) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  IntVec xsz = x.int_sizes(), xst = x.int_strides();
  if (xsz.size() == 1) {
    xsz.insert(xsz.begin(), 1);
    xst.insert(xst.begin(), xsz[1]);
  }
  // weightᵀ as a [in, out] matrix view.
  IntVec wsz, wst;
  if (w.dim() == 2) {
    wsz = {w.int_sizes()[1], w.int_sizes()[0]};
    wst = {w.int_strides()[1], w.int_strides()[0]};
  } else {
    wsz = {w.int_sizes()[0], 1};
    wst = {w.int_strides()[0], 1};
  }
  IntVec psz(xsz.begin(), xsz.end() - 1);
  psz.push_back(wsz[1]);
  // The bias is added against the promoted output shape; reshape it by right-alignment (same trailing dims
  // whenever the output keeps its last dim, i.e. a 2-D weight).
  Tensor bias = in[2];
  if (bias.defined() && w.dim() == 1) {
    // Output drops the last dim: view bias [..] as [.., 1].
    TensorMeta m = bias.meta();
    m.sizes.push_back(1);
    m.strides.push_back(1);
    bias = make_view(bias, m);
  }
  Tensor r = run_gemm(x, xsz, xst, w, wsz, wst, TensorMeta::contiguous(to_symint_vec(psz), out[0].dtype), bias, post,
                      w.dim() == 2 ? packing : WeightPacking::None);
  return make_view(r, out[0]);
}

std::vector<Tensor> kernel_linear(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  return {linear_impl(in, out, nullptr, weight_packing(attrs))};
}

// ---- fused forms: the base op on its usual inputs, then the post-op list (post_ops.h) ----------------
template <OpKind Base, OpKind Fused, size_t kBaseInputs>
std::vector<TensorMeta> meta_gemm_fused(std::span<const Tensor> in, const Attrs& attrs) {
  if (in.size() < kBaseInputs)
    throw ValueError(fmt::format("{}: expected the {} inputs of {} then post-op operands, got {} inputs",
                                 op_name(Fused), kBaseInputs, op_name(Base), in.size()));
  std::span<const Tensor> base = in.first(kBaseInputs);
  std::vector<TensorMeta> m = Base == OpKind::linear ? meta_linear(base, attrs) : meta_matmul(base, attrs);
  if (!is_floating(m[0].dtype))
    throw TypeError(fmt::format("{}: post-ops need a floating output, got {}", describe_call(Fused, in),
                                short_name(m[0].dtype)));
  check_post_ops(Fused, in, kBaseInputs, parse_post_ops_cached(attrs.s("post_ops")), m[0].sizes, m[0].dtype);
  return m;
}

/// The operand of a leading `add(#k)` of a fused matmul as a 1-D bias over the output's last dim (its
/// other dims all 1, f32 like the output, unit stride), or an undefined tensor. oneDNN adds a bias to
/// the accumulators; as a binary post-op the same sum took 5-20 % longer on PP-OCRv4 rec's
/// 120x120 · 120x6625 head (one thread).
Tensor leading_bias(std::span<const Tensor> in, const std::vector<PostOp>& ops, const TensorMeta& out) {
  if (ops.empty() || ops[0].kind != PostOpKind::add || out.dtype != DType::F32 || out.sizes.size() < 2) return Tensor();
  const int k = ops[0].operand[0];
  if (k < 0 || static_cast<size_t>(k) >= in.size() || !in[static_cast<size_t>(k)].defined()) return Tensor();
  const Tensor& t = in[static_cast<size_t>(k)];
  const int64_t n = out.sizes.back().hint();
  if (t.dtype() != DType::F32 || t.dim() < 1 || t.dim() > static_cast<int64_t>(out.sizes.size()) || n < 2 ||
      t.int_sizes().back() != n || t.int_strides().back() != 1 || t.int_numel() != n)
    return Tensor();
  TensorMeta m = t.meta();
  m.sizes = {SymInt(n)};
  m.strides = {SymInt(1)};
  return make_view(t, m);
}

template <OpKind Base>
std::vector<Tensor> kernel_gemm_fused(std::span<const Tensor> in, const Attrs& attrs, std::span<const TensorMeta> out) {
  const std::vector<PostOp>& all = parse_post_ops_cached(attrs.s("post_ops"));
  // matmul: a leading add of a vector along N becomes oneDNN's bias (linear has its own bias input).
  const Tensor bias = Base == OpKind::matmul ? leading_bias(in, all, out[0]) : Tensor();
  std::vector<PostOp> ops(all.begin() + (bias.defined() ? 1 : 0), all.end());
  GemmPost post{&ops, in, IntVec(), false};
  for (const SymInt& d : out[0].sizes) post.out.push_back(d.hint());
  const WeightPacking packing = weight_packing(attrs);
  GemmPost* pp = ops.empty() ? nullptr : &post;
  Tensor r = Base == OpKind::linear ? linear_impl(in, out, pp, packing) : matmul_impl(in, out, pp, packing, bias);
  if (ops.empty() || post.done) return {r};
  note_dnnl_post_op_fallback();
  return {run_post_ops(r, ops, in)};
}

}  // namespace

PROTEAN_REGISTER_OP(matmul, meta_matmul, kernel_matmul);
PROTEAN_REGISTER_OP(bmm, meta_bmm, kernel_bmm);
PROTEAN_REGISTER_OP(linear, meta_linear, kernel_linear);
PROTEAN_REGISTER_OP(linear_fused, (meta_gemm_fused<OpKind::linear, OpKind::linear_fused, 3>),
                    kernel_gemm_fused<OpKind::linear>);
PROTEAN_REGISTER_OP(matmul_fused, (meta_gemm_fused<OpKind::matmul, OpKind::matmul_fused, 2>),
                    kernel_gemm_fused<OpKind::matmul>);

}  // namespace protean::ops
