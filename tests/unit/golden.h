// The one golden-file helper of the test suites: whole-file goldens under tests/golden/ (IR text,
// reports) and CHECK-line expectations (generated code: what must appear, in order, instead of the
// whole file, so a change elsewhere in a kernel does not rewrite every golden).
//
// Whole files: expect_golden(actual, "ir/mlp.txt") compares with tests/golden/ir/mlp.txt and prints a
// line diff; PROTEAN_UPDATE_GOLDEN=1 rewrites the file instead (check the diff before committing).
//
// CHECK files: expect_checks(actual, "cpu/softmax.checks") reads directives, one per line:
//   CHECK: text        a line containing `text` at or after the line after the previous match
//   CHECK-NEXT: text   the line right after the previous match contains `text`
//   CHECK-SAME: text   the previous match's line also contains `text` (after what matched there)
//   CHECK-NOT: text    no line between the previous match and the next match contains `text`
//   CHECK-COUNT-N: text  exactly N lines of the whole output contain `text`
// Blank lines and lines starting with `;` are comments. Leading and trailing spaces of `text` are
// ignored. A failure names the directive and its line in the CHECK file and shows the output from the
// position the search started at. CHECK files are written by hand (PROTEAN_UPDATE_GOLDEN leaves them).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace protean::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string line;
  while (std::getline(ss, line)) out.push_back(line);
  return out;
}

/// A line diff of `expected` → `actual` (LCS based): ' ' common, '-' only expected, '+' only actual.
inline std::string line_diff(const std::string& expected, const std::string& actual) {
  auto a = split_lines(expected), b = split_lines(actual);
  size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> l(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;) l[i][j] = a[i] == b[j] ? l[i + 1][j + 1] + 1 : std::max(l[i + 1][j], l[i][j + 1]);
  std::string out = "--- expected\n+++ actual\n";
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      out += "  " + a[i++] + "\n";
      ++j;
    } else if (j < m && (i == n || l[i][j + 1] >= l[i + 1][j])) {
      out += "+ " + b[j++] + "\n";
    } else {
      out += "- " + a[i++] + "\n";
    }
  }
  return out;
}

/// tests/golden/<relpath> in the source tree.
inline std::string golden_path(const std::string& relpath) { return std::string(PROTEAN_SOURCE_DIR) + "/tests/golden/" + relpath; }

inline bool update_goldens() {
  const char* u = std::getenv("PROTEAN_UPDATE_GOLDEN");
  return u && std::string(u) == "1";
}

/// Compares `actual` with tests/golden/<relpath>; PROTEAN_UPDATE_GOLDEN=1 rewrites the file instead
/// (and returns false: nothing was compared).
inline bool expect_golden(const std::string& actual, const std::string& relpath) {
  const std::string path = golden_path(relpath);
  if (update_goldens()) {
    std::ofstream(path, std::ios::binary) << actual;
    return false;
  }
  std::ifstream probe(path);
  if (!probe) {
    ADD_FAILURE() << "missing golden file " << path << " (PROTEAN_UPDATE_GOLDEN=1 creates it); actual:\n" << actual;
    return true;
  }
  const std::string expected = read_file(path);
  if (actual != expected) ADD_FAILURE() << "golden " << relpath << " differs:\n" << line_diff(expected, actual);
  return true;
}

/// "N: text" for output line i (0-based).
inline std::string fmt_line(size_t i, const std::string& s) { return std::to_string(i + 1) + ": " + s + "\n"; }

/// Checks `actual` against the CHECK directives of tests/golden/<relpath> (see the top of this file).
inline void expect_checks(const std::string& actual, const std::string& relpath) {
  const std::string path = golden_path(relpath);
  std::ifstream probe(path);
  if (!probe) {
    ADD_FAILURE() << "missing CHECK file " << path << "; actual:\n" << actual;
    return;
  }
  const std::vector<std::string> out = split_lines(actual), checks = split_lines(read_file(path));
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(' '));
    s.erase(s.find_last_not_of(" \r") + 1);
    return s;
  };
  auto show = [&](size_t from) {
    std::string r;
    for (size_t i = from; i < out.size() && i < from + 40; ++i) r += fmt_line(i, out[i]);
    return r.empty() ? std::string("(end of output)\n") : r;
  };
  size_t pos = 0;            // the search for the next CHECK starts at this line
  size_t last = SIZE_MAX;    // the line of the previous match
  size_t last_col = 0;       // where the previous match ended on that line
  std::vector<std::pair<size_t, std::string>> nots;  // pending CHECK-NOTs (check file line, text)
  auto settle_nots = [&](size_t upto) {
    for (const auto& [cl, text] : nots)
      for (size_t i = pos; i < upto && i < out.size(); ++i)
        if (out[i].find(text) != std::string::npos)
          ADD_FAILURE() << relpath << ":" << cl << ": CHECK-NOT: " << text << " found at output line " << i + 1 << ":\n" << out[i];
    nots.clear();
  };
  for (size_t cl = 0; cl < checks.size(); ++cl) {
    const std::string line = trim(checks[cl]);
    if (line.empty() || line[0] == ';') continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) {
      ADD_FAILURE() << relpath << ":" << cl + 1 << ": not a directive: " << line;
      return;
    }
    const std::string dir = line.substr(0, colon), text = trim(line.substr(colon + 1));
    const std::string where = relpath + ":" + std::to_string(cl + 1) + ": " + line;
    if (dir == "CHECK") {
      size_t i = pos;
      while (i < out.size() && out[i].find(text) == std::string::npos) ++i;
      if (i == out.size()) {
        ADD_FAILURE() << where << "\nnot found in the output from line " << pos + 1 << ":\n" << show(pos);
        return;
      }
      settle_nots(i);
      last = i;
      last_col = out[i].find(text) + text.size();
      pos = i + 1;
    } else if (dir == "CHECK-NEXT") {
      if (last == SIZE_MAX || last + 1 >= out.size() || out[last + 1].find(text) == std::string::npos) {
        ADD_FAILURE() << where << "\nthe next line is not it:\n" << show(last == SIZE_MAX ? 0 : last + 1);
        return;
      }
      settle_nots(last + 1);
      ++last;
      last_col = out[last].find(text) + text.size();
      pos = last + 1;
    } else if (dir == "CHECK-SAME") {
      if (last == SIZE_MAX || out[last].find(text, last_col) == std::string::npos) {
        ADD_FAILURE() << where << "\nnot on the matched line:\n" << (last == SIZE_MAX ? std::string() : out[last]);
        return;
      }
      last_col = out[last].find(text, last_col) + text.size();
    } else if (dir == "CHECK-NOT") {
      nots.emplace_back(cl + 1, text);
    } else if (dir.rfind("CHECK-COUNT-", 0) == 0) {
      const long want = std::strtol(dir.c_str() + 12, nullptr, 10);
      long n = 0;
      for (const std::string& o : out) n += o.find(text) != std::string::npos;
      if (n != want) ADD_FAILURE() << where << "\nfound on " << n << " lines";
    } else {
      ADD_FAILURE() << relpath << ":" << cl + 1 << ": unknown directive " << dir;
      return;
    }
  }
  settle_nots(out.size());
}

}  // namespace protean::testing
