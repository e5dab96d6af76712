// Inputs a user controls are parsed strictly and refused by name: rank variables, job ids, PGO
// profiles with impossible contents, Redis URLs with IPv6 hosts, random:SHAPE sizes beyond 64 bits
// or bytes, output paths that cannot be written (checked before the model runs), strict marks and
// symbolic size overflow (protean::Error, not a std:: exception), conv parameters beyond 32 bits.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "dynamic/pgo.h"
#include "dynamic/profile_store.h"
#include "observe/trace.h"
#include "onnx_test_util.h"
#include "ops/registry.h"
#include "protean/protean.h"
#include "protean/run_cmd.h"
#include "sym/expr.h"
#include "test_env.h"

namespace protean {
namespace {

namespace fs = std::filesystem;

template <typename E = Error>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no error";
}

using protean::testing::EnvScope;

TEST(StrictInputs, RankVariablesAreParsedStrictly) {
  EnvScope omp("OMPI_COMM_WORLD_RANK", nullptr), pmi("PMI_RANK", nullptr);
  observe::set_trace_rank(-1);  // a rank set by an earlier group in this process (store tests) is forgotten
  for (const char* bad : {"abc", "-1", "1x", "99999999999", ""}) {
    EnvScope r("PROTEAN_RANK", bad);
    std::string e = error_of<ValueError>([] { observe::trace_rank(); });
    EXPECT_NE(e.find(fmt::format("PROTEAN_RANK='{}': expected a rank", bad)), std::string::npos) << bad << ": " << e;
  }
  EnvScope r("PROTEAN_RANK", "3");
  EXPECT_EQ(observe::trace_rank(), 3);
}

TEST(StrictInputs, JobIdsStayInsideTheCache) {
  for (const char* bad : {"../../x", "a/b", "..", ".", "", "x y", "a\\b"}) {
    std::string e = error_of<ValueError>([&] { dynamic::check_job_id(bad, "--job-id"); });
    EXPECT_NE(e.find("--job-id: bad job id"), std::string::npos) << bad << ": " << e;
  }
  EXPECT_EQ(error_of([] { dynamic::check_job_id("ocr-run_2.v1", "--job-id"); }), "no error");
  EnvScope j("PROTEAN_JOB_ID", "../../x");
  EXPECT_NE(error_of<ValueError>([] { dynamic::PgoConfig::from_env(); }).find("PROTEAN_JOB_ID: bad job id '../../x'"),
            std::string::npos);
  tools::RunArgs a;
  a.model = "/nonexistent.onnx";
  a.job_id = "../../x";
  EXPECT_NE(error_of<ValueError>([&] { tools::run_command(a); }).find("--job-id: bad job id"), std::string::npos);
}

std::string valid_profile_text() {
  dynamic::FrameProfile fp;
  fp.id = {"f", "f.cpp", 3, "abc"};
  dynamic::SourceProfile s;
  s.rank = 2;
  s.sizes = {{dynamic::LatticeValue::State::Value, 4}, {dynamic::LatticeValue::State::Dynamic, 0}};
  s.strides = {{dynamic::LatticeValue::State::Value, 8}, {dynamic::LatticeValue::State::Value, 1}};
  s.size_range = {{4, 4}, {2, 9}};
  fp.sources["x"] = s;
  dynamic::Profile p;
  p.frames[fp.id.key()] = fp;
  return dynamic::dump_profile(p);
}

TEST(StrictInputs, ImpossibleProfilesAreCorrupt) {
  ASSERT_EQ(error_of([] { dynamic::parse_profile(valid_profile_text(), "p.json"); }), "no error");
  auto with = [](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(valid_profile_text());
    nlohmann::json& src = j["frames"].begin().value()["sources"]["x"];
    edit(src);
    return error_of<FormatError>([&] { dynamic::parse_profile(j.dump(), "p.json"); });
  };
  EXPECT_NE(with([](nlohmann::json& s) { s["sizes"][0] = -4; }).find("negative value -4"), std::string::npos);
  EXPECT_NE(with([](nlohmann::json& s) { s["strides"][1] = -1; }).find("negative value -1"), std::string::npos);
  // an unsigned 2^64 - 1 read as int64 was -1 ("negative value -1")
  EXPECT_NE(with([](nlohmann::json& s) { s["sizes"][0] = UINT64_MAX; }).find("value 18446744073709551615 is larger than any size"),
            std::string::npos);
  EXPECT_NE(with([](nlohmann::json& s) { s["size_range"][1] = {9, 2}; }).find("is not a range of sizes"), std::string::npos);
  EXPECT_NE(with([](nlohmann::json& s) { s["size_range"][0] = {-3, 4}; }).find("is not a range of sizes"), std::string::npos);
  EXPECT_NE(with([](nlohmann::json& s) { s["size_range"].push_back({1, 2}); }).find("3 size_range items for a tensor of rank 2"),
            std::string::npos);
}

TEST(StrictInputs, RedisUrlsWithIpv6Hosts) {
  auto u = dynamic::parse_redis_url("redis://[::1]:1/p");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 1);
  EXPECT_EQ(u.prefix, "p");
  u = dynamic::parse_redis_url("redis://[fe80::1]/q");
  EXPECT_EQ(u.host, "fe80::1");
  EXPECT_EQ(u.port, 6379);
  u = dynamic::parse_redis_url("redis://cache.local:6380/r");
  EXPECT_EQ(u.host, "cache.local");
  EXPECT_EQ(u.port, 6380);
  EXPECT_NE(error_of<ValueError>([] { dynamic::parse_redis_url("redis://::1:6379/p"); }).find("in brackets"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { dynamic::parse_redis_url("redis://h:99999/p"); }).find("bad port '99999'"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { dynamic::parse_redis_url("redis://h:6x/p"); }).find("bad port '6x'"), std::string::npos);
  EXPECT_NE(error_of<ValueError>([] { dynamic::parse_redis_url("redis://[::1/p"); }).find("unclosed '['"), std::string::npos);
}

TEST(StrictInputs, RandomShapeSizesBeyond64Bits) {
  std::string e = error_of<ValueError>([] { tools::expand_shape_sweep("1x3x48x99999999999999999999"); });
  EXPECT_NE(e.find("size 99999999999999999999 does not fit in 64 bits"), std::string::npos) << e;
}

// Every shape of a sweep is built before anything runs: 10^8 of them ran out of memory
// ("internal error: std::bad_alloc"); the count is checked first.
TEST(StrictInputs, RandomShapeSweepsAreRefusedByTheirCount) {
  const std::string ten = "{1,2,3,4,5,6,7,8,9,10}";
  std::string e = error_of<ValueError>([&] { tools::expand_shape_sweep(fmt::format("{0}x{0}x{0}x{0}x{0}x{0}x{0}x{0}", ten)); });
  EXPECT_NE(e.find("the sweep has more than 100000 shapes"), std::string::npos) << e;
  EXPECT_EQ(tools::expand_shape_sweep(fmt::format("{0}x{0}x{0}x{0}x{0}", ten)).size(), 100000u);
}

// An .onnx file over protobuf's 2 GiB limit is refused by its size, before it is read (it was read
// whole: std::bad_alloc under a memory limit). A sparse file: no disk space is used.
TEST(StrictInputs, AnOnnxFileOverTwoGibIsRefusedUnread) {
  const std::string path = fmt::format("/tmp/protean-huge-{}.onnx", getpid());
  { std::ofstream(path, std::ios::binary).put('\0'); }
  fs::resize_file(path, uint64_t{3} << 30);
  std::string e = error_of<RuntimeError>([&] { (void)onnx::load(path); });
  EXPECT_NE(e.find("ONNX model '" + path + "' has 3221225472 bytes; a protobuf message (an .onnx file) is at most 2 GiB"),
            std::string::npos)
      << e;
  fs::remove(path);
}

// Errors of the load-time passes (constant folding reads a Constant's attribute) name the model.
TEST(StrictInputs, LoadTimeErrorsNameTheModel) {
  onnx_test::Builder b(13);
  b.input("x", ::onnx::TensorProto::FLOAT, {2}).output("y");
  auto* c = b.node("Constant", {}, {"c"}, "cst");
  onnx_test::Builder::attr_i(c, "value", 3);
  b.node("Add", {"x", "c"}, {"y"});
  const std::string path = fmt::format("/tmp/protean-constant-{}.onnx", getpid());
  std::ofstream(path, std::ios::binary) << b.bytes();
  std::string e = error_of<FormatError>([&] { (void)onnx::load(path); });
  EXPECT_NE(e.find("ONNX model '" + path + "': attribute 'value' of node 'cst' (Constant) has type int, expected tensor"),
            std::string::npos)
      << e;
  fs::remove(path);
}

/// A one-input model (Relu) written to a file.
std::string relu_model() {
  onnx_test::Builder b(13);
  b.input("x", ::onnx::TensorProto::FLOAT, {-1, -1}, {"N", "C"}).output("y");
  b.node("Relu", {"x"}, {"y"});
  std::string path = fmt::format("/tmp/protean-relu-{}.onnx", getpid());
  std::ofstream(path, std::ios::binary) << b.bytes();
  return path;
}

TEST(StrictInputs, RunRefusesBadInputsAndOutputsBeforeRunning) {
  const std::string model = relu_model();
  reset();
  tools::RunArgs a;
  a.model = model;
  a.quiet = true;
  a.inputs = {"x=random:4294967296x4294967296"};
  std::string e = error_of<ShapeError>([&] { tools::run_command(a); });
  EXPECT_NE(e.find("input 'x' (random:4294967296x4294967296)"), std::string::npos) << e;
  a.inputs = {"x=random:2x3"};
  a.stats_json = "/proc/self/stats.json";  // a directory nobody (not even root) can create files in
  e = error_of<ValueError>([&] { tools::run_command(a); });
  EXPECT_NE(e.find("--stats-json '/proc/self/stats.json': cannot write it"), std::string::npos) << e;
  EXPECT_EQ(stats().compiles, 0) << "the model ran before --stats-json was checked";
  a.stats_json.clear();
  a.save_outputs = "/proc/self";
  e = error_of<ValueError>([&] { tools::run_command(a); });
  EXPECT_NE(e.find("--save-outputs '/proc/self': cannot write files in it"), std::string::npos) << e;
  EXPECT_EQ(stats().compiles, 0) << "the model ran before the output paths were checked";
  a.save_outputs.clear();
  EXPECT_EQ(tools::run_command(a), 0);  // the same inputs run when the outputs can be written
  fs::remove(model);
}

TEST(ErrorsNameTheirSource, StrictMarkOutsideItsRangeIsACompileError) {
  reset();
  auto f = compile([](const Tensor& x) { return add(x, 1.0); }, {.name = "marked", .arg_names = {"x"}});
  Tensor x = randn({3, 2});
  mark_dynamic(x, 0, 10, 20);
  std::string e = error_of<CompileError>([&] { f(x); });
  EXPECT_NE(e.find("x.size()[0] = 3 is outside the range"), std::string::npos) << e;
  // a range no size can have is refused when marked, not at the first call
  e = error_of<ValueError>([&] { mark_dynamic(x, 0, -5, -1); });
  EXPECT_NE(e.find("mark_dynamic: a size's range cannot reach below 0 (min -5, max -1)"), std::string::npos) << e;
  e = error_of<ValueError>([&] { mark_dynamic(x, 0, 20, 10); });
  EXPECT_NE(e.find("min 20 > max 10"), std::string::npos) << e;
}

TEST(ErrorsNameTheirSource, SymbolicSizeOverflowIsAShapeError) {
  std::string e = error_of<ShapeError>([] { sym::checked_mul(int64_t{1} << 62, 4); });
  EXPECT_NE(e.find("size arithmetic overflows int64: 4611686018427387904 * 4"), std::string::npos) << e;
  e = error_of<ShapeError>([] { sym::add(sym::integer(std::numeric_limits<int64_t>::max()), sym::integer(1)); });
  EXPECT_NE(e.find("overflows int64"), std::string::npos) << e;
}

TEST(ErrorsNameTheirSource, ConvParametersBeyond32BitsNameTheCall) {
  Tensor x = randn({1, 2, 5, 5}), w = randn({3, 2, 3, 3});
  std::string e = error_of<ValueError>([&] { conv2d(x, w, {}, {int64_t{1} << 31, 1}); });
  EXPECT_NE(e.find("stride must be < 2^31"), std::string::npos) << e;
  EXPECT_NE(e.find("conv2d("), std::string::npos) << e;
  e = error_of<ValueError>([&] { conv2d(x, w, {}, {1, 1}, {0, 0}, {int64_t{1} << 40, 1}); });
  EXPECT_NE(e.find("dilation must be < 2^31"), std::string::npos) << e;
}

}  // namespace
}  // namespace protean
