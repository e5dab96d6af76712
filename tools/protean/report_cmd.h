// `protean report DIR -o OUT [--plain-text]`: renders a directory of structured traces
// (PROTEAN_TRACE=DIR) as a static HTML site, or prints the same findings as text.
#pragma once

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace protean::tools {

struct ReportArgs {
  std::string trace_dir;
  std::string out_dir;      // required unless plain_text
  bool plain_text = false;
};

/// Adds the `report` subcommand to `app`, filling `args`. Returns the subcommand.
CLI::App* add_report_subcommand(CLI::App& app, ReportArgs& args);

/// Runs the report. Returns the process exit code (0 on success; 1 when the directory is unreadable or
/// the output cannot be written, after a message on `err`). Skipped lines in the trace are warnings,
/// not failures.
int run_report(const ReportArgs& args, std::ostream& out, std::ostream& err);

}  // namespace protean::tools
