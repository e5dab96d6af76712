#include "protean/ocr.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "protean/error.h"

namespace protean::tools {

Image resize_image(const Image& img, int width, int height) {
  if (width <= 0 || height <= 0 || img.width <= 0 || img.height <= 0)
    throw ValueError(fmt::format("resize_image: bad sizes {}x{} -> {}x{}", img.width, img.height, width, height));
  Image out;
  out.width = width;
  out.height = height;
  out.rgb.resize(static_cast<size_t>(width) * height * 3);
  double sx = static_cast<double>(img.width) / width, sy = static_cast<double>(img.height) / height;
  for (int y = 0; y < height; ++y) {
    double fy = std::clamp((y + 0.5) * sy - 0.5, 0.0, img.height - 1.0);
    int y0 = static_cast<int>(fy), y1 = std::min(y0 + 1, img.height - 1);
    double wy = fy - y0;
    for (int x = 0; x < width; ++x) {
      double fx = std::clamp((x + 0.5) * sx - 0.5, 0.0, img.width - 1.0);
      int x0 = static_cast<int>(fx), x1 = std::min(x0 + 1, img.width - 1);
      double wx = fx - x0;
      for (int c = 0; c < 3; ++c) {
        double v = (1 - wy) * ((1 - wx) * img.at(x0, y0, c) + wx * img.at(x1, y0, c)) +
                   wy * ((1 - wx) * img.at(x0, y1, c) + wx * img.at(x1, y1, c));
        out.rgb[(static_cast<size_t>(y) * width + x) * 3 + c] = static_cast<uint8_t>(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

Tensor preprocess_rec(const Image& img, int height) {
  int w = static_cast<int>(std::ceil(static_cast<double>(height) * img.width / img.height));
  w = std::max(w, 1);
  Image r = resize_image(img, w, height);
  Tensor t = empty({1, 3, height, w}, DType::F32);
  float* p = t.data_ptr<float>();
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < w; ++x)
        p[(static_cast<size_t>(c) * height + y) * w + x] = (r.at(x, y, c) / 255.f - 0.5f) / 0.5f;
  return t;
}

Tensor preprocess_det(const Image& img, int limit_side) {
  double ratio = 1.0;
  int longest = std::max(img.width, img.height);
  if (longest > limit_side) ratio = static_cast<double>(limit_side) / longest;
  auto round32 = [](double v) { return std::max(32, static_cast<int>(std::lround(v / 32.0)) * 32); };
  int h = round32(img.height * ratio), w = round32(img.width * ratio);
  Image r = resize_image(img, w, h);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
  Tensor t = empty({1, 3, h, w}, DType::F32);
  float* p = t.data_ptr<float>();
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        p[(static_cast<size_t>(c) * h + y) * w + x] = (r.at(x, y, c) / 255.f - mean[c]) / stdv[c];
  return t;
}

std::vector<std::string> load_ocr_keys(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw FormatError(fmt::format("cannot read the OCR character list '{}' (run scripts/fetch_models.sh)", path));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    keys.push_back(line);
  }
  if (keys.empty()) throw FormatError(fmt::format("the OCR character list '{}' is empty", path));
  return keys;
}

CtcResult ctc_greedy_decode(const Tensor& probs_in, const std::vector<std::string>& keys) {
  Tensor probs = probs_in;
  if (probs.dim() == 3) {
    if (probs.size(0).hint() != 1) throw ShapeError("ctc_greedy_decode: expected batch 1, got " + to_string(probs.sizes()));
    probs = probs.select(0, 0);
  }
  if (probs.dim() != 2) throw ShapeError("ctc_greedy_decode: expected [T, C] probabilities, got " + to_string(probs.sizes()));
  std::vector<float> v = probs.to_vector<float>();
  int64_t T = probs.size(0).hint(), C = probs.size(1).hint();
  CtcResult r;
  int64_t prev = -1, kept = 0;
  double conf = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* row = v.data() + t * C;
    int64_t best = std::max_element(row, row + C) - row;
    if (best != 0 && best != prev) {
      if (best >= 1 && best <= static_cast<int64_t>(keys.size())) r.text += keys[static_cast<size_t>(best - 1)];
      else r.text += " ";
      conf += row[best];
      ++kept;
    }
    prev = best;
  }
  // Trim the spurious spaces a white margin produces at either end.
  auto b = r.text.find_first_not_of(' '), e = r.text.find_last_not_of(' ');
  r.text = b == std::string::npos ? "" : r.text.substr(b, e - b + 1);
  r.mean_confidence = kept ? conf / static_cast<double>(kept) : 0.0;
  return r;
}

}  // namespace protean::tools
