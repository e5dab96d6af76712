// `protean run` and `protean demo`.
#pragma once

#include <string>
#include <vector>

#include "protean/tensor.h"

namespace CLI {
class App;
}

namespace protean::tools {

struct RunArgs {
  std::string model;
  std::vector<std::string> inputs;  // name=file.npy | name=image.png | name=random:1x3x48x{160,320} | name=scalar:16000
  std::string backend = "auto";  // CompileOptions::backend's default: cpu, compiling in the background
  std::string dynamic = "auto";
  std::string device = "cpu";  // cpu | cuda | cuda:N: where inputs live (and so what backend auto picks)
  std::string float_dtype = "f32";  // onnx::LoadOptions::float_dtype: f32 | bf16 | f16
  std::string preprocess;  // "", "ocr-rec", "ocr-det"
  int threads = 0;
  int repeat = 1;
  int warmup = 0;
  int seed = 0;
  std::string trace_dir;
  std::string job_id;
  std::string stats_json;
  std::string save_outputs;
  bool eager = false;  // run the model without compiling (reference path)
  bool quiet = false;
  bool no_regions = false;  // CompileOptions::auto_regions off: repeated blocks traced inline
};
void add_run_command(CLI::App& app, RunArgs& args);
int run_command(const RunArgs& args);

struct DemoArgs {
  std::string backend = "auto";  // CompileOptions::backend's default: cpu, compiling in the background
  std::string dynamic = "auto";
  std::string device = "cpu";  // cpu | cuda | cuda:N
  std::string job_id;
  std::string trace_dir;
  std::string models_dir;
  int threads = 0;
  bool det = false;
};
void add_demo_command(CLI::App& app, DemoArgs& args);
int demo_command(const DemoArgs& args);

/// Expands "1x3x48x{160,320,480}" into every concrete shape (cartesian product of brace lists).
/// Throws protean::ValueError on a malformed spec.
std::vector<std::vector<int64_t>> expand_shape_sweep(const std::string& spec);

/// The 0-d tensor of `dtype` that `NAME=scalar:TEXT` stands for. Throws ValueError naming the input
/// when TEXT is not a number, not an integer for an integer input, or out of the dtype's range.
Tensor parse_scalar_input(const std::string& name, const std::string& text, DType dtype);

/// Throws ValueError when an input name is given twice (`x=a.npy x=b.npy`, or an unquoted
/// `x=random:1x{160,320}` that the shell expanded into two words).
void check_unique_input_names(const std::vector<std::string>& names);

}  // namespace protean::tools
