#include "dynamic/frame_state.h"

#include <algorithm>

namespace protean::dynamic {

bool LatticeValue::merge(int64_t v) {
  switch (state) {
    case State::Unset:
      state = State::Value;
      value = v;
      return false;
    case State::Value:
      if (value == v) return false;
      state = State::Dynamic;
      return true;
    case State::Dynamic:
      return false;
  }
  return false;
}

std::string LatticeValue::str() const {
  switch (state) {
    case State::Unset: return "?";
    case State::Value: return std::to_string(value);
    case State::Dynamic: return "dynamic";
  }
  return "?";
}

std::vector<size_t> FrameState::update_tensor(const std::string& source, const std::vector<int64_t>& sizes,
                                              const std::vector<int64_t>& strides) {
  SourceState& s = sources_[source];
  std::vector<size_t> newly;
  if (s.rank && *s.rank != sizes.size() && !s.rank_dynamic) {
    s.rank_dynamic = true;
    for (size_t d = 0; d < sizes.size(); ++d) newly.push_back(d);
  }
  s.rank = sizes.size();
  if (s.sizes.size() < sizes.size()) {
    s.sizes.resize(sizes.size());
    s.strides.resize(sizes.size());
    s.size_bounds.resize(sizes.size(), {INT64_MAX, INT64_MIN});
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (s.rank_dynamic) {
      s.sizes[d].state = LatticeValue::State::Dynamic;
      s.strides[d].state = LatticeValue::State::Dynamic;
    } else {
      if (s.sizes[d].merge(sizes[d])) newly.push_back(d);
      if (d < strides.size()) s.strides[d].merge(strides[d]);
    }
    s.size_bounds[d].first = std::min(s.size_bounds[d].first, sizes[d]);
    s.size_bounds[d].second = std::max(s.size_bounds[d].second, sizes[d]);
  }
  return newly;
}

bool FrameState::widen_size_bound(const std::string& source, size_t dim, int64_t lo, int64_t hi) {
  auto it = sources_.find(source);
  if (it == sources_.end() || it->second.rank_dynamic || lo > hi) return false;
  SourceState& s = it->second;
  if (dim >= s.size_bounds.size() || !s.rank || dim >= *s.rank) return false;
  auto& b = s.size_bounds[dim];
  if (lo >= b.first && hi <= b.second) return false;
  b.first = std::min(b.first, lo);
  b.second = std::max(b.second, hi);
  return true;
}

bool FrameState::update_scalar(const std::string& source, int64_t value) { return sources_[source].scalar.merge(value); }

bool FrameState::size_dynamic(const std::string& source, size_t dim) const {
  auto it = sources_.find(source);
  if (it == sources_.end()) return false;
  if (it->second.rank_dynamic) return true;
  return dim < it->second.sizes.size() && it->second.sizes[dim].dynamic();
}

bool FrameState::scalar_dynamic(const std::string& source) const {
  auto it = sources_.find(source);
  return it != sources_.end() && it->second.scalar.dynamic();
}

std::string FrameState::str() const {
  std::string r;
  for (const auto& [src, s] : sources_) {
    r += src + ":";
    if (!s.sizes.empty()) {
      r += " sizes [";
      for (size_t i = 0; i < s.sizes.size(); ++i) r += (i ? ", " : "") + s.sizes[i].str();
      r += "] strides [";
      for (size_t i = 0; i < s.strides.size(); ++i) r += (i ? ", " : "") + s.strides[i].str();
      r += "]";
    }
    if (s.scalar.state != LatticeValue::State::Unset) r += " scalar " + s.scalar.str();
    r += "\n";
  }
  return r;
}

}  // namespace protean::dynamic
