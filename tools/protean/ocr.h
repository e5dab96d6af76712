// PP-OCR pre- and post-processing for `protean run --preprocess` and `protean demo`.
// Follows PaddleOCR's inference pipeline (tools/infer/predict_rec.py, predict_det.py):
//  * rec: resize to height 48 keeping the aspect ratio (width = ceil(48 · w / h)), scale to [-1, 1]
//    with (x / 255 - 0.5) / 0.5, CHW, batch dim → f32 [1, 3, 48, W].
//  * det: resize so both sides are multiples of 32 (longest side limited to `limit_side`), normalize
//    with ImageNet mean (0.485, 0.456, 0.406) / std (0.229, 0.224, 0.225) → f32 [1, 3, H, W].
//  * CTC greedy decoding: argmax per time step, merge repeats, drop blank (class 0); class i in
//    1..N maps to line i of ppocr_keys_v1.txt, class N+1 is a space.
#pragma once

#include <string>
#include <vector>

#include "protean/tensor.h"
#include "protean/text_render.h"

namespace protean::tools {

/// Bilinear resize of an RGB image (half-pixel centres).
Image resize_image(const Image& img, int width, int height);
/// f32 [1, 3, 48, W] for PP-OCR rec.
Tensor preprocess_rec(const Image& img, int height = 48);
/// f32 [1, 3, H, W] for PP-OCR det, H and W multiples of 32.
Tensor preprocess_det(const Image& img, int limit_side = 960);

/// Loads the character list (one entry per line; the file has no final newline).
/// Throws protean::FormatError naming the file when it is missing or empty.
std::vector<std::string> load_ocr_keys(const std::string& path);

struct CtcResult {
  std::string text;
  double mean_confidence = 0;  // mean max-probability over the kept characters
};
/// Greedy CTC decoding of probabilities [T, C] (or [1, T, C]) with blank = 0.
CtcResult ctc_greedy_decode(const Tensor& probs, const std::vector<std::string>& keys);

}  // namespace protean::tools
