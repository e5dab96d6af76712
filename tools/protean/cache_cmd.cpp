#include "protean/cache_cmd.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <ostream>

#include "cache/isa.h"
#include "cache/kernel_cache.h"
#include "cache/program_cache.h"
#include "core/files.h"
#include "protean/cache.h"
#include "protean/error.h"

namespace protean::tools {

namespace {
constexpr const char* kHelp = R"(Actions:
  stats            entries and bytes in $PROTEAN_CACHE_DIR/kernels (--json: + this process's counters)
  clear            remove every kernel entry and every compiled plan (program cache)
  export PATH      write one bundle file: every kernel of the current target (binary, source,
                   metadata), every PGO profile and the source-location caches; signed (HMAC-SHA256) when
                   PROTEAN_CACHE_SIGNING_KEY is set
  import PATH      verify the whole bundle, then install it; entries already present are kept.
                   Refused with a reason: not a bundle, truncated, corrupt, another Protean version,
                   unsigned or wrongly signed while PROTEAN_CACHE_SIGNING_KEY is set. Kernels built
                   for a target this CPU cannot run are rebuilt from their bundled source
                   (--no-rebuild: refuse the bundle instead)
  show PATH        verify a bundle and print its header and records

A bundle holds native code that the process will run: import only bundles you trust as programs.
PROTEAN_CACHE_PORTABLE=1 builds kernels for an x86-64 level (PROTEAN_CACHE_ISA=x86-64-v3|x86-64-v4,
default: this CPU's) instead of -march=native, so a bundle is usable on other machines of that level.
PROTEAN_CACHE_REMOTE=redis://host:port/prefix adds a shared Redis tier (docs/cache.md).)";

nlohmann::json summary_json(const CacheArtifactsSummary& s) {
  nlohmann::json recs = nlohmann::json::array();
  for (const auto& r : s.records) recs.push_back({{"kind", r.kind}, {"name", r.name}, {"bytes", r.bytes}, {"stored", r.stored}});
  nlohmann::json header = nlohmann::json::parse(s.header, nullptr, false);
  return {{"path", s.path},
          {"header", header.is_discarded() ? nlohmann::json(s.header) : header},
          {"signed", s.signed_},
          {"kernels", s.kernels},
          {"kernels_present", s.kernels_present},
          {"kernels_rebuilt", s.kernels_rebuilt},
          {"kernels_left_out", s.kernels_left_out},
          {"programs", s.programs},
          {"programs_present", s.programs_present},
          {"profiles", s.profiles},
          {"locations", s.locations},
          {"other_records", s.other_records},
          {"file_bytes", s.file_bytes},
          {"seconds", s.seconds},
          {"records", recs}};
}
}  // namespace

CLI::App* add_cache_command(CLI::App& app, CacheArgs& args) {
  auto* sub = app.add_subcommand("cache", "inspect, clear, export, import or show the compiled-artifact cache");
  sub->footer(kHelp);
  sub->add_option("action", args.action, "stats | clear | export | import | show")
      ->required()
      ->check(CLI::IsMember({"stats", "clear", "export", "import", "show"}));
  sub->add_option("path", args.path, "the bundle file (export, import, show)");
  sub->add_flag("--json", args.json, "print the result as JSON");
  sub->add_flag("--no-rebuild", args.no_rebuild,
                "import: refuse a bundle with kernels this CPU cannot run instead of rebuilding them from source");
  return sub;
}

int cache_command(const CacheArgs& args, std::ostream& out, std::ostream& err) {
  try {
    // A cache path that is a file (or a FIFO, ...) reads as an empty cache: stats, clear and export
    // succeeded on it and export wrote an empty bundle.
    if (args.action != "show") {
      const std::string dir = cache::cache_dir(), kind = core::file_kind(dir);
      if (kind != "a directory" && kind != "missing")
        throw protean::RuntimeError(fmt::format("the cache directory '{}' (PROTEAN_CACHE_DIR) is {}, not a directory", dir, kind));
      const std::string kernels = cache::kernels_dir(), kernels_kind = core::file_kind(kernels);
      if (kernels_kind != "a directory" && kernels_kind != "missing")
        throw protean::RuntimeError(fmt::format("the cache's kernel directory '{}' is {}, not a directory (move it away, "
                                                "or point PROTEAN_CACHE_DIR elsewhere)", kernels, kernels_kind));
    }
    if (args.action == "clear") {
      int64_t n = cache::clear_disk_cache();
      int64_t programs = cache::clear_program_cache();
      out << fmt::format("removed {} entries from {} and {} from {}\n", n, cache::kernels_dir(), programs,
                         cache::programs_dir());
      return 0;
    }
    if (args.action == "stats") {
      cache::DiskUsage u = cache::disk_usage(/*verify=*/true);
      if (args.json) {
        nlohmann::ordered_json j;
        j["dir"] = cache::kernels_dir();  // escaped: a path may hold quotes or backslashes
        j["entries"] = u.entries;
        j["corrupt_entries"] = u.corrupt;
        j["bytes"] = u.bytes;
        j["process"] = nlohmann::ordered_json::parse(cache::kernel_cache_stats_json());
        out << j.dump() << "\n";
      } else {
        out << fmt::format("dir:     {}\nentries: {}{}\nbytes:   {} ({:.1f} MiB)\ntarget:  {}\n", cache::kernels_dir(),
                           u.entries,
                           u.corrupt > 0 ? fmt::format(" ({} corrupt: rebuilt at their next use; `protean cache clear` "
                                                       "removes every entry)", u.corrupt)
                                         : std::string(),
                           u.bytes, static_cast<double>(u.bytes) / (1024.0 * 1024.0), cache::build_target());
      }
      return 0;
    }
    if (args.action == "export" || args.action == "import" || args.action == "show") {
      if (args.path.empty()) {
        err << fmt::format("protean cache {}: expected a bundle path (protean cache {} PATH)\n", args.action, args.action);
        return 2;
      }
      CacheArtifactsSummary s;
      if (args.action == "export") s = save_cache_artifacts(args.path);
      else if (args.action == "import") s = load_cache_artifacts(args.path, {.rebuild = !args.no_rebuild});
      else s = inspect_cache_artifacts(args.path);
      if (args.json) {
        out << summary_json(s).dump() << "\n";
        return 0;
      }
      if (args.action == "export") {
        out << fmt::format("wrote {} ({} bytes, {:.1f} ms): {} kernels, {} programs, {} PGO profiles, {} location caches{}{}\n",
                           s.path, s.file_bytes, s.seconds * 1e3, s.kernels, s.programs, s.profiles, s.locations,
                           s.kernels_left_out ? fmt::format(", {} entries left out (of another target, or incomplete)", s.kernels_left_out) : "",
                           s.signed_ ? ", signed" : "");
      } else if (args.action == "import") {
        out << fmt::format("loaded {} into {} ({:.1f} ms): {} kernels written, {} already present, {} rebuilt from "
                           "source, {} programs written ({} present), {} PGO profiles merged, {} location caches written\n",
                           s.path, cache::cache_dir(), s.seconds * 1e3, s.kernels, s.kernels_present, s.kernels_rebuilt,
                           s.programs, s.programs_present, s.profiles, s.locations);
      } else {
        out << fmt::format("{}: {} bytes, {}\nheader: {}\n", s.path, s.file_bytes, s.signed_ ? "signed" : "unsigned",
                           s.header);
        for (const auto& r : s.records)
          out << fmt::format("  {:<7} {}  {} bytes ({} stored)\n", r.kind, r.name, r.bytes, r.stored);
      }
      return 0;
    }
    err << "protean cache: unknown action '" << args.action << "' (expected stats, clear, export, import or show)\n";
    return 2;
  } catch (const std::exception& e) {
    err << "protean cache " << args.action << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace protean::tools
