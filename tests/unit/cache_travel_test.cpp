// Compiled artifacts that travel: bundles (save / load / inspect, `protean cache export|import|show`),
// refused bundles (truncated, corrupt, foreign, another version, signatures) leaving the cache as it
// was, portable keys (PROTEAN_CACHE_PORTABLE), and the Redis tier against a real redis-server
// (hits from a fresh cache, chunked values, an invalid value, a server that is down or killed).
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "backend/cpu/pipeline.h"
#include "backend/cpu/toolchain.h"
#include "backend/interp/interp.h"
#include "cache/bundle.h"
#include "cache/isa.h"
#include "cache/kernel_cache.h"
#include "core/redis_client.h"
#include "cache/program_cache.h"
#include "cache/remote.h"
#include "dynamic/pgo.h"
#include "dynamic/profile_store.h"
#include "ir_test_util.h"
#include "observe/log.h"
#include "protean/cache.h"
#include "protean/cache_cmd.h"
#include "protean/ops.h"
#include "test_env.h"

namespace protean::backend::cpu {
namespace {

namespace fs = std::filesystem;
using ir::ValueId;
using ir::testing::GraphBuilder;
using ops::OpKind;
using protean::testing::EnvScope;

/// A fresh cache directory, as a fresh process sees it (memory tier and remote tier forgotten).
class CacheDir {
 public:
  explicit CacheDir(const std::string& name) {
    dir_ = fmt::format("/tmp/protean-travel-{}-{}", name, getpid());
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_);
    use();
  }
  ~CacheDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  /// Points PROTEAN_CACHE_DIR here and forgets the in-process tiers (a "new process").
  void use() const {
    setenv("PROTEAN_CACHE_DIR", dir_.c_str(), 1);
    cache::clear_memory_cache();
    cache::remote::reset();
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

struct RestoreCacheDir {
  std::optional<std::string> prev;
  RestoreCacheDir() {
    if (const char* p = std::getenv("PROTEAN_CACHE_DIR")) prev = p;
  }
  ~RestoreCacheDir() {
    if (prev) setenv("PROTEAN_CACHE_DIR", prev->c_str(), 1);
    else unsetenv("PROTEAN_CACHE_DIR");
    cache::clear_memory_cache();
    cache::remote::reset();
  }
};

std::shared_ptr<const ir::Graph> sample_graph(double salt, std::vector<sym::Expr>& syms) {
  GraphBuilder b("travel");
  SymInt s0 = b.symbol("x.size()[0]", 4);
  ValueId x = b.input("x", {s0, 16});
  ValueId c = b.constant(scalar_tensor(salt));
  ValueId y = b.call(OpKind::mul, {b.call(OpKind::softmax, {x}, {{"dim", SymInt(1)}}), c});
  syms = {s0.expr()};
  return std::make_shared<const ir::Graph>(std::move(b.done({y})));
}

/// Compiles on the cpu backend, checks against the interpreter; the compile's info (library and
/// plan from a cache tier or not).
CpuCompileInfo compile_info(double salt);

/// Compiles on the cpu backend, checks against the interpreter; true when the library came from a
/// cache tier (no compiler run).
bool compile_and_check(double salt) { return compile_info(salt).library_from_cache; }

CpuCompileInfo compile_info(double salt) {
  std::vector<sym::Expr> syms;
  auto g = sample_graph(salt, syms);
  CpuCompileInfo info;
  auto art = compile_cpu(BackendInput{g, syms, "0/0", "default"}, &info);
  Interpreter interp(g, syms);
  Tensor x = randn({5, 16});
  int64_t n = 5;
  auto a = art->run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
  auto b = interp.run(std::vector<Tensor>{x}, std::span<const int64_t>(&n, 1));
  EXPECT_TRUE(allclose(a[0], b[0], 1e-4, 1e-5)) << max_abs_diff(a[0], b[0]);
  return info;
}

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void write_file(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }

/// Every file under `dir` (relative path → content hash): "nothing in the cache was touched".
std::map<std::string, uint64_t> snapshot(const std::string& dir) {
  std::map<std::string, uint64_t> m;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (rel.rfind("tmp", 0) == 0 || !e.is_regular_file()) continue;
    std::string s = read_file(e.path().string());
    m[rel] = XXH64(s.data(), s.size(), 0);
  }
  return m;
}

template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

void write_profile(const std::string& cache_dir) {
  dynamic::Profile p;
  dynamic::FrameProfile f;
  f.id = {"affine", "a.cpp", 3, "0123456789abcdef"};
  p.frames[f.id.key()] = f;
  fs::create_directories(cache_dir + "/pgo/job1");
  write_file(cache_dir + "/pgo/job1/rank0.json", dynamic::dump_profile(p));
}

// ---- bundles -----------------------------------------------------------------------------------------
TEST(CacheBundle, ExportImportIntoAFreshDirectoryCompilesNothing) {
  RestoreCacheDir restore;
  CacheDir a("bundle-a"), b("bundle-b");
  a.use();
  EXPECT_FALSE(compile_and_check(1.25));
  write_profile(a.dir());
  fs::create_directories(a.dir() + "/locations");
  write_file(a.dir() + "/locations/0123abcd.tsv", "0x10\tf\ta.cpp\t3\n");
  write_file(a.dir() + "/locations/not-a-build-id.tsv", "x");
  const std::string path = a.dir() + "/out.bundle";
  CacheArtifactsSummary saved = save_cache_artifacts(path);
  EXPECT_EQ(saved.kernels, 1);
  EXPECT_EQ(saved.profiles, 1);
  EXPECT_EQ(saved.locations, 1);
  EXPECT_EQ(saved.target, "native");
  EXPECT_FALSE(saved.signed_);

  b.use();
  cache::reset_kernel_cache_stats();
  CacheArtifactsSummary loaded = load_cache_artifacts(path);
  EXPECT_EQ(loaded.kernels, 1);
  EXPECT_EQ(loaded.kernels_present, 0);
  EXPECT_EQ(loaded.kernels_rebuilt, 0);
  EXPECT_EQ(loaded.profiles, 1);
  EXPECT_TRUE(fs::exists(b.dir() + "/pgo/job1/rank0.json"));
  EXPECT_EQ(loaded.locations, 1);
  EXPECT_EQ(read_file(b.dir() + "/locations/0123abcd.tsv"), "0x10\tf\ta.cpp\t3\n");
  EXPECT_TRUE(compile_and_check(1.25)) << "the imported kernel is used";
  EXPECT_EQ(cache::kernel_cache_stats().misses, 0);
  EXPECT_EQ(cache::kernel_cache_stats().disk_hits, 1);

  // Loading again keeps the entries that are there.
  CacheArtifactsSummary again = load_cache_artifacts(path);
  EXPECT_EQ(again.kernels, 0);
  EXPECT_EQ(again.kernels_present, 1);

  // show
  CacheArtifactsSummary shown = inspect_cache_artifacts(path);
  ASSERT_EQ(shown.records.size(), 4u);
  EXPECT_EQ(shown.records[0].kind, "kernel");
  EXPECT_EQ(shown.records[1].kind, "program");  // the compiled plan (program cache)
  EXPECT_EQ(shown.records[2].kind, "pgo");
  EXPECT_EQ(shown.records[3].kind, "locations");
  EXPECT_EQ(shown.records[2].name, "job1/rank0.json");
  EXPECT_GT(shown.records[0].bytes, shown.records[0].stored) << "records are compressed";
}

TEST(CacheBundle, TruncatedCorruptForeignAndOtherVersionBundlesAreRefusedAndTouchNothing) {
  RestoreCacheDir restore;
  CacheDir a("refuse-a"), b("refuse-b");
  a.use();
  compile_and_check(2.25);
  const std::string good = a.dir() + "/good.bundle";
  save_cache_artifacts(good);
  const std::string bytes = read_file(good);

  b.use();
  compile_and_check(2.25);  // b holds an entry already: it must stay as it is
  write_profile(b.dir());
  const auto before = snapshot(b.dir());
  auto refused = [&](const std::string& content, const std::string& expect) {
    const std::string p = b.dir() + "/bad.bundle";
    write_file(p, content);
    std::string what = error_of<Error>([&] { load_cache_artifacts(p); });
    fs::remove(p);
    EXPECT_NE(what.find(expect), std::string::npos) << what;
    EXPECT_EQ(snapshot(b.dir()), before) << "nothing in the cache changed after: " << what;
  };
  for (size_t cut : {size_t{0}, size_t{5}, size_t{12}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1})
    refused(bytes.substr(0, cut), cut < 8 ? "not a Protean cache bundle" : "truncated");
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x5a;
  refused(flipped, "checksum mismatch");
  refused("\x7f" "ELF this is some other file entirely", "not a Protean cache bundle");
  std::string future = bytes;
  future[8] = 9;  // format 9
  refused(future, "bundle format 9");
  refused(bytes + "x", "after the end of the bundle");

  // Another Protean version: a well-formed bundle whose header names it.
  cache::Bundle dec = cache::decode_bundle(bytes, "good", "");
  nlohmann::json h = nlohmann::json::parse(dec.header);
  h["protean_version"] = "0.0.1-other";
  std::string other = cache::encode_bundle(h.dump(), dec.records, "");
  refused(other, "made by Protean 0.0.1-other");
  EXPECT_THROW(
      [&] {
        write_file(b.dir() + "/v.bundle", other);
        load_cache_artifacts(b.dir() + "/v.bundle");
      }(),
      ValueError);
  fs::remove(b.dir() + "/v.bundle");

  // A kernel record whose binary does not match its metadata.
  std::vector<std::string> parts = cache::unpack_parts(dec.records[0].bytes, 3, "k");
  parts[1][parts[1].size() / 2] ^= 1;
  std::vector<cache::BundleRecord> recs = dec.records;
  recs[0].bytes = cache::pack_parts(parts);
  refused(cache::encode_bundle(dec.header, recs, ""), "checksum mismatch");
}

TEST(CacheBundle, SignedBundlesAndTheSigningKeyPolicy) {
  RestoreCacheDir restore;
  CacheDir a("sig-a"), b("sig-b");
  a.use();
  compile_and_check(3.25);
  const std::string unsigned_path = a.dir() + "/plain.bundle", signed_path = a.dir() + "/signed.bundle";
  save_cache_artifacts(unsigned_path);
  {
    EnvScope key("PROTEAN_CACHE_SIGNING_KEY", "k1-secret");
    EXPECT_TRUE(save_cache_artifacts(signed_path).signed_);
  }
  b.use();
  {
    EnvScope key("PROTEAN_CACHE_SIGNING_KEY", "k2-other");
    EXPECT_NE(error_of<ValueError>([&] { load_cache_artifacts(signed_path); }).find("signature does not match"),
              std::string::npos);
  }
  {
    EnvScope key("PROTEAN_CACHE_SIGNING_KEY", "k1-secret");
    EXPECT_NE(error_of<ValueError>([&] { load_cache_artifacts(unsigned_path); }).find("not signed"), std::string::npos);
    EXPECT_TRUE(cache::disk_keys().empty()) << "a refused bundle writes nothing";
    EXPECT_EQ(load_cache_artifacts(signed_path).kernels, 1);
  }
  // Without a key a signed bundle loads (unverified): the key is what makes signatures required.
  CacheDir c("sig-c");
  EXPECT_EQ(load_cache_artifacts(signed_path).kernels, 1);
}

TEST(CacheBundle, KernelsThatCannotRunHereAreRebuiltFromSourceOrRefused) {
  RestoreCacheDir restore;
  CacheDir a("foreign-a"), b("foreign-b");
  a.use();
  compile_and_check(4.25);
  const std::string path = a.dir() + "/x.bundle";
  save_cache_artifacts(path);
  // The same bundle as if made with -march=native on a CPU with other features.
  cache::Bundle dec = cache::decode_bundle(read_file(path), "x", "");
  std::vector<std::string> parts = cache::unpack_parts(dec.records[0].bytes, 3, "k");
  nlohmann::json meta = nlohmann::json::parse(parts[0]);
  meta["cpu_flags"] = "0000000000000000";
  parts[0] = meta.dump(2);
  dec.records[0].bytes = cache::pack_parts(parts);
  const std::string foreign = a.dir() + "/foreign.bundle";
  write_file(foreign, cache::encode_bundle(dec.header, dec.records, ""));

  b.use();
  std::string why = error_of<ValueError>([&] { load_cache_artifacts(foreign, {.rebuild = false}); });
  EXPECT_NE(why.find("1 of 1 kernels cannot run here (built with -march=native on a CPU with other features)"),
            std::string::npos)
      << why;
  EXPECT_TRUE(cache::disk_keys().empty());
  observe::LogCapture cap("");
  cache::reset_kernel_cache_stats();
  CacheArtifactsSummary s = load_cache_artifacts(foreign);
  EXPECT_EQ(s.kernels, 0);
  EXPECT_EQ(s.kernels_rebuilt, 1);
  EXPECT_EQ(cache::kernel_cache_stats().misses, 1) << "the compiler ran on the bundled source";
  EXPECT_NE(cap.str().find("their binaries are not loaded, they are rebuilt"), std::string::npos) << cap.str();
  cache::EntryFiles e;
  ASSERT_EQ(cache::disk_keys().size(), 1u);
  ASSERT_EQ(cache::read_entry(cache::disk_keys()[0], e), "");
  EXPECT_NE(e.meta.find(fmt::format("\"cpu_flags\": \"{}\"", cache::key_hex(XXH64(cpu_features().data(),
                                                                                    cpu_features().size(), 0)))),
            std::string::npos)
      << "the entry is this machine's build: " << e.meta;
  EXPECT_TRUE(compile_and_check(4.25));
}

TEST(CacheBundle, CliExportShowImport) {
  RestoreCacheDir restore;
  CacheDir a("cli-a"), b("cli-b");
  a.use();
  compile_and_check(5.25);
  const std::string path = a.dir() + "/cli.bundle";
  std::ostringstream out, err;
  EXPECT_EQ(tools::cache_command({"export", false, path}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("1 kernels, 1 programs, 0 PGO profiles, 0 location caches"), std::string::npos) << out.str();
  out.str("");
  EXPECT_EQ(tools::cache_command({"show", true, path}, out, err), 0) << err.str();
  nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["header"]["target"], "native");
  EXPECT_EQ(j["records"][0]["kind"], "kernel");
  b.use();
  out.str("");
  EXPECT_EQ(tools::cache_command({"import", false, path}, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("1 kernels written"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("1 programs written"), std::string::npos) << out.str();
  write_file(b.dir() + "/junk", "junk");
  err.str("");
  EXPECT_EQ(tools::cache_command({"import", false, b.dir() + "/junk"}, out, err), 1);
  EXPECT_NE(err.str().find("not a Protean cache bundle"), std::string::npos) << err.str();
  EXPECT_EQ(tools::cache_command({"import", false, ""}, out, err), 2);
}

// ---- portable keys -------------------------------------------------------------------------------------
TEST(CachePortable, KeysNameTheIsaLevelAndNoPathAndBundlesHitEverywhere) {
  RestoreCacheDir restore;
  const std::string src = "extern \"C\" void kernel0() {}\n";
  const uint64_t native_key = artifact_key(src);
  EnvScope portable("PROTEAN_CACHE_PORTABLE", "1");
  EXPECT_EQ(cache::build_target(), cache::isa_level());
  EXPECT_EQ(compiler_flags().find("-march=native"), std::string::npos) << compiler_flags();
  EXPECT_NE(compiler_flags().find("-march=" + cache::isa_level()), std::string::npos) << compiler_flags();
  EXPECT_NE(artifact_key(src), native_key);
  {
    EnvScope isa("PROTEAN_CACHE_ISA", "x86-64-v2");
    EXPECT_EQ(cache::build_target(), "x86-64-v2");
    EXPECT_NE(compiler_flags().find("-march=x86-64-v2 -mtune=generic"), std::string::npos);
  }
  {
    EnvScope isa("PROTEAN_CACHE_ISA", "pentium4");
    EXPECT_NE(error_of<ValueError>([] { cache::isa_level(); }).find("expected x86-64-v3 or x86-64-v4"), std::string::npos);
  }
  if (!std::getenv("PROTEAN_CXX")) {
    const uint64_t k0 = artifact_key(src);
    EnvScope cxx("PROTEAN_CXX", "/usr/bin/g++");  // an absolute compiler path: the same key as "g++"
    EXPECT_EQ(artifact_key(src), k0);
  }
  {
    EnvScope dir1("PROTEAN_CACHE_DIR", "/tmp/one/place");
    const uint64_t k1 = artifact_key(src);
    EnvScope dir2("PROTEAN_CACHE_DIR", "/var/somewhere/else");
    EXPECT_EQ(artifact_key(src), k1);
  }

  // Two cache directories at different paths build the same keys; a bundle from one hits 100% in a
  // clean other one.
  CacheDir a("portable-a"), b("portable-dir-b");
  a.use();
  EXPECT_FALSE(compile_and_check(6.25));
  const std::vector<uint64_t> keys_a = cache::disk_keys();
  b.use();
  EXPECT_FALSE(compile_and_check(6.25));
  EXPECT_EQ(cache::disk_keys(), keys_a);
  cache::EntryFiles e;
  ASSERT_EQ(cache::read_entry(keys_a[0], e), "");
  EXPECT_EQ(cache::entry_attr(e.meta, "target"), cache::isa_level());
  a.use();
  const std::string path = a.dir() + "/p.bundle";
  CacheArtifactsSummary saved = save_cache_artifacts(path);
  EXPECT_EQ(saved.target, cache::isa_level());
  CacheDir c("portable-c");
  cache::reset_kernel_cache_stats();
  EXPECT_EQ(load_cache_artifacts(path).kernels, 1);
  EXPECT_TRUE(compile_and_check(6.25));
  EXPECT_EQ(cache::kernel_cache_stats().misses, 0);
}

// ---- Redis tier ------------------------------------------------------------------------------------------
using protean::testing::have_redis_server;
using protean::testing::RedisServer;

/// A client of the test's server, for reading what the cache wrote.
core::RedisClient client_of(const RedisServer& server) { return core::RedisClient({"127.0.0.1", server.port, ""}); }

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(CacheRemote, ASecondCacheHitsThroughRedisAndLargeValuesAreChunked) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  RestoreCacheDir restore;
  CacheDir a("redis-a");
  RedisServer server(a.dir(), "ctest");
  EnvScope remote("PROTEAN_CACHE_REMOTE", server.url());
  a.use();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(7.25));
  cache::remote::flush();
  const uint64_t key = cache::disk_keys().at(0);
  auto value = client_of(server).get("ctest:v1:kernel:" + cache::key_hex(key));
  ASSERT_TRUE(value) << "published under <prefix>:v1:kernel:<key>";
  EXPECT_EQ(value->compare(0, 8, "PROTBNDL"), 0);
  EXPECT_EQ(cache::remote::remote_stats().writes, 2) << "the kernel library and the program plan";

  CacheDir b("redis-b");  // another machine: empty disk, same remote
  cache::reset_kernel_cache_stats();
  EXPECT_TRUE(compile_and_check(7.25));
  EXPECT_EQ(cache::kernel_cache_stats().remote_hits, 1);
  EXPECT_EQ(cache::kernel_cache_stats().misses, 0);
  EXPECT_EQ(cache::disk_keys(), std::vector<uint64_t>{key}) << "a remote hit becomes a disk entry";
  // SET NX: publishing the same key again stores nothing new.
  cache::EntryFiles e;
  ASSERT_EQ(cache::read_entry(key, e), "");
  cache::remote::publish_entry(e);
  cache::remote::flush();
  EXPECT_EQ(cache::remote::remote_stats().already_present, 1);

  // Chunked: a value over the chunk size is stored as chunks + a manifest and read back whole.
  CacheDir c("redis-c");
  cache::remote::set_chunk_bytes(4096);
  EXPECT_FALSE(compile_and_check(8.25));
  cache::remote::flush();
  const uint64_t key2 = cache::disk_keys().at(0);
  auto manifest = client_of(server).get("ctest:v1:kernel:" + cache::key_hex(key2));
  ASSERT_TRUE(manifest);
  EXPECT_EQ(manifest->compare(0, 8, "PROTCHNK"), 0);
  EXPECT_TRUE(client_of(server).get("ctest:v1:kernel:" + cache::key_hex(key2) + ":1")) << "at least two chunks";
  CacheDir d("redis-d");
  cache::remote::set_chunk_bytes(4096);
  cache::reset_kernel_cache_stats();
  EXPECT_TRUE(compile_and_check(8.25));
  EXPECT_EQ(cache::kernel_cache_stats().remote_hits, 1);

  // An invalid value: one warning, deleted, rebuilt (and then published again).
  CacheDir f("redis-f");
  {
    core::RedisClient cl = client_of(server);
    core::RedisReply del(cl.cmd({"DEL", "ctest:v1:kernel:" + cache::key_hex(key)}));
    cl.set_nx("ctest:v1:kernel:" + cache::key_hex(key), "PROTBNDL garbage");
  }
  cache::reset_kernel_cache_stats();
  EXPECT_FALSE(compile_and_check(7.25));
  EXPECT_EQ(count(cap.str(), "is invalid"), 1) << cap.str();
  EXPECT_EQ(count(cap.str(), "is unavailable"), 0) << cap.str();
}

TEST(CacheRemote, AServerKilledMidRunWarnsOnceAndTheLocalCacheContinues) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  RestoreCacheDir restore;
  CacheDir a("redis-kill");
  RedisServer server(a.dir(), "ctest");
  EnvScope remote("PROTEAN_CACHE_REMOTE", server.url());
  a.use();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(9.25));
  cache::remote::flush();
  server.kill();
  cache::clear_memory_cache();
  fs::remove_all(cache::kernels_dir());
  EXPECT_FALSE(compile_and_check(9.25)) << "rebuilt locally";
  EXPECT_FALSE(compile_and_check(10.25));
  EXPECT_TRUE(compile_and_check(10.25));
  cache::remote::flush();
  EXPECT_EQ(count(cap.str(), "is unavailable"), 1) << cap.str();
  EXPECT_TRUE(cache::remote::remote_stats().failed);
  EXPECT_EQ(cache::disk_keys().size(), 2u) << "the local cache kept working";
}

TEST(CacheRemote, PlansTravelThroughRedisAndAServerKilledMidRunLeavesTheLocalTiers) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server)";
  RestoreCacheDir restore;
  EnvScope on("PROTEAN_PROGRAM_CACHE", "1");
  CacheDir a("redis-plan-a");
  RedisServer server(a.dir(), "ctest");
  EnvScope remote("PROTEAN_CACHE_REMOTE", server.url());
  a.use();
  observe::LogCapture cap("");
  CpuCompileInfo cold = compile_info(12.25);
  EXPECT_FALSE(cold.library_from_cache);
  EXPECT_FALSE(cold.program_from_cache);
  cache::remote::flush();
  ASSERT_EQ(cache::program_keys().size(), 1u);
  const uint64_t plan_key = cache::program_keys().at(0);
  auto value = client_of(server).get("ctest:v1:program:" + cache::key_hex(plan_key));
  ASSERT_TRUE(value) << "the plan is published under <prefix>:v1:program:<key>";
  EXPECT_EQ(value->compare(0, 8, "PROTBNDL"), 0);

  // Another machine: empty disk, same remote. The plan and the kernels both come from Redis.
  CacheDir b("redis-plan-b");
  const int64_t remote_plan_hits = cache::remote::remote_stats().program_hits;  // process-wide counter
  cache::reset_kernel_cache_stats();
  cache::reset_program_cache_stats();
  CpuCompileInfo warm = compile_info(12.25);
  EXPECT_TRUE(warm.program_from_cache) << "lowering and codegen skipped";
  EXPECT_TRUE(warm.library_from_cache) << "no compiler run";
  EXPECT_EQ(cache::program_cache_stats().remote_hits, 1);
  EXPECT_EQ(cache::program_cache_stats().misses, 0);
  EXPECT_EQ(cache::kernel_cache_stats().remote_hits, 1);
  EXPECT_EQ(cache::kernel_cache_stats().misses, 0);
  EXPECT_EQ(cache::program_keys(), std::vector<uint64_t>{plan_key}) << "a remote plan becomes a disk entry";
  EXPECT_EQ(cache::remote::remote_stats().program_hits - remote_plan_hits, 1);

  // An invalid plan value (right header, garbage after it): one warning, deleted, lowered again.
  CacheDir c("redis-plan-c");
  {
    core::RedisClient cl = client_of(server);
    core::RedisReply del(cl.cmd({"DEL", "ctest:v1:program:" + cache::key_hex(plan_key)}));
    cl.set_nx("ctest:v1:program:" + cache::key_hex(plan_key), "PROTBNDL garbage");
  }
  cache::reset_program_cache_stats();
  EXPECT_FALSE(compile_info(12.25).program_from_cache);
  EXPECT_EQ(count(cap.str(), "is invalid"), 1) << cap.str();
  EXPECT_EQ(cache::program_cache_stats().misses, 1);

  // The server dies mid-run (this "process" has used it): one warning, and plans and kernels keep
  // being built and then hit locally.
  server.kill();
  cache::clear_memory_cache();
  fs::remove_all(cache::programs_dir());
  fs::remove_all(cache::kernels_dir());
  cache::reset_program_cache_stats();
  CpuCompileInfo lost = compile_info(13.25);
  EXPECT_FALSE(lost.program_from_cache);
  EXPECT_FALSE(lost.library_from_cache);
  CpuCompileInfo again = compile_info(13.25);
  EXPECT_TRUE(again.program_from_cache) << "the disk tier still works";
  EXPECT_TRUE(again.library_from_cache);
  cache::remote::flush();
  EXPECT_EQ(count(cap.str(), "is unavailable"), 1) << cap.str();
  EXPECT_TRUE(cache::remote::remote_stats().failed);
}

TEST(CacheRemote, NoServerAtAllIsOneWarning) {
  RestoreCacheDir restore;
  CacheDir a("redis-none");
  EnvScope remote("PROTEAN_CACHE_REMOTE", fmt::format("redis://127.0.0.1:{}/x", protean::testing::free_loopback_port()));
  a.use();
  observe::LogCapture cap("");
  EXPECT_FALSE(compile_and_check(11.25));
  EXPECT_TRUE(compile_and_check(11.25));
  cache::remote::flush();
  EXPECT_EQ(count(cap.str(), "is unavailable"), 1) << cap.str();
  EnvScope bad("PROTEAN_CACHE_REMOTE", "http://nope");
  cache::remote::reset();
  EXPECT_FALSE(cache::remote::enabled());
}

// A file that does not start with the bundle magic is refused as no bundle by inspect and by load.
// (check_bundle_file_magic reads its first 8 bytes before the file is read whole: a 300 MB file of
// zeros is refused in 0.04 s and 18 MB of RSS by `protean cache show`; it was read whole before.)
TEST(CacheBundle, AFileThatIsNoBundleIsRefusedFromItsMagic) {
  RestoreCacheDir restore;
  CacheDir a("magic-a");
  a.use();
  const std::string p = a.dir() + "/not.bundle";
  {
    std::ofstream f(p, std::ios::binary);
    f << "NOTABNDL";
    const std::string block(1 << 20, '\0');
    for (int i = 0; i < 64; ++i) f << block;
  }
  for (auto fn : {+[](const std::string& q) { (void)inspect_cache_artifacts(q); },
                  +[](const std::string& q) { (void)load_cache_artifacts(q); }}) {
    std::string what = error_of<FormatError>([&] { fn(p); });
    EXPECT_NE(what.find("not a Protean cache bundle (it does not start with PROTBNDL)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace protean::backend::cpu
