// GPT-2 from ONNX on the cuda backend: the tiny seeded GPT-2 of tests/data/onnx (exported by
// scripts/export_tiny_gpt2.py: 2 layers, n_embd 64, dynamic sequence axis) loaded with
// LoadOptions::float_dtype = bf16, compiled with backend cuda. Against the fake driver (CI): the bf16
// load option, the weights uploaded once at load (LoadOptions::device), every op of the graph with a
// GPU lowering (no host step, so no perf_hints line saying so), the kernels NVRTC-compiling for the
// device, and kernel dedup over a stack of equal blocks. On a GPU: the values match the CPU eager run
// of the same bf16 model over three sequence lengths.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "backend/cuda/blas.h"
#include "backend/cuda/nvrtc.h"
#include "cache/blob_cache.h"
#include "cache/program_cache.h"
#include "device/fake_driver.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace pt = protean;
namespace drv = protean::cuda;

namespace {

// The source tree: $PROTEAN_SOURCE_DIR (a test binary run from another checkout, e.g. on the GPU
// machine), else the one it was built from.
std::string tiny_gpt2_path() {
  const char* env = std::getenv("PROTEAN_SOURCE_DIR");
  return std::string(env && *env ? env : PROTEAN_SOURCE_DIR) + "/tests/data/onnx/tiny_gpt2.onnx";
}

std::shared_ptr<pt::onnx::Model> load_bf16(pt::Device device = pt::kCPU) {
  pt::onnx::LoadOptions lo;
  lo.float_dtype = pt::DType::BF16;
  lo.device = device;
  return pt::onnx::load(tiny_gpt2_path(), lo);
}

pt::Tensor ids(int64_t len, uint64_t seed) {
  pt::manual_seed(seed);
  return pt::randint(0, 1000, {1, len}, pt::DType::I64);
}

TEST(OnnxBf16, FloatDtypeCastsInitializersInputsAndOutputs) {
  auto m = load_bf16();
  ASSERT_EQ(m->outputs().size(), 1u);
  EXPECT_EQ(m->outputs()[0].dtype, pt::DType::BF16) << m->outputs()[0].str();
  pt::Tensor y = m->forward({ids(7, 1)})[0];
  EXPECT_EQ(y.dtype(), pt::DType::BF16);
  EXPECT_EQ(y.int_sizes(), (pt::IntVec{1, 7, 64}));
  // the same model in f32: bf16 weights and activations stay within bf16 tolerance of it
  auto f = pt::onnx::load(tiny_gpt2_path());
  pt::Tensor r = f->forward({ids(7, 1)})[0];
  std::vector<double> a = y.to(pt::DType::F64).to_vector<double>(), b = r.to(pt::DType::F64).to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  EXPECT_LT(std::sqrt(num / den), 0.05);
  pt::onnx::LoadOptions bad;
  bad.float_dtype = pt::DType::I32;
  EXPECT_THROW(pt::onnx::load(tiny_gpt2_path(), bad), pt::ValueError);
}

// The whole graph on the GPU: no op falls back to a host step. The fake driver runs no kernel code and
// cuBLASLt cannot run on it, so the first call stops at the first matrix product (after the compile,
// the module load and the launches before it); the plan is what this checks.
TEST(CudaFakeDriver, TinyGpt2OnnxHasNoHostSteps) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-gpt2-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  auto m = load_bf16(pt::kCUDA);  // weights on the device once, at load
  const int64_t uploads_at_load = fake.stats().htod;
  // wte, wpe and per layer c_attn, c_proj, c_fc, mlp c_proj: the constants of >= 1024 elements
  EXPECT_EQ(uploads_at_load, 10) << "the tiny GPT-2's weight matrices";
  pt::CompileOptions o;
  o.name = m->identity();
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  auto f = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
  std::string log;
  {
    const char* extra = std::getenv("PROTEAN_TEST_LOGS");  // e.g. output_code, to see the CUDA C
    pt::observe::LogCapture cap(std::string("perf_hints,graph_breaks,output_code") + (extra ? std::string(",") + extra : ""));
    try {
      f(ids(13, 2).to(pt::kCUDA));
    } catch (const pt::CompileError& e) {
      if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
      ADD_FAILURE() << cap.str();
      throw;
    } catch (const pt::RuntimeError& e) {
      // cuBLASLt on the fake driver
      EXPECT_NE(std::string(e.what()).find("cublasLt"), std::string::npos) << e.what();
    }
    log = cap.str();
    if (extra) std::fprintf(stderr, "%s", log.c_str());
  }
  // The token lookup (ONNX Gather) wraps negative ids as it loads them: no kernel normalizes them first.
  // The position lookup, Gather(wpe, Range(0, L)), is a slice of the table read by the add that uses it.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("extern index_select("), 1u) << "the token lookup only";
  EXPECT_EQ(count("if (s < 0) s += src;"), 2u) << "its general and aligned entries";
  EXPECT_GE(count("slice(%c1, dim=0, start=0, end=s1, step=1)"), 1u);
  EXPECT_EQ(log.find("runs on the host"), std::string::npos) << log;
  EXPECT_EQ(log.find("graph break"), std::string::npos) << log;
  EXPECT_EQ(f.stats().compiles, 1);
  // one graph: one module per part of its translation unit (NVRTC compiles the parts on threads)
  EXPECT_GE(fake.stats().module_loads, 1);
  EXPECT_LE(fake.stats().module_loads, protean::backend::cuda::nvrtc_default_jobs());
  EXPECT_GE(fake.stats().launches, 1) << "the kernels before the first matrix product launch";
  // A warm process (a fresh function, the artifact cache's memory tier cleared) takes the plan from
  // the program cache (backend/cuda/plan_cache.h: attention, lowering and rendering skipped) and the
  // cubin from the artifact cache, and launches exactly what the rendered plan launched.
  auto launched = [&] {
    std::vector<std::string> r;
    for (const auto& l : fake.launches()) r.push_back(fmt::format("{} {}x{}", l.kernel, l.grid[0], l.block[0]));
    return r;
  };
  const std::vector<std::string> cold = launched();
  ASSERT_FALSE(cold.empty());
  const pt::cache::ProgramCacheStats p0 = pt::cache::program_cache_stats();
  pt::cache::clear_blob_memory_cache();
  fake.clear_launches();
  auto warm = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
  try {
    warm(ids(13, 2).to(pt::kCUDA));
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cublasLt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pt::cache::program_cache_stats().hits, p0.hits + 1);
  EXPECT_EQ(pt::cache::program_cache_stats().corrupt_entries, p0.corrupt_entries);
  EXPECT_EQ(launched(), cold);
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

// Kernel dedup (pipeline.h: CudaCompileOptions::dedup_kernels): a stack of equal blocks, each with its
// own weights, compiles the same kernels however deep it is; with PROTEAN_CUDA_KERNEL_DEDUP=0 the
// translation unit grows with the depth.
int entry_points(int depth, bool dedup) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  // cuBLASLt cannot run on the fake driver: each block's projection launches a stand-in kernel.
  protean::backend::cuda::set_fake_blas_hook_for_testing(fake, 8);
  struct Unhook {
    ~Unhook() { protean::backend::cuda::set_blas_hook_for_testing({}); }
  } unhook;
  // A private, empty cache: a plan stored by an earlier run would skip rendering, and the count below
  // reads the rendered source from the output_code log.
  const char* before = std::getenv("PROTEAN_CACHE_DIR");
  const std::string saved = before ? before : "";
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-dedup-test-{}-{}-{}", ::getpid(), depth, dedup);
  fs::remove_all(dir);
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  struct Restore {
    std::string dir, saved;
    bool had;
    ~Restore() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      if (had) setenv("PROTEAN_CACHE_DIR", saved.c_str(), 1);
      else unsetenv("PROTEAN_CACHE_DIR");
    }
  } restore{dir, saved, before != nullptr};
  if (!dedup) setenv("PROTEAN_CUDA_KERNEL_DEDUP", "0", 1);
  pt::manual_seed(4);
  std::vector<pt::Tensor> ws;
  std::vector<pt::Tensor> mats;
  for (int i = 0; i < depth; ++i) {
    for (int64_t n : {64, 64, 64, 64}) ws.push_back(pt::randn({n}, pt::DType::BF16, pt::kCUDA));
    mats.push_back(pt::randn({64, 64}, pt::DType::BF16, pt::kCUDA));
  }
  pt::CompileOptions o;
  o.name = fmt::format("blocks{}_{}", depth, dedup);
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  auto f = pt::compile(
      [&](const pt::Tensor& x0) {
        pt::Tensor x = x0;
        for (int i = 0; i < depth; ++i) {
          const pt::Tensor* w = &ws[static_cast<size_t>(4 * i)];
          pt::Tensor h = pt::layer_norm(x, {x.size(-1)}, w[0], w[1]);
          // the projection (a library call) ends the block's kernels, as a transformer's do
          x = x + pt::gelu(pt::linear(h, mats[static_cast<size_t>(i)]) * w[2], "tanh") + pt::softmax(h + w[3], -1);
        }
        return x;
      },
      o);
  std::string log;
  {
    pt::observe::LogCapture cap("output_code");
    f(pt::randn({5, 64}, pt::DType::BF16, pt::kCUDA));
    log = cap.str();
  }
  unsetenv("PROTEAN_CUDA_KERNEL_DEDUP");
  if (std::getenv("PROTEAN_TEST_LOGS")) std::fprintf(stderr, "%s", log.c_str());
  int n = 0;
  for (size_t at = log.find("__global__"); at != std::string::npos; at = log.find("__global__", at + 1)) ++n;
  return n;
}

TEST(CudaFakeDriver, KernelDedupKeepsDeepStacksToOneBlocksKernels) {
  int two = 0, three = 0, three_plain = 0;
  try {
    two = entry_points(2, true);
    three = entry_points(3, true);
    three_plain = entry_points(3, false);
  } catch (const pt::CompileError& e) {
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_GT(two, 0);
  EXPECT_EQ(three, two) << "three equal blocks must compile the kernels of two";
  EXPECT_GT(three_plain, three) << "without dedup the unit grows with the depth";
}

// On a GPU: the bf16 model on backend cuda against the same bf16 model run eagerly on the CPU, over
// three sequence lengths (a static graph, then the dynamic one).
TEST(CudaGpu, TinyGpt2OnnxMatchesCpuEager) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  auto m = load_bf16();
  pt::CompileOptions o;
  o.name = m->identity();
  o.backend = "cuda";
  auto f = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
  for (int64_t len : {8, 13, 100}) {
    pt::Tensor x = ids(len, 3);
    pt::Tensor got = f(x.to(pt::kCUDA)).cpu().to(pt::DType::F64);
    pt::Tensor want = m->forward({x})[0].to(pt::DType::F64);
    std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
    ASSERT_EQ(a.size(), b.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_FALSE(std::isnan(a[i])) << "seq " << len << " element " << i;
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    EXPECT_LT(std::sqrt(num / den), 0.02) << "seq " << len;
  }
  EXPECT_LE(f.stats().compiles, 2);
}

}  // namespace
