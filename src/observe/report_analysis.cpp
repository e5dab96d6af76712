// Analysis for `protean report`: compile status, similar-graph groups, the dims to make dynamic, and
// disagreements between ranks. Everything is linear in the number of events (hash maps, no pairwise
// comparisons), so a 200k-event trace stays fast.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <functional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "observe/report.h"

namespace protean::observe::report {

namespace {

std::pair<int64_t, int64_t> split_id(std::string_view id) {
  auto slash = id.find('/');
  if (slash == std::string_view::npos) return {-1, -1};
  int64_t f = -1, c = -1;
  auto r1 = std::from_chars(id.data(), id.data() + slash, f);
  auto r2 = std::from_chars(id.data() + slash + 1, id.data() + id.size(), c);
  if (r1.ec != std::errc() || r1.ptr != id.data() + slash || r2.ec != std::errc() || r2.ptr != id.data() + id.size())
    return {-1, -1};
  return {f, c};
}

/// The compile id a recompile reason names: "0/0: tensor 'x' ..." → "0/0"; "" when none.
std::string reason_target(std::string_view reason) {
  size_t colon = reason.find(':');
  if (colon == std::string_view::npos || colon == 0) return {};
  std::string_view id = reason.substr(0, colon);
  return split_id(id).first >= 0 ? std::string(id) : std::string();
}

/// Processes that are ranks of one job: one process_start job (or none) and distinct rank numbers.
bool ranks_of_one_job(const std::vector<std::pair<const Process*, const Compile*>>& per) {
  std::set<int64_t> ranks;
  for (const auto& [p, c] : per)
    if (p->job != per[0].first->job || !ranks.insert(p->rank).second) return false;
  return true;
}

bool is_number(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s[0] == '-' ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

std::string plural(int64_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

void derive_status(Process& p) {
  std::unordered_map<std::string, Compile*> by_id;
  for (auto& [fid, f] : p.frames)
    for (auto& [k, c] : f.compiles) by_id[c.id] = &c;
  for (auto& [fid, f] : p.frames) {
    Compile* prev = nullptr;
    for (auto& [k, c] : f.compiles) {
      bool targeted = false;
      for (const auto& r : c.reasons) {
        std::string target = reason_target(r);
        if (target.empty() || target == c.id) continue;
        auto it = by_id.find(target);
        if (it == by_id.end()) continue;
        it->second->recompiled_as.push_back(fmt::format("{}: {}", c.id, r));
        targeted = true;
      }
      if (!targeted && !c.reasons.empty() && prev)
        for (const auto& r : c.reasons) prev->recompiled_as.push_back(fmt::format("{}: {}", c.id, r));
      prev = &c;
    }
  }
  for (auto& [fid, f] : p.frames)
    for (auto& [k, c] : f.compiles) {
      if (c.metrics_status == "error" || !c.error.empty()) c.status = Status::Error;
      else if (c.metrics_status == "graph_break" || !c.graph_breaks.empty()) c.status = Status::GraphBreak;
      else if (!c.recompiled_as.empty()) c.status = Status::Recompiled;
      else if (c.has_metrics) c.status = Status::Success;
      else c.status = Status::Unknown;
    }
}

/// A symbol's hint by name within one compile.
std::string hint_of(const Compile& c, const std::string& sym) {
  for (const auto& s : c.symbols)
    if (s.symbol == sym) return s.hint;
  return {};
}

/// "x.size()[3]" → ("x", 3); a plain identifier path → (it, -1); otherwise ("", -2).
std::pair<std::string, int64_t> parse_symbol_source(std::string_view src) {
  constexpr std::string_view tag = ".size()[";
  size_t p = src.rfind(tag);
  if (p != std::string_view::npos && !src.empty() && src.back() == ']') {
    std::string_view num = src.substr(p + tag.size(), src.size() - p - tag.size() - 1);
    int64_t d = -1;
    auto r = std::from_chars(num.data(), num.data() + num.size(), d);
    if (r.ec == std::errc() && r.ptr == num.data() + num.size()) return {std::string(src.substr(0, p)), d};
    return {"", -2};
  }
  if (src.empty() || src.find('(') != std::string_view::npos) return {"", -2};
  for (char ch : src)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '[' || ch == ']'))
      return {"", -2};
  return {std::string(src), -1};
}

// Suggestions per (compiled function, source, dim): the same source name in two functions is two
// tensors, and the C++ fix (mark_dynamic at the call) belongs to one call site.
struct SuggestionSet {
  std::vector<DynamicSuggestion> list;
  std::map<std::tuple<std::string, std::string, int64_t>, size_t> index;
  DynamicSuggestion& get(const std::string& function, const std::string& source, int64_t dim) {
    auto [it, fresh] = index.try_emplace({function, source, dim}, list.size());
    if (fresh) list.push_back({source, dim, {}, {}, function});
    return list[it->second];
  }
  void add_value(DynamicSuggestion& s, const std::string& v) {
    if (!v.empty() && std::find(s.values.begin(), s.values.end(), v) == s.values.end()) s.values.push_back(v);
  }
  void add_evidence(DynamicSuggestion& s, std::string e) {
    if (s.evidence.size() < 8 && std::find(s.evidence.begin(), s.evidence.end(), e) == s.evidence.end())
      s.evidence.push_back(std::move(e));
  }
};

std::string join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

void similar_groups(const TraceModel& m, size_t pi, Analysis& a) {
  const Process& p = m.processes[pi];
  for (const auto& [fid, f] : p.frames) {
    std::unordered_map<std::string, size_t> key_to_group;
    std::vector<std::vector<const Compile*>> groups;
    for (const auto& [k, c] : f.compiles) {
      if (!c.has_graph) continue;
      std::string key;
      if (!c.ops.empty() || !c.ir.empty()) key = "ops:" + join(c.ops, ",");
      else if (!c.graph_hash.empty()) key = "hash:" + c.graph_hash;
      else continue;
      for (const auto& in : c.inputs) key += fmt::format("|{}:{}:{}", in.source, in.dtype, in.sizes.size());
      auto [it, fresh] = key_to_group.try_emplace(key, groups.size());
      if (fresh) groups.emplace_back();
      groups[it->second].push_back(&c);
    }
    for (const auto& members : groups) {
      if (members.size() < 2) continue;
      SimilarGroup g;
      g.process = pi;
      g.frame = fid;
      g.function = f.function;
      const Compile& first = *members[0];
      g.ops = first.ops;
      std::vector<std::string> ins;
      for (const auto& in : first.inputs) ins.push_back(fmt::format("{}: {} rank {}", in.source, in.dtype, in.sizes.size()));
      g.inputs_desc = join(ins, ", ");
      for (const Compile* c : members) {
        g.members.push_back(c->id);
        for (const auto& r : c->reasons)
          if (r.find("size mismatch") != std::string::npos) g.size_reasons = true;
      }
      for (size_t i = 0; i < first.inputs.size(); ++i) {
        for (size_t d = 0; d < first.inputs[i].sizes.size(); ++d) {
          DimRow row;
          row.source = first.inputs[i].source;
          row.dim = static_cast<int64_t>(d);
          bool differs = false;
          for (const Compile* c : members) {
            const std::string& v = c->inputs[i].sizes[d];
            if (v != first.inputs[i].sizes[d]) differs = true;
            std::string concrete = v;
            if (is_number(v)) {
              row.values.push_back(v);
            } else {
              row.symbolic_somewhere = true;
              concrete = hint_of(*c, v);
              row.values.push_back(concrete.empty() ? v : fmt::format("{} ({})", v, concrete));
            }
            if (!concrete.empty() &&
                std::find(row.concrete.begin(), row.concrete.end(), concrete) == row.concrete.end())
              row.concrete.push_back(concrete);
          }
          if (differs) g.rows.push_back(std::move(row));
        }
      }
      a.groups.push_back(std::move(g));
    }
  }
}

void suggestions(const TraceModel& m, Analysis& a) {
  SuggestionSet set;
  // Dims the user already declared dynamic are not suggested again. Marks and dynamic=On belong to one
  // function (the same source name in another function is another tensor); the allowlist is global.
  std::set<std::tuple<std::string, std::string, int64_t>> user;  // (function or "" for all, source, dim)
  std::set<std::pair<std::string, int64_t>> listed;
  static const std::set<std::string> user_whys = {"mark_dynamic", "maybe_mark_dynamic", "allowlist", "dynamic_on"};
  auto function_of = [](const Frame& f, const Compile& c) { return c.function.empty() ? f.function : c.function; };
  for (const auto& p : m.processes)
    for (const auto& [fid, f] : p.frames)
      for (const auto& [k, c] : f.compiles)
        for (const auto& d : c.decisions) {
          if (!(d.decision == "dynamic" || d.decision == "unbacked") || !user_whys.contains(d.why)) continue;
          user.insert({d.why == "allowlist" ? std::string() : function_of(f, c), d.source, d.dim});
          if (listed.insert({d.source, d.dim}).second) a.already_dynamic.push_back({d.source, d.dim, d.why});
        }
  auto wanted = [&](const std::string& fn, const std::string& src, int64_t dim) {
    return !src.empty() && !user.contains({fn, src, dim}) && !user.contains({std::string(), src, dim});
  };

  // 1. Similar graphs whose sizes differ.
  for (const auto& g : a.groups) {
    const Process& p = m.processes[g.process];
    for (const auto& row : g.rows) {
      if (!wanted(g.function, row.source, row.dim)) continue;
      auto& s = set.get(g.function, row.source, row.dim);
      for (const auto& v : row.concrete) set.add_value(s, v);
      set.add_evidence(s, fmt::format("similar graphs {} of {} ({}) differ only in sizes", join(g.members, ", "),
                                      g.function.empty() ? "?" : g.function, p.label));
    }
  }
  // 1b. The same compile id on several ranks with different sizes.
  {
    std::vector<std::string> order;
    std::unordered_map<std::string, std::vector<std::pair<const Process*, const Compile*>>> by_id;
    for (const auto& p : m.processes)
      for (const auto& [fid, f] : p.frames)
        for (const auto& [k, c] : f.compiles) {
          if (!c.has_graph) continue;
          auto [it, fresh] = by_id.try_emplace(c.id);
          if (fresh) order.push_back(c.id);
          it->second.emplace_back(&p, &c);
        }
    for (const auto& id : order) {
      const auto& per = by_id[id];
      if (per.size() < 2) continue;
      const Compile& first = *per[0].second;
      for (size_t i = 0; i < first.inputs.size(); ++i)
        for (size_t d = 0; d < first.inputs[i].sizes.size(); ++d) {
          std::vector<std::string> seen, where;
          for (const auto& [p, c] : per) {
            if (c->inputs.size() != first.inputs.size() || c->inputs[i].source != first.inputs[i].source ||
                c->inputs[i].sizes.size() != first.inputs[i].sizes.size())
              continue;
            const std::string& v = c->inputs[i].sizes[d];
            if (is_number(v) && std::find(seen.begin(), seen.end(), v) == seen.end()) seen.push_back(v);
            where.push_back(fmt::format("{} on {}", v, p->label));
          }
          const std::string& src = first.inputs[i].source;
          if (seen.size() < 2 || !wanted(first.function, src, static_cast<int64_t>(d))) continue;
          auto& s = set.get(first.function, src, static_cast<int64_t>(d));
          for (const auto& v : seen) set.add_value(s, v);
          set.add_evidence(s, fmt::format("{} differs across {}: {}", id, ranks_of_one_job(per) ? "ranks" : "runs",
                                          join(where, ", ")));
        }
    }
  }
  // 2. Dimension decisions made dynamic by the system; 3. symbols of automatically dynamic dims.
  for (const auto& p : m.processes)
    for (const auto& [fid, f] : p.frames)
      for (const auto& [k, c] : f.compiles) {
        for (const auto& d : c.decisions) {
          if (d.decision != "dynamic" || !(d.why == "automatic" || d.why == "pgo" || d.why == "collectives")) continue;
          if (!wanted(function_of(f, c), d.source, d.dim)) continue;
          auto& s = set.get(function_of(f, c), d.source, d.dim);
          set.add_value(s, d.value);
          set.add_evidence(s, fmt::format("{} ({}): {} dynamic", c.id, p.label,
                                          d.why == "automatic" ? "automatic" : d.why == "pgo" ? "PGO profile" : "compiler collectives"));
        }
        if (c.dynamic == "on") continue;
        for (const auto& sym : c.symbols) {
          auto [src, dim] = parse_symbol_source(sym.source);
          if (dim < -1 || !wanted(function_of(f, c), src, dim)) continue;
          bool decided_static = false;
          for (const auto& d : c.decisions)
            if (d.source == src && d.dim == dim && d.decision == "static") decided_static = true;
          if (decided_static) continue;
          auto& s = set.get(function_of(f, c), src, dim);
          set.add_value(s, sym.hint);
          set.add_evidence(s, fmt::format("{} ({}): symbol {} for {}", c.id, p.label, sym.symbol, sym.source));
        }
      }
  a.suggestions = std::move(set.list);
  std::vector<std::string> sources;  // one entry per dim (x.size()[3]), as `protean pgo show` writes them
  auto add_unique = [](std::vector<std::string>& v, const std::string& e) {
    if (std::find(v.begin(), v.end(), e) == v.end()) v.push_back(e);
  };
  for (const auto& s : a.suggestions) {
    const std::string entry = s.dim >= 0 ? fmt::format("{}.size()[{}]", s.source, s.dim) : s.source;
    add_unique(sources, entry);
    std::string call = s.dim >= 0 ? fmt::format("pt::mark_dynamic({}, {});", s.source, s.dim)
                                  : fmt::format("// {}: a scalar; declare that parameter protean::SymInt instead of int64_t",
                                                s.source);
    add_unique(a.mark_dynamic_calls, call);
    auto fs = std::find_if(a.per_function.begin(), a.per_function.end(),
                           [&](const FunctionSuggestion& x) { return x.function == s.function; });
    if (fs == a.per_function.end()) {
      a.per_function.push_back({s.function, {}, {}, {}});
      fs = a.per_function.end() - 1;
    }
    add_unique(fs->sources, entry);
    add_unique(fs->mark_dynamic_calls, call);
  }
  for (auto& fs : a.per_function) fs.allowlist_line = "PROTEAN_DYNAMIC_SOURCES=" + join(fs.sources, ",");
  if (!sources.empty()) a.allowlist_line = "PROTEAN_DYNAMIC_SOURCES=" + join(sources, ",");
}

std::string describe_inputs(const Compile& c) {
  std::vector<std::string> parts;
  for (const auto& in : c.inputs) parts.push_back(fmt::format("{} {}[{}]", in.source, in.dtype, join(in.sizes, ", ")));
  return join(parts, ", ");
}

/// Warnings for one set of processes that are ranks of one job (`procs`: indices into m.processes).
void compare_ranks(const TraceModel& m, const std::vector<size_t>& procs, Analysis& a) {
  // compile id → per process of `procs` the compile (nullptr when absent), in first-seen order.
  std::vector<std::string> order;
  std::unordered_map<std::string, std::vector<const Compile*>> by_id;
  for (size_t j = 0; j < procs.size(); ++j)
    for (const auto& [fid, f] : m.processes[procs[j]].frames)
      for (const auto& [k, c] : f.compiles) {
        auto [it, fresh] = by_id.try_emplace(c.id, procs.size(), nullptr);
        if (fresh) order.push_back(c.id);
        it->second[j] = &c;
      }
  std::sort(order.begin(), order.end(), [](const std::string& x, const std::string& y) {
    auto a = split_id(x), b = split_id(y);
    return a != b ? a < b : x < y;
  });
  auto label = [&](size_t j) { return m.processes[procs[j]].label; };
  for (const auto& id : order) {
    const auto& per = by_id[id];
    std::vector<std::string> have, lack;
    for (size_t j = 0; j < per.size(); ++j) (per[j] ? have : lack).push_back(label(j));
    const Compile* any = nullptr;
    for (const Compile* c : per)
      if (c && !any) any = c;
    std::string fn = any && !any->function.empty() ? any->function : "?";
    if (!lack.empty())
      a.rank_warnings.push_back(fmt::format("compile {} ({}) exists on {} but not on {}", id, fn, join(have, ", "),
                                            join(lack, ", ")));
    // Graph signatures: graph_hash, else the IR text itself.
    std::map<std::string, std::vector<size_t>> sigs;
    for (size_t j = 0; j < per.size(); ++j) {
      const Compile* c = per[j];
      if (!c || !c->has_graph) continue;
      std::string sig = !c->graph_hash.empty() ? "hash " + c->graph_hash
                                                : fmt::format("ir#{:016x}", std::hash<std::string>{}(c->ir));
      // The structure hash ignores sizes; ranks that specialised different sizes also diverge.
      sig += " " + describe_inputs(*c);
      sigs[sig].push_back(j);
    }
    if (sigs.size() > 1) {
      std::vector<std::string> parts;
      for (size_t j = 0; j < per.size(); ++j) {
        const Compile* c = per[j];
        if (!c || !c->has_graph) continue;
        std::string desc = c->graph_hash.empty() ? "" : "graph_hash " + c->graph_hash;
        std::string ins = describe_inputs(*c);
        if (!ins.empty()) desc += (desc.empty() ? "" : ", ") + std::string("inputs ") + ins;
        parts.push_back(fmt::format("{}: {}", label(j), desc));
      }
      a.rank_warnings.push_back(fmt::format("ranks compiled different graphs for {} ({}): {}", id, fn, join(parts, "; ")));
    }
  }
}

/// Processes of one job (same process_start job, or none recorded) with distinct rank numbers are
/// compared as ranks; a rank number seen twice in one job means separate runs of a program traced into
/// one directory, which are not ranks of each other.
void rank_warnings(const TraceModel& m, Analysis& a) {
  std::map<std::string, std::vector<size_t>> jobs;
  for (size_t pi = 0; pi < m.processes.size(); ++pi) jobs[m.processes[pi].job].push_back(pi);
  for (const auto& [job, procs] : jobs) {
    if (procs.size() < 2) continue;
    std::map<int64_t, std::vector<int64_t>> pids_of_rank;
    for (size_t pi : procs) pids_of_rank[m.processes[pi].rank].push_back(m.processes[pi].pid);
    if (pids_of_rank.size() == procs.size()) {
      a.multi_rank = true;
      compare_ranks(m, procs, a);
      continue;
    }
    std::vector<std::string> repeated;
    size_t more = 0;
    for (const auto& [rank, pids] : pids_of_rank) {
      if (pids.size() < 2) continue;
      if (repeated.size() == 4) {
        ++more;
        continue;
      }
      std::vector<std::string> ps;
      for (size_t i = 0; i < pids.size() && i < 4; ++i) ps.push_back(std::to_string(pids[i]));
      if (pids.size() > 4) ps.push_back("...");
      repeated.push_back(fmt::format("rank {} in {} processes (pids {})", rank, pids.size(), join(ps, ", ")));
    }
    if (more) repeated.push_back(fmt::format("{} more ranks likewise", more));
    std::string shown = job.substr(0, 80);
    for (char& c : shown)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
    a.run_notes.push_back(fmt::format(
        "{} processes{} are separate runs, not ranks of one job ({}): their compiles are listed per process and "
        "not compared as ranks. Give each run its own trace directory, or set PROTEAN_JOB_ID per run",
        procs.size(), job.empty() ? "" : fmt::format(" of job '{}'", shown), join(repeated, "; ")));
  }
}

void file_warnings(const TraceModel& m, Analysis& a) {
  if (m.files.empty()) a.file_warnings.push_back("no *.jsonl trace files found");
  for (const auto& f : m.files) {
    if (f.unreadable) a.file_warnings.push_back(fmt::format("file {} could not be read: {}", f.path, f.error));
    if (f.malformed)
      a.file_warnings.push_back(fmt::format("{} skipped in file {} (first at line {})",
                                            plural(f.malformed, "malformed line", "malformed lines"), f.path, f.first_malformed));
    if (f.unknown)
      a.file_warnings.push_back(fmt::format("{} skipped in file {} (first at line {}: \"{}\")",
                                            plural(f.unknown, "unknown event", "unknown events"), f.path, f.first_unknown,
                                            f.first_unknown_name));
    if (f.newer)
      a.file_warnings.push_back(fmt::format("{} from a newer trace format skipped in file {} (first at line {})",
                                            plural(f.newer, "event", "events"), f.path, f.first_newer));
    if (f.bad_fields)
      a.file_warnings.push_back(fmt::format("{} with wrongly typed fields in file {} (first at line {}: \"{}\"); defaults used",
                                            plural(f.bad_fields, "event", "events"), f.path, f.first_bad_field,
                                            f.first_bad_field_name));
  }
}

}  // namespace

Analysis analyse(TraceModel& model) {
  Analysis a;
  for (auto& p : model.processes) derive_status(p);
  for (const auto& p : model.processes)
    for (const auto& [fid, f] : p.frames)
      for (const auto& [k, c] : f.compiles) ++a.status_counts[status_name(c.status)];
  for (size_t pi = 0; pi < model.processes.size(); ++pi) similar_groups(model, pi, a);
  suggestions(model, a);
  rank_warnings(model, a);
  file_warnings(model, a);
  return a;
}

bool notable_decision(const DimDecision& d) {
  if (d.decision != "static") return true;
  return !(d.why == "default" || d.why == "parameter" || d.why == "dynamic_off" || d.why == "int_argument");
}

std::string cache_summary(const Process& p) {
  std::vector<std::pair<std::string, int64_t>> counts;
  auto add = [&](const CacheEvent& e) {
    std::string k = e.tier + " " + e.result;
    for (auto& [name, n] : counts)
      if (name == k) {
        ++n;
        return;
      }
    counts.emplace_back(k, 1);
  };
  for (const auto& [fid, f] : p.frames)
    for (const auto& [k, c] : f.compiles)
      for (const auto& e : c.cache_events) add(e);
  for (const auto& e : p.cache) add(e);
  std::string out;
  for (const auto& [name, n] : counts) out += (out.empty() ? "" : ", ") + fmt::format("{} {}", name, n);
  return out;
}

}  // namespace protean::observe::report
