// Helpers for the libFuzzer targets (tests/fuzz/): each target feeds bytes to one parser
// of outside input. A parser may reject its input only with baton::InputError (the
// contract: bad input names where and what, exit code 2); any other exception, a crash,
// a leak or undefined behaviour is a finding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include "memory/error.h"

namespace baton::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// The bytes as a file for parsers that take a path: an anonymous in-memory file, named
// /proc/self/fd/N, closed when this object goes.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("baton-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) throw std::runtime_error("memfd_create failed");
    size_t off = 0;
    while (off < size) {
      ssize_t n = ::write(fd_, data + off, size - off);
      if (n <= 0) throw std::runtime_error("memfd write failed");
      off += size_t(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// Runs f; an InputError is the parser's proper answer to bad input, anything else
// escapes (and libFuzzer reports it).
template <class F>
void expect_only_input_errors(F&& f) {
  try {
    f();
  } catch (const InputError&) {
  }
}

}  // namespace baton::fuzz
