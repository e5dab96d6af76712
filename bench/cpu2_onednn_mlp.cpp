// cpu2_onednn_mlp.h: the MLP straight on oneDNN, row or column slices over a pinned spin team.
#include "cpu2_onednn_mlp.h"

#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <map>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <dnnl.hpp>

namespace cpu2_bench {

namespace {

using dt = dnnl::memory::data_type;
using Clock = std::chrono::steady_clock;

/// One product's slice, rows [r0, r0 + M) and columns [c0, c0 + n) of an output with `ldc` columns
/// (the input row stride is K): a one-thread primitive, its packed weights, its bias and its own
/// scratchpad. oneDNN 2.6's library scratchpad is one buffer shared by every primitive, so two slices
/// running at once must each bring theirs (a row split's brgemm slices crashed without).
struct Slice {
  dnnl::matmul prim;
  dnnl::memory::desc src, dst;
  dnnl::memory weights, bias, scratch;
  int64_t r0 = 0, c0 = 0, K = 0, ldc = 0;
};

/// w: the product's weight [N, K] row-major (a Linear's), so B = wᵀ is [K, N] with strides (1, K).
/// `share`: a slice over the same columns whose packed weights and bias this one reads when its
/// primitive wants the same layout (row slices of one product).
Slice make_slice(dnnl::engine& eng, int64_t M, int64_t K, int64_t ldc, int64_t r0, int64_t c0, int64_t n, const float* w,
                 const float* b, bool relu, const Slice* share = nullptr) {
  dnnl::memory::desc src({M, K}, dt::f32, dnnl::memory::dims{K, 1});
  dnnl::memory::desc plain({K, n}, dt::f32, dnnl::memory::dims{1, K});
  dnnl::memory::desc any({K, n}, dt::f32, dnnl::memory::format_tag::any);
  dnnl::memory::desc dst({M, n}, dt::f32, dnnl::memory::dims{ldc, 1});
  dnnl::memory::desc bias({1, n}, dt::f32, dnnl::memory::dims{n, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (relu) {
    dnnl::post_ops po;
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, any, bias, dst), attr, eng);
  const bool shared = share && share->weights.get_desc() == pd.weights_desc();
  Slice s{dnnl::matmul(pd), src, dst, shared ? share->weights : dnnl::memory(pd.weights_desc(), eng),
          shared ? share->bias : dnnl::memory(bias, eng), dnnl::memory(pd.scratchpad_desc(), eng), r0, c0, K, ldc};
  if (shared) return s;
  dnnl::stream strm(eng);
  dnnl::memory from(plain, eng, const_cast<float*>(w + c0 * K));
  dnnl::reorder(from, s.weights).execute(strm, from, s.weights);
  strm.wait();
  std::copy(b + c0, b + c0 + n, static_cast<float*>(s.bias.get_data_handle()));
  return s;
}

void run_slice(dnnl::engine& eng, dnnl::stream& strm, const Slice& s, const float* a, float* c) {
  s.prim.execute(strm, {{DNNL_ARG_SRC, dnnl::memory(s.src, eng, const_cast<float*>(a + s.r0 * s.K))},
                        {DNNL_ARG_WEIGHTS, s.weights},
                        {DNNL_ARG_BIAS, s.bias},
                        {DNNL_ARG_SCRATCHPAD, s.scratch},
                        {DNNL_ARG_DST, dnnl::memory(s.dst, eng, c + s.r0 * s.ldc + s.c0)}});
  strm.wait();
}

void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  sched_setaffinity(0, sizeof one, &one);
}

}  // namespace

struct OnednnMlp::Impl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  std::vector<float> w[3], b[3];
  // (batch, threads) -> per layer, its slices (slice 0 on the caller, slice 1 on the worker)
  std::map<std::pair<int64_t, int>, std::vector<std::vector<Slice>>> plans;
  std::vector<float> h1, h2;

  // the team: one worker, posted work through `gen`, done through `pending`
  std::thread worker;
  std::atomic<uint32_t> gen{0}, sleeping{0};
  std::atomic<int> pending{0};
  std::atomic<bool> stop{false};
  const Slice* job = nullptr;
  const float* job_a = nullptr;
  float* job_c = nullptr;
  int cpus[2] = {-1, -1};

  void loop() {
    omp_set_num_threads(1);
    dnnl::stream strm(eng);
    uint32_t seen = 0;
    int pinned = -1;
    for (;;) {
      uint32_t g = gen.load(std::memory_order_acquire);
      const auto until = Clock::now() + std::chrono::microseconds(100);
      for (int k = 1; g == seen; ++k, g = gen.load(std::memory_order_acquire)) {
        _mm_pause();
        if ((k & 63) == 0 && Clock::now() >= until) {
          sleeping.store(1, std::memory_order_seq_cst);
          if (gen.load(std::memory_order_seq_cst) == seen) gen.wait(seen, std::memory_order_acquire);
          sleeping.store(0, std::memory_order_relaxed);
        }
      }
      seen = g;
      if (stop.load(std::memory_order_acquire)) return;
      if (cpus[1] != pinned && cpus[1] >= 0) pin_to(pinned = cpus[1]);
      run_slice(eng, strm, *job, job_a, job_c);
      pending.store(0, std::memory_order_release);
    }
  }

  void post(const Slice& s, const float* a, float* c) {
    job = &s;
    job_a = a;
    job_c = c;
    pending.store(1, std::memory_order_relaxed);
    gen.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst)) gen.notify_one();
  }
  void join() {
    while (pending.load(std::memory_order_acquire) != 0) _mm_pause();
  }
};

OnednnMlp::OnednnMlp(const float* w1, const float* b1, const float* w2, const float* b2, const float* w3,
                     const float* b3)
    : impl_(std::make_unique<Impl>()) {
  impl_->w[0].assign(w1, w1 + 1024 * 784);
  impl_->w[1].assign(w2, w2 + 1024 * 1024);
  impl_->w[2].assign(w3, w3 + 10 * 1024);
  impl_->b[0].assign(b1, b1 + 1024);
  impl_->b[1].assign(b2, b2 + 1024);
  impl_->b[2].assign(b3, b3 + 10);
}

OnednnMlp::~OnednnMlp() {
  if (impl_->worker.joinable()) {
    impl_->stop.store(true, std::memory_order_release);
    impl_->gen.fetch_add(1, std::memory_order_seq_cst);
    impl_->gen.notify_one();
    impl_->worker.join();
  }
}

void OnednnMlp::run(const float* x, int64_t batch, int threads, float* y) {
  if (threads < 1 || threads > 2) throw std::invalid_argument("OnednnMlp: 1 or 2 threads");
  Impl& m = *impl_;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);  // one-thread primitives
  auto key = std::make_pair(batch, threads);
  auto it = m.plans.find(key);
  if (it == m.plans.end()) {
    const int64_t K[3] = {784, 1024, 1024}, N[3] = {1024, 1024, 10};
    // by rows from 8 rows a thread, as Protean's GEMM team (ops::kGemmTeamMinRows), else by columns
    const bool by_rows = batch >= 8 * threads;
    std::vector<std::vector<Slice>> layers(3);
    for (int l = 0; l < 3; ++l) {
      const int parts = l < 2 ? threads : 1;
      auto& slices = layers[static_cast<size_t>(l)];
      slices.reserve(static_cast<size_t>(parts));
      for (int p = 0; p < parts; ++p) {
        if (by_rows) {
          const int64_t rows = batch / parts, r0 = p * rows;
          slices.push_back(make_slice(m.eng, p + 1 == parts ? batch - r0 : rows, K[l], N[l], r0, 0, N[l], m.w[l].data(),
                                      m.b[l].data(), l < 2, p ? &slices[0] : nullptr));
        } else {
          const int64_t width = N[l] / parts;
          slices.push_back(make_slice(m.eng, batch, K[l], N[l], 0, p * width, p + 1 == parts ? N[l] - p * width : width,
                                      m.w[l].data(), m.b[l].data(), l < 2));
        }
      }
    }
    it = m.plans.emplace(key, std::move(layers)).first;
  }
  if (m.h1.size() < static_cast<size_t>(batch * 1024)) {
    m.h1.resize(static_cast<size_t>(batch * 1024));
    m.h2.resize(static_cast<size_t>(batch * 1024));
  }
  static thread_local dnnl::stream strm(m.eng);
  cpu_set_t mine;
  if (threads == 2) {
    if (!m.worker.joinable()) m.worker = std::thread([&m] { m.loop(); });
    // the caller and the worker on distinct CPUs (the VMs' schedulers pack woken threads onto one)
    CPU_ZERO(&mine);
    sched_getaffinity(0, sizeof mine, &mine);
    const int here = sched_getcpu();
    int other = -1;
    for (int c = 0; c < CPU_SETSIZE && other < 0; ++c)
      if (c != here && CPU_ISSET(c, &mine)) other = c;
    m.cpus[0] = here;
    m.cpus[1] = other;
    pin_to(here);
  }
  const auto& layers = it->second;
  const float* in[3] = {x, m.h1.data(), m.h2.data()};
  float* out[3] = {m.h1.data(), m.h2.data(), y};
  for (int l = 0; l < 3; ++l) {
    const auto& slices = layers[static_cast<size_t>(l)];
    if (slices.size() == 2) m.post(slices[1], in[l], out[l]);
    run_slice(m.eng, strm, slices[0], in[l], out[l]);
    if (slices.size() == 2) m.join();
  }
  if (threads == 2) sched_setaffinity(0, sizeof mine, &mine);
  omp_set_num_threads(before);
}

}  // namespace cpu2_bench
