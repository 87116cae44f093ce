// A reader called on a FIFO from a test: the InputError it throws, or a failure when it
// blocks (opening a FIFO waits for a writer), reported instead of hanging the test: the
// FIFO is then opened for writing and closed, which lets the reader go on.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <future>
#include <string>

#include "memory/error.h"

namespace baton::testing_support {

// The message of the InputError `read` throws ("" when none); "blocked on the FIFO" when
// it waited for a writer for 2 s.
inline std::string input_error_reading_fifo(const std::string& fifo,
                                            const std::function<void()>& read) {
  auto done = std::async(std::launch::async, [&]() -> std::string {
    try {
      read();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  });
  bool blocked = false;
  while (done.wait_for(std::chrono::seconds(2)) == std::future_status::timeout) {
    blocked = true;
    // A reader waits in open(): a writer's open succeeds, and the close is its end of file.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  const std::string error = done.get();
  return blocked ? "blocked on the FIFO (then: " + error + ")" : error;
}

}  // namespace baton::testing_support
