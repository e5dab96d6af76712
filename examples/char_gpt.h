// A small character-level GPT written with Protean's public API (pre-norm transformer blocks:
// causal self-attention and a GELU MLP; learned token and position embeddings; the output head tied
// to the token embedding), and a deterministic character corpus to train it on. Used by
// examples/ddp_char_gpt.cpp and the data-parallel tests (tests/mpi/ddp_mpi_test.cpp).
//
// Shapes: tokens [B, T] i64 with T ≤ max_len; logits [B, T, vocab] f32; loss is the mean
// cross-entropy of next-character prediction over all B·T positions (torch's F.cross_entropy).
#pragma once

#include <protean/protean.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace char_gpt {

namespace pt = protean;

struct Config {
  int64_t vocab = 64;
  int64_t d = 32;        ///< model width
  int64_t heads = 2;
  int64_t layers = 1;
  int64_t max_len = 256; ///< the longest sequence (rows of the position embedding)
};

struct Block : pt::Module {
  pt::Tensor &ln1_w, &ln1_b, &w_qkv, &b_qkv, &w_o, &b_o, &ln2_w, &ln2_b, &w_fc, &b_fc, &w_proj, &b_proj;
  int64_t d, heads;
  explicit Block(const Config& c)
      : ln1_w(register_parameter("ln1_w", pt::ones({c.d}))),
        ln1_b(register_parameter("ln1_b", pt::zeros({c.d}))),
        w_qkv(register_parameter("w_qkv", pt::randn({3 * c.d, c.d}) * 0.02)),
        b_qkv(register_parameter("b_qkv", pt::zeros({3 * c.d}))),
        w_o(register_parameter("w_o", pt::randn({c.d, c.d}) * 0.02)),
        b_o(register_parameter("b_o", pt::zeros({c.d}))),
        ln2_w(register_parameter("ln2_w", pt::ones({c.d}))),
        ln2_b(register_parameter("ln2_b", pt::zeros({c.d}))),
        w_fc(register_parameter("w_fc", pt::randn({4 * c.d, c.d}) * 0.02)),
        b_fc(register_parameter("b_fc", pt::zeros({4 * c.d}))),
        w_proj(register_parameter("w_proj", pt::randn({c.d, 4 * c.d}) * 0.02)),
        b_proj(register_parameter("b_proj", pt::zeros({c.d}))),
        d(c.d),
        heads(c.heads) {}

  pt::Tensor forward(const pt::Tensor& x) const {  // x [B, T, d]
    const pt::SymInt B = x.size(0), T = x.size(1);
    pt::Tensor h = pt::layer_norm(x, {d}, ln1_w, ln1_b, 1e-5);
    pt::Tensor qkv = pt::linear(h, w_qkv, b_qkv);  // [B, T, 3d]
    auto head_view = [&](int64_t i) {               // [B, heads, T, d/heads]
      pt::Tensor part = pt::slice(qkv, 2, i * d, (i + 1) * d);
      return pt::transpose(pt::reshape(part, {B, T, heads, d / heads}), 1, 2);
    };
    pt::Tensor a = pt::scaled_dot_product_attention(head_view(0), head_view(1), head_view(2), {}, true);
    a = pt::reshape(pt::transpose(a, 1, 2), {B, T, d});
    pt::Tensor y = x + pt::linear(a, w_o, b_o);
    pt::Tensor m = pt::linear(pt::gelu(pt::linear(pt::layer_norm(y, {d}, ln2_w, ln2_b, 1e-5), w_fc, b_fc)), w_proj, b_proj);
    return y + m;
  }
};

struct Gpt : pt::Module {
  Config cfg;
  pt::Tensor &wte, &wpe, &lnf_w, &lnf_b;
  std::vector<std::shared_ptr<Block>> blocks;
  explicit Gpt(const Config& c)
      : cfg(c),
        wte(register_parameter("wte", pt::randn({c.vocab, c.d}) * 0.02)),
        wpe(register_parameter("wpe", pt::randn({c.max_len, c.d}) * 0.02)),
        lnf_w(register_parameter("lnf_w", pt::ones({c.d}))),
        lnf_b(register_parameter("lnf_b", pt::zeros({c.d}))) {
    for (int64_t i = 0; i < c.layers; ++i)
      blocks.push_back(register_module("blocks_" + std::to_string(i), std::make_shared<Block>(c)));
  }

  /// tokens [B, T] i64 → logits [B, T, vocab].
  pt::Tensor forward(const pt::Tensor& tokens) const {
    const pt::SymInt T = tokens.size(1);
    pt::Tensor x = pt::embedding(wte, tokens) + pt::slice(wpe, 0, 0, T);
    for (const auto& b : blocks) x = b->forward(x);
    x = pt::layer_norm(x, {cfg.d}, lnf_w, lnf_b, 1e-5);
    return pt::matmul(x, pt::transpose(wte, 0, 1));
  }

  /// Mean next-character cross-entropy: tokens and targets [B, T] i64.
  pt::Tensor loss(const pt::Tensor& tokens, const pt::Tensor& targets) const {
    pt::Tensor logp = pt::log_softmax(forward(tokens), 2);
    return -pt::mean(pt::gather(logp, 2, pt::unsqueeze(targets, 2)));
  }
};

/// A corpus of `n` characters drawn from a fixed 64-symbol alphabet by a deterministic generator with
/// structure a model can learn (words from a small vocabulary, spaces, punctuation), as token ids.
inline std::vector<int64_t> corpus(int64_t n) {
  static const char* words[] = {"the", "shape", "of", "a", "tensor", "changes", "and", "graph", "guards",
                                "compile", "once", "ranks", "agree", "on", "dynamic", "sizes", "gradient",
                                "all", "reduce", "step"};
  std::vector<int64_t> out;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  while (static_cast<int64_t>(out.size()) < n) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const std::string w = words[s % 20];
    for (char ch : w) out.push_back(ch - 'a' + 1);        // 1..26
    out.push_back((s >> 8) % 7 == 0 ? 27 : 0);            // '.' or ' '
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

/// A batch of `batch` windows of length `len` from the corpus, starting at window `first` (windows
/// placed at a fixed stride): {tokens, targets} [batch, len] i64, targets shifted by one character.
inline std::pair<pt::Tensor, pt::Tensor> batch_at(const std::vector<int64_t>& text, int64_t first, int64_t batch,
                                                  int64_t len) {
  std::vector<int64_t> x, y;
  const int64_t span = static_cast<int64_t>(text.size()) - len - 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ((first + b) * 7919) % span;
    for (int64_t t = 0; t < len; ++t) {
      x.push_back(text[static_cast<size_t>(start + t)]);
      y.push_back(text[static_cast<size_t>(start + t + 1)]);
    }
  }
  return {pt::tensor<int64_t>(x, {batch, len}), pt::tensor<int64_t>(y, {batch, len})};
}

}  // namespace char_gpt
