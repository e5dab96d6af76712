#include "protean/run_cmd.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <limits>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <iostream>
#include <map>
#include <optional>

#include "device/driver.h"
#include "cache/kernel_cache.h"
#include "cache/program_cache.h"
#include "capture/frame.h"
#include "core/checked_size.h"
#include "core/npy.h"
#include "dynamic/profile_store.h"
#include "observe/phase_timer.h"
#include "observe/trace.h"
#include "ops/dnnl_stats.h"
#include "protean/compile.h"
#include "protean/ocr.h"
#include "protean/onnx.h"
#include "protean/protean.h"
#include "protean/text_render.h"

namespace protean::tools {

namespace {
using Clock = std::chrono::steady_clock;
/// CPU time of the whole process (all threads, user + system) in ms.
double process_cpu_ms() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3;
}
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
std::string shape_str(const IntVec& s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
  return r.empty() ? "scalar" : r;
}
Dynamic parse_dynamic(const std::string& s) {
  if (s == "auto") return Dynamic::Auto;
  if (s == "on" || s == "true") return Dynamic::On;
  if (s == "off" || s == "false") return Dynamic::Off;
  throw ValueError(fmt::format("--dynamic must be auto, on or off, got '{}'", s));
}

/// One input: a fixed tensor, or a sweep of random shapes.
struct InputSpec {
  std::string name;
  std::vector<Tensor> fixed;               // one tensor (file/image/scalar)
  std::vector<IntVec> sweep;               // random shapes
  DType dtype = DType::F32;
};

InputSpec parse_input(const std::string& spec, const onnx::Model& model, const std::string& preprocess) {
  InputSpec in;
  std::string value = spec;
  auto eq = spec.find('=');
  if (eq != std::string::npos) {
    in.name = spec.substr(0, eq);
    value = spec.substr(eq + 1);
  } else if (model.input_names().size() == 1) {
    in.name = model.input_names()[0];
  } else {
    throw ValueError(fmt::format("input '{}' has no name; write NAME=VALUE (the model's inputs: {})", spec,
                                 fmt::join(model.input_names(), ", ")));
  }
  auto it = std::find(model.input_names().begin(), model.input_names().end(), in.name);
  if (it == model.input_names().end())
    throw ValueError(fmt::format("the model has no input named '{}' (its inputs: {})", in.name,
                                 fmt::join(model.input_names(), ", ")));
  const auto& info = model.inputs()[static_cast<size_t>(it - model.input_names().begin())];
  if (info.dtype) in.dtype = *info.dtype;
  if (value.rfind("random:", 0) == 0) {
    in.sweep = expand_shape_sweep(value.substr(7));
    for (const auto& shape : in.sweep)  // before anything runs: random:4294967296x4294967296 would wrap
      core::checked_nbytes(shape, std::max(itemsize(in.dtype), itemsize(DType::F64)),
                           fmt::format("input '{}' (random:{})", in.name, value.substr(7)));
  } else if (value.rfind("scalar:", 0) == 0) {
    in.fixed.push_back(parse_scalar_input(in.name, value.substr(7), in.dtype));
  } else {
    std::string ext = std::filesystem::path(value).extension().string();
    std::transform(ext.begin(), ext.end(), ext.begin(), ::tolower);
    const bool npy = ext == ".npy", image = ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".bmp";
    std::error_code ec;
    if ((npy || image) && !std::filesystem::exists(value, ec))
      throw ValueError(fmt::format("input '{}': file '{}' does not exist", in.name, value));
    if ((npy || image) && std::filesystem::is_directory(value, ec))
      throw ValueError(fmt::format("input '{}': '{}' is a directory, not a file", in.name, value));
    if (npy) {
      in.fixed.push_back(core::load_npy_for(value, in.dtype));  // bf16 inputs: '<u2' bit patterns
    } else if (image) {
      Image img;
      try {
        img = read_png(value);
      } catch (const std::exception& e) {
        throw RuntimeError(e.what());
      }
      if (preprocess == "ocr-rec") in.fixed.push_back(preprocess_rec(img));
      else if (preprocess == "ocr-det") in.fixed.push_back(preprocess_det(img));
      else
        throw ValueError(fmt::format("input '{}' is an image: say how to turn it into a tensor with "
                                     "--preprocess ocr-rec or --preprocess ocr-det", in.name));
    } else {
      throw ValueError(fmt::format("input '{}': '{}' is not a .npy file, an image, random:SHAPE or scalar:VALUE{}",
                                   in.name, value,
                                   eq == std::string::npos && (value.find(":random:") != std::string::npos ||
                                                               value.find(":scalar:") != std::string::npos)
                                       ? " (inputs are written NAME=VALUE, e.g. x=random:1x3x48x320)"
                                       : ""));
    }
  }
  return in;
}

// A file the run writes at its end must be writable before the model runs (root ignores permission
// bits, so the test is an actual open, not access()).
void check_writable_file(const std::string& path, const char* option) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  if (!created && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0)
    throw ValueError(fmt::format("{} '{}': cannot write it: {} (checked before running the model)", option, path,
                                 std::strerror(errno)));
  ::close(fd);
  if (created) ::unlink(path.c_str());
}
void check_writable_dir(const std::string& dir, const char* option) {
  std::string templ = dir + "/.protean-write-check-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  int fd = ::mkstemp(buf.data());
  if (fd < 0)
    throw ValueError(fmt::format("{} '{}': cannot write files in it: {} (checked before running the model)", option, dir,
                                 std::strerror(errno)));
  ::close(fd);
  ::unlink(buf.data());
}

void progress(size_t done, size_t total, double elapsed_ms) {
  int width = 30;
  int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(done) / static_cast<double>(total));
  std::cerr << fmt::format("\r[{}{}] {}/{} shapes, {:.1f} s", std::string(static_cast<size_t>(filled), '#'),
                           std::string(static_cast<size_t>(width - filled), '.'), done, total, elapsed_ms / 1000)
            << std::flush;
}
}  // namespace

Tensor parse_scalar_input(const std::string& name, const std::string& text, DType dtype) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  if (is_integral(dtype, /*include_bool=*/true)) {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range)
      throw ValueError(fmt::format("input '{}' ({}): {} is out of range", name, short_name(dtype), text));
    if (ec != std::errc() || ptr != last || text.empty())
      throw ValueError(fmt::format("input '{}' is an integer input ({}): '{}' is not an integer", name,
                                   short_name(dtype), text));
    int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
    switch (dtype) {
      case DType::Bool: lo = 0, hi = 1; break;
      case DType::U8: lo = 0, hi = 255; break;
      case DType::I8: lo = -128, hi = 127; break;
      case DType::I32: lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max(); break;
      default: break;
    }
    if (v < lo || v > hi)
      throw ValueError(fmt::format("input '{}' ({}): {} is out of range [{}, {}]", name, short_name(dtype), text, lo, hi));
    Tensor t = full({}, static_cast<double>(v), dtype);
    if (dtype == DType::I64) *t.data_ptr<int64_t>() = v;  // exact beyond 2^53
    return t;
  }
  double d = 0;
  size_t used = 0;
  try {
    d = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    throw ValueError(fmt::format("input '{}' ({}): {} is out of range", name, short_name(dtype), text));
  } catch (const std::exception&) {
    throw ValueError(fmt::format("input '{}': '{}' is not a number", name, text));
  }
  if (used != text.size()) throw ValueError(fmt::format("input '{}': '{}' is not a number", name, text));
  return full({}, d, dtype);
}

void check_unique_input_names(const std::vector<std::string>& names) {
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (names[i] == names[j])
        throw ValueError(fmt::format(
            "input '{}' is given more than once; if you wrote a sweep like {}=random:1x3x48x{{160,320}}, quote it "
            "('{}=random:1x3x48x{{160,320}}'): an unquoted {{a,b}} is expanded by the shell into separate words",
            names[i], names[i], names[i]));
}

std::vector<std::vector<int64_t>> expand_shape_sweep(const std::string& spec) {
  // Split on 'x' outside braces.
  std::vector<std::vector<int64_t>> dims;
  size_t i = 0;
  auto bad = [&](const std::string& why) {
    return ValueError(fmt::format("bad shape '{}': {} (expected e.g. 1x3x48x320 or 1x3x48x{{160,320,480}})", spec, why));
  };
  if (spec.empty()) throw bad("empty");
  auto parse_size = [&](const std::string& tok) {
    if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos) throw bad("'" + tok + "' is not a size");
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (ec != std::errc() || ptr != tok.data() + tok.size())
      throw bad(fmt::format("size {} does not fit in 64 bits", tok));
    return v;
  };
  while (i <= spec.size()) {
    std::vector<int64_t> choices;
    if (i < spec.size() && spec[i] == '{') {
      size_t close = spec.find('}', i);
      if (close == std::string::npos) throw bad("unclosed '{'");
      std::string body = spec.substr(i + 1, close - i - 1);
      size_t p = 0;
      while (p <= body.size()) {
        size_t c = body.find(',', p);
        std::string tok = body.substr(p, c == std::string::npos ? std::string::npos : c - p);
        choices.push_back(parse_size(tok));
        if (c == std::string::npos) break;
        p = c + 1;
      }
      i = close + 1;
    } else {
      size_t end = spec.find('x', i);
      std::string tok = spec.substr(i, end == std::string::npos ? std::string::npos : end - i);
      choices.push_back(parse_size(tok));
      i = end == std::string::npos ? spec.size() : end;
    }
    dims.push_back(choices);
    if (i >= spec.size()) break;
    if (spec[i] != 'x') throw bad("expected 'x' between sizes");
    ++i;
    if (i == spec.size()) throw bad("trailing 'x'");
  }
  // Every shape of the sweep is built (and later run) before anything else: a product of lists
  // like {1,..,10}x{1,..,10}x... is refused by its count before it exhausts memory.
  constexpr uint64_t kMaxShapes = 100000;
  uint64_t count = 1;
  for (const auto& ch : dims) {
    count *= ch.size();
    if (count > kMaxShapes)
      throw bad(fmt::format("the sweep has more than {} shapes (the product of its lists' lengths); run fewer at a time",
                            kMaxShapes));
  }
  std::vector<std::vector<int64_t>> out{{}};
  for (const auto& ch : dims) {
    std::vector<std::vector<int64_t>> next;
    for (const auto& prefix : out)
      for (int64_t c : ch) {
        auto v = prefix;
        v.push_back(c);
        next.push_back(std::move(v));
      }
    out = std::move(next);
  }
  return out;
}

void add_run_command(CLI::App& app, RunArgs& a) {
  auto* run = app.add_subcommand("run", "run an ONNX model through the JIT");
  run->add_option("model", a.model, "path to a .onnx file")->required();
  run->add_option("inputs", a.inputs,
                  "inputs: NAME=file.npy | NAME=image.png (with --preprocess) | NAME=random:1x3x48x{160,320} | "
                  "NAME=scalar:16000");
  run->add_option("--backend", a.backend, "auto (cpu, compiling in the background; cuda for --device cuda) | eager | "
                                          "interp | cpu | cuda")
      ->capture_default_str();
  run->add_option("--device", a.device, "cpu | cuda | cuda:N: inputs are moved there before the calls (the model's "
                                        "weights are uploaded once by backend cuda); outputs are read back")
      ->capture_default_str();
  run->add_option("--float-dtype", a.float_dtype, "f32 | bf16 | f16: run the model's float32 weights, constants and inputs "
                                                  "in this type (onnx::LoadOptions::float_dtype)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  run->add_option("--dynamic", a.dynamic, "auto | on | off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off", "true", "false"}));
  run->add_option("--preprocess", a.preprocess, "ocr-rec | ocr-det (for image inputs)")
      ->check(CLI::IsMember({"ocr-rec", "ocr-det"}));
  run->add_option("--threads", a.threads, "intra-op threads (default: all cores)")->check(CLI::Range(1, 4096));
  run->add_option("--repeat", a.repeat, "calls per input shape")->capture_default_str()->check(CLI::Range(1, 1000000000));
  run->add_option("--warmup", a.warmup, "untimed calls per shape before the timed ones")->capture_default_str()->check(CLI::Range(0, 1000000000));
  run->add_option("--seed", a.seed, "seed for random inputs")->capture_default_str();
  run->add_option("--trace-dir", a.trace_dir, "write a structured compile trace here (see protean report)");
  run->add_option("--job-id", a.job_id, "PGO job id (profiles persist dynamic-shape decisions across runs)");
  run->add_option("--stats-json", a.stats_json, "write compiles, recompile reasons, cache hits and latencies here");
  run->add_option("--save-outputs", a.save_outputs, "write each output as DIR/<output name>.npy");
  run->add_flag("--eager", a.eager, "run the model op by op without compiling (reference)");
  run->add_flag("-q,--quiet", a.quiet, "only the summary");
  run->add_flag("--no-regions", a.no_regions,
                "compile the model's repeated blocks inline (one flat graph) instead of once each as regions");
}

int run_command(const RunArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (!a.trace_dir.empty()) observe::set_trace_dir(a.trace_dir);
  if (!a.job_id.empty()) {
    dynamic::check_job_id(a.job_id, "--job-id");
    ::setenv("PROTEAN_JOB_ID", a.job_id.c_str(), 1);
  }
  if (a.repeat < 1) throw ValueError("--repeat must be at least 1");
  manual_seed(static_cast<uint64_t>(a.seed));

  // Output paths are checked before the model runs, not after.
  if (!a.save_outputs.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(a.save_outputs, ec) && !std::filesystem::is_directory(a.save_outputs, ec))
      throw ValueError(fmt::format("--save-outputs '{}' is a file; it must be a directory (it is created if missing)",
                                   a.save_outputs));
    std::filesystem::create_directories(a.save_outputs, ec);
    if (ec) throw RuntimeError(fmt::format("--save-outputs '{}': cannot create the directory: {}", a.save_outputs, ec.message()));
    check_writable_dir(a.save_outputs, "--save-outputs");
  }
  if (!a.stats_json.empty()) {
    const std::filesystem::path parent = std::filesystem::path(a.stats_json).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
      throw ValueError(fmt::format("--stats-json '{}': directory '{}' does not exist", a.stats_json, parent.string()));
    check_writable_file(a.stats_json, "--stats-json");
  }
  onnx::LoadOptions load_options;
  load_options.float_dtype = parse_dtype(a.float_dtype);
  {
    const Device d = parse_device(a.device);  // weights on the device once, at load
    if (d.type != DeviceType::CPU && cuda_is_available()) load_options.device = d;
  }
  auto model = onnx::load(a.model, load_options);
  std::vector<InputSpec> specs;
  for (const auto& s : a.inputs) specs.push_back(parse_input(s, *model, a.preprocess));
  {
    std::vector<std::string> names;
    for (const auto& s : specs) names.push_back(s.name);
    check_unique_input_names(names);
  }
  // Every model input needs a spec.
  for (const auto& n : model->input_names())
    if (std::none_of(specs.begin(), specs.end(), [&](const InputSpec& s) { return s.name == n; }))
      throw ValueError(fmt::format("no value for the model's input '{}' (declared {}); pass {}=...", n,
                                   model->inputs()[static_cast<size_t>(std::find(model->input_names().begin(),
                                                                                  model->input_names().end(), n) -
                                                                        model->input_names().begin())]
                                       .str(),
                                   n));
  size_t points = 1;
  for (const auto& s : specs)
    if (!s.sweep.empty()) points = std::max(points, s.sweep.size());
  for (const auto& s : specs)
    if (!s.sweep.empty() && s.sweep.size() != points && s.sweep.size() != 1)
      throw ValueError("random sweeps of different lengths cannot be combined");

  const Device device = parse_device(a.device);
  if (device.type != DeviceType::CPU && !cuda_is_available())
    throw RuntimeError(fmt::format("--device {}: {}", a.device, protean::cuda::driver_unavailable_reason()));
  CompileOptions opts;
  opts.name = model->identity();
  opts.arg_names = model->input_names();
  opts.backend = a.backend;
  opts.dynamic = parse_dynamic(a.dynamic);
  opts.file = model->path();
  opts.auto_regions = !a.no_regions;
  auto fn = [model](const std::vector<Tensor>& xs) { return model->forward(xs); };
  // Models with up to three inputs get one tensor parameter per ONNX input, so sources (guards,
  // recompile reasons, PGO entries) carry the ONNX input names; larger models pass a list (`xs[i]`).
  using Runner = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  Runner compiled;
  switch (model->input_names().size()) {
    case 1: {
      auto c = compile([model](const Tensor& a) { return model->forward({a}); }, opts);
      compiled = [c](const std::vector<Tensor>& xs) { return c(xs.at(0)); };
      break;
    }
    case 2: {
      auto c = compile([model](const Tensor& a, const Tensor& b) { return model->forward({a, b}); }, opts);
      compiled = [c](const std::vector<Tensor>& xs) { return c(xs.at(0), xs.at(1)); };
      break;
    }
    case 3: {
      auto c = compile([model](const Tensor& a, const Tensor& b, const Tensor& d) { return model->forward({a, b, d}); },
                       opts);
      compiled = [c](const std::vector<Tensor>& xs) { return c(xs.at(0), xs.at(1), xs.at(2)); };
      break;
    }
    default: {
      auto c = compile(fn, opts);
      compiled = [c](const std::vector<Tensor>& xs) { return c(xs); };
      break;
    }
  }

  nlohmann::json calls = nlohmann::json::array();
  auto t_start = Clock::now();
  bool show_progress = false;
  std::vector<Tensor> last_outputs;
  for (size_t p = 0; p < points; ++p) {
    std::vector<Tensor> xs;
    std::vector<std::string> shapes;
    for (const auto& n : model->input_names()) {
      const InputSpec& s = *std::find_if(specs.begin(), specs.end(), [&](const InputSpec& x) { return x.name == n; });
      Tensor t;
      if (!s.fixed.empty()) t = s.fixed[0];
      else {
        const IntVec& shape = s.sweep.size() == 1 ? s.sweep[0] : s.sweep[p];
        t = is_floating(s.dtype) ? (rand(shape, s.dtype) * 2.0 - 1.0) : randint(0, 2, shape, s.dtype);
      }
      shapes.push_back(shape_str(t.int_sizes()));
      xs.push_back(device.type == DeviceType::CPU ? t : t.to(device));
    }
    for (int w = 0; w < a.warmup; ++w) (void)(a.eager ? fn(xs) : compiled(xs));
    std::vector<double> lat, cpu, thread_cpu;
    for (int r = 0; r < a.repeat; ++r) {
      double c0 = process_cpu_ms(), tc0 = observe::thread_cpu_seconds();
      auto t0 = Clock::now();
      last_outputs = a.eager ? fn(xs) : compiled(xs);
      if (device.type != DeviceType::CPU)  // the call is done when its results are readable on the host
        for (auto& o : last_outputs) o = o.cpu();
      lat.push_back(ms_since(t0));
      cpu.push_back(process_cpu_ms() - c0);
      thread_cpu.push_back((observe::thread_cpu_seconds() - tc0) * 1e3);
    }
    nlohmann::json out_shapes = nlohmann::json::array();
    for (const auto& o : last_outputs) out_shapes.push_back(shape_str(o.int_sizes()));
    double med = median(lat);
    calls.push_back({{"inputs", shapes},
                     {"latencies_ms", lat},
                     {"median_ms", med},
                     {"cpu_ms", cpu},
                     {"median_cpu_ms", median(cpu)},
                     {"thread_cpu_ms", thread_cpu},  // the calling thread only: the critical path
                     {"outputs", out_shapes}});
    if (!a.quiet && !show_progress)
      std::cout << fmt::format("{}: {} -> {}  median {:.3f} ms over {} call(s)\n", p, fmt::join(shapes, ", "),
                               out_shapes.dump(), med, lat.size());
    if (points > 1 && ms_since(t_start) > 1000 && !a.quiet) {
      show_progress = isatty(2);
      if (show_progress) progress(p + 1, points, ms_since(t_start));
    }
  }
  if (show_progress) std::cerr << "\n";

  if (!a.save_outputs.empty()) {
    // Output names become file names ('/' as '_'); two names that meet get their output index appended
    // (`a_b.npy` and `a_b.1.npy`), so no output overwrites another.
    std::set<std::string> used;
    for (size_t i = 0; i < last_outputs.size(); ++i) {
      std::string name = model->output_names()[i];
      std::replace(name.begin(), name.end(), '/', '_');
      if (name.empty() || name == "." || name == "..") name = fmt::format("output{}", i);
      if (!used.insert(name).second) {
        name = fmt::format("{}.{}", name, i);
        used.insert(name);
      }
      save_npy(a.save_outputs + "/" + name + ".npy", last_outputs[i]);
    }
  }
  Stats st = stats();
  std::cout << fmt::format("compiles: {} (recompiles {}), cache hits: {}, graph breaks: {}\n", st.compiles,
                           st.recompiles, st.cache_hits, st.graph_breaks);
  for (const onnx::RegionInfo& r : model->regions())
    std::cout << fmt::format("region {}: {} uses of {} nodes{}\n", r.type, r.uses, r.nodes,
                             a.no_regions || a.eager ? " (traced inline: --no-regions or --eager)" : "");
  if (!model->regions().empty() && !a.no_regions && !a.eager)
    std::cout << fmt::format("region compiles: {} (variants traced), region hits: {}\n", st.region_compiles,
                             st.region_hits);
  for (const auto& [reason, n] : st.recompile_reasons) std::cout << fmt::format("  recompile x{}: {}\n", n, reason);
  if (!a.stats_json.empty()) {
    nlohmann::json j;
    j["model"] = a.model;
    j["identity"] = model->identity();
    j["backend"] = a.eager ? "none (eager)" : a.backend;
    j["device"] = a.device;
    j["dynamic"] = a.dynamic;
    j["threads"] = num_threads();
    j["calls"] = calls;
    j["stats"] = nlohmann::json::parse(st.to_json());
    j["regions"] = nlohmann::json::array();
    for (const onnx::RegionInfo& r : model->regions())
      j["regions"].push_back({{"type", r.type}, {"uses", r.uses}, {"nodes", r.nodes}, {"weights", r.weights},
                              {"sites", r.sites}, {"compiled", !a.no_regions && !a.eager}});
    j["phase_cpu_seconds"] = capture::phase_cpu_seconds();
    j["dnnl"] = nlohmann::json::parse(ops::dnnl_stats_json());
    j["kernel_cache"] = nlohmann::json::parse(cache::kernel_cache_stats_json());
    j["program_cache"] = nlohmann::json::parse(cache::program_cache_stats_json());
    // written beside and renamed over: a failed write leaves an earlier file as it was
    const std::string tmp = a.stats_json + ".tmp";
    std::ofstream f(tmp);
    if (!f) throw RuntimeError(fmt::format("cannot write --stats-json file '{}': {}", tmp, std::strerror(errno)));
    f << j.dump(2) << "\n";
    f.close();  // the buffered tail is written here: a full disk shows only now
    std::error_code ec;
    if (!f) {
      const int e = errno;
      std::filesystem::remove(tmp, ec);
      throw RuntimeError(fmt::format("writing --stats-json file '{}' failed: {}", a.stats_json, std::strerror(e)));
    }
    std::filesystem::rename(tmp, a.stats_json, ec);
    if (ec) {
      std::error_code rec;
      std::filesystem::remove(tmp, rec);
      throw RuntimeError(fmt::format("cannot write --stats-json file '{}': {}", a.stats_json, ec.message()));
    }
  }
  return 0;
}

}  // namespace protean::tools
