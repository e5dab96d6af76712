// Packed matmul weights (backend/cpu/gemm_weights.h, src/ops/linear.cpp): which nodes the pass marks,
// packed against unpacked results (cpu backend vs the interpreter, which never packs), small batches
// against large ones over the same weights, constant weights packed once, a weight written in place
// between calls (optimizer step, data_ptr write + increment_version) repacked, a new storage at the
// same address not mistaken for the old one, and the switch that turns the pass off. Also the
// generated kernels' parallel gate (codegen.cpp): a symbolic-size kernel run below and above the
// threshold.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/gemm_weights.h"
#include "backend/cpu/pipeline.h"
#include "cpu_test_util.h"
#include "ir/printer.h"
#include "ir_test_util.h"
#include "ops/dnnl_util.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/optim.h"
#include "protean/tensor.h"
#include "protean/tensor_version.h"

namespace protean::backend::cpu {
namespace {

using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::expect_close;
using testing::rnd;
using testing::use_test_cache_dir;

std::string weights_attr(const ir::Graph& g, OpKind op) {
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && n.op == op) return n.attrs.has("weights") ? n.attrs.s("weights") : "";
  return "(no node)";
}

CompileOptions cpu_opts(const char* name, std::vector<std::string> args) {
  use_test_cache_dir();
  CompileOptions o;
  o.name = name;
  o.backend = "cpu";
  o.arg_names = std::move(args);
  return o;
}

Tensor lin(const Tensor& x, const Tensor& w, const Tensor& b) { return linear(x, w, b); }
Tensor mm(const Tensor& x, const Tensor& w) { return matmul(x, w); }
Tensor mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2) {
  return linear(relu(linear(x, w1, b1)), w2, b2);
}

TEST(PackedWeights, PassMarksConstantAndInputWeightsOnly) {
  GraphBuilder b("g");
  SymInt n = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {n, 64});
  ValueId w_in = b.input("w", {32, 64});
  ValueId w3 = b.input("w3", {n, 64, 32});  // batched right operand: stays plain
  ValueId h = b.call(OpKind::linear, {x, w_in, ir::kNoValue});
  ValueId c = b.call(OpKind::matmul, {h, b.constant(rnd({32, 16}))});
  ValueId act = b.call(OpKind::matmul, {x, b.call(OpKind::relu, {b.input("v", {64, 8})})});  // computed weight
  ValueId bat = b.call(OpKind::matmul, {b.input("x3", {n, 4, 64}), w3});
  ir::Graph g = b.done({c, act, bat});
  GemmWeightStats st = mark_gemm_weights(g);
  EXPECT_EQ(st.constant_weights, 1);
  EXPECT_EQ(st.reused_weights, 1);
  EXPECT_EQ(weights_attr(g, OpKind::linear), "reuse") << ir::print(g);
  int constant = 0, none = 0;
  for (const ir::Node& node : g.nodes())
    if (node.kind == ir::NodeKind::Call && node.op == OpKind::matmul) {
      if (node.attrs.has("weights")) constant += node.attrs.s("weights") == "constant";
      else ++none;
    }
  EXPECT_EQ(constant, 1) << ir::print(g);
  EXPECT_EQ(none, 2) << ir::print(g);
  EXPECT_NE(ir::print(g).find("weights=\"reuse\""), std::string::npos);  // in the text form
}

// Packed (cpu) vs unpacked (interp, and eager) over batch sizes on both sides of the small-M range, with
// the weights reused across calls, so the packed copy serves every size.
TEST(PackedWeights, PackedMatchesUnpackedAtEveryBatch) {
  manual_seed(3);
  Tensor w1 = rnd({256, 200}, 0.07), b1 = rnd({256}, 0.1), w2 = rnd({48, 256}, 0.06), b2 = rnd({48}, 0.1);
  auto f = compile(mlp, cpu_opts("packed_mlp", {"x", "w1", "b1", "w2", "b2"}));
  CompileOptions io = cpu_opts("packed_mlp_interp", {"x", "w1", "b1", "w2", "b2"});
  io.backend = "interp";
  auto g = compile(mlp, io);
  ops::reset_dnnl_stats();
  for (int round = 0; round < 3; ++round)
    for (int64_t m : {1, 2, 7, 8, 9, 33, 128}) {
      Tensor x = rnd({m, 200});
      expect_close(f(x, w1, b1, w2, b2), g(x, w1, b1, w2, b2), "batch " + std::to_string(m));
    }
  ops::DnnlStats s = ops::dnnl_stats();
  EXPECT_GT(s.weight_packs, 0) << ops::dnnl_stats_json();
  EXPECT_GT(s.packed_weight_hits, s.weight_packs) << ops::dnnl_stats_json();
}

// Small-M vs large-M: row i of one large-batch call equals the small-batch call on row i alone.
TEST(PackedWeights, SmallBatchRowsMatchLargeBatch) {
  manual_seed(5);
  Tensor w = rnd({512, 384}, 0.05), bias = rnd({512}, 0.1);
  auto f = compile(lin, cpu_opts("packed_rows", {"x", "w", "b"}));
  Tensor x = rnd({64, 384});
  for (int k = 0; k < 2; ++k) (void)f(x, w, bias);  // packed from the second call on
  Tensor big = f(x, w, bias);
  for (int64_t m : {1, 3, 8}) {
    for (int64_t r0 = 0; r0 + m <= 64; r0 += 21) {
      Tensor part = f(narrow(x, 0, r0, m).contiguous(), w, bias);
      expect_close(part, narrow(big, 0, r0, m).contiguous(), "rows " + std::to_string(r0) + "+" + std::to_string(m), 1e-4);
    }
  }
  expect_close(big, linear(x, w, bias), "large batch vs eager");
}

// One primitive called with other tensors at every call: its argument memories are kept per thread
// (ops/linear.cpp, kept_call_memories), so each call's input, weights (plain, and packed for each
// weight tensor), bias and output must reach it. Two weight sets and inputs alternate; the outputs
// held from earlier calls keep their values.
TEST(PackedWeights, KeptCallMemoriesFollowEveryCallsTensors) {
  manual_seed(8);
  const Tensor wa = rnd({96, 160}, 0.1), ba = rnd({96}, 0.1), wb = rnd({96, 160}, 0.1), bb = rnd({96}, 0.1);
  auto f = compile(lin, cpu_opts("kept_memories", {"x", "w", "b"}));
  // the reference by plain loops (not through any primitive)
  auto reference = [](const Tensor& x, const Tensor& w, const Tensor& b) {
    Tensor y = empty({24, 96});
    const float *px = x.data_ptr<float>(), *pw = w.data_ptr<float>(), *pb = b.data_ptr<float>();
    float* py = y.data_ptr<float>();
    for (int i = 0; i < 24; ++i)
      for (int j = 0; j < 96; ++j) {
        double acc = pb[j];
        for (int k = 0; k < 160; ++k) acc += static_cast<double>(px[i * 160 + k]) * pw[j * 160 + k];
        py[i * 96 + j] = static_cast<float>(acc);
      }
    return y;
  };
  std::vector<Tensor> outs, want;
  for (int k = 0; k < 12; ++k) {
    const Tensor x = rnd({24, 160});
    const bool first = k % 3 != 2;
    const Tensor& w = first ? wa : wb;
    const Tensor& b = first ? ba : bb;
    want.push_back(reference(x, w, b));
    outs.push_back(f(x, w, b));
    want.push_back(want.back());
    outs.push_back(linear(x, w, b));  // eager: the plain-weights primitive of the same shape
  }
  for (size_t i = 0; i < outs.size(); ++i) expect_close(outs[i], want[i], "call " + std::to_string(i), 1e-4);
}

TEST(PackedWeights, MatmulWithAnInputWeightAndAThreeDimLeftOperand) {
  manual_seed(6);
  Tensor w = rnd({96, 160}, 0.1);
  auto f = compile(mm, cpu_opts("packed_matmul", {"x", "w"}));
  for (int round = 0; round < 3; ++round)
    for (int64_t m : {4, 50}) {
      Tensor x = rnd({2, m, 96});
      expect_close(f(x, w), matmul(x, w), "matmul m=" + std::to_string(m));
    }
}

// A parameter changed in place between calls is repacked: through an optimizer step (which bumps the
// storage's version) and through data_ptr with increment_version().
TEST(PackedWeights, ParameterChangedBetweenCallsIsRepacked) {
  manual_seed(7);
  Tensor w = rnd({128, 96}, 0.1), bias = rnd({128}, 0.1);
  auto f = compile(lin, cpu_opts("packed_changed", {"x", "w", "b"}));
  Tensor x = rnd({16, 96});
  for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), linear(x, w, bias), "before");
  ops::reset_dnnl_stats();
  // an SGD step writes w in place
  w.requires_grad_(true);
  optim::SGD opt({w}, {.lr = 0.5});
  Tensor loss = sum(mul(linear(x, w, bias), linear(x, w, bias)));
  loss.backward();
  opt.step();
  w.requires_grad_(false);
  Tensor want = linear(x, w, bias);
  expect_close(f(x, w, bias), want, "after the optimizer step (first call: plain layout)");
  expect_close(f(x, w, bias), want, "after the optimizer step (second call: repacked)");
  expect_close(f(x, w, bias), want, "after the optimizer step (third call: packed copy)");
  EXPECT_GE(ops::dnnl_stats().weight_packs, 1) << ops::dnnl_stats_json();
  EXPECT_GT(tensor_version(w), 0u);
  // a write through data_ptr, announced with increment_version
  float* p = static_cast<float*>(w.data_ptr());
  for (int64_t i = 0; i < w.int_numel(); i += 7) p[i] = -p[i] + 0.25f;
  increment_version(w);
  want = linear(x, w, bias);
  for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), want, "after a data_ptr write, call " + std::to_string(k));
}

// New weights written into the same memory without increment_version(): the packed copy's sample of
// the plain matrix no longer matches, so the weight is repacked (one warning says how to avoid it)
// instead of the call running on the old weights.
TEST(PackedWeights, UnannouncedWriteOfNewWeightsIsNotServedFromTheStaleCopy) {
  manual_seed(12);
  Tensor w = rnd({256, 256}, 0.1), bias = rnd({256}, 0.1);  // above the OpenBLAS size: oneDNN, packed
  auto f = compile(lin, cpu_opts("packed_unannounced", {"x", "w", "b"}));
  Tensor x = rnd({8, 256});
  for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), linear(x, w, bias), "before");
  const uint64_t version = tensor_version(w);
  Tensor fresh = rnd({256, 256}, 0.1);
  std::memcpy(w.data_ptr(), fresh.data_ptr(), static_cast<size_t>(w.int_numel()) * sizeof(float));
  ASSERT_EQ(tensor_version(w), version);  // nothing announced the write
  Tensor want = linear(x, w, bias);
  for (int k = 0; k < 3; ++k)
    expect_close(f(x, w, bias), want, "after an unannounced write, call " + std::to_string(k));
}

// The same for a weight whose contiguous dim is shorter than the sample's runs (4 input features):
// the sample stays inside the matrix and still sees the new values.
TEST(PackedWeights, UnannouncedWriteOfANarrowWeightIsNotServedFromTheStaleCopy) {
  manual_seed(13);
  Tensor w = rnd({1024, 4}, 0.1), bias = rnd({1024}, 0.1);
  auto f = compile(lin, cpu_opts("packed_unannounced_narrow", {"x", "w", "b"}));
  Tensor x = rnd({64, 4});
  ops::reset_dnnl_stats();
  for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), linear(x, w, bias), "before");
  if (ops::dnnl_stats().weight_packs == 0) GTEST_SKIP() << "not a packed oneDNN product here: " << ops::dnnl_stats_json();
  Tensor fresh = rnd({1024, 4}, 0.1);
  std::memcpy(w.data_ptr(), fresh.data_ptr(), static_cast<size_t>(w.int_numel()) * sizeof(float));
  Tensor want = linear(x, w, bias);
  for (int k = 0; k < 3; ++k)
    expect_close(f(x, w, bias), want, "after an unannounced write, call " + std::to_string(k));
}

// A new weight tensor whose storage happens to reuse the old one's address is a different weight.
TEST(PackedWeights, NewStorageAtTheSameAddressIsNotTheOldWeight) {
  manual_seed(8);
  auto f = compile(lin, cpu_opts("packed_realloc", {"x", "w", "b"}));
  Tensor x = rnd({8, 256}), bias = rnd({256}, 0.1);  // above the OpenBLAS size: oneDNN, packed
  ops::reset_dnnl_stats();
  for (int round = 0; round < 4; ++round) {
    std::vector<float> host(256 * 256);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 31 + static_cast<size_t>(round) * 17) % 23) * 0.01f;
    static std::vector<float> buffer(256 * 256);  // the same memory every round, a new storage each time
    std::memcpy(buffer.data(), host.data(), host.size() * sizeof(float));
    Tensor w = from_blob(buffer.data(), {256, 256}, DType::F32);
    for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), linear(x, w, bias), "round " + std::to_string(round));
  }
  EXPECT_EQ(ops::dnnl_stats().weight_packs, 4) << ops::dnnl_stats_json();  // one per storage
}

// The same square weight used as a linear's weight (read transposed) and as a matmul's right operand:
// two packed copies, never one for both.
TEST(PackedWeights, SameMemoryReadTransposedAndPlainIsTwoWeights) {
  manual_seed(11);
  Tensor w = rnd({192, 192}, 0.1);
  auto fn = [](const Tensor& x, const Tensor& v) { return add(linear(x, v, Tensor()), matmul(x, v)); };
  auto f = compile(fn, cpu_opts("packed_both_ways", {"x", "w"}));
  Tensor x = rnd({16, 192});
  for (int k = 0; k < 4; ++k)
    expect_close(f(x, w), add(linear(x, w, Tensor()), matmul(x, w)), "call " + std::to_string(k), 1e-4);
}

// A weight that is a graph constant (captured, not an argument) is packed once and kept.
TEST(PackedWeights, ConstantWeightPackedOnce) {
  manual_seed(9);
  const Tensor w = rnd({200, 72}, 0.1);
  auto fn = [w](const Tensor& x) { return linear(x, w, Tensor()); };
  auto f = compile(fn, cpu_opts("packed_const", {"x"}));
  Tensor x = rnd({24, 72});
  (void)f(x);
  ops::reset_dnnl_stats();
  for (int k = 0; k < 4; ++k) expect_close(f(x), linear(x, w, Tensor()), "call " + std::to_string(k));
  ops::DnnlStats s = ops::dnnl_stats();
  EXPECT_EQ(s.weight_packs, 0) << ops::dnnl_stats_json();  // packed by the first call already
  EXPECT_EQ(s.packed_weight_hits, 4) << ops::dnnl_stats_json();
}

TEST(PackedWeights, SwitchOffKeepsThePlainLayout) {
  setenv("PROTEAN_CPU_PACKED_WEIGHTS", "0", 1);
  manual_seed(10);
  Tensor w = rnd({64, 48}, 0.1), bias = rnd({64}, 0.1);
  auto f = compile(lin, cpu_opts("packed_off", {"x", "w", "b"}));
  ops::reset_dnnl_stats();
  Tensor x = rnd({12, 48});
  for (int k = 0; k < 3; ++k) expect_close(f(x, w, bias), linear(x, w, bias), "call " + std::to_string(k));
  unsetenv("PROTEAN_CPU_PACKED_WEIGHTS");
  ops::DnnlStats s = ops::dnnl_stats();
  EXPECT_EQ(s.weight_packs + s.packed_weight_hits + s.weight_sightings, 0) << ops::dnnl_stats_json();
}

// The generated kernel of a symbolic size tests its parallel threshold in C++ (no OpenMP region below
// it): the lambda form, and equal results below and above the threshold.
TEST(CpuParallelGate, SymbolicKernelBelowAndAboveTheThreshold) {
  auto build = [] {
    GraphBuilder b("gate");
    SymInt n = b.symbol("x.size()[0]", 5);
    ValueId x = b.input("x", {n, 256});
    ValueId y = b.call(OpKind::exp, {b.call(OpKind::mul, {x, b.constant(scalar_tensor(0.5))})});
    ValueId r = b.call(OpKind::add, {y, x});
    return testing::compile(b, {r}, {n});
  };
  setenv("PROTEAN_CPU_MERGE_DIMS", "0", 1);  // the [n, 256] loop nest (merged, it is the 1-D form below)
  testing::Compiled c = build();
  unsetenv("PROTEAN_CPU_MERGE_DIMS");
  testing::Compiled merged = build();
  EXPECT_NE(merged.info.source.find("#pragma omp single nowait"), std::string::npos) << merged.info.source;
  for (int64_t rows : {1, 129})
    testing::check(merged, {rnd({rows, 256})}, {rows}, "merged, rows " + std::to_string(rows));
  EXPECT_NE(c.info.source.find("auto run = [B, S"), std::string::npos) << c.info.source;  // (, pt_stream)
  EXPECT_NE(c.info.source.find("#pragma omp for collapse(1) nowait"), std::string::npos) << c.info.source;
  EXPECT_NE(c.info.source.find("if (work >= 131072) {\n#pragma omp parallel\n    run();"), std::string::npos)
      << c.info.source;
  for (int64_t rows : {1, 3, 511, 512, 513, 1000})  // 256 * rows below and above 131072
    testing::check(c, {rnd({rows, 256})}, {rows}, "rows " + std::to_string(rows));
}

// A 1-D symbolic pointwise kernel: the parallel loop is the vector loop, and its scalar tail runs once
// (omp single) inside the parallel region.
TEST(CpuParallelGate, VectorLoopWithTailBelowAndAboveTheThreshold) {
  GraphBuilder b("gate1d");
  SymInt n = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {n});
  ValueId r = b.call(OpKind::add, {b.call(OpKind::sin, {x}), b.call(OpKind::mul, {x, x})});
  testing::Compiled c = testing::compile(b, {r}, {n});
  EXPECT_NE(c.info.source.find("#pragma omp single nowait"), std::string::npos) << c.info.source;
  for (int64_t len : {1, 15, 17, 32767, 32768, 32769, 100003})
    testing::check(c, {rnd({len})}, {len}, "length " + std::to_string(len));
}

// Calls made by every thread of the caller's own OpenMP team, below the threshold: the kernels'
// worksharing loops bound to that team and each call computed only its thread's share of its
// iterations (half of every output wrong with 2 threads). Each call now runs in a team of its own.
TEST(CpuParallelGate, CallsFromTheCallersOwnParallelRegionComputeTheirWholeOutput) {
  GraphBuilder b("caller_team");
  SymInt n = b.symbol("x.size()[0]", 5);
  ValueId x = b.input("x", {n, 1000});
  ValueId y = b.input("y", {n, 1000});
  ValueId r = b.call(OpKind::add, {b.call(OpKind::mul, {x, y}), b.constant(scalar_tensor(1.0))});
  ValueId ln = b.call(OpKind::layer_norm, {x, ir::kNoValue, ir::kNoValue}, {{"normalized_shape", SymIntVec{1000}}, {"eps", 1e-5}});
  testing::Compiled c = testing::compile(b, {r, ln}, {n});
  EXPECT_NE(c.info.source.find("(__builtin_omp_get_num_threads() > 1)"), std::string::npos) << c.info.source;
  constexpr int kThreads = 4;
  for (int64_t rows : {int64_t{8}, int64_t{129}, int64_t{300}}) {  // 8 000 and 129 000 below the threshold
    std::vector<Tensor> xs, ys;
    for (int t = 0; t < kThreads; ++t) {
      xs.push_back(rnd({rows, 1000}));
      ys.push_back(rnd({rows, 1000}));
    }
    std::vector<std::vector<Tensor>> got(kThreads);
#pragma omp parallel num_threads(kThreads)
    {
      const int t = omp_get_thread_num();
      const std::vector<Tensor> in = {xs[static_cast<size_t>(t)], ys[static_cast<size_t>(t)]};
      const std::vector<int64_t> sizes = {rows};
      got[static_cast<size_t>(t)] = c.cpu->run(in, sizes);
    }
    for (int t = 0; t < kThreads; ++t) {
      const std::vector<Tensor> in = {xs[static_cast<size_t>(t)], ys[static_cast<size_t>(t)]};
      const std::vector<int64_t> sizes = {rows};
      std::vector<Tensor> want = c.interp->run(in, std::span<const int64_t>(sizes));
      for (size_t o = 0; o < want.size(); ++o)
        testing::expect_close(got[static_cast<size_t>(t)][o], want[o], fmt::format("rows {}, thread {}, output {}", rows, t, o));
    }
  }
}

}  // namespace
}  // namespace protean::backend::cpu
