// A tiny seeded GPT-2 (tests/data/onnx/, exported by scripts/export_tiny_gpt2.py with torch 2.11's
// dynamo exporter, opset 18, sequence length dynamic) vs ONNX Runtime, once self-contained and once
// with its weights in an external data file; plus the external-data path and bounds checks on
// hand-built models. ORT's outputs come from tests/e2e/ort_run.js at test time (skipped without node
// and onnxruntime-node, like the other ONNX end-to-end tests).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "onnx_test_util.h"
#include "protean/compile.h"

namespace protean {
namespace {

namespace fs = std::filesystem;
using onnx_test::max_abs_err;

const std::string kDataDir = PROTEAN_SOURCE_DIR "/tests/data/onnx";

/// node + onnxruntime-node under the cache dir the process started with, or "".
std::string ort_modules() {
  static const std::string dir = [] {
    std::string cache;
    if (const char* c = std::getenv("PROTEAN_CACHE_DIR"); c && *c) cache = c;
    else cache = std::string(std::getenv("HOME") ? std::getenv("HOME") : "") + "/.cache/protean";
    std::string m = cache + "/node/node_modules";
    if (std::system("node --version > /dev/null 2>&1") != 0 || !fs::exists(m + "/onnxruntime-node")) return std::string();
    return m;
  }();
  return dir;
}
[[maybe_unused]] const std::string& kOrtModules = ort_modules();

std::string temp_dir(const std::string& name) {
  std::string d = ::testing::TempDir() + "/protean_gpt2_" + std::to_string(::getpid()) + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

/// Runs ORT on `model` with seeded random token ids [1, len]; returns the case directory.
std::string ort_reference(const std::string& model, int64_t len, const std::string& tag) {
  std::string dir = temp_dir(tag + "_" + std::to_string(len));
  std::string cmd = "node " PROTEAN_SOURCE_DIR "/tests/e2e/ort_run.js '" + model + "' '" + dir +
                    "' --random input_ids=1x" + std::to_string(len) + " --seed " + std::to_string(len) +
                    " --threads 1 --ort '" + ort_modules() + "' > '" + dir + "/ort.json' 2> '" + dir + "/ort.err'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return dir;
}

constexpr double kTol = 1e-4;  // ORT vs PyTorch was 1.2e-6 on the export machine
const std::vector<int64_t> kLengths = {3, 7, 16, 33, 64, 100};

struct Gpt2Case {
  std::string file, backend;  // backend "eager": Model::forward without compile
};
void PrintTo(const Gpt2Case& c, std::ostream* os) { *os << c.file << " on " << c.backend; }

class OnnxTinyGpt2 : public ::testing::TestWithParam<Gpt2Case> {};

TEST_P(OnnxTinyGpt2, MatchesOnnxRuntimeWithDynamicSequenceLength) {
  if (ort_modules().empty()) GTEST_SKIP() << "node or onnxruntime-node is missing: run scripts/fetch_models.sh";
  const Gpt2Case& c = GetParam();
  std::string model = kDataDir + "/" + c.file;
  std::string cache = std::string(PROTEAN_BINARY_DIR) + "/onnx-e2e-cache/gpt2_" + c.backend;
  fs::remove_all(cache);
  fs::create_directories(cache);
  ::setenv("PROTEAN_CACHE_DIR", cache.c_str(), 1);
  reset();
  auto m = onnx::load(model);
  EXPECT_EQ(m->opset(), 18);
  EXPECT_EQ(m->input_names(), std::vector<std::string>{"input_ids"});
  std::function<std::vector<Tensor>(const Tensor&)> run;
  if (c.backend == "eager") {
    run = [m](const Tensor& x) { return m->forward({x}); };
  } else {
    auto f = compile([m](const Tensor& x) { return m->forward({x}); },
                     {.name = "tiny_gpt2", .arg_names = {"input_ids"}, .backend = c.backend});
    run = [f](const Tensor& x) mutable { return f(x); };
  }
  for (int64_t len : kLengths) {
    std::string dir = ort_reference(model, len, c.file + "_" + c.backend);
    Tensor ids = load_npy(dir + "/inputs/input_ids.npy");
    std::vector<Tensor> out = run(ids);
    ASSERT_EQ(out.size(), 1u);
    double e = max_abs_err(out[0], load_npy(dir + "/last_hidden_state.npy"));
    std::printf("[ onnx gpt2 ] %-20s %-6s seq %3lld max_abs_err %.3g\n", c.file.c_str(), c.backend.c_str(),
                static_cast<long long>(len), e);
    EXPECT_LE(e, kTol) << "seq " << len;
  }
  if (c.backend != "eager") {
    // Automatic dynamic: a static graph for the first length, one dynamic recompile, then hits.
    Stats st = stats();
    EXPECT_EQ(st.compiles, 2) << st.to_json();
    EXPECT_EQ(st.graph_breaks, 0) << st.to_json();
  }
  ::unsetenv("PROTEAN_CACHE_DIR");
}

INSTANTIATE_TEST_SUITE_P(Models, OnnxTinyGpt2,
                         ::testing::Values(Gpt2Case{"tiny_gpt2.onnx", "eager"}, Gpt2Case{"tiny_gpt2_ext.onnx", "eager"},
                                           Gpt2Case{"tiny_gpt2.onnx", "interp"},
                                           Gpt2Case{"tiny_gpt2_ext.onnx", "interp"},
                                           Gpt2Case{"tiny_gpt2_ext.onnx", "cpu"}),
                         [](const auto& info) {
                           std::string n = info.param.file.substr(0, info.param.file.find('.')) + "_" + info.param.backend;
                           return n;
                         });

// Both exports hold the same weights: the same ids give the same outputs (no ORT needed).
TEST(OnnxExternalData, ExternalAndSelfContainedExportsAgree) {
  auto a = onnx::load(kDataDir + "/tiny_gpt2.onnx");
  auto b = onnx::load(kDataDir + "/tiny_gpt2_ext.onnx");
  Tensor ids = tensor<int64_t>({5, 17, 999, 0, 42}, {1, 5});
  Tensor ya = a->forward({ids})[0], yb = b->forward({ids})[0];
  EXPECT_EQ(ya.int_sizes(), (IntVec{1, 5, 64}));
  EXPECT_EQ(max_abs_diff(ya, yb), 0.0);
  EXPECT_NE(a->identity(), b->identity());
}

// ---- external data on hand-built models: mapping, bounds and path checks ----------------------------------
/// A model y = x + w where w (f32[4]) lives in `location` at `offset`; writes model.onnx into dir.
std::string write_external_model(const std::string& dir, const std::string& location, int64_t offset,
                                 int64_t length = 16) {
  onnx_test::Builder b(13);
  b.input("x", ::onnx::TensorProto::FLOAT, {4}).output("y");
  auto* w = b.graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(::onnx::TensorProto::FLOAT);
  w->add_dims(4);
  w->set_data_location(::onnx::TensorProto::EXTERNAL);
  auto kv = [&](const std::string& k, const std::string& v) {
    auto* e = w->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  kv("location", location);
  kv("offset", std::to_string(offset));
  if (length >= 0) kv("length", std::to_string(length));
  onnx_test::Builder::add_node(b.graph(), "Add", {"x", "w"}, {"y"});
  std::string path = dir + "/model.onnx";
  std::ofstream(path, std::ios::binary) << b.model().SerializeAsString();
  return path;
}

void write_weights(const std::string& path, int64_t pad) {
  std::ofstream f(path, std::ios::binary);
  for (int64_t i = 0; i < pad; ++i) f.put('\0');
  float w[4] = {1, 2, 3, 4};
  f.write(reinterpret_cast<const char*>(w), sizeof w);
}

TEST(OnnxExternalData, LoadsAlignedAndMisalignedOffsets) {
  for (int64_t pad : {0, 8, 3}) {  // 3: not a multiple of 4 bytes, copied instead of viewed
    std::string dir = temp_dir("ext_ok_" + std::to_string(pad));
    write_weights(dir + "/w.bin", pad);
    auto m = onnx::load(write_external_model(dir, "w.bin", pad));
    Tensor y = m->forward({tensor<float>({10, 20, 30, 40}, {4})})[0];
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{11, 22, 33, 44})) << "pad " << pad;
  }
}

TEST(OnnxExternalData, RefusesPathsOutsideTheModelDirectory) {
  std::string root = temp_dir("ext_paths");
  fs::create_directories(root + "/model");
  write_weights(root + "/w.bin", 0);
  write_weights(root + "/model/w.bin", 0);
  fs::create_symlink(root + "/w.bin", root + "/model/link.bin");
  for (const std::string& loc : {std::string("../w.bin"), root + "/w.bin", std::string("link.bin"),
                                 std::string("sub/../../w.bin")}) {
    std::string path = write_external_model(root + "/model", loc, 0);
    try {
      onnx::load(path);
      ADD_FAILURE() << "external data '" << loc << "' outside the model's directory was accepted";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(loc), std::string::npos) << e.what();
    }
  }
  // The same model beside its data loads.
  EXPECT_NO_THROW(onnx::load(write_external_model(root + "/model", "w.bin", 0)));
}

/// Loading the model at `path` throws a FormatError whose message contains `needle`.
void expect_format_error(const std::string& path, const std::string& needle) {
  try {
    onnx::load(path);
    ADD_FAILURE() << "accepted " << path;
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// A NUL byte in a location ended the message where it stood (the reason was lost): it is named as a NUL.
TEST(OnnxExternalData, ALocationWithANulByteIsNamedWhole) {
  std::string dir = temp_dir("ext_nul");
  write_weights(dir + "/w.bin", 0);
  expect_format_error(write_external_model(dir, std::string("w.bin\0../../x", 13), 0),
                      "names external data 'w.bin\\x00../../x': a location cannot contain a NUL byte");
}

// If branches nested 40 deep are valid protobuf past protobuf's default depth (100 messages): the error
// says so, not "truncated or corrupt file?".
TEST(OnnxLoader, SubgraphsNestedPastProtobufsDepthAreNamedAsSuch) {
  ::onnx::GraphProto g;
  g.set_name("g0");
  onnx_test::Builder::add_node(&g, "Identity", {"x"}, {"o0"});
  g.add_output()->set_name("o0");
  for (int i = 1; i <= 40; ++i) {
    ::onnx::GraphProto outer;
    outer.set_name("g" + std::to_string(i));
    auto* n = onnx_test::Builder::add_node(&outer, "If", {"c"}, {"o" + std::to_string(i)});
    ::onnx::GraphProto small;  // the else branch: one node (both branches nested would double per level)
    small.set_name("e" + std::to_string(i));
    onnx_test::Builder::add_node(&small, "Identity", {"x"}, {"e" + std::to_string(i)});
    small.add_output()->set_name("e" + std::to_string(i));
    for (const char* branch : {"then_branch", "else_branch"}) {
      auto* a = n->add_attribute();
      a->set_name(branch);
      a->set_type(::onnx::AttributeProto::GRAPH);
      *a->mutable_g() = std::string(branch) == "then_branch" ? g : small;
    }
    outer.add_output()->set_name("o" + std::to_string(i));
    g = std::move(outer);
  }
  onnx_test::Builder b(13);
  *b.graph() = g;
  std::string e;
  try {
    onnx::load_from_bytes(b.model().SerializeAsString(), "nested.onnx");
  } catch (const FormatError& err) {
    e = err.what();
  }
  EXPECT_NE(e.find("nested deeper than protobuf's limit of 100 message levels"), std::string::npos) << e;
}

TEST(OnnxExternalData, RefusesBadBoundsMissingFilesAndBytes) {
  std::string dir = temp_dir("ext_bounds");
  write_weights(dir + "/w.bin", 0);
  expect_format_error(write_external_model(dir, "w.bin", 8), "which has 16 bytes");
  expect_format_error(write_external_model(dir, "w.bin", 0, 12), "external data length is 12");
  expect_format_error(write_external_model(dir, "missing.bin", 0), "not a readable file");
  // A FIFO as the weights file is refused by name instead of blocking in open().
  ASSERT_EQ(::mkfifo((dir + "/pipe.bin").c_str(), 0600), 0);
  expect_format_error(write_external_model(dir, "pipe.bin", 0), "it is a FIFO (named pipe), not a regular file");
  // From bytes there is no directory to read the weights from.
  std::string path = write_external_model(dir, "w.bin", 0);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_THROW(onnx::load_from_bytes(bytes, "mem"), NotImplementedError);
}

}  // namespace
}  // namespace protean
