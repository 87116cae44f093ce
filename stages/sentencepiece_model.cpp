#include "stages/sentencepiece_model.h"

#include <cstdint>
#include <vector>

#include "memory/error.h"
#include "memory/file_io.h"

namespace baton::stages {

namespace {

[[noreturn]] void invalid(const std::string& path, const std::string& what) {
  throw InputError(path + ": not a SentencePiece model: " + what);
}

// One field of a protobuf message: its number, wire type, and value (a varint, or the
// bytes of a length-delimited or fixed-size one).
struct Field {
  uint64_t number = 0;
  int wire = 0;
  uint64_t varint = 0;
  std::string_view bytes;
};

// The fields of one serialized message, in order (groups, obsolete but valid, skipped).
class Wire {
 public:
  Wire(std::string_view b, const std::string& path) : b_(b), path_(path) {}

  bool next(Field& f) {
    if (pos_ >= b_.size()) return false;
    read(f, 0);
    return true;
  }

 private:
  [[noreturn]] void malformed() const {
    invalid(path_, "malformed protobuf encoding at byte " + std::to_string(pos_));
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= b_.size()) malformed();
      const auto c = static_cast<unsigned char>(b_[pos_++]);
      v |= uint64_t(c & 0x7f) << shift;
      if (c < 0x80) return v;
    }
    malformed();
  }

  std::string_view take(uint64_t n) {
    if (n > b_.size() - pos_) malformed();
    std::string_view s = b_.substr(pos_, size_t(n));
    pos_ += size_t(n);
    return s;
  }

  void read(Field& f, int depth) {
    const uint64_t key = varint();
    f.number = key >> 3;
    f.wire = int(key & 7);
    if (f.number == 0) malformed();
    switch (f.wire) {
      case 0:
        f.varint = varint();
        return;
      case 1:
        f.bytes = take(8);
        return;
      case 2:
        f.bytes = take(varint());
        return;
      case 3: {  // a group: its fields up to the end-group tag of the same number
        if (depth > 64) malformed();
        const uint64_t number = f.number;
        Field inner;
        for (;;) {
          if (pos_ >= b_.size()) malformed();
          read(inner, depth + 1);
          if (inner.wire == 4) {
            if (inner.number != number) malformed();
            return;
          }
        }
      }
      case 4:
        if (depth == 0) malformed();  // an end-group tag outside a group
        return;
      case 5:
        f.bytes = take(4);
        return;
      default:
        malformed();
    }
  }

  std::string_view b_;
  const std::string& path_;
  size_t pos_ = 0;
};

// ModelProto.pieces[index] (a SentencePiece message; field 1: the piece): SentencePiece
// 0.2 refuses an empty piece and one with a NUL byte (the library's tries take C strings).
void check_piece(std::string_view message, int64_t index, const std::string& path) {
  std::string_view piece;
  Wire w(message, path);
  Field f;
  while (w.next(f))
    if (f.number == 1 && f.wire == 2) piece = f.bytes;  // the last one counts, as in protobuf
  if (piece.empty()) invalid(path, "piece " + std::to_string(index) + " is empty");
  if (piece.find('\0') != std::string_view::npos)
    invalid(path, "piece " + std::to_string(index) + " holds a NUL byte");
}

[[noreturn]] void outside(const std::string& path, const std::string& what, size_t from,
                          uint64_t to, size_t n) {
  invalid(path, what + " is invalid: trie unit " + std::to_string(from) + " leads to unit " +
                    std::to_string(to) + ", outside its " + std::to_string(n) + " units");
}

uint32_t le32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t(u[0]) | uint32_t(u[1]) << 8 | uint32_t(u[2]) << 16 | uint32_t(u[3]) << 24;
}

// A precompiled_charsmap: every index the normalizer's lookup (darts-clone's
// commonPrefixSearch) can reach, for any input byte, must lie in the trie, and every value
// it can return must start a NUL-terminated string inside the normalized strings.
void check_charsmap(std::string_view blob, const std::string& which, const std::string& path) {
  const std::string what = "the " + which + "'s precompiled_charsmap";
  if (blob.size() <= 4)
    invalid(path, what + " is " + std::to_string(blob.size()) +
                      " bytes, expected a 4-byte trie size and the trie");
  const uint32_t trie_bytes = le32(blob.data());
  if (trie_bytes > blob.size() - 4)
    invalid(path, what + ": its trie of " + std::to_string(trie_bytes) + " bytes runs past its " +
                      std::to_string(blob.size()) + " bytes");
  const size_t n = trie_bytes / 4;  // whole units, as the library counts them
  if (n == 0) invalid(path, what + ": its trie is empty");
  std::vector<uint32_t> unit(n);
  for (size_t i = 0; i < n; ++i) unit[i] = le32(blob.data() + 4 + 4 * i);
  const std::string_view normalized = blob.substr(4 + size_t(trie_bytes));
  // A value past the last NUL would be read as a C string beyond the map.
  const size_t last_nul = normalized.rfind('\0');
  // darts-clone's unit: bit 8 has_leaf, bits 0-7 (and 31) the label, bits 10-31 the
  // offset (shifted by 8 when bit 9 is set), bits 0-30 a leaf's value.
  auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
  std::vector<char> seen(n, 0);
  std::vector<size_t> todo{0};
  seen[0] = 1;
  while (!todo.empty()) {
    const size_t node = todo.back();
    todo.pop_back();
    const uint64_t base = uint64_t(node) ^ offset(unit[node]);
    for (uint32_t c = 0; c < 256; ++c) {
      const uint64_t child = base ^ c;
      if (child >= n) outside(path, what, node, child, n);
      const uint32_t u = unit[size_t(child)];
      if ((u & ((1u << 31) | 0xffu)) != c) continue;  // no edge labelled c
      if ((u >> 8) & 1) {
        const uint64_t leaf = child ^ offset(u);
        if (leaf >= n) outside(path, what, size_t(child), leaf, n);
        const uint32_t value = unit[size_t(leaf)] & 0x7fffffffu;
        if (last_nul == std::string_view::npos || value > last_nul)
          invalid(path, what + " is invalid: trie value " + std::to_string(value) +
                            " lies outside its " + std::to_string(normalized.size()) +
                            " bytes of normalized strings");
      }
      if (!seen[size_t(child)]) {
        seen[size_t(child)] = 1;
        todo.push_back(size_t(child));
      }
    }
  }
}

}  // namespace

void check_sentencepiece_model(std::string_view bytes, const std::string& path) {
  // ModelProto: 1 pieces (repeated), 3 normalizer_spec, 5 denormalizer_spec; in a
  // NormalizerSpec, 2 precompiled_charsmap. A message given twice is merged, so the last
  // charsmap is the one the library uses.
  std::string_view charsmap[2];
  int64_t pieces = 0;
  Wire top(bytes, path);
  Field f;
  while (top.next(f)) {
    if (f.wire != 2) continue;
    if (f.number == 1) check_piece(f.bytes, pieces++, path);
    if (f.number != 3 && f.number != 5) continue;
    Wire spec(f.bytes, path);
    Field g;
    while (spec.next(g))
      if (g.number == 2 && g.wire == 2) charsmap[f.number == 5] = g.bytes;
  }
  if (!charsmap[0].empty()) check_charsmap(charsmap[0], "normalizer", path);
  if (!charsmap[1].empty()) check_charsmap(charsmap[1], "denormalizer", path);
}

std::string read_sentencepiece_model(const std::string& path) {
  std::string bytes = memory::read_regular_file(path);
  check_sentencepiece_model(bytes, path);
  return bytes;
}

}  // namespace baton::stages
