#include "protean/cache_cmd.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <ostream>

#include "cache/kernel_cache.h"

namespace protean::tools {

CLI::App* add_cache_command(CLI::App& app, CacheArgs& args) {
  auto* sub = app.add_subcommand("cache", "inspect or clear the compiled-kernel artifact cache");
  sub->add_option("action", args.action, "stats | clear")->required()->check(CLI::IsMember({"stats", "clear"}));
  sub->add_flag("--json", args.json, "print stats as JSON");
  return sub;
}

int cache_command(const CacheArgs& args, std::ostream& out, std::ostream& err) {
  try {
    if (args.action == "clear") {
      int64_t n = cache::clear_disk_cache();
      out << fmt::format("removed {} entries from {}\n", n, cache::kernels_dir());
      return 0;
    }
    if (args.action == "stats") {
      cache::DiskUsage u = cache::disk_usage();
      if (args.json) {
        out << fmt::format(R"({{"dir": "{}", "entries": {}, "bytes": {}, "process": {}}})", cache::kernels_dir(), u.entries,
                           u.bytes, cache::kernel_cache_stats_json())
            << "\n";
      } else {
        out << fmt::format("dir:     {}\nentries: {}\nbytes:   {} ({:.1f} MiB)\n", cache::kernels_dir(), u.entries, u.bytes,
                           static_cast<double>(u.bytes) / (1024.0 * 1024.0));
      }
      return 0;
    }
    err << "protean cache: unknown action '" << args.action << "' (expected stats or clear)\n";
    return 2;
  } catch (const std::exception& e) {
    err << "protean cache: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace protean::tools
