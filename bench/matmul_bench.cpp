// Thread scaling, packed weights and the small-M path of Protean's matmul (linear) on the CPU.
//
// For each shape y[M, N] = x[M, K]·w[N, K]ᵀ + b and each thread count, two implementations in
// alternating rounds (rotating order):
//  * eager:  protean::linear, the eager kernel (oneDNN reads the weights in their plain layout and
//            copies them into its blocked layout inside every call);
//  * cpu:    the same linear compiled by the cpu backend (backend "cpu", batch dynamic): the weights
//            are packed once into oneDNN's blocked layout and reused, and M ≤ 8 takes the small-M
//            kernel (docs/cpu.md "Matmul and linear").
// A sample is the mean of `reps` back-to-back calls (about 20 ms per sample). Besides wall time it
// records the process's CPU time per call (getrusage), so `cpu_per_wall` says how many threads did
// work: ~1.0 on one thread, ~2.0 when both threads of a 2-thread run computed on an idle machine
// (on a loaded one the share the scheduler gives), and `threads_worked` counts the process's threads
// whose CPU time (/proc/self/task/*/schedstat) during the sample reached a quarter of the busiest
// one's: 2 means both threads computed, whatever the load. The JSON gives
// medians and worst samples, GFLOP/s, and per shape the speed-up of the last thread count over the
// first (t1 / tN).
//
// One command for the quiet-machine measurement (both cores idle; see docs/cpu.md):
//   OMP_WAIT_POLICY=passive ./build/matmul_bench --threads 1,2 --rounds 15 \
//       --out bench/results/matmul_<date>.json --commit $(git rev-parse --short HEAD)
// Options: --shapes M:K:N,... (default 1:1024:1024,8:1024:1024,32:784:1024,64:1024:1024,
// 128:1024:1024,512:1024:1024,1024:1024:1024), --impls eager,cpu, --machine "...".
// Exit status 1 when the compiled result differs from eager by more than 1e-3 (relative to max |y|).
#include <dirent.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "protean/protean.h"

namespace {

namespace pt = protean;
using Clock = std::chrono::steady_clock;

pt::Tensor linear_fn(const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) { return pt::linear(x, w, b); }

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

/// CPU time (ns) of each thread of this process, from /proc/self/task/<tid>/schedstat.
std::map<long, double> thread_cpu_ns() {
  std::map<long, double> r;
  DIR* d = opendir("/proc/self/task");
  if (!d) return r;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(fmt::format("/proc/self/task/{}/schedstat", e->d_name));
    double ns = 0;
    if (f >> ns) r[std::stol(e->d_name)] = ns;
  }
  closedir(d);
  return r;
}

/// Threads that ran for at least a quarter of the busiest thread's CPU time between two snapshots.
int threads_that_worked(const std::map<long, double>& before, const std::map<long, double>& after) {
  std::vector<double> d;
  for (const auto& [tid, ns] : after) {
    auto it = before.find(tid);
    d.push_back(ns - (it == before.end() ? 0.0 : it->second));
  }
  const double top = d.empty() ? 0 : *std::max_element(d.begin(), d.end());
  return static_cast<int>(std::count_if(d.begin(), d.end(), [&](double x) { return top > 0 && x >= 0.25 * top; }));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> r;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) r.push_back(item);
  return r;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

struct Shape {
  int64_t M, K, N;
};

struct Impl {
  std::string name;
  std::function<pt::Tensor()> call;
  int reps = 1;
  std::vector<double> wall, cpu;  // seconds per call, one per round
  std::vector<double> workers;    // threads that worked, one per round
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 15;
  std::vector<int> threads{1, 2};
  std::vector<Shape> shapes{{1, 1024, 1024}, {8, 1024, 1024},    {32, 784, 1024},    {64, 1024, 1024},
                            {128, 1024, 1024}, {512, 1024, 1024}, {1024, 1024, 1024}};
  std::set<std::string> impls{"eager", "cpu"};
  std::string out = "bench/results/matmul.json", machine, commit;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--rounds") rounds = std::stoi(next());
    else if (a == "--threads") {
      threads.clear();
      for (const auto& t : split(next(), ',')) threads.push_back(std::stoi(t));
    } else if (a == "--shapes") {
      shapes.clear();
      for (const auto& s : split(next(), ',')) {
        auto p = split(s, ':');
        if (p.size() != 3) throw std::runtime_error("--shapes wants M:K:N,...");
        shapes.push_back({std::stoll(p[0]), std::stoll(p[1]), std::stoll(p[2])});
      }
    } else if (a == "--impls") {
      impls.clear();
      for (const auto& s : split(next(), ',')) impls.insert(s);
    } else if (a == "--out") out = next();
    else if (a == "--machine") machine = next();
    else if (a == "--commit") commit = next();
    else {
      fmt::print(stderr, "unknown argument {}\n", a);
      return 2;
    }
  }
  const std::string load_before = load_average();
  pt::manual_seed(7);

  pt::CompileOptions o;
  o.name = "linear";
  o.backend = "cpu";
  o.arg_names = {"x", "w", "b"};
  auto compiled = pt::compile(linear_fn, o);

  struct Row {
    Shape s;
    int threads;
    std::vector<Impl> impls;
  };
  std::vector<Row> rows;
  std::vector<std::string> mismatches;
  std::map<std::pair<int64_t, int64_t>, std::pair<pt::Tensor, pt::Tensor>> weights;  // (K, N) → (w, b)
  std::vector<pt::Tensor> xs;
  for (const Shape& s : shapes) {
    auto& wb = weights[{s.K, s.N}];
    if (!wb.first.defined()) wb = {pt::randn({s.N, s.K}) * (1.0 / std::sqrt(double(s.K))), pt::randn({s.N}) * 0.1};
    xs.push_back(pt::randn({s.M, s.K}));
  }
  // Warm the compiled function over every M first (the batch becomes dynamic: one artifact for all).
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& wb = weights[{shapes[i].K, shapes[i].N}];
    pt::Tensor ref = pt::linear(xs[i], wb.first, wb.second);
    for (int k = 0; k < 3; ++k) {
      pt::Tensor got = compiled(xs[i], wb.first, wb.second);
      double scale = std::max(1.0, pt::max_abs_diff(ref, pt::zeros(ref.int_sizes())));
      double d = pt::max_abs_diff(got, ref);
      if (!(d <= 1e-3 * scale))
        mismatches.push_back(fmt::format("M={} K={} N={} call {}: cpu vs eager max |diff| {}", shapes[i].M, shapes[i].K,
                                         shapes[i].N, k, d));
    }
  }
  for (const auto& m : mismatches) fmt::print(stderr, "MISMATCH {}\n", m);

  for (int t : threads) {
    pt::set_num_threads(t);
    omp_set_num_threads(t);
    const size_t first = rows.size();
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& wb = weights[{shapes[i].K, shapes[i].N}];
      const pt::Tensor x = xs[i], w = wb.first, b = wb.second;
      Row r{shapes[i], t, {}};
      if (impls.count("eager")) r.impls.push_back({"eager", [x, w, b] { return pt::linear(x, w, b); }, 1, {}, {}});
      if (impls.count("cpu")) r.impls.push_back({"cpu", [&compiled, x, w, b] { return compiled(x, w, b); }, 1, {}, {}});
      rows.push_back(std::move(r));
    }
    for (size_t i = first; i < rows.size(); ++i)
      for (auto& im : rows[i].impls) {
        for (int k = 0; k < 2; ++k) (void)im.call();
        auto t0 = Clock::now();
        (void)im.call();
        double one = std::chrono::duration<double>(Clock::now() - t0).count();
        im.reps = std::clamp(static_cast<int>(20e-3 / std::max(one, 1e-7)), 1, 2000);
      }
    for (int round = 0; round < rounds; ++round)
      for (size_t i = first; i < rows.size(); ++i) {
        Row& r = rows[i];
        const size_t n = r.impls.size();
        for (size_t j = 0; j < n; ++j) {
          Impl& im = r.impls[(j + static_cast<size_t>(round)) % n];
          (void)im.call();
          const auto tc0 = thread_cpu_ns();
          const double c0 = process_cpu_seconds();
          auto t0 = Clock::now();
          for (int k = 0; k < im.reps; ++k) (void)im.call();
          im.wall.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / im.reps);
          im.cpu.push_back((process_cpu_seconds() - c0) / im.reps);
          im.workers.push_back(threads_that_worked(tc0, thread_cpu_ns()));
        }
      }
  }
  const std::string load_after = load_average();

  std::string json = "{\n  \"context\": {\n";
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  json += fmt::format("    \"machine\": \"{}\",\n    \"host\": \"{}\",\n    \"cores\": {},\n", machine, host, omp_get_num_procs());
  json += fmt::format("    \"commit\": \"{}\",\n    \"rounds\": {},\n", commit, rounds);
  json += fmt::format("    \"load_average_before\": \"{}\",\n    \"load_average_after\": \"{}\",\n", load_before, load_after);
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  json += fmt::format("    \"OMP_WAIT_POLICY\": \"{}\",\n", wait ? wait : "");
  json += "    \"method\": \"alternating rounds (rotating order); sample = mean of reps back-to-back calls (~20 ms); "
          "cpu_per_wall = process CPU time / wall time (threads that worked)\",\n";
  json += "    \"mismatches\": [";
  for (size_t i = 0; i < mismatches.size(); ++i) json += fmt::format("{}\"{}\"", i ? ", " : "", mismatches[i]);
  json += "]\n  },\n  \"rows\": [\n";
  fmt::print("{:>5} {:>5} {:>5} {:>2} | {:>6} {:>10} {:>10} {:>7} {:>8} {:>7}\n", "M", "K", "N", "t", "impl", "median us",
             "worst us", "GFLOP/s", "cpu/wall", "workers");
  std::map<std::tuple<int64_t, int64_t, int64_t, std::string>, std::map<int, double>> by_threads;
  std::vector<std::string> lines;
  for (const Row& r : rows)
    for (const Impl& im : r.impls) {
      const double med = median(im.wall), worst = im.wall.empty() ? 0 : *std::max_element(im.wall.begin(), im.wall.end());
      const double util = median(im.cpu) / std::max(med, 1e-12);
      const double workers = median(im.workers);
      const double gflops = 2.0 * double(r.s.M) * double(r.s.K) * double(r.s.N) / med * 1e-9;
      by_threads[{r.s.M, r.s.K, r.s.N, im.name}][r.threads] = med;
      lines.push_back(fmt::format("    {{\"M\": {}, \"K\": {}, \"N\": {}, \"threads\": {}, \"impl\": \"{}\", \"median_us\": {:.3f}, "
                                  "\"worst_us\": {:.3f}, \"reps\": {}, \"gflops\": {:.2f}, \"cpu_per_wall\": {:.3f}, \"threads_worked\": {}}}",
                                  r.s.M, r.s.K, r.s.N, r.threads, im.name, med * 1e6, worst * 1e6, im.reps, gflops, util, workers));
      fmt::print("{:>5} {:>5} {:>5} {:>2} | {:>6} {:>10.1f} {:>10.1f} {:>7.1f} {:>8.2f} {:>7}\n", r.s.M, r.s.K, r.s.N, r.threads,
                 im.name, med * 1e6, worst * 1e6, gflops, util, workers);
    }
  for (const auto& [k, m] : by_threads)
    if (m.size() > 1) {
      const double s = m.begin()->second / m.rbegin()->second;
      lines.push_back(fmt::format("    {{\"M\": {}, \"K\": {}, \"N\": {}, \"impl\": \"{}\", \"speedup_t{}_over_t{}\": {:.3f}}}",
                                  std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), m.rbegin()->first,
                                  m.begin()->first, s));
      fmt::print("speed-up {} threads over {}: M={} K={} N={} {}: {:.2f}x\n", m.rbegin()->first, m.begin()->first,
                 std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), s);
    }
  for (size_t i = 0; i < lines.size(); ++i) json += lines[i] + (i + 1 < lines.size() ? ",\n" : "\n");
  json += "  ]\n}\n";
  std::ofstream(out) << json;
  fmt::print("wrote {} (load average before {}, after {})\n", out, load_before, load_after);
  return mismatches.empty() ? 0 : 1;
}
