// The byte format both backends' stored plans use (src/backend/cpu/program_plan.cpp,
// src/backend/cuda/plan_cache.cpp): fixed-size values in host byte order, strings and byte runs
// with a 64-bit length, and a reader that checks every length against what is left, so a truncated
// or forged plan is a FormatError naming the field and the byte offset, never a read past the end or
// an allocation sized by a forged count.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "protean/tensor.h"
#include "ir/graph.h"
#include "protean/error.h"

namespace protean::backend {

/// The graph's top-level Constant nodes in node order: what a stored plan's constant references index.
inline std::vector<const Tensor*> graph_constants(const ir::Graph& g) {
  std::vector<const Tensor*> out;
  for (const ir::Node& n : g.nodes())
    if (n.kind == ir::NodeKind::Constant) out.push_back(&n.constant);
  return out;
}

struct PlanWriter {
  std::string out;
  template <class T>
  void put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    out += s;
  }
  void bytes(const void* p, size_t n) {
    put<uint64_t>(n);
    out.append(static_cast<const char*>(p), n);
  }
};

struct PlanReader {
  const std::string& s;
  size_t pos = 0;
  /// Names the format in errors ("cpu program plan", "cuda plan").
  const char* format = "plan";
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(fmt::format("{}: {} (at byte {} of {})", format, what, pos, s.size()));
  }
  void need(uint64_t n, const char* what) {
    if (n > s.size() - pos) fail(fmt::format("truncated: {} needs {} bytes", what, n));
  }
  template <class T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v{};
    std::memcpy(&v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const uint64_t n = get<uint64_t>(what);
    need(n, what);
    std::string out = s.substr(pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return out;
  }
  /// A count whose items need at least `min_item` bytes each (so a forged count allocates nothing).
  uint32_t count(const char* what, size_t min_item) {
    const uint32_t n = get<uint32_t>(what);
    if (min_item && n > (s.size() - pos) / min_item) fail(fmt::format("{}: {} items do not fit", what, n));
    return n;
  }
};

}  // namespace protean::backend
