// The compiled MLP of cpu2_bench against the same products straight on oneDNN (bench/cpu2_onednn_mlp.h),
// call for call in one process without libtorch: how far the compiled call is from the split's ceiling
// at 1 and 2 threads, and so how much of the 2-thread shortfall is the call's own work.
//
//   OMP_WAIT_POLICY=passive OPENBLAS_THREAD_TIMEOUT=4 ./build/cpu2_mlp_gap [--batch 100] [--threads 1,2]
//       [--rounds 5] [--calls 200] [--machine "..."] [--commit $(git rev-parse --short HEAD)] [--out FILE.json]
//
// Per thread count (each its own block of rounds, the thread count set once before it): after warm-up,
// `rounds` rounds, each `calls` calls of cpu and `calls` of onednn as two blocks in turn (the first
// block alternating between rounds), each call timed alone (steady clock around it). A round's
// figure is its median; printed and written are the median and the worst of the round medians per
// implementation, their difference (`gap_us`) and, with two thread counts, each implementation's
// speed-up from the first count to the second (ratio of medians). OMP_WAIT_POLICY=passive turns
// Protean's GEMM team on, as in cpu2_bench's runs; OPENBLAS_THREAD_TIMEOUT=4 keeps OpenBLAS's pool
// threads (started when the thread count is first set) from spinning with sched_yield for ~0.1 s on
// the CPUs the two teams use.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cpu2_onednn_mlp.h"
#include "protean/protean.h"

namespace {

namespace pt = protean;
using Clock = std::chrono::steady_clock;

pt::Tensor mlp_fn(const pt::Tensor& x, const pt::Tensor& w1, const pt::Tensor& b1, const pt::Tensor& w2,
                  const pt::Tensor& b2, const pt::Tensor& w3, const pt::Tensor& b3) {
  pt::Tensor h = pt::relu(pt::linear(x, w1, b1));
  h = pt::relu(pt::linear(h, w2, b2));
  return pt::linear(h, w3, b3);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<int> parse_ints(const std::string& s) {
  std::vector<int> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) r.push_back(std::atoi(item.c_str()));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 100;
  std::vector<int> thread_counts{1, 2};
  int rounds = 5, calls = 200;
  std::string out, machine, commit;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cpu2_mlp_gap: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--batch") batch = std::atoll(next().c_str());
    else if (a == "--threads") thread_counts = parse_ints(next());
    else if (a == "--rounds") rounds = std::max(1, std::atoi(next().c_str()));
    else if (a == "--calls") calls = std::max(1, std::atoi(next().c_str()));
    else if (a == "--out") out = next();
    else if (a == "--machine") machine = next();
    else if (a == "--commit") commit = next();
    else {
      std::fprintf(stderr, "cpu2_mlp_gap: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (batch < 1 || thread_counts.empty() ||
      std::any_of(thread_counts.begin(), thread_counts.end(), [](int t) { return t < 1 || t > 2; })) {
    std::fprintf(stderr, "cpu2_mlp_gap: --batch >= 1 and --threads from 1 and 2 (the oneDNN split takes 1 or 2)\n");
    return 2;
  }
  pt::manual_seed(3);
  pt::Tensor w1 = pt::randn({1024, 784}) * 0.03, b1 = pt::randn({1024}) * 0.1, w2 = pt::randn({1024, 1024}) * 0.03,
             b2 = pt::randn({1024}) * 0.1, w3 = pt::randn({10, 1024}) * 0.03, b3 = pt::randn({10}) * 0.1;
  pt::Tensor x = pt::randn({batch, 784}), x7 = pt::randn({7, 784});
  pt::CompileOptions o;
  o.name = "mlp";
  o.backend = "cpu";
  o.dynamic = pt::Dynamic::Auto;  // as cpu2_bench: one artifact for every batch
  o.arg_names = {"x", "w1", "b1", "w2", "b2", "w3", "b3"};
  auto f = pt::compile(mlp_fn, o);
  cpu2_bench::OnednnMlp dn(w1.data_ptr<float>(), b1.data_ptr<float>(), w2.data_ptr<float>(), b2.data_ptr<float>(),
                           w3.data_ptr<float>(), b3.data_ptr<float>());
  std::vector<float> y(static_cast<size_t>(batch) * 10);
  f(x7, w1, b1, w2, b2, w3, b3);  // the second batch size makes the batch dimension dynamic
  std::string rows;
  std::vector<double> cpu_med, dnn_med;
  for (int t : thread_counts) {
    pt::set_num_threads(t);
    omp_set_num_threads(t);
    for (int k = 0; k < 10; ++k) {
      f(x, w1, b1, w2, b2, w3, b3);
      dn.run(x.data_ptr<float>(), batch, t, y.data());
    }
    const float diff =
        pt::amax(pt::abs(f(x, w1, b1, w2, b2, w3, b3) - pt::from_blob(y.data(), {batch, 10}, pt::DType::F32).clone())).item<float>();
    std::vector<double> rc, rd;  // round medians
    for (int r = 0; r < rounds; ++r) {
      // One block of each, in turn (odd rounds onednn first): a worker of either team spins for up to
      // 100 us after its last slice, so calls alternating one by one would start each call while the
      // other implementation's worker still spins on one of the CPUs.
      std::vector<double> a, b;
      auto block = [&](bool protean_side) {
        for (int i = 0; i < calls; ++i) {
          const auto t0 = Clock::now();
          if (protean_side) f(x, w1, b1, w2, b2, w3, b3);
          else dn.run(x.data_ptr<float>(), batch, t, y.data());
          (protean_side ? a : b).push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        }
      };
      block(r % 2 == 0);
      block(r % 2 != 0);
      rc.push_back(median(a));
      rd.push_back(median(b));
    }
    const double mc = median(rc), md = median(rd);
    const double wc = *std::max_element(rc.begin(), rc.end()), wd = *std::max_element(rd.begin(), rd.end());
    cpu_med.push_back(mc);
    dnn_med.push_back(md);
    fmt::print("batch {} threads {}: cpu {:.1f} us (worst round {:.1f}), onednn {:.1f} us (worst {:.1f}), gap {:.1f} us, "
               "max |cpu - onednn| {:.2g}\n", batch, t, mc, wc, md, wd, mc - md, diff);
    rows += fmt::format("{}{{\"threads\": {}, \"cpu_median_us\": {:.1f}, \"cpu_worst_round_us\": {:.1f}, "
                        "\"onednn_median_us\": {:.1f}, \"onednn_worst_round_us\": {:.1f}, \"gap_us\": {:.1f}, "
                        "\"max_abs_diff\": {:.3g}}}",
                        rows.empty() ? "" : ",\n  ", t, mc, wc, md, wd, mc - md, diff);
  }
  std::string scaling;
  if (thread_counts.size() == 2) {
    scaling = fmt::format(", \"scaling\": {{\"cpu\": {:.3f}, \"onednn\": {:.3f}}}", cpu_med[0] / cpu_med[1], dnn_med[0] / dnn_med[1]);
    fmt::print("{} -> {} threads: cpu {:.2f}x, onednn {:.2f}x\n", thread_counts[0], thread_counts[1], cpu_med[0] / cpu_med[1],
               dnn_med[0] / dnn_med[1]);
  }
  if (!out.empty()) {
    std::ofstream os(out);
    os << fmt::format("{{\"context\": {{\"machine\": \"{}\", \"commit\": \"{}\", \"batch\": {}, \"rounds\": {}, \"calls\": {}}},\n"
                      " \"rows\": [\n  {}]{}}}\n",
                      machine, commit, batch, rounds, calls, rows, scaling);
    fmt::print("wrote {}\n", out);
  }
  return 0;
}
