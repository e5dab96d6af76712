#include "cache/remote.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "cache/bundle.h"
#include "core/redis_client.h"
#include "observe/log.h"
#include "protean/error.h"

namespace protean::cache::remote {

using core::parse_redis_url;
using core::RedisClient;
using core::RedisReply;
using core::RedisUrl;

namespace {

constexpr char kChunkMagic[] = "PROTCHNK";  // 8 bytes, then u32 count, u64 total, u64 xxh64
constexpr size_t kManifestBytes = 8 + 4 + 8 + 8;

struct State {
  // configuration and the reading connection (lookups run on the compiling thread)
  std::mutex mu;
  bool configured = false;
  bool off = true;  // no PROTEAN_CACHE_REMOTE
  std::string url_text;
  RedisUrl url;
  std::unique_ptr<RedisClient> reader;
  std::set<uint64_t> warned_invalid;
  std::atomic<bool> failed{false};
  std::atomic<size_t> chunk{size_t{64} << 20};

  // the write queue and its worker (the writing connection is touched only while `busy`)
  std::mutex qmu;
  std::condition_variable qcv, idle;
  // one value to store: its kind ("kernel" or "program"), key, and the entry it is encoded from
  struct Pending {
    std::string kind;
    uint64_t key = 0;
    std::function<std::string()> encode;
  };
  std::deque<Pending> queue;
  bool busy = false;
  bool worker_started = false;
  std::unique_ptr<RedisClient> writer;

  std::atomic<int64_t> hits{0}, misses{0}, writes{0}, present{0}, invalid{0};
  std::atomic<int64_t> program_hits{0}, program_misses{0};
};
// Never destroyed: the worker thread may still hold it while the process exits.
State& state() {
  static State* s = new State;
  return *s;
}

void configure_locked(State& s) {
  if (s.configured) return;
  s.configured = true;
  const char* v = std::getenv("PROTEAN_CACHE_REMOTE");
  s.url_text = v ? v : "";
  s.off = s.url_text.empty();
  if (s.off) return;
  try {
    s.url = parse_redis_url(s.url_text, "PROTEAN_CACHE_REMOTE", "protean-cache");
  } catch (const Error& e) {
    s.failed = true;
    observe::warn(fmt::format("artifact cache: remote store disabled: {}", e.what()));
  }
}

void fail(const std::string& what) {
  State& s = state();
  if (s.failed.exchange(true)) return;
  observe::warn(fmt::format("artifact cache: remote store {} is unavailable ({}); continuing with the local cache {}",
                            s.url_text, what, kernels_dir()));
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, s.data() + at, 8);
  return v;
}
uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}

std::string encode_entry(const EntryFiles& e) {
  std::vector<BundleRecord> recs{{"kernel", key_hex(e.key), pack_parts({e.meta, e.so, e.cpp})}};
  return encode_bundle(bundle_header_json(1), recs, signing_key());
}

// A program cache entry as a bundle of one "program" record (the .json and the .plan).
std::string encode_program(const ProgramEntry& e) {
  std::vector<BundleRecord> recs{{"program", key_hex(e.key), pack_parts({e.meta, e.plan})}};
  return encode_bundle(bundle_header_json(1), recs, signing_key());
}

// Stores `value` under `key` with SET NX (chunked above the chunk size). Throws RuntimeError.
void store(RedisClient& r, const std::string& key, const std::string& value) {
  State& s = state();
  const size_t chunk = std::max<size_t>(s.chunk.load(), 1);
  if (value.size() <= chunk) {
    (r.set_nx(key, value) ? s.writes : s.present)++;
    return;
  }
  const uint32_t n = static_cast<uint32_t>((value.size() + chunk - 1) / chunk);
  for (uint32_t i = 0; i < n; ++i) {
    const size_t off = static_cast<size_t>(i) * chunk;
    r.set_nx(fmt::format("{}:{}", key, i), std::string_view(value).substr(off, std::min(chunk, value.size() - off)));
  }
  std::string manifest(kChunkMagic, 8);
  put_u32(manifest, n);
  put_u64(manifest, value.size());
  put_u64(manifest, XXH64(value.data(), value.size(), 0));
  (r.set_nx(key, manifest) ? s.writes : s.present)++;  // last: readers never see a partial value
}

void worker_loop() {
  State& s = state();
  for (;;) {
    State::Pending e;
    {
      std::unique_lock<std::mutex> lock(s.qmu);
      s.qcv.wait(lock, [&] { return !s.queue.empty(); });
      e = std::move(s.queue.front());
      s.queue.pop_front();
      s.busy = true;
    }
    if (!s.failed) {
      try {
        if (!s.writer) s.writer = std::make_unique<RedisClient>(s.url);
        store(*s.writer, value_key(e.kind, key_hex(e.key)), e.encode());
      } catch (const Error& ex) {
        s.writer.reset();
        fail(ex.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(s.qmu);
      s.busy = false;
    }
    s.idle.notify_all();
  }
}

bool flush_for(std::chrono::milliseconds limit) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.qmu);
  return s.idle.wait_for(lock, limit, [&] { return s.queue.empty() && !s.busy; });
}

void flush_at_exit() { flush_for(std::chrono::seconds(5)); }

// The value under `key`, reassembled from chunks; nullopt when absent. Throws RuntimeError on a
// connection error, FormatError on a bad manifest or chunk.
std::optional<std::string> read_value(RedisClient& r, const std::string& key) {
  std::optional<std::string> v = r.get(key);
  if (!v || v->size() < 8 || v->compare(0, 8, kChunkMagic, 8) != 0) return v;
  if (v->size() != kManifestBytes) throw FormatError("a chunk manifest of the wrong size");
  const uint32_t n = get_u32(*v, 8);
  const uint64_t total = get_u64(*v, 12), sum = get_u64(*v, 20);
  if (n == 0 || total > (uint64_t{1} << 34)) throw FormatError(fmt::format("a chunk manifest of {} chunks, {} bytes", n, total));
  std::string out;
  for (uint32_t i = 0; i < n; ++i) {
    std::optional<std::string> c = r.get(fmt::format("{}:{}", key, i));
    if (!c) throw FormatError(fmt::format("chunk {} of {} is missing", i, n));
    if (out.size() + c->size() > total) throw FormatError("the chunks are longer than the manifest says");
    out += *c;
  }
  if (out.size() != total) throw FormatError(fmt::format("the chunks hold {} bytes, the manifest says {}", out.size(), total));
  if (XXH64(out.data(), out.size(), 0) != sum) throw FormatError("the chunks' checksum does not match the manifest");
  return out;
}

}  // namespace

std::string value_key(const std::string& kind, const std::string& name) {
  State& s = state();
  return fmt::format("{}:v1:{}:{}", s.url.prefix, kind, name);
}

bool enabled() {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    configure_locked(s);
  }
  return !s.off && !s.failed;
}

namespace {

// The parts of the one `kind` record stored under key `key`, its value decoded and its header and
// signature checked, then `verify` (the entry's own checks: "" when it is usable). nullopt when absent,
// invalid (one warning per key, the value deleted) or the store is unavailable. `hits`/`misses` count.
std::optional<std::vector<std::string>> fetch_parts(const std::string& kind, uint64_t key, size_t nparts,
                                                    const std::function<std::string(std::vector<std::string>&)>& verify,
                                                    std::atomic<int64_t>& hits, std::atomic<int64_t>& misses) {
  if (!enabled()) return std::nullopt;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const std::string vkey = value_key(kind, key_hex(key));
  auto invalid = [&](const std::string& why) {
    s.invalid++;
    misses++;
    if (s.warned_invalid.insert(key).second)
      observe::warn(fmt::format("artifact cache: remote value {} is invalid ({}); deleted, rebuilding", vkey, why));
    try {
      if (s.reader) RedisReply d(s.reader->cmd({"DEL", vkey}));
    } catch (const Error&) {
    }
  };
  std::optional<std::string> value;
  try {
    if (!s.reader) s.reader = std::make_unique<RedisClient>(s.url);
    value = read_value(*s.reader, vkey);
  } catch (const FormatError& e) {
    invalid(e.what());
    return std::nullopt;
  } catch (const Error& e) {
    s.reader.reset();
    fail(e.what());
    return std::nullopt;
  }
  if (!value) {
    misses++;
    return std::nullopt;
  }
  std::string why;
  std::vector<std::string> parts;
  try {
    const std::string where = fmt::format("{} key {}", s.url_text, vkey);
    Bundle b = decode_bundle(*value, where, signing_key());
    if (std::string h = check_bundle_header(b.header); !h.empty()) throw FormatError(h);
    if (std::string sig = signature_problem(b); !sig.empty()) throw FormatError(sig);
    if (b.records.size() != 1 || b.records[0].kind != kind || b.records[0].name != key_hex(key))
      throw FormatError(fmt::format("the value does not hold this key's {}", kind));
    parts = unpack_parts(b.records[0].bytes, nparts, where);
    why = verify(parts);
  } catch (const Error& ex) {
    why = ex.what();
  }
  if (!why.empty()) {
    invalid(why);
    return std::nullopt;
  }
  hits++;
  return parts;
}

void enqueue(State::Pending p) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.qmu);
    if (!s.worker_started) {
      s.worker_started = true;
      std::thread(worker_loop).detach();
      std::atexit(flush_at_exit);
    }
    s.queue.push_back(std::move(p));
  }
  s.qcv.notify_one();
}

}  // namespace

std::optional<EntryFiles> fetch_entry(uint64_t key) {
  State& s = state();
  EntryFiles e;
  auto parts = fetch_parts(
      "kernel", key, 3,
      [&](std::vector<std::string>& p) {
        e = EntryFiles{key, std::move(p[0]), std::move(p[1]), std::move(p[2])};
        return verify_entry(e);
      },
      s.hits, s.misses);
  if (!parts) return std::nullopt;
  return e;
}

std::optional<ProgramEntry> fetch_program(uint64_t key) {
  State& s = state();
  ProgramEntry e;
  auto parts = fetch_parts(
      "program", key, 2,
      [&](std::vector<std::string>& p) {
        e = ProgramEntry{key, std::move(p[0]), std::move(p[1])};
        return verify_program_entry(e);
      },
      s.program_hits, s.program_misses);
  if (!parts) return std::nullopt;
  return e;
}

void publish_program(ProgramEntry e) {
  if (!enabled()) return;
  const uint64_t key = e.key;
  enqueue({"program", key, [e = std::move(e)] { return encode_program(e); }});
}

void publish_entry(EntryFiles e) {
  if (!enabled()) return;
  const uint64_t key = e.key;
  enqueue({"kernel", key, [e = std::move(e)] { return encode_entry(e); }});
}

void flush() { flush_for(std::chrono::hours(1)); }

RemoteStats remote_stats() {
  State& s = state();
  RemoteStats r;
  r.hits = s.hits;
  r.misses = s.misses;
  r.writes = s.writes;
  r.already_present = s.present;
  r.invalid = s.invalid;
  r.failed = s.failed;
  r.program_hits = s.program_hits;
  r.program_misses = s.program_misses;
  return r;
}

void set_chunk_bytes(size_t bytes) { state().chunk = bytes; }

void reset() {
  flush();
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  {
    std::lock_guard<std::mutex> qlock(s.qmu);
    s.writer.reset();
  }
  s.reader.reset();
  s.configured = false;
  s.off = true;
  s.url = {};
  s.url_text.clear();
  s.warned_invalid.clear();
  s.failed = false;
  s.chunk = size_t{64} << 20;
  s.hits = s.misses = s.writes = s.present = s.invalid = 0;
}

}  // namespace protean::cache::remote
