// Helpers for the cpu backend tests (cpu_backend_test.cpp, cpu_post_ops_test.cpp): one private kernel
// cache directory per test process, and result comparison with a tolerance chosen by dtype.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "protean/ops.h"
#include "protean/tensor.h"

namespace protean::backend::cpu::testing {

/// Tests share one private cache dir per process (unless the environment already names one).
inline void use_test_cache_dir() {
  static bool done = [] {
    if (!std::getenv("PROTEAN_CACHE_DIR")) {
      std::string d = "/tmp/protean-cpu-test-" + std::to_string(getpid());
      setenv("PROTEAN_CACHE_DIR", d.c_str(), 1);
    }
    return true;
  }();
  (void)done;
}

/// The absolute and relative tolerance for results of dtype `t`: 1e-9 for f64, 2e-4 otherwise.
inline double default_tol(DType t) { return t == DType::F64 ? 1e-9 : 2e-4; }

/// `got` has `want`'s dtype and sizes and matches it within `tol` (default: default_tol of `want`'s
/// dtype), NaNs equal; `what` names the comparison in a failure.
inline void expect_close(const Tensor& got, const Tensor& want, const std::string& what,
                         std::optional<double> tol = std::nullopt) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.int_sizes(), want.int_sizes()) << what;
  double t = tol.value_or(default_tol(want.dtype()));
  EXPECT_TRUE(allclose(got, want, t, t, true)) << what << ": max abs diff " << max_abs_diff(got, want);
}

}  // namespace protean::backend::cpu::testing
