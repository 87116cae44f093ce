// A read-only memory mapping of a whole file: datasets of many gigabytes open without
// reading them, and the operating system pages in what a step samples.
//
// A file truncated in place while mapped (a tool that regenerates it with "wb") makes a read
// of a page past its new end raise SIGBUS. Every mapping is registered, and the first one
// installs a process-wide SIGBUS handler: a fault inside a registered mapping prints one line
// naming the file and exits 1; any other goes on to the handler installed before (UCX's, a
// sanitizer's, or the default).
#pragma once

#include <cstddef>
#include <string>

namespace baton::stages {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws InputError naming the file when it is missing, unreadable or not a regular file.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
  int slot_ = -1;  // in the registry of mappings the SIGBUS handler reads; -1: none
};

}  // namespace baton::stages
