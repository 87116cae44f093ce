// The store's wire protocol. Every message is a frame: a 4-byte little-endian length,
// then that many bytes of payload, at most kMaxFrame. A payload is an opcode byte and
// fields: integers little-endian, strings as a 4-byte length and the bytes. Readers
// check every length against what remains, so a short or oversized message is an
// error, never a read past the end.
//
//   client -> server                      server -> client
//   kHello  u32 version, str token        kOk (nothing) | kError str message
//   kSet    str key, str value            kOk
//   kGet    str key, u32 timeout_ms       kOk str value | kError "timeout ..."
//   kWait   u32 n, n x str key, u32 ms    kOk | kError
//   kAdd    str key, i64 delta            kOk i64 value
//
// The first frame of a connection must be kHello with the job's token; anything else
// is answered with kError and the connection is closed.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "memory/error.h"

namespace baton::transport::detail::store {

constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxFrame = 4u << 20;
constexpr uint32_t kMaxKey = 4096;

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kWait = 4, kAdd = 5, kOk = 100, kError = 101 };

class Writer {
 public:
  explicit Writer(Op op) { out_.push_back(char(op)); }
  Writer& u32(uint32_t v) {
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = char((v >> (8 * i)) & 0xff);
    out_.append(b, 4);
    return *this;
  }
  Writer& i64(int64_t x) {
    uint64_t v = uint64_t(x);
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = char((v >> (8 * i)) & 0xff);
    out_.append(b, 8);
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(uint32_t(s.size()));
    out_.append(s);
    return *this;
  }
  // The whole frame: length prefix and payload.
  std::string frame() const {
    if (out_.size() > kMaxFrame)
      throw RuntimeError("store message of " + std::to_string(out_.size()) +
                         " bytes exceeds the limit of " + std::to_string(kMaxFrame));
    std::string f(4, '\0');
    uint32_t n = uint32_t(out_.size());
    for (int i = 0; i < 4; ++i) f[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return f + out_;
  }

 private:
  std::string out_;
};

// Thrown for a malformed message; the server answers kError and closes.
class ProtocolError : public RuntimeError {
 public:
  using RuntimeError::RuntimeError;
};

class Reader {
 public:
  explicit Reader(std::string_view payload) : p_(payload) {}
  uint8_t op() { return uint8_t(take(1)[0]); }
  uint32_t u32() {
    auto b = take(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(b[size_t(i)])) << (8 * i);
    return v;
  }
  int64_t i64() {
    auto b = take(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(b[size_t(i)])) << (8 * i);
    return int64_t(v);
  }
  std::string str(uint32_t max = kMaxFrame) {
    uint32_t n = u32();
    if (n > max)
      throw ProtocolError("string of " + std::to_string(n) + " bytes exceeds " +
                          std::to_string(max));
    return std::string(take(n));
  }
  void end() const {
    if (!p_.empty()) throw ProtocolError(std::to_string(p_.size()) + " unexpected trailing bytes");
  }

 private:
  std::string_view take(size_t n) {
    if (n > p_.size())
      throw ProtocolError("message too short: needs " + std::to_string(n) + " more bytes, has " +
                          std::to_string(p_.size()));
    auto s = p_.substr(0, n);
    p_.remove_prefix(n);
    return s;
  }
  std::string_view p_;
};

inline uint32_t frame_length(const char header[4]) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= uint32_t(uint8_t(header[i])) << (8 * i);
  return n;
}

}  // namespace baton::transport::detail::store
