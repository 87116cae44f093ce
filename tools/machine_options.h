// The machine figures `baton plan` and `baton trace predict` cost a plan with
// (partitioner::Machine): one device's FLOP/s, each kind of link's bandwidth and latency,
// the ranks sharing a host. One set of flags for both commands.
#pragma once

#include "partitioner/cost_model.h"
#include "tools/command.h"

namespace baton::tools {

void add_machine_options(po::options_description& opts, partitioner::Machine& m);
// After parsing: InputError naming the flag of a figure out of range.
void check_machine_options(const partitioner::Machine& m);

}  // namespace baton::tools
