#include "memory/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

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

std::string read_file(const std::string& path) {
  // A directory opens, and reads as nothing: "not valid JSON: unexpected end of input".
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw InputError(path + ": a directory, expected a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open file (missing or unreadable)");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read error");
  return ss.str();
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
