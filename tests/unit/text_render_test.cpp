#include "protean/text_render.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace pt = protean::tools;
namespace fs = std::filesystem;

namespace {

// Pixels darker than mid-grey in any channel.
int count_ink(const pt::Image& img) {
  int n = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      if (img.at(x, y, 0) < 128) ++n;
  return n;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("protean_text_render_test_" + std::to_string(::getpid()) + "_" + name);
}

}  // namespace

TEST(TextRender, RendersHelloWithInkAndMargins) {
  const pt::Image img = pt::render_text("Hello 123");
  EXPECT_EQ(img.height, 48);
  EXPECT_GT(img.width, 100);  // nine glyphs at ~32 px
  EXPECT_LT(img.width, 400);
  ASSERT_EQ(img.rgb.size(), static_cast<size_t>(img.width) * img.height * 3);
  const int ink = count_ink(img);
  EXPECT_GT(ink, 200);
  EXPECT_LT(ink, img.width * img.height / 2);  // mostly white paper
  // Grey levels only (R == G == B), and the margins stay white.
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) {
      ASSERT_EQ(img.at(x, y, 0), img.at(x, y, 1));
      ASSERT_EQ(img.at(x, y, 0), img.at(x, y, 2));
    }
    EXPECT_EQ(img.at(0, y, 0), 255) << "row " << y;
    EXPECT_EQ(img.at(img.width - 1, y, 0), 255) << "row " << y;
  }
  // Top and bottom rows are blank: the glyph box is centred with ~8 px to spare.
  for (int x = 0; x < img.width; ++x) {
    EXPECT_EQ(img.at(x, 0, 0), 255);
    EXPECT_EQ(img.at(x, img.height - 1, 0), 255);
  }
}

TEST(TextRender, WidthGrowsWithTextLength) {
  const int w1 = pt::render_text("Hello").width;
  const int w2 = pt::render_text("Hello 123").width;
  const int w3 = pt::render_text("Hello 123 Hello 123").width;
  EXPECT_LT(w1, w2);
  EXPECT_LT(w2, w3);
  EXPECT_NEAR(w3 - 16, 2 * (w2 - 16) + pt::render_text(" ").width - 16, 3);  // advances add up
  EXPECT_EQ(pt::render_text("").width, 16);  // just the margins
  EXPECT_EQ(count_ink(pt::render_text("   ")), 0);
}

TEST(TextRender, HonoursHeightAndGlyphSize) {
  pt::TextRenderOptions opt;
  opt.height = 32;
  opt.glyph_px = 24;
  const pt::Image small = pt::render_text("Hello 123", opt);
  EXPECT_EQ(small.height, 32);
  EXPECT_LT(small.width, pt::render_text("Hello 123").width);
  opt.height = 0;
  EXPECT_THROW(pt::render_text("x", opt), std::invalid_argument);
}

TEST(TextRender, IsDeterministic) {
  EXPECT_EQ(pt::render_text("Hello 123").rgb, pt::render_text("Hello 123").rgb);
}

TEST(TextRender, PngRoundTripIsBitExact) {
  const pt::Image img = pt::render_text("Hello 123");
  const fs::path p = temp_path("hello.png");
  pt::write_png(p.string(), img);
  const pt::Image back = pt::read_png(p.string());
  fs::remove(p);
  EXPECT_EQ(back.width, img.width);
  EXPECT_EQ(back.height, img.height);
  EXPECT_EQ(back.rgb, img.rgb);
}

TEST(TextRender, MissingFontIsAClearError) {
  pt::TextRenderOptions opt;
  opt.font_path = "/nonexistent/NoSuchFont.ttf";
  try {
    pt::render_text("x", opt);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/NoSuchFont.ttf"), std::string::npos) << e.what();
  }
}

TEST(TextRender, UnreadablePngIsAClearError) {
  const fs::path missing = temp_path("missing.png");
  try {
    pt::read_png(missing.string());
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
  const fs::path junk = temp_path("junk.png");
  std::ofstream(junk) << "not a png";
  EXPECT_THROW(pt::read_png(junk.string()), std::runtime_error);
  fs::remove(junk);
}

TEST(TextRender, InvalidUtf8IsRejected) {
  EXPECT_THROW(pt::render_text("bad \xff byte"), std::invalid_argument);
  EXPECT_GT(pt::render_text("caf\xc3\xa9").width, pt::render_text("caf").width);  // é is one glyph
}
