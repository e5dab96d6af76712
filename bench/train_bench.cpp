// Training benchmark: one training step (forward, backward, AdamW update) of three models on CPU,
// in one process, three runners in alternating rounds from the same initial weights and batches:
//   * protean_compiled: protean::compile_train_step (forward + backward + optimizer as one frame, cpu backend)
//   * protean_eager:    Protean's eager tape (Tensor::backward) and optim::AdamW::step()
//   * libtorch:         libtorch 1.13 eager C++ (Debian libtorch-dev), its autograd and torch::optim::AdamW
// Models: MLP 784-1024-1024-10 and a LeNet-style CNN, without and with BatchNorm after each convolution
// (cnn_bn: training-mode batch norm with running statistics), on Fashion-MNIST (Debian dataset-fashion-mnist,
// /usr/share/datasets/fashion-mnist), and a 4-layer character-level GPT (d = 128, 4 heads, sequence
// length cycling through 32, 64, ..., 256) on a text file of the machine (--corpus).
//
// Figures (JSON, --out): steps/s at 1 and 2 threads (median and worst of the rounds, load average),
// peak RSS and cold time to the first step (each runner alone in a fresh child process with an empty
// kernel cache), the 200-step loss curves against libtorch (max abs diff), the GPT's compile counts
// over the 8 sequence lengths (a fresh process without and then with a PGO profile, learning rate
// changed every step), and the compiled AdamW update's bandwidth against memcpy over the parameter arena.
//
//   build/train_bench --out bench/results/train_$(date +%F).json
// Loss-curve diagnostics: --curve-reference MODEL STEPS [--curve-reference-threads] [--curve-diffs] (with a
// compiled float64 runner; --out FILE before it writes the curves as JSON; --curve-sgd before it trains
// every runner with SGD + momentum instead of AdamW, see train_bench.h),
// --grad-compare MODEL (gradients on the first batch vs libtorch f64), --grad-track MODEL STEPS
// (compiled vs eager gradients along eager's trajectory).
//
// The fresh-process children run in binaries that link one side only: train_bench_protean_child
// (Protean, no libtorch) and train_bench_libtorch_child (libtorch, no Protean), both built from this file
// with TRAIN_BENCH_ONLY set, so a child's peak RSS holds its own library's pages and not the other's (a
// program that trains with one of them does not map the other). Without them beside train_bench, the
// children run train_bench itself and the JSON says so (`child_binary`).
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

// TRAIN_BENCH_ONLY: 0 (the benchmark: every runner), 1 (a child binary with Protean's runners only), 2 (a
// child binary with libtorch's only).
#ifndef TRAIN_BENCH_ONLY
#define TRAIN_BENCH_ONLY 0
#endif
#define TB_PROTEAN (TRAIN_BENCH_ONLY != 2)
#define TB_TORCH (TRAIN_BENCH_ONLY != 1)

#if TB_PROTEAN
#include "backend/donation.h"
#include "protean/autograd.h"
#include "protean/optim.h"
#include "protean/protean.h"
#endif
#include "train_bench.h"

#if TB_PROTEAN
namespace pt = protean;
using pt::Tensor;
#endif
using train_bench::Batch;
using train_bench::GptConfig;
using train_bench::Model;
using train_bench::Runner;
using train_bench::Weight;

namespace {

using Clock = std::chrono::steady_clock;
double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// CPU seconds of this thread / of the whole process: on a shared machine these count only the time
// the work actually ran, not the time it waited for a core.
double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double process_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
// CPU seconds (user + system) of this process and of its children that have ended (the system
// compiler's processes of a cold compile): the cold start's cost without the time spent waiting.
double process_and_children_cpu() {
  auto secs = [](const rusage& u) {
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  return secs(self) + secs(children);
}

constexpr double kWeightDecay = 0.01;
constexpr double kBaseLr = 1e-3;
const std::array<int64_t, 8> kGptLengths = {32, 64, 96, 128, 160, 192, 224, 256};

std::string model_name(Model m) {
  switch (m) {
    case Model::Mlp: return "mlp";
    case Model::Cnn: return "cnn";
    case Model::CnnBn: return "cnn_bn";
    case Model::Gpt: return "gpt";
  }
  return "?";
}
Model model_of(const std::string& s) {
  if (s == "mlp") return Model::Mlp;
  if (s == "cnn") return Model::Cnn;
  if (s == "cnn_bn") return Model::CnnBn;
  if (s == "gpt") return Model::Gpt;
  throw std::invalid_argument("unknown model '" + s + "' (mlp, cnn, cnn_bn, gpt)");
}

// A learning-rate schedule that changes on every step (cosine decay to 10%).
double lr_at(int64_t i) { return kBaseLr * (0.55 + 0.45 * std::cos(3.14159265358979 * static_cast<double>(i % 400) / 400.0)); }

// ---- data ------------------------------------------------------------------------------------------------
// The whole file decompressed into one allocation of the size gzip's trailer records (ISIZE, the size
// modulo 2^32): a vector grown by doubling would free blocks of 0.5-16 MiB, and each such free of a
// mapped block raises glibc's dynamic mmap threshold, after which every runner's later allocations
// below it come from the heap and stay in the process's RSS. The loader must leave both runners the
// allocator state a fresh process has.
std::vector<uint8_t> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path + " (install it: scripts/setup.sh --peers)");
  std::vector<uint8_t> out;
  if (FILE* raw = std::fopen(path.c_str(), "rb")) {
    uint8_t t[4];
    if (std::fseek(raw, -4, SEEK_END) == 0 && std::fread(t, 1, 4, raw) == 4) {
      const uint32_t isize = uint32_t(t[0]) | (uint32_t(t[1]) << 8) | (uint32_t(t[2]) << 16) | (uint32_t(t[3]) << 24);
      out.reserve(isize);
    }
    std::fclose(raw);
  }
  std::vector<uint8_t> buf(1 << 16);
  int n;
  while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) out.insert(out.end(), buf.begin(), buf.begin() + n);
  gzclose(f);
  return out;
}
uint32_t be32(const uint8_t* p) { return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3]; }

struct FashionMnist {
  int64_t n = 0;
  std::vector<float> images;  // [n, 784], normalized with the training set's mean/std
  std::vector<int64_t> labels;
};
FashionMnist load_fashion_mnist(const std::string& dir) {
  std::vector<uint8_t> img = read_gz(dir + "/train-images-idx3-ubyte.gz");
  std::vector<uint8_t> lab = read_gz(dir + "/train-labels-idx1-ubyte.gz");
  if (img.size() < 16 || be32(img.data()) != 2051 || lab.size() < 8 || be32(lab.data()) != 2049)
    throw std::runtime_error("not IDX files in " + dir);
  FashionMnist d;
  d.n = be32(img.data() + 4);
  if (be32(img.data() + 8) != 28 || be32(img.data() + 12) != 28 || be32(lab.data() + 4) != d.n)
    throw std::runtime_error("unexpected IDX sizes in " + dir);
  d.images.resize(static_cast<size_t>(d.n) * 784);
  for (size_t i = 0; i < d.images.size(); ++i) d.images[i] = (img[16 + i] / 255.0f - 0.2860f) / 0.3530f;
  d.labels.assign(lab.begin() + 8, lab.begin() + 8 + d.n);
  return d;
}

struct Corpus {
  std::string path;
  std::vector<int64_t> ids;
  int64_t vocab = 0;
};
Corpus load_corpus(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read corpus " + path);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::array<int64_t, 256> id;
  id.fill(-1);
  Corpus c;
  c.path = path;
  for (unsigned char ch : text)
    if (id[ch] < 0) id[ch] = c.vocab++;
  c.ids.reserve(text.size());  // one allocation: see read_gz
  for (unsigned char ch : text) c.ids.push_back(id[ch]);
  if (c.ids.size() < 4096) throw std::runtime_error("corpus " + path + " is too small");
  return c;
}

struct Data {
  FashionMnist fm;
  Corpus corpus;
};

// Batch i of a model: the same for every runner.
Batch make_batch(Model m, const Data& d, int64_t i) {
  Batch b;
  std::mt19937_64 rng(1000003ull * static_cast<uint64_t>(i) + 17);
  switch (m) {
    case Model::Mlp:
    case Model::Cnn:
    case Model::CnnBn: {
      const int64_t B = m == Model::Mlp ? 128 : 64;
      b.x_shape = m == Model::Mlp ? std::vector<int64_t>{B, 784} : std::vector<int64_t>{B, 1, 28, 28};
      b.x.resize(static_cast<size_t>(B) * 784);
      std::uniform_int_distribution<int64_t> pick(0, d.fm.n - 1);
      for (int64_t r = 0; r < B; ++r) {
        int64_t s = pick(rng);
        std::memcpy(&b.x[static_cast<size_t>(r) * 784], &d.fm.images[static_cast<size_t>(s) * 784], 784 * sizeof(float));
        b.y.push_back(d.fm.labels[static_cast<size_t>(s)]);
      }
      break;
    }
    case Model::Gpt: {
      const int64_t B = 8, T = kGptLengths[static_cast<size_t>(i) % kGptLengths.size()];
      b.x_shape = {B, T};
      b.tokens.reserve(static_cast<size_t>(B * T));
      b.y.reserve(static_cast<size_t>(B * T));
      std::uniform_int_distribution<int64_t> pick(0, static_cast<int64_t>(d.corpus.ids.size()) - T - 2);
      for (int64_t r = 0; r < B; ++r) {
        int64_t s = pick(rng);
        for (int64_t t = 0; t < T; ++t) {
          b.tokens.push_back(d.corpus.ids[static_cast<size_t>(s + t)]);
          b.y.push_back(d.corpus.ids[static_cast<size_t>(s + t + 1)]);
        }
      }
      break;
    }
  }
  return b;
}

// ---- initial weights ---------------------------------------------------------------------------------------
std::vector<Weight> init_weights(Model m, const GptConfig& cfg) {
  std::mt19937_64 rng(20261202);
  std::vector<Weight> w;
  auto normal = [&](const std::string& name, std::vector<int64_t> shape, double stddev) {
    Weight x{name, shape, {}};
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    std::normal_distribution<double> nd(0.0, stddev);
    x.data.reserve(static_cast<size_t>(n));  // one allocation: see read_gz
    for (int64_t i = 0; i < n; ++i) x.data.push_back(static_cast<float>(nd(rng)));
    w.push_back(std::move(x));
  };
  auto constant = [&](const std::string& name, std::vector<int64_t> shape, float v) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    w.push_back({name, shape, std::vector<float>(static_cast<size_t>(n), v)});
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, bool bias = true) {
    normal(name + "_w", {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
    if (bias) constant(name + "_b", {out}, 0.0f);
  };
  switch (m) {
    case Model::Mlp:
      linear("fc1", 1024, 784);
      linear("fc2", 1024, 1024);
      linear("fc3", 10, 1024);
      break;
    case Model::Cnn:
    case Model::CnnBn:
      normal("conv1_w", {6, 1, 5, 5}, 1.0 / 5.0);
      constant("conv1_b", {6}, 0.0f);
      if (m == Model::CnnBn) {
        constant("bn1_w", {6}, 1.0f);
        constant("bn1_b", {6}, 0.0f);
      }
      normal("conv2_w", {16, 6, 5, 5}, 1.0 / std::sqrt(150.0));
      constant("conv2_b", {16}, 0.0f);
      if (m == Model::CnnBn) {
        constant("bn2_w", {16}, 1.0f);
        constant("bn2_b", {16}, 0.0f);
      }
      linear("fc1", 120, 400);
      linear("fc2", 84, 120);
      linear("fc3", 10, 84);
      break;
    case Model::Gpt:
      normal("wte", {cfg.vocab, cfg.d}, 0.02);
      normal("wpe", {cfg.max_t, cfg.d}, 0.02);
      for (int64_t l = 0; l < cfg.layers; ++l) {
        const std::string p = "h" + std::to_string(l) + "_";
        constant(p + "ln1_w", {cfg.d}, 1.0f);
        constant(p + "ln1_b", {cfg.d}, 0.0f);
        normal(p + "qkv_w", {3 * cfg.d, cfg.d}, 0.02);
        constant(p + "qkv_b", {3 * cfg.d}, 0.0f);
        normal(p + "proj_w", {cfg.d, cfg.d}, 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers)));
        constant(p + "proj_b", {cfg.d}, 0.0f);
        constant(p + "ln2_w", {cfg.d}, 1.0f);
        constant(p + "ln2_b", {cfg.d}, 0.0f);
        normal(p + "fc_w", {4 * cfg.d, cfg.d}, 0.02);
        constant(p + "fc_b", {4 * cfg.d}, 0.0f);
        normal(p + "fc2_w", {cfg.d, 4 * cfg.d}, 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers)));
        constant(p + "fc2_b", {cfg.d}, 0.0f);
      }
      constant("lnf_w", {cfg.d}, 1.0f);
      constant("lnf_b", {cfg.d}, 0.0f);
      normal("head_w", {cfg.vocab, cfg.d}, 0.02);
      break;
  }
  return w;
}

// --curve-sgd: every runner trains with SGD + momentum (train_bench.h) instead of AdamW.
bool g_sgd = false;

#if TB_PROTEAN
// ---- the Protean models ------------------------------------------------------------------------------------
struct Net : pt::Module {
  Net(Model m, const std::vector<Weight>& ws, const GptConfig& cfg, pt::DType dtype = pt::DType::F32)
      : model(m), cfg(cfg), dtype(dtype) {
    for (const Weight& w : ws) {
      Tensor t = pt::cast(pt::from_blob(const_cast<float*>(w.data.data()), w.shape, pt::DType::F32), dtype).clone();
      p.push_back(&register_parameter(w.name, t));
    }
    if (m == Model::CnnBn)  // running mean and variance of bn1 and bn2, updated by every training step
      for (auto [name, c] : {std::pair{"bn1", 6}, {"bn2", 16}}) {
        stats.push_back(&register_buffer(std::string(name) + "_running_mean", pt::zeros({c}, dtype)));
        stats.push_back(&register_buffer(std::string(name) + "_running_var", pt::ones({c}, dtype)));
      }
  }
  std::vector<Tensor> params() const {
    std::vector<Tensor> r;
    for (Tensor* t : p) r.push_back(*t);
    return r;
  }
  Tensor nll(const Tensor& logits, const Tensor& y) const {
    return -pt::mean(pt::gather(pt::log_softmax(logits, 1), 1, pt::unsqueeze(y, 1)));
  }
  Tensor loss(const Tensor& x, const Tensor& y) const {
    switch (model) {
      case Model::Mlp: {
        Tensor h = pt::relu(pt::linear(x, *p[0], *p[1]));
        h = pt::relu(pt::linear(h, *p[2], *p[3]));
        return nll(pt::linear(h, *p[4], *p[5]), y);
      }
      case Model::CnnBn: {
        auto bn = [&](const Tensor& h, size_t w, size_t st) {
          return pt::batch_norm_train(h, *p[w], *p[w + 1], *stats[st], *stats[st + 1], 0.1, 1e-5);
        };
        Tensor h = pt::max_pool2d(pt::relu(bn(pt::conv2d(x, *p[0], *p[1], {1, 1}, {2, 2}), 2, 0)), {2, 2});
        h = pt::max_pool2d(pt::relu(bn(pt::conv2d(h, *p[4], *p[5]), 6, 2)), {2, 2});
        h = pt::flatten(h, 1);
        h = pt::relu(pt::linear(h, *p[8], *p[9]));
        h = pt::relu(pt::linear(h, *p[10], *p[11]));
        return nll(pt::linear(h, *p[12], *p[13]), y);
      }
      case Model::Cnn: {
        Tensor h = pt::max_pool2d(pt::relu(pt::conv2d(x, *p[0], *p[1], {1, 1}, {2, 2})), {2, 2});
        h = pt::max_pool2d(pt::relu(pt::conv2d(h, *p[2], *p[3])), {2, 2});
        h = pt::flatten(h, 1);
        h = pt::relu(pt::linear(h, *p[4], *p[5]));
        h = pt::relu(pt::linear(h, *p[6], *p[7]));
        return nll(pt::linear(h, *p[8], *p[9]), y);
      }
      case Model::Gpt: {
        const int64_t d = cfg.d, H = cfg.heads, dh = d / H;
        const pt::SymInt B = x.size(0), T = x.size(1);
        Tensor h = pt::embedding(*p[0], x) + pt::slice(*p[1], 0, 0, T);
        size_t k = 2;
        for (int64_t l = 0; l < cfg.layers; ++l) {
          Tensor a = pt::layer_norm(h, {d}, *p[k], *p[k + 1], 1e-5);
          Tensor qkv = pt::linear(a, *p[k + 2], *p[k + 3]);
          auto parts = pt::split(qkv, pt::SymInt(d), 2);
          auto heads = [&](const Tensor& t) { return pt::transpose(pt::reshape(t, {B, -1, H, dh}), 1, 2); };
          Tensor o = pt::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), {}, true);
          o = pt::reshape(pt::transpose(o, 1, 2), {B, -1, d});
          h = h + pt::linear(o, *p[k + 4], *p[k + 5]);
          Tensor m = pt::layer_norm(h, {d}, *p[k + 6], *p[k + 7], 1e-5);
          h = h + pt::linear(pt::gelu(pt::linear(m, *p[k + 8], *p[k + 9])), *p[k + 10], *p[k + 11]);
          k += 12;
        }
        h = pt::layer_norm(h, {d}, *p[k], *p[k + 1], 1e-5);
        Tensor logits = pt::reshape(pt::linear(h, *p[k + 2]), {-1, cfg.vocab});
        return nll(logits, pt::reshape(y, {-1}));
      }
    }
    return {};
  }
  Model model;
  GptConfig cfg;
  pt::DType dtype;
  std::vector<Tensor*> p;
  std::vector<Tensor*> stats;  // CnnBn: running_mean, running_var of bn1, then of bn2
};

std::vector<std::vector<double>> net_parameters(const Net& net) {
  std::vector<std::vector<double>> r;
  for (Tensor* t : net.p) {
    Tensor c = pt::cast(t->detach(), pt::DType::F64).contiguous();
    const auto* d = static_cast<const double*>(c.data_ptr());
    r.emplace_back(d, d + c.int_numel());
  }
  return r;
}

std::pair<Tensor, Tensor> protean_inputs(Model m, const Batch& b, pt::DType dtype = pt::DType::F32) {
  Tensor x = m == Model::Gpt ? pt::from_blob(const_cast<int64_t*>(b.tokens.data()), b.x_shape, pt::DType::I64)
                             : pt::from_blob(const_cast<float*>(b.x.data()), b.x_shape, pt::DType::F32);
  if (m != Model::Gpt && dtype != pt::DType::F32) x = pt::cast(x, dtype);
  Tensor y = pt::from_blob(const_cast<int64_t*>(b.y.data()), {static_cast<int64_t>(b.y.size())}, pt::DType::I64);
  return {x, y};
}

pt::optim::AdamOptions adamw_options() {
  pt::optim::AdamOptions o = pt::optim::AdamWOptions(kBaseLr);
  o.weight_decay = kWeightDecay;
  return o;
}


std::unique_ptr<pt::optim::Optimizer> make_optimizer(std::vector<Tensor> params) {
  if (!g_sgd) return std::make_unique<pt::optim::AdamW>(std::move(params), adamw_options());
  pt::optim::SGDOptions o;
  o.lr = kBaseLr * train_bench::kSgdLrScale;
  o.momentum = train_bench::kSgdMomentum;
  return std::make_unique<pt::optim::SGD>(std::move(params), o);
}
void set_lr(pt::optim::Optimizer& opt, double lr) {
  if (auto* sgd = dynamic_cast<pt::optim::SGD*>(&opt)) sgd->param_groups[0].options.lr = lr;
  else dynamic_cast<pt::optim::AdamW&>(opt).param_groups[0].options.lr = lr;
}

class ProteanEager final : public Runner {
 public:
  ProteanEager(Model m, const std::vector<Weight>& w, const GptConfig& cfg, pt::DType dtype = pt::DType::F32)
      : net_(std::make_shared<Net>(m, w, cfg, dtype)) {
    for (Tensor* t : net_->p) t->requires_grad_();
    opt_ = make_optimizer(net_->params());
  }
  double step(const Batch& b, double lr) override {
    set_lr(*opt_, lr);
    opt_->zero_grad();
    auto [x, y] = protean_inputs(net_->model, b, net_->dtype);
    Tensor loss = net_->loss(x, y);
    loss.backward();
    opt_->step();
    return pt::cast(loss, pt::DType::F64).item<double>();
  }
  std::vector<std::vector<double>> parameters() const override { return net_parameters(*net_); }
  std::vector<std::vector<double>> gradients() const override {
    std::vector<std::vector<double>> r;
    for (Tensor* t : net_->p) {
      Tensor c = pt::cast(t->grad(), pt::DType::F64).contiguous();
      const auto* d = static_cast<const double*>(c.data_ptr());
      r.emplace_back(d, d + c.int_numel());
    }
    return r;
  }

 private:
  std::shared_ptr<Net> net_;
  std::unique_ptr<pt::optim::Optimizer> opt_;
};

class ProteanCompiled final : public Runner {
 public:
  ProteanCompiled(Model m, const std::vector<Weight>& w, const GptConfig& cfg, pt::DType dtype = pt::DType::F32)
      : net_(std::make_shared<Net>(m, w, cfg, dtype)) {
    opt_ = make_optimizer(net_->params());
    Net* net = net_.get();
    step_ = pt::compile_train_step(
        net_, [net](Tensor x, Tensor y) { return net->loss(x, y); }, *opt_,
        {.name = "train_" + model_name(m), .backend = "cpu"});
  }
  double step(const Batch& b, double lr) override {
    set_lr(*opt_, lr);
    auto [x, y] = protean_inputs(net_->model, b, net_->dtype);
    return pt::cast(step_(x, y), pt::DType::F64).item<double>();
  }
  std::vector<std::vector<double>> parameters() const override { return net_parameters(*net_); }

 private:
  std::shared_ptr<Net> net_;
  std::unique_ptr<pt::optim::Optimizer> opt_;
  std::function<Tensor(Tensor, Tensor)> step_;
};

#endif  // TB_PROTEAN

const std::vector<std::string> kRunners = {"protean_compiled", "protean_eager", "libtorch"};

bool is_torch_runner(const std::string& name) { return name.rfind("libtorch", 0) == 0; }

std::unique_ptr<Runner> make_runner(const std::string& name, Model m, const std::vector<Weight>& w, const GptConfig& cfg) {
#if TB_PROTEAN
  if (name == "protean_compiled") return std::make_unique<ProteanCompiled>(m, w, cfg);
  if (name == "protean_eager") return std::make_unique<ProteanEager>(m, w, cfg);
  if (name == "protean_eager_f64") return std::make_unique<ProteanEager>(m, w, cfg, pt::DType::F64);
  if (name == "protean_compiled_f64") return std::make_unique<ProteanCompiled>(m, w, cfg, pt::DType::F64);
#endif
#if TB_TORCH
  if (name == "libtorch") return train_bench::make_torch_runner(m, w, cfg, kWeightDecay, false, g_sgd);
  if (name == "libtorch_f64") return train_bench::make_torch_runner(m, w, cfg, kWeightDecay, true, g_sgd);
#endif
  throw std::invalid_argument(fmt::format("unknown runner {}{}", name,
                                          TRAIN_BENCH_ONLY == 1   ? " (this binary links Protean only)"
                                          : TRAIN_BENCH_ONLY == 2 ? " (this binary links libtorch only)"
                                                                  : ""));
}

void set_threads(int n) {
#if TB_PROTEAN
  pt::set_num_threads(n);
#endif
#if TB_TORCH
  train_bench::torch_set_threads(n);
#endif
}

std::string load_avg() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  f >> a >> b >> c;
  return fmt::format("[{:.2f}, {:.2f}, {:.2f}]", a, b, c);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}
std::string json_list(const std::vector<double>& v, int prec = 4) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt::format("{:.{}f}", v[i], prec);
  return s + "]";
}
std::string shell_output(const std::string& cmd) {
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
std::string json_str(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    if (c == '\n') { r += "\\n"; continue; }
    r += c;
  }
  return r + "\"";
}

/// An environment variable as a JSON string, or null when unset.
std::string env_json(const char* name) {
  const char* v = std::getenv(name);
  return v ? json_str(v) : std::string("null");
}

struct Options {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string corpus = "/usr/share/common-licenses/GPL-3";
  std::string out;
  std::vector<Model> models = {Model::Mlp, Model::Cnn, Model::CnnBn, Model::Gpt};
  int curve_steps = 200;
  int rounds = 5;
  int child_steps = 12;
  int round_steps = 20;  // MLP and CNN steps per runner per round
  int gpt_curve_steps = -1;  // -1: curve_steps
  std::vector<int> threads = {1, 2};
  bool skip_children = false;
  bool curve_reference_threads = false;
  bool curve_diffs = false;  // --curve-reference: also print every step's loss difference
};

GptConfig gpt_config(const Data& d) {
  GptConfig c;
  c.vocab = d.corpus.vocab;
  return c;
}

// ---- child processes (fresh process: cold start, peak RSS, compile counts) --------------------------------
// `--child MODEL RUNNER STEPS THREADS`: builds the runner, times construction + first step, runs STEPS
// steps, prints one JSON line.
// A field of /proc/self/status in MiB (VmRSS, VmHWM, RssAnon, RssFile), 0 if absent.
double status_mib(const char* field) {
  std::ifstream st("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(st, line))
    if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::stod(line.substr(n + 1)) / 1024.0;
  return 0;
}

int child_main(const Options& o, const std::string& model, const std::string& runner, int steps, int threads) {
  Data d;
  Model m = model_of(model);
  if (m == Model::Gpt) d.corpus = load_corpus(o.corpus);
  else d.fm = load_fashion_mnist(o.data_dir);
  set_threads(threads);
  GptConfig cfg = gpt_config(d);
  std::vector<Weight> w = init_weights(m, cfg);
  std::vector<Batch> batches;
  batches.reserve(static_cast<size_t>(steps));
  for (int i = 0; i < steps; ++i) batches.push_back(make_batch(m, d, i));
#if TB_PROTEAN
  pt::reset();
#endif
  // Where the resident memory is: after the data (shared by every runner), after the runner is built,
  // after the first step (the compiles), and at the end; anonymous memory (heap) and file pages apart.
  // TRAIN_BENCH_SMAPS=PREFIX: also copies /proc/self/smaps to PREFIX.WHERE at each of those points.
  auto rss_at = [](const char* where) {
    if (const char* pre = std::getenv("TRAIN_BENCH_SMAPS")) {
      std::ifstream in("/proc/self/smaps");
      std::ofstream out(std::string(pre) + "." + where);
      out << in.rdbuf();
    }
    return fmt::format("\"{}\": {{\"rss\": {:.1f}, \"anon\": {:.1f}, \"file\": {:.1f}}}", where, status_mib("VmRSS"),
                       status_mib("RssAnon"), status_mib("RssFile"));
  };
  std::string rss = rss_at("data_loaded");
  auto t0 = Clock::now();
  const double cpu0 = process_and_children_cpu();
  std::unique_ptr<Runner> r = make_runner(runner, m, w, cfg);
  rss += ", " + rss_at("runner_built");
  double first = r->step(batches[0], lr_at(0));
  double first_s = secs_since(t0);
  const double first_cpu_s = process_and_children_cpu() - cpu0;
  rss += ", " + rss_at("first_step");
  double last = first;
  // Steady state: after the first round (every GPT length seen, so every compile done), the CPU time and
  // wall time of each further round of k steps (k = 8 for the GPT: one step at each length).
  const int k = m == Model::Gpt ? 8 : 10;
  std::vector<double> round_cpu_ms, round_steps_per_s;
  double rc0 = 0;
  Clock::time_point rt0;
  for (int i = 1; i < steps; ++i) {
    if (i >= k && i % k == 0) {
      if (i > k) {
        round_cpu_ms.push_back(1e3 * (process_cpu() - rc0) / k);
        round_steps_per_s.push_back(k / secs_since(rt0));
      }
      rc0 = process_cpu();
      rt0 = Clock::now();
    }
    last = r->step(batches[static_cast<size_t>(i)], lr_at(i));
  }
  if (steps >= 2 * k && steps % k == 0) {
    round_cpu_ms.push_back(1e3 * (process_cpu() - rc0) / k);
    round_steps_per_s.push_back(k / secs_since(rt0));
  }
  rss += ", " + rss_at("last_step");
  // VmHWM of this process image: getrusage's ru_maxrss keeps the parent's peak across fork + exec.
  const double hwm_kib = status_mib("VmHWM") * 1024.0;
  int64_t compiles = 0, recompiles = 0, cache_hits = 0;
  std::string phases = "{";
#if TB_PROTEAN
  pt::Stats s = pt::stats();
  compiles = s.compiles;
  recompiles = s.recompiles;
  cache_hits = s.cache_hits;
  for (const auto& [k, v] : s.phase_seconds) phases += fmt::format("{}{}: {:.3f}", phases.size() > 1 ? ", " : "", json_str(k), v);
#endif
  phases += "}";
  // The binary the child ran: which libraries its peak RSS holds pages of.
  const std::string binary = std::filesystem::read_symlink("/proc/self/exe").filename().string();
  fmt::print("CHILD {{\"child_binary\": {}, \"first_step_s\": {:.3f}, \"first_step_cpu_s\": {:.3f}, \"first_loss\": {:.5f}, \"last_loss\": {:.7f}, \"peak_rss_mib\": {:.1f}, "
             "\"compiles\": {}, \"recompiles\": {}, \"cache_hits\": {}, \"phase_seconds\": {}, \"rss_mib\": {{{}}}, "
             "\"steady_rounds\": {}, \"steady_cpu_ms_per_step\": {}, \"steady_steps_per_s\": {}}}\n",
             json_str(binary), first_s, first_cpu_s, first, last, hwm_kib / 1024.0, compiles, recompiles, cache_hits, phases, rss,
             round_cpu_ms.size(), json_list(round_cpu_ms, 2), json_list(round_steps_per_s, 2));
  return 0;
}

#if TRAIN_BENCH_ONLY == 0
// The child binary beside this one that links only `runner`'s library (train_bench_protean_child,
// train_bench_libtorch_child), or this binary when it is not there.
std::string child_binary_for(const std::string& runner) {
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const auto sibling = self.parent_path() / (is_torch_runner(runner) ? "train_bench_libtorch_child" : "train_bench_protean_child");
  return access(sibling.c_str(), X_OK) == 0 ? sibling.string() : self.string();
}

// Runs `binary` (this one when empty) with `args` in a fresh process; returns the JSON of its CHILD line.
std::string run_child(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                      const std::string& binary = "") {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe");
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    std::string exe = binary.empty() ? std::string("/proc/self/exe") : binary;
    argv.push_back(exe.data());
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  auto pos = out.rfind("CHILD ");
  if (pos == std::string::npos) {
    fmt::print(stderr, "child {} failed (status {}):\n{}\n", fmt::join(args, " "), status, out);
    return "null";
  }
  std::string line = out.substr(pos + 6);
  return line.substr(0, line.find('\n'));
}

// `--gpt-compiles STEPS`: trains the GPT for STEPS steps cycling through the 8 sequence lengths with a new
// learning rate on every step; prints the compile counts.
int gpt_compiles_main(const Options& o, int steps) {
  Data d;
  d.corpus = load_corpus(o.corpus);
  GptConfig cfg = gpt_config(d);
  std::vector<Weight> w = init_weights(Model::Gpt, cfg);
  pt::reset();
  auto t0 = Clock::now();
  ProteanCompiled r(Model::Gpt, w, cfg);
  std::vector<double> step_s;
  for (int i = 0; i < steps; ++i) {
    auto t = Clock::now();
    r.step(make_batch(Model::Gpt, d, i), lr_at(i));
    step_s.push_back(secs_since(t));
  }
  pt::Stats s = pt::stats();
  std::string reasons = "{";
  for (const auto& [k, v] : s.recompile_reasons) reasons += (reasons.size() > 1 ? ", " : "") + json_str(k) + ": " + std::to_string(v);
  reasons += "}";
  fmt::print("CHILD {{\"steps\": {}, \"compiles\": {}, \"recompiles\": {}, \"cache_hits\": {}, \"total_s\": {:.2f}, "
             "\"step_s\": {}, \"recompile_reasons\": {}}}\n",
             steps, s.compiles, s.recompiles, s.cache_hits, secs_since(t0), json_list(step_s, 3), reasons);
  return 0;
}

// ---- optimizer step bandwidth ---------------------------------------------------------------------------
// The compiled AdamW update over one flat f32 arena of n elements, as compile_train_step runs it per
// arena: reads param, grad, exp_avg, exp_avg_sq and writes param, exp_avg, exp_avg_sq (7 n floats).
// `donate`: the arenas are donated (written in place, backend/donation.h); otherwise the three results
// are fresh buffers copied back into the arenas, as before donation. memcpy moves 2 n floats.
std::string optimizer_bandwidth(int64_t n, int reps, bool donate) {
  pt::reset();
  Tensor p = pt::randn({n}), g = pt::randn({n}) * 1e-3, m = pt::zeros({n}), v = pt::zeros({n});
  pt::optim::AdamW opt({p}, adamw_options());
  auto upd = pt::compile(
      [&opt](Tensor p, Tensor g, Tensor m, Tensor v, Tensor hyper) {
        auto [np, ns] = opt.update(p, g, {m, v}, hyper, 0);
        return std::make_tuple(np, ns[0], ns[1]);
      },
      {.name = "adamw_update", .backend = "cpu"});
  int64_t copies = 0;
  auto copy = [&copies](const Tensor& dst, const Tensor& src) {
    if (dst.data_ptr() == src.data_ptr()) return;
    std::memcpy(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(dst.int_numel()) * 4);
    ++copies;
  };
  std::vector<double> upd_s, memcpy_s, upd_cpu, memcpy_cpu;
  std::vector<float> a(static_cast<size_t>(n), 1.0f), b(static_cast<size_t>(n));
  for (int r = 0; r < reps + 2; ++r) {
    std::vector<double> h = opt.hyperparameters(0);
    h.push_back(static_cast<double>(r + 1));
    Tensor hyper = pt::tensor<double>(h, {static_cast<int64_t>(h.size())});
    auto t = Clock::now();
    const double c0 = thread_cpu();
    {
      std::vector<const void*> donated;
      if (donate) donated = {p.data_ptr(), m.data_ptr(), v.data_ptr()};
      pt::backend::DonationScope scope(donated);
      auto [np, nm, nv] = upd(p, g, m, v, hyper);
      copy(p, np);
      copy(m, nm);
      copy(v, nv);
    }
    double s = secs_since(t), cs = thread_cpu() - c0;
    t = Clock::now();
    const double c1 = thread_cpu();
    std::memcpy(b.data(), a.data(), a.size() * 4);
    double ms = secs_since(t), cms = thread_cpu() - c1;
    a[static_cast<size_t>(r) % a.size()] += b[0];
    if (r >= 2) {
      upd_s.push_back(s);
      memcpy_s.push_back(ms);
      upd_cpu.push_back(cs);
      memcpy_cpu.push_back(cms);
    }
  }
  const double bytes = static_cast<double>(n) * 4;
  std::vector<double> upd_bw, mc_bw;
  for (double s : upd_s) upd_bw.push_back(7 * bytes / s / 1e9);
  for (double s : memcpy_s) mc_bw.push_back(2 * bytes / s / 1e9);
  const double ratio = median(upd_bw) / median(mc_bw);
  // The same from thread CPU time (1 thread: the kernel runs on this thread).
  const double cpu_ratio = (7 * bytes / median(upd_cpu)) / (2 * bytes / median(memcpy_cpu));
  fmt::print("optimizer ({}): arena {} floats, AdamW update {:.2f} GB/s (median; worst {:.2f}), {:.3f} ms, memcpy {:.2f} GB/s: "
             "{:.0f}% (by thread CPU time {:.0f}%); {} copies back\n",
             donate ? "donated" : "copied back", n, median(upd_bw), *std::min_element(upd_bw.begin(), upd_bw.end()),
             1e3 * median(upd_s), median(mc_bw), 100 * ratio, 100 * cpu_ratio, copies);
  return fmt::format(
      "{{\"donated\": {}, \"arena_elements\": {}, \"arena_mib\": {:.2f}, \"update_gbps_median\": {:.3f}, \"update_gbps_worst\": {:.3f}, "
      "\"update_ms_median\": {:.3f}, \"memcpy_gbps_median\": {:.3f}, \"memcpy_gbps_worst\": {:.3f}, \"ratio_to_memcpy\": {:.3f}, "
      "\"update_cpu_ms_median\": {:.3f}, \"memcpy_cpu_ms_median\": {:.3f}, \"ratio_to_memcpy_by_cpu_time\": {:.3f}, \"copies_back\": {}, \"bytes_counted\": \"update: 4 arena reads + 3 writes; memcpy: 1 read + 1 write\"}}",
      donate ? "true" : "false", n, bytes / (1 << 20), median(upd_bw), *std::min_element(upd_bw.begin(), upd_bw.end()),
      1e3 * median(upd_s), median(mc_bw), *std::min_element(mc_bw.begin(), mc_bw.end()), ratio, 1e3 * median(upd_cpu),
      1e3 * median(memcpy_cpu), cpu_ratio, copies);
}

// ---- the main run ----------------------------------------------------------------------------------------
// `--curve-reference MODEL STEPS`: the loss curve of every runner, one after the other, against libtorch
// in float64 (the reference without float32 rounding) and against libtorch in float32 at 1 and 2 threads
// (how far float32 summation order alone moves a curve), and the compiled step in float64 (the same training
// without float32 rounding: within ~1e-13 of libtorch f64 when the compiled step computes what libtorch
// does). Prints the max abs differences; --out writes them and every curve as JSON.
int curve_reference_main(const Options& o, const std::string& model, int steps) {
  Data d;
  Model m = model_of(model);
  if (m == Model::Gpt) d.corpus = load_corpus(o.corpus);
  else d.fm = load_fashion_mnist(o.data_dir);
  GptConfig cfg = gpt_config(d);
  std::vector<Weight> w = init_weights(m, cfg);
  // The thread count changed nothing at 50 steps (MLP): --curve-reference-threads adds the 2-thread runs.
  std::vector<std::pair<std::string, int>> runs = {{"libtorch_f64", 1}, {"libtorch", 1}, {"protean_eager_f64", 1},
                                                   {"protean_eager", 1}, {"protean_compiled", 1},
                                                   {"protean_compiled_f64", 1}};
  if (o.curve_reference_threads)
    for (const char* r : {"libtorch", "protean_eager", "protean_compiled"}) runs.emplace_back(r, 2);
  std::vector<std::vector<double>> curves;
  std::vector<std::vector<std::vector<double>>> after_first, after_last;
  for (const auto& [rn, th] : runs) {
    set_threads(th);
    pt::reset();
    std::unique_ptr<Runner> r = make_runner(rn, m, w, cfg);
    std::vector<double> c;
    for (int i = 0; i < steps; ++i) {
      c.push_back(r->step(make_batch(m, d, i), lr_at(i) * (g_sgd ? train_bench::kSgdLrScale : 1.0)));
      if (i == 0) after_first.push_back(r->parameters());
    }
    after_last.push_back(r->parameters());
    curves.push_back(c);
  }
  // Parameters after the first and the last step vs libtorch f64: RMS difference per weight, in units of
  // the base learning rate.
  for (auto* ps : {&after_first, &after_last})
    for (size_t i = 1; i < runs.size(); ++i) {
      std::string line;
      for (size_t k = 0; k < w.size(); ++k) {
        double ss = 0;
        for (size_t j = 0; j < (*ps)[i][k].size(); ++j) ss += std::pow((*ps)[i][k][j] - (*ps)[0][k][j], 2);
        line += fmt::format(" {} {:.1e}", w[k].name, std::sqrt(ss / static_cast<double>((*ps)[i][k].size())) / kBaseLr);
      }
      fmt::print("{:>18} {} thread(s), after step {}, rms(p - p_f64) / lr:{}\n", runs[i].first, runs[i].second,
                 ps == &after_first ? 1 : steps, line);
    }
  auto max_first = [&](size_t a, size_t b) {
    double md = 0;
    int first = -1;
    for (size_t i = 0; i < curves[a].size(); ++i) {
      double e = std::abs(curves[a][i] - curves[b][i]);
      if (e > 1e-4 && first < 0) first = static_cast<int>(i);
      md = std::max(md, e);
    }
    return std::pair{md, first};
  };
  auto diff = [&](size_t a, size_t b) {
    auto [md, first] = max_first(a, b);
    return fmt::format("{:.2e} (first step > 1e-4: {})", md, first);
  };
  for (size_t i = 0; i < runs.size(); ++i)
    fmt::print("{:>18} {} thread(s): vs libtorch_f64 {}, vs libtorch f32 1 thread {}\n", runs[i].first, runs[i].second,
               diff(i, 0), diff(i, 1));
  if (!o.out.empty()) {  // --out: the same as JSON, with every curve
    std::string rj;
    for (size_t i = 0; i < runs.size(); ++i) {
      auto [d64, f64] = max_first(i, 0);
      auto [d32, f32] = max_first(i, 1);
      rj += fmt::format("{}\n  {{\"runner\": \"{}\", \"threads\": {}, \"max_abs_diff_vs_libtorch_f64\": {:.3e}, "
                        "\"first_step_over_1e-4_vs_f64\": {}, \"max_abs_diff_vs_libtorch_f32_1thread\": {:.3e}, "
                        "\"first_step_over_1e-4_vs_f32\": {}, \"loss\": {}}}",
                        i ? "," : "", runs[i].first, runs[i].second, d64, f64, d32, f32, json_list(curves[i], 15));
    }
    std::ofstream f(o.out);
    f << fmt::format("{{\"benchmark\": \"train_bench --curve-reference\", \"date\": {}, \"commit\": {}, \"model\": \"{}\", "
                     "\"steps\": {}, \"libtorch\": {}, \"optimizer\": {}, \"runs\": [{}\n]}}\n",
                     json_str(shell_output("date -u +%FT%TZ")), json_str(shell_output("git rev-parse --short HEAD 2>/dev/null")),
                     model, steps, json_str(train_bench::torch_version()),
                     json_str(g_sgd ? fmt::format("SGD(momentum {}, lr {} x the AdamW schedule)", train_bench::kSgdMomentum,
                                                  train_bench::kSgdLrScale)
                                    : "AdamW(lr cosine from 1e-3, betas 0.9/0.999, eps 1e-8, weight_decay 0.01)"),
                     rj);
    fmt::print("wrote {}\n", o.out);
  }
  if (o.curve_diffs)  // per step: each run's loss minus libtorch f64's
    for (size_t i = 1; i < runs.size(); ++i) {
      std::string line;
      for (size_t k = 0; k < curves[i].size(); ++k) line += fmt::format(" {:.1e}", curves[i][k] - curves[0][k]);
      fmt::print("{:>18} {} thread(s), loss - libtorch_f64 per step:{}\n", runs[i].first, runs[i].second, line);
    }
  return 0;
}

// `--grad-compare MODEL`: the loss and every parameter's gradient on batch 0 from the initial weights
// (where every runner starts from the same values, so no earlier rounding is carried in), for libtorch
// f32 and Protean eager f32 and f64 against libtorch f64, at 1 thread, and for the compiled forward +
// backward (protean::compile of value_and_grad over the same loss, cpu backend; not for cnn_bn). Prints per weight
// max |g - g_f64| / max |g_f64|: rounding is ~1e-7..1e-5 there; a formula difference shows as 1e-3 or more.
int grad_compare_main(const Options& o, const std::string& model) {
  Data d;
  Model m = model_of(model);
  if (m == Model::Gpt) d.corpus = load_corpus(o.corpus);
  else d.fm = load_fashion_mnist(o.data_dir);
  GptConfig cfg = gpt_config(d);
  std::vector<Weight> w = init_weights(m, cfg);
  set_threads(1);
  const Batch b = make_batch(m, d, 0);
  std::vector<std::string> names = {"libtorch_f64", "libtorch", "protean_eager_f64", "protean_eager"};
  std::vector<std::vector<std::vector<double>>> grads;
  std::vector<double> losses;
  for (const auto& rn : names) {
    pt::reset();
    std::unique_ptr<Runner> r = make_runner(rn, m, w, cfg);
    losses.push_back(r->step(b, 0.0));
    grads.push_back(r->gradients());
  }
  // compiled forward + backward (not cnn_bn: batch_norm_train updates its running statistics in place,
  // which only compile_train_step's frame does, and that one keeps no gradients)
  if (m != Model::CnnBn) {
    pt::reset();
    auto net = std::make_shared<Net>(m, w, cfg);
    Net* np = net.get();
    // the parameters as arguments (a tensor the trace reads otherwise is a constant of the graph)
    auto loss_of = [np](Tensor x, Tensor y, std::vector<Tensor> ps) {
      std::vector<Tensor> saved;
      for (size_t k = 0; k < ps.size(); ++k) saved.push_back(*np->p[k]), *np->p[k] = ps[k];
      Tensor l = np->loss(x, y);
      for (size_t k = 0; k < ps.size(); ++k) *np->p[k] = saved[k];
      return l;
    };
    auto f = pt::compile(pt::value_and_grad(loss_of, {.wrt = {2}}), {.name = "grad_compare_" + model, .backend = "cpu"});
    auto [x, y] = protean_inputs(m, b);
    auto [loss, gs] = f(x, y, net->params());
    names.push_back("protean_compiled");
    losses.push_back(loss.item<float>());
    std::vector<std::vector<double>> g;
    for (const Tensor& t : gs) {
      Tensor c = pt::cast(t, pt::DType::F64).contiguous();
      const auto* p = static_cast<const double*>(c.data_ptr());
      g.emplace_back(p, p + c.int_numel());
    }
    grads.push_back(g);
  }
  for (size_t i = 1; i < names.size(); ++i) {
    std::string line;
    for (size_t k = 0; k < w.size(); ++k) {
      double md = 0, scale = 0;
      for (size_t j = 0; j < grads[i][k].size(); ++j) {
        md = std::max(md, std::abs(grads[i][k][j] - grads[0][k][j]));
        scale = std::max(scale, std::abs(grads[0][k][j]));
      }
      // a gradient that is zero in exact arithmetic (a conv bias before BatchNorm): the absolute error
      line += scale > 1e-9 ? fmt::format(" {} {:.1e}", w[k].name, md / scale) : fmt::format(" {} (abs) {:.1e}", w[k].name, md);
    }
    fmt::print("{:>18}: loss - f64 {:+.1e}; gradient max|g - g_f64| / max|g_f64|:{}\n", names[i], losses[i] - losses[0], line);
  }
  return 0;
}

// `--grad-track MODEL STEPS`: Protean eager trains; before each of its steps the compiled forward + backward
// (as in --grad-compare) runs on the same parameters and batch. Prints per step the largest
// max |g_compiled - g_eager| / max |g_eager| over the weights and which weight it is.
int grad_track_main(const Options& o, const std::string& model, int steps) {
  Data d;
  Model m = model_of(model);
  if (m == Model::Gpt) d.corpus = load_corpus(o.corpus);
  else d.fm = load_fashion_mnist(o.data_dir);
  GptConfig cfg = gpt_config(d);
  std::vector<Weight> w = init_weights(m, cfg);
  set_threads(1);
  pt::reset();
  auto eager = std::make_unique<ProteanEager>(m, w, cfg);
  auto net = std::make_shared<Net>(m, w, cfg);
  Net* np = net.get();
  auto loss_of = [np](Tensor x, Tensor y, std::vector<Tensor> ps) {
    std::vector<Tensor> saved;
    for (size_t k = 0; k < ps.size(); ++k) saved.push_back(*np->p[k]), *np->p[k] = ps[k];
    Tensor l = np->loss(x, y);
    for (size_t k = 0; k < ps.size(); ++k) *np->p[k] = saved[k];
    return l;
  };
  auto f = pt::compile(pt::value_and_grad(loss_of, {.wrt = {2}}), {.name = "grad_track_" + model, .backend = "cpu"});
  for (int i = 0; i < steps; ++i) {
    const Batch b = make_batch(m, d, i);
    std::vector<Tensor> ps;
    for (const auto& v : eager->parameters()) {
      std::vector<float> fv(v.begin(), v.end());
      ps.push_back(pt::tensor<float>(fv, {static_cast<int64_t>(fv.size())}));
    }
    for (size_t k = 0; k < ps.size(); ++k) ps[k] = pt::reshape(ps[k], pt::to_symint_vec(w[k].shape)).contiguous();
    auto [x, y] = protean_inputs(m, b);
    auto [loss, gs] = f(x, y, ps);
    eager->step(b, lr_at(i));
    std::vector<std::vector<double>> ge = eager->gradients();
    double worst = 0;
    std::string where;
    for (size_t k = 0; k < gs.size(); ++k) {
      Tensor c = pt::cast(gs[k], pt::DType::F64).contiguous();
      const auto* p = static_cast<const double*>(c.data_ptr());
      double md = 0, scale = 0;
      for (size_t j = 0; j < ge[k].size(); ++j) md = std::max(md, std::abs(p[j] - ge[k][j])), scale = std::max(scale, std::abs(ge[k][j]));
      const double r = scale > 1e-9 ? md / scale : md;
      if (r > worst) worst = r, where = w[k].name;
    }
    fmt::print("step {:3d}: compiled vs eager gradient, worst max|dg| / max|g| {:.1e} ({})\n", i + 1, worst, where);
  }
  return 0;
}

int main_run(const Options& o) {
  Data d;
  d.fm = load_fashion_mnist(o.data_dir);
  d.corpus = load_corpus(o.corpus);
  std::vector<std::string> sections;
  const std::string commit = shell_output("git rev-parse --short HEAD 2>/dev/null");
  // The VM's model name is only "AMD EPYC": family and model tell Zen 4 (25) from Zen 5 (26), which
  // moves these figures (the machine changed between runs of one day).
  const std::string cpu = shell_output("lscpu | sed -n 's/^Model name: *//p'") + " (family " +
                          shell_output("lscpu | sed -n 's/^CPU family: *//p'") + ", model " +
                          shell_output("lscpu | sed -n 's/^Model: *//p'") + ")";
  fmt::print("train_bench: commit {}, {} ({} cores), libtorch {}, load {}\n", commit, cpu, sysconf(_SC_NPROCESSORS_ONLN),
             train_bench::torch_version(), load_avg());
  std::string models_json;
  for (Model m : o.models) {
    const std::string mn = model_name(m);
    GptConfig cfg = gpt_config(d);
    std::vector<Weight> w = init_weights(m, cfg);
    int64_t nparams = 0;
    for (const auto& x : w) nparams += static_cast<int64_t>(x.data.size());
    fmt::print("== {} ({} parameters)\n", mn, nparams);
    // 1. Loss curves from the same weights and batches (2 threads); this also warms every runner up.
    set_threads(o.threads.back());
    pt::reset();
    const int curve_steps = m == Model::Gpt && o.gpt_curve_steps >= 0 ? o.gpt_curve_steps : o.curve_steps;
    std::map<std::string, std::unique_ptr<Runner>> runners;
    std::map<std::string, std::vector<double>> curve;
    for (const auto& rn : kRunners) runners[rn] = make_runner(rn, m, w, cfg);
    for (int i = 0; i < curve_steps; ++i) {
      Batch b = make_batch(m, d, i);
      for (const auto& rn : kRunners) curve[rn].push_back(runners[rn]->step(b, lr_at(i)));
    }
    pt::Stats st = pt::stats();
    auto max_diff = [&](const std::string& a) {
      double md = 0;
      for (size_t i = 0; i < curve[a].size(); ++i) md = std::max(md, std::abs(curve[a][i] - curve["libtorch"][i]));
      return md;
    };
    fmt::print("loss curve ({} steps): first {:.4f}, last compiled {:.4f} / eager {:.4f} / libtorch {:.4f}; max |diff| vs "
               "libtorch: compiled {:.2e}, eager {:.2e}; compiles {}, recompiles {}\n",
               curve_steps, curve["libtorch"].front(), curve["protean_compiled"].back(), curve["protean_eager"].back(),
               curve["libtorch"].back(), max_diff("protean_compiled"), max_diff("protean_eager"), st.compiles, st.recompiles);
    std::string curve_json = fmt::format(
        "{{\"steps\": {}, \"max_abs_diff_compiled_vs_libtorch\": {:.3e}, \"max_abs_diff_eager_vs_libtorch\": {:.3e}, "
        "\"compiles\": {}, \"recompiles\": {}, \"cache_hits\": {}, \"libtorch\": {}, \"protean_compiled\": {}, \"protean_eager\": {}}}",
        curve_steps, max_diff("protean_compiled"), max_diff("protean_eager"), st.compiles, st.recompiles, st.cache_hits,
        json_list(curve["libtorch"], 5), json_list(curve["protean_compiled"], 5), json_list(curve["protean_eager"], 5));
    // 2. Throughput: alternating rounds, the runner order rotating each round.
    const int k = m == Model::Gpt ? 8 : o.round_steps;  // GPT: one round = one step at each of the 8 lengths
    std::string tp_json;
    int64_t next = curve_steps;
    for (int th : o.threads) {
      set_threads(th);
      std::map<std::string, std::vector<double>> sps, cpu_ms;  // steps/s (wall), CPU ms per step
      const std::string load_before = load_avg();
      for (int r = 0; r < o.rounds; ++r) {
        std::vector<Batch> bs;
        for (int i = 0; i < k; ++i) bs.push_back(make_batch(m, d, next + i));
        for (size_t j = 0; j < kRunners.size(); ++j) {
          const std::string& rn = kRunners[(j + static_cast<size_t>(r)) % kRunners.size()];
          auto t = Clock::now();
          const double c0 = process_cpu();
          for (int i = 0; i < k; ++i) runners[rn]->step(bs[static_cast<size_t>(i)], lr_at(next + i));
          sps[rn].push_back(k / secs_since(t));
          cpu_ms[rn].push_back(1e3 * (process_cpu() - c0) / k);
        }
        next += k;
      }
      const double tm = median(sps["libtorch"]);
      fmt::print("{} thread(s): steps/s median (worst) compiled {:.2f} ({:.2f}), eager {:.2f} ({:.2f}), libtorch {:.2f} ({:.2f}); "
                 "compiled/libtorch {:.2f}x; CPU ms/step compiled {:.1f}, eager {:.1f}, libtorch {:.1f}; load {}\n",
                 th, median(sps["protean_compiled"]), *std::min_element(sps["protean_compiled"].begin(), sps["protean_compiled"].end()),
                 median(sps["protean_eager"]), *std::min_element(sps["protean_eager"].begin(), sps["protean_eager"].end()), tm,
                 *std::min_element(sps["libtorch"].begin(), sps["libtorch"].end()), median(sps["protean_compiled"]) / tm,
                 median(cpu_ms["protean_compiled"]), median(cpu_ms["protean_eager"]), median(cpu_ms["libtorch"]), load_avg());
      std::string runs;
      for (const auto& rn : kRunners)
        runs += fmt::format("{}\"{}\": {{\"median\": {:.3f}, \"worst\": {:.3f}, \"rounds\": {}, \"cpu_ms_per_step_median\": {:.2f}}}",
                            runs.empty() ? "" : ", ", rn, median(sps[rn]), *std::min_element(sps[rn].begin(), sps[rn].end()),
                            json_list(sps[rn], 3), median(cpu_ms[rn]));
      tp_json += fmt::format("{}\"{}\": {{\"steps_per_round\": {}, \"load_before\": {}, \"load_after\": {}, {}, "
                             "\"compiled_over_libtorch\": {:.3f}, \"eager_over_libtorch\": {:.3f}}}",
                             tp_json.empty() ? "" : ", ", th, k, load_before, load_avg(), runs,
                             median(sps["protean_compiled"]) / tm, median(sps["protean_eager"]) / tm);
    }
    runners.clear();
    // 3. Cold first step and peak RSS: each runner alone in a fresh process, empty kernel cache.
    std::string child_json;
    if (!o.skip_children) {
      for (const auto& rn : kRunners) {
        std::string dir = fmt::format("/tmp/train_bench_cache_{}_{}_{}", getpid(), mn, rn);
        std::filesystem::remove_all(dir);
        std::string r = run_child({"--corpus", o.corpus, "--data", o.data_dir, "--child", mn, rn, std::to_string(o.child_steps),
                                   std::to_string(o.threads.back())},
                                  {{"PROTEAN_CACHE_DIR", dir}}, child_binary_for(rn));
        std::filesystem::remove_all(dir);
        fmt::print("fresh process, {}: {}\n", rn, r);
        child_json += fmt::format("{}\"{}\": {}", child_json.empty() ? "" : ", ", rn, r);
      }
    }
    models_json += fmt::format("{}\"{}\": {{\"parameters\": {}, \"loss_curve\": {}, \"steps_per_s\": {{{}}}, \"fresh_process\": {{{}}}}}",
                               models_json.empty() ? "" : ", ", mn, nparams, curve_json, tp_json, child_json);
  }
  // 4. GPT compile counts over the 8 lengths: a first run (no profile) and a second run with PGO.
  std::string compiles_json = "null";
  if (!o.skip_children && std::find(o.models.begin(), o.models.end(), Model::Gpt) != o.models.end()) {
    std::string dir = fmt::format("/tmp/train_bench_pgo_{}", getpid());
    std::filesystem::remove_all(dir);
    std::map<std::string, std::string> env = {{"PROTEAN_CACHE_DIR", dir}, {"PROTEAN_JOB_ID", "train_bench_gpt"}};
    std::vector<std::string> args = {"--corpus", o.corpus, "--gpt-compiles", "16"};
    std::string first = run_child(args, env);
    std::string second = run_child(args, env);
    std::filesystem::remove_all(dir);
    fmt::print("GPT over 8 lengths, 16 steps, lr changing every step: first run {}\nsecond run (PGO profile) {}\n", first, second);
    compiles_json = fmt::format("{{\"lengths\": [32, 64, 96, 128, 160, 192, 224, 256], \"first_run\": {}, \"with_pgo\": {}}}", first, second);
  }
  // 5. Optimizer step bandwidth over the MLP's parameter arena (the largest of the three).
  set_threads(1);
  const int64_t mlp_arena = 784 * 1024 + 1024 + 1024 * 1024 + 1024 + 10 * 1024 + 10;
  std::string opt_json = fmt::format("{{\"copied_back\": {}, \"donated\": {}}}", optimizer_bandwidth(mlp_arena, 30, false),
                                     optimizer_bandwidth(mlp_arena, 30, true));
  const std::string json = fmt::format(
      "{{\n\"benchmark\": \"train_bench\", \"date\": {}, \"commit\": {}, \"machine\": {}, \"cores\": {}, \"libtorch\": {},\n"
      "\"note\": \"one process, runners in alternating rounds (order rotated each round); machine shared with other jobs\",\n"
      "\"data\": {{\"fashion_mnist\": {}, \"corpus\": {}, \"corpus_chars\": {}, \"vocab\": {}}},\n"
      "\"optimizer\": \"AdamW(lr cosine from 1e-3, changing every step; betas 0.9/0.999; eps 1e-8; weight_decay 0.01)\",\n"
      "\"batch\": {{\"mlp\": 128, \"cnn\": 64, \"gpt\": \"8 x T, T cycling 32..256\"}},\n"
      "\"environment\": {{\"OMP_WAIT_POLICY\": {}, \"PROTEAN_CACHE_DIR\": {}, \"libtorch_openblas_threads_limited\": {}}},\n"
      "\"load_at_end\": {},\n\"models\": {{{}}},\n\"gpt_compiles\": {},\n\"optimizer_step\": {}\n}}\n",
      json_str(shell_output("date -u +%FT%TZ")), json_str(commit), json_str(cpu), sysconf(_SC_NPROCESSORS_ONLN),
      json_str(train_bench::torch_version()), json_str(o.data_dir), json_str(o.corpus), d.corpus.ids.size(), d.corpus.vocab,
      env_json("OMP_WAIT_POLICY"), env_json("PROTEAN_CACHE_DIR"), train_bench::torch_blas_threads() >= 0 ? "true" : "false",
      load_avg(), models_json, compiles_json, opt_json);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << json;
    fmt::print("wrote {}\n", o.out);
  } else {
    fmt::print("{}", json);
  }
  return 0;
}

#endif  // TRAIN_BENCH_ONLY == 0

}  // namespace

int main(int argc, char** argv) {
  try {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines as they come
    Options o;
    std::vector<std::string> a(argv + 1, argv + argc);
    for (size_t i = 0; i < a.size(); ++i) {
      auto next = [&]() -> std::string {
        if (i + 1 >= a.size()) throw std::invalid_argument(a[i] + " needs a value");
        return a[++i];
      };
      if (a[i] == "--data") o.data_dir = next();
      else if (a[i] == "--corpus") o.corpus = next();
      else if (a[i] == "--child") {
        std::string model = next(), runner = next();
        int steps = std::stoi(next()), threads = std::stoi(next());
        return child_main(o, model, runner, steps, threads);
      }
#if TRAIN_BENCH_ONLY != 0
      else throw std::invalid_argument("unknown option " + a[i] + " (a child binary of train_bench: --data DIR --corpus FILE "
                                       "--child MODEL RUNNER STEPS THREADS)");
    }
    throw std::invalid_argument("a child binary of train_bench runs --child MODEL RUNNER STEPS THREADS");
#else
      else if (a[i] == "--out") o.out = next();
      else if (a[i] == "--curve-steps") o.curve_steps = std::stoi(next());
      else if (a[i] == "--rounds") o.rounds = std::stoi(next());
      else if (a[i] == "--child-steps") o.child_steps = std::stoi(next());
      else if (a[i] == "--round-steps") o.round_steps = std::stoi(next());
      else if (a[i] == "--gpt-curve-steps") o.gpt_curve_steps = std::stoi(next());
      else if (a[i] == "--no-children") o.skip_children = true;
      else if (a[i] == "--curve-reference-threads") o.curve_reference_threads = true;
      else if (a[i] == "--curve-diffs") o.curve_diffs = true;
      else if (a[i] == "--threads") {
        o.threads.clear();
        std::stringstream ss(next());
        std::string t;
        while (std::getline(ss, t, ',')) o.threads.push_back(std::stoi(t));
      } else if (a[i] == "--models") {
        o.models.clear();
        std::stringstream ss(next());
        std::string t;
        while (std::getline(ss, t, ',')) o.models.push_back(model_of(t));
      } else if (a[i] == "--curve-sgd") {
        g_sgd = true;
      } else if (a[i] == "--curve-reference") {
        std::string model = next();
        return curve_reference_main(o, model, std::stoi(next()));
      } else if (a[i] == "--grad-track") {
        std::string model = next();
        return grad_track_main(o, model, std::stoi(next()));
      } else if (a[i] == "--grad-compare") {
        return grad_compare_main(o, next());
      } else if (a[i] == "--gpt-compiles") {
        return gpt_compiles_main(o, std::stoi(next()));
      } else if (a[i] == "--optimizer") {
        set_threads(1);
        const int64_t n = std::stoll(next());
        fmt::print("{}\n{}\n", optimizer_bandwidth(n, 30, false), optimizer_bandwidth(n, 30, true));
        return 0;
      } else {
        throw std::invalid_argument("unknown option " + a[i] +
                                    " (--data DIR --corpus FILE --out JSON --curve-steps N --rounds N --threads 1,2 "
                                    "--models mlp,cnn,gpt --child-steps N --no-children --optimizer N --curve-reference MODEL N "
                                    "--curve-reference-threads --curve-sgd --curve-diffs --grad-compare MODEL --grad-track MODEL N)");
      }
    }
    if (o.curve_steps < 1 || o.rounds < 1)
      throw std::invalid_argument(fmt::format("--curve-steps and --rounds need at least 1 (got {} and {}): the loss "
                                              "curve's first steps also warm every runner up",
                                              o.curve_steps, o.rounds));
    return main_run(o);
#endif
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_bench: {}\n", e.what());
    return 1;
  }
}
