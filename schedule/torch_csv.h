// PyTorch's schedule CSV (torch.distributed.pipelining: what `_dump_csv` writes and
// `_load_csv` reads): one row per rank, one cell per time step, each cell an action
// token or empty (an idle step). Two dialects, which differ in what "B" means:
//
//   legacy  (PyTorch up to 2.5)  F, B (input gradient, or the full backward of a pair
//                                that has no W), W
//   current (PyTorch 2.6 on)     F, I (input gradient), W, B (full backward),
//                                composite "(0F7;7B3)OVERLAP_F_B"
//
// Both: SEND_F, RECV_F, SEND_B, RECV_B (same meaning as baton's: a send or receive
// names the stage on the acting rank), "<stage>REDUCE_GRAD" (baton's REDUCE).
// A PyTorch RECV only posts the receive (its runtime waits at the action using the data),
// where baton's RECV blocks: the reader moves each RECV to just before its consumer on the
// rank, so baton waits where PyTorch does. Sends stay where they are.
// WAIT_SEND_F, WAIT_SEND_B and WAIT_REDUCE_GRAD (PyTorch 2.15: where its runtime waits
// for a send or a reduction to finish) are waits baton's model makes implicitly (sends
// are buffered, STEP waits for the reductions): they are kept aside like empty cells.
// The writer puts a WAIT_REDUCE_GRAD after each REDUCE_GRAD that has no kept one
// (PyTorch 2.15's runtime refuses a reduction that is never waited for).
// UNSHARD and RESHARD (FSDP's parameter gathering) have no baton form and are refused.
// The file carries no placement: each stage lives on the rank whose row names it.
//
// Written as Python's csv module writes: cells joined by ',', rows ended by "\r\n", a
// row of one empty cell written '""'. Read back with the empty cells it had, a file
// PyTorch wrote is written again byte for byte (a compute-only one, or one whose
// receives are right before their consumers).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "schedule/schedule.h"

namespace baton::schedule {

enum class TorchDialect { detect, legacy, current };

// "legacy", "current" ("detect" for detect).
std::string_view dialect_name(TorchDialect d);
// "legacy", "current", "detect" (or "auto"); InputError naming the choices otherwise.
TorchDialect parse_dialect(std::string_view name);

// A cell with no baton action: empty (an idle step) or a wait ("0WAIT_SEND_F3").
struct KeptCell {
  int cell = 0;      // its index in the row (actions and kept cells together, a
                     // composite counting one)
  std::string text;  // as written
  friend bool operator==(const KeptCell&, const KeptCell&) = default;
};
using KeptCells = std::vector<std::vector<KeptCell>>;  // per rank, in increasing order

struct TorchCsv {
  Schedule schedule;
  TorchDialect dialect = TorchDialect::current;  // the one read (never detect)
  KeptCells kept;                                // per rank: the cells without an action
  // Per rank, the cell (from 0) each action of `schedule` was read from, for messages:
  // a receive moved to its consumer names the cell it was written in.
  std::vector<std::vector<int>> cells;
};

// Detection: a file naming an I or an OVERLAP_F_B is current; one with W's but no I is
// legacy (in current PyTorch a W only follows an I); one with only F and B reads the
// same either way (taken as current). Errors name the source, the row (rank), the
// cell and what was expected. `name` becomes the schedule's name.
TorchCsv parse_torch_csv(std::string_view text, const std::string& source,
                         TorchDialect dialect = TorchDialect::detect, const std::string& name = "");
TorchCsv load_torch_csv(const std::string& path, TorchDialect dialect = TorchDialect::detect);

// The CSV cell (from 0) that holds action `index` of `rank` (a composite's two halves
// share one); -1 when out of range.
int torch_cell(const TorchCsv& csv, int rank, int index);
// validate(csv.schedule); when invalid, InputError "<source>: invalid schedule (CSV row
// r, cell c): <report>", the position also in the file's terms (from 1).
void check_torch_csv(const TorchCsv& csv, const std::string& source);

// Writes `s` in `dialect` (detect means current). `kept` (as parse_torch_csv returned
// them) puts the idle steps and waits back; without it, rows hold only actions and the
// WAIT_REDUCE_GRAD after each REDUCE_GRAD.
// InputError when `s` has what the dialect cannot say: STEP (PyTorch has no optimizer
// action), a composite in the legacy dialect, several directions.
std::string to_torch_csv(const Schedule& s, TorchDialect dialect = TorchDialect::current,
                         const KeptCells* kept = nullptr);

// True when the file name ends in ".csv", in any case (load_schedule / save_schedule use
// the CSV form for those).
bool is_csv_path(const std::string& path);

}  // namespace baton::schedule
