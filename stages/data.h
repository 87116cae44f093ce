// Byte-level training data from any file: every byte is a token (vocabulary 256). A
// step's global batch is a deterministic function of (seed, step, sample index): sample i
// of step s is the window starting at hash(seed, s, i) mod (size - window), so any split
// of the batch (micro-batches, data-parallel ranks) sees the same samples, and resuming
// at step s needs nothing but s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/tensor.h"

namespace baton::stages {

class ByteDataset {
 public:
  // Reads the whole file. Throws InputError when it is missing, unreadable or shorter than
  // one window of `min_window` + 1 bytes.
  ByteDataset(const std::string& path, int64_t min_window);
  explicit ByteDataset(std::string bytes, std::string name = "<memory>");

  const std::string& path() const { return path_; }
  int64_t size() const { return int64_t(bytes_.size()); }

  // Start offset of sample `index` of step `step` for windows of `window` tokens.
  int64_t sample_start(uint64_t seed, int64_t step, int64_t index, int64_t window) const;

  // Fills samples [first, first + n) of step `step`:
  // - tokens [n, T] with the window's bytes;
  // - targets [n, T] with the next byte of each position (language modelling), or
  //   targets [n] with the byte after the window (next-token prediction from a context).
  // Both are i32 or i64 CPU tensors allocated by the caller.
  void fill(uint64_t seed, int64_t step, int64_t first, int64_t n, memory::Tensor& tokens,
            memory::Tensor& targets) const;

 private:
  std::string path_;
  std::string bytes_;
};

}  // namespace baton::stages
