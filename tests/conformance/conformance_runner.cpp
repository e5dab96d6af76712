// ONNX backend conformance runner: every model of ONNX's backend test data (Debian libonnx-testdata,
// /usr/share/libonnx-testdata/data/{node,pytorch-converted,pytorch-operator,simple}) through
// protean::onnx::load + protean::compile on one backend, each model in a child process of its own, and
// its outputs compared with the expected TensorProtos. No Python: inputs and outputs are read with the
// ONNX library's protobuf classes and converted by the importer's own TensorProto conversion.
//
//   protean_conformance [--data DIR] --suite node [--suite simple ...] [--backend interp|cpu|eager]
//                       [--filter REGEX] [--list FILE] [--shard K/N] [--jobs N] [--timeout S]
//                       [--dynamic auto|on|off]
//                       [--expected FILE] [--write-expected FILE] [--json FILE] [--verbose]
//
// Each test ends as one of
//   pass     every output of every test_data_set has the expected dtype, shape and values
//            (|got - want| <= atol + rtol * |want|, ONNX's backend-test defaults rtol 1e-3, atol 1e-7;
//            NaN equals NaN; integers and bools exactly); a model with a random op (Bernoulli,
//            RandomUniform[Like], RandomNormal[Like], Multinomial) has expected values drawn from
//            NumPy's generator, which no other generator reproduces: there only the dtype, the shape
//            and, where every expected value is 0 or 1 (Bernoulli), that every value is 0 or 1 are
//            checked (the unit tests check the mean over many draws);
//   wrong    the model ran but an output differs (a silent wrong answer: always a failure);
//   error    Protean refused the model or an input with a protean::Error (unsupported op, opset...);
//   crash    the child died on a signal, exited without a result, or threw something that is not a
//            protean::Error (every bad input must give a protean::Error);
//   hang     the child ran past --timeout and was killed;
//   skipped  the test needs values the public API has no type for: sequence, optional or map inputs or
//            outputs, or string tensors.
// The exit status is 1 when any test crashed, hung or was wrong, or when a test named in --expected
// (one `suite/test` per line, `#` comments) did not pass; 0 otherwise. A summary line per suite gives
// the counts, the pass rate over the tests not skipped, and the summed load and first-run times.
// `eager` runs Model::forward directly (no capture), for comparison. --list runs only the tests a file
// names (`suite/test` per line), --shard K/N every N-th of the selected tests.
#include <fcntl.h>
#include <fmt/format.h>
#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <typeinfo>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "frontends/onnx/loader.h"
#include "protean/compile.h"
#include "protean/error.h"
#include "protean/onnx.h"
#include "protean/ops.h"

namespace fs = std::filesystem;
namespace pt = protean;

namespace {

enum class Outcome { Pass, Wrong, Error, Crash, Hang, Skipped };
constexpr int kNumOutcomes = 6;
const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::Pass: return "pass";
    case Outcome::Wrong: return "wrong";
    case Outcome::Error: return "error";
    case Outcome::Crash: return "crash";
    case Outcome::Hang: return "hang";
    case Outcome::Skipped: return "skipped";
  }
  return "?";
}
std::optional<Outcome> outcome_from(const std::string& s) {
  for (int i = 0; i < kNumOutcomes; ++i)
    if (s == outcome_name(static_cast<Outcome>(i))) return static_cast<Outcome>(i);
  return std::nullopt;
}

struct Case {
  std::string suite, name, dir;
  std::string id() const { return suite + "/" + name; }
};

struct Result {
  Outcome outcome = Outcome::Crash;
  std::string reason;
  double load_s = 0, run_s = 0;  // load (parse + import + fold) and first run (incl. compile)
};

struct Options {
  std::string data = "/usr/share/libonnx-testdata/data";
  std::vector<std::string> suites;
  std::string backend = "interp";
  std::string filter;
  int shard = 0, shards = 1, jobs = 1;
  double timeout_s = 120;
  double rtol = 1e-3, atol = 1e-7;
  std::string expected, write_expected, json, list;
  bool verbose = false;
  pt::Dynamic dynamic = pt::Dynamic::Auto;
};

std::string one_line(std::string s, size_t max = 400) {
  for (char& c : s)
    if (c == '\n' || c == '\t' || c == '\r') c = ' ';
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

// ---- the child: load, run, compare ----------------------------------------------------------------------
bool read_proto(const fs::path& p, google::protobuf::MessageLite& m) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return m.ParseFromString(bytes);
}

/// Tests whose expected data follows an outdated reference: reported as errors with the reason, never
/// compared (Protean follows the current ONNX spec there).
const std::map<std::string, std::string>& divergent_data() {
  static const std::map<std::string, std::string> m = {
      {"test_cast_FLOAT_to_BFLOAT16",
       "the expected data truncates float to bfloat16 (ONNX 1.12's reference); the ONNX spec (since 1.14) and "
       "ONNX Runtime round to nearest even, as Protean does"},
  };
  return m;
}

/// ONNX's test data stores a bfloat16 tensor as its uint16 bit patterns (NumPy has no bfloat16): when
/// the model declares the value as bfloat16 and the file holds uint16, the file's bits are read as
/// bfloat16 (the same convention as `.npy` files; docs/onnx.md).
void bf16_from_bits(::onnx::TensorProto& tp, int32_t declared) {
  if (declared == ::onnx::TensorProto::BFLOAT16 && tp.data_type() == ::onnx::TensorProto::UINT16)
    tp.set_data_type(::onnx::TensorProto::BFLOAT16);
}

/// Why the public API cannot express this model's inputs/outputs ("" when it can).
std::string skip_reason(const ::onnx::ModelProto& mp) {
  std::set<std::string> inits;
  for (const auto& t : mp.graph().initializer()) inits.insert(t.name());
  auto check = [&](const ::onnx::ValueInfoProto& vi, const char* what) -> std::string {
    if (!vi.has_type()) return "";
    const auto& t = vi.type();
    // An optional tensor is Model::forward's undefined Tensor when empty; an optional sequence has no type.
    const char* kind = t.has_sequence_type() ? "a sequence"
                       : (t.has_optional_type() && !t.optional_type().elem_type().has_tensor_type())
                           ? "an optional of a non-tensor"
                       : t.has_map_type()      ? "a map"
                       : (t.has_tensor_type() && t.tensor_type().elem_type() == ::onnx::TensorProto::STRING)
                           ? "a string tensor"
                           : nullptr;
    return kind ? fmt::format("{} '{}' is {}", what, vi.name(), kind) : "";
  };
  for (const auto& in : mp.graph().input())
    if (!inits.count(in.name()))
      if (std::string r = check(in, "input"); !r.empty()) return r;
  for (const auto& out : mp.graph().output())
    if (std::string r = check(out, "output"); !r.empty()) return r;
  return "";
}

std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> r;
  for (int i = 0;; ++i) {
    fs::path p = dir / fmt::format("{}_{}.pb", prefix, i);
    if (!fs::exists(p)) break;
    r.push_back(p);
  }
  return r;
}

/// "" when `got` matches `want`, else what differs.
std::string compare(const pt::Tensor& got, const pt::Tensor& want, double rtol, double atol) {
  if (!got.defined()) return "output is undefined";
  if (got.dtype() != want.dtype())
    return fmt::format("dtype {} (expected {})", pt::short_name(got.dtype()), pt::short_name(want.dtype()));
  if (got.dim() != want.dim() || pt::to_string(got.sizes()) != pt::to_string(want.sizes()))
    return fmt::format("shape {} (expected {})", pt::to_string(got.sizes()), pt::to_string(want.sizes()));
  pt::Tensor g = got.contiguous(), w = want.contiguous();
  if (pt::is_floating(want.dtype())) {
    std::vector<double> a = g.to_vector<double>(), b = w.to_vector<double>();
    double worst = 0;
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::isnan(a[i]) && std::isnan(b[i])) continue;
      if (std::isinf(b[i]) && a[i] == b[i]) continue;
      double err = std::abs(a[i] - b[i]);
      if (!(err <= atol + rtol * std::abs(b[i]))) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
        worst = std::max(worst, std::isnan(err) ? INFINITY : err);
      }
    }
    if (bad)
      return fmt::format("{} of {} values differ, max abs error {:.3g}; first at flat index {}: {} (expected {})", bad,
                         a.size(), worst, first, a[first], b[first]);
    return "";
  }
  std::vector<int64_t> a = g.to_vector<int64_t>(), b = w.to_vector<int64_t>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  if (bad)
    return fmt::format("{} of {} values differ; first at flat index {}: {} (expected {})", bad, a.size(), first,
                       a[first], b[first]);
  return "";
}

/// True when the model (or a subgraph) has a random op: its expected values cannot be reproduced.
bool has_random_op(const ::onnx::GraphProto& g) {
  static const std::set<std::string> kRandom = {"Bernoulli", "RandomUniform", "RandomUniformLike", "RandomNormal",
                                                "RandomNormalLike", "Multinomial"};
  for (const auto& n : g.node()) {
    if (kRandom.count(n.op_type())) return true;
    // Dropout given a training_mode input draws its mask (unless the ratio is 0, which the check allows).
    if (n.op_type() == "Dropout" && n.input_size() >= 3 && !n.input(2).empty()) return true;
    for (const auto& a : n.attribute()) {
      if (a.has_g() && has_random_op(a.g())) return true;
      for (const auto& sg : a.graphs())
        if (has_random_op(sg)) return true;
    }
  }
  return false;
}

/// The check of a random op's output: dtype, shape and, when every expected value is 0 or 1, that every
/// value is 0 or 1.
std::string compare_random(const pt::Tensor& got, const pt::Tensor& want) {
  if (!got.defined()) return "output is undefined";
  if (got.dtype() != want.dtype())
    return fmt::format("dtype {} (expected {})", pt::short_name(got.dtype()), pt::short_name(want.dtype()));
  if (pt::to_string(got.sizes()) != pt::to_string(want.sizes()))
    return fmt::format("shape {} (expected {})", pt::to_string(got.sizes()), pt::to_string(want.sizes()));
  std::vector<double> b = want.contiguous().to_vector<double>();
  bool binary = std::all_of(b.begin(), b.end(), [](double v) { return v == 0.0 || v == 1.0; });
  if (!binary) return "";
  std::vector<double> a = got.contiguous().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != 0.0 && a[i] != 1.0) return fmt::format("value {} at flat index {} (expected 0 or 1)", a[i], i);
  return "";
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Result run_case(const Case& c, const Options& o) {
  Result r;
  fs::path dir(c.dir);
  ::onnx::ModelProto mp;
  if (!read_proto(dir / "model.onnx", mp)) {
    r.outcome = Outcome::Error;
    r.reason = "model.onnx does not parse as a ModelProto";
    return r;
  }
  if (auto it = divergent_data().find(dir.filename().string()); it != divergent_data().end()) {
    r.outcome = Outcome::Error;
    r.reason = it->second;
    return r;
  }
  if (std::string why = skip_reason(mp); !why.empty()) {
    r.outcome = Outcome::Skipped;
    r.reason = why;
    return r;
  }
  const bool random = has_random_op(mp.graph());
  auto t0 = Clock::now();
  std::shared_ptr<pt::onnx::Model> m = pt::onnx::load((dir / "model.onnx").string());
  r.load_s = seconds_since(t0);

  std::function<std::vector<pt::Tensor>(const std::vector<pt::Tensor>&)> f;
  if (o.backend == "eager") {
    f = [m](const std::vector<pt::Tensor>& xs) { return m->forward(xs); };
  } else {
    pt::CompileOptions copts;
    copts.name = c.name;
    copts.arg_names = {"inputs"};
    copts.backend = o.backend;
    copts.dynamic = o.dynamic;
    auto compiled = pt::compile([m](const std::vector<pt::Tensor>& xs) { return m->forward(xs); }, copts);
    f = [compiled](const std::vector<pt::Tensor>& xs) mutable { return compiled(xs); };
  }

  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  if (sets.empty()) {
    r.outcome = Outcome::Error;
    r.reason = "no test_data_set_* directory";
    return r;
  }
  const std::vector<std::string>& names = m->input_names();
  for (size_t s = 0; s < sets.size(); ++s) {
    std::vector<pt::Tensor> inputs(names.size());
    std::vector<fs::path> in_files = numbered(sets[s], "input");
    // Inputs by name when the TensorProto names one of the model's inputs, else in order.
    for (size_t i = 0; i < in_files.size(); ++i) {
      ::onnx::TensorProto tp;
      if (i < names.size() && m->inputs()[i].optional) {
        // An optional input's file is an OptionalProto: empty (elem_type UNDEFINED) or holding a tensor.
        ::onnx::OptionalProto op;
        if (!read_proto(in_files[i], op)) throw pt::FormatError(fmt::format("{} is not an OptionalProto", in_files[i].string()));
        if (op.elem_type() == ::onnx::OptionalProto::UNDEFINED) continue;  // the empty optional: undefined
        if (op.elem_type() != ::onnx::OptionalProto::TENSOR)
          throw pt::FormatError(fmt::format("{} holds an optional of element type {} (only tensors are read)",
                                            in_files[i].string(), static_cast<int>(op.elem_type())));
        tp = op.tensor_value();
      } else if (!read_proto(in_files[i], tp)) {
        throw pt::FormatError(fmt::format("{} is not a TensorProto", in_files[i].string()));
      }
      auto it = std::find(names.begin(), names.end(), tp.name());
      size_t k = it != names.end() ? static_cast<size_t>(it - names.begin()) : i;
      if (k >= inputs.size())
        throw pt::ValueError(fmt::format("{} has more input files ({}) than the model has inputs ({})",
                                         sets[s].string(), in_files.size(), names.size()));
      bf16_from_bits(tp, m->inputs()[k].onnx_elem_type);
      inputs[k] = pt::onnx::detail::tensor_from_proto(tp, in_files[i].string(), "test input");
    }
    auto t1 = Clock::now();
    std::vector<pt::Tensor> outs = f(inputs);
    if (s == 0) r.run_s = seconds_since(t1);
    std::vector<fs::path> out_files = numbered(sets[s], "output");
    if (out_files.size() != outs.size()) {
      r.outcome = Outcome::Wrong;
      r.reason = fmt::format("{} outputs, the test data has {}", outs.size(), out_files.size());
      return r;
    }
    for (size_t i = 0; i < out_files.size(); ++i) {
      ::onnx::TensorProto tp;
      if (m->outputs()[i].optional) {
        ::onnx::OptionalProto op;
        if (!read_proto(out_files[i], op)) throw pt::FormatError(fmt::format("{} is not an OptionalProto", out_files[i].string()));
        if (op.elem_type() == ::onnx::OptionalProto::UNDEFINED) {
          if (outs[i].defined()) {
            r.outcome = Outcome::Wrong;
            r.reason = fmt::format("{}: output {} ('{}'): a tensor, expected the empty optional",
                                   sets[s].filename().string(), i, m->output_names()[i]);
            return r;
          }
          continue;
        }
        tp = op.tensor_value();
      } else if (!read_proto(out_files[i], tp)) {
        throw pt::FormatError(fmt::format("{} is not a TensorProto", out_files[i].string()));
      }
      bf16_from_bits(tp, m->outputs()[i].onnx_elem_type);
      pt::Tensor want = pt::onnx::detail::tensor_from_proto(tp, out_files[i].string(), "expected output");
      std::string d = random ? compare_random(outs[i], want) : compare(outs[i], want, o.rtol, o.atol);
      if (!d.empty()) {
        r.outcome = Outcome::Wrong;
        r.reason = fmt::format("{}: output {} ('{}'): {}", sets[s].filename().string(), i, m->output_names()[i], d);
        return r;
      }
    }
  }
  r.outcome = Outcome::Pass;
  return r;
}

/// In the child: runs the case and writes "outcome\tload_s\trun_s\treason\n" to fd.
[[noreturn]] void child_main(const Case& c, const Options& o, int fd) {
  if (!o.verbose) {  // keep the runner's output to one line per test
    int devnull = ::open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
  }
  Result r;
  try {
    r = run_case(c, o);
  } catch (const pt::Error& e) {
    r.outcome = Outcome::Error;
    r.reason = e.what();
  } catch (const std::exception& e) {
    r.outcome = Outcome::Crash;
    r.reason = fmt::format("uncaught {} (not a protean::Error): {}", typeid(e).name(), e.what());
  } catch (...) {
    r.outcome = Outcome::Crash;
    r.reason = "uncaught non-std exception";
  }
  std::string line = fmt::format("{}\t{:.6f}\t{:.6f}\t{}\n", outcome_name(r.outcome), r.load_s, r.run_s, one_line(r.reason));
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t w = ::write(fd, p, left);
    if (w <= 0) break;
    p += w;
    left -= static_cast<size_t>(w);
  }
  ::_exit(0);
}

// ---- the parent: one child per case, bounded time ------------------------------------------------------------
struct Running {
  pid_t pid;
  int fd;
  size_t index;
  Clock::time_point start;
  std::string out;
};

Result finish(Running& r, int status, bool killed, double timeout_s) {
  Result res;
  if (killed) {
    res.outcome = Outcome::Hang;
    res.reason = fmt::format("killed after {:.0f} s", timeout_s);
    return res;
  }
  if (WIFSIGNALED(status)) {
    res.outcome = Outcome::Crash;
    res.reason = fmt::format("signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
    return res;
  }
  // outcome \t load \t run \t reason
  std::vector<std::string> parts;
  size_t pos = 0;
  std::string line = r.out;
  if (!line.empty() && line.back() == '\n') line.pop_back();
  for (int k = 0; k < 3; ++k) {
    size_t t = line.find('\t', pos);
    if (t == std::string::npos) break;
    parts.push_back(line.substr(pos, t - pos));
    pos = t + 1;
  }
  parts.push_back(line.substr(std::min(pos, line.size())));
  std::optional<Outcome> oc = parts.size() == 4 ? outcome_from(parts[0]) : std::nullopt;
  if (!oc) {
    res.outcome = Outcome::Crash;
    res.reason = fmt::format("exited with status {} without a result", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    return res;
  }
  res.outcome = *oc;
  res.load_s = std::atof(parts[1].c_str());
  res.run_s = std::atof(parts[2].c_str());
  res.reason = parts[3];
  return res;
}

std::vector<Result> run_all(const std::vector<Case>& cases, const Options& o) {
  std::vector<Result> results(cases.size());
  std::vector<Running> running;
  size_t next = 0, done = 0;
  auto report = [&](size_t i) {
    const Result& r = results[i];
    if (o.verbose || r.outcome != Outcome::Pass)
      std::printf("%-7s %s  %s\n", outcome_name(r.outcome), cases[i].id().c_str(), r.reason.c_str());
    else
      std::printf("%-7s %s\n", outcome_name(r.outcome), cases[i].id().c_str());
    std::fflush(stdout);
  };
  while (done < cases.size()) {
    while (next < cases.size() && static_cast<int>(running.size()) < o.jobs) {
      int fds[2];
      if (::pipe(fds) != 0) {
        std::perror("pipe");
        std::exit(2);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      pid_t pid = ::fork();
      if (pid < 0) {
        std::perror("fork");
        std::exit(2);
      }
      if (pid == 0) {
        ::close(fds[0]);
        child_main(cases[next], o, fds[1]);
      }
      ::close(fds[1]);
      running.push_back({pid, fds[0], next, Clock::now(), {}});
      ++next;
    }
    std::vector<pollfd> pfds;
    for (auto& r : running) pfds.push_back({r.fd, POLLIN, 0});
    ::poll(pfds.data(), pfds.size(), 100);
    for (size_t k = 0; k < running.size();) {
      Running& r = running[k];
      bool eof = false;
      if (pfds.size() > k && (pfds[k].revents & (POLLIN | POLLHUP))) {
        char buf[4096];
        ssize_t n = ::read(r.fd, buf, sizeof buf);
        if (n > 0) r.out.append(buf, static_cast<size_t>(n));
        else eof = true;
      }
      bool killed = false;
      if (!eof && seconds_since(r.start) > o.timeout_s) {
        ::kill(r.pid, SIGKILL);
        killed = true;
      }
      if (eof || killed) {
        int status = 0;
        ::waitpid(r.pid, &status, 0);
        ::close(r.fd);
        results[r.index] = finish(r, status, killed, o.timeout_s);
        report(r.index);
        ++done;
        running.erase(running.begin() + static_cast<long>(k));
        pfds.erase(pfds.begin() + static_cast<long>(std::min(k, pfds.size())));
        continue;
      }
      ++k;
    }
  }
  return results;
}

std::set<std::string> read_list(const std::string& path);

std::vector<Case> discover(const Options& o) {
  std::vector<Case> cases;
  std::optional<std::regex> re;
  if (!o.filter.empty()) re.emplace(o.filter);
  std::optional<std::set<std::string>> only;
  if (!o.list.empty()) only = read_list(o.list);
  for (const auto& suite : o.suites) {
    fs::path sd = fs::path(o.data) / suite;
    if (!fs::is_directory(sd)) {
      std::fprintf(stderr, "protean_conformance: no suite directory %s (install Debian's libonnx-testdata)\n",
                   sd.string().c_str());
      std::exit(77);  // ctest's SKIP_RETURN_CODE
    }
    std::vector<Case> here;
    for (const auto& e : fs::directory_iterator(sd))
      if (e.is_directory() && fs::exists(e.path() / "model.onnx"))
        here.push_back({suite, e.path().filename().string(), e.path().string()});
    std::sort(here.begin(), here.end(), [](const Case& a, const Case& b) { return a.name < b.name; });
    for (auto& c : here)
      if ((!re || std::regex_search(c.id(), *re)) && (!only || only->count(c.id()))) cases.push_back(std::move(c));
  }
  std::vector<Case> sharded;
  for (size_t i = 0; i < cases.size(); ++i)
    if (static_cast<int>(i % static_cast<size_t>(o.shards)) == o.shard) sharded.push_back(cases[i]);
  return sharded;
}

std::set<std::string> read_list(const std::string& path) {
  std::set<std::string> s;
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "protean_conformance: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::string line;
  while (std::getline(f, line)) {
    if (auto h = line.find('#'); h != std::string::npos) line = line.substr(0, h);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    if (b < line.size()) s.insert(line.substr(b));
  }
  return s;
}

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "protean_conformance: %s\nusage: protean_conformance [--data DIR] --suite NAME... [--backend "
               "interp|cpu|eager] [--filter REGEX] [--list FILE] [--shard K/N] [--jobs N] [--timeout S] [--expected FILE] "
               "[--write-expected FILE] [--json FILE] [--dynamic auto|on|off] [--verbose]\n",
               msg);
  std::exit(2);
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--data") o.data = val();
    else if (a == "--suite") o.suites.push_back(val());
    else if (a == "--backend") o.backend = val();
    else if (a == "--filter") o.filter = val();
    else if (a == "--jobs") o.jobs = std::max(1, std::atoi(val().c_str()));
    else if (a == "--timeout") o.timeout_s = std::atof(val().c_str());
    else if (a == "--expected") o.expected = val();
    else if (a == "--list") o.list = val();
    else if (a == "--write-expected") o.write_expected = val();
    else if (a == "--json") o.json = val();
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--dynamic") {
      std::string d = val();
      if (d == "auto") o.dynamic = pt::Dynamic::Auto;
      else if (d == "on") o.dynamic = pt::Dynamic::On;
      else if (d == "off") o.dynamic = pt::Dynamic::Off;
      else usage("--dynamic takes auto, on or off");
    }
    else if (a == "--shard") {
      std::string s = val();
      if (std::sscanf(s.c_str(), "%d/%d", &o.shard, &o.shards) != 2 || o.shards < 1 || o.shard < 0 ||
          o.shard >= o.shards)
        usage("--shard takes K/N with 0 <= K < N");
    } else usage(("unknown argument " + a).c_str());
  }
  if (o.suites.empty()) usage("no --suite given");
  if (o.backend != "interp" && o.backend != "cpu" && o.backend != "eager")
    usage("--backend must be interp, cpu or eager");
  if (o.timeout_s <= 0) usage("--timeout must be positive");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_args(argc, argv);
  std::vector<Case> cases = discover(o);
  auto t0 = Clock::now();
  std::vector<Result> results = run_all(cases, o);
  double wall = seconds_since(t0);

  std::set<std::string> expected;
  if (!o.expected.empty()) expected = read_list(o.expected);
  int failures = 0;
  std::map<std::string, std::array<int, kNumOutcomes>> counts;
  std::map<std::string, std::pair<double, double>> times;
  std::vector<std::string> regressions;
  for (const auto& s : o.suites) counts[s].fill(0);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Result& r = results[i];
    counts[cases[i].suite][static_cast<int>(r.outcome)]++;
    times[cases[i].suite].first += r.load_s;
    times[cases[i].suite].second += r.run_s;
    if (r.outcome == Outcome::Crash || r.outcome == Outcome::Hang || r.outcome == Outcome::Wrong) ++failures;
    if (expected.count(cases[i].id()) && r.outcome != Outcome::Pass) regressions.push_back(cases[i].id());
  }
  std::printf("\n== ONNX conformance on backend %s (%zu tests, shard %d/%d, %.1f s wall) ==\n", o.backend.c_str(),
              cases.size(), o.shard, o.shards, wall);
  for (const auto& [suite, c] : counts) {
    int total = 0;
    for (int v : c) total += v;
    int skipped = c[static_cast<int>(Outcome::Skipped)], pass = c[static_cast<int>(Outcome::Pass)];
    int ran = total - skipped;
    std::printf("%-18s pass %4d  wrong %3d  error %4d  crash %3d  hang %3d  skipped %3d  | %5.1f%% of %d not "
                "skipped | load %.1f s, first run %.1f s\n",
                suite.c_str(), pass, c[1], c[2], c[3], c[4], skipped, ran ? 100.0 * pass / ran : 0.0, ran,
                times[suite].first, times[suite].second);
  }
  for (const auto& id : regressions) std::printf("NOT PASSING (in the expected-pass list): %s\n", id.c_str());
  if (!o.write_expected.empty()) {
    std::ofstream f(o.write_expected);
    f << "# Tests that pass on backend " << o.backend << " (protean_conformance --write-expected).\n";
    for (size_t i = 0; i < cases.size(); ++i)
      if (results[i].outcome == Outcome::Pass) f << cases[i].id() << "\n";
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"backend\": \"" << o.backend << "\", \"wall_s\": " << wall << ", \"tests\": [";
    for (size_t i = 0; i < cases.size(); ++i) {
      std::string reason;
      for (char ch : results[i].reason) {
        if (ch == '"' || ch == '\\') reason += '\\';
        if (static_cast<unsigned char>(ch) >= 0x20) reason += ch;
      }
      f << (i ? ",\n" : "\n") << "{\"id\": \"" << cases[i].id() << "\", \"outcome\": \""
        << outcome_name(results[i].outcome) << "\", \"load_s\": " << results[i].load_s
        << ", \"run_s\": " << results[i].run_s << ", \"reason\": \"" << reason << "\"}";
    }
    f << "]}\n";
  }
  return (failures > 0 || !regressions.empty()) ? 1 : 0;
}
