// End to end: the real models (scripts/fetch_models.sh) through protean::onnx vs ONNX Runtime.
// Reference outputs are generated at test time by tests/e2e/ort_run.js (onnxruntime-node 1.30.0, CPU):
// it writes the inputs it used and its outputs as .npy; we load the same inputs, run the model eagerly
// and compare. Tolerances (max abs error) are documented in docs/onnx.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "onnx_test_util.h"

namespace protean {
namespace {

namespace fs = std::filesystem;

struct Env {
  std::string models, node_modules;
};

/// Models + node + onnxruntime-node, or a skip reason.
std::string find_env(Env& env) {
  env.models = onnx_test::models_dir();
  if (env.models.empty())
    return "the real models are missing: run scripts/fetch_models.sh (PROTEAN_MODELS_DIR, default "
           "~/.cache/protean/models)";
  if (std::getenv("PROTEAN_ONNX_E2E_REFS")) return "";
  if (std::system("node --version > /dev/null 2>&1") != 0) return "node is not installed (scripts/setup.sh)";
  const char* cache = std::getenv("PROTEAN_CACHE_DIR");
  std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  env.node_modules = (cache ? std::string(cache) : home + "/.cache/protean") + "/node/node_modules";
  if (!fs::exists(env.node_modules + "/onnxruntime-node"))
    return "onnxruntime-node is missing: run scripts/fetch_models.sh";
  return "";
}

std::string out_dir(const std::string& name) {
  if (const char* r = std::getenv("PROTEAN_ONNX_E2E_REFS")) return std::string(r) + "/" + name;
  std::string d = ::testing::TempDir() + "/protean_onnx_e2e/" + name;
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

double max_abs_err(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.int_sizes(), ref.int_sizes());
  if (got.int_sizes() != ref.int_sizes()) return INFINITY;
  std::vector<float> a = got.contiguous().to_vector<float>(), b = ref.to_vector<float>();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = std::abs(double(a[i]) - b[i]);
    if (std::isnan(d)) return INFINITY;
    m = std::max(m, d);
  }
  return m;
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

}  // namespace
}  // namespace protean
