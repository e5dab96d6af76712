// The cuBLASLt algorithm table's file format (backend/cuda/blas.h): what a warm process reads instead
// of asking cuBLASLt's heuristic. No GPU and no cuBLASLt needed: the bytes are checked on their own.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>

#include <string>

#include "backend/cuda/blas.h"
#include "protean/error.h"

namespace pt = protean;
namespace bc = protean::backend::cuda;

namespace {

bc::BlasAlgoTable two_entries() {
  bc::BlasAlgoTable t;
  bc::BlasAlgoKey qkv;  // GPT-2's QKV projection at 64 rows: bf16, Linear (b transposed), bias epilogue
  qkv.dtype = static_cast<int32_t>(pt::DType::BF16);
  qkv.transpose_b = 1;
  qkv.epilogue = 4;
  qkv.m = 64, qkv.n = 2304, qkv.k = 768;
  bc::BlasAlgoChoice c1;
  c1.workspace = 1 << 20;
  c1.algos.push_back({1, 2, 3, 4, 5, 6, 7, 8});
  c1.algos.push_back({9, 10, 11, 12, 13, 14, 15, 16});
  c1.first_count = 1;  // the second answered the one-kernel query only
  c1.one_kernel_asked = true;
  t[qkv] = c1;
  bc::BlasAlgoKey batched = qkv;  // a strided batched product (attention's [B, H, s, d] x [B, H, d, s])
  batched.transpose_b = 0;
  batched.epilogue = 1;
  batched.batch = 12, batched.m = 64, batched.n = 64, batched.k = 64;
  batched.stride_a = 4096, batched.stride_b = 4096;
  bc::BlasAlgoChoice c2;
  c2.algos.push_back({~0ull, 0, 1, 0, 0, 0, 0, 42});
  c2.first_count = 1;
  t[batched] = c2;
  return t;
}

}  // namespace

TEST(BlasAlgorithmTable, RoundTripKeepsEveryKeyAndAlgorithm) {
  const bc::BlasAlgoTable t = two_entries();
  const std::string bytes = bc::encode_blas_algorithms(t, 0x1234);
  EXPECT_EQ(bytes.substr(0, 8), "PTLTALG2");
  const bc::BlasAlgoTable back = bc::decode_blas_algorithms(bytes, 0x1234);
  EXPECT_EQ(back, t);
  // An empty table is a valid file too (a process that made no call).
  EXPECT_TRUE(bc::decode_blas_algorithms(bc::encode_blas_algorithms({}, 7), 7).empty());
}

TEST(BlasAlgorithmTable, AnotherLibraryOrDeviceIsRefusedByName) {
  const std::string bytes = bc::encode_blas_algorithms(two_entries(), 0x1234);
  try {
    bc::decode_blas_algorithms(bytes, 0x9999);
    FAIL() << "a table of another identity was accepted";
  } catch (const pt::FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("another library or device"), std::string::npos) << e.what();
  }
}

TEST(BlasAlgorithmTable, CorruptBytesAreAFormatErrorNeverACrash) {
  const std::string bytes = bc::encode_blas_algorithms(two_entries(), 0x1234);
  // Every truncation, and every single flipped byte, is refused.
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(bc::decode_blas_algorithms(bytes.substr(0, n), 0x1234), pt::FormatError) << "truncated to " << n;
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    EXPECT_THROW(bc::decode_blas_algorithms(bad, 0x1234), pt::FormatError) << "byte " << i << " flipped";
  }
  // Bytes appended after a valid file: the checksum no longer sits at the end.
  EXPECT_THROW(bc::decode_blas_algorithms(bytes + std::string(8, '\0'), 0x1234), pt::FormatError);
  EXPECT_THROW(bc::decode_blas_algorithms("not a table at all", 0x1234), pt::FormatError);
}

TEST(BlasAlgorithmTable, AnEntryMustSplitItsAlgorithmsWhereItsQueriesDid) {
  // Encoded with the checksum recomputed, so only the entry's own check can refuse it.
  for (auto [first, asked, count] : {std::tuple{0u, false, 2}, std::tuple{3u, true, 2}, std::tuple{1u, false, 2},
                                     std::tuple{1u, true, 10}}) {  // the last: 9 one-kernel algorithms, 8 at most
    bc::BlasAlgoTable t = two_entries();
    bc::BlasAlgoChoice& c = t.begin()->second;
    c.algos.clear();
    for (int a = 0; a < count; ++a) c.algos.push_back({uint64_t(a), 1, 2, 3, 4, 5, 6, 7});
    c.first_count = first;  // 0, past the algorithms, or short of them without a one-kernel query
    c.one_kernel_asked = asked;
    try {
      bc::decode_blas_algorithms(bc::encode_blas_algorithms(t, 0x1234), 0x1234);
      FAIL() << "an entry split at " << first << " was accepted";
    } catch (const pt::FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("splits its {} algorithms", count)), std::string::npos) << e.what();
    }
  }
}
