#include <fmt/format.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cache/kernel_toolchain.h"
#include "cache/bundle.h"
#include "cache/isa.h"
#include "cache/kernel_cache.h"
#include "cache/program_cache.h"
#include "core/files.h"
#include "core/rethrow.h"
#include "dynamic/pgo.h"
#include "dynamic/profile_store.h"
#include "observe/log.h"
#include "protean/cache.h"
#include "protean/error.h"

// save_cache_artifacts / load_cache_artifacts / inspect_cache_artifacts (include/protean/cache.h) on
// the bundle codec (cache/bundle.h) and the kernel cache's entries (cache/kernel_cache.h).
namespace protean::cache {
namespace {
namespace fs = std::filesystem;

constexpr uint64_t kMaxBundleBytes = uint64_t{1} << 36;

/// Why the kernel entry `meta` cannot run here as built ("" when it can).
std::string foreign_reason(const std::string& meta) {
  const std::string target = entry_attr(meta, "target");
  const std::string compiler = entry_attr(meta, "compiler");
  if (target.empty()) return "the entry records no build target";
  if (target == "native") {
    if (entry_attr(meta, "cpu_flags") != local_cpu_flags())
      return "built with -march=native on a CPU with other features";
  } else if (!cpu_supports_isa(target)) {
    return fmt::format("built for {}, this CPU supports {}", target, cpu_isa_level());
  }
  if (compiler != kernel_toolchain("bundle").compiler_identity())
    return fmt::format("built by '{}', this machine's compiler is '{}'", compiler, kernel_toolchain("bundle").compiler_identity());
  return "";
}

/// True when `name` is "<job>/rank<R>.json" with a valid job id.
bool valid_profile_name(const std::string& name) {
  size_t slash = name.find('/');
  if (slash == std::string::npos) return false;
  try {
    dynamic::check_job_id(name.substr(0, slash), "bundle");
  } catch (const ValueError&) {
    return false;
  }
  std::string file = name.substr(slash + 1);
  if (file.size() < 10 || file.rfind("rank", 0) != 0 || file.substr(file.size() - 5) != ".json") return false;
  std::string digits = file.substr(4, file.size() - 9);
  return !digits.empty() && digits.size() <= 9 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// True when `name` is "<ELF build id in hex>.tsv": a symbolization cache file of capture/location.cpp,
/// valid wherever the binary with that build id runs.
bool valid_locations_name(const std::string& name) {
  if (name.size() < 6 || name.size() > 132 || name.substr(name.size() - 4) != ".tsv") return false;
  return std::all_of(name.begin(), name.end() - 4, [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}
constexpr uint64_t kMaxLocationsBytes = uint64_t{64} << 20;

bool parse_key(const std::string& hex, uint64_t& key) {
  if (hex.size() != 16) return false;
  auto [p, ec] = std::from_chars(hex.data(), hex.data() + 16, key, 16);
  return ec == std::errc() && p == hex.data() + 16 && key_hex(key) == hex;
}

struct Verified {
  Bundle bundle;
  std::vector<EntryFiles> kernels;
  std::vector<std::string> kernel_foreign;  // per kernel: "" or why it cannot run here
  std::vector<ProgramEntry> programs;
  std::vector<std::pair<std::string, dynamic::Profile>> profiles;
  std::vector<std::pair<std::string, std::string>> locations;  // file name → bytes
};

/// Reads and verifies a bundle file completely (nothing is written).
Verified read_and_verify(const std::string& path, bool check_compat) {
  check_bundle_file_magic(path);  // a large file that is no bundle: refused before it is read whole
  const std::string bytes = core::read_regular_file(path, "cache bundle", kMaxBundleBytes);
  Verified v;
  v.bundle = decode_bundle(bytes, path, signing_key());
  if (check_compat) {
    if (std::string why = check_bundle_header(v.bundle.header); !why.empty())
      throw ValueError(fmt::format("{}: refused: {}", path, why));
    if (std::string why = signature_problem(v.bundle); !why.empty())
      throw ValueError(fmt::format("{}: refused: {}", path, why));
  }
  for (const BundleRecord& r : v.bundle.records) {
    const std::string where = fmt::format("{}: {} record '{}'", path, r.kind, r.name);
    if (r.kind == "kernel") {
      uint64_t key = 0;
      if (!parse_key(r.name, key)) throw FormatError(fmt::format("{}: the name is not a 16-digit key", where));
      std::vector<std::string> parts = unpack_parts(r.bytes, 3, where);
      EntryFiles e{key, std::move(parts[0]), std::move(parts[1]), std::move(parts[2])};
      if (std::string why = verify_entry(e); !why.empty()) throw FormatError(fmt::format("{}: {}", where, why));
      v.kernel_foreign.push_back(foreign_reason(e.meta));
      v.kernels.push_back(std::move(e));
    } else if (r.kind == "program") {
      uint64_t key = 0;
      if (!parse_key(r.name, key)) throw FormatError(fmt::format("{}: the name is not a 16-digit key", where));
      std::vector<std::string> parts = unpack_parts(r.bytes, 2, where);
      ProgramEntry e{key, std::move(parts[0]), std::move(parts[1])};
      if (std::string why = verify_program_entry(e); !why.empty()) throw FormatError(fmt::format("{}: {}", where, why));
      v.programs.push_back(std::move(e));
    } else if (r.kind == "pgo") {
      if (!valid_profile_name(r.name)) throw FormatError(fmt::format("{}: not a <job>/rank<R>.json name", where));
      v.profiles.emplace_back(r.name, dynamic::parse_profile(r.bytes, where));
    } else if (r.kind == "locations") {
      if (!valid_locations_name(r.name) || r.bytes.size() > kMaxLocationsBytes)
        throw FormatError(fmt::format("{}: not a <build id>.tsv name, or over 64 MiB", where));
      v.locations.emplace_back(r.name, r.bytes);
    }
  }
  return v;
}

CacheArtifactsSummary summarize(const std::string& path, const Bundle& b, int64_t file_bytes) {
  CacheArtifactsSummary s;
  s.path = path;
  s.header = b.header;
  s.signed_ = b.signed_;
  s.file_bytes = file_bytes;
  nlohmann::json h = nlohmann::json::parse(b.header, nullptr, false);
  if (h.is_object() && h.contains("target") && h["target"].is_string()) s.target = h["target"].get<std::string>();
  for (const BundleRecord& r : b.records)
    s.records.push_back({r.kind, r.name, static_cast<int64_t>(r.bytes.size()), static_cast<int64_t>(r.stored)});
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace
}  // namespace protean::cache

namespace protean {

using namespace protean::cache;
namespace fs = std::filesystem;

CacheArtifactsSummary save_cache_artifacts(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string target = build_target();
  std::vector<BundleRecord> records;
  CacheArtifactsSummary s;
  for (uint64_t key : disk_keys()) {
    EntryFiles e;
    if (!read_entry(key, e).empty() || entry_attr(e.meta, "target") != target ||
        (target == "native" && entry_attr(e.meta, "cpu_flags") != local_cpu_flags())) {
      s.kernels_left_out++;
      continue;
    }
    records.push_back({"kernel", key_hex(key), pack_parts({e.meta, e.so, e.cpp})});
    s.kernels++;
  }
  // Programs hold their translation unit, not a binary: valid for any target (the kernel cache
  // builds or finds the library under this machine's key).
  for (uint64_t key : program_keys()) {
    ProgramEntry e;
    if (!read_program_entry(key, e).empty()) continue;
    records.push_back({"program", key_hex(key), pack_parts({e.meta, e.plan})});
    s.programs++;
  }
  std::error_code ec;
  const fs::path pgo = fs::path(cache_dir()) / "pgo";
  std::vector<std::string> names;
  for (const auto& job : fs::directory_iterator(pgo, ec)) {
    if (!job.is_directory(ec)) continue;
    for (const auto& f : fs::directory_iterator(job.path(), ec)) {
      std::string name = job.path().filename().string() + "/" + f.path().filename().string();
      if (f.is_regular_file(ec) && valid_profile_name(name)) names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    try {
      std::string text = core::read_regular_file((pgo / name).string(), "PGO profile", uint64_t{256} << 20);
      dynamic::parse_profile(text, name);  // a corrupt profile stays out of the bundle
      records.push_back({"pgo", name, std::move(text)});
      s.profiles++;
    } catch (const Error& e) {
      observe::warn(fmt::format("cache export: leaving out the PGO profile {}: {}", name, e.what()));
    }
  }
  std::vector<std::string> loc_names;
  for (const auto& f : fs::directory_iterator(fs::path(cache_dir()) / "locations", ec)) {
    const std::string name = f.path().filename().string();
    if (f.is_regular_file(ec) && valid_locations_name(name)) loc_names.push_back(name);
  }
  std::sort(loc_names.begin(), loc_names.end());
  for (const auto& name : loc_names) {
    try {
      records.push_back({"locations", name,
                         core::read_regular_file(cache_dir() + "/locations/" + name, "location cache", kMaxLocationsBytes)});
      s.locations++;
    } catch (const Error&) {  // a symbolization cache: leaving one out only costs a later symbolization
    }
  }
  const std::string bytes = encode_bundle(bundle_header_json(records.size()), records, signing_key());
  core::write_file_atomic(path, bytes, "cache export");
  Bundle b;
  b.header = bundle_header_json(records.size());
  b.signed_ = !signing_key().empty();
  for (auto& r : records) b.records.push_back({r.kind, r.name, {}});
  CacheArtifactsSummary out = summarize(path, b, static_cast<int64_t>(bytes.size()));
  for (size_t i = 0; i < records.size(); ++i) out.records[i].bytes = static_cast<int64_t>(records[i].bytes.size());
  out.kernels = s.kernels;
  out.kernels_left_out = s.kernels_left_out;
  out.programs = s.programs;
  out.profiles = s.profiles;
  out.locations = s.locations;
  out.seconds = seconds_since(t0);
  return out;
}

namespace {
/// Installs a verified bundle's entries into the local cache, counting them in `s`.
void install_all(const Verified& v, CacheArtifactsSummary& s) {
  std::error_code ec;
  for (size_t i = 0; i < v.kernels.size(); ++i) {
    const EntryFiles& e = v.kernels[i];
    if (v.kernel_foreign[i].empty()) {
      (install_entry(e) ? s.kernels : s.kernels_present)++;
    } else {
      kernel_toolchain("bundle import").rebuild_kernel(e.cpp, entry_attr(e.meta, "opt"));
      s.kernels_rebuilt++;
    }
  }
  for (const ProgramEntry& e : v.programs) (install_program_entry(e) ? s.programs : s.programs_present)++;
  for (const auto& [name, profile] : v.profiles) {
    dynamic::merge_into_file((fs::path(cache_dir()) / "pgo" / name).string(), profile);
    s.profiles++;
  }
  for (const auto& [name, bytes] : v.locations) {
    const fs::path dir = fs::path(cache_dir()) / "locations";
    if (fs::exists(dir / name, ec)) continue;  // present: kept as it is
    fs::create_directories(dir, ec);
    try {
      core::write_file_atomic((dir / name).string(), bytes, "cache import");
      s.locations++;
    } catch (const Error&) {  // a symbolization cache: leaving one out only costs a later symbolization
    }
  }
}
}  // namespace

CacheArtifactsSummary load_cache_artifacts(const std::string& path, const LoadCacheOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  Verified v = read_and_verify(path, /*check_compat=*/true);
  std::error_code ec;
  CacheArtifactsSummary s = summarize(path, v.bundle, static_cast<int64_t>(fs::file_size(path, ec)));
  size_t foreign = 0;
  std::string first_reason;
  for (const auto& why : v.kernel_foreign)
    if (!why.empty() && foreign++ == 0) first_reason = why;
  if (foreign && !options.rebuild)
    throw ValueError(fmt::format("{}: refused: {} of {} kernels cannot run here ({}); nothing was loaded (load with "
                                 "rebuild, `protean cache import` without --no-rebuild, to compile their bundled "
                                 "sources for this machine)",
                                 path, foreign, v.kernels.size(), first_reason));
  if (foreign)
    observe::warn(fmt::format("cache import: {} of {} kernels of {} cannot run here ({}); their binaries are not loaded, "
                              "they are rebuilt from the bundled sources",
                              foreign, v.kernels.size(), path, first_reason));
  // Entries are installed one by one, each whole or not at all: an error part-way (a full disk, a
  // file where the pgo/ directory should be) says what was already written.
  try {
    install_all(v, s);
  } catch (const Error& e) {
    core::rethrow_with_message(
        e, fmt::format("{} (before the error {} kernels, {} programs, {} PGO profiles and {} location caches were "
                       "written into {}; every entry there is complete)",
                       e.what(), s.kernels + s.kernels_rebuilt, s.programs, s.profiles, s.locations, cache_dir()));
  }
  for (const BundleRecord& r : v.bundle.records)
    if (r.kind != "kernel" && r.kind != "program" && r.kind != "pgo" && r.kind != "locations") s.other_records++;
  s.seconds = seconds_since(t0);
  return s;
}

CacheArtifactsSummary inspect_cache_artifacts(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  Verified v = read_and_verify(path, /*check_compat=*/false);
  std::error_code ec;
  CacheArtifactsSummary s = summarize(path, v.bundle, static_cast<int64_t>(fs::file_size(path, ec)));
  s.kernels = static_cast<int64_t>(v.kernels.size());
  s.programs = static_cast<int64_t>(v.programs.size());
  s.profiles = static_cast<int64_t>(v.profiles.size());
  s.locations = static_cast<int64_t>(v.locations.size());
  for (const BundleRecord& r : v.bundle.records)
    if (r.kind != "kernel" && r.kind != "program" && r.kind != "pgo" && r.kind != "locations") s.other_records++;
  s.seconds = seconds_since(t0);
  return s;
}

}  // namespace protean
