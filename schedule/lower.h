// Lowering passes: a compute-only schedule (F, B, W, BW) becomes one the executor runs
// literally, with its transfers, gradient reductions and optimizer step inserted. Each
// pass returns a new schedule and keeps the input's validity: a valid input gives a
// valid output (under the communication model of dependencies.h).
#pragma once

#include "schedule/schedule.h"

namespace baton::schedule {

// Inserts RECV_F/RECV_B immediately before the compute that consumes a tensor from
// another rank, and SEND_F/SEND_B immediately after the compute that produces one.
// Why it cannot deadlock: each receive waits for a send issued right after its
// producer, so the lowered lists wait for exactly what the compute-only ones waited for
// (and sends never block). Throws InputError if the schedule already has transfers.
Schedule add_transfers(const Schedule& s);

// Inserts REDUCE(s) right after the last weight gradient (W or BW) of each stage on its
// rank, so the data-parallel reduction of a stage overlaps the rank's remaining work,
// and appends STEP to every rank when `step`. Throws InputError if the schedule already
// has REDUCE or STEP actions.
Schedule add_gradient_reduction(const Schedule& s, bool step = true);

// BW(b,s) -> B(b,s) W(b,s) in place.
Schedule split_backward(const Schedule& s);
// B(b,s) immediately followed by W(b,s) -> BW(b,s).
Schedule merge_backward(const Schedule& s);
// Drops transfers, REDUCE and STEP: the compute-only schedule underneath.
Schedule compute_only(const Schedule& s);

struct LowerOptions {
  bool merge_backward = false;  // fuse adjacent B, W into BW first
  bool transfers = true;        // add_transfers (skipped when the schedule has them)
  bool reduce = true;           // REDUCE per stage (skipped when present)
  bool step = true;             // STEP per rank (skipped when present)
};
// The passes above in order: merge, transfers, reduction and step.
Schedule lower(const Schedule& s, const LowerOptions& options = {});

}  // namespace baton::schedule
