// Renders a line of text to an RGB image (black on white) with a TrueType font, and reads/writes PNGs.
// Used by `protean demo` to make text-line images for PP-OCR recognition without committing binaries,
// and by tests that need a known input image. Rasterization: stb_truetype; PNG: stb_image(_write);
// both from Debian's libstb-dev (link `stb`, which carries the implementations).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace protean::tools {

// An 8-bit RGB image, rows top to bottom, pixels left to right, 3 bytes (R, G, B) per pixel, no row
// padding: rgb.size() == width * height * 3.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;

  uint8_t at(int x, int y, int channel) const { return rgb[(static_cast<size_t>(y) * width + x) * 3 + channel]; }
};

// Debian's DejaVu Sans (package fonts-dejavu-core), unless PROTEAN_FONT names another .ttf.
std::string default_font_path();

struct TextRenderOptions {
  int height = 48;           // image height in pixels
  float glyph_px = 32.0f;    // font size: ascender-to-descender height in pixels
  int pad_x = 8;             // white margin left and right, in pixels
  std::string font_path;     // empty: default_font_path()
};

// Renders `text` (UTF-8; code points the font lacks draw as its .notdef box) on one line, vertically
// centred, black on white. The width is the text's advance plus 2 * pad_x (at least 1 pixel), so it
// grows with the text; the height is options.height. Anti-aliased; the same inputs give the same bytes.
// Throws std::runtime_error naming the path if the font is missing or not a TrueType font, and
// std::invalid_argument for a non-positive height/glyph size or invalid UTF-8.
Image render_text(std::string_view text, const TextRenderOptions& options = {});

// Writes `image` as an 8-bit RGB PNG. Throws std::runtime_error naming the path on failure.
void write_png(const std::string& path, const Image& image);

// Reads any PNG (or other format stb_image reads) and converts it to 8-bit RGB.
// Throws std::runtime_error naming the path and the decoder's reason if it cannot.
Image read_png(const std::string& path);

}  // namespace protean::tools
