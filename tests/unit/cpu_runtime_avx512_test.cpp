// The cpu runtime header compiled with -mavx512f (CMakeLists.txt sets the flag on this file): its
// AVX-512 vector forms (vscalefps exp, vpermt2ps normal_cdf, tanh, sigmoid) against its scalar forms.
// Skips on a processor without AVX-512F.
#include "backend/cpu/runtime/prelude.h"

#include <gtest/gtest.h>

#include "cpu_runtime_checks.h"

namespace {

bool has_avx512f() { return __builtin_cpu_supports("avx512f"); }

TEST(CpuRuntimeAvx512, VectorFormsMatchScalarForms) {
#if !defined(__AVX512F__)
  GTEST_SKIP() << "this file was compiled without -mavx512f";
#else
  if (!has_avx512f()) GTEST_SKIP() << "the processor has no AVX-512F";
  runtime_checks::vector_forms();
#endif
}

TEST(CpuRuntimeAvx512, NanPropagation) {
#if defined(__AVX512F__)
  if (!has_avx512f()) GTEST_SKIP() << "the processor has no AVX-512F";
  runtime_checks::nan_propagation();
#else
  GTEST_SKIP() << "this file was compiled without -mavx512f";
#endif
}

}  // namespace
