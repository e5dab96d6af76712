#include "dynamic/policy.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <regex>
#include <unordered_map>

#include "dynamic/frame_state.h"
#include "dynamic/pgo.h"
#include "observe/trace.h"

namespace protean {

namespace dynamic {
namespace {
struct MarkTable {
  std::mutex mu;
  // Keyed by impl address; the weak_ptr detects a freed tensor whose address was reused.
  std::unordered_map<const TensorImpl*, std::pair<std::weak_ptr<TensorImpl>, std::vector<DimMark>>> marks;
};
MarkTable& table() {
  static MarkTable t;
  return t;
}
std::atomic<bool> g_any{false};

void set_mark(const Tensor& t, int64_t dim, DimMark m, const char* fn) {
  if (!t.defined()) throw ValueError(fmt::format("{}: undefined tensor", fn));
  int64_t rank = t.dim();
  if (dim < 0) dim += rank;
  if (dim < 0 || dim >= rank)
    throw ValueError(fmt::format("{}: dim {} out of range for a tensor of rank {}", fn, dim, rank));
  if (m.min && m.max && *m.min > *m.max)
    throw ValueError(fmt::format("{}: min {} > max {}", fn, *m.min, *m.max));
  if ((m.min && *m.min < 0) || (m.max && *m.max < 0))
    throw ValueError(fmt::format("{}: a size's range cannot reach below 0 (min {}, max {})", fn,
                                 m.min ? std::to_string(*m.min) : "none", m.max ? std::to_string(*m.max) : "none"));
  auto& tb = table();
  std::lock_guard<std::mutex> lock(tb.mu);
  auto& entry = tb.marks[t.impl()];
  if (entry.first.lock() != t.impl_ptr()) entry = {t.impl_ptr(), {}};
  if (entry.second.size() < static_cast<size_t>(rank)) entry.second.resize(static_cast<size_t>(rank));
  entry.second[static_cast<size_t>(dim)] = m;
  g_any.store(true, std::memory_order_relaxed);
}
}  // namespace

std::vector<DimMark> marks_of(const TensorImpl* t) {
  if (!g_any.load(std::memory_order_relaxed)) return {};
  auto& tb = table();
  std::lock_guard<std::mutex> lock(tb.mu);
  auto it = tb.marks.find(t);
  if (it == tb.marks.end()) return {};
  if (it->second.first.lock().get() != t) {
    tb.marks.erase(it);
    return {};
  }
  return it->second.second;
}
bool any_marks() { return g_any.load(std::memory_order_relaxed); }

bool allowlisted(const std::string& source, const std::string& tensor_source) {
  const char* env = std::getenv("PROTEAN_DYNAMIC_SOURCES");
  if (!env || !*env) return false;
  std::string spec = env;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (!item.empty()) {
      if (item == source || item == tensor_source) return true;
      try {
        std::regex re(item);
        if (std::regex_match(source, re) || (!tensor_source.empty() && std::regex_match(tensor_source, re)))
          return true;
      } catch (const std::regex_error&) {
        // Not a valid regex: exact match only.
      }
    }
    pos = end + 1;
  }
  return false;
}

DimDecision decide_dim(const std::string& tensor_source, const std::string& size_source, size_t dim,
                       const DimMark& mark, const PolicyInput& in) {
  DimDecision d;
  if (allowlisted(size_source, tensor_source)) {
    d.kind = sym::DimKind::Dynamic;
    d.why = "allowlist";
    return d;
  }
  switch (mark.kind) {
    case MarkKind::Dynamic:
      d.kind = sym::DimKind::Dynamic;
      d.constraint.strict = true;
      d.constraint.min = mark.min;
      d.constraint.max = mark.max;
      d.why = "mark_dynamic";
      return d;
    case MarkKind::MaybeDynamic:
      d.kind = sym::DimKind::Dynamic;
      d.why = "maybe_mark_dynamic";
      return d;
    case MarkKind::Static:
      d.why = "mark_static";
      return d;
    case MarkKind::Unbacked:
      d.kind = sym::DimKind::Unbacked;
      d.why = "mark_unbacked";
      return d;
    case MarkKind::None:
      break;
  }
  if (in.is_parameter && !in.dynamic_parameters) {
    d.why = "parameter";
    return d;
  }
  if (in.mode == Dynamic::Off) {
    d.why = "dynamic_off";
    return d;
  }
  // Under dynamic=On every dim is already dynamic; keep its duck sizing.
  if (in.mode != Dynamic::On && in.pgo && in.pgo->size_dynamic(tensor_source, dim)) {
    d.kind = sym::DimKind::Dynamic;
    d.why = "pgo";
    return d;
  }
  if (in.mode != Dynamic::On && in.collective && in.collective->size_dynamic(tensor_source, dim)) {
    d.kind = sym::DimKind::Dynamic;
    d.why = "collectives";
    return d;
  }
  if (in.frame_state && in.frame_state->size_dynamic(tensor_source, dim)) {
    d.kind = sym::DimKind::Dynamic;
    d.why = "automatic";
    return d;
  }
  if (in.mode == Dynamic::On) {
    d.kind = sym::DimKind::Duck;
    d.why = "dynamic_on";
    return d;
  }
  return d;
}

DimDecision decide_scalar(const std::string& source, bool declared_symbolic, const PolicyInput& in) {
  DimDecision d;
  if (!declared_symbolic) {
    d.why = "int_argument";
    return d;
  }
  if (allowlisted(source)) {
    d.kind = sym::DimKind::Dynamic;
    d.why = "allowlist";
    return d;
  }
  if (in.mode == Dynamic::Off) {
    d.why = "dynamic_off";
    return d;
  }
  if ((in.pgo && in.pgo->scalar_dynamic(source)) || (in.collective && in.collective->scalar_dynamic(source))) {
    d.kind = sym::DimKind::Dynamic;
    d.why = in.pgo && in.pgo->scalar_dynamic(source) ? "pgo" : "collectives";
    return d;
  }
  if ((in.frame_state && in.frame_state->scalar_dynamic(source)) || in.mode == Dynamic::On) {
    d.kind = sym::DimKind::Dynamic;
    d.why = in.mode == Dynamic::On ? "dynamic_on" : "automatic";
  }
  return d;
}

void trace_decision(const std::string& compile_id, const std::string& source, int64_t dim, const DimDecision& d,
                    int64_t value, bool symbolic) {
  const char* decision = "static";
  const char* why = d.why;
  switch (d.kind) {
    case sym::DimKind::Static:
      break;
    case sym::DimKind::Unbacked:
      decision = "unbacked";
      break;
    case sym::DimKind::Dynamic:
    case sym::DimKind::Duck:
      decision = symbolic ? "dynamic" : "static";
      if (!symbolic) why = "zero_one";
      break;
  }
  nlohmann::json ev = {{"compile_id", compile_id}, {"source", source}, {"dim", dim},
                       {"decision", decision}, {"why", why}, {"value", value}};
  if (!symbolic && why != d.why) ev["policy"] = d.why;  // what the policy wanted before 0/1 specialization
  observe::trace_event("dimension_decision", std::move(ev));
}

}  // namespace dynamic

void mark_dynamic(const Tensor& t, int64_t dim, std::optional<int64_t> min, std::optional<int64_t> max) {
  dynamic::set_mark(t, dim, {dynamic::MarkKind::Dynamic, min, max}, "mark_dynamic");
}
void maybe_mark_dynamic(const Tensor& t, int64_t dim) {
  dynamic::set_mark(t, dim, {dynamic::MarkKind::MaybeDynamic, {}, {}}, "maybe_mark_dynamic");
}
void mark_static(const Tensor& t, int64_t dim) {
  dynamic::set_mark(t, dim, {dynamic::MarkKind::Static, {}, {}}, "mark_static");
}
void mark_unbacked(const Tensor& t, int64_t dim) {
  dynamic::set_mark(t, dim, {dynamic::MarkKind::Unbacked, {}, {}}, "mark_unbacked");
}

}  // namespace protean
