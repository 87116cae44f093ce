// Token stores: the tokens of a dataset file, memory-mapped, with its documents. Three
// formats read into one TokenStore:
// - Megatron-LM's indexed dataset (PREFIX.bin + PREFIX.idx: header "MMIDIDX\0\0",
//   version 1, a dtype code, sequence lengths and byte offsets, document boundaries);
// - flat token files (a .bin of uint16 or uint32 tokens, nanoGPT's format): one document;
// - any other file as byte-level text: every byte a token, one document.
// Positions are token positions in the concatenation of the sequences in index order.
// Every structural fault (magic, version, dtype code, truncation, an index that points
// past its .bin) is an InputError naming the file and what was expected and found.
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stages/mapped_file.h"

namespace baton::stages {

// Token types: Megatron's dtype codes 1..8, and uint32 for flat token files.
enum class TokenType : uint8_t { u8 = 1, i8, i16, i32, i64, f64, f32, u16, u32 = 100 };

size_t token_size(TokenType t);
std::string token_type_name(TokenType t);  // NumPy's names: "uint16", "int32", ...
// Accepts NumPy's names; InputError naming `what` (the flag) otherwise.
TokenType parse_token_type(const std::string& name, const std::string& what);
// Megatron's code of a type (u32 has none: BATON_CHECK).
uint8_t megatron_code(TokenType t);

// The smallest and largest token: as doubles for comparing, and as text, exact (an int64
// id past 2^53 printed through a double had lost its last digits).
struct TokenRange {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  std::string lo_text, hi_text;  // empty for no tokens
};

class TokenStore {
 public:
  static std::shared_ptr<const TokenStore> open_megatron(const std::string& prefix);
  static std::shared_ptr<const TokenStore> open_flat(const std::string& path, TokenType type);
  static std::shared_ptr<const TokenStore> open_text(const std::string& path);
  // A byte string as text: one document (tests, in-memory data).
  static std::shared_ptr<const TokenStore> from_bytes(std::string bytes, std::string name);

  const std::string& name() const { return name_; }      // the file messages name
  const std::string& format() const { return format_; }  // "megatron", "tokens" or "text"
  TokenType type() const { return type_; }
  int64_t num_tokens() const { return doc_start_.back(); }
  int64_t num_documents() const { return int64_t(doc_start_.size()) - 1; }
  int64_t num_sequences() const { return num_sequences_; }
  // Token position where document d starts, d in [0, num_documents()] (the last: the end).
  int64_t document_start(int64_t d) const { return doc_start_[size_t(d)]; }
  const std::vector<int64_t>& document_starts() const { return doc_start_; }
  // The document holding position `pos`.
  int64_t document_of(int64_t pos) const;

  // Tokens [pos, pos + n) as int64 (a float store's values are whole numbers, checked).
  void read(int64_t pos, int64_t n, int64_t* out) const;
  int64_t token(int64_t pos) const;

  // Throws InputError naming the file, the first position in [pos, pos + n) whose token
  // is not a whole number in [0, vocab) and its value; n < 0: to the end.
  // `whose` names the vocabulary in the message ("the model's", "--vocab's").
  void check_vocabulary(int64_t vocab, int64_t pos = 0, int64_t n = -1,
                        std::string_view whose = "the model's") const;
  // The smallest and largest token (a whole scan).
  TokenRange token_range() const;
  // "document 3, token 17 (position 1234)" for messages.
  std::string where(int64_t pos) const;

 private:
  TokenStore() = default;
  struct Span {  // a run of tokens at consecutive positions, contiguous in the file
    int64_t pos;
    const unsigned char* bytes;
    int64_t n;
  };
  // Spans covering [pos, pos + n) in order.
  template <class F>
  void for_spans(int64_t pos, int64_t n, F&& f) const;
  void finish_single_document(const std::string& what);

  std::string name_, format_;
  TokenType type_ = TokenType::u8;
  MappedFile bin_;
  std::string owned_;                    // from_bytes
  const unsigned char* base_ = nullptr;  // contiguous stores: position 0's first byte
  bool contiguous_ = true;
  int64_t num_sequences_ = 1;
  std::vector<int64_t> seq_start_;  // non-contiguous stores: positions, size S + 1
  std::vector<int64_t> seq_ptr_;    // non-contiguous stores: byte offsets into the .bin
  std::vector<int64_t> doc_start_;  // positions, size D + 1
};

// Writes a Megatron-LM indexed dataset (one sequence per document), atomically: the two
// files appear under their names only when finish() returns.
// The temporary names a write of PREFIX.bin/.idx uses beside them: PREFIX.bin.tmp,
// PREFIX.idx.tmp and PREFIX.idx.old, or hidden hashed names where those would pass the
// system's limit on a name (memory::temp_path_beside). Readers look for the same names
// to tell an interrupted write.
struct PairTempNames {
  std::string bin_tmp, idx_tmp, idx_old;
};
PairTempNames pair_temp_names(const std::string& prefix);

class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, TokenType type);
  ~IndexedDatasetWriter();  // without finish(): removes the partial files
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  void add_document(const std::vector<int64_t>& tokens);
  void finish();
  int64_t documents() const { return int64_t(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  std::string prefix_;
  PairTempNames tmp_;
  TokenType type_;
  std::FILE* bin_ = nullptr;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
  bool done_ = false;
};

}  // namespace baton::stages
