#include "stages/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "memory/error.h"
#include "memory/file_io.h"
#include "stages/json_reader.h"

namespace baton::stages {

namespace {

// The safetensors library refuses headers above 100 MB; so does baton.
constexpr uint64_t kMaxHeader = 100'000'000;

struct DtypeInfo {
  const char* name;
  size_t size;
};
constexpr DtypeInfo kDtypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1},
                                 {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                                 {"BF16", 2},    {"I32", 4}, {"U32", 4}, {"F32", 4},
                                 {"F64", 8},     {"I64", 8}, {"U64", 8}};

std::string errno_text() {
  return std::strerror(errno);
}

// A dimension or a byte offset: an integer written in digits. A float is refused even when
// whole (256.0), as the safetensors library does ("expected usize").
int64_t size_number(const JsonReader& r, int64_t max) {
  if (r.raw().is_number_float()) r.fail("an integer >= 0 (no '.' nor exponent)");
  return r.as_int(0, max);
}

}  // namespace

bool safetensors_dtype(const std::string& name, DType& out) {
  if (name == "F32")
    out = DType::f32;
  else if (name == "F64")
    out = DType::f64;
  else if (name == "BF16")
    out = DType::bf16;
  else if (name == "F16")
    out = DType::f16;
  else if (name == "I32")
    out = DType::i32;
  else if (name == "I64")
    out = DType::i64;
  else
    return false;
  return true;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  // A FIFO is refused, not waited on (a directory's model.safetensors that hung for ever).
  fd_ = memory::open_regular_file(path);
  try {
    struct stat st {};
    if (fstat(fd_, &st) != 0) throw InputError(path + ": cannot stat: " + errno_text());
    file_size_ = uint64_t(st.st_size);
    if (file_size_ < 8)
      throw InputError(path + ": truncated safetensors file: " + std::to_string(file_size_) +
                       " bytes, expected at least the 8-byte header length");
    unsigned char len_bytes[8];
    read_bytes(0, len_bytes, 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
    if (n > kMaxHeader)
      throw InputError(path + ": safetensors header length " + std::to_string(n) +
                       " bytes is above the 100 MB limit (not a safetensors file?)");
    if (n > file_size_ - 8)
      throw InputError(path + ": safetensors header length " + std::to_string(n) +
                       " bytes runs past the end of the file (" + std::to_string(file_size_) +
                       " bytes): truncated or not a safetensors file");
    std::string header(size_t(n), '\0');
    read_bytes(8, header.data(), size_t(n));
    data_start_ = 8 + n;
    if (header.empty() || header[0] != '{')
      throw InputError(path + ": safetensors header does not start with '{'");
    json j = memory::parse_json_text(header, path + " (safetensors header)");
    JsonReader root(j, path + " (safetensors header)");
    root.expect_object();
    uint64_t data_size = file_size_ - data_start_;
    for (const std::string& key : root.keys()) {
      JsonReader e = root.at(key);
      if (key == "__metadata__") {
        e.expect_object();
        for (const std::string& mk : e.keys()) metadata_[mk] = e.at(mk).as_string();
        continue;
      }
      e.expect_only({"dtype", "shape", "data_offsets"});
      SafetensorsEntry entry;
      entry.name = key;
      entry.dtype = e.at("dtype").as_string();
      const DtypeInfo* info = nullptr;
      for (const DtypeInfo& d : kDtypes)
        if (entry.dtype == d.name) info = &d;
      if (info == nullptr) e.at("dtype").fail("a safetensors dtype (F32, F16, BF16, I64, ...)");
      entry.element_size = info->size;
      JsonReader shape = e.at("shape");
      uint64_t numel = 1;
      for (const JsonReader& d : shape.items()) {
        int64_t v = size_number(d, int64_t(1) << 48);
        entry.shape.push_back(v);
        if (v != 0 && numel > (uint64_t(1) << 62) / uint64_t(v)) d.fail("a shape of sane size");
        numel *= uint64_t(v);
      }
      JsonReader off = e.at("data_offsets");
      if (off.size() != 2) off.fail("[begin, end]");
      entry.begin = uint64_t(size_number(off.at(size_t(0)), INT64_MAX));
      entry.end = uint64_t(size_number(off.at(size_t(1)), INT64_MAX));
      if (entry.end < entry.begin)
        off.fail("begin <= end",
                 "[" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]");
      if (entry.end > data_size)
        throw InputError(path + ": tensor '" + key + "': data_offsets [" +
                         std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                         ") run past the end of the data (" + std::to_string(data_size) +
                         " bytes): truncated file or lying header");
      uint64_t expect = numel * info->size;
      if (entry.bytes() != expect)
        throw InputError(path + ": tensor '" + key + "': " + entry.dtype + " " +
                         memory::shape_str(entry.shape) + " needs " + std::to_string(expect) +
                         " bytes but data_offsets span " + std::to_string(entry.bytes()));
      entries_.push_back(std::move(entry));
    }
    std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    for (size_t i = 0; i < entries_.size(); ++i) {
      const SafetensorsEntry& e = entries_[i];
      if (e.begin < pos)
        throw InputError(path + ": tensor '" + e.name + "' [" + std::to_string(e.begin) + ", " +
                         std::to_string(e.end) + ") overlaps tensor '" + entries_[i - 1].name +
                         "' (ends at " + std::to_string(pos) + ")");
      if (e.begin > pos)
        throw InputError(path + ": " + std::to_string(e.begin - pos) + " bytes before tensor '" +
                         e.name + "' at " + std::to_string(pos) +
                         " belong to no tensor (safetensors data has no gaps)");
      pos = e.end;
      index_[e.name] = i;
    }
    if (pos != data_size)
      throw InputError(path + ": " + std::to_string(data_size - pos) +
                       " bytes after the last tensor belong to no tensor (data is " +
                       std::to_string(data_size) + " bytes, tensors end at " + std::to_string(pos) +
                       ")");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

void SafetensorsReader::read_bytes(uint64_t off, void* dst, size_t n) const {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd_, p, n, off_t(off));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw InputError(path_ + ": read error: " + errno_text());
    }
    if (got == 0)
      throw InputError(path_ + ": unexpected end of file at byte " + std::to_string(off));
    p += got;
    off += uint64_t(got);
    n -= size_t(got);
    bytes_read_ += uint64_t(got);
  }
}

Tensor SafetensorsReader::read(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  if (e == nullptr) throw InputError(path_ + ": no tensor named '" + name + "'");
  DType d;
  if (!safetensors_dtype(e->dtype, d))
    throw InputError(path_ + ": tensor '" + name + "' has dtype " + e->dtype +
                     ", which baton cannot load (F32, F64, BF16, F16, I32, I64)");
  Tensor t = Tensor::empty(e->shape, d);
  read_bytes(data_start_ + e->begin, t.raw_data(), size_t(e->bytes()));
  return t;
}

void SafetensorsReader::read_block(const SafetensorsEntry& e, const Shape& offsets,
                                   Tensor& out) const {
  BATON_CHECK(offsets.size() == e.shape.size() && out.dim() == int64_t(e.shape.size()),
              "read_block rank mismatch for " + e.name);
  BATON_CHECK(out.is_contiguous() && out.device().is_cpu(), "read_block into " + out.str());
  BATON_CHECK(memory::dtype_size(out.dtype()) == e.element_size, "read_block dtype of " + e.name);
  for (size_t d = 0; d < offsets.size(); ++d)
    BATON_CHECK(offsets[d] >= 0 && offsets[d] + out.size(int64_t(d)) <= e.shape[d],
                "read_block outside " + e.name);
  if (out.numel() == 0) return;
  // Runs of the innermost dimensions that are whole are read in one go.
  size_t rank = e.shape.size();
  size_t inner = rank;  // dims [inner, rank) are read whole
  uint64_t run = e.element_size;
  while (inner > 0 && offsets[inner - 1] == 0 &&
         out.size(int64_t(inner - 1)) == e.shape[inner - 1]) {
    run *= uint64_t(e.shape[inner - 1]);
    --inner;
  }
  if (inner > 0) run *= uint64_t(out.size(int64_t(inner - 1)));  // partial dim: a contiguous run
  Shape stride = memory::contiguous_strides(e.shape);
  char* dst = static_cast<char*>(out.raw_data());
  // Iterate over the outer index space [0, inner - 1).
  size_t outer_rank = inner > 0 ? inner - 1 : 0;
  Shape idx(outer_rank, 0);
  while (true) {
    uint64_t elem = 0;
    for (size_t d = 0; d < outer_rank; ++d)
      elem += uint64_t(offsets[d] + idx[d]) * uint64_t(stride[d]);
    if (inner > 0) elem += uint64_t(offsets[inner - 1]) * uint64_t(stride[inner - 1]);
    read_bytes(data_start_ + e.begin + elem * e.element_size, dst, size_t(run));
    dst += run;
    size_t d = outer_rank;
    while (d > 0) {
      --d;
      if (++idx[d] < out.size(int64_t(d))) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (outer_rank == 0) return;
  }
}

// Durably and atomically (memory::write_file_durably): a reader sees the old file or the
// whole new one, so callers need no temporary name of their own.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsOut> entries;
  for (const NamedTensor& nt : tensors)
    entries.push_back({nt.name, nt.tensor.dtype(), nt.tensor.shape()});
  write_safetensors(
      path, entries,
      [&](size_t i) { return tensors[i].tensor.to_staging(tensors[i].tensor.dtype()); }, metadata);
}

std::string safetensors_prefix(const std::vector<SafetensorsOut>& entries,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t pos = 0;
  for (const SafetensorsOut& e : entries) {
    BATON_CHECK(e.name != "__metadata__" && !header.contains(e.name),
                "bad or repeated tensor name " + e.name);
    uint64_t n = uint64_t(memory::shape_numel(e.shape)) * memory::dtype_size(e.dtype);
    header[e.name] = {{"dtype", std::string(memory::safetensors_dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {pos, pos + n}}};
    pos += n;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return prefix + text;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOut>& entries,
                       const std::function<Tensor(size_t)>& bytes,
                       const std::map<std::string, std::string>& metadata) {
  const std::string prefix = safetensors_prefix(entries, metadata);
  memory::write_file_durably(path, [&](memory::FileSink& out) {
    out.write(prefix);
    for (size_t i = 0; i < entries.size(); ++i) {
      const Tensor t = bytes(i);
      BATON_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dtype() == entries[i].dtype &&
                      t.shape() == entries[i].shape,
                  "write_safetensors: the bytes of " + entries[i].name + " are " + t.str());
      out.write(t.raw_data(), t.nbytes());
    }
  });
}

}  // namespace baton::stages
