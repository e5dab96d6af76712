// FrameState: what a frame has seen of each source across its compiles (PyTorch's
// automatic_dynamic FrameStateSizeEntry). Each size, stride and scalar is a point of the semilattice
//     unset < value(v) < dynamic
// merged with every observed input when a frame compiles: a value that differs from the recorded one
// becomes dynamic; a rank change makes every dim of the source dynamic. Automatic dynamic then makes
// exactly the dynamic entries symbolic on the next compile. Not thread-safe (the frame's compile
// mutex protects it).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace protean::dynamic {

struct LatticeValue {
  enum class State : uint8_t { Unset, Value, Dynamic } state = State::Unset;
  int64_t value = 0;
  /// Joins `v`; returns true when the state changed to Dynamic.
  bool merge(int64_t v);
  bool dynamic() const { return state == State::Dynamic; }
  std::string str() const;  // "?", "8", "dynamic"
};

struct SourceState {
  std::optional<size_t> rank;  // unset until first seen
  bool rank_dynamic = false;   // rank changed: every dim dynamic
  std::vector<LatticeValue> sizes;
  std::vector<LatticeValue> strides;
  LatticeValue scalar;
  /// Observed min/max per dim over every call: compiles (update_tensor) and cache hits
  /// (widen_size_bound, from the entries' slot ranges); written to the PGO profile as size_range.
  std::vector<std::pair<int64_t, int64_t>> size_bounds;
};

class FrameState {
 public:
  /// Merges one tensor's sizes/strides; returns the dims that just became dynamic.
  std::vector<size_t> update_tensor(const std::string& source, const std::vector<int64_t>& sizes,
                                    const std::vector<int64_t>& strides);
  /// Widens the observed [min, max] of dim `dim` of tensor `source` to cover [lo, hi] (values seen on
  /// cache hits, which never go through update_tensor). A source or dim never seen, or a source whose
  /// rank changed, is left alone. Returns true when the range grew.
  bool widen_size_bound(const std::string& source, size_t dim, int64_t lo, int64_t hi);
  /// Merges a scalar (int/float bits); returns true when it just became dynamic.
  bool update_scalar(const std::string& source, int64_t value);
  bool size_dynamic(const std::string& source, size_t dim) const;
  bool scalar_dynamic(const std::string& source) const;
  const std::map<std::string, SourceState>& sources() const { return sources_; }
  void clear() { sources_.clear(); }
  /// "x: sizes [dynamic, 512] strides [512, 1]" lines, for logs.
  std::string str() const;

 private:
  std::map<std::string, SourceState> sources_;
};

}  // namespace protean::dynamic
