// Timelines: what ran where and when, one row per rank. The simulator produces them
// from a prediction and the executor from measurements, in the same form, written as
// Chrome trace event JSON (opens in Perfetto and chrome://tracing) and as SVG.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedule/action.h"

namespace baton::schedule {

struct TimelineEvent {
  int rank = 0;
  // 0: compute (F, B, W, BW, STEP); 1: communication (transfers, REDUCE); 2: input (the
  // executor's loader making micro-batches)
  int lane = 0;
  ActionKind kind = ActionKind::forward;
  int micro_batch = -1;
  int stage = -1;
  int peer = -1;       // transfers: the other rank
  double start = 0.0;  // in the timeline's time unit
  double end = 0.0;
  // Set: an event of no schedule action, named by it in traces, one of event_labels():
  // the spatial split's halo receives ("HALO_F", "HALO_B") on lane 1, category HALO; its
  // convolutions' and poolings' rows computed while the halos are in flight ("INTERIOR_F",
  // "INTERIOR_B") on lane 0, inside the F or B, category INTERIOR; the loader making a
  // micro-batch's inputs ("LOAD") on lane 2 and a forward waiting for inputs the loader
  // had not made yet ("INPUT_WAIT") on lane 0 just before that forward, category INPUT.
  // Each with its micro-batch number.
  std::string label;
};

// The labels an event of no action may carry, in a fixed order (measured timelines
// gathered across ranks send a label as its index here).
const std::vector<std::string>& event_labels();

struct Timeline {
  std::string name;  // a title: the schedule's name, "measured", ...
  int num_ranks = 0;
  double seconds_per_unit = 1.0;  // what one time unit of the events is, in seconds
  std::vector<TimelineEvent> events;

  double end_time() const;
};

// What a Chrome trace holds, on writing and on reading. Times: about 31 years in
// microseconds; Perfetto keeps times as 64-bit nanoseconds (at most 9.2e15 us), so a
// longer timeline would not open, and sums of such times stay finite.
inline constexpr double kMaxTraceMicroseconds = 1e15;
// A world of at most 2^20 ranks, as plans have (partitioner/layout.h): a larger rank
// number is a damaged file, and the SVG draws a row per rank.
inline constexpr int kMaxTraceRanks = 1 << 20;
// otherData.seconds_per_unit.
inline constexpr double kMinTraceSecondsPerUnit = 1e-15, kMaxTraceSecondsPerUnit = 1e6;

// Chrome trace event JSON: one process per rank ("rank r"), thread 0 "compute", thread 1
// "communication" and thread 2 "input"; complete ("X") events named by the action's token
// ("1F3"), category its kind code, args {stage, micro_batch, peer}; times in microseconds
// with six decimals, each event's duration its rounded end less its rounded start (so
// events that meet in the timeline meet in the trace). Transfers in flight at once (a
// send leaves before the previous one arrived) go on threads 3, 4, ... ("communication
// 2", ...): events on one thread must nest. InputError, nothing returned, for what
// from_chrome_trace would refuse: a time that is not finite or beyond
// kMaxTraceMicroseconds, an event ending before it starts, ranks or seconds_per_unit out
// of range.
std::string to_chrome_trace(const Timeline& t);
// Reads what to_chrome_trace writes (and what the engine's measurements write), so a
// measured timeline can be drawn or compared; events of no action (HALO, INTERIOR, INPUT,
// SERVER) and metadata are skipped. Anything else malformed (a phase or category baton
// does not write, otherData.ranks below 1 or above 2^20, a pid beyond otherData.ranks or
// 2^20, a thread beyond 2^20 (threads 3 and up are communication), times that are not
// finite or beyond 1e15 us, a negative duration, a stage or micro-batch below -1, or
// below 0 for F, B, W, BW) is an InputError naming traceEvents[i].<field>.
Timeline from_chrome_trace(std::string_view json_text, const std::string& source);

struct SvgOptions {
  int width = 1400;  // pixels of the time axis
  int row_height = 26;
  bool communication = true;  // a thin strip under each rank for transfers and REDUCE
};
// One row per rank, one colour per action kind (later chunks of a rank in a lighter
// shade), the micro-batch number in each box wide enough to hold it, a time axis and
// a legend.
std::string to_svg(const Timeline& t, const SvgOptions& options = {});

}  // namespace baton::schedule
