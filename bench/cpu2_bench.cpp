// Protean's cpu backend, its interpreter and libtorch eager (Debian's libtorch-dev, optional) on the
// same programs, in one process, alternating rounds:
//
//  * host:      y = x + 1 on f32[16] (the host time of a call: guards, dispatch, allocation);
//  * softmax:   softmax(x, -1), x f32[R, 4096];
//  * ln_gelu:   gelu(layer_norm(x, [4096], w, b)), x f32[R, 4096];
//  * mlp:       linear 784→1024, relu, linear 1024→1024, relu, linear 1024→10; the batch cycles
//               through 1, 7, 32, 64, 100, 128 (one artifact for every batch: dynamic sizes);
//  * attention: a causal self-attention block at batch 1, model width 256, 4 heads of 64: y = x +
//               proj(sdpa(split_heads(qkv(layer_norm(x))), causal)), for L = 16, 37, 64, 128, 200, 256.
//
// The mlp case also runs `onednn` (bench/cpu2_onednn_mlp.h, built where oneDNN is, which is always for
// Protean): the same products written straight against oneDNN and split as Protean's GEMM team
// splits them (by rows from 8 rows a thread, else by columns) over a pinned spin team, the ceiling of
// Protean's own split, whose thread scaling is printed beside the others'.
//
// Method: each (case, size) runs its implementations in a rotating order inside each round;
// a sample is the mean time of `reps` back-to-back calls, reps chosen per implementation from its
// warm-up time so that a sample takes about 5 ms (at most the case's cap: 2000 calls for host, 40
// for the small MLP and attention sizes, 4-10 for the large ones). Figures are medians over the rounds, with the worst sample, and ratios against
// libtorch eager computed from the medians. Every thread count runs in the same process: Protean's
// kernels (OpenMP, oneDNN through protean::set_num_threads) and libtorch (at::set_num_threads, and the
// OpenBLAS pool its GEMMs run in: openblas_set_num_threads) get the same count. Each round runs every thread
// count in turn, and the thread-scaling lines give each row's speedup over the first count both as a ratio
// of medians and as the median of the per-round ratios. OPENBLAS_THREAD_TIMEOUT is set (if unset) so OpenBLAS's workers stop spinning between
// calls and do not hold the other core while the next implementation runs.
//
// Build: a target of the main build (bench/*_bench.cpp); with Debian's libtorch-dev installed CMake
// defines PROTEAN_BENCH_LIBTORCH and links it, otherwise the libtorch columns are absent.
// Run (docs/cpu.md):
//   ./build/cpu2_bench --rounds 15 --threads 1,2 --out bench/results/cpu2_<date>.json
//       [--cases host,softmax,ln_gelu,mlp,attention] [--lengths 16,37,...] [--batches 1,7,...] [--rows 1024]
//       [--machine "..."] [--commit $(git rev-parse --short HEAD)] [--impls cpu,interp,libtorch,onednn]
//   --impls times only those implementations (the correctness checks still run all of them): the
//   others' thread pools (libtorch's OpenMP and OpenBLAS teams) then do not share the CPUs with it.
#include <dlfcn.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "protean/protean.h"

#ifdef PROTEAN_BENCH_LIBTORCH
#include <torch/torch.h>
#endif
#ifdef PROTEAN_BENCH_ONEDNN
#include "cpu2_onednn_mlp.h"
#endif

namespace {

namespace pt = protean;
using Clock = std::chrono::steady_clock;

// ---- the programs (Protean side) ----------------------------------------------------------------
pt::Tensor host_fn(const pt::Tensor& x) { return x + 1.0; }
pt::Tensor softmax_fn(const pt::Tensor& x) { return pt::softmax(x, -1); }
pt::Tensor ln_gelu_fn(const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
  return pt::gelu(pt::layer_norm(x, {4096}, w, b, 1e-5));
}
pt::Tensor mlp_fn(const pt::Tensor& x, const pt::Tensor& w1, const pt::Tensor& b1, const pt::Tensor& w2,
                  const pt::Tensor& b2, const pt::Tensor& w3, const pt::Tensor& b3) {
  pt::Tensor h = pt::relu(pt::linear(x, w1, b1));
  h = pt::relu(pt::linear(h, w2, b2));
  return pt::linear(h, w3, b3);
}
constexpr int64_t kWidth = 256, kHeads = 4, kHeadDim = 64;
/// x f32[1, L, 256]; ln_w, ln_b [256]; wqkv [768, 256], bqkv [768]; wo [256, 256], bo [256].
pt::Tensor attention_fn(const pt::Tensor& x, const pt::Tensor& ln_w, const pt::Tensor& ln_b, const pt::Tensor& wqkv,
                        const pt::Tensor& bqkv, const pt::Tensor& wo, const pt::Tensor& bo) {
  pt::SymInt L = x.size(1);
  pt::Tensor h = pt::layer_norm(x, {kWidth}, ln_w, ln_b, 1e-5);
  pt::Tensor qkv = pt::linear(h, wqkv, bqkv);  // [1, L, 768]
  auto heads = [&](int64_t part) {
    return pt::narrow(qkv, 2, part * kWidth, kWidth).reshape({1, L, kHeads, kHeadDim}).transpose(1, 2);
  };
  pt::Tensor a = pt::scaled_dot_product_attention(heads(0), heads(1), heads(2), {}, true);  // [1, 4, L, 64]
  a = a.transpose(1, 2).reshape({1, L, kWidth});
  return x + pt::linear(a, wo, bo);
}

#ifdef PROTEAN_BENCH_LIBTORCH
torch::Tensor to_torch(const pt::Tensor& t) {
  pt::Tensor c = t.contiguous();
  std::vector<int64_t> s;
  for (int64_t d : c.int_sizes()) s.push_back(d);
  return torch::from_blob(c.data_ptr(), s, torch::kFloat32).clone();
}
torch::Tensor torch_attention(const std::vector<torch::Tensor>& a) {
  const torch::Tensor& x = a[0];
  int64_t L = x.size(1);
  torch::Tensor h = torch::layer_norm(x, {kWidth}, a[1], a[2], 1e-5);
  torch::Tensor qkv = torch::linear(h, a[3], a[4]);
  auto heads = [&](int64_t part) {
    return qkv.narrow(2, part * kWidth, kWidth).reshape({1, L, kHeads, kHeadDim}).transpose(1, 2);
  };
  // libtorch 1.13's scaled_dot_product_attention is not public in the C++ API: the eager composite
  // it runs (matmul, scale, causal mask, softmax, matmul).
  torch::Tensor q = heads(0), k = heads(1), v = heads(2);
  torch::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(kHeadDim)));
  torch::Tensor mask = torch::ones({L, L}, torch::kBool).triu(1);
  s = s.masked_fill(mask, -std::numeric_limits<float>::infinity());
  torch::Tensor o = torch::matmul(torch::softmax(s, -1), v);
  o = o.transpose(1, 2).reshape({1, L, kWidth});
  return x + torch::linear(o, a[5], a[6]);
}
#endif

// ---- measurement ----------------------------------------------------------------------------------
struct Impl {
  std::string name;             ///< "cpu" | "interp" | "libtorch"
  std::function<void()> call;   ///< one call of the program on this size's inputs
  int reps = 1;                 ///< calls per sample
  std::vector<double> samples;  ///< seconds per call, one per round
  std::vector<double> cpu;      ///< process CPU seconds per call, one per round
};
struct Row {
  std::string kase;
  std::string size;  ///< "rows=1024", "batch=7", "L=37"
  int threads = 1;
  int reps = 1;
  std::vector<Impl> impls;
};

/// CPU time of the whole process (all threads), in seconds. On a shared machine a 1-thread
/// comparison of CPU time per call is steadier than one of wall time (waiting for a core is not
/// counted); on 2 threads it also counts spinning workers.
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) r.push_back(std::stoi(item));
  return r;
}
std::set<std::string> parse_set(const std::string& s) {
  std::set<std::string> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) r.insert(item);
  return r;
}

/// OpenBLAS's pool (Debian's libtorch runs its GEMMs there; at::set_num_threads does not reach it), -1
/// when the process has no OpenBLAS: set through its entry point found at run time.
int set_openblas_threads(int t) {
  using Set = void (*)(int);
  using Get = int (*)();
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!set || !get) return -1;
  set(t);
  return get();
}

void set_threads(int t) {
  pt::set_num_threads(t);
  omp_set_num_threads(t);
#ifdef PROTEAN_BENCH_LIBTORCH
  at::set_num_threads(t);
  // libtorch 1.13's set_num_threads also resizes its pthreadpool (the one QNNPACK uses), which makes
  // a new pool whose workers spin before they sleep on a futex (pthreadpool: up to 10^6 pause
  // iterations). On a 2-vCPU VM those spinners took a CPU from whatever ran next: the 2-thread rows
  // right after the switch were up to 2.6x slower. Wait them out before anything is timed.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
#endif
  set_openblas_threads(t);
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

/// The same random inputs for every implementation.
struct Inputs {
  std::vector<pt::Tensor> p;
#ifdef PROTEAN_BENCH_LIBTORCH
  std::vector<torch::Tensor> t;
#endif
  explicit Inputs(std::vector<pt::Tensor> v) : p(std::move(v)) {
#ifdef PROTEAN_BENCH_LIBTORCH
    for (const auto& x : p) t.push_back(to_torch(x));
#endif
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  std::vector<int> thread_counts{1, 2};
  std::string out = "bench/results/cpu2.json", machine, commit;
  std::set<std::string> cases{"host", "softmax", "ln_gelu", "mlp", "attention"};
  // the implementations timed (all by default): timing one alone keeps the others' thread pools out
  std::set<std::string> impls{"cpu", "interp", "libtorch", "onednn"};
  std::vector<int> attn_lengths{16, 37, 64, 128, 200, 256};
  std::vector<int> mlp_batches{1, 7, 32, 64, 100, 128};
  int64_t rows_4096 = 1024;  // rows of the softmax and LayerNorm+GELU cases (x f32[rows, 4096])
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--threads") thread_counts = parse_ints(next());
    else if (a == "--out") out = next();
    else if (a == "--machine") machine = next();
    else if (a == "--commit") commit = next();
    else if (a == "--cases") cases = parse_set(next());
    else if (a == "--lengths") attn_lengths = parse_ints(next());
    else if (a == "--batches") mlp_batches = parse_ints(next());
    else if (a == "--rows") rows_4096 = std::stoll(next());
    else if (a == "--impls") impls = parse_set(next());
    else {
      fmt::print(stderr, "unknown argument {}\n", a);
      return 2;
    }
  }
  setenv("OPENBLAS_THREAD_TIMEOUT", "1", 0);
  const std::string load_before = load_average();

  auto opts = [](const char* name, const char* backend, std::vector<std::string> args) {
    pt::CompileOptions o;
    o.name = name;
    o.backend = backend;
    o.arg_names = std::move(args);
    // automatic dynamic: static on the first call, the changing dims symbolic from the second size on
    // (the warm-up runs every size), so one artifact serves every batch / length of a case
    o.dynamic = pt::Dynamic::Auto;
    return o;
  };
  const char* backends[] = {"cpu", "interp"};

  // Compiled functions, one per (program, backend); kept alive for the whole run.
  std::map<std::string, pt::CompiledFunction<pt::Tensor(const pt::Tensor&)>> f1;
  std::map<std::string, pt::CompiledFunction<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)>> f3;
  using F7 = pt::CompiledFunction<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&, const pt::Tensor&,
                                             const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)>;
  std::map<std::string, F7> f7;
  for (const char* be : backends) {
    f1.emplace(fmt::format("host/{}", be), pt::compile(host_fn, opts("host", be, {"x"})));
    f1.emplace(fmt::format("softmax/{}", be), pt::compile(softmax_fn, opts("softmax", be, {"x"})));
    f3.emplace(fmt::format("ln_gelu/{}", be), pt::compile(ln_gelu_fn, opts("ln_gelu", be, {"x", "w", "b"})));
    f7.emplace(fmt::format("mlp/{}", be), pt::compile(mlp_fn, opts("mlp", be, {"x", "w1", "b1", "w2", "b2", "w3", "b3"})));
    f7.emplace(fmt::format("attention/{}", be),
               pt::compile(attention_fn, opts("attention", be, {"x", "ln_w", "ln_b", "wqkv", "bqkv", "wo", "bo"})));
  }

  std::vector<Row> rows;
  struct Spec {
    std::string kase, size;
    int reps;
    std::shared_ptr<Inputs> in;
  };
  std::vector<Spec> specs;
  if (cases.count("host")) specs.push_back({"host", "n=16", 2000, std::make_shared<Inputs>(std::vector<pt::Tensor>{pt::randn({16})})});
  if (cases.count("softmax"))
    specs.push_back({"softmax", fmt::format("rows={}", rows_4096), 4,
                     std::make_shared<Inputs>(std::vector<pt::Tensor>{pt::randn({rows_4096, 4096})})});
  if (cases.count("ln_gelu"))
    specs.push_back({"ln_gelu", fmt::format("rows={}", rows_4096), 4,
                     std::make_shared<Inputs>(std::vector<pt::Tensor>{pt::randn({rows_4096, 4096}), pt::randn({4096}), pt::randn({4096})})});
  if (cases.count("mlp")) {
    pt::Tensor w1 = pt::randn({1024, 784}) * 0.03, b1 = pt::randn({1024}) * 0.1, w2 = pt::randn({1024, 1024}) * 0.03,
               b2 = pt::randn({1024}) * 0.1, w3 = pt::randn({10, 1024}) * 0.03, b3 = pt::randn({10}) * 0.1;
    for (int64_t b : mlp_batches)
      specs.push_back({"mlp", fmt::format("batch={}", b), b <= 7 ? 40 : 8,
                       std::make_shared<Inputs>(std::vector<pt::Tensor>{pt::randn({b, 784}), w1, b1, w2, b2, w3, b3})});
  }
  if (cases.count("attention")) {
    pt::Tensor lw = pt::randn({kWidth}) * 0.1 + 1.0, lb = pt::randn({kWidth}) * 0.1, wqkv = pt::randn({3 * kWidth, kWidth}) * 0.06,
               bqkv = pt::randn({3 * kWidth}) * 0.1, wo = pt::randn({kWidth, kWidth}) * 0.06, bo = pt::randn({kWidth}) * 0.1;
    for (int64_t L : attn_lengths)
      specs.push_back({"attention", fmt::format("L={}", L), L <= 64 ? 40 : 10,
                       std::make_shared<Inputs>(std::vector<pt::Tensor>{pt::randn({1, L, kWidth}), lw, lb, wqkv, bqkv, wo, bo})});
  }

  // Implementations of a spec; also checks that cpu and interp agree with libtorch (or each other).
  auto protean_call = [&](const Spec& s, const std::string& be) -> std::function<pt::Tensor()> {
    const auto& p = s.in->p;
    std::string key = s.kase + "/" + be;
    if (f1.count(key)) { auto* f = &f1.at(key); return [f, &p] { return (*f)(p[0]); }; }
    if (f3.count(key)) { auto* f = &f3.at(key); return [f, &p] { return (*f)(p[0], p[1], p[2]); }; }
    auto* f = &f7.at(key);
    return [f, &p] { return (*f)(p[0], p[1], p[2], p[3], p[4], p[5], p[6]); };
  };
#ifdef PROTEAN_BENCH_LIBTORCH
  auto torch_call = [](const Spec& s) -> std::function<torch::Tensor()> {
    const auto& t = s.in->t;
    if (s.kase == "host") return [&t] { return t[0] + 1.0; };
    if (s.kase == "softmax") return [&t] { return torch::softmax(t[0], -1); };
    if (s.kase == "ln_gelu") return [&t] { return torch::gelu(torch::layer_norm(t[0], {4096}, t[1], t[2], 1e-5)); };
    if (s.kase == "mlp")
      return [&t] {
        torch::Tensor h = torch::relu(torch::linear(t[0], t[1], t[2]));
        h = torch::relu(torch::linear(h, t[3], t[4]));
        return torch::linear(h, t[5], t[6]);
      };
    return [&t] { return torch_attention(t); };
  };
  torch::NoGradGuard no_grad;
#endif

#ifdef PROTEAN_BENCH_ONEDNN
  // The MLP straight on oneDNN (cpu2_onednn_mlp.h), on the weights of the mlp specs.
  std::unique_ptr<cpu2_bench::OnednnMlp> onednn_mlp;
  for (const Spec& s : specs)
    if (s.kase == "mlp" && !onednn_mlp) {
      const auto& p = s.in->p;
      onednn_mlp = std::make_unique<cpu2_bench::OnednnMlp>(p[1].data_ptr<float>(), p[2].data_ptr<float>(), p[3].data_ptr<float>(),
                                                           p[4].data_ptr<float>(), p[5].data_ptr<float>(), p[6].data_ptr<float>());
    }
#endif
  std::vector<std::string> mismatches;
  for (const Spec& s : specs) {
    pt::Tensor ref = protean_call(s, "interp")();
    pt::Tensor got = protean_call(s, "cpu")();
    double d = pt::max_abs_diff(got, ref);
    if (!(d <= 1e-3)) mismatches.push_back(fmt::format("{} {}: cpu vs interp max |diff| {}", s.kase, s.size, d));
#ifdef PROTEAN_BENCH_ONEDNN
    if (s.kase == "mlp")
      for (int t : {1, 2}) {
        const int64_t batch = s.in->p[0].int_sizes()[0];
        pt::Tensor y = pt::empty({batch, 10});
        onednn_mlp->run(s.in->p[0].data_ptr<float>(), batch, t, y.data_ptr<float>());
        double dd = pt::max_abs_diff(y, ref);
        if (!(dd <= 1e-3)) mismatches.push_back(fmt::format("{} {}: onednn ({} threads) vs interp max |diff| {}", s.kase, s.size, t, dd));
      }
#endif
#ifdef PROTEAN_BENCH_LIBTORCH
    torch::Tensor tt = torch_call(s)().contiguous();
    double dt = pt::max_abs_diff(got, pt::from_blob(tt.data_ptr(), tt.sizes().vec(), pt::DType::F32));
    if (!(dt <= 1e-3)) mismatches.push_back(fmt::format("{} {}: cpu vs libtorch max |diff| {}", s.kase, s.size, dt));
#endif
  }
  for (const auto& m : mismatches) fmt::print(stderr, "MISMATCH {}\n", m);

  // Rows for every thread count, each warmed up under its own count (compiles, oneDNN primitives keyed
  // by the count, the thread pools' first start).
  for (int t : thread_counts) {
    set_threads(t);
    for (const Spec& s : specs) {
      Row r;
      r.kase = s.kase;
      r.size = s.size;
      r.threads = t;
      r.reps = s.reps;
      for (const char* be : backends) {
        auto c = protean_call(s, be);
        r.impls.push_back({be, [c] { (void)c(); }, 1, {}});
      }
#ifdef PROTEAN_BENCH_LIBTORCH
      auto tc = torch_call(s);
      r.impls.push_back({"libtorch", [tc] { (void)tc(); }, 1, {}});
#endif
#ifdef PROTEAN_BENCH_ONEDNN
      if (s.kase == "mlp" && t <= 2) {
        const auto& p = s.in->p;
        const int64_t batch = p[0].int_sizes()[0];
        auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(batch * 10));
        r.impls.push_back({"onednn", [&p, batch, t, y, m = onednn_mlp.get()] { m->run(p[0].data_ptr<float>(), batch, t, y->data()); }, 1, {}});
      }
#endif
      std::erase_if(r.impls, [&](const Impl& im) { return !impls.count(im.name); });
      rows.push_back(std::move(r));
    }
    const size_t first = rows.size() - specs.size();
    for (size_t i = first; i < rows.size(); ++i)  // warm-up: compiles, first-run setup, caches
      for (auto& im : rows[i].impls) {
        for (int k = 0; k < 2; ++k) im.call();
        auto t0 = Clock::now();
        im.call();
        const double one = std::chrono::duration<double>(Clock::now() - t0).count();
        im.reps = std::clamp(static_cast<int>(5e-3 / std::max(one, 1e-7)), 1, rows[i].reps);
      }
  }
  // Rounds outermost, thread counts inside a round: a 1-thread and a 2-thread sample of a row are
  // seconds apart, so the scaling ratio does not also measure the machine's drift over the run.
  for (int round = 0; round < rounds; ++round) {
    for (int t : thread_counts) {
      set_threads(t);
      for (Row& r : rows) {
        if (r.threads != t) continue;
        const size_t n = r.impls.size();
        for (size_t j = 0; j < n; ++j) {
          Impl& im = r.impls[(j + static_cast<size_t>(round)) % n];  // rotate who goes first
          im.call();  // untimed: the other implementation's data out of the way
          const double c0 = process_cpu_seconds();
          auto t0 = Clock::now();
          for (int k = 0; k < im.reps; ++k) im.call();
          im.samples.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / im.reps);
          im.cpu.push_back((process_cpu_seconds() - c0) / im.reps);
        }
      }
    }
  }
  const std::string load_after = load_average();

  // Thread scaling: a row at more threads against the same case and size at the first thread count.
  // Besides the ratio of the medians, the median of the per-round ratios (both samples of a round are
  // taken seconds apart, so a slow minute of the machine moves both).
  auto base_row = [&](const Row& r) -> const Row* {
    if (r.threads == thread_counts.front()) return nullptr;
    for (const Row& b : rows)
      if (b.threads == thread_counts.front() && b.kase == r.kase && b.size == r.size) return &b;
    return nullptr;
  };
  auto impl_of = [](const Row& r, const std::string& name) -> const Impl& {
    for (const auto& im : r.impls)
      if (im.name == name) return im;
    throw std::logic_error("no implementation " + name);
  };
  auto paired_speedup = [](const std::vector<double>& base, const std::vector<double>& more) {
    std::vector<double> q;
    for (size_t k = 0; k < std::min(base.size(), more.size()); ++k) q.push_back(base[k] / more[k]);
    return median(q);
  };

  // Report.
  std::string json = "{\n  \"context\": {\n";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  json += fmt::format("    \"machine\": \"{}\",\n    \"host\": \"{}\",\n    \"cores\": {},\n", machine, host, omp_get_num_procs());
  json += fmt::format("    \"commit\": \"{}\",\n    \"rounds\": {},\n", commit, rounds);
  json += fmt::format("    \"load_average_before\": \"{}\",\n    \"load_average_after\": \"{}\",\n", load_before, load_after);
#ifdef PROTEAN_BENCH_LIBTORCH
  json += fmt::format("    \"libtorch\": \"{}\",\n", TORCH_VERSION);
#else
  json += "    \"libtorch\": null,\n";
#endif
  json += fmt::format("    \"OPENBLAS_THREAD_TIMEOUT\": \"{}\",\n", std::getenv("OPENBLAS_THREAD_TIMEOUT"));
  json += "    \"method\": \"alternating rounds (rotating order; every thread count inside each round); sample = mean of reps back-to-back calls (about 5 ms); median and worst (max) over rounds; *_cpu_time_median_us: process CPU time per call (getrusage), steadier than wall time on a shared machine for 1 thread\",\n";
  json += "    \"mismatches\": [";
  for (size_t i = 0; i < mismatches.size(); ++i) json += fmt::format("{}\"{}\"", i ? ", " : "", mismatches[i]);
  json += "]\n  },\n  \"rows\": [\n";
  fmt::print("{:<10} {:<10} {:>2} | {:>11} {:>11} {:>11} | {:>7} {:>7} {:>7} | CPU time: {:>7} {:>7}\n", "case", "size", "t",
             "cpu us", "interp us", "torch us", "cpu/t", "interp/t", "cpu/int", "cpu/t", "cpu/int");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::map<std::string, double> med, worst, cpu_med;
    for (const auto& im : r.impls) {
      med[im.name] = median(im.samples);
      cpu_med[im.name] = median(im.cpu);
      worst[im.name] = im.samples.empty() ? 0 : *std::max_element(im.samples.begin(), im.samples.end());
    }
    json += fmt::format("    {{\"case\": \"{}\", \"size\": \"{}\", \"threads\": {}", r.kase, r.size, r.threads);
    for (const auto& im : r.impls)
      json += fmt::format(", \"{}_median_us\": {:.3f}, \"{}_worst_us\": {:.3f}, \"{}_cpu_time_median_us\": {:.3f}, \"{}_reps\": {}",
                          im.name, med[im.name] * 1e6, im.name, worst[im.name] * 1e6, im.name, cpu_med[im.name] * 1e6,
                          im.name, im.reps);
    // --impls may leave any runner out: a ratio is written only when both of its runners ran (before,
    // med["interp"] read here made a missing interp look present, and its ratio was written as inf)
    const bool has_cpu = med.count("cpu") > 0, has_interp = med.count("interp") > 0;
    double torch_med = med.count("libtorch") ? med["libtorch"] : 0;
    if (torch_med > 0 && has_cpu) json += fmt::format(", \"cpu_vs_libtorch\": {:.3f}", med["cpu"] / torch_med);
    if (torch_med > 0 && has_interp) json += fmt::format(", \"interp_vs_libtorch\": {:.3f}", med["interp"] / torch_med);
    if (has_cpu && cpu_med.count("libtorch") && cpu_med["libtorch"] > 0)
      json += fmt::format(", \"cpu_vs_libtorch_cpu_time\": {:.3f}", cpu_med["cpu"] / cpu_med["libtorch"]);
    const bool both = has_cpu && has_interp;
    if (both) {
      json += fmt::format(", \"cpu_vs_interp_cpu_time\": {:.3f}", cpu_med["cpu"] / std::max(cpu_med["interp"], 1e-12));
      json += fmt::format(", \"cpu_vs_interp\": {:.3f}", med["cpu"] / med["interp"]);
    }
    if (const Row* b = base_row(r))
      for (const auto& im : r.impls) {
        const auto& bs = impl_of(*b, im.name).samples;
        json += fmt::format(", \"{}_speedup_vs_{}_threads\": {:.3f}, \"{}_speedup_paired_median\": {:.3f}", im.name, b->threads,
                            median(bs) / med[im.name], im.name, paired_speedup(bs, im.samples));
      }
    json += fmt::format("}}{}\n", i + 1 < rows.size() ? "," : "");
    const double torch_cpu = cpu_med.count("libtorch") ? cpu_med["libtorch"] : 0;
    fmt::print("{:<10} {:<10} {:>2} | {:>11.1f} {:>11.1f} {:>11.1f} | {:>7.3f} {:>7.3f} {:>7.3f} |           {:>7.3f} {:>7.3f}\n",
               r.kase, r.size, r.threads, med["cpu"] * 1e6, med["interp"] * 1e6, torch_med * 1e6,
               torch_med > 0 ? med["cpu"] / torch_med : 0, torch_med > 0 ? med["interp"] / torch_med : 0,
               both ? med["cpu"] / med["interp"] : 0, torch_cpu > 0 ? cpu_med["cpu"] / torch_cpu : 0,
               both ? cpu_med["cpu"] / std::max(cpu_med["interp"], 1e-12) : 0);
  }
  json += "  ]\n}\n";
  bool header = false;
  for (const Row& r : rows) {
    const Row* b = base_row(r);
    if (!b) continue;
    if (!header) {
      fmt::print("\nthread scaling, {} -> n threads: ratio of medians (median of per-round ratios)\n", b->threads);
      header = true;
    }
    fmt::print("{:<10} {:<10} {:>2} |", r.kase, r.size, r.threads);
    for (const auto& im : r.impls) {
      const auto& bs = impl_of(*b, im.name).samples;
      fmt::print("  {} {:.2f}x ({:.2f}x)", im.name, median(bs) / median(im.samples), paired_speedup(bs, im.samples));
    }
    fmt::print("\n");
  }
  std::ofstream(out) << json;
  fmt::print("wrote {} (load average before {}, after {})\n", out, load_before, load_after);
  return mismatches.empty() ? 0 : 1;
}
