#include "observe/trace.h"

#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "observe/env.h"
#include "protean/error.h"
#include "protean/version.h"

namespace protean::observe {

namespace {
struct TraceState {
  std::mutex mu;
  std::FILE* file = nullptr;
  std::string path;
  int rank = -1;
  bool env_checked = false;
};
TraceState& state() {
  static TraceState s;
  return s;
}
const auto kEpoch = std::chrono::steady_clock::now();

// The first set rank variable, parsed strictly: "abc", "-1", "1x" or "99999999999" are a ValueError
// naming the variable (atoi read them as 0, -1, 1 and a wrapped value: another rank's profile).
int env_rank() {
  for (const char* v : {"PROTEAN_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
    if (const char* s = std::getenv(v)) {
      const std::string_view text(s);
      int r = -1;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), r);
      if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || r < 0)
        throw ValueError(fmt::format("{}='{}': expected a rank, an integer from 0 to {}", v, text,
                                     std::numeric_limits<int>::max()));
      return r;
    }
  return 0;
}

void write_locked(TraceState& s, std::string_view name, nlohmann::json fields) {
  if (!s.file) return;
  nlohmann::json ev = nlohmann::json::object();
  ev["v"] = kTraceFormatVersion;
  ev["ts_us"] = trace_now_us();
  ev["pid"] = static_cast<int64_t>(::getpid());
  ev["rank"] = s.rank < 0 ? env_rank() : s.rank;
  ev["event"] = name;
  if (fields.is_object())
    for (auto it = fields.begin(); it != fields.end(); ++it) ev[it.key()] = it.value();
  std::string line;
  try {
    line = ev.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } catch (const std::exception& e) {
    line = fmt::format("{{\"v\":{},\"event\":\"trace_error\",\"message\":\"unserializable event\"}}", kTraceFormatVersion);
  }
  line += '\n';
  if (std::fwrite(line.data(), 1, line.size(), s.file) != line.size() || std::fflush(s.file) != 0) {
    std::cerr << "protean: warning: writing the trace file '" << s.path << "' failed; tracing disabled\n";
    std::fclose(s.file);
    s.file = nullptr;
  }
}

/// 16 hex digits drawn once per process: with the pid and rank it tells processes apart in the report
/// where pids repeat (containers start every run at the same pid; pids wrap).
const std::string& process_instance() {
  static const std::string id = [] {
    std::random_device rd;
    const uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                       static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) ^
                       (static_cast<uint64_t>(::getpid()) << 17);
    return fmt::format("{:016x}", r);
  }();
  return id;
}

/// The `process_start` event: Protean's version, the command line, the host name, the job and the
/// process instance.
void write_process_start_locked(TraceState& s) {
  nlohmann::json argv = nlohmann::json::array();
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(cmdline, arg, '\0')) argv.push_back(arg);
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  // The job this process is a rank of, when the launcher says: the report compares ranks only within
  // one job (several runs traced into one directory are not ranks of each other).
  std::string job;
  for (const char* v : {"PROTEAN_JOB_ID", "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "SLURM_JOB_ID"})
    if (const char* j = std::getenv(v); j && *j) {
      job = j;
      // the steps of one Slurm allocation (srun after srun) are separate jobs of ranks
      if (std::string_view(v) == "SLURM_JOB_ID")
        if (const char* st = std::getenv("SLURM_STEP_ID"); st && *st) job += std::string(".") + st;
      break;
    }
  write_locked(s, "process_start", {{"version", version()},
                                    {"argv", argv},
                                    {"host", std::string(host)},
                                    {"job", job},
                                    {"instance", process_instance()}});
}

void open_locked(TraceState& s, const std::string& dir) {
  if (s.file) {
    std::fclose(s.file);
    s.file = nullptr;
    s.path.clear();
  }
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw RuntimeError(fmt::format("trace directory '{}' (--trace-dir or PROTEAN_TRACE): cannot create it: {}", dir, ec.message()));
  if (s.rank < 0) s.rank = env_rank();
  auto now = std::chrono::system_clock::now().time_since_epoch();
  std::string path = fmt::format("{}/protean_trace_rank{}_pid{}_{}.jsonl", dir, s.rank, ::getpid(),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
  s.file = std::fopen(path.c_str(), "a");
  if (!s.file) throw RuntimeError(fmt::format("trace file '{}' (--trace-dir or PROTEAN_TRACE): cannot open it for writing", path));
  s.path = path;
  write_process_start_locked(s);
}

void check_env_locked(TraceState& s) {
  if (s.env_checked) return;
  s.env_checked = true;
  if (const char* d = std::getenv("PROTEAN_TRACE")) {
    try {
      open_locked(s, d);
    } catch (const Error& e) {
      std::cerr << "protean: warning: " << e.what() << "; tracing disabled\n";
    }
  }
}
}  // namespace

bool trace_enabled() {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  check_env_locked(s);
  return s.file != nullptr;
}

void set_trace_dir(const std::string& dir) {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.env_checked = true;
  open_locked(s, dir);
}

std::string trace_file() {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  check_env_locked(s);
  return s.path;
}

void set_trace_rank(int rank) {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  s.rank = rank;
}
int trace_rank() {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  return s.rank < 0 ? env_rank() : s.rank;
}

int64_t trace_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - kEpoch).count();
}

void trace_event(std::string_view name, nlohmann::json fields) {
  auto& s = state();
  std::lock_guard<std::mutex> lk(s.mu);
  check_env_locked(s);
  write_locked(s, name, std::move(fields));
}

namespace {
thread_local std::string tls_compile_id;
}
const std::string& trace_compile_id() { return tls_compile_id; }
TraceCompileScope::TraceCompileScope(std::string compile_id) : previous_(std::move(tls_compile_id)) {
  tls_compile_id = std::move(compile_id);
}
TraceCompileScope::~TraceCompileScope() { tls_compile_id = std::move(previous_); }

TraceSpan::TraceSpan(std::string name, nlohmann::json args)
    : name_(std::move(name)), args_(std::move(args)), start_us_(trace_now_us()) {}
TraceSpan::~TraceSpan() {
  try {
    int64_t end = trace_now_us();
    trace_event("chromium_event",
                {{"name", name_}, {"ph", "X"}, {"ts", start_us_}, {"dur", end - start_us_}, {"args", args_}});
  } catch (...) {
  }
}
double TraceSpan::seconds() const { return static_cast<double>(trace_now_us() - start_us_) * 1e-6; }

void trace_artifact(const std::string& compile_id, std::string_view kind, std::string_view name,
                    const std::string& path, const std::string& text) {
  if (!trace_enabled()) return;
  const size_t max_bytes = [] {  // read per event: artifacts are few and large; 0: no limit
    const int64_t n = env_int("PROTEAN_TRACE_ARTIFACT_MAX_BYTES", int64_t{1} << 20, 0, INT64_MAX);
    return n == 0 ? std::string::npos : static_cast<size_t>(n);
  }();
  nlohmann::json ev = {{"compile_id", compile_id}, {"kind", kind}, {"name", name}, {"path", path},
                       {"bytes", text.size()},
                       {"hash", fmt::format("{:016x}", XXH64(text.data(), text.size(), 0))}};
  if (text.size() > max_bytes) {
    ev["text"] = text.substr(0, max_bytes);
    ev["truncated"] = true;
  } else {
    ev["text"] = text;
  }
  trace_event("artifact", std::move(ev));
}

namespace {
std::mutex g_compile_cache_mu;
std::map<std::string, nlohmann::json>& compile_cache_outcomes() {
  // never destroyed: background builds note their cache lookups until the worker stops at exit
  static auto* m = new std::map<std::string, nlohmann::json>();
  return *m;
}
}  // namespace

void note_compile_cache(const std::string& compile_id, const std::string& tier, const std::string& result) {
  if (compile_id.empty() || !trace_enabled()) return;
  std::lock_guard<std::mutex> lk(g_compile_cache_mu);
  nlohmann::json& j = compile_cache_outcomes()[compile_id];
  if (!j.is_object()) j = nlohmann::json::object();
  if (!j.contains(tier)) j[tier] = result;
}

nlohmann::json take_compile_cache(const std::string& compile_id) {
  std::lock_guard<std::mutex> lk(g_compile_cache_mu);
  auto& m = compile_cache_outcomes();
  auto it = m.find(compile_id);
  if (it == m.end()) return nlohmann::json::object();
  nlohmann::json j = std::move(it->second);
  m.erase(it);
  return j;
}

}  // namespace protean::observe
