// Scenario tests for graph breaks on ops a backend rejects (docs/breaks.md, "Ops a backend rejects"),
// Tensor::item_symint() under capture_scalar_outputs, and the break location / verify location fixes.
//
// The test backends below run graphs on the interpreter and count every op they are handed: an op
// their predicate rejects must never reach an artifact build.
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <random>
#include <string>

#include "backend/registry.h"
#include "breaks_test_util.h"
#include "observe/log.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;
using pt::ops::OpKind;
using pt::scenario::compile_error_of;
using pt::scenario::consecutive;
using pt::scenario::expect_same;

namespace {

// ---- test backends ------------------------------------------------------------------------------------
/// 'picky': no cumsum (no scan kernels) and no matmul with an f64 input (no f64 GEMM).
std::optional<std::string> picky_rejects(OpKind op, std::span<const Tensor> in) {
  if (op == OpKind::cumsum) return "no scan kernels";
  if (op == OpKind::matmul)
    for (const Tensor& t : in)
      if (t.defined() && t.dtype() == pt::DType::F64) return "no f64 GEMM";
  return std::nullopt;
}

std::atomic<int> g_bad_builds{0};  // artifact builds handed an op the backend rejects

/// Runs on the interpreter; counts graphs that hold an op `rejects` refuses.
template <typename Rejects>
pt::backend::BackendFactory checking_factory(Rejects rejects) {
  return [rejects](const pt::backend::BackendInput& in) {
    for (const auto& n : in.graph->nodes()) {
      if (n.kind != pt::ir::NodeKind::Call) continue;
      std::vector<Tensor> fakes;
      for (pt::ir::ValueId v : n.inputs) {
        if (v == pt::ir::kNoValue) {
          fakes.emplace_back();
          continue;
        }
        const auto& val = in.graph->value(v);
        auto impl = std::make_shared<pt::TensorImpl>();
        impl->sizes = val.sizes;
        impl->strides = val.strides;
        impl->dtype = val.dtype;
        fakes.emplace_back(std::move(impl));
      }
      if (rejects(n, fakes)) ++g_bad_builds;
    }
    return pt::backend::make_artifact("interp", in);
  };
}

void register_picky() {
  pt::backend::register_backend(
      "picky",
      checking_factory([](const pt::ir::Node& n, std::span<const Tensor> in) { return picky_rejects(n.op, in).has_value(); }),
      [](const pt::backend::OpQuery& q) { return picky_rejects(q.op, q.inputs); });
}

/// 'late': no predicate; its "lowering" finds f64 matmuls only while building the artifact.
void register_late() {
  pt::backend::register_backend("late", [](const pt::backend::BackendInput& in) -> std::unique_ptr<pt::backend::Artifact> {
    for (const auto& n : in.graph->nodes()) {
      if (n.kind != pt::ir::NodeKind::Call || n.op != OpKind::matmul) continue;
      for (pt::ir::ValueId v : n.inputs)
        if (in.graph->value(v).dtype == pt::DType::F64) throw pt::backend::UnsupportedOpError(*in.graph, n, "no f64 GEMM");
    }
    return pt::backend::make_artifact("interp", in);
  });
}

/// 'nodyn': takes cumsum only on static sizes (a predicate that decides on symbolic sizes).
void register_nodyn() {
  auto dynamic_cumsum = [](OpKind op, std::span<const Tensor> in) {
    if (op != OpKind::cumsum) return false;
    for (const pt::SymInt& s : in[0].sizes())
      if (s.is_symbolic()) return true;
    return false;
  };
  pt::backend::register_backend(
      "nodyn",
      checking_factory([dynamic_cumsum](const pt::ir::Node& n, std::span<const Tensor> in) { return dynamic_cumsum(n.op, in); }),
      [dynamic_cumsum](const pt::backend::OpQuery& q) -> std::optional<std::string> {
        if (dynamic_cumsum(q.op, q.inputs)) return std::string("cumsum needs static sizes");
        return std::nullopt;
      });
}

/// The shared fresh state (breaks_test_util.h), plus the test backends and their counter.
class Breaks : public pt::scenario::BreaksTest {
 protected:
  void SetUp() override {
    BreaksTest::SetUp();
    register_picky();
    register_late();
    register_nodyn();
    g_bad_builds = 0;
  }
};
using BreaksRejectedOps = Breaks;
using BreaksItemSymint = Breaks;
using BreaksLocations = Breaks;

constexpr int kLineCumsum = __LINE__ + 4;
// cumsum in the middle: 'picky' rejects it.
Tensor scan_mid(const Tensor& x) {
  Tensor a = pt::tanh(x) * 2.0;
  Tensor c = pt::cumsum(a, 1);
  return pt::relu(c) + a * 0.5;
}

constexpr int kLineMatmul64 = __LINE__ + 4;
// An f64 matmul (rejected by 'picky' and, late, by 'late') next to an f32 one (taken).
Tensor mixed_matmuls(const Tensor& x, const Tensor& w32, const Tensor& w64) {
  Tensor h = pt::relu(pt::matmul(x, w32));
  Tensor d = pt::matmul(h.to(pt::DType::F64), w64);
  return pt::tanh(d.to(pt::DType::F32)) + h.sum({1}, true);
}

constexpr int kLineFirst = __LINE__ + 3;
// Rejected ops first in the body and back to back: no segment is pending at either.
Tensor scans_first(const Tensor& x) {
  Tensor a = pt::cumsum(x, 0);
  Tensor b = pt::cumsum(a, 1);
  return b * 2.0 + x;
}

}  // namespace

// ---- ops a backend rejects ------------------------------------------------------------------------------
TEST_F(BreaksRejectedOps, CumsumSplitsTheFunctionIntoTwoSegments) {
  pt::observe::LogCapture cap("recompiles");
  auto f = pt::compile(scan_mid, {.name = "scan_mid", .arg_names = {"x"}, .backend = "picky"});
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> n_of(2, 30);
  std::vector<int64_t> ns = {5, 9};
  for (int i = 0; i < 6; ++i) ns.push_back(n_of(rng));
  for (int64_t n : ns) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), scan_mid(x));
  }
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(f.segment_frame_ids(), consecutive(f.frame_id() + 1, 2));
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 1);
  ASSERT_EQ(s.graph_break_reasons.size(), 1u);
  EXPECT_EQ(s.graph_break_reasons.begin()->first,
            "graph break: backend 'picky' does not support cumsum(f32[5, 4]): no scan kernels (op cumsum(f32[5, 4])) at "
            "breaks_backend_scenarios.cpp:" + std::to_string(kLineCumsum));
  // Each segment: static, then one dynamic recompile when the rows change; every later shape hits.
  EXPECT_EQ(s.compiles, 4);
  EXPECT_EQ(s.recompiles, 2);
  for (int64_t n : {33, 41, 7}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), scan_mid(x));
  }
  EXPECT_EQ(pt::stats().compiles, 4);
  EXPECT_EQ(g_bad_builds.load(), 0);
  const std::string log = cap.str();
  EXPECT_NE(log.find("Recompiling function scan_mid.seg0 in "), std::string::npos) << log;
  EXPECT_NE(log.find("Recompiling function scan_mid.seg1 in "), std::string::npos) << log;
}

TEST_F(BreaksRejectedOps, OnlyTheRejectedDtypeBreaks) {
  auto f = pt::compile(mixed_matmuls, {.name = "mixed", .arg_names = {"x", "w32", "w64"}, .backend = "picky"});
  Tensor w32 = pt::randn({6, 5}), w64 = pt::randn({5, 3}, pt::DType::F64);
  for (int64_t n : {3, 8, 8, 12}) {
    Tensor x = pt::randn({n, 6});
    expect_same(f(x, w32, w64), mixed_matmuls(x, w32, w64));
  }
  auto s = pt::stats();
  ASSERT_EQ(s.graph_breaks, 1);
  EXPECT_NE(s.graph_break_reasons.begin()->first.find("backend 'picky' does not support matmul(f64[3, 5], f64[5, 3]): no f64 "
                                                      "GEMM (op matmul(f64[3, 5], f64[5, 3])) at breaks_backend_scenarios.cpp:" +
                                                      std::to_string(kLineMatmul64)),
            std::string::npos)
      << s.graph_break_reasons.begin()->first;
  EXPECT_EQ(f.segment_frame_ids().size(), 2u);
  EXPECT_EQ(g_bad_builds.load(), 0);
}

TEST_F(BreaksRejectedOps, FullgraphMakesItACompileErrorWithTheSameText) {
  auto f = pt::compile(scan_mid, {.name = "scan_mid", .arg_names = {"x"}, .backend = "picky", .fullgraph = true});
  const std::string m = compile_error_of([&] { f(pt::randn({3, 4})); });
  EXPECT_NE(m.find("fullgraph=true: graph break in scan_mid in "), std::string::npos) << m;
  EXPECT_NE(m.find("(" + std::to_string(f.frame_id()) + "/0): backend 'picky' does not support cumsum(f32[3, 4]): no "
                   "scan kernels (op cumsum(f32[3, 4])) at breaks_backend_scenarios.cpp:" + std::to_string(kLineCumsum)),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("Compile for a backend that supports the op"), std::string::npos) << m;
  EXPECT_FALSE(f.segmented());
  EXPECT_EQ(pt::stats().graph_breaks, 1);
}

TEST_F(BreaksRejectedOps, LoggedOncePerSite) {
  pt::observe::LogCapture cap("graph_breaks");
  auto f = pt::compile(scan_mid, {.name = "scan_mid", .arg_names = {"x"}, .backend = "picky"});
  for (int64_t n : {3, 4, 9, 9, 17}) f(pt::randn({n, 4}));
  const std::string text = cap.str();
  size_t lines = 0;
  for (size_t p = text.find("Graph break in scan_mid"); p != std::string::npos; p = text.find("Graph break in scan_mid", p + 1))
    ++lines;
  EXPECT_EQ(lines, 1u) << text;
  EXPECT_NE(text.find("backend 'picky' does not support cumsum(f32[3, 4]): no scan kernels"), std::string::npos) << text;
}

TEST_F(BreaksRejectedOps, RejectedOpsFirstAndBackToBack) {
  auto f = pt::compile(scans_first, {.name = "scans_first", .arg_names = {"x"}, .backend = "picky"});
  for (int64_t n : {2, 5, 5, 11}) {
    Tensor x = pt::randn({n, 3});
    expect_same(f(x), scans_first(x));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 2);  // both sites, though no segment was pending at either
  bool first = false, second = false;
  for (const auto& [r, c] : s.graph_break_reasons) {
    first |= r.find("at breaks_backend_scenarios.cpp:" + std::to_string(kLineFirst)) != std::string::npos;
    second |= r.find("at breaks_backend_scenarios.cpp:" + std::to_string(kLineFirst + 1)) != std::string::npos;
  }
  EXPECT_TRUE(first && second);
  EXPECT_EQ(f.segment_frame_ids().size(), 1u);  // only `b * 2.0 + x` is compiled
  EXPECT_EQ(g_bad_builds.load(), 0);
}

// A backend whose lowering finds the op only while building the artifact: the same break (named by the
// graph node's user line), and the frame learns the op so its segments never hold it.
TEST_F(BreaksRejectedOps, LateRejectionAtArtifactBuildIsTheSameBreak) {
  auto f = pt::compile(mixed_matmuls, {.name = "mixed_late", .arg_names = {"x", "w32", "w64"}, .backend = "late"});
  Tensor w32 = pt::randn({6, 5}), w64 = pt::randn({5, 3}, pt::DType::F64);
  for (int64_t n : {3, 8, 8, 12, 20}) {
    Tensor x = pt::randn({n, 6});
    expect_same(f(x, w32, w64), mixed_matmuls(x, w32, w64));
  }
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(f.segment_frame_ids().size(), 2u);
  auto s = pt::stats();
  ASSERT_EQ(s.graph_breaks, 1);
  EXPECT_EQ(s.graph_break_reasons.begin()->first,
            "graph break: backend 'late' does not support matmul(f64[3, 5], f64[5, 3]): no f64 GEMM (op matmul(f64[3, 5], "
            "f64[5, 3])) at breaks_backend_scenarios.cpp:" + std::to_string(kLineMatmul64));
  EXPECT_EQ(s.compiles, 4);  // two segments × (static + dynamic); the failed build is not a compile

  auto g = pt::compile(mixed_matmuls,
                       {.name = "mixed_late_fg", .arg_names = {"x", "w32", "w64"}, .backend = "late", .fullgraph = true});
  const std::string m = compile_error_of([&] { g(pt::randn({3, 6}), w32, w64); });
  EXPECT_NE(m.find("backend 'late' does not support matmul(f64[3, 5], f64[5, 3]): no f64 GEMM"), std::string::npos) << m;
}

// A predicate that rejects cumsum only on symbolic sizes: the first (static) compile takes it, the
// dynamic recompile breaks there, and once a segment frame's own dynamic trace is rejected the frame
// learns cumsum and breaks at it from then on. Every call stays correct.
TEST_F(BreaksRejectedOps, SizeDependentRejectionConverges) {
  auto f = pt::compile(scan_mid, {.name = "scan_nodyn", .arg_names = {"x"}, .backend = "nodyn"});
  for (int64_t n : {4, 6, 9, 13, 15, 22, 30, 31}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), scan_mid(x));
  }
  EXPECT_TRUE(f.segmented());
  EXPECT_EQ(g_bad_builds.load(), 0);
  const int64_t compiles = pt::stats().compiles;
  for (int64_t n : {40, 41, 57}) {
    Tensor x = pt::randn({n, 4});
    expect_same(f(x), scan_mid(x));
  }
  EXPECT_EQ(pt::stats().compiles, compiles);  // converged: dynamic segments around an eager cumsum
}

TEST_F(BreaksRejectedOps, BuiltInBackendsTakeEveryOp) {
  for (const char* name : {"interp", "eager", "cpu"}) {
    ASSERT_TRUE(pt::backend::has_backend(name)) << name;
    EXPECT_FALSE(pt::backend::op_support(name)) << name << " declares a predicate: update docs/breaks.md";
  }
  auto f = pt::compile(scan_mid, {.name = "scan_interp", .arg_names = {"x"}, .backend = "interp"});
  Tensor x = pt::randn({4, 4});
  expect_same(f(x), scan_mid(x));
  EXPECT_EQ(pt::stats().graph_breaks, 0);
}

TEST_F(BreaksRejectedOps, RegisterBackendRejectsEmptyNamesAndFactories) {
  auto interp = [](const pt::backend::BackendInput& in) { return pt::backend::make_artifact("interp", in); };
  EXPECT_THROW(pt::backend::register_backend("", interp), pt::ValueError);
  EXPECT_THROW(pt::backend::register_backend("x", pt::backend::BackendFactory{}), pt::ValueError);
}

// ---- item_symint --------------------------------------------------------------------------------------
namespace {
// The first k rows of x, summed per row, plus a [k] tensor of ones: k is data (a one-element tensor).
Tensor head_rows(const Tensor& x, const Tensor& k) {
  pt::SymInt n = k.item_symint();
  Tensor head = pt::narrow(x, 0, 0, n);  // [n, 4]
  return head.sum({1}) + pt::full({n}, 1.0);
}

constexpr int kLineGuard = __LINE__ + 4;
// A guard on the value itself: data-dependent, a graph break at this line.
Tensor guard_on_value(const Tensor& x, const Tensor& k) {
  pt::SymInt n = k.item_symint();
  if (n > 3) return x * 2.0;
  return x - 1.0;
}
}  // namespace

class BreaksItemSymintOn : public Breaks, public ::testing::WithParamInterface<const char*> {};

TEST_P(BreaksItemSymintOn, FeedsNarrowAndFullWithoutRecompiling) {
  pt::observe::LogCapture cap("output_code");
  auto f = pt::compile(head_rows, {.name = "head_rows", .arg_names = {"x", "k"}, .backend = GetParam(),
                                   .capture_scalar_outputs = true});
  Tensor x = pt::randn({8, 4});
  for (int64_t k : {3, 5, 0, 8, 1, 6}) {
    Tensor kt = pt::tensor<int64_t>({k}, {});
    expect_same(f(x, kt), head_rows(x, kt));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 0);
  EXPECT_EQ(s.compiles, 1);
  EXPECT_EQ(s.cache_hits, 5);
  EXPECT_NE(cap.str().find("= local_scalar_dense(%k, symbol=u0)"), std::string::npos) << cap.str();
  // Another row count: one dynamic recompile, then values and sizes vary freely.
  for (int64_t rows : {12, 20}) {
    Tensor xr = pt::randn({rows, 4});
    for (int64_t k : {2, 11}) {
      Tensor kt = pt::tensor<int64_t>({k}, {});
      expect_same(f(xr, kt), head_rows(xr, kt));
    }
  }
  EXPECT_EQ(pt::stats().compiles, 2);
  EXPECT_EQ(pt::stats().graph_breaks, 0);
}

TEST_P(BreaksItemSymintOn, ValuesThatBreakTheTracedFactsAreRuntimeErrors) {
  auto f = pt::compile(head_rows, {.name = "head_rows", .arg_names = {"x", "k"}, .backend = GetParam(),
                                   .capture_scalar_outputs = true});
  Tensor x = pt::randn({8, 4});
  expect_same(f(x, pt::tensor<int64_t>({2}, {})), head_rows(x, pt::tensor<int64_t>({2}, {})));
  // Eager narrow would raise ValueError; the compiled graph checks the same facts as runtime assertions.
  for (int64_t bad : {9, -1}) {
    try {
      f(x, pt::tensor<int64_t>({bad}, {}));
      FAIL() << "expected RuntimeError for k = " << bad;
    } catch (const pt::RuntimeError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("runtime assertion"), std::string::npos) << m;
      EXPECT_NE(m.find("u0 = " + std::to_string(bad)), std::string::npos) << m;
      EXPECT_NE(m.find("narrow"), std::string::npos) << m;
      EXPECT_NE(m.find("breaks_backend_scenarios.cpp:"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(pt::stats().compiles, 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, BreaksItemSymintOn, ::testing::Values("interp", "cpu"));

TEST_F(BreaksItemSymint, GuardOnTheValueBreaksAtTheUsersLine) {
  auto f = pt::compile(guard_on_value, {.name = "guard_on_value", .arg_names = {"x", "k"}, .backend = "interp", .capture_scalar_outputs = true});
  for (int64_t k : {5, 1, 4}) {
    Tensor x = pt::randn({3}), kt = pt::tensor<int64_t>({k}, {});
    expect_same(f(x, kt), guard_on_value(x, kt));
  }
  auto s = pt::stats();
  ASSERT_EQ(s.graph_breaks, 1);
  const std::string& r = s.graph_break_reasons.begin()->first;
  EXPECT_NE(r.find("graph break: data-dependent guard (Could not guard on data-dependent expression 3 < u0"), std::string::npos)
      << r;
  EXPECT_NE(r.find("(op guard) at breaks_backend_scenarios.cpp:" + std::to_string(kLineGuard)), std::string::npos) << r;

  auto g = pt::compile(guard_on_value,
                       {.name = "guard_fg", .arg_names = {"x", "k"}, .backend = "interp", .fullgraph = true, .capture_scalar_outputs = true});
  const std::string m = compile_error_of([&] { g(pt::randn({3}), pt::tensor<int64_t>({5}, {})); });
  EXPECT_NE(m.find("at breaks_backend_scenarios.cpp:" + std::to_string(kLineGuard)), std::string::npos) << m;
}

TEST_F(BreaksItemSymint, WithoutCaptureScalarOutputsItIsAHostRead) {
  const int line = __LINE__ + 2;
  auto fn = [](const Tensor& x, const Tensor& k) {
    pt::SymInt n = k.item_symint();
    return pt::tanh(x) * static_cast<double>(n.hint() + 1);
  };
  auto f = pt::compile(fn, {.name = "host", .arg_names = {"x", "k"}, .backend = "interp"});
  for (int i = 0; i < 4; ++i) {
    Tensor x = pt::randn({5}), k = pt::tensor<int64_t>({i + 1}, {});
    expect_same(f(x, k), fn(x, k));
  }
  auto s = pt::stats();
  EXPECT_EQ(s.graph_breaks, 1);
  bool found = false;
  for (const auto& [r, c] : s.graph_break_reasons)
    found |= r == "graph break: Tensor::item_symint() reads tensor data on the host (set CompileOptions::capture_scalar_outputs "
                  "to capture it as an unbacked symbol) (op item_symint) at breaks_backend_scenarios.cpp:" +
                      std::to_string(line);
  EXPECT_TRUE(found);
}

TEST_F(BreaksItemSymint, EagerAndErrors) {
  EXPECT_EQ(pt::tensor<int32_t>({-4}, {1}).item_symint().hint(), -4);
  EXPECT_EQ(pt::tensor<uint8_t>({200}, {}).item_symint().hint(), 200);
  EXPECT_FALSE(pt::tensor<int64_t>({7}, {}).item_symint().is_symbolic());
  EXPECT_THROW(pt::randn({1}).item_symint(), pt::TypeError);
  EXPECT_THROW(pt::tensor<int64_t>({1, 2}, {2}).item_symint(), pt::ValueError);
  EXPECT_THROW(pt::check(pt::SymInt(3) > 4, "three is not above four"), pt::ValueError);
  pt::check(pt::SymInt(5) > 4);
  EXPECT_THROW(pt::check_is_size(pt::SymInt(-1)), pt::ValueError);
  // A float tensor under capture is the user's error, not a break.
  auto f = pt::compile([](const Tensor& x) { return x * static_cast<double>(x.sum().item_symint().hint()); },
                       {.name = "float_item", .backend = "interp", .capture_scalar_outputs = true});
  EXPECT_THROW(f(pt::randn({3})), pt::TypeError);
}

TEST_F(BreaksItemSymint, CheckLetsAGuardOnTheValueTrace) {
  // check(n <= x.size(0)) is a runtime assertion; the narrow after it then traces without a break.
  auto fn = [](const Tensor& x, const Tensor& k) {
    pt::SymInt n = k.item_symint();
    pt::check(n <= x.size(0), "k fits in x");
    pt::check_is_size(n);
    return pt::narrow(x, 0, 0, n) * 3.0;
  };
  auto f = pt::compile(fn, {.name = "checked", .arg_names = {"x", "k"}, .backend = "interp", .capture_scalar_outputs = true});
  Tensor x = pt::randn({6, 2});
  for (int64_t k : {0, 6, 2}) {
    Tensor kt = pt::tensor<int64_t>({k}, {});
    expect_same(f(x, kt), fn(x, kt));
  }
  EXPECT_EQ(pt::stats().graph_breaks, 0);
  EXPECT_EQ(pt::stats().compiles, 1);
  try {
    f(x, pt::tensor<int64_t>({7}, {}));
    FAIL() << "expected RuntimeError";
  } catch (const pt::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("k fits in x"), std::string::npos) << e.what();
  }
}

// ---- locations -----------------------------------------------------------------------------------------
TEST_F(BreaksLocations, DataDependentGuardOnNonzeroNamesTheUsersLine) {
  const int line = __LINE__ + 3;
  auto fn = [](const Tensor& x) {
    Tensor nz = pt::nonzero(x > 0.0);
    if (nz.size(0) > 2) return x * 2.0;
    return x + 1.0;
  };
  auto f = pt::compile(fn, {.name = "nz_guard", .arg_names = {"x"}, .backend = "interp", .capture_scalar_outputs = true});
  for (int i = 0; i < 3; ++i) {
    Tensor x = pt::randn({6});
    expect_same(f(x), fn(x));
  }
  // The guard breaks the trace at its own line; segmented, nonzero then ends the first segment.
  auto s = pt::stats();
  ASSERT_EQ(s.graph_break_reasons.size(), 2u);
  std::string guard, nz;
  for (const auto& [r, c] : s.graph_break_reasons) (r.find("(op guard)") != std::string::npos ? guard : nz) = r;
  EXPECT_NE(guard.find("data-dependent guard (Could not guard on data-dependent expression 2 < u0"), std::string::npos) << guard;
  EXPECT_NE(guard.find("(op guard) at breaks_backend_scenarios.cpp:" + std::to_string(line)), std::string::npos) << guard;
  EXPECT_NE(nz.find("data-dependent output shape (in segmented execution the op runs between segments) (op nonzero(b8[6])) "
                    "at breaks_backend_scenarios.cpp:" + std::to_string(line - 1)),
            std::string::npos)
      << nz;
}

TEST_F(BreaksLocations, VerifyNamesTheLineThatReadsAChangedCapturedTensor) {
  Tensor w = pt::randn({4});
  const int line = __LINE__ + 1;
  auto fn = [&w](const Tensor& x) { return pt::relu(x) * w; };
  auto f = pt::compile(fn, {.name = "captured", .arg_names = {"x"}, .backend = "interp", .verify_every = 1});
  pt::observe::LogCapture cap("");
  Tensor x = pt::randn({4});
  expect_same(f(x), fn(x));
  expect_same(f(x), fn(x));
  w = pt::randn({4});        // a new tensor: the cached graph still holds the old one as a constant
  expect_same(f(x), fn(x));  // verify catches it; this call runs eagerly
  const std::string text = cap.str();
  EXPECT_NE(text.find("first differing node"), std::string::npos) << text;
  EXPECT_NE(text.find("(a constant first read at breaks_backend_scenarios.cpp:" + std::to_string(line) + ")"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("at ?"), std::string::npos) << text;
  EXPECT_EQ(pt::stats().verify_failures, 1);
}
