// Protean's side of bench/gpu/gpt2_run.sh: GPT-2 small from ONNX on backend cuda, bf16.
//
//   protean_gpt2_bench MODEL.onnx WORKDIR LABEL [--steady] [--profile-call L [--profile-repeat N]
//                      [--profile-warm-ms MS]] [--profile-new-length L [--profile-repeat N]] [--mode=reduce-overhead|max-autotune]
//
// Loads MODEL.onnx with LoadOptions::float_dtype = bf16 (the fp32 export run as a bf16 model, as
// PyTorch's model.to(torch.bfloat16) runs the same weights) and LoadOptions::device = cuda (weights
// uploaded once at load, counted in load_s, as PyTorch's model is on the GPU before its clock starts), compiles it with backend cuda and the
// default dynamic mode (automatic dynamic: a static graph first, a dynamic one on the first new
// sequence length; with PROTEAN_JOB_ID set and a PGO profile from an earlier run, one dynamic graph).
// WORKDIR holds what scripts/export_gpt2.py wrote: lengths.txt (the sequence lengths, in order),
// ids_<L>.npy (int64 [1, L]) and ref_bf16_<L>.npy / ref_f32_<L>.npy (PyTorch's last_hidden_state of
// the bf16 and the f32 model, as float32).
//
// Prints one JSON object: load time; time from the first call to the 12th result on the host
// (`first_results_s`: cold when PROTEAN_CACHE_DIR is empty, warm when an earlier process filled it);
// compiles; per length the error against PyTorch bf16 (max abs, relative L2) and, as the yardstick of
// bf16 rounding, PyTorch bf16 against PyTorch f32; with --steady, per length the latency of one call
// including the wait for its result (wall time, cuStreamSynchronize), median and worst of 30 calls
// after 5 warm-up calls (and `steady_new_input_ms`, `new_input_host_ms`: the same with a new input
// tensor at every call, copies of the ids made beforehand, as a server's requests arrive;
// `steady_plain_runs`: in graph modes, the calls of those loops that ran plain launches instead of a
// replay, 0 when the figures are the graphs'); beside it,
// where the call's time goes: `host_ms`, the time until f(x) returns
// with every launch queued (no wait), and `gpu_ms`, CUDA events recorded on the stream before and
// after the call (the GPU's span, idle gaps included: close to host_ms when the call is bound by the
// host's launch work, shorter when the GPU waits on nothing).
// With --profile-call L: after the first results, 3 more calls at length L (in graph modes, until 10
// calls in a row replayed), with --profile-warm-ms MS calls one after another for MS milliseconds
// more, then one call (N with --profile-repeat) between cuProfilerStart and
// cuProfilerStop (for `ncu --profile-from-start off`: each launch of one steady call, cuBLASLt's
// included, with its duration; for bench/gpu/kernel_trace.cpp: the kernels inside the graph).
// With --profile-new-length L (graph modes; L a length none of the 12 is, inside a bucket they
// recorded): after the first results, every one of the 12 lengths again until its call replays (at
// most 10 s), then N + 1 calls at length L, each alone between cuProfilerStart and cuProfilerStop: the
// first is L's first call (the size change: patches, size values, the launch), the others steady
// (bench/gpu/first_call_trace.py compares them kernel by kernel from kernel_trace.cpp's windows).
// --mode=reduce-overhead compiles with CompileOptions::mode = "reduce-overhead" (one CUDA graph per
// size bucket, docs/graphs.md); the output then also has the graph counters and, with --steady, the
// first call of 4 new lengths inside buckets the 12 lengths already recorded (45, 100, 250, 480) against
// their steady latency: what a new length inside a known bucket costs on its first call, split into
// host time (until f returns) and GPU span (events) against the same split of the steady calls, the
// graph runner's own host time for the size change (GraphStats::size_change_ns; of it the size checks,
// and the host time until the first graph chunk was launched: size_change_first_launch_ns), the host
// time of the size values' copy to the device (size_copy_ns) and the caching
// allocator's driver allocations during that call.
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/autotune.h"
#include "backend/cuda/blas.h"
#include "backend/graph_stats.h"
#include "device/runtime.h"
#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"
#include "protean/protean.h"
#include "gpt2_bench_util.h"

namespace pt = protean;
namespace drv = protean::cuda;
namespace pb = protean::backend;

namespace {

using gpt2_bench::Clock;
using gpt2_bench::compare;
using gpt2_bench::Err;
using gpt2_bench::seconds_since;

// mode "max-autotune": the tuning counters (backend/cuda/autotune.h), and where the table lives.
std::string autotune_json() {
  const protean::backend::cuda::AutotuneStats a = protean::backend::cuda::autotune_stats();
  return fmt::format("{{\"buckets_tuned\": {}, \"sites_tuned\": {}, \"sites_from_table\": {}, \"sites_over_budget\": {}, "
                     "\"sites_changed\": {}, \"candidates_timed\": {}, \"tuning_ms\": {:.2f}, \"variant_kernels\": {}, "
                     "\"variant_entries\": {}, \"variant_nvrtc\": {}, \"variant_compile_ms\": {:.1f}, \"table\": \"{}\"}}",
                     a.buckets_tuned, a.sites_tuned, a.sites_from_table, a.sites_over_budget, a.sites_changed,
                     a.candidates_timed, a.tuning_ms, a.variant_kernels, a.variant_entries, a.variant_nvrtc,
                     a.variant_compile_ms, protean::backend::cuda::tuning_path());
}

// Where cuBLASLt's time went (backend/cuda/blas.h): set-up, heuristic queries, the algorithm table.
std::string blas_json(const protean::backend::cuda::BlasStats& b) {
  return fmt::format("{{\"heuristic_queries\": {}, \"heuristic_ms\": {:.2f}, \"table_hits\": {}, \"plans\": {}, "
                     "\"table_entries_read\": {}, \"setup_ms\": {:.2f}, \"table_read_ms\": {:.2f}, \"table_mismatches\": {}}}",
                     b.heuristic_queries, 1e3 * b.heuristic_seconds, b.table_hits, b.plans, b.table_entries_read,
                     1e3 * b.setup_seconds, 1e3 * b.table_read_seconds, b.table_mismatches);
}

/// cuProfilerStart and cuProfilerStop of the loaded driver (null where it has none): the range that
/// `ncu --profile-from-start off` and bench/gpu/kernel_trace.cpp record.
std::pair<int (*)(), int (*)()> profiler_range() {
  using ProfilerFn = int (*)();
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return {cuda ? reinterpret_cast<ProfilerFn>(dlsym(cuda, "cuProfilerStart")) : nullptr,
          cuda ? reinterpret_cast<ProfilerFn>(dlsym(cuda, "cuProfilerStop")) : nullptr};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: protean_gpt2_bench MODEL.onnx WORKDIR LABEL [--steady] [--profile-call L [--profile-repeat N] [--profile-warm-ms MS]] "
                         "[--profile-new-length L [--profile-repeat N]] [--mode=reduce-overhead|max-autotune]\n");
    return 2;
  }
  const std::string model_path = argv[1], work = argv[2], label = argv[3];
  bool steady = false;
  int64_t profile_len = 0, profile_new = 0;
  int profile_repeat = 1;
  double profile_warm_ms = 0;
  std::string mode = "default";
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steady") steady = true;
    else if (a == "--profile-call" && i + 1 < argc) profile_len = std::atoll(argv[++i]);
    else if (a == "--profile-repeat" && i + 1 < argc) profile_repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--profile-warm-ms" && i + 1 < argc) profile_warm_ms = std::max(0.0, std::atof(argv[++i]));
    else if (a == "--profile-new-length" && i + 1 < argc) profile_new = std::atoll(argv[++i]);
    else if (a.rfind("--mode=", 0) == 0) mode = a.substr(7);
  }
  if (!pt::cuda_is_available()) {
    std::fprintf(stderr, "gpt2_bench: %s\n", drv::driver_unavailable_reason().c_str());
    return 2;
  }
  const std::vector<int64_t> lengths = gpt2_bench::read_lengths(work + "/lengths.txt");
  if (lengths.empty()) {
    std::fprintf(stderr, "gpt2_bench: no lengths in %s/lengths.txt\n", work.c_str());
    return 2;
  }
  if (profile_new > 0 && std::find(lengths.begin(), lengths.end(), profile_new) != lengths.end()) {
    std::fprintf(stderr, "gpt2_bench: --profile-new-length %lld is one of the 12 lengths\n", static_cast<long long>(profile_new));
    return 2;
  }
  const drv::DeviceInfo& dev = drv::device_info(0);
  std::vector<pt::Tensor> ids;
  for (int64_t l : lengths) ids.push_back(pt::load_npy(fmt::format("{}/ids_{}.npy", work, l)).to(pt::kCUDA));
  drv::synchronize(0);

  const auto t_load = Clock::now();
  pt::onnx::LoadOptions lo;
  lo.float_dtype = pt::DType::BF16;
  lo.device = pt::kCUDA;  // weights uploaded once, here
  auto model = pt::onnx::load(model_path, lo);
  const double load_s = seconds_since(t_load);

  pt::CompileOptions o;
  o.name = model->identity();
  o.arg_names = model->input_names();
  o.backend = "cuda";
  o.mode = mode;
  auto f = pt::compile([model](const pt::Tensor& x) { return model->forward({x})[0]; }, o);

  // ---- first results: every length once, in order, each read back to the host ----
  std::vector<pt::Tensor> outs;
  std::vector<double> first_call_s;
  const auto t0 = Clock::now();
  for (const pt::Tensor& x : ids) {
    const auto t1 = Clock::now();
    outs.push_back(f(x).cpu());
    first_call_s.push_back(seconds_since(t1));
  }
  const double first_results_s = seconds_since(t0);
  const protean::backend::cuda::BlasStats blas12 = protean::backend::cuda::blas_stats();
  const pt::Stats st = f.stats();
  const drv::DriverApi& api = drv::require_driver("gpt2_bench");
  // f(x) at least `min_calls` times, and until `streak` calls in a row replayed (a bucket recorded on
  // the compile worker runs plain launches until its graph is ready) or `max_s` seconds since `since`
  auto calls_until_replayed = [&](const pt::Tensor& x, int min_calls, int streak, Clock::time_point since, double max_s) {
    for (int k = 0, replayed = 0; k < min_calls || (replayed < streak && seconds_since(since) < max_s); ++k) {
      const int64_t plain = pt::stats().graph_plain_runs;
      f(x);
      drv::synchronize(0);
      replayed = pt::stats().graph_plain_runs == plain ? replayed + 1 : 0;
    }
  };
  if (profile_len > 0) {  // one steady call under the profiler's range (ncu --profile-from-start off)
    const auto [start, stop] = profiler_range();
    pt::manual_seed(7);
    pt::Tensor x = pt::randint(0, 50257, {1, profile_len}, pt::DType::I64).to(pt::kCUDA);
    // warm: 3 calls, and in graph modes until 10 calls in a row replayed, at most 5 s
    calls_until_replayed(x, 3, mode != "default" ? 10 : 0, Clock::now(), 5);
    // --profile-warm-ms: the device kept busy with back-to-back calls that long first (whether the
    // steady call's time depends on how long the device has been busy)
    for (const auto w0 = Clock::now(); seconds_since(w0) * 1e3 < profile_warm_ms;) {
      f(x);
      drv::synchronize(0);
    }
    if (start) start();
    for (int k = 0; k < profile_repeat; ++k) {
      pt::Tensor y = f(x);
      drv::synchronize(0);
    }
    if (stop) stop();
    std::fprintf(stderr, "gpt2_bench: profiled %d call(s) at length %lld%s\n", profile_repeat, static_cast<long long>(profile_len),
                 start ? "" : " (cuProfilerStart not found)");
  }
  if (profile_new > 0) {  // a new length's first call, then steady ones, one profiler window each
    const auto [start, stop] = profiler_range();
    const auto tw = Clock::now();
    for (const pt::Tensor& x : ids) calls_until_replayed(x, 0, 3, tw, 10);  // each recorded bucket replays first
    pt::manual_seed(11);
    pt::Tensor x = pt::randint(0, 50257, {1, profile_new}, pt::DType::I64).to(pt::kCUDA);
    const int64_t recordings = pt::stats().graph_recordings;
    drv::synchronize(0);
    for (int k = 0; k <= profile_repeat; ++k) {
      if (start) start();
      pt::Tensor y = f(x);
      drv::synchronize(0);
      if (stop) stop();
    }
    std::fprintf(stderr, "gpt2_bench: profiled the first and %d steady call(s) at new length %lld, one window each; "
                 "recordings during them: %lld%s\n", profile_repeat, static_cast<long long>(profile_new),
                 static_cast<long long>(pt::stats().graph_recordings - recordings), start ? "" : " (cuProfilerStart not found)");
  }
  drv::CUevent ev0 = nullptr, ev1 = nullptr;
  drv::check(api.cuEventCreate(&ev0, 0), "cuEventCreate");
  drv::check(api.cuEventCreate(&ev1, 0), "cuEventCreate");
  // One call between two events on the stream: host time until f returns, wall time with the wait
  // for its result, and the GPU span between the events.
  struct CallTime {
    double host_ms = 0, wall_ms = 0;
    float gpu_ms = 0;
  };
  auto timed_call = [&](const pt::Tensor& x) {
    CallTime t;
    drv::check(api.cuEventRecord(ev0, drv::stream(0)), "cuEventRecord");
    const auto a = Clock::now();
    pt::Tensor y = f(x);
    t.host_ms = seconds_since(a) * 1e3;
    drv::check(api.cuEventRecord(ev1, drv::stream(0)), "cuEventRecord");
    drv::check(api.cuEventSynchronize(ev1), "cuEventSynchronize");
    t.wall_ms = seconds_since(a) * 1e3;
    drv::check(api.cuEventElapsedTime(&t.gpu_ms, ev0, ev1), "cuEventElapsedTime");
    return t;
  };

  std::string rows;
  double worst_rel = 0, worst_ref_rel = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    pt::Tensor ref = pt::load_npy(fmt::format("{}/ref_bf16_{}.npy", work, l));
    pt::Tensor ref32 = pt::load_npy(fmt::format("{}/ref_f32_{}.npy", work, l));
    const Err e = compare(outs[i], ref), e32 = compare(outs[i], ref32), floor = compare(ref, ref32);
    worst_rel = std::max(worst_rel, e.rel_l2);
    worst_ref_rel = std::max(worst_ref_rel, floor.rel_l2);
    rows += fmt::format(
        "{}\n  {{\"seq\": {}, \"first_call_s\": {:.4f}, \"vs_torch_bf16\": {{\"max_abs\": {:.4g}, \"rel_l2\": {:.4g}}}, "
        "\"vs_torch_f32\": {{\"max_abs\": {:.4g}, \"rel_l2\": {:.4g}}}, \"torch_bf16_vs_torch_f32\": {{\"max_abs\": "
        "{:.4g}, \"rel_l2\": {:.4g}}}",
        i ? "," : "", l, first_call_s[i], e.max_abs, e.rel_l2, e32.max_abs, e32.rel_l2, floor.max_abs, floor.rel_l2);
    if (steady) {
      std::vector<double> ms, host, gpu;
      const int64_t plain0 = pt::stats().graph_plain_runs;  // graph modes: calls of this length not replayed
      for (int k = 0; k < 35; ++k) {
        const auto a = Clock::now();
        pt::Tensor y = f(ids[i]);
        drv::synchronize(0);
        if (k >= 5) ms.push_back(seconds_since(a) * 1e3);
      }
      for (int k = 0; k < 20; ++k) {  // where the time goes: host enqueue, GPU span
        drv::synchronize(0);
        const CallTime t = timed_call(ids[i]);
        host.push_back(t.host_ms);
        gpu.push_back(t.gpu_ms);
      }
      // the same length with a new input tensor at every call (a server's requests): 30 copies of
      // the ids made beforehand and kept alive, so each call reads another address
      std::vector<pt::Tensor> copies;
      for (int k = 0; k < 35; ++k) copies.push_back(ids[i].clone());
      drv::synchronize(0);
      std::vector<double> fresh_ms, fresh_host;
      for (int k = 0; k < 35; ++k) {
        const auto a = Clock::now();
        pt::Tensor y = f(copies[static_cast<size_t>(k)]);
        const double h = seconds_since(a) * 1e3;
        drv::synchronize(0);
        if (k >= 5) {
          fresh_ms.push_back(seconds_since(a) * 1e3);
          fresh_host.push_back(h);
        }
      }
      for (auto* v : {&ms, &host, &gpu, &fresh_ms, &fresh_host}) std::sort(v->begin(), v->end());
      rows += fmt::format(
          ", \"steady_ms\": {{\"median\": {:.4f}, \"worst\": {:.4f}, \"calls\": {}}}, \"host_ms\": {:.4f}, "
          "\"gpu_ms\": {:.4f}, \"steady_new_input_ms\": {{\"median\": {:.4f}, \"worst\": {:.4f}, \"calls\": {}}}, "
          "\"new_input_host_ms\": {:.4f}, \"steady_plain_runs\": {}",
          ms[ms.size() / 2], ms.back(), ms.size(), host[host.size() / 2], gpu[gpu.size() / 2], fresh_ms[fresh_ms.size() / 2],
          fresh_ms.back(), fresh_ms.size(), fresh_host[fresh_host.size() / 2], pt::stats().graph_plain_runs - plain0);
    }
    rows += "}";
  }
  // New lengths inside known buckets: first call (with the wait for its result) against the steady
  // median of the same length; recordings before and after.
  std::string fresh;
  const pt::Stats after12 = pt::stats();
  if (steady) {
    for (int64_t l : {45, 100, 250, 480}) {
      pt::manual_seed(static_cast<uint64_t>(l));
      pt::Tensor x = pt::randint(0, 50257, {1, l}, pt::DType::I64).to(pt::kCUDA);
      drv::synchronize(0);
      const int64_t rec = pt::stats().graph_recordings, comp = f.stats().compiles;
      const drv::AllocatorStats al0 = drv::allocator_stats(0);
      const pb::GraphStats gs0 = pb::graph_stats();
      const CallTime first = timed_call(x);  // the first call of this length
      const double first_ms = first.wall_ms, first_host_ms = first.host_ms;
      const float first_gpu_ms = first.gpu_ms;
      const drv::AllocatorStats al1 = drv::allocator_stats(0);
      const pb::GraphStats gs1 = pb::graph_stats();
      const int64_t recorded = pt::stats().graph_recordings - rec, compiled = f.stats().compiles - comp;
      std::vector<double> ms, host, gpu;
      for (int k = 0; k < 25; ++k) {
        const CallTime t = timed_call(x);
        if (k >= 5) {
          ms.push_back(t.wall_ms);
          host.push_back(t.host_ms);
          gpu.push_back(t.gpu_ms);
        }
      }
      for (auto* v : {&ms, &host, &gpu}) std::sort(v->begin(), v->end());
      fresh += fmt::format("{}\n  {{\"seq\": {}, \"first_call_ms\": {:.4f}, \"steady_median_ms\": {:.4f}, "
                           "\"first_call_extra_ms\": {:.4f}, \"first_call_host_ms\": {:.4f}, \"steady_host_ms\": {:.4f}, "
                           "\"first_call_gpu_ms\": {:.4f}, \"steady_gpu_ms\": {:.4f}, "
                           "\"first_call_graph_runner_us\": {:.1f}, \"first_call_checks_us\": {:.1f}, "
                           "\"first_call_first_launch_us\": {:.1f}, \"first_call_size_copy_us\": {:.1f}, \"first_call_size_changes\": {}, "
                           "\"first_call_driver_allocs\": {}, \"graphs_recorded\": {}, \"compiles\": {}}}",
                           fresh.empty() ? "" : ",", l, first_ms, ms[ms.size() / 2], first_ms - ms[ms.size() / 2],
                           first_host_ms, host[host.size() / 2], first_gpu_ms, gpu[gpu.size() / 2],
                           (gs1.size_change_ns - gs0.size_change_ns) / 1e3,
                           (gs1.size_change_check_ns - gs0.size_change_check_ns) / 1e3,
                           (gs1.size_change_first_launch_ns - gs0.size_change_first_launch_ns) / 1e3,
                           (gs1.size_copy_ns - gs0.size_copy_ns) / 1e3, gs1.size_changes - gs0.size_changes,
                           al1.driver_allocs - al0.driver_allocs, recorded, compiled);
    }
  }
  const pt::Stats end = f.stats();
  const pt::Stats all = pt::stats();
  std::printf("%s\n",
              fmt::format("{{\"label\": \"{}\", \"mode\": \"{}\", \"graph_recordings_12_lengths\": {}, \"graph_buckets_12_lengths\": {}, \"graph_recordings\": {}, \"graph_buckets\": {}, "
                          "\"graph_replays\": {}, \"graph_patches\": {}, \"graph_plain_runs\": {}, "
                          "\"new_lengths_in_known_buckets\": [{}],\n\"device\": \"{}\", \"model\": \"{}\", \"float_dtype\": \"bf16\", "
                          "\"load_s\": {:.3f}, \"first_results_s\": {:.3f}, \"compiles_first_results\": {}, "
                          "\"compiles_total\": {}, \"recompiles\": {}, \"cache_hits\": {}, \"graph_breaks\": {}, "
                          "\"worst_rel_l2_vs_torch_bf16\": {:.4g}, \"worst_rel_l2_torch_bf16_vs_f32\": {:.4g}, "
                          "\"stats\": {},\n\"autotune\": {},\n\"cublaslt_first_results\": {},\n\"cublaslt\": {},\n\"lengths\": [{}]}}",
                          label, mode, after12.graph_recordings, after12.graph_buckets, all.graph_recordings, all.graph_buckets, all.graph_replays, all.graph_patches,
                          all.graph_plain_runs, fresh, dev.name, model_path, load_s, first_results_s, st.compiles, end.compiles, end.recompiles,
                          end.cache_hits, end.graph_breaks, worst_rel, worst_ref_rel, pt::stats().to_json(), autotune_json(), blas_json(blas12),
                          blas_json(protean::backend::cuda::blas_stats()), rows)
                  .c_str());
  return 0;
}
