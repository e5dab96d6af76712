// Regional compilation benchmark (docs/regions.md): a transformer-like C++ Module (pre-LayerNorm
// blocks: fused qkv linear, scaled_dot_product_attention, output projection, GELU MLP; the model of
// tests/scenario/region_model.h) with 12 and 24 blocks, on the cpu backend (synchronous compiles).
// Measured in one run, each cold compile in a fresh artifact cache directory with the in-memory tier
// cleared (so the C++ compiler runs):
//   block        compile(one Block) and its first call — the cost of one block
//   regional/N   compile_regions(model, {"Block"}) with N blocks, first call
//   full/N       compile(model) with N blocks (every block inlined), first call; kernel dedup on
//   full_nodedup/12  the same with PROTEAN_CPU_KERNEL_DEDUP=0 (each block's kernels built again)
// then steady latency (median and worst of timed calls after warm-up) of regional vs full for the
// same model and input. Every result is checked against eager (max abs difference).
//
//   build/regions_bench [--reps R] [--calls C] [--out FILE]
//
// Prints the JSON (machine, commit, load, medians and worst cases, ratios) and writes it to FILE.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../tests/scenario/region_model.h"
#include "cache/kernel_cache.h"
#include "protean/protean.h"

namespace pt = protean;
using pt::Tensor;
using pt::scenario::Block;
using pt::scenario::Model;

namespace {

constexpr int64_t kDim = 128, kHeads = 4, kBatch = 4, kSeq = 32;

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Series {
  std::vector<double> v;
  double median() const {
    std::vector<double> s = v;
    std::sort(s.begin(), s.end());
    return s.empty() ? 0 : s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  }
  double worst() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
};

std::string g_cache_root;
int g_fresh = 0;

/// A fresh, empty artifact cache (disk directory and memory tier) and no frames.
void cold() {
  pt::reset();
  pt::cache::clear_memory_cache();
  std::string dir = fmt::format("{}/c{}", g_cache_root, g_fresh++);
  std::filesystem::create_directories(dir);
  setenv("PROTEAN_CACHE_DIR", dir.c_str(), 1);
}

double max_diff(const Tensor& a, const Tensor& b) { return pt::max_abs_diff(a, b); }

struct Cold {
  double seconds;
  double err;
  int64_t region_compiles;
};

template <class F>
Cold time_first_call(F& f, const Tensor& x, const Tensor& want) {
  double t0 = now_s();
  Tensor y = f(x);
  double t = now_s() - t0;
  return {t, max_diff(y, want), pt::stats().region_compiles};
}

template <class F>
Series steady(F& f, const Tensor& x, int calls) {
  for (int i = 0; i < 5; ++i) f(x);
  Series s;
  for (int i = 0; i < calls; ++i) {
    double t0 = now_s();
    Tensor y = f(x);
    s.v.push_back(now_s() - t0);
  }
  return s;
}

std::string sh(const char* cmd) {
  std::string r;
  if (FILE* p = popen(cmd, "r")) {
    char buf[256];
    while (fgets(buf, sizeof buf, p)) r += buf;
    pclose(p);
  }
  while (!r.empty() && (r.back() == '\n' || r.back() == ' ')) r.pop_back();
  return r;
}

std::string json_series(const Series& s) {
  std::string vals;
  for (double x : s.v) vals += fmt::format("{}{:.6f}", vals.empty() ? "" : ", ", x);
  return fmt::format("{{\"median_s\": {:.6f}, \"worst_s\": {:.6f}, \"n\": {}, \"values_s\": [{}]}}", s.median(), s.worst(),
                     s.v.size(), vals);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, calls = 30;
  std::string out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--calls" && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out = argv[++i];
    else {
      std::fprintf(stderr, "usage: regions_bench [--reps R] [--calls C] [--out FILE]\n");
      return 2;
    }
  }
  char tmpl[] = "/tmp/protean_regions_bench_XXXXXX";
  g_cache_root = mkdtemp(tmpl);
  const pt::CompileOptions cpu{.backend = "cpu"};
  pt::manual_seed(1);
  Tensor x = pt::randn({kBatch, kSeq, kDim});
  double worst_err = 0;

  // ---- one block ----
  Series block;
  for (int r = 0; r < reps; ++r) {
    cold();
    pt::manual_seed(2);
    auto b = std::make_shared<Block>(kDim, kHeads);
    Tensor want = b->forward(x);
    auto f = pt::compile(b, {.name = "block", .backend = "cpu"});
    Cold c = time_first_call(f, x, want);
    block.v.push_back(c.seconds);
    worst_err = std::max(worst_err, c.err);
  }
  std::fprintf(stderr, "block: median %.3f s\n", block.median());

  struct Row {
    std::string name;
    int blocks;
    Series cold, steady;
    int64_t region_compiles = 0;
  };
  std::vector<Row> rows;
  for (int n : {12, 24}) {
    pt::manual_seed(3);
    auto m = std::make_shared<Model>(n, kDim, kHeads);
    Tensor want = m->forward(x);
    for (const char* mode : {"regional", "full", "full_nodedup"}) {
      if (std::string(mode) == "full_nodedup" && n != 12) continue;
      Row row{mode, n, {}, {}};
      if (std::string(mode) == "full_nodedup") setenv("PROTEAN_CPU_KERNEL_DEDUP", "0", 1);
      for (int r = 0; r < (std::string(mode) == "full_nodedup" ? 1 : reps); ++r) {
        cold();
        if (std::string(mode) == "regional") {
          auto f = pt::compile_regions(m, {.types = {"Block"}}, {.name = "regional", .backend = "cpu"});
          Cold c = time_first_call(f, x, want);
          row.cold.v.push_back(c.seconds);
          row.region_compiles = c.region_compiles;
          worst_err = std::max(worst_err, c.err);
          if (r == reps - 1) row.steady = steady(f, x, calls);
        } else {
          auto f = pt::compile(m, {.name = "full", .backend = "cpu"});
          Cold c = time_first_call(f, x, want);
          row.cold.v.push_back(c.seconds);
          worst_err = std::max(worst_err, c.err);
          if (r == reps - 1 && std::string(mode) == "full") row.steady = steady(f, x, calls);
        }
      }
      unsetenv("PROTEAN_CPU_KERNEL_DEDUP");
      std::fprintf(stderr, "%s/%d: cold median %.3f s, steady median %.3f ms\n", mode, n, row.cold.median(),
                   row.steady.median() * 1e3);
      rows.push_back(std::move(row));
    }
  }
  (void)cpu;

  auto find = [&](const std::string& name, int n) -> const Row& {
    for (const Row& r : rows)
      if (r.name == name && r.blocks == n) return r;
    return rows.front();
  };
  std::string j = "{\n";
  j += fmt::format("  \"benchmark\": \"regions\",\n  \"date\": \"{}\",\n  \"commit\": \"{}\",\n",
                   sh("date -u +%Y-%m-%dT%H:%M:%SZ"), sh("git rev-parse --short HEAD 2>/dev/null"));
  j += fmt::format("  \"machine\": \"{} ({} cores)\",\n  \"load\": \"{}\",\n",
                   sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'"), sh("nproc"),
                   sh("cut -d' ' -f1-3 /proc/loadavg"));
  j += fmt::format("  \"model\": {{\"dim\": {}, \"heads\": {}, \"batch\": {}, \"seq\": {}, \"backend\": \"cpu\"}},\n", kDim,
                   kHeads, kBatch, kSeq);
  j += fmt::format("  \"max_abs_err_vs_eager\": {:.3g},\n", worst_err);
  j += fmt::format("  \"block_cold\": {},\n  \"runs\": [\n", json_series(block));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    j += fmt::format("    {{\"mode\": \"{}\", \"blocks\": {}, \"region_compiles\": {}, \"cold\": {}, \"steady\": {}}}{}\n", r.name,
                     r.blocks, r.region_compiles, json_series(r.cold), r.steady.v.empty() ? "null" : json_series(r.steady),
                     i + 1 < rows.size() ? "," : "");
  }
  j += "  ],\n  \"ratios\": {\n";
  const Row &r12 = find("regional", 12), &r24 = find("regional", 24), &f12 = find("full", 12), &f24 = find("full", 24),
            &n12 = find("full_nodedup", 12);
  j += fmt::format("    \"regional12_cold_over_block\": {:.3f},\n", r12.cold.median() / block.median());
  j += fmt::format("    \"regional24_cold_over_block\": {:.3f},\n", r24.cold.median() / block.median());
  j += fmt::format("    \"regional24_over_regional12_cold\": {:.3f},\n", r24.cold.median() / r12.cold.median());
  j += fmt::format("    \"full12_cold_over_regional12\": {:.3f},\n", f12.cold.median() / r12.cold.median());
  j += fmt::format("    \"full24_cold_over_regional24\": {:.3f},\n", f24.cold.median() / r24.cold.median());
  j += fmt::format("    \"full12_nodedup_cold_over_full12\": {:.3f},\n", n12.cold.median() / f12.cold.median());
  j += fmt::format("    \"steady_full12_over_regional12\": {:.3f},\n", f12.steady.median() / r12.steady.median());
  j += fmt::format("    \"steady_full24_over_regional24\": {:.3f}\n", f24.steady.median() / r24.steady.median());
  j += "  }\n}\n";
  std::fputs(j.c_str(), stdout);
  if (!out.empty()) std::ofstream(out) << j;
  std::filesystem::remove_all(g_cache_root);
  return worst_err > 1e-3 ? 1 : 0;
}
