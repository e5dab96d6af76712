// The cuda backend on a real GPU: device tensors, the caching allocator with the real driver, and
// compiled functions (generated kernels, cuBLASLt steps, host steps) against the eager CPU result
// in float64. Skipped without a CUDA driver and device (CI); bench/gpu/run.sh runs them on the GPU
// machine, and the CudaGpuSmall.* subset under compute-sanitizer memcheck.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/blas.h"
#include "backend/cuda/hopper_gemm.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "ops/dispatch.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace pt = protean;
namespace drv = protean::cuda;

namespace {

#define REQUIRE_GPU()                                                                   \
  do {                                                                                  \
    if (!pt::cuda_is_available()) GTEST_SKIP() << "no CUDA device: " << drv::driver_unavailable_reason(); \
  } while (0)

// ‖out − ref‖ / ‖ref‖ in float64; NaN fails.
double rel_err(const pt::Tensor& out, const pt::Tensor& ref) {
  std::vector<double> o = out.to_vector<double>(), r = ref.to_vector<double>();
  EXPECT_EQ(o.size(), r.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < o.size() && i < r.size(); ++i) {
    if (std::isnan(o[i]) != std::isnan(r[i])) return INFINITY;
    if (std::isnan(o[i])) continue;
    num += (o[i] - r[i]) * (o[i] - r[i]);
    den += r[i] * r[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

pt::Tensor f64(const pt::Tensor& t) { return t.cpu().to(pt::DType::F64); }

bool same_bits(const pt::Tensor& a, const pt::Tensor& b) {
  const pt::Tensor ca = a.cpu().contiguous(), cb = b.cpu().contiguous();
  return ca.sizes() == cb.sizes() && ca.dtype() == cb.dtype() &&
         std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.int_numel()) * ca.itemsize()) == 0;
}

std::string fmt_name(bool causal, bool four_d) {
  return std::string("sdpa_backward") + (causal ? "_causal" : "") + (four_d ? "_4d" : "_3d");
}

TEST(CudaGpuSmall, DeviceTensorsAndAllocator) {
  REQUIRE_GPU();
  pt::manual_seed(0);
  pt::Tensor h = pt::randn({1000, 37});
  pt::Tensor d = h.to(pt::kCUDA);
  EXPECT_EQ(d.cpu().to_vector<float>(), h.to_vector<float>());
  EXPECT_EQ(d.transpose(0, 1).cpu().to_vector<float>(), h.transpose(0, 1).contiguous().to_vector<float>());
  for (int i = 0; i < 3; ++i) pt::Tensor t = pt::empty({4096, 4096}, pt::DType::BF16, pt::kCUDA);
  drv::reset_allocator_stats(0);
  for (int i = 0; i < 100; ++i) pt::Tensor t = pt::empty({4096, 4096}, pt::DType::BF16, pt::kCUDA);
  EXPECT_EQ(drv::allocator_stats(0).driver_allocs, 0);
  pt::Tensor z = pt::zeros({5, 5}, pt::DType::BF16, pt::kCUDA);
  for (float v : z.to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

struct Case {
  const char* name;
  std::function<pt::Tensor(const std::vector<pt::Tensor>&)> body;
  std::function<std::vector<pt::Tensor>(int64_t n)> inputs;
  double tol;
};

/// `mark_max` > 0: the first input's last dim is mark_dynamic(…, 2, mark_max) (an upper bound the
/// cuda policy keeps rows in registers for; the launch sizes each block to the row).
void check_case(const Case& c, pt::Dynamic dyn, std::initializer_list<int64_t> sizes, int64_t mark_max = 0) {
  pt::CompileOptions o;
  o.name = c.name;
  o.backend = "cuda";
  o.dynamic = dyn;
  auto f = pt::compile([&](const pt::Tensor& a, const pt::Tensor& b, const pt::Tensor& e) { return c.body({a, b, e}); }, o);
  for (int64_t n : sizes) {
    std::vector<pt::Tensor> in = c.inputs(n);
    std::vector<pt::Tensor> dev, ref;
    for (const auto& t : in) {
      dev.push_back(t.to(pt::kCUDA));
      ref.push_back(f64(t));
    }
    if (mark_max > 0) pt::mark_dynamic(dev[0], dev[0].dim() - 1, 2, mark_max);
    pt::Tensor out = f(dev[0], dev[1], dev[2]);
    ASSERT_EQ(out.device(), pt::kCUDA) << c.name;
    pt::Tensor expect = c.body(ref);
    const double err = rel_err(out.cpu(), expect);
    EXPECT_LT(err, c.tol) << c.name << " at n=" << n << " dtype " << pt::short_name(in[0].dtype());
  }
}

std::vector<Case> cases(pt::DType dt) {
  auto rnd = [dt](pt::IntVec s) { return pt::randn(s, dt); };
  const double tol = dt == pt::DType::F32 ? 1e-5 : 1e-2;
  return {
      {"pointwise", [](const std::vector<pt::Tensor>& v) { return pt::add(pt::mul(v[0], v[1]), pt::exp(v[2])); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({n, 33}), rnd({33}), rnd({n, 33})}; }, tol},
      {"ln_gelu",
       [](const std::vector<pt::Tensor>& v) { return pt::gelu(pt::layer_norm(v[0], {v[0].size(-1)}, v[1], v[2])); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({64, n}), rnd({n}), rnd({n})}; }, tol},
      {"softmax", [](const std::vector<pt::Tensor>& v) { return pt::add(pt::softmax(v[0], -1), v[1]); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({17, n}), rnd({n}), rnd({1})}; }, tol},
      {"sum_rows", [](const std::vector<pt::Tensor>& v) { return pt::add(v[0].sum({1}), v[1]); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({9, n}), rnd({9}), rnd({1})}; }, tol * 10},
      {"matmul", [](const std::vector<pt::Tensor>& v) { return pt::matmul(v[0], v[1]); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({n, 64}), rnd({64, 48}), rnd({1})}; }, tol * 10},
      {"linear_bias_gelu",
       [](const std::vector<pt::Tensor>& v) { return pt::gelu(pt::linear(v[0], v[1], v[2]), "tanh"); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({n, 96}), rnd({40, 96}), rnd({40})}; }, tol * 10},
  };
}

TEST(CudaGpuSmall, CompiledF32StaticAndDynamic) {
  REQUIRE_GPU();
  pt::manual_seed(1);
  for (const Case& c : cases(pt::DType::F32)) {
    check_case(c, pt::Dynamic::Off, {64});
    check_case(c, pt::Dynamic::On, {64, 37, 200});
  }
}

TEST(CudaGpu, CompiledBf16DynamicSizes) {
  REQUIRE_GPU();
  pt::manual_seed(2);
  for (const Case& c : cases(pt::DType::BF16)) check_case(c, pt::Dynamic::On, {64, 128, 37, 511, 1024});
}

TEST(CudaGpu, CompiledBf16MarkedBoundsRowsOnChip) {
  REQUIRE_GPU();
  pt::manual_seed(3);
  for (const Case& c : cases(pt::DType::BF16))
    if (std::string(c.name) == "ln_gelu" || std::string(c.name) == "softmax")
      check_case(c, pt::Dynamic::On, {4096, 1000, 8192, 40, 4095}, 8192);
}

// The fused attention kernel (backend/cuda/attention.h) against the eager f64 reference of the same
// bf16 inputs, over lengths that are not multiples of the 64-row tiles: an additive mask broadcast
// over batch and heads (a causal -inf upper triangle plus random values), is_causal computed from the
// indices, no mask; head dims 64, 32 and 128; f16 too.
TEST(CudaGpu, FusedAttentionMatchesF64Reference) {
  REQUIRE_GPU();
  pt::manual_seed(5);
  for (pt::DType dt : {pt::DType::BF16, pt::DType::F16}) {
    auto rnd = [dt](pt::IntVec s) { return pt::randn(s, dt); };
    auto causal_mask = [dt](int64_t n) {
      pt::Tensor m = pt::mul(pt::randn({1, 1, n, n}), pt::full({}, 0.5));
      pt::Tensor keep = pt::le(pt::arange(n).reshape({1, n}), pt::arange(n).reshape({n, 1}));
      return pt::where(keep, m, pt::full({}, -INFINITY)).to(dt);
    };
    std::vector<Case> cs = {
        {"attn_mask",
         [](const std::vector<pt::Tensor>& v) { return pt::scaled_dot_product_attention(v[0], v[1], v[1], v[2]); },
         [=](int64_t n) { return std::vector<pt::Tensor>{rnd({2, 3, n, 64}), rnd({2, 3, n, 64}), causal_mask(n)}; }, 2e-2},
        {"attn_causal",
         [](const std::vector<pt::Tensor>& v) {
           return pt::scaled_dot_product_attention(v[0], v[1], v[2], {}, true);
         },
         [=](int64_t n) { return std::vector<pt::Tensor>{rnd({1, 4, n, 32}), rnd({1, 4, n, 32}), rnd({1, 4, n, 32})}; }, 2e-2},
        {"attn_plain",
         [](const std::vector<pt::Tensor>& v) { return pt::scaled_dot_product_attention(v[0], v[1], v[2], {}, false, 0.1); },
         [=](int64_t n) { return std::vector<pt::Tensor>{rnd({3, n, 128}), rnd({3, n, 128}), rnd({3, n, 128})}; }, 2e-2},
    };
    // 520: more key tiles than pipeline stages, so every buffer is refilled
    for (const Case& c : cs) check_case(c, pt::Dynamic::On, {64, 37, 200, 1, 130, 520});
  }
}

// The attention kernel's Hopper form (PROTEAN_CUDA_ATTENTION_WGMMA=2 and 4: warp-group MMAs, the
// program compiled for sm_90a) against the eager f64 reference: head dim 64 causal in bf16 (GPT-2's
// heads), plain in f16 with more keys than queries, lengths around the 64-row query tiles and past
// several key tiles of 128 and 256 keys (1000). Skipped below or above compute capability 9.0.
TEST(CudaGpu, HopperAttentionMatchesF64Reference) {
  REQUIRE_GPU();
  const drv::DeviceInfo& info = drv::device_info(0);
  if (info.cc_major != 9 || info.cc_minor != 0) GTEST_SKIP() << "warp-group MMAs need compute capability 9.0";
  pt::manual_seed(13);
  auto rnd = [](pt::IntVec s, pt::DType dt) { return pt::randn(s, dt); };
  const pt::DType bf = pt::DType::BF16, h = pt::DType::F16;
  std::vector<Case> cs = {
      {"attn_wgmma_causal",
       [](const std::vector<pt::Tensor>& v) { return pt::scaled_dot_product_attention(v[0], v[1], v[2], {}, true); },
       [=](int64_t n) { return std::vector<pt::Tensor>{rnd({1, 12, n, 64}, bf), rnd({1, 12, n, 64}, bf), rnd({1, 12, n, 64}, bf)}; },
       2e-2},
      {"attn_wgmma_plain",
       [](const std::vector<pt::Tensor>& v) { return pt::scaled_dot_product_attention(v[0], v[1], v[2], {}, false, 0.1); },
       [=](int64_t n) {
         return std::vector<pt::Tensor>{rnd({2, 3, n, 64}, h), rnd({2, 3, 2 * n + 5, 64}, h), rnd({2, 3, 2 * n + 5, 64}, h)};
       },
       2e-2},
  };
  for (const char* groups : {"2", "4"}) {
    setenv("PROTEAN_CUDA_ATTENTION_WGMMA", groups, 1);
    for (const Case& c : cs) check_case(c, pt::Dynamic::On, {64, 37, 200, 1, 130, 520, 1000});
    unsetenv("PROTEAN_CUDA_ATTENTION_WGMMA");
  }
}

// cumsum's block scan (one block per line, chunks of 256): lines shorter and longer than a chunk,
// along the last dim and along a middle one (strided lines), f32 and an integer input (cast to f32
// for the comparison: exact below 2^24).
TEST(CudaGpu, CumsumScanMatchesEager) {
  REQUIRE_GPU();
  pt::manual_seed(6);
  std::vector<Case> cs = {
      {"cumsum_last", [](const std::vector<pt::Tensor>& v) { return pt::add(pt::cumsum(v[0], -1), v[1]); },
       [](int64_t n) { return std::vector<pt::Tensor>{pt::randn({3, n}), pt::zeros({1}), pt::zeros({1})}; }, 1e-5},
      {"cumsum_mid", [](const std::vector<pt::Tensor>& v) { return pt::add(pt::cumsum(v[0], 1), v[1]); },
       [](int64_t n) { return std::vector<pt::Tensor>{pt::randn({2, n, 5}), pt::zeros({1}), pt::zeros({1})}; }, 1e-5},
      {"cumsum_int",
       [](const std::vector<pt::Tensor>& v) {
         return pt::add(pt::cumsum(pt::gt(v[0], v[2]), 1).to(pt::DType::F32), v[1]);
       },
       [](int64_t n) { return std::vector<pt::Tensor>{pt::randn({2, n}), pt::zeros({1}), pt::zeros({1})}; }, 1e-7},
  };
  for (const Case& c : cs) check_case(c, pt::Dynamic::On, {1, 37, 256, 257, 700});
}

// The indexing externs' kernels (embedding as index_select, gather, scatter_add, index_add) against
// the eager CPU kernels on the same f32 inputs: 0, 1 and many rows, the first and the last index of
// the dim in every index tensor, many duplicates for the adds. The adds run in index order, one f32
// rounding per add like the eager kernels, so every result is expected bit-equal.
TEST(CudaGpu, IndexingKernelsMatchEager) {
  REQUIRE_GPU();
  pt::manual_seed(7);
  constexpr int64_t V = 37, E = 24;
  auto ends = [](pt::Tensor idx, int64_t len) {  // first element 0, last element len - 1
    std::vector<int64_t> v = idx.to_vector<int64_t>();
    if (!v.empty()) v.front() = 0, v.back() = len - 1;
    return pt::tensor<int64_t>(v, idx.int_sizes());
  };
  using Body = std::function<pt::Tensor(const std::vector<pt::Tensor>&)>;
  using Inputs = std::function<std::vector<pt::Tensor>(int64_t)>;
  const std::vector<std::tuple<const char*, Body, Inputs>> cs = {
      {"embedding", [](const std::vector<pt::Tensor>& v) { return pt::embedding(v[0], v[1]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({V, E}), ends(pt::randint(0, V, {n, 3}), V)}; }},
      {"gather_last", [](const std::vector<pt::Tensor>& v) { return pt::gather(v[0], 1, v[1]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({n, V}), ends(pt::randint(0, V, {n, 2}), V)}; }},
      {"gather_mid", [](const std::vector<pt::Tensor>& v) { return pt::gather(v[0], 1, v[1]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({2, n + 1, 5}), ends(pt::randint(0, n + 1, {2, 3, 5}), n + 1)}; }},
      {"scatter_add", [](const std::vector<pt::Tensor>& v) { return pt::scatter_add(v[0], 1, v[1], v[2]); },
       [&](int64_t n) {
         return std::vector<pt::Tensor>{pt::randn({n, V}), ends(pt::randint(0, V, {n, 50}), V), pt::randn({n, 50})};
       }},
      // index sizes apart from the input's outside dim (torch allows smaller): the coordinate-walking kernels
      {"gather_short", [](const std::vector<pt::Tensor>& v) { return pt::gather(v[0], 1, v[1]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({n + 2, V}), ends(pt::randint(0, V, {n, 3}), V)}; }},
      {"scatter_add_short", [](const std::vector<pt::Tensor>& v) { return pt::scatter_add(v[0], 1, v[1], v[2]); },
       [&](int64_t n) {
         return std::vector<pt::Tensor>{pt::randn({n + 2, V}), ends(pt::randint(0, V, {n, 40}), V), pt::randn({n + 1, 50})};
       }},
      // ONNX Gather's negative indices (index_select's wrap_negative), -V .. V - 1
      {"index_select_wrap", [](const std::vector<pt::Tensor>& v) { return pt::index_select(v[0], 0, v[1], true); },
       [&](int64_t n) {
         return std::vector<pt::Tensor>{pt::randn({V, E}), pt::sub(ends(pt::randint(0, 2 * V, {n}), 2 * V), pt::scalar_tensor(V, pt::DType::I64))};
       }},
      // a position lookup: index_select of arange(0, n) is a slice of the table (ir/passes/range_gather.h)
      {"position_lookup",
       [](const std::vector<pt::Tensor>& v) {
         return pt::add(v[1], pt::index_select(v[0], 0, pt::arange(0, v[1].size(0), 1, pt::DType::I64)));
       },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({3001, E}), pt::randn({n, E})}; }},
      {"index_add", [](const std::vector<pt::Tensor>& v) { return pt::index_add(v[0], 0, v[1], v[2]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({V, E}), ends(pt::randint(0, V, {n}), V), pt::randn({n, E})}; }},
      {"index_add_wide", [](const std::vector<pt::Tensor>& v) { return pt::index_add(v[0], 0, v[1], v[2]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({V, 300}), ends(pt::randint(0, V, {n}), V), pt::randn({n, 300})}; }},
      {"index_add_mid", [](const std::vector<pt::Tensor>& v) { return pt::index_add(v[0], 1, v[1], v[2]); },
       [&](int64_t n) { return std::vector<pt::Tensor>{pt::randn({3, V, 4}), ends(pt::randint(0, V, {n}), V), pt::randn({3, n, 4})}; }},
  };
  for (const auto& [name, body, inputs] : cs) {
    pt::CompileOptions o;
    o.name = name;
    o.backend = "cuda";
    o.dynamic = pt::Dynamic::On;
    auto f = pt::compile([&](const pt::Tensor& a, const pt::Tensor& b, const pt::Tensor& c) { return body({a, b, c}); }, o);
    for (int64_t n : {int64_t{1}, int64_t{0}, int64_t{2}, int64_t{300}, int64_t{3000}}) {
      std::vector<pt::Tensor> in = inputs(n);
      if (in.size() == 2) in.push_back(pt::zeros({1}));  // unused third argument
      std::vector<pt::Tensor> dev;
      for (const pt::Tensor& t : in) dev.push_back(t.to(pt::kCUDA));
      const pt::Tensor out = f(dev[0], dev[1], dev[2]);
      ASSERT_EQ(out.device(), pt::kCUDA) << name;
      const pt::Tensor expect = body(in);
      EXPECT_EQ(out.int_sizes(), expect.int_sizes()) << name << " n=" << n;
      EXPECT_EQ(out.cpu().to_vector<float>(), expect.to_vector<float>()) << name << " n=" << n;
    }
  }
}

// index_add at a GPT-2-sized vocabulary (the embedding's backward: 50257 x 768 rows, 512 tokens with
// repeats): the tiled kernel adds in index order, so the result equals the eager kernel's bit for bit.
// The steady time per call is printed (not checked): one thread per element read the 512 indices for
// each of the 38.6 M elements.
TEST(CudaGpu, IndexAddAtAVocabularyOf50kMatchesEager) {
  REQUIRE_GPU();
  pt::manual_seed(11);
  constexpr int64_t V = 50257, E = 768, N = 512;
  pt::CompileOptions o;
  o.name = "index_add_vocab";
  o.backend = "cuda";
  auto f = pt::compile([](const pt::Tensor& w, const pt::Tensor& idx, const pt::Tensor& src) {
    return pt::index_add(w, 0, idx, src);
  }, o);
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < N; ++j) ids.push_back((j * 7919) % 211 + (j % 3 == 0 ? 50000 : 0));  // repeats, both ends
  ids.back() = V - 1;
  const pt::Tensor w = pt::zeros({V, E}), idx = pt::tensor<int64_t>(ids, {N}), src = pt::randn({N, E});
  const pt::Tensor wd = w.to(pt::kCUDA), id = idx.to(pt::kCUDA), sd = src.to(pt::kCUDA);
  const pt::Tensor out = f(wd, id, sd);
  EXPECT_EQ(out.cpu().to_vector<float>(), pt::index_add(w, 0, idx, src).to_vector<float>());
  std::vector<double> ms;
  for (int k = 0; k < 7; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)pt::select(pt::select(f(wd, id, sd), 0, 0), 0, 0).cpu();  // waits for the kernel, copies 4 bytes
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  std::printf("index_add 50257x768 by 512 indices: median %.3f ms per call (to the result on the device), worst %.3f\n",
              ms[3], ms.back());
}

// scaled_dot_product_attention_backward in f32 (autograd's op for self-attention shapes, decomposed
// on the cuda backend into cuBLASLt products and loop kernels) against the eager CPU kernel: causal
// and not, an explicit scale, lengths 1, 2, 37, 130 (dynamic), a 3-D and a 4-D batch.
TEST(CudaGpu, AttentionBackwardF32MatchesEager) {
  REQUIRE_GPU();
  pt::manual_seed(8);
  for (bool causal : {true, false})
    for (bool four_d : {true, false}) {
      pt::CompileOptions o;
      o.name = fmt_name(causal, four_d);
      o.backend = "cuda";
      o.dynamic = pt::Dynamic::On;
      pt::ops::Attrs a;
      a.set("is_causal", causal);
      if (!four_d) a.set("scale", 0.3);
      auto body = [a](const pt::Tensor& g, const pt::Tensor& q, const pt::Tensor& k, const pt::Tensor& v) {
        return pt::ops::call1(pt::ops::OpKind::scaled_dot_product_attention_backward, {g, q, k, v}, a);
      };
      auto f = pt::compile(body, o);
      for (int64_t n : {int64_t{37}, int64_t{1}, int64_t{2}, int64_t{130}}) {
        const pt::IntVec shape = four_d ? pt::IntVec{2, 3, n, 32} : pt::IntVec{4, n, 16};
        const pt::Tensor g = pt::randn(shape), q = pt::randn(shape), k = pt::randn(shape), v = pt::randn(shape);
        const pt::Tensor out = f(g.to(pt::kCUDA), q.to(pt::kCUDA), k.to(pt::kCUDA), v.to(pt::kCUDA));
        ASSERT_EQ(out.device(), pt::kCUDA);
        const pt::Tensor expect = body(g, q, k, v);
        EXPECT_EQ(out.int_sizes(), expect.int_sizes());
        EXPECT_LT(rel_err(out.cpu(), expect), 1e-5) << o.name << " n=" << n;
      }
    }
}

TEST(CudaGpu, CublasLtIsLoaded) {
  REQUIRE_GPU();
  std::string why;
  EXPECT_TRUE(pt::backend::cuda::cublaslt_available(&why)) << why;
}

// Many more rows than one wave of blocks, rows kept in registers (marked bounds): every row, not only
// the first wave's, matches the reference.
TEST(CudaGpu, RowKernelsComputeEveryRowOfManyWaves) {
  REQUIRE_GPU();
  pt::CompileOptions o;
  o.name = "row_loop_ln_gelu";
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  auto f = pt::compile([](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
    return pt::gelu(pt::layer_norm(x, {x.size(-1)}, w, b));
  }, o);
  pt::manual_seed(5);
  for (int64_t rows : {20000, 7001}) {
    pt::Tensor x = pt::add(pt::randn({rows, 1024}, pt::DType::BF16), pt::full({rows, 1}, 3.0, pt::DType::BF16));
    pt::Tensor w = pt::randn({1024}, pt::DType::BF16), b = pt::randn({1024}, pt::DType::BF16);
    pt::Tensor dx = x.to(pt::kCUDA);
    pt::mark_dynamic(dx, 0, 1, 65536);
    pt::mark_dynamic(dx, 1, 2, 4096);
    const pt::Tensor out = f(dx, w.to(pt::kCUDA), b.to(pt::kCUDA)).cpu();
    const pt::Tensor ref = pt::gelu(pt::layer_norm(f64(x), {1024}, f64(w), f64(b)));
    // per row: the last rows are the ones later loop iterations computed
    for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
      const double err = rel_err(out.select(0, r).to(pt::DType::F64), ref.select(0, r));
      EXPECT_LT(err, 1e-2) << "row " << r << " of " << rows;
    }
    EXPECT_LT(rel_err(out, ref), 1e-2) << rows << " rows";
  }
}

// Generated products (hopper_gemm.h) of depth k and width n against cuBLASLt and a float64 reference:
// W [n, k] (linear, K-major) and W [k, n] (matmul, N-major), with a bias, GELU's tanh form or a
// residual in the epilogue, at row counts of one and of two row tiles, one of them partial
// (PROTEAN_CUDA_GENERATED_PRODUCTS=1 against =0 in each case). On a device other than compute
// capability 9.0 only the cuBLASLt side runs (no generated launch is expected).
void check_generated_products(int64_t k, int64_t n, uint64_t seed) {
  namespace cb = pt::backend::cuda;
  const drv::DeviceInfo& info = drv::device_info(0);
  const bool hopper = info.cc_major == 9 && info.cc_minor == 0;
  const auto bf = pt::DType::BF16;
  pt::manual_seed(seed);
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(k));
  const pt::Tensor w_nk = pt::mul(pt::randn({n, k}, bf), w_scale), w_kn = pt::mul(pt::randn({k, n}, bf), w_scale);
  const pt::Tensor bias = pt::randn({n}, bf);
  struct Case {
    const char* name;
    std::function<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)> fn;
  };
  const std::vector<Case> cases = {
      {"linear_bias", [](auto& x, auto& wnk, auto&, auto& b, auto&) { return pt::linear(x, wnk, b); }},
      {"matmul", [](auto& x, auto&, auto& wkn, auto&, auto&) { return pt::matmul(x, wkn); }},
      {"matmul_bias_gelu", [](auto& x, auto&, auto& wkn, auto& b, auto&) { return pt::gelu(pt::add(pt::matmul(x, wkn), b), "tanh"); }},
      {"linear_residual", [](auto& x, auto& wnk, auto&, auto& b, auto& r) { return pt::add(pt::linear(x, wnk, b), r); }},
      {"matmul_residual", [](auto& x, auto&, auto& wkn, auto&, auto& r) { return pt::add(pt::matmul(x, wkn), r); }},
  };
  for (const Case& c : cases)
    for (int64_t m : {1, 37, 64, 100, 128}) {
      SCOPED_TRACE(fmt::format("{} at {} rows, k = {}, n = {}", c.name, m, k, n));
      const pt::Tensor x = pt::randn({m, k}, bf), r = pt::randn({m, n}, bf);
      const pt::Tensor expect = c.fn(f64(x), f64(w_nk), f64(w_kn), f64(bias), f64(r));
      std::vector<pt::Tensor> got;
      for (const char* on : {"1", "0"}) {
        setenv("PROTEAN_CUDA_GENERATED_PRODUCTS", on, 1);
        pt::CompileOptions o;
        o.name = fmt::format("gp_{}_{}_{}_{}", c.name, m, k, on);
        o.backend = "cuda";
        auto f = pt::compile(c.fn, o);
        const int64_t before = cb::generated_product_launches();
        got.push_back(f(x.to(pt::kCUDA), w_nk.to(pt::kCUDA), w_kn.to(pt::kCUDA), bias.to(pt::kCUDA), r.to(pt::kCUDA)).cpu());
        const int64_t launched = cb::generated_product_launches() - before;
        EXPECT_EQ(launched, std::string(on) == "1" && hopper ? 1 : 0);
      }
      unsetenv("PROTEAN_CUDA_GENERATED_PRODUCTS");
      EXPECT_LT(rel_err(got[0], expect), 1e-2);
      EXPECT_LT(rel_err(got[1], expect), 1e-2);
      EXPECT_LT(rel_err(got[0], got[1]), 8e-3) << "generated against cuBLASLt";
    }
}

TEST(CudaGpu, GeneratedProductsMatchCublasLtAndFloat64) {
  REQUIRE_GPU();
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "0", 1);  // whole K (the split: below)
  check_generated_products(256, 192, 11);
  unsetenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K");
}

// K deeper than 1024 (GPT-2's FC2: k = 3072, n = 768) splits over a cluster of 4 blocks, each of
// which adds up a quarter of the tile's rows from all four (PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K=1):
// the same cases, including the residual FC2 carries; with =2 also a product of at most 16 column
// tiles and k = 768 (GPT-2's output projection), and FC2 again.
TEST(CudaGpu, SplitKGeneratedProductsMatchCublasLtAndFloat64) {
  REQUIRE_GPU();
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "1", 1);
  check_generated_products(3072, 768, 13);
  setenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K", "2", 1);
  check_generated_products(768, 768, 14);
  check_generated_products(3072, 768, 15);
  check_generated_products(256, 192, 16);  // one 64-deep step a block
  check_generated_products(512, 128, 17);  // two
  unsetenv("PROTEAN_CUDA_GENERATED_PRODUCTS_SPLIT_K");
}

// Generated products over many tiles: GPT-2's QKV shape (k = 768: more k steps than the ring's 8
// stages; n = 2304: 36 column tiles, more blocks than multiprocessors from 4 row tiles on) at row
// counts up to PROTEAN_CUDA_GENERATED_PRODUCT_ROWS (128 by default; bench/gpu runs it with 512), every
// row against cuBLASLt. Names the first row that differs and how many do.
TEST(CudaGpu, GeneratedProductsOverManyTilesMatchCublasLtInEveryRow) {
  REQUIRE_GPU();
  namespace cb = pt::backend::cuda;
  const drv::DeviceInfo& info = drv::device_info(0);
  if (info.cc_major != 9 || info.cc_minor != 0) GTEST_SKIP() << "generated products need compute capability 9.0";
  const auto bf = pt::DType::BF16;
  pt::manual_seed(12);
  const pt::Tensor w = pt::mul(pt::randn({768, 2304}, bf), 0.04), bias = pt::randn({2304}, bf);
  auto fn = [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) { return pt::add(pt::matmul(x, w), b); };
  const pt::Tensor dw = w.to(pt::kCUDA), db = bias.to(pt::kCUDA);
  for (int64_t m : {64, 128, 150, 200, 320, 512}) {
    if (m > cb::generated_product_max_rows()) continue;
    SCOPED_TRACE(fmt::format("{} rows", m));
    const pt::Tensor x = pt::randn({m, 768}, bf).to(pt::kCUDA);
    std::vector<pt::Tensor> got;
    for (const char* on : {"1", "0"}) {
      setenv("PROTEAN_CUDA_GENERATED_PRODUCTS", on, 1);
      pt::CompileOptions o;
      o.name = fmt::format("gp_tiles_{}_{}", m, on);
      o.backend = "cuda";
      auto f = pt::compile(fn, o);
      const int64_t before = cb::generated_product_launches();
      got.push_back(f(x, dw, db).cpu().to(pt::DType::F32));
      EXPECT_EQ(cb::generated_product_launches() - before, std::string(on) == "1" ? 1 : 0);
    }
    unsetenv("PROTEAN_CUDA_GENERATED_PRODUCTS");
    const pt::Tensor diff = pt::amax(pt::abs(pt::sub(got[0], got[1])), {1}, false);  // per row
    const pt::Tensor scale = pt::add(pt::amax(pt::abs(got[1]), {1}, false), 1.0);
    const std::vector<float> d = diff.to_vector<float>(), sc = scale.to_vector<float>();
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; r < m; ++r)
      if (d[static_cast<size_t>(r)] > 0.02 * sc[static_cast<size_t>(r)]) {
        if (first < 0) first = r;
        ++bad;
      }
    EXPECT_EQ(bad, 0) << "first differing row " << first << " (|difference| " << (first >= 0 ? d[static_cast<size_t>(first)] : 0.f)
                      << ")";
  }
}

// A LayerNorm folded into the generated product that reads it (program.h: LayerNormPrologue): GPT-2's
// ln_1 -> c_attn (matmul, W [768, 2304], a bias) and ln_2 -> c_fc (linear, W [n, k], a bias and GELU's
// tanh form), the weights and the LayerNorm's constants captured (graph constants), rows whose mean is
// far from 0. Plain calls at 1..128 rows against the same program with PROTEAN_CUDA_FOLD_LAYER_NORM=0
// (the LayerNorm kernel, then the generated product reading its output) and a float64 reference; in
// reduce-overhead, several sizes of two buckets, each bit-equal to the plain folded call of its size,
// the recordings leaving the LayerNorm kernel out.
TEST(CudaGpu, LayerNormFoldedIntoTheGeneratedProductMatches) {
  REQUIRE_GPU();
  namespace cb = pt::backend::cuda;
  const drv::DeviceInfo& info = drv::device_info(0);
  if (info.cc_major != 9 || info.cc_minor != 0) GTEST_SKIP() << "generated products need compute capability 9.0";
  const auto bf = pt::DType::BF16;
  struct Case {
    const char* name;
    int64_t k, n;
    bool linear;
  };
  for (const Case& c : {Case{"qkv", 768, 2304, false}, Case{"fc_gelu", 256, 512, true}}) {
    pt::manual_seed(31);
    const pt::Tensor gamma = pt::add(pt::mul(pt::randn({c.k}), 0.3), 1.0), beta = pt::mul(pt::randn({c.k}), 0.2);
    const pt::Tensor w = pt::mul(c.linear ? pt::randn({c.n, c.k}, bf) : pt::randn({c.k, c.n}, bf), 1.0 / std::sqrt(double(c.k)));
    const pt::Tensor bias = pt::mul(pt::randn({c.n}, bf), 0.1);
    const pt::Tensor dg = gamma.to(pt::kCUDA), db = beta.to(pt::kCUDA), dw = w.to(pt::kCUDA), dbias = bias.to(pt::kCUDA);
    const int64_t K = c.k;
    const bool linear = c.linear;
    auto body = [=](const pt::Tensor& x) {
      pt::Tensor h = pt::layer_norm(x.to(pt::DType::F32), {K}, dg, db, 1e-5).to(pt::DType::BF16);
      if (linear) return pt::gelu(pt::linear(h, dw, dbias), "tanh");
      return pt::add(pt::matmul(h, dw), dbias);
    };
    auto reference = [&](const pt::Tensor& x) {
      pt::Tensor h = pt::layer_norm(f64(x), {K}, f64(gamma), f64(beta), 1e-5);
      if (linear) return pt::gelu(pt::add(pt::matmul(h, f64(w).transpose(0, 1)), f64(bias)), "tanh");
      return pt::add(pt::matmul(h, f64(w)), f64(bias));
    };
    auto compiled = [&](const auto& fn, const char* what, const char* fold, const char* mode) {
      setenv("PROTEAN_CUDA_FOLD_LAYER_NORM", fold, 1);
      pt::CompileOptions o;
      o.name = fmt::format("{}_{}_{}_{}", what, c.name, fold, mode);
      o.backend = "cuda";
      o.dynamic = pt::Dynamic::On;
      o.mode = mode;
      return pt::compile(fn, o);
    };
    auto folded = compiled(body, "ln_fold", "1", "default");
    auto unfolded = compiled(body, "ln_fold", "0", "default");
    for (int64_t m : {1, 37, 64, 100, 128}) {
      SCOPED_TRACE(fmt::format("{} at {} rows", c.name, m));
      const pt::Tensor x = pt::add(pt::randn({m, c.k}, bf), pt::full({m, 1}, 4.0, bf));
      const pt::Tensor dx = x.to(pt::kCUDA);
      const int64_t before = cb::generated_product_launches();
      setenv("PROTEAN_CUDA_FOLD_LAYER_NORM", "1", 1);
      const pt::Tensor a = folded(dx).cpu();
      EXPECT_EQ(cb::generated_product_launches() - before, 1);
      setenv("PROTEAN_CUDA_FOLD_LAYER_NORM", "0", 1);
      const pt::Tensor u = unfolded(dx).cpu();
      const pt::Tensor ref = reference(x);
      EXPECT_LT(rel_err(a, ref), 1e-2) << "folded against float64";
      EXPECT_LT(rel_err(u, ref), 1e-2) << "LayerNorm kernel, then the product, against float64";
      EXPECT_LT(rel_err(a, u), 8e-3) << "folded against the LayerNorm kernel";
    }
    // reduce-overhead: x made by a generated product before it (a kernel node, so the folded product
    // hangs on a programmatic edge) and the output read by a kernel after it (temporaries of the
    // bucket's arena, as in GPT-2; an input or output operand keeps a product a plain call outside the
    // graph, and the LayerNorm then stays a kernel node): the
    // recording leaves the LayerNorm out, and replays equal plain folded calls bit for bit
    const pt::Tensor w0 = pt::mul(pt::randn({c.k, c.k}, bf), 1.0 / std::sqrt(double(c.k))).to(pt::kCUDA);
    const pt::Tensor b0 = pt::add(pt::randn({c.k}, bf), pt::full({c.k}, 3.0, bf)).to(pt::kCUDA);  // rows' mean near 3
    const pt::Tensor w2 = pt::mul(pt::randn({c.n, c.k}, bf), 1.0 / std::sqrt(double(c.n))).to(pt::kCUDA);
    // the stream s = x w0 + b0 read again by the last product's residual (so the first product stores it,
    // as GPT-2's residual stream), the folded product's output read by tanh (a temporary too)
    auto body2 = [=](const pt::Tensor& x) {
      const pt::Tensor st = pt::add(pt::matmul(pt::tanh(x), w0), b0);
      return pt::add(pt::matmul(pt::tanh(body(st)), w2), st);
    };
    pt::observe::LogCapture logs("graphs");
    auto graphed = compiled(body2, "ln_fold2", "1", "reduce-overhead");
    auto plain = compiled(body2, "ln_fold2", "1", "default");
    for (int64_t m : {40, 64, 50, 100, 128, 70}) {
      SCOPED_TRACE(fmt::format("{} at {} rows, reduce-overhead", c.name, m));
      const pt::Tensor x = pt::randn({m, c.k}, bf);
      const pt::Tensor dx = x.to(pt::kCUDA);
      const pt::Tensor g1 = graphed(dx).cpu(), g2 = graphed(dx).cpu(), p = plain(dx).cpu();
      EXPECT_TRUE(same_bits(g2, p)) << "replay against the plain folded call";
      EXPECT_TRUE(same_bits(g1, g2));
      const pt::Tensor h = pt::add(pt::matmul(f64(pt::tanh(f64(x)).to(bf)), f64(w0)), f64(b0)).to(bf);  // rounded as computed
      EXPECT_LT(rel_err(p, pt::add(pt::matmul(pt::tanh(reference(h)), f64(w2)), f64(h))), 2e-2);
    }
    unsetenv("PROTEAN_CUDA_FOLD_LAYER_NORM");
    EXPECT_NE(logs.str().find("1 LayerNorm kernel(s) folded into their products"), std::string::npos) << logs.str();
  }
}

// The warm-up runs every signature the algorithm table holds (here at least the one this test's
// matmul added) on scratch memory, and leaves compiled calls' results as they were.
TEST(CudaGpu, CublasLtWarmUpRunsTheTablesSignaturesAndChangesNoResult) {
  REQUIRE_GPU();
  pt::CompileOptions o;
  o.name = "warmup_matmul";
  o.backend = "cuda";
  auto f = pt::compile([](const pt::Tensor& a, const pt::Tensor& b) { return pt::matmul(a, b); }, o);
  pt::manual_seed(3);
  pt::Tensor a = pt::randn({96, 64}, pt::DType::BF16), b = pt::randn({64, 48}, pt::DType::BF16);
  const pt::Tensor expect = pt::matmul(f64(a), f64(b));
  pt::Tensor da = a.to(pt::kCUDA), db = b.to(pt::kCUDA);
  EXPECT_LT(rel_err(f(da, db).cpu(), expect), 1e-2);
  pt::backend::cuda::wait_for_blas_prewarm();
  const int ran = pt::backend::cuda::prewarm_blas(0);
  if (std::getenv("PROTEAN_PROGRAM_CACHE") && std::string(std::getenv("PROTEAN_PROGRAM_CACHE")) == "0")
    EXPECT_EQ(ran, 0);
  else
    EXPECT_GE(ran, 1);
  EXPECT_LT(rel_err(f(da, db).cpu(), expect), 1e-2);
}

}  // namespace
