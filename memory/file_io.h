// Whole files, read and written in one place: read_file (InputError naming the file when
// it cannot be read), the opening of a regular file that never blocks on a FIFO, and the
// durable atomic write every writer of baton's outputs uses
// (checkpoints, safetensors, plans, schedules, cost tables, traces, summaries): the bytes
// go to a temporary file in the same directory, which is fsynced and renamed over the
// target, and the directory is fsynced; a reader sees the old file or the whole new one,
// and once the call returns the new one survives a crash. Nothing half-written is left:
// on failure the temporary file is removed.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace baton::memory {

// The whole file. InputError "<path>: cannot open file (missing or unreadable)" or
// "<path>: read error". A pipe or a FIFO is read too (a file named on the command line:
// `--model <(...)`, a shell's process substitution); a directory is refused.
std::string read_file(const std::string& path);

// The whole file, which must be a regular file: what baton finds inside a directory it
// was given (a Hugging Face model's config.json, a checkpoint's manifest, images.npy),
// where a FIFO is no file to wait on. Errors as open_regular_file's.
std::string read_regular_file(const std::string& path);

// A descriptor (close-on-exec, blocking) of the regular file `path`, open for reading.
// InputError "<path>: cannot open file (not a regular file: a FIFO)" for a FIFO, a
// directory, a device or a socket, without blocking (opening a FIFO waits for a writer:
// a run that hung for ever); "<path>: cannot open file (missing or unreadable): <reason>".
int open_regular_file(const std::string& path);

// Throws open_regular_file's InputError when `path` exists and is no regular file: for a
// library that opens the path itself. A missing file is left to the caller.
void check_regular_file(const std::string& path);

// What a file of mode `m` is, for messages: "a regular file", "a directory", "a FIFO", ...
std::string file_kind(mode_t m);

// Where write_file_durably's producer writes its bytes (in order, any number of pieces).
class FileSink {
 public:
  virtual ~FileSink() = default;
  virtual void write(const void* data, size_t n) = 0;
  void write(std::string_view s) { write(s.data(), s.size()); }
};

// Writes `content` to `path` durably and atomically. InputError when what the user named
// is no file to write (a directory that does not exist, no permission, a name too long, a
// symbolic link loop); RuntimeError when the disk fails the run: creating the file (no
// space, no inodes left, a read-only file system), writing, syncing or renaming it. Errors
// name `path` (the temporary file as well where it was that failed). A symbolic link's
// target is written (the link stays a link, a dangling one gets its file). /dev/stdout,
// /dev/stderr, /dev/fd/N and /proc/self/fd/N are written through that descriptor of
// this process (appending to what the shell redirected it to, never replacing it); a path
// that is no regular file (/dev/null, a FIFO) is written straight, neither atomically nor
// replaced.
void write_file_durably(const std::string& path, std::string_view content);

// The descriptor a path names: /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N
// (and /proc/<our pid>/fd/N); -1 for any other path. Such a path is written through the
// descriptor itself: following it to a file and renaming over that file replaced what
// the shell had redirected into (`>> app.log` lost its earlier lines, later output went
// to a deleted file).
int descriptor_of(const std::string& path);
// The same with the content written by `produce` (large files: no copy in memory).
void write_file_durably(const std::string& path, const std::function<void(FileSink&)>& produce);

// `path` with its symbolic links followed, link by link (to the file a write to `path`
// writes, which may not exist yet). InputError naming `path` for a symbolic link loop.
std::string resolve_links(const std::string& path);

// The name of a temporary file beside `path` (same directory) ending in `suffix`:
// `path` + `suffix`, or, where that name would pass NAME_MAX, a short hidden name made of
// a hash of `path`'s name, so that any legal file name can be written. The same for the
// same arguments.
std::string temp_path_beside(const std::string& path, const std::string& suffix);

// fsync of a file or a directory (after creating or renaming entries in it).
// RuntimeError naming the path on failure.
void fsync_path(const std::string& path, bool directory);

// Paths a command is writing that a stop signal ending the process would leave behind (a
// temporary beside its final name, a staging directory): registered while one lives, and
// removed by remove_on_stop() (the signal watcher, engine::watch_stop_signals, before the
// signal's default action ends the process). `trees` are removed whole, `empty_dirs` only
// when empty (a directory the command created for its output).
class RemoveOnStop {
 public:
  explicit RemoveOnStop(std::vector<std::string> trees, std::vector<std::string> empty_dirs = {});
  ~RemoveOnStop();
  RemoveOnStop(const RemoveOnStop&) = delete;
  RemoveOnStop& operator=(const RemoveOnStop&) = delete;

 private:
  uint64_t id_;
};
// Removes every registered path that exists; returns those removed. `for_good` (the signal
// watcher, about to end the process): the registry stays locked after, so a command
// ending a RemoveOnStop waits there rather than going on past what was removed (an
// export had then started its swap and lost the earlier export's config.json).
std::vector<std::string> remove_on_stop(bool for_good = false);

}  // namespace baton::memory
