// A transfer between pipeline stages, defined once for the planner, which routes each
// boundary's values between the ranks of the two stages (partitioner/routing.h), and the
// engine, which moves them (engine/executor.h): what one point-to-point message carries,
// the boundary and direction a SEND/RECV action crosses, the elements of a part, and the
// message tag a SEND and its RECV agree on.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "schedule/schedule.h"

namespace baton::schedule {

// Limits of the message tag's widening (message_tag).
constexpr int kMaxBoundaryValues = 8;  // values crossing one boundary
constexpr int kMaxValueParts = 16;     // parts of one value

// One point-to-point message of a boundary value, or of one part of it, for every
// micro-batch: part `part` of `parts` equal parts of the flattened tensor (the elements
// part_range gives), to or from `peer`. A spatial tile re-tiled between stages of
// different spatial degrees (rows > 0) is instead a block of image rows: rows
// [rows_from, rows_from + rows) of the sender's [N, C, h, W] land at rows [rows_to,
// rows_to + rows) of the receiver's, `part` numbering the receiver's blocks.
struct Transfer {
  enum class Kind { send, recv };
  enum class Phase { activation, gradient };  // forward values, or their gradients backward
  Kind kind = Kind::send;
  Phase phase = Phase::activation;
  int peer = -1;        // world rank on the other side
  std::string value;    // the value's name (the same in both stages' graphs)
  int value_index = 0;  // its index among the values crossing the boundary (in tags)
  int part = 0;
  int parts = 1;
  int64_t rows = 0, rows_from = 0, rows_to = 0;
};

// The boundary b (between stages b and b + 1 of one direction) a SEND/RECV action
// crosses, and whether it carries activations or gradients. boundary -1 for other
// actions and for a transfer past either end of its direction.
struct Crossing {
  int boundary = -1;
  Transfer::Phase phase = Transfer::Phase::activation;
};
Crossing transfer_crossing(const Schedule& s, const Action& a);

// The message tag of a transfer, equal for a SEND and its matching RECV and different
// for every other transfer of the schedule: ((micro-batch * S + boundary) * 2 + g),
// g = 1 for gradients. -1 for other actions.
int64_t transfer_tag(const Schedule& s, const Action& a);
// transfer_tag widened by the message's value and part, so that the messages of one
// transfer action differ. Throws for an action that is no transfer.
uint64_t message_tag(const Schedule& s, const Action& a, const Transfer& t);
// One more than the largest tag message_tag can give for `s`.
uint64_t message_tag_count(const Schedule& s);

// Elements [begin, end) of part `part` of `parts` of a tensor of `numel` elements, cut
// at rows of `row` elements (the last dimension) so that parts are whole rows when they
// can be.
std::pair<int64_t, int64_t> part_range(int64_t numel, int64_t row, int part, int parts);

}  // namespace baton::schedule
