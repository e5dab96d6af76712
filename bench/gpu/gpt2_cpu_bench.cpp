// GPT-2 small on the CPU, Protean against ONNX Runtime's CPU provider (bench/gpu/gpt2_run.sh, step
// gpt2_cpu): the seeded float32 export of scripts/export_gpt2.py, the sequence length dynamic.
//
//   protean_gpt2_cpu_bench MODEL.onnx WORKDIR BACKEND
//
// WORKDIR holds what bench/gpu/gpt2_ort.py wrote: ort_lengths.txt (the lengths, in order),
// ort_ids_<L>.npy (int64 [1, L]) and ort_<L>.npy (ONNX Runtime's last_hidden_state, float32).
// Loads MODEL.onnx in float32 on the host (weights memory-mapped from the external data file),
// compiles it with BACKEND (interp or cpu) in the default dynamic mode (automatic dynamic: a static
// graph for the first length, one dynamic recompile on the second, then cache hits) and runs each
// length once (then once more, timed). Prints one JSON object: load time, compiles, recompiles and
// cache hits, and per length the first-call and second-call seconds and the error against ONNX
// Runtime: max abs, max relative (|a - b| / max(|b|, 1e-3)), relative L2.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "protean/compile.h"
#include "protean/onnx.h"
#include "protean/ops.h"
#include "protean/protean.h"
#include "gpt2_bench_util.h"

namespace pt = protean;

namespace {

using gpt2_bench::Clock;
using gpt2_bench::compare;
using gpt2_bench::Err;
using gpt2_bench::seconds_since;

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: protean_gpt2_cpu_bench MODEL.onnx WORKDIR BACKEND\n");
    return 2;
  }
  const std::string model_path = argv[1], work = argv[2], backend = argv[3];
  const std::vector<int64_t> lengths = gpt2_bench::read_lengths(work + "/ort_lengths.txt");
  if (lengths.empty()) {
    std::fprintf(stderr, "gpt2_cpu_bench: no lengths in %s/ort_lengths.txt\n", work.c_str());
    return 2;
  }
  const auto t_load = Clock::now();
  auto model = pt::onnx::load(model_path);
  const double load_s = seconds_since(t_load);
  pt::CompileOptions o;
  o.name = model->identity();
  o.arg_names = model->input_names();
  o.backend = backend;
  auto f = pt::compile([model](const pt::Tensor& x) { return model->forward({x})[0]; }, o);
  std::string rows;
  double worst_abs = 0, worst_rel = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const int64_t l = lengths[i];
    pt::Tensor x = pt::load_npy(fmt::format("{}/ort_ids_{}.npy", work, l));
    pt::Tensor ref = pt::load_npy(fmt::format("{}/ort_{}.npy", work, l));
    auto t0 = Clock::now();
    pt::Tensor y = f(x).contiguous();
    const double first_s = seconds_since(t0);
    t0 = Clock::now();
    pt::Tensor y2 = f(x).contiguous();
    const double second_s = seconds_since(t0);
    const Err e = compare(y, ref);
    worst_abs = std::max(worst_abs, e.max_abs);
    worst_rel = std::max(worst_rel, e.max_rel);
    rows += fmt::format(
        "{}\n  {{\"seq\": {}, \"first_call_s\": {:.4f}, \"second_call_s\": {:.4f}, \"vs_ort\": {{\"max_abs\": {:.4g}, "
        "\"max_rel\": {:.4g}, \"rel_l2\": {:.4g}}}, \"dtype\": \"{}\"}}",
        i ? "," : "", l, first_s, second_s, e.max_abs, e.max_rel, e.rel_l2, pt::short_name(y.dtype()));
  }
  const pt::Stats st = f.stats();
  std::printf("%s\n", fmt::format("{{\"backend\": \"{}\", \"model\": \"{}\", \"float_dtype\": \"f32\", \"load_s\": {:.3f}, "
                                  "\"compiles\": {}, \"recompiles\": {}, \"cache_hits\": {}, \"graph_breaks\": {}, "
                                  "\"worst_max_abs_vs_ort\": {:.4g}, \"worst_max_rel_vs_ort\": {:.4g},\n\"lengths\": [{}]}}",
                                  backend, model_path, load_s, st.compiles, st.recompiles, st.cache_hits, st.graph_breaks,
                                  worst_abs, worst_rel, rows)
                          .c_str());
  return 0;
}
