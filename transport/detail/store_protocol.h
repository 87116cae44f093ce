// The store's wire protocol. Every message is a frame: a 4-byte little-endian length,
// then that many bytes of payload, at most kMaxFrame. A payload is an opcode byte and
// fields: integers little-endian, strings as a 4-byte length and the bytes. Readers
// check every length against what remains, so a short or oversized message is an
// error, never a read past the end.
//
//   client -> server                      server -> client
//   kHello  u32 version, str token        kOk (nothing) | kError str message
//           [u32 rank, str rank_from,
//            u32 size, str size_from,
//            str host]
//   kSet    str key, str value            kOk
//   kGet    str key, u32 timeout_ms       kOk str value | kError "timeout ..."
//   kWait   u32 n, n x str key, u32 ms    kOk | kError
//   kAdd    str key, i64 delta            kOk i64 value
//   any of them                           kFailed u8 input, str message
//
// The first frame of a connection must be kHello with the job's token; anything else
// is answered with kError and the connection is closed. A rank of a world says which
// (the bracketed fields: its rank and world size, the variables they came from and its
// host, for messages); a plain client leaves them out. kFailed: the rendezvous has
// failed for the whole job (a rank registered twice, world sizes that differ, a rank
// with another token, or the hosting rank gave up); every request gets it from then on,
// and `input` says whether it is bad input (exit code 2) or a runtime failure.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memory/error.h"
#include "transport/store.h"

namespace baton::transport::detail::store {

using Member = StoreMember;

// 2: the hello carries the rank's member fields. Bumped whenever a frame changes, so a
// process of another build is named by its version before its fields are read.
constexpr uint32_t kVersion = 2;
constexpr uint32_t kMaxFrame = 4u << 20;
constexpr uint32_t kMaxKey = 4096;
// A frame before the hello is accepted (a hello is about 2.6 KB at most): a stranger's
// connections must not make the rendezvous hold kMaxFrame each.
constexpr uint32_t kMaxHelloFrame = 64u << 10;

enum Op : uint8_t {
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kWait = 4,
  kAdd = 5,
  kOk = 100,
  kError = 101,
  kFailed = 102
};

class Writer {
 public:
  explicit Writer(Op op) { out_.push_back(char(op)); }
  Writer& u8(uint8_t v) {
    out_.push_back(char(v));
    return *this;
  }
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

// A hello of another protocol version: the rest of its frame is not read, since its layout
// is the other build's.
class VersionMismatch : public ProtocolError {
 public:
  VersionMismatch(uint32_t sent, std::string sent_token)
      : ProtocolError("protocol version " + std::to_string(sent) + ", this build's is " +
                      std::to_string(kVersion)),
        version(sent),
        token(std::move(sent_token)) {}
  uint32_t version;
  std::string token;
};

class Reader {
 public:
  explicit Reader(std::string_view payload) : p_(payload) {}
  uint8_t op() { return uint8_t(take(1)[0]); }
  uint8_t u8() { return uint8_t(take(1)[0]); }
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
  bool at_end() const { return p_.empty(); }
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

// Writes a hello; the member's part only for a rank of a world.
inline std::string hello_frame(const std::string& token, const Member& m) {
  Writer w(kHello);
  w.u32(kVersion).str(token);
  if (m.rank >= 0)
    w.u32(uint32_t(m.rank)).str(m.rank_from).u32(uint32_t(m.size)).str(m.size_from).str(m.host);
  return w.frame();
}

// One client request, decoded and checked (what the server acts on).
struct Request {
  Op op = kHello;
  uint32_t version = 0;           // kHello
  std::string token;              // kHello
  Member member;                  // kHello: rank -1 for a plain client
  std::vector<std::string> keys;  // kSet, kGet, kAdd: one; kWait: n
  std::string value;              // kSet
  uint32_t timeout_ms = 0;        // kGet, kWait
  int64_t delta = 0;              // kAdd
};

// Decodes a request payload; ProtocolError for anything malformed: a short or long
// message, a key above kMaxKey, too many keys, an unknown operation, or anything but a
// hello before the connection is authenticated.
inline Request parse_request(std::string_view payload, bool authed) {
  Reader in(payload);
  Request r;
  uint8_t op = in.op();
  if (!authed && op != kHello) throw ProtocolError("the first message must be a hello");
  switch (op) {
    case kHello:
      if (authed) throw ProtocolError("a second hello");
      r.version = in.u32();
      r.token = in.str(1024);
      if (r.version != kVersion) throw VersionMismatch(r.version, std::move(r.token));
      if (!in.at_end()) {
        r.member.rank = int32_t(in.u32());
        r.member.rank_from = in.str(256);
        r.member.size = int32_t(in.u32());
        r.member.size_from = in.str(256);
        r.member.host = in.str(1024);
        if (r.member.rank < 0 || r.member.size < 1 || r.member.rank >= r.member.size)
          throw ProtocolError("rank " + std::to_string(r.member.rank) + " of a world of " +
                              std::to_string(r.member.size));
      }
      break;
    case kSet:
      r.keys.push_back(in.str(kMaxKey));
      r.value = in.str();
      break;
    case kGet:
      r.keys.push_back(in.str(kMaxKey));
      r.timeout_ms = in.u32();
      break;
    case kWait: {
      uint32_t n = in.u32();
      // Every key takes at least its 4-byte length.
      if (n > payload.size() / 4) throw ProtocolError("too many keys: " + std::to_string(n));
      for (uint32_t i = 0; i < n; ++i) r.keys.push_back(in.str(kMaxKey));
      r.timeout_ms = in.u32();
      break;
    }
    case kAdd:
      r.keys.push_back(in.str(kMaxKey));
      r.delta = in.i64();
      break;
    default:
      throw ProtocolError("unknown operation " + std::to_string(op));
  }
  in.end();
  r.op = Op(op);
  return r;
}

// The counter at a key after adding delta; ProtocolError when the stored value is not
// a decimal integer or the sum overflows.
inline int64_t add_to_counter(const std::string& key, const std::string* stored, int64_t delta) {
  int64_t v = 0;
  if (stored != nullptr) {
    const std::string& t = *stored;
    size_t i = (!t.empty() && (t[0] == '-' || t[0] == '+')) ? 1 : 0;
    bool digits = i < t.size() && t.size() - i <= 19;
    for (size_t k = i; k < t.size() && digits; ++k) digits = t[k] >= '0' && t[k] <= '9';
    errno = 0;
    char* end = nullptr;
    long long parsed = digits ? std::strtoll(t.c_str(), &end, 10) : 0;
    if (!digits || errno == ERANGE)
      throw ProtocolError("add: the value at key '" + key.substr(0, 200) +
                          "' is not a 64-bit decimal integer");
    v = parsed;
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(v, delta, &sum))
    throw ProtocolError("add: counter '" + key.substr(0, 200) + "' overflows 64 bits");
  return sum;
}

}  // namespace baton::transport::detail::store
