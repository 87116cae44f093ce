// Schedule generators: compute-only schedules (F, B, W or BW per rank) for the
// schedules of the literature, for every ranks / micro-batches / chunks where each is
// defined, with an InputError naming the parameter otherwise. lower.h turns them into
// what the executor runs. Each generator's bubble and memory are in docs/schedules.md.
#pragma once

#include <string>
#include <vector>

#include "schedule/costs.h"
#include "schedule/schedule.h"

namespace baton::schedule {

// The generators of the literature's fixed schedules (what the engine's tests run).
const std::vector<std::string>& schedule_names();
// Every name generate() accepts (aliases "interleaved", "dualpipe-v" too): the above and
// the building-block family v-min, v-half, v-zb.
const std::vector<std::string>& all_schedule_names();
// The canonical name ("interleaved" -> "interleaved-1f1b"); InputError listing the
// known names when `name` is none of them.
std::string canonical_schedule_name(const std::string& name);
// The same for what trains (a plan, the planner's --schedule): forward-only, which
// evaluates, is refused too.
std::string canonical_training_schedule_name(const std::string& name);

// The most micro-batches a generated schedule takes (a step of 2^20 micro-batches is
// already millions of actions per rank).
inline constexpr int kMaxGeneratedMicroBatches = 1 << 20;

// `chunks`: stages per rank (v); 0 means the schedule's own (1, or 2 for
// interleaved-1f1b, zb-v, dualpipev and dualpipe). Throws InputError for an unknown
// name (listing the known ones) or parameters outside the schedule's domain.
Schedule generate(const std::string& name, int ranks, int micro_batches, int chunks = 0);

// All F, then all BW (Huang et al. 2019). Peak m micro-batches on every rank.
Schedule gpipe(int ranks, int micro_batches);
// PipeDream-flush / Megatron 1F1B: rank r warms up with p-r-1 forwards, then
// alternates. Peak min(p-r, m) micro-batches on rank r.
Schedule one_f_one_b(int ranks, int micro_batches);
// Megatron's interleaved 1F1B (Narayanan et al. 2021), v chunks per rank on the loop
// placement; micro-batches in groups of p. For m not a multiple of p the schedule of
// the next multiple is generated and the extra micro-batches dropped.
Schedule interleaved_1f1b(int ranks, int micro_batches, int chunks);
// Zero-bubble schedules (Qi et al. 2023), backward split into B and W. ZB-H1: peak p
// micro-batches per rank (1F1B's maximum); ZB-H2: 2p-1.
Schedule zb_h1(int ranks, int micro_batches);
Schedule zb_h2(int ranks, int micro_batches);
// ZB-V: two chunks per rank on the V placement; peak p micro-batches per rank.
Schedule zb_v(int ranks, int micro_batches);
// DualPipeV (DeepSeek's "cut-in-half" DualPipe): V placement, m >= 2p.
Schedule dualpipe_v(int ranks, int micro_batches);
// DualPipe (DeepSeek-V3): two model replicas fed from both ends (two directions);
// p even, m even, m >= 2p; micro-batches [0, m/2) flow down, [m/2, m) up.
Schedule dualpipe(int ranks, int micro_batches);

// A building block (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"):
// per rank r and chunk c (the rank's c-th stage, chunk_stage[r][c]), the time slot
// within a period of `period` slots in which micro-batch 0's F, B and W run; micro-batch
// k's run k periods later. `weight` empty: each W takes the first free slot after its B
// (oldest first). block_schedule() lays the block out for m micro-batches: each rank's
// actions in slot order, the warm-up and cool-down being the slots of micro-batches
// that exist. When every dependency of the block lies in an earlier slot, the schedule
// is valid for any costs.
//
// `memory_limit` > 0 (micro-batches of activations per rank, a chunk's being 1/v of
// one) replaces the plain layout by the reorder pass (the paper's squeeze and reorder):
// the actions run in unit time, each rank taking the ready F or B of the earliest slot
// (an F only within the limit), a W when none can run; each rank's list is the order
// they ran in. The result is valid, never above the limit on any rank for any costs,
// and busy wherever the limit allows (warm-up and cool-down filled); `weight` is then
// unused. A rank's chunks must be in increasing stage order. A limit of m micro-batches
// or more (infinity too) never binds: the pass then fills as it likes.
struct BuildingBlock {
  int period = 6;
  std::vector<std::vector<int>> chunk_stage;                // [rank][chunk] -> stage
  std::vector<std::vector<int>> forward, backward, weight;  // [rank][chunk] -> slot
  double memory_limit = 0;
};
// `costs` (with a memory_limit): the reorder pass times the actions with these per-stage
// F, B, W and message latency instead of one unit each.
Schedule block_schedule(const std::string& name, int ranks, int micro_batches,
                        const BuildingBlock& block, const Costs* costs = nullptr);
// The named blocks on the V placement (two chunks per rank, period 6): "v-min" (about
// a third of 1F1B's activation memory), "v-half" (a half) and "v-zb" (1F1B's p
// micro-batches, with the reorder pass at that limit: zero bubble when F = B = W).
// docs/schedules.md gives their memory and bubble.
BuildingBlock v_block(const std::string& kind, int ranks);
Schedule v_min(int ranks, int micro_batches);
Schedule v_half(int ranks, int micro_batches);
Schedule v_zb(int ranks, int micro_batches);
// V-ZB's construction for given costs (2p stages) and any memory limit (micro-batches
// per rank, at least 1): the V block under the reorder pass timed with `costs`; the
// automatic scheduler's V-family candidates. v_zb(p, m) is this at unit costs and p.
Schedule v_shape_within(const std::string& name, int ranks, int micro_batches, const Costs& costs,
                        double memory_limit);

// The checks every generator makes: ranks and micro-batches in range, and ranks x
// chunks x micro-batches within what the tools index.
void check_common(const std::string& name, int ranks, int micro_batches, int chunks);

// Drops every action of micro-batches >= m and sets the count to m (one direction).
// Removing whole micro-batches keeps a valid schedule valid.
void truncate_micro_batches(Schedule& s, int micro_batches);

}  // namespace baton::schedule
