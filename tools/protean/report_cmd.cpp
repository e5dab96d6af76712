#include "protean/report_cmd.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <ostream>

#include "observe/report.h"
#include "protean/error.h"

namespace protean::tools {

namespace rep = protean::observe::report;

CLI::App* add_report_subcommand(CLI::App& app, ReportArgs& args) {
  auto* cmd = app.add_subcommand("report", "render a trace directory (PROTEAN_TRACE=DIR) as a static HTML report");
  cmd->add_option("DIR", args.trace_dir, "directory of protean_trace_*.jsonl files")->required();
  cmd->add_option("-o,--out", args.out_dir, "output directory for the HTML site");
  cmd->add_flag("--plain-text", args.plain_text, "print the findings to stdout instead of writing HTML");
  return cmd;
}

int run_report(const ReportArgs& args, std::ostream& out, std::ostream& err) {
  if (!args.plain_text && args.out_dir.empty()) {
    err << "protean report: give an output directory with -o OUT, or --plain-text\n";
    return 2;
  }
  try {
    auto t0 = std::chrono::steady_clock::now();
    rep::TraceModel model = rep::read_trace_dir(args.trace_dir);
    if (model.files.empty()) {
      err << fmt::format("protean report: no *.jsonl trace files in '{}': write a trace first with "
                         "`protean run ... --trace-dir {}` (or `demo --trace-dir`), or PROTEAN_TRACE={} for a program\n",
                         args.trace_dir, args.trace_dir, args.trace_dir);
      return 1;
    }
    rep::Analysis analysis = rep::analyse(model);
    if (args.plain_text) {
      out << rep::render_plain_text(model, analysis);
      return 0;
    }
    rep::write_html_site(model, analysis, args.out_dir);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& w : analysis.file_warnings) err << "protean report: warning: " << w << "\n";
    out << fmt::format("protean report: {} events from {} file(s) → {} ({:.2f} s)\n", model.total_events,
                       model.files.size(), (std::filesystem::path(args.out_dir) / "index.html").lexically_normal().string(),
                       secs);
    if (!analysis.allowlist_line.empty()) out << "suggested: " << analysis.allowlist_line << "\n";
    return 0;
  } catch (const protean::Error& e) {
    err << e.what() << "\n";
    return 1;
  }
}

}  // namespace protean::tools
