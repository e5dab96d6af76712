#include "core/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

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

void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view what, bool durable) {
  write_file_atomic(path, {bytes}, what, durable);
}

void write_file_atomic(const std::string& path, std::initializer_list<std::string_view> pieces, std::string_view what,
                       bool durable) {
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

}  // namespace protean::core
