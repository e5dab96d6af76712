// ModelProto → importer IR. Every check that a corrupt or hand-made file can fail lives here, so the
// evaluator can trust the IR. See loader.h.
#include "frontends/onnx/loader.h"

#include <fmt/format.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#include <onnx/version_converter/convert.h>

#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>

#include "core/files.h"
#include "protean/error.h"

namespace protean::onnx::detail {

namespace {

/// A read-only-shared, copy-on-write mapping of one external data file (kept alive by the tensors
/// that point into it).
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base && size) ::munmap(base, size);
  }
};

struct Ctx {
  const std::string& file;
  /// Directory of the model file, where external data must live; empty when loaded from bytes.
  std::string base_dir;
  mutable std::map<std::string, std::shared_ptr<Mapping>> mappings;  // by canonical path
  mutable uint64_t external_hash = 0;
  int64_t source_opset = 0;  // the file's own default-domain opset (before any upgrade)
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(fmt::format("ONNX model '{}': {}", file, what));
  }
};

/// `text` for a message: control characters as \xNN (a NUL would end the message where it stands).
std::string printable(const std::string& text) {
  std::string r;
  for (unsigned char ch : text)
    if (ch < 0x20 || ch == 0x7f) r += fmt::format("\\x{:02x}", ch);
    else r += static_cast<char>(ch);
  return r;
}

/// Maps `location` (relative to the model's directory, which it must not leave).
std::shared_ptr<Mapping> map_external(const Ctx& c, const std::string& tname, const std::string& location_bytes) {
  namespace fs = std::filesystem;
  const std::string location = printable(location_bytes);  // as messages show it
  if (location_bytes.find('\0') != std::string::npos)
    c.fail(fmt::format("{} names external data '{}': a location cannot contain a NUL byte", tname, location));
  if (c.base_dir.empty())
    throw NotImplementedError(fmt::format("ONNX model '{}': {} uses external data ('{}'), which needs the model "
                                          "loaded from its file (onnx::load(path)), not from bytes", c.file, tname,
                                          location));
  fs::path rel(location_bytes);
  if (location_bytes.empty() || rel.is_absolute())
    c.fail(fmt::format("{} names external data '{}': the location must be a relative path beside the model", tname,
                       location));
  for (const auto& part : rel)
    if (part == "..")
      c.fail(fmt::format("{} names external data '{}', which leaves the model's directory", tname, location));
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::path(c.base_dir), ec);
  fs::path full = fs::weakly_canonical(fs::path(c.base_dir) / rel, ec);
  auto [bend, fend] = std::mismatch(base.begin(), base.end(), full.begin(), full.end());
  if (ec || bend != base.end())
    c.fail(fmt::format("{} names external data '{}', which resolves outside the model's directory {} (through a "
                       "symbolic link?)", tname, location, base.string()));
  if (auto it = c.mappings.find(full.string()); it != c.mappings.end()) return it->second;
  int fd = -1;
  uint64_t file_size = 0;
  try {
    fd = core::open_regular_file(full.string(), "external data file", &file_size);
  } catch (const RuntimeError& e) {
    c.fail(fmt::format("{} names external data '{}', but {} is not a readable file ({})", tname, location,
                       full.string(), e.what()));
  }
  auto m = std::make_shared<Mapping>();
  if (file_size > 0) {
    m->size = static_cast<size_t>(file_size);
    // Private mapping: pages are read from the file on demand and a (never expected) write stays local.
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      c.fail(fmt::format("{}: cannot map external data file {} ({} bytes)", tname, full.string(), m->size));
    }
    m->base = p;
  }
  ::close(fd);
  // The frame identity covers the weights too: the file's bytes join the content hash.
  c.external_hash = XXH64(m->base ? m->base : "", m->size, c.external_hash);
  c.mappings[full.string()] = m;
  return m;
}

/// An external-data TensorProto as a Tensor viewing the mapped file (a copy only for misaligned or
/// bool data).
Tensor external_tensor(const ::onnx::TensorProto& tp, const Ctx& c, const std::string& tname, const IntVec& dims,
                       int64_t numel, size_t isz, DType dt) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : tp.external_data()) {
    auto num = [&](const char* key) {
      try {
        size_t used = 0;
        long long v = std::stoll(kv.value(), &used);
        if (used != kv.value().size() || v < 0) throw std::invalid_argument("");
        return static_cast<int64_t>(v);
      } catch (const std::exception&) {
        c.fail(fmt::format("{} has external_data {} = '{}', not a non-negative integer", tname, key, kv.value()));
      }
    };
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = num("offset");
    else if (kv.key() == "length") length = num("length");
  }
  if (location.empty()) c.fail(fmt::format("{} uses external data without a location", tname));
  std::shared_ptr<Mapping> m = map_external(c, tname, location);
  size_t need = static_cast<size_t>(numel) * isz;
  if (length >= 0 && static_cast<size_t>(length) != need)
    c.fail(fmt::format("{} of shape {} needs {} bytes, its external data length is {}", tname,
                       to_string(to_symint_vec(dims)), need, length));
  if (static_cast<size_t>(offset) > m->size || m->size - static_cast<size_t>(offset) < need)
    c.fail(fmt::format("{} needs bytes [{}, {}) of external data '{}', which has {} bytes", tname, offset,
                       static_cast<size_t>(offset) + need, location, m->size));
  char* src = static_cast<char*>(m->base) + offset;
  if (need == 0) return empty(dims, dt);
  if (dt == DType::Bool || offset % static_cast<int64_t>(isz) != 0) {
    Tensor t = empty(dims, dt);
    char* p = static_cast<char*>(t.data_ptr());
    std::memcpy(p, src, need);
    if (dt == DType::Bool)
      for (int64_t i = 0; i < numel; ++i) p[i] = p[i] != 0;
    return t;
  }
  return from_blob(src, dims, dt, {}, [m](void*) {});
}

// ---- tensors ----------------------------------------------------------------------------------------
size_t onnx_itemsize(int32_t t) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: case ::onnx::TensorProto::INT32: return 4;
    case ::onnx::TensorProto::UINT8: case ::onnx::TensorProto::INT8: case ::onnx::TensorProto::BOOL: return 1;
    case ::onnx::TensorProto::INT64: case ::onnx::TensorProto::DOUBLE: return 8;
    case ::onnx::TensorProto::FLOAT16: case ::onnx::TensorProto::BFLOAT16: return 2;
    case ::onnx::TensorProto::INT16: case ::onnx::TensorProto::UINT16: return 2;
    case ::onnx::TensorProto::UINT32: return 4;
    case ::onnx::TensorProto::UINT64: return 8;
    default: return 0;
  }
}

/// An int16 / uint16 / uint32 / uint64 TensorProto widened into its carrier dtype (i32 / i32 / i64 / i64).
Tensor carried_tensor(const ::onnx::TensorProto& tp, const Ctx& c, const std::string& tname, const IntVec& dims,
                      int64_t numel, DType dt) {
  int32_t ty = tp.data_type();
  Tensor t = empty(dims, dt);
  auto put = [&](int64_t i, uint64_t bits) {
    int64_t v = 0;
    switch (ty) {
      case ::onnx::TensorProto::INT16: v = static_cast<int16_t>(static_cast<uint16_t>(bits)); break;
      case ::onnx::TensorProto::UINT16: v = static_cast<uint16_t>(bits); break;
      case ::onnx::TensorProto::UINT32: v = static_cast<uint32_t>(bits); break;
      default:
        if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          throw NotImplementedError(fmt::format("ONNX model '{}': {} holds the uint64 value {}, at or above 2^63 "
                                                "(Protean carries uint64 as int64)", c.file, tname, bits));
        v = static_cast<int64_t>(bits);
        break;
    }
    if (dt == DType::I32) static_cast<int32_t*>(t.data_ptr())[i] = static_cast<int32_t>(v);
    else static_cast<int64_t*>(t.data_ptr())[i] = v;
  };
  size_t isz = onnx_itemsize(ty);
  if (tp.has_raw_data()) {
    const std::string& raw = tp.raw_data();
    if (raw.size() != static_cast<size_t>(numel) * isz)
      c.fail(fmt::format("{} ({}) needs {} bytes of raw data, the file holds {}", tname, onnx_type_name(ty),
                         static_cast<size_t>(numel) * isz, raw.size()));
    for (int64_t i = 0; i < numel; ++i) {
      uint64_t bits = 0;
      std::memcpy(&bits, raw.data() + static_cast<size_t>(i) * isz, isz);  // little-endian, as ONNX stores it
      put(i, bits);
    }
    return t;
  }
  bool in_int32 = ty == ::onnx::TensorProto::INT16 || ty == ::onnx::TensorProto::UINT16;
  int64_t have = in_int32 ? tp.int32_data_size() : tp.uint64_data_size();
  if (have != numel)
    c.fail(fmt::format("{} of shape {} needs {} elements, the file holds {}", tname, to_string(to_symint_vec(dims)),
                       numel, have));
  for (int64_t i = 0; i < numel; ++i)
    put(i, in_int32 ? static_cast<uint64_t>(static_cast<uint32_t>(tp.int32_data(static_cast<int>(i))))
                    : tp.uint64_data(static_cast<int>(i)));
  return t;
}

Tensor convert_tensor(const ::onnx::TensorProto& tp, const Ctx& c, const std::string& what) {
  std::string tname = tp.name().empty() ? what : fmt::format("{} '{}'", what, tp.name());
  bool external = tp.data_location() == ::onnx::TensorProto::EXTERNAL;
  std::optional<DType> dt = dtype_from_onnx(tp.data_type());
  if (!dt)
    throw NotImplementedError(fmt::format("ONNX model '{}': {} has element type {}, which Protean does not "
                                          "support", c.file, tname, onnx_type_name(tp.data_type())));
  IntVec dims;
  // Cap the element count so a corrupt dim cannot request a huge allocation; real data must back it.
  constexpr int64_t kMaxNumel = int64_t(1) << 40;
  int64_t numel = 1;
  for (int64_t d : tp.dims()) {
    if (d < 0) c.fail(fmt::format("{} has a negative dim {}", tname, d));
    if (d > 0 && numel > kMaxNumel / d) c.fail(fmt::format("{} has an absurd size", tname));
    numel *= d;
    dims.push_back(d);
  }
  size_t isz = onnx_itemsize(tp.data_type());
  Tensor t;
  auto alloc = [&] {
    t = empty(dims, *dt);
    return static_cast<char*>(t.data_ptr());
  };
  auto count_mismatch = [&](size_t have) {
    c.fail(fmt::format("{} of shape {} needs {} elements, the file holds {}", tname, to_string(to_symint_vec(dims)),
                       numel, have));
  };
  if (is_carried_type(tp.data_type())) {
    if (external)
      throw NotImplementedError(fmt::format("ONNX model '{}': {} of element type {} stored as external data", c.file,
                                            tname, onnx_type_name(tp.data_type())));
    return carried_tensor(tp, c, tname, dims, numel, *dt);
  }
  if (external) return external_tensor(tp, c, tname, dims, numel, isz, *dt);
  if (tp.has_raw_data()) {
    const std::string& raw = tp.raw_data();
    if (raw.size() != static_cast<size_t>(numel) * isz)
      c.fail(fmt::format("{} of shape {} ({}) needs {} bytes of raw data, the file holds {}", tname,
                         to_string(to_symint_vec(dims)), onnx_type_name(tp.data_type()), numel * isz, raw.size()));
    char* p = alloc();
    if (numel > 0) std::memcpy(p, raw.data(), raw.size());
    if (*dt == DType::Bool)
      for (int64_t i = 0; i < numel; ++i) p[i] = p[i] != 0;
    return t;
  }
  switch (tp.data_type()) {
    case ::onnx::TensorProto::FLOAT: {
      if (tp.float_data_size() != numel) count_mismatch(tp.float_data_size());
      char* p = alloc();
      if (numel > 0) std::memcpy(p, tp.float_data().data(), numel * 4);
      return t;
    }
    case ::onnx::TensorProto::DOUBLE: {
      if (tp.double_data_size() != numel) count_mismatch(tp.double_data_size());
      char* p = alloc();
      if (numel > 0) std::memcpy(p, tp.double_data().data(), numel * 8);
      return t;
    }
    case ::onnx::TensorProto::INT64: {
      if (tp.int64_data_size() != numel) count_mismatch(tp.int64_data_size());
      char* p = alloc();
      if (numel > 0) std::memcpy(p, tp.int64_data().data(), numel * 8);
      return t;
    }
    case ::onnx::TensorProto::INT32: case ::onnx::TensorProto::INT8: case ::onnx::TensorProto::UINT8:
    case ::onnx::TensorProto::BOOL: case ::onnx::TensorProto::FLOAT16: case ::onnx::TensorProto::BFLOAT16: {
      if (tp.int32_data_size() != numel) count_mismatch(tp.int32_data_size());
      char* p = alloc();
      for (int64_t i = 0; i < numel; ++i) {
        int32_t v = tp.int32_data(static_cast<int>(i));
        switch (isz) {
          case 4: std::memcpy(p + 4 * i, &v, 4); break;
          case 2: { uint16_t h = static_cast<uint16_t>(v); std::memcpy(p + 2 * i, &h, 2); break; }
          default: p[i] = *dt == DType::Bool ? (v != 0) : static_cast<char>(v); break;
        }
      }
      return t;
    }
    default: break;
  }
  c.fail(fmt::format("{} has no data for element type {}", tname, onnx_type_name(tp.data_type())));
}

// ---- attributes ---------------------------------------------------------------------------------------
// A graph input's declaration is what inputs are checked against: a negative dim or an element type
// without a Protean dtype would let any tensor through.
void check_input_declaration(const ::onnx::ValueInfoProto& vi, const TensorInfo& info, const Ctx& c) {
  if (info.onnx_elem_type != 0 && !info.dtype)
    c.fail(fmt::format("input '{}' is declared with element type {} ({}), which Protean does not support", info.name,
                       detail::onnx_type_name(info.onnx_elem_type), info.onnx_elem_type));
  if (!vi.has_type() || !vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
  const auto& dims = vi.type().tensor_type().shape().dim();
  for (int d = 0; d < dims.size(); ++d)
    if (dims[d].has_dim_value() && dims[d].dim_value() < 0)
      c.fail(fmt::format("input '{}' declares dim {} as {}: a dim is a size >= 0 or a name (dim_param)", info.name, d,
                         dims[d].dim_value()));
}

std::shared_ptr<Graph> convert_graph(const ::onnx::GraphProto& gp, const Ctx& c, int64_t opset,
                                     const std::unordered_set<std::string>& outer, bool top);

Attr convert_attr(const ::onnx::AttributeProto& ap, const std::string& node_label, const Ctx& c, int64_t opset,
                  const std::unordered_set<std::string>& known) {
  Attr a;
  int type = ap.type();
  if (type == ::onnx::AttributeProto::UNDEFINED) {  // very old exporters: infer from the field set
    if (ap.has_f()) type = ::onnx::AttributeProto::FLOAT;
    else if (ap.has_i()) type = ::onnx::AttributeProto::INT;
    else if (ap.has_s()) type = ::onnx::AttributeProto::STRING;
    else if (ap.has_t()) type = ::onnx::AttributeProto::TENSOR;
    else if (ap.has_g()) type = ::onnx::AttributeProto::GRAPH;
    else if (ap.floats_size()) type = ::onnx::AttributeProto::FLOATS;
    else if (ap.ints_size()) type = ::onnx::AttributeProto::INTS;
    else if (ap.strings_size()) type = ::onnx::AttributeProto::STRINGS;
  }
  switch (type) {
    case ::onnx::AttributeProto::FLOAT: a.type = Attr::Type::Float; a.f = ap.f(); break;
    case ::onnx::AttributeProto::INT: a.type = Attr::Type::Int; a.i = ap.i(); break;
    case ::onnx::AttributeProto::STRING: a.type = Attr::Type::String; a.s = ap.s(); break;
    case ::onnx::AttributeProto::TENSOR:
      a.type = Attr::Type::Tensor;
      a.t = convert_tensor(ap.t(), c, fmt::format("attribute '{}' of node {}", ap.name(), node_label));
      break;
    case ::onnx::AttributeProto::GRAPH:
      a.type = Attr::Type::Graph;
      a.g = convert_graph(ap.g(), c, opset, known, false);
      break;
    case ::onnx::AttributeProto::FLOATS:
      a.type = Attr::Type::Floats;
      a.floats.assign(ap.floats().begin(), ap.floats().end());
      break;
    case ::onnx::AttributeProto::INTS:
      a.type = Attr::Type::Ints;
      a.ints.assign(ap.ints().begin(), ap.ints().end());
      break;
    case ::onnx::AttributeProto::STRINGS:
      a.type = Attr::Type::Strings;
      a.strings.assign(ap.strings().begin(), ap.strings().end());
      break;
    case ::onnx::AttributeProto::TYPE_PROTO:
      // Only Optional has one (the type an empty optional would hold); evaluation never needs it, so it
      // is kept as the name of its kind.
      a.type = Attr::Type::String;
      a.s = ap.tp().has_tensor_type() ? "tensor" : ap.tp().has_sequence_type() ? "sequence"
          : ap.tp().has_optional_type() ? "optional" : "other";
      break;
    default:
      c.fail(fmt::format("attribute '{}' of node {} has type {}, which Protean does not read", ap.name(),
                         node_label, type));
  }
  return a;
}

// Expected types of the attributes the importer reads; a mismatch is a FormatError at load.
const std::map<std::string, Attr::Type>& attr_types() {
  using T = Attr::Type;
  static const std::map<std::string, Attr::Type> m = {
      {"axis", T::Int}, {"group", T::Int}, {"keepdims", T::Int}, {"to", T::Int}, {"count_include_pad", T::Int},
      {"ceil_mode", T::Int}, {"hidden_size", T::Int}, {"layout", T::Int}, {"input_forget", T::Int},
      {"allowzero", T::Int}, {"storage_order", T::Int}, {"training_mode", T::Int},
      {"noop_with_empty_axes", T::Int}, {"value_int", T::Int}, {"exclude_outside", T::Int},
      {"axes", T::Ints}, {"perm", T::Ints}, {"kernel_shape", T::Ints}, {"strides", T::Ints}, {"pads", T::Ints},
      {"dilations", T::Ints}, {"starts", T::Ints}, {"ends", T::Ints}, {"output_padding", T::Ints},
      {"output_shape", T::Ints}, {"value_ints", T::Ints},
      {"epsilon", T::Float}, {"momentum", T::Float}, {"alpha", T::Float}, {"beta", T::Float}, {"min", T::Float},
      {"max", T::Float}, {"clip", T::Float}, {"value_float", T::Float}, {"cubic_coeff_a", T::Float},
      {"extrapolation_value", T::Float},
      {"mode", T::String}, {"auto_pad", T::String}, {"coordinate_transformation_mode", T::String},
      {"nearest_mode", T::String}, {"direction", T::String},
      {"activations", T::Strings}, {"value_floats", T::Floats},
      {"then_branch", T::Graph}, {"else_branch", T::Graph},
  };
  return m;
}

TensorInfo convert_value_info(const ::onnx::ValueInfoProto& vi) {
  TensorInfo info;
  info.name = vi.name();
  const bool opt_tensor = vi.has_type() && vi.type().has_optional_type() &&
                          vi.type().optional_type().elem_type().has_tensor_type();
  if (vi.has_type() && (vi.type().has_tensor_type() || opt_tensor)) {
    info.optional = opt_tensor;
    const auto& tt = opt_tensor ? vi.type().optional_type().elem_type().tensor_type() : vi.type().tensor_type();
    info.onnx_elem_type = tt.elem_type();
    info.dtype = dtype_from_onnx(tt.elem_type());
    if (tt.has_shape()) {
      info.has_shape = true;
      for (const auto& d : tt.shape().dim()) {
        if (d.has_dim_value() && d.dim_value() >= 0) {
          info.dims.emplace_back(d.dim_value());
          info.dim_params.emplace_back();
        } else {
          info.dims.emplace_back(std::nullopt);
          info.dim_params.push_back(d.has_dim_param() ? d.dim_param() : std::string());
        }
      }
    }
  }
  return info;
}

std::shared_ptr<Graph> convert_graph(const ::onnx::GraphProto& gp, const Ctx& c, int64_t opset,
                                     const std::unordered_set<std::string>& outer, bool /*top*/) {
  auto g = std::make_shared<Graph>();
  g->name = gp.name();
  std::unordered_set<std::string> local;  // defined in this graph
  std::unordered_set<std::string> captured;
  auto define = [&](const std::string& name, const std::string& by) {
    if (name.empty()) return;
    if (!local.insert(name).second)
      c.fail(fmt::format("value '{}' is defined twice in graph '{}' (second time by {})", name, g->name, by));
  };
  for (const auto& init : gp.initializer()) {
    if (init.name().empty()) c.fail(fmt::format("graph '{}' has an initializer without a name", g->name));
    define(init.name(), "an initializer");
    g->constants[init.name()] = Value::tensor(convert_tensor(init, c, "initializer"));
    if (is_carried_type(init.data_type())) g->carried[init.name()] = init.data_type();
  }
  if (gp.sparse_initializer_size() > 0)
    throw NotImplementedError(fmt::format("ONNX model '{}': sparse initializers are not supported", c.file));
  for (const auto& in : gp.input()) {
    if (in.name().empty()) c.fail(fmt::format("graph '{}' has an input without a name", g->name));
    if (g->constants.count(in.name())) continue;  // an initializer listed as input (IR < 4 style)
    define(in.name(), "a graph input");
    g->inputs.push_back(convert_value_info(in));
    check_input_declaration(in, g->inputs.back(), c);
  }
  auto is_known = [&](const std::string& n) { return local.count(n) || outer.count(n); };
  int64_t index = 0;
  for (const auto& np : gp.node()) {
    Node n;
    n.name = np.name();
    n.op_type = np.op_type();
    n.domain = np.domain();
    n.opset = opset;
    n.source_opset = c.source_opset;
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    if (n.name.empty()) n.name = fmt::format("#{}", index);
    ++index;
    std::string label = n.label();
    if (n.op_type.empty()) c.fail(fmt::format("node {} has no op_type", label));
    for (const auto& in : n.inputs) {
      if (in.empty()) continue;
      if (!is_known(in))
        c.fail(fmt::format("node {} reads value '{}', which nothing defines before it (dangling name or nodes "
                           "out of topological order)", label, in));
      if (!local.count(in)) captured.insert(in);
    }
    // Subgraphs see everything defined so far, here and outside.
    std::unordered_set<std::string> known;
    bool has_graph = false;
    for (const auto& ap : np.attribute()) has_graph |= ap.type() == ::onnx::AttributeProto::GRAPH || ap.has_g();
    if (has_graph) {
      known = outer;
      known.insert(local.begin(), local.end());
    }
    for (const auto& ap : np.attribute()) {
      if (ap.name().empty()) c.fail(fmt::format("node {} has an attribute without a name", label));
      Attr a = convert_attr(ap, label, c, opset, known);
      auto it = attr_types().find(ap.name());
      if (it != attr_types().end() && it->second != a.type && !(n.op_type == "Constant" && ap.name() != "value")) {
        c.fail(fmt::format("attribute '{}' of node {} has type {}, expected {}", ap.name(), label,
                           attr_type_name(a.type), attr_type_name(it->second)));
      }
      if (a.type == Attr::Type::Graph) {
        // Only loop bodies take inputs (Loop, Scan); an If branch or another op's graph that declares
        // inputs has no way to receive them.
        if (!a.g->inputs.empty() && n.op_type != "Loop" && n.op_type != "Scan")
          throw NotImplementedError(fmt::format("ONNX model '{}': subgraph '{}' of node {} takes inputs (only Loop "
                                                "and Scan bodies are supported)", c.file, a.g->name, label));
        for (const auto& name : a.g->captured) {
          n.captured.push_back(name);
          if (!local.count(name)) captured.insert(name);
        }
      }
      n.attrs[ap.name()] = std::move(a);
    }
    for (const auto& out : n.outputs) define(out, "node " + label);
    if ((n.op_type == "Constant" || n.op_type == "ConstantOfShape") && !n.outputs.empty())
      for (const auto& ap : np.attribute())
        if (ap.name() == "value" && ap.has_t() && is_carried_type(ap.t().data_type()))
          g->carried[n.outputs[0]] = ap.t().data_type();
    g->nodes.push_back(std::move(n));
  }
  for (const auto& out : gp.output()) {
    if (out.name().empty()) c.fail(fmt::format("graph '{}' has an output without a name", g->name));
    if (!is_known(out.name()))
      c.fail(fmt::format("graph '{}' output '{}' is not produced by any node, input or initializer", g->name,
                         out.name()));
    if (!local.count(out.name())) captured.insert(out.name());
    g->outputs.push_back(convert_value_info(out));
  }
  g->captured.assign(captured.begin(), captured.end());
  return g;
}

}  // namespace

namespace {

// Every value a node of `g` reads and every output of `g` is defined before it is read: a graph
// input, an initializer, an earlier node's output or (in a subgraph) a name of an enclosing graph.
// An empty name is an omitted optional input. Iterative over nested subgraphs.
/// Whether ONNX's shape inference can be run on `g` without crashing inside libonnx: the opset-1
/// ConvTranspose inference (libonnx 1.12) indexes the weight's dims by the input's rank and reads
/// both as tensors, so a weight of another type or rank, or a dim with neither a value nor a name,
/// makes it read out of bounds. Such a model is upgraded without inferred shapes (inference is best
/// effort; the converter then names what it lacks).
bool shape_inference_is_safe(const ::onnx::GraphProto& g) {
  std::map<std::string, const ::onnx::TypeProto*> types;
  for (const auto& v : g.input()) types[v.name()] = &v.type();
  for (const auto& v : g.value_info()) types[v.name()] = &v.type();
  // A declared type must be a tensor whose dims each have a value or a name; an undeclared one
  // (an intermediate value) gets its type from inference itself.
  auto declared_ok = [](const ::onnx::TypeProto* t) {
    if (t == nullptr) return true;
    if (!t->has_tensor_type()) return false;
    if (!t->tensor_type().has_shape()) return true;
    for (const auto& d : t->tensor_type().shape().dim())
      if (!d.has_dim_value() && !d.has_dim_param()) return false;
    return true;
  };
  auto rank = [](const ::onnx::TypeProto* t) {
    return t != nullptr && t->tensor_type().has_shape() ? t->tensor_type().shape().dim_size() : -1;
  };
  for (const auto& n : g.node()) {
    for (const auto& a : n.attribute()) {
      if (a.has_g() && !shape_inference_is_safe(a.g())) return false;
      for (const auto& sg : a.graphs())
        if (!shape_inference_is_safe(sg)) return false;
    }
    if (n.op_type() != "ConvTranspose") continue;
    if (n.input_size() < 2 || n.input(0).empty() || n.input(1).empty()) return false;
    const ::onnx::TypeProto* x = types.count(n.input(0)) ? types.at(n.input(0)) : nullptr;
    const ::onnx::TypeProto* w = types.count(n.input(1)) ? types.at(n.input(1)) : nullptr;
    if (!declared_ok(x) || !declared_ok(w)) return false;
    if (rank(x) >= 0 && rank(w) >= 0 && rank(x) != rank(w)) return false;
  }
  return true;
}

/// Refuses, by name, a Gemm that libonnx 1.12's Gemm 6 -> 7 adapter cannot read: it indexes the
/// shapes of A and B as matrices without checking their ranks, so an input whose rank is unknown or
/// not 2 makes it read past the end of the shape (heap garbage, then a huge allocation or a crash
/// that depends on earlier loads; found by the onnx_loader fuzz target). Ranks come from the graph's
/// declared inputs, value_info (after ONNX's shape inference), outputs and initializers, in every
/// (sub)graph. ONNX's own Gemm shape inference of those opsets indexes the same way, so it runs first
/// with `require_known` false (a declared rank other than 2 is refused; an unknown one passes), then
/// again on the inferred graph with `require_known` true.
void check_gemm_ranks_for_upgrade(const ::onnx::GraphProto& top, int64_t opset, bool require_known, const Ctx& c) {
  std::map<std::string, int> ranks;  // -1: declared without a shape
  std::vector<const ::onnx::GraphProto*> work{&top}, all;
  while (!work.empty()) {
    const ::onnx::GraphProto* g = work.back();
    work.pop_back();
    all.push_back(g);
    auto note = [&](const ::onnx::ValueInfoProto& v) {
      const auto& t = v.type();
      ranks[v.name()] = t.has_tensor_type() && t.tensor_type().has_shape() ? t.tensor_type().shape().dim_size() : -1;
    };
    for (const auto& v : g->input()) note(v);
    for (const auto& v : g->value_info()) note(v);
    for (const auto& v : g->output()) note(v);
    for (const auto& t : g->initializer()) ranks[t.name()] = t.dims_size();
    for (const auto& n : g->node())
      for (const auto& a : n.attribute()) {
        if (a.has_g()) work.push_back(&a.g());
        for (const auto& sg : a.graphs()) work.push_back(&sg);
      }
  }
  for (const auto* g : all)
    for (const auto& n : g->node()) {
      if (n.op_type() != "Gemm" || !(n.domain().empty() || n.domain() == "ai.onnx")) continue;
      for (int i = 0; i < 2 && i < n.input_size(); ++i) {
        auto it = ranks.find(n.input(i));
        int r = it == ranks.end() ? -1 : it->second;
        if (r != 2 && (r >= 0 || require_known))
          c.fail(fmt::format("Gemm node '{}' (opset {}): input {} ('{}') must be a matrix whose rank the model "
                             "declares or ONNX's shape inference finds, to upgrade the node to opset 7; {}", n.name(),
                             opset, i == 0 ? "A" : "B", n.input(i),
                             r < 0 ? "its shape is unknown" : fmt::format("its rank is {}", r)));
      }
    }
}

void check_names_defined(const ::onnx::GraphProto& top, const std::set<std::string>& outer_top, const Ctx& c) {
  std::vector<std::pair<const ::onnx::GraphProto*, std::set<std::string>>> work{{&top, outer_top}};
  while (!work.empty()) {
    auto [g, known] = std::move(work.back());
    work.pop_back();
    for (const auto& v : g->input()) known.insert(v.name());
    for (const auto& t : g->initializer()) known.insert(t.name());
    for (const auto& n : g->node()) {
      for (const auto& in : n.input())
        if (!in.empty() && !known.count(in))
          c.fail(fmt::format("node '{}' ({}) reads '{}', which no graph input, initializer or earlier node defines",
                             n.name(), n.op_type(), in));
      for (const auto& a : n.attribute()) {
        if (a.has_g()) work.emplace_back(&a.g(), known);
        for (const auto& sg : a.graphs()) work.emplace_back(&sg, known);
      }
      for (const auto& out : n.output())
        if (!out.empty()) known.insert(out);
    }
    for (const auto& v : g->output())
      if (!known.count(v.name()))
        c.fail(fmt::format("graph '{}' outputs '{}', which no graph input, initializer or node defines", g->name(),
                           v.name()));
  }
}

}  // namespace

ParsedModel parse_model(const std::string& bytes, const std::string& file, const std::string& base_dir) {
  Ctx c{file, base_dir, {}, 0};
  ::onnx::ModelProto mp;
  if (bytes.empty()) c.fail("the file is empty");
  if (!mp.ParseFromString(bytes)) {
    // protobuf stops at 100 nested messages (about 33 levels of If / Loop / Scan subgraphs): a valid
    // file that parses with a deeper limit is too deeply nested, not corrupt
    ::onnx::ModelProto deeper;
    google::protobuf::io::ArrayInputStream raw(bytes.data(), static_cast<int>(bytes.size()));
    google::protobuf::io::CodedInputStream in(&raw);
    in.SetRecursionLimit(1000);  // deep enough to tell, shallow enough for the parser's own recursion
    if (deeper.ParseFromCodedStream(&in))
      c.fail("its subgraphs (If, Loop, Scan bodies) are nested deeper than protobuf's limit of 100 message levels "
             "(about 33 subgraph levels)");
    c.fail(fmt::format("not a valid ONNX protobuf ({} bytes; truncated or corrupt file?)", bytes.size()));
  }
  if (!mp.has_graph()) c.fail("the model has no graph (truncated or not an ONNX model?)");
  ParsedModel pm;
  pm.ir_version = mp.ir_version();
  pm.producer = mp.producer_name();
  if (!mp.producer_version().empty()) pm.producer += " " + mp.producer_version();
  pm.opset = -1;
  for (const auto& os : mp.opset_import())
    if (os.domain().empty() || os.domain() == "ai.onnx") pm.opset = os.version();
  if (pm.opset < 0) {
    if (mp.opset_import_size() > 0 || pm.ir_version >= 3) {
      // Only other domains (e.g. ai.onnx.preview.training): fine while no node needs the default one;
      // opset 0 then stands for "none" and those nodes are reported as unsupported ops.
      for (const auto& np : mp.graph().node())
        if (np.domain().empty() || np.domain() == "ai.onnx")
          c.fail(fmt::format("node '{}' ({}) is in the default domain, but the model imports no version of the "
                             "default (ai.onnx) opset", np.name(), np.op_type()));
      pm.opset = 0;
    } else {
      pm.opset = 1;
    }
  }
  pm.original_opset = pm.opset;
  if (pm.opset > 0 && pm.opset < kMinNativeOpset) {
    // Older models are upgraded with ONNX's own version converter (its adapters know every op's
    // changes between versions); the importer then sees the upgraded graph.
    // Several adapters (broadcasting Add/Mul, Softmax 12 -> 13) need the input shapes, which old
    // exporters did not write: ONNX's shape inference fills them in first. When the adapters up to
    // kUpgradeOpset still fail, the smallest step (to kMinNativeOpset) is tried before giving up.
    // The converter trusts its input: a graph that reads or outputs a name nothing defines crashes
    // it inside libonnx (it dereferences the missing producer), so such a model is refused here by
    // name first. (ONNX's checker is stricter than the converter needs: it refuses old models without
    // value types, which the converter and the importer take.)
    check_names_defined(mp.graph(), {}, c);
    if (pm.opset < 7) check_gemm_ranks_for_upgrade(mp.graph(), pm.opset, /*require_known=*/false, c);
    ::onnx::ModelProto typed = mp;
    if (shape_inference_is_safe(mp.graph())) {
      try {
        ::onnx::shape_inference::InferShapes(typed);
      } catch (const std::exception&) {
        typed = mp;  // inference is best effort; the converter reports what it lacks
      }
    }
    if (pm.opset < 7) check_gemm_ranks_for_upgrade(typed.graph(), pm.opset, /*require_known=*/true, c);
    std::string why;
    for (int64_t target : {kUpgradeOpset, kMinNativeOpset}) {
      try {
        ::onnx::ModelProto up = ::onnx::version_conversion::ConvertVersion(typed, static_cast<int>(target));
        mp.Swap(&up);
        why.clear();
        break;
      } catch (const std::exception& e) {
        if (why.empty()) {
          why = e.what();
          if (auto nl = why.find('\n'); nl != std::string::npos) why = why.substr(0, nl);
        }
      }
    }
    if (!why.empty())
      throw NotImplementedError(fmt::format("ONNX model '{}' uses opset {}; upgrading it to opset {} with ONNX's "
                                            "version converter failed: {}", file, pm.opset, kUpgradeOpset, why));
    pm.opset = kUpgradeOpset;
    for (const auto& os : mp.opset_import())
      if (os.domain().empty() || os.domain() == "ai.onnx") pm.opset = os.version();
  }
  if (mp.functions_size() > 0)
    throw NotImplementedError(fmt::format("ONNX model '{}': model-local functions are not supported", file));
  c.source_opset = pm.original_opset;
  pm.graph = convert_graph(mp.graph(), c, pm.opset, {}, true);
  pm.external_hash = c.external_hash;
  pm.external_files = static_cast<int64_t>(c.mappings.size());
  if (pm.graph->outputs.empty()) c.fail("the graph has no outputs");
  return pm;
}

Tensor tensor_from_proto(const ::onnx::TensorProto& tp, const std::string& file, const std::string& what) {
  Ctx c{file, {}, {}, 0};
  return convert_tensor(tp, c, what);
}

// ---- small shared helpers --------------------------------------------------------------------------------
const char* attr_type_name(Attr::Type t) {
  switch (t) {
    case Attr::Type::Float: return "float";
    case Attr::Type::Int: return "int";
    case Attr::Type::String: return "string";
    case Attr::Type::Tensor: return "tensor";
    case Attr::Type::Graph: return "graph";
    case Attr::Type::Floats: return "floats";
    case Attr::Type::Ints: return "ints";
    case Attr::Type::Strings: return "strings";
  }
  return "?";
}

std::optional<DType> dtype_from_onnx(int32_t t) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: return DType::F32;
    case ::onnx::TensorProto::UINT8: return DType::U8;
    case ::onnx::TensorProto::INT8: return DType::I8;
    case ::onnx::TensorProto::INT32: return DType::I32;
    case ::onnx::TensorProto::INT64: return DType::I64;
    case ::onnx::TensorProto::BOOL: return DType::Bool;
    case ::onnx::TensorProto::FLOAT16: return DType::F16;
    case ::onnx::TensorProto::DOUBLE: return DType::F64;
    case ::onnx::TensorProto::BFLOAT16: return DType::BF16;
    case ::onnx::TensorProto::INT16: case ::onnx::TensorProto::UINT16: return DType::I32;
    case ::onnx::TensorProto::UINT32: case ::onnx::TensorProto::UINT64: return DType::I64;
    default: return std::nullopt;
  }
}

bool is_carried_type(int32_t t) {
  return t == ::onnx::TensorProto::INT16 || t == ::onnx::TensorProto::UINT16 || t == ::onnx::TensorProto::UINT32 ||
         t == ::onnx::TensorProto::UINT64;
}

const char* onnx_type_name(int32_t t) {
  switch (t) {
    case 0: return "undefined";
    case 1: return "float";
    case 2: return "uint8";
    case 3: return "int8";
    case 4: return "uint16";
    case 5: return "int16";
    case 6: return "int32";
    case 7: return "int64";
    case 8: return "string";
    case 9: return "bool";
    case 10: return "float16";
    case 11: return "double";
    case 12: return "uint32";
    case 13: return "uint64";
    case 14: return "complex64";
    case 15: return "complex128";
    case 16: return "bfloat16";
    default: return "unknown";
  }
}

}  // namespace protean::onnx::detail
