// End to end: the real models (scripts/fetch_models.sh) through protean::onnx vs ONNX Runtime.
// Reference outputs are generated at test time by tests/e2e/ort_run.js (onnxruntime-node 1.30.0, CPU):
// it writes the inputs it used and its outputs as .npy; we load the same inputs, run the model eagerly
// and through protean::compile (backends interp and cpu, automatic dynamic) and compare. Tolerances
// (max abs error) are documented in docs/onnx.md.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "cache/kernel_cache.h"
#include "onnx_test_util.h"
#include "observe/log.h"
#include "protean/compile.h"

namespace protean {
namespace {

namespace fs = std::filesystem;
using onnx_test::max_abs_err;

struct Env {
  std::string models, node_modules;
};

/// PROTEAN_CACHE_DIR (or ~/.cache/protean) as the process started: scripts/fetch_models.sh puts
/// onnxruntime-node under it, and other tests of the same binary point PROTEAN_CACHE_DIR at private
/// directories later. Read during static initialization, before any test runs.
const std::string& startup_cache_dir() {
  static const std::string dir = [] {
    if (const char* c = std::getenv("PROTEAN_CACHE_DIR"); c && *c) return std::string(c);
    const char* home = std::getenv("HOME");
    return std::string(home ? home : "") + "/.cache/protean";
  }();
  return dir;
}
[[maybe_unused]] const std::string& kStartupCacheDir = startup_cache_dir();

/// Models + node + onnxruntime-node, or a skip reason.
std::string find_env(Env& env) {
  env.models = onnx_test::models_dir();
  if (env.models.empty())
    return "the real models are missing: run scripts/fetch_models.sh (PROTEAN_MODELS_DIR, default "
           "~/.cache/protean/models)";
  if (std::getenv("PROTEAN_ONNX_E2E_REFS")) return "";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed (scripts/setup.sh)";
  env.node_modules = startup_cache_dir() + "/node/node_modules";
  if (!fs::exists(env.node_modules + "/onnxruntime-node"))
    return "onnxruntime-node is missing: run scripts/fetch_models.sh";
  return "";
}

/// Where the ORT results of case `name` go. `group` keeps test programs that ctest may run in parallel
/// out of each other's directories, and the pid keeps two test runs (two checkouts) apart; with
/// PROTEAN_ONNX_E2E_REFS every group reads the same `DIR/name`.
std::string out_dir(const std::string& name, const std::string& group = "eager") {
  if (const char* r = std::getenv("PROTEAN_ONNX_E2E_REFS")) return std::string(r) + "/" + name;
  struct PidRoot {  // removed when the test program exits
    std::string path = ::testing::TempDir() + "/protean_onnx_e2e_" + std::to_string(::getpid());
    ~PidRoot() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const PidRoot root;
  std::string d = root.path + "/" + group + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// PROTEAN_ONNX_E2E_REFS: a directory of earlier ort_run.js results, one sub-directory per case label
/// (same layout: inputs/*.npy and the outputs), for machines without node/onnxruntime-node.
std::string refs_dir() {
  const char* r = std::getenv("PROTEAN_ONNX_E2E_REFS");
  return r ? r : "";
}

/// Runs ort_run.js; returns "" or the error text.
std::string run_ort(const Env& env, const std::string& model, const std::string& dir, const std::string& args) {
  if (!refs_dir().empty()) return fs::exists(dir + "/inputs") ? "" : "no reference results in " + dir;
  std::string cmd = "node " PROTEAN_SOURCE_DIR "/tests/e2e/ort_run.js '" + env.models + "/" + model + "' '" + dir +
                    "' " + args + " --threads 1 --ort '" + env.node_modules + "' > '" + dir + "/ort.json' 2> '" +
                    dir + "/ort.err'";
  if (std::system(cmd.c_str()) == 0) return "";
  std::ifstream f(dir + "/ort.err");
  std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return "ort_run.js failed: " + cmd + "\n" + err;
}

template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Case {
  std::string label, model, dims, output;
  double tol;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }  // readable ctest names

class OnnxE2E : public ::testing::TestWithParam<Case> {};

TEST_P(OnnxE2E, MatchesOnnxRuntime) {
  Env env;
  if (std::string why = find_env(env); !why.empty()) GTEST_SKIP() << why;
  const Case& c = GetParam();
  std::string dir = out_dir(c.label);
  std::string err = run_ort(env, c.model, dir, "--random x=" + c.dims);
  ASSERT_EQ(err, "");
  auto m = onnx::load(env.models + "/" + c.model);
  Tensor x = load_npy(dir + "/inputs/x.npy");
  std::vector<Tensor> out;
  PROTEAN_ONNX_RUN_OR_SKIP(out = m->forward({x}));
  double ms = median_ms(3, [&] { out = m->forward({x}); });
  double e = max_abs_err(out[0], load_npy(dir + "/" + c.output + ".npy"));
  RecordProperty("max_abs_err", std::to_string(e));
  RecordProperty("eager_ms", std::to_string(ms));
  std::printf("[ onnx e2e ] %-14s x=%-12s max_abs_err %.3g (tolerance %.1g), eager %.1f ms\n", c.label.c_str(),
              c.dims.c_str(), e, c.tol, ms);
  EXPECT_LE(e, c.tol) << c.label;
}

const char* kRec = "ch_PP-OCRv4_rec_infer.onnx";
const char* kDet = "ch_PP-OCRv4_det_infer.onnx";
const char* kCls = "ch_ppocr_mobile_v2.0_cls_infer.onnx";

INSTANTIATE_TEST_SUITE_P(
    OnnxModels, OnnxE2E,
    ::testing::Values(Case{"rec_w100", kRec, "1x3x48x100", "softmax_11.tmp_0", 5e-5},
                      Case{"rec_w239", kRec, "1x3x48x239", "softmax_11.tmp_0", 5e-5},
                      Case{"rec_w758", kRec, "1x3x48x758", "softmax_11.tmp_0", 5e-5},
                      Case{"rec_b3", kRec, "3x3x48x320", "softmax_11.tmp_0", 5e-5},
                      Case{"det_640x640", kDet, "1x3x640x640", "sigmoid_0.tmp_0", 1e-5},
                      Case{"det_480x960", kDet, "1x3x480x960", "sigmoid_0.tmp_0", 1e-5},
                      Case{"cls_48x192", kCls, "1x3x48x192", "softmax_0.tmp_0", 1e-5}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

TEST(OnnxE2ESilero, FiveCallsCarryingState) {
  Env env;
  if (std::string why = find_env(env); !why.empty()) GTEST_SKIP() << why;
  auto m = onnx::load(env.models + "/silero_vad_v5.onnx");
  Tensor state;  // protean carries its own state; ORT carries its own
  std::string prev;
  for (int call = 0; call < 5; ++call) {
    std::string dir = out_dir("silero_" + std::to_string(call));
    std::string args = "--seed " + std::to_string(call) + " --random input=1x512 ";
    args += call == 0 ? "--const state=f32:2x1x128:0 --const sr=i64:scalar:16000"
                      : "state=" + prev + "/stateN.npy sr=" + prev + "/inputs/sr.npy";
    ASSERT_EQ(run_ort(env, "silero_vad_v5.onnx", dir, args), "");
    Tensor input = load_npy(dir + "/inputs/input.npy");
    if (call == 0) state = load_npy(dir + "/inputs/state.npy");
    Tensor sr = load_npy((call == 0 ? dir : prev) + "/inputs/sr.npy");
    std::vector<Tensor> out;
    PROTEAN_ONNX_RUN_OR_SKIP(out = m->forward({input, state, sr}));
    double eo = max_abs_err(out[0], load_npy(dir + "/output.npy"));
    double es = max_abs_err(out[1], load_npy(dir + "/stateN.npy"));
    double ms = median_ms(3, [&] { m->forward({input, state, sr}); });
    std::printf("[ onnx e2e ] silero call %d L=512 max_abs_err output %.3g stateN %.3g, eager %.2f ms\n", call, eo, es,
                ms);
    EXPECT_LE(eo, 1e-4) << "call " << call;
    EXPECT_LE(es, 1e-4) << "call " << call;
    state = out[1];
    prev = dir;
  }
}

TEST(OnnxE2ESilero, LengthOutsideTheValidRangeIsAClearError) {
  std::string dir = onnx_test::models_dir();
  if (dir.empty()) GTEST_SKIP() << "the real models are missing: run scripts/fetch_models.sh";
  auto m = onnx::load(dir + "/silero_vad_v5.onnx");
  try {
    PROTEAN_ONNX_RUN_OR_SKIP(m->forward({zeros({1, 1024}), zeros({2, 1, 128}), tensor<int64_t>({16000}, {})}));
    ADD_FAILURE() << "L=1024 should fail";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("while running node"), std::string::npos) << w;
  }
}

TEST(OnnxE2EDet, HeightNotAMultipleOf32IsAValueError) {
  std::string dir = onnx_test::models_dir();
  if (dir.empty()) GTEST_SKIP() << "the real models are missing: run scripts/fetch_models.sh";
  auto m = onnx::load(dir + "/" + kDet);
  EXPECT_EQ(m->spatial_multiple(), 32);
  try {
    m->forward({zeros({1, 3, 500, 640})});
    ADD_FAILURE() << "H=500 should be rejected";
  } catch (const ValueError& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("'x'"), std::string::npos) << w;
    EXPECT_NE(w.find("multiple of 32"), std::string::npos) << w;
  }
}

TEST(OnnxE2ELoad, RealModelsLoadAndDescribeThemselves) {
  std::string dir = onnx_test::models_dir();
  if (dir.empty()) GTEST_SKIP() << "the real models are missing: run scripts/fetch_models.sh";
  auto rec = onnx::load(dir + "/" + kRec);
  EXPECT_EQ(rec->opset(), 9);
  EXPECT_EQ(rec->input_names(), std::vector<std::string>{"x"});
  EXPECT_EQ(rec->output_names(), std::vector<std::string>{"softmax_11.tmp_0"});
  EXPECT_EQ(rec->num_nodes(), 765);
  EXPECT_EQ(rec->spatial_multiple(), 0);
  auto vad = onnx::load(dir + "/silero_vad_v5.onnx");
  EXPECT_EQ(vad->opset(), 16);
  EXPECT_EQ(vad->input_names(), (std::vector<std::string>{"input", "state", "sr"}));
  EXPECT_EQ(vad->inputs()[2].str(), "i64[]");
  EXPECT_EQ(vad->identity().rfind("onnx:spox_graph:", 0), 0u);
}

// ---- the same cases through protean::compile ------------------------------------------------------
// Each test gets its own, emptied PROTEAN_CACHE_DIR under the build dir, so the cpu backend really
// generates and compiles its kernels (no artifact from an earlier run or another test is reused).

/// Points PROTEAN_CACHE_DIR at a fresh directory for the test's lifetime (restored afterwards).
class ScopedCacheDir {
 public:
  explicit ScopedCacheDir(const std::string& name) : dir_(std::string(PROTEAN_BINARY_DIR) + "/onnx-e2e-cache/" + name) {
    if (const char* old = std::getenv("PROTEAN_CACHE_DIR")) old_ = old;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ::setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
  }
  ~ScopedCacheDir() {
    if (old_) ::setenv("PROTEAN_CACHE_DIR", old_->c_str(), 1);
    else ::unsetenv("PROTEAN_CACHE_DIR");
  }
  ScopedCacheDir(const ScopedCacheDir&) = delete;
  ScopedCacheDir& operator=(const ScopedCacheDir&) = delete;

 private:
  std::string dir_;
  std::optional<std::string> old_;
};

struct Shape {
  std::string label, dims;
};

struct CompiledCase {
  std::string name, model, output;
  double tol;
  std::vector<Shape> shapes;  // called in this order on one compiled function
  int64_t compiles;           // expected compiles after all shapes (automatic dynamic)
  std::string backend;
};

void PrintTo(const CompiledCase& c, std::ostream* os) { *os << c.name << " through " << c.backend; }

class OnnxE2ECompiled : public ::testing::TestWithParam<CompiledCase> {};

// One compiled function over several shapes: the first call compiles a static graph, the first shape
// change recompiles once with the changed dims dynamic, later shapes hit that graph.
TEST_P(OnnxE2ECompiled, MatchesOnnxRuntime) {
  Env env;
  if (std::string why = find_env(env); !why.empty()) GTEST_SKIP() << why;
  const CompiledCase& c = GetParam();
  ScopedCacheDir cache_dir(c.name + "_" + c.backend);
  reset();
  cache::reset_kernel_cache_stats();
  auto m = onnx::load(env.models + "/" + c.model);
  CompileOptions opts{.name = c.name, .arg_names = {"x"}, .backend = c.backend};
  auto f = compile([m](const Tensor& x) { return m->forward({x}); }, opts);
  for (const Shape& sh : c.shapes) {
    std::string dir = out_dir(sh.label, "compiled_" + c.backend);
    ASSERT_EQ(run_ort(env, c.model, dir, "--random x=" + sh.dims), "");
    Tensor x = load_npy(dir + "/inputs/x.npy");
    std::vector<Tensor> out;
    auto t0 = std::chrono::steady_clock::now();
    PROTEAN_ONNX_RUN_OR_SKIP(out = f(x));
    double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(out.size(), 1u);
    double e = max_abs_err(out[0], load_npy(dir + "/" + c.output + ".npy"));
    double ms = median_ms(3, [&] { out = f(x); });
    // A cache hit must give the same numbers as the call that compiled.
    double e2 = max_abs_err(out[0], load_npy(dir + "/" + c.output + ".npy"));
    std::printf("[ onnx e2e ] %-6s %-14s x=%-12s max_abs_err %.3g (tolerance %.1g), first call %.0f ms, then %.1f ms\n",
                c.backend.c_str(), sh.label.c_str(), sh.dims.c_str(), e, c.tol, first_ms, ms);
    EXPECT_LE(e, c.tol) << c.backend << " " << sh.label;
    EXPECT_LE(e2, c.tol) << c.backend << " " << sh.label << " (cache hit)";
  }
  Stats st = stats();
  EXPECT_EQ(st.compiles, c.compiles) << st.to_json();
  EXPECT_EQ(st.recompiles, c.compiles - 1) << st.to_json();
  EXPECT_EQ(st.graph_breaks, 0) << st.to_json();
  if (c.backend == "cpu") {
    cache::KernelCacheStats ks = cache::kernel_cache_stats();
    std::printf("[ onnx e2e ] cpu    %-14s kernel builds %lld (%.1f s), memory hits %lld, disk hits %lld\n",
                c.name.c_str(), static_cast<long long>(ks.misses), ks.build_seconds,
                static_cast<long long>(ks.memory_hits), static_cast<long long>(ks.disk_hits));
    EXPECT_GE(ks.misses, 1) << "the cpu backend built nothing: the cache dir was not fresh";
  }
}

std::vector<CompiledCase> compiled_cases() {
  const std::vector<Shape> rec = {{"rec_w100", "1x3x48x100"}, {"rec_w239", "1x3x48x239"}, {"rec_w758", "1x3x48x758"}};
  const Shape rec_b3{"rec_b3", "3x3x48x320"};
  const Shape det640{"det_640x640", "1x3x640x640"}, det480{"det_480x960", "1x3x480x960"};
  std::vector<CompiledCase> v;
  // Widths 100 → 239 recompile once (W dynamic); 758 hits that graph; batch 3 recompiles (N dynamic).
  for (const char* b : {"interp", "cpu"}) {
    std::vector<Shape> s = rec;
    s.push_back(rec_b3);
    v.push_back({"rec", kRec, "softmax_11.tmp_0", 5e-5, s, 3, b});
  }
  // det: both shapes through interp (one dynamic recompile); one shape through cpu (CI time).
  v.push_back({"det", kDet, "sigmoid_0.tmp_0", 1e-5, {det640, det480}, 2, "interp"});
  v.push_back({"det", kDet, "sigmoid_0.tmp_0", 1e-5, {det640}, 1, "cpu"});
  return v;
}

INSTANTIATE_TEST_SUITE_P(OnnxModels, OnnxE2ECompiled, ::testing::ValuesIn(compiled_cases()),
                         [](const ::testing::TestParamInfo<CompiledCase>& i) {
                           return i.param.name + "_" + i.param.backend;
                         });

class OnnxE2ESileroCompiled : public ::testing::TestWithParam<std::string> {};

// Silero with `sr` as a guarded int argument: 5 calls of L = 512 carrying the state, one compile.
TEST_P(OnnxE2ESileroCompiled, FiveCallsCarryingState) {
  Env env;
  if (std::string why = find_env(env); !why.empty()) GTEST_SKIP() << why;
  const std::string backend = GetParam();
  ScopedCacheDir cache_dir("silero_" + backend);
  reset();
  cache::reset_kernel_cache_stats();
  auto m = onnx::load(env.models + "/silero_vad_v5.onnx");
  CompileOptions opts{.name = "silero", .arg_names = {"input", "state", "sr"}, .backend = backend};
  auto f = compile([m](const Tensor& x, const Tensor& s, int64_t sr) { return m->forward({x, s}, {{"sr", SymInt(sr)}}); },
                   opts);
  Tensor state;
  std::string prev;
  for (int call = 0; call < 5; ++call) {
    std::string dir = out_dir("silero_" + std::to_string(call), "compiled_" + backend);
    std::string args = "--seed " + std::to_string(call) + " --random input=1x512 ";
    args += call == 0 ? "--const state=f32:2x1x128:0 --const sr=i64:scalar:16000"
                      : "state=" + prev + "/stateN.npy sr=" + prev + "/inputs/sr.npy";
    ASSERT_EQ(run_ort(env, "silero_vad_v5.onnx", dir, args), "");
    Tensor input = load_npy(dir + "/inputs/input.npy");
    if (call == 0) state = load_npy(dir + "/inputs/state.npy");
    int64_t sr = load_npy((call == 0 ? dir : prev) + "/inputs/sr.npy").item<int64_t>();
    std::vector<Tensor> out;
    PROTEAN_ONNX_RUN_OR_SKIP(out = f(input, state, sr));
    ASSERT_EQ(out.size(), 2u);
    double eo = max_abs_err(out[0], load_npy(dir + "/output.npy"));
    double es = max_abs_err(out[1], load_npy(dir + "/stateN.npy"));
    double ms = median_ms(3, [&] { (void)f(input, state, sr); });
    std::printf("[ onnx e2e ] %-6s silero call %d L=512 max_abs_err output %.3g stateN %.3g, then %.2f ms\n",
                backend.c_str(), call, eo, es, ms);
    EXPECT_LE(eo, 1e-4) << backend << " call " << call;
    EXPECT_LE(es, 1e-4) << backend << " call " << call;
    state = out[1];
    prev = dir;
  }
  Stats st = stats();
  EXPECT_EQ(st.compiles, 1) << st.to_json();
  EXPECT_EQ(st.graph_breaks, 0) << st.to_json();
}

// With `sr` a tensor (as `protean run ... sr=scalar:16000` passes it), the If on it reads its value on
// the host: a graph break, which names the ONNX node whose op read it (it named the caller's line).
TEST(OnnxE2ESilero, AGraphBreakInsideTheModelNamesItsNode) {
  Env env;
  if (std::string why = find_env(env); !why.empty()) GTEST_SKIP() << why;
  reset();
  auto m = onnx::load(env.models + "/silero_vad_v5.onnx");
  auto f = compile([m](const Tensor& x, const Tensor& s, const Tensor& sr) { return m->forward({x, s, sr}); },
                   {.name = "silero_sr_tensor", .arg_names = {"input", "state", "sr"}, .backend = "interp"});
  observe::LogCapture cap("graph_breaks");
  (void)f(randn({1, 512}), zeros({2, 1, 128}), tensor<int64_t>({16000}, {}));
  EXPECT_EQ(stats().graph_breaks, 1);
  EXPECT_NE(cap.str().find("(op item) at onnx node '"), std::string::npos) << cap.str();
}

INSTANTIATE_TEST_SUITE_P(Backends, OnnxE2ESileroCompiled, ::testing::Values("interp", "cpu"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace protean
