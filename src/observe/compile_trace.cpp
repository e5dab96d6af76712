#include "observe/compile_trace.h"

#include "observe/trace.h"

namespace protean::observe {

nlohmann::json trace_location(const std::string& file, int line, const std::string& function) {
  return {{"file", file}, {"line", line}, {"function", function}};
}

void trace_compile_start(int frame, const std::string& compile_id, const std::string& function, const std::string& file,
                         int line, const std::vector<std::string>& reasons, const std::string& backend,
                         std::string_view dynamic, bool recompile) {
  if (!trace_enabled()) return;
  trace_event("compile_start", {{"frame", frame}, {"compile_id", compile_id}, {"function", function},
                                {"location", trace_location(file, line, function)},
                                {"reasons", recompile ? reasons : std::vector<std::string>{}}, {"backend", backend},
                                {"dynamic", std::string(dynamic)}});
  if (recompile)
    trace_event("recompile", {{"compile_id", compile_id}, {"frame", frame}, {"function", function}, {"reasons", reasons}});
}

void trace_compile_end(const std::string& compile_id, int frame, const std::string& function, std::string_view status,
                       const std::string& error, const nlohmann::json& phases, int64_t guard_count, int64_t node_count) {
  if (!trace_enabled()) return;
  trace_event("compilation_metrics", {{"compile_id", compile_id}, {"frame", frame}, {"function", function},
                                      {"status", std::string(status)}, {"error", error}, {"phases", phases},
                                      {"cache", take_compile_cache(compile_id)},
                                      {"guard_count", guard_count}, {"node_count", node_count},
                                      {"graph_count", status == "success" ? 1 : 0}});
}

void trace_compiled_graph(const std::string& compile_id, const std::string& ir_text, int64_t node_count,
                          const std::string& graph_hash, const nlohmann::json& inputs) {
  if (!trace_enabled()) return;
  trace_event("graph", {{"compile_id", compile_id}, {"ir", ir_text}, {"node_count", node_count},
                        {"graph_hash", graph_hash}, {"inputs", inputs}});
}

int64_t trace_guards(const std::string& compile_id, const std::string& guards_text) {
  int64_t count = 0;
  for (char c : guards_text) count += c == '\n';
  if (trace_enabled()) trace_event("guards", {{"compile_id", compile_id}, {"text", guards_text}, {"count", count}});
  return count;
}

void trace_eager_fallback(int frame, const std::string& function, const std::string& reason) {
  if (!trace_enabled()) return;
  trace_event("eager_fallback", {{"frame", frame}, {"function", function}, {"reason", reason}});
}

void trace_graph_break(int frame, const std::string& compile_id, const std::string& reason, const std::string& op,
                       const std::string& file, int line, const std::string& function) {
  if (!trace_enabled()) return;
  nlohmann::json ev = {{"frame", frame}, {"reason", reason}, {"op", op}, {"location", trace_location(file, line, function)}};
  if (!compile_id.empty()) ev["compile_id"] = compile_id;
  trace_event("graph_break", ev);
}

}  // namespace protean::observe
