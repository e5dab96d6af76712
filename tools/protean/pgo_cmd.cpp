#include "protean/pgo_cmd.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>

#include "dynamic/profile_store.h"
#include "protean/error.h"

namespace protean::tools {

namespace fs = std::filesystem;
using dynamic::Profile;

CLI::App* add_pgo_subcommand(CLI::App& app, PgoArgs& args) {
  auto* pgo = app.add_subcommand("pgo", "inspect and maintain PGO profiles (PROTEAN_JOB_ID)");
  pgo->require_subcommand(1);
  auto* show = pgo->add_subcommand("show", "print a job's profile (or a profile file) with ? for dynamic dims");
  show->add_option("--job", args.job, "job id (default: PROTEAN_JOB_ID)");
  show->add_option("FILE", args.file, "a profile file instead of a job");
  auto* merge = pgo->add_subcommand("merge", "join profiles (dims only move toward dynamic)");
  merge->add_option("INPUTS", args.inputs, "profile files")->required()->expected(1, -1);
  merge->add_option("-o,--out", args.out, "output profile file")->required();
  auto* clear = pgo->add_subcommand("clear", "delete a job's local profiles");
  clear->add_option("--job", args.job, "job id (default: PROTEAN_JOB_ID)");
  clear->allow_extras();  // a positional job id is answered with a hint at --job (run_pgo)
  return pgo;
}

int run_pgo(const CLI::App& pgo_cmd, const PgoArgs& args, std::ostream& out, std::ostream& err) {
  if (pgo_cmd.got_subcommand("show")) return pgo_show(args, out, err);
  if (pgo_cmd.got_subcommand("merge")) return pgo_merge(args, out, err);
  if (pgo_cmd.got_subcommand("clear")) {
    const std::vector<std::string> extra = pgo_cmd.get_subcommand("clear")->remaining();
    if (!extra.empty() && extra.front().rfind("-", 0) == 0) {
      err << fmt::format("protean pgo clear: unknown option {} (see protean pgo clear --help)\n", extra.front());
      return 2;
    }
    PgoArgs with_stray = args;
    if (!extra.empty()) with_stray.stray_job = extra.front();
    return pgo_clear(with_stray, out, err);
  }
  err << "protean pgo: expected show, merge or clear\n";
  return 2;
}

namespace {

dynamic::PgoConfig job_config(const std::string& job) {
  dynamic::PgoConfig c = dynamic::PgoConfig::from_env();
  if (!job.empty()) c.job_id = job;
  if (c.job_id.empty()) throw ValueError("no job id: pass --job ID or set PROTEAN_JOB_ID");
  dynamic::check_job_id(c.job_id, job.empty() ? "PROTEAN_JOB_ID" : "--job");
  return c;
}

// Every rank's profile of a job, joined.
Profile load_job(const dynamic::PgoConfig& c, std::vector<std::string>& files) {
  Profile p;
  std::error_code ec;
  if (!fs::is_directory(c.job_dir(), ec)) return p;
  for (const auto& e : fs::directory_iterator(c.job_dir())) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank", 0) != 0 || e.path().extension() != ".json") continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const auto& f : files)
    if (auto q = dynamic::read_profile_file(f)) dynamic::merge(p, *q);
  return p;
}

}  // namespace

std::string render_profile(const Profile& p) {
  std::string r;
  std::vector<std::string> allow;
  std::set<std::string> seen;
  auto add_allow = [&](const std::string& s) {
    if (seen.insert(s).second) allow.push_back(s);
  };
  for (const auto& [key, f] : p.frames) {
    r += fmt::format("frame {}  ({}:{}, content hash {})\n", f.id.name, f.id.file, f.id.line, f.id.content_hash);
    std::string body = f.render();
    if (body.empty()) body = "(no sources)\n";
    size_t pos = 0;
    while (pos < body.size()) {
      size_t nl = body.find('\n', pos);
      r += "  " + body.substr(pos, nl - pos) + "\n";
      pos = nl + 1;
    }
    std::string calls;
    for (const auto& [src, s] : f.sources) {
      const bool param = src.rfind("self.", 0) == 0;
      if (s.rank_dynamic) {
        add_allow(src);
        calls += fmt::format("  // {}: its rank varies; only PROTEAN_DYNAMIC_SOURCES={} covers every dim\n", src, src);
      }
      for (size_t d = 0; d < s.sizes.size(); ++d) {
        if (!s.sizes[d].dynamic()) continue;
        add_allow(fmt::format("{}.size()[{}]", src, d));
        calls += fmt::format("  protean::mark_dynamic({}, {});{}\n", src, d,
                             param ? "  // a parameter: also set CompileOptions::dynamic_parameters" : "");
      }
      if (s.scalar.dynamic()) {
        add_allow(src);
        calls += fmt::format("  // {}: declare the argument protean::SymInt so it may vary without recompiling\n", src);
      }
    }
    if (!calls.empty()) r += "  to compile once from a cold start, before the first call:\n" + calls;
    r += "\n";
  }
  if (allow.empty())
    r += "no dynamic dims: nothing to mark\n";
  else
    r += fmt::format("PROTEAN_DYNAMIC_SOURCES={}\n", fmt::join(allow, ","));
  return r;
}

int pgo_show(const PgoArgs& args, std::ostream& out, std::ostream& err) {
  try {
    if (!args.file.empty()) {
      auto p = dynamic::read_profile_file(args.file);
      if (!p) {
        err << "protean pgo show: " << args.file << ": no such file";
        if (args.job.empty() && args.file.find('/') == std::string::npos && !fs::path(args.file).has_extension())
          err << " (to show a job's profile, pass the job id as --job: protean pgo show --job " << args.file << ")";
        err << "\n";
        return 1;
      }
      out << "profile " << args.file << "\n\n" << render_profile(*p);
      return 0;
    }
    dynamic::PgoConfig c = job_config(args.job);
    std::vector<std::string> files;
    Profile p = load_job(c, files);
    if (files.empty()) {
      err << fmt::format("protean pgo show: job {}: no profiles under {} (a run with --job-id {} or "
                         "PROTEAN_JOB_ID={} writes them)\n",
                         c.job_id, c.job_dir(), c.job_id, c.job_id);
      return 1;
    }
    out << fmt::format("job {}: {} ({} frames)\n\n", c.job_id, fmt::join(files, ", "), p.frames.size())
        << render_profile(p);
    return 0;
  } catch (const Error& e) {
    err << "protean pgo show: " << e.what() << "\n";
    return 1;
  }
}

int pgo_merge(const PgoArgs& args, std::ostream& out, std::ostream& err) {
  try {
    Profile p;
    for (const auto& in : args.inputs) {
      auto q = dynamic::read_profile_file(in);
      if (!q) throw RuntimeError(fmt::format("{}: no such file", in));
      dynamic::merge(p, *q);
    }
    if (args.out.empty()) throw RuntimeError("-o names no file");
    fs::path o(args.out);
    if (fs::is_directory(o)) throw RuntimeError(fmt::format("-o {} is a directory; name the profile file to write", args.out));
    if (o.has_parent_path()) fs::create_directories(o.parent_path());
    std::string tmp = args.out + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (!f) throw RuntimeError(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
      f << dynamic::dump_profile(p);
      f.close();  // the buffered tail is written here: a full disk shows only now
      if (!f) {
        const int e = errno;
        std::error_code ec;
        fs::remove(tmp, ec);
        throw RuntimeError(fmt::format("cannot write {}: {}; {} is unchanged", tmp, std::strerror(e), args.out));
      }
    }
    if (std::error_code ec; fs::rename(tmp, o, ec), ec) {
      fs::remove(tmp, ec);
      throw RuntimeError(fmt::format("cannot replace {}: {}; it is unchanged", args.out, ec.message()));
    }
    out << fmt::format("wrote {} ({} frames from {} profiles)\n", args.out, p.frames.size(), args.inputs.size());
    return 0;
  } catch (const Error& e) {
    err << "protean pgo merge: " << e.what() << "\n";
    return 1;
  } catch (const fs::filesystem_error& e) {
    err << "protean pgo merge: " << e.what() << "\n";
    return 1;
  }
}

int pgo_clear(const PgoArgs& args, std::ostream& out, std::ostream& err) {
  try {
    if (!args.stray_job.empty())
      throw ValueError(fmt::format("unexpected argument '{}': pass the job id as --job (protean pgo clear --job {})",
                                   args.stray_job, args.stray_job));
    dynamic::PgoConfig c = job_config(args.job);
    std::error_code ec;
    auto n = fs::remove_all(c.job_dir(), ec);
    if (ec) throw RuntimeError(fmt::format("cannot remove {}: {}", c.job_dir(), ec.message()));
    out << fmt::format("job {}: removed {} ({} files)\n", c.job_id, c.job_dir(), n > 0 ? n - 1 : 0);
    if (!c.remote.empty())
      out << fmt::format("note: the remote store {} is not cleared (delete its keys {}/rank*)\n", c.remote, c.job_id);
    return 0;
  } catch (const Error& e) {
    err << "protean pgo clear: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace protean::tools
