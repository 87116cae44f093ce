#include "tools/machine_options.h"

#include <cstdio>
#include <string>

#include "memory/error.h"

namespace baton::tools {

namespace {
std::string shown(double v) {  // in --help: 2e-06, not 1.9999999999999999e-06
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
}  // namespace

void add_machine_options(po::options_description& opts, partitioner::Machine& m) {
  opts.add_options()("flops", po::value(&m.flops)->default_value(m.flops, shown(m.flops)),
                     "FLOP/s of one device (analytic times)")(
      "tp-bandwidth",
      po::value(&m.tp_bandwidth)->default_value(m.tp_bandwidth, shown(m.tp_bandwidth)),
      "bytes/s per rank in a tensor-parallel group (baton bench comm measures a host's)")(
      "tp-latency", po::value(&m.tp_latency)->default_value(m.tp_latency, shown(m.tp_latency)),
      "seconds per step of a tensor-parallel collective")(
      "p2p-bandwidth",
      po::value(&m.p2p_bandwidth)->default_value(m.p2p_bandwidth, shown(m.p2p_bandwidth)),
      "bytes/s between pipeline ranks")(
      "p2p-latency", po::value(&m.p2p_latency)->default_value(m.p2p_latency, shown(m.p2p_latency)),
      "seconds per message between pipeline ranks")(
      "dp-bandwidth",
      po::value(&m.dp_bandwidth)->default_value(m.dp_bandwidth, shown(m.dp_bandwidth)),
      "bytes/s per rank of the data-parallel all-reduce")(
      "dp-latency", po::value(&m.dp_latency)->default_value(m.dp_latency, shown(m.dp_latency)),
      "seconds per step of the data-parallel all-reduce")(
      "ranks-per-host", po::value(&m.ranks_per_host)->default_value(0),
      "ranks sharing a host, for the profile's colocated slowdown (0: all of the plan's)")(
      "cores-per-host", po::value(&m.cores_per_host)->default_value(0),
      "cores a host's ranks share; more ranks than cores are simulated time-sliced (0: the "
      "cost file's)");
}

void check_machine_options(const partitioner::Machine& m) {
  partitioner::check_machine(m, [](const char* field) {
    std::string flag = std::string("--") + field;
    for (char& c : flag)
      if (c == '_') c = '-';
    return flag;
  });
}

}  // namespace baton::tools
