#include "io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace flashmap {

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

}  // namespace

void check_json_depth(std::string_view text, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      FLASHMAP_CHECK(++depth <= kMaxJsonDepth, "{}: JSON nested deeper than {} levels", what,
                     kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

int open_regular_file(const std::string& path) {
  struct stat st {};
  FLASHMAP_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot open ({})", path,
                 std::strerror(errno));
  FLASHMAP_CHECK(S_ISREG(st.st_mode), "{}: not a regular file ({})", path, file_kind(st.st_mode));
  // O_NONBLOCK: should a FIFO have replaced the file since stat(), open() still returns.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  FLASHMAP_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(fmt::format("{}: not a regular file", path));
  }
  // Regular files ignore O_NONBLOCK; clear it anyway so that reads mean what they say.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  const int fd = open_regular_file(path);
  std::string out;
  try {
    struct stat st {};
    FLASHMAP_CHECK(::fstat(fd, &st) == 0, "{}: cannot stat ({})", path, std::strerror(errno));
    FLASHMAP_CHECK(size_t(st.st_size) <= max_bytes,
                   "{}: {} bytes, more than the {} this file may have", path, st.st_size,
                   max_bytes);
    out.resize(size_t(st.st_size));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
      if (n < 0 && errno == EINTR) continue;
      FLASHMAP_CHECK(n >= 0, "{}: read failed ({})", path, std::strerror(errno));
      if (n == 0) break;  // the file shrank while being read
      got += size_t(n);
    }
    out.resize(got);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

std::string cache_dir() {
  if (const char* d = std::getenv("FLASHMAP_CACHE_DIR")) {
    if (std::string(d) == "off") return "";
    if (*d) return d;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (std::filesystem::path(x) / "flashmap").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (std::filesystem::path(h) / ".cache" / "flashmap").string();
  return "";
}

std::string read_input_file(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FLASHMAP_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
  std::string out;
  try {
    struct stat st {};
    FLASHMAP_CHECK(::fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode), "{}: cannot read ({})", path,
                   S_ISDIR(st.st_mode) ? "a directory" : std::strerror(errno));
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      FLASHMAP_CHECK(n >= 0, "{}: read failed ({})", path, std::strerror(errno));
      if (n == 0) break;
      FLASHMAP_CHECK(out.size() + size_t(n) <= max_bytes, "{}: more than the {} bytes it may have",
                     path, max_bytes);
      out.append(buf, size_t(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  // O_EXCL on a name of this process's own: two writers of the same file (two threads, two
  // processes) never share a temporary file. Mode 0666 less the umask, as a plain create gives.
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0; fd_ < 0; ++attempt) {
    tmp_ = fmt::format("{}.tmp-{}-{}", path_, ::getpid(), counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || attempt > 100)) {
      const int e = errno;
      tmp_.clear();
      throw Error(fmt::format("{}: cannot write ({})", path_, std::strerror(e)));
    }
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what) {
  const int e = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
  throw Error(fmt::format("{}: {} ({})", path_, what, std::strerror(e)));
}

void AtomicFile::write(const void* data, size_t n) {
  FLASHMAP_CHECK(fd_ >= 0, "{}: write after the file was finished", path_);
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("cannot write");
    if (w == 0) {
      errno = ENOSPC;
      fail("cannot write");
    }
    p += w;
    n -= size_t(w);
  }
}

void AtomicFile::commit() {
  FLASHMAP_CHECK(fd_ >= 0, "{}: the file was already finished", path_);
  // fsync before the rename: otherwise a crash soon after can leave an empty or partial file
  // under the final name on file systems that delay writing the data (ext4, xfs).
  if (::fsync(fd_) != 0) fail("cannot write");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot write");
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail("cannot rename the finished file into place");
  tmp_.clear();
}

}  // namespace flashmap
