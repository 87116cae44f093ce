#include "schedule/transfer.h"

#include "memory/error.h"

namespace baton::schedule {

Crossing transfer_crossing(const Schedule& s, const Action& a) {
  if (a.stage < 0 || a.stage >= s.num_stages()) return {};
  switch (a.kind) {
    case ActionKind::send_activation:
      return {next_stage(s, a.stage) < 0 ? -1 : a.stage, Transfer::Phase::activation};
    case ActionKind::recv_activation:
      return {prev_stage(s, a.stage), Transfer::Phase::activation};
    case ActionKind::send_gradient:
      return {prev_stage(s, a.stage), Transfer::Phase::gradient};
    case ActionKind::recv_gradient:
      return {next_stage(s, a.stage) < 0 ? -1 : a.stage, Transfer::Phase::gradient};
    default:
      return {};
  }
}

int64_t transfer_tag(const Schedule& s, const Action& a) {
  const Crossing c = transfer_crossing(s, a);
  if (c.boundary < 0) return -1;
  const int gradient = c.phase == Transfer::Phase::gradient ? 1 : 0;
  return (int64_t(a.micro_batch) * s.num_stages() + c.boundary) * 2 + gradient;
}

uint64_t message_tag(const Schedule& s, const Action& a, const Transfer& t) {
  const int64_t base = transfer_tag(s, a);
  BATON_CHECK(base >= 0, "message_tag of an action that is no transfer");
  return (uint64_t(base) * kMaxBoundaryValues + uint64_t(t.value_index)) * kMaxValueParts +
         uint64_t(t.part);
}

uint64_t message_tag_count(const Schedule& s) {
  const uint64_t bases =
      (uint64_t(s.num_micro_batches) * uint64_t(s.num_stages()) + uint64_t(s.num_stages())) * 2;
  return bases * kMaxBoundaryValues * kMaxValueParts;
}

std::pair<int64_t, int64_t> part_range(int64_t numel, int64_t row, int part, int parts) {
  BATON_CHECK(parts >= 1 && part >= 0 && part < parts, "part out of range");
  if (row > 0 && numel % row == 0 && numel / row >= parts) {
    int64_t rows = numel / row;
    return {rows * part / parts * row, rows * (part + 1) / parts * row};
  }
  return {numel * part / parts, numel * (part + 1) / parts};
}

}  // namespace baton::schedule
