#include "core/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <set>

#include "protean/error.h"

namespace protean::core {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISREG(m)) return "a regular file";
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, std::string_view what, const std::string& why) {
  throw RuntimeError(fmt::format("cannot open {} '{}': {}", what, path, why));
}

std::string errno_text(int e) {
  if (e == ENOENT || e == ENOTDIR) return "no such file";
  if (e == EACCES || e == EPERM) return "permission denied";
  return std::strerror(e);
}

}  // namespace

std::string file_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "missing";
  return kind_of(st.st_mode);
}

uint64_t require_regular_file(const std::string& path, std::string_view what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) refuse(path, what, errno_text(errno));
  if (!S_ISREG(st.st_mode)) refuse(path, what, "it is " + kind_of(st.st_mode) + ", not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

int open_regular_file(const std::string& path, std::string_view what, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) refuse(path, what, errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    refuse(path, what, errno_text(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(path, what, "it is " + kind_of(st.st_mode) + ", not a regular file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  uint64_t size = 0;
  int fd = open_regular_file(path, what, &size);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (size > max_bytes)
    refuse(path, what, fmt::format("it has {} bytes, more than the {} this reader accepts", size, max_bytes));
  std::string out(static_cast<size_t>(size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) refuse(path, what, errno_text(errno));
    if (n == 0) break;  // shrank while read
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

FileLock::FileLock(const std::string& path, std::string_view what) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd_ < 0) throw RuntimeError(fmt::format("{}: cannot open the lock file {}: {}", what, path, std::strerror(errno)));
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd_);
    throw RuntimeError(fmt::format("{}: cannot lock {}: {}", what, path, std::strerror(e)));
  }
}

FileLock::~FileLock() {
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

int64_t remove_dir_entries(const std::string& dir, std::string_view counted_ext, std::string* failed) {
  namespace fs = std::filesystem;
  int64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code rec;
    fs::remove_all(e.path(), rec);
    if (rec) {
      if (failed->empty()) *failed = fmt::format("{}: {}", e.path().string(), rec.message());
      continue;
    }
    if (e.path().extension() == counted_ext) ++n;
  }
  return n;
}

namespace {

/// Whether `name` ends in ".tmp.<digits>.<digits>" after a non-empty stem (write_file_atomic's form).
bool is_atomic_temporary(std::string_view name) {
  auto digits_before = [&](size_t end) -> size_t {  // start of the run of digits ending at `end`
    size_t i = end;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') --i;
    return i;
  };
  const size_t n = name.size(), b = digits_before(n);
  if (b == n || b == 0 || name[b - 1] != '.') return false;
  const size_t a = digits_before(b - 1);
  if (a == b - 1) return false;
  return a > 5 && name.substr(a - 5, 5) == ".tmp.";
}

/// Sweeps the directory of `path` once per process (the first write into it).
void sweep_directory_once(const std::string& path) {
  static std::mutex& mu = *new std::mutex;                 // never destroyed: writes may run at exit
  static auto& swept = *new std::set<std::string>;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!swept.insert(dir).second) return;
  }
  remove_stale_temporaries(dir);
}

}  // namespace

int64_t remove_stale_temporaries(const std::string& dir, std::chrono::seconds min_age) {
  namespace fs = std::filesystem;
  int64_t removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& e = *it;
    std::error_code fec;
    if (!is_atomic_temporary(e.path().filename().string()) || !e.is_regular_file(fec) || fec) continue;
    const auto t = fs::last_write_time(e.path(), fec);
    if (fec || now - t < min_age) continue;
    if (fs::remove(e.path(), fec) && !fec) ++removed;
  }
  return removed;
}

void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what, bool durable) {
  write_file_atomic(path, {bytes}, what, durable);
}

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces, std::string_view what,
                       bool durable) {
  sweep_directory_once(path);
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, static_cast<long>(::getpid()), counter.fetch_add(1));
  auto fail = [&](int err, int fd) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw RuntimeError(fmt::format("{}: cannot write '{}': {}", what, path, std::strerror(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int e = errno;
    throw RuntimeError(fmt::format("{}: cannot write '{}': {}", what, path, std::strerror(e)));
  }
  for (std::string_view bytes : pieces) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(n < 0 ? errno : ENOSPC, fd);
      off += static_cast<size_t>(n);
    }
  }
  if (durable && ::fsync(fd) != 0) fail(errno, fd);
  if (::close(fd) != 0) fail(errno, -1);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(errno, -1);
}

std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%S", &tm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(ms));
}

std::string backup_corrupt_file(const std::string& path, std::string_view what) {
  const std::string base = path + ".corrupt-" + utc_timestamp();
  std::string target = base;
  for (int i = 1; std::filesystem::exists(target); ++i) target = fmt::format("{}-{}", base, i);
  if (::rename(path.c_str(), target.c_str()) != 0)
    throw RuntimeError(fmt::format("{}: cannot back up '{}' as '{}': {}", what, path, target, std::strerror(errno)));
  return target;
}

}  // namespace protean::core
