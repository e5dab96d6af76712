#include "backend/cuda/autotune.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cuda/blas.h"
#include "core/files.h"
#include "dynamic/profile_store.h"
#include "observe/env.h"
#include "observe/log.h"
#include "protean/error.h"

namespace protean::backend::cuda {

int pick_winner(std::span<const double> us, double min_gain) {
  auto ran = [](double t) { return std::isfinite(t) && t >= 0; };
  int best = -1;
  for (size_t i = 0; i < us.size(); ++i)
    if (ran(us[i]) && (best < 0 || us[i] < us[static_cast<size_t>(best)])) best = static_cast<int>(i);
  if (best < 0) return 0;                 // nothing ran: keep the default
  if (us.empty() || !ran(us[0])) return best;
  return us[static_cast<size_t>(best)] <= us[0] * (1.0 - min_gain) ? best : 0;
}

std::string TuningTable::key(std::string_view device, std::string_view kind, uint64_t hash, std::string_view bucket) {
  return fmt::format("{}|{}|{:016x}|{}", device, kind, hash, bucket);
}

std::optional<TuneEntry> TuningTable::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void TuningTable::put(const std::string& key, const TuneEntry& e) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = e;
}

size_t TuningTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::string TuningTable::dump() const {
  nlohmann::json j;
  j["version"] = 1;
  nlohmann::json& e = j["entries"] = nlohmann::json::object();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, v] : entries_)
    e[k] = {{"choice", v.choice}, {"candidates", v.candidates}, {"default_us", v.default_us}, {"best_us", v.best_us}};
  return j.dump(1);
}

TuningTable TuningTable::parse(const std::string& text, const std::string& what, std::vector<std::string>* skipped) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(fmt::format("tuning table {}: not JSON ({})", what, e.what()));
  }
  if (!j.is_object() || !j.contains("version") || j["version"] != 1 || !j.contains("entries") || !j["entries"].is_object())
    throw FormatError(fmt::format("tuning table {}: expected {{\"version\": 1, \"entries\": {{...}}}}", what));
  TuningTable t;
  for (const auto& [k, v] : j["entries"].items()) {
    try {
      t.entries_[k] = parse_entry(k, v, what);
    } catch (const FormatError& e) {
      if (!skipped) throw;
      skipped->push_back(e.what());
    }
  }
  return t;
}

TuneEntry TuningTable::parse_entry(const std::string& k, const nlohmann::json& v, const std::string& what) {
  auto integer = [&](const char* f) {
    if (!v.is_object() || !v.contains(f) || !v[f].is_number_integer() || v[f].get<int64_t>() < 0 ||
        v[f].get<int64_t>() > 1024)
      throw FormatError(fmt::format("tuning table {}: entry '{}': '{}' is not an integer in [0, 1024]", what, k, f));
    return v[f].get<int>();
  };
  auto number = [&](const char* f) {
    if (!v.contains(f) || !v[f].is_number())
      throw FormatError(fmt::format("tuning table {}: entry '{}': '{}' is not a number", what, k, f));
    return v[f].get<double>();
  };
  TuneEntry e{integer("choice"), integer("candidates"), number("default_us"), number("best_us")};
  if (e.choice >= std::max(e.candidates, 1))
    throw FormatError(fmt::format("tuning table {}: entry '{}': choice {} of {} candidates", what, k, e.choice, e.candidates));
  return e;
}

namespace {

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

void TuningTable::load(const std::string& path) {
  const std::optional<std::string> text = read_text(path);
  if (!text) return;
  try {
    std::vector<std::string> skipped;
    TuningTable t = parse(*text, path, &skipped);
    if (!skipped.empty())
      observe::warn(fmt::format("max-autotune: {} (and {} more bad entries) skipped; the table's other entries are used and "
                                "kept", skipped.front(), skipped.size() - 1));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [k, v] : t.entries_) entries_.emplace(k, v);
  } catch (const FormatError& e) {
    observe::warn(fmt::format("max-autotune: {}; ignored (kept as {}.corrupt-<timestamp> when the next tuning results "
                              "replace it)", e.what(), path));
  }
}

void TuningTable::save(const std::string& path) const {
  namespace fs = std::filesystem;
  try {
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    core::FileLock lock(path + ".lock", "tuning table");
    TuningTable merged;
    if (const std::optional<std::string> text = read_text(path)) {
      std::vector<std::string> skipped;  // bad entries are dropped, the others kept
      try {
        merged = parse(*text, path, &skipped);
      } catch (const FormatError&) {  // not a table at all: kept aside, then replaced below
        if (fs::is_regular_file(path)) core::backup_corrupt_file(path, "max-autotune tuning table");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [k, v] : entries_) merged.entries_[k] = v;
    }
    core::write_file_atomic(path, merged.dump() + "\n", "max-autotune tuning table");
  } catch (const Error& e) {
    observe::warn(fmt::format("max-autotune: the tuning table {} was not written: {}", path, e.what()));
  }
}

std::string tuning_path() {
  const dynamic::PgoConfig c = dynamic::PgoConfig::from_env();
  if (!c.job_id.empty()) return c.job_dir() + "/tuning.json";
  return c.cache_dir + "/tuning.json";
}

namespace {
std::mutex g_table_mu;
std::unique_ptr<TuningTable> g_table;
std::mutex g_stats_mu;
AutotuneStats g_stats;
std::mutex g_timer_mu;
AutotuneTimer g_timer;
}  // namespace

TuningTable& process_tuning_table() {
  std::lock_guard<std::mutex> lock(g_table_mu);
  if (!g_table) {
    g_table = std::make_unique<TuningTable>();
    g_table->load(tuning_path());
  }
  return *g_table;
}

void reset_process_tuning_table() {
  std::lock_guard<std::mutex> lock(g_table_mu);
  g_table.reset();
}

double autotune_budget_ms() {
  const char* e = std::getenv("PROTEAN_AUTOTUNE_BUDGET_MS");
  if (!e || !*e) return 5000;
  char* end = nullptr;
  const double v = std::strtod(e, &end);
  if (end == e || *end != '\0' || !std::isfinite(v) || v <= 0)
    throw ValueError(fmt::format("PROTEAN_AUTOTUNE_BUDGET_MS={}: expected a positive number of milliseconds", e));
  return v;
}

int autotune_blas_algorithms() {
  return static_cast<int>(observe::env_int("PROTEAN_AUTOTUNE_BLAS_ALGOS", 8, 1, kBlasHeuristicAlgorithms));
}

int autotune_blas_one_kernel() {
  return static_cast<int>(observe::env_int("PROTEAN_AUTOTUNE_BLAS_ONE_KERNEL", 0, 0, kBlasOneKernelAlgorithms));
}

bool autotune_generated_products() { return observe::env_opt_in("PROTEAN_AUTOTUNE_GENERATED_PRODUCTS"); }

AutotuneStats autotune_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  return g_stats;
}

void reset_autotune_stats() {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  g_stats = {};
}

void count_autotune(const AutotuneStats& a) {
  std::lock_guard<std::mutex> lock(g_stats_mu);
  g_stats.buckets_tuned += a.buckets_tuned;
  g_stats.sites_tuned += a.sites_tuned;
  g_stats.sites_from_table += a.sites_from_table;
  g_stats.sites_over_budget += a.sites_over_budget;
  g_stats.candidates_timed += a.candidates_timed;
  g_stats.sites_changed += a.sites_changed;
  g_stats.tuning_ms += a.tuning_ms;
  g_stats.variant_kernels += a.variant_kernels;
  g_stats.variant_entries += a.variant_entries;
  g_stats.variant_nvrtc += a.variant_nvrtc;
  g_stats.variant_compile_ms += a.variant_compile_ms;
}

void set_autotune_timer_for_testing(AutotuneTimer timer) {
  std::lock_guard<std::mutex> lock(g_timer_mu);
  g_timer = std::move(timer);
}

AutotuneTimer autotune_timer_for_testing() {
  std::lock_guard<std::mutex> lock(g_timer_mu);
  return g_timer;
}

}  // namespace protean::backend::cuda
