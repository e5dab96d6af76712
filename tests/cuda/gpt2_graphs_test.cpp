// mode "reduce-overhead" on the tiny GPT-2 (tests/data/onnx/tiny_gpt2.onnx) against the fake driver:
// the real pipeline's program (NVRTC-compiled, run by the fake driver, which runs no kernel code) with
// a stand-in for cuBLASLt that launches one fake kernel per call. What this checks is the plan: every
// matrix product of the model is captured into the graph (the row-count-only ones padded to the
// bucket's bound), so one call is one graph launch per bucket. With the fused attention kernel (the
// default) no product depends on the length squared, so a new length inside a known bucket records
// nothing; with PROTEAN_CUDA_FUSED_ATTENTION=0 the attention products are captured at their exact
// shape and a new length records the bucket's graph again.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "backend/cuda/autotune.h"
#include "backend/cuda/blas.h"
#include "device/fake_driver.h"
#include "observe/log.h"
#include "cache/blob_cache.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"
#include "protean/protean.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace bc = protean::backend::cuda;

namespace {

// `timing`: PROTEAN_AUTOTUNE_TIMING for max-autotune ("" leaves it unset: graph).
void run_tiny_gpt2_under_graphs(bool fused_attention, const char* mode = "reduce-overhead", const char* timing = "") {
  namespace fs = std::filesystem;
  struct UnsetAtEnd {
    ~UnsetAtEnd() {
      unsetenv("PROTEAN_AUTOTUNE_TIMING");
      unsetenv("PROTEAN_CUDA_GRAPH_RECORD");
      unsetenv("PROTEAN_CUDA_FUSED_ATTENTION");
      unsetenv("PROTEAN_CACHE_DIR");
    }
  } unset_at_end;
  if (!fused_attention) setenv("PROTEAN_CUDA_FUSED_ATTENTION", "0", 1);
  drv::FakeDriver fake;
  fake.accept_any_kernel(true);
  bc::set_fake_blas_hook_for_testing(fake, 8);
  const std::string dir = fs::temp_directory_path() / fmt::format("protean-gpt2-graphs-test-{}", ::getpid());
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
  pt::cache::clear_blob_memory_cache();
  const char* env = std::getenv("PROTEAN_SOURCE_DIR");
  pt::onnx::LoadOptions lo;
  lo.float_dtype = pt::DType::BF16;
  lo.device = pt::kCUDA;
  auto m = pt::onnx::load(std::string(env && *env ? env : PROTEAN_SOURCE_DIR) + "/tests/data/onnx/tiny_gpt2.onnx", lo);
  pt::reset();
  bc::reset_autotune_stats();
  bc::reset_process_tuning_table();  // every run times its sites (the cache directory is fresh too)
  if (*timing) setenv("PROTEAN_AUTOTUNE_TIMING", timing, 1);
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);  // the fake driver is not thread-safe
  pt::CompileOptions o;
  o.name = m->identity();
  o.backend = "cuda";
  o.dynamic = pt::Dynamic::On;
  o.mode = mode;
  auto f = pt::compile([m](const pt::Tensor& x) { return m->forward({x})[0]; }, o);
  std::string log;
  int64_t steady_patches = -1;
  {
    pt::observe::LogCapture cap(std::getenv("PROTEAN_TEST_LOGS") ? "graphs,perf_hints,output_code" : "graphs,perf_hints");
    try {
      for (int64_t len : {13, 9, 16, 30}) {  // buckets [9, 16] and [17, 32]
        pt::manual_seed(static_cast<uint64_t>(len));
        f(pt::randint(0, 1000, {1, len}, pt::DType::I64).to(pt::kCUDA));
      }
      // calls like the one before them (the same length, input and output addresses) patch no node:
      // the weights are the program's constants, whose addresses stay (graphs.h: constant_params)
      const pt::Tensor same = pt::randint(0, 1000, {1, 30}, pt::DType::I64).to(pt::kCUDA);
      f(same);
      const int64_t before = pt::stats().graph_patches;
      f(same);
      f(same);
      steady_patches = pt::stats().graph_patches - before;
    } catch (const pt::CompileError& e) {
      bc::set_blas_hook_for_testing({});
      if (std::string(e.what()).find("NVRTC not found") != std::string::npos) GTEST_SKIP() << e.what();
      throw;
    }
    log = cap.str();
  }
  bc::set_blas_hook_for_testing({});
  if (std::getenv("PROTEAN_TEST_LOGS")) std::fprintf(stderr, "%s", log.c_str());
  const pt::Stats s = pt::stats();
  EXPECT_EQ(s.graph_buckets, 2);
  if (fused_attention)
    EXPECT_EQ(s.graph_recordings, 2) << "one graph (one segment) per bucket; 9 and 16 in [9, 16] record nothing\n" << log;
  else
    EXPECT_EQ(s.graph_recordings, 4) << "one graph (one segment) per bucket, again at 9 and 16 in [9, 16]\n" << log;
  EXPECT_EQ(s.graph_replays, 7);
  EXPECT_EQ(steady_patches, 0) << log;
  // the patch plan: only the lookup of the ids (an input) and the kernel writing the output carry
  // addresses that change per call; the LayerNorms' weights are constants (looked at on no steady call)
  int io_nodes = 0, constant_nodes = 0;
  const std::regex plan_line(R"(\(step \d+\); sizes [^;]*; io ([^;]*); constants ([^;]*);)");
  for (std::sregex_iterator it(log.begin(), log.end(), plan_line), end; it != end; ++it) {
    io_nodes += (*it)[1] != "-";
    constant_nodes += (*it)[2] != "-";
  }
  if (fused_attention) {
    EXPECT_EQ(io_nodes, 2) << "the ids' lookup and the output's kernel\n" << log;
    EXPECT_GE(constant_nodes, 4) << "the LayerNorms of two layers\n" << log;
  }
  // Each replay launches its segments, or their pipelined chunks (graphs.h: pipeline_chunks); the
  // count is read from the "new sizes" line, and every replay must launch as many. With the fused
  // attention every kernel reads its sizes from memory, so a new size patches no node for its sizes
  // and the segment is one graph; the unfused program has a cumsum that takes its sizes by value, so
  // its 19 steps are split into chunks.
  std::smatch chunks;
  ASSERT_TRUE(std::regex_search(log, chunks, std::regex(R"(new sizes .* (\d+) launch\(es\))"))) << log;
  const int per_call = std::stoi(chunks[1]);
  if (fused_attention) EXPECT_EQ(per_call, 1) << "one graph per bucket, no chunks\n" << log;
  else EXPECT_GE(per_call, 2) << "more than 8 steps are split into at least two chunks\n" << log;
  // max-autotune times each candidate in a graph of its own (PROTEAN_AUTOTUNE_TIMING=graph, and a
  // value it does not know): one launch to warm up, then five timed; "cold" and "hot" launch no graph
  const bool autotuned = std::string(mode) == "max-autotune";
  const bool in_graph = autotuned && std::string(timing) != "cold" && std::string(timing) != "hot";
  if (autotuned) {
    EXPECT_GT(bc::autotune_stats().candidates_timed, 0) << log;
  }
  const int64_t tuning_launches = in_graph ? 6 * bc::autotune_stats().candidates_timed : 0;
  EXPECT_EQ(fake.stats().graph_launches, 7 * per_call + tuning_launches) << log;
  EXPECT_EQ(s.graph_plain_runs, 0);
  EXPECT_EQ(log.find("split into"), std::string::npos) << "no library call splits the graph\n" << log;
  EXPECT_NE(log.find(": padded"), std::string::npos) << log;
  EXPECT_GE(fake.stats().child_nodes_added, 2 * 2 * 4) << "two layers' Linear calls, per bucket";
  fs::remove_all(dir);
}

}  // namespace

TEST(CudaGraphs, TinyGpt2IsOneGraphPerBucket) { run_tiny_gpt2_under_graphs(true); }
TEST(CudaGraphs, TinyGpt2WithUnfusedAttentionRecordsANewLengthAgain) { run_tiny_gpt2_under_graphs(false); }
TEST(CudaGraphs, TinyGpt2UnderMaxAutotune) { run_tiny_gpt2_under_graphs(true, "max-autotune"); }
TEST(CudaGraphs, TinyGpt2UnderMaxAutotuneTimedByStreamLaunches) {
  run_tiny_gpt2_under_graphs(true, "max-autotune", "cold");
}
TEST(CudaGraphs, TinyGpt2UnderMaxAutotuneWithAnUnknownTimingTimesInGraphs) {
  run_tiny_gpt2_under_graphs(true, "max-autotune", "sometimes");
}
