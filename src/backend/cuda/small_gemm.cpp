#include "backend/cuda/small_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
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

constexpr int kBlockK = 32;   // K rows per pipeline stage
constexpr int kBlockN = 64;   // columns per block
constexpr int kStages = 8;
constexpr int kThreads = 128;
constexpr int kMaxRowTiles = 8;  // 16-row mma tiles of the widest variant (128 rows)
constexpr int64_t kMaxRows = 16 * kMaxRowTiles;
constexpr int kMaxCluster = 8;  // blocks splitting one tile's K (the portable cluster size)
constexpr int kAttrClusterDimension = 4;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION

// Dynamic shared memory of a variant: the stage ring (A [BM][40] and B [32][72] or [64][40] per stage).
uint32_t shared_bytes_of(int row_tiles16, bool transposed) {
  const int a = 16 * row_tiles16 * 40, b = transposed ? 64 * 40 : kBlockK * 72;
  return static_cast<uint32_t>(kStages * (a + b) * 2);
}

const char* const kSource = R"CUDA(
// Small-row products (backend/cuda/small_gemm.h): C[M, N] = epilogue(A[M, K] . B[K, N]) for M <= 128,
// 16-bit operands, f32 accumulation. Grid x: N / 64 column tiles x C blocks, one thread-block
// cluster of C blocks per tile splitting K; the partial tiles are summed through distributed shared
// memory in block-rank order.
typedef unsigned short u16;
typedef unsigned int u32;
#define SG_BK 32
#define SG_STAGES 8
#define SG_APITCH 40  // A stage [BM][32] (+8): conflict-free ldmatrix
#define SG_BPITCH 72  // B stage [32][64] (+8)
#define SG_TPITCH 40  // transposed B stage [64][32] (+8)
#define SG_CPITCH 68  // f32 partial tile [BM][64] (+4)

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
__device__ __forceinline__ void sg_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

template <int MT, bool F16, bool TB>
__device__ __forceinline__ void sg_body(const u16* __restrict__ A, const u16* __restrict__ B, const u16* __restrict__ bias,
                                        const u16* R, u16* C, int M, int N, int K, float alpha, float beta, int gelu) {
  constexpr int BM = MT * 16;
  constexpr int A_STAGE = BM * SG_APITCH, B_STAGE = TB ? 64 * SG_TPITCH : SG_BK * SG_BPITCH;
  extern __shared__ __align__(16) unsigned char sg_dyn[];
  u16* As = reinterpret_cast<u16*>(sg_dyn);  // [SG_STAGES][A_STAGE]
  u16* Bs = As + SG_STAGES * A_STAGE;        // [SG_STAGES][B_STAGE]
  float* part = reinterpret_cast<float*>(sg_dyn);  // after the K loop: the block's f32 tile [BM][SG_CPITCH]
  u32 rank, ranks;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = (blockIdx.x / ranks) * 64;
  const int units = K / SG_BK;
  const int u_begin = (int)(rank * units / ranks), u_end = (int)((rank + 1) * units / ranks);
  const int count = u_end - u_begin;

  auto load = [&](int stage, int u) {
    const int k0 = (u_begin + u) * SG_BK;
    u16* as = As + stage * A_STAGE;
    u16* bs = Bs + stage * B_STAGE;
#pragma unroll
    for (int i = 0; i < (BM * 4 + 127) / 128; ++i) {  // A: BM rows of 32 = BM * 4 chunks of 16 bytes
      const int c16 = tid + i * 128, r = c16 >> 2, c = (c16 & 3) * 8;
      if (c16 >= BM * 4) break;
      const bool in = r < M;
      const u16* src = in ? A + (size_t)r * K + k0 + c : A;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sg_smem(as + r * SG_APITCH + c)), "l"(src),
                   "r"(in ? 16 : 0) : "memory");
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // B: 256 chunks ([32][64], or TB: [64][32] of B's [N, K] rows)
      const int c16 = tid + i * 128;
      if (TB) {
        const int r = c16 >> 2, c = (c16 & 3) * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sg_smem(bs + r * SG_TPITCH + c)),
                     "l"(B + (size_t)(n0 + r) * K + k0 + c) : "memory");
      } else {
        const int r = c16 >> 3, c = (c16 & 7) * 8;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sg_smem(bs + r * SG_BPITCH + c)),
                     "l"(B + (size_t)(k0 + r) * N + n0 + c) : "memory");
      }
    }
  };

  float acc[MT][2][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
#pragma unroll
  for (int s = 0; s < SG_STAGES - 1; ++s) {  // up to 7 stages (224 rows of K) in flight at once
    if (s < count) load(s, s);
    asm volatile("cp.async.commit_group;" ::: "memory");
  }
  for (int u = 0; u < count; ++u) {
    asm volatile("cp.async.wait_group %0;" ::"n"(SG_STAGES - 2) : "memory");
    __syncthreads();
    if (u + SG_STAGES - 1 < count) load((u + SG_STAGES - 1) % SG_STAGES, u + SG_STAGES - 1);
    asm volatile("cp.async.commit_group;" ::: "memory");
    const u16* as = As + (u % SG_STAGES) * A_STAGE;
    const u16* bs = Bs + (u % SG_STAGES) * B_STAGE;
#pragma unroll
    for (int kk = 0; kk < SG_BK / 16; ++kk) {
      u32 a[MT][4], b[4];
#pragma unroll
      for (int i = 0; i < MT; ++i)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                     : "r"(sg_smem(as + (i * 16 + (lane & 15)) * SG_APITCH + kk * 16 + (lane >> 4) * 8)));
      // b[2j], b[2j+1]: the k halves of the warp's n-tile j (16 columns per warp)
      if (TB)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(sg_smem(bs + (warp * 16 + (lane & 7) + ((lane >> 4) << 3)) * SG_TPITCH + kk * 16 + ((lane >> 3) & 1) * 8)));
      else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(sg_smem(bs + (kk * 16 + (lane & 15)) * SG_BPITCH + warp * 16 + (lane >> 4) * 8)));
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
  __syncthreads();  // every warp is done with the stages: the partial tile reuses their memory
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(part + (i * 16 + g + h * 8) * SG_CPITCH + warp * 16 + j * 8 + 2 * t) =
            make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
  sg_cluster_sync();  // every block's partial tile is written and visible to the cluster
  // Block `rank` finishes rows rank, rank + ranks, ...: column pairs summed over the blocks in rank order.
  const u32 base = sg_smem(part);
  const int rows_here = (BM - (int)rank + (int)ranks - 1) / (int)ranks;
  for (int w = tid; w < rows_here * 32; w += 128) {
    const int row = (int)rank + (w >> 5) * (int)ranks, col = 2 * (w & 31);
    if (row >= M) continue;
    const u32 off = base + (u32)((row * SG_CPITCH + col) * 4);
    float v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (u32 s = 0; s < 8; ++s) {
      if (s >= ranks) break;
      u32 remote;
      float x0, x1;
      asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(off), "r"(s));
      asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(x0), "=f"(x1) : "r"(remote) : "memory");
      v0 += x0;
      v1 += x1;
    }
    const int gc = n0 + col;
    v0 = alpha * v0;
    v1 = alpha * v1;
    if (bias) v0 += sg_widen<F16>(bias[gc]), v1 += sg_widen<F16>(bias[gc + 1]);
    if (gelu) v0 = sg_gelu_tanh(v0), v1 = sg_gelu_tanh(v1);
    if (R) {
      const u32 r = *reinterpret_cast<const u32*>(R + (size_t)row * N + gc);
      v0 += beta * sg_widen<F16>((u16)(r & 0xffffu));
      v1 += beta * sg_widen<F16>((u16)(r >> 16));
    }
    *reinterpret_cast<u32*>(C + (size_t)row * N + gc) = sg_pack<F16>(v0, v1);
  }
  sg_cluster_sync();  // no block leaves while another still reads its tile
}
)CUDA";

std::atomic<int64_t> g_max_rows_override{-1};
std::atomic<int64_t> g_launches{0};

// Per device: the module and its 32 entries.
struct DeviceKernels {
  bool tried = false;
  std::string failure;  ///< why the kernels are not usable ("" when they are)
  CubinModules modules;
  drv::CUfunction fn[2][2][kMaxRowTiles] = {};  ///< [transposed B][f16][row_tiles16 - 1]
  int sm_count = 0;
};
std::mutex g_mu;
std::map<int, DeviceKernels> g_dev;

// Builds and loads `device`'s kernels once (g_mu held).
DeviceKernels& kernels_locked(int device) {
  DeviceKernels& D = g_dev[device];
  if (D.tried) return D;
  D.tried = true;
  try {
    const drv::DriverApi& api = drv::require_driver("small products");
    if (std::string_view(api.name) == "fake") throw RuntimeError("the in-process fake CUDA driver runs no kernels of its own");
    if (!api.cuLaunchKernelEx) throw RuntimeError("the driver has no cuLaunchKernelEx (thread-block clusters)");
    const drv::DeviceInfo& dev = drv::device_info(device);
    if (dev.cc_major < 9) throw RuntimeError(fmt::format("sm_{}{} has no thread-block clusters (sm_90+)", dev.cc_major, dev.cc_minor));
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
        for (int r = 1; r <= kMaxRowTiles; ++r) {
          const std::string entry = fmt::format("pt_small_gemm_{}{}_r{}", f ? "f16" : "bf16", tb ? "_t" : "", r);
          drv::CUfunction fn = D.modules.function(api, entry);
          drv::check(api.cuFuncSetAttribute(fn, drv::kFuncAttrMaxDynamicSharedBytes, static_cast<int>(shared_bytes_of(r, tb != 0))),
                     fmt::format("cuFuncSetAttribute({})", entry));
          D.fn[tb][f][r - 1] = fn;
        }
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
        for (int r = 1; r <= kMaxRowTiles; ++r)
          src += fmt::format(
              "extern \"C\" __global__ void __launch_bounds__(128) pt_small_gemm_{}{}_r{}(const u16* __restrict__ A, "
              "const u16* __restrict__ B, const u16* __restrict__ bias, const u16* R, u16* C, int M, int N, int K, "
              "float alpha, float beta, int gelu) {{\n"
              "  sg_body<{}, {}, {}>(A, B, bias, R, C, M, N, K, alpha, beta, gelu);\n}}\n",
              f16 ? "f16" : "bf16", tb ? "_t" : "", r, r, f16 ? "true" : "false", tb ? "true" : "false");
    return src;
  }();
  return s;
}

int64_t small_gemm_max_rows() {
  if (const int64_t o = g_max_rows_override.load(std::memory_order_relaxed); o >= 0) return std::min<int64_t>(o, kMaxRows);
  static const int64_t from_env = [] {
    const char* on = std::getenv("PROTEAN_CUDA_SMALL_GEMM");
    if (on && std::string_view(on) == "0") return int64_t{0};
    const char* rows = std::getenv("PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS");
    if (rows && *rows) {
      char* end = nullptr;
      const long long v = std::strtoll(rows, &end, 10);
      if (end && *end == '\0' && v >= 0) return std::min<int64_t>(static_cast<int64_t>(v), kMaxRows);
      observe::warn(fmt::format("PROTEAN_CUDA_SMALL_GEMM_MAX_ROWS='{}' is not a row count from 0 to {}; ignored", rows, kMaxRows));
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
    why = fmt::format("N = {} not a multiple of 64 or K = {} not a multiple of 32", sh.n, sh.k);
    return std::nullopt;
  }
  const int64_t max_rows = small_gemm_max_rows();
  if (rows < 1 || rows > max_rows) {
    why = fmt::format("{} rows (the small path takes 1 to {})", rows, max_rows);
    return std::nullopt;
  }
  if (sh.n > (int64_t{1} << 30) || sh.k > (int64_t{1} << 30)) {
    why = "sizes beyond 32-bit indices";
    return std::nullopt;
  }
  SmallGemmPlan p;
  p.rows = rows;
  p.row_tiles16 = static_cast<int>((rows + 15) / 16);
  p.col_tiles = sh.n / kBlockN;
  // one block per multiprocessor or more: the tile's K split over a cluster of up to 8 blocks (never
  // more blocks than 32-row stages of K). Depends on N, K and the device only: a row's sum order is
  // the same at every row count.
  const int64_t units = sh.k / kBlockK;
  const int64_t want = (std::max(sm_count, 1) + p.col_tiles - 1) / p.col_tiles;
  p.splits = std::clamp<int64_t>(want, 1, std::min<int64_t>(kMaxCluster, units));
  if (p.col_tiles * p.splits > (int64_t{1} << 31) - 1) {
    why = "more blocks than a grid holds";
    return std::nullopt;
  }
  p.kc = (units + p.splits - 1) / p.splits * kBlockK;
  p.shared_bytes = shared_bytes_of(p.row_tiles16, st.transpose_b);
  return p;
}

void prepare_small_gemm(int device) {
  if (small_gemm_max_rows() <= 0) return;
  std::lock_guard<std::mutex> lock(g_mu);
  kernels_locked(device);
}

namespace {

// The plan when the path is on, `device`'s kernels loaded and the product taken (g_mu held).
std::optional<SmallGemmPlan> usable_plan_locked(const BlasStep& st, const BlasShape& sh, int device) {
  const DeviceKernels& D = kernels_locked(device);
  if (!D.failure.empty()) return std::nullopt;
  std::string why;
  return small_gemm_plan(st, sh, D.sm_count, why);
}

}  // namespace

bool small_gemm_applies(const BlasStep& st, const BlasShape& sh, int device) {
  if (small_gemm_max_rows() <= 0) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  return usable_plan_locked(st, sh, device).has_value();
}

int64_t small_gemm_launches() { return g_launches.load(std::memory_order_relaxed); }

bool run_small_gemm(const BlasStep& st, const BlasShape& sh, const std::function<uint64_t(int)>& address, int device,
                    drv::CUstream stream) {
  if (small_gemm_max_rows() <= 0) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  const std::optional<SmallGemmPlan> p = usable_plan_locked(st, sh, device);
  if (!p) return false;
  const DeviceKernels& D = g_dev[device];
  const BlasEpilogue& ep = st.epilogue;
  uint64_t a = address(st.a), b = address(st.b), out = address(st.out);
  uint64_t bias = ep.bias >= 0 ? address(ep.bias) : 0, res = ep.residual >= 0 ? address(ep.residual) : 0;
  for (uint64_t x : {a, b, out, res})
    if (x % 16) return false;  // a view at an odd offset: cuBLASLt takes it
  if (bias % 4) return false;
  const drv::DriverApi& api = drv::require_driver("small products");
  int m = static_cast<int>(p->rows), n = static_cast<int>(sh.n), k = static_cast<int>(sh.k);
  float alpha = static_cast<float>(ep.alpha), beta = ep.residual >= 0 ? static_cast<float>(ep.beta) : 0.0f;
  int gelu = ep.gelu == GeluForm::Tanh ? 1 : 0;
  void* args[] = {&a, &b, &bias, &res, &out, &m, &n, &k, &alpha, &beta, &gelu};
  drv::LaunchAttribute cluster;
  cluster.id = kAttrClusterDimension;
  const unsigned dims[3] = {static_cast<unsigned>(p->splits), 1, 1};
  std::memcpy(cluster.value.bytes, dims, sizeof(dims));
  drv::LaunchConfig c;
  c.grid_x = static_cast<unsigned>(p->col_tiles * p->splits);
  c.block_x = kThreads;
  c.shared_bytes = p->shared_bytes;
  c.stream = stream;
  c.attrs = &cluster;
  c.num_attrs = 1;
  drv::check(api.cuLaunchKernelEx(&c, D.fn[st.transpose_b ? 1 : 0][st.dtype == DType::F16 ? 1 : 0][p->row_tiles16 - 1], args, nullptr),
             fmt::format("cuLaunchKernelEx(small product {}x{}x{}, cluster {})", m, k, n, p->splits));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace protean::backend::cuda
