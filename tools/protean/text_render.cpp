#include "text_render.h"

// Declarations only: Debian's libstb (-lstb) carries the implementations, so no *_IMPLEMENTATION here.
#include <stb/stb_image.h>
#include <stb/stb_image_write.h>
#include <stb/stb_truetype.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

namespace protean::tools {
namespace {

struct Font {
  std::vector<unsigned char> bytes;  // stbtt_fontinfo points into this; never resized after init
  stbtt_fontinfo info{};
};

// Loads a font once per path; fonts are immutable after loading, so sharing them is safe.
std::shared_ptr<const Font> load_font(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Font>> cache;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(path); it != cache.end()) return it->second;

  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error("text_render: cannot open font '" + path +
                             "' (install fonts-dejavu-core, or set PROTEAN_FONT to a .ttf file)");
  }
  auto font = std::make_shared<Font>();
  font->bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  const int offset = font->bytes.empty() ? -1 : stbtt_GetFontOffsetForIndex(font->bytes.data(), 0);
  if (offset < 0 || !stbtt_InitFont(&font->info, font->bytes.data(), offset)) {
    throw std::runtime_error("text_render: '" + path + "' is not a TrueType font");
  }
  cache.emplace(path, font);
  return font;
}

// UTF-8 → code points; rejects malformed sequences instead of guessing.
std::vector<int> decode_utf8(std::string_view s) {
  std::vector<int> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      throw std::invalid_argument("text_render: invalid UTF-8 at byte " + std::to_string(i));
    }
    int cp = len == 1 ? c : c & (0xff >> (len + 1));
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc >> 6) != 0x2) throw std::invalid_argument("text_render: invalid UTF-8 at byte " + std::to_string(i + k));
      cp = (cp << 6) | (cc & 0x3f);
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

}  // namespace

std::string default_font_path() {
  if (const char* env = std::getenv("PROTEAN_FONT"); env != nullptr && *env != '\0') return env;
  return "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
}

Image render_text(std::string_view text, const TextRenderOptions& options) {
  if (options.height <= 0 || !(options.glyph_px > 0.0f) || options.pad_x < 0) {
    throw std::invalid_argument("text_render: height and glyph_px must be positive and pad_x non-negative");
  }
  const std::string path = options.font_path.empty() ? default_font_path() : options.font_path;
  const std::shared_ptr<const Font> font = load_font(path);
  const stbtt_fontinfo* info = &font->info;
  const std::vector<int> cps = decode_utf8(text);

  const float scale = stbtt_ScaleForPixelHeight(info, options.glyph_px);
  int ascent = 0, descent = 0, line_gap = 0;
  stbtt_GetFontVMetrics(info, &ascent, &descent, &line_gap);
  // Centre the ascender-to-descender box (glyph_px tall) vertically; the baseline sits `ascent` below its top.
  const float top = (static_cast<float>(options.height) - options.glyph_px) / 2.0f;
  const int baseline = static_cast<int>(std::lround(top + static_cast<float>(ascent) * scale));

  // Pen positions (fractional, for subpixel placement) and the total advance.
  std::vector<float> pen(cps.size());
  float x = static_cast<float>(options.pad_x);
  for (size_t i = 0; i < cps.size(); ++i) {
    pen[i] = x;
    int advance = 0, lsb = 0;
    stbtt_GetCodepointHMetrics(info, cps[i], &advance, &lsb);
    x += static_cast<float>(advance) * scale;
    if (i + 1 < cps.size()) x += static_cast<float>(stbtt_GetCodepointKernAdvance(info, cps[i], cps[i + 1])) * scale;
  }
  Image img;
  img.width = std::max(1, static_cast<int>(std::ceil(x)) + options.pad_x);
  img.height = options.height;

  // Coverage (0 = paper, 255 = ink), composited with max so overlapping glyph edges do not darken.
  std::vector<uint8_t> ink(static_cast<size_t>(img.width) * img.height, 0);
  std::vector<uint8_t> glyph;
  for (size_t i = 0; i < cps.size(); ++i) {
    const float xf = pen[i] - std::floor(pen[i]);
    const int x0 = static_cast<int>(std::floor(pen[i]));
    int bx0 = 0, by0 = 0, bx1 = 0, by1 = 0;
    stbtt_GetCodepointBitmapBoxSubpixel(info, cps[i], scale, scale, xf, 0.0f, &bx0, &by0, &bx1, &by1);
    const int gw = bx1 - bx0, gh = by1 - by0;
    if (gw <= 0 || gh <= 0) continue;  // spaces
    glyph.assign(static_cast<size_t>(gw) * gh, 0);
    stbtt_MakeCodepointBitmapSubpixel(info, glyph.data(), gw, gh, gw, scale, scale, xf, 0.0f, cps[i]);
    for (int gy = 0; gy < gh; ++gy) {
      const int py = baseline + by0 + gy;
      if (py < 0 || py >= img.height) continue;
      for (int gx = 0; gx < gw; ++gx) {
        const int px = x0 + bx0 + gx;
        if (px < 0 || px >= img.width) continue;
        uint8_t& dst = ink[static_cast<size_t>(py) * img.width + px];
        dst = std::max(dst, glyph[static_cast<size_t>(gy) * gw + gx]);
      }
    }
  }
  img.rgb.resize(ink.size() * 3);
  for (size_t p = 0; p < ink.size(); ++p) {
    const auto v = static_cast<uint8_t>(255 - ink[p]);
    img.rgb[3 * p] = img.rgb[3 * p + 1] = img.rgb[3 * p + 2] = v;
  }
  return img;
}

void write_png(const std::string& path, const Image& image) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    throw std::runtime_error("write_png: '" + path + "': image is empty or its size does not match width x height x 3");
  }
  if (!stbi_write_png(path.c_str(), image.width, image.height, 3, image.rgb.data(), image.width * 3)) {
    throw std::runtime_error("write_png: cannot write '" + path + "'");
  }
}

Image read_png(const std::string& path) {
  int w = 0, h = 0, channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &w, &h, &channels, 3);
  if (data == nullptr) {
    const char* why = stbi_failure_reason();
    throw std::runtime_error("read_png: cannot read '" + path + "': " + (why ? why : "unknown error"));
  }
  std::unique_ptr<unsigned char, void (*)(void*)> owner(data, stbi_image_free);
  Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(data, data + static_cast<size_t>(w) * h * 3);
  return img;
}

}  // namespace protean::tools
