// A small transformer written as protean::Modules, used by the region scenarios and by the regional
// compilation benchmark (bench/regions_bench.cpp): Model → Blocks → Block (pre-LayerNorm, attention
// child, MLP) → Attention (fused qkv projection, scaled_dot_product_attention, output projection).
// Attention reads two registered attributes (`heads`, `causal`), so a block whose attention is
// causal has a different region key.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "protean/protean.h"

namespace protean::scenario {

struct Attention : Module {
  Attention(int64_t d, int64_t heads) {
    wqkv = &register_parameter("wqkv", randn({3 * d, d}) * (1.0 / std::sqrt(static_cast<double>(d))));
    bqkv = &register_parameter("bqkv", randn({3 * d}) * 0.02);
    wo = &register_parameter("wo", randn({d, d}) * (1.0 / std::sqrt(static_cast<double>(d))));
    register_attribute("heads", heads);
    register_attribute("causal", 0);
  }
  /// x [B, T, D] → [B, T, D].
  Tensor forward(const Tensor& x) {
    const int64_t h = static_cast<int64_t>(attribute("heads"));
    const bool causal = static_cast<int64_t>(attribute("causal")) != 0;
    SymInt B = x.size(0), T = x.size(1), D = x.size(2);
    TensorList qkv = split(linear(x, *wqkv, *bqkv), D, -1);
    auto heads = [&](const Tensor& t) { return transpose(reshape(t, {B, T, SymInt(h), D / h}), 1, 2); };
    Tensor a = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), {}, causal);
    return linear(reshape(transpose(a, 1, 2), {B, T, D}), *wo);
  }
  Tensor* wqkv;
  Tensor* bqkv;
  Tensor* wo;
};

struct Block : Module {
  Block(int64_t d, int64_t heads) {
    ln1_w = &register_parameter("ln1_w", ones({d}));
    ln1_b = &register_parameter("ln1_b", zeros({d}));
    ln2_w = &register_parameter("ln2_w", ones({d}));
    ln2_b = &register_parameter("ln2_b", zeros({d}));
    w1 = &register_parameter("w1", randn({4 * d, d}) * (1.0 / std::sqrt(static_cast<double>(d))));
    b1 = &register_parameter("b1", randn({4 * d}) * 0.02);
    w2 = &register_parameter("w2", randn({d, 4 * d}) * (0.5 / std::sqrt(static_cast<double>(d))));
    b2 = &register_parameter("b2", randn({d}) * 0.02);
    attn = register_module("attn", std::make_shared<Attention>(d, heads));
  }
  /// x [B, T, D] → [B, T, D]: x + attn(ln1(x)), then + mlp(ln2(x)).
  Tensor forward(const Tensor& x) {
    SymInt D = x.size(-1);
    Tensor y = x + call(attn, layer_norm(x, {D}, *ln1_w, *ln1_b));
    Tensor m = linear(gelu(linear(layer_norm(y, {D}, *ln2_w, *ln2_b), *w1, *b1)), *w2, *b2);
    return y + m;
  }
  Tensor *ln1_w, *ln1_b, *ln2_w, *ln2_b, *w1, *b1, *w2, *b2;
  std::shared_ptr<Attention> attn;
};

struct Blocks : Module {};

struct Model : Module {
  Model(int64_t n_blocks, int64_t d, int64_t heads) {
    blocks_mod = register_module("blocks", std::make_shared<Blocks>());
    for (int64_t i = 0; i < n_blocks; ++i)
      blocks.push_back(blocks_mod->register_module(std::to_string(i), std::make_shared<Block>(d, heads)));
    lnf_w = &register_parameter("lnf_w", ones({d}));
    lnf_b = &register_parameter("lnf_b", zeros({d}));
  }
  /// x [B, T, D] → [B, T, D].
  Tensor forward(const Tensor& x) {
    Tensor h = x;
    for (auto& b : blocks) h = call(b, h);
    return layer_norm(h, {h.size(-1)}, *lnf_w, *lnf_b);
  }
  std::shared_ptr<Blocks> blocks_mod;
  std::vector<std::shared_ptr<Block>> blocks;
  Tensor *lnf_w, *lnf_b;
};

}  // namespace protean::scenario
