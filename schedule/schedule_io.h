// The two interchangeable file forms of a schedule, and loading/saving by file name.
//
// Text form (docs/schedules.md): optional header lines "name:", "ranks:",
// "micro_batches:", "directions:", "placement:", then one line per rank, "r: tok tok ...",
// tokens as in action.h ("0F1", "1B0", "2W3", "0SEND_F1", "1REDUCE", "STEP"), separated
// by spaces or commas; '#' starts a comment.
// JSON form: {"format": "baton-schedule", "version": 1, "name", "ranks",
// "micro_batches", "directions", "placement": [...], "actions": [[{"kind": "F",
// "stage": 0, "micro_batch": 3}, ...], ...]}; unknown fields are errors.
//
// Both writers are canonical: parse(write(s)) == s and write(parse(write(s))) ==
// write(s). The parsers check syntax and the header; whether the actions make a valid
// schedule is the validator's question (validate.h).
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "schedule/schedule.h"
#include "schedule/torch_csv.h"

namespace baton::schedule {

std::string to_text(const Schedule& s);
// `source` names the input in messages ("plan.txt"); errors say "source:line: ...".
Schedule parse_text(std::string_view text, const std::string& source);

nlohmann::json to_json(const Schedule& s);
// Pretty but compact: one line per rank's action list.
std::string to_json_text(const Schedule& s);
// Errors name the JSON path ("source: actions[1][4].micro_batch: expected ..., found ...").
Schedule from_json(const nlohmann::json& j, const std::string& source);
Schedule parse_json(std::string_view text, const std::string& source);

// Reads a file in any form: PyTorch's CSV for "*.csv" (torch_csv.h, dialect detected),
// JSON when its first non-blank character is '{', text otherwise.
Schedule load_schedule(const std::string& path);
// load_schedule for a schedule about to be validated and run: a CSV is validated on the
// spot (check_torch_csv), so its errors name the file's row and cell (`dialect`: the CSV's,
// detected by default); other forms are returned as read.
Schedule load_schedule_to_run(const std::string& path, TorchDialect dialect = TorchDialect::detect);
// Writes JSON when the name ends in ".json", PyTorch's CSV for ".csv" (in `dialect`, with
// `kept`'s idle steps and waits when given: a CSV read with load_torch_csv written back),
// text otherwise; durably and atomically (memory::write_file_durably), so a failure leaves
// no half-written file.
void save_schedule(const Schedule& s, const std::string& path,
                   TorchDialect dialect = TorchDialect::current, const KeptCells* kept = nullptr);

}  // namespace baton::schedule
