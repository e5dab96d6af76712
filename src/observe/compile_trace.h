// The structured-trace events of a compile (docs/trace-format.md), in one place: what the dispatcher
// (capture/frame.cpp) and the compile driver (capture/compile.cpp) emit about a frame's compiles.
// Every function does nothing when tracing is off; callers that build an expensive argument (the IR
// text) check observe::trace_enabled() first.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace protean::observe {

/// {"file", "line", "function"}: a user source location as the trace writes it.
nlohmann::json trace_location(const std::string& file, int line, const std::string& function);

/// `compile_start`, and `recompile` when `recompile` is set (`reasons`: the failed guards, newest entry
/// first). `dynamic`: "auto" | "on" | "off".
void trace_compile_start(int frame, const std::string& compile_id, const std::string& function, const std::string& file,
                         int line, const std::vector<std::string>& reasons, const std::string& backend,
                         std::string_view dynamic, bool recompile);

/// `compilation_metrics`: the end of a compile. `status`: "success" | "graph_break" | "error";
/// `phases`: {name: seconds}. Takes the compile's cache lookups (take_compile_cache).
void trace_compile_end(const std::string& compile_id, int frame, const std::string& function, std::string_view status,
                       const std::string& error, const nlohmann::json& phases, int64_t guard_count, int64_t node_count);

/// `graph`: the compiled graph's IR text, its number of calls, the hash of its op sequence and its
/// inputs ([{source, dtype, sizes}]).
void trace_compiled_graph(const std::string& compile_id, const std::string& ir_text, int64_t node_count,
                          const std::string& graph_hash, const nlohmann::json& inputs);

/// `guards`: the entry's guard text; returns its number of guards (lines).
int64_t trace_guards(const std::string& compile_id, const std::string& guards_text);

/// `eager_fallback`: a frame gave up compiling (a recompile limit), with the reason.
void trace_eager_fallback(int frame, const std::string& function, const std::string& reason);

/// `graph_break` at the user's source location (`compile_id` may be empty: a break found outside a compile).
void trace_graph_break(int frame, const std::string& compile_id, const std::string& reason, const std::string& op,
                       const std::string& file, int line, const std::string& function);

}  // namespace protean::observe
