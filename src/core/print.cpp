// PyTorch-style tensor printing (the rules of torch._tensor_str with default print options:
// precision 4, threshold 1000, edgeitems 3, linewidth 80).
//
//  * One formatter for the whole tensor, so every element has the same width (right-aligned).
//  * Floating dtypes: the mode is chosen from the finite non-zero values (of the summarized view when
//    summarizing):
//      - all integral    → "1.", "-2." (scientific "1.0000e+09" when max/min > 1000 or max > 1e8)
//      - otherwise       → "0.1234" (scientific "1.2346e-05" when max/min > 1000, max > 1e8 or min < 1e-4)
//    nan / inf print as "nan", "inf", "-inf".
//  * Integer dtypes print as integers, bool as True / False.
//  * More than 1000 elements: each dim shows its first and last 3 entries with "..." between.
//  * 1-D rows wrap at 80 columns; the dims of an N-d tensor are separated by "," and N-1 newlines.
//  * Suffixes: ", dtype=torch.X" unless the dtype is float32, int64 or bool (PyTorch's defaults);
//    empty tensors print "tensor([])" plus ", size=(0, 3)" when not 1-D and always the dtype unless
//    float32 (no element tells the reader the type).
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <sstream>

#include "core/host_read.h"
#include "core/strided_copy.h"
#include "protean/tensor.h"

namespace protean {

namespace {

constexpr int kPrecision = 4;
constexpr int64_t kThreshold = 1000;
constexpr int64_t kEdge = 3;
constexpr int64_t kLineWidth = 80;

struct Formatter {
  bool floating = false, is_bool = false, int_mode = true, sci = false;
  size_t width = 1;

  std::string raw(double v) const {
    if (is_bool) return v != 0 ? "True" : "False";
    if (!floating) return fmt::format("{}", static_cast<int64_t>(v));
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (sci) return fmt::format("{:.{}e}", v, kPrecision);
    if (int_mode) return fmt::format("{:.0f}.", v);
    return fmt::format("{:.{}f}", v, kPrecision);
  }
  std::string operator()(double v) const { return pad(raw(v)); }
  /// Integer dtypes format from the exact int64 value (doubles lose digits above 2^53).
  std::string operator()(int64_t v) const { return pad(is_bool ? raw(static_cast<double>(v)) : fmt::format("{}", v)); }
  std::string pad(std::string s) const {
    if (s.size() < width) s.insert(0, width - s.size(), ' ');
    return s;
  }
};

Formatter make_formatter(DType dt, const std::vector<double>& vals, const std::vector<int64_t>& ivals) {
  Formatter f;
  f.floating = is_floating(dt);
  f.is_bool = dt == DType::Bool;
  if (!f.floating) {
    for (int64_t v : ivals) f.width = std::max(f.width, f(v).size());
    return f;
  }
  std::vector<double> nz;
  for (double v : vals)
    if (std::isfinite(v) && v != 0) nz.push_back(v);
  if (nz.empty()) return f;  // only zeros / nan / inf: integral mode, no padding ("0.", "nan")
  double mn = std::abs(nz[0]), mx = mn;
  for (double v : nz) {
    mn = std::min(mn, std::abs(v));
    mx = std::max(mx, std::abs(v));
    if (v != std::ceil(v)) f.int_mode = false;
  }
  if (f.int_mode) {
    if (mx / mn > 1000.0 || mx > 1e8) f.sci = true;
  } else if (mx / mn > 1000.0 || mx > 1e8 || mn < 1e-4) {
    f.sci = true;
  }
  // Only finite non-zero values set the width (zeros are never wider; nan/inf may stick out, as in
  // PyTorch: tensor([1., -inf])).
  for (double v : nz) f.width = std::max(f.width, f.raw(v).size());
  return f;
}

/// Indices shown along a dim of `size` (all, or the first and last kEdge with -1 marking "...").
IntVec shown(int64_t size, bool summarize) {
  IntVec r;
  if (summarize && size > 2 * kEdge) {
    for (int64_t i = 0; i < kEdge; ++i) r.push_back(i);
    r.push_back(-1);
    for (int64_t i = size - kEdge; i < size; ++i) r.push_back(i);
  } else {
    for (int64_t i = 0; i < size; ++i) r.push_back(i);
  }
  return r;
}

struct Printer {
  const std::vector<double>& v;     // row-major values (floating dtypes)
  const std::vector<int64_t>& iv;   // row-major values (integer and bool dtypes)
  IntVec sizes, cstrides;
  bool summarize;
  const Formatter& fmt_;

  std::string rec(size_t d, int64_t base, int64_t indent) const {
    IntVec idx = shown(sizes[d], summarize);
    if (d + 1 == sizes.size()) {
      std::vector<std::string> items;
      for (int64_t i : idx) {
        size_t k = static_cast<size_t>(base + i * cstrides[d]);
        items.push_back(i < 0 ? std::string(" ...") : fmt_.floating ? fmt_(v[k]) : fmt_(iv[k]));
      }
      int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / static_cast<int64_t>(fmt_.width + 2));
      std::string out = "[";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += (static_cast<int64_t>(k) % per_line == 0) ? ",\n" + std::string(static_cast<size_t>(indent + 1), ' ') : ", ";
        out += items[k];
      }
      return out + "]";
    }
    std::string sep = "," + std::string(sizes.size() - d - 1, '\n') + std::string(static_cast<size_t>(indent + 1), ' ');
    std::string out = "[";
    bool first = true;
    for (int64_t i : idx) {
      if (!first) out += sep;
      first = false;
      out += i < 0 ? std::string("...") : rec(d + 1, base + i * cstrides[d], indent + 1);
    }
    return out + "]";
  }
};

bool default_dtype(DType t) { return t == DType::F32 || t == DType::I64 || t == DType::Bool; }

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  if (is_fake())
    if (auto* h = core::current_host_read_hook()) h->on_host_read(*this, "str()");  // may materialize it
  if (is_fake()) return fmt::format("FakeTensor(size={}, dtype={})", to_string(sizes()), torch_name(dtype()));
  IntVec sz = int_sizes();
  int64_t n = int_numel();
  std::string out = "tensor(";
  std::vector<std::string> suffixes;
  if (n == 0) {
    out += "[]";
    if (sz.size() != 1) {
      std::string s = "size=(";
      for (size_t i = 0; i < sz.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", sz[i]);
      suffixes.push_back(s + ")");
    }
    if (dtype() != DType::F32) suffixes.push_back(fmt::format("dtype={}", torch_name(dtype())));
  } else {
    bool summarize = n > kThreshold;
    // Values as double in row-major order; when summarizing, gather only the shown entries for the
    // formatter (as PyTorch does) but keep the full vector for indexing.
    const bool fl = is_floating(dtype());
    std::vector<double> vals;
    std::vector<int64_t> ivals;
    if (fl) vals = to_vector<double>();
    else ivals = to_vector<int64_t>();
    IntVec cst(sz.size());
    int64_t acc = 1;
    for (size_t i = sz.size(); i-- > 0;) {
      cst[i] = acc;
      acc *= sz[i];
    }
    std::vector<double> sample;
    std::vector<int64_t> isample;
    if (!summarize) {
      sample = vals;
      isample = ivals;
    } else {
      std::function<void(size_t, int64_t)> collect = [&](size_t d, int64_t base) {
        if (d == sz.size()) {
          if (fl) sample.push_back(vals[static_cast<size_t>(base)]);
          else isample.push_back(ivals[static_cast<size_t>(base)]);
          return;
        }
        for (int64_t i : shown(sz[d], true))
          if (i >= 0) collect(d + 1, base + i * cst[d]);
      };
      collect(0, 0);
    }
    Formatter f = make_formatter(dtype(), sample, isample);
    if (sz.empty()) {
      out += fl ? f(vals[0]) : f(ivals[0]);
    } else {
      Printer p{vals, ivals, sz, cst, summarize, f};
      out += p.rec(0, 0, 7);
    }
    if (!default_dtype(dtype())) suffixes.push_back(fmt::format("dtype={}", torch_name(dtype())));
  }
  if (device().type != DeviceType::CPU) suffixes.insert(suffixes.begin(), fmt::format("device='{}'", device().str()));
  for (const auto& s : suffixes) out += ", " + s;
  return out + ")";
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace protean
