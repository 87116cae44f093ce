// Whole files, read and written in one place: read_file (InputError naming the file when
// it cannot be read), and the durable atomic write every writer of baton's outputs uses
// (checkpoints, safetensors, plans, schedules, cost tables, traces, summaries): the bytes
// go to a temporary file in the same directory, which is fsynced and renamed over the
// target, and the directory is fsynced; a reader sees the old file or the whole new one,
// and once the call returns the new one survives a crash. Nothing half-written is left:
// on failure the temporary file is removed.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace baton::memory {

// The whole file. InputError "<path>: cannot open file (missing or unreadable)" or
// "<path>: read error".
std::string read_file(const std::string& path);

// Where write_file_durably's producer writes its bytes (in order, any number of pieces).
class FileSink {
 public:
  virtual ~FileSink() = default;
  virtual void write(const void* data, size_t n) = 0;
  void write(std::string_view s) { write(s.data(), s.size()); }
};

// Writes `content` to `path` durably and atomically. InputError when the file cannot be
// created (a directory that does not exist, no permission); RuntimeError when writing,
// syncing or renaming fails. A symbolic link's target is written; a path that is no
// regular file (/dev/null, a FIFO, a pipe) is written straight, neither atomically nor
// replaced.
void write_file_durably(const std::string& path, std::string_view content);
// The same with the content written by `produce` (large files: no copy in memory).
void write_file_durably(const std::string& path, const std::function<void(FileSink&)>& produce);

// fsync of a file or a directory (after creating or renaming entries in it).
// RuntimeError naming the path on failure.
void fsync_path(const std::string& path, bool directory);

}  // namespace baton::memory
