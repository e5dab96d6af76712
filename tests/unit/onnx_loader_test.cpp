// ONNX importer: loading, metadata, identity, error reporting, loader fuzz.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "onnx_test_util.h"

namespace protean {
namespace {

using onnx_test::Builder;
constexpr int32_t F32 = ::onnx::TensorProto::FLOAT;
constexpr int32_t I64 = ::onnx::TensorProto::INT64;

Builder relu_model() {
  Builder b(13, "relu_graph");
  b.input("x", F32, {-1, 3, -1}, {"N", "", "W"}).output("y");
  b.node("Relu", {"x"}, {"y"}, "relu0");
  return b;
}

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

TEST(OnnxLoad, MetadataAndIdentity) {
  auto m = relu_model().load();
  EXPECT_EQ(m->input_names(), std::vector<std::string>{"x"});
  EXPECT_EQ(m->output_names(), std::vector<std::string>{"y"});
  EXPECT_EQ(m->inputs()[0].str(), "f32[N, 3, W]");
  EXPECT_EQ(m->opset(), 13);
  EXPECT_EQ(m->graph_name(), "relu_graph");
  EXPECT_EQ(m->identity().rfind("onnx:relu_graph:", 0), 0u) << m->identity();
  EXPECT_EQ(m->identity().size(), std::string("onnx:relu_graph:").size() + 16);
  // Same bytes → same identity; different bytes → different hash.
  EXPECT_EQ(relu_model().load()->identity(), m->identity());
  Builder other = relu_model();
  other.node("Identity", {"y"}, {"z"});
  EXPECT_NE(other.load()->content_hash(), m->content_hash());
  EXPECT_EQ(m->num_nodes(), 1);
}

TEST(OnnxLoad, MissingFileIsRuntimeError) {
  std::string w = error_of<RuntimeError>([] { onnx::load("/nonexistent/model.onnx"); });
  EXPECT_NE(w.find("/nonexistent/model.onnx"), std::string::npos) << w;
}

TEST(OnnxErrors, UnsupportedOpsAreListedTogether) {
  Builder b(11);
  b.input("x", F32, {1, 3, 4, 4}).output("z");
  b.node("Foo", {"x"}, {"a"}, "foo_1");
  b.node("Bar", {"a"}, {"b"}, "bar_1");
  b.node("Bar", {"b"}, {"c"}, "bar_2");
  auto* r = b.node("Resize", {"c", "", ""}, {"d"}, "resize_lin");
  Builder::attr_s(r, "mode", "area");
  b.node("Relu", {"d"}, {"z"});
  std::string w = error_of<NotImplementedError>([&] { b.load(); });
  for (const char* s : {"opset 11", "Foo", "'foo_1'", "Bar", "2 node(s)", "'bar_1'", "'bar_2'", "Resize",
                        "mode 'area'", "'resize_lin'", "test.onnx"})
    EXPECT_NE(w.find(s), std::string::npos) << "missing '" << s << "' in: " << w;
  EXPECT_EQ(w.find("Relu"), std::string::npos) << w;
}

// Opset 6 (before numpy broadcasting): upgraded at load by ONNX's version converter; the model keeps
// its own opset and messages name it.
TEST(OnnxLoad, OldOpsetIsUpgradedAndNamed) {
  Builder b(6);
  b.input("x", F32, {2, 3}).input("y", F32, {3}).output("z");
  auto* add = b.node("Add", {"x", "y"}, {"z"});
  Builder::attr_i(add, "broadcast", 1);
  auto m = b.load();
  EXPECT_EQ(m->opset(), 6);
  Tensor z = m->forward({tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}), tensor<float>({10, 20, 30}, {3})})[0];
  EXPECT_EQ(z.to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));

  Builder bad(6);
  bad.input("x", F32, {2, 3}).output("y");
  bad.node("Foo", {"x"}, {"y"}, "foo");
  std::string w = error_of<NotImplementedError>([&] { bad.load(); });
  EXPECT_NE(w.find("opset 6"), std::string::npos) << w;
}

// ONNX's Gemm 6 -> 7 adapter reads A's and B's shapes as matrices without a rank check: a Gemm whose
// input rank is unknown or not 2 is refused by name before the converter runs (it read past the end of
// the shape and crashed depending on earlier loads).
TEST(OnnxLoad, OldOpsetGemmWithoutMatrixShapesIsRefusedByName) {
  Builder ok(6);
  ok.input("a", F32, {2, 3}).input("b", F32, {3, 4}).input("c", F32, {4}).output("y");
  Builder::attr_i(ok.node("Gemm", {"a", "b", "c"}, {"y"}, "gemm0"), "broadcast", 1);
  auto m = ok.load();
  Tensor y = m->forward({ones({2, 3}), ones({3, 4}), tensor<float>({1, 2, 3, 4}, {4})})[0];
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4, 5, 6, 7, 4, 5, 6, 7}));

  Builder low(6);
  low.input("a", F32, {3}).input("b", F32, {3, 4}).input("c", F32, {4}).output("y");
  Builder::attr_i(low.node("Gemm", {"a", "b", "c"}, {"y"}, "gemm1"), "broadcast", 1);
  std::string w = error_of<FormatError>([&] { low.load(); });
  for (const char* s : {"'gemm1'", "opset 6", "input A", "rank is 1"})
    EXPECT_NE(w.find(s), std::string::npos) << "missing '" << s << "' in: " << w;

  Builder scalar_b(6);
  scalar_b.input("a", F32, {2, 3}).input("b", F32, {}).input("c", F32, {4}).output("y");
  scalar_b.node("Gemm", {"a", "b", "c"}, {"y"}, "gemm2");
  w = error_of<FormatError>([&] { scalar_b.load(); });
  EXPECT_NE(w.find("'gemm2'"), std::string::npos) << w;
  EXPECT_NE(w.find("input B"), std::string::npos) << w;
}

TEST(OnnxErrors, UnsupportedOpInsideIfBranch) {
  Builder b(16);
  b.input("c", ::onnx::TensorProto::BOOL, {}).output("y");
  auto* n = b.node("If", {"c"}, {"y"}, "if0");
  auto* t = Builder::attr_g(n, "then_branch", "then");
  Builder::add_node(t, "Weird", {}, {"ty"}, "weird_in_then");
  t->add_output()->set_name("ty");
  auto* e = Builder::attr_g(n, "else_branch", "else");
  Builder::const_i64(e, "ey", {1});
  e->add_output()->set_name("ey");
  std::string w = error_of<NotImplementedError>([&] { b.load(); });
  EXPECT_NE(w.find("'weird_in_then'"), std::string::npos) << w;
}

TEST(OnnxErrors, CorruptFilesAreFormatErrors) {
  std::string good = relu_model().bytes();
  // Truncated in the middle of the graph.
  std::string w = error_of<FormatError>([&] { onnx::load_from_bytes(good.substr(0, good.size() / 2), "cut.onnx"); });
  EXPECT_NE(w.find("cut.onnx"), std::string::npos) << w;
  error_of<FormatError>([&] { onnx::load_from_bytes("", "empty.onnx"); });
  error_of<FormatError>([&] { onnx::load_from_bytes("this is not protobuf at all \xff\xff\xff", "junk.onnx"); });
  // A file on disk goes through the same path.
  std::string path = ::testing::TempDir() + "/onnx_cut.onnx";
  std::ofstream(path, std::ios::binary) << good.substr(0, 7);
  w = error_of<FormatError>([&] { onnx::load(path); });
  EXPECT_NE(w.find(path), std::string::npos) << w;
  // No graph.
  ::onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(13);
  w = error_of<FormatError>([&] { onnx::load_from_bytes(mp.SerializeAsString(), "nograph.onnx"); });
  EXPECT_NE(w.find("no graph"), std::string::npos) << w;
}

TEST(OnnxErrors, DanglingNameIsFormatError) {
  Builder b;
  b.input("x", F32, {2}).output("y");
  b.node("Add", {"x", "ghost"}, {"y"}, "add0");
  std::string w = error_of<FormatError>([&] { b.load(); });
  EXPECT_NE(w.find("ghost"), std::string::npos) << w;
  EXPECT_NE(w.find("'add0'"), std::string::npos) << w;
  Builder c;
  c.input("x", F32, {2}).output("nowhere");
  c.node("Relu", {"x"}, {"y"});
  w = error_of<FormatError>([&] { c.load(); });
  EXPECT_NE(w.find("nowhere"), std::string::npos) << w;
}

TEST(OnnxErrors, BadAttributeTypeIsFormatError) {
  Builder b;
  b.input("x", F32, {2, 3}).output("y");
  auto* n = b.node("Transpose", {"x"}, {"y"}, "tr");
  Builder::attr_s(n, "perm", "1,0");
  std::string w = error_of<FormatError>([&] { b.load(); });
  EXPECT_NE(w.find("'perm'"), std::string::npos) << w;
  EXPECT_NE(w.find("'tr'"), std::string::npos) << w;
}

TEST(OnnxErrors, TensorDataSizeMismatchIsFormatError) {
  Builder b;
  b.input("x", F32, {2}).output("y");
  auto* t = b.graph()->add_initializer();
  Builder::fill(t, "w", {3}, {1, 2});  // 2 values for 3 elements
  b.node("Add", {"x", "w"}, {"y"});
  std::string w = error_of<FormatError>([&] { b.load(); });
  EXPECT_NE(w.find("'w'"), std::string::npos) << w;
  Builder c;
  c.input("x", F32, {2}).output("y");
  auto* r = c.graph()->add_initializer();
  r->set_name("raw");
  r->set_data_type(::onnx::TensorProto::FLOAT);
  r->add_dims(1000000);
  r->set_raw_data(std::string(12, '\0'));
  c.node("Add", {"x", "raw"}, {"y"});
  w = error_of<FormatError>([&] { c.load(); });
  EXPECT_NE(w.find("raw"), std::string::npos) << w;
}

TEST(OnnxErrors, WrongInputsAreValueErrors) {
  auto m = relu_model().load();
  std::string w = error_of<ValueError>([&] { m->forward({}); });
  EXPECT_NE(w.find("x: f32[N, 3, W]"), std::string::npos) << w;
  w = error_of<ValueError>([&] { m->forward({zeros({2, 3, 4}, DType::I64)}); });
  EXPECT_NE(w.find("'x'"), std::string::npos) << w;
  EXPECT_NE(w.find("f32[N, 3, W]"), std::string::npos) << w;
  EXPECT_NE(w.find("dtype"), std::string::npos) << w;
  w = error_of<ValueError>([&] { m->forward({zeros({2, 3})}); });
  EXPECT_NE(w.find("rank"), std::string::npos) << w;
  w = error_of<ValueError>([&] { m->forward({zeros({2, 4, 5})}); });
  EXPECT_NE(w.find("dim 1 must be 3"), std::string::npos) << w;
  w = error_of<ValueError>([&] { m->run({{"X", zeros({2, 3, 4})}}); });
  EXPECT_NE(w.find("'X'"), std::string::npos) << w;
  EXPECT_NE(w.find("x: f32[N, 3, W]"), std::string::npos) << w;
}

TEST(OnnxErrors, OpErrorsNameTheNode) {
  Builder b;
  b.input("x", F32, {2, 3}).input("y", F32, {4, 5}).output("z");
  b.node("Add", {"x", "y"}, {"z"}, "p2o.Add.250");
  auto m = b.load();
  try {
    PROTEAN_ONNX_RUN_OR_SKIP(m->forward({zeros({2, 3}), zeros({4, 5})}));
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("while running node 'p2o.Add.250' (Add): "), std::string::npos) << e.what();
  }
}

TEST(OnnxErrors, SpatialAlignmentRuleNamesTheInput) {
  // x → Conv stride 2 → Resize ×2 → Add with x: an FPN merge, so H and W must be even.
  Builder b(11, "fpn");
  b.input("x", F32, {1, 1, -1, -1}, {"", "", "H", "W"}).output("y");
  b.init("w", {1, 1, 1, 1}, {1.0f});
  auto* c = b.node("Conv", {"x", "w"}, {"d"}, "down");
  Builder::attr_ints(c, "strides", {2, 2});
  b.init("roi", {0}, {});
  b.init("scales", {4}, {1, 1, 2, 2});
  auto* r = b.node("Resize", {"d", "roi", "scales"}, {"u"}, "up");
  Builder::attr_s(r, "mode", "nearest");
  Builder::attr_s(r, "coordinate_transformation_mode", "asymmetric");
  Builder::attr_s(r, "nearest_mode", "floor");
  b.node("Add", {"u", "x"}, {"y"}, "merge");
  auto m = b.load();
  EXPECT_EQ(m->spatial_multiple(), 2);
  std::string w = error_of<ValueError>([&] { m->forward({zeros({1, 1, 5, 4})}); });
  for (const char* s : {"'x'", "[1, 1, 5, 4]", "height", "multiple of 2"})
    EXPECT_NE(w.find(s), std::string::npos) << "missing '" << s << "' in: " << w;
  // A plain residual block has no such rule.
  EXPECT_EQ(relu_model().load()->spatial_multiple(), 0);
}

TEST(OnnxLoad, ConstantFoldingRemovesConstantSubgraphs) {
  // Reverse a constant with Slice step -1 (Silero's pads helper): folded at load, so no negative-step
  // slice remains for the traced graph.
  Builder b(16);
  b.input("x", F32, {4}).output("y");
  b.const_f32("c", {4}, {1, 2, 3, 4});
  b.const_i64("st", {-1}).const_i64("en", {-9223372036854775807LL}).const_i64("ax", {0}).const_i64("sp", {-1});
  b.node("Slice", {"c", "st", "en", "ax", "sp"}, {"rev"}, "rev");
  b.node("Add", {"x", "rev"}, {"y"}, "add");
  onnx::LoadOptions o;
  std::shared_ptr<onnx::Model> m;
  m = b.load(o);
  Tensor y;
  PROTEAN_ONNX_RUN_OR_SKIP(y = m->forward({zeros({4})})[0]);
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{4, 3, 2, 1}));
  EXPECT_EQ(m->num_nodes(), 7);
  EXPECT_EQ(m->num_live_nodes(), 1);  // only the Add
}

// Mutates bytes of a real model (or a hand-built one when the models are absent): load must either
// succeed or throw protean::Error — never crash or throw anything else.
TEST(OnnxFuzz, MutatedModelsNeverCrashTheLoader) {
  std::string base;
  std::string dir = onnx_test::models_dir();
  if (!dir.empty()) {
    std::ifstream f(dir + "/ch_ppocr_mobile_v2.0_cls_infer.onnx", std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    base = ss.str();
  } else {
    base = relu_model().bytes();
  }
  std::mt19937_64 rng(20261129);
  int loaded = 0, rejected = 0;
  for (int iter = 0; iter < 300; ++iter) {
    std::string bytes = base;
    int kind = static_cast<int>(rng() % 4);
    int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) {
      size_t pos = rng() % bytes.size();
      switch (kind) {
        case 0: bytes[pos] = static_cast<char>(rng()); break;               // random byte
        case 1: bytes[pos] ^= static_cast<char>(1u << (rng() % 8)); break;  // bit flip
        case 2: bytes.resize(std::max<size_t>(1, pos)); break;             // truncate
        default: bytes.insert(pos, 1, static_cast<char>(rng())); break;     // insert
      }
    }
    try {
      auto m = onnx::load_from_bytes(bytes, "fuzz.onnx");
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_EQ(loaded + rejected, 300);
  RecordProperty("loaded", loaded);
  RecordProperty("rejected", rejected);
}

}  // namespace
}  // namespace protean
