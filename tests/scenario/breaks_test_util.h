// Helpers for the graph-break scenarios (breaks_scenarios.cpp, breaks_backend_scenarios.cpp): the
// fixture that gives every scenario a fresh process state, and the comparison with eager results.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "protean/protean.h"

namespace protean::scenario {

/// A scenario starts with no frames, entries or stats (reset()), the default stance, verify mode
/// off (PROTEAN_VERIFY unset) and seed 0.
class BreaksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    reset();
    set_stance(Stance::Default);
    unsetenv("PROTEAN_VERIFY");
    manual_seed(0);
  }
};

/// `got` is a real tensor with `want`'s sizes, equal to it within rtol 1e-4, atol 1e-5 (compared in f64).
inline void expect_same(const Tensor& got, const Tensor& want) {
  ASSERT_FALSE(got.is_fake());
  ASSERT_EQ(hints(got.sizes()), hints(want.sizes()));
  EXPECT_TRUE(allclose(got.to(DType::F64), want.to(DType::F64), 1e-4, 1e-5));
}

/// The message of the CompileError `call` throws; a test failure (and "") when it returns normally.
inline std::string compile_error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const CompileError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected CompileError";
  return "";
}

/// first, first + 1, ..., first + n - 1 (expected frame ids).
inline std::vector<int> consecutive(int first, int n) {
  std::vector<int> r;
  for (int i = 0; i < n; ++i) r.push_back(first + i);
  return r;
}

}  // namespace protean::scenario
