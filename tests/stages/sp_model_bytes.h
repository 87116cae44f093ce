// Hand-made SentencePiece model bytes (protobuf wire format) for the tests of
// stages/sentencepiece_model.h: pieces, and a precompiled_charsmap whose double-array trie
// maps the byte 'A' to a normalized string, valid or corrupt.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace baton::stages::testing {

inline std::string pb_varint(uint64_t v) {
  std::string s;
  while (v >= 0x80) {
    s += char((v & 0x7f) | 0x80);
    v >>= 7;
  }
  s += char(v);
  return s;
}

// Field `field` of wire type 2 (bytes, a string, a message).
inline std::string pb_bytes(int field, const std::string& b) {
  return pb_varint(uint64_t(field) << 3 | 2) + pb_varint(b.size()) + b;
}

inline std::string le32_bytes(uint32_t v) {
  return {char(v & 0xff), char((v >> 8) & 0xff), char((v >> 16) & 0xff), char(v >> 24)};
}

// ModelProto.pieces entry: the piece, score 0 (fixed32), type NORMAL (1).
inline std::string sp_piece(const std::string& piece) {
  return pb_bytes(1, pb_bytes(1, piece) + pb_varint(2 << 3 | 5) + le32_bytes(0) +
                         pb_varint(3 << 3 | 0) + pb_varint(1));
}

// A charsmap of 512 darts-clone units: the root's children at 256 ^ label; 'A' (0x41) has
// a leaf whose value unit (at 320) holds `value`, an offset into `normalized`.
// root_offset moves the root's children (beyond the trie: a corrupt one).
inline std::string sp_charsmap(uint32_t value, const std::string& normalized,
                               uint32_t root_offset = 256) {
  std::vector<uint32_t> unit(512, 0);
  unit[0] = root_offset << 10;
  unit[256 ^ 0x41] = 0x41u | (1u << 8) | (1u << 10);  // label 'A', a leaf, offset 1
  unit[(256 ^ 0x41) ^ 1] = (1u << 31) | value;
  std::string trie;
  for (uint32_t u : unit) trie += le32_bytes(u);
  return le32_bytes(uint32_t(trie.size())) + trie + normalized;
}

// ModelProto.normalizer_spec (field 3; the denormalizer's is field 5) with a charsmap.
inline std::string sp_normalizer(const std::string& charsmap, int field = 3) {
  return pb_bytes(field, pb_bytes(1, "nmt_nfkc") + pb_bytes(2, charsmap));
}

}  // namespace baton::stages::testing
