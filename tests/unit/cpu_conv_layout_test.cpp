// conv_layout pass (src/backend/cpu/conv_layout.h): which conv → conv values become channels-last,
// which convs get weights="constant", the eager kernels' src_layout / dst_layout / weights
// attributes against plain NCHW convs, and the cpu backend vs the interpreter on a PP-OCR-like chain
// with symbolic batch and width.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "backend/cpu/conv_layout.h"
#include "backend/cpu/fuse_post_ops.h"
#include "backend/cpu/pipeline.h"
#include "cpu_test_util.h"
#include "backend/interp/interp.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/sym_util.h"
#include "ir/verifier.h"
#include "ir_test_util.h"
#include "ops/registry.h"
#include "protean/ops.h"
#include "protean/tensor.h"
#include "protean/tensor_version.h"

namespace protean::backend::cpu {
namespace {

using ir::kNoValue;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using testing::Built;
using testing::expect_close;
using testing::finish;
using testing::rnd;
using testing::use_test_cache_dir;

ops::Attrs conv_attrs(int64_t stride, int64_t pad, int64_t groups) {
  return {{"stride", to_symint_vec({stride, stride})}, {"padding", to_symint_vec({pad, pad})},
          {"dilation", to_symint_vec({1, 1})}, {"groups", SymInt(groups)}};
}

std::string attr_or(const ir::Node& n, const char* name) { return n.attrs.has(name) ? n.attrs.s(name) : "-"; }

/// "src/dst/weights" for each conv node, in order: e.g. "-/nhwc/constant".
std::vector<std::string> conv_layouts(const ir::Graph& g) {
  std::vector<std::string> r;
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && (n.op == OpKind::conv2d || n.op == OpKind::conv2d_fused))
      r.push_back(attr_or(n, "src_layout") + "/" + attr_or(n, "dst_layout") + "/" + attr_or(n, "weights"));
  return r;
}

// ---- eager kernels: channels-last storage and constant weights ------------------------------------------
TEST(ConvLayout, EagerNhwcMatchesNchw) {
  manual_seed(21);
  struct Case {
    int64_t c, o, k, stride, groups;
    const char* post;
  };
  // depthwise 3x3 / 5x5 (stride 1, 2), 1x1, a dense 3x3 (blocked), a thin 3-channel stem
  std::vector<Case> cases = {{16, 16, 3, 1, 16, "hardswish"}, {24, 24, 5, 2, 24, ""}, {16, 32, 1, 1, 1, "relu"},
                             {32, 48, 1, 1, 1, "hardswish, linear(0.5, 0.1)"}, {16, 16, 3, 1, 1, "swish(1)"},
                             {3, 16, 3, 2, 1, ""}};
  for (const Case& c : cases)
    for (int src = 0; src < 2; ++src)
      for (int dst = 0; dst < 2; ++dst) {
        Tensor x = rnd({2, c.c, 9, 13}), w = rnd({c.o, c.c / c.groups, c.k, c.k}, 0.3), b = rnd({c.o});
        ops::Attrs a = conv_attrs(c.stride, c.k / 2, c.groups);
        OpKind op = OpKind::conv2d;
        if (*c.post) {
          op = OpKind::conv2d_fused;
          a.set("post_ops", std::string(c.post));
        }
        Tensor want = ops::run_eager(op, std::vector<Tensor>{x, w, b}, a)[0];
        ops::Attrs al = a;
        if (src) al.set("src_layout", std::string("nhwc"));
        if (dst) al.set("dst_layout", std::string("nhwc"));
        Tensor xin = src ? permute(x, {0, 2, 3, 1}).contiguous() : x;
        std::string what = fmt::format("{}->{} k{} s{} g{} [{}] src {} dst {}", c.c, c.o, c.k, c.stride, c.groups,
                                       c.post, src ? "nhwc" : "nchw", dst ? "nhwc" : "nchw");
        for (int constant = 0; constant < 2; ++constant) {
          ops::Attrs ac = al;
          if (constant) ac.set("weights", std::string("constant"));
          for (int rep = 0; rep < 2; ++rep) {  // the second call takes the kept weights
            Tensor got = ops::run_eager(op, std::vector<Tensor>{xin, w, b}, ac)[0];
            if (dst) got = permute(got, {0, 3, 1, 2}).contiguous();
            expect_close(got, want, what + (constant ? " constant weights" : ""));
          }
        }
      }
}

TEST(ConvLayout, ConstantWeightsFollowTheirStorage) {
  // New weights at a new address are packed anew; weights freed and reallocated are not served stale.
  manual_seed(22);
  ops::Attrs a = conv_attrs(1, 0, 1);
  a.set("weights", std::string("constant"));
  a.set("src_layout", std::string("nhwc"));
  a.set("dst_layout", std::string("nhwc"));
  Tensor x = rnd({1, 5, 7, 32});
  for (int i = 0; i < 4; ++i) {
    Tensor w = rnd({48, 32, 1, 1}, 0.2);
    Tensor got = ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w, Tensor()}, a)[0];
    Tensor want = ops::run_eager(OpKind::conv2d, std::vector<Tensor>{permute(x, {0, 3, 1, 2}).contiguous(), w, Tensor()}, conv_attrs(1, 0, 1))[0];
    expect_close(permute(got, {0, 3, 1, 2}).contiguous(), want, fmt::format("weights #{}", i));
  }
}

TEST(ConvLayout, ReusedWeightsAreRepackedAfterAnInPlaceWrite) {
  // weights="reuse" (a graph input): the first call reorders into scratch, the second packs; a write
  // announced by a version bump is never served from the old packed copy.
  manual_seed(24);
  ops::Attrs a = conv_attrs(1, 0, 1);
  a.set("weights", std::string("reuse"));
  Tensor x = rnd({1, 32, 5, 7});
  Tensor w = rnd({48, 32, 1, 1}, 0.2);
  for (int i = 0; i < 4; ++i) {
    if (i == 2) {
      float* d = w.data_ptr<float>();
      for (int64_t k = 0; k < w.int_numel(); ++k) d[k] *= 0.5f;
      increment_version(w);
    }
    Tensor got = ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w, Tensor()}, a)[0];
    Tensor want = ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w.clone(), Tensor()}, conv_attrs(1, 0, 1))[0];
    expect_close(got, want, fmt::format("call #{}", i));
  }
  a.set("weights", std::string("packed"));
  EXPECT_THROW(ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w, Tensor()}, a), ValueError);
}

TEST(ConvLayout, MetaChecks) {
  Tensor x = rnd({1, 4, 5, 6}), w = rnd({8, 4, 1, 1});
  ops::Attrs a = conv_attrs(1, 0, 1);
  a.set("dst_layout", std::string("nhwc"));
  EXPECT_EQ(ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w, Tensor()}, a)[0].int_sizes(), (IntVec{1, 5, 6, 8}));
  ops::Attrs bad = conv_attrs(1, 0, 1);
  bad.set("src_layout", std::string("nchwc"));
  EXPECT_THROW(ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, w, Tensor()}, bad), ValueError);
  ops::Attrs f = a;  // dst_layout nhwc with a tensor operand
  f.set("post_ops", std::string("add(#3)"));
  EXPECT_THROW(ops::run_eager(OpKind::conv2d_fused, std::vector<Tensor>{x, w, Tensor(), rnd({1, 8, 5, 6})}, f), ValueError);
  ops::Attrs one_d = {{"stride", to_symint_vec({1})}, {"padding", to_symint_vec({0})},
                      {"dilation", to_symint_vec({1})}, {"groups", SymInt(1)}, {"src_layout", std::string("nhwc")}};
  EXPECT_THROW(ops::run_eager(OpKind::conv1d, std::vector<Tensor>{rnd({1, 4, 6}), rnd({8, 4, 1}), Tensor()}, one_d), ValueError);
}

// ---- the pass --------------------------------------------------------------------------------------------
/// PP-OCR-like: stem conv → dw → 1x1 → dw → 1x1 (→ two users: SE-style mul and pool) → 1x1 with a
/// residual operand → 1x1 whose weight is a graph input → output.
Built ocr_chain() {
  GraphBuilder b("chain");
  SymInt n = b.symbol("x.size()[0]", 2), wd = b.symbol("x.size()[3]", 40);
  ValueId x = b.input("x", {n, 3, 16, wd});
  ValueId wi = b.input("w", {16, 16, 1, 1});
  auto cst = [&](IntVec s, double sc) { return b.constant(rnd(s, sc)); };
  ValueId c0 = b.call(OpKind::conv2d, {x, cst({16, 3, 3, 3}, 0.3), cst({16}, 0.1)}, conv_attrs(2, 1, 1));
  ValueId h0 = b.call(OpKind::hardswish, {c0});
  ValueId c1 = b.call(OpKind::conv2d, {h0, cst({16, 1, 3, 3}, 0.3), cst({16}, 0.1)}, conv_attrs(1, 1, 16));
  ValueId h1 = b.call(OpKind::hardswish, {c1});
  ValueId c2 = b.call(OpKind::conv2d, {h1, cst({32, 16, 1, 1}, 0.2), cst({32}, 0.1)}, conv_attrs(1, 0, 1));
  ValueId r2 = b.call(OpKind::relu, {c2});
  ValueId c3 = b.call(OpKind::conv2d, {r2, cst({32, 1, 5, 5}, 0.2), cst({32}, 0.1)}, conv_attrs(2, 2, 32));
  ValueId c4 = b.call(OpKind::conv2d, {c3, cst({16, 32, 1, 1}, 0.2), cst({16}, 0.1)}, conv_attrs(1, 0, 1));
  ValueId pool = b.call(OpKind::adaptive_avg_pool2d, {c4}, {{"output_size", to_symint_vec({1, 1})}});
  ValueId se = b.call(OpKind::mul, {c4, b.call(OpKind::sigmoid, {pool})});
  ValueId c5 = b.call(OpKind::conv2d, {se, cst({16, 16, 1, 1}, 0.2), kNoValue}, conv_attrs(1, 0, 1));
  ValueId res = b.call(OpKind::add, {c5, se});
  ValueId c6 = b.call(OpKind::conv2d, {res, wi, kNoValue}, conv_attrs(1, 0, 1));
  return finish(b, {c6}, {n, wd});
}

TEST(ConvLayout, PassMarksConvToConvValues) {
  manual_seed(23);
  Built b = ocr_chain();
  ir::Graph g = *b.g;
  fuse_post_ops(g);
  ConvLayoutStats st = propagate_conv_layouts(g);
  ir::verify(g);
  std::string text = ir::print(g);
  EXPECT_EQ(ir::print(ir::parse(text)), text);
  // c0→c1, c1→c2, c2→c3, c3→c4 are channels-last; c4 has two users, c5 feeds a residual add, c6's
  // output is the graph output and its weight a graph input.
  EXPECT_EQ(st.nhwc_values, 4) << text;
  EXPECT_EQ(st.constant_weights, 6) << text;
  EXPECT_EQ(st.reused_weights, 1) << text;
  EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/nhwc/constant", "nhwc/nhwc/constant", "nhwc/nhwc/constant",
                                                       "nhwc/nhwc/constant", "nhwc/-/constant", "-/-/constant", "-/-/reuse"}))
      << text;
  // The channels-last values have [N, H, W, C] types; the graph's inputs and outputs are unchanged.
  const ir::Node* first = nullptr;
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Call && !first && (n.op == OpKind::conv2d || n.op == OpKind::conv2d_fused)) first = &n;
  ASSERT_NE(first, nullptr);
  const ir::Value& v = g.value(first->outputs[0]);
  EXPECT_EQ(v.sizes[3].str(), "16") << text;
  EXPECT_EQ(ir::symints_text(g.value(g.outputs()[0]).sizes), ir::symints_text(b.g->value(b.g->outputs()[0]).sizes));
  // Running the pass again changes nothing more.
  ConvLayoutStats again = propagate_conv_layouts(g);
  EXPECT_EQ(again.nhwc_values, 0);
  EXPECT_EQ(ir::print(g), text);
}

TEST(ConvLayout, CpuBackendMatchesInterp) {
  manual_seed(24);
  use_test_cache_dir();
  Built b = ocr_chain();
  BackendInput in{b.g, b.syms, "0/0", "default"};
  CpuCompileInfo info;
  auto cpu = compile_cpu(in, &info);
  EXPECT_EQ(info.nhwc_values, 4);
  Interpreter plain(b.g, b.syms);
  ir::Graph rewritten = *b.g;
  fuse_post_ops(rewritten);
  propagate_conv_layouts(rewritten);
  Interpreter relaid(std::make_shared<const ir::Graph>(std::move(rewritten)), b.syms);
  Tensor w = rnd({16, 16, 1, 1}, 0.2);
  for (auto [n, wd] : std::vector<std::pair<int64_t, int64_t>>{{2, 40}, {1, 17}, {3, 64}, {1, 40}}) {
    std::vector<Tensor> x{rnd({n, 3, 16, wd}), w};
    std::vector<int64_t> sv{n, wd};
    Tensor want = plain.run(x, std::span<const int64_t>(sv))[0];
    expect_close(cpu->run(x, sv)[0], want, fmt::format("cpu at {}x{}", n, wd));
    expect_close(relaid.run(x, std::span<const int64_t>(sv))[0], want, fmt::format("interp, rewritten graph, {}x{}", n, wd));
  }
}


/// PPLCNet's squeeze-and-excitation block between two convs: x → 1x1 → depthwise 5x5 (v) → global
/// pooling → 1x1 relu → 1x1 hardsigmoid (s) → v·s → 1x1 → output; `swapped` writes the multiply s·v;
/// `extra_user` gives v a third user (a graph output), which keeps the block NCHW.
Built se_block(bool swapped, bool extra_user) {
  GraphBuilder b("se_block");
  SymInt n = b.symbol("x.size()[0]", 2), wd = b.symbol("x.size()[3]", 40);
  ValueId x = b.input("x", {n, 16, 6, wd});
  auto cst = [&](IntVec s, double sc) { return b.constant(rnd(s, sc)); };
  ValueId c0 = b.call(OpKind::hardswish, {b.call(OpKind::conv2d, {x, cst({48, 16, 1, 1}, 0.3), cst({48}, 0.1)}, conv_attrs(1, 0, 1))});
  ValueId v = b.call(OpKind::hardswish, {b.call(OpKind::conv2d, {c0, cst({48, 1, 5, 5}, 0.3), cst({48}, 0.1)}, conv_attrs(1, 2, 48))});
  ValueId pool = b.call(OpKind::adaptive_avg_pool2d, {v}, {{"output_size", to_symint_vec({1, 1})}});
  ValueId r = b.call(OpKind::relu, {b.call(OpKind::conv2d, {pool, cst({12, 48, 1, 1}, 0.3), cst({12}, 0.1)}, conv_attrs(1, 0, 1))});
  ValueId sc = b.call(OpKind::hardsigmoid, {b.call(OpKind::conv2d, {r, cst({48, 12, 1, 1}, 0.3), cst({48}, 0.1)}, conv_attrs(1, 0, 1))});
  ValueId prod = swapped ? b.call(OpKind::mul, {sc, v}) : b.call(OpKind::mul, {v, sc});
  ValueId out = b.call(OpKind::conv2d, {prod, cst({24, 48, 1, 1}, 0.2), cst({24}, 0.1)}, conv_attrs(1, 0, 1));
  if (extra_user) return finish(b, {out, v}, {n, wd});
  return finish(b, {out}, {n, wd});
}

TEST(ConvLayout, SqueezeExcitationBlocksStayChannelsLast) {
  manual_seed(27);
  use_test_cache_dir();
  for (int swapped = 0; swapped < 2; ++swapped)
    for (int extra = 0; extra < 2; ++extra) {
      Built b = se_block(swapped, extra);
      ir::Graph g = *b.g;
      fuse_post_ops(g);
      ConvLayoutStats st = propagate_conv_layouts(g);
      ir::verify(g);
      const std::string text = ir::print(g);
      EXPECT_EQ(ir::print(ir::parse(text)), text);
      // conv order: 1x1, depthwise (v), SE squeeze, SE excite (s), 1x1 after the multiply
      if (extra) {
        EXPECT_EQ(st.se_blocks, 0) << text;
        EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/nhwc/constant", "nhwc/-/constant", "-/nhwc/constant",
                                                             "nhwc/-/constant", "-/-/constant"}))
            << text;
      } else {
        EXPECT_EQ(st.se_blocks, 1) << text;
        EXPECT_EQ(st.nhwc_values, 5) << text;  // 1x1 → dw and squeeze → excite, then v, s and v·s
        EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/nhwc/constant", "nhwc/nhwc/constant",
                                                             "-/nhwc/constant", "nhwc/nhwc/constant", "nhwc/-/constant"}))
            << text;
        EXPECT_NE(text.find("adaptive_avg_pool2d(%"), std::string::npos);
        EXPECT_NE(text.find("src_layout=\"nhwc\")"), std::string::npos) << text;
      }
      CpuCompileInfo info;
      auto cpu = compile_cpu(BackendInput{b.g, b.syms, "0/0", "default"}, &info);
      Interpreter plain(b.g, b.syms);
      Interpreter relaid(std::make_shared<const ir::Graph>(g), b.syms);
      for (auto [n, wd] : std::vector<std::pair<int64_t, int64_t>>{{2, 40}, {1, 17}, {3, 64}}) {
        std::vector<Tensor> x{rnd({n, 16, 6, wd})};
        std::vector<int64_t> sv{n, wd};
        std::vector<Tensor> want = plain.run(x, std::span<const int64_t>(sv)), got = cpu->run(x, sv),
                            again = relaid.run(x, std::span<const int64_t>(sv));
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          const std::string what = fmt::format("swapped {} extra {} output {} at {}x{}", swapped, extra, i, n, wd);
          expect_close(got[i], want[i], "cpu " + what);
          expect_close(again[i], want[i], "interp, rewritten graph, " + what);
        }
      }
    }
}

/// PP-OCRv4 det's residual-SE FPN in small: a = 1x1 conv of x; a residual SE block r = a + a·s (s from
/// pooling a); lo = a 3x3 conv of a, average-pooled 2x2; f = r + upsample(lo); cat(f, upsample(lo)) along the
/// channels into a 3x3 conv. `f_out` also returns f, which must keep the whole region NCHW.
Built fpn_block(bool f_out) {
  GraphBuilder b("fpn_block");
  SymInt n = b.symbol("x.size()[0]", 2);
  ValueId x = b.input("x", {n, 16, 8, 12});
  auto cst = [&](IntVec s, double sc) { return b.constant(rnd(s, sc)); };
  ValueId a = b.call(OpKind::conv2d, {x, cst({24, 16, 1, 1}, 0.3), cst({24}, 0.1)}, conv_attrs(1, 0, 1));
  ValueId lo = b.call(OpKind::avg_pool2d, {b.call(OpKind::conv2d, {a, cst({24, 24, 3, 3}, 0.2), kNoValue}, conv_attrs(1, 1, 1))},
                      {{"kernel_size", to_symint_vec({2, 2})}, {"stride", to_symint_vec({2, 2})},
                       {"padding", to_symint_vec({0, 0})}, {"ceil_mode", false}, {"count_include_pad", false}});
  ValueId pool = b.call(OpKind::adaptive_avg_pool2d, {a}, {{"output_size", to_symint_vec({1, 1})}});
  ValueId s1 = b.call(OpKind::relu, {b.call(OpKind::conv2d, {pool, cst({6, 24, 1, 1}, 0.3), cst({6}, 0.1)}, conv_attrs(1, 0, 1))});
  ValueId sc = b.call(OpKind::hardsigmoid, {b.call(OpKind::conv2d, {s1, cst({24, 6, 1, 1}, 0.3), cst({24}, 0.1)}, conv_attrs(1, 0, 1))});
  ValueId r = b.call(OpKind::add, {a, b.call(OpKind::mul, {a, sc})});
  ops::Attrs up{{"output_size", to_symint_vec({8, 12})}};
  ValueId f = b.call(OpKind::add, {r, b.call(OpKind::upsample_nearest2d, {lo}, up)});
  ValueId c = b.call(OpKind::cat, {f, b.call(OpKind::upsample_nearest2d, {lo}, up)}, {{"dim", SymInt(1)}});
  ValueId out = b.call(OpKind::conv2d, {c, cst({8, 48, 3, 3}, 0.2), cst({8}, 0.1)}, conv_attrs(1, 1, 1));
  if (f_out) return finish(b, {out, f}, {n});
  return finish(b, {out}, {n});
}

TEST(ConvLayout, FpnRegionsStayChannelsLast) {
  manual_seed(29);
  use_test_cache_dir();
  for (int f_out = 0; f_out < 2; ++f_out) {
    Built b = fpn_block(f_out);
    ir::Graph g = *b.g;
    fuse_post_ops(g);
    ConvLayoutStats st = propagate_conv_layouts(g);
    ir::verify(g);
    const std::string text = ir::print(g);
    EXPECT_EQ(ir::print(ir::parse(text)), text);
    int upsample_nhwc = 0, cat_dim3 = 0;
    for (const ir::Node& nd : g.nodes()) {
      if (nd.kind != ir::NodeKind::Call) continue;
      if ((nd.op == OpKind::upsample_nearest2d || nd.op == OpKind::avg_pool2d) && attr_or(nd, "layout") == "nhwc")
        ++upsample_nhwc;
      if (nd.op == OpKind::cat && nd.attrs.i("dim") == 3) ++cat_dim3;
    }
    // conv order: a, lo, SE squeeze, SE excite (s), the conv after the cat
    if (f_out) {
      EXPECT_EQ(st.region_values, 0) << text;
      EXPECT_EQ(upsample_nhwc + cat_dim3, 0) << text;
      EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/-/constant", "-/-/constant", "-/nhwc/constant",
                                                           "nhwc/-/constant", "-/-/constant"}))
          << text;
    } else {
      // a, the 3x3 conv's output, lo, s, a·s, r, both upsamplings, f, the cat
      EXPECT_EQ(st.region_values, 10) << text;
      EXPECT_EQ(upsample_nhwc, 3) << text;
      EXPECT_EQ(cat_dim3, 1) << text;
      EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/nhwc/constant", "nhwc/nhwc/constant", "-/nhwc/constant",
                                                           "nhwc/nhwc/constant", "nhwc/-/constant"}))
          << text;
      EXPECT_NE(text.find("adaptive_avg_pool2d(%"), std::string::npos);
      EXPECT_NE(text.find("src_layout=\"nhwc\")"), std::string::npos) << text;
    }
    CpuCompileInfo info;
    auto cpu = compile_cpu(BackendInput{b.g, b.syms, "0/0", "default"}, &info);
    Interpreter plain(b.g, b.syms);
    Interpreter relaid(std::make_shared<const ir::Graph>(g), b.syms);
    for (int64_t n : {2, 1, 3}) {
      std::vector<Tensor> x{rnd({n, 16, 8, 12})};
      std::vector<int64_t> sv{n};
      std::vector<Tensor> want = plain.run(x, std::span<const int64_t>(sv)), got = cpu->run(x, sv),
                          again = relaid.run(x, std::span<const int64_t>(sv));
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const std::string what = fmt::format("f_out {} output {} at batch {}", f_out, i, n);
        expect_close(got[i], want[i], "cpu " + what);
        expect_close(again[i], want[i], "interp, rewritten graph, " + what);
      }
    }
  }
}

TEST(ConvLayout, ChannelsLastNearestUpsamplingMatchesNchw) {
  manual_seed(30);
  // integer and fractional ratios, downsampling, one pixel; a channels-last view with strided channels
  for (auto [n, c, h, w, oh, ow] : std::vector<std::array<int64_t, 6>>{
           {2, 24, 5, 7, 10, 14}, {1, 7, 4, 6, 7, 9}, {3, 5, 9, 8, 4, 3}, {1, 3, 1, 1, 3, 2}}) {
    Tensor x = rnd({n, c, h, w});
    ops::Attrs a{{"output_size", to_symint_vec({oh, ow})}};
    Tensor want = ops::run_eager(OpKind::upsample_nearest2d, std::vector<Tensor>{x}, a)[0];
    a.set("layout", std::string("nhwc"));
    const std::string what = fmt::format("{}x{}x{}x{} -> {}x{}", n, c, h, w, oh, ow);
    Tensor got = ops::run_eager(OpKind::upsample_nearest2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1}).contiguous()}, a)[0];
    ASSERT_EQ(got.int_sizes(), (IntVec{n, oh, ow, c})) << what;
    expect_close(permute(got, {0, 3, 1, 2}), want, what);
    Tensor strided = ops::run_eager(OpKind::upsample_nearest2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1})}, a)[0];
    expect_close(permute(strided, {0, 3, 1, 2}), want, "strided channels, " + what);
  }
  ops::Attrs bad{{"output_size", to_symint_vec({4, 4})}, {"layout", std::string("nhcw")}};
  EXPECT_THROW(ops::run_eager(OpKind::upsample_nearest2d, std::vector<Tensor>{rnd({1, 2, 3, 4})}, bad), ValueError);
  ops::Attrs bil{{"output_size", to_symint_vec({4, 4})}, {"layout", std::string("nhwc")}};
  EXPECT_THROW(ops::run_eager(OpKind::upsample_bilinear2d, std::vector<Tensor>{rnd({1, 2, 3, 4})}, bil), ValueError);
}

TEST(ConvLayout, ChannelsLastAveragePoolingMatchesNchw) {
  manual_seed(31);
  struct Case {
    int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;
    bool ceil, include_pad;
  };
  // rec's 3x2 window, padding with and without counting it, ceil_mode, odd sizes, 1 channel
  for (const Case& k : std::vector<Case>{{1, 48, 3, 20, 3, 2, 3, 2, 0, 0, false, false},
                                          {2, 17, 7, 9, 3, 3, 2, 2, 1, 1, false, true},
                                          {1, 5, 7, 9, 3, 3, 2, 2, 1, 1, true, false},
                                          {3, 1, 4, 5, 2, 2, 1, 1, 0, 0, false, false}}) {
    Tensor x = rnd({k.n, k.c, k.h, k.w});
    ops::Attrs a{{"kernel_size", to_symint_vec({k.kh, k.kw})}, {"stride", to_symint_vec({k.sh, k.sw})},
                 {"padding", to_symint_vec({k.ph, k.pw})}, {"ceil_mode", k.ceil}, {"count_include_pad", k.include_pad}};
    Tensor want = ops::run_eager(OpKind::avg_pool2d, std::vector<Tensor>{x}, a)[0];
    a.set("layout", std::string("nhwc"));
    const std::string what = fmt::format("{}x{}x{}x{} k{}x{} s{}x{} p{}x{} ceil {} include_pad {}", k.n, k.c, k.h, k.w,
                                         k.kh, k.kw, k.sh, k.sw, k.ph, k.pw, k.ceil, k.include_pad);
    Tensor got = ops::run_eager(OpKind::avg_pool2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1}).contiguous()}, a)[0];
    IntVec ws = want.int_sizes();
    ASSERT_EQ(got.int_sizes(), (IntVec{ws[0], ws[2], ws[3], ws[1]})) << what;
    expect_close(permute(got, {0, 3, 1, 2}), want, what);
    Tensor strided = ops::run_eager(OpKind::avg_pool2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1})}, a)[0];
    expect_close(permute(strided, {0, 3, 1, 2}), want, "strided channels, " + what);
  }
  ops::Attrs mx{{"kernel_size", to_symint_vec({2, 2})}, {"stride", to_symint_vec({2, 2})}, {"padding", to_symint_vec({0, 0})},
                {"layout", std::string("nhwc")}};
  EXPECT_THROW(ops::run_eager(OpKind::max_pool2d, std::vector<Tensor>{rnd({1, 4, 4, 3})}, mx), ValueError);
}

TEST(ConvLayout, ChannelsLastGlobalPoolingMatchesNchw) {
  manual_seed(28);
  for (auto [n, c, h, w] : std::vector<std::array<int64_t, 4>>{{2, 48, 6, 40}, {1, 7, 1, 1}, {3, 240, 3, 5}}) {
    Tensor x = rnd({n, c, h, w});
    ops::Attrs a{{"output_size", to_symint_vec({1, 1})}};
    Tensor want = ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{x}, a)[0];
    a.set("src_layout", std::string("nhwc"));
    Tensor got = ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1}).contiguous()}, a)[0];
    expect_close(got, want, fmt::format("{}x{}x{}x{}", n, c, h, w));
    // an output larger than 1x1 takes the strided loops
    ops::Attrs a2{{"output_size", to_symint_vec({1, 2})}};
    Tensor want2 = ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{x}, a2)[0];
    a2.set("src_layout", std::string("nhwc"));
    if (w >= 2)
      expect_close(ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{permute(x, {0, 2, 3, 1}).contiguous()}, a2)[0],
                   want2, fmt::format("1x2 of {}x{}x{}x{}", n, c, h, w));
  }
  ops::Attrs bad{{"output_size", to_symint_vec({1, 1})}, {"src_layout", std::string("nhcw")}};
  EXPECT_THROW(ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{rnd({1, 2, 3, 4})}, bad), ValueError);
  bad.set("src_layout", std::string("nhwc"));
  EXPECT_THROW(ops::run_eager(OpKind::adaptive_avg_pool2d, std::vector<Tensor>{rnd({2, 3, 4})}, bad), ValueError);
}

/// conv → conv values next to every reason to stay NCHW: a conv output that is also a graph output,
/// one with two users, one feeding a non-conv op, a conv whose weight is a graph input; dilated,
/// strided, grouped and depthwise convs; symbolic batch and width.
Built mixed_users() {
  GraphBuilder b("mixed_users");
  SymInt n = b.symbol("x.size()[0]", 2), wd = b.symbol("x.size()[3]", 21);
  ValueId x = b.input("x", {n, 8, 12, wd});
  ValueId wi = b.input("w", {32, 32, 1, 1});
  auto cst = [&](IntVec s, double sc) { return b.constant(rnd(s, sc)); };
  auto attrs = [](int64_t stride, int64_t pad, int64_t dil, int64_t groups) {
    return ops::Attrs{{"stride", to_symint_vec({stride, stride})}, {"padding", to_symint_vec({pad, pad})},
                      {"dilation", to_symint_vec({dil, dil})}, {"groups", SymInt(groups)}};
  };
  ValueId a = b.call(OpKind::relu, {b.call(OpKind::conv2d, {x, cst({16, 8, 3, 3}, 0.3), cst({16}, 0.1)}, attrs(2, 1, 1, 1))});
  ValueId bb = b.call(OpKind::conv2d, {a, cst({16, 1, 3, 3}, 0.3), cst({16}, 0.1)}, attrs(1, 2, 2, 16));  // dilated depthwise
  ValueId c = b.call(OpKind::conv2d, {bb, cst({32, 4, 3, 3}, 0.2), kNoValue}, attrs(1, 1, 1, 4));         // grouped
  ValueId d = b.call(OpKind::conv2d, {c, wi, kNoValue}, attrs(1, 0, 1, 1));                               // weight: an input
  ValueId e = b.call(OpKind::conv2d, {d, cst({32, 32, 1, 1}, 0.2), cst({32}, 0.1)}, attrs(1, 0, 1, 1));
  ValueId se = b.call(OpKind::mul, {e, b.call(OpKind::sigmoid, {d})});                                   // d: two users
  ValueId f = b.call(OpKind::conv2d, {se, cst({8, 32, 3, 3}, 0.2), cst({8}, 0.1)}, attrs(2, 2, 2, 1));  // dilated, strided
  return finish(b, {a, f}, {n, wd});
}

TEST(ConvLayout, GraphOutputsSharedAndNonConvUsersStayNchw) {
  manual_seed(25);
  use_test_cache_dir();
  Built b = mixed_users();
  ir::Graph g = *b.g;
  fuse_post_ops(g);
  ConvLayoutStats st = propagate_conv_layouts(g);
  ir::verify(g);
  const std::string text = ir::print(g);
  // only bb (→ c) and c (→ d) are channels-last: a is a graph output, d has two users, e feeds a mul
  EXPECT_EQ(st.nhwc_values, 2) << text;
  // d's weight is the graph input %w: packed once seen twice (weights="reuse")
  EXPECT_EQ(conv_layouts(g), (std::vector<std::string>{"-/-/constant", "-/nhwc/constant", "nhwc/nhwc/constant",
                                                       "nhwc/-/reuse", "-/-/constant", "-/-/constant"}))
      << text;
  auto cpu = compile_cpu(BackendInput{b.g, b.syms, "0/0", "default"});
  Interpreter plain(b.g, b.syms);
  Tensor w = rnd({32, 32, 1, 1}, 0.2);
  for (auto [n, wd] : std::vector<std::pair<int64_t, int64_t>>{{2, 21}, {1, 8}, {3, 40}, {2, 21}}) {
    std::vector<Tensor> x{rnd({n, 8, 12, wd}), w};
    std::vector<int64_t> sv{n, wd};
    std::vector<Tensor> want = plain.run(x, std::span<const int64_t>(sv)), got = cpu->run(x, sv);
    ASSERT_EQ(got.size(), 2u);
    for (size_t i = 0; i < 2; ++i) expect_close(got[i], want[i], fmt::format("output {} at {}x{}", i, n, wd));
  }
}

// One compiled function called from several threads at once while other convs fill the process-wide
// cache of packed constant weights past its capacity (it is cleared under the callers).
TEST(ConvLayout, ConcurrentCallsWhileThePackedWeightsCacheTurnsOver) {
  manual_seed(26);
  use_test_cache_dir();
  Built b = ocr_chain();
  auto cpu = compile_cpu(BackendInput{b.g, b.syms, "0/0", "default"});
  Interpreter plain(b.g, b.syms);
  Tensor w = rnd({16, 16, 1, 1}, 0.2);
  struct Case {
    std::vector<Tensor> in;
    std::vector<int64_t> sv;
    Tensor want;
  };
  std::vector<Case> cases;
  for (auto [n, wd] : std::vector<std::pair<int64_t, int64_t>>{{2, 40}, {1, 17}, {3, 24}}) {
    Case c{{rnd({n, 3, 16, wd}), w}, {n, wd}, {}};
    c.want = plain.run(c.in, std::span<const int64_t>(c.sv))[0];
    cases.push_back(std::move(c));
  }
  std::atomic<bool> churned{false};
  std::atomic<int> failures{0}, calls{0};
  std::thread churn([&] {  // > 4096 distinct constant weights, each packed once
    ops::Attrs a = conv_attrs(1, 1, 1);  // a dense 3x3: blocked weights
    a.set("weights", std::string("constant"));
    a.set("src_layout", std::string("nhwc"));
    Tensor x = rnd({1, 3, 3, 16});
    for (int i = 0; i < 4300; ++i) ops::run_eager(OpKind::conv2d, std::vector<Tensor>{x, rnd({16, 16, 3, 3}), Tensor()}, a);
    churned = true;
  });
  std::vector<std::thread> callers;
  for (int t = 0; t < 2; ++t)
    callers.emplace_back([&, t] {
      for (int i = 0; i < 10 || !churned; ++i) {
        const Case& c = cases[static_cast<size_t>(i + t) % cases.size()];
        Tensor got = cpu->run(c.in, c.sv)[0];
        if (!allclose(got, c.want, 2e-4, 2e-4, true)) ++failures;
        ++calls;
      }
    });
  churn.join();
  for (auto& th : callers) th.join();
  EXPECT_EQ(failures.load(), 0) << "of " << calls.load() << " calls";
}


// ---- extern results in memory slots (runner.h, loop::ScheduleOptions::extern_output_slot) -------------
TEST(ExternSlots, EmptyLikeMetaTakesAMatchingPlace) {
  std::vector<float> mem(24);
  std::vector<ops::OutputPlace> places{{mem.data(), {2, 3, 4}, DType::F32}};
  {
    ops::OutputPlacementScope scope(places);
    // another dtype, or non-contiguous strides: a fresh allocation, the place stays free
    Tensor other = ops::empty_like_meta(TensorMeta::contiguous(to_symint_vec({2, 3, 4}), DType::I32));
    EXPECT_NE(other.data_ptr(), static_cast<void*>(mem.data()));
    TensorMeta strided = TensorMeta::contiguous(to_symint_vec({4, 6}), DType::F32);
    strided.strides = to_symint_vec({1, 4});
    EXPECT_NE(ops::empty_like_meta(strided).data_ptr(), static_cast<void*>(mem.data()));
    // the same element count in another shape (a GEMM's [batch * M, N]) takes it, once
    Tensor t = ops::empty_like_meta(TensorMeta::contiguous(to_symint_vec({6, 4}), DType::F32));
    EXPECT_EQ(t.data_ptr(), static_cast<void*>(mem.data()));
    EXPECT_EQ(t.int_sizes(), (IntVec{6, 4}));
    EXPECT_EQ(places[0].data, nullptr);
    EXPECT_NE(ops::empty_like_meta(TensorMeta::contiguous(to_symint_vec({2, 3, 4}), DType::F32)).data_ptr(),
              static_cast<void*>(mem.data()));
  }
  places[0].data = mem.data();  // outside the scope nothing is placed
  EXPECT_NE(ops::empty_like_meta(TensorMeta::contiguous(to_symint_vec({2, 3, 4}), DType::F32)).data_ptr(),
            static_cast<void*>(mem.data()));
}

/// Buffers written by an extern step that hold a memory slot.
int extern_slot_buffers(const CpuArtifact& a) {
  int n = 0;
  for (const loop::Buffer& b : a.program().buffers) n += b.from_extern && b.slot >= 0;
  return n;
}

TEST(ExternSlots, ConvResultsShareSlotsAcrossSizes) {
  // The chain's conv results between convs are extern temporaries: planned into slots, and the run
  // gives the slot to the kernel. Sizes alternate so the memoized output metadata must follow them.
  manual_seed(31);
  use_test_cache_dir();
  Built b = ocr_chain();
  BackendInput in{b.g, b.syms, "0/0", "default"};
  CpuCompileInfo info;
  auto cpu = compile_cpu(in, &info);
  EXPECT_GT(extern_slot_buffers(*cpu), 3);
  EXPECT_EQ(info.schedule.extern_slot_buffers, extern_slot_buffers(*cpu));
  Interpreter plain(b.g, b.syms);
  Tensor w = rnd({16, 16, 1, 1}, 0.2);
  for (auto [n, wd] : std::vector<std::pair<int64_t, int64_t>>{{2, 40}, {2, 40}, {1, 17}, {2, 40}, {3, 64}, {3, 64}}) {
    std::vector<Tensor> x{rnd({n, 3, 16, wd}), w};
    std::vector<int64_t> sv{n, wd};
    Tensor want = plain.run(x, std::span<const int64_t>(sv))[0];
    Tensor got = cpu->run(x, sv)[0];
    expect_close(got, want, fmt::format("cpu at {}x{}", n, wd));
    // the result is the caller's: a later call must not write into it
    Tensor kept = got.clone();
    std::vector<Tensor> x2{rnd({n, 3, 16, wd}), w};
    (void)cpu->run(x2, sv);
    expect_close(got, kept, fmt::format("first result after a second call at {}x{}", n, wd), 0.0);
  }
}

TEST(ExternSlots, ResultsReadByOtherExternsKeepTheirStorage) {
  // cumsum is not an extern whose result is always new (extern_result_is_fresh), so the conv result it
  // reads keeps its own storage; the conv result read by a kernel gets a slot.
  use_test_cache_dir();
  GraphBuilder g("conv_cumsum");
  SymInt wd = g.symbol("x.size()[3]", 12);
  ValueId x = g.input("x", {1, 4, 6, wd});
  ValueId c0 = g.call(OpKind::conv2d, {x, g.constant(rnd({8, 4, 1, 1}, 0.3)), kNoValue}, conv_attrs(1, 0, 1));
  ValueId cs = g.call(OpKind::cumsum, {c0}, {{"dim", SymInt(3)}});
  ValueId c1 = g.call(OpKind::conv2d, {x, g.constant(rnd({8, 4, 1, 1}, 0.3)), kNoValue}, conv_attrs(1, 0, 1));
  ValueId e = g.call(OpKind::exp, {c1});
  Built b = finish(g, {cs, g.call(OpKind::add, {e, cs})}, {wd});
  auto cpu = compile_cpu(BackendInput{b.g, b.syms, "0/0", "default"}, nullptr);
  const loop::Program& p = cpu->program();
  int conv_slots = 0, conv_results = 0;
  for (const loop::Extern& ex : p.externs) {
    if (ex.op != OpKind::conv2d) continue;
    ++conv_results;
    const loop::Buffer& r = p.buffers[static_cast<size_t>(ex.outputs.at(0))];
    bool read_by_cumsum = false;
    for (const loop::Extern& other : p.externs)
      if (other.op == OpKind::cumsum)
        for (int i : other.inputs) read_by_cumsum = read_by_cumsum || i == r.id;
    if (read_by_cumsum) {
      EXPECT_EQ(r.slot, -1);
    }
    conv_slots += r.slot >= 0;
  }
  EXPECT_EQ(conv_results, 2);
  EXPECT_EQ(conv_slots, 1);
  Interpreter plain(b.g, b.syms);
  for (int64_t w : {12, 7, 12}) {
    std::vector<Tensor> xs{rnd({1, 4, 6, w})};
    std::vector<int64_t> sv{w};
    std::vector<Tensor> want = plain.run(xs, std::span<const int64_t>(sv)), got = cpu->run(xs, sv);
    for (size_t k = 0; k < want.size(); ++k) expect_close(got[k], want[k], fmt::format("output {} at width {}", k, w));
  }
}

}  // namespace
}  // namespace protean::backend::cpu
