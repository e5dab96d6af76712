// The `protean` command line tool.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "protean/cache_cmd.h"
#include "protean/launch_cmd.h"
#include "protean/pgo_cmd.h"
#include "protean/protean.h"
#include "protean/report_cmd.h"
#include "protean/run_cmd.h"

namespace pt = protean;

int main(int argc, char** argv) {
  CLI::App app{"protean: a JIT compiler for tensor programs with dynamic shapes"};
  app.require_subcommand(1);
  pt::tools::RunArgs run_args;
  pt::tools::add_run_command(app, run_args);
  pt::tools::DemoArgs demo_args;
  pt::tools::add_demo_command(app, demo_args);
  auto* ver = app.add_subcommand("version", "print the version");
  pt::tools::ReportArgs report_args;
  pt::tools::add_report_subcommand(app, report_args);
  pt::tools::CacheArgs cache_args;
  pt::tools::add_cache_command(app, cache_args);
  pt::tools::PgoArgs pgo_args;
  auto* pgo_cmd = pt::tools::add_pgo_subcommand(app, pgo_args);
  pt::tools::LaunchArgs launch_args;
  pt::tools::add_launch_command(app, launch_args);
  // `protean launch ... -- PROGRAM ARGS...`: the ranks' command line is not parsed here.
  const int parsed_argc = pt::tools::split_launch_argv(argc, argv, launch_args);
  // A first word that is no command: name it and the commands (CLI11 would only say that a
  // subcommand is required).
  if (parsed_argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      known += (known.empty() ? "" : ", ") + sub->get_name();
      found = found || sub->get_name() == argv[1];
    }
    if (!found) {
      std::cerr << "protean: unknown command '" << argv[1] << "' (commands: " << known << "; see protean --help)\n";
      return 2;
    }
  }
  try {
    app.parse(parsed_argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    // Bad arguments exit with 2 in every command, as `protean report` and `protean launch` document
    // (CLI11's own codes are 100 and up); --help and --version exit with 0.
    return rc == 0 ? 0 : 2;
  }
  try {
    if (*ver) {
      std::cout << "protean " << pt::version() << "\n";
      return 0;
    }
    if (app.got_subcommand("run")) return pt::tools::run_command(run_args);
    if (app.got_subcommand("demo")) return pt::tools::demo_command(demo_args);
    if (app.got_subcommand("report")) return pt::tools::run_report(report_args, std::cout, std::cerr);
    if (app.got_subcommand("cache")) return pt::tools::cache_command(cache_args, std::cout, std::cerr);
    if (app.got_subcommand("launch")) return pt::tools::launch_command(launch_args, std::cerr);
    if (app.got_subcommand("pgo")) return pt::tools::run_pgo(*pgo_cmd, pgo_args, std::cout, std::cerr);
  } catch (const pt::Error& e) {
    std::cerr << "protean: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "protean: internal error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
