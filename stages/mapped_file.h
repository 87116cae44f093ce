// A read-only memory mapping of a whole file: datasets of many gigabytes open without
// reading them, and the operating system pages in what a step samples.
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
};

}  // namespace baton::stages
