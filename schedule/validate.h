// The validator: checks any schedule, generated or hand-written, and reports the
// first violation precisely (rank, action index, what is missing, out of order or
// circular) with the grid of actions around it.
//
// A valid schedule: every action names an existing stage and a micro-batch of that
// stage's direction and sits on the rank the placement gives its stage; each
// (micro-batch, stage) has exactly one F and either one B and one W or one BW; a
// schedule with transfers names every cross-rank activation and gradient with exactly
// one SEND on the producing rank and one RECV on the consuming rank (and none between
// stages of one rank); REDUCE, when present, appears once per stage, STEP, when
// present, once per rank after all of its rank's compute; every dependency
// (dependencies.h) on the same rank comes earlier in the list; and running the lists
// under the communication model of dependencies.h (asynchronous buffered sends,
// blocking receives) completes: no cycle of waits.
#pragma once

#include <string>

#include "schedule/schedule.h"

namespace baton::schedule {

struct ValidationReport {
  bool ok = true;
  int rank = -1;        // where the violation is (-1: the header)
  int index = -1;       // action index in that rank's list, from 0 (-1: none in particular)
  std::string message;  // what is wrong, naming ranks, indices and actions
  std::string grid;     // the actions around (rank, index), one column per rank

  std::string to_string() const { return ok ? "valid" : message + "\n" + grid; }
};

ValidationReport validate(const Schedule& s);

// The same with a graph already built for `s` (the simulator has one); when valid,
// `progress` (if given) receives the in-order run the deadlock check made.
class DependencyGraph;
struct Progress;
ValidationReport validate(const Schedule& s, const DependencyGraph& g, Progress* progress);

// Throws InputError("<source>: invalid schedule: <message>\n<grid>") unless valid.
void check_valid(const Schedule& s, const std::string& source);

// Rows index-rows_around .. index+rows_around of ranks rank-ranks_around ..
// rank+ranks_around, the cell (rank, index) marked "> ... <".
std::string format_grid(const Schedule& s, int rank, int index, int rows_around = 4,
                        int ranks_around = 3);

}  // namespace baton::schedule
