#include "memory/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "memory/error.h"

namespace baton::memory {

namespace fs = std::filesystem;

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// A temporary name next to `path`, unique per process and call (threads of one process
// may write different files of one directory at once).
std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

class FdSink : public FileSink {
 public:
  FdSink(int fd, const std::string& path) : fd_(fd), path_(path) {}
  void write(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw RuntimeError(path_ + ": write error: " + errno_text());
      }
      p += w;
      n -= size_t(w);
    }
  }

 private:
  int fd_;
  const std::string& path_;
};

std::string parent_dir(const std::string& path) {
  fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

std::string file_kind(mode_t m) {
  return S_ISREG(m)    ? "a regular file"
         : S_ISDIR(m)  ? "a directory"
         : S_ISFIFO(m) ? "a FIFO"
         : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
                       : "a special file";
}

namespace {
[[noreturn]] void not_regular(const std::string& path, mode_t m) {
  throw InputError(path + ": cannot open file (not a regular file: " + file_kind(m) + ")");
}
}  // namespace

void check_regular_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
}

int open_regular_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer; fstat
  // then sees what was opened (a stat before the open could be raced by a rename).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    // A directory cannot be opened for reading on some systems: named as one all the same.
    check_regular_file(path);
    throw InputError(path + ": cannot open file (missing or unreadable): " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(path + ": cannot open file (missing or unreadable): " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    not_regular(path, st.st_mode);
  }
  // Reads of a regular file never block anyway; cleared so the descriptor is an ordinary one.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

namespace {
// The rest of `fd` (closed here). InputError "<path>: read error" on failure.
std::string read_all(int fd, const std::string& path) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(path + ": read error: " + std::strerror(err));
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}
}  // namespace

std::string read_regular_file(const std::string& path) {
  return read_all(open_regular_file(path), path);
}

std::string read_file(const std::string& path) {
  // A directory opens, and reads as nothing: "not valid JSON: unexpected end of input".
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InputError(path + ": a directory, expected a file");
  // Blocking: a pipe or a FIFO named on the command line is read as the user asked.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open file (missing or unreadable)");
  return read_all(fd, path);
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(path + ": cannot open to fsync: " + errno_text());
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(path + ": fsync failed: " + errno_text());
}

void write_file_durably(const std::string& path_in, const std::function<void(FileSink&)>& produce) {
  // What is not a regular file (a device such as /dev/null, a pipe, a FIFO: /dev/fd/N of
  // a shell's process substitution) takes the bytes as they come: renaming over it would
  // replace it with a file.
  struct stat st;
  if (::stat(path_in.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw InputError(path_in + ": cannot write: a directory");
    int fd = ::open(path_in.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw InputError(path_in + ": cannot open for writing: " + errno_text());
    try {
      FdSink sink(fd, path_in);
      produce(sink);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) throw RuntimeError(path_in + ": close failed: " + errno_text());
    return;
  }
  // A symbolic link: its target is the file written (the link stays a link).
  std::string path = path_in;
  std::error_code link_ec;
  if (fs::is_symlink(fs::symlink_status(path_in, link_ec))) {
    const fs::path target = fs::weakly_canonical(fs::path(path_in), link_ec);
    if (!link_ec && !target.empty()) path = target.string();
  }
  const std::string tmp = temp_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw InputError(path + ": cannot open for writing: " + errno_text());
  try {
    FdSink sink(fd, tmp);
    produce(sink);
    if (::fsync(fd) != 0) throw RuntimeError(tmp + ": fsync failed: " + errno_text());
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw RuntimeError(tmp + ": close failed: " + errno_text());
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) throw RuntimeError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  fsync_path(parent_dir(path), true);
}

void write_file_durably(const std::string& path, std::string_view content) {
  write_file_durably(path, [&](FileSink& out) { out.write(content); });
}

}  // namespace baton::memory
