// The safetensors format, read and written by baton's own code: 8 bytes of header length
// (little-endian u64), a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the tensors' bytes. The reader trusts nothing: a truncated file,
// a header length beyond the file, a header that is not JSON, unknown dtypes, offsets
// outside the data, overlapping or gapped tensors and sizes that disagree with dtype x
// shape are all InputErrors naming the file, the tensor and the numbers.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "memory/tensor.h"

namespace baton::stages {

using memory::DType;
using memory::Shape;
using memory::Tensor;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;    // as written: "F32", "BF16", "U8", ...
  size_t element_size;  // bytes per element of that dtype
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the start of the data
  uint64_t bytes() const { return end - begin; }
};

class SafetensorsReader {
 public:
  // Opens the file and validates its whole header; throws InputError.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by offset
  const SafetensorsEntry* find(const std::string& name) const;               // null if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  uint64_t file_size() const { return file_size_; }

  // Reads a whole tensor into a new CPU tensor of its dtype (F32, F64, BF16, F16, I32,
  // I64; others are an InputError). Throws InputError when the name is absent.
  Tensor read(const std::string& name) const;
  // Reads a rectangular block [offsets, offsets + shape) of a tensor into `out` (a
  // contiguous CPU tensor of that shape and of the stored dtype): what a loader that
  // reshards needs. Reads only the rows it needs.
  void read_block(const SafetensorsEntry& e, const Shape& offsets, Tensor& out) const;
  // Bytes read from the file so far, header included: what tests of "a rank reads only
  // its blocks" count.
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  void read_bytes(uint64_t file_offset, void* dst, size_t n) const;
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, data_start_ = 0;
  mutable uint64_t bytes_read_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // any device and strides; written contiguous, little-endian
};

// Writes a safetensors file at `path` (overwriting it) and fsyncs it before returning.
// Tensors are laid out in the order given, each staged on the host (Tensor::to_staging,
// outside every allocator's cap) as it is written; the header is padded to 8 bytes.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor to write whose bytes are made while the file is written.
struct SafetensorsOut {
  std::string name;
  DType dtype;
  Shape shape;
};
// The same, one tensor in memory at a time: `bytes(i)` gives entry i's bytes (a contiguous
// CPU tensor of its dtype and shape), written and dropped before the next is asked for.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& entries,
                       const std::function<Tensor(size_t)>& bytes,
                       const std::map<std::string, std::string>& metadata);

// The bytes write_safetensors puts before the tensors' bytes: the header's length (8 bytes,
// little-endian) and the header, padded to 8 bytes.
std::string safetensors_prefix(const std::vector<SafetensorsOut>& entries,
                               const std::map<std::string, std::string>& metadata);

// Converts a memory::DType to its safetensors name and back ("F32" <-> f32).
bool safetensors_dtype(const std::string& name, DType& out);

}  // namespace baton::stages
