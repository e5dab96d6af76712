// conv2d on backend cuda through cuDNN (backend/cuda/dnn.h): the lowering decision and the call
// sequence on the fake driver (a hook stands in for cuDNN), and on a GPU conv against the cpu eager
// kernel on random shapes (groups, depthwise, strides, dilations, padding, bias) and the PP-OCRv4
// models against the cpu backend.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/dnn.h"
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
namespace bc = protean::backend::cuda;
namespace drv = protean::cuda;
namespace sym = protean::sym;

namespace {

struct HookCall {
  bc::ConvShape shape;
  std::array<int64_t, 2> stride, padding, dilation;
  int64_t groups;
  bool bias;
  bool addresses_set;
};

/// Sets the conv hook for the test's lifetime and records each call.
struct ConvHookScope {
  std::vector<HookCall> calls;
  ConvHookScope() {
    bc::set_conv_hook_for_testing([this](const bc::ConvStep& s, const bc::ConvShape& shape,
                                         const std::function<uint64_t(int)>& address, drv::CUstream) {
      const bool set = address(s.x) != 0 && address(s.w) != 0 && address(s.out) != 0 && (s.bias < 0 || address(s.bias) != 0);
      calls.push_back({shape, s.stride, s.padding, s.dilation, s.groups, s.bias >= 0, set});
    });
  }
  ~ConvHookScope() { bc::set_conv_hook_for_testing(nullptr); }
};

pt::Tensor conv_relu(const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
  return pt::relu(pt::conv2d(x, w, b, {2, 1}, {1, 2}, {1, 2}, 2));
}

}  // namespace

TEST(CudaConv, ShapeFollowsFromTheParametersOrIsAShapeError) {
  bc::ConvStep s;
  s.x_sizes = {sym::integer(1), sym::integer(4), sym::integer(10), sym::integer(12)};
  s.w_sizes = {sym::integer(6), sym::integer(2), sym::integer(3), sym::integer(3)};
  s.out_sizes = {sym::integer(1), sym::integer(6), sym::integer(5), sym::integer(10)};
  s.stride = {2, 1};
  s.padding = {1, 1};
  s.dilation = {1, 2};
  s.groups = 2;
  const bc::ConvShape shape = bc::conv_shape(s, {}, {});
  EXPECT_EQ(shape.out, (std::array<int64_t, 4>{1, 6, 5, 10}));
  EXPECT_FALSE(shape.empty());
  s.out_sizes[3] = sym::integer(11);  // the plan and the sizes disagree
  EXPECT_THROW(bc::conv_shape(s, {}, {}), pt::ShapeError);
  s.out_sizes[3] = sym::integer(10);
  s.groups = 3;  // does not divide 4 channels
  EXPECT_THROW(bc::conv_shape(s, {}, {}), pt::ShapeError);
}

TEST(CudaFakeDriver, ConvLowersToCudnnAndRunsPerWidthWithOneCompile) {
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  ConvHookScope hook;
  pt::manual_seed(3);
  pt::Tensor w = pt::randn({6, 2, 3, 3}).to(pt::kCUDA), b = pt::randn({6}).to(pt::kCUDA);
  pt::CompileOptions o;
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  auto f = pt::compile([&](const pt::Tensor& x) { return conv_relu(x, w, b); }, o);
  std::string log;
  {
    pt::observe::LogCapture cap("perf_hints,graph_breaks");
    try {
      for (int64_t width : {20, 37}) f(pt::randn({2, 4, 9, width}).to(pt::kCUDA));
    } catch (const pt::CompileError& e) {
      if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
      throw;
    }
    log = cap.str();
  }
  EXPECT_EQ(log.find("runs on the host"), std::string::npos) << log;
  EXPECT_EQ(f.stats().compiles, 1);
  ASSERT_EQ(hook.calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const HookCall& c = hook.calls[i];
    const int64_t width = i == 0 ? 20 : 37;
    EXPECT_EQ(c.shape.x, (std::array<int64_t, 4>{2, 4, 9, width}));
    EXPECT_EQ(c.shape.w, (std::array<int64_t, 4>{6, 2, 3, 3}));
    // H: (9 + 2 - 3) / 2 + 1 = 5; W: (width + 4 - 5) / 1 + 1
    EXPECT_EQ(c.shape.out, (std::array<int64_t, 4>{2, 6, 5, width}));
    EXPECT_EQ(c.stride, (std::array<int64_t, 2>{2, 1}));
    EXPECT_EQ(c.padding, (std::array<int64_t, 2>{1, 2}));
    EXPECT_EQ(c.dilation, (std::array<int64_t, 2>{1, 2}));
    EXPECT_EQ(c.groups, 2);
    EXPECT_TRUE(c.bias);
    EXPECT_TRUE(c.addresses_set);
  }
  // the relu after the conv is a generated kernel, launched once per call after the conv
  EXPECT_EQ(fake.stats().launches, 2) << "one relu launch per call";
}

// A program with cuDNN steps is stored in the program cache: a fresh function in a warm process (the
// artifact cache's memory tier cleared) takes the plan from it and makes the same conv calls, with the
// same parameters, and the same launches.
TEST(CudaFakeDriver, ConvPlansRoundTripThroughTheProgramCache) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-conv-plan-test-{}", ::getpid());
  fs::remove_all(dir);
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  pt::manual_seed(5);
  pt::Tensor w = pt::randn({6, 2, 3, 3}).to(pt::kCUDA), b = pt::randn({6}).to(pt::kCUDA);
  pt::Tensor x = pt::randn({2, 4, 9, 20}).to(pt::kCUDA);
  pt::CompileOptions o;
  o.backend = "cuda";
  o.name = "conv_plan_round_trip";
  std::vector<HookCall> cold, warm;
  try {
    ConvHookScope hook;
    auto f = pt::compile([&](const pt::Tensor& in) { return conv_relu(in, w, b); }, o);
    f(x);
    cold = hook.calls;
  } catch (const pt::CompileError& e) {
    fs::remove_all(dir);
    unsetenv("PROTEAN_CACHE_DIR");
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  const int64_t cold_launches = fake.stats().launches;
  const pt::cache::ProgramCacheStats p0 = pt::cache::program_cache_stats();
  pt::cache::clear_blob_memory_cache();
  {
    ConvHookScope hook;
    auto g = pt::compile([&](const pt::Tensor& in) { return conv_relu(in, w, b); }, o);
    g(x);
    warm = hook.calls;
  }
  EXPECT_EQ(pt::cache::program_cache_stats().hits, p0.hits + 1) << "the plan with a conv step comes from the cache";
  EXPECT_EQ(pt::cache::program_cache_stats().corrupt_entries, p0.corrupt_entries);
  ASSERT_EQ(cold.size(), 1u);
  ASSERT_EQ(warm.size(), 1u);
  EXPECT_EQ(warm[0].shape, cold[0].shape);
  EXPECT_EQ(warm[0].stride, cold[0].stride);
  EXPECT_EQ(warm[0].padding, cold[0].padding);
  EXPECT_EQ(warm[0].dilation, cold[0].dilation);
  EXPECT_EQ(warm[0].groups, cold[0].groups);
  EXPECT_EQ(warm[0].bias, cold[0].bias);
  EXPECT_TRUE(warm[0].addresses_set);
  EXPECT_EQ(fake.stats().launches, 2 * cold_launches) << "the same launches warm as cold";
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

TEST(CudaFakeDriver, ConvWithoutCudnnIsAHostStepNamingWhy) {
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  setenv("PROTEAN_CUDNN", "0", 1);
  pt::manual_seed(4);
  pt::Tensor w = pt::randn({6, 2, 3, 3}).to(pt::kCUDA), b = pt::randn({6}).to(pt::kCUDA);
  pt::CompileOptions o;
  o.backend = "cuda";
  auto f = pt::compile([&](const pt::Tensor& x) { return conv_relu(x, w, b); }, o);
  std::string log;
  {
    pt::observe::LogCapture cap("perf_hints");
    try {
      f(pt::randn({1, 4, 9, 16}).to(pt::kCUDA));
    } catch (const pt::CompileError& e) {
      unsetenv("PROTEAN_CUDNN");
      if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
      throw;
    } catch (const pt::Error&) {  // the host step's copies on the fake driver: only the decision matters here
    }
    log = cap.str();
  }
  unsetenv("PROTEAN_CUDNN");
  EXPECT_NE(log.find("conv2d runs on the host (cuDNN turned off (PROTEAN_CUDNN=0))"), std::string::npos) << log;
}

// ---- on a GPU ----------------------------------------------------------------------------------------

namespace {

std::string dims(const pt::IntVec& v) {
  std::string t;
  for (int64_t d : v) t += (t.empty() ? "" : "x") + std::to_string(d);
  return t;
}

double max_rel_err(const pt::Tensor& got, const pt::Tensor& want) {
  std::vector<double> a = got.cpu().to(pt::DType::F64).contiguous().to_vector<double>();
  std::vector<double> b = want.to(pt::DType::F64).contiguous().to_vector<double>();
  if (a.size() != b.size()) return INFINITY;
  double scale = 0, err = 0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (!std::isnan(a[i])) err = std::max(err, std::abs(a[i] - b[i]));
  }
  return err / std::max(scale, 1e-30);
}

}  // namespace

TEST(CudaGpu, ConvMatchesCpuOnRandomShapes) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  if (std::string why; !bc::cudnn_available(&why)) GTEST_SKIP() << why;
  std::mt19937 rng(24);
  auto pick = [&](std::vector<int64_t> v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t groups = pick({1, 1, 2, 4, 0});  // 0: depthwise
    const int64_t cpg = groups == 0 ? 1 : pick({1, 3, 8});
    const int64_t g = groups == 0 ? pick({8, 16, 32}) : groups;
    const int64_t c = cpg * g, o = g * pick({1, 2, 3});
    const int64_t kh = pick({1, 3, 5}), kw = pick({1, 3, 5});
    const pt::IntVec stride{pick({1, 2}), pick({1, 2})}, dil{pick({1, 1, 2}), pick({1, 2})},
        pad{pick({0, 1, 2}), pick({0, 1, 2})};
    const int64_t h = pick({7, 16, 33}), w = pick({5, 20, 64, 127}), n = pick({1, 2});
    if (h + 2 * pad[0] < dil[0] * (kh - 1) + 1 || w + 2 * pad[1] < dil[1] * (kw - 1) + 1) continue;
    const bool bias = trial % 3 != 0;
    const pt::DType dt = trial % 5 == 4 ? pt::DType::BF16 : trial % 5 == 3 ? pt::DType::F16 : pt::DType::F32;
    const std::string what =
        fmt::format("trial {} {} x[{}, {}, {}, {}] w[{}, {}, {}, {}] stride {}x{} pad {}x{} dil {}x{} groups {} bias {}", trial,
                    pt::short_name(dt), n, c, h, w, o, cpg, kh, kw, stride[0], stride[1], pad[0], pad[1], dil[0], dil[1], g, bias);
    std::fprintf(stderr, "[ cuda conv ] %s\n", what.c_str());  // before the call: a crash names its trial
    pt::manual_seed(static_cast<uint64_t>(100 + trial));
    pt::Tensor x = pt::randn({n, c, h, w}), wt = pt::randn({o, cpg, kh, kw}), b = bias ? pt::randn({o}) : pt::Tensor();
    x = x.to(dt);
    wt = wt.to(dt);
    if (bias) b = b.to(dt);
    pt::Tensor want = pt::conv2d(x.to(pt::DType::F32), wt.to(pt::DType::F32), bias ? b.to(pt::DType::F32) : pt::Tensor(),
                                 stride, pad, dil, g);
    std::fprintf(stderr, "[ cuda conv ] trial %d reference done\n", trial);
    pt::Tensor xd = x.to(pt::kCUDA), wd = wt.to(pt::kCUDA), bd = bias ? b.to(pt::kCUDA) : pt::Tensor();
    pt::CompileOptions opt;
    opt.backend = "cuda";
    opt.name = fmt::format("conv_trial_{}", trial);
    auto f = pt::compile([&](const pt::Tensor& in) { return pt::conv2d(in, wd, bd, stride, pad, dil, g); }, opt);
    pt::Tensor got = f(xd);
    std::fprintf(stderr, "[ cuda conv ] trial %d ran\n", trial);
    const double tol = dt == pt::DType::F32 ? 1e-5 : 2e-2;
    const double e = max_rel_err(got, want);
    EXPECT_LE(e, tol) << what;
    ++checked;
  }
  EXPECT_GE(checked, 30);
  // conv_transpose2d (cuDNN's backward-data convolution): groups, strides, padding, output_padding
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t g = pick({1, 1, 2}), cpg = pick({2, 4}), opg = pick({1, 3});
    const int64_t kh = pick({2, 3}), kw = pick({2, 4}), sh = pick({1, 2}), sw = pick({2, 3});
    const pt::IntVec stride{sh, sw}, pad{pick({0, 1}), 0}, outpad{sh > 1 ? pick({0, 1}) : 0, pick({0, 1})};
    const bool bias = trial % 2 == 0;
    pt::manual_seed(static_cast<uint64_t>(500 + trial));
    pt::Tensor x = pt::randn({pick({1, 2}), g * cpg, pick({5, 16}), pick({7, 20})}), wt = pt::randn({g * cpg, opg, kh, kw});
    pt::Tensor b = bias ? pt::randn({g * opg}) : pt::Tensor();
    pt::Tensor want = pt::conv_transpose2d(x, wt, b, stride, pad, outpad, g);
    pt::Tensor wd = wt.to(pt::kCUDA), bd = bias ? b.to(pt::kCUDA) : pt::Tensor();
    pt::CompileOptions opt;
    opt.backend = "cuda";
    opt.name = fmt::format("conv_transpose_trial_{}", trial);
    auto f = pt::compile([&](const pt::Tensor& in) { return pt::conv_transpose2d(in, wd, bd, stride, pad, outpad, g); }, opt);
    EXPECT_LE(max_rel_err(f(x.to(pt::kCUDA)), want), 1e-5)
        << fmt::format("transposed trial {} x {} w {} stride {}x{} pad {}x{} output_padding {}x{} groups {}", trial,
                       dims(x.int_sizes()), dims(wt.int_sizes()), sh, sw, pad[0], pad[1], outpad[0], outpad[1], g);
  }
  std::printf("[ cuda conv ] %d random convs within tolerance of the cpu kernel; %lld cuDNN plans\n", checked,
              static_cast<long long>(bc::conv_stats().plans));
}

TEST(CudaGpu, ConvThenHardswishKeepsNaNAsEager) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  if (std::string why; !bc::cudnn_available(&why)) GTEST_SKIP() << why;
  pt::manual_seed(9);
  pt::Tensor x = pt::randn({1, 3, 8, 8}), w = pt::randn({4, 3, 3, 3}), b = pt::randn({4});
  std::vector<float> xv = x.to_vector<float>();
  xv[10] = NAN;
  xv[40] = INFINITY;
  x = pt::tensor<float>(xv, {1, 3, 8, 8});
  auto fn = [](const pt::Tensor& in, const pt::Tensor& wt, const pt::Tensor& bt) {
    return pt::hardswish(pt::conv2d(in, wt, bt, {1, 1}, {1, 1}));
  };
  pt::Tensor want = fn(x, w, b);
  pt::Tensor wd = w.to(pt::kCUDA), bd = b.to(pt::kCUDA);
  pt::CompileOptions opt;
  opt.backend = "cuda";
  auto f = pt::compile([&](const pt::Tensor& in) { return fn(in, wd, bd); }, opt);
  EXPECT_LE(max_rel_err(f(x.to(pt::kCUDA)), want), 1e-5);
}

TEST(CudaGpu, PoolingAndNearestResizeMatchEager) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  pt::manual_seed(11);
  pt::Tensor x = pt::randn({2, 5, 37, 51});
  std::vector<float> xv = x.to_vector<float>();
  xv[7] = NAN;  // max_pool2d propagates NaN as eager
  x = pt::tensor<float>(xv, {2, 5, 37, 51});
  using Fn = std::function<pt::Tensor(const pt::Tensor&)>;
  const std::vector<std::pair<std::string, Fn>> cases = {
      {"adaptive_avg_pool2d 1x1", [](const pt::Tensor& t) { return pt::adaptive_avg_pool2d(t, {1, 1}); }},
      {"adaptive_avg_pool2d 3x7", [](const pt::Tensor& t) { return pt::adaptive_avg_pool2d(t, {3, 7}); }},
      {"avg_pool2d 3x2 s2x1 p1x1", [](const pt::Tensor& t) { return pt::avg_pool2d(t, {3, 2}, {2, 1}, {1, 1}); }},
      {"avg_pool2d ceil, no pad count",
       [](const pt::Tensor& t) { return pt::avg_pool2d(t, {3, 3}, {2, 2}, {1, 1}, true, false); }},
      {"max_pool2d 3x3 s2 p1 d1x2", [](const pt::Tensor& t) { return pt::max_pool2d(t, {3, 3}, {2, 2}, {1, 1}, {1, 2}); }},
      {"upsample_nearest2d 2x", [](const pt::Tensor& t) { return pt::upsample_nearest2d(t, {74, 102}); }},
      {"upsample_nearest2d 40x33", [](const pt::Tensor& t) { return pt::upsample_nearest2d(t, {40, 33}); }},
  };
  for (const auto& [label, fn] : cases) {
    pt::CompileOptions opt;
    opt.backend = "cuda";
    opt.name = label;
    auto f = pt::compile(fn, opt);
    std::string log;
    double e;
    {
      pt::observe::LogCapture cap("perf_hints");
      e = max_rel_err(f(x.to(pt::kCUDA)), fn(x));
      log = cap.str();
    }
    EXPECT_LE(e, 1e-6) << label;
    EXPECT_EQ(log.find("runs on the host"), std::string::npos) << label << ": " << log;
  }
}

namespace {

std::string models_dir() {
  const char* env = std::getenv("PROTEAN_MODELS_DIR");
  std::string dir = env ? env : std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/protean/models";
  return std::filesystem::exists(dir + "/ch_PP-OCRv4_rec_infer.onnx") ? dir : "";
}

}  // namespace

TEST(CudaGpu, PpOcrV4RecAndDetMatchTheCpuWithNoHostSteps) {
  if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason();
  const std::string dir = models_dir();
  if (dir.empty()) GTEST_SKIP() << "the PP-OCRv4 models are missing: run scripts/fetch_models.sh (PROTEAN_MODELS_DIR)";
  struct Case {
    const char* file;
    std::vector<pt::IntVec> shapes;
    double tol;
  };
  for (const Case& c : {Case{"ch_PP-OCRv4_rec_infer.onnx", {{1, 3, 48, 80}, {1, 3, 48, 320}, {1, 3, 48, 960}}, 1e-3},
                        Case{"ch_PP-OCRv4_det_infer.onnx", {{1, 3, 320, 320}, {1, 3, 640, 640}}, 1e-3}}) {
    // the reference is the model run eagerly on the CPU (the cpu backend's kernels, without its C++ compile)
    auto cpu_model = pt::onnx::load(dir + "/" + c.file);
    pt::onnx::LoadOptions lo;
    lo.device = pt::kCUDA;
    auto gpu_model = pt::onnx::load(dir + "/" + c.file, lo);
    pt::CompileOptions og;
    og.backend = "cuda";
    og.name = std::string(c.file) + "_cuda";
    auto fg = pt::compile([gpu_model](const pt::Tensor& x) { return gpu_model->forward({x})[0]; }, og);
    std::string log;
    {
      pt::observe::LogCapture cap("perf_hints,graph_breaks");
      for (const pt::IntVec& s : c.shapes) {
        pt::manual_seed(static_cast<uint64_t>(s[3]));
        pt::Tensor x = pt::rand(s);
        const double e = max_rel_err(fg(x.to(pt::kCUDA)), cpu_model->forward({x})[0]);
        std::printf("[ cuda ppocr ] %s %s: max error / max |want| %.3g\n", c.file, dims(s).c_str(), e);
        EXPECT_LE(e, c.tol) << c.file << " " << dims(s);
      }
      log = cap.str();
    }
    EXPECT_EQ(log.find("runs on the host"), std::string::npos) << c.file << ":\n" << log;
    EXPECT_EQ(log.find("graph break"), std::string::npos) << c.file << ":\n" << log;
  }
}

// The PP-OCRv4 models compile for the GPU with every op on it: conv through cuDNN, the rest as
// generated kernels, cuBLASLt products or extern kernels (no host step, no graph break). On the fake
// driver with the conv hook (the products' cuBLASLt calls fail there, after the lowering decision).
TEST(CudaFakeDriver, PpOcrV4RecAndDetHaveNoHostSteps) {
  const std::string dir = models_dir();
  if (dir.empty()) GTEST_SKIP() << "the PP-OCRv4 models are missing: run scripts/fetch_models.sh (PROTEAN_MODELS_DIR)";
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  ConvHookScope hook;
  for (const auto& [file, shape] : {std::pair<const char*, pt::IntVec>{"ch_PP-OCRv4_rec_infer.onnx", {1, 3, 48, 80}},
                                    std::pair<const char*, pt::IntVec>{"ch_PP-OCRv4_det_infer.onnx", {1, 3, 64, 64}}}) {
    pt::onnx::LoadOptions lo;
    lo.device = pt::kCUDA;
    auto m = pt::onnx::load(dir + "/" + file, lo);
    pt::CompileOptions o;
    o.backend = "cuda";
    o.name = file;
    auto f = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
    std::string log;
    {
      pt::observe::LogCapture cap("perf_hints,graph_breaks");
      try {
        f(pt::rand(shape).to(pt::kCUDA));
      } catch (const pt::CompileError& e) {
        if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
        throw;
      } catch (const pt::RuntimeError& e) {  // cuBLASLt on the fake driver
        EXPECT_NE(std::string(e.what()).find("cublasLt"), std::string::npos) << e.what();
      }
      log = cap.str();
    }
    EXPECT_EQ(log.find("runs on the host"), std::string::npos) << file << ":\n" << log;
    EXPECT_EQ(log.find("graph break"), std::string::npos) << file << ":\n" << log;
  }
  EXPECT_GT(hook.calls.size(), 10u) << "the models' convolutions reach cuDNN";
}
