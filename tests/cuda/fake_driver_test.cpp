// The CUDA runtime against the in-process fake driver (device/fake_driver.h): the caching
// allocator's steady state, copies, device tensors, DLPack, eager ops on device tensors, the runner's
// launch plan (argument blocks, variants, grids, buffer plan, host steps) and the cubin cache. No GPU
// needed; these run in CI.
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "backend/async_compile.h"
#include "device/fake_driver.h"
#include "backend/cuda/program.h"
#include "fake_program.h"
#include "backend/cuda/runner.h"
#include "device/runtime.h"
#include "cache/blob_cache.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/tensor.h"
#include "sym/expr.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;

namespace {

std::vector<float> values(const pt::Tensor& t) { return t.to_vector<float>(); }

TEST(CudaFakeDriver, SizeClasses) {
  EXPECT_EQ(drv::allocation_size_class(0), 512u);
  EXPECT_EQ(drv::allocation_size_class(1), 512u);
  EXPECT_EQ(drv::allocation_size_class(513), 1024u);
  EXPECT_EQ(drv::allocation_size_class(1 << 20), size_t{1} << 20);
  EXPECT_EQ(drv::allocation_size_class((1 << 20) + 1), size_t{1} << 20 | size_t{1} << 18);
  // At most 25% slack above 1 MiB.
  for (size_t b : {size_t{3} << 20, size_t{5000000}, size_t{123456789}}) {
    size_t c = drv::allocation_size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(static_cast<double>(c), 1.25 * static_cast<double>(b) + 1);
  }
}

TEST(CudaFakeDriver, CachingAllocatorSteadyStateMakesNoDriverCalls) {
  drv::FakeDriver fake;
  pt::manual_seed(1);
  pt::Tensor h = pt::randn({64, 33});
  // Warm-up call: allocates.
  for (int it = 0; it < 50; ++it) {
    pt::Tensor a = h.to(pt::kCUDA);
    pt::Tensor b = pt::empty({1000, 3}, pt::DType::F32, pt::kCUDA);
    pt::Tensor c = pt::zeros({7}, pt::DType::BF16, pt::kCUDA);
    if (it == 0) {
      ASSERT_EQ(fake.stats().mem_alloc_async, 3);
    }
  }
  EXPECT_EQ(fake.stats().mem_alloc_async, 3) << "steady state must reuse cached blocks";
  EXPECT_EQ(fake.stats().mem_free_async, 0);
  drv::AllocatorStats s = drv::allocator_stats(0);
  EXPECT_EQ(s.requests, 150);
  EXPECT_EQ(s.cache_hits, 147);
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_GT(s.bytes_cached, 0);
  drv::empty_cache(0);
  EXPECT_EQ(fake.stats().mem_free_async, 3);
  EXPECT_EQ(fake.stats().live_blocks, 0);
}

TEST(CudaFakeDriver, OutOfMemoryEmptiesTheCacheAndRetriesOnce) {
  drv::FakeDriver fake;
  { pt::Tensor a = pt::empty({1024}, pt::DType::F32, pt::kCUDA); }  // one cached block of 4 KiB
  fake.fail_next_allocs(1);
  pt::Tensor b = pt::empty({4096}, pt::DType::F32, pt::kCUDA);  // another class: a miss, fails, retried
  EXPECT_EQ(drv::allocator_stats(0).oom_retries, 1);
  EXPECT_EQ(fake.stats().mem_free_async, 1);
  fake.fail_next_allocs(2);
  try {
    pt::Tensor c = pt::empty({1 << 20}, pt::DType::F32, pt::kCUDA);
    FAIL() << "expected an out-of-memory error";
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cuMemAllocAsync"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos) << e.what();
  }
}

TEST(CudaFakeDriver, CopiesRoundTripIncludingStridedViews) {
  drv::FakeDriver fake;
  pt::manual_seed(2);
  pt::Tensor h = pt::randn({5, 7});
  pt::Tensor d = h.to(pt::kCUDA);
  EXPECT_EQ(d.device(), pt::kCUDA);
  EXPECT_EQ(d.impl()->storage->device(), pt::kCUDA);
  EXPECT_EQ(values(d.cpu()), values(h));
  // A transposed view of the device tensor (a view op runs in place on the device).
  pt::Tensor dt = d.transpose(0, 1);
  EXPECT_EQ(dt.device(), pt::kCUDA);
  EXPECT_EQ(dt.impl()->storage.get(), d.impl()->storage.get());
  EXPECT_EQ(values(dt.cpu()), values(h.transpose(0, 1).contiguous()));
  // A slice with an offset.
  pt::Tensor ds = d.slice(0, 2, 4);
  EXPECT_EQ(values(ds.cpu()), values(h.slice(0, 2, 4).contiguous()));
  // bf16 and the factories.
  pt::Tensor z = pt::zeros({3, 3}, pt::DType::BF16, pt::kCUDA);
  for (float v : values(z)) EXPECT_EQ(v, 0.0f);
  pt::Tensor f = pt::full({4}, 2.5, pt::DType::F32, pt::kCUDA);
  for (float v : values(f)) EXPECT_EQ(v, 2.5f);
  pt::manual_seed(3);
  pt::Tensor r1 = pt::randn({16}, pt::DType::F32, pt::kCUDA);
  pt::manual_seed(3);
  pt::Tensor r2 = pt::randn({16});
  EXPECT_EQ(values(r1), values(r2));
  EXPECT_NE(d.str().find("device='cuda:0'"), std::string::npos) << d.str();
  EXPECT_FLOAT_EQ(d.select(0, 1).select(0, 2).item<float>(), h.select(0, 1).select(0, 2).item<float>());
}

// A rank whose model is on cuda:1 and that touches cuda:0 once (its state is made there, which makes
// cuda:0's context current on the thread): the next copy to cuda:1 must still run in cuda:1's
// context. It failed with CUDA_ERROR_INVALID_VALUE on a 2-GPU host, where the cuda backend asked
// for cuda:0's compute capability whatever the graph's device (now the graph's own device).
TEST(CudaFakeDriver, ASecondDeviceKeepsItsContextAfterTheFirstIsTouched) {
  drv::FakeDriver fake;
  fake.set_device_count(2);
  pt::manual_seed(4);
  const pt::Device d1{pt::DeviceType::CUDA, 1};
  pt::Tensor h = pt::randn({5, 7});
  pt::Tensor a = h.to(d1);
  EXPECT_EQ(drv::device_info(0).index, 0);
  pt::Tensor b = h.to(d1);
  EXPECT_EQ(b.device(), d1);
  EXPECT_EQ(values(b.cpu()), values(h));
  EXPECT_EQ(values(a.cpu()), values(h));
  EXPECT_THROW(h.to(pt::Device{pt::DeviceType::CUDA, 2}), pt::RuntimeError);
}

TEST(CudaFakeDriver, NumericsHelpersCopyDeviceTensorsToTheHost) {
  // max_abs_diff and allclose on a device tensor read it through a device-to-host copy (they read
  // device memory directly before, which segfaulted on the H200 in the scenario suite on backend cuda).
  drv::FakeDriver fake;
  pt::Tensor h = pt::randn({5, 7});
  pt::Tensor d = h.to(pt::kCUDA);
  const auto before = fake.stats().dtoh;
  EXPECT_EQ(pt::max_abs_diff(d, h), 0.0);
  EXPECT_EQ(pt::max_abs_diff(h, d), 0.0);
  EXPECT_GE(fake.stats().dtoh, before + 2);
  EXPECT_TRUE(pt::allclose(d, h, 0, 0));
  EXPECT_GT(pt::max_abs_diff(d, h + 1.0), 0.99);
}

TEST(CudaFakeDriver, DlpackCudaInAndOut) {
  drv::FakeDriver fake;
  pt::Tensor h = pt::arange(0, 12, 1, pt::DType::F32).reshape({3, 4});
  pt::Tensor d = h.to(pt::kCUDA);
  DLManagedTensor* m = d.to_dlpack();
  ASSERT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 0);
  EXPECT_EQ(m->dl_tensor.data, d.data_ptr());
  pt::Tensor back = pt::from_dlpack(m);  // takes ownership of m
  EXPECT_EQ(back.device(), pt::kCUDA);
  EXPECT_EQ(back.data_ptr(), d.data_ptr());
  EXPECT_EQ(values(back), values(h));
}

TEST(CudaFakeDriver, EagerOpsRunOnAHostCopyAndSayIt) {
  drv::FakeDriver fake;
  pt::manual_seed(4);
  pt::Tensor a = pt::randn({8, 3}), b = pt::randn({8, 3});
  pt::observe::LogCapture logs("perf_hints");
  pt::Tensor c = a.to(pt::kCUDA).add(b.to(pt::kCUDA));
  EXPECT_EQ(c.device(), pt::kCUDA);
  EXPECT_EQ(values(c), values(a.add(b)));
  EXPECT_NE(logs.str().find("has no eager cuda:0 kernel"), std::string::npos) << logs.str();
  // A CPU 0-dim tensor mixes in; a CPU tensor with dims does not.
  pt::Tensor s = a.to(pt::kCUDA).mul(pt::scalar_tensor(2.0));
  EXPECT_EQ(values(s), values(a.mul(pt::scalar_tensor(2.0))));
  EXPECT_THROW(a.to(pt::kCUDA).add(b), pt::ValueError);
  // clone of a contiguous device tensor stays on the device: one device-to-device copy, no host trip
  pt::Tensor d = a.to(pt::kCUDA);
  const auto before = fake.stats();
  pt::observe::LogCapture clone_logs("perf_hints");
  pt::Tensor e = d.clone();
  EXPECT_EQ(e.device(), pt::kCUDA);
  EXPECT_NE(e.data_ptr(), d.data_ptr());
  EXPECT_EQ(fake.stats().dtod, before.dtod + 1);
  EXPECT_EQ(fake.stats().dtoh, before.dtoh);
  EXPECT_EQ(clone_logs.str().find("has no eager"), std::string::npos) << clone_logs.str();
  EXPECT_EQ(values(e), values(a));
}

TEST(CudaFakeDriver, GuardsNameTheDevice) {
  drv::FakeDriver fake;
  pt::CompileOptions o;
  o.name = "f";
  o.backend = "eager";
  o.arg_names = {"x"};
  auto f = pt::compile([](const pt::Tensor& x) { return x.relu(); }, o);
  pt::observe::LogCapture logs("recompiles");
  pt::Tensor x = pt::randn({4});
  f(x);
  f(x.to(pt::kCUDA));
  EXPECT_NE(logs.str().find("tensor 'x' device mismatch. expected cpu, actual cuda:0"), std::string::npos) << logs.str();
}

// A hand-built program: out = in * 2 by one kernel with two variants, a temp in a slot, and a host
// step (neg) after it: out2 = -tmp.
std::shared_ptr<bc::CudaProgram> scale_program() {
  auto p = std::make_shared<bc::CudaProgram>();
  p->name = "scale";
  p->source = "extern \"C\" __global__ void k0_aligned(...) {}";
  p->cubin = {'f', 'a', 'k', 'e', 0};
  pt::sym::Expr s0 = pt::sym::symbol("s0");
  p->symbols = {s0};
  bc::testing::plan_input_temp_output(*p, s0);
  p->buffers.buffers[2].from_extern = true;  // written by the host step
  p->kernels = {bc::testing::grid_stride_kernel("k0", 0, 1, s0)};
  bc::HostStep h;
  h.ext.op = pt::ops::OpKind::neg;
  h.ext.inputs = {1};
  h.ext.outputs = {2};
  h.reason = "test";
  p->host = {h};
  p->steps = {bc::Step{bc::StepKind::Kernel, 0, {}}, bc::Step{bc::StepKind::Host, 0, {1}}};
  return p;
}

void define_scale(drv::FakeDriver& fake) {
  auto body = [](const drv::FakeLaunch& l) {
    auto* in = reinterpret_cast<const float*>(l.param<uint64_t>(0));
    auto* out = reinterpret_cast<float*>(l.param<uint64_t>(1));
    int64_t n = l.param<int64_t>(2);
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * 2.0f;
  };
  fake.define_kernel("k0_aligned", {8, 8, 8}, body);
  fake.define_kernel("k0_general", {8, 8, 8}, body);
}

TEST(CudaFakeDriver, RunnerLaunchPlanVariantsAndSteadyState) {
  drv::FakeDriver fake;
  define_scale(fake);
  pt::backend::BackendInput in;
  in.symbols = {pt::sym::symbol("s0")};
  in.compile_id = "0/0";
  auto art = bc::make_cuda_artifact(scale_program(), in);
  EXPECT_EQ(fake.stats().module_loads, 1);
  EXPECT_EQ(fake.loaded_images().at(0), "fake");
  for (int64_t n : {1000, 1001, 1000, 1001, 1000}) {
    pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
    auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
    ASSERT_EQ(outs.size(), 1u);
    EXPECT_EQ(outs[0].device(), pt::kCUDA);
    std::vector<float> xv = values(x), ov = values(outs[0]);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ov[static_cast<size_t>(i)], -2.0f * xv[static_cast<size_t>(i)]);
    const drv::FakeLaunch& l = fake.launches().back();
    EXPECT_EQ(l.kernel, n % 4 == 0 ? "k0_aligned" : "k0_general");
    const int64_t per_block = n % 4 == 0 ? 128 * 4 : 128;
    EXPECT_EQ(l.grid[0], static_cast<unsigned>((n + per_block - 1) / per_block));
    EXPECT_EQ(l.block[0], 128u);
    EXPECT_EQ(l.param<uint64_t>(0), reinterpret_cast<uint64_t>(x.data_ptr()));
    EXPECT_EQ(l.param<int64_t>(2), n);
  }
  EXPECT_EQ(fake.stats().launches, 5);
  // Two sizes, each: input, slot, output blocks; the second round of each size allocates nothing.
  const int64_t allocs = fake.stats().mem_alloc_async;
  for (int it = 0; it < 10; ++it) {
    pt::Tensor x = pt::randn({1000}).to(pt::kCUDA);
    art->run({&x, 1}, std::vector<int64_t>{1000});
  }
  EXPECT_EQ(fake.stats().mem_alloc_async, allocs);
  // A CPU input is copied up (and said so).
  pt::observe::LogCapture logs("perf_hints");
  pt::Tensor xc = pt::randn({8});
  auto outs = art->run({&xc, 1}, std::vector<int64_t>{8});
  EXPECT_EQ(values(outs[0]), values(xc.mul(pt::scalar_tensor(-2.0))));
  EXPECT_NE(logs.str().find("copied to cuda:0"), std::string::npos) << logs.str();
}

// A kernel whose entries wait for their prior grids (CudaKernel::waits_for_prior_grids, set by the
// compile from the source text) is launched with programmatic stream serialization on a 9.0 device;
// one that does not, or any kernel with PROTEAN_CUDA_PDL=0, launches plainly. Results are the same.
TEST(CudaFakeDriver, KernelsThatWaitForPriorGridsLaunchProgrammatically) {
  struct Case {
    bool waits;
    const char* env;
    bool programmatic;
  };
  for (const Case c : {Case{true, nullptr, true}, Case{false, nullptr, false}, Case{true, "0", false}}) {
    drv::FakeDriver fake;
    define_scale(fake);
    if (c.env) setenv("PROTEAN_CUDA_PDL", c.env, 1);
    else unsetenv("PROTEAN_CUDA_PDL");
    auto p = scale_program();
    p->kernels[0].waits_for_prior_grids = c.waits;
    pt::backend::BackendInput in;
    in.symbols = {pt::sym::symbol("s0")};
    in.compile_id = "0/0";
    auto art = bc::make_cuda_artifact(p, in);
    unsetenv("PROTEAN_CUDA_PDL");  // read when the artifact is made
    for (int64_t n : {1000, 1001}) {
      pt::Tensor x = pt::randn({n}).to(pt::kCUDA);
      auto outs = art->run({&x, 1}, std::vector<int64_t>{n});
      EXPECT_EQ(values(outs[0]), values(x.mul(pt::scalar_tensor(-2.0))));
      EXPECT_EQ(fake.launches().back().programmatic, c.programmatic) << c.waits << " " << (c.env ? c.env : "");
    }
    EXPECT_EQ(fake.stats().programmatic_launches, c.programmatic ? 2 : 0);
    EXPECT_EQ(fake.stats().launches, 2);
  }
}

TEST(CudaFakeDriver, RunnerSkipsEmptyGridsAndNamesMissingKernels) {
  drv::FakeDriver fake;
  define_scale(fake);
  pt::backend::BackendInput in;
  in.symbols = {pt::sym::symbol("s0")};
  auto art = bc::make_cuda_artifact(scale_program(), in);
  pt::Tensor x = pt::empty({0}, pt::DType::F32, pt::kCUDA);
  auto outs = art->run({&x, 1}, std::vector<int64_t>{0});
  EXPECT_EQ(fake.stats().launches, 0);
  EXPECT_EQ(outs[0].int_numel(), 0);
  auto p = scale_program();
  p->kernels[0].general.entry = "missing_entry";
  try {
    bc::make_cuda_artifact(p, in);
    FAIL();
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("cuModuleGetFunction(missing_entry)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA_ERROR_NOT_FOUND"), std::string::npos) << e.what();
  }
}

// The whole backend with the fake driver: graph → CUDA C → NVRTC (when present) → cubin cache →
// cuModuleLoadData → launches. The fake runs no kernel code, so this checks the plan, not values.
TEST(CudaFakeDriver, BackendCompilesAndLaunchesThroughTheCubinCache) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-cuda-backend-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  pt::cache::reset_blob_cache_stats();
  auto body = [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
    return pt::gelu(pt::layer_norm(x, {x.size(-1)}, w, b));
  };
  for (int process = 0; process < 2; ++process) {
    pt::CompileOptions o;
    o.name = "ln_gelu";
    o.backend = "cuda";
    o.dynamic = pt::Dynamic::On;
    auto f = pt::compile(body, o);
    pt::Tensor x = pt::randn({64, 768}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor w = pt::randn({768}, pt::DType::BF16, pt::kCUDA), b = pt::randn({768}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor y;
    try {
      y = f(x, w, b);
    } catch (const pt::CompileError& e) {
      if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
      throw;
    }
    EXPECT_EQ(y.device(), pt::kCUDA);
    EXPECT_EQ(y.int_sizes(), (pt::IntVec{64, 768}));
    EXPECT_EQ(y.dtype(), pt::DType::BF16);
    ASSERT_GE(fake.stats().launches, 1);
    ASSERT_FALSE(fake.loaded_images().empty());
    EXPECT_EQ(fake.loaded_images().back().substr(0, 4), "\x7f" "ELF");
    pt::cache::clear_blob_memory_cache();  // the next round is "another process": the disk tier
  }
  EXPECT_EQ(pt::cache::blob_cache_stats().misses, 1) << "the second process must compile nothing";
  EXPECT_EQ(pt::cache::blob_cache_stats().disk_hits, 1);
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

// async_compile: the first call runs on the interpreter (host copies of each op, correct values on
// the device) while NVRTC runs on the compile worker; afterwards the cuda artifact launches.
TEST(CudaFakeDriver, AsyncCompileRunsTheInterpreterUntilTheCubinIsBuilt) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-cuda-async-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  pt::CompileOptions o;
  o.name = "async_relu";
  o.backend = "cuda";
  o.async_compile = true;
  auto f = pt::compile([](const pt::Tensor& x) { return pt::add(x.relu(), 1.0); }, o);
  pt::Tensor h = pt::randn({16, 8});
  pt::Tensor x = h.to(pt::kCUDA);
  pt::Tensor y;
  try {
    y = f(x);
  } catch (const pt::CompileError& e) {
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  EXPECT_EQ(y.device(), pt::kCUDA);
  EXPECT_EQ(fake.stats().launches, 0) << "the first call runs on the interpreter";
  EXPECT_EQ(values(y), values(pt::add(h.relu(), 1.0)));
  pt::backend::wait_for_async_compiles();
  f(x);
  EXPECT_GE(fake.stats().launches, 1) << "after the build the cuda artifact launches";
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

TEST(CudaNoDriver, BackendCudaIsACompileErrorAndAutoPicksCpu) {
  if (pt::cuda_is_available()) GTEST_SKIP() << "a CUDA driver and device are present";
  EXPECT_EQ(pt::backend::auto_backend(pt::kCPU), "cpu");
  pt::CompileOptions o;
  o.name = "g";
  o.backend = "cuda";
  auto g = pt::compile([](const pt::Tensor& x) { return x.relu(); }, o);
  try {
    g(pt::randn({3}));
    FAIL() << "expected CompileError";
  } catch (const pt::CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA driver found"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pt::randn({3}).to(pt::kCUDA), pt::RuntimeError);
  EXPECT_EQ(pt::cuda_device_count(), 0);
}

TEST(CudaCubinCache, RoundTripAndCorruption) {
  namespace fs = std::filesystem;
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-cubin-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  pt::cache::reset_blob_cache_stats();
  int builds = 0;
  auto build = [&] {
    ++builds;
    return pt::cache::Blob{0x7f, 'E', 'L', 'F', 1, 2, 3};
  };
  bc::CubinKey key{0x1234, "13.0", "sm_90", "-arch=sm_90", "0.1.0"};
  const uint64_t k = key.combined();
  auto a = pt::cache::get_or_build_blob("cubins", k, "src", "sm_90", build);
  EXPECT_EQ(builds, 1);
  pt::cache::clear_blob_memory_cache();  // a second process: reads the disk
  auto b = pt::cache::get_or_build_blob("cubins", k, "src", "sm_90", build);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(*a, *b);
  EXPECT_EQ(pt::cache::blob_cache_stats().disk_hits, 1);
  // Another arch is another key.
  bc::CubinKey other = key;
  other.arch = "sm_90a";
  EXPECT_NE(other.combined(), k);
  // Corrupt the blob: reported, rebuilt, then valid again.
  const std::string bin = fmt::format("{}/cubins/{:016x}.bin", dir, k);
  {
    std::fstream f(bin, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2);
    f.put('X');
  }
  pt::cache::clear_blob_memory_cache();
  {
    pt::observe::LogCapture logs("");
    auto c = pt::cache::get_or_build_blob("cubins", k, "src", "sm_90", build);
    EXPECT_EQ(builds, 2);
    EXPECT_EQ(*c, *a);
    EXPECT_NE(logs.str().find("corrupt cubins entry"), std::string::npos) << logs.str();
  }
  EXPECT_EQ(pt::cache::blob_cache_stats().corrupt_entries, 1);
  // Truncated .json: corrupt too.
  std::ofstream(fmt::format("{}/cubins/{:016x}.json", dir, k)) << "{\"key\":";
  pt::cache::clear_blob_memory_cache();
  EXPECT_EQ(pt::cache::find_blob("cubins", k, "src"), nullptr);
  EXPECT_EQ(pt::cache::blob_cache_stats().corrupt_entries, 2);
  // A .json without its blob (another process between its two renames, or killed there): a plain
  // miss, not reported; the build completes the entry.
  fs::remove(bin);
  pt::cache::clear_blob_memory_cache();
  {
    pt::observe::LogCapture logs("");
    auto d = pt::cache::get_or_build_blob("cubins", k, "src", "sm_90", build);
    EXPECT_EQ(builds, 3);
    EXPECT_EQ(logs.str().find("corrupt"), std::string::npos) << logs.str();
  }
  EXPECT_EQ(pt::cache::blob_cache_stats().corrupt_entries, 2);
  pt::cache::clear_blob_memory_cache();
  EXPECT_NE(pt::cache::find_blob("cubins", k, "src"), nullptr);
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}

}  // namespace

namespace {
// A user's own causal scaled_dot_product_attention on device bf16 [1, 12, L, 64] tensors under the
// default automatic dynamic (L becomes a symbol at the second length; batch, heads and head dim stay
// static): the fused attention kernel takes it (no host step), two compiles for three lengths.
// Under Dynamic::On every dim is a symbol: the size-1 batch dims of q, k and v are guarded equal (one
// symbol in the graph) and the head dim is specialized on a GPU, so the fused kernel takes it too.
TEST(CudaFakeDriver, StandaloneCausalAttentionIsOneFusedKernel) {
  namespace fs = std::filesystem;
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-cuda-sdpa-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  for (const pt::Dynamic dyn : {pt::Dynamic::Auto, pt::Dynamic::On}) {
  SCOPED_TRACE(dyn == pt::Dynamic::On ? "dynamic=On" : "automatic dynamic");
  pt::CompileOptions o;
  o.name = "causal_attention";
  o.backend = "cuda";
  o.dynamic = dyn;
  auto f = pt::compile([](const pt::Tensor& q, const pt::Tensor& k, const pt::Tensor& v) {
    return pt::scaled_dot_product_attention(q, k, v, {}, true);
  }, o);
  std::string log;
  {
    pt::observe::LogCapture cap("perf_hints,graph_breaks,output_code");
    for (int64_t L : {37, 128, 512}) {
      pt::Tensor q = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
      pt::Tensor k = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
      pt::Tensor v = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
      try {
        pt::Tensor y = f(q, k, v);
        EXPECT_EQ(y.int_sizes(), (pt::IntVec{1, 12, L, 64}));
      } catch (const pt::CompileError& e) {
        if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
        throw;
      }
    }
    log = cap.str();
  }
  EXPECT_EQ(log.find("runs on the host"), std::string::npos) << log;
  EXPECT_NE(log.find("extern scaled_dot_product_attention:"), std::string::npos) << "the fused kernel's text";
  EXPECT_LE(f.stats().compiles, dyn == pt::Dynamic::On ? 1 : 2);
  }
  fs::remove_all(dir);
  unsetenv("PROTEAN_CACHE_DIR");
}
}  // namespace
