// The `baton` command: dispatches to a sub-command and turns errors into exit codes
// (2: bad input, 1: failure at run time).
#include <fcntl.h>
#include <poll.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "engine/loop.h"
#include "kernels/ops.h"
#include "memory/error.h"
#include "tools/command.h"
#include "tools/cpu_check.h"
#include "transport/launch.h"
#include "transport/ucx.h"

namespace {

// To standard output when asked for (help), to standard error when the command line was wrong.
void print_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: baton <command> [options]   (baton <command> --help for its options)\n\n");
  std::fprintf(out, "commands:\n");
  for (const auto& c : baton::tools::commands())
    std::fprintf(out, "  %-12s %s\n", c.name.c_str(), c.summary.c_str());
}

// A command's output that did not reach standard output (a full disk, /dev/full) is a
// failure, as in coreutils: exit 1 rather than 0 with the output lost.
// Why standard output failed. stdio keeps no errno from the write that failed (later
// calls overwrite it), so where none is left the likely causes are looked at directly:
// a pipe whose reader has gone, a full file system.
std::string stdout_failure_reason(int err) {
  if (err != 0) return std::strerror(err);
  struct stat st {};
  if (::fstat(STDOUT_FILENO, &st) != 0) return std::strerror(errno);
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    pollfd p{STDOUT_FILENO, 0, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & POLLERR) != 0)
      return std::string(std::strerror(EPIPE)) + " (its reader has gone)";
  }
  // A device that refuses writes (/dev/full) says why when asked again: one byte, which
  // goes nowhere where the output already failed.
  if (S_ISCHR(st.st_mode) && ::write(STDOUT_FILENO, "\n", 1) < 0) return std::strerror(errno);
  struct statvfs fs {};
  if (S_ISREG(st.st_mode) && ::fstatvfs(STDOUT_FILENO, &fs) == 0) {
    if (fs.f_bavail == 0) return std::strerror(ENOSPC);
    if (fs.f_favail == 0 && fs.f_files != 0)
      return std::strerror(ENOSPC) + std::string(" (inodes)");
  }
  return "write error";
}

int check_stdout(const std::string& name, int code) {
  // The first flush does the write that fails (cout writes through stdout): its errno.
  errno = 0;
  std::cout.flush();
  int err = errno;
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (err == 0) err = errno;
  if (flushed && !std::ferror(stdout) && std::cout.good()) return code;
  std::fprintf(stderr, "baton%s%s: failed: writing standard output: %s\n", name.empty() ? "" : " ",
               name.c_str(), stdout_failure_reason(err).c_str());
  return code != 0 ? code : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed standard descriptor (`>&-`) is the number the next file opened gets: the
  // launcher had written its ranks' output into its own event descriptor. Each is held
  // by /dev/null opened the other way, so that using it fails (EBADF) as on a closed one.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      const int held = ::open("/dev/null", fd == 0 ? O_WRONLY : O_RDONLY);
      if (held >= 0 && held != fd) {
        ::dup2(held, fd);
        ::close(held);
      }
    }
  // Before the re-execution below: exec resets a handled signal to its default, and UCX's
  // handler had turned nohup's ignored SIGHUP into one that ends the ranks.
  baton::transport::release_ucx_debug_signal();  // a hangup ends baton, or nohup ignores it
  // It may execute baton again, which should start from nothing of ours; not for commands
  // that run no kernel (their children inherit the settings).
  {
    const std::string cmd = argc >= 2 ? argv[1] : "";
    const bool computes =
        !(cmd.empty() || cmd == "launch" || cmd == "help" || cmd == "--help" || cmd == "-h");
    baton::kernels::configure_cpu_runtime(argv, computes);
  }
  // Before any thread exists: SIGTERM and SIGINT reach train's watcher thread alone.
  // data prepare removes its temporary files when stopped so;
  // export and data train-tokenizer remove what they were writing when stopped so.
  if (argc >= 2 && (std::string(argv[1]) == "train" || std::string(argv[1]) == "data" ||
                    std::string(argv[1]) == "export"))
    baton::engine::watch_stop_signals();
  try {
    baton::tools::require_cpu_features();  // before any kernel's instructions run
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton: failed: %s\n", e.what());
    return 1;
  }
  // Log lines are diagnostics: standard output is left to what a command produces (a plan,
  // a report, generated text), to be piped or saved whole.
  // NO_COLOR (no-color.org), set to anything but "": plain text on a terminal too.
  const char* no_color = std::getenv("NO_COLOR");
  spdlog::set_default_logger(spdlog::stderr_color_mt(
      "baton", no_color != nullptr && *no_color != '\0' ? spdlog::color_mode::never
                                                        : spdlog::color_mode::automatic));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  if (argc < 2) {
    print_usage(stderr);
    return 2;
  }
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  // `baton help CMD` is `baton CMD --help`; `--version` is `baton version`.
  if (name == "help" && argc >= 3 && std::string(argv[2]) != "help") {
    name = argv[2];
    args = {"--help"};
  } else if (name == "help" || name == "--help" || name == "-h") {
    print_usage(stdout);
    return check_stdout("", 0);
  } else if (name == "--version" || name == "-V") {
    name = "version";
  }
  for (const auto& c : baton::tools::commands()) {
    if (c.name != name) continue;
    try {
      baton::kernels::cpu_sgemm();  // a bad BATON_SGEMM is exit 2 before any work
      const int code = c.run(args);
      return check_stdout(baton::tools::command_label(name), code);
    } catch (const baton::InputError& e) {
      baton::transport::report_failure(e);
      std::fprintf(stderr, "baton %s: error: %s\n", baton::tools::command_label(name).c_str(),
                   e.what());
      return 2;
    } catch (const std::exception& e) {
      // For `baton launch`'s summary: what failed (and which peer was lost, where).
      baton::transport::report_failure(e);
      std::fprintf(stderr, "baton %s: failed: %s\n", baton::tools::command_label(name).c_str(),
                   e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "baton: unknown command '%s'\n\n", name.c_str());
  print_usage(stderr);
  return 2;
}
