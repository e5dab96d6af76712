// HTML rendering of the report: a static site (no server, no network, no external CSS or JS; the
// stylesheet is inlined and there is no script at all). Every string that comes from the trace goes
// through html_escape.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/files.h"
#include "observe/report.h"
#include "observe/report_parallel.h"
#include "protean/error.h"

namespace protean::observe::report {

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string compile_page_name(const TraceModel& m, const Process& p, const Compile& c) {
  std::string base;
  if (c.frame >= 0 && c.index >= 0) {
    base = fmt::format("compile_{}_{}", c.frame, c.index);
  } else {
    std::string clean;
    for (char ch : c.id)
      if (std::isalnum(static_cast<unsigned char>(ch))) clean += ch;
    if (clean.size() > 32) clean.resize(32);
    base = fmt::format("compile_x{}_{:08x}", clean, static_cast<uint32_t>(std::hash<std::string>{}(c.id)));
  }
  if (m.processes.size() > 1) {
    bool shared_rank = p.label.find(" pid ") != std::string::npos;
    base += shared_rank ? fmt::format("_rank{}_pid{}", p.rank, p.pid) : fmt::format("_rank{}", p.rank);
  }
  return base + ".html";
}

std::string chromium_events_json(const TraceModel& m) {
  using nlohmann::json;
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  auto emit = [&](const json& e) {
    if (!first) out += ",\n";
    first = false;
    out += e.dump(-1, ' ', false, json::error_handler_t::replace);
  };
  for (const auto& p : m.processes) {
    emit({{"name", "process_name"}, {"ph", "M"}, {"pid", p.rank}, {"tid", p.rank}, {"args", {{"name", p.label}}}});
    for (const auto& e : p.chromium) {
      json ev = {{"name", e.name}, {"ph", e.ph}, {"ts", e.ts}, {"pid", p.rank}, {"tid", p.rank}};
      if (e.ph == "X") ev["dur"] = e.dur;
      if (!e.args_json.empty()) ev["args"] = json::parse(e.args_json, nullptr, false);
      if (ev.contains("args") && ev["args"].is_discarded()) ev.erase("args");
      emit(ev);
    }
  }
  out += "]}\n";
  return out;
}

namespace {

const char* kCss = R"(body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#fafafa}
header{background:#22313f;color:#fff;padding:10px 20px}header a{color:#cfe3ff;margin-right:16px;text-decoration:none}
header b{margin-right:24px}main{padding:12px 24px;max-width:1400px}h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px}pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;font:12px/1.4 ui-monospace,Menlo,monospace}
code{font:12px ui-monospace,Menlo,monospace}table{border-collapse:collapse;margin:6px 0}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f4}ul.tree{list-style:none;padding-left:14px}ul.tree li{margin:2px 0}
.st{display:inline-block;border-radius:3px;padding:0 6px;font-size:12px;color:#fff;margin:0 6px}
.success{background:#2e7d32}.recompiled{background:#ef6c00}.graph-break{background:#6a1b9a}.error{background:#c62828}.unknown{background:#757575}
.warn{background:#fff3cd;border:1px solid #e0c060;padding:6px 10px;margin:4px 0}.reason{color:#7a3b00}.muted{color:#666}
.suggest{background:#e8f5e9;border:1px solid #81c784;padding:6px 10px;margin:6px 0}.dyn{font-weight:bold;color:#c62828})";

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string esc(std::string_view s) { return html_escape(s); }

std::string status_class(Status s) {
  switch (s) {
    case Status::Success: return "success";
    case Status::Recompiled: return "recompiled";
    case Status::GraphBreak: return "graph-break";
    case Status::Error: return "error";
    case Status::Unknown: return "unknown";
  }
  return "unknown";
}

std::string badge(Status s) {
  return fmt::format("<span class=\"st {}\">{}</span>", status_class(s), status_name(s));
}

std::string dim_name(const std::string& source, int64_t dim) {
  return dim >= 0 ? fmt::format("{} dim {}", source, dim) : source;
}

std::string loc_html(const SourceLocation& l) { return l.empty() ? "" : "<code>" + esc(l.str()) + "</code>"; }

std::string page(const std::string& title, const std::string& body, bool multi_rank) {
  std::string nav = "<a href=\"index.html\">Index</a><a href=\"dynamic.html\">Dynamic decisions</a>";
  if (multi_rank) nav += "<a href=\"ranks.html\">Ranks</a>";
  nav += "<a href=\"chromium_events.json\">chromium_events.json</a>";
  return fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{}</style></head>\n"
      "<body><header><b>protean report</b>{}</header><main>\n{}\n</main></body></html>\n",
      esc(title), kCss, nav, body);
}

void write_file(const std::filesystem::path& path, const std::string& text) {
  // whole or not at all: a full disk left an empty index.html and no reason
  core::write_file_atomic(path.string(), text, "protean report");
}

/// Inline SVG: one stacked horizontal bar per compile, one colour per phase.
std::string phase_plot(const Process& p) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  constexpr size_t kMaxBars = 400;
  std::vector<const Compile*> cs;
  std::vector<std::string> phases;
  double max_total = 0;
  size_t all = 0;
  for (const auto& [fid, f] : p.frames)
    for (const auto& [k, c] : f.compiles) {
      if (c.phases.empty()) continue;
      ++all;
      if (cs.size() >= kMaxBars) continue;
      cs.push_back(&c);
      max_total = std::max(max_total, c.total_seconds());
      for (const auto& ph : c.phases)
        if (std::find(phases.begin(), phases.end(), ph.name) == phases.end()) phases.push_back(ph.name);
    }
  if (cs.empty()) return "<p class=\"muted\">no compilation_metrics phases in this trace</p>";
  const int label_w = 110, chart_w = 760, bar_h = 16, gap = 4, top = 26;
  const int height = top + static_cast<int>(cs.size()) * (bar_h + gap) + 10;
  auto color = [&](const std::string& name) {
    size_t i = std::find(phases.begin(), phases.end(), name) - phases.begin();
    return kColors[i % std::size(kColors)];
  };
  std::string s = fmt::format(
      "<svg width=\"{}\" height=\"{}\" font-size=\"11\" font-family=\"monospace\">",
      label_w + chart_w + 90, height);
  int lx = label_w;
  for (const auto& ph : phases) {
    s += fmt::format("<rect x=\"{}\" y=\"4\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"13\">{}</text>", lx,
                     color(ph), lx + 13, esc(ph));
    lx += 20 + static_cast<int>(ph.size()) * 7;
  }
  double scale = max_total > 0 ? chart_w / max_total : 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    const Compile& c = *cs[i];
    int y = top + static_cast<int>(i) * (bar_h + gap);
    s += fmt::format("<text x=\"0\" y=\"{}\">{}</text>", y + 12, esc(c.id));
    double x = label_w;
    for (const auto& ph : c.phases) {
      double w = ph.seconds * scale;
      s += fmt::format("<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{} {}: {:.4f} s</title></rect>",
                       x, y, std::max(w, 0.0), bar_h, color(ph.name), esc(c.id), esc(ph.name), ph.seconds);
      x += w;
    }
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\">{:.3f} s</text>", x + 4, y + 12, c.total_seconds());
  }
  s += "</svg>";
  if (all > cs.size()) s += fmt::format("<p class=\"muted\">first {} of {} compiles shown</p>", cs.size(), all);
  return s;
}

std::string group_html(const SimilarGroup& g, const std::unordered_map<std::string, std::string>& page_of) {
  std::string s = "<div class=\"group\"><p>Similar graphs ";
  std::vector<std::string> links;
  for (const auto& id : g.members) {
    auto it = page_of.find(id);
    std::string href = it == page_of.end() ? "" : it->second;
    links.push_back(fmt::format("<a href=\"{}\">{}</a>", esc(href), esc(id)));
  }
  s += join(links, ", ") + ": same op sequence";
  if (!g.inputs_desc.empty()) s += " and inputs (<code>" + esc(g.inputs_desc) + "</code>)";
  s += "</p>";
  if (g.rows.empty()) {
    s += "<p class=\"muted\">Sizes are identical: these recompiles are not about sizes, so dynamic shapes will not "
         "remove them. Compare the guards and recompile reasons.</p></div>";
    return s;
  }
  s += "<table><tr><th>source/dim</th>";
  for (const auto& id : g.members) s += "<th>" + esc(id) + "</th>";
  s += "</tr>";
  for (const auto& r : g.rows) {
    s += "<tr><td>" + esc(dim_name(r.source, r.dim)) + "</td>";
    for (const auto& v : r.values) s += "<td>" + esc(v) + "</td>";
    s += "</tr>";
  }
  s += "</table>";
  for (const auto& r : g.rows)
    s += fmt::format("<div class=\"suggest\">{} took {} → make it dynamic</div>", esc(dim_name(r.source, r.dim)),
                     esc(join(r.concrete, ", ")));
  return s + "</div>";
}

std::string index_page(const TraceModel& m, const Analysis& a) {
  std::string b = "<h1>Compilation report</h1>";
  b += fmt::format("<p>{} file(s), {} process(es), {} events. ", m.files.size(), m.processes.size(), m.total_events);
  std::vector<std::string> counts;
  for (const auto& [k, v] : a.status_counts) counts.push_back(fmt::format("{} {}", v, k));
  b += esc(join(counts, ", ")) + "</p>";
  for (const auto& fs : a.per_function)
    b += "<div class=\"suggest\">Suggested for " + esc(fs.function.empty() ? "?" : fs.function) + ": <code>" +
         esc(fs.allowlist_line) + "</code> or <code>" + esc(join(fs.mark_dynamic_calls, " ")) +
         "</code> — see <a href=\"dynamic.html\">dynamic decisions</a></div>";
  for (const auto& w : a.file_warnings) b += "<div class=\"warn\">" + esc(w) + "</div>";
  for (const auto& w : a.run_notes) b += "<div class=\"warn\">" + esc(w) + "</div>";
  if (a.multi_rank && !a.rank_warnings.empty())
    b += fmt::format("<div class=\"warn\">{} rank disagreement(s): see <a href=\"ranks.html\">ranks</a></div>",
                     a.rank_warnings.size());
  for (size_t pi = 0; pi < m.processes.size(); ++pi) {
    const Process& p = m.processes[pi];
    b += "<h2>" + esc(p.label) + fmt::format(" <span class=\"muted\">pid {}", p.pid);
    if (!p.host.empty()) b += ", host " + esc(p.host);
    b += ", " + esc(join(p.files, ", ")) + "</span></h2>";
    for (const auto& line : p.pgo) b += "<p class=\"muted\">pgo: " + esc(line) + "</p>";
    if (std::string cs = cache_summary(p); !cs.empty()) b += "<p class=\"muted\">artifact cache: " + esc(cs) + "</p>";
    // Tree: function → user location → frame → compiles.
    std::unordered_map<std::string, std::string> page_of;
    for (const auto& [fid, f] : p.frames)
      for (const auto& [k, c] : f.compiles) page_of.emplace(c.id, compile_page_name(m, p, c));
    std::map<std::pair<std::string, std::string>, std::vector<const Frame*>> tree;
    for (const auto& [fid, f] : p.frames) tree[{f.function.empty() ? "?" : f.function, f.loc.str()}].push_back(&f);
    b += "<ul class=\"tree\">";
    for (const auto& [key, frames] : tree) {
      b += "<li><b>" + esc(key.first) + "</b> <code>" + esc(key.second) + "</code><ul class=\"tree\">";
      for (const Frame* f : frames) {
        b += fmt::format("<li>frame {}<ul class=\"tree\">", f->id);
        for (const auto& [k, c] : f->compiles) {
          b += fmt::format("<li><a href=\"{}\">{}</a>{}", esc(compile_page_name(m, p, c)), esc(c.id), badge(c.status));
          if (!c.phases.empty()) b += fmt::format("<span class=\"muted\">{:.3f} s</span>", c.total_seconds());
          for (const auto& r : c.reasons) b += "<div class=\"reason\">reason: " + esc(r) + "</div>";
          for (const auto& r : c.recompiled_as) b += "<div class=\"reason\">recompiled as " + esc(r) + "</div>";
          for (const auto& g : c.graph_breaks)
            b += "<div class=\"reason\">graph break: " + esc(g.reason) + " " + loc_html(g.loc) + "</div>";
          if (!c.error.empty()) b += "<div class=\"reason\">error: " + esc(c.error) + "</div>";
          b += "</li>";
        }
        for (const auto& g : f->graph_breaks)
          b += "<li class=\"reason\">graph break: " + esc(g.reason) + " " + loc_html(g.loc) + "</li>";
        for (const auto& r : f->eager_fallbacks) b += "<li class=\"reason\">eager fallback: " + esc(r) + "</li>";
        b += "</ul>";
        bool any = false;
        for (const auto& g : a.groups)
          if (g.process == pi && g.frame == f->id) {
            if (!any) b += "<h3>Similar graphs</h3>";
            any = true;
            b += group_html(g, page_of);
          }
        b += "</li>";
      }
      b += "</ul></li>";
    }
    b += "</ul>";
    b += "<h3>Compile time per phase</h3>" + phase_plot(p);
  }
  return page("protean report", b, a.multi_rank);
}

std::string compile_page(const TraceModel& m, const Analysis& a, size_t pi, const Frame& f, const Compile& c) {
  const Process& p = m.processes[pi];
  std::string b = fmt::format("<h1>Compile {}{}</h1>", esc(c.id), badge(c.status));
  b += "<p>" + esc(c.function.empty() ? f.function : c.function) + " " + loc_html(c.loc.empty() ? f.loc : c.loc);
  if (m.processes.size() > 1) b += " — " + esc(p.label);
  if (!c.backend.empty()) b += " — backend <code>" + esc(c.backend) + "</code>";
  if (!c.dynamic.empty()) b += " — dynamic <code>" + esc(c.dynamic) + "</code>";
  b += "</p>";
  b += "<h2>Recompile reasons</h2>";
  if (c.reasons.empty()) b += "<p class=\"muted\">first compile of this frame (no reasons)</p>";
  for (const auto& r : c.reasons) b += "<div class=\"reason\">" + esc(r) + "</div>";
  for (const auto& r : c.recompiled_as) b += "<div class=\"reason\">later recompiled as " + esc(r) + "</div>";
  if (!c.error.empty()) b += "<h2>Error</h2><pre>" + esc(c.error) + "</pre>";
  if (!c.graph_breaks.empty()) {
    b += "<h2>Graph breaks</h2><table><tr><th>reason</th><th>op</th><th>location</th></tr>";
    for (const auto& g : c.graph_breaks)
      b += "<tr><td>" + esc(g.reason) + "</td><td>" + esc(g.op) + "</td><td>" + loc_html(g.loc) + "</td></tr>";
    b += "</table>";
  }
  b += "<h2>Graph</h2>";
  if (!c.has_graph) {
    b += "<p class=\"muted\">no graph event</p>";
  } else {
    b += fmt::format("<p>{} ops", c.ops.size());
    if (c.node_count >= 0) b += fmt::format(", {} nodes", c.node_count);
    if (!c.graph_hash.empty()) b += ", graph_hash <code>" + esc(c.graph_hash) + "</code>";
    b += "</p>";
    if (c.backward_ops + c.optimizer_ops > 0)  // a training step: forward, backward and optimizer parts
      b += fmt::format("<table><tr><th>part</th><th>ops</th></tr><tr><td>forward</td><td>{}</td></tr>"
                       "<tr><td>backward <code>[bwd of …]</code></td><td>{}</td></tr>"
                       "<tr><td>optimizer <code>[optim at …]</code></td><td>{}</td></tr></table>",
                       c.forward_ops, c.backward_ops, c.optimizer_ops);
    if (!c.inputs.empty()) {
      b += "<table><tr><th>input</th><th>dtype</th><th>sizes</th></tr>";
      for (const auto& in : c.inputs)
        b += "<tr><td>" + esc(in.source) + "</td><td>" + esc(in.dtype) + "</td><td>[" + esc(join(in.sizes, ", ")) + "]</td></tr>";
      b += "</table>";
    }
    b += "<pre>" + esc(c.ir) + "</pre>";
  }
  b += "<h2>Guards</h2>";
  if (!c.guards_text.empty()) b += "<pre>" + esc(c.guards_text) + "</pre>";
  else b += "<p class=\"muted\">no guards event</p>";
  if (!c.guards_added.empty()) {
    b += "<table><tr><th>guard added</th><th>location</th></tr>";
    for (const auto& g : c.guards_added) b += "<tr><td><code>" + esc(g.expr) + "</code></td><td>" + loc_html(g.loc) + "</td></tr>";
    b += "</table>";
  }
  b += "<h2>Created symbols</h2>";
  if (c.symbols.empty()) b += "<p class=\"muted\">none (a fully static graph)</p>";
  else {
    b += "<table><tr><th>symbol</th><th>hint</th><th>source</th><th>range</th><th>location</th></tr>";
    for (const auto& s : c.symbols)
      b += "<tr><td>" + esc(s.symbol) + "</td><td>" + esc(s.hint) + "</td><td><code>" + esc(s.source) + "</code></td><td>" +
           esc(s.range) + "</td><td>" + loc_html(s.loc) + "</td></tr>";
    b += "</table>";
  }
  b += "<h2>Specializations</h2>";
  if (c.specializations.empty()) b += "<p class=\"muted\">none</p>";
  else {
    b += "<table><tr><th>symbol</th><th>sources</th><th>value</th><th>reason</th><th>user location</th></tr>";
    for (const auto& s : c.specializations)
      b += "<tr><td>" + esc(s.symbol) + "</td><td><code>" + esc(join(s.sources, ", ")) + "</code></td><td>" + esc(s.value) +
           "</td><td>" + esc(s.reason) + "</td><td>" + loc_html(s.loc) + "</td></tr>";
    b += "</table>";
  }
  b += "<h2>Dimension decisions</h2>";
  if (c.decisions.empty()) b += "<p class=\"muted\">none recorded</p>";
  else {
    b += "<table><tr><th>source/dim</th><th>decision</th><th>why</th><th>value</th></tr>";
    for (const auto& d : c.decisions)
      b += fmt::format("<tr><td>{}</td><td{}>{}</td><td>{}</td><td>{}</td></tr>", esc(dim_name(d.source, d.dim)),
                       d.decision == "static" ? "" : " class=\"dyn\"", esc(d.decision), esc(d.why), esc(d.value));
    b += "</table>";
  }
  b += "<h2>Metrics</h2>";
  if (!c.has_metrics) b += "<p class=\"muted\">no compilation_metrics event (the process may have stopped mid-compile)</p>";
  else {
    b += "<table><tr><th>phase</th><th>seconds</th></tr>";
    for (const auto& ph : c.phases) b += fmt::format("<tr><td>{}</td><td>{:.4f}</td></tr>", esc(ph.name), ph.seconds);
    b += fmt::format("<tr><th>total</th><th>{:.4f}</th></tr></table>", c.total_seconds());
    b += "<p>";
    if (!c.metrics_status.empty()) b += "status <code>" + esc(c.metrics_status) + "</code>; ";
    if (c.metric_guard_count >= 0) b += fmt::format("{} guards; ", c.metric_guard_count);
    if (c.metric_node_count >= 0) b += fmt::format("{} nodes; ", c.metric_node_count);
    if (c.graph_count >= 0) b += fmt::format("{} graphs; ", c.graph_count);
    std::vector<std::string> cache;
    for (const auto& [tier, r] : c.cache) cache.push_back(tier + " " + r);
    if (!cache.empty()) b += "cache: " + esc(join(cache, ", "));
    b += "</p>";
  }
  if (!c.cache_events.empty()) {
    b += "<h3>Cache events</h3><table><tr><th>tier</th><th>result</th><th>key</th></tr>";
    for (const auto& e : c.cache_events)
      b += "<tr><td>" + esc(e.tier) + "</td><td>" + esc(e.result) + "</td><td><code>" + esc(e.key) + "</code></td></tr>";
    b += "</table>";
  }
  b += "<h2>Generated code and artifacts</h2>";
  if (c.artifacts.empty()) b += "<p class=\"muted\">none</p>";
  for (const auto& art : c.artifacts)
    b += "<details><summary>" + esc(art.kind) + " <code>" + esc(art.name) + fmt::format("</code> ({} bytes)</summary><pre>",
                                                                                       art.text.size()) +
         esc(art.text) + "</pre></details>";
  return page("compile " + c.id, b, a.multi_rank);
}

std::string dynamic_page(const TraceModel& m, const Analysis& a) {
  std::string b = "<h1>Dynamic decisions</h1>";
  if (a.suggestions.empty()) {
    b += "<p>Nothing to suggest: no similar graphs with differing sizes and no automatically dynamic dims.</p>";
  } else {
    b += "<p>Declare these dims dynamic up front so the first compile is already the dynamic graph: per compiled "
         "function, either set the allowlist in the environment or mark the inputs in C++ before calling it.</p>";
    for (const auto& fs : a.per_function) {
      const std::string fn = esc(fs.function.empty() ? "?" : fs.function);
      b += "<h2>" + fn + "</h2><pre class=\"allowlist\">" + esc(fs.allowlist_line) +
           "</pre><p>or, in C++ before each call of " + fn + ":</p><pre class=\"mark-dynamic\">" +
           esc(join(fs.mark_dynamic_calls, "\n")) + "</pre>";
    }
    if (a.per_function.size() > 1)
      b += "<p>Every function at once:</p><pre id=\"allowlist\">" + esc(a.allowlist_line) + "</pre>";
    b += "<h2>Why</h2><table><tr><th>source/dim</th><th>sizes seen</th><th>evidence</th></tr>";
    for (const auto& s : a.suggestions)
      b += "<tr><td>" + esc(dim_name(s.source, s.dim)) + "</td><td>" + esc(join(s.values, ", ")) + "</td><td>" +
           esc(join(s.evidence, "\n")) + "</td></tr>";
    b += "</table>";
  }
  if (!a.already_dynamic.empty()) {
    b += "<h2>Already declared dynamic</h2><ul>";
    for (const auto& u : a.already_dynamic) b += "<li>" + esc(dim_name(u.source, u.dim)) + " (" + esc(u.why) + ")</li>";
    b += "</ul>";
  }
  b += "<h2>Dimension decisions in this trace</h2><table><tr><th>process</th><th>compile</th><th>source/dim</th>"
       "<th>decision</th><th>why</th><th>value</th></tr>";
  size_t rows = 0;
  for (const auto& p : m.processes)
    for (const auto& [fid, f] : p.frames)
      for (const auto& [k, c] : f.compiles)
        for (const auto& d : c.decisions) {
          if (!notable_decision(d)) continue;
          if (++rows > 2000) continue;
          b += fmt::format("<tr><td>{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                           esc(p.label), esc(compile_page_name(m, p, c)), esc(c.id), esc(dim_name(d.source, d.dim)),
                           esc(d.decision), esc(d.why), esc(d.value));
        }
  b += "</table>";
  if (rows > 2000) b += fmt::format("<p class=\"muted\">first 2000 of {} decisions shown</p>", rows);
  return page("dynamic decisions", b, a.multi_rank);
}

std::string ranks_page(const TraceModel& m, const Analysis& a) {
  std::string b = "<h1>Ranks</h1><table><tr><th>process</th><th>pid</th><th>frames</th><th>compiles</th><th>files</th></tr>";
  for (const auto& p : m.processes) {
    size_t n = 0;
    for (const auto& [fid, f] : p.frames) n += f.compiles.size();
    b += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(p.label), p.pid, p.frames.size(),
                     n, esc(join(p.files, ", ")));
  }
  b += "</table>";
  if (a.rank_warnings.empty()) b += "<p>All ranks compiled the same compile ids with the same graphs.</p>";
  else
    b += "<p>Ranks that compile different graphs recompile at different times and can stall each other in "
         "collectives; enable compiler collectives so they agree on dynamic dims before the first compile.</p>";
  for (const auto& w : a.rank_warnings) b += "<div class=\"warn\">" + esc(w) + "</div>";
  return page("ranks", b, a.multi_rank);
}

}  // namespace

void write_html_site(const TraceModel& m, const Analysis& a, const std::filesystem::path& out) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) throw RuntimeError(fmt::format("protean report: cannot create '{}': {}", out.string(), ec.message()));
  write_file(out / "index.html", index_page(m, a));
  write_file(out / "dynamic.html", dynamic_page(m, a));
  if (a.multi_rank) write_file(out / "ranks.html", ranks_page(m, a));
  struct Item {
    size_t process;
    const Frame* frame;
    const Compile* compile;
  };
  std::vector<Item> items;
  for (size_t pi = 0; pi < m.processes.size(); ++pi)
    for (const auto& [fid, f] : m.processes[pi].frames)
      for (const auto& [k, c] : f.compiles) items.push_back({pi, &f, &c});
  parallel_for(items.size(), [&](size_t i) {
    const Item& it = items[i];
    write_file(out / compile_page_name(m, m.processes[it.process], *it.compile),
               compile_page(m, a, it.process, *it.frame, *it.compile));
  }, 16);
  write_file(out / "chromium_events.json", chromium_events_json(m));
}

}  // namespace protean::observe::report
