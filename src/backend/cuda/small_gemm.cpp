#include "backend/cuda/small_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "backend/cuda/nvrtc.h"
#include "cache/blob_cache.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/error.h"
#include "protean/tensor.h"

namespace protean::backend::cuda {

namespace drv = ::protean::cuda;

namespace {

constexpr int kBlockK = 64;   // K rows per pipeline stage
constexpr int kBlockN = 64;   // columns per block
constexpr int kStages = 4;
constexpr int kPitch = 72;    // shared-memory row pitch (elements) of both tiles: 64 + 8, conflict-free ldmatrix
constexpr int kThreads = 128;

const char* const kSource = R"CUDA(
// Small-row products (backend/cuda/small_gemm.h): C[M, N] = epilogue(A[M, K] . B[K, N]), 16-bit
// operands, f32 accumulation. Grid: x = N / 64 column tiles, y = K slices, z = row tiles.
typedef unsigned short u16;
typedef unsigned int u32;
#define SG_BK 64
#define SG_BN 64
#define SG_STAGES 4
#define SG_PITCH 72

__device__ __forceinline__ u32 sg_smem(const void* p) { return (u32)__cvta_generic_to_shared(p); }
template <bool F16> __device__ __forceinline__ float sg_widen(u16 v) {
  if (F16) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v)); return f; }
  return __uint_as_float(((u32)v) << 16);
}
template <bool F16> __device__ __forceinline__ u32 sg_pack(float lo, float hi) {
  u32 w;
  if (F16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
  return w;
}
__device__ __forceinline__ float sg_gelu_tanh(float x) {
  const float k0 = 0.7978845608028654f, k1 = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x)));
}

template <int MT, bool F16, bool TB>
__device__ __forceinline__ void sg_body(const u16* __restrict__ A, const u16* __restrict__ B, const u16* __restrict__ bias,
                                        const u16* R, u16* C, float* __restrict__ ws, unsigned* __restrict__ counters,
                                        int M, int N, int K, int kc, float alpha, float beta, int gelu) {
  constexpr int BM = MT * 16;
  extern __shared__ __align__(16) unsigned char sg_dyn[];
  u16* As = reinterpret_cast<u16*>(sg_dyn);             // [SG_STAGES][BM][SG_PITCH]
  u16* Bs = As + SG_STAGES * BM * SG_PITCH;              // [SG_STAGES][64][SG_PITCH]: B's [k][n] tile, or TB: [n][k]
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * SG_BN, m0 = blockIdx.z * BM;
  const int k_begin = blockIdx.y * kc;
  const int k_end = min(K, k_begin + kc);
  const int units = (k_end - k_begin) / SG_BK;

  auto load = [&](int stage, int u) {
    const int k0 = k_begin + u * SG_BK;
    u16* as = As + stage * BM * SG_PITCH;
    u16* bs = Bs + stage * SG_BK * SG_PITCH;
#pragma unroll
    for (int i = 0; i < MT; ++i) {  // A: BM rows of 64 = MT * 128 chunks of 16 bytes
      const int c16 = tid + i * 128, r = c16 >> 3, c = (c16 & 7) * 8;
      const bool in = m0 + r < M;
      const u16* src = in ? A + (size_t)(m0 + r) * K + k0 + c : A;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sg_smem(as + r * SG_PITCH + c)), "l"(src),
                   "r"(in ? 16 : 0) : "memory");
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // B: 64 rows of 64 = 512 chunks (TB: B is [N, K], rows are columns)
      const int c16 = tid + i * 128, r = c16 >> 3, c = (c16 & 7) * 8;
      const u16* src = TB ? B + (size_t)(n0 + r) * K + k0 + c : B + (size_t)(k0 + r) * N + n0 + c;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sg_smem(bs + r * SG_PITCH + c)), "l"(src) : "memory");
    }
  };

  float acc[MT][2][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < SG_STAGES - 1; ++s) {
    if (s < units) load(s, s);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int u = 0; u < units; ++u) {
    asm volatile("cp.async.wait_group %0;" ::"n"(SG_STAGES - 2) : "memory");
    __syncthreads();
    if (u + SG_STAGES - 1 < units) load((u + SG_STAGES - 1) % SG_STAGES, u + SG_STAGES - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const u16* as = As + (u % SG_STAGES) * BM * SG_PITCH;
    const u16* bs = Bs + (u % SG_STAGES) * SG_BK * SG_PITCH;
#pragma unroll
    for (int kk = 0; kk < SG_BK / 16; ++kk) {
      u32 a[MT][4], b[4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                     : "r"(sg_smem(as + (i * 16 + (lane & 15)) * SG_PITCH + kk * 16 + (lane >> 4) * 8)));
      // b[2j], b[2j+1]: the k halves of the warp's n-tile j (16 columns per warp)
      if (TB)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(sg_smem(bs + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * SG_PITCH + kk * 16 + ((lane >> 3) & 1) * 8)));
      else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(sg_smem(bs + (kk * 16 + (lane & 15)) * SG_PITCH + warp * 16 + (lane >> 4) * 8)));
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          if (F16)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                         : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[2 * j]), "r"(b[2 * j + 1]));
          else
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                         : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                         : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[2 * j]), "r"(b[2 * j + 1]));
        }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");

  const int splits = gridDim.y;
  if (splits > 1) {
    // this slice's partial tile, then the tile's last block sums all slices in slice order
    float* part = ws + (size_t)blockIdx.y * M * N;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + i * 16 + g + h * 8, col = n0 + warp * 16 + j * 8 + 2 * t;
          if (row < M) *reinterpret_cast<float2*>(part + (size_t)row * N + col) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        }
    __threadfence();
    __syncthreads();
    if (tid == 0) {
      const int tile = blockIdx.z * gridDim.x + blockIdx.x;
      const unsigned before = atomicAdd(counters + tile, 1u);
      s_last = before == (unsigned)(splits - 1);
      if (s_last) counters[tile] = 0u;  // the next launch counts from zero
    }
    __syncthreads();
    if (!s_last) return;
    __threadfence();
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + i * 16 + g + h * 8, col = n0 + warp * 16 + j * 8 + 2 * t;
          if (row >= M) continue;
          float v0 = 0.0f, v1 = 0.0f;
          for (int s = 0; s < splits; ++s) {
            const float2 p = s == (int)blockIdx.y ? make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1])
                                                  : __ldcg(reinterpret_cast<const float2*>(ws + ((size_t)s * M + row) * N + col));
            v0 += p.x;
            v1 += p.y;
          }
          acc[i][j][2 * h] = v0;
          acc[i][j][2 * h + 1] = v1;
        }
  }
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int col = n0 + warp * 16 + j * 8 + 2 * t;
      const float b0 = bias ? sg_widen<F16>(bias[col]) : 0.0f, b1 = bias ? sg_widen<F16>(bias[col + 1]) : 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + i * 16 + g + h * 8;
        if (row >= M) continue;
        float v0 = alpha * acc[i][j][2 * h] + b0, v1 = alpha * acc[i][j][2 * h + 1] + b1;
        if (gelu) v0 = sg_gelu_tanh(v0), v1 = sg_gelu_tanh(v1);
        if (R) {
          const u32 r = *reinterpret_cast<const u32*>(R + (size_t)row * N + col);
          v0 += beta * sg_widen<F16>((u16)(r & 0xffffu));
          v1 += beta * sg_widen<F16>((u16)(r >> 16));
        }
        *reinterpret_cast<u32*>(C + (size_t)row * N + col) = sg_pack<F16>(v0, v1);
      }
    }
}

)CUDA";

std::atomic<int64_t> g_max_rows_override{-1};
std::atomic<int64_t> g_launches{0};

// Per device: the module, its 8 entries, the zeroed tile counters and the partials' workspace.
struct DeviceKernels {
  bool tried = false;
  std::string failure;  ///< why the kernels are not usable ("" when they are)
  CubinModules modules;
  drv::CUfunction fn[2][2][4] = {};  ///< [transposed B][f16][row_tiles16 - 1]
  std::shared_ptr<Storage> scratch;  ///< counters (kSmallGemmCounters u32), then the workspace
  int sm_count = 0;
  bool hinted = false;
};
std::mutex g_mu;
std::map<int, DeviceKernels> g_dev;

constexpr int64_t kCounterBytes = kSmallGemmCounters * 4;

// Builds and loads `device`'s kernels once (g_mu held).
DeviceKernels& kernels_locked(int device) {
  DeviceKernels& D = g_dev[device];
  if (D.tried) return D;
  D.tried = true;
  try {
    const drv::DriverApi& api = drv::require_driver("small products");
    if (std::string_view(api.name) == "fake") throw RuntimeError("the in-process fake CUDA driver runs no kernels of its own");
    const drv::DeviceInfo& dev = drv::device_info(device);
    if (dev.cc_major < 8) throw RuntimeError(fmt::format("sm_{}{} has no bf16 mma.sync (sm_80+)", dev.cc_major, dev.cc_minor));
    D.sm_count = std::max(dev.sm_count, 1);
    NvrtcOptions o;
    o.arch = fmt::format("sm_{}{}", dev.cc_major, dev.cc_minor);
    const std::string& src = small_gemm_source();
    const CubinKey key = cubin_key(src, o);
    std::shared_ptr<const cache::Blob> cubin = cache::get_or_build_blob(
        "cubins", key.combined(), src, fmt::format("nvrtc {} {} {} (small products)", key.nvrtc_version, key.arch, key.flags),
        [&] { return nvrtc_compile_parts(src, "small_gemm.cu", o, nvrtc_default_jobs()).cubin; });
    drv::stream(device);  // the device's context current on this thread
    D.modules.load(api, *cubin, "small products");
    for (int tb = 0; tb < 2; ++tb)
      for (int f = 0; f < 2; ++f)
        for (int r = 1; r <= 4; ++r) {
          const std::string entry = fmt::format("pt_small_gemm_{}{}_r{}", f ? "f16" : "bf16", tb ? "_t" : "", r);
          drv::CUfunction fn = D.modules.function(api, entry);
          const int smem = kStages * (16 * r + kBlockK) * kPitch * 2;
          drv::check(api.cuFuncSetAttribute(fn, drv::kFuncAttrMaxDynamicSharedBytes, smem), fmt::format("cuFuncSetAttribute({})", entry));
          D.fn[tb][f][r - 1] = fn;
        }
    const size_t bytes = static_cast<size_t>(kCounterBytes + kSmallGemmWorkspaceBytes);
    D.scratch = std::make_shared<Storage>(bytes, Device{DeviceType::CUDA, device});
    const drv::CUstream s = drv::stream(device);
    drv::check(api.cuMemsetD8Async(reinterpret_cast<drv::CUdeviceptr>(D.scratch->data()), 0, static_cast<size_t>(kCounterBytes), s),
               "cuMemsetD8Async(small product counters)");
    drv::check(api.cuStreamSynchronize(s), "cuStreamSynchronize(small product counters)");
  } catch (const std::exception& e) {
    D.failure = e.what();
    observe::log_line(observe::LogCat::PerfHints, "",
                      fmt::format("small products on device {}: not available ({}); cuBLASLt runs them", device, e.what()));
  }
  return D;
}

}  // namespace

const std::string& small_gemm_source() {
  // one written-out entry per variant (nvrtc_compile_parts deals entries to its parts)
  static const std::string s = [] {
    std::string src(kSource);
    for (int tb = 0; tb < 2; ++tb)
      for (int f16 = 0; f16 < 2; ++f16)
        for (int r = 1; r <= 4; ++r)
          src += fmt::format(
              "extern \"C\" __global__ void __launch_bounds__(128) pt_small_gemm_{}{}_r{}(const u16* __restrict__ A, "
              "const u16* __restrict__ B, const u16* __restrict__ bias, const u16* R, u16* C, float* __restrict__ ws, "
              "unsigned* __restrict__ counters, int M, int N, int K, int kc, float alpha, float beta, int gelu) {{\n"
              "  sg_body<{}, {}, {}>(A, B, bias, R, C, ws, counters, M, N, K, kc, alpha, beta, gelu);\n}}\n",
              f16 ? "f16" : "bf16", tb ? "_t" : "", r, r, f16 ? "true" : "false", tb ? "true" : "false");
    return src;
  }();
  return s;
}

int64_t small_gemm_max_rows() {
  if (const int64_t o = g_max_rows_override.load(std::memory_order_relaxed); o >= 0) return o;
  static const int64_t from_env = [] {
    const char* on = std::getenv("PROTEAN_CUDA_SMALL_GEMM");
    if (on && std::string_view(on) == "0") return int64_t{0};
    const char* rows = std::getenv("PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS");
    if (rows && *rows) {
      char* end = nullptr;
      const long long v = std::strtoll(rows, &end, 10);
      if (end && *end == '\0' && v >= 0) return static_cast<int64_t>(v);
      observe::warn(fmt::format("PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS='{}' is not a row count; using 64", rows));
    }
    return int64_t{0};  // off until measured on a GPU
  }();
  return from_env;
}

void set_small_gemm_max_rows_for_testing(int64_t rows) { g_max_rows_override.store(rows, std::memory_order_relaxed); }

std::optional<SmallGemmPlan> small_gemm_plan(const BlasStep& st, const BlasShape& sh, int sm_count, std::string& why) {
  if (st.dtype != DType::BF16 && st.dtype != DType::F16) {
    why = fmt::format("{} operands (bf16 and f16 only)", short_name(st.dtype));
    return std::nullopt;
  }
  if (st.epilogue.gelu == GeluForm::Erf || (st.epilogue.gelu != GeluForm::None && st.epilogue.residual >= 0)) {
    why = "an epilogue cuBLASLt cannot apply either";
    return std::nullopt;
  }
  int64_t rows = sh.m;
  if (sh.batch != 1) {
    if (sh.stride_b != 0 || sh.stride_a != sh.m * sh.k) {
      why = "a batch of distinct right-hand sides";
      return std::nullopt;
    }
    rows = sh.batch * sh.m;
  }
  if (sh.n % kBlockN != 0 || sh.k % kBlockK != 0 || sh.k == 0) {
    why = fmt::format("N = {} or K = {} not a multiple of 64", sh.n, sh.k);
    return std::nullopt;
  }
  const int64_t max_rows = small_gemm_max_rows();
  if (rows < 1 || rows > max_rows) {
    why = fmt::format("{} rows (the small path takes 1 to {})", rows, max_rows);
    return std::nullopt;
  }
  if (rows > (int64_t{1} << 30) || sh.n > (int64_t{1} << 30) || sh.k > (int64_t{1} << 30) || rows * sh.n > (int64_t{1} << 40)) {
    why = "sizes beyond 32-bit indices";
    return std::nullopt;
  }
  SmallGemmPlan p;
  p.rows = rows;
  p.row_tiles16 = static_cast<int>(std::min<int64_t>((rows + 15) / 16, 4));
  const int64_t bm = 16 * p.row_tiles16;
  p.row_blocks = (rows + bm - 1) / bm;
  p.col_tiles = sh.n / kBlockN;
  if (p.col_tiles * p.row_blocks > kSmallGemmCounters) {
    why = "more tiles than the counters hold";
    return std::nullopt;
  }
  const int64_t units = sh.k / kBlockK, base = p.col_tiles * p.row_blocks;
  const int64_t target = 2 * static_cast<int64_t>(std::max(sm_count, 1));
  int64_t per_split = std::clamp<int64_t>((units * base + target - 1) / target, 1, units);
  p.splits = (units + per_split - 1) / per_split;
  // the workspace bound at no fewer than 64 rows: the slices then never depend on the row count
  // within one block of rows
  const int64_t budget_rows = std::max<int64_t>(rows, 64);
  while (p.splits > 1 && p.splits * budget_rows * sh.n * 4 > kSmallGemmWorkspaceBytes) {
    ++per_split;
    p.splits = (units + per_split - 1) / per_split;
  }
  p.kc = per_split * kBlockK;
  p.workspace_bytes = p.splits > 1 ? p.splits * rows * sh.n * 4 : 0;
  p.shared_bytes = static_cast<uint32_t>(kStages * (bm + kBlockK) * kPitch * 2);
  return p;
}

void prepare_small_gemm(int device) {
  if (small_gemm_max_rows() <= 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  kernels_locked(device);
}

bool small_gemm_applies(const BlasStep& st, const BlasShape& sh, int device) {
  if (small_gemm_max_rows() <= 0) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceKernels& D = kernels_locked(device);
  std::string why;
  return D.failure.empty() && small_gemm_plan(st, sh, D.sm_count, why).has_value();
}

int64_t small_gemm_launches() { return g_launches.load(std::memory_order_relaxed); }

bool run_small_gemm(const BlasStep& st, const BlasShape& sh, const std::function<uint64_t(int)>& address, int device,
                    drv::CUstream stream) {
  if (small_gemm_max_rows() <= 0) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceKernels& D = kernels_locked(device);
  if (!D.failure.empty()) return false;
  std::string why;
  const std::optional<SmallGemmPlan> p = small_gemm_plan(st, sh, D.sm_count, why);
  if (!p) return false;
  const BlasEpilogue& ep = st.epilogue;
  uint64_t a = address(st.a), b = address(st.b), out = address(st.out);
  uint64_t bias = ep.bias >= 0 ? address(ep.bias) : 0, res = ep.residual >= 0 ? address(ep.residual) : 0;
  for (uint64_t x : {a, b, out, res})
    if (x % 16) return false;  // a view at an odd offset: cuBLASLt takes it
  if (bias % 4) return false;
  const drv::DriverApi& api = drv::require_driver("small products");
  uint64_t counters = reinterpret_cast<uint64_t>(D.scratch->data());
  uint64_t ws = counters + static_cast<uint64_t>(kCounterBytes);
  int m = static_cast<int>(p->rows), n = static_cast<int>(sh.n), k = static_cast<int>(sh.k), kc = static_cast<int>(p->kc);
  float alpha = static_cast<float>(ep.alpha), beta = ep.residual >= 0 ? static_cast<float>(ep.beta) : 0.0f;
  int gelu = ep.gelu == GeluForm::Tanh ? 1 : 0;
  void* args[] = {&a, &b, &bias, &res, &out, &ws, &counters, &m, &n, &k, &kc, &alpha, &beta, &gelu};
  const int f16 = st.dtype == DType::F16 ? 1 : 0;
  drv::check(api.cuLaunchKernel(D.fn[st.transpose_b ? 1 : 0][f16][p->row_tiles16 - 1], static_cast<unsigned>(p->col_tiles), static_cast<unsigned>(p->splits),
                                static_cast<unsigned>(p->row_blocks), kThreads, 1, 1, p->shared_bytes, stream, args, nullptr),
             fmt::format("cuLaunchKernel(small product {}x{}x{})", m, k, n));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace protean::backend::cuda
