#include "capture/shape_trace.h"

#include <nlohmann/json.hpp>

#include "observe/trace.h"
#include "sym/printer.h"

namespace protean::capture {

namespace {
nlohmann::json location_json(const core::SourceLocation& w) {
  return {{"file", w.file}, {"line", w.line}, {"function", w.function}};
}
const char* dim_kind_name(sym::DimKind k) {
  switch (k) {
    case sym::DimKind::Static:
      return "static";
    case sym::DimKind::Dynamic:
      return "dynamic";
    case sym::DimKind::Duck:
      return "duck";
    case sym::DimKind::Unbacked:
      return "unbacked";
  }
  return "?";
}
/// "[2, int_oo]": the range without its "VR" prefix, as the log lines print it.
std::string range_text(const sym::ValueRange& r) { return sym::to_string(r).substr(2); }
}  // namespace

void trace_shape_event(const sym::ShapeEnv& env, const sym::ShapeEvent& ev, int frame_id, const std::string& compile_id) {
  using K = sym::ShapeEventKind;
  switch (ev.kind) {
    case K::CreateSymbol:
    case K::CreateUnbacked: {
      const sym::SymbolInfo* s = env.symbol_info(ev.expr);
      if (!s) return;
      nlohmann::json j = {{"frame", frame_id},
                          {"compile_id", compile_id},
                          {"symbol", s->symbol->name},
                          {"source", s->sources.empty() ? std::string() : s->sources.front()},
                          {"kind", dim_kind_name(s->kind)},
                          {"range", range_text(s->declared)},
                          {"location", location_json(s->created_at)}};
      if (s->hint) j["hint"] = *s->hint;
      else j["hint"] = nullptr;
      if (s->strict) j["strict"] = true;
      observe::trace_event("create_symbol", std::move(j));
      return;
    }
    case K::GuardAdded:
    case K::RuntimeAssert:
      observe::trace_event("guard_added", {{"frame", frame_id},
                                           {"compile_id", compile_id},
                                           {"expr", sym::print(ev.expr)},
                                           {"runtime_assert", ev.kind == K::RuntimeAssert},
                                           {"location", location_json(ev.where)}});
      return;
    case K::Specialization: {
      if (env.specializations().empty()) return;
      const sym::Specialization& s = env.specializations().back();
      observe::trace_event("specialization", {{"frame", frame_id},
                                              {"compile_id", compile_id},
                                              {"symbol", s.symbol->name},
                                              {"sources", s.sources},
                                              {"value", s.value},
                                              {"reason", s.reason},
                                              {"location", location_json(s.where)}});
      return;
    }
    case K::DuckSize:
    case K::StaticallyKnown:
    case K::Replacement:
    case K::RangeUpdate:
      return;
  }
}

}  // namespace protean::capture
