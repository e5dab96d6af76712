#include "dynamic/pgo.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>

#include "protean/error.h"

namespace protean::dynamic {

using json = nlohmann::json;
using State = LatticeValue::State;

LatticeValue join(const LatticeValue& a, const LatticeValue& b) {
  if (a.state == State::Unset) return b;
  if (b.state == State::Unset) return a;
  if (a.state == State::Dynamic || b.state == State::Dynamic) return LatticeValue{State::Dynamic, 0};
  if (a.value == b.value) return a;
  return LatticeValue{State::Dynamic, 0};
}

namespace {
bool same(const LatticeValue& a, const LatticeValue& b) {
  if (a.state != b.state) return false;
  return a.state != State::Value || a.value == b.value;
}
bool same(const std::vector<LatticeValue>& a, const std::vector<LatticeValue>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}
LatticeValue dyn() { return LatticeValue{State::Dynamic, 0}; }
void make_rank_dynamic(SourceProfile& s) {
  s.rank_dynamic = true;
  s.rank.reset();
  s.sizes.clear();
  s.strides.clear();
  s.size_range.clear();
}
}  // namespace

bool SourceProfile::size_dynamic(size_t dim) const {
  if (rank_dynamic) return true;
  return dim < sizes.size() && sizes[dim].dynamic();
}

bool SourceProfile::operator==(const SourceProfile& o) const {
  return rank == o.rank && rank_dynamic == o.rank_dynamic && same(sizes, o.sizes) && same(strides, o.strides) &&
         same(scalar, o.scalar) && size_range == o.size_range;
}

std::string FrameIdentity::key() const { return fmt::format("{}|{}|{}|{}", name, file, line, content_hash); }

std::string content_hash(const std::string& name, const std::vector<std::string>& arg_names,
                         const std::vector<std::string>& parameter_names) {
  uint64_t h = 1469598103934665603ull;
  auto feed = [&](const std::string& s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // separator (not a byte of UTF-8 text)
    h *= 1099511628211ull;
  };
  feed(name);
  feed("args");
  for (const auto& a : arg_names) feed(a);
  feed("params");
  for (const auto& p : parameter_names) feed(p);
  return fmt::format("{:016x}", h);
}

bool FrameProfile::size_dynamic(const std::string& source, size_t dim) const {
  auto it = sources.find(source);
  return it != sources.end() && it->second.size_dynamic(dim);
}
bool FrameProfile::scalar_dynamic(const std::string& source) const {
  auto it = sources.find(source);
  return it != sources.end() && it->second.scalar.dynamic();
}
bool FrameProfile::any_dynamic() const {
  for (const auto& [n, s] : sources) {
    if (s.rank_dynamic || s.scalar.dynamic()) return true;
    for (const auto& v : s.sizes)
      if (v.dynamic()) return true;
    for (const auto& v : s.strides)
      if (v.dynamic()) return true;
  }
  return false;
}

std::string FrameProfile::render() const {
  std::string r;
  for (const auto& [src, s] : sources) {
    if (s.rank_dynamic) {
      r += fmt::format("{}: [?, ...]  (rank varies: every dim dynamic)\n", src);
      continue;
    }
    if (s.rank) {
      std::string dims, ranges;
      for (size_t d = 0; d < s.sizes.size(); ++d) {
        const auto& v = s.sizes[d];
        dims += d ? ", " : "";
        dims += v.state == State::Value ? std::to_string(v.value) : "?";
        if (v.dynamic() && d < s.size_range.size() && s.size_range[d].first <= s.size_range[d].second)
          ranges += fmt::format("{}dim {} in [{}, {}]", ranges.empty() ? "" : ", ", d, s.size_range[d].first,
                                s.size_range[d].second);
      }
      r += fmt::format("{}: [{}]", src, dims);
      if (!ranges.empty()) r += fmt::format("  ({})", ranges);
      r += "\n";
    }
    if (s.scalar.state != State::Unset)
      r += fmt::format("{}: {}\n", src, s.scalar.dynamic() ? "?" : std::to_string(s.scalar.value));
  }
  return r;
}

bool FrameProfile::operator==(const FrameProfile& o) const {
  return id.key() == o.id.key() && sources == o.sources;
}
bool Profile::operator==(const Profile& o) const { return frames == o.frames; }

bool merge_source(SourceProfile& a, const SourceProfile& b) {
  const SourceProfile before = a;
  LatticeValue sc = join(a.scalar, b.scalar);
  if (a.rank_dynamic || b.rank_dynamic || (a.rank && b.rank && *a.rank != *b.rank)) {
    make_rank_dynamic(a);
  } else if (!a.rank && b.rank) {
    a.rank = b.rank;
    a.sizes = b.sizes;
    a.strides = b.strides;
    a.size_range = b.size_range;
  } else if (a.rank && b.rank) {
    for (size_t d = 0; d < a.sizes.size() && d < b.sizes.size(); ++d) a.sizes[d] = join(a.sizes[d], b.sizes[d]);
    for (size_t d = 0; d < a.strides.size() && d < b.strides.size(); ++d) a.strides[d] = join(a.strides[d], b.strides[d]);
    if (a.size_range.size() < b.size_range.size()) a.size_range.resize(b.size_range.size(), {INT64_MAX, INT64_MIN});
    for (size_t d = 0; d < b.size_range.size(); ++d) {
      a.size_range[d].first = std::min(a.size_range[d].first, b.size_range[d].first);
      a.size_range[d].second = std::max(a.size_range[d].second, b.size_range[d].second);
    }
  }
  a.scalar = sc;
  return !(a == before);
}

bool merge_frame(FrameProfile& a, const FrameProfile& b) {
  bool changed = false;
  for (const auto& [src, s] : b.sources) {
    auto it = a.sources.find(src);
    if (it == a.sources.end()) {
      a.sources.emplace(src, s);
      changed = true;
    } else {
      changed |= merge_source(it->second, s);
    }
  }
  return changed;
}

bool merge(Profile& a, const Profile& b) {
  bool changed = false;
  for (const auto& [key, f] : b.frames) {
    auto it = a.frames.find(key);
    if (it == a.frames.end()) {
      a.frames.emplace(key, f);
      changed = true;
    } else {
      changed |= merge_frame(it->second, f);
    }
  }
  return changed;
}

FrameProfile to_profile(const FrameIdentity& id, const FrameState& fs) {
  FrameProfile p;
  p.id = id;
  for (const auto& [src, st] : fs.sources()) {
    SourceProfile s;
    s.scalar = st.scalar;
    if (st.rank_dynamic) {
      make_rank_dynamic(s);
    } else if (st.rank) {
      s.rank = st.rank;
      size_t r = *st.rank;
      s.sizes.assign(st.sizes.begin(), st.sizes.begin() + static_cast<std::ptrdiff_t>(std::min(r, st.sizes.size())));
      s.strides.assign(st.strides.begin(),
                       st.strides.begin() + static_cast<std::ptrdiff_t>(std::min(r, st.strides.size())));
      s.sizes.resize(r);
      s.strides.resize(r);
      for (size_t d = 0; d < r && d < st.size_bounds.size(); ++d) s.size_range.push_back(st.size_bounds[d]);
    }
    if (!s.rank && !s.rank_dynamic && s.scalar.state == State::Unset) continue;
    p.sources.emplace(src, std::move(s));
  }
  return p;
}

FrameState to_frame_state(const FrameProfile& p) {
  FrameState fs;
  for (const auto& [src, s] : p.sources) {
    if (s.rank_dynamic) {
      fs.update_tensor(src, {2}, {1});
      fs.update_tensor(src, {2, 2}, {2, 1});
    } else if (s.rank) {
      // Two observations whose join is the profile: values repeat, dynamic points differ.
      std::vector<int64_t> s1, s2, t1, t2;
      for (size_t d = 0; d < *s.rank; ++d) {
        const LatticeValue v = d < s.sizes.size() ? s.sizes[d] : LatticeValue{};
        int64_t lo = 2, hi = 3;
        if (d < s.size_range.size() && s.size_range[d].first <= s.size_range[d].second) {
          lo = s.size_range[d].first;
          hi = s.size_range[d].second;
        }
        if (v.state == State::Value) {
          s1.push_back(v.value);
          s2.push_back(v.value);
        } else {
          s1.push_back(lo);
          s2.push_back(hi != lo ? hi : lo + 1);
        }
        const LatticeValue w = d < s.strides.size() ? s.strides[d] : LatticeValue{};
        t1.push_back(w.state == State::Value ? w.value : 1);
        t2.push_back(w.state == State::Value ? w.value : 2);
      }
      fs.update_tensor(src, s1, t1);
      fs.update_tensor(src, s2, t2);
    }
    if (s.scalar.state == State::Value) {
      fs.update_scalar(src, s.scalar.value);
    } else if (s.scalar.dynamic()) {
      fs.update_scalar(src, 0);
      fs.update_scalar(src, 1);
    }
  }
  return fs;
}

// ---- JSON ----------------------------------------------------------------------------------------
namespace {
json point(const LatticeValue& v) {
  switch (v.state) {
    case State::Unset: return nullptr;
    case State::Value: return v.value;
    case State::Dynamic: return "dynamic";
  }
  return nullptr;
}
json points(const std::vector<LatticeValue>& vs) {
  json a = json::array();
  for (const auto& v : vs) a.push_back(point(v));
  return a;
}

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  throw FormatError(fmt::format("{}: {}", what, msg));
}
LatticeValue point_from(const json& j, const std::string& what) {
  if (j.is_null()) return {};
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(what, fmt::format("value {} is larger than any size (2^63 - 1)", j.get<uint64_t>()));
  if (j.is_number_integer()) return LatticeValue{State::Value, j.get<int64_t>()};
  if (j.is_string() && j.get<std::string>() == "dynamic") return dyn();
  bad(what, fmt::format("expected an integer, \"dynamic\" or null, got {}", j.dump()));
}
// Sizes and strides: values must be >= 0 (a negative size would be merged back into every later
// profile and seed guards no tensor can pass).
std::vector<LatticeValue> points_from(const json& j, const std::string& what) {
  if (!j.is_array()) bad(what, fmt::format("expected a list, got {}", j.dump()));
  std::vector<LatticeValue> r;
  for (size_t i = 0; i < j.size(); ++i) {
    r.push_back(point_from(j[i], fmt::format("{}[{}]", what, i)));
    if (r.back().state == State::Value && r.back().value < 0)
      bad(fmt::format("{}[{}]", what, i), fmt::format("negative value {}", r.back().value));
  }
  return r;
}
}  // namespace

json to_json(const FrameProfile& p) {
  json sources = json::object();
  for (const auto& [src, s] : p.sources) {
    json e;
    if (s.rank_dynamic) {
      e["sizes"] = "dynamic";
      e["strides"] = "dynamic";
    } else if (s.rank) {
      e["sizes"] = points(s.sizes);
      e["strides"] = points(s.strides);
    } else {
      e["sizes"] = nullptr;
      e["strides"] = nullptr;
    }
    e["scalar"] = point(s.scalar);
    json ranges = json::array();
    for (const auto& [lo, hi] : s.size_range) ranges.push_back(json::array({lo, hi}));
    e["size_range"] = ranges;
    sources[src] = e;
  }
  json f;
  f["name"] = p.id.name;
  f["file"] = p.id.file;
  f["line"] = p.id.line;
  f["content_hash"] = p.id.content_hash;
  f["sources"] = sources;
  return f;
}

json to_json(const Profile& p) {
  json frames = json::object();
  for (const auto& [key, f] : p.frames) frames[key] = to_json(f);
  json j;
  j["format"] = kPgoFormat;
  j["version"] = kPgoVersion;
  j["frames"] = frames;
  return j;
}

FrameProfile frame_from_json(const json& j, const std::string& what) {
  if (!j.is_object()) bad(what, "a frame entry must be an object");
  FrameProfile p;
  try {
    p.id.name = j.at("name").get<std::string>();
    p.id.file = j.at("file").get<std::string>();
    const json& line = j.at("line");
    // a float or an integer beyond int is refused before the conversion (a huge float cast to int is
    // undefined behaviour, found by the pgo_profile fuzz target)
    if (!line.is_number_integer() || (line.is_number_unsigned() && line.get<uint64_t>() > 2147483647u) ||
        (!line.is_number_unsigned() && (line.get<int64_t>() < -2147483647 - 1 || line.get<int64_t>() > 2147483647)))
      bad(what, fmt::format("frame identity: \"line\" must be an integer within int range, got {}", line.dump()));
    p.id.line = static_cast<int>(line.get<int64_t>());
    p.id.content_hash = j.at("content_hash").get<std::string>();
  } catch (const json::exception& e) {
    bad(what, fmt::format("frame identity (name, file, line, content_hash): {}", e.what()));
  }
  if (!j.contains("sources") || !j["sources"].is_object()) bad(what, "missing \"sources\" object");
  for (const auto& [src, e] : j["sources"].items()) {
    const std::string w = fmt::format("{}: source '{}'", what, src);
    if (!e.is_object()) bad(w, "must be an object");
    SourceProfile s;
    const json sizes = e.value("sizes", json());
    const json strides = e.value("strides", json());
    if (sizes.is_string()) {
      if (sizes.get<std::string>() != "dynamic") bad(w, "\"sizes\" must be a list, \"dynamic\" or null");
      make_rank_dynamic(s);
    } else if (!sizes.is_null()) {
      s.sizes = points_from(sizes, w + ": sizes");
      s.rank = s.sizes.size();
      if (strides.is_null()) {
        s.strides.resize(s.sizes.size());
      } else if (strides.is_string()) {
        s.strides.assign(s.sizes.size(), dyn());
      } else {
        s.strides = points_from(strides, w + ": strides");
        if (s.strides.size() != s.sizes.size())
          bad(w, fmt::format("{} strides for {} sizes", s.strides.size(), s.sizes.size()));
      }
      const json ranges = e.value("size_range", json::array());
      if (!ranges.is_array()) bad(w, "\"size_range\" must be a list of [min, max]");
      for (const auto& r : ranges) {
        if (!r.is_array() || r.size() != 2 || !r[0].is_number_integer() || !r[1].is_number_integer())
          bad(w, fmt::format("bad size_range item {}", r.dump()));
        const int64_t lo = r[0].get<int64_t>(), hi = r[1].get<int64_t>();
        if (lo < 0 || lo > hi)
          bad(w, fmt::format("size_range item {} of dim {} is not a range of sizes (0 <= min <= max)", r.dump(),
                             s.size_range.size()));
        s.size_range.emplace_back(lo, hi);
      }
      if (s.size_range.size() > s.sizes.size())
        bad(w, fmt::format("{} size_range items for a tensor of rank {}", s.size_range.size(), s.sizes.size()));
    }
    s.scalar = point_from(e.value("scalar", json()), w + ": scalar");
    p.sources.emplace(src, std::move(s));
  }
  return p;
}

Profile profile_from_json(const json& j, const std::string& what) {
  if (!j.is_object()) bad(what, "not a JSON object");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kPgoFormat)
    bad(what, fmt::format("not a Protean PGO profile (\"format\" is not \"{}\")", kPgoFormat));
  if (!j.contains("version") || !j["version"].is_number_integer()) bad(what, "missing integer \"version\"");
  const int64_t v = j["version"].get<int64_t>();
  if (v > kPgoVersion)
    bad(what, fmt::format("profile version {} is newer than this Protean understands (version {}); "
                          "upgrade Protean or use a matching job id", v, kPgoVersion));
  if (v != kPgoVersion) bad(what, fmt::format("unsupported profile version {}", v));
  if (!j.contains("frames") || !j["frames"].is_object()) bad(what, "missing \"frames\" object");
  Profile p;
  for (const auto& [key, f] : j["frames"].items()) {
    FrameProfile fp = frame_from_json(f, fmt::format("{}: frame '{}'", what, key));
    if (fp.id.key() != key)
      bad(what, fmt::format("frame key '{}' does not match its identity '{}'", key, fp.id.key()));
    p.frames.emplace(key, std::move(fp));
  }
  return p;
}

Profile parse_profile(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad(what, "not valid JSON");
  return profile_from_json(j, what);
}

std::string dump_profile(const Profile& p) { return to_json(p).dump(2) + "\n"; }

}  // namespace protean::dynamic
