// The 64-bit message tag every backend matches on. One layout for all backends, so
// that algorithms, sub-groups and the liveness protocol never collide:
//
//   63..48  context   group id (0: the world; 0xffff: liveness control messages)
//   47..28  source    global rank of the sender (receives always name their source)
//   27      internal  1: collective or split traffic; 0: a user's point-to-point tag
//   26..0   tag       user tag; or internal: sequence (8 bits) and step (19 bits)
#pragma once

#include <cstdint>

namespace baton::transport::detail {

constexpr int kContextBits = 16;
constexpr int kSourceBits = 20;
constexpr int kUserTagBits = 27;
constexpr uint64_t kMaxUserTag = (uint64_t(1) << kUserTagBits) - 1;
constexpr int kMaxRanks = 1 << kSourceBits;
constexpr uint16_t kWorldContext = 0;
constexpr uint16_t kControlContext = 0xffff;
constexpr uint16_t kMaxContext = 0xfffe;  // the last id a group may take

constexpr uint64_t kSourceShift = kUserTagBits + 1;
constexpr uint64_t kContextShift = kSourceShift + kSourceBits;
constexpr uint64_t kInternalBit = uint64_t(1) << kUserTagBits;
constexpr uint64_t kSourceMask = ((uint64_t(1) << kSourceBits) - 1) << kSourceShift;
constexpr uint64_t kFullMask = ~uint64_t(0);

constexpr uint64_t make_tag(uint16_t context, int source, bool internal, uint64_t tag) {
  return (uint64_t(context) << kContextShift) | (uint64_t(source) << kSourceShift) |
         (internal ? kInternalBit : 0) | (tag & kMaxUserTag);
}
constexpr int tag_source(uint64_t tag) {
  return int((tag & kSourceMask) >> kSourceShift);
}
constexpr uint16_t tag_context(uint64_t tag) {
  return uint16_t(tag >> kContextShift);
}

// Internal tags of collectives: a per-group sequence number (so consecutive collectives
// never match each other's messages) and a step within the collective. Steps wrap
// harmlessly: between one pair, equal tags match in the order they were sent.
constexpr int kSeqBits = 8;
constexpr int kStepBits = kUserTagBits - kSeqBits;
constexpr uint64_t collective_tag(uint32_t seq, uint64_t step) {
  return (uint64_t(seq & ((1u << kSeqBits) - 1)) << kStepBits) |
         (step & ((uint64_t(1) << kStepBits) - 1));
}
// The split agreement of a group uses a sequence number no collective takes.
constexpr uint32_t kSplitSeq = (1u << kSeqBits) - 1;
constexpr uint32_t kMaxCollectiveSeq = kSplitSeq;  // collectives use seq mod this

}  // namespace baton::transport::detail
