// Trace reader for `protean report`: JSON lines → TraceModel. Tolerant by construction: every access
// to an event field goes through a typed getter that defaults and counts on a type mismatch, and a
// line that cannot be used at all is counted, never thrown.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>

#include "core/files.h"
#include "observe/report.h"
#include "observe/report_parallel.h"
#include "observe/trace.h"
#include "protean/error.h"

namespace protean::observe::report {

using nlohmann::json;

const char* status_name(Status s) {
  switch (s) {
    case Status::Success: return "success";
    case Status::Recompiled: return "recompiled";
    case Status::GraphBreak: return "graph break";
    case Status::Error: return "error";
    case Status::Unknown: return "unknown";
  }
  return "unknown";
}

double Compile::total_seconds() const {
  double t = 0;
  for (const auto& p : phases) t += p.seconds;
  return t;
}

namespace {

/// Per-line reading context: typed getters record the first wrongly typed field.
struct Line {
  explicit Line(const json& j) : e(j) {}
  const json& e;
  bool bad = false;
  std::string bad_field;

  void mark(const char* k) {
    if (!bad) bad_field = k;
    bad = true;
  }
  const json* find(const char* k) {
    auto it = e.find(k);
    if (it == e.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool has(const char* k) { return find(k) != nullptr; }
  std::string str(const char* k) {
    const json* v = find(k);
    if (!v) return {};
    if (v->is_string()) return v->get<std::string>();
    mark(k);
    if (v->is_number() || v->is_boolean()) return v->dump();
    return {};
  }
  int64_t integer(const char* k, int64_t dflt) {
    const json* v = find(k);
    if (!v) return dflt;
    if (v->is_number_integer()) return v->get<int64_t>();
    if (v->is_number_unsigned()) return static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX));
    if (v->is_number_float()) {  // 3.0 is accepted as 3
      double d = v->get<double>();
      if (std::isfinite(d) && std::fabs(d) < 9e18 && d == std::trunc(d)) return static_cast<int64_t>(d);
    }
    mark(k);
    return dflt;
  }
  /// Any scalar as text (numbers, strings, booleans); objects/arrays are dumped.
  std::string scalar(const char* k) {
    const json* v = find(k);
    if (!v) return {};
    if (v->is_string()) return v->get<std::string>();
    return v->dump(-1, ' ', false, json::error_handler_t::replace);
  }
  std::vector<std::string> strings(const char* k) {
    std::vector<std::string> out;
    const json* v = find(k);
    if (!v) return out;
    if (v->is_string()) {  // tolerate a single string
      mark(k);
      out.push_back(v->get<std::string>());
      return out;
    }
    if (!v->is_array()) {
      mark(k);
      return out;
    }
    for (const auto& x : *v) {
      if (x.is_string()) out.push_back(x.get<std::string>());
      else if (x.is_number()) out.push_back(x.dump());
      else mark(k);
    }
    return out;
  }
  SourceLocation location(const char* k = "location") {
    SourceLocation l;
    const json* v = find(k);
    if (!v) return l;
    if (!v->is_object()) {
      mark(k);
      return l;
    }
    Line sub{*v};
    l.file = sub.str("file");
    const int64_t line = sub.integer("line", 0);
    if (line > std::numeric_limits<int>::max()) sub.mark("line");  // kept as unknown
    else if (line > 0) l.line = static_cast<int>(line);
    l.function = sub.str("function");
    if (sub.bad) mark(k);
    return l;
  }
};

const std::set<std::string, std::less<>>& known_events() {
  static const std::set<std::string, std::less<>> k = {
      "process_start", "compile_start", "dimension_decision", "create_symbol", "guard_added",
      "specialization", "graph", "guards", "recompile", "graph_break", "compilation_metrics",
      "artifact", "pgo", "cache", "chromium_event", "eager_fallback", "trace_error"};
  return k;
}

/// "F/C" → (F, C); (-1, -1) when it does not parse.
std::pair<int64_t, int64_t> parse_compile_id(std::string_view id) {
  auto slash = id.find('/');
  if (slash == std::string_view::npos) return {-1, -1};
  int64_t f = -1, c = -1;
  auto r1 = std::from_chars(id.data(), id.data() + slash, f);
  auto r2 = std::from_chars(id.data() + slash + 1, id.data() + id.size(), c);
  if (r1.ec != std::errc() || r1.ptr != id.data() + slash || r2.ec != std::errc() ||
      r2.ptr != id.data() + id.size() || f < 0 || c < 0)
    return {-1, -1};
  return {f, c};
}

/// Call op names in order from Graph IR text: every `... = name(` line. `parts` (optional) counts
/// the call ops (not constants) per training-step part by their location comment: [forward, backward,
/// optimizer].
std::vector<std::string> ops_from_ir(std::string_view ir, int64_t* parts = nullptr) {
  std::vector<std::string> ops;
  size_t pos = 0;
  while (pos < ir.size()) {
    size_t end = ir.find('\n', pos);
    if (end == std::string_view::npos) end = ir.size();
    std::string_view line = ir.substr(pos, end - pos);
    pos = end + 1;
    size_t hash = line.find("  #");
    std::string_view comment;
    if (hash != std::string_view::npos) {
      comment = line.substr(hash);
      line = line.substr(0, hash);
    }
    size_t eq = line.find(" = ");
    if (eq == std::string_view::npos) continue;
    size_t b = eq + 3;
    size_t e = b;
    while (e < line.size() && (std::isalnum(static_cast<unsigned char>(line[e])) || line[e] == '_' ||
                               line[e] == '.' || line[e] == ':'))
      ++e;
    if (e == b || e >= line.size() || line[e] != '(') continue;
    std::string op(line.substr(b, e - b));
    if (op.rfind("sym_", 0) == 0) continue;  // symbolic size arithmetic exists only in dynamic graphs
    if (parts && op != "constant") {  // the parts count call nodes (they sum to node_count)
      const bool bwd = comment.find("# [bwd") != std::string_view::npos;
      const bool opt = comment.find("# [optim") != std::string_view::npos;
      ++parts[bwd ? 1 : opt ? 2 : 0];
    }
    ops.push_back(std::move(op));
  }
  return ops;
}

/// Splits on commas outside brackets/parentheses.
std::vector<std::string_view> split_top(std::string_view s) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char ch = s[i];
    if (ch == '[' || ch == '(') ++depth;
    else if (ch == ']' || ch == ')') --depth;
    else if (ch == ',' && depth == 0) {
      parts.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  if (start < s.size()) parts.push_back(s.substr(start));
  return parts;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

/// Inputs from the IR header `graph name(%x : f32[s0, 512], %w : f32[512, 64]):` (used when the graph
/// event has no `inputs`).
std::vector<GraphInput> inputs_from_ir(std::string_view ir) {
  std::vector<GraphInput> out;
  size_t nl = ir.find('\n');
  std::string_view head = ir.substr(0, nl);
  size_t open = head.find('(');
  size_t close = head.rfind(')');
  if (head.rfind("graph", 0) != 0 || open == std::string_view::npos || close == std::string_view::npos ||
      close <= open)
    return out;
  for (std::string_view part : split_top(head.substr(open + 1, close - open - 1))) {
    part = trim(part);
    size_t colon = part.find(" : ");
    if (part.empty() || part[0] != '%' || colon == std::string_view::npos) continue;
    GraphInput in;
    in.source = std::string(part.substr(1, colon - 1));
    std::string_view type = trim(part.substr(colon + 3));
    size_t lb = type.find('['), rb = type.rfind(']');
    if (lb == std::string_view::npos || rb == std::string_view::npos || rb < lb) continue;
    in.dtype = std::string(type.substr(0, lb));
    for (std::string_view d : split_top(type.substr(lb + 1, rb - lb - 1))) {
      d = trim(d);
      if (!d.empty()) in.sizes.emplace_back(d);
    }
    out.push_back(std::move(in));
  }
  return out;
}

/// Position of a phase in the compile pipeline (unknown phases last, in name order).
int phase_rank(std::string_view name) {
  static constexpr std::string_view kOrder[] = {"capture", "guards", "passes", "lowering", "codegen", "cxx_compile", "load"};
  for (size_t i = 0; i < std::size(kOrder); ++i)
    if (kOrder[i] == name) return static_cast<int>(i);
  return static_cast<int>(std::size(kOrder));
}

/// rank and pid from `protean_trace_rank<R>_pid<P>_<ms>.jsonl` (0, 0 otherwise).
std::pair<int64_t, int64_t> ids_from_name(const std::string& name) {
  int64_t rank = 0, pid = 0;
  auto grab = [&](const char* tag, int64_t& v) {
    size_t p = name.find(tag);
    if (p == std::string::npos) return;
    p += std::strlen(tag);
    std::from_chars(name.data() + p, name.data() + name.size(), v);
  };
  grab("rank", rank);
  grab("_pid", pid);
  return {rank, pid};
}

struct Builder {
  /// A process: rank, pid and process_start's instance ("" in traces written before it was recorded),
  /// so two processes that got the same pid (containers, pid wrap) stay two.
  using ProcessKey = std::tuple<int64_t, int64_t, std::string>;
  std::map<ProcessKey, Process> procs;
  std::map<ProcessKey, std::unordered_map<std::string, Compile*>> index;

  Process& process(int64_t rank, int64_t pid, const std::string& instance, const std::string& file) {
    Process& p = procs[{rank, pid, instance}];
    p.instance = instance;
    p.rank = rank;
    p.pid = pid;
    if (std::find(p.files.begin(), p.files.end(), file) == p.files.end()) p.files.push_back(file);
    return p;
  }

  Frame& frame(Process& p, int64_t id) {
    Frame& f = p.frames[id];
    f.id = id;
    return f;
  }

  /// The compile named by `id` (created on first mention). `frame_hint` is used when the id does not
  /// name its frame.
  Compile& compile(Process& p, const std::string& id, int64_t frame_hint) {
    auto& idx = index[{p.rank, p.pid, p.instance}];
    auto it = idx.find(id);
    if (it != idx.end()) return *it->second;
    auto [f, c] = parse_compile_id(id);
    if (f < 0) f = frame_hint;
    Frame& fr = frame(p, f);
    CompileKey key{c < 0 ? INT64_MAX : c, id};
    Compile& comp = fr.compiles[key];
    comp.id = id;
    comp.frame = f;
    comp.index = c;
    idx[id] = &comp;
    return comp;
  }

  void fill_frame_identity(Frame& f, const std::string& function, const SourceLocation& loc) {
    if (f.function.empty()) f.function = function;
    if (f.loc.empty()) f.loc = loc;
  }

  /// Applies one known event. Returns false when a required field is missing (counted as bad fields).
  void apply(Process& p, const std::string& ev, Line& l) {
    auto compile_of = [&](bool required) -> Compile* {
      std::string id = l.str("compile_id");
      if (id.empty()) {
        if (required) l.mark("compile_id");
        return nullptr;
      }
      return &compile(p, id, l.integer("frame", -1));
    };
    if (ev == "process_start") {
      p.version = l.str("version");
      p.host = l.str("host");
      p.job = l.str("job");
      p.argv = l.strings("argv");
    } else if (ev == "compile_start" || ev == "recompile") {
      Compile* c = compile_of(true);
      if (!c) return;
      std::string fn = l.str("function");
      SourceLocation loc = l.location();
      std::vector<std::string> reasons = l.strings("reasons");
      if (!fn.empty()) c->function = fn;
      if (!loc.empty()) c->loc = loc;
      if (c->reasons.empty()) c->reasons = std::move(reasons);
      if (ev == "compile_start") {
        c->has_start = true;
        c->backend = l.str("backend");
        c->dynamic = l.str("dynamic");
        c->start_ts_us = l.integer("ts_us", -1);
      }
      fill_frame_identity(frame(p, c->frame), c->function, c->loc);
    } else if (ev == "dimension_decision") {
      Compile* c = compile_of(true);
      if (!c) return;
      DimDecision d;
      d.source = l.str("source");
      d.dim = l.integer("dim", -1);
      d.decision = l.str("decision");
      d.why = l.str("why");
      d.value = l.scalar("value");
      c->decisions.push_back(std::move(d));
    } else if (ev == "create_symbol") {
      Compile* c = compile_of(true);
      if (!c) return;
      Symbol s;
      s.symbol = l.str("symbol");
      s.hint = l.scalar("hint");
      s.source = l.str("source");
      s.range = l.scalar("range");
      s.loc = l.location();
      c->symbols.push_back(std::move(s));
    } else if (ev == "guard_added") {
      Compile* c = compile_of(true);
      if (!c) return;
      c->guards_added.push_back({l.str("expr"), l.location()});
    } else if (ev == "specialization") {
      Compile* c = compile_of(true);
      if (!c) return;
      Specialization s;
      s.symbol = l.str("symbol");
      s.sources = l.strings("sources");
      s.value = l.scalar("value");
      s.reason = l.str("reason");
      s.loc = l.location();
      c->specializations.push_back(std::move(s));
    } else if (ev == "graph") {
      Compile* c = compile_of(true);
      if (!c) return;
      c->has_graph = true;
      c->ir = l.str("ir");
      c->node_count = l.integer("node_count", -1);
      c->graph_hash = l.str("graph_hash");
      c->inputs.clear();
      if (const json* in = l.find("inputs")) {
        if (!in->is_array()) {
          l.mark("inputs");
        } else {
          for (const auto& x : *in) {
            if (!x.is_object()) {
              l.mark("inputs");
              continue;
            }
            Line sub{x};
            GraphInput g;
            g.source = sub.str("source");
            g.dtype = sub.str("dtype");
            g.sizes = sub.strings("sizes");
            if (sub.bad) l.mark("inputs");
            c->inputs.push_back(std::move(g));
          }
        }
      } else {
        c->inputs = inputs_from_ir(c->ir);
      }
      int64_t parts[3] = {0, 0, 0};
      c->ops = ops_from_ir(c->ir, parts);
      c->forward_ops = parts[0];
      c->backward_ops = parts[1];
      c->optimizer_ops = parts[2];
    } else if (ev == "guards") {
      Compile* c = compile_of(true);
      if (!c) return;
      c->guards_text = l.str("text");
      c->guard_count = l.integer("count", -1);
    } else if (ev == "graph_break") {
      GraphBreak b;
      b.compile_id = l.str("compile_id");
      b.reason = l.str("reason");
      b.op = l.str("op");
      b.loc = l.location();
      if (!b.compile_id.empty()) {
        compile(p, b.compile_id, l.integer("frame", -1)).graph_breaks.push_back(std::move(b));
      } else {
        int64_t f = l.integer("frame", -1);
        frame(p, f).graph_breaks.push_back(std::move(b));
      }
    } else if (ev == "compilation_metrics") {
      Compile* c = compile_of(true);
      if (!c) return;
      c->has_metrics = true;
      std::string fn = l.str("function");
      if (c->function.empty()) c->function = fn;
      c->metrics_status = l.str("status");
      c->error = l.str("error");
      c->phases.clear();
      if (const json* ph = l.find("phases")) {
        if (!ph->is_object()) l.mark("phases");
        else
          for (auto it = ph->begin(); it != ph->end(); ++it) {
            if (it->is_number()) c->phases.push_back({it.key(), it->get<double>()});
            else l.mark("phases");
          }
      }
      // JSON objects come back sorted by key; show phases in pipeline order instead.
      std::stable_sort(c->phases.begin(), c->phases.end(),
                       [](const Phase& x, const Phase& y) { return phase_rank(x.name) < phase_rank(y.name); });
      c->cache.clear();
      if (const json* ca = l.find("cache")) {
        if (!ca->is_object()) l.mark("cache");
        else
          for (auto it = ca->begin(); it != ca->end(); ++it) {
            if (it->is_string()) c->cache.emplace_back(it.key(), it->get<std::string>());
            else l.mark("cache");
          }
      }
      c->metric_guard_count = l.integer("guard_count", -1);
      c->metric_node_count = l.integer("node_count", -1);
      c->graph_count = l.integer("graph_count", -1);
      fill_frame_identity(frame(p, c->frame), c->function, c->loc);
    } else if (ev == "artifact") {
      Compile* c = compile_of(true);
      if (!c) return;
      c->artifacts.push_back({l.str("kind"), l.str("name"), l.str("text")});
    } else if (ev == "pgo") {
      std::string where = l.str("path");
      if (where.empty()) where = l.str("url");
      int64_t frames = l.integer("frames", -1);
      std::string outcome = l.str("outcome");
      std::string line = l.str("action");
      if (!outcome.empty() && outcome != "ok") line += " " + outcome;
      line += " " + where;
      if (frames >= 0) line += fmt::format(" ({} frames)", frames);
      std::string detail = l.str("detail");
      if (!detail.empty()) line += ": " + detail;
      p.pgo.push_back(std::move(line));
    } else if (ev == "cache") {
      CacheEvent ce{l.str("tier"), l.str("key"), l.str("result")};
      if (Compile* c = compile_of(false)) c->cache_events.push_back(std::move(ce));
      else p.cache.push_back(std::move(ce));
    } else if (ev == "chromium_event") {
      ChromiumEvent ce;
      ce.name = l.str("name");
      ce.ph = l.str("ph");
      if (ce.ph.empty()) ce.ph = "X";
      ce.ts = l.integer("ts", l.integer("ts_us", 0));
      ce.dur = l.integer("dur", 0);
      if (const json* a = l.find("args")) {
        if (a->is_object()) ce.args_json = a->dump(-1, ' ', false, json::error_handler_t::replace);
        else l.mark("args");
      }
      p.chromium.push_back(std::move(ce));
    } else if (ev == "eager_fallback") {
      int64_t f = l.integer("frame", -1);
      Frame& fr = frame(p, f);
      fill_frame_identity(fr, l.str("function"), {});
      fr.eager_fallbacks.push_back(l.str("reason"));
    }
    // trace_error: the writer's own "could not serialise" marker; nothing to add.
  }

  void read_text(const std::string& name, std::string_view text, FileStats& fs) {
    auto [file_rank, file_pid] = ids_from_name(name);
    std::string instance;  // the last process_start's, for the lines after it
    // Split into lines, parse batches of lines in parallel, then apply them in file order.
    std::vector<std::string_view> lines;
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      lines.push_back(text.substr(pos, end - pos));
      pos = end + 1;
    }
    fs.lines = static_cast<int64_t>(lines.size());
    constexpr size_t kBatch = 8192;
    std::vector<json> parsed;
    for (size_t base = 0; base < lines.size(); base += kBatch) {
      size_t n = std::min(kBatch, lines.size() - base);
      parsed.assign(n, json());
      parallel_for(n, [&](size_t i) {
        std::string_view raw = lines[base + i];
        if (!trim(raw).empty()) parsed[i] = json::parse(raw, nullptr, /*allow_exceptions=*/false);
      });
      for (size_t i = 0; i < n; ++i) {
        int64_t lineno = static_cast<int64_t>(base + i + 1);
        if (trim(lines[base + i]).empty()) continue;
        apply_line(parsed[i], lineno, file_rank, file_pid, instance, name, fs);
      }
    }
  }

  void apply_line(const json& e, int64_t lineno, int64_t file_rank, int64_t file_pid, std::string& instance,
                  const std::string& name, FileStats& fs) {
    auto malformed = [&] {
      if (fs.malformed++ == 0) fs.first_malformed = lineno;
    };
    if (e.is_discarded() || !e.is_object()) {
      malformed();
      return;
    }
    auto ev_it = e.find("event");
    if (ev_it == e.end() || !ev_it->is_string()) {
      malformed();
      return;
    }
    Line l{e};
    int64_t v = l.integer("v", kTraceFormatVersion);
    if (v > kTraceFormatVersion) {
      if (fs.newer++ == 0) fs.first_newer = lineno;
      return;
    }
    const std::string& ev = ev_it->get_ref<const std::string&>();
    if (!known_events().contains(ev)) {
      if (fs.unknown++ == 0) {
        fs.first_unknown = lineno;
        fs.first_unknown_name = ev;
      }
      return;
    }
    int64_t rank = l.integer("rank", file_rank);
    int64_t pid = l.integer("pid", file_pid);
    if (ev == "process_start") instance = l.str("instance");
    Process& p = process(rank, pid, instance, name);
    ++p.events;
    ++fs.events;
    apply(p, ev, l);
    if (l.bad && fs.bad_fields++ == 0) {
      fs.first_bad_field = lineno;
      fs.first_bad_field_name = l.bad_field;
    }
  }

  TraceModel finish(std::vector<FileStats> files) {
    TraceModel m;
    m.files = std::move(files);
    std::map<int64_t, int> per_rank;
    std::map<std::pair<int64_t, int64_t>, int> per_pid;
    for (auto& [k, p] : procs) ++per_rank[p.rank], ++per_pid[{p.rank, p.pid}];
    for (auto& [k, p] : procs) {
      p.label = per_rank[p.rank] > 1 ? fmt::format("rank {} pid {}", p.rank, p.pid) : fmt::format("rank {}", p.rank);
      // one pid, two processes: name the file each wrote
      if (per_pid[{p.rank, p.pid}] > 1 && !p.files.empty()) p.label += fmt::format(" ({})", p.files.front());
      // Frames known only through their compiles take identity from the first compile that has one.
      for (auto& [fid, f] : p.frames)
        for (auto& [ck, c] : f.compiles) {
          if (c.function.empty()) c.function = f.function;
          fill_frame_identity(f, c.function, c.loc);
        }
      m.total_events += p.events;
      m.processes.push_back(std::move(p));
    }
    return m;
  }
};

}  // namespace

TraceModel read_trace_texts(const std::vector<std::pair<std::string, std::string>>& files) {
  Builder b;
  std::vector<FileStats> stats;
  for (const auto& [name, text] : files) {
    FileStats fs;
    fs.path = name;
    b.read_text(name, text, fs);
    stats.push_back(std::move(fs));
  }
  return b.finish(std::move(stats));
}

TraceModel read_trace_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw RuntimeError(fmt::format("protean report: '{}' is not a directory of trace files", dir.string()));
  std::vector<fs::path> paths, not_files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code fec;
    if (it->path().extension() != ".jsonl") continue;
    // a FIFO would block the reader; it and a directory are listed as unreadable, not passed over
    (it->is_regular_file(fec) ? paths : not_files).push_back(it->path());
  }
  if (ec) throw RuntimeError(fmt::format("protean report: cannot list '{}': {}", dir.string(), ec.message()));
  std::sort(paths.begin(), paths.end());
  std::sort(not_files.begin(), not_files.end());
  Builder b;
  std::vector<FileStats> stats;
  for (const auto& path : not_files) {
    FileStats st;
    st.path = path.filename().string();
    st.unreadable = true;
    st.error = fmt::format("it is {}, not a regular file", core::file_kind(path.string()));
    stats.push_back(std::move(st));
  }
  for (const auto& path : paths) {
    FileStats st;
    st.path = path.filename().string();
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      st.unreadable = true;
      st.error = "cannot open";
      stats.push_back(std::move(st));
      continue;
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) {
      st.unreadable = true;
      st.error = "read error";
    }
    std::string text = std::move(ss).str();
    b.read_text(st.path, text, st);
    stats.push_back(std::move(st));
  }
  return b.finish(std::move(stats));
}

}  // namespace protean::observe::report
