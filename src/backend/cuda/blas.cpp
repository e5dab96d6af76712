#include "backend/cuda/blas.h"

#include <fmt/format.h>

#include <map>
#include <mutex>
#include <tuple>

#include "device/dynamic_library.h"
#include "device/runtime.h"
#include "protean/error.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

using Status = int;
using Handle = void*;
using Desc = void*;
using Layout = void*;
using Pref = void*;
struct Algo {
  uint64_t data[8];
};
struct Heuristic {
  Algo algo;
  size_t workspace;
  Status state;
  float waves;
  int reserved[4];
};
static_assert(sizeof(Heuristic) == 96, "cublasLtMatmulHeuristicResult_t layout");

// Values from cublasLt.h / cublas_api.h / library_types.h (CUDA 12 and 13).
constexpr int kComputeF32 = 68;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescBiasDataType = 26;
constexpr uint32_t kEpiDefault = 1, kEpiBias = 4, kEpiGelu = 32;
constexpr int kLayoutBatchCount = 5, kLayoutBatchStride = 6;
constexpr int kPrefMaxWorkspace = 1;
constexpr int kOpN = 0, kOpT = 1;
constexpr size_t kWorkspaceBytes = kBlasWorkspaceBytes;

struct Lt {
  bool ok = false;
  std::string why;
  Status (*create)(Handle*) = nullptr;
  Status (*desc_create)(Desc*, int, int) = nullptr;
  Status (*desc_set)(Desc, int, const void*, size_t) = nullptr;
  Status (*layout_create)(Layout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  Status (*layout_set)(Layout, int, const void*, size_t) = nullptr;
  Status (*pref_create)(Pref*) = nullptr;
  Status (*pref_set)(Pref, int, const void*, size_t) = nullptr;
  Status (*heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Pref, int, Heuristic*, int*) = nullptr;
  Status (*matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*, const void*, Layout,
                   void*, Layout, const Algo*, void*, size_t, drv::CUstream) = nullptr;
  const char* (*status_name)(Status) = nullptr;
};

const Lt& lt() {
  static const Lt l = [] {
    Lt l;
    std::string error, missing;
    void* lib = drv::open_first_library({"libcublasLt.so.13", "libcublasLt.so.12"}, error);
    if (!lib) {
      l.why = fmt::format("cuBLASLt not found (dlopen libcublasLt.so.13: {})", error);
      return l;
    }
    l.ok = drv::resolve_symbol(lib, l.create, {"cublasLtCreate"}, missing) &&
           drv::resolve_symbol(lib, l.desc_create, {"cublasLtMatmulDescCreate"}, missing) &&
           drv::resolve_symbol(lib, l.desc_set, {"cublasLtMatmulDescSetAttribute"}, missing) &&
           drv::resolve_symbol(lib, l.layout_create, {"cublasLtMatrixLayoutCreate"}, missing) &&
           drv::resolve_symbol(lib, l.layout_set, {"cublasLtMatrixLayoutSetAttribute"}, missing) &&
           drv::resolve_symbol(lib, l.pref_create, {"cublasLtMatmulPreferenceCreate"}, missing) &&
           drv::resolve_symbol(lib, l.pref_set, {"cublasLtMatmulPreferenceSetAttribute"}, missing) &&
           drv::resolve_symbol(lib, l.heuristic, {"cublasLtMatmulAlgoGetHeuristic"}, missing) &&
           drv::resolve_symbol(lib, l.matmul, {"cublasLtMatmul"}, missing);
    if (!l.ok) l.why = fmt::format("libcublasLt lacks {}", missing);
    std::string optional;  // cublasLtGetStatusName is newer than the rest: its absence is not an error
    drv::resolve_symbol(lib, l.status_name, {"cublasLtGetStatusName"}, optional);
    return l;
  }();
  return l;
}

void lt_check(Status s, const char* call) {
  if (s == 0) return;
  const char* name = lt().status_name ? lt().status_name(s) : nullptr;
  throw RuntimeError(fmt::format("{} failed: {}", call, name ? name : fmt::format("cublasStatus_t {}", s)));
}

int lt_type(DType t) {
  switch (t) {
    case DType::BF16: return kR16BF;
    case DType::F16: return kR16F;
    case DType::F32: return kR32F;
    case DType::Bool: case DType::U8: case DType::I8: case DType::I32: case DType::I64: case DType::F64: break;
  }
  throw NotImplementedError(fmt::format("cuBLASLt matmul: dtype {} is not supported (bf16, f16, f32)", short_name(t)));
}

struct Plan {
  Desc desc = nullptr;
  Layout la = nullptr, lb = nullptr, lc = nullptr;
  Algo algo{};
  size_t workspace = 0;
  std::vector<Algo> algos;  ///< the heuristic's list (first = algo), for max-autotune
};

struct DeviceLt {
  Handle handle = nullptr;
  std::shared_ptr<Storage> workspace;
  std::map<std::tuple<const BlasStep*, int64_t, int64_t, int64_t, int64_t>, Plan> plans;
};

std::mutex g_mu;
std::map<int, DeviceLt> g_dev;
BlasHook g_hook;  // tests: stands in for cuBLASLt
int g_hook_algorithms = 1;
thread_local int t_hook_algorithm = -1;

// The device's handle and workspace (g_mu held).
DeviceLt& device_lt(int device) {
  DeviceLt& D = g_dev[device];
  if (!D.handle) {
    lt_check(lt().create(&D.handle), "cublasLtCreate");
    D.workspace = std::make_shared<Storage>(kWorkspaceBytes, Device{DeviceType::CUDA, device});
  }
  return D;
}

}  // namespace

void set_blas_hook_for_testing(BlasHook hook, int algorithms) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hook = std::move(hook);
  g_hook_algorithms = std::max(algorithms, 1);
}

void prepare_blas_device(int device) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_hook) return;
  const Lt& L = lt();
  if (!L.ok) throw RuntimeError(fmt::format("cuda matmul: {}", L.why));
  if (const drv::DriverApi* d = drv::driver(); d && std::string_view(d->name) == "fake")
    throw RuntimeError("cublasLt matmul cannot run on the in-process fake CUDA driver (its device memory is host memory)");
  device_lt(device);
}

int blas_hook_algorithm() { return t_hook_algorithm; }

bool cublaslt_available(std::string* why) {
  if (why) *why = lt().why;
  return lt().ok;
}

BlasShape blas_shape(const BlasStep& st, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S) {
  BlasShape r;
  r.batch = st.batch ? eval_size(st.batch, symbols, S) : 1;
  r.m = eval_size(st.m, symbols, S);
  r.n = eval_size(st.n, symbols, S);
  r.k = eval_size(st.k, symbols, S);
  r.stride_a = st.batch_stride_a ? eval_size(st.batch_stride_a, symbols, S) : r.m * r.k;
  r.stride_b = st.batch_stride_b ? eval_size(st.batch_stride_b, symbols, S) : r.k * r.n;
  return r;
}

void run_blas(const BlasStep& st, const std::vector<sym::Expr>& symbols, std::span<const int64_t> S,
              const std::function<uint64_t(int)>& address, int device) {
  run_blas_at(st, blas_shape(st, symbols, S), address, device, drv::stream(device));
}

namespace {

// The descriptors and the heuristic's algorithms of `st` at `shape` (g_mu held), made on first use.
const Plan& plan_of(const BlasStep& st, const BlasShape& shape, int device) {
  const Lt& L = lt();
  const int64_t batch = shape.batch, m = shape.m, n = shape.n, k = shape.k;
  const int64_t sa = shape.stride_a, sb = shape.stride_b;
  const BlasEpilogue& ep = st.epilogue;
  DeviceLt& D = device_lt(device);
  auto key = std::make_tuple(&st, batch, m, n, k);
  auto it = D.plans.find(key);
  if (it == D.plans.end()) {
    Plan p;
    const int type = lt_type(st.dtype);
    lt_check(L.desc_create(&p.desc, kComputeF32, kR32F), "cublasLtMatmulDescCreate");
    // Column-major view: D'[n, m] = A'[n, k] · B'[k, m] with A' = b (or bᵀ for Linear) and B' = a.
    const int32_t ta = st.transpose_b ? kOpT : kOpN, tb = kOpN;
    lt_check(L.desc_set(p.desc, kDescTransA, &ta, sizeof(ta)), "cublasLtMatmulDescSetAttribute(TRANSA)");
    lt_check(L.desc_set(p.desc, kDescTransB, &tb, sizeof(tb)), "cublasLtMatmulDescSetAttribute(TRANSB)");
    uint32_t epi = kEpiDefault;
    if (ep.bias >= 0) epi = kEpiBias;
    if (ep.gelu == GeluForm::Tanh) epi = ep.bias >= 0 ? (kEpiGelu | kEpiBias) : kEpiGelu;
    lt_check(L.desc_set(p.desc, kDescEpilogue, &epi, sizeof(epi)), "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (ep.bias >= 0) {
      const int32_t bt = type;
      lt_check(L.desc_set(p.desc, kDescBiasDataType, &bt, sizeof(bt)), "cublasLtMatmulDescSetAttribute(BIAS_DATA_TYPE)");
    }
    // A' : b is row-major [k, n] = column-major [n, k] (ld n); Linear's weight is row-major [n, k] =
    // column-major [k, n] (ld k), transposed by TRANSA.
    if (st.transpose_b) lt_check(L.layout_create(&p.la, type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k), "cublasLtMatrixLayoutCreate(b)");
    else lt_check(L.layout_create(&p.la, type, static_cast<uint64_t>(n), static_cast<uint64_t>(k), n), "cublasLtMatrixLayoutCreate(b)");
    lt_check(L.layout_create(&p.lb, type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k), "cublasLtMatrixLayoutCreate(a)");
    lt_check(L.layout_create(&p.lc, type, static_cast<uint64_t>(n), static_cast<uint64_t>(m), n), "cublasLtMatrixLayoutCreate(out)");
    if (batch > 1) {
      const int32_t bc = static_cast<int32_t>(batch);
      const int64_t so = m * n;
      for (auto [l, stride] : {std::pair{p.la, sb}, std::pair{p.lb, sa}, std::pair{p.lc, so}}) {
        lt_check(L.layout_set(l, kLayoutBatchCount, &bc, sizeof(bc)), "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        lt_check(L.layout_set(l, kLayoutBatchStride, &stride, sizeof(stride)),
                 "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
      }
    }
    Pref pref = nullptr;
    lt_check(L.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = kWorkspaceBytes;
    lt_check(L.pref_set(pref, kPrefMaxWorkspace, &ws, sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE)");
    Heuristic h[kBlasTuneAlgorithms]{};
    int found = 0;
    lt_check(L.heuristic(D.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, kBlasTuneAlgorithms, h, &found),
             "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1)
      throw RuntimeError(fmt::format("cuBLASLt has no algorithm for {} [{}x{}]x[{}x{}] batch {} ({})", short_name(st.dtype),
                                     m, k, k, n, batch, ops::op_name(st.kind)));
    p.algo = h[0].algo;
    p.workspace = h[0].workspace;
    for (int i = 0; i < found && i < kBlasTuneAlgorithms; ++i)
      if (h[i].state == 0) p.algos.push_back(h[i].algo);
    if (p.algos.empty()) p.algos.push_back(p.algo);
    it = D.plans.emplace(key, p).first;
  }
  return it->second;
}

// Refusals that come before any cuBLASLt call (no hook). False: nothing to do (an empty shape).
bool check_blas_call(const BlasStep& st, const BlasShape& shape) {
  const Lt& L = lt();
  if (!L.ok) throw RuntimeError(fmt::format("cuda matmul: {}", L.why));
  const BlasEpilogue& ep = st.epilogue;
  if (ep.gelu == GeluForm::Erf)
    throw NotImplementedError("cuBLASLt matmul: its GELU epilogue is the tanh form; an erf-form GELU cannot be fused");
  if (ep.gelu != GeluForm::None && ep.residual >= 0)
    throw NotImplementedError("cuBLASLt matmul: a GELU epilogue and a residual add cannot be fused into one call");
  if (shape.batch == 0 || shape.m == 0 || shape.n == 0) return false;
  // The in-process fake driver (tests) hands out host memory as device memory: a real cuBLASLt would
  // dereference it on a real GPU. Refuse by name instead.
  if (const drv::DriverApi* d = drv::driver(); d && std::string_view(d->name) == "fake")
    throw RuntimeError("cublasLt matmul cannot run on the in-process fake CUDA driver (its device memory is host memory)");
  return true;
}

}  // namespace

int blas_algorithm_count(const BlasStep& st, const BlasShape& shape, int device) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_hook) return g_hook_algorithms;
  }
  if (!check_blas_call(st, shape)) return 1;
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int>(plan_of(st, shape, device).algos.size());
}

void run_blas_at(const BlasStep& st, const BlasShape& shape, const std::function<uint64_t(int)>& address, int device,
                 drv::CUstream stream, int algorithm, uint64_t workspace) {
  {
    std::unique_lock<std::mutex> lock(g_mu);
    if (g_hook) {
      BlasHook hook = g_hook;
      lock.unlock();
      t_hook_algorithm = algorithm;
      hook(st, shape, address, stream);
      t_hook_algorithm = -1;
      return;
    }
  }
  if (!check_blas_call(st, shape)) return;
  const Lt& L = lt();
  const BlasEpilogue& ep = st.epilogue;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceLt& D = device_lt(device);
  const Plan& p = plan_of(st, shape, device);
  const Algo& algo = algorithm >= 0 && static_cast<size_t>(algorithm) < p.algos.size() ? p.algos[static_cast<size_t>(algorithm)] : p.algo;
  if (ep.bias >= 0) {
    const uint64_t bias = address(ep.bias);
    lt_check(L.desc_set(p.desc, kDescBiasPointer, &bias, sizeof(bias)), "cublasLtMatmulDescSetAttribute(BIAS_POINTER)");
  }
  const float alpha = static_cast<float>(ep.alpha);
  const float beta = ep.residual >= 0 ? static_cast<float>(ep.beta) : 0.0f;
  const void* A = reinterpret_cast<const void*>(address(st.b));
  const void* B = reinterpret_cast<const void*>(address(st.a));
  void* out = reinterpret_cast<void*>(address(st.out));
  const void* C = ep.residual >= 0 ? reinterpret_cast<const void*>(address(ep.residual)) : out;
  lt_check(L.matmul(D.handle, p.desc, &alpha, A, p.la, B, p.lb, &beta, C, p.lc, out, p.lc, &algo,
                    workspace ? reinterpret_cast<void*>(workspace) : D.workspace->data(), kWorkspaceBytes, stream),
           "cublasLtMatmul");
}

}  // namespace protean::backend::cuda
