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

namespace pt = protean;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Err {
  double max_abs = 0, max_rel = 0, rel_l2 = 0;
};

Err compare(const pt::Tensor& got, const pt::Tensor& want) {
  Err e;
  if (got.int_sizes() != want.int_sizes()) return {INFINITY, INFINITY, INFINITY};
  std::vector<double> a = got.to(pt::DType::F64).contiguous().to_vector<double>();
  std::vector<double> b = want.to(pt::DType::F64).contiguous().to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::isnan(a[i]) ? INFINITY : std::fabs(a[i] - b[i]);
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / std::max(std::fabs(b[i]), 1e-3));
    num += d * d;
    den += b[i] * b[i];
  }
  e.rel_l2 = std::sqrt(num / std::max(den, 1e-300));
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: protean_gpt2_cpu_bench MODEL.onnx WORKDIR BACKEND\n");
    return 2;
  }
  const std::string model_path = argv[1], work = argv[2], backend = argv[3];
  std::vector<int64_t> lengths;
  {
    std::ifstream f(work + "/ort_lengths.txt");
    for (int64_t l; f >> l;) lengths.push_back(l);
  }
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
