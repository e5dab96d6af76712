// `protean cache stats|clear`: inspects or empties the compiled-kernel artifact cache
// ($PROTEAN_CACHE_DIR, default ~/.cache/protean; see src/cache/kernel_cache.h).
#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace protean::tools {

struct CacheArgs {
  std::string action;  // "stats" | "clear"
  bool json = false;   // stats as one JSON object
};

/// Adds the `cache` subcommand to `app`, filling `args`. Returns the subcommand.
CLI::App* add_cache_command(CLI::App& app, CacheArgs& args);

/// Runs it. `stats` prints the directory, the number of entries and their size on disk (plus this
/// process's hit/miss counters with --json); `clear` removes every entry. Returns the exit code.
int cache_command(const CacheArgs& args, std::ostream& out, std::ostream& err);

}  // namespace protean::tools
