// NumPy .npy I/O (format spec: numpy.lib.format, versions 1.0 / 2.0 / 3.0).
//
// Layout: "\x93NUMPY", major, minor, header length (u16 LE for 1.0, u32 LE for 2.0/3.0), then an ASCII
// (3.0: UTF-8) Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and ending in '\n', then the raw elements.
// load_npy accepts little-endian (or byte-order-free '|') descrs <f2 <f4 <f8 <i1 <i2 <i4 <i8 |u1 <u2 <u4
// <u8 |b1 (plus the equivalent spellings |i1 <u1 <b1 and '=' on this little-endian host; int16/uint16
// load as i32, uint32/uint64 as i64, uint64 values at or above 2^63 refused), C or Fortran
// order (Fortran files are returned C-contiguous). Every malformed input is a FormatError naming the
// file. save_npy writes version 1.0 (2.0 only when the header needs it), C order, header padded so the
// data starts at a multiple of 64 bytes; it writes a temporary file in the same directory and renames
// it over the target, so readers never see a partial file.
// bfloat16 (no NumPy dtype): stored as its uint16 bit patterns ('<u2'), as ONNX's test data does;
// save_npy writes a bf16 tensor that way and load_npy_for(path, BF16) reads '<u2' back as bf16.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <random>

#include "core/checked_size.h"
#include "core/files.h"
#include "core/npy.h"
#include "core/strided_copy.h"
#include "protean/tensor.h"

namespace protean {

namespace {

constexpr char kMagic[] = "\x93NUMPY";

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw FormatError(fmt::format("load_npy('{}'): {}", path, what));
}

struct Header {
  std::string descr;
  bool fortran = false;
  IntVec shape;
};

/// Value text of `key` in the dict literal (up to the next top-level comma or closing brace).
std::string dict_value(const std::string& path, const std::string& h, const std::string& key) {
  for (char q : {'\'', '"'}) {
    std::string k = std::string(1, q) + key + std::string(1, q);
    size_t p = h.find(k);
    if (p == std::string::npos) continue;
    p = h.find(':', p + k.size());
    if (p == std::string::npos) break;
    ++p;
    while (p < h.size() && h[p] == ' ') ++p;
    size_t e = p;
    if (e < h.size() && h[e] == '(') {
      e = h.find(')', e);
      if (e == std::string::npos) fail(path, "header: unterminated shape tuple");
      return h.substr(p, e - p + 1);
    }
    if (e < h.size() && (h[e] == '\'' || h[e] == '"')) {
      size_t c = h.find(h[e], e + 1);
      if (c == std::string::npos) fail(path, fmt::format("header: unterminated string for '{}'", key));
      return h.substr(p + 1, c - p - 1);
    }
    while (e < h.size() && h[e] != ',' && h[e] != '}') ++e;
    std::string v = h.substr(p, e - p);
    while (!v.empty() && v.back() == ' ') v.pop_back();
    return v;
  }
  fail(path, fmt::format("header has no '{}' key: {}", key, h));
}

Header parse_header(const std::string& path, const std::string& h) {
  Header r;
  if (h.find('{') == std::string::npos) fail(path, "header is not a dict literal: " + h);
  r.descr = dict_value(path, h, "descr");
  std::string f = dict_value(path, h, "fortran_order");
  if (f == "True") r.fortran = true;
  else if (f == "False") r.fortran = false;
  else fail(path, fmt::format("header: fortran_order must be True or False, got '{}'", f));
  std::string s = dict_value(path, h, "shape");
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') fail(path, fmt::format("header: bad shape '{}'", s));
  std::string body = s.substr(1, s.size() - 2);
  size_t p = 0;
  while (p < body.size()) {
    while (p < body.size() && (body[p] == ' ' || body[p] == ',')) ++p;
    if (p >= body.size()) break;
    size_t e = p;
    while (e < body.size() && body[e] >= '0' && body[e] <= '9') ++e;
    if (e == p) fail(path, fmt::format("header: bad shape '{}'", s));
    std::string num = body.substr(p, e - p);
    if (num.size() > 18) fail(path, fmt::format("header: dimension {} is too large", num));
    r.shape.push_back(std::stoll(num));  // at most 18 digits: fits
    p = e;
    while (p < body.size() && body[p] == ' ') ++p;
    if (p < body.size() && body[p] == 'L') ++p;  // Python 2 long suffix
  }
  return r;
}

/// A file dtype and the Protean dtype it loads as: NumPy's int16/uint16 widen to i32 and uint32/uint64
/// to i64 (Protean has no such dtypes; uint64 values at or above 2^63 are refused), others load as is.
/// `bf16_bits`: '<u2' holds bfloat16 bit patterns (the convention for bf16, which NumPy lacks).
struct FileType {
  DType dt = DType::F32;
  size_t src_size = 4;
  bool is_unsigned = false;
};

FileType parse_descr(const std::string& path, const std::string& d, bool bf16_bits) {
  if (d.size() < 3) fail(path, fmt::format("unsupported dtype descr '{}'", d));
  char order = d[0];
  std::string code = d.substr(1);
  bool single = code == "b1" || code == "u1" || code == "i1";
  if (order == '>' && !single)
    fail(path, fmt::format("big-endian data ('{}') is not supported; convert with arr.astype('<{}')", d, code));
  if (order != '<' && order != '|' && order != '=' && !(order == '>' && single))
    fail(path, fmt::format("unsupported dtype descr '{}'", d));
  if (order == '|' && !single) fail(path, fmt::format("unsupported dtype descr '{}'", d));
  if (code == "f2") return {DType::F16, 2};
  if (code == "f4") return {DType::F32, 4};
  if (code == "f8") return {DType::F64, 8};
  if (code == "i1") return {DType::I8, 1};
  if (code == "i2") return {DType::I32, 2};
  if (code == "i4") return {DType::I32, 4};
  if (code == "i8") return {DType::I64, 8};
  if (code == "u1") return {DType::U8, 1, true};
  if (code == "u2") return bf16_bits ? FileType{DType::BF16, 2} : FileType{DType::I32, 2, true};
  if (code == "u4") return {DType::I64, 4, true};
  if (code == "u8") return {DType::I64, 8, true};
  if (code == "b1") return {DType::Bool, 1};
  fail(path, fmt::format("unsupported dtype '{}' (supported: <f2 <f4 <f8 <i1 <i2 <i4 <i8 |u1 <u2 <u4 <u8 |b1)", d));
}

std::string descr_of(DType t) {
  switch (t) {
    case DType::Bool: return "|b1";
    case DType::U8: return "|u1";
    case DType::I8: return "|i1";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::F16: return "<f2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::BF16: return "<u2";  // the bit patterns (NumPy has no bfloat16)
  }
  return "";
}

}  // namespace

namespace {

// The .npy format after the file is open: `rd(dst, n)` reads the next n bytes (false when short),
// `file_size` is the total; `path` names the source in errors.
template <typename Read>
Tensor parse_npy(Read&& rd, const uint64_t file_size, const std::string& path, bool bf16_bits = false) {
  char pre[8];
  if (file_size < 10 || !rd(pre, 8)) fail(path, fmt::format("truncated: {} bytes is shorter than a header", file_size));
  if (std::memcmp(pre, kMagic, 6) != 0) fail(path, "bad magic (not a .npy file: expected \\x93NUMPY)");
  const int major = static_cast<unsigned char>(pre[6]);
  uint64_t hlen = 0, pos = 8;
  unsigned char lb[4] = {0, 0, 0, 0};
  if (major == 1) {
    if (!rd(reinterpret_cast<char*>(lb), 2)) fail(path, "truncated header length");
    hlen = lb[0] | (static_cast<uint64_t>(lb[1]) << 8);
    pos += 2;
  } else if (major == 2 || major == 3) {
    if (!rd(reinterpret_cast<char*>(lb), 4)) fail(path, "truncated header length");
    hlen = lb[0] | (static_cast<uint64_t>(lb[1]) << 8) | (static_cast<uint64_t>(lb[2]) << 16) |
           (static_cast<uint64_t>(lb[3]) << 24);
    pos += 4;
  } else {
    fail(path, fmt::format("unsupported format version {}.{} (supported: 1.0, 2.0, 3.0)", major,
                           static_cast<int>(static_cast<unsigned char>(pre[7]))));
  }
  if (pos + hlen > file_size)
    fail(path, fmt::format("truncated header: it declares {} bytes but the file has {} after the preamble", hlen,
                           file_size - pos));
  std::string h(hlen, '\0');
  rd(h.data(), static_cast<std::streamsize>(hlen));
  pos += hlen;
  Header hd = parse_header(path, h);
  FileType ft = parse_descr(path, hd.descr, bf16_bits);
  DType dt = ft.dt;
  // The byte count the shape claims, checked before it is compared with the file (f32[2^31, 2^31]
  // would wrap to 0 bytes and match an empty data section).
  const auto want = static_cast<uint64_t>(core::checked_nbytes(hd.shape, ft.src_size, fmt::format("load_npy('{}')", path)));
  const uint64_t have = file_size - pos;
  if (have != want)
    fail(path, fmt::format("data length {} bytes does not match shape {} of {} ({} bytes expected{})", have,
                           to_string(to_symint_vec(hd.shape)), hd.descr, want, have < want ? ", file truncated" : ""));
  // Read into a buffer with the file's layout: C order as is; Fortran order = reversed-dim strides.
  IntVec strides(hd.shape.size());
  int64_t acc = 1;
  if (hd.fortran) {
    for (size_t i = 0; i < hd.shape.size(); ++i) {
      strides[i] = acc;
      acc *= std::max<int64_t>(hd.shape[i], 1);
    }
  } else {
    for (size_t i = hd.shape.size(); i-- > 0;) {
      strides[i] = acc;
      acc *= std::max<int64_t>(hd.shape[i], 1);
    }
  }
  Tensor raw = empty_strided(hd.shape, strides, dt);
  if (ft.src_size == itemsize(dt) && !(ft.is_unsigned && ft.src_size == 8)) {  // uint64 is range-checked below
    if (want > 0 && !rd(static_cast<char*>(raw.data_ptr()), static_cast<std::streamsize>(want)))
      fail(path, "truncated data");
  } else {
    // Widened: element k of the file is element k of the storage (the strides follow the file's order).
    std::string buf(want, '\0');
    if (want > 0 && !rd(buf.data(), static_cast<std::streamsize>(want))) fail(path, "truncated data");
    const uint64_t count = want / ft.src_size;
    for (uint64_t k = 0; k < count; ++k) {
      uint64_t bits = 0;
      std::memcpy(&bits, buf.data() + k * ft.src_size, ft.src_size);
      int64_t v;
      if (ft.is_unsigned) {
        if (bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail(path, fmt::format("uint64 element {} is {}, at or above 2^63 (uint64 loads as int64)", k, bits));
        v = static_cast<int64_t>(bits);
      } else {
        v = static_cast<int16_t>(static_cast<uint16_t>(bits));  // the only widened signed type: int16
      }
      if (dt == DType::I32) static_cast<int32_t*>(raw.data_ptr())[k] = static_cast<int32_t>(v);
      else static_cast<int64_t*>(raw.data_ptr())[k] = v;
    }
  }
  if (dt == DType::Bool) {
    const uint8_t* b = static_cast<const uint8_t*>(raw.data_ptr());
    for (uint64_t i = 0; i < want; ++i)
      if (b[i] > 1) fail(path, fmt::format("bool element at byte {} has value {} (expected 0 or 1)", i, b[i]));
  }
  if (!hd.fortran || hd.shape.size() < 2) return raw;
  return core::contiguous_copy(raw);
}

}  // namespace

Tensor load_npy(const std::string& path) {
  std::error_code ec;
  // A directory opens and reads nothing; a FIFO blocks the open forever: only regular files.
  core::require_regular_file(path, ".npy file");
  std::ifstream f(path, std::ios::binary);
  if (!f)
    throw RuntimeError(fmt::format("cannot open .npy file '{}': {}", path,
                                   std::filesystem::exists(path, ec) ? "permission denied or unreadable" : "no such file"));
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  auto rd = [&f](char* dst, std::streamsize n) { return static_cast<bool>(f.read(dst, n)); };
  return parse_npy(rd, file_size, path);
}

Tensor core::load_npy_for(const std::string& path, DType want) {
  if (want != DType::BF16) return load_npy(path);
  core::require_regular_file(path, ".npy file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw RuntimeError(fmt::format("cannot open .npy file '{}'", path));
  f.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  auto rd = [&f](char* dst, std::streamsize n) { return static_cast<bool>(f.read(dst, n)); };
  return parse_npy(rd, file_size, path, /*bf16_bits=*/true);
}

Tensor core::load_npy_bytes(std::string_view bytes, const std::string& name) {
  size_t pos = 0;
  auto rd = [&](char* dst, std::streamsize n) {
    if (n < 0 || static_cast<size_t>(n) > bytes.size() - pos) return false;
    std::memcpy(dst, bytes.data() + pos, static_cast<size_t>(n));
    pos += static_cast<size_t>(n);
    return true;
  };
  return parse_npy(rd, bytes.size(), name);
}

void save_npy(const std::string& path, const Tensor& t) {
  if (!t.defined()) throw ValueError(fmt::format("save_npy('{}'): the tensor is undefined", path));
  std::string descr = descr_of(t.dtype());
  IntVec shape = t.int_sizes();
  std::string shp = "(";
  for (size_t i = 0; i < shape.size(); ++i) shp += fmt::format("{}{}", shape[i], shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  shp += ")";
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shp);
  // pad so that preamble + header (+ '\n') is a multiple of 64
  int major = 1;
  size_t pre = 10;
  size_t total = (pre + dict.size() + 1 + 63) / 64 * 64;
  if (total - pre > 65535) {
    major = 2;
    pre = 12;
    total = (pre + dict.size() + 1 + 63) / 64 * 64;
  }
  dict.append(total - pre - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string head(kMagic, 6);
  head.push_back(static_cast<char>(major));
  head.push_back('\0');
  const uint64_t hl = dict.size();
  head.push_back(static_cast<char>(hl & 0xff));
  head.push_back(static_cast<char>((hl >> 8) & 0xff));
  if (major == 2) {
    head.push_back(static_cast<char>((hl >> 16) & 0xff));
    head.push_back(static_cast<char>((hl >> 24) & 0xff));
  }
  head += dict;

  Tensor c = t.is_contiguous() ? t : core::contiguous_copy(t);
  const size_t nbytes = static_cast<size_t>(c.int_numel()) * c.itemsize();
  core::write_file_atomic(path, {head, std::string_view(static_cast<const char*>(c.data_ptr()), nbytes)}, "save_npy");
}

}  // namespace protean
