#include "dynamic/collectives.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "observe/log.h"
#include "observe/trace.h"
#include "protean/error.h"

namespace protean::dynamic {

using json = nlohmann::json;
using observe::LogCat;

namespace {
std::mutex g_mu;  // guards the backend pointer and serializes exchanges
std::shared_ptr<CollectiveBackend> g_backend;
std::atomic<bool> g_warned_no_backend{false};

bool env_on() {
  const char* v = std::getenv("PROTEAN_COMPILER_COLLECTIVES");
  return v && *v && std::string(v) != "0";
}

std::string frame_desc(const FrameIdentity& id) { return fmt::format("'{}' ({}:{})", id.name, id.file, id.line); }

// One exchange of {"kind", "frame", ...payload}; checks every rank is at the same step of the same frame.
std::vector<json> exchange(const char* kind, const FrameIdentity& id, json payload) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_backend) throw CompileError("compiler collectives: no backend installed");
  payload["kind"] = kind;
  payload["frame"] = id.key();
  const double timeout = collectives_timeout_s();
  std::vector<std::string> out;
  std::vector<int> missing;
  const int me = g_backend->rank();
  if (!g_backend->all_gather(payload.dump(), timeout, out, missing))
    throw CompileError(fmt::format(
        "compiler collectives: rank {} waited {} s at the {} of frame {} but ranks {} did not take part "
        "(exited, crashed or stuck elsewhere). Every rank must call compiled functions in the same order; "
        "raise PROTEAN_COLLECTIVES_TIMEOUT_S if they are only slow.",
        me, timeout, std::string(kind) == "guard" ? "guard check" : "FrameState exchange", frame_desc(id),
        fmt::join(missing, ", ")));
  std::vector<json> res;
  for (size_t r = 0; r < out.size(); ++r) {
    json j = json::parse(out[r], nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw CompileError(fmt::format("compiler collectives: rank {} sent a malformed message at frame {}", r, frame_desc(id)));
    if (j.value("kind", "") != kind || j.value("frame", "") != id.key())
      throw CompileError(fmt::format(
          "compiler collectives: ranks diverged: rank {} is at the {} of frame {} while rank {} is at the {} of '{}'. "
          "Every rank must call compiled functions in the same order.",
          me, kind, frame_desc(id), r, j.value("kind", "?"), j.value("frame", "?")));
    res.push_back(std::move(j));
  }
  return res;
}
}  // namespace

void set_collective_backend(std::shared_ptr<CollectiveBackend> backend) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_backend = std::move(backend);
}
std::shared_ptr<CollectiveBackend> collective_backend() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_backend;
}

bool collectives_active(bool option) {
  if (!option && !env_on()) return false;
  auto b = collective_backend();
  if (!b) {
    if (!g_warned_no_backend.exchange(true))
      observe::warn("compiler collectives were requested (compiler_collectives / PROTEAN_COMPILER_COLLECTIVES) but no "
                    "collective backend is installed: compiling as a single process. In a job started by `protean launch`, call "
                    "protean::distributed::install_compiler_collectives(protean::distributed::init_from_env()); under "
                    "mpirun, link protean_mpi and call protean::mpi::install_compiler_collectives() after MPI_Init.");
    return false;
  }
  return b->size() > 1;
}

double collectives_timeout_s() {
  const char* v = std::getenv("PROTEAN_COLLECTIVES_TIMEOUT_S");
  if (!v || !*v) return 60.0;
  const std::string text = v;
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v, &end);
  if (end == v || end != v + text.size() || std::isnan(d) || !(d > 0))
    throw ValueError(fmt::format(
        "PROTEAN_COLLECTIVES_TIMEOUT_S='{}' is not a number of seconds greater than 0 (e.g. 60, 2.5, inf for no "
        "deadline); unset it for the default, 60 s",
        text));
  return std::min(d, kMaxCollectivesTimeoutS);
}

bool any_rank_missed(const FrameIdentity& id, bool i_missed) {
  json p;
  p["miss"] = i_missed;
  bool any = false;
  for (const auto& j : exchange("guard", id, std::move(p))) any |= j.value("miss", false);
  return any;
}

FrameProfile exchange_frame_state(const FrameIdentity& id, const FrameProfile& mine, const std::string& compile_id) {
  json p;
  p["entry"] = to_json(mine);
  std::vector<json> all = exchange("state", id, std::move(p));
  FrameProfile merged = mine;
  for (size_t r = 0; r < all.size(); ++r) {
    FrameProfile other = frame_from_json(all[r].at("entry"), fmt::format("compiler collectives: rank {}", r));
    other.id = id;
    merge_frame(merged, other);
  }
  const bool pgo_log = observe::log_enabled(LogCat::Pgo);
  if (pgo_log || observe::log_enabled(LogCat::Dynamic, true)) {
    std::string msg = fmt::format("compiler collectives: FrameState of {} joined across {} ranks", frame_desc(id), all.size());
    for (const auto& [src, s] : merged.sources) {
      auto it = mine.sources.find(src);
      for (size_t d = 0; d < s.sizes.size(); ++d)
        if (s.sizes[d].dynamic() && (it == mine.sources.end() || !it->second.size_dynamic(d)))
          msg += fmt::format("\n    {}.size()[{}] is dynamic (sizes differ across ranks)", src, d);
      if (s.rank_dynamic && (it == mine.sources.end() || !it->second.rank_dynamic))
        msg += fmt::format("\n    {}: every dim is dynamic (ranks differ across ranks)", src);
    }
    observe::log_line(pgo_log ? LogCat::Pgo : LogCat::Dynamic, compile_id, msg);
  }
  if (observe::trace_enabled())
    observe::trace_event("pgo", {{"action", "collective"}, {"outcome", "ok"}, {"frames", 1}, {"detail", fmt::format("{} ranks", all.size())},
                                 {"compile_id", compile_id}});
  return merged;
}

}  // namespace protean::dynamic
