// Plain-text rendering of the report (`protean report DIR --plain-text`). The output is deterministic
// (it depends only on the trace contents, never on time or paths outside the trace) so golden tests
// can compare it.
#include <fmt/format.h>

#include <algorithm>

#include "observe/report.h"

namespace protean::observe::report {

namespace {

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string dim_name(const std::string& source, int64_t dim) {
  return dim >= 0 ? fmt::format("{} dim {}", source, dim) : source;
}

std::string ops_summary(const std::vector<std::string>& ops) {
  if (ops.empty()) return "(no ops)";
  constexpr size_t kShow = 8;
  std::vector<std::string> head(ops.begin(), ops.begin() + std::min(ops.size(), kShow));
  std::string s = join(head, ", ");
  if (ops.size() > kShow) s += fmt::format(", ... ({} ops)", ops.size());
  return s;
}

std::string loc_suffix(const SourceLocation& l) { return l.empty() ? "" : " at " + l.str(); }

/// A table with left-aligned columns separated by two spaces.
std::string table(const std::vector<std::vector<std::string>>& rows, std::string_view indent) {
  std::vector<size_t> w;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (w.size() <= i) w.push_back(0);
      w[i] = std::max(w[i], r[i].size());
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line(indent);
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(w[i] - r[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

void compile_lines(std::string& o, const Compile& c) {
  std::string head = fmt::format("    {}  {}", c.id, status_name(c.status));
  if (!c.phases.empty()) head += fmt::format("  {:.3f} s", c.total_seconds());
  if (!c.backend.empty() || !c.dynamic.empty())
    head += fmt::format("  [backend {}, dynamic {}]", c.backend.empty() ? "?" : c.backend,
                        c.dynamic.empty() ? "?" : c.dynamic);
  o += head + "\n";
  const std::string ind = "        ";
  for (const auto& r : c.reasons) o += ind + "reason: " + r + "\n";
  for (const auto& r : c.recompiled_as) o += ind + "recompiled as " + r + "\n";
  if (!c.error.empty()) o += ind + "error: " + c.error + "\n";
  for (const auto& b : c.graph_breaks)
    o += ind + "graph break: " + b.reason + (b.op.empty() ? "" : " (op " + b.op + ")") + loc_suffix(b.loc) + "\n";
  if (c.has_graph) {
    o += ind + fmt::format("graph: {} op{}", c.ops.size(), c.ops.size() == 1 ? "" : "s");
    if (!c.graph_hash.empty()) o += ", hash " + c.graph_hash;
    std::vector<std::string> ins;
    for (const auto& in : c.inputs) ins.push_back(fmt::format("{} {}[{}]", in.source, in.dtype, join(in.sizes, ", ")));
    if (!ins.empty()) o += "; inputs " + join(ins, ", ");
    o += "\n";
    if (c.backward_ops + c.optimizer_ops > 0)
      o += ind + fmt::format("train step parts: forward {} ops, backward {} ops, optimizer {} ops\n", c.forward_ops,
                             c.backward_ops, c.optimizer_ops);
  }
  int64_t guards = c.guard_count >= 0 ? c.guard_count : c.metric_guard_count;
  // the installed guard set (one line per guard after merging equivalent ones), not the events below
  if (guards >= 0) o += ind + fmt::format("guards installed: {}", guards) + "\n";
  for (const auto& g : c.guards_added) o += ind + "guard added: " + g.expr + loc_suffix(g.loc) + "\n";
  for (const auto& s : c.symbols)
    o += ind + fmt::format("symbol: {} = {} for {} {}{}", s.symbol, s.hint, s.source, s.range, loc_suffix(s.loc)) + "\n";
  for (const auto& d : c.decisions)
    if (notable_decision(d))
      o += ind + fmt::format("decision: {} {} ({}{})", dim_name(d.source, d.dim), d.decision, d.why,
                             d.value.empty() ? "" : ", saw " + d.value) + "\n";
  for (const auto& s : c.specializations)
    o += ind + fmt::format("specialization: {} = {} (sources {}){}{}", s.symbol, s.value, join(s.sources, ", "),
                           s.reason.empty() ? "" : ": " + s.reason, loc_suffix(s.loc)) + "\n";
  for (const auto& a : c.artifacts) {
    o += ind + fmt::format("artifact: {} {} ({} bytes)", a.kind, a.name, a.text.size()) + "\n";
    if (a.kind != "size_buckets") continue;  // short and read by people: shown inline (docs/graphs.md)
    size_t pos = 0;
    while (pos < a.text.size()) {
      size_t end = a.text.find('\n', pos);
      if (end == std::string::npos) end = a.text.size();
      o += ind + "  " + a.text.substr(pos, end - pos) + "\n";
      pos = end + 1;
    }
  }
  if (!c.cache_events.empty()) {
    std::vector<std::string> ev;
    for (const auto& e : c.cache_events) ev.push_back(e.tier + " " + e.result);
    o += ind + "cache: " + join(ev, ", ") + "\n";
  }
}

}  // namespace

std::string render_plain_text(const TraceModel& m, const Analysis& a) {
  std::string o;
  o += fmt::format("protean report: {} file{}, {} process{}, {} events\n", m.files.size(), m.files.size() == 1 ? "" : "s",
                   m.processes.size(), m.processes.size() == 1 ? "" : "es", m.total_events);
  for (const auto& p : m.processes)
    o += fmt::format("  {}: pid {}, files {}\n", p.label, p.pid, join(p.files, ", "));

  o += "\n== Warnings ==\n";
  if (a.file_warnings.empty()) o += "  none\n";
  for (const auto& w : a.file_warnings) o += "  " + w + "\n";

  o += "\n== Compiles ==\n";
  std::vector<std::string> counts;
  for (const auto& [k, v] : a.status_counts) counts.push_back(fmt::format("{} {}", v, k));
  o += "  " + (counts.empty() ? std::string("no compiles") : join(counts, ", ")) + "\n";
  for (const auto& p : m.processes) {
    o += p.label + "\n";
    for (const auto& line : p.pgo) o += "  pgo: " + line + "\n";
    if (std::string cs = cache_summary(p); !cs.empty()) o += "  artifact cache: " + cs + "\n";
    for (const auto& [fid, f] : p.frames) {
      o += fmt::format("  frame {}: {}{}\n", fid, f.function.empty() ? "?" : f.function, loc_suffix(f.loc));
      for (const auto& [k, c] : f.compiles) compile_lines(o, c);
      for (const auto& b : f.graph_breaks)
        o += "    graph break: " + b.reason + (b.op.empty() ? "" : " (op " + b.op + ")") + loc_suffix(b.loc) + "\n";
      for (const auto& r : f.eager_fallbacks) o += "    eager fallback: " + r + "\n";
    }
  }

  o += "\n== Similar graphs ==\n";
  if (a.groups.empty()) o += "  none\n";
  for (const auto& g : a.groups) {
    const Process& p = m.processes[g.process];
    o += fmt::format("{}, frame {} {}: {}\n", p.label, g.frame, g.function.empty() ? "?" : g.function, join(g.members, ", "));
    o += "  ops: " + ops_summary(g.ops) + "\n";
    if (!g.inputs_desc.empty()) o += "  inputs: " + g.inputs_desc + "\n";
    if (g.rows.empty()) {
      o += "  sizes identical: these recompiles are not about sizes; dynamic shapes will not remove them\n";
      continue;
    }
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> head = {"source/dim"};
    head.insert(head.end(), g.members.begin(), g.members.end());
    rows.push_back(head);
    for (const auto& r : g.rows) {
      std::vector<std::string> row = {dim_name(r.source, r.dim)};
      row.insert(row.end(), r.values.begin(), r.values.end());
      rows.push_back(row);
    }
    o += table(rows, "  ");
    for (const auto& r : g.rows)
      o += fmt::format("  suggestion: {} took {} → make it dynamic\n", dim_name(r.source, r.dim), join(r.concrete, ", "));
  }

  o += "\n== Dynamic decisions ==\n";
  if (a.suggestions.empty()) {
    o += "  nothing to suggest\n";
  } else {
    // Per compiled function: the allowlist entry to set, and the C++ lines to paste before its call.
    for (const auto& fs : a.per_function) {
      const std::string fn = fs.function.empty() ? "?" : fs.function;
      o += fmt::format("function {}:\n", fn);
      o += fs.allowlist_line + "\n";
      for (const auto& c : fs.mark_dynamic_calls)
        o += c + (c.rfind("//", 0) == 0 ? "\n" : fmt::format("  // in C++, before calling {}\n", fn));
    }
    if (a.per_function.size() > 1) o += "every function at once: " + a.allowlist_line + "\n";
    o += "why:\n";
    for (const auto& s : a.suggestions) {
      o += fmt::format("  {}{}\n", dim_name(s.source, s.dim), s.values.empty() ? "" : " took " + join(s.values, ", "));
      for (const auto& e : s.evidence) o += "    " + e + "\n";
    }
  }
  for (const auto& u : a.already_dynamic)
    o += fmt::format("  already dynamic: {} ({})\n", dim_name(u.source, u.dim), u.why);

  for (const auto& n : a.run_notes) o += "\nNOTE: " + n + "\n";
  if (a.multi_rank) {
    o += "\n== Ranks ==\n";
    if (a.rank_warnings.empty()) o += "  all ranks compiled the same graphs\n";
    for (const auto& w : a.rank_warnings) o += "  WARNING: " + w + "\n";
    if (!a.rank_warnings.empty())
      o += "  hint: enable compiler collectives so all ranks agree on dynamic dims before the first compile\n";
  }
  return o;
}

}  // namespace protean::observe::report
