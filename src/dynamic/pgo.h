// PGO profiles: automatic-dynamic decisions saved across runs (PyTorch's "code state" / PGO).
//
// A profile maps a frame identity to what the frame saw of each of its sources:
//
//   {"format": "protean-pgo", "version": 1,
//    "frames": {"mlp|mlp.cpp|12|9f2c...": {
//        "name": "mlp", "file": "mlp.cpp", "line": 12, "content_hash": "9f2c...",
//        "sources": {"x": {"sizes": [8, "dynamic"], "strides": ["dynamic", 1], "scalar": null,
//                          "size_range": [[8, 8], [160, 960]]},
//                    "n": {"scalar": "dynamic"}}}}}
//
// Every size, stride and scalar is a point of the FrameState semilattice  unset < value < dynamic
// (unset is `null` / absent). A rank change makes the whole source dynamic: "sizes": "dynamic".
// `size_range` is the observed [min, max] of each dim (kept for every dim, so `protean pgo show` can
// print the range a dynamic dim covered).
//
// Invariants every function here keeps:
//   * merge() is the semilattice join: commutative, associative, idempotent; entries only move
//     toward dynamic; ranges only widen.
//   * from_json(to_json(p)) == p.
//   * Parsing never crashes on bad input: it throws FormatError naming what is wrong.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dynamic/frame_state.h"

namespace protean::dynamic {

inline constexpr const char* kPgoFormat = "protean-pgo";
inline constexpr int kPgoVersion = 1;

/// Joins two lattice points (unset < value < dynamic; two different values join to dynamic).
LatticeValue join(const LatticeValue& a, const LatticeValue& b);

/// One source (a tensor argument `x`, a list element `xs[1]`, a parameter `self.w`, a scalar `n`).
struct SourceProfile {
  std::optional<size_t> rank;          // set once a tensor was seen ("sizes": null while unset)
  bool rank_dynamic = false;           // the rank changed: every dim is dynamic ("sizes": "dynamic")
  std::vector<LatticeValue> sizes;     // one per dim (empty: not a tensor, or rank_dynamic)
  std::vector<LatticeValue> strides;   // one per dim
  LatticeValue scalar;                 // int / float-bits scalar; Unset for tensors
  std::vector<std::pair<int64_t, int64_t>> size_range;  // observed [min, max] per dim
  bool size_dynamic(size_t dim) const;
  bool operator==(const SourceProfile&) const;
};

/// A frame's identity: function name, file, line and a content hash. For ONNX models the name is
/// "onnx:<graph>:<hash>". key() = "name|file|line|content_hash".
struct FrameIdentity {
  std::string name, file;
  int line = 0;
  std::string content_hash;
  std::string key() const;
};

/// The content hash of a compiled C++ function: C++ source is not available at run time, so it is a
/// hash (16 hex digits, FNV-1a 64) of what defines the frame's interface: its name, argument names and
/// module parameter/buffer names. Editing the function's body without renaming keeps the hash.
std::string content_hash(const std::string& name, const std::vector<std::string>& arg_names,
                         const std::vector<std::string>& parameter_names);

struct FrameProfile {
  FrameIdentity id;
  std::map<std::string, SourceProfile> sources;
  bool size_dynamic(const std::string& source, size_t dim) const;
  bool scalar_dynamic(const std::string& source) const;
  /// True when any size, stride or scalar is dynamic.
  bool any_dynamic() const;
  /// "x: [1, 3, 48, ?]  (dim 3 in [160, 960])" lines, one per source (scalars: "n: ?" / "n: 4").
  std::string render() const;
  bool operator==(const FrameProfile&) const;
};

struct Profile {
  std::map<std::string, FrameProfile> frames;  // key: FrameIdentity::key()
  bool operator==(const Profile&) const;
};

/// Joins `b` into `a` (semilattice); returns true when `a` changed.
bool merge_source(SourceProfile& a, const SourceProfile& b);
bool merge_frame(FrameProfile& a, const FrameProfile& b);
bool merge(Profile& a, const Profile& b);

/// FrameState → profile entry (the frame's observations). Unset sources are skipped.
FrameProfile to_profile(const FrameIdentity& id, const FrameState& fs);
/// Profile entry → FrameState, through FrameState's own join (a dynamic point is the join of two
/// different values), so the result obeys exactly FrameState's rules.
FrameState to_frame_state(const FrameProfile& p);

nlohmann::json to_json(const FrameProfile& p);
nlohmann::json to_json(const Profile& p);
/// Throws FormatError ("<what>: ...") on a malformed document, a wrong "format" or a version other
/// than kPgoVersion (a newer version says so, so the user knows to upgrade rather than that the
/// file is broken).
FrameProfile frame_from_json(const nlohmann::json& j, const std::string& what);
Profile profile_from_json(const nlohmann::json& j, const std::string& what);
/// Parses text (JSON); FormatError on anything wrong.
Profile parse_profile(const std::string& text, const std::string& what);
/// Pretty JSON text (2-space indent, trailing newline).
std::string dump_profile(const Profile& p);

}  // namespace protean::dynamic
