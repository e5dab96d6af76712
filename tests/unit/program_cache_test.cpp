// The program cache (cache/program_cache.h, backend/cpu/program_plan.h): a second compile of the same
// post-pass graph takes the cpu backend's plan from the cache instead of lowering, scheduling and
// generating code, and runs the same; other weights are another key; corrupt, truncated, foreign
// and undecodable entries are reported and rebuilt, never trusted; bundles carry plans; the plan
// codec keeps every extern attribute (symbolic ones included) and rejects every truncation.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sys/stat.h>
#include <sstream>

#include "backend/cpu/codegen.h"
#include "backend/cpu/pipeline.h"
#include "backend/cpu/program_plan.h"
#include "backend/interp/interp.h"
#include "cache/kernel_cache.h"
#include "cache/program_cache.h"
#include "ir/sym_util.h"
#include "sym/printer.h"
#include "ir_test_util.h"
#include "observe/log.h"
#include "protean/cache.h"
#include "cache/bundle.h"
#include "protean/ops.h"

namespace protean::backend::cpu {
namespace {

namespace fs = std::filesystem;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;

/// A fresh cache directory for the test's scope (the previous PROTEAN_CACHE_DIR restored after).
class ScratchCache {
 public:
  explicit ScratchCache(const std::string& name) {
    if (const char* p = std::getenv("PROTEAN_CACHE_DIR")) prev_ = p;
    dir_ = fmt::format("/tmp/protean-progcache-{}-{}", name, getpid());
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_);
    use();
  }
  ~ScratchCache() {
    if (prev_) setenv("PROTEAN_CACHE_DIR", prev_->c_str(), 1);
    else unsetenv("PROTEAN_CACHE_DIR");
    cache::clear_memory_cache();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  void use() const {
    setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
    cache::clear_memory_cache();
    cache::reset_program_cache_stats();
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::optional<std::string> prev_;
};

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void write_file(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

/// conv (constant weights, bias) + relu → softmax over a dynamic batch: externs with attributes and
/// post-ops, constants, and generated kernels.
struct Sample {
  std::shared_ptr<const ir::Graph> graph;
  std::vector<sym::Expr> syms;
};
Sample sample(float salt) {
  GraphBuilder b("progcache");
  SymInt s0 = b.symbol("x.size()[0]", 2);
  ValueId x = b.input("x", {s0, 3, 8, 8});
  Tensor w = full({4, 3, 3, 3}, salt);
  ValueId k = b.constant(w.add(randn({4, 3, 3, 3}).mul(scalar_tensor(0.1))));
  ValueId bias = b.constant(full({4}, -0.5f * salt));
  ValueId cv = b.call(OpKind::conv2d, {x, k, bias},
                      {{"stride", SymIntVec{1, 1}}, {"padding", SymIntVec{1, 1}}, {"dilation", SymIntVec{1, 1}}, {"groups", SymInt(1)}});
  ValueId r = b.call(OpKind::relu, {cv});
  ValueId fl = b.call(OpKind::reshape, {r}, {{"shape", SymIntVec{s0, 256}}});
  ValueId sm = b.call(OpKind::softmax, {fl}, {{"dim", SymInt(1)}});
  Sample s;
  s.syms = {s0.expr()};
  s.graph = std::make_shared<const ir::Graph>(std::move(b.done({sm})));
  return s;
}

/// Compiles on cpu, runs batch 2 and 3 against the interpreter; returns the compile's info.
CpuCompileInfo compile_and_check(const Sample& s, std::string* program_text = nullptr) {
  CpuCompileInfo info;
  auto art = compile_cpu(BackendInput{s.graph, s.syms, "0/0", "default"}, &info);
  Interpreter interp(s.graph, s.syms);
  for (int64_t n : {2, 3}) {
    manual_seed(7);
    Tensor x = randn({n, 3, 8, 8});
    auto a = art->run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
    auto b = interp.run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
    EXPECT_TRUE(allclose(a[0], b[0], 1e-4, 1e-5)) << "batch " << n << ": " << max_abs_diff(a[0], b[0]);
  }
  if (program_text) *program_text = loop::to_text(art->program());
  return info;
}

/// The single entry's base path (…/programs/<key>).
std::string only_entry(const std::string& dir) {
  std::vector<uint64_t> keys = cache::program_keys();
  EXPECT_EQ(keys.size(), 1u) << "entries in " << dir;
  return keys.empty() ? "" : cache::programs_dir() + "/" + cache::key_hex(keys[0]);
}

TEST(ProgramCache, ASecondCompileTakesThePlanAndRunsTheSame) {
  manual_seed(1);
  ScratchCache dir("hit");
  const Sample s = sample(0.25f);
  std::string first_text, second_text;
  CpuCompileInfo first = compile_and_check(s, &first_text);
  EXPECT_FALSE(first.program_from_cache);
  EXPECT_EQ(cache::program_cache_stats().stores, 1);
  EXPECT_EQ(cache::program_cache_stats().misses, 1);
  EXPECT_GE(first.externs, 1);
  EXPECT_GE(first.kernels, 1);

  cache::clear_memory_cache();  // a new process: only the disk tiers remain
  CpuCompileInfo second = compile_and_check(s, &second_text);
  EXPECT_TRUE(second.program_from_cache);
  EXPECT_TRUE(second.library_from_cache);
  EXPECT_EQ(cache::program_cache_stats().hits, 1);
  EXPECT_EQ(second.source, first.source);
  EXPECT_EQ(second.kernels, first.kernels);
  EXPECT_EQ(second.schedule.kernels_after, first.schedule.kernels_after);
  EXPECT_EQ(second.schedule.slots, first.schedule.slots);
  EXPECT_EQ(second.fused_externs, first.fused_externs);
  EXPECT_EQ(second.externs, first.externs);
  EXPECT_EQ(second_text, first_text);
  EXPECT_EQ(second.phases.wall("cpu lowering"), 0.0) << "lowering ran on a plan hit";

  // The same graph captured again (new graph object, equal weights) hits too.
  manual_seed(1);
  CpuCompileInfo third = compile_and_check(sample(0.25f));
  EXPECT_TRUE(third.program_from_cache);
}

TEST(ProgramCache, OtherWeightsAreAnotherKeyAndTheSwitchTurnsItOff) {
  manual_seed(2);
  ScratchCache dir("weights");
  const Sample a = sample(0.25f);
  manual_seed(2);
  const Sample b = sample(0.75f);  // same text, other constant bytes
  EXPECT_EQ(ir::print(*a.graph), ir::print(*b.graph));
  EXPECT_NE(plan_key({a.graph, a.syms, "0/0"}).key, plan_key({b.graph, b.syms, "0/0"}).key);
  EXPECT_FALSE(compile_and_check(a).program_from_cache);
  EXPECT_FALSE(compile_and_check(b).program_from_cache);
  EXPECT_EQ(cache::program_keys().size(), 2u);
  setenv("PROTEAN_PROGRAM_CACHE", "0", 1);
  EXPECT_FALSE(compile_and_check(a).program_from_cache);
  unsetenv("PROTEAN_PROGRAM_CACHE");
  EXPECT_TRUE(compile_and_check(a).program_from_cache);
}

// Switches that change the generated translation unit are in the key's text, the streaming stores'
// size among them: a plan stored under PROTEAN_CPU_STREAM_BYTES=0 held kernels without them, and a
// later process with streaming on took that plan.
TEST(ProgramCache, TheKeyNamesTheSwitchesThatChangeTheSource) {
  const Sample a = sample(0.25f);
  const std::string text = plan_key({a.graph, a.syms, "0/0"}).text;
  for (const std::string& part : {std::string("vectorize="), std::string("merge_dims="),
                                  fmt::format("stream_bytes={}\n", backend::cpu::stream_store_min_bytes())})
    EXPECT_NE(text.find(part), std::string::npos) << part << " missing from:\n" << text.substr(0, 400);
}

TEST(ProgramCache, CorruptTruncatedForeignAndUndecodableEntriesAreReportedAndRebuilt) {
  manual_seed(3);
  ScratchCache dir("corrupt");
  const Sample s = sample(0.5f);
  manual_seed(3);
  const Sample other = sample(1.5f);
  compile_and_check(other);  // an entry of another graph, to copy under s's key
  const std::string other_base = only_entry(dir.dir());
  const std::string other_json = read_file(other_base + ".json"), other_plan = read_file(other_base + ".plan");
  fs::remove(other_base + ".json");
  fs::remove(other_base + ".plan");
  compile_and_check(s);
  const std::string base = only_entry(dir.dir());
  const std::string good_json = read_file(base + ".json"), good_plan = read_file(base + ".plan");

  // A plan with a valid .json for its bytes that is not a plan at all: decode refuses it.
  auto with_checksum = [&](const std::string& plan) {
    nlohmann::json j = nlohmann::json::parse(good_json);
    j["size"] = plan.size();
    j["xxh64"] = cache::key_hex(XXH64(plan.data(), plan.size(), 0));
    return j.dump();
  };
  std::string flipped = good_plan;
  flipped[flipped.size() / 2] ^= 0x5a;
  std::string bad_symbols = good_plan;  // the program text names another symbol
  if (auto at = bad_symbols.find("(symbols: s0)"); at != std::string::npos) bad_symbols.replace(at, 13, "(symbols: s7)");
  const struct {
    const char* what;
    std::string json, plan;
  } cases[] = {
      {"flipped byte (checksum)", good_json, flipped},
      {"truncated plan", good_json, good_plan.substr(0, good_plan.size() / 3)},
      {"truncated json", good_json.substr(0, good_json.size() / 2), good_plan},
      {"foreign entry (another graph's files)", other_json, other_plan},
      {"not a plan, valid checksum", with_checksum(std::string(good_plan.size(), 'x')), std::string(good_plan.size(), 'x')},
      {"truncated plan, valid checksum", with_checksum(good_plan.substr(0, good_plan.size() - 9)),
       good_plan.substr(0, good_plan.size() - 9)},
      {"another graph's symbols, valid checksum", with_checksum(bad_symbols), bad_symbols},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    write_file(base + ".json", c.json);
    write_file(base + ".plan", c.plan);
    cache::reset_program_cache_stats();
    observe::LogCapture warnings("");
    CpuCompileInfo info = compile_and_check(s);
    EXPECT_FALSE(info.program_from_cache);
    EXPECT_EQ(cache::program_cache_stats().corrupt_entries, 1);
    EXPECT_NE(warnings.str().find("program cache: corrupt entry"), std::string::npos) << warnings.str();
    EXPECT_EQ(cache::program_cache_stats().stores, 1) << "the entry is replaced";
    EXPECT_TRUE(compile_and_check(s).program_from_cache) << "the rebuilt entry is used";
  }
  // A FIFO in place of the plan is refused by name, never opened for a blocking read.
  fs::remove(base + ".plan");
  ASSERT_EQ(mkfifo((base + ".plan").c_str(), 0600), 0);
  cache::reset_program_cache_stats();
  CpuCompileInfo info = compile_and_check(s);
  EXPECT_FALSE(info.program_from_cache);
  EXPECT_EQ(cache::program_cache_stats().corrupt_entries, 1);
  // Metadata without its .plan, as another process leaves it between its two renames (or when killed
  // there): a plain miss, no corruption reported; the store completes the entry.
  fs::remove(base + ".plan");
  write_file(base + ".json", good_json);
  cache::reset_program_cache_stats();
  {
    observe::LogCapture warnings("");
    EXPECT_FALSE(compile_and_check(s).program_from_cache);
    EXPECT_EQ(cache::program_cache_stats().corrupt_entries, 0);
    EXPECT_EQ(warnings.str().find("corrupt"), std::string::npos) << warnings.str();
  }
  EXPECT_EQ(cache::program_cache_stats().stores, 1);
  EXPECT_TRUE(compile_and_check(s).program_from_cache);
}

TEST(ProgramCache, BundlesCarryPlansIntoAFreshDirectory) {
  manual_seed(4);
  ScratchCache a("bundle-a");
  const Sample s = sample(0.5f);
  compile_and_check(s);
  const std::string path = a.dir() + "/out.bundle";
  CacheArtifactsSummary saved = save_cache_artifacts(path);
  EXPECT_EQ(saved.programs, 1);
  EXPECT_EQ(saved.kernels, 1);
  ScratchCache b("bundle-b");
  CacheArtifactsSummary loaded = load_cache_artifacts(path);
  EXPECT_EQ(loaded.programs, 1);
  cache::reset_kernel_cache_stats();
  CpuCompileInfo info = compile_and_check(s);
  EXPECT_TRUE(info.program_from_cache);
  EXPECT_EQ(cache::kernel_cache_stats().misses, 0) << "no compiler run";
  EXPECT_EQ(load_cache_artifacts(path).programs_present, 1);

  // A bundle whose program record does not verify is refused before anything is written.
  ScratchCache c("bundle-c");
  std::string bytes = read_file(path);
  const size_t at = bytes.find("program");
  ASSERT_NE(at, std::string::npos);
  cache::Bundle decoded = cache::decode_bundle(bytes, path, "");
  for (auto& r : decoded.records)
    if (r.kind == "program") r.bytes = cache::pack_parts({"{}", "x"});
  write_file(c.dir() + "/bad.bundle", cache::encode_bundle(decoded.header, decoded.records, ""));
  EXPECT_THROW(load_cache_artifacts(c.dir() + "/bad.bundle"), FormatError);
  EXPECT_TRUE(cache::program_keys().empty());
  EXPECT_TRUE(cache::disk_keys().empty());
}

TEST(ProgramCache, ThePlanCodecKeepsEveryAttributeAndRejectsEveryTruncation) {
  manual_seed(5);
  ScratchCache dir("codec");
  const Sample s = sample(0.5f);
  CpuCompileInfo info;
  auto art = compile_cpu(BackendInput{s.graph, s.syms, "0/0", "default"}, &info);
  loop::Program p = art->program();
  ASSERT_FALSE(p.externs.empty());
  // Every kind of attribute value, a symbolic one included.
  const SymInt sym = ir::from_expr(s.syms[0], 2);
  p.externs[0].attrs.set("t_sym", ir::from_expr(sym::parse("3*s0 + 1"), 7));
  p.externs[0].attrs.set("t_vec", SymIntVec{1, sym, -(int64_t{1} << 62) - 5});
  p.externs[0].attrs.set("t_f", 0.1);
  p.externs[0].attrs.set("t_b", true);
  p.externs[0].attrs.set("t_s", std::string("a\0b", 3));
  p.externs[0].attrs.set("t_d", DType::BF16);
  ir::Graph g = *s.graph;  // no rewrites: every constant of p that is not g's travels as bytes
  const std::string bytes = encode_plan(p, g, info.source, info.kernel_buffers, info.unique_kernels, info.schedule);
  const BackendInput in{s.graph, s.syms, "0/0", "default"};
  Plan back = decode_plan(bytes, in, g);
  ASSERT_EQ(back.program.externs.size(), p.externs.size());
  for (size_t i = 0; i < p.externs.size(); ++i) EXPECT_TRUE(back.program.externs[i].attrs == p.externs[i].attrs) << i;
  EXPECT_EQ(loop::to_text(back.program), loop::to_text(p));
  EXPECT_EQ(back.source, info.source);
  EXPECT_EQ(back.kernel_buffers, info.kernel_buffers);
  for (size_t i = 0; i < p.buffers.size(); ++i) {
    if (p.buffers[i].kind == loop::BufferKind::Constant) {
      EXPECT_TRUE(allclose(back.program.buffers[i].constant, p.buffers[i].constant, 0, 0)) << "b" << i;
    }
  }
  // Every proper prefix is refused with a FormatError (never a crash or a partial plan).
  for (size_t n = 0; n < bytes.size(); n += std::max<size_t>(1, bytes.size() / 997)) {
    try {
      decode_plan(bytes.substr(0, n), in, g);
      ADD_FAILURE() << "a plan truncated to " << n << " of " << bytes.size() << " bytes decoded";
    } catch (const FormatError&) {
    } catch (const CompileError&) {  // the loop verifier, for a program text cut inside
    }
  }
}

}  // namespace
}  // namespace protean::backend::cpu
