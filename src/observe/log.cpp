#include "observe/log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace protean::observe {

namespace {
// Bits 0..31: category on; bits 32..63: category at debug level.
constexpr uint64_t kUnparsed = ~0ull;
std::atomic<uint64_t> g_mask{kUnparsed};
std::mutex g_mu;
std::string* g_capture = nullptr;  // guarded by g_mu

struct CatName {
  LogCat cat;
  std::string_view name;
};
constexpr CatName kCats[] = {
    {LogCat::Dynamic, "dynamic"},       {LogCat::Recompiles, "recompiles"},
    {LogCat::RecompilesVerbose, "recompiles_verbose"}, {LogCat::Guards, "guards"},
    {LogCat::GraphBreaks, "graph_breaks"}, {LogCat::OutputCode, "output_code"},
    {LogCat::PerfHints, "perf_hints"},  {LogCat::Pgo, "pgo"},
    {LogCat::Cache, "cache"},           {LogCat::Partition, "partition"},
    {LogCat::Regions, "regions"},       {LogCat::Graphs, "graphs"},
};

/// The categories named in `spec` (comma separated, "+name" for debug detail, "all"); names it does
/// not know are appended to `unknown`.
uint64_t parse_spec(std::string_view spec, std::vector<std::string>* unknown = nullptr) {
  uint64_t mask = 0;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    std::string_view item = spec.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    bool debug = false;
    if (!item.empty() && item.front() == '+') {
      debug = true;
      item.remove_prefix(1);
    }
    bool known = item.empty() || item == "all";
    for (const auto& c : kCats) {
      if (item == c.name || item == "all") {
        uint64_t bit = static_cast<uint32_t>(c.cat);
        mask |= bit;
        if (debug) mask |= bit << 32;
        known = true;
      }
    }
    if (!known && unknown) unknown->emplace_back(item);
    // recompiles_verbose implies recompiles (as in PyTorch).
    if (item == "recompiles_verbose") mask |= static_cast<uint32_t>(LogCat::Recompiles);
    pos = end + 1;
  }
  return mask;
}

uint64_t mask() {
  uint64_t m = g_mask.load(std::memory_order_relaxed);
  if (m != kUnparsed) return m;
  const char* env = std::getenv("PROTEAN_LOGS");
  std::vector<std::string> unknown;
  uint64_t parsed = parse_spec(env ? env : "", &unknown);
  uint64_t expected = kUnparsed;
  if (g_mask.compare_exchange_strong(expected, parsed) && !unknown.empty()) {
    std::string names;
    for (const auto& c : kCats) names += std::string(names.empty() ? "" : ", ") + std::string(c.name);
    std::fprintf(stderr, "W protean: PROTEAN_LOGS: unknown categor%s '%s' ignored (known: all, %s; '+name' adds detail)\n",
                 unknown.size() == 1 ? "y" : "ies", fmt::format("{}", fmt::join(unknown, "', '")).c_str(), names.c_str());
  }
  return g_mask.load(std::memory_order_relaxed);
}
}  // namespace

bool log_enabled(LogCat cat, bool debug) {
  uint64_t bit = static_cast<uint32_t>(cat);
  return (mask() & (debug ? bit << 32 : bit)) != 0;
}

std::string_view log_cat_name(LogCat cat) {
  for (const auto& c : kCats)
    if (c.cat == cat) return c.name;
  return "?";
}

void log_line(LogCat cat, std::string_view compile_id, std::string_view msg) {
  std::string text;
  size_t pos = 0;
  while (pos <= msg.size()) {
    size_t end = msg.find('\n', pos);
    if (end == std::string_view::npos) end = msg.size();
    if (!compile_id.empty()) {
      text += '[';
      text += compile_id;
      text += "] ";
    }
    text.append(msg.substr(pos, end - pos));
    text += '\n';
    if (end == msg.size()) break;
    pos = end + 1;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_capture) {
    *g_capture += text;
    return;
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
}

void warn(std::string_view msg) {
  std::string text = "W protean: ";
  text.append(msg);
  text += '\n';
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_capture) {
    *g_capture += text;
    return;
  }
  std::fwrite(text.data(), 1, text.size(), stderr);
}

void set_log_spec(std::string_view spec) { g_mask.store(parse_spec(spec), std::memory_order_relaxed); }

LogCapture::LogCapture(std::string_view spec) : prev_mask_(mask()) {
  set_log_spec(spec);
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_capture;
  g_capture = new std::string;
}
LogCapture::~LogCapture() {
  g_mask.store(prev_mask_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_mu);
  delete g_capture;
  g_capture = nullptr;
}
std::string LogCapture::str() const {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_capture ? *g_capture : std::string();
}

}  // namespace protean::observe
