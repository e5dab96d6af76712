#include "dynamic/profile_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/redis_client.h"
#include "core/files.h"
#include "observe/log.h"
#include "observe/trace.h"
#include "protean/error.h"

namespace protean::dynamic {

namespace fs = std::filesystem;
using observe::LogCat;

namespace {

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : dflt;
}

/// A `pgo` trace event (docs/trace-format.md). `outcome`: ok / missing / corrupt / error.
void trace_pgo(const char* action, const char* outcome, const std::string& where_key, const std::string& where,
               const std::string& key, int64_t frames, const std::string& detail) {
  if (!observe::trace_enabled()) return;
  nlohmann::json j;
  j["action"] = action;
  j["outcome"] = outcome;
  j[where_key] = where;
  j["key"] = key;
  j["frames"] = frames;
  j["detail"] = detail;
  observe::trace_event("pgo", std::move(j));
}

std::string timestamp() { return core::utc_timestamp(); }

// Renames `path` to "<path>.corrupt-<timestamp>" (never over an existing backup). Returns the new name.
std::string backup_corrupt(const std::string& path) { return core::backup_corrupt_file(path, "PGO: corrupt profile"); }

// Profiles are a few KiB to a few MiB; a FIFO or device in their place is refused, not waited on.
constexpr uint64_t kMaxProfileBytes = uint64_t{256} << 20;

std::string read_all(const std::string& path) { return core::read_regular_file(path, "PGO profile", kMaxProfileBytes); }

void write_all_atomic(const std::string& path, const std::string& text) {
  core::write_file_atomic(path, text, "PGO", /*durable=*/true);
}

// ---- Redis ----------------------------------------------------------------------------------------
}  // namespace

RedisUrl parse_redis_url(const std::string& url) {
  core::RedisUrl u = core::parse_redis_url(url, "PROTEAN_PGO_REMOTE", "protean-pgo");
  return RedisUrl{u.host, u.port, u.prefix};
}

namespace {
using Reply = core::RedisReply;
// The shared client (cache/redis_client.h): 200 ms connect and command timeouts, SIGPIPE blocked.
class Redis : public core::RedisClient {
 public:
  explicit Redis(const RedisUrl& u) : core::RedisClient(core::RedisUrl{u.host, u.port, u.prefix}, 200) {}
};
}  // namespace

// ---- config / files ---------------------------------------------------------------------------------
void check_job_id(const std::string& id, std::string_view where) {
  const bool ok_chars = std::all_of(id.begin(), id.end(), [](char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' ||
           ch == '.';
  });
  if (id.empty() || id.size() > 128 || !ok_chars || id == "." || id == "..")
    throw ValueError(fmt::format("{}: bad job id '{}': a job id is 1-128 characters of letters, digits, '-', '_' and "
                                 "'.' (not '.' or '..'); it names a directory under the cache's pgo/",
                                 where, id));
}

PgoConfig PgoConfig::from_env() {
  PgoConfig c;
  c.job_id = env_or("PROTEAN_JOB_ID", "");
  if (!c.job_id.empty()) check_job_id(c.job_id, "PROTEAN_JOB_ID");
  std::string home = env_or("HOME", "/tmp");
  c.cache_dir = env_or("PROTEAN_CACHE_DIR", home + "/.cache/protean");
  std::error_code ec;  // absolute, as the kernel cache's (cache/kernel_cache.h cache_dir)
  if (std::filesystem::path abs = std::filesystem::absolute(c.cache_dir, ec); !ec) c.cache_dir = abs.lexically_normal().string();
  c.rank = observe::trace_rank();
  c.remote = env_or("PROTEAN_PGO_REMOTE", "");
  return c;
}
std::string PgoConfig::job_dir() const { return fmt::format("{}/pgo/{}", cache_dir, job_id); }
std::string PgoConfig::local_path() const { return fmt::format("{}/rank{}.json", job_dir(), rank); }

std::optional<Profile> read_profile_file(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  return parse_profile(read_all(path), path);
}

Profile merge_into_file(const std::string& path, const Profile& mine, std::string* backup) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) throw RuntimeError(fmt::format("PGO: cannot create {}: {}", fs::path(path).parent_path().string(), ec.message()));
  core::FileLock lock(path + ".lock", "PGO");
  Profile merged;
  try {
    if (auto disk = read_profile_file(path)) merged = std::move(*disk);
  } catch (const FormatError&) {
    std::string b = backup_corrupt(path);
    if (backup) *backup = b;
  }
  merge(merged, mine);
  write_all_atomic(path, dump_profile(merged));
  return merged;
}

// ---- the store -------------------------------------------------------------------------------------
struct ProfileStore::Impl {
  std::mutex mu;
  bool configured = false;
  bool loaded = false;
  PgoConfig cfg;
  Profile profile;            // loaded ⊔ this process's observations ⊔ what other writers merged
  bool local_warned = false;  // one warning for local I/O problems
  bool remote_dead = false;   // Redis failed once: off for the rest of the process
  std::unique_ptr<Redis> redis;
  RedisUrl url;
  std::string remote_key;

  void configure() {
    if (configured) return;
    configured = true;
    cfg = PgoConfig::from_env();
  }

  void remote_failed(const std::string& what) {
    remote_dead = true;
    redis.reset();
    observe::warn(fmt::format("PGO: remote store {} is unavailable ({}); continuing with the local store {}",
                              cfg.remote, what, cfg.local_path()));
    trace_pgo("error", "error", "url", cfg.remote, remote_key, 0, what);
  }

  Redis* remote() {
    if (cfg.remote.empty() || remote_dead) return nullptr;
    if (redis) return redis.get();
    try {
      url = parse_redis_url(cfg.remote);
      remote_key = fmt::format("{}/{}/rank{}", url.prefix, cfg.job_id, cfg.rank);
      redis = std::make_unique<Redis>(url);
    } catch (const Error& e) {
      remote_failed(e.what());
      return nullptr;
    }
    return redis.get();
  }

  void load() {
    configure();
    if (loaded || cfg.job_id.empty()) return;
    loaded = true;
    const std::string path = cfg.local_path();
    try {
      if (auto p = read_profile_file(path)) {
        profile = std::move(*p);
        trace_pgo("load", "ok", "path", path, cfg.job_id, static_cast<int64_t>(profile.frames.size()), "");
        if (observe::log_enabled(LogCat::Pgo))
          observe::log_line(LogCat::Pgo, "", fmt::format("loaded PGO profile {} ({} frames)", path, profile.frames.size()));
      } else {
        trace_pgo("load", "missing", "path", path, cfg.job_id, 0, "no profile yet; starting empty");
      }
    } catch (const Error& e) {
      observe::warn(fmt::format("PGO: ignoring profile: {} (it will be kept as {}.corrupt-<timestamp> before it "
                                "is replaced)", e.what(), path));
      trace_pgo("load", dynamic_cast<const FormatError*>(&e) ? "corrupt" : "error", "path", path, cfg.job_id, 0, e.what());
    }
    if (Redis* r = remote()) {
      try {
        if (auto text = r->get(remote_key)) {
          try {
            Profile p = parse_profile(*text, fmt::format("{} key {}", cfg.remote, remote_key));
            merge(profile, p);
            trace_pgo("load", "ok", "url", cfg.remote, remote_key, static_cast<int64_t>(p.frames.size()), "");
          } catch (const FormatError& e) {
            observe::warn(fmt::format("PGO: ignoring remote profile: {}", e.what()));
            trace_pgo("load", "corrupt", "url", cfg.remote, remote_key, 0, e.what());
          }
        }
      } catch (const Error& e) {
        remote_failed(e.what());
      }
    }
  }

  void write_local() {
    const std::string path = cfg.local_path();
    try {
      std::string backup;
      Profile merged = merge_into_file(path, profile, &backup);
      if (!backup.empty()) {
        observe::warn(fmt::format("PGO: replaced a corrupt profile {}; the old file is kept as {}", path, backup));
        trace_pgo("store", "corrupt", "path", path, cfg.job_id, 0, "corrupt profile backed up as " + backup);
      }
      merge(profile, merged);
      trace_pgo("store", "ok", "path", path, cfg.job_id, static_cast<int64_t>(profile.frames.size()), "");
      if (observe::log_enabled(LogCat::Pgo, true))
        observe::log_line(LogCat::Pgo, "", fmt::format("wrote PGO profile {} ({} frames)", path, profile.frames.size()));
    } catch (const Error& e) {
      if (!local_warned) observe::warn(fmt::format("PGO: cannot write the local profile: {}", e.what()));
      local_warned = true;
      trace_pgo("store", "error", "path", path, cfg.job_id, 0, e.what());
    }
  }

  void write_remote() {
    Redis* r = remote();
    if (!r) return;
    try {
      for (int attempt = 0; attempt < 5; ++attempt) {
        Reply w(r->cmd({"WATCH", remote_key}));
        Profile merged = profile;
        if (auto text = r->get(remote_key)) {
          try {
            merge(merged, parse_profile(*text, fmt::format("{} key {}", cfg.remote, remote_key)));
          } catch (const FormatError& e) {
            // Keep the bad value under a backup key before replacing it.
            std::string backup = remote_key + ".corrupt-" + timestamp();
            Reply s(r->cmd({"SET", backup, *text}));
            observe::warn(fmt::format("PGO: replacing a corrupt remote profile ({}); the old value is kept under {}",
                                      e.what(), backup));
            trace_pgo("store", "corrupt", "url", cfg.remote, remote_key, 0, "corrupt profile backed up under " + backup);
          }
        }
        Reply m(r->cmd({"MULTI"}));
        Reply s(r->cmd({"SET", remote_key, dump_profile(merged)}));
        Reply x(r->cmd({"EXEC"}));
        if (x.is_nil()) continue;  // another writer won: read again
        merge(profile, merged);
        trace_pgo("store", "ok", "url", cfg.remote, remote_key, static_cast<int64_t>(merged.frames.size()), "");
        return;
      }
      observe::warn(fmt::format("PGO: remote store {}: key {} kept changing; skipped this update", cfg.remote, remote_key));
    } catch (const Error& e) {
      remote_failed(e.what());
    }
  }
};

ProfileStore& ProfileStore::instance() {
  static ProfileStore s;
  return s;
}
ProfileStore::ProfileStore() : impl_(new Impl) {}
ProfileStore::~ProfileStore() { delete impl_; }

bool ProfileStore::enabled() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->configure();
  return !impl_->cfg.job_id.empty();
}

std::optional<FrameProfile> ProfileStore::lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->load();
  auto it = impl_->profile.frames.find(key);
  if (it == impl_->profile.frames.end()) return std::nullopt;
  return it->second;
}

bool ProfileStore::record(const FrameProfile& entry) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->load();
  if (impl_->cfg.job_id.empty()) return false;
  Profile one;
  one.frames.emplace(entry.id.key(), entry);
  if (!merge(impl_->profile, one)) return false;
  impl_->write_local();
  impl_->write_remote();
  return true;
}

PgoConfig ProfileStore::config() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->configure();
  return impl_->cfg;
}

void ProfileStore::reset() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->redis.reset();
  impl_->configured = false;
  impl_->loaded = false;
  impl_->cfg = {};
  impl_->profile = {};
  impl_->local_warned = false;
  impl_->remote_dead = false;
  impl_->remote_key.clear();
}

// ---- frame hooks -------------------------------------------------------------------------------------
std::optional<FrameProfile> pgo_before_first_compile(const FrameIdentity& id, Dynamic mode,
                                                     const std::string& compile_id) {
  ProfileStore& store = ProfileStore::instance();
  if (!store.enabled()) return std::nullopt;
  std::optional<FrameProfile> e = store.lookup(id.key());
  if (!e) {
    if (observe::log_enabled(LogCat::Pgo))
      observe::log_line(LogCat::Pgo, compile_id, fmt::format("no PGO profile entry for {} ({}:{})", id.name, id.file, id.line));
    return std::nullopt;
  }
  if (mode == Dynamic::Off) {
    if (e->any_dynamic())
      observe::warn(fmt::format("PGO: the profile of {} ({}:{}) has dynamic dims, but the function is compiled with "
                                "dynamic=Off: compiling static shapes; the stored dynamic decisions are kept:\n{}",
                                id.name, id.file, id.line, e->render()));
    return std::nullopt;
  }
  const bool pgo_log = observe::log_enabled(LogCat::Pgo);
  const bool dyn_log = observe::log_enabled(LogCat::Dynamic, true);
  if (pgo_log || dyn_log) {
    std::string msg = fmt::format("using PGO profile entry for {} ({}:{}) from {}", id.name, id.file, id.line,
                                  store.config().local_path());
    for (const auto& [src, s] : e->sources) {
      if (s.rank_dynamic) msg += fmt::format("\n    {}: every dim starts dynamic (decision from PGO profile)", src);
      for (size_t d = 0; d < s.sizes.size(); ++d)
        if (s.sizes[d].dynamic()) {
          std::string range;
          if (d < s.size_range.size()) range = fmt::format(" [observed {}..{}]", s.size_range[d].first, s.size_range[d].second);
          msg += fmt::format("\n    {}.size()[{}] starts dynamic{} (decision from PGO profile)", src, d, range);
        }
      if (s.scalar.dynamic()) msg += fmt::format("\n    {} starts dynamic (decision from PGO profile)", src);
    }
    observe::log_line(pgo_log ? LogCat::Pgo : LogCat::Dynamic, compile_id, msg);
  }
  return e;
}

void pgo_after_compile(const FrameIdentity& id, const FrameState& fs, Dynamic mode, const std::string& compile_id) {
  if (mode == Dynamic::Off) return;
  ProfileStore& store = ProfileStore::instance();
  if (!store.enabled()) return;
  if (store.record(to_profile(id, fs)) && observe::log_enabled(LogCat::Pgo)) {
    std::string entry = to_profile(id, fs).render();
    while (!entry.empty() && entry.back() == '\n') entry.pop_back();
    observe::log_line(LogCat::Pgo, compile_id,
                      fmt::format("updated PGO profile entry for {} ({}:{}):\n{}", id.name, id.file, id.line, entry));
  }
}

}  // namespace protean::dynamic
