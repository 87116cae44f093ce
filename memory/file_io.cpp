#include "memory/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "memory/error.h"

namespace baton::memory {

namespace fs = std::filesystem;

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// An open() that fails for what the user named (a directory that does not exist, no
// permission, a name too long) is bad input; one that fails for the state of the disk
// (no space, no inodes, quota, I/O error, read-only file system, no descriptors left)
// is a failure of the run, which --max-restarts may retry.
[[noreturn]] void throw_open_error(const std::string& what) {
  const int e = errno;
  const std::string msg = what + ": " + std::strerror(e);
  switch (e) {
    case ENOENT:
    case ENOTDIR:
    case EACCES:
    case EPERM:
    case EISDIR:
    case ENAMETOOLONG:
    case ELOOP:
    case ENXIO:
      throw InputError(msg);
    default:
      throw RuntimeError(msg);
  }
}

class FdSink : public FileSink {
 public:
  // `what` names the output (and the temporary file written for it) in errors.
  FdSink(int fd, std::string what) : fd_(fd), what_(std::move(what)) {}
  void write(const void* data, size_t n) override {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw RuntimeError(what_ + ": write error: " + errno_text());
      }
      p += w;
      n -= size_t(w);
    }
  }

 private:
  int fd_;
  std::string what_;
};

void write_to_descriptor(int fd, const std::string& path,
                         const std::function<void(FileSink&)>& produce) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) == O_RDONLY)
    throw InputError(path + ": cannot write: descriptor " + std::to_string(fd) +
                     (flags < 0 ? " is not open" : " is open for reading only"));
  FdSink sink(fd, path);
  produce(sink);
  // A file the descriptor was redirected to is synced; a pipe or a terminal cannot be.
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::fsync(fd) != 0)
    throw RuntimeError(path + ": fsync failed: " + errno_text());
}

}  // namespace

int descriptor_of(const std::string& path) {
  if (path == "/dev/stdout") return 1;
  if (path == "/dev/stderr") return 2;
  for (const std::string& dir :
       {std::string("/dev/fd/"), std::string("/proc/self/fd/"),
        std::string("/proc/thread-self/fd/"), "/proc/" + std::to_string(::getpid()) + "/fd/"}) {
    if (path.size() <= dir.size() || path.compare(0, dir.size(), dir) != 0) continue;
    const std::string n = path.substr(dir.size());
    if (n.size() > 9 || n.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(n);
  }
  return -1;
}

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
  if (fd < 0)
    throw InputError(path + ": cannot open file (missing or unreadable): " + std::strerror(errno));
  return read_all(fd, path);
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(path + ": cannot open to fsync: " + errno_text());
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw RuntimeError(path + ": fsync failed: " + errno_text());
}

std::string resolve_links(const std::string& path) {
  // Read link by link: fs::weakly_canonical left a link whose target does not exist (yet)
  // unresolved, and the rename then replaced the link with a file.
  constexpr int kMaxLinks = 40;  // Linux's own limit (ELOOP)
  fs::path p = path;
  for (int i = 0; i <= kMaxLinks; ++i) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec)) || ec) return p.string();
    const fs::path target = fs::read_symlink(p, ec);
    if (ec)
      throw InputError(path + ": cannot read the symbolic link " + p.string() + ": " +
                       ec.message());
    // Relative to the link's directory; not normalised (a ".." after a linked directory
    // is the kernel's to resolve).
    p = target.is_absolute() || p.parent_path().empty() ? target : p.parent_path() / target;
  }
  throw InputError(path + ": symbolic link loop (more than " + std::to_string(kMaxLinks) +
                   " links), expected a link to a file");
}

std::string temp_path_beside(const std::string& path, const std::string& suffix) {
  const fs::path p(path);
  const std::string name = p.filename().string();
  if (name.size() + suffix.size() <= NAME_MAX) return path + suffix;
  // A long name (the system's limit is NAME_MAX bytes a name): its hash instead, hidden.
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(std::hash<std::string>{}(name)));
  return (p.parent_path() / ("." + std::string(hash) + suffix)).string();
}

void write_file_durably(const std::string& path_in, const std::function<void(FileSink&)>& produce) {
  if (const int fd = descriptor_of(path_in); fd >= 0)
    return write_to_descriptor(fd, path_in, produce);
  // A symbolic link: its target is the file written (the link stays a link).
  const std::string path = resolve_links(path_in);
  // What is not a regular file (a device such as /dev/null, a pipe, a FIFO) takes the
  // bytes as they come: renaming over it would replace it with a file.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw InputError(path_in + ": cannot write: a directory");
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) throw_open_error(path_in + ": cannot open for writing");
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
  // A file replaced keeps its permissions (a private file stays private, as cp and the
  // shell's > leave it); a new one gets 0666 less the umask, as they give it.
  const bool replacing = ::stat(path.c_str(), &st) == 0;
  static std::atomic<uint64_t> counter{0};
  // Unique per process and call: threads of one process may write one directory at once.
  const std::string tmp =
      temp_path_beside(path, ".tmp" + std::to_string(::getpid()) + "." + std::to_string(counter++));
  const std::string what = path_in + " (temporary file " + tmp + ")";
  // Created, renamed and synced relative to the directory: a legal path near PATH_MAX
  // leaves no room for the temporary suffix as a whole path.
  const fs::path full(path), tmp_name = fs::path(tmp).filename(), name = full.filename();
  const std::string dir = full.has_parent_path() ? full.parent_path().string() : ".";
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  // A directory we may write in but not read (mode 0333) opens only as a path: the file is
  // written and renamed all the same, and the directory, which cannot be synced, is not.
  const bool syncable = dir_fd >= 0;
  if (dir_fd < 0 && errno == EACCES) dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) throw_open_error(what + ": cannot create");
  int fd = -1;
  try {
    fd = ::openat(dir_fd, tmp_name.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) throw_open_error(what + ": cannot create");
    if (replacing && ::fchmod(fd, st.st_mode & 07777) != 0)
      throw RuntimeError(what + ": cannot give it the replaced file's mode: " + errno_text());
    FdSink sink(fd, what);
    produce(sink);
    if (::fsync(fd) != 0) throw RuntimeError(what + ": fsync failed: " + errno_text());
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw RuntimeError(what + ": close failed: " + errno_text());
    if (::renameat(dir_fd, tmp_name.c_str(), dir_fd, name.c_str()) != 0)
      throw RuntimeError(path_in + ": cannot rename " + tmp + " to " + path + ": " + errno_text());
    if (syncable && ::fsync(dir_fd) != 0)
      throw RuntimeError(dir + ": fsync failed: " + errno_text());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlinkat(dir_fd, tmp_name.c_str(), 0);
    ::close(dir_fd);
    throw;
  }
  ::close(dir_fd);
}

void write_file_durably(const std::string& path, std::string_view content) {
  write_file_durably(path, [&](FileSink& out) { out.write(content); });
}

namespace {
struct StopRemovals {
  std::mutex mutex;
  uint64_t next = 0;
  std::map<uint64_t, std::pair<std::vector<std::string>, std::vector<std::string>>> paths;
};
StopRemovals& stop_removals() {
  static StopRemovals r;
  return r;
}
}  // namespace

RemoveOnStop::RemoveOnStop(std::vector<std::string> trees, std::vector<std::string> empty_dirs) {
  StopRemovals& r = stop_removals();
  const std::lock_guard<std::mutex> lock(r.mutex);
  id_ = r.next++;
  r.paths[id_] = {std::move(trees), std::move(empty_dirs)};
}

RemoveOnStop::~RemoveOnStop() {
  StopRemovals& r = stop_removals();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.paths.erase(id_);
}

std::vector<std::string> remove_on_stop(bool for_good) {
  StopRemovals& r = stop_removals();
  std::unique_lock<std::mutex> lock(r.mutex);
  if (for_good) lock.release();  // never unlocked: the process ends
  std::vector<std::string> removed;
  for (const auto& [id, p] : r.paths) {
    std::error_code ec;
    for (const std::string& t : p.first)
      if (std::filesystem::remove_all(t, ec) > 0 && !ec) removed.push_back(t);
    for (const std::string& d : p.second)
      if (std::filesystem::remove(d, ec) && !ec) removed.push_back(d);
  }
  return removed;
}

}  // namespace baton::memory
