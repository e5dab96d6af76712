// `protean cache stats|clear|export|import|show`: inspects, empties, bundles and loads the
// compiled-artifact cache ($PROTEAN_CACHE_DIR, default ~/.cache/protean; see src/cache/kernel_cache.h,
// include/protean/cache.h and docs/cache.md).
#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace protean::tools {

struct CacheArgs {
  std::string action;       // "stats" | "clear" | "export" | "import" | "show"
  bool json = false;        // print as one JSON object
  std::string path = "";    // export / import / show: the bundle file
  bool no_rebuild = false;  // import: refuse kernels that cannot run here instead of rebuilding them
};

/// Adds the `cache` subcommand to `app`, filling `args`. Returns the subcommand.
CLI::App* add_cache_command(CLI::App& app, CacheArgs& args);

/// Runs it. `stats` prints the directory, the number of entries and their size on disk (plus this
/// process's hit/miss counters with --json); `clear` removes every entry; `export PATH` writes a
/// bundle (save_cache_artifacts), `import PATH` loads one (load_cache_artifacts), `show PATH` prints a
/// bundle's header and records after verifying it. Returns the exit code: 0, 1 for an error (a
/// refused bundle included, with the reason on `err`), 2 for bad usage.
int cache_command(const CacheArgs& args, std::ostream& out, std::ostream& err);

}  // namespace protean::tools
