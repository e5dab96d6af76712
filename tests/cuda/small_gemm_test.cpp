// The small-product path (backend/cuda/small_gemm.h) without a GPU: which products it takes, how it
// splits K over the blocks, and that its kernels compile with NVRTC for sm_90 without spilling. The
// results on a real GPU are CudaGpu.SmallProductsMatchF64AndKeepRowsBitIdenticalAcrossRowCounts.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/nvrtc.h"
#include "backend/cuda/small_gemm.h"

namespace pt = protean;
namespace bc = protean::backend::cuda;

namespace {

bc::BlasStep product(pt::DType dt = pt::DType::BF16) {
  bc::BlasStep st;
  st.dtype = dt;
  st.a = 0, st.b = 1, st.out = 2;
  return st;
}

bc::BlasShape shape(int64_t m, int64_t n, int64_t k, int64_t batch = 1) {
  bc::BlasShape s;
  s.batch = batch, s.m = m, s.n = n, s.k = k, s.stride_a = m * k, s.stride_b = k * n;
  return s;
}

struct MaxRows {
  explicit MaxRows(int64_t r) { bc::set_small_gemm_max_rows_for_testing(r); }
  ~MaxRows() { bc::set_small_gemm_max_rows_for_testing(-1); }
};

TEST(SmallGemmPlan, GptShapesSplitKToAboutOneBlockPerMultiprocessor) {
  MaxRows rows(64);
  std::string why;
  // GPT-2 small at 37 tokens on 132 multiprocessors. QKV 768 -> 2304: 36 column tiles, clusters of 4
  // blocks of 192 rows of K (144 blocks).
  auto qkv = bc::small_gemm_plan(product(), shape(37, 2304, 768), 132, why);
  ASSERT_TRUE(qkv) << why;
  EXPECT_EQ(qkv->row_tiles16, 3);
  EXPECT_EQ(qkv->col_tiles, 36);
  EXPECT_EQ(qkv->splits, 4);
  EXPECT_EQ(qkv->kc, 192);
  // out-projection 768 -> 768: 12 tiles, the cluster's limit of 8 blocks (96 blocks of 96 rows)
  auto out = bc::small_gemm_plan(product(), shape(37, 768, 768), 132, why);
  ASSERT_TRUE(out) << why;
  EXPECT_EQ(out->splits, 8);
  EXPECT_EQ(out->kc, 96);
  // FC2 3072 -> 768: 8 blocks of 384 rows
  auto fc2 = bc::small_gemm_plan(product(), shape(37, 768, 3072), 132, why);
  ASSERT_TRUE(fc2) << why;
  EXPECT_EQ(fc2->splits, 8);
  EXPECT_EQ(fc2->kc, 384);
  // FC1 768 -> 3072 at 64 rows: 48 tiles, 4 row tiles of 16, clusters of 3 (256 rows each)
  auto fc1 = bc::small_gemm_plan(product(), shape(64, 3072, 768), 132, why);
  ASSERT_TRUE(fc1) << why;
  EXPECT_EQ(fc1->row_tiles16, 4);
  EXPECT_EQ(fc1->splits, 3);
  EXPECT_EQ(fc1->kc, 256);
  // A cluster never has more blocks than K has 32-row stages, nor more than 8; every block has one.
  for (int64_t m : {1, 16, 17, 64})
    for (int64_t k : {32, 64, 96, 704, 768, 3072, 4096})
      for (int64_t n : {64, 768, 2304, 50304}) {
        auto p = bc::small_gemm_plan(product(), shape(m, n, k), 132, why);
        ASSERT_TRUE(p) << why;
        EXPECT_GE(p->splits, 1);
        EXPECT_LE(p->splits, 8);
        EXPECT_LE(p->splits, k / 32);
        EXPECT_GE(p->kc, 32);
        EXPECT_EQ(p->kc % 32, 0);
        EXPECT_GE(p->splits * p->kc, k);
      }
}

TEST(SmallGemmPlan, TheRowCountNeverChangesTheSlices) {
  // The slices depend on the columns and K only: row r has the same sum order at every row count
  // (what a graph captured at a bucket's padded rows relies on).
  MaxRows rows(64);
  std::string why;
  for (int64_t n : {768, 2304, 3072})
    for (int64_t k : {768, 3072}) {
      auto at1 = bc::small_gemm_plan(product(), shape(1, n, k), 132, why);
      for (int64_t m = 2; m <= 64; ++m) {  // (64: the limit MaxRows set)
        auto p = bc::small_gemm_plan(product(), shape(m, n, k), 132, why);
        ASSERT_TRUE(at1 && p);
        EXPECT_EQ(p->kc, at1->kc) << "m " << m << " n " << n << " k " << k;
        EXPECT_EQ(p->splits, at1->splits) << "m " << m << " n " << n << " k " << k;
      }
    }
}

TEST(SmallGemmPlan, RefusesWhatItCannotRunAndSaysWhy) {
  MaxRows rows(64);
  std::string why;
  EXPECT_FALSE(bc::small_gemm_plan(product(pt::DType::F32), shape(8, 768, 768), 132, why));
  EXPECT_NE(why.find("f32"), std::string::npos) << why;
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(8, 100, 768), 132, why));
  EXPECT_NE(why.find("multiple of 64"), std::string::npos) << why;
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(8, 768, 760), 132, why));
  EXPECT_NE(why.find("multiple of 32"), std::string::npos) << why;
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(65, 768, 768), 132, why));
  EXPECT_NE(why.find("65 rows"), std::string::npos) << why;
  bc::set_small_gemm_max_rows_for_testing(128);
  auto p128 = bc::small_gemm_plan(product(), shape(128, 768, 768), 132, why);
  ASSERT_TRUE(p128) << why;
  EXPECT_EQ(p128->row_tiles16, 8);
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(129, 768, 768), 132, why));
  bc::set_small_gemm_max_rows_for_testing(64);
  bc::BlasStep erf = product();
  erf.epilogue.gelu = bc::GeluForm::Erf;
  EXPECT_FALSE(bc::small_gemm_plan(erf, shape(8, 768, 768), 132, why));
  // a batch of distinct right-hand sides (attention's products) stays with cuBLASLt; a broadcast
  // weight folds the batch into the rows
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(8, 768, 768, 4), 132, why));
  bc::BlasShape folded = shape(8, 768, 768, 4);
  folded.stride_b = 0;
  auto p = bc::small_gemm_plan(product(), folded, 132, why);
  ASSERT_TRUE(p) << why;
  EXPECT_EQ(p->rows, 32);
  folded.m = 32, folded.stride_a = 32 * 768;  // 128 rows once folded: over the limit of 64
  EXPECT_FALSE(bc::small_gemm_plan(product(), folded, 132, why));
  bc::set_small_gemm_max_rows_for_testing(1000);  // 128 at most, whatever is asked
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(129, 768, 768), 132, why));
  bc::set_small_gemm_max_rows_for_testing(0);
  EXPECT_FALSE(bc::small_gemm_plan(product(), shape(8, 768, 768), 132, why));
}

TEST(SmallGemmPlan, KernelsCompileForSm90WithoutSpills) {
  bc::NvrtcResult r;
  try {
    bc::NvrtcOptions o;
    o.arch = "sm_90";
    r = bc::nvrtc_compile(bc::small_gemm_source(), "small_gemm.cu", o);
  } catch (const pt::CompileError& e) {
    if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
    throw;
  }
  int entries = 0;
  for (const char* dt : {"bf16", "f16"})
    for (const char* t : {"", "_t"})
      for (int rt = 1; rt <= 8; ++rt) {
        const std::string name = std::string("pt_small_gemm_") + dt + t + "_r" + std::to_string(rt);
        auto it = r.resources.find(name);
        ASSERT_NE(it, r.resources.end()) << name << " missing from the ptxas report";
        EXPECT_EQ(it->second.spill_stores, 0) << name;
        EXPECT_EQ(it->second.spill_loads, 0) << name;
        EXPECT_LE(it->second.registers, 128) << name;
        ++entries;
      }
  EXPECT_EQ(entries, 32);
}

}  // namespace
