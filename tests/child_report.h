// Runs part of a test in a forked child (to become another user, or to mount in its own
// mount namespace without touching the test process) and returns what the child reports.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <string>

namespace baton::testing_support {

// The string `body` returns in a forked child; "" when the child died before reporting.
inline std::string report_from_child(const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    const std::string report = body();
    for (size_t off = 0; off < report.size();) {
      const ssize_t w = ::write(fds[1], report.data() + off, report.size() - off);
      if (w <= 0) break;
      off += size_t(w);
    }
    std::_Exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, size_t(n));
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return report;
}

}  // namespace baton::testing_support
