// Helpers for the libFuzzer targets (tests/fuzz/): each target feeds bytes to one parser
// of outside input. A parser may reject its input only with baton::InputError (the
// contract: bad input names where and what, exit code 2); any other exception, a crash,
// a leak or undefined behaviour is a finding.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// A directory of this process's own (under TMPDIR), for parsers that take a prefix or a
// directory rather than one file; removed when this object goes.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "baton-fuzz-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  // Writes `size` bytes as the file `name` in this directory (replacing it); its path.
  std::string write(const std::string& name, const void* data, size_t size) const {
    std::string p = path_ + "/" + name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), std::streamsize(size));
    if (!out.flush()) throw std::runtime_error("cannot write " + p);
    return p;
  }

 private:
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
