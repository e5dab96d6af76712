// `protean demo`: PP-OCRv4 text recognition on rendered text lines of different widths, through the
// JIT with automatic dynamic shapes; prints each recognized line, its latency and the compile summary.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "backend/async_compile.h"
#include "device/driver.h"
#include "dynamic/profile_store.h"
#include "observe/trace.h"
#include "protean/compile.h"
#include "protean/ocr.h"
#include "protean/onnx.h"
#include "protean/protean.h"
#include "protean/run_cmd.h"
#include "protean/text_render.h"

namespace protean::tools {

namespace {
/// The bundled text lines: widths from ~100 to ~800 pixels at height 48.
const std::vector<std::string> kDemoLines = {
    "Hello 123",
    "Protean",
    "Dynamic shapes",
    "compile once, run any width",
    "The quick brown fox jumps over the lazy dog",
    "PP-OCRv4 on the CPU",
    "recompile 0/1",
    "Guards, symbols and specializations",
};

std::string default_models_dir() {
  if (const char* d = std::getenv("PROTEAN_MODELS_DIR")) return d;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/protean/models";
}
}  // namespace

void add_demo_command(CLI::App& app, DemoArgs& a) {
  auto* demo = app.add_subcommand("demo", "recognize rendered text lines with PP-OCRv4 through the JIT");
  demo->add_option("--device", a.device, "cpu | cuda | cuda:N (backend auto then compiles for that device)")
      ->capture_default_str();
  demo->add_option("--backend", a.backend, "auto (cpu, compiling in the background) | eager | interp | cpu | cuda")
      ->capture_default_str();
  demo->add_option("--dynamic", a.dynamic, "auto | on | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  demo->add_option("--job-id", a.job_id, "PGO job id: a second run with the same id compiles fewer graphs");
  demo->add_option("--trace-dir", a.trace_dir, "write a structured compile trace here (see protean report)");
  demo->add_option("--models-dir", a.models_dir, "where scripts/fetch_models.sh put the models");
  demo->add_option("--threads", a.threads, "intra-op threads (default: all cores)")->check(CLI::Range(1, 4096));
}

int demo_command(const DemoArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (!a.trace_dir.empty()) observe::set_trace_dir(a.trace_dir);
  if (!a.job_id.empty()) {
    dynamic::check_job_id(a.job_id, "--job-id");
    ::setenv("PROTEAN_JOB_ID", a.job_id.c_str(), 1);
  }
  std::string dir = a.models_dir.empty() ? default_models_dir() : a.models_dir;
  std::string rec_path = dir + "/ch_PP-OCRv4_rec_infer.onnx", keys_path = dir + "/ppocr_keys_v1.txt";
  if (!std::filesystem::exists(rec_path))
    throw RuntimeError(fmt::format("model '{}' not found: run scripts/fetch_models.sh (or pass --models-dir)", rec_path));
  auto keys = load_ocr_keys(keys_path);
  auto model = onnx::load(rec_path);
  const Device device = parse_device(a.device);
  if (device.type != DeviceType::CPU && !cuda_is_available())
    throw RuntimeError(fmt::format("--device {}: {}", a.device, protean::cuda::driver_unavailable_reason()));

  CompileOptions opts;
  opts.name = model->identity();
  opts.arg_names = model->input_names();
  opts.backend = a.backend;
  opts.dynamic = a.dynamic == "on" ? Dynamic::On : a.dynamic == "off" ? Dynamic::Off : Dynamic::Auto;
  opts.file = model->path();
  // One tensor parameter per ONNX input, so guards and recompile reasons name the ONNX input (`x`).
  auto rec = compile([model](const Tensor& x) { return model->forward({x}); }, opts);

  std::cout << fmt::format("PP-OCRv4 recognition ({} nodes, backend {}, dynamic {})\n", model->num_nodes(),
                           a.backend == "auto" ? "auto (cpu, compiling in the background)" : a.backend, a.dynamic);
  int correct = 0;
  bool compiled_pass_ok = true;
  // One pass over the lines. A call served by the interpreter while its graph compiles in the
  // background (backend auto / async_compile) is marked; once any was, the compiled pass follows.
  auto pass = [&](bool count) {
    bool on_interp = false;
    for (const auto& line : kDemoLines) {
      Image img = render_text(line);
      Tensor x = preprocess_rec(img);
      if (device.type != DeviceType::CPU) x = x.to(device);
      const int64_t fallback0 = stats().async_fallback_runs;
      auto t0 = std::chrono::steady_clock::now();
      std::vector<Tensor> out = rec(x);
      for (auto& o : out) o = o.cpu();  // the call is done when its results are readable on the host
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const bool interp = stats().async_fallback_runs > fallback0;
      on_interp |= interp;
      CtcResult r = ctc_greedy_decode(out.at(0), keys);
      bool ok = r.text == line;
      if (count) correct += ok;
      else compiled_pass_ok &= ok;  // a compiled pass that disagrees fails the demo
      std::cout << fmt::format("  [{:>4} px] {:8.2f} ms  {} \"{}\"{}\n", x.size(3).hint(), ms, ok ? "ok " : "BAD",
                               r.text, interp ? "  (interpreter: compiling in the background)" : "");
    }
    return on_interp;
  };
  if (pass(true)) {
    backend::wait_for_async_compiles();
    std::cout << "the same lines, compiled:\n";
    pass(false);
  }
  Stats st = stats();
  std::cout << fmt::format("recognized {}/{} lines exactly\n", correct, kDemoLines.size());
  std::cout << fmt::format("compiles: {} graph(s), {} recompile(s), {} cache hit(s)\n", st.compiles, st.recompiles,
                           st.cache_hits);
  // One line per failed cache entry and guard: "F/C: ... expected 147, actual 122" reasons that differ
  // only in the actual value are joined, so --dynamic off prints one line per compiled width.
  std::vector<std::pair<std::string, std::vector<std::string>>> grouped;
  for (const auto& [reason, n] : st.recompile_reasons) {
    size_t cut = reason.rfind(", actual ");
    std::string head = cut == std::string::npos ? reason : reason.substr(0, cut);
    std::string actual = cut == std::string::npos ? "" : reason.substr(cut + 9);
    auto it = std::find_if(grouped.begin(), grouped.end(), [&](const auto& g) { return g.first == head; });
    if (it == grouped.end()) grouped.push_back({head, {}}), it = grouped.end() - 1;
    if (!actual.empty()) it->second.push_back(actual);
  }
  for (auto& [head, actuals] : grouped) {
    std::sort(actuals.begin(), actuals.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;  // numeric order for plain integers
    });
    std::cout << fmt::format("  recompiled because: {}{}{}\n", head, actuals.size() == 1 ? ", actual " : "",
                             actuals.size() == 1  ? actuals[0]
                             : actuals.empty()    ? ""
                                                  : fmt::format(", actual one of {}", fmt::join(actuals, ", ")));
  }
  return correct == static_cast<int>(kDemoLines.size()) && compiled_pass_ok ? 0 : 2;
}

}  // namespace protean::tools
