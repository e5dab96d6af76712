// The cpu backend: generated kernels vs the interp backend on symbolic sizes (fixed programs, random
// programs), fusion shape of softmax / layer_norm+gelu, externs, views, decompositions, golden codegen.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "backend/cpu/codegen.h"
#include "backend/cpu/pipeline.h"
#include "backend/interp/interp.h"
#include "cache/kernel_cache.h"
#include "cpu_test_util.h"
#include "ir/printer.h"
#include "ir_test_util.h"
#include "observe/log.h"
#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu {
namespace {

using namespace loop;  // the loop IR the cpu backend renders

using ir::kNoValue;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::check;
using testing::compile;
using testing::Compiled;
using testing::expect_close;
using testing::use_test_cache_dir;
using testing::build_random;
using testing::RandomProgram;

TEST(CpuBackend, RegisteredInTheBackendRegistry) {
  EXPECT_TRUE(has_backend("cpu"));
  use_test_cache_dir();
  GraphBuilder b("reg");
  ValueId x = b.input("x", {3, 4});
  ValueId y = b.call(OpKind::exp, {x});
  auto g = std::make_shared<const ir::Graph>(std::move(b.done({y})));
  auto art = make_artifact("cpu", BackendInput{g, {}, "0/0", "default"});
  Tensor xt = randn({3, 4});
  auto out = art->run(std::vector<Tensor>{xt}, {});
  expect_close(out[0], exp(xt), "exp");
}

TEST(CpuBackend, PointwiseChainWithBroadcastingIsOneKernel) {
  manual_seed(1);
  GraphBuilder b("pw");
  SymInt s0 = b.symbol("x.size()[0]", 5), s1 = b.symbol("x.size()[1]", 7);
  ValueId x = b.input("x", {s0, s1});
  ValueId y = b.input("y", {s1});
  ValueId z = b.input("z", {s0, 1});
  ValueId a = b.call(OpKind::add, {x, y});
  ValueId m = b.call(OpKind::mul, {a, z});
  ValueId t = b.call(OpKind::tanh, {m});
  ValueId two = b.constant(scalar_tensor(2.0));
  ValueId q = b.call(OpKind::div, {t, two});
  ValueId r = b.call(OpKind::relu, {q});
  ValueId gt = b.call(OpKind::gt, {r, y});
  Compiled c = compile(b, {r, gt}, {s0, s1});
  EXPECT_EQ(c.info.kernels, 1);  // both outputs' fused chains in one loop nest (horizontal fusion)
  EXPECT_EQ(c.info.schedule.horizontal_fusions, 1);
  EXPECT_EQ(c.info.externs, 0);
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{5, 7}, {2, 3}, {33, 129}, {0, 4}}) {
    check(c, {randn({n0, n1}), randn({n1}), randn({n0, 1})}, {n0, n1}, fmt::format("{}x{}", n0, n1));
  }
}

// x / d and x * (1 / d) can differ by one unit in the last place: 264.666656f / 88.2222214f is
// exactly 3, times the rounded reciprocal of the divisor it is 2.99999976. Under floor (remainder,
// floor division, quantization) that is an error of a whole unit, so the scheduler keeps a division
// below a rounding-sensitive operation exact; a division by a computed value (here a graph input)
// stays exact everywhere, and one by a constant (x / 4, exact either way) is rewritten.
TEST(CpuBackend, DivisionUnderFloorStaysExact) {
  GraphBuilder b("floor_div");
  SymInt s0 = b.symbol("x.size()[0]", 64);
  ValueId x = b.input("x", {s0});
  ValueId d = b.input("d", {});
  ValueId e = b.input("e", {});
  ValueId f = b.call(OpKind::floor, {b.call(OpKind::div, {x, d})});
  ValueId rem = b.call(OpKind::sub, {x, b.call(OpKind::mul, {b.call(OpKind::floor, {b.call(OpKind::div, {x, d})}), d})});
  ValueId plain = b.call(OpKind::div, {x, e});
  ValueId quarter = b.call(OpKind::div, {x, b.constant(scalar_tensor(4.0f))});
  Compiled c = compile(b, {f, rem, plain, quarter}, {s0});
  EXPECT_EQ(c.info.schedule.reciprocal_divisions, 1);
  const int64_t n = 67;  // a vector body and a tail
  std::vector<float> xs(static_cast<size_t>(n), 264.666656f);
  const std::vector<Tensor> in{tensor(xs, {n}), tensor(std::vector<float>{88.2222214f}, {}),
                               tensor(std::vector<float>{3.0f}, {})};
  auto out = c.cpu->run(in, std::vector<int64_t>{n});
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(out[0].data_ptr<float>()[i], 3.0f) << "floor(x / d) at " << i;
    ASSERT_EQ(out[1].data_ptr<float>()[i], 264.666656f - 3.0f * 88.2222214f) << "remainder at " << i;
  }
  check(c, in, {n}, "floor division");
}

// The prelude's vectorizable f32 exp, erf, tanh and gelu's normal CDF against double-precision <cmath>
// on a dense grid, with inf / NaN / signed-zero / subnormal cases. (docs/cpu.md has the errors
// measured over every float; the bounds here leave a small margin above them.)
TEST(CpuBackend, F32ExpAndErfAreAccurate) {
  GraphBuilder b("exp_erf");
  SymInt s0 = b.symbol("x.size()[0]", 16);
  ValueId x = b.input("x", {s0});
  ValueId e = b.call(OpKind::exp, {x});
  ValueId f = b.call(OpKind::erf, {x});
  ValueId t = b.call(OpKind::tanh, {x});
  ValueId g = b.call(OpKind::gelu, {x}, {{"approximate", std::string("none")}});
  Compiled c = compile(b, {e, f, t, g}, {s0});
  std::vector<float> xs;
  for (double v = -110.0; v <= 110.0; v += 1.0 / 512) xs.push_back(static_cast<float>(v));
  for (double v = -1.0; v <= 1.0; v += 1.0 / 65536) xs.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, 88.72f, 88.73f, -87.4f, -103.9f, 1e30f, -1e30f,
                  INFINITY, -INFINITY, NAN})
    xs.push_back(v);
  const auto n = static_cast<int64_t>(xs.size());
  auto out = c.cpu->run(std::vector<Tensor>{tensor(xs, {n})}, std::vector<int64_t>{n});
  const float* pe = out[0].data_ptr<float>();
  const float* pf = out[1].data_ptr<float>();
  const float* pt = out[2].data_ptr<float>();
  const float* pg = out[3].data_ptr<float>();
  double exp_rel = 0, erf_abs = 0, tanh_rel = 0, cdf_abs = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xs[static_cast<size_t>(i)], we = std::exp(v), wf = std::erf(v), wt = std::tanh(v);
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(pe[i]) && std::isnan(pf[i]) && std::isnan(pt[i]) && std::isnan(pg[i]));
      continue;
    }
    if (we > 3.4028235e38) EXPECT_EQ(pe[i], INFINITY) << v;
    else if (we > 1.2e-38) exp_rel = std::max(exp_rel, std::abs(pe[i] - we) / we);
    else EXPECT_LE(std::abs(pe[i] - we), 1.5e-45) << v;  // subnormal results: within one unit of 2^-149
    erf_abs = std::max(erf_abs, std::abs(pf[i] - wf));
    if (wt != 0) tanh_rel = std::max(tanh_rel, std::abs(pt[i] - wt) / std::abs(wt));
    EXPECT_EQ(std::signbit(pt[i]), std::signbit(v)) << v;
    // gelu = x * Phi(x): the error of Phi, recovered from the product (|x| >= 1e-3 only)
    if (std::abs(v) >= 1e-3 && std::isfinite(v)) {
      const double phi = 0.5 * std::erfc(-v / std::sqrt(2.0));
      cdf_abs = std::max(cdf_abs, std::abs(pg[i] - v * phi) / std::abs(v));
    }
  }
  EXPECT_LT(exp_rel, 1.2e-7);  // 1 ulp
  EXPECT_LT(erf_abs, 5e-7);
  EXPECT_LT(tanh_rel, 2.4e-7);  // 2 ulp
  EXPECT_LT(cdf_abs, 2.2e-7);  // 1.6e-7 over every float, plus the rounding of x * Phi(x)
  const int64_t k = n - 3;  // +inf, -inf, NaN are the last three
  EXPECT_EQ(pe[k], INFINITY);
  EXPECT_EQ(pe[k + 1], 0.0f);
  EXPECT_EQ(pt[k], 1.0f);
  EXPECT_EQ(pt[k + 1], -1.0f);
  EXPECT_EQ(pf[k], 1.0f);
  EXPECT_EQ(pf[k + 1], -1.0f);
  EXPECT_EQ(pg[k], INFINITY);
  EXPECT_TRUE(std::isnan(pg[k + 1]));  // -inf * Phi(-inf) = -inf * 0, as in eager
}

// Kernel libraries are dlopen'ed side by side in one process. A symbol of type STB_GNU_UNIQUE (what
// g++ makes of an inline variable, such as a prelude table written `inline constexpr`) is bound
// process-wide to the first library that defines it, so a later library would silently read an
// earlier one's data. No compiled kernel library may define one (`nm -D` shows them as "u").
TEST(CpuBackend, KernelLibrariesShareNoUniqueSymbols) {
  GraphBuilder b("unique_symbols");
  SymInt s0 = b.symbol("x.size()[0]", 16);
  ValueId x = b.input("x", {s0});
  ValueId g = b.call(OpKind::gelu, {x}, {{"approximate", std::string("none")}});
  ValueId e = b.call(OpKind::exp, {g});
  Compiled c = compile(b, {g, e}, {s0});
  const char* dir = std::getenv("PROTEAN_CACHE_DIR");
  ASSERT_NE(dir, nullptr);
  int libraries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(dir) / "kernels")) {
    if (entry.path().extension() != ".so") continue;
    ++libraries;
    const std::string cmd = "nm -D --defined-only '" + entry.path().string() + "' 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr) << cmd;
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    ASSERT_EQ(pclose(p), 0) << cmd << ":\n" << out;
    std::istringstream lines(out);
    for (std::string line; std::getline(lines, line);)
      EXPECT_EQ(line.find(" u "), std::string::npos) << entry.path() << " defines a unique symbol: " << line;
  }
  EXPECT_GE(libraries, 1);
}

TEST(CpuBackend, SoftmaxBecomesOneKernelOverRows) {
  manual_seed(2);
  GraphBuilder b("softmax");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 4096});
  ValueId y = b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}});
  Compiled c = compile(b, {y}, {s0});
  EXPECT_EQ(c.info.kernels, 1) << c.info.loop_ir;
  EXPECT_EQ(c.info.loop_ir.find("slot"), std::string::npos) << "no temporary buffer expected:\n" << c.info.loop_ir;
  for (int64_t n : {1, 3, 8, 65}) check(c, {randn({n, 4096}) * 5}, {n}, std::to_string(n));
  // NaN propagates through max like eager
  Tensor xn = randn({2, 4096});
  xn.data_ptr<float>()[5] = NAN;
  check(c, {xn}, {2}, "nan");
}

TEST(CpuBackend, LoopInvariantScalarsAreComputedOnceBeforeTheLoop) {
  // A compiled optimizer's shape: a pointwise chain over a large arena scaled by f64 scalars from a
  // hyperparameter vector (pow of the step count, 1 - beta). Computing them per vector step made the
  // AdamW update 10x slower than its memory traffic.
  manual_seed(4);
  GraphBuilder b("invariant");
  SymInt s0 = b.symbol("x.size()[0]", 4096);
  ValueId x = b.input("x", {s0}), g = b.input("g", {s0}), h = b.input("h", {3}, DType::F64);
  ValueId beta = b.call(OpKind::select, {h}, {{"dim", SymInt(0)}, {"index", SymInt(0)}});
  ValueId t = b.call(OpKind::select, {h}, {{"dim", SymInt(0)}, {"index", SymInt(1)}});
  ValueId bc = b.call(OpKind::cast, {b.call(OpKind::pow, {beta, t})}, {{"dtype", DType::F32}});
  ValueId y = b.call(OpKind::add, {b.call(OpKind::mul, {x, bc}), g});
  Compiled c = compile(b, {y}, {s0});
  const std::string code = generate_kernels(c.cpu->program());
  const size_t pow_at = code.find("pt::powf_"), loop_at = code.find("for (");
  ASSERT_NE(pow_at, std::string::npos) << code;
  EXPECT_LT(pow_at, loop_at) << "pow of the hyperparameters is computed inside the loop:\n" << code;
  EXPECT_EQ(code.find("pt::powf_", pow_at + 1), std::string::npos) << "computed more than once:\n" << code;
  for (int64_t n : {0, 1, 17, 4096}) {
    Tensor hv = tensor<double>({0.999, 3.0, 0.0}, {3});
    check(c, {randn({n}), randn({n}), hv}, {n}, std::to_string(n));
  }
}

TEST(CpuBackend, LayerNormGeluIsOneKernel) {
  manual_seed(3);
  GraphBuilder b("ln_gelu");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 512});
  ValueId w = b.input("w", {512});
  ValueId bb = b.input("b", {512});
  ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{512}}, {"eps", 1e-5}});
  ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  Compiled c = compile(b, {g}, {s0});
  EXPECT_EQ(c.info.kernels, 1) << c.info.loop_ir;
  for (int64_t r : {1, 4, 17}) check(c, {randn({r, 512}) * 3 + 1, randn({512}), randn({512})}, {r}, std::to_string(r));
}

// An output larger than stream_store_min_bytes() is written around the caches (pt::vst_stream) where
// no stage of its kernel reads it back: a row kernel (layer_norm + gelu) and a fused pointwise kernel,
// at a row length whose rows start 64-byte aligned (every vector store streamed) and at one whose rows
// do not (streamed and ordinary stores mixed, by address), and below the size (ordinary stores).
TEST(CpuBackend, OutputsLargerThanTheCachesAreStreamedAndMatchTheInterpreter) {
  const int64_t min_bytes = stream_store_min_bytes();
  if (min_bytes > (int64_t{64} << 20)) GTEST_SKIP() << "streaming starts at " << min_bytes << " bytes here";
  manual_seed(31);
  GraphBuilder b("streamed");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 4096);
  ValueId x = b.input("x", {s0, s1});
  ValueId w = b.input("w", {s1});
  ValueId bb = b.input("b", {s1});
  ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
  ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  ValueId affine = b.call(OpKind::add, {b.call(OpKind::mul, {x, w}), bb});
  Compiled c = compile(b, {g, affine}, {s0, s1});
  const std::string code = generate_kernels(c.cpu->program());
  size_t streamed = 0;
  for (size_t at = code.find("pt::vst_stream("); at != std::string::npos; at = code.find("pt::vst_stream(", at + 1)) ++streamed;
  EXPECT_EQ(streamed, 2u) << "one streamed store per kernel:\n" << code;
  EXPECT_NE(code.find("if (pt_stream) pt::stream_fence();"), std::string::npos) << code;
  for (int64_t cols : {4096, 4100}) {
    const int64_t rows = min_bytes / (4 * cols) + 3;
    for (int64_t r : {rows, int64_t{5}}) {
      Tensor xt = randn({r, cols}) * 3 + 1;
      xt.data_ptr<float>()[cols + 7] = NAN;  // a NaN row keeps its NaN through the streamed store
      check(c, {xt, randn({cols}), randn({cols})}, {r, cols}, fmt::format("{}x{}", r, cols));
    }
  }
  // Static sizes: a constant work of that size takes the lambda form and streams; a small one keeps
  // the plain parallel loop and ordinary stores.
  for (const int64_t rows : {min_bytes / (4 * 4100) + 3, int64_t{64}}) {
    GraphBuilder sb("streamed_static");
    ValueId sx = sb.input("x", {rows, 4100});
    ValueId sw = sb.input("w", {4100});
    ValueId sbias = sb.input("b", {4100});
    ValueId sn = sb.call(OpKind::layer_norm, {sx, sw, sbias}, {{"normalized_shape", SymIntVec{4100}}, {"eps", 1e-5}});
    ValueId sg = sb.call(OpKind::gelu, {sn}, {{"approximate", std::string("none")}});
    Compiled sc = compile(sb, {sg}, {});
    const std::string scode = generate_kernels(sc.cpu->program());
    // at least the size and not below the parallel threshold (131072 elements), where the loop is serial
    // (under PROTEAN_CPU_STREAM_BYTES=1 the 64 rows stream too)
    const bool large = rows * 4100 >= std::max<int64_t>((min_bytes + 3) / 4, 131072);
    EXPECT_EQ(scode.find("pt::vst_stream(") != std::string::npos, large) << scode;
    EXPECT_EQ(scode.find("auto run = [B, S, pt_stream]()") != std::string::npos, large) << scode;
    Tensor xt = randn({rows, 4100}) * 3 + 1;
    check(sc, {xt, randn({4100}), randn({4100})}, {}, fmt::format("static {}x4100", rows));
  }
}

TEST(CpuBackend, StreamStoreBytesAreADecimalNumber) {
  EXPECT_EQ(parse_stream_store_bytes("0"), 0);
  EXPECT_EQ(parse_stream_store_bytes("16777216"), 16777216);
  EXPECT_EQ(parse_stream_store_bytes("1125899906842624"), int64_t{1} << 50);
  for (const char* bad : {"", "-1", "16M", "1.5", " 1", "1125899906842625", "11258999068426239", "99999999999999999999"}) {
    try {
      parse_stream_store_bytes(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("PROTEAN_CPU_STREAM_BYTES"), std::string::npos) << e.what();
    }
  }
}

// A transformer's residual stream x + y1 + y2 + ..., each y a projection (an extern) and each partial
// sum read by a LayerNorm and by the next add: inlined into every LayerNorm it read one more buffer
// per layer (GPT-2 small: 25 at its last layer). A sum read by a row reduction that loads more than
// one buffer is stored; here the cpu backend folds it into the product (a post-op), so each
// LayerNorm reads one sum (the cuda backend stores it from the LayerNorm's kernel:
// CudaPipeline.AResidualStreamIsStoredByTheLayerNormThatReadsIt).
TEST(CpuBackend, AResidualStreamIsStoredByTheLayerNormThatReadsIt) {
  manual_seed(12);
  GraphBuilder b("residual_stream");
  SymInt s0 = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {s0, 64});
  ValueId w = b.input("w", {64, 64});
  ValueId g = b.input("g", {64});
  auto ln = [&](ValueId v) {
    return b.call(OpKind::layer_norm, {v, g, kNoValue}, {{"normalized_shape", SymIntVec{64}}, {"eps", 1e-5}});
  };
  ValueId r = x;
  for (int i = 0; i < 8; ++i) r = b.call(OpKind::add, {r, b.call(OpKind::tanh, {b.call(OpKind::matmul, {ln(r), w})})});
  Compiled c = compile(b, {ln(r)}, {s0});
  const loop::Program& p = c.cpu->program();
  for (const loop::Kernel& k : p.kernels) {
    std::set<int> read;
    for (const loop::Stage& st : k.stages) {
      std::function<void(const loop::SExpr&)> walk = [&](const loop::SExpr& e) {
        if (e->op == loop::SOp::Load) read.insert(e->buffer);
        for (const auto& a : e->args) walk(a);
      };
      walk(st.body);
    }
    EXPECT_LE(read.size(), 4u) << k.name << " reads " << read.size() << " buffers:\n" << c.info.loop_ir;
  }
  EXPECT_EQ(c.info.kernels, 9) << "one kernel per LayerNorm:\n" << c.info.loop_ir;
  for (int64_t n : {1, 5, 33}) check(c, {randn({n, 64}), mul(randn({64, 64}), 0.2), randn({64})}, {n}, std::to_string(n));
}

TEST(CpuBackend, ExternOpsRunThroughEagerKernels) {
  manual_seed(4);
  GraphBuilder b("ext");
  SymInt s0 = b.symbol("x.size()[0]", 3);
  ValueId x = b.input("x", {s0, 16});
  ValueId w = b.input("w", {16, 8});
  ValueId h = b.call(OpKind::matmul, {x, w});
  ValueId r = b.call(OpKind::relu, {h});
  ValueId img = b.input("img", {1, 3, 10, 10});
  ValueId k = b.input("k", {4, 3, 3, 3});
  ValueId cv = b.call(OpKind::conv2d, {img, k, kNoValue},
                      {{"stride", SymIntVec{1, 1}}, {"padding", SymIntVec{1, 1}}, {"dilation", SymIntVec{1, 1}}, {"groups", SymInt(1)}});
  ValueId cs = b.call(OpKind::sigmoid, {cv});
  ValueId mp = b.call(OpKind::max_pool2d, {cs}, {{"kernel_size", SymIntVec{2, 2}}, {"stride", SymIntVec{2, 2}},
                                                 {"padding", SymIntVec{0, 0}}, {"dilation", SymIntVec{1, 1}}, {"ceil_mode", false}});
  ValueId idx = b.input("idx", {5}, DType::I64);
  ValueId emb = b.call(OpKind::index_select, {x, idx}, {{"dim", SymInt(0)}});
  ValueId cum = b.call(OpKind::cumsum, {r}, {{"dim", SymInt(1)}});
  Compiled c = compile(b, {r, mp, emb, cum}, {s0});
  EXPECT_GE(c.info.externs, 4);
  for (int64_t n : {3, 6}) {
    Tensor ix = tensor<int64_t>({0, 1, 2, 1, 0}, {5});
    check(c, {randn({n, 16}), randn({16, 8}), randn({1, 3, 10, 10}), randn({4, 3, 3, 3}), ix}, {n}, std::to_string(n));
  }
}

TEST(CpuBackend, ViewsAreIndexArithmetic) {
  manual_seed(5);
  GraphBuilder b("views");
  SymInt s0 = b.symbol("x.size()[0]", 6);
  std::optional<sym::ShapeEnvScope> scope(std::in_place, b.env);
  ValueId x = b.input("x", {s0, 4, 8});
  ValueId p = b.call(OpKind::permute, {x}, {{"dims", SymIntVec{2, 0, 1}}});                // [8, s0, 4]
  ValueId sl = b.call(OpKind::slice, {p}, {{"dim", SymInt(0)}, {"start", SymInt(1)}, {"end", SymInt(7)}, {"step", SymInt(2)}});  // [3, s0, 4]
  ValueId se = b.call(OpKind::select, {sl}, {{"dim", SymInt(2)}, {"index", SymInt(-1)}});  // [3, s0]
  ValueId u = b.call(OpKind::unsqueeze, {se}, {{"dim", SymInt(1)}});                       // [3, 1, s0]
  ValueId e = b.call(OpKind::expand, {u}, {{"sizes", SymIntVec{3, 5, s0}}});               // [3, 5, s0]
  ValueId r = b.call(OpKind::reshape, {x}, {{"shape", SymIntVec{s0 * 4, 8}}});             // [4*s0, 8]
  ValueId r2 = b.call(OpKind::reshape, {r}, {{"shape", SymIntVec{s0, 32}}});
  ValueId sq = b.call(OpKind::squeeze, {u}, {{"dims", SymIntVec{1}}});
  ValueId ad = b.call(OpKind::add, {sq, b.call(OpKind::exp, {se})});
  ValueId cat = b.call(OpKind::cat, std::vector<ValueId>{se, ad}, {{"dim", SymInt(0)}});
  ValueId pad = b.call(OpKind::pad, {cat}, {{"pads", SymIntVec{1, 2, 0, 1}}, {"mode", std::string("constant")}, {"value", 0.5}});
  scope.reset();
  Compiled c = compile(b, {e, r2, pad}, {s0});
  EXPECT_EQ(c.info.externs, 0) << c.info.loop_ir;
  for (int64_t n : {6, 2, 11}) check(c, {randn({n, 4, 8})}, {n}, std::to_string(n));
  // a non-contiguous input is accepted
  Tensor big = randn({8, 4, 6});
  check(c, {permute(big, {2, 1, 0})}, {6}, "noncontiguous");
}

TEST(CpuBackend, Reductions) {
  manual_seed(6);
  GraphBuilder b("red");
  SymInt s0 = b.symbol("x.size()[0]", 5), s1 = b.symbol("x.size()[2]", 6);
  ValueId x = b.input("x", {s0, 3, s1});
  std::vector<ValueId> outs;
  auto red = [&](OpKind op, SymIntVec dims, bool keep) {
    ops::Attrs a{{"dims", dims}, {"keepdim", keep}};
    if (op == OpKind::var) a.set("correction", SymInt(1));
    outs.push_back(b.call(op, {x}, a));
  };
  red(OpKind::sum, {1}, false);
  red(OpKind::sum, {}, false);
  red(OpKind::mean, {0, 2}, true);
  red(OpKind::amax, {2}, false);
  red(OpKind::amin, {0}, true);
  red(OpKind::prod, {1}, false);
  red(OpKind::var, {2}, false);
  red(OpKind::var, {0, 1}, true);
  red(OpKind::var, {}, false);  // no outer loop: one welford over everything
  ValueId xi = b.input("xi", {s0, 3, s1}, DType::I64);
  outs.push_back(b.call(OpKind::sum, {xi}, {{"dims", SymIntVec{2}}, {"keepdim", false}}));
  outs.push_back(b.call(OpKind::argmax, {x}, {{"dim", SymInt(2)}, {"keepdim", false}}));
  Compiled c = compile(b, outs, {s0, s1});
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{5, 6}, {2, 40}, {9, 3}})
    check(c, {randn({n0, 3, n1}), randint(-5, 5, {n0, 3, n1})}, {n0, n1}, fmt::format("{}x{}", n0, n1));
}

// The explicit vector form (16 values per step, scalar tail; codegen.cpp VecBodyEmitter) on row
// lengths around the vector and lane-block sizes, with masks, selects, bool casts, every unary
// function, NaN-propagating max/min and NaN placed in the vector part and in the tail; the pointwise
// chain, the row reductions and the whole-tensor (one outer loop) form against interp.
TEST(CpuBackend, VectorFormMatchesInterpAtEveryRowLength) {
  manual_seed(12);
  GraphBuilder b("vector_form");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 20);
  ValueId x = b.input("x", {s0, s1});
  ValueId row = b.input("row", {s1});
  ValueId half = b.constant(scalar_tensor(0.5)), one = b.constant(scalar_tensor(1.0));
  ValueId big = b.call(OpKind::gt, {x, half});
  ValueId sel = b.call(OpKind::where, {big, b.call(OpKind::exp, {x}), b.call(OpKind::mul, {x, row})});
  ValueId inside = b.call(OpKind::logical_and, {b.call(OpKind::gt, {x, b.call(OpKind::neg, {one})}), b.call(OpKind::lt, {x, one})});
  ValueId masked = b.call(OpKind::mul, {sel, b.call(OpKind::cast, {inside}, {{"dtype", DType::F32}})});
  ValueId ax = b.call(OpKind::abs, {x});
  std::vector<ValueId> outs = {masked};
  for (OpKind op : {OpKind::tanh, OpKind::sigmoid, OpKind::relu, OpKind::sign, OpKind::floor, OpKind::ceil, OpKind::round,
                    OpKind::sin, OpKind::cos, OpKind::erf})
    outs.push_back(b.call(op, {x}));
  outs.push_back(b.call(OpKind::log, {b.call(OpKind::add, {ax, one})}));
  outs.push_back(b.call(OpKind::sqrt, {ax}));
  outs.push_back(b.call(OpKind::rsqrt, {b.call(OpKind::add, {ax, one})}));
  outs.push_back(b.call(OpKind::pow, {ax, b.constant(scalar_tensor(1.5))}));
  outs.push_back(b.call(OpKind::maximum, {x, row}));
  outs.push_back(b.call(OpKind::minimum, {x, row}));
  outs.push_back(b.call(OpKind::gelu, {x}, {{"approximate", std::string("none")}}));
  for (OpKind op : {OpKind::amax, OpKind::amin, OpKind::sum, OpKind::var})
    outs.push_back(b.call(op, {x}, op == OpKind::var ? ops::Attrs{{"dims", SymIntVec{1}}, {"keepdim", false}, {"correction", SymInt(1)}}
                                                     : ops::Attrs{{"dims", SymIntVec{1}}, {"keepdim", false}}));
  outs.push_back(b.call(OpKind::softmax, {x}, {{"dim", SymInt(1)}}));
  outs.push_back(b.call(OpKind::layer_norm, {x, row, kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}}));
  Compiled c = compile(b, outs, {s0, s1});
  EXPECT_NE(generate_kernels(c.cpu->program()).find("pt::vld("), std::string::npos) << "the vector form was not used";
  for (int64_t n1 : {1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300}) {
    Tensor xt = randn({3, n1}) * 2.0;
    float* p = xt.data_ptr<float>();
    // NaN in row 1: at the start of the vector part and in the scalar tail
    p[n1] = NAN;
    if (n1 > 17) p[n1 + n1 - 1] = NAN;
    check(c, {xt, randn({n1})}, {3, n1}, fmt::format("3x{}", n1));
  }
}

// pow with a literal exponent 0, 1, 2, 3, -1, -2, 0.5 or -0.5 (ONNX LayerNorm's Pow(x - mean, 2), GPT-2's
// gelu_new Pow(x, 3)) lowers to products, sqrt or a reciprocal: no libm pow in the loop, the vector form
// kept, and every value bit for bit the eager kernel's (which takes the same forms, as ATen does for a
// scalar exponent), NaN, infinities, signed zeros and subnormals included; a tensor exponent holding
// those values gives the same bits; other exponents still call pow.
TEST(CpuBackend, PowByLiteralExponentIsExactAndNeedsNoLibm) {
  GraphBuilder b("pow_literal");
  SymInt s0 = b.symbol("x.size()[0]", 40);
  ValueId x = b.input("x", {s0});
  ValueId e = b.input("e", {s0});
  std::vector<ValueId> outs;
  const std::vector<double> special = {0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, -0.5};
  for (double c : special) outs.push_back(b.call(OpKind::pow, {x, b.constant(scalar_tensor(c))}));
  outs.push_back(b.call(OpKind::pow, {x, e}));                                  // exponents per element
  outs.push_back(b.call(OpKind::pow, {b.call(OpKind::abs, {x}), b.constant(scalar_tensor(2.5))}));  // libm
  Compiled c = compile(b, outs, {s0});
  const std::string code = generate_kernels(c.cpu->program());
  EXPECT_NE(code.find("pt::vld("), std::string::npos) << "the vector form was not used:\n" << code;
  // one pow call site remains for the tensor exponent and one for 2.5 (scalar and vector forms)
  size_t calls = 0;
  for (size_t at = code.find("powf_"); at != std::string::npos; at = code.find("powf_", at + 1)) ++calls;
  EXPECT_LE(calls, 4u) << code;
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.1f, 1e-20f, -1e-20f, 1e-40f, -1e-40f, 3e12f, -3e12f,
                           1e30f, NAN, -NAN, INFINITY, -INFINITY, 7.25f, -0.3f};
  const int64_t n = static_cast<int64_t>(xs.size()) * static_cast<int64_t>(special.size());
  Tensor xt = empty({n}), et = empty({n});
  for (int64_t i = 0; i < n; ++i) {
    xt.data_ptr<float>()[i] = xs[static_cast<size_t>(i) % xs.size()];
    et.data_ptr<float>()[i] = static_cast<float>(special[static_cast<size_t>(i) / xs.size()]);
  }
  const std::vector<Tensor> args = {xt, et};
  const std::vector<int64_t> sv = {n};
  std::vector<Tensor> got = c.cpu->run(args, sv);
  std::vector<Tensor> ref = c.interp->run(args, std::span<const int64_t>(sv));
  ASSERT_EQ(got.size(), outs.size());
  for (size_t k = 0; k < got.size(); ++k) {
    const float* g = got[k].data_ptr<float>();
    const float* r = ref[k].data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      uint32_t gb, rb;
      std::memcpy(&gb, &g[i], 4);
      std::memcpy(&rb, &r[i], 4);
      if (r[i] != r[i]) EXPECT_TRUE(g[i] != g[i]) << "output " << k << " x=" << xt.data_ptr<float>()[i];
      else EXPECT_EQ(gb, rb) << "output " << k << " x=" << xt.data_ptr<float>()[i] << ": " << g[i] << " vs " << r[i];
    }
  }
  // the eager kernel against the forms themselves
  Tensor sq = pow(xt, 2.0), cube = pow(xt, 3.0), half = pow(xt, 0.5), inv2 = pow(xt, -2.0);
  for (int64_t i = 0; i < n; ++i) {
    const float v = xt.data_ptr<float>()[i];
    auto same = [](float a, float b) { return (a != a && b != b) || std::memcmp(&a, &b, 4) == 0; };
    EXPECT_TRUE(same(sq.data_ptr<float>()[i], v * v)) << v;
    EXPECT_TRUE(same(cube.data_ptr<float>()[i], v * v * v)) << v;
    EXPECT_TRUE(same(half.data_ptr<float>()[i], std::sqrt(v))) << v;
    EXPECT_TRUE(same(inv2.data_ptr<float>()[i], 1.0f / (v * v))) << v;
  }
}

TEST(CpuBackend, Decompositions) {
  manual_seed(7);
  GraphBuilder b("decomp");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 64});
  ValueId w = b.input("w", {64});
  std::vector<ValueId> outs;
  outs.push_back(b.call(OpKind::log_softmax, {x}, {{"dim", SymInt(0)}}));
  outs.push_back(b.call(OpKind::softmax, {x}, {{"dim", SymInt(1)}}));
  outs.push_back(b.call(OpKind::rms_norm, {x, w}, {{"normalized_shape", SymIntVec{64}}, {"eps", 1e-6}}));
  outs.push_back(b.call(OpKind::rms_norm, {x, kNoValue}, {{"normalized_shape", SymIntVec{64}}}));
  outs.push_back(b.call(OpKind::silu, {x}));
  outs.push_back(b.call(OpKind::hardswish, {x}));
  outs.push_back(b.call(OpKind::hardsigmoid, {x}));
  outs.push_back(b.call(OpKind::gelu, {x}, {{"approximate", std::string("tanh")}}));
  outs.push_back(b.call(OpKind::gelu, {x}, {{"approximate", std::string("none")}}));
  ValueId img = b.input("img", {s0, 3, 5, 5});
  ValueId rm = b.input("rm", {3}), rv = b.input("rv", {3}), bw = b.input("bw", {3}), bb = b.input("bb", {3});
  outs.push_back(b.call(OpKind::batch_norm, {img, bw, bb, rm, rv}, {{"eps", 1e-5}}));
  ValueId q = b.input("q", {2, s0, 16}), k = b.input("k", {2, s0, 16}), v = b.input("v", {2, s0, 8});
  outs.push_back(b.call(OpKind::scaled_dot_product_attention, {q, k, v, kNoValue}, {{"is_causal", true}}));
  ValueId mask = b.input("mask", {s0, s0}, DType::Bool);
  outs.push_back(b.call(OpKind::scaled_dot_product_attention, {q, k, v, mask}, {}));
  Compiled c = compile(b, outs, {s0});
  for (int64_t n : {4, 9}) {
    Tensor m = gt(randn({n, n}), scalar_tensor(-0.5));
    check(c, {randn({n, 64}), randn({64}), randn({n, 3, 5, 5}), randn({3}), abs(randn({3})) + 0.5, randn({3}), randn({3}),
              randn({2, n, 16}), randn({2, n, 16}), randn({2, n, 8}), m},
          {n}, std::to_string(n));
  }
}

// layer_norm's affine step is one fused multiply-add (loop_ir.h SOp::Fma) when both weight and bias
// are given, in the vector body and the scalar tail alike; a weight alone stays a multiply.
TEST(CpuBackend, LayerNormAffineIsOneFusedMultiplyAdd) {
  manual_seed(71);
  GraphBuilder b("ln_fma");
  SymInt s0 = b.symbol("x.size()[0]", 3), s1 = b.symbol("x.size()[1]", 40);
  ValueId x = b.input("x", {s0, s1}), w = b.input("w", {s1}), bias = b.input("b", {s1});
  ValueId both = b.call(OpKind::layer_norm, {x, w, bias}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
  ValueId weight_only = b.call(OpKind::layer_norm, {x, w, kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
  ValueId rms = b.call(OpKind::rms_norm, {x, w}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-6}});
  Compiled c = compile(b, {both, weight_only, rms}, {s0, s1});
  size_t fmas = 0;
  for (size_t at = c.info.loop_ir.find("fma("); at != std::string::npos; at = c.info.loop_ir.find("fma(", at + 1)) ++fmas;
  EXPECT_EQ(fmas, 1u) << c.info.loop_ir;
  EXPECT_NE(c.info.source.find("pt::vfma("), std::string::npos);
  EXPECT_NE(c.info.source.find("__builtin_fmaf("), std::string::npos);
  for (int64_t n : {1, 15, 16, 17, 64, 65, 200})
    check(c, {randn({3, n}) * 3 + 1, randn({n}), randn({n})}, {3, n}, fmt::format("n={}", n));
  EXPECT_THROW(s_fma(s_const(2, DType::I64), s_const(3, DType::I64), s_const(4, DType::I64)), std::invalid_argument);
  EXPECT_EQ(s_text(s_fma(s_const(2, DType::F32), s_local("a", DType::F32), s_const(1, DType::F32))), "fma(2, a, 1)");
}

// A size argument that is not a symbol (a size specialized to 1, or none at all) is refused with a
// CompileError naming it, not dereferenced.
TEST(CpuBackend, SizeArgumentsMustBeSymbols) {
  GraphBuilder b("not_symbols");
  SymInt one = b.symbol("x.size()[0]", 1);  // 0/1 specialization: a constant, not a symbol
  ASSERT_FALSE(one.is_symbolic());
  ValueId x = b.input("x", {one, 4});
  auto g = std::make_shared<const ir::Graph>(std::move(b.done({b.call(OpKind::relu, {x})})));
  for (sym::Expr e : {sym::Expr(nullptr), sym::integer(1)}) {
    BackendInput in{g, {e}, "0/0", "default"};
    try {
      compile_cpu(in);
      ADD_FAILURE() << "no CompileError";
    } catch (const CompileError& err) {
      EXPECT_NE(std::string(err.what()).find("size argument 0 of graph 'not_symbols'"), std::string::npos) << err.what();
    }
  }
  SymInt s = b.symbol("y.size()[0]", 5);
  BackendInput twice{g, {s.expr(), s.expr()}, "0/0", "default"};
  try {
    compile_cpu(twice);
    ADD_FAILURE() << "no CompileError";
  } catch (const CompileError& err) {
    EXPECT_NE(std::string(err.what()).find("size arguments 0 and 1 of graph 'not_symbols' are the same symbol"),
              std::string::npos)
        << err.what();
  }
}

// layer_norm's affine step rounds once in every backend (eager's normalize_row and the generated
// code), so they agree also where (x - mean)·rstd·w alone overflows or b is infinite.
TEST(CpuBackend, LayerNormAffineOverflowAgreesWithEager) {
  GraphBuilder b("ln_overflow");
  SymInt s0 = b.symbol("x.size()[0]", 2);
  ValueId x = b.input("x", {s0, 20}), w = b.input("w", {20}), bias = b.input("b", {20});
  Compiled c = compile(b, {b.call(OpKind::layer_norm, {x, w, bias}, {{"normalized_shape", SymIntVec{20}}, {"eps", 1e-5}})},
                       {s0});
  Tensor xt = zeros({2, 20});
  xt.data_ptr<float>()[0] = 3;        // normalized: y = 4.36
  xt.data_ptr<float>()[20 + 19] = 3;  // the same in the last element (the scalar tail: rows are 20 long)
  // y·w overflows while y·w + b does not (1e38 → 4.4e38 - 3e38); y·w finite with b infinite; both overflow
  const float inf = INFINITY;
  const std::vector<std::pair<float, float>> cases = {{1e38f, -3e38f}, {-1e38f, 3e38f}, {-1e38f, inf}, {1e38f, -inf},
                                                      {3e38f, -3e38f}, {3e38f, 0}, {1, inf}, {1, -inf}};
  for (auto [wv, bv] : cases) {
    Tensor wt = ones({20}), bt = zeros({20});
    wt.data_ptr<float>()[0] = wt.data_ptr<float>()[19] = wv;
    bt.data_ptr<float>()[0] = bt.data_ptr<float>()[19] = bv;
    std::vector<Tensor> in{xt, wt, bt};
    Tensor want = layer_norm(xt, {20}, wt, bt, 1e-5);
    Tensor got = c.cpu->run(in, std::vector<int64_t>{2})[0];
    Tensor interp = c.interp->run(in, std::span<const int64_t>(std::vector<int64_t>{2}))[0];
    for (int64_t i : {int64_t{0}, int64_t{39}}) {
      const float e = want.data_ptr<float>()[i], g = got.data_ptr<float>()[i], p = interp.data_ptr<float>()[i];
      const std::string what = fmt::format("w={} b={} at {}: eager {} cpu {} interp {}", wv, bv, i, e, g, p);
      EXPECT_EQ(std::isnan(e), std::isnan(g)) << what;
      EXPECT_TRUE(std::isnan(e) ? std::isnan(p) : p == e) << what;  // interp runs the eager kernel
      if (std::isinf(e) || std::isinf(g)) {
        EXPECT_EQ(g, e) << what;
      } else if (!std::isnan(e)) {
        EXPECT_NEAR(g, e, std::abs(e) * 1e-5) << what;
      }
    }
  }
}

TEST(CpuBackend, DtypesAndF64) {
  manual_seed(8);
  GraphBuilder b("dt");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 8}, DType::F64);
  ValueId i = b.input("i", {s0, 8}, DType::I32);
  ValueId h = b.input("h", {s0, 8}, DType::F16);
  ValueId a = b.call(OpKind::add, {x, i});                        // f64
  ValueId sm = b.call(OpKind::softmax, {a}, {{"dim", SymInt(1)}});
  ValueId ci = b.call(OpKind::cast, {x}, {{"dtype", DType::I64}});
  ValueId mx = b.call(OpKind::maximum, {i, ci});
  ValueId hn = b.call(OpKind::neg, {h});                          // f16: extern
  ValueId nt = b.call(OpKind::logical_not, {b.call(OpKind::lt, {i, x})});
  ValueId wh = b.call(OpKind::where, {nt, x, a});
  Compiled c = compile(b, {sm, mx, hn, wh}, {s0});
  for (int64_t n : {4, 7}) {
    Tensor xt = randn({n, 8}, DType::F64) * 3;
    check(c, {xt, randint(-3, 3, {n, 8}, DType::I32), randn({n, 8}).to(DType::F16)}, {n}, std::to_string(n));
  }
}

// var and layer_norm reduce with Welford's update: rows whose mean is large compared with their spread
// (1e4 + N(0, 1)) keep their variance, where E[x^2] - E[x]^2 in f32 loses it. Against float64.
TEST(CpuBackend, WelfordVarianceOfLargeMeanRows) {
  manual_seed(11);
  GraphBuilder b("welford");
  SymInt s0 = b.symbol("x.size()[0]", 4), s1 = b.symbol("x.size()[1]", 4096);
  ValueId x = b.input("x", {s0, s1});
  ValueId v = b.call(OpKind::var, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}, {"correction", SymInt(1)}});
  ValueId ln = b.call(OpKind::layer_norm, {x, kNoValue, kNoValue}, {{"normalized_shape", SymIntVec{s1}}, {"eps", 1e-5}});
  Compiled c = compile(b, {v, ln}, {s0, s1});
  EXPECT_NE(c.info.loop_ir.find("reduce_welford"), std::string::npos) << c.info.loop_ir;
  // row lengths: whole blocks of lanes, tails, fewer values than lanes, one value
  for (int64_t cols : {4096, 4133, 100, 7, 1}) {
    const int64_t rows = 3;
    Tensor xt = randn({rows, cols}) + 1e4;
    auto out = c.cpu->run(std::vector<Tensor>{xt}, std::vector<int64_t>{rows, cols});
    const float* px = xt.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
      double mean = 0, m2 = 0;
      for (int64_t j = 0; j < cols; ++j) mean += px[r * cols + j];
      mean /= static_cast<double>(cols);
      for (int64_t j = 0; j < cols; ++j) m2 += (px[r * cols + j] - mean) * (px[r * cols + j] - mean);
      if (cols == 1) {
        EXPECT_TRUE(std::isnan(out[0].data_ptr<float>()[r]) || std::isinf(out[0].data_ptr<float>()[r]));
        continue;
      }
      const double want = m2 / static_cast<double>(cols - 1);
      const double got = out[0].data_ptr<float>()[r];
      EXPECT_NEAR(got, want, 1e-5 * want) << cols << " row " << r;
      // the naive f32 form on the same data is far off: the test can tell the two apart
      if (cols == 4096 && r == 0) {
        float s = 0, q = 0;
        for (int64_t j = 0; j < cols; ++j) {
          s += px[j];
          q += px[j] * px[j];
        }
        const double naive = (static_cast<double>(q) - static_cast<double>(s) * s / cols) / (cols - 1);
        EXPECT_GT(std::abs(naive - want), 1e-2 * want);
      }
      const double rstd = 1.0 / std::sqrt(m2 / static_cast<double>(cols) + 1e-5);
      double ln_err = 0;
      for (int64_t j = 0; j < cols; ++j)
        ln_err = std::max(ln_err, std::abs(out[1].data_ptr<float>()[r * cols + j] - (px[r * cols + j] - mean) * rstd));
      EXPECT_LT(ln_err, 2e-3) << cols << " row " << r;  // x itself carries ~5e-4 rounding at 1e4
    }
  }
}

// Independent kernels over the same outer domain become one kernel (one parallel loop): two pointwise
// outputs of x, and two row reductions of x with an unrelated extern between them.
TEST(CpuBackend, HorizontalFusionMergesIndependentKernels) {
  manual_seed(12);
  GraphBuilder b("horizontal");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 64);
  ValueId x = b.input("x", {s0, s1});
  ValueId w = b.input("w", {s1, 4});
  ValueId e = b.call(OpKind::add, {b.call(OpKind::exp, {x}), b.constant(scalar_tensor(1.0))});
  ValueId si = b.call(OpKind::mul, {b.call(OpKind::sin, {x}), b.constant(scalar_tensor(2.0))});
  ValueId sum = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
  ValueId mm = b.call(OpKind::matmul, {x, w});
  ValueId mx = b.call(OpKind::amax, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
  Compiled c = compile(b, {e, si, sum, mx, mm}, {s0, s1});
  // Kernels in program order: sum, (extern), amax, and the outputs exp+1, sin*2 realized at the end.
  // Row fusion puts the two pointwise kernels into amax's kernel (they extend its domain); horizontal
  // fusion moves that kernel above the extern into sum's: one pass over x for all four outputs.
  EXPECT_EQ(c.info.schedule.horizontal_fusions, 1) << c.info.loop_ir;
  EXPECT_EQ(c.info.kernels, 1) << c.info.loop_ir;
  EXPECT_EQ(c.info.externs, 1);
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {3, 1}, {33, 200}, {0, 5}})
    check(c, {randn({n0, n1}), randn({n1, 4})}, {n0, n1}, fmt::format("{}x{}", n0, n1));
}

// Horizontal fusion never merges dependent kernels: the second reduction reads the first's result.
TEST(CpuBackend, HorizontalFusionKeepsDependentKernelsApart) {
  manual_seed(13);
  GraphBuilder b("dependent");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 64);
  ValueId x = b.input("x", {s0, s1});
  ValueId w = b.input("w", {s1, s1});
  ValueId ex = b.call(OpKind::exp, {x});                            // realized for the matmul
  ValueId mm = b.call(OpKind::matmul, {ex, w});                     // extern reading it
  ValueId y = b.call(OpKind::add, {b.call(OpKind::sin, {mm}), x});  // kernel over [s0, s1] reading the extern's output
  Compiled c = compile(b, {y}, {s0, s1});
  EXPECT_EQ(c.info.schedule.horizontal_fusions, 0) << c.info.loop_ir;
  EXPECT_EQ(c.info.kernels, 2) << c.info.loop_ir;
  for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {5, 3}})
    check(c, {randn({n0, n1}), randn({n1, n1}) * 0.2}, {n0, n1}, fmt::format("{}x{}", n0, n1));
}

// ---- differential fuzzing: random programs (cpu_test_util.h: build_random), random symbolic sizes
TEST(CpuDifferential, RandomProgramsMatchInterp) {
  int iters = 16;
  if (const char* e = std::getenv("PROTEAN_FUZZ_ITERS")) iters = std::atoi(e);
  for (int it = 0; it < iters; ++it) {
    SCOPED_TRACE("program " + std::to_string(it));
    std::mt19937 rng(1000 + it);
    RandomProgram rp;
    build_random(rp, rng);
    std::string text = ir::print(rp.b.g);
    Compiled c = compile(rp.b, rp.outs, {rp.s0, rp.s1});
    for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{5, 6}, {2, 2}, {13, 70}, {3, 161}}) {
      manual_seed(static_cast<uint64_t>(it * 31 + n0));
      check(c, {randn({n0, n1}), randn({n0, n1}), randn({n1}), randn({n0, 1}), randn({n1, n1}) * 0.3}, {n0, n1},
            fmt::format("{}x{}\n{}\n{}", n0, n1, text, c.info.loop_ir));
      if (HasFailure()) return;
    }
  }
}

// Random residual streams (build_residual_stream): the sums that load more than one buffer are
// stored, by the next row kernel's first stage (loop/schedule.h), by the row kernel before them, or by
// the product as a post-op. Against the interpreter at odd sizes.
TEST(CpuDifferential, RandomResidualStreamsMatchInterp) {
  int iters = 10, stored_first = 0;
  if (const char* e = std::getenv("PROTEAN_FUZZ_ITERS")) iters = std::atoi(e);
  for (int it = 0; it < iters; ++it) {
    SCOPED_TRACE("program " + std::to_string(it));
    std::mt19937 rng(7000 + it);
    RandomProgram rp;
    build_residual_stream(rp, rng, it % 2 == 1);
    const std::string text = ir::print(rp.b.g);
    Compiled c = compile(rp.b, rp.outs, {rp.s0, rp.s1});
    for (const loop::Kernel& k : c.cpu->program().kernels)
      if (k.stages.size() > 1 && k.stages[0].kind == loop::StageKind::Pointwise && !k.stages[0].inner.empty() &&
          k.stages[0].out >= 0)
        ++stored_first;
    for (auto [n0, n1] : std::vector<std::pair<int64_t, int64_t>>{{5, 6}, {1, 1}, {13, 70}, {3, 161}}) {
      manual_seed(static_cast<uint64_t>(it * 17 + n0));
      check(c, {randn({n0, n1}), randn({n1, n1}) * 0.2, randn({n1}), randn({n1}), randn({n0, n1})}, {n0, n1},
            fmt::format("{}x{}\n{}\n{}", n0, n1, text, c.info.loop_ir));
      if (HasFailure()) return;
    }
  }
  EXPECT_GT(stored_first, 0) << "no program stored a sum from a row kernel's first stage";
}

// ---- generated code: CHECK-line expectations (tests/golden/cpu/*.checks, golden.h) ------------------
std::string codegen_text(GraphBuilder& b, std::vector<ValueId> outs, std::vector<SymInt> syms) {
  Compiled c = compile(b, std::move(outs), std::move(syms));
  return c.info.loop_ir + "\n" + generate_kernels(c.cpu->program());
}

TEST(CpuGolden, SoftmaxRows) {
  GraphBuilder b("softmax");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 4096});
  ValueId y = b.call(OpKind::softmax, {x}, {{"dim", SymInt(-1)}});
  protean::testing::expect_checks(codegen_text(b, {y}, {s0}), "cpu/softmax.checks");
}

TEST(CpuGolden, LayerNormGelu) {
  GraphBuilder b("ln_gelu");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 4096});
  ValueId w = b.input("w", {4096});
  ValueId bb = b.input("b", {4096});
  ValueId n = b.call(OpKind::layer_norm, {x, w, bb}, {{"normalized_shape", SymIntVec{4096}}, {"eps", 1e-5}});
  ValueId g = b.call(OpKind::gelu, {n}, {{"approximate", std::string("none")}});
  protean::testing::expect_checks(codegen_text(b, {g}, {s0}), "cpu/layer_norm_gelu.checks");
}

TEST(CpuGolden, BroadcastPermuteAdd) {
  GraphBuilder b("bcast");
  SymInt s0 = b.symbol("x.size()[0]", 8), s1 = b.symbol("x.size()[1]", 3);
  ValueId x = b.input("x", {s0, s1});
  ValueId y = b.input("y", {s1, 1});
  ValueId p = b.call(OpKind::permute, {x}, {{"dims", SymIntVec{1, 0}}});
  ValueId a = b.call(OpKind::add, {p, y});
  ValueId m = b.call(OpKind::matmul, {a, x});
  ValueId r = b.call(OpKind::relu, {m});
  protean::testing::expect_checks(codegen_text(b, {r}, {s0, s1}), "cpu/broadcast_permute_add.checks");
}

TEST(CpuGolden, HorizontalFusion) {
  GraphBuilder b("horizontal");
  SymInt s0 = b.symbol("x.size()[0]", 8);
  ValueId x = b.input("x", {s0, 256});
  ValueId w = b.input("w", {256, 4});
  ValueId e = b.call(OpKind::exp, {x});
  ValueId si = b.call(OpKind::sin, {x});
  ValueId sum = b.call(OpKind::sum, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}});
  ValueId mm = b.call(OpKind::matmul, {x, w});
  ValueId v = b.call(OpKind::var, {x}, {{"dims", SymIntVec{1}}, {"keepdim", false}, {"correction", SymInt(1)}});
  protean::testing::expect_checks(codegen_text(b, {e, si, sum, mm, v}, {s0}), "cpu/horizontal.checks");
}

// The gradient of a fused qkv projection: the heads of (dq, dk, dv) [3, B, H, T, E] gathered into
// [B, T, 3·H·E]. Each element's address divides and takes the remainder by E = 32 of the innermost
// index; split_divided_dims makes that loop (hi, lo) with lo in [0, 32) unit-stride, so it is a vector
// loop (masked loads for the cat's parts) instead of a scalar gather. Values equal interp's at every
// length, including ones that leave a vector tail in other dims.
TEST(CpuBackend, HeadGatherByDivisionIsSplitIntoAVectorLoop) {
  manual_seed(3);
  GraphBuilder b("qkv_grad");
  SymInt s0 = b.symbol("d.size()[3]", 9);
  ValueId d = b.input("d", {3, 2, 4, s0, 32});
  std::vector<ValueId> parts;
  for (int64_t i = 0; i < 3; ++i) {
    ValueId h = b.call(OpKind::select, {d}, {{"dim", SymInt(0)}, {"index", SymInt(i)}});
    ValueId t = b.call(OpKind::permute, {h}, {{"dims", SymIntVec{0, 2, 1, 3}}});
    parts.push_back(b.call(OpKind::reshape, {t}, {{"shape", SymIntVec{2, s0, 128}}}));
  }
  ValueId c = b.call(OpKind::cat, parts, {{"dim", SymInt(2)}});
  Compiled k = compile(b, {c}, {s0});
  EXPECT_EQ(k.info.loop_ir.find("Mod("), std::string::npos) << k.info.loop_ir;
  EXPECT_EQ(k.info.loop_ir.find("//"), std::string::npos) << k.info.loop_ir;
  EXPECT_NE(k.info.loop_ir.find(", 12, 32]"), std::string::npos) << k.info.loop_ir;
  for (int64_t n : {9, 1, 17, 0}) check(k, {randn({3, 2, 4, n, 32})}, {n}, fmt::format("T={}", n));
}

TEST(CpuBackend, OutputCodeLogShowsLoopIrAndSource) {
  use_test_cache_dir();
  observe::LogCapture cap("output_code");
  GraphBuilder b("logged");
  ValueId x = b.input("x", {4});
  ValueId y = b.call(OpKind::sigmoid, {x});
  compile(b, {y}, {});
  std::string s = cap.str();
  EXPECT_NE(s.find("cpu loop IR after scheduling"), std::string::npos) << s;
  EXPECT_NE(s.find("extern \"C\" void kernel0"), std::string::npos) << s;
}

}  // namespace
}  // namespace protean::backend::cpu
