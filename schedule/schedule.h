// The schedule IR: per rank, an ordered list of actions, plus where each stage (model
// chunk) lives. One IR for generated schedules, hand-written files, the validator, the
// simulator and the executor.
//
// Stages. The model is cut into S = placement.size() stages (chunks). With one
// direction, a micro-batch flows forward through stages 0, 1, ..., S-1 and its
// gradients flow back. A bidirectional schedule (DualPipe) holds D = 2 replicas of the
// model: stages [d*S/D, (d+1)*S/D) form direction d's pipeline, stage d*S/D + k is a
// replica of model chunk k, and micro-batch b flows in direction b / (M/D).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "schedule/action.h"

namespace baton::schedule {

struct Schedule {
  std::string name;                        // free text ("1f1b"); may be empty
  int num_ranks = 0;                       // p
  int num_micro_batches = 0;               // m, over all directions
  int num_directions = 1;                  // 1, or 2 for a bidirectional schedule
  std::vector<int> placement;              // placement[stage] = the rank that holds it
  std::vector<std::vector<Action>> ranks;  // ranks[r] = rank r's actions, in order

  int num_stages() const { return static_cast<int>(placement.size()); }
  int stages_per_direction() const { return num_stages() / num_directions; }
  int micro_batches_per_direction() const { return num_micro_batches / num_directions; }
  size_t num_actions() const;

  friend bool operator==(const Schedule&, const Schedule&) = default;
};

// ---- topology -------------------------------------------------------------------------

inline int stage_direction(const Schedule& s, int stage) {
  return stage / s.stages_per_direction();
}
inline int micro_batch_direction(const Schedule& s, int mb) {
  return mb / s.micro_batches_per_direction();
}
// The model chunk a stage holds (equal to the stage unless bidirectional).
inline int stage_chunk(const Schedule& s, int stage) {
  return stage % s.stages_per_direction();
}
inline bool is_first_stage(const Schedule& s, int stage) {
  return stage_chunk(s, stage) == 0;
}
inline bool is_last_stage(const Schedule& s, int stage) {
  return stage_chunk(s, stage) == s.stages_per_direction() - 1;
}
// The previous / next stage of the same direction, or -1 at either end.
inline int prev_stage(const Schedule& s, int stage) {
  return is_first_stage(s, stage) ? -1 : stage - 1;
}
inline int next_stage(const Schedule& s, int stage) {
  return is_last_stage(s, stage) ? -1 : stage + 1;
}

// The stages rank r holds, in increasing order.
std::vector<int> stages_of_rank(const Schedule& s, int rank);
// Average number of stages a rank holds per direction (v): scalar per-rank costs are
// divided by it, and a (micro-batch, stage) pair counts 1/v of a micro-batch of memory.
double chunks_per_rank(const Schedule& s);

// For a transfer action: the rank on the other side, from the placement; -1 when the
// action is no transfer or its boundary does not exist (first/last stage).
int transfer_peer(const Schedule& s, const Action& a);
// (The boundary a transfer crosses and its message tag: schedule/transfer.h.)
// Sets `peer` of every transfer from the placement (parsers and passes call it).
void assign_peers(Schedule& s);
// True when the schedule names its transfers (contains a SEND or RECV).
bool has_transfers(const Schedule& s);
// Throws InputError naming `what` when the name holds a line break (LF or CR): the text
// form keeps the name on one line, so the forms could not convert into each other.
void check_name(const std::string& name, const std::string& what);

// ---- placements -----------------------------------------------------------------------

// Stage s on rank s % p (1F1B for v = 1, Megatron's interleaved placement for v > 1).
std::vector<int> loop_placement(int num_ranks, int chunks_per_rank);
// Zig-zag: chunk k of the model's p*v runs down the ranks when k is even and back up
// when odd, so rank 0 holds the first and the last stage for v = 2 (ZB-V, DualPipeV).
std::vector<int> v_placement(int num_ranks, int chunks_per_rank);
// Two directions of p stages: direction 0 on ranks 0..p-1, direction 1 on p-1..0.
std::vector<int> bidirectional_placement(int num_ranks);

// Checks the header fields (counts in range, placement onto existing ranks, every
// rank listed, micro-batches divisible by directions). Throws InputError naming
// `where`.
// `fields`: where each header field was written, when it has a place of its own (a text
// file's line: "s.txt:3"), which its errors name instead of `where`.
void check_header(const Schedule& s, const std::string& where,
                  const std::map<std::string, std::string>& fields = {});

}  // namespace baton::schedule
