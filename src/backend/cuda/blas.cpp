#include "backend/cuda/blas.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include "backend/cuda/hopper_gemm.h"
#include "cache/blob_cache.h"
#include "cache/program_cache.h"
#include "core/files.h"
#include "device/dynamic_library.h"
#include "device/fake_driver.h"
#include "device/runtime.h"
#include "observe/env.h"
#include "observe/log.h"
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
constexpr int kPrefMaxWorkspace = 1, kPrefReductionSchemeMask = 3;
constexpr uint32_t kReductionInPlace = 1;  // CUBLASLT_REDUCTION_SCHEME_INPLACE
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
  Status (*pref_destroy)(Pref) = nullptr;
  Status (*heuristic)(Handle, Desc, Layout, Layout, Layout, Layout, Pref, int, Heuristic*, int*) = nullptr;
  Status (*matmul)(Handle, Desc, const void*, const void*, Layout, const void*, Layout, const void*, const void*, Layout,
                   void*, Layout, const Algo*, void*, size_t, drv::CUstream) = nullptr;
  const char* (*status_name)(Status) = nullptr;
  size_t (*get_version)() = nullptr;  ///< cublasLtGetVersion (the algorithm table's identity)
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
           drv::resolve_symbol(lib, l.pref_destroy, {"cublasLtMatmulPreferenceDestroy"}, missing) &&
           drv::resolve_symbol(lib, l.heuristic, {"cublasLtMatmulAlgoGetHeuristic"}, missing) &&
           drv::resolve_symbol(lib, l.matmul, {"cublasLtMatmul"}, missing);
    if (!l.ok) l.why = fmt::format("libcublasLt lacks {}", missing);
    std::string optional;  // cublasLtGetStatusName is newer than the rest: its absence is not an error
    drv::resolve_symbol(lib, l.status_name, {"cublasLtGetStatusName"}, optional);
    drv::resolve_symbol(lib, l.get_version, {"cublasLtGetVersion"}, optional);
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
  size_t first_count = 0;   ///< algos[0, first_count): the plain query's; the rest the one-kernel query's
  bool one_kernel_asked = false;
};

struct DeviceLt {
  Handle handle = nullptr;
  uint64_t identity = 0;  ///< the algorithm table identity of this device (0 until the first plan)
  std::shared_ptr<Storage> workspace;
  std::map<BlasAlgoKey, Plan> plans;  ///< per call signature: the layers of a model share one
};

std::mutex g_mu;
std::map<int, DeviceLt> g_dev;
BlasHook g_hook;  // tests: stands in for cuBLASLt
int g_hook_algorithms = 1;
thread_local int t_hook_algorithm = -1;
BlasStats g_stats;  // under g_mu
// The cuBLASLt warm-up (prewarm_blas), run by std::async when the device is first used: the last
// copy of its future waits for it when destroyed, before the state above is (declared after it).
std::mutex g_prewarm_mu;
std::shared_future<void> g_prewarm;

// PROTEAN_CUDA_BLAS_PREWARM: 0 (no warm-up), own_stream (the products on a stream of the warm-up's
// own: see prewarm_blas for what that costs), plan (each signature's plan made, no product run: a
// diagnostic), anything else the default (the products on the device's stream).
enum class PrewarmHow { Off, DeviceStream, OwnStream, PlanOnly };
PrewarmHow prewarm_how() {
  const char* e = std::getenv("PROTEAN_CUDA_BLAS_PREWARM");
  const std::string_view v = e ? e : "";
  return v == "0" ? PrewarmHow::Off : v == "plan" ? PrewarmHow::PlanOnly : v == "own_stream" ? PrewarmHow::OwnStream : PrewarmHow::DeviceStream;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The device's handle and workspace (g_mu held).
DeviceLt& device_lt(int device) {
  DeviceLt& D = g_dev[device];
  if (!D.handle) {
    const auto t0 = std::chrono::steady_clock::now();
    lt_check(lt().create(&D.handle), "cublasLtCreate");
    D.workspace = std::make_shared<Storage>(kWorkspaceBytes, Device{DeviceType::CUDA, device});
    g_stats.setup_seconds += seconds_since(t0);
  }
  return D;
}

// ---- the algorithm table on disk (blas.h) ---------------------------------------------------------

// Version 2: up to kBlasHeuristicAlgorithms (16) algorithms an entry. Version 1 held up to 8, too few
// for max-autotune's candidates now; the version is part of the identity (table_identity), so a
// version 1 file is not even opened.
constexpr char kTableMagic[8] = {'P', 'T', 'L', 'T', 'A', 'L', 'G', '2'};
constexpr uint64_t kTableMaxEntries = uint64_t{1} << 20;

struct AlgoTableState {
  bool loaded = false;     ///< the file was looked for (once per process)
  bool enabled = false;    ///< PROTEAN_PROGRAM_CACHE is not 0 and the cache dir is usable
  bool dirty = false;      ///< entries added since the file was read
  uint64_t identity = 0;
  std::string path;
  BlasAlgoTable table;
};
AlgoTableState g_table;  // under g_mu

template <class T>
void put_raw(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

struct Reader {
  const std::string& bytes;
  size_t at = 0;
  template <class T>
  T get(const char* what) {
    T v{};
    if (bytes.size() - at < sizeof(T))
      throw FormatError(fmt::format("cuBLASLt algorithm table: truncated at byte {} (reading {})", at, what));
    std::memcpy(&v, bytes.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

std::string read_whole_file(const std::string& path, bool& found) {
  found = false;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  std::ifstream f(path, std::ios::binary);
  if (!f) return {};
  std::ostringstream ss;
  ss << f.rdbuf();
  found = true;
  return ss.str();
}

// The table's identity: the library version, the device and the workspace limit (g_mu held).
uint64_t table_identity(int device) {
  const drv::DeviceInfo& dev = drv::device_info(device);
  const std::string text = fmt::format("cublasLt {}|{}|sm_{}{}|workspace {}|table {}", lt().get_version ? lt().get_version() : 0,
                                       dev.name, dev.cc_major, dev.cc_minor, kWorkspaceBytes,
                                       std::string_view(kTableMagic, sizeof(kTableMagic)));
  return XXH64(text.data(), text.size(), 0);
}

void save_table_locked() {
  AlgoTableState& T = g_table;
  if (!T.enabled || !T.dirty || T.path.empty()) return;
  // Entries another process stored meanwhile are kept (ours win for equal keys).
  BlasAlgoTable merged = T.table;
  bool found = false;
  const std::string current = read_whole_file(T.path, found);
  if (found) {
    try {
      for (auto& [k, v] : decode_blas_algorithms(current, T.identity)) merged.emplace(k, std::move(v));
    } catch (const Error&) {  // replaced below
    }
  }
  const std::string bytes = encode_blas_algorithms(merged, T.identity);
  try {
    core::write_file_atomic(T.path, bytes, "cuBLASLt algorithm table");
  } catch (const Error& e) {
    observe::warn(fmt::format("{}; the next process asks cuBLASLt again", e.what()));
    T.enabled = false;
    return;
  }
  T.dirty = false;
}

void save_at_exit() {
  std::lock_guard<std::mutex> lock(g_mu);
  save_table_locked();
}

// Reads the table file once per process (g_mu held).
void load_table(int device) {
  AlgoTableState& T = g_table;
  if (T.loaded) return;
  T.loaded = true;
  if (!cache::program_cache_enabled()) return;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    T.identity = table_identity(device);
    T.path = fmt::format("{}/{:016x}.bin", cache::blob_dir("cublaslt"), T.identity);
  } catch (const std::exception& e) {
    observe::warn(fmt::format("cuBLASLt algorithm table: no cache directory ({}); the heuristic runs every process", e.what()));
    return;
  }
  T.enabled = true;
  static const bool registered = [] { return std::atexit(save_at_exit) == 0; }();
  (void)registered;
  bool found = false;
  const std::string bytes = read_whole_file(T.path, found);
  if (found) {
    try {
      T.table = decode_blas_algorithms(bytes, T.identity);
      g_stats.table_entries_read = static_cast<int64_t>(T.table.size());
    } catch (const Error& e) {
      observe::warn(fmt::format("cuBLASLt algorithm table {} is not usable ({}); cuBLASLt's heuristic answers again and "
                                "the file is rewritten",
                                T.path, e.what()));
      T.table.clear();
      T.dirty = true;
    }
  }
  g_stats.table_read_seconds += seconds_since(t0);
}

}  // namespace

std::string encode_blas_algorithms(const BlasAlgoTable& table, uint64_t identity) {
  std::string out(kTableMagic, sizeof(kTableMagic));
  put_raw<uint64_t>(out, identity);
  put_raw<uint64_t>(out, table.size());
  for (const auto& [k, v] : table) {
    put_raw(out, k.dtype);
    put_raw(out, k.transpose_b);
    put_raw(out, k.epilogue);
    for (int64_t x : {k.batch, k.m, k.n, k.k, k.stride_a, k.stride_b}) put_raw(out, x);
    put_raw<uint64_t>(out, v.workspace);
    put_raw<uint32_t>(out, static_cast<uint32_t>(v.algos.size()));
    for (const auto& a : v.algos)
      for (uint64_t w : a) put_raw(out, w);
    put_raw<uint32_t>(out, v.first_count);
    put_raw<uint32_t>(out, v.one_kernel_asked ? 1u : 0u);
  }
  put_raw<uint64_t>(out, XXH64(out.data(), out.size(), 0));
  return out;
}

BlasAlgoTable decode_blas_algorithms(const std::string& bytes, uint64_t identity) {
  if (bytes.size() < sizeof(kTableMagic) + 3 * sizeof(uint64_t) || std::memcmp(bytes.data(), kTableMagic, sizeof(kTableMagic)) != 0)
    throw FormatError("cuBLASLt algorithm table: not a table (magic PTLTALG2 missing)");
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - sizeof(uint64_t), sizeof(uint64_t));
  if (stored != XXH64(bytes.data(), bytes.size() - sizeof(uint64_t), 0))
    throw FormatError("cuBLASLt algorithm table: checksum mismatch (the file is damaged)");
  const std::string body = bytes.substr(0, bytes.size() - sizeof(uint64_t));
  Reader r{body, sizeof(kTableMagic)};
  if (const uint64_t id = r.get<uint64_t>("identity"); id != identity)
    throw FormatError(fmt::format("cuBLASLt algorithm table: made for another library or device (identity {:016x}, "
                                  "this process {:016x})",
                                  id, identity));
  const uint64_t n = r.get<uint64_t>("entry count");
  if (n > kTableMaxEntries) throw FormatError(fmt::format("cuBLASLt algorithm table: {} entries is out of range", n));
  BlasAlgoTable t;
  for (uint64_t i = 0; i < n; ++i) {
    BlasAlgoKey k;
    k.dtype = r.get<int32_t>("dtype");
    k.transpose_b = r.get<int32_t>("transpose");
    k.epilogue = r.get<uint32_t>("epilogue");
    for (int64_t* x : {&k.batch, &k.m, &k.n, &k.k, &k.stride_a, &k.stride_b}) *x = r.get<int64_t>("shape");
    BlasAlgoChoice c;
    c.workspace = r.get<uint64_t>("workspace");
    const uint32_t na = r.get<uint32_t>("algorithm count");
    constexpr uint32_t kMaxAlgos = kBlasHeuristicAlgorithms + kBlasOneKernelAlgorithms;
    if (na < 1 || na > kMaxAlgos)
      throw FormatError(fmt::format("cuBLASLt algorithm table: entry {} has {} algorithms (1 to {})", i, na, kMaxAlgos));
    if (c.workspace > kWorkspaceBytes)
      throw FormatError(fmt::format("cuBLASLt algorithm table: entry {} needs {} bytes of workspace, more than {}", i,
                                    c.workspace, kWorkspaceBytes));
    for (uint32_t a = 0; a < na; ++a) {
      std::array<uint64_t, 8> w{};
      for (uint64_t& x : w) x = r.get<uint64_t>("algorithm");
      c.algos.push_back(w);
    }
    c.first_count = r.get<uint32_t>("plain query's count");
    const uint32_t asked = r.get<uint32_t>("one-kernel flag");
    if (c.first_count < 1 || c.first_count > na || c.first_count > static_cast<uint32_t>(kBlasHeuristicAlgorithms) || asked > 1 ||
        (!asked && c.first_count != na) || na - c.first_count > static_cast<uint32_t>(kBlasOneKernelAlgorithms))
      throw FormatError(fmt::format("cuBLASLt algorithm table: entry {} splits its {} algorithms at {} (one-kernel flag {})",
                                    i, na, c.first_count, asked));
    c.one_kernel_asked = asked == 1;
    if (!t.emplace(k, std::move(c)).second)
      throw FormatError(fmt::format("cuBLASLt algorithm table: entry {} repeats a key", i));
  }
  if (r.at != body.size())
    throw FormatError(fmt::format("cuBLASLt algorithm table: {} bytes after the last entry", body.size() - r.at));
  return t;
}

void save_blas_algorithms() {
  std::lock_guard<std::mutex> lock(g_mu);
  try {
    save_table_locked();
  } catch (const std::exception& e) {
    observe::warn(fmt::format("cuBLASLt algorithm table: not written ({})", e.what()));
  }
}

void reset_blas_algorithms_for_testing() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_table = AlgoTableState{};
}

BlasStats blas_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_stats;
}

void reset_blas_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_stats = BlasStats{};
}

bool blas_hook_installed() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<bool>(g_hook);
}

void set_blas_hook_for_testing(BlasHook hook, int algorithms) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hook = std::move(hook);
  g_hook_algorithms = std::max(algorithms, 1);
}

void set_fake_blas_hook_for_testing(::protean::cuda::FakeDriver& fake, int algorithms) {
  fake.define_kernel("gemm", {8, 8});
  drv::CUfunction gemm = nullptr;
  drv::check(fake.api().cuModuleGetFunction(&gemm, nullptr, "gemm"), "cuModuleGetFunction(gemm)");
  set_blas_hook_for_testing([&fake, gemm](const BlasStep&, const BlasShape& s, const std::function<uint64_t(int)>&,
                                          drv::CUstream stream) {
    uint64_t v[2] = {static_cast<uint64_t>(s.m), static_cast<uint64_t>(s.n)};
    void* params[2] = {&v[0], &v[1]};
    drv::check(fake.api().cuLaunchKernel(gemm, 1, 1, 1, 1, 1, 1, 0, stream, params, nullptr), "cuLaunchKernel(gemm)");
  }, algorithms);
}

void wait_for_blas_prewarm() {
  std::shared_future<void> f;
  {
    std::lock_guard<std::mutex> lock(g_prewarm_mu);
    f = g_prewarm;
  }
  if (f.valid()) f.wait();
}

void prepare_blas_device(int device) {
  wait_for_blas_prewarm();
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

uint32_t epilogue_of(const BlasStep& st) {
  const BlasEpilogue& ep = st.epilogue;
  uint32_t epi = kEpiDefault;
  if (ep.bias >= 0) epi = kEpiBias;
  if (ep.gelu == GeluForm::Tanh) epi = ep.bias >= 0 ? (kEpiGelu | kEpiBias) : kEpiGelu;
  return epi;
}

// The heuristic's answer for `p`'s descriptors: up to `want` algorithms, best first (each with its
// state: not 0 is one it could not check); `reduction_mask` (0: any) restricts split-K algorithms to
// those reduction schemes. Throws
// RuntimeError when it offers none and `reduction_mask` is 0 (a restricted query may answer nothing).
std::vector<Heuristic> heuristic_query(const BlasStep& st, const BlasShape& shape, DeviceLt& D, const Plan& p, int want,
                                       uint32_t reduction_mask) {
  const Lt& L = lt();
  const auto t0 = std::chrono::steady_clock::now();
  Pref pref = nullptr;
  lt_check(L.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  struct Release {
    const Lt& L;
    Pref pref;
    ~Release() { L.pref_destroy(pref); }
  } release{L, pref};
  const uint64_t ws = kWorkspaceBytes;
  lt_check(L.pref_set(pref, kPrefMaxWorkspace, &ws, sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE)");
  if (reduction_mask)
    lt_check(L.pref_set(pref, kPrefReductionSchemeMask, &reduction_mask, sizeof(reduction_mask)),
             "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)");
  std::vector<Heuristic> h(static_cast<size_t>(want));
  int found = 0;
  lt_check(L.heuristic(D.handle, p.desc, p.la, p.lb, p.lc, p.lc, pref, want, h.data(), &found), "cublasLtMatmulAlgoGetHeuristic");
  ++g_stats.heuristic_queries;
  g_stats.heuristic_seconds += seconds_since(t0);
  h.resize(static_cast<size_t>(std::clamp(found, 0, want)));
  if (h.empty() && !reduction_mask)
    throw RuntimeError(fmt::format("cuBLASLt has no algorithm for {} [{}x{}]x[{}x{}] batch {} ({})", short_name(st.dtype),
                                   shape.m, shape.k, shape.k, shape.n, shape.batch, ops::op_name(st.kind)));
  return h;
}

// Puts `p`'s algorithms in the algorithm table under `key` (g_mu held).
void store_in_table(const BlasAlgoKey& key, const Plan& p) {
  BlasAlgoChoice c;
  c.workspace = p.workspace;
  c.first_count = static_cast<uint32_t>(p.first_count);
  c.one_kernel_asked = p.one_kernel_asked;
  for (const Algo& a : p.algos) {
    std::array<uint64_t, 8> w{};
    std::memcpy(w.data(), a.data, sizeof(a.data));
    c.algos.push_back(w);
  }
  g_table.table[key] = std::move(c);
  g_table.dirty = true;
}

// The descriptors and the heuristic's algorithms of `st`'s call signature at `shape` (g_mu held),
// made on first use: from the algorithm table when it has the signature, else from the heuristic.
BlasAlgoKey algo_key_of(const BlasStep& st, const BlasShape& shape) {
  BlasAlgoKey key;
  key.dtype = static_cast<int32_t>(st.dtype);
  key.transpose_b = st.transpose_b ? 1 : 0;
  key.epilogue = epilogue_of(st);
  key.batch = shape.batch;
  key.m = shape.m;
  key.n = shape.n;
  key.k = shape.k;
  key.stride_a = shape.batch > 1 ? shape.stride_a : 0;  // strides only matter for batched calls
  key.stride_b = shape.batch > 1 ? shape.stride_b : 0;
  return key;
}

Plan& plan_of(const BlasStep& st, const BlasShape& shape, int device) {
  const Lt& L = lt();
  const int64_t batch = shape.batch, m = shape.m, n = shape.n, k = shape.k;
  const int64_t sa = shape.stride_a, sb = shape.stride_b;
  DeviceLt& D = device_lt(device);
  const uint32_t epi = epilogue_of(st);
  const BlasAlgoKey key = algo_key_of(st, shape);
  auto it = D.plans.find(key);
  if (it == D.plans.end()) {
    Plan p;
    const int type = lt_type(st.dtype);
    lt_check(L.desc_create(&p.desc, kComputeF32, kR32F), "cublasLtMatmulDescCreate");
    // Column-major view: D'[n, m] = A'[n, k] · B'[k, m] with A' = b (or bᵀ for Linear) and B' = a.
    const int32_t ta = st.transpose_b ? kOpT : kOpN, tb = kOpN;
    lt_check(L.desc_set(p.desc, kDescTransA, &ta, sizeof(ta)), "cublasLtMatmulDescSetAttribute(TRANSA)");
    lt_check(L.desc_set(p.desc, kDescTransB, &tb, sizeof(tb)), "cublasLtMatmulDescSetAttribute(TRANSB)");
    lt_check(L.desc_set(p.desc, kDescEpilogue, &epi, sizeof(epi)), "cublasLtMatmulDescSetAttribute(EPILOGUE)");
    if (st.epilogue.bias >= 0) {
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
    load_table(device);
    // The table is the first device's: another device (another model in one host) uses it only when
    // its identity is the same.
    if (g_table.enabled && !D.identity) D.identity = table_identity(device);
    const bool use_table = g_table.enabled && D.identity == g_table.identity;
    auto known = use_table ? g_table.table.find(key) : g_table.table.end();
    // The heuristic's algorithms for this signature (its first is the plan's algorithm).
    auto ask_heuristic = [&](Plan& into) {
      const std::vector<Heuristic> h = heuristic_query(st, shape, D, p, kBlasHeuristicAlgorithms, 0);
      into.algo = h[0].algo;
      into.workspace = h[0].workspace;
      into.algos.clear();
      for (const Heuristic& x : h)
        if (x.state == 0) into.algos.push_back(x.algo);
      if (into.algos.empty()) into.algos.push_back(into.algo);
      into.first_count = into.algos.size();
      into.one_kernel_asked = false;
    };
    if (known != g_table.table.end()) {
      for (const auto& a : known->second.algos) {
        Algo x;
        std::memcpy(x.data, a.data(), sizeof(x.data));
        p.algos.push_back(x);
      }
      p.algo = p.algos.front();
      p.workspace = known->second.workspace;
      p.first_count = known->second.first_count;
      p.one_kernel_asked = known->second.one_kernel_asked;
      ++g_stats.table_hits;
      // PROTEAN_CUDA_BLAS_TABLE_CHECK=1: the heuristic answers too; where its first algorithm is not
      // the table's, its answer is used and the difference counted and logged (PROTEAN_LOGS=cache).
      if (observe::env_opt_in("PROTEAN_CUDA_BLAS_TABLE_CHECK")) {
        Plan q;
        ask_heuristic(q);
        if (std::memcmp(q.algo.data, p.algo.data, sizeof(p.algo.data)) != 0) {
          ++g_stats.table_mismatches;
          if (observe::log_enabled(observe::LogCat::Cache))
            observe::log_line(observe::LogCat::Cache, "",
                              fmt::format("cuBLASLt algorithm table: [{}x{}]x[{}x{}] batch {}: the table has {:016x}, the "
                                          "heuristic answers {:016x}",
                                          m, k, k, n, batch, fmt::join(p.algo.data, " "), fmt::join(q.algo.data, " ")));
          p.algo = q.algo;
          p.algos = q.algos;
          p.workspace = q.workspace;
          p.first_count = q.first_count;
          p.one_kernel_asked = false;
        }
      }
    } else {
      ask_heuristic(p);
      if (use_table) store_in_table(key, p);
    }
    ++g_stats.plans;
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

std::vector<int> blas_tune_algorithms(const BlasStep& st, const BlasShape& shape, int device, int top, int one_kernel) {
  wait_for_blas_prewarm();  // max-autotune times candidates: nothing else of ours on the device then
  std::vector<int> out;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_hook) {
      for (int i = 0; i < std::min(g_hook_algorithms, top); ++i) out.push_back(i);
      return out;
    }
  }
  if (!check_blas_call(st, shape)) return {0};
  std::lock_guard<std::mutex> lock(g_mu);
  Plan& p = plan_of(st, shape, device);
  if (one_kernel > 0 && !p.one_kernel_asked) {
    // asked once per signature: the algorithms that reduce split-K partials without a kernel of their own
    DeviceLt& D = device_lt(device);
    p.algos.resize(p.first_count);
    std::vector<Heuristic> h;
    try {
      h = heuristic_query(st, shape, D, p, kBlasOneKernelAlgorithms, kReductionInPlace);
    } catch (const Error&) {  // the heuristic refuses the restriction (CUBLAS_STATUS_NOT_SUPPORTED): none
    }
    for (const Heuristic& x : h)
      if (x.state == 0) p.algos.push_back(x.algo);
    p.one_kernel_asked = true;
    if (g_table.enabled && D.identity == g_table.identity) store_in_table(algo_key_of(st, shape), p);
  }
  const int first = std::min<int>(top, static_cast<int>(p.first_count));
  for (int i = 0; i < first; ++i) out.push_back(i);
  // the one-kernel answers not among those timed already
  int extra = 0;
  for (size_t i = p.first_count; i < p.algos.size() && extra < one_kernel; ++i) {
    const bool timed = std::any_of(p.algos.begin(), p.algos.begin() + first, [&](const Algo& a) {
      return std::memcmp(a.data, p.algos[i].data, sizeof(a.data)) == 0;
    });
    if (timed) continue;
    out.push_back(static_cast<int>(i));
    ++extra;
  }
  return out;
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
  if (generated_product_eligible(st, shape, address, device, algorithm)) {
    // without programmatic serialization: a capture's graph gets its edges from the recorder, and in
    // mode "reduce-overhead" a plain call between two graph segments comes right after a graph
    // launch, where programmatic serialization's meaning is not documented
    run_generated_product(st, shape, address, device, stream, false);
    return;
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

// ---- warm-up ---------------------------------------------------------------------------------------

int prewarm_blas(int device) {
  const drv::DriverApi* api = drv::driver();
  if (!api || std::string_view(api->name) == "fake") return 0;  // before loading cuBLASLt: nothing to warm
  // one signature per distinct algorithm: loading its kernels is the cost, not the shape
  std::vector<BlasAlgoKey> keys;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_hook || !lt().ok) return 0;
    load_table(device);
    if (!g_table.enabled || g_table.table.empty() || table_identity(device) != g_table.identity) return 0;
    std::set<std::tuple<int32_t, int32_t, uint32_t, std::array<uint64_t, 8>>> seen;
    for (const auto& [k, v] : g_table.table)
      if (!v.algos.empty() && seen.insert({k.dtype, k.transpose_b, k.epilogue, v.algos.front()}).second) keys.push_back(k);
  }
  // one scratch block holds a, b, the bias and out of the largest signature (the values do not
  // matter, only that cuBLASLt loads and runs each algorithm once)
  constexpr int64_t kMaxScratch = int64_t{256} << 20;
  auto bytes_of = [](const BlasAlgoKey& k) {
    return std::max<int64_t>(k.batch, 1) * (k.m * k.k + k.k * k.n + k.m * k.n) * 4 + k.n * 4 + 1024;
  };
  int64_t bytes = 0;
  for (const BlasAlgoKey& k : keys)
    if (const int64_t b = bytes_of(k); b <= kMaxScratch) bytes = std::max(bytes, b);
  if (bytes == 0) return 0;
  // and, past the operands, a cuBLASLt workspace of its own: the device's is the one the program's
  // calls use on the device's stream, which may run meanwhile
  const int64_t workspace_at = (bytes + 255) & ~int64_t{255};
  bytes = workspace_at + static_cast<int64_t>(kWorkspaceBytes);
  const auto t0 = std::chrono::steady_clock::now();
  const size_t nbytes = static_cast<size_t>(bytes);
  drv::stream(device);  // the device's context current on this thread
  const PrewarmHow how = prewarm_how();
  const bool plan_only = how == PrewarmHow::PlanOnly, own_stream = how == PrewarmHow::OwnStream;
  // The device's stream. Measured on GPT-2 under reduce-overhead (bench/gpu/cache_ab.sh;
  // bench/results/graphs_cache_ab_2026-12-06*.json and graphs_prewarm_stream_2026-12-06_h100.json,
  // H100 and H200; docs/graphs.md): where the warm-up ran its products
  // on any other stream, every later CUDA graph replay of the process ran 4-9 % slower, at every
  // length, whatever else was changed: that stream kept or destroyed, created blocking, its scratch
  // allocated on it, the warm-up run before the program's first steps on the same thread, its own
  // cuBLASLt handle and plans, every product run once more on the device's stream afterwards, modules
  // loaded eagerly (CUDA_MODULE_LOADING=EAGER), one hardware connection. Creating the stream without
  // running products on it, making the plans only, or running them on the device's stream does not
  // slow the replays. The cause is not known. The device's stream queues the products behind the
  // model's uploads; the kernels' loading, the cost the warm-up takes away, is host work in the launch.
  drv::CUstream own = nullptr;
  if (!own_stream) own = drv::stream(device);
  else if (api->cuStreamCreate(&own, 1) != 0) return 0;
  const drv::CUdeviceptr scratch = drv::device_allocate(device, nbytes);
  int ran = 0;
  try {
    drv::synchronize(device);  // the block is ordered on the device's stream
    if (api->cuMemsetD8Async(scratch, 0, nbytes, own) != 0) throw RuntimeError("cuMemsetD8Async failed");
    for (const BlasAlgoKey& k : keys) {
      if (bytes_of(k) > kMaxScratch) continue;
      BlasStep st;
      st.op = k.transpose_b ? BlasOp::Linear : BlasOp::Matmul;
      st.kind = k.transpose_b ? ops::OpKind::linear : ops::OpKind::matmul;
      st.dtype = static_cast<DType>(k.dtype);
      st.transpose_b = k.transpose_b != 0;
      st.a = 0, st.b = 1, st.out = 2;
      if (k.epilogue & kEpiBias) st.epilogue.bias = 3;
      if (k.epilogue & kEpiGelu) st.epilogue.gelu = GeluForm::Tanh;
      if (epilogue_of(st) != k.epilogue) continue;  // a form this version does not make
      BlasShape sh;
      sh.batch = k.batch, sh.m = k.m, sh.n = k.n, sh.k = k.k;
      sh.stride_a = k.batch > 1 ? k.stride_a : k.m * k.k;
      sh.stride_b = k.batch > 1 ? k.stride_b : k.k * k.n;
      const uint64_t es = itemsize(st.dtype);
      const uint64_t b = static_cast<uint64_t>(std::max<int64_t>(k.batch, 1));
      const uint64_t mk = static_cast<uint64_t>(k.m * k.k), kn = static_cast<uint64_t>(k.k * k.n), mn = static_cast<uint64_t>(k.m * k.n);
      const uint64_t off[4] = {0, es * b * mk, es * b * (mk + kn), es * b * (mk + kn + mn)};
      if (plan_only) {  // the descriptors and algorithms only: no product runs, no kernel is loaded
        std::lock_guard<std::mutex> lock(g_mu);
        plan_of(st, sh, device);
      } else {
        // algorithm 0, the heuristic's first, named: a product the generated kernel would take
        // (hopper_gemm.h) still runs on cuBLASLt here, whose kernels are what this loads
        run_blas_at(st, sh, [&](int id) { return scratch + ((off[id] + 255) & ~uint64_t{255}); }, device, own,
                    0, scratch + static_cast<uint64_t>(workspace_at));
      }
      ++ran;
    }
    api->cuStreamSynchronize(own);
  } catch (const std::exception& e) {
    observe::log_line(observe::LogCat::Cache, "",
                      fmt::format("cuBLASLt warm-up stopped after {} of {} algorithms: {}", ran, keys.size(), e.what()));
    api->cuStreamSynchronize(own);
  }
  if (own_stream) api->cuStreamDestroy(own);
  drv::device_free(device, scratch, nbytes);
  observe::log_line(observe::LogCat::Cache, "",
                    fmt::format("cuBLASLt warm-up: {} distinct algorithms of the algorithm table run once on device {} in {:.1f} ms",
                                ran, device, 1e3 * seconds_since(t0)));
  return ran;
}

namespace {

void start_prewarm(int device) {
  if (prewarm_how() == PrewarmHow::Off) return;
  std::lock_guard<std::mutex> lock(g_prewarm_mu);
  if (g_prewarm.valid()) return;  // one device per process warms up
  g_prewarm = std::async(std::launch::async, [device] {
                try {
                  prewarm_blas(device);
                } catch (...) {  // best effort: a failure shows up again, with its message, in the real call
                }
              }).share();
}

const bool g_prewarm_hook = [] {
  drv::add_device_ready_hook(start_prewarm);
  return true;
}();

}  // namespace

}  // namespace protean::backend::cuda
