// The directory store (src/distributed/file_store.h).
#include "distributed/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "protean/error.h"

namespace protean::distributed::detail {

namespace {

constexpr const char* kMagic = "PROTEAN-STORE";
constexpr int kVersion = 1;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string errno_text(int e) { return std::strerror(e); }

// Generations: the how-many-th FileStore this process made for (directory, run id, rank). Ranks make
// their groups in the same order (SPMD), so equal generations name the same group on every rank.
// Keyed by rank too, so that threads acting as ranks of one job in one process (tests) agree.
int next_generation(const std::string& dir, const std::string& run, int rank) {
  static std::mutex mu;
  static std::map<std::tuple<std::string, std::string, int>, int> counts;
  std::lock_guard<std::mutex> lock(mu);
  return counts[{dir, run, rank}]++;
}

std::atomic<uint64_t> g_tmp_counter{0};

}  // namespace

void check_run_id(const std::string& id, const std::string& where) {
  if (id.empty() || id.size() > 64)
    throw ValueError(fmt::format("{}: the run id must be 1 to 64 characters, got '{}'", where, id));
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok)
      throw ValueError(fmt::format("{}: the run id '{}' has the character '{}'; use only letters, digits, '_' and '-'",
                                   where, id, c));
  }
}

FileStore::FileStore(std::string dir, std::string run_id, int rank, int size)
    : dir_(std::move(dir)), run_(std::move(run_id)), rank_(rank), size_(size) {
  if (size_ < 1) throw ValueError(fmt::format("distributed store: the world size must be at least 1, got {}", size_));
  if (rank_ < 0 || rank_ >= size_)
    throw ValueError(fmt::format("distributed store: rank {} is not a rank of a world of {}", rank_, size_));
  check_run_id(run_, "distributed store");
  if (dir_.empty()) throw ValueError("distributed store: the store directory is empty");
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
    throw RuntimeError(fmt::format("distributed store: cannot create the store directory {}: {}", dir_, errno_text(errno)));
  struct stat st{};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw RuntimeError(fmt::format("distributed store: {} is not a directory", dir_));
  if (::access(dir_.c_str(), W_OK | X_OK) != 0)
    throw RuntimeError(fmt::format("distributed store: the store directory {} is not writable: {}", dir_, errno_text(errno)));
  gen_ = next_generation(dir_, run_, rank_);
  // Claim this rank of this group: one process per rank. O_EXCL makes the claim atomic, so a second
  // process started with the same rank and run id (two jobs given one --run-id, a rank started twice
  // by hand), or a rerun in a directory where a job with this run id ended badly, is an error here
  // instead of two writers of one rank's files. The claim goes with the group's other files.
  const std::string claim = file_path("rank", 0, rank_);
  const int fd = ::open(claim.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST)
    throw RuntimeError(fmt::format(
        "distributed store: rank {} of run {} (store group #{}) is already taken in the store {}: {} exists. Another "
        "process was started with PROTEAN_RANK={} and PROTEAN_RUN_ID={}, or a job with this run id ended badly and left "
        "its files; give every job a fresh run id (protean launch does unless --run-id is given) or remove the files "
        "{}/{}.*",
        rank_, run_, gen_, dir_, claim, rank_, run_, dir_, run_));
  if (fd < 0) throw RuntimeError(fmt::format("distributed store: cannot write {}: {}", claim, errno_text(errno)));
  const std::string who = fmt::format("{}\n", ::getpid());
  [[maybe_unused]] ssize_t n = ::write(fd, who.data(), who.size());
  ::close(fd);
}

FileStore::~FileStore() { close(); }

FileStore::Channel& FileStore::channel(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) throw RuntimeError(fmt::format("distributed store {}: used after it was closed", dir_));
  auto& c = channels_[name];
  if (!c) c = std::make_unique<Channel>();
  return *c;
}

uint64_t FileStore::next_seq(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = channels_.find(name);
  if (it == channels_.end()) return 0;
  std::lock_guard<std::mutex> ch_lock(it->second->mu);
  return it->second->seq;
}

std::string FileStore::file_path(const std::string& channel, uint64_t seq, int rank) const {
  return fmt::format("{}/{}.{}.{}.{}.{}", dir_, run_, gen_, channel, seq, rank);
}

void FileStore::write_file(const std::string& path, const std::string& channel, uint64_t seq,
                           const std::string& payload) const {
  std::string data = fmt::format("{} {} {} {} {} {} {} {} {} {:016x}\n", kMagic, kVersion, run_, gen_, channel, seq,
                                 rank_, size_, payload.size(), fnv1a(payload));
  data += payload;
  const size_t slash = path.rfind('/');
  const std::string tmp = fmt::format("{}/.{}.tmp.{}.{}", dir_, path.substr(slash + 1), ::getpid(),
                                      g_tmp_counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) throw RuntimeError(fmt::format("distributed store: cannot write {}: {}", tmp, errno_text(errno)));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw RuntimeError(fmt::format("distributed store: cannot write {}: {}", tmp, errno_text(e)));
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw RuntimeError(fmt::format("distributed store: cannot publish {}: {}", path, errno_text(e)));
  }
}

bool FileStore::read_file(const std::string& path, const std::string& channel, uint64_t seq, int rank,
                          std::string& payload) const {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    throw RuntimeError(fmt::format("distributed store: cannot read {}: {}", path, errno_text(errno)));
  }
  std::string data;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw RuntimeError(fmt::format("distributed store: cannot read {}: {}", path, errno_text(e)));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  auto corrupt = [&](const std::string& why) {
    return RuntimeError(fmt::format(
        "distributed store: the file {} (rank {}'s part of exchange {} on '{}') is corrupt: {}. Files in the store "
        "directory are written only by the ranks of this job; remove stray files or use a fresh directory",
        path, rank, seq, channel, why));
  };
  const size_t nl = data.find('\n');
  if (nl == std::string::npos) throw corrupt(fmt::format("no header line ({} bytes, truncated?)", data.size()));
  std::istringstream h(data.substr(0, nl));
  std::string magic, run, chan, sum;
  int version = 0, gen = -1, frank = -1, fsize = -1;
  uint64_t fseq = 0, bytes = 0;
  if (!(h >> magic >> version >> run >> gen >> chan >> fseq >> frank >> fsize >> bytes >> sum) || magic != kMagic)
    throw corrupt(fmt::format("the header '{}' is not a store header", data.substr(0, std::min<size_t>(nl, 120))));
  if (version != kVersion) throw corrupt(fmt::format("store format version {}, this build reads {}", version, kVersion));
  if (run != run_ || gen != gen_ || chan != channel || fseq != seq || frank != rank)
    throw corrupt(fmt::format("its header names run {} generation {} channel '{}' exchange {} rank {}", run, gen, chan,
                              fseq, frank));
  if (fsize != size_)
    throw RuntimeError(fmt::format(
        "distributed store {}: rank {} was started with a world size of {}, rank {} with {}; every rank of a job "
        "must have the same PROTEAN_WORLD_SIZE",
        dir_, rank, fsize, rank_, size_));
  const size_t have = data.size() - nl - 1;
  if (have != bytes) throw corrupt(fmt::format("the header says {} payload bytes, the file has {} (truncated?)", bytes, have));
  payload = data.substr(nl + 1);
  if (fmt::format("{:016x}", fnv1a(payload)) != sum) throw corrupt("the payload does not match its checksum");
  return true;
}

bool FileStore::all_gather(const std::string& name, const std::string& mine, double timeout_s,
                           std::vector<std::string>& out, std::vector<int>& missing) {
  Channel& ch = channel(name);
  std::lock_guard<std::mutex> lock(ch.mu);
  const uint64_t seq = ch.seq;
  write_file(file_path(name, seq, rank_), name, seq, mine);
  out.assign(static_cast<size_t>(size_), std::string());
  out[static_cast<size_t>(rank_)] = mine;
  std::vector<int> pending;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) pending.push_back(r);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  // Ranks that run in step (a data-parallel step exchanges at every compiled call) arrive within
  // microseconds of each other: poll with sched_yield for the first kSpin, then sleep, backing off
  // to kMaxPause. (Sleeping from the start, with pauses doubling to 1 ms, made each exchange cost up
  // to twice the ranks' arrival gap: two exchanges per step added ~0.4 ms to a 1.8 ms GPU step.)
  constexpr auto kSpin = std::chrono::microseconds(300);
  constexpr auto kMaxPause = std::chrono::microseconds(500);
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    for (size_t i = 0; i < pending.size();) {
      if (read_file(file_path(name, seq, pending[i]), name, seq, pending[i], out[static_cast<size_t>(pending[i])]))
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      else
        ++i;
    }
    const auto now = std::chrono::steady_clock::now();
    if (pending.empty() || now > deadline) break;
    if (now - start < kSpin) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    if (pause < kMaxPause) pause *= 2;
  }
  missing = pending;
  ch.seq = seq + 1;  // a timed-out exchange is not retried: the next one uses a fresh number
  if (!pending.empty()) return false;
  // Every rank has posted exchange `seq`, so every rank has read our file of `seq - 1`.
  if (seq > 0) ::unlink(file_path(name, seq - 1, rank_).c_str());
  return true;
}

void FileStore::close() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  try {
    write_file(file_path("done", 0, rank_), "done", 0, "");
    for (int r = 0; r < size_; ++r) {
      struct stat st{};
      if (::stat(file_path("done", 0, r).c_str(), &st) != 0) return;  // another rank cleans up
    }
    // Every rank has closed: delete this group's files (and temporaries a crash may have left).
    const std::string prefix = fmt::format("{}.{}.", run_, gen_);
    const std::string tmp_prefix = "." + prefix;
    DIR* d = ::opendir(dir_.c_str());
    if (!d) return;
    std::vector<std::string> victims;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind(prefix, 0) == 0 || n.rfind(tmp_prefix, 0) == 0) victims.push_back(dir_ + "/" + n);
    }
    ::closedir(d);
    for (const std::string& v : victims) ::unlink(v.c_str());
  } catch (...) {
    // Cleanup is best effort: a directory that vanished or turned read-only leaves files behind.
  }
}

}  // namespace protean::distributed::detail
