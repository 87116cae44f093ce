#include "stages/token_store.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "memory/error.h"
#include "memory/file_io.h"

namespace baton::stages {

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype code, two counts

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // the index's arrays are not aligned (they start at byte 34)
  return v;
}

// Calls f(T{}) with the C++ type of a token type.
template <class F>
decltype(auto) visit(TokenType t, F&& f) {
  switch (t) {
    case TokenType::u8:
      return f(uint8_t{});
    case TokenType::i8:
      return f(int8_t{});
    case TokenType::i16:
      return f(int16_t{});
    case TokenType::i32:
      return f(int32_t{});
    case TokenType::i64:
      return f(int64_t{});
    case TokenType::f64:
      return f(double{});
    case TokenType::f32:
      return f(float{});
    case TokenType::u16:
      return f(uint16_t{});
    case TokenType::u32:
      return f(uint32_t{});
  }
  BATON_CHECK(false, "unknown token type");
}

// First index in p[0, n) whose value is not a whole number in [0, vocab); -1 if none.
// Blocks of min/max first (vectorised) so that a clean gigabyte scans at memory speed.
template <class T>
int64_t first_outside(const T* p, int64_t n, int64_t vocab) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const T* q = p + b;
    bool bad = false;
    if constexpr (std::is_floating_point_v<T>) {
      for (int64_t i = 0; i < m; ++i) {
        T v = q[i];
        bad |= !(v >= 0 && v < T(vocab) && v == std::floor(v));
      }
    } else {
      T lo = q[0], hi = q[0];
      for (int64_t i = 0; i < m; ++i) {  // branch-free: vectorised
        T v = q[i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
      bad = (std::is_signed_v<T> && lo < 0) || uint64_t(hi) >= uint64_t(vocab);
    }
    if (!bad) continue;
    for (int64_t i = 0; i < m; ++i) {
      double v = double(q[i]);
      if (!(v >= 0 && v < double(vocab) && v == std::floor(v))) return b + i;
    }
  }
  return -1;
}

std::string num(double v) {
  if (v == std::floor(v) && std::abs(v) < 9e15) return std::to_string(int64_t(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A token as written: an integer type's exactly (through a double, 9007199254740993 had
// read 9.00719925e+15), a float's as num gives it.
template <class T>
std::string token_text(T v) {
  if constexpr (std::is_floating_point_v<T>)
    return num(double(v));
  else
    return std::to_string(int64_t(v));
}

}  // namespace

size_t token_size(TokenType t) {
  return visit(t, [](auto x) { return sizeof x; });
}

std::string token_type_name(TokenType t) {
  switch (t) {
    case TokenType::u8:
      return "uint8";
    case TokenType::i8:
      return "int8";
    case TokenType::i16:
      return "int16";
    case TokenType::i32:
      return "int32";
    case TokenType::i64:
      return "int64";
    case TokenType::f64:
      return "float64";
    case TokenType::f32:
      return "float32";
    case TokenType::u16:
      return "uint16";
    case TokenType::u32:
      return "uint32";
  }
  return "?";
}

TokenType parse_token_type(const std::string& name, const std::string& what) {
  for (TokenType t : {TokenType::u8, TokenType::i8, TokenType::i16, TokenType::i32, TokenType::i64,
                      TokenType::f64, TokenType::f32, TokenType::u16, TokenType::u32})
    if (token_type_name(t) == name) return t;
  throw InputError(what + ": expected a token type (uint16, uint32, int32, ...), found '" + name +
                   "'");
}

uint8_t megatron_code(TokenType t) {
  BATON_CHECK(t != TokenType::u32, "uint32 has no Megatron dtype code");
  return uint8_t(t);
}

// ---- opening ----

std::shared_ptr<const TokenStore> TokenStore::open_megatron(const std::string& prefix) {
  std::shared_ptr<TokenStore> s(new TokenStore());
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  s->name_ = bin_path;
  s->format_ = "megatron";
  MappedFile idx(idx_path);
  s->bin_ = MappedFile(bin_path);
  const unsigned char* p = idx.data();
  const size_t size = idx.size();
  if (size < 9 || std::memcmp(p, kMagic, 9) != 0)
    throw InputError(idx_path +
                     ": not a Megatron indexed dataset: expected the header "
                     "\"MMIDIDX\\0\\0\" in its first 9 bytes");
  if (size < kHeader)
    throw InputError(idx_path + ": truncated: " + std::to_string(size) +
                     " bytes, expected at least " + std::to_string(kHeader) + " (the header)");
  const uint64_t version = load<uint64_t>(p + 9);
  if (version != 1)
    throw InputError(idx_path + ": version " + std::to_string(version) + ", expected 1");
  const uint8_t code = p[17];
  if (code < 1 || code > 8)
    throw InputError(idx_path + ": dtype code " + std::to_string(code) +
                     ", expected one of Megatron's codes 1..8");
  s->type_ = TokenType(code);
  const size_t k = token_size(s->type_);
  const uint64_t S = load<uint64_t>(p + 18), D = load<uint64_t>(p + 26);
  // The arrays: int32 lengths[S], int64 pointers[S], int64 document_indices[D], and for a
  // multimodal dataset int8 modes[S].
  const uint64_t limit = uint64_t(1) << 40;
  const uint64_t want = S < limit && D < limit ? kHeader + 12 * S + 8 * D : UINT64_MAX;
  if (want == UINT64_MAX || (size != want && size != want + S))
    throw InputError(idx_path + ": " + std::to_string(size) + " bytes, expected " +
                     (want == UINT64_MAX ? std::string("far fewer")
                                         : std::to_string(want) + " (or " +
                                               std::to_string(want + S) + " with modes)") +
                     " for " + std::to_string(S) + " sequences and " + std::to_string(D) +
                     " document indices: the index is truncated or corrupt");
  if (D < 1) throw InputError(idx_path + ": no document indices, expected at least the leading 0");
  const unsigned char* lengths = p + kHeader;
  const unsigned char* pointers = lengths + 4 * S;
  const unsigned char* docs = pointers + 8 * S;
  const int64_t bin_size = int64_t(s->bin_.size());

  std::vector<int64_t> seq_start(S + 1, 0), seq_ptr(S, 0);
  bool contiguous = true;
  int64_t expect_ptr = S > 0 ? load<int64_t>(pointers) : 0;
  const int64_t first_ptr = expect_ptr;
  for (uint64_t i = 0; i < S; ++i) {
    const int64_t len = load<int32_t>(lengths + 4 * i);
    const int64_t ptr = load<int64_t>(pointers + 8 * i);
    if (len < 0)
      throw InputError(idx_path + ": sequence " + std::to_string(i) + " has length " +
                       std::to_string(len) + ", expected >= 0");
    const int64_t bytes = len * int64_t(k);  // len < 2^31, k <= 8: no overflow
    if (ptr < 0)
      throw InputError(idx_path + ": sequence " + std::to_string(i) + " starts at byte " +
                       std::to_string(ptr) + ", expected an offset >= 0 into " + bin_path +
                       " (a corrupt index)");
    if (ptr > bin_size || bytes > bin_size - ptr) {
      // ptr + bytes may not fit in int64 (a corrupt offset near 2^63): said so.
      const std::string end = ptr > INT64_MAX - bytes ? "past 2^63" : std::to_string(ptr + bytes);
      // The .bin ended early when the sequence starts where the one before it ended (the
      // first where Megatron's writer puts it, at byte 0); otherwise the index is wrong.
      const bool truncated = ptr == (i == 0 ? 0 : expect_ptr);
      throw InputError(
          (truncated ? bin_path + ": truncated: "
                     : idx_path + ": the index points past the end of " + bin_path + ": ") +
          "sequence " + std::to_string(i) + " (" + std::to_string(len) + " tokens of " +
          std::to_string(k) + " bytes at byte " + std::to_string(ptr) + ") ends at byte " + end +
          ", the file has " + std::to_string(bin_size) + " bytes");
    }
    // Megatron's writer places each sequence at a multiple of its token size.
    if (ptr % int64_t(k) != 0)
      throw InputError(idx_path + ": sequence " + std::to_string(i) + " starts at byte " +
                       std::to_string(ptr) + ", not a multiple of its " + std::to_string(k) +
                       "-byte tokens (a damaged index)");
    contiguous &= ptr == expect_ptr;
    expect_ptr = ptr + bytes;
    seq_start[i + 1] = seq_start[i] + len;
    seq_ptr[i] = ptr;
  }
  std::vector<int64_t> doc_index(D);
  for (uint64_t d = 0; d < D; ++d) doc_index[d] = load<int64_t>(docs + 8 * d);
  if (doc_index[0] != 0)
    throw InputError(idx_path + ": document index 0 is " + std::to_string(doc_index[0]) +
                     ", expected 0");
  for (uint64_t d = 1; d < D; ++d)
    if (doc_index[d] < doc_index[d - 1] || doc_index[d] > int64_t(S))
      throw InputError(idx_path + ": document index " + std::to_string(d) + " is " +
                       std::to_string(doc_index[d]) + ", expected a sequence number in [" +
                       std::to_string(doc_index[d - 1]) + ", " + std::to_string(S) + "]");
  if (doc_index.back() != int64_t(S))
    throw InputError(idx_path + ": the last document index is " + std::to_string(doc_index.back()) +
                     ", expected the number of sequences " + std::to_string(S));
  s->num_sequences_ = int64_t(S);
  s->contiguous_ = contiguous;
  s->base_ = s->bin_.data() + (S > 0 ? first_ptr : 0);
  s->doc_start_.resize(D);
  for (uint64_t d = 0; d < D; ++d) s->doc_start_[d] = seq_start[size_t(doc_index[d])];
  if (!contiguous) {
    s->seq_start_ = std::move(seq_start);
    s->seq_ptr_ = std::move(seq_ptr);
  }
  return s;
}

void TokenStore::finish_single_document(const std::string& what) {
  const size_t k = token_size(type_);
  base_ =
      bin_.data() != nullptr ? bin_.data() : reinterpret_cast<const unsigned char*>(owned_.data());
  const size_t bytes = bin_.data() != nullptr ? bin_.size() : owned_.size();
  if (bytes % k != 0)
    throw InputError(name_ + ": truncated: " + std::to_string(bytes) +
                     " bytes is not a whole number of " + what + " tokens of " + std::to_string(k) +
                     " bytes");
  doc_start_ = {0, int64_t(bytes / k)};
}

std::shared_ptr<const TokenStore> TokenStore::open_flat(const std::string& path, TokenType type) {
  std::shared_ptr<TokenStore> s(new TokenStore());
  s->name_ = path;
  s->format_ = "tokens";
  s->type_ = type;
  s->bin_ = MappedFile(path);
  s->finish_single_document(token_type_name(type));
  return s;
}

std::shared_ptr<const TokenStore> TokenStore::open_text(const std::string& path) {
  std::shared_ptr<TokenStore> s(new TokenStore());
  s->name_ = path;
  s->format_ = "text";
  s->bin_ = MappedFile(path);
  s->finish_single_document("byte");
  return s;
}

std::shared_ptr<const TokenStore> TokenStore::from_bytes(std::string bytes, std::string name) {
  std::shared_ptr<TokenStore> s(new TokenStore());
  s->name_ = std::move(name);
  s->format_ = "text";
  s->owned_ = std::move(bytes);
  s->finish_single_document("byte");
  return s;
}

// ---- reading ----

template <class F>
void TokenStore::for_spans(int64_t pos, int64_t n, F&& f) const {
  const int64_t k = int64_t(token_size(type_));
  if (contiguous_) {
    if (n > 0) f(Span{pos, base_ + pos * k, n});
    return;
  }
  auto it = std::upper_bound(seq_start_.begin(), seq_start_.end(), pos);
  size_t seq = size_t(it - seq_start_.begin()) - 1;
  while (n > 0) {
    while (seq_start_[seq + 1] <= pos) ++seq;  // skips empty sequences
    int64_t off = pos - seq_start_[seq];
    int64_t m = std::min(n, seq_start_[seq + 1] - pos);
    f(Span{pos, bin_.data() + seq_ptr_[seq] + off * k, m});
    pos += m;
    n -= m;
  }
}

void TokenStore::read(int64_t pos, int64_t n, int64_t* out) const {
  BATON_CHECK(pos >= 0 && n >= 0 && pos + n <= num_tokens(), "read past the end of the tokens");
  visit(type_, [&](auto x) {
    using T = decltype(x);
    for_spans(pos, n, [&](const Span& s) {
      const unsigned char* b = s.bytes;
      int64_t* o = out + (s.pos - pos);
      if constexpr (sizeof(T) == 1) {
        // int8 tokens are signed: the sign extension is meant.
        for (int64_t i = 0; i < s.n; ++i)
          o[i] = int64_t(T(b[i]));  // NOLINT(bugprone-signed-char-misuse)
      } else if constexpr (std::is_floating_point_v<T>) {
        // Megatron's float dtypes: only a whole number in int64's range converts (anything
        // else, NaN or 1e46, is no token id and its conversion undefined).
        for (int64_t i = 0; i < s.n; ++i) {
          const double v = double(load<T>(b + i * int64_t(sizeof(T))));
          if (!(v >= -9.2e18 && v <= 9.2e18) || v != std::floor(v))
            throw InputError(name_ + ": token " + num(v) + " at " + where(s.pos + i) +
                             (std::isfinite(v) && v == std::floor(v)
                                  ? " is not a token id (a whole number beyond int64's range)"
                                  : " is not a token id (a whole number)"));
          o[i] = int64_t(v);
        }
      } else {
        for (int64_t i = 0; i < s.n; ++i) o[i] = int64_t(load<T>(b + i * int64_t(sizeof(T))));
      }
    });
  });
}

int64_t TokenStore::token(int64_t pos) const {
  int64_t v = 0;
  read(pos, 1, &v);
  return v;
}

int64_t TokenStore::document_of(int64_t pos) const {
  auto it = std::upper_bound(doc_start_.begin(), doc_start_.end(), pos);
  return int64_t(it - doc_start_.begin()) - 1;
}

std::string TokenStore::where(int64_t pos) const {
  if (num_documents() == 1) return "position " + std::to_string(pos);
  int64_t d = document_of(pos);
  while (d + 1 < num_documents() && doc_start_[size_t(d + 1)] <= pos) ++d;
  return "document " + std::to_string(d) + ", token " +
         std::to_string(pos - doc_start_[size_t(d)]) + " (position " + std::to_string(pos) + ")";
}

void TokenStore::check_vocabulary(int64_t vocab, int64_t pos, int64_t n,
                                  std::string_view whose) const {
  if (n < 0) n = num_tokens() - pos;
  BATON_CHECK(pos >= 0 && pos + n <= num_tokens(), "check past the end of the tokens");
  int64_t bad = -1;
  std::string value;
  bool whole = true;
  visit(type_, [&](auto x) {
    using T = decltype(x);
    for_spans(pos, n, [&](const Span& s) {
      if (bad >= 0) return;
      // Mapped files keep the OS page alignment and Megatron's writer aligns every
      // sequence to its item size, so typed access is safe when the pointer is aligned.
      if (reinterpret_cast<uintptr_t>(s.bytes) % alignof(T) == 0) {
        int64_t i = first_outside(reinterpret_cast<const T*>(s.bytes), s.n, vocab);
        if (i >= 0) {
          bad = s.pos + i;
          const T v = reinterpret_cast<const T*>(s.bytes)[i];
          value = token_text(v);
          whole = v == std::floor(v);
        }
      } else {
        for (int64_t i = 0; i < s.n && bad < 0; ++i) {
          T v = load<T>(s.bytes + i * int64_t(sizeof(T)));
          if (first_outside(&v, 1, vocab) == 0) {
            bad = s.pos + i;
            value = token_text(v);
            whole = v == std::floor(v);
          }
        }
      }
    });
  });
  if (bad >= 0)
    throw InputError(name_ + ": token " + value + " at " + where(bad) +
                     (whole ? " is outside " + std::string(whose) + " vocabulary of " +
                                  std::to_string(vocab) + " (ids 0.." + std::to_string(vocab - 1) +
                                  ")"
                            : " is not a whole number"));
}

TokenRange TokenStore::token_range() const {
  TokenRange r;
  visit(type_, [&](auto x) {
    using T = decltype(x);
    // In T, so that int64 ids past 2^53 are compared and printed exactly.
    bool any = false;
    T lo = T(), hi = T();
    for_spans(0, num_tokens(), [&](const Span& s) {
      if (s.n == 0) return;
      T a = T(), b = T();
      if (reinterpret_cast<uintptr_t>(s.bytes) % alignof(T) == 0) {
        const T* p = reinterpret_cast<const T*>(s.bytes);
        a = p[0], b = p[0];
        for (int64_t i = 0; i < s.n; ++i) {  // branch-free: vectorised
          T v = p[i];
          a = v < a ? v : a;
          b = v > b ? v : b;
        }
      } else {
        a = b = load<T>(s.bytes);
        for (int64_t i = 0; i < s.n; ++i) {
          T v = load<T>(s.bytes + i * int64_t(sizeof(T)));
          a = v < a ? v : a;
          b = v > b ? v : b;
        }
      }
      lo = !any || a < lo ? a : lo;
      hi = !any || b > hi ? b : hi;
      any = true;
    });
    if (!any) return;
    r.lo = double(lo);
    r.hi = double(hi);
    r.lo_text = token_text(lo);
    r.hi_text = token_text(hi);
  });
  return r;
}

// ---- writing ----

PairTempNames pair_temp_names(const std::string& prefix) {
  return {memory::temp_path_beside(prefix + ".bin", ".tmp"),
          memory::temp_path_beside(prefix + ".idx", ".tmp"),
          memory::temp_path_beside(prefix + ".idx", ".old")};
}

IndexedDatasetWriter::IndexedDatasetWriter(std::string prefix, TokenType type)
    : prefix_(std::move(prefix)), tmp_(pair_temp_names(prefix_)), type_(type) {
  megatron_code(type_);
  // A directory (or a FIFO) under any name it writes had been found only at the end, by
  // a rename that failed with the index half-replaced (.idx.old: after all the work).
  for (const std::string& name :
       {prefix_ + ".bin", prefix_ + ".idx", tmp_.bin_tmp, tmp_.idx_tmp, tmp_.idx_old}) {
    std::error_code ec;
    const auto st = std::filesystem::status(name, ec);
    if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st))
      throw InputError(name + ": " +
                       (std::filesystem::is_directory(st) ? "a directory" : "not a regular file") +
                       ", expected a file to write (or none)");
  }
  bin_ = std::fopen(tmp_.bin_tmp.c_str(), "wb");
  if (bin_ == nullptr)
    throw InputError(prefix_ + ".bin: cannot open for writing: " + std::strerror(errno));
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (done_) return;
  if (bin_ != nullptr) std::fclose(bin_);
  std::error_code ec;
  std::filesystem::remove(tmp_.bin_tmp, ec);
}

void IndexedDatasetWriter::add_document(const std::vector<int64_t>& tokens) {
  BATON_CHECK(!done_, "add_document after finish");
  if (tokens.size() > size_t(std::numeric_limits<int32_t>::max()))
    throw InputError(prefix_ + ": a document of " + std::to_string(tokens.size()) +
                     " tokens, more than Megatron's int32 length allows");
  visit(type_, [&](auto x) {
    using T = decltype(x);
    std::vector<T> buf(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) buf[i] = T(tokens[i]);
    if (!buf.empty() && std::fwrite(buf.data(), sizeof(T), buf.size(), bin_) != buf.size())
      throw RuntimeError(prefix_ + ".bin: write failed: " + std::strerror(errno));
  });
  lengths_.push_back(int32_t(tokens.size()));
  tokens_ += int64_t(tokens.size());
}

namespace {
void close_durably(std::FILE* f, const std::string& path) {
  // The reason said (a full disk), and the file closed either way.
  int err = 0;
  if (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err != 0) throw RuntimeError(path + ": write failed: " + std::strerror(err));
}
}  // namespace

void IndexedDatasetWriter::finish() {
  BATON_CHECK(!done_, "finish twice");
  std::FILE* bin = std::exchange(bin_, nullptr);
  close_durably(bin, prefix_ + ".bin");
  const uint64_t S = lengths_.size(), D = S + 1, version = 1;
  const uint8_t code = megatron_code(type_);
  // Written as it is made, the pointers and document indices in blocks: built whole, the
  // index had held about 52 bytes a document at the end of a prepare (231 MB for 4.2 M
  // documents; the lengths alone are 4).
  const auto write_index = [&](memory::FileSink& out) {
    out.write(kMagic, 9);
    out.write(&version, 8);
    out.write(&code, 1);
    out.write(&S, 8);
    out.write(&D, 8);
    if (S > 0) out.write(lengths_.data(), 4 * S);
    constexpr uint64_t kBlock = 1 << 16;
    std::vector<int64_t> block;
    block.reserve(kBlock);
    int64_t at = 0;
    for (uint64_t i = 0; i < S; i += kBlock) {
      block.clear();
      for (uint64_t k = i; k < std::min(S, i + kBlock); ++k) {
        block.push_back(at);
        at += int64_t(lengths_[k]) * int64_t(token_size(type_));
      }
      out.write(block.data(), 8 * block.size());
    }
    for (uint64_t i = 0; i < D; i += kBlock) {
      block.clear();
      for (uint64_t k = i; k < std::min(D, i + kBlock); ++k) block.push_back(int64_t(k));
      out.write(block.data(), 8 * block.size());
    }
  };
  // The .bin streams to its own temporary file (documents arrive one at a time), the index
  // goes to one too; only when both are on disk does the pair replace an earlier one: its
  // index first, so that no reader, and no crash, ever pairs a new .bin with an old .idx
  // (a crash in between leaves a .bin without its index but with PREFIX.idx.old or
  // PREFIX.idx.tmp beside it, which open_token_store refuses as an interrupted write;
  // the next run completes the pair and removes the set-aside index). A failed
  // write leaves the earlier pair as it was.
  namespace fs = std::filesystem;
  try {
    memory::write_file_durably(tmp_.idx_tmp, write_index);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp_.bin_tmp, ec);
    throw;
  }
  // The earlier index steps aside (not removed) until the new .bin is in place, so a
  // failed rename puts it back: the earlier pair is never lost.
  std::error_code ec;
  const bool had_idx = fs::exists(prefix_ + ".idx", ec);
  auto fail = [&](const std::string& what, const std::error_code& e) {
    std::error_code ignored;
    fs::remove(tmp_.bin_tmp, ignored);
    fs::remove(tmp_.idx_tmp, ignored);
    throw RuntimeError(what + ": " + e.message());
  };
  if (had_idx) {
    fs::rename(prefix_ + ".idx", tmp_.idx_old, ec);
    if (ec) fail(prefix_ + ".idx: cannot move the earlier index aside", ec);
  }
  fs::rename(tmp_.bin_tmp, prefix_ + ".bin", ec);
  if (ec) {
    const std::error_code e = ec;
    if (had_idx) fs::rename(tmp_.idx_old, prefix_ + ".idx", ec);
    fail(prefix_ + ".bin: cannot rename " + tmp_.bin_tmp + " to it", e);
  }
  fs::rename(tmp_.idx_tmp, prefix_ + ".idx", ec);
  if (ec) fail(prefix_ + ".idx: cannot rename " + tmp_.idx_tmp + " to it", ec);
  // Removed whether or not this run set it aside: one an interrupted run left (with no
  // PREFIX.idx, which readers refuse as an interrupted write) is stale now.
  fs::remove(tmp_.idx_old, ec);
  const fs::path dir = fs::path(prefix_ + ".idx").parent_path();
  memory::fsync_path(dir.empty() ? "." : dir.string(), true);
  done_ = true;
}

}  // namespace baton::stages
