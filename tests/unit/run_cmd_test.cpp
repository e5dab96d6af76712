// `protean run` argument checks: scalar inputs and repeated input names.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "protean/error.h"
#include "protean/run_cmd.h"

namespace protean::tools {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(RunCmd, ScalarInputsAreExact) {
  EXPECT_EQ(parse_scalar_input("n", "16000", DType::I64).item<int64_t>(), 16000);
  EXPECT_EQ(parse_scalar_input("n", "9007199254740993", DType::I64).item<int64_t>(), 9007199254740993LL);
  EXPECT_EQ(parse_scalar_input("n", "-5", DType::I32).item<int32_t>(), -5);
  EXPECT_FLOAT_EQ(parse_scalar_input("f", "16000.7", DType::F32).item<float>(), 16000.7f);
}

TEST(RunCmd, BadScalarInputsNameTheInput) {
  std::string e = error_of([] { parse_scalar_input("n", "16000.7", DType::I64); });
  EXPECT_NE(e.find("'n'"), std::string::npos) << e;
  EXPECT_NE(e.find("not an integer"), std::string::npos) << e;
  e = error_of([] { parse_scalar_input("n", "18446744073709567616", DType::I64); });
  EXPECT_NE(e.find("'n'"), std::string::npos) << e;
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of([] { parse_scalar_input("n", "3000000000", DType::I32); });
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of([] { parse_scalar_input("f", "1e999", DType::F32); });
  EXPECT_NE(e.find("'f'"), std::string::npos) << e;
  e = error_of([] { parse_scalar_input("f", "1.5abc", DType::F32); });
  EXPECT_NE(e.find("not a number"), std::string::npos) << e;
}

TEST(RunCmd, RepeatedInputNameHintsAtShellBraceExpansion) {
  EXPECT_EQ(error_of([] { check_unique_input_names({"x", "y"}); }), "");
  std::string e = error_of([] { check_unique_input_names({"x", "y", "x"}); });
  EXPECT_NE(e.find("'x' is given more than once"), std::string::npos) << e;
  EXPECT_NE(e.find("quote"), std::string::npos) << e;
  EXPECT_NE(e.find("{160,320}"), std::string::npos) << e;
}

}  // namespace
}  // namespace protean::tools
