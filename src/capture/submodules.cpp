// Modular compilation: include/protean/submodules.h. A submodule with options of its own is a frame
// of its own; protean::call reaches submodule_call (through detail::region_call), which inlines it
// when its options equal the caller's and otherwise makes the call a boundary: a graph break of the
// caller, then the submodule's frame dispatched on the real tensors.
#include "protean/submodules.h"

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "capture/frame.h"
#include "capture/module_trace.h"
#include "capture/region.h"
#include "observe/log.h"
#include "ops/dispatch.h"

namespace protean::detail {

namespace {

struct Entry {
  std::string path;            // dotted, below the root
  std::string root_name;       // the compiled root's name (logs)
  CompileOptions opts;         // the submodule's own options
  CompileOptions caller_opts;  // the nearest matched ancestor's, else the root's
  std::weak_ptr<Module> module;
  std::shared_ptr<CompiledFunctionImpl> frame;  // made on the first boundary call
  bool logged = false;
};

std::atomic<bool> g_any{false};
std::mutex g_mu;
std::map<const Module*, Entry>& entries() {
  static std::map<const Module*, Entry> e;
  return e;
}

/// The options that differ between `a` (the submodule) and `b` (its caller), as `name a vs b`.
std::string option_diff(const CompileOptions& a, const CompileOptions& b) {
  std::vector<std::string> d;
  auto dyn = [](Dynamic x) { return x == Dynamic::On ? "On" : x == Dynamic::Off ? "Off" : "Auto"; };
  auto yn = [](bool x) { return x ? "true" : "false"; };
  if (a.dynamic != b.dynamic) d.push_back(fmt::format("dynamic {} vs {}", dyn(a.dynamic), dyn(b.dynamic)));
  if (a.backend != b.backend) d.push_back(fmt::format("backend {} vs {}", a.backend, b.backend));
  if (a.mode != b.mode) d.push_back(fmt::format("mode {} vs {}", a.mode, b.mode));
  if (a.fullgraph != b.fullgraph) d.push_back(fmt::format("fullgraph {} vs {}", yn(a.fullgraph), yn(b.fullgraph)));
  if (a.recompile_limit != b.recompile_limit)
    d.push_back(fmt::format("recompile_limit {} vs {}", a.recompile_limit, b.recompile_limit));
  if (a.accumulated_recompile_limit != b.accumulated_recompile_limit)
    d.push_back(fmt::format("accumulated_recompile_limit {} vs {}", a.accumulated_recompile_limit, b.accumulated_recompile_limit));
  if (a.fail_on_recompile_limit_hit != b.fail_on_recompile_limit_hit)
    d.push_back(fmt::format("fail_on_recompile_limit_hit {} vs {}", yn(a.fail_on_recompile_limit_hit), yn(b.fail_on_recompile_limit_hit)));
  if (a.keep_size_one_symbolic != b.keep_size_one_symbolic)
    d.push_back(fmt::format("keep_size_one_symbolic {} vs {}", yn(a.keep_size_one_symbolic), yn(b.keep_size_one_symbolic)));
  if (a.dynamic_parameters != b.dynamic_parameters)
    d.push_back(fmt::format("dynamic_parameters {} vs {}", yn(a.dynamic_parameters), yn(b.dynamic_parameters)));
  if (a.dynamic_attributes != b.dynamic_attributes)
    d.push_back(fmt::format("dynamic_attributes {} vs {}", yn(a.dynamic_attributes), yn(b.dynamic_attributes)));
  if (a.async_compile != b.async_compile)
    d.push_back(fmt::format("async_compile {} vs {}", yn(a.async_compile), yn(b.async_compile)));
  if (a.capture_scalar_outputs != b.capture_scalar_outputs)
    d.push_back(fmt::format("capture_scalar_outputs {} vs {}", yn(a.capture_scalar_outputs), yn(b.capture_scalar_outputs)));
  if (a.compiler_collectives != b.compiler_collectives)
    d.push_back(fmt::format("compiler_collectives {} vs {}", yn(a.compiler_collectives), yn(b.compiler_collectives)));
  if (a.region_types != b.region_types) d.push_back("region_types differ");
  if (a.auto_regions != b.auto_regions) d.push_back(fmt::format("auto_regions {} vs {}", yn(a.auto_regions), yn(b.auto_regions)));
  std::string r;
  for (const auto& s : d) r += (r.empty() ? "" : ", ") + s;
  return r;
}

void walk(const std::shared_ptr<Module>& m, const std::string& prefix, const std::string& root_name,
          const CompileOptions& caller, const std::vector<SubmoduleSpec>& specs, const std::vector<std::regex>& res,
          std::map<const Module*, Entry>& out) {
  for (const auto& [name, child] : m->named_children()) {
    const std::string path = prefix + name;
    const CompileOptions* next = &caller;
    for (size_t i = 0; i < specs.size(); ++i) {
      if (!std::regex_match(path, res[i])) continue;
      Entry e;
      e.path = path;
      e.root_name = root_name;
      e.opts = specs[i].options;
      if (e.opts.name.empty() || e.opts.name == CompileOptions{}.name) e.opts.name = path;
      if (e.opts.file.empty()) {
        e.opts.file = caller.file;
        e.opts.line = caller.line;
      }
      e.caller_opts = caller;
      e.module = child;
      next = &(out[child.get()] = std::move(e)).opts;
      break;
    }
    walk(child, path + ".", root_name, *next, specs, res, out);
  }
}

}  // namespace

void register_submodules(const std::shared_ptr<Module>& root, const CompileOptions& root_opts,
                         const std::vector<SubmoduleSpec>& specs) {
  if (!root) throw ValueError("compile_submodules: the module is null");
  if (specs.empty()) throw ValueError("compile_submodules: no submodule specs; give {pattern, options} pairs");
  std::vector<std::regex> res;
  for (const SubmoduleSpec& s : specs) {
    try {
      res.emplace_back(s.pattern);
    } catch (const std::regex_error& e) {
      throw ValueError(fmt::format("compile_submodules: pattern '{}' is not a valid regular expression ({})", s.pattern,
                                   e.what()));
    }
  }
  std::map<const Module*, Entry> found;
  walk(root, "", root_opts.name, root_opts, specs, res, found);
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& [m, e] : found) entries()[m] = std::move(e);
  g_any.store(true, std::memory_order_release);
}

bool submodules_registered() { return g_any.load(std::memory_order_acquire); }

/// protean::call on a registered submodule while a capture runs (see the file comment). Returns false
/// when the call is to be traced by the caller (not registered, or equal options: inlined).
bool submodule_call(Module& m, const Body& body, std::span<const ArgValue> args, std::vector<OutValue>& outs) {
  if (!submodules_registered() || !ops::current_trace_hook()) return false;
  std::shared_ptr<CompiledFunctionImpl> frame;
  std::string path, diff;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = entries().find(&m);
    if (it == entries().end()) return false;
    Entry& e = it->second;
    diff = option_diff(e.opts, e.caller_opts);
    path = e.path;
    if (diff.empty()) {
      if (!e.logged && observe::log_enabled(observe::LogCat::Regions))
        observe::log_line(observe::LogCat::Regions, "",
                          fmt::format("submodule self.{} inlined into {}: equal options", path, e.root_name));
      e.logged = true;
      return false;
    }
    if (!e.logged && observe::log_enabled(observe::LogCat::Regions))
      observe::log_line(observe::LogCat::Regions, "",
                        fmt::format("submodule self.{} is a boundary in {}: its own frame ({})", path, e.root_name, diff));
    e.logged = true;
    if (!e.frame) {
      std::shared_ptr<Module> owner = e.module.lock();
      if (!owner) return false;
      // The body captured by protean::call refers to `m`; the frame keeps the module alive.
      e.frame = make_compiled(e.opts, body, owner);
    }
    frame = e.frame;
  }
  // The caller's graph ends here: under its capture this throws (the caller switches to segmented
  // execution and runs this call again); in segmented execution it runs the pending segment, so the
  // arguments hold real data below.
  protean::graph_break(fmt::format("submodule boundary: self.{} runs its own frame ({})", path, diff));
  ops::TraceHookScope no_hook(nullptr);
  capture::AttributeReaderScope no_reader(nullptr);
  capture::RegionHostScope no_host(nullptr);
  std::vector<ArgValue> real(args.begin(), args.end());
  if (dispatch(*frame, real, outs) == Action::RunEager) outs = body(real);
  return true;
}

}  // namespace protean::detail
