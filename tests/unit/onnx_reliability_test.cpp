// The ONNX front end against hostile models: nothing proportional to a tensor's size is built on the
// host while a model is captured (a negative-step Slice of a huge constant), input declarations that
// admit anything (negative dims, element types without a dtype) are refused, and a model path that
// is a FIFO is refused by name instead of blocking.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "onnx_test_util.h"
#include "protean/compile.h"

namespace protean {
namespace {

using onnx_test::Builder;
constexpr int32_t F32 = ::onnx::TensorProto::FLOAT;

int64_t max_rss_mb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024;
}

TEST(OnnxReliability, NegativeStepSliceOfAHugeConstantBuildsNothingOnTheHost) {
  // ConstantOfShape([2^28]) → Slice(::-1) → Shape: the slice's indices were a host list of 2^28
  // entries (2 GiB, then a 2 GiB index tensor) while the model loaded (constant folding) or was
  // captured; 2^36 grew until the machine died.
  const int64_t n = int64_t{1} << 28;
  Builder b(13);
  b.input("x", F32, {1}).output("shape");
  b.const_i64("dims", {n});
  b.node("ConstantOfShape", {"dims"}, {"big"});
  b.const_i64("st", {-1}).const_i64("en", {-std::numeric_limits<int64_t>::max()}).const_i64("ax", {0}).const_i64("sp", {-1});
  b.node("Slice", {"big", "st", "en", "ax", "sp"}, {"rev"});
  b.node("Shape", {"rev"}, {"shape"});
  const int64_t before = max_rss_mb();
  auto model = b.load();  // load-time folding leaves a ConstantOfShape this large to the graph
  auto f = compile([model](const Tensor& x) { return model->forward({x}); }, {.name = "huge_slice", .arg_names = {"x"}});
  std::vector<Tensor> out = f(zeros({1}));
  EXPECT_LT(max_rss_mb() - before, 512) << "load or capture built something proportional to the sliced dim";
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].to_vector<int64_t>(), std::vector<int64_t>{n});
}

// The general bound on load-time folding: a node whose folded value is above 64 MiB (here a Tile of a
// constant to 2^25 floats, 128 MiB, and an Expand to 2^26, a broadcast view counted at its full size)
// stays in the graph; the model still computes the right answer when it runs.
TEST(OnnxReliability, FoldedConstantsAboveTheLimitStayInTheGraph) {
  Builder b(13);
  b.input("x", F32, {1}).output("t").output("e");
  b.const_f32("one", {1}, {2.0f});
  b.const_i64("reps", {int64_t{1} << 25});
  b.node("Tile", {"one", "reps"}, {"tiled"});
  b.const_i64("shape", {int64_t{1} << 26});
  b.node("Expand", {"one", "shape"}, {"wide"});
  b.const_i64("small", {4});
  b.node("Expand", {"one", "small"}, {"folded"});  // small: folded away
  b.node("ReduceSum", {"tiled"}, {"t_sum"});
  b.node("Mul", {"t_sum", "x"}, {"t"});
  b.node("ReduceMax", {"wide"}, {"e_max"});
  b.node("Add", {"e_max", "folded"}, {"e"});
  const int64_t before = max_rss_mb();
  auto model = b.load();
  EXPECT_LT(max_rss_mb() - before, 100) << "folding built a value above the limit";
  EXPECT_EQ(model->num_live_nodes(), 6) << "Tile and the large Expand stay; the small Expand is folded";
  std::vector<Tensor> out = model->forward({full({1}, 0.5)});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0].to_vector<float>()[0], 0.5 * 2.0 * static_cast<double>(int64_t{1} << 25), 64.0);
  EXPECT_EQ(out[1].to_vector<float>(), (std::vector<float>{4, 4, 4, 4}));
}

TEST(OnnxReliability, NegativeStepSliceStillSelectsTheRightElements) {
  Builder b(13);
  b.input("x", F32, {2, 7}).output("y").output("z");
  b.const_i64("st", {5}).const_i64("en", {0}).const_i64("ax", {1}).const_i64("sp", {-2});
  b.node("Slice", {"x", "st", "en", "ax", "sp"}, {"y"});
  b.const_i64("st2", {-100}).const_i64("en2", {-200}).const_i64("sp2", {-1});
  b.node("Slice", {"x", "st2", "en2", "ax", "sp2"}, {"z"});
  auto model = b.load();
  std::vector<float> v(14);
  for (int i = 0; i < 14; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  auto f = compile([model](const Tensor& x) { return model->forward({x}); }, {.name = "neg_slice"});
  for (auto& out : {model->forward({tensor<float>(v, {2, 7})}), f(tensor<float>(v, {2, 7}))}) {
    EXPECT_EQ(out[0].int_sizes(), (IntVec{2, 3}));
    EXPECT_EQ(out[0].to_vector<float>(), (std::vector<float>{5, 3, 1, 12, 10, 8}));
    // ONNX clamps a negative step's start to [0, d-1]: -100 selects index 0 alone
    EXPECT_EQ(out[1].int_sizes(), (IntVec{2, 1}));
    EXPECT_EQ(out[1].to_vector<float>(), (std::vector<float>{0, 7}));
  }
}

std::string load_error(const Builder& b) {
  try {
    b.load();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "no FormatError";
}

TEST(OnnxReliability, InputDeclarationsThatAdmitAnythingAreRefused) {
  {
    Builder b(13);
    b.input("x", F32, {1, 3});
    b.graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(-4);
    b.output("y");
    b.node("Relu", {"x"}, {"y"});
    EXPECT_NE(load_error(b).find("input 'x' declares dim 1 as -4"), std::string::npos) << load_error(b);
  }
  {
    Builder b(13);
    b.input("s", ::onnx::TensorProto::STRING, {2}).output("y");
    b.node("Identity", {"s"}, {"y"});
    EXPECT_NE(load_error(b).find("input 's' is declared with element type"), std::string::npos) << load_error(b);
  }
}

TEST(OnnxReliability, ModelPathThatIsAFifoIsRefused) {
  std::string fifo = "/tmp/protean-model-fifo-" + std::to_string(getpid()) + ".onnx";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string msg = "no error";
  try {
    onnx::load(fifo);  // blocked forever in open() before
  } catch (const Error& e) {
    msg = e.what();
  }
  ::unlink(fifo.c_str());
  EXPECT_NE(msg.find("it is a FIFO (named pipe), not a regular file"), std::string::npos) << msg;
}

}  // namespace
}  // namespace protean

namespace protean {
namespace {
// An op that fails while the compiled graph runs (an index out of range, found only at run time)
// names the ONNX node it ran for, not only the op.
TEST(OnnxReliability, ARunTimeErrorNamesTheOnnxNode) {
  Builder b(13);
  b.input("x", F32, {1, 4}).input("i", ::onnx::TensorProto::INT64, {2}).output("y");
  b.node("Gather", {"x", "i"}, {"y"}, "pick_columns")->add_attribute()->CopyFrom([] {
    ::onnx::AttributeProto a;
    a.set_name("axis");
    a.set_type(::onnx::AttributeProto::INT);
    a.set_i(1);
    return a;
  }());
  auto model = b.load();
  // The interpreter and the cpu backend's extern steps alike (the cpu program keeps each extern's node
  // index, also in a cached plan, and takes the location from the graph it runs for).
  for (const char* backend : {"interp", "cpu"}) {
    SCOPED_TRACE(backend);
    auto f = compile([model](const Tensor& x, const Tensor& i) { return model->forward({x, i}); },
                     {.name = std::string("gather_oob_") + backend, .arg_names = {"x", "i"}, .backend = backend});
    EXPECT_EQ(f(zeros({1, 4}), tensor<int64_t>({0, 3}, {2}))[0].int_sizes(), (IntVec{1, 2}));
    try {
      f(zeros({1, 4}), tensor<int64_t>({0, 100}, {2}));
      ADD_FAILURE() << "an out-of-range index ran";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("onnx node 'pick_columns' (Gather)"), std::string::npos) << m;
      EXPECT_EQ(m.find("onnx node 'pick_columns' (Gather)"), m.rfind("onnx node 'pick_columns' (Gather)")) << m;
    }
  }
}

// ONNX's Add (Sub, Equal, Where's X and Y, Max, ...) takes inputs of one element type; an f32 beside
// an i64 is a malformed model (ONNX Runtime refuses it when it loads the model), not a promotion.
TEST(OnnxReliability, MixedElementTypesOfOneTypeConstraintAreRefused) {
  for (const char* op : {"Add", "Equal", "Max"}) {
    SCOPED_TRACE(op);
    Builder b(13);
    b.input("x", F32, {2, 3}).input("k", ::onnx::TensorProto::INT64, {2, 3}).output("y");
    b.node(op, {"x", "k"}, {"y"}, "mixed");
    auto model = b.load();
    auto f = compile([model](const Tensor& x, const Tensor& k) { return model->forward({x, k}); },
                     {.name = std::string("mixed_") + op, .arg_names = {"x", "k"}, .backend = "interp"});
    try {
      f(zeros({2, 3}), tensor<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3}));
      FAIL() << op << " of f32 and i64 ran";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("one element type"), std::string::npos) << m;
      EXPECT_NE(m.find("input 0 is f32 and input 1 is i64"), std::string::npos) << m;
      EXPECT_NE(m.find("'mixed'"), std::string::npos) << m;
    }
  }
  // Two floating types are not refused: LoadOptions::float_dtype retypes the model's floats, and an op
  // whose output type is an attribute (RandomNormal's dtype, float by default) keeps its own.
  {
    Builder b(17);
    b.input("x", F32, {3}).output("y");
    auto* n = b.node("RandomNormal", {}, {"r"});
    Builder::attr_ints(n, "shape", {3});
    Builder::attr_f(n, "seed", 1);
    b.node("Add", {"x", "r"}, {"y"});
    for (DType fd : {DType::F32, DType::BF16}) {
      auto m = onnx::load_from_bytes(b.bytes(), "random_normal_add.onnx", {.float_dtype = fd});
      EXPECT_NO_THROW(m->forward({randn({3}).to(fd)})) << short_name(fd);
    }
  }
  // Integer inputs of different widths stay accepted (uint16/uint32 are carried in wider dtypes).
  Builder b(13);
  b.input("a", ::onnx::TensorProto::INT32, {3}).input("c", ::onnx::TensorProto::INT64, {3}).output("y");
  b.node("Add", {"a", "c"}, {"y"}, "ints");
  auto model = b.load();
  auto f = compile([model](const Tensor& a, const Tensor& c) { return model->forward({a, c}); },
                   {.name = "mixed_ints", .arg_names = {"a", "c"}, .backend = "interp"});
  EXPECT_NO_THROW(f(tensor<int32_t>({1, 2, 3}, {3}), tensor<int64_t>({1, 2, 3}, {3})));
}
}  // namespace
}  // namespace protean
