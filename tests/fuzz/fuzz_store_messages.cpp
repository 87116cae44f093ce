// The rendezvous store's wire messages (transport/detail/store_protocol.h): a client's
// request payload as the server decodes it (before and after the hello), the frame
// header, the counter arithmetic, and a reply as the client decodes it.
#include <cstdlib>

#include "tests/fuzz/fuzz_util.h"
#include "transport/detail/store_protocol.h"

namespace proto = baton::transport::detail::store;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes = baton::fuzz::as_text(data, size);
  for (bool authed : {false, true}) {
    try {
      proto::Request q = proto::parse_request(bytes, authed);
      // What decodes is a request the writer could have made: re-encode and compare.
      proto::Writer w(q.op);
      switch (q.op) {
        case proto::kHello:
          w.u32(q.version).str(q.token);
          if (q.member.rank >= 0)
            w.u32(uint32_t(q.member.rank))
                .str(q.member.rank_from)
                .u32(uint32_t(q.member.size))
                .str(q.member.size_from)
                .str(q.member.host);
          break;
        case proto::kSet:
          w.str(q.keys.at(0)).str(q.value);
          break;
        case proto::kGet:
          w.str(q.keys.at(0)).u32(q.timeout_ms);
          break;
        case proto::kWait:
          w.u32(uint32_t(q.keys.size()));
          for (auto& k : q.keys) w.str(k);
          w.u32(q.timeout_ms);
          break;
        case proto::kAdd:
          w.str(q.keys.at(0)).i64(q.delta);
          break;
        default:
          std::abort();
      }
      if (w.frame().substr(4) != bytes) std::abort();
      if (q.op == proto::kAdd) {
        std::string stored(bytes.substr(0, std::min<size_t>(bytes.size(), 24)));
        try {
          (void)proto::add_to_counter(q.keys[0], &stored, q.delta);
        } catch (const proto::ProtocolError&) {
        }
      }
    } catch (const proto::ProtocolError&) {
    }
  }
  if (size >= 4) (void)proto::frame_length(reinterpret_cast<const char*>(data));
  // A reply: an opcode and, for kOk, a value or a counter; for kError a message; for
  // kFailed whether it is bad input, and a message.
  try {
    proto::Reader in(bytes);
    uint8_t op = in.op();
    if (op == proto::kFailed) (void)in.u8();
    if (op == proto::kError || op == proto::kFailed || (op == proto::kOk && size > 9))
      (void)in.str();
    else if (op == proto::kOk && size == 9)
      (void)in.i64();
    in.end();
  } catch (const proto::ProtocolError&) {
  }
  return 0;
}
