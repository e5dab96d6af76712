// Protean's side of bench/gpu/run.sh: device copy bandwidth, LayerNorm+GELU 16384x4096 bf16 and
// softmax 8192x8192 bf16 through backend cuda (static and dynamic sizes), and the host overhead of a
// trivial compiled function with one launch. Prints one JSON object to stdout.
//
// Cases: "static"; "dynamic": dynamic=On with mark_dynamic(x, 0, 2, 65536) and mark_dynamic(x, 1,
// 2, 8192), so both sizes are symbols with the upper bounds a user would declare; "dynamic_unbounded":
// dynamic=On without marks (no bound: the general row path).
//
// Kernel time: CUDA events on Protean's stream around a batch of back-to-back calls (so host launch
// cost overlaps GPU work), median over batches, worst batch reported too. Bandwidth counts each input
// byte read once and each output byte written once. Host overhead: wall time of one call's return
// (no synchronisation), median over calls, with the stream drained every 50 calls.
#include <fmt/format.h>

#include <functional>
#include <map>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/nvrtc.h"
#include "device/driver.h"
#include "backend/cuda/autotune.h"
#include "device/runtime.h"
#include "observe/log.h"
#include "protean/compile.h"
#include "protean/ops.h"
#include "protean/protean.h"

namespace pt = protean;
namespace drv = protean::cuda;

namespace {

struct Timing {
  double median_ms = 0, worst_ms = 0;
};

Timing summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.back()};
}

// Per-call GPU time of `call`, queued `per_batch` times between two events, over `batches`.
/// PROTEAN_BENCH_PROFILE=1 (under ncu): every case runs a few calls, no timing loops.
bool profiling() {
  const char* e = std::getenv("PROTEAN_BENCH_PROFILE");
  return e && *e && std::string(e) != "0";
}

/// PROTEAN_BENCH_CASES=ln,softmax,host (a comma-separated subset; default all): which cases run.
bool wanted(const char* name) {
  const char* e = std::getenv("PROTEAN_BENCH_CASES");
  if (!e || !*e) return true;
  const std::string list = std::string(",") + e + ",";
  return list.find(std::string(",") + name + ",") != std::string::npos;
}

template <typename F>
Timing event_time(F&& call, int per_batch = 20, int batches = 10) {
  if (profiling()) per_batch = batches = 1;
  const drv::DriverApi& api = drv::require_driver("bench");
  drv::CUstream s = drv::stream(0);
  drv::CUevent a, b;
  drv::check(api.cuEventCreate(&a, 0), "cuEventCreate");
  drv::check(api.cuEventCreate(&b, 0), "cuEventCreate");
  for (int i = 0; i < 3; ++i) call();  // warm-up (compile, module load, caches)
  drv::synchronize(0);
  std::vector<double> per;
  for (int k = 0; k < batches; ++k) {
    drv::check(api.cuEventRecord(a, s), "cuEventRecord");
    for (int i = 0; i < per_batch; ++i) call();
    drv::check(api.cuEventRecord(b, s), "cuEventRecord");
    drv::check(api.cuEventSynchronize(b), "cuEventSynchronize");
    float ms = 0;
    drv::check(api.cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
    per.push_back(ms / per_batch);
  }
  api.cuEventDestroy(a);
  api.cuEventDestroy(b);
  return summarize(per);
}

/// Largest |got - want| / (|want| + 2^-9) over the first `rows` rows (got: a device bf16 result;
/// want: `ref` of the same rows on the CPU in f32): the compiled kernel against eager, in units of
/// bf16's relative precision (a value below 1 is within bf16 rounding).
template <typename F>
double max_rel_err(const pt::Tensor& got, int64_t rows, F&& ref) {
  const pt::Tensor g = got.narrow(0, 0, rows).cpu().to(pt::DType::F32).contiguous();
  const pt::Tensor w = ref(rows).contiguous();
  const float* a = g.data_ptr<float>();
  const float* b = w.data_ptr<float>();
  double worst = 0;
  for (int64_t i = 0; i < g.int_numel(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (std::abs(double(b[i])) + 1.0 / 512));
  return std::isfinite(worst) ? worst : 1e300;  // JSON has no inf: a non-finite error prints as 1e300
}

std::string timing_json(const Timing& t, double bytes, double copy_gbs) {
  const double gbs = bytes / (t.median_ms * 1e-3) / 1e9;
  return fmt::format("{{\"median_ms\": {:.5f}, \"worst_ms\": {:.5f}, \"gb_per_s\": {:.1f}, \"pct_of_copy\": {:.1f}}}",
                     t.median_ms, t.worst_ms, gbs, 100.0 * gbs / copy_gbs);
}

// The small function of the graphs benchmark: a few kernels over [n, 256] f32 (scale+shift, a row
// softmax, a residual), n dynamic.
pt::Tensor small_fn(const pt::Tensor& x) { return pt::add(pt::softmax(pt::add(pt::mul(x, 2.0), 1.0), -1), x); }

// `protean_cuda_bench --graphs`: mode "reduce-overhead" against plain launches (mode "default") on
// small_fn at several sizes, same process: first-call time per size (a recording for a new bucket),
// host time of a steady call (median and worst over 2000 calls, stream drained every 50, no
// synchronisation per call), replay == plain bit for bit at every size, outputs held across later
// calls keep their values, and the graph counters.
int graphs_bench() {
  const drv::DeviceInfo& dev = drv::device_info(0);
  std::string out = fmt::format("{{\n\"device\": \"{}\", \"cc\": \"{}.{}\", \"driver_version\": {},\n", dev.name,
                                dev.cc_major, dev.cc_minor, dev.driver_version);
  const std::vector<int64_t> sizes = {64, 128, 37, 200, 256, 91, 311, 512, 77, 400, 150, 300};
  std::string rows;
  bool all_equal = true;
  for (const char* mode : {"default", "reduce-overhead"}) {
    pt::reset();
    pt::CompileOptions o;
    o.name = std::string("small_") + mode;
    o.backend = "cuda";
    o.mode = mode;
    o.dynamic = pt::Dynamic::On;
    auto f = pt::compile(small_fn, o);
    std::string per;
    for (int64_t n : sizes) {
      pt::manual_seed(static_cast<uint64_t>(n));
      pt::Tensor x = pt::randn({n, 256}, pt::DType::F32, pt::kCUDA);
      drv::synchronize(0);
      auto t0 = std::chrono::steady_clock::now();
      pt::Tensor y = f(x);
      drv::synchronize(0);
      const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      for (int i = 0; i < 50; ++i) f(x);
      drv::synchronize(0);
      std::vector<double> us;
      for (int i = 0; i < 2000; ++i) {
        auto t1 = std::chrono::steady_clock::now();
        pt::Tensor z = f(x);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t1).count());
        if (i % 50 == 49) drv::synchronize(0);
      }
      Timing t = summarize(us);
      per += fmt::format("{}{{\"n\": {}, \"first_call_ms\": {:.3f}, \"host_us_median\": {:.2f}, \"host_us_worst\": {:.2f}}}",
                         per.empty() ? "" : ", ", n, first_ms, t.median_ms, t.worst_ms);
    }
    const pt::Stats st = pt::stats();
    rows += fmt::format("\"{}\": {{\"sizes\": [{}], \"compiles\": {}, \"graph_recordings\": {}, \"graph_buckets\": {}, "
                        "\"graph_replays\": {}, \"graph_patches\": {}, \"graph_plain_runs\": {}}},\n",
                        mode, per, st.compiles, st.graph_recordings, st.graph_buckets, st.graph_replays,
                        st.graph_patches, st.graph_plain_runs);
  }
  // Bit-for-bit: both modes on the same inputs at every size of one bucket, outputs held.
  {
    pt::reset();
    pt::CompileOptions a, b;
    a.name = "plain";
    b.name = "graphs";
    a.backend = b.backend = "cuda";
    a.dynamic = b.dynamic = pt::Dynamic::On;
    b.mode = "reduce-overhead";
    auto fa = pt::compile(small_fn, a), fb = pt::compile(small_fn, b);
    std::vector<pt::Tensor> xs, held, want;
    for (int64_t n = 257; n <= 320; ++n) {  // one bucket: [257, 320]
      pt::manual_seed(static_cast<uint64_t>(n));
      xs.push_back(pt::randn({n, 256}, pt::DType::F32, pt::kCUDA));
      held.push_back(fb(xs.back()));
      want.push_back(fa(xs.back()).cpu());
    }
    int64_t mismatched = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const pt::Tensor h = held[i].cpu();
      if (std::memcmp(h.data_ptr(), want[i].data_ptr(), static_cast<size_t>(h.int_numel()) * 4) != 0) ++mismatched;
    }
    all_equal = mismatched == 0;
    const pt::Stats st = pt::stats();
    out += fmt::format("\"bitwise_one_bucket\": {{\"sizes\": \"257..320\", \"mismatched_sizes\": {}, "
                       "\"held_outputs_checked_after_all_calls\": {}, \"graph_recordings\": {}, \"graph_patches\": {}}},\n",
                       mismatched, held.size(), st.graph_recordings, st.graph_patches);
  }
  out += rows;
  out += fmt::format("\"all_equal\": {}\n}}\n", all_equal ? "true" : "false");
  std::fputs(out.c_str(), stdout);
  return all_equal ? 0 : 1;
}

// `protean_cuda_bench --autotune`: mode "max-autotune" against "reduce-overhead" (the same graphs,
// untuned) on the LayerNorm+GELU and softmax rows, bf16, 8192 rows, both dims marked dynamic, one size
// bucket per column count, in two sweeps:
//   * wide: 1024, 2048, 4096 and 8192 columns, columns marked [2, 16384]: the schedule keeps a row in
//     registers with a block per row sized at launch, so threads per row and the vector width are tunable;
//   * narrow: 128, 256, 512 and 768 columns, columns marked [2, 768]: LayerNorm+GELU runs a warp per
//     row (rows per block and vector width tunable), softmax a block per row;
//   * few rows (`_few_rows`): 32 rows of 16384, 32768 and 65536 columns marked [2, 65536]: a block per
//     row streaming the row (fewer rows than multiprocessors), where max-autotune also times the row
//     split over a thread-block cluster of 2 and 4 blocks (`r1v8s2`, `r1v8s4`; sm_90).
// `--autotune few_rows` (or `wide`, `narrow`) runs that sweep only.
// Modes, in this order: reduce-overhead (untuned), max-autotune with PROTEAN_AUTOTUNE_VARIANTS=0
// (threads per row only: what max-autotune tuned before the row-kernel variants), max-autotune, and
// max-autotune again with the tuning table read again from its file, as the next run would (it must
// time nothing). Graphs are recorded on the calling thread (PROTEAN_CUDA_GRAPH_RECORD=inline), so a
// bucket's first call includes its tuning (and, in the first max-autotune bucket, the variants'
// NVRTC compile). Per size: the first call, the call's GPU time (events, median and worst of 10
// batches of 20), the tuning counters of that bucket, its max-autotune log line's choices
// ("chosen": the winners that are not the untuned choice, e.g. "kernel0 r2v4 (13.0 -> 12.1 us)"),
// and the largest difference of the result from the untuned one (0: bit for bit).
int autotune_bench(const std::string& only) {
  setenv("PROTEAN_CUDA_GRAPH_RECORD", "inline", 1);
  namespace bc = protean::backend::cuda;
  const drv::DeviceInfo& dev = drv::device_info(0);
  std::string out = fmt::format("{{\n\"device\": \"{}\", \"cc\": \"{}.{}\", \"driver_version\": {},\n\"tuning_table\": \"{}\",\n",
                                dev.name, dev.cc_major, dev.cc_minor, dev.driver_version, bc::tuning_path());
  struct Sweep {
    const char* suffix;
    const char* name;
    std::vector<int64_t> cols;
    int64_t bound;
    int64_t rows;
  };
  std::vector<Sweep> sweeps = {{"", "wide", {1024, 2048, 4096, 8192}, 16384, 8192},
                               {"_narrow", "narrow", {128, 256, 512, 768}, 768, 8192},
                               {"_few_rows", "few_rows", {16384, 32768, 65536}, 65536, 32}};
  if (!only.empty()) {
    std::erase_if(sweeps, [&](const Sweep& sw) { return only != sw.name; });
    if (sweeps.empty()) {
      std::fprintf(stderr, "protean_cuda_bench --autotune: unknown sweep '%s' (wide, narrow or few_rows)\n", only.c_str());
      return 2;
    }
  }
  auto ln_gelu = [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
    return pt::gelu(pt::layer_norm(x, {x.size(-1)}, w, b));
  };
  auto softmax = [](const pt::Tensor& x, const pt::Tensor&, const pt::Tensor&) { return pt::softmax(x, -1); };
  // the part of a max-autotune log line after "changed: " (or what it says instead)
  auto chosen = [](const std::string& log) {
    const size_t at = log.rfind("max-autotune: bucket");
    if (at == std::string::npos) return std::string("no tuning line");
    std::string line = log.substr(at, log.find('\n', at) - at);
    const size_t c = line.find("changed: ");
    std::string r = c != std::string::npos ? line.substr(c + 9) : line.find("every default kept") != std::string::npos ? "every default kept" : line;
    std::replace(r.begin(), r.end(), '"', '\'');
    return r;
  };
  std::string cases;
  for (const Sweep& sw : sweeps)
  for (int c = 0; c < 2; ++c) {
    const std::string name = c == 0 ? "layernorm_gelu" : "softmax";
    std::string rows;
    const int64_t M = sw.rows;
    std::map<int64_t, pt::Tensor> untuned;
    for (const char* mode : {"reduce-overhead", "max-autotune-no-variants", "max-autotune", "max-autotune-warm"}) {
      const std::string m = mode;
      pt::reset();
      if (m == "max-autotune-warm") bc::reset_process_tuning_table();  // read from the file again
      bc::reset_autotune_stats();
      if (m == "max-autotune-no-variants") setenv("PROTEAN_AUTOTUNE_VARIANTS", "0", 1);
      else unsetenv("PROTEAN_AUTOTUNE_VARIANTS");
      pt::CompileOptions o;
      o.name = name + sw.suffix + "_" + (m == "reduce-overhead" ? "untuned" : m == "max-autotune-no-variants" ? "threads" : "tuned");
      o.backend = "cuda";
      o.dynamic = pt::Dynamic::On;
      o.mode = m == "reduce-overhead" ? "reduce-overhead" : "max-autotune";
      auto f = pt::compile(c == 0 ? std::function<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)>(ln_gelu)
                                  : std::function<pt::Tensor(const pt::Tensor&, const pt::Tensor&, const pt::Tensor&)>(softmax),
                           o);
      std::string per;
      for (int64_t n : sw.cols) {
        pt::manual_seed(static_cast<uint64_t>(n));
        pt::Tensor x = pt::randn({M, n}, pt::DType::BF16, pt::kCUDA);
        pt::Tensor w = pt::randn({n}, pt::DType::BF16, pt::kCUDA);
        pt::Tensor b = pt::randn({n}, pt::DType::BF16, pt::kCUDA);
        pt::mark_dynamic(x, 0, 2, 65536);  // w and b follow x's columns (the guard Eq(s1, s2) makes them one symbol)
        pt::mark_dynamic(x, 1, 2, sw.bound);
        const bc::AutotuneStats a0 = bc::autotune_stats();
        drv::synchronize(0);
        std::string log;
        auto t0 = std::chrono::steady_clock::now();
        pt::Tensor y;
        {
          pt::observe::LogCapture cap("graphs");
          y = f(x, w, b);
          drv::synchronize(0);
          log = cap.str();
        }
        const double first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (std::getenv("PROTEAN_LOGS")) std::fputs(log.c_str(), stderr);
        const bc::AutotuneStats a1 = bc::autotune_stats();
        Timing t = event_time([&] { y = f(x, w, b); });
        double diff = 0;
        if (m == "reduce-overhead") {
          untuned[n] = y.cpu().to(pt::DType::F32);
        } else {
          const pt::Tensor g = y.cpu().to(pt::DType::F32).contiguous(), u = untuned[n].contiguous();
          for (int64_t i = 0; i < g.int_numel(); ++i)
            diff = std::max(diff, std::abs(double(g.data_ptr<float>()[i]) - double(u.data_ptr<float>()[i])));
        }
        const double bytes = 2.0 * static_cast<double>(M * n) * 2.0;
        std::fprintf(stderr, "%s %s %lldx%lld %s: %.2f us per call (worst %.2f), first call %.1f ms, %s, max diff %.4g\n", sw.name,
                     name.c_str(), static_cast<long long>(M), static_cast<long long>(n), mode, t.median_ms * 1e3, t.worst_ms * 1e3,
                     first_ms, m == "reduce-overhead" ? "untuned" : chosen(log).c_str(), diff);
        per += fmt::format("{}\n    {{\"cols\": {}, \"first_call_ms\": {:.3f}, \"call_ms\": {:.5f}, \"call_worst_ms\": {:.5f}, "
                           "\"gb_per_s\": {:.1f}, \"sites_tuned\": {}, \"sites_from_table\": {}, \"sites_changed\": {}, "
                           "\"candidates_timed\": {}, \"tuning_ms\": {:.2f}, \"variant_entries_loaded\": {}, "
                           "\"variant_nvrtc\": {}, \"variant_compile_ms\": {:.1f}, \"chosen\": \"{}\", "
                           "\"max_abs_diff_vs_untuned\": {:.4g}}}",
                           per.empty() ? "" : ",", n, first_ms, t.median_ms, t.worst_ms,
                           bytes / (t.median_ms * 1e-3) / 1e9, a1.sites_tuned - a0.sites_tuned,
                           a1.sites_from_table - a0.sites_from_table, a1.sites_changed - a0.sites_changed,
                           a1.candidates_timed - a0.candidates_timed, a1.tuning_ms - a0.tuning_ms,
                           a1.variant_entries - a0.variant_entries, a1.variant_nvrtc - a0.variant_nvrtc,
                           a1.variant_compile_ms - a0.variant_compile_ms, m == "reduce-overhead" ? "untuned" : chosen(log), diff);
      }
      rows += fmt::format("{}\n  \"{}\": [{}]", rows.empty() ? "" : ",", m, per);
    }
    unsetenv("PROTEAN_AUTOTUNE_VARIANTS");
    cases += fmt::format("\"{}_{}_rows_bf16{}\": {{{}}},\n", name, M, sw.suffix, rows);
  }
  out += cases;
  out += fmt::format("\"note\": \"graph replay of one compiled call per size; call_ms from CUDA events\"\n}}\n");
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

// `protean_cuda_bench --attention`: the fused causal attention kernel alone (backend/cuda/attention.h)
// on q, k, v [1, 12, L, 64] bf16 (GPT-2 small's heads), one dynamic artifact for every L after the first, kernel
// time by CUDA events around 20 back-to-back calls (median of 10 batches). Compare with
// bench/gpu/torch_attention.py (torch's scaled_dot_product_attention, is_causal) in the same run.
int attention_bench() {
  std::string rows;
  pt::CompileOptions o;
  o.name = "causal_attention";
  o.backend = "cuda";  // automatic dynamic: L a symbol from the second length on
  auto f = pt::compile([](const pt::Tensor& q, const pt::Tensor& k, const pt::Tensor& v) {
    return pt::scaled_dot_product_attention(q, k, v, {}, true);
  }, o);
  std::vector<int64_t> lengths = {37, 128, 256, 400, 512, 1024, 2048, 4096};
  if (const char* e = std::getenv("PROTEAN_BENCH_ATTENTION_L"); e && std::atoll(e) > 0) lengths = {std::atoll(e)};  // one L (ncu)
  for (int64_t L : lengths) {
    pt::manual_seed(static_cast<uint64_t>(L));
    pt::Tensor q = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor k = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor v = pt::randn({1, 12, L, 64}, pt::DType::BF16, pt::kCUDA);
    std::fprintf(stderr, "attention L=%lld: first call\n", static_cast<long long>(L));
    pt::Tensor y = f(q, k, v);
    drv::synchronize(0);
    std::fprintf(stderr, "attention L=%lld: timing\n", static_cast<long long>(L));
    const Timing t = event_time([&] { y = f(q, k, v); }, L >= 4096 ? 2 : 20, L >= 4096 ? 3 : 10);
    std::fprintf(stderr, "attention L=%lld: %.2f us (worst %.2f)\n", static_cast<long long>(L), 1e3 * t.median_ms, 1e3 * t.worst_ms);
    rows += fmt::format("{}\"{}\": {{\"median_us\": {:.2f}, \"worst_us\": {:.2f}}}", rows.empty() ? "" : ", ", L,
                        1e3 * t.median_ms, 1e3 * t.worst_ms);
  }
  const char* split = std::getenv("PROTEAN_CUDA_ATTENTION_KEY_SPLIT");
  std::printf("{\"benchmark\": \"causal attention [1, 12, L, 64] bf16\", \"key_split\": \"%s\", \"compiles\": %lld, \"us\": {%s}}\n",
              split ? split : "default", static_cast<long long>(f.stats().compiles), rows.c_str());
  return 0;
}

int main(int argc, char** argv) {
  if (!pt::cuda_is_available()) {
    std::fprintf(stderr, "cuda_bench: %s\n", drv::driver_unavailable_reason().c_str());
    return 2;
  }
  if (argc > 1 && std::string(argv[1]) == "--graphs") return graphs_bench();
  if (argc > 1 && std::string(argv[1]) == "--autotune") return autotune_bench(argc > 2 ? argv[2] : "");
  if (argc > 1 && std::string(argv[1]) == "--attention") return attention_bench();
  const drv::DeviceInfo& dev = drv::device_info(0);
  std::string out = fmt::format("{{\n\"device\": \"{}\", \"cc\": \"{}.{}\", \"sm_count\": {}, \"driver_version\": {},\n",
                                dev.name, dev.cc_major, dev.cc_minor, dev.sm_count, dev.driver_version);

  // ---- copy bandwidth: device-to-device, 1 GiB, bytes read + written ----
  const size_t copy_bytes = size_t{1} << 30;
  pt::Tensor src = pt::empty({static_cast<int64_t>(copy_bytes / 2)}, pt::DType::BF16, pt::kCUDA);
  pt::Tensor dst = pt::empty({static_cast<int64_t>(copy_bytes / 2)}, pt::DType::BF16, pt::kCUDA);
  drv::memset_device(0, reinterpret_cast<drv::CUdeviceptr>(src.data_ptr()), 0x3c, copy_bytes);
  Timing copy = event_time([&] {
    drv::copy_device_to_device(0, reinterpret_cast<drv::CUdeviceptr>(dst.data_ptr()),
                               reinterpret_cast<drv::CUdeviceptr>(src.data_ptr()), copy_bytes);
  }, 5, 10);
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy.median_ms * 1e-3) / 1e9;
  out += fmt::format("\"copy\": {{\"bytes\": {}, \"median_ms\": {:.4f}, \"worst_ms\": {:.4f}, \"gb_per_s\": {:.1f}}},\n",
                     copy_bytes, copy.median_ms, copy.worst_ms, copy_gbs);
  src = pt::Tensor();
  dst = pt::Tensor();

  // ---- LayerNorm + GELU, 16384 x 4096 bf16 ----
  if (wanted("ln")) {
    const int64_t M = 16384, N = 4096;
    pt::manual_seed(0);
    pt::Tensor x = pt::randn({M, N}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor w = pt::randn({N}, pt::DType::BF16, pt::kCUDA);
    pt::Tensor b = pt::randn({N}, pt::DType::BF16, pt::kCUDA);
    auto body = [](const pt::Tensor& x, const pt::Tensor& w, const pt::Tensor& b) {
      return pt::gelu(pt::layer_norm(x, {x.size(-1)}, w, b));
    };
    const double bytes = 2.0 * static_cast<double>(M * N) * 2.0;
    std::string rows;
    // static; dynamic with marked bounds; dynamic without bounds (a fresh tensor: marks stay on x)
    for (const char* mode : {"static", "dynamic", "dynamic_unbounded"}) {
      const std::string m = mode;
      pt::CompileOptions o;
      o.name = "ln_gelu_" + m;
      o.backend = "cuda";
      o.dynamic = m == "static" ? pt::Dynamic::Off : pt::Dynamic::On;
      pt::Tensor xin = x;
      // as a user marks a batch of token rows and a hidden size: both symbolic, with the largest
      // sizes the model will see (the bounds the cuda schedule policy sizes its registers from)
      if (m == "dynamic") {
        pt::mark_dynamic(x, 0, 2, 65536);
        pt::mark_dynamic(x, 1, 2, 8192);
      } else if (m == "dynamic_unbounded") {
        pt::manual_seed(0);
        xin = pt::randn({M, N}, pt::DType::BF16, pt::kCUDA);
      }
      auto f = pt::compile(body, o);
      auto t0 = std::chrono::steady_clock::now();
      pt::Tensor y = f(xin, w, b);
      drv::synchronize(0);
      const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      Timing t = event_time([&] { y = f(xin, w, b); });
      const double err = max_rel_err(y, 64, [&](int64_t r) {
        return body(xin.narrow(0, 0, r).cpu().to(pt::DType::F32), w.cpu().to(pt::DType::F32), b.cpu().to(pt::DType::F32));
      });
      rows += fmt::format("{}\"{}\": {{\"kernel\": {}, \"first_call_s\": {:.3f}, \"max_rel_err_64_rows_vs_cpu_f32\": {:.2e}}}",
                          rows.empty() ? "" : ", ", m, timing_json(t, bytes, copy_gbs), first_s, err);
    }
    out += fmt::format("\"layernorm_gelu_16384x4096_bf16\": {{{}}},\n", rows);
  }

  // ---- softmax, 8192 x 8192 bf16 ----
  if (wanted("softmax")) {
    const int64_t M = 8192, N = 8192;
    pt::manual_seed(1);
    pt::Tensor x = pt::randn({M, N}, pt::DType::BF16, pt::kCUDA);
    auto body = [](const pt::Tensor& x) { return pt::softmax(x, -1); };
    const double bytes = 2.0 * static_cast<double>(M * N) * 2.0;
    std::string rows;
    for (const char* mode : {"static", "dynamic", "dynamic_unbounded"}) {
      const std::string m = mode;
      pt::CompileOptions o;
      o.name = "softmax_" + m;
      o.backend = "cuda";
      o.dynamic = m == "static" ? pt::Dynamic::Off : pt::Dynamic::On;
      pt::Tensor xin = x;
      if (m == "dynamic") {  // rows and row length symbolic, bounded as a user would mark them
        pt::mark_dynamic(x, 0, 2, 65536);
        pt::mark_dynamic(x, 1, 2, 8192);
      } else if (m == "dynamic_unbounded") {
        pt::manual_seed(1);
        xin = pt::randn({M, N}, pt::DType::BF16, pt::kCUDA);
      }
      auto f = pt::compile(body, o);
      pt::Tensor y = f(xin);
      Timing t = event_time([&] { y = f(xin); });
      const double err = max_rel_err(y, 64, [&](int64_t r) { return body(xin.narrow(0, 0, r).cpu().to(pt::DType::F32)); });
      rows += fmt::format("{}\"{}\": {{\"kernel\": {}, \"max_rel_err_64_rows_vs_cpu_f32\": {:.2e}}}", rows.empty() ? "" : ", ", m,
                          timing_json(t, bytes, copy_gbs), err);
    }
    out += fmt::format("\"softmax_8192x8192_bf16\": {{{}}},\n", rows);
  }

  // ---- host overhead: a trivial compiled function with one launch ----
  if (wanted("host")) {
    pt::Tensor x = pt::randn({1024}, pt::DType::F32, pt::kCUDA);
    pt::CompileOptions o;
    o.name = "trivial";
    o.backend = "cuda";
    o.dynamic = pt::Dynamic::Off;
    auto f = pt::compile([](const pt::Tensor& x) { return pt::add(x, 1.0); }, o);
    for (int i = 0; i < (profiling() ? 1 : 100); ++i) f(x);
    drv::synchronize(0);
    std::vector<double> us;
    for (int i = 0; i < (profiling() ? 1 : 2000); ++i) {
      auto t0 = std::chrono::steady_clock::now();
      pt::Tensor y = f(x);
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (i % 50 == 49) drv::synchronize(0);
    }
    Timing t = summarize(us);
    // the floor: cuLaunchKernel alone of an equal one-block kernel, timed the same way (the driver's
    // share of the call above)
    Timing floor;
    {
      const char* src = "extern \"C\" __global__ void floor_k(const float* x, float* y, long long n) {\n"
                        "  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                        "  if (i < n) y[i] = x[i] + 1.0f;\n}\n";
      const protean::backend::cuda::NvrtcResult r = protean::backend::cuda::nvrtc_compile(src, "floor.cu");
      const drv::DriverApi& api = drv::require_driver("bench");
      drv::CUmodule mod = nullptr;
      drv::CUfunction fn = nullptr;
      drv::check(api.cuModuleLoadData(&mod, r.cubin.data()), "cuModuleLoadData");
      drv::check(api.cuModuleGetFunction(&fn, mod, "floor_k"), "cuModuleGetFunction");
      pt::Tensor y = pt::empty({1024}, pt::DType::F32, pt::kCUDA);
      uint64_t block[3] = {reinterpret_cast<uint64_t>(x.data_ptr()), reinterpret_cast<uint64_t>(y.data_ptr()), 1024};
      void* params[3] = {&block[0], &block[1], &block[2]};
      const drv::CUstream st = drv::stream(0);
      std::vector<double> fus;
      for (int i = 0; i < (profiling() ? 1 : 2100); ++i) {
        auto t0 = std::chrono::steady_clock::now();
        drv::check(api.cuLaunchKernel(fn, 1, 1, 1, 256, 1, 1, 0, st, params, nullptr), "cuLaunchKernel");
        if (i >= 100) fus.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        if (i % 50 == 49) drv::synchronize(0);
      }
      drv::synchronize(0);
      floor = summarize(fus.empty() ? std::vector<double>{0} : fus);
    }
    drv::AllocatorStats a = drv::allocator_stats(0);
    out += fmt::format("\"host_overhead_trivial_us\": {{\"median\": {:.2f}, \"worst\": {:.2f}, \"calls\": {}}},\n",
                       t.median_ms, t.worst_ms, us.size());
    out += fmt::format("\"launch_floor_us\": {{\"median\": {:.2f}, \"worst\": {:.2f}, \"what\": \"cuLaunchKernel alone, one block, "
                       "same loop\"}},\n",
                       floor.median_ms, floor.worst_ms);
    out += fmt::format("\"allocator\": {{\"requests\": {}, \"cache_hits\": {}, \"driver_allocs\": {}}},\n", a.requests,
                       a.cache_hits, a.driver_allocs);
  }
  const char* cases = std::getenv("PROTEAN_BENCH_CASES");
  out += fmt::format("\"cases\": \"{}\"\n}}\n", cases && *cases ? cases : "ln,softmax,host");
  std::fputs(out.c_str(), stdout);
  return 0;
}
